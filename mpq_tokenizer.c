/* mpq_tokenizer.c - byte-level BPE (see mpq_tokenizer.h).

   A tokenizer is built the same way from either source: the vocabulary's
   spellings and kinds, then the merges as pairs of spellings. Normal tokens
   are spelled in GPT-2's byte alphabet and stored decoded (their bytes);
   special and added tokens are stored as their text. Tokenizing cuts the
   text at special tokens, pre-tokenizes each stretch into pieces (code
   points, classified by mpq_unicode.h) and runs the merges on each piece's
   bytes with a heap ordered by (rank, position). */
#define _XOPEN_SOURCE 700
#include "mpq_priv.h"
#include "mpq_tokenizer.h"
#include "mpq_unicode.h"

#include <cjson/cJSON.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MPQ__TK_NORMAL = 0, MPQ__TK_CONTROL = 1, MPQ__TK_USER = 2, MPQ__TK_UNUSED = 3 };

struct mpq_tokenizer {
    int n;       /* vocabulary size */
    char *bytes; /* token i: bytes[off[i] .. off[i+1]) */
    size_t *off;
    char *spell; /* the vocabulary's own spelling of token i */
    size_t *spell_off;
    uint8_t *kind;         /* MPQ__TK_* */
    uint8_t *end;          /* ends a generation */
    int32_t byte_tok[256]; /* the token of each single byte */
    /* merges: (left, right) -> index into rank order */
    int nmerges;
    int32_t *m_left, *m_right, *m_result;
    uint64_t *mkey; /* open addressing; 0 = empty, else key + 1 */
    int32_t *mval;
    size_t mcap;
    /* the bytes of normal tokens -> id (ignore_merges, lookups by text) */
    int32_t *bhash;
    size_t bcap;
    /* special and added tokens, longest first */
    int32_t *spec;
    int nspec;
    int32_t bos, eos;
    int add_bos, ignore_merges, nfc;
    mpq_pretok pre;
};

/* -------------------------------------------------------------------------- */
/* small helpers                                                              */
/* -------------------------------------------------------------------------- */

static uint64_t mpq__fnv(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mpq__mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static size_t mpq__pow2_above(size_t n)
{
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
}

/* GPT-2's byte alphabet: the printable bytes !..~, ¡..¬ and ®..ÿ stand for
   themselves; the other 68 bytes, in order, for U+0100 onwards. */
static uint32_t mpq__byte_cp(int b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (uint32_t)b;
    int k = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) k++;
    return 0x100u + (uint32_t)k;
}


static int mpq__utf8_valid(const char *s, size_t n)
{
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        const size_t k = mpq__utf8_next((const uint8_t *)s, n, i, &cp);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

static int mpq__in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0])
            hi = mid;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

#define MPQ__NRANGES(t) (sizeof t / sizeof t[0])

static int mpq__is_letter(uint32_t c)
{
    if (c < 128) return (c | 32u) - 'a' < 26u;
    return mpq__in_ranges(mpq__uc_letter, MPQ__NRANGES(mpq__uc_letter), c);
}

static int mpq__is_number(uint32_t c)
{
    if (c < 128) return c - '0' < 10u;
    return mpq__in_ranges(mpq__uc_number, MPQ__NRANGES(mpq__uc_number), c);
}

static int mpq__is_space(uint32_t c)
{
    if (c < 128) return c == ' ' || (c >= 9 && c <= 13);
    return mpq__in_ranges(mpq__uc_space, MPQ__NRANGES(mpq__uc_space), c);
}

static int mpq__is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }
static int mpq__is_other(uint32_t c) { return !mpq__is_space(c) && !mpq__is_letter(c) && !mpq__is_number(c); }

/* -------------------------------------------------------------------------- */
/* pre-tokenizers: the length of the piece that starts at c[i], i < n         */
/* -------------------------------------------------------------------------- */

