/* Section 13, recipes: mpq_recipe_run gives, for every chain, the bytes of
   its steps composed by hand (the description, act-order, AWQ, GPTQ or
   rounding, ReQuant's split; the planners on the same statistics, SFMP's
   in act-order's column order); streaming through the callbacks changes
   nothing and holds one map at a time where it says so; the budget range
   is the planners' own; and every bad input is an error that writes
   nothing. */
#include "common.h"

enum { NM = 3, TOK = 48 };
static const int shapes[NM][2] = {{40, 72}, {33, 100}, {64, 128}};

/* Maps with LLM-like weights, activations (a few outlier channels), X^T X
   of those activations, and positive statistics. */
typedef struct fixture {
    mpq_recipe_map m[NM];
    float *mem[NM][8];
    double kld[NM][3]; /* the KLD planner's measurements, at kld_widths */
} fixture;

static const int kld_widths[3] = {2, 4, 6};

static void make(fixture *F, uint64_t seed)
{
    synth_rng r = {seed};
    memset(F, 0, sizeof *F);
    for (int i = 0; i < NM; i++) {
        const int rows = shapes[i][0], cols = shapes[i][1];
        float *W = malloc(sizeof(float) * rows * cols), *X = malloc(sizeof(float) * TOK * cols);
        float *H = malloc(sizeof(float) * cols * cols), *pqi = malloc(sizeof(float) * rows * cols);
        float *fisher = malloc(sizeof(float) * rows * cols), *ch = malloc(sizeof(float) * rows);
        float *cs = malloc(sizeof(float) * cols);
        synth_weights(&r, W, rows, cols);
        synth_tokens(&r, X, TOK, cols, 77 + (uint64_t)i);
        for (int a = 0; a < cols; a++)
            for (int b = 0; b < cols; b++) {
                double h = 0;
                for (int t = 0; t < TOK; t++) h += (double)X[t * cols + a] * X[t * cols + b];
                H[a * cols + b] = (float)h;
            }
        for (int k = 0; k < rows * cols; k++) {
            fisher[k] = (float)(W[k] * W[k] * (0.5 + synth_unif(&r)));
            pqi[k] = (float)(fabs(W[k]) * (0.2 + synth_unif(&r)));
        }
        for (int k = 0; k < rows; k++) ch[k] = (float)synth_unif(&r) * (float)(i + 1);
        for (int j = 0; j < cols; j++) cs[j] = H[j * cols + j];
        mpq_recipe_map *m = &F->m[i];
        m->rows = rows, m->cols = cols, m->name = i == 0 ? "zero" : i == 1 ? "one" : "two";
        m->W = W, m->X = X, m->tokens = TOK, m->H = H, m->pqi = pqi, m->fisher = fisher, m->channel = ch;
        m->col_sens = cs, m->layer_sens = 0.3f * (float)(i + 1);
        for (int k = 0; k < 3; k++) /* about 4x a bit, each map its own scale */
            F->kld[i][k] = 0.05 * (1 + i) * pow(4.0, -2 * k) * (0.7 + 0.6 * synth_unif(&r));
        m->kld = F->kld[i];
        float *mem[8] = {W, X, H, pqi, fisher, ch, cs, NULL};
        memcpy(F->mem[i], mem, sizeof mem);
    }
}

static void unmake(fixture *F)
{
    for (int i = 0; i < NM; i++)
        for (int k = 0; k < 8; k++) free(F->mem[i][k]);
}

