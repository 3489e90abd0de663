/* Section 10: plans and the SFMP planner. */
#include "common.h"

typedef struct model {
    int n;
    mpq_sfmp_layer L[8];
} model;

static void make_model(synth_rng *r, model *M, int n, const int (*shape)[2])
{
    M->n = n;
    for (int l = 0; l < n; l++) {
        int m = shape[l][0], c = shape[l][1];
        float *S = malloc(sizeof(float) * m * c);
        for (int k = 0; k < m * c; k++) S[k] = 1e-6f * fabsf(synth_student4(r));
        for (int k = 0; k < 2; k++) { /* planted salient rows and columns, as in SFMP's figure 13 */
            int i = synth_int(r, m), j = synth_int(r, c);
            for (int q = 0; q < c; q++) S[i * c + q] *= 30.0f;
            for (int q = 0; q < m; q++) S[q * c + j] *= 30.0f;
        }
        M->L[l].S = S, M->L[l].rows = m, M->L[l].cols = c;
    }
}

static void free_model(model *M)
{
    for (int l = 0; l < M->n; l++) free((void *)M->L[l].S);
}

static double frac_at(const mpq_plan *p, int bits)
{
    double w = 0, all = 0;
    for (int l = 0; l < p->nlayers; l++) {
        const mpq_layer_plan *L = &p->layers[l];
        int ng = (L->cols + L->group - 1) / L->group;
        for (int i = 0; i < L->rows; i++)
            for (int j = 0; j < L->cols; j++) {
                w += L->bits[(i / L->block_rows) * ng + j / L->group] == bits;
                all += 1;
            }
    }
    return w / all;
}

/* Layer l of plan p packs (mpq_plan_desc is what mpq_pack takes) to exactly
   the bits per weight the plan accounted for it. */
static void packs_as_accounted(synth_rng *r, const mpq_plan *p, int l)
{
    const mpq_layer_plan *L = &p->layers[l];
    float *W = malloc(sizeof(float) * L->rows * L->cols);
    synth_weights(r, W, L->rows, L->cols);
    mpq_bitplane_desc d;
    cr_assert_eq(mpq_plan_desc(p, l, &d), MPQ_OK);
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    cr_assert_float_eq(mpq_packed_bpw(&A, 1), (L->weight_bits + L->meta_bits) / ((double)L->rows * L->cols), 1e-12);
    mpq_packed_free(&A);
    free(W);
}

Test(plan, sfmp_2_25_bpw_at_group_256_puts_an_eighth_at_3_bits)
{
    synth_rng r = {91};
    const int shape[2][2] = {{512, 1024}, {256, 2048}};
    model M;
    make_model(&r, &M, 2, shape);
    mpq_sfmp_desc d = {0};
    d.bpw = 2.25, d.group = 256;
    mpq_plan p;
    cr_assert_eq(mpq_plan_sfmp(M.L, 2, &d, &p), MPQ_OK);
    /* 2.25 - 32/256 metadata = 2.125 weight bits: 12.5 % at 3 bits */
    cr_assert_float_eq(frac_at(&p, 3), 0.125, 1e-12);
    cr_assert_float_eq(frac_at(&p, 2), 0.875, 1e-12);
    cr_assert_float_eq(p.bpw, 2.25, 1e-12);
    /* and it is the most salient eighth of the blocks, ranked across both layers */
    double *sal = malloc(sizeof(double) * 256);
    int *who = malloc(sizeof(int) * 256), nb = 0;
    for (int l = 0; l < 2; l++) {
        int m = shape[l][0], c = shape[l][1], ng = c / 256;
        for (int br = 0; br < m / 16; br++)
            for (int g = 0; g < ng; g++, nb++) {
                double s = 0;
                for (int i = br * 16; i < br * 16 + 16; i++)
                    for (int j = g * 256; j < g * 256 + 256; j++) s += M.L[l].S[i * c + j];
                sal[nb] = s;
                who[nb] = p.layers[l].bits[br * ng + g];
            }
    }
    for (int a = 0; a < nb; a++) /* every 3-bit block outranks every 2-bit block */
        for (int b = 0; b < nb; b++)
            if (who[a] == 3 && who[b] == 2) cr_assert_geq(sal[a], sal[b] * (1 - 1e-6));
    free(sal), free(who);
    mpq_plan_free(&p);
    free_model(&M);
}

/* A random model of 1 to 4 layers with a random description: shapes into
   shape, the count into *n, and the weights and exact metadata bits (a
   partial group costs a whole pair); d.bpw between the lowest budget and 7
   bits above it. */
static mpq_sfmp_desc random_model(synth_rng *r, model *M, int shape[4][2], int *n, double *meta, double *nw)
{
    *n = 1 + synth_int(r, 4);
    for (int l = 0; l < *n; l++) shape[l][0] = 1 + synth_int(r, 90), shape[l][1] = 8 + synth_int(r, 300);
    make_model(r, M, *n, (const int(*)[2])shape);
    mpq_sfmp_desc d = {0};
    d.group = 8 * (1 + synth_int(r, 16));
    d.block_rows = 1 + synth_int(r, 40);
    d.reorder = synth_int(r, 4);
    *meta = 0, *nw = 0;
    for (int l = 0; l < *n; l++) {
        *meta += 32.0 * shape[l][0] * ((shape[l][1] + d.group - 1) / d.group);
        *nw += (double)shape[l][0] * shape[l][1];
    }
    d.bpw = 1.0 + *meta / *nw + 7.0 * synth_unif(r);
    return d;
}

Test(plan, budgets_are_met_from_below_on_random_models)
{
    synth_rng r = {92};
    for (int rep = 0; rep < 40; rep++) {
        int shape[4][2], n;
        model M;
        double meta, nw0;
        mpq_sfmp_desc d = random_model(&r, &M, shape, &n, &meta, &nw0);
        mpq_plan p;
        cr_assert_eq(mpq_plan_sfmp(M.L, n, &d, &p), MPQ_OK);
        cr_assert_leq(p.bpw, d.bpw + 1e-12, "budget %g exceeded: %g", d.bpw, p.bpw);
        /* from below by less than one block */
        double nw = 0, biggest = (double)d.block_rows * d.group;
        for (int l = 0; l < n; l++) nw += (double)shape[l][0] * shape[l][1];
        if (d.bpw < 8.0) cr_assert_geq(p.bpw, d.bpw - biggest / nw - 1e-12, "budget %g, achieved %g", d.bpw, p.bpw);
        for (int l = 0; l < n; l++) {
            if (p.layers[l].p_row) cr_assert_eq(mpq_perm_validate(p.layers[l].p_row, shape[l][0]), MPQ_OK);
            if (p.layers[l].p_col) cr_assert_eq(mpq_perm_validate(p.layers[l].p_col, shape[l][1]), MPQ_OK);
        }
        mpq_plan_free(&p);
        d.bpw = 0.999 + meta / nw0; /* just below 1 weight bit */
        cr_assert_eq(mpq_plan_sfmp(M.L, n, &d, &p), MPQ_ERR_RANGE);
        /* the range the tool reports: its ends plan every block at 1 and at 8 bits */
        double lo = 0, hi = 0;
        cr_assert_eq(mpq_sfmp_bpw_range(M.L, n, &d, &lo, &hi), MPQ_OK);
        cr_assert_float_eq(lo, 1.0 + meta / nw0, 1e-12);
        cr_assert_float_eq(hi, 8.0 + meta / nw0, 1e-12);
        const double ends[2] = {lo, hi};
        for (int e = 0; e < 2; e++) {
            d.bpw = ends[e];
            cr_assert_eq(mpq_plan_sfmp(M.L, n, &d, &p), MPQ_OK, "budget %.17g", d.bpw);
            cr_assert_float_eq(frac_at(&p, e ? 8 : 1), 1.0, 0, "budget %.17g", d.bpw);
            mpq_plan_free(&p);
        }
        d.bpw = nextafter(lo, 0.0); /* the range is tight */
        cr_assert_eq(mpq_plan_sfmp(M.L, n, &d, &p), MPQ_ERR_RANGE);
        cr_assert_eq(mpq_sfmp_bpw_range(M.L, n, &d, &lo, NULL), MPQ_ERR_ARG);
        cr_assert_eq(mpq_sfmp_bpw_range(M.L, 0, &d, &lo, &hi), MPQ_ERR_SIZE);
        free_model(&M);
    }
}

