/* schedule.c - mpq schedule: PMPD's static schedule search, or its
   learned scheduler trained on calibration text. */
#define _XOPEN_SOURCE 700
#include "mpq.h"
#include "mpq_model.h"
#include "model_cmd.h"
#include "tool.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sched_ctx {
    const mpq_llm *m;
    const int32_t *tok;
    size_t n;
    mpq_ppl_opts po;
    int quiet, calls;
    mpq_status st;
    progress p; /* over the chunks of one schedule's perplexity */
} sched_ctx;

static void sched_chunk(void *user, int done, int total, double ppl, double seconds)
{
    sched_ctx *C = (sched_ctx *)user;
    char what[80];
    snprintf(what, sizeof what, "schedule %d: ppl %.4f, %.0f s", C->calls + 1, ppl, seconds);
    (void)total;
    progress_show(&C->p, done, what);
}

/* PMPD's quality of a schedule: minus the perplexity of the text with the
   second half of every chunk read at the schedule's decode precisions. */
static mpq_status sched_quality(void *user, const mpq_pmpd_schedule *s, double *q)
{
    sched_ctx *C = (sched_ctx *)user;
    mpq_ppl_opts po = C->po;
    po.schedule = s, po.progress = sched_chunk, po.user = C;
    mpq_ppl_result r;
    const int have = (int)(C->n / (size_t)po.ctx);
    progress_start(&C->p, "mpq", !C->quiet, po.chunks < have ? po.chunks : have);
    mpq_status st = mpq_llm_perplexity(C->m, C->tok, C->n, &po, &r);
    progress_end(&C->p);
    if (st != MPQ_OK) return st;
    *q = -r.ppl;
    C->calls++;
    if (!C->quiet) {
        char t[128];
        schedule_text(s, t, sizeof t);
        fprintf(stderr, "mpq: schedule %-24s ppl %.4f\n", t, r.ppl);
    }
    return MPQ_OK;
}

/* "0.1,1,10" -> up to cap numbers in [0, 1000]; their count, 0 when malformed. */
static int parse_list(const char *v, double *x, int cap)
{
    int n = 0;
    while (*v) {
        char *end;
        const double d = strtod(v, &end);
        if (end == v || !(d >= 0 && d <= 1000) || n == cap) return 0;
        x[n++] = d;
        v = end;
        if (*v == ',')
            v++;
        else if (*v)
            return 0;
    }
    return n;
}

/* "0,1,2" -> skips (strictly increasing); their count, 0 when malformed. */
static int parse_levels(const char *v, int *skip)
{
    double x[MPQ_PMPD_MAX_LEVELS];
    const int n = parse_list(v, x, MPQ_PMPD_MAX_LEVELS);
    for (int k = 0; k < n; k++) {
        if (x[k] != (int)x[k] || x[k] > 7 || (k && x[k] <= x[k - 1])) return 0;
        skip[k] = (int)x[k];
    }
    return n;
}

/* The learned scheduler's options (mpq schedule --learned). */
typedef struct learn_opts {
    int windows, hidden, seed;
    int nlayers, layers[8]; /* layers whose caches to compare; none: the last */
    double holdout;         /* fraction of the windows held out for a first, checking training */
    mpq_pmpd_train_opts train;
    int nl2; /* weight decays to choose from by cross-validation */
    double l2[8];
} learn_opts;

/* A network of like's sizes and schedule trained on s[0..ns), from the
   same initialisation every time. With several weight decays, the one of
   the lowest mean cross-entropy on held-out folds (4 folds, every 4th
   sample) is chosen first; *l2 says which, cv (may be NULL) the figures,
   *cv_ce (may be NULL) its cross-validated cross-entropy. */
