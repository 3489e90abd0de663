/* Section 10, ReQuant: outlier counts (eq. 9), the temperature search
   (algorithm 1), outlier selection, the greedy significant-weight detach
   (algorithm 2), and the whole pipeline on a loss whose change is known. */
#include "common.h"

Test(requant, eq9_on_equal_layers_and_sizes)
{
    /* equal sizes: eq. 9 exactly. dF^0.5 = 1, 2, 3, 4 of 10, K = 1 % of 4000 */
    const double dF[4] = {1, 4, 9, 16};
    const size_t n[4] = {1000, 1000, 1000, 1000};
    size_t c[4];
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 4, 0.01, 0.5, c), MPQ_OK);
    cr_assert(c[0] == 4 && c[1] == 8 && c[2] == 12 && c[3] == 16);
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 4, 0.01, 1.0, c), MPQ_OK); /* 1,4,9,16 of 30 x 40 */
    double want[4] = {40.0 / 30, 160.0 / 30, 360.0 / 30, 640.0 / 30};
    size_t sum = 0;
    for (int l = 0; l < 4; l++) {
        cr_assert_lt(fabs((double)c[l] - want[l]), 1.0);
        sum += c[l];
    }
    cr_assert_eq(sum, 40);
    /* remainders: 1.33, 5.33, 12, 21.33 -> floors 1, 5, 12, 21 = 39, +1 to the
       largest remainder, ties to the earlier layer: layer 0 */
    cr_assert(c[0] == 2 && c[1] == 5 && c[2] == 12 && c[3] == 21);
    /* t = 0 with different sizes: every layer its own r_o (the uniform ratio) */
    const size_t n2[3] = {2000, 500, 7000};
    cr_assert_eq(mpq_requant_outlier_counts(dF, n2, 3, 0.02, 0.0, c), MPQ_OK);
    cr_assert(c[0] == 40 && c[1] == 10 && c[2] == 140);
}

Test(requant, counts_sum_to_the_budget_and_respect_sizes)
{
    synth_rng r = {81};
    for (int trial = 0; trial < 300; trial++) {
        int L = 1 + synth_int(&r, 12);
        double dF[12];
        size_t n[12], c[12], N = 0;
        for (int l = 0; l < L; l++) {
            dF[l] = exp(6.0 * synth_unif(&r) - 3.0);
            n[l] = (size_t)synth_int(&r, 5000);
            N += n[l];
        }
        double ratio = trial % 10 == 0 ? 1.0 : synth_unif(&r) * 0.2, t = 4.0 * synth_unif(&r) - 1.0;
        if (N == 0) continue;
        cr_assert_eq(mpq_requant_outlier_counts(dF, n, L, ratio, t, c), MPQ_OK);
        size_t K = (size_t)floor(ratio * (double)N), sum = 0;
        double ws = 0;
        for (int l = 0; l < L; l++) ws += (double)n[l] * pow(dF[l], t);
        int capped = 0;
        for (int l = 0; l < L; l++) {
            cr_assert_leq(c[l], n[l]);
            sum += c[l];
            capped |= (double)K * n[l] * pow(dF[l], t) / ws >= (double)n[l];
        }
        cr_assert_eq(sum, K);
        if (!capped) /* no layer full: within one of the exact share */
            for (int l = 0; l < L; l++)
                cr_assert_lt(fabs((double)c[l] - (double)K * n[l] * pow(dF[l], t) / ws), 1.0 + 1e-9);
    }
    /* a small, very sensitive layer is capped at its size; the rest is shared */
    const double dF[3] = {1000, 1, 1};
    const size_t n[3] = {10, 1000, 1000};
    size_t c[3];
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 3, 0.05, 1.0, c), MPQ_OK);
    cr_assert(c[0] == 10 && c[1] + c[2] == 90 && c[1] == 45);
}

