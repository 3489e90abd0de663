/* Section 2: fp16 conversion, against an independent definition-based
   reference, and software against hardware (F16C) bit for bit. */
#include "common.h"

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Reference float -> half: nearest half by binary search over the ordered
   positive halves, ties to the even code, in double arithmetic. NaN is
   checked separately. */
static uint16_t ref_to_half(float f)
{
    uint16_t sign = (fbits(f) >> 31) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (isinf(a) || a >= 65520.0) return sign | 0x7C00;
    int lo = 0, hi = 0x7BFF; /* largest h with value(h) <= a */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tc_half((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo == 0x7BFF) return sign | 0x7BFF; /* 65504 <= a < 65520 */
    double d0 = a - tc_half((uint16_t)lo), d1 = tc_half((uint16_t)(lo + 1)) - a;
    int h = d0 < d1 ? lo : (d1 < d0 ? lo + 1 : ((lo & 1) ? lo + 1 : lo));
    return sign | (uint16_t)h;
}

Test(half, every_half_to_float_matches_the_definition)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mpq_f16_to_f32_soft((uint16_t)h);
        double r = tc_half((uint16_t)h);
        if (isnan(r)) {
            cr_assert(isnan(f), "h=%04x", h);
            cr_assert_eq(fbits(f), ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13), "NaN payload h=%04x", h);
        } else {
            cr_assert_eq((double)f, r, "h=%04x", h);
            cr_assert_eq(fbits(f) >> 31, h >> 15, "sign h=%04x", h);
        }
    }
}

Test(half, hardware_and_software_agree_on_every_half)
{
    uint16_t hs[65536];
    float out[65536];
    for (uint32_t h = 0; h < 65536; h++) hs[h] = (uint16_t)h;
    mpq_f16_to_f32_n(hs, out, 65536);
    for (uint32_t h = 0; h < 65536; h++) {
        cr_assert_eq(fbits(mpq_f16_to_f32((uint16_t)h)), fbits(mpq_f16_to_f32_soft((uint16_t)h)), "h=%04x", h);
        cr_assert_eq(fbits(out[h]), fbits(mpq_f16_to_f32_soft((uint16_t)h)), "array h=%04x", h);
    }
}

static void check_to_half(float f)
{
    uint16_t s = mpq_f32_to_f16_soft(f), hw = mpq_f32_to_f16(f), arr;
    mpq_f32_to_f16_n(&f, &arr, 1);
    cr_assert_eq(s, hw, "soft %04x hw %04x for %a", s, hw, (double)f);
    cr_assert_eq(s, arr, "soft %04x array %04x for %a", s, arr, (double)f);
    if (isnan(f)) {
        cr_assert_eq(s & 0x7E00, 0x7E00, "quiet NaN for %08x", fbits(f));
        cr_assert_eq(s >> 15, fbits(f) >> 31);
        cr_assert_eq(s & 0x1FF, (fbits(f) >> 13) & 0x1FF, "NaN payload for %08x", fbits(f));
    } else
        cr_assert_eq(s, ref_to_half(f), "soft %04x ref %04x for %a", s, ref_to_half(f), (double)f);
}

Test(half, float_to_half_edge_cases)
{
    const float edge[] = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          65536.0f,
                          INFINITY,
                          -INFINITY,
                          5.9604645e-8f /* 2^-24 */,
                          2.9802322e-8f /* 2^-25: tie -> 0 */,
                          2.9802326e-8f,
                          8.940697e-8f /* 1.5 * 2^-24: tie -> 2^-23 */,
                          6.1035156e-5f /* 2^-14 */,
                          6.1004636e-5f,
                          1.17549435e-38f,
                          3.4028235e38f,
                          1e-45f,
                          0.1f,
                          1.0009765625f /* 1 + 2^-10 */,
                          1.00048828125f /* 1 + 2^-11: tie to even -> 1 */,
                          1.00146484375f /* tie -> 1 + 2^-9 */};
    for (size_t k = 0; k < sizeof edge / sizeof edge[0]; k++) check_to_half(edge[k]);
    cr_assert_eq(mpq_f32_to_f16_soft(2.9802322e-8f), 0);
    cr_assert_eq(mpq_f32_to_f16_soft(8.940697e-8f), 2);
    cr_assert_eq(mpq_f32_to_f16_soft(1.00048828125f), 0x3C00);
    cr_assert_eq(mpq_f32_to_f16_soft(1.00146484375f), 0x3C02);
    cr_assert_eq(mpq_f32_to_f16_soft(65520.0f), 0x7C00);
    cr_assert_eq(mpq_f32_to_f16_soft(65519.99f), 0x7BFF);
    const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0xFF812345u};
    for (size_t k = 0; k < sizeof nans / sizeof nans[0]; k++) check_to_half(bitsf(nans[k]));
}

Test(half, every_half_value_its_midpoints_and_neighbours_round_correctly)
{
    for (uint32_t h = 0; h < 0x7C00; h++) {
        for (int s = 0; s < 2; s++) {
            float v = (float)tc_half((uint16_t)h) * (s ? -1.0f : 1.0f);
            check_to_half(v); /* exact halves come back unchanged */
            cr_assert_eq(mpq_f32_to_f16_soft(v), (uint16_t)(h | (s ? 0x8000u : 0u)));
            if (h < 0x7BFF) { /* the exact midpoint to the next half, and a float either side */
                float mid = (float)((tc_half((uint16_t)h) + tc_half((uint16_t)(h + 1))) / 2) * (s ? -1.0f : 1.0f);
                check_to_half(mid);
                check_to_half(nextafterf(mid, 0.0f));
                check_to_half(nextafterf(mid, s ? -INFINITY : INFINITY));
            }
        }
    }
}

Test(half, random_floats_round_correctly)
{
    synth_rng r = {7};
    for (int k = 0; k < 300000; k++) {
        uint32_t u = (uint32_t)synth_u64(&r);
        if (k % 2) u = (u & 0x807FFFFFu) | ((uint32_t)(100 + synth_int(&r, 50)) << 23); /* the half range */
        check_to_half(bitsf(u));
    }
}

Test(half, array_conversion_handles_every_length)
{
    float src[37], back[37];
    uint16_t h[37];
    for (int n = 0; n <= 37; n++) {
        for (int k = 0; k < n; k++) src[k] = (float)(k * 3 - 50) / 7.0f;
        mpq_f32_to_f16_n(src, h, (size_t)n);
        mpq_f16_to_f32_n(h, back, (size_t)n);
        for (int k = 0; k < n; k++) {
            cr_assert_eq(h[k], mpq_f32_to_f16_soft(src[k]));
            cr_assert_eq(fbits(back[k]), fbits(mpq_f16_to_f32_soft(h[k])));
        }
    }
}
