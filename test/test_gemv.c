/* Section 5: the GEMV on every compiled path against a float64 reference
   built from an independent reading of the packed bytes. */
#include "common.h"

#define paths  tc_paths
#define NPATHS TC_NPATHS

typedef struct shape {
    int m, n, G, br;
} shape;

static const shape shapes[] = {{1, 8, 8, 16},     {7, 24, 8, 1},     {33, 200, 64, 3},     {48, 40, 24, 5},
                               {50, 300, 40, 32}, {100, 130, 16, 1}, {17, 1000, 128, 16},  {64, 96, 32, 48},
                               {20, 136, 136, 2}, {3, 57, 56, 7},    {129, 257, 128, 256}, {16, 64, 64, 16}};

/* Packs W (m x n) with a random mixed bits map; perms and column scale when asked. */
static mpq_packed pack_random(synth_rng *r, const shape *s, int with_perm, int bmin, int bmax, const float *W)
{
    int nb = ((s->m + s->br - 1) / s->br) * ((s->n + s->G - 1) / s->G);
    uint8_t *bits = malloc((size_t)nb);
    for (int k = 0; k < nb; k++) bits[k] = (uint8_t)(bmin + synth_int(r, bmax - bmin + 1));
    uint32_t *pr = malloc(4u * s->m), *pc = malloc(4u * s->n);
    float *cs = malloc(4u * s->n);
    synth_perm(r, pr, s->m);
    synth_perm(r, pc, s->n);
    for (int j = 0; j < s->n; j++) cs[j] = 0.3f + 2.0f * (float)synth_unif(r);
    mpq_bitplane_desc d = {0};
    d.rows = s->m, d.cols = s->n, d.group = s->G, d.block_rows = s->br, d.bits = bits;
    if (with_perm) d.p_row = pr, d.p_col = pc, d.col_scale = cs;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    free(bits), free(pr), free(pc), free(cs); /* the buffer holds copies */
    return A;
}

Test(gemv, every_path_matches_the_float64_reference)
{
    synth_rng r = {31};
    const int batches[] = {1, 3, 11};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int wp = 0; wp < 2; wp++) {
            const shape *s = &shapes[si];
            float *W = malloc(sizeof(float) * s->m * s->n);
            synth_weights(&r, W, s->m, s->n);
            mpq_packed A = pack_random(&r, s, wp, 1, 8, W);
            tc_mat M;
            tc_decode(A.buf, &M);
            for (size_t bi = 0; bi < 3; bi++) {
                int batch = batches[bi];
                float *x = malloc(sizeof(float) * batch * s->n), *y = malloc(sizeof(float) * batch * s->m);
                double *ref = malloc(sizeof(double) * batch * s->m), *mag = malloc(sizeof(double) * batch * s->m);
                for (int v = 0; v < batch; v++) synth_activations(&r, x + (size_t)v * s->n, s->n);
                for (int skip = 0; skip < 4; skip++) {
                    tc_gemv(&M, x, batch, skip, ref, mag);
                    tc_gemv_every_path(&A, &M, x, batch, skip, y, ref, mag);
                }
                free(x), free(y), free(ref), free(mag);
            }
            tc_free(&M);
            mpq_packed_free(&A);
            free(W);
        }
}

/* Small integers everywhere: every path must be exact, bit for bit. a8:
   also with 8-bit activations, every group of x~ holding a +-127 so that its
   scale is 1 and its codes are x~ itself (no column scales then). */
static void exact_case(synth_rng *r, int m, int n, int G, int br, int bmax, int batch, int a8)
{
    const int ng = (n + G - 1) / G, nb = ((m + br - 1) / br) * ng;
    uint8_t *bits = malloc((size_t)nb), *codes = malloc((size_t)m * n);
    uint16_t *sh = malloc(2u * m * ng), *zh = malloc(2u * m * ng);
    uint32_t *pr = malloc(4u * m), *pc = malloc(4u * n);
    float *cs = malloc(4u * n), *x = malloc(4u * n * batch), *y = malloc(4u * m * batch);
    double *ref = malloc(8u * m * batch);
    for (int k = 0; k < nb; k++) bits[k] = (uint8_t)(1 + synth_int(r, bmax));
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) codes[(size_t)i * n + j] = (uint8_t)synth_int(r, 1 << bits[(i / br) * ng + j / G]);
    const float svals[] = {0.5f, 1.0f, 2.0f};
    for (int k = 0; k < m * ng; k++) {
        sh[k] = mpq_f32_to_f16(svals[synth_int(r, 3)]);
        zh[k] = mpq_f32_to_f16((float)(synth_int(r, 9) - 4));
    }
    synth_perm(r, pr, m);
    synth_perm(r, pc, n);
    for (int j = 0; j < n; j++) cs[j] = a8 || synth_int(r, 2) ? 1.0f : 2.0f;
    for (int k = 0; k < n * batch; k++) x[k] = (float)(synth_int(r, 5) - 2);
    for (int v = 0; v < batch && a8; v++)
        for (int j = 0; j < n; j += G) x[(size_t)v * n + pc[j]] = synth_int(r, 2) ? 127.0f : -127.0f;
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = G, d.block_rows = br, d.bits = bits, d.p_row = pr, d.p_col = pc, d.col_scale = cs;
    size_t bytes = 0;
    mpq_bitplane_bytes(&d, &bytes);
    void *buf = tc_alloc(bytes);
    mpq_packed A;
    cr_assert_eq(mpq_pack_quantized(&d, codes, sh, zh, buf, bytes, &A), MPQ_OK);
    tc_mat M;
    tc_decode(buf, &M);
    for (int skip = 0; skip < 3; skip++) {
        tc_gemv(&M, x, batch, skip, ref, NULL);
        for (int p = 0; p < NPATHS; p++) {
            if (!mpq_path_available(paths[p])) continue;
            mpq_gemv_opts o = {0};
            o.path = paths[p], o.skip_planes = skip, o.a8 = a8;
            tc_poison(y, (size_t)m * batch);
            cr_assert_eq(mpq_gemv(&A, x, y, batch, &o, NULL, 0), MPQ_OK);
            for (int k = 0; k < m * batch; k++)
                cr_assert_eq((double)y[k], ref[k], "%s%s %dx%d G%d br%d skip %d: y[%d] = %.9g, exact %.9g",
                             mpq_path_name(paths[p]), a8 ? " a8" : "", m, n, G, br, skip, k, (double)y[k], ref[k]);
        }
    }
    tc_free(&M);
    mpq_aligned_free(buf);
    free(bits), free(codes), free(sh), free(zh), free(pr), free(pc), free(cs), free(x), free(y), free(ref);
}

