/* mpq_model.h section 5 (mpq_calib.c): the backward pass and every
   calibration statistic on tiny random models (test/llm_fixture.h), against
   central finite differences of the float64 reference forward pass
   (gradients, Fisher, MixLLM salience, PQI) and against that pass's own
   activations (diag(X^T X), mean |x|, AWQ samples, X^T X, MXSens layer
   sensitivity); every parameter's gradient (training); a model built in
   memory; both rotary conventions, GQA, tied and untied heads, biases; the same statistics for 1 and 2 threads; the
   statistics file written and read back; bad inputs. */
#define _XOPEN_SOURCE 700
#include "common.h"
#include "llm_fixture.h"
#include "mpq_model.h"
#include "tmpdir.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static char tmpdir[256];
static void make_tmpdir(void) { cr_assert(tc_tmpdir_make(tmpdir, sizeof tmpdir, "calib")); }
static void remove_tmpdir(void)
{
    char p[600];
    snprintf(p, sizeof p, "%s/hf", tmpdir);
    tc_tmpdir_remove(p);
    snprintf(p, sizeof p, "%s/resume", tmpdir);
    tc_tmpdir_remove(p);
    tc_tmpdir_remove(tmpdir);
}

TestSuite(calib, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 600);

static void shape(tl_model *m, int qwen, int tied, int bias)
{
    memset(m, 0, sizeof *m);
    m->vocab_rows = 300, m->dim = 40, m->layers = 2, m->heads = 6, m->kv_heads = 2, m->head_dim = 8, m->ffn = 72;
    m->qwen = qwen, m->tied = tied, m->bias = bias;
    m->theta = 10000.0, m->eps = 1e-5;
}

static mpq_llm *load_hf(const tl_model *t)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    mkdir(dir, 0700);
    tl_write_hf(t, dir, MPQ_DT_F32);
    mpq_llm *m = NULL;
    mpq_io_err e;
    cr_assert_eq(mpq_llm_load(dir, &m, &e), MPQ_OK, "%s", e.msg);
    return m;
}

static mpq_llm *load_gguf(const tl_model *t)
{
    char p[600];
    snprintf(p, sizeof p, "%s/m.gguf", tmpdir);
    tl_write_gguf(t, p);
    mpq_llm *m = NULL;
    mpq_io_err e;
    cr_assert_eq(mpq_llm_load(p, &m, &e), MPQ_OK, "%s", e.msg);
    unlink(p);
    return m;
}

/* The reference loss: mean over positions 0..n-2 of -log p(tok[t+1]), in
   float64, with the weights W (tl_reference's form). */
static double ref_loss(const tl_model *t, float *const (*W)[7], const int32_t *tok, int n)
{
    const int V = t->vocab_rows;
    double *z = (double *)malloc(sizeof(double) * (size_t)n * V), loss = 0;
    tl_reference(t, W, tok, n, z);
    for (int i = 0; i + 1 < n; i++) {
        const double *zi = z + (size_t)i * V;
        double mx = zi[0], s = 0;
        for (int v = 1; v < V; v++) mx = zi[v] > mx ? zi[v] : mx;
        for (int v = 0; v < V; v++) s += exp(zi[v] - mx);
        loss += log(s) + mx - zi[tok[i + 1]];
    }
    free(z);
    return loss / (n - 1);
}

/* The model's weights as tl_reference takes them, copied (to perturb). */
typedef struct wset {
    float *w[TL_MAXL][7];
} wset;

static void wset_copy(const tl_model *t, wset *s)
{
    for (int l = 0; l < t->layers; l++)
        for (int k = 0; k < 7; k++) {
            const size_t n = (size_t)tl_rows(t, k) * tl_cols(t, k);
            s->w[l][k] = (float *)malloc(sizeof(float) * n);
            memcpy(s->w[l][k], t->w[l][k], sizeof(float) * n);
        }
}

static void wset_free(const tl_model *t, wset *s)
{
    for (int l = 0; l < t->layers; l++)
        for (int k = 0; k < 7; k++) free(s->w[l][k]);
}

/* Central difference of the reference loss in weight j of map (l, k); the
   step is relative to the weight's scale. Weights are float, so the step
   is a float difference taken exactly. */
static double fd(const tl_model *t, wset *s, int l, int k, size_t j, const int32_t *tok, int n)
{
    float *w = &s->w[l][k][j];
    const float w0 = *w, h = 2e-3f * (fabsf(w0) + 0.05f);
    *w = w0 + h;
    const float hp = *w - w0;
    const double lp = ref_loss(t, s->w, tok, n);
    *w = w0 - h;
    const float hm = w0 - *w;
    const double lm = ref_loss(t, s->w, tok, n);
    *w = w0;
    return (lp - lm) / ((double)hp + hm);
}

/* Gradients of mpq_llm_backward, kept per map (HF row order of the
   model's file: GGUF q and k rows permuted). */
typedef struct grads {
    float *G[TL_MAXL][7];
    int calls;
} grads;

static void keep_grad(void *user, int layer, int lin, const float *G, int rows, int cols)
{
    grads *g = (grads *)user;
    const size_t n = (size_t)rows * cols;
    g->G[layer][lin] = (float *)malloc(sizeof(float) * n);
    memcpy(g->G[layer][lin], G, sizeof(float) * n);
    g->calls++;
}

static void grads_free(grads *g)
{
    for (int l = 0; l < TL_MAXL; l++)
        for (int k = 0; k < 7; k++) free(g->G[l][k]);
}

static void random_tokens(synth_rng *r, const tl_model *t, int32_t *tok, int n)
{
    for (int i = 0; i < n; i++) tok[i] = synth_int(r, t->v->n);
}

/* Gradient of every map at a few weights (the outlier column included by
   chance) against the finite difference; rows of q and k in the GGUF form
   map to HF rows through tl_gguf_row. */
static void check_grads(const tl_model *t, const mpq_llm *m, int gguf, uint64_t seed)
{
    enum { N = 12 };
    synth_rng r = {seed};
    int32_t tok[N];
    random_tokens(&r, t, tok, N);
    mpq_llm_train *tr = NULL;
    cr_assert_eq(mpq_llm_train_init(m, N, &tr), MPQ_OK);
    grads g;
    memset(&g, 0, sizeof g);
    double loss = 0;
    cr_assert_eq(mpq_llm_backward(m, tr, tok, N, NULL, NULL, keep_grad, &g, &loss), MPQ_OK);
    cr_assert_eq(g.calls, 7 * t->layers);
    const double lref = ref_loss(t, NULL, tok, N);
    cr_assert(fabs(loss - lref) < 1e-4 * fabs(lref), "loss %.8f reference %.8f", loss, lref);
    wset s;
    wset_copy(t, &s);
    for (int l = 0; l < t->layers; l++)
        for (int k = 0; k < 7; k++) {
            const int rows = tl_rows(t, k), cols = tl_cols(t, k);
            double gmax = 0;
            for (size_t j = 0; j < (size_t)rows * cols; j++) gmax = fmax(gmax, fabs(g.G[l][k][j]));
            cr_assert(gmax > 0, "layer %d map %d: zero gradient", l, k);
            for (int trial = 0; trial < 6; trial++) {
                const int i = synth_int(&r, rows), c = synth_int(&r, cols);
                int hi = i; /* the GGUF row holding HF row i */
                if (gguf && k < 2)
                    for (int g2 = 0; g2 < rows; g2++)
                        if (tl_gguf_row(g2, t->head_dim) == i) hi = g2;
                const double want = fd(t, &s, l, k, (size_t)i * cols + c, tok, N);
                const double got = g.G[l][k][(size_t)hi * cols + c];
                cr_assert(fabs(got - want) <= 2e-3 * gmax + 1e-3 * fabs(want),
                          "layer %d map %d (%d, %d): gradient %.6g, finite difference %.6g (largest %.3g)", l, k, i, c,
                          got, want, gmax);
            }
        }
    wset_free(t, &s);
    grads_free(&g);
    mpq_llm_train_free(tr);
}

Test(calib, gradients_match_finite_differences)
{
    static const int forms[][3] = {{0, 1, 0}, {0, 0, 0}, {1, 0, 1}}; /* llama tied, llama untied, qwen2 biases */
    for (int f = 0; f < 3; f++) {
        tl_model t;
        shape(&t, forms[f][0], forms[f][1], forms[f][2]);
        tl_make(&t, 100 + (uint64_t)f);
        mpq_llm *m = load_hf(&t);
        check_grads(&t, m, 0, 7 + (uint64_t)f);
        mpq_llm_free(m);
        if (!t.qwen) { /* GGUF llama: adjacent rotary pairs, rows of q and k permuted */
            m = load_gguf(&t);
            cr_assert_eq(m->c.rope_style, MPQ_ROPE_ADJACENT);
            check_grads(&t, m, 1, 7 + (uint64_t)f);
            mpq_llm_free(m);
        }
        tl_free(&t);
    }
}

/* The fixture's array holding parameter p (HF row order). */
static float *fixture_array(const tl_model *t, const mpq_llm_param *p)
{
    switch (p->role) {
    case MPQ_PARAM_EMBED: return t->embed;
    case MPQ_PARAM_HEAD: return t->head;
    case MPQ_PARAM_OUT_NORM: return t->out_norm;
    case MPQ_PARAM_ATTN_NORM: return t->attn_norm[p->layer];
    case MPQ_PARAM_FFN_NORM: return t->ffn_norm[p->layer];
    case MPQ_PARAM_LINEAR: return t->w[p->layer][p->lin];
    case MPQ_PARAM_BIAS: return p->lin < 3 ? t->b[p->layer][p->lin] : NULL;
    }
    return NULL;
}

/* Central difference of the reference loss in one value of the fixture
   (any parameter: the reference reads the fixture's arrays). */
static double fd_value(const tl_model *t, float *v, const int32_t *tok, int n)
{
    const float v0 = *v, h = 2e-3f * (fabsf(v0) + 0.05f);
    *v = v0 + h;
    const float hp = *v - v0;
    const double lp = ref_loss(t, NULL, tok, n);
    *v = v0 - h;
    const float hm = v0 - *v;
    const double lm = ref_loss(t, NULL, tok, n);
    *v = v0;
    return (lp - lm) / ((double)hp + hm);
}

/* mpq_llm_backward_params: the list of parameters, then every parameter's
   gradient against the finite difference at a few values (embedding rows
   of the window's tokens; a row no token uses has none), the linear maps'
   equal to mpq_llm_backward's, and a second call adding as much again. */
static void check_param_grads(tl_model *t, const mpq_llm *m, uint64_t seed)
{
    enum { N = 12 };
    synth_rng r = {seed};
    int32_t tok[N];
    random_tokens(&r, t, tok, N);
    int nb = 0;
    for (int l = 0; l < t->layers; l++)
        for (int k = 0; k < 3; k++) nb += t->b[l][k] != NULL;
    const int np = mpq_llm_params(m, NULL, 0);
    cr_assert_eq(np, 2 + !t->tied + t->layers * 9 + nb);
    mpq_llm_param *p = (mpq_llm_param *)calloc((size_t)np, sizeof *p);
    cr_assert_eq(mpq_llm_params(m, p, np), np);
    float **g = (float **)calloc((size_t)np, sizeof *g);
    for (int i = 0; i < np; i++) {
        const float *want = fixture_array(t, &p[i]);
        cr_assert_not_null(want, "%s", p[i].name);
        cr_assert_eq(p[i].n, (size_t)p[i].rows * (p[i].cols ? (size_t)p[i].cols : 1));
        cr_assert(!memcmp(p[i].data, want, sizeof(float) * p[i].n), "%s: values differ from the file's", p[i].name);
        char name[96];
        if (p[i].role == MPQ_PARAM_LINEAR || p[i].role == MPQ_PARAM_BIAS)
            mpq_llm_linear_name(0, p[i].layer, p[i].lin, p[i].role == MPQ_PARAM_BIAS, name, sizeof name);
        else {
            static const char *const roles[] = {"embed", "head", "out_norm", "attn_norm", "ffn_norm"};
            mpq_llm_tensor_name(0, roles[p[i].role], p[i].layer, name, sizeof name);
        }
        cr_assert_str_eq(p[i].name, name);
        g[i] = (float *)calloc(p[i].n, sizeof(float));
    }
    mpq_llm_train *tr = NULL;
    cr_assert_eq(mpq_llm_train_init(m, N, &tr), MPQ_OK);
    double loss = 0, loss2 = 0;
    cr_assert_eq(mpq_llm_backward_params(m, tr, tok, N, g, &loss), MPQ_OK);
    grads lg;
    memset(&lg, 0, sizeof lg);
    cr_assert_eq(mpq_llm_backward(m, tr, tok, N, NULL, NULL, keep_grad, &lg, &loss2), MPQ_OK);
    cr_assert_eq(loss, loss2);
    for (int i = 0; i < np; i++) {
        double gmax = 0;
        for (size_t j = 0; j < p[i].n; j++) gmax = fmax(gmax, fabs(g[i][j]));
        cr_assert(gmax > 0, "%s: zero gradient", p[i].name);
        if (p[i].role == MPQ_PARAM_LINEAR) {
            cr_assert(!memcmp(g[i], lg.G[p[i].layer][p[i].lin], sizeof(float) * p[i].n), "%s", p[i].name);
            continue;
        }
        float *arr = fixture_array(t, &p[i]);
        const int cols = p[i].cols ? p[i].cols : 1;
        for (int trial = 0; trial < 6; trial++) {
            const int row = p[i].role == MPQ_PARAM_EMBED ? tok[synth_int(&r, N)] : synth_int(&r, p[i].rows);
            const size_t j = (size_t)row * cols + (size_t)synth_int(&r, cols);
            const double want = fd_value(t, &arr[j], tok, N);
            cr_assert(fabs(g[i][j] - want) <= 2e-3 * gmax + 1e-3 * fabs(want),
                      "%s, value %zu: gradient %.6g, finite difference %.6g (largest %.3g)", p[i].name, j, g[i][j],
                      want, gmax);
        }
        if (p[i].role == MPQ_PARAM_EMBED && !t->tied) { /* (tied: every row is the head's too) */
            int unused = -1;
            for (int v = 0; v < t->vocab_rows && unused < 0; v++) {
                int used = 0;
                for (int q = 0; q < N; q++) used |= tok[q] == v;
                if (!used) unused = v;
            }
            cr_assert_geq(unused, 0);
            for (int j = 0; j < t->dim; j++) cr_assert_eq(g[i][(size_t)unused * t->dim + j], 0.0f);
        }
    }
    /* a second window adds to the sums */
    float **g2 = (float **)calloc((size_t)np, sizeof *g2);
    for (int i = 0; i < np; i++) {
        g2[i] = (float *)malloc(sizeof(float) * p[i].n);
        memcpy(g2[i], g[i], sizeof(float) * p[i].n);
    }
    cr_assert_eq(mpq_llm_backward_params(m, tr, tok, N, g2, NULL), MPQ_OK);
    for (int i = 0; i < np; i++) /* exactly twice where a value has one term per window */
        for (size_t j = 0; j < p[i].n; j++)
            cr_assert(fabsf(g2[i][j] - 2 * g[i][j]) <= 1e-6f * fabsf(g[i][j]), "%s, value %zu: %.9g after %.9g",
                      p[i].name, j, g2[i][j], g[i][j]);
    /* every gradient array is needed */
    free(g2[0]);
    g2[0] = NULL;
    cr_assert_eq(mpq_llm_backward_params(m, tr, tok, N, g2, NULL), MPQ_ERR_ARG);
    for (int i = 0; i < np; i++) free(g[i]), free(g2[i]);
    free(g), free(g2), free(p);
    grads_free(&lg);
    mpq_llm_train_free(tr);
}

