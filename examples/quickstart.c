/* quickstart.c: a float matrix packed at 3 bits per weight, then y = W x. */
#define MPQ_IMPLEMENTATION /* in exactly one .c file; elsewhere just #include "mpq.h" */
#include "mpq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    enum { M = 256, N = 1024 };
    float *W = malloc(sizeof(float) * M * N), x[N], y[M];
    if (!W) return 1;
    for (int k = 0; k < M * N; k++) W[k] = sinf(0.37f * (float)k) * 0.05f; /* any float matrix, row-major */
    for (int j = 0; j < N; j++) x[j] = cosf(0.11f * (float)j);

    mpq_bitplane_desc d = {0}; /* zero fields mean defaults: group 128, block_rows 16 */
    d.rows = M;
    d.cols = N;
    d.uniform_bits = 3; /* or d.bits: a width 1..8 per block_rows x group block */
    mpq_packed A;
    mpq_status st = mpq_pack_alloc(&d, W, &A); /* quantize + pack */
    if (st != MPQ_OK) {
        fprintf(stderr, "pack: %s\n", mpq_status_str(st));
        return 1;
    }
    mpq_gemv_opts o = {0}; /* o.skip_planes = 1: the same bytes at one bit less */
    mpq_path path;
    mpq_gemv_path(&A, &o, &path);            /* the kernel this CPU runs */
    st = mpq_gemv(&A, x, y, 1, &o, NULL, 0); /* y = W x; pass a workspace in hot loops */
    if (st != MPQ_OK) {
        fprintf(stderr, "gemv: %s\n", mpq_status_str(st));
        return 1;
    }
    double e = 0, r2 = 0; /* against the float product */
    for (int i = 0; i < M; i++) {
        double r = 0;
        for (int j = 0; j < N; j++) r += (double)W[(size_t)i * N + j] * x[j];
        e += (y[i] - r) * (y[i] - r);
        r2 += r * r;
    }
    printf("%d x %d at %.2f bits per weight (%zu bytes), path %s: relative error %.4f\n", M, N, mpq_packed_bpw(&A, 1),
           A.bytes, mpq_path_name(path), sqrt(e / r2));
    mpq_packed_free(&A);
    free(W);
    return 0;
}
