/* mpq - quantize, evaluate, run, inspect and benchmark models.

     mpq quantize [options] IN OUT.safetensors     (IN: GGUF, HF directory, safetensors)
     mpq eval [options] MODEL TEXT                  (tools/mpq_llm.c)
     mpq run [options] MODEL --prompt TEXT          (tools/mpq_llm.c)
     mpq speed [options] MODEL                      (tools/mpq_llm.c)
     mpq calibrate, schedule, gen-eval [options] ... (tools/mpq_llm.c)
     mpq inspect FILE.safetensors
     mpq bench [options] FILE.safetensors
     mpq dequantize [options] IN OUT.safetensors
     mpq <command> --help

   Exit codes (for scripts): 0 success; 1 usage (unknown option, missing or
   bad value); 2 an input file is missing, malformed or does not fit (the
   message names the file and the tensor); 3 the output could not be
   written; 4 quantization failed (non-finite weights, ...; an SFMP or
   MXSens budget below what the tensors allow is a usage error and names the
   lowest one). */
#define _XOPEN_SOURCE 700
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_io.h"
#include "mpq_model.h"
#ifdef MPQ_HAVE_CUDA
#include "mpq_cuda.h"
#include <cuda_runtime_api.h>
#endif
#include "bench_util.h"
#include "cli.h"

#define STB_DS_IMPLEMENTATION
#include <stb/stb_ds.h>

#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int is_float_dtype(mpq_dtype t)
{
    return t == MPQ_DT_F32 || t == MPQ_DT_F16 || t == MPQ_DT_BF16 || t == MPQ_DT_F64;
}

/* ---------------------------------------------------------------------------
   quantize
   ------------------------------------------------------------------------ */

enum { M_RTN, M_AWQ, M_SFMP, M_MIXLLM, M_MXSENS, M_REQUANT, M_GPTQ, M_COUNT };
static const char *const method_names[] = {"rtn", "awq", "sfmp", "mixllm", "mxsens", "requant", "gptq"};

typedef struct qopts {
    int method, bits, group, block_rows, reorder, symmetric, format, threads, quiet, embed_bits;
    int awq_quantizer; /* AWQ's scales and clips first (--method awq, --quantizer awq or awq+gptq) */
    int gptq;          /* GPTQ quantizes (--method gptq, --quantizer gptq or awq+gptq) */
    int act_order, static_groups;
    double bpw, fraction, outliers, significant, damp;
    const char *salience, *calib, *hessian, *in, *out;
    const char **include, **exclude; /* stb_ds arrays of globs */
} qopts;

typedef struct job {
    int index; /* in the input */
    const char *name;
    int rows, cols;
    int plan_index; /* layer of the plan (planner methods); -1: an embedding or
                       head, quantized with round-to-nearest at --embed-bits */
    float *stat;    /* salience or column sensitivity (planners) */
    float layer_sens;
    uint8_t *mask;    /* requant: the weights of the sparse part */
    float *cs, *clip; /* requant on AWQ: the scales and clips of the dense part */
} job;

typedef struct row { /* one line of the summary table */
    const char *name;
    char shape[48], kind[80];
    double bpw; /* -1 for tensors kept as they are */
    uint64_t bytes_in, bytes_out, weights;
} row;

static void quantize_help(void)
{
    puts("usage: mpq quantize [options] IN OUT.safetensors\n"
         "\n"
         "IN is a safetensors file, a GGUF file or a Hugging Face checkpoint directory.\n"
         "\n"
         "A model (GGUF, a checkpoint directory, or safetensors with a config.json beside it\n"
         "or in its metadata): the linear maps of its layers whose names match --include and\n"
         "not --exclude are quantized by the method; the token embedding and an untied output\n"
         "head stay as they are unless --embed-bits asks for round-to-nearest; everything\n"
         "else is copied.\n"
         "OUT carries config.json, tokenizer.json and tokenizer_config.json in its metadata,\n"
         "so that `mpq eval` and `mpq run` take it as they take IN. Tensor names and the row\n"
         "order of q and k stay as IN has them (GGUF: adjacent rotary pairs; the config says so).\n"
         "\n"
         "Any other safetensors file: every 2-D float tensor (F32, F16, BF16, F64) whose name\n"
         "matches --include and not --exclude is quantized by the method, except embeddings\n"
         "and output heads (names matching *embed*, *tok_emb*, *wte*, *lm_head*, or output.weight),\n"
         "which --embed-bits governs as above; the rest is copied.\n"
         "\n"
         "A quantized tensor becomes an mpq packed matrix (a U8 tensor described by\n"
         "__metadata__, see mpq_io.h). GGUF tensors that are copied are written as F32 (F16\n"
         "and BF16 stay so).\n"
         "\n"
         "  --method M         rtn | awq | gptq | sfmp | mixllm | mxsens | requant (default rtn)\n"
         "  --bits B           rtn, awq, gptq, requant: width 1..8 (default 4)\n"
         "  --format F         rtn, gptq: bitplane | mxint (mxint: mantissa bits 2..8, group 32)\n"
         "  --symmetric        rtn, awq, gptq: symmetric groups\n"
         "  --bpw X            sfmp, mxsens: budget in bits per weight, scales included\n"
         "  --fraction F       mixllm: fraction of output channels at 8 bits (default 0.1)\n"
         "  --group G          columns per group, a multiple of 8 (default 128; mxsens 32)\n"
         "  --block-rows R     rows per bit-width block (default 16)\n"
         "  --reorder R        sfmp: none | rows | cols | both (default none)\n"
         "  --stats FILE       what `mpq calibrate` wrote: --salience and --calib at once\n"
         "  --outliers R       requant: fraction of all weights kept as outliers (default 0.0025),\n"
         "                     spread over the maps by PQI/ReQuant eq. 9\n"
         "  --significant R    requant: fraction detached as significant weights (default 0.0025)\n"
         "  --quantizer Q      sfmp, mixllm, mxsens: rtn | awq | gptq | awq+gptq (default rtn);\n"
         "                     requant: rtn | awq; gptq: gptq | awq+gptq. awq: AWQ's scale and\n"
         "                     clip search under the plan's widths (needs --calib or --stats);\n"
         "                     gptq: GPTQ's error feedback (needs --hessian); awq+gptq: both, AWQ\n"
         "                     first\n"
         "  --hessian FILE     gptq: X^T X of each weight's inputs, cols x cols, named as the\n"
         "                     weight or '<name>.xtx' (`mpq calibrate --stats xtx`); default: the\n"
         "                     --stats file\n"
         "  --act-order        gptq: columns in order of decreasing diag(X^T X), stored as the\n"
         "                     packed column permutation (free at inference); for widths that\n"
         "                     do not vary along the columns (uniform, mixllm)\n"
         "  --static-groups    gptq: every group's scale from the weights before error feedback\n"
         "  --damp X           gptq: X * mean(diag X^T X) added to the diagonal (default 0.01;\n"
         "                     0: none)\n"
         "  --salience FILE    safetensors with one tensor per quantized weight, named as the\n"
         "                     weight or as the weight with the suffix mpq calibrate writes:\n"
         "                       sfmp    rows x cols   Fisher diagonal (.fisher)\n"
         "                       mixllm  rows          output-channel salience (.mixllm)\n"
         "                       requant rows x cols   PQI along W -> Q(W) (.pqi)\n"
         "                       mxsens  cols          diag(X^T X) (.xtx_diag); optional scalar\n"
         "                                             '<name>.layer_sensitivity' in [0, 1]\n"
         "                     finite and >= 0\n"
         "  --calib FILE       safetensors with activations tokens x cols per weight name\n"
         "                     (or '<name>.awq'): awq and --quantizer awq (required), mxsens\n"
         "                     (diag(X^T X) when no --salience)\n"
         "  --embed-bits B     the embedding and head by round-to-nearest at B bits, g128\n"
         "                     (default 0: kept as they are)\n"
         "  --include GLOB     quantize only matching names (repeatable; default all)\n"
         "  --exclude GLOB     never quantize matching names (repeatable), e.g. '*embed_tokens*',\n"
         "                     '*tok_emb*', '*lm_head*', '*.layers.0.*'\n"
         "  --threads T        OpenMP threads (default all)\n"
         "  --quiet            no progress and no table\n"
         "\n"
         "Exit codes: 0 ok, 1 usage, 2 bad input file, 3 output not written, 4 quantization failed.");
}

static int glob_any(const char **globs, const char *name)
{
    for (ptrdiff_t i = 0; i < arrlen(globs); i++)
        if (fnmatch(globs[i], name, 0) == 0) return 1;
    return 0;
}

/* The tensor of a statistic for weight `name`: `name` itself, else
   `name.suffix` as mpq calibrate writes it; NULL when neither is there
   (*used: the name looked for last). */
static const mpq_st_tensor *find_stat(mpq_st_file *f, const char *name, const char *suffix, char *used, size_t cap)
{
    snprintf(used, cap, "%s", name);
    const mpq_st_tensor *t = mpq_st_find(f, name);
    if (t || !suffix) return t;
    snprintf(used, cap, "%s.%s", name, suffix);
    return mpq_st_find(f, used);
}

/* Reads a float tensor, the statistic `suffix` of weight `name` (see
   find_stat), with exactly the given shape (ndim2 = 0: a vector of d0;
   scalars: d0 = 1 accepts [] and [1]); every value finite, and >= 0 when
   nonneg. */
