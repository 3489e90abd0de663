/* Section 14, rotations: mpq_rotation_apply against V built entry by entry
   in float64 from its definition (signs, the Sylvester Hadamard matrix,
   R_m, the Kronecker index j = i m + l), at the sizes of real models and at
   awkward ones; V is orthogonal (V^T V x = x, norms kept, R_m^T R_m = I);
   the seed fixes V; rotated weights times rotated activations give the
   product; a spiky row's largest entry shrinks; and bad input is an error
   that changes nothing. */
#include "common.h"

/* s_j, from its bit. */
static double sign_of(const mpq_rotation *r, int j) { return (r->sign[j / 8] >> (j % 8)) & 1 ? -1.0 : 1.0; }

/* V[a][b] in float64, from the definition. */
static double v_entry(const mpq_rotation *r, int a, int b)
{
    const int m = r->m, ia = a / m, la = a % m, ib = b / m, lb = b % m;
    const double h = (__builtin_popcount((unsigned)(ia & ib)) & 1) ? -1.0 : 1.0;
    return h / sqrt((double)r->p) * (double)r->R[(size_t)la * m + lb] * sign_of(r, b);
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
        int neg = 0;
        for (int i = 0; i < n; i++) neg += sign_of(&r, i) < 0;
        cr_assert(n < 96 || (neg > n / 3 && neg < 2 * n / 3), "n %d: %d signs of -1", n, neg);
        if (n % 8) cr_assert_eq(r.sign[n / 8] >> (n % 8), 0, "no sign bit past n");
        cr_assert_eq(mpq_rotation_check(&r), MPQ_OK);
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
                /* the float64 application: rounding of float64 only */
                double *yd = malloc(sizeof(double) * n), d = 0, mx = 0;
                for (int i = 0; i < n; i++) yd[i] = xv[i];
                cr_assert_eq(mpq_rotation_apply_f64(&r, yd, 1, t), MPQ_OK);
                for (int i = 0; i < n; i++) d = fmax(d, fabs(yd[i] - want[i])), mx = fmax(mx, fabs(want[i]));
                cr_assert(d <= 1e-12 * mx, "n %d: float64 %s: %.3g of %.3g", n, t ? "V^T x" : "V x", d, mx);
                free(yd);
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
    cr_assert(!memcmp(a.sign, b.sign, 576 / 8) && !memcmp(a.R, b.R, sizeof(float) * 81));
    cr_assert(memcmp(a.sign, c.sign, 576 / 8) || memcmp(a.R, c.R, sizeof(float) * 81));
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

Test(rotation, a_stored_rotation_is_checked)
{
    mpq_rotation r, b;
    cr_assert_eq(mpq_rotation_init(&r, 200, 9), MPQ_OK); /* 8 x 25 */
    cr_assert_eq(mpq_rotation_check(&r), MPQ_OK);
    uint8_t sign[25];
    float R[625];
    memcpy(sign, r.sign, 25), memcpy(R, r.R, sizeof R);
    b = r, b.sign = sign, b.R = R, b.mem = NULL;
    cr_assert_eq(mpq_rotation_check(&b), MPQ_OK);
    b.p = 4;
    cr_assert_eq(mpq_rotation_check(&b), MPQ_ERR_FORMAT, "p m != n");
    b.p = 8, b.n = 8 * 25 + 8;
    cr_assert_eq(mpq_rotation_check(&b), MPQ_ERR_FORMAT, "p m != n");
    b = r, b.sign = sign, b.R = R, b.p = 2, b.m = 100;
    cr_assert_eq(mpq_rotation_check(&b), MPQ_ERR_FORMAT, "m even");
    b = r, b.sign = sign, b.R = R, b.p = 0;
    cr_assert_eq(mpq_rotation_check(&b), MPQ_ERR_FORMAT, "p 0");
    b = r, b.sign = sign, b.R = R;
    R[7] *= 1.001f;
    cr_assert_eq(mpq_rotation_check(&b), MPQ_ERR_FORMAT, "R not orthogonal");
    R[7] = NAN;
    cr_assert_eq(mpq_rotation_check(&b), MPQ_ERR_FORMAT, "R not finite");
    memcpy(R, r.R, sizeof R);
    cr_assert_eq(mpq_rotation_check(&b), MPQ_OK);
    mpq_rotation c;
    cr_assert_eq(mpq_rotation_init(&c, 198, 9), MPQ_OK); /* 2 x 99: a sign bit past n */
    uint8_t s2[25];
    memcpy(s2, c.sign, 25);
    s2[24] |= 0x80;
    b = c, b.sign = s2;
    cr_assert_eq(mpq_rotation_check(&b), MPQ_ERR_FORMAT, "sign bit past n");
    b.sign = NULL;
    cr_assert_eq(mpq_rotation_check(&b), MPQ_ERR_ARG);
    cr_assert_eq(mpq_rotation_check(NULL), MPQ_ERR_ARG);
    mpq_rotation_free(&r), mpq_rotation_free(&c);
}

/* ---- packed matrices with a rotation ------------------------------------- */

/* A packed matrix with every optional part and the rotation of `seed`, and
   the same matrix packed from W V^T without one. */
typedef struct rot_case {
    int rows, cols, format, group, mixed, extras;
} rot_case;

static const rot_case rot_cases[] = {
    {37, 200, MPQ_FORMAT_BITPLANE, 64, 1, 1},   /* 8 x 25, awkward everything */
    {48, 576, MPQ_FORMAT_BITPLANE, 128, 0, 0},  /* SmolLM2's 576 = 64 x 9 */
    {20, 96, MPQ_FORMAT_MXINT, 32, 1, 1},       /* 32 x 3 */
    {16, 1536, MPQ_FORMAT_BITPLANE, 128, 1, 1}, /* 512 x 3 */
    {5, 1024, MPQ_FORMAT_BITPLANE, 128, 0, 1},  /* m = 1 */
};

typedef struct rot_mats {
    mpq_rotation r;
    mpq_packed A, P; /* A: rotated; P: W V^T packed plainly */
    uint8_t *bits;
    uint32_t *pr, *pc;
    float *cs, *W;
    mpq_sparse S;
} rot_mats;

static void rot_make(rot_mats *M, const rot_case *c, uint64_t seed)
{
    memset(M, 0, sizeof *M);
    synth_rng g = {seed};
    const int R = c->rows, C = c->cols, ng = (C + c->group - 1) / c->group, nbr = (R + 7) / 8;
    M->W = malloc(sizeof(float) * R * C);
    synth_weights(&g, M->W, R, C);
    cr_assert_eq(mpq_rotation_init(&M->r, C, seed), MPQ_OK);
    mpq_bitplane_desc d = {0};
    d.rows = R, d.cols = C, d.group = c->group, d.format = c->format, d.block_rows = 8, d.uniform_bits = 3;
    if (c->mixed) {
        M->bits = malloc((size_t)nbr * ng);
        for (int k = 0; k < nbr * ng; k++) M->bits[k] = (uint8_t)(2 + (k * 7 + 3) % 5);
        d.bits = M->bits;
    }
    if (c->extras) {
        M->pr = malloc(sizeof(uint32_t) * R), M->pc = malloc(sizeof(uint32_t) * C), M->cs = malloc(sizeof(float) * C);
        for (int i = 0; i < R; i++) M->pr[i] = (uint32_t)((i * 7 + 2) % R);
        for (int j = 0; j < C; j++) M->pc[j] = (uint32_t)((j * 7 + 1) % C), M->cs[j] = 0.5f + (float)(j % 11) / 10.0f;
        if (C % 7 == 0) /* keep p_col a permutation */
            for (int j = 0; j < C; j++) M->pc[j] = (uint32_t)(C - 1 - j);
        d.p_row = M->pr, d.p_col = M->pc, d.col_scale = M->cs;
    }
    /* W V^T, rotated the documented way, packed without a rotation */
    float *Wr = malloc(sizeof(float) * R * C);
    memcpy(Wr, M->W, sizeof(float) * R * C);
    cr_assert_eq(mpq_rotation_apply(&M->r, Wr, R, 0), MPQ_OK);
    mpq_status st = mpq_pack_alloc(&d, Wr, &M->P);
    cr_assert_eq(st, MPQ_OK, "%dx%d: %s", R, C, mpq_status_str(st));
    if (c->extras && c->format == MPQ_FORMAT_BITPLANE) { /* a sparse part, rotated coordinates */
        float *D = malloc(sizeof(float) * R * C);
        uint8_t *mask = calloc((size_t)R * C, 1);
        cr_assert_eq(mpq_packed_dequantize(&M->P, 0, D), MPQ_OK);
        for (int k = 0; k < R * C; k += 53) mask[k] = 1;
        cr_assert_eq(mpq_sparse_from_mask(Wr, D, mask, R, C, &M->S), MPQ_OK);
        d.sparse = &M->S;
        mpq_packed_free(&M->P);
        cr_assert_eq(mpq_pack_alloc(&d, Wr, &M->P), MPQ_OK);
        free(D), free(mask);
    }
    d.rotation = &M->r;
    cr_assert_eq(mpq_pack_alloc(&d, M->W, &M->A), MPQ_OK);
    free(Wr);
}

static void rot_free(rot_mats *M)
{
    mpq_packed_free(&M->A), mpq_packed_free(&M->P), mpq_rotation_free(&M->r), mpq_sparse_free(&M->S);
    free(M->bits), free(M->pr), free(M->pc), free(M->cs), free(M->W);
}

Test(rotation, packed_products_apply_v_on_every_path)
{
    for (size_t c = 0; c < sizeof rot_cases / sizeof rot_cases[0]; c++) {
        const rot_case *rc = &rot_cases[c];
        rot_mats M;
        rot_make(&M, rc, 40 + c);
        const int R = rc->rows, C = rc->cols;
        /* the records are those of W V^T: mpq_pack rotated the rows */
        cr_assert_eq(memcmp(M.A.data, M.P.data, (size_t)M.A.band_off[M.A.nbands]), 0, "case %zu: records", c);
        cr_assert_eq(M.A.rot.n, C);
        cr_assert_eq(M.A.rot.seed, 40 + c);
        cr_assert_eq(memcmp(M.A.rot.R, M.r.R, sizeof(float) * M.r.m * M.r.m), 0);
        cr_assert_eq(memcmp(M.A.rot.sign, M.r.sign, (size_t)(C + 7) / 8), 0);
        /* the header: version 2 with a rotation, version 1 without */
        cr_assert_eq(tc_u32((const uint8_t *)M.A.buf + 8), 2);
        cr_assert_eq(tc_u32((const uint8_t *)M.P.buf + 8), 1);
        /* every stored byte counted */
        const double extra = 8.0 * (64 + 4.0 * M.r.m * M.r.m + (C + 7) / 8) / ((double)R * C);
        cr_assert_float_eq(mpq_packed_bpw(&M.A, 2) - mpq_packed_bpw(&M.P, 2), extra, 1e-9);
        cr_assert_float_eq(mpq_packed_bpw(&M.A, 1), mpq_packed_bpw(&M.P, 1), 1e-12);
        tc_mat T;
        tc_decode(M.A.buf, &T); /* the independent reader: W~, rotated coordinates */
        synth_rng g = {7 + c};
        for (int batch = 1; batch <= 3; batch += 2) {
            float *x = malloc(sizeof(float) * batch * C), *xr = malloc(sizeof(float) * batch * C);
            float *y = malloc(sizeof(float) * batch * R), *y2 = malloc(sizeof(float) * batch * R);
            double *ref = malloc(sizeof(double) * batch * R), *mag = malloc(sizeof(double) * batch * R);
            double *ref2 = malloc(sizeof(double) * batch * R);
            for (int v = 0; v < batch; v++) synth_activations(&g, x + (size_t)v * C, C);
            memcpy(xr, x, sizeof(float) * batch * C);
            cr_assert_eq(mpq_rotation_apply(&M.r, xr, batch, 0), MPQ_OK);
            for (int skip = 0; skip <= 1; skip++) {
                /* each path against the float64 model of W~ times V x (V x as the library rounds it) */
                tc_gemv(&T, xr, batch, skip, ref, mag);
                tc_gemv_every_path(&M.A, &T, x, batch, skip, y, ref, mag);
                for (int p = 0; p < TC_NPATHS; p++) {
                    if (!mpq_path_available(tc_paths[p])) continue;
                    for (int a8 = 0; a8 <= 1; a8++) { /* bit for bit the plain matrix on V x, a8 and threads too */
                        mpq_gemv_opts o = {0};
                        o.path = tc_paths[p], o.skip_planes = skip, o.a8 = a8, o.threads = 1 + a8;
                        tc_poison(y, (size_t)batch * R), tc_poison(y2, (size_t)batch * R);
                        cr_assert_eq(mpq_gemv(&M.A, x, y, batch, &o, NULL, 0), MPQ_OK);
                        cr_assert_eq(mpq_gemv(&M.P, xr, y2, batch, &o, NULL, 0), MPQ_OK);
                        cr_assert_eq(memcmp(y, y2, sizeof(float) * batch * R), 0, "case %zu %s a8 %d skip %d", c,
                                     mpq_path_name(tc_paths[p]), a8, skip);
                    }
                }
                /* the float64 reference: W~ times V x, V built entry by entry */
                cr_assert_eq(mpq_gemv_ref(&M.A, x, ref2, batch, skip), MPQ_OK);
                double *vx = malloc(sizeof(double) * C);
                float *wd = malloc(sizeof(float) * R * C);
                mpq_packed U = M.A;
                memset(&U.rot, 0, sizeof U.rot); /* the same buffer seen without its rotation: W~ */
                cr_assert_eq(mpq_packed_dequantize(&U, skip, wd), MPQ_OK);
                for (int v = 0; v < batch; v++) {
                    for (int a = 0; a < C; a++) {
                        double s = 0;
                        for (int b = 0; b < C; b++) s += v_entry(&M.r, a, b) * x[(size_t)v * C + b];
                        vx[a] = s;
                    }
                    for (int i = 0; i < R; i++) {
                        double s = 0, mg = 0;
                        for (int j = 0; j < C; j++) s += (double)wd[(size_t)i * C + j] * vx[j];
                        for (int j = 0; j < C; j++) mg += fabs((double)wd[(size_t)i * C + j] * vx[j]);
                        /* wd is W~ rounded to float: 2^-24 of each term */
                        cr_assert(fabs(ref2[(size_t)v * R + i] - s) <= 1e-7 * mg + 1e-300,
                                  "case %zu row %d: %.12g vs %.12g", c, i, ref2[(size_t)v * R + i], s);
                    }
                }
                free(vx), free(wd);
            }
            free(x), free(xr), free(y), free(y2), free(ref), free(mag), free(ref2);
        }
        tc_free(&T);
        rot_free(&M);
    }
}

Test(rotation, packed_dequantize_returns_original_coordinates)
{
    for (size_t c = 0; c < sizeof rot_cases / sizeof rot_cases[0]; c++) {
        const rot_case *rc = &rot_cases[c];
        rot_mats M;
        rot_make(&M, rc, 60 + c);
        const int R = rc->rows, C = rc->cols;
        float *W = malloc(sizeof(float) * R * C), *Wt = malloc(sizeof(float) * R * C), *w = malloc(sizeof(float) * C);
        cr_assert_eq(mpq_packed_dequantize(&M.A, 0, W), MPQ_OK);
        cr_assert_eq(mpq_packed_dequantize(&M.P, 0, Wt), MPQ_OK); /* W~ */
        double err = 0, mx = 0, qerr = 0, wn = 0;
        for (int i = 0; i < R; i++) {
            for (int b = 0; b < C; b++) { /* (W~ V)[i][b] in float64 */
                double s = 0;
                for (int a = 0; a < C; a++) s += (double)Wt[(size_t)i * C + a] * v_entry(&M.r, a, b);
                err = fmax(err, fabs(W[(size_t)i * C + b] - s)), mx = fmax(mx, fabs(s));
                qerr += pow(W[(size_t)i * C + b] - M.W[(size_t)i * C + b], 2), wn += pow(M.W[(size_t)i * C + b], 2);
            }
            cr_assert_eq(mpq_packed_dequantize_row(&M.A, 0, i, w), MPQ_OK);
            cr_assert_eq(memcmp(w, W + (size_t)i * C, sizeof(float) * C), 0, "case %zu row %d", c, i);
        }
        cr_assert(err <= 2e-6 * (1 + log2((double)C)) * mx, "case %zu: %.3g of %.3g", c, err, mx);
        /* and it approximates W itself (widths 2 to 6: a relative error well below 1) */
        cr_assert(qerr < 0.3 * wn, "case %zu: |W^ - W|^2 / |W|^2 = %.3g", c, qerr / wn);
        free(W), free(Wt), free(w);
        rot_free(&M);
    }
}

Test(rotation, packed_buffers_round_trip_and_bad_ones_are_rejected)
{
    rot_mats M;
    rot_make(&M, &rot_cases[0], 80);
    const size_t n = M.A.bytes;
    uint8_t *b = tc_alloc(n), *keep = tc_alloc(n);
    memcpy(b, M.A.buf, n);
    mpq_packed B;
    cr_assert_eq(mpq_packed_open(b, n, &B), MPQ_OK);
    cr_assert(B.rot.n == 200 && B.rot.p == 8 && B.rot.m == 25 && B.rot.seed == 80);
    cr_assert_eq(B.rot.mem, NULL);
    cr_assert_eq((const uint8_t *)B.rot.R - b, (const uint8_t *)M.A.rot.R - (const uint8_t *)M.A.buf);
    /* the rotation section: after col_scale (offset at header byte 80), 64-aligned */
    const uint64_t off_cs = tc_u64(b + 80), off_rot = (off_cs + 4 * 200 + 63) / 64 * 64;
    cr_assert_eq(tc_u32(b + 44), 25, "m in the header");
    cr_assert_eq(tc_u32(b + off_rot), 1, "kind");
    cr_assert_eq(tc_u32(b + off_rot + 4), 200);
    cr_assert_eq(tc_u32(b + off_rot + 8), 8);
    cr_assert_eq(tc_u32(b + off_rot + 12), 25);
    cr_assert_eq(tc_u64(b + off_rot + 16), 80);
    cr_assert_eq((const uint8_t *)B.rot.R - b, (ptrdiff_t)off_rot + 64);
    memcpy(keep, b, n);
    struct {
        size_t at;
        uint32_t value;
        const char *what;
    } bad[] = {
        {8, 3, "version 3"},
        {8, 1, "version 1 with a rotation"},
        {40, 15, "version 2 without flag 16"},
        {44, 27, "m in the header differs"},
        {44, 0, "m 0"},
        {(size_t)off_rot, 2, "an unknown transform kind"},
        {(size_t)off_rot + 4, 199, "n differs from cols"},
        {(size_t)off_rot + 8, 4, "p m != n"},
        {(size_t)off_rot + 12, 27, "m differs from the header"},
        {(size_t)off_rot + 24, 1, "reserved bytes not zero"},
        {(size_t)off_rot + 64 + 4 * 7, 0x3F800000u, "R not orthogonal"},
        {(size_t)off_rot + 64 + 4 * 7, 0x7FC00000u, "R NaN"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        memcpy(b, keep, n);
        memcpy(b + bad[k].at, &bad[k].value, 4);
        mpq_packed C;
        memset(&C, 0x5A, sizeof C);
        cr_assert_eq(mpq_packed_open(b, n, &C), MPQ_ERR_FORMAT, "%s", bad[k].what);
    }
    /* a plain matrix claiming m or flag 16 */
    memcpy(b, M.P.buf, M.P.bytes);
    uint32_t v = 25;
    memcpy(b + 44, &v, 4);
    cr_assert_eq(mpq_packed_open(b, M.P.bytes, &B), MPQ_ERR_FORMAT, "version 1 with m");
    /* packing: a rotation of the wrong size or a broken one is refused, the buffer untouched */
    mpq_rotation w;
    cr_assert_eq(mpq_rotation_init(&w, 192, 1), MPQ_OK);
    mpq_bitplane_desc d = {0};
    d.rows = 37, d.cols = 200, d.rotation = &w;
    size_t bytes = 0;
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_ERR_SIZE);
    mpq_rotation_free(&w);
    cr_assert_eq(mpq_rotation_init(&w, 200, 1), MPQ_OK);
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_OK);
    uint8_t *out = tc_alloc(bytes);
    memset(out, 0xA5, bytes);
    float *W = malloc(sizeof(float) * 37 * 200);
    memcpy(W, M.W, sizeof(float) * 37 * 200);
    W[1234] = INFINITY;
    mpq_packed C;
    cr_assert_eq(mpq_pack(&d, W, out, bytes, &C), MPQ_ERR_NONFINITE);
    for (size_t k = 0; k < bytes; k++) cr_assert_eq(out[k], 0xA5);
    mpq_rotation broken = w;
    float R2[625];
    memcpy(R2, w.R, sizeof R2);
    R2[3] = 2.0f;
    broken.R = R2;
    d.rotation = &broken;
    cr_assert_eq(mpq_pack(&d, M.W, out, bytes, &C), MPQ_ERR_ARG);
    for (size_t k = 0; k < bytes; k++) cr_assert_eq(out[k], 0xA5);
    mpq_rotation_free(&w);
    free(W);
    mpq_aligned_free(b), mpq_aligned_free(keep), mpq_aligned_free(out);
    rot_free(&M);
}

