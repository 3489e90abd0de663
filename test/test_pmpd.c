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

/* --- the learned scheduler ------------------------------------------------ */

/* The network written the simple way, in float64 over a flat parameter
   vector th (q, W1, b1, W2, b2) and the constants mean, inv_sd. */
typedef struct ref_net {
    int dk, dv, H, C;
    const double *th, *mean, *inv_sd;
} ref_net;

static void ref_probs(const ref_net *r, const float *K, const float *V, int T, double *p)
{
    const double *q = r->th, *W1 = q + r->dk, *b1 = W1 + r->H * r->dv, *W2 = b1 + r->H, *b2 = W2 + r->C * r->H;
    double s[64], o[64], h[64], mx = -1e300, z = 0;
    cr_assert_leq(T, 64);
    for (int t = 0; t < T; t++) {
        s[t] = 0;
        for (int j = 0; j < r->dk; j++) s[t] += q[j] * K[t * r->dk + j];
        s[t] /= sqrt((double)r->dk);
        if (s[t] > mx) mx = s[t];
    }
    for (int t = 0; t < T; t++) z += exp(s[t] - mx);
    for (int j = 0; j < r->dv; j++) {
        double u = 0;
        for (int t = 0; t < T; t++) u += exp(s[t] - mx) / z * V[t * r->dv + j];
        o[j] = (u - r->mean[j]) * r->inv_sd[j];
    }
    for (int i = 0; i < r->H; i++) {
        double a = b1[i];
        for (int j = 0; j < r->dv; j++) a += W1[i * r->dv + j] * o[j];
        h[i] = a > 0 ? a : 0;
    }
    mx = -1e300, z = 0;
    for (int c = 0; c < r->C; c++) {
        p[c] = b2[c];
        for (int i = 0; i < r->H; i++) p[c] += W2[c * r->H + i] * h[i];
        if (p[c] > mx) mx = p[c];
    }
    for (int c = 0; c < r->C; c++) z += exp(p[c] - mx);
    for (int c = 0; c < r->C; c++) p[c] = exp(p[c] - mx) / z;
}

static double ref_loss(const ref_net *r, const mpq_pmpd_sample *s, int ns, double l2)
{
    double p[MPQ_PMPD_MAX_CLASSES], loss = 0, reg = 0;
    for (int i = 0; i < ns; i++) {
        ref_probs(r, s[i].K, s[i].V, s[i].T, p);
        loss -= log(p[s[i].label]);
    }
    const double *W1 = r->th + r->dk, *W2 = W1 + r->H * r->dv + r->H;
    for (int k = 0; k < r->H * r->dv; k++) reg += W1[k] * W1[k];
    for (int k = 0; k < r->C * r->H; k++) reg += W2[k] * W2[k];
    return loss / ns + 0.5 * l2 * reg;
}

/* A network of these sizes with every parameter random (not the init's
   zeros), and the flat float64 copy the reference reads. */
static void random_net(mpq_pmpd_learned *n, synth_rng *r, int dk, int dv, int H, int C, double *th, double *mean,
                       double *inv_sd)
{
    cr_assert_eq(mpq_pmpd_learned_init(n, dk, dv, H, C, synth_u64(r)), MPQ_OK);
    n->layer = 0, n->prefill_skip = 0, n->skip_high = 0, n->skip_low = 1, n->length = 100;
    float *arr[5] = {n->q, n->w1, n->b1, n->w2, n->b2};
    const int len[5] = {dk, H * dv, H, C * H, C};
    int k = 0;
    for (int a = 0; a < 5; a++)
        for (int i = 0; i < len[a]; i++) {
            if (a == 0 || a == 2 || a == 4) arr[a][i] = 0.3f * synth_gauss(r);
            th[k++] = arr[a][i];
        }
    for (int j = 0; j < dv; j++) {
        n->mean[j] = 0.2f * synth_gauss(r), n->inv_sd[j] = (float)(0.5 + synth_unif(r));
        mean[j] = n->mean[j], inv_sd[j] = n->inv_sd[j];
    }
}

/* K and V of a prompt: Gaussian, with a few channels 10-50x (the massive
   channels of real caches) */
static float *random_cache(synth_rng *r, int T, int d)
{
    float *x = (float *)malloc(sizeof(float) * (size_t)T * d);
    synth_tokens(r, x, T, d, 77);
    for (int i = 0; i < T * d; i++) x[i] *= 0.1f;
    return x;
}