Test(calib, every_parameter_gradient_matches_finite_differences)
{
    static const int forms[][3] = {{0, 1, 0}, {0, 0, 0}, {1, 0, 1}}; /* llama tied, llama untied, qwen2 biases */
    for (int f = 0; f < 3; f++) {
        tl_model t;
        shape(&t, forms[f][0], forms[f][1], forms[f][2]);
        tl_make(&t, 300 + (uint64_t)f);
        mpq_llm *m = load_hf(&t);
        check_param_grads(&t, m, 31 + (uint64_t)f);
        mpq_llm_free(m);
        tl_free(&t);
    }
}

/* mpq_llm_create: zero weights and unit gains; filled through
   mpq_llm_params with a file's values, the same logits as the file loaded;
   bad descriptions refused with the tokenizer still the caller's. */
Test(calib, a_model_built_in_memory_runs_as_the_same_model_loaded)
{
    tl_model t;
    shape(&t, 1, 0, 1);
    tl_make(&t, 77);
    mpq_llm *f = load_hf(&t);
    char p[700];
    snprintf(p, sizeof p, "%s/hf/tokenizer.json", tmpdir);
    FILE *fp = fopen(p, "rb");
    cr_assert_not_null(fp);
    char *json = (char *)malloc(1 << 20);
    const size_t len = fread(json, 1, 1 << 20, fp);
    fclose(fp);
    mpq_tokenizer *tok = NULL;
    cr_assert_eq(mpq_tokenizer_from_json(json, len, NULL, p, &tok, NULL), MPQ_OK);
    free(json);
    mpq_llm_config c = f->c;
    c.heads = 5; /* not a multiple of the 2 kv heads */
    mpq_llm *m = NULL;
    cr_assert_eq(mpq_llm_create(&c, tok, &m), MPQ_ERR_ARG);
    c = f->c, c.vocab = mpq_tokenizer_size(tok) - 1;
    cr_assert_eq(mpq_llm_create(&c, tok, &m), MPQ_ERR_ARG);
    c = f->c, c.ffn = 0;
    cr_assert_eq(mpq_llm_create(&c, tok, &m), MPQ_ERR_SIZE);
    cr_assert_null(m);
    cr_assert_eq(mpq_llm_create(&f->c, tok, &m), MPQ_OK);
    const int np = mpq_llm_params(m, NULL, 0);
    cr_assert_eq(np, mpq_llm_params(f, NULL, 0));
    mpq_llm_param *pm = (mpq_llm_param *)calloc((size_t)np, sizeof *pm),
                  *pf = (mpq_llm_param *)calloc((size_t)np, sizeof *pf);
    mpq_llm_params(m, pm, np);
    mpq_llm_params(f, pf, np);
    for (int i = 0; i < np; i++) {
        cr_assert_str_eq(pm[i].name, pf[i].name);
        cr_assert_eq(pm[i].n, pf[i].n);
        const float want =
            pm[i].role == MPQ_PARAM_ATTN_NORM || pm[i].role == MPQ_PARAM_FFN_NORM || pm[i].role == MPQ_PARAM_OUT_NORM
            ? 1.0f
            : 0.0f;
        for (size_t j = 0; j < pm[i].n; j++) cr_assert_eq(pm[i].data[j], want, "%s", pm[i].name);
        memcpy(pm[i].data, pf[i].data, sizeof(float) * pf[i].n);
    }
    enum { N = 9 };
    int32_t tk[N];
    synth_rng r = {3};
    random_tokens(&r, &t, tk, N);
    float *za = (float *)malloc(sizeof(float) * N * t.vocab_rows),
          *zb = (float *)malloc(sizeof(float) * N * t.vocab_rows);
    mpq_llm_state sa, sb;
    cr_assert_eq(mpq_llm_state_init(m, N, N, &sa), MPQ_OK);
    cr_assert_eq(mpq_llm_state_init(f, N, N, &sb), MPQ_OK);
    cr_assert_eq(mpq_llm_forward(m, &sa, tk, N, 0, za, 0), MPQ_OK);
    cr_assert_eq(mpq_llm_forward(f, &sb, tk, N, 0, zb, 0), MPQ_OK);
    cr_assert(!memcmp(za, zb, sizeof(float) * N * t.vocab_rows));
    mpq_llm_state_free(&sa), mpq_llm_state_free(&sb);
    free(za), free(zb), free(pm), free(pf);
    mpq_llm_free(m); /* and its tokenizer */
    mpq_llm_free(f);
    tl_free(&t);
}

/* ---- statistics ------------------------------------------------------------- */

enum { LEN = 10, WINDOWS = 3, NTOK = 47 };

/* The windows calibrate takes: floor(i * (n / LEN) / WINDOWS) * LEN. */
static void window(const mpq_llm *m, const int32_t *text, int i, int32_t *w)
{
    const int avail = NTOK / LEN, at = (int)((double)i * avail / WINDOWS) * LEN;
    memcpy(w, text + at, sizeof(int32_t) * LEN);
    if (mpq_tokenizer_adds_bos(m->tok) && mpq_tokenizer_bos(m->tok) >= 0) w[0] = mpq_tokenizer_bos(m->tok);
}

typedef struct acts {
    const tl_model *t;
    double *xdiag[TL_MAXL][7], *mabs[TL_MAXL][7], *xtx[TL_MAXL][7];
    double *rows[TL_MAXL][7]; /* every input row at positions >= 1, in order */
    long count[TL_MAXL][7];
} acts;

/* Zeroed sums for every map of t, and room for every input row of WINDOWS windows. */
static void acts_alloc(acts *a, const tl_model *t)
{
    memset(a, 0, sizeof *a);
    a->t = t;
    for (int l = 0; l < t->layers; l++)
        for (int k = 0; k < 7; k++) {
            const size_t c = (size_t)tl_cols(t, k);
            a->xdiag[l][k] = (double *)calloc(c, sizeof(double));
            a->mabs[l][k] = (double *)calloc(c, sizeof(double));
            a->xtx[l][k] = (double *)calloc(c * c, sizeof(double));
            a->rows[l][k] = (double *)calloc(c * WINDOWS * LEN, sizeof(double));
        }
}

static void acts_free(acts *a, const tl_model *t)
{
    for (int l = 0; l < t->layers; l++)
        for (int k = 0; k < 7; k++) free(a->xdiag[l][k]), free(a->mabs[l][k]), free(a->xtx[l][k]), free(a->rows[l][k]);
}

static void ref_observe(void *user, int l, int k, int t, const double *x, int cols)
{
    acts *a = (acts *)user;
    for (int j = 0; j < cols; j++) /* X^T X: every position, the sink included */
        for (int i = 0; i < cols; i++) a->xtx[l][k][(size_t)j * cols + i] += x[j] * x[i];
    if (t == 0) return;
    for (int j = 0; j < cols; j++) {
        a->xdiag[l][k][j] += x[j] * x[j];
        a->mabs[l][k][j] += fabs(x[j]);
    }
    memcpy(a->rows[l][k] + (size_t)a->count[l][k]++ * cols, x, sizeof(double) * cols);
}

static void close_rel(const float *got, const double *want, size_t n, double tol, const char *what, int l, int k)
{
    double mx = 0;
    for (size_t j = 0; j < n; j++) mx = fmax(mx, fabs(want[j]));
    for (size_t j = 0; j < n; j++)
        cr_assert(fabs(got[j] - want[j]) <= tol * mx + 1e-12, "%s, layer %d map %d, element %zu: %.8g, reference %.8g",
                  what, l, k, j, got[j], want[j]);
}

static mpq_calib_stats calibrate(const mpq_llm *m, const int32_t *text, unsigned what)
{
    mpq_calib_opts o;
    memset(&o, 0, sizeof o);
    o.what = what, o.windows = WINDOWS, o.length = LEN, o.awq_tokens = 7, o.pqi_steps = 3, o.pqi_windows = 2;
    o.sens_tokens = 8;
    mpq_calib_stats s;
    mpq_io_err e;
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &s, &e), MPQ_OK, "%s", e.msg);
    return s;
}

Test(calib, activation_statistics_match_the_reference)
{
    tl_model t;
    shape(&t, 0, 0, 0);
    tl_make(&t, 21);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {5};
    int32_t text[NTOK], w[LEN];
    random_tokens(&r, &t, text, NTOK);
    mpq_calib_stats s = calibrate(m, text, MPQ_CALIB_ACTS | MPQ_CALIB_XTX);
    cr_assert_eq(s.windows, WINDOWS);
    cr_assert_eq(s.act_tokens, WINDOWS * (LEN - 1));
    cr_assert_eq(s.awq_tokens, 7);
    cr_assert_null(s.fisher);
    acts a;
    acts_alloc(&a, &t);
    for (int i = 0; i < WINDOWS; i++) {
        window(m, text, i, w);
        tl_reference_ex(&t, NULL, w, LEN, NULL, NULL, ref_observe, &a);
    }
    for (int l = 0; l < t.layers; l++)
        for (int k = 0; k < 7; k++) {
            const int c = tl_cols(&t, k), li = l * 7 + k;
            cr_assert_eq(a.count[l][k], WINDOWS * (LEN - 1));
            close_rel(s.xtx_diag[li], a.xdiag[l][k], (size_t)c, 1e-5, "diag(X^T X)", l, k);
            for (int j = 0; j < c; j++) a.mabs[l][k][j] /= (double)a.count[l][k];
            close_rel(s.mean_abs[li], a.mabs[l][k], (size_t)c, 1e-5, "mean |x|", l, k);
            close_rel(s.xtx[li], a.xtx[l][k], (size_t)c * c, 1e-5, "X^T X", l, k);
            for (int q = 0; q < 7; q++) { /* sample q is row floor((2q + 1) total / 14) */
                const long g = (long)(((2.0 * q + 1.0) * (double)a.count[l][k]) / 14.0);
                close_rel(s.awq[li] + (size_t)q * c, a.rows[l][k] + (size_t)g * c, (size_t)c, 1e-5, "AWQ sample", l, k);
            }
        }
    acts_free(&a, &t);
    mpq_calib_stats_free(&s);
    mpq_llm_free(m);
    tl_free(&t);
}

/* RTN at `bits` g128 (or MXINT4) of one map, dequantized: the quantizers
   the statistics use (tested in test_pack / test_mxint). */
static float *quantized(const tl_model *t, int l, int k, int bits, int mx)
{
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    d.rows = tl_rows(t, k), d.cols = tl_cols(t, k), d.uniform_bits = bits;
    if (mx) d.format = MPQ_FORMAT_MXINT;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, t->w[l][k], &A), MPQ_OK);
    float *W = (float *)malloc(sizeof(float) * (size_t)d.rows * d.cols);
    cr_assert_eq(mpq_packed_dequantize(&A, 0, W), MPQ_OK);
    mpq_packed_free(&A);
    return W;
}

