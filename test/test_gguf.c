/* mpq_io, GGUF: every float type read against a decoder written here from
   the block definitions (the k-quants and IQ4 element by element, from
   bit positions), the metadata of every value type, a corpus of
   hostile files (each rejected with a reason naming what is wrong), every
   truncation and random corruption; and model sources: a Hugging Face
   directory with an index and shards, and hostile indexes. With
   MPQ_FUZZ_CORPUS set to a directory, the valid and crafted files are also
   written there (the fuzz target's seeds). */
#define _XOPEN_SOURCE 700
#include "common.h"
#include "gguf_writer.h"
#include "mpq_io.h"
#include "tmpdir.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];
static void make_tmpdir(void) { cr_assert(tc_tmpdir_make(tmpdir, sizeof tmpdir, "gguf")); }
static void remove_tmpdir(void) { tc_tmpdir_remove(tmpdir); }

static int corpus_seq;

static void corpus_save(const void *b, size_t n)
{
    const char *dir = getenv("MPQ_FUZZ_CORPUS");
    if (!dir || !*dir) return;
    char p[512];
    snprintf(p, sizeof p, "%s/gguf-%ld-%04d.gguf", dir, (long)getpid(), corpus_seq++);
    FILE *f = fopen(p, "wb");
    if (f) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* ---- the block types, decoded here ------------------------------------------ */

typedef struct ttype {
    uint32_t id;
    const char *name;
    int block, size;
} ttype;

static const ttype types[] = {
    {0, "F32", 1, 4},    {1, "F16", 1, 2},    {30, "BF16", 1, 2},  {28, "F64", 1, 8},   {8, "Q8_0", 32, 34},
    {2, "Q4_0", 32, 18}, {3, "Q4_1", 32, 20}, {6, "Q5_0", 32, 22}, {7, "Q5_1", 32, 24},
};

/* A finite half of moderate size for scales (never NaN or Inf). */
static uint16_t rand_half(synth_rng *r)
{
    const uint16_t sign = (uint16_t)(synth_int(r, 2) << 15);
    return (uint16_t)(sign | (uint16_t)((8 + synth_int(r, 12)) << 10) | (uint16_t)synth_int(r, 1024));
}

/* Random bytes of n elements of a type, valid (finite) values. */
static uint8_t *make_data(const ttype *t, size_t n, synth_rng *r, size_t *bytes)
{
    *bytes = n / (size_t)t->block * (size_t)t->size;
    uint8_t *b = malloc(*bytes + 1);
    for (size_t i = 0; i < *bytes; i++) b[i] = (uint8_t)synth_u64(r);
    if (t->id == 0) {
        for (size_t i = 0; i < n; i++) ((float *)(void *)b)[i] = synth_gauss(r);
    } else if (t->id == 28) {
        for (size_t i = 0; i < n; i++) {
            double v = synth_gauss(r);
            memcpy(b + 8 * i, &v, 8);
        }
    } else if (t->id == 1 || t->id == 30) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h =
                t->id == 1 ? rand_half(r) : (uint16_t)(0x3c00 + synth_int(r, 2048) - 1024 + synth_int(r, 2) * 0x8000);
            memcpy(b + 2 * i, &h, 2);
        }
    } else { /* d (and m) first in every block */
        const int halves = t->id == 3 || t->id == 7 ? 2 : 1;
        for (size_t k = 0; k < n / 32; k++)
            for (int j = 0; j < halves; j++) {
                uint16_t h = rand_half(r);
                memcpy(b + k * (size_t)t->size + 2 * j, &h, 2);
            }
    }
    return b;
}

/* Element i of the data, from the block definitions (float64, rounded once). */
static float ref_value(const ttype *t, const uint8_t *b, size_t i)
{
    const uint8_t *blk = b + i / (size_t)t->block * (size_t)t->size;
    const int j = (int)(i % (size_t)t->block), lo = j < 16 ? j : j - 16;
    switch (t->id) {
    case 0: {
        float v;
        memcpy(&v, b + 4 * i, 4);
        return v;
    }
    case 1: return (float)tc_half(tc_u16(b + 2 * i));
    case 30: {
        uint32_t u = (uint32_t)tc_u16(b + 2 * i) << 16;
        float v;
        memcpy(&v, &u, 4);
        return v;
    }
    case 28: {
        double v;
        memcpy(&v, b + 8 * i, 8);
        return (float)v;
    }
    case 8: return (float)(tc_half(tc_u16(blk)) * (int8_t)blk[2 + j]);
    case 2: {
        const int q = j < 16 ? blk[2 + lo] & 15 : blk[2 + lo] >> 4;
        return (float)(tc_half(tc_u16(blk)) * (q - 8));
    }
    case 3: {
        const int q = j < 16 ? blk[4 + lo] & 15 : blk[4 + lo] >> 4;
        return (float)(tc_half(tc_u16(blk)) * q + tc_half(tc_u16(blk + 2)));
    }
    case 6:
    case 7: {
        const int m = t->id == 7, hb = m ? 4 : 2;
        const uint32_t qh = tc_u32(blk + hb);
        const int nib = j < 16 ? blk[hb + 4 + lo] & 15 : blk[hb + 4 + lo] >> 4;
        const int q = nib | (int)((qh >> j) & 1u) << 4;
        return (float)(tc_half(tc_u16(blk)) * (m ? q : q - 16) + (m ? tc_half(tc_u16(blk + 2)) : 0.0));
    }
    }
    return NAN;
}

