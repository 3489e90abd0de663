/* AWQ: the scale grid and the clip search, checked with objectives computed
   here in float64 from the packed bytes. */
#include "common.h"

/* Mean over tokens and rows of the squared output error of packed A on X. */
static double objective(const mpq_packed *A, const float *W, const float *X, int tokens)
{
    const int m = A->rows, n = A->cols;
    float *Wd = malloc(sizeof(float) * m * n);
    cr_assert_eq(mpq_packed_dequantize(A, 0, Wd), MPQ_OK);
    double tot = 0;
    for (int t = 0; t < tokens; t++)
        for (int i = 0; i < m; i++) {
            double e = 0;
            for (int j = 0; j < n; j++)
                e += ((double)Wd[(size_t)i * n + j] - W[(size_t)i * n + j]) * X[(size_t)t * n + j];
            tot += e * e;
        }
    free(Wd);
    return tot / ((double)tokens * m);
}

typedef struct layer {
    int m, n, format, group, br, with_perm;
    float *W, *X, *Xh; /* weights, calibration and held-out tokens */
    int tokens;
    uint8_t *bits;
    uint32_t *pr, *pc;
    mpq_bitplane_desc d;
} layer;

static void make_layer(synth_rng *r, layer *L, int m, int n, int format, int with_perm, int bmin, int bmax)
{
    memset(L, 0, sizeof *L);
    L->m = m, L->n = n, L->format = format, L->with_perm = with_perm, L->tokens = 64;
    L->group = format == MPQ_FORMAT_MXINT ? 32 : 64, L->br = 16;
    L->W = malloc(sizeof(float) * m * n);
    L->X = malloc(sizeof(float) * n * L->tokens);
    L->Xh = malloc(sizeof(float) * n * L->tokens);
    for (size_t k = 0; k < (size_t)m * n; k++) L->W[k] = 0.02f * synth_student4(r);
    /* planted salient input channels: the same few channels carry large
       activations in every token, as in LLMs */
    int hot[8];
    for (int k = 0; k < 8; k++) hot[k] = synth_int(r, n);
    for (int t = 0; t < L->tokens; t++)
        for (int pass = 0; pass < 2; pass++) {
            float *x = (pass ? L->Xh : L->X) + (size_t)t * n;
            for (int j = 0; j < n; j++) x[j] = synth_gauss(r);
            for (int k = 0; k < 8; k++) x[hot[k]] *= 25.0f;
        }
    int nb = ((m + L->br - 1) / L->br) * ((n + L->group - 1) / L->group);
    L->bits = malloc((size_t)nb);
    for (int k = 0; k < nb; k++) L->bits[k] = (uint8_t)(bmin + synth_int(r, bmax - bmin + 1));
    L->pr = malloc(4u * m);
    L->pc = malloc(4u * n);
    synth_perm(r, L->pr, m);
    synth_perm(r, L->pc, n);
    L->d.format = format, L->d.rows = m, L->d.cols = n, L->d.group = L->group, L->d.block_rows = L->br,
    L->d.bits = L->bits;
    if (with_perm) L->d.p_row = L->pr, L->d.p_col = L->pc;
}

static void free_layer(layer *L) { free(L->W), free(L->X), free(L->Xh), free(L->bits), free(L->pr), free(L->pc); }

