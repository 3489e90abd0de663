/* st_tool - the C side of the interoperability test (test/interop.py).

     st_tool write FILE        a file with F32, F16, BF16, I32 and scalar
                               tensors, bit-plane and MXINT packed matrices
                               (every optional section) and metadata
     st_tool dump FILE DIR     what mpq reads from FILE: DIR/dump.json lists
                               the tensors (name, dtype, shape, packed) and
                               the metadata; DIR/<i>.raw holds tensor i's
                               bytes, DIR/<i>.f32 its values as float32
                               (float dtypes)
     st_tool gguf FILE DIR     the same for a GGUF file: DIR/dump.json lists
                               the tensors (name, type, ne), DIR/<i>.f32
                               holds the values mpq converts them to (the
                               types mpq_gguf_type_is_float accepts) */
#define _XOPEN_SOURCE 700
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_io.h"
#include "synth.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int die(const char *what, const char *msg)
{
    fprintf(stderr, "st_tool: %s: %s\n", what, msg);
    return 1;
}

static int put(const char *dir, int i, const char *ext, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.%s", dir, i, ext);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n)) return die(path, "cannot write");
    fclose(f);
    return 0;
}

/* DIR/dump.json from root (freed here). 0, or 1 after a message. */
static int write_json(cJSON *root, const char *dir)
{
    char *s = cJSON_Print(root);
    char p[4096];
    int rc = 0;
    snprintf(p, sizeof p, "%s/dump.json", dir);
    FILE *out = fopen(p, "wb");
    if (!out || !s)
        rc = die(p, "cannot write");
    else {
        fputs(s, out);
        fclose(out);
    }
    cJSON_free(s);
    cJSON_Delete(root);
    return rc;
}

static int cmd_write(const char *path)
{
    mpq_io_err e;
    mpq_st_writer *w;
    if (mpq_st_writer_open(path, &w, &e) != MPQ_OK) return die("open", e.msg);
    synth_rng r = {8080};
    float v[64];
    synth_weights(&r, v, 8, 8);
    v[0] = 1e-7f, v[1] = -0.0f, v[2] = 70000.0f, v[3] = 3.0e38f, v[4] = -1.5f;
    const uint64_t s57[2] = {5, 7}, s311[2] = {3, 11}, s13 = 13, s4 = 4;
    int bad = mpq_st_write_f32(w, "f32 tensor", MPQ_DT_F32, 2, s57, v, &e) ||
        mpq_st_write_f32(w, "h\xc3\xa4lf", MPQ_DT_F16, 2, s311, v, &e) ||
        mpq_st_write_f32(w, "brain", MPQ_DT_BF16, 1, &s13, v, &e);
    const int32_t ints[4] = {-7, 0, 1 << 30, 42};
    const float one = 0.125f;
    bad = bad || mpq_st_write(w, "ints", MPQ_DT_I32, 1, &s4, ints, sizeof ints, &e) ||
        mpq_st_write(w, "scalar", MPQ_DT_F32, 0, NULL, &one, 4, &e) ||
        mpq_st_write_meta(w, "source", "st_tool \xe2\x9c\x93 \"quoted\" \\ tab\there", &e);
    /* packed: a mixed-width bit-plane matrix with everything, and MXINT */
    for (int k = 0; k < 2 && !bad; k++) {
        const int m = 37, n = 150;
        float *W = malloc(sizeof(float) * m * n), *cs = malloc(sizeof(float) * n), *D = calloc((size_t)m * n, 4);
        uint32_t *pr = malloc(4 * m), *pc = malloc(4 * n);
        uint8_t *mask = calloc((size_t)m * n, 1), bits[3 * 5];
        synth_weights(&r, W, m, n);
        synth_perm(&r, pr, m);
        synth_perm(&r, pc, n);
        for (int j = 0; j < n; j++) cs[j] = 0.5f + (float)synth_unif(&r);
        for (int q = 0; q < 40; q++) mask[synth_int(&r, m * n)] = 1;
        mpq_sparse S;
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.rows = m, d.cols = n, d.p_row = pr, d.p_col = pc, d.col_scale = cs, d.sparse = &S;
        d.format = k ? MPQ_FORMAT_MXINT : MPQ_FORMAT_BITPLANE;
        d.group = k ? 32 : 64;
        const int nb = 3 * (k ? 5 : 3);
        for (int b = 0; b < nb; b++) bits[b] = (uint8_t)(2 + synth_int(&r, 7));
        d.bits = bits;
        mpq_packed A;
        memset(&A, 0, sizeof A);
        bad = mpq_sparse_from_mask(W, D, mask, m, n, &S) != MPQ_OK || mpq_pack_alloc(&d, W, &A) != MPQ_OK ||
            mpq_st_write_packed(w, k ? "layers.1.mx" : "layers.0.bp", &A, &e) != MPQ_OK;
        mpq_packed_free(&A);
        mpq_sparse_free(&S);
        free(W), free(cs), free(D), free(pr), free(pc), free(mask);
    }
    if (bad) {
        mpq_st_writer_abort(w);
        return die("write", e.msg);
    }
    if (mpq_st_writer_close(w, &e) != MPQ_OK) return die("close", e.msg);
    return 0;
}