Test(requant, counts_reject_bad_input)
{
    double dF[2] = {1, 2};
    size_t n[2] = {10, 10}, c[2] = {7, 7};
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 0, 0.1, 0.5, c), MPQ_ERR_ARG);
    cr_assert_eq(mpq_requant_outlier_counts(NULL, n, 2, 0.1, 0.5, c), MPQ_ERR_ARG);
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 2, 1.5, 0.5, c), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 2, NAN, 0.5, c), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 2, 0.1, INFINITY, c), MPQ_ERR_RANGE);
    dF[1] = NAN;
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 2, 0.1, 0.5, c), MPQ_ERR_NONFINITE);
    dF[1] = -1;
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 2, 0.1, 0.5, c), MPQ_ERR_RANGE);
    dF[0] = dF[1] = 0;
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 2, 0.1, 0.5, c), MPQ_ERR_RANGE); /* no share to give */
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 2, 0.1, -0.5, c), MPQ_ERR_RANGE);
    cr_assert(c[0] == 7 && c[1] == 7);
}

/* A loss over counts with its minimum at the counts of t = 0.3. */
typedef struct loss_ctx {
    size_t target[3];
    int calls, fail_at;
    double nan_at;
} loss_ctx;

static mpq_status toy_loss(void *u, const size_t *counts, int L, double *loss)
{
    loss_ctx *c = (loss_ctx *)u;
    if (++c->calls == c->fail_at) return MPQ_ERR_DEVICE;
    double s = 0;
    for (int l = 0; l < L; l++) s += pow((double)counts[l] - (double)c->target[l], 2);
    *loss = c->calls == (int)c->nan_at ? NAN : s;
    return MPQ_OK;
}

static void toy_plan(mpq_plan *p)
{
    memset(p, 0, sizeof *p);
    p->nlayers = 3;
    p->layers = calloc(3, sizeof(mpq_layer_plan));
    int shapes[3][2] = {{64, 100}, {32, 300}, {128, 70000}};
    for (int l = 0; l < 3; l++) {
        mpq_layer_plan *L = &p->layers[l];
        L->rows = shapes[l][0], L->cols = shapes[l][1];
        L->group = 128, L->block_rows = 16, L->format = MPQ_FORMAT_BITPLANE;
        size_t nb = (size_t)((L->rows + 15) / 16) * (size_t)((L->cols + 127) / 128);
        L->bits = malloc(nb);
        memset(L->bits, 4, nb);
    }
}

Test(requant, temperature_search_picks_the_least_loss)
{
    const double dF[3] = {5e-8, 1e-7, 2e-8};
    size_t n[3] = {6400, 9600, 128u * 70000u};
    loss_ctx c = {{0}, 0, 0, 0};
    cr_assert_eq(mpq_requant_outlier_counts(dF, n, 3, 0.005, 0.3, c.target), MPQ_OK);
    mpq_plan p;
    toy_plan(&p);
    double tb = -1;
    cr_assert_eq(mpq_plan_requant(&p, dF, 0.005, 0.1, toy_loss, &c, &tb), MPQ_OK);
    cr_assert_eq(c.calls, 10); /* t = 0, 0.1, ..., 0.9 */
    cr_assert_float_eq(tb, 0.3, 1e-12);
    double sb = 0;
    for (int l = 0; l < 3; l++) {
        cr_assert_eq(p.layers[l].outliers, c.target[l]);
        sb += 4.0 * (p.layers[l].rows + 1) + (p.layers[l].cols <= 65536 ? 4.0 : 6.0) * c.target[l];
    }
    cr_assert_float_eq(p.sparse_bytes, sb, 1e-9);
    char buf[512];
    mpq_plan_summary(&p, buf, sizeof buf);
    cr_assert(strstr(buf, "outliers") && strstr(buf, "sparse bytes"), "%s", buf);
    /* errors leave the plan as it was */
    for (int l = 0; l < 3; l++) p.layers[l].outliers = 0;
    p.sparse_bytes = 0;
    loss_ctx bad = {{0}, 0, 4, 0};
    cr_assert_eq(mpq_plan_requant(&p, dF, 0.005, 0.1, toy_loss, &bad, NULL), MPQ_ERR_DEVICE);
    loss_ctx nan = {{0}, 0, 0, 2};
    cr_assert_eq(mpq_plan_requant(&p, dF, 0.005, 0.1, toy_loss, &nan, NULL), MPQ_ERR_NONFINITE);
    cr_assert_eq(mpq_plan_requant(&p, dF, 0.005, 1.5, toy_loss, &c, NULL), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_plan_requant(&p, dF, 2.0, 0.1, toy_loss, &c, NULL), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_plan_requant(&p, NULL, 0.005, 0.1, toy_loss, &c, NULL), MPQ_ERR_ARG);
    for (int l = 0; l < 3; l++) cr_assert_eq(p.layers[l].outliers, 0);
    cr_assert_eq(p.sparse_bytes, 0);
    mpq_plan_free(&p);
}

