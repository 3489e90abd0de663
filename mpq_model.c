/* mpq_model.c - Llama-family models on mpq's products (see mpq_model.h,
   sections 1 to 4). */
#define _XOPEN_SOURCE   700
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE */
#include "mpq_model.h"
#include "mpq_model_priv.h"

#include <cjson/cJSON.h>

#include <assert.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MPQ__MAX_DIM (1 << 20) /* largest dimension of a model this loader accepts */

double mpq__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* v as the shortest decimal of 15 to 17 significant digits that reads back
   as v itself (17 always do), as raw JSON text with a '.' whatever the
   locale; null where v is not finite. cJSON's own printing keeps 15 digits
   wherever they read back within about an ulp, so a double it writes need
   not read back the same. */
static cJSON *mpq__json_exact(double v)
{
    if (!isfinite(v)) return cJSON_CreateNull();
    char num[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(num, sizeof num, "%.*g", digits, v);
        if (strtod(num, NULL) == v) break;
    }
    const char point = *localeconv()->decimal_point;
    for (char *c = num; *c; c++)
        if (*c == point) *c = '.';
    return cJSON_CreateRaw(num);
}

mpq_status mpq__meta_json(const char *const *keys, const double *vals, int n, const char *extra_json, const char *path,
                          char **json, mpq_io_err *err)
{
    cJSON *o = cJSON_CreateObject(), *extra = extra_json ? cJSON_Parse(extra_json) : NULL;
    if (!o || (extra_json && !extra)) {
        cJSON_Delete(o), cJSON_Delete(extra);
        return mpq__fail(err, extra_json ? MPQ_ERR_ARG : MPQ_ERR_NOMEM, path, "the extra metadata is not JSON");
    }
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        cJSON *v = mpq__json_exact(vals[i]);
        ok = v && cJSON_AddItemToObject(o, keys[i], v);
        if (!ok) cJSON_Delete(v);
    }
    if (extra && ok && cJSON_AddItemToObject(o, "source", extra)) extra = NULL; /* o holds it now */
    ok = ok && !extra;
    cJSON_Delete(extra);
    *json = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return *json ? MPQ_OK : mpq__fail(err, MPQ_ERR_NOMEM, path, "out of memory");
}

/* ========================================================================== */
/* 1. Models                                                                  */
/* ========================================================================== */

static const char *const mpq__gguf_lin[MPQ_LIN_COUNT] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                         "ffn_gate", "ffn_up", "ffn_down"};
static const char *const mpq__hf_lin[MPQ_LIN_COUNT] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                       "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                       "mlp.down_proj"};

const char *mpq_llm_linear_name(int gguf_names, int layer, int lin, int bias, char *buf, size_t cap)
{
    if (lin < 0 || lin >= MPQ_LIN_COUNT || !buf || !cap) return NULL;
    if (gguf_names)
        snprintf(buf, cap, "blk.%d.%s.%s", layer, mpq__gguf_lin[lin], bias ? "bias" : "weight");
    else
        snprintf(buf, cap, "model.layers.%d.%s.%s", layer, mpq__hf_lin[lin], bias ? "bias" : "weight");
    return buf;
}

const char *mpq_llm_tensor_name(int gguf_names, const char *role, int layer, char *buf, size_t cap)
{
    if (!role || !buf || !cap) return NULL;
    if (!strcmp(role, "embed"))
        snprintf(buf, cap, "%s", gguf_names ? "token_embd.weight" : "model.embed_tokens.weight");
    else if (!strcmp(role, "out_norm"))
        snprintf(buf, cap, "%s", gguf_names ? "output_norm.weight" : "model.norm.weight");
    else if (!strcmp(role, "head"))
        snprintf(buf, cap, "%s", gguf_names ? "output.weight" : "lm_head.weight");
    else if (!strcmp(role, "attn_norm"))
        snprintf(buf, cap, gguf_names ? "blk.%d.attn_norm.weight" : "model.layers.%d.input_layernorm.weight", layer);
    else if (!strcmp(role, "ffn_norm"))
        snprintf(buf, cap, gguf_names ? "blk.%d.ffn_norm.weight" : "model.layers.%d.post_attention_layernorm.weight",
                 layer);
    else if (!strcmp(role, "rope_freqs") && gguf_names)
        snprintf(buf, cap, "rope_freqs.weight");
    else
        return NULL;
    return buf;
}

int mpq_llm_tensor_role(const char *name, int *layer, int *lin)
{
    if (!name) return 0;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "model.embed_tokens.weight")) {
        if (lin) *lin = -2;
        return 2;
    }
    if (!strcmp(name, "output.weight") || !strcmp(name, "lm_head.weight")) {
        if (lin) *lin = -1;
        return 2;
    }
    int l = -1, n = 0;
    const char *rest = NULL;
    if (sscanf(name, "blk.%d.%n", &l, &n) == 1 && n > 0) {
        rest = name + n;
        for (int k = 0; k < MPQ_LIN_COUNT; k++) {
            const size_t len = strlen(mpq__gguf_lin[k]);
            if (!strncmp(rest, mpq__gguf_lin[k], len) && !strcmp(rest + len, ".weight")) {
                if (layer) *layer = l;
                if (lin) *lin = k;
                return 1;
            }
        }
    } else if (sscanf(name, "model.layers.%d.%n", &l, &n) == 1 && n > 0) {
        rest = name + n;
        for (int k = 0; k < MPQ_LIN_COUNT; k++) {
            const size_t len = strlen(mpq__hf_lin[k]);
            if (!strncmp(rest, mpq__hf_lin[k], len) && !strcmp(rest + len, ".weight")) {
                if (layer) *layer = l;
                if (lin) *lin = k;
                return 1;
            }
        }
    }
    return 0;
}

/* ---- the description ------------------------------------------------------ */

/* An integer {arch}.<key> of a GGUF file: 1 found, 0 absent, -1 wrong. */
static int mpq__gint(const mpq_gguf_file *f, const char *arch, const char *key, int64_t *v)
{
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    const mpq_gguf_kv *kv = mpq_gguf_kv_find(f, k);
    if (!kv) return 0;
    return kv->type != MPQ_GGUF_ARRAY && mpq_gguf_get_int(f, kv, 0, v) == MPQ_OK ? 1 : -1;
}

static int mpq__gfloat(const mpq_gguf_file *f, const char *arch, const char *key, double *v)
{
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    const mpq_gguf_kv *kv = mpq_gguf_kv_find(f, k);
    if (!kv) return 0;
    return kv->type != MPQ_GGUF_ARRAY && mpq_gguf_get_float(f, kv, 0, v) == MPQ_OK ? 1 : -1;
}

static mpq_status mpq__config_gguf(mpq_source *s, mpq_llm_config *c, mpq_io_err *err)
{
    const mpq_gguf_file *f = mpq_source_gguf(s);
    const char *O = mpq_source_path(s);
    const mpq_gguf_kv *kv = mpq_gguf_kv_find(f, "general.architecture");
    const char *a;
    size_t al;
    if (!kv || mpq_gguf_get_str(f, kv, 0, &a, &al) != MPQ_OK)
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "general.architecture is missing or not a string");
    if (!((al == 5 && !memcmp(a, "llama", 5)) || (al == 5 && !memcmp(a, "qwen2", 5))))
        return mpq__fail(err, MPQ_ERR_UNSUPPORTED, O, "architecture '%.*s': mpq runs llama and qwen2",
                         (int)(al < 40 ? al : 40), a);
    memcpy(c->arch, a, al);
    c->arch[al] = 0;
    static const char *const req[] = {"block_count", "embedding_length", "feed_forward_length", "attention.head_count"};
    int *dst[] = {&c->layers, &c->dim, &c->ffn, &c->heads};
    for (int i = 0; i < 4; i++) {
        int64_t v;
        if (mpq__gint(f, c->arch, req[i], &v) != 1 || v < 1 || v > MPQ__MAX_DIM)
            return mpq__fail(err, MPQ_ERR_FORMAT, O, "%s.%s is missing or not a positive integer", c->arch, req[i]);
        *dst[i] = (int)v;
    }
    int64_t v;
    int r;
    c->kv_heads = c->heads;
    if ((r = mpq__gint(f, c->arch, "attention.head_count_kv", &v)) != 0) {
        if (r < 0 || v < 1 || v > MPQ__MAX_DIM)
            return mpq__fail(err, MPQ_ERR_FORMAT, O, "%s.attention.head_count_kv is not a positive integer", c->arch);
        c->kv_heads = (int)v;
    }
    c->head_dim = c->dim / c->heads;
    if ((r = mpq__gint(f, c->arch, "attention.key_length", &v)) != 0) {
        if (r < 0 || v < 1 || v > MPQ__MAX_DIM)
            return mpq__fail(err, MPQ_ERR_FORMAT, O, "%s.attention.key_length is not a positive integer", c->arch);
        c->head_dim = (int)v;
    }
    if ((r = mpq__gint(f, c->arch, "attention.value_length", &v)) != 0 && (r < 0 || v != c->head_dim))
        return mpq__fail(err, MPQ_ERR_UNSUPPORTED, O, "%s.attention.value_length differs from the key size %d", c->arch,
                         c->head_dim);
    if ((r = mpq__gint(f, c->arch, "rope.dimension_count", &v)) != 0 && (r < 0 || v != c->head_dim))
        return mpq__fail(err, MPQ_ERR_UNSUPPORTED, O,
                         "%s.rope.dimension_count differs from the head size %d "
                         "(partial rotary is not supported)",
                         c->arch, c->head_dim);
    c->ctx = 4096;
    if ((r = mpq__gint(f, c->arch, "context_length", &v)) == 1 && v >= 1 && v <= (1 << 24)) c->ctx = (int)v;
    c->rope_theta = 10000.0;
    if ((r = mpq__gfloat(f, c->arch, "rope.freq_base", &c->rope_theta)) < 0)
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "%s.rope.freq_base is not a number", c->arch);
    c->norm_eps = 1e-5;
    if ((r = mpq__gfloat(f, c->arch, "attention.layer_norm_rms_epsilon", &c->norm_eps)) < 0)
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "%s.attention.layer_norm_rms_epsilon is not a number", c->arch);
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch);
    kv = mpq_gguf_kv_find(f, key);
    if (kv) {
        if (mpq_gguf_get_str(f, kv, 0, &a, &al) != MPQ_OK)
            return mpq__fail(err, MPQ_ERR_FORMAT, O, "%s is not a string", key);
        if (al == 6 && !memcmp(a, "linear", 6)) {
            c->rope_scaling = MPQ_ROPE_SCALING_LINEAR;
            if (mpq__gfloat(f, c->arch, "rope.scaling.factor", &c->rope_factor) != 1 || !(c->rope_factor > 0))
                return mpq__fail(err, MPQ_ERR_FORMAT, O, "%s.rope.scaling.factor is missing or not positive", c->arch);
        } else if (!(al == 4 && !memcmp(a, "none", 4))) {
            return mpq__fail(err, MPQ_ERR_UNSUPPORTED, O,
                             "rotary scaling '%.*s' (mpq knows none and linear, and "
                             "rope_freqs tensors)",
                             (int)(al < 40 ? al : 40), a);
        }
    }
    c->rope_style = strcmp(c->arch, "llama") == 0 ? MPQ_ROPE_ADJACENT : MPQ_ROPE_HALF;
    c->gguf_names = 1;
    c->tied = !mpq_source_find(s, "output.weight");
    c->qkv_bias = mpq_source_find(s, "blk.0.attn_q.bias") != NULL;
    const mpq_source_tensor *e = mpq_source_find(s, "token_embd.weight");
    c->vocab = e && e->ndim == 2 && e->shape[0] <= MPQ__MAX_DIM * 4u ? (int)e->shape[0] : 0;
    return MPQ_OK;
}

/* A config.json integer: 1 found, 0 absent or null, -1 not an integer. */
static int mpq__jint(const cJSON *o, const char *key, int *v, int lo, int hi)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo || j->valuedouble > hi)
        return -1;
    *v = (int)j->valuedouble;
    return 1;
}

static int mpq__jnum(const cJSON *o, const char *key, double *v)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) return -1;
    *v = j->valuedouble;
    return 1;
}

static const char *mpq__jstr_of(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

static mpq_status mpq__config_json(mpq_source *s, const char *text, mpq_llm_config *c, mpq_io_err *err)
{
    char origin[600];
    snprintf(origin, sizeof origin, "%.500s: config.json", mpq_source_path(s));
    const char *O = origin;
    cJSON *j = cJSON_Parse(text);
    mpq_status st = MPQ_OK;
    if (!cJSON_IsObject(j)) {
        st = mpq__fail(err, MPQ_ERR_FORMAT, O, "not a JSON object");
        goto done;
    }
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const char *arch = cJSON_IsArray(archs) && cJSON_IsString(archs->child) ? archs->child->valuestring : NULL;
    const char *mt = mpq__jstr_of(j, "model_type");
    if (arch ? !strcmp(arch, "LlamaForCausalLM") || !strcmp(arch, "MistralForCausalLM")
             : mt && (!strcmp(mt, "llama") || !strcmp(mt, "mistral")))
        snprintf(c->arch, sizeof c->arch, "llama");
    else if (arch ? !strcmp(arch, "Qwen2ForCausalLM") : mt && !strcmp(mt, "qwen2"))
        snprintf(c->arch, sizeof c->arch, "qwen2");
    else {
        st = mpq__fail(err, MPQ_ERR_UNSUPPORTED, O,
                       "architecture '%.60s': mpq runs LlamaForCausalLM, "
                       "MistralForCausalLM and Qwen2ForCausalLM",
                       arch     ? arch
                           : mt ? mt
                                : "(none)");
        goto done;
    }
    static const char *const req[] = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"};
    int *dst[] = {&c->dim, &c->ffn, &c->layers, &c->heads};
    for (int i = 0; i < 4; i++)
        if (mpq__jint(j, req[i], dst[i], 1, MPQ__MAX_DIM) != 1) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "%s is missing or not a positive integer", req[i]);
            goto done;
        }
    c->kv_heads = c->heads;
    c->head_dim = c->dim / c->heads;
    c->ctx = 4096;
    c->rope_theta = 10000.0;
    c->norm_eps = 1e-6;
    if (mpq__jint(j, "num_key_value_heads", &c->kv_heads, 1, MPQ__MAX_DIM) < 0 ||
        mpq__jint(j, "head_dim", &c->head_dim, 1, MPQ__MAX_DIM) < 0 ||
        mpq__jint(j, "max_position_embeddings", &c->ctx, 1, 1 << 24) < 0 ||
        mpq__jint(j, "vocab_size", &c->vocab, 1, MPQ__MAX_DIM * 4) < 0 ||
        mpq__jnum(j, "rope_theta", &c->rope_theta) < 0 || mpq__jnum(j, "rms_norm_eps", &c->norm_eps) < 0) {
        st = mpq__fail(err, MPQ_ERR_FORMAT, O,
                       "num_key_value_heads, head_dim, max_position_embeddings, vocab_size, "
                       "rope_theta or rms_norm_eps has a wrong value");
        goto done;
    }
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
    c->tied = cJSON_IsTrue(tie);
    c->qkv_bias = !strcmp(c->arch, "qwen2") || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "attention_bias"));
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) {
        const char *type = mpq__jstr_of(rs, "rope_type");
        if (!type) type = mpq__jstr_of(rs, "type");
        if (type && !strcmp(type, "default")) {
            /* nothing to scale */
        } else if (type && (!strcmp(type, "linear") || !strcmp(type, "llama3"))) {
            c->rope_scaling = !strcmp(type, "linear") ? MPQ_ROPE_SCALING_LINEAR : MPQ_ROPE_SCALING_LLAMA3;
            c->rope_low_freq = 1.0, c->rope_high_freq = 4.0, c->rope_orig_ctx = 8192;
            if (mpq__jnum(rs, "factor", &c->rope_factor) != 1 || !(c->rope_factor > 0) ||
                mpq__jnum(rs, "low_freq_factor", &c->rope_low_freq) < 0 ||
                mpq__jnum(rs, "high_freq_factor", &c->rope_high_freq) < 0 ||
                mpq__jint(rs, "original_max_position_embeddings", &c->rope_orig_ctx, 1, 1 << 24) < 0 ||
                !(c->rope_high_freq > c->rope_low_freq) || !(c->rope_low_freq > 0)) {
                st = mpq__fail(err, MPQ_ERR_FORMAT, O, "rope_scaling has a wrong factor or frequency band");
                goto done;
            }
        } else {
            st = mpq__fail(err, MPQ_ERR_UNSUPPORTED, O, "rope_scaling type '%.40s' (mpq knows linear and llama3)",
                           type ? type : "(none)");
            goto done;
        }
    }
    const char *names = mpq__jstr_of(j, "mpq_tensor_names");
    c->gguf_names = names ? !strcmp(names, "gguf") : mpq_source_find(s, "token_embd.weight") != NULL;
    const char *pairs = mpq__jstr_of(j, "mpq_rope_pairs");
    c->rope_style = pairs ? (!strcmp(pairs, "adjacent") ? MPQ_ROPE_ADJACENT : MPQ_ROPE_HALF)
                          : (c->gguf_names && !strcmp(c->arch, "llama") ? MPQ_ROPE_ADJACENT : MPQ_ROPE_HALF);
