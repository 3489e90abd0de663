/* mpq_io.c - safetensors reader and writer for mpq (see mpq_io.h).

   Parsing works on the header bytes alone; the file is touched only through
   read_at (positioned reads, or memcpy for a file held in memory), so the
   same checks serve files, memory and the fuzz target. */
#define _XOPEN_SOURCE 700
#define _GNU_SOURCE   /* O_TMPFILE */
#include "mpq_io.h"
#include "mpq_priv.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "mpq_io.c reads and writes little-endian files on little-endian hosts only"
#endif

#define MPQ_ST_MAX_INT 9007199254740992.0 /* 2^53: integers below it are exact in JSON doubles */
#define MPQ_ST_CHUNK   (1u << 20)

/* -------------------------------------------------------------------------- */
/* dtypes, errors, small helpers                                              */
/* -------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} mpq__dtypes[MPQ_DT_COUNT] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
    {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8},
};

const char *mpq_dtype_name(mpq_dtype t) { return (unsigned)t < MPQ_DT_COUNT ? mpq__dtypes[t].name : NULL; }

size_t mpq_dtype_size(mpq_dtype t) { return (unsigned)t < MPQ_DT_COUNT ? mpq__dtypes[t].size : 0; }

static int mpq__dtype_parse(const char *s, mpq_dtype *t)
{
    for (int i = 0; i < MPQ_DT_COUNT; i++)
        if (strcmp(s, mpq__dtypes[i].name) == 0) {
            *t = (mpq_dtype)i;
            return 1;
        }
    return 0;
}

/* "<origin>: " then "tensor '<name>': " (when name is not NULL), then the message. */
static mpq_status mpq__vfail(mpq_io_err *err, mpq_status st, const char *origin, const char *name, const char *fmt,
                             va_list ap)
{
    if (!err) return st;
    int n = snprintf(err->msg, sizeof err->msg, "%s: ", origin ? origin : "(memory)");
    if (n < 0) n = 0;
    if (name && (size_t)n < sizeof err->msg) {
        int k = snprintf(err->msg + n, sizeof err->msg - (size_t)n, "tensor '%.200s': ", name);
        if (k > 0) n += k;
    }
    if ((size_t)n < sizeof err->msg) vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
    return st;
}

mpq_status mpq__fail(mpq_io_err *err, mpq_status st, const char *origin, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mpq__vfail(err, st, origin, NULL, fmt, ap);
    va_end(ap);
    return st;
}

mpq_status mpq__io_fail(mpq_io_err *err, mpq_status st, const char *path, const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mpq__vfail(err, st, path, name, fmt, ap);
    va_end(ap);
    return st;
}

char *mpq__io_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = (char *)malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

size_t mpq__utf8_next(const uint8_t *s, size_t n, size_t i, uint32_t *cp)
{
    const uint8_t c = s[i];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0)
        len = 2, v = c & 0x1Fu, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        len = 3, v = c & 0x0Fu, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        len = 4, v = c & 0x07u, min = 0x10000;
    else
        return 0;
    if (n - i < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[i + k] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i + k] & 0x3Fu);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

size_t mpq__io_utf8_check(const uint8_t *s, size_t n)
{
    uint32_t cp;
    for (size_t i = 0, k; i < n; i += k)
        if (s[i] == 0 || (k = mpq__utf8_next(s, n, i, &cp)) == 0) return i;
    return n;
}

static int mpq__utf8_ok(const char *s)
{
    size_t n = strlen(s);
    return mpq__io_utf8_check((const uint8_t *)s, n) == n;
}

/* -------------------------------------------------------------------------- */
/* input: a file read with positioned reads, or bytes in memory               */
/* -------------------------------------------------------------------------- */

mpq_status mpq__io_in_file(mpq__io_in *in, const char *path, mpq_io_err *err)
{
    memset(in, 0, sizeof *in);
    in->fd = -1;
    if (!(in->path = mpq__io_strdup(path))) return mpq__io_fail(err, MPQ_ERR_NOMEM, path, NULL, "out of memory");
    in->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (in->fd < 0) return mpq__io_fail(err, MPQ_ERR_IO, path, NULL, "cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(in->fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        return mpq__io_fail(err, MPQ_ERR_IO, path, NULL, "not a regular file");
    in->bytes = (uint64_t)sb.st_size;
    in->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    return MPQ_OK;
}

mpq_status mpq__io_in_memory(mpq__io_in *in, const void *buf, size_t bytes, mpq_io_err *err)
{
    memset(in, 0, sizeof *in);
    in->fd = -1;
    if (!(in->path = mpq__io_strdup("(memory)"))) return mpq__io_fail(err, MPQ_ERR_NOMEM, NULL, NULL, "out of memory");
    in->mem = (const uint8_t *)buf;
    in->bytes = bytes;
    return MPQ_OK;
}

void mpq__io_in_close(mpq__io_in *in)
{
    if (in->map) munmap(in->map, (size_t)in->bytes);
    if (in->fd >= 0) close(in->fd);
    free(in->path);
    memset(in, 0, sizeof *in);
    in->fd = -1;
}

mpq_status mpq__io_read(const mpq__io_in *in, uint64_t off, void *dst, size_t n, const char *name, mpq_io_err *err)
{
    if (off > in->bytes || n > in->bytes - off)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, in->path, name, "read past the end of the file");
    if (in->fd < 0) {
        if (n) memcpy(dst, in->mem + off, n);
        return MPQ_OK;
    }
    uint8_t *d = (uint8_t *)dst;
    while (n) {
        const size_t want = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t got = pread(in->fd, d, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return mpq__io_fail(err, MPQ_ERR_IO, in->path, name, "read failed: %s", strerror(errno));
        if (got == 0)
            return mpq__io_fail(err, MPQ_ERR_IO, in->path, name, "file ended early (changed since it was opened?)");
        d += got, off += (uint64_t)got, n -= (size_t)got;
    }
    return MPQ_OK;
}

mpq_status mpq__io_map(mpq__io_in *in, const uint8_t **base, mpq_io_err *err)
{
    if (in->fd < 0) {
        *base = in->mem;
        return MPQ_OK;
    }
    if (!in->map) {
        if (in->bytes == 0 || in->bytes > (uint64_t)SIZE_MAX)
            return mpq__io_fail(err, MPQ_ERR_IO, in->path, NULL, "cannot map %llu bytes",
                                (unsigned long long)in->bytes);
        mpq_status st = mpq__io_check(in, err);
        if (st != MPQ_OK) return st;
        void *p = mmap(NULL, (size_t)in->bytes, PROT_READ, MAP_SHARED, in->fd, 0);
        if (p == MAP_FAILED) return mpq__io_fail(err, MPQ_ERR_IO, in->path, NULL, "cannot map: %s", strerror(errno));
        in->map = p;
    }
    *base = (const uint8_t *)in->map;
    return MPQ_OK;
}

mpq_status mpq__io_check(const mpq__io_in *in, mpq_io_err *err)
{
    if (in->fd < 0) return MPQ_OK;
    struct stat sb;
    if (fstat(in->fd, &sb) != 0)
        return mpq__io_fail(err, MPQ_ERR_IO, in->path, NULL, "stat failed: %s", strerror(errno));
    const int64_t mt = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    if ((uint64_t)sb.st_size != in->bytes || mt != in->mtime_ns)
        return mpq__io_fail(err, MPQ_ERR_IO, in->path, NULL,
                            "changed since it was opened (%llu bytes then, %llu now%s)", (unsigned long long)in->bytes,
                            (unsigned long long)sb.st_size, (uint64_t)sb.st_size == in->bytes ? ", modified" : "");
    return MPQ_OK;
}

void mpq__io_prefetch(const mpq__io_in *in, uint64_t off, uint64_t n)
{
    if (in->fd < 0 || off > in->bytes || n > in->bytes - off || n == 0) return;
    (void)posix_fadvise(in->fd, (off_t)off, (off_t)n, POSIX_FADV_WILLNEED);
}

uint16_t mpq_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);                                             /* nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float mpq_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* -------------------------------------------------------------------------- */
/* packed-matrix metadata (shared by writer and reader)                       */
/* -------------------------------------------------------------------------- */