static int cmd_dump(const char *path, const char *dir)
{
    mpq_io_err e;
    mpq_st_file *f;
    if (mpq_st_open(path, &f, &e) != MPQ_OK) return die("open", e.msg);
    cJSON *root = cJSON_CreateObject(), *ts = cJSON_AddArrayToObject(root, "tensors");
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    int rc = 0;
    for (int i = 0; i < mpq_st_meta_count(f); i++) {
        const char *k, *v;
        mpq_st_meta_at(f, i, &k, &v);
        cJSON_AddStringToObject(meta, k, v);
    }
    for (int i = 0; i < mpq_st_count(f) && !rc; i++) {
        const mpq_st_tensor *t = mpq_st_at(f, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(ts, o);
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "dtype", mpq_dtype_name(t->dtype));
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int k = 0; k < t->ndim; k++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[k]));
        cJSON_AddNumberToObject(o, "packed", t->packed);
        const size_t n = (size_t)(t->end - t->begin);
        void *raw = malloc(n + 1);
        if (mpq_st_read(f, t, raw, n, &e) != MPQ_OK) rc = die("read", e.msg);
        if (!rc) rc = put(dir, i, "raw", raw, n);
        free(raw);
        if (!rc && (t->dtype == MPQ_DT_F32 || t->dtype == MPQ_DT_F16 || t->dtype == MPQ_DT_BF16)) {
            float *x = malloc(sizeof(float) * (size_t)t->numel + 4);
            if (mpq_st_read_f32(f, t, x, (size_t)t->numel, &e) != MPQ_OK) rc = die("read_f32", e.msg);
            if (!rc) rc = put(dir, i, "f32", x, sizeof(float) * (size_t)t->numel);
            free(x);
        }
        if (!rc && t->packed) { /* must validate, metadata included */
            mpq_packed A;
            if (mpq_st_read_packed(f, t->name, &A, &e) != MPQ_OK)
                rc = die("read_packed", e.msg);
            else
                mpq_packed_free(&A);
        }
    }
    if (write_json(root, dir) && !rc) rc = 1;
    mpq_st_close(f);
    return rc;
}

static int cmd_gguf(const char *path, const char *dir)
{
    mpq_io_err e;
    mpq_gguf_file *f;
    if (mpq_gguf_open(path, &f, &e) != MPQ_OK) return die("open", e.msg);
    cJSON *root = cJSON_CreateObject(), *ts = cJSON_AddArrayToObject(root, "tensors");
    int rc = 0;
    for (int i = 0; i < mpq_gguf_count(f) && !rc; i++) {
        const mpq_gguf_tensor *t = mpq_gguf_at(f, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(ts, o);
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "type", mpq_gguf_type_name(t->type) ? mpq_gguf_type_name(t->type) : "?");
        cJSON *ne = cJSON_AddArrayToObject(o, "ne");
        for (int k = 0; k < t->ndim; k++) cJSON_AddItemToArray(ne, cJSON_CreateNumber((double)t->ne[k]));
        if (!mpq_gguf_type_is_float(t->type)) continue;
        float *x = malloc(sizeof(float) * (size_t)t->numel + 4);
        if (mpq_gguf_read_f32(f, t, x, (size_t)t->numel, &e) != MPQ_OK) rc = die("read_f32", e.msg);
        if (!rc) rc = put(dir, i, "f32", x, sizeof(float) * (size_t)t->numel);
        free(x);
    }
    if (write_json(root, dir) && !rc) rc = 1;
    mpq_gguf_close(f);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "write") == 0) return cmd_write(argv[2]);
    if (argc == 4 && strcmp(argv[1], "dump") == 0) return cmd_dump(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "gguf") == 0) return cmd_gguf(argv[2], argv[3]);
    fprintf(stderr, "usage: st_tool write FILE | st_tool dump FILE DIR | st_tool gguf FILE DIR\n");
    return 1;
}