Test(plan, integer_budgets_edges_and_ties)
{
    synth_rng r = {93};
    const int shape[1][2] = {{64, 512}};
    model M;
    make_model(&r, &M, 1, shape);
    mpq_sfmp_desc d = {0};
    mpq_plan p;
    d.bpw = 3.25; /* group 128: exactly 3 weight bits */
    cr_assert_eq(mpq_plan_sfmp(M.L, 1, &d, &p), MPQ_OK);
    cr_assert_float_eq(frac_at(&p, 3), 1.0, 0);
    mpq_plan_free(&p);
    d.bpw = 1.2; /* below 1 weight bit after metadata */
    memset(&p, 0x5A, sizeof p);
    cr_assert_eq(mpq_plan_sfmp(M.L, 1, &d, &p), MPQ_ERR_RANGE);
    d.bpw = 9.0; /* above 8: every block at 8 */
    cr_assert_eq(mpq_plan_sfmp(M.L, 1, &d, &p), MPQ_OK);
    cr_assert_float_eq(frac_at(&p, 8), 1.0, 0);
    cr_assert_float_eq(p.bpw, 8.25, 1e-12);
    mpq_plan_free(&p);
    /* equal salience everywhere: the first blocks (layer, then block order) win */
    float *S = (float *)M.L[0].S;
    for (int k = 0; k < 64 * 512; k++) S[k] = 1.0f;
    d.bpw = 2.25 + 0.25; /* group 128: 2.25 weight bits, a quarter of the blocks at 3 */
    cr_assert_eq(mpq_plan_sfmp(M.L, 1, &d, &p), MPQ_OK);
    for (int b = 0; b < 16; b++) cr_assert_eq(p.layers[0].bits[b], b < 4 ? 3 : 2, "block %d", b);
    mpq_plan_free(&p);
    /* bad inputs */
    S[7] = NAN;
    cr_assert_eq(mpq_plan_sfmp(M.L, 1, &d, &p), MPQ_ERR_NONFINITE);
    S[7] = -1.0f;
    cr_assert_eq(mpq_plan_sfmp(M.L, 1, &d, &p), MPQ_ERR_RANGE);
    S[7] = 1.0f;
    cr_assert_eq(mpq_plan_sfmp(M.L, 0, &d, &p), MPQ_ERR_SIZE, "an empty layer list");
    d.group = 12;
    cr_assert_eq(mpq_plan_sfmp(M.L, 1, &d, &p), MPQ_ERR_ARG);
    d.group = 0, d.bpw = NAN;
    cr_assert_eq(mpq_plan_sfmp(M.L, 1, &d, &p), MPQ_ERR_ARG);
    free_model(&M);
}

Test(plan, reordering_gathers_salience_into_the_promoted_blocks)
{
    synth_rng r = {94};
    const int shape[2][2] = {{256, 512}, {128, 1024}};
    model M;
    make_model(&r, &M, 2, shape);
    double captured[2];
    for (int ro = 0; ro < 2; ro++) {
        mpq_sfmp_desc d = {0};
        d.bpw = 2.25 + 0.25, d.reorder = ro ? MPQ_REORDER_BOTH : MPQ_REORDER_NONE;
        mpq_plan p;
        cr_assert_eq(mpq_plan_sfmp(M.L, 2, &d, &p), MPQ_OK);
        double got = 0, all = 0;
        for (int l = 0; l < 2; l++) { /* salience of the weights that got 3 bits */
            const mpq_layer_plan *L = &p.layers[l];
            int c = L->cols, ng = c / 128;
            for (int i = 0; i < L->rows; i++)
                for (int j = 0; j < c; j++) {
                    double s =
                        M.L[l].S[(L->p_row ? L->p_row[i] : (uint32_t)i) * c + (L->p_col ? L->p_col[j] : (uint32_t)j)];
                    all += s;
                    if (L->bits[(i / 16) * ng + j / 128] == 3) got += s;
                }
        }
        captured[ro] = got / all;
        packs_as_accounted(&r, &p, 0);
        mpq_plan_free(&p);
    }
    cr_assert_gt(captured[1], captured[0], "reordered %.3f vs not %.3f", captured[1], captured[0]);
    free_model(&M);
}

/* The two-step SFMP (a layer's salience reduced on its own, then the plan
   from the reductions) is mpq_plan_sfmp's plan, bit for bit; the block
   sums are eq. 9 in float64 over the reordered salience. */
Test(plan, reduced_layers_plan_as_the_layers_do)
{
    synth_rng r = {97};
    for (int rep = 0; rep < 30; rep++) {
        int shape[4][2], n;
        model M;
        double meta, nw;
        mpq_sfmp_desc d = random_model(&r, &M, shape, &n, &meta, &nw);
        (void)meta;
        mpq_sfmp_reduced R[4];
        for (int l = 0; l < n; l++) {
            cr_assert_eq(mpq_sfmp_reduce(&M.L[l], &d, &R[l]), MPQ_OK);
            const int rows = shape[l][0], cols = shape[l][1], G = d.group, BR = d.block_rows;
            uint32_t *pr = malloc(4 * rows), *pc = malloc(4 * cols);
            cr_assert_eq(mpq_perm_from_salience(M.L[l].S, rows, cols, pr, pc), MPQ_OK);
            cr_assert_eq(!R[l].p_row, !(d.reorder & MPQ_REORDER_ROWS));
            cr_assert_eq(!R[l].p_col, !(d.reorder & MPQ_REORDER_COLS));
            if (R[l].p_row) cr_assert_arr_eq(R[l].p_row, pr, 4 * rows);
            if (R[l].p_col) cr_assert_arr_eq(R[l].p_col, pc, 4 * cols);
            const int ng = (cols + G - 1) / G;
            for (int br = 0; br * BR < rows; br++)
                for (int g = 0; g < ng; g++) {
                    double s = 0;
                    for (int i = br * BR; i < rows && i < br * BR + BR; i++)
                        for (int j = g * G; j < cols && j < g * G + G; j++)
                            s += M.L[l].S[(size_t)(R[l].p_row ? R[l].p_row[i] : (uint32_t)i) * cols +
                                          (R[l].p_col ? R[l].p_col[j] : (uint32_t)j)];
                    cr_assert_float_eq(R[l].block_sal[br * ng + g], s, 1e-5 * s + 1e-30, "layer %d block %d,%d", l, br,
                                       g);
                }
            free(pr), free(pc);
        }
        mpq_plan a, b;
        cr_assert_eq(mpq_plan_sfmp(M.L, n, &d, &a), MPQ_OK);
        cr_assert_eq(mpq_plan_sfmp_reduced(R, n, &d, &b), MPQ_OK);
        cr_assert_eq(a.bpw, b.bpw);
        cr_assert_eq(a.index_bytes, b.index_bytes);
        for (int l = 0; l < n; l++) {
            const mpq_layer_plan *A = &a.layers[l], *B = &b.layers[l];
            cr_assert(A->rows == B->rows && A->cols == B->cols && A->group == B->group &&
                      A->block_rows == B->block_rows && A->format == B->format);
            cr_assert_arr_eq(A->bits, B->bits,
                             (size_t)((A->rows + A->block_rows - 1) / A->block_rows) *
                                 ((A->cols + A->group - 1) / A->group));
            cr_assert_eq(!A->p_row, !B->p_row);
            cr_assert_eq(!A->p_col, !B->p_col);
            if (A->p_row) cr_assert_arr_eq(A->p_row, B->p_row, 4 * A->rows);
            if (A->p_col) cr_assert_arr_eq(A->p_col, B->p_col, 4 * A->cols);
            if (B->p_row) cr_assert_neq(B->p_row, R[l].p_row, "the plan keeps copies");
        }
        mpq_plan_free(&a), mpq_plan_free(&b);
        for (int l = 0; l < n; l++) mpq_sfmp_reduced_free(&R[l]);
        free_model(&M);
    }
}