enum {
    MPQ__PM_FORMAT,
    MPQ__PM_SHAPE,
    MPQ__PM_GROUP,
    MPQ__PM_BLOCK_ROWS,
    MPQ__PM_BITS,
    MPQ__PM_BPW,
    MPQ__PM_SECTIONS,
    MPQ__PM_COUNT
};
static const char *const mpq__pm_field[MPQ__PM_COUNT] = {"format", "shape", "group",   "block_rows",
                                                         "bits",   "bpw",   "sections"};
typedef char mpq__pm_values[MPQ__PM_COUNT][640];

static void mpq__pm_section(char *s, size_t cap, const char *part, const mpq_packed *A, const void *p, size_t bytes)
{
    size_t n = strlen(s);
    if (!p || n >= cap) return;
    snprintf(s + n, cap - n, "%s%s:%zu:%zu", n ? " " : "", part, (size_t)((const uint8_t *)p - (const uint8_t *)A->buf),
             bytes);
}

/* The metadata values that describe a validated packed matrix. */
static void mpq__pm_values_of(const mpq_packed *A, mpq__pm_values v)
{
    snprintf(v[MPQ__PM_FORMAT], sizeof v[0], "%s", A->format == MPQ_FORMAT_MXINT ? "mxint" : "bitplane");
    snprintf(v[MPQ__PM_SHAPE], sizeof v[0], "%d,%d", A->rows, A->cols);
    snprintf(v[MPQ__PM_GROUP], sizeof v[0], "%d", A->group);
    snprintf(v[MPQ__PM_BLOCK_ROWS], sizeof v[0], "%d", A->block_rows);
    const size_t nbits = (size_t)((A->rows + A->block_rows - 1) / A->block_rows) * (size_t)A->ngroups;
    int seen[MPQ_MAX_BITS + 1] = {0};
    for (size_t k = 0; k < nbits; k++) seen[A->bits[k] <= MPQ_MAX_BITS ? A->bits[k] : 0] = 1;
    char *b = v[MPQ__PM_BITS];
    b[0] = 0;
    for (int w = 1; w <= MPQ_MAX_BITS; w++)
        if (seen[w]) {
            size_t n = strlen(b);
            snprintf(b + n, sizeof v[0] - n, "%s%d", n ? "," : "", w);
        }
    snprintf(v[MPQ__PM_BPW], sizeof v[0], "%.6f", mpq_packed_bpw(A, 2));
    char *s = v[MPQ__PM_SECTIONS];
    const size_t cap = sizeof v[0];
    s[0] = 0;
    mpq__pm_section(s, cap, "bits", A, A->bits, nbits);
    mpq__pm_section(s, cap, "p_row", A, A->p_row, (size_t)A->rows * 4);
    mpq__pm_section(s, cap, "p_col", A, A->p_col, (size_t)A->cols * 4);
    mpq__pm_section(s, cap, "col_scale", A, A->col_scale, (size_t)A->cols * 4);
    if (A->rot.n) /* its 64-byte header comes before R */
        mpq__pm_section(s, cap, "rotation", A, (const uint8_t *)A->rot.R - 64,
                        64 + 4 * (size_t)A->rot.m * (size_t)A->rot.m + ((size_t)A->rot.n + 7) / 8);
    mpq__pm_section(s, cap, "band_index", A, A->band_off, ((size_t)A->nbands + 1) * 8);
    mpq__pm_section(s, cap, "data", A, A->data, (size_t)A->band_off[A->nbands]);
    if (A->sp_row_ptr) {
        mpq__pm_section(s, cap, "sp_row_ptr", A, A->sp_row_ptr, ((size_t)A->rows + 1) * 4);
        if (A->sp_col16)
            mpq__pm_section(s, cap, "sp_col", A, A->sp_col16, A->sp_nnz * 2);
        else
            mpq__pm_section(s, cap, "sp_col", A, A->sp_col32, A->sp_nnz * 4);
        mpq__pm_section(s, cap, "sp_val", A, A->sp_val, A->sp_nnz * 2);
    }
}

static int mpq__pm_key(char *key, size_t cap, const char *name, const char *field)
{
    int n = snprintf(key, cap, "mpq.%s.%s", name, field);
    return n > 0 && (size_t)n < cap;
}

/* -------------------------------------------------------------------------- */
/* reader                                                                     */
/* -------------------------------------------------------------------------- */


/* Sort keys: qsort has no user pointer, so each entry carries what it is
   compared by (no global state; the reader is reentrant). */
typedef struct mpq__by_name {
    const char *name;
    int i;
} mpq__by_name;

typedef struct mpq__by_off {
    uint64_t begin, end;
    int i;
} mpq__by_off;

static int mpq__cmp_name(const void *a, const void *b)
{
    return strcmp(((const mpq__by_name *)a)->name, ((const mpq__by_name *)b)->name);
}

static int mpq__cmp_offset(const void *a, const void *b)
{
    const mpq__by_off *x = (const mpq__by_off *)a, *y = (const mpq__by_off *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

struct mpq_st_file {
    mpq__io_in in;
    uint64_t data_start, data_bytes;
    mpq_st_tensor *t;
    int nt;
    mpq__by_name *by_name; /* tensors sorted by name */
    char **mkey, **mval;
    int nmeta;
    mpq__by_name *meta_by_key;
};

void mpq_st_close(mpq_st_file *f)
{
    if (!f) return;
    mpq__io_in_close(&f->in);
    for (int i = 0; i < f->nt; i++) free((void *)(uintptr_t)f->t[i].name);
    for (int i = 0; i < f->nmeta; i++) {
        free(f->mkey[i]);
        free(f->mval[i]);
    }
    free(f->t);
    free(f->by_name);
    free(f->mkey);
    free(f->mval);
    free(f->meta_by_key);
    free(f);
}

/* A JSON number that is a non-negative integer below 2^53. */
static int mpq__json_u53(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0.0) || !(v < MPQ_ST_MAX_INT) || v != floor(v)) return 0;
    *out = (uint64_t)v;
    return 1;
}

