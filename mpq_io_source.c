/* mpq_io_source.c - a model's tensors from a GGUF file, a safetensors file
   or a Hugging Face checkpoint directory (see mpq_io.h, MODEL SOURCES). */
#define _XOPEN_SOURCE 700
#include "mpq_io.h"
#include "mpq_priv.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct mpq__stensor {
    mpq_source_tensor pub;
    int file;                  /* safetensors: index into files */
    const mpq_st_tensor *st;   /* safetensors: the entry */
    const mpq_gguf_tensor *gg; /* GGUF: the entry */
} mpq__stensor;

typedef struct mpq__sname {
    const char *name;
    int i;
} mpq__sname;

struct mpq_source {
    mpq_source_kind kind;
    char *path;
    char *dir; /* where description files are looked for; NULL for GGUF */
    mpq_gguf_file *gguf;
    mpq_st_file **files;
    int nfiles;
    mpq__stensor *t;
    int nt;
    mpq__sname *sorted;
};

void mpq_source_close(mpq_source *s)
{
    if (!s) return;
    mpq_gguf_close(s->gguf);
    for (int i = 0; i < s->nfiles; i++) mpq_st_close(s->files[i]);
    free(s->files);
    free(s->t);
    free(s->sorted);
    free(s->path);
    free(s->dir);
    free(s);
}

static int mpq__cmp_sname(const void *a, const void *b)
{
    return strcmp(((const mpq__sname *)a)->name, ((const mpq__sname *)b)->name);
}