Test(plan, reduced_layers_bad_input)
{
    synth_rng r = {98};
    const int shape[2][2] = {{40, 200}, {33, 96}};
    model M;
    make_model(&r, &M, 2, shape);
    mpq_sfmp_desc d = {0};
    d.bpw = 3.0, d.group = 64, d.block_rows = 8, d.reorder = MPQ_REORDER_BOTH;
    mpq_sfmp_reduced R[2], keep;
    memset(&keep, 0x5A, sizeof keep);
    R[1] = keep;
    /* the layer's own errors, and nothing written */
    float *S = (float *)M.L[1].S;
    S[5] = NAN;
    cr_assert_eq(mpq_sfmp_reduce(&M.L[1], &d, &R[1]), MPQ_ERR_NONFINITE);
    S[5] = -1.0f;
    cr_assert_eq(mpq_sfmp_reduce(&M.L[1], &d, &R[1]), MPQ_ERR_RANGE);
    S[5] = 0.5f;
    cr_assert_eq(memcmp(&R[1], &keep, sizeof keep), 0, "out untouched");
    cr_assert_eq(mpq_sfmp_reduce(NULL, &d, &R[1]), MPQ_ERR_ARG);
    cr_assert_eq(mpq_sfmp_reduce(&M.L[1], NULL, &R[1]), MPQ_ERR_ARG);
    cr_assert_eq(mpq_sfmp_reduce(&M.L[1], &d, NULL), MPQ_ERR_ARG);
    d.group = 12;
    cr_assert_eq(mpq_sfmp_reduce(&M.L[1], &d, &R[1]), MPQ_ERR_ARG);
    d.group = 64;
    for (int l = 0; l < 2; l++) cr_assert_eq(mpq_sfmp_reduce(&M.L[l], &d, &R[l]), MPQ_OK);
    mpq_plan p;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &d, &p), MPQ_OK);
    mpq_plan_free(&p);
    /* another description than the one reduced with */
    mpq_sfmp_desc e = d;
    e.group = 128;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &e, &p), MPQ_ERR_ARG);
    e = d, e.block_rows = 16;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &e, &p), MPQ_ERR_ARG);
    e = d, e.reorder = MPQ_REORDER_ROWS;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &e, &p), MPQ_ERR_ARG);
    /* budgets, list and pointers */
    e = d, e.bpw = NAN;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &e, &p), MPQ_ERR_ARG);
    e = d, e.bpw = 1.2; /* below 1 weight bit after metadata */
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &e, &p), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 0, &d, &p), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_plan_sfmp_reduced(NULL, 2, &d, &p), MPQ_ERR_ARG);
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &d, NULL), MPQ_ERR_ARG);
    /* a hostile reduction: bad block sums, a permutation that is not one, a missing one */
    float *bs = R[1].block_sal;
    const float v = bs[3];
    bs[3] = INFINITY;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &d, &p), MPQ_ERR_NONFINITE);
    bs[3] = -1.0f;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &d, &p), MPQ_ERR_RANGE);
    bs[3] = v;
    const uint32_t q = R[1].p_col[2];
    R[1].p_col[2] = R[1].p_col[3];
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &d, &p), MPQ_ERR_PERM);
    R[1].p_col[2] = 999;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &d, &p), MPQ_ERR_PERM);
    R[1].p_col[2] = q;
    uint32_t *pr = R[0].p_row;
    R[0].p_row = NULL;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &d, &p), MPQ_ERR_ARG);
    R[0].p_row = pr;
    float *b0 = R[0].block_sal;
    R[0].block_sal = NULL;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &d, &p), MPQ_ERR_ARG);
    R[0].block_sal = b0;
    cr_assert_eq(mpq_plan_sfmp_reduced(R, 2, &d, &p), MPQ_OK, "restored");
    mpq_plan_free(&p);
    for (int l = 0; l < 2; l++) mpq_sfmp_reduced_free(&R[l]);
    mpq_sfmp_reduced_free(NULL);
    free_model(&M);
}

Test(plan, summary_and_compare)
{
    synth_rng r = {95};
    const int shape[2][2] = {{64, 256}, {32, 512}};
    model M;
    make_model(&r, &M, 2, shape);
    mpq_sfmp_desc d = {0};
    d.bpw = 2.75;
    mpq_plan a, b;
    cr_assert_eq(mpq_plan_sfmp(M.L, 2, &d, &a), MPQ_OK);
    cr_assert_eq(mpq_plan_sfmp(M.L, 2, &d, &b), MPQ_OK);
    mpq_plan_diff df;
    cr_assert_eq(mpq_plan_compare(&a, &b, &df), MPQ_OK);
    cr_assert_eq(df.weights_differing, 0.0, "planning is deterministic");
    mpq_plan_free(&b);
    d.bpw = 3.0, d.reorder = MPQ_REORDER_ROWS;
    cr_assert_eq(mpq_plan_sfmp(M.L, 2, &d, &b), MPQ_OK);
    cr_assert_eq(mpq_plan_compare(&a, &b, &df), MPQ_OK);
    cr_assert_gt(df.weights_differing, 0.0);
    cr_assert_float_eq(df.bpw_delta, b.bpw - a.bpw, 1e-15);
    char buf[512];
    size_t need = mpq_plan_summary(&a, buf, sizeof buf);
    cr_assert_lt(need, sizeof buf);
    cr_assert_eq(strlen(buf), need);
    cr_assert_not_null(strstr(buf, "layer 0: 64x256"), "%s", buf);
    cr_assert_not_null(strstr(buf, "total bpw 2.750"), "%s", buf);
    char small[10];
    cr_assert_eq(mpq_plan_summary(&a, small, sizeof small), need, "returns the length it needs");
    cr_assert_eq(strlen(small), 9u);
    mpq_plan_free(&a), mpq_plan_free(&b);
    free_model(&M);
}

/* ---- MXSens ---- */

typedef struct mxmodel {
    int n;
    mpq_mxsens_layer L[6];
} mxmodel;

static void make_mx(synth_rng *r, mxmodel *M, int n, const int (*shape)[2], const float *S)
{
    M->n = n;
    for (int l = 0; l < n; l++) {
        float *c = malloc(sizeof(float) * shape[l][1]);
        for (int j = 0; j < shape[l][1]; j++) c[j] = fabsf(synth_student4(r));
        M->L[l].col_sens = c, M->L[l].layer_sens = S[l], M->L[l].rows = shape[l][0], M->L[l].cols = shape[l][1];
    }
}

static void free_mx(mxmodel *M)
{
    for (int l = 0; l < M->n; l++) free((void *)M->L[l].col_sens);
}

