/* A tiny Llama-family model for tests: random weights with LLM-like
   statistics, written as a Hugging Face directory and as a GGUF file, and
   a float64 reference forward pass written the simple way (no cache, no
   batching, every position recomputed), independently of mpq_model.c.

   Rotary convention of the reference: Hugging Face's, element i paired with
   i + head_dim/2. The GGUF form of a llama model stores the rows of Wq and
   Wk permuted so that those pairs become (2i, 2i+1), as llama.cpp's
   converter writes them; the qwen2 form keeps them. */
#ifndef MPQ_TEST_LLM_FIXTURE_H
#define MPQ_TEST_LLM_FIXTURE_H

#include "gguf_writer.h"
#include "mpq_io.h"
#include "synth.h"
#include "tok_fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TL_MAXL 4

typedef struct tl_model {
    int vocab_rows, dim, layers, heads, kv_heads, head_dim, ffn;
    int qwen, tied, bias;
    double theta, eps;
    int scaling; /* 0 none, 1 linear, 2 llama3 */
    double factor, low, high;
    int orig_ctx;
    vocab *v; /* the tokenizer's vocabulary (vocab_rows >= its size) */
    float *embed, *head, *out_norm;
    float *attn_norm[TL_MAXL], *ffn_norm[TL_MAXL];
    float *w[TL_MAXL][7]; /* HF row order; q, k, v, o, gate, up, down */
    float *b[TL_MAXL][3]; /* q, k, v biases */
} tl_model;

static inline int tl_rows(const tl_model *m, int k)
{
    const int qd = m->heads * m->head_dim, kvd = m->kv_heads * m->head_dim;
    const int r[7] = {qd, kvd, kvd, m->dim, m->ffn, m->ffn, m->dim};
    return r[k];
}

static inline int tl_cols(const tl_model *m, int k)
{
    const int c[7] = {m->dim, m->dim, m->dim, m->heads * m->head_dim, m->dim, m->dim, m->ffn};
    return c[k];
}

static inline float *tl_rand(synth_rng *r, size_t n, double scale)
{
    float *v = (float *)malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) v[i] = (float)(scale * synth_student4(r));
    return v;
}

/* Fills the numbers and the weights; the shape fields must be set. */
static inline void tl_make(tl_model *m, uint64_t seed)
{
    synth_rng r = {seed};
    m->v = (vocab *)malloc(sizeof *m->v);
    random_vocab(m->v, &r, 40);
    vspecial(m->v, "<|endoftext|>", 1);
    vspecial(m->v, "<|im_start|>", 1);
    vspecial(m->v, "<|im_end|>", 1);
    cr_assert(m->vocab_rows >= m->v->n);
    m->embed = tl_rand(&r, (size_t)m->vocab_rows * m->dim, 0.5);
    m->head = m->tied ? m->embed : tl_rand(&r, (size_t)m->vocab_rows * m->dim, 0.1);
    m->out_norm = tl_rand(&r, (size_t)m->dim, 0.2);
    for (int j = 0; j < m->dim; j++) m->out_norm[j] += 1.0f;
    for (int l = 0; l < m->layers; l++) {
        m->attn_norm[l] = tl_rand(&r, (size_t)m->dim, 0.2);
        m->ffn_norm[l] = tl_rand(&r, (size_t)m->dim, 0.2);
        for (int j = 0; j < m->dim; j++) m->attn_norm[l][j] += 1.0f, m->ffn_norm[l][j] += 1.0f;
        for (int k = 0; k < 7; k++) {
            m->w[l][k] = tl_rand(&r, (size_t)tl_rows(m, k) * tl_cols(m, k), 0.6 / sqrt(tl_cols(m, k)));
            /* an outlier input column, as trained models have */
            const int c = synth_int(&r, tl_cols(m, k));
            for (int i = 0; i < tl_rows(m, k); i++) m->w[l][k][(size_t)i * tl_cols(m, k) + c] *= 4.0f;
        }
        for (int k = 0; k < 3; k++) m->b[l][k] = m->bias ? tl_rand(&r, (size_t)tl_rows(m, k), 0.3) : NULL;
    }
}