done:
    cJSON_Delete(j);
    return st;
}

static mpq_status mpq__config_check(const mpq_llm_config *c, const char *O, mpq_io_err *err)
{
    if (c->heads % c->kv_heads)
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "%d attention heads are not a multiple of %d key-value heads",
                         c->heads, c->kv_heads);
    if (c->head_dim % 2) return mpq__fail(err, MPQ_ERR_FORMAT, O, "head size %d is odd", c->head_dim);
    if ((int64_t)c->heads * c->head_dim > MPQ__MAX_DIM)
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "%d heads of %d: too large", c->heads, c->head_dim);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta) || !(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "rope base %g or norm epsilon %g is not positive", c->rope_theta,
                         c->norm_eps);
    return MPQ_OK;
}

mpq_status mpq_llm_config_read(mpq_source *s, mpq_llm_config *c, mpq_io_err *err)
{
    if (!s || !c) return mpq__fail(err, MPQ_ERR_ARG, "(model)", "NULL argument");
    mpq_llm_config t;
    memset(&t, 0, sizeof t);
    mpq_status st;
    if (mpq_source_kind_of(s) == MPQ_SOURCE_GGUF) {
        st = mpq__config_gguf(s, &t, err);
    } else {
        char *text = NULL;
        if ((st = mpq_source_text(s, "config.json", &text, NULL, err)) != MPQ_OK) return st;
        if (!text)
            return mpq__fail(err, MPQ_ERR_FORMAT, mpq_source_path(s),
                             "no config.json (beside the weights or in the "
                             "file's metadata): the model cannot be described");
        st = mpq__config_json(s, text, &t, err);
        free(text);
    }
    if (st == MPQ_OK) st = mpq__config_check(&t, mpq_source_path(s), err);
    if (st == MPQ_OK) *c = t;
    return st;
}

mpq_status mpq_tokenizer_read(mpq_source *s, mpq_tokenizer **t, mpq_io_err *err)
{
    if (!s || !t) return mpq__fail(err, MPQ_ERR_ARG, "(model)", "NULL argument");
    if (mpq_source_kind_of(s) == MPQ_SOURCE_GGUF) return mpq_tokenizer_from_gguf(mpq_source_gguf(s), t, err);
    char *json = NULL, *cfg = NULL;
    size_t len = 0;
    mpq_status st = mpq_source_text(s, "tokenizer.json", &json, &len, err);
    if (st == MPQ_OK) st = mpq_source_text(s, "tokenizer_config.json", &cfg, NULL, err);
    if (st == MPQ_OK && !json)
        st = mpq__fail(err, MPQ_ERR_FORMAT, mpq_source_path(s),
                       "no tokenizer.json (beside the weights or in the "
                       "file's metadata)");
    if (st == MPQ_OK) {
        char origin[600];
        snprintf(origin, sizeof origin, "%.500s: tokenizer.json", mpq_source_path(s));
        st = mpq_tokenizer_from_json(json, len, cfg, origin, t, err);
    }
    free(json);
    free(cfg);
    return st;
}

mpq_status mpq_llm_config_json(const mpq_llm_config *c, char **json)
{
    if (!c || !json) return MPQ_ERR_ARG;
    const int qwen = !strcmp(c->arch, "qwen2");
    cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", qwen ? "qwen2" : "llama");
    cJSON_AddNumberToObject(j, "hidden_size", c->dim);
    cJSON_AddNumberToObject(j, "intermediate_size", c->ffn);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->ctx);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->norm_eps);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tied);
    if (!qwen) cJSON_AddBoolToObject(j, "attention_bias", c->qkv_bias);
    if (c->rope_scaling == MPQ_ROPE_SCALING_NONE) {
        cJSON_AddNullToObject(j, "rope_scaling");
    } else {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", c->rope_scaling == MPQ_ROPE_SCALING_LINEAR ? "linear" : "llama3");
        cJSON_AddNumberToObject(r, "factor", c->rope_factor);
        if (c->rope_scaling == MPQ_ROPE_SCALING_LLAMA3) {
            cJSON_AddNumberToObject(r, "low_freq_factor", c->rope_low_freq);
            cJSON_AddNumberToObject(r, "high_freq_factor", c->rope_high_freq);
            cJSON_AddNumberToObject(r, "original_max_position_embeddings", c->rope_orig_ctx);
        }
    }
    cJSON_AddStringToObject(j, "mpq_rope_pairs", c->rope_style == MPQ_ROPE_ADJACENT ? "adjacent" : "half");
    cJSON_AddStringToObject(j, "mpq_tensor_names", c->gguf_names ? "gguf" : "hf");
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    if (!s) return MPQ_ERR_NOMEM;
    *json = s;
    return MPQ_OK;
}

/* ---- weights ------------------------------------------------------------- */

static void mpq__linear_free(mpq_llm *m, mpq_linear *L)
{
    mpq_linear_unpack(m, L);
    free(L->W);
    free(L->bias);
    memset(L, 0, sizeof *L);
}

/* The model's packed products moved into one anonymous region asked for
   2 MB pages: decoding streams every packed byte once per token, and 4 KB
   pages slow that down (the 8B shape's 3.25-bit file: a plain read at 17.7
   GB/s from the page cache, 21.4 from malloc'ed memory, 26.9 from 2 MB
   pages; its decode 18.1 -> 19.6 GB/s; bench/results/NOTES.md, "Models
   larger than memory").
   Only when they take less than half the memory the system has available,
   and only where the system has huge pages (MADV_HUGEPAGE); otherwise, or
   if anything fails, they stay as they are. The bytes are the same, so are
   the products. */
static void mpq__packed_arena(mpq_llm *m)
{
#if defined(MADV_HUGEPAGE) && defined(MAP_ANONYMOUS)
    const size_t H = (size_t)2 << 20;
    mpq_linear *v[4096 + 2];
    if ((size_t)m->c.layers * MPQ_LIN_COUNT > 4096) return;
    int n = 0;
    for (int l = 0; l < m->c.layers; l++)
        for (int k = 0; k < MPQ_LIN_COUNT; k++) v[n++] = &m->layer[l].lin[k];
    if (!m->c.tied) v[n++] = &m->head;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (v[i]->A.buf) total += (v[i]->A.bytes + 63u) & ~(size_t)63u;
    if (total == 0) return;
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long avail_kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &avail_kb) == 1) break;
    if (f) fclose(f);
    if (!avail_kb || (double)total > 0.5 * (double)avail_kb * 1024.0) return;
    const size_t len = (total + H - 1) / H * H;
    uint8_t *raw = (uint8_t *)mmap(NULL, len + H, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == (uint8_t *)MAP_FAILED) return;
    uint8_t *base = (uint8_t *)(((uintptr_t)raw + H - 1) & ~(uintptr_t)(H - 1));
    madvise(base, len, MADV_HUGEPAGE);
    size_t off = 0;
    mpq_packed *moved = (mpq_packed *)malloc(sizeof(mpq_packed) * (size_t)n);
    int ok = moved != NULL;
    for (int i = 0; ok && i < n; i++) {
        if (!v[i]->A.buf) continue;
        memcpy(base + off, v[i]->A.buf, v[i]->A.bytes);
        ok = mpq_packed_open(base + off, v[i]->A.bytes, &moved[i]) == MPQ_OK;
        off += (v[i]->A.bytes + 63u) & ~(size_t)63u;
    }
    if (!ok) {
        free(moved);
        munmap(raw, len + H);
        return;
    }
    for (int i = 0; i < n; i++)
        if (v[i]->A.buf) {
            mpq_packed_free(&v[i]->A);
            v[i]->A = moved[i];
        }
    free(moved);
    m->arena = raw, m->arena_bytes = len + H;
#else
    (void)m;
#endif
}

void mpq_llm_free(mpq_llm *m)
{
    if (!m) return;
    for (int l = 0; m->layer && l < m->c.layers; l++) {
        for (int k = 0; k < MPQ_LIN_COUNT; k++) mpq__linear_free(m, &m->layer[l].lin[k]);
        free(m->layer[l].attn_norm);
        free(m->layer[l].ffn_norm);
    }
    free(m->layer);
    if (!m->c.tied) mpq__linear_free(m, &m->head);
    mpq__linear_free(m, &m->embed);
    free(m->out_norm);
    free(m->rope_freq);
    mpq_tokenizer_free(m->tok);
    mpq_source_close(m->src);
    free(m->path);
#if defined(MADV_HUGEPAGE) && defined(MAP_ANONYMOUS)
    if (m->arena) munmap(m->arena, m->arena_bytes);
#endif
    free(m);
}

/* Reads a float tensor of exactly n values (shape checked by the caller),
   finite. */
static mpq_status mpq__read_floats(mpq_source *s, const mpq_source_tensor *t, float **out, mpq_io_err *err)
{
    const char *O = mpq_source_path(s);
    if (!t->is_float)
        return mpq__fail(err, MPQ_ERR_UNSUPPORTED, O, "tensor '%s': type %s cannot be read as float", t->name, t->type);
    float *v = (float *)malloc(sizeof(float) * (size_t)t->numel + 1);
    if (!v) return mpq__fail(err, MPQ_ERR_NOMEM, O, "tensor '%s': out of memory", t->name);
    mpq_status st = mpq_source_read_f32(s, t, v, (size_t)t->numel, err);
    for (uint64_t i = 0; st == MPQ_OK && i < t->numel; i++)
        if (!isfinite(v[i]))
            st = mpq__fail(err, MPQ_ERR_NONFINITE, O, "tensor '%s': value %llu is %s", t->name, (unsigned long long)i,
                           isnan(v[i]) ? "NaN" : "infinite");
    if (st != MPQ_OK) {
        free(v);
        return st;
    }
    *out = v;
    return MPQ_OK;
}

static const mpq_source_tensor *mpq__need(mpq_source *s, const char *name, mpq_io_err *err, mpq_status *st)
{
    const mpq_source_tensor *t = mpq_source_find(s, name);
    if (!t) *st = mpq__fail(err, MPQ_ERR_FORMAT, mpq_source_path(s), "tensor '%s' is missing", name);
    return t;
}

static mpq_status mpq__load_vector(mpq_source *s, const char *name, int n, float **out, mpq_io_err *err)
{
    mpq_status st = MPQ_OK;
    const mpq_source_tensor *t = mpq__need(s, name, err, &st);
    if (!t) return st;
    if (t->numel != (uint64_t)n || t->ndim != 1)
        return mpq__fail(err, MPQ_ERR_FORMAT, mpq_source_path(s), "tensor '%s': shape is not [%d]", name, n);
    return mpq__read_floats(s, t, out, err);
}

/* A float matrix left in its file (see IN PLACE): mapped, its row size
   checked against the tensor's bytes, every value converted once to check
   that it is finite. */
static mpq_status mpq__map_linear(mpq_source *s, const mpq_source_tensor *t, mpq_linear *L, mpq_io_err *err)
{
    const char *O = mpq_source_path(s);
    const void *data;
    uint32_t type;
    mpq_status st = mpq_source_map(s, t, &data, &type, err);
    if (st != MPQ_OK) return st;
    const uint64_t row = mpq_gguf_type_bytes(type, (uint64_t)L->cols);
    if (row == 0 || row * (uint64_t)L->rows != t->bytes)
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "tensor '%s': %llu bytes do not hold %d rows of %d %s values", t->name,
                         (unsigned long long)t->bytes, L->rows, L->cols, t->type);
    enum { CHUNK = 16384 };
    const int per = L->cols >= CHUNK ? 1 : CHUNK / L->cols;
    float *v = (float *)malloc(sizeof(float) * (size_t)per * (size_t)L->cols);
    if (!v) return mpq__fail(err, MPQ_ERR_NOMEM, O, "tensor '%s': out of memory", t->name);
    for (int r = 0; r < L->rows && st == MPQ_OK; r += per) {
        const int n = L->rows - r < per ? L->rows - r : per;
        const size_t nv = (size_t)n * (size_t)L->cols;
        st = mpq_gguf_decode(type, (const uint8_t *)data + (size_t)r * row, nv, v);
        for (size_t i = 0; st == MPQ_OK && i < nv; i++)
            if (!isfinite(v[i]))
                st = mpq__fail(err, MPQ_ERR_NONFINITE, O, "tensor '%s': value %llu is %s", t->name,
                               (unsigned long long)((uint64_t)r * (uint64_t)L->cols + i),
                               isnan(v[i]) ? "NaN" : "infinite");
    }
    free(v);
    if (st == MPQ_OK) L->Ws = data, L->ws_type = type, L->ws_row = (size_t)row;
    return st;
}

static mpq_status mpq__load_linear(mpq_source *s, const char *name, int rows, int cols, int in_place, mpq_linear *L,
                                   mpq_io_err *err)
{
    mpq_status st = MPQ_OK;
    const mpq_source_tensor *t = mpq__need(s, name, err, &st);
    if (!t) return st;
    const char *O = mpq_source_path(s);
    L->rows = rows, L->cols = cols;
    if (t->packed) {
        mpq_packed A;
        st = in_place ? mpq_source_map_packed(s, t, &A, err) : mpq_source_read_packed(s, t, &A, err);
        if (st != MPQ_OK) return st;
        if (A.rows != rows || A.cols != cols) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "tensor '%s': packed matrix is %d x %d, the model needs %d x %d",
                           name, A.rows, A.cols, rows, cols);
            mpq_packed_free(&A);
            return st;
        }
        L->A = A;
        return MPQ_OK;
    }
    if (t->ndim != 2 || t->shape[0] != (uint64_t)rows || t->shape[1] != (uint64_t)cols)
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "tensor '%s': shape is not %d x %d", name, rows, cols);
    if (in_place && t->is_float) return mpq__map_linear(s, t, L, err);
    return mpq__read_floats(s, t, &L->W, err);
}

/* rows x cols of each linear map of a layer */
static void mpq__lin_shapes(const mpq_llm_config *c, int shape[MPQ_LIN_COUNT][2])
{
    const int qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
    const int s[MPQ_LIN_COUNT][2] = {{qd, c->dim},     {kvd, c->dim},    {kvd, c->dim},   {c->dim, qd},
                                     {c->ffn, c->dim}, {c->ffn, c->dim}, {c->dim, c->ffn}};
    memcpy(shape, s, sizeof s);
}

/* Rotary frequencies theta_i = base^(-2i/d), scaled as the config says
   (s: the source, for a GGUF rope_freqs tensor; may be NULL). */
