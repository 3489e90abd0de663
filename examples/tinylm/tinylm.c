/* tinylm: every method of mpq measured end to end on a small trained
   transformer (examples/tinylm/tinylm.safetensors, trained by train.c).

   usage: tinylm [--model FILE] [--out DIR] [--threads T]

   1. Statistics from 16 calibration windows of training text: per-sample
      gradients give the Fisher diagonal (SFMP) and MixLLM's channel
      salience; forward activations give diag(X^T X) (MXSens) and AWQ's
      calibration tokens; quantizing one layer at a time gives MXSens's layer
      sensitivity; the PQI (ReQuant) integrates gradients along W -> Q(W).
   2. Every method quantizes the 28 linear maps (embedding, norms and head
      stay fp16): RTN 2/3/4 bits, AWQ 3/4, SFMP at 2.25/2.5/3/3.5 bpw with and
      without row+column reordering, MixLLM with 10 % and 20 % 8-bit
      channels, MXINT4 and MXSens, ReQuant on RTN 3 and AWQ 3, and PMPD
      (prompt at 4 bits, decoding lowered by a schedule).
   3. Each is measured on held-out text (seed 1001, never trained on):
      perplexity per byte over the second half of 64 windows of 128 bytes
      (the first half is the prompt), and exact-match accuracy on 240
      arithmetic and 80 recall prompts, greedily decoded.
   Writes DIR/results.md (the table) and DIR/ppl_vs_bpw.svg (the plot);
   DIR defaults to build/tinylm. */
#define _POSIX_C_SOURCE 200809L
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "ckpt.h"
#include "eval.h"
#include "plot.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

enum { NCAL = 16, NHELD = 64, NARITH = 240, NRECALL = 80, AWQ_TOKENS = 256 };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check(mpq_status st, const char *what)
{
    if (st != MPQ_OK) {
        fprintf(stderr, "tinylm: %s: %s\n", what, mpq_status_str(st));
        exit(1);
    }
}

#define NLIN_ALL (TLM_MAX_LAYERS * TLM_NLIN)

typedef struct ctx {
    tlm_model m;
    const tlm_config *c;
    int nl; /* linear maps: layers x 7 */
    /* calibration and held-out data */
    uint8_t *ctok;
    int *ctgt;
    uint8_t *htok;
    int *htgt;
    tlm_task task;
    /* statistics per linear map (index l * 7 + w) */
    float *fisher[NLIN_ALL], *rowsal[NLIN_ALL], *colsens[NLIN_ALL], *X[NLIN_ALL];
    float layer_sens[NLIN_ALL];
    int xtok;
    float *W0[NLIN_ALL]; /* the trained weights of each linear map */
} ctx;

static int rows_of(const ctx *C, int i) { return tlm_lin_rows(C->c, i % TLM_NLIN); }
static int cols_of(const ctx *C, int i) { return tlm_lin_cols(C->c, i % TLM_NLIN); }
static size_t n_of(const ctx *C, int i) { return (size_t)rows_of(C, i) * cols_of(C, i); }
static float **wslot(ctx *C, int i) { return &C->m.p.w[i / TLM_NLIN][i % TLM_NLIN]; }

/* ---- statistics -------------------------------------------------------------- */

typedef struct capture {
    ctx *C;
    mpq_stat H[NLIN_ALL];
} capture;

static void capture_hook(void *user, const tlm_model *m, int l, int w, const real *x, real *y, int M)
{
    capture *cap = (capture *)user;
    ctx *C = cap->C;
    const int i = l * TLM_NLIN + w, cols = tlm_lin_cols(&m->c, w);
    check(mpq_hessian_diag_add(&cap->H[i], x, M, cols), "diag(X^T X)");
    /* AWQ's calibration tokens: evenly spaced rows */
    for (int k = 0; k < AWQ_TOKENS; k++)
        memcpy(C->X[i] + (size_t)k * cols, x + (size_t)(k * (M / AWQ_TOKENS)) * cols, sizeof(float) * cols);
    tlm_mm(x, m->p.w[l][w], y, M, tlm_lin_rows(&m->c, w), cols, 0);
}

/* The loss of the model as it is now on B calibration windows. */
static double calib_loss(ctx *C, int B, tlm_acts *a) { return tlm_forward(&C->m, C->ctok, C->ctgt, a, B); }