/* dir + "/" + name, malloc'ed. */
static char *mpq__join(const char *dir, const char *name)
{
    const size_t n = strlen(dir) + strlen(name) + 2;
    char *p = (char *)malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* The directory part of a file's path ("." when it has none). */
static char *mpq__dirname(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return mpq__io_strdup(".");
    if (slash == path) return mpq__io_strdup("/");
    char *d = (char *)malloc((size_t)(slash - path) + 1);
    if (d) {
        memcpy(d, path, (size_t)(slash - path));
        d[slash - path] = 0;
    }
    return d;
}

static int mpq__is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A whole text file, up to MPQ_SOURCE_MAX_TEXT bytes, NUL-terminated. */
static mpq_status mpq__slurp(const char *path, char **text, size_t *len, mpq_io_err *err)
{
    mpq__io_in in;
    mpq_status st = mpq__io_in_file(&in, path, err);
    if (st == MPQ_OK && in.bytes > MPQ_SOURCE_MAX_TEXT)
        st = mpq__io_fail(err, MPQ_ERR_FORMAT, path, NULL,
                          "%llu bytes: larger than the limit of %u for a description file",
                          (unsigned long long)in.bytes, MPQ_SOURCE_MAX_TEXT);
    char *b = NULL;
    if (st == MPQ_OK && !(b = (char *)malloc((size_t)in.bytes + 1)))
        st = mpq__io_fail(err, MPQ_ERR_NOMEM, path, NULL, "out of memory");
    if (st == MPQ_OK) st = mpq__io_read(&in, 0, b, (size_t)in.bytes, NULL, err);
    if (st == MPQ_OK) {
        b[in.bytes] = 0;
        *text = b;
        if (len) *len = (size_t)in.bytes;
        b = NULL;
    }
    free(b);
    mpq__io_in_close(&in);
    return st;
}

static mpq_status mpq__add_st_file(mpq_source *s, const char *path, mpq_io_err *err)
{
    mpq_st_file **fs = (mpq_st_file **)realloc(s->files, sizeof *fs * ((size_t)s->nfiles + 1));
    if (!fs) return mpq__io_fail(err, MPQ_ERR_NOMEM, path, NULL, "out of memory");
    s->files = fs;
    mpq_status st = mpq_st_open(path, &s->files[s->nfiles], err);
    if (st == MPQ_OK) s->nfiles++;
    return st;
}

/* The tensor list and the sorted index, from the opened files. */
static mpq_status mpq__collect(mpq_source *s, mpq_io_err *err)
{
    size_t n = 0;
    if (s->gguf) n = (size_t)mpq_gguf_count(s->gguf);
    for (int k = 0; k < s->nfiles; k++) n += (size_t)mpq_st_count(s->files[k]);
    if (n > (size_t)1 << 30) return mpq__io_fail(err, MPQ_ERR_FORMAT, s->path, NULL, "too many tensors");
    s->t = (mpq__stensor *)calloc(n + 1, sizeof *s->t);
    s->sorted = (mpq__sname *)malloc(sizeof *s->sorted * (n + 1));
    if (!s->t || !s->sorted) return mpq__io_fail(err, MPQ_ERR_NOMEM, s->path, NULL, "out of memory");
    if (s->gguf)
        for (int i = 0; i < mpq_gguf_count(s->gguf); i++) {
            const mpq_gguf_tensor *g = mpq_gguf_at(s->gguf, i);
            mpq__stensor *t = &s->t[s->nt++];
            t->gg = g, t->file = -1;
            t->pub.name = g->name;
            t->pub.ndim = g->ndim;
            for (int d = 0; d < g->ndim; d++) t->pub.shape[d] = g->ne[g->ndim - 1 - d];
            t->pub.numel = g->numel, t->pub.bytes = g->bytes;
            t->pub.type = mpq_gguf_type_name(g->type);
            t->pub.is_float = mpq_gguf_type_is_float(g->type);
        }
    for (int k = 0; k < s->nfiles; k++)
        for (int i = 0; i < mpq_st_count(s->files[k]); i++) {
            const mpq_st_tensor *e = mpq_st_at(s->files[k], i);
            mpq__stensor *t = &s->t[s->nt++];
            t->st = e, t->file = k;
            t->pub.name = e->name;
            t->pub.ndim = e->ndim;
            for (int d = 0; d < e->ndim; d++) t->pub.shape[d] = e->shape[d];
            t->pub.numel = e->numel, t->pub.bytes = e->end - e->begin;
            t->pub.packed = e->packed;
            t->pub.type = e->packed == MPQ_FORMAT_MXINT ? "mpq mxint"
                : e->packed                             ? "mpq bitplane"
                                                        : mpq_dtype_name(e->dtype);
            t->pub.is_float = !e->packed &&
                (e->dtype == MPQ_DT_F32 || e->dtype == MPQ_DT_F16 || e->dtype == MPQ_DT_BF16 || e->dtype == MPQ_DT_F64);
        }
    for (int i = 0; i < s->nt; i++) s->sorted[i].name = s->t[i].pub.name, s->sorted[i].i = i;
    qsort(s->sorted, (size_t)s->nt, sizeof *s->sorted, mpq__cmp_sname);
    for (int i = 1; i < s->nt; i++)
        if (strcmp(s->sorted[i].name, s->sorted[i - 1].name) == 0) {
            const mpq__stensor *a = &s->t[s->sorted[i - 1].i], *b = &s->t[s->sorted[i].i];
            return mpq__io_fail(err, MPQ_ERR_FORMAT, mpq_st_path(s->files[b->file]), b->pub.name,
                                "also in %s (a tensor must be in one shard)", mpq_st_path(s->files[a->file]));
        }
    return MPQ_OK;
}

/* A shard name from the index: a plain file name inside the directory. */
static int mpq__plain_name(const char *n)
{
    return *n && !strchr(n, '/') && strcmp(n, ".") != 0 && strcmp(n, "..") != 0;
}

static int mpq__cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A Hugging Face directory: the shards of the index, or model.safetensors. */
static mpq_status mpq__open_dir(mpq_source *s, mpq_io_err *err)
{
    char *index = mpq__join(s->path, "model.safetensors.index.json");
    char *single = mpq__join(s->path, "model.safetensors");
    mpq_status st = MPQ_OK;
    char *text = NULL;
    cJSON *root = NULL;
    const char **shards = NULL;
    if (!index || !single) {
        st = mpq__io_fail(err, MPQ_ERR_NOMEM, s->path, NULL, "out of memory");
        goto done;
    }
    if (!mpq__is_file(index)) {
        if (!mpq__is_file(single)) {
            st = mpq__io_fail(err, MPQ_ERR_IO, s->path, NULL,
                              "holds neither model.safetensors nor model.safetensors.index.json (mpq reads "
                              "safetensors checkpoints; PyTorch .bin files are not read)");
            goto done;
        }
        st = mpq__add_st_file(s, single, err);
        goto done;
    }
    if ((st = mpq__slurp(index, &text, NULL, err)) != MPQ_OK) goto done;
    root = cJSON_Parse(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) {
        st =
            mpq__io_fail(err, MPQ_ERR_FORMAT, index, NULL, root ? "has no \"weight_map\" object" : "is not valid JSON");
        goto done;
    }
    const int n = cJSON_GetArraySize(map);
    shards = (const char **)malloc(sizeof *shards * ((size_t)n + 1));
    if (!shards) {
        st = mpq__io_fail(err, MPQ_ERR_NOMEM, index, NULL, "out of memory");
        goto done;
    }
    int k = 0;
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !mpq__plain_name(e->valuestring)) {
            st = mpq__io_fail(err, MPQ_ERR_FORMAT, index, e->string,
                              "weight_map value is not a file name in the checkpoint's directory");
            goto done;
        }
        shards[k++] = e->valuestring;
    }
    qsort(shards, (size_t)k, sizeof *shards, mpq__cmp_str);
    for (int i = 0; i < k && st == MPQ_OK; i++) {
        if (i && strcmp(shards[i], shards[i - 1]) == 0) continue;
        char *p = mpq__join(s->path, shards[i]);
        st = p ? mpq__add_st_file(s, p, err) : mpq__io_fail(err, MPQ_ERR_NOMEM, s->path, NULL, "out of memory");
        free(p);
    }
    /* every tensor the index lists is where it says */
    for (const cJSON *e = map->child; e && st == MPQ_OK; e = e->next) {
        int found = 0;
        for (int f = 0; f < s->nfiles && !found; f++) {
            const char *fp = mpq_st_path(s->files[f]), *slash = strrchr(fp, '/');
            if (strcmp(slash ? slash + 1 : fp, e->valuestring) == 0)
                found = mpq_st_find(s->files[f], e->string) != NULL;
        }
        if (!found)
            st = mpq__io_fail(err, MPQ_ERR_FORMAT, index, e->string, "listed in shard %.200s, which does not hold it",
                              e->valuestring);
    }