Test(pmpd, learned_forward_matches_a_float64_reference)
{
    synth_rng r = {4242};
    const int dk = 24, dv = 20, H = 13, C = 5;
    mpq_pmpd_learned n;
    double th[24 + 13 * 20 + 13 + 5 * 13 + 5], mean[20], isd[20];
    random_net(&n, &r, dk, dv, H, C, th, mean, isd);
    cr_assert_eq(mpq_pmpd_learned_params(&n), (long)(sizeof th / sizeof th[0]));
    const ref_net rn = {dk, dv, H, C, th, mean, isd};
    const int Ts[4] = {1, 2, 7, 37};
    for (int k = 0; k < 4; k++) {
        float *K = random_cache(&r, Ts[k], dk), *V = random_cache(&r, Ts[k], dv);
        double p[5], want[5];
        cr_assert_eq(mpq_pmpd_learned_forward(&n, K, V, Ts[k], p), MPQ_OK);
        ref_probs(&rn, K, V, Ts[k], want);
        int best = 0;
        for (int c = 0; c < C; c++) {
            cr_assert_float_eq(p[c], want[c], 1e-12 + 1e-11 * want[c], "T %d class %d: %.17g vs %.17g", Ts[k], c, p[c],
                               want[c]);
            if (want[c] > want[best]) best = c;
        }
        mpq_pmpd_schedule s;
        int cls = -1;
        cr_assert_eq(mpq_pmpd_learned_predict(&n, K, V, Ts[k], &s, &cls), MPQ_OK);
        cr_assert_eq(cls, best);
        cr_assert_eq(s.nlevels, 2);
        cr_assert_eq(s.start[1], (long)floor(best * 100.0 / 4 + 0.5));
        free(K), free(V);
    }
    mpq_pmpd_learned_free(&n);
}

Test(pmpd, learned_gradient_matches_finite_differences)
{
    synth_rng r = {777};
    const int dk = 12, dv = 9, H = 7, C = 4, ns = 5;
    enum { P = 12 + 7 * 9 + 7 + 4 * 7 + 4 };
    mpq_pmpd_learned n;
    double th[P], mean[9], isd[9], g[P];
    random_net(&n, &r, dk, dv, H, C, th, mean, isd);
    for (int k = 0; k < dk; k++) n.q[k] *= 8, th[k] = n.q[k]; /* attention far from uniform */
    mpq_pmpd_sample s[5];
    float *mem[10];
    for (int i = 0; i < ns; i++) {
        s[i].T = 3 + 4 * i;
        s[i].K = mem[2 * i] = random_cache(&r, s[i].T, dk);
        s[i].V = mem[2 * i + 1] = random_cache(&r, s[i].T, dv);
        s[i].label = synth_int(&r, C);
    }
    const double l2 = 0.03;
    double loss;
    cr_assert_eq(mpq_pmpd_learned_loss(&n, s, ns, l2, &loss, g), MPQ_OK);
    ref_net rn = {dk, dv, H, C, th, mean, isd};
    cr_assert_float_eq(loss, ref_loss(&rn, s, ns, l2), 1e-11);
    double gmax = 0;
    for (int k = 0; k < P; k++) gmax = fabs(g[k]) > gmax ? fabs(g[k]) : gmax;
    cr_assert_gt(gmax, 1e-3);
    for (int k = 0; k < P; k++) {
        const double h = 1e-6, keep = th[k];
        th[k] = keep + h;
        const double fp = ref_loss(&rn, s, ns, l2);
        th[k] = keep - h;
        const double fm = ref_loss(&rn, s, ns, l2);
        th[k] = keep;
        const double fd = (fp - fm) / (2 * h);
        cr_assert_float_eq(g[k], fd, 1e-7 + 1e-5 * fabs(fd), "parameter %d: %.10g vs finite difference %.10g", k, g[k],
                           fd);
    }
    double loss2; /* without the gradient, the same value */
    cr_assert_eq(mpq_pmpd_learned_loss(&n, s, ns, l2, &loss2, NULL), MPQ_OK);
    cr_assert_eq(loss, loss2);
    for (int i = 0; i < 2 * ns; i++) free(mem[i]);
    mpq_pmpd_learned_free(&n);
}

/* Prompts whose class is written in the value of one marked position (its
   key has a large channel 0): mean pooling dilutes it by 1/T under the
   noise of the other positions, so only a learned query finds it. */
static void marked_samples(synth_rng *r, mpq_pmpd_sample *s, int ns, int dk, int dv, float **mem)
{
    for (int i = 0; i < ns; i++) {
        const int T = 8 + synth_int(r, 33), m = synth_int(r, T);
        float *K = (float *)malloc(sizeof(float) * (size_t)T * dk),
              *V = (float *)malloc(sizeof(float) * (size_t)T * dv);
        for (int k = 0; k < T * dk; k++) K[k] = synth_gauss(r);
        for (int k = 0; k < T * dv; k++) V[k] = synth_gauss(r);
        K[m * dk] = 8.0f;
        const int label = synth_int(r, 3);
        V[m * dv] = label == 0 ? -3.0f : label == 1 ? 0.0f : 3.0f;
        s[i].K = K, s[i].V = V, s[i].T = T, s[i].label = label;
        mem[2 * i] = K, mem[2 * i + 1] = V;
    }
}