/* The plan the planner makes from the fixture's statistics, by hand. */
static void plan_by_hand(const mpq_recipe *r, const fixture *F, mpq_plan *p)
{
    float *perm[NM] = {NULL};
    if (r->planner == MPQ_PLANNER_SFMP) {
        mpq_sfmp_layer L[NM];
        for (int i = 0; i < NM; i++) {
            const mpq_recipe_map *m = &F->m[i];
            L[i].S = m->fisher, L[i].rows = m->rows, L[i].cols = m->cols;
            if (!r->act_order) continue;
            uint32_t *o = malloc(4u * m->cols);
            perm[i] = malloc(sizeof(float) * m->rows * m->cols);
            float *H = memcpy(malloc(4u * m->cols * m->cols), m->H, 4u * m->cols * m->cols);
            if (r->rotate) { /* the order of V H V^T's diagonal */
                mpq_rotation R;
                cr_assert_eq(mpq_rotation_init(&R, m->cols, r->rotate_seed), MPQ_OK);
                cr_assert_eq(mpq_rotation_conjugate(&R, H), MPQ_OK);
                mpq_rotation_free(&R);
            }
            cr_assert_eq(mpq_gptq_act_order(H, m->cols, o), MPQ_OK);
            free(H);
            cr_assert_eq(mpq_perm_apply(m->fisher, m->rows, m->cols, NULL, o, perm[i]), MPQ_OK);
            L[i].S = perm[i];
            free(o);
        }
        mpq_sfmp_desc d = {0};
        d.bpw = r->bpw, d.group = r->group, d.block_rows = r->block_rows, d.reorder = r->reorder;
        cr_assert_eq(mpq_plan_sfmp(L, NM, &d, p), MPQ_OK);
    } else if (r->planner == MPQ_PLANNER_KLD) { /* the block rows ranked by the Fisher diagonal's row sums */
        mpq_measured_layer L[NM];
        float *rs[NM];
        for (int i = 0; i < NM; i++) {
            const mpq_recipe_map *m = &F->m[i];
            rs[i] = malloc(sizeof(float) * m->rows);
            for (int a = 0; a < m->rows; a++) {
                double sum = 0;
                for (int b = 0; b < m->cols; b++) sum += m->fisher[a * m->cols + b];
                rs[i][a] = (float)sum;
            }
            L[i].rows = m->rows, L[i].cols = m->cols, L[i].loss = m->kld, L[i].row_salience = rs[i];
        }
        mpq_measured_desc d = {0};
        d.widths = r->kld_widths, d.nwidths = r->kld_nwidths, d.bpw = r->bpw, d.max_loss = r->max_kld;
        d.group = r->group, d.block_rows = r->block_rows, d.symmetric = r->symmetric;
        cr_assert_eq(mpq_plan_measured(L, NM, &d, p), MPQ_OK);
        for (int i = 0; i < NM; i++) free(rs[i]);
    } else if (r->planner == MPQ_PLANNER_MIXLLM) {
        mpq_mixllm_layer L[NM];
        for (int i = 0; i < NM; i++)
            L[i].salience = F->m[i].channel, L[i].rows = F->m[i].rows, L[i].cols = F->m[i].cols;
        mpq_mixllm_desc d = {0};
        d.fraction = r->fraction, d.low_bits = r->bits, d.high_bits = r->high_bits, d.group = r->group;
        cr_assert_eq(mpq_plan_mixllm(L, NM, &d, p), MPQ_OK);
    } else {
        mpq_mxsens_layer L[NM];
        for (int i = 0; i < NM; i++)
            L[i].col_sens = F->m[i].col_sens, L[i].layer_sens = F->m[i].layer_sens, L[i].rows = F->m[i].rows,
            L[i].cols = F->m[i].cols;
        cr_assert_eq(mpq_plan_mxsens(L, NM, r->bpw, p, NULL), MPQ_OK);
    }
    for (int i = 0; i < NM; i++) free(perm[i]);
}

/* Map i's description: the plan's layer, or the uniform fields. */
static mpq_bitplane_desc desc_by_hand(const mpq_recipe *r, const mpq_plan *p, const mpq_recipe_map *m, int i)
{
    mpq_bitplane_desc d = {0};
    if (p) {
        cr_assert_eq(mpq_plan_desc(p, i, &d), MPQ_OK);
    } else {
        d.rows = m->rows, d.cols = m->cols, d.group = r->group, d.block_rows = r->block_rows;
        d.uniform_bits = r->bits, d.format = r->format;
        if (r->symmetric) d.symmetric = 1u << (r->bits ? r->bits : 4);
    }
    return d;
}

