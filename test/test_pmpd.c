/* Section 11, PMPD: schedules, the precision at token t, average bits, the
   static scheduler against a brute-force reference, phase-aware allocation,
   and the bits a packed model reads at each skip. */
#include "common.h"

static mpq_pmpd_schedule sched3(long s1, long s2)
{
    mpq_pmpd_schedule s;
    memset(&s, 0, sizeof s);
    s.prefill_skip = 0, s.nlevels = 3;
    s.skip[0] = 0, s.skip[1] = 1, s.skip[2] = 2;
    s.start[0] = 0, s.start[1] = s1, s.start[2] = s2;
    return s;
}

Test(pmpd, precision_at_token_and_average_bits_by_hand)
{
    mpq_pmpd_schedule s = sched3(10, 30);
    s.prefill_skip = 0;
    cr_assert_eq(mpq_pmpd_validate(&s), MPQ_OK);
    cr_assert_eq(mpq_pmpd_skip_at(&s, -1), 0); /* the prompt */
    cr_assert_eq(mpq_pmpd_skip_at(&s, 0), 0);
    cr_assert_eq(mpq_pmpd_skip_at(&s, 9), 0);
    cr_assert_eq(mpq_pmpd_skip_at(&s, 10), 1);
    cr_assert_eq(mpq_pmpd_skip_at(&s, 29), 1);
    cr_assert_eq(mpq_pmpd_skip_at(&s, 30), 2);
    cr_assert_eq(mpq_pmpd_skip_at(&s, 100000), 2);
    const double bits[3] = {4.25, 3.25, 2.25};
    double avg;
    cr_assert_eq(mpq_pmpd_average_bits(&s, bits, 100, &avg), MPQ_OK);
    cr_assert_float_eq(avg, (10 * 4.25 + 20 * 3.25 + 70 * 2.25) / 100.0, 1e-12); /* 2.65 */
    cr_assert_eq(mpq_pmpd_average_bits(&s, bits, 20, &avg), MPQ_OK);
    cr_assert_float_eq(avg, 3.75, 1e-12);
    cr_assert_eq(mpq_pmpd_average_bits(&s, bits, 5, &avg), MPQ_OK);
    cr_assert_float_eq(avg, 4.25, 1e-12);
    /* an empty middle level */
    s = sched3(10, 10);
    cr_assert_eq(mpq_pmpd_skip_at(&s, 10), 2);
    cr_assert_eq(mpq_pmpd_average_bits(&s, bits, 20, &avg), MPQ_OK);
    cr_assert_float_eq(avg, 3.25, 1e-12);
}

Test(pmpd, invalid_schedules_are_errors)
{
    const double bits[3] = {4, 3, 2};
    double avg = -7;
    mpq_pmpd_schedule s = sched3(10, 5); /* a later level starting earlier */
    cr_assert_eq(mpq_pmpd_validate(&s), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_pmpd_skip_at(&s, 3), -1);
    cr_assert_eq(mpq_pmpd_average_bits(&s, bits, 10, &avg), MPQ_ERR_RANGE);
    s = sched3(10, 20);
    s.skip[2] = 1; /* not progressive */
    cr_assert_eq(mpq_pmpd_validate(&s), MPQ_ERR_RANGE);
    s = sched3(10, 20);
    s.start[0] = 1;
    cr_assert_eq(mpq_pmpd_validate(&s), MPQ_ERR_RANGE);
    s = sched3(10, 20);
    s.nlevels = 0;
    cr_assert_eq(mpq_pmpd_validate(&s), MPQ_ERR_RANGE);
    s.nlevels = MPQ_PMPD_MAX_LEVELS + 1;
    cr_assert_eq(mpq_pmpd_validate(&s), MPQ_ERR_RANGE);
    s = sched3(10, 20);
    s.prefill_skip = -1;
    cr_assert_eq(mpq_pmpd_validate(&s), MPQ_ERR_RANGE);
    s = sched3(10, 20);
    cr_assert_eq(mpq_pmpd_average_bits(&s, bits, 0, &avg), MPQ_ERR_SIZE);
    const double nanbits[3] = {4, NAN, 2};
    cr_assert_eq(mpq_pmpd_average_bits(&s, nanbits, 10, &avg), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_pmpd_validate(NULL), MPQ_ERR_ARG);
    cr_assert_eq(avg, -7);
}

/* A quality model: every token decoded at skip k costs pen[k] * w(t), with
   w falling along the sequence (early tokens matter more). */
typedef struct qmodel {
    double pen[8];
    long length;
    int calls, fail;
    int nan;
} qmodel;

static double q_of(const qmodel *m, const mpq_pmpd_schedule *s)
{
    double q = 0;
    for (long t = 0; t < m->length; t++) q -= m->pen[mpq_pmpd_skip_at(s, t)] / (1.0 + 0.05 * (double)t);
    q -= 3.0 * m->pen[s->prefill_skip];
    return q;
}

