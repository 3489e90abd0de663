/* llm_methods: every method of mpq on a real language model, measured the
   way users compare quantized models: perplexity as llama.cpp computes it,
   bits per weight, and decode tokens per second.

   usage: llm_methods --stats FILE --hessian FILE [options]   (--help;
                   `bash examples/run.sh` fetches the model and the texts,
                   runs `mpq calibrate` once for each file and then this)

   1. The model (default: SmolLM2-135M-Instruct, a GGUF whose linear maps are
      Q4_1 and embedding Q8_0) is loaded and dequantized to float: the "fp32
      reference". Its linear maps are therefore already on a 4-bit grid of
      blocks of 32, which every result here inherits.
   2. Statistics: the file `mpq calibrate MODEL CALIB -o FILE` wrote from
      the calibration text (Python's library reference): Fisher diagonal,
      MixLLM salience, diag(X^T X), AWQ's input rows, PQI and MXSens layer
      sensitivities of every linear map (mpq_model.h section 6); and X^T X of
      every map's inputs for GPTQ (`mpq calibrate --stats xtx`, a second
      file, more windows). Each file names the model and the text's hash; a
      file for another model or text is refused.
   3. Each method quantizes the 210 linear maps of the layers as its paper
      runs it, and the plain-RTN variants beside them (the token embedding,
      which is also the output head, is packed at 8 bits for every
      quantized model, as llama.cpp keeps it at Q8_0): RTN 2/3/4, MXINT4,
      AWQ 3/4; GPTQ 2/3/4 (act-order), 3 without act-order, and AWQ's
      scales and clips followed by GPTQ at 3 and 4 bits; SFMP's plans from
      the Fisher diagonal at 2.25 to 4.25 bpw (group 256 at 2.25 and 3.25,
      as its table 3) quantized by RTN, by AWQ (its section 5) and by GPTQ
      (planned in act-order's column order, so that GPTQ can take it), and
      at 3.25 and 4.0 by AWQ + GPTQ; MixLLM's 8/4-bit output-channel mix
      (10 % at 8 bits) and an 8/3 mix, by RTN and (as its paper) by GPTQ;
      MXSens's 4/6/8 MXINT templates; ReQuant on RTN 3 and AWQ 3 (0.25 %
      outliers + 0.25 % significant weights), and on SFMP's plans at 3.25
      and 4.0 with AWQ (the three composed); PMPD on the AWQ 4-bit model
      (the prompt at 4 bits, the decode lowered, and the static scheduler's
      choice on calibration text); MixLLM's W4A8 (GPTQ 4-bit) and W4.4A8
      (MixLLM 8/4 + GPTQ) again with 8-bit activations (", A8" rows;
      --a8: every quantized row). Every model is measured on the
      evaluation text (the tutorial and the FAQ, never calibrated on):
      perplexity over the first --chunks chunks of 512 tokens, the second
      half of each scored; bits per weight of the linear maps (scales,
      zeros, permutations, bits maps and sparse parts included); decode
      tokens per second over 64 tokens after a 32-token prompt, on the
      packed matrices.
   Writes DIR/results.md and DIR/ppl_vs_bpw.svg (DIR: build/llm). */
#define _POSIX_C_SOURCE 200809L
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_model.h"
#include "plot.h"
#include "progress.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { DECODE = 64, PROMPT = 32, SCHED_CHUNKS = 4 };

static double now(void) { return progress_now(); }

static void die(const char *what, mpq_status st)
{
    fprintf(stderr, "llm_methods: %s: %s\n", what, mpq_status_str(st));
    exit(1);
}

typedef struct ctx {
    mpq_llm *m;
    int nl;                /* linear maps: layers x 7 */
    int32_t *eval, *calib; /* tokenized as llama-perplexity reads a file */
    size_t neval, ncalib;
    int chunks;
    mpq_calib_stats S;  /* what mpq calibrate wrote */
    mpq_calib_stats Hs; /* X^T X of every map (mpq calibrate --stats xtx) */
    int quiet;          /* no progress lines (--quiet) */
    progress P;         /* the step under way: packing maps, perplexity chunks */
    char step[64];      /* what P shows beside its count */
} ctx;

static mpq_linear *lin_at(ctx *C, int i) { return &C->m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT]; }

/* ---- methods --------------------------------------------------------------- */

/* Progress of a perplexity run, one step per chunk (mpq_ppl_opts.progress). */
static void ppl_step(void *user, int done, int total, double ppl, double seconds)
{
    ctx *C = (ctx *)user;
    char what[128];
    snprintf(what, sizeof what, "ppl %.2f so far, %s", ppl, C->step); /* the shown part: 50 characters */
    (void)total, (void)seconds;
    progress_show(&C->P, done, what);
}

typedef struct row {
    char name[64], family[24], note[160];
    double bpw, ppl, ppl_err, decode, mb, seconds;
} row;

static row rows[64];
static int nrows;

/* The embedding (and head) of every quantized model: 8 bits, g128. */
static void pack_embedding(ctx *C)
{
    mpq_llm *m = C->m;
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    d.rows = m->embed.rows, d.cols = m->embed.cols, d.uniform_bits = 8;
    mpq_packed A;
    mpq_status st = mpq_pack_alloc(&d, m->embed.W, &A);
    if (st == MPQ_OK) st = mpq_linear_set_packed(m, &m->embed, &A);
    if (st != MPQ_OK) die("embedding", st);
}

