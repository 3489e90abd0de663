/* bench/gemv: CPU bit-plane LUT GEMV against the machine's own read bandwidth
   and a plain float32 GEMV, all measured in this run.

   usage: gemv [--quick] [--threads N] [--shape MxN] [--bpw X] [--block-rows R]
               [--path auto|scalar|avx2|avx512|avx512-vnni|avx2-int|neon]
               [--batch B | --batches B1,B2,... [--a8]]
          gemv --rotation [--quick] [--threads N] [--shape MxN] [--path NAME]
          gemv --list-paths

   For every shape and bits-per-weight point it prints the median time of one
   product (batch 1, or B vectors), the packed bytes streamed per second, that rate over the
   read bandwidth measured at the start, and the speedup over the float32
   GEMV with the same threads. Weight copies are rotated so that the caches
   never hold the matrix being multiplied. 2.5 and 3.25 bpw are block mixes of
   two neighbouring widths (--bpw X: that point alone, 1..8). Then AWQ next to round-to-nearest at 4096 x 4096:
   search and pack time, output error on held-out tokens, GEMV time (the
   column scales are applied while building tables, so it should not move).

   --batches B1,B2,... times products of B1, B2, ... vectors instead, one
   product of each in turn on the same rotating copies (so that a slow
   moment of the machine costs every batch alike), and prints each median
   against the first batch's: the cost of a batch relative to batch B1.
   With --a8 every batch is timed with 8-bit activations (mpq_gemv_opts.a8)
   right after the same batches with float activations, and the last
   column is the ratio of the two.

   --rotation times what the incoherence rotation costs a product: the same
   3.25 bpw matrix packed with and without a rotation of its input size,
   one product of each in turn, rounds of medians, at 4096 x 14336 (an 8B
   model's down projection, where the cost is to stay under 8 %), 14336 x
   4096, 4096 x 4096 and SmolLM2's 576 x 1536 and 576 x 576; prints each
   median and the ratio rotated / plain. */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "bench_util.h"
#include "synth.h"

#include <stdio.h>

/* A block mix for `bpw`: the higher width on a fraction bpw - floor(bpw) of
   the blocks, spread evenly. */
static void make_bits(uint8_t *bits, int nb, double bpw)
{
    int lo = (int)bpw;
    double frac = bpw - lo, acc = 0.0;
    for (int k = 0; k < nb; k++) {
        acc += frac;
        bits[k] = (uint8_t)(acc >= 1.0 - 1e-9 ? lo + 1 : lo);
        if (acc >= 1.0 - 1e-9) acc -= 1.0;
    }
}

static mpq_path g_path = MPQ_PATH_AUTO; /* --path */
static int g_batch = 1;                 /* --batch: vectors per product in the main table */
#define MAX_BATCHES 8
static int g_batches[MAX_BATCHES], g_nbatches = 0; /* --batches */
static int g_a8 = 0;                               /* --a8 (with --batches) */

/* bench_gemv_us at the --path of the command line; a failure ends the run. */
static void time_batches(const mpq_packed *A, const float *x, float *y, const int *batches, int nb, int threads,
                         size_t rotate_bytes, int reps, int a8, double *us)
{
    mpq_gemv_opts o;
    memset(&o, 0, sizeof o);
    o.threads = threads;
    o.path = g_path;
    o.a8 = a8;
    const mpq_status st = bench_gemv_us(A, x, y, batches, nb, &o, rotate_bytes, reps, us);
    if (st != MPQ_OK) {
        fprintf(stderr, "bench_gemv: %s\n", mpq_status_str(st));
        exit(1);
    }
}

/* Median microseconds of one GEMV of `batch` vectors. */
static double time_gemv(const mpq_packed *A, const float *x, float *y, int batch, int threads, size_t rotate_bytes,
                        int reps)
{
    double us;
    time_batches(A, x, y, &batch, 1, threads, rotate_bytes, reps, 0, &us);
    return us;
}