static mpq_status mpq__parse_tensor(mpq_st_file *f, const cJSON *o, mpq_st_tensor *t, mpq_io_err *err)
{
    const char *P = f->in.path, *N = t->name;
    if (!cJSON_IsObject(o)) return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "entry is not a JSON object");
    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *c = o->child; c; c = c->next) {
        const cJSON **slot = strcmp(c->string, "dtype") == 0 ? &dtype
            : strcmp(c->string, "shape") == 0                ? &shape
            : strcmp(c->string, "data_offsets") == 0         ? &offs
                                                             : NULL;
        if (!slot) return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "unknown field '%.100s'", c->string);
        if (*slot) return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "field '%s' appears twice", c->string);
        *slot = c;
    }
    if (!dtype || !shape || !offs)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "missing field '%s'",
                            !dtype       ? "dtype"
                                : !shape ? "shape"
                                         : "data_offsets");
    if (!cJSON_IsString(dtype) || !mpq__dtype_parse(dtype->valuestring, &t->dtype))
        return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "unknown dtype %.40s",
                            cJSON_IsString(dtype) ? dtype->valuestring : "(not a string)");
    if (!cJSON_IsArray(shape)) return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "shape is not an array");
    const int nd = cJSON_GetArraySize(shape);
    if (nd > MPQ_ST_MAX_DIMS)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "%d dimensions (mpq reads at most %d)", nd, MPQ_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int k = 0;
    for (const cJSON *c = shape->child; c; c = c->next, k++) {
        if (!mpq__json_u53(c, &t->shape[k]))
            return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "dimension %d is not an integer in 0..2^53", k);
        if (t->shape[k] && numel > UINT64_MAX / t->shape[k])
            return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "element count overflows");
        numel *= t->shape[k];
    }
    t->numel = numel;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !mpq__json_u53(offs->child, &t->begin) ||
        !mpq__json_u53(offs->child->next, &t->end))
        return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "data_offsets is not two integers in 0..2^53");
    const size_t es = mpq_dtype_size(t->dtype);
    if (numel > UINT64_MAX / es) return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "byte count overflows");
    if (t->end < t->begin)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "data_offsets end %llu is before begin %llu",
                            (unsigned long long)t->end, (unsigned long long)t->begin);
    if (t->end - t->begin != numel * es)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, P, N, "holds %llu bytes but %s x %llu elements need %llu",
                            (unsigned long long)(t->end - t->begin), mpq__dtypes[t->dtype].name,
                            (unsigned long long)numel, (unsigned long long)(numel * es));
    return MPQ_OK;
}

/* Everything but the tensor bytes: JSON, names, offsets, packed marks. */
static mpq_status mpq__parse_header(mpq_st_file *f, const char *hdr, size_t n, mpq_io_err *err)
{
    const char *P = f->in.path;
    size_t bad = mpq__io_utf8_check((const uint8_t *)hdr, n);
    if (bad != n) return mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "header is not UTF-8 text (byte %zu)", bad);
    if (n == 0 || hdr[0] != '{') return mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "header does not start with '{'");
    for (size_t i = 0; i + 1 < n; i++)
        if (hdr[i] == '\\') {
            if (hdr[i + 1] == 'u' && i + 5 < n && memcmp(hdr + i + 2, "0000", 4) == 0)
                return mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "header escapes a NUL character (byte %zu)", i);
            i++;
        }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, n, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + n ? (size_t)(end - hdr) : 0;
        return mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "header is not valid JSON (near byte %zu)", at);
    }
    mpq_status st = MPQ_OK;
    for (const char *q = end; q < hdr + n; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "header has bytes after its JSON object (byte %zu)",
                              (size_t)(q - hdr));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "header is not a JSON object");
        goto done;
    }
    int count = 0, nmeta_obj = 0;
    const cJSON *meta = NULL;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (nmeta_obj++) {
                st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "__metadata__ appears twice");
                goto done;
            }
            meta = c;
        } else
            count++;
    }
    f->t = (mpq_st_tensor *)calloc((size_t)count + 1, sizeof *f->t);
    f->by_name = (mpq__by_name *)malloc(sizeof *f->by_name * ((size_t)count + 1));
    if (!f->t || !f->by_name) {
        st = mpq__io_fail(err, MPQ_ERR_NOMEM, P, NULL, "out of memory for %d tensors", count);
        goto done;
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c == meta) continue;
        mpq_st_tensor *t = &f->t[f->nt];
        if (!(t->name = mpq__io_strdup(c->string))) {
            st = mpq__io_fail(err, MPQ_ERR_NOMEM, P, NULL, "out of memory");
            goto done;
        }
        f->nt++;
        if ((st = mpq__parse_tensor(f, c, t, err)) != MPQ_OK) goto done;
    }
    if (meta) {
        if (!cJSON_IsObject(meta)) {
            st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "__metadata__ is not a JSON object");
            goto done;
        }
        const int nm = cJSON_GetArraySize(meta);
        f->mkey = (char **)calloc((size_t)nm + 1, sizeof(char *));
        f->mval = (char **)calloc((size_t)nm + 1, sizeof(char *));
        f->meta_by_key = (mpq__by_name *)malloc(sizeof *f->meta_by_key * ((size_t)nm + 1));
        if (!f->mkey || !f->mval || !f->meta_by_key) {
            st = mpq__io_fail(err, MPQ_ERR_NOMEM, P, NULL, "out of memory");
            goto done;
        }
        for (const cJSON *c = meta->child; c; c = c->next) {
            if (!cJSON_IsString(c)) {
                st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "__metadata__ value of '%.100s' is not a string",
                                  c->string);
                goto done;
            }
            f->mkey[f->nmeta] = mpq__io_strdup(c->string);
            f->mval[f->nmeta] = mpq__io_strdup(c->valuestring);
            f->nmeta++;
            if (!f->mkey[f->nmeta - 1] || !f->mval[f->nmeta - 1]) {
                st = mpq__io_fail(err, MPQ_ERR_NOMEM, P, NULL, "out of memory");
                goto done;
            }
        }
    }
done:
    cJSON_Delete(root);
    return st;
}

