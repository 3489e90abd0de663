/* Section 4, "SPARSE PART": a CSR part stored beside the dense records, read
   back by the independent decoder, added by every product and by
   dequantization; bad parts and hostile buffers are rejected. */
#include "common.h"

typedef struct sp_case {
    int m, n, G, br, format, perm;
} sp_case;

static const sp_case cases[] = {{1, 8, 8, 16, 1, 0},     {7, 24, 8, 1, 1, 1},       {33, 200, 64, 3, 1, 1},
                                {50, 300, 40, 32, 1, 0}, {17, 1000, 128, 16, 1, 1}, {20, 136, 136, 2, 1, 1},
                                {40, 96, 32, 16, 2, 0},  {19, 77, 32, 5, 2, 1}};

/* A random mask: about 1 % of the weights, one full row and the largest |w|. */
static uint8_t *make_mask(synth_rng *r, const float *W, int m, int n)
{
    uint8_t *mask = calloc((size_t)m * n, 1);
    for (size_t k = 0; k < (size_t)m * n; k++) mask[k] = synth_unif(r) < 0.01;
    if (m > 2)
        for (int j = 0; j < n; j++) mask[(size_t)(m / 2) * n + j] = 1;
    size_t big = 0;
    for (size_t k = 1; k < (size_t)m * n; k++)
        if (fabsf(W[k]) > fabsf(W[big])) big = k;
    mask[big] = 1;
    return mask;
}

