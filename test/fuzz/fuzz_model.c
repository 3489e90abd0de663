/* libFuzzer target: the readers of model files and of text. The first
   bytes of the input choose what it is:
     "GGUF"  a GGUF file: every metadata value and every float tensor read,
             the tokenizer built from the metadata, then the whole file
             loaded as a model (mpq_llm_load, through a temporary file) and,
             when it loads, a forward pass over three tokens;
     "{"     a tokenizer.json;
     "STAT"  a statistics file (mpq_calib_read, through a temporary file)
             for a fixed two-layer model of the shape test_calib uses
             (dim 40, 6/2 heads of 8, ffn 72): every value it returns
             must obey the reader's rules;
     "PMPD"  a learned scheduler's file (mpq_pmpd_learned_read), alone and
             for that model: one that reads is valid and predicts a valid
             schedule from a small cache;
     "KLB"   a KL base file (mpq_kl_base_read): one that reads obeys the
             reader's rules and compares against that model's predictions
             without a fault when its sizes fit the model;
     "MKLD"  a measurements file (mpq_measure_read, from memory), its
             description alone and with that model's 14 maps: what reads
             obeys the reader's rules;
     else    text: cut by each pre-tokenizer (the pieces must cover it, in
             order, none empty) and tokenized by two fixed vocabularies.
   Every tokenizer that loads must give a text back byte for byte from its
   tokens. Every rejection must say why. Built and run by test/run.sh
   (clang -fsanitize=fuzzer,address,undefined), seeded with the files that
   test_gguf, test_model and test_calib write. */
#define _POSIX_C_SOURCE 200809L
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_io.h"
#include "mpq_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* text -> tokens -> text must be the identity for valid UTF-8 */
static void round_trip(const mpq_tokenizer *t, const char *text, size_t len)
{
    int32_t *tok;
    size_t n;
    mpq_io_err e;
    e.msg[0] = 0;
    const mpq_status st = mpq_tokenize(t, text, len, 0, &tok, &n, &e);
    if (st != MPQ_OK) {
        if (!e.msg[0]) abort();
        return; /* not UTF-8, a byte without a token, or text NFC would change */
    }
    char *back;
    size_t blen;
    if (mpq_detokenize(t, tok, n, 0, &back, &blen) != MPQ_OK) abort();
    if (blen != len || memcmp(back, text, len) != 0) abort();
    free(back), free(tok);
}

/* The input as a file (path, cap bytes, named by ext); 0 when it cannot be written. */
static int to_file(const uint8_t *data, size_t size, const char *ext, char *path, size_t cap)
{
    snprintf(path, cap, "/tmp/mpq-fuzz-%ld.%s", (long)getpid(), ext);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    const int ok = fwrite(data, 1, size, f) == size;
    fclose(f);
    return ok;
}

static const char sample[] =
    "Hello, world! It's 2024: caf\xc3\xa9 na\xc3\xafve  \t\n\n  x123 \xe6\x97\xa5\xe6\x9c\xac <|im_end|>";