/* The chain composed by hand: out[i] for every map. */
static void by_hand(const mpq_recipe *r, const fixture *F, mpq_packed *out)
{
    mpq_plan own, *p = (mpq_plan *)(uintptr_t)r->plan;
    if (r->planner) plan_by_hand(r, F, p = &own);
    mpq_bitplane_desc d[NM];
    uint32_t *order[NM] = {NULL};
    float *cs[NM] = {NULL}, *clip[NM] = {NULL};
    mpq_rotation rot[NM];
    memset(rot, 0, sizeof rot);
    for (int i = 0; i < NM; i++) {
        const mpq_recipe_map *m = &F->m[i];
        d[i] = desc_by_hand(r, p, m, i);
        if (r->rotate) {
            cr_assert_eq(mpq_rotation_init(&rot[i], m->cols, r->rotate_seed), MPQ_OK);
            d[i].rotation = &rot[i];
        }
        if (r->act_order) { /* with a rotation: the order of V H V^T's diagonal */
            float *H = memcpy(malloc(4u * m->cols * m->cols), m->H, 4u * m->cols * m->cols);
            if (r->rotate) cr_assert_eq(mpq_rotation_conjugate(&rot[i], H), MPQ_OK);
            order[i] = malloc(4u * m->cols);
            cr_assert_eq(mpq_gptq_act_order(H, m->cols, order[i]), MPQ_OK);
            d[i].p_col = order[i];
            free(H);
        }
        if (r->awq) {
            const int g = d[i].group ? d[i].group : d[i].format == MPQ_FORMAT_MXINT ? 32 : 128;
            cs[i] = malloc(sizeof(float) * m->cols);
            clip[i] = malloc(sizeof(float) * m->rows * ((m->cols + g - 1) / g));
            mpq_awq_desc a = r->awq_opts;
            a.X = m->X, a.tokens = m->tokens;
            cr_assert_eq(mpq_awq_search(&d[i], m->W, &a, cs[i], clip[i], NULL), MPQ_OK);
            d[i].col_scale = cs[i], d[i].clip = clip[i];
        }
    }
    if (r->requant) {
        mpq_requant_map M[NM];
        float *Wr[NM] = {NULL};
        for (int i = 0; i < NM; i++) {
            const size_t nw = (size_t)F->m[i].rows * F->m[i].cols;
            memset(&M[i], 0, sizeof M[i]);
            M[i].W = F->m[i].W, M[i].pqi = F->m[i].pqi, M[i].d = d[i];
            if (r->rotate) { /* the masks and the sparse part in the coordinates of W V^T */
                Wr[i] = memcpy(malloc(4u * nw), F->m[i].W, 4u * nw);
                cr_assert_eq(mpq_rotation_apply(&rot[i], Wr[i], F->m[i].rows, 0), MPQ_OK);
                M[i].W = Wr[i];
            }
            M[i].mask = malloc(nw);
        }
        const double o = r->outliers == 0 ? 0.0025 : r->outliers, s = r->significant == 0 ? 0.0025 : r->significant;
        cr_assert_eq(mpq_requant_masks(M, NM, o, s, NULL, NULL), MPQ_OK);
        for (int i = 0; i < NM; i++) {
            cr_assert_eq(mpq_requant_pack(&M[i], &out[i]), MPQ_OK);
            free(M[i].mask), free(Wr[i]);
        }
    } else {
        for (int i = 0; i < NM; i++) {
            if (r->gptq) {
                mpq_gptq_desc g = r->gptq_opts;
                g.H = F->m[i].H;
                cr_assert_eq(mpq_gptq_alloc(&d[i], F->m[i].W, &g, &out[i], NULL), MPQ_OK);
            } else {
                cr_assert_eq(mpq_pack_alloc(&d[i], F->m[i].W, &out[i]), MPQ_OK);
            }
        }
    }
    for (int i = 0; i < NM; i++) free(order[i]), free(cs[i]), free(clip[i]), mpq_rotation_free(&rot[i]);
    if (r->planner) mpq_plan_free(&own);
}

static void same(const mpq_packed *a, const mpq_packed *b, const char *what, int i)
{
    cr_assert_eq(a->bytes, b->bytes, "%s, map %d: %zu bytes, by hand %zu", what, i, a->bytes, b->bytes);
    cr_assert_eq(memcmp(a->buf, b->buf, a->bytes), 0, "%s, map %d: the bytes differ", what, i);
}

static void check_chain(const mpq_recipe *r, const char *what)
{
    fixture F;
    make(&F, 2024);
    mpq_packed got[NM], want[NM];
    memset(got, 0x5A, sizeof got);
    mpq_recipe_result res;
    const mpq_status st = mpq_recipe_run(r, F.m, NM, NULL, got, &res);
    cr_assert_eq(st, MPQ_OK, "%s: %s at map %d (%s)", what, mpq_status_str(st), res.map, res.step);
    by_hand(r, &F, want);
    for (int i = 0; i < NM; i++) {
        same(&got[i], &want[i], what, i);
        mpq_packed_free(&got[i]);
        mpq_packed_free(&want[i]);
    }
    if (r->requant) cr_assert_gt(res.sparse_weights, 0, "%s: a sparse part", what);
    unmake(&F);
}