Test(sparse, dense_plus_sparse_reads_back_multiplies_and_dequantizes)
{
    synth_rng r = {71};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const sp_case *c = &cases[ci];
        const size_t mn = (size_t)c->m * c->n;
        float *W = malloc(4 * mn), *D = malloc(4 * mn), *R = malloc(4 * mn);
        synth_weights(&r, W, c->m, c->n);
        uint32_t *prow = malloc(4u * c->m), *pcol = malloc(4u * c->n);
        float *cs = malloc(4u * c->n);
        synth_perm(&r, prow, c->m);
        synth_perm(&r, pcol, c->n);
        for (int j = 0; j < c->n; j++) cs[j] = 0.5f + (float)synth_unif(&r);
        int ng = (c->n + c->G - 1) / c->G, nb = ((c->m + c->br - 1) / c->br) * ng;
        uint8_t *bits = malloc((size_t)nb);
        for (int k = 0; k < nb; k++)
            bits[k] = (uint8_t)((c->format == 2 ? 2 : 1) + synth_int(&r, c->format == 2 ? 7 : 8));
        mpq_bitplane_desc d = {0};
        d.rows = c->m, d.cols = c->n, d.group = c->G, d.block_rows = c->br, d.bits = bits, d.format = c->format;
        if (c->perm) d.p_row = prow, d.p_col = pcol, d.col_scale = cs;
        mpq_packed Ad;
        cr_assert_eq(mpq_pack_alloc(&d, W, &Ad), MPQ_OK);
        cr_assert_eq(mpq_packed_dequantize(&Ad, 0, D), MPQ_OK);
        uint8_t *mask = make_mask(&r, W, c->m, c->n);
        mpq_sparse S;
        cr_assert_eq(mpq_sparse_from_mask(W, D, mask, c->m, c->n, &S), MPQ_OK);
        d.sparse = &S;
        mpq_packed A;
        cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
        cr_assert_not_null(A.sp_row_ptr);
        cr_assert_eq(A.sp_nnz, S.nnz);

        /* read back independently: entries in row order, fp16 of W - D */
        tc_mat M;
        tc_decode(A.buf, &M);
        cr_assert_eq(M.sp_nnz, S.nnz);
        size_t k = 0;
        for (int i = 0; i < c->m; i++)
            for (int j = 0; j < c->n; j++)
                if (mask[(size_t)i * c->n + j]) {
                    cr_assert_eq(M.sp_row[k], i);
                    cr_assert_eq(M.sp_col[k], j);
                    float v = (float)((double)W[(size_t)i * c->n + j] - (double)D[(size_t)i * c->n + j]);
                    cr_assert_eq(M.sp_val[k], (double)mpq_f16_to_f32(mpq_f32_to_f16(v)));
                    k++;
                }
        cr_assert_eq(k, S.nnz);

        /* dense part unchanged; dequantized = dense + sparse */
        cr_assert_eq(mpq_packed_dequantize(&A, 0, R), MPQ_OK);
        for (size_t o = 0; o < mn; o++) {
            double want = D[o];
            if (mask[o]) want += (double)mpq_f16_to_f32(mpq_f32_to_f16((float)((double)W[o] - (double)D[o])));
            cr_assert_eq(R[o], (float)want, "case %zu at %zu: %g vs %g", ci, o, (double)R[o], want);
            if (mask[o]) cr_assert_leq(fabs((double)R[o] - W[o]), fabs(W[o]) * 1e-3 + 1e-7);
        }
        /* sizes: row pointers and 16-bit columns plus fp16 values */
        size_t spb = 4u * (c->m + 1u) + 4u * S.nnz;
        cr_assert_eq(mpq_packed_sparse_bytes(&A), spb);
        cr_assert_float_eq(mpq_packed_bpw(&A, 2), mpq_packed_bpw(&A, 1) + 8.0 * spb / mn, 1e-12);
        cr_assert_float_eq(mpq_packed_bpw(&A, 1), mpq_packed_bpw(&Ad, 1), 1e-12);

        /* every path and the reference add the sparse part */
        for (int batch = 1; batch <= 3; batch += 2)
            for (int skip = 0; skip <= 1; skip++) {
                float *x = malloc(4u * batch * c->n), *y = malloc(4u * batch * c->m);
                double *ref = malloc(8u * batch * c->m), *mag = malloc(8u * batch * c->m),
                       *yr = malloc(8u * batch * c->m);
                for (int v = 0; v < batch; v++) synth_activations(&r, x + (size_t)v * c->n, c->n);
                tc_gemv(&M, x, batch, skip, ref, mag);
                cr_assert_eq(mpq_gemv_ref(&A, x, yr, batch, skip), MPQ_OK);
                for (int o = 0; o < batch * c->m; o++) cr_assert_leq(fabs(yr[o] - ref[o]), 1e-9 * mag[o] + 1e-30);
                tc_gemv_every_path(&A, &M, x, batch, skip, y, ref, mag);
                free(x), free(y), free(ref), free(mag), free(yr);
            }
        /* the buffer opens again as the same matrix */
        mpq_packed B;
        cr_assert_eq(mpq_packed_open(A.buf, A.bytes, &B), MPQ_OK);
        cr_assert_eq(B.sp_nnz, A.sp_nnz);
        cr_assert_eq((const void *)B.sp_val, (const void *)A.sp_val);
        tc_free(&M);
        mpq_sparse_free(&S);
        mpq_packed_free(&A);
        mpq_packed_free(&Ad);
        free(W), free(D), free(R), free(prow), free(pcol), free(cs), free(bits), free(mask);
    }
}

/* A sparse part past 65536 entries is added on several threads: the same
   bits as on one, and the reference's values. */