Test(plan, mxsens_R_is_theorem_a1_and_reproduces_eq3)
{
    synth_rng r = {96};
    const int shape[3][2] = {{128, 1024}, {128, 512}, {128, 2048}};
    const float S[3] = {1.0f, 0.5f, 0.25f};
    mxmodel M;
    make_mx(&r, &M, 3, shape, S);
    const double bpw = 4.25 + 0.5; /* mantissa average B = 4.5 */
    mpq_plan p;
    double R;
    cr_assert_eq(mpq_plan_mxsens(M.L, 3, bpw, &p, &R), MPQ_OK);
    /* eq. 2: R = ((B - 4) sum d - 4 * 32 * n) / (sum 2 S (d - 32)) */
    const double B = bpw - 0.25, sd = 1024 + 512 + 2048;
    const double num = (B - 4) * sd - 4.0 * 32 * 3, den = 2 * (1.0 * 992 + 0.5 * 480 + 0.25 * 2016);
    cr_assert_float_eq(R, num / den, 1e-12);
    /* eq. 3 with that R (before rounding to blocks) is exactly B */
    double avg = 0;
    for (int l = 0; l < 3; l++) {
        double d = shape[l][1], n6 = R * S[l] * (d - 32);
        avg += 8 * 32 + 6 * n6 + 4 * (d - 32 - n6);
    }
    cr_assert_float_eq(avg / sd, B, 1e-12);
    /* the plan: budget from below by less than one 32-column block per layer */
    cr_assert_leq(p.bpw, bpw + 1e-12);
    cr_assert_geq(p.bpw, bpw - 3 * 128.0 * 32 * 2 / (128.0 * sd), "%g", p.bpw);
    for (int l = 0; l < 3; l++) {
        const mpq_layer_plan *L = &p.layers[l];
        cr_assert_eq(L->format, MPQ_FORMAT_MXINT);
        cr_assert_eq(L->bits[0], 8);
        /* the 8-bit block holds the 32 most sensitive columns */
        uint32_t top[32];
        cr_assert_eq(mpq_top_k(M.L[l].col_sens, (size_t)L->cols, 32, top), MPQ_OK);
        uint8_t in8[2048] = {0};
        for (int j = 0; j < 32; j++) in8[L->p_col[j]] = 1;
        for (int k = 0; k < 32; k++) cr_assert(in8[top[k]]);
        /* widths never increase along the ranking, and the 6-bit count is eq. line 8 in whole blocks */
        int nb = L->cols / 32, n6 = 0;
        for (int b = 1; b < nb; b++) {
            cr_assert_leq(L->bits[b], L->bits[b - 1]);
            n6 += L->bits[b] == 6;
        }
        cr_assert_eq(n6, (int)(floor(R * S[l] * (L->cols - 32)) / 32));
    }
    cr_assert_eq(p.layers[0].format, MPQ_FORMAT_MXINT);
    packs_as_accounted(&r, &p, 0); /* as MXINT */
    mpq_plan_free(&p);
    free_mx(&M);
}

Test(plan, mxsens_open_cases_keep_the_budget)
{
    synth_rng r = {97};
    /* R * S > 1 for the sensitive layer: it is capped, R is solved again */
    const int shape[3][2] = {{64, 256}, {64, 4096}, {64, 20}}; /* the last is narrower than a block */
    const float S[3] = {1.0f, 0.02f, 0.5f};
    mxmodel M;
    make_mx(&r, &M, 3, shape, S);
    for (double bpw = 4.4; bpw < 8.3; bpw += 0.37) {
        mpq_plan p;
        double R;
        mpq_status st = mpq_plan_mxsens(M.L, 3, bpw, &p, &R);
        if (st == MPQ_ERR_RANGE) continue; /* only when the fixed 8-bit blocks alone exceed it */
        cr_assert_eq(st, MPQ_OK);
        cr_assert_leq(p.bpw, bpw + 1e-12, "budget %g, got %g", bpw, p.bpw);
        cr_assert_eq(p.layers[2].bits[0], 8, "a narrow layer is one 8-bit block");
        if (R * S[0] > 1.0) /* capped: every block after the first at 6 bits */
            for (int b = 1; b < 8; b++) cr_assert_eq(p.layers[0].bits[b], 6);
        mpq_plan_free(&p);
    }
    mpq_plan p;
    cr_assert_eq(mpq_plan_mxsens(M.L, 3, 4.2, &p, NULL), MPQ_ERR_RANGE, "below 4-bit mantissas plus exponents");
    /* the lowest budget: every layer's first block at 8 bits, the rest at 4,
       one exponent byte per block of 32 (the 20-column layer: one block) */
    double num = 0, nw = 0, lo = 0;
    for (int l = 0; l < 3; l++) {
        const double rows = shape[l][0], cols = shape[l][1], c8 = cols < 32 ? cols : 32;
        num += rows * (8 * c8 + 4 * (cols - c8) + 8 * ceil(cols / 32));
        nw += rows * cols;
    }
    cr_assert_eq(mpq_mxsens_bpw_min(M.L, 3, &lo), MPQ_OK);
    cr_assert_float_eq(lo, num / nw, 1e-12);
    cr_assert_eq(mpq_plan_mxsens(M.L, 3, lo, &p, NULL), MPQ_OK, "budget %.17g", lo);
    for (int l = 0; l < 3; l++)
        for (int b = 0; b < (shape[l][1] + 31) / 32; b++) cr_assert_eq(p.layers[l].bits[b], b ? 4 : 8);
    cr_assert_float_eq(p.bpw, lo, 1e-12);
    mpq_plan_free(&p);
    cr_assert_eq(mpq_plan_mxsens(M.L, 3, nextafter(lo, 0.0), &p, NULL), MPQ_ERR_RANGE, "the bound is tight");
    cr_assert_eq(mpq_mxsens_bpw_min(M.L, 3, NULL), MPQ_ERR_ARG);
    cr_assert_eq(mpq_mxsens_bpw_min(M.L, 0, &lo), MPQ_ERR_SIZE);
    M.L[1].layer_sens = 1.5f;
    cr_assert_eq(mpq_plan_mxsens(M.L, 3, 5.0, &p, NULL), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_mxsens_bpw_min(M.L, 3, &lo), MPQ_ERR_RANGE, "the planner's checks");
    M.L[1].layer_sens = NAN;
    cr_assert_eq(mpq_plan_mxsens(M.L, 3, 5.0, &p, NULL), MPQ_ERR_NONFINITE);
    M.L[1].layer_sens = 0.5f;
    ((float *)M.L[0].col_sens)[3] = -1.0f;
    cr_assert_eq(mpq_plan_mxsens(M.L, 3, 5.0, &p, NULL), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_plan_mxsens(M.L, 0, 5.0, &p, NULL), MPQ_ERR_SIZE);
    free_mx(&M);
}

/* ---- MixLLM ---- */