Test(calib, gradient_statistics_match_finite_differences)
{
    tl_model t;
    shape(&t, 0, 1, 0);
    tl_make(&t, 33);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {9};
    int32_t text[NTOK], win[WINDOWS][LEN];
    random_tokens(&r, &t, text, NTOK);
    for (int i = 0; i < WINDOWS; i++) window(m, text, i, win[i]);
    mpq_calib_stats s = calibrate(m, text, MPQ_CALIB_FISHER | MPQ_CALIB_MIXLLM | MPQ_CALIB_PQI);
    cr_assert_eq(s.mixllm_bits, 4);
    cr_assert_eq(s.pqi_bits, 3);
    wset ws;
    wset_copy(&t, &ws);
    /* Fisher: mean over windows of the squared finite difference */
    for (int trial = 0; trial < 10; trial++) {
        const int l = synth_int(&r, t.layers), k = synth_int(&r, 7);
        const size_t j = (size_t)synth_int(&r, tl_rows(&t, k) * tl_cols(&t, k));
        double want = 0;
        for (int i = 0; i < WINDOWS; i++) want += pow(fd(&t, &ws, l, k, j, win[i], LEN), 2) / WINDOWS;
        const double got = s.fisher[l * 7 + k][j];
        cr_assert(fabs(got - want) <= 5e-3 * want + 1e-10, "Fisher, layer %d map %d weight %zu: %.6g, reference %.6g",
                  l, k, j, got, want);
    }
    /* MixLLM: one whole row of one map per trial (its eq. 4 needs g_c.d_c) */
    for (int trial = 0; trial < 3; trial++) {
        const int l = synth_int(&r, t.layers), k = trial == 0 ? 0 : trial == 1 ? 3 : 6;
        const int rows = tl_rows(&t, k), cols = tl_cols(&t, k), row = synth_int(&r, rows);
        float *Q = quantized(&t, l, k, 4, 0);
        double want = 0;
        for (int i = 0; i < WINDOWS; i++) {
            double gd = 0;
            for (int c = 0; c < cols; c++) {
                const size_t j = (size_t)row * cols + c;
                gd += fd(&t, &ws, l, k, j, win[i], LEN) * ((double)Q[j] - t.w[l][k][j]);
            }
            want += fabs(gd + gd * gd / 2) / WINDOWS;
        }
        free(Q);
        const double got = s.mixllm[l * 7 + k][row];
        cr_assert(fabs(got - want) <= 5e-3 * want + 1e-9, "MixLLM, layer %d map %d row %d: %.6g, reference %.6g", l, k,
                  row, got, want);
    }
    /* PQI: (1/N) sum_k |dF/dw| at w + k/N (Q(w) - w), every map moved at
       once, F the mean loss over the first two windows */
    float *Qw[TL_MAXL][7];
    for (int l = 0; l < t.layers; l++)
        for (int k = 0; k < 7; k++) Qw[l][k] = quantized(&t, l, k, 3, 0);
    int pl[4], pk[4];
    size_t pj[4];
    double want[4] = {0};
    for (int q = 0; q < 4; q++)
        pl[q] = synth_int(&r, t.layers), pk[q] = synth_int(&r, 7),
        pj[q] = (size_t)synth_int(&r, tl_rows(&t, pk[q]) * tl_cols(&t, pk[q]));
    for (int step = 1; step <= 3; step++) {
        for (int l = 0; l < t.layers; l++)
            for (int k = 0; k < 7; k++)
                for (size_t j = 0; j < (size_t)tl_rows(&t, k) * tl_cols(&t, k); j++)
                    ws.w[l][k][j] = t.w[l][k][j] + (float)step / 3.0f * (Qw[l][k][j] - t.w[l][k][j]);
        for (int q = 0; q < 4; q++) {
            const double g =
                (fd(&t, &ws, pl[q], pk[q], pj[q], win[0], LEN) + fd(&t, &ws, pl[q], pk[q], pj[q], win[1], LEN)) / 2;
            want[q] += fabs(g) / 3;
        }
    }
    for (int q = 0; q < 4; q++) {
        const double got = s.pqi[pl[q] * 7 + pk[q]][pj[q]];
        cr_assert(fabs(got - want[q]) <= 5e-3 * want[q] + 1e-6, "PQI, layer %d map %d weight %zu: %.6g, reference %.6g",
                  pl[q], pk[q], pj[q], got, want[q]);
    }
    for (int l = 0; l < t.layers; l++)
        for (int k = 0; k < 7; k++) free(Qw[l][k]);
    wset_free(&t, &ws);
    mpq_calib_stats_free(&s);
    mpq_llm_free(m);
    tl_free(&t);
}

Test(calib, layer_sensitivity_matches_the_reference)
{
    tl_model t;
    shape(&t, 1, 0, 1);
    tl_make(&t, 44);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {11};
    int32_t text[NTOK], w[LEN];
    random_tokens(&r, &t, text, NTOK);
    window(m, text, 0, w);
    mpq_calib_stats s = calibrate(m, text, MPQ_CALIB_LAYER_SENS);
    const int T = 8, D = t.dim;
    double *ref = (double *)malloc(sizeof(double) * T * D), *h = (double *)malloc(sizeof(double) * T * D);
    tl_reference_ex(&t, NULL, w, T, NULL, ref, NULL, NULL);
    double e[TL_MAXL * 7], mx = 0;
    for (int l = 0; l < t.layers; l++)
        for (int k = 0; k < 7; k++) {
            float *W[TL_MAXL][7];
            memcpy(W, t.w, sizeof W);
            W[l][k] = quantized(&t, l, k, 4, 1);
            tl_reference_ex(&t, W, w, T, NULL, h, NULL, NULL);
            free(W[l][k]);
            double s2 = 0;
            for (int j = 0; j < T * D; j++) s2 += (h[j] - ref[j]) * (h[j] - ref[j]);
            e[l * 7 + k] = s2, mx = fmax(mx, s2);
        }
    for (int i = 0; i < t.layers * 7; i++)
        cr_assert(fabs(s.layer_sens[i] - e[i] / mx) <= 2e-3, "map %d: sensitivity %.6f, reference %.6f", i,
                  s.layer_sens[i], e[i] / mx);
    free(ref), free(h);
    mpq_calib_stats_free(&s);
    mpq_llm_free(m);
    tl_free(&t);
}

/* With MPQ_FUZZ_CORPUS set to a directory, a file written here is also
   saved there behind `tag` (a seed of test/fuzz/fuzz_model.c, whose fixed
   model has the shape of these tests): "STAT" a statistics file, "MKLD"
   a measurements file. */
static void corpus_save_as(const char *from, const char *tag, const char *stem)
{
    const char *dir = getenv("MPQ_FUZZ_CORPUS");
    if (!dir || !*dir) return;
    char p[512];
    snprintf(p, sizeof p, "%s/%s-%ld.bin", dir, stem, (long)getpid());
    FILE *in = fopen(from, "rb"), *out = fopen(p, "wb");
    cr_assert(in && out);
    fputs(tag, out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) cr_assert_eq(fwrite(buf, 1, n, out), n);
    fclose(in), fclose(out);
}

static void corpus_save(const char *from) { corpus_save_as(from, "STAT", "stats"); }

static int same_arrays(float **a, float **b, const mpq_calib_stats *s, const mpq_llm *m, int kind)
{
    if (!a || !b) return a == b;
    for (int i = 0; i < s->nlin; i++) {
        const mpq_linear *L = &m->layer[i / 7].lin[i % 7];
        const size_t n = kind == 0 ? (size_t)L->rows * L->cols
            : kind == 1            ? (size_t)L->rows
            : kind == 2            ? (size_t)L->cols
                                   : (size_t)s->awq_tokens * L->cols;
        if (memcmp(a[i], b[i], sizeof(float) * n)) return 0;
    }
    return 1;
}

static int same_stats(const mpq_calib_stats *a, const mpq_calib_stats *b, const mpq_llm *m)
{
    return a->what == b->what && a->windows == b->windows && same_arrays(a->fisher, b->fisher, a, m, 0) &&
        same_arrays(a->pqi, b->pqi, a, m, 0) && same_arrays(a->mixllm, b->mixllm, a, m, 1) &&
        same_arrays(a->xtx_diag, b->xtx_diag, a, m, 2) && same_arrays(a->mean_abs, b->mean_abs, a, m, 2) &&
        same_arrays(a->awq, b->awq, a, m, 3) &&
        (a->layer_sens && b->layer_sens ? !memcmp(a->layer_sens, b->layer_sens, sizeof(float) * (size_t)a->nlin)
                                        : a->layer_sens == b->layer_sens);
}

/* ---- a layer at a time, in place, into the file ------------------------------ */

static void fisher_sum(void *user, int layer, int lin, const float *G, int rows, int cols)
{
    mpq_stat *f = (mpq_stat *)user;
    cr_assert_eq(mpq_fisher_add(&f[layer * 7 + lin], G, (size_t)rows * cols), MPQ_OK);
}

static int same_xtx(const mpq_calib_stats *a, const mpq_calib_stats *b, const mpq_llm *m)
{
    if (!a->xtx || !b->xtx) return a->xtx == b->xtx;
    for (int i = 0; i < a->nlin; i++) {
        const size_t c = (size_t)m->layer[i / 7].lin[i % 7].cols;
        if (memcmp(a->xtx[i], b->xtx[i], sizeof(float) * c * c)) return 0;
    }
    return 1;
}

/* t written as a Hugging Face directory with BF16 maps (dir, under the
   test's directory), loaded as float32 (*m) and in place (*p). */
static void load_both(const tl_model *t, char *dir, size_t cap, mpq_llm **m, mpq_llm **p)
{
    snprintf(dir, cap, "%s/hf", tmpdir);
    mkdir(dir, 0700);
    tl_write_hf(t, dir, MPQ_DT_BF16);
    mpq_io_err e;
    cr_assert_eq(mpq_llm_load(dir, m, &e), MPQ_OK, "%s", e.msg);
    mpq_llm_load_opts lo = {1, 0};
    cr_assert_eq(mpq_llm_load_with(dir, &lo, p, &e), MPQ_OK, "%s", e.msg);
    cr_assert((*p)->src && !(*p)->layer[0].lin[0].W);
}

/* Calibration runs a layer at a time (every window through layer l, then
   l + 1; the backward pass from the top layer down, each layer's
   activations recomputed from its kept input). Its Fisher diagonal is
   checked bit for bit against the squared gradients of mpq_llm_backward,
   one window at a time through the whole model, summed the way
   mpq_fisher_add sums them. A model in place (BF16 maps, so that they are
   converted a layer at a time) gives the statistics of the model loaded
   as float32, in memory and through mpq_llm_calibrate_file with the kept
   inputs spilled to a file, rotated or not. What cannot work is refused
   and leaves no file. */
Test(calib, a_layer_at_a_time_in_place_and_into_the_file_equals_the_whole_model_passes, .init = make_tmpdir,
     .fini = remove_tmpdir)
{
    tl_model t;
    shape(&t, 1, 0, 1);
    tl_make(&t, 33);
    char dir[600], out[700], bad[700];
    mpq_llm *m = NULL, *p = NULL;
    mpq_io_err e;
    load_both(&t, dir, sizeof dir, &m, &p);
    synth_rng r = {9};
    int32_t text[NTOK], win[LEN];
    random_tokens(&r, &t, text, NTOK);
    const unsigned what = MPQ_CALIB_FISHER | MPQ_CALIB_MIXLLM | MPQ_CALIB_ACTS | MPQ_CALIB_XTX;
    mpq_calib_stats s = calibrate(m, text, what);
    /* the whole-model passes, one window at a time */
    mpq_stat f[2 * 7];
    for (int i = 0; i < 14; i++)
        cr_assert_eq(mpq_stat_init(&f[i], (size_t)m->layer[i / 7].lin[i % 7].rows * m->layer[i / 7].lin[i % 7].cols),
                     MPQ_OK);
    mpq_llm_train *tr = NULL;
    cr_assert_eq(mpq_llm_train_init(m, LEN, &tr), MPQ_OK);
    double loss = 0;
    for (int w = 0; w < WINDOWS; w++) {
        window(m, text, w, win);
        double lw = 0;
        cr_assert_eq(mpq_llm_backward(m, tr, win, LEN, NULL, NULL, fisher_sum, f, &lw), MPQ_OK);
        loss += lw;
    }
    cr_assert_eq(loss / WINDOWS, s.loss, "loss %.17g, whole model %.17g", s.loss, loss / WINDOWS);
    for (int i = 0; i < 14; i++) {
        float *v = malloc(sizeof(float) * f[i].n);
        cr_assert_eq(mpq_stat_mean(&f[i], v), MPQ_OK);
        cr_assert(!memcmp(v, s.fisher[i], sizeof(float) * f[i].n), "map %d: Fisher differs from the whole model's", i);
        free(v);
        mpq_stat_free(&f[i]);
    }
    mpq_llm_train_free(tr);
    /* in place, in memory */
    mpq_calib_stats sp = calibrate(p, text, what);
    cr_assert(same_stats(&s, &sp, m) && same_xtx(&s, &sp, m) && s.loss == sp.loss, "in place differs");
    /* in place, into the file, the kept inputs in a file (a limit of one byte) */
    mpq_calib_opts o;
    memset(&o, 0, sizeof o);
    o.what = what, o.windows = WINDOWS, o.length = LEN, o.awq_tokens = 7, o.keep_bytes = 1, o.spill_dir = tmpdir;
    snprintf(out, sizeof out, "%s/stats.safetensors", tmpdir);
    mpq_calib_stats info, sf;
    cr_assert_eq(mpq_llm_calibrate_file(p, text, NTOK, &o, "{\"text\": \"t\"}", out, &info, &e), MPQ_OK, "%s", e.msg);
    cr_assert(info.loss == s.loss && info.windows == WINDOWS && !info.fisher && !info.xtx);
    cr_assert_eq(mpq_calib_read(m, out, &sf, &e), MPQ_OK, "%s", e.msg);
    cr_assert(same_stats(&s, &sf, m) && same_xtx(&s, &sf, m) && sf.loss == s.loss, "the file differs");
    mpq_calib_stats_free(&sf);
    /* rotated: the file from the model in place against the float32 model in memory */
    o.rotate = 1, o.rotate_seed = 77, o.keep_bytes = 0;
    mpq_calib_stats sr;
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &sr, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_llm_calibrate_file(p, text, NTOK, &o, NULL, out, NULL, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_calib_read(m, out, &sf, &e), MPQ_OK, "%s", e.msg);
    cr_assert(same_stats(&sr, &sf, m) && same_xtx(&sr, &sf, m), "rotated: the file differs");
    cr_assert(!same_stats(&s, &sr, m), "the rotation changed nothing");
    mpq_calib_stats_free(&sf), mpq_calib_stats_free(&sr);
    unlink(out);
    /* refused, nothing left behind */
    o.rotate = 0, o.what = what;
    cr_assert_eq(mpq_llm_calibrate_file(p, text, NTOK, &o, "{not json", out, NULL, &e), MPQ_ERR_ARG);
    cr_assert_neq(access(out, F_OK), 0);
    snprintf(bad, sizeof bad, "%s/no-such-dir", tmpdir);
    o.keep_bytes = 1, o.spill_dir = bad;
    cr_assert_eq(mpq_llm_calibrate_file(p, text, NTOK, &o, NULL, out, NULL, &e), MPQ_ERR_IO);
    cr_assert(strstr(e.msg, "no-such-dir") && strstr(e.msg, "kept hidden states"), "%s", e.msg);
    cr_assert_neq(access(out, F_OK), 0);
    cr_assert_eq(mpq_llm_calibrate_file(p, text, NTOK, NULL, NULL, NULL, NULL, &e), MPQ_ERR_ARG);
    mpq_calib_stats_free(&s), mpq_calib_stats_free(&sp);
    mpq_llm_free(m), mpq_llm_free(p);
    tl_free(&t);
}

/* PQI's gradient at one point of its path: every map at p (flat), the
   mean over the PQI windows of mpq_llm_backward's gradients, summed into
   the flat g window by window as float (1 / windows) G. */
typedef struct pqi_ref {
    const mpq_llm *m;
    mpq_llm_train *tr;
    const int32_t *text;
    int windows;
    size_t off[TL_MAXL * 7 + 1];
    float *g;
} pqi_ref;