Test(requant, outliers_are_the_largest_magnitudes)
{
    synth_rng r = {82};
    for (int trial = 0; trial < 40; trial++) {
        size_t n = 1 + (size_t)synth_int(&r, 3000), k = (size_t)synth_int(&r, (int)n + 1);
        float *W = malloc(4 * n);
        uint8_t *mask = malloc(n);
        for (size_t i = 0; i < n; i++) W[i] = trial % 4 == 0 ? (float)(synth_int(&r, 7) - 3) : synth_student4(&r);
        cr_assert_eq(mpq_requant_outliers(W, n, k, mask), MPQ_OK);
        /* reference: rank of i = weights strictly larger, plus equal ones earlier */
        size_t cnt = 0;
        for (size_t i = 0; i < n; i++) {
            size_t rank = 0;
            for (size_t j = 0; j < n; j++) rank += fabsf(W[j]) > fabsf(W[i]) || (fabsf(W[j]) == fabsf(W[i]) && j < i);
            cr_assert_eq(mask[i], rank < k, "n %zu k %zu i %zu", n, k, i);
            cnt += mask[i];
        }
        cr_assert_eq(cnt, k);
        free(W), free(mask);
    }
    float W[3] = {1, NAN, 2};
    uint8_t m[3];
    cr_assert_eq(mpq_requant_outliers(W, 3, 1, m), MPQ_ERR_NONFINITE);
    cr_assert_eq(mpq_requant_outliers(W, 3, 4, m), MPQ_ERR_SIZE);
}

/* Refresh for a quadratic loss F(w) = sum h_i (w_i - c_i)^2: the PQI along
   W -> Wq, computed with mpq_pqi itself. */
typedef struct quad {
    const float *h, *c; /* concatenated over the layers */
    int calls;
} quad;

static mpq_status quad_grad(void *u, const float *w, float *g, size_t n)
{
    quad *q = (quad *)u;
    for (size_t i = 0; i < n; i++) g[i] = 2.0f * q->h[i] * (w[i] - q->c[i]);
    return MPQ_OK;
}

static mpq_status quad_refresh(void *u, mpq_requant_layer *L, int nl)
{
    quad *q = (quad *)u;
    q->calls++;
    size_t o = 0;
    for (int l = 0; l < nl; l++) {
        quad part = {q->h + o, q->c + o, 0};
        mpq_status st = mpq_pqi(L[l].W, L[l].Wq, L[l].n, 8, quad_grad, &part, L[l].v);
        if (st != MPQ_OK) return st;
        o += L[l].n;
    }
    return MPQ_OK;
}

