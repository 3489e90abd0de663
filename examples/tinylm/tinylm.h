/* tinylm/tinylm.h - a small byte-level model of the Llama shape, run by
   mpq_model like any other model.

   Shape (mpq_model.h section 1): a 256-token vocabulary in which token b
   is byte b, dim D, L layers of H heads (as many key-value heads) of D / H,
   a SwiGLU MLP of F, RMSNorm with eps 1e-5, an untied head, no biases;
   rotary positions rotate adjacent pairs (2i, 2i + 1) of every head with
   base 10000 ("mpq_rope_pairs": "adjacent"). Trained on windows of 129
   bytes (128 predictions each).

   The file is a safetensors file with Hugging Face tensor names, F16, and
   in its metadata config.json, tokenizer.json (byte-level BPE over GPT-2's
   byte alphabet with no merges, so that every byte is its own token) and
   how it was trained (tinylm.command, tinylm.seed, tinylm.steps):
   mpq_llm_load reads it, and so does the mpq tool. */
#ifndef TLM_TINYLM_H
#define TLM_TINYLM_H

#include "data.h"
#include "mpq.h"
#include "mpq_io.h"
#include "mpq_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TLM_VOCAB 256
#define TLM_SEQ   128 /* predictions per window */

static inline mpq_llm_config tlm_config(int dim, int layers, int heads, int ffn)
{
    mpq_llm_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.arch, sizeof c.arch, "llama");
    c.vocab = TLM_VOCAB, c.dim = dim, c.layers = layers, c.heads = c.kv_heads = heads, c.ffn = ffn;
    c.head_dim = heads > 0 ? dim / heads : 0;
    c.ctx = TLM_SEQ, c.rope_theta = 10000.0, c.norm_eps = 1e-5, c.rope_style = MPQ_ROPE_ADJACENT;
    return c;
}

/* The character GPT-2's byte alphabet spells byte b with: b itself where
   it is printable (! to ~, the Latin-1 letters and signs but the soft
   hyphen), else 256 + its rank among the others. */
static inline int tlm_byte_char(int b)
{
    const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return b;
    int rank = 0;
    for (int k = 0; k < b; k++) rank += !((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE));
    return 256 + rank;
}

/* tokenizer.json of the byte vocabulary (malloc'ed): token b spelled
   tlm_byte_char(b) in UTF-8 (JSON-escaped where needed), no merges, GPT-2's
   pre-tokenizer, no BOS. */
static inline char *tlm_tokenizer_json(void)
{
    const size_t cap = 8192;
    char *j = (char *)malloc(cap);
    if (!j) return NULL;
    size_t n = (size_t)snprintf(j, cap,
                                "{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": null, "
                                "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                                "\"trim_offsets\": true, \"use_regex\": true}, "
                                "\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {");
    for (int b = 0; b < TLM_VOCAB; b++) {
        const int c = tlm_byte_char(b);
        char u[8];
        if (c == '"' || c == '\\')
            snprintf(u, sizeof u, "\\%c", c);
        else if (c < 0x80)
            snprintf(u, sizeof u, "%c", c);
        else /* two bytes of UTF-8: every code point here is below 0x800 */
            snprintf(u, sizeof u, "%c%c", (char)(0xC0 | (c >> 6)), (char)(0x80 | (c & 0x3F)));
        n += (size_t)snprintf(j + n, cap - n, "%s\"%s\": %d", b ? ", " : "", u, b);
    }
    snprintf(j + n, cap - n, "}}}");
    return j;
}

/* A model of this shape with every weight zero and the byte tokenizer
   (mpq_llm_create), or NULL after a message. */
static inline mpq_llm *tlm_create(const mpq_llm_config *c)
{
    char *json = tlm_tokenizer_json();
    mpq_tokenizer *tok = NULL;
    mpq_io_err e;
    mpq_llm *m = NULL;
    mpq_status st =
        json ? mpq_tokenizer_from_json(json, strlen(json), NULL, "tinylm tokenizer", &tok, &e) : MPQ_ERR_NOMEM;
    if (st == MPQ_OK && (st = mpq_llm_create(c, tok, &m)) != MPQ_OK) mpq_tokenizer_free(tok);
    if (st != MPQ_OK) fprintf(stderr, "tinylm: cannot build the model: %s\n", mpq_status_str(st));
    free(json);
    return m;
}

/* Writes m's parameters (F16) with config.json, tokenizer.json and the
   pairs meta_kv[0..2 nmeta) in the metadata. 0, or -1 after a message. */
static inline int tlm_save(const mpq_llm *m, const char *path, const char *const *meta_kv, int nmeta)
{
    mpq_io_err e;
    mpq_st_writer *w;
    if (mpq_st_writer_open(path, &w, &e) != MPQ_OK) return fprintf(stderr, "%s\n", e.msg), -1;
    char *config = NULL, *tokenizer = tlm_tokenizer_json();
    const int np = mpq_llm_params(m, NULL, 0);
    mpq_llm_param *p = (mpq_llm_param *)calloc((size_t)np, sizeof *p);
    int bad = !tokenizer || !p || mpq_llm_config_json(&m->c, &config) != MPQ_OK;
    if (bad) snprintf(e.msg, sizeof e.msg, "%.400s: out of memory", path);
    bad = bad || mpq_st_write_meta(w, "config.json", config, &e) != MPQ_OK ||
        mpq_st_write_meta(w, "tokenizer.json", tokenizer, &e) != MPQ_OK;
    for (int i = 0; i + 1 < 2 * nmeta && !bad; i += 2)
        bad = mpq_st_write_meta(w, meta_kv[i], meta_kv[i + 1], &e) != MPQ_OK;
    if (!bad) mpq_llm_params(m, p, np);
    for (int i = 0; i < np && !bad; i++) {
        const uint64_t shape[2] = {(uint64_t)p[i].rows, (uint64_t)p[i].cols};
        bad = mpq_st_write_f32(w, p[i].name, MPQ_DT_F16, p[i].cols ? 2 : 1, shape, p[i].data, &e) != MPQ_OK;
    }
    free(config), free(tokenizer), free(p);
    if (bad) {
        mpq_st_writer_abort(w);
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    if (mpq_st_writer_close(w, &e) != MPQ_OK) return fprintf(stderr, "%s\n", e.msg), -1;
    return 0;
}

#endif
