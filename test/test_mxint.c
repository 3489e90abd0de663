/* MXINT: element rules (OCP MX v1.0 for MXINT8, extended to k = 2..8 bits)
   from hand-derived vectors and an independent float64 reading of the
   rules, the packed MXINT matrix, and the GEMV on every path. */
#include "common.h"

static void quant8(const float *v, int len, int8_t *m, uint8_t *e)
{
    cr_assert_eq(mpq_mxint_quantize_block(v, len, 8, m, e), MPQ_OK);
}

Test(mxint, mxint8_by_hand)
{
    int8_t m[32];
    uint8_t e;
    /* max 1.0: X = 0, elements are v * 64; 2^-7 * 64 = 0.5 ties to 0,
       3 * 2^-7 * 64 = 1.5 ties to 2 */
    const float a[] = {1.0f, 0.5f, 0x1p-6f, 0x1p-7f, 3 * 0x1p-7f, -1.0f, 0.0f, -0x1p-6f};
    quant8(a, 8, m, &e);
    cr_assert_eq(e, 127);
    const int8_t ma[] = {64, 32, 1, 0, 2, -64, 0, -1};
    for (int i = 0; i < 8; i++) cr_assert_eq(m[i], ma[i], "a[%d]", i);
    cr_assert_eq(mpq_mxint_value(m[0], 8, e), 1.0);
    /* values that round past the largest element saturate: 1.999 * 64 =
       127.94 -> 127; -127.94 -> -128 is representable */
    const float b[] = {1.999f, -1.999f, 1.0f};
    quant8(b, 3, m, &e);
    cr_assert_eq(e, 127);
    cr_assert_eq(m[0], 127);
    cr_assert_eq(m[1], -128);
    cr_assert_eq(mpq_mxint_value(m[0], 8, e), 127.0 / 64);
    /* powers of two: max 4 -> X = 2 (byte 129), elements v / 4 * 64 */
    const float c[] = {4.0f, 2.0f, 1.0f, 0.25f, -3.0f};
    quant8(c, 5, m, &e);
    cr_assert_eq(e, 129);
    const int8_t mc[] = {64, 32, 16, 4, -48};
    for (int i = 0; i < 5; i++) cr_assert_eq(m[i], mc[i], "c[%d]", i);
    /* subnormal range: max 1e-39 has floor(log2) = -130, X clamps to -127;
       elements v * 2^133: 10.89 -> 11, -5.44 -> -5; 2^-127 -> 64 */
    const float d[] = {1e-39f, -5e-40f, 0x1p-127f};
    quant8(d, 3, m, &e);
    cr_assert_eq(e, 0);
    cr_assert_eq(m[0], 11);
    cr_assert_eq(m[1], -5);
    cr_assert_eq(m[2], 64);
    /* the top of the range: 3e38 has X = 127 (byte 254): 3e38 / 2^127 * 64 = 112.8 -> 113 */
    const float f[] = {3e38f, -1e38f};
    quant8(f, 2, m, &e);
    cr_assert_eq(e, 254);
    cr_assert_eq(m[0], 113);
    cr_assert_eq(m[1], -38); /* -37.6 */
    /* an all-zero block: X = -127, every element 0 */
    float z[32] = {0};
    quant8(z, 32, m, &e);
    cr_assert_eq(e, 0);
    for (int i = 0; i < 32; i++) cr_assert_eq(m[i], 0);
    /* k = 4: max 1.0 -> elements v * 4 in [-8, 7]; 1.9 * 4 = 7.6 -> 7 */
    const float g4[] = {1.0f, 1.9f, -1.9f, 0.3f};
    cr_assert_eq(mpq_mxint_quantize_block(g4, 4, 4, m, &e), MPQ_OK);
    cr_assert_eq(e, 127);
    cr_assert_eq(m[0], 4);
    cr_assert_eq(m[1], 7);
    cr_assert_eq(m[2], -8);
    cr_assert_eq(m[3], 1);
}

