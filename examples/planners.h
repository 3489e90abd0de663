/* planners.h - the demo's multi-layer part: every planner of mpq on one
   synthetic model, at equal bits per weight. Included once, by demo.c.

   The model is two transformer-like blocks of four linear layers (qkv, o,
   gate+up, down) with the weights of synth.h (heavy tails, outlier rows and
   columns). Its loss is planted, so that every method's result can be
   measured exactly: quantizing layer l to W^ costs

     F_l = lambda_l * mean over tokens t of sum_i rho_i ((W^ - W) x_t)_i^2

   where lambda_l is the layer's sensitivity (the first block and the value
   path matter more, as PQI's table 4 and MXSens's figures find) and rho_i
   is 1 for most output channels and 16 for 2 % of them (the salient rows).
   The salient columns are the massive activation channels of synth_tokens.
   Its Hessian diagonal, 2 lambda_l rho_i E[x_j^2], is what SFMP's Fisher
   salience estimates; MixLLM's channel salience is measured as the loss of
   quantizing that one channel to the low width (what its eq. 4 estimates);
   MXSens gets diag(X^T X) and its layer sensitivity from quantizing one
   layer at a time; ReQuant gets PQI from the exact gradient of F. Every
   figure is F = sum_l F_l on held-out tokens. */
#ifndef MPQ_DEMO_PLANNERS_H
#define MPQ_DEMO_PLANNERS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PL_LAYERS = 8, PL_CALIB = 128, PL_HELD = 64 };

typedef struct pl_layer {
    const char *name;
    int rows, cols;
    double lambda;
    float *W, *Xc, *Xh; /* weights; calibration and held-out tokens (tokens x cols) */
    float *rho;         /* rows */
    float *C;           /* cols x cols: calibration X^T X / tokens */
    uint8_t *salient;   /* rows: 1 for the planted salient rows */
} pl_layer;

typedef struct pl_model {
    pl_layer L[PL_LAYERS];
    int threads;
} pl_model;

static void pl_build(pl_model *M, uint64_t seed, int d)
{
    static const char *names[4] = {"qkv", "o", "gate_up", "down"};
    const int shape[4][2] = {{3 * d, d}, {d, d}, {4 * d, d}, {d, 2 * d}};
    const double lam[PL_LAYERS] = {3.0, 1.5, 2.0, 2.0, 1.0, 0.5, 0.8, 0.8};
    synth_rng r = {seed};
    for (int l = 0; l < PL_LAYERS; l++) {
        pl_layer *Ly = &M->L[l];
        Ly->name = names[l % 4];
        Ly->rows = shape[l % 4][0], Ly->cols = shape[l % 4][1], Ly->lambda = lam[l];
        const size_t m = (size_t)Ly->rows, n = (size_t)Ly->cols;
        Ly->W = malloc(sizeof(float) * m * n);
        Ly->Xc = malloc(sizeof(float) * PL_CALIB * n);
        Ly->Xh = malloc(sizeof(float) * PL_HELD * n);
        Ly->rho = malloc(sizeof(float) * m);
        Ly->salient = calloc(m, 1);
        Ly->C = calloc(n * n, sizeof(float));
        synth_weights(&r, Ly->W, (int)m, (int)n);
        synth_tokens(&r, Ly->Xc, PL_CALIB, (int)n, seed * 31 + (uint64_t)l);
        synth_tokens(&r, Ly->Xh, PL_HELD, (int)n, seed * 31 + (uint64_t)l); /* the same massive channels */
        for (size_t i = 0; i < m; i++) {
            Ly->salient[i] = synth_unif(&r) < 0.02;
            Ly->rho[i] = Ly->salient[i] ? 16.0f : 1.0f;
        }
        for (int t = 0; t < PL_CALIB; t++)
            for (size_t a = 0; a < n; a++) {
                const float xa = Ly->Xc[(size_t)t * n + a] / PL_CALIB;
                for (size_t b = 0; b < n; b++) Ly->C[a * n + b] += xa * Ly->Xc[(size_t)t * n + b];
            }
    }
}

static void pl_free(pl_model *M)
{
    for (int l = 0; l < PL_LAYERS; l++) {
        pl_layer *Ly = &M->L[l];
        free(Ly->W), free(Ly->Xc), free(Ly->Xh), free(Ly->rho), free(Ly->salient), free(Ly->C);
    }
}