Test(sparse, large_parts_are_added_on_threads)
{
    synth_rng r = {72};
    const int m = 203, n = 400;
    const size_t mn = (size_t)m * n;
    float *W = malloc(4 * mn), *D = malloc(4 * mn), *x = malloc(4u * 2 * n), *y1 = malloc(4u * 2 * m),
          *y2 = malloc(4u * 2 * m);
    double *ref = malloc(8u * 2 * m), *mag = malloc(8u * 2 * m);
    uint8_t *mask = malloc(mn);
    synth_weights(&r, W, m, n);
    for (size_t k = 0; k < mn; k++) mask[k] = synth_unif(&r) < 0.9;
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = 128, d.block_rows = 16, d.uniform_bits = 3;
    mpq_packed Ad, A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &Ad), MPQ_OK);
    cr_assert_eq(mpq_packed_dequantize(&Ad, 0, D), MPQ_OK);
    mpq_sparse S;
    cr_assert_eq(mpq_sparse_from_mask(W, D, mask, m, n, &S), MPQ_OK);
    cr_assert_gt(S.nnz, 65536);
    d.sparse = &S;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    for (int v = 0; v < 2; v++) synth_activations(&r, x + (size_t)v * n, n);
    mpq_gemv_opts o = {0};
    o.path = MPQ_PATH_SCALAR, o.threads = 1;
    cr_assert_eq(mpq_gemv(&A, x, y1, 2, &o, NULL, 0), MPQ_OK);
    o.threads = 3;
    cr_assert_eq(mpq_gemv(&A, x, y2, 2, &o, NULL, 0), MPQ_OK);
    cr_assert_eq(memcmp(y1, y2, 4u * 2 * m), 0);
    tc_mat M;
    tc_decode(A.buf, &M);
    tc_gemv(&M, x, 2, 0, ref, mag);
    for (int k = 0; k < 2 * m; k++) cr_assert_leq(fabs((double)y2[k] - ref[k]), 1e-5 * mag[k] + 1e-30, "at %d", k);
    tc_free(&M);
    mpq_sparse_free(&S);
    mpq_packed_free(&A);
    mpq_packed_free(&Ad);
    free(W), free(D), free(x), free(y1), free(y2), free(ref), free(mag), free(mask);
}

Test(sparse, wide_matrices_store_32_bit_columns)
{
    synth_rng r = {72};
    const int m = 3, n = 65600;
    float *W = malloc(4u * m * n), *D = malloc(4u * m * n);
    synth_weights(&r, W, m, n);
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.uniform_bits = 3;
    mpq_packed Ad, A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &Ad), MPQ_OK);
    cr_assert_eq(mpq_packed_dequantize(&Ad, 0, D), MPQ_OK);
    uint8_t *mask = calloc((size_t)m * n, 1);
    mask[5] = mask[65599] = mask[(size_t)n + 65536] = mask[2 * (size_t)n] = 1;
    mpq_sparse S;
    cr_assert_eq(mpq_sparse_from_mask(W, D, mask, m, n, &S), MPQ_OK);
    d.sparse = &S;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    cr_assert_not_null(A.sp_col32);
    cr_assert_null(A.sp_col16);
    cr_assert_eq(mpq_packed_sparse_bytes(&A), 4u * (m + 1) + 6u * 4);
    tc_mat M;
    tc_decode(A.buf, &M);
    cr_assert_eq(M.sp_col[1], 65599);
    cr_assert_eq(M.sp_col[2], 65536);
    float *x = malloc(4u * n), y[3];
    double ref[3], mag[3];
    synth_activations(&r, x, n);
    tc_gemv(&M, x, 1, 0, ref, mag);
    tc_gemv_every_path(&A, &M, x, 1, 0, y, ref, mag);
    tc_free(&M);
    mpq_sparse_free(&S);
    mpq_packed_free(&A);
    mpq_packed_free(&Ad);
    free(W), free(D), free(mask), free(x);
}

Test(sparse, an_empty_part_is_stored_and_changes_nothing)
{
    synth_rng r = {73};
    const int m = 21, n = 80;
    float W[21 * 80], x[80], y0[21], y1[21];
    synth_weights(&r, W, m, n);
    synth_activations(&r, x, n);
    uint32_t rp[22] = {0};
    mpq_sparse S = {m, n, 0, rp, NULL, NULL};
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = 16, d.uniform_bits = 4;
    mpq_packed A, B;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    d.sparse = &S;
    cr_assert_eq(mpq_pack_alloc(&d, W, &B), MPQ_OK);
    cr_assert_not_null(B.sp_row_ptr);
    cr_assert_eq(mpq_packed_sparse_bytes(&B), 4u * 22);
    cr_assert_eq(mpq_gemv(&A, x, y0, 1, NULL, NULL, 0), MPQ_OK);
    cr_assert_eq(mpq_gemv(&B, x, y1, 1, NULL, NULL, 0), MPQ_OK);
    cr_assert_arr_eq(y0, y1, sizeof y0);
    mpq_packed_free(&A);
    mpq_packed_free(&B);
}

