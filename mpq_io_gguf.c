/* mpq_io_gguf.c - GGUF reader for mpq (see mpq_io.h, section GGUF).

   The metadata and tensor infos are parsed from a prefix of the file that
   grows as the parser asks for more (mpq__gneed), so a hostile count or
   length is caught as "the file ends inside ..." before anything of that
   size is allocated. Values stay in that prefix; the pairs and infos hold
   offsets into it. */
#define _XOPEN_SOURCE 700
#include "mpq_io.h"
#include "mpq_priv.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MPQ__GGUF_MAX_KEY  65535u     /* longest key (the format's limit) */
#define MPQ__GGUF_MAX_NAME 4096u      /* longest tensor name accepted */
#define MPQ__GGUF_CHUNK    (1u << 20) /* conversion buffer of mpq_gguf_read_f32 */

/* -------------------------------------------------------------------------- */
/* ggml types: block size and bytes per block                                 */
/* -------------------------------------------------------------------------- */

typedef struct mpq__ggml_type {
    const char *name; /* NULL: not a type (numbers ggml has retired) */
    uint32_t block;   /* elements per block */
    uint32_t size;    /* bytes per block */
} mpq__ggml_type;

static const mpq__ggml_type mpq__ggml[] = {
    {"F32", 1, 4},      {"F16", 1, 2},        {"Q4_0", 32, 18},    {"Q4_1", 32, 20},     {NULL, 0, 0},
    {NULL, 0, 0},       {"Q5_0", 32, 22},     {"Q5_1", 32, 24},    {"Q8_0", 32, 34},     {"Q8_1", 32, 36},
    {"Q2_K", 256, 84},  {"Q3_K", 256, 110},   {"Q4_K", 256, 144},  {"Q5_K", 256, 176},   {"Q6_K", 256, 210},
    {"Q8_K", 256, 292}, {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
    {"IQ4_NL", 32, 18}, {"IQ3_S", 256, 110},  {"IQ2_S", 256, 82},  {"IQ4_XS", 256, 136}, {"I8", 1, 1},
    {"I16", 1, 2},      {"I32", 1, 4},        {"I64", 1, 8},       {"F64", 1, 8},        {"IQ1_M", 256, 56},
    {"BF16", 1, 2},     {NULL, 0, 0},         {NULL, 0, 0},        {NULL, 0, 0},         {"TQ1_0", 256, 54},
    {"TQ2_0", 256, 66}, {NULL, 0, 0},         {NULL, 0, 0},        {NULL, 0, 0},         {"MXFP4", 32, 17},
    {"NVFP4", 64, 36},  {"Q1_0", 128, 18},    {"Q2_0", 64, 18},
};
#define MPQ__GGML_COUNT (sizeof mpq__ggml / sizeof mpq__ggml[0])

const char *mpq_gguf_type_name(uint32_t type) { return type < MPQ__GGML_COUNT ? mpq__ggml[type].name : NULL; }

int mpq_gguf_type_is_float(uint32_t type)
{
    switch (type) {
    case MPQ_GGML_F32:
    case MPQ_GGML_F16:
    case MPQ_GGML_BF16:
    case MPQ_GGML_F64:
    case MPQ_GGML_Q8_0:
    case MPQ_GGML_Q4_0:
    case MPQ_GGML_Q4_1:
    case MPQ_GGML_Q5_0:
    case MPQ_GGML_Q5_1:
    case MPQ_GGML_Q2_K:
    case MPQ_GGML_Q3_K:
    case MPQ_GGML_Q4_K:
    case MPQ_GGML_Q5_K:
    case MPQ_GGML_Q6_K:
    case MPQ_GGML_IQ4_NL:
    case MPQ_GGML_IQ4_XS: return 1;
    default: return 0;
    }
}

/* Bytes of one scalar value of a type; 0 for strings and arrays. */
static size_t mpq__vsize(uint32_t t)
{
    static const uint8_t size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < 13 ? size[t] : 0;
}

static const char *mpq__vname(uint32_t t)
{
    static const char *const name[13] = {"U8",   "I8",     "U16",   "I16", "U32", "I32", "F32",
                                         "BOOL", "STRING", "ARRAY", "U64", "I64", "F64"};
    return t < 13 ? name[t] : "unknown";
}

/* -------------------------------------------------------------------------- */
/* the file                                                                   */
/* -------------------------------------------------------------------------- */

typedef struct mpq__kv {
    mpq_gguf_kv pub;
    uint64_t off;   /* the value (arrays: the first element) in meta */
    uint64_t *soff; /* string arrays: where each element's length is */
} mpq__kv;

typedef struct mpq__sorted {
    const char *name;
    int i;
} mpq__sorted;

struct mpq_gguf_file {
    mpq__io_in in;
    uint32_t version;
    uint8_t *meta; /* the file's first meta_bytes bytes */
    uint64_t meta_bytes;
    uint64_t alignment, data_start;
    mpq__kv *kv;
    int nkv;
    mpq_gguf_tensor *t;
    int nt;
    mpq__sorted *kv_sorted, *t_sorted;
};

void mpq_gguf_close(mpq_gguf_file *f)
{
    if (!f) return;
    for (int i = 0; i < f->nkv; i++) {
        free((void *)(uintptr_t)f->kv[i].pub.key);
        free(f->kv[i].soff);
    }
    for (int i = 0; i < f->nt; i++) free((void *)(uintptr_t)f->t[i].name);
    free(f->kv);
    free(f->t);
    free(f->kv_sorted);
    free(f->t_sorted);
    free(f->meta);
    mpq__io_in_close(&f->in);
    free(f);
}

/* -------------------------------------------------------------------------- */
/* parsing                                                                    */
/* -------------------------------------------------------------------------- */

typedef struct mpq__gcur {
    mpq_gguf_file *f;
    uint64_t pos;
    mpq_io_err *err;
    const char *what; /* the key or tensor being parsed, for messages */
    int is_tensor;
} mpq__gcur;

static mpq_status mpq__gfail(mpq__gcur *c, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static mpq_status mpq__gfail(mpq__gcur *c, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->what && !c->is_tensor)
        return mpq__io_fail(c->err, MPQ_ERR_FORMAT, c->f->in.path, NULL, "key '%.200s': %s", c->what, msg);
    return mpq__io_fail(c->err, MPQ_ERR_FORMAT, c->f->in.path, c->is_tensor ? c->what : NULL, "%s", msg);
}

/* Make bytes pos .. pos + n - 1 available in meta. */
static mpq_status mpq__gneed(mpq__gcur *c, uint64_t n, const char *what)
{
    mpq_gguf_file *f = c->f;
    if (n > f->in.bytes || c->pos > f->in.bytes - n)
        return mpq__gfail(c, "the file ends inside %s (at byte %llu)", what, (unsigned long long)c->pos);
    const uint64_t end = c->pos + n;
    if (end <= f->meta_bytes) return MPQ_OK;
    if (end > MPQ_GGUF_MAX_META)
        return mpq__gfail(c, "metadata and tensor infos exceed the limit of %u bytes", MPQ_GGUF_MAX_META);
    uint64_t want = f->meta_bytes * 2 > end ? f->meta_bytes * 2 : end;
    if (want < 65536) want = 65536;
    if (want > f->in.bytes) want = f->in.bytes;
    if (want > MPQ_GGUF_MAX_META) want = MPQ_GGUF_MAX_META;
    uint8_t *m = (uint8_t *)realloc(f->meta, (size_t)want);
    if (!m)
        return mpq__io_fail(c->err, MPQ_ERR_NOMEM, f->in.path, NULL, "out of memory for %llu bytes of metadata",
                            (unsigned long long)want);
    f->meta = m;
    mpq_status st =
        mpq__io_read(&f->in, f->meta_bytes, m + f->meta_bytes, (size_t)(want - f->meta_bytes), NULL, c->err);
    if (st != MPQ_OK) return st;
    f->meta_bytes = want;
    return MPQ_OK;
}

static uint32_t mpq__u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t mpq__u64_at(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static mpq_status mpq__gu32(mpq__gcur *c, uint32_t *v, const char *what)
{
    mpq_status st = mpq__gneed(c, 4, what);
    if (st != MPQ_OK) return st;
    *v = mpq__u32_at(c->f->meta + c->pos);
    c->pos += 4;
    return MPQ_OK;
}

static mpq_status mpq__gu64(mpq__gcur *c, uint64_t *v, const char *what)
{
    mpq_status st = mpq__gneed(c, 8, what);
    if (st != MPQ_OK) return st;
    *v = mpq__u64_at(c->f->meta + c->pos);
    c->pos += 8;
    return MPQ_OK;
}

/* A string: its length, then its bytes, which stay at *off in meta. */
static mpq_status mpq__gstr(mpq__gcur *c, uint64_t *off, uint64_t *len, const char *what)
{
    mpq_status st = mpq__gu64(c, len, what);
    if (st == MPQ_OK) st = mpq__gneed(c, *len, what);
    if (st != MPQ_OK) return st;
    *off = c->pos;
    c->pos += *len;
    return MPQ_OK;
}

/* A name (key or tensor name): 1..max bytes of UTF-8 without NUL, copied
   with a terminating NUL. */
static mpq_status mpq__gname(mpq__gcur *c, char **out, uint64_t max, const char *what)
{
    uint64_t off, len;
    mpq_status st = mpq__gstr(c, &off, &len, what);
    if (st != MPQ_OK) return st;
    if (len == 0 || len > max)
        return mpq__gfail(c, "%s of %llu bytes (1 to %llu)", what, (unsigned long long)len, (unsigned long long)max);
    const uint8_t *s = c->f->meta + off;
    const size_t bad = mpq__io_utf8_check(s, (size_t)len);
    if (bad != len) return mpq__gfail(c, "%s is not UTF-8 text without NUL (byte %zu)", what, bad);
    char *d = (char *)malloc((size_t)len + 1);
    if (!d) return mpq__io_fail(c->err, MPQ_ERR_NOMEM, c->f->in.path, NULL, "out of memory");
    memcpy(d, s, (size_t)len);
    d[len] = 0;
    *out = d;
    return MPQ_OK;
}

/* One value of type t (not an array): bounds, and booleans 0 or 1. */
static mpq_status mpq__gvalue(mpq__gcur *c, uint32_t t)
{
    if (t == MPQ_GGUF_STRING) {
        uint64_t off, len;
        return mpq__gstr(c, &off, &len, "a string value");
    }
    const size_t sz = mpq__vsize(t);
    mpq_status st = mpq__gneed(c, sz, "a value");
    if (st != MPQ_OK) return st;
    if (t == MPQ_GGUF_BOOL && c->f->meta[c->pos] > 1)
        return mpq__gfail(c, "boolean value %u is neither 0 nor 1", c->f->meta[c->pos]);
    c->pos += sz;
    return MPQ_OK;
}

static mpq_status mpq__gkv(mpq__gcur *c, mpq__kv *kv)
{
    mpq_gguf_file *f = c->f;
    uint32_t t;
    mpq_status st = mpq__gu32(c, &t, "a value type");
    if (st != MPQ_OK) return st;
    if (t > MPQ_GGUF_F64) return mpq__gfail(c, "unknown value type %u", t);
    kv->pub.type = (mpq_gguf_vtype)t;
    kv->pub.count = 1;
    if (t != MPQ_GGUF_ARRAY) {
        kv->off = c->pos;
        return mpq__gvalue(c, t);
    }
    uint32_t e;
    uint64_t n;
    if ((st = mpq__gu32(c, &e, "an array's element type")) != MPQ_OK) return st;
    if (e > MPQ_GGUF_F64) return mpq__gfail(c, "unknown array element type %u", e);
    if (e == MPQ_GGUF_ARRAY) return mpq__gfail(c, "an array of arrays (not supported)");
    if ((st = mpq__gu64(c, &n, "an array's length")) != MPQ_OK) return st;
    kv->pub.elem = (mpq_gguf_vtype)e;
    kv->pub.count = n;
    kv->off = c->pos;
    const uint64_t left = f->in.bytes - c->pos;
    if (e == MPQ_GGUF_STRING) {
        if (n > left / 8)
            return mpq__gfail(c, "an array of %llu strings is longer than the file", (unsigned long long)n);
        kv->soff = (uint64_t *)malloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
        if (!kv->soff) return mpq__io_fail(c->err, MPQ_ERR_NOMEM, f->in.path, NULL, "out of memory");
        for (uint64_t k = 0; k < n; k++) {
            kv->soff[k] = c->pos;
            if ((st = mpq__gvalue(c, e)) != MPQ_OK) return st;
        }
        return MPQ_OK;
    }
    const size_t sz = mpq__vsize(e);
    if (n > left / sz) return mpq__gfail(c, "an array of %llu values is longer than the file", (unsigned long long)n);
    if ((st = mpq__gneed(c, n * sz, "an array")) != MPQ_OK) return st;
    if (e == MPQ_GGUF_BOOL)
        for (uint64_t k = 0; k < n; k++)
            if (f->meta[c->pos + k] > 1)
                return mpq__gfail(c, "boolean value %u is neither 0 nor 1", f->meta[c->pos + k]);
    c->pos += n * sz;
    return MPQ_OK;
}

static mpq_status mpq__gtensor(mpq__gcur *c, mpq_gguf_tensor *t)
{
    uint32_t nd, type;
    mpq_status st = mpq__gu32(c, &nd, "a tensor's dimension count");
    if (st != MPQ_OK) return st;
    if (nd < 1 || nd > MPQ_GGUF_MAX_DIMS) return mpq__gfail(c, "%u dimensions (1..4)", nd);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (int k = 0; k < MPQ_GGUF_MAX_DIMS; k++) t->ne[k] = 1;
    for (uint32_t k = 0; k < nd; k++) {
        if ((st = mpq__gu64(c, &t->ne[k], "a tensor's dimensions")) != MPQ_OK) return st;
        if (t->ne[k] > (uint64_t)INT64_MAX)
            return mpq__gfail(c, "dimension %u is %llu (negative as int64)", k, (unsigned long long)t->ne[k]);
        if (t->ne[k] && numel > (uint64_t)INT64_MAX / t->ne[k]) return mpq__gfail(c, "element count overflows");
        numel *= t->ne[k];
    }
    t->numel = numel;
    if ((st = mpq__gu32(c, &type, "a tensor's type")) != MPQ_OK) return st;
    if (!mpq_gguf_type_name(type)) return mpq__gfail(c, "unknown ggml type %u", type);
    t->type = type;
    const mpq__ggml_type *g = &mpq__ggml[type];
    if (t->ne[0] % g->block)
        return mpq__gfail(c, "first dimension %llu is not a multiple of the %s block (%u)",
                          (unsigned long long)t->ne[0], g->name, g->block);
    const uint64_t blocks = numel / g->block;
    if (blocks > (uint64_t)INT64_MAX / g->size) return mpq__gfail(c, "byte count overflows");
    t->bytes = blocks * g->size;
    return mpq__gu64(c, &t->offset, "a tensor's offset");
}

static int mpq__cmp_sorted(const void *a, const void *b)
{
    return strcmp(((const mpq__sorted *)a)->name, ((const mpq__sorted *)b)->name);
}

typedef struct mpq__span {
    uint64_t begin, end;
    int i;
} mpq__span;

static int mpq__cmp_span(const void *a, const void *b)
{
    const mpq__span *x = (const mpq__span *)a, *y = (const mpq__span *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Names unique (sorted index), tensors inside the data and apart. */
static mpq_status mpq__glayout(mpq__gcur *c)
{
    mpq_gguf_file *f = c->f;
    c->what = NULL, c->is_tensor = 0;
    f->kv_sorted = (mpq__sorted *)malloc(sizeof(mpq__sorted) * ((size_t)f->nkv + 1));
    f->t_sorted = (mpq__sorted *)malloc(sizeof(mpq__sorted) * ((size_t)f->nt + 1));
    mpq__span *sp = (mpq__span *)malloc(sizeof(mpq__span) * ((size_t)f->nt + 1));
    mpq_status st = MPQ_OK;
    if (!f->kv_sorted || !f->t_sorted || !sp) {
        free(sp);
        return mpq__io_fail(c->err, MPQ_ERR_NOMEM, f->in.path, NULL, "out of memory");
    }
    for (int i = 0; i < f->nkv; i++) f->kv_sorted[i].name = f->kv[i].pub.key, f->kv_sorted[i].i = i;
    for (int i = 0; i < f->nt; i++) {
        f->t_sorted[i].name = f->t[i].name, f->t_sorted[i].i = i;
        sp[i].begin = f->t[i].offset, sp[i].end = f->t[i].offset + f->t[i].bytes, sp[i].i = i;
    }
    qsort(f->kv_sorted, (size_t)f->nkv, sizeof *f->kv_sorted, mpq__cmp_sorted);
    qsort(f->t_sorted, (size_t)f->nt, sizeof *f->t_sorted, mpq__cmp_sorted);
    for (int i = 1; i < f->nkv && st == MPQ_OK; i++)
        if (strcmp(f->kv_sorted[i].name, f->kv_sorted[i - 1].name) == 0)
            st = mpq__io_fail(c->err, MPQ_ERR_FORMAT, f->in.path, NULL, "key '%.200s' appears twice",
                              f->kv_sorted[i].name);
    for (int i = 1; i < f->nt && st == MPQ_OK; i++)
        if (strcmp(f->t_sorted[i].name, f->t_sorted[i - 1].name) == 0)
            st = mpq__io_fail(c->err, MPQ_ERR_FORMAT, f->in.path, f->t_sorted[i].name, "name appears twice");
    /* the alignment, then the data section */
    const mpq_gguf_kv *al = st == MPQ_OK ? mpq_gguf_kv_find(f, "general.alignment") : NULL;
    f->alignment = 32;
    if (al) {
        int64_t a = 0;
        if (al->type != MPQ_GGUF_U32)
            st = mpq__io_fail(c->err, MPQ_ERR_FORMAT, f->in.path, NULL, "general.alignment is %s, not U32",
                              mpq__vname(al->type));
        else if (mpq_gguf_get_int(f, al, 0, &a) != MPQ_OK || a <= 0 || (a & (a - 1)) != 0)
            st = mpq__io_fail(c->err, MPQ_ERR_FORMAT, f->in.path, NULL, "general.alignment %lld is not a power of two",
                              (long long)a);
        else
            f->alignment = (uint64_t)a;
    }
    if (st == MPQ_OK) {
        f->data_start = (c->pos + f->alignment - 1) / f->alignment * f->alignment;
        if (f->nt && f->data_start > f->in.bytes)
            st = mpq__io_fail(c->err, MPQ_ERR_FORMAT, f->in.path, NULL,
                              "the file ends (%llu bytes) before its data section (byte %llu)",
                              (unsigned long long)f->in.bytes, (unsigned long long)f->data_start);
    }
    const uint64_t data_bytes = f->data_start <= f->in.bytes ? f->in.bytes - f->data_start : 0;
    for (int i = 0; i < f->nt && st == MPQ_OK; i++) {
        const mpq_gguf_tensor *t = &f->t[i];
        if (t->offset % f->alignment)
            st = mpq__io_fail(c->err, MPQ_ERR_FORMAT, f->in.path, t->name,
                              "offset %llu is not a multiple of the alignment %llu", (unsigned long long)t->offset,
                              (unsigned long long)f->alignment);
        else if (t->offset > data_bytes || t->bytes > data_bytes - t->offset)
            st = mpq__io_fail(c->err, MPQ_ERR_FORMAT, f->in.path, t->name,
                              "%llu bytes at offset %llu lie past the end of the file (%llu data bytes)",
                              (unsigned long long)t->bytes, (unsigned long long)t->offset,
                              (unsigned long long)data_bytes);
    }
    if (st == MPQ_OK) {
        qsort(sp, (size_t)f->nt, sizeof *sp, mpq__cmp_span);
        for (int i = 1; i < f->nt && st == MPQ_OK; i++)
            if (sp[i].begin < sp[i - 1].end)
                st = mpq__io_fail(c->err, MPQ_ERR_FORMAT, f->in.path, f->t[sp[i].i].name,
                                  "data overlaps tensor '%.200s'", f->t[sp[i - 1].i].name);
    }
    free(sp);
    return st;
}

static mpq_status mpq__gparse(mpq_gguf_file *f, mpq_io_err *err)
{
    mpq__gcur c = {f, 0, err, NULL, 0};
    mpq_status st = mpq__gneed(&c, 24, "the header");
    if (st != MPQ_OK) return st;
    if (memcmp(f->meta, "GGUF", 4) != 0)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, NULL, "not a GGUF file (no magic)");
    f->version = mpq__u32_at(f->meta + 4);
    if (f->version == 0x03000000u || f->version == 0x02000000u)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, NULL, "a big-endian GGUF file (not supported)");
    if (f->version != 2 && f->version != 3)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, NULL, "GGUF version %u (mpq reads 2 and 3)", f->version);
    const uint64_t nt = mpq__u64_at(f->meta + 8), nkv = mpq__u64_at(f->meta + 16);
    c.pos = 24;
    /* a pair takes at least 14 bytes, a tensor info 33: counts beyond what
       the file can hold are refused before anything is allocated for them */
    const uint64_t left = f->in.bytes - 24;
    if (nkv > left / 14 || nkv > INT_MAX / 2)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, NULL, "%llu key-value pairs cannot fit in the file",
                            (unsigned long long)nkv);
    if (nt > left / 33 || nt > INT_MAX / 2)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, NULL, "%llu tensors cannot fit in the file",
                            (unsigned long long)nt);
    f->kv = (mpq__kv *)calloc((size_t)nkv + 1, sizeof *f->kv);
    f->t = (mpq_gguf_tensor *)calloc((size_t)nt + 1, sizeof *f->t);
    if (!f->kv || !f->t) return mpq__io_fail(err, MPQ_ERR_NOMEM, f->in.path, NULL, "out of memory");
    for (uint64_t i = 0; i < nkv; i++) {
        mpq__kv *kv = &f->kv[f->nkv];
        c.what = NULL, c.is_tensor = 0;
        char *key = NULL;
        if ((st = mpq__gname(&c, &key, MPQ__GGUF_MAX_KEY, "a key")) != MPQ_OK) return st;
        kv->pub.key = key;
        f->nkv++;
        c.what = key;
        if ((st = mpq__gkv(&c, kv)) != MPQ_OK) return st;
    }
    for (uint64_t i = 0; i < nt; i++) {
        mpq_gguf_tensor *t = &f->t[f->nt];
        c.what = NULL, c.is_tensor = 1;
        char *name = NULL;
        if ((st = mpq__gname(&c, &name, MPQ__GGUF_MAX_NAME, "a tensor name")) != MPQ_OK) return st;
        t->name = name;
        f->nt++;
        c.what = name;
        if ((st = mpq__gtensor(&c, t)) != MPQ_OK) return st;
    }
    return mpq__glayout(&c);
}

