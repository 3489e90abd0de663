/* mpq_model, section 1: the byte-level BPE tokenizer. The four
   pre-tokenizers on adversarial strings against cuts derived by hand from
   their regular expressions (test/interop.py checks them against the
   reference `tokenizers` package as well); the merges against a plain
   reference (lowest rank first, leftmost on ties, recomputed after every
   merge) on random words; exact round trips on random UTF-8; special and
   added tokens; the same tokenizer from GGUF metadata and from
   tokenizer.json, and through mpq_tokenizer_to_json; and every kind of bad
   input. */
#define _XOPEN_SOURCE 700
#include "common.h"
#include "gguf_writer.h"
#include "mpq_model.h"
#include "tok_fixture.h"

#include <stdio.h>

/* ---- pre-tokenizers --------------------------------------------------------- */

/* The pieces of text joined by '|' (pieces never hold '|' here). */
static void cuts(mpq_pretok pre, const char *text, char *out)
{
    size_t *ends, n;
    mpq_io_err e;
    cr_assert_eq(mpq_pretokenize(pre, text, strlen(text), &ends, &n, &e), MPQ_OK, "%s", e.msg);
    size_t k = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (i) out[k++] = '|';
        cr_assert(ends[i] > at, "empty piece");
        memcpy(out + k, text + at, ends[i] - at);
        k += ends[i] - at;
        at = ends[i];
    }
    out[k] = 0;
    cr_assert_eq(at, strlen(text), "the pieces cover the text");
    free(ends);
}

Test(tokenizer, pretokenizers_cut_as_their_rules_say)
{
    static const struct {
        mpq_pretok pre;
        const char *in, *want;
    } cases[] = {
        {MPQ_PRETOK_GPT2, "Hello world", "Hello| world"},
        {MPQ_PRETOK_GPT2, "I'm here, don't", "I|'m| here|,| don|'t"},
        {MPQ_PRETOK_GPT2, "'S 'll 've", "'|S| '|ll| '|ve"},
        {MPQ_PRETOK_GPT2, "a  b", "a| | b"},
        {MPQ_PRETOK_GPT2, "a   b", "a|  | b"},
        {MPQ_PRETOK_GPT2, "a\n\nb", "a|\n|\n|b"},
        {MPQ_PRETOK_GPT2, "x\t\ty", "x|\t|\t|y"},
        {MPQ_PRETOK_GPT2, "x  ", "x|  "},
        {MPQ_PRETOK_GPT2, "  !!", " | !!"},
        {MPQ_PRETOK_GPT2, "123abc abc123 42", "123|abc| abc|123| 42"},
        {MPQ_PRETOK_GPT2, "hello!!! ", "hello|!!!| "},
        {MPQ_PRETOK_GPT2, "na\xc3\xafve caf\xc3\xa9", "na\xc3\xafve| caf\xc3\xa9"},
        {MPQ_PRETOK_GPT2, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"},
        {MPQ_PRETOK_GPT2, "\xf0\x9f\x99\x82\xf0\x9f\x99\x82 ok", "\xf0\x9f\x99\x82\xf0\x9f\x99\x82| ok"},
        {MPQ_PRETOK_GPT2,
         "a\xc2\xa0"
         "b",
         "a|\xc2\xa0|b"},                                             /* no-break space is white space */
        {MPQ_PRETOK_GPT2, "\xd9\xa3\xd9\xa4x", "\xd9\xa3\xd9\xa4|x"}, /* Arabic-Indic digits are numbers */
        {MPQ_PRETOK_GPT2, " \xe2\x85\xa0", " \xe2\x85\xa0"},          /* Roman numeral one: a number (Nl) */
        {MPQ_PRETOK_SMOLLM, "abc 123 def", "abc| |1|2|3| def"},
        {MPQ_PRETOK_SMOLLM, "x1y", "x|1|y"},
        {MPQ_PRETOK_SMOLLM, "3.14", "3|.|1|4"},
        {MPQ_PRETOK_SMOLLM, "ab  12", "ab|  |1|2"},
        {MPQ_PRETOK_LLAMA3, "Hello world", "Hello| world"},
        {MPQ_PRETOK_LLAMA3, "I'M here", "I|'M| here"},
        {MPQ_PRETOK_LLAMA3, "12345 a1b", "123|45| a|1|b"},
        {MPQ_PRETOK_LLAMA3, "hello!!\n\nworld", "hello|!!\n\n|world"},
        {MPQ_PRETOK_LLAMA3, "x\n\n  y", "x|\n\n| | y"},
        {MPQ_PRETOK_LLAMA3, ".hello \thello \nhello", ".hello| |\thello| \n|hello"}, /* \s+(?!\S) leaves the tab */
        {MPQ_PRETOK_LLAMA3, "123.5", "123|.|5"},
        {MPQ_PRETOK_LLAMA3, "don't", "don|'t"},
        {MPQ_PRETOK_LLAMA3, "a  \r\n b", "a|  \r\n| b"},
        {MPQ_PRETOK_QWEN2, "12345 x", "1|2|3|4|5| x"},
        {MPQ_PRETOK_QWEN2, "I'VE", "I|'VE"},
    };
    char got[256];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cuts(cases[k].pre, cases[k].in, got);
        cr_assert_str_eq(got, cases[k].want, "pre-tokenizer %d on \"%s\": got \"%s\"", cases[k].pre, cases[k].in, got);
    }
    size_t *e, n;
    cr_assert_eq(mpq_pretokenize(MPQ_PRETOK_GPT2, "", 0, &e, &n, NULL), MPQ_OK);
    cr_assert_eq(n, 0);
    free(e);
    mpq_io_err err;
    cr_assert_eq(mpq_pretokenize(MPQ_PRETOK_GPT2, "ab\xc3", 3, &e, &n, &err), MPQ_ERR_FORMAT);
    cr_assert(strstr(err.msg, "byte 2"), "%s", err.msg);
    cr_assert_eq(mpq_pretokenize((mpq_pretok)9, "a", 1, &e, &n, NULL), MPQ_ERR_ARG);
}

