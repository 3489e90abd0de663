/* examples/quantize_row.h - a loaded model quantized as `mpq quantize`
   options say: the recipe the tool makes from those options
   (tools/quantize_args.h), run over the model's linear maps with the
   statistics mpq calibrate wrote, the packed matrices put into the model.
   The main job (examples/llm) and tinylm give their rows this way, so
   each row measures what the tool writes (test_cli_llm compares the
   bytes). */
#ifndef MPQ_EXAMPLES_QUANTIZE_ROW_H
#define MPQ_EXAMPLES_QUANTIZE_ROW_H

#include "mpq.h"
#include "mpq_model.h"
#include "quantize_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the recipe's callbacks see: the model the maps go into, and the
   caller's progress. */
typedef struct row_io {
    mpq_llm *m;
    void (*progress)(void *user, const char *step, int done, int total, const char *name);
    void *user;
} row_io;

static inline mpq_status row_store(void *user, int i, mpq_packed *A)
{
    mpq_llm *m = ((row_io *)user)->m;
    return mpq_linear_set_packed(m, &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT], A);
}

static inline void row_progress(void *user, const char *step, int done, int total, const char *name)
{
    const row_io *r = (const row_io *)user;
    if (r->progress) r->progress(r->user, step, done, total, name);
}

/* What the rows read besides the model. */
typedef struct row_stats {
    const mpq_calib_stats *S;  /* mpq calibrate */
    const mpq_calib_stats *Hs; /* X^T X, mpq calibrate --stats xtx (may be NULL) */
    const mpq_calib_stats *Sr; /* the planners' and ReQuant's statistics under --rotate SEED (mpq
                                  calibrate --rotate SEED, the same seed; may be NULL) */
    const int32_t *text;       /* --sequential: the calibration text as mpq_tokenize (flags 0) gives
                                  the whole file, as `mpq quantize --sequential TEXT` reads it (may be
                                  NULL); the path in the options is not read */
    size_t ntext;
    uint64_t text_hash; /* --method auto: mpq_text_hash of the calibration text, which the measurements must be
                           of (0: not checked) */
} row_stats;

/* The maps quantized sequentially (mpq_llm_quantize_sequential) after the
   planner's plan, stored into m as the recipe's store would. */
static inline int quantize_row_sequential(const qargs *q, mpq_recipe r, mpq_llm *m, const row_stats *rs,
                                          mpq_recipe_map *maps, int n, mpq_recipe_result *res)
{
    if (!rs->text) return fail(EXIT_USAGE, "--sequential: no calibration text");
    mpq_plan plan;
    memset(&plan, 0, sizeof plan);
    memset(res, 0, sizeof *res), res->map = -1;
    mpq_status st = MPQ_OK;
    if (r.planner != MPQ_PLANNER_NONE && (st = mpq_recipe_plan(&r, maps, n, NULL, &plan)) == MPQ_OK)
        res->bpw = plan.bpw, res->loss = plan.loss, r.planner = MPQ_PLANNER_NONE, r.plan = &plan;
    mpq_packed *out = (mpq_packed *)calloc((size_t)n, sizeof *out);
    mpq_seq_opts so;
    memset(&so, 0, sizeof so);
    so.windows = q->seq_windows, so.length = q->seq_length;
    mpq_io_err e;
    e.msg[0] = 0;
    if (st == MPQ_OK)
        st = out ? mpq_llm_quantize_sequential(m, rs->text, rs->ntext, &so, &r, maps, out, &e) : MPQ_ERR_NOMEM;
    for (int i = 0; i < n && st == MPQ_OK && out; i++) {
        st = mpq_linear_set_packed(m, &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT], &out[i]);
        if (st == MPQ_OK) memset(&out[i], 0, sizeof out[i]);
    }
    for (int i = 0; i < n && out; i++) mpq_packed_free(&out[i]);
    free(out);
    mpq_plan_free(&plan);
    return st == MPQ_OK ? 0 : fail(EXIT_QUANT, "--sequential: %s", e.msg[0] ? e.msg : mpq_status_str(st));
}

/* Quantizes every linear map of m's layers (and, at --embed-bits, its
   embedding) as the options `args` and then `common` (may be "") say, with
   the statistics of rs (AWQ's rows always from rs->S; the salience and PQI
   from rs->Sr under --rotate, whose seed must be the one Sr records); the
   packed matrices go into m. progress (may be NULL) sees the recipe's
   steps. *res: the recipe's result, *bpw (may be NULL): the planner's
   budget after --bpw min. 0, or an exit code after a message. */
