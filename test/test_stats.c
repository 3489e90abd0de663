/* Section 9: streaming statistics against whole-batch float64 references and
   the papers' formulas. */
#include "common.h"

Test(stats, fisher_streams_to_the_mean_of_squared_gradients)
{
    synth_rng r = {81};
    const size_t n = 777;
    const int batches = 9;
    float *g = malloc(sizeof(float) * n * batches), *out = malloc(sizeof(float) * n);
    for (size_t k = 0; k < n * batches; k++) g[k] = 1e-3f * synth_student4(&r);
    mpq_stat F;
    cr_assert_eq(mpq_stat_init(&F, n), MPQ_OK);
    cr_assert_eq(mpq_stat_mean(&F, out), MPQ_ERR_SIZE, "no sample yet");
    for (int b = 0; b < batches; b++) cr_assert_eq(mpq_fisher_add(&F, g + (size_t)b * n, n), MPQ_OK);
    cr_assert_eq(F.count, (uint64_t)batches);
    cr_assert_eq(mpq_stat_mean(&F, out), MPQ_OK);
    for (size_t i = 0; i < n; i++) {
        double ref = 0;
        for (int b = 0; b < batches; b++) ref += (double)g[(size_t)b * n + i] * g[(size_t)b * n + i];
        cr_assert_eq(out[i], (float)(ref / batches));
    }
    /* bad input changes nothing */
    double before = F.sum[3];
    g[3] = NAN;
    cr_assert_eq(mpq_fisher_add(&F, g, n), MPQ_ERR_NONFINITE);
    cr_assert_eq(mpq_fisher_add(&F, g + n, n - 1), MPQ_ERR_SIZE);
    cr_assert_eq(F.sum[3], before);
    cr_assert_eq(F.count, (uint64_t)batches);
    mpq_stat_free(&F);
    cr_assert_null(F.sum);
    cr_assert_eq(mpq_stat_init(&F, 0), MPQ_ERR_SIZE);
    free(g), free(out);
}

Test(stats, activation_statistics_do_not_depend_on_the_batching)
{
    synth_rng r = {82};
    const int tokens = 100, cols = 301;
    float *X = malloc(sizeof(float) * tokens * cols), *h = malloc(4 * cols), *m = malloc(4 * cols);
    synth_tokens(&r, X, tokens, cols, 5);
    mpq_stat H, A;
    mpq_stat_init(&H, cols);
    mpq_stat_init(&A, cols);
    for (int t = 0; t < tokens;) { /* uneven batches */
        int b = 1 + synth_int(&r, 17);
        if (t + b > tokens) b = tokens - t;
        cr_assert_eq(mpq_hessian_diag_add(&H, X + (size_t)t * cols, b, cols), MPQ_OK);
        cr_assert_eq(mpq_mean_abs_add(&A, X + (size_t)t * cols, b, cols), MPQ_OK);
        t += b;
    }
    cr_assert_eq(H.count, (uint64_t)tokens);
    cr_assert_eq(mpq_stat_sum(&H, h), MPQ_OK);
    cr_assert_eq(mpq_stat_mean(&A, m), MPQ_OK);
    for (int j = 0; j < cols; j++) {
        double hh = 0, aa = 0;
        for (int t = 0; t < tokens; t++) {
            double x = X[(size_t)t * cols + j];
            hh += x * x;
            aa += fabs(x);
        }
        cr_assert_eq(h[j], (float)hh, "H_jj = sum_k X_kj^2 (MXSens)");
        cr_assert_eq(m[j], (float)(aa / tokens), "mean |x| (AWQ)");
    }
    cr_assert_eq(mpq_hessian_diag_add(&H, X, tokens, cols - 1), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_mean_abs_add(&A, X, 0, cols), MPQ_ERR_SIZE);
    X[5] = INFINITY;
    cr_assert_eq(mpq_mean_abs_add(&A, X, tokens, cols), MPQ_ERR_NONFINITE);
    cr_assert_eq(A.count, (uint64_t)tokens);
    mpq_stat_free(&H), mpq_stat_free(&A);
    free(X), free(h), free(m);
}