static mpq_status mpq__gguf_finish_open(mpq_gguf_file *f, mpq_status st, mpq_gguf_file **out, mpq_io_err *err)
{
    if (st == MPQ_OK) st = mpq__gparse(f, err);
    if (st != MPQ_OK) {
        mpq_gguf_close(f);
        return st;
    }
    *out = f;
    return MPQ_OK;
}

mpq_status mpq_gguf_open(const char *path, mpq_gguf_file **out, mpq_io_err *err)
{
    if (!path || !out) return mpq__io_fail(err, MPQ_ERR_ARG, path, NULL, "NULL argument");
    mpq_gguf_file *f = (mpq_gguf_file *)calloc(1, sizeof *f);
    if (!f) return mpq__io_fail(err, MPQ_ERR_NOMEM, path, NULL, "out of memory");
    return mpq__gguf_finish_open(f, mpq__io_in_file(&f->in, path, err), out, err);
}

mpq_status mpq_gguf_open_memory(const void *buf, size_t bytes, mpq_gguf_file **out, mpq_io_err *err)
{
    if ((!buf && bytes) || !out) return mpq__io_fail(err, MPQ_ERR_ARG, NULL, NULL, "NULL argument");
    mpq_gguf_file *f = (mpq_gguf_file *)calloc(1, sizeof *f);
    if (!f) return mpq__io_fail(err, MPQ_ERR_NOMEM, NULL, NULL, "out of memory");
    return mpq__gguf_finish_open(f, mpq__io_in_memory(&f->in, buf, bytes, err), out, err);
}

