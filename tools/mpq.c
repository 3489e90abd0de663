/* mpq - quantize, inspect and benchmark safetensors checkpoints.

     mpq quantize [options] IN.safetensors OUT.safetensors
     mpq inspect FILE.safetensors
     mpq bench [options] FILE.safetensors
     mpq <command> --help

   Exit codes (for scripts): 0 success; 1 usage (unknown option, missing or
   bad value); 2 an input file is missing, malformed or does not fit (the
   message names the file and the tensor); 3 the output could not be
   written; 4 quantization failed (non-finite weights, a budget no plan can
   meet, ...). */
#define _XOPEN_SOURCE 700
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_io.h"
#ifdef MPQ_HAVE_CUDA
#include "mpq_cuda.h"
#include <cuda_runtime_api.h>
#endif
#include "bench_util.h"

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

enum { EXIT_USAGE = 1, EXIT_INPUT = 2, EXIT_OUTPUT = 3, EXIT_QUANT = 4 };

static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("mpq: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

/* The exit code for a status from the library (not from a file). */
static int quant_fail(const char *name, mpq_status st, const char *what)
{
    return fail(EXIT_QUANT, "tensor '%s': %s: %s", name, what, mpq_status_str(st));
}

/* ---------------------------------------------------------------------------
   option parsing: --name value or --name=value
   ------------------------------------------------------------------------ */

typedef struct args {
    int argc, i;
    char **argv;
    const char *cmd;
} args;

/* Is argv[i] the option `name`? Sets *val for options that take a value. */
static int opt(args *a, const char *name, const char **val, int *bad)
{
    const char *s = a->argv[a->i];
    const size_t n = strlen(name);
    if (strncmp(s, name, n) != 0) return 0;
    if (!val) return s[n] == 0;
    if (s[n] == '=') {
        *val = s + n + 1;
        return 1;
    }
    if (s[n] != 0) return 0;
    if (a->i + 1 >= a->argc) {
        fail(EXIT_USAGE, "%s %s: needs a value", a->cmd, name);
        *bad = 1;
        return 1;
    }
    *val = a->argv[++a->i];
    return 1;
}

static int parse_int(const char *cmd, const char *name, const char *v, int lo, int hi, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi)
        return fail(EXIT_USAGE, "%s %s: '%s' is not an integer in %d..%d", cmd, name, v, lo, hi), 0;
    *out = (int)x;
    return 1;
}

static int parse_double(const char *cmd, const char *name, const char *v, double lo, double hi, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x >= lo && x <= hi))
        return fail(EXIT_USAGE, "%s %s: '%s' is not a number in %g..%g", cmd, name, v, lo, hi), 0;
    *out = x;
    return 1;
}

static int is_float_dtype(mpq_dtype t)
{
    return t == MPQ_DT_F32 || t == MPQ_DT_F16 || t == MPQ_DT_BF16 || t == MPQ_DT_F64;
}

/* ---------------------------------------------------------------------------
   progress bar (stderr, only on a terminal)
   ------------------------------------------------------------------------ */

typedef struct progress {
    int on, total;
} progress;