Test(gemv, exact_on_small_integers_at_odd_sizes)
{
    synth_rng r = {32};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int a8 = 0; a8 < 2; a8++)
            exact_case(&r, shapes[si].m, shapes[si].n, shapes[si].G, shapes[si].br, 8, si % 2 ? 9 : 1, a8);
}

Test(gemv, exact_on_small_integers_4096x4096)
{
    synth_rng r = {33};
    exact_case(&r, 4096, 4096, 128, 16, 6, 1, 0);
}

/* The float64 reference of the product with 8-bit activations: x~ (packed
   order, column scales applied, as float32 products) quantized per group as
   the header states (s^ = fp16(amax / 127), q = rne of the float32 quotient,
   clamped to +-127), times the dequantized weights; the sparse part with x. */
static void ref_a8(const tc_mat *M, const float *x, int batch, int skip, double *y, double *mag)
{
    float *xt = malloc(sizeof(float) * M->cols);
    for (int v = 0; v < batch; v++) {
        const float *xv = x + (size_t)v * M->cols;
        for (int j = 0; j < M->cols; j++) xt[j] = (float)((double)xv[M->pcol[j]] * M->cscale[j]);
        for (int j0 = 0; j0 < M->cols; j0 += M->group) {
            const int j1 = j0 + M->group < M->cols ? j0 + M->group : M->cols;
            double amax = 0;
            for (int j = j0; j < j1; j++) amax = fmax(amax, fabs(xt[j]));
            const float sh = (float)tc_half(mpq_f32_to_f16((float)(amax / 127)));
            for (int j = j0; j < j1; j++) {
                double q = sh > 0 ? nearbyint(xt[j] / sh) : 0; /* the default rounding: to even */
                q = q > 127 ? 127 : (q < -127 ? -127 : q);
                xt[j] = (float)(q * sh);
            }
        }
        for (int i = 0; i < M->rows; i++) {
            double s = 0, a = 0;
            for (int j = 0; j < M->cols; j++) {
                const int g = j / M->group, w = M->width[i * M->ngroups + g];
                s += tc_weight(M, i, j, skip) * xt[j];
                a += (fabs(M->sh[i * M->ngroups + g]) * (ldexp(1.0, w) - 1) + fabs(M->zh[i * M->ngroups + g])) *
                    fabs(xt[j]);
            }
            y[(size_t)v * M->rows + M->prow[i]] = s, mag[(size_t)v * M->rows + M->prow[i]] = a;
        }
        for (size_t k = 0; k < M->sp_nnz; k++) {
            const double t = M->sp_val[k] * (double)xv[M->sp_col[k]];
            y[(size_t)v * M->rows + M->sp_row[k]] += t, mag[(size_t)v * M->rows + M->sp_row[k]] += fabs(t);
        }
    }
    free(xt);
}

/* 8-bit activations: every path, the int16 ones included, within float32
   rounding of the product of the dequantized weights and activations (no
   quantized-table bound: their tables are exact); and a8 does change the
   result where activations have outliers. */
Test(gemv, a8_activations_on_every_path)
{
    synth_rng r = {35};
    int changed = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int wp = 0; wp < 2; wp++) {
            const shape *s = &shapes[si];
            const int batch = si % 3 ? 1 : 3;
            float *W = malloc(sizeof(float) * s->m * s->n);
            synth_weights(&r, W, s->m, s->n);
            mpq_packed A = pack_random(&r, s, wp, 1, 8, W);
            tc_mat M;
            tc_decode(A.buf, &M);
            float *x = malloc(sizeof(float) * batch * s->n), *y = malloc(sizeof(float) * batch * s->m);
            double *ref = malloc(sizeof(double) * batch * s->m), *mag = malloc(sizeof(double) * batch * s->m);
            double *ref32 = malloc(sizeof(double) * batch * s->m);
            for (int v = 0; v < batch; v++) synth_activations(&r, x + (size_t)v * s->n, s->n);
            for (int skip = 0; skip < 3; skip += 2) {
                ref_a8(&M, x, batch, skip, ref, mag);
                tc_gemv(&M, x, batch, skip, ref32, NULL);
                for (int k = 0; k < batch * s->m; k++) changed += fabs(ref[k] - ref32[k]) > 1e-3 * mag[k];
                for (int p = 0; p < NPATHS; p++) {
                    if (!mpq_path_available(paths[p])) continue;
                    if (tc_int16_path(paths[p]) && s->G > 1024) continue;
                    mpq_gemv_opts o = {0};
                    o.path = paths[p], o.skip_planes = skip, o.a8 = 1;
                    tc_poison(y, (size_t)batch * s->m);
                    cr_assert_eq(mpq_gemv(&A, x, y, batch, &o, NULL, 0), MPQ_OK);
                    const double gamma = 2.0 * (2 * (s->G / 8) + A.ngroups + 32) * ldexp(1.0, -24);
                    for (int k = 0; k < batch * s->m; k++)
                        cr_assert_leq(fabs(y[k] - ref[k]), gamma * mag[k] + 1e-30,
                                      "%s a8 %dx%d G%d skip %d: y[%d] %.9g vs %.9g (tol %.3g)", mpq_path_name(paths[p]),
                                      s->m, s->n, s->G, skip, k, (double)y[k], ref[k], gamma * mag[k]);
                }
            }
            free(x), free(y), free(ref), free(mag), free(ref32);
            tc_free(&M);
            mpq_packed_free(&A);
            free(W);
        }
    cr_assert_gt(changed, 0, "8-bit activations never changed a result");
    /* a8 outside 0..1 is refused */
    shape s1 = {4, 16, 8, 4};
    float W1[64] = {0}, x1[16] = {0}, y1[4];
    mpq_packed A1 = pack_random(&r, &s1, 0, 2, 2, W1);
    mpq_gemv_opts o = {0};
    o.a8 = 2;
    cr_assert_eq(mpq_gemv(&A1, x1, y1, 1, &o, NULL, 0), MPQ_ERR_ARG);
    mpq_packed_free(&A1);
}

