/* examples/llm/rows.h - the rows of the main job's table, each given as the
   options of `mpq quantize` (tools/quantize_args.h), and the one function
   that quantizes a loaded model as a row says: the recipe the tool makes
   from those options, over the model's linear maps with the statistics
   mpq calibrate wrote. The main job (llm_methods.c) measures what this
   makes; test_cli_llm checks, row by row, that it is byte for byte what
   `mpq quantize <options> --stats S --hessian H MODEL OUT` writes. */
#ifndef MPQ_LLM_ROWS_H
#define MPQ_LLM_ROWS_H

#include "mpq.h"
#include "mpq_model.h"
#include "quantize_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    ROW_QUICK = 1, /* also in --quick */
    ROW_A8 = 2,    /* measured again with 8-bit activations (MixLLM's W*A8) */
    ROW_PMPD = 4   /* PMPD's schedules measured on this model afterwards */
};

typedef struct llm_row {
    const char *family, *name;
    const char *args; /* mpq quantize's options (every row: --embed-bits 8 as well) */
    unsigned flags;
} llm_row;

/* Every method as its paper runs it, the plain-RTN variants beside them,
   and compositions; SFMP at group 256 for 2.25 and 3.25 bpw, as its table 3. */
static const llm_row llm_rows[] = {
    {"RTN", "RTN 2-bit g128", "--method rtn --bits 2", 0},
    {"RTN", "RTN 3-bit g128", "--method rtn --bits 3", 0},
    {"RTN", "RTN 4-bit g128", "--method rtn --bits 4", ROW_QUICK},
    {"MXINT", "MXINT4", "--method rtn --format mxint --bits 4", 0},
    {"AWQ", "AWQ 3-bit g128", "--method awq --bits 3", 0},
    {"GPTQ", "GPTQ 2-bit g128 (act-order)", "--method gptq --bits 2 --act-order", 0},
    {"GPTQ", "GPTQ 3-bit g128 (act-order)", "--method gptq --bits 3 --act-order", 0},
    /* at 4 bits also MixLLM's W4A8 (its p0: uniform 4-bit weights, GPTQ) */
    {"GPTQ", "GPTQ 4-bit g128 (act-order)", "--method gptq --bits 4 --act-order", ROW_QUICK | ROW_A8},
    {"GPTQ", "GPTQ 3-bit g128", "--method gptq --bits 3", 0},
    {"AWQ+GPTQ", "AWQ + GPTQ 3-bit g128 (act-order)", "--method gptq --quantizer awq+gptq --bits 3 --act-order", 0},
    {"AWQ+GPTQ", "AWQ + GPTQ 4-bit g128 (act-order)", "--method gptq --quantizer awq+gptq --bits 4 --act-order", 0},
    {"AWQ", "AWQ 4-bit g128", "--method awq --bits 4", ROW_PMPD},
    {"SFMP", "SFMP 2.25 g256", "--method sfmp --bpw 2.25 --group 256", 0},
    {"SFMP", "SFMP 2.50 g128", "--method sfmp --bpw 2.5", 0},
    {"SFMP", "SFMP 3.00 g128", "--method sfmp --bpw 3", 0},
    {"SFMP", "SFMP 3.25 g256", "--method sfmp --bpw 3.25 --group 256", 0},
    {"SFMP", "SFMP 3.50 g128", "--method sfmp --bpw 3.5", ROW_QUICK},
    {"SFMP", "SFMP 4.25 g128", "--method sfmp --bpw 4.25", 0},
    {"SFMP+AWQ", "SFMP 2.25 g256 + AWQ", "--method sfmp --bpw 2.25 --group 256 --quantizer awq", 0},
    {"SFMP+AWQ", "SFMP 3.25 g256 + AWQ", "--method sfmp --bpw 3.25 --group 256 --quantizer awq", 0},
    {"SFMP+AWQ", "SFMP 3.50 g128 + AWQ", "--method sfmp --bpw 3.5 --quantizer awq", 0},
    {"SFMP+AWQ", "SFMP 4.25 g128 + AWQ", "--method sfmp --bpw 4.25 --quantizer awq", 0},
    {"SFMP+GPTQ", "SFMP 2.25 g256 + GPTQ (act-order)",
     "--method sfmp --bpw 2.25 --group 256 --quantizer gptq --act-order", 0},
    {"SFMP+GPTQ", "SFMP 3.25 g256 + GPTQ (act-order)",
     "--method sfmp --bpw 3.25 --group 256 --quantizer gptq --act-order", 0},
    {"SFMP+GPTQ", "SFMP 3.50 g128 + GPTQ (act-order)", "--method sfmp --bpw 3.5 --quantizer gptq --act-order", 0},
    {"SFMP+GPTQ", "SFMP 4.25 g128 + GPTQ (act-order)", "--method sfmp --bpw 4.25 --quantizer gptq --act-order", 0},
    /* compositions: SFMP's widths, AWQ's scales, GPTQ */
    {"SFMP+AWQ+GPTQ", "SFMP 3.25 g128 + AWQ + GPTQ (act-order)",
     "--method sfmp --bpw 3.25 --quantizer awq+gptq --act-order", 0},
    {"SFMP+AWQ+GPTQ", "SFMP 4.00 g128 + AWQ + GPTQ (act-order)",
     "--method sfmp --bpw 4 --quantizer awq+gptq --act-order", 0},
    {"MixLLM", "MixLLM 8/4 (10 % at 8 bits)", "--method mixllm --fraction 0.1 --bits 4", 0},
    {"MixLLM", "MixLLM 8/3 (10 % at 8 bits)", "--method mixllm --fraction 0.1 --bits 3", 0},
    /* and MixLLM's W4.4A8 */
    {"MixLLM+GPTQ", "MixLLM 8/4 (10 % at 8 bits) + GPTQ",
     "--method mixllm --fraction 0.1 --bits 4 --quantizer gptq --act-order", ROW_A8},
    /* MXSens at the least budget its 4/6/8 templates can meet (every map's
       8-bit block, 4 bits elsewhere), then half a bit more */
    {"MXSens", "MXSens at its lowest budget (MXINT 4/6/8)", "--method mxsens --bpw min", 0},
    {"MXSens", "MXSens at its lowest budget + 0.5 (MXINT 4/6/8)", "--method mxsens --bpw min+0.5", 0},
    /* ReQuant: 0.25 % outliers spread by eq. 9 and 0.25 % significant weights */
    {"ReQuant", "ReQuant on RTN 3-bit", "--method requant --bits 3", 0},
    {"ReQuant", "ReQuant on AWQ 3-bit", "--method requant --bits 3 --quantizer awq", 0},
    /* compositions: SFMP's plan, AWQ's scales and ReQuant's sparse part */
    {"SFMP+AWQ+ReQuant", "SFMP 3.25 g128 + AWQ + ReQuant", "--method sfmp --bpw 3.25 --quantizer awq --requant", 0},
    {"SFMP+AWQ+ReQuant", "SFMP 4.00 g128 + AWQ + ReQuant", "--method sfmp --bpw 4 --quantizer awq --requant", 0},
};
enum { LLM_NROWS = (int)(sizeof llm_rows / sizeof llm_rows[0]) };

