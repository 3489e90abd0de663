/* tinylm/model.h - a small byte-level decoder-only transformer with forward
   and backward passes, written for measuring quantization end to end.

   Shape: token embedding (256 bytes) -> L blocks of
       x += Wo attn(rope(Wq rms(x)), rope(Wk rms(x)), Wv rms(x))     (causal, H heads)
       x += Wd (silu(Wg rms(x)) * Wu rms(x))                          (SwiGLU)
   -> RMSNorm -> untied output head -> softmax cross-entropy on the next byte.
   RMSNorm has a gain and eps 1e-5; rotary positions rotate pairs (2i, 2i+1)
   of every head by t * 10000^(-2i/hd). No biases.

   Every linear map is y = x W^T with W stored row-major [out][in] (mpq's
   orientation), and goes through tlm_linear, which a caller may redirect
   (tlm_model.hook) to quantized weights or to record its inputs. Matrix
   products are deterministic whatever the thread count: every output element
   is summed by one thread in a fixed order. `real` is float, or double when
   TLM_REAL is defined so (the gradient check). */
#ifndef TLM_MODEL_H
#define TLM_MODEL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef TLM_REAL
#define TLM_REAL float
#endif
typedef TLM_REAL real;

#define TLM_MAX_LAYERS 16
#define TLM_MAX_SEQ    1024
#define TLM_VOCAB      256

typedef struct tlm_config {
    int dim, layers, heads, ffn, seq;
} tlm_config;

/* The linear maps of a block, in this order everywhere (files, statistics). */
enum { TLM_WQ, TLM_WK, TLM_WV, TLM_WO, TLM_WG, TLM_WU, TLM_WD, TLM_NLIN };
static const char *const tlm_lin_name[TLM_NLIN] = {"attn.wq",    "attn.wk",  "attn.wv",   "attn.wo",
                                                   "mlp.w_gate", "mlp.w_up", "mlp.w_down"};

static inline int tlm_lin_rows(const tlm_config *c, int w) { return w == TLM_WG || w == TLM_WU ? c->ffn : c->dim; }
static inline int tlm_lin_cols(const tlm_config *c, int w) { return w == TLM_WD ? c->ffn : c->dim; }

/* All parameters (or gradients) in one array, with views into it. */
typedef struct tlm_params {
    real *data;
    size_t n;
    real *emb;    /* VOCAB x dim */
    real *norm_f; /* dim */
    real *head;   /* VOCAB x dim */
    real *norm1[TLM_MAX_LAYERS], *norm2[TLM_MAX_LAYERS];
    real *w[TLM_MAX_LAYERS][TLM_NLIN];
} tlm_params;

static inline size_t tlm_params_layout(const tlm_config *c, tlm_params *p, real *base)
{
    size_t o = 0;
#define TLM_TAKE(ptr, count) (ptr) = base ? base + o : NULL, o += (size_t)(count)
    TLM_TAKE(p->emb, TLM_VOCAB * c->dim);
    TLM_TAKE(p->norm_f, c->dim);
    TLM_TAKE(p->head, TLM_VOCAB * c->dim);
    for (int l = 0; l < c->layers; l++) {
        TLM_TAKE(p->norm1[l], c->dim);
        TLM_TAKE(p->norm2[l], c->dim);
        for (int w = 0; w < TLM_NLIN; w++) TLM_TAKE(p->w[l][w], (size_t)tlm_lin_rows(c, w) * tlm_lin_cols(c, w));
    }
#undef TLM_TAKE
    p->data = base, p->n = o;
    return o;
}

static inline int tlm_params_alloc(const tlm_config *c, tlm_params *p)
{
    size_t n = tlm_params_layout(c, p, NULL);
    real *d = (real *)calloc(n, sizeof(real));
    if (!d) return -1;
    tlm_params_layout(c, p, d);
    return 0;
}

static inline void tlm_params_free(tlm_params *p)
{
    free(p->data);
    memset(p, 0, sizeof *p);
}

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

/* Initialisation: N(0, 0.02) matrices, output projections (wo, w_down)
   scaled by 1/sqrt(2 layers), gains 1. */