static void gguf_input(const uint8_t *data, size_t size)
{
    mpq_gguf_file *f;
    mpq_io_err e;
    e.msg[0] = 0;
    if (mpq_gguf_open_memory(data, size, &f, &e) != MPQ_OK) {
        if (!e.msg[0]) abort();
        return;
    }
    for (int i = 0; i < mpq_gguf_kv_count(f); i++) {
        const mpq_gguf_kv *kv = mpq_gguf_kv_at(f, i);
        int64_t iv;
        double dv;
        const char *s;
        size_t len;
        for (uint64_t k = 0; k < 3; k++) { /* any type asked for any value: an error, never a bad read */
            (void)mpq_gguf_get_int(f, kv, k, &iv);
            (void)mpq_gguf_get_float(f, kv, k, &dv);
            if (mpq_gguf_get_str(f, kv, k, &s, &len) == MPQ_OK && len && !s) abort();
        }
    }
    for (int i = 0; i < mpq_gguf_count(f); i++) {
        const mpq_gguf_tensor *t = mpq_gguf_at(f, i);
        if (!mpq_gguf_type_is_float(t->type) || t->numel > ((uint64_t)1 << 24)) continue;
        float *x = (float *)malloc(sizeof(float) * (size_t)t->numel + 1);
        if (!x) abort();
        if (mpq_gguf_read_f32(f, t, x, (size_t)t->numel, &e) != MPQ_OK && !e.msg[0]) abort();
        free(x);
    }
    mpq_tokenizer *tok;
    e.msg[0] = 0;
    if (mpq_tokenizer_from_gguf(f, &tok, &e) == MPQ_OK) {
        round_trip(tok, sample, sizeof sample - 1);
        mpq_tokenizer_free(tok);
    } else if (!e.msg[0]) {
        abort();
    }
    mpq_gguf_close(f);

    /* the same bytes as a model file, read into memory and used in place (mapped): the same logits */
    char path[64];
    const int written = to_file(data, size, "gguf", path, sizeof path);
    float *zz[2] = {NULL, NULL};
    int ok[2] = {0, 0};
    size_t nz = 0;
    for (int in_place = 0; in_place < 2; in_place++) {
        mpq_llm *m = NULL;
        mpq_llm_load_opts lo = {in_place};
        e.msg[0] = 0;
        if (written && mpq_llm_load_with(path, &lo, &m, &e) == MPQ_OK) {
            mpq_llm_state s;
            if (mpq_llm_state_init(m, 4, 2, &s) == MPQ_OK) {
                const int32_t ids[3] = {0, m->c.vocab - 1, m->c.vocab / 2};
                nz = 3 * (size_t)m->c.vocab;
                float *z = zz[in_place] = (float *)malloc(sizeof(float) * nz);
                if (!z || mpq_llm_forward(m, &s, ids, 3, 0, z, 0) != MPQ_OK) abort();
                mpq_llm_state_free(&s);
                ok[in_place] = 1;
            }
            mpq_llm_free(m);
        } else if (written && !e.msg[0]) {
            abort();
        }
    }
    if (ok[0] && ok[1] && memcmp(zz[0], zz[1], sizeof(float) * nz) != 0) abort(); /* NaN logits compare by bits */
    free(zz[0]), free(zz[1]);
    remove(path);
}

static void json_input(const uint8_t *data, size_t size)
{
    mpq_tokenizer *t;
    mpq_io_err e;
    e.msg[0] = 0;
    if (mpq_tokenizer_from_json((const char *)data, size, NULL, "fuzz.json", &t, &e) != MPQ_OK) {
        if (!e.msg[0]) abort();
        return;
    }
    round_trip(t, sample, sizeof sample - 1);
    mpq_tokenizer_free(t);
}

/* A byte-level vocabulary: the 256 bytes (GPT-2's printable spelling) and
   a few merges, with the GPT-2 or the SmolLM pre-tokenizer. */
static mpq_tokenizer *fixed_tokenizer(int smollm)
{
    static char json[16384];
    size_t k = 0;
    k += (size_t)snprintf(json + k, sizeof json - k,
                          "{\"added_tokens\":[{\"id\":256,\"content\":\"<|im_end|>\",\"special\":true}],"
                          "\"normalizer\":null,\"pre_tokenizer\":%s,\"decoder\":{\"type\":\"ByteLevel\"},"
                          "\"model\":{\"type\":\"BPE\",\"vocab\":{",
                          smollm ? "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\","
                                   "\"individual_digits\":true},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                                   "\"use_regex\":true}]}"
                                 : "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}");
    for (int b = 0, extra = 0; b < 256; b++) {
        const int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        const int cp = printable ? b : 256 + extra++;
        k += (size_t)snprintf(json + k, sizeof json - k, "\"\\u%04x\":%d,", cp, b);
    }
    /* merges: "Ġ t", "h e", "Ġt he", "i n", "e r" ("Ġ" is U+0120) */
    k += (size_t)snprintf(json + k, sizeof json - k,
                          "\"<|im_end|>\":256,\"\\u0120t\":257,\"he\":258,\"\\u0120the\":259,\"in\":260,\"er\":261},"
                          "\"merges\":[\"\\u0120 t\",\"h e\",\"\\u0120t he\",\"i n\",\"e r\"]}}");
    mpq_tokenizer *t = NULL;
    mpq_io_err e;
    if (mpq_tokenizer_from_json(json, k, NULL, "fixed.json", &t, &e) != MPQ_OK) {
        fprintf(stderr, "fuzz_model: the fixed vocabulary: %s\n", e.msg);
        abort();
    }
    return t;
}

