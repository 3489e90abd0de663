/* tools/quantize.c - mpq quantize: a model (GGUF, Hugging Face directory,
   safetensors) or any safetensors file through a recipe of mpq.h (section
   13), read from its files and written tensor by tensor. The options and
   the recipe they make are in quantize_args.h, which the main job shares. */
#define _XOPEN_SOURCE 700
#include "mpq.h"
#include "mpq_io.h"
#include "model_cmd.h"
#include "mpq_model.h"
#include "quantize_args.h"
#include "table.h"
#include "tool.h"

#include <cjson/cJSON.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---------------------------------------------------------------------------
   statistics from files
   ------------------------------------------------------------------------ */

static int is_float_dtype(mpq_dtype t)
{
    return t == MPQ_DT_F32 || t == MPQ_DT_F16 || t == MPQ_DT_BF16 || t == MPQ_DT_F64;
}

/* The tensor of a statistic for weight `name`: `name` itself, else
   `name.suffix` as mpq calibrate writes it; NULL when neither is there
   (*used: the name looked for last). */
static const mpq_st_tensor *find_stat(mpq_st_file *f, const char *name, const char *suffix, char *used, size_t cap)
{
    snprintf(used, cap, "%s", name);
    const mpq_st_tensor *t = mpq_st_find(f, name);
    if (t || !suffix) return t;
    snprintf(used, cap, "%s.%s", name, suffix);
    return mpq_st_find(f, used);
}

/* Reads a float tensor, the statistic `suffix` of weight `name` (see
   find_stat), with exactly the given shape (ndim 1: a vector of d0;
   scalars: d0 = 1 accepts [] and [1]); every value finite, and >= 0 when
   nonneg. */
static int read_stat(mpq_st_file *f, const char *name, const char *suffix, int nonneg, uint64_t d0, uint64_t d1,
                     int ndim, float **out)
{
    mpq_io_err e;
    char full[1024];
    const mpq_st_tensor *t = find_stat(f, name, suffix, full, sizeof full);
    if (!t) {
        if (suffix)
            return fail(EXIT_INPUT, "%s: tensor '%s': not found (nor '%s.%s')", mpq_st_path(f), name, name, suffix);
        return fail(EXIT_INPUT, "%s: tensor '%s': not found", mpq_st_path(f), name);
    }
    name = full;
    if (!is_float_dtype(t->dtype))
        return fail(EXIT_INPUT, "%s: tensor '%s': dtype %s, need a float type", mpq_st_path(f), name,
                    mpq_dtype_name(t->dtype));
    int ok = ndim == 2 ? (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1)
                       : (t->numel == d0 && (t->ndim == 1 || (d0 == 1 && t->ndim == 0)));
    if (!ok) {
        if (ndim == 2)
            return fail(EXIT_INPUT, "%s: tensor '%s': shape does not match the weight (need %llu x %llu)",
                        mpq_st_path(f), name, (unsigned long long)d0, (unsigned long long)d1);
        return fail(EXIT_INPUT, "%s: tensor '%s': shape does not match the weight (need [%llu])", mpq_st_path(f), name,
                    (unsigned long long)d0);
    }
    float *v = (float *)malloc(sizeof(float) * (size_t)t->numel + 1);
    if (!v) return fail(EXIT_INPUT, "out of memory");
    if (mpq_st_read_f32(f, t, v, (size_t)t->numel, &e) != MPQ_OK) {
        free(v);
        return fail(EXIT_INPUT, "%s", e.msg);
    }
    for (uint64_t i = 0; i < t->numel; i++) {
        if (!(v[i] - v[i] == 0.0f) || (nonneg && v[i] < 0)) {
            const int nf = !(v[i] - v[i] == 0.0f);
            fail(EXIT_INPUT, "%s: tensor '%s': element %llu is %s (%g); %s", mpq_st_path(f), name,
                 (unsigned long long)i, nf ? "not finite" : "negative", v[i],
                 nf ? "statistics must be finite" : "this statistic cannot be negative");
            free(v);
            return EXIT_INPUT;
        }
    }
    *out = v;
    return 0;
}

/* Calibration activations of a weight: tokens x cols. */
static int read_calib(mpq_st_file *f, const char *name, int cols, float **X, int *tokens)
{
    char full[1024];
    const mpq_st_tensor *t = find_stat(f, name, "awq", full, sizeof full);
    if (!t)
        return fail(EXIT_INPUT, "%s: tensor '%s': not found (activations for it; nor '%s.awq')", mpq_st_path(f), name,
                    name);
    if (t->ndim != 2 || t->shape[1] != (uint64_t)cols || t->shape[0] < 1 || t->shape[0] > INT_MAX)
        return fail(EXIT_INPUT, "%s: tensor '%s': activations must be tokens x %d", mpq_st_path(f), full, cols);
    *tokens = (int)t->shape[0];
    return read_stat(f, name, "awq", 0, t->shape[0], t->shape[1], 2, X);
}

/* ---------------------------------------------------------------------------
   the run: which tensors, their data on demand, the output as it comes
   ------------------------------------------------------------------------ */

typedef struct job {
    int index; /* in the input */
    const char *name;
    int rows, cols;
    int layer, lin; /* a model's linear map (role 1), else -1 */
    int embed;      /* an embedding or head: round-to-nearest at --embed-bits, not the recipe */
} job;

typedef struct qrun {
    const qargs *q;
    mpq_recipe r;
    mpq_source *in;
    mpq_st_file *S, *C, *H; /* salience, activations, X^T X (opened when the recipe needs them) */
    job *jobs;              /* stb_ds array: every tensor quantized, input order */
    int *maps;              /* the recipe's maps: indices into jobs, in the recipe's order */
    uint8_t *written;       /* per input tensor */
    mpq_st_writer *w;
    const mpq_llm_config *cfg; /* the model's, when the input is a model */
    row *rows;                 /* stb_ds array: the summary, output order */
    int rc;                    /* the exit code of a failure a callback reported */
    progress p;
    const char *step;
} qrun;

static const job *job_at_input(const qrun *R, int index)
{
    for (ptrdiff_t i = 0; i < arrlen(R->jobs); i++)
        if (R->jobs[i].index == index) return &R->jobs[i];
    return NULL;
}

static void fetch_free(mpq_recipe_map *m)
{
    free((void *)m->W), free((void *)m->X), free((void *)m->H), free((void *)m->pqi);
    free((void *)m->fisher), free((void *)m->channel), free((void *)m->col_sens);
    m->W = m->X = m->H = m->pqi = m->fisher = m->channel = m->col_sens = NULL;
}

/* MXSens's column sensitivity: diag(X^T X) from the salience file (and
   the layer sensitivity when it has one), or from the activations. */