static mpq_packed rtn(const ctx *C, int i, const float *W, int bits, int format)
{
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    d.rows = rows_of(C, i), d.cols = cols_of(C, i), d.uniform_bits = bits, d.format = format;
    mpq_packed A;
    check(mpq_pack_alloc(&d, W, &A), "rtn");
    return A;
}

static void statistics(ctx *C)
{
    const tlm_config *c = C->c;
    double t0 = now();
    /* activations */
    capture cap;
    memset(&cap, 0, sizeof cap);
    cap.C = C;
    for (int i = 0; i < C->nl; i++) {
        check(mpq_stat_init(&cap.H[i], (size_t)cols_of(C, i)), "stat");
        C->X[i] = (float *)malloc(sizeof(float) * AWQ_TOKENS * cols_of(C, i));
        C->colsens[i] = (float *)malloc(sizeof(float) * cols_of(C, i));
    }
    tlm_acts a;
    if (tlm_acts_alloc(c, NCAL, &a)) exit(1);
    C->m.hook = capture_hook, C->m.hook_user = &cap;
    const double base = calib_loss(C, NCAL, &a);
    C->m.hook = NULL;
    for (int i = 0; i < C->nl; i++) {
        check(mpq_stat_sum(&cap.H[i], C->colsens[i]), "diag(X^T X)");
        mpq_stat_free(&cap.H[i]);
    }
    C->xtok = AWQ_TOKENS;
    /* per-sample gradients: Fisher diagonal and MixLLM salience (delta of
       4-bit RTN, its low width) */
    mpq_stat F[NLIN_ALL], S[NLIN_ALL];
    float *D[NLIN_ALL];
    for (int i = 0; i < C->nl; i++) {
        check(mpq_stat_init(&F[i], n_of(C, i)), "stat");
        check(mpq_stat_init(&S[i], (size_t)rows_of(C, i)), "stat");
        mpq_packed A = rtn(C, i, C->W0[i], 4, MPQ_FORMAT_BITPLANE);
        D[i] = (float *)malloc(sizeof(float) * n_of(C, i));
        check(mpq_packed_dequantize(&A, 0, D[i]), "dequantize");
        for (size_t k = 0; k < n_of(C, i); k++) D[i][k] -= C->W0[i][k];
        mpq_packed_free(&A);
    }
    tlm_acts a1;
    tlm_grad_work gw;
    tlm_params g;
    if (tlm_acts_alloc(c, 1, &a1) || tlm_grad_work_alloc(c, 1, &gw) || tlm_params_alloc(c, &g)) exit(1);
    for (int s = 0; s < NCAL; s++) {
        const uint8_t *tok = C->ctok + (size_t)s * c->seq;
        const int *tgt = C->ctgt + (size_t)s * c->seq;
        memset(g.data, 0, sizeof(real) * g.n);
        tlm_forward(&C->m, tok, tgt, &a1, 1);
        tlm_backward(&C->m, tok, tgt, &a1, &g, &gw, 1);
        for (int i = 0; i < C->nl; i++) {
            const float *gi = g.w[i / TLM_NLIN][i % TLM_NLIN];
            check(mpq_fisher_add(&F[i], gi, n_of(C, i)), "fisher");
            check(mpq_mixllm_add(&S[i], gi, D[i], rows_of(C, i), cols_of(C, i)), "mixllm salience");
        }
    }
    for (int i = 0; i < C->nl; i++) {
        C->fisher[i] = (float *)malloc(sizeof(float) * n_of(C, i));
        C->rowsal[i] = (float *)malloc(sizeof(float) * rows_of(C, i));
        check(mpq_stat_mean(&F[i], C->fisher[i]), "fisher");
        check(mpq_stat_mean(&S[i], C->rowsal[i]), "salience");
        mpq_stat_free(&F[i]);
        mpq_stat_free(&S[i]);
        free(D[i]);
    }
    tlm_acts_free(&a1);
    tlm_grad_work_free(&gw);
    tlm_params_free(&g);
    /* MXSens layer sensitivity: output error (mean squared change of the
       logits) with one linear map at MXINT4, the others as trained */
    const int B = 4;
    const size_t nlog = (size_t)B * c->seq * TLM_VOCAB;
    float *ref = (float *)malloc(sizeof(float) * nlog);
    calib_loss(C, B, &a);
    memcpy(ref, a.logits, sizeof(float) * nlog);
    double err[NLIN_ALL];
    for (int i = 0; i < C->nl; i++) {
        mpq_packed A = rtn(C, i, C->W0[i], 4, MPQ_FORMAT_MXINT);
        float *Wq = (float *)malloc(sizeof(float) * n_of(C, i));
        check(mpq_packed_dequantize(&A, 0, Wq), "dequantize");
        *wslot(C, i) = Wq;
        calib_loss(C, B, &a);
        *wslot(C, i) = C->W0[i];
        double e = 0;
        for (size_t k = 0; k < nlog; k++) e += ((double)a.logits[k] - ref[k]) * ((double)a.logits[k] - ref[k]);
        err[i] = e / (double)nlog;
        free(Wq);
        mpq_packed_free(&A);
    }
    check(mpq_mxsens_layer_sensitivity(err, C->nl, C->layer_sens), "layer sensitivity");
    free(ref);
    tlm_acts_free(&a);
    printf("statistics: %d calibration windows, loss %.4f; Fisher, MixLLM salience, diag(X^T X), layer sensitivity "
           "(%.1f s)\n",
           NCAL, base, now() - t0);
}

