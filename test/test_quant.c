/* Section 3: group quantization, 8-bit activations, the mirror form, nested
   precision, the lookup tables and SFMP's worked example. */
#include "common.h"

static double w_hat(int q, int b, double sh, double zh) { return sh * (2.0 * q - (ldexp(1.0, b) - 1)) + zh; }

/* Checks one quantized group against the rules, in float64. */
static void check_group(const float *v, int len, int b, int sym, const uint8_t *q, uint16_t hs, uint16_t hz)
{
    const int qmax = (1 << b) - 1;
    double mn = v[0], mx = v[0], amax = 0;
    for (int k = 0; k < len; k++) {
        mn = v[k] < mn ? v[k] : mn;
        mx = v[k] > mx ? v[k] : mx;
        amax = fabs(v[k]) > amax ? fabs(v[k]) : amax;
    }
    double s = sym ? 2 * amax / qmax : (mx - mn) / qmax, sh = tc_half(hs), zh = tc_half(hz);
    if (mn == mx) { /* constant group, symmetric or not: exact, no division */
        cr_assert_eq(sh, 0.0);
        cr_assert_eq(zh, tc_half(mpq_f32_to_f16_soft((float)mn)), "constant group keeps its value");
        return;
    }
    /* fp16 rounding: relative 2^-11, or absolute 2^-25 in the subnormal range */
    cr_assert_leq(fabs(2 * sh - s), fmax(s * ldexp(1.0, -10), ldexp(1.0, -24)), "s^ = fp16(s/2): %g vs %g", 2 * sh, s);
    if (sym)
        cr_assert_eq(zh, -sh, "symmetric: z^ = -s^");
    else {
        double z = floor(-mn / s + 0.5);
        z = z < 0 ? 0 : (z > qmax ? qmax : z);
        double zref = s * (qmax / 2.0 - z);
        cr_assert_leq(fabs(zh - zref), fmax(fabs(zref) * ldexp(1.0, -10), ldexp(1.0, -24)) + s * 1e-6, "z^ %g vs %g",
                      zh, zref);
    }
    const double lo = w_hat(0, b, sh, zh) - sh, hi = w_hat(qmax, b, sh, zh) + sh;
    for (int k = 0; k < len; k++) {
        cr_assert_leq(q[k], qmax);
        double e = fabs(v[k] - w_hat(q[k], b, sh, zh));
        if (v[k] >= lo && v[k] <= hi)
            cr_assert_leq(e, sh * (1 + 1e-6), "unclipped error %g > s/2 = %g (b=%d sym=%d)", e, sh, b, sym);
        else
            cr_assert(q[k] == 0 || q[k] == qmax, "clipped values take an end code");
        /* and no other code is nearer */
        if (q[k] > 0) cr_assert_leq(e, fabs(v[k] - w_hat(q[k] - 1, b, sh, zh)) + 1e-6 * sh);
        if (q[k] < qmax) cr_assert_leq(e, fabs(v[k] - w_hat(q[k] + 1, b, sh, zh)) + 1e-6 * sh);
    }
}

Test(quant, error_within_half_a_step_for_every_width_and_length)
{
    synth_rng r = {11};
    const int lens[] = {1, 2, 7, 8, 24, 128, 200};
    float v[200];
    uint8_t q[200];
    for (int b = 1; b <= 8; b++)
        for (int sym = 0; sym < 2; sym++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int rep = 0; rep < 20; rep++) {
                    int len = lens[li];
                    float scale = rep % 3 == 0 ? 1e-3f : (rep % 3 == 1 ? 0.02f : 30.0f);
                    for (int k = 0; k < len; k++) v[k] = scale * synth_student4(&r) + (rep % 4 == 0 ? scale : 0.0f);
                    uint16_t hs = 0, hz = 0;
                    cr_assert_eq(mpq_quantize_group(v, len, b, sym, q, &hs, &hz), MPQ_OK);
                    check_group(v, len, b, sym, q, hs, hz);
                }
}