/* The options every row adds: the token embedding (also the output head
   of SmolLM2) at 8 bits, as llama.cpp keeps it at Q8_0. */
#define LLM_ROW_COMMON "--embed-bits 8"

/* What the recipe's callbacks see: the model the maps go into, and the
   caller's progress. */
typedef struct llm_row_io {
    mpq_llm *m;
    void (*progress)(void *user, const char *step, int done, int total, const char *name);
    void *user;
} llm_row_io;

static inline mpq_status llm_row_store(void *user, int i, mpq_packed *A)
{
    mpq_llm *m = ((llm_row_io *)user)->m;
    return mpq_linear_set_packed(m, &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT], A);
}

static inline void llm_row_progress(void *user, const char *step, int done, int total, const char *name)
{
    const llm_row_io *r = (const llm_row_io *)user;
    if (r->progress) r->progress(r->user, step, done, total, name);
}

/* Quantizes every linear map of m's layers (and, at --embed-bits, its
   embedding) as `args` say, with the statistics S (mpq calibrate) and Hs
   (X^T X, mpq calibrate --stats xtx); the packed matrices go into m.
   progress (may be NULL) sees the recipe's steps. *res: the recipe's
   result, *bpw (may be NULL): the planner's budget after --bpw min. 0, or
   an exit code after a message. */
static inline int llm_row_quantize(const char *args, mpq_llm *m, const mpq_calib_stats *S, const mpq_calib_stats *Hs,
                                   void (*progress)(void *, const char *, int, int, const char *), void *user,
                                   mpq_recipe_result *res, double *bpw)
{
    char buf[512];
    char *argv[64];
    int argc = 0;
    snprintf(buf, sizeof buf, "quantize %s %s IN OUT", args, LLM_ROW_COMMON);
    for (char *t = strtok(buf, " "); t && argc < 63; t = strtok(NULL, " ")) argv[argc++] = t;
    qargs q;
    const char *pos[2];
    int npos = 0;
    cli_seen seen;
    mpq_recipe r;
    int rc = cli_parse(&qargs_spec, argc, argv, &q, sizeof q, pos, &npos, &seen);
    if (!rc) rc = qargs_recipe(&q, &seen, &r);
    if (rc) return rc < 0 ? EXIT_USAGE : rc;
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
        p->pqi = S->pqi ? S->pqi[i] : NULL;
        p->fisher = S->fisher ? S->fisher[i] : NULL;
        p->channel = S->mixllm ? S->mixllm[i] : NULL;
        p->col_sens = S->xtx_diag ? S->xtx_diag[i] : NULL;
        p->layer_sens = S->layer_sens ? S->layer_sens[i] : 1.0f;
    }
    if (!rc) rc = qargs_budget(&q, &r, maps, n);
    if (!rc) {
        llm_row_io ri = {m, progress, user};
        mpq_recipe_io io = {NULL, NULL, llm_row_store, llm_row_progress, &ri};
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
    return rc;
}

#endif