static inline void tlm_params_init(const tlm_config *c, tlm_params *p, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < p->n; i++) p->data[i] = (real)(0.02 * tlm_gauss(&s));
    for (int j = 0; j < c->dim; j++) p->norm_f[j] = 1;
    for (int l = 0; l < c->layers; l++) {
        for (int j = 0; j < c->dim; j++) p->norm1[l][j] = p->norm2[l][j] = 1;
        const double k = 1.0 / sqrt(2.0 * c->layers);
        for (int w = TLM_WO; w <= TLM_WD; w += TLM_WD - TLM_WO) {
            size_t n = (size_t)tlm_lin_rows(c, w) * tlm_lin_cols(c, w);
            for (size_t i = 0; i < n; i++) p->w[l][w][i] = (real)(p->w[l][w][i] * k);
        }
    }
}

/* ---- matrix products ----------------------------------------------------- */

/* one vector register's worth of reals: AVX-512, AVX, else SSE's 16 bytes */
#if defined(__AVX512F__)
#define TLM_VBYTES 64
#elif defined(__AVX__)
#define TLM_VBYTES 32
#else
#define TLM_VBYTES 16
#endif
#define TLM_VL (int)(TLM_VBYTES / sizeof(real))
typedef real tlm_v __attribute__((vector_size(TLM_VBYTES)));

static inline tlm_v tlm_ld(const real *p)
{
    tlm_v v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline real tlm_hsum(tlm_v v)
{
    real s = 0;
    for (int i = 0; i < TLM_VL; i++) s += v[i];
    return s;
}

static inline real tlm_dot(const real *a, const real *b, int K)
{
    tlm_v s = {0};
    int k = 0;
    for (; k + TLM_VL <= K; k += TLM_VL) s += tlm_ld(a + k) * tlm_ld(b + k);
    real t = tlm_hsum(s);
    for (; k < K; k++) t += a[k] * b[k];
    return t;
}

/* C[M x N] = A[M x K] B[N x K]^T (acc: C +=). 4 x 4 register tiles. */
static inline void tlm_mm(const real *A, const real *B, real *C, int M, int N, int K, int acc)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int mb = 0; mb < (M + 3) / 4; mb++) {
        const int m0 = mb * 4, mr = M - m0 < 4 ? M - m0 : 4;
        for (int n0 = 0; n0 < N; n0 += 4) {
            const int nr = N - n0 < 4 ? N - n0 : 4;
            if (mr == 4 && nr == 4) {
                tlm_v s[4][4];
                memset(s, 0, sizeof s);
                int k = 0;
                for (; k + TLM_VL <= K; k += TLM_VL) {
                    tlm_v a[4], b[4];
                    for (int i = 0; i < 4; i++) a[i] = tlm_ld(A + (size_t)(m0 + i) * K + k);
                    for (int j = 0; j < 4; j++) b[j] = tlm_ld(B + (size_t)(n0 + j) * K + k);
                    for (int i = 0; i < 4; i++)
                        for (int j = 0; j < 4; j++) s[i][j] += a[i] * b[j];
                }
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) {
                        real t = tlm_hsum(s[i][j]);
                        for (int kk = k; kk < K; kk++) t += A[(size_t)(m0 + i) * K + kk] * B[(size_t)(n0 + j) * K + kk];
                        real *c = &C[(size_t)(m0 + i) * N + n0 + j];
                        *c = acc ? *c + t : t;
                    }
            } else {
                for (int i = 0; i < mr; i++)
                    for (int j = 0; j < nr; j++) {
                        real t = tlm_dot(A + (size_t)(m0 + i) * K, B + (size_t)(n0 + j) * K, K);
                        real *c = &C[(size_t)(m0 + i) * N + n0 + j];
                        *c = acc ? *c + t : t;
                    }
            }
        }
    }
}

/* T[cols x rows] = S[rows x cols]^T */
static inline void tlm_transpose(const real *S, real *T, int rows, int cols)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int j0 = 0; j0 < cols; j0 += 32)
        for (int i = 0; i < rows; i++)
            for (int j = j0; j < cols && j < j0 + 32; j++) T[(size_t)j * rows + i] = S[(size_t)i * cols + j];
}

/* ---- the model and its activations --------------------------------------- */

