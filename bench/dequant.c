/* bench_dequant - how fast packed matrices decode to float32: one row at a
   time (mpq_packed_dequantize_row, an embedding lookup) and the whole
   matrix (mpq_packed_dequantize), in ns per weight, at 3, 4 and 8 bits in
   groups of 128 on LLM-like weights (synth.h), against copying the same
   floats (memcpy of a decoded row) in the same run. One thread; medians of
   five passes, each over every row in a shuffled order.

     bench_dequant [ROWSxCOLS]      (default 4096x8192) */
#define _XOPEN_SOURCE 700 /* clock_gettime, in bench_util.h */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "bench_util.h"
#include "synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile float sink; /* what the passes decoded is read */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median5(double *t)
{
    qsort(t, 5, sizeof *t, cmp_double);
    return t[2];
}

int main(int argc, char **argv)
{
    int m = 4096, n = 8192;
    if (argc > 2 ||
        (argc == 2 && (sscanf(argv[1], "%dx%d", &m, &n) != 2 || m < 1 || n < 8 || m > 65536 || n > 65536))) {
        fprintf(stderr, "usage: bench_dequant [ROWSxCOLS] (each 1..65536, at least 8 columns)\n");
        return 1;
    }
    const size_t mn = (size_t)m * (size_t)n;
    float *W = (float *)malloc(sizeof(float) * mn), *Wd = (float *)malloc(sizeof(float) * mn);
    float *row = (float *)malloc(sizeof(float) * (size_t)n);
    uint32_t *order = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)m);
    if (!W || !Wd || !row || !order) {
        fprintf(stderr, "bench_dequant: out of memory\n");
        return 2;
    }
    synth_rng r = {20261203};
    synth_weights(&r, W, m, n);
    synth_perm(&r, order, m);
    printf("bench_dequant %dx%d, groups of 128, one thread, ns per weight (median of 5 passes over every row)\n", m, n);
    printf("| bits | row | matrix | memcpy of a row | row / memcpy |\n| ---: | ---: | ---: | ---: | ---: |\n");
    const int widths[3] = {3, 4, 8};
    for (int wi = 0; wi < 3; wi++) {
        mpq_bitplane_desc d = {0};
        d.rows = m, d.cols = n, d.uniform_bits = widths[wi], d.group = 128;
        mpq_packed A;
        mpq_status st = mpq_pack_alloc(&d, W, &A);
        if (st != MPQ_OK) {
            fprintf(stderr, "bench_dequant: %s\n", mpq_status_str(st));
            return 3;
        }
        double tr[5], tm[5], tc[5];
        for (int p = 0; p < 5 && st == MPQ_OK; p++) {
            double t0 = bench_now();
            for (int i = 0; i < m && st == MPQ_OK; i++) st = mpq_packed_dequantize_row(&A, 0, (int)order[i], row);
            sink = row[p % n];
            double t1 = bench_now();
            if (st == MPQ_OK) st = mpq_packed_dequantize(&A, 0, Wd);
            double t2 = bench_now();
            for (int i = 0; i < m; i++) memcpy(row, Wd + (size_t)order[i] * (size_t)n, sizeof(float) * (size_t)n);
            sink = row[(p + 1) % n];
            double t3 = bench_now();
            tr[p] = 1e9 * (t1 - t0) / (double)mn, tm[p] = 1e9 * (t2 - t1) / (double)mn,
            tc[p] = 1e9 * (t3 - t2) / (double)mn;
        }
        if (st != MPQ_OK) {
            fprintf(stderr, "bench_dequant: %s\n", mpq_status_str(st));
            return 3;
        }
        const double a = median5(tr), b = median5(tm), c = median5(tc);
        printf("| %d | %.2f | %.2f | %.3f | %.1f |\n", widths[wi], a, b, c, a / c);
        mpq_packed_free(&A);
    }
    free(W), free(Wd), free(row), free(order);
    return 0;
}