/* ---- methods ----------------------------------------------------------------- */

typedef struct row {
    char name[48], family[16];
    double bpw;
    tlm_result r;
    double seconds;
} row;

static row rows[64];
static int nrows;

static void measure(ctx *C, const char *family, const char *name, tlm_qmodel *q, const mpq_pmpd_schedule *sched,
                    double bpw)
{
    const double t0 = now();
    if (q && tlm_qmodel_dequantize(q, C->c, sched ? 3 : 1)) {
        fprintf(stderr, "tinylm: out of memory\n");
        exit(1);
    }
    row *r = &rows[nrows++];
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->family, sizeof r->family, "%s", family);
    r->bpw = bpw;
    r->r = tlm_evaluate(&C->m, q, sched, 0, C->htok, C->htgt, NHELD, &C->task);
    r->seconds = now() - t0;
    printf("  %-30s %6.3f bpw   ppl %.4f   arith %5.1f %%   recall %5.1f %%   (%.1f s)\n", name, bpw, r->r.ppl,
           100 * r->r.arith, 100 * r->r.recall, r->seconds);
    fflush(stdout);
}

/* AWQ's column scales and clips for linear i at `bits` (g128), from its
   calibration tokens; the caller frees *cs and *clip. */
static void awq_scales(const ctx *C, int i, int bits, float **cs, float **clip)
{
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    d.rows = rows_of(C, i), d.cols = cols_of(C, i), d.uniform_bits = bits;
    *cs = (float *)malloc(sizeof(float) * d.cols);
    *clip = (float *)malloc(sizeof(float) * d.rows * ((d.cols + 127) / 128));
    mpq_awq_desc a;
    memset(&a, 0, sizeof a);
    a.X = C->X[i], a.tokens = C->xtok;
    check(*cs && *clip ? mpq_awq_search(&d, C->W0[i], &a, *cs, *clip, NULL) : MPQ_ERR_NOMEM, "awq");
}

static void quant_uniform(ctx *C, tlm_qmodel *q, int bits, int awq)
{
    for (int i = 0; i < C->nl; i++) {
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.rows = rows_of(C, i), d.cols = cols_of(C, i), d.uniform_bits = bits;
        float *cs = NULL, *clip = NULL;
        if (awq) awq_scales(C, i, bits, &cs, &clip);
        d.col_scale = cs, d.clip = clip;
        check(mpq_pack_alloc(&d, C->W0[i], &q->A[i / TLM_NLIN][i % TLM_NLIN]), "pack");
        free(cs), free(clip);
    }
}

/* Pack every linear map as the plan says, measure, release (not the plan). */
static void measure_plan(ctx *C, const char *family, const char *name, const mpq_plan *p)
{
    tlm_qmodel q;
    memset(&q, 0, sizeof q);
    for (int i = 0; i < C->nl; i++) {
        mpq_bitplane_desc d;
        check(mpq_plan_desc(p, i, &d), "plan");
        check(mpq_pack_alloc(&d, C->W0[i], &q.A[i / TLM_NLIN][i % TLM_NLIN]), "pack");
    }
    measure(C, family, name, &q, NULL, tlm_qmodel_bpw(&q, C->c, -1));
    tlm_qmodel_free(&q, C->c);
}