/* Names unique, the tensors tile the data, packed marks consistent. */
static mpq_status mpq__check_layout(mpq_st_file *f, mpq_io_err *err)
{
    const char *P = f->in.path;
    mpq_status st = MPQ_OK;
    mpq__by_off *ord = (mpq__by_off *)malloc(sizeof *ord * ((size_t)f->nt + 1));
    if (!ord) return mpq__io_fail(err, MPQ_ERR_NOMEM, P, NULL, "out of memory");
    for (int i = 0; i < f->nt; i++) {
        f->by_name[i].name = f->t[i].name, f->by_name[i].i = i;
        ord[i].begin = f->t[i].begin, ord[i].end = f->t[i].end, ord[i].i = i;
    }
    for (int i = 0; i < f->nmeta; i++) f->meta_by_key[i].name = f->mkey[i], f->meta_by_key[i].i = i;
    qsort(f->by_name, (size_t)f->nt, sizeof *f->by_name, mpq__cmp_name);
    qsort(ord, (size_t)f->nt, sizeof *ord, mpq__cmp_offset);
    if (f->nmeta) qsort(f->meta_by_key, (size_t)f->nmeta, sizeof *f->meta_by_key, mpq__cmp_name);
    for (int i = 1; i < f->nt; i++)
        if (strcmp(f->by_name[i].name, f->by_name[i - 1].name) == 0) {
            st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, f->by_name[i].name, "name appears twice");
            goto done;
        }
    for (int i = 1; i < f->nmeta; i++)
        if (strcmp(f->meta_by_key[i].name, f->meta_by_key[i - 1].name) == 0) {
            st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "__metadata__ key '%.100s' appears twice",
                              f->meta_by_key[i].name);
            goto done;
        }
    uint64_t pos = 0;
    for (int i = 0; i < f->nt; i++) {
        const mpq_st_tensor *t = &f->t[ord[i].i];
        if (t->begin != pos) {
            st = mpq__io_fail(
                err, MPQ_ERR_FORMAT, P, t->name, "data begins at %llu but the previous tensor ends at %llu (%s)",
                (unsigned long long)t->begin, (unsigned long long)pos, t->begin < pos ? "overlap" : "gap");
            goto done;
        }
        pos = t->end;
    }
    if (pos != f->data_bytes) {
        st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "tensors cover %llu data bytes but the file holds %llu",
                          (unsigned long long)pos, (unsigned long long)f->data_bytes);
        goto done;
    }
    const char *ver = mpq_st_meta(f, "mpq.version");
    if (ver && strcmp(ver, "1") != 0) {
        st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, NULL, "mpq.version is '%.20s'; this reader knows '1'", ver);
        goto done;
    }
    for (int i = 0; i < f->nmeta; i++) {
        const char *k = f->mkey[i];
        const size_t kl = strlen(k), fl = strlen(".format");
        if (kl <= 4 + fl || strncmp(k, "mpq.", 4) != 0 || strcmp(k + kl - fl, ".format") != 0) continue;
        char *name = (char *)malloc(kl);
        if (!name) {
            st = mpq__io_fail(err, MPQ_ERR_NOMEM, P, NULL, "out of memory");
            goto done;
        }
        memcpy(name, k + 4, kl - 4 - fl);
        name[kl - 4 - fl] = 0;
        mpq_st_tensor *t = (mpq_st_tensor *)(uintptr_t)mpq_st_find(f, name);
        if (!t) {
            /* "mpq.x.format" of a tensor "x.format..." would be ambiguous only
               if such a tensor existed; with none, the key is wrong. */
            st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, name,
                              "metadata marks it as packed but the file holds no such tensor");
        } else if (t->dtype != MPQ_DT_U8 || t->ndim != 1) {
            st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, name,
                              "marked as packed but is %s with %d dimensions (needs U8, 1)", mpq__dtypes[t->dtype].name,
                              t->ndim);
        } else if (strcmp(f->mval[i], "bitplane") == 0) {
            t->packed = MPQ_FORMAT_BITPLANE;
        } else if (strcmp(f->mval[i], "mxint") == 0) {
            t->packed = MPQ_FORMAT_MXINT;
        } else {
            st = mpq__io_fail(err, MPQ_ERR_FORMAT, P, name, "unknown packed format '%.40s'", f->mval[i]);
        }
        free(name);
        if (st != MPQ_OK) goto done;
    }
done:
    free(ord);
    return st;
}

static mpq_status mpq__read_at(mpq_st_file *f, uint64_t off, void *dst, size_t n, const char *name, mpq_io_err *err)
{
    return mpq__io_read(&f->in, off, dst, n, name, err);
}

static mpq_status mpq__open_common(mpq_st_file *f, mpq_io_err *err)
{
    uint8_t h8[8];
    if (f->in.bytes < 8)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, NULL,
                            "%llu bytes: too short for a header (not a safetensors file)",
                            (unsigned long long)f->in.bytes);
    mpq_status st = mpq__read_at(f, 0, h8, 8, NULL, err);
    if (st != MPQ_OK) return st;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | h8[i];
    /* a header length that cannot be, and no '{' after it: some other file
       (text, GGUF, a pickle) rather than a damaged safetensors one */
    uint8_t c8 = '{';
    if ((n > MPQ_ST_MAX_HEADER || n > f->in.bytes - 8) && f->in.bytes > 8 &&
        (st = mpq__read_at(f, 8, &c8, 1, NULL, err)) != MPQ_OK)
        return st;
    if (c8 != '{') {
        char shown[9];
        for (int i = 0; i < 8; i++) shown[i] = h8[i] >= 0x20 && h8[i] < 0x7f ? (char)h8[i] : '.';
        shown[8] = 0;
        return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, NULL,
                            "not a safetensors file (it starts with \"%s\", not an 8-byte header length and '{')",
                            shown);
    }
    if (n > MPQ_ST_MAX_HEADER)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, NULL, "header length %llu exceeds the limit of %u bytes",
                            (unsigned long long)n, MPQ_ST_MAX_HEADER);
    if (n > f->in.bytes - 8)
        return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, NULL,
                            "header length %llu is larger than the file (%llu bytes)", (unsigned long long)n,
                            (unsigned long long)f->in.bytes);
    f->data_start = 8 + n;
    f->data_bytes = f->in.bytes - f->data_start;
    char *hdr = (char *)malloc((size_t)n + 1);
    if (!hdr)
        return mpq__io_fail(err, MPQ_ERR_NOMEM, f->in.path, NULL, "out of memory for a %llu-byte header",
                            (unsigned long long)n);
    st = mpq__read_at(f, 8, hdr, (size_t)n, NULL, err);
    if (st == MPQ_OK) {
        hdr[n] = 0;
        st = mpq__parse_header(f, hdr, (size_t)n, err);
    }
    free(hdr);
    if (st == MPQ_OK) st = mpq__check_layout(f, err);
    return st;
}

mpq_status mpq_st_open(const char *path, mpq_st_file **out, mpq_io_err *err)
{
    if (!path || !out) return mpq__io_fail(err, MPQ_ERR_ARG, path, NULL, "NULL argument");
    mpq_st_file *f = (mpq_st_file *)calloc(1, sizeof *f);
    if (!f) return mpq__io_fail(err, MPQ_ERR_NOMEM, path, NULL, "out of memory");
    mpq_status st = mpq__io_in_file(&f->in, path, err);
    if (st == MPQ_OK) st = mpq__open_common(f, err);
    if (st != MPQ_OK) {
        mpq_st_close(f);
        return st;
    }
    *out = f;
    return MPQ_OK;
}

mpq_status mpq_st_open_memory(const void *buf, size_t bytes, mpq_st_file **out, mpq_io_err *err)
{
    if ((!buf && bytes) || !out) return mpq__io_fail(err, MPQ_ERR_ARG, NULL, NULL, "NULL argument");
    mpq_st_file *f = (mpq_st_file *)calloc(1, sizeof *f);
    if (!f) return mpq__io_fail(err, MPQ_ERR_NOMEM, NULL, NULL, "out of memory");
    mpq_status st = mpq__io_in_memory(&f->in, buf, bytes, err);
    if (st == MPQ_OK) st = mpq__open_common(f, err);
    if (st != MPQ_OK) {
        mpq_st_close(f);
        return st;
    }
    *out = f;
    return MPQ_OK;
}

int mpq_st_count(const mpq_st_file *f) { return f ? f->nt : 0; }

const mpq_st_tensor *mpq_st_at(const mpq_st_file *f, int i) { return f && i >= 0 && i < f->nt ? &f->t[i] : NULL; }