done:
    free(shards);
    cJSON_Delete(root);
    free(text);
    free(index);
    free(single);
    return st;
}

mpq_status mpq_source_open(const char *path, mpq_source **out, mpq_io_err *err)
{
    if (!path || !*path || !out) return mpq__io_fail(err, MPQ_ERR_ARG, path, NULL, "no path");
    mpq_source *s = (mpq_source *)calloc(1, sizeof *s);
    if (!s || !(s->path = mpq__io_strdup(path))) {
        free(s);
        return mpq__io_fail(err, MPQ_ERR_NOMEM, path, NULL, "out of memory");
    }
    struct stat sb;
    mpq_status st = MPQ_OK;
    if (stat(path, &sb) != 0) {
        st = mpq__io_fail(err, MPQ_ERR_IO, path, NULL, "cannot open: %s", strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        s->kind = MPQ_SOURCE_HF_DIR;
        s->dir = mpq__io_strdup(path);
        st = s->dir ? mpq__open_dir(s, err) : mpq__io_fail(err, MPQ_ERR_NOMEM, path, NULL, "out of memory");
    } else {
        char magic[4] = {0};
        FILE *f = fopen(path, "rb");
        const size_t got = f ? fread(magic, 1, 4, f) : 0;
        if (f) fclose(f);
        if (got == 4 && memcmp(magic, "GGUF", 4) == 0) {
            s->kind = MPQ_SOURCE_GGUF;
            st = mpq_gguf_open(path, &s->gguf, err);
        } else {
            s->kind = MPQ_SOURCE_SAFETENSORS;
            s->dir = mpq__dirname(path);
            st =
                s->dir ? mpq__add_st_file(s, path, err) : mpq__io_fail(err, MPQ_ERR_NOMEM, path, NULL, "out of memory");
        }
    }
    if (st == MPQ_OK) st = mpq__collect(s, err);
    if (st != MPQ_OK) {
        mpq_source_close(s);
        return st;
    }
    *out = s;
    return MPQ_OK;
}

mpq_source_kind mpq_source_kind_of(const mpq_source *s) { return s ? s->kind : (mpq_source_kind)0; }
const char *mpq_source_path(const mpq_source *s) { return s ? s->path : NULL; }
int mpq_source_count(const mpq_source *s) { return s ? s->nt : 0; }
mpq_gguf_file *mpq_source_gguf(const mpq_source *s) { return s ? s->gguf : NULL; }

const mpq_source_tensor *mpq_source_at(const mpq_source *s, int i)
{
    return s && i >= 0 && i < s->nt ? &s->t[i].pub : NULL;
}

const mpq_source_tensor *mpq_source_find(const mpq_source *s, const char *name)
{
    if (!s || !name) return NULL;
    int lo = 0, hi = s->nt - 1;
    while (lo <= hi) {
        const int mid = lo + (hi - lo) / 2, c = strcmp(name, s->sorted[mid].name);
        if (c == 0) return &s->t[s->sorted[mid].i].pub;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

static const mpq__stensor *mpq__own(const mpq_source *s, const mpq_source_tensor *t)
{
    if (!s || !t || (const void *)t < (const void *)s->t || (const void *)t >= (const void *)(s->t + s->nt))
        return NULL;
    return (const mpq__stensor *)(const void *)t;
}

mpq_st_file *mpq_source_st(const mpq_source *s, const mpq_source_tensor *t, const mpq_st_tensor **st)
{
    const mpq__stensor *e = mpq__own(s, t);
    if (!e || e->file < 0) return NULL;
    if (st) *st = e->st;
    return s->files[e->file];
}

mpq_status mpq_source_read_f32(mpq_source *s, const mpq_source_tensor *t, float *dst, size_t n, mpq_io_err *err)
{
    const mpq__stensor *e = mpq__own(s, t);
    if (!e) return mpq__io_fail(err, MPQ_ERR_ARG, s ? s->path : NULL, NULL, "not a tensor of this source");
    if (e->gg) return mpq_gguf_read_f32(s->gguf, e->gg, dst, n, err);
    if (e->pub.packed)
        return mpq__io_fail(err, MPQ_ERR_ARG, mpq_st_path(s->files[e->file]), t->name,
                            "is a packed matrix (read it with mpq_source_read_packed)");
    return mpq_st_read_f32(s->files[e->file], e->st, dst, n, err);
}

void mpq_source_prefetch(mpq_source *s, const mpq_source_tensor *t)
{
    const mpq__stensor *e = mpq__own(s, t);
    if (e && e->gg)
        mpq_gguf_prefetch(s->gguf, e->gg);
    else if (e)
        mpq_st_prefetch(s->files[e->file], e->st);
}

mpq_status mpq_source_map(mpq_source *s, const mpq_source_tensor *t, const void **data, uint32_t *type, mpq_io_err *err)
{
    const mpq__stensor *e = mpq__own(s, t);
    if (!e || !data || !type)
        return mpq__io_fail(err, MPQ_ERR_ARG, s ? s->path : NULL, NULL, "not a tensor of this source");
    if (!e->pub.is_float)
        return mpq__io_fail(err, MPQ_ERR_ARG, e->gg ? s->path : mpq_st_path(s->files[e->file]), t->name,
                            "type %s is not one mpq converts to float", t->type);
    if (e->gg) {
        mpq_status st = mpq_gguf_map(s->gguf, e->gg, data, err);
        if (st == MPQ_OK) *type = e->gg->type;
        return st;
    }
    const mpq_dtype d = e->st->dtype;
    mpq_status st = mpq_st_map(s->files[e->file], e->st, data, err);
    if (st == MPQ_OK)
        *type = d == MPQ_DT_F32 ? MPQ_GGML_F32
            : d == MPQ_DT_F16   ? MPQ_GGML_F16
            : d == MPQ_DT_BF16  ? MPQ_GGML_BF16
                                : MPQ_GGML_F64;
    return st;
}

mpq_status mpq_source_check(const mpq_source *s, mpq_io_err *err)
{
    if (!s) return mpq__io_fail(err, MPQ_ERR_ARG, NULL, NULL, "bad argument");
    mpq_status st = s->gguf ? mpq_gguf_check(s->gguf, err) : MPQ_OK;
    for (int k = 0; k < s->nfiles && st == MPQ_OK; k++) st = mpq_st_check(s->files[k], err);
    return st;
}

mpq_status mpq_source_read_packed(mpq_source *s, const mpq_source_tensor *t, mpq_packed *out, mpq_io_err *err)
{
    const mpq__stensor *e = mpq__own(s, t);
    if (!e) return mpq__io_fail(err, MPQ_ERR_ARG, s ? s->path : NULL, NULL, "not a tensor of this source");
    if (!e->st) return mpq__io_fail(err, MPQ_ERR_ARG, s->path, t->name, "is not a packed matrix");
    return mpq_st_read_packed(s->files[e->file], t->name, out, err);
}

mpq_status mpq_source_map_packed(mpq_source *s, const mpq_source_tensor *t, mpq_packed *out, mpq_io_err *err)
{
    const mpq__stensor *e = mpq__own(s, t);
    if (!e) return mpq__io_fail(err, MPQ_ERR_ARG, s ? s->path : NULL, NULL, "not a tensor of this source");
    if (!e->st) return mpq__io_fail(err, MPQ_ERR_ARG, s->path, t->name, "is not a packed matrix");
    return mpq_st_map_packed(s->files[e->file], t->name, out, err);
}

mpq_status mpq_source_text(const mpq_source *s, const char *name, char **text, size_t *len, mpq_io_err *err)
{
    if (!s || !name || !text) return mpq__io_fail(err, MPQ_ERR_ARG, s ? s->path : NULL, NULL, "NULL argument");
    *text = NULL;
    if (len) *len = 0;
    if (s->kind == MPQ_SOURCE_SAFETENSORS) {
        const char *v = mpq_st_meta(s->files[0], name);
        if (v) {
            if (!(*text = mpq__io_strdup(v))) return mpq__io_fail(err, MPQ_ERR_NOMEM, s->path, NULL, "out of memory");
            if (len) *len = strlen(v);
            return MPQ_OK;
        }
    }
    if (!s->dir || !mpq__plain_name(name)) return MPQ_OK;
    char *p = mpq__join(s->dir, name);
    if (!p) return mpq__io_fail(err, MPQ_ERR_NOMEM, s->path, NULL, "out of memory");
    mpq_status st = mpq__is_file(p) ? mpq__slurp(p, text, len, err) : MPQ_OK;
    free(p);
    return st;
}