static void unpack_all(ctx *C)
{
    for (int i = 0; i < C->nl; i++) mpq_linear_unpack(C->m, lin_at(C, i));
    mpq_linear_unpack(C->m, &C->m->embed);
}

/* Bits per weight of the linear maps counting every byte of their packed
   buffers: scales, zeros, bits maps, permutations, column scales, sparse
   parts and headers. */
static double bpw_all_bytes(ctx *C)
{
    double bytes = 0, w = 0;
    for (int i = 0; i < C->nl; i++) {
        const mpq_linear *L = lin_at(C, i);
        bytes += (double)L->A.bytes, w += (double)L->rows * L->cols;
    }
    return 8.0 * bytes / w;
}

/* Decode tokens per second after a short prompt (the first tokens of the
   evaluation text), greedily; with a schedule, the time at each skip level. */
static double decode_rate(ctx *C, const mpq_pmpd_schedule *sched, double *ms_at, int *n_at)
{
    mpq_llm_state s;
    mpq_status st = mpq_llm_state_init(C->m, PROMPT + DECODE + 1, 64, &s);
    if (st != MPQ_OK) die("state", st);
    const int V = C->m->c.vocab;
    float *z = (float *)malloc(sizeof(float) * (size_t)V);
    st = mpq_llm_forward(C->m, &s, C->eval, PROMPT, sched ? sched->prefill_skip : 0, z, PROMPT - 1);
    double total = 0;
    for (int t = 0; t < DECODE && st == MPQ_OK; t++) {
        int32_t tok = 0;
        for (int v = 1; v < V; v++) tok = z[v] > z[tok] ? v : tok;
        const int skip = sched ? mpq_pmpd_skip_at(sched, t) : 0;
        const double t0 = now();
        st = mpq_llm_forward(C->m, &s, &tok, 1, skip, z, 0);
        const double dt = now() - t0;
        total += dt;
        if (ms_at) ms_at[skip] += 1e3 * dt, n_at[skip]++;
    }
    if (st != MPQ_OK) die("decode", st);
    free(z);
    mpq_llm_state_free(&s);
    return DECODE / total;
}

static void measure(ctx *C, const char *family, const char *name, const mpq_pmpd_schedule *sched, const char *note,
                    double t_quant)
{
    const double t0 = now();
    row *r = &rows[nrows++];
    const int a8 = C->m->a8 && C->m->layer[0].lin[0].A.buf; /* 8-bit activations reach packed maps only */
    snprintf(r->name, sizeof r->name, "%s%s", name, a8 ? ", A8" : "");
    name = r->name;
    snprintf(r->family, sizeof r->family, "%s", family);
    snprintf(r->note, sizeof r->note, "%s", note ? note : "");
    mpq_ppl_opts o;
    memset(&o, 0, sizeof o);
    o.chunks = C->chunks, o.schedule = sched, o.progress = ppl_step, o.user = C;
    mpq_ppl_result res;
    snprintf(C->step, sizeof C->step, "%s", name);
    progress_start(&C->P, "llm_methods", !C->quiet, C->chunks);
    progress_show(&C->P, 0, C->step);
    mpq_status st = mpq_llm_perplexity(C->m, C->eval, C->neval, &o, &res);
    progress_end(&C->P);
    if (st != MPQ_OK) die(name, st);
    r->ppl = res.ppl, r->ppl_err = res.ppl_err;
    r->bpw = C->m->layer[0].lin[0].A.buf ? bpw_all_bytes(C) : 32.0;
    r->mb = (double)mpq_llm_weight_bytes(C->m) / 1e6;
    double ms_at[MPQ_MAX_BITS] = {0};
    int n_at[MPQ_MAX_BITS] = {0};
    r->decode = decode_rate(C, sched, ms_at, n_at);
    if (sched) { /* bits read while decoding (every byte, as above), and the time per token at each level */
        double bits[MPQ_MAX_BITS];
        const double extra = r->bpw - mpq_llm_bpw(C->m, 1, 0); /* the bytes besides weights and scales */
        for (int k = 0; k < MPQ_MAX_BITS; k++) bits[k] = mpq_llm_bpw(C->m, 1, k) + extra;
        mpq_pmpd_average_bits(sched, bits, (long)(512 - 1 - 256), &r->bpw);
        size_t n = strlen(r->note);
        for (int k = 0; k < MPQ_MAX_BITS; k++)
            if (n_at[k]) {
                snprintf(r->note + n, sizeof r->note - n, "%s%.2f bpw: %.2f ms/token", n ? "; " : "", bits[k],
                         ms_at[k] / n_at[k]);
                n = strlen(r->note);
            }
    }
    r->seconds = now() - t0 + t_quant;
    printf("  %-36s %6.3f bpw  %7.1f MB  ppl %9.4f +/- %8.4f  %6.1f tokens/s  (%.0f s)%s%s\n", name, r->bpw, r->mb,
           r->ppl, r->ppl_err, r->decode, r->seconds, r->note[0] ? "  " : "", r->note);
    fflush(stdout);
}

