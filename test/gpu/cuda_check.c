/* cuda_check: every CUDA kernel against the float64 CPU reference, without
   Criterion (the GPU machine has none). Output is TAP: "ok N - what" or
   "not ok N - what", and on a machine without a GPU one line that reports
   the whole program skipped. Exit status 1 on any failure.

   Cases (with 8-bit activations too, run_a8): both formats; groups 32, 64,
   96, 128, 160 (one to a stage of the GEMM kernel; not the wgmma kernel's,
   whose stages are blocks of 64 columns), 256, 512 (the LUT kernel), 4096
   (the LUT kernel, never the MMA kernel) and 40 and a partial last group
   (the plain kernel); mixed
   widths with block_rows 16 and 3; permutations, column scales, a sparse
   part; skip_planes 0..2; every batch 1..17, 24, 33, 48, 49, 64, 100,
   128, 129, 256 and 1000 and prompts of 512 and 2048 vectors (as far as the float64
   reference's time allows: the largest batches on the smaller cases):
   the LUT kernel up to 2, the MMA kernel from 3 where every group is
   whole quads of at most 512 columns, the GEMM kernel from
   MPQ_CUDA_GEMM_BATCH where they are at most 256 columns (else the MMA
   kernel in pieces of 16 up to MPQ_CUDA_MMA_MAX), the LUT kernel up to 8
   and fp16 + cuBLAS for the other groups (build with
   -DMPQ_CUDA_MMA_BATCH=2 to put the MMA kernel on batch 2 too);
   skip_planes 1 and 2 at batches 1..8, 11, 16 and 64; device and host
   pointers; fresh random inputs, outputs poisoned with NaN first. The
   fp16-weights backend (mpq_cuda_backend_fp16) on every fifth case at
   batches 1, 5, 17, 64.
   Tolerance: float32 rounding, (n + 64) 2^-23 times 3 max_j |w_ij| sum_j |x~_j| (the terms the
   mirror form adds: |s^| (2^b - 1) + |z^| is at most 3 max |w| of a group);
   with 8-bit activations on the LUT kernel's integer tables (n / 16 + 64);
   fp16 path: 2^-9 sum_j |w_ij x_j| (fp16 rounding of w and x; non-finite
   outputs allowed for a vector with an activation past 65504); the GEMM
   kernel the same, its outputs always finite (it scales each group of
   each vector into the fp16 range first; see smem_sm for the devices
   where fp16 + cuBLAS may take its place); the wgmma kernel (Hopper, sm_90a
   builds: batches MPQ_CUDA_WG_BATCH to MPQ_CUDA_WG_MAX, which the checks
   of those batches do not tell from the kernel they replace) the same, its
   outputs finite too (each vector scaled into the fp16 range; its weights
   rounded to fp16 once, to 11 bits of |w| + s^). Build with
   -DMPQ_CUDA_WG_BATCH=16 -DMPQ_CUDA_WG_MAX=100000 to put it on every batch
   from 16. Host and device pointers, and host memory pinned on the
   backend, must give the same bits. A failure lists how many outputs are wrong and the
   first few. MPQ_CHECK_CASES (see `dry`) keeps some cases.

   Build (Meson builds it when CUDA is found):
     nvcc -gencode=arch=compute_90a,code=sm_90a -I. -Iutil test/gpu/cuda_check.c mpq_cuda.cu -lcublas */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_cuda.h"
#include "synth.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ntest, nfail;

/* mpq_gemv_ref (float64, one thread, decoding the matrix once per call)
   on pieces of 16 vectors, a piece per thread: the reference of the large
   batches in a fraction of the time */
static void gemv_ref(const mpq_packed *A, const float *x, double *y, int batch, int skip)
{
#pragma omp parallel for schedule(dynamic)
    for (int v = 0; v < batch; v += 16) {
        const int nb = batch - v < 16 ? batch - v : 16;
        mpq_gemv_ref(A, x + (size_t)v * A->cols, y + (size_t)v * A->rows, nb, skip);
    }
}

/* MPQ_CHECK_CASES=K or K-L in the environment keeps cases K..L of `cases`
   (for chasing one failure): the cases before K run "dry", drawing the
   same random inputs and running the kernels but computing no reference
   and reporting nothing, so that case K gets the inputs a full run gives
   it; the fp16-weights and bad-input checks are left out. */
static int dry;

/* Shared memory per multiprocessor of the device. With the 228 KB of
   Hopper the GEMM kernel takes every matrix with a code copy and groups up
   to 256 columns (one block per multiprocessor where two would not hold
   two stages each); with less (A100 164 KB, sm_86 and sm_89 100 KB) it
   declines the widest stages, which then go to fp16 + cuBLAS, where
   activations past the fp16 range give non-finite outputs. */
static size_t smem_sm;

static void report(int ok, const char *fmt, ...)
{
    if (dry) return;
    va_list ap;
    va_start(ap, fmt);
    printf("%s %d - ", ok ? "ok" : "not ok", ++ntest);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    nfail += !ok;
}

typedef struct cas {
    int m, n, G, br, format;
    int maxb; /* widths drawn from 1 (MXINT 2) .. maxb per block; 0: every block 3 bits (MXINT 4) */
    int perm, sparse;
    int rot; /* 1: with an incoherence rotation (seed 5) */
} cas;