Test(sparse, bad_parts_are_errors_and_leave_the_buffer_untouched)
{
    const int m = 4, n = 16;
    float W[64];
    for (int k = 0; k < 64; k++) W[k] = (float)(k % 7) - 3.0f;
    uint32_t rp[5] = {0, 1, 1, 3, 3}, col[3] = {2, 0, 5};
    float val[3] = {1.0f, -2.0f, 0.5f};
    mpq_sparse S = {m, n, 3, rp, col, val};
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = 8, d.uniform_bits = 2, d.sparse = &S;
    size_t bytes = 0;
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_OK);
    uint8_t *buf = tc_alloc(bytes), *copy = malloc(bytes);
    memset(buf, 0xAB, bytes);
    memcpy(copy, buf, bytes);
    mpq_packed A;
    int nbad = 0;
#define BAD(body, st)                                                                                                  \
    do {                                                                                                               \
        mpq_sparse T = S;                                                                                              \
        uint32_t rp2[5], col2[3];                                                                                      \
        float val2[3];                                                                                                 \
        memcpy(rp2, rp, sizeof rp2), memcpy(col2, col, sizeof col2), memcpy(val2, val, sizeof val2);                   \
        T.row_ptr = rp2, T.col = col2, T.val = val2;                                                                   \
        body;                                                                                                          \
        d.sparse = &T;                                                                                                 \
        mpq_status got = mpq_pack(&d, W, buf, bytes, &A);                                                              \
        cr_assert_eq(got, st, "%s: %s", #body, mpq_status_str(got));                                                   \
        cr_assert_arr_eq(buf, copy, bytes);                                                                            \
        nbad++;                                                                                                        \
    } while (0)
    BAD(T.rows = 5, MPQ_ERR_SIZE);
    BAD(T.cols = 15, MPQ_ERR_SIZE);
    BAD(rp2[0] = 1, MPQ_ERR_ARG);
    BAD(rp2[2] = 0, MPQ_ERR_ARG);       /* decreasing */
    BAD(rp2[4] = 2, MPQ_ERR_ARG);       /* last != nnz */
    BAD(rp2[1] = 1000000, MPQ_ERR_ARG); /* past nnz before the end */
    BAD(col2[0] = 16, MPQ_ERR_ARG);     /* out of range */
    BAD(col2[2] = 0, MPQ_ERR_ARG);      /* repeated column in a row */
    BAD(val2[1] = NAN, MPQ_ERR_NONFINITE);
    BAD(val2[1] = 70000.0f, MPQ_ERR_RANGE); /* beyond fp16 */
    BAD(T.row_ptr = NULL, MPQ_ERR_ARG);
    cr_assert_eq(nbad, 11);
    d.sparse = &S;
    cr_assert_eq(mpq_pack(&d, W, buf, bytes, &A), MPQ_OK);
    mpq_aligned_free(buf);
    free(copy);
    /* from_mask */
    float D[64] = {0};
    uint8_t mask[64] = {0};
    mpq_sparse out;
    mask[3] = 1;
    W[3] = NAN;
    cr_assert_eq(mpq_sparse_from_mask(W, D, mask, m, n, &out), MPQ_ERR_NONFINITE);
    W[3] = 1e6f;
    cr_assert_eq(mpq_sparse_from_mask(W, D, mask, m, n, &out), MPQ_ERR_RANGE);
    W[3] = 1.0f;
    cr_assert_eq(mpq_sparse_from_mask(W, D, mask, 0, n, &out), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_sparse_from_mask(W, D, NULL, m, n, &out), MPQ_ERR_ARG);
    cr_assert_eq(mpq_sparse_from_mask(W, D, mask, m, n, &out), MPQ_OK);
    cr_assert_eq(out.nnz, 1);
    cr_assert_eq(out.val[0], 1.0f);
    mpq_sparse_free(&out);
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

Test(sparse, hostile_sparse_sections_are_rejected)
{
    synth_rng r = {74};
    const int m = 37, n = 120;
    float W[37 * 120], D[37 * 120];
    synth_weights(&r, W, m, n);
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = 40, d.uniform_bits = 3;
    mpq_packed A0, A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A0), MPQ_OK);
    cr_assert_eq(mpq_packed_dequantize(&A0, 0, D), MPQ_OK);
    uint8_t *mask = make_mask(&r, W, m, n);
    mpq_sparse S;
    cr_assert_eq(mpq_sparse_from_mask(W, D, mask, m, n, &S), MPQ_OK);
    cr_assert_geq(S.nnz, 3);
    d.sparse = &S;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    const size_t bytes = A.bytes;
    const uint8_t *orig = A.buf;
    uint8_t *b = tc_alloc(bytes);
    const uint64_t off = tc_u64(orig + 112), nnz = tc_u64(orig + 120);
    const size_t rp = (size_t)off, cp = rp + 4u * (m + 1), vp = cp + 2u * nnz;
    mpq_packed V;
    /* a first row with entries, for the targeted corruptions */
    int row = 0;
    while (tc_u32(orig + rp + 4 * (row + 1)) - tc_u32(orig + rp + 4 * row) < 2) row++;
    const uint32_t k0 = tc_u32(orig + rp + 4 * row);