static void run_rtn_awq(ctx *C)
{
    for (int awq = 0; awq < 2; awq++)
        for (int bits = awq ? 3 : 2; bits <= 4; bits++) {
            tlm_qmodel q;
            memset(&q, 0, sizeof q);
            quant_uniform(C, &q, bits, awq);
            char name[48];
            snprintf(name, sizeof name, "%s %d-bit g128", awq ? "AWQ" : "RTN", bits);
            measure(C, awq ? "AWQ" : "RTN", name, &q, NULL, tlm_qmodel_bpw(&q, C->c, -1));
            tlm_qmodel_free(&q, C->c);
        }
}

static void run_sfmp(ctx *C)
{
    const double budgets[4] = {2.25, 2.5, 3.0, 3.5};
    mpq_sfmp_layer L[NLIN_ALL];
    for (int i = 0; i < C->nl; i++) L[i].S = C->fisher[i], L[i].rows = rows_of(C, i), L[i].cols = cols_of(C, i);
    for (int re = 0; re < 2; re++)
        for (int b = 0; b < 4; b++) {
            mpq_sfmp_desc d;
            memset(&d, 0, sizeof d);
            d.bpw = budgets[b], d.reorder = re ? MPQ_REORDER_BOTH : MPQ_REORDER_NONE;
            mpq_plan p;
            check(mpq_plan_sfmp(L, C->nl, &d, &p), "sfmp plan");
            char name[48];
            snprintf(name, sizeof name, "SFMP %.2f%s", budgets[b], re ? " reordered" : "");
            measure_plan(C, re ? "SFMP+reorder" : "SFMP", name, &p);
            mpq_plan_free(&p);
        }
}

static void run_mixllm(ctx *C)
{
    mpq_mixllm_layer L[NLIN_ALL];
    for (int i = 0; i < C->nl; i++) L[i].salience = C->rowsal[i], L[i].rows = rows_of(C, i), L[i].cols = cols_of(C, i);
    for (int k = 1; k <= 2; k++) {
        mpq_mixllm_desc d;
        memset(&d, 0, sizeof d);
        d.fraction = 0.1 * k;
        mpq_plan p;
        check(mpq_plan_mixllm(L, C->nl, &d, &p), "mixllm plan");
        char name[48];
        snprintf(name, sizeof name, "MixLLM %d%% 8-bit", 10 * k);
        measure_plan(C, "MixLLM", name, &p);
        mpq_plan_free(&p);
    }
}

static void run_mx(ctx *C)
{
    tlm_qmodel q;
    memset(&q, 0, sizeof q);
    for (int i = 0; i < C->nl; i++) q.A[i / TLM_NLIN][i % TLM_NLIN] = rtn(C, i, C->W0[i], 4, MPQ_FORMAT_MXINT);
    measure(C, "MXINT", "MXINT4 (RTN)", &q, NULL, tlm_qmodel_bpw(&q, C->c, -1));
    tlm_qmodel_free(&q, C->c);
    mpq_mxsens_layer L[NLIN_ALL];
    for (int i = 0; i < C->nl; i++)
        L[i].col_sens = C->colsens[i], L[i].layer_sens = C->layer_sens[i], L[i].rows = rows_of(C, i),
        L[i].cols = cols_of(C, i);
    /* 4.25 asks for every column at 4 bits; the top 32 columns of every
       layer at 8 bits cost more, so the budget rises to the first the
       planner can meet (then one step above it, where 6-bit columns appear) */
    double budget = 4.25, R = 0;
    mpq_plan p;
    mpq_status st;
    while ((st = mpq_plan_mxsens(L, C->nl, budget, &p, &R)) == MPQ_ERR_RANGE && budget < 8) budget += 0.05;
    check(st, "mxsens plan");
    for (int k = 0; k < 2; k++) {
        if (k) {
            mpq_plan_free(&p);
            budget += 0.25;
            check(mpq_plan_mxsens(L, C->nl, budget, &p, &R), "mxsens plan");
        }
        char name[48];
        snprintf(name, sizeof name, "MXSens %.2f", budget);
        measure_plan(C, "MXSens", name, &p);
    }
    mpq_plan_free(&p);
}