/* 's|'t|'re|'ve|'m|'ll|'d, case-insensitive when fold: its length or 0. */
static size_t mpq__contraction(const uint32_t *c, size_t i, size_t n, int fold)
{
    if (c[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = c[i + 1], b = i + 2 < n ? c[i + 2] : 0;
    if (fold) {
        if (a < 128 && a - 'A' < 26u) a += 32;
        if (b < 128 && b - 'A' < 26u) b += 32;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ from c[i], a white-space character. Ahead of a non-space a
   run of two or more leaves its last character to the next piece. */
static size_t mpq__space_run(const uint32_t *c, size_t i, size_t n)
{
    size_t k = i;
    while (k < n && mpq__is_space(c[k])) k++;
    if (k == n || k - i == 1) return k - i;
    return k - 1 - i;
}

static size_t mpq__gpt2_piece(const uint32_t *c, size_t i, size_t n)
{
    size_t k = mpq__contraction(c, i, n, 0);
    if (k) return k;
    size_t j = i + (c[i] == ' ' && i + 1 < n); /* " ?" */
    if (mpq__is_letter(c[j])) {
        while (j < n && mpq__is_letter(c[j])) j++;
        return j - i;
    }
    if (mpq__is_number(c[j])) {
        while (j < n && mpq__is_number(c[j])) j++;
        return j - i;
    }
    if (mpq__is_other(c[j])) {
        while (j < n && mpq__is_other(c[j])) j++;
        return j - i;
    }
    return mpq__space_run(c, i, n);
}

static size_t mpq__llama3_piece(const uint32_t *c, size_t i, size_t n, size_t max_digits)
{
    size_t k = mpq__contraction(c, i, n, 1);
    if (k) return k;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    size_t j = i;
    if (!mpq__is_crlf(c[i]) && !mpq__is_letter(c[i]) && !mpq__is_number(c[i]) && i + 1 < n && mpq__is_letter(c[i + 1]))
        j = i + 1;
    if (mpq__is_letter(c[j])) {
        while (j < n && mpq__is_letter(c[j])) j++;
        return j - i;
    }
    /* \p{N}{1,max} */
    if (mpq__is_number(c[i])) {
        j = i;
        while (j < n && j - i < max_digits && mpq__is_number(c[j])) j++;
        return j - i;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    j = i + (c[i] == ' ' && i + 1 < n);
    if (mpq__is_other(c[j])) {
        while (j < n && mpq__is_other(c[j])) j++;
        while (j < n && mpq__is_crlf(c[j])) j++;
        return j - i;
    }
    /* \s*[\r\n]+: the white-space run up to its last line break */
    size_t end = i, last = 0;
    int nl = 0;
    while (end < n && mpq__is_space(c[end])) {
        if (mpq__is_crlf(c[end])) last = end, nl = 1;
        end++;
    }
    if (nl) return last + 1 - i;
    return mpq__space_run(c, i, n);
}

/* -------------------------------------------------------------------------- */
/* building                                                                   */
/* -------------------------------------------------------------------------- */

void mpq_tokenizer_free(mpq_tokenizer *t)
{
    if (!t) return;
    free(t->bytes);
    free(t->off);
    free(t->spell);
    free(t->spell_off);
    free(t->kind);
    free(t->end);
    free(t->m_left);
    free(t->m_right);
    free(t->m_result);
    free(t->mkey);
    free(t->mval);
    free(t->bhash);
    free(t->spec);
    free(t);
}

/* What a source hands to the builder: n spellings with kinds (an absent id
   has kind UNUSED and an empty spelling), merges as spellings. */
typedef struct mpq__tb {
    int n;
    const char **sp;
    size_t *splen;
    uint8_t *kind;
    int nmerges;
    const char **ma, **mb; /* left and right spellings of each merge */
    size_t *mal, *mbl;
    const char *origin;
    mpq_io_err *err;
} mpq__tb;

/* spelling -> id over the vocabulary (build time only) */
typedef struct mpq__spellmap {
    int32_t *slot;
    size_t cap;
} mpq__spellmap;

static int32_t mpq__spell_find(const mpq_tokenizer *t, const mpq__spellmap *m, const char *s, size_t n)
{
    for (size_t h = mpq__fnv(s, n) & (m->cap - 1);; h = (h + 1) & (m->cap - 1)) {
        const int32_t id = m->slot[h];
        if (id < 0) return -1;
        const size_t len = t->spell_off[id + 1] - t->spell_off[id];
        if (len == n && memcmp(t->spell + t->spell_off[id], s, n) == 0) return id;
    }
}

static int32_t mpq__bytes_find(const mpq_tokenizer *t, const char *s, size_t n)
{
    if (!t->bhash) return -1;
    for (size_t h = mpq__fnv(s, n) & (t->bcap - 1);; h = (h + 1) & (t->bcap - 1)) {
        const int32_t id = t->bhash[h];
        if (id < 0) return -1;
        const size_t len = t->off[id + 1] - t->off[id];
        if (len == n && memcmp(t->bytes + t->off[id], s, n) == 0) return id;
    }
}

static int32_t mpq__merge_find(const mpq_tokenizer *t, int32_t a, int32_t b)
{
    const uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (size_t h = mpq__mix(key) & (t->mcap - 1);; h = (h + 1) & (t->mcap - 1)) {
        if (t->mkey[h] == 0) return -1;
        if (t->mkey[h] == key) return t->mval[h];
    }
}

/* Decodes a normal token's spelling from the byte alphabet into out (at
   most len bytes); returns the byte count, or -1 when a character is not
   in the alphabet. */
static long mpq__unspell(const char *s, size_t len, const int16_t *cp_byte, char *out)
{
    long k = 0;
    uint32_t cp;
    for (size_t i = 0; i < len;) {
        const size_t m = mpq__utf8_next((const uint8_t *)s, len, i, &cp);
        if (!m || cp >= 0x144 || cp_byte[cp] < 0) return -1;
        out[k++] = (char)cp_byte[cp];
        i += m;
    }
    return k;
}

static int mpq__cmp_spec_len(const void *a, const void *b, const mpq_tokenizer *t)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const size_t lx = t->off[x + 1] - t->off[x], ly = t->off[y + 1] - t->off[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static mpq_status mpq__build(const mpq__tb *b, mpq_tokenizer *t)
{
    const char *O = b->origin;
    mpq_io_err *err = b->err;
    if (b->n < 256 || b->n > (1 << 26)) return mpq__fail(err, MPQ_ERR_FORMAT, O, "a vocabulary of %d tokens", b->n);
    t->n = b->n;
    size_t total = 0;
    for (int i = 0; i < b->n; i++) total += b->splen[i];
    t->bytes = (char *)malloc(total + 1);
    t->spell = (char *)malloc(total + 1);
    t->off = (size_t *)malloc(sizeof(size_t) * ((size_t)b->n + 1));
    t->spell_off = (size_t *)malloc(sizeof(size_t) * ((size_t)b->n + 1));
    t->kind = (uint8_t *)malloc((size_t)b->n);
    t->end = (uint8_t *)calloc((size_t)b->n, 1);
    mpq__spellmap sm = {NULL, mpq__pow2_above((size_t)b->n)};
    sm.slot = (int32_t *)malloc(sizeof(int32_t) * sm.cap);
    t->bcap = sm.cap;
    t->bhash = (int32_t *)malloc(sizeof(int32_t) * t->bcap);
    mpq_status st = MPQ_OK;
    if (!t->bytes || !t->spell || !t->off || !t->spell_off || !t->kind || !t->end || !sm.slot || !t->bhash) {
        st = mpq__fail(err, MPQ_ERR_NOMEM, O, "out of memory");
        goto done;
    }
    memset(sm.slot, 0xff, sizeof(int32_t) * sm.cap);
    memset(t->bhash, 0xff, sizeof(int32_t) * t->bcap);
    int16_t cp_byte[0x144];
    memset(cp_byte, 0xff, sizeof cp_byte);
    for (int v = 0; v < 256; v++) cp_byte[mpq__byte_cp(v)] = (int16_t)v;
    size_t o = 0, so = 0;
    for (int i = 0; i < b->n; i++) {
        t->off[i] = o, t->spell_off[i] = so;
        t->kind[i] = b->kind[i];
        memcpy(t->spell + so, b->sp[i], b->splen[i]);
        so += b->splen[i];
        if (b->kind[i] == MPQ__TK_NORMAL) {
            const long k = mpq__unspell(b->sp[i], b->splen[i], cp_byte, t->bytes + o);
            if (k <= 0) {
                st = mpq__fail(err, MPQ_ERR_FORMAT, O,
                               "token %d '%.60s' is not spelled in the byte alphabet of "
                               "byte-level BPE (a SentencePiece vocabulary? mpq does not read those)",
                               i, b->sp[i]);
                goto done;
            }
            o += (size_t)k;
        } else if (b->kind[i] != MPQ__TK_UNUSED) {
            if (b->splen[i] == 0 || !mpq__utf8_valid(b->sp[i], b->splen[i])) {
                st = mpq__fail(err, MPQ_ERR_FORMAT, O, "special token %d is empty or not UTF-8", i);
                goto done;
            }
            memcpy(t->bytes + o, b->sp[i], b->splen[i]);
            o += b->splen[i];
        }
    }
    t->off[b->n] = o, t->spell_off[b->n] = so;
    /* spellings and the bytes of normal tokens, first id wins */
    for (int i = 0; i < b->n; i++) {
        const size_t sl = t->spell_off[i + 1] - t->spell_off[i];
        if (t->kind[i] == MPQ__TK_UNUSED) continue;
        if (mpq__spell_find(t, &sm, t->spell + t->spell_off[i], sl) < 0) {
            size_t h = mpq__fnv(t->spell + t->spell_off[i], sl) & (sm.cap - 1);
            while (sm.slot[h] >= 0) h = (h + 1) & (sm.cap - 1);
            sm.slot[h] = i;
        }
        if (t->kind[i] == MPQ__TK_NORMAL && mpq__bytes_find(t, t->bytes + t->off[i], t->off[i + 1] - t->off[i]) < 0) {
            size_t h = mpq__fnv(t->bytes + t->off[i], t->off[i + 1] - t->off[i]) & (t->bcap - 1);
            while (t->bhash[h] >= 0) h = (h + 1) & (t->bcap - 1);
            t->bhash[h] = i;
        }
    }
    /* vocabularies may lack bytes that UTF-8 never uses (0xC0, 0xF5..) or
       that the training text never held: texts with those are refused */
    int nbytes = 0;
    for (int v = 0; v < 256; v++) {
        const char c = (char)v;
        t->byte_tok[v] = mpq__bytes_find(t, &c, 1);
        nbytes += t->byte_tok[v] >= 0;
    }
    if (nbytes < 128) {
        st = mpq__fail(err, MPQ_ERR_FORMAT, O, "tokens for only %d of the 256 bytes: not a byte-level vocabulary",
                       nbytes);
        goto done;
    }
    /* merges */
    t->nmerges = b->nmerges;
    t->mcap = mpq__pow2_above((size_t)b->nmerges);
    t->mkey = (uint64_t *)calloc(t->mcap, sizeof(uint64_t));
    t->mval = (int32_t *)malloc(sizeof(int32_t) * t->mcap);
    t->m_left = (int32_t *)malloc(sizeof(int32_t) * ((size_t)b->nmerges + 1));
    t->m_right = (int32_t *)malloc(sizeof(int32_t) * ((size_t)b->nmerges + 1));
    t->m_result = (int32_t *)malloc(sizeof(int32_t) * ((size_t)b->nmerges + 1));
    char *cat = NULL;
    size_t catcap = 0;
    if (!t->mkey || !t->mval || !t->m_left || !t->m_right || !t->m_result) {
        st = mpq__fail(err, MPQ_ERR_NOMEM, O, "out of memory");
        goto done;
    }
    for (int r = 0; r < b->nmerges; r++) {
        const int32_t a = mpq__spell_find(t, &sm, b->ma[r], b->mal[r]),
                      c = mpq__spell_find(t, &sm, b->mb[r], b->mbl[r]);
        if (a < 0 || c < 0 || t->kind[a] != MPQ__TK_NORMAL || t->kind[c] != MPQ__TK_NORMAL) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "merge %d '%.40s %.40s': a part is not a normal token", r, b->ma[r],
                           b->mb[r]);
            break;
        }
        const size_t len = b->mal[r] + b->mbl[r];
        if (len > catcap) {
            char *nc = (char *)realloc(cat, len);
            if (!nc) {
                st = mpq__fail(err, MPQ_ERR_NOMEM, O, "out of memory");
                break;
            }
            cat = nc, catcap = len;
        }
        memcpy(cat, b->ma[r], b->mal[r]);
        memcpy(cat + b->mal[r], b->mb[r], b->mbl[r]);
        const int32_t res = mpq__spell_find(t, &sm, cat, len);
        if (res < 0 || t->kind[res] != MPQ__TK_NORMAL) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "merge %d '%.40s %.40s' makes a token the vocabulary lacks", r,
                           b->ma[r], b->mb[r]);
            break;
        }
        t->m_left[r] = a, t->m_right[r] = c, t->m_result[r] = res;
        if (mpq__merge_find(t, a, c) >= 0) continue; /* a repeated merge keeps its first rank */
        const uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)c) + 1;
        size_t h = mpq__mix(key) & (t->mcap - 1);
        while (t->mkey[h]) h = (h + 1) & (t->mcap - 1);
        t->mkey[h] = key, t->mval[h] = r;
    }
    free(cat);
    if (st != MPQ_OK) goto done;
    /* special and added tokens, matched longest first */
    t->spec = (int32_t *)malloc(sizeof(int32_t) * ((size_t)b->n + 1));
    if (!t->spec) {
        st = mpq__fail(err, MPQ_ERR_NOMEM, O, "out of memory");
        goto done;
    }
    for (int i = 0; i < b->n; i++)
        if (t->kind[i] == MPQ__TK_CONTROL || t->kind[i] == MPQ__TK_USER) t->spec[t->nspec++] = i;
    for (int i = 1; i < t->nspec; i++) /* insertion sort: a few hundred at most */
        for (int j = i; j > 0 && mpq__cmp_spec_len(&t->spec[j], &t->spec[j - 1], t) < 0; j--) {
            const int32_t x = t->spec[j];
            t->spec[j] = t->spec[j - 1], t->spec[j - 1] = x;
        }
    /* tokens that end a generation, by their text */
    static const char *const ends[] = {"<|im_end|>", "<|eot_id|>",    "<|end_of_text|>", "<|endoftext|>",
                                       "<|end|>",    "<end_of_turn>", "<|eom_id|>"};
    for (int i = 0; i < t->nspec; i++) {
        const int32_t id = t->spec[i];
        if (t->kind[id] != MPQ__TK_CONTROL) continue;
        for (size_t e = 0; e < sizeof ends / sizeof ends[0]; e++)
            if (t->off[id + 1] - t->off[id] == strlen(ends[e]) &&
                !memcmp(t->bytes + t->off[id], ends[e], strlen(ends[e])))
                t->end[id] = 1;
    }
done:
    free(sm.slot);
    return st;
}