#define CORRUPT(stmt)                                                                                                  \
    do {                                                                                                               \
        memcpy(b, orig, bytes);                                                                                        \
        stmt;                                                                                                          \
        cr_assert_eq(mpq_packed_open(b, bytes, &V), MPQ_ERR_FORMAT, "%s", #stmt);                                      \
    } while (0)
    CORRUPT(put_u32(b + 40, tc_u32(b + 40) & ~8u)); /* flag cleared */
    CORRUPT(put_u64(b + 120, nnz + 1));             /* entries */
    CORRUPT(put_u64(b + 120, ~0ull));               /* overflowing entries */
    CORRUPT(put_u64(b + 112, off + 64));            /* offset */
    CORRUPT(put_u64(b + 112, 0));
    CORRUPT(put_u32(b + rp, 1));                                /* row_ptr[0] */
    CORRUPT(put_u32(b + rp + 4 * (row + 1), k0 - 1));           /* decreasing */
    CORRUPT(put_u32(b + rp + 4 * m, (uint32_t)nnz - 1));        /* last */
    CORRUPT(put_u32(b + rp + 4 * (row + 1), 0x7FFFFFF0u));      /* far past nnz, then falling */
    CORRUPT(memcpy(b + cp + 2 * k0, &(uint16_t){120}, 2));      /* column out of range */
    CORRUPT(memcpy(b + cp + 2 * (k0 + 1), b + cp + 2 * k0, 2)); /* repeated column */
    CORRUPT(memcpy(b + vp + 2 * k0, &(uint16_t){0x7E00}, 2));   /* NaN */
    CORRUPT(memcpy(b + vp + 2 * k0, &(uint16_t){0x7C00}, 2));   /* Inf */
    /* a buffer without the flag but with sparse fields set */
    memcpy(b, A0.buf, A0.bytes);
    put_u64(b + 120, 1);
    cr_assert_eq(mpq_packed_open(b, A0.bytes, &V), MPQ_ERR_FORMAT);
    /* every truncation of the sparse tail */
    for (size_t cut = (size_t)off - 64; cut < bytes; cut++) {
        memcpy(b, orig, cut);
        cr_assert_eq(mpq_packed_open(b, cut, &V), MPQ_ERR_FORMAT, "cut at %zu", cut);
    }
    /* random corruption of the sparse section: rejected or still multiplies */
    float x[120], y[37];
    synth_activations(&r, x, n);
    int accepted = 0;
    for (int trial = 0; trial < 2000; trial++) {
        memcpy(b, orig, bytes);
        int nflip = 1 + synth_int(&r, 3);
        for (int f = 0; f < nflip; f++) b[off + (size_t)synth_int(&r, (int)(bytes - off))] = (uint8_t)synth_u64(&r);
        if (mpq_packed_open(b, bytes, &V) == MPQ_OK) {
            accepted++;
            cr_assert_eq(mpq_gemv(&V, x, y, 1, NULL, NULL, 0), MPQ_OK);
        }
    }
    cr_assert_gt(accepted, 0); /* value bytes that stay finite are legal */
    mpq_aligned_free(b);
    mpq_sparse_free(&S);
    mpq_packed_free(&A);
    mpq_packed_free(&A0);
    free(mask);
}