Test(requant, greedy_detach_matches_a_plain_reference)
{
    synth_rng r = {83};
    for (int steps = 1; steps <= 3; steps++) {
        const int nl = 3;
        size_t n[3] = {500, 1, 2300}, all = 2801;
        float *W = malloc(4 * all), *Wq = malloc(4 * all), *v = malloc(4 * all), *h = malloc(4 * all);
        float *Wr = malloc(4 * all);
        uint8_t *mask = calloc(all, 1), *mr = calloc(all, 1);
        for (size_t i = 0; i < all; i++) {
            W[i] = synth_student4(&r);
            Wq[i] = Wr[i] = W[i] + 0.1f * synth_gauss(&r);
            h[i] = (float)synth_unif(&r);
            if (synth_unif(&r) < 0.02) mask[i] = mr[i] = 1, Wq[i] = Wr[i] = W[i];
        }
        quad q = {h, W, 0};
        mpq_requant_layer L[3];
        size_t o = 0;
        for (int l = 0; l < nl; l++) {
            L[l] = (mpq_requant_layer){W + o, Wq + o, v + o, mask + o, n[l]};
            o += n[l];
        }
        const size_t total = 101;
        cr_assert_eq(mpq_requant_significant(L, nl, total, steps, quad_refresh, &q), MPQ_OK);
        cr_assert_eq(q.calls, steps);
        /* reference: per step, v_i = |2 h_i (Wq_i - W_i)| * (mean of k/N over k = 1..8,
           since the gradient is linear along the path) = |h_i (Wq_i - W_i)| * 9/8,
           score v_i |Wq_i - W_i|, the k best free weights in (score desc, index) order */
        size_t done = 0;
        for (int s = 0; s < steps; s++) {
            size_t k = total * (s + 1) / steps - done;
            for (size_t t = 0; t < k; t++) {
                size_t best = all;
                double bs = -1;
                for (size_t i = 0; i < all; i++) {
                    if (mr[i]) continue;
                    double d = fabs((double)Wr[i] - W[i]), sc = 2.0 * h[i] * d * 9.0 / 16.0 * d;
                    if (sc > bs) bs = sc, best = i;
                }
                mr[best] = 1, Wr[best] = W[best];
            }
            done += k;
        }
        size_t cnt = 0, cref = 0;
        for (size_t i = 0; i < all; i++) {
            cr_assert_eq(mask[i], mr[i], "steps %d weight %zu: lib %d v %g d %g h %g", steps, i, mask[i], (double)v[i],
                         fabs((double)Wq[i] - W[i]), (double)h[i]);
            cr_assert_eq(Wq[i], Wr[i]);
            cnt += mask[i], cref += mr[i];
        }
        cr_assert_eq(cnt, cref);
        /* more than the free weights: an error, nothing changed */
        size_t free_w = all - cnt;
        memcpy(mr, mask, all);
        cr_assert_eq(mpq_requant_significant(L, nl, free_w + 1, steps, quad_refresh, &q), MPQ_ERR_SIZE);
        cr_assert_arr_eq(mr, mask, all);
        cr_assert_eq(mpq_requant_significant(L, nl, 5, 0, quad_refresh, &q), MPQ_ERR_RANGE);
        free(W), free(Wq), free(v), free(h), free(Wr), free(mask), free(mr);
    }
}

/* The whole pipeline on F(w) = sum h_i (w_i - W_i)^2 over two layers, with
   h heavy-tailed (a few weights matter a lot, as PQI finds in LLMs). The loss
   change of quantization is exactly F(W^), so each stage can be checked. */
typedef struct pipeline {
    const float *W[2];
    const float *h[2];
    mpq_bitplane_desc d[2];
    int rows[2], cols[2];
} pipeline;

static double quad_F(const pipeline *P, int l, const float *Wh)
{
    double s = 0;
    for (size_t i = 0; i < (size_t)P->rows[l] * P->cols[l]; i++) s += P->h[l][i] * pow((double)Wh[i] - P->W[l][i], 2);
    return s;
}

/* Dense part of layer l with the mask's weights set to 0, its reconstruction
   D, and the reconstruction with those weights restored. */
static void dense_with(const pipeline *P, int l, const uint8_t *mask, float *D, float *Wh)
{
    size_t n = (size_t)P->rows[l] * P->cols[l];
    float *Wz = malloc(4 * n);
    for (size_t i = 0; i < n; i++) Wz[i] = mask && mask[i] ? 0.0f : P->W[l][i];
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&P->d[l], Wz, &A), MPQ_OK);
    cr_assert_eq(mpq_packed_dequantize(&A, 0, D), MPQ_OK);
    for (size_t i = 0; i < n; i++) Wh[i] = mask && mask[i] ? P->W[l][i] : D[i];
    mpq_packed_free(&A);
    free(Wz);
}