Test(stats, mixllm_salience_by_hand)
{
    /* one channel, g = (1, 2), delta = (0.5, -0.25): g^T d = 0; second
       channel g = (2, 0), d = (0.5, 1): g^T d = 1 -> |1 + 1/2| = 1.5;
       second sample doubles g: g^T d = 2 -> |2 + 2| = 4; means 0 and 2.75 */
    const float G1[4] = {1, 2, 2, 0}, G2[4] = {2, 4, 4, 0}, D[4] = {0.5f, -0.25f, 0.5f, 1};
    mpq_stat S;
    float out[2];
    mpq_stat_init(&S, 2);
    cr_assert_eq(mpq_mixllm_add(&S, G1, D, 2, 2), MPQ_OK);
    cr_assert_eq(mpq_mixllm_add(&S, G2, D, 2, 2), MPQ_OK);
    cr_assert_eq(mpq_stat_mean(&S, out), MPQ_OK);
    cr_assert_eq(out[0], 0.0f);
    cr_assert_eq(out[1], 2.75f);
    /* a negative first-order term: g^T d = -1 -> |-1 + 1/2| = 0.5 */
    const float G3[4] = {-2, 0, 0, 0};
    mpq_stat_free(&S);
    mpq_stat_init(&S, 2);
    cr_assert_eq(mpq_mixllm_add(&S, G3, D, 2, 2), MPQ_OK);
    cr_assert_eq(mpq_stat_mean(&S, out), MPQ_OK);
    cr_assert_eq(out[0], 0.5f);
    cr_assert_eq(mpq_mixllm_add(&S, G3, D, 3, 2), MPQ_ERR_SIZE);
    mpq_stat_free(&S);
}

/* F(w) = sum a_i w_i^2 / 2 + b_i w_i: dF/dw_i = a_i w_i + b_i. */
typedef struct quad {
    const double *a, *b;
    int calls, fail_at;
} quad;

static mpq_status quad_grad(void *u, const float *w, float *g, size_t n)
{
    quad *q = (quad *)u;
    if (++q->calls == q->fail_at) return MPQ_ERR_DEVICE;
    for (size_t i = 0; i < n; i++) g[i] = (float)(q->a[i] * w[i] + q->b[i]);
    return MPQ_OK;
}

Test(stats, pqi_on_a_quadratic_loss)
{
    enum { n = 6 };
    const double a[n] = {1, 2, 0.5, 3, 1, 4}, b[n] = {0.5, -1, 2, 0.25, -3, 1};
    const float w[n] = {1, -0.5f, 0.25f, 2, 0.5f, -1}, wq[n] = {1.25f, -0.25f, 0.5f, 1.5f, 1.0f, -0.75f};
    float v[n];
    for (int N = 1; N <= 1024; N *= 4) {
        quad q = {a, b, 0, 0};
        cr_assert_eq(mpq_pqi(w, wq, n, N, quad_grad, &q, v), MPQ_OK);
        cr_assert_eq(q.calls, N, "N gradient calls");
        for (int i = 0; i < n; i++) {
            /* the gradient is linear along the path: g(t) = g0 + t (g1 - g0) */
            double g0 = a[i] * w[i] + b[i], g1 = a[i] * wq[i] + b[i];
            double riemann = 0; /* eq. 7 written out: right endpoints k/N */
            for (int k = 1; k <= N; k++) riemann += fabs(g0 + (double)k / N * (g1 - g0));
            riemann /= N;
            cr_assert_leq(fabs(v[i] - riemann), 1e-5 * (fabs(g0) + fabs(g1)), "N=%d i=%d: %g vs %g", N, i, (double)v[i],
                          riemann);
            /* and it tends to the exact integral of |g| over [0, 1] */
            double exact;
            if (g0 * g1 >= 0)
                exact = fabs(g0 + g1) / 2;
            else { /* the sign changes at t0 = g0 / (g0 - g1) */
                double t0 = g0 / (g0 - g1);
                exact = fabs(g0) * t0 / 2 + fabs(g1) * (1 - t0) / 2;
            }
            cr_assert_leq(fabs(v[i] - exact), (fabs(g1 - g0) / N) + 1e-5, "N=%d i=%d: %g vs integral %g", N, i,
                          (double)v[i], exact);
            if (N == 1) cr_assert_float_eq(v[i], fabs(g1), 1e-5, "N = 1: the gradient at the quantized point");
        }
    }
    /* no sign change: the right-endpoint sum has the closed form g0 + (g1 - g0)(N + 1)/(2N) */
    {
        quad q = {a, b, 0, 0};
        cr_assert_eq(mpq_pqi(w, wq, n, 10, quad_grad, &q, v), MPQ_OK);
        double g0 = a[0] * w[0] + b[0], g1 = a[0] * wq[0] + b[0];
        cr_assert_float_eq(v[0], g0 + (g1 - g0) * 11.0 / 20.0, 1e-5);
    }
    /* a failing callback stops it, and its status comes back */
    quad q = {a, b, 0, 3};
    float keep[n] = {7, 7, 7, 7, 7, 7};
    cr_assert_eq(mpq_pqi(w, wq, n, 5, quad_grad, &q, keep), MPQ_ERR_DEVICE);
    cr_assert_eq(keep[0], 7.0f);
    cr_assert_eq(mpq_pqi(w, wq, n, 0, quad_grad, &q, v), MPQ_ERR_SIZE);
}

