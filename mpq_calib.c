/* mpq_calib.c - the backward pass of Llama-family models and the
   calibration statistics of every method (see mpq_model.h, section 5). */
#define _XOPEN_SOURCE 700
#include "mpq_model.h"
#include "mpq_model_priv.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* ========================================================================== */
/* The training forward pass and the backward pass                            */
/* ========================================================================== */

/* What one layer keeps for the backward pass: its input, the normed inputs
   of the attention and the MLP, rotated q and k, v, the attention's output,
   the residual between, and the MLP's gate and up products. Slot `layers`
   is scratch for passes that keep nothing. */
typedef struct mpq__slot {
    float *xin, *h1, *q, *k, *v, *att, *xmid, *h2, *gp, *u;
} mpq__slot;

struct mpq_llm_train {
    int len, nslots;
    mpq__slot *slot;                                      /* layers + 1 */
    float *mem;                                           /* every slot */
    float *xf, *hf, *logits;                              /* final residual, normed, logits (len x vocab) */
    float *headT;                                         /* the head transposed: dim x vocab */
    float *rope;                                          /* len x head_dim: cos, then sin */
    float *P, *dS;                                        /* heads x len x len: probabilities, score gradients */
    float *act, *tmp;                                     /* len x ffn, len x max(dim, qd) */
    float *dx, *dh, *da, *dq, *dk, *dv, *dgp, *du, *dact; /* gradients of the activations */
    float *tA, *tB, *WT, *G;                              /* transposes and one weight gradient */
};

/* Where mpq_llm_backward_params adds the gradients, and its scratch. */
typedef struct mpq__pgrad {
    float *embed, *head, *out_norm; /* head: the embedding's when tied */
    float **attn_norm, **ffn_norm;  /* layers */
    float **lin, **bias;            /* layers x MPQ_LIN_COUNT; bias NULL where there is none */
    double *r;                      /* T: the norms' 1 / rms per token */
    float *tA, *tB, *G;             /* the head's gradient: V x T, D x T, V x D */
} mpq__pgrad;

static const float *mpq__W(const mpq_llm *m, const float *const *W, int i)
{
    return W && W[i] ? W[i] : m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT].W;
}

void mpq_llm_train_free(mpq_llm_train *t)
{
    if (!t) return;
    free(t->slot);
    free(t->mem);
    free(t->headT);
    free(t);
}

/* Rows r0 .. r0 + n of map L as float into dst: its float weights, or
   converted from their file (in place). */
static void mpq__lin_rows(const mpq_linear *L, int r0, int n, float *dst)
{
    if (L->W)
        memcpy(dst, L->W + (size_t)r0 * L->cols, sizeof(float) * (size_t)n * (size_t)L->cols);
    else
        mpq_gguf_decode(L->ws_type, (const uint8_t *)L->Ws + (size_t)r0 * L->ws_row, (uint64_t)n * (uint64_t)L->cols,
                        dst);
}

/* Whether map L has float weights, in memory or in place. */
static int mpq__lin_float(const mpq_linear *L) { return L->W || L->Ws; }

/* The training scratch with `slots` activation slots (layers + 1 for a pass
   over the whole model, 1 for the layer-at-a-time passes); in_place: maps
   whose weights are in place are accepted (the caller converts a layer's
   maps before they are used). */
static mpq_status mpq__train_new(const mpq_llm *m, int len, int slots, int in_place, mpq_llm_train **out)
{
    if (!m || !out || len < 2 || len > (1 << 16)) return MPQ_ERR_ARG;
    *out = NULL;
    const mpq_llm_config *c = &m->c;
    for (int l = 0; l < c->layers; l++)
        for (int k = 0; k < MPQ_LIN_COUNT; k++)
            if (in_place ? !mpq__lin_float(&m->layer[l].lin[k]) : !m->layer[l].lin[k].W) return MPQ_ERR_UNSUPPORTED;
    if (in_place ? !mpq__lin_float(&m->head) || !mpq__lin_float(&m->embed) : !m->head.W || !m->embed.W)
        return MPQ_ERR_UNSUPPORTED;
    mpq_llm_train *t = (mpq_llm_train *)calloc(1, sizeof *t);
    if (!t) return MPQ_ERR_NOMEM;
    const size_t T = (size_t)len, D = (size_t)c->dim, F = (size_t)c->ffn, V = (size_t)c->vocab;
    const size_t qd = (size_t)c->heads * c->head_dim, kvd = (size_t)c->kv_heads * c->head_dim;
    const size_t wide = qd > D ? qd : D, H = (size_t)c->heads;
    size_t maxw = 0, maxd = F > wide ? F : wide;
    for (int k = 0; k < MPQ_LIN_COUNT; k++) {
        const mpq_linear *L = &m->layer[0].lin[k];
        const size_t n = (size_t)L->rows * (size_t)L->cols;
        maxw = n > maxw ? n : maxw;
    }
    const size_t per = T * (4 * D + 2 * qd + 2 * kvd + 2 * F);
    t->len = len, t->nslots = slots;
    const size_t total = per * (size_t)t->nslots + T * (2 * D + V + (size_t)c->head_dim) + 2 * H * T * T + T * F +
        T * wide + T * (2 * D + 2 * qd + 2 * kvd + 3 * F) + 2 * T * maxd + 2 * maxw;
    t->slot = (mpq__slot *)calloc((size_t)t->nslots, sizeof *t->slot);
    t->mem = (float *)malloc(sizeof(float) * total);
    if (!t->slot || !t->mem) {
        mpq_llm_train_free(t);
        return MPQ_ERR_NOMEM;
    }
    float *p = t->mem;
    for (int s = 0; s < t->nslots; s++) {
        mpq__slot *S = &t->slot[s];
        S->xin = p, p += T * D;
        S->h1 = p, p += T * D;
        S->q = p, p += T * qd;
        S->k = p, p += T * kvd;
        S->v = p, p += T * kvd;
        S->att = p, p += T * qd;
        S->xmid = p, p += T * D;
        S->h2 = p, p += T * D;
        S->gp = p, p += T * F;
        S->u = p, p += T * F;
    }
    t->xf = p, p += T * D;
    t->hf = p, p += T * D;
    t->logits = p, p += T * V;
    t->rope = p, p += T * (size_t)c->head_dim;
    t->P = p, p += H * T * T;
    t->dS = p, p += H * T * T;
    t->act = p, p += T * F;
    t->tmp = p, p += T * wide;
    t->dx = p, p += T * D;
    t->dh = p, p += T * D;
    t->da = p, p += T * qd;
    t->dq = p, p += T * qd;
    t->dk = p, p += T * kvd;
    t->dv = p, p += T * kvd;
    t->dgp = p, p += T * F;
    t->du = p, p += T * F;
    t->dact = p, p += T * F;
    t->tA = p, p += T * maxd;
    t->tB = p, p += T * maxd;
    t->WT = p, p += maxw;
    t->G = p, p += maxw;
    mpq__rope_table(m, 0, len, t->rope);
    *out = t;
    return MPQ_OK;
}

mpq_status mpq_llm_train_init(const mpq_llm *m, int len, mpq_llm_train **out)
{
    return mpq__train_new(m, len, m ? m->c.layers + 1 : 0, 0, out);
}

/* out[c x r] = in[r x c]^T */
static void mpq__transpose(const float *in, int r, int c, float *out)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int j = 0; j < c; j++)
        for (int i = 0; i < r; i++) out[(size_t)j * r + i] = in[(size_t)i * c + j];
}

/* y[T x rows] = W x[T x cols] (+ bias) */
static void mpq__lin_fwd(const mpq_linear *L, const float *W, const float *x, float *y, int T)
{
    mpq__sgemm(x, T, W, L->rows, L->cols, y);
    if (L->bias)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < L->rows; i++) y[(size_t)t * L->rows + i] += L->bias[i];
}

/* dx[T x cols] = dy[T x rows] W, or dx += that (add; dx is never t->tmp) */
static void mpq__lin_dx(mpq_llm_train *t, const mpq_linear *L, const float *W, const float *dy, float *dx, int T,
                        int add)
{
    mpq__transpose(W, L->rows, L->cols, t->WT);
    mpq__sgemm(dy, T, t->WT, L->cols, L->rows, add ? t->tmp : dx);
    for (size_t i = 0; add && i < (size_t)T * L->cols; i++) dx[i] += t->tmp[i];
}

/* G[rows x cols] = dy[T x rows]^T x[T x cols], then on_grad */
static void mpq__lin_dw(mpq_llm_train *t, const mpq_linear *L, const float *dy, const float *x, int T, int layer,
                        int lin, mpq_grad_cb on_grad, void *user)
{
    if (!on_grad) return;
    mpq__transpose(dy, T, L->rows, t->tA);
    mpq__transpose(x, T, L->cols, t->tB);
    mpq__sgemm(t->tA, L->rows, t->tB, L->cols, T, t->G);
    on_grad(user, layer, lin, t->G, L->rows, L->cols);
}

/* Causal attention inside the window: att = softmax(q k^T / sqrt(hd)) v. */
static void mpq__attn_fwd(const mpq_llm_config *c, const float *q, const float *k, const float *v, float *att, float *P,
                          int T)
{
    const int hd = c->head_dim, H = c->heads, group = c->heads / c->kv_heads;
    const size_t kvd = (size_t)c->kv_heads * hd, qd = (size_t)H * hd;
    const float scale = (float)(1.0 / sqrt((double)hd));
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int th = 0; th < T * H; th++) {
        const int t = th / H, h = th % H, g = h / group;
        float *p = P + ((size_t)h * T + t) * T;
        const float *qt = q + (size_t)t * qd + (size_t)h * hd;
        float mx = -INFINITY;
        for (int j = 0; j <= t; j++) {
            const float *kj = k + (size_t)j * kvd + (size_t)g * hd;
            float s = 0;
            for (int d = 0; d < hd; d++) s += qt[d] * kj[d];
            p[j] = s * scale;
            mx = p[j] > mx ? p[j] : mx;
        }
        double sum = 0;
        for (int j = 0; j <= t; j++) sum += (p[j] = expf(p[j] - mx));
        const float inv = (float)(1.0 / sum);
        float *o = att + (size_t)t * qd + (size_t)h * hd;
        for (int d = 0; d < hd; d++) o[d] = 0;
        for (int j = 0; j <= t; j++) {
            p[j] *= inv;
            const float *vj = v + (size_t)j * kvd + (size_t)g * hd;
            for (int d = 0; d < hd; d++) o[d] += p[j] * vj[d];
        }
    }
}

/* Gradients of the attention: dq, dk, dv from datt (P from the forward). */
static void mpq__attn_bwd(const mpq_llm_config *c, const float *q, const float *k, const float *v, const float *P,
                          const float *datt, float *dS, float *dq, float *dk, float *dv, int T)
{
    const int hd = c->head_dim, H = c->heads, KH = c->kv_heads, group = c->heads / c->kv_heads;
    const size_t kvd = (size_t)KH * hd, qd = (size_t)H * hd;
    const float scale = (float)(1.0 / sqrt((double)hd));
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int th = 0; th < T * H; th++) { /* dS and dq, per query row */
        const int t = th / H, h = th % H, g = h / group;
        const float *p = P + ((size_t)h * T + t) * T, *dot = datt + (size_t)t * qd + (size_t)h * hd;
        float *ds = dS + ((size_t)h * T + t) * T;
        double dsum = 0;
        for (int j = 0; j <= t; j++) {
            const float *vj = v + (size_t)j * kvd + (size_t)g * hd;
            float s = 0;
            for (int d = 0; d < hd; d++) s += dot[d] * vj[d];
            ds[j] = s;
            dsum += (double)p[j] * s;
        }
        float *dqt = dq + (size_t)t * qd + (size_t)h * hd;
        for (int d = 0; d < hd; d++) dqt[d] = 0;
        for (int j = 0; j <= t; j++) {
            ds[j] = p[j] * (ds[j] - (float)dsum);
            const float *kj = k + (size_t)j * kvd + (size_t)g * hd, w = ds[j] * scale;
            for (int d = 0; d < hd; d++) dqt[d] += w * kj[d];
        }
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int gj = 0; gj < KH * T; gj++) { /* dk and dv, per key: its query heads, then positions, in order */
        const int g = gj / T, j = gj % T;
        float *dkj = dk + (size_t)j * kvd + (size_t)g * hd, *dvj = dv + (size_t)j * kvd + (size_t)g * hd;
        for (int d = 0; d < hd; d++) dkj[d] = 0, dvj[d] = 0;
        for (int h = g * group; h < (g + 1) * group; h++)
            for (int t = j; t < T; t++) {
                const float ds = dS[((size_t)h * T + t) * T + j] * scale, p = P[((size_t)h * T + t) * T + j];
                const float *qt = q + (size_t)t * qd + (size_t)h * hd, *dot = datt + (size_t)t * qd + (size_t)h * hd;
                for (int d = 0; d < hd; d++) dkj[d] += ds * qt[d], dvj[d] += p * dot[d];
            }
    }
}

/* dx += d rmsnorm(x) given dy (the gradient at its output), in double per
   token: dx_i = r w_i dy_i - x_i r^3 / D sum_j w_j dy_j x_j; and, when dw
   is not NULL, the gains' gradient dw_j += sum_t dy_tj x_tj r_t (r: T
   doubles of scratch, the tokens in order for each gain). */
static void mpq__rms_bwd(const float *x, const float *w, const float *dy, float *dx, int T, int D, double eps,
                         float *dw, double *r)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * D, *dyt = dy + (size_t)t * D;
        double ss = 0, dot = 0;
        for (int j = 0; j < D; j++) ss += (double)xt[j] * xt[j], dot += (double)w[j] * dyt[j] * xt[j];
        const double rt = 1.0 / sqrt(ss / D + eps), k = rt * rt * rt * dot / D;
        for (int j = 0; j < D; j++) dx[(size_t)t * D + j] += (float)(rt * w[j] * dyt[j] - xt[j] * k);
        if (r) r[t] = rt;
    }
    if (!dw) return;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int j = 0; j < D; j++) {
        double g = 0;
        for (int t = 0; t < T; t++) g += (double)dy[(size_t)t * D + j] * x[(size_t)t * D + j] * r[t];
        dw[j] += (float)g;
    }
}

static float mpq__silu(float g) { return g / (1.0f + expf(-g)); }

/* One layer forward from xin (S->xin need not be it) to xout. */
static void mpq__layer_fwd(const mpq_llm *m, mpq_llm_train *t, const float *const *W, int l, const float *xin,
                           mpq__slot *S, float *xout, int T, mpq_observe_cb observe, void *user)
{
    const mpq_llm_config *c = &m->c;
    const mpq_llm_layer *L = &m->layer[l];
    const int D = c->dim, F = c->ffn, base = l * MPQ_LIN_COUNT;
    mpq__rmsnorm(xin, L->attn_norm, S->h1, T, D, c->norm_eps);
    if (observe) observe(user, l, MPQ_LIN_Q, S->h1, T, D);
    mpq__lin_fwd(&L->lin[MPQ_LIN_Q], mpq__W(m, W, base + MPQ_LIN_Q), S->h1, S->q, T);
    mpq__lin_fwd(&L->lin[MPQ_LIN_K], mpq__W(m, W, base + MPQ_LIN_K), S->h1, S->k, T);
    mpq__lin_fwd(&L->lin[MPQ_LIN_V], mpq__W(m, W, base + MPQ_LIN_V), S->h1, S->v, T);
    mpq__rotate(c, t->rope, S->q, T, c->heads, 0);
    mpq__rotate(c, t->rope, S->k, T, c->kv_heads, 0);
    mpq__attn_fwd(c, S->q, S->k, S->v, S->att, t->P, T);
    const int qd = c->heads * c->head_dim;
    if (observe) observe(user, l, MPQ_LIN_O, S->att, T, qd);
    mpq__lin_fwd(&L->lin[MPQ_LIN_O], mpq__W(m, W, base + MPQ_LIN_O), S->att, t->tmp, T);
    for (size_t i = 0; i < (size_t)T * D; i++) S->xmid[i] = xin[i] + t->tmp[i];
    mpq__rmsnorm(S->xmid, L->ffn_norm, S->h2, T, D, c->norm_eps);
    if (observe) observe(user, l, MPQ_LIN_GATE, S->h2, T, D);
    mpq__lin_fwd(&L->lin[MPQ_LIN_GATE], mpq__W(m, W, base + MPQ_LIN_GATE), S->h2, S->gp, T);
    mpq__lin_fwd(&L->lin[MPQ_LIN_UP], mpq__W(m, W, base + MPQ_LIN_UP), S->h2, S->u, T);
    for (size_t i = 0; i < (size_t)T * F; i++) t->act[i] = mpq__silu(S->gp[i]) * S->u[i];
    if (observe) observe(user, l, MPQ_LIN_DOWN, t->act, T, F);
    mpq__lin_fwd(&L->lin[MPQ_LIN_DOWN], mpq__W(m, W, base + MPQ_LIN_DOWN), t->act, t->tmp, T);
    for (size_t i = 0; i < (size_t)T * D; i++) xout[i] = S->xmid[i] + t->tmp[i];
}

/* Forward from layer `from` (its input in xin) to the last layer's output
   t->xf; keep: every layer's activations in its slot (from must be 0),
   else one scratch slot. */
static void mpq__forward(const mpq_llm *m, mpq_llm_train *t, const float *const *W, int from, const float *xin, int T,
                         int keep, mpq_observe_cb observe, void *user)
{
    const mpq_llm_config *c = &m->c;
    const size_t TD = (size_t)T * c->dim;
    const float *x = xin;
    for (int l = from; l < c->layers; l++) {
        mpq__slot *S = keep ? &t->slot[l] : &t->slot[c->layers];
        float *out = keep ? (l + 1 < c->layers ? t->slot[l + 1].xin : t->xf) : (x == t->xf ? t->dh : t->xf);
        if (keep && x != S->xin) memcpy(S->xin, x, sizeof(float) * TD);
        mpq__layer_fwd(m, t, W, l, x, S, out, T, observe, user);
        x = out;
    }
    if (x != t->xf) memcpy(t->xf, x, sizeof(float) * TD);
}

/* mpq_llm_backward's on_grad when every parameter's gradient is summed */
static void mpq__add_grad(void *user, int layer, int lin, const float *G, int rows, int cols)
{
    float *g = ((mpq__pgrad *)user)->lin[layer * MPQ_LIN_COUNT + lin];
    for (size_t i = 0; i < (size_t)rows * cols; i++) g[i] += G[i];
}

/* b[i] += sum over the T tokens of dy[t][i] (rows outputs), tokens in order */
static void mpq__bias_grad(const float *dy, int T, int rows, float *b)
{
    if (!b) return;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int i = 0; i < rows; i++) {
        double g = 0;
        for (int t = 0; t < T; t++) g += dy[(size_t)t * rows + i];
        b[i] += (float)g;
    }
}

/* The embedding rows of the tokens into x (T x dim). */
static void mpq__embed(const mpq_llm *m, const int32_t *tokens, int T, float *x)
{
    for (int i = 0; i < T; i++) mpq__lin_rows(&m->embed, tokens[i], 1, x + (size_t)i * m->c.dim);
}

/* The head transposed into t->headT (dim x vocab, allocated on first use),
   from float weights or from the file a block of rows at a time. */