struct tlm_model;
/* Replaces y[M x rows] = x[M x cols] W^T of linear (layer, which). Rows of x
   are tokens: row r is position r % T of sequence r / T. */
typedef void (*tlm_linear_fn)(void *user, const struct tlm_model *m, int layer, int which, const real *x, real *y,
                              int M);

typedef struct tlm_acts { /* what the backward pass needs, for B sequences */
    int B;
    real *x[TLM_MAX_LAYERS + 1]; /* residual stream entering each block; x[L] leaves the last */
    real *xn1[TLM_MAX_LAYERS], *r1[TLM_MAX_LAYERS], *q[TLM_MAX_LAYERS], *k[TLM_MAX_LAYERS], *v[TLM_MAX_LAYERS];
    real *P[TLM_MAX_LAYERS], *ao[TLM_MAX_LAYERS], *x2[TLM_MAX_LAYERS], *xn2[TLM_MAX_LAYERS], *r2[TLM_MAX_LAYERS];
    real *a[TLM_MAX_LAYERS], *b[TLM_MAX_LAYERS], *h[TLM_MAX_LAYERS];
    real *xf, *rf, *logits;
    real *mem;
} tlm_acts;

typedef struct tlm_model {
    tlm_config c;
    tlm_params p;
    real *cosb, *sinb;  /* rotary tables, seq x hd/2 */
    int T;              /* tokens per sequence in this pass, 1..seq (tlm_model_init: seq);
                           shorter passes serve generation from short prompts */
    tlm_linear_fn hook; /* NULL: the dense weights in p */
    void *hook_user;
} tlm_model;

static inline int tlm_model_init(tlm_model *m, const tlm_config *c)
{
    memset(m, 0, sizeof *m);
    m->c = *c;
    m->T = c->seq;
    if (c->layers > TLM_MAX_LAYERS || c->seq > TLM_MAX_SEQ || c->dim % c->heads || (c->dim / c->heads) % 2) return -1;
    if (tlm_params_alloc(c, &m->p)) return -1;
    const int hd = c->dim / c->heads;
    m->cosb = (real *)malloc(sizeof(real) * (size_t)c->seq * (hd / 2));
    m->sinb = (real *)malloc(sizeof(real) * (size_t)c->seq * (hd / 2));
    if (!m->cosb || !m->sinb) return -1;
    for (int t = 0; t < c->seq; t++)
        for (int i = 0; i < hd / 2; i++) {
            const double th = t * pow(10000.0, -2.0 * i / hd);
            m->cosb[t * (hd / 2) + i] = (real)cos(th);
            m->sinb[t * (hd / 2) + i] = (real)sin(th);
        }
    return 0;
}

static inline void tlm_model_free(tlm_model *m)
{
    tlm_params_free(&m->p);
    free(m->cosb);
    free(m->sinb);
}

static inline int tlm_acts_alloc(const tlm_config *c, int B, tlm_acts *a)
{
    memset(a, 0, sizeof *a);
    const size_t M = (size_t)B * c->seq, D = (size_t)c->dim, F = (size_t)c->ffn;
    const size_t PP = (size_t)B * c->heads * c->seq * c->seq;
    const size_t per = 9 * M * D + 2 * M + PP + 3 * M * F;
    const size_t total = (size_t)c->layers * per + M * D /* x[L] */ + M * D + M + M * TLM_VOCAB;
    real *p = (real *)malloc(sizeof(real) * total);
    if (!p) return -1;
    a->mem = p, a->B = B;
#define TLM_CUT(dst, count) (dst) = p, p += (count)
    for (int l = 0; l < c->layers; l++) {
        TLM_CUT(a->x[l], M * D);
        TLM_CUT(a->xn1[l], M * D);
        TLM_CUT(a->r1[l], M);
        TLM_CUT(a->q[l], M * D);
        TLM_CUT(a->k[l], M * D);
        TLM_CUT(a->v[l], M * D);
        TLM_CUT(a->P[l], PP);
        TLM_CUT(a->ao[l], M * D);
        TLM_CUT(a->x2[l], M * D);
        TLM_CUT(a->xn2[l], M * D);
        TLM_CUT(a->r2[l], M);
        TLM_CUT(a->a[l], M * F);
        TLM_CUT(a->b[l], M * F);
        TLM_CUT(a->h[l], M * F);
    }
    TLM_CUT(a->x[c->layers], M * D);
    TLM_CUT(a->xf, M * D);
    TLM_CUT(a->rf, M);
    TLM_CUT(a->logits, M * TLM_VOCAB);
#undef TLM_CUT
    return 0;
}

