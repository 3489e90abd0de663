/* bench_util.h - timing, the machine's read bandwidth, a float32 GEMV
   baseline and the timing of mpq_gemv itself, shared by the benchmarks and
   the `mpq bench` command. */
#ifndef MPQ_BENCH_UTIL_H
#define MPQ_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/resource.h>
#include <unistd.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "mpq.h"

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double bench_median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(double), bench_cmp);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Read bandwidth (bytes/s): the best of several passes over a buffer far
   larger than the caches, split over `threads` threads, each thread summing
   into 16 partial sums (the loop shape of the float32 GEMV below, which the
   compiler vectorises), so that memory, not the adder, is the limit. */
static inline double bench_read_bandwidth(int threads, int quick)
{
    const size_t n = (size_t)(quick ? 64 : 128) << 20; /* floats: 256 or 512 MiB */
    float *a = (float *)malloc(n * sizeof(float));
    if (!a) return 0.0;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7); /* first touch by the readers */
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = bench_now();
        float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
#endif
        for (size_t blk = 0; blk < n / 4096; blk++) {
            float acc[16] = {0};
            const float *p = a + blk * 4096;
            for (int j = 0; j < 4096; j += 16)
                for (int k = 0; k < 16; k++) acc[k] += p[j + k];
            for (int k = 0; k < 16; k++) total += acc[k];
        }
        double dt = bench_now() - t0;
        sink += total;
        double bw = (double)(n * sizeof(float)) / dt;
        best = bw > best ? bw : best;
    }
    free(a);
    return best;
}

/* Plain float32 GEMV y = W x, vectorised by the compiler, OpenMP over rows. */
static inline void bench_f32_gemv(const float *W, const float *x, float *y, int m, int n, int threads)
{
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int i = 0; i < m; i++) {
        const float *w = W + (size_t)i * n;
        float s[16] = {0};
        int j = 0;
        for (; j + 16 <= n; j += 16)
            for (int k = 0; k < 16; k++) s[k] += w[j + k] * x[j + k];
        float t = 0.0f;
        for (; j < n; j++) t += w[j] * x[j];
        for (int k = 0; k < 16; k++) t += s[k];
        y[i] = t;
    }
}

/* Median microseconds of the float32 GEMV, rotating over copies of W so
   that the caches never hold the one being read. */
static inline double bench_f32_gemv_us(const float *W, const float *x, float *y, int m, int n, int threads,
                                       size_t rotate_bytes, int quick)
{
    size_t bytes = sizeof(float) * (size_t)m * (size_t)n;
    int ncopies = (int)(rotate_bytes / bytes) + 2;
    float **C = (float **)malloc(sizeof(float *) * (size_t)ncopies);
    for (int c = 0; c < ncopies; c++) {
        C[c] = (float *)malloc(bytes);
        memcpy(C[c], W, bytes);
    }
    int reps = quick ? 10 : 30;
    double *ts = (double *)malloc(sizeof(double) * (size_t)reps);
    for (int c = 0; c < ncopies; c++) bench_f32_gemv(C[c], x, y, m, n, threads);
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        bench_f32_gemv(C[r % ncopies], x, y, m, n, threads);
        ts[r] = bench_now() - t0;
    }
    double us = bench_median(ts, reps) * 1e6;
    for (int c = 0; c < ncopies; c++) free(C[c]);
    free(C);
    free(ts);
    return us;
}

/* Median microseconds of one mpq_gemv at each batch of batches[0..nb-1]
   (into us[]), one product of each batch in turn, rotating over copies of
   A's buffer (rotate_bytes of them in all, at least 2 and at most 256
   copies) so that the caches do not hold the one being read; every copy is
   used once before the timing. x and y hold the largest batch; opts as
   mpq_gemv takes them (NULL: defaults). MPQ_OK, or the first error (us[]
   then unwritten). */