Test(quant, constant_groups_do_not_divide_by_zero)
{
    float v[16];
    uint8_t q[16];
    uint16_t hs = 0, hz = 0;
    for (int b = 1; b <= 8; b++)
        for (int sym = 0; sym < 2; sym++) {
            for (int k = 0; k < 16; k++) v[k] = 0.5f;
            cr_assert_eq(mpq_quantize_group(v, 16, b, sym, q, &hs, &hz), MPQ_OK);
            for (int k = 0; k < 16; k++) cr_assert_eq(mpq_dequant_value(q[k], b, 0, tc_half(hs), tc_half(hz)), 0.5f);
            for (int k = 0; k < 16; k++) v[k] = 0.0f;
            cr_assert_eq(mpq_quantize_group(v, 16, b, sym, q, &hs, &hz), MPQ_OK);
            for (int k = 0; k < 16; k++) cr_assert_eq(mpq_dequant_value(q[k], b, 0, tc_half(hs), tc_half(hz)), 0.0f);
        }
    for (int k = 0; k < 16; k++) v[k] = 0.1f; /* not an fp16 value: the nearest one */
    cr_assert_eq(mpq_quantize_group(v, 16, 4, 0, q, &hs, &hz), MPQ_OK);
    cr_assert_eq(mpq_dequant_value(q[0], 4, 0, tc_half(hs), tc_half(hz)), (float)tc_half(mpq_f32_to_f16_soft(0.1f)));
}

Test(quant, bad_input_is_an_error_and_writes_nothing)
{
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t q[8];
    uint16_t hs = 0xBEEF, hz = 0xBEEF;
    memset(q, 0xAB, 8);
    v[3] = NAN;
    cr_assert_eq(mpq_quantize_group(v, 8, 4, 0, q, &hs, &hz), MPQ_ERR_NONFINITE);
    v[3] = INFINITY;
    cr_assert_eq(mpq_quantize_group(v, 8, 4, 0, q, &hs, &hz), MPQ_ERR_NONFINITE);
    v[3] = 70000.0f;
    cr_assert_eq(mpq_quantize_group(v, 8, 4, 0, q, &hs, &hz), MPQ_ERR_RANGE);
    v[3] = 4;
    cr_assert_eq(mpq_quantize_group(v, 8, 0, 0, q, &hs, &hz), MPQ_ERR_BITS);
    cr_assert_eq(mpq_quantize_group(v, 8, 9, 0, q, &hs, &hz), MPQ_ERR_BITS);
    cr_assert_eq(mpq_quantize_group(v, 0, 4, 0, q, &hs, &hz), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_quantize_group(NULL, 8, 4, 0, q, &hs, &hz), MPQ_ERR_ARG);
    cr_assert_eq(mpq_quantize_group(v, 8, 4, 0, q, NULL, &hz), MPQ_ERR_ARG);
    for (int k = 0; k < 8; k++) cr_assert_eq(q[k], 0xAB);
    cr_assert_eq(hs, 0xBEEF);
    cr_assert_eq(hz, 0xBEEF);
}

Test(quant, whole_matrix_follows_the_bits_map_and_symmetric_mask)
{
    synth_rng r = {12};
    const int m = 37, n = 77, G = 24, br = 5, ng = (n + G - 1) / G, nbr = (m + br - 1) / br;
    float *W = malloc(sizeof(float) * m * n), *Wd = malloc(sizeof(float) * m * n);
    uint8_t *codes = malloc((size_t)m * n), bits[8 * 4], q[24];
    uint16_t *sh = malloc(2u * m * ng), *zh = malloc(2u * m * ng);
    synth_weights(&r, W, m, n);
    for (int k = 0; k < nbr * ng; k++) bits[k] = (uint8_t)(1 + synth_int(&r, 8));
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = G, d.block_rows = br, d.bits = bits, d.symmetric = 1u << 8 | 1u << 3;
    cr_assert_eq(mpq_quantize(&d, W, codes, sh, zh), MPQ_OK);
    cr_assert_eq(mpq_dequantize(&d, codes, sh, zh, Wd), MPQ_OK);
    for (int i = 0; i < m; i++)
        for (int g = 0; g < ng; g++) {
            int b = bits[(i / br) * ng + g], gw = n - g * G < G ? n - g * G : G;
            uint16_t hs = 0, hz = 0;
            mpq_quantize_group(W + i * n + g * G, gw, b, b == 8 || b == 3, q, &hs, &hz);
            cr_assert_eq(hs, sh[i * ng + g]);
            cr_assert_eq(hz, zh[i * ng + g]);
            if (b == 8 || b == 3) cr_assert_eq(tc_half(hz), -tc_half(hs));
            for (int j = 0; j < gw; j++) {
                cr_assert_eq(codes[i * n + g * G + j], q[j]);
                cr_assert_eq(Wd[i * n + g * G + j], (float)w_hat(q[j], b, tc_half(hs), tc_half(hz)));
            }
            check_group(W + i * n + g * G, gw, b, b == 8 || b == 3, q, hs, hz);
        }
    /* bad widths, NaN weights, bad codes: errors, nothing written */
    memset(codes, 0x77, (size_t)m * n);
    bits[3] = 9;
    cr_assert_eq(mpq_quantize(&d, W, codes, sh, zh), MPQ_ERR_BITS);
    bits[3] = 0;
    cr_assert_eq(mpq_quantize(&d, W, codes, sh, zh), MPQ_ERR_BITS);
    bits[3] = 2;
    W[m * n - 1] = NAN;
    cr_assert_eq(mpq_quantize(&d, W, codes, sh, zh), MPQ_ERR_NONFINITE);
    for (int k = 0; k < m * n; k++) cr_assert_eq(codes[k], 0x77);
    d.group = 12;
    cr_assert_eq(mpq_quantize(&d, W, codes, sh, zh), MPQ_ERR_SIZE);
    free(W), free(Wd), free(codes), free(sh), free(zh);
}