static void progress_show(progress *p, int done, const char *what)
{
    if (!p->on) return;
    const int w = 30, fill = p->total ? done * w / p->total : w;
    fprintf(stderr, "\r\033[K[");
    for (int k = 0; k < w; k++) fputc(k < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %d/%d %.50s", done, p->total, what ? what : "");
    fflush(stderr);
}

static void progress_end(progress *p)
{
    if (p->on) fprintf(stderr, "\r\033[K");
}

/* ---------------------------------------------------------------------------
   quantize
   ------------------------------------------------------------------------ */

enum { M_RTN, M_AWQ, M_SFMP, M_MIXLLM, M_MXSENS };
static const char *const method_names[] = {"rtn", "awq", "sfmp", "mixllm", "mxsens"};

typedef struct qopts {
    int method, bits, group, block_rows, reorder, symmetric, format, threads, quiet;
    double bpw, fraction;
    const char *salience, *calib, *in, *out;
    const char **include, **exclude; /* stb_ds arrays of globs */
} qopts;

typedef struct job {
    int index;          /* in the input file */
    const char *name;
    int rows, cols;
    float *stat;        /* salience or column sensitivity (planners) */
    float layer_sens;
} job;

typedef struct row {    /* one line of the summary table */
    const char *name;
    char shape[48], kind[80];
    double bpw;         /* -1 for tensors kept as they are */
    uint64_t bytes_in, bytes_out, weights;
} row;

static void quantize_help(void)
{
    puts("usage: mpq quantize [options] IN.safetensors OUT.safetensors\n"
         "\n"
         "Quantizes every 2-D float tensor (F32, F16, BF16, F64) of IN whose name matches\n"
         "--include and not --exclude into an mpq packed matrix (a U8 tensor described by\n"
         "__metadata__, see mpq_io.h); every other tensor is copied unchanged.\n"
         "\n"
         "  --method M         rtn | awq | sfmp | mixllm | mxsens (default rtn)\n"
         "  --bits B           rtn, awq: width 1..8 (default 4)\n"
         "  --format F         rtn: bitplane | mxint (mxint: mantissa bits 2..8, group 32)\n"
         "  --symmetric        rtn, awq: symmetric groups\n"
         "  --bpw X            sfmp, mxsens: budget in bits per weight, scales included\n"
         "  --fraction F       mixllm: fraction of output channels at 8 bits (default 0.1)\n"
         "  --group G          columns per group, a multiple of 8 (default 128; mxsens 32)\n"
         "  --block-rows R     rows per bit-width block (default 16)\n"
         "  --reorder R        sfmp: none | rows | cols | both (default none)\n"
         "  --salience FILE    safetensors with one tensor per quantized weight, same name:\n"
         "                       sfmp    rows x cols   Fisher diagonal\n"
         "                       mixllm  rows          output-channel salience\n"
         "                       mxsens  cols          diag(X^T X); optional scalar\n"
         "                                             '<name>.layer_sensitivity' in [0, 1]\n"
         "  --calib FILE       safetensors with activations tokens x cols per weight name:\n"
         "                     awq (required), mxsens (diag(X^T X) when no --salience)\n"
         "  --include GLOB     quantize only matching names (repeatable; default all)\n"
         "  --exclude GLOB     never quantize matching names (repeatable)\n"
         "  --threads T        OpenMP threads (default all)\n"
         "  --quiet            no progress bar and no table\n"
         "\n"
         "Exit codes: 0 ok, 1 usage, 2 bad input file, 3 output not written, 4 quantization failed.");
}

static int glob_any(const char **globs, const char *name)
{
    for (ptrdiff_t i = 0; i < arrlen(globs); i++)
        if (fnmatch(globs[i], name, 0) == 0) return 1;
    return 0;
}

/* Reads a float tensor `name` of `file` with exactly the given shape
   (ndim2 = 0: a vector of d0; scalars: d0 = 1 accepts [] and [1]). */
static int read_stat(mpq_st_file *f, const char *name, uint64_t d0, uint64_t d1, int ndim, float **out)
{
    mpq_io_err e;
    const mpq_st_tensor *t = mpq_st_find(f, name);
    if (!t) return fail(EXIT_INPUT, "%s: tensor '%s': not found", mpq_st_path(f), name);
    if (!is_float_dtype(t->dtype))
        return fail(EXIT_INPUT, "%s: tensor '%s': dtype %s, need a float type", mpq_st_path(f), name,
                    mpq_dtype_name(t->dtype));
    int ok = ndim == 2 ? (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1)
                       : (t->numel == d0 && (t->ndim == 1 || (d0 == 1 && t->ndim == 0)));
    if (!ok) {
        if (ndim == 2)
            return fail(EXIT_INPUT, "%s: tensor '%s': shape does not match the weight (need %llu x %llu)",
                        mpq_st_path(f), name, (unsigned long long)d0, (unsigned long long)d1);
        return fail(EXIT_INPUT, "%s: tensor '%s': shape does not match the weight (need [%llu])", mpq_st_path(f),
                    name, (unsigned long long)d0);
    }
    float *v = (float *)malloc(sizeof(float) * (size_t)t->numel + 1);
    if (!v) return fail(EXIT_INPUT, "out of memory");
    if (mpq_st_read_f32(f, t, v, (size_t)t->numel, &e) != MPQ_OK) {
        free(v);
        return fail(EXIT_INPUT, "%s", e.msg);
    }
    *out = v;
    return 0;
}

/* Calibration activations of a weight: tokens x cols. */
static int read_calib(mpq_st_file *f, const job *J, float **X, int *tokens)
{
    const mpq_st_tensor *t = mpq_st_find(f, J->name);
    if (!t) return fail(EXIT_INPUT, "%s: tensor '%s': not found (activations for it)", mpq_st_path(f), J->name);
    if (t->ndim != 2 || t->shape[1] != (uint64_t)J->cols || t->shape[0] < 1 || t->shape[0] > INT_MAX)
        return fail(EXIT_INPUT, "%s: tensor '%s': activations must be tokens x %d", mpq_st_path(f), J->name, J->cols);
    *tokens = (int)t->shape[0];
    return read_stat(f, J->name, t->shape[0], t->shape[1], 2, X);
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
            if (w[k] == total) snprintf(s + n, cap - n, "%s%d", n ? " " : "", k);
            else snprintf(s + n, cap - n, "%s%d:%.0f%%", n ? " " : "", k, 100.0 * w[k] / total);
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
        if (r->bpw >= 0) snprintf(bpw, sizeof bpw, "%.3f", r->bpw);
        else snprintf(bpw, sizeof bpw, "-");
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

static void shape_text(const mpq_st_tensor *t, char *s, size_t cap)
{
    s[0] = 0;
    for (int k = 0; k < t->ndim; k++) {
        size_t n = strlen(s);
        snprintf(s + n, cap - n, "%s%llu", k ? "x" : "", (unsigned long long)t->shape[k]);
    }
    if (!t->ndim) snprintf(s, cap, "scalar");
}

/* The plan of a planner method (sfmp, mixllm, mxsens). */
static int make_plan(const qopts *o, job *jobs, mpq_plan *plan)
{
    const int n = (int)arrlen(jobs);
    mpq_status st = MPQ_ERR_ARG;
    if (o->method == M_SFMP) {
        mpq_sfmp_layer *L = (mpq_sfmp_layer *)calloc((size_t)n + 1, sizeof *L);
        for (int i = 0; i < n; i++) L[i].S = jobs[i].stat, L[i].rows = jobs[i].rows, L[i].cols = jobs[i].cols;
        mpq_sfmp_desc d;
        memset(&d, 0, sizeof d);
        d.bpw = o->bpw, d.group = o->group, d.block_rows = o->block_rows, d.reorder = o->reorder;
        st = mpq_plan_sfmp(L, n, &d, plan);
        free(L);
    } else if (o->method == M_MIXLLM) {
        mpq_mixllm_layer *L = (mpq_mixllm_layer *)calloc((size_t)n + 1, sizeof *L);
        for (int i = 0; i < n; i++) L[i].salience = jobs[i].stat, L[i].rows = jobs[i].rows, L[i].cols = jobs[i].cols;
        mpq_mixllm_desc d;
        memset(&d, 0, sizeof d);
        d.fraction = o->fraction, d.group = o->group;
        st = mpq_plan_mixllm(L, n, &d, plan);
        free(L);
    } else if (o->method == M_MXSENS) {
        mpq_mxsens_layer *L = (mpq_mxsens_layer *)calloc((size_t)n + 1, sizeof *L);
        for (int i = 0; i < n; i++)
            L[i].col_sens = jobs[i].stat, L[i].layer_sens = jobs[i].layer_sens, L[i].rows = jobs[i].rows,
            L[i].cols = jobs[i].cols;
        st = mpq_plan_mxsens(L, n, o->bpw, plan, NULL);
        free(L);
    }
    if (st != MPQ_OK)
        return fail(EXIT_QUANT, "%s plan over %d tensors failed: %s", method_names[o->method], n, mpq_status_str(st));
    return 0;
}

/* Statistics the method needs, for every job. */
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
        if (o->method == M_SFMP) rc = read_stat(S, J->name, (uint64_t)J->rows, (uint64_t)J->cols, 2, &J->stat);
        else if (o->method == M_MIXLLM) rc = read_stat(S, J->name, (uint64_t)J->rows, 0, 1, &J->stat);
        else if (o->method == M_MXSENS) {
            J->layer_sens = 1.0f;
            if (S) {
                rc = read_stat(S, J->name, (uint64_t)J->cols, 0, 1, &J->stat);
                char key[1024];
                snprintf(key, sizeof key, "%s.layer_sensitivity", J->name);
                float *ls = NULL;
                if (!rc && mpq_st_find(S, key) && !(rc = read_stat(S, key, 1, 0, 1, &ls))) {
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
                    if (st != MPQ_OK) rc = fail(EXIT_INPUT, "%s: tensor '%s': %s", o->calib, J->name, mpq_status_str(st));
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

/* Quantize one weight: the description comes from the plan, or from the
   options (rtn, awq: then col_scale and clip are computed here). */
static int quantize_one(const qopts *o, const job *J, const mpq_plan *plan, int pi, mpq_st_file *C, const float *W,
                        mpq_packed *A)
{
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    mpq_status st;
    float *cs = NULL, *clip = NULL, *X = NULL;
    int rc = 0;
    if (plan) {
        if ((st = mpq_plan_desc(plan, pi, &d)) != MPQ_OK) return quant_fail(J->name, st, "plan");
    } else {
        d.rows = J->rows, d.cols = J->cols, d.group = o->group, d.block_rows = o->block_rows;
        d.uniform_bits = o->bits, d.format = o->format;
        if (o->symmetric) d.symmetric = 1u << o->bits;
    }
    if (o->method == M_AWQ) {
        int tokens = 0;
        if ((rc = read_calib(C, J, &X, &tokens)) != 0) return rc;
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
    if (!rc && (st = mpq_pack_alloc(&d, W, A)) != MPQ_OK) rc = quant_fail(J->name, st, "pack");
    free(cs);
    free(clip);
    free(X);
    return rc;
}

static int quantize_run(const qopts *o)
{
    mpq_io_err e;
    mpq_st_file *in = NULL, *C = NULL;
    mpq_st_writer *w = NULL;
    job *jobs = NULL;
    row *rows = NULL;
    mpq_plan plan;
    int have_plan = 0, rc = 0;
    memset(&plan, 0, sizeof plan);
    if (mpq_st_open(o->in, &in, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    for (int i = 0; i < mpq_st_count(in) && !rc; i++) {
        const mpq_st_tensor *t = mpq_st_at(in, i);
        if (t->ndim != 2 || !is_float_dtype(t->dtype) || t->numel == 0) continue;
        if ((arrlen(o->include) && !glob_any(o->include, t->name)) || glob_any(o->exclude, t->name)) continue;
        if (t->shape[0] > INT_MAX || t->shape[1] > INT_MAX) {
            rc = fail(EXIT_INPUT, "%s: tensor '%s': %llu x %llu is too large to quantize", o->in, t->name,
                      (unsigned long long)t->shape[0], (unsigned long long)t->shape[1]);
            break;
        }
        job J;
        memset(&J, 0, sizeof J);
        J.index = i, J.name = t->name, J.rows = (int)t->shape[0], J.cols = (int)t->shape[1];
        arrput(jobs, J);
    }
    if (!rc && arrlen(jobs) == 0 && !o->quiet) fprintf(stderr, "mpq: %s: no tensor selected; copying the file\n", o->in);
    if (!rc && arrlen(jobs)) rc = load_stats(o, jobs);
    if (!rc && arrlen(jobs) && o->method >= M_SFMP) {
        rc = make_plan(o, jobs, &plan);
        have_plan = !rc;
    }
    if (!rc && o->method == M_AWQ && mpq_st_open(o->calib, &C, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
    if (!rc && mpq_st_writer_open(o->out, &w, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    for (int i = 0; !rc && i < mpq_st_meta_count(in); i++) {
        const char *k, *v;
        mpq_st_meta_at(in, i, &k, &v);
        if (strncmp(k, "mpq.", 4) != 0 && mpq_st_write_meta(w, k, v, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    }
    progress p = {!o->quiet && isatty(2), mpq_st_count(in)};
    ptrdiff_t ji = 0;
    for (int i = 0; !rc && i < mpq_st_count(in); i++) {
        const mpq_st_tensor *t = mpq_st_at(in, i);
        progress_show(&p, i, t->name);
        row r;
        memset(&r, 0, sizeof r);
        r.name = t->name, r.bpw = -1, r.bytes_in = t->end - t->begin;
        shape_text(t, r.shape, sizeof r.shape);
        if (ji < arrlen(jobs) && jobs[ji].index == i) {
            const job *J = &jobs[ji];
            float *W = (float *)malloc(sizeof(float) * (size_t)t->numel);
            mpq_packed A;
            memset(&A, 0, sizeof A);
            if (!W) rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", o->in, t->name);
            else if (mpq_st_read_f32(in, t, W, (size_t)t->numel, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
            if (!rc) rc = quantize_one(o, J, have_plan ? &plan : NULL, (int)ji, C, W, &A);
            if (!rc && mpq_st_write_packed(w, t->name, &A, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
            if (!rc) row_packed(&r, &A, "");
            mpq_packed_free(&A);
            free(W);
            ji++;
        } else if (t->packed) { /* already packed: validated, then carried with its metadata */
            mpq_packed A;
            if (mpq_st_read_packed(in, t->name, &A, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
            else {
                if (mpq_st_write_packed(w, t->name, &A, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
                row_packed(&r, &A, " (kept)");
                mpq_packed_free(&A);
            }
        } else {
            const size_t bytes = (size_t)(t->end - t->begin);
            void *buf = malloc(bytes + 1);
            if (!buf) rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", o->in, t->name);
            else if (mpq_st_read(in, t, buf, bytes, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
            else if (mpq_st_write(w, t->name, t->dtype, t->ndim, t->shape, buf, bytes, &e) != MPQ_OK)
                rc = fail(EXIT_OUTPUT, "%s", e.msg);
            free(buf);
            snprintf(r.kind, sizeof r.kind, "%s (kept)", mpq_dtype_name(t->dtype));
            r.bytes_out = bytes;
        }
        if (!rc) arrput(rows, r);
    }
    progress_end(&p);
    if (w) {
        if (rc) mpq_st_writer_abort(w);
        else if (mpq_st_writer_close(w, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    }
    if (!rc && !o->quiet) {
        printf("%s -> %s (%s)\n", o->in, o->out, method_names[o->method]);
        print_rows(rows, 1);
    }
    for (ptrdiff_t i = 0; i < arrlen(jobs); i++) free(jobs[i].stat);
    arrfree(jobs);
    arrfree(rows);
    if (have_plan) mpq_plan_free(&plan);
    mpq_st_close(C);
    mpq_st_close(in);
    return rc;
}

static int cmd_quantize(int argc, char **argv)
{
    qopts o;
    memset(&o, 0, sizeof o);
    o.bits = 4, o.fraction = 0.1, o.format = MPQ_FORMAT_BITPLANE, o.bpw = -1;
    args a = {argc, 0, argv, "quantize"};
    const char *pos[2] = {0};
    int npos = 0, bad = 0, rc = 0;
    for (a.i = 1; a.i < argc && !bad; a.i++) {
        const char *v = NULL;
        if (opt(&a, "--help", NULL, &bad) || opt(&a, "-h", NULL, &bad)) {
            quantize_help();
            goto out;
        } else if (opt(&a, "--method", &v, &bad)) {
            if (bad) break;
            o.method = -1;
            for (int k = 0; k < 5; k++)
                if (strcmp(v, method_names[k]) == 0) o.method = k;
            if (o.method < 0) bad = fail(EXIT_USAGE, "quantize --method: '%s' is not rtn, awq, sfmp, mixllm or mxsens", v);
        } else if (opt(&a, "--bits", &v, &bad)) {
            bad = bad || !parse_int("quantize", "--bits", v, 1, 8, &o.bits);
        } else if (opt(&a, "--format", &v, &bad)) {
            if (bad) break;
            if (strcmp(v, "bitplane") == 0) o.format = MPQ_FORMAT_BITPLANE;
            else if (strcmp(v, "mxint") == 0) o.format = MPQ_FORMAT_MXINT;
            else bad = fail(EXIT_USAGE, "quantize --format: '%s' is not bitplane or mxint", v);
        } else if (opt(&a, "--symmetric", NULL, &bad)) {
            o.symmetric = 1;
        } else if (opt(&a, "--bpw", &v, &bad)) {
            bad = bad || !parse_double("quantize", "--bpw", v, 0.0, 64.0, &o.bpw);
        } else if (opt(&a, "--fraction", &v, &bad)) {
            bad = bad || !parse_double("quantize", "--fraction", v, 0.0, 1.0, &o.fraction);
        } else if (opt(&a, "--group", &v, &bad)) {
            bad = bad || !parse_int("quantize", "--group", v, 8, 1 << 20, &o.group);
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
        } else if (opt(&a, "--calib", &v, &bad)) {
            o.calib = v;
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
        rc = fail(EXIT_USAGE, "quantize: needs IN.safetensors OUT.safetensors (see mpq quantize --help)");
        goto out;
    }
    o.in = pos[0], o.out = pos[1];
    if ((o.method == M_SFMP || o.method == M_MXSENS) && o.bpw < 0) {
        rc = fail(EXIT_USAGE, "quantize --method %s: needs --bpw", method_names[o.method]);
        goto out;
    }
    if ((o.method == M_SFMP || o.method == M_MIXLLM) && !o.salience) {
        rc = fail(EXIT_USAGE, "quantize --method %s: needs --salience FILE", method_names[o.method]);
        goto out;
    }
    if ((o.method == M_AWQ || (o.method == M_MXSENS && !o.salience)) && !o.calib) {
        rc = fail(EXIT_USAGE, "quantize --method %s: needs --calib FILE%s", method_names[o.method],
                  o.method == M_MXSENS ? " (or --salience FILE)" : "");
        goto out;
    }
    if (o.method == M_AWQ && o.format == MPQ_FORMAT_MXINT) {
        rc = fail(EXIT_USAGE, "quantize: --format mxint is for rtn (mxsens plans MXINT itself)");
        goto out;
    }
    if (o.format == MPQ_FORMAT_MXINT && o.bits < 2) {
        rc = fail(EXIT_USAGE, "quantize --format mxint: --bits must be 2..8");
        goto out;
    }
    if (o.method == M_MXSENS || o.format == MPQ_FORMAT_MXINT) {
        if (o.group && o.group != MPQ_MX_BLOCK) {
            rc = fail(EXIT_USAGE, "quantize: MXINT blocks are %d columns; --group %d does not apply", MPQ_MX_BLOCK, o.group);
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
        shape_text(t, r.shape, sizeof r.shape);
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
    if (ts && be.upload(be.ctx, A, &h) == MPQ_OK && cudaMalloc(&dx, sizeof(float) * (size_t)batch * A->cols) == cudaSuccess &&
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

/* Median microseconds of mpq_gemv, rotating over copies of the matrix so
   that the caches do not hold the one being read. */
static double cpu_us(const mpq_packed *A, const float *x, float *y, int batch, int threads, int reps)
{
    const size_t rotate = (size_t)256 << 20;
    int nc = (int)(rotate / A->bytes) + 2;
    if (nc > 64) nc = 64;
    mpq_packed *C = (mpq_packed *)calloc((size_t)nc, sizeof *C);
    const size_t wb = mpq_gemv_work_bytes(A, batch);
    void *work = mpq_aligned_alloc(wb);
    double *ts = (double *)malloc(sizeof(double) * (size_t)reps), us = -1;
    int made = 0;
    for (; C && made < nc; made++) {
        void *b = mpq_aligned_alloc(A->bytes);
        if (!b) break;
        memcpy(b, A->buf, A->bytes);
        if (mpq_packed_open(b, A->bytes, &C[made]) != MPQ_OK) {
            mpq_aligned_free(b);
            break;
        }
        C[made].owned = 1;
    }
    if (made && work && ts) {
        mpq_gemv_opts o;
        memset(&o, 0, sizeof o);
        o.threads = threads;
        int ok = 1;
        for (int r = -made; r < reps && ok; r++) {
            const double t0 = bench_now();
            ok = mpq_gemv(&C[(r + made) % made], x, y, batch, &o, work, wb) == MPQ_OK;
            if (r >= 0) ts[r] = (bench_now() - t0) * 1e6;
        }
        if (ok) us = bench_median(ts, reps);
    }
    for (int c = 0; c < made; c++) mpq_packed_free(&C[c]);
    free(C);
    free(ts);
    mpq_aligned_free(work);
    return us;
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
    const double bw = bench_read_bandwidth(threads, 1);
    printf("%s: batch %d, %d threads, %d reps; read bandwidth %.1f GB/s\n", path, batch, threads, reps, bw * 1e-9);
    printf("%-36s %-11s %6s %10s %9s %8s %6s %9s %7s %9s\n", "tensor", "shape", "bpw", "bytes", "mpq us", "GB/s",
           "%bw", "f32 us", "f32/mpq", "gpu us");
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
            if (g >= 0) snprintf(gs, sizeof gs, "%.1f", g);
            else snprintf(gs, sizeof gs, "-");
            const double gbs = (double)A.bytes / (us * 1e-6) * 1e-9;
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
           "  quantize   quantize the 2-D float tensors of a safetensors checkpoint\n"
           "  inspect    list a file's tensors: format, widths, bits per weight, bytes\n"
           "  bench      time the packed matrices of a file (CPU, and GPU when present)\n"
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
    return fail(EXIT_USAGE, "unknown command '%s' (quantize, inspect, bench; see mpq --help)", argv[1]);
}
