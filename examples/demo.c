/* demo: quantize a synthetic LLM-like layer at several bit widths, with and
   without AWQ, and report error and speed.

   usage: demo [--rows M] [--cols N] [--seed S] [--threads T] [--model-dim D]

   The layer (default 4096 x 4096, seed 42) has the statistics of trained LLM
   weights: heavy-tailed entries and a few outlier rows and columns (see
   util/synth.h). The activations come in batches whose massive channels
   are the same in every token, as in LLMs: 64 calibration tokens for AWQ and
   16 held-out tokens on which every error below is measured (relative
   Frobenius norm of Y - Y_float). Bit widths come from the SFMP planner
   (16 x 128 blocks, rows reordered; fractional widths mix two neighbouring
   ones), with the salience proxy w^2 E[x^2]. Then
   AWQ next to round-to-nearest, MXINT, and nested precision: one 4-bit
   matrix run with its lowest planes skipped. Times are the median of 25
   GEMVs with one vector, against a float32 GEMV measured the same way.

   Then every planner on a synthetic 8-layer model of width D (default
   256; 0 skips it) with a planted loss, at equal bits per weight: where each
   puts the high width and what the loss comes to (examples/planners.h). */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#ifdef MPQ_HAVE_CUDA
#include "mpq_cuda.h"
#endif
#include "bench_util.h"
#include "synth.h"
#include "planners.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CALIB = 64, HELD = 16 };

typedef struct demo {
    int m, n, threads;
    float *W, *Xc, *Xh, *Y, *Wd;
    double *Yref, wnorm, t32;
    mpq_backend be;
} demo;

/* SFMP plan for `bpw` weight bits (+ 0.25 metadata at group 128) on 16 x 128
   blocks, rows reordered by salience. This single layer has no
   gradients, so the salience is the proxy w_ij^2 E[x_j^2] over the
   calibration tokens (each weight's share of the squared output). The plan
   owns the bits map and permutations it puts in *d. */
static void sfmp_plan(const demo *D, double bpw, mpq_plan *plan, mpq_bitplane_desc *d)
{
    const size_t mn = (size_t)D->m * D->n;
    float *S = malloc(sizeof(float) * mn);
    double *x2 = calloc((size_t)D->n, sizeof(double));
    for (int t = 0; t < CALIB; t++)
        for (int j = 0; j < D->n; j++)
            x2[j] += (double)D->Xc[(size_t)t * D->n + j] * D->Xc[(size_t)t * D->n + j] / CALIB;
    for (size_t k = 0; k < mn; k++) S[k] = (float)((double)D->W[k] * D->W[k] * x2[k % (size_t)D->n]);
    mpq_sfmp_layer L = {S, D->m, D->n};
    mpq_sfmp_desc sd;
    memset(&sd, 0, sizeof sd);
    /* rows only: reordering columns also regroups the columns that share a
       scale, and on this layer that gathers the outlier columns into one
       group of every row (weight error at 4 bits 0.118 -> 0.181) */
    sd.bpw = bpw + 32.0 / 128, sd.group = 128, sd.block_rows = 16, sd.reorder = MPQ_REORDER_ROWS;
    mpq_status st = mpq_plan_sfmp(&L, 1, &sd, plan);
    if (st == MPQ_OK) st = mpq_plan_desc(plan, 0, d);
    if (st != MPQ_OK) {
        fprintf(stderr, "sfmp: %s\n", mpq_status_str(st));
        exit(1);
    }
    free(S);
    free(x2);
}

/* Output error on the held-out tokens (through the backend), weight error,
   and the time of one GEMV. */