Test(plan, mixllm_global_channels_at_8_bits_contiguous)
{
    synth_rng r = {98};
    const int rows[3] = {100, 37, 64}, cols[3] = {256, 200, 128};
    float *sal[3];
    mpq_mixllm_layer L[3];
    for (int l = 0; l < 3; l++) {
        sal[l] = malloc(sizeof(float) * rows[l]);
        for (int i = 0; i < rows[l]; i++)
            sal[l][i] = fabsf(synth_student4(&r)) * (l == 1 ? 5.0f : 1.0f); /* layer 1 matters more */
        L[l].salience = sal[l], L[l].rows = rows[l], L[l].cols = cols[l];
    }
    mpq_mixllm_desc d = {0};
    d.fraction = 0.10; /* 10 % of 201 channels: 20 */
    mpq_plan p;
    cr_assert_eq(mpq_plan_mixllm(L, 3, &d, &p), MPQ_OK);
    /* reference: the 20 largest saliences over all layers */
    float all[201];
    int o = 0, chosen = 0, per_layer[3] = {0};
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < rows[l]; i++) all[o++] = sal[l][i];
    float thr;
    cr_assert_eq(mpq_quantile(all, 201, (201.0 - 20.0) / 200.0, &thr), MPQ_OK); /* the 20th largest */
    for (int l = 0; l < 3; l++) {
        const mpq_layer_plan *P = &p.layers[l];
        int ng = (cols[l] + 127) / 128, seen_low = 0;
        cr_assert_eq(P->block_rows, 1);
        cr_assert_eq(mpq_perm_validate(P->p_row, rows[l]), MPQ_OK);
        for (int i = 0; i < rows[l]; i++) {
            int b = P->bits[i * ng];
            for (int g = 1; g < ng; g++) cr_assert_eq(P->bits[i * ng + g], b, "per-row widths");
            cr_assert(b == 8 || b == 4);
            if (b == 4)
                seen_low = 1;
            else
                cr_assert(!seen_low, "layer %d: 8-bit rows are contiguous and first", l);
            float s = sal[l][P->p_row[i]];
            if (b == 8) {
                cr_assert_geq(s, thr);
                chosen++;
                per_layer[l]++;
            } else
                cr_assert_leq(s, thr);
        }
    }
    cr_assert_eq(chosen, 20);
    cr_assert_gt(per_layer[1], per_layer[2], "the globally salient layer gets more: %d vs %d", per_layer[1],
                 per_layer[2]);
    /* the plan packs with symmetric 8-bit rows */
    float *W = malloc(sizeof(float) * 37 * 200);
    synth_weights(&r, W, 37, 200);
    mpq_bitplane_desc bd;
    cr_assert_eq(mpq_plan_desc(&p, 1, &bd), MPQ_OK);
    cr_assert_eq(bd.symmetric, 1u << 8);
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&bd, W, &A), MPQ_OK);
    tc_mat M;
    tc_decode(A.buf, &M);
    for (int i = 0; i < 37; i++)
        if (M.width[i * 2] == 8) cr_assert_eq(M.zh[i * 2], -M.sh[i * 2], "8-bit rows are symmetric");
    tc_free(&M);
    mpq_packed_free(&A);
    free(W);
    packs_as_accounted(&r, &p, 1);
    mpq_plan_free(&p);
    /* an exact count, and bad inputs */
    d.count = 201;
    cr_assert_eq(mpq_plan_mixllm(L, 3, &d, &p), MPQ_OK);
    /* every channel at 8 bits; metadata counts whole pairs for the partial groups */
    const double weights = 100.0 * 256 + 37.0 * 200 + 64.0 * 128, meta = 32.0 * (100 * 2 + 37 * 2 + 64 * 1);
    cr_assert_float_eq(p.bpw, 8.0 + meta / weights, 1e-12, "%g", p.bpw);
    mpq_plan_free(&p);
    d.count = 202;
    cr_assert_eq(mpq_plan_mixllm(L, 3, &d, &p), MPQ_ERR_SIZE);
    d.count = 0, d.fraction = 1.5;
    cr_assert_eq(mpq_plan_mixllm(L, 3, &d, &p), MPQ_ERR_ARG);
    d.fraction = 0.1, d.high_bits = 9;
    cr_assert_eq(mpq_plan_mixllm(L, 3, &d, &p), MPQ_ERR_BITS);
    d.high_bits = 0;
    sal[2][5] = NAN;
    cr_assert_eq(mpq_plan_mixllm(L, 3, &d, &p), MPQ_ERR_NONFINITE);
    sal[2][5] = -1.0f;
    cr_assert_eq(mpq_plan_mixllm(L, 3, &d, &p), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_plan_mixllm(L, 0, &d, &p), MPQ_ERR_SIZE);
    for (int l = 0; l < 3; l++) free(sal[l]);
}

/* ---- allocation from predicted losses ------------------------------------ */

/* The least total loss within B bits (for_bits) or the fewest bits for a
   total loss of at most B, by brute force: every assignment of options,
   and every assignment with one map mixing any two of its options at the
   share that meets B exactly. INFINITY when nothing qualifies. */
static double alloc_brute(const mpq_alloc_map *M, int n, int for_bits, double B)
{
    double best = INFINITY;
    int d[6] = {0};
    for (;;) {
        double bits = 0, loss = 0;
        for (int i = 0; i < n; i++) bits += M[i].bits[d[i]], loss += M[i].loss[d[i]];
        if (for_bits ? bits <= B : loss <= B) best = fmin(best, for_bits ? loss : bits);
        for (int j = 0; j < n; j++) { /* map j mixes a and b; the others as d says */
            const double ob = bits - M[j].bits[d[j]], ol = loss - M[j].loss[d[j]];
            for (int a = 0; a < M[j].nopt; a++)
                for (int b = 0; b < M[j].nopt; b++) {
                    const double ba = M[j].bits[a], bb = M[j].bits[b], la = M[j].loss[a], lb = M[j].loss[b];
                    if (for_bits ? bb == ba : lb == la) continue;
                    const double t = for_bits ? (B - ob - ba) / (bb - ba) : (B - ol - la) / (lb - la);
                    if (!(t > 0 && t < 1)) continue;
                    best = fmin(best, for_bits ? ol + (1 - t) * la + t * lb : ob + (1 - t) * ba + t * bb);
                }
        }
        int i = 0;
        while (i < n && ++d[i] == M[i].nopt) d[i++] = 0;
        if (i == n) break;
    }
    return best;
}

Test(plan, allocation_worked_example)
{
    /* map 0: 2, 3, 4 bits with losses 10, 4, 1; map 1: 2, 3, 4 with 6, 5,
       0.5 (its 3 lies above the chord from 2 to 4: a mix beats it) */
    const double b[3] = {2, 3, 4}, l0[3] = {10, 4, 1}, l1[3] = {6, 5, 0.5};
    mpq_alloc_map M[2] = {{3, b, l0}, {3, b, l1}};
    mpq_alloc_choice c[2];
    /* from 4 bits and loss 16: map 0 to 3 (6 a bit), map 0 to 4 (3 a bit),
       then map 1 from 2 to 4 (2.75 a bit) half way within 7 bits */
    cr_assert_eq(mpq_alloc_for_bits(M, 2, 7.0, c), MPQ_OK);
    cr_assert(c[0].lo == 2 && c[0].t == 0.0);
    cr_assert(c[1].lo == 0 && c[1].hi == 2);
    cr_assert_float_eq(c[1].t, 0.5, 1e-15);
    cr_assert_float_eq(c[0].loss + c[1].loss, 4.25, 1e-12, "the best whole options give 4.5");
    cr_assert_float_eq(c[0].bits + c[1].bits, 7.0, 1e-12);
    /* the inverse: a loss of 7 needs exactly 6 bits (map 0 at 4, map 1 at 2) */
    cr_assert_eq(mpq_alloc_for_loss(M, 2, 7.0, c), MPQ_OK);
    cr_assert(c[0].lo == 2 && c[0].t == 0.0 && c[1].lo == 0 && c[1].t == 0.0);
    cr_assert_float_eq(c[0].bits + c[1].bits, 6.0, 1e-12);
    double bmin, lmax, bmax, lmin;
    cr_assert_eq(mpq_alloc_range(M, 2, &bmin, &lmax, &bmax, &lmin), MPQ_OK);
    cr_assert(bmin == 4 && lmax == 16 && bmax == 8 && lmin == 1.5);
}