Test(mxint, bad_blocks_are_errors)
{
    int8_t m[33];
    uint8_t e = 0x55;
    float v[33] = {1.0f};
    memset(m, 0x11, sizeof m);
    v[5] = NAN;
    cr_assert_eq(mpq_mxint_quantize_block(v, 8, 8, m, &e), MPQ_ERR_NONFINITE);
    v[5] = INFINITY;
    cr_assert_eq(mpq_mxint_quantize_block(v, 8, 8, m, &e), MPQ_ERR_NONFINITE);
    v[5] = 0;
    cr_assert_eq(mpq_mxint_quantize_block(v, 8, 1, m, &e), MPQ_ERR_BITS);
    cr_assert_eq(mpq_mxint_quantize_block(v, 8, 9, m, &e), MPQ_ERR_BITS);
    cr_assert_eq(mpq_mxint_quantize_block(v, 33, 8, m, &e), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_mxint_quantize_block(v, 0, 8, m, &e), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_mxint_quantize_block(NULL, 8, 8, m, &e), MPQ_ERR_ARG);
    for (int i = 0; i < 33; i++) cr_assert_eq(m[i], 0x11);
    cr_assert_eq(e, 0x55);
}

/* The rules in float64, written the simple way. */
static void ref_block(const float *v, int len, int k, int *mant, int *X)
{
    double amax = 0;
    for (int i = 0; i < len; i++) amax = fmax(amax, fabs((double)v[i]));
    int x = -127;
    if (amax > 0) {
        x = 200;
        while (ldexp(1.0, x) > amax) x--; /* largest x with 2^x <= amax */
        if (x < -127) x = -127;
    }
    for (int i = 0; i < len; i++) {
        double t = ldexp((double)v[i], k - 2 - x), r = floor(t), d = t - r;
        if (d > 0.5 || (d == 0.5 && fmod(r, 2.0) != 0)) r += 1;
        double lo = -ldexp(1.0, k - 1), hi = ldexp(1.0, k - 1) - 1;
        mant[i] = (int)fmin(fmax(r, lo), hi);
    }
    *X = x;
}

Test(mxint, every_width_follows_the_rules)
{
    synth_rng r = {51};
    float v[32];
    int8_t m[32];
    int mref[32], X;
    uint8_t e;
    for (int k = 2; k <= 8; k++)
        for (int rep = 0; rep < 3000; rep++) {
            int len = 1 + synth_int(&r, 32);
            double scale = ldexp(1.0, synth_int(&r, 250) - 150); /* from subnormal to huge, all finite */
            for (int i = 0; i < len; i++) v[i] = (float)(scale * synth_student4(&r));
            if (rep % 50 == 0) v[0] = (float)ldexp(1.0, synth_int(&r, 20) - 10); /* exact powers of two */
            cr_assert_eq(mpq_mxint_quantize_block(v, len, k, m, &e), MPQ_OK);
            ref_block(v, len, k, mref, &X);
            cr_assert_eq(e, X + 127, "k=%d: exponent", k);
            for (int i = 0; i < len; i++) {
                cr_assert_eq(m[i], mref[i], "k=%d v=%a: %d vs %d", k, (double)v[i], m[i], mref[i]);
                double step = ldexp(1.0, X - k + 2), w = mpq_mxint_value(m[i], k, e);
                if (fabs((double)v[i]) <= ldexp(1.0, X + 1) - 1.5 * step &&
                    ldexp(fabs((double)v[i]), k - 2 - X) <= ldexp(1.0, k - 1) - 1)
                    cr_assert_leq(fabs(w - v[i]), step / 2, "k=%d: error beyond half a step", k);
            }
        }
}