static mpq_status qfn(void *u, const mpq_pmpd_schedule *s, double *q)
{
    qmodel *m = (qmodel *)u;
    m->calls++;
    if (m->fail) return MPQ_ERR_DEVICE;
    *q = m->nan ? NAN : q_of(m, s);
    return MPQ_OK;
}

Test(pmpd, static_search_finds_the_cheapest_schedule_meeting_the_target)
{
    const double bits[4] = {4.25, 3.25, 2.25, 1.25};
    synth_rng r = {91};
    for (int trial = 0; trial < 60; trial++) {
        const int L = 2 + trial % 3, N = 2 + synth_int(&r, 12);
        const long len = 1 + synth_int(&r, 200);
        qmodel m = {{0, 0.1 + synth_unif(&r), 1.5 + 2 * synth_unif(&r), 6 + 4 * synth_unif(&r)}, len, 0, 0, 0};
        mpq_pmpd_search d;
        memset(&d, 0, sizeof d);
        d.prefill_skip = 0, d.nlevels = L, d.bits = bits, d.length = len, d.candidates = N;
        for (int k = 0; k < L; k++) d.skip[k] = k;
        /* a target between all-high and all-low quality */
        mpq_pmpd_schedule hi = sched3(len, len), lo = sched3(0, 0);
        hi.nlevels = lo.nlevels = 1, lo.skip[0] = L - 1;
        double qh = q_of(&m, &hi), ql = q_of(&m, &lo);
        d.target = ql + (qh - ql) * synth_unif(&r);
        mpq_pmpd_schedule out;
        double qual;
        int ev;
        cr_assert_eq(mpq_pmpd_static_search(&d, qfn, &m, &out, &qual, &ev), MPQ_OK);
        cr_assert_eq(mpq_pmpd_validate(&out), MPQ_OK);
        cr_assert_geq(qual, d.target);
        cr_assert_float_eq(qual, q_of(&m, &out), 1e-12);
        cr_assert_eq(ev, m.calls);
        double got;
        mpq_pmpd_average_bits(&out, bits, len, &got);
        /* reference: every progressive schedule from the candidates, by brute force */
        long cand[16];
        for (int k = 0; k < N; k++) cand[k] = lround((double)k * len / (N - 1));
        double best = INFINITY;
        int idx[4] = {0, 0, 0, 0};
        for (idx[1] = 0; idx[1] < N; idx[1]++)
            for (idx[2] = (L > 2 ? idx[1] : 0); idx[2] < (L > 2 ? N : 1); idx[2]++)
                for (idx[3] = (L > 3 ? idx[2] : 0); idx[3] < (L > 3 ? N : 1); idx[3]++) {
                    mpq_pmpd_schedule s;
                    memset(&s, 0, sizeof s);
                    s.nlevels = L;
                    for (int k = 0; k < L; k++) s.skip[k] = k, s.start[k] = k ? cand[idx[k]] : 0;
                    double a = 0;
                    for (long t = 0; t < len; t++) a += bits[mpq_pmpd_skip_at(&s, t)];
                    a /= (double)len;
                    if (q_of(&m, &s) >= d.target && a < best) best = a;
                }
        cr_assert_float_eq(got, best, 1e-12, "trial %d: %g vs %g", trial, got, best);
        for (int k = 1; k < L; k++) { /* starts are candidates */
            int found = 0;
            for (int j = 0; j < N; j++) found |= out.start[k] == cand[j];
            cr_assert(found);
        }
    }
}

Test(pmpd, static_search_errors)
{
    const double bits[3] = {4, 3, 2};
    qmodel m = {{0, 1, 2}, 50, 0, 0, 0};
    mpq_pmpd_search d;
    memset(&d, 0, sizeof d);
    d.nlevels = 3, d.skip[1] = 1, d.skip[2] = 2, d.bits = bits, d.length = 50, d.candidates = 8;
    mpq_pmpd_schedule out;
    d.target = 1.0; /* above every quality: nothing meets it */
    cr_assert_eq(mpq_pmpd_static_search(&d, qfn, &m, &out, NULL, NULL), MPQ_ERR_RANGE);
    d.target = -1e9;
    m.fail = 1;
    cr_assert_eq(mpq_pmpd_static_search(&d, qfn, &m, &out, NULL, NULL), MPQ_ERR_DEVICE);
    m.fail = 0, m.nan = 1;
    cr_assert_eq(mpq_pmpd_static_search(&d, qfn, &m, &out, NULL, NULL), MPQ_ERR_NONFINITE);
    m.nan = 0;
    d.candidates = 1;
    cr_assert_eq(mpq_pmpd_static_search(&d, qfn, &m, &out, NULL, NULL), MPQ_ERR_SIZE);
    d.candidates = 8, d.skip[2] = 1;
    cr_assert_eq(mpq_pmpd_static_search(&d, qfn, &m, &out, NULL, NULL), MPQ_ERR_RANGE);
    d.skip[2] = 2, d.target = NAN;
    cr_assert_eq(mpq_pmpd_static_search(&d, qfn, &m, &out, NULL, NULL), MPQ_ERR_NONFINITE);
    d.target = -1e9, d.nlevels = 8, d.candidates = 1000; /* C(1006, 7): too many */
    for (int k = 0; k < 8; k++) d.skip[k] = k;
    double b8[8] = {8, 7, 6, 5, 4, 3, 2, 1};
    d.bits = b8;
    cr_assert_eq(mpq_pmpd_static_search(&d, qfn, &m, &out, NULL, NULL), MPQ_ERR_RANGE);
    /* the cheapest of all when the target is trivial: everything at the lowest */
    d.nlevels = 3, d.candidates = 5, d.bits = bits;
    int ev = 0;
    cr_assert_eq(mpq_pmpd_static_search(&d, qfn, &m, &out, NULL, &ev), MPQ_OK);
    cr_assert_eq(ev, 1);
    cr_assert_eq(mpq_pmpd_skip_at(&out, 0), 2);
}