static inline void tl_free(tl_model *m)
{
    free(m->embed);
    if (!m->tied) free(m->head);
    free(m->out_norm);
    for (int l = 0; l < m->layers; l++) {
        free(m->attn_norm[l]), free(m->ffn_norm[l]);
        for (int k = 0; k < 7; k++) free(m->w[l][k]);
        for (int k = 0; k < 3; k++) free(m->b[l][k]);
    }
    free(m->v);
    memset(m, 0, sizeof *m);
}

/* Rotary frequency i, with the scaling of the config. */
static inline double tl_freq(const tl_model *m, int i)
{
    double f = pow(m->theta, -2.0 * i / m->head_dim);
    if (m->scaling == 1) return f / m->factor;
    if (m->scaling == 2) {
        const double wl = 2 * M_PI / f, lo = m->orig_ctx / m->low, hi = m->orig_ctx / m->high;
        if (wl < hi) return f;
        if (wl > lo) return f / m->factor;
        const double a = (m->orig_ctx / wl - m->low) / (m->high - m->low);
        return (1 - a) * f / m->factor + a * f;
    }
    return f;
}

static inline void tl_rmsnorm(const double *x, const float *w, double eps, int n, double *y)
{
    double ss = 0;
    for (int j = 0; j < n; j++) ss += x[j] * x[j];
    const double r = 1.0 / sqrt(ss / n + eps);
    for (int j = 0; j < n; j++) y[j] = x[j] * r * w[j];
}

static inline void tl_matvec(const float *W, const float *b, const double *x, int rows, int cols, double *y)
{
    for (int i = 0; i < rows; i++) {
        double s = b ? b[i] : 0.0;
        for (int j = 0; j < cols; j++) s += (double)W[(size_t)i * cols + j] * x[j];
        y[i] = s;
    }
}

/* Called with the input of linear map k of layer l at position t. */
typedef void (*tl_observe_fn)(void *user, int l, int k, int t, const double *x, int cols);

/* logits (n x vocab_rows, may be NULL) of tokens tok[0..n) at positions
   0..n-1, hidden (n x dim, may be NULL) the final state after the output
   norm. W replaces the weights of the linear maps when not NULL (W[l][k]);
   obs (may be NULL) sees every linear map's input. */