/* F_l of the reconstruction Wh on tokens X (calibration or held-out). */
static double pl_loss(const pl_layer *Ly, const float *Wh, const float *X, int tokens)
{
    const int m = Ly->rows, n = Ly->cols;
    double F = 0;
#ifdef _OPENMP
#pragma omp parallel for reduction(+ : F) schedule(static)
#endif
    for (int i = 0; i < m; i++) {
        double fi = 0;
        const float *w = Ly->W + (size_t)i * n, *wh = Wh + (size_t)i * n;
        for (int t = 0; t < tokens; t++) {
            double s = 0;
            for (int j = 0; j < n; j++) s += ((double)wh[j] - w[j]) * X[(size_t)t * n + j];
            fi += s * s;
        }
        F += Ly->rho[i] * fi;
    }
    return Ly->lambda * F / tokens;
}

/* dF/dW at Wp for layer l: 2 lambda rho_i ((Wp - W) C)_ij (calibration). */
static void pl_grad(const pl_layer *Ly, const float *Wp, float *G)
{
    const int m = Ly->rows, n = Ly->cols;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int i = 0; i < m; i++) {
        float *g = G + (size_t)i * n;
        for (int j = 0; j < n; j++) g[j] = 0;
        for (int k = 0; k < n; k++) {
            const float dk = Wp[(size_t)i * n + k] - Ly->W[(size_t)i * n + k];
            if (dk == 0) continue;
            const float *c = Ly->C + (size_t)k * n;
            for (int j = 0; j < n; j++) g[j] += dk * c[j];
        }
        const float f = (float)(2.0 * Ly->lambda * Ly->rho[i]);
        for (int j = 0; j < n; j++) g[j] *= f;
    }
}

/* Packs layer l by d (with W0 in place of W when given), writes the
   reconstruction to Wh, returns the packed bits (level 2) of the layer. */
static double pl_pack(const pl_layer *Ly, const mpq_bitplane_desc *d, const float *W0, float *Wh)
{
    mpq_packed A;
    mpq_status st = mpq_pack_alloc(d, W0 ? W0 : Ly->W, &A);
    if (st == MPQ_OK) st = mpq_packed_dequantize(&A, 0, Wh);
    if (st != MPQ_OK) {
        fprintf(stderr, "planners: pack %s: %s\n", Ly->name, mpq_status_str(st));
        exit(1);
    }
    double bits = mpq_packed_bpw(&A, 2) * (double)Ly->rows * Ly->cols;
    mpq_packed_free(&A);
    return bits;
}

typedef struct pl_result {
    double bits, weights, F;
    double high_share[PL_LAYERS]; /* weights at the plan's high width, per layer */
    double salient_high;          /* salient rows' weights at the high width */
} pl_result;

static void pl_print(const char *name, const pl_result *r, double F_ref, int show_alloc)
{
    printf("  %-26s %6.3f %11.4g %8.3f", name, r->bits / r->weights, r->F, r->F / F_ref);
    if (show_alloc) {
        printf("   ");
        for (int l = 0; l < PL_LAYERS; l++) printf(" %3.0f", 100.0 * r->high_share[l]);
        printf("   %5.1f%%", 100.0 * r->salient_high);
    }
    printf("\n");
}

/* Evaluates a plan (one description per layer): packs, measures F on the
   held-out tokens, and records where the high width went. */
static void pl_eval_plan(const pl_model *M, const mpq_plan *P, int high, pl_result *r)
{
    memset(r, 0, sizeof *r);
    double sal_w = 0, sal_hi = 0;
    for (int l = 0; l < PL_LAYERS; l++) {
        const pl_layer *Ly = &M->L[l];
        mpq_bitplane_desc d;
        mpq_plan_desc(P, l, &d);
        float *Wh = malloc(sizeof(float) * Ly->rows * Ly->cols);
        r->bits += pl_pack(Ly, &d, NULL, Wh);
        r->weights += (double)Ly->rows * Ly->cols;
        r->F += pl_loss(Ly, Wh, Ly->Xh, PL_HELD);
        free(Wh);
        const mpq_layer_plan *LP = &P->layers[l];
        const int ng = (LP->cols + LP->group - 1) / LP->group;
        double hi = 0;
        for (int i = 0; i < LP->rows; i++) { /* packed row i is original row p_row[i] */
            int orow = LP->p_row ? (int)LP->p_row[i] : i;
            for (int g = 0; g < ng; g++) {
                int w = LP->bits[(size_t)(i / LP->block_rows) * ng + g];
                int cols = LP->cols - g * LP->group < LP->group ? LP->cols - g * LP->group : LP->group;
                if (w >= high) hi += cols;
                if (Ly->salient[orow]) sal_w += cols, sal_hi += w >= high ? cols : 0;
            }
        }
        r->high_share[l] = hi / ((double)LP->rows * LP->cols);
    }
    r->salient_high = sal_w > 0 ? sal_hi / sal_w : 0;
}

