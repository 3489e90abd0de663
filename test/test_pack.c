/* Section 4: the packed bit-plane format: layout (read back by an
   independent decoder), packing from floats, sizes, validation of hostile
   buffers, and bad inputs. */
#include "common.h"

typedef struct shape {
    int m, n, G, br;
} shape;

static const shape shapes[] = {{1, 8, 8, 16},     {7, 24, 8, 1},     {33, 200, 64, 3},    {48, 40, 24, 5},
                               {50, 300, 40, 32}, {100, 130, 16, 1}, {17, 1000, 128, 16}, {64, 96, 32, 48},
                               {20, 136, 136, 2}, {3, 57, 56, 7}};

/* A random problem: bits map, optional permutations and column scale. */
typedef struct problem {
    mpq_bitplane_desc d;
    uint8_t *bits;
    uint32_t *prow, *pcol;
    float *cs;
} problem;

static void make_problem(synth_rng *r, const shape *s, int with_perm, problem *P)
{
    memset(P, 0, sizeof *P);
    int nb = ((s->m + s->br - 1) / s->br) * ((s->n + s->G - 1) / s->G);
    P->bits = malloc((size_t)nb);
    for (int k = 0; k < nb; k++) P->bits[k] = (uint8_t)(1 + synth_int(r, 8));
    P->d.rows = s->m, P->d.cols = s->n, P->d.group = s->G, P->d.block_rows = s->br, P->d.bits = P->bits;
    if (with_perm) {
        P->prow = malloc(4u * s->m);
        P->pcol = malloc(4u * s->n);
        P->cs = malloc(4u * s->n);
        synth_perm(r, P->prow, s->m);
        synth_perm(r, P->pcol, s->n);
        for (int j = 0; j < s->n; j++) P->cs[j] = 0.25f + (float)synth_unif(r) * 3.0f;
        P->d.p_row = P->prow, P->d.p_col = P->pcol, P->d.col_scale = P->cs;
    }
}

static void free_problem(problem *P) { free(P->bits), free(P->prow), free(P->pcol), free(P->cs); }

Test(pack, codes_and_pairs_read_back_through_the_documented_layout)
{
    synth_rng r = {21};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int wp = 0; wp < 2; wp++) {
            const shape *s = &shapes[si];
            problem P;
            make_problem(&r, s, wp, &P);
            int ng = (s->n + s->G - 1) / s->G;
            uint8_t *codes = malloc((size_t)s->m * s->n);
            uint16_t *sh = malloc(2u * s->m * ng), *zh = malloc(2u * s->m * ng);
            for (int i = 0; i < s->m; i++)
                for (int j = 0; j < s->n; j++)
                    codes[i * s->n + j] = (uint8_t)synth_int(&r, 1 << P.bits[(i / s->br) * ng + j / s->G]);
            for (int k = 0; k < s->m * ng; k++) {
                sh[k] = mpq_f32_to_f16((float)synth_unif(&r));
                zh[k] = mpq_f32_to_f16((float)synth_gauss(&r));
            }
            size_t bytes = 0;
            cr_assert_eq(mpq_bitplane_bytes(&P.d, &bytes), MPQ_OK);
            uint8_t *buf = tc_alloc(bytes);
            memset(buf, 0xCD, bytes);
            mpq_packed A, B;
            cr_assert_eq(mpq_pack_quantized(&P.d, codes, sh, zh, buf, bytes, &A), MPQ_OK);
            cr_assert_eq(A.bytes, bytes);
            cr_assert_eq(mpq_packed_open(buf, bytes, &B), MPQ_OK);
            cr_assert_eq(B.data, A.data);
            cr_assert_eq(B.band_rows, s->br % 16 == 0 ? s->br : 16);
            tc_mat M;
            tc_decode(buf, &M);
            for (int i = 0; i < s->m; i++) {
                cr_assert_eq(M.prow[i], wp ? P.prow[i] : (uint32_t)i);
                for (int g = 0; g < ng; g++) {
                    cr_assert_eq(M.width[i * ng + g], P.bits[(i / s->br) * ng + g]);
                    cr_assert_eq(M.sh[i * ng + g], tc_half(sh[i * ng + g]));
                    cr_assert_eq(M.zh[i * ng + g], tc_half(zh[i * ng + g]));
                    cr_assert_eq(mpq_packed_bits_at(&A, i, g), P.bits[(i / s->br) * ng + g]);
                }
                for (int j = 0; j < s->n; j++)
                    cr_assert_eq(M.code[i * s->n + j], codes[i * s->n + j], "%dx%d G%d br%d: code (%d,%d)", s->m, s->n,
                                 s->G, s->br, i, j);
            }
            for (int j = 0; j < s->n; j++) {
                cr_assert_eq(M.pcol[j], wp ? P.pcol[j] : (uint32_t)j);
                cr_assert_eq(M.cscale[j], wp ? P.cs[j] : 1.0f);
            }
            /* the buffer is deterministic: packing again gives the same bytes */
            uint8_t *buf2 = tc_alloc(bytes);
            cr_assert_eq(mpq_pack_quantized(&P.d, codes, sh, zh, buf2, bytes, &B), MPQ_OK);
            cr_assert_eq(memcmp(buf, buf2, bytes), 0);
            tc_free(&M);
            mpq_aligned_free(buf), mpq_aligned_free(buf2);
            free(codes), free(sh), free(zh);
            free_problem(&P);
        }
}

