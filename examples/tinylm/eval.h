/* tinylm/eval.h - a quantized tinylm and its measurement: held-out
   perplexity and exact-match task accuracy, optionally with a PMPD schedule.

   A quantized model is a set of packed matrices (mpq.h), one per linear map.
   It runs either through mpq_gemv on the packed bytes (tlm_hook_packed, what
   an inference engine would do) or through their dequantized copies
   (tlm_hook_dense, faster here); tests check that the two agree. The
   embedding, norms and output head stay as trained (fp16). */
#ifndef TLM_EVAL_H
#define TLM_EVAL_H

#include "data.h"
#include "model.h"
#include "mpq.h"

#include <stdio.h>

typedef struct tlm_qmodel {
    mpq_packed A[TLM_MAX_LAYERS][TLM_NLIN];
    float *W[TLM_MAX_LAYERS][TLM_NLIN][3]; /* dequantized at skip_planes 0, 1, 2 (NULL: not made) */
} tlm_qmodel;

static inline void tlm_qmodel_free(tlm_qmodel *q, const tlm_config *c)
{
    for (int l = 0; l < c->layers; l++)
        for (int w = 0; w < TLM_NLIN; w++) {
            mpq_packed_free(&q->A[l][w]);
            for (int s = 0; s < 3; s++) free(q->W[l][w][s]);
        }
    memset(q, 0, sizeof *q);
}

/* Dequantized copies at skip 0 .. levels-1. */
static inline int tlm_qmodel_dequantize(tlm_qmodel *q, const tlm_config *c, int levels)
{
    for (int l = 0; l < c->layers; l++)
        for (int w = 0; w < TLM_NLIN; w++)
            for (int s = 0; s < levels; s++) {
                const size_t n = (size_t)tlm_lin_rows(c, w) * tlm_lin_cols(c, w);
                if (!q->W[l][w][s] && !(q->W[l][w][s] = (float *)malloc(sizeof(float) * n))) return -1;
                if (mpq_packed_dequantize(&q->A[l][w], s, q->W[l][w][s]) != MPQ_OK) return -1;
            }
    return 0;
}

/* Bits per weight over the linear maps (mpq_packed_bpw level 2: scales,
   sparse parts included), and at a skip level (level 1 bits, PMPD). */
static inline double tlm_qmodel_bpw(const tlm_qmodel *q, const tlm_config *c, int skip)
{
    double bits = 0, n = 0;
    for (int l = 0; l < c->layers; l++)
        for (int w = 0; w < TLM_NLIN; w++) {
            const double k = (double)tlm_lin_rows(c, w) * tlm_lin_cols(c, w);
            bits += k * (skip < 0 ? mpq_packed_bpw(&q->A[l][w], 2) : mpq_packed_bpw_skip(&q->A[l][w], skip));
            n += k;
        }
    return bits / n;
}

/* How a pass uses a quantized model: per token, the skip level. Position t
   of sequence b is "prompt" when t < prompt_len[b] (prompt_skip), else
   decoded token t - prompt_len[b] (mpq_pmpd_skip_at of the schedule). With
   sched NULL every token is at skip 0. */
typedef struct tlm_run {
    const tlm_qmodel *q;
    const mpq_pmpd_schedule *sched;
    const int *prompt_len;
    int use_packed; /* mpq_gemv on the packed bytes instead of the dense copies */
    mpq_path path;  /* for use_packed (0: the fastest) */
} tlm_run;

static inline int tlm_run_skip(const tlm_run *r, int row, int T)
{
    if (!r->sched) return 0;
    const int b = row / T, t = row % T;
    return mpq_pmpd_skip_at(r->sched, (long)t - r->prompt_len[b]);
}

static inline void tlm_hook(void *user, const tlm_model *m, int l, int w, const real *x, real *y, int M)
{
    const tlm_run *r = (const tlm_run *)user;
    const int rows = tlm_lin_rows(&m->c, w), cols = tlm_lin_cols(&m->c, w);
    int lo = 0;
    while (lo < M) { /* runs of rows with the same skip level */
        const int s = tlm_run_skip(r, lo, m->T);
        int hi = lo + 1;
        while (hi < M && tlm_run_skip(r, hi, m->T) == s) hi++;
        if (r->use_packed) {
            mpq_gemv_opts o;
            memset(&o, 0, sizeof o);
            o.skip_planes = s;
            o.path = r->path;
            for (int i = lo; i < hi; i += 8) {
                const int nb = hi - i < 8 ? hi - i : 8;
                if (mpq_gemv(&r->q->A[l][w], x + (size_t)i * cols, y + (size_t)i * rows, nb, &o, NULL, 0) != MPQ_OK)
                    abort();
            }
        } else {
            tlm_mm(x + (size_t)lo * cols, r->q->W[l][w][s], y + (size_t)lo * rows, hi - lo, rows, cols, 0);
        }
        lo = hi;
    }
}

/* ---- the measurements ---------------------------------------------------- */

typedef struct tlm_task {
    int n;      /* prompts */
    int narith; /* the first narith are arithmetic, the rest recall */
    char (*prompt)[64], (*answer)[16];
    int maxlen; /* longest prompt (with its leading newline) */
} tlm_task;