/* Packs W as MXINT with perms and column scales; checks the bytes. */
Test(mxint, packed_matrix_reads_back_and_dequantizes)
{
    synth_rng r = {52};
    const int shapes[][3] = {{7, 100, 1}, {33, 200, 3}, {64, 96, 64}, {20, 32, 16}};
    for (int si = 0; si < 4; si++) {
        const int m = shapes[si][0], n = shapes[si][1], br = shapes[si][2], ng = (n + 31) / 32;
        const int nb = ((m + br - 1) / br) * ng;
        float *W = malloc(sizeof(float) * m * n), *Wd = malloc(sizeof(float) * m * n), cs[200], row[200];
        uint8_t bits[64 * 7];
        uint32_t pr[64], pc[200];
        synth_weights(&r, W, m, n);
        for (int k = 0; k < nb; k++) bits[k] = (uint8_t)(2 + synth_int(&r, 7));
        synth_perm(&r, pr, m);
        synth_perm(&r, pc, n);
        for (int j = 0; j < n; j++) cs[j] = 0.5f + (float)synth_unif(&r);
        mpq_bitplane_desc d = {0};
        d.format = MPQ_FORMAT_MXINT, d.rows = m, d.cols = n, d.block_rows = br, d.bits = bits;
        d.p_row = pr, d.p_col = pc, d.col_scale = cs;
        mpq_packed A, B;
        cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
        cr_assert_eq(A.format, MPQ_FORMAT_MXINT);
        cr_assert_eq(A.group, 32);
        cr_assert_eq(mpq_packed_open(A.buf, A.bytes, &B), MPQ_OK);
        cr_assert_eq(B.format, MPQ_FORMAT_MXINT);
        tc_mat M;
        tc_decode(A.buf, &M);
        cr_assert_eq(M.format, 2);
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < n; j++) row[j] = W[(size_t)pr[i] * n + pc[j]] / cs[j];
            for (int g = 0; g < ng; g++) {
                int k = bits[(i / br) * ng + g], len = n - 32 * g < 32 ? n - 32 * g : 32;
                int8_t mant[32];
                uint8_t e;
                mpq_mxint_quantize_block(row + 32 * g, len, k, mant, &e);
                cr_assert_eq(M.width[i * ng + g], k);
                cr_assert_eq(M.sh[i * ng + g], ldexp(1.0, e - 127 - k + 1));
                for (int q = 0; q < len; q++) {
                    cr_assert_eq(M.code[(size_t)i * n + 32 * g + q], mant[q] + (1 << (k - 1)));
                    cr_assert_eq(tc_weight(&M, i, 32 * g + q, 0), mpq_mxint_value(mant[q], k, e),
                                 "mirror form = MXINT value");
                }
            }
        }
        cr_assert_eq(mpq_packed_dequantize(&A, 0, Wd), MPQ_OK);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                cr_assert_eq(Wd[(size_t)pr[i] * n + pc[j]], (float)(tc_weight(&M, i, j, 0) * cs[j]));
        tc_free(&M);
        mpq_packed_free(&A);
        free(W), free(Wd);
    }
}

Test(mxint, bits_per_weight_include_the_shared_exponent)
{
    synth_rng r = {53};
    float W[16 * 128];
    synth_weights(&r, W, 16, 128);
    mpq_bitplane_desc d = {0};
    d.format = MPQ_FORMAT_MXINT, d.rows = 16, d.cols = 128, d.uniform_bits = 4;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    cr_assert_float_eq(mpq_packed_bpw(&A, 0), 4.0, 1e-12);
    cr_assert_float_eq(mpq_packed_bpw(&A, 1), 4.25, 1e-12);
    mpq_packed_free(&A);
}

Test(mxint, gemv_on_every_path_matches_the_reference)
{
    synth_rng r = {54};
    const int shapes[][3] = {{1, 8, 16}, {7, 24, 1}, {33, 200, 3}, {100, 130, 16}, {64, 1000, 64}, {17, 257, 5}};
    const int maps[] = {0, 1}; /* random 2..8, or MXSens's 4/6/8 */
    for (int si = 0; si < 6; si++)
        for (int mi = 0; mi < 2; mi++) {
            const int m = shapes[si][0], n = shapes[si][1], br = shapes[si][2], ng = (n + 31) / 32;
            const int nb = ((m + br - 1) / br) * ng, batch = 1 + si % 3;
            float *W = malloc(sizeof(float) * m * n), *x = malloc(sizeof(float) * n * batch),
                  *y = malloc(sizeof(float) * m * batch);
            double *ref = malloc(sizeof(double) * m * batch), *mag = malloc(sizeof(double) * m * batch);
            uint8_t *bits = malloc((size_t)nb);
            const uint8_t trio[] = {4, 4, 4, 6, 6, 8};
            for (int k = 0; k < nb; k++) bits[k] = maps[mi] ? trio[synth_int(&r, 6)] : (uint8_t)(2 + synth_int(&r, 7));
            synth_weights(&r, W, m, n);
            for (int v = 0; v < batch; v++) synth_activations(&r, x + (size_t)v * n, n);
            uint32_t *pc = malloc(4u * n);
            synth_perm(&r, pc, n);
            mpq_bitplane_desc d = {0};
            d.format = MPQ_FORMAT_MXINT, d.rows = m, d.cols = n, d.block_rows = br, d.bits = bits, d.p_col = pc;
            mpq_packed A;
            cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
            tc_mat M;
            tc_decode(A.buf, &M);
            for (int skip = 0; skip < 3; skip++) {
                tc_gemv(&M, x, batch, skip, ref, mag);
                tc_gemv_every_path(&A, &M, x, batch, skip, y, ref, mag);
            }
            tc_free(&M);
            mpq_packed_free(&A);
            free(W), free(x), free(y), free(ref), free(mag), free(bits), free(pc);
        }
}