static mpq_status mpq__head_T(const mpq_llm *m, mpq_llm_train *t)
{
    const mpq_linear *H = &m->head;
    const int V = H->rows, D = H->cols;
    if (!t->headT && !(t->headT = (float *)malloc(sizeof(float) * (size_t)D * (size_t)V))) return MPQ_ERR_NOMEM;
    if (H->W) {
        mpq__transpose(H->W, V, D, t->headT);
        return MPQ_OK;
    }
    enum { ROWS = 256 };
    float *b = (float *)malloc(sizeof(float) * ROWS * (size_t)D);
    if (!b) return MPQ_ERR_NOMEM;
    for (int r0 = 0; r0 < V; r0 += ROWS) {
        const int n = V - r0 < ROWS ? V - r0 : ROWS;
        mpq__lin_rows(H, r0, n, b);
        for (int j = 0; j < D; j++)
            for (int i = 0; i < n; i++) t->headT[(size_t)j * V + r0 + i] = b[(size_t)i * D + j];
    }
    free(b);
    return MPQ_OK;
}

/* The head and the loss of a window whose final residual is t->xf: t->hf
   normed, the logits, *loss (mean over positions 0 .. T-2); with grads,
   dlogits = (softmax - onehot) / (T - 1) in t->logits and the gradient at
   the last layer's output in t->dx (the head's and the output norm's
   gradients into pg when given). */
static mpq_status mpq__head_bwd(const mpq_llm *m, mpq_llm_train *t, const int32_t *tokens, int T, int grads,
                                double *loss, mpq__pgrad *pg)
{
    const mpq_llm_config *c = &m->c;
    const int D = c->dim, V = c->vocab;
    mpq__rmsnorm(t->xf, m->out_norm, t->hf, T, D, c->norm_eps);
    mpq_status st = mpq__sgemm_lin(&m->head, t->hf, T, t->logits);
    if (st != MPQ_OK) return st;
    double *row = (double *)malloc(sizeof(double) * (size_t)T);
    if (!row) return MPQ_ERR_NOMEM;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int i = 0; i < T; i++) {
        float *z = t->logits + (size_t)i * V;
        if (i == T - 1) {
            row[i] = 0;
            memset(z, 0, sizeof(float) * (size_t)V);
            continue;
        }
        row[i] = mpq__nll(z, V, tokens[i + 1]);
        float mx = z[0];
        for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        double sum = 0;
        for (int v = 0; v < V; v++) sum += exp((double)z[v] - mx);
        const double inv = 1.0 / (sum * (T - 1));
        for (int v = 0; v < V; v++) z[v] = (float)(exp((double)z[v] - mx) * inv);
        z[tokens[i + 1]] -= (float)(1.0 / (T - 1));
    }
    double total = 0;
    for (int i = 0; i < T; i++) total += row[i];
    free(row);
    if (loss) *loss = total / (T - 1);
    if (!grads) return MPQ_OK;
    if (pg) { /* the head: dW = dlogits^T hf */
        mpq__transpose(t->logits, T, V, pg->tA);
        mpq__transpose(t->hf, T, D, pg->tB);
        mpq__sgemm(pg->tA, V, pg->tB, D, T, pg->G);
        for (size_t i = 0; i < (size_t)V * D; i++) pg->head[i] += pg->G[i];
    }
    /* dhf = dlogits head; dx = rmsnorm backward (the head as it is now) */
    if ((st = mpq__head_T(m, t)) != MPQ_OK) return st;
    mpq__sgemm(t->logits, T, t->headT, D, V, t->dh);
    memset(t->dx, 0, sizeof(float) * (size_t)T * D);
    mpq__rms_bwd(t->xf, m->out_norm, t->dh, t->dx, T, D, c->norm_eps, pg ? pg->out_norm : NULL, pg ? pg->r : NULL);
    return MPQ_OK;
}

/* Layer l backward: t->dx, the gradient at its output, becomes the gradient
   at its input; S holds its forward activations (S->xin its input); each
   linear map's weight gradient goes to on_grad, and with pg the biases' and
   norms' gradients are added there. */
static void mpq__layer_bwd(const mpq_llm *m, mpq_llm_train *t, const float *const *W, int l, const mpq__slot *S, int T,
                           mpq_grad_cb on_grad, void *user, mpq__pgrad *pg)
{
    const mpq_llm_config *c = &m->c;
    const mpq_llm_layer *L = &m->layer[l];
    const int D = c->dim, F = c->ffn, base = l * MPQ_LIN_COUNT;
    float *const *bg = pg ? pg->bias + base : NULL;
    double *r = pg ? pg->r : NULL;
    /* MLP: y = xmid + Wd (silu(gp) * u) */
    for (size_t i = 0; i < (size_t)T * F; i++) t->act[i] = mpq__silu(S->gp[i]) * S->u[i];
    mpq__lin_dw(t, &L->lin[MPQ_LIN_DOWN], t->dx, t->act, T, l, MPQ_LIN_DOWN, on_grad, user);
    if (bg) mpq__bias_grad(t->dx, T, D, bg[MPQ_LIN_DOWN]);
    mpq__lin_dx(t, &L->lin[MPQ_LIN_DOWN], mpq__W(m, W, base + MPQ_LIN_DOWN), t->dx, t->dact, T, 0);
    for (size_t i = 0; i < (size_t)T * F; i++) {
        const float g = S->gp[i], sg = 1.0f / (1.0f + expf(-g));
        t->du[i] = t->dact[i] * g * sg;
        t->dgp[i] = t->dact[i] * S->u[i] * sg * (1.0f + g * (1.0f - sg));
    }
    mpq__lin_dw(t, &L->lin[MPQ_LIN_GATE], t->dgp, S->h2, T, l, MPQ_LIN_GATE, on_grad, user);
    mpq__lin_dw(t, &L->lin[MPQ_LIN_UP], t->du, S->h2, T, l, MPQ_LIN_UP, on_grad, user);
    if (bg) mpq__bias_grad(t->dgp, T, F, bg[MPQ_LIN_GATE]), mpq__bias_grad(t->du, T, F, bg[MPQ_LIN_UP]);
    mpq__lin_dx(t, &L->lin[MPQ_LIN_GATE], mpq__W(m, W, base + MPQ_LIN_GATE), t->dgp, t->dh, T, 0);
    mpq__lin_dx(t, &L->lin[MPQ_LIN_UP], mpq__W(m, W, base + MPQ_LIN_UP), t->du, t->dh, T, 1);
    mpq__rms_bwd(S->xmid, L->ffn_norm, t->dh, t->dx, T, D, c->norm_eps, pg ? pg->ffn_norm[l] : NULL, r);
    /* attention: xmid = xin + Wo att */
    mpq__lin_dw(t, &L->lin[MPQ_LIN_O], t->dx, S->att, T, l, MPQ_LIN_O, on_grad, user);
    if (bg) mpq__bias_grad(t->dx, T, D, bg[MPQ_LIN_O]);
    mpq__lin_dx(t, &L->lin[MPQ_LIN_O], mpq__W(m, W, base + MPQ_LIN_O), t->dx, t->da, T, 0);
    mpq__attn_fwd(c, S->q, S->k, S->v, t->dq, t->P, T); /* P again (dq is scratch here) */
    mpq__attn_bwd(c, S->q, S->k, S->v, t->P, t->da, t->dS, t->dq, t->dk, t->dv, T);
    mpq__rotate(c, t->rope, t->dq, T, c->heads, 1);
    mpq__rotate(c, t->rope, t->dk, T, c->kv_heads, 1);
    mpq__lin_dw(t, &L->lin[MPQ_LIN_Q], t->dq, S->h1, T, l, MPQ_LIN_Q, on_grad, user);
    mpq__lin_dw(t, &L->lin[MPQ_LIN_K], t->dk, S->h1, T, l, MPQ_LIN_K, on_grad, user);
    mpq__lin_dw(t, &L->lin[MPQ_LIN_V], t->dv, S->h1, T, l, MPQ_LIN_V, on_grad, user);
    if (bg) {
        mpq__bias_grad(t->dq, T, L->lin[MPQ_LIN_Q].rows, bg[MPQ_LIN_Q]);
        mpq__bias_grad(t->dk, T, L->lin[MPQ_LIN_K].rows, bg[MPQ_LIN_K]);
        mpq__bias_grad(t->dv, T, L->lin[MPQ_LIN_V].rows, bg[MPQ_LIN_V]);
    }
    mpq__lin_dx(t, &L->lin[MPQ_LIN_Q], mpq__W(m, W, base + MPQ_LIN_Q), t->dq, t->dh, T, 0);
    mpq__lin_dx(t, &L->lin[MPQ_LIN_K], mpq__W(m, W, base + MPQ_LIN_K), t->dk, t->dh, T, 1);
    mpq__lin_dx(t, &L->lin[MPQ_LIN_V], mpq__W(m, W, base + MPQ_LIN_V), t->dv, t->dh, T, 1);
    mpq__rms_bwd(S->xin, L->attn_norm, t->dh, t->dx, T, D, c->norm_eps, pg ? pg->attn_norm[l] : NULL, r);
}

/* mpq_llm_backward, and with pg every parameter's gradient added there
   (on_grad and user are then pg's). */
static mpq_status mpq__backward(const mpq_llm *m, mpq_llm_train *t, const int32_t *tokens, int n, const float *const *W,
                                mpq_observe_cb observe, mpq_grad_cb on_grad, void *user, double *loss, mpq__pgrad *pg)
{
    if (!m || !t || !tokens || n < 2 || n > t->len || t->nslots < m->c.layers + 1) return MPQ_ERR_ARG;
    const mpq_llm_config *c = &m->c;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab) return MPQ_ERR_ARG;
    if (pg) on_grad = mpq__add_grad, user = pg;
    const int T = n, D = c->dim;
    float *x0 = t->slot[0].xin;
    mpq__embed(m, tokens, T, x0);
    mpq__forward(m, t, W, 0, x0, T, 1, observe, user);
    mpq_status st = mpq__head_bwd(m, t, tokens, T, on_grad != NULL, loss, pg);
    if (st != MPQ_OK || !on_grad) return st;
    for (int l = c->layers - 1; l >= 0; l--) mpq__layer_bwd(m, t, W, l, &t->slot[l], T, on_grad, user, pg);
    if (pg) /* the embedding rows of the tokens, in token order */
        for (int i = 0; i < T; i++) {
            float *e = pg->embed + (size_t)tokens[i] * D;
            for (int j = 0; j < D; j++) e[j] += t->dx[(size_t)i * D + j];
        }
    return MPQ_OK;
}

mpq_status mpq_llm_backward(const mpq_llm *m, mpq_llm_train *t, const int32_t *tokens, int n, const float *const *W,
                            mpq_observe_cb observe, mpq_grad_cb on_grad, void *user, double *loss)
{
    return mpq__backward(m, t, tokens, n, W, observe, on_grad, user, loss, NULL);
}

mpq_status mpq_llm_backward_params(const mpq_llm *m, mpq_llm_train *t, const int32_t *tokens, int n, float *const *grad,
                                   double *loss)
{
    if (!m || !t || !grad || !tokens || n < 2 || n > t->len) return MPQ_ERR_ARG;
    const mpq_llm_config *c = &m->c;
    const int np = mpq_llm_params(m, NULL, 0), nl = c->layers * MPQ_LIN_COUNT;
    const size_t T = (size_t)n, D = (size_t)c->dim, V = (size_t)c->vocab;
    mpq_llm_param *p = (mpq_llm_param *)malloc(sizeof *p * (size_t)np);
    float **arr = (float **)calloc((size_t)(2 * c->layers + 2 * nl), sizeof(float *));
    mpq__pgrad pg;
    memset(&pg, 0, sizeof pg);
    pg.r = (double *)malloc(sizeof(double) * T);
    pg.tA = (float *)malloc(sizeof(float) * (V * T + D * T + V * D));
    mpq_status st = p && arr && pg.r && pg.tA ? MPQ_OK : MPQ_ERR_NOMEM;
    if (st == MPQ_OK) {
        mpq_llm_params(m, p, np);
        pg.attn_norm = arr, pg.ffn_norm = arr + c->layers, pg.lin = arr + 2 * c->layers, pg.bias = pg.lin + nl;
        pg.tB = pg.tA + V * T, pg.G = pg.tB + D * T;
        for (int i = 0; i < np && st == MPQ_OK; i++) {
            if (!p[i].data) st = MPQ_ERR_UNSUPPORTED;
            if (!grad[i]) st = MPQ_ERR_ARG;
            const int l = p[i].layer, k = p[i].lin;
            switch (p[i].role) {
            case MPQ_PARAM_EMBED: pg.embed = grad[i]; break;
            case MPQ_PARAM_HEAD: pg.head = grad[i]; break;
            case MPQ_PARAM_OUT_NORM: pg.out_norm = grad[i]; break;
            case MPQ_PARAM_ATTN_NORM: pg.attn_norm[l] = grad[i]; break;
            case MPQ_PARAM_FFN_NORM: pg.ffn_norm[l] = grad[i]; break;
            case MPQ_PARAM_LINEAR: pg.lin[l * MPQ_LIN_COUNT + k] = grad[i]; break;
            case MPQ_PARAM_BIAS: pg.bias[l * MPQ_LIN_COUNT + k] = grad[i]; break;
            }
        }
        if (c->tied) pg.head = pg.embed;
    }
    if (st == MPQ_OK) st = mpq__backward(m, t, tokens, n, NULL, NULL, NULL, NULL, loss, &pg);
    free(p);
    free(arr);
    free(pg.r);
    free(pg.tA);
    return st;
}

/* ========================================================================== */
/* Statistics                                                                 */
/* ========================================================================== */

enum { MPQ__KINDS = 4 }; /* linear-map inputs: attention (q, k, v), o, MLP (gate, up), down */

static int mpq__kind(int lin) { return lin <= MPQ_LIN_V ? 0 : lin == MPQ_LIN_O ? 1 : lin == MPQ_LIN_DOWN ? 3 : 2; }

/* Every window's input of every layer, kept from the forward pass for the
   backward pass: in memory up to a limit, else in an unlinked file. */
typedef struct mpq__keep {
    float *mem;
    FILE *f;
    char *path;  /* the directory of the file (errors name it) */
    size_t per;  /* floats per (layer, window) */
    int windows; /* per layer */
} mpq__keep;

static void mpq__keep_close(mpq__keep *K)
{
    free(K->mem);
    if (K->f) fclose(K->f);
    free(K->path);
    memset(K, 0, sizeof *K);
}

static mpq_status mpq__keep_open(mpq__keep *K, int layers, int windows, size_t per, size_t limit, const char *dir,
                                 const char *resume, const char *name, mpq_io_err *err)
{
    memset(K, 0, sizeof *K);
    K->per = per, K->windows = windows;
    const double bytes = (double)layers * windows * (double)per * sizeof(float);
    if (resume) { /* a named file in the resume directory that outlives the run, continued where it was */
        const size_t n = strlen(resume) + strlen(name) + 2;
        if (!(K->path = (char *)malloc(n))) return MPQ_ERR_NOMEM;
        snprintf(K->path, n, "%s/%s", resume, name);
        if (!(K->f = fopen(K->path, "r+b")) && !(K->f = fopen(K->path, "w+b")))
            return mpq__fail(err, MPQ_ERR_IO, K->path, "cannot open: %s", strerror(errno));
        return MPQ_OK;
    }
    if (bytes <= (double)limit) {
        K->mem = (float *)malloc((size_t)bytes + 1);
        return K->mem ? MPQ_OK : MPQ_ERR_NOMEM;
    }
    if (!dir || !*dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    const size_t n = strlen(dir) + 32;
    if (!(K->path = (char *)malloc(n))) return MPQ_ERR_NOMEM;
    snprintf(K->path, n, "%s/mpq-keep-XXXXXX", dir);
    struct statvfs vs;
    if (statvfs(dir, &vs) == 0 && (double)vs.f_bavail * (double)vs.f_frsize < bytes)
        return mpq__fail(err, MPQ_ERR_IO, dir,
                         "the kept hidden states need %.2f GB here, %.2f GB are free (give another directory)",
                         bytes / 1e9, (double)vs.f_bavail * (double)vs.f_frsize / 1e9);
    const int fd = mkstemp(K->path);
    if (fd < 0)
        return mpq__fail(err, MPQ_ERR_IO, dir, "cannot create a file for the kept hidden states: %s", strerror(errno));
    unlink(K->path);
    snprintf(K->path, n, "%s", dir);
    if (!(K->f = fdopen(fd, "w+b"))) {
        close(fd);
        return mpq__fail(err, MPQ_ERR_IO, dir, "cannot open the file of the kept hidden states");
    }
    return MPQ_OK;
}

static mpq_status mpq__keep_io(mpq__keep *K, int l, int w, float *v, int write, mpq_io_err *err)
{
    const size_t at = ((size_t)l * (size_t)K->windows + (size_t)w) * K->per;
    if (K->mem) {
        if (write)
            memcpy(K->mem + at, v, sizeof(float) * K->per);
        else
            memcpy(v, K->mem + at, sizeof(float) * K->per);
        return MPQ_OK;
    }
    const int ok = fseeko(K->f, (off_t)(at * sizeof(float)), SEEK_SET) == 0 &&
        (write ? fwrite(v, sizeof(float), K->per, K->f) : fread(v, sizeof(float), K->per, K->f)) == K->per;
    if (!ok)
        return mpq__fail(err, MPQ_ERR_IO, K->path, "%s the kept hidden states failed: %s",
                         write ? "writing" : "reading", errno ? strerror(errno) : "short");
    return MPQ_OK;
}

typedef struct mpq__cal {
    const mpq_llm *m;
    mpq_calib_stats *s;
    int nlin, window, len;
    mpq_stat *fisher, *mixllm; /* nlin */
    float **delta;             /* MixLLM's Q(W) - W, nlin */
    mpq_stat *xdiag, *mabs;    /* layers x kinds */
    double **xtx;              /* layers x kinds, cols x cols */
    float **awq;               /* layers x kinds */
    int *awq_got;
    long act_total; /* activation tokens over all windows */
    /* PQI */
    size_t *off;      /* nlin + 1 offsets into the flat weights */
    float *grad;      /* the gradient of the layer's maps being summed (from off[goff]) */
    int goff;         /* the first map of that layer */
    const float **Wp; /* overrides, nlin */
    int32_t *win;     /* the window's tokens */
    const int32_t *tokens;
    size_t n;
    int nwin;
    double wscale;
    mpq_status st;
    const mpq_calib_opts *o;
    double t0;
    mpq_llm_train *t;
    /* rotated statistics */
    mpq_rotation *rot; /* kinds: V of each input's size; NULL: unrotated */
    float *rbuf;       /* an input block or a gradient rotated (or one map's W V^T) */
    /* the passes a layer at a time */
    float *lw[MPQ_LIN_COUNT]; /* a layer's weights converted from their file (a model in place) */
    mpq__keep keep;           /* every layer's input of every window, for the backward pass */
    float *ebuf;              /* one statistic of one map on its way out */
    size_t ebuf_n;            /* its floats */
    /* each finished statistic (kind: index into mpq__kinds) of map i goes here */
    mpq_status (*put)(struct mpq__cal *C, int kind, int i, const float *v, size_t n);
    void *put_user;
    mpq_io_err *err;
    struct mpq__resume *res; /* resumable passes, or NULL */
} mpq__cal;

/* ---- resumable passes ----------------------------------------------------- */

/* Where the resumable passes stand, and the files that say so in the
   directory: state.json (identity, phase, layer, the loss summed so far);
   phase 1's h.bin (every window's hidden state at the forward pass's
   layer) or dx.bin (the gradients at the backward pass's layer) and
   keep.bin (the kept inputs); PQI's pqi-h.bin, pqi-dx.bin and
   pqi-keep.bin, the same for its sequences; the sensitivity's sens-ref.bin
   (the float sequence) and sens-keep.bin (one sequence per map), then
   layer-sens.bin (its result); and stats-fNNNN, stats-bNNNN and
   stats-pNNNN.safetensors (a layer's statistics from phase 1's forward
   and backward pass and from PQI, tensors named "kind.map"). */
typedef struct mpq__resume {
    const char *dir;
    char *ident; /* what the directory must be from */
    /* 0: forward at layer; 1: backward at layer (the head done); 2: phase 1 done; 3: PQI's forward at layer;
       4: PQI's backward at layer (its head done); 5: the sensitivity at layer; 6: all done */
    int phase, layer;
    double loss_sum;  /* phase >= 1 */
    mpq_st_writer *w; /* the statistics of the layer being run */
    mpq_status (*put)(struct mpq__cal *C, int kind, int i, const float *v, size_t n); /* the caller's */
} mpq__resume;

static char *mpq__rpath(const mpq__resume *R, const char *name)
{
    const size_t n = strlen(R->dir) + strlen(name) + 2;
    char *p = (char *)malloc(n);
    if (p) snprintf(p, n, "%s/%s", R->dir, name);
    return p;
}

/* bytes to dir/name, whole: a temporary name, synced, renamed into place */
static mpq_status mpq__rwrite(const mpq__resume *R, const char *name, const void *b, size_t n, mpq_io_err *err)
{
    char *p = mpq__rpath(R, name), *t = p ? (char *)malloc(strlen(p) + 5) : NULL;
    if (!t) {
        free(p);
        return MPQ_ERR_NOMEM;
    }
    sprintf(t, "%s.tmp", p);
    FILE *f = fopen(t, "wb");
    int ok = f && fwrite(b, 1, n, f) == n;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0) ok = 0;
    ok = ok && rename(t, p) == 0;
    mpq_status st = ok ? MPQ_OK : mpq__fail(err, MPQ_ERR_IO, p, "cannot write: %s", strerror(errno));
    if (!ok) unlink(t);
    free(p), free(t);
    return st;
}