static void pqi_ref_add(void *user, int layer, int lin, const float *G, int rows, int cols)
{
    pqi_ref *R = (pqi_ref *)user;
    float *g = R->g + R->off[layer * 7 + lin];
    for (size_t k = 0; k < (size_t)rows * cols; k++) g[k] += (float)(1.0 / R->windows * G[k]);
}

static mpq_status pqi_ref_grad(void *user, const float *w, float *grad, size_t n)
{
    pqi_ref *R = (pqi_ref *)user;
    const float *W[TL_MAXL * 7];
    for (int i = 0; i < R->m->c.layers * 7; i++) W[i] = w + R->off[i];
    memset(grad, 0, sizeof(float) * n);
    R->g = grad;
    int32_t win[LEN];
    for (int k = 0; k < R->windows; k++) {
        window(R->m, R->text, k, win);
        const mpq_status st = mpq_llm_backward(R->m, R->tr, win, LEN, W, NULL, pqi_ref_add, R, NULL);
        if (st != MPQ_OK) return st;
    }
    return MPQ_OK;
}

/* PQI and the MXSens layer sensitivity run a layer at a time too. PQI is
   checked bit for bit against mpq_pqi along the flat vector of every map
   with mpq_llm_backward's gradients (the whole model at once), the float64
   reference of both in the tests above; the model in place (BF16 maps),
   in memory and into the file with its sequences spilled to a file, gives
   the bits of the model loaded as float32, rotated or not. */
Test(calib, pqi_and_the_layer_sensitivity_a_layer_at_a_time_in_place_and_into_the_file, .init = make_tmpdir,
     .fini = remove_tmpdir)
{
    tl_model t;
    shape(&t, 0, 1, 0);
    tl_make(&t, 35);
    char dir[600], out[700];
    mpq_llm *m = NULL, *p = NULL;
    mpq_io_err e;
    load_both(&t, dir, sizeof dir, &m, &p);
    synth_rng r = {21};
    int32_t text[NTOK];
    random_tokens(&r, &t, text, NTOK);
    const unsigned what = MPQ_CALIB_PQI | MPQ_CALIB_LAYER_SENS;
    mpq_calib_stats s = calibrate(m, text, what);
    cr_assert(s.pqi && s.layer_sens && s.pqi_steps == 3 && s.pqi_windows == 2);
    /* the whole model at once */
    pqi_ref R;
    memset(&R, 0, sizeof R);
    R.m = m, R.text = text, R.windows = s.pqi_windows;
    const int nlin = m->c.layers * 7;
    for (int i = 0; i < nlin; i++)
        R.off[i + 1] = R.off[i] + (size_t)m->layer[i / 7].lin[i % 7].rows * m->layer[i / 7].lin[i % 7].cols;
    const size_t N = R.off[nlin];
    float *w = malloc(sizeof(float) * N), *wq = malloc(sizeof(float) * N), *v = malloc(sizeof(float) * N);
    for (int i = 0; i < nlin; i++) {
        const mpq_linear *L = &m->layer[i / 7].lin[i % 7];
        memcpy(w + R.off[i], L->W, sizeof(float) * (R.off[i + 1] - R.off[i]));
        mpq_bitplane_desc d;
        memset(&d, 0, sizeof d);
        d.rows = L->rows, d.cols = L->cols, d.uniform_bits = s.pqi_bits;
        mpq_packed A;
        cr_assert_eq(mpq_pack_alloc(&d, L->W, &A), MPQ_OK);
        cr_assert_eq(mpq_packed_dequantize(&A, 0, wq + R.off[i]), MPQ_OK);
        mpq_packed_free(&A);
    }
    cr_assert_eq(mpq_llm_train_init(m, LEN, &R.tr), MPQ_OK);
    cr_assert_eq(mpq_pqi(w, wq, N, s.pqi_steps, pqi_ref_grad, &R, v), MPQ_OK);
    for (int i = 0; i < nlin; i++)
        cr_assert(!memcmp(v + R.off[i], s.pqi[i], sizeof(float) * (R.off[i + 1] - R.off[i])),
                  "map %d: PQI differs from the whole model's", i);
    mpq_llm_train_free(R.tr);
    free(w), free(wq), free(v);
    /* in place, in memory; in place into the file, the sequences spilled */
    mpq_calib_stats sp = calibrate(p, text, what), sf;
    cr_assert(same_stats(&s, &sp, m), "in place differs");
    mpq_calib_opts o;
    memset(&o, 0, sizeof o);
    o.what = what, o.windows = WINDOWS, o.length = LEN, o.pqi_steps = 3, o.pqi_windows = 2, o.sens_tokens = 8;
    o.keep_bytes = 1, o.spill_dir = tmpdir;
    snprintf(out, sizeof out, "%s/stats.safetensors", tmpdir);
    cr_assert_eq(mpq_llm_calibrate_file(p, text, NTOK, &o, NULL, out, NULL, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_calib_read(m, out, &sf, &e), MPQ_OK, "%s", e.msg);
    cr_assert(same_stats(&s, &sf, m), "the file differs");
    mpq_calib_stats_free(&sf), mpq_calib_stats_free(&sp);
    /* rotated */
    o.rotate = 1, o.rotate_seed = 5, o.keep_bytes = 0;
    mpq_calib_stats sr;
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &sr, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_llm_calibrate_file(p, text, NTOK, &o, NULL, out, NULL, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_calib_read(m, out, &sf, &e), MPQ_OK, "%s", e.msg);
    cr_assert(same_stats(&sr, &sf, m), "rotated: the file differs");
    cr_assert(!same_stats(&s, &sr, m), "the rotation changed nothing");
    mpq_calib_stats_free(&sf), mpq_calib_stats_free(&sr);
    /* a spill directory that does not exist: refused, no file */
    unlink(out);
    char bad[700];
    snprintf(bad, sizeof bad, "%s/no-such-dir", tmpdir);
    o.rotate = 0, o.keep_bytes = 1, o.spill_dir = bad;
    cr_assert_eq(mpq_llm_calibrate_file(p, text, NTOK, &o, NULL, out, NULL, &e), MPQ_ERR_IO);
    cr_assert(strstr(e.msg, "no-such-dir") && strstr(e.msg, "kept hidden states"), "%s", e.msg);
    cr_assert_neq(access(out, F_OK), 0);
    mpq_calib_stats_free(&s);
    mpq_llm_free(m), mpq_llm_free(p);
    tl_free(&t);
}

/* Stopped after `left` more layers (the cancel callback's count). */
/* ---- measured sensitivity ---------------------------------------------------- */

typedef struct mq {
    const tl_model *t;
    const mpq_llm *m;
    int calls, fail_at, nan_at, weights_differ;
} mq;

/* RTN at `bits` (g128) of the weights handed over, which must be those
   of q->m, a model loaded as float32. */
static mpq_status mq_quantize(void *user, int i, int bits, const float *W, float *Wq)
{
    mq *q = (mq *)user;
    const int l = i / 7, k = i % 7, rows = tl_rows(q->t, k), cols = tl_cols(q->t, k);
    q->calls++;
    if (q->fail_at == q->calls) return MPQ_ERR_BITS;
    const float *own = q->m->layer[l].lin[k].W; /* a model loaded as float32 */
    q->weights_differ += memcmp(own, W, sizeof(float) * rows * cols) != 0;
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    d.rows = rows, d.cols = cols, d.uniform_bits = bits;
    mpq_packed A;
    mpq_status st = mpq_pack_alloc(&d, W, &A);
    if (st == MPQ_OK) st = mpq_packed_dequantize(&A, 0, Wq);
    mpq_packed_free(&A);
    if (q->nan_at == q->calls) Wq[3] = NAN;
    return st;
}

static double kld_ref(const double *zp, const double *zq, int n, int V)
{
    double s = 0;
    for (int i = 0; i < n; i++) {
        const double *p = zp + (size_t)i * V, *q = zq + (size_t)i * V;
        double mp = p[0], mq_ = q[0], sp = 0, sq = 0, k = 0;
        for (int v = 1; v < V; v++) mp = fmax(mp, p[v]), mq_ = fmax(mq_, q[v]);
        for (int v = 0; v < V; v++) sp += exp(p[v] - mp), sq += exp(q[v] - mq_);
        for (int v = 0; v < V; v++) {
            const double lp = p[v] - mp - log(sp), lq = q[v] - mq_ - log(sq);
            k += exp(lp) * (lp - lq);
        }
        s += k;
    }
    return s / n;
}

static mpq_measure_opts mq_opts(mq *q, const int *bits, int nbits)
{
    mpq_measure_opts o;
    memset(&o, 0, sizeof o);
    o.bits = bits, o.nbits = nbits, o.quantize = mq_quantize, o.user = q, o.windows = 2, o.length = LEN;
    return o;
}

/* Each map alone at each width: the KLD against the float model of a
   float64 reference forward pass with that map replaced, over both
   windows; in place (BF16, converted a layer at a time) and with the
   sequences spilled to a file, the same bits as in memory. */
Test(calib, measured_kld_matches_the_reference, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model t;
    shape(&t, 1, 0, 1);
    tl_make(&t, 46);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {12};
    int32_t text[NTOK];
    random_tokens(&r, &t, text, NTOK);
    const int bits[2] = {2, 3}, nlin = t.layers * 7, V = t.vocab_rows;
    mq q = {&t, m, 0, 0, 0, 0};
    mpq_measure_opts o = mq_opts(&q, bits, 2);
    double *kld = (double *)malloc(sizeof(double) * nlin * 2);
    mpq_io_err e;
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o, kld, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(q.calls, nlin * 2, "one quantization per map and width");
    cr_assert_eq(q.weights_differ, 0, "the quantizer sees the model's weights");
    double *zf = (double *)malloc(sizeof(double) * 2 * LEN * V), *zq = (double *)malloc(sizeof(double) * LEN * V);
    int32_t win[2][LEN];
    for (int w = 0; w < 2; w++) { /* windows at floor(w * (47 / 10) / 2) * 10 */
        memcpy(win[w], text + w * 20, sizeof(int32_t) * LEN);
        if (mpq_tokenizer_adds_bos(m->tok) && mpq_tokenizer_bos(m->tok) >= 0) win[w][0] = mpq_tokenizer_bos(m->tok);
        tl_reference(&t, NULL, win[w], LEN, zf + (size_t)w * LEN * V);
    }
    for (int l = 0; l < t.layers; l++)
        for (int k = 0; k < 7; k++)
            for (int b = 0; b < 2; b++) {
                float *W[TL_MAXL][7];
                memcpy(W, t.w, sizeof W);
                W[l][k] = quantized(&t, l, k, bits[b], 0);
                double want = 0;
                for (int w = 0; w < 2; w++) {
                    tl_reference(&t, W, win[w], LEN, zq);
                    want += kld_ref(zf + (size_t)w * LEN * V, zq, LEN, V) / 2;
                }
                free(W[l][k]);
                const double got = kld[(l * 7 + k) * 2 + b];
                cr_assert(want > 0 && fabs(got - want) <= 2e-3 * want + 1e-9, "map %d at %d bits: %.9g, reference %.9g",
                          l * 7 + k, bits[b], got, want);
            }
    /* narrower widths move the model more, map by map (on these sizes, where it is plain) */
    int wider_worse = 0;
    for (int i = 0; i < nlin; i++) wider_worse += kld[i * 2 + 1] > kld[i * 2];
    cr_assert_leq(wider_worse, 1, "%d maps moved more at 3 bits than at 2", wider_worse);
    /* in place, and spilled: the same bits */
    char dir[600];
    mpq_llm *mb = NULL, *mp = NULL;
    load_both(&t, dir, sizeof dir, &mb, &mp);
    double *a = (double *)malloc(sizeof(double) * nlin * 2), *b2 = (double *)malloc(sizeof(double) * nlin * 2);
    mq qa = {&t, mb, 0, 0, 0, 0}, qb = {&t, mb, 0, 0, 0, 0};
    mpq_measure_opts oa = mq_opts(&qa, bits, 2), ob = mq_opts(&qb, bits, 2);
    ob.keep_bytes = 1, ob.spill_dir = tmpdir;
    cr_assert_eq(mpq_llm_measure(mb, text, NTOK, &oa, a, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_llm_measure(mp, text, NTOK, &ob, b2, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(qb.weights_differ, 0, "in place: the layer converted is the model's");
    cr_assert_arr_eq(a, b2, sizeof(double) * nlin * 2, "in place and spilled: the same bits");
#ifdef _OPENMP /* one thread and three: the same bits */
    const int nt = omp_get_max_threads();
    mq q1 = {&t, m, 0, 0, 0, 0}, q3 = {&t, m, 0, 0, 0, 0};
    mpq_measure_opts o1 = mq_opts(&q1, bits, 2), o3 = mq_opts(&q3, bits, 2);
    omp_set_num_threads(1);
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o1, a, &e), MPQ_OK, "%s", e.msg);
    omp_set_num_threads(3);
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o3, b2, &e), MPQ_OK, "%s", e.msg);
    omp_set_num_threads(nt);
    cr_assert_arr_eq(a, b2, sizeof(double) * nlin * 2, "1 and 3 threads: the same bits");
#endif
    free(a), free(b2), free(zf), free(zq), free(kld);
    mpq_llm_free(mb), mpq_llm_free(mp);
    mpq_llm_free(m);
    tl_free(&t);
}

static int mq_cancel(void *user)
{
    (void)user;
    return 1;
}