/* ---- ReQuant -------------------------------------------------------------------- */

typedef struct rq {
    ctx *C;
    int awq;
    float *cs[NLIN_ALL], *clip[NLIN_ALL];
    size_t offs[NLIN_ALL + 1];
    tlm_acts a;
    tlm_grad_work gw;
    tlm_params g;
    int B;
} rq;

/* The dense part of linear i for weights W (RTN 3 or AWQ 3 with the scales
   and clips found on the trained weights). */
static mpq_packed rq_dense(rq *R, int i, const float *W, const mpq_sparse *sp)
{
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    d.rows = rows_of(R->C, i), d.cols = cols_of(R->C, i), d.uniform_bits = 3;
    if (R->awq) d.col_scale = R->cs[i], d.clip = R->clip[i];
    d.sparse = sp;
    mpq_packed A;
    check(mpq_pack_alloc(&d, W, &A), "requant pack");
    return A;
}

/* Gradient of the calibration loss at weights w (all linear maps, one
   vector) for mpq_pqi. */
static mpq_status rq_grad(void *user, const float *w, float *grad, size_t n)
{
    rq *R = (rq *)user;
    ctx *C = R->C;
    (void)n;
    for (int i = 0; i < C->nl; i++) *wslot(C, i) = (float *)(uintptr_t)(w + R->offs[i]);
    memset(R->g.data, 0, sizeof(real) * R->g.n);
    tlm_forward(&C->m, C->ctok, C->ctgt, &R->a, R->B);
    tlm_backward(&C->m, C->ctok, C->ctgt, &R->a, &R->g, &R->gw, R->B);
    for (int i = 0; i < C->nl; i++) {
        memcpy(grad + R->offs[i], R->g.w[i / TLM_NLIN][i % TLM_NLIN], sizeof(float) * n_of(C, i));
        *wslot(C, i) = C->W0[i];
    }
    return MPQ_OK;
}

/* Sparse part of layer i from a mask: pack the dense part of W with the
   masked weights at 0, then store W - dense there. */
static mpq_packed rq_layer(rq *R, int i, const uint8_t *mask)
{
    const size_t n = n_of(R->C, i);
    float *Wz = (float *)malloc(sizeof(float) * n), *D = (float *)malloc(sizeof(float) * n);
    for (size_t k = 0; k < n; k++) Wz[k] = mask[k] ? 0.0f : R->C->W0[i][k];
    mpq_packed A = rq_dense(R, i, Wz, NULL);
    check(mpq_packed_dequantize(&A, 0, D), "dequantize");
    mpq_packed_free(&A);
    mpq_sparse S;
    check(mpq_sparse_from_mask(R->C->W0[i], D, mask, rows_of(R->C, i), cols_of(R->C, i), &S), "sparse part");
    A = rq_dense(R, i, Wz, &S);
    mpq_sparse_free(&S);
    free(Wz), free(D);
    return A;
}

static mpq_status rq_loss(void *user, const size_t *counts, int nl, double *loss)
{
    rq *R = (rq *)user;
    ctx *C = R->C;
    float *Wd[NLIN_ALL];
    for (int i = 0; i < nl; i++) {
        uint8_t *mask = (uint8_t *)calloc(n_of(C, i), 1);
        check(mpq_requant_outliers(C->W0[i], n_of(C, i), counts[i], mask), "outliers");
        mpq_packed A = rq_layer(R, i, mask);
        Wd[i] = (float *)malloc(sizeof(float) * n_of(C, i));
        check(mpq_packed_dequantize(&A, 0, Wd[i]), "dequantize");
        mpq_packed_free(&A);
        free(mask);
        *wslot(C, i) = Wd[i];
    }
    *loss = calib_loss(C, R->B, &R->a);
    for (int i = 0; i < nl; i++) *wslot(C, i) = C->W0[i], free(Wd[i]);
    return MPQ_OK;
}

typedef struct rq_refresh_ctx {
    rq *R;
    float *w, *wq;
} rq_refresh_ctx;