static mpq_status pipe_loss(void *u, const size_t *counts, int nl, double *loss)
{
    pipeline *P = (pipeline *)u;
    *loss = 0;
    for (int l = 0; l < nl; l++) {
        size_t n = (size_t)P->rows[l] * P->cols[l];
        uint8_t *mask = malloc(n);
        float *D = malloc(4 * n), *Wh = malloc(4 * n);
        cr_assert_eq(mpq_requant_outliers(P->W[l], n, counts[l], mask), MPQ_OK);
        dense_with(P, l, mask, D, Wh);
        *loss += quad_F(P, l, Wh);
        free(mask), free(D), free(Wh);
    }
    return MPQ_OK;
}

static mpq_status pipe_refresh(void *u, mpq_requant_layer *L, int nl)
{
    pipeline *P = (pipeline *)u;
    for (int l = 0; l < nl; l++) {
        quad part = {P->h[l], P->W[l], 0};
        mpq_status st = mpq_pqi(L[l].W, L[l].Wq, L[l].n, 16, quad_grad, &part, L[l].v);
        if (st != MPQ_OK) return st;
    }
    return MPQ_OK;
}

Test(requant, the_pipeline_lowers_the_loss_and_the_packed_matrix_computes_it)
{
    synth_rng r = {84};
    pipeline P;
    memset(&P, 0, sizeof P);
    int shapes[2][2] = {{96, 256}, {61, 200}};
    float *W[2], *h[2];
    for (int l = 0; l < 2; l++) {
        P.rows[l] = shapes[l][0], P.cols[l] = shapes[l][1];
        size_t n = (size_t)P.rows[l] * P.cols[l];
        W[l] = malloc(4 * n), h[l] = malloc(4 * n);
        synth_weights(&r, W[l], P.rows[l], P.cols[l]);
        for (size_t i = 0; i < n; i++) h[l][i] = (float)(l + 1) * powf(synth_student4(&r), 2);
        P.W[l] = W[l], P.h[l] = h[l];
        P.d[l].rows = P.rows[l], P.d[l].cols = P.cols[l], P.d[l].group = 64, P.d[l].uniform_bits = 3;
    }
    /* 1. pre-quantize, PQI, mean Delta F_PQI per layer */
    double dF[2], F_rtn = 0;
    float *D[2], *Wh[2], *v[2];
    for (int l = 0; l < 2; l++) {
        size_t n = (size_t)P.rows[l] * P.cols[l];
        D[l] = malloc(4 * n), Wh[l] = malloc(4 * n), v[l] = malloc(4 * n);
        dense_with(&P, l, NULL, D[l], Wh[l]);
        F_rtn += quad_F(&P, l, Wh[l]);
        quad part = {h[l], W[l], 0};
        cr_assert_eq(mpq_pqi(W[l], Wh[l], n, 16, quad_grad, &part, v[l]), MPQ_OK);
        double layer;
        cr_assert_eq(mpq_pqi_delta(v[l], W[l], Wh[l], P.rows[l], P.cols[l], 16, 64, NULL, NULL, NULL, NULL, &layer),
                     MPQ_OK);
        dF[l] = layer / (double)n;
    }
    /* 2. outlier counts by the temperature search (a plan of the two layers) */
    mpq_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.nlayers = 2;
    plan.layers = calloc(2, sizeof(mpq_layer_plan));
    for (int l = 0; l < 2; l++) plan.layers[l].rows = P.rows[l], plan.layers[l].cols = P.cols[l];
    double tb;
    cr_assert_eq(mpq_plan_requant(&plan, dF, 0.005, 0.25, pipe_loss, &P, &tb), MPQ_OK);
    /* 3. outliers removed, dense part re-quantized */
    double F_out = 0;
    uint8_t *mask[2];
    mpq_requant_layer L[2];
    for (int l = 0; l < 2; l++) {
        size_t n = (size_t)P.rows[l] * P.cols[l];
        mask[l] = malloc(n);
        cr_assert_eq(mpq_requant_outliers(W[l], n, plan.layers[l].outliers, mask[l]), MPQ_OK);
        dense_with(&P, l, mask[l], D[l], Wh[l]);
        F_out += quad_F(&P, l, Wh[l]);
        L[l] = (mpq_requant_layer){W[l], Wh[l], v[l], mask[l], n};
    }
    /* 4. significant weights, 0.5 % in two steps */
    size_t total = (size_t)(0.005 * (96 * 256 + 61 * 200));
    cr_assert_eq(mpq_requant_significant(L, 2, total, 2, pipe_refresh, &P), MPQ_OK);
    double F_req = 0;
    for (int l = 0; l < 2; l++) F_req += quad_F(&P, l, Wh[l]);
    cr_assert_lt(F_out, F_rtn);
    cr_assert_lt(F_req, 0.8 * F_out, "RTN %g, outliers %g, ReQuant %g", F_rtn, F_out, F_req);
    /* 5. the packed dense-and-sparse matrix computes that reconstruction */
    for (int l = 0; l < 2; l++) {
        size_t n = (size_t)P.rows[l] * P.cols[l];
        mpq_sparse S;
        cr_assert_eq(mpq_sparse_from_mask(W[l], D[l], mask[l], P.rows[l], P.cols[l], &S), MPQ_OK);
        float *Wz = malloc(4 * n), *R = malloc(4 * n);
        /* the dense part quantizes W with the outliers (only) set to 0 */
        uint8_t *om = malloc(n);
        cr_assert_eq(mpq_requant_outliers(W[l], n, plan.layers[l].outliers, om), MPQ_OK);
        for (size_t i = 0; i < n; i++) Wz[i] = om[i] ? 0.0f : W[l][i];
        mpq_bitplane_desc d = P.d[l];
        d.sparse = &S;
        mpq_packed A;
        cr_assert_eq(mpq_pack_alloc(&d, Wz, &A), MPQ_OK);
        cr_assert_eq(mpq_packed_dequantize(&A, 0, R), MPQ_OK);
        for (size_t i = 0; i < n; i++) /* fp16 of the residual where detached, the dense part elsewhere */
            cr_assert_leq(fabsf(R[i] - Wh[l][i]), mask[l][i] ? fabsf(W[l][i] - D[l][i]) * 1e-3f + 1e-7f : 0.0f);
        cr_assert_gt(mpq_packed_bpw(&A, 2), mpq_packed_bpw(&A, 1));
        mpq_sparse_free(&S);
        mpq_packed_free(&A);
        free(Wz), free(R), free(om);
    }
    mpq_plan_free(&plan);
    for (int l = 0; l < 2; l++) free(W[l]), free(h[l]), free(D[l]), free(Wh[l]), free(v[l]), free(mask[l]);
}