Test(recipe, every_chain_is_the_composition_of_its_steps)
{
    mpq_recipe r;
#define CHAIN(setup, what)                                                                                             \
    do {                                                                                                               \
        memset(&r, 0, sizeof r);                                                                                       \
        setup;                                                                                                         \
        check_chain(&r, what);                                                                                         \
    } while (0)
    CHAIN((void)0, "zero: RTN 4-bit g128");
    CHAIN((r.bits = 3, r.group = 32, r.block_rows = 8), "RTN 3-bit g32, blocks of 8 rows");
    CHAIN((r.bits = 4, r.symmetric = 1), "symmetric 4-bit");
    CHAIN((r.format = MPQ_FORMAT_MXINT, r.bits = 5), "MXINT5");
    CHAIN((r.bits = 3, r.awq = 1, r.awq_opts.grid = 7, r.awq_opts.clip_steps = 5), "AWQ 3-bit");
    CHAIN((r.bits = 3, r.group = 32, r.gptq = 1), "GPTQ 3-bit g32");
    CHAIN((r.bits = 4, r.gptq = 1, r.act_order = 1, r.gptq_opts.static_groups = 1), "GPTQ act-order, static groups");
    CHAIN((r.bits = 3, r.awq = 1, r.gptq = 1, r.act_order = 1), "AWQ + GPTQ, act-order");
    CHAIN((r.format = MPQ_FORMAT_MXINT, r.bits = 4, r.gptq = 1, r.act_order = 1), "MXINT4 GPTQ act-order");
    CHAIN((r.planner = MPQ_PLANNER_SFMP, r.bpw = 3.3, r.group = 32, r.reorder = MPQ_REORDER_BOTH), "SFMP reordered");
    CHAIN((r.planner = MPQ_PLANNER_SFMP, r.bpw = 3.6, r.gptq = 1, r.act_order = 1, r.reorder = MPQ_REORDER_ROWS),
          "SFMP + GPTQ planned in act-order");
    CHAIN((r.planner = MPQ_PLANNER_SFMP, r.bpw = 2.9, r.group = 64, r.awq = 1), "SFMP + AWQ");
    CHAIN((r.planner = MPQ_PLANNER_MIXLLM, r.fraction = 0.2, r.bits = 3), "MixLLM 8/3");
    CHAIN((r.planner = MPQ_PLANNER_MIXLLM, r.fraction = 0.1, r.gptq = 1, r.act_order = 1), "MixLLM + GPTQ act-order");
    CHAIN((r.planner = MPQ_PLANNER_MXSENS, r.bpw = 6.5), "MXSens");
    CHAIN((r.planner = MPQ_PLANNER_KLD, r.kld_widths = kld_widths, r.kld_nwidths = 3, r.bpw = 3.7, r.gptq = 1,
           r.act_order = 1),
          "KLD planner at 3.7 bpw + GPTQ act-order");
    CHAIN((r.planner = MPQ_PLANNER_KLD, r.kld_widths = kld_widths, r.kld_nwidths = 3, r.max_kld = 0.01, r.group = 32,
           r.block_rows = 8, r.symmetric = 1),
          "KLD planner under a bound, symmetric g32");
    CHAIN((r.bits = 3, r.rotate = 1, r.rotate_seed = 5), "rotated RTN 3-bit");
    CHAIN((r.bits = 3, r.rotate = 1, r.rotate_seed = 6, r.awq = 1, r.awq_opts.grid = 5, r.awq_opts.clip_steps = 4),
          "rotated AWQ 3-bit");
    CHAIN((r.bits = 3, r.rotate = 1, r.gptq = 1, r.act_order = 1), "rotated GPTQ act-order");
    CHAIN((r.bits = 4, r.rotate = 1, r.awq = 1, r.gptq = 1, r.act_order = 1), "rotated AWQ + GPTQ act-order");
    CHAIN((r.format = MPQ_FORMAT_MXINT, r.bits = 4, r.rotate = 1, r.gptq = 1), "rotated MXINT4 GPTQ");
    CHAIN((r.planner = MPQ_PLANNER_SFMP, r.bpw = 3.6, r.gptq = 1, r.act_order = 1, r.rotate = 1, r.rotate_seed = 9),
          "rotated SFMP + GPTQ planned in act-order");
    CHAIN((r.planner = MPQ_PLANNER_MIXLLM, r.fraction = 0.2, r.bits = 3, r.rotate = 1), "rotated MixLLM 8/3");
    CHAIN((r.planner = MPQ_PLANNER_MXSENS, r.bpw = 6.5, r.rotate = 1, r.rotate_seed = 3), "rotated MXSens");
    CHAIN((r.requant = 1, r.bits = 3, r.awq = 1, r.rotate = 1, r.rotate_seed = 4), "rotated ReQuant on AWQ 3");
    CHAIN((r.requant = 1, r.bits = 3), "ReQuant on RTN 3");
    CHAIN((r.requant = 1, r.bits = 3, r.awq = 1, r.outliers = 0.01, r.significant = 0.005), "ReQuant on AWQ 3");
    CHAIN((r.requant = 1, r.planner = MPQ_PLANNER_SFMP, r.bpw = 3.25, r.awq = 1), "SFMP + AWQ + ReQuant");
#undef CHAIN
    /* a given plan is used as it is */
    fixture F;
    make(&F, 2024);
    memset(&r, 0, sizeof r);
    r.planner = MPQ_PLANNER_MIXLLM, r.fraction = 0.3;
    mpq_plan p;
    cr_assert_eq(mpq_recipe_plan(&r, F.m, NM, NULL, &p), MPQ_OK);
    mpq_plan q;
    plan_by_hand(&r, &F, &q);
    mpq_plan_diff diff;
    cr_assert_eq(mpq_plan_compare(&p, &q, &diff), MPQ_OK);
    cr_assert(diff.weights_differing == 0 && diff.bpw_delta == 0, "mpq_recipe_plan is the planner's plan");
    mpq_plan_free(&q);
    unmake(&F);
    memset(&r, 0, sizeof r);
    r.plan = &p, r.gptq = 1;
    check_chain(&r, "a given MixLLM plan under GPTQ");
    /* mpq_recipe_quantize is one map of the run */
    make(&F, 2024);
    mpq_packed one, all[NM];
    cr_assert_eq(mpq_recipe_run(&r, F.m, NM, NULL, all, NULL), MPQ_OK);
    cr_assert_eq(mpq_recipe_quantize(&r, 1, &F.m[1], NULL, &one), MPQ_OK);
    same(&one, &all[1], "mpq_recipe_quantize", 1);
    mpq_packed_free(&one);
    /* with a sparse part under a rotation: the mask in the coordinates of W V^T */
    mpq_recipe rr;
    memset(&rr, 0, sizeof rr);
    rr.bits = 3, rr.rotate = 1, rr.rotate_seed = 21;
    {
        const mpq_recipe_map *m = &F.m[2];
        const size_t nw = (size_t)m->rows * m->cols;
        uint8_t *mask = calloc(nw, 1);
        for (size_t k = 0; k < nw; k += 37) mask[k] = 1;
        mpq_rotation R;
        cr_assert_eq(mpq_rotation_init(&R, m->cols, 21), MPQ_OK);
        float *Wr = memcpy(malloc(4u * nw), m->W, 4u * nw);
        cr_assert_eq(mpq_rotation_apply(&R, Wr, m->rows, 0), MPQ_OK);
        mpq_requant_map M;
        memset(&M, 0, sizeof M);
        M.W = Wr, M.mask = mask, M.d = desc_by_hand(&rr, NULL, m, 2);
        M.d.rotation = &R;
        mpq_packed want;
        cr_assert_eq(mpq_requant_pack(&M, &want), MPQ_OK);
        cr_assert_eq(mpq_recipe_quantize(&rr, 2, m, mask, &one), MPQ_OK);
        same(&one, &want, "rotated mpq_recipe_quantize with a mask", 2);
        cr_assert_gt(mpq_packed_sparse_bytes(&one), 0, "a sparse part");
        mpq_packed_free(&one), mpq_packed_free(&want);
        mpq_rotation_free(&R);
        free(Wr), free(mask);
    }
    for (int i = 0; i < NM; i++) mpq_packed_free(&all[i]);
    mpq_plan_free(&p);
    unmake(&F);
}

