/* mpq - quantize, calibrate, evaluate, run, inspect and benchmark models.

   The commands are the rows of `commands` below; each one's options are a
   table of its own (tools/cli.h), from which its parsing and its --help
   come: `mpq --help` lists the commands, `mpq <command> --help` describes
   one. The model commands are in mpq_llm.c and schedule.c, quantize in
   quantize.c; inspect, dequantize and bench here.

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
#ifdef MPQ_HAVE_CUDA
#include "mpq_cuda.h"
#include <cuda_runtime_api.h>
#endif
#include "bench_util.h"
#include "cli.h"
#include "table.h"
#include "tool.h"

#define STB_DS_IMPLEMENTATION
#include <stb/stb_ds.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------
   inspect
   ------------------------------------------------------------------------ */

typedef struct inspect_args {
    int unused;
} inspect_args;

static const cli_opt inspect_opts[] = {{NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL}};
static const cli_spec inspect_spec = {
    "inspect",
    "FILE.safetensors",
    "Lists every tensor: how it is stored (dtype, or packed format and bit widths\n"
    "with the share of weights at each), shape, bits per weight (packed: scales and\n"
    "sparse part included) and bytes, then the plan of `quantize --method auto` (each\n"
    "map's widths and predicted KL divergence) when the file records one. Every packed\n"
    "matrix is read and validated; the exit code is 2 when any tensor or the file is\n"
    "malformed.",
    {{inspect_opts, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}},
    1,
    1,
    NULL};

/* The plan `mpq quantize --method auto` recorded ("mpq_auto"): its target,
   size and predicted KLD, and each map's widths and prediction. */
static void print_auto_plan(const char *meta)
{
    cJSON *o = meta ? cJSON_Parse(meta) : NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "target"), *b = cJSON_GetObjectItemCaseSensitive(o, "bpw"),
                *k = cJSON_GetObjectItemCaseSensitive(o, "predicted_kld"),
                *m = cJSON_GetObjectItemCaseSensitive(o, "measure"),
                *maps = cJSON_GetObjectItemCaseSensitive(o, "maps");
    if (cJSON_IsString(t) && cJSON_IsNumber(b) && cJSON_IsNumber(k) && cJSON_IsString(m) && cJSON_IsObject(maps)) {
        printf("auto plan (quantize --method auto %s --measure %s): %.4f bits per weight (weights and scales), "
               "predicted KLD %.6g\n",
               t->valuestring, m->valuestring, b->valuedouble, k->valuedouble);
        const cJSON *x;
        cJSON_ArrayForEach(x, maps)
        {
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(x, "widths"),
                        *p = cJSON_GetObjectItemCaseSensitive(x, "predicted_kld");
            if (x->string && cJSON_IsString(w) && cJSON_IsNumber(p))
                printf("  %-40s %-24s predicted KLD %.6g\n", x->string, w->valuestring, p->valuedouble);
        }
    } else if (meta) {
        printf("  metadata mpq_auto = %.120s (not a plan mpq quantize wrote)\n", meta);
    }
    cJSON_Delete(o);
}