Test(quant, sfmp_appendix_b_worked_example)
{
    /* SFMP appendix B: 9, 7, 6, 3 = 1001, 0111, 0110, 0011; the lowest bit
       plane is (1, 1, 0, 1) and the highest (1, 0, 0, 0). */
    uint8_t codes[8] = {9, 7, 6, 3, 0, 0, 0, 0};
    uint16_t sh = mpq_f32_to_f16(0.5f), zh = 0;
    mpq_bitplane_desc d = {0};
    d.rows = 1, d.cols = 8, d.group = 8, d.uniform_bits = 4;
    size_t bytes = 0;
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_OK);
    uint8_t *buf = tc_alloc(bytes);
    mpq_packed A;
    cr_assert_eq(mpq_pack_quantized(&d, codes, &sh, &zh, buf, bytes, &A), MPQ_OK);
    /* one record: 64 bytes of pairs, then 4 planes of one 16-byte segment
       (row 0 at byte 0); bit k of the byte is column k */
    const uint8_t *rec = A.data;
    uint8_t lowest = rec[64 + 0 * 16], highest = rec[64 + 3 * 16];
    cr_assert_eq(lowest & 0xF, 0x1 | 0x2 | 0x8, "lowest plane (1,1,0,1)");
    cr_assert_eq(highest & 0xF, 0x1, "highest plane (1,0,0,0)");
    cr_assert_eq(rec[64 + 1 * 16] & 0xF, 0x2 | 0x4 | 0x8, "bit 1: (0,1,1,1)");
    cr_assert_eq(rec[64 + 2 * 16] & 0xF, 0x2 | 0x4, "bit 2: (0,1,1,0)");
    mpq_aligned_free(buf);
}

Test(quant, mirror_form_equals_the_awq_form)
{
    /* SFMP eq. 16 -> 17: s (q - z) = s^ sum_i 2^i sigma_i + z^ with s^ = s/2,
       z^ = s ((2^b - 1)/2 - z). Exact in float64 for these values. */
    synth_rng r = {13};
    for (int b = 1; b <= 8; b++)
        for (int k = 0; k < 200; k++) {
            double s = ldexp(1.0 + synth_int(&r, 1024) / 1024.0, -synth_int(&r, 10));
            int z = synth_int(&r, 1 << b), q = synth_int(&r, 1 << b);
            double sum = 0;
            for (int i = 0; i < b; i++) sum += ldexp(1.0, i) * (((q >> i) & 1) ? 1 : -1);
            cr_assert_eq(s / 2 * sum + s * ((ldexp(1.0, b) - 1) / 2 - z), s * (q - z));
        }
}

Test(quant, skipping_planes_gives_the_midpoint_of_the_coarser_bucket)
{
    const float sh = 0.25f, zh = 0.5f; /* exact arithmetic below */
    for (int b = 1; b <= 8; b++)
        for (int skip = 0; skip < b; skip++)
            for (int q = 0; q < (1 << b); q++) {
                double mean = 0;
                int base = q >> skip << skip;
                for (int k = 0; k < (1 << skip); k++) mean += w_hat(base + k, b, sh, zh);
                mean /= 1 << skip;
                cr_assert_eq((double)mpq_dequant_value((uint8_t)q, b, skip, sh, zh), mean, "b=%d skip=%d q=%d", b, skip,
                             q);
            }
    /* at least one plane always remains */
    cr_assert_eq(mpq_dequant_value(5, 3, 7, sh, zh), mpq_dequant_value(5, 3, 2, sh, zh));
}