static int read_mxsens(qrun *R, const job *J, mpq_recipe_map *m)
{
    float *v = NULL;
    m->layer_sens = 1.0f;
    if (R->S) {
        int rc = read_stat(R->S, J->name, "xtx_diag", 1, (uint64_t)J->cols, 0, 1, &v);
        m->col_sens = v;
        char key[1024];
        snprintf(key, sizeof key, "%s.layer_sensitivity", J->name);
        float *ls = NULL;
        if (!rc && mpq_st_find(R->S, key) && !(rc = read_stat(R->S, key, NULL, 1, 1, 0, 1, &ls))) {
            if (!(ls[0] >= 0.0f && ls[0] <= 1.0f))
                rc = fail(EXIT_INPUT, "%s: tensor '%s': layer sensitivity %g is not in [0, 1]", mpq_st_path(R->S), key,
                          ls[0]);
            m->layer_sens = ls[0];
        }
        free(ls);
        return rc;
    }
    float *X = NULL;
    int tokens = 0;
    int rc = read_calib(R->C, J->name, J->cols, &X, &tokens);
    if (!rc && R->r.rotate) { /* the rows are in original coordinates: diag(X^T X) of the inputs V x */
        mpq_rotation V;
        mpq_status st = mpq_rotation_init(&V, J->cols, R->r.rotate_seed);
        if (st == MPQ_OK) st = mpq_rotation_apply(&V, X, tokens, 0);
        mpq_rotation_free(&V);
        if (st != MPQ_OK) rc = fail(EXIT_INPUT, "%s: tensor '%s': %s", mpq_st_path(R->C), J->name, mpq_status_str(st));
    }
    mpq_stat h;
    if (!rc && mpq_stat_init(&h, (size_t)J->cols) == MPQ_OK) {
        mpq_status st = mpq_hessian_diag_add(&h, X, tokens, J->cols);
        v = (float *)malloc(sizeof(float) * (size_t)J->cols);
        if (st == MPQ_OK) st = v ? mpq_stat_sum(&h, v) : MPQ_ERR_NOMEM;
        if (st != MPQ_OK) rc = fail(EXIT_INPUT, "%s: tensor '%s': %s", mpq_st_path(R->C), J->name, mpq_status_str(st));
        mpq_stat_free(&h);
    }
    m->col_sens = v;
    free(X);
    return rc;
}

/* The map that keeps J's X^T X where mpq calibrate keeps one per input:
   the first map of J's layer that reads the same input (q for k and v,
   gate for up), by its name among the jobs, else in J's naming scheme
   (into buf); NULL for the others. */
static const char *xtx_owner(const qrun *R, const job *J, char *buf, size_t cap)
{
    char mine[448];
    const int own = J->lin == MPQ_LIN_K || J->lin == MPQ_LIN_V ? MPQ_LIN_Q : J->lin == MPQ_LIN_UP ? MPQ_LIN_GATE : -1;
    for (ptrdiff_t k = 0; own >= 0 && k < arrlen(R->jobs); k++)
        if (R->jobs[k].layer == J->layer && R->jobs[k].lin == own) return R->jobs[k].name;
    for (int g = 0; own >= 0 && g < 2; g++) /* not quantized itself: its name in J's scheme */
        if (!strcmp(mpq_llm_linear_name(g, J->layer, J->lin, 0, mine, sizeof mine), J->name))
            return mpq_llm_linear_name(g, J->layer, own, 0, buf, cap);
    return NULL;
}

/* X^T X of map J: its own tensor, else its input owner's (xtx_owner). */
static int read_xtx(const qrun *R, const job *J, float **out)
{
    char named[448];
    const char *owner = xtx_owner(R, J, named, sizeof named);
    float *H = (float *)malloc(sizeof(float) * (size_t)J->cols * (size_t)J->cols);
    if (!H) return fail(EXIT_INPUT, "%s: tensor '%s': out of memory", mpq_st_path(R->H), J->name);
    mpq_io_err e;
    if (mpq_calib_read_xtx(R->H, mpq_st_path(R->H), J->name, owner, J->cols, H, &e) != MPQ_OK) {
        free(H);
        return fail(EXIT_INPUT, "%s", e.msg);
    }
    *out = H;
    return 0;
}

/* Starts the disk on what fetch(i, need) will read (the weights, X^T X and
   the statistics named by need), so that it arrives while the map before
   is quantized. */
static void prefetch(qrun *R, int i, unsigned need)
{
    if (i >= (int)arrlen(R->maps)) return;
    const job *J = &R->jobs[R->maps[i]];
    char used[1024];
    if (need & MPQ_RECIPE_WEIGHTS) mpq_source_prefetch(R->in, mpq_source_at(R->in, J->index));
    if ((need & MPQ_RECIPE_HESSIAN) && R->H) {
        char named[448];
        mpq_st_prefetch(R->H, mpq_calib_find_xtx(R->H, J->name, xtx_owner(R, J, named, sizeof named)));
    }
    if ((need & MPQ_RECIPE_ACTS) && R->C) mpq_st_prefetch(R->C, find_stat(R->C, J->name, "awq", used, sizeof used));
    if ((need & MPQ_RECIPE_PQI) && R->S) mpq_st_prefetch(R->S, find_stat(R->S, J->name, "pqi", used, sizeof used));
    if ((need & MPQ_RECIPE_SALIENCE) && R->S && R->r.planner == MPQ_PLANNER_SFMP)
        mpq_st_prefetch(R->S, find_stat(R->S, J->name, "fisher", used, sizeof used));
}

static mpq_status fetch(void *user, int i, unsigned need, mpq_recipe_map *m)
{
    qrun *R = (qrun *)user;
    const job *J = &R->jobs[R->maps[i]];
    const uint64_t rows = (uint64_t)J->rows, cols = (uint64_t)J->cols;
    float *v = NULL;
    int rc = 0;
    mpq_io_err e;
    if (need & MPQ_RECIPE_WEIGHTS) {
        const mpq_source_tensor *t = mpq_source_at(R->in, J->index);
        m->W = v = (float *)malloc(sizeof(float) * (size_t)t->numel);
        if (!v)
            rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", mpq_source_path(R->in), J->name);
        else if (mpq_source_read_f32(R->in, t, v, (size_t)t->numel, &e) != MPQ_OK)
            rc = fail(EXIT_INPUT, "%s", e.msg);
    }
    float *X = NULL, *H = NULL, *pqi = NULL, *sal = NULL; /* each set only by a read that succeeds */
    if (!rc && (need & MPQ_RECIPE_ACTS)) rc = read_calib(R->C, J->name, J->cols, &X, &m->tokens);
    if (!rc && (need & MPQ_RECIPE_HESSIAN)) rc = read_xtx(R, J, &H);
    if (!rc && (need & MPQ_RECIPE_PQI)) rc = read_stat(R->S, J->name, "pqi", 1, rows, cols, 2, &pqi);
    if (!rc && (need & MPQ_RECIPE_SALIENCE)) {
        char used[1024];
        if (R->r.planner == MPQ_PLANNER_KLD) { /* the measurements are in place; Fisher where there is one */
            if (R->S && find_stat(R->S, J->name, "fisher", used, sizeof used))
                rc = read_stat(R->S, J->name, "fisher", 1, rows, cols, 2, &sal), m->fisher = sal;
        } else if (R->r.planner == MPQ_PLANNER_SFMP)
            rc = read_stat(R->S, J->name, "fisher", 1, rows, cols, 2, &sal), m->fisher = sal;
        else if (R->r.planner == MPQ_PLANNER_MIXLLM)
            rc = read_stat(R->S, J->name, "mixllm", 1, rows, 0, 1, &sal), m->channel = sal;
        else
            rc = read_mxsens(R, J, m);
    }
    m->X = X, m->H = H, m->pqi = pqi;
    if (!rc) prefetch(R, i + 1, need);
    if (rc) R->rc = rc;
    return rc ? MPQ_ERR_IO : MPQ_OK;
}