/* dir/name, exactly n bytes */
static mpq_status mpq__rread(const mpq__resume *R, const char *name, void *b, size_t n, mpq_io_err *err)
{
    char *p = mpq__rpath(R, name);
    if (!p) return MPQ_ERR_NOMEM;
    FILE *f = fopen(p, "rb");
    const int ok = f && fread(b, 1, n, f) == n && fgetc(f) == EOF;
    if (f) fclose(f);
    mpq_status st =
        ok ? MPQ_OK : mpq__fail(err, MPQ_ERR_FORMAT, p, "missing or not %zu bytes: not what this run wrote", n);
    free(p);
    return st;
}

static mpq_status mpq__res_state(mpq__resume *R, int phase, int layer, double loss_sum, mpq_io_err *err)
{
    uint64_t bits;
    memcpy(&bits, &loss_sum, 8);
    cJSON *o = cJSON_CreateObject();
    char lb[24], *j = NULL;
    snprintf(lb, sizeof lb, "%016llx", (unsigned long long)bits);
    if (o && cJSON_AddStringToObject(o, "identity", R->ident) && cJSON_AddNumberToObject(o, "phase", phase) &&
        cJSON_AddNumberToObject(o, "layer", layer) && cJSON_AddStringToObject(o, "loss_sum_bits", lb))
        j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!j) return MPQ_ERR_NOMEM;
    mpq_status st = mpq__rwrite(R, "state.json", j, strlen(j), err);
    free(j);
    if (st == MPQ_OK) R->phase = phase, R->layer = layer, R->loss_sum = loss_sum;
    return st;
}

/* Where a run in R->dir stopped (a directory without state.json: from the
   start); MPQ_ERR_ARG for a directory of another run. */
static mpq_status mpq__res_load(mpq__resume *R, int layers, mpq_io_err *err)
{
    R->phase = 0, R->layer = 0, R->loss_sum = 0;
    char *p = mpq__rpath(R, "state.json");
    if (!p) return MPQ_ERR_NOMEM;
    struct stat sb;
    if (stat(R->dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        mpq_status st = mpq__fail(err, MPQ_ERR_IO, R->dir, "not a directory (the resume directory must exist)");
        free(p);
        return st;
    }
    FILE *f = fopen(p, "rb");
    if (!f) {
        free(p);
        return MPQ_OK;
    }
    char buf[8192];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *o = cJSON_Parse(buf);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "identity"),
                *ph = cJSON_GetObjectItemCaseSensitive(o, "phase"), *ly = cJSON_GetObjectItemCaseSensitive(o, "layer"),
                *ls = cJSON_GetObjectItemCaseSensitive(o, "loss_sum_bits");
    mpq_status st = MPQ_OK;
    unsigned long long bits = 0;
    if (!cJSON_IsString(id) || !cJSON_IsNumber(ph) || !cJSON_IsNumber(ly) || !cJSON_IsString(ls) ||
        sscanf(ls->valuestring, "%16llx", &bits) != 1 || ph->valueint < 0 || ph->valueint > 6 || ly->valueint < -1 ||
        ly->valueint > layers)
        st = mpq__fail(err, MPQ_ERR_FORMAT, p, "not a state mpq wrote");
    else if (strcmp(id->valuestring, R->ident) != 0)
        st = mpq__fail(err, MPQ_ERR_ARG, R->dir,
                       "holds a run of another model, text or options (empty it, or give another directory)");
    if (st == MPQ_OK) {
        R->phase = ph->valueint, R->layer = ly->valueint;
        const uint64_t b = bits;
        memcpy(&R->loss_sum, &b, 8);
    }
    cJSON_Delete(o);
    free(p);
    return st;
}

/* A statistic into the file of the layer being run. */
static mpq_status mpq__put_resume(mpq__cal *C, int kind, int i, const float *v, size_t n)
{
    char name[32];
    snprintf(name, sizeof name, "%d.%d", kind, i);
    const uint64_t shape = (uint64_t)n;
    return mpq_st_write_f32(C->res->w, name, MPQ_DT_F32, 1, &shape, v, C->err);
}

static mpq_status mpq__res_layer_open(mpq__resume *R, char pass, int l, mpq_io_err *err)
{
    char name[40];
    snprintf(name, sizeof name, "stats-%c%04d.safetensors", pass, l);
    char *p = mpq__rpath(R, name);
    if (!p) return MPQ_ERR_NOMEM;
    mpq_status st = mpq_st_writer_open(p, &R->w, err);
    free(p);
    return st;
}

static mpq_status mpq__res_layer_close(mpq__resume *R, mpq_status st, mpq_io_err *err)
{
    if (!R->w) return st;
    if (st == MPQ_OK)
        st = mpq_st_writer_close(R->w, err);
    else
        mpq_st_writer_abort(R->w);
    R->w = NULL;
    return st;
}

/* Every layer's statistics from the directory to the caller's put, in the
   order the passes made them (phase 1's forward pass from the bottom, its
   backward pass and PQI's from the top); then the directory's files are
   removed. */
static mpq_status mpq__res_deliver(mpq__cal *C, int fwd, int bwd, int pqi)
{
    static const char pass[3] = {'f', 'b', 'p'};
    mpq__resume *R = C->res;
    const int L = C->m->c.layers, on[3] = {fwd, bwd, pqi};
    mpq_status st = MPQ_OK;
    for (int k = 0; st == MPQ_OK && k < 3 * L; k++) {
        const int ps = k / L, l = ps ? L - 1 - k % L : k;
        if (!on[ps]) continue;
        char name[40];
        snprintf(name, sizeof name, "stats-%c%04d.safetensors", pass[ps], l);
        char *p = mpq__rpath(R, name);
        mpq_st_file *f = NULL;
        st = p ? mpq_st_open(p, &f, C->err) : MPQ_ERR_NOMEM;
        for (int t = 0; st == MPQ_OK && t < mpq_st_count(f); t++) {
            const mpq_st_tensor *e = mpq_st_at(f, t);
            int kind, i;
            char tail;
            if (sscanf(e->name, "%d.%d%c", &kind, &i, &tail) != 2 || kind < 0 || kind > 6 || (kind == 6) != (ps == 2) ||
                i < l * MPQ_LIN_COUNT || i >= (l + 1) * MPQ_LIN_COUNT || e->ndim != 1 || e->dtype != MPQ_DT_F32 ||
                e->numel > C->ebuf_n)
                st = mpq__fail(C->err, MPQ_ERR_FORMAT, p, "tensor '%s' is not one mpq wrote", e->name);
            if (st == MPQ_OK) st = mpq_st_read_f32(f, e, C->ebuf, (size_t)e->numel, C->err);
            if (st == MPQ_OK) st = R->put(C, kind, i, C->ebuf, (size_t)e->numel);
        }
        mpq_st_close(f);
        free(p);
    }
    if (st != MPQ_OK) return st;
    static const char *const names[] = {"state.json",    "h.bin",         "dx.bin",       "keep.bin",
                                        "pqi-h.bin",     "pqi-dx.bin",    "pqi-keep.bin", "sens-ref.bin",
                                        "sens-keep.bin", "layer-sens.bin"};
    for (int k = 0; k < 3 * L; k++) {
        char name[40];
        snprintf(name, sizeof name, "stats-%c%04d.safetensors", pass[k / L], k % L);
        char *p = mpq__rpath(R, name);
        if (p) unlink(p);
        free(p);
    }
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char *p = mpq__rpath(R, names[k]);
        if (p) unlink(p);
        free(p);
    }
    return MPQ_OK;
}

static int mpq__cols_of(const mpq_llm_config *c, int kind)
{
    return kind == 3 ? c->ffn : kind == 1 ? c->heads * c->head_dim : c->dim;
}

static mpq_linear *mpq__lin(const mpq_llm *m, int i) { return &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT]; }

/* The rotation of linear map `lin`'s inputs (NULL: unrotated statistics). */
static const mpq_rotation *mpq__cal_rot(const mpq__cal *C, int lin) { return C->rot ? &C->rot[mpq__kind(lin)] : NULL; }

/* rows vectors of a map with rotation r copied to C->rbuf and rotated (V^T
   with transpose): the rotated block, or src itself when r is NULL. */
static const float *mpq__cal_rotated(mpq__cal *C, const mpq_rotation *r, const float *src, int rows, int transpose)
{
    if (!r) return src;
    memcpy(C->rbuf, src, sizeof(float) * (size_t)rows * (size_t)r->n);
    const mpq_status st = mpq_rotation_apply(r, C->rbuf, rows, transpose);
    if (st != MPQ_OK) C->st = st;
    return C->rbuf;
}

/* acc (cols x cols, float64) += X^T X of the T rows of x: columns as rows
   of the transpose, then one product. */
static mpq_status mpq__xtx_add(double *acc, const float *x, int T, int cols)
{
    float *xt = (float *)malloc(sizeof(float) * (size_t)cols * ((size_t)T + (size_t)cols));
    if (!xt) return MPQ_ERR_NOMEM;
    float *prod = xt + (size_t)cols * T;
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < T; i++) xt[(size_t)j * T + i] = x[(size_t)i * cols + j];
    mpq__sgemm(xt, cols, xt, cols, T, prod);
    for (size_t i = 0; i < (size_t)cols * cols; i++) acc[i] += prod[i];
    free(xt);
    return MPQ_OK;
}

/* The global index (over all windows, positions 1..len-1) of AWQ sample k. */
static long mpq__awq_index(const mpq__cal *C, int k)
{
    return (long)(((2.0 * k + 1.0) * (double)C->act_total) / (2.0 * C->s->awq_tokens));
}

static void mpq__cal_observe(void *user, int layer, int lin, const float *x, int T, int cols)
{
    mpq__cal *C = (mpq__cal *)user;
    if (C->st != MPQ_OK) return;
    const int slot = layer * MPQ__KINDS + mpq__kind(lin);
    const float *x1 = x + cols; /* position 0 (the attention sink) left out */
    const int T1 = T - 1;
    /* the per-column sums of the inputs the quantizer sees: V x when rotated */
    const float *xs = mpq__cal_rotated(C, mpq__cal_rot(C, lin), x1, T1, 0);
    mpq_status st = C->st;
    if (st == MPQ_OK) st = mpq_hessian_diag_add(&C->xdiag[slot], xs, T1, cols);
    if (st == MPQ_OK) st = mpq_mean_abs_add(&C->mabs[slot], xs, T1, cols);
    if (st != MPQ_OK) {
        C->st = st;
        return;
    }
    const long base = (long)C->window * (C->len - 1);
    while (C->awq_got[slot] < C->s->awq_tokens) {
        const long g = mpq__awq_index(C, C->awq_got[slot]) - base;
        if (g < 0 || g >= T1) break;
        memcpy(C->awq[slot] + (size_t)C->awq_got[slot]++ * cols, x1 + (size_t)g * cols, sizeof(float) * (size_t)cols);
    }
    /* X^T X of every position: GPTQ's Hessian is of every input the map sees, the sink's massive activations
       first of all */
    if (C->xtx) C->st = mpq__xtx_add(C->xtx[slot], x, T, cols);
}

static void mpq__cal_grad(void *user, int layer, int lin, const float *G, int rows, int cols)
{
    mpq__cal *C = (mpq__cal *)user;
    if (C->st != MPQ_OK) return;
    const int i = layer * MPQ_LIN_COUNT + lin;
    const size_t n = (size_t)rows * (size_t)cols;
    G = mpq__cal_rotated(C, mpq__cal_rot(C, lin), G, rows, 0); /* G V^T: the gradient at W V^T */
    mpq_status st = C->st;
    if (st == MPQ_OK && C->fisher) st = mpq_fisher_add(&C->fisher[i], G, n);
    if (st == MPQ_OK && C->mixllm) st = mpq_mixllm_add(&C->mixllm[i], G, C->delta[i], rows, cols);
    C->st = st;
}

/* The PQI pass sums the gradients of its windows into the layer's vector. */
static void mpq__pqi_grad_cb(void *user, int layer, int lin, const float *G, int rows, int cols)
{
    mpq__cal *C = (mpq__cal *)user;
    float *g = C->grad + (C->off[layer * MPQ_LIN_COUNT + lin] - C->off[C->goff]);
    const size_t n = (size_t)rows * (size_t)cols;
    G = mpq__cal_rotated(C, mpq__cal_rot(C, lin), G, rows, 0);
    for (size_t k = 0; k < n; k++) g[k] += (float)(C->wscale * G[k]);
}

/* Window i of the text into C->win (BOS first when the tokenizer adds it). */
static void mpq__window(mpq__cal *C, int i)
{
    const size_t avail = C->n / (size_t)C->len;
    const size_t at = (size_t)((double)i * (double)avail / (double)C->nwin) * (size_t)C->len;
    memcpy(C->win, C->tokens + at, sizeof(int32_t) * (size_t)C->len);
    if (C->m->tok && mpq_tokenizer_adds_bos(C->m->tok) && mpq_tokenizer_bos(C->m->tok) >= 0)
        C->win[0] = mpq_tokenizer_bos(C->m->tok);
}

/* W dequantized after round-to-nearest at `bits` (g128) or MXINT4; with
   r, W' = W V^T (written to wr, rows x cols) in its place, and out in the
   coordinates of W'. */
static mpq_status mpq__rtn(const mpq_linear *L, const float *W, const mpq_rotation *r, int bits, int mxint, float *out,
                           float *wr)
{
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    d.rows = L->rows, d.cols = L->cols, d.uniform_bits = bits;
    if (mxint) d.format = MPQ_FORMAT_MXINT;
    if (r) {
        memcpy(wr, W, sizeof(float) * (size_t)L->rows * (size_t)L->cols);
        const mpq_status st = mpq_rotation_apply(r, wr, L->rows, 0);
        if (st != MPQ_OK) return st;
        W = wr;
    }
    mpq_packed A;
    mpq_status st = mpq_pack_alloc(&d, W, &A);
    if (st != MPQ_OK) return st;
    st = mpq_packed_dequantize(&A, 0, out);
    mpq_packed_free(&A);
    return st;
}

void mpq_calib_stats_free(mpq_calib_stats *s)
{
    if (!s) return;
    float ***v[] = {&s->fisher, &s->mixllm, &s->xtx_diag, &s->mean_abs, &s->awq, &s->xtx, &s->pqi};
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        if (!*v[k]) continue;
        for (int i = 0; i < s->nlin; i++) free((*v[k])[i]);
        free(*v[k]);
    }
    free(s->layer_sens);
    memset(s, 0, sizeof *s);
}

static void mpq__cal_free(mpq__cal *C)
{
    const int slots = C->m->c.layers * MPQ__KINDS;
    for (int i = 0; i < C->nlin; i++) {
        if (C->fisher) mpq_stat_free(&C->fisher[i]);
        if (C->mixllm) mpq_stat_free(&C->mixllm[i]);
        if (C->delta) free(C->delta[i]);
    }
    for (int k = 0; k < slots; k++) {
        if (C->xdiag) mpq_stat_free(&C->xdiag[k]);
        if (C->mabs) mpq_stat_free(&C->mabs[k]);
        if (C->xtx) free(C->xtx[k]);
        if (C->awq) free(C->awq[k]);
    }
    free(C->fisher), free(C->mixllm), free(C->delta), free(C->xdiag), free(C->mabs), free(C->xtx), free(C->awq);
    free(C->awq_got), free(C->off), free(C->Wp), free(C->win);
    if (C->rot)
        for (int k = 0; k < MPQ__KINDS; k++) mpq_rotation_free(&C->rot[k]);
    free(C->rot), free(C->rbuf);
    for (int k = 0; k < MPQ_LIN_COUNT; k++) free(C->lw[k]);
    free(C->ebuf);
    mpq__keep_close(&C->keep);
    mpq_llm_train_free(C->t);
}

static void mpq__progress(const mpq__cal *C, const char *phase, int done, int total)
{
    if (C->o->progress) C->o->progress(C->o->user, phase, done, total, mpq__now() - C->t0);
}

/* Layer l's weights as float: the model's own, or (a model in place)
   converted from their file into C->lw, with C->Wp[l * 7 + k] pointing at
   them for the passes. */
static void mpq__cal_layer_w(mpq__cal *C, int l)
{
    for (int k = 0; k < MPQ_LIN_COUNT; k++) {
        const mpq_linear *L = &C->m->layer[l].lin[k];
        if (L->W) continue;
        mpq__lin_rows(L, 0, L->rows, C->lw[k]);
        C->Wp[l * MPQ_LIN_COUNT + k] = C->lw[k];
    }
}

static const float *mpq__cal_W(const mpq__cal *C, int i) { return C->Wp[i] ? C->Wp[i] : mpq__lin(C->m, i)->W; }