static inline void tlm_acts_free(tlm_acts *a)
{
    free(a->mem);
    memset(a, 0, sizeof *a);
}

static inline void tlm_linear(const tlm_model *m, int l, int w, const real *x, real *y, int M)
{
    if (m->hook)
        m->hook(m->hook_user, m, l, w, x, y, M);
    else
        tlm_mm(x, m->p.w[l][w], y, M, tlm_lin_rows(&m->c, w), tlm_lin_cols(&m->c, w), 0);
}

static inline void tlm_rmsnorm(const real *x, const real *g, real *y, real *r, int M, int D)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int i = 0; i < M; i++) {
        const real *xi = x + (size_t)i * D;
        double ss = 0;
        for (int j = 0; j < D; j++) ss += (double)xi[j] * xi[j];
        const real ri = (real)(1.0 / sqrt(ss / D + 1e-5));
        r[i] = ri;
        for (int j = 0; j < D; j++) y[(size_t)i * D + j] = xi[j] * ri * g[j];
    }
}

/* rotate every head's pairs by +angle (dir 1) or -angle (dir -1) */
static inline void tlm_rope(const tlm_model *m, real *x, int M, int dir)
{
    const int D = m->c.dim, hd = D / m->c.heads, T = m->T;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int i = 0; i < M; i++) {
        const int t = i % T;
        for (int h = 0; h < m->c.heads; h++) {
            real *v = x + (size_t)i * D + h * hd;
            for (int p = 0; p < hd / 2; p++) {
                const real c = m->cosb[t * (hd / 2) + p], s = dir * m->sinb[t * (hd / 2) + p];
                const real a = v[2 * p], b = v[2 * p + 1];
                v[2 * p] = a * c - b * s;
                v[2 * p + 1] = a * s + b * c;
            }
        }
    }
}

static inline void tlm_attention(const tlm_model *m, const real *q, const real *k, const real *v, real *P, real *o,
                                 int B)
{
    const int D = m->c.dim, H = m->c.heads, hd = D / H, T = m->T;
    const real scale = (real)(1.0 / sqrt((double)hd));
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        real *Pb = P + (size_t)bh * T * T;
        for (int i = 0; i < T; i++) {
            const real *qi = q + ((size_t)b * T + i) * D + h * hd;
            real *row = Pb + (size_t)i * T, mx = -INFINITY;
            for (int j = 0; j <= i; j++) {
                row[j] = tlm_dot(qi, k + ((size_t)b * T + j) * D + h * hd, hd) * scale;
                mx = row[j] > mx ? row[j] : mx;
            }
            double sum = 0;
            for (int j = 0; j <= i; j++) sum += (row[j] = (real)exp((double)(row[j] - mx)));
            for (int j = 0; j <= i; j++) row[j] = (real)(row[j] / sum);
            for (int j = i + 1; j < T; j++) row[j] = 0;
            real *oi = o + ((size_t)b * T + i) * D + h * hd;
            for (int d = 0; d < hd; d++) oi[d] = 0;
            for (int j = 0; j <= i; j++) {
                const real pj = row[j], *vj = v + ((size_t)b * T + j) * D + h * hd;
                for (int d = 0; d < hd; d++) oi[d] += pj * vj[d];
            }
        }
    }
}

static inline real tlm_sigmoid(real a) { return (real)(1.0 / (1.0 + exp(-(double)a))); }

/* Forward over B sequences of seq tokens; logits in a->logits. Returns the
   mean cross-entropy (nats) of predicting targets (B x seq bytes; a target
   < 0 is not counted), or 0 when targets is NULL. */
