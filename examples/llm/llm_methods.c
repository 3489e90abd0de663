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
      sensitivities of every linear map (mpq_model.h section 5); and X^T X of
      every map's inputs for GPTQ (`mpq calibrate --stats xtx`, a second
      file, more windows). Each file names the model and the text's hash; a
      file for another model or text is refused.
   3. Every row of rows.h quantizes the 210 linear maps of the layers as
      `mpq quantize` does with the row's options (the same recipe of mpq.h,
      so the same bytes; the token embedding, which is also the output
      head, is packed at 8 bits for every quantized model, as llama.cpp
      keeps it at Q8_0): RTN 2/3/4, MXINT4, AWQ 3/4; GPTQ 2/3/4
      (act-order), 3 without act-order, and AWQ's scales and clips followed
      by GPTQ at 3 and 4 bits; SFMP's plans from the Fisher diagonal at 2.25
      to 4.25 bpw (group 256 at 2.25 and 3.25, as its table 3) quantized by
      RTN, by AWQ (its section 5) and by GPTQ (planned in act-order's column
      order, so that GPTQ can take it), and at 3.25 and 4.0 by AWQ + GPTQ;
      MixLLM's 8/4-bit output-channel mix (10 % at 8 bits) and an 8/3 mix,
      by RTN and (as its paper) by GPTQ; MXSens's 4/6/8 MXINT templates at
      the lowest budget they meet and half a bit above; ReQuant on RTN 3 and
      AWQ 3 (0.25 % outliers + 0.25 % significant weights), and on SFMP's
      plans at 3.25 and 4.0 with AWQ (the three composed); PMPD on the AWQ
      4-bit model (the prompt at 4 bits, the decode lowered, and the static
      scheduler's choice on calibration text); MixLLM's W4A8 (GPTQ 4-bit)
      and W4.4A8 (MixLLM 8/4 + GPTQ) again with 8-bit activations (", A8"
      rows; --a8: every quantized row); the rotated rows: RTN, AWQ, GPTQ
      and AWQ + GPTQ at 3 and 4 bits and SFMP + GPTQ at 3 to 4.25 bpw with
      the incoherence rotation (SFMP's Fisher gathered in the rotated basis,
      a third file: `mpq calibrate --rotate 1 --stats fisher`).
   4. The peers: llama.cpp's own quantizations of the same GGUF with its
      importance matrix from the same calibration text (k-quants and
      IQ4_XS, made by bench/llama_peers.sh), read as float and measured
      the same way (no decode speed: mpq runs them as float weights).
   Every model is measured on the
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
#include "mpq_io.h"
#include "mpq_model.h"
#include "report.h"
#include "progress.h"
#include "rows.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
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
    mpq_calib_stats Sr; /* Fisher of the rotated weights (mpq calibrate --rotate 1 --stats fisher) */
    int quiet;          /* no progress lines (--quiet) */
    progress P;         /* the step under way: packing maps, perplexity chunks */
    char step[64];      /* what P shows beside its count */
    const char *qstep;  /* the recipe's step P counts (quantizing) */
    mpq_kl_base kl;     /* the reference's predictions on the scored tokens (the first row) */
    int32_t *seq_text;  /* the calibration text as `mpq quantize --sequential` tokenizes it */
    size_t nseq;
    const char *calib_path;
    uint64_t calib_hash;    /* mpq_text_hash of the calibration text */
    const char *measure;    /* the ROW_MEASURE rows' measurements (--measure) */
    const char *measure256; /* the ROW_MEASURE256 rows' (--measure256) */
    double predicted;       /* the row being measured: its plan's predicted KLD (auto), else 0 */
    double peer_bpw;        /* a peer's row (llama.cpp's file, read as float): its bpw; 0 otherwise */
    double peer_mb;         /* and the MB of its tensors */
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
    double kld, kld_err, same_top; /* against the first row (the reference) */
    double predicted;              /* auto: the plan's predicted KLD; 0 otherwise */
} row;