/* The int16-table paths sum a group in int32: every code at its largest,
   every table entry at its largest, one group of 4096 columns (per-channel
   quantization) and of the widest group those paths take. */
Test(gemv, integer_tables_do_not_overflow_in_wide_groups)
{
    const int m = 16, widths[] = {4096, 1024, 1032};
    for (int wi = 0; wi < 3; wi++) {
        const int n = widths[wi];
        uint8_t *codes = malloc((size_t)m * n);
        uint16_t sh[16], zh[16];
        float *x = malloc(4u * n), y[16];
        double ref[16], mag[16];
        memset(codes, 255, (size_t)m * n);
        for (int i = 0; i < m; i++) sh[i] = mpq_f32_to_f16(1.0f), zh[i] = 0;
        for (int j = 0; j < n; j++) x[j] = 0.25f * 32639.0f / 32768.0f; /* each sum of 4: 32639 * 2^-15 */
        mpq_bitplane_desc d = {0};
        d.rows = m, d.cols = n, d.group = n, d.uniform_bits = 8;
        size_t bytes = 0;
        cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_OK);
        void *buf = tc_alloc(bytes);
        mpq_packed A;
        cr_assert_eq(mpq_pack_quantized(&d, codes, sh, zh, buf, bytes, &A), MPQ_OK);
        tc_mat M;
        tc_decode(buf, &M);
        tc_gemv(&M, x, 1, 0, ref, mag);
        cr_assert_gt(ref[0], 250.0 * n * x[0], "every weight 255: %g", ref[0]);
        for (int p = 0; p <= NPATHS; p++) { /* every path, then AUTO */
            const mpq_path path = p < NPATHS ? paths[p] : MPQ_PATH_AUTO;
            if (!mpq_path_available(path)) continue;
            mpq_gemv_opts o = {0};
            o.path = path;
            tc_poison(y, 16);
            const mpq_status st = mpq_gemv(&A, x, y, 1, &o, NULL, 0);
            if (n > 1024 && tc_int16_path(path)) {
                cr_assert_eq(st, MPQ_ERR_UNSUPPORTED, "%s: the int16 tables take groups up to 1024 columns",
                             mpq_path_name(path));
                continue;
            }
            cr_assert_eq(st, MPQ_OK);
            tc_check_gemv(&A, &M, x, 1, 0, path, y, ref, mag);
        }
        tc_free(&M);
        mpq_aligned_free(buf);
        free(codes), free(x);
    }
}

/* mpq_gemv_path names the path a product takes, AUTO included: the documented
   order of preference, the float paths for groups wider than the int16
   tables take, and a product run on the path it names gives the same bits
   as AUTO's. */
Test(gemv, path_query_says_what_auto_runs)
{
    synth_rng r = {0x9a7d};
    const int m = 37, groups[] = {128, 2048};
    const mpq_path order[] = {MPQ_PATH_AVX512_VNNI, MPQ_PATH_AVX2_INT, MPQ_PATH_NEON,
                              MPQ_PATH_AVX512,      MPQ_PATH_AVX2,     MPQ_PATH_SCALAR};
    for (int gi = 0; gi < 2; gi++) {
        const int n = groups[gi] + 96; /* a partial last group */
        float *W = malloc(sizeof(float) * m * n), *x = malloc(sizeof(float) * n), y0[37], y1[37];
        synth_weights(&r, W, m, n);
        synth_activations(&r, x, n);
        const shape s = {m, n, groups[gi], 16};
        mpq_packed A = pack_random(&r, &s, 1, 2, 5, W);
        mpq_path want = MPQ_PATH_SCALAR, got = MPQ_PATH_AUTO;
        for (int k = 0; k < 6; k++) {
            const int int16 = tc_int16_path(order[k]);
            if (mpq_path_available(order[k]) && !(int16 && groups[gi] > 1024)) {
                want = order[k];
                break;
            }
        }
        cr_assert_eq(mpq_gemv_path(&A, NULL, &got), MPQ_OK);
        cr_assert_eq(got, want, "group %d: AUTO runs %s, expected %s", groups[gi], mpq_path_name(got),
                     mpq_path_name(want));
        mpq_gemv_opts o = {0};
        cr_assert_eq(mpq_gemv(&A, x, y0, 1, &o, NULL, 0), MPQ_OK);
        o.path = got;
        cr_assert_eq(mpq_gemv(&A, x, y1, 1, &o, NULL, 0), MPQ_OK);
        cr_assert_eq(memcmp(y0, y1, sizeof(float) * m), 0, "AUTO and %s differ", mpq_path_name(got));
        for (int p = 0; p < NPATHS; p++) { /* an explicit path is itself, or refused as mpq_gemv refuses it */
            o.path = paths[p];
            mpq_path q = MPQ_PATH_AUTO;
            const mpq_status st = mpq_gemv_path(&A, &o, &q), sg = mpq_gemv(&A, x, y1, 1, &o, NULL, 0);
            cr_assert_eq(st, sg, "%s: the query and the product disagree", mpq_path_name(paths[p]));
            if (!mpq_path_available(paths[p]) || (tc_int16_path(paths[p]) && groups[gi] > 1024))
                cr_assert_eq(st, MPQ_ERR_UNSUPPORTED, "%s", mpq_path_name(paths[p]));
            else
                cr_assert(st == MPQ_OK && q == paths[p], "%s", mpq_path_name(paths[p]));
        }
        o.path = (mpq_path)99;
        cr_assert_eq(mpq_gemv_path(&A, &o, &got), MPQ_ERR_UNSUPPORTED);
        cr_assert_eq(mpq_gemv_path(NULL, NULL, &got), MPQ_ERR_ARG);
        cr_assert_eq(mpq_gemv_path(&A, NULL, NULL), MPQ_ERR_ARG);
        mpq_packed_free(&A);
        free(W), free(x);
    }
}