const mpq_st_tensor *mpq_st_find(const mpq_st_file *f, const char *name)
{
    if (!f || !name) return NULL;
    int lo = 0, hi = f->nt - 1;
    while (lo <= hi) {
        const int mid = lo + (hi - lo) / 2, c = strcmp(name, f->by_name[mid].name);
        if (c == 0) return &f->t[f->by_name[mid].i];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

int mpq_st_meta_count(const mpq_st_file *f) { return f ? f->nmeta : 0; }

void mpq_st_meta_at(const mpq_st_file *f, int i, const char **key, const char **value)
{
    const int ok = f && i >= 0 && i < f->nmeta;
    if (key) *key = ok ? f->mkey[i] : NULL;
    if (value) *value = ok ? f->mval[i] : NULL;
}

const char *mpq_st_meta(const mpq_st_file *f, const char *key)
{
    if (!f || !key) return NULL;
    int lo = 0, hi = f->nmeta - 1;
    while (lo <= hi) {
        const int mid = lo + (hi - lo) / 2, c = strcmp(key, f->meta_by_key[mid].name);
        if (c == 0) return f->mval[f->meta_by_key[mid].i];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

uint64_t mpq_st_file_bytes(const mpq_st_file *f) { return f ? f->in.bytes : 0; }
const char *mpq_st_path(const mpq_st_file *f) { return f ? f->in.path : NULL; }

/* t must be one of f's own tensors. */
static int mpq__owns(const mpq_st_file *f, const mpq_st_tensor *t) { return f && t && t >= f->t && t < f->t + f->nt; }

mpq_status mpq_st_read(mpq_st_file *f, const mpq_st_tensor *t, void *dst, size_t bytes, mpq_io_err *err)
{
    if (!mpq__owns(f, t) || (!dst && bytes))
        return mpq__io_fail(err, MPQ_ERR_ARG, f ? f->in.path : NULL, NULL, "bad argument");
    if ((uint64_t)bytes != t->end - t->begin)
        return mpq__io_fail(err, MPQ_ERR_SIZE, f->in.path, t->name, "holds %llu bytes, the caller's buffer %zu",
                            (unsigned long long)(t->end - t->begin), bytes);
    return mpq__read_at(f, f->data_start + t->begin, dst, bytes, t->name, err);
}

mpq_status mpq_st_map(mpq_st_file *f, const mpq_st_tensor *t, const void **data, mpq_io_err *err)
{
    if (!mpq__owns(f, t) || !data) return mpq__io_fail(err, MPQ_ERR_ARG, f ? f->in.path : NULL, NULL, "bad argument");
    const uint8_t *base;
    mpq_status st = mpq__io_map(&f->in, &base, err);
    if (st == MPQ_OK) *data = base + f->data_start + t->begin;
    return st;
}

void mpq_st_prefetch(mpq_st_file *f, const mpq_st_tensor *t)
{
    if (mpq__owns(f, t)) mpq__io_prefetch(&f->in, f->data_start + t->begin, t->end - t->begin);
}

mpq_status mpq_st_check(const mpq_st_file *f, mpq_io_err *err)
{
    if (!f) return mpq__io_fail(err, MPQ_ERR_ARG, NULL, NULL, "bad argument");
    return mpq__io_check(&f->in, err);
}

mpq_status mpq_st_read_f32(mpq_st_file *f, const mpq_st_tensor *t, float *dst, size_t n, mpq_io_err *err)
{
    if (!mpq__owns(f, t) || (!dst && n))
        return mpq__io_fail(err, MPQ_ERR_ARG, f ? f->in.path : NULL, NULL, "bad argument");
    if (t->dtype != MPQ_DT_F32 && t->dtype != MPQ_DT_F16 && t->dtype != MPQ_DT_BF16 && t->dtype != MPQ_DT_F64)
        return mpq__io_fail(err, MPQ_ERR_ARG, f->in.path, t->name, "dtype %s is not a float type mpq converts",
                            mpq__dtypes[t->dtype].name);
    if ((uint64_t)n != t->numel)
        return mpq__io_fail(err, MPQ_ERR_SIZE, f->in.path, t->name, "holds %llu values, the caller's buffer %zu",
                            (unsigned long long)t->numel, n);
    const uint64_t off = f->data_start + t->begin;
    if (t->dtype == MPQ_DT_F32) return mpq__read_at(f, off, dst, n * 4, t->name, err);
    const size_t es = mpq_dtype_size(t->dtype), per = MPQ_ST_CHUNK / es;
    void *tmp = malloc(MPQ_ST_CHUNK);
    if (!tmp) return mpq__io_fail(err, MPQ_ERR_NOMEM, f->in.path, t->name, "out of memory");
    mpq_status st = MPQ_OK;
    for (size_t i = 0; i < n && st == MPQ_OK; i += per) {
        const size_t k = n - i < per ? n - i : per;
        st = mpq__read_at(f, off + (uint64_t)i * es, tmp, k * es, t->name, err);
        if (st != MPQ_OK) break;
        if (t->dtype == MPQ_DT_F16) {
            mpq_f16_to_f32_n((const uint16_t *)tmp, dst + i, k);
        } else if (t->dtype == MPQ_DT_BF16) {
            const uint16_t *h = (const uint16_t *)tmp;
            for (size_t j = 0; j < k; j++) dst[i + j] = mpq_bf16_to_f32(h[j]);
        } else {
            const double *d = (const double *)tmp;
            for (size_t j = 0; j < k; j++) dst[i + j] = (float)d[j];
        }
    }
    free(tmp);
    return st;
}

/* A packed matrix tensor's bytes, validated (mpq_packed_open) and checked
   against its metadata: from the file's mapping when map is set and the
   bytes lie there on a 64-byte boundary (a view, not owned), else read
   into an aligned buffer of their own. */
static mpq_status mpq__packed(mpq_st_file *f, const char *name, int map, mpq_packed *out, mpq_io_err *err)
{
    if (!f || !name || !out) return mpq__io_fail(err, MPQ_ERR_ARG, f ? f->in.path : NULL, name, "NULL argument");
    const mpq_st_tensor *t = mpq_st_find(f, name);
    if (!t) return mpq__io_fail(err, MPQ_ERR_ARG, f->in.path, name, "no such tensor");
    if (!t->packed)
        return mpq__io_fail(err, MPQ_ERR_ARG, f->in.path, name, "is not a packed matrix (no mpq.%.100s.format)", name);
    const size_t bytes = (size_t)(t->end - t->begin);
    if (bytes == 0) return mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, name, "packed matrix of 0 bytes");
    const uint8_t *base = NULL;
    if (map && mpq__io_map(&f->in, &base, NULL) != MPQ_OK) base = NULL; /* cannot be mapped: read */
    const void *at = base ? base + f->data_start + t->begin : NULL;
    void *buf = NULL;
    mpq_packed A;
    mpq_status st = MPQ_OK;
    if (!at || (uintptr_t)at % 64) {
        if (!(buf = mpq_aligned_alloc(bytes)))
            return mpq__io_fail(err, MPQ_ERR_NOMEM, f->in.path, name, "out of memory for %zu bytes", bytes);
        st = mpq__read_at(f, f->data_start + t->begin, buf, bytes, name, err);
        at = buf;
    }
    if (st == MPQ_OK) {
        st = mpq_packed_open(at, bytes, &A);
        if (st != MPQ_OK) mpq__io_fail(err, st, f->in.path, name, "packed buffer rejected: %s", mpq_status_str(st));
    }
    if (st == MPQ_OK && A.format != t->packed)
        st = mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, name, "metadata says %s but the buffer is %s",
                          t->packed == MPQ_FORMAT_MXINT ? "mxint" : "bitplane",
                          A.format == MPQ_FORMAT_MXINT ? "mxint" : "bitplane");
    if (st == MPQ_OK) {
        mpq__pm_values v;
        mpq__pm_values_of(&A, v);
        char key[600];
        for (int i = 0; i < MPQ__PM_COUNT && st == MPQ_OK; i++) {
            if (!mpq__pm_key(key, sizeof key, name, mpq__pm_field[i])) {
                st = mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, name, "name too long for its metadata keys");
                break;
            }
            const char *have = mpq_st_meta(f, key);
            if (!have)
                st = mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, name, "metadata %.300s is missing", key);
            else if (strcmp(have, v[i]) != 0)
                st = mpq__io_fail(err, MPQ_ERR_FORMAT, f->in.path, name,
                                  "metadata %s is '%.60s' but the matrix has '%.60s'", mpq__pm_field[i], have, v[i]);
        }
    }
    if (st != MPQ_OK) {
        mpq_aligned_free(buf);
        return st;
    }
    A.owned = buf != NULL;
    *out = A;
    return MPQ_OK;
}