Test(calib, measurement_bad_input_writes_nothing)
{
    tl_model t;
    shape(&t, 0, 1, 0);
    tl_make(&t, 47);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {13};
    int32_t text[NTOK];
    random_tokens(&r, &t, text, NTOK);
    const int bits[2] = {2, 4}, bad9[1] = {9}, bad0[1] = {0};
    double kld[TL_MAXL * 7 * 2], keep[TL_MAXL * 7 * 2];
    for (int i = 0; i < TL_MAXL * 7 * 2; i++) kld[i] = keep[i] = -7.0;
    mq q = {&t, m, 0, 0, 0, 0};
    mpq_io_err e;
    mpq_measure_opts o = mq_opts(&q, bits, 2);
    o.nbits = 0;
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o, kld, &e), MPQ_ERR_ARG);
    o = mq_opts(&q, bad9, 1);
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o, kld, &e), MPQ_ERR_ARG);
    o = mq_opts(&q, bad0, 1);
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o, kld, &e), MPQ_ERR_ARG);
    o = mq_opts(&q, bits, 2);
    o.quantize = NULL;
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o, kld, &e), MPQ_ERR_ARG);
    o = mq_opts(&q, bits, 2);
    cr_assert_eq(mpq_llm_measure(m, text, LEN - 1, &o, kld, &e), MPQ_ERR_SIZE, "a text shorter than a window");
    cr_assert_not_null(strstr(e.msg, "shorter"), "%s", e.msg);
    int32_t badtok[NTOK];
    memcpy(badtok, text, sizeof badtok);
    badtok[5] = t.vocab_rows;
    cr_assert_eq(mpq_llm_measure(m, badtok, NTOK, &o, kld, &e), MPQ_ERR_ARG);
    q.fail_at = 5; /* map 2 at 2 bits */
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o, kld, &e), MPQ_ERR_BITS);
    cr_assert_not_null(strstr(e.msg, "map 2 (layer 0) at 2 bits"), "%s", e.msg);
    q.fail_at = 0, q.calls = 0, q.nan_at = 16; /* map 7 (layer 1) at 4 bits */
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o, kld, &e), MPQ_ERR_NONFINITE);
    cr_assert_not_null(strstr(e.msg, "map 7 (layer 1) at 4 bits"), "%s", e.msg);
    q.nan_at = 0, q.calls = 0;
    o.cancel = mq_cancel;
    cr_assert_eq(mpq_llm_measure(m, text, NTOK, &o, kld, &e), MPQ_ERR_CANCELLED);
    cr_assert_arr_eq(kld, keep, sizeof kld, "nothing written on an error");
    mpq_llm_free(m);
    tl_free(&t);
}

static int stop_after(void *user)
{
    int *left = (int *)user;
    return --*left < 0;
}

static int dir_files(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

/* A run with a resume directory, stopped after every layer of every pass
   (phase 1's forward and backward, PQI's forward, its head and backward,
   the sensitivity's) and then finished, gives the statistics of a run
   that never stopped, bit for bit, into the file and in memory; the
   directory is empty afterwards. Phase 1 alone the same. Another text
   there, or a state file cut short, is refused naming it. */
Test(calib, a_stopped_run_resumes_from_its_last_layer, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model t;
    shape(&t, 0, 0, 0);
    t.layers = 3;
    tl_make(&t, 35);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {11};
    int32_t text[NTOK], other[NTOK];
    random_tokens(&r, &t, text, NTOK);
    random_tokens(&r, &t, other, NTOK);
    unsigned what = MPQ_CALIB_ALL | MPQ_CALIB_XTX;
    mpq_calib_stats ref = calibrate(m, text, what);
    cr_assert(ref.pqi && ref.layer_sens && ref.fisher && ref.xtx);
    char rd[600], out[700];
    snprintf(rd, sizeof rd, "%s/resume", tmpdir);
    cr_assert_eq(mkdir(rd, 0700), 0);
    snprintf(out, sizeof out, "%s/stats.safetensors", tmpdir);
    mpq_calib_opts o;
    memset(&o, 0, sizeof o);
    o.what = what, o.windows = WINDOWS, o.length = LEN, o.awq_tokens = 7, o.resume_dir = rd, o.cancel = stop_after;
    o.pqi_steps = 3, o.pqi_windows = 2, o.sens_tokens = 8; /* as calibrate() */
    int left = 1;
    o.user = &left;
    mpq_io_err e;
    mpq_calib_stats s;
    for (int run = 0; run < 3; run++) { /* every statistic into the file, in memory; phase 1's alone in memory */
        const int into_file = run == 0;
        if (run == 2) {
            mpq_calib_stats_free(&ref);
            what = MPQ_CALIB_FISHER | MPQ_CALIB_MIXLLM | MPQ_CALIB_ACTS | MPQ_CALIB_XTX;
            ref = calibrate(m, text, what);
            o.what = what;
        }
        int stops = 0;
        mpq_status st;
        for (int round = 0;; round++) { /* a layer a round: forward 0 | 1 | 2 and backward 2 | 1 | 0 */
            left = 0;                   /* a layer, then stop */
            st = into_file ? mpq_llm_calibrate_file(m, text, NTOK, &o, NULL, out, NULL, &e)
                           : mpq_llm_calibrate(m, text, NTOK, &o, &s, &e);
            if (st != MPQ_ERR_CANCELLED) break;
            stops++;
            cr_assert_gt(dir_files(rd), 0, "round %d: the state is kept", round);
            if (into_file) cr_assert_neq(access(out, F_OK), 0, "no file before the end");
            if (round == 0 && into_file) { /* another text, the same directory: refused */
                o.cancel = NULL;
                cr_assert_eq(mpq_llm_calibrate_file(m, other, NTOK, &o, NULL, out, NULL, &e), MPQ_ERR_ARG);
                cr_assert(strstr(e.msg, rd) && strstr(e.msg, "another model, text or options"), "%s", e.msg);
                o.cancel = stop_after;
            }
        }
        cr_assert_eq(st, MPQ_OK, "%s", e.msg);
        /* 3 layers: phase 1 stops after forward 0, 1 and backward 2, 1; PQI after forward 0, 1, its head and
           backward 2, 1, 0; the sensitivity after 0, 1 */
        cr_assert_eq(stops, run < 2 ? 12 : 4, "stopped after every layer of every pass (%d stops)", stops);
        cr_assert_eq(dir_files(rd), 0, "the directory is emptied");
        if (into_file) cr_assert_eq(mpq_calib_read(m, out, &s, &e), MPQ_OK, "%s", e.msg);
        cr_assert(same_stats(&ref, &s, m) && same_xtx(&ref, &s, m) && s.loss == ref.loss, "resumed %s: differs",
                  into_file ? "into the file" : "in memory");
        mpq_calib_stats_free(&s);
    }
    /* a state whose hidden states were cut short */
    left = 0;
    cr_assert_eq(mpq_llm_calibrate_file(m, text, NTOK, &o, NULL, out, NULL, &e), MPQ_ERR_CANCELLED);
    char h[700];
    snprintf(h, sizeof h, "%s/h.bin", rd);
    cr_assert_eq(truncate(h, 100), 0);
    o.cancel = NULL;
    cr_assert_eq(mpq_llm_calibrate_file(m, text, NTOK, &o, NULL, out, NULL, &e), MPQ_ERR_FORMAT);
    cr_assert(strstr(e.msg, "h.bin"), "%s", e.msg);
    /* a state file that is not one mpq wrote */
    snprintf(h, sizeof h, "%s/state.json", rd);
    FILE *sf = fopen(h, "wb");
    cr_assert_not_null(sf);
    fputs("{\"identity\": 3, \"phase\": 9}", sf);
    fclose(sf);
    unlink(out); /* the finished runs' file */
    cr_assert_eq(mpq_llm_calibrate_file(m, text, NTOK, &o, NULL, out, NULL, &e), MPQ_ERR_FORMAT);
    cr_assert(strstr(e.msg, "state.json") && strstr(e.msg, "not a state"), "%s", e.msg);
    cr_assert_neq(access(out, F_OK), 0);
    /* a directory that is not there */
    snprintf(h, sizeof h, "%s/none", tmpdir);
    o.resume_dir = h;
    cr_assert_eq(mpq_llm_calibrate_file(m, text, NTOK, &o, NULL, out, NULL, &e), MPQ_ERR_IO);
    cr_assert(strstr(e.msg, "none") && strstr(e.msg, "must exist"), "%s", e.msg);
    mpq_calib_stats_free(&ref);
    mpq_llm_free(m);
    tl_free(&t);
}

/* ---- rotated statistics ------------------------------------------------------ */

/* Row j of V (V^T e_j): where weight j of a row of W' = W V^T moves a row
   of W = W' V. */
static void v_row(const mpq_rotation *R, int j, double *v)
{
    for (int c = 0; c < R->n; c++) v[c] = c == j;
    cr_assert_eq(mpq_rotation_apply_f64(R, v, 1, 1), MPQ_OK);
}

/* Central difference of the reference loss along `dir` (cols) in row `row`
   of map (l, k): the derivative with respect to a weight of W' when dir is
   that weight's row of V. */
static double fd_dir(const tl_model *t, wset *s, int l, int k, int row, const double *dir, const int32_t *tok, int n)
{
    const int cols = tl_cols(t, k);
    float *w = s->w[l][k] + (size_t)row * cols, *w0 = (float *)malloc(sizeof(float) * cols);
    memcpy(w0, w, sizeof(float) * cols);
    double nrm = 0, mx = 0;
    for (int c = 0; c < cols; c++) nrm += dir[c] * dir[c], mx = fmax(mx, fabs(w0[c]));
    const double h = 2e-3 * (mx + 0.05) / sqrt(nrm);
    for (int c = 0; c < cols; c++) w[c] = (float)(w0[c] + h * dir[c]);
    const double lp = ref_loss(t, s->w, tok, n);
    for (int c = 0; c < cols; c++) w[c] = (float)(w0[c] - h * dir[c]);
    const double lm = ref_loss(t, s->w, tok, n);
    memcpy(w, w0, sizeof(float) * cols);
    free(w0);
    return (lp - lm) / (2 * h);
}

/* W' = W V^T of map (l, k) as the quantizers see it, and Q(W') - W' for
   RTN at `bits` g128 (mx: MXINT4) when d is not NULL. */
static float *rotated_w(const tl_model *t, const mpq_rotation *R, int l, int k, int bits, int mx, float *d)
{
    const int rows = tl_rows(t, k), cols = tl_cols(t, k);
    float *Wr = (float *)malloc(sizeof(float) * rows * cols);
    memcpy(Wr, t->w[l][k], sizeof(float) * rows * cols);
    cr_assert_eq(mpq_rotation_apply(R, Wr, rows, 0), MPQ_OK);
    if (!d) return Wr;
    mpq_bitplane_desc q;
    memset(&q, 0, sizeof q);
    q.rows = rows, q.cols = cols, q.uniform_bits = bits;
    if (mx) q.format = MPQ_FORMAT_MXINT;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&q, Wr, &A), MPQ_OK);
    cr_assert_eq(mpq_packed_dequantize(&A, 0, d), MPQ_OK);
    mpq_packed_free(&A);
    for (size_t j = 0; j < (size_t)rows * cols; j++) d[j] -= Wr[j];
    return Wr;
}

/* rows x cols A' back to original coordinates, A' V, in float64. */
static void unrotate(const mpq_rotation *R, const double *Ar, int rows, float *A)
{
    double *v = (double *)malloc(sizeof(double) * R->n);
    for (int i = 0; i < rows; i++) {
        memcpy(v, Ar + (size_t)i * R->n, sizeof(double) * R->n);
        cr_assert_eq(mpq_rotation_apply_f64(R, v, 1, 1), MPQ_OK);
        for (int c = 0; c < R->n; c++) A[(size_t)i * R->n + c] = (float)v[c];
    }
    free(v);
}