Test(quant, lookup_tables_and_the_mirror_identity)
{
    synth_rng r = {14};
    for (int rep = 0; rep < 500; rep++) {
        float x8[8], T[128], L[16], H[16];
        synth_activations(&r, x8, 8);
        mpq_lut128(x8, T);
        mpq_lut16(x8, L);
        mpq_lut16(x8 + 4, H);
        double sa = 0;
        for (int k = 0; k < 8; k++) sa += fabs(x8[k]);
        for (int p = 0; p < 256; p++) {
            double ref = 0;
            for (int k = 0; k < 8; k++) ref += ((p >> k) & 1) ? x8[k] : -x8[k];
            float v = mpq_lut128_get(T, (uint8_t)p);
            cr_assert_eq(mpq_lut128_get(T, (uint8_t)(p ^ 0xFF)), -v, "T[p ^ 0xFF] = -T[p]");
            cr_assert_eq(v, L[p & 15] + H[p >> 4], "T = L + H");
            cr_assert_leq(fabs(v - ref), 8 * FLT_EPSILON * sa);
        }
        for (int p = 0; p < 16; p++) cr_assert_eq(L[p ^ 15], -L[p]);
    }
}

/* ---- 8-bit activations (MixLLM) ---- */

/* One vector against the rules, in float64: s^ is amax / 127 rounded to
   fp16 (zero below fp16's range), q = clamp(rne(x / s^), +-127). */
static void check_act8(const float *x, int n, int group, const int8_t *q, const uint16_t *scale)
{
    for (int g0 = 0, g = 0; g0 < n; g0 += group, g++) {
        const int len = n - g0 < group ? n - g0 : group;
        double amax = 0;
        for (int k = 0; k < len; k++) amax = fmax(amax, fabs(x[g0 + k]));
        const double s = amax / 127, sh = tc_half(scale[g]);
        cr_assert_leq(fabs(sh - s), fmax(s * ldexp(1.0, -11), ldexp(1.0, -25)), "group %d: s^ %g, amax/127 %g", g, sh,
                      s);
        cr_assert(sh > 0 || s <= ldexp(1.0, -25), "group %d: s^ = 0 for amax/127 = %g", g, s);
        for (int k = 0; k < len; k++) {
            if (sh == 0) {
                cr_assert_eq(q[g0 + k], 0);
                continue;
            }
            const double t = x[g0 + k] / sh, f = floor(t);
            double r = t - f == 0.5 ? (fmod(f, 2) == 0 ? f : f + 1) : floor(t + 0.5);
            r = r > 127 ? 127 : (r < -127 ? -127 : r);
            /* within float rounding of a tie either neighbour is right */
            if (fabs(fabs(t - f) - 0.5) < 1e-5)
                cr_assert_leq(fabs(q[g0 + k] - r), 1.0);
            else
                cr_assert_eq(q[g0 + k], (int)r, "x %g, s^ %g: q %d, reference %g", x[g0 + k], sh, q[g0 + k], r);
            /* the error: half a step, or the clamp of the largest values when fp16 rounded s^ down */
            const double e = fabs(x[g0 + k] - q[g0 + k] * sh);
            cr_assert_leq(e, fmax(0.5 * sh * (1 + 1e-5), amax - 127 * sh + 1e-12 * amax));
        }
    }
}

Test(quant, act8_groups_against_float64)
{
    synth_rng r = {77};
    static const int lens[] = {1, 7, 127, 128, 129, 1000, 4099};
    static const int groups[] = {128, 32, 100, 1, 4096};
    for (size_t a = 0; a < sizeof lens / sizeof *lens; a++)
        for (size_t b = 0; b < sizeof groups / sizeof *groups; b++) {
            const int n = lens[a], group = groups[b], ng = (n + group - 1) / group;
            float *x = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
            int8_t *q = malloc((size_t)n);
            uint16_t *sc = malloc(sizeof(uint16_t) * ng);
            synth_activations(&r, x, n); /* a few channels 10..50x the rest */
            if (n > 3) x[1] = 0.0f, x[2] = -x[0];
            cr_assert_eq(mpq_quantize_act8(x, n, group, q, sc), MPQ_OK);
            check_act8(x, n, group, q, sc);
            cr_assert_eq(mpq_dequantize_act8(q, sc, n, group, back), MPQ_OK);
            for (int k = 0; k < n; k++) cr_assert_eq(back[k], (float)(q[k] * tc_half(sc[k / group])));
            free(x), free(back), free(q), free(sc);
        }
}

