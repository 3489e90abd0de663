/* tinylm/eval.h - a tinylm measured as it is now (float weights, or
   packed linear maps: what mpq_model runs): perplexity per byte on
   held-out windows and exact-match accuracy on arithmetic and recall
   prompts, greedily decoded; optionally with a PMPD schedule. */
#ifndef TLM_EVAL_H
#define TLM_EVAL_H

#include "data.h"
#include "tinylm.h"

#include <math.h>
#include <stdio.h>

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

static inline int tlm_stop_at_newline(void *user, int32_t token)
{
    (void)user;
    return token == '\n';
}

/* The answer to every prompt, greedily decoded (mpq_llm_generate: the
   prompt in one pass, then a token at a time with the cache; with sched
   the prompt at its prefill_skip and decoded token t at its level t), up
   to a newline; exact match with the answer. */
static inline mpq_status tlm_task_run(const mpq_llm *m, const mpq_pmpd_schedule *sched, const tlm_task *k,
                                      double *arith, double *recall)
{
    mpq_llm_state s;
    mpq_status st = mpq_llm_state_init(m, k->maxlen + TLM_ANSWER_MAX + 1, 64, &s);
    if (st != MPQ_OK) return st;
    mpq_gen_opts o;
    memset(&o, 0, sizeof o);
    o.max_tokens = TLM_ANSWER_MAX, o.schedule = sched, o.on_token = tlm_stop_at_newline;
    int ok_a = 0, ok_r = 0;
    for (int i = 0; i < k->n && st == MPQ_OK; i++) {
        int32_t prompt[64], out[TLM_ANSWER_MAX];
        const int n = (int)strlen(k->prompt[i]);
        for (int t = 0; t < n; t++) prompt[t] = (uint8_t)k->prompt[i][t];
        mpq_gen_result r;
        st = mpq_llm_generate(m, &s, prompt, n, &o, out, TLM_ANSWER_MAX, &r);
        char got[TLM_ANSWER_MAX + 1] = {0};
        for (int t = 0; t + 1 < r.tokens; t++) got[t] = (char)out[t];
        const int ok = r.tokens > 0 && out[r.tokens - 1] == '\n' && strcmp(got, k->answer[i]) == 0;
        if (i < k->narith)
            ok_a += ok;
        else
            ok_r += ok;
    }
    mpq_llm_state_free(&s);
    *arith = k->narith ? (double)ok_a / k->narith : 0;
    *recall = k->n > k->narith ? (double)ok_r / (k->n - k->narith) : 0;
    return st;
}

/* Everything for the model as it is: perplexity per byte over the second
   half of B held-out windows of TLM_SEQ + 1 bytes (tlm_windows; as
   llama-perplexity scores a chunk of TLM_SEQ + 1 tokens: the first half is
   the prompt, at the schedule's prefill_skip with sched), and the tasks. */
static inline mpq_status tlm_evaluate(const mpq_llm *m, const mpq_pmpd_schedule *sched, const int32_t *held, int B,
                                      const tlm_task *k, tlm_result *res)
{
    mpq_ppl_opts o;
    memset(&o, 0, sizeof o);
    o.ctx = TLM_SEQ + 1, o.schedule = sched;
    mpq_ppl_result p;
    mpq_status st = mpq_llm_perplexity(m, held, (size_t)B * (TLM_SEQ + 1), &o, &p);
    if (st != MPQ_OK) return st;
    res->nll = p.nll, res->ppl = exp(p.nll);
    return tlm_task_run(m, sched, k, &res->arith, &res->recall);
}

#endif