/* Weights that are MXINT values already, small-integer activations: exact. */
Test(mxint, gemv_exact_on_representable_weights)
{
    synth_rng r = {55};
    const int m = 45, n = 150, ng = 5;
    float W[45 * 150], x[150], y[45];
    double ref[45];
    uint8_t bits[3 * 5];
    for (int k = 0; k < 15; k++) bits[k] = (uint8_t)(2 + synth_int(&r, 7));
    for (int i = 0; i < m; i++)
        for (int g = 0; g < ng; g++) {
            int k = bits[(i / 16) * ng + g], X = synth_int(&r, 5) - 2, len = n - 32 * g < 32 ? n - 32 * g : 32;
            for (int q = 0; q < len; q++) {
                int mant = synth_int(&r, 1 << (k - 1)) - (1 << (k - 2));                /* never -2^(k-1): keeps X */
                if (q == 0) mant = synth_int(&r, 2) ? (1 << (k - 2)) : -(1 << (k - 2)); /* |max| in [2^X, 2^(X+1)) */
                W[i * n + 32 * g + q] = (float)ldexp(mant, X - k + 2);
            }
        }
    for (int j = 0; j < n; j++) x[j] = (float)(synth_int(&r, 7) - 3);
    mpq_bitplane_desc d = {0};
    d.format = MPQ_FORMAT_MXINT, d.rows = m, d.cols = n, d.bits = bits;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    for (int i = 0; i < m; i++) {
        ref[i] = 0;
        for (int j = 0; j < n; j++) ref[i] += (double)W[i * n + j] * x[j];
    }
    for (int p = 0; p < TC_NPATHS; p++) {
        if (!mpq_path_available(tc_paths[p])) continue;
        mpq_gemv_opts o = {0};
        o.path = tc_paths[p];
        tc_poison(y, 45);
        cr_assert_eq(mpq_gemv(&A, x, y, 1, &o, NULL, 0), MPQ_OK);
        for (int i = 0; i < m; i++) cr_assert_eq((double)y[i], ref[i], "%s row %d", mpq_path_name(tc_paths[p]), i);
    }
    mpq_packed_free(&A);
}

Test(mxint, bad_descriptions_and_corrupt_buffers)
{
    synth_rng r = {56};
    float W[20 * 64];
    synth_weights(&r, W, 20, 64);
    mpq_bitplane_desc d = {0};
    d.format = MPQ_FORMAT_MXINT, d.rows = 20, d.cols = 64;
    size_t bytes = 0;
    d.group = 64;
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_ERR_SIZE);
    d.group = 0, d.uniform_bits = 1;
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_ERR_BITS);
    d.uniform_bits = 6, d.format = 7;
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_ERR_ARG);
    d.format = MPQ_FORMAT_MXINT;
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_OK);
    uint8_t *buf = tc_alloc(bytes), *b = tc_alloc(bytes);
    mpq_packed A;
    uint8_t codes[20 * 64] = {0};
    uint16_t sh[40] = {0}, zh[40] = {0};
    sh[3] = 0xFF; /* the NaN exponent */
    cr_assert_eq(mpq_pack_quantized(&d, codes, sh, zh, buf, bytes, &A), MPQ_ERR_NONFINITE);
    sh[3] = 0, zh[5] = 1; /* MXINT has no second field */
    cr_assert_eq(mpq_pack_quantized(&d, codes, sh, zh, buf, bytes, &A), MPQ_ERR_NONFINITE);
    zh[5] = 0, codes[9] = 64; /* 7 bits in a 6-bit block */
    cr_assert_eq(mpq_pack_quantized(&d, codes, sh, zh, buf, bytes, &A), MPQ_ERR_BITS);
    codes[9] = 0;
    W[7] = NAN;
    cr_assert_eq(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_NONFINITE);
    W[7] = 1e30f; /* no fp16 limit for MXINT */
    cr_assert_eq(mpq_pack(&d, W, buf, bytes, &A), MPQ_OK);
    const uint64_t off_data = tc_u64(buf + 96);
    memcpy(b, buf, bytes);
    b[off_data + 3] = 0xFF; /* a NaN scale */
    cr_assert_eq(mpq_packed_open(b, bytes, &A), MPQ_ERR_FORMAT);
    memcpy(b, buf, bytes);
    b[off_data + 16 * 0 + 0] = b[off_data]; /* unchanged: still fine */
    cr_assert_eq(mpq_packed_open(b, bytes, &A), MPQ_OK);
    /* tile 1 holds rows 16..19: rows 20..31 are padding with exponent 0 */
    mpq_packed V;
    cr_assert_eq(mpq_packed_open(buf, bytes, &V), MPQ_OK);
    memcpy(b, buf, bytes);
    b[off_data + V.band_off[1] + 9] = 1;
    cr_assert_eq(mpq_packed_open(b, bytes, &A), MPQ_ERR_FORMAT, "padding row exponent");
    memcpy(b, buf, bytes);
    b[12] = 1; /* format field says bit-plane, magic says MXINT */
    cr_assert_eq(mpq_packed_open(b, bytes, &A), MPQ_ERR_FORMAT);
    memcpy(b, buf, bytes);
    b[tc_u64(buf + 56)] = 1; /* a 1-bit MXINT block */
    cr_assert_eq(mpq_packed_open(b, bytes, &A), MPQ_ERR_FORMAT);
    mpq_aligned_free(buf);
    mpq_aligned_free(b);
}

