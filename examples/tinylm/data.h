/* tinylm/data.h - a seeded generator of text with real structure, so that a
   small model has something to learn and quantization something to break.

   Lines of three kinds (newline-terminated, lower-case ASCII):
   - sentences whose verbs agree in number with their subject, also across a
     relative clause ("the dogs that the cat sees run.") and with compound
     subjects ("the cat and the dog sleep.");
   - arithmetic with answers: "a+b=c" and "a-b=c" (a >= b), operands of one
     to three digits (30 / 50 / 20 %);
   - key-value recall: "k=v" pairs, then a query: "b=4 q=7 m=1 ? q=7".
   The task (exact match) asks for the answer of a held-out arithmetic
   prompt ("123+45=") or recall prompt ("b=4 q=7 ? q="), greedily decoded. */
#ifndef TLM_DATA_H
#define TLM_DATA_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- deterministic random numbers (splitmix64) -------------------------- */

static inline uint64_t tlm_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double tlm_unif(uint64_t *s) { return ((double)(tlm_rand(s) >> 11) + 0.5) / 9007199254740992.0; }
static inline double tlm_gauss(uint64_t *s)
{
    return sqrt(-2.0 * log(tlm_unif(s))) * cos(6.283185307179586 * tlm_unif(s));
}

static const char *const tlm_nouns[][2] = {{"cat", "cats"},       {"dog", "dogs"},         {"bird", "birds"},
                                           {"child", "children"}, {"man", "men"},          {"woman", "women"},
                                           {"fox", "foxes"},      {"teacher", "teachers"}, {"farmer", "farmers"},
                                           {"king", "kings"},     {"mouse", "mice"},       {"horse", "horses"}};
static const char *const tlm_vint[][2] = {{"runs", "run"},   {"sleeps", "sleep"}, {"sings", "sing"},
                                          {"waits", "wait"}, {"jumps", "jump"},   {"laughs", "laugh"}};
static const char *const tlm_vtr[][2] = {{"sees", "see"},   {"likes", "like"}, {"chases", "chase"},
                                         {"helps", "help"}, {"finds", "find"}, {"follows", "follow"}};
static const char *const tlm_adj[] = {"small", "big", "red", "old", "quiet", "happy", "tired", "clever"};
static const char *const tlm_det_sg[] = {"the", "a", "every", "that"};
static const char *const tlm_det_pl[] = {"the", "some", "two", "many", "those"};

#define TLM_PICK(rng, arr) (arr)[tlm_rand(rng) % (sizeof(arr) / sizeof((arr)[0]))]

/* "det [adj] noun", number pl (0 singular, 1 plural) */
static inline int tlm_np(uint64_t *r, char *s, int pl)
{
    const char *det = pl ? TLM_PICK(r, tlm_det_pl) : TLM_PICK(r, tlm_det_sg);
    const char *noun = TLM_PICK(r, tlm_nouns)[pl];
    if (tlm_rand(r) % 3 == 0) return sprintf(s, "%s %s %s", det, TLM_PICK(r, tlm_adj), noun);
    return sprintf(s, "%s %s", det, noun);
}

static inline int tlm_sentence(uint64_t *r, char *s)
{
    char a[64], b[64];
    const int pl = (int)(tlm_rand(r) % 2), kind = (int)(tlm_rand(r) % 4);
    tlm_np(r, a, pl);
    if (kind == 0) return sprintf(s, "%s %s.\n", a, TLM_PICK(r, tlm_vint)[pl]);
    if (kind == 1) {
        tlm_np(r, b, (int)(tlm_rand(r) % 2));
        return sprintf(s, "%s %s %s.\n", a, TLM_PICK(r, tlm_vtr)[pl], b);
    }
    if (kind == 2) { /* the verb after the relative clause agrees with the head noun */
        const int pl2 = (int)(tlm_rand(r) % 2);
        tlm_np(r, b, pl2);
        return sprintf(s, "%s that %s %s %s.\n", a, b, TLM_PICK(r, tlm_vtr)[pl2], TLM_PICK(r, tlm_vint)[pl]);
    }
    tlm_np(r, b, (int)(tlm_rand(r) % 2)); /* compound subject: plural verb */
    return sprintf(s, "%s and %s %s.\n", a, b, TLM_PICK(r, tlm_vint)[1]);
}