Test(calib, rotated_statistics_are_those_of_the_rotated_weights)
{
    tl_model t;
    shape(&t, 0, 1, 0); /* inputs of 40 = 8 x 5, 48 = 16 x 3, 72 = 8 x 9 */
    tl_make(&t, 66);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {17};
    int32_t text[NTOK], win[WINDOWS][LEN];
    random_tokens(&r, &t, text, NTOK);
    for (int i = 0; i < WINDOWS; i++) window(m, text, i, win[i]);
    const uint64_t seed = 18446744073709551557ull; /* past 2^53: the file keeps it exactly */
    mpq_calib_opts o;
    memset(&o, 0, sizeof o);
    o.what = MPQ_CALIB_ALL | MPQ_CALIB_XTX, o.windows = WINDOWS, o.length = LEN, o.awq_tokens = 7, o.pqi_steps = 3;
    o.pqi_windows = 2, o.sens_tokens = 8, o.rotate = 1, o.rotate_seed = seed;
    mpq_calib_stats s, u;
    mpq_io_err e;
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &s, &e), MPQ_OK, "%s", e.msg);
    cr_assert(s.rotate == 1 && s.rotate_seed == seed);
    o.rotate = 0;
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &u, &e), MPQ_OK, "%s", e.msg);
    mpq_rotation R[7];
    for (int k = 0; k < 7; k++) cr_assert_eq(mpq_rotation_init(&R[k], tl_cols(&t, k), seed), MPQ_OK);
    /* the statistics linear in the inputs stay in original coordinates, the same as unrotated */
    for (int i = 0; i < s.nlin; i++) {
        const size_t c = (size_t)tl_cols(&t, i % 7);
        cr_assert(!memcmp(s.awq[i], u.awq[i], sizeof(float) * c * 7) && !memcmp(s.xtx[i], u.xtx[i], 4 * c * c));
    }
    /* diag(X^T X) and mean |x| of the inputs V x */
    acts a;
    acts_alloc(&a, &t);
    for (int i = 0; i < WINDOWS; i++) tl_reference_ex(&t, NULL, win[i], LEN, NULL, NULL, ref_observe, &a);
    for (int l = 0; l < t.layers; l++)
        for (int k = 0; k < 7; k++) {
            const int c = tl_cols(&t, k), li = l * 7 + k;
            double *xd = (double *)calloc(c, sizeof(double)), *ma = (double *)calloc(c, sizeof(double));
            for (long q = 0; q < a.count[l][k]; q++) {
                double *x = a.rows[l][k] + (size_t)q * c;
                cr_assert_eq(mpq_rotation_apply_f64(&R[k], x, 1, 0), MPQ_OK);
                for (int j = 0; j < c; j++) xd[j] += x[j] * x[j], ma[j] += fabs(x[j]) / (double)a.count[l][k];
            }
            close_rel(s.xtx_diag[li], xd, (size_t)c, 1e-5, "rotated diag(X^T X)", l, k);
            close_rel(s.mean_abs[li], ma, (size_t)c, 1e-5, "rotated mean |x|", l, k);
            free(xd), free(ma);
        }
    acts_free(&a, &t);
    wset ws;
    wset_copy(&t, &ws);
    double *dir = (double *)malloc(sizeof(double) * t.ffn);
    /* Fisher: mean over windows of the squared derivative with respect to a weight of W' */
    for (int trial = 0; trial < 8; trial++) {
        const int l = synth_int(&r, t.layers), k = synth_int(&r, 7), cols = tl_cols(&t, k);
        const int row = synth_int(&r, tl_rows(&t, k)), j = synth_int(&r, cols);
        v_row(&R[k], j, dir);
        double want = 0;
        for (int i = 0; i < WINDOWS; i++) want += pow(fd_dir(&t, &ws, l, k, row, dir, win[i], LEN), 2) / WINDOWS;
        const double got = s.fisher[l * 7 + k][(size_t)row * cols + j];
        cr_assert(fabs(got - want) <= 5e-3 * want + 1e-10,
                  "rotated Fisher, layer %d map %d weight (%d, %d): %.6g, reference %.6g", l, k, row, j, got, want);
    }
    /* MixLLM: g'.d' of a row is the derivative along d' V, d' = Q(W') - W' */
    for (int trial = 0; trial < 3; trial++) {
        const int l = synth_int(&r, t.layers), k = trial == 0 ? 1 : trial == 1 ? 3 : 6;
        const int rows = tl_rows(&t, k), cols = tl_cols(&t, k), row = synth_int(&r, rows);
        float *d = (float *)malloc(sizeof(float) * rows * cols);
        free(rotated_w(&t, &R[k], l, k, 4, 0, d));
        for (int c = 0; c < cols; c++) dir[c] = d[(size_t)row * cols + c];
        cr_assert_eq(mpq_rotation_apply_f64(&R[k], dir, 1, 1), MPQ_OK);
        double want = 0;
        for (int i = 0; i < WINDOWS; i++) {
            const double gd = fd_dir(&t, &ws, l, k, row, dir, win[i], LEN);
            want += fabs(gd + gd * gd / 2) / WINDOWS;
        }
        free(d);
        const double got = s.mixllm[l * 7 + k][row];
        cr_assert(fabs(got - want) <= 5e-3 * want + 1e-9,
                  "rotated MixLLM, layer %d map %d row %d: %.6g, reference %.6g", l, k, row, got, want);
    }
    /* PQI along W' -> Q(W'), the model at (W' + s/3 (Q(W') - W')) V */
    float *Wr[TL_MAXL][7], *D[TL_MAXL][7];
    for (int l = 0; l < t.layers; l++)
        for (int k = 0; k < 7; k++) {
            D[l][k] = (float *)malloc(sizeof(float) * tl_rows(&t, k) * tl_cols(&t, k));
            Wr[l][k] = rotated_w(&t, &R[k], l, k, 3, 0, D[l][k]);
        }
    int pl[4], pk[4], prow[4], pj[4];
    double want[4] = {0};
    for (int q = 0; q < 4; q++)
        pl[q] = synth_int(&r, t.layers), pk[q] = synth_int(&r, 7), prow[q] = synth_int(&r, tl_rows(&t, pk[q])),
        pj[q] = synth_int(&r, tl_cols(&t, pk[q]));
    for (int step = 1; step <= 3; step++) {
        for (int l = 0; l < t.layers; l++)
            for (int k = 0; k < 7; k++) {
                const size_t n = (size_t)tl_rows(&t, k) * tl_cols(&t, k);
                double *p = (double *)malloc(sizeof(double) * n);
                for (size_t j = 0; j < n; j++) p[j] = Wr[l][k][j] + (float)step / 3.0f * D[l][k][j];
                unrotate(&R[k], p, tl_rows(&t, k), ws.w[l][k]);
                free(p);
            }
        for (int q = 0; q < 4; q++) {
            v_row(&R[pk[q]], pj[q], dir);
            const double g = (fd_dir(&t, &ws, pl[q], pk[q], prow[q], dir, win[0], LEN) +
                              fd_dir(&t, &ws, pl[q], pk[q], prow[q], dir, win[1], LEN)) /
                2;
            want[q] += fabs(g) / 3;
        }
    }
    for (int q = 0; q < 4; q++) {
        const double got = s.pqi[pl[q] * 7 + pk[q]][(size_t)prow[q] * tl_cols(&t, pk[q]) + pj[q]];
        cr_assert(fabs(got - want[q]) <= 5e-3 * want[q] + 1e-6,
                  "rotated PQI, layer %d map %d weight (%d, %d): %.6g, reference %.6g", pl[q], pk[q], prow[q], pj[q],
                  got, want[q]);
    }
    /* layer sensitivity with each map at MXINT4(W') V */
    const int T = 8, Dm = t.dim;
    double *ref = (double *)malloc(sizeof(double) * T * Dm), *h = (double *)malloc(sizeof(double) * T * Dm);
    tl_reference_ex(&t, NULL, win[0], T, NULL, ref, NULL, NULL);
    double err[TL_MAXL * 7], mx = 0;
    for (int l = 0; l < t.layers; l++)
        for (int k = 0; k < 7; k++) {
            const int rows = tl_rows(&t, k), cols = tl_cols(&t, k);
            float *d = (float *)malloc(sizeof(float) * rows * cols), *Wq = (float *)malloc(sizeof(float) * rows * cols);
            float *w1 = rotated_w(&t, &R[k], l, k, 4, 1, d);
            double *p = (double *)malloc(sizeof(double) * rows * cols);
            for (size_t j = 0; j < (size_t)rows * cols; j++) p[j] = (double)w1[j] + d[j];
            unrotate(&R[k], p, rows, Wq);
            float *W[TL_MAXL][7];
            memcpy(W, t.w, sizeof W);
            W[l][k] = Wq;
            tl_reference_ex(&t, W, win[0], T, NULL, h, NULL, NULL);
            double s2 = 0;
            for (int j = 0; j < T * Dm; j++) s2 += (h[j] - ref[j]) * (h[j] - ref[j]);
            err[l * 7 + k] = s2, mx = fmax(mx, s2);
            free(d), free(Wq), free(w1), free(p);
        }
    for (int i = 0; i < t.layers * 7; i++)
        cr_assert(fabs(s.layer_sens[i] - err[i] / mx) <= 2e-3, "map %d: rotated sensitivity %.6f, reference %.6f", i,
                  s.layer_sens[i], err[i] / mx);
    /* the file keeps the seed */
    char path[600];
    snprintf(path, sizeof path, "%s/rot.safetensors", tmpdir);
    cr_assert_eq(mpq_calib_write(m, &s, NULL, path, &e), MPQ_OK, "%s", e.msg);
    mpq_calib_stats b;
    cr_assert_eq(mpq_calib_read(m, path, &b, &e), MPQ_OK, "%s", e.msg);
    cr_assert(b.rotate == 1 && b.rotate_seed == seed, "read back: rotate %d, seed %llu", b.rotate,
              (unsigned long long)b.rotate_seed);
    cr_assert(same_stats(&s, &b, m));
    corpus_save(path);
    unlink(path);
    mpq_calib_stats_free(&b);
    for (int l = 0; l < t.layers; l++)
        for (int k = 0; k < 7; k++) free(Wr[l][k]), free(D[l][k]);
    for (int k = 0; k < 7; k++) mpq_rotation_free(&R[k]);
    free(ref), free(h), free(dir);
    wset_free(&t, &ws);
    mpq_calib_stats_free(&s), mpq_calib_stats_free(&u);
    mpq_llm_free(m);
    tl_free(&t);
}

/* ---- sequential quantization -------------------------------------------------- */

typedef struct seq_ref {
    const tl_model *t;
    int layer;
    double *xtx[7]; /* layer `layer`'s map inputs, every position */
} seq_ref;

static void seq_observe(void *user, int l, int k, int t, const double *x, int cols)
{
    seq_ref *a = (seq_ref *)user;
    (void)t;
    if (l != a->layer) return;
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < cols; i++) a->xtx[k][(size_t)j * cols + i] += x[j] * x[i];
}

typedef struct seq_seen {
    float *H[TL_MAXL * 7];
} seq_seen;

static void seq_hessian(void *user, int i, const float *H, int cols)
{
    seq_seen *s = (seq_seen *)user;
    s->H[i] = memcpy(malloc(sizeof(float) * cols * cols), H, sizeof(float) * cols * cols);
}

typedef struct seq_store {
    const mpq_packed *want;
    int n, fail_at;
} seq_store;

static mpq_status seq_store_cmp(void *user, int i, mpq_packed *A)
{
    seq_store *s = (seq_store *)user;
    cr_assert_eq(i, s->n, "maps are handed over in order");
    cr_assert(A->bytes == s->want[i].bytes && !memcmp(A->buf, s->want[i].buf, A->bytes), "map %d", i);
    mpq_packed_free(A);
    s->n++;
    return i == s->fail_at ? MPQ_ERR_IO : MPQ_OK;
}