static mpq_tokenizer *mpq__tok_new(void)
{
    mpq_tokenizer *t = (mpq_tokenizer *)calloc(1, sizeof *t);
    if (t) t->bos = t->eos = -1;
    return t;
}

static void mpq__tb_free(mpq__tb *b)
{
    free((void *)b->sp);
    free(b->splen);
    free(b->kind);
    free((void *)b->ma);
    free((void *)b->mb);
    free(b->mal);
    free(b->mbl);
}

static mpq_status mpq__tb_alloc(mpq__tb *b, int n, int nmerges)
{
    b->n = n, b->nmerges = nmerges;
    b->sp = (const char **)calloc((size_t)n + 1, sizeof(char *));
    b->splen = (size_t *)calloc((size_t)n + 1, sizeof(size_t));
    b->kind = (uint8_t *)malloc((size_t)n + 1);
    b->ma = (const char **)calloc((size_t)nmerges + 1, sizeof(char *));
    b->mb = (const char **)calloc((size_t)nmerges + 1, sizeof(char *));
    b->mal = (size_t *)calloc((size_t)nmerges + 1, sizeof(size_t));
    b->mbl = (size_t *)calloc((size_t)nmerges + 1, sizeof(size_t));
    if (!b->sp || !b->splen || !b->kind || !b->ma || !b->mb || !b->mal || !b->mbl)
        return mpq__fail(b->err, MPQ_ERR_NOMEM, b->origin, "out of memory");
    memset(b->kind, MPQ__TK_UNUSED, (size_t)n);
    for (int i = 0; i < n; i++) b->sp[i] = "";
    return MPQ_OK;
}

/* "a b" -> the two spellings (split at the one space: spellings in the
   byte alphabet have none). */
static int mpq__split_merge(const char *s, size_t n, const char **a, size_t *al, const char **b, size_t *bl)
{
    const char *sp = (const char *)memchr(s, ' ', n);
    if (!sp || sp == s || sp == s + n - 1 || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1))) return 0;
    *a = s, *al = (size_t)(sp - s), *b = sp + 1, *bl = (size_t)(s + n - sp - 1);
    return 1;
}

/* -------------------------------------------------------------------------- */
/* from GGUF                                                                  */
/* -------------------------------------------------------------------------- */

static const mpq_gguf_kv *mpq__gkv(const mpq_gguf_file *f, const char *key, mpq_gguf_vtype type, int array)
{
    const mpq_gguf_kv *kv = mpq_gguf_kv_find(f, key);
    if (!kv) return NULL;
    if (array ? (kv->type != MPQ_GGUF_ARRAY || kv->elem != type) : kv->type != type) return NULL;
    return kv;
}

static int32_t mpq__gid(const mpq_gguf_file *f, const char *key, int n)
{
    const mpq_gguf_kv *kv = mpq_gguf_kv_find(f, key);
    int64_t v;
    if (!kv || kv->type == MPQ_GGUF_ARRAY || mpq_gguf_get_int(f, kv, 0, &v) != MPQ_OK || v < 0 || v >= n) return -1;
    return (int32_t)v;
}