Test(awq, never_worse_than_rtn_and_the_reported_losses_are_the_objective)
{
    synth_rng r = {61};
    for (int fmt = 1; fmt <= 2; fmt++)
        for (int wp = 0; wp < 2; wp++) {
            layer L;
            make_layer(&r, &L, 80, 200, fmt, wp, fmt == 2 ? 2 : 2, 4);
            int ng = (L.n + L.group - 1) / L.group;
            float *cs = malloc(4u * L.n), *clip = malloc(4u * L.m * ng);
            mpq_awq_desc a = {0};
            a.X = L.X, a.tokens = L.tokens;
            mpq_awq_result res;
            cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, &res), MPQ_OK);
            cr_assert_leq(res.loss_scaled, res.loss_rtn, "alpha = 0 is in the grid");
            cr_assert(res.alpha >= 0.0f && res.alpha < 1.0f);
            /* the same numbers, from the packed matrices, in float64 here */
            mpq_packed A;
            cr_assert_eq(mpq_pack_alloc(&L.d, L.W, &A), MPQ_OK);
            double rtn = objective(&A, L.W, L.X, L.tokens);
            mpq_packed_free(&A);
            mpq_bitplane_desc d = L.d;
            d.col_scale = cs;
            cr_assert_eq(mpq_pack_alloc(&d, L.W, &A), MPQ_OK);
            double scaled = objective(&A, L.W, L.X, L.tokens);
            mpq_packed_free(&A);
            d.clip = clip;
            cr_assert_eq(mpq_pack_alloc(&d, L.W, &A), MPQ_OK);
            double final = objective(&A, L.W, L.X, L.tokens);
            mpq_packed_free(&A);
            cr_assert_leq(fabs(rtn - res.loss_rtn), 1e-3 * rtn, "RTN objective %g vs %g", rtn, res.loss_rtn);
            cr_assert_leq(fabs(scaled - res.loss_scaled), 1e-3 * scaled, "scaled objective %g vs %g", scaled,
                          res.loss_scaled);
            cr_assert_leq(fabs(final - res.loss_final), 1e-3 * final, "final objective %g vs %g", final,
                          res.loss_final);
            cr_assert_leq(scaled, rtn * (1 + 1e-6));
            free(cs), free(clip);
            free_layer(&L);
        }
}

Test(awq, planted_salient_channels_cut_the_held_out_error)
{
    synth_rng r = {62};
    for (int fmt = 1; fmt <= 2; fmt++) {
        layer L;
        make_layer(&r, &L, 128, 512, fmt, 1, 3, 3);
        int ng = (L.n + L.group - 1) / L.group;
        float *cs = malloc(4u * L.n), *clip = malloc(4u * L.m * ng);
        mpq_awq_desc a = {0};
        a.X = L.X, a.tokens = L.tokens;
        mpq_awq_result res;
        cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, &res), MPQ_OK);
        mpq_packed A, B;
        cr_assert_eq(mpq_pack_alloc(&L.d, L.W, &A), MPQ_OK);
        mpq_bitplane_desc d = L.d;
        d.col_scale = cs, d.clip = clip;
        cr_assert_eq(mpq_pack_alloc(&d, L.W, &B), MPQ_OK);
        double rtn = objective(&A, L.W, L.Xh, L.tokens), awq = objective(&B, L.W, L.Xh, L.tokens);
        cr_assert_lt(awq, 0.7 * rtn, "format %d: held-out error AWQ %g vs RTN %g (alpha %.2f)", fmt, awq, rtn,
                     res.alpha);
        cr_assert_gt(res.alpha, 0.0f);
        mpq_packed_free(&A);
        mpq_packed_free(&B);
        free(cs), free(clip);
        free_layer(&L);
    }
}

Test(awq, clipping_never_increases_a_groups_error)
{
    synth_rng r = {63};
    layer L;
    make_layer(&r, &L, 40, 256, 1, 1, 2, 4);
    const int ng = (L.n + L.group - 1) / L.group, ct = 32;
    float *cs = malloc(4u * L.n), *clip = malloc(4u * L.m * ng);
    mpq_awq_desc a = {0};
    a.X = L.X, a.tokens = L.tokens;
    cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, NULL), MPQ_OK);
    int clipped = 0;
    for (int i = 0; i < L.m; i++)
        for (int g = 0; g < ng; g++) {
            int b = L.bits[(i / 16) * ng + g];
            float v[64], vc[64];
            double err[2];
            for (int k = 0; k < 64; k++) v[k] = L.W[(size_t)L.pr[i] * L.n + L.pc[g * 64 + k]] / cs[g * 64 + k];
            float cl = clip[i * ng + g];
            cr_assert_geq(cl, 0.0f);
            clipped += cl > 0;
            for (int pass = 0; pass < 2; pass++) { /* 0: as chosen, 1: no clip */
                for (int k = 0; k < 64; k++) vc[k] = (pass == 0 && cl > 0) ? fminf(fmaxf(v[k], -cl), cl) : v[k];
                uint8_t q[64];
                uint16_t hs = 0, hz = 0;
                mpq_quantize_group(vc, 64, b, 0, q, &hs, &hz);
                err[pass] = 0;
                for (int u = 0; u < ct; u++) { /* the documented sample: evenly spaced tokens */
                    int t = u * L.tokens / ct;
                    double e = 0;
                    for (int k = 0; k < 64; k++)
                        e += (mpq_dequant_value(q[k], b, 0, tc_half(hs), tc_half(hz)) - v[k]) * cs[g * 64 + k] *
                            L.X[(size_t)t * L.n + L.pc[g * 64 + k]];
                    err[pass] += e * e;
                }
            }
            cr_assert_leq(err[0], err[1] * (1 + 1e-5) + 1e-12, "row %d group %d: clip %g raised the error", i, g, cl);
        }
    cr_assert_gt(clipped, 0, "some group should prefer a clip");
    free(cs), free(clip);
    free_layer(&L);
}