Test(gguf, every_float_type_reads_as_its_blocks_define, .init = make_tmpdir, .fini = remove_tmpdir)
{
    synth_rng r = {77};
    const int nt = (int)(sizeof types / sizeof types[0]);
    uint8_t *data[16];
    size_t bytes[16];
    const uint64_t ne[2] = {96, 5}; /* 5 rows of 96: three blocks of 32 per row */
    tg_gguf g;
    tg_begin(&g);
    tg_kv_str(&g, "general.architecture", "test");
    for (int k = 0; k < nt; k++) {
        data[k] = make_data(&types[k], 96 * 5, &r, &bytes[k]);
        tg_tensor(&g, types[k].name, types[k].id, 2, ne, data[k], bytes[k]);
    }
    size_t n;
    uint8_t *file = tg_finish(&g, &n);
    corpus_save(file, n);
    char path[512];
    snprintf(path, sizeof path, "%s/types.gguf", tmpdir);
    spit(path, file, n);
    for (int from_file = 0; from_file < 2; from_file++) {
        mpq_gguf_file *f;
        mpq_io_err e;
        if (from_file)
            cr_assert_eq(mpq_gguf_open(path, &f, &e), MPQ_OK, "%s", e.msg);
        else
            cr_assert_eq(mpq_gguf_open_memory(file, n, &f, &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(mpq_gguf_version(f), 3);
        cr_assert_eq(mpq_gguf_count(f), nt);
        for (int k = 0; k < nt; k++) {
            const mpq_gguf_tensor *t = mpq_gguf_find(f, types[k].name);
            cr_assert_not_null(t);
            cr_assert_eq(t, mpq_gguf_at(f, k));
            cr_assert(t->ndim == 2 && t->ne[0] == 96 && t->ne[1] == 5 && t->numel == 480 && t->bytes == bytes[k]);
            cr_assert_str_eq(mpq_gguf_type_name(t->type), types[k].name);
            cr_assert(mpq_gguf_type_is_float(t->type));
            float v[480];
            cr_assert_eq(mpq_gguf_read_f32(f, t, v, 480, &e), MPQ_OK, "%s", e.msg);
            for (size_t i = 0; i < 480; i++) {
                const float want = ref_value(&types[k], data[k], i);
                cr_assert(v[i] == want || (isnan(v[i]) && isnan(want)), "%s element %zu: %.9g, want %.9g",
                          types[k].name, i, v[i], want);
            }
            uint8_t *raw = malloc(bytes[k]);
            cr_assert_eq(mpq_gguf_read(f, t, raw, bytes[k], &e), MPQ_OK);
            cr_assert(!memcmp(raw, data[k], bytes[k]));
            free(raw);
            /* wrong sizes change nothing */
            cr_assert_eq(mpq_gguf_read_f32(f, t, v, 479, &e), MPQ_ERR_SIZE);
            cr_assert(strstr(e.msg, types[k].name), "%s", e.msg);
        }
        mpq_gguf_close(f);
    }
    for (int k = 0; k < nt; k++) free(data[k]);
    free(file);
}

/* ---- the k-quants and IQ4, decoded here element by element ---------------- */

static const ttype ktypes[] = {
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {20, "IQ4_NL", 32, 18}, {23, "IQ4_XS", 256, 136},
};

/* Where each block keeps its fp16 scales: first offset, count. */
static void khalves(uint32_t id, int *at, int *count)
{
    *count = id == 10 || id == 12 || id == 13 ? 2 : 1;
    *at = id == 10 ? 80 : id == 11 ? 108 : id == 14 ? 208 : 0;
}

static const int iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Bits [lo, lo + n) of a little-endian byte string. */
static unsigned kbits(const uint8_t *b, int lo, int n)
{
    unsigned v = 0;
    for (int i = 0; i < n; i++) v |= (unsigned)((b[(lo + i) / 8] >> ((lo + i) % 8)) & 1) << i;
    return v;
}

/* The 6-bit scale (m = 0) or min (m = 1) of sub-block s of the 96 bits of
   Q4_K / Q5_K scales: 0-3 in bits 0-5 of bytes s (mins: s + 4); 4-7 with
   the low four bits in byte s + 4 (mins: its high nibble) and the top two
   in bits 6-7 of byte s - 4 (mins: of byte s). */
static int kscale(const uint8_t *q, int s, int m)
{
    if (s < 4) return (int)kbits(q, 8 * (s + 4 * m), 6);
    return (int)(kbits(q, 8 * (s + 4) + 4 * m, 4) | kbits(q, 8 * (s - 4 + 4 * m) + 6, 2) << 4);
}

/* Element j of a block (float64, rounded once). */
static float kref(uint32_t id, const uint8_t *b, int j)
{
    const int half = j / 128, r = j % 128;
    switch (id) {
    case 10: { /* scale and min nibbles per 16; codes: 2 bits, four shifts over 32 bytes per half */
        const int sc = b[j / 16], q = (int)kbits(b + 16 + 32 * half, 8 * (r % 32) + 2 * (r / 32), 2);
        return (float)(tc_half(tc_u16(b + 80)) * (sc & 15) * q - tc_half(tc_u16(b + 82)) * (sc >> 4));
    }
    case 11: { /* the 16 scales as ggml builds them: four little-endian words of the 12 bytes rearranged */
        const uint32_t a0 = tc_u32(b + 96), a1 = tc_u32(b + 100), t = tc_u32(b + 104);
        const uint32_t w[4] = {(a0 & 0x0f0f0f0fu) | ((t & 0x03030303u) << 4),
                               (a1 & 0x0f0f0f0fu) | (((t >> 2) & 0x03030303u) << 4),
                               ((a0 >> 4) & 0x0f0f0f0fu) | (((t >> 4) & 0x03030303u) << 4),
                               ((a1 >> 4) & 0x0f0f0f0fu) | (((t >> 6) & 0x03030303u) << 4)};
        const int s = j / 16, sc = (int)((w[s / 4] >> (8 * (s % 4))) & 0xffu) - 32;
        const int low = (int)kbits(b + 32 + 32 * half, 8 * (r % 32) + 2 * (r / 32), 2);
        const int high = (int)kbits(b, 8 * (r % 32) + 4 * half + r / 32, 1);
        return (float)(tc_half(tc_u16(b + 108)) * sc * (low - (high ? 0 : 4)));
    }
    case 12:
    case 13: { /* eight sub-blocks of 32: nibble s % 2 of 32 bytes, Q5_K's fifth bit s of qh[l] */
        const int s = j / 32, l = j % 32, five = id == 13;
        int q = (int)kbits(b + (five ? 48 : 16) + 32 * (s / 2), 8 * l + 4 * (s % 2), 4);
        if (five) q |= (int)kbits(b + 16, 8 * l + s, 1) << 4;
        return (float)(tc_half(tc_u16(b)) * kscale(b + 4, s, 0) * q - tc_half(tc_u16(b + 2)) * kscale(b + 4, s, 1));
    }
    case 14: { /* per half: quarter k of 32 takes nibble k / 2 of ql[32 (k % 2) + l], bits 2k of qh[l] */
        const int k = r / 32, l = r % 32;
        const int q = (int)(kbits(b + 64 * half + 32 * (k % 2), 8 * l + 4 * (k / 2), 4) |
                            kbits(b + 128 + 32 * half, 8 * l + 2 * k, 2) << 4) -
            32;
        return (float)(tc_half(tc_u16(b + 208)) * (int8_t)b[192 + 8 * half + 2 * k + l / 16] * q);
    }
    case 20: return (float)(tc_half(tc_u16(b)) * iq4_levels[kbits(b + 2, 8 * (j % 16) + 4 * (j / 16), 4)]);
    case 23: {
        const int s = j / 32, l = j % 32;
        const int ls = (int)(kbits(b + 4, 4 * s, 4) | kbits(b + 2, 2 * s, 2) << 4);
        return (float)(tc_half(tc_u16(b)) * (ls - 32) *
                       iq4_levels[kbits(b + 8 + 16 * s, 8 * (l % 16) + 4 * (l / 16), 4)]);
    }
    }
    return NAN;
}

Test(gguf, k_quants_and_iq4_read_as_their_blocks_define, .init = make_tmpdir, .fini = remove_tmpdir)
{
    synth_rng r = {78};
    enum { NT = (int)(sizeof ktypes / sizeof ktypes[0]), COLS = 512, ROWS = 3 };
    uint8_t *data[NT];
    size_t bytes[NT];
    const uint64_t ne[2] = {COLS, ROWS};
    tg_gguf g;
    tg_begin(&g);
    tg_kv_str(&g, "general.architecture", "test");
    for (int k = 0; k < NT; k++) {
        const ttype *t = &ktypes[k];
        bytes[k] = (size_t)COLS * ROWS / (size_t)t->block * (size_t)t->size;
        data[k] = malloc(bytes[k]);
        for (size_t i = 0; i < bytes[k]; i++) data[k][i] = (uint8_t)synth_u64(&r);
        int at, count;
        khalves(t->id, &at, &count);
        for (size_t o = 0; o < bytes[k]; o += (size_t)t->size)
            for (int h = 0; h < count; h++) {
                const uint16_t v = rand_half(&r);
                memcpy(data[k] + o + at + 2 * h, &v, 2);
            }
        tg_tensor(&g, t->name, t->id, 2, ne, data[k], bytes[k]);
    }
    size_t n;
    uint8_t *file = tg_finish(&g, &n);
    corpus_save(file, n);
    mpq_gguf_file *f;
    mpq_io_err e;
    cr_assert_eq(mpq_gguf_open_memory(file, n, &f, &e), MPQ_OK, "%s", e.msg);
    float *v = malloc(sizeof(float) * COLS * ROWS);
    for (int k = 0; k < NT; k++) {
        const ttype *t = &ktypes[k];
        const mpq_gguf_tensor *x = mpq_gguf_find(f, t->name);
        cr_assert(x && x->bytes == bytes[k] && mpq_gguf_type_is_float(x->type), "%s", t->name);
        cr_assert_str_eq(mpq_gguf_type_name(x->type), t->name);
        cr_assert_eq(mpq_gguf_read_f32(f, x, v, COLS * ROWS, &e), MPQ_OK, "%s", e.msg);
        for (int i = 0; i < COLS * ROWS; i++) {
            const float want = kref(t->id, data[k] + (size_t)(i / t->block) * t->size, i % t->block);
            cr_assert(v[i] == want, "%s element %d: %.9g, want %.9g", t->name, i, v[i], want);
        }
        free(data[k]);
    }
    free(v);
    mpq_gguf_close(f);
    free(file);
}

Test(gguf, metadata_of_every_value_type)
{
    tg_gguf g;
    tg_begin(&g);
    tg_key(&g, "u8", 0), tg_put(&g.kv, "\xfe", 1);
    tg_key(&g, "i8", 1), tg_put(&g.kv, "\xfe", 1);
    tg_key(&g, "u16", 2), tg_put(&g.kv, "\xff\xff", 2);
    tg_key(&g, "i16", 3), tg_put(&g.kv, "\xff\xff", 2);
    tg_kv_u32(&g, "u32", 4000000000u);
    tg_kv_i32(&g, "i32", -5);
    tg_kv_f32(&g, "f32", 0.25f);
    tg_kv_bool(&g, "bool", 1);
    tg_key(&g, "str", 8), tg_str(&g.kv, "a\0b", 3);
    tg_kv_u64(&g, "u64", UINT64_MAX);
    tg_kv_u64(&g, "u64ok", 123456789012345ull);
    tg_key(&g, "i64", 11), tg_u64(&g.kv, (uint64_t)-7);
    tg_kv_f64(&g, "f64", -1.5);
    const char *words[3] = {"x", "", "zz"};
    tg_kv_arr_str(&g, "words", words, 3);
    const int32_t ints[4] = {1, -2, 3, 1 << 30};
    tg_kv_arr_i32(&g, "ints", ints, 4);
    tg_key(&g, "empty", 9), tg_u32(&g.kv, 6), tg_u64(&g.kv, 0);
    size_t n;
    uint8_t *file = tg_finish(&g, &n);
    corpus_save(file, n);
    mpq_gguf_file *f;
    mpq_io_err e;
    cr_assert_eq(mpq_gguf_open_memory(file, n, &f, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_gguf_kv_count(f), 16);
    cr_assert_eq(mpq_gguf_count(f), 0);
    int64_t v;
    double d;
    const char *s;
    size_t len;
    static const struct {
        const char *key;
        int64_t want;
    } ints_want[] = {{"u8", 254},
                     {"i8", -2},
                     {"u16", 65535},
                     {"i16", -1},
                     {"u32", 4000000000ll},
                     {"i32", -5},
                     {"bool", 1},
                     {"u64ok", 123456789012345ll},
                     {"i64", -7}};
    for (size_t k = 0; k < sizeof ints_want / sizeof ints_want[0]; k++) {
        const mpq_gguf_kv *kv = mpq_gguf_kv_find(f, ints_want[k].key);
        cr_assert_not_null(kv, "%s", ints_want[k].key);
        cr_assert_eq(mpq_gguf_get_int(f, kv, 0, &v), MPQ_OK, "%s", ints_want[k].key);
        cr_assert_eq(v, ints_want[k].want, "%s: %lld", ints_want[k].key, (long long)v);
        cr_assert_eq(mpq_gguf_get_float(f, kv, 0, &d), MPQ_ERR_ARG);
        cr_assert_eq(mpq_gguf_get_int(f, kv, 1, &v), MPQ_ERR_ARG);
    }
    cr_assert_eq(mpq_gguf_get_int(f, mpq_gguf_kv_find(f, "u64"), 0, &v), MPQ_ERR_RANGE);
    cr_assert_eq(mpq_gguf_get_float(f, mpq_gguf_kv_find(f, "f32"), 0, &d), MPQ_OK);
    cr_assert_eq(d, 0.25);
    cr_assert_eq(mpq_gguf_get_float(f, mpq_gguf_kv_find(f, "f64"), 0, &d), MPQ_OK);
    cr_assert_eq(d, -1.5);
    cr_assert_eq(mpq_gguf_get_str(f, mpq_gguf_kv_find(f, "str"), 0, &s, &len), MPQ_OK);
    cr_assert(len == 3 && !memcmp(s, "a\0b", 3));
    cr_assert_eq(mpq_gguf_get_int(f, mpq_gguf_kv_find(f, "str"), 0, &v), MPQ_ERR_ARG);
    const mpq_gguf_kv *w = mpq_gguf_kv_find(f, "words");
    cr_assert(w->type == MPQ_GGUF_ARRAY && w->elem == MPQ_GGUF_STRING && w->count == 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(mpq_gguf_get_str(f, w, (uint64_t)i, &s, &len), MPQ_OK);
        cr_assert(len == strlen(words[i]) && !memcmp(s, words[i], len));
    }
    cr_assert_eq(mpq_gguf_get_str(f, w, 3, &s, &len), MPQ_ERR_ARG);
    const mpq_gguf_kv *iv = mpq_gguf_kv_find(f, "ints");
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(mpq_gguf_get_int(f, iv, (uint64_t)i, &v), MPQ_OK);
        cr_assert_eq(v, ints[i]);
    }
    cr_assert_eq(mpq_gguf_kv_find(f, "empty")->count, 0);
    cr_assert_null(mpq_gguf_kv_find(f, "missing"));
    cr_assert_eq(mpq_gguf_get_int(f, NULL, 0, &v), MPQ_ERR_ARG);
    mpq_gguf_close(f);
    free(file);
}

/* ---- hostile files ------------------------------------------------------------ */

static void expect_reject(const uint8_t *b, size_t n, const char *needle, const char *what)
{
    corpus_save(b, n);
    mpq_gguf_file *f = NULL;
    mpq_io_err e;
    memset(&e, 0, sizeof e);
    const mpq_status st = mpq_gguf_open_memory(b, n, &f, &e);
    cr_assert_eq(st, MPQ_ERR_FORMAT, "%s: status %d (%s)", what, st, e.msg);
    cr_assert_null(f);
    cr_assert(strstr(e.msg, needle), "%s: message '%s' lacks '%s'", what, e.msg, needle);
    char path[512];
    snprintf(path, sizeof path, "%s/hostile.gguf", tmpdir);
    spit(path, b, n);
    cr_assert_eq(mpq_gguf_open(path, &f, &e), MPQ_ERR_FORMAT, "%s (file): %s", what, e.msg);
    cr_assert(strstr(e.msg, path), "%s: the message names the file: %s", what, e.msg);
}

/* A file with one key "k" of raw value bytes, no tensors, and nothing after
   it (no padding: a value cut short meets the end of the file). */
static void reject_kv(uint32_t type, const void *val, size_t vn, const char *needle, const char *what)
{
    tg_gguf g;
    tg_begin(&g);
    g.align = 1;
    tg_key(&g, "k", type);
    tg_put(&g.kv, val, vn);
    size_t n;
    uint8_t *b = tg_finish(&g, &n);
    expect_reject(b, n, needle, what);
    free(b);
}

/* One tensor "t" with a raw info (after the name) and `data` bytes. */
static void reject_info(const void *info, size_t in, size_t data, const char *needle, const char *what)
{
    tg_gguf g;
    tg_begin(&g);
    tg_str(&g.info, "t", 1);
    tg_put(&g.info, info, in);
    g.nt = 1;
    uint8_t *zeros = calloc(data + 1, 1);
    tg_put(&g.data, zeros, data);
    free(zeros);
    size_t n;
    uint8_t *b = tg_finish(&g, &n);
    expect_reject(b, n, needle, what);
    free(b);
}

typedef struct info {
    uint32_t nd;
    uint64_t ne[5];
    uint32_t type;
    uint64_t off;
} info;

static size_t pack_info(const info *i, uint8_t *out)
{
    size_t k = 0;
    memcpy(out + k, &i->nd, 4), k += 4;
    for (uint32_t d = 0; d < i->nd && d < 5; d++) memcpy(out + k, &i->ne[d], 8), k += 8;
    memcpy(out + k, &i->type, 4), k += 4;
    memcpy(out + k, &i->off, 8), k += 8;
    return k;
}

static void reject_tensor(info i, size_t data, const char *needle, const char *what)
{
    uint8_t b[128];
    reject_info(b, pack_info(&i, b), data, needle, what);
}

Test(gguf, hostile_files_are_rejected_with_a_reason, .init = make_tmpdir, .fini = remove_tmpdir)
{
    /* the header */
    expect_reject((const uint8_t *)"GGUF", 4, "ends inside the header", "4 bytes");
    uint8_t h[24] = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    {
        mpq_gguf_file *f;
        mpq_io_err e;
        cr_assert_eq(mpq_gguf_open_memory(h, 24, &f, &e), MPQ_OK, "no pairs and no tensors: a valid file (%s)", e.msg);
        mpq_gguf_close(f);
    }
    h[0] = 'X';
    expect_reject(h, 24, "not a GGUF file", "magic");
    h[0] = 'G', h[4] = 4;
    expect_reject(h, 24, "version 4", "future version");
    h[4] = 1;
    expect_reject(h, 24, "version 1", "version 1 (32-bit counts)");
    h[4] = 0, h[7] = 3;
    expect_reject(h, 24, "big-endian", "big-endian");
    h[4] = 3, h[7] = 0;
    memset(h + 16, 0xff, 8);
    expect_reject(h, 24, "cannot fit", "2^64 pairs");
    memset(h + 16, 0, 8);
    memset(h + 8, 0xff, 8);
    expect_reject(h, 24, "cannot fit", "2^64 tensors");
    /* keys and values */
    reject_kv(13, "x", 1, "unknown value type 13", "value type 13");
    reject_kv(7, "\x02", 1, "neither 0 nor 1", "bool 2");
    reject_kv(4, "\x01\x02", 2, "ends inside", "short u32");
    reject_kv(8, "\xff\xff\xff\xff\xff\xff\xff\x7f", 8, "ends inside", "string length 2^63");
    reject_kv(8, "\x05\0\0\0\0\0\0\0ab", 10, "ends inside", "string longer than the rest");
    reject_kv(9, "\x09\0\0\0\x01\0\0\0\0\0\0\0", 12, "array of arrays", "nested array");
    reject_kv(9, "\x0d\0\0\0\x01\0\0\0\0\0\0\0", 12, "unknown array element type", "array of type 13");
    reject_kv(9, "\x04\0\0\0\xff\xff\xff\xff\xff\xff\xff\x0f", 12, "longer than the file", "2^60 u32 elements");
    reject_kv(9, "\x08\0\0\0\xff\xff\xff\xff\xff\xff\xff\x0f", 12, "longer than the file", "2^60 strings");
    reject_kv(9, "\x07\0\0\0\x02\0\0\0\0\0\0\0\x01\x03", 14, "neither 0 nor 1", "bool array");
    {
        tg_gguf g;
        tg_begin(&g);
        tg_str(&g.kv, "", 0), tg_u32(&g.kv, 4), tg_u32(&g.kv, 1), g.nkv = 1;
        size_t n;
        uint8_t *b = tg_finish(&g, &n);
        expect_reject(b, n, "a key of 0 bytes", "empty key");
        free(b);
        tg_begin(&g);
        tg_str(&g.kv, "a\xff", 2), tg_u32(&g.kv, 4), tg_u32(&g.kv, 1), g.nkv = 1;
        b = tg_finish(&g, &n);
        expect_reject(b, n, "not UTF-8", "key not UTF-8");
        free(b);
        tg_begin(&g);
        tg_str(&g.kv, "a\0b", 3), tg_u32(&g.kv, 4), tg_u32(&g.kv, 1), g.nkv = 1;
        b = tg_finish(&g, &n);
        expect_reject(b, n, "not UTF-8", "key with NUL");
        free(b);
        tg_begin(&g);
        tg_kv_u32(&g, "same", 1);
        tg_kv_u32(&g, "same", 2);
        b = tg_finish(&g, &n);
        expect_reject(b, n, "appears twice", "duplicate key");
        free(b);
        tg_begin(&g);
        tg_kv_u64(&g, "general.alignment", 64);
        b = tg_finish(&g, &n);
        expect_reject(b, n, "general.alignment is U64", "alignment type");
        free(b);
        tg_begin(&g);
        tg_kv_u32(&g, "general.alignment", 48);
        b = tg_finish(&g, &n);
        expect_reject(b, n, "not a power of two", "alignment 48");
        free(b);
        tg_begin(&g);
        tg_kv_u32(&g, "general.alignment", 0);
        b = tg_finish(&g, &n);
        expect_reject(b, n, "not a power of two", "alignment 0");
        free(b);
    }
    /* tensor infos */
    const info ok = {2, {32, 2}, 0, 0};
    info i = ok;
    i.nd = 0;
    reject_tensor(i, 256, "0 dimensions", "0 dims");
    i.nd = 5;
    reject_tensor(i, 256, "5 dimensions", "5 dims");
    i = ok, i.ne[1] = (uint64_t)1 << 63;
    reject_tensor(i, 256, "negative as int64", "dim 2^63");
    i = ok, i.ne[0] = (uint64_t)1 << 40, i.ne[1] = (uint64_t)1 << 40;
    reject_tensor(i, 256, "overflows", "element count 2^80");
    i = ok, i.ne[0] = (uint64_t)1 << 61, i.ne[1] = 2;
    reject_tensor(i, 256, "byte count overflows", "2^62 F32");
    i = ok, i.type = 4;
    reject_tensor(i, 256, "unknown ggml type 4", "retired type");
    i = ok, i.type = 1000;
    reject_tensor(i, 256, "unknown ggml type 1000", "type 1000");
    i = ok, i.type = 2, i.ne[0] = 48;
    reject_tensor(i, 256, "not a multiple of the Q4_0 block", "Q4_0 of 48 columns");
    i = ok, i.type = 12, i.ne[0] = 576, i.ne[1] = 1; /* SmolLM2's rows as a k-quant */
    reject_tensor(i, 4096, "not a multiple of the Q4_K block", "Q4_K of 576 columns");
    i = ok, i.type = 14, i.ne[0] = 256, i.ne[1] = 2;
    reject_tensor(i, 256, "past the end of the file", "Q6_K cut short");
    i = ok, i.off = 8;
    reject_tensor(i, 256, "not a multiple of the alignment", "offset 8");
    i = ok;
    reject_tensor(i, 100, "past the end of the file", "data cut short");
    i = ok, i.off = (uint64_t)-32;
    reject_tensor(i, 256, "past the end of the file", "offset near 2^64");
    {
        uint8_t b[128];
        const size_t k = pack_info(&ok, b);
        tg_gguf g;
        tg_begin(&g);
        for (int t = 0; t < 2; t++) tg_str(&g.info, "t", 1), tg_put(&g.info, b, k);
        g.nt = 2;
        uint8_t zeros[512] = {0};
        tg_put(&g.data, zeros, 512);
        size_t n;
        uint8_t *file = tg_finish(&g, &n);
        expect_reject(file, n, "name appears twice", "duplicate tensor");
        free(file);
        info o2 = ok;
        o2.off = 224; /* 32 x 2 floats = 256 bytes from 0: overlaps */
        const size_t k2 = pack_info(&o2, b + 64);
        tg_begin(&g);
        tg_str(&g.info, "a", 1), tg_put(&g.info, b, k);
        tg_str(&g.info, "b", 1), tg_put(&g.info, b + 64, k2);
        g.nt = 2;
        tg_put(&g.data, zeros, 512);
        file = tg_finish(&g, &n);
        expect_reject(file, n, "overlaps tensor 'a'", "overlap");
        free(file);
        tg_begin(&g);
        tg_str(&g.info, "", 0), tg_put(&g.info, b, k), g.nt = 1;
        tg_put(&g.data, zeros, 256);
        file = tg_finish(&g, &n);
        expect_reject(file, n, "tensor name of 0 bytes", "empty name");
        free(file);
    }
    /* and the good one opens */
    {
        uint8_t b[128];
        tg_gguf g;
        tg_begin(&g);
        tg_str(&g.info, "t", 1), tg_put(&g.info, b, pack_info(&ok, b)), g.nt = 1;
        uint8_t zeros[256] = {0};
        tg_put(&g.data, zeros, 256);
        size_t n;
        uint8_t *file = tg_finish(&g, &n);
        corpus_save(file, n);
        mpq_gguf_file *f;
        mpq_io_err e;
        cr_assert_eq(mpq_gguf_open_memory(file, n, &f, &e), MPQ_OK, "%s", e.msg);
        mpq_gguf_close(f);
        free(file);
    }
}

/* A small valid file with a few of everything. */
static uint8_t *sample_file(size_t *n)
{
    synth_rng r = {5};
    tg_gguf g;
    tg_begin(&g);
    tg_kv_str(&g, "general.architecture", "llama");
    tg_kv_u32(&g, "general.alignment", 32);
    const char *w[2] = {"ab", "c d"};
    tg_kv_arr_str(&g, "tokenizer.ggml.tokens", w, 2);
    size_t bytes;
    uint8_t *q = make_data(&types[6], 64, &r, &bytes); /* Q4_1 */
    tg_tensor(&g, "q", 3, 2, (const uint64_t[]){32, 2}, q, bytes);
    free(q);
    uint8_t *h = make_data(&types[1], 8, &r, &bytes); /* F16 */
    tg_tensor(&g, "h", 1, 1, (const uint64_t[]){8}, h, bytes);
    free(h);
    return tg_finish(&g, n);
}

Test(gguf, truncations_and_random_corruption_never_crash)
{
    size_t n;
    uint8_t *good = sample_file(&n);
    corpus_save(good, n);
    mpq_gguf_file *f;
    mpq_io_err e;
    for (size_t k = 0; k < n; k++) {
        memset(&e, 0, sizeof e);
        cr_assert_neq(mpq_gguf_open_memory(good, k, &f, &e), MPQ_OK, "prefix of %zu bytes", k);
        cr_assert(e.msg[0], "prefix of %zu bytes: no reason given", k);
    }
    cr_assert_eq(mpq_gguf_open_memory(good, n, &f, &e), MPQ_OK, "%s", e.msg);
    mpq_gguf_close(f);
    synth_rng r = {99};
    uint8_t *b = malloc(n);
    int opened = 0;
    for (int it = 0; it < 4000; it++) {
        memcpy(b, good, n);
        const int flips = 1 + synth_int(&r, 4);
        for (int k = 0; k < flips; k++) b[synth_int(&r, (int)n)] = (uint8_t)synth_u64(&r);
        if (mpq_gguf_open_memory(b, n, &f, &e) != MPQ_OK) continue;
        opened++;
        for (int t = 0; t < mpq_gguf_count(f); t++) { /* whatever opens reads completely */
            const mpq_gguf_tensor *ti = mpq_gguf_at(f, t);
            if (!mpq_gguf_type_is_float(ti->type) || ti->numel > 4096) continue;
            float v[4096];
            cr_assert_eq(mpq_gguf_read_f32(f, ti, v, (size_t)ti->numel, &e), MPQ_OK, "%s", e.msg);
        }
        for (int k = 0; k < mpq_gguf_kv_count(f); k++) {
            const mpq_gguf_kv *kv = mpq_gguf_kv_at(f, k);
            const char *s;
            size_t len;
            for (uint64_t i = 0; i < kv->count && i < 8; i++) (void)mpq_gguf_get_str(f, kv, i, &s, &len);
        }
        mpq_gguf_close(f);
    }
    cr_assert(opened > 0 && opened < 4000, "%d of 4000 corrupted files opened", opened);
    free(b);
    free(good);
}

/* ---- model sources ------------------------------------------------------------ */

static void write_st(const char *path, const char *const *names, int n, float base)
{
    mpq_st_writer *w;
    mpq_io_err e;
    cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK, "%s", e.msg);
    for (int i = 0; i < n; i++) {
        const float v[6] = {base + i, 1, 2, 3, 4, 5};
        cr_assert_eq(mpq_st_write_f32(w, names[i], MPQ_DT_BF16, 2, (const uint64_t[]){2, 3}, v, &e), MPQ_OK);
    }
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    spit(p, text, strlen(text));
}

Test(sources, a_checkpoint_directory_with_shards, .init = make_tmpdir, .fini = remove_tmpdir)
{
    char p[600];
    const char *a[2] = {"x.weight", "y.weight"}, *b[1] = {"z.weight"};
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", tmpdir);
    write_st(p, a, 2, 10);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", tmpdir);
    write_st(p, b, 1, 20);
    write_text(tmpdir, "model.safetensors.index.json",
               "{\"metadata\":{},\"weight_map\":{\"x.weight\":\"model-00001-of-00002.safetensors\","
               "\"y.weight\":\"model-00001-of-00002.safetensors\",\"z.weight\":\"model-00002-of-00002.safetensors\"}}");
    write_text(tmpdir, "config.json", "{\"hidden_size\": 3}");
    mpq_source *s;
    mpq_io_err e;
    cr_assert_eq(mpq_source_open(tmpdir, &s, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_source_kind_of(s), MPQ_SOURCE_HF_DIR);
    cr_assert_eq(mpq_source_count(s), 3);
    const mpq_source_tensor *z = mpq_source_find(s, "z.weight");
    cr_assert(z && z->ndim == 2 && z->shape[0] == 2 && z->shape[1] == 3 && z->is_float && !strcmp(z->type, "BF16"));
    float v[6];
    mpq_source_prefetch(s, z); /* a hint: the read after it is the same */
    mpq_source_prefetch(s, NULL), mpq_source_prefetch(NULL, z);
    cr_assert_eq(mpq_source_read_f32(s, z, v, 6, &e), MPQ_OK);
    cr_assert_eq(v[0], 20.0f);
    char *text = NULL;
    size_t len;
    cr_assert_eq(mpq_source_text(s, "config.json", &text, &len, &e), MPQ_OK);
    cr_assert_str_eq(text, "{\"hidden_size\": 3}");
    free(text);
    cr_assert_eq(mpq_source_text(s, "tokenizer.json", &text, &len, &e), MPQ_OK);
    cr_assert_null(text);
    cr_assert_eq(mpq_source_text(s, "../etc/passwd", &text, &len, &e), MPQ_OK);
    cr_assert_null(text, "a description file is a plain name in the directory");
    mpq_source_close(s);
    /* hostile indexes */
    static const struct {
        const char *index, *needle;
    } bad[] = {
        {"{\"weight_map\":{\"x.weight\":\"../model-00001-of-00002.safetensors\"}}", "not a file name"},
        {"{\"weight_map\":{\"x.weight\":\"/etc/passwd\"}}", "not a file name"},
        {"{\"weight_map\":{\"x.weight\":7}}", "not a file name"},
        {"{\"weight_map\":[1]}", "weight_map"},
        {"{\"weight_map\":{\"x.weight\":\"missing.safetensors\"}}", "cannot open"},
        {"{\"weight_map\":{\"z.weight\":\"model-00001-of-00002.safetensors\"}}", "does not hold it"},
        {"{\"weight_map\":", "not valid JSON"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_text(tmpdir, "model.safetensors.index.json", bad[k].index);
        s = NULL;
        cr_assert_neq(mpq_source_open(tmpdir, &s, &e), MPQ_OK, "%s", bad[k].index);
        cr_assert_null(s);
        cr_assert(strstr(e.msg, bad[k].needle), "%s: '%s' lacks '%s'", bad[k].index, e.msg, bad[k].needle);
    }
    /* a tensor in two shards */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", tmpdir);
    write_st(p, a, 1, 30);
    write_text(tmpdir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x.weight\":\"model-00001-of-00002.safetensors\","
               "\"z.weight\":\"model-00002-of-00002.safetensors\"}}");
    cr_assert_neq(mpq_source_open(tmpdir, &s, &e), MPQ_OK);
    cr_assert(strstr(e.msg, "one shard") || strstr(e.msg, "does not hold"), "%s", e.msg);
    /* no weights at all */
    snprintf(p, sizeof p, "%s/empty", tmpdir);
    mkdir(p, 0755);
    cr_assert_eq(mpq_source_open(p, &s, &e), MPQ_ERR_IO);
    cr_assert(strstr(e.msg, "neither model.safetensors"), "%s", e.msg);
    rmdir(p);
    cr_assert_eq(mpq_source_open("/nonexistent/model", &s, &e), MPQ_ERR_IO);
}

Test(sources, a_gguf_file_with_shapes_in_row_major_order, .init = make_tmpdir, .fini = remove_tmpdir)
{
    size_t n;
    uint8_t *file = sample_file(&n);
    char p[600];
    snprintf(p, sizeof p, "%s/m.gguf", tmpdir);
    spit(p, file, n);
    free(file);
    mpq_source *s;
    mpq_io_err e;
    cr_assert_eq(mpq_source_open(p, &s, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_source_kind_of(s), MPQ_SOURCE_GGUF);
    const mpq_source_tensor *q = mpq_source_find(s, "q");
    cr_assert(q && q->ndim == 2 && q->shape[0] == 2 && q->shape[1] == 32 && !strcmp(q->type, "Q4_1") && q->is_float);
    cr_assert_null(mpq_source_st(s, q, NULL));
    cr_assert_not_null(mpq_source_gguf(s));
    float before[64], after[64];
    cr_assert_eq(mpq_source_read_f32(s, q, before, 64, &e), MPQ_OK, "%s", e.msg);
    mpq_source_prefetch(s, q); /* a hint: what is read after it is the same */
    mpq_gguf_prefetch(mpq_source_gguf(s), NULL), mpq_gguf_prefetch(NULL, NULL);
    cr_assert_eq(mpq_source_read_f32(s, q, after, 64, &e), MPQ_OK, "%s", e.msg);
    cr_assert(!memcmp(before, after, sizeof before));
    char *text = NULL;
    cr_assert_eq(mpq_source_text(s, "config.json", &text, NULL, &e), MPQ_OK);
    cr_assert_null(text);
    mpq_source_close(s);
}