/* The sums of layer l's four inputs (activation statistics, X^T X). */
static mpq_status mpq__cal_acts_init(mpq__cal *C, int l)
{
    mpq_status st = MPQ_OK;
    for (int k = 0; st == MPQ_OK && k < MPQ__KINDS; k++) {
        const int slot = l * MPQ__KINDS + k;
        const size_t cols = (size_t)mpq__cols_of(&C->m->c, k);
        st = mpq_stat_init(&C->xdiag[slot], cols);
        if (st == MPQ_OK) st = mpq_stat_init(&C->mabs[slot], cols);
        if (st == MPQ_OK && !(C->awq[slot] = (float *)malloc(sizeof(float) * cols * (size_t)C->s->awq_tokens)))
            st = MPQ_ERR_NOMEM;
        if (st == MPQ_OK && C->xtx && !(C->xtx[slot] = (double *)calloc(cols * cols, sizeof(double))))
            st = MPQ_ERR_NOMEM;
    }
    return st;
}

static void mpq__cal_acts_free(mpq__cal *C, int l)
{
    for (int k = 0; k < MPQ__KINDS; k++) {
        const int slot = l * MPQ__KINDS + k;
        mpq_stat_free(&C->xdiag[slot]), mpq_stat_free(&C->mabs[slot]);
        free(C->awq[slot]), C->awq[slot] = NULL;
        if (C->xtx) free(C->xtx[slot]), C->xtx[slot] = NULL;
    }
}

/* Layer l's activation statistics, final once every window has passed it,
   out through C->put (mpq__kinds order: xtx_diag 2, mean_abs 3, awq 4,
   xtx 5). */
static mpq_status mpq__cal_acts_emit(mpq__cal *C, int l)
{
    mpq_status st = MPQ_OK;
    const int acts = (C->s->what & MPQ_CALIB_ACTS) != 0;
    for (int lin = 0; st == MPQ_OK && lin < MPQ_LIN_COUNT; lin++) {
        const int i = l * MPQ_LIN_COUNT + lin, slot = l * MPQ__KINDS + mpq__kind(lin);
        const size_t cols = (size_t)mpq__lin(C->m, i)->cols;
        if (acts) {
            st = mpq_stat_sum(&C->xdiag[slot], C->ebuf);
            if (st == MPQ_OK) st = C->put(C, 2, i, C->ebuf, cols);
            if (st == MPQ_OK) st = mpq_stat_mean(&C->mabs[slot], C->ebuf);
            if (st == MPQ_OK) st = C->put(C, 3, i, C->ebuf, cols);
            if (st == MPQ_OK && C->awq_got[slot] != C->s->awq_tokens)
                st = MPQ_ERR_SIZE; /* every index falls in a window */
            if (st == MPQ_OK) st = C->put(C, 4, i, C->awq[slot], cols * (size_t)C->s->awq_tokens);
        }
        if (st == MPQ_OK && C->xtx) {
            for (size_t j = 0; j < cols * cols; j++) C->ebuf[j] = (float)C->xtx[slot][j];
            st = C->put(C, 5, i, C->ebuf, cols * cols);
        }
    }
    mpq__cal_acts_free(C, l);
    return st;
}

/* The sums of layer l's maps' gradients (Fisher, MixLLM with its delta). */
static mpq_status mpq__cal_grads_init(mpq__cal *C, int l)
{
    mpq_status st = MPQ_OK;
    for (int lin = 0; st == MPQ_OK && lin < MPQ_LIN_COUNT; lin++) {
        const int i = l * MPQ_LIN_COUNT + lin;
        const mpq_linear *L = mpq__lin(C->m, i);
        const size_t nw = (size_t)L->rows * (size_t)L->cols;
        if (C->fisher) st = mpq_stat_init(&C->fisher[i], nw);
        if (st != MPQ_OK || !C->mixllm) continue;
        const mpq_rotation *r = mpq__cal_rot(C, lin); /* rotated: Q(W') - W' */
        const float *W = mpq__cal_W(C, i);
        st = mpq_stat_init(&C->mixllm[i], (size_t)L->rows);
        if (st == MPQ_OK && !(C->delta[i] = (float *)malloc(sizeof(float) * nw))) st = MPQ_ERR_NOMEM;
        if (st == MPQ_OK) st = mpq__rtn(L, W, r, C->s->mixllm_bits, 0, C->delta[i], C->rbuf);
        const float *Wd = r ? C->rbuf : W;
        for (size_t k = 0; st == MPQ_OK && k < nw; k++) C->delta[i][k] -= Wd[k];
    }
    return st;
}

static void mpq__cal_grads_free(mpq__cal *C, int l)
{
    for (int lin = 0; lin < MPQ_LIN_COUNT; lin++) {
        const int i = l * MPQ_LIN_COUNT + lin;
        if (C->fisher) mpq_stat_free(&C->fisher[i]);
        if (C->mixllm) mpq_stat_free(&C->mixllm[i]);
        if (C->delta) free(C->delta[i]), C->delta[i] = NULL;
    }
}

/* Layer l's gradient statistics out through C->put (fisher 0, mixllm 1). */
static mpq_status mpq__cal_grads_emit(mpq__cal *C, int l)
{
    mpq_status st = MPQ_OK;
    for (int lin = 0; st == MPQ_OK && lin < MPQ_LIN_COUNT; lin++) {
        const int i = l * MPQ_LIN_COUNT + lin;
        const mpq_linear *L = mpq__lin(C->m, i);
        if (C->fisher) {
            st = mpq_stat_mean(&C->fisher[i], C->ebuf);
            if (st == MPQ_OK) st = C->put(C, 0, i, C->ebuf, (size_t)L->rows * (size_t)L->cols);
        }
        if (st == MPQ_OK && C->mixllm) {
            st = mpq_stat_mean(&C->mixllm[i], C->ebuf);
            if (st == MPQ_OK) st = C->put(C, 1, i, C->ebuf, (size_t)L->rows);
        }
    }
    mpq__cal_grads_free(C, l);
    return st;
}

/* Sequence q's gradient dx (len x dim) back through layer l: the layer
   recomputed from q's kept input, its maps' weight gradients to on_grad,
   dx replaced by the gradient at the layer's input. */
static mpq_status mpq__seq_bwd(mpq__cal *C, int l, int q, float *dx, mpq_grad_cb on_grad)
{
    mpq_llm_train *t = C->t;
    mpq__slot *S = &t->slot[0];
    const size_t TD = (size_t)C->len * (size_t)C->m->c.dim;
    const mpq_status st = mpq__keep_io(&C->keep, l, q, S->xin, 0, C->err);
    if (st != MPQ_OK) return st;
    mpq__layer_fwd(C->m, t, C->Wp, l, S->xin, S, t->xf, C->len, NULL, NULL);
    memcpy(t->dx, dx, sizeof(float) * TD);
    mpq__layer_bwd(C->m, t, C->Wp, l, S, C->len, on_grad, C, NULL);
    memcpy(dx, t->dx, sizeof(float) * TD);
    return C->st;
}

/* Phase 1, a layer at a time. Forward: every window's hidden state passes
   layer l (the activation statistics of l's inputs are then final and go
   out) and is kept for the backward pass when gradients are wanted. The
   head gives each window's loss and the gradient at the last layer's
   output. Backward, from the top layer down: every window's gradient
   passes layer l, whose activations are recomputed from the kept input
   (the Fisher and MixLLM sums of l's maps are then final and go out).
   Each statistic gets the same sums in the same order as when each window
   runs through the whole model, so the results are those bits; memory
   holds one layer's weights and sums, every window's hidden state and
   gradient, and the kept inputs (C->keep). */
static mpq_status mpq__cal_layers(mpq__cal *C)
{
    const mpq_llm *m = C->m;
    const mpq_llm_config *c = &m->c;
    mpq_calib_stats *s = C->s;
    mpq_llm_train *t = C->t;
    mpq__resume *R = C->res;
    mpq__slot *S = &t->slot[0];
    const int NW = s->windows, T = C->len, L = c->layers;
    const int grads = (s->what & (MPQ_CALIB_FISHER | MPQ_CALIB_MIXLLM)) != 0;
    const int acts = (s->what & (MPQ_CALIB_ACTS | MPQ_CALIB_XTX)) != 0;
    const size_t TD = (size_t)T * (size_t)c->dim;
    float *h = (float *)malloc(sizeof(float) * TD * (size_t)NW);
    float *dx = grads ? (float *)malloc(sizeof(float) * TD * (size_t)NW) : NULL;
    mpq_status st = h && (dx || !grads) ? MPQ_OK : MPQ_ERR_NOMEM;
    if (st == MPQ_OK && grads)
        st = mpq__keep_open(&C->keep, L, NW, TD, C->o->keep_bytes ? C->o->keep_bytes : MPQ_CALIB_KEEP_BYTES,
                            C->o->spill_dir, R ? R->dir : NULL, "keep.bin", C->err);
    const int phase = R ? R->phase : 0; /* where a resumed run starts */
    double loss_sum = phase ? R->loss_sum : 0.0;
    if (st == MPQ_OK && phase == 0 && R && R->layer > 0) {
        st = mpq__rread(R, "h.bin", h, sizeof(float) * TD * (size_t)NW, C->err);
    } else if (st == MPQ_OK && phase == 0) {
        for (int w = 0; w < NW; w++) {
            mpq__window(C, w);
            mpq__embed(m, C->win, T, h + (size_t)w * TD);
        }
    }
    for (int l = phase == 0 && R ? R->layer : phase == 0 ? 0 : L; st == MPQ_OK && l < L; l++) {
        mpq__cal_layer_w(C, l);
        if (acts) st = mpq__cal_acts_init(C, l);
        if (st == MPQ_OK && R && acts) st = mpq__res_layer_open(R, 'f', l, C->err);
        for (int w = 0; st == MPQ_OK && w < NW; w++) {
            float *x = h + (size_t)w * TD;
            C->window = w;
            if (grads) st = mpq__keep_io(&C->keep, l, w, x, 1, C->err);
            if (st != MPQ_OK) break;
            mpq__layer_fwd(m, t, C->Wp, l, x, S, t->xf, T, acts ? mpq__cal_observe : NULL, C);
            memcpy(x, t->xf, sizeof(float) * TD);
            st = C->st;
            mpq__progress(C, "forward", l * NW + w + 1, L * NW);
        }
        if (acts && st == MPQ_OK)
            st = mpq__cal_acts_emit(C, l);
        else if (acts)
            mpq__cal_acts_free(C, l);
        for (int k = 0; k < MPQ_LIN_COUNT; k++) C->Wp[l * MPQ_LIN_COUNT + k] = NULL;
        if (R) { /* the layer's results, then where the pass stands */
            st = mpq__res_layer_close(R, st, C->err);
            if (st == MPQ_OK && grads && fflush(C->keep.f) != 0)
                st = mpq__fail(C->err, MPQ_ERR_IO, C->keep.path, "write failed");
            if (st == MPQ_OK && l + 1 < L) st = mpq__rwrite(R, "h.bin", h, sizeof(float) * TD * (size_t)NW, C->err);
            if (st == MPQ_OK && l + 1 < L) st = mpq__res_state(R, 0, l + 1, 0.0, C->err);
        }
        if (st == MPQ_OK && l + 1 < L && C->o->cancel && C->o->cancel(C->o->user)) st = MPQ_ERR_CANCELLED;
    }
    if (st == MPQ_OK && phase == 0) {
        for (int w = 0; st == MPQ_OK && w < NW; w++) {
            mpq__window(C, w);
            memcpy(t->xf, h + (size_t)w * TD, sizeof(float) * TD);
            double loss = 0;
            st = mpq__head_bwd(m, t, C->win, T, grads, &loss, NULL);
            loss_sum += loss;
            if (grads) memcpy(dx + (size_t)w * TD, t->dx, sizeof(float) * TD);
        }
        free(t->headT), t->headT = NULL; /* the largest buffer, not needed below */
        if (st == MPQ_OK && R && grads) st = mpq__rwrite(R, "dx.bin", dx, sizeof(float) * TD * (size_t)NW, C->err);
        if (st == MPQ_OK && R) st = mpq__res_state(R, grads ? 1 : 2, L - 1, loss_sum, C->err);
    } else if (st == MPQ_OK && phase == 1) {
        st = mpq__rread(R, "dx.bin", dx, sizeof(float) * TD * (size_t)NW, C->err);
    }
    s->loss = loss_sum / NW;
    for (int l = phase == 1 ? R->layer : L - 1; grads && phase < 2 && st == MPQ_OK && l >= 0; l--) {
        mpq__cal_layer_w(C, l);
        st = mpq__cal_grads_init(C, l);
        if (st == MPQ_OK && R) st = mpq__res_layer_open(R, 'b', l, C->err);
        for (int w = 0; st == MPQ_OK && w < NW; w++) {
            if ((st = mpq__seq_bwd(C, l, w, dx + (size_t)w * TD, mpq__cal_grad)) != MPQ_OK) break;
            mpq__progress(C, "backward", (L - 1 - l) * NW + w + 1, L * NW);
        }
        if (st == MPQ_OK)
            st = mpq__cal_grads_emit(C, l);
        else
            mpq__cal_grads_free(C, l);
        for (int k = 0; k < MPQ_LIN_COUNT; k++) C->Wp[l * MPQ_LIN_COUNT + k] = NULL;
        if (R) {
            st = mpq__res_layer_close(R, st, C->err);
            if (st == MPQ_OK && l > 0) st = mpq__rwrite(R, "dx.bin", dx, sizeof(float) * TD * (size_t)NW, C->err);
            if (st == MPQ_OK) st = mpq__res_state(R, l > 0 ? 1 : 2, l - 1, loss_sum, C->err);
        }
        if (st == MPQ_OK && l > 0 && C->o->cancel && C->o->cancel(C->o->user)) st = MPQ_ERR_CANCELLED;
    }
    mpq__keep_close(&C->keep);
    free(h), free(dx);
    return st;
}

/* One layer's arrays of the PQI pass. */
typedef struct mpq__pqi_layer {
    float *w, *wq, *p, *o; /* the layer's maps one after another: W' (rotated), RTN(W'), the point, p V */
    double *acc;           /* sum over the steps of |gradient| */
    float *g;              /* the gradient summed over the windows */
} mpq__pqi_layer;

/* RTN(W') of layer l's maps into P->wq (and W' into P->w when rotated). */
static mpq_status mpq__pqi_targets(mpq__cal *C, mpq__pqi_layer *P, int l)
{
    mpq_status st = MPQ_OK;
    const size_t base = C->off[l * MPQ_LIN_COUNT];
    for (int k = 0; st == MPQ_OK && k < MPQ_LIN_COUNT; k++) {
        const int i = l * MPQ_LIN_COUNT + k;
        const size_t at = C->off[i] - base, nw = C->off[i + 1] - C->off[i];
        const mpq_linear *L = mpq__lin(C->m, i);
        const mpq_rotation *r = mpq__cal_rot(C, k);
        st = mpq__rtn(L, mpq__cal_W(C, i), r, C->s->pqi_bits, 0, P->wq + at, r ? P->w + at : C->rbuf);
        const float *w = r ? P->w + at : mpq__cal_W(C, i);
        for (size_t j = 0; st == MPQ_OK && j < nw; j++) /* mpq_pqi's inputs must be finite */
            if (!(w[j] - w[j] == 0.0f) || !(P->wq[at + j] - P->wq[at + j] == 0.0f)) st = MPQ_ERR_NONFINITE;
    }
    return st;
}

/* The points of PQI's path for layer l at step k of N (mpq_pqi's
   (float)(w + k/N (w~ - w)) per weight, w and w~ = RTN(w) in W' = W V^T
   when rotated; W: the layer's float weights): into P->p, and the layer's
   maps pointed at them (or at P->o, P->p V, when rotated). */
static mpq_status mpq__pqi_point(mpq__cal *C, mpq__pqi_layer *P, const float *const *W, int l, int k)
{
    const double t = (double)k / (double)C->s->pqi_steps;
    const size_t base = C->off[l * MPQ_LIN_COUNT];
    for (int lin = 0; lin < MPQ_LIN_COUNT; lin++) {
        const int i = l * MPQ_LIN_COUNT + lin;
        const size_t at = C->off[i] - base, nw = C->off[i + 1] - C->off[i];
        const mpq_rotation *r = mpq__cal_rot(C, lin);
        const float *w = r ? P->w + at : W[lin];
        const float *wq = P->wq + at;
        float *p = P->p + at;
        for (size_t j = 0; j < nw; j++) p[j] = (float)((double)w[j] + t * ((double)wq[j] - (double)w[j]));
        C->Wp[i] = p;
        if (!r) continue;
        memcpy(P->o + at, p, sizeof(float) * nw);
        const mpq_status st = mpq_rotation_apply(r, P->o + at, mpq__lin(C->m, i)->rows, 1);
        if (st != MPQ_OK) return st;
        C->Wp[i] = P->o + at;
    }
    return MPQ_OK;
}

/* Phase 2: PQI along W -> RTN(W) (every map moved at once), a layer at a
   time. mpq_pqi's gradient at step k is the mean over the PQI windows of
   the loss gradient with every map at its step-k point; here every
   (step, window) pair is a sequence of its own: all of them pass layer l
   (its maps at their points of that step) before any passes l + 1, their
   inputs kept as phase 1 keeps them (C->keep); the head gives each one's
   gradient; backward from the top, layer l's gradients of each step are
   summed over the windows in window order, then |.| summed over the steps
   in float64, as mpq_pqi does: the same bits as the whole model at once.
   Memory: a layer's weights 4 times over (6 when rotated), its sums in
   float64, and 2 x steps x windows hidden states. */