/* ---- streaming ------------------------------------------------------------- */

typedef struct stream {
    fixture *F;
    mpq_recipe_map seen[NM]; /* what fetch gave out */
    unsigned need[NM];
    int fetches, releases, held, most_held, stored[NM], order[NM], nstored, fail_fetch, fail_store;
    mpq_packed out[NM];
} stream;

static mpq_status s_fetch(void *user, int i, unsigned need, mpq_recipe_map *m)
{
    stream *s = (stream *)user;
    s->fetches++, s->held++;
    s->most_held = s->held > s->most_held ? s->held : s->most_held;
    s->need[i] |= need;
    if (s->fail_fetch == s->fetches) return MPQ_ERR_IO;
    const mpq_recipe_map *src = &s->F->m[i];
    /* copies, so that a use after release would read freed memory under ASan */
    const size_t rc = (size_t)src->rows * src->cols;
    if (need & MPQ_RECIPE_WEIGHTS) m->W = memcpy(malloc(4 * rc), src->W, 4 * rc);
    if (need & MPQ_RECIPE_ACTS)
        m->X = memcpy(malloc(4u * TOK * src->cols), src->X, 4u * TOK * src->cols), m->tokens = TOK;
    if (need & MPQ_RECIPE_HESSIAN)
        m->H = memcpy(malloc(4u * src->cols * src->cols), src->H, 4u * src->cols * src->cols);
    if (need & MPQ_RECIPE_PQI) m->pqi = memcpy(malloc(4 * rc), src->pqi, 4 * rc);
    if (need & MPQ_RECIPE_SALIENCE) m->fisher = memcpy(malloc(4 * rc), src->fisher, 4 * rc);
    return MPQ_OK;
}

static void s_release(void *user, int i, mpq_recipe_map *m)
{
    stream *s = (stream *)user;
    (void)i;
    s->releases++, s->held--;
    free((void *)m->W), free((void *)m->X), free((void *)m->H), free((void *)m->pqi), free((void *)m->fisher);
    m->W = m->X = m->H = m->pqi = m->fisher = NULL;
}

static mpq_status s_store(void *user, int i, mpq_packed *A)
{
    stream *s = (stream *)user;
    if (++s->nstored == s->fail_store) return MPQ_ERR_IO;
    s->order[s->nstored - 1] = i;
    s->out[i] = *A;
    memset(A, 0, sizeof *A);
    return MPQ_OK;
}

/* Runs r over empty maps (shapes and names only) through the callbacks. */
static mpq_status run_streamed(const mpq_recipe *r, fixture *F, stream *s, mpq_recipe_result *res)
{
    mpq_recipe_map m[NM];
    memset(m, 0, sizeof m);
    for (int i = 0; i < NM; i++) m[i].rows = F->m[i].rows, m[i].cols = F->m[i].cols, m[i].name = F->m[i].name;
    s->F = F;
    mpq_recipe_io io = {s_fetch, s_release, s_store, NULL, s};
    return mpq_recipe_run(r, m, NM, &io, NULL, res);
}