static int read_stat(mpq_st_file *f, const char *name, const char *suffix, int nonneg, uint64_t d0, uint64_t d1,
                     int ndim, float **out)
{
    mpq_io_err e;
    char full[1024];
    const mpq_st_tensor *t = find_stat(f, name, suffix, full, sizeof full);
    if (!t) {
        if (suffix)
            return fail(EXIT_INPUT, "%s: tensor '%s': not found (nor '%s.%s')", mpq_st_path(f), name, name, suffix);
        return fail(EXIT_INPUT, "%s: tensor '%s': not found", mpq_st_path(f), name);
    }
    name = full;
    if (!is_float_dtype(t->dtype))
        return fail(EXIT_INPUT, "%s: tensor '%s': dtype %s, need a float type", mpq_st_path(f), name,
                    mpq_dtype_name(t->dtype));
    int ok = ndim == 2 ? (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1)
                       : (t->numel == d0 && (t->ndim == 1 || (d0 == 1 && t->ndim == 0)));
    if (!ok) {
        if (ndim == 2)
            return fail(EXIT_INPUT, "%s: tensor '%s': shape does not match the weight (need %llu x %llu)",
                        mpq_st_path(f), name, (unsigned long long)d0, (unsigned long long)d1);
        return fail(EXIT_INPUT, "%s: tensor '%s': shape does not match the weight (need [%llu])", mpq_st_path(f), name,
                    (unsigned long long)d0);
    }
    float *v = (float *)malloc(sizeof(float) * (size_t)t->numel + 1);
    if (!v) return fail(EXIT_INPUT, "out of memory");
    if (mpq_st_read_f32(f, t, v, (size_t)t->numel, &e) != MPQ_OK) {
        free(v);
        return fail(EXIT_INPUT, "%s", e.msg);
    }
    for (uint64_t i = 0; i < t->numel; i++) {
        if (!(v[i] - v[i] == 0.0f) || (nonneg && v[i] < 0)) {
            const int nf = !(v[i] - v[i] == 0.0f);
            fail(EXIT_INPUT, "%s: tensor '%s': element %llu is %s (%g); %s", mpq_st_path(f), name,
                 (unsigned long long)i, nf ? "not finite" : "negative", v[i],
                 nf ? "statistics must be finite" : "this statistic cannot be negative");
            free(v);
            return EXIT_INPUT;
        }
    }
    *out = v;
    return 0;
}

/* Calibration activations of a weight: tokens x cols. */
static int read_calib(mpq_st_file *f, const job *J, float **X, int *tokens)
{
    char full[1024];
    const mpq_st_tensor *t = find_stat(f, J->name, "awq", full, sizeof full);
    if (!t)
        return fail(EXIT_INPUT, "%s: tensor '%s': not found (activations for it; nor '%s.awq')", mpq_st_path(f),
                    J->name, J->name);
    if (t->ndim != 2 || t->shape[1] != (uint64_t)J->cols || t->shape[0] < 1 || t->shape[0] > INT_MAX)
        return fail(EXIT_INPUT, "%s: tensor '%s': activations must be tokens x %d", mpq_st_path(f), full, J->cols);
    *tokens = (int)t->shape[0];
    return read_stat(f, J->name, "awq", 0, t->shape[0], t->shape[1], 2, X);
}

static void widths_text(const mpq_packed *A, char *s, size_t cap)
{
    double w[MPQ_MAX_BITS + 1] = {0}, total = 0;
    const int nbr = (A->rows + A->block_rows - 1) / A->block_rows;
    for (int b = 0; b < nbr; b++)
        for (int g = 0; g < A->ngroups; g++) {
            const int r = A->rows - b * A->block_rows < A->block_rows ? A->rows - b * A->block_rows : A->block_rows;
            const int c = A->cols - g * A->group < A->group ? A->cols - g * A->group : A->group;
            w[A->bits[(size_t)b * A->ngroups + g]] += (double)r * c;
            total += (double)r * c;
        }
    s[0] = 0;
    for (int k = 1; k <= MPQ_MAX_BITS; k++)
        if (w[k] > 0) {
            size_t n = strlen(s);
            if (w[k] == total)
                snprintf(s + n, cap - n, "%s%d", n ? " " : "", k);
            else
                snprintf(s + n, cap - n, "%s%d:%.0f%%", n ? " " : "", k, 100.0 * w[k] / total);
        }
}

/* A table row's description of a packed matrix: format, widths, sparse
   part, then `suffix`; its bpw, bytes and weights. */
static void row_packed(row *r, const mpq_packed *A, const char *suffix)
{
    char wt[32];
    widths_text(A, wt, sizeof wt);
    snprintf(r->kind, sizeof r->kind, "%s %s%s%s", A->format == MPQ_FORMAT_MXINT ? "mxint" : "bitplane", wt,
             A->sp_row_ptr ? " +sparse" : "", suffix);
    r->bpw = mpq_packed_bpw(A, 2), r->bytes_out = A->bytes, r->weights = (uint64_t)A->rows * (uint64_t)A->cols;
}

/* The summary table; `quantized` adds the bytes before quantization. */
static void print_rows(const row *rows, int quantized)
{
    if (quantized)
        printf("%-40s %-13s %-24s %8s %12s %12s\n", "tensor", "shape", "stored as", "bpw", "bytes in", "bytes out");
    else
        printf("%-40s %-13s %-24s %8s %12s\n", "tensor", "shape", "stored as", "bpw", "bytes");
    uint64_t in = 0, out = 0, wq = 0;
    double bits = 0;
    for (ptrdiff_t i = 0; i < arrlen(rows); i++) {
        const row *r = &rows[i];
        char bpw[16];
        if (r->bpw >= 0)
            snprintf(bpw, sizeof bpw, "%.3f", r->bpw);
        else
            snprintf(bpw, sizeof bpw, "-");
        printf("%-40.40s %-13s %-24.24s %8s", r->name, r->shape, r->kind, bpw);
        if (quantized) printf(" %12llu", (unsigned long long)r->bytes_in);
        printf(" %12llu\n", (unsigned long long)r->bytes_out);
        in += r->bytes_in, out += r->bytes_out;
        if (r->bpw >= 0) wq += r->weights, bits += r->bpw * (double)r->weights;
    }
    printf("%ld tensors, %llu packed weights at %.3f bits per weight (scales and sparse parts included); ",
           (long)arrlen(rows), (unsigned long long)wq, wq ? bits / (double)wq : 0.0);
    if (quantized)
        printf("%llu -> %llu bytes (%.2fx)\n", (unsigned long long)in, (unsigned long long)out,
               out ? (double)in / (double)out : 0.0);
    else
        printf("%llu bytes of tensors\n", (unsigned long long)out);
}

static void shape_text(int ndim, const uint64_t *shape, char *s, size_t cap)
{
    s[0] = 0;
    for (int k = 0; k < ndim; k++) {
        size_t n = strlen(s);
        snprintf(s + n, cap - n, "%s%llu", k ? "x" : "", (unsigned long long)shape[k]);
    }
    if (!ndim) snprintf(s, cap, "scalar");
}

/* The jobs a method quantizes (not the embedding and head), in order. */
static job **planned(job *jobs, int *n)
{
    job **v = (job **)malloc(sizeof(job *) * ((size_t)arrlen(jobs) + 1));
    *n = 0;
    for (ptrdiff_t i = 0; v && i < arrlen(jobs); i++)
        if (jobs[i].plan_index >= 0) v[(*n)++] = &jobs[i];
    return v;
}