mpq_status mpq_st_read_packed(mpq_st_file *f, const char *name, mpq_packed *out, mpq_io_err *err)
{
    return mpq__packed(f, name, 0, out, err);
}

mpq_status mpq_st_map_packed(mpq_st_file *f, const char *name, mpq_packed *out, mpq_io_err *err)
{
    return mpq__packed(f, name, 1, out, err);
}

/* -------------------------------------------------------------------------- */
/* writer                                                                     */
/* -------------------------------------------------------------------------- */

typedef struct mpq__wentry {
    char *name;
    mpq_dtype dtype;
    int ndim;
    uint64_t shape[MPQ_ST_MAX_DIMS];
    uint64_t begin, end;
} mpq__wentry;

struct mpq_st_writer {
    char *path;
    int spool;     /* unlinked file holding the tensor bytes, from byte `base` on */
    int tmpfile;   /* the spool is an O_TMPFILE file: it can be given a name at the end */
    uint64_t base; /* bytes reserved before the data for the header (mpq_st_writer_reserve) */
    uint64_t pos;
    mpq__wentry *e;
    int ne, cape;
    char **mkey, **mval;
    int nmeta, capm;
    int packed; /* a packed matrix was added: write mpq.version */
};

static void mpq__writer_free(mpq_st_writer *w)
{
    if (!w) return;
    if (w->spool >= 0) close(w->spool);
    for (int i = 0; i < w->ne; i++) free(w->e[i].name);
    for (int i = 0; i < w->nmeta; i++) {
        free(w->mkey[i]);
        free(w->mval[i]);
    }
    free(w->e);
    free(w->mkey);
    free(w->mval);
    free(w->path);
    free(w);
}

void mpq_st_writer_abort(mpq_st_writer *w) { mpq__writer_free(w); }

/* A temporary file beside `path` (same directory, so rename works). */
static int mpq__mktemp(const char *path, const char *tag, char **name_out)
{
    const size_t n = strlen(path) + strlen(tag) + 8;
    char *tmpl = (char *)malloc(n);
    if (!tmpl) {
        errno = ENOMEM;
        return -1;
    }
    snprintf(tmpl, n, "%s%sXXXXXX", path, tag);
    int fd = mkstemp(tmpl);
    if (fd < 0) {
        free(tmpl);
        return -1;
    }
    *name_out = tmpl;
    return fd;
}

static int mpq__write_all(int fd, const void *p, size_t n)
{
    const uint8_t *s = (const uint8_t *)p;
    while (n) {
        ssize_t k = write(fd, s, n < ((size_t)1 << 30) ? n : ((size_t)1 << 30));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        s += k, n -= (size_t)k;
    }
    return 0;
}