Test(quant, act8_edges)
{
    /* a group of zeros and one below fp16's range: s^ = 0, q = 0; a group
       whose amax is exactly 127 steps: q = +-127 at the ends, s^ = 1 */
    float x[3 * 8] = {0};
    for (int k = 8; k < 16; k++) x[k] = 1e-9f * (float)(k - 11);
    for (int k = 16; k < 24; k++) x[k] = (float)(k - 20) * 127.0f / 4.0f;
    int8_t q[24];
    uint16_t sc[3];
    cr_assert_eq(mpq_quantize_act8(x, 24, 8, q, sc), MPQ_OK);
    cr_assert_eq(sc[0], 0);
    cr_assert_eq(sc[1], 0);
    cr_assert_eq(tc_half(sc[2]), 1.0);
    for (int k = 0; k < 16; k++) cr_assert_eq(q[k], 0);
    cr_assert_eq(q[16], -127);
    cr_assert_eq(q[18], -64); /* -63.5: to even */
    cr_assert_eq(q[22], 64);  /* 63.5: to even */
    check_act8(x, 24, 8, q, sc);
    /* the largest activations whose scale fp16 holds, and one beyond */
    float big[2] = {65504.0f * 127.0f, 1.0f};
    cr_assert_eq(mpq_quantize_act8(big, 2, 2, q, sc), MPQ_OK);
    cr_assert_eq(q[0], 127);
    cr_assert_eq(tc_half(sc[0]), 65504.0);
    /* bad input: nothing written */
    int8_t q0[4] = {9, 9, 9, 9};
    uint16_t s0[2] = {7, 7};
    float bad[4] = {1, 2, NAN, 4};
    cr_assert_eq(mpq_quantize_act8(bad, 4, 2, q0, s0), MPQ_ERR_NONFINITE);
    bad[2] = INFINITY;
    cr_assert_eq(mpq_quantize_act8(bad, 4, 2, q0, s0), MPQ_ERR_NONFINITE);
    bad[2] = 1e7f * 127.0f;
    cr_assert_eq(mpq_quantize_act8(bad, 4, 2, q0, s0), MPQ_ERR_RANGE);
    for (int k = 0; k < 4; k++) cr_assert_eq(q0[k], 9);
    cr_assert(s0[0] == 7 && s0[1] == 7);
    bad[2] = 3;
    cr_assert_eq(mpq_quantize_act8(bad, 0, 2, q0, s0), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_quantize_act8(bad, 4, 0, q0, s0), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_quantize_act8(NULL, 4, 2, q0, s0), MPQ_ERR_ARG);
    cr_assert_eq(mpq_quantize_act8(bad, 4, 2, q0, NULL), MPQ_ERR_ARG);
    s0[1] = 0x7C00; /* an infinite scale */
    float out[4];
    cr_assert_eq(mpq_dequantize_act8(q0, s0, 4, 2, out), MPQ_ERR_NONFINITE);
    cr_assert_eq(mpq_dequantize_act8(q0, s0, 0, 2, out), MPQ_ERR_SIZE);
}

/* The rounding every quantizer uses (mpq__rne) against a float64 rule
   written the plain way: ties (k + 1/2) go to the even neighbour. Every
   half-integer and its two float neighbours up to 2^12, both signs, the
   boundary near 2^23 and 2^24, and random floats of every exponent. */
static double rne_ref(double x)
{
    const double f = floor(x), d = x - f;
    if (d > 0.5) return f + 1;
    if (d < 0.5) return f;
    return fmod(f, 2.0) == 0 ? f : f + 1;
}

static void check_rne(float x)
{
    const float r = mpq__rne(x);
    cr_assert(r == (float)rne_ref(x), "mpq__rne(%.9g) = %.9g, not %.9g", (double)x, (double)r, rne_ref(x));
}

Test(quant, rne_rounds_ties_to_even)
{
    for (int k = -8192; k <= 8192; k++) {
        const float h = (float)k + 0.5f;
        check_rne(h), check_rne(nextafterf(h, -INFINITY)), check_rne(nextafterf(h, INFINITY)), check_rne((float)k);
    }
    const float big[] = {8388607.5f, 8388608.0f, 8388609.0f, 16777215.0f, 16777216.0f, 4194303.5f, 4194304.5f};
    for (size_t k = 0; k < sizeof big / sizeof big[0]; k++) check_rne(big[k]), check_rne(-big[k]);
    synth_rng r = {20261126};
    for (int k = 0; k < 200000; k++) {
        const float x = ldexpf((float)synth_unif(&r) - 0.5f, synth_int(&r, 60) - 30);
        check_rne(x);
    }
}
