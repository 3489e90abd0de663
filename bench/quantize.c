/* bench/quantize: how fast mpq quantizes, in weights per second, for GPTQ
   (mpq_gptq) and AWQ's search (mpq_awq_search) at 4 bits g128, against
   round-to-nearest packing (mpq_pack) of the same layer in the same run,
   on the shapes of a Llama-3-8B layer; then the time all 224 linear maps
   of such a model (32 layers: q, o 4096 x 4096; k, v 1024 x 4096; gate, up
   14336 x 4096; down 4096 x 14336, rows x cols) would take at the measured
   rates. GPTQ is timed twice on each shape through one mpq_gptq_cache:
   making the factorisation of X^T X, then reusing it, as k, v reuse q's
   and up reuses gate's in mpq quantize. Synthetic LLM-like weights and
   activations; GPTQ's X^T X is a positive definite matrix with correlated
   columns built in O(cols^2) (its cost does not depend on the values); AWQ
   gets --tokens input rows (mpq calibrate keeps 128 per map).

   usage: quantize [--shape RxC]... [--tokens T] [--quick] */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "bench_util.h"
#include "synth.h"

#include <stdio.h>

typedef struct shape {
    int rows, cols, per_layer; /* maps of this shape in one Llama-3-8B layer */
    int shared;                /* of those, the ones that reuse another's factorisation */
} shape;

/* H = D + s s^T + u u^T / 2 + 0.1 (massive channels): positive definite,
   every column correlated with every other. */
static float *make_hessian(synth_rng *r, int n)
{
    float *H = (float *)malloc(sizeof(float) * (size_t)n * n), *s = (float *)malloc(sizeof(float) * n * 3);
    float *u = s + n, *d = u + n;
    for (int j = 0; j < n; j++) {
        s[j] = synth_gauss(r), u[j] = synth_gauss(r), d[j] = 1.0f + 4.0f * (float)synth_unif(r);
        if (synth_int(r, 100) == 0) d[j] *= 400.0f;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) H[(size_t)i * n + j] = (i == j ? d[i] : 0.0f) + s[i] * s[j] + 0.5f * u[i] * u[j];
    free(s);
    return H;
}

int main(int argc, char **argv)
{
    shape shapes[8] = {{4096, 4096, 2, 0}, {1024, 4096, 2, 2}, {14336, 4096, 2, 1}, {4096, 14336, 1, 0}};
    int nshapes = 4, custom = 0, tokens = 128, quick = 0;
    for (int a = 1; a < argc; a++) {
        int r, c;
        if (!strcmp(argv[a], "--shape") && a + 1 < argc && sscanf(argv[a + 1], "%dx%d", &r, &c) == 2 && r > 0 &&
            c > 0 && nshapes < 8) {
            if (!custom) nshapes = 0, custom = 1;
            shapes[nshapes].rows = r, shapes[nshapes].cols = c, shapes[nshapes].shared = 0;
            shapes[nshapes++].per_layer = 0;
            a++;
        } else if (!strcmp(argv[a], "--tokens") && a + 1 < argc && atoi(argv[a + 1]) > 0)
            tokens = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--quick"))
            quick = 1;
        else {
            fprintf(stderr, "usage: %s [--shape RxC]... [--tokens T] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (quick && !custom) shapes[0].rows = shapes[0].cols = 1024, nshapes = 1, shapes[0].per_layer = 0;
    printf("mpq bench/quantize: 4-bit g128, %d threads, AWQ on %d input rows (grid 20, clip search 20 steps)\n",
           bench_max_threads(), tokens);
    printf("%-12s %10s %12s %12s %14s %12s %10s %10s\n", "shape", "weights", "RTN Mw/s", "GPTQ Mw/s", "shared Mw/s",
           "AWQ Mw/s", "GPTQ/RTN", "AWQ/RTN");
    double t_gptq_model = 0, t_awq_model = 0;
    int full_model = !custom && !quick;
    for (int k = 0; k < nshapes; k++) {
        const int m = shapes[k].rows, n = shapes[k].cols;
        const double w = (double)m * n;
        synth_rng r = {1000 + (uint64_t)k};
        float *W = (float *)malloc(sizeof(float) * (size_t)m * n),
              *X = (float *)malloc(sizeof(float) * (size_t)tokens * n);
        if (!W || !X) return 1;
        synth_weights(&r, W, m, n);
        synth_tokens(&r, X, tokens, n, 7);
        float *H = make_hessian(&r, n);
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.rows = m, d.cols = n, d.uniform_bits = 4;
        mpq_packed A;
        double t0 = bench_now();
        if (mpq_pack_alloc(&d, W, &A) != MPQ_OK) return 1;
        const double t_rtn = bench_now() - t0;
        mpq_packed_free(&A);
        mpq_gptq_desc g;
        memset(&g, 0, sizeof g);
        g.H = H, g.cache = mpq_gptq_cache_new();
        if (!g.cache) return 1;
        t0 = bench_now();
        mpq_status st = mpq_gptq_alloc(&d, W, &g, &A, NULL);
        const double t_gptq = bench_now() - t0;
        mpq_packed_free(&A);
        t0 = bench_now();
        if (st == MPQ_OK) st = mpq_gptq_alloc(&d, W, &g, &A, NULL);
        const double t_shared = bench_now() - t0;
        if (st != MPQ_OK) {
            fprintf(stderr, "gptq: %s\n", mpq_status_str(st));
            return 1;
        }
        mpq_packed_free(&A);
        mpq_gptq_cache_free(g.cache);
        free(H);
        float *cs = (float *)malloc(sizeof(float) * n),
              *clip = (float *)malloc(sizeof(float) * (size_t)m * ((n + 127) / 128));
        mpq_awq_desc a;
        memset(&a, 0, sizeof a);
        a.X = X, a.tokens = tokens;
        t0 = bench_now();
        st = mpq_awq_search(&d, W, &a, cs, clip, NULL);
        const double t_awq = bench_now() - t0;
        if (st != MPQ_OK) {
            fprintf(stderr, "awq: %s\n", mpq_status_str(st));
            return 1;
        }
        char name[32];
        snprintf(name, sizeof name, "%dx%d", m, n);
        printf("%-12s %9.1fM %12.2f %12.2f %14.2f %12.2f %10.3f %10.3f\n", name, w / 1e6, w / t_rtn / 1e6,
               w / t_gptq / 1e6, w / t_shared / 1e6, w / t_awq / 1e6, t_rtn / t_gptq, t_rtn / t_awq);
        fflush(stdout);
        t_gptq_model += 32.0 * ((shapes[k].per_layer - shapes[k].shared) * t_gptq + shapes[k].shared * t_shared);
        t_awq_model += 32.0 * shapes[k].per_layer * t_awq;
        free(W), free(X), free(cs), free(clip);
    }
    if (full_model)
        printf("Llama-3-8B's 224 linear maps (6.98 G weights) at these rates: GPTQ %.1f min, AWQ search %.1f min "
               "(k, v reuse q's factorisation of X^T X, up reuses gate's)\n",
               t_gptq_model / 60.0, t_awq_model / 60.0);
    return 0;
}