/* --rotation: rounds of one plain and one rotated product, alternating. */
static int rotation_cost(int sm, int sn, int only_threads, int quick)
{
    int shapes[5][2] = {{4096, 14336}, {14336, 4096}, {4096, 4096}, {576, 1536}, {576, 576}}, nshapes = 5;
    if (sm > 0 && sn > 0) shapes[0][0] = sm, shapes[0][1] = sn, nshapes = 1;
    const int maxth = bench_max_threads(), rounds = quick ? 3 : 7, reps = quick ? 15 : 40;
    int thr[2] = {1, 2}, nthr = maxth > 1 ? 2 : 1;
    if (only_threads > 0) thr[0] = only_threads, nthr = 1;
    const size_t rotate = (size_t)(quick ? 96 : 256) << 20;
    synth_rng rng = {43};
    const bench_load load0 = bench_load_now();
    printf("mpq bench/gemv --rotation: 3.25 bpw (3 and 4 bits, group 128), kernel path %s, %d rounds of %d\n",
           mpq_path_name(mpq__resolve_path(g_path)), rounds, reps);
    printf("\n%-12s %3s %6s %10s %10s %8s %8s\n", "shape", "thr", "V", "plain us", "rotated us", "ratio", "spread");
    for (int si = 0; si < nshapes; si++) {
        const int m = shapes[si][0], n = shapes[si][1];
        float *W = (float *)mpq_aligned_alloc(sizeof(float) * (size_t)m * n);
        float *x = (float *)mpq_aligned_alloc(sizeof(float) * (size_t)n);
        float *y = (float *)mpq_aligned_alloc(sizeof(float) * (size_t)m);
        const int nb = ((m + 15) / 16) * ((n + 127) / 128);
        uint8_t *bits = (uint8_t *)malloc((size_t)nb);
        mpq_rotation r;
        if (!W || !x || !y || !bits || mpq_rotation_init(&r, n, 1) != MPQ_OK) return 1;
        synth_weights(&rng, W, m, n);
        synth_activations(&rng, x, n);
        make_bits(bits, nb, 3.25);
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.rows = m, d.cols = n, d.bits = bits;
        mpq_packed A, B;
        if (mpq_pack_alloc(&d, W, &A) != MPQ_OK) return 1;
        d.rotation = &r;
        if (mpq_pack_alloc(&d, W, &B) != MPQ_OK) return 1;
        for (int ti = 0; ti < nthr; ti++) {
            double pu[16], ru[16], ratio[16];
            for (int k = 0; k < rounds; k++) {
                pu[k] = time_gemv(&A, x, y, 1, thr[ti], rotate, reps);
                ru[k] = time_gemv(&B, x, y, 1, thr[ti], rotate, reps);
                ratio[k] = ru[k] / pu[k];
            }
            const double p = bench_median(pu, rounds), q = bench_median(ru, rounds), c = bench_median(ratio, rounds);
            double lo = ratio[0], hi = ratio[0];
            for (int k = 1; k < rounds; k++) lo = ratio[k] < lo ? ratio[k] : lo, hi = ratio[k] > hi ? ratio[k] : hi;
            char v[32];
            snprintf(v, sizeof v, "%dx%d", r.p, r.m);
            printf("%5dx%-6d %3d %6s %10.1f %10.1f %7.3fx %3.2f-%.2f\n", m, n, thr[ti], v, p, q, c, lo, hi);
        }
        mpq_packed_free(&A), mpq_packed_free(&B), mpq_rotation_free(&r);
        free(bits);
        mpq_aligned_free(W), mpq_aligned_free(x), mpq_aligned_free(y);
    }
    printf("(ratio: the median over rounds of rotated / plain, measured in turn; spread: its lowest and highest)\n");
    bench_verdict(load0, bench_load_now(), 0.0); /* no float32 GEMV here */
    return 0;
}

