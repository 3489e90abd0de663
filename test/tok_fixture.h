/* Vocabularies for tests: the 256 bytes of GPT-2's byte alphabet (spelled
   here from its description, independently of mpq_tokenizer.c), merges,
   special tokens; written as tokenizer.json or as GGUF metadata. */
#ifndef MPQ_TEST_TOK_FIXTURE_H
#define MPQ_TEST_TOK_FIXTURE_H

#include "gguf_writer.h"
#include "mpq_model.h"
#include "synth.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- GPT-2's byte alphabet, written out here ------------------------------ */

static inline int printable(int b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The code point that spells byte b. */
static inline unsigned spell_cp(int b)
{
    if (printable(b)) return (unsigned)b;
    int k = 0;
    for (int c = 0; c < b; c++) k += !printable(c);
    return 256u + (unsigned)k;
}

static inline size_t put_utf8(unsigned cp, char *out)
{
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 63)),
               out[2] = (char)(0x80 | (cp & 63)), 3;
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 63)), out[2] = (char)(0x80 | (cp >> 6 & 63));
    out[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* The spelling of a byte string (NUL-terminated into out). */
static inline void spell(const char *bytes, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += put_utf8(spell_cp((uint8_t)bytes[i]), out + k);
    out[k] = 0;
}

/* ---- a vocabulary: the 256 bytes, merges, special tokens ------------------- */

#define MAXV 1024
typedef struct vocab {
    int n, nmerges;
    char tok[MAXV][48];     /* bytes, NUL-terminated (no NUL inside here) */
    int special[MAXV];      /* 0 normal, 1 control, 2 added (not special) */
    int ml[MAXV], mr[MAXV]; /* merges: left and right token ids */
} vocab;

static inline int vfind(const vocab *v, const char *s)
{
    for (int i = 0; i < v->n; i++)
        if (!v->special[i] && !strcmp(v->tok[i], s)) return i;
    return -1;
}

static inline void vinit(vocab *v)
{
    memset(v, 0, sizeof *v);
    for (int b = 1; b < 256; b++) v->tok[v->n][0] = (char)b, v->n++;
    v->tok[v->n][0] = 0, v->n++; /* byte 0: an empty C string; only used through tok0 below */
}

/* Byte b's token id. */
static inline int byte_id(int b) { return b ? b - 1 : 255; }

static inline int vmerge(vocab *v, int a, int b)
{
    char s[96];
    snprintf(s, sizeof s, "%s%s", v->tok[a], v->tok[b]);
    if (strlen(s) >= sizeof v->tok[0] || vfind(v, s) >= 0) return -1;
    v->ml[v->nmerges] = a, v->mr[v->nmerges] = b, v->nmerges++;
    snprintf(v->tok[v->n], sizeof v->tok[0], "%s", s);
    return v->n++;
}

static inline int vspecial(vocab *v, const char *text, int kind)
{
    snprintf(v->tok[v->n], sizeof v->tok[0], "%s", text);
    v->special[v->n] = kind;
    return v->n++;
}

/* JSON string escaping of UTF-8 text. */
static inline void jesc(const char *s, char *out)
{
    size_t k = 0;
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            out[k++] = '\\', out[k++] = (char)c;
        else if (c < 0x20)
            k += (size_t)sprintf(out + k, "\\u%04x", c);
        else
            out[k++] = (char)c;
    }
    out[k] = 0;
}

/* tokenizer.json for v with a given pre_tokenizer (JSON text), without
   token `omit` (-1: all of them). */
static inline char *vjson_omit(const vocab *v, const char *pre, int ignore_merges, int omit)
{
    size_t cap = 1 << 20, k = 0;
    char *j = malloc(cap), sp[256], esc[512];
    k += (size_t)sprintf(j + k, "{\"version\":\"1.0\",\"added_tokens\":[");
    int first = 1;
    for (int i = 0; i < v->n; i++)
        if (v->special[i] && i != omit) {
            jesc(v->tok[i], esc);
            k += (size_t)sprintf(j + k, "%s{\"id\":%d,\"content\":\"%s\",\"special\":%s}", first ? "" : ",", i, esc,
                                 v->special[i] == 1 ? "true" : "false");
            first = 0;
        }
    k += (size_t)sprintf(j + k,
                         "],\"normalizer\":null,\"pre_tokenizer\":%s,\"post_processor\":null,"
                         "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"ignore_merges\":%s,"
                         "\"vocab\":{",
                         pre, ignore_merges ? "true" : "false");
    for (int i = 0, first_v = 1; i < v->n; i++) {
        if (i == omit) continue;
        if (v->special[i])
            jesc(v->tok[i], esc);
        else if (i == byte_id(0))
            spell("", 1, sp), jesc(sp, esc);
        else
            spell(v->tok[i], strlen(v->tok[i]), sp), jesc(sp, esc);
        k += (size_t)sprintf(j + k, "%s\"%s\":%d", first_v ? "" : ",", esc, i);
        first_v = 0;
    }
    k += (size_t)sprintf(j + k, "},\"merges\":[");
    for (int r = 0; r < v->nmerges; r++) {
        char a[256], b[256];
        spell(v->tok[v->ml[r]], strlen(v->tok[v->ml[r]]), a);
        spell(v->tok[v->mr[r]], strlen(v->tok[v->mr[r]]), b);
        jesc(a, sp);
        jesc(b, esc);
        k += (size_t)sprintf(j + k, "%s\"%s %s\"", r ? "," : "", sp, esc);
    }
    sprintf(j + k, "]}}");
    return j;
}