/* -------------------------------------------------------------------------- */
/* lookups                                                                    */
/* -------------------------------------------------------------------------- */

const char *mpq_gguf_path(const mpq_gguf_file *f) { return f ? f->in.path : NULL; }
uint32_t mpq_gguf_version(const mpq_gguf_file *f) { return f ? f->version : 0; }
int mpq_gguf_count(const mpq_gguf_file *f) { return f ? f->nt : 0; }
int mpq_gguf_kv_count(const mpq_gguf_file *f) { return f ? f->nkv : 0; }

const mpq_gguf_tensor *mpq_gguf_at(const mpq_gguf_file *f, int i) { return f && i >= 0 && i < f->nt ? &f->t[i] : NULL; }

const mpq_gguf_kv *mpq_gguf_kv_at(const mpq_gguf_file *f, int i)
{
    return f && i >= 0 && i < f->nkv ? &f->kv[i].pub : NULL;
}

static int mpq__bsearch(const mpq__sorted *s, int n, const char *name)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        const int mid = lo + (hi - lo) / 2, c = strcmp(name, s[mid].name);
        if (c == 0) return s[mid].i;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return -1;
}

const mpq_gguf_tensor *mpq_gguf_find(const mpq_gguf_file *f, const char *name)
{
    if (!f || !name || !f->t_sorted) return NULL;
    const int i = mpq__bsearch(f->t_sorted, f->nt, name);
    return i < 0 ? NULL : &f->t[i];
}