/* The LUT and MMA kernels are taken for groups that are a multiple of 32
   with whole quads in the last group; the LUT kernel's registers are sized
   by the widest row (up to 4, 6 or 8 planes), the MMA kernel's code fields
   by it (4 or 8 bits); column slices are 512 / batch columns, so 2080 and
   1056 columns end in a partial slice, and 3000 or 5000 rows give warps
   several tiles each with a ragged end. The last case gives each warp of
   the MMA kernel dozens of records, many times its ring. */
static const cas cases[] = {
    {16, 32, 32, 16, 1, 0, 0, 0, 0},
    {37, 96, 32, 3, 1, 8, 1, 1, 0},
    {300, 520, 40, 16, 1, 8, 1, 0, 0},
    {129, 1000, 128, 16, 1, 8, 1, 1, 0},
    {512, 4096, 128, 16, 1, 8, 0, 0, 0},
    {257, 2048, 256, 32, 1, 8, 1, 1, 0},
    {200, 768, 64, 5, 1, 8, 1, 0, 0},
    {1024, 1024, 128, 16, 1, 0, 1, 1, 0},
    {96, 640, 32, 16, 2, 8, 1, 1, 0},
    {33, 100, 32, 16, 2, 8, 0, 0, 0},
    {4096, 4096, 128, 16, 1, 8, 0, 0, 0},
    {2048, 1536, 32, 16, 2, 8, 1, 0, 0},
    {3000, 2080, 32, 16, 1, 4, 1, 1, 0},
    {5000, 1056, 64, 48, 1, 4, 0, 0, 0},
    {1003, 2080, 96, 7, 1, 4, 1, 0, 0},
    {2500, 1536, 32, 16, 2, 4, 1, 1, 0},
    {4100, 2048, 128, 16, 1, 2, 0, 1, 0},
    {560, 1056, 32, 16, 1, 4, 1, 1, 0},
    {3000, 1024, 128, 16, 1, 6, 1, 0, 0},
    {400, 1536, 32, 9, 2, 6, 0, 1, 0},
    {18000, 4096, 32, 16, 1, 4, 0, 0, 0}, /* MMA kernel: dozens of records per warp */
    {260, 2048, 512, 16, 1, 6, 0, 1, 0},  /* groups wider than a slice of batch 2 */
    {100, 4096, 4096, 16, 1, 8, 1, 1, 0}, /* a group per row: past the MMA kernel, the LUT kernel up to batch 8 */
    {300, 1120, 160, 16, 1, 4, 1, 0, 0},  /* stages of 160 columns: not the wgmma kernel's, the GEMM kernel's */
    /* rotated: V x first, then every kernel of the rule table on it */
    {37, 96, 32, 3, 1, 8, 1, 1, 1},
    {576, 576, 128, 16, 1, 4, 1, 1, 1},
    {300, 1536, 32, 16, 2, 6, 1, 0, 1},
    {1024, 14336, 128, 16, 1, 4, 0, 0, 1},
    {129, 200, 40, 16, 1, 8, 1, 1, 1},
    /* past 32768 columns: wg_prep loads a vector's later values again */
    {48, 40960, 128, 16, 1, 4, 1, 1, 0},
};

/* per output: sum |w x| (wx) and 3 max |w| sum |x c| (row), from the
   dequantized matrix (original coordinates) */
static void magnitude(const float *Wd, const float *x, const float *cs, int m, int n, int batch, double *wx,
                      double *row)
{
#pragma omp parallel for schedule(dynamic)
    for (int v = 0; v < batch; v++)
        for (int i = 0; i < m; i++) {
            double s = 0, mx = 0, sx = 0;
            for (int j = 0; j < n; j++) {
                double w = fabs((double)Wd[(size_t)i * n + j]), xv = fabs((double)x[(size_t)v * n + j]);
                s += w * xv, mx = w > mx ? w : mx, sx += xv * (cs ? 2.0 : 1.0); /* c <= 1.5: |x~| <= 2 |x| */
            }
            wx[(size_t)v * m + i] = s;
            row[(size_t)v * m + i] = 3.0 * mx * sx;
        }
}

/* The fp16 path rounds the activations to fp16: a vector with an entry past
   65504 gives inf or NaN outputs there (mpq_cuda.h). On that path and for
   such a vector (synth_activations makes one now and then, where an entry
   is scaled up three times) the checks allow non-finite outputs; a finite
   one must still be right. */
static int past_f16(const float *v, int n)
{
    for (int j = 0; j < n; j++)
        if (!(fabsf(v[j]) <= 65504.0f)) return 1;
    return 0;
}

/* 8-bit activations (mpq_gemv_opts.a8): x~ = x[p_col] col_scale in packed
   order, quantized per group as mpq_quantize_act8 says, written the plain
   way (xh: batch x n, packed order). */
static void act8_ref(const mpq_packed *A, const float *x, int batch, float *xh)
{
    const int n = A->cols, G = A->group;
    for (int v = 0; v < batch; v++) {
        float *xt = xh + (size_t)v * n;
        for (int j = 0; j < n; j++)
            xt[j] = x[(size_t)v * n + (A->p_col ? (int)A->p_col[j] : j)] * (A->col_scale ? A->col_scale[j] : 1.0f);
        for (int j0 = 0; j0 < n; j0 += G) {
            const int j1 = j0 + G < n ? j0 + G : n;
            double amax = 0;
            for (int j = j0; j < j1; j++) amax = fmax(amax, fabs(xt[j]));
            const float sh = mpq_f16_to_f32(mpq_f32_to_f16((float)(amax / 127)));
            for (int j = j0; j < j1; j++) {
                double q = sh > 0 ? nearbyint(xt[j] / sh) : 0; /* to even */
                q = q > 127 ? 127 : (q < -127 ? -127 : q);
                xt[j] = (float)(q * sh);
            }
        }
    }
}