mpq_status mpq_tokenizer_from_gguf(const mpq_gguf_file *f, mpq_tokenizer **out, mpq_io_err *err)
{
    if (!f || !out) return mpq__fail(err, MPQ_ERR_ARG, "(tokenizer)", "NULL argument");
    const char *O = mpq_gguf_path(f);
    const mpq_gguf_kv *model = mpq__gkv(f, "tokenizer.ggml.model", MPQ_GGUF_STRING, 0);
    const char *s;
    size_t len;
    if (!model || mpq_gguf_get_str(f, model, 0, &s, &len) != MPQ_OK)
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "no tokenizer (tokenizer.ggml.model is missing or not a string)");
    if (len != 4 || memcmp(s, "gpt2", 4) != 0)
        return mpq__fail(err, MPQ_ERR_UNSUPPORTED, O,
                         "tokenizer.ggml.model '%.*s': mpq reads byte-level BPE ('gpt2') "
                         "vocabularies only",
                         (int)(len < 40 ? len : 40), s);
    mpq_pretok pre = 0;
    int ignore_merges = 0, add_bos = 0;
    const mpq_gguf_kv *prek = mpq__gkv(f, "tokenizer.ggml.pre", MPQ_GGUF_STRING, 0);
    char pname[64] = "(none)";
    if (prek && mpq_gguf_get_str(f, prek, 0, &s, &len) == MPQ_OK && len < sizeof pname) {
        memcpy(pname, s, len);
        pname[len] = 0;
        static const struct {
            const char *name;
            mpq_pretok pre;
        } names[] = {{"gpt-2", MPQ_PRETOK_GPT2},    {"phi-2", MPQ_PRETOK_GPT2},
                     {"smollm", MPQ_PRETOK_SMOLLM}, {"starcoder", MPQ_PRETOK_SMOLLM},
                     {"refact", MPQ_PRETOK_SMOLLM}, {"llama-bpe", MPQ_PRETOK_LLAMA3},
                     {"llama3", MPQ_PRETOK_LLAMA3}, {"llama-v3", MPQ_PRETOK_LLAMA3},
                     {"qwen2", MPQ_PRETOK_QWEN2},   {"deepseek-r1-qwen", MPQ_PRETOK_QWEN2}};
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
            if (strcmp(pname, names[k].name) == 0) pre = names[k].pre;
    }
    if (!pre)
        return mpq__fail(err, MPQ_ERR_UNSUPPORTED, O,
                         "tokenizer.ggml.pre '%s': mpq knows gpt-2, smollm, starcoder, "
                         "llama-bpe and qwen2",
                         pname);
    if (pre == MPQ_PRETOK_LLAMA3) ignore_merges = 1, add_bos = 1;
    const mpq_gguf_kv *toks = mpq__gkv(f, "tokenizer.ggml.tokens", MPQ_GGUF_STRING, 1);
    const mpq_gguf_kv *types = mpq_gguf_kv_find(f, "tokenizer.ggml.token_type");
    const mpq_gguf_kv *merges = mpq__gkv(f, "tokenizer.ggml.merges", MPQ_GGUF_STRING, 1);
    if (!toks || !merges)
        return mpq__fail(err, MPQ_ERR_FORMAT, O,
                         "tokenizer.ggml.tokens or .merges is missing or "
                         "not an array of strings");
    if (toks->count > (1u << 26) || merges->count > (1u << 26))
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "%llu tokens and %llu merges: too many",
                         (unsigned long long)toks->count, (unsigned long long)merges->count);
    if (types && (types->type != MPQ_GGUF_ARRAY || types->count != toks->count))
        return mpq__fail(err, MPQ_ERR_FORMAT, O, "tokenizer.ggml.token_type is not an array with one type per token");
    mpq__tb b;
    memset(&b, 0, sizeof b);
    b.origin = O, b.err = err;
    mpq_tokenizer *t = mpq__tok_new();
    mpq_status st =
        t ? mpq__tb_alloc(&b, (int)toks->count, (int)merges->count) : mpq__fail(err, MPQ_ERR_NOMEM, O, "out of memory");
    for (int i = 0; st == MPQ_OK && i < b.n; i++) {
        int64_t ty = 1;
        if (mpq_gguf_get_str(f, toks, (uint64_t)i, &b.sp[i], &b.splen[i]) != MPQ_OK ||
            (types && mpq_gguf_get_int(f, types, (uint64_t)i, &ty) != MPQ_OK)) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "token %d: unreadable text or type", i);
            break;
        }
        /* ggml token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte */
        b.kind[i] = ty == 1 ? MPQ__TK_NORMAL : ty == 3 ? MPQ__TK_CONTROL : ty == 4 ? MPQ__TK_USER : MPQ__TK_UNUSED;
        if (ty == 6) st = mpq__fail(err, MPQ_ERR_UNSUPPORTED, O, "token %d is a byte token (SentencePiece)", i);
    }
    for (int r = 0; st == MPQ_OK && r < b.nmerges; r++) {
        if (mpq_gguf_get_str(f, merges, (uint64_t)r, &s, &len) != MPQ_OK ||
            !mpq__split_merge(s, len, &b.ma[r], &b.mal[r], &b.mb[r], &b.mbl[r]))
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "merge %d is not two spellings separated by a space", r);
    }
    if (st == MPQ_OK) st = mpq__build(&b, t);
    if (st == MPQ_OK) {
        t->pre = pre, t->ignore_merges = ignore_merges;
        t->bos = mpq__gid(f, "tokenizer.ggml.bos_token_id", t->n);
        t->eos = mpq__gid(f, "tokenizer.ggml.eos_token_id", t->n);
        const mpq_gguf_kv *ab = mpq__gkv(f, "tokenizer.ggml.add_bos_token", MPQ_GGUF_BOOL, 0);
        int64_t v;
        if (ab && mpq_gguf_get_int(f, ab, 0, &v) == MPQ_OK) add_bos = (int)v;
        t->add_bos = add_bos && t->bos >= 0;
        static const char *const endkeys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                              "tokenizer.ggml.eom_token_id"};
        for (size_t k = 0; k < 3; k++) {
            const int32_t id = mpq__gid(f, endkeys[k], t->n);
            if (id >= 0) t->end[id] = 1;
        }
    }
    mpq__tb_free(&b);
    if (st != MPQ_OK) {
        mpq_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MPQ_OK;
}

/* -------------------------------------------------------------------------- */
/* from tokenizer.json                                                        */
/* -------------------------------------------------------------------------- */

/* The exact regular expressions HF's tokenizer.json holds for these rules. */
static const char *const mpq__re_llama3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                          "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                          "\\s+(?!\\S)|\\s+";
static const char *const mpq__re_qwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

static int mpq__jtype(const cJSON *o, const char *type)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) && strcmp(t->valuestring, type) == 0;
}

static int mpq__jtrue(const cJSON *o, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* ByteLevel with use_regex as given and no prefix space. */
static int mpq__jbytelevel(const cJSON *o, int use_regex)
{
    if (!mpq__jtype(o, "ByteLevel") || mpq__jtrue(o, "add_prefix_space")) return 0;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "use_regex");
    return use_regex ? !cJSON_IsFalse(u) : cJSON_IsFalse(u);
}