static mpq_status rq_refresh(void *user, mpq_requant_layer *L, int nl)
{
    rq_refresh_ctx *X = (rq_refresh_ctx *)user;
    rq *R = X->R;
    for (int i = 0; i < nl; i++) memcpy(X->wq + R->offs[i], L[i].Wq, sizeof(float) * L[i].n);
    float *v = (float *)malloc(sizeof(float) * R->offs[nl]);
    mpq_status st = mpq_pqi(X->w, X->wq, R->offs[nl], 2, rq_grad, R, v);
    for (int i = 0; st == MPQ_OK && i < nl; i++) memcpy(L[i].v, v + R->offs[i], sizeof(float) * L[i].n);
    free(v);
    return st;
}

static void run_requant(ctx *C, int awq)
{
    const double t0 = now();
    rq R;
    memset(&R, 0, sizeof R);
    R.C = C, R.awq = awq, R.B = 8;
    if (tlm_acts_alloc(C->c, R.B, &R.a) || tlm_grad_work_alloc(C->c, R.B, &R.gw) || tlm_params_alloc(C->c, &R.g))
        exit(1);
    for (int i = 0; i < C->nl; i++) {
        R.offs[i + 1] = R.offs[i] + n_of(C, i);
        if (awq) awq_scales(C, i, 3, &R.cs[i], &R.clip[i]);
    }
    const size_t N = R.offs[C->nl];
    float *w = (float *)malloc(sizeof(float) * N), *wq = (float *)malloc(sizeof(float) * N);
    float *v = (float *)malloc(sizeof(float) * N);
    for (int i = 0; i < C->nl; i++) {
        memcpy(w + R.offs[i], C->W0[i], sizeof(float) * n_of(C, i));
        mpq_packed A = rq_dense(&R, i, C->W0[i], NULL);
        check(mpq_packed_dequantize(&A, 0, wq + R.offs[i]), "dequantize");
        mpq_packed_free(&A);
    }
    /* 1. PQI along W -> Q(W), every linear map at once; each layer's mean dF */
    check(mpq_pqi(w, wq, N, 4, rq_grad, &R, v), "pqi");
    double dF[NLIN_ALL];
    for (int i = 0; i < C->nl; i++) {
        double layer = 0;
        check(mpq_pqi_delta(v + R.offs[i], w + R.offs[i], wq + R.offs[i], rows_of(C, i), cols_of(C, i), 16, 128, NULL,
                            NULL, NULL, NULL, &layer),
              "pqi delta");
        dF[i] = layer / (double)n_of(C, i);
        if (dF[i] < 0) dF[i] = 0;
    }
    /* 2. outlier counts (eq. 9, t by grid search: algorithm 1), r_o = 0.25 % */
    mpq_plan p;
    memset(&p, 0, sizeof p);
    p.nlayers = C->nl;
    p.layers = (mpq_layer_plan *)calloc((unsigned)C->nl, sizeof *p.layers);
    for (int i = 0; i < C->nl; i++) {
        mpq_layer_plan *L = &p.layers[i];
        L->rows = rows_of(C, i), L->cols = cols_of(C, i), L->group = 128, L->block_rows = 16;
        L->format = MPQ_FORMAT_BITPLANE;
        const size_t nb = (size_t)((L->rows + 15) / 16) * ((L->cols + 127) / 128);
        L->bits = (uint8_t *)malloc(nb);
        memset(L->bits, 3, nb);
        L->weight_bits = 3.0 * n_of(C, i), L->meta_bits = 32.0 * L->rows * ((L->cols + 127) / 128);
    }
    double t_best = 0;
    check(mpq_plan_requant(&p, dF, 0.0025, 0.25, rq_loss, &R, &t_best), "requant plan");
    /* 3. masks: outliers, then 4. significant weights (algorithm 2), another 0.25 % */
    mpq_requant_layer L[NLIN_ALL];
    uint8_t *mask[NLIN_ALL];
    float *Wq[NLIN_ALL], *vv[NLIN_ALL];
    size_t total = 0;
    for (int i = 0; i < C->nl; i++) {
        const size_t n = n_of(C, i);
        mask[i] = (uint8_t *)calloc(n, 1);
        check(mpq_requant_outliers(C->W0[i], n, p.layers[i].outliers, mask[i]), "outliers");
        mpq_packed A = rq_layer(&R, i, mask[i]);
        Wq[i] = (float *)malloc(sizeof(float) * n);
        vv[i] = (float *)malloc(sizeof(float) * n);
        check(mpq_packed_dequantize(&A, 0, Wq[i]), "dequantize");
        mpq_packed_free(&A);
        L[i].W = C->W0[i], L[i].Wq = Wq[i], L[i].v = vv[i], L[i].mask = mask[i], L[i].n = n;
        total += n;
    }
    rq_refresh_ctx X = {&R, w, wq};
    check(mpq_requant_significant(L, C->nl, (size_t)(0.0025 * (double)total), 2, rq_refresh, &X), "significant");
    tlm_qmodel q;
    memset(&q, 0, sizeof q);
    for (int i = 0; i < C->nl; i++) q.A[i / TLM_NLIN][i % TLM_NLIN] = rq_layer(&R, i, mask[i]);
    printf("  (ReQuant on %s: PQI, t = %.2f by grid search, 0.25 %% outliers + 0.25 %% significant weights; %.1f s)\n",
           awq ? "AWQ 3" : "RTN 3", t_best, now() - t0);
    measure(C, "ReQuant", awq ? "AWQ 3-bit + ReQuant" : "RTN 3-bit + ReQuant", &q, NULL, tlm_qmodel_bpw(&q, C->c, -1));
    tlm_qmodel_free(&q, C->c);
    for (int i = 0; i < C->nl; i++) free(mask[i]), free(Wq[i]), free(vv[i]), free(R.cs[i]), free(R.clip[i]);
    mpq_plan_free(&p);
    free(w), free(wq), free(v);
    tlm_acts_free(&R.a);
    tlm_grad_work_free(&R.gw);
    tlm_params_free(&R.g);
}

