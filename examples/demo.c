/* demo: quantize a synthetic LLM-like layer at several bit widths and report
   error and speed.

   usage: demo [--rows M] [--cols N] [--seed S] [--threads T]

   The layer (default 4096 x 4096, seed 42) has the statistics of trained LLM
   weights: heavy-tailed entries and a few outlier rows and columns (see
   examples/synth.h); the activations have a few massive channels. For every
   bits-per-weight point the demo packs the layer (fractional points are
   16 x 128 block mixes of two neighbouring widths), multiplies, and prints the
   weight error, the output error against the float product, and the time
   against a float32 GEMV. The higher width goes to the blocks with the
   largest share of the output (see block_mix). It then shows nested
   precision: the 4-bit matrix run with its lowest planes skipped. */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#ifdef MPQ_HAVE_CUDA
#include "mpq_cuda.h"
#endif
#include "bench_util.h"
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The high width on the fraction bpw - floor(bpw) of the 16 x 128 blocks that
   matter most to this input: score = sum over the block of (w_ij x_j)^2, the
   block's share of the squared output. (A stand-in for the salience
   planners, which rank blocks from gradients across whole models.) */
static int cmp_desc(const void *a, const void *b)
{
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return (x < y) - (x > y);
}

static void block_mix(uint8_t *bits, const float *W, const float *x, int m, int n, double bpw)
{
    const int nbr = (m + 15) / 16, ngr = (n + 127) / 128, nb = nbr * ngr;
    double *score = malloc(sizeof(double) * 2 * (size_t)nb); /* (score, index) pairs */
    for (int b = 0; b < nb; b++) score[2 * b] = 0.0, score[2 * b + 1] = b;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double v = (double)W[(size_t)i * n + j] * x[j];
            score[2 * ((i / 16) * ngr + j / 128)] += v * v;
        }
    qsort(score, (size_t)nb, 2 * sizeof(double), cmp_desc);
    int lo = (int)bpw, nhi = (int)((bpw - lo) * nb + 0.5);
    for (int k = 0; k < nb; k++) bits[(int)score[2 * k + 1]] = (uint8_t)(k < nhi ? lo + 1 : lo);
    free(score);
}

static double rel_err(const float *a, const double *ref, size_t n)
{
    double e = 0, r = 0;
    for (size_t k = 0; k < n; k++) {
        e += ((double)a[k] - ref[k]) * ((double)a[k] - ref[k]);
        r += ref[k] * ref[k];
    }
    return sqrt(e / r);
}

static double time_us(const mpq_packed *A, const float *x, float *y, const mpq_gemv_opts *o, void *work, size_t wb)
{
    double t[25];
    for (int r = 0; r < 25; r++) {
        double t0 = bench_now();
        mpq_gemv(A, x, y, 1, o, work, wb);
        t[r] = bench_now() - t0;
    }
    return bench_median(t, 25) * 1e6;
}

int main(int argc, char **argv)
{
    int m = 4096, n = 4096, threads = 0;
    unsigned long long seed = 42;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--rows") && a + 1 < argc)
            m = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--cols") && a + 1 < argc)
            n = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc)
            seed = strtoull(argv[++a], NULL, 10);
        else if (!strcmp(argv[a], "--threads") && a + 1 < argc)
            threads = atoi(argv[++a]);
        else {
            fprintf(stderr, "usage: %s [--rows M] [--cols N] [--seed S] [--threads T]\n", argv[0]);
            return 2;
        }
    }
    if (m < 1 || n < 1) {
        fprintf(stderr, "rows and cols must be positive\n");
        return 2;
    }
    synth_rng rng = {seed};
    float *W = malloc(sizeof(float) * (size_t)m * n), *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * m);
    float *Wd = malloc(sizeof(float) * (size_t)m * n);
    double *yref = malloc(sizeof(double) * m);
    if (!W || !x || !y || !Wd || !yref) return 1;
    synth_weights(&rng, W, m, n);
    synth_activations(&rng, x, n);
    for (int i = 0; i < m; i++) {
        double s = 0;
        for (int j = 0; j < n; j++) s += (double)W[(size_t)i * n + j] * x[j];
        yref[i] = s;
    }
    double wnorm = 0;
    for (size_t k = 0; k < (size_t)m * n; k++) wnorm += (double)W[k] * W[k];

    mpq_backend be;
    mpq_backend_cpu(&be);
#ifdef MPQ_HAVE_CUDA
    mpq_backend gpu;
    mpq_status gst = mpq_cuda_backend(0, &gpu);
    if (gst == MPQ_OK && (gpu.caps & MPQ_CAP_BITPLANE))
        be = gpu;
    else
        printf("CUDA backend: %s; using the CPU\n",
               gst == MPQ_OK ? "no GPU kernels in this version" : mpq_status_str(gst));
    if (gst == MPQ_OK) mpq_cuda_backend_destroy(&gpu);