const mpq_gguf_kv *mpq_gguf_kv_find(const mpq_gguf_file *f, const char *key)
{
    if (!f || !key || !f->kv_sorted) return NULL;
    const int i = mpq__bsearch(f->kv_sorted, f->nkv, key);
    return i < 0 ? NULL : &f->kv[i].pub;
}

/* The pair's own record, and the type and position of value i. */
static const mpq__kv *mpq__kv_value(const mpq_gguf_file *f, const mpq_gguf_kv *kv, uint64_t i, uint32_t *type,
                                    uint64_t *off)
{
    if (!f || !kv || (const void *)kv < (const void *)f->kv || (const void *)kv >= (const void *)(f->kv + f->nkv))
        return NULL;
    const mpq__kv *k = (const mpq__kv *)(const void *)kv;
    if (i >= k->pub.count) return NULL;
    if (k->pub.type != MPQ_GGUF_ARRAY) {
        *type = k->pub.type, *off = k->off;
    } else {
        *type = k->pub.elem;
        *off = k->pub.elem == MPQ_GGUF_STRING ? k->soff[i] : k->off + i * mpq__vsize(k->pub.elem);
    }
    return k;
}

mpq_status mpq_gguf_get_int(const mpq_gguf_file *f, const mpq_gguf_kv *kv, uint64_t i, int64_t *out)
{
    uint32_t t;
    uint64_t off;
    if (!out || !mpq__kv_value(f, kv, i, &t, &off)) return MPQ_ERR_ARG;
    const uint8_t *p = f->meta + off;
    switch (t) {
    case MPQ_GGUF_U8:
    case MPQ_GGUF_BOOL: *out = p[0]; return MPQ_OK;
    case MPQ_GGUF_I8: *out = (int8_t)p[0]; return MPQ_OK;
    case MPQ_GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return MPQ_OK;
    }
    case MPQ_GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return MPQ_OK;
    }
    case MPQ_GGUF_U32: *out = mpq__u32_at(p); return MPQ_OK;
    case MPQ_GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return MPQ_OK;
    }
    case MPQ_GGUF_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        *out = v;
        return MPQ_OK;
    }
    case MPQ_GGUF_U64: {
        const uint64_t v = mpq__u64_at(p);
        if (v > (uint64_t)INT64_MAX) return MPQ_ERR_RANGE;
        *out = (int64_t)v;
        return MPQ_OK;
    }
    default: return MPQ_ERR_ARG;
    }
}