/* AWQ's scales and clips for linear map i under description d, from the
   input rows mpq calibrate kept. */
static void awq_scales(ctx *C, int i, const mpq_bitplane_desc *d, float **cs, float **clip)
{
    const int group = d->group ? d->group : 128;
    *cs = (float *)malloc(sizeof(float) * (size_t)d->cols);
    *clip = (float *)malloc(sizeof(float) * (size_t)d->rows * (size_t)((d->cols + group - 1) / group));
    mpq_awq_desc a;
    memset(&a, 0, sizeof a);
    a.X = C->S.awq[i], a.tokens = C->S.awq_tokens;
    mpq_status st = *cs && *clip ? mpq_awq_search(d, lin_at(C, i)->W, &a, *cs, *clip, NULL) : MPQ_ERR_NOMEM;
    if (st != MPQ_OK) die("awq", st);
}

/* How pack_all quantizes: round-to-nearest, or with AWQ's scales and clips
   first, GPTQ's error feedback, act-order (GPTQ; widths constant along the
   columns). */
enum { Q_AWQ = 1, Q_GPTQ = 2, Q_ACT = 4, Q_A8 = 8 }; /* Q_A8: measured again with 8-bit activations */

/* The description of map i: from a plan, or uniform bits at a group. */
static mpq_bitplane_desc desc_of(ctx *C, int i, const mpq_plan *plan, int bits, int group, int format)
{
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    if (plan) {
        mpq_status st = mpq_plan_desc(plan, i, &d);
        if (st != MPQ_OK) die("plan", st);
    } else {
        const mpq_linear *L = lin_at(C, i);
        d.rows = L->rows, d.cols = L->cols, d.uniform_bits = bits, d.group = group, d.format = format;
    }
    return d;
}

/* Packs every linear map: descriptions from a plan, or uniform bits; how:
   Q_* flags. */
static void pack_all(ctx *C, const mpq_plan *plan, int bits, int group, int format, int how)
{
    mpq_status st = MPQ_OK;
    progress_start(&C->P, "llm_methods", !C->quiet, C->nl);
    for (int i = 0; i < C->nl && st == MPQ_OK; i++) {
        char what[80], tname[64];
        snprintf(what, sizeof what, "quantizing %s",
                 mpq_llm_linear_name(0, i / MPQ_LIN_COUNT, i % MPQ_LIN_COUNT, 0, tname, sizeof tname));
        progress_show(&C->P, i, what);
        mpq_linear *L = lin_at(C, i);
        mpq_bitplane_desc d = desc_of(C, i, plan, bits, group, format);
        float *cs = NULL, *clip = NULL;
        uint32_t *order = NULL;
        if (how & Q_ACT) { /* act-order: the packed column order */
            order = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)d.cols);
            if (!order || (st = mpq_gptq_act_order(C->Hs.xtx[i], d.cols, order)) != MPQ_OK) die("act-order", st);
            d.p_col = order;
        }
        if (how & Q_AWQ) awq_scales(C, i, &d, &cs, &clip);
        d.col_scale = cs, d.clip = clip;
        mpq_packed A;
        if (how & Q_GPTQ) {
            mpq_gptq_desc g;
            memset(&g, 0, sizeof g);
            g.H = C->Hs.xtx[i];
            st = mpq_gptq_alloc(&d, L->W, &g, &A, NULL);
        } else
            st = mpq_pack_alloc(&d, L->W, &A);
        if (st == MPQ_OK) st = mpq_linear_set_packed(C->m, L, &A);
        free(cs), free(clip), free(order);
    }
    progress_end(&C->P);
    if (st != MPQ_OK) die("pack", st);
    pack_embedding(C);
}

/* The row just measured, again with 8-bit activations (MixLLM's A8) when
   how has Q_A8 and the run's activations are float. */
static void measure_a8(ctx *C, const char *family, const char *name, int how)
{
    if (!(how & Q_A8) || C->m->a8) return;
    C->m->a8 = 1;
    measure(C, family, name, NULL, NULL, 0);
    C->m->a8 = 0;
}

static void run_uniform(ctx *C, const char *family, const char *name, int bits, int format, int how)
{
    const double t0 = now();
    pack_all(C, NULL, bits, 0, format, how);
    measure(C, family, name, NULL, NULL, now() - t0);
    measure_a8(C, family, name, how);
    unpack_all(C);
}

/* SFMP's plan from the Fisher diagonal at a budget and group; act: planned
   in GPTQ's act-order coordinates (each map's Fisher columns permuted by
   mpq_gptq_act_order, so that pack_all with Q_ACT puts the plan's widths on
   the columns they were planned for). */
