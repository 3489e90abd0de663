/* Section 8: selection and permutations, against simple references. */
#include "common.h"

static const float *g_v;
static int by_desc_then_index(const void *a, const void *b) /* the reference order */
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    if (g_v[i] != g_v[j]) return g_v[i] > g_v[j] ? -1 : 1;
    return (i > j) - (i < j);
}

static int ascending(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Values with many ties: small integers, and LLM-like salience. */
static void fill(synth_rng *r, float *v, size_t n, int kind)
{
    for (size_t i = 0; i < n; i++)
        v[i] = kind == 0 ? (float)synth_int(r, 5) : (kind == 1 ? fabsf(synth_student4(r)) : synth_gauss(r));
}

Test(select, argsort_is_stable_and_descending)
{
    synth_rng r = {71};
    const size_t sizes[] = {0, 1, 2, 3, 7, 64, 100, 1000, 4097};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int kind = 0; kind < 3; kind++) {
            size_t n = sizes[si];
            float *v = malloc(sizeof(float) * (n + 1));
            uint32_t *idx = malloc(4 * (n + 1)), *ref = malloc(4 * (n + 1));
            fill(&r, v, n, kind);
            cr_assert_eq(mpq_argsort_desc(v, n, idx), MPQ_OK);
            for (size_t i = 0; i < n; i++) ref[i] = (uint32_t)i;
            g_v = v;
            qsort(ref, n, 4, by_desc_then_index);
            for (size_t i = 0; i < n; i++) cr_assert_eq(idx[i], ref[i], "n=%zu kind %d at %zu", n, kind, i);
            free(v), free(idx), free(ref);
        }
    float bad[3] = {1, NAN, 2};
    uint32_t idx[3] = {7, 7, 7};
    cr_assert_eq(mpq_argsort_desc(bad, 3, idx), MPQ_ERR_NONFINITE);
    cr_assert_eq(idx[0], 7u);
}

Test(select, quantile_matches_the_sorted_reference)
{
    synth_rng r = {72};
    for (int rep = 0; rep < 300; rep++) {
        size_t n = 1 + (size_t)synth_int(&r, rep < 100 ? 20 : 3000);
        float *v = malloc(sizeof(float) * n), *sorted = malloc(sizeof(float) * n);
        fill(&r, v, n, rep % 3);
        memcpy(sorted, v, sizeof(float) * n);
        qsort(sorted, n, sizeof(float), ascending);
        const double qs[] = {0.0, 0.1, 0.5, 0.875, 0.999, 1.0};
        for (int k = 0; k < 6; k++) {
            float out;
            cr_assert_eq(mpq_quantile(v, n, qs[k], &out), MPQ_OK);
            cr_assert_eq(out, sorted[(size_t)floor(qs[k] * (double)(n - 1))], "n=%zu q=%g", n, qs[k]);
        }
        free(v), free(sorted);
    }
    /* adversarial orders for the pivot rule: sorted, reversed, organ pipe, constant */
    const size_t n = 10001;
    float *v = malloc(sizeof(float) * n), out;
    for (int pat = 0; pat < 4; pat++) {
        for (size_t i = 0; i < n; i++)
            v[i] = pat == 0 ? (float)i : pat == 1 ? (float)(n - i) : pat == 2 ? (float)(i < n / 2 ? i : n - i) : 3.0f;
        cr_assert_eq(mpq_quantile(v, n, 0.5, &out), MPQ_OK);
        cr_assert_eq(out, pat == 3 ? 3.0f : (pat == 2 ? 2500.0f : (pat == 0 ? 5000.0f : 5001.0f)), "pattern %d: %g",
                     pat, (double)out);
    }
    free(v);
    float one = 1;
    cr_assert_eq(mpq_quantile(&one, 0, 0.5, &out), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_quantile(&one, 1, 1.5, &out), MPQ_ERR_ARG);
    cr_assert_eq(mpq_quantile(&one, 1, NAN, &out), MPQ_ERR_ARG);
}