static inline double tlm_forward(const tlm_model *m, const uint8_t *tokens, const int *targets, tlm_acts *a, int B)
{
    const tlm_config *c = &m->c;
    const int M = B * m->T, D = c->dim, F = c->ffn;
    for (int i = 0; i < M; i++) memcpy(a->x[0] + (size_t)i * D, m->p.emb + (size_t)tokens[i] * D, sizeof(real) * D);
    for (int l = 0; l < c->layers; l++) {
        tlm_rmsnorm(a->x[l], m->p.norm1[l], a->xn1[l], a->r1[l], M, D);
        tlm_linear(m, l, TLM_WQ, a->xn1[l], a->q[l], M);
        tlm_linear(m, l, TLM_WK, a->xn1[l], a->k[l], M);
        tlm_linear(m, l, TLM_WV, a->xn1[l], a->v[l], M);
        tlm_rope(m, a->q[l], M, 1);
        tlm_rope(m, a->k[l], M, 1);
        tlm_attention(m, a->q[l], a->k[l], a->v[l], a->P[l], a->ao[l], B);
        tlm_linear(m, l, TLM_WO, a->ao[l], a->x2[l], M);
        for (size_t i = 0; i < (size_t)M * D; i++) a->x2[l][i] += a->x[l][i];
        tlm_rmsnorm(a->x2[l], m->p.norm2[l], a->xn2[l], a->r2[l], M, D);
        tlm_linear(m, l, TLM_WG, a->xn2[l], a->a[l], M);
        tlm_linear(m, l, TLM_WU, a->xn2[l], a->b[l], M);
        for (size_t i = 0; i < (size_t)M * F; i++) a->h[l][i] = a->a[l][i] * tlm_sigmoid(a->a[l][i]) * a->b[l][i];
        tlm_linear(m, l, TLM_WD, a->h[l], a->x[l + 1], M);
        for (size_t i = 0; i < (size_t)M * D; i++) a->x[l + 1][i] += a->x2[l][i];
    }
    tlm_rmsnorm(a->x[c->layers], m->p.norm_f, a->xf, a->rf, M, D);
    tlm_mm(a->xf, m->p.head, a->logits, M, TLM_VOCAB, D, 0);
    if (!targets) return 0;
    double loss = 0;
    long count = 0;
    for (int i = 0; i < M; i++) {
        if (targets[i] < 0) continue;
        const real *z = a->logits + (size_t)i * TLM_VOCAB;
        double mx = z[0], s = 0;
        for (int v = 1; v < TLM_VOCAB; v++) mx = z[v] > mx ? z[v] : mx;
        for (int v = 0; v < TLM_VOCAB; v++) s += exp((double)z[v] - mx);
        loss += log(s) + mx - z[targets[i]];
        count++;
    }
    return count ? loss / count : 0;
}

/* ---- backward --------------------------------------------------------------- */

typedef struct tlm_grad_work {
    real *dx, *dxn, *dq, *dk, *dv, *dao, *dh, *da, *db, *t1, *t2, *dlog;
    real *mem;
} tlm_grad_work;

static inline int tlm_grad_work_alloc(const tlm_config *c, int B, tlm_grad_work *g)
{
    const size_t M = (size_t)B * c->seq, D = (size_t)c->dim, F = (size_t)c->ffn;
    const size_t big = (F > D ? F : D) * M > (size_t)TLM_VOCAB * M ? (F > D ? F : D) * M : (size_t)TLM_VOCAB * M;
    real *p = (real *)malloc(sizeof(real) * (6 * M * D + 3 * M * F + 2 * big + M * TLM_VOCAB));
    if (!p) return -1;
    g->mem = p;
    g->dx = p, p += M * D;
    g->dxn = p, p += M * D;
    g->dq = p, p += M * D;
    g->dk = p, p += M * D;
    g->dv = p, p += M * D;
    g->dao = p, p += M * D;
    g->dh = p, p += M * F;
    g->da = p, p += M * F;
    g->db = p, p += M * F;
    g->t1 = p, p += big;
    g->t2 = p, p += big;
    g->dlog = p;
    return 0;
}

static inline void tlm_grad_work_free(tlm_grad_work *g)
{
    free(g->mem);
    memset(g, 0, sizeof *g);
}

/* dW += dY^T X  (dY: M x N, X: M x K, dW: N x K), via transposes */
static inline void tlm_dweight(const real *dY, const real *X, real *dW, int M, int N, int K, real *t1, real *t2)
{
    tlm_transpose(dY, t1, M, N);
    tlm_transpose(X, t2, M, K);
    tlm_mm(t1, t2, dW, N, K, M, 1);
}