/* ---- the statistics-only split (mpq_requant_masks, mpq_requant_pack) ---- */

/* The dense reconstruction of W with the masked weights at zero, through
   the packer (a primitive tested in test_pack). */
static void rq_dense(const mpq_bitplane_desc *d, const float *W, const uint8_t *mask, double *D)
{
    const size_t n = (size_t)d->rows * d->cols;
    float *Wz = malloc(sizeof(float) * n), *Df = malloc(sizeof(float) * n);
    for (size_t k = 0; k < n; k++) Wz[k] = mask && mask[k] ? 0.0f : W[k];
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(d, Wz, &A), MPQ_OK);
    cr_assert_eq(mpq_packed_dequantize(&A, 0, Df), MPQ_OK);
    for (size_t k = 0; k < n; k++) D[k] = Df[k];
    mpq_packed_free(&A);
    free(Wz), free(Df);
}

/* The `count` largest |w| (ties: lower index), by a full sort. */
static size_t rq_abs_n;
static const float *rq_abs_w;
static int rq_by_abs(const void *a, const void *b)
{
    const uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    const float x = fabsf(rq_abs_w[i]), y = fabsf(rq_abs_w[j]);
    return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}
static void rq_outliers(const float *W, size_t n, size_t count, uint8_t *mask)
{
    uint32_t *idx = malloc(sizeof(uint32_t) * n);
    for (size_t k = 0; k < n; k++) idx[k] = (uint32_t)k;
    rq_abs_w = W, rq_abs_n = n;
    qsort(idx, n, sizeof *idx, rq_by_abs);
    memset(mask, 0, n);
    for (size_t k = 0; k < count; k++) mask[idx[k]] = 1;
    free(idx);
}