Test(stats, pqi_delta_sums_agree)
{
    synth_rng r = {83};
    const int m = 37, n = 70, br = 8, G = 16, ng = 5, nbr = 5;
    float *v = malloc(4 * m * n), *w = malloc(4 * m * n), *wq = malloc(4 * m * n), *pw = malloc(4 * m * n);
    double row[37], col[70], blk[25], layer;
    for (int k = 0; k < m * n; k++)
        v[k] = fabsf(synth_gauss(&r)), w[k] = synth_gauss(&r), wq[k] = w[k] + 0.1f * synth_gauss(&r);
    cr_assert_eq(mpq_pqi_delta(v, w, wq, m, n, br, G, pw, row, col, blk, &layer), MPQ_OK);
    double srow = 0, scol = 0, sblk = 0;
    for (int i = 0; i < m; i++) srow += row[i];
    for (int j = 0; j < n; j++) scol += col[j];
    for (int b = 0; b < nbr * ng; b++) sblk += blk[b];
    cr_assert_float_eq(srow, layer, 1e-9 * layer);
    cr_assert_float_eq(scol, layer, 1e-9 * layer);
    cr_assert_float_eq(sblk, layer, 1e-9 * layer);
    for (int bi = 0; bi < nbr; bi++) /* one block by brute force */
        for (int bj = 0; bj < ng; bj++) {
            double s = 0;
            for (int i = bi * br; i < m && i < (bi + 1) * br; i++)
                for (int j = bj * G; j < n && j < (bj + 1) * G; j++)
                    s += (double)v[i * n + j] * fabs((double)wq[i * n + j] - w[i * n + j]);
            cr_assert_float_eq(blk[bi * ng + bj], s, 1e-12 * (s + 1));
        }
    cr_assert_eq(pw[5], (float)((double)v[5] * fabs((double)wq[5] - w[5])));
    cr_assert_eq(mpq_pqi_delta(v, w, wq, m, n, br, G, NULL, NULL, NULL, NULL, NULL), MPQ_OK);
    v[9] = NAN;
    cr_assert_eq(mpq_pqi_delta(v, w, wq, m, n, br, G, NULL, row, NULL, NULL, &layer), MPQ_ERR_NONFINITE);
    free(v), free(w), free(wq), free(pw);
}

Test(stats, mxsens_layer_sensitivity_is_normalised_by_the_largest_error)
{
    const double e[3] = {2, 4, 1};
    float S[3];
    cr_assert_eq(mpq_mxsens_layer_sensitivity(e, 3, S), MPQ_OK);
    cr_assert_eq(S[0], 0.5f);
    cr_assert_eq(S[1], 1.0f);
    cr_assert_eq(S[2], 0.25f);
    const double zero[2] = {0, 0}, neg[2] = {1, -1}, nan[2] = {1, NAN};
    cr_assert_eq(mpq_mxsens_layer_sensitivity(zero, 2, S), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_mxsens_layer_sensitivity(neg, 2, S), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_mxsens_layer_sensitivity(nan, 2, S), MPQ_ERR_NONFINITE);
    cr_assert_eq(mpq_mxsens_layer_sensitivity(e, 0, S), MPQ_ERR_SIZE);
}