/* ---- PMPD ------------------------------------------------------------------------ */

static void run_pmpd(ctx *C)
{
    tlm_qmodel q;
    memset(&q, 0, sizeof q);
    quant_uniform(C, &q, 4, 0);
    const double bits[3] = {tlm_qmodel_bpw(&q, C->c, 0), tlm_qmodel_bpw(&q, C->c, 1), tlm_qmodel_bpw(&q, C->c, 2)};
    /* phase-aware: prompt at 4 bits, every decoded token at 3 */
    mpq_pmpd_schedule s;
    memset(&s, 0, sizeof s);
    s.prefill_skip = 0, s.nlevels = 1, s.skip[0] = 1;
    double avg;
    const long decode = C->c->seq / 2; /* the measured half of each window */
    check(mpq_pmpd_average_bits(&s, bits, decode, &avg), "pmpd");
    measure(C, "PMPD", "PMPD 4-bit prompt, 3-bit decode", &q, &s, avg);
    /* progressive: 4 -> 3 -> 2 bits over the decoded tokens */
    s.nlevels = 3, s.skip[0] = 0, s.skip[1] = 1, s.skip[2] = 2, s.start[0] = 0, s.start[1] = 4, s.start[2] = 32;
    check(mpq_pmpd_average_bits(&s, bits, decode, &avg), "pmpd");
    measure(C, "PMPD", "PMPD 4->3->2 (switch 4, 32)", &q, &s, avg);
    tlm_qmodel_free(&q, C->c);
}

/* ---- output ------------------------------------------------------------------------- */

/* dir/name opened for writing (its path in p), or the program ends. */
static FILE *open_output(const char *dir, const char *name, char *p, size_t cap)
{
    snprintf(p, cap, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (!f) {
        fprintf(stderr, "tinylm: cannot write %s: %s\n", p, strerror(errno));
        exit(1);
    }
    return f;
}

static void write_table(const char *dir, const char *model)
{
    char p[1024];
    FILE *f = open_output(dir, "results.md", p, sizeof p);
    fprintf(f,
            "| method | bpw | held-out ppl | bits/byte | arithmetic | recall |\n| --- | ---: | ---: | ---: | ---: | "
            "---: |\n");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        fprintf(f, "| %s | %.3f | %.4f | %.4f | %.1f %% | %.1f %% |\n", r->name, r->bpw, r->r.ppl, r->r.nll / log(2.0),
                100 * r->r.arith, 100 * r->r.recall);
    }
    fprintf(f,
            "\nModel `%s`; bpw over the 28 linear maps (scales, sparse parts included; PMPD: the "
            "average over decoded tokens); perplexity per byte on the second half of %d held-out windows "
            "of 128 bytes; exact match on %d arithmetic and %d recall prompts.\n",
            model, NHELD, NARITH, NRECALL);
    fclose(f);
    printf("wrote %s\n", p);
}