static void pl_die(const char *what, mpq_status st)
{
    fprintf(stderr, "planners: %s: %s\n", what, mpq_status_str(st));
    exit(1);
}

/* Uniform round-to-nearest at `bits`, group 128 (a plan with one width). */
static void pl_uniform(const pl_model *M, int bits, int format, mpq_plan *P)
{
    memset(P, 0, sizeof *P);
    P->nlayers = PL_LAYERS;
    P->layers = calloc(PL_LAYERS, sizeof(mpq_layer_plan));
    for (int l = 0; l < PL_LAYERS; l++) {
        mpq_layer_plan *LP = &P->layers[l];
        LP->rows = M->L[l].rows, LP->cols = M->L[l].cols, LP->format = format;
        LP->group = format == MPQ_FORMAT_MXINT ? 32 : 128, LP->block_rows = 16;
        size_t nb = (size_t)((LP->rows + 15) / 16) * (size_t)((LP->cols + LP->group - 1) / LP->group);
        LP->bits = malloc(nb);
        memset(LP->bits, bits, nb);
    }
}

static void pl_sfmp(const pl_model *M, double bpw, int reorder, mpq_plan *P)
{
    mpq_sfmp_layer in[PL_LAYERS];
    float *S[PL_LAYERS];
    for (int l = 0; l < PL_LAYERS; l++) {
        const pl_layer *Ly = &M->L[l];
        const int m = Ly->rows, n = Ly->cols;
        S[l] = malloc(sizeof(float) * m * n);
        for (int i = 0; i < m; i++) /* the Hessian diagonal of F */
            for (int j = 0; j < n; j++)
                S[l][(size_t)i * n + j] = (float)(2.0 * Ly->lambda * Ly->rho[i] * Ly->C[(size_t)j * n + j]);
        in[l] = (mpq_sfmp_layer){S[l], m, n};
    }
    mpq_sfmp_desc d;
    memset(&d, 0, sizeof d);
    d.bpw = bpw, d.group = 128, d.block_rows = 16, d.reorder = reorder;
    mpq_status st = mpq_plan_sfmp(in, PL_LAYERS, &d, P);
    if (st != MPQ_OK) pl_die("sfmp", st);
    for (int l = 0; l < PL_LAYERS; l++) free(S[l]);
}

static void pl_mixllm(const pl_model *M, double fraction, mpq_plan *P)
{
    mpq_mixllm_layer in[PL_LAYERS];
    float *sal[PL_LAYERS];
    for (int l = 0; l < PL_LAYERS; l++) {
        const pl_layer *Ly = &M->L[l];
        const int m = Ly->rows, n = Ly->cols;
        mpq_bitplane_desc d = {0};
        d.rows = m, d.cols = n, d.uniform_bits = 4;
        float *Wh = malloc(sizeof(float) * m * n);
        pl_pack(Ly, &d, NULL, Wh);
        sal[l] = malloc(sizeof(float) * m);
        for (int i = 0; i < m; i++) { /* the loss of this channel alone at 4 bits */
            double s = 0;
            for (int t = 0; t < PL_CALIB; t++) {
                double e = 0;
                for (int j = 0; j < n; j++)
                    e += ((double)Wh[(size_t)i * n + j] - Ly->W[(size_t)i * n + j]) * Ly->Xc[(size_t)t * n + j];
                s += e * e;
            }
            sal[l][i] = (float)(Ly->lambda * Ly->rho[i] * s / PL_CALIB);
        }
        free(Wh);
        in[l] = (mpq_mixllm_layer){sal[l], m, n};
    }
    mpq_mixllm_desc d;
    memset(&d, 0, sizeof d);
    d.fraction = fraction;
    mpq_status st = mpq_plan_mixllm(in, PL_LAYERS, &d, P);
    if (st != MPQ_OK) pl_die("mixllm", st);
    for (int l = 0; l < PL_LAYERS; l++) free(sal[l]);
}