Test(gemv, llm_like_4096x4096_every_path)
{
    synth_rng r = {34};
    const shape s = {4096, 4096, 128, 16};
    float *W = malloc(sizeof(float) * 4096 * 4096), x[4096], *y = malloc(4 * 4096);
    double *ref = malloc(8 * 4096), *mag = malloc(8 * 4096);
    synth_weights(&r, W, 4096, 4096);
    synth_activations(&r, x, 4096);
    mpq_packed A = pack_random(&r, &s, 1, 2, 4, W);
    tc_mat M;
    tc_decode(A.buf, &M);
    tc_gemv(&M, x, 1, 0, ref, mag);
    tc_gemv_every_path(&A, &M, x, 1, 0, y, ref, mag);
    tc_free(&M);
    mpq_packed_free(&A);
    free(W), free(y), free(ref), free(mag);
}

Test(gemv, threads_batches_and_workspaces_do_not_change_a_bit)
{
    synth_rng r = {35};
    const shape s = {300, 520, 128, 32};
    /* 11 = 8 + 3 and 14 = 8 + 6 vectors: passes of 8 split into 4 + 4,
       3 and 4 + 2 on the paths that take several vectors at once */
    const int batches[] = {11, 14}, bmax = 14;
    float *W = malloc(sizeof(float) * s.m * s.n), *x = malloc(4u * s.n * bmax);
    float *y1 = malloc(4u * s.m * bmax), *y2 = malloc(4u * s.m * bmax), *ys = malloc(4u * s.m);
    synth_weights(&r, W, s.m, s.n);
    for (int v = 0; v < bmax; v++) synth_activations(&r, x + v * s.n, s.n);
    mpq_packed A = pack_random(&r, &s, 1, 1, 8, W);
    for (int p = 0; p < NPATHS; p++) {
        if (!mpq_path_available(paths[p])) continue;
        for (int bi = 0; bi < 2; bi++) {
            const int batch = batches[bi];
            mpq_gemv_opts o = {0};
            o.path = paths[p], o.threads = 1;
            cr_assert_eq(mpq_gemv(&A, x, y1, batch, &o, NULL, 0), MPQ_OK);
            o.threads = 2;
            size_t wb = mpq_gemv_work_bytes(&A, batch);
            void *w = tc_alloc(wb);
            cr_assert_eq(mpq_gemv(&A, x, y2, batch, &o, w, wb), MPQ_OK);
            cr_assert_eq(memcmp(y1, y2, 4u * s.m * batch), 0, "%s: threads or workspace changed the result",
                         mpq_path_name(paths[p]));
            for (int v = 0; v < batch; v++) {
                cr_assert_eq(mpq_gemv(&A, x + v * s.n, ys, 1, &o, w, wb), MPQ_OK);
                cr_assert_eq(memcmp(ys, y1 + v * s.m, 4u * s.m), 0, "%s: batch row %d of %d differs",
                             mpq_path_name(paths[p]), v, batch);
            }
            mpq_aligned_free(w);
        }
    }
    mpq_packed_free(&A);
    free(W), free(x), free(y1), free(y2), free(ys);
}

/* Several threads of the caller multiplying at once (each with its own
   workspace), on every path and with 1, 2 and 5 threads per product: every
   result must be the one a lone single-threaded product gives. */
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
typedef struct caller {
    const mpq_packed *A;
    const float *x, *expect;
    int n, m, reps, bad;
    mpq_path path;
} caller;

static void *caller_run(void *arg)
{
    caller *c = (caller *)arg;
    size_t wb = mpq_gemv_work_bytes(c->A, 1);
    void *w = tc_alloc(wb);
    float *y = malloc(4u * c->m);
    for (int k = 0; k < c->reps; k++) {
        const int v = k % 7;
        mpq_gemv_opts o = {0};
        o.path = c->path, o.threads = 1 + (k % 3 == 2 ? 4 : k % 3);
        if (mpq_gemv(c->A, c->x + (size_t)v * c->n, y, 1, &o, w, wb) != MPQ_OK ||
            memcmp(y, c->expect + (size_t)v * c->m, 4u * c->m) != 0)
            c->bad++;
    }
    mpq_aligned_free(w);
    free(y);
    return NULL;
}