Test(calib, sequential_quantization_takes_each_layers_inputs_after_the_quantized_layers_before)
{
    tl_model t;
    shape(&t, 0, 1, 0);
    tl_make(&t, 77);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {19};
    int32_t text[NTOK], win[WINDOWS][LEN];
    random_tokens(&r, &t, text, NTOK);
    for (int i = 0; i < WINDOWS; i++) window(m, text, i, win[i]);
    enum { NL = 2 * 7 };
    mpq_recipe rc;
    memset(&rc, 0, sizeof rc);
    rc.bits = 3, rc.group = 8, rc.gptq = 1, rc.act_order = 1;
    mpq_recipe_map maps[NL];
    memset(maps, 0, sizeof maps);
    for (int i = 0; i < NL; i++)
        maps[i].rows = tl_rows(&t, i % 7), maps[i].cols = tl_cols(&t, i % 7), maps[i].W = t.w[i / 7][i % 7];
    seq_seen seen;
    memset(&seen, 0, sizeof seen);
    mpq_seq_opts so;
    memset(&so, 0, sizeof so);
    so.windows = WINDOWS, so.length = LEN, so.hessian = seq_hessian, so.user = &seen;
    mpq_packed out[NL];
    mpq_io_err e;
    cr_assert_eq(mpq_llm_quantize_sequential(m, text, NTOK, &so, &rc, maps, out, &e), MPQ_OK, "%s", e.msg);
    /* the float model's X^T X over the same windows */
    mpq_calib_opts o;
    memset(&o, 0, sizeof o);
    o.what = MPQ_CALIB_XTX, o.windows = WINDOWS, o.length = LEN;
    mpq_calib_stats fl;
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &fl, &e), MPQ_OK, "%s", e.msg);
    float *Wcur[TL_MAXL][7];
    memcpy(Wcur, t.w, sizeof Wcur);
    float *deq[NL];
    int later_differs = 0;
    for (int l = 0; l < t.layers; l++) {
        /* the reference: layer l's inputs in float64 with the layers before at their quantized weights */
        seq_ref a = {&t, l, {NULL}};
        for (int k = 0; k < 7; k++) a.xtx[k] = calloc((size_t)tl_cols(&t, k) * tl_cols(&t, k), sizeof(double));
        for (int w = 0; w < WINDOWS; w++) tl_reference_ex(&t, Wcur, win[w], LEN, NULL, NULL, seq_observe, &a);
        for (int k = 0; k < 7; k++) {
            const int i = l * 7 + k, c = tl_cols(&t, k), rows = tl_rows(&t, k);
            cr_assert_not_null(seen.H[i], "map %d: its X^T X was reported", i);
            close_rel(seen.H[i], a.xtx[k], (size_t)c * c, 1e-5, "sequential X^T X", l, k);
            if (l == 0) /* layer 0 sees the float model's inputs: exactly calibration's X^T X */
                cr_assert(!memcmp(seen.H[i], fl.xtx[i], sizeof(float) * c * c), "map %d: layer 0's X^T X", i);
            else
                later_differs |= memcmp(seen.H[i], fl.xtx[i], sizeof(float) * c * c) != 0;
            /* and the map is the recipe's on that X^T X */
            mpq_recipe_map mc = maps[i];
            mc.H = seen.H[i];
            mpq_packed want;
            cr_assert_eq(mpq_recipe_quantize(&rc, i, &mc, NULL, &want), MPQ_OK);
            cr_assert(want.bytes == out[i].bytes && !memcmp(want.buf, out[i].buf, want.bytes), "map %d", i);
            mpq_packed_free(&want);
            deq[i] = malloc(sizeof(float) * rows * c);
            cr_assert_eq(mpq_packed_dequantize(&out[i], 0, deq[i]), MPQ_OK);
            Wcur[l][k] = deq[i];
            free(a.xtx[k]);
        }
    }
    cr_assert(later_differs, "layer 1 sees layer 0's rounding");
    /* the model in place, the maps' W NULL (the model's own), each map handed over as it is made: the same
       bytes; a store that fails stops the run with its error */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/hf", tmpdir);
    mpq_llm *p = NULL;
    mpq_llm_load_opts lo = {1, 0};
    cr_assert_eq(mpq_llm_load_with(dir, &lo, &p, &e), MPQ_OK, "%s", e.msg);
    cr_assert(p->src && !p->layer[1].lin[MPQ_LIN_DOWN].W);
    mpq_recipe_map own[NL];
    memcpy(own, maps, sizeof own);
    for (int i = 0; i < NL; i++) own[i].W = NULL;
    seq_store ss = {out, 0, -1};
    mpq_seq_opts so2 = so;
    so2.hessian = NULL, so2.store = seq_store_cmp, so2.user = &ss;
    mpq_packed empty[NL];
    cr_assert_eq(mpq_llm_quantize_sequential(p, text, NTOK, &so2, &rc, own, empty, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(ss.n, NL);
    for (int i = 0; i < NL; i++) cr_assert_null(empty[i].buf, "map %d stayed in out", i);
    ss.n = 0, ss.fail_at = 9;
    cr_assert_eq(mpq_llm_quantize_sequential(p, text, NTOK, &so2, &rc, own, empty, &e), MPQ_ERR_IO);
    cr_assert(ss.n == 10 && strstr(e.msg, "map 9"), "%d maps; %s", ss.n, e.msg);
    mpq_llm_free(p);
    /* a planner over all the maps, ReQuant, a wrong shape: refused, nothing out */
    mpq_recipe bad = rc;
    bad.planner = MPQ_PLANNER_SFMP, bad.bpw = 3;
    mpq_packed none[NL];
    cr_assert_eq(mpq_llm_quantize_sequential(m, text, NTOK, &so, &bad, maps, none, &e), MPQ_ERR_ARG);
    maps[3].cols++;
    cr_assert_eq(mpq_llm_quantize_sequential(m, text, NTOK, &so, &rc, maps, none, &e), MPQ_ERR_SIZE);
    cr_assert_not_null(strstr(e.msg, "map 3"), "%s", e.msg);
    maps[3].cols--;
    cr_assert_eq(mpq_llm_quantize_sequential(m, text, LEN - 1, &so, &rc, maps, none, &e), MPQ_ERR_SIZE);
    for (int i = 0; i < NL; i++) free(seen.H[i]), free(deq[i]), mpq_packed_free(&out[i]);
    mpq_calib_stats_free(&fl);
    mpq_llm_free(m);
    tl_free(&t);
}

/* X^T X in the statistics file: once per input, under q, o, gate and down
   as the lower triangle by rows; k, v and up read back from their owner;
   mpq_calib_read_xtx also takes a full square (other Hessian files), and
   refuses a missing tensor, another shape or a value that is not finite,
   naming the file and tensor. */
Test(calib, xtx_is_kept_once_per_input_as_its_triangle)
{
    tl_model t;
    shape(&t, 1, 0, 1);
    tl_make(&t, 57);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {17};
    int32_t text[NTOK];
    random_tokens(&r, &t, text, NTOK);
    mpq_calib_stats a = calibrate(m, text, MPQ_CALIB_XTX);
    char p[600];
    snprintf(p, sizeof p, "%s/xtx.safetensors", tmpdir);
    mpq_io_err e;
    cr_assert_eq(mpq_calib_write(m, &a, NULL, p, &e), MPQ_OK, "%s", e.msg);
    mpq_st_file *f = NULL;
    cr_assert_eq(mpq_st_open(p, &f, &e), MPQ_OK);
    for (int i = 0; i < a.nlin; i++) {
        char base[200], name[256];
        mpq_llm_linear_name(0, i / 7, i % 7, 0, base, sizeof base);
        snprintf(name, sizeof name, "%s.xtx", base);
        const mpq_st_tensor *x = mpq_st_find(f, name);
        const int lin = i % 7, owner = lin != MPQ_LIN_K && lin != MPQ_LIN_V && lin != MPQ_LIN_UP;
        const uint64_t c = (uint64_t)m->layer[i / 7].lin[lin].cols;
        cr_assert_eq(x != NULL, owner, "%s: %s", name, owner ? "missing" : "written twice");
        if (!x) continue;
        cr_assert(x->ndim == 1 && x->shape[0] == c * (c + 1) / 2, "%s: not the packed triangle", name);
        float *tri = malloc(sizeof(float) * (size_t)x->numel);
        cr_assert_eq(mpq_st_read_f32(f, x, tri, (size_t)x->numel, &e), MPQ_OK);
        for (uint64_t row = 0, at = 0; row < c; row++)
            for (uint64_t j = 0; j <= row; j++, at++)
                cr_assert_eq(tri[at], a.xtx[i][row * c + j], "%s (%llu, %llu)", name, (unsigned long long)row,
                             (unsigned long long)j);
        free(tri);
    }
    mpq_st_close(f);
    mpq_calib_stats b;
    cr_assert_eq(mpq_calib_read(m, p, &b, &e), MPQ_OK, "%s", e.msg);
    cr_assert(same_xtx(&a, &b, m), "X^T X read back differs");
    corpus_save(p);
    mpq_calib_stats_free(&b);
    /* mpq_calib_read_xtx on its own: squares and triangles of awkward sizes, an owner, bad tensors */
    static const int sizes[] = {1, 2, 7, 33, 64, 65, 130}; /* the mirror goes by tiles of 64 */
    enum { NS = sizeof sizes / sizeof sizes[0] };
    mpq_st_writer *w = NULL;
    cr_assert_eq(mpq_st_writer_open(p, &w, &e), MPQ_OK);
    float *H[NS];
    for (int k = 0; k < NS; k++) {
        const int c = sizes[k];
        H[k] = malloc(sizeof(float) * c * c);
        for (int i = 0; i < c; i++)
            for (int j = 0; j <= i; j++) H[k][i * c + j] = H[k][j * c + i] = synth_gauss(&r);
        char name[64];
        snprintf(name, sizeof name, "sq%d", k);
        const uint64_t sq[2] = {(uint64_t)c, (uint64_t)c}, n = (uint64_t)c * (c + 1) / 2;
        cr_assert_eq(mpq_st_write_f32(w, name, MPQ_DT_F32, 2, sq, H[k], &e), MPQ_OK);
        float *tri = malloc(sizeof(float) * n);
        for (int i = 0, at = 0; i < c; i++)
            for (int j = 0; j <= i; j++) tri[at++] = H[k][i * c + j];
        snprintf(name, sizeof name, "tri%d.xtx", k);
        cr_assert_eq(mpq_st_write_f32(w, name, MPQ_DT_F32, 1, &n, tri, &e), MPQ_OK);
        if (k == 2) { /* a NaN in the triangle, and a triangle one element short */
            tri[5] = NAN;
            cr_assert_eq(mpq_st_write_f32(w, "nan.xtx", MPQ_DT_F32, 1, &n, tri, &e), MPQ_OK);
            const uint64_t short_n = n - 1;
            cr_assert_eq(mpq_st_write_f32(w, "short.xtx", MPQ_DT_F32, 1, &short_n, tri, &e), MPQ_OK);
        }
        free(tri);
    }
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK);
    cr_assert_eq(mpq_st_open(p, &f, &e), MPQ_OK);
    for (int k = 0; k < NS; k++) {
        const int c = sizes[k];
        float *got = malloc(sizeof(float) * c * c);
        char sq[64], tri[64], trix[64];
        snprintf(sq, sizeof sq, "sq%d", k), snprintf(tri, sizeof tri, "tri%d", k);
        snprintf(trix, sizeof trix, "tri%d.xtx", k);
        /* what it reads, found beforehand (and prefetched: a hint that changes nothing read) */
        const mpq_st_tensor *ft = mpq_calib_find_xtx(f, "no-such-map", tri);
        cr_assert(ft && ft == mpq_st_find(f, trix) && mpq_calib_find_xtx(f, sq, NULL) == mpq_st_find(f, sq));
        mpq_st_prefetch(f, ft);
        memset(got, 0, sizeof(float) * c * c);
        cr_assert_eq(mpq_calib_read_xtx(f, p, sq, NULL, c, got, &e), MPQ_OK, "%s", e.msg);
        cr_assert(!memcmp(got, H[k], sizeof(float) * c * c), "square %d", c);
        memset(got, 0, sizeof(float) * c * c);
        cr_assert_eq(mpq_calib_read_xtx(f, p, tri, NULL, c, got, &e), MPQ_OK, "%s", e.msg);
        cr_assert(!memcmp(got, H[k], sizeof(float) * c * c), "triangle %d", c);
        memset(got, 0, sizeof(float) * c * c);
        cr_assert_eq(mpq_calib_read_xtx(f, p, "no-such-map", tri, c, got, &e), MPQ_OK, "%s", e.msg);
        cr_assert(!memcmp(got, H[k], sizeof(float) * c * c), "through the owner, %d", c);
        free(got), free(H[k]);
    }
    cr_assert_null(mpq_calib_find_xtx(f, "no-such-map", "nor-this"));
    cr_assert_null(mpq_calib_find_xtx(f, "no-such-map", NULL));
    cr_assert_null(mpq_calib_find_xtx(NULL, "sq0", NULL));
    mpq_st_prefetch(f, NULL), mpq_st_prefetch(NULL, mpq_st_find(f, "sq0")); /* ignored */
    float *got = malloc(sizeof(float) * 33 * 33);
    cr_assert_eq(mpq_calib_read_xtx(f, p, "no-such-map", "nor-this", 7, got, &e), MPQ_ERR_FORMAT);
    cr_assert(strstr(e.msg, p) && strstr(e.msg, "no-such-map") && strstr(e.msg, "nor-this"), "%s", e.msg);
    cr_assert_eq(mpq_calib_read_xtx(f, p, "tri2", NULL, 8, got, &e), MPQ_ERR_SIZE);
    cr_assert(strstr(e.msg, p) && strstr(e.msg, "tri2.xtx"), "%s", e.msg);
    cr_assert_eq(mpq_calib_read_xtx(f, p, "sq3", NULL, 32, got, &e), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_calib_read_xtx(f, p, "short", NULL, 7, got, &e), MPQ_ERR_SIZE);
    cr_assert_eq(mpq_calib_read_xtx(f, p, "nan", NULL, 7, got, &e), MPQ_ERR_NONFINITE);
    cr_assert(strstr(e.msg, "nan.xtx") && strstr(e.msg, "not finite"), "%s", e.msg);
    cr_assert_eq(mpq_calib_read_xtx(f, p, "tri2", NULL, 0, got, &e), MPQ_ERR_ARG);
    free(got);
    mpq_st_close(f);
    unlink(p);
    mpq_calib_stats_free(&a);
    mpq_llm_free(m);
    tl_free(&t);
}

/* The statistics file's numbers read back bit for bit: the loss, at values
   whose 15-digit decimals read back as a neighbouring double (cJSON's own
   printing keeps those, 5.9071321473013505 one of them, a loss measured on
   a machine without AVX-512), at exact short ones and at random doubles. */
Test(calib, the_files_loss_reads_back_bit_for_bit)
{
    tl_model t;
    shape(&t, 1, 0, 1);
    tl_make(&t, 61);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {23};
    int32_t text[NTOK];
    random_tokens(&r, &t, text, NTOK);
    mpq_calib_stats a = calibrate(m, text, MPQ_CALIB_ACTS);
    char p[600];
    snprintf(p, sizeof p, "%s/loss.safetensors", tmpdir);
    double losses[40] = {5.9071321473013505, 0.1, 1.0 / 3.0, 7.0, 1e-300, 12345.678900000001};
    int short15 = 0; /* of the random ones, how many 15 digits do not give back */
    char d15[32];
    for (int k = 6; k < 40; k++) {
        losses[k] = 0.5 + 11.5 * synth_unif(&r);
        snprintf(d15, sizeof d15, "%.15g", losses[k]);
        short15 += strtod(d15, NULL) != losses[k];
    }
    snprintf(d15, sizeof d15, "%.15g", losses[0]);
    cr_assert_neq(strtod(d15, NULL), losses[0], "the first loss must need more than 15 digits");
    cr_assert_gt(short15, 0, "some of the random losses must need more than 15 digits");
    for (int k = 0; k < 40; k++) {
        a.loss = losses[k];
        mpq_io_err e;
        cr_assert_eq(mpq_calib_write(m, &a, NULL, p, &e), MPQ_OK, "%s", e.msg);
        mpq_calib_stats b;
        cr_assert_eq(mpq_calib_read(m, p, &b, &e), MPQ_OK, "%s", e.msg);
        cr_assert(!memcmp(&b.loss, &losses[k], sizeof(double)), "loss %.17g read back as %.17g", losses[k], b.loss);
        cr_assert(same_stats(&a, &b, m));
        mpq_calib_stats_free(&b);
    }
    unlink(p);
    mpq_calib_stats_free(&a);
    mpq_llm_free(m);
    tl_free(&t);
}

Test(calib, deterministic_for_any_thread_count_and_the_file_round_trips)
{
    tl_model t;
    shape(&t, 0, 1, 0);
    tl_make(&t, 55);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {13};
    int32_t text[NTOK];
    random_tokens(&r, &t, text, NTOK);
#ifdef _OPENMP
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    mpq_calib_stats a = calibrate(m, text, MPQ_CALIB_ALL);
#ifdef _OPENMP
    omp_set_num_threads(3);
#endif
    mpq_calib_stats b = calibrate(m, text, MPQ_CALIB_ALL);
#ifdef _OPENMP
    omp_set_num_threads(nt);
#endif
    cr_assert(same_stats(&a, &b, m), "statistics differ between 1 and 3 threads");
    char p[600];
    snprintf(p, sizeof p, "%s/stats.safetensors", tmpdir);
    mpq_io_err e;
    cr_assert_eq(mpq_calib_write(m, &a, "{\"model\": \"tiny\"}", p, &e), MPQ_OK, "%s", e.msg);
    mpq_calib_stats c;
    cr_assert_eq(mpq_calib_read(m, p, &c, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(c.what, MPQ_CALIB_ALL);
    cr_assert_eq(c.awq_tokens, a.awq_tokens);
    cr_assert(fabs(c.loss - a.loss) < 1e-12);
    cr_assert(same_stats(&a, &c, m), "statistics read back differ");
    corpus_save(p);
    mpq_st_file *f = NULL;
    cr_assert_eq(mpq_st_open(p, &f, &e), MPQ_OK);
    cr_assert_not_null(mpq_st_find(f, "model.layers.1.mlp.down_proj.weight.fisher"));
    cr_assert_not_null(mpq_st_find(f, "model.layers.0.self_attn.q_proj.weight.layer_sensitivity"));
    cr_assert_not_null(strstr(mpq_st_meta(f, "mpq_calib"), "\"model\":\"tiny\""));
    mpq_st_close(f);
    unlink(p);
    mpq_calib_stats_free(&a), mpq_calib_stats_free(&b), mpq_calib_stats_free(&c);
    mpq_llm_free(m);
    tl_free(&t);
}

/* A statistics file with one thing wrong: the reader names the file, the
   tensor and the rule, and returns nothing. */
static const char *bad_meta = ""; /* added to the metadata object of bad_file's files */

static void bad_file(const mpq_llm *m, const mpq_calib_stats *s, const char *p, const char *tensor, int what,
                     mpq_status want, const char *msg)
{
    mpq_io_err e;
    mpq_st_writer *w = NULL;
    cr_assert_eq(mpq_st_writer_open(p, &w, &e), MPQ_OK);
    char meta[512];
    snprintf(meta, sizeof meta,
             "{\"windows\":%d,\"length\":%d,\"awq_tokens\":%d,\"mixllm_bits\":4,\"pqi_bits\":3,"
             "\"pqi_steps\":3,\"pqi_windows\":2,\"sens_tokens\":8,\"loss\":1%s}",
             s->windows, s->length, s->awq_tokens, bad_meta);
    cr_assert_eq(mpq_st_write_meta(w, "mpq_calib", meta, &e), MPQ_OK);
    char name[256];
    for (int i = 0; i < s->nlin; i++) {
        const mpq_linear *L = &m->layer[i / 7].lin[i % 7];
        char base[200];
        mpq_llm_linear_name(0, i / 7, i % 7, 0, base, sizeof base);
        snprintf(name, sizeof name, "%s.xtx_diag", base);
        float *v = (float *)malloc(sizeof(float) * (size_t)L->cols);
        memcpy(v, s->xtx_diag[i], sizeof(float) * (size_t)L->cols);
        uint64_t shp[1] = {(uint64_t)L->cols};
        if (!strcmp(name, tensor)) {
            if (what == 0) shp[0] -= 1;
            if (what == 1) v[3] = NAN;
            if (what == 2) v[1] = -1.0f;
        }
        if (!(what == 3 && !strcmp(name, tensor)))
            cr_assert_eq(mpq_st_write_f32(w, name, MPQ_DT_F32, 1, shp, v, &e), MPQ_OK, "%s", e.msg);
        free(v);
    }
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK);
    mpq_calib_stats r;
    memset(&r, 0x5a, sizeof r);
    mpq_calib_stats before = r;
    cr_assert_eq(mpq_calib_read(m, p, &r, &e), want, "%s", e.msg);
    cr_assert(!memcmp(&r, &before, sizeof r), "the output changed on error");
    cr_assert_not_null(strstr(e.msg, p), "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, tensor), "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, msg), "%s", e.msg);
    corpus_save(p);
    unlink(p);
}