/* "1,2,4,8" into g_batches; 0 on anything else. */
static int parse_batches(const char *s)
{
    g_nbatches = 0;
    while (*s) {
        char *end;
        long b = strtol(s, &end, 10);
        if (end == s || b < 1 || b > 64 || g_nbatches == MAX_BATCHES || (*end && *end != ',')) return 0;
        g_batches[g_nbatches++] = (int)b;
        s = *end ? end + 1 : end;
    }
    return g_nbatches > 0;
}

int main(int argc, char **argv)
{
    int quick = 0, only_threads = 0, sm = 0, sn = 0, block_rows = 16, rotation = 0;
    double one_bpw = 0.0;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--quick"))
            quick = 1;
        else if (!strcmp(argv[a], "--rotation"))
            rotation = 1;
        else if (!strcmp(argv[a], "--list-paths")) { /* the kernel paths this CPU and build have */
            for (int p = MPQ_PATH_SCALAR; p <= MPQ_PATH_NEON; p++)
                if (mpq_path_available((mpq_path)p)) printf("%s\n", mpq_path_name((mpq_path)p));
            return 0;
        } else if (!strcmp(argv[a], "--threads") && a + 1 < argc)
            only_threads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--batch") && a + 1 < argc && (g_batch = atoi(argv[a + 1])) >= 1 && g_batch <= 64)
            a++;
        else if (!strcmp(argv[a], "--batches") && a + 1 < argc && parse_batches(argv[a + 1]))
            a++;
        else if (!strcmp(argv[a], "--a8"))
            g_a8 = 1;
        else if (!strcmp(argv[a], "--block-rows") && a + 1 < argc)
            block_rows = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--bpw") && a + 1 < argc && (one_bpw = atof(argv[a + 1])) >= 1.0 && one_bpw <= 8.0)
            a++;
        else if (!strcmp(argv[a], "--path") && a + 1 < argc) {
            const char *name = argv[++a];
            int found = 0;
            for (int p = MPQ_PATH_AUTO; p <= MPQ_PATH_NEON; p++)
                if (!strcmp(name, mpq_path_name((mpq_path)p))) g_path = (mpq_path)p, found = 1;
            if (!found || !mpq_path_available(g_path)) {
                fprintf(stderr, "path %s is not available in this build\n", name);
                return 2;
            }
        } else if (!(!strcmp(argv[a], "--shape") && a + 1 < argc && sscanf(argv[++a], "%dx%d", &sm, &sn) == 2)) {
            fprintf(stderr,
                    "usage: %s [--quick] [--threads N] [--shape MxN] [--bpw X] [--block-rows R] [--path NAME]"
                    " [--batch B | --batches B1,B2,... [--a8]] | --rotation | --list-paths\n",
                    argv[0]);
            return 2;
        }
    }
    if (g_a8 && !g_nbatches) {
        fprintf(stderr, "%s: --a8 goes with --batches\n", argv[0]);
        return 2;
    }
    if (rotation) return rotation_cost(sm, sn, only_threads, quick);
    int shapes[3][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}}, nshapes = 3;
    if (sm > 0 && sn > 0) {
        shapes[0][0] = sm;
        shapes[0][1] = sn;
        nshapes = 1;
    }
    double bpws[] = {2.0, 2.5, 3.0, 3.25, 4.0};
    int nbpw = 5;
    const int group = 128;
    if (one_bpw > 0.0) bpws[0] = one_bpw, nbpw = 1;
    const int maxth = bench_max_threads();
    int thr[2] = {1, 2}, nthr = maxth > 1 ? 2 : 1;
    if (only_threads > 0) {
        thr[0] = only_threads;
        nthr = 1;
    }
    const size_t rotate = (size_t)(quick ? 96 : 256) << 20; /* far beyond the last-level cache */
    const int reps = quick ? 15 : 50;
    synth_rng rng = {42};

    const bench_load load0 = bench_load_now();
    double worst_f32 = 1e30; /* the float32 GEMV's read rate over the bandwidth, lowest seen */
    const mpq_path path = mpq__resolve_path(g_path);
    int nvec = g_batch; /* vectors in x and y */
    if (g_nbatches) {
        printf("mpq bench/gemv: group %d, block_rows %d, kernel path %s, batches", group, block_rows,
               mpq_path_name(path));
        for (int k = 0; k < g_nbatches; k++) {
            printf("%s%d", k ? "," : " ", g_batches[k]);
            nvec = g_batches[k] > nvec ? g_batches[k] : nvec;
        }
        printf(" (each against batch %d, timed in turn)\n", g_batches[0]);
    } else
        printf("mpq bench/gemv: group %d, block_rows %d, kernel path %s, batch %d%s\n", group, block_rows,
               mpq_path_name(path), g_batch,
               g_batch > 1 ? " (speedup: against batch float32 GEMVs of one vector)" : "");
    /* The bandwidth is measured again after every shape and the highest
       figure is the one reported and used: on a shared machine a lower one
       only means a neighbour was busy, and the highest keeps ratios honest. */
    double bw[2];
    for (int ti = 0; ti < nthr; ti++) {
        bw[ti] = bench_read_bandwidth(thr[ti], quick);
        printf("read bandwidth, %d thread(s): %.1f GB/s\n", thr[ti], bw[ti] / 1e9);
    }
    if (g_nbatches)
        printf("\n%-12s %5s %3s %5s %10s %8s %10s %8s%s\n", "shape", "bpw", "thr", "batch", "us", "x first",
               "us/vector", "of bw", g_a8 ? "    float us  a8/float" : "");
    else
        printf("\n%-12s %5s %3s %10s %8s %6s %10s %8s\n", "shape", "bpw", "thr", "us", "GB/s", "of bw", "fp32 us",
               "speedup");
    double t3_4096 = 0.0;
    for (int si = 0; si < nshapes; si++) {
        const int m = shapes[si][0], n = shapes[si][1];
        float *W = (float *)mpq_aligned_alloc(sizeof(float) * (size_t)m * n);
        float *x = (float *)mpq_aligned_alloc(sizeof(float) * (size_t)n * nvec);
        float *y = (float *)mpq_aligned_alloc(sizeof(float) * (size_t)m * nvec);
        if (!W || !x || !y) return 1;
        synth_weights(&rng, W, m, n);
        for (int v = 0; v < nvec; v++) synth_activations(&rng, x + (size_t)v * n, n);
        double f32_us[2];
        for (int ti = 0; ti < nthr; ti++) {
            f32_us[ti] = bench_f32_gemv_us(W, x, y, m, n, thr[ti], rotate, quick);
            /* the float32 GEMV streams its matrix too: if it read faster than
               the probe, its rate is the bandwidth the ratios use */
            double f32bw = 4.0 * (double)m * n / (f32_us[ti] * 1e-6);
            if (f32bw > bw[ti]) {
                printf("read bandwidth, %d thread(s), from the float32 GEMV: %.1f GB/s (probe: %.1f)\n", thr[ti],
                       f32bw / 1e9, bw[ti] / 1e9);
                bw[ti] = f32bw;
            }
            worst_f32 = f32bw / bw[ti] < worst_f32 ? f32bw / bw[ti] : worst_f32;
        }
        const int ngr = (n + group - 1) / group, nbr = (m + block_rows - 1) / block_rows;
        uint8_t *bits = (uint8_t *)malloc((size_t)ngr * nbr);
        for (int bi = 0; bi < nbpw; bi++) {
            make_bits(bits, ngr * nbr, bpws[bi]);
            mpq_bitplane_desc d;
            memset(&d, 0, sizeof d);
            d.rows = m;
            d.cols = n;
            d.group = group;
            d.block_rows = block_rows;
            d.bits = bits;
            mpq_packed A;
            double t0 = bench_now();
            mpq_status st = mpq_pack_alloc(&d, W, &A);
            double pack_s = bench_now() - t0;
            if (st != MPQ_OK) {
                fprintf(stderr, "pack: %s\n", mpq_status_str(st));
                return 1;
            }
            for (int ti = 0; ti < nthr && g_nbatches; ti++) {
                double us[MAX_BATCHES], usf[MAX_BATCHES];
                if (g_a8) time_batches(&A, x, y, g_batches, g_nbatches, thr[ti], rotate, reps, 0, usf);
                time_batches(&A, x, y, g_batches, g_nbatches, thr[ti], rotate, reps, g_a8, us);
                for (int k = 0; k < g_nbatches; k++) {
                    printf("%5dx%-6d %5.2f %3d %5d %10.1f %7.2fx %10.1f %7.0f%%", m, n, mpq_packed_bpw(&A, 0), thr[ti],
                           g_batches[k], us[k], us[k] / us[0], us[k] / g_batches[k],
                           100.0 * (double)A.bytes / (us[k] * 1e-6) / bw[ti]);
                    if (g_a8) printf(" %11.1f %8.2fx", usf[k], us[k] / usf[k]);
                    printf("\n");
                }
            }
            for (int ti = 0; ti < nthr && !g_nbatches; ti++) {
                double us = time_gemv(&A, x, y, g_batch, thr[ti], rotate, reps);
                double gbs = (double)A.bytes / (us * 1e-6);
                if (m == 4096 && n == 4096 && bpws[bi] == 3.0 && ti == nthr - 1) t3_4096 = us;
                printf("%5dx%-6d %5.2f %3d %10.1f %8.1f %5.0f%% %10.1f %7.2fx\n", m, n, mpq_packed_bpw(&A, 0), thr[ti],
                       us, gbs / 1e9, 100.0 * gbs / bw[ti], f32_us[ti], g_batch * f32_us[ti] / us);
            }
            printf("%5dx%-6d %5.2f     quantize+pack: %.1f M weights/s (%d threads), %.2f bpw with metadata\n", m, n,
                   mpq_packed_bpw(&A, 0), (double)m * n / pack_s / 1e6, maxth, mpq_packed_bpw(&A, 1));
            mpq_packed_free(&A);
        }
        free(bits);
        mpq_aligned_free(W);
        mpq_aligned_free(x);
        mpq_aligned_free(y);
        for (int ti = 0; ti < nthr; ti++) {
            double b = bench_read_bandwidth(thr[ti], quick);
            if (b > bw[ti]) {
                printf("read bandwidth, %d thread(s), measured again: %.1f GB/s (ratios above used %.1f)\n", thr[ti],
                       b / 1e9, bw[ti] / 1e9);
                bw[ti] = b;
            }
        }
    }
    for (int ti = 0; ti < nthr; ti++)
        printf("highest read bandwidth seen, %d thread(s): %.1f GB/s\n", thr[ti], bw[ti] / 1e9);
    bench_verdict(load0, bench_load_now(), worst_f32);

    if (!only_threads && !g_nbatches &&
        (sm == 0 || (sm == 4096 && sn == 4096))) { /* AWQ next to RTN, 4096 x 4096 at 3 bits */
        const int m = 4096, n = 4096, T = 64, H = 16;
        float *W = (float *)mpq_aligned_alloc(sizeof(float) * (size_t)m * n);
        float *Xc = (float *)malloc(sizeof(float) * (size_t)T * n),
              *Xh = (float *)malloc(sizeof(float) * (size_t)H * n);
        float *Y = (float *)malloc(sizeof(float) * (size_t)H * m), *cs = (float *)malloc(sizeof(float) * n);
        float *clip = (float *)malloc(sizeof(float) * (size_t)m * (n / 128));
        double *Yr = (double *)malloc(sizeof(double) * (size_t)H * m);
        synth_weights(&rng, W, m, n);
        synth_tokens(&rng, Xc, T, n, 7);
        synth_tokens(&rng, Xh, H, n, 7);
        for (int t = 0; t < H; t++)
            for (int i = 0; i < m; i++) {
                double acc = 0;
                for (int j = 0; j < n; j++) acc += (double)W[(size_t)i * n + j] * Xh[(size_t)t * n + j];
                Yr[(size_t)t * m + i] = acc;
            }
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.rows = m, d.cols = n, d.uniform_bits = 3;
        printf("\nAWQ next to RTN, %dx%d at 3 bits, group 128, %d threads (error: relative, %d held-out tokens)\n", m,
               n, thr[nthr - 1], H);
        printf("%-5s %10s %12s %10s\n", "", "prepare s", "output err", "gemv us");
        mpq_packed P[2];
        double prep[2], err[2], us[2] = {1e300, 1e300};
        for (int k = 0; k < 2; k++) { /* 0: RTN, 1: AWQ */
            double t0 = bench_now();
            if (k) {
                mpq_awq_desc a;
                memset(&a, 0, sizeof a);
                a.X = Xc, a.tokens = T;
                if (mpq_awq_search(&d, W, &a, cs, clip, NULL) != MPQ_OK) return 1;
                d.col_scale = cs, d.clip = clip;
            }
            if (mpq_pack_alloc(&d, W, &P[k]) != MPQ_OK) return 1;
            prep[k] = bench_now() - t0;
            mpq_gemv_opts o;
            memset(&o, 0, sizeof o);
            o.threads = thr[nthr - 1];
            mpq_gemv(&P[k], Xh, Y, H, &o, NULL, 0);
            double e = 0, r = 0;
            for (size_t q = 0; q < (size_t)H * m; q++) {
                e += ((double)Y[q] - Yr[q]) * ((double)Y[q] - Yr[q]);
                r += Yr[q] * Yr[q];
            }
            err[k] = sqrt(e / r);
        }
        for (int round = 0; round < 2; round++) /* alternate, keep the better of two */
            for (int k = 0; k < 2; k++) {
                double t = time_gemv(&P[k], Xh, Y, 1, thr[nthr - 1], rotate, reps);
                us[k] = t < us[k] ? t : us[k];
            }
        for (int k = 0; k < 2; k++) {
            printf("%-5s %10.2f %12.5f %10.1f\n", k ? "AWQ" : "RTN", prep[k], err[k], us[k]);
            mpq_packed_free(&P[k]);
        }
        mpq_aligned_free(W);
        free(Xc), free(Xh), free(Y), free(cs), free(clip), free(Yr);
    }

    if (t3_4096 > 0.0 && !g_nbatches) { /* building the tables for one vector, against that GEMV */
        const int n = 4096;
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.rows = 16;
        d.cols = n;
        float *W = (float *)mpq_aligned_alloc(sizeof(float) * 16u * n), *x = (float *)mpq_aligned_alloc(4u * n);
        synth_weights(&rng, W, 16, n);
        synth_activations(&rng, x, n);
        mpq_packed A;
        if (mpq_pack_alloc(&d, W, &A) != MPQ_OK) return 1;
        size_t wb = mpq_gemv_work_bytes(&A, 1);
        uint8_t *work = (uint8_t *)mpq_aligned_alloc(wb);
        double ts[201];
        for (int r = 0; r < 201; r++) {
            double t0 = bench_now();
            for (int g = 0; g < A.ngroups; g++) mpq__build_group(&A, x, mpq__path_row_of(path)->tables, 0, work, g);
            ts[r] = bench_now() - t0;
        }
        double tb = bench_median(ts, 201) * 1e6;
        printf("\ntables for one vector, n = %d: %.2f us = %.1f%% of the 4096x4096 3-bit GEMV above (%.1f us)\n", n, tb,
               100.0 * tb / t3_4096, t3_4096);
        mpq_aligned_free(work);
        mpq_packed_free(&A);
        mpq_aligned_free(W);
        mpq_aligned_free(x);
    }
    return 0;
}