/* dX (=, or += when acc) dY W  (dY: M x N, W: N x K) */
static inline void tlm_dinput(const real *dY, const real *W, real *dX, int M, int N, int K, int acc, real *t1)
{
    tlm_transpose(W, t1, N, K);
    tlm_mm(dY, t1, dX, M, K, N, acc);
}

static inline void tlm_rmsnorm_back(const real *x, const real *g, const real *r, const real *dy, real *dx, real *dg,
                                    int M, int D)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int i = 0; i < M; i++) {
        const real *xi = x + (size_t)i * D, *dyi = dy + (size_t)i * D;
        double s = 0;
        for (int j = 0; j < D; j++) s += (double)dyi[j] * g[j] * xi[j];
        const double ri = r[i], k = ri * ri * ri * s / D;
        for (int j = 0; j < D; j++) dx[(size_t)i * D + j] += (real)(ri * dyi[j] * g[j] - k * xi[j]);
    }
    for (int j = 0; j < D; j++) { /* gains: one thread per column, fixed order */
        double s = 0;
        for (int i = 0; i < M; i++) s += (double)dy[(size_t)i * D + j] * x[(size_t)i * D + j] * r[i];
        dg[j] += (real)s;
    }
}

static inline void tlm_attention_back(const tlm_model *m, const tlm_acts *a, int l, const real *dao, real *dq, real *dk,
                                      real *dv, int B)
{
    const int D = m->c.dim, H = m->c.heads, hd = D / H, T = m->T;
    const real scale = (real)(1.0 / sqrt((double)hd));
    const real *q = a->q[l], *k = a->k[l], *v = a->v[l];
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        const real *Pb = a->P[l] + (size_t)bh * T * T;
        real dP[TLM_MAX_SEQ];
        for (int i = 0; i < T; i++)
            for (int d = 0; d < hd; d++) {
                dq[((size_t)b * T + i) * D + h * hd + d] = 0;
                dk[((size_t)b * T + i) * D + h * hd + d] = 0;
                dv[((size_t)b * T + i) * D + h * hd + d] = 0;
            }
        for (int i = 0; i < T; i++) {
            const real *doi = dao + ((size_t)b * T + i) * D + h * hd, *row = Pb + (size_t)i * T;
            double dot = 0;
            for (int j = 0; j <= i; j++) {
                dP[j] = tlm_dot(doi, v + ((size_t)b * T + j) * D + h * hd, hd);
                dot += (double)row[j] * dP[j];
                real *dvj = dv + ((size_t)b * T + j) * D + h * hd;
                for (int d = 0; d < hd; d++) dvj[d] += row[j] * doi[d];
            }
            real *dqi = dq + ((size_t)b * T + i) * D + h * hd;
            const real *qi = q + ((size_t)b * T + i) * D + h * hd;
            for (int j = 0; j <= i; j++) {
                const real ds = (real)(row[j] * (dP[j] - dot)) * scale;
                const real *kj = k + ((size_t)b * T + j) * D + h * hd;
                real *dkj = dk + ((size_t)b * T + j) * D + h * hd;
                for (int d = 0; d < hd; d++) {
                    dqi[d] += ds * kj[d];
                    dkj[d] += ds * qi[d];
                }
            }
        }
    }
}

/* Gradients of the mean cross-entropy over counted targets, added to g
   (zero it first for a fresh gradient). Needs the activations of the
   forward pass that preceded it, with the dense weights (no hook). */