static mpq_status mpq__cal_pqi(mpq__cal *C)
{
    const mpq_llm *m = C->m;
    const mpq_llm_config *c = &m->c;
    mpq_llm_train *t = C->t;
    mpq__slot *S = &t->slot[0];
    const int N = C->s->pqi_steps, PW = C->s->pqi_windows, T = C->len, L = c->layers, NS = N * PW;
    const size_t TD = (size_t)T * (size_t)c->dim, LW = C->off[MPQ_LIN_COUNT];
    const int rot = C->rot != NULL;
    mpq__pqi_layer P;
    memset(&P, 0, sizeof P);
    float *h = (float *)malloc(sizeof(float) * TD * (size_t)NS), *dx = (float *)malloc(sizeof(float) * TD * (size_t)NS);
    P.wq = (float *)malloc(sizeof(float) * LW), P.p = (float *)malloc(sizeof(float) * LW);
    P.g = (float *)malloc(sizeof(float) * LW), P.acc = (double *)malloc(sizeof(double) * LW);
    if (rot) P.w = (float *)malloc(sizeof(float) * LW), P.o = (float *)malloc(sizeof(float) * LW);
    mpq_status st = h && dx && P.wq && P.p && P.g && P.acc && (!rot || (P.w && P.o)) ? MPQ_OK : MPQ_ERR_NOMEM;
    mpq__resume *R = C->res;
    const int phase = R && R->phase >= 3 ? R->phase : 2; /* 2: from the start; 3, 4: where a resumed run was */
    const size_t hbytes = sizeof(float) * TD * (size_t)NS;
    if (st == MPQ_OK)
        st = mpq__keep_open(&C->keep, L, NS, TD, C->o->keep_bytes ? C->o->keep_bytes : MPQ_CALIB_KEEP_BYTES,
                            C->o->spill_dir, R ? R->dir : NULL, "pqi-keep.bin", C->err);
    if (st == MPQ_OK && phase == 3) {
        st = mpq__rread(R, "pqi-h.bin", h, hbytes, C->err);
    } else if (st == MPQ_OK && phase == 2) {
        for (int w = 0; w < PW; w++) { /* sequence k * PW + w: window w at step k + 1 */
            mpq__window(C, w);
            mpq__embed(m, C->win, T, h + (size_t)w * TD);
            for (int k = 1; k < N; k++) memcpy(h + ((size_t)k * PW + w) * TD, h + (size_t)w * TD, sizeof(float) * TD);
        }
    }
    const float *W[MPQ_LIN_COUNT];
    for (int l = phase == 3 ? R->layer : phase == 2 ? 0 : L; st == MPQ_OK && l < L; l++) { /* forward */
        mpq__cal_layer_w(C, l);
        for (int k = 0; k < MPQ_LIN_COUNT; k++) W[k] = mpq__cal_W(C, l * MPQ_LIN_COUNT + k);
        st = mpq__pqi_targets(C, &P, l);
        for (int k = 0; st == MPQ_OK && k < N; k++) {
            st = mpq__pqi_point(C, &P, W, l, k + 1);
            for (int w = 0; st == MPQ_OK && w < PW; w++) {
                float *x = h + ((size_t)k * PW + w) * TD;
                if ((st = mpq__keep_io(&C->keep, l, k * PW + w, x, 1, C->err)) != MPQ_OK) break;
                mpq__layer_fwd(m, t, C->Wp, l, x, S, t->xf, T, NULL, NULL);
                memcpy(x, t->xf, sizeof(float) * TD);
            }
        }
        for (int k = 0; k < MPQ_LIN_COUNT; k++) C->Wp[l * MPQ_LIN_COUNT + k] = NULL;
        mpq__progress(C, "pqi", l + 1, 2 * L);
        if (R && st == MPQ_OK && fflush(C->keep.f) != 0)
            st = mpq__fail(C->err, MPQ_ERR_IO, C->keep.path, "write failed");
        if (R && st == MPQ_OK && l + 1 < L) st = mpq__rwrite(R, "pqi-h.bin", h, hbytes, C->err);
        if (R && st == MPQ_OK && l + 1 < L) st = mpq__res_state(R, 3, l + 1, R->loss_sum, C->err);
        if (st == MPQ_OK && l + 1 < L && C->o->cancel && C->o->cancel(C->o->user)) st = MPQ_ERR_CANCELLED;
    }
    if (phase <= 3) {
        for (int q = 0; st == MPQ_OK && q < NS; q++) { /* the head: each sequence's gradient at the top */
            mpq__window(C, q % PW);
            memcpy(t->xf, h + (size_t)q * TD, sizeof(float) * TD);
            st = mpq__head_bwd(m, t, C->win, T, 1, NULL, NULL);
            memcpy(dx + (size_t)q * TD, t->dx, sizeof(float) * TD);
        }
        if (R && st == MPQ_OK) st = mpq__rwrite(R, "pqi-dx.bin", dx, hbytes, C->err);
        if (R && st == MPQ_OK) st = mpq__res_state(R, 4, L - 1, R->loss_sum, C->err);
        if (st == MPQ_OK && C->o->cancel && C->o->cancel(C->o->user)) st = MPQ_ERR_CANCELLED;
    } else if (st == MPQ_OK && phase == 4) {
        st = mpq__rread(R, "pqi-dx.bin", dx, hbytes, C->err);
    }
    free(t->headT), t->headT = NULL;
    C->wscale = 1.0 / PW;
    for (int l = phase <= 3 ? L - 1 : phase == 4 ? R->layer : -1; st == MPQ_OK && l >= 0; l--) { /* backward */
        if (R && (st = mpq__res_layer_open(R, 'p', l, C->err)) != MPQ_OK) break;
        mpq__cal_layer_w(C, l);
        for (int k = 0; k < MPQ_LIN_COUNT; k++) W[k] = mpq__cal_W(C, l * MPQ_LIN_COUNT + k);
        st = mpq__pqi_targets(C, &P, l);
        for (size_t j = 0; j < LW; j++) P.acc[j] = 0.0;
        C->grad = P.g, C->goff = l * MPQ_LIN_COUNT;
        for (int k = 0; st == MPQ_OK && k < N; k++) {
            st = mpq__pqi_point(C, &P, W, l, k + 1);
            memset(P.g, 0, sizeof(float) * LW);
            for (int w = 0; st == MPQ_OK && w < PW; w++) {
                const int q = k * PW + w;
                st = mpq__seq_bwd(C, l, q, dx + (size_t)q * TD, mpq__pqi_grad_cb);
            }
            for (size_t j = 0; st == MPQ_OK && j < LW; j++)
                if (!(P.g[j] - P.g[j] == 0.0f)) st = MPQ_ERR_NONFINITE;
            for (size_t j = 0; st == MPQ_OK && j < LW; j++) P.acc[j] += fabs((double)P.g[j]);
        }
        for (int k = 0; k < MPQ_LIN_COUNT; k++) C->Wp[l * MPQ_LIN_COUNT + k] = NULL;
        for (int k = 0; st == MPQ_OK && k < MPQ_LIN_COUNT; k++) { /* v = the mean over the steps, out */
            const int i = l * MPQ_LIN_COUNT + k;
            const size_t at = C->off[i] - C->off[l * MPQ_LIN_COUNT], nw = C->off[i + 1] - C->off[i];
            for (size_t j = 0; j < nw; j++) P.g[j] = (float)(P.acc[at + j] / N);
            st = C->put(C, 6, i, P.g, nw);
        }
        mpq__progress(C, "pqi", 2 * L - l, 2 * L);
        if (R) { /* the layer's PQI, then where the pass stands */
            st = mpq__res_layer_close(R, st, C->err);
            if (st == MPQ_OK && l > 0) st = mpq__rwrite(R, "pqi-dx.bin", dx, hbytes, C->err);
            if (st == MPQ_OK) st = mpq__res_state(R, l > 0 ? 4 : 5, l > 0 ? l - 1 : 0, R->loss_sum, C->err);
        }
        if (st == MPQ_OK && C->o->cancel && C->o->cancel(C->o->user)) st = MPQ_ERR_CANCELLED;
    }
    mpq__keep_close(&C->keep);
    free(h), free(dx), free(P.w), free(P.wq), free(P.p), free(P.o), free(P.g), free(P.acc);
    return st;
}

/* Phase 3: MXSens layer sensitivity, one linear map at MXINT4 at a time:
   e_i = ||rmsnorm(x_L) - rmsnorm(x_L with map i quantized)||^2 over the
   first sens_tokens tokens of window 0. A layer at a time: the float
   sequence and one sequence per map already quantized pass layer l, after
   which each of l's maps starts a sequence of its own from the float
   sequence's input of l (the same computations as restarting the forward
   pass there). Memory: one layer's weights and nlin + 1 hidden states of
   sens_tokens x dim (kept as phase 1 keeps its inputs: C->keep). */
static mpq_status mpq__cal_sens(mpq__cal *C)
{
    const mpq_llm *m = C->m;
    const mpq_llm_config *c = &m->c;
    mpq_llm_train *t = C->t;
    mpq__slot *S = &t->slot[0];
    const int T = C->s->sens_tokens, D = c->dim, L = c->layers;
    const size_t TD = (size_t)T * (size_t)D;
    size_t maxn = 0;
    for (int k = 0; k < MPQ_LIN_COUNT; k++) maxn = C->off[k + 1] - C->off[k] > maxn ? C->off[k + 1] - C->off[k] : maxn;
    float *ref = (float *)malloc(sizeof(float) * TD), *refn = (float *)malloc(sizeof(float) * TD);
    float *Wq = (float *)malloc(sizeof(float) * maxn);
    double *err = (double *)malloc(sizeof(double) * (size_t)C->nlin);
    mpq_status st = ref && refn && Wq && err ? MPQ_OK : MPQ_ERR_NOMEM;
    mpq__resume *R = C->res;
    const int phase = R && R->phase >= 5 ? R->phase : 4; /* 4: from the start; 5, 6: where a resumed run was */
    if (st == MPQ_OK && phase == 6) {                    /* done before: its result */
        st = mpq__rread(R, "layer-sens.bin", C->s->layer_sens, sizeof(float) * (size_t)C->nlin, C->err);
        free(ref), free(refn), free(Wq), free(err);
        return st;
    }
    if (st == MPQ_OK)
        st = mpq__keep_open(&C->keep, 1, C->nlin, TD, C->o->keep_bytes ? C->o->keep_bytes : MPQ_CALIB_KEEP_BYTES,
                            C->o->spill_dir, R ? R->dir : NULL, "sens-keep.bin", C->err);
    const int l0 = phase == 5 ? R->layer : 0;
    if (st == MPQ_OK && l0 > 0) {
        st = mpq__rread(R, "sens-ref.bin", ref, sizeof(float) * TD, C->err);
    } else if (st == MPQ_OK) {
        mpq__window(C, 0);
        mpq__embed(m, C->win, T, ref);
    }
    for (int l = l0; st == MPQ_OK && l < L; l++) {
        mpq__cal_layer_w(C, l);
        for (int i = 0; st == MPQ_OK && i < l * MPQ_LIN_COUNT; i++) { /* the maps of the layers below */
            if ((st = mpq__keep_io(&C->keep, 0, i, S->xin, 0, C->err)) != MPQ_OK) break;
            mpq__layer_fwd(m, t, C->Wp, l, S->xin, S, t->xf, T, NULL, NULL);
            st = mpq__keep_io(&C->keep, 0, i, t->xf, 1, C->err);
        }
        for (int k = 0; st == MPQ_OK && k < MPQ_LIN_COUNT; k++) { /* l's own maps, from the float input */
            const int i = l * MPQ_LIN_COUNT + k;
            const mpq_rotation *r = mpq__cal_rot(C, k); /* rotated: MXINT4(W') V */
            const float *keep = C->Wp[i];
            if ((st = mpq__rtn(mpq__lin(m, i), mpq__cal_W(C, i), r, 4, 1, Wq, C->rbuf)) != MPQ_OK) break;
            if (r && (st = mpq_rotation_apply(r, Wq, mpq__lin(m, i)->rows, 1)) != MPQ_OK) break;
            C->Wp[i] = Wq;
            mpq__layer_fwd(m, t, C->Wp, l, ref, S, t->xf, T, NULL, NULL);
            C->Wp[i] = keep;
            st = mpq__keep_io(&C->keep, 0, i, t->xf, 1, C->err);
        }
        if (st == MPQ_OK) {
            mpq__layer_fwd(m, t, C->Wp, l, ref, S, t->xf, T, NULL, NULL);
            memcpy(ref, t->xf, sizeof(float) * TD);
        }
        for (int k = 0; k < MPQ_LIN_COUNT; k++) C->Wp[l * MPQ_LIN_COUNT + k] = NULL;
        mpq__progress(C, "sensitivity", l + 1, L);
        if (R && st == MPQ_OK && l + 1 < L) { /* where the pass stands */
            if (fflush(C->keep.f) != 0) st = mpq__fail(C->err, MPQ_ERR_IO, C->keep.path, "write failed");
            if (st == MPQ_OK) st = mpq__rwrite(R, "sens-ref.bin", ref, sizeof(float) * TD, C->err);
            if (st == MPQ_OK) st = mpq__res_state(R, 5, l + 1, R->loss_sum, C->err);
        }
        if (st == MPQ_OK && l + 1 < L && C->o->cancel && C->o->cancel(C->o->user)) st = MPQ_ERR_CANCELLED;
    }
    if (st == MPQ_OK) mpq__rmsnorm(ref, m->out_norm, refn, T, D, c->norm_eps);
    for (int i = 0; st == MPQ_OK && i < C->nlin; i++) {
        if ((st = mpq__keep_io(&C->keep, 0, i, S->xin, 0, C->err)) != MPQ_OK) break;
        mpq__rmsnorm(S->xin, m->out_norm, t->hf, T, D, c->norm_eps);
        double e = 0;
        for (size_t k = 0; k < TD; k++) {
            const double d = (double)t->hf[k] - refn[k];
            e += d * d;
        }
        err[i] = e;
    }
    mpq__keep_close(&C->keep);
    if (st == MPQ_OK) st = mpq_mxsens_layer_sensitivity(err, C->nlin, C->s->layer_sens);
    if (R && st == MPQ_OK) st = mpq__rwrite(R, "layer-sens.bin", C->s->layer_sens, sizeof(float) * C->nlin, C->err);
    if (R && st == MPQ_OK) st = mpq__res_state(R, 6, 0, R->loss_sum, C->err);
    free(ref), free(refn), free(Wq), free(err);
    return st;
}

/* What a resume directory must be from: the model (its description and the
   first row of every linear map), the tokens and the options. */
static mpq_status mpq__res_identity(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_calib_stats *s,
                                    char **out)
{
    char *cfg = NULL;
    mpq_status st = mpq_llm_config_json(&m->c, &cfg);
    if (st != MPQ_OK) return st;
    uint64_t hw = 1469598103934665603ull, ht = hw;
    float *row = (float *)malloc(sizeof(float) * (size_t)(m->c.ffn > m->c.dim ? m->c.ffn : m->c.dim) * 2);
    for (int i = 0; row && i < m->c.layers * MPQ_LIN_COUNT; i++) {
        const mpq_linear *L = mpq__lin(m, i);
        mpq__lin_rows(L, 0, 1, row);
        const uint8_t *b = (const uint8_t *)row;
        for (size_t k = 0; k < sizeof(float) * (size_t)L->cols; k++) hw = (hw ^ b[k]) * 1099511628211ull;
    }
    const uint8_t *tb = (const uint8_t *)tokens;
    for (size_t k = 0; k < n * sizeof(int32_t); k++) ht = (ht ^ tb[k]) * 1099511628211ull;
    const size_t cap = strlen(cfg) + 512;
    char *id = row ? (char *)malloc(cap) : NULL;
    if (id)
        snprintf(
            id, cap,
            "weights %016llx; tokens %zu %016llx; what %u windows %d length %d awq %d mixllm %d pqi %d %d %d sens %d "
            "rotate %d %llu; %s",
            (unsigned long long)hw, n, (unsigned long long)ht, s->what, s->windows, s->length, s->awq_tokens,
            s->mixllm_bits, s->pqi_bits, s->pqi_steps, s->pqi_windows, s->sens_tokens, s->rotate,
            (unsigned long long)s->rotate_seed, cfg);
    free(row);
    free(cfg);
    if (!id) return MPQ_ERR_NOMEM;
    *out = id;
    return MPQ_OK;
}

/* The in-memory destination of the statistics: s's arrays. */
static mpq_status mpq__put_memory(mpq__cal *C, int kind, int i, const float *v, size_t n)
{
    mpq_calib_stats *s = C->s;
    float ***a = kind == 0 ? &s->fisher
        : kind == 1        ? &s->mixllm
        : kind == 2        ? &s->xtx_diag
        : kind == 3        ? &s->mean_abs
        : kind == 4        ? &s->awq
        : kind == 5        ? &s->xtx
                           : &s->pqi;
    if (!*a && !(*a = (float **)calloc((size_t)s->nlin, sizeof(float *)))) return MPQ_ERR_NOMEM;
    float *d = (float *)malloc(sizeof(float) * (n ? n : 1));
    if (!d) return MPQ_ERR_NOMEM;
    memcpy(d, v, sizeof(float) * n);
    free((*a)[i]);
    (*a)[i] = d;
    return MPQ_OK;
}

/* Every statistic o asks for: those of phase 1 (a layer at a time) through
   put as each is final, PQI and the layer sensitivity (over the whole
   model) into out's arrays; out's counts and loss. */