Test(plan, allocation_is_the_brute_force_optimum)
{
    synth_rng r = {99};
    for (int rep = 0; rep < 3000; rep++) {
        const int n = 1 + synth_int(&r, 4);
        double bits[4][5], loss[4][5];
        mpq_alloc_map M[4];
        for (int i = 0; i < n; i++) {
            const int nopt = 1 + synth_int(&r, 5);
            const double weights = 64 * (1 + synth_int(&r, 100)), meta = weights / 4, scale = 0.1 * synth_unif(&r);
            for (int k = 0; k < nopt; k++) {
                const int w = 2 + synth_int(&r, 7); /* widths 2..8, repeats allowed */
                bits[i][k] = w * weights + meta;
                /* a loss falling about 4x a bit, with noise that breaks convexity and order at times */
                loss[i][k] = scale * pow(4.0, -w) * (0.5 + synth_unif(&r));
                if (synth_int(&r, 10) == 0) loss[i][k] = 0; /* exact at times */
            }
            M[i].nopt = nopt, M[i].bits = bits[i], M[i].loss = loss[i];
        }
        double bmin, lmax, bmax, lmin;
        cr_assert_eq(mpq_alloc_range(M, n, &bmin, &lmax, &bmax, &lmin), MPQ_OK);
        for (int f = 0; f < 2; f++) {
            /* limits across the range and a little past both ends */
            const double B = f ? bmin + (bmax - bmin) * (1.2 * synth_unif(&r) - 0.1)
                               : lmin + (lmax - lmin) * (1.2 * synth_unif(&r) - 0.1);
            mpq_alloc_choice c[4];
            const mpq_status st = f ? mpq_alloc_for_bits(M, n, B, c) : mpq_alloc_for_loss(M, n, B, c);
            const double want = alloc_brute(M, n, f, B);
            if (f ? B < bmin : B < lmin) {
                cr_assert_eq(st, MPQ_ERR_RANGE, "rep %d: limit %g below the range", rep, B);
                cr_assert(isinf(want), "rep %d: brute force found a plan", rep);
                continue;
            }
            cr_assert_eq(st, MPQ_OK, "rep %d", rep);
            double tb = 0, tl = 0;
            int mixed = 0;
            for (int i = 0; i < n; i++) {
                cr_assert(c[i].t >= 0 && c[i].t < 1);
                cr_assert(c[i].lo >= 0 && c[i].lo < M[i].nopt && c[i].hi >= 0 && c[i].hi < M[i].nopt);
                mixed += c[i].t > 0;
                cr_assert_float_eq(c[i].bits, (1 - c[i].t) * M[i].bits[c[i].lo] + c[i].t * M[i].bits[c[i].hi], 1e-9);
                tb += c[i].bits, tl += c[i].loss;
            }
            cr_assert_leq(mixed, 1, "rep %d: one map mixed at most", rep);
            if (f) {
                cr_assert_leq(tb, B * (1 + 1e-12), "rep %d: budget", rep);
                cr_assert_float_eq(tl, want, 1e-9 * want + 1e-300, "rep %d: loss %.17g, brute force %.17g", rep, tl,
                                   want);
            } else {
                cr_assert_leq(tl, B + 1e-12 * lmax, "rep %d: bound", rep);
                cr_assert_float_eq(tb, want, 1e-9 * want, "rep %d: bits %.17g, brute force %.17g", rep, tb, want);
            }
        }
    }
}

Test(plan, allocation_bad_input)
{
    const double b[2] = {2, 3}, l[2] = {1, 0.5}, nanl[2] = {1, NAN}, negl[2] = {1, -0.5}, zb[2] = {0, 3};
    mpq_alloc_map M[2] = {{2, b, l}, {2, b, l}};
    mpq_alloc_choice c[2], keep[2];
    memset(c, 0x5A, sizeof c);
    memcpy(keep, c, sizeof c);
    cr_assert_eq(mpq_alloc_for_bits(M, 2, 3.9, c), MPQ_ERR_RANGE, "below the cheapest");
    cr_assert_eq(mpq_alloc_for_loss(M, 2, 0.99, c), MPQ_ERR_RANGE, "below the least loss");
    cr_assert_eq(mpq_alloc_for_bits(M, 2, NAN, c), MPQ_ERR_ARG);
    cr_assert_eq(mpq_alloc_for_bits(M, 0, 5, c), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_alloc_for_bits(NULL, 2, 5, c), MPQ_ERR_ARG);
    cr_assert_eq(mpq_alloc_for_bits(M, 2, 5, NULL), MPQ_ERR_ARG);
    M[1].loss = nanl;
    cr_assert_eq(mpq_alloc_for_loss(M, 2, 2, c), MPQ_ERR_NONFINITE);
    M[1].loss = negl;
    cr_assert_eq(mpq_alloc_for_bits(M, 2, 5, c), MPQ_ERR_RANGE);
    M[1].loss = l, M[1].bits = zb;
    cr_assert_eq(mpq_alloc_range(M, 2, NULL, NULL, NULL, NULL), MPQ_ERR_RANGE);
    M[1].bits = NULL;
    cr_assert_eq(mpq_alloc_for_bits(M, 2, 5, c), MPQ_ERR_ARG);
    M[1].bits = b, M[1].nopt = 0;
    cr_assert_eq(mpq_alloc_for_bits(M, 2, 5, c), MPQ_ERR_SIZE);
    cr_assert_eq(memcmp(c, keep, sizeof c), 0, "out untouched on every error");
    /* past the ends: every map at its least loss, or at its cheapest */
    M[1].nopt = 2;
    cr_assert_eq(mpq_alloc_for_bits(M, 2, 100, c), MPQ_OK);
    cr_assert(c[0].lo == 1 && c[1].lo == 1 && c[0].t == 0 && c[1].t == 0);
    cr_assert_eq(mpq_alloc_for_loss(M, 2, 100, c), MPQ_OK);
    cr_assert(c[0].lo == 0 && c[1].lo == 0 && c[0].t == 0 && c[1].t == 0);
}