static void sfmp_plan(ctx *C, double bpw, int group, int act, mpq_plan *p)
{
    mpq_sfmp_layer *L = (mpq_sfmp_layer *)calloc((size_t)C->nl, sizeof *L);
    float **perm = (float **)calloc((size_t)C->nl, sizeof(float *));
    uint32_t *order = NULL;
    for (int i = 0; i < C->nl; i++) {
        const int rows = lin_at(C, i)->rows, cols = lin_at(C, i)->cols;
        L[i].S = C->S.fisher[i], L[i].rows = rows, L[i].cols = cols;
        if (!act) continue;
        order = (uint32_t *)realloc(order, sizeof(uint32_t) * (size_t)cols);
        perm[i] = (float *)malloc(sizeof(float) * (size_t)rows * (size_t)cols);
        mpq_status st = order && perm[i] ? mpq_gptq_act_order(C->Hs.xtx[i], cols, order) : MPQ_ERR_NOMEM;
        if (st == MPQ_OK) st = mpq_perm_apply(C->S.fisher[i], rows, cols, NULL, order, perm[i]);
        if (st != MPQ_OK) die("act-order", st);
        L[i].S = perm[i];
    }
    mpq_sfmp_desc d;
    memset(&d, 0, sizeof d);
    d.bpw = bpw, d.group = group;
    mpq_status st = mpq_plan_sfmp(L, C->nl, &d, p);
    if (st != MPQ_OK) die("sfmp plan", st);
    for (int i = 0; i < C->nl; i++) free(perm[i]);
    free(perm), free(order), free(L);
}

static void run_sfmp(ctx *C, double bpw, int group, int how)
{
    const double t0 = now();
    mpq_plan p;
    sfmp_plan(C, bpw, group, (how & Q_ACT) != 0, &p);
    pack_all(C, &p, 0, 0, 0, how);
    mpq_plan_free(&p);
    char name[64];
    snprintf(name, sizeof name, "SFMP %.2f g%d%s%s%s", bpw, group, how & Q_AWQ ? " + AWQ" : "",
             how & Q_GPTQ ? " + GPTQ" : "", how & Q_ACT ? " (act-order)" : "");
    const char *family = (how & (Q_AWQ | Q_GPTQ)) == (Q_AWQ | Q_GPTQ) ? "SFMP+AWQ+GPTQ"
        : how & Q_GPTQ                                                ? "SFMP+GPTQ"
        : how & Q_AWQ                                                 ? "SFMP+AWQ"
                                                                      : "SFMP";
    measure(C, family, name, NULL, NULL, now() - t0);
    unpack_all(C);
}

/* MixLLM: 10 % of the output channels (over all maps) at 8 bits, symmetric,
   the rest at `low` bits; channels ranked by its eq. 4 salience. */
static void run_mixllm(ctx *C, int low, int how)
{
    const double t0 = now();
    mpq_mixllm_layer *L = (mpq_mixllm_layer *)calloc((size_t)C->nl, sizeof *L);
    for (int i = 0; i < C->nl; i++)
        L[i].salience = C->S.mixllm[i], L[i].rows = lin_at(C, i)->rows, L[i].cols = lin_at(C, i)->cols;
    mpq_mixllm_desc d;
    memset(&d, 0, sizeof d);
    d.fraction = 0.1, d.low_bits = low;
    mpq_plan p;
    mpq_status st = mpq_plan_mixllm(L, C->nl, &d, &p);
    if (st != MPQ_OK) die("mixllm plan", st);
    free(L);
    pack_all(C, &p, 0, 0, 0, how);
    mpq_plan_free(&p);
    char name[64];
    snprintf(name, sizeof name, "MixLLM 8/%d (10 %% at 8 bits)%s", low, how & Q_GPTQ ? " + GPTQ" : "");
    measure(C, how & Q_GPTQ ? "MixLLM+GPTQ" : "MixLLM", name, NULL, NULL, now() - t0);
    measure_a8(C, how & Q_GPTQ ? "MixLLM+GPTQ" : "MixLLM", name, how);
    unpack_all(C);
}

/* MXSens: the least budget its 4/6/8 templates can meet (every layer's
   8-bit block and 4 bits elsewhere), then half a bit more. */
static void run_mxsens(ctx *C)
{
    mpq_mxsens_layer *L = (mpq_mxsens_layer *)calloc((size_t)C->nl, sizeof *L);
    for (int i = 0; i < C->nl; i++)
        L[i].col_sens = C->S.xtx_diag[i], L[i].layer_sens = C->S.layer_sens[i], L[i].rows = lin_at(C, i)->rows,
        L[i].cols = lin_at(C, i)->cols;
    double budget = 4.25;
    mpq_plan p;
    mpq_status st;
    while ((st = mpq_plan_mxsens(L, C->nl, budget, &p, NULL)) == MPQ_ERR_RANGE && budget < 8) budget += 0.05;
    if (st != MPQ_OK) die("mxsens plan", st);
    for (int k = 0; k < 2; k++) {
        const double t0 = now();
        if (k) {
            mpq_plan_free(&p);
            budget += 0.5;
            if ((st = mpq_plan_mxsens(L, C->nl, budget, &p, NULL)) != MPQ_OK) die("mxsens plan", st);
        }
        pack_all(C, &p, 0, 0, 0, 0);
        char name[64];
        snprintf(name, sizeof name, "MXSens %.2f (MXINT 4/6/8)", budget);
        measure(C, "MXSens", name, NULL, NULL, now() - t0);
        unpack_all(C);
    }
    mpq_plan_free(&p);
    free(L);
}

/* ReQuant: 0.25 % outliers spread by eq. 9 and 0.25 % significant weights,
   from the calibration's PQI, on a dense part of RTN or AWQ at 3 bits or
   under a plan (a composition: SFMP's widths, AWQ's scales, ReQuant's
   sparse part). */