/* ---- merges ------------------------------------------------------------------ */

/* The plain reference: symbols are bytes; while some neighbouring pair is a
   merge, merge the pair of lowest rank (the leftmost such pair). */
static int naive_bpe(const vocab *v, const char *s, size_t n, int *out)
{
    int sym[256], k = 0;
    for (size_t i = 0; i < n; i++) sym[k++] = byte_id((uint8_t)s[i]);
    for (;;) {
        int best = -1, at = -1;
        for (int i = 0; i + 1 < k; i++)
            for (int r = 0; r < v->nmerges; r++)
                if (v->ml[r] == sym[i] && v->mr[r] == sym[i + 1]) {
                    if (best < 0 || r < best) best = r, at = i;
                    break;
                }
        if (best < 0) break;
        char m[96];
        snprintf(m, sizeof m, "%s%s", v->tok[sym[at]], v->tok[sym[at + 1]]);
        sym[at] = vfind(v, m);
        memmove(sym + at + 1, sym + at + 2, sizeof(int) * (size_t)(k - at - 2));
        k--;
    }
    memcpy(out, sym, sizeof(int) * (size_t)k);
    return k;
}

Test(tokenizer, merges_match_a_plain_reference)
{
    synth_rng r = {2718};
    for (int trial = 0; trial < 4; trial++) {
        vocab *v = malloc(sizeof *v);
        random_vocab(v, &r, 120 + 40 * trial);
        mpq_tokenizer *t = vtok(v, PRE_GPT2, 0, NULL);
        for (int w = 0; w < 400; w++) {
            char word[64];
            const int len = 1 + synth_int(&r, 40);
            int k = 0;
            if (synth_int(&r, 2)) word[k++] = ' ';
            while (k < len) word[k++] = "abcde"[synth_int(&r, 5)];
            word[k] = 0; /* one piece: an optional space and letters */
            int want[256];
            const int nw = naive_bpe(v, word, (size_t)k, want);
            int32_t *got;
            size_t ng;
            cr_assert_eq(mpq_tokenize(t, word, (size_t)k, 0, &got, &ng, NULL), MPQ_OK);
            cr_assert_eq((int)ng, nw, "'%s': %zu tokens, the reference %d", word, ng, nw);
            for (int i = 0; i < nw; i++) cr_assert_eq(got[i], want[i], "'%s' token %d", word, i);
            free(got);
        }
        mpq_tokenizer_free(t);
        /* ignore_merges: a piece that is a token as a whole is that token */
        t = vtok(v, PRE_GPT2, 1, NULL);
        for (int id = 256; id < v->n; id++) { /* every merged token is one piece: letters after a space or not */
            int32_t *got;
            size_t ng;
            cr_assert_eq(mpq_tokenize(t, v->tok[id], strlen(v->tok[id]), 0, &got, &ng, NULL), MPQ_OK);
            cr_assert_eq(ng, 1, "'%s' is a token: ignore_merges gives it whole", v->tok[id]);
            cr_assert_eq(got[0], id);
            free(got);
        }
        mpq_tokenizer_free(t);
        free(v);
    }
}