static mpq_status mpq__rope_freqs(mpq_llm *m, mpq_source *s, mpq_io_err *err)
{
    const mpq_llm_config *c = &m->c;
    const int half = c->head_dim / 2;
    m->rope_freq = (float *)malloc(sizeof(float) * (size_t)half);
    if (!m->rope_freq) return mpq__fail(err, MPQ_ERR_NOMEM, m->path, "out of memory");
    float *factors = NULL;
    if (s && c->gguf_names && mpq_source_find(s, "rope_freqs.weight")) {
        mpq_status st = mpq__load_vector(s, "rope_freqs.weight", half, &factors, err);
        if (st != MPQ_OK) return st;
    }
    for (int i = 0; i < half; i++) {
        double f = pow(c->rope_theta, -2.0 * i / c->head_dim);
        if (factors) {
            f /= factors[i];
        } else if (c->rope_scaling == MPQ_ROPE_SCALING_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_scaling == MPQ_ROPE_SCALING_LLAMA3) {
            /* wavelengths shorter than orig / high stay, longer than orig /
               low are divided by factor, the band between is blended */
            const double wavelen = 2.0 * M_PI / f, lo = c->rope_orig_ctx / c->rope_low_freq,
                         hi = c->rope_orig_ctx / c->rope_high_freq;
            if (wavelen > lo) {
                f /= c->rope_factor;
            } else if (wavelen >= hi) {
                const double smooth =
                    (c->rope_orig_ctx / wavelen - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                f = (1.0 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        m->rope_freq[i] = (float)f;
    }
    free(factors);
    return MPQ_OK;
}

mpq_status mpq_llm_load(const char *path, mpq_llm **out, mpq_io_err *err)
{
    mpq_llm_load_opts o;
    memset(&o, 0, sizeof o);
    return mpq_llm_load_with(path, &o, out, err);
}

mpq_status mpq_llm_check_files(const mpq_llm *m, mpq_io_err *err)
{
    if (!m) return mpq__fail(err, MPQ_ERR_ARG, NULL, "NULL argument");
    return m->src ? mpq_source_check(m->src, err) : MPQ_OK;
}

mpq_status mpq_llm_load_with(const char *path, const mpq_llm_load_opts *o, mpq_llm **out, mpq_io_err *err)
{
    if (!path || !o || !out) return mpq__fail(err, MPQ_ERR_ARG, path, "NULL argument");
    const int ip = o->in_place != 0;
    mpq_source *s = NULL;
    mpq_status st = mpq_source_open(path, &s, err);
    if (st != MPQ_OK) return st;
    mpq_llm *m = (mpq_llm *)calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        mpq_source_close(s);
        return mpq__fail(err, MPQ_ERR_NOMEM, path, "out of memory");
    }
    mpq_llm_config *c = &m->c;
    const char *O = mpq_source_path(s);
    char name[256];
    if ((st = mpq_llm_config_read(s, c, err)) != MPQ_OK) goto done;
    if ((st = mpq_tokenizer_read(s, &m->tok, err)) != MPQ_OK) goto done;
    /* the embedding gives the vocabulary */
    const mpq_source_tensor *e =
        mpq__need(s, mpq_llm_tensor_name(c->gguf_names, "embed", 0, name, sizeof name), err, &st);
    if (!e) goto done;
    const uint64_t rows = e->packed ? 0 : e->ndim == 2 ? e->shape[0] : 0;
    int vocab = c->vocab;
    if (!e->packed) {
        if (e->ndim != 2 || e->shape[1] != (uint64_t)c->dim || rows < 1 || rows > MPQ__MAX_DIM * 4u) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "tensor '%s': shape is not vocab x %d", e->name, c->dim);
            goto done;
        }
        vocab = (int)rows;
    }
    if (vocab < 1 || (c->vocab && vocab != c->vocab)) {
        st = mpq__fail(err, MPQ_ERR_FORMAT, O, "tensor '%s': %d rows but the vocabulary size is %d", e->name, vocab,
                       c->vocab);
        goto done;
    }
    c->vocab = vocab;
    if (mpq_tokenizer_size(m->tok) > c->vocab) {
        st = mpq__fail(err, MPQ_ERR_FORMAT, O, "the tokenizer has %d tokens, the embedding %d rows",
                       mpq_tokenizer_size(m->tok), c->vocab);
        goto done;
    }
    if ((st = mpq__load_linear(s, e->name, c->vocab, c->dim, ip, &m->embed, err)) != MPQ_OK) goto done;
    if (c->tied) {
        m->head = m->embed;
    } else if ((st = mpq__load_linear(s, mpq_llm_tensor_name(c->gguf_names, "head", 0, name, sizeof name), c->vocab,
                                      c->dim, ip, &m->head, err)) != MPQ_OK) {
        goto done;
    }
    if ((st = mpq__load_vector(s, mpq_llm_tensor_name(c->gguf_names, "out_norm", 0, name, sizeof name), c->dim,
                               &m->out_norm, err)) != MPQ_OK)
        goto done;
    m->layer = (mpq_llm_layer *)calloc((size_t)c->layers, sizeof *m->layer);
    if (!m->layer) {
        st = mpq__fail(err, MPQ_ERR_NOMEM, O, "out of memory");
        goto done;
    }
    int shape[MPQ_LIN_COUNT][2];
    mpq__lin_shapes(c, shape);
    for (int l = 0; l < c->layers && st == MPQ_OK; l++) {
        mpq_llm_layer *L = &m->layer[l];
        st = mpq__load_vector(s, mpq_llm_tensor_name(c->gguf_names, "attn_norm", l, name, sizeof name), c->dim,
                              &L->attn_norm, err);
        if (st == MPQ_OK)
            st = mpq__load_vector(s, mpq_llm_tensor_name(c->gguf_names, "ffn_norm", l, name, sizeof name), c->dim,
                                  &L->ffn_norm, err);
        for (int k = 0; k < MPQ_LIN_COUNT && st == MPQ_OK; k++) {
            st = mpq__load_linear(s, mpq_llm_linear_name(c->gguf_names, l, k, 0, name, sizeof name), shape[k][0],
                                  shape[k][1], ip, &L->lin[k], err);
            /* q, k and v must have biases where the config says so (Qwen2);
               any other bias there is (Llama's attention_bias and mlp_bias) is
               taken too */
            mpq_llm_linear_name(c->gguf_names, l, k, 1, name, sizeof name);
            if (st == MPQ_OK && ((c->qkv_bias && k <= MPQ_LIN_V) || mpq_source_find(s, name)))
                st = mpq__load_vector(s, name, shape[k][0], &L->lin[k].bias, err);
        }
    }
    if (st == MPQ_OK) st = mpq__rope_freqs(m, s, err);
    if (st == MPQ_OK && ip) m->src = s, s = NULL; /* the mappings stay */
    if (st == MPQ_OK && !o->packed_mapped) mpq__packed_arena(m);
done:
    mpq_source_close(s);
    if (st != MPQ_OK) {
        mpq_llm_free(m);
        return st;
    }
    *out = m;
    return MPQ_OK;
}

static float *mpq__filled(size_t n, float v)
{
    float *p = (float *)malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; p && i < n; i++) p[i] = v;
    return p;
}

mpq_status mpq_llm_create(const mpq_llm_config *c, mpq_tokenizer *tok, mpq_llm **out)
{
    if (!c || !tok || !out) return MPQ_ERR_ARG;
    const int dims[] = {c->vocab, c->dim, c->layers, c->heads, c->kv_heads, c->head_dim, c->ffn, c->ctx};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] < 1 || dims[i] > MPQ__MAX_DIM * (i == 0 ? 4 : i == 7 ? 16 : 1))
            return MPQ_ERR_SIZE; /* as loading */
    if (c->vocab < mpq_tokenizer_size(tok) || c->rope_scaling != MPQ_ROPE_SCALING_NONE) return MPQ_ERR_ARG;
    if (c->arch[0] && strcmp(c->arch, "llama") != 0 && strcmp(c->arch, "qwen2") != 0) return MPQ_ERR_UNSUPPORTED;
    if (mpq__config_check(c, "(model)", NULL) != MPQ_OK) return MPQ_ERR_ARG;
    mpq_llm *m = (mpq_llm *)calloc(1, sizeof *m);
    if (!m) return MPQ_ERR_NOMEM;
    m->c = *c;
    if (!m->c.arch[0]) snprintf(m->c.arch, sizeof m->c.arch, "llama");
    m->path = strdup("(built in memory)");
    m->layer = (mpq_llm_layer *)calloc((size_t)c->layers, sizeof *m->layer);
    const size_t D = (size_t)c->dim;
    int ok = m->path && m->layer;
    m->embed.rows = m->head.rows = c->vocab, m->embed.cols = m->head.cols = c->dim;
    ok = ok && (m->embed.W = mpq__filled((size_t)c->vocab * D, 0.0f)) != NULL;
    ok = ok && (m->out_norm = mpq__filled(D, 1.0f)) != NULL;
    if (ok && c->tied)
        m->head = m->embed;
    else if (ok)
        ok = (m->head.W = mpq__filled((size_t)c->vocab * D, 0.0f)) != NULL;
    int shape[MPQ_LIN_COUNT][2];
    mpq__lin_shapes(c, shape);
    for (int l = 0; ok && l < c->layers; l++) {
        mpq_llm_layer *L = &m->layer[l];
        ok = (L->attn_norm = mpq__filled(D, 1.0f)) && (L->ffn_norm = mpq__filled(D, 1.0f));
        for (int k = 0; ok && k < MPQ_LIN_COUNT; k++) {
            mpq_linear *Q = &L->lin[k];
            Q->rows = shape[k][0], Q->cols = shape[k][1];
            ok = (Q->W = mpq__filled((size_t)Q->rows * Q->cols, 0.0f)) != NULL;
            if (ok && c->qkv_bias && k <= MPQ_LIN_V) ok = (Q->bias = mpq__filled((size_t)Q->rows, 0.0f)) != NULL;
        }
    }
    if (!ok || mpq__rope_freqs(m, NULL, NULL) != MPQ_OK) {
        mpq_llm_free(m); /* the tokenizer is not the model's yet */
        return MPQ_ERR_NOMEM;
    }
    m->tok = tok;
    *out = m;
    return MPQ_OK;
}

/* The next entry of mpq_llm_params: filled when it fits (returned, for
   its name), counted always. */
static mpq_llm_param *mpq__param(mpq_llm_param *p, int cap, int *n, mpq_param_role role, int layer, int lin, int rows,
                                 int cols, float *data)
{
    mpq_llm_param *e = p && *n < cap ? &p[*n] : NULL;
    (*n)++;
    if (!e) return NULL;
    e->role = role, e->layer = layer, e->lin = lin, e->rows = rows, e->cols = cols;
    e->n = (size_t)rows * (size_t)(cols ? cols : 1), e->data = data;
    return e;
}

int mpq_llm_params(const mpq_llm *m, mpq_llm_param *p, int cap)
{
    if (!m) return 0;
    const mpq_llm_config *c = &m->c;
    const int g = c->gguf_names;
    const size_t cn = sizeof p->name;
    int n = 0;
    mpq_llm_param *e = mpq__param(p, cap, &n, MPQ_PARAM_EMBED, -1, -1, c->vocab, c->dim, m->embed.W);
    if (e) mpq_llm_tensor_name(g, "embed", 0, e->name, cn);
    if (!c->tied && (e = mpq__param(p, cap, &n, MPQ_PARAM_HEAD, -1, -1, c->vocab, c->dim, m->head.W)))
        mpq_llm_tensor_name(g, "head", 0, e->name, cn);
    if ((e = mpq__param(p, cap, &n, MPQ_PARAM_OUT_NORM, -1, -1, c->dim, 0, m->out_norm)))
        mpq_llm_tensor_name(g, "out_norm", 0, e->name, cn);
    for (int l = 0; l < c->layers; l++) {
        const mpq_llm_layer *L = &m->layer[l];
        if ((e = mpq__param(p, cap, &n, MPQ_PARAM_ATTN_NORM, l, -1, c->dim, 0, L->attn_norm)))
            mpq_llm_tensor_name(g, "attn_norm", l, e->name, cn);
        if ((e = mpq__param(p, cap, &n, MPQ_PARAM_FFN_NORM, l, -1, c->dim, 0, L->ffn_norm)))
            mpq_llm_tensor_name(g, "ffn_norm", l, e->name, cn);
        for (int k = 0; k < MPQ_LIN_COUNT; k++)
            if ((e = mpq__param(p, cap, &n, MPQ_PARAM_LINEAR, l, k, L->lin[k].rows, L->lin[k].cols, L->lin[k].W)))
                mpq_llm_linear_name(g, l, k, 0, e->name, cn);
        for (int k = 0; k < MPQ_LIN_COUNT; k++)
            if (L->lin[k].bias && (e = mpq__param(p, cap, &n, MPQ_PARAM_BIAS, l, k, L->lin[k].rows, 0, L->lin[k].bias)))
                mpq_llm_linear_name(g, l, k, 1, e->name, cn);
    }
    return n;
}

mpq_status mpq_linear_set_packed(mpq_llm *m, mpq_linear *L, mpq_packed *A)
{
    if (!m || !L || !A || !A->buf) return MPQ_ERR_ARG;
    if (A->rows != L->rows || A->cols != L->cols) return MPQ_ERR_SIZE;
    void *h = NULL;
    if (m->backend) {
        mpq_status st = m->backend->upload(m->backend->ctx, A, &h);
        if (st != MPQ_OK) return st;
    }
    mpq_linear_unpack(m, L);
    L->A = *A, L->handle = h;
    memset(A, 0, sizeof *A);
    if (m->c.tied && L == &m->embed) m->head = m->embed;
    return MPQ_OK;
}

void mpq_linear_unpack(mpq_llm *m, mpq_linear *L)
{
    if (!L) return;
    if (L->handle && m && m->backend) m->backend->release(m->backend->ctx, L->handle);
    L->handle = NULL;
    mpq_packed_free(&L->A);
    memset(&L->A, 0, sizeof L->A);
    if (m && m->c.tied && L == &m->embed) m->head = m->embed;
}

/* Every linear map of the model, the head when it is not the embedding. */
static int mpq__linears(mpq_llm *m, mpq_linear **v)
{
    int n = 0;
    for (int l = 0; l < m->c.layers; l++)
        for (int k = 0; k < MPQ_LIN_COUNT; k++) v[n++] = &m->layer[l].lin[k];
    v[n++] = &m->embed;
    if (!m->c.tied) v[n++] = &m->head;
    return n;
}

mpq_status mpq_llm_use_backend(mpq_llm *m, const mpq_backend *be)
{
    if (!m) return MPQ_ERR_ARG;
    mpq_linear **v = (mpq_linear **)malloc(sizeof *v * ((size_t)m->c.layers * MPQ_LIN_COUNT + 2));
    if (!v) return MPQ_ERR_NOMEM;
    const int n = mpq__linears(m, v);
    mpq_status st = MPQ_OK;
    for (int i = 0; i < n; i++) /* off the old backend */
        if (v[i]->handle) {
            m->backend->release(m->backend->ctx, v[i]->handle);
            v[i]->handle = NULL;
        }
    m->backend = be;
    for (int i = 0; be && i < n && st == MPQ_OK; i++)
        if (v[i]->A.buf) st = be->upload(be->ctx, &v[i]->A, &v[i]->handle);
    if (st != MPQ_OK) {
        for (int i = 0; i < n; i++)
            if (v[i]->handle) be->release(be->ctx, v[i]->handle), v[i]->handle = NULL;
        m->backend = NULL;
    }
    if (m->c.tied) m->head = m->embed;
    free(v);
    return st;
}

double mpq_llm_bpw(const mpq_llm *m, int level, int skip_planes)
{
    double bits = 0, n = 0;
    for (int l = 0; m && l < m->c.layers; l++)
        for (int k = 0; k < MPQ_LIN_COUNT; k++) {
            const mpq_linear *L = &m->layer[l].lin[k];
            if (!L->A.buf) continue;
            const double w = (double)L->rows * L->cols;
            bits += w * (skip_planes >= 0 ? mpq_packed_bpw_skip(&L->A, skip_planes) : mpq_packed_bpw(&L->A, level));
            n += w;
        }
    return n > 0 ? bits / n : 0.0;
}

static uint64_t mpq__linear_bytes(const mpq_linear *L)
{
    return L->A.buf ? (uint64_t)L->A.bytes
        : L->Ws     ? (uint64_t)L->rows * (uint64_t)L->ws_row
                    : (uint64_t)L->rows * (uint64_t)L->cols * 4u;
}

uint64_t mpq_llm_weight_bytes(const mpq_llm *m)
{
    if (!m) return 0;
    uint64_t b = mpq__linear_bytes(&m->embed) + (m->c.tied ? 0 : mpq__linear_bytes(&m->head));
    for (int l = 0; l < m->c.layers; l++)
        for (int k = 0; k < MPQ_LIN_COUNT; k++) b += mpq__linear_bytes(&m->layer[l].lin[k]);
    return b;
}

/* ========================================================================== */
/* 2. Forward pass                                                            */
/* ========================================================================== */

/* Heads an attention task takes at a time: heads of one group read the
   same keys and values, so each cache row is loaded once for all of them
   and their dot products and sums run side by side. */
#define MPQ__ATT_HEADS 4

#if defined(__GNUC__) || defined(__clang__)
#if defined(__AVX512F__)
#define MPQ__VB 64
#elif defined(__AVX__)
#define MPQ__VB 32
#else
#define MPQ__VB 16
#endif
#define MPQ__VL (int)(MPQ__VB / sizeof(float))
typedef float mpq__vf __attribute__((vector_size(MPQ__VB)));
static inline mpq__vf mpq__ld(const float *p)
{
    mpq__vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline float mpq__hsum(mpq__vf v)
{
    float s = 0;
    for (int i = 0; i < MPQ__VL; i++) s += v[i];
    return s;
}
static inline float mpq__mdot(const float *a, const float *b, int n)
{
    mpq__vf s0 = {0}, s1 = {0};
    int k = 0;
    for (; k + 2 * MPQ__VL <= n; k += 2 * MPQ__VL) {
        s0 += mpq__ld(a + k) * mpq__ld(b + k);
        s1 += mpq__ld(a + k + MPQ__VL) * mpq__ld(b + k + MPQ__VL);
    }
    float t = mpq__hsum(s0 + s1);
    for (; k < n; k++) t += a[k] * b[k];
    return t;
}
#else
static inline float mpq__mdot(const float *a, const float *b, int n)
{
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[k + j] * b[k + j];
    float t = 0;
    for (; k < n; k++) t += a[k] * b[k];
    for (int j = 0; j < 8; j++) t += acc[j];
    return t;
}
#endif

#if defined(__GNUC__) || defined(__clang__)
/* 4 tokens x 4 rows of Y, each a dot product of K, in the same order as
   mpq__mdot (two vector accumulators, then the tail). */
static void mpq__tile4(const float *X, const float *W, float *Y, int M, int K)
{
    mpq__vf s[4][4][2];
    memset(s, 0, sizeof s);
    int k = 0;
    for (; k + 2 * MPQ__VL <= K; k += 2 * MPQ__VL)
        for (int h = 0; h < 2; h++) {
            mpq__vf x[4], w[4];
            for (int t = 0; t < 4; t++) x[t] = mpq__ld(X + (size_t)t * K + k + h * MPQ__VL);
            for (int i = 0; i < 4; i++) w[i] = mpq__ld(W + (size_t)i * K + k + h * MPQ__VL);
            for (int t = 0; t < 4; t++)
                for (int i = 0; i < 4; i++) s[t][i][h] += x[t] * w[i];
        }
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) {
            float v = mpq__hsum(s[t][i][0] + s[t][i][1]);
            for (int kk = k; kk < K; kk++) v += X[(size_t)t * K + kk] * W[(size_t)i * K + kk];
            Y[(size_t)t * M + i] = v;
        }
}
#endif