/* The plan of a planner method (sfmp, mixllm, mxsens). */
static int make_plan(const qopts *o, job *jobs, mpq_plan *plan)
{
    int n = 0;
    job **J = planned(jobs, &n);
    if (!J) return fail(EXIT_QUANT, "out of memory");
    mpq_status st = MPQ_ERR_ARG;
    if (o->method == M_SFMP) {
        mpq_sfmp_layer *L = (mpq_sfmp_layer *)calloc((size_t)n + 1, sizeof *L);
        for (int i = 0; L && i < n; i++) L[i].S = J[i]->stat, L[i].rows = J[i]->rows, L[i].cols = J[i]->cols;
        mpq_sfmp_desc d;
        memset(&d, 0, sizeof d);
        d.bpw = o->bpw, d.group = o->group, d.block_rows = o->block_rows, d.reorder = o->reorder;
        double lo = 0, hi = 0;
        st = L ? mpq_sfmp_bpw_range(L, n, &d, &lo, &hi) : MPQ_ERR_NOMEM;
        if (st == MPQ_OK && o->bpw < lo) { /* name the tensor whose scales and zeros cost the most */
            int worst = 0;
            double wlo = 0, l1, h1;
            for (int i = 0; i < n; i++)
                if (mpq_sfmp_bpw_range(&L[i], 1, &d, &l1, &h1) == MPQ_OK && l1 > wlo) wlo = l1, worst = i;
            const int rc = fail(EXIT_USAGE,
                                "quantize --bpw %g: the lowest budget these %d tensors allow is %.4f bits per weight "
                                "(1-bit weights and their scales and zeros at group %d); tensor '%s' alone needs %.4f",
                                o->bpw, n, lo, o->group ? o->group : 128, J[worst]->name, wlo);
            free(L);
            free(J);
            return rc;
        }
        if (st == MPQ_OK && o->bpw > hi)
            fprintf(stderr, "mpq: quantize --bpw %g: capped at %.4f bits per weight (every block at 8 bits)\n", o->bpw,
                    hi);
        if (st == MPQ_OK) st = mpq_plan_sfmp(L, n, &d, plan);
        free(L);
    } else if (o->method == M_MIXLLM) {
        mpq_mixllm_layer *L = (mpq_mixllm_layer *)calloc((size_t)n + 1, sizeof *L);
        for (int i = 0; L && i < n; i++) L[i].salience = J[i]->stat, L[i].rows = J[i]->rows, L[i].cols = J[i]->cols;
        mpq_mixllm_desc d;
        memset(&d, 0, sizeof d);
        d.fraction = o->fraction, d.group = o->group;
        st = L ? mpq_plan_mixllm(L, n, &d, plan) : MPQ_ERR_NOMEM;
        free(L);
    } else if (o->method == M_MXSENS) {
        mpq_mxsens_layer *L = (mpq_mxsens_layer *)calloc((size_t)n + 1, sizeof *L);
        for (int i = 0; L && i < n; i++)
            L[i].col_sens = J[i]->stat, L[i].layer_sens = J[i]->layer_sens, L[i].rows = J[i]->rows,
            L[i].cols = J[i]->cols;
        double lo = 0;
        st = L ? mpq_mxsens_bpw_min(L, n, &lo) : MPQ_ERR_NOMEM;
        if (st == MPQ_OK && o->bpw < lo) { /* name the tensor whose fixed blocks cost the most */
            int worst = 0;
            double wlo = 0, l1;
            for (int i = 0; i < n; i++)
                if (mpq_mxsens_bpw_min(&L[i], 1, &l1) == MPQ_OK && l1 > wlo) wlo = l1, worst = i;
            const int rc = fail(EXIT_USAGE,
                                "quantize --bpw %g: the lowest budget MXSens meets for these %d tensors is %.4f bits "
                                "per weight (each one's 32 most sensitive columns at 8 bits, the rest at 4, and the "
                                "exponents); tensor '%s' alone needs %.4f",
                                o->bpw, n, lo, J[worst]->name, wlo);
            free(L);
            free(J);
            return rc;
        }
        if (st == MPQ_OK) st = mpq_plan_mxsens(L, n, o->bpw, plan, NULL);
        free(L);
    }
    free(J);
    if (st != MPQ_OK)
        return fail(EXIT_QUANT, "%s plan over %d tensors failed: %s", method_names[o->method], n, mpq_status_str(st));
    return 0;
}