Test(plan, predicted_losses_from_measurements)
{
    const int w2[2] = {2, 4};
    const double l2[2] = {0.8, 0.05};
    double v;
    cr_assert_eq(mpq_alloc_predict(w2, l2, 2, 2, &v), MPQ_OK);
    cr_assert_eq(v, 0.8, "a measured width: its measurement");
    cr_assert_eq(mpq_alloc_predict(w2, l2, 2, 4, &v), MPQ_OK);
    cr_assert_eq(v, 0.05);
    cr_assert_eq(mpq_alloc_predict(w2, l2, 2, 3, &v), MPQ_OK);
    cr_assert_float_eq(v, 0.2, 1e-12, "between: the geometric mean (log-linear)");
    cr_assert_eq(mpq_alloc_predict(w2, l2, 2, 6, &v), MPQ_OK);
    cr_assert_float_eq(v, 0.05 / 16, 1e-15, "beyond: the same rate, 4x a bit here");
    cr_assert_eq(mpq_alloc_predict(w2, l2, 2, 1, &v), MPQ_OK);
    cr_assert_float_eq(v, 3.2, 1e-12);
    /* one measurement: 4x a bit either way */
    const int w1[1] = {3};
    const double l1[1] = {0.1};
    cr_assert_eq(mpq_alloc_predict(w1, l1, 1, 5, &v), MPQ_OK);
    cr_assert_float_eq(v, 0.1 / 16, 1e-15);
    cr_assert_eq(mpq_alloc_predict(w1, l1, 1, 2, &v), MPQ_OK);
    cr_assert_float_eq(v, 0.4, 1e-15);
    /* measurements that grow with the width (noise): flat beyond, and
       never above a narrower width's prediction */
    const int w3[3] = {2, 3, 4};
    const double l3[3] = {0.5, 0.1, 0.2};
    cr_assert_eq(mpq_alloc_predict(w3, l3, 3, 4, &v), MPQ_OK);
    cr_assert_eq(v, 0.1, "not above 3 bits' 0.1");
    cr_assert_eq(mpq_alloc_predict(w3, l3, 3, 7, &v), MPQ_OK);
    cr_assert_eq(v, 0.1);
    double last = INFINITY;
    for (int b = 1; b <= 8; b++) {
        cr_assert_eq(mpq_alloc_predict(w3, l3, 3, b, &v), MPQ_OK);
        cr_assert_leq(v, last, "monotone at %d", b);
        last = v;
    }
    /* zero stays zero */
    const double l0[2] = {0.3, 0.0};
    cr_assert_eq(mpq_alloc_predict(w2, l0, 2, 5, &v), MPQ_OK);
    cr_assert_leq(v, 1e-30);
    /* bad input */
    const int wr[2] = {3, 3}, wb9[1] = {9};
    const double nanl[1] = {NAN}, negl[1] = {-1};
    cr_assert_eq(mpq_alloc_predict(wr, l2, 2, 3, &v), MPQ_ERR_ARG, "a width twice");
    cr_assert_eq(mpq_alloc_predict(wb9, l1, 1, 3, &v), MPQ_ERR_BITS);
    cr_assert_eq(mpq_alloc_predict(w1, l1, 1, 0, &v), MPQ_ERR_BITS);
    cr_assert_eq(mpq_alloc_predict(w1, l1, 1, 9, &v), MPQ_ERR_BITS);
    cr_assert_eq(mpq_alloc_predict(w1, nanl, 1, 3, &v), MPQ_ERR_NONFINITE);
    cr_assert_eq(mpq_alloc_predict(w1, negl, 1, 3, &v), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_alloc_predict(w1, l1, 0, 3, &v), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_alloc_predict(NULL, l1, 1, 3, &v), MPQ_ERR_ARG);
}

/* ---- the plan from measured losses ---------------------------------------- */

/* A map's measurements at the widths w[0 .. nw-1]: about 4x a bit from a
   scale of its own, with noise that breaks the trend at times. */
static void measured_losses(synth_rng *r, const int *w, int nw, double *loss)
{
    const double scale = 0.5 * synth_unif(r) + 1e-3;
    for (int k = 0; k < nw; k++) loss[k] = scale * pow(4.0, -w[k]) * (0.6 + 0.8 * synth_unif(r));
}

/* Plan p's layer l by hand: its bits (widths and an fp16 pair per row and
   group), its predicted loss (each block row at its width's prediction,
   weighted by its rows), and whether its block rows are uniform. */
static void measured_by_hand(const mpq_layer_plan *L, const double *pred, int b0, double *bits, double *loss)
{
    const int ng = (L->cols + L->group - 1) / L->group;
    *bits = 32.0 * L->rows * ng, *loss = 0;
    for (int i = 0; i < L->rows; i++) {
        const uint8_t *row = L->bits + (size_t)(i / L->block_rows) * ng;
        for (int g = 0; g < ng; g++) cr_assert_eq(row[g], row[0], "a block row at one width");
        *bits += (double)row[0] * L->cols;
        *loss += pred[row[0] - b0] / L->rows;
    }
}

Test(plan, measured_plan_is_the_allocation_in_block_rows)
{
    synth_rng r = {314};
    for (int rep = 0; rep < 400; rep++) {
        const int n = 1 + synth_int(&r, 4), G = 8 * (1 + synth_int(&r, 16)), BR = 1 + synth_int(&r, 20);
        const int b0 = 1 + synth_int(&r, 3), b1 = b0 + synth_int(&r, 9 - b0); /* candidates b0..b1 (1..8) */
        int w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, nw = 1 + synth_int(&r, 4);
        for (int k = 0; k < nw; k++) { /* distinct measured widths: a shuffle's first nw */
            const int j = k + synth_int(&r, 8 - k), t = w[k];
            w[k] = w[j], w[j] = t;
        }
        mpq_measured_layer L[4];
        double meas[4][4], pred[4][8], bits[4][8];
        float *sal[4] = {NULL};
        mpq_alloc_map M[4];
        double nwts = 0, slack_loss = 0, slack_bits = 0;
        for (int i = 0; i < n; i++) {
            L[i].rows = 1 + synth_int(&r, 70), L[i].cols = 1 + synth_int(&r, 300);
            measured_losses(&r, w, nw, meas[i]);
            L[i].loss = meas[i];
            if (synth_int(&r, 3)) {
                sal[i] = malloc(sizeof(float) * L[i].rows);
                for (int a = 0; a < L[i].rows; a++) sal[i][a] = (float)fabs(synth_student4(&r));
            }
            L[i].row_salience = sal[i];
            const double ng = (L[i].cols + G - 1) / G, wts = (double)L[i].rows * L[i].cols;
            for (int b = b0; b <= b1; b++) {
                cr_assert_eq(mpq_alloc_predict(w, meas[i], nw, b, &pred[i][b - b0]), MPQ_OK);
                bits[i][b - b0] = wts * b + 32.0 * L[i].rows * ng;
            }
            M[i].nopt = b1 - b0 + 1, M[i].bits = bits[i], M[i].loss = pred[i];
            nwts += wts;
            /* one block row of the mixed map left over: what rounding to block rows may cost */
            const double share = (double)(L[i].rows < BR ? L[i].rows : BR) / L[i].rows;
            slack_loss = fmax(slack_loss, share * (pred[i][0] - pred[i][b1 - b0]));
            slack_bits = fmax(slack_bits, (double)(L[i].rows < BR ? L[i].rows : BR) * L[i].cols * (b1 - b0));
        }
        mpq_measured_desc d = {0};
        d.widths = w, d.nwidths = nw, d.min_bits = b0 == 2 && synth_int(&r, 2) ? 0 : b0;
        d.max_bits = b1 == 8 && synth_int(&r, 2) ? 0 : b1, d.group = G == 128 && synth_int(&r, 2) ? 0 : G;
        d.block_rows = BR == 16 && synth_int(&r, 2) ? 0 : BR, d.symmetric = synth_int(&r, 2);
        double blo, bhi, llo, lhi, bmin, lmax, bmax, lmin;
        cr_assert_eq(mpq_plan_measured_range(L, n, &d, &blo, &bhi, &llo, &lhi), MPQ_OK);
        cr_assert_eq(mpq_alloc_range(M, n, &bmin, &lmax, &bmax, &lmin), MPQ_OK);
        cr_assert(blo == bmin / nwts && bhi == bmax / nwts && llo == lmin && lhi == lmax, "rep %d: the range", rep);
        const int by_bits = synth_int(&r, 2);
        if (by_bits)
            d.bpw = blo + (bhi - blo) * synth_unif(&r);
        else
            d.max_loss = llo + (lhi - llo) * synth_unif(&r);
        if (!(by_bits ? d.bpw > 0 : d.max_loss > 0 && d.max_loss < lhi)) { /* a degenerate range */
            for (int i = 0; i < n; i++) free(sal[i]);
            continue;
        }
        mpq_plan p;
        const mpq_status st = mpq_plan_measured(L, n, &d, &p);
        cr_assert_eq(st, MPQ_OK, "rep %d: %s", rep, mpq_status_str(st));
        cr_assert_eq(p.nlayers, n);
        double tb = 0, tl = 0;
        int mixed = 0;
        for (int i = 0; i < n; i++) {
            const mpq_layer_plan *P = &p.layers[i];
            cr_assert(P->rows == L[i].rows && P->cols == L[i].cols && P->group == G && P->block_rows == BR);
            cr_assert(P->format == MPQ_FORMAT_BITPLANE && P->symmetric == (d.symmetric ? 0x1FEu : 0u));
            cr_assert(!P->p_row && !P->p_col);
            double b, l;
            measured_by_hand(P, pred[i], b0, &b, &l);
            cr_assert_float_eq(P->loss, l, 1e-12 * l + 1e-300, "rep %d map %d: the layer's prediction", rep, i);
            cr_assert_float_eq(P->weight_bits + P->meta_bits, b, 1e-9);
            tb += b, tl += l;
            /* widths within the candidates; two of them in one map at most, one map mixed at most */
            const int ng = (P->cols + G - 1) / G, nbr = (P->rows + BR - 1) / BR;
            int lo = 9, hi = 0;
            for (int k = 0; k < nbr * ng; k++)
                lo = P->bits[k] < lo ? P->bits[k] : lo, hi = P->bits[k] > hi ? P->bits[k] : hi;
            cr_assert(lo >= b0 && hi <= b1);
            for (int k = 0; k < nbr * ng; k++) cr_assert(P->bits[k] == lo || P->bits[k] == hi);
            mixed += hi > lo;
            if (hi > lo && sal[i]) { /* the wider block rows of full height are the most salient of their height */
                double min_hi = INFINITY, max_lo = -INFINITY;
                for (int a = 0; a + BR <= P->rows; a += BR) {
                    double s = 0;
                    for (int q = a; q < a + BR; q++) s += sal[i][q];
                    if (P->bits[(size_t)(a / BR) * ng] == hi)
                        min_hi = fmin(min_hi, s);
                    else
                        max_lo = fmax(max_lo, s);
                }
                cr_assert_geq(min_hi, max_lo * (1 - 1e-6), "rep %d map %d: the most salient block rows first", rep, i);
            }
        }
        cr_assert_leq(mixed, 1, "rep %d", rep);
        cr_assert_float_eq(p.loss, tl, 1e-12 * tl + 1e-300, "rep %d: the plan's prediction is its layers' sum", rep);
        cr_assert_float_eq(p.bpw, tb / nwts, 1e-12);
        /* a budget at the ends of the range, up to rounding, is the end */
        const double want = alloc_brute(M, n, by_bits, by_bits ? fmin(fmax(d.bpw * nwts, bmin), bmax) : d.max_loss);
        if (by_bits) { /* the budget to the bit; the loss the optimum's, but for one block row */
            cr_assert_leq(tb, d.bpw * nwts * (1 + 1e-12), "rep %d: the budget", rep);
            cr_assert_geq(tl, want * (1 - 1e-9), "rep %d: below the optimum?", rep);
            cr_assert_leq(tl, want * (1 + 1e-9) + slack_loss * (1 + 1e-9) + 1e-300, "rep %d: loss %.17g, optimum %.17g",
                          rep, tl, want);
        } else { /* the bound kept; the bits the optimum's, but for one block row */
            cr_assert_leq(tl, d.max_loss * (1 + 1e-12), "rep %d: the bound", rep);
            cr_assert_geq(tb, want * (1 - 1e-9), "rep %d: below the optimum?", rep);
            cr_assert_leq(tb, want * (1 + 1e-12) + slack_bits, "rep %d: bits %.17g, optimum %.17g", rep, tb, want);
        }
        if (rep % 50 == 0) packs_as_accounted(&r, &p, 0);
        mpq_plan_free(&p);
        for (int i = 0; i < n; i++) free(sal[i]);
    }
}