Test(awq, the_packed_result_multiplies_correctly_on_every_path)
{
    synth_rng r = {64};
    for (int fmt = 1; fmt <= 2; fmt++) {
        layer L;
        make_layer(&r, &L, 50, 160, fmt, 1, 2, 6);
        int ng = (L.n + L.group - 1) / L.group;
        float *cs = malloc(4u * L.n), *clip = malloc(4u * L.m * ng), y[50];
        double ref[50], mag[50];
        mpq_awq_desc a = {0};
        a.X = L.X, a.tokens = L.tokens;
        cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, NULL), MPQ_OK);
        mpq_bitplane_desc d = L.d;
        d.col_scale = cs, d.clip = clip;
        mpq_packed A;
        cr_assert_eq(mpq_pack_alloc(&d, L.W, &A), MPQ_OK);
        tc_mat M;
        tc_decode(A.buf, &M);
        tc_gemv(&M, L.Xh, 1, 0, ref, mag);
        tc_gemv_every_path(&A, &M, L.Xh, 1, 0, y, ref, mag);
        tc_free(&M);
        mpq_packed_free(&A);
        free(cs), free(clip);
        free_layer(&L);
    }
}

Test(awq, bad_inputs_are_errors_and_write_nothing)
{
    synth_rng r = {65};
    layer L;
    make_layer(&r, &L, 20, 64, 1, 0, 3, 3);
    float cs[64], clip[20];
    for (int k = 0; k < 64; k++) cs[k] = 7.0f;
    for (int k = 0; k < 20; k++) clip[k] = 7.0f;
    mpq_awq_desc a = {0};
    a.X = L.X, a.tokens = L.tokens;
    L.X[100] = NAN;
    cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, NULL), MPQ_ERR_NONFINITE);
    L.X[100] = 1.0f;
    L.W[5] = INFINITY;
    cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, NULL), MPQ_ERR_NONFINITE);
    L.W[5] = 0.0f;
    a.tokens = 0;
    cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, NULL), MPQ_ERR_SIZE);
    a.tokens = L.tokens, a.X = NULL;
    cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, NULL), MPQ_ERR_ARG);
    a.X = L.X;
    cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, NULL, NULL), MPQ_ERR_ARG, "clip output needed");
    a.max_shrink = 1.5f;
    cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, NULL), MPQ_ERR_ARG);
    for (int k = 0; k < 64; k++) cr_assert_eq(cs[k], 7.0f);
    for (int k = 0; k < 20; k++) cr_assert_eq(clip[k], 7.0f);
    /* clip values in a description: negative or NaN is an error */
    mpq_bitplane_desc d = L.d;
    clip[3] = -1.0f;
    d.clip = clip;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, L.W, &A), MPQ_ERR_RANGE);
    clip[3] = NAN;
    cr_assert_eq(mpq_pack_alloc(&d, L.W, &A), MPQ_ERR_NONFINITE);
    /* no clip search: clip is written with zeros, or may be NULL */
    a.max_shrink = 0.0f, a.clip_steps = -1;
    cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, NULL, NULL), MPQ_OK);
    cr_assert_eq(mpq_awq_search(&L.d, L.W, &a, cs, clip, NULL), MPQ_OK);
    for (int k = 0; k < 20; k++) cr_assert_eq(clip[k], 0.0f);
    free_layer(&L);
}