static mpq_pretok mpq__jpretok(const cJSON *p)
{
    if (mpq__jbytelevel(p, 1)) return MPQ_PRETOK_GPT2;
    if (!mpq__jtype(p, "Sequence")) return 0;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    if (!cJSON_IsArray(seq) || cJSON_GetArraySize(seq) != 2) return 0;
    const cJSON *a = cJSON_GetArrayItem(seq, 0), *b = cJSON_GetArrayItem(seq, 1);
    if (mpq__jtype(a, "Digits") && mpq__jtrue(a, "individual_digits") && mpq__jbytelevel(b, 1))
        return MPQ_PRETOK_SMOLLM;
    if (!mpq__jtype(a, "Split") || !mpq__jbytelevel(b, 0)) return 0;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(a, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(a, "behavior");
    if (!cJSON_IsString(re) || !cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0 ||
        mpq__jtrue(a, "invert"))
        return 0;
    if (strcmp(re->valuestring, mpq__re_llama3) == 0) return MPQ_PRETOK_LLAMA3;
    if (strcmp(re->valuestring, mpq__re_qwen2) == 0) return MPQ_PRETOK_QWEN2;
    return 0;
}

/* The first special token of a TemplateProcessing's "single" template
   (searching Sequence processors), or NULL. */
static const char *mpq__jbos(const cJSON *pp)
{
    if (!pp) return NULL;
    if (mpq__jtype(pp, "Sequence")) {
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(pp, "processors");
        for (const cJSON *e = cJSON_IsArray(ps) ? ps->child : NULL; e; e = e->next) {
            const char *b = mpq__jbos(e);
            if (b) return b;
        }
        return NULL;
    }
    if (!mpq__jtype(pp, "TemplateProcessing")) return NULL;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    const cJSON *sp = first ? cJSON_GetObjectItemCaseSensitive(first, "SpecialToken") : NULL;
    const cJSON *id = sp ? cJSON_GetObjectItemCaseSensitive(sp, "id") : NULL;
    return cJSON_IsString(id) ? id->valuestring : NULL;
}

/* A token named in tokenizer_config.json: a string, or {"content": ...}. */
static const char *mpq__jtoken_text(const cJSON *v)
{
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "content") : NULL;
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static int mpq__json_id(const cJSON *v, int32_t *id)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (double)(1 << 26) ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return 0;
    *id = (int32_t)v->valuedouble;
    return 1;
}