/* Y[T x M] = X[T x K] W[M x K]^T, float. Every output is mpq__mdot of its
   row and column, whatever the tiling or thread count, so a token's result
   does not depend on the tokens beside it. Tasks of 16 rows of Y on
   mpq_parallel's threads. */
typedef struct mpq__sgemm_job {
    const float *X, *W;
    float *Y;
    int T, M, K;
    int tasks;           /* (M + MPQ__SGEMM_ROWS - 1) / MPQ__SGEMM_ROWS */
    const mpq_linear *S; /* W in place (S->Ws) instead of W, or NULL */
    float *dec;          /* S: 4 x K floats per thread for the converted rows */
    int ndec;            /* threads dec has room for (every thread that runs a task) */
} mpq__sgemm_job;

#define MPQ__SGEMM_ROWS 16 /* rows of Y per task, a multiple of 4 */

static int mpq__max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int mpq__thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static void mpq__sgemm_task(void *ctx, int task)
{
    const mpq__sgemm_job *J = (const mpq__sgemm_job *)ctx;
    const float *X = J->X, *W = J->W;
    float *Y = J->Y, *own = NULL;
    const int T = J->T, M = J->M, K = J->K;
    if (J->S) { /* rows converted four at a time into this thread's slot, then the same sums */
        const int id = mpq__thread_id();
        assert(id < J->ndec); /* mpq__dec_room made a slot for every thread */
        own = J->dec + (size_t)id * 4 * (size_t)K;
    }
    const int end = M - task * MPQ__SGEMM_ROWS < MPQ__SGEMM_ROWS ? M : (task + 1) * MPQ__SGEMM_ROWS;
    for (int m0 = task * MPQ__SGEMM_ROWS; m0 < end; m0 += 4) {
        const int mr = M - m0 < 4 ? M - m0 : 4;
        const float *Wr = own;
        if (J->S)
            mpq_gguf_decode(J->S->ws_type, (const uint8_t *)J->S->Ws + (size_t)m0 * J->S->ws_row,
                            (uint64_t)mr * (uint64_t)K, own);
        else
            Wr = W + (size_t)m0 * K;
        int t = 0;
#if defined(__GNUC__) || defined(__clang__)
        if (mr == 4)
            for (; t + 4 <= T; t += 4) mpq__tile4(X + (size_t)t * K, Wr, Y + (size_t)t * M + m0, M, K);
#endif
        for (; t < T; t++)
            for (int i = 0; i < mr; i++)
                Y[(size_t)t * M + m0 + i] = mpq__mdot(X + (size_t)t * K, Wr + (size_t)i * K, K);
    }
}

void mpq__sgemm(const float *X, int T, const float *W, int M, int K, float *Y)
{
    mpq__sgemm_job J = {X, W, Y, T, M, K, (M + MPQ__SGEMM_ROWS - 1) / MPQ__SGEMM_ROWS, NULL, NULL, 0};
    mpq_parallel(J.tasks, 0, mpq__sgemm_task, &J);
}

/* Room in s->dec for `threads` threads' rows of in-place weights (none
   needed when m has none). */
static mpq_status mpq__dec_room(const mpq_llm *m, mpq_llm_state *s, int threads)
{
    if (!m->src || threads <= s->dec_threads) return MPQ_OK;
    const mpq_llm_config *c = &m->c;
    const int qd = c->heads * c->head_dim;
    int cols = c->dim > c->ffn ? c->dim : c->ffn;
    cols = qd > cols ? qd : cols;
    float *d = (float *)malloc(sizeof(float) * 4 * (size_t)cols * (size_t)threads);
    if (!d) return MPQ_ERR_NOMEM;
    free(s->dec);
    s->dec = d, s->dec_threads = threads;
    return MPQ_OK;
}

mpq_status mpq__sgemm_lin(const mpq_linear *L, const float *X, int T, float *Y)
{
    if (L->W) {
        mpq__sgemm(X, T, L->W, L->rows, L->cols, Y);
        return MPQ_OK;
    }
    const int th = mpq__max_threads();
    float *dec = (float *)malloc(sizeof(float) * 4 * (size_t)L->cols * (size_t)th);
    if (!dec) return MPQ_ERR_NOMEM;
    mpq__sgemm_job J = {X, NULL, Y, T, L->rows, L->cols, (L->rows + MPQ__SGEMM_ROWS - 1) / MPQ__SGEMM_ROWS, L, dec, th};
    mpq_parallel(J.tasks, 0, mpq__sgemm_task, &J);
    free(dec);
    return MPQ_OK;
}

/* The float product of map L, its weights in memory or in place. */
static mpq__sgemm_job mpq__sgemm_of(const mpq_llm_state *s, const mpq_linear *L, const float *X, int T, float *Y)
{
    mpq__sgemm_job J = {X,
                        L->W,
                        Y,
                        T,
                        L->rows,
                        L->cols,
                        (L->rows + MPQ__SGEMM_ROWS - 1) / MPQ__SGEMM_ROWS,
                        L->W ? NULL : L,
                        s->dec,
                        s->dec_threads};
    return J;
}

mpq_status mpq_llm_state_init(const mpq_llm *m, int ctx, int batch, mpq_llm_state *s)
{
    if (!m || !s || ctx < 1 || batch < 1 || ctx > (1 << 24)) return MPQ_ERR_ARG;
    memset(s, 0, sizeof *s);
    const mpq_llm_config *c = &m->c;
    const size_t kvd = (size_t)c->kv_heads * c->head_dim, qd = (size_t)c->heads * c->head_dim;
    const size_t B = (size_t)batch, D = (size_t)c->dim, F = (size_t)c->ffn;
    const size_t wide = qd > D ? qd : D;
    s->nthreads = mpq__max_threads();
    s->ctx = ctx, s->batch = batch;
    if (mpq__dec_room(m, s, s->nthreads) != MPQ_OK) return MPQ_ERR_NOMEM;
    s->kc = (float *)malloc(sizeof(float) * (size_t)c->layers * (size_t)ctx * kvd);
    s->vc = (float *)malloc(sizeof(float) * (size_t)c->layers * (size_t)ctx * kvd);
    const size_t per = B * (2 * D + qd + 2 * kvd + wide + 2 * F + (size_t)c->head_dim);
    /* per thread: MPQ__ATT_HEADS rows of attention scores, then two times
       MPQ__ATT_HEADS head rows (mpq__attention_task) */
    const size_t att = (size_t)MPQ__ATT_HEADS * ((size_t)ctx + 2 * (size_t)c->head_dim);
    const size_t mem_bytes = sizeof(float) * (per + (size_t)s->nthreads * att);
    s->mem = (float *)malloc(mem_bytes);
    if (!s->kc || !s->vc || !s->mem) {
        mpq_llm_state_free(s);
        return MPQ_ERR_NOMEM;
    }
    /* the products' inputs and outputs reachable by the backend's copies (a
       pin that fails leaves the memory as malloc gave it) */
    const mpq_backend *be = m->backend;
    if (be && be->pin && be->unpin && be->pin(be->ctx, s->mem, mem_bytes) == MPQ_OK)
        s->unpin = be->unpin, s->unpin_ctx = be->ctx;
    float *p = s->mem;
    s->x = p, p += B * D;
    s->h = p, p += B * D;
    s->q = p, p += B * qd;
    s->k = p, p += B * kvd;
    s->v = p, p += B * kvd;
    s->a = p, p += B * wide;
    s->g = p, p += B * F;
    s->u = p, p += B * F;
    s->rope = p, p += B * (size_t)c->head_dim;
    s->scores = p;
    return MPQ_OK;
}

void mpq_llm_state_free(mpq_llm_state *s)
{
    if (!s) return;
    if (s->unpin) s->unpin(s->unpin_ctx, s->mem);
    free(s->kc);
    free(s->vc);
    free(s->mem);
    mpq_aligned_free(s->work);
    free(s->dec);
    memset(s, 0, sizeof *s);
}

static size_t mpq__align(size_t x) { return (x + 63u) & ~(size_t)63u; }

/* T rows of y (rows floats each) += L's bias, where it has one. */
static void mpq__add_bias(const mpq_linear *L, float *y, int T)
{
    for (int t = 0; L->bias && t < T; t++)
        for (int i = 0; i < L->rows; i++) y[(size_t)t * L->rows + i] += L->bias[i];
}

/* The options of a product of the model's packed maps. */
static mpq_gemv_opts mpq__opts_of(const mpq_llm *m, int skip)
{
    mpq_gemv_opts o;
    memset(&o, 0, sizeof o);
    o.skip_planes = skip, o.a8 = m->a8, o.path = m->cpu_path;
    return o;
}

/* y[T x rows] = L x[T x cols] (+ bias); L is linear map `lin` of `layer`
   (layer -1: the head, not observed). */
static mpq_status mpq__linear(const mpq_llm *m, mpq_llm_state *s, const mpq_linear *L, int layer, int lin,
                              const float *x, float *y, int T, int skip)
{
    mpq_status st = MPQ_OK;
    if (m->observe && layer >= 0) m->observe(m->observe_user, layer, lin, x, T, L->cols);
    if (L->A.buf) {
        const mpq_gemv_opts o = mpq__opts_of(m, skip);
        if (L->handle) {
            st = m->backend->gemv(m->backend->ctx, L->handle, x, y, T, &o);
        } else {
            const size_t wb = mpq_gemv_work_bytes(&L->A, T);
            if (wb > s->work_bytes) {
                void *w = mpq_aligned_alloc(wb);
                if (!w) return MPQ_ERR_NOMEM;
                mpq_aligned_free(s->work);
                s->work = w, s->work_bytes = wb;
            }
            st = mpq_gemv(&L->A, x, y, T, &o, s->work, s->work_bytes);
        }
    } else {
        if (!L->W && (st = mpq__dec_room(m, s, mpq__max_threads())) != MPQ_OK) return st;
        mpq__sgemm_job J = mpq__sgemm_of(s, L, x, T, y);
        mpq_parallel(J.tasks, 0, mpq__sgemm_task, &J);
    }
    if (st == MPQ_OK) mpq__add_bias(L, y, T);
    return st;
}

void mpq__rmsnorm(const float *x, const float *w, float *y, int T, int D, double eps)
{
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * D;
        double ss = 0;
        for (int j = 0; j < D; j++) ss += (double)xt[j] * xt[j];
        const float r = (float)(1.0 / sqrt(ss / D + eps));
        for (int j = 0; j < D; j++) y[(size_t)t * D + j] = xt[j] * r * w[j];
    }
}

void mpq__rope_table(const mpq_llm *m, int pos, int T, float *rope)
{
    const int hd = m->c.head_dim, half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            const double a = (double)(pos + t) * (double)m->rope_freq[i];
            rope[(size_t)t * hd + i] = (float)cos(a);
            rope[(size_t)t * hd + half + i] = (float)sin(a);
        }
}

void mpq__rotate(const mpq_llm_config *c, const float *rope, float *v, int T, int nh, int inverse)
{
    const int hd = c->head_dim, half = hd / 2;
    for (int t = 0; t < T; t++) {
        const float *cs = rope + (size_t)t * hd, *sn = cs + half;
        for (int h = 0; h < nh; h++) {
            float *x = v + ((size_t)t * nh + h) * hd;
            for (int i = 0; i < half; i++) {
                const int a = c->rope_style == MPQ_ROPE_ADJACENT ? 2 * i : i;
                const int b = c->rope_style == MPQ_ROPE_ADJACENT ? 2 * i + 1 : i + half;
                const float x0 = x[a], x1 = x[b], sv = inverse ? -sn[i] : sn[i];
                x[a] = x0 * cs[i] - x1 * sv;
                x[b] = x0 * sv + x1 * cs[i];
            }
        }
    }
}

/* THE THREADS OF A PIECE. A piece runs every layer inside one OpenMP
   parallel region (a team) when it can: each step below is split between
   the team's threads and ends at a barrier, so that a decoded token costs
   one region instead of one per product (211 for SmolLM2), the products'
   tables are built in parallel (mpq_gemv_job's phases), and q, k, v and
   gate, up run as one list of tasks over tables built once. The team has
   mpq_threads(s->nthreads) threads: fewer while other processes keep cores
   busy, as mpq_parallel would. A piece runs without a team (each step
   through mpq_parallel, each product through mpq__linear) when a product
   goes to another backend, when the model is observed (the callbacks run
   regions of their own) and on one thread. Either way every output is
   the same float: a product's tiles and a step's rows are computed alike
   whatever the split.
   Errors: every thread meets every barrier; a step that fails stores its
   status in P->st, and later steps do nothing once it is set. */
typedef struct mpq__piece_ctx {
    const mpq_llm *m;
    mpq_llm_state *s;
    mpq_llm_state *const *seq; /* NULL: every row in s, row t at pos + t; else row t in seq[t] at seq[t]->pos */
    const int32_t *tok;
    int T, skip, lo, pos;
    float *logits;
    const uint8_t *shared; /* per layer: bit 0 k, bit 1 v share q's tables, bit 2 up shares gate's */
    int st;                /* an error of the piece (mpq_status), stored atomically */
} mpq__piece_ctx;

static int mpq__piece_failed(mpq__piece_ctx *P) { return __atomic_load_n(&P->st, __ATOMIC_RELAXED) != MPQ_OK; }
static void mpq__piece_fail(mpq__piece_ctx *P, mpq_status st)
{
    if (st != MPQ_OK) __atomic_store_n(&P->st, (int)st, __ATOMIC_RELAXED);
}

/* The thread running a piece: id of n in its team (n 1: no team). */
typedef struct mpq__me {
    int id, n;
} mpq__me;

static void mpq__barrier(mpq__me me)
{
    if (me.n > 1) {
#pragma omp barrier
    }
}

/* Tasks 0 .. n-1 of fn: this thread's share of them in a team (then the
   barrier), else through mpq_parallel on `threads` (1: on the caller). */
static void mpq__step(mpq__piece_ctx *P, mpq__me me, int n, int threads, mpq_task_fn fn, void *ctx)
{
    if (me.n > 1) {
        if (!mpq__piece_failed(P))
            for (int t = (int)((long long)n * me.id / me.n); t < (int)((long long)n * (me.id + 1) / me.n); t++)
                fn(ctx, t);
        mpq__barrier(me);
    } else if (threads > 1)
        mpq_parallel(n, threads, fn, ctx);
    else
        for (int t = 0; t < n; t++) fn(ctx, t);
}

/* Cache rows ahead that the attention asks for: a head's rows of keys and
   values lie a whole row of the cache (kv_heads x head_dim floats, 4 KB on
   Llama-70B's shape) apart, each in a page of its own, where the
   hardware's prefetchers do not follow. */
#define MPQ__ATT_AHEAD 8
static inline void mpq__att_prefetch(const float *row, int hd)
{
#if defined(__GNUC__) || defined(__clang__)
    for (int d = 0; d < hd; d += 16) __builtin_prefetch((const void *)(row + d), 0, 3);
#else
    (void)row, (void)hd;
#endif
}

/* The dot products of MPQ__ATT_HEADS rows of q (qs floats apart) with one
   key row k of n floats, each in mpq__mdot's order (two vector
   accumulators, then the tail), so a head's score is the same float in
   whichever slot it lies. */
static void mpq__att_dots(const float *q, size_t qs, const float *k, int n, float *out)
{
#if defined(__GNUC__) || defined(__clang__)
    mpq__vf s[MPQ__ATT_HEADS][2];
    memset(s, 0, sizeof s);
    int d = 0;
    for (; d + 2 * MPQ__VL <= n; d += 2 * MPQ__VL) {
        const mpq__vf k0 = mpq__ld(k + d), k1 = mpq__ld(k + d + MPQ__VL);
        for (int i = 0; i < MPQ__ATT_HEADS; i++) {
            s[i][0] += mpq__ld(q + (size_t)i * qs + d) * k0;
            s[i][1] += mpq__ld(q + (size_t)i * qs + d + MPQ__VL) * k1;
        }
    }
    for (int i = 0; i < MPQ__ATT_HEADS; i++) {
        float t = mpq__hsum(s[i][0] + s[i][1]);
        for (int dd = d; dd < n; dd++) t += q[(size_t)i * qs + dd] * k[dd];
        out[i] = t;
    }
#else
    for (int i = 0; i < MPQ__ATT_HEADS; i++) out[i] = mpq__mdot(q + (size_t)i * qs, k, n);
#endif
}