static inline void tlm_task_make(tlm_task *k, uint64_t seed, int narith, int nrecall)
{
    k->n = narith + nrecall, k->narith = narith, k->maxlen = 0;
    k->prompt = (char(*)[64])calloc((size_t)k->n, 64);
    k->answer = (char(*)[16])calloc((size_t)k->n, 16);
    uint64_t r = seed;
    for (int i = 0; i < k->n; i++) {
        char p[64];
        if (i < narith)
            tlm_arith(&r, p, k->answer[i]);
        else
            tlm_recall(&r, p, k->answer[i]);
        const int len = snprintf(k->prompt[i], 64, "\n%s", p);
        k->maxlen = len > k->maxlen ? len : k->maxlen;
    }
}

static inline void tlm_task_free(tlm_task *k)
{
    free(k->prompt);
    free(k->answer);
}

typedef struct tlm_result {
    double nll;           /* nats per byte on the held-out windows */
    double ppl;           /* exp(nll) */
    double arith, recall; /* exact-match accuracy */
} tlm_result;

#define TLM_ANSWER_MAX 6 /* decoded bytes: up to 4 digits, the newline, one spare */

/* Greedy answers to every prompt; all prompts decode together, right-padded
   (a causal model never sees the padding). Each step recomputes the whole
   window: simple, and exact for any per-token precision. */
static inline void tlm_task_run(const tlm_model *m0, tlm_run *run, const tlm_task *k, double *arith, double *recall)
{
    tlm_model m = *m0;
    m.T = k->maxlen + TLM_ANSWER_MAX;
    const int B = k->n, T = m.T;
    tlm_acts a;
    uint8_t *tok = (uint8_t *)calloc((size_t)B * T, 1);
    int *len = (int *)malloc(sizeof(int) * B), *done = (int *)calloc((size_t)B, sizeof(int));
    char(*out)[TLM_ANSWER_MAX + 1] = (char(*)[TLM_ANSWER_MAX + 1]) calloc((size_t)B, TLM_ANSWER_MAX + 1);
    if (tlm_acts_alloc(&m.c, B, &a) || !tok || !len || !done || !out) abort();
    for (int b = 0; b < B; b++) {
        len[b] = (int)strlen(k->prompt[b]);
        memcpy(tok + (size_t)b * T, k->prompt[b], (size_t)len[b]);
    }
    run->prompt_len = len;
    for (int step = 0; step < TLM_ANSWER_MAX; step++) {
        int busy = 0;
        for (int b = 0; b < B; b++) busy += !done[b];
        if (!busy) break;
        tlm_forward(&m, tok, NULL, &a, B);
        for (int b = 0; b < B; b++) {
            if (done[b]) continue;
            const int pos = len[b] + step - 1;
            const real *z = a.logits + ((size_t)b * T + pos) * TLM_VOCAB;
            int best = 0;
            for (int v = 1; v < TLM_VOCAB; v++) best = z[v] > z[best] ? v : best;
            tok[(size_t)b * T + pos + 1] = (uint8_t)best;
            if (best == '\n')
                done[b] = 1;
            else
                out[b][step] = (char)best;
        }
    }
    int ok_a = 0, ok_r = 0;
    for (int b = 0; b < B; b++) {
        const int ok = done[b] && strcmp(out[b], k->answer[b]) == 0;
        if (b < k->narith)
            ok_a += ok;
        else
            ok_r += ok;
    }
    *arith = k->narith ? (double)ok_a / k->narith : 0;
    *recall = B > k->narith ? (double)ok_r / (B - k->narith) : 0;
    run->prompt_len = NULL;
    tlm_acts_free(&a);
    free(tok), free(len), free(done), free(out);
}

/* Held-out perplexity on B windows (tok/tgt: B x seq); with a schedule the
   first `prefill` tokens of each window are the prompt. */
static inline double tlm_nll(const tlm_model *m0, tlm_run *run, const uint8_t *tok, const int *tgt, int B, int prefill)
{
    tlm_model m = *m0;
    m.T = m.c.seq;
    tlm_acts a;
    if (tlm_acts_alloc(&m.c, B, &a)) abort();
    int *len = (int *)malloc(sizeof(int) * B);
    for (int b = 0; b < B; b++) len[b] = prefill;
    run->prompt_len = len;
    const double nll = tlm_forward(&m, tok, tgt, &a, B);
    run->prompt_len = NULL;
    free(len);
    tlm_acts_free(&a);
    return nll;
}

/* Everything for one model: q NULL runs the model's own weights. */
static inline tlm_result tlm_evaluate(const tlm_model *m0, const tlm_qmodel *q, const mpq_pmpd_schedule *sched,
                                      int use_packed, const uint8_t *tok, const int *tgt, int B, const tlm_task *k)
{
    tlm_model m = *m0;
    tlm_run run;
    memset(&run, 0, sizeof run);
    run.q = q, run.sched = sched, run.use_packed = use_packed;
    if (q) m.hook = tlm_hook, m.hook_user = &run;
    tlm_result r;
    r.nll = tlm_nll(&m, &run, tok, tgt, B, m.c.seq / 2);
    r.ppl = exp(r.nll);
    tlm_task_run(&m, &run, k, &r.arith, &r.recall);
    return r;
}

#endif