typedef struct rq_score {
    double s;
    int map;
    size_t k;
} rq_score;
static int rq_by_score(const void *a, const void *b)
{
    const rq_score *x = (const rq_score *)a, *y = (const rq_score *)b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    if (x->map != y->map) return x->map < y->map ? -1 : 1;
    return (x->k > y->k) - (x->k < y->k);
}

/* The split written the simple way, in float64: the temperature of least
   first-order loss sum v |W^ - W| (outliers exact), those outliers, then
   the significant weights by v |W^ - W| over all maps at once. */
static void rq_reference(mpq_requant_map *M, int n, double outl, double sig, double *t_best, uint8_t **mask)
{
    double dF[8];
    size_t sizes[8], total = 0;
    for (int i = 0; i < n; i++) {
        const size_t nw = (size_t)M[i].d.rows * M[i].d.cols;
        double *D = malloc(sizeof(double) * nw), s = 0;
        rq_dense(&M[i].d, M[i].W, NULL, D);
        for (size_t k = 0; k < nw; k++) s += (double)M[i].pqi[k] * fabs(D[k] - M[i].W[k]);
        dF[i] = s / (double)nw > 1e-30 ? s / (double)nw : 1e-30;
        sizes[i] = nw, total += nw;
        free(D);
    }
    double best = INFINITY;
    size_t counts[8], c[8];
    for (int k = 0; k < 4; k++) {
        const double t = 0.25 * k;
        cr_assert_eq(mpq_requant_outlier_counts(dF, sizes, n, outl, t, c), MPQ_OK);
        double loss = 0;
        for (int i = 0; i < n; i++) {
            uint8_t *m = malloc(sizes[i]);
            double *D = malloc(sizeof(double) * sizes[i]);
            rq_outliers(M[i].W, sizes[i], c[i], m);
            rq_dense(&M[i].d, M[i].W, m, D);
            for (size_t j = 0; j < sizes[i]; j++)
                if (!m[j]) loss += (double)M[i].pqi[j] * fabs(D[j] - M[i].W[j]);
            free(m), free(D);
        }
        if (loss < best) best = loss, *t_best = t, memcpy(counts, c, sizeof c);
    }
    rq_score *sc = malloc(sizeof *sc * total);
    size_t ns = 0;
    for (int i = 0; i < n; i++) {
        double *D = malloc(sizeof(double) * sizes[i]);
        rq_outliers(M[i].W, sizes[i], counts[i], mask[i]);
        rq_dense(&M[i].d, M[i].W, mask[i], D);
        for (size_t j = 0; j < sizes[i]; j++)
            if (!mask[i][j])
                sc[ns].s = (double)M[i].pqi[j] * fabs((double)(float)D[j] - M[i].W[j]), sc[ns].map = i, sc[ns].k = j,
                ns++;
        free(D);
    }
    qsort(sc, ns, sizeof *sc, rq_by_score);
    const size_t detach = (size_t)(sig * (double)total);
    for (size_t k = 0; k < detach; k++) mask[sc[k].map][sc[k].k] = 1;
    free(sc);
}