mpq_status mpq_st_writer_open(const char *path, mpq_st_writer **out, mpq_io_err *err)
{
    if (!path || !*path || !out) return mpq__io_fail(err, MPQ_ERR_ARG, path, NULL, "no file name");
    mpq_st_writer *w = (mpq_st_writer *)calloc(1, sizeof *w);
    if (!w || !(w->path = mpq__io_strdup(path))) {
        free(w);
        return mpq__io_fail(err, MPQ_ERR_NOMEM, path, NULL, "out of memory");
    }
    char *spool = NULL;
    w->spool = -1;
#ifdef O_TMPFILE
    { /* a nameless file in the target's directory, which close can link in place of a copy */
        char *dir = mpq__io_strdup(path);
        if (dir) {
            char *slash = strrchr(dir, '/');
            const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
            w->spool = open(d, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
            w->tmpfile = w->spool >= 0;
            free(dir);
        }
    }
#endif
    if (w->spool < 0) w->spool = mpq__mktemp(path, ".spool-", &spool);
    if (w->spool < 0) {
        mpq_status st =
            mpq__io_fail(err, MPQ_ERR_IO, path, NULL, "cannot create a file beside it: %s", strerror(errno));
        mpq__writer_free(w);
        return st;
    }
    if (spool) unlink(spool); /* the bytes live as long as the descriptor */
    free(spool);
    *out = w;
    return MPQ_OK;
}

mpq_status mpq_st_writer_reserve(mpq_st_writer *w, uint64_t header_bytes, mpq_io_err *err)
{
    if (!w) return mpq__io_fail(err, MPQ_ERR_ARG, NULL, NULL, "NULL writer");
    if (w->pos || w->ne) return mpq__io_fail(err, MPQ_ERR_ARG, w->path, NULL, "reserve before the first tensor");
    for (int i = 0; i < w->nmeta; i++) { /* the metadata given so far, with room for escapes */
        const uint64_t kv = strlen(w->mkey[i]) + strlen(w->mval[i]);
        header_bytes += kv + kv / 8 + 16;
    }
    if (header_bytes > MPQ_ST_MAX_HEADER) header_bytes = MPQ_ST_MAX_HEADER;
    w->base =
        w->tmpfile ? (8 + header_bytes + 63) / 64 * 64 : 0; /* without a nameless file the data is copied anyway */
    return MPQ_OK;
}

/* Shape, size and name checks shared by every tensor writer. */
static mpq_status mpq__check_new(mpq_st_writer *w, const char *name, mpq_dtype dtype, int ndim, const uint64_t *shape,
                                 uint64_t *numel, mpq_io_err *err)
{
    if (!w) return mpq__io_fail(err, MPQ_ERR_ARG, NULL, name, "NULL writer");
    if (!name || !*name || !mpq__utf8_ok(name) || strcmp(name, "__metadata__") == 0)
        return mpq__io_fail(err, MPQ_ERR_ARG, w->path, NULL, "tensor name is empty, not UTF-8 or reserved");
    if (mpq_dtype_size(dtype) == 0) return mpq__io_fail(err, MPQ_ERR_ARG, w->path, name, "unknown dtype");
    if (ndim < 0 || ndim > MPQ_ST_MAX_DIMS || (ndim && !shape))
        return mpq__io_fail(err, MPQ_ERR_ARG, w->path, name, "%d dimensions (0..%d)", ndim, MPQ_ST_MAX_DIMS);
    for (int i = 0; i < w->ne; i++)
        if (strcmp(w->e[i].name, name) == 0) return mpq__io_fail(err, MPQ_ERR_ARG, w->path, name, "written twice");
    uint64_t n = 1;
    for (int k = 0; k < ndim; k++) {
        if ((double)shape[k] >= MPQ_ST_MAX_INT || (shape[k] && n > UINT64_MAX / shape[k]))
            return mpq__io_fail(err, MPQ_ERR_SIZE, w->path, name, "shape too large");
        n *= shape[k];
    }
    if (n > UINT64_MAX / 8 || (double)(w->pos + n * mpq_dtype_size(dtype)) >= MPQ_ST_MAX_INT)
        return mpq__io_fail(err, MPQ_ERR_SIZE, w->path, name, "file would exceed 2^53 bytes");
    if (w->ne == w->cape) {
        const int cap = w->cape ? 2 * w->cape : 16;
        mpq__wentry *e = (mpq__wentry *)realloc(w->e, sizeof *e * (size_t)cap);
        if (!e) return mpq__io_fail(err, MPQ_ERR_NOMEM, w->path, name, "out of memory");
        w->e = e, w->cape = cap;
    }
    *numel = n;
    return MPQ_OK;
}

static mpq_status mpq__add_entry(mpq_st_writer *w, const char *name, mpq_dtype dtype, int ndim, const uint64_t *shape,
                                 uint64_t bytes, mpq_io_err *err)
{
    mpq__wentry *e = &w->e[w->ne];
    memset(e, 0, sizeof *e);
    if (!(e->name = mpq__io_strdup(name))) return mpq__io_fail(err, MPQ_ERR_NOMEM, w->path, name, "out of memory");
    e->dtype = dtype, e->ndim = ndim;
    for (int k = 0; k < ndim; k++) e->shape[k] = shape[k];
    e->begin = w->pos, e->end = w->pos + bytes;
    w->pos += bytes;
    w->ne++;
    return MPQ_OK;
}

/* On a failed spool write the writer keeps its earlier tensors; the spool's
   tail is overwritten by the next tensor (positions come from w->pos). */
static mpq_status mpq__spool(mpq_st_writer *w, const char *name, uint64_t at, const void *p, size_t n, mpq_io_err *err)
{
    if (lseek(w->spool, (off_t)(w->base + at), SEEK_SET) < 0 || mpq__write_all(w->spool, p, n) != 0)
        return mpq__io_fail(err, MPQ_ERR_IO, w->path, name, "write failed: %s", strerror(errno));
    return MPQ_OK;
}

mpq_status mpq_st_write(mpq_st_writer *w, const char *name, mpq_dtype dtype, int ndim, const uint64_t *shape,
                        const void *data, size_t bytes, mpq_io_err *err)
{
    uint64_t n;
    mpq_status st = mpq__check_new(w, name, dtype, ndim, shape, &n, err);
    if (st != MPQ_OK) return st;
    if (n * mpq_dtype_size(dtype) != (uint64_t)bytes || (!data && bytes))
        return mpq__io_fail(err, MPQ_ERR_SIZE, w->path, name, "%zu bytes given, shape and dtype need %llu", bytes,
                            (unsigned long long)(n * mpq_dtype_size(dtype)));
    if ((st = mpq__spool(w, name, w->pos, data, bytes, err)) != MPQ_OK) return st;
    return mpq__add_entry(w, name, dtype, ndim, shape, bytes, err);
}

mpq_status mpq_st_write_f32(mpq_st_writer *w, const char *name, mpq_dtype dtype, int ndim, const uint64_t *shape,
                            const float *x, mpq_io_err *err)
{
    uint64_t n;
    mpq_status st = mpq__check_new(w, name, dtype, ndim, shape, &n, err);
    if (st != MPQ_OK) return st;
    if (dtype != MPQ_DT_F32 && dtype != MPQ_DT_F16 && dtype != MPQ_DT_BF16)
        return mpq__io_fail(err, MPQ_ERR_ARG, w->path, name, "floats are written as F32, F16 or BF16, not %s",
                            mpq__dtypes[dtype].name);
    if (!x && n) return mpq__io_fail(err, MPQ_ERR_ARG, w->path, name, "NULL data");
    if ((uint64_t)(size_t)n != n) return mpq__io_fail(err, MPQ_ERR_SIZE, w->path, name, "too large for this machine");
    const size_t es = mpq_dtype_size(dtype);
    if (dtype == MPQ_DT_F32) {
        st = mpq__spool(w, name, w->pos, x, (size_t)n * 4, err);
    } else {
        const size_t per = MPQ_ST_CHUNK / 2;
        uint16_t *tmp = (uint16_t *)malloc(MPQ_ST_CHUNK);
        if (!tmp) return mpq__io_fail(err, MPQ_ERR_NOMEM, w->path, name, "out of memory");
        for (size_t i = 0; i < (size_t)n && st == MPQ_OK; i += per) {
            const size_t k = (size_t)n - i < per ? (size_t)n - i : per;
            if (dtype == MPQ_DT_F16)
                mpq_f32_to_f16_n(x + i, tmp, k);
            else
                for (size_t j = 0; j < k; j++) tmp[j] = mpq_f32_to_bf16(x[i + j]);
            st = mpq__spool(w, name, w->pos + (uint64_t)i * 2, tmp, k * 2, err);
        }
        free(tmp);
    }
    if (st != MPQ_OK) return st;
    return mpq__add_entry(w, name, dtype, ndim, shape, n * es, err);
}

static mpq_status mpq__add_meta(mpq_st_writer *w, const char *key, const char *value, mpq_io_err *err)
{
    for (int i = 0; i < w->nmeta; i++)
        if (strcmp(w->mkey[i], key) == 0)
            return mpq__io_fail(err, MPQ_ERR_ARG, w->path, NULL, "metadata key '%.100s' written twice", key);
    if (w->nmeta == w->capm) {
        const int cap = w->capm ? 2 * w->capm : 16;
        char **k = (char **)realloc(w->mkey, sizeof(char *) * (size_t)cap);
        if (!k) return mpq__io_fail(err, MPQ_ERR_NOMEM, w->path, NULL, "out of memory");
        w->mkey = k;
        char **v = (char **)realloc(w->mval, sizeof(char *) * (size_t)cap);
        if (!v) return mpq__io_fail(err, MPQ_ERR_NOMEM, w->path, NULL, "out of memory");
        w->mval = v, w->capm = cap;
    }
    char *k = mpq__io_strdup(key), *v = mpq__io_strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return mpq__io_fail(err, MPQ_ERR_NOMEM, w->path, NULL, "out of memory");
    }
    w->mkey[w->nmeta] = k, w->mval[w->nmeta] = v, w->nmeta++;
    return MPQ_OK;
}

mpq_status mpq_st_write_meta(mpq_st_writer *w, const char *key, const char *value, mpq_io_err *err)
{
    if (!w || !key || !value) return mpq__io_fail(err, MPQ_ERR_ARG, w ? w->path : NULL, NULL, "NULL argument");
    if (!mpq__utf8_ok(key) || !mpq__utf8_ok(value))
        return mpq__io_fail(err, MPQ_ERR_ARG, w->path, NULL, "metadata is not UTF-8");
    if (strncmp(key, "mpq.", 4) == 0)
        return mpq__io_fail(err, MPQ_ERR_ARG, w->path, NULL, "metadata keys 'mpq.*' are written by mpq itself");
    return mpq__add_meta(w, key, value, err);
}

