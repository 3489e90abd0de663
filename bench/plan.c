/* bench/plan: the SFMP planner on a synthetic 32-layer model of 4096 x 4096
   layers (512 M weights of salience, 2 GiB as float32), with and without
   row/column reordering. Prints the planning time and the salience it reads
   per second, against a plain read of the same salience in the same run.

   usage: plan [--layers N] [--dim D] */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "bench_util.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    int nl = 32, dim = 4096;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--layers") && a + 1 < argc)
            nl = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--dim") && a + 1 < argc)
            dim = atoi(argv[++a]);
        else {
            fprintf(stderr, "usage: %s [--layers N] [--dim D]\n", argv[0]);
            return 2;
        }
    }
    if (nl < 1 || dim < 8) return 2;
    const size_t per = (size_t)dim * dim;
    mpq_sfmp_layer *L = (mpq_sfmp_layer *)malloc(sizeof(mpq_sfmp_layer) * (size_t)nl);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int l = 0; l < nl; l++) { /* heavy-tailed positive salience with salient rows and columns */
        float *S = (float *)malloc(sizeof(float) * per);
        if (!S) return 1;
        for (size_t k = 0; k < per; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            float u = (float)((x >> 40) + 1) * (1.0f / 16777217.0f);
            S[k] = 1e-6f * u * u * u * u; /* a long tail */
        }
        for (int k = 0; k < dim / 64; k++) {
            int i = (int)((x >> 8) % (uint64_t)dim), j = (int)((x >> 28) % (uint64_t)dim);
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            for (int q = 0; q < dim; q++) S[(size_t)i * dim + q] *= 20.0f, S[(size_t)q * dim + j] *= 20.0f;
        }
        L[l].S = S, L[l].rows = dim, L[l].cols = dim;
    }
    /* a plain read of the same salience, for the ratio */
    double t0 = bench_now(), sink = 0;
    for (int l = 0; l < nl; l++) {
        float acc[16] = {0};
        for (size_t k = 0; k + 16 <= per; k += 16)
            for (int q = 0; q < 16; q++) acc[q] += L[l].S[k + q];
        for (int q = 0; q < 16; q++) sink += acc[q];
    }
    const double tread = bench_now() - t0, gb = 4.0 * per * nl / 1e9;
    printf("mpq bench/plan: SFMP on %d layers of %dx%d (%.2f GB of salience), block 16 x 128\n", nl, dim, dim, gb);
    printf("plain read of the salience: %.2f s (%.1f GB/s, sum %g)\n", tread, gb / tread, sink);
    const double bpws[] = {2.5, 3.25};
    const char *names[] = {"none", "rows", "cols", "both"};
    for (int ro = 0; ro <= MPQ_REORDER_BOTH; ro += 3)
        for (int k = 0; k < 2; k++) {
            mpq_sfmp_desc d;
            memset(&d, 0, sizeof d);
            d.bpw = bpws[k];
            d.reorder = ro;
            mpq_plan p;
            t0 = bench_now();
            mpq_status st = mpq_plan_sfmp(L, nl, &d, &p);
            double tp = bench_now() - t0;
            if (st != MPQ_OK) {
                fprintf(stderr, "plan: %s\n", mpq_status_str(st));
                return 1;
            }
            printf("bpw %.2f reorder %-4s: %.2f s (%.1f GB/s of salience, %.2fx the plain read), achieved %.4f bpw\n",
                   bpws[k], names[ro], tp, gb / tp, tp / tread, p.bpw);
            mpq_plan_free(&p);
        }
    for (int l = 0; l < nl; l++) free((void *)L[l].S);
    free(L);
    return 0;
}