Test(calib, bad_inputs)
{
    tl_model t;
    shape(&t, 0, 1, 0);
    tl_make(&t, 66);
    mpq_llm *m = load_hf(&t);
    synth_rng r = {17};
    int32_t text[NTOK];
    random_tokens(&r, &t, text, NTOK);
    mpq_calib_opts o;
    memset(&o, 0, sizeof o);
    o.length = 64; /* longer than the text */
    mpq_calib_stats s;
    memset(&s, 0, sizeof s);
    mpq_io_err e;
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &s, &e), MPQ_ERR_SIZE);
    cr_assert_not_null(strstr(e.msg, "shorter than one window"), "%s", e.msg);
    cr_assert_null(s.fisher);
    o.length = LEN;
    text[5] = t.vocab_rows; /* outside the vocabulary */
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &s, &e), MPQ_ERR_ARG);
    text[5] = 1;
    o.what = 0x400;
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &s, &e), MPQ_ERR_ARG);
    /* a packed map: no backward pass */
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    mpq_linear *L = &m->layer[1].lin[MPQ_LIN_UP];
    d.rows = L->rows, d.cols = L->cols, d.uniform_bits = 4;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, L->W, &A), MPQ_OK);
    cr_assert_eq(mpq_linear_set_packed(m, L, &A), MPQ_OK);
    free(L->W);
    L->W = NULL;
    o.what = 0;
    cr_assert_eq(mpq_llm_calibrate(m, text, NTOK, &o, &s, &e), MPQ_ERR_UNSUPPORTED);
    cr_assert_not_null(strstr(e.msg, "float weights"), "%s", e.msg);
    mpq_llm_free(m);
    /* files */
    m = load_hf(&t);
    s = calibrate(m, text, MPQ_CALIB_ACTS);
    char p[600];
    snprintf(p, sizeof p, "%s/bad.safetensors", tmpdir);
    const char *name = "model.layers.1.self_attn.o_proj.weight.xtx_diag";
    bad_file(m, &s, p, name, 0, MPQ_ERR_SIZE, "shape");
    bad_file(m, &s, p, name, 1, MPQ_ERR_NONFINITE, "not finite");
    bad_file(m, &s, p, name, 2, MPQ_ERR_RANGE, "negative");
    bad_file(m, &s, p, name, 3, MPQ_ERR_FORMAT, "not found");
    static const char *const seeds[] = {",\"rotate_seed\":\"12x\"", ",\"rotate_seed\":7",
                                        ",\"rotate_seed\":\"18446744073709551616\"", ",\"rotate_seed\":\"\""};
    for (int k = 0; k < 4; k++) /* a rotation seed that is not one: past 2^64 - 1, a number, empty */
        bad_meta = seeds[k], bad_file(m, &s, p, "rotate_seed", -1, MPQ_ERR_FORMAT, "not a decimal seed");
    bad_meta = "";
    mpq_calib_stats_free(&s);
    mpq_llm_free(m);
    tl_free(&t);
}

/* A measurements file by hand: the maps' tensors (count values each, the
   map `skip` left out) and the metadata `meta` (NULL: none). */
static void write_measure_file(const char *path, const char *const *names, int n, int count, const float *v, int skip,
                               const char *meta)
{
    mpq_st_writer *w;
    mpq_io_err e;
    cr_assert_eq(mpq_st_writer_open(path, &w, &e), MPQ_OK, "%s", e.msg);
    for (int i = 0; i < n; i++) {
        if (i == skip) continue;
        char name[128];
        snprintf(name, sizeof name, "%s.kld", names[i]);
        const uint64_t shape[1] = {(uint64_t)count};
        cr_assert_eq(mpq_st_write_f32(w, name, MPQ_DT_F32, 1, shape, v + i * count, &e), MPQ_OK, "%s", e.msg);
    }
    if (meta) cr_assert_eq(mpq_st_write_meta(w, "mpq_measure", meta, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);
}

/* The measurements' file: what mpq_measure_write writes mpq_measure_read
   gives back (the values as float32), and every malformed file is an
   error naming what is wrong, with nothing written. */
Test(calib, measurement_file_round_trips_and_refuses_what_it_cannot_take)
{
    const char *names[4] = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight", "b",
                            "c.weight"};
    mpq_measure_info in;
    memset(&in, 0, sizeof in);
    in.bits[0] = 2, in.bits[1] = 5, in.bits[2] = 3, in.nbits = 3;
    in.windows = 2, in.length = 256, in.text_hash = 0xfedcba9876543210ull, in.tokens = 123456;
    snprintf(in.model, sizeof in.model, "SmolLM2-135M-Instruct.Q4_1.gguf");
    in.layers = 30, in.dim = 576, in.vocab = 49152, in.act_order = 1, in.group = 64, in.symmetric = 1;
    in.rotate = 1, in.rotate_seed = 18446744073709551557ull, in.seconds = 12.5;
    snprintf(in.quantizer, sizeof in.quantizer, "awq+gptq");
    synth_rng r = {4242};
    double kld[12], got[12];
    for (int k = 0; k < 12; k++) kld[k] = 0.3 * synth_unif(&r) * pow(4.0, -(k % 3));
    kld[4] = 0;
    char path[600], bad[600];
    snprintf(path, sizeof path, "%s/m.safetensors", tmpdir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", tmpdir);
    mpq_io_err e;
    cr_assert_eq(mpq_measure_write(path, &in, names, 4, kld, &e), MPQ_OK, "%s", e.msg);
    mpq_st_file *f;
    cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK, "%s", e.msg);
    mpq_measure_info out;
    cr_assert_eq(mpq_measure_read(f, path, names, 4, &out, got, &e), MPQ_OK, "%s", e.msg);
    for (int k = 0; k < 12; k++) cr_assert_eq(got[k], (double)(float)kld[k], "value %d", k);
    cr_assert(out.nbits == 3 && out.bits[0] == 2 && out.bits[1] == 5 && out.bits[2] == 3);
    cr_assert(out.windows == 2 && out.length == 256 && out.text_hash == in.text_hash && out.tokens == 123456);
    cr_assert(!strcmp(out.model, in.model) && !strcmp(out.quantizer, "awq+gptq"));
    cr_assert(out.layers == 30 && out.dim == 576 && out.vocab == 49152 && out.act_order == 1 && out.group == 64);
    cr_assert(out.symmetric == 1 && out.rotate == 1 && out.rotate_seed == in.rotate_seed && out.seconds == 12.5);
    mpq_measure_info only;
    cr_assert_eq(mpq_measure_read(f, path, NULL, 0, &only, NULL, &e), MPQ_OK, "the description alone");
    cr_assert_eq(only.text_hash, in.text_hash);
    char meta[1024];
    snprintf(meta, sizeof meta, "%s", mpq_st_meta(f, "mpq_measure"));
    mpq_st_close(f);
    /* writing refuses what it cannot record, and leaves no file */
    double nanv[12];
    memcpy(nanv, kld, sizeof nanv);
    nanv[7] = NAN;
    cr_assert_eq(mpq_measure_write(bad, &in, names, 4, nanv, &e), MPQ_ERR_NONFINITE);
    nanv[7] = -0.1;
    cr_assert_eq(mpq_measure_write(bad, &in, names, 4, nanv, &e), MPQ_ERR_NONFINITE);
    mpq_measure_info twice = in;
    twice.bits[2] = 2;
    cr_assert_eq(mpq_measure_write(bad, &twice, names, 4, kld, &e), MPQ_ERR_ARG);
    cr_assert_eq(access(bad, F_OK), -1, "no file");
    /* malformed files: the metadata, each field, the tensors */
    float v[12];
    for (int k = 0; k < 12; k++) v[k] = (float)kld[k];
    static const struct {
        const char *from, *to, *says;
    } edits[] = {
        {"\"widths\":[2,5,3]", "\"widths\":[2,5,5]", "widths"},
        {"\"widths\":[2,5,3]", "\"widths\":[]", "widths"},
        {"\"widths\":[2,5,3]", "\"widths\":[2,9,3]", "widths"},
        {"\"widths\":[2,5,3]", "\"widths\":\"2,5,3\"", "widths"},
        {"\"layers\":30", "\"layers\":-30", "layers"},
        {"\"layers\":30", "\"layer\":30", "layers"},
        {"\"group\":64", "\"group\":64.5", "group"},
        {"\"windows\":2", "\"windows\":\"2\"", "windows"},
        {"\"quantizer\":\"awq+gptq\"", "\"quantizer\":\"hqq\"", "quantizer"},
        {"\"text_hash\":\"fedcba9876543210\"", "\"text_hash\":\"xyz\"", "text_hash"},
        {"\"text_hash\":\"fedcba9876543210\"", "\"text_hash\":18364758544493064720", "text_hash"},
        {"\"rotate_seed\":\"18446744073709551557\"", "\"rotate_seed\":\"-1\"", "rotate_seed"},
        {"{", "[", "mpq_measure"},
    };
    for (size_t k = 0; k < sizeof edits / sizeof edits[0]; k++) {
        const char *at = strstr(meta, edits[k].from);
        cr_assert_not_null(at, "%s in %s", edits[k].from, meta);
        char m2[1100];
        snprintf(m2, sizeof m2, "%.*s%s%s", (int)(at - meta), meta, edits[k].to, at + strlen(edits[k].from));
        write_measure_file(bad, names, 4, 3, v, -1, m2);
        char stem[32]; /* hostile seeds for the fuzzer too */
        snprintf(stem, sizeof stem, "measure-bad%zu", k);
        corpus_save_as(bad, "MKLD", stem);
        cr_assert_eq(mpq_st_open(bad, &f, &e), MPQ_OK);
        for (int q = 0; q < 12; q++) got[q] = -7;
        cr_assert_eq(mpq_measure_read(f, bad, names, 4, &out, got, &e), MPQ_ERR_FORMAT, "%s", m2);
        cr_assert(strstr(e.msg, edits[k].says) && strstr(e.msg, bad), "%s: %s", m2, e.msg);
        for (int q = 0; q < 12; q++) cr_assert_eq(got[q], -7, "nothing written");
        mpq_st_close(f);
    }
    write_measure_file(bad, names, 4, 3, v, -1, NULL); /* no metadata */
    cr_assert_eq(mpq_st_open(bad, &f, &e), MPQ_OK);
    cr_assert_eq(mpq_measure_read(f, bad, names, 4, &out, got, &e), MPQ_ERR_FORMAT);
    cr_assert(strstr(e.msg, "mpq_measure"), "%s", e.msg);
    mpq_st_close(f);
    write_measure_file(bad, names, 4, 3, v, 2, meta); /* a map's measurements missing */
    cr_assert_eq(mpq_st_open(bad, &f, &e), MPQ_OK);
    cr_assert_eq(mpq_measure_read(f, bad, names, 4, &out, got, &e), MPQ_ERR_FORMAT);
    cr_assert(strstr(e.msg, "'b.kld'") && strstr(e.msg, "not found"), "%s", e.msg);
    mpq_st_close(f);
    write_measure_file(bad, names, 3, 4, v, -1, meta); /* four values a map for three widths */
    cr_assert_eq(mpq_st_open(bad, &f, &e), MPQ_OK);
    cr_assert_eq(mpq_measure_read(f, bad, names, 3, &out, got, &e), MPQ_ERR_FORMAT);
    cr_assert(strstr(e.msg, "one per width"), "%s", e.msg);
    mpq_st_close(f);
    for (int q = 0; q < 2; q++) { /* a value that is not a KLD */
        v[10] = q ? NAN : -1e-3f;
        write_measure_file(bad, names, 4, 3, v, -1, meta);
        cr_assert_eq(mpq_st_open(bad, &f, &e), MPQ_OK);
        for (int k = 0; k < 12; k++) got[k] = -7;
        cr_assert_eq(mpq_measure_read(f, bad, names, 4, &out, got, &e), MPQ_ERR_FORMAT);
        cr_assert(strstr(e.msg, "'c.weight.kld'") && strstr(e.msg, "finite"), "%s", e.msg);
        for (int k = 0; k < 12; k++) cr_assert_eq(got[k], -7, "nothing written");
        mpq_st_close(f);
    }
    cr_assert_eq(mpq_measure_read(NULL, bad, names, 4, &out, got, &e), MPQ_ERR_ARG);
    /* a seed for the fuzzer: the maps of its fixed two-layer model */
    char lin[14][96];
    const char *lnames[14];
    double lk[14 * 3];
    for (int i = 0; i < 14; i++) {
        mpq_llm_linear_name(0, i / 7, i % 7, 0, lin[i], sizeof lin[i]);
        lnames[i] = lin[i];
        for (int k = 0; k < 3; k++) lk[i * 3 + k] = 0.01 * (i + 1) * pow(4.0, -k);
    }
    cr_assert_eq(mpq_measure_write(bad, &in, lnames, 14, lk, &e), MPQ_OK, "%s", e.msg);
    corpus_save_as(bad, "MKLD", "measure");
}