/* Statistics the method needs, for every planned job. */
static int load_stats(const qopts *o, job *jobs)
{
    mpq_io_err e;
    mpq_st_file *S = NULL, *C = NULL;
    int rc = 0;
    if (o->salience && mpq_st_open(o->salience, &S, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    if (o->calib && mpq_st_open(o->calib, &C, &e) != MPQ_OK) {
        mpq_st_close(S);
        return fail(EXIT_INPUT, "%s", e.msg);
    }
    for (ptrdiff_t i = 0; i < arrlen(jobs) && !rc; i++) {
        job *J = &jobs[i];
        if (J->plan_index < 0) continue;
        if (o->method == M_SFMP)
            rc = read_stat(S, J->name, "fisher", 1, (uint64_t)J->rows, (uint64_t)J->cols, 2, &J->stat);
        else if (o->method == M_MIXLLM)
            rc = read_stat(S, J->name, "mixllm", 1, (uint64_t)J->rows, 0, 1, &J->stat);
        else if (o->method == M_REQUANT)
            rc = read_stat(S, J->name, "pqi", 1, (uint64_t)J->rows, (uint64_t)J->cols, 2, &J->stat);
        else if (o->method == M_MXSENS) {
            J->layer_sens = 1.0f;
            if (S) {
                rc = read_stat(S, J->name, "xtx_diag", 1, (uint64_t)J->cols, 0, 1, &J->stat);
                char key[1024];
                snprintf(key, sizeof key, "%s.layer_sensitivity", J->name);
                float *ls = NULL;
                if (!rc && mpq_st_find(S, key) && !(rc = read_stat(S, key, NULL, 1, 1, 0, 1, &ls))) {
                    if (!(ls[0] >= 0.0f && ls[0] <= 1.0f))
                        rc = fail(EXIT_INPUT, "%s: tensor '%s': layer sensitivity %g is not in [0, 1]", o->salience,
                                  key, ls[0]);
                    J->layer_sens = ls[0];
                }
                free(ls);
            } else {
                float *X = NULL;
                int tokens = 0;
                rc = read_calib(C, J, &X, &tokens);
                mpq_stat h;
                if (!rc && mpq_stat_init(&h, (size_t)J->cols) == MPQ_OK) {
                    mpq_status st = mpq_hessian_diag_add(&h, X, tokens, J->cols);
                    J->stat = (float *)malloc(sizeof(float) * (size_t)J->cols);
                    if (st == MPQ_OK && J->stat) st = mpq_stat_sum(&h, J->stat);
                    if (st != MPQ_OK)
                        rc = fail(EXIT_INPUT, "%s: tensor '%s': %s", o->calib, J->name, mpq_status_str(st));
                    mpq_stat_free(&h);
                }
                free(X);
            }
        }
    }
    mpq_st_close(S);
    mpq_st_close(C);
    return rc;
}

/* ---- ReQuant -----------------------------------------------------------------

   PQI/ReQuant's dense-and-sparse split from the statistics file's PQI
   (mpq_requant_masks in mpq_model.h: how it differs from the paper). */

/* The dense part's description of a job: the options' width and group, and
   AWQ's scales and clips when the job has them. */
static void requant_desc(const qopts *o, const job *J, mpq_bitplane_desc *d)
{
    memset(d, 0, sizeof *d);
    d->rows = J->rows, d->cols = J->cols, d->group = o->group, d->block_rows = o->block_rows;
    d->uniform_bits = o->bits;
    if (o->symmetric) d->symmetric = 1u << o->bits;
    d->col_scale = J->cs, d->clip = J->clip;
}

static int requant_pack(const qopts *o, const job *J, const float *W, mpq_packed *A)
{
    mpq_rq_map M;
    memset(&M, 0, sizeof M);
    M.W = W, M.mask = J->mask;
    requant_desc(o, J, &M.d);
    const mpq_status st = mpq_requant_pack(&M, A);
    return st == MPQ_OK ? 0 : quant_fail(J->name, st, "requant pack");
}

/* Every map's mask (outliers by eq. 9, then significant weights) before
   anything is written: ReQuant ranks weights over all maps. Holds every
   quantized map's weights and PQI at once. */
static int requant_prepare(const qopts *o, mpq_source *in, job *jobs)
{
    mpq_io_err e;
    int n = 0, rc = 0;
    job **J = planned(jobs, &n);
    mpq_rq_map *M = (mpq_rq_map *)calloc((size_t)n + 1, sizeof *M);
    mpq_st_file *C = NULL;
    if (!J || !M) rc = fail(EXIT_QUANT, "out of memory");
    if (!rc && o->awq_quantizer && mpq_st_open(o->calib, &C, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
    progress pr;
    progress_start(&pr, "mpq", !o->quiet, n);
    for (int i = 0; i < n && !rc; i++) {
        job *Jb = J[i];
        const size_t nw = (size_t)Jb->rows * (size_t)Jb->cols;
        progress_show(&pr, i, Jb->name);
        float *W = (float *)malloc(sizeof(float) * nw);
        Jb->mask = (uint8_t *)calloc(nw, 1);
        M[i].W = W, M[i].pqi = Jb->stat, M[i].mask = Jb->mask;
        if (!W || !Jb->mask)
            rc = fail(EXIT_QUANT, "out of memory");
        else if (mpq_source_read_f32(in, mpq_source_at(in, Jb->index), W, nw, &e) != MPQ_OK)
            rc = fail(EXIT_INPUT, "%s", e.msg);
        if (!rc && o->awq_quantizer) {
            float *X = NULL;
            int tokens = 0;
            if ((rc = read_calib(C, Jb, &X, &tokens)) != 0) break;
            requant_desc(o, Jb, &M[i].d);
            const int g = o->group ? o->group : 128;
            Jb->cs = (float *)malloc(sizeof(float) * (size_t)Jb->cols);
            Jb->clip = (float *)malloc(sizeof(float) * (size_t)Jb->rows * (size_t)((Jb->cols + g - 1) / g));
            mpq_awq_desc a;
            memset(&a, 0, sizeof a);
            a.X = X, a.tokens = tokens;
            mpq_status st = Jb->cs && Jb->clip ? mpq_awq_search(&M[i].d, W, &a, Jb->cs, Jb->clip, NULL) : MPQ_ERR_NOMEM;
            if (st != MPQ_OK) rc = quant_fail(Jb->name, st, "AWQ search");
            free(X);
        }
        requant_desc(o, Jb, &M[i].d);
    }
    progress_end(&pr);
    double t = 0;
    size_t marked = 0, total = 0;
    mpq_status st = MPQ_OK;
    if (!rc && (st = mpq_requant_masks(M, n, o->outliers, o->significant, &t, &marked)) != MPQ_OK)
        rc = fail(EXIT_QUANT, "requant over %d tensors failed: %s", n, mpq_status_str(st));
    for (int i = 0; J && i < n; i++) total += (size_t)J[i]->rows * (size_t)J[i]->cols;
    if (!rc && !o->quiet)
        fprintf(stderr, "mpq: requant: t = %.2f (eq. 9); %zu weights (%.3f %%) in sparse parts\n", t, marked,
                100.0 * (double)marked / (double)(total ? total : 1));
    for (int i = 0; M && i < n; i++) free((void *)M[i].W);
    free(M), free(J);
    mpq_st_close(C);
    return rc;
}

/* Every row block has one width across all its groups (act-order moves
   columns between groups). */
static int widths_uniform_along_columns(const mpq_bitplane_desc *d)
{
    if (!d->bits) return 1;
    const int group = d->group ? d->group : (d->format == MPQ_FORMAT_MXINT ? MPQ_MX_BLOCK : 128);
    const int br = d->block_rows ? d->block_rows : 16, ng = (d->cols + group - 1) / group;
    for (int b = 0; b < (d->rows + br - 1) / br; b++)
        for (int g = 1; g < ng; g++)
            if (d->bits[(size_t)b * ng + g] != d->bits[(size_t)b * ng]) return 0;
    return 1;
}

/* Quantize one weight: the description comes from the plan, or from the
   options (rtn, awq: then col_scale and clip are computed here); an
   embedding or head goes to round-to-nearest at embed_bits. */
static int quantize_one(const qopts *o, const job *J, const mpq_plan *plan, mpq_st_file *C, mpq_st_file *Hf,
                        const float *W, mpq_packed *A)
{
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    mpq_status st;
    float *cs = NULL, *clip = NULL, *X = NULL, *H = NULL;
    uint32_t *order = NULL;
    int rc = 0;
    if (J->plan_index < 0) {
        d.rows = J->rows, d.cols = J->cols, d.uniform_bits = o->embed_bits;
        if ((st = mpq_pack_alloc(&d, W, A)) != MPQ_OK) return quant_fail(J->name, st, "pack");
        return 0;
    }
    if (plan) {
        if ((st = mpq_plan_desc(plan, J->plan_index, &d)) != MPQ_OK) return quant_fail(J->name, st, "plan");
    } else {
        d.rows = J->rows, d.cols = J->cols, d.group = o->group, d.block_rows = o->block_rows;
        d.uniform_bits = o->bits, d.format = o->format;
        if (o->symmetric) d.symmetric = 1u << o->bits;
    }
    if (o->method == M_REQUANT) return requant_pack(o, J, W, A);
    if (o->gptq && (rc = read_stat(Hf, J->name, "xtx", 0, (uint64_t)J->cols, (uint64_t)J->cols, 2, &H)) != 0) return rc;
    if (o->gptq && o->act_order) { /* GPTQ's act-order as the packed column order */
        if (d.p_col || !widths_uniform_along_columns(&d)) {
            free(H);
            return fail(EXIT_USAGE,
                        "%s: --act-order needs widths that do not vary along the columns and no column "
                        "permutation of the plan (uniform widths or mixllm)",
                        J->name);
        }
        order = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)J->cols);
        st = order ? mpq_gptq_act_order(H, J->cols, order) : MPQ_ERR_NOMEM;
        if (st != MPQ_OK) rc = quant_fail(J->name, st, "act-order");
        d.p_col = order;
    }
    if (!rc && (o->method == M_AWQ || o->awq_quantizer)) {
        int tokens = 0;
        if ((rc = read_calib(C, J, &X, &tokens)) != 0) {
            free(H), free(order);
            return rc;
        }
        const int group = d.group ? d.group : 128;
        cs = (float *)malloc(sizeof(float) * (size_t)J->cols);
        clip = (float *)malloc(sizeof(float) * (size_t)J->rows * (size_t)((J->cols + group - 1) / group));
        mpq_awq_desc a;
        memset(&a, 0, sizeof a);
        a.X = X, a.tokens = tokens;
        st = cs && clip ? mpq_awq_search(&d, W, &a, cs, clip, NULL) : MPQ_ERR_NOMEM;
        if (st != MPQ_OK) rc = quant_fail(J->name, st, "AWQ search");
        d.col_scale = cs, d.clip = clip;
    }
    if (!rc && o->gptq) {
        mpq_gptq_desc g;
        memset(&g, 0, sizeof g);
        g.H = H, g.static_groups = o->static_groups;
        g.damp = o->damp < 0 ? 0.0 : (o->damp == 0 ? -1.0 : o->damp); /* the library: 0 default, negative none */
        if ((st = mpq_gptq_alloc(&d, W, &g, A, NULL)) != MPQ_OK)
            rc = quant_fail(J->name, st,
                            st == MPQ_ERR_NOTPD ? "GPTQ (its X^T X plus the dampening is not positive "
                                                  "definite: raise --damp)"
                                                : "GPTQ");
    } else if (!rc && (st = mpq_pack_alloc(&d, W, A)) != MPQ_OK)
        rc = quant_fail(J->name, st, "pack");
    free(cs);
    free(clip);
    free(X);
    free(H);
    free(order);
    return rc;
}

/* The description a model's output carries: config.json, tokenizer.json and
   tokenizer_config.json in __metadata__. The tokenizer is read and written
   anew (a GGUF vocabulary becomes a tokenizer.json); one mpq cannot read is
   copied as its text when there is one, else left out with a warning. */
static int model_meta(const qopts *o, mpq_source *in, const mpq_llm_config *cfg, mpq_st_writer *w)
{
    mpq_io_err e;
    char *json = NULL;
    int rc = 0;
    if (mpq_llm_config_json(cfg, &json) != MPQ_OK) return fail(EXIT_OUTPUT, "out of memory");
    if (mpq_st_write_meta(w, "config.json", json, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    free(json);
    mpq_tokenizer *tok = NULL;
    if (!rc && mpq_tokenizer_read(in, &tok, &e) == MPQ_OK) {
        char *tj = NULL, *tc = NULL;
        if (mpq_tokenizer_to_json(tok, &tj) != MPQ_OK || mpq_tokenizer_config_json(tok, &tc) != MPQ_OK)
            rc = fail(EXIT_OUTPUT, "out of memory");
        if (!rc &&
            (mpq_st_write_meta(w, "tokenizer.json", tj, &e) != MPQ_OK ||
             mpq_st_write_meta(w, "tokenizer_config.json", tc, &e) != MPQ_OK))
            rc = fail(EXIT_OUTPUT, "%s", e.msg);
        free(tj);
        free(tc);
        mpq_tokenizer_free(tok);
    } else if (!rc) {
        const char *why = e.msg;
        static const char *const names[] = {"tokenizer.json", "tokenizer_config.json"};
        int copied = 0;
        for (int k = 0; k < 2 && !rc; k++) {
            char *t = NULL;
            if (mpq_source_text(in, names[k], &t, NULL, &e) == MPQ_OK && t) {
                if (mpq_st_write_meta(w, names[k], t, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
                copied += k == 0;
            }
            free(t);
        }
        if (!rc && !o->quiet)
            fprintf(stderr, "mpq: warning: %s; %s\n", why,
                    copied ? "its tokenizer.json is copied as it is" : "the output carries no tokenizer");
    }
    return rc;
}

/* Copies a tensor that is not quantized: safetensors bytes as they are,
   GGUF values as F32 (F16 and BF16 as themselves). */
static int copy_tensor(mpq_source *in, const mpq_source_tensor *t, mpq_st_writer *w, row *r)
{
    mpq_io_err e;
    const mpq_st_tensor *st = NULL;
    mpq_st_file *f = mpq_source_st(in, t, &st);
    int rc = 0;
    if (f) {
        const size_t bytes = (size_t)(st->end - st->begin);
        void *buf = malloc(bytes + 1);
        if (!buf)
            rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", mpq_source_path(in), t->name);
        else if (mpq_st_read(f, st, buf, bytes, &e) != MPQ_OK)
            rc = fail(EXIT_INPUT, "%s", e.msg);
        else if (mpq_st_write(w, t->name, st->dtype, st->ndim, st->shape, buf, bytes, &e) != MPQ_OK)
            rc = fail(EXIT_OUTPUT, "%s", e.msg);
        free(buf);
        snprintf(r->kind, sizeof r->kind, "%s (kept)", mpq_dtype_name(st->dtype));
        r->bytes_out = bytes;
        return rc;
    }
    if (!t->is_float)
        return fail(EXIT_INPUT,
                    "%s: tensor '%s': type %s cannot be read (mpq converts F32, F16, BF16, F64, Q8_0, "
                    "Q4_0, Q4_1, Q5_0 and Q5_1)",
                    mpq_source_path(in), t->name, t->type);
    const mpq_dtype dt = !strcmp(t->type, "F16") ? MPQ_DT_F16 : !strcmp(t->type, "BF16") ? MPQ_DT_BF16 : MPQ_DT_F32;
    float *v = (float *)malloc(sizeof(float) * (size_t)t->numel + 1);
    if (!v)
        rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", mpq_source_path(in), t->name);
    else if (mpq_source_read_f32(in, t, v, (size_t)t->numel, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s", e.msg);
    else if (mpq_st_write_f32(w, t->name, dt, t->ndim, t->shape, v, &e) != MPQ_OK)
        rc = fail(EXIT_OUTPUT, "%s", e.msg);
    free(v);
    snprintf(r->kind, sizeof r->kind, "%s (from %s)", mpq_dtype_name(dt), t->type);
    r->bytes_out = t->numel * mpq_dtype_size(dt);
    return rc;
}

/* An embedding or output head by its name, in a file that is not a model. */
static int embedding_name(const char *name)
{
    static const char *const globs[] = {"*embed*", "*tok_emb*", "*wte*", "*lm_head*", "output.weight"};
    for (size_t i = 0; i < sizeof globs / sizeof globs[0]; i++)
        if (fnmatch(globs[i], name, 0) == 0) return 1;
    return 0;
}

/* Which tensors are quantized, and how. */
static int select_jobs(const qopts *o, mpq_source *in, int model, job **jobs)
{
    int rc = 0, np = 0;
    for (int i = 0; i < mpq_source_count(in) && !rc; i++) {
        const mpq_source_tensor *t = mpq_source_at(in, i);
        int layer, lin, role = 0;
        if (model) {
            role = mpq_llm_tensor_role(t->name, &layer, &lin);
            if (role == 0 || t->packed || (role == 2 && o->embed_bits == 0)) continue;
        } else if (t->ndim != 2 || !t->is_float || t->numel == 0) {
            continue;
        } else if (mpq_llm_tensor_role(t->name, &layer, &lin) == 2 || embedding_name(t->name)) {
            if (o->embed_bits == 0) continue;
            role = 2;
        }
        if ((arrlen(o->include) && !glob_any(o->include, t->name)) || glob_any(o->exclude, t->name)) continue;
        if (t->ndim != 2 || !t->is_float || t->numel == 0) {
            rc = fail(EXIT_INPUT, "%s: tensor '%s': a %s tensor with %d dimensions cannot be quantized",
                      mpq_source_path(in), t->name, t->type, t->ndim);
            break;
        }
        if (t->shape[0] > INT_MAX || t->shape[1] > INT_MAX) {
            rc = fail(EXIT_INPUT, "%s: tensor '%s': %llu x %llu is too large to quantize", mpq_source_path(in), t->name,
                      (unsigned long long)t->shape[0], (unsigned long long)t->shape[1]);
            break;
        }
        job J;
        memset(&J, 0, sizeof J);
        J.index = i, J.name = t->name, J.rows = (int)t->shape[0], J.cols = (int)t->shape[1];
        J.plan_index = role == 2 ? -1 : np++;
        arrput(*jobs, J);
    }
    return rc;
}

static int quantize_run(const qopts *o)
{
    mpq_io_err e;
    mpq_source *in = NULL;
    mpq_st_file *C = NULL, *Hf = NULL;
    mpq_st_writer *w = NULL;
    job *jobs = NULL;
    row *rows = NULL;
    mpq_plan plan;
    mpq_llm_config cfg;
    int have_plan = 0, rc = 0, model = 0;
    memset(&plan, 0, sizeof plan);
    if (mpq_source_open(o->in, &in, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    /* a model: anything but a safetensors file without a config.json */
    if (mpq_source_kind_of(in) != MPQ_SOURCE_SAFETENSORS) {
        model = 1;
    } else {
        char *t = NULL;
        if (mpq_source_text(in, "config.json", &t, NULL, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
        model = t != NULL;
        free(t);
    }
    if (!rc && model && mpq_llm_config_read(in, &cfg, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
    if (!rc) rc = select_jobs(o, in, model, &jobs);
    int nplanned = 0;
    for (ptrdiff_t i = 0; i < arrlen(jobs); i++) nplanned += jobs[i].plan_index >= 0;
    if (!rc && nplanned == 0 && !o->quiet)
        fprintf(stderr, "mpq: %s: no tensor selected for %s\n", o->in, method_names[o->method]);
    if (!rc && nplanned) rc = load_stats(o, jobs);
    if (!rc && nplanned && o->method == M_REQUANT) rc = requant_prepare(o, in, jobs);
    if (!rc && nplanned && o->method >= M_SFMP && o->method <= M_MXSENS) {
        rc = make_plan(o, jobs, &plan);
        have_plan = !rc;
    }
    if (!rc && (o->method == M_AWQ || (o->awq_quantizer && o->method != M_REQUANT)) &&
        mpq_st_open(o->calib, &C, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s", e.msg);
    if (!rc && o->gptq && nplanned && mpq_st_open(o->hessian, &Hf, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
    if (!rc && mpq_st_writer_open(o->out, &w, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    if (!rc && model) {
        if (!cfg.vocab) /* from the embedding when the config does not say */
            for (ptrdiff_t i = 0; i < arrlen(jobs); i++)
                if (!strcmp(jobs[i].name, "model.embed_tokens.weight")) cfg.vocab = jobs[i].rows;
        rc = model_meta(o, in, &cfg, w);
    }
    if (mpq_source_kind_of(in) == MPQ_SOURCE_SAFETENSORS) { /* the input's own metadata */
        mpq_st_file *f = mpq_source_st(in, mpq_source_at(in, 0), NULL);
        for (int i = 0; !rc && f && i < mpq_st_meta_count(f); i++) {
            const char *k, *v;
            mpq_st_meta_at(f, i, &k, &v);
            if (!strncmp(k, "mpq.", 4) ||
                (model &&
                 (!strcmp(k, "config.json") || !strcmp(k, "tokenizer.json") || !strcmp(k, "tokenizer_config.json"))))
                continue;
            if (mpq_st_write_meta(w, k, v, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
        }
    }
    progress p;
    progress_start(&p, "mpq", !o->quiet, mpq_source_count(in));
    ptrdiff_t ji = 0;
    for (int i = 0; !rc && i < mpq_source_count(in); i++) {
        const mpq_source_tensor *t = mpq_source_at(in, i);
        progress_show(&p, i, t->name);
        row r;
        memset(&r, 0, sizeof r);
        r.name = t->name, r.bpw = -1, r.bytes_in = t->bytes;
        shape_text(t->ndim, t->shape, r.shape, sizeof r.shape);
        if (ji < arrlen(jobs) && jobs[ji].index == i) {
            const job *J = &jobs[ji];
            float *W = (float *)malloc(sizeof(float) * (size_t)t->numel);
            mpq_packed A;
            memset(&A, 0, sizeof A);
            if (!W)
                rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", o->in, t->name);
            else if (mpq_source_read_f32(in, t, W, (size_t)t->numel, &e) != MPQ_OK)
                rc = fail(EXIT_INPUT, "%s", e.msg);
            if (!rc) rc = quantize_one(o, J, have_plan ? &plan : NULL, C, Hf, W, &A);
            if (!rc && mpq_st_write_packed(w, t->name, &A, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
            if (!rc) row_packed(&r, &A, J->plan_index < 0 ? " (embedding)" : "");
            mpq_packed_free(&A);
            free(W);
            ji++;
        } else if (t->packed) { /* already packed: validated, then carried with its metadata */
            mpq_packed A;
            if (mpq_source_read_packed(in, t, &A, &e) != MPQ_OK)
                rc = fail(EXIT_INPUT, "%s", e.msg);
            else {
                if (mpq_st_write_packed(w, t->name, &A, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
                row_packed(&r, &A, " (kept)");
                mpq_packed_free(&A);
            }
        } else {
            rc = copy_tensor(in, t, w, &r);
        }
        if (!rc) arrput(rows, r);
    }
    progress_end(&p);
    if (w) {
        if (rc)
            mpq_st_writer_abort(w);
        else if (mpq_st_writer_close(w, &e) != MPQ_OK)
            rc = fail(EXIT_OUTPUT, "%s", e.msg);
    }
    if (!rc && !o->quiet) {
        printf("%s -> %s (%s)\n", o->in, o->out, method_names[o->method]);
        print_rows(rows, 1);
    }
    for (ptrdiff_t i = 0; i < arrlen(jobs); i++)
        free(jobs[i].stat), free(jobs[i].mask), free(jobs[i].cs), free(jobs[i].clip);
    arrfree(jobs);
    arrfree(rows);
    if (have_plan) mpq_plan_free(&plan);
    mpq_st_close(C);
    mpq_st_close(Hf);
    mpq_source_close(in);
    return rc;
}

static int cmd_quantize(int argc, char **argv)
{
    qopts o;
    memset(&o, 0, sizeof o);
    o.bits = 4, o.fraction = 0.1, o.format = MPQ_FORMAT_BITPLANE, o.bpw = -1, o.embed_bits = 0;
    o.outliers = 0.0025, o.significant = 0.0025, o.damp = -1; /* -1: the library's default */
    args a = {argc, 0, argv, "quantize"};
    const char *pos[2] = {0}, *quantizer = NULL;
    int npos = 0, bad = 0, rc = 0;
    for (a.i = 1; a.i < argc && !bad; a.i++) {
        const char *v = NULL;
        if (opt(&a, "--help", NULL, &bad) || opt(&a, "-h", NULL, &bad)) {
            quantize_help();
            goto out;
        } else if (opt(&a, "--method", &v, &bad)) {
            if (bad) break;
            o.method = -1;
            for (int k = 0; k < M_COUNT; k++)
                if (strcmp(v, method_names[k]) == 0) o.method = k;
            if (o.method < 0)
                bad = fail(EXIT_USAGE, "quantize --method: '%s' is not rtn, awq, gptq, sfmp, mixllm, mxsens or requant",
                           v);
        } else if (opt(&a, "--outliers", &v, &bad)) {
            bad = bad || !parse_double("quantize", "--outliers", v, 0.0, 0.5, &o.outliers);
        } else if (opt(&a, "--significant", &v, &bad)) {
            bad = bad || !parse_double("quantize", "--significant", v, 0.0, 0.5, &o.significant);
        } else if (opt(&a, "--bits", &v, &bad)) {
            bad = bad || !parse_int("quantize", "--bits", v, 1, 8, &o.bits);
        } else if (opt(&a, "--format", &v, &bad)) {
            if (bad) break;
            if (strcmp(v, "bitplane") == 0)
                o.format = MPQ_FORMAT_BITPLANE;
            else if (strcmp(v, "mxint") == 0)
                o.format = MPQ_FORMAT_MXINT;
            else
                bad = fail(EXIT_USAGE, "quantize --format: '%s' is not bitplane or mxint", v);
        } else if (opt(&a, "--symmetric", NULL, &bad)) {
            o.symmetric = 1;
        } else if (opt(&a, "--bpw", &v, &bad)) {
            bad = bad || !parse_double("quantize", "--bpw", v, 0.0, 64.0, &o.bpw);
        } else if (opt(&a, "--fraction", &v, &bad)) {
            bad = bad || !parse_double("quantize", "--fraction", v, 0.0, 1.0, &o.fraction);
        } else if (opt(&a, "--group", &v, &bad)) {
            bad = bad || !parse_int("quantize", "--group", v, 8, 1 << 20, &o.group);
            if (!bad && o.group % 8)
                bad = fail(EXIT_USAGE, "quantize --group %d: a group is a multiple of 8 columns (%d or %d, say)",
                           o.group, o.group / 8 * 8, o.group / 8 * 8 + 8);
        } else if (opt(&a, "--block-rows", &v, &bad)) {
            bad = bad || !parse_int("quantize", "--block-rows", v, 1, 1 << 20, &o.block_rows);
        } else if (opt(&a, "--reorder", &v, &bad)) {
            if (bad) break;
            const char *names[] = {"none", "rows", "cols", "both"};
            o.reorder = -1;
            for (int k = 0; k < 4; k++)
                if (strcmp(v, names[k]) == 0) o.reorder = k;
            if (o.reorder < 0) bad = fail(EXIT_USAGE, "quantize --reorder: '%s' is not none, rows, cols or both", v);
        } else if (opt(&a, "--salience", &v, &bad)) {
            o.salience = v;
        } else if (opt(&a, "--stats", &v, &bad)) {
            o.salience = o.calib = v;
        } else if (opt(&a, "--quantizer", &v, &bad)) {
            if (bad) break;
            if (!strcmp(v, "rtn") || !strcmp(v, "awq") || !strcmp(v, "gptq") || !strcmp(v, "awq+gptq"))
                quantizer = v;
            else
                bad = fail(EXIT_USAGE, "quantize --quantizer: '%s' is not rtn, awq, gptq or awq+gptq", v);
        } else if (opt(&a, "--hessian", &v, &bad)) {
            o.hessian = v;
        } else if (opt(&a, "--act-order", NULL, &bad)) {
            o.act_order = 1;
        } else if (opt(&a, "--static-groups", NULL, &bad)) {
            o.static_groups = 1;
        } else if (opt(&a, "--damp", &v, &bad)) {
            bad = bad || !parse_double("quantize", "--damp", v, 0.0, 1e6, &o.damp);
        } else if (opt(&a, "--calib", &v, &bad)) {
            o.calib = v;
        } else if (opt(&a, "--embed-bits", &v, &bad)) {
            bad = bad || !parse_int("quantize", "--embed-bits", v, 0, 8, &o.embed_bits);
        } else if (opt(&a, "--include", &v, &bad)) {
            if (!bad) arrput(o.include, v);
        } else if (opt(&a, "--exclude", &v, &bad)) {
            if (!bad) arrput(o.exclude, v);
        } else if (opt(&a, "--threads", &v, &bad)) {
            bad = bad || !parse_int("quantize", "--threads", v, 1, 4096, &o.threads);
        } else if (opt(&a, "--quiet", NULL, &bad)) {
            o.quiet = 1;
        } else if (argv[a.i][0] == '-' && argv[a.i][1]) {
            bad = fail(EXIT_USAGE, "quantize: unknown option '%s' (see mpq quantize --help)", argv[a.i]);
        } else if (npos < 2) {
            pos[npos++] = argv[a.i];
        } else {
            bad = fail(EXIT_USAGE, "quantize: more than two files given");
        }
    }
    if (bad) {
        rc = EXIT_USAGE;
        goto out;
    }
    if (npos != 2) {
        rc = fail(EXIT_USAGE, "quantize: needs IN OUT.safetensors (see mpq quantize --help)");
        goto out;
    }
    o.in = pos[0], o.out = pos[1];
    if ((o.method == M_SFMP || o.method == M_MXSENS) && o.bpw < 0) {
        rc = fail(EXIT_USAGE, "quantize --method %s: needs --bpw", method_names[o.method]);
        goto out;
    }
    if ((o.method == M_SFMP || o.method == M_MIXLLM || o.method == M_REQUANT) && !o.salience) {
        rc = fail(EXIT_USAGE, "quantize --method %s: needs --salience FILE", method_names[o.method]);
        goto out;
    }
    if ((o.method == M_AWQ || (o.method == M_MXSENS && !o.salience)) && !o.calib) {
        rc = fail(EXIT_USAGE, "quantize --method %s: needs --calib FILE%s", method_names[o.method],
                  o.method == M_MXSENS ? " (or --salience FILE)" : "");
        goto out;
    }
    if (quantizer) {
        const int planner = o.method == M_SFMP || o.method == M_MIXLLM || o.method == M_MXSENS;
        const int ok = planner || (o.method == M_REQUANT && (!strcmp(quantizer, "rtn") || !strcmp(quantizer, "awq"))) ||
            (o.method == M_GPTQ && strstr(quantizer, "gptq"));
        if (!ok) {
            rc = fail(EXIT_USAGE,
                      "quantize --quantizer %s: not for --method %s (sfmp, mixllm, mxsens: rtn, awq, gptq "
                      "or awq+gptq; requant: rtn or awq; gptq: gptq or awq+gptq)",
                      quantizer, method_names[o.method]);
            goto out;
        }
        o.awq_quantizer = !strncmp(quantizer, "awq", 3);
        o.gptq = strstr(quantizer, "gptq") != NULL;
    }
    if (o.method == M_GPTQ) o.gptq = 1;
    if (o.gptq && !o.hessian) o.hessian = o.salience && o.salience == o.calib ? o.salience : NULL;
    if (o.gptq && !o.hessian) {
        rc = fail(EXIT_USAGE, "quantize: GPTQ needs --hessian FILE (mpq calibrate --stats xtx) or --stats FILE");
        goto out;
    }
    if ((o.act_order || o.static_groups || o.damp >= 0) && !o.gptq) {
        rc = fail(EXIT_USAGE,
                  "quantize: --act-order, --static-groups and --damp are for GPTQ (--method gptq or "
                  "--quantizer gptq)");
        goto out;
    }
    if (o.awq_quantizer && !o.calib) {
        rc = fail(EXIT_USAGE, "quantize --quantizer %s: needs --calib FILE or --stats FILE", quantizer);
        goto out;
    }
    if ((o.method == M_AWQ || o.method == M_REQUANT) && o.format == MPQ_FORMAT_MXINT) {
        rc = fail(EXIT_USAGE, "quantize: --format mxint is for rtn (mxsens plans MXINT itself)");
        goto out;
    }
    if (o.format == MPQ_FORMAT_MXINT && o.bits < 2) {
        rc = fail(EXIT_USAGE, "quantize --format mxint: --bits must be 2..8");
        goto out;
    }
    if (o.method == M_MXSENS || o.format == MPQ_FORMAT_MXINT) {
        if (o.group && o.group != MPQ_MX_BLOCK) {
            rc = fail(EXIT_USAGE, "quantize: MXINT blocks are %d columns; --group %d does not apply", MPQ_MX_BLOCK,
                      o.group);
            goto out;
        }
    }
#ifdef _OPENMP
    if (o.threads) omp_set_num_threads(o.threads);
#endif
    rc = quantize_run(&o);
out:
    arrfree(o.include);
    arrfree(o.exclude);
    return rc;
}

/* ---------------------------------------------------------------------------
   inspect
   ------------------------------------------------------------------------ */

static int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            puts("usage: mpq inspect FILE.safetensors\n"
                 "\n"
                 "Lists every tensor: how it is stored (dtype, or packed format and bit widths\n"
                 "with the share of weights at each), shape, bits per weight (packed: scales and\n"
                 "sparse part included) and bytes. Every packed matrix is read and validated; the\n"
                 "exit code is 2 when any tensor or the file is malformed.");
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1]) return fail(EXIT_USAGE, "inspect: unknown option '%s'", argv[i]);
        if (path) return fail(EXIT_USAGE, "inspect: one file at a time");
        path = argv[i];
    }
    if (!path) return fail(EXIT_USAGE, "inspect: needs FILE.safetensors (see mpq inspect --help)");
    mpq_io_err e;
    mpq_st_file *f;
    if (mpq_st_open(path, &f, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    printf("%s: %llu bytes, %d tensors\n", path, (unsigned long long)mpq_st_file_bytes(f), mpq_st_count(f));
    for (int i = 0; i < mpq_st_meta_count(f); i++) {
        const char *k, *v;
        mpq_st_meta_at(f, i, &k, &v);
        if (strncmp(k, "mpq.", 4) != 0) printf("  metadata %s = %.120s\n", k, v);
    }
    row *rows = NULL;
    int rc = 0;
    for (int i = 0; i < mpq_st_count(f); i++) {
        const mpq_st_tensor *t = mpq_st_at(f, i);
        row r;
        memset(&r, 0, sizeof r);
        r.name = t->name, r.bpw = -1, r.bytes_in = r.bytes_out = t->end - t->begin;
        shape_text(t->ndim, t->shape, r.shape, sizeof r.shape);
        snprintf(r.kind, sizeof r.kind, "%s", mpq_dtype_name(t->dtype));
        if (t->packed) {
            mpq_packed A;
            if (mpq_st_read_packed(f, t->name, &A, &e) != MPQ_OK) {
                rc = fail(EXIT_INPUT, "%s", e.msg);
                snprintf(r.kind, sizeof r.kind, "INVALID packed");
            } else {
                row_packed(&r, &A, "");
                snprintf(r.shape, sizeof r.shape, "%dx%d", A.rows, A.cols);
                mpq_packed_free(&A);
            }
        }
        arrput(rows, r);
    }
    print_rows(rows, 0);
    arrfree(rows);
    mpq_st_close(f);
    return rc;
}

/* ---------------------------------------------------------------------------
   dequantize: packed matrices back to floats, for checking in other tools */

static int cmd_dequantize(int argc, char **argv)
{
    args a = {argc, 0, argv, "dequantize"};
    const char *in = NULL, *out = NULL, *v;
    mpq_dtype dt = MPQ_DT_F32;
    int skip = 0, bad = 0, quiet = 0;
    while (!bad && ++a.i < argc) {
        if (strcmp(argv[a.i], "--help") == 0 || strcmp(argv[a.i], "-h") == 0) {
            puts("usage: mpq dequantize [--dtype f32|f16|bf16] [--skip-planes K] [--quiet] IN.safetensors "
                 "OUT.safetensors\n"
                 "\n"
                 "Writes every packed matrix of IN as a float tensor of the same name, shape [rows, cols]\n"
                 "in original row and column order, with its column scales and sparse part applied:\n"
                 "bit for bit what mpq_packed_dequantize gives (then rounded to nearest even for f16\n"
                 "and bf16). --skip-planes K drops the K lowest bit planes of every group, as the\n"
                 "products do (at least one plane stays). Other tensors and IN's metadata (config,\n"
                 "tokenizer) are copied as they are. Default dtype: f32 (exact).");
            return 0;
        } else if (opt(&a, "--dtype", &v, &bad)) {
            if (bad) break;
            if (!strcmp(v, "f32"))
                dt = MPQ_DT_F32;
            else if (!strcmp(v, "f16"))
                dt = MPQ_DT_F16;
            else if (!strcmp(v, "bf16"))
                dt = MPQ_DT_BF16;
            else
                bad = fail(EXIT_USAGE, "dequantize --dtype: '%s' is not f32, f16 or bf16", v);
        } else if (opt(&a, "--skip-planes", &v, &bad)) {
            bad = bad || !parse_int("dequantize", "--skip-planes", v, 0, 7, &skip);
        } else if (opt(&a, "--quiet", NULL, &bad)) {
            quiet = 1;
        } else if (argv[a.i][0] == '-' && argv[a.i][1]) {
            bad = fail(EXIT_USAGE, "dequantize: unknown option '%s'", argv[a.i]);
        } else if (!in) {
            in = argv[a.i];
        } else if (!out) {
            out = argv[a.i];
        } else {
            bad = fail(EXIT_USAGE, "dequantize: one input and one output");
        }
    }
    if (bad) return EXIT_USAGE;
    if (!in || !out) return fail(EXIT_USAGE, "dequantize: needs IN.safetensors OUT.safetensors (see --help)");
    mpq_io_err e;
    mpq_st_file *f;
    mpq_st_writer *w = NULL;
    if (mpq_st_open(in, &f, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    int rc = 0;
    if (mpq_st_writer_open(out, &w, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    for (int i = 0; !rc && i < mpq_st_meta_count(f); i++) {
        const char *k, *val;
        mpq_st_meta_at(f, i, &k, &val);
        if (strncmp(k, "mpq.", 4) != 0 && mpq_st_write_meta(w, k, val, &e) != MPQ_OK)
            rc = fail(EXIT_OUTPUT, "%s", e.msg);
    }
    row *rows = NULL;
    for (int i = 0; !rc && i < mpq_st_count(f); i++) {
        const mpq_st_tensor *t = mpq_st_at(f, i);
        row r;
        memset(&r, 0, sizeof r);
        r.name = t->name, r.bpw = -1, r.bytes_in = t->end - t->begin;
        if (t->packed) {
            mpq_packed A;
            if (mpq_st_read_packed(f, t->name, &A, &e) != MPQ_OK) {
                rc = fail(EXIT_INPUT, "%s", e.msg);
                break;
            }
            const uint64_t sh[2] = {(uint64_t)A.rows, (uint64_t)A.cols};
            float *W = (float *)malloc(sizeof(float) * (size_t)A.rows * (size_t)A.cols);
            mpq_status st = W ? mpq_packed_dequantize(&A, skip, W) : MPQ_ERR_NOMEM;
            if (st != MPQ_OK)
                rc = fail(EXIT_INPUT, "%s: tensor '%s': dequantize: %s", in, t->name, mpq_status_str(st));
            else if (mpq_st_write_f32(w, t->name, dt, 2, sh, W, &e) != MPQ_OK)
                rc = fail(EXIT_OUTPUT, "%s", e.msg);
            char wt[32];
            widths_text(&A, wt, sizeof wt);
            snprintf(r.kind, sizeof r.kind, "%s (from %s %s)", mpq_dtype_name(dt),
                     A.format == MPQ_FORMAT_MXINT ? "mxint" : "bitplane", wt);
            shape_text(2, sh, r.shape, sizeof r.shape);
            r.bpw = mpq_packed_bpw(&A, 2), r.weights = (uint64_t)A.rows * (uint64_t)A.cols; /* what was read */
            r.bytes_out = r.weights * mpq_dtype_size(dt);
            free(W);
            mpq_packed_free(&A);
        } else {
            const size_t bytes = (size_t)(t->end - t->begin);
            void *buf = malloc(bytes + 1);
            if (!buf)
                rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", in, t->name);
            else if (mpq_st_read(f, t, buf, bytes, &e) != MPQ_OK)
                rc = fail(EXIT_INPUT, "%s", e.msg);
            else if (mpq_st_write(w, t->name, t->dtype, t->ndim, t->shape, buf, bytes, &e) != MPQ_OK)
                rc = fail(EXIT_OUTPUT, "%s", e.msg);
            free(buf);
            shape_text(t->ndim, t->shape, r.shape, sizeof r.shape);
            snprintf(r.kind, sizeof r.kind, "%s (kept)", mpq_dtype_name(t->dtype));
            r.bytes_out = bytes;
        }
        arrput(rows, r);
    }
    if (!rc && mpq_st_writer_close(w, &e) != MPQ_OK)
        rc = fail(EXIT_OUTPUT, "%s", e.msg);
    else if (rc)
        mpq_st_writer_abort(w);
    if (!rc && !quiet) {
        printf("%s -> %s (dequantized%s)\n", in, out, skip ? ", lowest planes skipped" : "");
        print_rows(rows, 1);
    }
    arrfree(rows);
    mpq_st_close(f);
    return rc;
}

/* ---------------------------------------------------------------------------
   bench
   ------------------------------------------------------------------------ */

#ifdef MPQ_HAVE_CUDA
/* Median microseconds of the GPU product, x and y in device memory; -1 when
   there is no GPU (or anything fails: the reason goes to stderr). */
static double gpu_us(const mpq_packed *A, const float *x, int batch, int reps)
{
    if (mpq_cuda_device_count() == 0) return -1;
    mpq_backend be;
    mpq_status st = mpq_cuda_backend(0, &be);
    if (st != MPQ_OK) return fail(0, "bench: GPU: %s", mpq_status_str(st)), -1;
    void *h = NULL, *dx = NULL, *dy = NULL;
    double us = -1;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaStream_t s = (cudaStream_t)mpq_cuda_stream(&be);
    double *ts = (double *)malloc(sizeof(double) * (size_t)reps);
    if (ts && be.upload(be.ctx, A, &h) == MPQ_OK &&
        cudaMalloc(&dx, sizeof(float) * (size_t)batch * A->cols) == cudaSuccess &&
        cudaMalloc(&dy, sizeof(float) * (size_t)batch * A->rows) == cudaSuccess &&
        cudaMemcpy(dx, x, sizeof(float) * (size_t)batch * A->cols, cudaMemcpyHostToDevice) == cudaSuccess &&
        cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
        mpq_gemv_opts o;
        memset(&o, 0, sizeof o);
        int ok = 1;
        for (int r = -3; r < reps && ok; r++) {
            cudaEventRecord(e0, s);
            ok = be.gemv(be.ctx, h, (const float *)dx, (float *)dy, batch, &o) == MPQ_OK;
            cudaEventRecord(e1, s);
            float ms = 0;
            ok = ok && cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
            if (r >= 0) ts[r] = ms * 1e3;
        }
        if (ok) us = bench_median(ts, reps);
    }
    if (us < 0) fail(0, "bench: GPU run failed");
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(dx);
    cudaFree(dy);
    if (h) be.release(be.ctx, h);
    mpq_cuda_backend_destroy(&be);
    free(ts);
    return us;
}
#endif

/* Median microseconds of mpq_gemv (bench_gemv_us); -1 on failure. */
static double cpu_us(const mpq_packed *A, const float *x, float *y, int batch, int threads, int reps)
{
    mpq_gemv_opts o;
    memset(&o, 0, sizeof o);
    o.threads = threads;
    double us = -1;
    return bench_gemv_us(A, x, y, &batch, 1, &o, (size_t)256 << 20, reps, &us) == MPQ_OK ? us : -1;
}

static int cmd_bench(int argc, char **argv)
{
    args a = {argc, 0, argv, "bench"};
    const char *path = NULL, *only = NULL;
    int batch = 1, threads = bench_max_threads(), reps = 30, bad = 0;
    for (a.i = 1; a.i < argc && !bad; a.i++) {
        const char *v = NULL;
        if (opt(&a, "--help", NULL, &bad) || opt(&a, "-h", NULL, &bad)) {
            puts("usage: mpq bench [options] FILE.safetensors\n"
                 "\n"
                 "Times y = W x for every packed matrix of FILE (median of --reps calls, rotating\n"
                 "over copies so that the caches do not hold the matrix) and prints, measured in\n"
                 "the same run: GB/s of the packed bytes and their share of this machine's read\n"
                 "bandwidth, a plain float32 GEMV of the dequantized matrix, and the GPU (device\n"
                 "pointers, CUDA events) when this build has CUDA and a GPU is present.\n"
                 "\n"
                 "  --tensor NAME   only this tensor\n"
                 "  --batch B       vectors per call, 1..64 (default 1)\n"
                 "  --threads T     CPU threads (default all)\n"
                 "  --reps R        timed calls (default 30)");
            return 0;
        } else if (opt(&a, "--tensor", &v, &bad)) {
            only = v;
        } else if (opt(&a, "--batch", &v, &bad)) {
            bad = bad || !parse_int("bench", "--batch", v, 1, 64, &batch);
        } else if (opt(&a, "--threads", &v, &bad)) {
            bad = bad || !parse_int("bench", "--threads", v, 1, 4096, &threads);
        } else if (opt(&a, "--reps", &v, &bad)) {
            bad = bad || !parse_int("bench", "--reps", v, 1, 100000, &reps);
        } else if (argv[a.i][0] == '-' && argv[a.i][1]) {
            bad = fail(EXIT_USAGE, "bench: unknown option '%s'", argv[a.i]);
        } else if (path) {
            bad = fail(EXIT_USAGE, "bench: one file at a time");
        } else {
            path = argv[a.i];
        }
    }
    if (bad) return EXIT_USAGE;
    if (!path) return fail(EXIT_USAGE, "bench: needs FILE.safetensors (see mpq bench --help)");
    mpq_io_err e;
    mpq_st_file *f;
    if (mpq_st_open(path, &f, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    if (only && (!mpq_st_find(f, only) || !mpq_st_find(f, only)->packed)) {
        fail(EXIT_INPUT, "%s: tensor '%s': no packed matrix of that name", path, only);
        mpq_st_close(f);
        return EXIT_INPUT;
    }
    const bench_load load0 = bench_load_now();
    double worst_f32 = 0.0; /* the float32 GEMV's read rate over the bandwidth, matrices far beyond the caches */
    const double bw = bench_read_bandwidth(threads, 1);
    printf("%s: batch %d, %d threads, %d reps; read bandwidth %.1f GB/s\n", path, batch, threads, reps, bw * 1e-9);
    printf("%-36s %-11s %6s %10s %9s %8s %6s %9s %7s %9s\n", "tensor", "shape", "bpw", "bytes", "mpq us", "GB/s", "%bw",
           "f32 us", "f32/mpq", "gpu us");
    int rc = 0, count = 0;
    for (int i = 0; i < mpq_st_count(f) && !rc; i++) {
        const mpq_st_tensor *t = mpq_st_at(f, i);
        if (!t->packed || (only && strcmp(only, t->name) != 0)) continue;
        mpq_packed A;
        if (mpq_st_read_packed(f, t->name, &A, &e) != MPQ_OK) {
            rc = fail(EXIT_INPUT, "%s", e.msg);
            break;
        }
        const size_t xn = (size_t)batch * A.cols, yn = (size_t)batch * A.rows;
        float *x = (float *)malloc(sizeof(float) * xn), *y = (float *)malloc(sizeof(float) * yn);
        float *W = (float *)malloc(sizeof(float) * (size_t)A.rows * A.cols);
        uint64_t s = 0x9E3779B97F4A7C15ull;
        for (size_t k = 0; x && k < xn; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[k] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        if (!x || !y || !W || mpq_packed_dequantize(&A, 0, W) != MPQ_OK) {
            rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", path, t->name);
        } else {
            const double us = cpu_us(&A, x, y, batch, threads, reps);
            double f32 = 0;
            for (int b = 0; b < batch; b++)
                f32 += bench_f32_gemv_us(W, x + (size_t)b * A.cols, y, A.rows, A.cols, threads, (size_t)256 << 20, 1);
            double g = -1;
#ifdef MPQ_HAVE_CUDA
            g = gpu_us(&A, x, batch, reps);
#endif
            char shape[32], gs[32];
            snprintf(shape, sizeof shape, "%dx%d", A.rows, A.cols);
            if (g >= 0)
                snprintf(gs, sizeof gs, "%.1f", g);
            else
                snprintf(gs, sizeof gs, "-");
            const double gbs = (double)A.bytes / (us * 1e-6) * 1e-9;
            const double f32_of_bw = 4.0 * A.rows * (double)A.cols * batch / (f32 * 1e-6) / bw;
            if (4.0 * A.rows * (double)A.cols >= 64e6 && (worst_f32 == 0.0 || f32_of_bw < worst_f32))
                worst_f32 = f32_of_bw;
            printf("%-36.36s %-11s %6.3f %10zu %9.1f %8.1f %5.0f%% %9.1f %6.2fx %9s\n", t->name, shape,
                   mpq_packed_bpw(&A, 2), A.bytes, us, gbs, 100.0 * gbs * 1e9 / bw, f32, f32 / us, gs);
            count++;
        }
        free(x);
        free(y);
        free(W);
        mpq_packed_free(&A);
    }
    if (!rc && !count) printf("(no packed matrices in %s)\n", path);
    if (!rc && count) bench_verdict(load0, bench_load_now(), worst_f32);
    mpq_st_close(f);
    return rc;
}

/* ---------------------------------------------------------------------------
   main
   ------------------------------------------------------------------------ */

static void main_help(void)
{
    printf("mpq %d.%d.%d - mixed-precision quantization of LLM weights\n"
           "\n"
           "usage: mpq <command> [options] ...\n"
           "\n"
           "  quantize   quantize a model (GGUF, Hugging Face directory, safetensors)\n"
           "  calibrate  statistics for the methods from a model's forward and backward passes\n"
           "  eval       perplexity of a model on a text file, as llama-perplexity computes it\n"
           "  run        generate text from a prompt (greedy or sampled; PMPD schedules)\n"
           "  schedule   PMPD's static schedule search, or its learned scheduler, on calibration text\n"
           "  gen-eval   generation under PMPD schedules: bits per token, quality under a reference\n"
           "  speed      prompt and decode tokens per second, as llama-bench measures them\n"
           "  inspect    list a file's tensors: format, widths, bits per weight, bytes\n"
           "  bench      time the packed matrices of a file (CPU, and GPU when present)\n"
           "  dequantize packed matrices back to F32, F16 or BF16 tensors, for other tools\n"
           "\n"
           "'mpq <command> --help' describes each. Exit codes: 0 ok, 1 usage, 2 bad input\n"
           "file, 3 output not written, 4 quantization failed.\n",
           MPQ_VERSION_MAJOR, MPQ_VERSION_MINOR, MPQ_VERSION_PATCH);
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        main_help();
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("mpq %d.%d.%d\n", MPQ_VERSION_MAJOR, MPQ_VERSION_MINOR, MPQ_VERSION_PATCH);
        return 0;
    }
    if (strcmp(argv[1], "quantize") == 0) return cmd_quantize(argc - 1, argv + 1);
    if (strcmp(argv[1], "inspect") == 0) return cmd_inspect(argc - 1, argv + 1);
    if (strcmp(argv[1], "bench") == 0) return cmd_bench(argc - 1, argv + 1);
    if (strcmp(argv[1], "dequantize") == 0) return cmd_dequantize(argc - 1, argv + 1);
    if (strcmp(argv[1], "eval") == 0) return cmd_eval(argc - 1, argv + 1);
    if (strcmp(argv[1], "run") == 0) return cmd_run(argc - 1, argv + 1);
    if (strcmp(argv[1], "speed") == 0) return cmd_speed(argc - 1, argv + 1);
    if (strcmp(argv[1], "calibrate") == 0) return cmd_calibrate(argc - 1, argv + 1);
    if (strcmp(argv[1], "schedule") == 0) return cmd_schedule(argc - 1, argv + 1);
    if (strcmp(argv[1], "gen-eval") == 0) return cmd_gen_eval(argc - 1, argv + 1);
    return fail(EXIT_USAGE,
                "unknown command '%s' (quantize, calibrate, schedule, gen-eval, eval, run, speed, inspect, bench, "
                "dequantize; "
                "see mpq --help)",
                argv[1]);
}