/* mpq_packed_records points at every record: the codes and pairs read at
   its offsets (plane by plane, chunk by chunk, as the layout comment says)
   are those of the independent decoder, its plane counts are the widest
   row of each tile and group, and its metadata size is the format's. */
Test(pack, records_are_where_the_layout_puts_them)
{
    synth_rng r = {4242};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int mx = 0; mx < 2; mx++) {
            shape sh = shapes[si];
            if (mx) sh.G = 32; /* MXINT blocks */
            problem P;
            make_problem(&r, &sh, 0, &P);
            if (mx) {
                P.d.format = MPQ_FORMAT_MXINT, P.d.group = 32;
                const int nb = ((sh.m + sh.br - 1) / sh.br) * ((sh.n + 31) / 32);
                for (int k = 0; k < nb; k++) P.bits[k] = (uint8_t)(2 + synth_int(&r, 7));
            }
            float *W = malloc(sizeof(float) * sh.m * sh.n);
            synth_weights(&r, W, sh.m, sh.n);
            mpq_packed A;
            cr_assert_eq(mpq_pack_alloc(&P.d, W, &A), MPQ_OK);
            tc_mat M;
            tc_decode(A.buf, &M);
            const int ntiles = (sh.m + 15) / 16, ng = A.ngroups;
            uint64_t *off = malloc(sizeof(uint64_t) * ntiles * ng);
            uint8_t *np = malloc((size_t)ntiles * ng);
            int meta = 0;
            cr_assert_eq(mpq_packed_records(&A, off, np, &meta), MPQ_OK);
            cr_assert_eq(meta, mx ? 16 : 64);
            for (int t = 0; t < ntiles; t++)
                for (int g = 0; g < ng; g++) {
                    const uint8_t *rec = A.data + off[t * ng + g];
                    const int gw = sh.n - g * A.group < A.group ? sh.n - g * A.group : A.group, nch = (gw + 7) / 8;
                    int widest = 0;
                    for (int i = 16 * t; i < 16 * t + 16 && i < sh.m; i++)
                        widest = M.width[i * ng + g] > widest ? M.width[i * ng + g] : widest;
                    cr_assert_eq(np[t * ng + g], widest, "tile %d group %d", t, g);
                    for (int i = 16 * t; i < 16 * t + 16 && i < sh.m; i++) {
                        const int rr = i - 16 * t;
                        if (!mx) cr_assert_eq(tc_half(tc_u16(rec + 2 * rr)), M.sh[i * ng + g], "s^ of row %d", i);
                        for (int j = 0; j < gw; j++) {
                            unsigned q = 0;
                            for (int p = 0; p < M.width[i * ng + g]; p++)
                                q |= ((rec[meta + p * nch * 16 + tc_slab_off(j / 8, rr, nch)] >> (j % 8)) & 1u) << p;
                            cr_assert_eq(q, M.code[(size_t)i * sh.n + g * A.group + j], "row %d column %d", i,
                                         g * A.group + j);
                        }
                    }
                }
            cr_assert_eq(mpq_packed_records(NULL, off, np, &meta), MPQ_ERR_ARG);
            cr_assert_eq(mpq_packed_records(&A, NULL, NULL, NULL), MPQ_OK);
            free(off), free(np), free(W);
            tc_free(&M);
            mpq_packed_free(&A);
            free_problem(&P);
        }
}