/* Perplexity against bpw, one polyline per family (SFMP's figure 1). */
static void write_plot(const char *dir)
{
    char p[1024];
    FILE *f = open_output(dir, "ppl_vs_bpw.svg", p, sizeof p);
    plot_point pts[64];
    for (int i = 0; i < nrows; i++)
        pts[i].family = rows[i].family, pts[i].bpw = rows[i].bpw, pts[i].ppl = rows[i].r.ppl;
    plot_ppl_vs_bpw(f, pts, nrows, "bits per weight (linear maps)", "held-out perplexity per byte (log scale)",
                    "fp16 weights");
    fclose(f);
    printf("wrote %s\n", p);
}

int main(int argc, char **argv)
{
    const char *model = "examples/tinylm/tinylm.safetensors", *out = "build/tinylm";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
#ifdef _OPENMP
            omp_set_num_threads(atoi(argv[i + 1]));
#endif
            i++;
        } else {
            const int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            fprintf(help ? stdout : stderr,
                    "usage: %s [--model FILE] [--out DIR] [--threads T]\n"
                    "Measures every method of mpq on a small trained transformer: held-out perplexity,\n"
                    "task accuracy and bits per weight; writes DIR/results.md and DIR/ppl_vs_bpw.svg\n"
                    "(DIR: build/tinylm, FILE: examples/tinylm/tinylm.safetensors).\n",
                    argv[0]);
            return help ? 0 : 1;
        }
    }
    const double t0 = now();
    ctx C;
    memset(&C, 0, sizeof C);
    if (tlm_load(&C.m, model)) return 1;
    C.c = &C.m.c;
    const tlm_config *c = C.c;
    C.nl = c->layers * TLM_NLIN;
    printf("tinylm: %s: dim %d, %d layers, %d heads, ffn %d, %zu parameters\n", model, c->dim, c->layers, c->heads,
           c->ffn, C.m.p.n);
    for (int i = 0; i < C.nl; i++) C.W0[i] = *wslot(&C, i);
    /* data: calibration windows from the training text (seed 1), held-out
       windows and prompts from seeds the training never saw */
    char *train = tlm_corpus(1, (size_t)1 << 20), *held = tlm_corpus(1001, (size_t)1 << 20);
    C.ctok = (uint8_t *)malloc((size_t)NCAL * c->seq), C.ctgt = (int *)malloc(sizeof(int) * NCAL * (size_t)c->seq);
    C.htok = (uint8_t *)malloc((size_t)NHELD * c->seq), C.htgt = (int *)malloc(sizeof(int) * NHELD * (size_t)c->seq);
    tlm_windows(train, NCAL, c->seq, C.ctok, C.ctgt);
    tlm_windows(held, NHELD, c->seq, C.htok, C.htgt);
    for (int b = 0; b < NHELD; b++) /* the first half of each window is the prompt */
        for (int t = 0; t < c->seq / 2; t++) C.htgt[b * c->seq + t] = -1;
    tlm_task_make(&C.task, 2001, NARITH, NRECALL);
    free(train), free(held);
    mkdir("build", 0755);
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "tinylm: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    statistics(&C);
    printf("evaluating (perplexity on %d x %d held-out bytes, %d + %d prompts):\n", NHELD, c->seq / 2, NARITH, NRECALL);
    measure(&C, "fp16", "fp16 weights (as trained)", NULL, NULL, 16.0);
    run_rtn_awq(&C);
    run_sfmp(&C);
    run_mixllm(&C);
    run_mx(&C);
    run_requant(&C, 0);
    run_requant(&C, 1);
    run_pmpd(&C);
    write_table(out, model);
    write_plot(out);
    printf("total %.0f s\n", now() - t0);
    for (int i = 0; i < C.nl; i++) free(C.fisher[i]), free(C.rowsal[i]), free(C.colsens[i]), free(C.X[i]);
    free(C.ctok), free(C.ctgt), free(C.htok), free(C.htgt);
    tlm_task_free(&C.task);
    tlm_model_free(&C.m);
    return 0;
}