mpq_status mpq_tokenizer_from_json(const char *json, size_t len, const char *tokenizer_config, const char *origin,
                                   mpq_tokenizer **out, mpq_io_err *err)
{
    const char *O = origin ? origin : "tokenizer.json";
    if (!json || !out) return mpq__fail(err, MPQ_ERR_ARG, O, "NULL argument");
    cJSON *root = cJSON_ParseWithLength(json, len), *cfg = NULL;
    mpq__tb b;
    memset(&b, 0, sizeof b);
    b.origin = O, b.err = err;
    mpq_tokenizer *t = mpq__tok_new();
    mpq_status st = MPQ_OK;
    if (!t) {
        st = mpq__fail(err, MPQ_ERR_NOMEM, O, "out of memory");
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        st = mpq__fail(err, MPQ_ERR_FORMAT, O, "not a JSON object");
        goto done;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!mpq__jtype(model, "BPE")) {
        st = mpq__fail(err, MPQ_ERR_UNSUPPORTED, O, "model.type is not BPE (mpq reads byte-level BPE tokenizers)");
        goto done;
    }
    if (mpq__jtrue(model, "byte_fallback")) {
        st = mpq__fail(err, MPQ_ERR_UNSUPPORTED, O,
                       "a BPE with byte_fallback (SentencePiece style, as Llama 2 and "
                       "Mistral 7B): mpq reads byte-level BPE only");
        goto done;
    }
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges) || (added && !cJSON_IsArray(added))) {
        st = mpq__fail(err, MPQ_ERR_FORMAT, O, "model.vocab, model.merges or added_tokens has the wrong JSON type");
        goto done;
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm) && !mpq__jtype(norm, "NFC")) {
        st = mpq__fail(err, MPQ_ERR_UNSUPPORTED, O, "a normalizer other than NFC");
        goto done;
    }
    t->nfc = norm && mpq__jtype(norm, "NFC");
    t->pre = mpq__jpretok(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    if (!t->pre) {
        st = mpq__fail(err, MPQ_ERR_UNSUPPORTED, O, "pre_tokenizer is none of GPT-2's, SmolLM's, Llama 3's or Qwen2's");
        goto done;
    }
    t->ignore_merges = mpq__jtrue(model, "ignore_merges");
    /* the size: one past the largest id */
    int32_t n = 0, id = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!mpq__json_id(e, &id)) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "vocab entry '%.60s' has no valid id", e->string);
            goto done;
        }
        n = id + 1 > n ? id + 1 : n;
    }
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
        if (!mpq__json_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &id) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "content"))) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "an added token without a valid id or content");
            goto done;
        }
        n = id + 1 > n ? id + 1 : n;
    }
    if ((st = mpq__tb_alloc(&b, n, cJSON_GetArraySize(merges))) != MPQ_OK) goto done;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        mpq__json_id(e, &id);
        if (b.kind[id] != MPQ__TK_UNUSED) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "id %d appears twice in the vocab", (int)id);
            goto done;
        }
        b.sp[id] = e->string, b.splen[id] = strlen(e->string), b.kind[id] = MPQ__TK_NORMAL;
    }
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
        mpq__json_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &id);
        const char *c = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        b.sp[id] = c, b.splen[id] = strlen(c);
        b.kind[id] = mpq__jtrue(e, "special") ? MPQ__TK_CONTROL : MPQ__TK_USER;
    }
    int r = 0;
    for (const cJSON *e = merges->child; e; e = e->next, r++) {
        int ok = 0;
        if (cJSON_IsString(e)) {
            ok = mpq__split_merge(e->valuestring, strlen(e->valuestring), &b.ma[r], &b.mal[r], &b.mb[r], &b.mbl[r]);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            b.ma[r] = e->child->valuestring, b.mal[r] = strlen(b.ma[r]);
            b.mb[r] = e->child->next->valuestring, b.mbl[r] = strlen(b.mb[r]);
            ok = b.mal[r] && b.mbl[r];
        }
        if (!ok) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "merge %d is neither \"a b\" nor [\"a\", \"b\"]", r);
            goto done;
        }
    }
    if ((st = mpq__build(&b, t)) != MPQ_OK) goto done;
    /* BOS from the post-processor's template; tokenizer_config can override */
    const char *bos = mpq__jbos(cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    const char *eos = NULL;
    int add_bos = bos != NULL;
    if (tokenizer_config) {
        cfg = cJSON_Parse(tokenizer_config);
        if (!cJSON_IsObject(cfg)) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, O, "tokenizer_config.json is not a JSON object");
            goto done;
        }
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
        if (cJSON_IsBool(ab)) add_bos = cJSON_IsTrue(ab);
        const char *cb = mpq__jtoken_text(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
        if (cb) bos = cb;
        eos = mpq__jtoken_text(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
    }
    for (int i = 0; i < t->nspec; i++) {
        const int32_t s = t->spec[i];
        const size_t sl = t->off[s + 1] - t->off[s];
        if (bos && sl == strlen(bos) && !memcmp(t->bytes + t->off[s], bos, sl) && t->bos < 0) t->bos = s;
        if (eos && sl == strlen(eos) && !memcmp(t->bytes + t->off[s], eos, sl) && t->eos < 0) t->eos = s;
    }
    t->add_bos = add_bos && t->bos >= 0;
    if (t->eos >= 0) t->end[t->eos] = 1;
done:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    mpq__tb_free(&b);
    if (st != MPQ_OK) {
        mpq_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MPQ_OK;
}

/* -------------------------------------------------------------------------- */
/* queries                                                                    */
/* -------------------------------------------------------------------------- */

int mpq_tokenizer_size(const mpq_tokenizer *t) { return t ? t->n : 0; }
mpq_pretok mpq_tokenizer_pretok(const mpq_tokenizer *t) { return t ? t->pre : (mpq_pretok)0; }
int32_t mpq_tokenizer_bos(const mpq_tokenizer *t) { return t ? t->bos : -1; }
int32_t mpq_tokenizer_eos(const mpq_tokenizer *t) { return t ? t->eos : -1; }
int mpq_tokenizer_adds_bos(const mpq_tokenizer *t) { return t ? t->add_bos : 0; }

int mpq_token_is_end(const mpq_tokenizer *t, int32_t id) { return t && id >= 0 && id < t->n && t->end[id]; }

int mpq_token_is_special(const mpq_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n && t->kind[id] == MPQ__TK_CONTROL;
}

const char *mpq_token_bytes(const mpq_tokenizer *t, int32_t id, size_t *len)
{
    if (!t || id < 0 || id >= t->n) return NULL;
    if (len) *len = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

int32_t mpq_token_find(const mpq_tokenizer *t, const char *text)
{
    if (!t || !text) return -1;
    const size_t n = strlen(text);
    for (int i = 0; i < t->n; i++)
        if (t->spell_off[i + 1] - t->spell_off[i] == n && memcmp(t->spell + t->spell_off[i], text, n) == 0) return i;
    return -1;
}

/* -------------------------------------------------------------------------- */
/* tokenizing                                                                 */
/* -------------------------------------------------------------------------- */

typedef struct mpq__tokbuf {
    int32_t *v;
    size_t n, cap;
} mpq__tokbuf;

static int mpq__push(mpq__tokbuf *o, int32_t id)
{
    if (o->n == o->cap) {
        const size_t cap = o->cap ? 2 * o->cap : 1024;
        int32_t *v = (int32_t *)realloc(o->v, sizeof(int32_t) * cap);
        if (!v) return 0;
        o->v = v, o->cap = cap;
    }
    o->v[o->n++] = id;
    return 1;
}

/* Work space of the merges, reused across pieces. */
typedef struct mpq__bpe {
    int32_t *id; /* token of symbol k (-1: merged away) */
    int *next, *prev;
    uint64_t *heap; /* (rank << 32) | position */
    size_t cap, hn;
} mpq__bpe;

static void mpq__heap_push(mpq__bpe *w, uint64_t v)
{
    size_t i = w->hn++;
    while (i) {
        const size_t p = (i - 1) / 2;
        if (w->heap[p] <= v) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = v;
}

static uint64_t mpq__heap_pop(mpq__bpe *w)
{
    const uint64_t top = w->heap[0], v = w->heap[--w->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->hn) break;
        if (c + 1 < w->hn && w->heap[c + 1] < w->heap[c]) c++;
        if (v <= w->heap[c]) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->hn) w->heap[i] = v;
    return top;
}

/* A heap entry for the pair starting at symbol k, if that pair merges. */
static void mpq__pair(const mpq_tokenizer *t, mpq__bpe *w, int k)
{
    const int j = w->next[k];
    if (j < 0) return;
    const int32_t r = mpq__merge_find(t, w->id[k], w->id[j]);
    if (r >= 0) mpq__heap_push(w, ((uint64_t)(uint32_t)r << 32) | (uint32_t)k);
}

/* Runs the merges on one piece. 1: done; 0: out of memory; -1 - k: byte k
   has no token. */
static int mpq__bpe_piece(const mpq_tokenizer *t, mpq__bpe *w, const uint8_t *s, size_t n, mpq__tokbuf *o)
{
    if (t->ignore_merges) {
        const int32_t whole = mpq__bytes_find(t, (const char *)s, n);
        if (whole >= 0) return mpq__push(o, whole);
    }
    if (n > w->cap) {
        const size_t cap = n > 2 * w->cap ? n : 2 * w->cap;
        int32_t *id = (int32_t *)realloc(w->id, sizeof(int32_t) * cap);
        if (id) w->id = id;
        int *nx = (int *)realloc(w->next, sizeof(int) * cap);
        if (nx) w->next = nx;
        int *pv = (int *)realloc(w->prev, sizeof(int) * cap);
        if (pv) w->prev = pv;
        uint64_t *h = (uint64_t *)realloc(w->heap, sizeof(uint64_t) * 2 * cap);
        if (h) w->heap = h;
        if (!id || !nx || !pv || !h) return 0;
        w->cap = cap;
    }
    for (size_t k = 0; k < n; k++) {
        if ((w->id[k] = t->byte_tok[s[k]]) < 0) return -1 - (int)k;
        w->prev[k] = (int)k - 1;
        w->next[k] = k + 1 < n ? (int)k + 1 : -1;
    }
    w->hn = 0;
    for (size_t k = 0; k + 1 < n; k++) mpq__pair(t, w, (int)k);
    /* every merge adds at most two entries and removes one symbol: the heap
       never holds more than 2n */
    while (w->hn) {
        const uint64_t e = mpq__heap_pop(w);
        const int32_t r = (int32_t)(e >> 32);
        const int k = (int)(uint32_t)e, j = w->id[k] >= 0 ? w->next[k] : -1;
        if (j < 0 || w->id[k] != t->m_left[r] || w->id[j] != t->m_right[r]) continue; /* stale */
        w->id[k] = t->m_result[r];
        w->id[j] = -1;
        w->next[k] = w->next[j];
        if (w->next[j] >= 0) w->prev[w->next[j]] = k;
        if (w->prev[k] >= 0) mpq__pair(t, w, w->prev[k]);
        mpq__pair(t, w, k);
    }
    for (int k = 0; k >= 0; k = w->next[k])
        if (!mpq__push(o, w->id[k])) return 0;
    return 1;
}

/* The length of the piece at cp[i] (i < n) under pre. */
static size_t mpq__piece(mpq_pretok pre, const uint32_t *cp, size_t i, size_t n)
{
    if (pre == MPQ_PRETOK_SMOLLM) {
        if (mpq__is_number(cp[i])) return 1;
        size_t e = i; /* GPT-2's rules on the stretch up to the next digit */
        while (e < n && !mpq__is_number(cp[e])) e++;
        return mpq__gpt2_piece(cp, i, e);
    }
    if (pre == MPQ_PRETOK_GPT2) return mpq__gpt2_piece(cp, i, n);
    return mpq__llama3_piece(cp, i, n, pre == MPQ_PRETOK_LLAMA3 ? 3 : 1);
}

/* Pre-tokenizes cp[0..n) (bytes at boff) and runs the merges on each piece.
   MPQ_OK, MPQ_ERR_NOMEM, or MPQ_ERR_UNSUPPORTED with *bad at a byte
   without a token. */
static mpq_status mpq__stretch(const mpq_tokenizer *t, mpq__bpe *w, const uint8_t *text, const uint32_t *cp,
                               const size_t *boff, size_t n, mpq__tokbuf *o, size_t *bad)
{
    size_t i = 0;
    while (i < n) {
        const size_t k = mpq__piece(t->pre, cp, i, n);
        const int r = mpq__bpe_piece(t, w, text + boff[i], boff[i + k] - boff[i], o);
        if (r == 0) return MPQ_ERR_NOMEM;
        if (r < 0) {
            *bad = boff[i] + (size_t)(-1 - r);
            return MPQ_ERR_UNSUPPORTED;
        }
        i += k;
    }
    return MPQ_OK;
}

/* The special token that starts at s[0..n), longest first, or -1. */
static int32_t mpq__special_at(const mpq_tokenizer *t, const char *s, size_t n, unsigned flags)
{
    for (int i = 0; i < t->nspec; i++) {
        const int32_t id = t->spec[i];
        if (t->kind[id] == MPQ__TK_CONTROL && !(flags & MPQ_TOK_SPECIAL)) continue;
        const size_t len = t->off[id + 1] - t->off[id];
        if (len <= n && memcmp(s, t->bytes + t->off[id], len) == 0) return id;
    }
    return -1;
}

mpq_status mpq_tokenize(const mpq_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **tokens,
                        size_t *n, mpq_io_err *err)
{
    if (!t || (!text && len) || !tokens || !n) return mpq__fail(err, MPQ_ERR_ARG, "(tokenizer)", "NULL argument");
    const uint8_t *s = (const uint8_t *)text;
    uint32_t *cp = (uint32_t *)malloc(sizeof(uint32_t) * (len + 1));
    size_t *boff = (size_t *)malloc(sizeof(size_t) * (len + 1));
    uint8_t first[256] = {0}; /* first bytes of special tokens that may be matched */
    mpq__tokbuf o = {NULL, 0, 0};
    mpq__bpe w;
    memset(&w, 0, sizeof w);
    mpq_status st = MPQ_OK;
    if (!cp || !boff) {
        st = mpq__fail(err, MPQ_ERR_NOMEM, "(tokenizer)", "out of memory for %zu bytes of text", len);
        goto done;
    }
    size_t ncp = 0;
    for (size_t i = 0; i < len;) {
        const size_t k = mpq__utf8_next(s, len, i, &cp[ncp]);
        if (!k) {
            st = mpq__fail(err, MPQ_ERR_FORMAT, "(tokenizer)", "the text is not valid UTF-8 at byte %zu", i);
            goto done;
        }
        if (t->nfc && cp[ncp] >= 0x300 &&
            mpq__in_ranges(mpq__uc_nfc_unsafe, MPQ__NRANGES(mpq__uc_nfc_unsafe), cp[ncp])) {
            st = mpq__fail(err, MPQ_ERR_UNSUPPORTED, "(tokenizer)",
                           "the text has U+%04X at byte %zu, which the tokenizer's "
                           "NFC normalization may change (mpq does not normalize)",
                           (unsigned)cp[ncp], i);
            goto done;
        }
        boff[ncp++] = i;
        i += k;
    }
    boff[ncp] = len;
    for (int i = 0; i < t->nspec; i++)
        if (t->kind[t->spec[i]] != MPQ__TK_CONTROL || (flags & MPQ_TOK_SPECIAL))
            first[(uint8_t)t->bytes[t->off[t->spec[i]]]] = 1;
    if ((flags & MPQ_TOK_BOS) && t->add_bos && !mpq__push(&o, t->bos)) goto nomem;
    size_t start = 0; /* code point where the current stretch began */
    for (size_t i = 0; i <= ncp; i++) {
        int32_t sp = -1;
        if (i < ncp && first[s[boff[i]]]) sp = mpq__special_at(t, text + boff[i], len - boff[i], flags);
        if (sp < 0 && i < ncp) continue;
        size_t bad = 0;
        st = mpq__stretch(t, &w, s, cp + start, boff + start, i - start, &o, &bad);
        if (st == MPQ_ERR_NOMEM) goto nomem;
        if (st != MPQ_OK) {
            st = mpq__fail(err, st, "(tokenizer)",
                           "the text has byte 0x%02X (at byte %zu), which the vocabulary has no token "
                           "for",
                           s[bad], bad);
            goto done;
        }
        if (sp < 0) break;
        if (!mpq__push(&o, sp)) goto nomem;
        const size_t end = boff[i] + (t->off[sp + 1] - t->off[sp]);
        while (i < ncp && boff[i] < end) i++; /* special texts are whole UTF-8 sequences */
        start = i--;
    }
    *tokens = o.v ? o.v : (int32_t *)malloc(sizeof(int32_t));
    *n = o.n;
    o.v = NULL;
    if (!*tokens) goto nomem;
    goto done;
nomem:
    st = mpq__fail(err, MPQ_ERR_NOMEM, "(tokenizer)", "out of memory");
done:
    free(cp);
    free(boff);
    free(o.v);
    free(w.id);
    free(w.next);
    free(w.prev);
    free(w.heap);
    return st;
}

mpq_status mpq_pretokenize(mpq_pretok pre, const char *text, size_t len, size_t **ends, size_t *n, mpq_io_err *err)
{
    if ((!text && len) || !ends || !n || pre < MPQ_PRETOK_GPT2 || pre > MPQ_PRETOK_QWEN2)
        return mpq__fail(err, MPQ_ERR_ARG, "(tokenizer)", "bad argument");
    const uint8_t *s = (const uint8_t *)text;
    uint32_t *cp = (uint32_t *)malloc(sizeof(uint32_t) * (len + 1));
    size_t *boff = (size_t *)malloc(sizeof(size_t) * (len + 1)), *e = (size_t *)malloc(sizeof(size_t) * (len + 1));
    mpq_status st = MPQ_OK;
    size_t ncp = 0, np = 0;
    if (!cp || !boff || !e) st = mpq__fail(err, MPQ_ERR_NOMEM, "(tokenizer)", "out of memory");
    for (size_t i = 0; st == MPQ_OK && i < len;) {
        const size_t k = mpq__utf8_next(s, len, i, &cp[ncp]);
        if (!k) st = mpq__fail(err, MPQ_ERR_FORMAT, "(tokenizer)", "the text is not valid UTF-8 at byte %zu", i);
        boff[ncp++] = i;
        i += k;
    }
    if (st == MPQ_OK) {
        boff[ncp] = len;
        for (size_t i = 0; i < ncp;) {
            i += mpq__piece(pre, cp, i, ncp);
            e[np++] = boff[i];
        }
        *ends = e, *n = np;
        e = NULL;
    }
    free(cp), free(boff), free(e);
    return st;
}

mpq_status mpq_detokenize(const mpq_tokenizer *t, const int32_t *tokens, size_t n, unsigned flags, char **text,
                          size_t *len)
{
    if (!t || (!tokens && n) || !text) return MPQ_ERR_ARG;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= t->n) return MPQ_ERR_RANGE;
        if ((flags & MPQ_TOK_SKIP_SPECIAL) && t->kind[tokens[i]] == MPQ__TK_CONTROL) continue;
        total += t->off[tokens[i] + 1] - t->off[tokens[i]];
    }
    char *s = (char *)malloc(total + 1);
    if (!s) return MPQ_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if ((flags & MPQ_TOK_SKIP_SPECIAL) && t->kind[tokens[i]] == MPQ__TK_CONTROL) continue;
        const size_t l = t->off[tokens[i] + 1] - t->off[tokens[i]];
        memcpy(s + k, t->bytes + t->off[tokens[i]], l);
        k += l;
    }
    s[k] = 0;
    *text = s;
    if (len) *len = k;
    return MPQ_OK;
}