/* o_i = sum_j p_ij v_j for MPQ__ATT_HEADS heads (o_i at o + i * os, p_ij
   = sc[i * ss + j] * inv[i]) over the n value rows v_j (vs floats apart)
   of hd floats: each o_i[d] starts at 0 and adds p_ij v_j[d] in the order
   of j, as a loop over j of o[d] += p v_j[d] would, with the sums of a
   slice of d held in registers over the whole of j. */
static void mpq__att_values(const float *sc, size_t ss, const float *inv, const float *v, size_t vs, int n, int hd,
                            float *o, size_t os)
{
    int d0 = 0;
#if defined(__GNUC__) || defined(__clang__)
    for (; d0 + 2 * MPQ__VL <= hd; d0 += 2 * MPQ__VL) {
        mpq__vf acc[MPQ__ATT_HEADS][2];
        memset(acc, 0, sizeof acc);
        for (int j = 0; j < n; j++) {
            if (d0 == 0 && j + MPQ__ATT_AHEAD < n) mpq__att_prefetch(v + (size_t)(j + MPQ__ATT_AHEAD) * vs, hd);
            const float *vj = v + (size_t)j * vs + d0;
            const mpq__vf v0 = mpq__ld(vj), v1 = mpq__ld(vj + MPQ__VL);
            for (int i = 0; i < MPQ__ATT_HEADS; i++) {
                const float p = sc[(size_t)i * ss + j] * inv[i];
                acc[i][0] += p * v0;
                acc[i][1] += p * v1;
            }
        }
        for (int i = 0; i < MPQ__ATT_HEADS; i++) {
            memcpy(o + (size_t)i * os + d0, &acc[i][0], sizeof acc[i][0]);
            memcpy(o + (size_t)i * os + d0 + MPQ__VL, &acc[i][1], sizeof acc[i][1]);
        }
    }
#endif
    for (int i = 0; i < MPQ__ATT_HEADS; i++) {
        float *oi = o + (size_t)i * os;
        for (int d = d0; d < hd; d++) oi[d] = 0;
        for (int j = 0; j < n; j++) {
            const float p = sc[(size_t)i * ss + j] * inv[i], *vj = v + (size_t)j * vs;
            for (int d = d0; d < hd; d++) oi[d] += p * vj[d];
        }
    }
}

/* Causal attention of T new tokens at positions pos.. over the cache of
   layer l (already holding their keys and values): `tasks` tasks, each a
   range of (token, head) pairs with its own MPQ__ATT_HEADS rows of
   s->scores. A task takes its range in runs of up to MPQ__ATT_HEADS heads
   of one token and one group; a run of fewer fills the other slots with
   its last head and keeps only its own heads' results (scratch rows), so
   that every head is computed by the same code and a head's output does
   not depend on the split. */
typedef struct mpq__attention_job {
    const mpq_llm *m;
    mpq_llm_state *s;
    mpq_llm_state *const *seq;
    int l, T, pos, tasks;
} mpq__attention_job;

static void mpq__attention_task(void *ctx, int task)
{
    const mpq__attention_job *J = (const mpq__attention_job *)ctx;
    const mpq_llm_config *c = &J->m->c;
    mpq_llm_state *s = J->s;
    const int hd = c->head_dim, H = c->heads, group = c->heads / c->kv_heads, n = J->T * H;
    const size_t kvd = (size_t)c->kv_heads * hd, qd = (size_t)H * hd, ss = (size_t)s->ctx;
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *sc = s->scores + (size_t)task * MPQ__ATT_HEADS * ss;
    /* a run of fewer heads: its q rows and the copies of its last one, and
       the outputs of all its slots */
    float *qx = s->scores + (size_t)s->nthreads * MPQ__ATT_HEADS * ss + (size_t)task * 2 * MPQ__ATT_HEADS * hd;
    float *ox = qx + (size_t)MPQ__ATT_HEADS * hd;
    const int th1 = (int)((long long)n * (task + 1) / J->tasks);
    for (int th = (int)((long long)n * task / J->tasks); th < th1;) {
        const int t = th / H, h = th % H, g = h / group;
        int nh = group - h % group;
        nh = nh < th1 - th ? nh : th1 - th;
        nh = nh < MPQ__ATT_HEADS ? nh : MPQ__ATT_HEADS;
        const mpq_llm_state *own = J->seq ? J->seq[t] : s; /* the cache rows token t reads */
        const int P = J->seq ? own->pos : J->pos + t;
        const float *kc = own->kc + (size_t)J->l * own->ctx * kvd + (size_t)g * hd;
        const float *vc = own->vc + (size_t)J->l * own->ctx * kvd + (size_t)g * hd;
        const float *q = s->q + (size_t)t * qd + (size_t)h * hd;
        float *o = s->a + (size_t)t * qd + (size_t)h * hd;
        if (nh < MPQ__ATT_HEADS) {
            for (int i = 0; i < MPQ__ATT_HEADS; i++)
                memcpy(qx + (size_t)i * hd, q + (size_t)(i < nh ? i : nh - 1) * hd, sizeof(float) * (size_t)hd);
            q = qx;
        }
        float mx[MPQ__ATT_HEADS], inv[MPQ__ATT_HEADS];
        for (int i = 0; i < MPQ__ATT_HEADS; i++) mx[i] = -INFINITY;
        for (int j = 0; j <= P; j++) {
            float dot[MPQ__ATT_HEADS];
            if (j + MPQ__ATT_AHEAD <= P) mpq__att_prefetch(kc + (size_t)(j + MPQ__ATT_AHEAD) * kvd, hd);
            mpq__att_dots(q, (size_t)hd, kc + (size_t)j * kvd, hd, dot);
            for (int i = 0; i < MPQ__ATT_HEADS; i++) {
                const float v = dot[i] * scale;
                sc[(size_t)i * ss + j] = v;
                mx[i] = v > mx[i] ? v : mx[i];
            }
        }
        for (int i = 0; i < MPQ__ATT_HEADS; i++) {
            float *si = sc + (size_t)i * ss;
            double sum = 0;
            if (i < nh)
                for (int j = 0; j <= P; j++) sum += (si[j] = expf(si[j] - mx[i]));
            inv[i] = i < nh ? (float)(1.0 / sum) : 0.0f; /* a spare slot's output is not kept */
        }
        if (nh == MPQ__ATT_HEADS)
            mpq__att_values(sc, ss, inv, vc, kvd, P + 1, hd, o, (size_t)hd);
        else {
            mpq__att_values(sc, ss, inv, vc, kvd, P + 1, hd, ox, (size_t)hd);
            memcpy(o, ox, sizeof(float) * (size_t)nh * (size_t)hd);
        }
        th += nh;
    }
}

/* g = silu(g) * u over n floats of the state (an expf each: at a prompt of
   512 tokens and an ffn of 28672 it is 15 M of them per layer), in slices.
   Without a team: below 65536 floats on the caller, else one slice per
   thread of the state, so the OpenMP team keeps the size of the
   attention's (teams of other sizes in between, or one woken for a single
   token, cost more than they saved: bench/results/NOTES.md). */
typedef struct mpq__swiglu_job {
    float *g;
    const float *u;
    size_t n;
    int tasks;
} mpq__swiglu_job;

static void mpq__swiglu_task(void *ctx, int task)
{
    const mpq__swiglu_job *J = (const mpq__swiglu_job *)ctx;
    const size_t i0 = J->n * (size_t)task / (size_t)J->tasks, i1 = J->n * (size_t)(task + 1) / (size_t)J->tasks;
    for (size_t i = i0; i < i1; i++) {
        const float g = J->g[i];
        J->g[i] = g / (1.0f + expf(-g)) * J->u[i];
    }
}

/* Per-token steps: token t's embedding and rotary table; its residual and
   norm; its rotary and cache rows. */
typedef struct mpq__token_job {
    mpq__piece_ctx *P;
    int l;           /* the layer (the norm and cache steps) */
    int add;         /* norm step: x += h first */
    const float *nw; /* norm step: the weights; NULL: only the residual */
    float *out;      /* norm step: where row t - first goes */
    int first;       /* norm step: the first row normed */
} mpq__token_job;

static void mpq__embed_task(void *ctx, int t)
{
    const mpq__token_job *J = (const mpq__token_job *)ctx;
    mpq__piece_ctx *P = J->P;
    const mpq_llm *m = P->m;
    const int D = m->c.dim, hd = m->c.head_dim;
    float *x = P->s->x + (size_t)t * D;
    if (m->embed.A.buf)
        mpq__piece_fail(P, mpq_packed_dequantize_row(&m->embed.A, 0, P->tok[t], x));
    else if (!m->embed.W)
        mpq__piece_fail(P,
                        mpq_gguf_decode(m->embed.ws_type,
                                        (const uint8_t *)m->embed.Ws + (size_t)P->tok[t] * m->embed.ws_row, (uint64_t)D,
                                        x));
    else
        memcpy(x, m->embed.W + (size_t)P->tok[t] * D, sizeof(float) * (size_t)D);
    mpq__rope_table(m, P->seq ? P->seq[t]->pos : P->pos + t, 1, P->s->rope + (size_t)t * hd);
}

static void mpq__norm_task(void *ctx, int t)
{
    const mpq__token_job *J = (const mpq__token_job *)ctx;
    mpq_llm_state *s = J->P->s;
    const mpq_llm_config *c = &J->P->m->c;
    const int D = c->dim;
    float *x = s->x + (size_t)t * D;
    if (J->add)
        for (int i = 0; i < D; i++) x[i] += s->h[(size_t)t * D + i];
    if (J->nw && t >= J->first) mpq__rmsnorm(x, J->nw, J->out + (size_t)(t - J->first) * D, 1, D, c->norm_eps);
}

static void mpq__cache_task(void *ctx, int t)
{
    const mpq__token_job *J = (const mpq__token_job *)ctx;
    const mpq__piece_ctx *P = J->P;
    const mpq_llm_config *c = &P->m->c;
    mpq_llm_state *s = P->s;
    const int hd = c->head_dim;
    const size_t kvd = (size_t)c->kv_heads * hd, qd = (size_t)c->heads * hd;
    const float *rope = s->rope + (size_t)t * hd;
    float *k = s->k + (size_t)t * kvd, *v = s->v + (size_t)t * kvd;
    mpq__rotate(c, rope, s->q + (size_t)t * qd, 1, c->heads, 0);
    mpq__rotate(c, rope, k, 1, c->kv_heads, 0);
    mpq_llm_state *own = P->seq ? P->seq[t] : s;
    const size_t at = ((size_t)J->l * own->ctx + (size_t)(P->seq ? own->pos : P->pos + t)) * kvd;
    memcpy(own->kc + at, k, sizeof(float) * kvd);
    memcpy(own->vc + at, v, sizeof(float) * kvd);
}

/* One to three products of one input x (T vectors): linear maps lin[0..n)
   of layer `layer` (-1: the head) into y[0..n). In a team: as
   mpq_gemv_jobs, the tasks of each phase of all of them split between the
   threads as one list, with the tables of those marked in `share` (bit k:
   map k reads map 0's) built once; float maps through mpq__sgemm's tasks.
   Without a team, where every map of several has a handle on a backend
   with gemv_n: that one call. */
typedef struct mpq__bias_job {
    const mpq_linear *const *L;
    float *const *y;
    int n;
} mpq__bias_job;

static void mpq__bias_task(void *ctx, int t)
{
    const mpq__bias_job *J = (const mpq__bias_job *)ctx;
    for (int k = 0; k < J->n; k++) mpq__add_bias(J->L[k], J->y[k] + (size_t)t * J->L[k]->rows, 1);
}

static void mpq__products(mpq__piece_ctx *P, mpq__me me, const mpq_linear *const *L, const int *lin, int n, int layer,
                          const float *x, float *const *y, int T, unsigned share)
{
    const mpq_llm *m = P->m;
    mpq_llm_state *s = P->s;
    const int skip = layer >= 0 ? P->skip : 0;
    if (me.n == 1) {
        const mpq_backend *be = m->backend;
        int together = n > 1 && be && be->gemv_n;
        for (int k = 0; k < n; k++) together &= L[k]->handle != NULL;
        if (together) { /* one call for them all, which copies x once (mpq_backend.gemv_n) */
            if (mpq__piece_failed(P)) return;
            void *h[3];
            for (int k = 0; k < n; k++) {
                if (m->observe && layer >= 0) m->observe(m->observe_user, layer, lin[k], x, T, L[k]->cols);
                h[k] = L[k]->handle;
            }
            const mpq_gemv_opts o = mpq__opts_of(m, skip);
            mpq__piece_fail(P, be->gemv_n(be->ctx, n, h, x, y, T, &o));
            for (int k = 0; k < n && !mpq__piece_failed(P); k++) mpq__add_bias(L[k], y[k], T);
            return;
        }
        for (int k = 0; k < n && !mpq__piece_failed(P); k++)
            mpq__piece_fail(P, mpq__linear(m, s, L[k], layer, lin[k], x, y[k], T, skip));
        return;
    }
    mpq_gemv_job J[3];
    mpq__sgemm_job F[3];
    int packed[3];
    size_t used = 0;
    const mpq_gemv_opts o = mpq__opts_of(m, skip);
    for (int k = 0; k < n; k++) {
        memset(&J[k], 0, sizeof J[k]);
        packed[k] = L[k]->A.buf != NULL;
        if (!packed[k]) {
            F[k] = mpq__sgemm_of(s, L[k], x, T, y[k]);
            continue;
        }
        const int sh = k > 0 && (share >> k & 1u) && packed[0];
        const size_t wb = sh ? 0 : mpq_gemv_work_bytes(&L[k]->A, T);
        const mpq_status st =
            mpq_gemv_job_init(&J[k], &L[k]->A, x, y[k], T, &o, (uint8_t *)s->work + used, wb, sh ? &J[0] : NULL);
        used += mpq__align(wb);
        if (st != MPQ_OK) mpq__piece_fail(P, st); /* the same on every thread */
    }
    for (int ph = 0; ph < MPQ_GEMV_PHASES; ph++) {
        int nk[3], total = 0;
        for (int k = 0; k < n; k++) total += nk[k] = packed[k] ? J[k].tasks[ph] : ph == 2 ? F[k].tasks : 0;
        if (!total) continue;
        const int a = (int)((long long)total * me.id / me.n), b = (int)((long long)total * (me.id + 1) / me.n);
        for (int k = 0, base = 0; k < n && !mpq__piece_failed(P); base += nk[k], k++) {
            const int t0 = a > base ? a - base : 0, t1 = b - base < nk[k] ? b - base : nk[k];
            if (t0 >= t1) continue;
            if (packed[k])
                mpq__piece_fail(P, mpq_gemv_job_run(&J[k], ph, t0, t1));
            else
                for (int t = t0; t < t1; t++) mpq__sgemm_task(&F[k], t);
        }
        mpq__barrier(me);
    }
    int bias = 0;
    for (int k = 0; k < n; k++) bias |= L[k]->bias != NULL;
    if (bias) {
        mpq__bias_job B = {L, y, n};
        mpq__step(P, me, T, 1, mpq__bias_task, &B);
    }
}