/* How many of the samples the network predicts their label for. */
static int predicted_right(const mpq_pmpd_learned *n, const mpq_pmpd_sample *s, int ns)
{
    int right = 0;
    for (int i = 0; i < ns; i++) {
        mpq_pmpd_schedule sc;
        int c = -1;
        cr_assert_eq(mpq_pmpd_learned_predict(n, s[i].K, s[i].V, s[i].T, &sc, &c), MPQ_OK);
        right += c == s[i].label;
    }
    return right;
}

Test(pmpd, learned_training_finds_the_marked_position)
{
    synth_rng r = {31337};
    const int dk = 6, dv = 5, ntrain = 240, ntest = 120;
    mpq_pmpd_sample *s = (mpq_pmpd_sample *)malloc(sizeof *s * (ntrain + ntest));
    float **mem = (float **)malloc(sizeof(float *) * 2 * (ntrain + ntest));
    marked_samples(&r, s, ntrain + ntest, dk, dv, mem);
    mpq_pmpd_learned n;
    cr_assert_eq(mpq_pmpd_learned_init(&n, dk, dv, 16, 3, 5), MPQ_OK);
    n.skip_high = 0, n.skip_low = 1, n.length = 64;
    double before, after;
    cr_assert_eq(mpq_pmpd_learned_loss(&n, s, ntrain, 0, &before, NULL), MPQ_OK);
    mpq_pmpd_train_opts o = {400, 0.03, 1e-4};
    cr_assert_eq(mpq_pmpd_learned_train(&n, s, ntrain, &o, &after), MPQ_OK);
    cr_assert_lt(after, 0.5 * before, "loss %g -> %g", before, after);
    const int right = predicted_right(&n, s + ntrain, ntest);
    cr_assert_geq(right, 0.9 * ntest, "held-out accuracy %d of %d", right, ntest);
    /* the same training with the query held at 0 (mean pooling) cannot */
    mpq_pmpd_learned m0;
    cr_assert_eq(mpq_pmpd_learned_init(&m0, dk, dv, 16, 3, 5), MPQ_OK);
    m0.skip_high = 0, m0.skip_low = 1, m0.length = 64;
    cr_assert_eq(mpq_pmpd_learned_train(&m0, s, ntrain, &o, NULL), MPQ_OK);
    for (int k = 0; k < dk; k++) m0.q[k] = 0;
    const int right0 = predicted_right(&m0, s + ntrain, ntest);
    cr_assert_lt(right0, right - ntest / 5, "mean pooling %d, learned query %d", right0, right);
    for (int i = 0; i < 2 * (ntrain + ntest); i++) free(mem[i]);
    free(mem), free(s);
    mpq_pmpd_learned_free(&n), mpq_pmpd_learned_free(&m0);
}

Test(pmpd, learned_class_schedules_are_the_static_candidates)
{
    mpq_pmpd_learned n;
    cr_assert_eq(mpq_pmpd_learned_init(&n, 2, 2, 2, 5, 1), MPQ_OK);
    n.prefill_skip = 0, n.skip_high = 1, n.skip_low = 3, n.length = 130;
    const long want[5] = {0, 33, 65, 98, 130}; /* round(c * 130 / 4): 32.5 and 97.5 round up */
    const double bits[4] = {5.25, 4.25, 3.25, 2.25};
    for (int c = 0; c < 5; c++) {
        mpq_pmpd_schedule s;
        cr_assert_eq(mpq_pmpd_learned_class_schedule(&n, c, &s), MPQ_OK);
        cr_assert_eq(s.prefill_skip, 0);
        cr_assert_eq(s.nlevels, 2);
        cr_assert_eq(s.skip[0], 1);
        cr_assert_eq(s.skip[1], 3);
        cr_assert_eq(s.start[1], want[c]);
        double avg;
        cr_assert_eq(mpq_pmpd_average_bits(&s, bits, 130, &avg), MPQ_OK);
        cr_assert_float_eq(avg, (want[c] * 4.25 + (130 - want[c]) * 2.25) / 130, 1e-12);
    }
    mpq_pmpd_schedule s;
    cr_assert_eq(mpq_pmpd_learned_class_schedule(&n, 5, &s), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_pmpd_learned_class_schedule(&n, -1, &s), MPQ_ERR_RANGE);
    mpq_pmpd_learned_free(&n);
}

