/* quickstart: float matrix -> packed 3-bit matrix -> GEMV, the README's
   example as a program. */
#define MPQ_IMPLEMENTATION
#include "mpq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    enum { M = 256, N = 1024 };
    float *W = malloc(sizeof(float) * M * N), x[N], y[M];
    for (int k = 0; k < M * N; k++) W[k] = sinf(0.37f * (float)k) * 0.05f; /* any float matrix */
    for (int j = 0; j < N; j++) x[j] = cosf(0.11f * (float)j);

    mpq_bitplane_desc d = {0}; /* zero = defaults: group 128, block_rows 16 */
    d.rows = M;
    d.cols = N;
    d.uniform_bits = 3;
    mpq_packed A;
    mpq_status st = mpq_pack_alloc(&d, W, &A);
    if (st != MPQ_OK) {
        fprintf(stderr, "pack: %s\n", mpq_status_str(st));
        return 1;
    }
    mpq_gemv_opts o = {0}; /* o.skip_planes = 1 would use only the top 2 bits */
    st = mpq_gemv(&A, x, y, 1, &o, NULL, 0); /* NULL workspace: the call allocates */
    if (st != MPQ_OK) {
        fprintf(stderr, "gemv: %s\n", mpq_status_str(st));
        return 1;
    }
    double e = 0, n = 0;
    for (int i = 0; i < M; i++) {
        double r = 0;
        for (int j = 0; j < N; j++) r += (double)W[(size_t)i * N + j] * x[j];
        e += (y[i] - r) * (y[i] - r);
        n += r * r;
    }
    printf("packed %d x %d at %.2f bpw (%.2f with scales and zeros) into %zu bytes; "
           "relative output error %.4f\n",
           M, N, mpq_packed_bpw(&A, 0), mpq_packed_bpw(&A, 1), A.bytes, sqrt(e / n));
    mpq_packed_free(&A);
    free(W);
    return 0;
}