/* The piece, on thread `me` of its team. */
static void mpq__piece_run(mpq__piece_ctx *P, mpq__me me)
{
    const mpq_llm *m = P->m;
    const mpq_llm_config *c = &m->c;
    mpq_llm_state *s = P->s;
    const int T = P->T, th = s->nthreads;
    /* Without a team (another backend, an observed model) the per-token steps
       of a piece of at least 16384 floats a row go to the state's threads,
       the team of the attention's: on the caller alone, 64 tokens of
       Llama-70B's width took most of a decode step whose products ran on a
       GPU (bench/results/NOTES.md, "The host's share of a GPU decode step") */
    const int tt = (size_t)T * (size_t)c->dim >= 16384 ? th : 1;
    mpq__token_job tj = {P, 0, 0, NULL, NULL, 0};
    mpq__step(P, me, T, tt, mpq__embed_task, &tj);
    for (int l = 0; l < c->layers; l++) {
        const mpq_llm_layer *Ly = &m->layer[l];
        const unsigned sh = P->shared ? P->shared[l] : 0u;
        tj = (mpq__token_job){P, l, l > 0, Ly->attn_norm, s->h, 0}; /* the last layer's down product added */
        mpq__step(P, me, T, tt, mpq__norm_task, &tj);
        const mpq_linear *qkv[3] = {&Ly->lin[MPQ_LIN_Q], &Ly->lin[MPQ_LIN_K], &Ly->lin[MPQ_LIN_V]};
        const int lqkv[3] = {MPQ_LIN_Q, MPQ_LIN_K, MPQ_LIN_V};
        float *const yqkv[3] = {s->q, s->k, s->v};
        mpq__products(P, me, qkv, lqkv, 3, l, s->h, yqkv, T, (sh & 3u) << 1);
        mpq__step(P, me, T, tt, mpq__cache_task, &tj);
        mpq__attention_job aj = {m, s, P->seq, l, T, P->pos, me.n > 1 ? me.n : th};
        mpq__step(P, me, aj.tasks, th, mpq__attention_task, &aj);
        const mpq_linear *lo[1] = {&Ly->lin[MPQ_LIN_O]};
        const int llo[1] = {MPQ_LIN_O};
        float *const yo[1] = {s->h};
        mpq__products(P, me, lo, llo, 1, l, s->a, yo, T, 0);
        tj = (mpq__token_job){P, l, 1, Ly->ffn_norm, s->h, 0};
        mpq__step(P, me, T, tt, mpq__norm_task, &tj);
        const mpq_linear *gu[2] = {&Ly->lin[MPQ_LIN_GATE], &Ly->lin[MPQ_LIN_UP]};
        const int lgu[2] = {MPQ_LIN_GATE, MPQ_LIN_UP};
        float *const ygu[2] = {s->g, s->u};
        mpq__products(P, me, gu, lgu, 2, l, s->h, ygu, T, (sh >> 2 & 1u) << 1);
        const size_t nf = (size_t)T * (size_t)c->ffn;
        mpq__swiglu_job sj = {s->g, s->u, nf, me.n > 1 ? me.n : nf < 65536 ? 1 : th};
        mpq__step(P, me, sj.tasks, sj.tasks, mpq__swiglu_task, &sj);
        const mpq_linear *dn[1] = {&Ly->lin[MPQ_LIN_DOWN]};
        const int ldn[1] = {MPQ_LIN_DOWN};
        mpq__products(P, me, dn, ldn, 1, l, s->g, yo, T, 0);
    }
    /* the last down product added; the norm of rows lo.. into s->a, which the head reads */
    tj = (mpq__token_job){P, 0, c->layers > 0, P->logits && P->lo < T ? m->out_norm : NULL, s->a, P->lo};
    mpq__step(P, me, T, tt, mpq__norm_task, &tj);
    if (P->logits && P->lo < T) {
        const mpq_linear *hd[1] = {&m->head};
        const int lhd[1] = {0};
        float *const yl[1] = {P->logits};
        mpq__products(P, me, hd, lhd, 1, -1, s->a, yl, T - P->lo, 0);
    }
}

/* One piece of at most s->batch tokens; logits of tokens lo.. (may be NULL).
   seq NULL: the tokens are one sequence's, in s at s->pos onwards; else
   token t is the next of sequence seq[t] (its cache, at seq[t]->pos) and s
   is the scratch only. */
static mpq_status mpq__piece(const mpq_llm *m, mpq_llm_state *s, mpq_llm_state *const *seq, const int32_t *tok, int T,
                             int skip, float *logits, int lo)
{
    const mpq_llm_config *c = &m->c;
    if (m->src && mpq_source_check(m->src, NULL) != MPQ_OK) return MPQ_ERR_IO; /* weights in place: see IN PLACE */
    mpq__piece_ctx P = {m, s, seq, tok, T, skip, lo, s->pos, logits, NULL, MPQ_OK};
    int team = !m->observe && s->nthreads > 1 && (!m->head.A.buf || !m->head.handle);
    for (int l = 0; team && l < c->layers; l++)
        for (int k = 0; k < MPQ_LIN_COUNT; k++) team &= !m->layer[l].lin[k].handle;
    uint8_t *shared = NULL;
    if (team && (team = mpq_threads(s->nthreads)) > 1) {
        /* which maps share tables, and the workspace of the widest product group */
        shared = (uint8_t *)calloc((size_t)c->layers, 1);
        if (!shared) return MPQ_ERR_NOMEM;
        size_t need = m->head.A.buf ? mpq__align(mpq_gemv_work_bytes(&m->head.A, T)) : 0;
        for (int l = 0; l < c->layers; l++) {
            const mpq_linear *L = m->layer[l].lin;
            const int g[2][3] = {{MPQ_LIN_Q, MPQ_LIN_K, MPQ_LIN_V}, {MPQ_LIN_GATE, MPQ_LIN_UP, -1}};
            for (int k = 0; k < MPQ_LIN_COUNT; k++) {
                const size_t wb = L[k].A.buf ? mpq__align(mpq_gemv_work_bytes(&L[k].A, T)) : 0;
                need = wb > need ? wb : need;
            }
            for (int q = 0; q < 2; q++) {
                size_t sum = 0;
                for (int k = 0; k < 3 && g[q][k] >= 0; k++) {
                    const mpq_linear *A = &L[g[q][k]], *F = &L[g[q][0]];
                    const int sh = k > 0 && A->A.buf && F->A.buf && mpq_gemv_tables_shared(&A->A, &F->A);
                    if (sh) shared[l] |= (uint8_t)(1u << (q == 0 ? k - 1 : 2));
                    if (A->A.buf && !sh) sum += mpq__align(mpq_gemv_work_bytes(&A->A, T));
                }
                need = sum > need ? sum : need;
            }
        }
        if (need > s->work_bytes) {
            void *w = mpq_aligned_alloc(need);
            if (!w) {
                free(shared);
                return MPQ_ERR_NOMEM;
            }
            mpq_aligned_free(s->work);
            s->work = w, s->work_bytes = need;
        }
        P.shared = shared;
        int got = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(team)
        {
            const mpq__me me = {omp_get_thread_num(), omp_get_num_threads()};
            if (me.id == 0) got = me.n;
            mpq__piece_run(&P, me);
        }
#else
        const mpq__me me = {0, 1}; /* not reached: mpq_threads is 1 without OpenMP */
        mpq__piece_run(&P, me);
#endif
        free(shared);
        s->team = got;
    } else {
        const mpq__me me = {0, 1};
        mpq__piece_run(&P, me);
        s->team = 1;
    }
    const mpq_status st = (mpq_status)P.st;
    if (st == MPQ_OK && !seq) s->pos += T;
    for (int t = 0; st == MPQ_OK && seq && t < T; t++) seq[t]->pos++;
    return st;
}

mpq_status mpq_llm_forward(const mpq_llm *m, mpq_llm_state *s, const int32_t *tokens, int n, int skip_planes,
                           float *logits, int first)
{
    if (!m || !s || (!tokens && n) || n < 0 || first < 0 || first > n || skip_planes < 0) return MPQ_ERR_ARG;
    if (n > s->ctx - s->pos) return MPQ_ERR_RANGE;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->c.vocab) return MPQ_ERR_ARG;
    for (int p = 0; p < n; p += s->batch) {
        const int T = n - p < s->batch ? n - p : s->batch;
        const int lo = first - p > 0 ? first - p : 0;
        float *lg = logits && lo < T ? logits + (size_t)(p + lo - first) * m->c.vocab : NULL;
        mpq_status st = mpq__piece(m, s, NULL, tokens + p, T, skip_planes, lg, lo);
        if (st != MPQ_OK) return st;
    }
    return MPQ_OK;
}

mpq_status mpq_llm_decode(const mpq_llm *m, mpq_llm_state *const *seqs, int n, const int32_t *tokens, int skip_planes,
                          mpq_llm_state *work, float *logits)
{
    if (!m || !seqs || !tokens || !work || n < 1 || skip_planes < 0) return MPQ_ERR_ARG;
    if (n > work->batch) return MPQ_ERR_SIZE;
    for (int i = 0; i < n; i++) {
        if (!seqs[i] || tokens[i] < 0 || tokens[i] >= m->c.vocab || seqs[i]->ctx > work->ctx) return MPQ_ERR_ARG;
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return MPQ_ERR_ARG;
    }
    for (int i = 0; i < n; i++)
        if (seqs[i]->pos >= seqs[i]->ctx) return MPQ_ERR_RANGE;
    return mpq__piece(m, work, seqs, tokens, n, skip_planes, logits, 0);
}

/* ========================================================================== */
/* 3. Perplexity                                                              */
/* ========================================================================== */

/* sum exp(z - max z) in double, in id order; *mx: max z. */
static double mpq__sumexp(const float *z, int n, float *mx)
{
    float m = z[0];
    for (int i = 1; i < n; i++) m = z[i] > m ? z[i] : m;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)z[i] - m);
    *mx = m;
    return sum;
}

/* -log softmax(z)[target], in double. */
double mpq__nll(const float *z, int n, int target)
{
    float mx;
    const double sum = mpq__sumexp(z, n, &mx);
    return log(sum) - ((double)z[target] - mx);
}

/* ---- KL divergence to a reference ---- */

#define MPQ__FNV_BASIS 0xcbf29ce484222325ull

static uint64_t mpq__fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* A 32-bit value, little-endian whatever the host. */
static uint64_t mpq__fnv_i32(uint64_t h, int32_t v)
{
    const uint32_t u = (uint32_t)v;
    const uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    return mpq__fnv(h, b, 4);
}

/* Chunks mpq_llm_perplexity runs for n tokens (ctx already resolved). */
static int mpq__ppl_chunks(size_t n, int ctx, int chunks)
{
    const size_t avail = n / (size_t)ctx;
    return (int)(chunks && (size_t)chunks < avail ? (size_t)chunks : (avail > INT32_MAX ? INT32_MAX : avail));
}

uint64_t mpq_kl_tokens_hash(const mpq_tokenizer *t, const int32_t *tokens, size_t n, int ctx, int chunks)
{
    ctx = ctx ? ctx : 512;
    if (!tokens || ctx < 1 || chunks < 0) return 0;
    const int nc = mpq__ppl_chunks(n, ctx, chunks), bos = t && mpq_tokenizer_adds_bos(t) ? mpq_tokenizer_bos(t) : -1;
    uint64_t h = mpq__fnv_i32(mpq__fnv_i32(MPQ__FNV_BASIS, ctx), nc);
    for (int c = 0; c < nc; c++)
        for (int j = 0; j < ctx; j++) h = mpq__fnv_i32(h, j == 0 && bos >= 0 ? bos : tokens[(size_t)c * ctx + j]);
    return h;
}

uint64_t mpq_kl_vocab_hash(const mpq_tokenizer *t)
{
    if (!t) return 0;
    const int n = mpq_tokenizer_size(t);
    uint64_t h = mpq__fnv_i32(MPQ__FNV_BASIS, n);
    h = mpq__fnv_i32(h, mpq_tokenizer_bos(t));
    h = mpq__fnv_i32(h, mpq_tokenizer_eos(t));
    h = mpq__fnv_i32(h, mpq_tokenizer_adds_bos(t));
    h = mpq__fnv_i32(h, (int32_t)mpq_tokenizer_pretok(t));
    for (int32_t id = 0; id < n; id++) {
        size_t len = 0;
        const char *b = mpq_token_bytes(t, id, &len);
        h = mpq__fnv_i32(h, b ? (int32_t)len : -1);
        if (b) h = mpq__fnv(h, b, len);
        h = mpq__fnv_i32(h, mpq_token_is_special(t, id) | mpq_token_is_end(t, id) << 1);
    }
    return h;
}

/* log sum exp z, in double, in id order. */
static double mpq__lse(const float *z, int V)
{
    float mx;
    const double sum = mpq__sumexp(z, V, &mx);
    return (double)mx + log(sum);
}

/* One stored log-probability, computed the same way on both sides. */
static float mpq__klp(const float *z, int id, double lse) { return (float)((double)z[id] - lse); }

/* The probability of every token outside ids[0 .. K-1] (mark: V bytes of
   zero, left so), in double in id order, then to float, within [0, 1]. */
static float mpq__kl_rest(const float *z, int V, double lse, const int32_t *ids, int K, uint8_t *mark)
{
    for (int k = 0; k < K; k++) mark[ids[k]] = 1;
    double rest = 0;
    for (int v = 0; v < V; v++)
        if (!mark[v]) rest += exp((double)z[v] - lse);
    for (int k = 0; k < K; k++) mark[ids[k]] = 0;
    return rest > 1.0 ? 1.0f : (float)rest;
}

/* a before b: the higher logit, then the lower id. */
static int mpq__kl_before(const float *z, int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); }

/* Puts v at position i of the heap ids[0 .. n-1] (root: the least by
   mpq__kl_before) and sifts it down. */
static void mpq__kl_sift_down(const float *z, int32_t *ids, int n, int i, int32_t v)
{
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && mpq__kl_before(z, ids[c], ids[c + 1])) c++;
        if (!mpq__kl_before(z, v, ids[c])) break;
        ids[i] = ids[c], i = c;
    }
    ids[i] = v;
}

/* The K most probable ids of z, most probable first (heap: K ints). */
static void mpq__kl_top(const float *z, int V, int K, int32_t *ids)
{
    int n = 0; /* ids[0 .. n-1]: a heap whose root is the least of them */
    for (int32_t v = 0; v < V; v++) {
        if (n < K) { /* sift up */
            int i = n++;
            while (i > 0 && mpq__kl_before(z, ids[(i - 1) / 2], v)) ids[i] = ids[(i - 1) / 2], i = (i - 1) / 2;
            ids[i] = v;
        } else if (mpq__kl_before(z, v, ids[0])) { /* replaces the root */
            mpq__kl_sift_down(z, ids, n, 0, v);
        }
    }
    for (int end = n - 1; end > 0; end--) { /* heap sort: the least goes last */
        const int32_t v = ids[end];
        ids[end] = ids[0];
        mpq__kl_sift_down(z, ids, end, 0, v);
    }
}

/* Position p of the record from its logits z and the text's next token. */
static void mpq__kl_record(mpq_kl_base *b, long p, const float *z, int32_t next, uint8_t *mark)
{
    const int V = b->vocab, K = b->top;
    int32_t *ids = b->ids + (size_t)p * K;
    float *lp = b->logp + (size_t)p * K;
    const double lse = mpq__lse(z, V);
    mpq__kl_top(z, V, K, ids);
    for (int k = 0; k < K; k++) lp[k] = mpq__klp(z, ids[k], lse);
    b->rest[p] = mpq__kl_rest(z, V, lse, ids, K, mark);
    b->next_logp[p] = mpq__klp(z, next, lse);
}

/* Position p compared: its KLD, same top (0/1) and Delta p. */
static double mpq__kl_compare(const mpq_kl_base *b, long p, const float *z, int32_t next, uint8_t *mark, int *same,
                              double *dp)
{
    const int V = b->vocab, K = b->top;
    const int32_t *ids = b->ids + (size_t)p * K;
    const float *lp = b->logp + (size_t)p * K;
    const double lse = mpq__lse(z, V);
    double kl = 0;
    for (int k = 0; k < K; k++) kl += exp((double)lp[k]) * ((double)lp[k] - (double)mpq__klp(z, ids[k], lse));
    const double pr = b->rest[p];
    if (pr > 0) { /* Q's rest below 1e-30 is taken as 1e-30 */
        const double qr = mpq__kl_rest(z, V, lse, ids, K, mark);
        kl += pr * (log(pr) - log(qr > 1e-30 ? qr : 1e-30));
    }
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++) best = z[v] > z[best] ? v : best;
    *same = best == ids[0];
    *dp = exp((double)mpq__klp(z, next, lse)) - exp((double)b->next_logp[p]);
    return kl;
}