static mpq_status train_cv(const mpq_pmpd_learned *like, const mpq_pmpd_sample *s, int ns, const learn_opts *lo,
                           mpq_pmpd_learned *out, double *l2, char *cv, size_t cap, double *cv_ce)
{
    enum { FOLDS = 4 };
    double ce[8] = {0};
    mpq_status st = MPQ_OK;
    int best = 0;
    const int did = lo->nl2 > 1 && ns >= 2 * FOLDS;
    if (did) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int task = 0; task < lo->nl2 * FOLDS; task++) {
            const int k = task / FOLDS, f = task % FOLDS;
            mpq_pmpd_sample *tr = (mpq_pmpd_sample *)malloc(sizeof *tr * (size_t)ns), *te = NULL;
            mpq_pmpd_learned n;
            memset(&n, 0, sizeof n);
            mpq_status e = tr
                ? mpq_pmpd_learned_init(&n, like->dk, like->dv, like->hidden, like->classes, (uint64_t)lo->seed)
                : MPQ_ERR_NOMEM;
            int ntr = 0, nte = 0;
            if (e == MPQ_OK) {
                n.layer = like->layer, n.prefill_skip = like->prefill_skip, n.skip_high = like->skip_high;
                n.skip_low = like->skip_low, n.length = like->length;
                te = tr + (ns - (ns - f + FOLDS - 1) / FOLDS); /* the fold's samples at the end */
                for (int i = 0; i < ns; i++)
                    if (i % FOLDS == f)
                        te[nte++] = s[i];
                    else
                        tr[ntr++] = s[i];
                mpq_pmpd_train_opts o = lo->train;
                o.l2 = lo->l2[k];
                e = mpq_pmpd_learned_train(&n, tr, ntr, &o, NULL);
            }
            double v = 0;
            if (e == MPQ_OK) e = mpq_pmpd_learned_loss(&n, te, nte, 0, &v, NULL);
#pragma omp critical
            {
                if (e != MPQ_OK) st = e;
                ce[k] += v * nte / ns;
            }
            mpq_pmpd_learned_free(&n);
            free(tr);
        }
        for (int k = 1; k < lo->nl2; k++) best = ce[k] < ce[best] ? k : best;
    }
    if (st != MPQ_OK) return st;
    if (cv_ce) *cv_ce = ce[best];
    if (cv) {
        int w = snprintf(cv, cap, "weight decay");
        for (int k = 0; k < lo->nl2 && did && w > 0 && (size_t)w < cap; k++)
            w += snprintf(cv + w, cap - (size_t)w, "%s %g: %.4f", k ? "," : "", lo->l2[k], ce[k]);
        if (did && w > 0 && (size_t)w < cap)
            snprintf(cv + w, cap - (size_t)w, " (held-out cross-entropy over %d folds), chose %g", FOLDS, lo->l2[best]);
        else if (w > 0 && (size_t)w < cap)
            snprintf(cv + w, cap - (size_t)w, " %g", lo->l2[best]);
    }
    if ((st = mpq_pmpd_learned_init(out, like->dk, like->dv, like->hidden, like->classes, (uint64_t)lo->seed)) !=
        MPQ_OK)
        return st;
    out->layer = like->layer, out->prefill_skip = like->prefill_skip, out->skip_high = like->skip_high;
    out->skip_low = like->skip_low, out->length = like->length;
    mpq_pmpd_train_opts o = lo->train;
    o.l2 = lo->l2[best];
    *l2 = o.l2;
    if ((st = mpq_pmpd_learned_train(out, s, ns, &o, NULL)) != MPQ_OK) mpq_pmpd_learned_free(out);
    return st;
}

/* PMPD's learned scheduler, trained on windows of the calibration text:
   each window's label is the fewest high-precision tokens whose
   teacher-forced perplexity is within max_increase of all high precision.
   With several layers, the one whose cache predicts the labels best under
   cross-validation is kept (PMPD section 5.3 compares layers so). */