static void pl_mxsens(const pl_model *M, double bpw, mpq_plan *P)
{
    double err[PL_LAYERS];
    float S[PL_LAYERS];
    float *cs[PL_LAYERS];
    for (int l = 0; l < PL_LAYERS; l++) { /* algorithm 3: one layer at MXINT4 at a time */
        const pl_layer *Ly = &M->L[l];
        mpq_bitplane_desc d = {0};
        d.rows = Ly->rows, d.cols = Ly->cols, d.format = MPQ_FORMAT_MXINT, d.uniform_bits = 4;
        float *Wh = malloc(sizeof(float) * Ly->rows * Ly->cols);
        pl_pack(Ly, &d, NULL, Wh);
        err[l] = pl_loss(Ly, Wh, Ly->Xc, PL_CALIB);
        free(Wh);
        mpq_stat st;
        cs[l] = malloc(sizeof(float) * Ly->cols);
        if (mpq_stat_init(&st, (size_t)Ly->cols) != MPQ_OK ||
            mpq_hessian_diag_add(&st, Ly->Xc, PL_CALIB, Ly->cols) != MPQ_OK || mpq_stat_sum(&st, cs[l]) != MPQ_OK)
            pl_die("mxsens statistics", MPQ_ERR_NOMEM);
        mpq_stat_free(&st);
    }
    mpq_status s = mpq_mxsens_layer_sensitivity(err, PL_LAYERS, S);
    if (s != MPQ_OK) pl_die("mxsens sensitivity", s);
    mpq_mxsens_layer in[PL_LAYERS];
    for (int l = 0; l < PL_LAYERS; l++) in[l] = (mpq_mxsens_layer){cs[l], S[l], M->L[l].rows, M->L[l].cols};
    s = mpq_plan_mxsens(in, PL_LAYERS, bpw, P, NULL);
    if (s != MPQ_OK) pl_die("mxsens", s);
    for (int l = 0; l < PL_LAYERS; l++) free(cs[l]);
}

/* ReQuant on a dense plan: the callbacks see the model through this. */
typedef struct pl_rq {
    const pl_model *M;
    const mpq_plan *P;
    float *G; /* gradient scratch, the largest layer */
} pl_rq;

static void pl_zeroed(const pl_layer *Ly, const uint8_t *mask, float *Wz)
{
    for (size_t k = 0; k < (size_t)Ly->rows * Ly->cols; k++) Wz[k] = mask[k] ? 0.0f : Ly->W[k];
}

static mpq_status pl_rq_loss(void *u, const size_t *counts, int nl, double *loss)
{
    pl_rq *q = (pl_rq *)u;
    *loss = 0;
    for (int l = 0; l < nl; l++) {
        const pl_layer *Ly = &q->M->L[l];
        const size_t n = (size_t)Ly->rows * Ly->cols;
        uint8_t *mask = malloc(n);
        float *Wz = malloc(4 * n), *Wh = malloc(4 * n);
        mpq_bitplane_desc d;
        mpq_plan_desc(q->P, l, &d);
        mpq_status st = mpq_requant_outliers(Ly->W, n, counts[l], mask);
        if (st != MPQ_OK) {
            free(mask), free(Wz), free(Wh);
            return st;
        }
        pl_zeroed(Ly, mask, Wz);
        pl_pack(Ly, &d, Wz, Wh);
        for (size_t k = 0; k < n; k++)
            if (mask[k]) Wh[k] = Ly->W[k]; /* W~ = Q(W - W_o) + W_o */
        *loss += pl_loss(Ly, Wh, Ly->Xc, PL_CALIB);
        free(mask), free(Wz), free(Wh);
    }
    return MPQ_OK;
}

typedef struct pl_gctx {
    const pl_layer *Ly;
} pl_gctx;

static mpq_status pl_grad_cb(void *u, const float *w, float *g, size_t n)
{
    pl_gctx *c = (pl_gctx *)u;
    (void)n;
    pl_grad(c->Ly, w, g);
    return MPQ_OK;
}

