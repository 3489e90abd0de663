/* synth.h - seeded synthetic data with LLM-like statistics, for the demo,
   the tests and the benchmarks. Not part of the library.

   Weights: Student-t (nu = 4) entries, which have the heavy tails of trained
   LLM weights, times 0.02; about 1 % of the rows and 1 % of the columns are
   scaled up 4..16x (the outlier output channels and salient input channels
   that mixed-precision methods exist for). Activations: Gaussian with about
   1 % of channels scaled up 10..50x (the massive-activation channels). */
#ifndef MPQ_SYNTH_H
#define MPQ_SYNTH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct synth_rng {
    uint64_t s;
} synth_rng;

static inline uint64_t synth_u64(synth_rng *r) /* splitmix64 */
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double synth_unif(synth_rng *r)
{
    return ((double)(synth_u64(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static inline int synth_int(synth_rng *r, int n) { return (int)(synth_u64(r) % (uint64_t)n); }

static inline float synth_gauss(synth_rng *r)
{
    double u = synth_unif(r), v = synth_unif(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static inline float synth_student4(synth_rng *r) /* t with 4 degrees of freedom */
{
    double z = synth_gauss(r), c = 0.0;
    for (int k = 0; k < 4; k++) {
        double g = synth_gauss(r);
        c += g * g;
    }
    return (float)(z / sqrt(c / 4.0));
}

/* W (m x n, row-major): LLM-like weights with planted outlier rows/columns. */
static inline void synth_weights(synth_rng *r, float *W, int m, int n)
{
    for (size_t k = 0; k < (size_t)m * (size_t)n; k++) W[k] = 0.02f * synth_student4(r);
    int nr = m / 100 + 1, nc = n / 100 + 1;
    for (int k = 0; k < nr; k++) {
        int i = synth_int(r, m);
        float f = 4.0f + 12.0f * (float)synth_unif(r);
        for (int j = 0; j < n; j++) W[(size_t)i * n + j] *= f;
    }
    for (int k = 0; k < nc; k++) {
        int j = synth_int(r, n);
        float f = 4.0f + 12.0f * (float)synth_unif(r);
        for (int i = 0; i < m; i++) W[(size_t)i * n + j] *= f;
    }
}

/* x (n): activations with a few massive channels. */
static inline void synth_activations(synth_rng *r, float *x, int n)
{
    for (int j = 0; j < n; j++) x[j] = synth_gauss(r);
    for (int k = 0; k < n / 100 + 1; k++) x[synth_int(r, n)] *= 10.0f + 40.0f * (float)synth_unif(r);
}

/* X (tokens x n): a batch of activations whose massive channels are the
   same in every token (as in LLMs, where a few channels carry large values
   throughout): about 1 % of the channels, chosen from `layer_seed`, are
   scaled 10..50x. Two batches with the same layer_seed share them. */
static inline void synth_tokens(synth_rng *r, float *X, int tokens, int n, uint64_t layer_seed)
{
    synth_rng h = {layer_seed};
    int nh = n / 100 + 1;
    for (int t = 0; t < tokens; t++)
        for (int j = 0; j < n; j++) X[(size_t)t * n + j] = synth_gauss(r);
    for (int k = 0; k < nh; k++) {
        int j = synth_int(&h, n);
        float f = 10.0f + 40.0f * (float)synth_unif(&h);
        for (int t = 0; t < tokens; t++) X[(size_t)t * n + j] *= f;
    }
}

/* A uniformly random permutation of 0..n-1 (Fisher-Yates). */
static inline void synth_perm(synth_rng *r, uint32_t *p, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint32_t)i;
    for (int i = n - 1; i > 0; i--) {
        int j = synth_int(r, i + 1);
        uint32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

#endif