/* mpq_quantize, mpq_dequantize and mpq_pack_quantized take MXINT as the
   format traits describe it: each block's codes and E8M0 byte are those of
   mpq_mxint_quantize_block, values those of mpq_mxint_value, and packing
   the codes gives mpq_pack's bytes. */
Test(mxint, codes_and_exponents_through_the_generic_calls)
{
    enum { M = 37, N = 100 }; /* a partial tile and a partial block */
    synth_rng r = {91};
    float *W = malloc(sizeof(float) * M * N), *back = malloc(sizeof(float) * M * N);
    synth_weights(&r, W, M, N);
    uint8_t bits[3 * 4]; /* block rows of 16, groups of 32 */
    for (int k = 0; k < 12; k++) bits[k] = (uint8_t)(2 + synth_int(&r, 7));
    mpq_bitplane_desc d = {0};
    d.format = MPQ_FORMAT_MXINT, d.rows = M, d.cols = N, d.bits = bits;
    uint8_t *codes = malloc(M * N);
    uint16_t sh[M * 4], zh[M * 4];
    cr_assert_eq(mpq_quantize(&d, W, codes, sh, zh), MPQ_OK);
    cr_assert_eq(mpq_dequantize(&d, codes, sh, zh, back), MPQ_OK);
    for (int i = 0; i < M; i++)
        for (int g = 0; g < 4; g++) {
            const int len = g < 3 ? 32 : N - 96, b = bits[(i / 16) * 4 + g];
            int8_t mant[32];
            uint8_t e;
            cr_assert_eq(mpq_mxint_quantize_block(W + i * N + 32 * g, len, b, mant, &e), MPQ_OK);
            cr_assert_eq(sh[i * 4 + g], e, "row %d block %d", i, g);
            cr_assert_eq(zh[i * 4 + g], 0);
            for (int k = 0; k < len; k++) {
                const int j = 32 * g + k;
                cr_assert_eq(codes[i * N + j], (uint8_t)(mant[k] + (1 << (b - 1))), "(%d, %d)", i, j);
                cr_assert_eq((double)back[i * N + j], mpq_mxint_value(mant[k], b, e), "(%d, %d)", i, j);
            }
        }
    size_t bytes;
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_OK);
    uint8_t *b1 = tc_alloc(bytes), *b2 = tc_alloc(bytes);
    mpq_packed A, B;
    cr_assert_eq(mpq_pack(&d, W, b1, bytes, &A), MPQ_OK);
    cr_assert_eq(mpq_pack_quantized(&d, codes, sh, zh, b2, bytes, &B), MPQ_OK);
    cr_assert_eq(memcmp(b1, b2, bytes), 0, "mpq_pack_quantized gives mpq_pack's bytes");
    mpq_aligned_free(b1), mpq_aligned_free(b2);
    free(W), free(back), free(codes);
}