static inline int tlm_operand(uint64_t *r)
{
    const int u = (int)(tlm_rand(r) % 10), digits = u < 3 ? 1 : u < 8 ? 2 : 3; /* 30 / 50 / 20 % */
    return (int)(tlm_rand(r) % (digits == 1 ? 10 : digits == 2 ? 100 : 1000));
}

/* prompt "a+b=" and answer "c"; returns the prompt length */
static inline int tlm_arith(uint64_t *r, char *prompt, char *answer)
{
    int a = tlm_operand(r), b = tlm_operand(r);
    if (tlm_rand(r) % 2) {
        sprintf(answer, "%d", a + b);
        return sprintf(prompt, "%d+%d=", a, b);
    }
    if (a < b) {
        int t = a;
        a = b, b = t;
    }
    sprintf(answer, "%d", a - b);
    return sprintf(prompt, "%d-%d=", a, b);
}

static inline int tlm_recall(uint64_t *r, char *prompt, char *answer)
{
    const int n = 3 + (int)(tlm_rand(r) % 3);
    char keys[8];
    int vals[8], len = 0;
    for (int i = 0; i < n; i++) {
        char k;
        int fresh;
        do { /* distinct keys */
            k = (char)('a' + tlm_rand(r) % 26);
            fresh = 1;
            for (int j = 0; j < i; j++) fresh &= keys[j] != k;
        } while (!fresh);
        keys[i] = k, vals[i] = (int)(tlm_rand(r) % 10);
        len += sprintf(prompt + len, "%c=%d ", k, vals[i]);
    }
    const int q = (int)(tlm_rand(r) % n);
    sprintf(answer, "%d", vals[q]);
    return len + sprintf(prompt + len, "? %c=", keys[q]);
}

/* One line of the corpus into s (at most 160 bytes): 40 % sentences, 40 %
   arithmetic, 20 % recall; returns its length. */
static inline int tlm_line(uint64_t *r, char *s)
{
    const int kind = (int)(tlm_rand(r) % 10);
    char p[128], a[16];
    if (kind < 4) return tlm_sentence(r, s);
    if (kind < 8)
        tlm_arith(r, p, a);
    else
        tlm_recall(r, p, a);
    return sprintf(s, "%s%s\n", p, a);
}

/* `bytes` bytes of corpus from a seed (whole lines, the last one cut). */
static inline char *tlm_corpus(uint64_t seed, size_t bytes)
{
    char *t = (char *)malloc(bytes + 256), line[256];
    if (!t) return NULL;
    uint64_t r = seed;
    size_t n = 0;
    while (n < bytes) {
        int k = tlm_line(&r, line);
        memcpy(t + n, line, (size_t)k);
        n += (size_t)k;
    }
    return t;
}

/* B training windows of T + 1 bytes at random offsets, as tokens (a byte
   is its token): window b is tok[b (T + 1) .. (b + 1)(T + 1)). */
static inline void tlm_batch(const char *text, size_t bytes, int B, int T, uint64_t *r, int32_t *tok)
{
    for (int b = 0; b < B; b++) {
        const size_t o = tlm_rand(r) % (bytes - (size_t)T - 1);
        for (int t = 0; t <= T; t++) tok[(size_t)b * (T + 1) + t] = (uint8_t)text[o + t];
    }
}

/* Held-out and calibration windows: B windows of T + 1 bytes, window b the
   bytes b T .. b T + T of the text (each shares its last byte with the
   next window's first), side by side in tok as in tlm_batch. */
static inline void tlm_windows(const char *text, int B, int T, int32_t *tok)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t <= T; t++) tok[(size_t)b * (T + 1) + t] = (uint8_t)text[(size_t)b * T + t];
}

#endif