Test(requant, statistics_only_split_against_a_plain_reference)
{
    synth_rng r = {123};
    enum { NM = 3 };
    const int shapes[NM][2] = {{40, 72}, {33, 100}, {64, 128}};
    mpq_requant_map M[NM];
    uint8_t *ref[NM];
    float *cs = NULL;
    for (int i = 0; i < NM; i++) {
        const int rows = shapes[i][0], cols = shapes[i][1];
        float *W = malloc(sizeof(float) * rows * cols), *v = malloc(sizeof(float) * rows * cols);
        synth_weights(&r, W, rows, cols);
        for (int k = 0; k < rows * cols; k++) v[k] = (float)(fabs(W[k]) * (0.5 + synth_unif(&r)) * (1 + i));
        memset(&M[i], 0, sizeof M[i]);
        M[i].W = W, M[i].pqi = v, M[i].mask = malloc((size_t)rows * cols);
        M[i].d.rows = rows, M[i].d.cols = cols, M[i].d.uniform_bits = 3, M[i].d.group = 32;
        ref[i] = malloc((size_t)rows * cols);
    }
    /* one map under column scales, as AWQ leaves them */
    cs = malloc(sizeof(float) * 72);
    for (int j = 0; j < 72; j++) cs[j] = (float)(0.6 + synth_unif(&r));
    M[0].d.col_scale = cs;
    double t = -1, tr = -1;
    size_t marked = 0;
    cr_assert_eq(mpq_requant_masks(M, NM, 0.01, 0.02, &t, &marked), MPQ_OK);
    rq_reference(M, NM, 0.01, 0.02, &tr, ref);
    cr_assert_eq(t, tr, "temperature %g, the reference's %g", t, tr);
    size_t mine = 0, total = 0;
    for (int i = 0; i < NM; i++) {
        const size_t nw = (size_t)shapes[i][0] * shapes[i][1];
        total += nw;
        for (size_t k = 0; k < nw; k++) {
            cr_assert_eq(M[i].mask[k], ref[i][k], "map %d weight %zu", i, k);
            mine += M[i].mask[k];
        }
    }
    cr_assert_eq(mine, marked);
    cr_assert_geq(marked, (size_t)(0.02 * total) + (size_t)(0.01 * total) - 3);
    /* the packed matrix: dense part with the marked weights at zero, and a
       sparse part that restores them (to fp16) */
    for (int i = 0; i < NM; i++) {
        const size_t nw = (size_t)shapes[i][0] * shapes[i][1];
        mpq_packed A;
        cr_assert_eq(mpq_requant_pack(&M[i], &A), MPQ_OK);
        cr_assert_eq(A.sp_nnz, (size_t)0 + (size_t)A.sp_row_ptr[A.rows]);
        float *got = malloc(sizeof(float) * nw);
        double *D = malloc(sizeof(double) * nw);
        cr_assert_eq(mpq_packed_dequantize(&A, 0, got), MPQ_OK);
        rq_dense(&M[i].d, M[i].W, M[i].mask, D);
        size_t nnz = 0;
        for (size_t k = 0; k < nw; k++) {
            if (M[i].mask[k]) {
                nnz++;
                cr_assert_leq(fabs((double)got[k] - M[i].W[k]), 1e-3 * fabs(M[i].W[k]) + 1e-6, "map %d %zu", i, k);
            } else {
                cr_assert_eq((double)got[k], D[k], "map %d %zu: the dense part alone", i, k);
            }
        }
        cr_assert_eq(A.sp_nnz, nnz);
        mpq_packed_free(&A);
        free(got), free(D);
    }
    /* errors: nothing written */
    cr_assert_eq(mpq_requant_masks(M, 0, 0.01, 0.01, &t, &marked), MPQ_ERR_ARG);
    cr_assert_eq(mpq_requant_masks(M, NM, 0.6, 0.01, &t, &marked), MPQ_ERR_ARG);
    float *keep = (float *)M[1].pqi;
    M[1].pqi = NULL;
    cr_assert_eq(mpq_requant_masks(M, NM, 0.01, 0.01, &t, &marked), MPQ_ERR_ARG);
    M[1].pqi = keep;
    memcpy(ref[2], M[2].mask, (size_t)shapes[2][0] * shapes[2][1]);
    keep[5] = NAN;
    cr_assert_eq(mpq_requant_masks(M, NM, 0.01, 0.01, &t, &marked), MPQ_ERR_NONFINITE);
    cr_assert_eq(memcmp(ref[2], M[2].mask, (size_t)shapes[2][0] * shapes[2][1]), 0, "masks untouched");
    cr_assert_eq(mpq_requant_pack(NULL, NULL), MPQ_ERR_ARG);
    for (int i = 0; i < NM; i++) free((void *)M[i].W), free((void *)M[i].pqi), free(M[i].mask), free(ref[i]);
    free(cs);
}