static void text_input(const uint8_t *data, size_t size)
{
    static mpq_tokenizer *fixed[2];
    if (!fixed[0]) fixed[0] = fixed_tokenizer(0), fixed[1] = fixed_tokenizer(1);
    const char *text = (const char *)data;
    for (int pre = MPQ_PRETOK_GPT2; pre <= MPQ_PRETOK_QWEN2; pre++) {
        size_t *ends, n;
        mpq_io_err e;
        e.msg[0] = 0;
        if (mpq_pretokenize((mpq_pretok)pre, text, size, &ends, &n, &e) != MPQ_OK) {
            if (!e.msg[0]) abort();
            continue;
        }
        for (size_t i = 0; i < n; i++)
            if (ends[i] <= (i ? ends[i - 1] : 0) || ends[i] > size) abort();
        if ((n ? ends[n - 1] : 0) != size) abort();
        free(ends);
    }
    for (int k = 0; k < 2; k++) round_trip(fixed[k], text, size);
    int32_t *tok; /* with control tokens matched: every byte still comes back */
    size_t n;
    if (mpq_tokenize(fixed[0], text, size, MPQ_TOK_SPECIAL, &tok, &n, NULL) == MPQ_OK) {
        char *back;
        size_t blen;
        if (mpq_detokenize(fixed[0], tok, n, 0, &back, &blen) != MPQ_OK) abort();
        if (blen != size || memcmp(back, text, size) != 0) abort();
        free(back), free(tok);
    }
}

/* The fixed two-layer model the statistics and scheduler files are read for. */
static const mpq_llm *fixed_model(void)
{
    static mpq_llm m;
    static mpq_llm_layer layers[2];
    if (!m.layer) {
        static const int rows[7] = {48, 16, 16, 40, 72, 72, 40}, cols[7] = {40, 40, 40, 48, 40, 40, 72};
        m.c.layers = 2, m.c.dim = 40, m.c.heads = 6, m.c.kv_heads = 2, m.c.head_dim = 8, m.c.ffn = 72;
        for (int l = 0; l < 2; l++)
            for (int k = 0; k < 7; k++) layers[l].lin[k].rows = rows[k], layers[l].lin[k].cols = cols[k];
        m.layer = layers;
    }
    return &m;
}

static void stats_input(const uint8_t *data, size_t size)
{
    const mpq_llm *mp = fixed_model(), m = *mp;
    char path[64];
    const int ok = to_file(data, size, "stats", path, sizeof path);
    mpq_calib_stats s;
    mpq_io_err e;
    e.msg[0] = 0;
    if (ok && mpq_calib_read(&m, path, &s, &e) == MPQ_OK) {
        if (!s.what) abort();
        for (int i = 0; i < 14; i++) {
            const int r = m.layer[i / 7].lin[i % 7].rows, c = m.layer[i / 7].lin[i % 7].cols;
            for (int j = 0; s.fisher && j < r * c; j++)
                if (!(s.fisher[i][j] >= 0)) abort();
            for (int j = 0; s.xtx_diag && j < c; j++)
                if (!(s.xtx_diag[i][j] >= 0)) abort();
            for (int j = 0; s.xtx && j < c * c; j++) /* a square or a triangle mirrored: finite */
                if (!(s.xtx[i][j] - s.xtx[i][j] == 0.0f)) abort();
            if (s.layer_sens && !(s.layer_sens[i] >= 0 && s.layer_sens[i] <= 1)) abort();
        }
        mpq_calib_stats_free(&s);
    } else if (ok && !e.msg[0]) {
        abort();
    }
    unlink(path);
}

/* A learned scheduler's file, read alone and for the fixed model; one that
   reads must be valid and run on a cache of its sizes. */
static void kl_input(const uint8_t *data, size_t size)
{
    char path[64];
    if (!to_file(data, size, "klb", path, sizeof path)) return;
    mpq_kl_base b;
    mpq_io_err e;
    e.msg[0] = 0;
    if (mpq_kl_base_read(path, &b, &e) != MPQ_OK) {
        if (!e.msg[0]) abort();
        unlink(path);
        return;
    }
    unlink(path);
    if (b.top < 1 || b.top > b.vocab || b.positions != (long)b.chunks * (b.ctx - 1 - b.ctx / 2)) abort();
    for (long p = 0; p < b.positions; p++) {
        if (!(b.rest[p] >= 0.0f && b.rest[p] <= 1.0f)) abort();
        for (int k = 0; k < b.top; k++) {
            const int32_t id = b.ids[(size_t)p * b.top + k];
            const float lp = b.logp[(size_t)p * b.top + k];
            if (id < 0 || id >= b.vocab || !(lp <= 0.0f)) abort();
            if (k && lp > b.logp[(size_t)p * b.top + k - 1]) abort();
        }
    }
    /* the model's own run against the record, when it could be the model's */
    const mpq_llm *m = fixed_model();
    if (b.vocab == m->c.vocab && b.ctx <= 64 && b.chunks <= 4) {
        int32_t tok[4 * 64];
        for (int i = 0; i < b.chunks * b.ctx; i++) tok[i] = i % b.vocab;
        mpq_ppl_opts o;
        memset(&o, 0, sizeof o);
        o.ctx = b.ctx, o.chunks = b.chunks, o.kl_ref = &b;
        mpq_ppl_result r;
        const mpq_status st = mpq_llm_perplexity(m, tok, (size_t)b.chunks * b.ctx, &o, &r);
        if (st != MPQ_OK && st != MPQ_ERR_ARG) abort(); /* ARG: another tokenizer or text */
    }
    mpq_kl_base_free(&b);
}