static void evaluate(demo *D, const mpq_packed *A, double *oerr, double *werr, double *us)
{
    void *h = NULL;
    mpq_gemv_opts o;
    memset(&o, 0, sizeof o);
    o.threads = D->threads;
    mpq_status st = D->be.upload(D->be.ctx, A, &h);
    if (st == MPQ_OK) st = D->be.gemv(D->be.ctx, h, D->Xh, D->Y, HELD, &o);
    if (st != MPQ_OK) {
        fprintf(stderr, "gemv: %s\n", mpq_status_str(st));
        exit(1);
    }
    double e = 0, r = 0;
    for (size_t k = 0; k < (size_t)HELD * D->m; k++) {
        e += ((double)D->Y[k] - D->Yref[k]) * ((double)D->Y[k] - D->Yref[k]);
        r += D->Yref[k] * D->Yref[k];
    }
    *oerr = sqrt(e / r);
    mpq_packed_dequantize(A, 0, D->Wd);
    e = 0;
    for (size_t k = 0; k < (size_t)D->m * D->n; k++) e += ((double)D->Wd[k] - D->W[k]) * ((double)D->Wd[k] - D->W[k]);
    *werr = sqrt(e / D->wnorm);
    double t[25];
    for (int k = 0; k < 25; k++) {
        double t0 = bench_now();
        D->be.gemv(D->be.ctx, h, D->Xh, D->Y, 1, &o);
        t[k] = bench_now() - t0;
    }
    *us = bench_median(t, 25) * 1e6;
    D->be.release(D->be.ctx, h);
}

/* AWQ for description d: fills its column scales and clips; returns seconds. */
static double awq(const demo *D, mpq_bitplane_desc *d, float *cs, float *clip, mpq_awq_result *res)
{
    mpq_awq_desc a;
    memset(&a, 0, sizeof a);
    a.X = D->Xc;
    a.tokens = CALIB;
    double t0 = bench_now();
    mpq_status st = mpq_awq_search(d, D->W, &a, cs, clip, res);
    if (st != MPQ_OK) {
        fprintf(stderr, "awq: %s\n", mpq_status_str(st));
        exit(1);
    }
    d->col_scale = cs;
    d->clip = clip;
    return bench_now() - t0;
}

int main(int argc, char **argv)
{
    demo D;
    memset(&D, 0, sizeof D);
    D.m = 4096, D.n = 4096;
    unsigned long long seed = 42;
    int model_dim = 256;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--rows") && a + 1 < argc)
            D.m = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--cols") && a + 1 < argc)
            D.n = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc)
            seed = strtoull(argv[++a], NULL, 10);
        else if (!strcmp(argv[a], "--threads") && a + 1 < argc)
            D.threads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--model-dim") && a + 1 < argc)
            model_dim = atoi(argv[++a]);
        else {
            fprintf(stderr, "usage: %s [--rows M] [--cols N] [--seed S] [--threads T] [--model-dim D]\n", argv[0]);
            return 2;
        }
    }
    if (D.m < 1 || D.n < 1 || model_dim < 0 || model_dim % 32) {
        fprintf(stderr, "rows and cols must be positive, the model dimension a multiple of 32 (0: no model part)\n");
        return 2;
    }
    const int m = D.m, n = D.n;
    synth_rng rng = {seed};
    D.W = malloc(sizeof(float) * (size_t)m * n);
    D.Wd = malloc(sizeof(float) * (size_t)m * n);
    D.Xc = malloc(sizeof(float) * (size_t)CALIB * n);
    D.Xh = malloc(sizeof(float) * (size_t)HELD * n);
    D.Y = malloc(sizeof(float) * (size_t)HELD * m);
    D.Yref = malloc(sizeof(double) * (size_t)HELD * m);
    float *cs = malloc(sizeof(float) * n), *clip = malloc(sizeof(float) * (size_t)m * ((n + 31) / 32));
    uint8_t *bits = malloc((size_t)((m + 15) / 16) * (size_t)((n + 31) / 32));
    if (!D.W || !D.Wd || !D.Xc || !D.Xh || !D.Y || !D.Yref || !cs || !clip || !bits) return 1;
    synth_weights(&rng, D.W, m, n);
    synth_tokens(&rng, D.Xc, CALIB, n, seed + 1);
    synth_tokens(&rng, D.Xh, HELD, n, seed + 1); /* the same massive channels */
    for (int t = 0; t < HELD; t++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int j = 0; j < n; j++) s += (double)D.W[(size_t)i * n + j] * D.Xh[(size_t)t * n + j];
            D.Yref[(size_t)t * m + i] = s;
        }
    for (size_t k = 0; k < (size_t)m * n; k++) D.wnorm += (double)D.W[k] * D.W[k];
    {
        double t[25];
        for (int k = 0; k < 25; k++) {
            double t0 = bench_now();
            bench_f32_gemv(D.W, D.Xh, D.Y, m, n, D.threads > 0 ? D.threads : bench_max_threads());
            t[k] = bench_now() - t0;
        }
        D.t32 = bench_median(t, 25) * 1e6;
    }

    mpq_backend_cpu(&D.be);
