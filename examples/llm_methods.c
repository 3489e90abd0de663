/* llm_methods: every method of mpq on a real language model, measured the
   way users compare quantized models: perplexity as llama.cpp computes it,
   bits per weight, and decode tokens per second.

   usage: llm_methods [options]   (--help; `bash examples/run.sh` fetches the
                                   model and the texts and runs this)

   1. The model (default: SmolLM2-135M-Instruct, a GGUF whose linear maps are
      Q4_1 and embedding Q8_0) is loaded and dequantized to float: the "fp32
      reference". Its linear maps are therefore already on a 4-bit grid of
      blocks of 32, which every result here inherits.
   2. Statistics from activations: calibration chunks of 512 tokens of the
      calibration text (Python's library reference) run through the
      reference; every linear map's input gives diag(X^T X) and 128 evenly
      spaced tokens for AWQ, taken halfway between the sampling points so
      that none is the first of a chunk (that position carries the huge
      activations of an attention sink; AWQ scales tuned on them keep 4
      bits but ruin the 3 bits PMPD reads, see bench/results/NOTES.md).
   3. Each method quantizes the 210 linear maps of the layers (the token
      embedding, which is also the output head, is packed at 8 bits for
      every quantized model, as llama.cpp keeps it at Q8_0) and is measured
      on the evaluation text (the tutorial and the FAQ, never calibrated
      on): perplexity over the first --chunks chunks of 512 tokens, the
      second half of each scored; bits per weight of the linear maps
      (scales included); decode tokens per second over 64 tokens after a
      32-token prompt, on the packed matrices. RTN 2/3/4, MXINT4, AWQ 3/4,
      SFMP at fractional budgets (salience W_ij^2 diag(X^T X)_j / tokens, the
      expected squared output of the weight, in place of the Fisher diagonal
      that needs gradients), and PMPD on the AWQ 4-bit model (prefill at 4
      bits, decode lowered by a schedule: perplexity with the scored tokens
      read at the decode precisions, and decode time per token at each
      level).
   Writes DIR/results.md and DIR/ppl_vs_bpw.svg (DIR: build/llm). */
#define _POSIX_C_SOURCE 200809L
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_model.h"
#include "plot.h"

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

enum { AWQ_TOKENS = 128, KINDS = 4, DECODE = 64, PROMPT = 32 };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, mpq_status st)
{
    fprintf(stderr, "llm_methods: %s: %s\n", what, mpq_status_str(st));
    exit(1);
}

/* The input a linear map reads: q, k and v share the attention's, gate and
   up the MLP's. */
static int kind_of(int lin)
{
    return lin <= MPQ_LIN_V ? 0 : lin == MPQ_LIN_O ? 1 : lin == MPQ_LIN_DOWN ? 3 : 2;
}

typedef struct ctx {
    mpq_llm *m;
    int nl;                       /* linear maps: layers x 7 */
    int32_t *eval, *calib;
    size_t neval, ncalib;
    int chunks, calib_chunks, quiet;
    /* statistics per layer and input kind */
    mpq_stat *H;                  /* diag(X^T X) */
    float **colsq;                /* its mean over tokens */
    float **X;                    /* AWQ tokens x cols */
    int *xtok;
    long *seen;                   /* tokens observed so far */
    long stride;                  /* AWQ keeps every stride-th token */
} ctx;

static mpq_linear *lin_at(ctx *C, int i) { return &C->m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT]; }
static int kslot(int layer, int kind) { return layer * KINDS + kind; }

static void observe(void *user, int layer, int lin, const float *x, int tokens, int cols)
{
    ctx *C = (ctx *)user;
    if (lin != MPQ_LIN_Q && lin != MPQ_LIN_O && lin != MPQ_LIN_GATE && lin != MPQ_LIN_DOWN) return; /* shared inputs */
    const int k = kslot(layer, kind_of(lin));
    mpq_status st = mpq_hessian_diag_add(&C->H[k], x, tokens, cols);
    if (st != MPQ_OK) die("diag(X^T X)", st);
    for (int t = 0; t < tokens; t++, C->seen[k]++)
        if (C->seen[k] % C->stride == C->stride / 2 && C->seen[k] % 512 != 0 && C->xtok[k] < AWQ_TOKENS)
            memcpy(C->X[k] + (size_t)C->xtok[k]++ * cols, x + (size_t)t * cols, sizeof(float) * (size_t)cols);
}