static void run_requant(ctx *C, const mpq_plan *plan, int awq, const char *name)
{
    const double t0 = now();
    mpq_rq_map *M = (mpq_rq_map *)calloc((size_t)C->nl, sizeof *M);
    float **cs = (float **)calloc((size_t)C->nl, sizeof(float *)),
          **clip = (float **)calloc((size_t)C->nl, sizeof(float *));
    for (int i = 0; i < C->nl; i++) {
        const mpq_linear *L = lin_at(C, i);
        M[i].W = L->W, M[i].pqi = C->S.pqi[i];
        M[i].mask = (uint8_t *)malloc((size_t)L->rows * L->cols);
        M[i].d = desc_of(C, i, plan, 3, 0, MPQ_FORMAT_BITPLANE);
        if (awq) awq_scales(C, i, &M[i].d, &cs[i], &clip[i]);
        M[i].d.col_scale = cs[i], M[i].d.clip = clip[i];
    }
    double t = 0;
    size_t marked = 0;
    mpq_status st = mpq_requant_masks(M, C->nl, 0.0025, 0.0025, &t, &marked);
    if (st != MPQ_OK) die("requant", st);
    for (int i = 0; i < C->nl && st == MPQ_OK; i++) {
        mpq_packed A;
        st = mpq_requant_pack(&M[i], &A);
        if (st == MPQ_OK) st = mpq_linear_set_packed(C->m, lin_at(C, i), &A);
        free(M[i].mask), free(cs[i]), free(clip[i]);
    }
    if (st != MPQ_OK) die("requant pack", st);
    free(M), free(cs), free(clip);
    pack_embedding(C);
    char note[96];
    snprintf(note, sizeof note, "eq. 9 temperature t = %.2f; %zu weights in the sparse parts", t, marked);
    measure(C, plan ? "SFMP+AWQ+ReQuant" : "ReQuant", name, NULL, note, now() - t0);
    unpack_all(C);
}

/* PMPD's quality of a schedule on calibration text: minus the perplexity of
   SCHED_CHUNKS chunks with the second half read at the schedule's decode
   precisions (the evaluation text is never used to choose). */
static mpq_status sched_quality(void *user, const mpq_pmpd_schedule *s, double *q)
{
    ctx *C = (ctx *)user;
    mpq_ppl_opts o;
    memset(&o, 0, sizeof o);
    o.chunks = SCHED_CHUNKS, o.schedule = s, o.progress = ppl_step, o.user = C;
    mpq_ppl_result r;
    snprintf(C->step, sizeof C->step, "PMPD's search, a schedule on calibration text");
    progress_start(&C->P, "llm_methods", !C->quiet, SCHED_CHUNKS);
    progress_show(&C->P, 0, C->step);
    mpq_status st = mpq_llm_perplexity(C->m, C->calib, C->ncalib, &o, &r);
    progress_end(&C->P);
    if (st == MPQ_OK) *q = -r.ppl;
    return st;
}

/* AWQ 4-bit, then PMPD on the same packed matrices: the prompt at 4 bits
   and every decoded token at 3; the static scheduler's choice over 4 -> 3
   bits (five candidate switch points over the 255 scored tokens) for at
   most 10 % more perplexity on calibration text than 4 bits throughout;
   4 -> 3 -> 2 bits (switch at 16 and 40). */
static void run_awq4_pmpd(ctx *C)
{
    double t0 = now();
    pack_all(C, NULL, 4, 0, MPQ_FORMAT_BITPLANE, Q_AWQ);
    measure(C, "AWQ", "AWQ 4-bit g128", NULL, NULL, now() - t0);
    mpq_pmpd_schedule s;
    memset(&s, 0, sizeof s);
    s.prefill_skip = 0, s.nlevels = 1, s.skip[0] = 1;
    measure(C, "PMPD", "PMPD (AWQ 4): prompt 4-bit, decode 3-bit", &s, NULL, 0);
    t0 = now();
    double bits[MPQ_MAX_BITS], qref = 0, q = 0;
    for (int k = 0; k < MPQ_MAX_BITS; k++) bits[k] = mpq_llm_bpw(C->m, 1, k);
    mpq_pmpd_schedule ref;
    memset(&ref, 0, sizeof ref);
    ref.nlevels = 1;
    mpq_status st = sched_quality(C, &ref, &qref);
    mpq_pmpd_search d;
    memset(&d, 0, sizeof d);
    d.nlevels = 2, d.skip[0] = 0, d.skip[1] = 1, d.bits = bits, d.length = 512 - 256, d.candidates = 5;
    d.target = qref * 1.10;
    int evaluated = 0;
    if (st == MPQ_OK) st = mpq_pmpd_static_search(&d, sched_quality, C, &s, &q, &evaluated);
    if (st != MPQ_OK) die("pmpd search", st);
    char note[160];
    snprintf(note, sizeof note,
             "static search on calibration text: switch at decoded token %ld (ppl %.2f there, "
             "4 bits throughout %.2f; %d schedules tried, %.0f s)",
             s.nlevels > 1 ? s.start[1] : 0L, -q, -qref, evaluated, now() - t0);
    measure(C, "PMPD", "PMPD (AWQ 4): static search, 4 -> 3", &s, note, 0);
    s.nlevels = 3, s.skip[0] = 0, s.skip[1] = 1, s.skip[2] = 2, s.start[0] = 0, s.start[1] = 16, s.start[2] = 40;
    measure(C, "PMPD", "PMPD (AWQ 4): 4 -> 3 -> 2 at 16, 40", &s, NULL, 0);
    unpack_all(C);
}