enum { MAX_ROWS = 128 };
static row rows[MAX_ROWS];
static int nrows;

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
    if (nrows == MAX_ROWS) die("rows", MPQ_ERR_SIZE);
    row *r = &rows[nrows++];
    const int a8 = C->m->a8 && C->m->layer[0].lin[0].A.buf; /* 8-bit activations reach packed maps only */
    snprintf(r->name, sizeof r->name, "%s%s", name, a8 ? ", A8" : "");
    name = r->name;
    snprintf(r->family, sizeof r->family, "%s", family);
    snprintf(r->note, sizeof r->note, "%s", note ? note : "");
    r->predicted = C->m->a8 ? 0 : C->predicted; /* the plan predicts float activations */
    mpq_ppl_opts o;
    memset(&o, 0, sizeof o);
    o.chunks = C->chunks, o.schedule = sched, o.progress = ppl_step, o.user = C;
    if (r == rows) /* the reference: what it predicts, for the KL divergence of every other row */
        o.kl_record = &C->kl;
    else
        o.kl_ref = &C->kl;
    mpq_ppl_result res;
    snprintf(C->step, sizeof C->step, "%s", name);
    progress_start(&C->P, "llm_methods", !C->quiet, C->chunks);
    progress_show(&C->P, 0, C->step);
    mpq_status st = mpq_llm_perplexity(C->m, C->eval, C->neval, &o, &res);
    progress_end(&C->P);
    if (st != MPQ_OK) die(name, st);
    r->ppl = res.ppl, r->ppl_err = res.ppl_err;
    r->kld = res.kl.kld, r->kld_err = res.kl.kld_err, r->same_top = r == rows ? 1.0 : res.kl.same_top;
    r->bpw = C->peer_bpw ? C->peer_bpw : C->m->layer[0].lin[0].A.buf ? bpw_all_bytes(C) : 32.0;
    r->mb = C->peer_bpw ? C->peer_mb : (double)mpq_llm_weight_bytes(C->m) / 1e6;
    double ms_at[MPQ_MAX_BITS] = {0};
    int n_at[MPQ_MAX_BITS] = {0};
    r->decode = C->peer_bpw ? 0 : decode_rate(C, sched, ms_at, n_at); /* a peer runs as float weights here */
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
    printf("  %-36s %6.3f bpw  %7.1f MB  ppl %9.4f +/- %8.4f  KLD %7.4f  same top %5.1f %%  %6.1f tokens/s  (%.0f "
           "s)%s%s\n",
           name, r->bpw, r->mb, r->ppl, r->ppl_err, r->kld, 100 * r->same_top, r->decode, r->seconds,
           r->note[0] ? "  " : "", r->note);
    fflush(stdout);
}

/* Progress of a row's quantization (the recipe's steps). */
static void quant_step(void *user, const char *step, int done, int total, const char *name)
{
    ctx *C = (ctx *)user;
    if (C->qstep != step) {
        progress_end(&C->P);
        progress_start(&C->P, "llm_methods", !C->quiet, total);
        C->qstep = step;
    }
    char what[96];
    snprintf(what, sizeof what, "%s %s", step, name ? name : "");
    progress_show(&C->P, done, what);
}

/* The row just measured, again with 8-bit activations (MixLLM's A8) when
   the row asks for it and the run's activations are float. */
static void measure_a8(ctx *C, const llm_row *row)
{
    if (!(row->flags & ROW_A8) || C->m->a8) return;
    C->m->a8 = 1;
    measure(C, row->family, row->name, NULL, NULL, 0);
    C->m->a8 = 0;
}

static void run_pmpd(ctx *C);

/* The measurements a row reads (ROW_MEASURE, ROW_MEASURE256), or NULL. */
static const char *row_measure(const ctx *C, const llm_row *row)
{
    return row->flags & ROW_MEASURE ? C->measure : row->flags & ROW_MEASURE256 ? C->measure256 : NULL;
}