static inline void tl_reference_ex(const tl_model *m, float *const (*W)[7], const int32_t *tok, int n, double *logits,
                                   double *hidden, tl_observe_fn obs, void *user)
{
    const int D = m->dim, hd = m->head_dim, H = m->heads, KV = m->kv_heads, F = m->ffn;
    const int qd = H * hd, kvd = KV * hd;
    double *x = (double *)calloc((size_t)n * D, sizeof(double)), *h = (double *)malloc(sizeof(double) * D);
    double *q = (double *)malloc(sizeof(double) * (size_t)n * qd),
           *k = (double *)malloc(sizeof(double) * (size_t)n * kvd);
    double *v = (double *)malloc(sizeof(double) * (size_t)n * kvd), *a = (double *)malloc(sizeof(double) * qd);
    double *o = (double *)malloc(sizeof(double) * D), *g = (double *)malloc(sizeof(double) * F);
    double *u = (double *)malloc(sizeof(double) * F), *s = (double *)malloc(sizeof(double) * n);
    double *xn = (double *)malloc(sizeof(double) * (size_t)n * D);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < D; j++) x[(size_t)t * D + j] = m->embed[(size_t)tok[t] * D + j];
    for (int l = 0; l < m->layers; l++) {
        float *const *w = W ? W[l] : m->w[l];
        for (int t = 0; t < n; t++) {
            tl_rmsnorm(x + (size_t)t * D, m->attn_norm[l], m->eps, D, h);
            for (int kk = 0; obs && kk < 3; kk++) obs(user, l, kk, t, h, D);
            tl_matvec(w[0], m->b[l][0], h, qd, D, q + (size_t)t * qd);
            tl_matvec(w[1], m->b[l][1], h, kvd, D, k + (size_t)t * kvd);
            tl_matvec(w[2], m->b[l][2], h, kvd, D, v + (size_t)t * kvd);
            for (int hh = 0; hh < H + KV; hh++) { /* rotate each head of q, then of k: pairs (i, i + hd/2) */
                double *vec =
                    hh < H ? q + (size_t)t * qd + (size_t)hh * hd : k + (size_t)t * kvd + (size_t)(hh - H) * hd;
                for (int i = 0; i < hd / 2; i++) {
                    const double ang = t * tl_freq(m, i), c = cos(ang), sn = sin(ang);
                    const double x0 = vec[i], x1 = vec[i + hd / 2];
                    vec[i] = x0 * c - x1 * sn;
                    vec[i + hd / 2] = x0 * sn + x1 * c;
                }
            }
        }
        for (int t = 0; t < n; t++) {
            for (int hh = 0; hh < H; hh++) {
                const int gkv = hh / (H / KV);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += q[(size_t)t * qd + hh * hd + e] * k[(size_t)j * kvd + gkv * hd + e];
                    s[j] = d / sqrt((double)hd);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j <= t; j++) sum += (s[j] = exp(s[j] - mx));
                for (int e = 0; e < hd; e++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++) acc += s[j] / sum * v[(size_t)j * kvd + gkv * hd + e];
                    a[hh * hd + e] = acc;
                }
            }
            if (obs) obs(user, l, 3, t, a, qd);
            tl_matvec(w[3], NULL, a, D, qd, o);
            for (int j = 0; j < D; j++) xn[(size_t)t * D + j] = x[(size_t)t * D + j] + o[j];
        }
        for (int t = 0; t < n; t++) {
            double *xt = xn + (size_t)t * D;
            tl_rmsnorm(xt, m->ffn_norm[l], m->eps, D, h);
            for (int kk = 4; obs && kk < 6; kk++) obs(user, l, kk, t, h, D);
            tl_matvec(w[4], NULL, h, F, D, g);
            tl_matvec(w[5], NULL, h, F, D, u);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            if (obs) obs(user, l, 6, t, g, F);
            tl_matvec(w[6], NULL, g, D, F, o);
            for (int j = 0; j < D; j++) x[(size_t)t * D + j] = xt[j] + o[j];
        }
    }
    for (int t = 0; t < n; t++) {
        tl_rmsnorm(x + (size_t)t * D, m->out_norm, m->eps, D, h);
        if (hidden) memcpy(hidden + (size_t)t * D, h, sizeof(double) * D);
        if (logits) tl_matvec(m->head, NULL, h, m->vocab_rows, D, logits + (size_t)t * m->vocab_rows);
    }
    free(x), free(h), free(q), free(k), free(v), free(a), free(o), free(g), free(u), free(s), free(xn);
}

static inline void tl_reference(const tl_model *m, float *const (*W)[7], const int32_t *tok, int n, double *logits)
{
    tl_reference_ex(m, W, tok, n, logits, NULL, NULL, NULL);
}

/* ---- the two file forms ------------------------------------------------------ */

