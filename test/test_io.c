/* mpq_io: safetensors reading and writing, packed matrices in files, and a
   corpus of hostile files. With MPQ_FUZZ_CORPUS set to a directory, the
   valid and crafted files are also written there (the fuzz target's seeds). */
#define _XOPEN_SOURCE 700
#include "common.h"
#include "mpq_io.h"
#include "tmpdir.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------ */

static char tmpdir[256];

static void make_tmpdir(void) { cr_assert(tc_tmpdir_make(tmpdir, sizeof tmpdir, "io")); }
static void remove_tmpdir(void) { tc_tmpdir_remove(tmpdir); }

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    cr_assert_eq(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* A file from a header text and `data` bytes (header length as given, or
   the text's length when hlen is UINT64_MAX). */
static uint8_t *craft(const char *json, uint64_t hlen, const void *data, size_t dn, size_t *n)
{
    const size_t jn = strlen(json);
    if (hlen == UINT64_MAX) hlen = jn;
    *n = 8 + jn + dn;
    uint8_t *b = malloc(*n + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 8, json, jn);
    if (dn) memcpy(b + 8 + jn, data, dn);
    return b;
}

static int corpus_seq;

static void corpus_save(const void *b, size_t n)
{
    const char *dir = getenv("MPQ_FUZZ_CORPUS");
    if (!dir || !*dir) return;
    char p[512];
    snprintf(p, sizeof p, "%s/seed-%ld-%04d.safetensors", dir, (long)getpid(), corpus_seq++);
    FILE *f = fopen(p, "wb");
    if (f) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
}

/* An independent bf16 rounding: the nearer of the two bf16 neighbours in
   float64, ties to the even one. */
static uint16_t ref_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
    const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* toward zero, one step away */
    if ((u & 0xFFFF) == 0) return lo;
    const double a = mpq_bf16_to_f32(lo);
    /* past the largest bf16 the next step is 2^128, as in IEEE rounding */
    const double b = (hi & 0x7FFF) == 0x7F80 ? copysign(ldexp(1.0, 128), (double)f) : (double)mpq_bf16_to_f32(hi);
    const double da = fabs((double)f - a), db = fabs(b - (double)f);
    if (da != db) return da < db ? lo : hi;
    return (lo & 1) ? hi : lo;
}

/* A packed test matrix: shape, widths, permutations, scales, sparse part. */
typedef struct pk {
    mpq_packed A;
    float *W;
    uint8_t *bits;
    uint32_t *pr, *pc;
    float *cs;
    mpq_sparse S;
} pk;

static void pk_make(pk *P, int m, int n, int format, int mixed, int perms, int scales, int sparse, uint64_t seed)
{
    memset(P, 0, sizeof *P);
    synth_rng r = {seed};
    P->W = malloc(sizeof(float) * (size_t)m * n);
    synth_weights(&r, P->W, m, n);
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.format = format;
    d.group = format == MPQ_FORMAT_MXINT ? 32 : 64;
    d.block_rows = 16;
    d.uniform_bits = format == MPQ_FORMAT_MXINT ? 4 : 3;
    if (mixed) {
        const int nb = (m + 15) / 16 * ((n + d.group - 1) / d.group);
        P->bits = malloc((size_t)nb);
        for (int k = 0; k < nb; k++)
            P->bits[k] = (uint8_t)(format == MPQ_FORMAT_MXINT ? 2 + synth_int(&r, 7) : 1 + synth_int(&r, 8));
        d.bits = P->bits;
    }
    if (perms) {
        P->pr = malloc(sizeof(uint32_t) * m), P->pc = malloc(sizeof(uint32_t) * n);
        synth_perm(&r, P->pr, m);
        synth_perm(&r, P->pc, n);
        d.p_row = P->pr, d.p_col = P->pc;
    }
    if (scales) {
        P->cs = malloc(sizeof(float) * n);
        for (int j = 0; j < n; j++) P->cs[j] = 0.5f + (float)synth_unif(&r);
        d.col_scale = P->cs;
    }
    if (sparse) {
        uint8_t *mask = calloc((size_t)m * n, 1);
        float *D = calloc((size_t)m * n, sizeof(float));
        for (int k = 0; k < m * n / 50 + 1; k++) mask[synth_int(&r, m * n)] = 1;
        cr_assert_eq(mpq_sparse_from_mask(P->W, D, mask, m, n, &P->S), MPQ_OK);
        d.sparse = &P->S;
        free(mask);
        free(D);
    }
    cr_assert_eq(mpq_pack_alloc(&d, P->W, &P->A), MPQ_OK);
}

static void pk_free(pk *P)
{
    mpq_packed_free(&P->A);
    mpq_sparse_free(&P->S);
    free(P->W), free(P->bits), free(P->pr), free(P->pc), free(P->cs);
}

/* The same products, bit for bit, from two packed matrices. */
static void same_products(const mpq_packed *A, const mpq_packed *B)
{
    synth_rng r = {77};
    const int batch = 3;
    float *x = malloc(sizeof(float) * batch * A->cols);
    float *y1 = malloc(sizeof(float) * batch * A->rows), *y2 = malloc(sizeof(float) * batch * A->rows);
    for (int b = 0; b < batch; b++) synth_activations(&r, x + (size_t)b * A->cols, A->cols);
    mpq_gemv_opts o = {0};
    o.threads = 1;
    cr_assert_eq(mpq_gemv(A, x, y1, batch, &o, NULL, 0), MPQ_OK);
    cr_assert_eq(mpq_gemv(B, x, y2, batch, &o, NULL, 0), MPQ_OK);
    cr_assert_eq(memcmp(y1, y2, sizeof(float) * batch * A->rows), 0);
    free(x), free(y1), free(y2);
}

/* ---- dtypes and plain tensors --------------------------------------------- */

Test(io, dtype_table)
{
    const char *names[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
                           "BF16", "I32", "U32", "F32",     "F64",     "I64", "U64"};
    const size_t sizes[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
    for (int i = 0; i < MPQ_DT_COUNT; i++) {
        cr_assert_str_eq(mpq_dtype_name((mpq_dtype)i), names[i]);
        cr_assert_eq(mpq_dtype_size((mpq_dtype)i), sizes[i]);
    }
    cr_assert_null(mpq_dtype_name(MPQ_DT_COUNT));
    cr_assert_eq(mpq_dtype_size((mpq_dtype)-1), 0);
}

Test(io, bf16_rounds_to_nearest_even)
{
    synth_rng r = {5};
    for (int k = 0; k < 200000; k++) {
        uint32_t u = (uint32_t)synth_u64(&r);
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) {
            cr_assert(isnan(mpq_bf16_to_f32(mpq_f32_to_bf16(f))));
            continue;
        }
        cr_assert_eq(mpq_f32_to_bf16(f), ref_bf16(f), "%a", (double)f);
    }
    cr_assert_eq(mpq_f32_to_bf16(1.0f), 0x3F80);
    cr_assert_eq(mpq_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);     /* tie: to even */
    cr_assert_eq(mpq_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82); /* tie: to even (up) */
    cr_assert_eq(mpq_f32_to_bf16(3.4028235e38f), 0x7F80);      /* FLT_MAX rounds to Inf */
    cr_assert_eq(mpq_bf16_to_f32(0xC000), -2.0f);
}

Test(io, float_tensors_round_trip, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/plain.safetensors", tmpdir);
    synth_rng r = {11};
    const int m = 37, n = 29;
    float *x = malloc(sizeof(float) * m * n);
    synth_weights(&r, x, m, n);
    x[0] = 70000.0f; /* beyond F16: Inf there, exact in F32, rounded in BF16 */
    x[1] = -0.0f;
    x[2] = 1e-8f; /* F16 subnormal range */
    mpq_io_err e;
    mpq_st_writer *w;
    cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK, "%s", e.msg);
    const uint64_t sh[2] = {(uint64_t)m, (uint64_t)n}, one = 7;
    cr_assert_eq(mpq_st_write_f32(w, "w.f32", MPQ_DT_F32, 2, sh, x, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_f32(w, "w.f16", MPQ_DT_F16, 2, sh, x, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_f32(w, "w.bf16", MPQ_DT_BF16, 2, sh, x, &e), MPQ_OK);
    const double d[7] = {1.0, -2.5, 1e300, 3.0e-5, 0.0, 65504.0, -1.0 / 3.0};
    cr_assert_eq(mpq_st_write(w, "v.f64", MPQ_DT_F64, 1, &one, d, sizeof d, &e), MPQ_OK);
    const int32_t ints[7] = {1, 2, 3, -4, 5, 6, 7};
    cr_assert_eq(mpq_st_write(w, "v.i32", MPQ_DT_I32, 1, &one, ints, sizeof ints, &e), MPQ_OK);
    const float s = 4.5f;
    cr_assert_eq(mpq_st_write(w, "scalar", MPQ_DT_F32, 0, NULL, &s, 4, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write(w, "empty", MPQ_DT_F16, 1, (const uint64_t[]){0}, NULL, 0, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_meta(w, "format", "pt", &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_meta(w, "note", "UTF-8 \xc3\xa9t\xc3\xa9 \"quoted\"\n", &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(count_files(tmpdir), 1, "no temporary file is left behind");

    size_t fn;
    uint8_t *raw = slurp(path, &fn);
    uint64_t hl = tc_u64(raw);
    cr_assert_eq((8 + hl) % 8, 0, "header padded to 8 bytes");
    corpus_save(raw, fn);

    mpq_st_file *f;
    cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_count(f), 7);
    cr_assert_str_eq(mpq_st_at(f, 0)->name, "w.f32"); /* header order is write order */
    cr_assert_str_eq(mpq_st_at(f, 6)->name, "empty");
    cr_assert_str_eq(mpq_st_meta(f, "format"), "pt");
    cr_assert_str_eq(mpq_st_meta(f, "note"), "UTF-8 \xc3\xa9t\xc3\xa9 \"quoted\"\n");
    cr_assert_null(mpq_st_meta(f, "nope"));
    cr_assert_null(mpq_st_meta(f, "mpq.version"), "no packed matrix, no convention mark");
    cr_assert_null(mpq_st_find(f, "missing"));
    float *y = malloc(sizeof(float) * m * n);
    const mpq_st_tensor *t = mpq_st_find(f, "w.f32");
    cr_assert_eq(t->ndim, 2);
    cr_assert_eq(t->shape[0], (uint64_t)m);
    cr_assert_eq(t->shape[1], (uint64_t)n);
    cr_assert_eq(mpq_st_read_f32(f, t, y, (size_t)m * n, &e), MPQ_OK);
    cr_assert_eq(memcmp(x, y, sizeof(float) * m * n), 0);
    cr_assert_eq(mpq_st_read_f32(f, mpq_st_find(f, "w.f16"), y, (size_t)m * n, &e), MPQ_OK);
    for (int k = 0; k < m * n; k++) {
        const double want = tc_half(mpq_f32_to_f16_soft(x[k]));
        cr_assert(y[k] == want || (isinf(want) && isinf(y[k])), "%d: %g %g", k, y[k], want);
    }
    cr_assert(isinf(y[0]));
    cr_assert_eq(mpq_st_read_f32(f, mpq_st_find(f, "w.bf16"), y, (size_t)m * n, &e), MPQ_OK);
    for (int k = 0; k < m * n; k++) cr_assert_eq(y[k], mpq_bf16_to_f32(ref_bf16(x[k])));
    cr_assert_eq(mpq_st_read_f32(f, mpq_st_find(f, "v.f64"), y, 7, &e), MPQ_OK);
    for (int k = 0; k < 7; k++) cr_assert_eq(y[k], (float)d[k]);
    cr_assert(isinf(y[2]));
    int32_t back[7];
    cr_assert_eq(mpq_st_read(f, mpq_st_find(f, "v.i32"), back, sizeof back, &e), MPQ_OK);
    cr_assert_eq(memcmp(back, ints, sizeof ints), 0);
    t = mpq_st_find(f, "scalar");
    cr_assert_eq(t->ndim, 0);
    cr_assert_eq(t->numel, 1);
    cr_assert_eq(mpq_st_read_f32(f, t, y, 1, &e), MPQ_OK);
    cr_assert_eq(y[0], 4.5f);
    cr_assert_eq(mpq_st_find(f, "empty")->numel, 0);
    cr_assert_eq(mpq_st_read_f32(f, mpq_st_find(f, "empty"), y, 0, &e), MPQ_OK);

    /* what a caller gets wrong is named, and nothing is written */
    y[0] = 123.0f;
    cr_assert_eq(mpq_st_read_f32(f, mpq_st_find(f, "v.i32"), y, 7, &e), MPQ_ERR_ARG);
    cr_assert(strstr(e.msg, "v.i32") && strstr(e.msg, "I32"), "%s", e.msg);
    cr_assert_eq(mpq_st_read_f32(f, mpq_st_find(f, "w.f32"), y, 5, &e), MPQ_ERR_SIZE);
    cr_assert(strstr(e.msg, path) && strstr(e.msg, "w.f32"), "%s", e.msg);
    cr_assert_eq(mpq_st_read(f, mpq_st_find(f, "v.i32"), back, 27, &e), MPQ_ERR_SIZE);
    cr_assert_eq(y[0], 123.0f);
    mpq_packed A;
    cr_assert_eq(mpq_st_read_packed(f, "w.f32", &A, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_st_read_packed(f, "missing", &A, &e), MPQ_ERR_ARG);
    cr_assert(strstr(e.msg, "missing") && strstr(e.msg, "no such tensor"), "%s", e.msg);
    mpq_st_close(f);

    /* the same bytes from memory */
    cr_assert_eq(mpq_st_open_memory(raw, fn, &f, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_read_f32(f, mpq_st_find(f, "w.f32"), y, (size_t)m * n, &e), MPQ_OK);
    cr_assert_eq(memcmp(x, y, sizeof(float) * m * n), 0);
    mpq_st_close(f);
    free(raw), free(x), free(y);
}

/* ---- packed matrices ---------------------------------------------------- */

Test(io, packed_matrices_round_trip_bit_exact, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/packed.safetensors", tmpdir);
    /* every format and optional section, at awkward sizes */
    static const int cfg[][8] = {
        /* m, n, format, mixed, perms, scales, sparse */
        {16, 64, MPQ_FORMAT_BITPLANE, 0, 0, 0, 0},   {37, 200, MPQ_FORMAT_BITPLANE, 1, 0, 0, 0},
        {50, 130, MPQ_FORMAT_BITPLANE, 1, 1, 1, 0},  {33, 96, MPQ_FORMAT_BITPLANE, 1, 1, 1, 1},
        {20, 70, MPQ_FORMAT_MXINT, 0, 0, 0, 0},      {45, 161, MPQ_FORMAT_MXINT, 1, 1, 1, 1},
        {3, 65600, MPQ_FORMAT_BITPLANE, 0, 0, 0, 1}, /* 32-bit sparse column indices */
    };
    const int nc = sizeof cfg / sizeof cfg[0];
    pk P[sizeof cfg / sizeof cfg[0]];
    mpq_io_err e;
    mpq_st_writer *w;
    cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK);
    char name[64];
    for (int c = 0; c < nc; c++) {
        pk_make(&P[c], cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], cfg[c][5], cfg[c][6], 100 + (uint64_t)c);
        snprintf(name, sizeof name, "model.layers.%d.mlp.weight", c);
        cr_assert_eq(mpq_st_write_packed(w, name, &P[c].A, &e), MPQ_OK, "%s", e.msg);
    }
    const float norm[5] = {1, 2, 3, 4, 5};
    cr_assert_eq(mpq_st_write_f32(w, "norm", MPQ_DT_F32, 1, (const uint64_t[]){5}, norm, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_packed(w, "model.layers.0.mlp.weight", &P[0].A, &e), MPQ_ERR_ARG, "name twice");
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);

    mpq_st_file *f;
    cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK, "%s", e.msg);
    cr_assert_str_eq(mpq_st_meta(f, "mpq.version"), "1");
    for (int c = 0; c < nc; c++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.weight", c);
        const mpq_st_tensor *t = mpq_st_find(f, name);
        cr_assert_not_null(t);
        cr_assert_eq(t->packed, cfg[c][2]);
        cr_assert_eq(t->dtype, MPQ_DT_U8);
        cr_assert_eq(t->shape[0], (uint64_t)P[c].A.bytes);
        mpq_packed B;
        cr_assert_eq(mpq_st_read_packed(f, name, &B, &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(B.bytes, P[c].A.bytes);
        cr_assert_eq(memcmp(B.buf, P[c].A.buf, B.bytes), 0, "bit-exact");
        cr_assert_eq((uintptr_t)B.buf % 64, 0);
        cr_assert_eq(B.rows, cfg[c][0]);
        cr_assert_eq(B.cols, cfg[c][1]);
        cr_assert_eq(!!B.sp_row_ptr, cfg[c][6]);
        same_products(&P[c].A, &B);
        /* the metadata a reader in another language would use */
        char key[128], want[64];
        snprintf(key, sizeof key, "mpq.%s.shape", name);
        snprintf(want, sizeof want, "%d,%d", cfg[c][0], cfg[c][1]);
        cr_assert_str_eq(mpq_st_meta(f, key), want);
        snprintf(key, sizeof key, "mpq.%s.bpw", name);
        cr_assert_float_eq(atof(mpq_st_meta(f, key)), mpq_packed_bpw(&B, 2), 1e-6);
        snprintf(key, sizeof key, "mpq.%s.sections", name);
        const char *sec = mpq_st_meta(f, key);
        cr_assert(strstr(sec, "bits:128:") == sec, "%s", sec);
        if (cfg[c][4]) {
            const char *pr = strstr(sec, "p_row:");
            cr_assert_not_null(pr);
            size_t off = strtoul(pr + 6, NULL, 10);
            cr_assert_eq(memcmp((const uint8_t *)B.buf + off, P[c].pr, 4 * (size_t)cfg[c][0]), 0);
        }
        mpq_packed_free(&B);
        /* in place: a view into the mapping where the matrix lies on a 64-byte boundary (the first, at the
           start of the data, always does; the others where the sizes before them add up to multiples of 64),
           else a copy; the same bytes either way */
        const void *mapped;
        cr_assert_eq(mpq_st_map(f, t, &mapped, &e), MPQ_OK, "%s", e.msg);
        cr_assert(c > 0 || (uintptr_t)mapped % 64 == 0, "the data starts on a 64-byte boundary");
        cr_assert_eq(mpq_st_map_packed(f, name, &B, &e), MPQ_OK, "%s", e.msg);
        if ((uintptr_t)mapped % 64 == 0)
            cr_assert(B.buf == mapped && !B.owned, "%s used in place", name);
        else
            cr_assert(B.buf != mapped && B.owned && (uintptr_t)B.buf % 64 == 0, "%s copied", name);
        cr_assert_eq(memcmp(B.buf, P[c].A.buf, B.bytes), 0);
        same_products(&P[c].A, &B);
        mpq_packed_free(&B); /* a view: frees nothing */
    }
    mpq_st_close(f);
    /* a tensor of 20 bytes before a packed matrix: that one is read into a buffer of its own */
    cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_f32(w, "norm", MPQ_DT_F32, 1, (const uint64_t[]){5}, norm, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_packed(w, "w", &P[1].A, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK, "%s", e.msg);
    mpq_packed B;
    cr_assert_eq(mpq_st_map_packed(f, "w", &B, &e), MPQ_OK, "%s", e.msg);
    cr_assert(B.owned && (uintptr_t)B.buf % 64 == 0, "misaligned in the file: copied");
    cr_assert_eq(memcmp(B.buf, P[1].A.buf, B.bytes), 0);
    same_products(&P[1].A, &B);
    mpq_packed_free(&B);
    cr_assert_eq(mpq_st_map_packed(f, "norm", &B, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_st_map_packed(f, "nothing", &B, &e), MPQ_ERR_ARG);
    mpq_st_close(f);
    for (int c = 0; c < nc; c++) pk_free(&P[c]);
}

/* A file written by mpq 0.1.0 (format version 1, before rotations; made by
   test/data/make_packed_v1.c) opens and multiplies as it did then. */
Test(io, packed_files_of_version_1_open_and_multiply_as_before)
{
    const char *root = getenv("MPQ_SOURCE_ROOT");
    cr_assert(root && *root, "MPQ_SOURCE_ROOT is not set");
    char path[1024];
    snprintf(path, sizeof path, "%s/test/data/packed_v1.safetensors", root);
    mpq_st_file *f;
    mpq_io_err e;
    cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK, "%s", e.msg);
    static const char *const names[] = {"mixed", "mxint", "uniform"};
    for (int k = 0; k < 3; k++) {
        mpq_packed A;
        cr_assert_eq(mpq_st_read_packed(f, names[k], &A, &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(tc_u32((const uint8_t *)A.buf + 8), 1, "version 1");
        cr_assert_eq(A.rot.n, 0);
        char key[64];
        snprintf(key, sizeof key, "%s.x", names[k]);
        const mpq_st_tensor *tx = mpq_st_find(f, key);
        snprintf(key, sizeof key, "%s.y", names[k]);
        const mpq_st_tensor *ty = mpq_st_find(f, key);
        cr_assert(tx && ty && ty->dtype == MPQ_DT_F64);
        const int batch = (int)tx->shape[0];
        cr_assert_eq(tx->shape[1], (uint64_t)A.cols);
        float *x = malloc(sizeof(float) * tx->numel), *y = malloc(sizeof(float) * ty->numel);
        double *want = malloc(sizeof(double) * ty->numel), *ref = malloc(sizeof(double) * ty->numel);
        double *mag = malloc(sizeof(double) * ty->numel);
        cr_assert_eq(mpq_st_read_f32(f, tx, x, tx->numel, &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(mpq_st_read(f, ty, want, sizeof(double) * ty->numel, &e), MPQ_OK, "%s", e.msg);
        /* the float64 reference as it was then (exact on x86-64; FMA contraction elsewhere may move the last bits) */
        cr_assert_eq(mpq_gemv_ref(&A, x, ref, batch, 0), MPQ_OK);
        for (size_t i = 0; i < ty->numel; i++)
            cr_assert(fabs(ref[i] - want[i]) <= 1e-12 * fabs(want[i]) + 1e-300, "%s y[%zu]: %.17g, then %.17g",
                      names[k], i, ref[i], want[i]);
        /* every path against the independent reader of the layout */
        tc_mat M;
        tc_decode(A.buf, &M);
        tc_gemv(&M, x, batch, 0, ref, mag);
        tc_gemv_every_path(&A, &M, x, batch, 0, y, ref, mag);
        tc_free(&M);
        free(x), free(y), free(want), free(ref), free(mag);
        mpq_packed_free(&A);
    }
    mpq_st_close(f);
}

/* A matrix with a rotation round-trips through a file: the section is listed
   in the metadata, and the product is the same. */
Test(io, packed_matrices_with_a_rotation_round_trip, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/rot.safetensors", tmpdir);
    enum { R = 40, C = 576 };
    synth_rng g = {12};
    float *W = malloc(sizeof(float) * R * C);
    synth_weights(&g, W, R, C);
    mpq_rotation r;
    cr_assert_eq(mpq_rotation_init(&r, C, 99), MPQ_OK);
    mpq_bitplane_desc d = {0};
    d.rows = R, d.cols = C, d.uniform_bits = 3, d.rotation = &r;
    mpq_packed A, B;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    mpq_io_err e;
    mpq_st_writer *w;
    cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_packed(w, "q_proj", &A, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);
    size_t fn;
    uint8_t *raw = slurp(path, &fn);
    corpus_save(raw, fn); /* the fuzzer starts from a rotated matrix too */
    free(raw);
    mpq_st_file *f;
    cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_read_packed(f, "q_proj", &B, &e), MPQ_OK, "%s", e.msg);
    cr_assert(B.bytes == A.bytes && !memcmp(B.buf, A.buf, A.bytes));
    cr_assert(B.rot.n == C && B.rot.m == 9 && B.rot.seed == 99);
    const char *sec = mpq_st_meta(f, "mpq.q_proj.sections");
    char want[64];
    snprintf(want, sizeof want, "rotation:%zu:%d ", (size_t)((const uint8_t *)A.rot.R - (const uint8_t *)A.buf) - 64,
             64 + 4 * 81 + C / 8);
    cr_assert_not_null(strstr(sec, want), "%s", sec);
    same_products(&A, &B);
    mpq_st_close(f);
    mpq_packed_free(&A), mpq_packed_free(&B), mpq_rotation_free(&r);
    free(W);
}

/* ---- writer: atomic replacement, errors ----------------------------------- */

Test(io, writer_is_atomic_and_checks_its_input, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/out.safetensors", tmpdir);
    spit(path, "old", 3);
    mpq_io_err e;
    mpq_st_writer *w;
    cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK);
    const float v[4] = {1, 2, 3, 4};
    const uint64_t four = 4, two[2] = {2, 2};
    cr_assert_eq(mpq_st_write_f32(w, "a", MPQ_DT_F32, 1, &four, v, &e), MPQ_OK);
    /* until close, the old file is untouched and nothing else is visible */
    size_t n;
    uint8_t *b = slurp(path, &n);
    cr_assert_eq(n, 3);
    free(b);
    cr_assert_eq(count_files(tmpdir), 1, "the spool file is unlinked");
    /* bad calls change nothing */
    cr_assert_eq(mpq_st_write_f32(w, "a", MPQ_DT_F32, 1, &four, v, &e), MPQ_ERR_ARG);
    cr_assert(strstr(e.msg, "written twice"), "%s", e.msg);
    cr_assert_eq(mpq_st_write_f32(w, "", MPQ_DT_F32, 1, &four, v, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_st_write_f32(w, "bad\xff", MPQ_DT_F32, 1, &four, v, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_st_write_f32(w, "__metadata__", MPQ_DT_F32, 1, &four, v, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_st_write_f32(w, "i", MPQ_DT_I32, 1, &four, v, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_st_write(w, "b", MPQ_DT_F32, 2, two, v, 12, &e), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_st_write(w, "b", MPQ_DT_F32, 9, two, v, 16, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_st_write(w, "b", (mpq_dtype)99, 2, two, v, 16, &e), MPQ_ERR_ARG);
    const uint64_t huge[2] = {1ull << 40, 1ull << 40};
    cr_assert_eq(mpq_st_write(w, "b", MPQ_DT_F32, 2, huge, v, 16, &e), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_st_write_meta(w, "mpq.version", "9", &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_st_write_meta(w, "k", "\xc0\x80", &e), MPQ_ERR_ARG, "overlong UTF-8");
    cr_assert_eq(mpq_st_write_meta(w, "k", "v", &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_meta(w, "k", "v", &e), MPQ_ERR_ARG);
    mpq_packed none;
    memset(&none, 0, sizeof none);
    cr_assert_eq(mpq_st_write_packed(w, "p", &none, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_st_write(w, "b", MPQ_DT_F32, 2, two, v, 16, &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(count_files(tmpdir), 1);
    mpq_st_file *f;
    cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_count(f), 2, "only the good tensors");
    mpq_st_close(f);

    /* abort leaves the old file and no temporary */
    cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_f32(w, "c", MPQ_DT_F32, 1, &four, v, &e), MPQ_OK);
    mpq_st_writer_abort(w);
    cr_assert_eq(count_files(tmpdir), 1);
    cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK);
    cr_assert_not_null(mpq_st_find(f, "a"));
    mpq_st_close(f);

    /* a directory that does not exist: an I/O error naming the file */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.safetensors", tmpdir);
    cr_assert_eq(mpq_st_writer_open(bad, &w, &e), MPQ_ERR_IO);
    cr_assert(strstr(e.msg, bad), "%s", e.msg);
    cr_assert_eq(mpq_st_open(bad, &f, &e), MPQ_ERR_IO);
    cr_assert(strstr(e.msg, "cannot open"), "%s", e.msg);
    cr_assert_eq(mpq_st_open(tmpdir, &f, &e), MPQ_ERR_IO, "a directory is not a file");
}

/* ---- hostile files -------------------------------------------------------- */

/* Opens `b` from memory and from a file; both must fail with `want` and a
   message holding `needle`. */
static void expect_reject(const uint8_t *b, size_t n, mpq_status want, const char *needle, const char *what)
{
    corpus_save(b, n);
    mpq_io_err e;
    mpq_st_file *f = NULL;
    memset(&e, 0, sizeof e);
    mpq_status st = mpq_st_open_memory(b, n, &f, &e);
    cr_assert_eq(st, want, "%s: status %d (%s)", what, st, e.msg);
    cr_assert_null(f);
    cr_assert(strstr(e.msg, needle), "%s: message '%s' lacks '%s'", what, e.msg, needle);
    char path[512];
    snprintf(path, sizeof path, "%s/hostile.safetensors", tmpdir);
    spit(path, b, n);
    st = mpq_st_open(path, &f, &e);
    cr_assert_eq(st, want, "%s (file): %d %s", what, st, e.msg);
    cr_assert(strstr(e.msg, path), "%s: message names the file: %s", what, e.msg);
}

static void reject_json(const char *json, size_t data, const char *needle, const char *what)
{
    uint8_t *d = calloc(data + 1, 1);
    size_t n;
    uint8_t *b = craft(json, UINT64_MAX, d, data, &n);
    expect_reject(b, n, MPQ_ERR_FORMAT, needle, what);
    free(b), free(d);
}

#define T1 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

/* Room reserved for the header: the file has the tensors, the metadata and
   the reserved size (the header padded with spaces, the data on a 64-byte
   boundary) when the header fits,
   or the plain layout when it does not (the copy); either reads back the
   same; reserving after a tensor is refused; nothing is left beside it. */
Test(io, writer_with_room_for_the_header_gives_the_same_tensors, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/r.safetensors", tmpdir);
    const float v[6] = {1, -2, 3.5f, 4, 5, 6};
    const uint64_t sh[2] = {2, 3};
    mpq_io_err e;
    for (int room = 0; room < 3; room++) { /* none, too little, enough */
        const uint64_t want[3] = {0, 8, 4096};
        mpq_st_writer *w;
        cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK, "%s", e.msg);
        if (room) cr_assert_eq(mpq_st_writer_reserve(w, want[room], &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(mpq_st_write_f32(w, "a", MPQ_DT_F32, 2, sh, v, &e), MPQ_OK);
        cr_assert_eq(mpq_st_writer_reserve(w, 64, &e), MPQ_ERR_ARG, "after a tensor");
        cr_assert_eq(mpq_st_write_f32(w, "b", MPQ_DT_BF16, 2, sh, v, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_meta(w, "k", "v", &e), MPQ_OK);
        cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(count_files(tmpdir), 1, "room %d: only the file", room);
        size_t n;
        uint8_t *b = slurp(path, &n);
        uint64_t hl = 0;
        for (int i = 0; i < 8; i++) hl |= (uint64_t)b[i] << (8 * i);
        cr_assert_eq(n, 8 + hl + 24 + 12);
#ifdef __linux__
        if (room == 2) cr_assert_eq(8 + hl, 4160, "the header fills the room (8 + 4096, to a multiple of 64)");
#endif
        cr_assert_eq((8 + hl) % 64, 0, "room %d: the data on a 64-byte boundary", room);
        free(b);
        mpq_st_file *f;
        cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK, "room %d: %s", room, e.msg);
        float got[6];
        cr_assert_eq(mpq_st_read_f32(f, mpq_st_find(f, "a"), got, 6, &e), MPQ_OK);
        cr_assert(!memcmp(got, v, sizeof v));
        cr_assert_eq(mpq_st_read_f32(f, mpq_st_find(f, "b"), got, 6, &e), MPQ_OK);
        for (int i = 0; i < 6; i++) cr_assert_eq(got[i], v[i]); /* exact in bf16 */
        cr_assert_str_eq(mpq_st_meta(f, "k"), "v");
        mpq_st_close(f);
    }
    cr_assert_eq(mpq_st_writer_reserve(NULL, 8, &e), MPQ_ERR_ARG);
}

Test(io, hostile_headers_are_rejected_with_a_reason, .init = make_tmpdir, .fini = remove_tmpdir)
{
    size_t n;
    uint8_t *b;
    /* sizes */
    b = craft("{" T1 "}", 1000, "01234567", 8, &n);
    expect_reject(b, n, MPQ_ERR_FORMAT, "larger than the file", "header length past the end");
    free(b);
    b = craft("{" T1 "}", (uint64_t)MPQ_ST_MAX_HEADER + 1, "01234567", 8, &n);
    expect_reject(b, n, MPQ_ERR_FORMAT, "exceeds the limit", "header length over the limit");
    free(b);
    b = craft("{" T1 "}", UINT64_MAX - 3, "01234567", 8, &n);
    expect_reject(b, n, MPQ_ERR_FORMAT, "exceeds the limit", "header length near 2^64");
    free(b);
    expect_reject((const uint8_t *)"\x02\0\0\0", 4, MPQ_ERR_FORMAT, "too short", "4-byte file");
    /* other files under a .safetensors name: an impossible header length and no '{' after it */
    static const char text[] = "These are notes about a model, not tensors.\n";
    expect_reject((const uint8_t *)text, sizeof text - 1, MPQ_ERR_FORMAT, "not a safetensors file", "a text file");
    static const uint8_t gguf[16] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
    expect_reject(gguf, sizeof gguf, MPQ_ERR_FORMAT, "not a safetensors file", "a GGUF file");
    expect_reject((const uint8_t *)"\xff\xff\xff\xff\xff\xff\xff\xff", 8, MPQ_ERR_FORMAT, "exceeds the limit",
                  "a length and nothing after it");
    b = craft("", 0, NULL, 0, &n);
    expect_reject(b, n, MPQ_ERR_FORMAT, "start with '{'", "empty header");
    free(b);
    /* text */
    reject_json("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "UTF-8", "invalid byte");
    reject_json("{\"a\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "UTF-8", "overlong");
    reject_json("{\"a\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "UTF-8",
                "surrogate");
    reject_json("{\"a\xe2\x82\":{}}", 8, "UTF-8", "truncated sequence");
    b = craft("{" T1 "}", UINT64_MAX, "01234567", 8, &n);
    b[8 + 2] = 0; /* a raw NUL inside the name */
    expect_reject(b, n, MPQ_ERR_FORMAT, "UTF-8", "raw NUL");
    free(b);
    reject_json("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "NUL", "escaped NUL");
    reject_json("{" T1, 8, "not valid JSON", "unterminated object");
    reject_json("{\"a\":{\"dtype\":\"F32", 8, "not valid JSON", "unterminated string");
    reject_json("{" T1 "} x", 8, "after its JSON", "trailing garbage");
    reject_json("{" T1 "}{}", 8, "after its JSON", "two objects");
    reject_json(" {" T1 "}", 8, "start with '{'", "leading space");
    reject_json("[1,2]", 0, "start with '{'", "array");
    {
        char deep[4000];
        int k = 0;
        deep[k++] = '{', deep[k++] = '"', deep[k++] = 'a', deep[k++] = '"', deep[k++] = ':';
        for (int i = 0; i < 1500; i++) deep[k++] = '[';
        deep[k] = 0;
        reject_json(deep, 0, "not valid JSON", "nesting deeper than the parser allows");
    }
    /* names */
    reject_json("{" T1 "," T1 "}", 8, "appears twice", "duplicate tensor");
    reject_json("{\"__metadata__\":{},\"__metadata__\":{}," T1 "}", 8, "appears twice", "duplicate __metadata__");
    reject_json("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}," T1 "}", 8, "appears twice", "duplicate metadata key");
    reject_json("{\"__metadata__\":{\"k\":1}," T1 "}", 8, "not a string", "metadata number");
    reject_json("{\"__metadata__\":[]," T1 "}", 8, "not a JSON object", "metadata array");
    /* entries */
    reject_json("{\"a\":[]}", 0, "not a JSON object", "entry array");
    reject_json("{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype", "dtype");
    reject_json("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype", "dtype number");
    reject_json("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "missing field 'dtype'", "no dtype");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "missing field 'shape'", "no shape");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "missing field 'data_offsets'", "no offsets");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, "unknown field",
                "extra field");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "twice",
                "field twice");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "not an array", "shape number");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "dimension 0", "negative dim");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,10]}}", 10, "dimension 0",
                "fractional dim");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "dimension 0", "string dim");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,8]}}", 8, "dimension 0", "dim 1e300");
    reject_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[9007199254740993],\"data_offsets\":[0,8]}}", 8, "dimension 0",
                "dim 2^53+1");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, "dimensions",
                "9 dims");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflows",
                "element count overflow");
    reject_json("{\"a\":{\"dtype\":\"F64\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,8]}}", 8, "overflows",
                "byte count overflow");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets", "one offset");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8, "data_offsets",
                "three offsets");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "before begin", "end < begin");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "need 12", "bytes vs shape");
    reject_json("{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "need 4", "bytes vs dtype");
    /* layout */
    reject_json("{" T1 "}", 16, "file holds 16", "trailing data bytes");
    reject_json("{" T1 "}", 4, "file holds 4", "offsets past the data");
    reject_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "gap", "gap at the start");
    reject_json("{" T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap", "overlap");
    reject_json("{" T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "overlap", "same range");
    reject_json("{" T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}", 16, "gap", "gap between");
    /* packed-file metadata */
    reject_json("{\"__metadata__\":{\"mpq.b.format\":\"bitplane\"}," T1 "}", 8, "no such tensor",
                "mark without tensor");
    reject_json("{\"__metadata__\":{\"mpq.a.format\":\"bitplane\"}," T1 "}", 8, "needs U8", "mark on F32");
    reject_json(
        "{\"__metadata__\":{\"mpq.a.format\":\"int3\"},\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
        8, "unknown packed format", "unknown format");
    reject_json("{\"__metadata__\":{\"mpq.version\":\"2\"}," T1 "}", 8, "mpq.version", "future version");

    /* the good one opens, with zero-size tensors anywhere in the order */
    b = craft("{\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[8,8]}," T1
              ",\"y\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[8,9]}}   ",
              UINT64_MAX, "012345678", 9, &n);
    corpus_save(b, n);
    mpq_st_file *f;
    mpq_io_err e;
    cr_assert_eq(mpq_st_open_memory(b, n, &f, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_count(f), 3);
    mpq_st_close(f);
    free(b);
}

/* A valid file holding one packed matrix, as bytes. */
static uint8_t *packed_file(const char *dir, size_t *n, pk *P)
{
    char path[512];
    snprintf(path, sizeof path, "%s/one.safetensors", dir);
    pk_make(P, 21, 70, MPQ_FORMAT_BITPLANE, 1, 1, 1, 1, 9);
    mpq_io_err e;
    mpq_st_writer *w;
    cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_packed(w, "w", &P->A, &e), MPQ_OK);
    const float v[3] = {1, 2, 3};
    cr_assert_eq(mpq_st_write_f32(w, "v", MPQ_DT_F16, 1, (const uint64_t[]){3}, v, &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK);
    uint8_t *b = slurp(path, n);
    unlink(path);
    return b;
}

/* Replace the first `from` in the header with `to` (same length). */
static void patch(uint8_t *b, const char *from, const char *to)
{
    const uint64_t hl = tc_u64(b);
    const size_t fl = strlen(from);
    cr_assert_eq(fl, strlen(to));
    for (uint64_t i = 8; i + fl <= 8 + hl; i++)
        if (memcmp(b + i, from, fl) == 0) {
            memcpy(b + i, to, fl);
            return;
        }
    cr_assert_fail("'%s' not in the header", from);
}

static void expect_packed_reject(const uint8_t *b, size_t n, const char *needle, const char *what)
{
    corpus_save(b, n);
    mpq_io_err e;
    mpq_st_file *f;
    mpq_status st = mpq_st_open_memory(b, n, &f, &e);
    if (st != MPQ_OK) {
        cr_assert_eq(st, MPQ_ERR_FORMAT, "%s", what);
        cr_assert(strstr(e.msg, needle), "%s: %s", what, e.msg);
        return;
    }
    mpq_packed A;
    st = mpq_st_read_packed(f, "w", &A, &e);
    cr_assert_eq(st, MPQ_ERR_FORMAT, "%s: %d %s", what, st, e.msg);
    cr_assert(strstr(e.msg, needle) && strstr(e.msg, "'w'"), "%s: message '%s' lacks '%s'", what, e.msg, needle);
    mpq_st_close(f);
    /* in place (from a 64-byte aligned copy, so that the matrix is used where it lies): the same checks */
    uint8_t *al = aligned_alloc(64, (n + 63) / 64 * 64);
    memcpy(al, b, n);
    cr_assert_eq(mpq_st_open_memory(al, n, &f, &e), MPQ_OK);
    st = mpq_st_map_packed(f, "w", &A, &e);
    cr_assert_eq(st, MPQ_ERR_FORMAT, "%s in place: %d %s", what, st, e.msg);
    cr_assert(strstr(e.msg, needle) && strstr(e.msg, "'w'"), "%s in place: '%s' lacks '%s'", what, e.msg, needle);
    mpq_st_close(f);
    free(al);
}

Test(io, wrong_packed_metadata_is_rejected, .init = make_tmpdir, .fini = remove_tmpdir)
{
    pk P;
    size_t n;
    uint8_t *good = packed_file(tmpdir, &n, &P);
    corpus_save(good, n);
    uint8_t *b = malloc(n);
    struct {
        const char *from, *to, *needle, *what;
    } cases[] = {
        {"\"21,70\"", "\"21,71\"", "shape", "shape"},
        {"\"21,70\"", "\"12,70\"", "shape", "rows"},
        {"w.group\":\"64\"", "w.group\":\"32\"", "group", "group"},
        {"w.block_rows\":\"16\"", "w.block_rows\":\"17\"", "block_rows", "block_rows"},
        {"\"bitplane\"", "\"mxint\"   ", "mxint", "format"},
        {"p_row:", "p_rpw:", "sections", "section name"},
        {".bpw\"", ".bpv\"", "bpw is missing", "bpw missing"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(b, good, n);
        patch(b, cases[c].from, cases[c].to);
        expect_packed_reject(b, n, cases[c].needle, cases[c].what);
    }
    /* the bpw value, one digit changed */
    memcpy(b, good, n);
    {
        const uint64_t hl = tc_u64(b);
        char *h = malloc(hl + 1);
        memcpy(h, b + 8, hl);
        h[hl] = 0;
        char *p = strstr(h, "w.bpw\":\"");
        cr_assert_not_null(p);
        p += 8;
        uint8_t *q = b + 8 + (p - h) + 2;
        *q = *q == '9' ? '8' : (uint8_t)(*q + 1);
        free(h);
    }
    expect_packed_reject(b, n, "bpw", "bpw value");
    /* the packed bytes themselves: the magic, the header's row count */
    const uint64_t data = 8 + tc_u64(good);
    memcpy(b, good, n);
    b[data] ^= 0x20;
    expect_packed_reject(b, n, "rejected", "magic");
    free(b);
    free(good);
    pk_free(&P);
}

Test(io, truncations_and_random_corruption_never_crash, .init = make_tmpdir, .fini = remove_tmpdir)
{
    pk P;
    size_t n;
    uint8_t *good = packed_file(tmpdir, &n, &P);
    mpq_io_err e;
    mpq_st_file *f;
    for (size_t k = 0; k < n; k++) {
        cr_assert_neq(mpq_st_open_memory(good, k, &f, &e), MPQ_OK, "prefix of %zu bytes", k);
    }
    cr_assert_eq(mpq_st_open_memory(good, n, &f, &e), MPQ_OK);
    mpq_st_close(f);
    /* random byte changes: whatever opens must read without trouble */
    synth_rng r = {2024};
    uint8_t *b = malloc(n);
    int opened = 0, packed_ok = 0;
    float vals[3];
    for (int it = 0; it < 3000; it++) {
        memcpy(b, good, n);
        const int flips = 1 + synth_int(&r, 4);
        const uint64_t hl = tc_u64(good);
        for (int k = 0; k < flips; k++) {
            /* mostly the header, where parsing decisions are made */
            size_t at = synth_int(&r, 4) ? 8 + (size_t)synth_int(&r, (int)hl) : (size_t)synth_int(&r, (int)n);
            b[at] = (uint8_t)synth_u64(&r);
        }
        if (mpq_st_open_memory(b, n, &f, &e) != MPQ_OK) continue;
        opened++;
        const mpq_st_tensor *v = mpq_st_find(f, "v");
        if (v && v->dtype == MPQ_DT_F16 && v->numel == 3) cr_assert_eq(mpq_st_read_f32(f, v, vals, 3, &e), MPQ_OK);
        mpq_packed A;
        if (mpq_st_read_packed(f, "w", &A, &e) == MPQ_OK) {
            packed_ok++;
            float *W = malloc(sizeof(float) * (size_t)A.rows * A.cols);
            cr_assert_eq(mpq_packed_dequantize(&A, 0, W), MPQ_OK);
            free(W);
            mpq_packed_free(&A);
        }
        mpq_st_close(f);
    }
    cr_assert(opened > 0 && opened < 3000, "%d of 3000 corrupted files opened", opened);
    cr_log_info("%d of 3000 corrupted files opened, %d packed matrices still valid", opened, packed_ok);
    free(b);
    free(good);
    pk_free(&P);
}