/* ---- round trips ---------------------------------------------------------------- */

static size_t random_utf8(synth_rng *r, char *out, int ncp)
{
    static const unsigned pool[] = {' ',    ' ',    '\n',   '\t',    '\r',     'a',  'b',   'Z',    '0',
                                    '7',    '\'',   '!',    '.',     0xA0,     0xE9, 0x300, 0x0663, 0x2160,
                                    0x3000, 0x65E5, 0xFF10, 0x1F642, 0x10FFFF, 0x7F, 0x1};
    size_t k = 0;
    for (int i = 0; i < ncp; i++) {
        unsigned cp;
        const int pick = synth_int(r, 4);
        if (pick == 0)
            cp = 0x20 + (unsigned)synth_int(r, 0x5F);
        else if (pick == 1)
            cp = 0x80 + (unsigned)synth_int(r, 0xD800 - 0x80);
        else if (pick == 2)
            cp = 0xE000 + (unsigned)synth_int(r, 0x110000 - 0xE000);
        else
            cp = pool[synth_int(r, (int)(sizeof pool / sizeof pool[0]))];
        k += put_utf8(cp, out + k);
    }
    return k;
}

Test(tokenizer, text_comes_back_byte_for_byte)
{
    synth_rng r = {31};
    vocab *v = malloc(sizeof *v);
    random_vocab(v, &r, 200);
    static const char *const pres[4] = {
        NULL, NULL,
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
        "\"use_regex\":false}]}",
        NULL};
    const char *pre[4] = {PRE_GPT2, PRE_SMOLLM, pres[2], NULL};
    char text[8192];
    for (int p = 0; p < 3; p++) {
        mpq_tokenizer *t = vtok(v, pre[p], p == 2, NULL);
        cr_assert_eq(mpq_tokenizer_pretok(t),
                     p == 0       ? MPQ_PRETOK_GPT2
                         : p == 1 ? MPQ_PRETOK_SMOLLM
                                  : MPQ_PRETOK_LLAMA3);
        for (int it = 0; it < 300; it++) {
            const size_t n = random_utf8(&r, text, 1 + synth_int(&r, it < 290 ? 60 : 1500));
            int32_t *tok;
            size_t nt;
            mpq_io_err e;
            cr_assert_eq(mpq_tokenize(t, text, n, 0, &tok, &nt, &e), MPQ_OK, "%s", e.msg);
            char *back;
            size_t bl;
            cr_assert_eq(mpq_detokenize(t, tok, nt, 0, &back, &bl), MPQ_OK);
            cr_assert(bl == n && !memcmp(back, text, n), "round trip of %zu bytes under pre-tokenizer %d", n, p);
            free(back);
            free(tok);
        }
        /* long runs: one piece of 100000 letters, 100000 spaces, 100000 digits */
        static char run[100001];
        const char fills[3] = {'a', ' ', '7'};
        for (int f = 0; f < 3; f++) {
            memset(run, fills[f], 100000);
            int32_t *tok;
            size_t nt;
            cr_assert_eq(mpq_tokenize(t, run, 100000, 0, &tok, &nt, NULL), MPQ_OK);
            char *back;
            size_t bl;
            cr_assert_eq(mpq_detokenize(t, tok, nt, 0, &back, &bl), MPQ_OK);
            cr_assert(bl == 100000 && !memcmp(back, run, bl));
            free(back), free(tok);
        }
        mpq_tokenizer_free(t);
    }
    free(v);
}