/* One row: quantized as `mpq quantize` would, then measured. */
static void run_row(ctx *C, const llm_row *row)
{
    const double t0 = now();
    mpq_recipe_result res;
    double bpw = 0;
    C->qstep = NULL;
    progress_start(&C->P, "llm_methods", !C->quiet, 1);
    const row_stats rs = {&C->S, &C->Hs, &C->Sr, C->seq_text, C->nseq, C->calib_hash};
    char args[1024];
    const char *mfile = row_measure(C, row);
    snprintf(args, sizeof args, "%s%s%s%s%s", row->args, row->flags & ROW_SEQ ? " --sequential " : "",
             row->flags & ROW_SEQ ? C->calib_path : "", mfile ? " --measure " : "", mfile ? mfile : "");
    const int rc = quantize_row(args, LLM_ROW_COMMON, C->m, &rs, quant_step, C, &res, &bpw);
    progress_end(&C->P);
    if (rc) exit(1);
    char note[160] = "";
    if (strstr(row->args, "--bpw min")) snprintf(note, sizeof note, "the budget %.4f bits per weight", bpw);
    if (strstr(row->args, "requant"))
        snprintf(note, sizeof note, "eq. 9 temperature t = %.2f; %zu weights in the sparse parts", res.requant_t,
                 res.sparse_weights);
    if (mfile)
        snprintf(note, sizeof note, "predicted KLD %.4f (the sum of the maps' measured KLDs at their widths)",
                 res.loss);
    C->predicted = res.loss;
    measure(C, row->family, row->name, NULL, note, now() - t0);
    C->predicted = 0;
    measure_a8(C, row);
    if (row->flags & ROW_PMPD) run_pmpd(C);
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

/* PMPD on the packed matrices just measured (AWQ 4-bit): the prompt at 4
   bits and every decoded token at 3; the static scheduler's choice over 4
   -> 3 bits (five candidate switch points over the 255 scored tokens) for
   at most 10 % more perplexity on calibration text than 4 bits throughout;
   4 -> 3 -> 2 bits (switch at 16 and 40). */
static void run_pmpd(ctx *C)
{
    double t0;
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
}

/* ---- output ------------------------------------------------------------------ */

static void write_results(const char *dir, const char *model, const ctx *C, double total)
{
    char p[1024];
    FILE *f = report_open("llm_methods", dir, "results.md", p, sizeof p);
    fprintf(f,
            "| method | bpw | weights MB | perplexity | +/- | vs fp32 | KLD | +/- | same top | decode tokens/s |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    char vs[MAX_ROWS][32];
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        const double x = r->ppl / rows[0].ppl;
        if (x < 10)
            snprintf(vs[i], sizeof vs[i], "%+.1f %%", 100.0 * (x - 1.0));
        else
            snprintf(vs[i], sizeof vs[i], "x %.3g", x);
        char dec[32] = "-";
        if (r->decode > 0) snprintf(dec, sizeof dec, "%.1f", r->decode);
        fprintf(f, "| %s | %.3f | %.1f | %.4g | %.3g | %s | %.4f | %.4f | %.1f %% | %s |\n", r->name, r->bpw, r->mb,
                r->ppl, r->ppl_err, vs[i], r->kld, r->kld_err, 100 * r->same_top, dec);
    }
    /* the rows again, by KL divergence to the reference (the reference first) */
    int order[MAX_ROWS];
    for (int i = 0; i < nrows; i++) order[i] = i;
    for (int i = 1; i < nrows; i++)
        for (int j = i; j > 1 && rows[order[j]].kld < rows[order[j - 1]].kld; j--) {
            const int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    fprintf(f,
            "\nBy KL divergence to the reference:\n\n| rank | method | bpw | KLD | same top | vs fp32 |\n"
            "| ---: | --- | ---: | ---: | ---: | ---: |\n");
    for (int k = 1; k < nrows; k++) {
        const row *r = &rows[order[k]];
        fprintf(f, "| %d | %s | %.3f | %.4f | %.1f %% | %s |\n", k, r->name, r->bpw, r->kld, 100 * r->same_top,
                vs[order[k]]);
    }
    int npred = 0;
    for (int i = 0; i < nrows; i++) npred += rows[i].predicted > 0;
    if (npred) { /* the allocation's prediction against what the model measures */
        fprintf(f,
                "\nThe auto rows' predicted KLD (the sum of the maps' KLDs measured on calibration text, each map "
                "alone at its widths) against the KLD measured on the evaluation text:\n\n"
                "| method | bpw | predicted KLD | measured KLD | measured / predicted |\n"
                "| --- | ---: | ---: | ---: | ---: |\n");
        for (int i = 0; i < nrows; i++)
            if (rows[i].predicted > 0)
                fprintf(f, "| %s | %.3f | %.4f | %.4f | %.2f |\n", rows[i].name, rows[i].bpw, rows[i].predicted,
                        rows[i].kld, rows[i].kld / rows[i].predicted);
    }
    fprintf(f,
            "\nModel `%s` (%d layers, dim %d; its linear maps are stored as Q4_1 in the GGUF: the fp32 reference "
            "is that 4-bit grid dequantized). Perplexity as llama-perplexity computes it: %d chunks of 512 tokens "
            "of the evaluation text (%zu tokens in all), the second half of each scored. KLD: the mean KL divergence "
            "(nats) of each row's next-token distributions from the reference's over the same scored tokens, "
            "+/- its standard error, with the reference's %d most probable tokens and the rest of the vocabulary as "
            "one outcome (mpq_model.h, KL DIVERGENCE); same top: how often the two agree on the most probable "
            "token. bpw: every byte of the "
            "packed buffers of the 210 linear maps of the layers (scales, zeros, bits maps, permutations, column "
            "scales, sparse parts, headers) per weight; PMPD: the average read per decoded token. Every quantized "
            "model also packs the embedding (= the output head) at 8 bits, counted in the weights' MB. Decode: "
            "%d tokens after a %d-token prompt, greedy. Statistics from mpq calibrate: %d windows of %d tokens of "
            "the calibration text; GPTQ's X^T X (position 0 included) from %d windows of %d tokens. %.0f s in all "
            "(statistics read, not computed).\n",
            model, C->m->c.layers, C->m->c.dim, C->chunks, C->neval, C->kl.top, DECODE, PROMPT, C->S.windows,
            C->S.length, C->Hs.windows, C->Hs.length, total);
    for (int i = 0; i < nrows; i++)
        if (rows[i].note[0]) fprintf(f, "\n%s: %s.\n", rows[i].name, rows[i].note);
    fprintf(f,
            "\nEvery quantized row is what `mpq quantize OPTIONS %s --stats STATS --hessian HESSIAN MODEL OUT` "
            "writes, byte for byte (the same recipe of mpq.h; test_cli_llm checks it row by row), with "
            "`--salience ROT_STATS` (the Fisher of the rotated weights) added to the rotated SFMP rows; the options "
            "of each:\n\n",
            LLM_ROW_COMMON);
    for (int k = 0; k < LLM_NROWS; k++)
        fprintf(f, "- %s: `%s%s%s`\n", llm_rows[k].name, llm_rows[k].args,
                llm_rows[k].flags & ROW_SEQ ? " --sequential CALIB" : "",
                llm_rows[k].flags & ROW_MEASURE          ? " --measure MEASURE"
                    : llm_rows[k].flags & ROW_MEASURE256 ? " --measure MEASURE256"
                                                         : "");
    fprintf(f,
            "\nMEASURE: `mpq measure %s --hessian HESSIAN MODEL CALIB -o MEASURE`; MEASURE256 the same with `--group "
            "256`.\n",
            LLM_MEASURE_ARGS);
    fclose(f);
    printf("wrote %s\n", p);
    plot_point pts[MAX_ROWS];
    for (int i = 0; i < nrows; i++) pts[i].family = rows[i].family, pts[i].bpw = rows[i].bpw, pts[i].ppl = rows[i].ppl;
    report_plot("llm_methods", dir, pts, nrows, "perplexity (log scale)", "fp32 reference");
}

/* ---- peers ------------------------------------------------------------------- */

/* llama.cpp's quantizations of the same GGUF (bench/llama_peers.sh), in
   order of size: what of them the directory holds is measured as the rows
   are, against the same reference, read as float weights (mpq reads the
   k-quants and IQ4; the IQ3 and IQ2 types, whose codes index lattice
   tables, it does not). */
static const char *const peer_types[] = {"Q2_K",   "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_XS",
                                         "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K"};

static void run_peers(ctx *C, const char *dir)
{
    for (size_t k = 0; k < sizeof peer_types / sizeof *peer_types; k++) {
        char path[1024], name[64];
        snprintf(path, sizeof path, "%s/peer-%s.gguf", dir, peer_types[k]);
        mpq_gguf_file *g = NULL;
        mpq_io_err e;
        if (access(path, R_OK) != 0) continue;
        if (mpq_gguf_open(path, &g, &e) != MPQ_OK) {
            fprintf(stderr, "llm_methods: %s\n", e.msg);
            exit(1);
        }
        /* every stored byte of the linear maps of the layers, per weight, as for the rows */
        double bytes = 0, w = 0, all = 0;
        for (int i = 0; i < mpq_gguf_count(g); i++) all += (double)mpq_gguf_at(g, i)->bytes;
        for (int i = 0; i < C->nl; i++) {
            char tn[96];
            mpq_llm_linear_name(1, i / MPQ_LIN_COUNT, i % MPQ_LIN_COUNT, 0, tn, sizeof tn);
            const mpq_gguf_tensor *t = mpq_gguf_find(g, tn);
            if (!t) {
                fprintf(stderr, "llm_methods: %s: no tensor %s (not a file of this model)\n", path, tn);
                exit(1);
            }
            bytes += (double)t->bytes, w += (double)t->numel;
        }
        mpq_gguf_close(g);
        mpq_llm *peer = NULL, *own = C->m;
        if (mpq_llm_load(path, &peer, &e) != MPQ_OK) {
            fprintf(stderr, "llm_methods: %s\n", e.msg);
            exit(1);
        }
        if (peer->c.layers != own->c.layers || peer->c.dim != own->c.dim || peer->c.vocab != own->c.vocab) {
            fprintf(stderr, "llm_methods: %s is not a file of %s's shape\n", path, own->path ? own->path : "the model");
            exit(1);
        }
        C->m = peer, C->peer_bpw = 8.0 * bytes / w, C->peer_mb = all / 1e6;
        snprintf(name, sizeof name, "llama.cpp %s (imatrix)", peer_types[k]);
        measure(C, "llama.cpp", name, NULL, NULL, 0);
        C->m = own, C->peer_bpw = 0, C->peer_mb = 0;
        mpq_llm_free(peer);
    }
}

/* ---- main -------------------------------------------------------------------- */

/* Whether the comma-separated list holds the word. */
static int in_list(const char *list, const char *word)
{
    const size_t n = strlen(word);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, word, n) && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

/* Whether the run measures the row: --quick's rows, or --only's families. */
static int wanted(const llm_row *row, int quick, const char *only)
{
    if (quick && !(row->flags & ROW_QUICK)) return 0;
    return !only || in_list(only, row->family);
}

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
               *hessian = "build/llm/hessian.safetensors", *rot_stats = "build/llm/stats_rot.safetensors",
               *peers = "build/peers", *only = NULL;
    ctx C;
    memset(&C, 0, sizeof C);
    C.chunks = 8, C.measure = "build/llm/measure.safetensors", C.measure256 = "build/llm/measure-g256.safetensors";
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
        else if (!strcmp(argv[i], "--rot-stats") && i + 1 < argc)
            rot_stats = argv[++i];
        else if (!strcmp(argv[i], "--peers") && i + 1 < argc)
            peers = argv[++i];
        else if (!strcmp(argv[i], "--measure") && i + 1 < argc)
            C.measure = argv[++i];
        else if (!strcmp(argv[i], "--measure256") && i + 1 < argc)
            C.measure256 = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
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
                    "          [--rot-stats FILE] [--measure FILE] [--measure256 FILE] [--peers DIR] [--out DIR]\n"
                    "          [--chunks N] [--full] [--quick] [--only FAMILIES] [--threads T] [--quiet] [--a8]\n"
                    "Every method of mpq on a real model: perplexity (as llama-perplexity), bits per weight and\n"
                    "decode tokens/s; writes DIR/results.md and DIR/ppl_vs_bpw.svg. Statistics: FILE, written by\n"
                    "`mpq calibrate MODEL CALIB -o FILE`, GPTQ's X^T X, written by `mpq calibrate --stats xtx\n"
                    "--windows 64 MODEL CALIB -o FILE`, and the Fisher of the rotated weights (--rot-stats), written\n"
                    "by `mpq calibrate --rotate 1 --stats fisher MODEL CALIB -o FILE` (examples/run.sh runs each\n"
                    "once and reuses them). --measure: the KL divergences the auto rows allocate from, written by\n"
                    "`mpq measure " LLM_MEASURE_ARGS " MODEL CALIB --hessian FILE -o FILE`;\n"
                    "--measure256: the same with --group 256, for the auto row at groups of 256. --peers:\n"
                    "llama.cpp's quantizations of the model (peer-TYPE.gguf, made by bench/llama_peers.sh)\n"
                    "measured beside the rows, those the directory holds. Defaults: the files examples/run.sh\n"
                    "fetches and writes into build/, 8 evaluation chunks of 512 tokens (--full: every chunk;\n"
                    "--quick: 2 chunks, four methods;\n"
                    "--only: the rows of these families, comma-separated, e.g. auto+GPTQ,SFMP+GPTQ, and llama.cpp\n"
                    "for the peers). --a8: every quantized row with 8-bit activations (MixLLM's A8; by default\n"
                    "only GPTQ 4-bit and MixLLM 8/4 + GPTQ get an A8 row).\n"
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
    C.calib_hash = calib_hash;
    C.calib_path = calib;
    { /* as `mpq quantize --sequential` reads it: every byte, no BOS added */
        FILE *f = fopen(calib, "rb");
        char *s = NULL;
        long len = -1;
        if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
            (s = (char *)malloc((size_t)len + 1)) && fread(s, 1, (size_t)len, f) == (size_t)len) {
            if (mpq_tokenize(C.m->tok, s, (size_t)len, 0, &C.seq_text, &C.nseq, &e) != MPQ_OK)
                die(calib, MPQ_ERR_FORMAT);
        } else {
            die(calib, MPQ_ERR_IO);
        }
        free(s);
        fclose(f);
    }
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
    int rotated = 0; /* the rotated rows' Fisher, when a rotated row runs */
    for (int k = 0; k < LLM_NROWS; k++)
        rotated |= wanted(&llm_rows[k], quick, only) && strstr(llm_rows[k].args, "--rotate");
    if (rotated)
        read_stats(&C, rot_stats, model, calib, calib_hash, MPQ_CALIB_FISHER, "--rotate 1 --stats fisher ", &C.Sr);
    printf("statistics: %s: %d windows of %d tokens, loss %.4f, %d AWQ rows per map, PQI towards RTN %d-bit; %s: "
           "X^T X over %d windows (read in %.1f s)\n",
           stats, C.S.windows, C.S.length, C.S.loss, C.S.awq_tokens, C.S.pqi_bits, hessian, C.Hs.windows, now() - ts);
    report_dir("llm_methods", out);
    printf("methods (perplexity on %d x 256 scored tokens; decode %d tokens after a %d-token prompt):\n", C.chunks,
           DECODE, PROMPT);
    fflush(stdout);
    for (int k = 0; k < LLM_NROWS; k++) { /* the measurements before the first row: a missing file stops early */
        const char *ms = row_measure(&C, &llm_rows[k]);
        if (ms && wanted(&llm_rows[k], quick, only) && access(ms, R_OK) != 0) {
            fprintf(stderr,
                    "llm_methods: %s: cannot read it (run `mpq measure %s%s %s %s --hessian %s -o %s` first; "
                    "examples/run.sh does)\n",
                    ms, LLM_MEASURE_ARGS, ms == C.measure256 ? " --group 256" : "", model, calib, hessian, ms);
            return 1;
        }
    }
    measure(&C, "fp32", "fp32 reference (dequantized Q4_1)", NULL, NULL, 0);
    for (int k = 0; k < LLM_NROWS; k++)
        if (wanted(&llm_rows[k], quick, only)) run_row(&C, &llm_rows[k]);
    if (!quick && (!only || in_list(only, "llama.cpp"))) run_peers(&C, peers);
    write_results(out, model, &C, now() - t0);
    printf("total %.0f s\n", now() - t0);
    mpq_calib_stats_free(&C.S);
    mpq_calib_stats_free(&C.Hs);
    mpq_calib_stats_free(&C.Sr);
    mpq_kl_base_free(&C.kl);
    free(C.eval), free(C.calib), free(C.seq_text);
    mpq_llm_free(C.m);
    return 0;
}