Test(pmpd, phase_allocation_picks_the_cheapest_pair)
{
    const double bits[4] = {4.25, 3.25, 2.25, 1.25};
    const int skips[4] = {0, 1, 2, 3};
    qmodel m = {{0, 0.2, 1.0, 5.0}, 40, 0, 0, 0};
    mpq_pmpd_schedule out;
    /* the reference: over all (p <= d), least bits[d], then least bits[p], meeting the target */
    for (double target = -250; target <= 0; target += 7.5) {
        m.calls = 0;
        mpq_status st = mpq_pmpd_phase_allocate(skips, 4, bits, target, qfn, &m, &out);
        int bp = -1, bd = -1;
        for (int dd = 3; dd >= 0 && bd < 0; dd--)
            for (int pp = dd; pp >= 0; pp--) {
                mpq_pmpd_schedule s;
                memset(&s, 0, sizeof s);
                s.nlevels = 1, s.prefill_skip = pp, s.skip[0] = dd;
                if (q_of(&m, &s) >= target) {
                    bp = pp, bd = dd;
                    break;
                }
            }
        if (bd < 0) {
            cr_assert_eq(st, MPQ_ERR_RANGE);
            continue;
        }
        cr_assert_eq(st, MPQ_OK);
        cr_assert(out.prefill_skip == bp && out.skip[0] == bd && out.nlevels == 1, "target %g: (%d, %d) vs (%d, %d)",
                  target, out.prefill_skip, out.skip[0], bp, bd);
    }
    cr_assert_eq(mpq_pmpd_phase_allocate(skips, 0, bits, 0, qfn, &m, &out), MPQ_ERR_SIZE);
    const int bad[2] = {0, 9};
    cr_assert_eq(mpq_pmpd_phase_allocate(bad, 2, bits, 0, qfn, &m, &out), MPQ_ERR_RANGE);
}

Test(pmpd, bits_read_at_each_skip)
{
    synth_rng r = {92};
    const int m = 45, n = 300, G = 64, br = 16;
    float *W = malloc(4u * m * n);
    synth_weights(&r, W, m, n);
    int ng = (n + G - 1) / G, nb = ((m + br - 1) / br) * ng;
    uint8_t *bits = malloc((size_t)nb);
    for (int k = 0; k < nb; k++) bits[k] = (uint8_t)(1 + synth_int(&r, 8));
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = G, d.block_rows = br, d.bits = bits;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    for (int skip = 0; skip < 9; skip++) {
        double want = 0;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                int b = bits[(i / br) * ng + j / G] - skip;
                want += b < 1 ? 1 : b;
            }
        want += 32.0 * m * ng;
        cr_assert_float_eq(mpq_packed_bpw_skip(&A, skip), want / ((double)m * n), 1e-12);
    }
    cr_assert_float_eq(mpq_packed_bpw_skip(&A, 0), mpq_packed_bpw(&A, 1), 1e-12);
    /* and a product at a schedule's skip is the product with that skip */
    mpq_pmpd_schedule s = sched3(3, 6);
    float x[300], y0[45], y1[45];
    synth_activations(&r, x, n);
    for (long t = 0; t < 9; t++) {
        mpq_gemv_opts o = {0};
        o.skip_planes = mpq_pmpd_skip_at(&s, t);
        cr_assert_eq(mpq_gemv(&A, x, y0, 1, &o, NULL, 0), MPQ_OK);
        double ref[45];
        cr_assert_eq(mpq_gemv_ref(&A, x, ref, 1, (int)(t / 3)), MPQ_OK);
        for (int i = 0; i < m; i++) y1[i] = (float)ref[i];
        for (int i = 0; i < m; i++) cr_assert_leq(fabsf(y0[i] - y1[i]), 1e-3f * (fabsf(y1[i]) + 1.0f));
    }
    mpq_packed_free(&A);
    free(W), free(bits);
}