/* The product with 8-bit activations against the float64 reference: the
   dense part (mpq_gemv_ref on a view without p_col, col_scale and sparse
   part) times act8_ref's activations, plus the sparse part times x. The
   GEMM kernel on int8 tensor cores (batches MPQ_CUDA_GEMM_A8_BATCH to
   MPQ_CUDA_GEMM_A8_MAX on `mma` matrices with groups of at most 256
   columns, where shared memory takes every stage: see smem_sm), the 8-bit
   MMA kernel (batches 3 to MPQ_CUDA_MMA_MAX on run_case's `mma`
   matrices) and the plain kernel within float32 rounding, the fp16 path
   within fp16 rounding. The LUT kernel with integer tables (batches 1 and
   2 where every group is whole quads and the GEMM kernel does not take
   batch 2, up to 8 where the MMA kernel does not apply) multiplies a quad
   of a row exactly and scales it once, so only its float sums of quads,
   lanes, slices and parts round: n / 16 + 64 roundings in place of
   n + 64. Host and device pointers give the same bits. */
static void run_a8(mpq_backend *be, void *h, const mpq_packed *A, const float *Wd, int mma, int skip, synth_rng *r,
                   const char *what, const mpq_rotation *rot)
{
    static const int batches[] = {1, 2, 3, 5, 8, 9, 16, 17, 33, 64, 128, 300};
    const int m = A->rows, n = A->cols, last = n - (n - 1) / A->group * A->group;
    const int lut = A->group % 32 == 0 && last % 32 == 0;
    mpq_packed D = *A; /* the dense part in packed column order */
    D.p_col = NULL, D.col_scale = NULL, D.sp_nnz = 0, D.sp_row_ptr = NULL, D.sp_col16 = NULL, D.sp_col32 = NULL,
    D.sp_val = NULL;
    double *wmax = malloc(sizeof(double) * m);
    for (int i = 0; i < m; i++) {
        wmax[i] = 0;
        for (int j = 0; j < n; j++) wmax[i] = fmax(wmax[i], fabs((double)Wd[(size_t)i * n + j]));
    }
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
        const int batch = batches[bi];
        if ((double)m * n * batch > 3e8) continue; /* the reference's time */
        float *x = malloc(sizeof(float) * batch * n), *xh = malloc(sizeof(float) * batch * n),
              *y = malloc(sizeof(float) * batch * m), *y2 = malloc(sizeof(float) * batch * m);
        double *ref = malloc(sizeof(double) * batch * m);
        for (int v = 0; v < batch; v++) synth_activations(r, x + (size_t)v * n, n);
        /* rotated (A is then the view without its rotation): what the kernels read is V x */
        float *xr = malloc(sizeof(float) * batch * n);
        memcpy(xr, x, sizeof(float) * batch * n);
        if (rot) mpq_rotation_apply(rot, xr, batch, 0);
        act8_ref(A, xr, batch, xh);
        if (dry)
            memset(ref, 0, sizeof(double) * batch * m);
        else
            gemv_ref(&D, xh, ref, batch, skip);
        for (int i = 0; A->sp_row_ptr && i < m; i++)
            for (uint32_t e = A->sp_row_ptr[i]; e < A->sp_row_ptr[i + 1]; e++) {
                const uint32_t col = A->sp_col16 ? A->sp_col16[e] : A->sp_col32[e];
                for (int v = 0; v < batch; v++)
                    ref[(size_t)v * m + i] += (double)mpq_f16_to_f32(A->sp_val[e]) * xr[(size_t)v * n + col];
            }
        float *dx, *dy;
        cudaMalloc((void **)&dx, sizeof(float) * batch * n);
        cudaMalloc((void **)&dy, sizeof(float) * batch * m);
        cudaMemcpy(dx, x, sizeof(float) * batch * n, cudaMemcpyHostToDevice);
        for (int k = 0; k < batch * m; k++) y[k] = y2[k] = NAN;
        cudaMemcpy(dy, y, sizeof(float) * batch * m, cudaMemcpyHostToDevice);
        cudaDeviceSynchronize(); /* see run_case */
        mpq_gemv_opts o = {0};
        o.skip_planes = skip, o.a8 = 1;
        mpq_status g1 = be->gemv(be->ctx, h, dx, dy, batch, &o), sy = be->synchronize(be->ctx);
        cudaMemcpy(y, dy, sizeof(float) * batch * m, cudaMemcpyDeviceToHost);
        mpq_status g2 = be->gemv(be->ctx, h, x, y2, batch, &o);
        /* the GEMM kernel on int8 tensor cores; else dequantized to fp16, cuBLAS: without a code
           copy past 8, else past MPQ_CUDA_MMA_MAX */
        const int gemm8_range =
            mma && A->group <= 256 && batch >= MPQ_CUDA_GEMM_A8_BATCH && batch <= MPQ_CUDA_GEMM_A8_MAX;
        const int gemm8 = gemm8_range && smem_sm >= 228 * 1024; /* certainly the GEMM kernel (see smem_sm) */
        const int f16 = !gemm8 && ((!mma && batch > 8) || batch > MPQ_CUDA_MMA_MAX);
        const int itab = lut && !gemm8_range && (batch <= 2 || (!mma && batch <= 8));
        const char *kernel = itab ? " (integer tables)" : gemm8 ? " (GEMM)" : "";
        double worst = 0;
        int bad = -1, same = 1, nbig = 0;
        double *sx = calloc((size_t)batch, sizeof(double)); /* sum |x^| + sum |x| (the sparse part's) */
        char *big = calloc((size_t)batch, 1);               /* past the fp16 range on the fp16 path */
        for (int v = 0; v < batch; v++) {
            for (int j = 0; j < n; j++) sx[v] += fabs(xh[(size_t)v * n + j]) + fabs(xr[(size_t)v * n + j]);
            nbig += big[v] = f16 && past_f16(xh + (size_t)v * n, n);
        }
        for (int k = 0; k < batch * m; k++) {
            if (memcmp(&y[k], &y2[k], 4)) same = 0;
            if (big[k / m] && !isfinite(y[k])) continue;
            /* times max |w| of the row, twice where col_scale (0.5 .. 1.5) divides it */
            const double mag = wmax[k % m] * sx[k / m] * (A->col_scale ? 2.0 : 1.0);
            const double tol = (f16 ? ldexp(mag, -9) : ((itab ? n / 16 : n) + 64) * ldexp(3 * mag, -23)) + 1e-30;
            const double e = fabs((double)y[k] - ref[k]);
            if (!(e <= tol) && bad < 0) bad = k;
            if (e / (mag + 1e-30) > worst) worst = e / (mag + 1e-30);
        }
        report(g1 == MPQ_OK && sy == MPQ_OK && bad < 0,
               "%s skip %d batch %d, a8%s: worst |err|/(max|w| sum|x|) %.2e%s%s", what, skip, batch, kernel, worst,
               nbig ? " (a vector past the fp16 range)" : "", bad < 0 ? "" : " (FAILED)");
        if (bad >= 0 && !dry) printf("# first bad output %d: %.9g vs %.9g\n", bad, (double)y[bad], ref[bad]);
        report(g2 == MPQ_OK && same, "  a8: host pointers give the same bits");
        cudaFree(dx), cudaFree(dy);
        free(x), free(xr), free(xh), free(y), free(y2), free(ref), free(sx), free(big);
    }
    free(wmax);
}

