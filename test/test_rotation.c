/* Section 14, rotations: mpq_rotation_apply against V built entry by entry
   in float64 from its definition (signs, the Sylvester Hadamard matrix,
   R_m, the Kronecker index j = i m + l), at the sizes of real models and at
   awkward ones; V is orthogonal (V^T V x = x, norms kept, R_m^T R_m = I);
   the seed fixes V; rotated weights times rotated activations give the
   product; a spiky row's largest entry shrinks; and bad input is an error
   that changes nothing. */
#include "common.h"

/* V[a][b] in float64, from the definition. */
static double v_entry(const mpq_rotation *r, int a, int b)
{
    const int m = r->m, ia = a / m, la = a % m, ib = b / m, lb = b % m;
    const double h = (__builtin_popcount((unsigned)(ia & ib)) & 1) ? -1.0 : 1.0;
    return h / sqrt((double)r->p) * (double)r->R[(size_t)la * m + lb] * (double)r->sign[b];
}

/* max |a - b| over max |b| */
static double rel(const float *a, const double *b, int n)
{
    double d = 0, mx = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i])), mx = fmax(mx, fabs(b[i]));
    return d / mx;
}

Test(rotation, applies_v_and_its_transpose_as_defined)
{
    static const int sizes[] = {1, 2, 3, 7, 12, 20, 96, 100, 576, 896, 1536, 2048, 4864, 1000 * 3};
    synth_rng g = {31};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int n = sizes[k];
        mpq_rotation r;
        cr_assert_eq(mpq_rotation_init(&r, n, 1000 + k), MPQ_OK, "n %d", n);
        cr_assert(r.p * r.m == n && r.m % 2 == 1 && (r.p & (r.p - 1)) == 0, "n %d = %d x %d", n, r.p, r.m);
        for (int i = 0; i < n; i++) cr_assert(r.sign[i] == 1.0f || r.sign[i] == -1.0f);
        /* R_m orthogonal */
        double dev = 0;
        for (int a = 0; a < r.m; a++)
            for (int b = 0; b < r.m; b++) {
                double d = 0;
                for (int c = 0; c < r.m; c++) d += (double)r.R[c * r.m + a] * r.R[c * r.m + b];
                dev = fmax(dev, fabs(d - (a == b)));
            }
        cr_assert(dev < 1e-6, "n %d: R_%d^T R_%d - I: %g", n, r.m, r.m, dev);
        /* two vectors with LLM-like outliers, V x and V^T x against float64 */
        const int cnt = 2;
        float *x = malloc(sizeof(float) * n * cnt), *y = malloc(sizeof(float) * n * cnt);
        double *want = malloc(sizeof(double) * n);
        for (int v = 0; v < cnt; v++) synth_activations(&g, x + v * n, n);
        for (int t = 0; t < 2; t++) {
            memcpy(y, x, sizeof(float) * n * cnt);
            cr_assert_eq(mpq_rotation_apply(&r, y, cnt, t), MPQ_OK);
            for (int v = 0; v < cnt; v++) {
                const float *xv = x + v * n;
                for (int a = 0; a < n; a++) {
                    double s = 0;
                    for (int b = 0; b < n; b++) s += (t ? v_entry(&r, b, a) : v_entry(&r, a, b)) * xv[b];
                    want[a] = s;
                }
                const double e = rel(y + v * n, want, n);
                cr_assert(e < 2e-6 * (1 + log2((double)n)), "n %d, %s, vector %d: %.3g", n, t ? "V^T x" : "V x", v, e);
            }
        }
        /* V^T V x = x, and the norm kept */
        memcpy(y, x, sizeof(float) * n * cnt);
        cr_assert_eq(mpq_rotation_apply(&r, y, cnt, 0), MPQ_OK);
        double n0 = 0, n1 = 0;
        for (int i = 0; i < n; i++) n0 += (double)x[i] * x[i], n1 += (double)y[i] * y[i];
        cr_assert(fabs(n1 / n0 - 1) < 1e-5, "n %d: |Vx|^2 / |x|^2 = %.9g", n, n1 / n0);
        cr_assert_eq(mpq_rotation_apply(&r, y, cnt, 1), MPQ_OK);
        for (int v = 0; v < cnt; v++) {
            for (int i = 0; i < n; i++) want[i] = x[v * n + i];
            cr_assert(rel(y + v * n, want, n) < 1e-5, "n %d: V^T V x", n);
        }
        free(x), free(y), free(want);
        mpq_rotation_free(&r);
    }
}