Test(recipe, streamed_maps_give_the_same_bytes)
{
    fixture F;
    make(&F, 7);
    for (int k = 0; k < 4; k++) {
        mpq_recipe r;
        memset(&r, 0, sizeof r);
        if (k == 0) r.bits = 3, r.awq = 1, r.gptq = 1, r.act_order = 1;
        if (k == 1) r.planner = MPQ_PLANNER_SFMP, r.bpw = 3.5, r.gptq = 1, r.act_order = 1;
        if (k == 2) r.planner = MPQ_PLANNER_SFMP, r.bpw = 3.5, r.requant = 1;
        if (k == 3) r.planner = MPQ_PLANNER_SFMP, r.bpw = 3.5, r.reorder = MPQ_REORDER_BOTH, r.gptq = 1;
        stream s;
        memset(&s, 0, sizeof s);
        mpq_recipe_result res;
        cr_assert_eq(run_streamed(&r, &F, &s, &res), MPQ_OK, "case %d: %s", k, res.step);
        cr_assert_eq(s.fetches, s.releases, "case %d: every fetch released", k);
        cr_assert_eq(s.nstored, NM);
        for (int i = 0; i < NM; i++) {
            cr_assert_eq(s.order[i], i, "stored in order");
            cr_assert_eq(s.need[i] & ~mpq_recipe_needs(&r), 0u, "case %d: asked only for what the recipe needs", k);
        }
        /* one map at a time, planning included (it keeps SFMP's block sums),
           but ReQuant, which ranks weights over all maps */
        cr_assert_eq(s.most_held, k == 2 ? NM : 1, "case %d: %d maps held at once", k, s.most_held);
        mpq_packed want[NM];
        cr_assert_eq(mpq_recipe_run(&r, F.m, NM, NULL, want, NULL), MPQ_OK);
        for (int i = 0; i < NM; i++) {
            same(&s.out[i], &want[i], "streamed", i);
            mpq_packed_free(&s.out[i]), mpq_packed_free(&want[i]);
        }
    }
    /* a budget the shapes cannot meet fails before any fetch */
    {
        mpq_recipe r;
        memset(&r, 0, sizeof r);
        r.planner = MPQ_PLANNER_SFMP, r.bpw = 0.5;
        stream s;
        memset(&s, 0, sizeof s);
        mpq_recipe_result res;
        cr_assert_eq(run_streamed(&r, &F, &s, &res), MPQ_ERR_RANGE);
        cr_assert_eq(s.fetches, 0, "the budget is checked before any fetch");
    }
    /* a failing fetch or store: its status, everything released, nothing
       left behind (ASan checks the packed matrices of failed stores) */
    for (int fail = 1; fail <= 4; fail++)
        for (int where = 0; where < 2; where++) {
            mpq_recipe r;
            memset(&r, 0, sizeof r);
            r.planner = MPQ_PLANNER_SFMP, r.bpw = 3.5, r.requant = fail & 1;
            stream s;
            memset(&s, 0, sizeof s);
            if (where)
                s.fail_store = fail > 3 ? 3 : fail;
            else
                s.fail_fetch = fail;
            mpq_recipe_result res;
            cr_assert_eq(run_streamed(&r, &F, &s, &res), MPQ_ERR_IO);
            cr_assert_str_eq(res.step, where ? "store" : "fetch");
            cr_assert_eq(s.fetches, s.releases, "fail %d at %s: every fetch released", fail, res.step);
            for (int i = 0; i < NM; i++) mpq_packed_free(&s.out[i]);
        }
    unmake(&F);
}

/* ---- budgets and errors ------------------------------------------------------- */