/* fp16: be is mpq_cuda_backend_fp16's (fp16 weights, cuBLAS at every batch;
   no skip_planes) */
static int run_case(mpq_backend *be, const cas *c, synth_rng *r, int fp16)
{
    const int m = c->m, n = c->n, ng = (n + c->G - 1) / c->G, nb = ((m + c->br - 1) / c->br) * ng;
    const int minb = c->format == 2 ? 2 : 1;
    float *W = malloc(sizeof(float) * m * n), *Wd = malloc(sizeof(float) * m * n), *cs = malloc(4u * n);
    uint8_t *bits = malloc((size_t)nb), *mask = calloc((size_t)m * n, 1);
    uint32_t *prow = malloc(4u * m), *pcol = malloc(4u * n);
    synth_weights(r, W, m, n);
    for (int k = 0; k < nb; k++)
        bits[k] = (uint8_t)(c->maxb ? minb + synth_int(r, c->maxb + 1 - minb) : 3 + (c->format == 2));
    synth_perm(r, prow, m);
    synth_perm(r, pcol, n);
    for (int j = 0; j < n; j++) cs[j] = 0.5f + (float)synth_unif(r);
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = c->G, d.block_rows = c->br, d.bits = bits, d.format = c->format;
    if (c->perm) d.p_row = prow, d.p_col = pcol, d.col_scale = cs;
    mpq_rotation rot = {0};
    if (c->rot && mpq_rotation_init(&rot, n, 5) == MPQ_OK) d.rotation = &rot;
    mpq_packed A;
    mpq_sparse S = {0};
    int ok = mpq_pack_alloc(&d, W, &A) == MPQ_OK;
    if (ok && c->sparse) { /* (rotated: the sparse part of W V^T's first cut, in the coordinates of V x) */
        mpq_packed U = A;
        memset(&U.rot, 0, sizeof U.rot);
        mpq_packed_dequantize(&U, 0, Wd);
        if (c->rot) mpq_rotation_apply(&rot, W, m, 0);
        for (size_t k = 0; k < (size_t)m * n; k++) mask[k] = synth_unif(r) < 0.01;
        mpq_packed_free(&A);
        ok = mpq_sparse_from_mask(W, Wd, mask, m, n, &S) == MPQ_OK;
        if (c->rot) mpq_rotation_apply(&rot, W, m, 1); /* back to W, to float rounding (only the input changes) */
        d.sparse = &S;
        ok = ok && mpq_pack_alloc(&d, W, &A) == MPQ_OK;
    }
    mpq_packed U = A; /* what the kernels multiply: the matrix without its rotation, on V x */
    memset(&U.rot, 0, sizeof U.rot);
    if (!ok) {
        report(0, "pack %dx%d", m, n);
        return 0;
    }
    void *h = NULL;
    mpq_status st = be->upload(be->ctx, &A, &h);
    report(st == MPQ_OK, "upload %s %dx%d group %d%s", c->format == 2 ? "mxint" : "bitplane", m, n, c->G,
           c->rot ? " rotated" : "");
    /* 48 | 49: the GEMM kernel's 64-vector tile | two of 32; 128 | 129: the GEMM kernel | fp16 + cuBLAS */
    static const int batches[] = {1,  2,  3,  4,  5,  6,  7,  8,   9,   10,  11,  12,  13,   14,  15,
                                  16, 17, 24, 33, 48, 49, 64, 100, 128, 129, 256, 512, 1000, 2048};
    /* the MMA kernel's matrices: groups and the last group of whole quads, and
       groups whose activations for 32 vectors fit its 64 KB (4 * 32 * G bytes) */
    const int last = n - (n - 1) / c->G * c->G, mma = c->G % 32 == 0 && last % 32 == 0 && c->G <= 512;
    for (int skip = 0; skip <= (fp16 ? 0 : 2) && st == MPQ_OK; skip++) {
        mpq_packed_dequantize(&U, skip, Wd);
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            const int batch = batches[bi];
            if (skip && batch > 8 && batch != 11 && batch != 16 && batch != 64) continue; /* 64: the fp16 path */
            if (fp16 && batch != 1 && batch != 5 && batch != 17 && batch != 64) continue;
            if (skip && batch == 33) continue;
            if (batch > 17 && (double)m * n * batch > (batch > 300 ? 6e8 : 7e8)) continue; /* the reference's time */
            float *x = malloc(sizeof(float) * batch * n), *y = malloc(sizeof(float) * batch * m),
                  *y2 = malloc(sizeof(float) * batch * m);
            double *ref = malloc(sizeof(double) * batch * m), *mag = malloc(sizeof(double) * batch * m),
                   *magr = malloc(sizeof(double) * batch * m);
            for (int v = 0; v < batch; v++) synth_activations(r, x + (size_t)v * n, n);
            float *xr = malloc(sizeof(float) * batch * n);
            memcpy(xr, x, sizeof(float) * batch * n);
            if (c->rot) mpq_rotation_apply(&rot, xr, batch, 0);
            if (dry) {
                memset(ref, 0, sizeof(double) * batch * m), memset(mag, 0, sizeof(double) * batch * m);
                memset(magr, 0, sizeof(double) * batch * m);
            } else {
                gemv_ref(&A, x, ref, batch, skip); /* rotated: in float64, W~ times V x */
                magnitude(Wd, xr, c->perm ? cs : NULL, m, n, batch, mag, magr);
            }
            float *dx, *dy;
            cudaMalloc((void **)&dx, sizeof(float) * batch * n);
            cudaMalloc((void **)&dy, sizeof(float) * batch * m);
            cudaMemcpy(dx, x, sizeof(float) * batch * n, cudaMemcpyHostToDevice);
            for (int k = 0; k < batch * m; k++) y[k] = NAN;
            cudaMemcpy(dy, y, sizeof(float) * batch * m, cudaMemcpyHostToDevice);
            /* a copy from pageable memory may return before its DMA lands, and
               the backend's stream (non-blocking) does not wait for the legacy
               stream: without this the kernels could read stale x or y */
            cudaDeviceSynchronize();
            mpq_gemv_opts o = {0};
            o.skip_planes = skip;
            mpq_status g1 = be->gemv(be->ctx, h, dx, dy, batch, &o);
            mpq_status sy = be->synchronize(be->ctx);
            cudaMemcpy(y, dy, sizeof(float) * batch * m, cudaMemcpyDeviceToHost);
            for (int k = 0; k < batch * m; k++) y2[k] = NAN;
            mpq_status g2 = be->gemv(be->ctx, h, x, y2, batch, &o); /* host pointers */
            double worst = 0;
            int bad = -1, same = 1, nbig = 0, nbad = 0, firstbad[6];
            /* the GEMM kernel: exact weights times fp16 activations (scaled by a power of two per
               group and vector: no overflow) */
            const int gemm = !fp16 && mma && c->G <= 256 && batch >= MPQ_CUDA_GEMM_BATCH && batch <= MPQ_CUDA_GEMM_MAX;
            /* else dequantized to fp16, cuBLAS; up to MPQ_CUDA_MMA_MAX the MMA kernel in pieces of 16 */
            const int f16 =
                !gemm && (fp16 || (batch > 16 && !(mma && batch <= MPQ_CUDA_MMA_MAX)) || (batch > 8 && !mma));
            /* past the fp16 range on the fp16 path (or where it may replace the GEMM kernel) */
            const int maybe16 = f16 || (gemm && smem_sm < 228 * 1024);
            char *big = calloc((size_t)batch, 1);
            for (int v = 0; v < batch; v++) nbig += big[v] = maybe16 && past_f16(xr + (size_t)v * n, n);
            for (int k = 0; k < batch * m; k++) {
                if (memcmp(&y[k], &y2[k], 4)) same = 0;
                if (big[k / m] && !isfinite(y[k])) continue;
                double e = fabs((double)y[k] - ref[k]);
                double tol = (f16 || gemm ? ldexp(mag[k], -9) : (n + 64) * ldexp(magr[k], -23)) + 1e-30;
                if (!(e <= tol)) {
                    if (bad < 0) bad = k;
                    if (nbad < 6) firstbad[nbad] = k;
                    nbad++;
                }
                if (e / (mag[k] + 1e-30) > worst) worst = e / (mag[k] + 1e-30);
            }
            report(g1 == MPQ_OK && sy == MPQ_OK && bad < 0,
                   "%s%s %dx%d G%d br%d%s%s%s skip %d batch %d%s: worst |err|/sum|wx| %.2e%s%s",
                   fp16 ? "fp16 weights: " : "", c->format == 2 ? "mxint" : "bitplane", m, n, c->G, c->br,
                   c->perm ? " perm+scale" : "", c->sparse ? " sparse" : "", c->rot ? " rotated" : "", skip, batch,
                   gemm ? " (GEMM)" : "", worst, nbig ? " (a vector past the fp16 range)" : "",
                   bad < 0 ? "" : " (FAILED)");
            if (bad >= 0 && !dry) {
                printf("# first bad output %d: %.9g vs %.9g (sum |wx| %.3g); %d bad of %d:", bad, (double)y[bad],
                       ref[bad], mag[bad], nbad, batch * m);
                for (int i = 0; i < nbad && i < 6; i++)
                    printf(" vector %d row %d (%.6g)", firstbad[i] / m, firstbad[i] % m, (double)y[firstbad[i]]);
                printf("\n");
            }
            report(g2 == MPQ_OK && same, "  host pointers give the same bits");
            { /* and pinned host memory (x and y in one allocation), by DMA */
                const size_t xb = sizeof(float) * batch * n, pb = xb + sizeof(float) * batch * m;
                float *px = malloc(pb), *py = px + (size_t)batch * n;
                memcpy(px, x, xb);
                for (int k = 0; k < batch * m; k++) py[k] = NAN;
                const mpq_status p1 = be->pin(be->ctx, px, pb);
                const mpq_status g3 = be->gemv(be->ctx, h, px, py, batch, &o);
                if (p1 == MPQ_OK) be->unpin(be->ctx, px);
                report(p1 == MPQ_OK && g3 == MPQ_OK && !memcmp(py, y, sizeof(float) * batch * m),
                       "  pinned host memory gives the same bits");
                free(px);
            }
            cudaFree(dx), cudaFree(dy);
            free(x), free(xr), free(y), free(y2), free(ref), free(mag), free(magr), free(big);
        }
    }
    for (int skip = 0; skip <= 1 && !fp16 && st == MPQ_OK; skip++) {
        char what[96];
        snprintf(what, sizeof what, "%s %dx%d G%d br%d%s%s%s", c->format == 2 ? "mxint" : "bitplane", m, n, c->G, c->br,
                 c->perm ? " perm+scale" : "", c->sparse ? " sparse" : "", c->rot ? " rotated" : "");
        mpq_packed_dequantize(&U, skip, Wd);
        run_a8(be, h, &U, Wd, mma, skip, r, what, c->rot ? &rot : NULL);
    }
    if (st == MPQ_OK && fp16) {
        float *x = calloc((size_t)n, sizeof(float)), *y = malloc(sizeof(float) * m);
        mpq_gemv_opts o = {0};
        o.skip_planes = 1;
        report(be->gemv(be->ctx, h, x, y, 1, &o) == MPQ_ERR_UNSUPPORTED,
               "  fp16 weights, skip_planes 1: MPQ_ERR_UNSUPPORTED");
        o.skip_planes = 0, o.a8 = 1;
        report(be->gemv(be->ctx, h, x, y, 1, &o) == MPQ_ERR_UNSUPPORTED, "  fp16 weights, a8: MPQ_ERR_UNSUPPORTED");
        free(x), free(y);
    }
    if (st == MPQ_OK) be->release(be->ctx, h);
    mpq_sparse_free(&S);
    mpq_packed_free(&A);
    mpq_rotation_free(&rot);
    free(W), free(Wd), free(cs), free(bits), free(mask), free(prow), free(pcol);
    return 1;
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && !strcmp(argv[1], "--quick"); /* small cases only (for the sanitizers) */
    int ndev = mpq_cuda_device_count();
    mpq_backend be;
    mpq_status st = mpq_cuda_backend(0, &be);
    if (ndev == 0) {
        printf("1..3\n");
        report(st == MPQ_ERR_NODEVICE, "no device: mpq_cuda_backend says MPQ_ERR_NODEVICE");
        report(mpq_cuda_backend_fp16(0, &be) == MPQ_ERR_NODEVICE, "no device: mpq_cuda_backend_fp16 too");
        printf("ok 3 - kernels against the CPU reference # SKIP no CUDA device on this machine\n");
        return nfail ? 1 : 0;
    }
    report(st == MPQ_OK, "backend on device 0");
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) smem_sm = prop.sharedMemPerMultiprocessor;
    if (st != MPQ_OK) {
        printf("1..%d\n", ntest);
        return 1;
    }
    report((be.caps & MPQ_CAP_BITPLANE) && (be.caps & MPQ_CAP_HOST_MEMORY),
           "caps: bit-plane GEMV, host and device pointers");
    mpq_backend other;
    report(mpq_cuda_backend(ndev, &other) == MPQ_ERR_NODEVICE, "device index past the count: MPQ_ERR_NODEVICE");
    synth_rng r = {20261122};
    const char *only = getenv("MPQ_CHECK_CASES");
    int k0 = 0, k1 = (int)(sizeof cases / sizeof cases[0]) - 1;
    if (only && sscanf(only, "%d-%d", &k0, &k1) == 1) k1 = k0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0] && (int)k <= k1; k++) {
        if (quick && (size_t)cases[k].m * cases[k].n > 600000) continue;
        dry = (int)k < k0;
        run_case(&be, &cases[k], &r, 0);
        dry = 0;
    }
    if (only) {
        mpq_cuda_backend_destroy(&be);
        printf("1..%d\n# %d passed, %d failed\n", ntest, ntest - nfail, nfail);
        return nfail ? 1 : 0;
    }
    /* the fp16-weights baseline of end-to-end timings, on every fifth case */
    mpq_backend be16 = {0};
    report(mpq_cuda_backend_fp16(0, &be16) == MPQ_OK && !strcmp(be16.name, "cuda-fp16"),
           "fp16-weights backend on device 0");
    for (size_t k = 0; be16.ctx && k < sizeof cases / sizeof cases[0]; k += 5) {
        if (quick && (size_t)cases[k].m * cases[k].n > 600000) continue;
        run_case(&be16, &cases[k], &r, 1);
    }
    report(mpq_cuda_stream(&be16) != NULL, "fp16-weights backend: its stream");
    mpq_cuda_backend_destroy(&be16);
    /* several maps of one input in one call (gemv_n): as many calls of gemv, bit for bit */
    {
        enum { N = 1024 };
        const int rows[3] = {600, 200, 600}, bw[2] = {3, 4};
        mpq_packed P[2];
        memset(P, 0, sizeof P);
        void *hs[3] = {NULL, NULL, NULL};
        mpq_status st = MPQ_OK;
        for (int k = 0; k < 2 && st == MPQ_OK; k++) {
            float *W = malloc(sizeof(float) * rows[k] * N);
            synth_weights(&r, W, rows[k], N);
            mpq_bitplane_desc d = {0};
            d.rows = rows[k], d.cols = N, d.uniform_bits = bw[k];
            st = mpq_pack_alloc(&d, W, &P[k]);
            if (st == MPQ_OK) st = be.upload(be.ctx, &P[k], &hs[k]);
            free(W);
        }
        hs[2] = hs[0]; /* a map twice */
        report(st == MPQ_OK, "gemv_n: three maps of 1024 columns uploaded");
        const int batches[] = {1, 5, 17, 64};
        for (size_t bi = 0; st == MPQ_OK && bi < sizeof batches / sizeof batches[0]; bi++)
            for (int a8 = 0; a8 < 2; a8++) {
                const int B = batches[bi];
                const size_t xn = (size_t)B * N, yn = (size_t)B * (rows[0] + rows[1] + rows[2]);
                float *x = malloc(sizeof(float) * xn), *want = malloc(sizeof(float) * yn);
                float *px = malloc(sizeof(float) * (xn + yn)), *got = px + xn;
                synth_activations(&r, x, (int)xn);
                memcpy(px, x, sizeof(float) * xn);
                mpq_gemv_opts o = {0};
                o.a8 = a8;
                float *yw[3], *yg[3];
                int ok = 1;
                for (int k = 0, at = 0; k < 3; at += B * rows[k], k++) {
                    yw[k] = want + at, yg[k] = got + at;
                    ok &= be.gemv(be.ctx, hs[k], x, yw[k], B, &o) == MPQ_OK;
                }
                for (size_t k = 0; k < yn; k++) got[k] = NAN;
                const mpq_status g1 = be.gemv_n(be.ctx, 3, hs, px, yg, B, &o);
                report(ok && g1 == MPQ_OK && !memcmp(got, want, sizeof(float) * yn),
                       "gemv_n: batch %d%s, host memory: the bits of three gemv calls", B, a8 ? " a8" : "");
                for (size_t k = 0; k < yn; k++) got[k] = NAN;
                const mpq_status p1 = be.pin(be.ctx, px, sizeof(float) * (xn + yn));
                const mpq_status g2 = be.gemv_n(be.ctx, 3, hs, px, yg, B, &o);
                if (p1 == MPQ_OK) be.unpin(be.ctx, px);
                report(p1 == MPQ_OK && g2 == MPQ_OK && !memcmp(got, want, sizeof(float) * yn),
                       "  pinned, the same bits");
                float *d = NULL, *dy[3];
                cudaError_t e = cudaMalloc((void **)&d, sizeof(float) * (xn + yn));
                for (int k = 0, at = 0; k < 3; at += B * rows[k], k++) dy[k] = d + xn + at;
                if (e == cudaSuccess) e = cudaMemcpy(d, x, sizeof(float) * xn, cudaMemcpyHostToDevice);
                const mpq_status g3 = e == cudaSuccess ? be.gemv_n(be.ctx, 3, hs, d, dy, B, &o) : MPQ_ERR_DEVICE;
                for (size_t k = 0; k < yn; k++) got[k] = NAN;
                const mpq_status sy = g3 == MPQ_OK ? be.synchronize(be.ctx) : g3; /* asynchronous on its stream */
                if (sy == MPQ_OK) e = cudaMemcpy(got, d + xn, sizeof(float) * yn, cudaMemcpyDeviceToHost);
                report(sy == MPQ_OK && e == cudaSuccess && !memcmp(got, want, sizeof(float) * yn),
                       "  device memory, the same bits");
                cudaFree(d);
                free(x), free(want), free(px);
            }
        { /* bad calls */
            float W[64 * 32], x[N], y[600], *ys[3] = {y, y, y};
            synth_weights(&r, W, 64, 32);
            mpq_bitplane_desc d = {0};
            d.rows = 64, d.cols = 32, d.group = 32;
            mpq_packed A;
            memset(&A, 0, sizeof A);
            void *hn = NULL, *two[2] = {hs[0], NULL};
            memset(x, 0, sizeof x);
            report(mpq_pack_alloc(&d, W, &A) == MPQ_OK && be.upload(be.ctx, &A, &two[1]) == MPQ_OK,
                   "gemv_n: a map of 32 columns");
            report(be.gemv_n(be.ctx, 2, two, x, ys, 1, NULL) == MPQ_ERR_SIZE,
                   "gemv_n: columns that differ: MPQ_ERR_SIZE");
            report(be.gemv_n(be.ctx, 0, hs, x, ys, 1, NULL) == MPQ_ERR_ARG &&
                       be.gemv_n(be.ctx, 1, &hn, x, ys, 1, NULL) == MPQ_ERR_ARG &&
                       be.gemv_n(be.ctx, 3, hs, NULL, ys, 1, NULL) == MPQ_ERR_ARG &&
                       be.gemv_n(be.ctx, 3, hs, x, NULL, 1, NULL) == MPQ_ERR_ARG,
                   "gemv_n: no maps, no handle, no x or no y: MPQ_ERR_ARG");
            report(be.gemv_n(be.ctx, 3, hs, x, ys, 0, NULL) == MPQ_ERR_SIZE, "gemv_n: batch 0: MPQ_ERR_SIZE");
            float *ov[3] = {y, x + 8, y};
            report(be.gemv_n(be.ctx, 3, hs, x, ov, 1, NULL) == MPQ_ERR_ARG, "gemv_n: a y overlapping x: MPQ_ERR_ARG");
            if (two[1]) be.release(be.ctx, two[1]);
            mpq_packed_free(&A);
        }
        for (int k = 0; k < 2; k++) {
            if (hs[k]) be.release(be.ctx, hs[k]);
            mpq_packed_free(&P[k]);
        }
    }
    /* bad input */
    {
        void *h = NULL;
        report(be.upload(be.ctx, NULL, &h) == MPQ_ERR_ARG, "upload NULL: MPQ_ERR_ARG");
        float W[64 * 32], x[32], y[64];
        synth_weights(&r, W, 64, 32);
        synth_activations(&r, x, 32);
        mpq_bitplane_desc d = {0};
        d.rows = 64, d.cols = 32, d.group = 32;
        mpq_packed A;
        mpq_pack_alloc(&d, W, &A);
        be.upload(be.ctx, &A, &h);
        mpq_gemv_opts o = {0};
        report(be.gemv(be.ctx, h, x, y, 0, &o) == MPQ_ERR_SIZE, "batch 0: MPQ_ERR_SIZE");
        o.skip_planes = -1;
        report(be.gemv(be.ctx, h, x, y, 1, &o) == MPQ_ERR_ARG, "skip_planes -1: MPQ_ERR_ARG");
        o.skip_planes = 0, o.a8 = 2;
        report(be.gemv(be.ctx, h, x, y, 1, &o) == MPQ_ERR_ARG, "a8 2: MPQ_ERR_ARG");
        report(be.gemv(be.ctx, NULL, x, y, 1, NULL) == MPQ_ERR_ARG, "no handle: MPQ_ERR_ARG");
        report(be.pin(be.ctx, NULL, 4096) == MPQ_ERR_ARG && be.pin(be.ctx, x, 0) == MPQ_ERR_ARG &&
                   be.pin(NULL, x, 4) == MPQ_ERR_ARG,
               "pin: no memory, no bytes or no backend: MPQ_ERR_ARG");
        be.unpin(be.ctx, NULL); /* nothing happens */
        {                       /* two ranges in one page, each pinned and unpinned on its own */
            char *pg = aligned_alloc(4096, 8192);
            const mpq_status a = be.pin(be.ctx, pg, 1024), b = be.pin(be.ctx, pg + 2048, 1024);
            report(a == MPQ_OK && b == MPQ_OK, "pin: two ranges in one page");
            if (a == MPQ_OK) be.unpin(be.ctx, pg);
            if (b == MPQ_OK) be.unpin(be.ctx, pg + 2048);
            free(pg);
        }
        if (!quick) { /* CUDA errors on purpose: not in the --quick runs under compute-sanitizer, which counts them */
            char *pg = malloc(4096);
            const mpq_status a = be.pin(be.ctx, pg, 4096), b = be.pin(be.ctx, pg, 4096);
            report(a == MPQ_OK && b == MPQ_ERR_ARG, "pin: a range pinned already: MPQ_ERR_ARG");
            if (a == MPQ_OK) be.unpin(be.ctx, pg);
            be.unpin(be.ctx, pg); /* pinned no longer: nothing happens */
            free(pg);
        }
        float *dxy = NULL;
        cudaMalloc((void **)&dxy, sizeof(float) * 96); /* x: 32, y: 64, overlapping by 16 */
        report(dxy && be.gemv(be.ctx, h, dxy, dxy + 16, 1, NULL) == MPQ_ERR_ARG, "y overlapping x: MPQ_ERR_ARG");
        cudaFree(dxy);
        be.release(be.ctx, h);
        mpq_packed_free(&A);
    }
    mpq_cuda_backend_destroy(&be);
    report(be.ctx == NULL, "destroyed");
    printf("1..%d\n", ntest);
    printf("# %d passed, %d failed\n", ntest - nfail, nfail);
    return nfail ? 1 : 0;
}