static int schedule_learned(const mpq_llm *m, const char *model, const char *text_path, const int32_t *tok, size_t nt,
                            const mpq_pmpd_search *d, double max_increase, int ctx, const learn_opts *lo, int quiet,
                            const char *out)
{
    const int kvd = m->c.kv_heads * m->c.head_dim, P = ctx / 2, length = ctx - P - 1;
    if (d->nlevels != 2)
        return fail(EXIT_USAGE, "schedule --learned: two levels (--levels HIGH,LOW), not %d", d->nlevels);
    if (length < 1) return fail(EXIT_USAGE, "schedule --learned: --ctx %d leaves no decoded token", ctx);
    int layers[8], NL = lo->nlayers ? lo->nlayers : 1;
    for (int j = 0; j < NL; j++) {
        layers[j] = lo->nlayers ? lo->layers[j] : m->c.layers - 1;
        if (layers[j] >= m->c.layers)
            return fail(EXIT_USAGE, "schedule --layer: %d, but %s has %d layers", layers[j], model, m->c.layers);
    }
    const size_t avail = nt / (size_t)ctx;
    if (avail < 2) return fail(EXIT_INPUT, "%s: %zu tokens, fewer than two windows of %d", text_path, nt, ctx);
    const int W = (size_t)lo->windows < avail ? lo->windows : (int)avail;
    mpq_pmpd_learned n;
    mpq_status st = mpq_pmpd_learned_init(&n, kvd, kvd, lo->hidden, d->candidates, (uint64_t)lo->seed);
    if (st != MPQ_OK) return fail(EXIT_QUANT, "schedule --learned: %s", mpq_status_str(st));
    n.layer = layers[0], n.prefill_skip = d->prefill_skip, n.skip_high = d->skip[0], n.skip_low = d->skip[1];
    n.length = length;
    const int C = n.classes;
    const size_t per = (size_t)P * kvd; /* floats of one window's K (or V) in one layer */
    float *K = (float *)malloc(sizeof(float) * (size_t)NL * W * per),
          *V = (float *)malloc(sizeof(float) * (size_t)NL * W * per);
    mpq_pmpd_sample *smp = (mpq_pmpd_sample *)calloc((size_t)NL * W, sizeof *smp), *tr = NULL;
    double *nll = (double *)malloc(sizeof(double) * (size_t)W * C);
    mpq_llm_state s;
    memset(&s, 0, sizeof s);
    int rc = 0;
    if (!K || !V || !smp || !nll || (st = mpq_llm_state_init(m, ctx, 64, &s)) != MPQ_OK)
        rc = fail(EXIT_QUANT, "schedule --learned: %s", st != MPQ_OK ? mpq_status_str(st) : "out of memory");
    int hist[MPQ_PMPD_MAX_CLASSES] = {0};
    const double t0 = cli_now();
    progress pr;
    progress_start(&pr, "mpq", !quiet, W);
    for (int i = 0; i < W && !rc; i++) { /* windows evenly over the text */
        const size_t at = (size_t)((double)i * (double)(avail - 1) / (W > 1 ? W - 1 : 1) + 0.5) * (size_t)ctx;
        double *v = nll + (size_t)i * C;
        st = mpq_llm_pmpd_sample(m, &s, tok + at, P, &n, v, K + i * per, V + i * per);
        if (st != MPQ_OK) {
            rc = fail(EXIT_QUANT, "schedule --learned: window %d: %s", i, mpq_status_str(st));
            break;
        }
        for (int j = 1; j < NL; j++) { /* the prompt's positions of the other layers, as the sample left them */
            const size_t from = (size_t)layers[j] * s.ctx * kvd, to = ((size_t)j * W + i) * per;
            memcpy(K + to, s.kc + from, sizeof(float) * per);
            memcpy(V + to, s.vc + from, sizeof(float) * per);
        }
        int label = C - 1;
        for (int c = 0; c < C; c++)
            if (v[c] <= v[C - 1] + log1p(max_increase)) {
                label = c;
                break;
            }
        hist[label]++;
        for (int j = 0; j < NL; j++) {
            mpq_pmpd_sample *x = &smp[(size_t)j * W + i];
            x->K = K + ((size_t)j * W + i) * per, x->V = V + ((size_t)j * W + i) * per, x->T = P, x->label = label;
        }
        char what[64];
        snprintf(what, sizeof what, " windows, %.0f s", cli_now() - t0);
        progress_show(&pr, i + 1, what);
    }
    progress_end(&pr);
    /* windows held out (every k-th) from the choice of the layer and the
       weight decay and from the training: how well the chosen network
       predicts them, against the label frequencies of the others */
    char heldout[768] = "", cv[512] = "", layer_cv[512] = "";
    const int nho = lo->holdout > 0 && (int)(lo->holdout * W + 0.5) < W ? (int)(lo->holdout * W + 0.5) : 0;
    int ntr = 0, trh[MPQ_PMPD_MAX_CLASSES] = {0}, best = 0;
    char *is_out = (char *)calloc((size_t)W, 1);
    if (!rc && (!is_out || !(tr = (mpq_pmpd_sample *)malloc(sizeof *tr * (size_t)W))))
        rc = fail(EXIT_QUANT, "out of memory");
    for (int i = 0; i < W && !rc; i++) {
        is_out[i] = nho > 0 && (int)((long)(i + 1) * nho / W) > (int)((long)i * nho / W);
        if (!is_out[i]) trh[smp[i].label]++, ntr++;
    }
    mpq_pmpd_learned h;
    memset(&h, 0, sizeof h);
    double best_ce = HUGE_VAL, l2 = 0;
    for (int j = 0; j < NL && !rc && (NL > 1 || nho > 0); j++) {
        int k = 0;
        for (int i = 0; i < W; i++)
            if (!is_out[i]) tr[k++] = smp[(size_t)j * W + i];
        mpq_pmpd_learned hj;
        double ce = 0, l2j = 0;
        n.layer = layers[j];
        if ((st = train_cv(&n, tr, ntr, lo, &hj, &l2j, NULL, 0, &ce)) != MPQ_OK) {
            rc = fail(EXIT_QUANT, "schedule --learned: training on layer %d: %s", layers[j], mpq_status_str(st));
            break;
        }
        const int w = (int)strlen(layer_cv);
        snprintf(layer_cv + w, sizeof layer_cv - (size_t)w, "%s%d: %.4f", j ? ", " : "", layers[j], ce);
        if (ce < best_ce) {
            best_ce = ce, best = j, l2 = l2j;
            mpq_pmpd_learned_free(&h);
            h = hj;
        } else {
            mpq_pmpd_learned_free(&hj);
        }
    }
    if (!rc && nho > 0) {
        int major = 0, right = 0, prior = 0, below = 0, above = 0, k = 0;
        double ce = 0, ce_prior = 0;
        for (int c = 1; c < C; c++) major = trh[c] > trh[major] ? c : major;
        for (int i = 0; i < W; i++) {
            if (!is_out[i]) continue;
            const mpq_pmpd_sample *x = &smp[(size_t)best * W + i];
            double p[MPQ_PMPD_MAX_CLASSES];
            mpq_pmpd_learned_forward(&h, x->K, x->V, x->T, p);
            int c = 0;
            for (int q = 1; q < C; q++) c = p[q] > p[c] ? q : c;
            ce -= log(p[x->label] > 1e-300 ? p[x->label] : 1e-300);
            ce_prior -= log((trh[x->label] + 1.0) / (ntr + C));
            right += c == x->label, below += c<x->label, above += c> x->label, prior += major == x->label, k++;
        }
        snprintf(heldout, sizeof heldout,
                 "; held out %d windows (layer %d, weight decay %g): accuracy %.3f (%d predicted fewer "
                 "high-precision tokens than their label, %d more), cross-entropy %.4f; the label frequencies of "
                 "the others: accuracy %.3f, cross-entropy %.4f",
                 k, layers[best], l2, (double)right / k, below, above, ce / k, (double)prior / k, ce_prior / k);
    }
    mpq_pmpd_learned_free(&h);
    double loss0 = 0, loss = 0;
    mpq_pmpd_learned fin;
    memset(&fin, 0, sizeof fin);
    n.layer = layers[best];
    const mpq_pmpd_sample *all = smp + (size_t)best * W;
    if (!rc) mpq_pmpd_learned_loss(&n, all, W, 0, &loss0, NULL);
    if (!rc && (st = train_cv(&n, all, W, lo, &fin, &l2, cv, sizeof cv, NULL)) != MPQ_OK)
        rc = fail(EXIT_QUANT, "schedule --learned: training: %s", mpq_status_str(st));
    if (!rc) {
        mpq_pmpd_learned_free(&n);
        n = fin;
        mpq_pmpd_learned_loss(&n, all, W, 0, &loss, NULL);
    }
    int right = 0, predicted[MPQ_PMPD_MAX_CLASSES] = {0};
    for (int i = 0; i < W && !rc; i++) {
        mpq_pmpd_schedule sc;
        int c = 0;
        if (mpq_pmpd_learned_predict(&n, all[i].K, all[i].V, P, &sc, &c) == MPQ_OK)
            right += c == all[i].label, predicted[c]++;
    }
    if (!rc) {
        char hs[512], ps[512], extra[1024], lc[600] = "";
        int k = 0, q = 0;
        for (int c = 0; c < C; c++) {
            k += snprintf(hs + k, sizeof hs - (size_t)k, "%s%d", c ? "," : "", hist[c]);
            q += snprintf(ps + q, sizeof ps - (size_t)q, "%s%d", c ? "," : "", predicted[c]);
        }
        if (NL > 1) snprintf(lc, sizeof lc, "; layers by cross-validated cross-entropy: %s", layer_cv);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", model);
        cJSON_AddStringToObject(o, "text", text_path);
        cJSON_AddNumberToObject(o, "windows", W);
        cJSON_AddNumberToObject(o, "ctx", ctx);
        cJSON_AddNumberToObject(o, "max_increase", max_increase);
        cJSON_AddNumberToObject(o, "weight_decay", l2);
        cJSON_AddStringToObject(o, "labels", hs);
        cJSON_AddNumberToObject(o, "train_accuracy", (double)right / W);
        cJSON_AddNumberToObject(o, "loss", loss);
        char *j = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        snprintf(extra, sizeof extra, "%s", j ? j : "{}");
        free(j);
        mpq_io_err e;
        if ((st = mpq_pmpd_learned_write(&n, extra, out, &e)) != MPQ_OK)
            rc = fail(EXIT_OUTPUT, "%s", e.msg);
        else
            printf("%s: learned scheduler on layer %d (%d classes: first round(c x %d / %d) decoded tokens at skip %d, "
                   "then %d); %d windows of %s, labels per class %s; loss %.4f -> %.4f, training accuracy %.3f "
                   "(predicted %s); %s%s%s; %.0f s\n",
                   out, n.layer, C, length, C - 1, n.skip_high, n.skip_low, W, text_path, hs, loss0, loss,
                   (double)right / W, ps, cv, lc, heldout, cli_now() - t0);
    }
    mpq_llm_state_free(&s);
    free(K), free(V), free(smp), free(nll), free(tr), free(is_out);
    mpq_pmpd_learned_free(&n);
    return rc;
}