static void statistics(ctx *C)
{
    const double t0 = now();
    const mpq_llm_config *c = &C->m->c;
    const int n = c->layers * KINDS;
    C->H = (mpq_stat *)calloc((size_t)n, sizeof *C->H);
    C->colsq = (float **)calloc((size_t)n, sizeof(float *));
    C->X = (float **)calloc((size_t)n, sizeof(float *));
    C->xtok = (int *)calloc((size_t)n, sizeof(int));
    C->seen = (long *)calloc((size_t)n, sizeof(long));
    for (int k = 0; k < n; k++) {
        const int cols = k % KINDS == 3 ? c->ffn : k % KINDS == 1 ? c->heads * c->head_dim : c->dim;
        if (mpq_stat_init(&C->H[k], (size_t)cols) != MPQ_OK) die("stat", MPQ_ERR_NOMEM);
        C->colsq[k] = (float *)malloc(sizeof(float) * (size_t)cols);
        C->X[k] = (float *)malloc(sizeof(float) * (size_t)cols * AWQ_TOKENS);
    }
    const long total = (long)C->calib_chunks * 512;
    C->stride = total / AWQ_TOKENS > 0 ? total / AWQ_TOKENS : 1;
    mpq_llm_state s;
    mpq_status st = mpq_llm_state_init(C->m, 512, 64, &s);
    if (st != MPQ_OK) die("state", st);
    C->m->observe = observe, C->m->observe_user = C;
    for (int i = 0; i < C->calib_chunks; i++) {
        mpq_llm_state_reset(&s);
        if ((st = mpq_llm_forward(C->m, &s, C->calib + (size_t)i * 512, 512, 0, NULL, 512)) != MPQ_OK)
            die("calibration", st);
    }
    C->m->observe = NULL;
    mpq_llm_state_free(&s);
    for (int k = 0; k < n; k++) {
        if ((st = mpq_stat_sum(&C->H[k], C->colsq[k])) != MPQ_OK) die("stat", st);
        for (size_t j = 0; j < C->H[k].n; j++) C->colsq[k][j] /= (float)(C->calib_chunks * 512);
        mpq_stat_free(&C->H[k]);
    }
    printf("statistics: %d calibration chunks of 512 tokens (%.1f s): diag(X^T X) and %d AWQ tokens per linear map\n",
           C->calib_chunks, now() - t0, AWQ_TOKENS);
    fflush(stdout);
}

/* ---- methods --------------------------------------------------------------- */

typedef struct row {
    char name[64], family[24], note[96];
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
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->family, sizeof r->family, "%s", family);
    snprintf(r->note, sizeof r->note, "%s", note ? note : "");
    mpq_ppl_opts o;
    memset(&o, 0, sizeof o);
    o.chunks = C->chunks, o.schedule = sched;
    mpq_ppl_result res;
    mpq_status st = mpq_llm_perplexity(C->m, C->eval, C->neval, &o, &res);
    if (st != MPQ_OK) die(name, st);
    r->ppl = res.ppl, r->ppl_err = res.ppl_err;
    r->bpw = C->m->layer[0].lin[0].A.buf ? mpq_llm_bpw(C->m, 2, -1) : 32.0;
    r->mb = (double)mpq_llm_weight_bytes(C->m) / 1e6;
    double ms_at[MPQ_MAX_BITS] = {0};
    int n_at[MPQ_MAX_BITS] = {0};
    r->decode = decode_rate(C, sched, ms_at, n_at);
    if (sched) { /* bits read while decoding, and the time per token at each level */
        double bits[MPQ_MAX_BITS];
        for (int k = 0; k < MPQ_MAX_BITS; k++) bits[k] = mpq_llm_bpw(C->m, 1, k);
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
    printf("  %-34s %6.3f bpw  %7.1f MB  ppl %8.4f +/- %6.4f  %6.1f tokens/s  (%.0f s)%s%s\n", name, r->bpw, r->mb,
           r->ppl, r->ppl_err, r->decode, r->seconds, r->note[0] ? "  " : "", r->note);
    fflush(stdout);
}

/* AWQ's scales and clips for linear map i under description d. */
static void awq_scales(ctx *C, int i, const mpq_bitplane_desc *d, float **cs, float **clip)
{
    const int k = kslot(i / MPQ_LIN_COUNT, kind_of(i % MPQ_LIN_COUNT));
    const int group = d->group ? d->group : 128;
    *cs = (float *)malloc(sizeof(float) * (size_t)d->cols);
    *clip = (float *)malloc(sizeof(float) * (size_t)d->rows * (size_t)((d->cols + group - 1) / group));
    mpq_awq_desc a;
    memset(&a, 0, sizeof a);
    a.X = C->X[k], a.tokens = C->xtok[k];
    mpq_status st = *cs && *clip ? mpq_awq_search(d, lin_at(C, i)->W, &a, *cs, *clip, NULL) : MPQ_ERR_NOMEM;
    if (st != MPQ_OK) die("awq", st);
}