/* -------------------------------------------------------------------------- */
/* to tokenizer.json                                                          */
/* -------------------------------------------------------------------------- */

static cJSON *mpq__jbytelevel_new(int use_regex)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddFalseToObject(o, "add_prefix_space");
    cJSON_AddTrueToObject(o, "trim_offsets");
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

static cJSON *mpq__jpretok_new(mpq_pretok pre)
{
    if (pre == MPQ_PRETOK_GPT2) return mpq__jbytelevel_new(1);
    cJSON *o = cJSON_CreateObject(), *seq = cJSON_CreateArray(), *a = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "Sequence");
    if (pre == MPQ_PRETOK_SMOLLM) {
        cJSON_AddStringToObject(a, "type", "Digits");
        cJSON_AddTrueToObject(a, "individual_digits");
    } else {
        cJSON_AddStringToObject(a, "type", "Split");
        cJSON *pat = cJSON_AddObjectToObject(a, "pattern");
        cJSON_AddStringToObject(pat, "Regex", pre == MPQ_PRETOK_LLAMA3 ? mpq__re_llama3 : mpq__re_qwen2);
        cJSON_AddStringToObject(a, "behavior", "Isolated");
        cJSON_AddFalseToObject(a, "invert");
    }
    cJSON_AddItemToArray(seq, a);
    cJSON_AddItemToArray(seq, mpq__jbytelevel_new(pre == MPQ_PRETOK_SMOLLM));
    cJSON_AddItemToObject(o, "pretokenizers", seq);
    return o;
}