Test(rotation, the_seed_fixes_v_and_products_are_kept)
{
    mpq_rotation a, b, c;
    cr_assert_eq(mpq_rotation_init(&a, 576, 7), MPQ_OK);
    cr_assert_eq(mpq_rotation_init(&b, 576, 7), MPQ_OK);
    cr_assert_eq(mpq_rotation_init(&c, 576, 8), MPQ_OK);
    cr_assert(a.p == 64 && a.m == 9);
    cr_assert(!memcmp(a.sign, b.sign, sizeof(float) * 576) && !memcmp(a.R, b.R, sizeof(float) * 81));
    cr_assert(memcmp(a.sign, c.sign, sizeof(float) * 576) || memcmp(a.R, c.R, sizeof(float) * 81));
    /* (W V^T)(V x) = W x: rows of W rotated as vectors */
    enum { M = 37, N = 576 };
    synth_rng g = {5};
    float *W = malloc(sizeof(float) * M * N), *x = malloc(sizeof(float) * N);
    synth_weights(&g, W, M, N);
    synth_activations(&g, x, N);
    double want[M], maxw = 0, maxr = 0;
    for (int i = 0; i < M; i++) {
        double s = 0;
        for (int j = 0; j < N; j++) s += (double)W[i * N + j] * x[j];
        want[i] = s;
    }
    for (int k = 0; k < M * N; k++) maxw = fmax(maxw, fabs(W[k]));
    cr_assert_eq(mpq_rotation_apply(&a, W, M, 0), MPQ_OK);
    cr_assert_eq(mpq_rotation_apply(&a, x, 1, 0), MPQ_OK);
    for (int k = 0; k < M * N; k++) maxr = fmax(maxr, fabs(W[k]));
    double err = 0, scale = 0;
    for (int i = 0; i < M; i++) {
        double s = 0;
        for (int j = 0; j < N; j++) s += (double)W[i * N + j] * x[j];
        err = fmax(err, fabs(s - want[i])), scale = fmax(scale, fabs(want[i]));
    }
    cr_assert(err < 1e-5 * scale, "the product after rotating both: %.3g of %.3g", err, scale);
    /* the planted outliers (up to 16 times the typical weight) are spread */
    cr_assert(maxr < 0.5 * maxw, "largest |w|: %.4g rotated, %.4g before", maxr, maxw);
    free(W), free(x);
    mpq_rotation_free(&a), mpq_rotation_free(&b), mpq_rotation_free(&c);
}

Test(rotation, bad_input_is_an_error_that_changes_nothing)
{
    mpq_rotation r;
    cr_assert_eq(mpq_rotation_init(&r, 0, 1), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_rotation_init(&r, -4, 1), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_rotation_init(&r, 2 * 1025, 1), MPQ_ERR_SIZE, "odd part 1025");
    cr_assert_eq(mpq_rotation_init(NULL, 8, 1), MPQ_ERR_ARG);
    cr_assert_eq(mpq_rotation_init(&r, 4 * 1023, 1), MPQ_OK, "odd part 1023");
    mpq_rotation_free(&r);
    cr_assert_eq(mpq_rotation_init(&r, 24, 3), MPQ_OK);
    float x[48], keep[48];
    for (int i = 0; i < 48; i++) x[i] = (float)i - 20.0f;
    x[30] = NAN;
    memcpy(keep, x, sizeof x);
    cr_assert_eq(mpq_rotation_apply(&r, x, 2, 0), MPQ_ERR_NONFINITE);
    cr_assert(!memcmp(x, keep, sizeof x), "x unchanged");
    x[30] = INFINITY;
    cr_assert_eq(mpq_rotation_apply(&r, x, 2, 1), MPQ_ERR_NONFINITE);
    cr_assert_eq(mpq_rotation_apply(&r, x, -1, 0), MPQ_ERR_ARG);
    cr_assert_eq(mpq_rotation_apply(&r, NULL, 1, 0), MPQ_ERR_ARG);
    cr_assert_eq(mpq_rotation_apply(&r, NULL, 0, 0), MPQ_OK, "nothing to do");
    mpq_rotation_free(&r);
    mpq_rotation z;
    memset(&z, 0, sizeof z);
    cr_assert_eq(mpq_rotation_apply(&z, x, 1, 0), MPQ_ERR_ARG, "a zeroed rotation");
    mpq_rotation_free(&z), mpq_rotation_free(NULL);
}