static mpq_status mpq__calibrate(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_calib_opts *o,
                                 mpq_calib_stats *out,
                                 mpq_status (*put)(mpq__cal *C, int kind, int i, const float *v, size_t n),
                                 void *put_user, mpq_io_err *err)
{
    if (!m || !tokens || !out) return MPQ_ERR_ARG;
    mpq_calib_opts d;
    memset(&d, 0, sizeof d);
    if (o) d = *o;
    mpq_calib_stats s;
    memset(&s, 0, sizeof s);
    s.what = d.what ? d.what : MPQ_CALIB_ALL;
    s.length = d.length ? d.length : 512;
    s.windows = d.windows ? d.windows : 16;
    s.awq_tokens = d.awq_tokens ? d.awq_tokens : 128;
    s.mixllm_bits = d.mixllm_bits ? d.mixllm_bits : 4;
    s.pqi_bits = d.pqi_bits ? d.pqi_bits : 3;
    s.pqi_steps = d.pqi_steps ? d.pqi_steps : 4;
    s.pqi_windows = d.pqi_windows ? d.pqi_windows : 4;
    s.sens_tokens = d.sens_tokens ? d.sens_tokens : 256;
    s.rotate = d.rotate, s.rotate_seed = d.rotate ? d.rotate_seed : 0;
    if (s.what & ~(MPQ_CALIB_ALL | MPQ_CALIB_XTX) || d.rotate < 0 || d.rotate > 1 || s.length < 2 || s.windows < 1 ||
        s.awq_tokens < 1 || s.mixllm_bits < 1 || s.mixllm_bits > 8 || s.pqi_bits < 1 || s.pqi_bits > 8 ||
        s.pqi_steps < 1 || s.pqi_windows < 1 || s.sens_tokens < 2 || d.windows < 0 || d.length < 0)
        return mpq__fail(err, MPQ_ERR_ARG, "calibration", "an option is out of range");
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->c.vocab)
            return mpq__fail(err, MPQ_ERR_ARG, "calibration text", "token %d at %zu is outside the vocabulary",
                             (int)tokens[i], i);
    if (n < (size_t)s.length)
        return mpq__fail(err, MPQ_ERR_SIZE, "calibration text", "%zu tokens, shorter than one window of %d", n,
                         s.length);
    if ((size_t)s.windows > n / (size_t)s.length) s.windows = (int)(n / (size_t)s.length);
    if (s.pqi_windows > s.windows) s.pqi_windows = s.windows;
    if (s.sens_tokens > s.length) s.sens_tokens = s.length;
    const long act_total = (long)s.windows * (s.length - 1);
    if (s.awq_tokens > act_total) s.awq_tokens = (int)act_total;
    s.nlin = m->c.layers * MPQ_LIN_COUNT;
    s.act_tokens = act_total;

    mpq__cal C;
    memset(&C, 0, sizeof C);
    C.m = m, C.s = &s, C.nlin = s.nlin, C.len = s.length, C.tokens = tokens, C.n = n, C.nwin = s.windows;
    C.o = &d, C.t0 = mpq__now(), C.act_total = act_total, C.put = put, C.put_user = put_user, C.err = err;
    mpq_status st = mpq__train_new(m, s.length, 1, 1, &C.t);
    if (st == MPQ_ERR_UNSUPPORTED)
        return mpq__fail(err, st, m->path ? m->path : "model",
                         "calibration needs float weights (a packed model cannot be calibrated)");
    if (st != MPQ_OK) return mpq__fail(err, st, "calibration", "%s", mpq_status_str(st));
    const int slots = m->c.layers * MPQ__KINDS;
    C.off = (size_t *)calloc((size_t)C.nlin + 1, sizeof(size_t));
    C.Wp = (const float **)calloc((size_t)C.nlin, sizeof(float *));
    C.win = (int32_t *)malloc(sizeof(int32_t) * (size_t)s.length);
    st = C.off && C.Wp && C.win ? MPQ_OK : MPQ_ERR_NOMEM;
    size_t maxw = 0, maxc = 0; /* the largest map, the largest input */
    for (int i = 0; st == MPQ_OK && i < C.nlin; i++) {
        C.off[i + 1] = C.off[i] + (size_t)mpq__lin(m, i)->rows * (size_t)mpq__lin(m, i)->cols;
        maxw = C.off[i + 1] - C.off[i] > maxw ? C.off[i + 1] - C.off[i] : maxw;
    }
    for (int k = 0; k < MPQ__KINDS; k++)
        maxc = (size_t)mpq__cols_of(&m->c, k) > maxc ? (size_t)mpq__cols_of(&m->c, k) : maxc;
    if (st == MPQ_OK && s.rotate) {
        const size_t block = maxc * (size_t)s.length;
        C.rot = (mpq_rotation *)calloc(MPQ__KINDS, sizeof(mpq_rotation));
        C.rbuf = (float *)malloc(sizeof(float) * (block > maxw ? block : maxw));
        if (!C.rot || !C.rbuf) st = MPQ_ERR_NOMEM;
        for (int k = 0; st == MPQ_OK && k < MPQ__KINDS; k++)
            st = mpq_rotation_init(&C.rot[k], mpq__cols_of(&m->c, k), s.rotate_seed);
        if (st == MPQ_ERR_SIZE) {
            mpq__cal_free(&C);
            return mpq__fail(err, st, "calibration", "no rotation of this model's input sizes (an odd part above %d)",
                             MPQ_ROTATION_MAX_ODD);
        }
    }
    const int phase1 = (s.what & (MPQ_CALIB_FISHER | MPQ_CALIB_MIXLLM | MPQ_CALIB_ACTS | MPQ_CALIB_XTX)) != 0;
    if (st == MPQ_OK && (phase1 || d.resume_dir)) { /* a statistic on its way out (or in from the directory) */
        const size_t eb = s.what & MPQ_CALIB_XTX ? maxc * maxc : maxc * (size_t)s.awq_tokens;
        C.ebuf_n = eb > maxw ? eb : maxw;
        if (!(C.ebuf = (float *)malloc(sizeof(float) * C.ebuf_n))) st = MPQ_ERR_NOMEM;
    }
    if (st == MPQ_OK && phase1) { /* the sums: pointers for every map and input, arrays for one layer at a time */
        if (s.what & MPQ_CALIB_FISHER) C.fisher = (mpq_stat *)calloc((size_t)C.nlin, sizeof(mpq_stat));
        if (s.what & MPQ_CALIB_MIXLLM) {
            C.mixllm = (mpq_stat *)calloc((size_t)C.nlin, sizeof(mpq_stat));
            C.delta = (float **)calloc((size_t)C.nlin, sizeof(float *));
        }
        C.xdiag = (mpq_stat *)calloc((size_t)slots, sizeof(mpq_stat));
        C.mabs = (mpq_stat *)calloc((size_t)slots, sizeof(mpq_stat));
        C.awq = (float **)calloc((size_t)slots, sizeof(float *));
        C.awq_got = (int *)calloc((size_t)slots, sizeof(int));
        if (s.what & MPQ_CALIB_XTX) C.xtx = (double **)calloc((size_t)slots, sizeof(double *));
        if ((!C.fisher && (s.what & MPQ_CALIB_FISHER)) || ((!C.mixllm || !C.delta) && (s.what & MPQ_CALIB_MIXLLM)) ||
            !C.xdiag || !C.mabs || !C.awq || !C.awq_got || (!C.xtx && (s.what & MPQ_CALIB_XTX)))
            st = MPQ_ERR_NOMEM;
    }
    for (int k = 0; st == MPQ_OK && k < MPQ_LIN_COUNT; k++) /* a model in place: one layer converted */
        if (!mpq__lin(m, k)->W &&
            !(C.lw[k] = (float *)malloc(sizeof(float) * (size_t)mpq__lin(m, k)->rows * mpq__lin(m, k)->cols)))
            st = MPQ_ERR_NOMEM;
    mpq__resume R;
    memset(&R, 0, sizeof R);
    if (st == MPQ_OK && d.resume_dir) {
        R.dir = d.resume_dir, R.put = put;
        st = mpq__res_identity(m, tokens, n, &s, &R.ident);
        if (st == MPQ_OK) st = mpq__res_load(&R, m->c.layers, err);
        if (st == MPQ_OK) C.res = &R, C.put = mpq__put_resume;
    }
    if (st == MPQ_OK && phase1) st = mpq__cal_layers(&C);
    if (st == MPQ_OK && (s.what & MPQ_CALIB_PQI)) st = mpq__cal_pqi(&C);
    if (st == MPQ_OK && (s.what & MPQ_CALIB_LAYER_SENS)) {
        st = (s.layer_sens = (float *)malloc(sizeof(float) * (size_t)C.nlin)) ? MPQ_OK : MPQ_ERR_NOMEM;
        if (st == MPQ_OK) st = mpq__cal_sens(&C);
    }
    if (st == MPQ_OK && C.res) { /* every pass done: the statistics to the caller, the directory emptied */
        C.put = R.put;
        st = mpq__res_deliver(&C, (s.what & (MPQ_CALIB_ACTS | MPQ_CALIB_XTX)) != 0,
                              (s.what & (MPQ_CALIB_FISHER | MPQ_CALIB_MIXLLM)) != 0, (s.what & MPQ_CALIB_PQI) != 0);
    }
    if (R.w) mpq_st_writer_abort(R.w);
    free(R.ident);
    mpq__cal_free(&C);
    if (st != MPQ_OK) {
        mpq_calib_stats_free(&s);
        if (err && !err->msg[0]) mpq__fail(err, st, "calibration", "%s", mpq_status_str(st));
        return st;
    }
    *out = s;
    return MPQ_OK;
}

mpq_status mpq_llm_calibrate(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_calib_opts *o,
                             mpq_calib_stats *out, mpq_io_err *err)
{
    if (err) err->msg[0] = 0;
    return mpq__calibrate(m, tokens, n, o, out, mpq__put_memory, NULL, err);
}

/* ========================================================================== */
/* Measured sensitivity                                                       */
/* ========================================================================== */

/* The float model's next-token distribution of one window, for KLDs
   against it: its logits z (T x V), p = softmax(z) and the log-sum-exp of
   each position. */
typedef struct mpq__kref {
    float *z, *p;
    double *lse, *psum;
} mpq__kref;

static void mpq__kref_set(mpq__kref *K, const float *z, int T, int V)
{
    memcpy(K->z, z, sizeof(float) * (size_t)T * (size_t)V);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int i = 0; i < T; i++) {
        const float *zi = K->z + (size_t)i * V;
        float *pi = K->p + (size_t)i * V;
        float mx = zi[0];
        for (int v = 1; v < V; v++) mx = zi[v] > mx ? zi[v] : mx;
        double s = 0;
        for (int v = 0; v < V; v++) s += exp((double)zi[v] - mx);
        K->lse[i] = mx + log(s);
        double ps = 0;
        for (int v = 0; v < V; v++) ps += pi[v] = (float)exp((double)zi[v] - K->lse[i]);
        K->psum[i] = ps;
    }
}

/* The mean over the T positions of KL(P || Q), Q the softmax of z:
   sum_v p_v (log p_v - log q_v) = sum_v p_v (z_ref,v - z_v) / sum_v p_v
   - (lse_ref - lse), in float64 (0 exactly when z is the reference's).
   kt: T doubles of scratch (the sum runs in position order). */
static double mpq__kld_mean(const mpq__kref *K, const float *z, int T, int V, double *kt)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int i = 0; i < T; i++) {
        const float *zi = z + (size_t)i * V, *ri = K->z + (size_t)i * V, *pi = K->p + (size_t)i * V;
        float mx = zi[0];
        for (int v = 1; v < V; v++) mx = zi[v] > mx ? zi[v] : mx;
        double s = 0, d = 0;
        for (int v = 0; v < V; v++) {
            s += exp((double)zi[v] - mx);
            d += (double)pi[v] * ((double)ri[v] - (double)zi[v]);
        }
        kt[i] = d / K->psum[i] - (K->lse[i] - (mx + log(s)));
    }
    double sum = 0;
    for (int i = 0; i < T; i++) sum += kt[i];
    return sum / T;
}

mpq_status mpq_llm_measure(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_measure_opts *o, double *kld,
                           mpq_io_err *err)
{
    if (err) err->msg[0] = 0;
    if (!m || !tokens || !o || !kld || !o->bits || !o->quantize) return MPQ_ERR_ARG;
    const int NB = o->nbits, T = o->length ? o->length : 256;
    int NW = o->windows ? o->windows : 1;
    int bad = NB < 1 || o->windows < 0 || o->length < 0 || T < 2;
    for (int k = 0; !bad && k < NB; k++) bad = o->bits[k] < 1 || o->bits[k] > 8;
    if (bad) return mpq__fail(err, MPQ_ERR_ARG, "measurement", "an option is out of range");
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->c.vocab)
            return mpq__fail(err, MPQ_ERR_ARG, "measurement text", "token %d at %zu is outside the vocabulary",
                             (int)tokens[i], i);
    if (n < (size_t)T)
        return mpq__fail(err, MPQ_ERR_SIZE, "measurement text", "%zu tokens, shorter than one window of %d", n, T);
    if ((size_t)NW > n / (size_t)T) NW = (int)(n / (size_t)T);
    const mpq_llm_config *c = &m->c;
    const int L = c->layers, D = c->dim, V = c->vocab, nlin = L * MPQ_LIN_COUNT;
    const size_t TD = (size_t)T * (size_t)D, TV = (size_t)T * (size_t)V;
    const int nseq = nlin * NB; /* per window: sequence i * NB + k is map i at bits[k] */
    mpq_calib_opts co;          /* what the shared passes read of the options */
    memset(&co, 0, sizeof co);
    co.keep_bytes = o->keep_bytes, co.spill_dir = o->spill_dir, co.cancel = o->cancel, co.progress = o->progress;
    co.user = o->user;
    mpq__cal C;
    memset(&C, 0, sizeof C);
    C.m = m, C.nlin = nlin, C.len = T, C.tokens = tokens, C.n = n, C.nwin = NW, C.o = &co, C.t0 = mpq__now();
    C.err = err;
    mpq_status st = mpq__train_new(m, T, 1, 1, &C.t);
    if (st == MPQ_ERR_UNSUPPORTED)
        return mpq__fail(err, st, m->path ? m->path : "model",
                         "measurement needs float weights (a packed model cannot be measured)");
    if (st != MPQ_OK) return mpq__fail(err, st, "measurement", "%s", mpq_status_str(st));
    size_t maxn = 0;
    for (int k = 0; k < MPQ_LIN_COUNT; k++) {
        const size_t w = (size_t)mpq__lin(m, k)->rows * (size_t)mpq__lin(m, k)->cols;
        maxn = w > maxn ? w : maxn;
    }
    mpq_llm_train *t = C.t;
    mpq__slot *S = &t->slot[0];
    C.Wp = (const float **)calloc((size_t)nlin, sizeof(float *));
    C.win = (int32_t *)malloc(sizeof(int32_t) * (size_t)T);
    float *ref = (float *)malloc(sizeof(float) * TD * (size_t)NW), *Wq = (float *)malloc(sizeof(float) * maxn);
    double *sum = (double *)calloc((size_t)nseq, sizeof(double)), *kt = (double *)malloc(sizeof(double) * (size_t)T);
    mpq__kref K;
    K.z = (float *)malloc(sizeof(float) * TV), K.p = (float *)malloc(sizeof(float) * TV);
    K.lse = (double *)malloc(sizeof(double) * (size_t)T), K.psum = (double *)malloc(sizeof(double) * (size_t)T);
    st = C.Wp && C.win && ref && Wq && sum && kt && K.z && K.p && K.lse && K.psum ? MPQ_OK : MPQ_ERR_NOMEM;
    for (int k = 0; st == MPQ_OK && k < MPQ_LIN_COUNT; k++) /* a model in place: one layer converted */
        if (!mpq__lin(m, k)->W &&
            !(C.lw[k] = (float *)malloc(sizeof(float) * (size_t)mpq__lin(m, k)->rows * mpq__lin(m, k)->cols)))
            st = MPQ_ERR_NOMEM;
    if (st == MPQ_OK)
        st = mpq__keep_open(&C.keep, 1, nseq * NW, TD, o->keep_bytes ? o->keep_bytes : MPQ_CALIB_KEEP_BYTES,
                            o->spill_dir, NULL, NULL, err);
    for (int w = 0; st == MPQ_OK && w < NW; w++) {
        mpq__window(&C, w);
        mpq__embed(m, C.win, T, ref + (size_t)w * TD);
    }
    /* progress in layer passes (a head product as its share of a layer's
       weights), reported in thousandths of the whole */
    double layer_w = 0, done = 0, total = 0;
    for (int k = 0; k < MPQ_LIN_COUNT; k++) layer_w += (double)mpq__lin(m, k)->rows * (double)mpq__lin(m, k)->cols;
    const double head_w = (double)V * (double)D / layer_w;
    for (int l = 0; l < L; l++) total += (double)NW * ((double)(l + 1) * MPQ_LIN_COUNT * NB + 1);
    total += (double)NW * (nseq + 1) * head_w;
    for (int l = 0; st == MPQ_OK && l < L; l++) {
        mpq__cal_layer_w(&C, l);
        for (int q = 0; st == MPQ_OK && q < l * MPQ_LIN_COUNT * NB * NW; q++) { /* the maps of the layers below */
            const int s = q / NW, w = q % NW, at = w * nseq + s;
            if ((st = mpq__keep_io(&C.keep, 0, at, S->xin, 0, err)) != MPQ_OK) break;
            mpq__layer_fwd(m, t, C.Wp, l, S->xin, S, t->xf, T, NULL, NULL);
            st = mpq__keep_io(&C.keep, 0, at, t->xf, 1, err);
        }
        for (int k = 0; st == MPQ_OK && k < MPQ_LIN_COUNT; k++) /* l's own maps, from the float inputs */
            for (int b = 0; st == MPQ_OK && b < NB; b++) {
                const int i = l * MPQ_LIN_COUNT + k;
                const mpq_linear *Li = mpq__lin(m, i);
                const float *keep = C.Wp[i];
                st = o->quantize(o->user, i, o->bits[b], mpq__cal_W(&C, i), Wq);
                if (st != MPQ_OK) {
                    mpq__fail(err, st, "measurement", "quantizing map %d (layer %d) at %d bits: %s", i, l, o->bits[b],
                              mpq_status_str(st));
                    break;
                }
                const size_t nw = (size_t)Li->rows * (size_t)Li->cols;
                for (size_t j = 0; j < nw && st == MPQ_OK; j++)
                    if (!(Wq[j] - Wq[j] == 0.0f)) st = MPQ_ERR_NONFINITE;
                if (st != MPQ_OK) {
                    mpq__fail(err, st, "measurement", "map %d (layer %d) at %d bits: the quantizer gave NaN or Inf", i,
                              l, o->bits[b]);
                    break;
                }
                C.Wp[i] = Wq;
                for (int w = 0; st == MPQ_OK && w < NW; w++) {
                    mpq__layer_fwd(m, t, C.Wp, l, ref + (size_t)w * TD, S, t->xf, T, NULL, NULL);
                    st = mpq__keep_io(&C.keep, 0, w * nseq + i * NB + b, t->xf, 1, err);
                }
                C.Wp[i] = keep;
            }
        for (int w = 0; st == MPQ_OK && w < NW; w++) {
            mpq__layer_fwd(m, t, C.Wp, l, ref + (size_t)w * TD, S, t->xf, T, NULL, NULL);
            memcpy(ref + (size_t)w * TD, t->xf, sizeof(float) * TD);
        }
        for (int k = 0; k < MPQ_LIN_COUNT; k++) C.Wp[l * MPQ_LIN_COUNT + k] = NULL;
        done += (double)NW * ((double)(l + 1) * MPQ_LIN_COUNT * NB + 1);
        mpq__progress(&C, "measure", (int)(1000.0 * done / total), 1000);
        if (st == MPQ_OK && o->cancel && o->cancel(o->user)) st = MPQ_ERR_CANCELLED;
    }
    for (int w = 0; st == MPQ_OK && w < NW; w++) { /* the head: each window's float logits, then its sequences' */
        mpq__rmsnorm(ref + (size_t)w * TD, m->out_norm, t->hf, T, D, c->norm_eps);
        if ((st = mpq__sgemm_lin(&m->head, t->hf, T, t->logits)) != MPQ_OK) break;
        mpq__kref_set(&K, t->logits, T, V);
        for (int s = 0; st == MPQ_OK && s < nseq; s++) {
            if ((st = mpq__keep_io(&C.keep, 0, w * nseq + s, S->xin, 0, err)) != MPQ_OK) break;
            mpq__rmsnorm(S->xin, m->out_norm, t->hf, T, D, c->norm_eps);
            if ((st = mpq__sgemm_lin(&m->head, t->hf, T, t->logits)) != MPQ_OK) break;
            sum[s] += mpq__kld_mean(&K, t->logits, T, V, kt);
            done += head_w;
            if (s % 16 == 15) mpq__progress(&C, "measure", (int)(1000.0 * done / total), 1000);
        }
        if (st == MPQ_OK && o->cancel && o->cancel(o->user)) st = MPQ_ERR_CANCELLED;
    }
    if (st == MPQ_OK) mpq__progress(&C, "measure", 1000, 1000);
    for (int s = 0; st == MPQ_OK && s < nseq; s++) kld[s] = sum[s] / NW;
    free(ref), free(Wq), free(sum), free(kt), free(K.z), free(K.p), free(K.lse), free(K.psum);
    mpq__cal_free(&C);
    if (st != MPQ_OK && err && !err->msg[0]) mpq__fail(err, st, "measurement", "%s", mpq_status_str(st));
    return st;
}

/* ========================================================================== */
/* Sequential quantization                                                    */
/* ========================================================================== */

typedef struct mpq__seq {
    double *xtx[MPQ__KINDS]; /* the current layer's inputs, cols x cols each */
    mpq_status st;
} mpq__seq;

static void mpq__seq_observe(void *user, int layer, int lin, const float *x, int T, int cols)
{
    mpq__seq *S = (mpq__seq *)user;
    (void)layer;
    if (S->st == MPQ_OK) S->st = mpq__xtx_add(S->xtx[mpq__kind(lin)], x, T, cols);
}