static inline void tlm_backward(const tlm_model *m, const uint8_t *tokens, const int *targets, const tlm_acts *a,
                                tlm_params *g, tlm_grad_work *w, int B)
{
    const tlm_config *c = &m->c;
    const int M = B * m->T, D = c->dim, F = c->ffn;
    long count = 0;
    for (int i = 0; i < M; i++) count += targets[i] >= 0;
    const double inv = count ? 1.0 / count : 0.0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int i = 0; i < M; i++) {
        const real *z = a->logits + (size_t)i * TLM_VOCAB;
        real *dz = w->dlog + (size_t)i * TLM_VOCAB;
        if (targets[i] < 0) {
            for (int v = 0; v < TLM_VOCAB; v++) dz[v] = 0;
            continue;
        }
        double mx = z[0], s = 0;
        for (int v = 1; v < TLM_VOCAB; v++) mx = z[v] > mx ? z[v] : mx;
        for (int v = 0; v < TLM_VOCAB; v++) s += exp((double)z[v] - mx);
        for (int v = 0; v < TLM_VOCAB; v++) dz[v] = (real)(exp((double)z[v] - mx) / s * inv);
        dz[targets[i]] -= (real)inv;
    }
    tlm_dweight(w->dlog, a->xf, g->head, M, TLM_VOCAB, D, w->t1, w->t2);
    tlm_dinput(w->dlog, m->p.head, w->dxn, M, TLM_VOCAB, D, 0, w->t1);
    memset(w->dx, 0, sizeof(real) * (size_t)M * D);
    tlm_rmsnorm_back(a->x[c->layers], m->p.norm_f, a->rf, w->dxn, w->dx, g->norm_f, M, D);
    for (int l = c->layers - 1; l >= 0; l--) {
        /* MLP: x[l+1] = x2 + Wd h */
        tlm_dweight(w->dx, a->h[l], g->w[l][TLM_WD], M, D, F, w->t1, w->t2);
        tlm_dinput(w->dx, m->p.w[l][TLM_WD], w->dh, M, D, F, 0, w->t1);
        for (size_t i = 0; i < (size_t)M * F; i++) {
            const real av = a->a[l][i], sg = tlm_sigmoid(av), si = av * sg;
            w->db[i] = w->dh[i] * si;
            w->da[i] = w->dh[i] * a->b[l][i] * sg * (1 + av * (1 - sg));
        }
        tlm_dweight(w->da, a->xn2[l], g->w[l][TLM_WG], M, F, D, w->t1, w->t2);
        tlm_dweight(w->db, a->xn2[l], g->w[l][TLM_WU], M, F, D, w->t1, w->t2);
        tlm_dinput(w->da, m->p.w[l][TLM_WG], w->dxn, M, F, D, 0, w->t1);
        tlm_dinput(w->db, m->p.w[l][TLM_WU], w->dxn, M, F, D, 1, w->t1);
        /* dx stays as the gradient of x2 (residual) plus the norm's */
        tlm_rmsnorm_back(a->x2[l], m->p.norm2[l], a->r2[l], w->dxn, w->dx, g->norm2[l], M, D);
        /* attention: x2 = x + Wo ao */
        tlm_dweight(w->dx, a->ao[l], g->w[l][TLM_WO], M, D, D, w->t1, w->t2);
        tlm_dinput(w->dx, m->p.w[l][TLM_WO], w->dao, M, D, D, 0, w->t1);
        tlm_attention_back(m, a, l, w->dao, w->dq, w->dk, w->dv, B);
        tlm_rope(m, w->dq, M, -1);
        tlm_rope(m, w->dk, M, -1);
        tlm_dweight(w->dq, a->xn1[l], g->w[l][TLM_WQ], M, D, D, w->t1, w->t2);
        tlm_dweight(w->dk, a->xn1[l], g->w[l][TLM_WK], M, D, D, w->t1, w->t2);
        tlm_dweight(w->dv, a->xn1[l], g->w[l][TLM_WV], M, D, D, w->t1, w->t2);
        tlm_dinput(w->dq, m->p.w[l][TLM_WQ], w->dxn, M, D, D, 0, w->t1);
        tlm_dinput(w->dk, m->p.w[l][TLM_WK], w->dxn, M, D, D, 1, w->t1);
        tlm_dinput(w->dv, m->p.w[l][TLM_WV], w->dxn, M, D, D, 1, w->t1);
        tlm_rmsnorm_back(a->x[l], m->p.norm1[l], a->r1[l], w->dxn, w->dx, g->norm1[l], M, D);
    }
    for (int i = 0; i < M; i++) { /* embedding rows, in token order (deterministic) */
        real *ge = g->emb + (size_t)tokens[i] * D;
        for (int j = 0; j < D; j++) ge[j] += w->dx[(size_t)i * D + j];
    }
}

#endif