mpq_status mpq_gguf_get_float(const mpq_gguf_file *f, const mpq_gguf_kv *kv, uint64_t i, double *out)
{
    uint32_t t;
    uint64_t off;
    if (!out || !mpq__kv_value(f, kv, i, &t, &off)) return MPQ_ERR_ARG;
    if (t == MPQ_GGUF_F32) {
        float v;
        memcpy(&v, f->meta + off, 4);
        *out = v;
    } else if (t == MPQ_GGUF_F64) {
        memcpy(out, f->meta + off, 8);
    } else {
        return MPQ_ERR_ARG;
    }
    return MPQ_OK;
}

mpq_status mpq_gguf_get_str(const mpq_gguf_file *f, const mpq_gguf_kv *kv, uint64_t i, const char **s, size_t *len)
{
    uint32_t t;
    uint64_t off;
    if (!s || !len || !mpq__kv_value(f, kv, i, &t, &off) || t != MPQ_GGUF_STRING) return MPQ_ERR_ARG;
    *len = (size_t)mpq__u64_at(f->meta + off);
    *s = (const char *)f->meta + off + 8;
    return MPQ_OK;
}

/* -------------------------------------------------------------------------- */
/* tensor data                                                                */
/* -------------------------------------------------------------------------- */

static int mpq__gowns(const mpq_gguf_file *f, const mpq_gguf_tensor *t)
{
    return f && t && t >= f->t && t < f->t + f->nt;
}