Test(recipe, budget_range_is_the_planners)
{
    fixture F;
    make(&F, 9);
    mpq_recipe r;
    memset(&r, 0, sizeof r);
    r.planner = MPQ_PLANNER_SFMP, r.group = 64;
    double lo = 0, hi = 0, l1 = 0, h1 = 0;
    int worst = -1;
    cr_assert_eq(mpq_recipe_bpw_range(&r, F.m, NM, &lo, &hi, &worst), MPQ_OK);
    mpq_sfmp_layer L[NM];
    for (int i = 0; i < NM; i++) L[i].S = F.m[i].fisher, L[i].rows = F.m[i].rows, L[i].cols = F.m[i].cols;
    mpq_sfmp_desc d = {0};
    d.group = 64;
    cr_assert_eq(mpq_sfmp_bpw_range(L, NM, &d, &l1, &h1), MPQ_OK);
    cr_assert(lo == l1 && hi == h1);
    double wl = 0;
    int w = 0;
    for (int i = 0; i < NM; i++) {
        cr_assert_eq(mpq_sfmp_bpw_range(&L[i], 1, &d, &l1, &h1), MPQ_OK);
        if (l1 > wl) wl = l1, w = i;
    }
    cr_assert_eq(worst, w);
    mpq_packed out[NM];
    r.bpw = lo;
    cr_assert_eq(mpq_recipe_run(&r, F.m, NM, NULL, out, NULL), MPQ_OK, "the lowest budget is met");
    for (int i = 0; i < NM; i++) mpq_packed_free(&out[i]);
    r.bpw = nextafter(lo, 0);
    mpq_recipe_result res;
    cr_assert_eq(mpq_recipe_run(&r, F.m, NM, NULL, out, &res), MPQ_ERR_RANGE);
    cr_assert_str_eq(res.step, "planning");
    /* MXSens: the lowest budget of mpq_mxsens_bpw_min; above the highest, every map capped */
    r.planner = MPQ_PLANNER_MXSENS;
    cr_assert_eq(mpq_recipe_bpw_range(&r, F.m, NM, &lo, &hi, NULL), MPQ_OK);
    mpq_mxsens_layer X[NM];
    for (int i = 0; i < NM; i++)
        X[i].col_sens = F.m[i].col_sens, X[i].layer_sens = 1, X[i].rows = F.m[i].rows, X[i].cols = F.m[i].cols;
    cr_assert_eq(mpq_mxsens_bpw_min(X, NM, &l1), MPQ_OK);
    cr_assert_eq(lo, l1);
    mpq_plan a, b;
    cr_assert_eq(mpq_plan_mxsens(X, NM, hi * (1 + 1e-12), &a, NULL), MPQ_OK);
    cr_assert_eq(mpq_plan_mxsens(X, NM, hi + 1, &b, NULL), MPQ_OK);
    mpq_plan_diff diff;
    cr_assert_eq(mpq_plan_compare(&a, &b, &diff), MPQ_OK);
    cr_assert_eq(diff.weights_differing, 0, "past the highest budget the plan does not change");
    mpq_plan_free(&a), mpq_plan_free(&b);
    cr_assert_eq(mpq_plan_mxsens(X, NM, hi - 0.05, &a, NULL), MPQ_OK);
    cr_assert_eq(mpq_plan_mxsens(X, NM, hi + 1, &b, NULL), MPQ_OK);
    cr_assert_eq(mpq_plan_compare(&a, &b, &diff), MPQ_OK);
    cr_assert_gt(diff.weights_differing, 0, "below it, fewer 6-bit columns");
    mpq_plan_free(&a), mpq_plan_free(&b);
    r.planner = MPQ_PLANNER_MIXLLM;
    cr_assert_eq(mpq_recipe_bpw_range(&r, F.m, NM, &lo, &hi, NULL), MPQ_ERR_ARG);
    unmake(&F);
}