static mpq_status pl_rq_refresh(void *u, mpq_requant_layer *L, int nl)
{
    pl_rq *q = (pl_rq *)u;
    for (int l = 0; l < nl; l++) {
        pl_gctx c = {&q->M->L[l]};
        mpq_status st = mpq_pqi(L[l].W, L[l].Wq, L[l].n, 4, pl_grad_cb, &c, L[l].v);
        if (st != MPQ_OK) return st;
    }
    return MPQ_OK;
}

/* The ReQuant pipeline (mpq.h, section 11) on plan P with outlier ratio
   r_o and significant ratio r_s. */
static void pl_requant(const pl_model *M, mpq_plan *P, double r_o, double r_s, pl_result *r, double *t_best)
{
    pl_rq q = {M, P, NULL};
    double dF[PL_LAYERS];
    float *Wh[PL_LAYERS], *D[PL_LAYERS], *v[PL_LAYERS];
    uint8_t *mask[PL_LAYERS];
    mpq_requant_layer RL[PL_LAYERS];
    size_t total = 0;
    for (int l = 0; l < PL_LAYERS; l++) { /* 1. pre-quantize, PQI, layer Delta F_PQI */
        const pl_layer *Ly = &M->L[l];
        const size_t n = (size_t)Ly->rows * Ly->cols;
        mpq_bitplane_desc d;
        mpq_plan_desc(P, l, &d);
        Wh[l] = malloc(4 * n), D[l] = malloc(4 * n), v[l] = malloc(4 * n), mask[l] = malloc(n);
        pl_pack(Ly, &d, NULL, Wh[l]);
        pl_gctx c = {Ly};
        mpq_status st = mpq_pqi(Ly->W, Wh[l], n, 4, pl_grad_cb, &c, v[l]);
        double layer = 0;
        if (st == MPQ_OK)
            st = mpq_pqi_delta(v[l], Ly->W, Wh[l], Ly->rows, Ly->cols, 16, 128, NULL, NULL, NULL, NULL, &layer);
        if (st != MPQ_OK) pl_die("pqi", st);
        dF[l] = layer / (double)n;
        total += n;
    }
    mpq_status st = mpq_plan_requant(P, dF, r_o, 0.1, pl_rq_loss, &q, t_best); /* 2. algorithm 1 */
    if (st != MPQ_OK) pl_die("requant search", st);
    for (int l = 0; l < PL_LAYERS; l++) { /* 3. outliers out, dense part re-quantized */
        const pl_layer *Ly = &M->L[l];
        const size_t n = (size_t)Ly->rows * Ly->cols;
        mpq_bitplane_desc d;
        mpq_plan_desc(P, l, &d);
        float *Wz = malloc(4 * n);
        if ((st = mpq_requant_outliers(Ly->W, n, P->layers[l].outliers, mask[l])) != MPQ_OK) pl_die("outliers", st);
        pl_zeroed(Ly, mask[l], Wz);
        pl_pack(Ly, &d, Wz, D[l]);
        free(Wz);
        for (size_t k = 0; k < n; k++) Wh[l][k] = mask[l][k] ? Ly->W[k] : D[l][k];
        RL[l] = (mpq_requant_layer){Ly->W, Wh[l], v[l], mask[l], n};
    }
    /* 4. significant weights, r_s in two steps (the paper's r_s / beta = 2) */
    st = mpq_requant_significant(RL, PL_LAYERS, (size_t)(r_s * (double)total), 2, pl_rq_refresh, &q);
    if (st != MPQ_OK) pl_die("requant detach", st);
    memset(r, 0, sizeof *r);
    for (int l = 0; l < PL_LAYERS; l++) { /* 5. dense + sparse, packed and measured */
        const pl_layer *Ly = &M->L[l];
        const size_t n = (size_t)Ly->rows * Ly->cols;
        mpq_sparse S;
        if ((st = mpq_sparse_from_mask(Ly->W, D[l], mask[l], Ly->rows, Ly->cols, &S)) != MPQ_OK) pl_die("sparse", st);
        uint8_t *om = malloc(n);
        float *Wz = malloc(4 * n);
        mpq_requant_outliers(Ly->W, n, P->layers[l].outliers, om);
        pl_zeroed(Ly, om, Wz);
        mpq_bitplane_desc d;
        mpq_plan_desc(P, l, &d);
        d.sparse = &S;
        r->bits += pl_pack(Ly, &d, Wz, Wh[l]);
        r->weights += (double)n;
        r->F += pl_loss(Ly, Wh[l], Ly->Xh, PL_HELD);
        mpq_sparse_free(&S);
        free(om), free(Wz), free(Wh[l]), free(D[l]), free(v[l]), free(mask[l]);
    }
}