int cmd_inspect(int argc, char **argv)
{
    inspect_args a;
    const char *path;
    int npos = 0, rc = cli_parse(&inspect_spec, argc, argv, &a, sizeof a, &path, &npos, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    mpq_io_err e;
    mpq_st_file *f;
    if (mpq_st_open(path, &f, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    printf("%s: %llu bytes, %d tensors\n", path, (unsigned long long)mpq_st_file_bytes(f), mpq_st_count(f));
    for (int i = 0; i < mpq_st_meta_count(f); i++) {
        const char *k, *v;
        mpq_st_meta_at(f, i, &k, &v);
        if (strncmp(k, "mpq.", 4) != 0 && strcmp(k, "mpq_auto") != 0) printf("  metadata %s = %.120s\n", k, v);
    }
    row *rows = NULL;
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
    print_auto_plan(mpq_st_meta(f, "mpq_auto"));
    mpq_st_close(f);
    return rc;
}

/* ---------------------------------------------------------------------------
   dequantize: packed matrices back to floats, for checking in other tools
   ------------------------------------------------------------------------ */

typedef struct dequantize_args {
    int dtype, quiet;
    llm_opts lo; /* --skip-planes */
} dequantize_args;

static const mpq_dtype dequantize_dtypes[] = {MPQ_DT_F32, MPQ_DT_F16, MPQ_DT_BF16};
static const cli_opt dequantize_opts[] = {
    {"--dtype", CLI_CHOICE, CLI_AT(dequantize_args, dtype), "T", 0, 0, "f32|f16|bf16", NULL, "f32",
     "the float type written (f32 is exact; f16 and bf16 round to nearest even)"},
    {"--quiet", CLI_FLAG, CLI_AT(dequantize_args, quiet), NULL, 0, 0, NULL, NULL, NULL, "no table"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};
static const cli_spec dequantize_spec = {
    "dequantize",
    "[options] IN.safetensors OUT.safetensors",
    "Writes every packed matrix of IN as a float tensor of the same name, shape [rows, cols]\n"
    "in original row and column order, with its column scales and sparse part applied:\n"
    "bit for bit what mpq_packed_dequantize gives (then rounded for f16 and bf16), with\n"
    "--skip-planes as the products read it. Other tensors and IN's metadata (config,\n"
    "tokenizer) are copied as they are.",
    {{dequantize_opts, 0}, {cli_skip_opts, CLI_AT(dequantize_args, lo)}, {NULL, 0}, {NULL, 0}},
    2,
    2,
    NULL};

/* Packed matrix t of f as floats into w; its summary row in r. */
static int dequantize_one(const dequantize_args *a, mpq_st_file *f, const mpq_st_tensor *t, mpq_st_writer *w, row *r)
{
    mpq_io_err e;
    mpq_packed A;
    if (mpq_st_read_packed(f, t->name, &A, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    const mpq_dtype dt = dequantize_dtypes[a->dtype];
    const uint64_t sh[2] = {(uint64_t)A.rows, (uint64_t)A.cols};
    float *W = (float *)malloc(sizeof(float) * (size_t)A.rows * (size_t)A.cols);
    mpq_status st = W ? mpq_packed_dequantize(&A, a->lo.skip, W) : MPQ_ERR_NOMEM;
    int rc = 0;
    if (st != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: tensor '%s': dequantize: %s", mpq_st_path(f), t->name, mpq_status_str(st));
    else if (mpq_st_write_f32(w, t->name, dt, 2, sh, W, &e) != MPQ_OK)
        rc = fail(EXIT_OUTPUT, "%s", e.msg);
    char wt[32];
    widths_text(&A, wt, sizeof wt);
    snprintf(r->kind, sizeof r->kind, "%s (from %s %s)", mpq_dtype_name(dt), mpq_format_get((mpq_format)A.format)->name,
             wt);
    shape_text(2, sh, r->shape, sizeof r->shape);
    r->bpw = mpq_packed_bpw(&A, 2), r->weights = (uint64_t)A.rows * (uint64_t)A.cols; /* what was read */
    r->bytes_out = r->weights * mpq_dtype_size(dt);
    free(W);
    mpq_packed_free(&A);
    return rc;
}

int cmd_dequantize(int argc, char **argv)
{
    dequantize_args a;
    const char *pos[2];
    int npos = 0, rc = cli_parse(&dequantize_spec, argc, argv, &a, sizeof a, pos, &npos, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    mpq_io_err e;
    mpq_st_file *f;
    mpq_st_writer *w = NULL;
    if (mpq_st_open(pos[0], &f, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    if (mpq_st_writer_open(pos[1], &w, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
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
        rc = t->packed ? dequantize_one(&a, f, t, w, &r) : copy_st_tensor(f, t, w, &r);
        if (!rc) arrput(rows, r);
    }
    if (!rc && mpq_st_writer_close(w, &e) != MPQ_OK)
        rc = fail(EXIT_OUTPUT, "%s", e.msg);
    else if (rc)
        mpq_st_writer_abort(w);
    if (!rc && !a.quiet) {
        printf("%s -> %s (dequantized%s)\n", pos[0], pos[1], a.lo.skip ? ", lowest planes skipped" : "");
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

typedef struct bench_args {
    const char *only;
    int batch, threads, reps;
} bench_args;

static const cli_opt bench_opts[] = {
    {"--tensor", CLI_STR, CLI_AT(bench_args, only), "NAME", 0, 0, NULL, NULL, NULL, "only this tensor"},
    {"--batch", CLI_INT, CLI_AT(bench_args, batch), "B", 1, 64, NULL, NULL, "1", "vectors per call, 1..64"},
    {"--threads", CLI_INT, CLI_AT(bench_args, threads), "T", 1, 4096, NULL, NULL, NULL, "CPU threads (default all)"},
    {"--reps", CLI_INT, CLI_AT(bench_args, reps), "R", 1, 100000, NULL, NULL, "30", "timed calls"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};
static const cli_spec bench_spec = {"bench",
                                    "[options] FILE.safetensors",
                                    "Times y = W x for every packed matrix of FILE (median of --reps calls, rotating\n"
                                    "over copies so that the caches do not hold the matrix) and prints, measured in\n"
                                    "the same run: GB/s of the packed bytes and their share of this machine's read\n"
                                    "bandwidth, a plain float32 GEMV of the dequantized matrix, and the GPU (device\n"
                                    "pointers, CUDA events) when this build has CUDA and a GPU is present.",
                                    {{bench_opts, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}},
                                    1,
                                    1,
                                    NULL};

/* One packed matrix timed: mpq (CPU), float32, the GPU; its line. */
static void bench_one(const bench_args *a, const char *name, const mpq_packed *A, double bw, double *worst_f32)
{
    const int batch = a->batch, threads = a->threads;
    const size_t xn = (size_t)batch * A->cols, yn = (size_t)batch * A->rows;
    float *x = (float *)malloc(sizeof(float) * xn), *y = (float *)malloc(sizeof(float) * yn);
    float *W = (float *)malloc(sizeof(float) * (size_t)A->rows * A->cols);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t k = 0; x && k < xn; k++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[k] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    if (x && y && W && mpq_packed_dequantize(A, 0, W) == MPQ_OK) {
        const double us = cpu_us(A, x, y, batch, threads, a->reps);
        double f32 = 0;
        for (int b = 0; b < batch; b++)
            f32 += bench_f32_gemv_us(W, x + (size_t)b * A->cols, y, A->rows, A->cols, threads, (size_t)256 << 20, 1);
        double g = -1;
#ifdef MPQ_HAVE_CUDA
        g = gpu_us(A, x, batch, a->reps);
#endif
        char shape[32], gs[32];
        snprintf(shape, sizeof shape, "%dx%d", A->rows, A->cols);
        if (g >= 0)
            snprintf(gs, sizeof gs, "%.1f", g);
        else
            snprintf(gs, sizeof gs, "-");
        const double gbs = (double)A->bytes / (us * 1e-6) * 1e-9;
        const double f32_of_bw = 4.0 * A->rows * (double)A->cols * batch / (f32 * 1e-6) / bw;
        if (4.0 * A->rows * (double)A->cols >= 64e6 && (*worst_f32 == 0.0 || f32_of_bw < *worst_f32))
            *worst_f32 = f32_of_bw;
        printf("%-36.36s %-11s %6.3f %10zu %9.1f %8.1f %5.0f%% %9.1f %6.2fx %9s\n", name, shape, mpq_packed_bpw(A, 2),
               A->bytes, us, gbs, 100.0 * gbs * 1e9 / bw, f32, f32 / us, gs);
    } else {
        fail(0, "bench: tensor '%s': out of memory", name);
    }
    free(x);
    free(y);
    free(W);
}

int cmd_bench(int argc, char **argv)
{
    bench_args a;
    const char *path;
    int npos = 0, rc = cli_parse(&bench_spec, argc, argv, &a, sizeof a, &path, &npos, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    if (!a.threads) a.threads = bench_max_threads();
    mpq_io_err e;
    mpq_st_file *f;
    if (mpq_st_open(path, &f, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    if (a.only && (!mpq_st_find(f, a.only) || !mpq_st_find(f, a.only)->packed)) {
        fail(EXIT_INPUT, "%s: tensor '%s': no packed matrix of that name", path, a.only);
        mpq_st_close(f);
        return EXIT_INPUT;
    }
    const bench_load load0 = bench_load_now();
    double worst_f32 = 0.0; /* the float32 GEMV's read rate over the bandwidth, matrices far beyond the caches */
    const double bw = bench_read_bandwidth(a.threads, 1);
    printf("%s: batch %d, %d threads, %d reps; read bandwidth %.1f GB/s\n", path, a.batch, a.threads, a.reps,
           bw * 1e-9);
    printf("%-36s %-11s %6s %10s %9s %8s %6s %9s %7s %9s\n", "tensor", "shape", "bpw", "bytes", "mpq us", "GB/s", "%bw",
           "f32 us", "f32/mpq", "gpu us");
    int count = 0;
    for (int i = 0; i < mpq_st_count(f) && !rc; i++) {
        const mpq_st_tensor *t = mpq_st_at(f, i);
        if (!t->packed || (a.only && strcmp(a.only, t->name) != 0)) continue;
        mpq_packed A;
        if (mpq_st_read_packed(f, t->name, &A, &e) != MPQ_OK) {
            rc = fail(EXIT_INPUT, "%s", e.msg);
            break;
        }
        bench_one(&a, t->name, &A, bw, &worst_f32);
        count++;
        mpq_packed_free(&A);
    }
    if (!rc && !count) printf("(no packed matrices in %s)\n", path);
    if (!rc && count) bench_verdict(load0, bench_load_now(), worst_f32);
    mpq_st_close(f);
    return rc;
}

/* ---------------------------------------------------------------------------
   the commands
   ------------------------------------------------------------------------ */

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"quantize", cmd_quantize, "quantize a model (GGUF, Hugging Face directory, safetensors)"},
    {"calibrate", cmd_calibrate, "statistics for the methods from a model's forward and backward passes"},
    {"measure", cmd_measure, "each linear map's KL divergence under a quantizer at a few widths"},
    {"eval", cmd_eval, "perplexity of a model on a text file, as llama-perplexity computes it"},
    {"run", cmd_run, "generate text from a prompt (greedy or sampled; PMPD schedules)"},
    {"schedule", cmd_schedule, "PMPD's static schedule search, or its learned scheduler, on calibration text"},
    {"gen-eval", cmd_gen_eval, "generation under PMPD schedules: bits per token, quality under a reference"},
    {"speed", cmd_speed, "prompt and decode tokens per second, as llama-bench measures them"},
    {"inspect", cmd_inspect, "list a file's tensors: format, widths, bits per weight, bytes"},
    {"bench", cmd_bench, "time the packed matrices of a file (CPU, and GPU when present)"},
    {"dequantize", cmd_dequantize, "packed matrices back to F32, F16 or BF16 tensors, for other tools"},
};
enum { NCOMMANDS = (int)(sizeof commands / sizeof commands[0]) };

static void main_help(void)
{
    printf("mpq %d.%d.%d - mixed-precision quantization of LLM weights\n\nusage: mpq <command> [options] ...\n\n",
           MPQ_VERSION_MAJOR, MPQ_VERSION_MINOR, MPQ_VERSION_PATCH);
    for (int i = 0; i < NCOMMANDS; i++) printf("  %-10s %s\n", commands[i].name, commands[i].summary);
    printf("\n'mpq <command> --help' describes each. Exit codes: 0 ok, 1 usage, 2 bad input\n"
           "file, 3 output not written, 4 quantization failed.\n");
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
    for (int i = 0; i < NCOMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    char list[256] = "";
    for (int i = 0; i < NCOMMANDS; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", commands[i].name);
    return fail(EXIT_USAGE, "unknown command '%s' (%s; see mpq --help)", argv[1], list);
}