/* ---- special tokens, BOS, end tokens ---------------------------------------------- */

Test(tokenizer, special_and_added_tokens)
{
    vocab *v = malloc(sizeof *v);
    synth_rng r = {5};
    random_vocab(v, &r, 50);
    const int bos = vspecial(v, "<|begin|>", 1), im_s = vspecial(v, "<|im_start|>", 1),
              im_e = vspecial(v, "<|im_end|>", 1);
    const int im = vspecial(v, "<|im", 1), added = vspecial(v, "[x]", 2);
    const char *cfg =
        "{\"add_bos_token\": true, \"bos_token\": \"<|begin|>\", \"eos_token\": {\"content\": \"<|im_end|>\"}}";
    mpq_tokenizer *t = vtok(v, PRE_GPT2, 0, cfg);
    cr_assert_eq(mpq_tokenizer_bos(t), bos);
    cr_assert_eq(mpq_tokenizer_eos(t), im_e);
    cr_assert(mpq_tokenizer_adds_bos(t));
    cr_assert(mpq_token_is_end(t, im_e) && !mpq_token_is_end(t, im_s));
    cr_assert(mpq_token_is_special(t, im_s) && !mpq_token_is_special(t, added) && !mpq_token_is_special(t, 5));
    const char *text = "<|im_start|>a[x]b<|im_end|><|im";
    int32_t *tok;
    size_t n;
    cr_assert_eq(mpq_tokenize(t, text, strlen(text), MPQ_TOK_SPECIAL | MPQ_TOK_BOS, &tok, &n, NULL), MPQ_OK);
    const int32_t want[] = {bos, im_s, byte_id('a'), added, byte_id('b'), im_e, im};
    cr_assert_eq(n, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < n; i++) cr_assert_eq(tok[i], want[i], "token %zu", i);
    char *back;
    size_t bl;
    cr_assert_eq(mpq_detokenize(t, tok, n, 0, &back, &bl), MPQ_OK);
    cr_assert_str_eq(back, "<|begin|><|im_start|>a[x]b<|im_end|><|im");
    free(back);
    cr_assert_eq(mpq_detokenize(t, tok, n, MPQ_TOK_SKIP_SPECIAL, &back, &bl), MPQ_OK);
    cr_assert_str_eq(back, "a[x]b");
    free(back);
    free(tok);
    /* without MPQ_TOK_SPECIAL the control tokens' text is text; added tokens still match */
    cr_assert_eq(mpq_tokenize(t, text, strlen(text), 0, &tok, &n, NULL), MPQ_OK);
    for (size_t i = 0; i < n; i++) cr_assert(!mpq_token_is_special(t, tok[i]));
    int has_added = 0;
    for (size_t i = 0; i < n; i++) has_added |= tok[i] == added;
    cr_assert(has_added);
    cr_assert_eq(mpq_detokenize(t, tok, n, 0, &back, &bl), MPQ_OK);
    cr_assert_str_eq(back, text);
    free(back), free(tok);
    cr_assert_eq(mpq_token_find(t, "<|im_end|>"), im_e);
    cr_assert_eq(mpq_token_find(t, "nope"), -1);
    cr_assert_eq(mpq_detokenize(t, (const int32_t[]){v->n}, 1, 0, &back, &bl), MPQ_ERR_RANGE);
    mpq_tokenizer_free(t);
    free(v);
}

/* ---- from GGUF, and through tokenizer.json ----------------------------------------- */

static void same_tokens(const mpq_tokenizer *a, const mpq_tokenizer *b, synth_rng *r)
{
    char text[4096];
    for (int it = 0; it < 200; it++) {
        const size_t n = random_utf8(r, text, 1 + synth_int(r, 80));
        int32_t *ta, *tb;
        size_t na, nb;
        cr_assert_eq(mpq_tokenize(a, text, n, MPQ_TOK_BOS | MPQ_TOK_SPECIAL, &ta, &na, NULL), MPQ_OK);
        cr_assert_eq(mpq_tokenize(b, text, n, MPQ_TOK_BOS | MPQ_TOK_SPECIAL, &tb, &nb, NULL), MPQ_OK);
        cr_assert(na == nb && !memcmp(ta, tb, 4 * na), "the two tokenizers differ on a text of %zu bytes", n);
        free(ta), free(tb);
    }
}