static int mpq__cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile of sorted v[0 .. n-1], linearly interpolated. */
static double mpq__quantile(const double *v, long n, double q)
{
    const double at = q * (double)(n - 1);
    const long i = (long)at;
    return i + 1 < n ? v[i] + (at - (double)i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* The summary of n positions' KLD (sorted here), same-top count and Delta p sums. */
static void mpq__kl_summary(double *kld, long n, long same, double dp, double dp2, double dpa, mpq_kl_result *r)
{
    memset(r, 0, sizeof *r);
    if (n < 1) return;
    double s = 0, s2 = 0;
    for (long i = 0; i < n; i++) s += kld[i], s2 += kld[i] * kld[i];
    r->count = n;
    r->kld = s / (double)n;
    const double var = n > 1 ? (s2 - s * r->kld) / (double)(n - 1) : 0;
    r->kld_err = var > 0 ? sqrt(var / (double)n) : 0;
    qsort(kld, (size_t)n, sizeof *kld, mpq__cmp_double);
    r->median = mpq__quantile(kld, n, 0.5);
    r->p90 = mpq__quantile(kld, n, 0.9);
    r->p99 = mpq__quantile(kld, n, 0.99);
    r->max = kld[n - 1];
    r->same_top = (double)same / (double)n;
    r->same_top_err = n > 1 ? sqrt(r->same_top * (1 - r->same_top) / (double)(n - 1)) : 0;
    r->dp_mean = dp / (double)n;
    r->dp_rms = sqrt(dp2 / (double)n);
    r->dp_abs = dpa / (double)n;
}

void mpq_kl_base_free(mpq_kl_base *b)
{
    if (!b) return;
    free(b->ids), free(b->logp), free(b->rest), free(b->next_logp);
    memset(b, 0, sizeof *b);
}

/* An empty record of these sizes (arrays allocated). */
static mpq_status mpq__kl_alloc(mpq_kl_base *b, int vocab, int ctx, int chunks, int top)
{
    memset(b, 0, sizeof *b);
    b->vocab = vocab, b->ctx = ctx, b->chunks = chunks, b->top = top;
    b->positions = (long)chunks * (long)(ctx - 1 - ctx / 2);
    const size_t P = (size_t)b->positions, PK = P * (size_t)top;
    b->ids = (int32_t *)malloc(sizeof(int32_t) * (PK ? PK : 1));
    b->logp = (float *)malloc(sizeof(float) * (PK ? PK : 1));
    b->rest = (float *)malloc(sizeof(float) * (P ? P : 1));
    b->next_logp = (float *)malloc(sizeof(float) * (P ? P : 1));
    if (b->ids && b->logp && b->rest && b->next_logp) return MPQ_OK;
    mpq_kl_base_free(b);
    return MPQ_ERR_NOMEM;
}

mpq_status mpq_kl_base_check(const mpq_kl_base *b, const mpq_llm *m, const int32_t *tokens, size_t n, int ctx,
                             int chunks, const char *origin, mpq_io_err *err)
{
    if (!b || !m || !tokens || ctx < 0 || chunks < 0) return MPQ_ERR_ARG;
    const char *o = origin ? origin : "KL base";
    ctx = ctx ? ctx : 512;
    const int nc = mpq__ppl_chunks(n, ctx, chunks);
    if (b->vocab != m->c.vocab)
        return mpq__fail(err, MPQ_ERR_ARG, o, "recorded for a vocabulary of %d tokens; this model has %d", b->vocab,
                         m->c.vocab);
    if (b->vocab_hash != mpq_kl_vocab_hash(m->tok))
        return mpq__fail(err, MPQ_ERR_ARG, o, "recorded with another tokenizer than this model's");
    if (b->ctx != ctx)
        return mpq__fail(err, MPQ_ERR_ARG, o, "recorded with chunks of %d tokens; this run uses %d", b->ctx, ctx);
    if (b->chunks != nc)
        return mpq__fail(err, MPQ_ERR_ARG, o, "recorded over %d chunks; this run has %d", b->chunks, nc);
    if (b->tokens_hash != mpq_kl_tokens_hash(m->tok, tokens, n, ctx, chunks))
        return mpq__fail(err, MPQ_ERR_ARG, o, "recorded on another text (the chunks' tokens differ)");
    return MPQ_OK;
}

static void mpq__hex64(uint64_t v, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

static int mpq__unhex64(const char *s, uint64_t *v)
{
    if (!s || strlen(s) != 16) return 0;
    uint64_t r = 0;
    for (int i = 0; i < 16; i++) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        r = r << 4 | (uint64_t)d;
    }
    *v = r;
    return 1;
}

mpq_status mpq_kl_base_write(const mpq_kl_base *b, const char *extra_json, const char *path, mpq_io_err *err)
{
    if (!b || !path || !b->ids || !b->logp || !b->rest || !b->next_logp) return MPQ_ERR_ARG;
    static const char *const keys[] = {"vocab", "ctx", "chunks", "top", "positions"};
    const double vals[] = {b->vocab, b->ctx, b->chunks, b->top, (double)b->positions};
    char *meta = NULL;
    mpq_status st = mpq__meta_json(keys, vals, 5, extra_json, path, &meta, err);
    if (st != MPQ_OK) return st;
    /* the hashes as hexadecimal strings (a JSON number holds 53 bits) */
    cJSON *o = cJSON_Parse(meta);
    free(meta), meta = NULL;
    char h1[17], h2[17];
    mpq__hex64(b->tokens_hash, h1), mpq__hex64(b->vocab_hash, h2);
    if (o && cJSON_AddStringToObject(o, "tokens_hash", h1) && cJSON_AddStringToObject(o, "vocab_hash", h2))
        meta = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!meta) return mpq__fail(err, MPQ_ERR_NOMEM, path, "out of memory");
    mpq_st_writer *w = NULL;
    st = mpq_st_writer_open(path, &w, err);
    if (st == MPQ_OK) st = mpq_st_write_meta(w, "mpq_kl_base", meta, err);
    free(meta);
    const uint64_t pk[2] = {(uint64_t)b->positions, (uint64_t)b->top}, p1[1] = {(uint64_t)b->positions};
    uint8_t *le = NULL; /* the ids, little-endian */
    const size_t nid = (size_t)b->positions * (size_t)b->top;
    if (st == MPQ_OK && !(le = (uint8_t *)malloc(4 * nid + 1)))
        st = mpq__fail(err, MPQ_ERR_NOMEM, path, "out of memory");
    for (size_t i = 0; st == MPQ_OK && i < nid; i++)
        for (int k = 0; k < 4; k++) le[4 * i + (size_t)k] = (uint8_t)((uint32_t)b->ids[i] >> (8 * k));
    if (st == MPQ_OK) st = mpq_st_write(w, "kl.ids", MPQ_DT_I32, 2, pk, le, 4 * nid, err);
    free(le);
    if (st == MPQ_OK) st = mpq_st_write_f32(w, "kl.logp", MPQ_DT_F32, 2, pk, b->logp, err);
    if (st == MPQ_OK) st = mpq_st_write_f32(w, "kl.rest", MPQ_DT_F32, 1, p1, b->rest, err);
    if (st == MPQ_OK) st = mpq_st_write_f32(w, "kl.next_logp", MPQ_DT_F32, 1, p1, b->next_logp, err);
    if (st == MPQ_OK) return mpq_st_writer_close(w, err);
    mpq_st_writer_abort(w);
    return st;
}

/* The values of a read record: every id in the vocabulary and once per
   position, log-probabilities finite, <= 0 and non-increasing, rest in
   [0, 1], and the position's probabilities summing to 1 within 1e-3. */
static mpq_status mpq__kl_values(const mpq_kl_base *b, const char *path, mpq_io_err *err)
{
    int32_t *seen = (int32_t *)malloc(sizeof(int32_t) * (size_t)b->vocab);
    if (!seen) return mpq__fail(err, MPQ_ERR_NOMEM, path, "out of memory");
    for (int v = 0; v < b->vocab; v++) seen[v] = -1;
    mpq_status st = MPQ_OK;
    for (long p = 0; p < b->positions && st == MPQ_OK; p++) {
        const int32_t *ids = b->ids + (size_t)p * b->top;
        const float *lp = b->logp + (size_t)p * b->top;
        double sum = b->rest[p];
        if (!(b->rest[p] >= 0.0f && b->rest[p] <= 1.0f) || !(b->next_logp[p] <= 0.0f) || !isfinite(b->next_logp[p]))
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "position %ld: kl.rest or kl.next_logp out of range", p);
        for (int k = 0; k < b->top && st == MPQ_OK; k++) {
            if (ids[k] < 0 || ids[k] >= b->vocab || seen[ids[k]] == (int32_t)(p % INT32_MAX))
                st = mpq__fail(err, MPQ_ERR_FORMAT, path, "position %ld: token id %d out of range or repeated", p,
                               (int)ids[k]);
            else if (!isfinite(lp[k]) || lp[k] > 0.0f || (k && lp[k] > lp[k - 1]))
                st = mpq__fail(err, MPQ_ERR_FORMAT, path,
                               "position %ld: log-probabilities must be finite, <= 0 and non-increasing", p);
            else
                seen[ids[k]] = (int32_t)(p % INT32_MAX), sum += exp((double)lp[k]);
        }
        if (st == MPQ_OK && fabs(sum - 1.0) > 1e-3)
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "position %ld: the probabilities sum to %g, not 1", p, sum);
    }
    free(seen);
    return st;
}

mpq_status mpq_kl_base_read(const char *path, mpq_kl_base *out, mpq_io_err *err)
{
    if (!path || !out) return MPQ_ERR_ARG;
    mpq_st_file *f = NULL;
    mpq_status st = mpq_st_open(path, &f, err);
    if (st != MPQ_OK) return st;
    const char *meta = mpq_st_meta(f, "mpq_kl_base");
    cJSON *o = meta ? cJSON_Parse(meta) : NULL;
    int fld[4] = {0};
    double positions = -1;
    uint64_t th = 0, vh = 0;
    if (!o) st = mpq__fail(err, MPQ_ERR_FORMAT, path, "no mpq_kl_base metadata: not a KL base file");
    static const char *const keys[4] = {"vocab", "ctx", "chunks", "top"};
    static const int lo[4] = {1, 4, 1, 1};
    for (int k = 0; k < 4 && st == MPQ_OK; k++)
        if (mpq__jint(o, keys[k], &fld[k], lo[k], 1 << 24) != 1)
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "mpq_kl_base: '%s' is missing or out of range", keys[k]);
    if (st == MPQ_OK &&
        (mpq__jnum(o, "positions", &positions) != 1 ||
         positions != (double)fld[2] * (double)(fld[1] - 1 - fld[1] / 2) || fld[3] > fld[0]))
        st = mpq__fail(err, MPQ_ERR_FORMAT, path, "mpq_kl_base: positions, top and the sizes disagree");
    if (st == MPQ_OK &&
        (!mpq__unhex64(mpq__jstr_of(o, "tokens_hash"), &th) || !mpq__unhex64(mpq__jstr_of(o, "vocab_hash"), &vh)))
        st = mpq__fail(err, MPQ_ERR_FORMAT, path, "mpq_kl_base: the hashes must be 16 hexadecimal digits");
    cJSON_Delete(o);
    static const char *const names[4] = {"kl.ids", "kl.logp", "kl.rest", "kl.next_logp"};
    const mpq_st_tensor *t[4] = {0};
    for (int k = 0; k < 4 && st == MPQ_OK; k++) {
        const uint64_t P = (uint64_t)positions, K = (uint64_t)fld[3];
        if (!(t[k] = mpq_st_find(f, names[k])))
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "tensor '%s': not found", names[k]);
        else if (t[k]->dtype != (k ? MPQ_DT_F32 : MPQ_DT_I32) || t[k]->ndim != (k < 2 ? 2 : 1) || t[k]->shape[0] != P ||
                 (k < 2 && t[k]->shape[1] != K))
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "tensor '%s': must be %s [%llu%s]", names[k], k ? "F32" : "I32",
                           (unsigned long long)P, k < 2 ? " x top" : "");
    }
    mpq_kl_base b;
    memset(&b, 0, sizeof b);
    /* the tensors are in the file, so their sizes are bounded by it */
    if (st == MPQ_OK && (st = mpq__kl_alloc(&b, fld[0], fld[1], fld[2], fld[3])) != MPQ_OK)
        st = mpq__fail(err, st, path, "out of memory");
    const size_t PK = (size_t)b.positions * (size_t)b.top;
    if (st == MPQ_OK) st = mpq_st_read(f, t[0], b.ids, 4 * PK, err);
    for (size_t i = 0; st == MPQ_OK && i < PK; i++) { /* stored little-endian */
        const uint8_t *q = (const uint8_t *)&b.ids[i];
        b.ids[i] = (int32_t)((uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24);
    }
    if (st == MPQ_OK) st = mpq_st_read_f32(f, t[1], b.logp, PK, err);
    if (st == MPQ_OK) st = mpq_st_read_f32(f, t[2], b.rest, (size_t)b.positions, err);
    if (st == MPQ_OK) st = mpq_st_read_f32(f, t[3], b.next_logp, (size_t)b.positions, err);
    b.tokens_hash = th, b.vocab_hash = vh;
    if (st == MPQ_OK) st = mpq__kl_values(&b, path, err);
    mpq_st_close(f);
    if (st != MPQ_OK) {
        mpq_kl_base_free(&b);
        return st;
    }
    *out = b;
    return MPQ_OK;
}

mpq_status mpq_llm_perplexity(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_ppl_opts *o,
                              mpq_ppl_result *r)
{
    if (!m || !tokens || !r) return MPQ_ERR_ARG;
    mpq_ppl_opts d;
    memset(&d, 0, sizeof d);
    if (o) d = *o;
    const int ctx = d.ctx ? d.ctx : 512, batch = d.batch ? d.batch : 64;
    if (ctx < 4 || batch < 1 || d.chunks < 0 || d.skip_planes < 0) return MPQ_ERR_ARG;
    if (d.schedule && mpq_pmpd_validate(d.schedule) != MPQ_OK) return MPQ_ERR_ARG;
    if (d.kl_top < 0) return MPQ_ERR_ARG;
    const int chunks = mpq__ppl_chunks(n, ctx, d.chunks);
    if (chunks < 1) return MPQ_ERR_SIZE;
    if (d.kl_ref && mpq_kl_base_check(d.kl_ref, m, tokens, n, ctx, d.chunks, NULL, NULL) != MPQ_OK) return MPQ_ERR_ARG;
    const int first = ctx / 2, V = m->c.vocab, per = ctx - 1 - first;
    mpq_kl_base rec;
    memset(&rec, 0, sizeof rec);
    mpq_status st = MPQ_OK;
    if (d.kl_record) {
        const int top = d.kl_top ? (d.kl_top < V ? d.kl_top : V) : (1024 < V ? 1024 : V);
        if ((st = mpq__kl_alloc(&rec, V, ctx, chunks, top)) != MPQ_OK) return st;
        rec.tokens_hash = mpq_kl_tokens_hash(m->tok, tokens, n, ctx, d.chunks);
        rec.vocab_hash = mpq_kl_vocab_hash(m->tok);
    }
    const long npos = (long)chunks * per;
    double *kld = d.kl_ref ? (double *)malloc(sizeof(double) * (size_t)(npos > 0 ? npos : 1)) : NULL;
    uint8_t *mark = d.kl_ref || d.kl_record ? (uint8_t *)calloc((size_t)V, 1) : NULL;
    mpq_llm_state s;
    memset(&s, 0, sizeof s);
    if ((d.kl_ref && !kld) || ((d.kl_ref || d.kl_record) && !mark)) st = MPQ_ERR_NOMEM;
    if (st == MPQ_OK) st = mpq_llm_state_init(m, ctx, batch, &s);
    float *logits = st == MPQ_OK ? (float *)malloc(sizeof(float) * (size_t)(ctx - first) * V) : NULL;
    int32_t *chunk = st == MPQ_OK ? (int32_t *)malloc(sizeof(int32_t) * (size_t)ctx) : NULL;
    if (st != MPQ_OK || !logits || !chunk) {
        free(logits), free(chunk), free(kld), free(mark);
        mpq_llm_state_free(&s);
        mpq_kl_base_free(&rec);
        return st != MPQ_OK ? st : MPQ_ERR_NOMEM;
    }
    const int bos = mpq_tokenizer_adds_bos(m->tok) ? mpq_tokenizer_bos(m->tok) : -1;
    double nll = 0, nll2 = 0, dp = 0, dp2 = 0, dpa = 0;
    long count = 0, same = 0;
    const double t0 = mpq__now();
    for (int i = 0; i < chunks && st == MPQ_OK; i++) {
        memcpy(chunk, tokens + (size_t)i * ctx, sizeof(int32_t) * (size_t)ctx);
        if (bos >= 0) chunk[0] = bos;
        mpq_llm_state_reset(&s);
        if (!d.schedule) {
            st = mpq_llm_forward(m, &s, chunk, ctx, d.skip_planes, logits, first);
        } else { /* the prompt, then runs of tokens at one skip level */
            st = mpq_llm_forward(m, &s, chunk, first, d.schedule->prefill_skip, NULL, first);
            for (int p = first; st == MPQ_OK && p < ctx;) {
                const int skip = mpq_pmpd_skip_at(d.schedule, p - first);
                int q = p + 1;
                while (q < ctx && mpq_pmpd_skip_at(d.schedule, q - first) == skip) q++;
                st = mpq_llm_forward(m, &s, chunk + p, q - p, skip, logits + (size_t)(p - first) * V, 0);
                p = q;
            }
        }
        for (int j = 0; st == MPQ_OK && j < per; j++) {
            const float *z = logits + (size_t)j * V;
            const int32_t next = chunk[first + j + 1];
            const double v = mpq__nll(z, V, next);
            nll += v, nll2 += v * v;
            if (d.kl_record) mpq__kl_record(&rec, count, z, next, mark);
            if (d.kl_ref) {
                int top1;
                double dpj;
                kld[count] = mpq__kl_compare(d.kl_ref, count, z, next, mark, &top1, &dpj);
                same += top1, dp += dpj, dp2 += dpj * dpj, dpa += fabs(dpj);
            }
            count++;
        }
        if (st == MPQ_OK && d.progress) d.progress(d.user, i + 1, chunks, exp(nll / count), mpq__now() - t0);
    }
    if (st == MPQ_OK) {
        memset(r, 0, sizeof *r);
        r->nll = nll / count;
        r->ppl = exp(r->nll);
        const double var = nll2 / count - r->nll * r->nll;
        r->ppl_err = var > 0 && count > 1 ? r->ppl * sqrt(var / (count - 1)) : 0;
        r->count = count, r->chunks = chunks;
        r->seconds = mpq__now() - t0;
        r->tokens_per_second = (double)chunks * ctx / r->seconds;
        if (d.kl_ref) mpq__kl_summary(kld, count, same, dp, dp2, dpa, &r->kl);
        if (d.kl_record) *d.kl_record = rec, memset(&rec, 0, sizeof rec);
    }
    free(logits), free(chunk), free(kld), free(mark);
    mpq_llm_state_free(&s);
    mpq_kl_base_free(&rec);
    return st;
}