mpq_status mpq_llm_quantize_sequential(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_seq_opts *o,
                                       const mpq_recipe *r, const mpq_recipe_map *maps, mpq_packed *out,
                                       mpq_io_err *err)
{
    if (!m || !tokens || !r || !maps || !out) return MPQ_ERR_ARG;
    mpq_seq_opts d;
    memset(&d, 0, sizeof d);
    if (o) d = *o;
    const int len = d.length ? d.length : 512, nlin = m->c.layers * MPQ_LIN_COUNT;
    int windows = d.windows ? d.windows : 64;
    if (d.windows < 0 || d.length < 0 || len < 2 || len > (1 << 16))
        return mpq__fail(err, MPQ_ERR_ARG, "sequential quantization", "an option is out of range");
    if (r->planner != MPQ_PLANNER_NONE || r->requant)
        return mpq__fail(err, MPQ_ERR_ARG, "sequential quantization",
                         "the recipe needs every map at once (a planner: give its plan as r->plan; ReQuant: not "
                         "with GPTQ)");
    for (int i = 0; i < nlin; i++)
        if (maps[i].rows != mpq__lin(m, i)->rows || maps[i].cols != mpq__lin(m, i)->cols)
            return mpq__fail(err, MPQ_ERR_SIZE, "sequential quantization", "map %d: %d x %d, the model's %d x %d", i,
                             maps[i].rows, maps[i].cols, mpq__lin(m, i)->rows, mpq__lin(m, i)->cols);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->c.vocab)
            return mpq__fail(err, MPQ_ERR_ARG, "calibration text", "token %d at %zu is outside the vocabulary",
                             (int)tokens[i], i);
    if (n < (size_t)len)
        return mpq__fail(err, MPQ_ERR_SIZE, "calibration text", "%zu tokens, shorter than one window of %d", n, len);
    if ((size_t)windows > n / (size_t)len) windows = (int)(n / (size_t)len);
    mpq__cal C; /* the windows as calibration takes them */
    memset(&C, 0, sizeof C);
    C.m = m, C.len = len, C.tokens = tokens, C.n = n, C.nwin = windows;
    mpq_status st = mpq__train_new(m, len, 1, 1, &C.t);
    if (st == MPQ_ERR_UNSUPPORTED)
        return mpq__fail(err, st, m->path ? m->path : "model", "sequential quantization needs float weights");
    if (st != MPQ_OK) return mpq__fail(err, st, "sequential quantization", "%s", mpq_status_str(st));
    const mpq_llm_config *c = &m->c;
    const size_t TD = (size_t)len * c->dim;
    mpq__seq S;
    memset(&S, 0, sizeof S);
    float *h = (float *)malloc(sizeof(float) * TD * (size_t)windows); /* every window's hidden state */
    float *H = NULL, *Wq[MPQ_LIN_COUNT] = {NULL}, *Wf[MPQ_LIN_COUNT] = {NULL};
    const float **Wp = (const float **)calloc((size_t)nlin, sizeof(float *));
    const float **Wfl =
        (const float **)calloc((size_t)nlin, sizeof(float *)); /* the float layer (in place: converted) */
    C.win = (int32_t *)malloc(sizeof(int32_t) * (size_t)len);
    size_t maxc = 0;
    for (int k = 0; k < MPQ__KINDS; k++) maxc = (size_t)mpq__cols_of(c, k) > maxc ? (size_t)mpq__cols_of(c, k) : maxc;
    H = (float *)malloc(sizeof(float) * maxc * maxc);
    mpq_recipe rq = *r; /* q, k, v and gate, up share one factorisation of their X^T X (without memory
                           for the cache, each makes its own) */
    mpq_gptq_cache *cache = r->gptq && !r->gptq_opts.cache ? mpq_gptq_cache_new() : NULL;
    if (cache) rq.gptq_opts.cache = cache;
    st = h && Wp && Wfl && C.win && H ? MPQ_OK : MPQ_ERR_NOMEM;
    for (int k = 0; st == MPQ_OK && k < MPQ__KINDS; k++) {
        const size_t cc = (size_t)mpq__cols_of(c, k);
        if (!(S.xtx[k] = (double *)malloc(sizeof(double) * cc * cc))) st = MPQ_ERR_NOMEM;
    }
    for (int k = 0; st == MPQ_OK && k < MPQ_LIN_COUNT; k++) {
        const mpq_linear *L = mpq__lin(m, k);
        if (!(Wq[k] = (float *)malloc(sizeof(float) * (size_t)L->rows * (size_t)L->cols))) st = MPQ_ERR_NOMEM;
        if (st == MPQ_OK && !L->W && !(Wf[k] = (float *)malloc(sizeof(float) * (size_t)L->rows * (size_t)L->cols)))
            st = MPQ_ERR_NOMEM;
    }
    for (int w = 0; st == MPQ_OK && w < windows; w++) {
        mpq__window(&C, w);
        mpq__embed(m, C.win, len, h + (size_t)w * TD);
    }
    int done = 0, at = -1;
    const double t0 = mpq__now();
    mpq__slot *scratch = &C.t->slot[0];
    for (int l = 0; l < c->layers && st == MPQ_OK; l++) {
        for (int k = 0; k < MPQ_LIN_COUNT; k++) { /* a model in place: the layer converted */
            const mpq_linear *L = &m->layer[l].lin[k];
            if (!L->W) mpq__lin_rows(L, 0, L->rows, Wf[k]);
            Wfl[l * MPQ_LIN_COUNT + k] = L->W ? NULL : Wf[k];
        }
        /* X^T X of layer l's inputs with layers 0 .. l-1 quantized, layer l still float */
        for (int k = 0; k < MPQ__KINDS; k++) {
            const size_t cc = (size_t)mpq__cols_of(c, k);
            memset(S.xtx[k], 0, sizeof(double) * cc * cc);
        }
        for (int w = 0; w < windows && S.st == MPQ_OK; w++)
            mpq__layer_fwd(m, C.t, Wfl, l, h + (size_t)w * TD, scratch, C.t->xf, len, mpq__seq_observe, &S);
        st = S.st;
        for (int k = 0; st == MPQ_OK && k < MPQ_LIN_COUNT; k++) {
            const int i = l * MPQ_LIN_COUNT + k, cols = maps[i].cols;
            const double *acc = S.xtx[mpq__kind(k)];
            for (size_t j = 0; j < (size_t)cols * cols; j++) H[j] = (float)acc[j];
            if (d.hessian) d.hessian(d.user, i, H, cols);
            mpq_recipe_map mc = maps[i];
            mc.H = H;
            if (!mc.W) mc.W = Wfl[i] ? Wfl[i] : mpq__lin(m, i)->W; /* the model's own weights */
            at = i;
            if ((st = mpq_recipe_quantize(&rq, i, &mc, NULL, &out[i])) != MPQ_OK) break;
            done = i + 1;
            if ((st = mpq_packed_dequantize(&out[i], 0, Wq[k])) != MPQ_OK) break;
            Wp[i] = Wq[k];
            if (d.store && (st = d.store(d.user, i, &out[i])) != MPQ_OK) break; /* handed over as it is made */
        }
        /* the next layer's input: layer l quantized */
        for (int w = 0; w < windows && st == MPQ_OK; w++) {
            mpq__layer_fwd(m, C.t, Wp, l, h + (size_t)w * TD, scratch, C.t->xf, len, NULL, NULL);
            memcpy(h + (size_t)w * TD, C.t->xf, sizeof(float) * TD);
        }
        for (int k = 0; k < MPQ_LIN_COUNT; k++) Wp[l * MPQ_LIN_COUNT + k] = Wfl[l * MPQ_LIN_COUNT + k] = NULL;
        if (st == MPQ_OK && d.progress) d.progress(d.user, l + 1, c->layers, mpq__now() - t0);
    }
    if (st != MPQ_OK)
        for (int i = 0; i < done; i++) mpq_packed_free(&out[i]);
    for (int k = 0; k < MPQ__KINDS; k++) free(S.xtx[k]);
    for (int k = 0; k < MPQ_LIN_COUNT; k++) free(Wq[k]), free(Wf[k]);
    free(h), free(H), free((void *)Wp), free((void *)Wfl), free(C.win);
    mpq_gptq_cache_free(cache);
    mpq_llm_train_free(C.t);
    if (st != MPQ_OK)
        return at >= 0 ? mpq__fail(err, st, "sequential quantization", "map %d: %s", at, mpq_status_str(st))
                       : mpq__fail(err, st, "sequential quantization", "%s", mpq_status_str(st));
    return MPQ_OK;
}

/* ========================================================================== */
/* The statistics file                                                        */
/* ========================================================================== */

int mpq_calib_parse_seed(const char *v, uint64_t *seed)
{
    if (!v || !*v || strlen(v) > 20) return 0;
    uint64_t x = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9') return 0;
        const uint64_t d = (uint64_t)(*c - '0');
        if (x > (UINT64_MAX - d) / 10) return 0; /* past 2^64 - 1 */
        x = x * 10 + d;
    }
    *seed = x;
    return 1;
}

uint64_t mpq_text_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a, 64 bits */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* The statistics in file order: suffix, which arrays, their shape. */
typedef struct mpq__statkind {
    const char *suffix;
    unsigned flag;
    int shape; /* 0 rows x cols, 1 rows, 2 cols, 3 awq x cols, 4 cols x cols, 5 scalar */
    int nonneg;
} mpq__statkind;

static const mpq__statkind mpq__kinds[] = {
    {"fisher", MPQ_CALIB_FISHER, 0, 1}, {"mixllm", MPQ_CALIB_MIXLLM, 1, 1},
    {"xtx_diag", MPQ_CALIB_ACTS, 2, 1}, {"mean_abs", MPQ_CALIB_ACTS, 2, 1},
    {"awq", MPQ_CALIB_ACTS, 3, 0},      {"xtx", MPQ_CALIB_XTX, 4, 0},
    {"pqi", MPQ_CALIB_PQI, 0, 1},       {"layer_sensitivity", MPQ_CALIB_LAYER_SENS, 5, 1},
};
enum { MPQ__NKINDS = (int)(sizeof mpq__kinds / sizeof mpq__kinds[0]) };

static float **mpq__kind_arrays(mpq_calib_stats *s, int k)
{
    float **v[] = {s->fisher, s->mixllm, s->xtx_diag, s->mean_abs, s->awq, s->xtx, s->pqi, NULL};
    return v[k];
}

static void mpq__kind_shape(const mpq_calib_stats *s, const mpq_linear *L, int shape, int *ndim, uint64_t *dims)
{
    *ndim = shape == 5 ? 0 : shape == 1 || shape == 2 ? 1 : 2;
    dims[0] = shape == 0 || shape == 1 ? (uint64_t)L->rows : shape == 3 ? (uint64_t)s->awq_tokens : (uint64_t)L->cols;
    dims[1] = shape == 5 ? 1 : (uint64_t)L->cols;
    if (shape == 2) dims[0] = (uint64_t)L->cols;
}

/* The "mpq_calib" metadata of a statistics file (malloc'ed). */
static mpq_status mpq__calib_meta(const mpq_calib_stats *s, const char *extra_json, const char *path, char **out,
                                  mpq_io_err *err)
{
    static const char *const keys[] = {"windows",   "length",      "awq_tokens",  "mixllm_bits", "pqi_bits",
                                       "pqi_steps", "pqi_windows", "sens_tokens", "act_tokens",  "loss"};
    const double vals[] = {s->windows,   s->length,      s->awq_tokens,  s->mixllm_bits,        s->pqi_bits,
                           s->pqi_steps, s->pqi_windows, s->sens_tokens, (double)s->act_tokens, s->loss};
    char *meta = NULL;
    mpq_status st = mpq__meta_json(keys, vals, 10, extra_json, path, &meta, err);
    if (st != MPQ_OK) return st;
    if (s->rotate) { /* the seed as a decimal string: a JSON number would round it past 2^53 */
        cJSON *o = cJSON_Parse(meta);
        char seed[24];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->rotate_seed);
        free(meta);
        meta = o && cJSON_AddStringToObject(o, "rotate_seed", seed) ? cJSON_PrintUnformatted(o) : NULL;
        cJSON_Delete(o);
        if (!meta) return mpq__fail(err, MPQ_ERR_NOMEM, path, "out of memory");
    }
    *out = meta;
    return MPQ_OK;
}

/* The map whose X^T X tensor holds lin's (the first that reads its input). */
static int mpq__xtx_owner(int lin)
{
    return lin == MPQ_LIN_K || lin == MPQ_LIN_V ? MPQ_LIN_Q : lin == MPQ_LIN_UP ? MPQ_LIN_GATE : lin;
}

/* X^T X of map i as the file holds it (THE STATISTICS FILE): nothing for a
   map that is not its input's owner, else the lower triangle by rows. */
static mpq_status mpq__write_xtx(mpq_st_writer *w, const char *name, int i, const float *H, size_t cols,
                                 mpq_io_err *err)
{
    if (mpq__xtx_owner(i % MPQ_LIN_COUNT) != i % MPQ_LIN_COUNT) return MPQ_OK;
    const uint64_t n = (uint64_t)cols * (cols + 1) / 2;
    float *p = (float *)malloc(sizeof(float) * (size_t)n);
    if (!p) return MPQ_ERR_NOMEM;
    for (size_t r = 0, at = 0; r < cols; at += ++r) memcpy(p + at, H + r * cols, sizeof(float) * (r + 1));
    const mpq_status st = mpq_st_write_f32(w, name, MPQ_DT_F32, 1, &n, p, err);
    free(p);
    return st;
}

const mpq_st_tensor *mpq_calib_find_xtx(mpq_st_file *f, const char *name, const char *owner)
{
    char key[1024];
    const mpq_st_tensor *t = NULL;
    for (int k = 0; f && name && k < 4 && !t; k++) {
        const char *n = k < 2 ? name : owner;
        if (!n) continue;
        snprintf(key, sizeof key, k % 2 ? "%s.xtx" : "%s", n);
        t = mpq_st_find(f, key);
    }
    return t;
}

mpq_status mpq_calib_read_xtx(mpq_st_file *f, const char *path, const char *name, const char *owner, int cols, float *H,
                              mpq_io_err *err)
{
    if (!f || !name || !H || cols < 1) return MPQ_ERR_ARG;
    if (!path) path = "X^T X";
    const mpq_st_tensor *t = mpq_calib_find_xtx(f, name, owner);
    const char *key = t ? t->name : NULL;
    if (!t)
        return mpq__fail(err, MPQ_ERR_FORMAT, path, "tensor '%s.xtx': not found%s%s%s", name, owner ? " (nor '" : "",
                         owner ? owner : "", owner ? ".xtx')" : "");
    const uint64_t c = (uint64_t)cols, tri = c * (c + 1) / 2;
    const int square = t->ndim == 2 && t->shape[0] == c && t->shape[1] == c;
    if (!square && !(t->ndim == 1 && t->shape[0] == tri))
        return mpq__fail(err, MPQ_ERR_SIZE, path, "tensor '%s': neither %d x %d nor its packed triangle (%llu)", key,
                         cols, cols, (unsigned long long)tri);
    mpq_status st = mpq_st_read_f32(f, t, H, (size_t)t->numel, err);
    if (st != MPQ_OK) return st;
    for (uint64_t j = 0; j < t->numel; j++)
        if (!(H[j] - H[j] == 0.0f))
            return mpq__fail(err, MPQ_ERR_NONFINITE, path, "tensor '%s': element %llu is not finite", key,
                             (unsigned long long)j);
    if (square) return MPQ_OK;
    for (size_t r = (size_t)cols; r-- > 0;) /* rows from the last down, each to its place (never onto one not moved) */
        memmove(H + r * c, H + r * (r + 1) / 2, sizeof(float) * (r + 1));
    enum { B = 64 }; /* then the upper triangle, in tiles of B x B: rows of both stay in the cache */
    for (size_t r0 = 0; r0 < (size_t)cols; r0 += B)
        for (size_t j0 = 0; j0 <= r0; j0 += B)
            for (size_t r = r0; r < r0 + B && r < (size_t)cols; r++)
                for (size_t j = j0; j < j0 + B && j < r; j++) H[j * c + r] = H[r * c + j];
    return MPQ_OK;
}

mpq_status mpq_calib_write(const mpq_llm *m, const mpq_calib_stats *s, const char *extra_json, const char *path,
                           mpq_io_err *err)
{
    if (!m || !s || !path || s->nlin != m->c.layers * MPQ_LIN_COUNT) return MPQ_ERR_ARG;
    char *meta = NULL;
    mpq_status st = mpq__calib_meta(s, extra_json, path, &meta, err);
    if (st != MPQ_OK) return st;
    mpq_st_writer *w = NULL;
    st = mpq_st_writer_open(path, &w, err);
    if (st == MPQ_OK) st = mpq_st_write_meta(w, "mpq_calib", meta, err);
    free(meta);
    char name[512], base[448];
    for (int i = 0; st == MPQ_OK && i < s->nlin; i++) {
        const mpq_linear *L = mpq__lin(m, i);
        mpq_llm_linear_name(m->c.gguf_names, i / MPQ_LIN_COUNT, i % MPQ_LIN_COUNT, 0, base, sizeof base);
        for (int k = 0; st == MPQ_OK && k < MPQ__NKINDS; k++) {
            if (!(s->what & mpq__kinds[k].flag)) continue;
            int ndim;
            uint64_t dims[2];
            mpq__kind_shape(s, L, mpq__kinds[k].shape, &ndim, dims);
            snprintf(name, sizeof name, "%s.%s", base, mpq__kinds[k].suffix);
            const float *v =
                mpq__kinds[k].shape == 5 ? &s->layer_sens[i] : mpq__kind_arrays((mpq_calib_stats *)s, k)[i];
            st = mpq__kinds[k].shape == 4 ? mpq__write_xtx(w, name, i, v, (size_t)dims[0], err)
                                          : mpq_st_write_f32(w, name, MPQ_DT_F32, ndim, dims, v, err);
        }
    }
    if (st == MPQ_OK) return mpq_st_writer_close(w, err);
    mpq_st_writer_abort(w);
    return st;
}

/* A statistic of calibration written to the file as soon as it is final. */
static mpq_status mpq__put_file(mpq__cal *C, int kind, int i, const float *v, size_t n)
{
    mpq_st_writer *w = (mpq_st_writer *)C->put_user;
    char name[512], base[448];
    mpq_llm_linear_name(C->m->c.gguf_names, i / MPQ_LIN_COUNT, i % MPQ_LIN_COUNT, 0, base, sizeof base);
    snprintf(name, sizeof name, "%s.%s", base, mpq__kinds[kind].suffix);
    int ndim;
    uint64_t dims[2];
    mpq__kind_shape(C->s, mpq__lin(C->m, i), mpq__kinds[kind].shape, &ndim, dims);
    if ((uint64_t)n != dims[0] * (ndim == 2 ? dims[1] : 1)) return MPQ_ERR_SIZE; /* internal: shapes agree */
    if (mpq__kinds[kind].shape == 4) return mpq__write_xtx(w, name, i, v, (size_t)dims[0], C->err);
    return mpq_st_write_f32(w, name, MPQ_DT_F32, ndim, dims, v, C->err);
}