#endif
    printf("mpq demo: synthetic LLM-like layer %d x %d (seed %llu), group 128, kernel %s, backend %s\n\n", m, n, seed,
           mpq_path_name(mpq__resolve_path(MPQ_PATH_AUTO)), be.name);
    const double bpws[] = {2.0, 2.5, 3.0, 3.25, 4.0, 5.0, 8.0};
    uint8_t *bits = malloc((size_t)((m + 15) / 16) * (size_t)((n + 127) / 128));
    mpq_gemv_opts o;
    memset(&o, 0, sizeof o);
    o.threads = threads;
    double t32;
    {
        double t[15];
        for (int r = 0; r < 15; r++) {
            double t0 = bench_now();
            bench_f32_gemv(W, x, y, m, n, threads > 0 ? threads : bench_max_threads());
            t[r] = bench_now() - t0;
        }
        t32 = bench_median(t, 15) * 1e6;
    }
    printf("%6s %8s %10s %12s %12s %10s %9s\n", "bpw", "+meta", "bytes", "weight err", "output err", "gemv us",
           "vs fp32");
    mpq_packed A4;
    memset(&A4, 0, sizeof A4);
    for (size_t k = 0; k < sizeof bpws / sizeof bpws[0]; k++) {
        block_mix(bits, W, x, m, n, bpws[k]);
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.rows = m;
        d.cols = n;
        d.bits = bits;
        mpq_packed A;
        mpq_status st = mpq_pack_alloc(&d, W, &A);
        if (st != MPQ_OK) {
            fprintf(stderr, "pack: %s\n", mpq_status_str(st));
            return 1;
        }
        void *h = NULL;
        if ((st = be.upload(be.ctx, &A, &h)) != MPQ_OK || (st = be.gemv(be.ctx, h, x, y, 1, &o)) != MPQ_OK) {
            fprintf(stderr, "gemv: %s\n", mpq_status_str(st));
            return 1;
        }
        be.release(be.ctx, h);
        double oerr = rel_err(y, yref, (size_t)m);
        mpq_packed_dequantize(&A, 0, Wd);
        double we = 0;
        for (size_t q = 0; q < (size_t)m * n; q++) we += ((double)Wd[q] - W[q]) * ((double)Wd[q] - W[q]);
        size_t wb = mpq_gemv_work_bytes(&A, 1);
        void *work = mpq_aligned_alloc(wb);
        double us = time_us(&A, x, y, &o, work, wb);
        mpq_aligned_free(work);
        printf("%6.2f %8.2f %10zu %12.5f %12.5f %10.1f %8.2fx\n", mpq_packed_bpw(&A, 0), mpq_packed_bpw(&A, 1), A.bytes,
               sqrt(we / wnorm), oerr, us, t32 / us);
        if (bpws[k] == 4.0)
            A4 = A;
        else
            mpq_packed_free(&A);
    }
    /* MXINT: 32-column blocks with a shared power-of-two scale; the 4/6/8
       row spreads mantissa widths like MXSens (its planner picks columns). */
    const struct {
        const char *name;
        int bits[3];
    } mx[] = {{"MXINT4", {4, 4, 4}}, {"MXINT 4/6/8", {8, 6, 4}}, {"MXINT8", {8, 8, 8}}};
    printf("\n%12s %8s %10s %12s %12s %10s %9s\n", "MXINT", "+meta", "bytes", "weight err", "output err", "gemv us",
           "vs fp32");
    for (size_t k = 0; k < sizeof mx / sizeof mx[0]; k++) {
        const int ngr = (n + 31) / 32;
        uint8_t *mb = malloc((size_t)ngr);
        for (int g = 0; g < ngr; g++) /* 8 bits on the first block, 6 on the next eighth, 4 on the rest */
            mb[g] = (uint8_t)(g == 0 ? mx[k].bits[0] : (g <= ngr / 8 ? mx[k].bits[1] : mx[k].bits[2]));
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.format = MPQ_FORMAT_MXINT;
        d.rows = m;
        d.cols = n;
        d.block_rows = m;
        d.bits = mb;
        mpq_packed A;
        if (mpq_pack_alloc(&d, W, &A) != MPQ_OK) return 1;
        mpq_gemv(&A, x, y, 1, &o, NULL, 0);
        double oerr = rel_err(y, yref, (size_t)m);
        mpq_packed_dequantize(&A, 0, Wd);
        double we = 0;
        for (size_t q = 0; q < (size_t)m * n; q++) we += ((double)Wd[q] - W[q]) * ((double)Wd[q] - W[q]);
        size_t wb = mpq_gemv_work_bytes(&A, 1);
        void *work = mpq_aligned_alloc(wb);
        double us = time_us(&A, x, y, &o, work, wb);
        printf("%12s %8.2f %10zu %12.5f %12.5f %10.1f %8.2fx\n", mx[k].name, mpq_packed_bpw(&A, 1), A.bytes,
               sqrt(we / wnorm), oerr, us, t32 / us);
        mpq_aligned_free(work);
        mpq_packed_free(&A);
        free(mb);
    }
    printf("\nfloat32 GEMV: %.1f us (matrix in cache after the first run, like the rows above)\n", t32);
    printf("\nnested precision: the same 4-bit bytes with the lowest planes skipped\n");
    printf("%12s %10s %12s %10s\n", "skip_planes", "bits used", "output err", "gemv us");
    size_t wb = mpq_gemv_work_bytes(&A4, 1);
    void *work = mpq_aligned_alloc(wb);
    for (int sk = 0; sk < 4; sk++) {
        o.skip_planes = sk;
        mpq_gemv(&A4, x, y, 1, &o, work, wb);
        double oerr = rel_err(y, yref, (size_t)m);
        printf("%12d %10d %12.5f %10.1f\n", sk, 4 - sk, oerr, time_us(&A4, x, y, &o, work, wb));
    }
    mpq_aligned_free(work);
    mpq_packed_free(&A4);
    free(bits);
    free(W);
    free(Wd);
    free(x);
    free(y);
    free(yref);
    return 0;
}