static inline int quantize_row(const char *args, const char *common, mpq_llm *m, const row_stats *rs,
                               void (*progress)(void *, const char *, int, int, const char *), void *user,
                               mpq_recipe_result *res, double *bpw)
{
    const mpq_calib_stats *S = rs->S, *Hs = rs->Hs, *Sr = rs->Sr;
    char buf[1024];
    char *argv[64];
    int argc = 0;
    if (snprintf(buf, sizeof buf, "quantize %s %s IN OUT", args, common) >= (int)sizeof buf)
        return fail(EXIT_USAGE, "%s: the options are too long", args);
    for (char *t = strtok(buf, " "); t && argc < 63; t = strtok(NULL, " ")) argv[argc++] = t;
    qargs q;
    const char *pos[2];
    int npos = 0;
    cli_seen seen;
    mpq_recipe r;
    int rc = cli_parse(&qargs_spec, argc, argv, &q, sizeof q, pos, &npos, &seen);
    if (!rc) rc = qargs_recipe(&q, &seen, &r);
    if (rc) return rc < 0 ? EXIT_USAGE : rc;
    const mpq_calib_stats *P = r.rotate ? Sr : S; /* the salience and PQI, in the basis of the recipe */
    if (r.rotate && (mpq_recipe_needs(&r) & (MPQ_RECIPE_SALIENCE | MPQ_RECIPE_PQI)) &&
        (!Sr || !Sr->rotate || Sr->rotate_seed != r.rotate_seed))
        return fail(EXIT_INPUT, "%s: needs statistics gathered in the rotated basis (mpq calibrate --rotate %llu)",
                    args, (unsigned long long)r.rotate_seed);
    if (!r.rotate && (mpq_recipe_needs(&r) & (MPQ_RECIPE_SALIENCE | MPQ_RECIPE_PQI)) && S->rotate)
        return fail(EXIT_INPUT, "%s: the statistics are of rotated weights (seed %llu); the row has no --rotate", args,
                    (unsigned long long)S->rotate_seed);
    if (!P) P = S;
    const int n = m->c.layers * MPQ_LIN_COUNT;
    mpq_recipe_map *maps = (mpq_recipe_map *)calloc((size_t)n, sizeof *maps);
    char(*names)[80] = (char(*)[80])calloc((size_t)n, 80);
    if (!maps || !names) rc = fail(EXIT_QUANT, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        const mpq_linear *L = &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
        mpq_recipe_map *p = &maps[i];
        p->rows = L->rows, p->cols = L->cols, p->W = L->W;
        p->name = mpq_llm_linear_name(m->c.gguf_names, i / MPQ_LIN_COUNT, i % MPQ_LIN_COUNT, 0, names[i], 80);
        p->X = S->awq ? S->awq[i] : NULL, p->tokens = S->awq_tokens;
        p->H = Hs && Hs->xtx ? Hs->xtx[i] : NULL;
        p->pqi = P->pqi ? P->pqi[i] : NULL;
        p->fisher = P->fisher ? P->fisher[i] : NULL;
        p->channel = P->mixllm ? P->mixllm[i] : NULL;
        p->col_sens = P->xtx_diag ? P->xtx_diag[i] : NULL;
        p->layer_sens = P->layer_sens ? P->layer_sens[i] : 1.0f;
    }
    if (!rc) rc = qargs_budget(&q, &r, maps, n);
    mpq_measure_info info; /* --method auto: r's widths point into it */
    double *kld = NULL;
    if (!rc && r.planner == MPQ_PLANNER_KLD) rc = qargs_measured(&q, &r, maps, n, &m->c, rs->text_hash, &info, &kld);
    if (!rc && q.sequential) {
        rc = quantize_row_sequential(&q, r, m, rs, maps, n, res);
        if (bpw) *bpw = r.bpw;
    } else if (!rc) {
        row_io ri = {m, progress, user};
        mpq_recipe_io io = {NULL, NULL, row_store, row_progress, &ri};
        const mpq_status s = mpq_recipe_run(&r, maps, n, &io, NULL, res);
        if (s != MPQ_OK)
            rc = fail(EXIT_QUANT, "%s: %s: %s", res->map >= 0 ? maps[res->map].name : args, res->step,
                      mpq_status_str(s));
        if (bpw) *bpw = r.bpw;
    }
    if (!rc && q.embed_bits) { /* the embedding by round-to-nearest, as the tool does */
        mpq_recipe rtn;
        memset(&rtn, 0, sizeof rtn);
        rtn.bits = q.embed_bits;
        mpq_recipe_map e;
        memset(&e, 0, sizeof e);
        e.rows = m->embed.rows, e.cols = m->embed.cols, e.W = m->embed.W;
        mpq_packed A;
        mpq_status s = mpq_recipe_quantize(&rtn, 0, &e, NULL, &A);
        if (s == MPQ_OK) s = mpq_linear_set_packed(m, &m->embed, &A);
        if (s != MPQ_OK) rc = fail(EXIT_QUANT, "embedding: %s", mpq_status_str(s));
    }
    free(maps);
    free(names);
    free(kld);
    return rc;
}

#endif