/* Packs every linear map: descriptions from a plan, or uniform bits. */
static void pack_all(ctx *C, const mpq_plan *plan, int bits, int format, int awq)
{
    mpq_status st = MPQ_OK;
    for (int i = 0; i < C->nl && st == MPQ_OK; i++) {
        mpq_linear *L = lin_at(C, i);
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        if (plan) {
            st = mpq_plan_desc(plan, i, &d);
        } else {
            d.rows = L->rows, d.cols = L->cols, d.uniform_bits = bits, d.format = format;
        }
        float *cs = NULL, *clip = NULL;
        if (st == MPQ_OK && awq) awq_scales(C, i, &d, &cs, &clip);
        d.col_scale = cs, d.clip = clip;
        mpq_packed A;
        if (st == MPQ_OK) st = mpq_pack_alloc(&d, L->W, &A);
        if (st == MPQ_OK) st = mpq_linear_set_packed(C->m, L, &A);
        free(cs), free(clip);
    }
    if (st != MPQ_OK) die("pack", st);
    pack_embedding(C);
}

static void run_uniform(ctx *C, const char *family, const char *name, int bits, int format, int awq)
{
    const double t0 = now();
    pack_all(C, NULL, bits, format, awq);
    measure(C, family, name, NULL, NULL, now() - t0);
    unpack_all(C);
}

static void run_sfmp(ctx *C, double bpw, int awq)
{
    const double t0 = now();
    mpq_sfmp_layer *L = (mpq_sfmp_layer *)calloc((size_t)C->nl, sizeof *L);
    float **S = (float **)calloc((size_t)C->nl, sizeof(float *));
    for (int i = 0; i < C->nl; i++) { /* S_ij = W_ij^2 E[x_j^2] */
        const mpq_linear *W = lin_at(C, i);
        const float *q = C->colsq[kslot(i / MPQ_LIN_COUNT, kind_of(i % MPQ_LIN_COUNT))];
        S[i] = (float *)malloc(sizeof(float) * (size_t)W->rows * W->cols);
        for (int r = 0; r < W->rows; r++)
            for (int j = 0; j < W->cols; j++) {
                const float w = W->W[(size_t)r * W->cols + j];
                S[i][(size_t)r * W->cols + j] = w * w * q[j];
            }
        L[i].S = S[i], L[i].rows = W->rows, L[i].cols = W->cols;
    }
    mpq_sfmp_desc d;
    memset(&d, 0, sizeof d);
    d.bpw = bpw;
    mpq_plan p;
    mpq_status st = mpq_plan_sfmp(L, C->nl, &d, &p);
    if (st != MPQ_OK) die("sfmp plan", st);
    for (int i = 0; i < C->nl; i++) free(S[i]);
    free(S), free(L);
    pack_all(C, &p, 0, 0, awq);
    mpq_plan_free(&p);
    char name[64];
    snprintf(name, sizeof name, "SFMP %.2f%s", bpw, awq ? " + AWQ" : "");
    measure(C, awq ? "SFMP+AWQ" : "SFMP", name, NULL, NULL, now() - t0);
    unpack_all(C);
}

/* AWQ 4-bit, then PMPD on the same packed matrices: the prompt at 4 bits
   and every decoded token at 3; the first 32 decoded tokens at 4, then 3;
   4 -> 3 -> 2 bits (switch at 16 and 40). The switch points lie inside the
   measured decode, so each level's time per token shows. */
static void run_awq4_pmpd(ctx *C)
{
    const double t0 = now();
    pack_all(C, NULL, 4, MPQ_FORMAT_BITPLANE, 1);
    measure(C, "AWQ", "AWQ 4-bit g128", NULL, NULL, now() - t0);
    mpq_pmpd_schedule s;
    memset(&s, 0, sizeof s);
    s.prefill_skip = 0, s.nlevels = 1, s.skip[0] = 1;
    measure(C, "PMPD", "PMPD (AWQ 4): prompt 4-bit, decode 3-bit", &s, NULL, 0);
    s.nlevels = 2, s.skip[0] = 0, s.skip[1] = 1, s.start[1] = 32;
    measure(C, "PMPD", "PMPD (AWQ 4): 4-bit, 3 from token 32", &s, NULL, 0);
    s.nlevels = 3, s.skip[0] = 0, s.skip[1] = 1, s.skip[2] = 2, s.start[1] = 16, s.start[2] = 40;
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
    fprintf(f, "| method | bpw | weights MB | perplexity | +/- | vs fp32 | decode tokens/s |\n"
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        fprintf(f, "| %s | %.3f | %.1f | %.4f | %.4f | %+.2f %% | %.1f |\n", r->name, r->bpw, r->mb, r->ppl, r->ppl_err,
                100.0 * (r->ppl / rows[0].ppl - 1.0), r->decode);
    }
    fprintf(f, "\nModel `%s` (%d layers, dim %d; its linear maps are stored as Q4_1 in the GGUF: the fp32 reference "
               "is that 4-bit grid dequantized). Perplexity as llama-perplexity computes it: %d chunks of 512 tokens "
               "of the evaluation text (%zu tokens in all), the second half of each scored. bpw: the 210 linear maps "
               "of the layers, scales and zeros included (PMPD: the average read while decoding); every quantized "
               "model also packs the embedding (= the output head) at 8 bits, counted in the weights' MB. Decode: "
               "%d tokens after a %d-token prompt, greedy. Statistics from %d calibration chunks. %.0f s in all.\n",
            model, C->m->c.layers, C->m->c.dim, C->chunks, C->neval, DECODE, PROMPT, C->calib_chunks, total);
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

static int32_t *tokenize_file(const mpq_llm *m, const char *path, size_t *n)
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

int main(int argc, char **argv)
{
    const char *model = "build/models/SmolLM2-135M-Instruct.Q4_1.gguf", *eval = "build/text/eval.txt",
               *calib = "build/text/calib.txt", *out = "build/llm";
    ctx C;
    memset(&C, 0, sizeof C);
    C.chunks = 12, C.calib_chunks = 8;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--eval") && i + 1 < argc) eval = argv[++i];
        else if (!strcmp(argv[i], "--calib") && i + 1 < argc) calib = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--chunks") && i + 1 < argc) C.chunks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--calib-chunks") && i + 1 < argc) C.calib_chunks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--full")) C.chunks = 1 << 20, C.calib_chunks = 32;
        else if (!strcmp(argv[i], "--quick")) quick = 1, C.chunks = 2, C.calib_chunks = 2;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