#ifdef MPQ_HAVE_CUDA
    mpq_backend gpu;
    mpq_status gst = mpq_cuda_backend(0, &gpu);
    if (gst == MPQ_OK && (gpu.caps & MPQ_CAP_BITPLANE))
        D.be = gpu;
    else
        printf("CUDA backend: %s; using the CPU\n",
               gst == MPQ_OK ? "no bit-plane GEMV in this backend" : mpq_status_str(gst));
    if (gst == MPQ_OK && !(gpu.caps & MPQ_CAP_BITPLANE)) mpq_cuda_backend_destroy(&gpu);
    if (D.be.ctx != NULL && !strcmp(D.be.name, "cuda"))
        printf("(GPU times below include copying x to the device and y back in every call)\n");
#endif
    printf("mpq demo: synthetic LLM-like layer %d x %d (seed %llu), kernel %s, backend %s\n", m, n, seed,
           mpq_path_name(mpq__resolve_path(MPQ_PATH_AUTO)), D.be.name);
    printf("errors: relative, on %d held-out tokens; float32 GEMV %.1f us\n\n", HELD, D.t32);

    printf("SFMP plan, round to nearest, group 128\n%6s %7s %10s %11s %11s %9s %8s\n", "bpw", "+meta", "bytes",
           "weight err", "output err", "gemv us", "vs fp32");
    const double bpws[] = {2.0, 2.5, 3.0, 3.25, 4.0, 5.0, 8.0};
    for (size_t k = 0; k < sizeof bpws / sizeof bpws[0]; k++) {
        mpq_plan plan;
        mpq_bitplane_desc d;
        sfmp_plan(&D, bpws[k], &plan, &d);
        mpq_packed A;
        if (mpq_pack_alloc(&d, D.W, &A) != MPQ_OK) return 1;
        mpq_plan_free(&plan);
        double oe, we, us;
        evaluate(&D, &A, &oe, &we, &us);
        printf("%6.2f %7.2f %10zu %11.5f %11.5f %9.1f %7.2fx\n", mpq_packed_bpw(&A, 0), mpq_packed_bpw(&A, 1), A.bytes,
               we, oe, us, D.t32 / us);
        mpq_packed_free(&A);
    }

    printf("\nAWQ next to round to nearest (64 calibration tokens; scales applied while building tables)\n");
    printf("%-12s %7s %11s %11s %7s %9s %9s %9s\n", "format", "+meta", "RTN err", "AWQ err", "alpha", "search s",
           "RTN us", "AWQ us");
    const struct {
        const char *name;
        int format;
        double bpw;
    } cfg[] = {{"bitplane 3", MPQ_FORMAT_BITPLANE, 3.0},
               {"bitplane 3.25", MPQ_FORMAT_BITPLANE, 3.25},
               {"bitplane 4", MPQ_FORMAT_BITPLANE, 4.0},
               {"MXINT4", MPQ_FORMAT_MXINT, 4.0}};
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        mpq_bitplane_desc d;
        mpq_plan plan;
        memset(&plan, 0, sizeof plan);
        memset(&d, 0, sizeof d);
        if (cfg[k].format == MPQ_FORMAT_BITPLANE)
            sfmp_plan(&D, cfg[k].bpw, &plan, &d);
        else
            d.rows = m, d.cols = n, d.format = cfg[k].format, d.uniform_bits = (int)cfg[k].bpw;
        mpq_packed A;
        double oe0, we0, us0, oe1, we1, us1;
        if (mpq_pack_alloc(&d, D.W, &A) != MPQ_OK) return 1;
        evaluate(&D, &A, &oe0, &we0, &us0);
        mpq_packed_free(&A);
        mpq_awq_result res;
        double secs = awq(&D, &d, cs, clip, &res);
        if (mpq_pack_alloc(&d, D.W, &A) != MPQ_OK) return 1;
        evaluate(&D, &A, &oe1, &we1, &us1);
        printf("%-12s %7.2f %11.5f %11.5f %7.2f %9.2f %9.1f %9.1f\n", cfg[k].name, mpq_packed_bpw(&A, 1), oe0, oe1,
               (double)res.alpha, secs, us0, us1);
        mpq_packed_free(&A);
        mpq_plan_free(&plan);
    }

    printf("\nMXINT: 32-column blocks, shared power-of-two scale (4/6/8: one 8-bit block, an eighth at 6, rest 4)\n");
    printf("%-12s %7s %10s %11s %11s %9s %8s\n", "format", "+meta", "bytes", "weight err", "output err", "gemv us",
           "vs fp32");
    const struct {
        const char *name;
        int hi, mid, lo;
    } mx[] = {{"MXINT4", 4, 4, 4}, {"MXINT 4/6/8", 8, 6, 4}, {"MXINT8", 8, 8, 8}};
    for (size_t k = 0; k < sizeof mx / sizeof mx[0]; k++) {
        const int ngr = (n + 31) / 32;
        for (int g = 0; g < ngr; g++) bits[g] = (uint8_t)(g == 0 ? mx[k].hi : (g <= ngr / 8 ? mx[k].mid : mx[k].lo));
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.format = MPQ_FORMAT_MXINT, d.rows = m, d.cols = n, d.block_rows = m, d.bits = bits;
        mpq_packed A;
        if (mpq_pack_alloc(&d, D.W, &A) != MPQ_OK) return 1;
        double oe, we, us;
        evaluate(&D, &A, &oe, &we, &us);
        printf("%-12s %7.2f %10zu %11.5f %11.5f %9.1f %7.2fx\n", mx[k].name, mpq_packed_bpw(&A, 1), A.bytes, we, oe, us,
               D.t32 / us);
        mpq_packed_free(&A);
    }

    printf("\nnested precision: one 4-bit matrix, lowest planes skipped at run time\n");
    printf("%12s %10s %11s %9s\n", "skip_planes", "bits used", "output err", "gemv us");
    {
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.rows = m, d.cols = n, d.uniform_bits = 4;
        mpq_packed A;
        if (mpq_pack_alloc(&d, D.W, &A) != MPQ_OK) return 1;
        size_t wb = mpq_gemv_work_bytes(&A, HELD);
        void *work = mpq_aligned_alloc(wb);
        for (int sk = 0; sk < 4; sk++) {
            mpq_gemv_opts o;
            memset(&o, 0, sizeof o);
            o.threads = D.threads, o.skip_planes = sk;
            mpq_gemv(&A, D.Xh, D.Y, HELD, &o, work, wb);
            double e = 0, r = 0;
            for (size_t k = 0; k < (size_t)HELD * m; k++) {
                e += ((double)D.Y[k] - D.Yref[k]) * ((double)D.Y[k] - D.Yref[k]);
                r += D.Yref[k] * D.Yref[k];
            }
            double t[25];
            for (int k = 0; k < 25; k++) {
                double t0 = bench_now();
                mpq_gemv(&A, D.Xh, D.Y, 1, &o, work, wb);
                t[k] = bench_now() - t0;
            }
            printf("%12d %10d %11.5f %9.1f\n", sk, 4 - sk, sqrt(e / r), bench_median(t, 25) * 1e6);
        }
        mpq_aligned_free(work);
        mpq_packed_free(&A);
    }
    free(D.W), free(D.Wd), free(D.Xc), free(D.Xh), free(D.Y), free(D.Yref), free(cs), free(clip), free(bits);
#ifdef MPQ_HAVE_CUDA
    if (!strcmp(D.be.name, "cuda")) mpq_cuda_backend_destroy(&D.be);
#endif
    if (model_dim > 0) demo_planners(seed, model_dim);
    return 0;
}