mpq_status mpq_gguf_read(mpq_gguf_file *f, const mpq_gguf_tensor *t, void *dst, size_t bytes, mpq_io_err *err)
{
    if (!mpq__gowns(f, t) || (!dst && bytes))
        return mpq__io_fail(err, MPQ_ERR_ARG, f ? f->in.path : NULL, NULL, "bad argument");
    if ((uint64_t)bytes != t->bytes)
        return mpq__io_fail(err, MPQ_ERR_SIZE, f->in.path, t->name, "holds %llu bytes, the caller's buffer %zu",
                            (unsigned long long)t->bytes, bytes);
    return mpq__io_read(&f->in, f->data_start + t->offset, dst, bytes, t->name, err);
}

static float mpq__h(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return mpq_f16_to_f32(h);
}

/* The 4-bit scale and min of sub-block j of a Q4_K / Q5_K super-block
   (its 12 scale bytes: 8 six-bit scales and 8 six-bit mins; the first four
   of each whole in bytes 0-3 and 4-7, the last four split between the low
   and high nibbles of bytes 8-11 and the top two bits of bytes 0-7). */
static void mpq__k4_scale_min(const uint8_t *q, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The 16 six-bit scales of a Q3_K super-block, minus 32: the low four bits
   of scale j in the nibbles of bytes 0-7 (j < 8: low nibble of byte j;
   else the high nibble of byte j - 8), the top two bits in bytes 8-11
   (bits 2 (j % 4) of byte 8 + j / 4). */
static void mpq__q3k_scales(const uint8_t *q, int *sc)
{
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? q[j] & 15 : q[j - 8] >> 4, hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (lo | hi << 4) - 32;
    }
}