static void pmpd_input(const uint8_t *data, size_t size)
{
    char path[64];
    const int ok = to_file(data, size, "pmpd", path, sizeof path);
    for (int with = 0; with < 2 && ok; with++) {
        mpq_pmpd_learned n;
        mpq_io_err e;
        e.msg[0] = 0;
        if (mpq_pmpd_learned_read(with ? fixed_model() : NULL, path, &n, &e) != MPQ_OK) {
            if (!e.msg[0]) abort();
            continue;
        }
        if (mpq_pmpd_learned_validate(&n) != MPQ_OK) abort();
        if ((size_t)n.dk * 3 <= 1u << 20 && (size_t)n.dv * 3 <= 1u << 20) {
            float *K = (float *)calloc((size_t)n.dk * 3, sizeof(float)),
                  *V = (float *)calloc((size_t)n.dv * 3, sizeof(float));
            mpq_pmpd_schedule s;
            int c = -1;
            if (!K || !V) abort();
            for (int i = 0; i < n.dk * 3; i++) K[i] = (float)(i % 7) - 3.0f;
            for (int i = 0; i < n.dv * 3; i++) V[i] = (float)(i % 5) - 2.0f;
            const mpq_status st = mpq_pmpd_learned_predict(&n, K, V, 3, &s, &c);
            if (st != MPQ_OK && st != MPQ_ERR_NONFINITE) abort(); /* huge weights can overflow to Inf */
            if (st == MPQ_OK && (c < 0 || c >= n.classes || mpq_pmpd_validate(&s) != MPQ_OK)) abort();
            free(K), free(V);
        }
        mpq_pmpd_learned_free(&n);
    }
    unlink(path);
}

/* A measurements file; what reads must be what the reader promises. */
static void measure_input(const uint8_t *data, size_t size)
{
    mpq_st_file *f = NULL;
    mpq_io_err e;
    if (mpq_st_open_memory(data, size, &f, &e) != MPQ_OK) return;
    char lin[14][96];
    const char *names[14];
    for (int i = 0; i < 14; i++) {
        mpq_llm_linear_name(0, i / 7, i % 7, 0, lin[i], sizeof lin[i]);
        names[i] = lin[i];
    }
    for (int with = 0; with < 2; with++) {
        mpq_measure_info info;
        double kld[14 * 8];
        for (int k = 0; k < 14 * 8; k++) kld[k] = -1;
        e.msg[0] = 0;
        if (mpq_measure_read(f, "fuzz", with ? names : NULL, 14, &info, with ? kld : NULL, &e) != MPQ_OK) {
            if (!e.msg[0]) abort();
            for (int k = 0; k < 14 * 8; k++)
                if (kld[k] != -1) abort(); /* nothing written */
            continue;
        }
        if (info.nbits < 1 || info.nbits > 8) abort();
        for (int k = 0; k < info.nbits; k++) {
            if (info.bits[k] < 1 || info.bits[k] > 8) abort();
            for (int j = 0; j < k; j++)
                if (info.bits[j] == info.bits[k]) abort();
        }
        if (!memchr(info.model, 0, sizeof info.model) || !memchr(info.quantizer, 0, sizeof info.quantizer)) abort();
        for (int k = 0; with && k < 14 * info.nbits; k++)
            if (!(kld[k] >= 0 && kld[k] <= 3.5e38)) abort();
    }
    mpq_st_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= 4 && !memcmp(data, "STAT", 4))
        stats_input(data + 4, size - 4);
    else if (size >= 4 && !memcmp(data, "PMPD", 4))
        pmpd_input(data + 4, size - 4);
    else if (size >= 4 && !memcmp(data, "MKLD", 4))
        measure_input(data + 4, size - 4);
    else if (size >= 3 && !memcmp(data, "KLB", 3))
        kl_input(data + 3, size - 3);
    else if (size >= 4 && !memcmp(data, "GGUF", 4))
        gguf_input(data, size);
    else if (size >= 1 && data[0] == '{')
        json_input(data, size);
    else
        text_input(data, size);
    return 0;
}