/* ========================================================================== */
/* 4. Generation                                                              */
/* ========================================================================== */

static uint64_t mpq__rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct mpq__cand {
    float p;
    int32_t id;
} mpq__cand;

static int mpq__cmp_cand(const void *a, const void *b)
{
    const mpq__cand *x = (const mpq__cand *)a, *y = (const mpq__cand *)b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The next token from logits (greedy, or sampled); cand: vocab entries. */
static int32_t mpq__pick(const float *z, int V, float temp, float top_p, uint64_t *rng, mpq__cand *cand)
{
    int32_t best = 0;
    for (int i = 1; i < V; i++) best = z[i] > z[best] ? i : best;
    if (!(temp > 0)) return best;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        cand[i].p = (float)exp(((double)z[i] - z[best]) / temp);
        cand[i].id = i;
        sum += cand[i].p;
    }
    qsort(cand, (size_t)V, sizeof *cand, mpq__cmp_cand);
    const double keep = (top_p > 0 && top_p < 1 ? top_p : 1.0) * sum;
    int n = 0;
    double acc = 0;
    while (n < V && (n == 0 || acc < keep)) acc += cand[n++].p;
    const double u = (double)(mpq__rng(rng) >> 11) / 9007199254740992.0 * acc;
    double c = 0;
    for (int i = 0; i < n; i++) {
        c += cand[i].p;
        if (u < c) return cand[i].id;
    }
    return cand[n - 1].id;
}

/* Whether a learned scheduler reads a cache this model has: its layer, and
   keys and values of kv_heads x head_dim. */
static int mpq__pl_fits(const mpq_llm *m, const mpq_pmpd_learned *n)
{
    const int kvd = m->c.kv_heads * m->c.head_dim;
    return n->layer < m->c.layers && n->dk == kvd && n->dv == kvd;
}

mpq_status mpq_llm_generate(const mpq_llm *m, mpq_llm_state *s, const int32_t *prompt, int n, const mpq_gen_opts *o,
                            int32_t *out, int max_out, mpq_gen_result *r)
{
    if (!m || !s || !prompt || n < 1 || !out || max_out < 0 || !r) return MPQ_ERR_ARG;
    mpq_gen_opts d;
    memset(&d, 0, sizeof d);
    if (o) d = *o;
    if (d.schedule && mpq_pmpd_validate(d.schedule) != MPQ_OK) return MPQ_ERR_ARG;
    if (d.skip_planes < 0 || (d.schedule && d.learned)) return MPQ_ERR_ARG;
    const int kvd = m->c.kv_heads * m->c.head_dim;
    if (d.learned && (mpq_pmpd_learned_validate(d.learned) != MPQ_OK || !mpq__pl_fits(m, d.learned)))
        return MPQ_ERR_ARG;
    if (n >= s->ctx) return MPQ_ERR_RANGE;
    const int V = m->c.vocab;
    float *z = (float *)malloc(sizeof(float) * (size_t)V);
    mpq__cand *cand = d.temperature > 0 ? (mpq__cand *)malloc(sizeof(mpq__cand) * (size_t)V) : NULL;
    if (!z || (d.temperature > 0 && !cand)) {
        free(z);
        free(cand);
        return MPQ_ERR_NOMEM;
    }
    memset(r, 0, sizeof *r);
    r->prompt_tokens = n;
    r->learned_class = -1;
    mpq_llm_state_reset(s);
    uint64_t rng = d.seed;
    const int prefill = d.schedule ? d.schedule->prefill_skip : d.learned ? d.learned->prefill_skip : d.skip_planes;
    double t0 = mpq__now();
    mpq_status st = mpq_llm_forward(m, s, prompt, n, prefill, z, n - 1);
    r->prefill_seconds = mpq__now() - t0;
    if (st == MPQ_OK && d.learned) { /* the schedule of this prompt, from its cache */
        const size_t at = (size_t)d.learned->layer * s->ctx * kvd;
        t0 = mpq__now();
        st = mpq_pmpd_learned_predict(d.learned, s->kc + at, s->vc + at, n, &r->schedule, &r->learned_class);
        r->schedule_seconds = mpq__now() - t0;
        d.schedule = &r->schedule;
    } else if (d.schedule) {
        r->schedule = *d.schedule;
    } else {
        r->schedule.prefill_skip = d.skip_planes, r->schedule.nlevels = 1, r->schedule.skip[0] = d.skip_planes;
    }
    const int limit = d.max_tokens > 0 && d.max_tokens < max_out ? d.max_tokens : max_out;
    for (int t = 0; st == MPQ_OK && t < limit; t++) {
        const int32_t tok = mpq__pick(z, V, d.temperature, d.top_p, &rng, cand);
        out[r->tokens++] = tok;
        if (d.on_token && d.on_token(d.user, tok)) break;
        if (mpq_token_is_end(m->tok, tok)) {
            r->ended = 1;
            break;
        }
        if (t + 1 == limit || s->pos >= s->ctx) break;
        const int skip = d.schedule ? mpq_pmpd_skip_at(d.schedule, t) : d.skip_planes;
        t0 = mpq__now();
        st = mpq_llm_forward(m, s, &tok, 1, skip, z, 0);
        const double dt = mpq__now() - t0;
        r->decode_seconds += dt;
        if (skip >= 0 && skip < MPQ_MAX_BITS) r->tokens_at_skip[skip]++, r->seconds_at_skip[skip] += dt;
    }
    free(z);
    free(cand);
    return st;
}

mpq_status mpq_llm_pmpd_sample(const mpq_llm *m, mpq_llm_state *s, const int32_t *tokens, int prompt,
                               const mpq_pmpd_learned *n, double *nll, float *K, float *V)
{
    if (!m || !s || !tokens || !nll) return MPQ_ERR_ARG;
    mpq_status st = mpq_pmpd_learned_validate(n);
    if (st != MPQ_OK) return st;
    const int kvd = m->c.kv_heads * m->c.head_dim, Vv = m->c.vocab;
    if (!mpq__pl_fits(m, n)) return MPQ_ERR_ARG;
    if (prompt < 1 || n->length > (long)s->ctx - prompt) return MPQ_ERR_SIZE;
    const int L = (int)n->length, C = n->classes, total = prompt + L + 1;
    for (int i = 0; i < total; i++)
        if (tokens[i] < 0 || tokens[i] >= Vv) return MPQ_ERR_ARG;
    int32_t *w = (int32_t *)malloc(sizeof(int32_t) * (size_t)total);
    float *z = (float *)malloc(sizeof(float) * (size_t)L * Vv);
    double *hi = (double *)malloc(sizeof(double) * (size_t)L);
    if (!w || !z || !hi) {
        free(w), free(z), free(hi);
        return MPQ_ERR_NOMEM;
    }
    memcpy(w, tokens, sizeof(int32_t) * (size_t)total);
    if (mpq_tokenizer_adds_bos(m->tok) && mpq_tokenizer_bos(m->tok) >= 0) w[0] = mpq_tokenizer_bos(m->tok);
    mpq_llm_state_reset(s);
    st = mpq_llm_forward(m, s, w, prompt, n->prefill_skip, NULL, prompt);
    if (st == MPQ_OK && (K || V)) {
        const size_t at = (size_t)n->layer * s->ctx * kvd, bytes = sizeof(float) * (size_t)prompt * kvd;
        if (K) memcpy(K, s->kc + at, bytes);
        if (V) memcpy(V, s->vc + at, bytes);
    }
    /* every decoded token at the high precision, then each class's low tail
       from its switch point over the cache the high run left before it: the
       latest switch first, so that no tail overwrites a position a later
       class still reads at the high precision */
    if (st == MPQ_OK) st = mpq_llm_forward(m, s, w + prompt, L, n->skip_high, z, 0);
    for (int t = 0; st == MPQ_OK && t < L; t++) hi[t] = mpq__nll(z + (size_t)t * Vv, Vv, w[prompt + t + 1]);
    for (int c = C - 1; st == MPQ_OK && c >= 0; c--) {
        mpq_pmpd_schedule sc;
        if ((st = mpq_pmpd_learned_class_schedule(n, c, &sc)) != MPQ_OK) break;
        const int h = sc.start[1] < L ? (int)sc.start[1] : L;
        double sum = 0;
        for (int t = 0; t < h; t++) sum += hi[t];
        if (h < L) {
            s->pos = prompt + h;
            st = mpq_llm_forward(m, s, w + prompt + h, L - h, n->skip_low, z, 0);
            for (int t = h; st == MPQ_OK && t < L; t++)
                sum += mpq__nll(z + (size_t)(t - h) * Vv, Vv, w[prompt + t + 1]);
        }
        nll[c] = sum / L;
    }
    free(w), free(z), free(hi);
    return st;
}

/* The file of the learned scheduler: its arrays in this order. */
static const char *const mpq__pl_names[7] = {"pmpd.q",  "pmpd.w1",   "pmpd.b1",    "pmpd.w2",
                                             "pmpd.b2", "pmpd.mean", "pmpd.inv_sd"};

static void mpq__pl_arrays(const mpq_pmpd_learned *n, float **a, int *ndim, uint64_t (*dims)[2])
{
    float *v[7] = {n->q, n->w1, n->b1, n->w2, n->b2, n->mean, n->inv_sd};
    const uint64_t d0[7] = {(uint64_t)n->dk,      (uint64_t)n->hidden, (uint64_t)n->hidden, (uint64_t)n->classes,
                            (uint64_t)n->classes, (uint64_t)n->dv,     (uint64_t)n->dv};
    const uint64_t d1[7] = {1, (uint64_t)n->dv, 1, (uint64_t)n->hidden, 1, 1, 1};
    for (int k = 0; k < 7; k++) a[k] = v[k], ndim[k] = k == 1 || k == 3 ? 2 : 1, dims[k][0] = d0[k], dims[k][1] = d1[k];
}

mpq_status mpq_pmpd_learned_write(const mpq_pmpd_learned *n, const char *extra_json, const char *path, mpq_io_err *err)
{
    if (!path) return MPQ_ERR_ARG;
    mpq_status st = mpq_pmpd_learned_validate(n);
    if (st != MPQ_OK) return mpq__fail(err, st, path, "the scheduler is not valid: %s", mpq_status_str(st));
    static const char *const keys[] = {"layer", "prefill_skip", "skip_high", "skip_low", "length"};
    const double vals[] = {n->layer, n->prefill_skip, n->skip_high, n->skip_low, (double)n->length};
    char *meta = NULL;
    if ((st = mpq__meta_json(keys, vals, 5, extra_json, path, &meta, err)) != MPQ_OK) return st;
    mpq_st_writer *w = NULL;
    st = mpq_st_writer_open(path, &w, err);
    if (st == MPQ_OK) st = mpq_st_write_meta(w, "mpq_pmpd_learned", meta, err);
    free(meta);
    float *a[7];
    int nd[7];
    uint64_t dims[7][2];
    mpq__pl_arrays(n, a, nd, dims);
    for (int k = 0; k < 7 && st == MPQ_OK; k++)
        st = mpq_st_write_f32(w, mpq__pl_names[k], MPQ_DT_F32, nd[k], dims[k], a[k], err);
    if (st == MPQ_OK) return mpq_st_writer_close(w, err);
    mpq_st_writer_abort(w);
    return st;
}

mpq_status mpq_pmpd_learned_read(const mpq_llm *m, const char *path, mpq_pmpd_learned *out, mpq_io_err *err)
{
    if (!path || !out) return MPQ_ERR_ARG;
    mpq_st_file *f = NULL;
    mpq_status st = mpq_st_open(path, &f, err);
    if (st != MPQ_OK) return st;
    const char *meta = mpq_st_meta(f, "mpq_pmpd_learned");
    cJSON *o = meta ? cJSON_Parse(meta) : NULL;
    int fld[5] = {0};
    if (!o) st = mpq__fail(err, MPQ_ERR_FORMAT, path, "no mpq_pmpd_learned metadata: not a learned scheduler");
    static const char *const keys[5] = {"layer", "prefill_skip", "skip_high", "skip_low", "length"};
    for (int k = 0; k < 5 && st == MPQ_OK; k++)
        if (mpq__jint(o, keys[k], &fld[k], 0, k == 0 || k == 4 ? 1 << 24 : MPQ_MAX_BITS - 1) != 1)
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "mpq_pmpd_learned: '%s' is missing or out of range", keys[k]);
    cJSON_Delete(o);
    const mpq_st_tensor *t[7] = {0};
    for (int k = 0; k < 7 && st == MPQ_OK; k++)
        if (!(t[k] = mpq_st_find(f, mpq__pl_names[k])))
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "tensor '%s': not found", mpq__pl_names[k]);
    /* the sizes from q, W1 and W2; every shape must agree with them */
    mpq_pmpd_learned n;
    memset(&n, 0, sizeof n);
    if (st == MPQ_OK &&
        (t[0]->ndim != 1 || t[1]->ndim != 2 || t[3]->ndim != 2 || t[0]->shape[0] > 65536 || t[1]->shape[0] > 65536 ||
         t[1]->shape[1] > 65536 || t[3]->shape[0] > 65536))
        st = mpq__fail(err, MPQ_ERR_SIZE, path,
                       "tensors pmpd.q, pmpd.w1, pmpd.w2: not a vector and two matrices of "
                       "at most 65536 x 65536");
    if (st == MPQ_OK &&
        (st = mpq_pmpd_learned_init(&n, (int)t[0]->shape[0], (int)t[1]->shape[1], (int)t[1]->shape[0],
                                    (int)t[3]->shape[0], 0)) != MPQ_OK)
        st = mpq__fail(err, st, path, "sizes dk %llu, dv %llu, hidden %llu, classes %llu: %s",
                       (unsigned long long)t[0]->shape[0], (unsigned long long)t[1]->shape[1],
                       (unsigned long long)t[1]->shape[0], (unsigned long long)t[3]->shape[0],
                       st == MPQ_ERR_SIZE ? "out of range" : mpq_status_str(st));
    float *a[7];
    int nd[7];
    uint64_t dims[7][2];
    if (st == MPQ_OK) mpq__pl_arrays(&n, a, nd, dims);
    for (int k = 0; k < 7 && st == MPQ_OK; k++) {
        if (t[k]->ndim != nd[k] || t[k]->shape[0] != dims[k][0] || (nd[k] == 2 && t[k]->shape[1] != dims[k][1])) {
            st = mpq__fail(err, MPQ_ERR_SIZE, path, "tensor '%s': shape does not match pmpd.q, pmpd.w1, pmpd.w2",
                           mpq__pl_names[k]);
            break;
        }
        st = mpq_st_read_f32(f, t[k], a[k], (size_t)t[k]->numel, err);
    }
    if (st == MPQ_OK) {
        n.layer = fld[0], n.prefill_skip = fld[1], n.skip_high = fld[2], n.skip_low = fld[3], n.length = fld[4];
        if ((st = mpq_pmpd_learned_validate(&n)) != MPQ_OK)
            st = mpq__fail(err, st, path, "%s",
                           st == MPQ_ERR_NONFINITE ? "a value is not finite (or pmpd.inv_sd not positive)"
                                                   : "skip_low must exceed skip_high, and length be at least 1");
    }
    if (st == MPQ_OK && m) {
        const int kvd = m->c.kv_heads * m->c.head_dim;
        if (!mpq__pl_fits(m, &n))
            st = mpq__fail(err, MPQ_ERR_SIZE, path,
                           "layer %d, keys %d and values %d: the model has %d layers of keys and values of %d", n.layer,
                           n.dk, n.dv, m->c.layers, kvd);
    }
    mpq_st_close(f);
    if (st != MPQ_OK) {
        mpq_pmpd_learned_free(&n);
        return st;
    }
    *out = n;
    return MPQ_OK;
}