Test(gemv, concurrent_callers_get_the_same_results)
{
    synth_rng r = {36};
    const shape s = {700, 520, 128, 16};
    float *W = malloc(sizeof(float) * s.m * s.n), *x = malloc(4u * s.n * 7), *expect = malloc(4u * s.m * 7);
    synth_weights(&r, W, s.m, s.n);
    for (int v = 0; v < 7; v++) synth_activations(&r, x + v * s.n, s.n);
    mpq_packed A = pack_random(&r, &s, 1, 1, 8, W);
    for (int p = 0; p < NPATHS; p++) {
        if (!mpq_path_available(paths[p])) continue;
        mpq_gemv_opts o = {0};
        o.path = paths[p], o.threads = 1;
        for (int v = 0; v < 7; v++) cr_assert_eq(mpq_gemv(&A, x + v * s.n, expect + v * s.m, 1, &o, NULL, 0), MPQ_OK);
        caller c[4];
        pthread_t th[4];
        for (int k = 0; k < 4; k++) {
            c[k] = (caller){&A, x, expect, s.n, s.m, 150, 0, paths[p]};
            cr_assert_eq(pthread_create(&th[k], NULL, caller_run, &c[k]), 0);
        }
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            cr_assert_eq(c[k].bad, 0, "%s: caller %d got %d wrong results", mpq_path_name(paths[p]), k, c[k].bad);
        }
    }
    mpq_packed_free(&A);
    free(W), free(x), free(expect);
}
#endif

/* mpq_parallel: every task exactly once, whatever the counts of tasks and
   threads (more threads than tasks, more threads than cores). */
typedef struct counts {
    int *hits;
} counts;

static void count_task(void *ctx, int t) { __atomic_add_fetch(&((counts *)ctx)->hits[t], 1, __ATOMIC_RELAXED); }

Test(gemv, parallel_runs_every_task_once)
{
    const int ntasks[] = {1, 2, 3, 7, 63, 64, 65, 130, 1000}, threads[] = {0, 1, 2, 3, 5, 70};
    int *hits = malloc(sizeof(int) * 1000);
    counts c = {hits};
    for (int a = 0; a < 9; a++)
        for (int b = 0; b < 6; b++) {
            memset(hits, 0, sizeof(int) * 1000);
            cr_assert_eq(mpq_parallel(ntasks[a], threads[b], count_task, &c), MPQ_OK);
            for (int t = 0; t < ntasks[a]; t++)
                cr_assert_eq(hits[t], 1, "%d tasks, %d threads: task %d ran %d times", ntasks[a], threads[b], t,
                             hits[t]);
        }
    cr_assert_eq(mpq_parallel(0, 2, count_task, &c), MPQ_OK);
    cr_assert_eq(mpq_parallel(-1, 2, count_task, &c), MPQ_ERR_ARG);
    cr_assert_eq(mpq_parallel(4, -1, count_task, &c), MPQ_ERR_ARG);
    cr_assert_eq(mpq_parallel(4, 2, NULL, &c), MPQ_ERR_ARG);
    free(hits);
}

/* The load reading behind "fewer threads than busy cores": /proc/stat's
   first line, busy = user + nice + system + irq + softirq + steal. */
Test(gemv, proc_stat_busy_time_is_parsed)
{
    cr_assert_eq(mpq__proc_stat_busy("cpu  6576682 295633 286266 3361423 16339 0 871 13084 0 0\ncpu0 1 2 3\n"),
                 6576682LL + 295633 + 286266 + 0 + 871 + 13084);
    cr_assert_eq(mpq__proc_stat_busy("cpu  10 20 30 4000 50 6 7\n"), 10 + 20 + 30 + 6 + 7); /* no steal field */
    cr_assert_eq(mpq__proc_stat_busy("cpu  10 20 30 4000 50 6 7 8"), 10 + 20 + 30 + 6 + 7 + 8);
    cr_assert_eq(mpq__proc_stat_busy("cpu  10 20 30 4000 50 6\n"), -1);   /* too few fields */
    cr_assert_eq(mpq__proc_stat_busy("cpu0 10 20 30 4000 50 6 7\n"), -1); /* a single core's line */
    cr_assert_eq(mpq__proc_stat_busy("intr 1 2 3 4 5 6 7 8\n"), -1);
    cr_assert_eq(mpq__proc_stat_busy("cpu  10 20 30 4000 50 6 7x\n"), -1);
    cr_assert_eq(mpq__proc_stat_busy("cpu  99999999999999999999999 1 1 1 1 1 1\n"), -1);
    cr_assert_eq(mpq__proc_stat_busy(""), -1);
}

/* Threads from the free cores (x 256): rounded to nearest, at least one,
   at most the threads asked for. */
Test(gemv, threads_follow_the_free_cores)
{
    cr_assert_eq(mpq__load_team(2, 2 * 256), 2);
    cr_assert_eq(mpq__load_team(2, 1 * 256), 1); /* two busy loops took one of two cores from us */
    cr_assert_eq(mpq__load_team(2, 384), 2);     /* 1.5 rounds up */
    cr_assert_eq(mpq__load_team(2, 383), 1);
    cr_assert_eq(mpq__load_team(8, 1), 1);        /* nothing free: the caller alone */
    cr_assert_eq(mpq__load_team(4, 64 * 256), 4); /* never more than asked */
    cr_assert_eq(mpq__load_team(16, 10 * 256 + 100), 10);
}