/* ---- the quantizers on rotated matrices ----------------------------------- */

Test(rotation, conjugation_and_the_quantizers_work_in_the_rotated_basis)
{
    enum { R = 24, C = 96, T = 40 };
    synth_rng g = {3};
    float *W = malloc(sizeof(float) * R * C), *X = malloc(sizeof(float) * T * C), *H = malloc(sizeof(float) * C * C);
    synth_weights(&g, W, R, C);
    synth_tokens(&g, X, T, C, 17);
    for (int a = 0; a < C; a++)
        for (int b = 0; b < C; b++) {
            double h = 0;
            for (int t = 0; t < T; t++) h += (double)X[t * C + a] * X[t * C + b];
            H[a * C + b] = (float)h;
        }
    mpq_rotation r;
    cr_assert_eq(mpq_rotation_init(&r, C, 21), MPQ_OK); /* 32 x 3 */
    /* V H V^T against float64 sums over V's entries; only the lower triangle is read */
    float *Hr = malloc(sizeof(float) * C * C);
    memcpy(Hr, H, sizeof(float) * C * C);
    for (int a = 0; a < C; a++)
        for (int b = a + 1; b < C; b++) Hr[a * C + b] = -1e30f;
    cr_assert_eq(mpq_rotation_conjugate(&r, Hr), MPQ_OK);
    double err = 0, mx = 0;
    for (int a = 0; a < C; a++)
        for (int b = 0; b < C; b++) {
            double s = 0;
            for (int k = 0; k < C; k++)
                for (int l = 0; l < C; l++) s += v_entry(&r, a, k) * (double)H[k * C + l] * v_entry(&r, b, l);
            err = fmax(err, fabs(Hr[a * C + b] - s)), mx = fmax(mx, fabs(s));
        }
    cr_assert(err <= 1e-6 * mx, "V H V^T: %.3g of %.3g", err, mx);
    /* GPTQ and AWQ with d.rotation are GPTQ and AWQ on W V^T, X V^T, V H V^T */
    float *Wr = malloc(sizeof(float) * R * C), *Xr = malloc(sizeof(float) * T * C);
    memcpy(Wr, W, sizeof(float) * R * C), memcpy(Xr, X, sizeof(float) * T * C);
    cr_assert_eq(mpq_rotation_apply(&r, Wr, R, 0), MPQ_OK);
    cr_assert_eq(mpq_rotation_apply(&r, Xr, T, 0), MPQ_OK);
    mpq_bitplane_desc d = {0}, dr;
    d.rows = R, d.cols = C, d.group = 32, d.uniform_bits = 3;
    dr = d, dr.rotation = &r;
    float cs1[C], cs2[C], cl1[R * 3], cl2[R * 3];
    mpq_awq_desc a = {0};
    a.X = X, a.tokens = T, a.grid = 6, a.clip_steps = 5;
    cr_assert_eq(mpq_awq_search(&dr, W, &a, cs1, cl1, NULL), MPQ_OK);
    a.X = Xr;
    cr_assert_eq(mpq_awq_search(&d, Wr, &a, cs2, cl2, NULL), MPQ_OK);
    cr_assert(!memcmp(cs1, cs2, sizeof cs1) && !memcmp(cl1, cl2, sizeof cl1), "AWQ on the rotated copies");
    mpq_gptq_desc q = {0};
    q.H = H;
    mpq_packed A, B;
    dr.col_scale = cs1, d.col_scale = cs1;
    cr_assert_eq(mpq_gptq_alloc(&dr, W, &q, &A, NULL), MPQ_OK);
    q.H = Hr;
    cr_assert_eq(mpq_gptq_alloc(&d, Wr, &q, &B, NULL), MPQ_OK);
    cr_assert_eq(memcmp(A.data, B.data, (size_t)A.band_off[A.nbands]), 0, "GPTQ's records: those of W V^T");
    cr_assert_eq(A.rot.n, C);
    /* bad input changes nothing */
    float keep[C * C];
    H[5 * C + 2] = NAN;
    memcpy(keep, H, sizeof keep);
    cr_assert_eq(mpq_rotation_conjugate(&r, H), MPQ_ERR_NONFINITE);
    cr_assert(!memcmp(keep, H, sizeof keep), "H unchanged");
    cr_assert_eq(mpq_rotation_conjugate(NULL, H), MPQ_ERR_ARG);
    cr_assert_eq(mpq_rotation_conjugate(&r, NULL), MPQ_ERR_ARG);
    mpq_packed_free(&A), mpq_packed_free(&B), mpq_rotation_free(&r);
    free(W), free(X), free(H), free(Hr), free(Wr), free(Xr);
}