Test(pack, packing_floats_quantizes_the_permuted_scaled_matrix)
{
    synth_rng r = {22};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int wp = 0; wp < 2; wp++) {
            const shape *s = &shapes[si];
            problem P;
            make_problem(&r, s, wp, &P);
            P.d.symmetric = 1u << 5;
            float *W = malloc(sizeof(float) * s->m * s->n), *Wd = malloc(sizeof(float) * s->m * s->n), row[1000];
            synth_weights(&r, W, s->m, s->n);
            mpq_packed A;
            cr_assert_eq(mpq_pack_alloc(&P.d, W, &A), MPQ_OK);
            tc_mat M;
            tc_decode(A.buf, &M);
            int ng = M.ngroups;
            uint8_t q[256];
            for (int i = 0; i < s->m; i++) {
                for (int j = 0; j < s->n; j++)
                    row[j] = W[(size_t)M.prow[i] * s->n + M.pcol[j]] / M.cscale[j]; /* W~ / c */
                for (int g = 0; g < ng; g++) {
                    int b = M.width[i * ng + g], gw = s->n - g * s->G < s->G ? s->n - g * s->G : s->G;
                    uint16_t hs = 0, hz = 0;
                    mpq_quantize_group(row + g * s->G, gw, b, b == 5, q, &hs, &hz);
                    cr_assert_eq(tc_half(hs), M.sh[i * ng + g]);
                    cr_assert_eq(tc_half(hz), M.zh[i * ng + g]);
                    for (int k = 0; k < gw; k++) cr_assert_eq(M.code[i * s->n + g * s->G + k], q[k]);
                }
            }
            /* mpq_packed_dequantize: original coordinates, times the column scale */
            for (int skip = 0; skip < 3; skip++) {
                cr_assert_eq(mpq_packed_dequantize(&A, skip, Wd), MPQ_OK);
                for (int i = 0; i < s->m; i++)
                    for (int j = 0; j < s->n; j++) {
                        double ref = tc_weight(&M, i, j, skip) * M.cscale[j];
                        cr_assert_eq(Wd[(size_t)M.prow[i] * s->n + M.pcol[j]], (float)ref);
                    }
                /* mpq_packed_dequantize_row: the same row of it, eight columns at a time */
                for (int i = 0; i < s->m; i++) {
                    cr_assert_eq(mpq_packed_dequantize_row(&A, skip, M.prow[i], row), MPQ_OK);
                    for (int j = 0; j < s->n; j++)
                        cr_assert_eq(row[M.pcol[j]], (float)(tc_weight(&M, i, j, skip) * M.cscale[j]), "row %d col %d",
                                     i, j);
                }
            }
            tc_free(&M);
            mpq_packed_free(&A);
            cr_assert_null(A.buf);
            free(W), free(Wd);
            free_problem(&P);
        }
}

Test(pack, bits_per_weight_counts_weights_and_metadata)
{
    synth_rng r = {23};
    float *W = malloc(sizeof(float) * 64 * 1024);
    synth_weights(&r, W, 64, 1024);
    mpq_bitplane_desc d = {0};
    d.rows = 64, d.cols = 1000, d.uniform_bits = 3; /* group 128: 7 full groups and one of 104 */
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    cr_assert_float_eq(mpq_packed_bpw(&A, 0), 3.0, 1e-12);
    cr_assert_float_eq(mpq_packed_bpw(&A, 1), 3.0 + 32.0 * 8 / 1000, 1e-12);
    mpq_packed_free(&A);
    uint8_t bits[4 * 8];
    for (int k = 0; k < 32; k++) bits[k] = (uint8_t)(k % 4 == 0 ? 3 : 2); /* 16 x 128 blocks, a quarter at 3 bit */
    d.cols = 1024, d.bits = bits;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    cr_assert_float_eq(mpq_packed_bpw(&A, 0), 2.25, 1e-12);
    cr_assert_float_eq(mpq_packed_bpw(&A, 1), 2.5, 1e-12);
    mpq_packed_free(&A);
    free(W);
}