#ifdef _OPENMP
            omp_set_num_threads(atoi(argv[i + 1]));
#endif
            i++;
        } else {
            const int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            fprintf(help ? stdout : stderr,
                    "usage: %s [--model PATH] [--eval TEXT] [--calib TEXT] [--out DIR] [--chunks N]\n"
                    "          [--calib-chunks N] [--full] [--quick] [--threads T]\n"
                    "Every method of mpq on a real model: perplexity (as llama-perplexity), bits per weight and\n"
                    "decode tokens/s; writes DIR/results.md and DIR/ppl_vs_bpw.svg. Defaults: the files\n"
                    "examples/run.sh fetches into build/, 12 evaluation chunks of 512 tokens and 8 calibration\n"
                    "chunks (--full: every evaluation chunk, 32 calibration chunks; --quick: 2 and 2, three methods).\n",
                    argv[0]);
            return help ? 0 : 1;
        }
    }
    if (C.chunks < 1 || C.calib_chunks < 1) {
        fprintf(stderr, "llm_methods: --chunks and --calib-chunks must be at least 1\n");
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
    C.eval = tokenize_file(C.m, eval, &C.neval);
    C.calib = tokenize_file(C.m, calib, &C.ncalib);
    const int have = (int)(C.neval / 512), have_cal = (int)(C.ncalib / 512);
    if (C.chunks > have) C.chunks = have;
    if (C.calib_chunks > have_cal) C.calib_chunks = have_cal;
    if (C.chunks < 1 || C.calib_chunks < 1) {
        fprintf(stderr, "llm_methods: the texts are shorter than one chunk of 512 tokens\n");
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
    mkdir("build", 0755);
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "llm_methods: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    fflush(stdout);
    statistics(&C);
    printf("methods (perplexity on %d x 256 scored tokens; decode %d tokens after a %d-token prompt):\n", C.chunks,
           DECODE, PROMPT);
    measure(&C, "fp32", "fp32 reference (dequantized Q4_1)", NULL, NULL, 0);
    if (quick) {
        run_uniform(&C, "RTN", "RTN 4-bit g128", 4, MPQ_FORMAT_BITPLANE, 0);
        run_sfmp(&C, 3.5, 0);
    } else {
        for (int b = 2; b <= 4; b++) {
            char name[48];
            snprintf(name, sizeof name, "RTN %d-bit g128", b);
            run_uniform(&C, "RTN", name, b, MPQ_FORMAT_BITPLANE, 0);
        }
        run_uniform(&C, "MXINT", "MXINT4", 4, MPQ_FORMAT_MXINT, 0);
        run_uniform(&C, "AWQ", "AWQ 3-bit g128", 3, MPQ_FORMAT_BITPLANE, 1);
        run_awq4_pmpd(&C);
        const double budgets[] = {3.25, 3.5, 4.0};
        for (int b = 0; b < 3; b++) run_sfmp(&C, budgets[b], 0);
        run_sfmp(&C, 3.5, 1);
    }
    write_results(out, model, &C, now() - t0);
    printf("total %.0f s\n", now() - t0);
    for (int k = 0; k < c->layers * KINDS; k++) free(C.colsq[k]), free(C.X[k]);
    free(C.H), free(C.colsq), free(C.X), free(C.xtok), free(C.seen);
    free(C.eval), free(C.calib);
    mpq_llm_free(C.m);
    return 0;
}