typedef struct sched_args {
    llm_opts lo;
    const char *out;
    int levels[MPQ_PMPD_MAX_LEVELS + 1]; /* count, then the skips */
    int prefill, candidates, ctx, chunks, learned;
    double max_increase;
    learn_opts lrn;
} sched_args;

/* --levels: strictly increasing skips, count first. */
static int parse_levels_arg(const char *v, void *field)
{
    int *l = (int *)field;
    return (l[0] = parse_levels(v, l + 1)) > 0;
}

/* --layer: up to 8 layers. */
static int parse_layers_arg(const char *v, void *field)
{
    learn_opts *lo = (learn_opts *)field;
    double x[8];
    if (!(lo->nlayers = parse_list(v, x, 8))) return 0;
    for (int k = 0; k < lo->nlayers; k++) {
        if (x[k] != (int)x[k]) return 0;
        lo->layers[k] = (int)x[k];
    }
    return 1;
}

/* --l2: up to 8 weight decays. */
static int parse_l2_arg(const char *v, void *field)
{
    learn_opts *lo = (learn_opts *)field;
    return (lo->nl2 = parse_list(v, lo->l2, 8)) > 0;
}

#define SA(f) CLI_AT(sched_args, f)
static const cli_opt sched_opts[] = {
    {"-o|--output", CLI_STR, SA(out), "FILE", 0, 0, NULL, NULL, NULL, "where the schedule goes (required)"},
    {"--levels", CLI_PARSE, SA(levels), "LIST", 0, 0, "increasing skips 0..7", parse_levels_arg, "0,1",
     "skip_planes of the levels, increasing"},
    {"--prefill", CLI_INT, SA(prefill), "K", 0, 7, NULL, NULL, "0", "skip_planes of the prompt"},
    {"--max-increase", CLI_DOUBLE, SA(max_increase), "X", 0, 1e6, NULL, NULL, "0.10",
     "allowed perplexity increase over the first level"},
    {"--candidates", CLI_INT, SA(candidates), "N", 2, 64, NULL, NULL, "5", "switch points, 0 and L included"},
    {"--ctx", CLI_INT, SA(ctx), "N", 4, 1 << 20, NULL, NULL, "512", "tokens per chunk (L = N - N/2 decoded tokens)"},
    {"--chunks", CLI_INT, SA(chunks), "N", 1, 1 << 20, NULL, NULL, "4", "chunks of TEXT per quality"},
    {"--learned", CLI_FLAG, SA(learned), NULL, 0, 0, NULL, NULL, NULL,
     "train the learned scheduler (two levels; -o FILE.safetensors)"},
    {"--windows", CLI_INT, SA(lrn.windows), "N", 2, 1 << 20, NULL, NULL, "64", "training windows"},
    {"--layer", CLI_PARSE, SA(lrn), "LIST", 0, 0, "a list of at most 8 layers", parse_layers_arg, NULL,
     "the layer whose cache it reads (default the last); with several,\n"
     "the one whose cache predicts the labels best (cross-validated)"},
    {"--hidden", CLI_INT, SA(lrn.hidden), "H", 1, 4096, NULL, NULL, "32", "hidden units of the MLP"},
    {"--steps", CLI_INT, SA(lrn.train.steps), "N", 1, 1 << 20, NULL, NULL, "300", "Adam steps over all windows"},
    {"--lr", CLI_DOUBLE, SA(lrn.train.lr), "X", 1e-9, 10, NULL, NULL, "0.01", "learning rate"},
    {"--l2", CLI_PARSE, SA(lrn), "LIST", 0, 0, "a list of at most 8 numbers in [0, 1000]", parse_l2_arg,
     "0.001,0.01,0.1,1,10", "weight decays of the MLP's matrices to choose from by 4-fold\ncross-validation"},
    {"--seed", CLI_INT, SA(lrn.seed), "S", 0, INT32_MAX, NULL, NULL, "1", "initialisation"},
    {"--holdout", CLI_DOUBLE, SA(lrn.holdout), "F", 0, 0.9, NULL, NULL, "0.25",
     "first train without a fraction F of the windows and report how\n"
     "well it predicts them (0: skip); then train on all"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};
#undef SA
static const cli_spec sched_spec = {
    "schedule",
    "[options] MODEL TEXT -o SCHEDULE",
    "PMPD's static scheduler (its section 4.3) for a packed MODEL: the cheapest\n"
    "progressive schedule over the precision levels (bit planes skipped) whose quality\n"
    "on TEXT (calibration text, never the evaluation text) meets the target. Quality is\n"
    "the perplexity of TEXT in chunks of --ctx with the first half of each as the\n"
    "prompt (at --prefill) and the second half read as a generation would read its\n"
    "decoded tokens under the schedule; the target is the perplexity at the first\n"
    "level times 1 + --max-increase. Candidate switch points are round(k L / (N - 1));\n"
    "schedules are tried cheapest first (average bits read per decoded token). Writes\n"
    "the schedule as one line P:S@T,... that `mpq run --schedule FILE` reads.\n"
    "\n"
    "--learned trains PMPD's learned scheduler instead (section 4.2, appendix A.1): for\n"
    "each of --windows windows of --ctx tokens of TEXT, the first half the prompt, the\n"
    "label is the fewest decoded tokens at the first level (of the N candidates) whose\n"
    "perplexity of the rest of the window, teacher-forced, is within --max-increase of\n"
    "all tokens at the first level; the network (attention of a learned query over the\n"
    "prompt's keys and values in one layer, then an MLP) learns the label from the\n"
    "cache. Writes a safetensors file that `mpq run --schedule learned:FILE` reads.",
    {{sched_opts, 0}, {cli_model_opts, CLI_AT(sched_args, lo)}, {NULL, 0}, {NULL, 0}},
    2,
    2,
    NULL};

/* The static search: the first level's quality, the cheapest schedule that
   meets the target, its line in the file. */
static int schedule_static(const sched_args *a, sched_ctx *C, mpq_pmpd_search *d, const char *text_path)
{
    double bits[MPQ_MAX_BITS + 1];
    for (int k = 0; k <= d->skip[d->nlevels - 1] && k <= MPQ_MAX_BITS; k++) bits[k] = mpq_llm_bpw(C->m, 1, k);
    d->bits = bits, d->length = a->ctx - a->ctx / 2;
    mpq_pmpd_schedule ref, best;
    memset(&ref, 0, sizeof ref);
    ref.prefill_skip = d->prefill_skip, ref.nlevels = 1, ref.skip[0] = d->skip[0];
    double qref = 0, q = 0;
    int evaluated = 0;
    mpq_status st = sched_quality(C, &ref, &qref);
    if (st != MPQ_OK) return fail(EXIT_QUANT, "schedule: %s", mpq_status_str(st));
    d->target = qref * (1 + a->max_increase); /* qualities are -ppl */
    st = mpq_pmpd_static_search(d, sched_quality, C, &best, &q, &evaluated);
    if (st == MPQ_ERR_RANGE) return fail(EXIT_QUANT, "schedule: no schedule meets perplexity %.4f", -d->target);
    if (st != MPQ_OK) return fail(EXIT_QUANT, "schedule: %s", mpq_status_str(st));
    double avg = 0;
    mpq_pmpd_average_bits(&best, bits, d->length, &avg);
    char t[128];
    schedule_text(&best, t, sizeof t);
    FILE *f = fopen(a->out, "w");
    if (!f) return fail(EXIT_OUTPUT, "%s: cannot open: %s", a->out, strerror(errno));
    fprintf(f,
            "%s # PMPD static schedule: %.3f bits per weight per decoded token over %ld tokens, ppl %.4f "
            "(first level %.4f, target %.4f) on %s\n",
            t, avg, d->length, -q, -qref, -d->target, text_path);
    if (fclose(f) != 0) return fail(EXIT_OUTPUT, "%s: write failed", a->out);
    printf("%s: %s  %.3f bits per decoded token (first level %.3f); ppl %.4f, first level %.4f; %d schedules "
           "evaluated\n",
           a->out, t, avg, bits[d->skip[0]], -q, -qref, evaluated + 1);
    return 0;
}

int cmd_schedule(int argc, char **argv)
{
    sched_args a;
    const char *pos[2];
    int npos = 0, rc = cli_parse(&sched_spec, argc, argv, &a, sizeof a, pos, &npos, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    if (!a.out) return fail(EXIT_USAGE, "schedule: needs MODEL TEXT -o FILE (see mpq schedule --help)");
    mpq_pmpd_search d;
    memset(&d, 0, sizeof d);
    d.nlevels = a.levels[0], d.prefill_skip = a.prefill, d.candidates = a.candidates;
    memcpy(d.skip, a.levels + 1, sizeof(int) * (size_t)d.nlevels);
    if (a.learned && d.nlevels != 2)
        return fail(EXIT_USAGE, "schedule --learned: two levels (--levels HIGH,LOW), not %d", d.nlevels);
    char *text = NULL;
    size_t len = 0;
    if ((rc = text_read(pos[1], &text, &len)) != 0) return rc;
    if (len && text[len - 1] == '\n') len--;
    loaded L;
    if ((rc = model_load(pos[0], &a.lo, &L)) != 0) {
        free(text);
        return rc;
    }
    mpq_io_err e;
    sched_ctx C;
    memset(&C, 0, sizeof C);
    C.m = L.m, C.quiet = a.lo.quiet;
    C.po.ctx = a.ctx, C.po.chunks = a.chunks;
    int32_t *tok = NULL;
    if (mpq_llm_bpw(L.m, 1, -1) <= 0) rc = fail(EXIT_INPUT, "%s: no packed linear maps: nothing to schedule", pos[0]);
    if (!rc && mpq_tokenize(L.m->tok, text, len, MPQ_TOK_BOS, &tok, &C.n, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", pos[1], e.msg);
    if (!rc && C.n < (size_t)a.ctx)
        rc = fail(EXIT_INPUT, "%s: %zu tokens, fewer than one chunk of %d", pos[1], C.n, a.ctx);
    C.tok = tok;
    if (!rc && a.learned)
        rc = schedule_learned(L.m, pos[0], pos[1], tok, C.n, &d, a.max_increase, a.ctx, &a.lrn, a.lo.quiet, a.out);
    else if (!rc)
        rc = schedule_static(&a, &C, &d, pos[1]);
    free(tok);
    free(text);
    model_unload(&L);
    return rc;
}