static void release(void *user, int i, mpq_recipe_map *m)
{
    (void)user, (void)i;
    fetch_free(m);
}

static void show(void *user, const char *step, int done, int total, const char *name)
{
    qrun *R = (qrun *)user;
    if (R->step != step) { /* a new step: its own bar and time left */
        progress_end(&R->p);
        progress_start(&R->p, "mpq", R->p.on, total);
        R->step = step;
    }
    char what[96];
    snprintf(what, sizeof what, "%s %s", step, name ? name : "");
    progress_show(&R->p, done, what);
}

/* Copies a tensor that is not quantized: safetensors bytes as they are,
   GGUF values as F32 (F16 and BF16 as themselves). */
static int copy_tensor(mpq_source *in, const mpq_source_tensor *t, mpq_st_writer *w, row *r)
{
    mpq_io_err e;
    const mpq_st_tensor *st = NULL;
    mpq_st_file *f = mpq_source_st(in, t, &st);
    if (f) return copy_st_tensor(f, st, w, r);
    int rc = 0;
    if (!t->is_float)
        return fail(EXIT_INPUT,
                    "%s: tensor '%s': type %s cannot be read (mpq converts F32, F16, BF16, F64, Q8_0, "
                    "Q4_0, Q4_1, Q5_0 and Q5_1)",
                    mpq_source_path(in), t->name, t->type);
    const mpq_dtype dt = !strcmp(t->type, "F16") ? MPQ_DT_F16 : !strcmp(t->type, "BF16") ? MPQ_DT_BF16 : MPQ_DT_F32;
    float *v = (float *)malloc(sizeof(float) * (size_t)t->numel + 1);
    if (!v)
        rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", mpq_source_path(in), t->name);
    else if (mpq_source_read_f32(in, t, v, (size_t)t->numel, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s", e.msg);
    else if (mpq_st_write_f32(w, t->name, dt, t->ndim, t->shape, v, &e) != MPQ_OK)
        rc = fail(EXIT_OUTPUT, "%s", e.msg);
    free(v);
    snprintf(r->kind, sizeof r->kind, "%s (from %s)", mpq_dtype_name(dt), t->type);
    r->bytes_out = t->numel * mpq_dtype_size(dt);
    return rc;
}

/* Writes input tensor k when it is not one of the recipe's maps: an
   embedding at --embed-bits, a packed matrix carried over, or a copy. */
static int write_other(qrun *R, int k)
{
    mpq_io_err e;
    const mpq_source_tensor *t = mpq_source_at(R->in, k);
    row r;
    memset(&r, 0, sizeof r);
    r.name = t->name, r.bpw = -1, r.bytes_in = t->bytes;
    shape_text(t->ndim, t->shape, r.shape, sizeof r.shape);
    const job *J = job_at_input(R, k);
    int rc = 0;
    if (J) { /* the embedding or head: round-to-nearest at --embed-bits */
        mpq_recipe rtn;
        memset(&rtn, 0, sizeof rtn);
        rtn.bits = R->q->embed_bits;
        mpq_recipe_map m;
        memset(&m, 0, sizeof m);
        m.rows = J->rows, m.cols = J->cols, m.name = J->name;
        float *W = (float *)malloc(sizeof(float) * (size_t)t->numel);
        m.W = W;
        mpq_packed A;
        memset(&A, 0, sizeof A);
        mpq_status st;
        if (!W)
            rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", mpq_source_path(R->in), t->name);
        else if (mpq_source_read_f32(R->in, t, W, (size_t)t->numel, &e) != MPQ_OK)
            rc = fail(EXIT_INPUT, "%s", e.msg);
        else if ((st = mpq_recipe_quantize(&rtn, 0, &m, NULL, &A)) != MPQ_OK)
            rc = quant_fail(t->name, st, "pack");
        else if (mpq_st_write_packed(R->w, t->name, &A, &e) != MPQ_OK)
            rc = fail(EXIT_OUTPUT, "%s", e.msg);
        if (!rc) row_packed(&r, &A, " (embedding)");
        mpq_packed_free(&A);
        free(W);
    } else if (t->packed) { /* already packed: validated, then carried with its metadata */
        mpq_packed A;
        if (mpq_source_read_packed(R->in, t, &A, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
        if (mpq_st_write_packed(R->w, t->name, &A, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
        row_packed(&r, &A, " (kept)");
        mpq_packed_free(&A);
    } else {
        rc = copy_tensor(R->in, t, R->w, &r);
    }
    if (!rc) arrput(R->rows, r);
    R->written[k] = 1;
    return rc;
}

/* Every tensor before input index `until` that is not a map of the recipe
   and not written yet. */
static int write_before(qrun *R, int until)
{
    int rc = 0;
    for (int k = 0; k < until && !rc; k++) {
        const job *J = job_at_input(R, k);
        if (!R->written[k] && (!J || J->embed)) rc = write_other(R, k);
    }
    return rc;
}

static mpq_status store(void *user, int i, mpq_packed *A)
{
    qrun *R = (qrun *)user;
    const job *J = &R->jobs[R->maps[i]];
    const mpq_source_tensor *t = mpq_source_at(R->in, J->index);
    mpq_io_err e;
    int rc = write_before(R, J->index);
    if (!rc && mpq_st_write_packed(R->w, J->name, A, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    if (!rc) {
        row r;
        memset(&r, 0, sizeof r);
        r.name = J->name, r.bytes_in = t->bytes;
        shape_text(t->ndim, t->shape, r.shape, sizeof r.shape);
        row_packed(&r, A, "");
        arrput(R->rows, r);
        R->written[J->index] = 1;
    }
    mpq_packed_free(A);
    if (rc) R->rc = rc;
    return rc ? MPQ_ERR_IO : MPQ_OK;
}

/* An embedding or output head by its name, in a file that is not a model. */
static int embedding_name(const char *name)
{
    static const char *const globs[] = {"*embed*", "*tok_emb*", "*wte*", "*lm_head*", "output.weight"};
    for (size_t i = 0; i < sizeof globs / sizeof globs[0]; i++)
        if (fnmatch(globs[i], name, 0) == 0) return 1;
    return 0;
}

static int glob_any(const cli_list *globs, const char *name)
{
    for (int i = 0; i < globs->n; i++)
        if (fnmatch(globs->v[i], name, 0) == 0) return 1;
    return 0;
}

/* Which tensors are quantized, and how; the recipe's maps of a model in
   the model's order (layer, then q k v o gate up down). */
static int select_jobs(qrun *R, int model)
{
    const qargs *q = R->q;
    int rc = 0;
    for (int i = 0; i < mpq_source_count(R->in) && !rc; i++) {
        const mpq_source_tensor *t = mpq_source_at(R->in, i);
        int layer = -1, lin = -1, role = 0;
        if (model) {
            role = mpq_llm_tensor_role(t->name, &layer, &lin);
            if (role == 0 || t->packed || (role == 2 && q->embed_bits == 0)) continue;
        } else if (t->ndim != 2 || !t->is_float || t->numel == 0) {
            continue;
        } else if (mpq_llm_tensor_role(t->name, &layer, &lin) == 2 || embedding_name(t->name)) {
            if (q->embed_bits == 0) continue;
            role = 2;
        }
        if ((q->include.n && !glob_any(&q->include, t->name)) || glob_any(&q->exclude, t->name)) continue;
        if (t->ndim != 2 || !t->is_float || t->numel == 0) {
            rc = fail(EXIT_INPUT, "%s: tensor '%s': a %s tensor with %d dimensions cannot be quantized",
                      mpq_source_path(R->in), t->name, t->type, t->ndim);
            break;
        }
        if (t->shape[0] > INT_MAX || t->shape[1] > INT_MAX) {
            rc = fail(EXIT_INPUT, "%s: tensor '%s': %llu x %llu is too large to quantize", mpq_source_path(R->in),
                      t->name, (unsigned long long)t->shape[0], (unsigned long long)t->shape[1]);
            break;
        }
        job J;
        memset(&J, 0, sizeof J);
        J.index = i, J.name = t->name, J.rows = (int)t->shape[0], J.cols = (int)t->shape[1];
        J.embed = role == 2, J.layer = model && role == 1 ? layer : -1, J.lin = model && role == 1 ? lin : -1;
        arrput(R->jobs, J);
    }
    return rc;
}

static const job *g_sort_jobs; /* for by_model_order */

static int by_model_order(const void *a, const void *b)
{
    const job *x = &g_sort_jobs[*(const int *)a], *y = &g_sort_jobs[*(const int *)b];
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    if (x->lin != y->lin) return x->lin < y->lin ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The description a model's output carries: config.json, tokenizer.json and
   tokenizer_config.json in __metadata__. The tokenizer is read and written
   anew (a GGUF vocabulary becomes a tokenizer.json); one mpq cannot read is
   copied as its text when there is one, else left out with a warning. */
static int model_meta(const qrun *R, const mpq_llm_config *cfg)
{
    mpq_io_err e;
    char *json = NULL;
    int rc = 0;
    if (mpq_llm_config_json(cfg, &json) != MPQ_OK) return fail(EXIT_OUTPUT, "out of memory");
    if (mpq_st_write_meta(R->w, "config.json", json, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    free(json);
    mpq_tokenizer *tok = NULL;
    if (!rc && mpq_tokenizer_read(R->in, &tok, &e) == MPQ_OK) {
        char *tj = NULL, *tc = NULL;
        if (mpq_tokenizer_to_json(tok, &tj) != MPQ_OK || mpq_tokenizer_config_json(tok, &tc) != MPQ_OK)
            rc = fail(EXIT_OUTPUT, "out of memory");
        if (!rc &&
            (mpq_st_write_meta(R->w, "tokenizer.json", tj, &e) != MPQ_OK ||
             mpq_st_write_meta(R->w, "tokenizer_config.json", tc, &e) != MPQ_OK))
            rc = fail(EXIT_OUTPUT, "%s", e.msg);
        free(tj);
        free(tc);
        mpq_tokenizer_free(tok);
    } else if (!rc) {
        const char *why = e.msg;
        static const char *const names[] = {"tokenizer.json", "tokenizer_config.json"};
        int copied = 0;
        for (int k = 0; k < 2 && !rc; k++) {
            char *t = NULL;
            if (mpq_source_text(R->in, names[k], &t, NULL, &e) == MPQ_OK && t) {
                if (mpq_st_write_meta(R->w, names[k], t, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
                copied += k == 0;
            }
            free(t);
        }
        if (!rc && !R->q->quiet)
            fprintf(stderr, "mpq: warning: %s; %s\n", why,
                    copied ? "its tokenizer.json is copied as it is" : "the output carries no tokenizer");
    }
    return rc;
}

/* The metadata of the output: a model's description, and the input's own
   metadata (a safetensors file) but what mpq writes anew. */
static int write_meta(qrun *R, int model, mpq_llm_config *cfg)
{
    mpq_io_err e;
    int rc = 0;
    if (model) {
        if (!cfg->vocab) /* from the embedding when the config does not say */
            for (int i = 0; i < mpq_source_count(R->in); i++)
                if (!strcmp(mpq_source_at(R->in, i)->name, "model.embed_tokens.weight"))
                    cfg->vocab = (int)mpq_source_at(R->in, i)->shape[0];
        rc = model_meta(R, cfg);
    }
    if (mpq_source_kind_of(R->in) == MPQ_SOURCE_SAFETENSORS) {
        mpq_st_file *f = mpq_source_st(R->in, mpq_source_at(R->in, 0), NULL);
        for (int i = 0; !rc && f && i < mpq_st_meta_count(f); i++) {
            const char *k, *v;
            mpq_st_meta_at(f, i, &k, &v);
            if (!strncmp(k, "mpq.", 4) ||
                (model &&
                 (!strcmp(k, "config.json") || !strcmp(k, "tokenizer.json") || !strcmp(k, "tokenizer_config.json"))))
                continue;
            if (mpq_st_write_meta(R->w, k, v, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
        }
    }
    return rc;
}

/* A file the salience or PQI is read from: gathered in the basis the
   recipe quantizes in (mpq_model.h, ROTATED STATISTICS). */
static int check_basis(const qargs *q, const mpq_st_file *f, const char *path)
{
    mpq_io_err e;
    int rot;
    uint64_t seed;
    if (mpq_calib_file_basis(f, path, &rot, &seed, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    if (rot == q->rotate.on && (!rot || seed == q->rotate.seed)) return 0;
    if (!rot)
        return fail(EXIT_INPUT,
                    "%s: statistics of the unrotated weights; quantize --rotate %llu needs them in the rotated "
                    "basis (mpq calibrate --rotate %llu)",
                    path, (unsigned long long)q->rotate.seed, (unsigned long long)q->rotate.seed);
    if (!q->rotate.on)
        return fail(EXIT_INPUT, "%s: statistics in the basis of rotation seed %llu; quantize needs --rotate %llu", path,
                    (unsigned long long)seed, (unsigned long long)seed);
    return fail(EXIT_INPUT, "%s: statistics in the basis of rotation seed %llu, not %llu (--rotate)", path,
                (unsigned long long)seed, (unsigned long long)q->rotate.seed);
}

/* The statistics files the recipe reads. */
static int open_stats(qrun *R)
{
    mpq_io_err e;
    const unsigned need = mpq_recipe_needs(&R->r);
    const qargs *q = R->q;
    const int need_s =
        /* MXSens and auto read the salience file when there is one (auto: its Fisher ranks block rows) */
        (need & (MPQ_RECIPE_PQI | MPQ_RECIPE_SALIENCE)) &&
        ((R->r.planner != MPQ_PLANNER_MXSENS && R->r.planner != MPQ_PLANNER_KLD) || q->salience);
    const int need_c = (need & MPQ_RECIPE_ACTS) || (R->r.planner == MPQ_PLANNER_MXSENS && !q->salience);
    int rc = 0;
    if (need_s && mpq_st_open(q->salience, &R->S, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    if (need_s && (rc = check_basis(q, R->S, q->salience)) != 0) return rc;
    if (need_c && mpq_st_open(q->calib, &R->C, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    /* --sequential gathers its own X^T X: a file is read only when given (check_files asks for it otherwise) */
    if ((need & MPQ_RECIPE_HESSIAN) && q->hessian && mpq_st_open(q->hessian, &R->H, &e) != MPQ_OK)
        return fail(EXIT_INPUT, "%s", e.msg);
    return 0;
}

/* --sequential: the model loaded in place, the plan made first (a
   planner's), then mpq_llm_quantize_sequential over every linear map with
   the AWQ rows fetched, each result stored as soon as it is made, as the
   recipe would store it. */
static int run_sequential(qrun *R, mpq_recipe_map *maps, int n, const char *in)
{
    const qargs *q = R->q;
    mpq_io_err e;
    mpq_llm *m = NULL;
    mpq_llm_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.in_place = 1; /* a layer's weights are converted to float32 as the run reaches it */
    if (mpq_llm_load_with(in, &lo, &m, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    int rc = 0;
    const int nlin = m->c.layers * MPQ_LIN_COUNT;
    for (int i = 0; !rc && i < n; i++) {
        const job *J = &R->jobs[R->maps[i]];
        if (n != nlin || J->layer != i / MPQ_LIN_COUNT || J->lin != i % MPQ_LIN_COUNT) rc = 1;
    }
    if (rc)
        rc = fail(EXIT_USAGE,
                  "quantize --sequential: %s: quantizes every linear map of the %d layers (%d selected, %d "
                  "maps)",
                  in, m->c.layers, n, nlin);
    char *text = NULL;
    size_t len = 0, nt = 0;
    int32_t *tok = NULL;
    if (!rc) rc = text_read(q->sequential, &text, &len);
    if (!rc && mpq_tokenize(m->tok, text, len, 0, &tok, &nt, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", q->sequential, e.msg);
    mpq_recipe r = R->r;
    mpq_plan plan;
    memset(&plan, 0, sizeof plan);
    mpq_recipe_io io = {fetch, release, NULL, show, R};
    if (!rc && r.planner != MPQ_PLANNER_NONE) {
        const mpq_status st = mpq_recipe_plan(&r, maps, n, &io, &plan);
        if (R->rc)
            rc = R->rc;
        else if (st != MPQ_OK)
            rc = fail(EXIT_QUANT, "planning over %d tensors failed: %s", n, mpq_status_str(st));
        r.planner = MPQ_PLANNER_NONE, r.plan = &plan;
    }
    int *fetched = (int *)calloc((size_t)n, sizeof(int));
    mpq_packed *out = (mpq_packed *)calloc((size_t)n, sizeof *out);
    if (!rc && (!fetched || !out)) rc = fail(EXIT_QUANT, "out of memory");
    for (int i = 0; !rc && i < n; i++) { /* W: the loaded model's (NULL); AWQ's rows from --calib */
        if (r.awq) {
            if (fetch(R, i, MPQ_RECIPE_ACTS, &maps[i]) != MPQ_OK) rc = R->rc ? R->rc : fail(EXIT_INPUT, "fetch");
            fetched[i] = 1;
        }
        maps[i].W = NULL;
    }
    if (!rc) {
        mpq_seq_opts so;
        memset(&so, 0, sizeof so);
        so.windows = q->seq_windows, so.length = q->seq_length;
        so.store = store, so.user = R; /* each map written as it is made */
        progress_start(&R->p, "mpq", !q->quiet, n);
        const mpq_status st = mpq_llm_quantize_sequential(m, tok, nt, &so, &r, maps, out, &e);
        progress_end(&R->p);
        if (R->rc)
            rc = R->rc;
        else if (st != MPQ_OK)
            rc = fail(st == MPQ_ERR_SIZE ? EXIT_INPUT : EXIT_QUANT, "%s: %s", in, e.msg);
    }
    for (int i = 0; i < n; i++) {
        if (out) mpq_packed_free(&out[i]);
        if (fetched && fetched[i]) release(R, i, &maps[i]);
    }
    free(out), free(fetched), free(tok), free(text);
    mpq_plan_free(&plan);
    mpq_llm_free(m);
    return rc;
}

/* ---------------------------------------------------------------------------
   --method auto: the widths from measured KL divergences
   ------------------------------------------------------------------------ */

/* The calibration text's hash a statistics file records (mpq calibrate's
   "mpq_calib" metadata, its "source"), 0 without one. */
static uint64_t stats_text_hash(const mpq_st_file *f)
{
    const char *meta = f ? mpq_st_meta(f, "mpq_calib") : NULL;
    cJSON *o = meta ? cJSON_Parse(meta) : NULL;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "source"), "text_fnv1a");
    const uint64_t v = cJSON_IsString(h) ? (uint64_t)strtoull(h->valuestring, NULL, 16) : 0;
    cJSON_Delete(o);
    return v;
}

/* The plan of --method auto, printed: each map's widths and predicted KLD,
   then the whole; and recorded in the output's metadata ("mpq_auto"), which
   mpq inspect shows. */
static int auto_report(qrun *R, const mpq_recipe_map *maps, int n, const mpq_plan *plan, const mpq_measure_info *info)
{
    cJSON *o = cJSON_CreateObject(), *per = o ? cJSON_AddObjectToObject(o, "maps") : NULL;
    int ok = per != NULL;
    for (int i = 0; i < n; i++) {
        const mpq_layer_plan *L = &plan->layers[i];
        const int ng = (L->cols + L->group - 1) / L->group, nbr = (L->rows + L->block_rows - 1) / L->block_rows;
        int lo = 9, hi = 0;
        for (int b = 0; b < nbr; b++) {
            const int w = L->bits[(size_t)b * ng];
            lo = w < lo ? w : lo, hi = w > hi ? w : hi;
        }
        char what[64];
        if (hi > lo)
            snprintf(what, sizeof what, "%d and %d bits, %.4f bpw", lo, hi,
                     L->weight_bits / ((double)L->rows * L->cols));
        else
            snprintf(what, sizeof what, "%d bits", lo);
        if (!R->q->quiet) printf("auto: %-40s %-24s predicted KLD %.6g\n", maps[i].name, what, L->loss);
        cJSON *m = ok ? cJSON_AddObjectToObject(per, maps[i].name) : NULL;
        ok = m && cJSON_AddStringToObject(m, "widths", what) && cJSON_AddNumberToObject(m, "predicted_kld", L->loss);
    }
    char target[64];
    if (R->r.max_kld > 0)
        snprintf(target, sizeof target, "--max-kld %g", R->r.max_kld);
    else
        snprintf(target, sizeof target, "--bpw %g", R->r.bpw);
    if (!R->q->quiet)
        printf("auto: %.4f bits per weight (weights and scales), predicted KLD %.6g (%s; measured at %d width(s) on "
               "%d window(s) of %d tokens)\n",
               plan->bpw, plan->loss, target, info->nbits, info->windows, info->length);
    ok = ok && cJSON_AddStringToObject(o, "target", target) && cJSON_AddNumberToObject(o, "bpw", plan->bpw) &&
        cJSON_AddNumberToObject(o, "predicted_kld", plan->loss) && cJSON_AddStringToObject(o, "measure", R->q->measure);
    char *j = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    mpq_io_err e;
    int rc = j ? 0 : fail(EXIT_QUANT, "out of memory");
    if (!rc && mpq_st_write_meta(R->w, "mpq_auto", j, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    cJSON_free(j);
    return rc;
}

/* The recipe over the maps, then whatever is left to copy. */
static int run_recipe(qrun *R)
{
    const int n = (int)arrlen(R->maps);
    mpq_recipe_map *maps = (mpq_recipe_map *)calloc((size_t)n + 1, sizeof *maps);
    if (!maps) return fail(EXIT_QUANT, "out of memory");
    for (int i = 0; i < n; i++) {
        const job *J = &R->jobs[R->maps[i]];
        maps[i].rows = J->rows, maps[i].cols = J->cols, maps[i].name = J->name;
    }
    int rc = qargs_budget(R->q, &R->r, maps, n);
    if (!rc) rc = open_stats(R);
    mpq_plan plan;
    memset(&plan, 0, sizeof plan);
    mpq_measure_info info;
    double *kld = NULL;
    if (!rc && R->r.planner == MPQ_PLANNER_KLD) { /* planned first, to print and record the plan */
        const uint64_t h = R->H ? stats_text_hash(R->H) : stats_text_hash(R->S);
        rc = qargs_measured(R->q, &R->r, maps, n, R->cfg, h, &info, &kld);
        mpq_recipe_io io = {fetch, release, NULL, show, R};
        progress_start(&R->p, "mpq", !R->q->quiet, n);
        const mpq_status st = rc ? MPQ_OK : mpq_recipe_plan(&R->r, maps, n, &io, &plan);
        progress_end(&R->p);
        if (!rc && R->rc)
            rc = R->rc;
        else if (!rc && st != MPQ_OK)
            rc = fail(EXIT_QUANT, "quantize --method auto: planning failed: %s", mpq_status_str(st));
        if (!rc) rc = auto_report(R, maps, n, &plan, &info);
        if (!rc) R->r.planner = MPQ_PLANNER_NONE, R->r.plan = &plan;
    }
    if (!rc && R->q->sequential) {
        rc = run_sequential(R, maps, n, mpq_source_path(R->in));
    } else if (!rc) {
        mpq_recipe_io io = {fetch, release, store, show, R};
        mpq_recipe_result res;
        progress_start(&R->p, "mpq", !R->q->quiet, n);
        const mpq_status st = mpq_recipe_run(&R->r, maps, n, &io, NULL, &res);
        progress_end(&R->p);
        if (R->rc)
            rc = R->rc;
        else if (st != MPQ_OK && res.map >= 0)
            rc = quant_fail(maps[res.map].name, st,
                            st == MPQ_ERR_NOTPD ? "GPTQ (its X^T X plus the dampening is not positive definite: "
                                                  "raise --damp)"
                                                : res.step);
        else if (st != MPQ_OK)
            rc = fail(EXIT_QUANT, "%s over %d tensors failed: %s", res.step, n, mpq_status_str(st));
        else if (!R->q->quiet && R->r.requant)
            fprintf(stderr, "mpq: requant: t = %.2f (eq. 9); %zu weights in sparse parts\n", res.requant_t,
                    res.sparse_weights);
    }
    for (int i = 0; i < n; i++) fetch_free(&maps[i]);
    free(maps), free(kld);
    R->r.plan = NULL;
    mpq_plan_free(&plan);
    return rc;
}

static int quantize_run(qrun *R, const char *in, const char *out)
{
    mpq_io_err e;
    const qargs *q = R->q;
    mpq_llm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    char mn[16];
    int rc = 0, model = 0;
    if (mpq_source_open(in, &R->in, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    /* a model: anything but a safetensors file without a config.json */
    if (mpq_source_kind_of(R->in) != MPQ_SOURCE_SAFETENSORS) {
        model = 1;
    } else {
        char *t = NULL;
        if (mpq_source_text(R->in, "config.json", &t, NULL, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
        model = t != NULL;
        free(t);
    }
    if (!rc && model && mpq_llm_config_read(R->in, &cfg, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
    if (!rc) rc = select_jobs(R, model);
    for (ptrdiff_t i = 0; !rc && i < arrlen(R->jobs); i++)
        if (!R->jobs[i].embed) arrput(R->maps, (int)i);
    if (model && arrlen(R->maps) > 1) {
        g_sort_jobs = R->jobs;
        qsort(R->maps, (size_t)arrlen(R->maps), sizeof(int), by_model_order);
    }
    if (!rc && arrlen(R->maps) == 0 && !q->quiet)
        fprintf(stderr, "mpq: %s: no tensor selected for %s\n", in, cli_nth(QARGS_METHODS, q->method, mn, sizeof mn));
    R->written = (uint8_t *)calloc((size_t)mpq_source_count(R->in) + 1, 1);
    if (!rc && !R->written) rc = fail(EXIT_QUANT, "out of memory");
    if (!rc && mpq_st_writer_open(out, &R->w, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    if (!rc) rc = write_meta(R, model, &cfg);
    R->cfg = model ? &cfg : NULL;
    /* the header's room (a packed tensor's entry and metadata take under 1 KiB), so that the data is not copied
       at the end */
    if (!rc && mpq_st_writer_reserve(R->w, (uint64_t)mpq_source_count(R->in) * 1024 + 4096, &e) != MPQ_OK)
        rc = fail(EXIT_OUTPUT, "%s", e.msg);
    if (!rc && arrlen(R->maps)) rc = run_recipe(R);
    if (!rc) rc = write_before(R, mpq_source_count(R->in));
    if (R->w) {
        if (rc)
            mpq_st_writer_abort(R->w);
        else if (mpq_st_writer_close(R->w, &e) != MPQ_OK)
            rc = fail(EXIT_OUTPUT, "%s", e.msg);
    }
    if (!rc && !q->quiet) {
        printf("%s -> %s (%s)\n", in, out, cli_nth(QARGS_METHODS, q->method, mn, sizeof mn));
        print_rows(R->rows, 1);
    }
    arrfree(R->jobs);
    arrfree(R->maps);
    arrfree(R->rows);
    free(R->written);
    mpq_st_close(R->S);
    mpq_st_close(R->C);
    mpq_st_close(R->H);
    mpq_source_close(R->in);
    return rc;
}

/* The files the recipe reads, named before anything is opened. */
static int check_files(qargs *q, const mpq_recipe *r)
{
    char m[16], qn[16];
    cli_nth(QARGS_METHODS, q->method, m, sizeof m);
    if (q->stats) { /* --stats FILE stands for the three files */
        q->salience = q->salience ? q->salience : q->stats;
        q->calib = q->calib ? q->calib : q->stats;
        q->hessian = q->hessian ? q->hessian : q->stats;
    }
    if ((r->planner == MPQ_PLANNER_SFMP || r->planner == MPQ_PLANNER_MIXLLM || r->requant) && !q->salience)
        return fail(EXIT_USAGE, "quantize --method %s%s: needs --salience FILE (or --stats FILE)", m,
                    r->requant && q->method != M_REQUANT ? " --requant" : "");
    if (q->method == M_AWQ && !q->calib) return fail(EXIT_USAGE, "quantize --method awq: needs --calib FILE");
    if (q->method == M_AUTO && !q->measure)
        return fail(EXIT_USAGE, "quantize --method auto: needs --measure FILE (what mpq measure writes)");
    if (r->planner == MPQ_PLANNER_MXSENS && !q->salience && !q->calib)
        return fail(EXIT_USAGE, "quantize --method mxsens: needs --calib FILE (or --salience FILE)");
    if (r->awq && !q->calib)
        return fail(EXIT_USAGE, "quantize --quantizer %s: needs --calib FILE or --stats FILE",
                    cli_nth(QARGS_QUANTIZERS, q->quantizer, qn, sizeof qn));
    if ((r->gptq || r->act_order) && !q->hessian &&
        (!q->sequential || (r->act_order && r->planner == MPQ_PLANNER_SFMP)))
        return fail(EXIT_USAGE, "quantize: GPTQ needs --hessian FILE (mpq calibrate --stats xtx) or --stats FILE%s",
                    q->sequential ? " (sfmp plans in act-order from it)" : "");
    return 0;
}

int cmd_quantize(int argc, char **argv)
{
    qargs q;
    const char *pos[2];
    int npos = 0;
    cli_seen seen;
    int rc = cli_parse(&qargs_spec, argc, argv, &q, sizeof q, pos, &npos, &seen);
    if (rc) return rc < 0 ? 0 : rc;
    qrun R;
    memset(&R, 0, sizeof R);
    R.q = &q;
    if ((rc = qargs_recipe(&q, &seen, &R.r)) != 0 || (rc = check_files(&q, &R.r)) != 0) return rc;
#ifdef _OPENMP
    if (q.threads) omp_set_num_threads(q.threads);
#endif
    return quantize_run(&R, pos[0], pos[1]);
}

/* ---------------------------------------------------------------------------
   measure: each linear map's KLD under the quantizer, at a few widths
   ------------------------------------------------------------------------ */

typedef struct margs {
    qargs q;
    const char *out, *widths, *spill_dir;
    int windows, length;
} margs;

#define MA(field) CLI_AT(margs, field)
static const cli_opt margs_opts[] = {
    {"-o|--out", CLI_STR, MA(out), "FILE", 0, 0, NULL, NULL, NULL, "the measurements (safetensors; required)"},
    {"--widths", CLI_STR, MA(widths), "LIST", 0, 0, NULL, NULL, "2,4", "the widths measured, comma-separated, 1..8"},
    {"--windows", CLI_INT, MA(windows), "W", 1, 1 << 20, NULL, NULL, "1", "windows of the text"},
    {"--length", CLI_INT, MA(length), "T", 2, 1 << 20, NULL, NULL, "256", "tokens per window"},
    {"--spill-dir", CLI_STR, MA(spill_dir), "DIR", 0, 0, NULL, NULL, NULL,
     "where the sequences go when they pass 1 GiB ($TMPDIR, else /tmp)"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL, NULL, NULL}};

static const cli_spec margs_spec = {
    "measure",
    "[options] MODEL TEXT -o OUT.safetensors",
    "For every linear map of MODEL and every width of --widths: the KL divergence of the\n"
    "model's next-token distribution from the float model's, in nats per token, over\n"
    "--windows windows of --length tokens of TEXT (the calibration text, as mpq calibrate\n"
    "takes its windows), when that map alone is quantized at that width by the quantizer\n"
    "the options describe (--method rtn, awq or gptq, with --quantizer awq+gptq,\n"
    "--act-order, --rotate, --group ... as for quantize; AWQ and GPTQ read their statistics\n"
    "from --stats). What `mpq quantize --method auto` allocates the widths from.\n"
    "\n"
    "A layer at a time from the kept float inputs (mpq_llm_measure): the cost is that of\n"
    "7 L (L + 1) / 2 layer passes and 7 L head products per window and width. OUT holds\n"
    "N.kld (one value per width) for each map N, and the widths, windows, text and\n"
    "quantizer in its metadata (\"mpq_measure\").",
    {{qargs_opts, CLI_AT(margs, q)}, {margs_opts, 0}, {NULL, 0}, {NULL, 0}},
    2,
    2,
    "Exit codes: 0 ok, 1 usage, 2 bad input file, 3 output not written, 4 quantization failed."};

typedef struct mrun {
    qrun *R;
    progress p;
} mrun;

/* The quantizer of the measurement: the recipe at `bits`, its statistics
   fetched for map i, dequantized into Wq. */
static mpq_status measure_quantize(void *user, int i, int bits, const float *W, float *Wq)
{
    qrun *R = ((mrun *)user)->R;
    const job *J = &R->jobs[R->maps[i]];
    mpq_recipe r = R->r;
    r.bits = bits;
    mpq_recipe_map m;
    memset(&m, 0, sizeof m);
    m.rows = J->rows, m.cols = J->cols, m.name = J->name;
    const unsigned need = mpq_recipe_needs(&r) & (MPQ_RECIPE_ACTS | MPQ_RECIPE_HESSIAN);
    mpq_status st = need ? fetch(R, i, need, &m) : MPQ_OK;
    mpq_packed A;
    memset(&A, 0, sizeof A);
    m.W = W;
    if (st == MPQ_OK) st = mpq_recipe_quantize(&r, i, &m, NULL, &A);
    if (st == MPQ_OK) st = mpq_packed_dequantize(&A, 0, Wq);
    mpq_packed_free(&A);
    m.W = NULL;
    fetch_free(&m);
    return st;
}

static void measure_progress(void *user, const char *phase, int done, int total, double seconds)
{
    mrun *M = (mrun *)user;
    (void)seconds;
    if (!M->p.total) progress_start(&M->p, "mpq", !M->R->q->quiet, total);
    progress_show(&M->p, done, phase);
}

/* --widths: 1..8 each, at most 8 of them, no repeats. */
static int parse_widths(const char *s, int *bits, int *n)
{
    *n = 0;
    while (*s) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 8 || *n == 8) return 0;
        for (int k = 0; k < *n; k++)
            if (bits[k] == (int)v) return 0;
        bits[(*n)++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return 0;
    }
    return *n > 0;
}

int cmd_measure(int argc, char **argv)
{
    margs a;
    const char *pos[2];
    int npos = 0, bits[8], nbits = 0;
    cli_seen seen;
    int rc = cli_parse(&margs_spec, argc, argv, &a, sizeof a, pos, &npos, &seen);
    if (rc) return rc < 0 ? 0 : rc;
    if (!a.out) return fail(EXIT_USAGE, "measure: needs MODEL TEXT -o FILE (see mpq measure --help)");
    if (!parse_widths(a.widths, bits, &nbits))
        return fail(EXIT_USAGE, "measure --widths %s: widths 1..8, comma-separated, each once", a.widths);
    qrun R;
    memset(&R, 0, sizeof R);
    R.q = &a.q;
    if ((rc = qargs_recipe(&a.q, &seen, &R.r)) != 0) return rc;
    if (R.r.planner != MPQ_PLANNER_NONE || R.r.requant || a.q.sequential || a.q.format != 0)
        return fail(EXIT_USAGE, "measure: the quantizer is --method rtn, awq or gptq (bit-plane, not sequential)");
    if ((rc = check_files(&a.q, &R.r)) != 0) return rc;
#ifdef _OPENMP
    if (a.q.threads) omp_set_num_threads(a.q.threads);
#endif
    mpq_io_err e;
    mpq_llm *m = NULL;
    mpq_llm_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.in_place = 1;
    if (mpq_source_open(pos[0], &R.in, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    a.q.embed_bits = 0; /* the linear maps only */
    rc = select_jobs(&R, 1);
    for (ptrdiff_t i = 0; !rc && i < arrlen(R.jobs); i++)
        if (!R.jobs[i].embed) arrput(R.maps, (int)i);
    if (!rc && arrlen(R.maps) > 1) {
        g_sort_jobs = R.jobs;
        qsort(R.maps, (size_t)arrlen(R.maps), sizeof(int), by_model_order);
    }
    if (!rc && mpq_llm_load_with(pos[0], &lo, &m, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
    const int nlin = m ? m->c.layers * MPQ_LIN_COUNT : 0;
    for (int i = 0; !rc && i < (int)arrlen(R.maps); i++) {
        const job *J = &R.jobs[R.maps[i]];
        if (J->layer != i / MPQ_LIN_COUNT || J->lin != i % MPQ_LIN_COUNT) rc = 1;
    }
    if (!rc && (int)arrlen(R.maps) != nlin) rc = 1;
    if (rc == 1)
        rc = fail(EXIT_USAGE, "measure: %s: measures every linear map of the %d layers (%d selected)", pos[0],
                  m ? m->c.layers : 0, (int)arrlen(R.maps));
    if (!rc) rc = open_stats(&R);
    char *text = NULL;
    size_t len = 0, nt = 0;
    int32_t *tok = NULL;
    if (!rc) rc = text_read(pos[1], &text, &len);
    if (!rc && mpq_tokenize(m->tok, text, len, 0, &tok, &nt, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", pos[1], e.msg);
    double *kld = rc ? NULL : (double *)malloc(sizeof(double) * (size_t)nlin * (size_t)nbits);
    if (!rc && !kld) rc = fail(EXIT_QUANT, "out of memory");
    mrun M;
    memset(&M, 0, sizeof M);
    M.R = &R;
    const double t0 = cli_now();
    if (!rc) {
        mpq_measure_opts o;
        memset(&o, 0, sizeof o);
        o.bits = bits, o.nbits = nbits, o.quantize = measure_quantize, o.windows = a.windows, o.length = a.length;
        o.spill_dir = a.spill_dir, o.progress = measure_progress, o.user = &M;
        const mpq_status st = mpq_llm_measure(m, tok, nt, &o, kld, &e);
        progress_end(&M.p);
        if (R.rc)
            rc = R.rc;
        else if (st != MPQ_OK)
            rc = fail(st == MPQ_ERR_SIZE ? EXIT_INPUT : EXIT_QUANT, "%s: %s", pos[0], e.msg);
    }
    const double secs = cli_now() - t0;
    const char **names = rc ? NULL : (const char **)malloc(sizeof(char *) * (size_t)nlin);
    if (!rc && !names) rc = fail(EXIT_QUANT, "out of memory");
    if (!rc) { /* the measurements, and what they are of */
        mpq_measure_info info;
        memset(&info, 0, sizeof info);
        for (int k = 0; k < nbits; k++) info.bits[k] = bits[k];
        info.nbits = nbits, info.windows = a.windows, info.length = a.length, info.tokens = nt;
        info.text_hash = mpq_text_hash(text, len);
        const char *base = strrchr(pos[0], '/') && strrchr(pos[0], '/')[1] ? strrchr(pos[0], '/') + 1 : pos[0];
        snprintf(info.model, sizeof info.model, "%.127s", base);
        info.layers = m->c.layers, info.dim = m->c.dim, info.vocab = m->c.vocab;
        const mpq_recipe *r = &R.r;
        snprintf(info.quantizer, sizeof info.quantizer, "%s",
                 r->awq && r->gptq ? "awq+gptq"
                     : r->gptq     ? "gptq"
                     : r->awq      ? "awq"
                                   : "rtn");
        info.act_order = r->act_order, info.group = r->group ? r->group : 128, info.symmetric = r->symmetric;
        info.rotate = r->rotate, info.rotate_seed = r->rotate_seed, info.seconds = secs;
        for (int i = 0; i < nlin; i++) names[i] = R.jobs[R.maps[i]].name;
        if (mpq_measure_write(a.out, &info, names, nlin, kld, &e) != MPQ_OK) rc = fail(EXIT_OUTPUT, "%s", e.msg);
    }
    free(names);
    if (!rc && !a.q.quiet) {
        double tot[8] = {0};
        for (int i = 0; i < nlin; i++)
            for (int k = 0; k < nbits; k++) tot[k] += kld[(size_t)i * nbits + k];
        printf("%s: %d maps at %d width(s) in %.1f s -> %s\n", pos[0], nlin, nbits, secs, a.out);
        for (int k = 0; k < nbits; k++) printf("  %d bits: the maps' KLD sum to %.4f\n", bits[k], tot[k]);
    }
    free(kld), free(tok), free(text);
    mpq_llm_free(m);
    arrfree(R.jobs);
    arrfree(R.maps);
    mpq_st_close(R.S);
    mpq_st_close(R.C);
    mpq_st_close(R.H);
    mpq_source_close(R.in);
    return rc;
}