static const char *const tl_gguf_lin[7] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                           "ffn_gate", "ffn_up", "ffn_down"};
static const char *const tl_hf_lin[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                         "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

static inline void tl_spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static inline void tl_config_json(const tl_model *m, char *out, size_t cap)
{
    char rs[256] = "null", hd[64] = "";
    /* head_dim only where it is not dim / heads, as checkpoints write it */
    if (m->head_dim * m->heads != m->dim) snprintf(hd, sizeof hd, "\"head_dim\": %d, ", m->head_dim);
    /* a Llama with q, k, v biases says so (Qwen2 always has them) */
    if (m->bias && !m->qwen) snprintf(hd + strlen(hd), sizeof hd - strlen(hd), "\"attention_bias\": true, ");
    if (m->scaling == 1) snprintf(rs, sizeof rs, "{\"type\": \"linear\", \"factor\": %.17g}", m->factor);
    if (m->scaling == 2)
        snprintf(
            rs, sizeof rs,
            "{\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": %.17g, \"high_freq_factor\": %.17g, "
            "\"original_max_position_embeddings\": %d}",
            m->factor, m->low, m->high, m->orig_ctx);
    snprintf(out, cap,
             "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
             "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"max_position_embeddings\": 256, "
             "\"rms_norm_eps\": %.17g, \"rope_theta\": %.17g, \"tie_word_embeddings\": %s, \"vocab_size\": %d, "
             "\"rope_scaling\": %s, %s\"torch_dtype\": \"bfloat16\"}",
             m->qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM", m->dim, m->ffn, m->layers, m->heads, m->kv_heads,
             m->eps, m->theta, m->tied ? "true" : "false", m->vocab_rows, rs, hd);
}

/* dir/config.json, dir/model.safetensors (linear maps as `dt`, the rest F32),
   dir/tokenizer.json, dir/tokenizer_config.json. */
static inline void tl_write_hf(const tl_model *m, const char *dir, mpq_dtype dt)
{
    char p[1024], text[2048], name[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    tl_config_json(m, text, sizeof text);
    tl_spit(p, text);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    char *j = vjson(m->v, PRE_SMOLLM, 0);
    tl_spit(p, j);
    free(j);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    tl_spit(p, "{\"add_bos_token\": false, \"eos_token\": \"<|im_end|>\"}");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    mpq_st_writer *w;
    mpq_io_err e;
    cr_assert_eq(mpq_st_writer_open(p, &w, &e), MPQ_OK, "%s", e.msg);
    const uint64_t es[2] = {(uint64_t)m->vocab_rows, (uint64_t)m->dim}, d1[1] = {(uint64_t)m->dim};
    cr_assert_eq(mpq_st_write_f32(w, "model.embed_tokens.weight", MPQ_DT_F32, 2, es, m->embed, &e), MPQ_OK);
    if (!m->tied) cr_assert_eq(mpq_st_write_f32(w, "lm_head.weight", MPQ_DT_F32, 2, es, m->head, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_f32(w, "model.norm.weight", MPQ_DT_F32, 1, d1, m->out_norm, &e), MPQ_OK);
    for (int l = 0; l < m->layers; l++) {
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        cr_assert_eq(mpq_st_write_f32(w, name, MPQ_DT_F32, 1, d1, m->attn_norm[l], &e), MPQ_OK);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        cr_assert_eq(mpq_st_write_f32(w, name, MPQ_DT_F32, 1, d1, m->ffn_norm[l], &e), MPQ_OK);
        for (int k = 0; k < 7; k++) {
            const uint64_t sh[2] = {(uint64_t)tl_rows(m, k), (uint64_t)tl_cols(m, k)};
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, tl_hf_lin[k]);
            cr_assert_eq(mpq_st_write_f32(w, name, dt, 2, sh, m->w[l][k], &e), MPQ_OK, "%s", e.msg);
            if (k < 3 && m->b[l][k]) {
                snprintf(name, sizeof name, "model.layers.%d.%s.bias", l, tl_hf_lin[k]);
                cr_assert_eq(mpq_st_write_f32(w, name, MPQ_DT_F32, 1, sh, m->b[l][k], &e), MPQ_OK);
            }
        }
    }
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);
}

/* Row r of a head's rows in the GGUF llama order: pairs (i, i + hd/2) become
   rows (2i, 2i + 1); returns the HF row that GGUF row r holds. */
static inline int tl_gguf_row(int r, int hd)
{
    const int head = r / hd, within = r % hd;
    return head * hd + (within % 2 ? hd / 2 : 0) + within / 2;
}

/* rows x cols floats in ggml type `type` (F32, F16, BF16, Q8_0, Q4_1),
   encoded the plain way (Q8_0: d = amax / 127; Q4_1: d = (max - min) / 15,
   m = min; both rounded to nearest), malloc'ed; *bytes their size. */
static inline uint8_t *tl_encode(const float *w, int rows, int cols, uint32_t type, size_t *bytes)
{
    const size_t n = (size_t)rows * cols;
    const size_t b = type == 0 ? 4 * n : type == 1 || type == 30 ? 2 * n : type == 8 ? n / 32 * 34 : n / 32 * 20;
    const size_t step = type <= 1 || type == 30 ? 1 : 32;
    uint8_t *o = (uint8_t *)malloc(b), *p = o;
    for (size_t i = 0; i < n; i += step) {
        if (type == 0) {
            memcpy(p, &w[i], 4), p += 4;
        } else if (type == 1 || type == 30) {
            const uint16_t h = type == 1 ? mpq_f32_to_f16(w[i]) : mpq_f32_to_bf16(w[i]);
            memcpy(p, &h, 2), p += 2;
        } else {
            float lo = w[i], hi = w[i], amax = 0;
            for (int k = 0; k < 32; k++) {
                lo = w[i + k] < lo ? w[i + k] : lo, hi = w[i + k] > hi ? w[i + k] : hi;
                amax = fabsf(w[i + k]) > amax ? fabsf(w[i + k]) : amax;
            }
            const uint16_t d = mpq_f32_to_f16(type == 8 ? amax / 127.0f : (hi - lo) / 15.0f), mn = mpq_f32_to_f16(lo);
            const float df = mpq_f16_to_f32(d), mf = mpq_f16_to_f32(mn);
            memcpy(p, &d, 2), p += 2;
            if (type == 3) memcpy(p, &mn, 2), p += 2;
            if (type == 8) {
                for (int k = 0; k < 32; k++) p[k] = (uint8_t)(int8_t)(df > 0 ? lrintf(w[i + k] / df) : 0);
                p += 32;
            } else {
                int q[32];
                for (int k = 0; k < 32; k++) {
                    const long v = df > 0 ? lrintf((w[i + k] - mf) / df) : 0;
                    q[k] = v < 0 ? 0 : v > 15 ? 15 : (int)v;
                }
                for (int k = 0; k < 16; k++) p[k] = (uint8_t)(q[k] | q[k + 16] << 4);
                p += 16;
            }
        }
    }
    *bytes = b;
    return o;
}

/* The GGUF form: llama metadata, the tokenizer, F32 tensors (q and k rows
   permuted for a llama model), the linear maps' weights in ggml type
   lin_type (see tl_encode; their cols a multiple of 32 for the block
   types). Returns the bytes (free them). */
static inline uint8_t *tl_gguf_typed(const tl_model *m, uint32_t lin_type, size_t *bytes)
{
    const char *arch = m->qwen ? "qwen2" : "llama";
    char key[128], name[128];
    tg_gguf g;
    tg_begin(&g);
    tg_kv_str(&g, "general.architecture", arch);
#define TL_KEY(k) (snprintf(key, sizeof key, "%s.%s", arch, k), key)
    tg_kv_u32(&g, TL_KEY("block_count"), (uint32_t)m->layers);
    tg_kv_u32(&g, TL_KEY("embedding_length"), (uint32_t)m->dim);
    tg_kv_u32(&g, TL_KEY("feed_forward_length"), (uint32_t)m->ffn);
    tg_kv_u32(&g, TL_KEY("attention.head_count"), (uint32_t)m->heads);
    tg_kv_u32(&g, TL_KEY("attention.head_count_kv"), (uint32_t)m->kv_heads);
    tg_kv_u32(&g, TL_KEY("context_length"), 256);
    tg_kv_f32(&g, TL_KEY("rope.freq_base"), (float)m->theta);
    tg_kv_f32(&g, TL_KEY("attention.layer_norm_rms_epsilon"), (float)m->eps);
    if (m->head_dim * m->heads != m->dim) {
        tg_kv_u32(&g, TL_KEY("attention.key_length"), (uint32_t)m->head_dim);
        tg_kv_u32(&g, TL_KEY("attention.value_length"), (uint32_t)m->head_dim);
    }
#undef TL_KEY
    /* the tokenizer, EOS the last token, no BOS */
    const vocab *v = m->v;
    vgguf_keys(&g, v, "gpt2", "smollm");
    tg_kv_u32(&g, "tokenizer.ggml.eos_token_id", (uint32_t)(v->n - 1));
    tg_kv_bool(&g, "tokenizer.ggml.add_bos_token", 0);
    const uint64_t es[2] = {(uint64_t)m->dim, (uint64_t)m->vocab_rows}, d1[1] = {(uint64_t)m->dim};
    tg_tensor(&g, "token_embd.weight", 0, 2, es, m->embed, sizeof(float) * (size_t)m->vocab_rows * m->dim);
    if (!m->tied) tg_tensor(&g, "output.weight", 0, 2, es, m->head, sizeof(float) * (size_t)m->vocab_rows * m->dim);
    tg_tensor(&g, "output_norm.weight", 0, 1, d1, m->out_norm, sizeof(float) * (size_t)m->dim);
    for (int l = 0; l < m->layers; l++) {
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        tg_tensor(&g, name, 0, 1, d1, m->attn_norm[l], sizeof(float) * (size_t)m->dim);
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        tg_tensor(&g, name, 0, 1, d1, m->ffn_norm[l], sizeof(float) * (size_t)m->dim);
        for (int k = 0; k < 7; k++) {
            const int rows = tl_rows(m, k), cols = tl_cols(m, k);
            float *wk = (float *)malloc(sizeof(float) * (size_t)rows * cols);
            float *bk = k < 3 && m->b[l][k] ? (float *)malloc(sizeof(float) * (size_t)rows) : NULL;
            for (int r = 0; r < rows; r++) {
                const int src = !m->qwen && k < 2 ? tl_gguf_row(r, m->head_dim) : r;
                memcpy(wk + (size_t)r * cols, m->w[l][k] + (size_t)src * cols, sizeof(float) * (size_t)cols);
                if (bk) bk[r] = m->b[l][k][src];
            }
            const uint64_t sh[2] = {(uint64_t)cols, (uint64_t)rows}, b1[1] = {(uint64_t)rows};
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, tl_gguf_lin[k]);
            size_t nb;
            uint8_t *enc = tl_encode(wk, rows, cols, lin_type, &nb);
            tg_tensor(&g, name, lin_type, 2, sh, enc, nb);
            free(enc);
            if (bk) {
                snprintf(name, sizeof name, "blk.%d.%s.bias", l, tl_gguf_lin[k]);
                tg_tensor(&g, name, 0, 1, b1, bk, sizeof(float) * (size_t)rows);
            }
            free(wk), free(bk);
        }
    }
    return tg_finish(&g, bytes);
}

static inline uint8_t *tl_gguf(const tl_model *m, size_t *bytes) { return tl_gguf_typed(m, 0, bytes); }

static inline void tl_write_gguf_typed(const tl_model *m, const char *path, uint32_t lin_type)
{
    size_t n;
    uint8_t *b = tl_gguf_typed(m, lin_type, &n);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
    free(b);
}

static inline void tl_write_gguf(const tl_model *m, const char *path)
{
    size_t n;
    uint8_t *b = tl_gguf(m, &n);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
    free(b);
}

#endif
