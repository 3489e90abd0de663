/* A GGUF writer for tests: valid files to read back, and the raw material of
   crafted ones (every field can be given any value). Written from the
   format's description, independently of mpq_io_gguf.c.

     tg_gguf g;
     tg_begin(&g);
     tg_kv_str(&g, "general.architecture", "llama");
     tg_tensor(&g, "a", 0, 2, (uint64_t[]){4, 3}, data, 48);   // ggml type 0 = F32
     uint8_t *file = tg_finish(&g, &bytes);                     // free(file)

   g.align (32 after tg_begin) pads both the data section's start and every
   tensor's offset; set it before the first tensor to match a
   general.alignment pair.
*/
#ifndef MPQ_TEST_GGUF_WRITER_H
#define MPQ_TEST_GGUF_WRITER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct tg_buf {
    uint8_t *b;
    size_t n, cap;
} tg_buf;

static inline void tg_put(tg_buf *t, const void *p, size_t n)
{
    if (t->n + n > t->cap) {
        t->cap = (t->n + n) * 2 + 64;
        t->b = (uint8_t *)realloc(t->b, t->cap);
    }
    if (n) memcpy(t->b + t->n, p, n);
    t->n += n;
}
static inline void tg_u32(tg_buf *t, uint32_t v) { tg_put(t, &v, 4); }
static inline void tg_u64(tg_buf *t, uint64_t v) { tg_put(t, &v, 8); }
static inline void tg_str(tg_buf *t, const char *s, size_t n)
{
    tg_u64(t, n);
    tg_put(t, s, n);
}

typedef struct tg_gguf {
    tg_buf kv, info, data;
    uint64_t nkv, nt;
    uint32_t version;
    size_t align;
} tg_gguf;

static inline void tg_begin(tg_gguf *g)
{
    memset(g, 0, sizeof *g);
    g->version = 3, g->align = 32;
}

/* A key and a value type; the caller appends the value to g->kv. */
static inline void tg_key(tg_gguf *g, const char *key, uint32_t type)
{
    tg_str(&g->kv, key, strlen(key));
    tg_u32(&g->kv, type);
    g->nkv++;
}
static inline void tg_kv_u32(tg_gguf *g, const char *key, uint32_t v) { tg_key(g, key, 4), tg_u32(&g->kv, v); }
static inline void tg_kv_i32(tg_gguf *g, const char *key, int32_t v) { tg_key(g, key, 5), tg_put(&g->kv, &v, 4); }
static inline void tg_kv_f32(tg_gguf *g, const char *key, float v) { tg_key(g, key, 6), tg_put(&g->kv, &v, 4); }
static inline void tg_kv_bool(tg_gguf *g, const char *key, int v)
{
    const uint8_t b = (uint8_t)v;
    tg_key(g, key, 7), tg_put(&g->kv, &b, 1);
}
static inline void tg_kv_str(tg_gguf *g, const char *key, const char *v)
{
    tg_key(g, key, 8), tg_str(&g->kv, v, strlen(v));
}
static inline void tg_kv_u64(tg_gguf *g, const char *key, uint64_t v) { tg_key(g, key, 10), tg_u64(&g->kv, v); }
static inline void tg_kv_f64(tg_gguf *g, const char *key, double v) { tg_key(g, key, 12), tg_put(&g->kv, &v, 8); }
static inline void tg_kv_arr_str(tg_gguf *g, const char *key, const char *const *v, size_t n)
{
    tg_key(g, key, 9), tg_u32(&g->kv, 8), tg_u64(&g->kv, n);
    for (size_t i = 0; i < n; i++) tg_str(&g->kv, v[i], strlen(v[i]));
}
static inline void tg_kv_arr_i32(tg_gguf *g, const char *key, const int32_t *v, size_t n)
{
    tg_key(g, key, 9), tg_u32(&g->kv, 5), tg_u64(&g->kv, n);
    tg_put(&g->kv, v, 4 * n);
}

/* A tensor (ne in GGUF order: ne[0] varies fastest); its data is placed at
   the next multiple of g->align of the data section. */
static inline void tg_tensor(tg_gguf *g, const char *name, uint32_t type, uint32_t ndim, const uint64_t *ne,
                             const void *data, size_t bytes)
{
    while (g->data.n % g->align) tg_put(&g->data, "", 1);
    tg_str(&g->info, name, strlen(name));
    tg_u32(&g->info, ndim);
    for (uint32_t k = 0; k < ndim; k++) tg_u64(&g->info, ne[k]);
    tg_u32(&g->info, type);
    tg_u64(&g->info, g->data.n);
    tg_put(&g->data, data, bytes);
    g->nt++;
}

/* The file: header, pairs, infos, padding to g->align, data. Frees g. */
static inline uint8_t *tg_finish(tg_gguf *g, size_t *bytes)
{
    tg_buf f = {NULL, 0, 0};
    tg_put(&f, "GGUF", 4);
    tg_u32(&f, g->version);
    tg_u64(&f, g->nt);
    tg_u64(&f, g->nkv);
    tg_put(&f, g->kv.b, g->kv.n);
    tg_put(&f, g->info.b, g->info.n);
    while (f.n % g->align) tg_put(&f, "", 1);
    tg_put(&f, g->data.b, g->data.n);
    free(g->kv.b), free(g->info.b), free(g->data.b);
    memset(g, 0, sizeof *g);
    *bytes = f.n;
    return f.b;
}

#endif
