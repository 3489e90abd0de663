/* MPQ_MALLOC / MPQ_FREE: a program that defines them sees every allocation
   of the header's code go through them, each block freed once (packing, a
   GEMV that allocates its own workspace). Built with
   MPQ_HALF_ALLOCATOR defined, only MPQ_MALLOC is given: that must not
   compile (test/run.sh checks that it does not). */
#include <stdio.h>
#include <stdlib.h>

static long live, total;
static void *count_malloc(size_t n)
{
    void *p = malloc(n);
    if (p) live++, total++;
    return p;
}
static void count_free(void *p)
{
    if (p) live--;
    free(p);
}
#define MPQ_MALLOC(sz) count_malloc(sz)
#ifndef MPQ_HALF_ALLOCATOR
#define MPQ_FREE(p) count_free(p)
#endif
#define MPQ_IMPLEMENTATION
#include "mpq.h"

int main(void)
{
    enum { M = 40, N = 300 };
    static float W[M * N], x[N], y[M];
    for (int k = 0; k < M * N; k++) W[k] = (float)((k * 7919) % 201 - 100) / 100.0f;
    for (int j = 0; j < N; j++) x[j] = (float)(j % 13) - 6.0f;
    mpq_bitplane_desc d = {0};
    d.rows = M, d.cols = N, d.uniform_bits = 3;
    mpq_packed A;
    if (mpq_pack_alloc(&d, W, &A) != MPQ_OK || mpq_gemv(&A, x, y, 1, NULL, NULL, 0) != MPQ_OK) return 1;
    const long after_gemv = total;
    mpq_packed_free(&A);
    printf("%ld allocations, %ld live\n", total, live);
    return after_gemv >= 2 && live == 0 ? 0 : 1; /* the packed buffer and the GEMV's workspace at least */
}
