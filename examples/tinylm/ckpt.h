/* tinylm/ckpt.h - the model's parameters in a safetensors file (mpq_io). The
   configuration is in the metadata; every tensor is F16 (the trained weights
   as committed) or F32. */
#ifndef TLM_CKPT_H
#define TLM_CKPT_H

#include "model.h"
#include "mpq_io.h"

#include <stdio.h>

static inline void tlm_param_name(const tlm_config *c, int i, char *s, size_t cap, real **ptr, const tlm_params *p,
                                  uint64_t shape[2], int *ndim)
{
    /* i enumerates: emb, norm_f, head, then per layer norm1, norm2, 7 linears */
    if (i == 0)
        snprintf(s, cap, "tok_emb"), *ptr = p->emb, shape[0] = TLM_VOCAB, shape[1] = (uint64_t)c->dim, *ndim = 2;
    else if (i == 1)
        snprintf(s, cap, "norm_f"), *ptr = p->norm_f, shape[0] = (uint64_t)c->dim, *ndim = 1;
    else if (i == 2)
        snprintf(s, cap, "lm_head"), *ptr = p->head, shape[0] = TLM_VOCAB, shape[1] = (uint64_t)c->dim, *ndim = 2;
    else {
        const int l = (i - 3) / (TLM_NLIN + 2), k = (i - 3) % (TLM_NLIN + 2);
        if (k == 0)
            snprintf(s, cap, "layers.%d.norm1", l), *ptr = p->norm1[l], shape[0] = (uint64_t)c->dim, *ndim = 1;
        else if (k == 1)
            snprintf(s, cap, "layers.%d.norm2", l), *ptr = p->norm2[l], shape[0] = (uint64_t)c->dim, *ndim = 1;
        else {
            snprintf(s, cap, "layers.%d.%s", l, tlm_lin_name[k - 2]);
            *ptr = p->w[l][k - 2];
            shape[0] = (uint64_t)tlm_lin_rows(c, k - 2), shape[1] = (uint64_t)tlm_lin_cols(c, k - 2), *ndim = 2;
        }
    }
}

static inline int tlm_param_count(const tlm_config *c) { return 3 + c->layers * (TLM_NLIN + 2); }

/* Writes the model (F16) with the configuration and `note` (how it was made)
   in the metadata. */
static inline int tlm_save(const tlm_model *m, const char *path, const char *const *meta_kv, int nmeta)
{
    mpq_io_err e;
    mpq_st_writer *w;
    if (mpq_st_writer_open(path, &w, &e) != MPQ_OK) return fprintf(stderr, "%s\n", e.msg), -1;
    char key[96], val[64];
    const int cfg[5] = {m->c.dim, m->c.layers, m->c.heads, m->c.ffn, m->c.seq};
    const char *names[5] = {"tinylm.dim", "tinylm.layers", "tinylm.heads", "tinylm.ffn", "tinylm.seq"};
    int bad = 0;
    for (int i = 0; i < 5 && !bad; i++) {
        snprintf(val, sizeof val, "%d", cfg[i]);
        bad = mpq_st_write_meta(w, names[i], val, &e) != MPQ_OK;
    }
    for (int i = 0; i + 1 < 2 * nmeta && !bad; i += 2)
        bad = mpq_st_write_meta(w, meta_kv[i], meta_kv[i + 1], &e) != MPQ_OK;
    for (int i = 0; i < tlm_param_count(&m->c) && !bad; i++) {
        real *ptr;
        uint64_t shape[2];
        int nd;
        tlm_param_name(&m->c, i, key, sizeof key, &ptr, &m->p, shape, &nd);
        const size_t n = (size_t)shape[0] * (nd == 2 ? (size_t)shape[1] : 1);
        float *f = (float *)malloc(sizeof(float) * n);
        for (size_t k = 0; k < n; k++) f[k] = (float)ptr[k];
        bad = mpq_st_write_f32(w, key, MPQ_DT_F16, nd, shape, f, &e) != MPQ_OK;
        free(f);
    }
    if (bad) {
        mpq_st_writer_abort(w);
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    if (mpq_st_writer_close(w, &e) != MPQ_OK) return fprintf(stderr, "%s\n", e.msg), -1;
    return 0;
}

/* Reads a model saved by tlm_save (initialises *m). */
static inline int tlm_load(tlm_model *m, const char *path)
{
    mpq_io_err e;
    mpq_st_file *f;
    if (mpq_st_open(path, &f, &e) != MPQ_OK) return fprintf(stderr, "%s\n", e.msg), -1;
    tlm_config c;
    const char *names[5] = {"tinylm.dim", "tinylm.layers", "tinylm.heads", "tinylm.ffn", "tinylm.seq"};
    int *dst[5] = {&c.dim, &c.layers, &c.heads, &c.ffn, &c.seq};
    for (int i = 0; i < 5; i++) {
        const char *v = mpq_st_meta(f, names[i]);
        if (!v || (*dst[i] = atoi(v)) <= 0) {
            fprintf(stderr, "%s: metadata %s missing or bad\n", path, names[i]);
            mpq_st_close(f);
            return -1;
        }
    }
    if (tlm_model_init(m, &c)) {
        fprintf(stderr, "%s: unusable configuration\n", path);
        mpq_st_close(f);
        return -1;
    }
    int rc = 0;
    char key[96];
    for (int i = 0; i < tlm_param_count(&c) && !rc; i++) {
        real *ptr;
        uint64_t shape[2];
        int nd;
        tlm_param_name(&c, i, key, sizeof key, &ptr, &m->p, shape, &nd);
        const mpq_st_tensor *t = mpq_st_find(f, key);
        const size_t n = (size_t)shape[0] * (nd == 2 ? (size_t)shape[1] : 1);
        if (!t || t->ndim != nd || t->shape[0] != shape[0] || (nd == 2 && t->shape[1] != shape[1])) {
            fprintf(stderr, "%s: tensor '%s' missing or of the wrong shape\n", path, key);
            rc = -1;
            break;
        }
        float *tmp = (float *)malloc(sizeof(float) * n);
        if (mpq_st_read_f32(f, t, tmp, n, &e) != MPQ_OK) {
            fprintf(stderr, "%s\n", e.msg);
            rc = -1;
        }
        for (size_t k = 0; k < n && !rc; k++) ptr[k] = (real)tmp[k];
        free(tmp);
    }
    mpq_st_close(f);
    if (rc) tlm_model_free(m);
    return rc;
}

#endif