/* A JSON string of n bytes (cJSON wants a NUL-terminated copy). */
static cJSON *mpq__jstr(const char *s, size_t n)
{
    char *c = (char *)malloc(n + 1);
    if (!c) return NULL;
    memcpy(c, s, n);
    c[n] = 0;
    cJSON *j = cJSON_CreateString(c);
    free(c);
    return j;
}

mpq_status mpq_tokenizer_to_json(const mpq_tokenizer *t, char **json)
{
    if (!t || !json) return MPQ_ERR_ARG;
    cJSON *root = cJSON_CreateObject();
    if (!root) return MPQ_ERR_NOMEM;
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; added && i < t->n; i++) {
        if (t->kind[i] != MPQ__TK_CONTROL && t->kind[i] != MPQ__TK_USER) continue;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddItemToArray(added, a);
        cJSON_AddNumberToObject(a, "id", i);
        cJSON_AddItemToObject(a, "content", mpq__jstr(t->bytes + t->off[i], t->off[i + 1] - t->off[i]));
        cJSON_AddFalseToObject(a, "single_word");
        cJSON_AddFalseToObject(a, "lstrip");
        cJSON_AddFalseToObject(a, "rstrip");
        cJSON_AddBoolToObject(a, "normalized", t->kind[i] == MPQ__TK_USER);
        cJSON_AddBoolToObject(a, "special", t->kind[i] == MPQ__TK_CONTROL);
    }
    if (t->nfc) {
        cJSON *nf = cJSON_AddObjectToObject(root, "normalizer");
        cJSON_AddStringToObject(nf, "type", "NFC");
    } else {
        cJSON_AddNullToObject(root, "normalizer");
    }
    cJSON_AddItemToObject(root, "pre_tokenizer", mpq__jpretok_new(t->pre));
    if (t->add_bos) { /* TemplateProcessing: BOS, then the text */
        cJSON *pp = cJSON_AddObjectToObject(root, "post_processor");
        cJSON_AddStringToObject(pp, "type", "TemplateProcessing");
        cJSON *single = cJSON_AddArrayToObject(pp, "single"), *e1 = cJSON_CreateObject(), *e2 = cJSON_CreateObject();
        cJSON *sp = cJSON_AddObjectToObject(e1, "SpecialToken"), *seq = cJSON_AddObjectToObject(e2, "Sequence");
        cJSON_AddItemToObject(sp, "id", mpq__jstr(t->bytes + t->off[t->bos], t->off[t->bos + 1] - t->off[t->bos]));
        cJSON_AddNumberToObject(sp, "type_id", 0);
        cJSON_AddStringToObject(seq, "id", "A");
        cJSON_AddNumberToObject(seq, "type_id", 0);
        cJSON_AddItemToArray(single, e1);
        cJSON_AddItemToArray(single, e2);
        cJSON *stoks = cJSON_AddObjectToObject(pp, "special_tokens");
        cJSON *bt = cJSON_CreateObject(), *ids = cJSON_CreateArray(), *toks = cJSON_CreateArray();
        cJSON_AddItemToObject(bt, "id", mpq__jstr(t->bytes + t->off[t->bos], t->off[t->bos + 1] - t->off[t->bos]));
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(t->bos));
        cJSON_AddItemToArray(toks, mpq__jstr(t->bytes + t->off[t->bos], t->off[t->bos + 1] - t->off[t->bos]));
        cJSON_AddItemToObject(bt, "ids", ids);
        cJSON_AddItemToObject(bt, "tokens", toks);
        cJSON_AddItemToObject(stoks, cJSON_GetStringValue(cJSON_GetObjectItem(bt, "id")), bt);
    } else {
        cJSON_AddNullToObject(root, "post_processor");
    }
    cJSON *dec = mpq__jbytelevel_new(1);
    cJSON_AddItemToObject(root, "decoder", dec);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddFalseToObject(model, "fuse_unk");
    cJSON_AddFalseToObject(model, "byte_fallback");
    cJSON_AddBoolToObject(model, "ignore_merges", t->ignore_merges);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int i = 0; vocab && i < t->n; i++) {
        if (t->kind[i] == MPQ__TK_UNUSED) continue;
        char *k = (char *)malloc(t->spell_off[i + 1] - t->spell_off[i] + 1);
        if (!k) break;
        memcpy(k, t->spell + t->spell_off[i], t->spell_off[i + 1] - t->spell_off[i]);
        k[t->spell_off[i + 1] - t->spell_off[i]] = 0;
        cJSON_AddItemToObject(vocab, k, cJSON_CreateNumber(i));
        free(k);
    }
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (int r = 0; merges && r < t->nmerges; r++) {
        const int32_t a = t->m_left[r], b = t->m_right[r];
        const size_t la = t->spell_off[a + 1] - t->spell_off[a], lb = t->spell_off[b + 1] - t->spell_off[b];
        char *m = (char *)malloc(la + lb + 2);
        if (!m) break;
        memcpy(m, t->spell + t->spell_off[a], la);
        m[la] = ' ';
        memcpy(m + la + 1, t->spell + t->spell_off[b], lb);
        m[la + 1 + lb] = 0;
        cJSON_AddItemToArray(merges, cJSON_CreateString(m));
        free(m);
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) return MPQ_ERR_NOMEM;
    *json = s;
    return MPQ_OK;
}

mpq_status mpq_tokenizer_config_json(const mpq_tokenizer *t, char **json)
{
    if (!t || !json) return MPQ_ERR_ARG;
    cJSON *j = cJSON_CreateObject();
    if (!j) return MPQ_ERR_NOMEM;
    cJSON_AddBoolToObject(j, "add_bos_token", t->add_bos);
    const int32_t ids[2] = {t->bos, t->eos};
    const char *keys[2] = {"bos_token", "eos_token"};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0)
            cJSON_AddNullToObject(j, keys[k]);
        else
            cJSON_AddItemToObject(j, keys[k],
                                  mpq__jstr(t->bytes + t->off[ids[k]], t->off[ids[k] + 1] - t->off[ids[k]]));
    }
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    if (!s) return MPQ_ERR_NOMEM;
    *json = s;
    return MPQ_OK;
}