mpq_status mpq_st_write_packed(mpq_st_writer *w, const char *name, const mpq_packed *A, mpq_io_err *err)
{
    if (!w || !A || !A->buf || !A->bits || !A->band_off)
        return mpq__io_fail(err, MPQ_ERR_ARG, w ? w->path : NULL, name, "not a packed matrix");
    if (!name) return mpq__io_fail(err, MPQ_ERR_ARG, w->path, NULL, "no name");
    char key[600];
    for (int i = 0; i < MPQ__PM_COUNT; i++) {
        if (!mpq__pm_key(key, sizeof key, name, mpq__pm_field[i]))
            return mpq__io_fail(err, MPQ_ERR_ARG, w->path, name, "name too long");
        for (int j = 0; j < w->nmeta; j++)
            if (strcmp(w->mkey[j], key) == 0) return mpq__io_fail(err, MPQ_ERR_ARG, w->path, name, "written twice");
    }
    const uint64_t shape[1] = {(uint64_t)A->bytes};
    mpq_status st = mpq_st_write(w, name, MPQ_DT_U8, 1, shape, A->buf, A->bytes, err);
    if (st != MPQ_OK) return st;
    mpq__pm_values v;
    mpq__pm_values_of(A, v);
    for (int i = 0; i < MPQ__PM_COUNT && st == MPQ_OK; i++) {
        mpq__pm_key(key, sizeof key, name, mpq__pm_field[i]);
        st = mpq__add_meta(w, key, v[i], err);
    }
    w->packed = 1;
    return st;
}

static cJSON *mpq__json_u64_array(const uint64_t *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *x = cJSON_CreateNumber((double)v[i]);
        if (!x || !cJSON_AddItemToArray(a, x)) {
            cJSON_Delete(x);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

static char *mpq__header_json(mpq_st_writer *w)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    int ok = 1;
    if (w->packed && ok) ok = mpq__add_meta(w, "mpq.version", "1", NULL) == MPQ_OK;
    if (w->nmeta && ok) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (int i = 0; ok && i < w->nmeta; i++) ok = cJSON_AddStringToObject(m, w->mkey[i], w->mval[i]) != NULL;
    }
    for (int i = 0; ok && i < w->ne; i++) {
        const mpq__wentry *e = &w->e[i];
        cJSON *o = cJSON_AddObjectToObject(root, e->name);
        const uint64_t offs[2] = {e->begin, e->end};
        cJSON *shape = mpq__json_u64_array(e->shape, e->ndim), *off = mpq__json_u64_array(offs, 2);
        ok = o && shape && off && cJSON_AddStringToObject(o, "dtype", mpq__dtypes[e->dtype].name);
        if (ok) ok = cJSON_AddItemToObject(o, "shape", shape), shape = NULL;
        if (ok) ok = cJSON_AddItemToObject(o, "data_offsets", off), off = NULL;
        cJSON_Delete(shape);
        cJSON_Delete(off);
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* The spool made the file: the header (N = base - 8, the JSON padded with
   spaces) written at its start, synced, and the nameless file linked under
   a temporary name beside the target (*tmpname). 0 on success; otherwise
   nothing is linked and the caller copies. */
static int mpq__finish_in_place(mpq_st_writer *w, const char *json, size_t hn, char **tmpname)
{
    const uint64_t n = w->base - 8;
    uint8_t *h = (uint8_t *)malloc((size_t)w->base);
    if (!h) return -1;
    for (int i = 0; i < 8; i++) h[i] = (uint8_t)(n >> (8 * i));
    memcpy(h + 8, json, hn);
    memset(h + 8 + hn, ' ', (size_t)(n - hn));
    int bad = lseek(w->spool, 0, SEEK_SET) < 0 || mpq__write_all(w->spool, h, (size_t)w->base) != 0;
    free(h);
    bad = bad || fchmod(w->spool, 0644) != 0 || fsync(w->spool) != 0;
    char *name = NULL, proc[64];
    const int fd = bad ? -1 : mpq__mktemp(w->path, ".tmp-", &name);
    if (fd < 0) return -1;
    close(fd);
    unlink(name); /* the name, free again, for the link */
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", w->spool);
    if (linkat(AT_FDCWD, proc, AT_FDCWD, name, AT_SYMLINK_FOLLOW) != 0) {
        free(name);
        return -1;
    }
    *tmpname = name;
    return 0;
}

mpq_status mpq_st_writer_close(mpq_st_writer *w, mpq_io_err *err)
{
    if (!w) return mpq__io_fail(err, MPQ_ERR_ARG, NULL, NULL, "NULL writer");
    mpq_status st = MPQ_OK;
    char *tmpname = NULL, *json = mpq__header_json(w);
    uint8_t *copy = NULL;
    int fd = -1;
    if (!json) {
        st = mpq__io_fail(err, MPQ_ERR_NOMEM, w->path, NULL, "out of memory for the header");
        goto done;
    }
    size_t hn = strlen(json);
    const size_t padded = (8 + hn + 63) / 64 * 64 - 8; /* the data on a 64-byte boundary */
    if (w->base && 8 + padded <= w->base && mpq__finish_in_place(w, json, hn, &tmpname) == 0)
        goto renamed; /* the header written into the room before the data: no copy */
    fd = mpq__mktemp(w->path, ".tmp-", &tmpname);
    copy = (uint8_t *)malloc(MPQ_ST_CHUNK);
    if (fd < 0 || !copy) {
        st = mpq__io_fail(err, fd < 0 ? MPQ_ERR_IO : MPQ_ERR_NOMEM, w->path, NULL, "cannot create a file beside it: %s",
                          strerror(errno));
        goto done;
    }
    uint8_t h8[8];
    for (int i = 0; i < 8; i++) h8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memset(copy, ' ', 8);
    int bad = mpq__write_all(fd, h8, 8) || mpq__write_all(fd, json, hn);
    for (size_t p = hn; !bad && p < padded; p += 8) bad = mpq__write_all(fd, copy, padded - p < 8 ? padded - p : 8);
    for (uint64_t at = 0; !bad && at < w->pos;) {
        const size_t want = w->pos - at < MPQ_ST_CHUNK ? (size_t)(w->pos - at) : MPQ_ST_CHUNK;
        ssize_t got = pread(w->spool, copy, want, (off_t)(w->base + at));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            bad = 1;
            break;
        }
        bad = mpq__write_all(fd, copy, (size_t)got);
        at += (uint64_t)got;
    }
    if (!bad) bad = fchmod(fd, 0644) != 0 || fsync(fd) != 0;
    if (bad) {
        st = mpq__io_fail(err, MPQ_ERR_IO, w->path, NULL, "write failed: %s", strerror(errno));
        goto done;
    }
    if (close(fd) != 0) {
        fd = -1;
        st = mpq__io_fail(err, MPQ_ERR_IO, w->path, NULL, "write failed: %s", strerror(errno));
        goto done;
    }
    fd = -1;
renamed:
    if (rename(tmpname, w->path) != 0) {
        st = mpq__io_fail(err, MPQ_ERR_IO, w->path, NULL, "cannot rename into place: %s", strerror(errno));
        goto done;
    }
    free(tmpname);
    tmpname = NULL;
    { /* make the rename itself durable */
        char *dir = mpq__io_strdup(w->path);
        if (dir) {
            char *slash = strrchr(dir, '/');
            const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
            int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                (void)fsync(dfd);
                close(dfd);
            }
            free(dir);
        }
    }
done:
    if (fd >= 0) close(fd);
    if (tmpname) {
        unlink(tmpname);
        free(tmpname);
    }
    free(copy);
    cJSON_free(json);
    mpq__writer_free(w);
    return st;
}