Test(pmpd, learned_errors_change_nothing)
{
    mpq_pmpd_learned n;
    cr_assert_eq(mpq_pmpd_learned_init(&n, 0, 4, 4, 3, 1), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_pmpd_learned_init(&n, 4, 4, 4, 1, 1), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_pmpd_learned_init(&n, 4, 4, 4, MPQ_PMPD_MAX_CLASSES + 1, 1), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_pmpd_learned_init(NULL, 4, 4, 4, 3, 1), MPQ_ERR_ARG);
    cr_assert_eq(mpq_pmpd_learned_init(&n, 4, 3, 5, 3, 9), MPQ_OK);
    double p[3];
    float K[8] = {0}, V[6] = {0};
    cr_assert_eq(mpq_pmpd_learned_forward(&n, K, V, 2, p), MPQ_ERR_RANGE); /* the schedule fields unset */
    n.skip_high = 1, n.skip_low = 2, n.length = 10;
    cr_assert_eq(mpq_pmpd_learned_forward(&n, K, V, 2, p), MPQ_OK);
    for (int c = 0; c < 3; c++) cr_assert_float_eq(p[c], 1.0 / 3, 1e-12); /* zero inputs, zero biases */
    cr_assert_eq(mpq_pmpd_learned_forward(&n, K, V, 0, p), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_pmpd_learned_forward(&n, NULL, V, 2, p), MPQ_ERR_ARG);
    K[5] = NAN;
    cr_assert_eq(mpq_pmpd_learned_forward(&n, K, V, 2, p), MPQ_ERR_NONFINITE);
    K[5] = 0, V[4] = INFINITY;
    cr_assert_eq(mpq_pmpd_learned_forward(&n, K, V, 2, p), MPQ_ERR_NONFINITE);
    V[4] = 1;
    n.skip_low = 1; /* not lower than skip_high */
    cr_assert_eq(mpq_pmpd_learned_validate(&n), MPQ_ERR_RANGE);
    n.skip_low = MPQ_MAX_BITS;
    cr_assert_eq(mpq_pmpd_learned_validate(&n), MPQ_ERR_RANGE);
    n.skip_low = 2, n.length = 0;
    cr_assert_eq(mpq_pmpd_learned_validate(&n), MPQ_ERR_RANGE);
    n.length = 10, n.inv_sd[1] = 0;
    cr_assert_eq(mpq_pmpd_learned_validate(&n), MPQ_ERR_NONFINITE);
    n.inv_sd[1] = 1, n.w2[3] = NAN;
    cr_assert_eq(mpq_pmpd_learned_validate(&n), MPQ_ERR_NONFINITE);
    n.w2[3] = 0.5f;
    cr_assert_eq(mpq_pmpd_learned_validate(&n), MPQ_OK);
    /* bad samples or options: an error, and the network as it was */
    const size_t bytes = sizeof(float) * (size_t)(mpq_pmpd_learned_params(&n) + 2 * 3);
    float *keep = (float *)malloc(bytes);
    memcpy(keep, n.mem, bytes);
    float K2[8] = {1, 2, 3, 4, 5, 6, 7, 8}, V2[6] = {1, -1, 2, 0.5f, 3, 1};
    mpq_pmpd_sample s[2] = {{K2, V2, 2, 1}, {K2, V2, 2, 3}};
    mpq_pmpd_train_opts o = {5, 0.01, 0};
    double loss = -1;
    cr_assert_eq(mpq_pmpd_learned_train(&n, s, 2, &o, &loss), MPQ_ERR_RANGE); /* label 3 of 3 classes */
    s[1].label = 2, s[1].T = 0;
    cr_assert_eq(mpq_pmpd_learned_train(&n, s, 2, &o, &loss), MPQ_ERR_SIZE);
    s[1].T = 2;
    cr_assert_eq(mpq_pmpd_learned_train(&n, s, 0, &o, &loss), MPQ_ERR_SIZE);
    o.l2 = -1;
    cr_assert_eq(mpq_pmpd_learned_train(&n, s, 2, &o, &loss), MPQ_ERR_RANGE);
    o.l2 = 0, o.lr = NAN;
    cr_assert_eq(mpq_pmpd_learned_train(&n, s, 2, &o, &loss), MPQ_ERR_RANGE);
    o.lr = 0.01;
    V2[3] = NAN;
    cr_assert_eq(mpq_pmpd_learned_train(&n, s, 2, &o, &loss), MPQ_ERR_NONFINITE);
    cr_assert_eq(mpq_pmpd_learned_loss(&n, s, 2, 0, &loss, NULL), MPQ_ERR_NONFINITE);
    cr_assert_eq(loss, -1);
    cr_assert(memcmp(keep, n.mem, bytes) == 0);
    V2[3] = 0.5f;
    cr_assert_eq(mpq_pmpd_learned_train(&n, s, 2, &o, &loss), MPQ_OK);
    cr_assert(memcmp(keep, n.mem, bytes) != 0);
    free(keep);
    mpq_pmpd_learned_free(&n);
    mpq_pmpd_learned_free(NULL);
}