Test(recipe, bad_input_is_an_error_that_writes_nothing)
{
    fixture F;
    make(&F, 11);
    mpq_packed out[NM];
    memset(out, 0x77, sizeof out);
    mpq_packed keep[NM];
    memcpy(keep, out, sizeof out);
    mpq_recipe r;
    mpq_recipe_result res;
#define FAILS(setup, status, at)                                                                                       \
    do {                                                                                                               \
        memset(&r, 0, sizeof r);                                                                                       \
        setup;                                                                                                         \
        cr_assert_eq(mpq_recipe_run(&r, F.m, NM, NULL, out, &res), status, #setup);                                    \
        cr_assert_eq(res.map, at, #setup ": map %d", res.map);                                                         \
        cr_assert_eq(memcmp(out, keep, sizeof out), 0, #setup ": out untouched");                                      \
    } while (0)
    FAILS((r.requant = 1, r.gptq = 1), MPQ_ERR_UNSUPPORTED, -1);
    FAILS((r.act_order = 1, r.planner = MPQ_PLANNER_MXSENS, r.bpw = 7), MPQ_ERR_ARG, -1);
    FAILS((r.act_order = 1, r.gptq = 1, r.planner = MPQ_PLANNER_SFMP, r.bpw = 3, r.reorder = MPQ_REORDER_COLS),
          MPQ_ERR_ARG, -1);
    FAILS((r.bits = 9), MPQ_ERR_BITS, -1);
    FAILS((r.format = 5), MPQ_ERR_ARG, -1);
    FAILS((r.planner = (mpq_planner)9), MPQ_ERR_ARG, -1);
    FAILS((r.requant = 1, r.outliers = 0.7), MPQ_ERR_ARG, -1);
    FAILS((r.planner = MPQ_PLANNER_SFMP, r.bpw = 0.5), MPQ_ERR_RANGE, -1);
    FAILS((r.format = MPQ_FORMAT_MXINT, r.bits = 1), MPQ_ERR_BITS, 0);
    FAILS((r.rotate = 2), MPQ_ERR_ARG, -1);
    /* a statistic the recipe needs is missing in one map */
    const float *H = F.m[1].H;
    F.m[1].H = NULL;
    FAILS((r.gptq = 1), MPQ_ERR_ARG, 1);
    F.m[1].H = H;
    const float *X = F.m[2].X;
    F.m[2].X = NULL;
    FAILS((r.awq = 1), MPQ_ERR_ARG, 2);
    F.m[2].X = X;
    /* non-finite weights in one map: that map */
    float *W = (float *)(uintptr_t)F.m[1].W;
    W[17] = NAN;
    FAILS((r.bits = 3), MPQ_ERR_NONFINITE, 1);
    FAILS((r.requant = 1), MPQ_ERR_NONFINITE, 1);
    W[17] = 0.1f;
    /* non-finite salience in one map: that map, found while planning */
    float *Fi = (float *)(uintptr_t)F.m[2].fisher;
    const float f3 = Fi[3];
    Fi[3] = NAN;
    FAILS((r.planner = MPQ_PLANNER_SFMP, r.bpw = 3.5), MPQ_ERR_NONFINITE, 2);
    cr_assert_str_eq(res.step, "planning");
    Fi[3] = f3;
    /* the KLD planner: a map without its measurements, measurements out of range, a budget or a bound that
       the measurements do not allow, no widths */
    const double *K = F.m[1].kld;
    F.m[1].kld = NULL;
    FAILS((r.planner = MPQ_PLANNER_KLD, r.kld_widths = kld_widths, r.kld_nwidths = 3, r.bpw = 3.5), MPQ_ERR_ARG, 1);
    F.m[1].kld = K;
    F.kld[2][1] = -1;
    FAILS((r.planner = MPQ_PLANNER_KLD, r.kld_widths = kld_widths, r.kld_nwidths = 3, r.bpw = 3.5), MPQ_ERR_RANGE, -1);
    F.kld[2][1] = NAN;
    FAILS((r.planner = MPQ_PLANNER_KLD, r.kld_widths = kld_widths, r.kld_nwidths = 3, r.bpw = 3.5), MPQ_ERR_NONFINITE,
          -1);
    F.kld[2][1] = 0.01;
    FAILS((r.planner = MPQ_PLANNER_KLD, r.kld_widths = kld_widths, r.kld_nwidths = 3, r.bpw = 1.5), MPQ_ERR_RANGE, -1);
    FAILS((r.planner = MPQ_PLANNER_KLD, r.kld_widths = kld_widths, r.kld_nwidths = 3, r.max_kld = 1e6), MPQ_ERR_RANGE,
          -1);
    FAILS((r.planner = MPQ_PLANNER_KLD, r.kld_widths = kld_widths, r.kld_nwidths = 3, r.bpw = 3, r.max_kld = 0.1),
          MPQ_ERR_ARG, -1);
    FAILS((r.planner = MPQ_PLANNER_KLD, r.kld_widths = NULL, r.kld_nwidths = 3, r.bpw = 3.5), MPQ_ERR_ARG, -1);
    FAILS((r.planner = MPQ_PLANNER_KLD, r.kld_widths = kld_widths, r.kld_nwidths = 0, r.bpw = 3.5), MPQ_ERR_ARG, -1);
    /* a given plan of other shapes, or with its own column order under act-order */
    mpq_plan p;
    memset(&r, 0, sizeof r);
    r.planner = MPQ_PLANNER_MXSENS, r.bpw = 7;
    cr_assert_eq(mpq_recipe_plan(&r, F.m, NM, NULL, &p), MPQ_OK);
    FAILS((r.plan = &p, r.act_order = 1, r.gptq = 1), MPQ_ERR_ARG, -1);
    p.layers[2].rows++;
    FAILS((r.plan = &p), MPQ_ERR_SIZE, -1);
    p.layers[2].rows--;
    p.nlayers = 2;
    FAILS((r.plan = &p), MPQ_ERR_SIZE, -1);
    p.nlayers = NM;
    mpq_plan_free(&p);
#undef FAILS
    /* the arguments */
    memset(&r, 0, sizeof r);
    cr_assert_eq(mpq_recipe_run(NULL, F.m, NM, NULL, out, NULL), MPQ_ERR_ARG);
    cr_assert_eq(mpq_recipe_run(&r, NULL, NM, NULL, out, NULL), MPQ_ERR_ARG);
    cr_assert_eq(mpq_recipe_run(&r, F.m, 0, NULL, out, NULL), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_recipe_run(&r, F.m, NM, NULL, NULL, NULL), MPQ_ERR_ARG, "no out and no store");
    cr_assert_eq(mpq_recipe_plan(&r, F.m, NM, NULL, &p), MPQ_ERR_ARG, "no planner");
    mpq_packed one;
    r.requant = 1;
    cr_assert_eq(mpq_recipe_quantize(&r, 0, &F.m[0], NULL, &one), MPQ_ERR_ARG, "ReQuant needs every map");
    r.requant = 0, r.gptq = 1;
    uint8_t mask[40 * 72] = {0};
    cr_assert_eq(mpq_recipe_quantize(&r, 0, &F.m[0], mask, &one), MPQ_ERR_ARG, "a sparse part under GPTQ");
    cr_assert_eq(memcmp(out, keep, sizeof out), 0);
    unmake(&F);
}