Test(plan, measured_plan_bad_input)
{
    const int w[2] = {2, 4}, wd[2] = {3, 3}, w9[2] = {2, 9};
    const double l[2] = {0.4, 0.03}, nanl[2] = {0.4, NAN}, negl[2] = {0.4, -1};
    float sal[40];
    for (int k = 0; k < 40; k++) sal[k] = (float)k;
    mpq_measured_layer L[2] = {{40, 100, l, sal}, {24, 64, l, NULL}};
    mpq_measured_desc d = {0};
    d.widths = w, d.nwidths = 2, d.bpw = 3.5;
    mpq_plan p;
    cr_assert_eq(mpq_plan_measured(L, 2, &d, &p), MPQ_OK);
    mpq_plan_free(&p);
    double blo, bhi, llo, lhi;
    cr_assert_eq(mpq_plan_measured_range(L, 2, &d, &blo, &bhi, &llo, &lhi), MPQ_OK);
#define REFUSED(setup, status)                                                                                         \
    do {                                                                                                               \
        mpq_measured_desc e = d;                                                                                       \
        mpq_measured_layer K[2] = {L[0], L[1]};                                                                        \
        setup;                                                                                                         \
        memset(&p, 0x5A, sizeof p);                                                                                    \
        cr_assert_eq(mpq_plan_measured(K, 2, &e, &p), status, #setup);                                                 \
        cr_assert(p.nlayers == 0 && p.layers == NULL, #setup ": an empty plan");                                       \
        (void)K;                                                                                                       \
    } while (0)
    REFUSED((e.bpw = blo * 0.99), MPQ_ERR_RANGE);
    REFUSED((e.bpw = bhi * 1.01), MPQ_ERR_RANGE);
    REFUSED((e.bpw = 0, e.max_loss = llo * 0.99), MPQ_ERR_RANGE);
    REFUSED((e.bpw = 0, e.max_loss = lhi), MPQ_ERR_RANGE);
    REFUSED((e.max_loss = 0.1), MPQ_ERR_ARG);
    REFUSED((e.bpw = 0), MPQ_ERR_ARG);
    REFUSED((e.bpw = NAN), MPQ_ERR_ARG);
    REFUSED((e.widths = wd), MPQ_ERR_ARG);
    REFUSED((e.widths = w9), MPQ_ERR_BITS);
    REFUSED((e.widths = NULL), MPQ_ERR_ARG);
    REFUSED((e.nwidths = 0), MPQ_ERR_SIZE);
    REFUSED((e.nwidths = 9), MPQ_ERR_SIZE);
    REFUSED((e.min_bits = 5, e.max_bits = 4), MPQ_ERR_BITS);
    REFUSED((e.max_bits = 9), MPQ_ERR_BITS);
    REFUSED((e.group = 12), MPQ_ERR_ARG);
    REFUSED((e.block_rows = -1), MPQ_ERR_ARG);
    REFUSED((e.symmetric = 2), MPQ_ERR_ARG);
    REFUSED((K[1].loss = nanl), MPQ_ERR_NONFINITE);
    REFUSED((K[1].loss = negl), MPQ_ERR_RANGE);
    REFUSED((K[1].loss = NULL), MPQ_ERR_ARG);
    REFUSED((K[0].rows = 0), MPQ_ERR_SIZE);
    REFUSED((K[1].cols = -3), MPQ_ERR_SIZE);
    sal[7] = NAN;
    REFUSED((void)0, MPQ_ERR_NONFINITE);
    sal[7] = -1;
    REFUSED((void)0, MPQ_ERR_RANGE);
    sal[7] = 7;
#undef REFUSED
    cr_assert_eq(mpq_plan_measured(NULL, 2, &d, &p), MPQ_ERR_ARG);
    cr_assert_eq(mpq_plan_measured(L, 0, &d, &p), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_plan_measured(L, 2, NULL, &p), MPQ_ERR_ARG);
    cr_assert_eq(mpq_plan_measured(L, 2, &d, NULL), MPQ_ERR_ARG);
    cr_assert_eq(mpq_plan_measured_range(L, 0, &d, NULL, NULL, NULL, NULL), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_plan_measured_range(L, 2, &d, NULL, NULL, NULL, NULL), MPQ_OK, "every output optional");
}