Test(tokenizer, gguf_json_and_back_agree)
{
    synth_rng r = {8};
    vocab *v = malloc(sizeof *v);
    random_vocab(v, &r, 150);
    vspecial(v, "<|endoftext|>", 1);
    vspecial(v, "<|im_end|>", 1);
    size_t n;
    uint8_t *file = vgguf(v, "gpt2", "smollm", &n);
    mpq_gguf_file *f;
    mpq_io_err e;
    cr_assert_eq(mpq_gguf_open_memory(file, n, &f, &e), MPQ_OK, "%s", e.msg);
    mpq_tokenizer *tg = NULL, *tj = NULL, *tb = NULL;
    cr_assert_eq(mpq_tokenizer_from_gguf(f, &tg, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_tokenizer_pretok(tg), MPQ_PRETOK_SMOLLM);
    cr_assert_eq(mpq_tokenizer_size(tg), v->n);
    cr_assert(mpq_tokenizer_adds_bos(tg) && mpq_tokenizer_bos(tg) == v->n - 2);
    cr_assert(mpq_token_is_end(tg, v->n - 1) && mpq_token_is_end(tg, v->n - 2), "EOS and <|endoftext|> end");
    tj = vtok(v, PRE_SMOLLM, 0,
              "{\"add_bos_token\": true, \"bos_token\": \"<|endoftext|>\", \"eos_token\": \"<|im_end|>\"}");
    same_tokens(tg, tj, &r);
    char *json, *cfg;
    cr_assert_eq(mpq_tokenizer_to_json(tg, &json), MPQ_OK);
    cr_assert_eq(mpq_tokenizer_config_json(tg, &cfg), MPQ_OK);
    cr_assert_eq(mpq_tokenizer_from_json(json, strlen(json), cfg, "round trip", &tb, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_tokenizer_bos(tb), mpq_tokenizer_bos(tg));
    cr_assert_eq(mpq_tokenizer_eos(tb), mpq_tokenizer_eos(tg));
    same_tokens(tg, tb, &r);
    free(json), free(cfg);
    mpq_tokenizer_free(tg), mpq_tokenizer_free(tj), mpq_tokenizer_free(tb);
    mpq_gguf_close(f);
    free(file);
    /* what GGUF files can get wrong */
    static const struct {
        const char *model, *pre, *needle;
    } bad[] = {{"llama", "default", "byte-level BPE ('gpt2') vocabularies only"},
               {"gpt2", "default", "tokenizer.ggml.pre 'default'"},
               {"gpt2", "falcon", "tokenizer.ggml.pre 'falcon'"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        file = vgguf(v, bad[k].model, bad[k].pre, &n);
        cr_assert_eq(mpq_gguf_open_memory(file, n, &f, &e), MPQ_OK);
        tg = NULL;
        cr_assert_eq(mpq_tokenizer_from_gguf(f, &tg, &e), MPQ_ERR_UNSUPPORTED);
        cr_assert_null(tg);
        cr_assert(strstr(e.msg, bad[k].needle), "%s", e.msg);
        mpq_gguf_close(f);
        free(file);
    }
    free(v);
}

/* ---- bad input ------------------------------------------------------------------ */

static void json_rejects(const char *json, mpq_status want, const char *needle)
{
    mpq_tokenizer *t = NULL;
    mpq_io_err e;
    memset(&e, 0, sizeof e);
    cr_assert_eq(mpq_tokenizer_from_json(json, strlen(json), NULL, "bad.json", &t, &e), want, "%s: %s", json, e.msg);
    cr_assert_null(t);
    cr_assert(strstr(e.msg, needle) && strstr(e.msg, "bad.json"), "'%s' lacks '%s'", e.msg, needle);
}

Test(tokenizer, bad_input_is_refused_with_a_reason)
{
    synth_rng r = {3};
    vocab *v = malloc(sizeof *v);
    random_vocab(v, &r, 20);
    char *good = vjson(v, PRE_GPT2, 0);
    mpq_tokenizer *t = vtok(v, PRE_GPT2, 0, NULL);
    /* texts */
    int32_t *tok = NULL;
    size_t n;
    mpq_io_err e;
    static const struct {
        const char *s;
        size_t at;
    } utf8[] = {{"ab\xff", 2}, {"\xc0\xaf", 0}, {"x\xed\xa0\x80", 1}, {"\xe2\x82", 0}, {"ok\xf4\x90\x80\x80", 2}};
    for (size_t k = 0; k < sizeof utf8 / sizeof utf8[0]; k++) {
        cr_assert_eq(mpq_tokenize(t, utf8[k].s, strlen(utf8[k].s), 0, &tok, &n, &e), MPQ_ERR_FORMAT);
        char at[32];
        snprintf(at, sizeof at, "byte %zu", utf8[k].at);
        cr_assert(strstr(e.msg, at), "'%s' lacks '%s'", e.msg, at);
    }
    mpq_tokenizer_free(t);
    /* a vocabulary without the token of one byte refuses texts that hold it */
    char *jw = vjson_omit(v, PRE_GPT2, 0, byte_id(7));
    mpq_tokenizer *tw = NULL;
    cr_assert_eq(mpq_tokenizer_from_json(jw, strlen(jw), NULL, "w", &tw, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_tokenize(tw, "ab", 2, 0, &tok, &n, &e), MPQ_OK);
    free(tok);
    cr_assert_eq(mpq_tokenize(tw,
                              "a\x07"
                              "b",
                              3, 0, &tok, &n, &e),
                 MPQ_ERR_UNSUPPORTED);
    cr_assert(strstr(e.msg, "byte 0x07") && strstr(e.msg, "at byte 1"), "%s", e.msg);
    mpq_tokenizer_free(tw);
    free(jw);
    /* tokenizer.json */
    json_rejects("[]", MPQ_ERR_FORMAT, "not a JSON object");
    json_rejects("{\"model\":{\"type\":\"Unigram\"}}", MPQ_ERR_UNSUPPORTED, "not BPE");
    json_rejects("{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{},\"merges\":[]}}",
                 MPQ_ERR_UNSUPPORTED, "byte_fallback");
    json_rejects("{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", MPQ_ERR_FORMAT, "wrong JSON type");
    json_rejects("{\"normalizer\":{\"type\":\"Lowercase\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
                 MPQ_ERR_UNSUPPORTED, "normalizer");
    json_rejects(
        "{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
        MPQ_ERR_UNSUPPORTED, "pre_tokenizer");
    char *bad = malloc(strlen(good) + 64);
    /* a merge whose result the vocabulary lacks, and one with a part it lacks */
    strcpy(bad, good);
    char *m = strstr(bad, "\"merges\":[");
    cr_assert_not_null(m);
    memcpy(m, "\"merges\":[\"zz q\",", 17);
    memmove(m + 17, strstr(good, "\"merges\":[") + 10, strlen(strstr(good, "\"merges\":[") + 10) + 1);
    json_rejects(bad, MPQ_ERR_FORMAT, "merge 0");
    strcpy(bad, good);
    m = strstr(bad, "\"merges\":[");
    sprintf(m, "\"merges\":[\"ab\"]}}");
    json_rejects(bad, MPQ_ERR_FORMAT, "merge 0 is neither");
    strcpy(bad, good);
    m = strstr(bad, "\"vocab\":{");
    sprintf(m + 9, "\"x\":-1}, \"merges\":[]}}");
    json_rejects(bad, MPQ_ERR_FORMAT, "no valid id");
    strcpy(bad, good);
    m = strstr(bad, "\"vocab\":{");
    sprintf(m + 9, "\"x\":1,\"y\":1}, \"merges\":[]}}");
    json_rejects(bad, MPQ_ERR_FORMAT, "appears twice");
    free(bad);
    free(good);
    free(v);
}