Test(gemv, library_reference_agrees_with_the_test_reference)
{
    synth_rng r = {36};
    const shape s = {70, 333, 32, 5};
    float *W = malloc(sizeof(float) * s.m * s.n), x[2 * 333];
    synth_weights(&r, W, s.m, s.n);
    synth_activations(&r, x, 2 * s.n);
    mpq_packed A = pack_random(&r, &s, 1, 1, 8, W);
    tc_mat M;
    tc_decode(A.buf, &M);
    double ref[140], lib[140];
    for (int skip = 0; skip < 8; skip++) {
        tc_gemv(&M, x, 2, skip, ref, NULL);
        cr_assert_eq(mpq_gemv_ref(&A, x, lib, 2, skip), MPQ_OK);
        for (int k = 0; k < 140; k++) cr_assert_leq(fabs(lib[k] - ref[k]), 1e-12 * (fabs(ref[k]) + 1));
    }
    tc_free(&M);
    mpq_packed_free(&A);
    free(W);
}

Test(gemv, bad_inputs_are_errors_and_write_nothing)
{
    synth_rng r = {37};
    const shape s = {40, 64, 32, 16};
    float W[40 * 64], x[2 * 64], y[80];
    synth_weights(&r, W, 40, 64);
    synth_activations(&r, x, 128);
    mpq_packed A = pack_random(&r, &s, 0, 2, 3, W);
    size_t wb = mpq_gemv_work_bytes(&A, 2);
    uint8_t *w = tc_alloc(wb + 64);
    mpq_gemv_opts o = {0};
#define EXPECT(call, st)                                                                                               \
    do {                                                                                                               \
        for (int k = 0; k < 80; k++) y[k] = 12345.0f;                                                                  \
        cr_assert_eq((call), (st), #call);                                                                             \
        for (int k = 0; k < 80; k++) cr_assert_eq(y[k], 12345.0f, "y written by " #call);                              \
    } while (0)
    x[70] = NAN;
    EXPECT(mpq_gemv(&A, x, y, 2, &o, w, wb), MPQ_ERR_NONFINITE);
    x[70] = -INFINITY;
    EXPECT(mpq_gemv(&A, x, y, 2, &o, w, wb), MPQ_ERR_NONFINITE);
    double yd[80];
    cr_assert_eq(mpq_gemv_ref(&A, x, yd, 2, 0), MPQ_ERR_NONFINITE);
    x[70] = 1.0f;
    EXPECT(mpq_gemv(&A, x, y, 0, &o, w, wb), MPQ_ERR_SIZE);
    EXPECT(mpq_gemv(&A, x, y, 2, &o, w, wb - 1), MPQ_ERR_SIZE);
    EXPECT(mpq_gemv(&A, x, y, 2, &o, w + 16, wb), MPQ_ERR_ALIGN);
    EXPECT(mpq_gemv(NULL, x, y, 2, &o, w, wb), MPQ_ERR_ARG);
    EXPECT(mpq_gemv(&A, NULL, y, 2, &o, w, wb), MPQ_ERR_ARG);
    o.skip_planes = -1;
    EXPECT(mpq_gemv(&A, x, y, 2, &o, w, wb), MPQ_ERR_ARG);
    o.skip_planes = 0, o.threads = -2;
    EXPECT(mpq_gemv(&A, x, y, 2, &o, w, wb), MPQ_ERR_ARG);
    o.threads = 0, o.path = (mpq_path)42;
    EXPECT(mpq_gemv(&A, x, y, 2, &o, w, wb), MPQ_ERR_UNSUPPORTED);
    mpq_packed bad = A;
    bad.format = 99;
    EXPECT(mpq_gemv(&bad, x, y, 2, NULL, NULL, 0), MPQ_ERR_ARG);
#undef EXPECT
    o.path = MPQ_PATH_AUTO;
    cr_assert_eq(mpq_gemv(&A, x, y, 2, &o, w, wb), MPQ_OK);
    /* skip_planes beyond a block's width leaves one plane */
    float y9[80];
    o.skip_planes = 9;
    cr_assert_eq(mpq_gemv(&A, x, y9, 2, &o, w, wb), MPQ_OK);
    tc_mat M;
    tc_decode(A.buf, &M);
    double ref[80];
    tc_gemv(&M, x, 2, 7, ref, NULL);
    for (int k = 0; k < 80; k++) cr_assert_leq(fabs(y9[k] - ref[k]), 1e-3 * (fabs(ref[k]) + 1));
    tc_free(&M);
    mpq_aligned_free(w);
    mpq_packed_free(&A);
}

/* Products in phases (mpq_gemv_job): the tasks of each phase cut at random
   points and run piece by piece in a random order give mpq_gemv's result
   bit for bit, on every path, with permutations, column scales, a rotation
   and a sparse part; a second and third matrix of the same columns, column
   scales and rotation read the first one's tables (none built for them). */
static void run_phase_shuffled(synth_rng *r, const mpq_gemv_job *j, int ph)
{
    enum { MAXP = 64 };
    const int n = j->tasks[ph];
    int cut[MAXP + 1], np = 0, order[MAXP];
    cut[np++] = 0;
    for (int t = 1; t < n && np < MAXP; t++)
        if (synth_int(r, 3) == 0) cut[np++] = t;
    cut[np] = n;
    for (int k = 0; k < np; k++) order[k] = k;
    for (int k = np - 1; k > 0; k--) {
        const int o = synth_int(r, k + 1), tmp = order[k];
        order[k] = order[o], order[o] = tmp;
    }
    for (int k = 0; k < np; k++) cr_assert_eq(mpq_gemv_job_run(j, ph, cut[order[k]], cut[order[k] + 1]), MPQ_OK);
}

static void sparse_rows(synth_rng *r, int m, int n, mpq_sparse *S)
{
    S->rows = m, S->cols = n;
    S->row_ptr = malloc(4u * (m + 1));
    S->col = malloc(4u * (size_t)m * 3);
    S->val = malloc(4u * (size_t)m * 3);
    S->nnz = 0;
    for (int i = 0; i < m; i++) {
        S->row_ptr[i] = (uint32_t)S->nnz;
        for (int j = synth_int(r, 17); j < n && S->nnz < (size_t)(i + 1) * 3; j += 1 + synth_int(r, n / 2 + 1)) {
            S->col[S->nnz] = (uint32_t)j;
            S->val[S->nnz++] = (float)synth_unif(r) - 0.5f;
        }
    }
    S->row_ptr[m] = (uint32_t)S->nnz;
}

Test(gemv, jobs_split_any_way_give_mpq_gemv_bit_for_bit)
{
    synth_rng r = {41};
    const shape shp[] = {{37, 200, 64, 3}, {300, 576, 128, 16}, {1, 8, 8, 16}, {129, 257, 128, 256}, {70, 96, 32, 5}};
    for (size_t si = 0; si < sizeof shp / sizeof shp[0]; si++)
        for (int variant = 0; variant < 4; variant++) { /* 1: perms and scales, 2: + rotation, 3: + sparse part */
            const shape *s = &shp[si];
            const int bmax = 11, ng = (s->n + s->G - 1) / s->G, nb = ((s->m + s->br - 1) / s->br) * ng;
            float *W = malloc(4u * s->m * s->n * 3), *x = malloc(4u * s->n * bmax), *cs = malloc(4u * s->n);
            float *cs2 = malloc(4u * s->n), *y = malloc(4u * s->m * bmax * 3), *e = malloc(4u * s->m * bmax * 3);
            uint32_t *pc = malloc(4u * s->n), *pr = malloc(4u * s->m);
            uint8_t *bits = malloc((size_t)nb);
            synth_weights(&r, W, 3 * s->m, s->n);
            for (int v = 0; v < bmax; v++) synth_activations(&r, x + v * s->n, s->n);
            synth_perm(&r, pc, s->n);
            synth_perm(&r, pr, s->m);
            for (int j = 0; j < s->n; j++) cs[j] = cs2[j] = 0.3f + 2.0f * (float)synth_unif(&r);
            cs2[s->n / 2] *= 1.5f;
            mpq_rotation rot;
            cr_assert_eq(mpq_rotation_init(&rot, s->n, 7 + si), MPQ_OK);
            mpq_sparse S = {0};
            mpq_packed A[4];
            for (int k = 0; k < 4; k++) { /* A[3]: A[0]'s columns but other column scales */
                for (int b = 0; b < nb; b++) bits[b] = (uint8_t)(1 + synth_int(&r, 8));
                mpq_bitplane_desc d = {0};
                d.rows = s->m, d.cols = s->n, d.group = s->G, d.block_rows = s->br, d.bits = bits;
                if (variant >= 1) d.p_row = k == 1 ? NULL : pr, d.p_col = pc, d.col_scale = k == 3 ? cs2 : cs;
                if (variant >= 2) d.rotation = &rot;
                if (variant >= 3 && k != 2) {
                    sparse_rows(&r, s->m, s->n, &S);
                    d.sparse = &S;
                }
                cr_assert_eq(mpq_pack_alloc(&d, W + (size_t)(k % 3) * s->m * s->n, &A[k]), MPQ_OK);
                if (S.row_ptr) mpq_sparse_free(&S);
                memset(&S, 0, sizeof S);
            }
            cr_assert(mpq_gemv_tables_shared(&A[0], &A[1]) && mpq_gemv_tables_shared(&A[2], &A[0]));
            cr_assert_eq(mpq_gemv_tables_shared(&A[0], &A[3]), variant == 0, "other column scales, variant %d",
                         variant);
            for (int p = 0; p < NPATHS; p++) {
                if (!mpq_path_available(paths[p])) continue;
                for (int batch = 1; batch <= bmax; batch += 5) {
                    mpq_gemv_opts o = {0};
                    o.path = paths[p], o.skip_planes = batch == 6;
                    for (int k = 0; k < 3; k++)
                        cr_assert_eq(mpq_gemv(&A[k], x, e + (size_t)k * s->m * batch, batch, &o, NULL, 0), MPQ_OK);
                    const size_t wb = mpq_gemv_work_bytes(&A[0], batch);
                    void *w = tc_alloc(wb);
                    mpq_gemv_job J[3];
                    for (size_t q = 0; q < 4u * s->m * batch * 3; q++) ((uint8_t *)y)[q] = 0xA5;
                    for (int k = 0; k < 3; k++)
                        cr_assert_eq(mpq_gemv_job_init(&J[k], &A[k], x, y + (size_t)k * s->m * batch, batch, &o,
                                                       k ? NULL : w, k ? 0 : wb, k ? &J[0] : NULL),
                                     MPQ_OK);
                    cr_assert_eq(J[0].tasks[0], variant >= 2 ? batch : 0);
                    cr_assert_eq(J[0].tasks[1], batch * ng);
                    for (int k = 1; k < 3; k++) cr_assert_eq(J[k].tasks[0] + J[k].tasks[1], 0);
                    for (int ph = 0; ph < MPQ_GEMV_PHASES; ph++)
                        for (int k = 0; k < 3; k++) run_phase_shuffled(&r, &J[k], ph);
                    cr_assert(!memcmp(y, e, 4u * s->m * batch * 3), "%s, shape %zu, variant %d, batch %d",
                              mpq_path_name(paths[p]), si, variant, batch);
                    mpq_aligned_free(w);
                }
            }
            for (int k = 0; k < 4; k++) mpq_packed_free(&A[k]);
            mpq_rotation_free(&rot);
            free(W), free(x), free(cs), free(cs2), free(y), free(e), free(pc), free(pr), free(bits);
        }
}

/* Jobs refuse what mpq_gemv refuses, tables of other columns, a missing
   workspace and tasks out of range; NaN or Inf in x is found by phase 0
   or 1, before phase 2 writes y. */
Test(gemv, jobs_refuse_bad_input)
{
    synth_rng r = {43};
    const shape s = {40, 64, 32, 16};
    float W[40 * 64], x[2 * 64], y[80];
    synth_weights(&r, W, 40, 64);
    synth_activations(&r, x, 128);
    mpq_packed A = pack_random(&r, &s, 1, 2, 3, W), B = pack_random(&r, &s, 1, 2, 3, W);
    mpq_rotation rot;
    cr_assert_eq(mpq_rotation_init(&rot, 64, 3), MPQ_OK);
    mpq_bitplane_desc d = {0};
    d.rows = 40, d.cols = 64, d.group = 32, d.rotation = &rot;
    mpq_packed R;
    cr_assert_eq(mpq_pack_alloc(&d, W, &R), MPQ_OK);
    const size_t wb = mpq_gemv_work_bytes(&A, 2);
    uint8_t *w = tc_alloc(wb + 64), *wr = tc_alloc(mpq_gemv_work_bytes(&R, 2));
    mpq_gemv_job j, k;
    cr_assert_eq(mpq_gemv_job_init(&j, &A, x, y, 2, NULL, NULL, 0, NULL), MPQ_ERR_ARG, "no workspace");
    cr_assert_eq(j.tasks[0] + j.tasks[1] + j.tasks[2], 0);
    cr_assert_eq(mpq_gemv_job_init(&j, &A, x, y, 2, NULL, w, wb - 1, NULL), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_gemv_job_init(&j, &A, x, y, 2, NULL, w + 16, wb, NULL), MPQ_ERR_ALIGN);
    cr_assert_eq(mpq_gemv_job_init(&j, &A, x, y, 0, NULL, w, wb, NULL), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_gemv_job_init(&j, NULL, x, y, 2, NULL, w, wb, NULL), MPQ_ERR_ARG);
    cr_assert_eq(mpq_gemv_job_init(NULL, &A, x, y, 2, NULL, w, wb, NULL), MPQ_ERR_ARG);
    mpq_gemv_opts o = {0};
    o.path = (mpq_path)42;
    cr_assert_eq(mpq_gemv_job_init(&j, &A, x, y, 2, &o, w, wb, NULL), MPQ_ERR_UNSUPPORTED);
    cr_assert_eq(mpq_gemv_job_init(&j, &A, x, y, 2, NULL, w, wb, NULL), MPQ_OK);
    /* B has its own column permutation: its tables are not A's */
    cr_assert(!mpq_gemv_tables_shared(&A, &B) && !mpq_gemv_tables_shared(&A, &R) && !mpq_gemv_tables_shared(&A, NULL));
    cr_assert_eq(mpq_gemv_job_init(&k, &B, x, y, 2, NULL, NULL, 0, &j), MPQ_ERR_ARG);
    cr_assert_eq(mpq_gemv_job_init(&k, &A, x, y, 1, NULL, NULL, 0, &j), MPQ_ERR_ARG, "another batch");
    cr_assert_eq(mpq_gemv_job_init(&k, &A, x + 1, y, 2, NULL, NULL, 0, &j), MPQ_ERR_ARG, "another x");
    o.path = MPQ_PATH_SCALAR, o.a8 = 0;
    if (mpq_path_available(MPQ_PATH_AVX2) || mpq_path_available(MPQ_PATH_AVX512_VNNI))
        cr_assert_eq(mpq_gemv_job_init(&k, &A, x, y, 2, &o, NULL, 0, &j), MPQ_ERR_ARG, "another path");
    cr_assert_eq(mpq_gemv_job_run(&j, 3, 0, 1), MPQ_ERR_ARG);
    cr_assert_eq(mpq_gemv_job_run(&j, 2, 0, j.tasks[2] + 1), MPQ_ERR_ARG);
    cr_assert_eq(mpq_gemv_job_run(&j, 1, -1, 1), MPQ_ERR_ARG);
    cr_assert_eq(mpq_gemv_job_run(NULL, 1, 0, 1), MPQ_ERR_ARG);
    /* non-finite input: phase 1 (phase 0 with a rotation) reports it */
    x[70] = NAN;
    cr_assert_eq(mpq_gemv_job_run(&j, 1, 0, j.tasks[1]), MPQ_ERR_NONFINITE);
    cr_assert_eq(mpq_gemv_job_init(&j, &R, x, y, 2, NULL, wr, mpq_gemv_work_bytes(&R, 2), NULL), MPQ_OK);
    cr_assert_eq(j.tasks[0], 2);
    cr_assert_eq(mpq_gemv_job_run(&j, 0, 0, 1), MPQ_OK, "vector 0 is finite");
    cr_assert_eq(mpq_gemv_job_run(&j, 0, 1, 2), MPQ_ERR_NONFINITE);
    /* finite x whose V x overflows: phase 1 finds it, on every thread of
       mpq_gemv's team (which must all leave the region), y untouched */
    for (int k = 0; k < 128; k++) x[k] = 3e38f;
    for (int k = 0; k < 80; k++) y[k] = 7.0f;
    mpq_gemv_opts two = {0};
    two.threads = 2;
    cr_assert_eq(mpq_gemv(&R, x, y, 2, &two, NULL, 0), MPQ_ERR_NONFINITE);
    for (int k = 0; k < 80; k++) cr_assert_eq(y[k], 7.0f);
    mpq_aligned_free(w), mpq_aligned_free(wr);
    mpq_packed_free(&A), mpq_packed_free(&B), mpq_packed_free(&R);
    mpq_rotation_free(&rot);
}