/* IQ4_NL's and IQ4_XS's levels (ggml's table). */
static const int8_t mpq__iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* nb blocks of type `type` from src to floats. */
static void mpq__gdecode(uint32_t type, const uint8_t *src, size_t nb, float *y)
{
    switch (type) {
    case MPQ_GGML_F16:
        for (size_t i = 0; i < nb; i++) y[i] = mpq__h(src + 2 * i);
        break;
    case MPQ_GGML_BF16:
        for (size_t i = 0; i < nb; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            y[i] = mpq_bf16_to_f32(h);
        }
        break;
    case MPQ_GGML_F64:
        for (size_t i = 0; i < nb; i++) {
            double v;
            memcpy(&v, src + 8 * i, 8);
            y[i] = (float)v;
        }
        break;
    case MPQ_GGML_Q8_0: /* d, 32 x int8: d q */
        for (size_t b = 0; b < nb; b++, src += 34, y += 32) {
            const float d = mpq__h(src);
            for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)src[2 + j] * d;
        }
        break;
    case MPQ_GGML_Q4_0: /* d, 16 bytes: element j in the low nibble of byte j, j + 16 in its high nibble */
        for (size_t b = 0; b < nb; b++, src += 18, y += 32) {
            const float d = mpq__h(src);
            for (int j = 0; j < 16; j++) {
                y[j] = (float)((src[2 + j] & 15) - 8) * d;
                y[j + 16] = (float)((src[2 + j] >> 4) - 8) * d;
            }
        }
        break;
    case MPQ_GGML_Q4_1: /* d, m, 16 bytes as Q4_0: d q + m */
        for (size_t b = 0; b < nb; b++, src += 20, y += 32) {
            const float d = mpq__h(src), m = mpq__h(src + 2);
            for (int j = 0; j < 16; j++) {
                y[j] = (float)(src[4 + j] & 15) * d + m;
                y[j + 16] = (float)(src[4 + j] >> 4) * d + m;
            }
        }
        break;
    case MPQ_GGML_Q5_0: /* d, 32 high bits, 16 bytes of low nibbles: d (q - 16) */
    case MPQ_GGML_Q5_1: /* d, m, 32 high bits, 16 bytes of low nibbles: d q + m */
    {
        const int has_m = type == MPQ_GGML_Q5_1, hb = has_m ? 4 : 2, bs = has_m ? 24 : 22;
        for (size_t b = 0; b < nb; b++, src += bs, y += 32) {
            const float d = mpq__h(src), m = has_m ? mpq__h(src + 2) : 0.0f;
            const uint32_t qh = mpq__u32_at(src + hb);
            const uint8_t *qs = src + hb + 4;
            const int off = has_m ? 0 : 16;
            for (int j = 0; j < 16; j++) {
                const int lo = (qs[j] & 15) | (int)(((qh >> j) & 1u) << 4);
                const int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
                y[j] = (float)(lo - off) * d + m;
                y[j + 16] = (float)(hi - off) * d + m;
            }
        }
        break;
    }
    case MPQ_GGML_Q2_K: /* 16 scale bytes (scale low nibble, min high), 64 bytes of 2-bit codes, d, dmin */
        for (size_t b = 0; b < nb; b++, src += 84, y += 256) {
            const float d = mpq__h(src + 80), dmin = mpq__h(src + 82);
            for (int s = 0; s < 16; s++) { /* sub-block s: 16 values, codes in 32 bytes of half s / 8 */
                const float dl = d * (float)(src[s] & 15), ml = dmin * (float)(src[s] >> 4);
                const uint8_t *q = src + 16 + 32 * (s / 8) + 16 * (s % 2);
                const int shift = 2 * ((s % 8) / 2);
                for (int l = 0; l < 16; l++) y[16 * s + l] = dl * (float)((q[l] >> shift) & 3) - ml;
            }
        }
        break;
    case MPQ_GGML_Q3_K: /* 32 bytes of high bits, 64 bytes of 2-bit codes, 12 scale bytes, d */
        for (size_t b = 0; b < nb; b++, src += 110, y += 256) {
            const float d = mpq__h(src + 108);
            int sc[16];
            mpq__q3k_scales(src + 96, sc);
            for (int s = 0; s < 16; s++) {
                const float dl = d * (float)sc[s];
                const int half = s / 8, shift = 2 * ((s % 8) / 2), o = 16 * (s % 2);
                const uint8_t *q = src + 32 + 32 * half;
                const int bit = 4 * half + (s % 8) / 2; /* which bit of the high-bit bytes */
                for (int l = 0; l < 16; l++) {
                    const int v = ((q[o + l] >> shift) & 3) - ((src[o + l] >> bit) & 1 ? 0 : 4);
                    y[16 * s + l] = dl * (float)v;
                }
            }
        }
        break;
    case MPQ_GGML_Q4_K: /* d, dmin, 12 scale bytes, 128 bytes of 4-bit codes */
    case MPQ_GGML_Q5_K: /* d, dmin, 12 scale bytes, 32 bytes of fifth bits, 128 bytes of 4-bit codes */
    {
        const int five = type == MPQ_GGML_Q5_K, bs = five ? 176 : 144;
        for (size_t b = 0; b < nb; b++, src += bs, y += 256) {
            const float d = mpq__h(src), dmin = mpq__h(src + 2);
            const uint8_t *qh = src + 16, *qs = src + (five ? 48 : 16);
            for (int s = 0; s < 8; s++) { /* sub-block s: 32 values, nibble s % 2 of bytes 32 (s / 2) .. */
                int sc, m;
                mpq__k4_scale_min(src + 4, s, &sc, &m);
                const float dl = d * (float)sc, ml = dmin * (float)m;
                const uint8_t *q = qs + 32 * (s / 2);
                for (int l = 0; l < 32; l++) {
                    int v = s % 2 ? q[l] >> 4 : q[l] & 15;
                    if (five) v |= ((qh[l] >> s) & 1) << 4;
                    y[32 * s + l] = dl * (float)v - ml;
                }
            }
        }
        break;
    }
    case MPQ_GGML_Q6_K: /* 128 bytes of low nibbles, 64 bytes of high pairs, 16 int8 scales, d */
        for (size_t b = 0; b < nb; b++, src += 210, y += 256) {
            const float d = mpq__h(src + 208);
            const int8_t *sc = (const int8_t *)(const void *)(src + 192);
            for (int i = 0; i < 256; i++) { /* half h of 128; within it quarter k of 32, position l */
                const int h = i / 128, k = (i % 128) / 32, l = i % 32;
                const uint8_t lo = src[64 * h + 32 * (k % 2) + l], hi = src[128 + 32 * h + l];
                const int v = ((k < 2 ? lo & 15 : lo >> 4) | ((hi >> (2 * k)) & 3) << 4) - 32;
                y[i] = d * (float)sc[8 * h + 2 * k + l / 16] * (float)v;
            }
        }
        break;
    case MPQ_GGML_IQ4_NL: /* d, 16 bytes: level of the low nibble of byte j, then of the high ones */
        for (size_t b = 0; b < nb; b++, src += 18, y += 32) {
            const float d = mpq__h(src);
            for (int j = 0; j < 16; j++) {
                y[j] = d * (float)mpq__iq4_levels[src[2 + j] & 15];
                y[j + 16] = d * (float)mpq__iq4_levels[src[2 + j] >> 4];
            }
        }
        break;
    case MPQ_GGML_IQ4_XS: /* d, 16 high scale bits, 4 bytes of low scale nibbles, 8 x 16 bytes as IQ4_NL */
        for (size_t b = 0; b < nb; b++, src += 136, y += 256) {
            const float d = mpq__h(src);
            const unsigned sh = (unsigned)src[2] | (unsigned)src[3] << 8;
            for (int s = 0; s < 8; s++) {
                const int ls = ((src[4 + s / 2] >> (4 * (s % 2))) & 15) | (int)((sh >> (2 * s)) & 3) << 4;
                const float dl = d * (float)(ls - 32);
                const uint8_t *q = src + 8 + 16 * s;
                for (int j = 0; j < 16; j++) {
                    y[32 * s + j] = dl * (float)mpq__iq4_levels[q[j] & 15];
                    y[32 * s + j + 16] = dl * (float)mpq__iq4_levels[q[j] >> 4];
                }
            }
        }
        break;
    default: break;
    }
}