mpq_status mpq_llm_calibrate_file(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_calib_opts *o,
                                  const char *extra_json, const char *path, mpq_calib_stats *info, mpq_io_err *err)
{
    if (err) err->msg[0] = 0;
    if (!m || !tokens || !path) return mpq__fail(err, MPQ_ERR_ARG, path, "NULL argument");
    if (extra_json) { /* refused before the work, as mpq_calib_write would refuse it after */
        cJSON *x = cJSON_Parse(extra_json);
        const int ok = x != NULL;
        cJSON_Delete(x);
        if (!ok) return mpq__fail(err, MPQ_ERR_ARG, path, "the extra metadata is not JSON");
    }
    mpq_st_writer *w = NULL;
    mpq_status st = mpq_st_writer_open(path, &w, err);
    if (st != MPQ_OK) return st;
    /* the header's room: every statistic of every map, the metadata; the data is then not copied at the end */
    const uint64_t room =
        (uint64_t)m->c.layers * MPQ_LIN_COUNT * MPQ__NKINDS * 192 + 4096 + (extra_json ? 2 * strlen(extra_json) : 0);
    if ((st = mpq_st_writer_reserve(w, room, err)) != MPQ_OK) {
        mpq_st_writer_abort(w);
        return st;
    }
    mpq_calib_stats s;
    memset(&s, 0, sizeof s);
    st = mpq__calibrate(m, tokens, n, o, &s, mpq__put_file, w, err);
    char name[512], base[448];
    for (int i = 0; st == MPQ_OK && (s.what & MPQ_CALIB_LAYER_SENS) && i < s.nlin; i++) { /* known at the end */
        mpq_llm_linear_name(m->c.gguf_names, i / MPQ_LIN_COUNT, i % MPQ_LIN_COUNT, 0, base, sizeof base);
        snprintf(name, sizeof name, "%s.layer_sensitivity", base);
        const uint64_t one = 1;
        st = mpq_st_write_f32(w, name, MPQ_DT_F32, 0, &one, &s.layer_sens[i], err);
    }
    char *meta = NULL;
    if (st == MPQ_OK) st = mpq__calib_meta(&s, extra_json, path, &meta, err);
    if (st == MPQ_OK) st = mpq_st_write_meta(w, "mpq_calib", meta, err);
    free(meta);
    mpq_calib_stats sum = s; /* the counts and the loss */
    sum.fisher = sum.mixllm = sum.xtx_diag = sum.mean_abs = sum.awq = sum.xtx = sum.pqi = NULL;
    sum.layer_sens = NULL;
    mpq_calib_stats_free(&s);
    if (st == MPQ_OK) { /* the writer is gone after close, whatever the result */
        st = mpq_st_writer_close(w, err);
        if (st == MPQ_OK && info) *info = sum;
        return st;
    }
    mpq_st_writer_abort(w);
    if (err && !err->msg[0]) mpq__fail(err, st, path, "%s", mpq_status_str(st));
    return st;
}

mpq_status mpq_calib_file_basis(const mpq_st_file *f, const char *path, int *rotate, uint64_t *seed, mpq_io_err *err)
{
    if (!f || !rotate || !seed) return MPQ_ERR_ARG;
    *rotate = 0, *seed = 0;
    const char *meta = mpq_st_meta(f, "mpq_calib");
    if (!meta) return MPQ_OK;
    cJSON *o = cJSON_Parse(meta);
    if (!o) return mpq__fail(err, MPQ_ERR_FORMAT, path ? path : "statistics", "mpq_calib metadata is not JSON");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "rotate_seed");
    mpq_status st = MPQ_OK;
    if (v && mpq_calib_parse_seed(cJSON_IsString(v) ? v->valuestring : NULL, seed))
        *rotate = 1;
    else if (v)
        st = mpq__fail(err, MPQ_ERR_FORMAT, path ? path : "statistics",
                       "mpq_calib: 'rotate_seed' is not a decimal seed");
    cJSON_Delete(o);
    return st;
}

mpq_status mpq_calib_read(const mpq_llm *m, const char *path, mpq_calib_stats *out, mpq_io_err *err)
{
    if (!m || !path || !out) return MPQ_ERR_ARG;
    mpq_st_file *f = NULL;
    mpq_status st = mpq_st_open(path, &f, err);
    if (st != MPQ_OK) return st;
    mpq_calib_stats s;
    memset(&s, 0, sizeof s);
    s.nlin = m->c.layers * MPQ_LIN_COUNT;
    const char *meta = mpq_st_meta(f, "mpq_calib");
    cJSON *o = meta ? cJSON_Parse(meta) : NULL;
    if (!o) st = mpq__fail(err, MPQ_ERR_FORMAT, path, "no mpq_calib metadata: not a file mpq calibrate wrote");
    if (st == MPQ_OK) {
        int *fields[] = {&s.windows,  &s.length,    &s.awq_tokens,  &s.mixllm_bits,
                         &s.pqi_bits, &s.pqi_steps, &s.pqi_windows, &s.sens_tokens};
        const char *names[] = {"windows",  "length",    "awq_tokens",  "mixllm_bits",
                               "pqi_bits", "pqi_steps", "pqi_windows", "sens_tokens"};
        for (int k = 0; k < 8 && st == MPQ_OK; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, names[k]);
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 ||
                v->valuedouble != (int)v->valuedouble)
                st = mpq__fail(err, MPQ_ERR_FORMAT, path, "mpq_calib: '%s' is not a count", names[k]);
            else
                *fields[k] = (int)v->valuedouble;
        }
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "loss");
        s.loss = cJSON_IsNumber(v) ? v->valuedouble : 0;
        v = cJSON_GetObjectItemCaseSensitive(o, "act_tokens");
        s.act_tokens = cJSON_IsNumber(v) ? (long)v->valuedouble : 0;
        if (st == MPQ_OK) st = mpq_calib_file_basis(f, path, &s.rotate, &s.rotate_seed, err);
    }
    cJSON_Delete(o);
    char name[512], base[448], first[512];
    /* which statistics the file holds: those of the first linear map */
    int have[MPQ__NKINDS] = {0};
    mpq_llm_linear_name(m->c.gguf_names, 0, 0, 0, base, sizeof base);
    for (int k = 0; st == MPQ_OK && k < MPQ__NKINDS; k++) {
        snprintf(name, sizeof name, "%s.%s", base, mpq__kinds[k].suffix);
        if ((have[k] = mpq_st_find(f, name) != NULL)) s.what |= mpq__kinds[k].flag;
    }
    if (st == MPQ_OK && !s.what)
        st = mpq__fail(err, MPQ_ERR_FORMAT, path, "no statistics for '%s' (a file for another model?)", base);
    snprintf(first, sizeof first, "%s", base);
    for (int k = 0; st == MPQ_OK && k < MPQ__NKINDS; k++) {
        if (!have[k]) continue;
        float ***dst = k == 0 ? &s.fisher
            : k == 1          ? &s.mixllm
            : k == 2          ? &s.xtx_diag
            : k == 3          ? &s.mean_abs
            : k == 4          ? &s.awq
            : k == 5          ? &s.xtx
            : k == 6          ? &s.pqi
                              : NULL;
        if (dst && !(*dst = (float **)calloc((size_t)s.nlin, sizeof(float *)))) st = MPQ_ERR_NOMEM;
        if (!dst && !(s.layer_sens = (float *)malloc(sizeof(float) * (size_t)s.nlin))) st = MPQ_ERR_NOMEM;
        for (int i = 0; st == MPQ_OK && i < s.nlin; i++) {
            const mpq_linear *L = mpq__lin(m, i);
            mpq_llm_linear_name(m->c.gguf_names, i / MPQ_LIN_COUNT, i % MPQ_LIN_COUNT, 0, base, sizeof base);
            snprintf(name, sizeof name, "%s.%s", base, mpq__kinds[k].suffix);
            const mpq_st_tensor *t = mpq_st_find(f, name);
            int ndim;
            uint64_t dims[2];
            mpq__kind_shape(&s, L, mpq__kinds[k].shape, &ndim, dims);
            const uint64_t numel = ndim == 0 ? 1 : ndim == 1 ? dims[0] : dims[0] * dims[1];
            if (mpq__kinds[k].shape == 4) { /* X^T X: a square, or the triangle under its input's owner */
                char owner[448];
                const int lin = i % MPQ_LIN_COUNT, own = mpq__xtx_owner(lin);
                mpq_llm_linear_name(m->c.gguf_names, i / MPQ_LIN_COUNT, own, 0, owner, sizeof owner);
                if (!((*dst)[i] = (float *)malloc(sizeof(float) * (size_t)numel))) {
                    st = MPQ_ERR_NOMEM;
                    break;
                }
                st = mpq_calib_read_xtx(f, path, base, own != lin ? owner : NULL, L->cols, (*dst)[i], err);
                continue;
            }
            if (!t) {
                st = mpq__fail(err, MPQ_ERR_FORMAT, path, "tensor '%s': not found (the file has %s for '%s')", name,
                               mpq__kinds[k].suffix, first);
                break;
            }
            if (t->ndim != ndim || t->numel != numel || (ndim >= 1 && t->shape[0] != dims[0]) ||
                (ndim == 2 && t->shape[1] != dims[1])) {
                st = mpq__fail(err, MPQ_ERR_SIZE, path, "tensor '%s': shape does not match the model", name);
                break;
            }
            float *v = dst ? (float *)malloc(sizeof(float) * (size_t)numel) : &s.layer_sens[i];
            if (!v) {
                st = MPQ_ERR_NOMEM;
                break;
            }
            if (dst) (*dst)[i] = v;
            if ((st = mpq_st_read_f32(f, t, v, (size_t)numel, err)) != MPQ_OK) break;
            for (uint64_t j = 0; j < numel; j++) {
                if (!(v[j] - v[j] == 0.0f)) {
                    st = mpq__fail(err, MPQ_ERR_NONFINITE, path, "tensor '%s': element %llu is not finite", name,
                                   (unsigned long long)j);
                    break;
                }
                if (mpq__kinds[k].nonneg && v[j] < 0) {
                    st = mpq__fail(err, MPQ_ERR_RANGE, path, "tensor '%s': element %llu is negative (%g); %s cannot be",
                                   name, (unsigned long long)j, v[j], mpq__kinds[k].suffix);
                    break;
                }
                if (!dst && v[j] > 1) {
                    st = mpq__fail(err, MPQ_ERR_RANGE, path, "tensor '%s': %g is not in [0, 1]", name, v[j]);
                    break;
                }
            }
        }
    }
    mpq_st_close(f);
    if (st != MPQ_OK) {
        mpq_calib_stats_free(&s);
        return st;
    }
    *out = s;
    return MPQ_OK;
}

/* ---- the measurements' file ---------------------------------------------- */

static const char *const mpq__quantizers[] = {"rtn", "awq", "gptq", "awq+gptq"};

static int mpq__measure_info_ok(const mpq_measure_info *in)
{
    if (in->nbits < 1 || in->nbits > 8) return 0;
    for (int k = 0; k < in->nbits; k++) {
        if (in->bits[k] < 1 || in->bits[k] > 8) return 0;
        for (int j = 0; j < k; j++)
            if (in->bits[j] == in->bits[k]) return 0;
    }
    int q = 0;
    for (int k = 0; k < 4; k++) q |= !strcmp(in->quantizer, mpq__quantizers[k]);
    return q;
}

mpq_status mpq_measure_write(const char *path, const mpq_measure_info *info, const char *const *names, int n,
                             const double *kld, mpq_io_err *err)
{
    if (!path || !info || !names || !kld || n < 1) return MPQ_ERR_ARG;
    if (!mpq__measure_info_ok(info))
        return mpq__fail(err, MPQ_ERR_ARG, path, "the widths or the quantizer are out of range");
    for (size_t k = 0; k < (size_t)n * (size_t)info->nbits; k++)
        if (!(kld[k] >= 0.0 && kld[k] <= 3.4e38))
            return mpq__fail(err, MPQ_ERR_NONFINITE, path, "a KLD is not finite and >= 0");
    mpq_st_writer *w = NULL;
    mpq_status st = mpq_st_writer_open(path, &w, err);
    for (int i = 0; i < n && st == MPQ_OK; i++) {
        char name[1024];
        float v[8];
        snprintf(name, sizeof name, "%s.kld", names[i]);
        const uint64_t shape[1] = {(uint64_t)info->nbits};
        for (int k = 0; k < info->nbits; k++) v[k] = (float)kld[(size_t)i * info->nbits + k];
        st = mpq_st_write_f32(w, name, MPQ_DT_F32, 1, shape, v, err);
    }
    cJSON *o = st == MPQ_OK ? cJSON_CreateObject() : NULL, *ws = o ? cJSON_AddArrayToObject(o, "widths") : NULL;
    char hash[17], seed[24];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)info->text_hash);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)info->rotate_seed);
    int ok = ws != NULL;
    for (int k = 0; k < info->nbits && ok; k++) ok = cJSON_AddItemToArray(ws, cJSON_CreateNumber(info->bits[k]));
    const char *ik[] = {"windows", "length", "layers", "dim", "vocab", "act_order", "group", "symmetric", "rotate"};
    const int iv[] = {info->windows,   info->length, info->layers,    info->dim,   info->vocab,
                      info->act_order, info->group,  info->symmetric, info->rotate};
    for (int k = 0; k < 9 && ok; k++) ok = cJSON_AddNumberToObject(o, ik[k], iv[k]) != NULL;
    ok = ok && cJSON_AddStringToObject(o, "text_hash", hash) &&
        cJSON_AddNumberToObject(o, "tokens", (double)info->tokens) &&
        cJSON_AddStringToObject(o, "model", info->model) && cJSON_AddStringToObject(o, "quantizer", info->quantizer) &&
        cJSON_AddStringToObject(o, "rotate_seed", seed) && cJSON_AddNumberToObject(o, "seconds", info->seconds);
    char *j = ok ? cJSON_PrintUnformatted(o) : NULL;
    if (st == MPQ_OK && !j) st = mpq__fail(err, MPQ_ERR_NOMEM, path, "out of memory");
    if (st == MPQ_OK) st = mpq_st_write_meta(w, "mpq_measure", j, err);
    cJSON_free(j);
    cJSON_Delete(o);
    if (w && st == MPQ_OK)
        st = mpq_st_writer_close(w, err);
    else if (w)
        mpq_st_writer_abort(w);
    return st;
}

/* An integer field of o in [lo, hi] into *v. */
static int mpq__json_int(const cJSON *o, const char *key, double lo, double hi, double *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi) ||
        x->valuedouble != floor(x->valuedouble))
        return 0;
    *v = x->valuedouble;
    return 1;
}

/* A string field of o, at most cap - 1 bytes, into buf. */
static int mpq__json_str(const cJSON *o, const char *key, char *buf, size_t cap)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(x) || strlen(x->valuestring) >= cap) return 0;
    memcpy(buf, x->valuestring, strlen(x->valuestring) + 1);
    return 1;
}

/* A 64-bit unsigned integer written as a string of digits (base 10 or 16). */
static int mpq__json_u64(const cJSON *o, const char *key, int base, uint64_t *v)
{
    char s[24], *end;
    if (!mpq__json_str(o, key, s, sizeof s) || !s[0] || s[0] == '-' || s[0] == '+' || s[0] == ' ') return 0;
    errno = 0;
    const unsigned long long x = strtoull(s, &end, base);
    if (errno || *end) return 0;
    *v = (uint64_t)x;
    return 1;
}

mpq_status mpq_measure_read(mpq_st_file *f, const char *path, const char *const *names, int n, mpq_measure_info *info,
                            double *kld, mpq_io_err *err)
{
    if (!f || !info || (names && (n < 1 || !kld))) return MPQ_ERR_ARG;
    if (!path) path = "(measurements)";
    const char *meta = mpq_st_meta(f, "mpq_measure");
    cJSON *o = meta ? cJSON_Parse(meta) : NULL;
    mpq_measure_info in;
    memset(&in, 0, sizeof in);
    mpq_status st = MPQ_OK;
    if (!o) st = mpq__fail(err, MPQ_ERR_FORMAT, path, "no mpq_measure metadata: not a file mpq measure wrote");
    const cJSON *ws = o ? cJSON_GetObjectItemCaseSensitive(o, "widths") : NULL;
    if (st == MPQ_OK && (!cJSON_IsArray(ws) || cJSON_GetArraySize(ws) < 1 || cJSON_GetArraySize(ws) > 8))
        st = mpq__fail(err, MPQ_ERR_FORMAT, path, "mpq_measure: 'widths' is not a list of 1 to 8 widths");
    for (int k = 0; st == MPQ_OK && k < cJSON_GetArraySize(ws); k++) {
        const cJSON *x = cJSON_GetArrayItem(ws, k);
        in.bits[k] = cJSON_IsNumber(x) && x->valuedouble >= 1 && x->valuedouble <= 8 ? (int)x->valuedouble : 0;
        in.nbits = k + 1;
    }
    const char *ik[] = {"windows",   "length", "layers",    "dim",    "vocab",
                        "act_order", "group",  "symmetric", "rotate", "tokens"};
    const double hi[] = {1 << 30, 1 << 30, 1 << 20, 1 << 24, 1 << 30, 1, 1 << 24, 1, 1, 1e15};
    int *iv[] = {&in.windows,   &in.length, &in.layers,    &in.dim,   &in.vocab,
                 &in.act_order, &in.group,  &in.symmetric, &in.rotate};
    for (int k = 0; k < 10 && st == MPQ_OK; k++) {
        double v;
        if (!mpq__json_int(o, ik[k], 0, hi[k], &v))
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "mpq_measure: '%s' is not a count", ik[k]);
        else if (k < 9)
            *iv[k] = (int)v;
        else
            in.tokens = (size_t)v;
    }
    const cJSON *sec = o ? cJSON_GetObjectItemCaseSensitive(o, "seconds") : NULL;
    in.seconds = cJSON_IsNumber(sec) ? sec->valuedouble : 0.0;
    if (st == MPQ_OK &&
        (!mpq__json_str(o, "model", in.model, sizeof in.model) ||
         !mpq__json_str(o, "quantizer", in.quantizer, sizeof in.quantizer)))
        st = mpq__fail(err, MPQ_ERR_FORMAT, path, "mpq_measure: 'model' or 'quantizer' is not a string of its size");
    if (st == MPQ_OK &&
        (!mpq__json_u64(o, "text_hash", 16, &in.text_hash) || !mpq__json_u64(o, "rotate_seed", 10, &in.rotate_seed)))
        st = mpq__fail(err, MPQ_ERR_FORMAT, path,
                       "mpq_measure: 'text_hash' or 'rotate_seed' is not a number in a string");
    if (st == MPQ_OK && !mpq__measure_info_ok(&in))
        st = mpq__fail(err, MPQ_ERR_FORMAT, path,
                       "mpq_measure: the widths (distinct, 1..8) or the quantizer are not valid");
    cJSON_Delete(o);
    double *tmp = names && st == MPQ_OK ? (double *)malloc(sizeof(double) * (size_t)n * (size_t)in.nbits) : NULL;
    if (names && st == MPQ_OK && !tmp) st = mpq__fail(err, MPQ_ERR_NOMEM, path, "out of memory");
    for (int i = 0; names && i < n && st == MPQ_OK; i++) {
        char name[1024];
        float v[8];
        snprintf(name, sizeof name, "%s.kld", names[i]);
        const mpq_st_tensor *t = mpq_st_find(f, name);
        if (!t)
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "tensor '%s': not found (measured for another model?)", name);
        else if (t->numel != (uint64_t)in.nbits)
            st = mpq__fail(err, MPQ_ERR_FORMAT, path, "tensor '%s': %llu values, not one per width (%d)", name,
                           (unsigned long long)t->numel, in.nbits);
        else
            st = mpq_st_read_f32(f, t, v, (size_t)in.nbits, err);
        for (int k = 0; k < in.nbits && st == MPQ_OK; k++)
            if (!(v[k] >= 0.0f && v[k] <= 3.4e38f))
                st = mpq__fail(err, MPQ_ERR_FORMAT, path, "tensor '%s': a KLD that is not finite and >= 0", name);
            else
                tmp[(size_t)i * in.nbits + k] = v[k];
    }
    if (names && st == MPQ_OK) memcpy(kld, tmp, sizeof(double) * (size_t)n * (size_t)in.nbits);
    free(tmp);
    if (st == MPQ_OK) *info = in;
    return st;
}