static inline mpq_status bench_gemv_us(const mpq_packed *A, const float *x, float *y, const int *batches, int nb,
                                       const mpq_gemv_opts *opts, size_t rotate_bytes, int reps, double *us)
{
    if (!A || nb < 1 || reps < 1) return MPQ_ERR_ARG;
    int ncopies = (int)(rotate_bytes / A->bytes) + 2, bmax = 1, made = 0;
    if (ncopies > 256) ncopies = 256;
    for (int k = 0; k < nb; k++) bmax = batches[k] > bmax ? batches[k] : bmax;
    const size_t wb = mpq_gemv_work_bytes(A, bmax);
    mpq_packed *C = (mpq_packed *)calloc((size_t)ncopies, sizeof *C);
    void *work = mpq_aligned_alloc(wb);
    double *ts = (double *)malloc(sizeof(double) * (size_t)reps * (size_t)nb);
    mpq_status st = C && work && ts ? MPQ_OK : MPQ_ERR_NOMEM;
    for (; st == MPQ_OK && made < ncopies; made++) {
        void *b = mpq_aligned_alloc(A->bytes);
        if (!b) {
            st = MPQ_ERR_NOMEM;
            break;
        }
        memcpy(b, A->buf, A->bytes);
        if ((st = mpq_packed_open(b, A->bytes, &C[made])) != MPQ_OK) {
            mpq_aligned_free(b);
            break;
        }
        C[made].owned = 1;
    }
    for (int c = 0; c < made && st == MPQ_OK; c++) st = mpq_gemv(&C[c], x, y, bmax, opts, work, wb);
    for (int r = 0, c = 0; r < reps && st == MPQ_OK; r++)
        for (int k = 0; k < nb && st == MPQ_OK; k++, c = (c + 1) % made) {
            const double t0 = bench_now();
            st = mpq_gemv(&C[c], x, y, batches[k], opts, work, wb);
            ts[(size_t)k * (size_t)reps + (size_t)r] = bench_now() - t0;
        }
    for (int k = 0; k < nb && st == MPQ_OK; k++) us[k] = bench_median(ts + (size_t)k * (size_t)reps, reps) * 1e6;
    for (int c = 0; c < made; c++) mpq_packed_free(&C[c]);
    free(C);
    free(ts);
    mpq_aligned_free(work);
    return st;
}

/* What else ran on the machine: CPU time of every process (/proc/stat)
   less this process's own (getrusage), over wall time. Linux only; ok = 0
   elsewhere. */
typedef struct bench_load {
    double wall, busy, self;
    int ok;
} bench_load;

static inline bench_load bench_load_now(void)
{
    bench_load l = {bench_now(), 0.0, 0.0, 0};
#if defined(__linux__)
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    if (f &&
        fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
               &v[7]) == 8) {
        const double tick = (double)sysconf(_SC_CLK_TCK);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        l.busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick; /* all but idle and iowait */
        l.self = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
            1e-6 * (double)ru.ru_stime.tv_usec;
        l.ok = tick > 0;
    }
    if (f) fclose(f);
#endif
    return l;
}

/* Cores' worth of CPU time other processes used between a and b (-1 when
   unknown). */
static inline double bench_others(bench_load a, bench_load b)
{
    if (!a.ok || !b.ok || b.wall - a.wall < 0.5) return -1.0;
    const double o = ((b.busy - a.busy) - (b.self - a.self)) / (b.wall - a.wall);
    return o < 0.0 ? 0.0 : o;
}

/* The verdict printed at the end of a benchmark: the figures are not to be
   trusted when other processes took more than a tenth of a core on average,
   or when the float32 GEMV (which only streams its matrix) read at less
   than half the measured bandwidth. Returns 1 when they can be trusted. */
static inline int bench_verdict(bench_load a, bench_load b, double worst_f32_of_bw)
{
    const double o = bench_others(a, b);
    int ok = 1;
    if (o >= 0.0) printf("other processes used %.2f cores on average during this run\n", o);
    if (o > 0.1) {
        printf("NOT TRUSTWORTHY: other processes competed for the cores (mpq's products then run on fewer threads, "
               "the float32 GEMV and the bandwidth probe do not)\n");
        ok = 0;
    }
    if (worst_f32_of_bw > 0.0 && worst_f32_of_bw < 0.5) {
        printf("NOT TRUSTWORTHY: the float32 GEMV read at %.0f%% of the measured bandwidth (a streaming read should "
               "reach most of it): the machine was busy or throttled\n",
               100.0 * worst_f32_of_bw);
        ok = 0;
    }
    return ok;
}

#endif