uint64_t mpq_gguf_type_bytes(uint32_t type, uint64_t n)
{
    if (type >= MPQ__GGML_COUNT || !mpq__ggml[type].name || n % mpq__ggml[type].block) return 0;
    const uint64_t blocks = n / mpq__ggml[type].block;
    return blocks > UINT64_MAX / mpq__ggml[type].size ? 0 : blocks * mpq__ggml[type].size;
}

mpq_status mpq_gguf_decode(uint32_t type, const void *src, uint64_t n, float *dst)
{
    if (!mpq_gguf_type_is_float(type) || n % mpq__ggml[type].block || (n && (!src || !dst)) || n > SIZE_MAX / 8)
        return MPQ_ERR_ARG;
    if (type == MPQ_GGML_F32)
        memcpy(dst, src, (size_t)n * 4);
    else
        mpq__gdecode(type, (const uint8_t *)src, (size_t)(n / mpq__ggml[type].block), dst);
    return MPQ_OK;
}

mpq_status mpq_gguf_map(mpq_gguf_file *f, const mpq_gguf_tensor *t, const void **data, mpq_io_err *err)
{
    if (!mpq__gowns(f, t) || !data) return mpq__io_fail(err, MPQ_ERR_ARG, f ? f->in.path : NULL, NULL, "bad argument");
    const uint8_t *base;
    mpq_status st = mpq__io_map(&f->in, &base, err);
    if (st == MPQ_OK) *data = base + f->data_start + t->offset;
    return st;
}

void mpq_gguf_prefetch(mpq_gguf_file *f, const mpq_gguf_tensor *t)
{
    if (mpq__gowns(f, t)) mpq__io_prefetch(&f->in, f->data_start + t->offset, t->bytes);
}

mpq_status mpq_gguf_check(const mpq_gguf_file *f, mpq_io_err *err)
{
    if (!f) return mpq__io_fail(err, MPQ_ERR_ARG, NULL, NULL, "bad argument");
    return mpq__io_check(&f->in, err);
}

mpq_status mpq_gguf_read_f32(mpq_gguf_file *f, const mpq_gguf_tensor *t, float *dst, size_t n, mpq_io_err *err)
{
    if (!mpq__gowns(f, t) || (!dst && n))
        return mpq__io_fail(err, MPQ_ERR_ARG, f ? f->in.path : NULL, NULL, "bad argument");
    if (!mpq_gguf_type_is_float(t->type))
        return mpq__io_fail(err, MPQ_ERR_ARG, f->in.path, t->name,
                            "type %s is not one mpq converts (F32, F16, BF16, F64, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                            "Q2_K .. Q6_K, IQ4_NL, IQ4_XS)",
                            mpq_gguf_type_name(t->type));
    if ((uint64_t)n != t->numel)
        return mpq__io_fail(err, MPQ_ERR_SIZE, f->in.path, t->name, "holds %llu values, the caller's buffer %zu",
                            (unsigned long long)t->numel, n);
    const uint64_t off = f->data_start + t->offset;
    if (t->type == MPQ_GGML_F32) return mpq__io_read(&f->in, off, dst, n * 4, t->name, err);
    const mpq__ggml_type *g = &mpq__ggml[t->type];
    const size_t per = MPQ__GGUF_CHUNK / g->size; /* blocks per chunk */
    const size_t blocks = n / g->block;
    uint8_t *tmp = (uint8_t *)malloc(MPQ__GGUF_CHUNK);
    if (!tmp) return mpq__io_fail(err, MPQ_ERR_NOMEM, f->in.path, t->name, "out of memory");
    mpq_status st = MPQ_OK;
    for (size_t b = 0; b < blocks && st == MPQ_OK; b += per) {
        const size_t k = blocks - b < per ? blocks - b : per;
        st = mpq__io_read(&f->in, off + (uint64_t)b * g->size, tmp, k * g->size, t->name, err);
        if (st == MPQ_OK) mpq__gdecode(t->type, tmp, k, dst + b * g->block);
    }
    free(tmp);
    return st;
}