/* Every bad input: an error, and the output buffer untouched. */
Test(pack, bad_inputs_are_errors_and_write_nothing)
{
    synth_rng r = {24};
    const int m = 20, n = 40;
    float W[20 * 40], cs[40];
    uint32_t pr[20], pc[40];
    uint8_t bits[2 * 1];
    synth_weights(&r, W, m, n);
    synth_perm(&r, pr, m);
    synth_perm(&r, pc, n);
    for (int j = 0; j < n; j++) cs[j] = 1.5f;
    bits[0] = 3, bits[1] = 4;
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = 40, d.bits = bits, d.p_row = pr, d.p_col = pc, d.col_scale = cs;
    size_t bytes = 0;
    cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_OK);
    uint8_t *buf = tc_alloc(bytes + 16), *ref = malloc(bytes + 16);
    memset(buf, 0x5A, bytes + 16);
    memcpy(ref, buf, bytes + 16);
    mpq_packed A;
#define EXPECT(call, st)                                                                                               \
    do {                                                                                                               \
        cr_assert_eq((call), (st), #call);                                                                             \
        cr_assert_eq(memcmp(buf, ref, bytes + 16), 0, "buffer touched by " #call);                                     \
    } while (0)
    mpq_bitplane_desc e = d;
    e.rows = 0;
    EXPECT(mpq_pack(&e, W, buf, bytes, &A), MPQ_ERR_SIZE);
    e = d, e.cols = -3;
    EXPECT(mpq_pack(&e, W, buf, bytes, &A), MPQ_ERR_SIZE);
    e = d, e.group = 12;
    EXPECT(mpq_pack(&e, W, buf, bytes, &A), MPQ_ERR_SIZE);
    e = d, e.block_rows = -1;
    EXPECT(mpq_pack(&e, W, buf, bytes, &A), MPQ_ERR_SIZE);
    EXPECT(mpq_pack(&d, W, buf, bytes - 16, &A), MPQ_ERR_SIZE);
    EXPECT(mpq_pack(&d, W, buf, bytes + 16, &A), MPQ_ERR_SIZE);
    EXPECT(mpq_pack(&d, W, buf + 1, bytes, &A), MPQ_ERR_ALIGN);
    EXPECT(mpq_pack(&d, NULL, buf, bytes, &A), MPQ_ERR_ARG);
    EXPECT(mpq_pack(NULL, W, buf, bytes, &A), MPQ_ERR_ARG);
    EXPECT(mpq_pack(&d, W, buf, bytes, NULL), MPQ_ERR_ARG);
    bits[1] = 9;
    EXPECT(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_BITS);
    bits[1] = 0;
    EXPECT(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_BITS);
    bits[1] = 4;
    e = d, e.bits = NULL, e.uniform_bits = 9;
    EXPECT(mpq_pack(&e, W, buf, bytes, &A), MPQ_ERR_BITS);
    pr[3] = pr[4];
    EXPECT(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_PERM);
    synth_perm(&r, pr, m);
    pc[7] = 40;
    EXPECT(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_PERM);
    synth_perm(&r, pc, n);
    cs[5] = 0.0f;
    EXPECT(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_RANGE);
    cs[5] = NAN;
    EXPECT(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_NONFINITE);
    cs[5] = 1e-9f; /* W / c beyond the fp16 range */
    EXPECT(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_RANGE);
    cs[5] = 1.5f;
    W[77] = INFINITY;
    EXPECT(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_NONFINITE);
    W[77] = 1e6f;
    EXPECT(mpq_pack(&d, W, buf, bytes, &A), MPQ_ERR_RANGE);
    W[77] = 0.01f;
    /* codes that do not fit their width, non-finite pairs */
    uint8_t codes[20 * 40];
    uint16_t sh[20], zh[20];
    memset(codes, 0, sizeof codes);
    for (int k = 0; k < 20; k++) sh[k] = zh[k] = 0x3C00;
    codes[5] = 8; /* row 0 is in a 3-bit block */
    EXPECT(mpq_pack_quantized(&d, codes, sh, zh, buf, bytes, &A), MPQ_ERR_BITS);
    codes[5] = 7;
    sh[9] = 0x7C00;
    EXPECT(mpq_pack_quantized(&d, codes, sh, zh, buf, bytes, &A), MPQ_ERR_NONFINITE);
    sh[9] = 0x3C00, zh[2] = 0x7E00;
    EXPECT(mpq_pack_quantized(&d, codes, sh, zh, buf, bytes, &A), MPQ_ERR_NONFINITE);
#undef EXPECT
    /* and it still works once the inputs are good */
    zh[2] = 0;
    cr_assert_eq(mpq_pack_quantized(&d, codes, sh, zh, buf, bytes, &A), MPQ_OK);
    cr_assert_eq(mpq_pack(&d, W, buf, bytes, &A), MPQ_OK);
    mpq_aligned_free(buf);
    free(ref);
}

/* A valid buffer with permutations, scales, a partial tile and mixed tiles. */
static uint8_t *valid_buffer(size_t *bytes)
{
    synth_rng r = {25};
    const int m = 21, n = 50;
    static float W[21 * 50], cs[50];
    static uint32_t pr[21], pc[50];
    static uint8_t bits[7 * 2];
    synth_weights(&r, W, m, n);
    synth_perm(&r, pr, m);
    synth_perm(&r, pc, n);
    for (int j = 0; j < n; j++) cs[j] = 0.5f + (float)j / 50;
    for (int k = 0; k < 14; k++) bits[k] = (uint8_t)(1 + k % 8);
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.group = 32, d.block_rows = 3, d.bits = bits, d.p_row = pr, d.p_col = pc, d.col_scale = cs;
    mpq_bitplane_bytes(&d, bytes);
    uint8_t *buf = tc_alloc(*bytes);
    mpq_packed A;
    cr_assert_eq(mpq_pack(&d, W, buf, *bytes, &A), MPQ_OK);
    return buf;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

Test(pack, open_rejects_every_corruption)
{
    size_t bytes = 0;
    uint8_t *good = valid_buffer(&bytes), *b = tc_alloc(bytes + 64);
    mpq_packed A;
    cr_assert_eq(mpq_packed_open(good, bytes, &A), MPQ_OK);
    const uint64_t off_bits = tc_u64(good + 56), off_prow = tc_u64(good + 64), off_cs = tc_u64(good + 80);
    const uint64_t off_index = tc_u64(good + 88), off_data = tc_u64(good + 96);
    struct {
        const char *what;
        uint64_t at;
        int kind; /* 0 byte, 1 u32, 2 u64, 3 float */
        uint64_t val;
        mpq_status want;
    } cases[] = {
        {"magic", 0, 0, 'X', MPQ_ERR_FORMAT},
        {"version", 8, 1, 2, MPQ_ERR_FORMAT},
        {"format", 12, 1, 7, MPQ_ERR_FORMAT},
        {"rows", 16, 1, 22, MPQ_ERR_FORMAT},
        {"rows huge", 16, 1, 0x80000000u, MPQ_ERR_FORMAT},
        {"cols", 20, 1, 49, MPQ_ERR_FORMAT},
        {"cols zero", 20, 1, 0, MPQ_ERR_FORMAT},
        {"group not a multiple of 8", 24, 1, 12, MPQ_ERR_FORMAT},
        {"block_rows zero", 28, 1, 0, MPQ_ERR_FORMAT},
        {"tile_rows", 32, 1, 8, MPQ_ERR_FORMAT},
        {"band_rows", 36, 1, 32, MPQ_ERR_FORMAT},
        {"unknown flag", 40, 1, 7 | 8, MPQ_ERR_FORMAT},
        {"flag dropped", 40, 1, 3, MPQ_ERR_FORMAT},
        {"total_bytes", 48, 2, bytes + 64, MPQ_ERR_FORMAT},
        {"off_bits", 56, 2, 192, MPQ_ERR_FORMAT},
        {"off_index", 88, 2, 64, MPQ_ERR_FORMAT},
        {"off_data past the end", 96, 2, 1u << 30, MPQ_ERR_FORMAT},
        {"data_bytes", 104, 2, 16, MPQ_ERR_FORMAT},
        {"width 0", off_bits + 3, 0, 0, MPQ_ERR_FORMAT},
        {"width 9", off_bits + 3, 0, 9, MPQ_ERR_FORMAT},
        {"width changed (records no longer match)", off_bits + 0, 0, 8, MPQ_ERR_FORMAT},
        {"band index", off_index + 8, 2, 64, MPQ_ERR_FORMAT},
        {"last index entry", off_index + 16, 2, 0, MPQ_ERR_FORMAT},
        {"p_row repeats", off_prow + 4, 1, tc_u32(good + off_prow), MPQ_ERR_FORMAT},
        {"p_row out of range", off_prow + 8, 1, 21, MPQ_ERR_FORMAT},
        {"col_scale NaN", off_cs + 8, 1, 0x7FC00000u, MPQ_ERR_FORMAT},
        {"col_scale zero", off_cs + 8, 1, 0, MPQ_ERR_FORMAT},
        {"s^ Inf", off_data + 3, 0, 0x7C, MPQ_ERR_FORMAT}, /* high byte of row 1 s^ */
        {"z^ NaN", off_data + 32 + 7, 0, 0x7E, MPQ_ERR_FORMAT},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memcpy(b, good, bytes);
        if (cases[k].kind == 0) b[cases[k].at] = (uint8_t)cases[k].val;
        if (cases[k].kind == 1) put_u32(b + cases[k].at, (uint32_t)cases[k].val);
        if (cases[k].kind == 2) put_u64(b + cases[k].at, cases[k].val);
        memset(&A, 0x11, sizeof A);
        mpq_status st = mpq_packed_open(b, bytes, &A);
        cr_assert_eq(st, cases[k].want, "%s: got %s", cases[k].what, mpq_status_str(st));
        cr_assert_eq(((uint8_t *)&A)[0], 0x11, "%s: view written", cases[k].what);
    }
    /* a padding row (the last tile holds rows 16..20 of 21) with a non-zero pair */
    {
        memcpy(b, good, bytes);
        mpq_packed V;
        cr_assert_eq(mpq_packed_open(b, bytes, &V), MPQ_OK);
        /* record of tile 1, group 0 is the first record of band 1 */
        uint8_t *rec = b + off_data + V.band_off[1];
        rec[2 * 7 + 1] = 0x3C; /* row 16 + 7 = 23 >= 21: padding */
        cr_assert_eq(mpq_packed_open(b, bytes, &A), MPQ_ERR_FORMAT, "padding row");
    }
    /* every truncation */
    for (size_t len = 0; len < bytes; len++) {
        memcpy(b, good, len);
        cr_assert_neq(mpq_packed_open(b, len, &A), MPQ_OK, "truncated to %zu", len);
    }
    memcpy(b, good, bytes);
    cr_assert_eq(mpq_packed_open(b + 1, bytes, &A), MPQ_ERR_ALIGN);
    cr_assert_eq(mpq_packed_open(NULL, bytes, &A), MPQ_ERR_ARG);
    cr_assert_eq(mpq_packed_open(b, bytes, NULL), MPQ_ERR_ARG);
    mpq_aligned_free(good);
    mpq_aligned_free(b);
}

Test(pack, random_corruption_never_crashes)
{
    size_t bytes = 0;
    uint8_t *good = valid_buffer(&bytes), *b = tc_alloc(bytes);
    synth_rng r = {26};
    float x[50], y[21];
    for (int j = 0; j < 50; j++) x[j] = synth_gauss(&r);
    int accepted = 0;
    for (int rep = 0; rep < 4000; rep++) {
        memcpy(b, good, bytes);
        int nflip = 1 + synth_int(&r, 4);
        for (int f = 0; f < nflip; f++) {
            /* mostly the header and the small sections, sometimes anywhere */
            size_t at = rep % 4 ? (size_t)synth_int(&r, (int)tc_u64(good + 96)) : (size_t)synth_int(&r, (int)bytes);
            b[at] ^= (uint8_t)(1 + synth_int(&r, 255));
        }
        mpq_packed A;
        if (mpq_packed_open(b, bytes, &A) == MPQ_OK) { /* then it must be usable */
            accepted++;
            cr_assert_eq(mpq_gemv(&A, x, y, 1, NULL, NULL, 0), MPQ_OK);
        }
    }
    cr_assert_gt(accepted, 0, "flips of code bytes are still valid matrices");
    mpq_aligned_free(good);
    mpq_aligned_free(b);
}