static inline char *vjson(const vocab *v, const char *pre, int ignore_merges)
{
    return vjson_omit(v, pre, ignore_merges, -1);
}

static const char *const PRE_GPT2 = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";
static const char *const PRE_SMOLLM =
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}]}";

static inline mpq_tokenizer *vtok(const vocab *v, const char *pre, int ignore_merges, const char *config)
{
    char *j = vjson(v, pre, ignore_merges);
    mpq_tokenizer *t = NULL;
    mpq_io_err e;
    cr_assert_eq(mpq_tokenizer_from_json(j, strlen(j), config, "test.json", &t, &e), MPQ_OK, "%s", e.msg);
    free(j);
    return t;
}

/* A vocabulary with random merges over the letters a..e (and spaces). */
static inline void random_vocab(vocab *v, synth_rng *r, int nmerges)
{
    vinit(v);
    const char *seed = "abcde ";
    int have[MAXV], nh = 0;
    for (int i = 0; seed[i]; i++) have[nh++] = byte_id((uint8_t)seed[i]);
    while (v->nmerges < nmerges) {
        const int a = have[synth_int(r, nh)], b = have[synth_int(r, nh)];
        if (strchr(v->tok[b], ' ')) continue; /* spaces only at the start, as GPT-2's pieces have them */
        const int id = vmerge(v, a, b);
        if (id >= 0) have[nh++] = id;
    }
}

/* The vocabulary's tokenizer.ggml.{model, pre, tokens, token_type, merges}
   keys, added to a GGUF being written. */
static inline void vgguf_keys(tg_gguf *g, const vocab *v, const char *model, const char *pre)
{
    const char **tokens = malloc(sizeof(char *) * (size_t)v->n);
    const char **merges = malloc(sizeof(char *) * (size_t)(v->nmerges + 1));
    int32_t *types = malloc(sizeof(int32_t) * (size_t)v->n);
    char(*sp)[256] = malloc(256 * (size_t)v->n), (*ms)[512] = malloc(512 * (size_t)(v->nmerges + 1));
    for (int i = 0; i < v->n; i++) {
        if (v->special[i])
            snprintf(sp[i], 256, "%s", v->tok[i]);
        else if (i == byte_id(0))
            spell("", 1, sp[i]);
        else
            spell(v->tok[i], strlen(v->tok[i]), sp[i]);
        tokens[i] = sp[i];
        types[i] = v->special[i] == 1 ? 3 : v->special[i] == 2 ? 4 : 1;
    }
    for (int r = 0; r < v->nmerges; r++) {
        char a[256], b[256];
        spell(v->tok[v->ml[r]], strlen(v->tok[v->ml[r]]), a);
        spell(v->tok[v->mr[r]], strlen(v->tok[v->mr[r]]), b);
        snprintf(ms[r], 512, "%s %s", a, b);
        merges[r] = ms[r];
    }
    tg_kv_str(g, "tokenizer.ggml.model", model);
    tg_kv_str(g, "tokenizer.ggml.pre", pre);
    tg_kv_arr_str(g, "tokenizer.ggml.tokens", tokens, (size_t)v->n);
    tg_kv_arr_i32(g, "tokenizer.ggml.token_type", types, (size_t)v->n);
    tg_kv_arr_str(g, "tokenizer.ggml.merges", merges, (size_t)v->nmerges);
    free(tokens), free(merges), free(types), free(sp), free(ms);
}

static inline uint8_t *vgguf(const vocab *v, const char *model, const char *pre, size_t *bytes)
{
    tg_gguf g;
    tg_begin(&g);
    vgguf_keys(&g, v, model, pre);
    tg_kv_u32(&g, "tokenizer.ggml.bos_token_id", (uint32_t)(v->n - 2));
    tg_kv_u32(&g, "tokenizer.ggml.eos_token_id", (uint32_t)(v->n - 1));
    tg_kv_bool(&g, "tokenizer.ggml.add_bos_token", 1);
    return tg_finish(&g, bytes);
}


#endif