Test(select, top_k_and_the_global_selection)
{
    synth_rng r = {73};
    for (int rep = 0; rep < 200; rep++) {
        int nl = 1 + synth_int(&r, 5);
        mpq_span sp[5];
        uint8_t *sel[5];
        size_t total = 0;
        float *all = malloc(sizeof(float) * 5 * 400);
        for (int l = 0; l < nl; l++) {
            size_t n = (size_t)synth_int(&r, 400);
            float *v = malloc(sizeof(float) * (n + 1));
            fill(&r, v, n, rep % 3);
            sp[l].v = v, sp[l].n = n;
            sel[l] = malloc(n + 1);
            memcpy(all + total, v, sizeof(float) * n);
            total += n;
        }
        size_t k = total ? (size_t)synth_int(&r, (int)total + 1) : 0;
        cr_assert_eq(mpq_top_k_global(sp, nl, k, sel), MPQ_OK);
        /* reference: the first k of the concatenation sorted by (value desc, position) */
        uint32_t *ord = malloc(4 * (total + 1));
        uint8_t *want = calloc(total + 1, 1);
        for (size_t i = 0; i < total; i++) ord[i] = (uint32_t)i;
        g_v = all;
        qsort(ord, total, 4, by_desc_then_index);
        for (size_t i = 0; i < k; i++) want[ord[i]] = 1;
        size_t o = 0, count = 0;
        for (int l = 0; l < nl; l++)
            for (size_t i = 0; i < sp[l].n; i++, o++) {
                cr_assert_eq(sel[l][i], want[o], "layer %d index %zu", l, i);
                count += sel[l][i];
            }
        cr_assert_eq(count, k);
        if (nl == 1) { /* and the single-layer top-k agrees */
            uint32_t *idx = malloc(4 * (k + 1));
            cr_assert_eq(mpq_top_k(sp[0].v, sp[0].n, k, idx), MPQ_OK);
            for (size_t i = 0; i < k; i++) {
                cr_assert(want[idx[i]]);
                if (i) cr_assert_lt(idx[i - 1], idx[i], "ascending index order");
            }
            free(idx);
        }
        for (int l = 0; l < nl; l++) free((void *)sp[l].v), free(sel[l]);
        free(all), free(ord), free(want);
    }
    float v[4] = {1, 2, 3, 4};
    uint32_t idx[4];
    cr_assert_eq(mpq_top_k(v, 4, 5, idx), MPQ_ERR_SIZE);
    v[2] = INFINITY;
    cr_assert_eq(mpq_top_k(v, 4, 2, idx), MPQ_ERR_NONFINITE);
    mpq_span sp = {v, 4};
    uint8_t s4[4], *sel = s4;
    cr_assert_eq(mpq_top_k_global(&sp, 0, 1, &sel), MPQ_ERR_ARG, "no layers");
}

Test(select, permutations_from_salience_and_their_algebra)
{
    synth_rng r = {74};
    const int m = 37, n = 53;
    float *S = malloc(sizeof(float) * m * n), *W = malloc(sizeof(float) * m * n), *Wp = malloc(sizeof(float) * m * n);
    for (int k = 0; k < m * n; k++) S[k] = fabsf(synth_student4(&r)), W[k] = synth_gauss(&r);
    for (int j = 0; j < n; j++) S[5 * n + j] += 10.0f; /* row 5 and column 7 planted as most salient */
    for (int i = 0; i < m; i++) S[i * n + 7] += 10.0f;
    uint32_t pr[37], pc[53], inv[53], comp[53], a[53], b[53];
    cr_assert_eq(mpq_perm_from_salience(S, m, n, pr, pc), MPQ_OK);
    cr_assert_eq(pr[0], 5u);
    cr_assert_eq(pc[0], 7u);
    for (int i = 1; i < m; i++) { /* descending row sums (SFMP eq. 11-12) */
        double s0 = 0, s1 = 0;
        for (int j = 0; j < n; j++) s0 += S[pr[i - 1] * n + j], s1 += S[pr[i] * n + j];
        cr_assert_geq(s0 + 1e-3, s1);
    }
    cr_assert_eq(mpq_perm_validate(pr, m), MPQ_OK);
    cr_assert_eq(mpq_perm_from_salience(S, m, n, NULL, pc), MPQ_OK);
    /* eq. 13 */
    cr_assert_eq(mpq_perm_apply(W, m, n, pr, pc, Wp), MPQ_OK);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) cr_assert_eq(Wp[i * n + j], W[pr[i] * n + pc[j]]);
    /* invert and compose */
    cr_assert_eq(mpq_perm_invert(pc, n, inv), MPQ_OK);
    for (int j = 0; j < n; j++) cr_assert_eq(inv[pc[j]], (uint32_t)j);
    cr_assert_eq(mpq_perm_compose(pc, inv, n, comp), MPQ_OK);
    synth_perm(&r, a, n);
    synth_perm(&r, b, n);
    cr_assert_eq(mpq_perm_compose(a, b, n, comp), MPQ_OK);
    float x[53], y[53], z[53];
    for (int j = 0; j < n; j++) x[j] = (float)j * 1.5f;
    for (int j = 0; j < n; j++) y[j] = x[a[j]];
    for (int j = 0; j < n; j++) z[j] = y[b[j]];
    for (int j = 0; j < n; j++) cr_assert_eq(z[j], x[comp[j]], "gather by a then b = gather by compose(a, b)");
    /* bad permutations and shapes */
    a[3] = a[4];
    cr_assert_eq(mpq_perm_validate(a, n), MPQ_ERR_PERM);
    cr_assert_eq(mpq_perm_invert(a, n, inv), MPQ_ERR_PERM);
    cr_assert_eq(mpq_perm_compose(a, b, n, comp), MPQ_ERR_PERM);
    cr_assert_eq(mpq_perm_apply(W, m, n, NULL, a, Wp), MPQ_ERR_PERM);
    b[0] = 53;
    cr_assert_eq(mpq_perm_validate(b, n), MPQ_ERR_PERM);
    cr_assert_eq(mpq_perm_apply(W, 0, n, NULL, NULL, Wp), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_perm_apply(W, m, n, NULL, NULL, W), MPQ_ERR_ARG, "in place is not allowed");
    S[100] = NAN;
    cr_assert_eq(mpq_perm_from_salience(S, m, n, pr, pc), MPQ_ERR_NONFINITE);
    free(S), free(W), free(Wp);
}