/* ---- output ------------------------------------------------------------------ */

static FILE *open_output(const char *dir, const char *name, char *p, size_t cap)
{
    snprintf(p, cap, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (!f) {
        fprintf(stderr, "llm_methods: cannot write %s: %s\n", p, strerror(errno));
        exit(1);
    }
    return f;
}

static void write_results(const char *dir, const char *model, const ctx *C, double total)
{
    char p[1024];
    FILE *f = open_output(dir, "results.md", p, sizeof p);
    fprintf(f,
            "| method | bpw | weights MB | perplexity | +/- | vs fp32 | decode tokens/s |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        const double x = r->ppl / rows[0].ppl;
        char vs[32];
        if (x < 10)
            snprintf(vs, sizeof vs, "%+.1f %%", 100.0 * (x - 1.0));
        else
            snprintf(vs, sizeof vs, "x %.3g", x);
        fprintf(f, "| %s | %.3f | %.1f | %.4g | %.3g | %s | %.1f |\n", r->name, r->bpw, r->mb, r->ppl, r->ppl_err, vs,
                r->decode);
    }
    fprintf(f,
            "\nModel `%s` (%d layers, dim %d; its linear maps are stored as Q4_1 in the GGUF: the fp32 reference "
            "is that 4-bit grid dequantized). Perplexity as llama-perplexity computes it: %d chunks of 512 tokens "
            "of the evaluation text (%zu tokens in all), the second half of each scored. bpw: every byte of the "
            "packed buffers of the 210 linear maps of the layers (scales, zeros, bits maps, permutations, column "
            "scales, sparse parts, headers) per weight; PMPD: the average read per decoded token. Every quantized "
            "model also packs the embedding (= the output head) at 8 bits, counted in the weights' MB. Decode: "
            "%d tokens after a %d-token prompt, greedy. Statistics from mpq calibrate: %d windows of %d tokens of "
            "the calibration text; GPTQ's X^T X (position 0 included) from %d windows of %d tokens. %.0f s in all "
            "(statistics read, not computed).\n",
            model, C->m->c.layers, C->m->c.dim, C->chunks, C->neval, DECODE, PROMPT, C->S.windows, C->S.length,
            C->Hs.windows, C->Hs.length, total);
    for (int i = 0; i < nrows; i++)
        if (rows[i].note[0]) fprintf(f, "\n%s: %s.\n", rows[i].name, rows[i].note);
    fclose(f);
    printf("wrote %s\n", p);
    f = open_output(dir, "ppl_vs_bpw.svg", p, sizeof p);
    plot_point pts[64];
    for (int i = 0; i < nrows; i++) pts[i].family = rows[i].family, pts[i].bpw = rows[i].bpw, pts[i].ppl = rows[i].ppl;
    plot_ppl_vs_bpw(f, pts, nrows, "bits per weight (linear maps)", "perplexity (log scale)", "fp32 reference");
    fclose(f);
    printf("wrote %s\n", p);
}

/* ---- main -------------------------------------------------------------------- */

/* The tokens of a file as llama-perplexity reads it (one final newline
   dropped, BOS first when the model asks for it); *hash: mpq_text_hash of
   all its bytes. */
static int32_t *tokenize_file(const mpq_llm *m, const char *path, size_t *n, uint64_t *hash)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llm_methods: cannot open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = (char *)malloc((size_t)len + 1);
    if (!s || fread(s, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "llm_methods: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    if (hash) *hash = mpq_text_hash(s, (size_t)len);
    size_t k = (size_t)len;
    if (k && s[k - 1] == '\n') k--;
    int32_t *tok;
    mpq_io_err e;
    if (mpq_tokenize(m->tok, s, k, MPQ_TOK_BOS, &tok, n, &e) != MPQ_OK) {
        fprintf(stderr, "llm_methods: %s: %s\n", path, e.msg);
        exit(1);
    }
    free(s);
    return tok;
}

/* A statistics file, checked to be of this model and calibration text (its
   "source": what mpq calibrate recorded) and to hold the statistics `need`
   (MPQ_CALIB_*); `how`: the calibrate options that make it. */
static void read_stats(ctx *C, const char *path, const char *model, const char *calib, uint64_t calib_hash,
                       unsigned need, const char *how, mpq_calib_stats *S)
{
    mpq_io_err e;
    mpq_st_file *f = NULL;
    if (mpq_st_open(path, &f, &e) != MPQ_OK) {
        fprintf(stderr, "llm_methods: %s\n(run `mpq calibrate %s%s %s -o %s` first; examples/run.sh does)\n", e.msg,
                how, model, calib, path);
        exit(1);
    }
    const char *meta = mpq_st_meta(f, "mpq_calib");
    char want[64];
    snprintf(want, sizeof want, "\"text_fnv1a\":\"%016llx\"", (unsigned long long)calib_hash);
    const char *base = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
    const int ok = meta && strstr(meta, want) && strstr(meta, base);
    mpq_st_close(f);
    if (!ok) {
        fprintf(stderr, "llm_methods: %s is not the statistics of %s on %s; run `mpq calibrate %s%s %s -o %s`\n", path,
                model, calib, how, model, calib, path);
        exit(1);
    }
    if (mpq_calib_read(C->m, path, S, &e) != MPQ_OK) {
        fprintf(stderr, "llm_methods: %s\n", e.msg);
        exit(1);
    }
    if ((S->what & need) != need) {
        fprintf(stderr, "llm_methods: %s lacks some statistics (calibrate with %s)\n", path,
                how[0] ? how : "--stats all");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    const char *model = "build/models/SmolLM2-135M-Instruct.Q4_1.gguf", *eval = "build/text/eval.txt",
               *calib = "build/text/calib.txt", *out = "build/llm", *stats = "build/llm/stats.safetensors",
               *hessian = "build/llm/hessian.safetensors";
    ctx C;
    memset(&C, 0, sizeof C);
    C.chunks = 8;
    int quick = 0, a8 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--eval") && i + 1 < argc)
            eval = argv[++i];
        else if (!strcmp(argv[i], "--calib") && i + 1 < argc)
            calib = argv[++i];
        else if (!strcmp(argv[i], "--stats") && i + 1 < argc)
            stats = argv[++i];
        else if (!strcmp(argv[i], "--hessian") && i + 1 < argc)
            hessian = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--chunks") && i + 1 < argc)
            C.chunks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--full"))
            C.chunks = 1 << 20;
        else if (!strcmp(argv[i], "--quick"))
            quick = 1, C.chunks = 2;
        else if (!strcmp(argv[i], "--quiet"))
            C.quiet = 1;
        else if (!strcmp(argv[i], "--a8"))
            a8 = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
#ifdef _OPENMP
            omp_set_num_threads(atoi(argv[i + 1]));
#endif
            i++;
        } else {
            const int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            fprintf(help ? stdout : stderr,
                    "usage: %s [--model PATH] [--eval TEXT] [--calib TEXT] [--stats FILE] [--hessian FILE]\n"
                    "          [--out DIR] [--chunks N] [--full] [--quick] [--threads T] [--quiet] [--a8]\n"
                    "Every method of mpq on a real model: perplexity (as llama-perplexity), bits per weight and\n"
                    "decode tokens/s; writes DIR/results.md and DIR/ppl_vs_bpw.svg. Statistics: FILE, written by\n"
                    "`mpq calibrate MODEL CALIB -o FILE`, and GPTQ's X^T X, written by `mpq calibrate --stats xtx\n"
                    "--windows 64 MODEL CALIB -o FILE` (examples/run.sh runs both once and reuses them). Defaults:\n"
                    "the files examples/run.sh fetches and writes into build/, 8 evaluation chunks of 512 tokens\n"
                    "(--full: every chunk; --quick: 2 chunks, four methods). --a8: every quantized row with 8-bit\n"
                    "activations (MixLLM's A8; by default only GPTQ 4-bit and MixLLM 8/4 + GPTQ get an A8 row).\n"
                    "Each row is printed when it is done; while it runs, a progress line on stderr names the\n"
                    "step (--quiet: none).\n",
                    argv[0]);
            return help ? 0 : 1;
        }
    }
    if (C.chunks < 1) {
        fprintf(stderr, "llm_methods: --chunks must be at least 1\n");
        return 1;
    }
    const double t0 = now();
    mpq_io_err e;
    if (mpq_llm_load(model, &C.m, &e) != MPQ_OK) {
        fprintf(stderr, "llm_methods: %s\n", e.msg);
        return 1;
    }
    const mpq_llm_config *c = &C.m->c;
    C.nl = c->layers * MPQ_LIN_COUNT;
    C.m->a8 = a8;
    uint64_t calib_hash = 0;
    C.eval = tokenize_file(C.m, eval, &C.neval, NULL);
    C.calib = tokenize_file(C.m, calib, &C.ncalib, &calib_hash);
    const int have = (int)(C.neval / 512);
    if (C.chunks > have) C.chunks = have;
    if (C.chunks < 1 || C.ncalib < (size_t)512 * SCHED_CHUNKS) {
        fprintf(stderr,
                "llm_methods: the texts are too short (one chunk of 512 tokens to evaluate, %d to calibrate "
                "a schedule)\n",
                SCHED_CHUNKS);
        return 1;
    }
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("llm_methods: %s: %s, %d layers, dim %d, %d/%d heads, ffn %d, vocab %d (%.1f s); %d threads\n", model,
           c->arch, c->layers, c->dim, c->heads, c->kv_heads, c->ffn, c->vocab, now() - t0, threads);
    printf("texts: %s %zu tokens (%d chunks of 512 evaluated of %d), %s %zu tokens (calibration)\n", eval, C.neval,
           C.chunks, have, calib, C.ncalib);
    const double ts = now();
    read_stats(&C, stats, model, calib, calib_hash, MPQ_CALIB_ALL, "", &C.S);
    read_stats(&C, hessian, model, calib, calib_hash, MPQ_CALIB_XTX, "--stats xtx --windows 64 ", &C.Hs);
    printf("statistics: %s: %d windows of %d tokens, loss %.4f, %d AWQ rows per map, PQI towards RTN %d-bit; %s: "
           "X^T X over %d windows (read in %.1f s)\n",
           stats, C.S.windows, C.S.length, C.S.loss, C.S.awq_tokens, C.S.pqi_bits, hessian, C.Hs.windows, now() - ts);
    mkdir("build", 0755);
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "llm_methods: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    printf("methods (perplexity on %d x 256 scored tokens; decode %d tokens after a %d-token prompt):\n", C.chunks,
           DECODE, PROMPT);
    fflush(stdout);
    measure(&C, "fp32", "fp32 reference (dequantized Q4_1)", NULL, NULL, 0);
    if (quick) {
        run_uniform(&C, "RTN", "RTN 4-bit g128", 4, MPQ_FORMAT_BITPLANE, 0);
        run_uniform(&C, "GPTQ", "GPTQ 4-bit g128 (act-order)", 4, MPQ_FORMAT_BITPLANE, Q_GPTQ | Q_ACT | Q_A8);
        run_sfmp(&C, 3.5, 128, 0);
    } else {
        for (int b = 2; b <= 4; b++) {
            char name[48];
            snprintf(name, sizeof name, "RTN %d-bit g128", b);
            run_uniform(&C, "RTN", name, b, MPQ_FORMAT_BITPLANE, 0);
        }
        run_uniform(&C, "MXINT", "MXINT4", 4, MPQ_FORMAT_MXINT, 0);
        run_uniform(&C, "AWQ", "AWQ 3-bit g128", 3, MPQ_FORMAT_BITPLANE, Q_AWQ);
        for (int b = 2; b <= 4; b++) {
            char name[48];
            snprintf(name, sizeof name, "GPTQ %d-bit g128 (act-order)", b);
            /* at 4 bits also MixLLM's W4A8 (its p0: uniform 4-bit weights, GPTQ) */
            run_uniform(&C, "GPTQ", name, b, MPQ_FORMAT_BITPLANE, Q_GPTQ | Q_ACT | (b == 4 ? Q_A8 : 0));
        }
        run_uniform(&C, "GPTQ", "GPTQ 3-bit g128", 3, MPQ_FORMAT_BITPLANE, Q_GPTQ);
        for (int b = 3; b <= 4; b++) {
            char name[48];
            snprintf(name, sizeof name, "AWQ + GPTQ %d-bit g128 (act-order)", b);
            run_uniform(&C, "AWQ+GPTQ", name, b, MPQ_FORMAT_BITPLANE, Q_AWQ | Q_GPTQ | Q_ACT);
        }
        run_awq4_pmpd(&C);
        /* SFMP as its paper runs it: group 256 at 2.25 and 3.25 (its table 3), 128 elsewhere */
        static const double budgets[] = {2.25, 2.5, 3.0, 3.25, 3.5, 4.25};
        for (int b = 0; b < 6; b++) run_sfmp(&C, budgets[b], budgets[b] == 2.25 || budgets[b] == 3.25 ? 256 : 128, 0);
        static const double awq_budgets[] = {2.25, 3.25, 3.5, 4.25};
        for (int b = 0; b < 4; b++) run_sfmp(&C, awq_budgets[b], b < 2 ? 256 : 128, Q_AWQ);
        for (int b = 0; b < 4; b++) run_sfmp(&C, awq_budgets[b], b < 2 ? 256 : 128, Q_GPTQ | Q_ACT);
        run_sfmp(&C, 3.25, 128, Q_AWQ | Q_GPTQ | Q_ACT); /* compositions: SFMP's widths, AWQ's scales, GPTQ */
        run_sfmp(&C, 4.0, 128, Q_AWQ | Q_GPTQ | Q_ACT);
        run_mixllm(&C, 4, 0);
        run_mixllm(&C, 3, 0);
        run_mixllm(&C, 4, Q_GPTQ | Q_ACT | Q_A8); /* and MixLLM's W4.4A8 */
        run_mxsens(&C);
        run_requant(&C, NULL, 0, "ReQuant on RTN 3-bit");
        run_requant(&C, NULL, 1, "ReQuant on AWQ 3-bit");
        /* compositions: SFMP's plan, AWQ's scales and ReQuant's sparse part */
        static const double comp[] = {3.25, 4.0};
        for (int b = 0; b < 2; b++) {
            mpq_plan p;
            sfmp_plan(&C, comp[b], 128, 0, &p);
            char name[64];
            snprintf(name, sizeof name, "SFMP %.2f g128 + AWQ + ReQuant", comp[b]);
            run_requant(&C, &p, 1, name);
            mpq_plan_free(&p);
        }
    }
    write_results(out, model, &C, now() - t0);
    printf("total %.0f s\n", now() - t0);
    mpq_calib_stats_free(&C.S);
    mpq_calib_stats_free(&C.Hs);
    free(C.eval), free(C.calib);
    mpq_llm_free(C.m);
    return 0;
}