static void demo_planners(uint64_t seed, int d)
{
    pl_model M;
    memset(&M, 0, sizeof M);
    pl_build(&M, seed, d);
    double nw = 0;
    for (int l = 0; l < PL_LAYERS; l++) nw += (double)M.L[l].rows * M.L[l].cols;
    printf(
        "\nplanners on a synthetic model: 2 blocks x (qkv %dx%d, o %dx%d, gate_up %dx%d, down %dx%d), %.2fM weights\n",
        3 * d, d, d, d, 4 * d, d, d, 2 * d, nw / 1e6);
    printf(
        "planted loss F = sum_l lambda_l mean_t sum_i rho_i ((W^-W) x_t)_i^2, lambda = 3 1.5 2 2 | 1 .5 .8 .8,\n"
        "rho = 16 on 2%% of the rows (\"salient\"); F on %d held-out tokens; \"high%%\": weights at the high width\n"
        "per layer; \"sal.\": the salient rows' weights at the high width. bpw counts metadata and sparse parts.\n\n",
        PL_HELD);
    printf("  %-26s %6s %11s %8s    %-31s   %s\n", "method", "bpw", "F", "F/RTN3", "high% per layer", "sal.");
    mpq_plan P;
    pl_result r3, r;
    pl_uniform(&M, 3, MPQ_FORMAT_BITPLANE, &P);
    pl_eval_plan(&M, &P, 4, &r3);
    mpq_plan_free(&P);
    const double F3 = r3.F;
    pl_print("RTN 3-bit", &r3, F3, 0);
    static const struct {
        const char *name;
        int reorder;
    } sf[] = {{"SFMP 3.5", MPQ_REORDER_NONE},
              {"SFMP 3.5, rows reordered", MPQ_REORDER_ROWS},
              {"SFMP 3.5, rows+cols", MPQ_REORDER_BOTH}};
    for (int k = 0; k < 3; k++) {
        pl_sfmp(&M, 3.5, sf[k].reorder, &P);
        pl_eval_plan(&M, &P, 4, &r);
        pl_print(sf[k].name, &r, F3, 1);
        mpq_plan_free(&P);
    }
    double tb;
    pl_uniform(&M, 3, MPQ_FORMAT_BITPLANE, &P);
    pl_requant(&M, &P, 0.0025, 0.0025, &r, &tb);
    char name[64];
    snprintf(name, sizeof name, "RTN 3 + ReQuant (t=%.1f)", tb);
    pl_print(name, &r, F3, 0);
    mpq_plan_free(&P);
    printf("\n");
    pl_uniform(&M, 4, MPQ_FORMAT_BITPLANE, &P);
    pl_eval_plan(&M, &P, 5, &r);
    pl_print("RTN 4-bit", &r, F3, 0);
    mpq_plan_free(&P);
    pl_uniform(&M, 4, MPQ_FORMAT_BITPLANE, &P);
    pl_requant(&M, &P, 0.0025, 0.0025, &r, &tb);
    snprintf(name, sizeof name, "RTN 4 + ReQuant (t=%.1f)", tb);
    pl_print(name, &r, F3, 0);
    mpq_plan_free(&P);
    pl_sfmp(&M, 5.0, MPQ_REORDER_ROWS, &P);
    pl_eval_plan(&M, &P, 5, &r);
    pl_print("SFMP 5.0, rows reordered", &r, F3, 1);
    mpq_plan_free(&P);
    pl_mixllm(&M, 0.17, &P); /* a fraction of the channels; wide layers' channels cost more */
    pl_eval_plan(&M, &P, 8, &r);
    pl_print("MixLLM 17% at 8 bit", &r, F3, 1);
    mpq_plan_free(&P);
    pl_uniform(&M, 4, MPQ_FORMAT_MXINT, &P);
    pl_eval_plan(&M, &P, 5, &r);
    pl_print("MXINT4", &r, F3, 0);
    mpq_plan_free(&P);
    pl_mxsens(&M, 5.0, &P);
    pl_eval_plan(&M, &P, 6, &r);
    pl_print("MXSens 5.0 (4/6/8)", &r, F3, 1);
    mpq_plan_free(&P);
    pl_free(&M);
}

#endif
