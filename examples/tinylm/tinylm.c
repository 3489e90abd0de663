/* tinylm: every method of mpq measured end to end on a small trained
   transformer (examples/tinylm/tinylm.safetensors, trained by train.c; the
   Llama shape of tinylm.h, loaded and run by mpq_model like any model).

   usage: tinylm [--model FILE] [--out DIR] [--threads T]

   1. Statistics (mpq_llm_calibrate, mpq_model.h section 5) from 16
      calibration windows of 129 bytes of training text: the Fisher
      diagonal (SFMP), MixLLM's channel salience, diag(X^T X) (MXSens), AWQ's
      input rows, X^T X (GPTQ), PQI towards RTN 3-bit (ReQuant) and MXSens's
      layer sensitivity.
   2. Every row quantizes the 28 linear maps as `mpq quantize` does with the
      row's options (quantize_row: the tool's recipe; embedding, norms and
      head stay as trained): RTN 2/3/4 bits, AWQ 3/4, GPTQ 3/4 (act-order),
      SFMP at 2.25/2.5/3/3.5 bpw with and without row and column
      reordering, MixLLM with 10 % and 20 % 8-bit channels, MXINT4, MXSens at
      its lowest budget and a quarter bit above, ReQuant on RTN 3 and AWQ 3,
      and PMPD on RTN 4 (the prompt at 4 bits, decoding lowered by a
      schedule).
   3. Each is measured on held-out text (seed 1001, never trained on), on
      the packed matrices: perplexity per byte over the second half of 64
      windows of 129 bytes, as llama-perplexity scores a chunk (the first
      half is the prompt), and exact-match accuracy on 240 arithmetic and 80
      recall prompts, greedily decoded.
   Writes DIR/results.md (the table) and DIR/ppl_vs_bpw.svg (the plot);
   DIR defaults to build/tinylm. */
#define _POSIX_C_SOURCE 200809L
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "eval.h"
#include "quantize_row.h"
#include "report.h"

#include <stdio.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { NCAL = 16, NHELD = 64, NARITH = 240, NRECALL = 80 };

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

/* The rows, as options of mpq quantize. */
typedef struct tlm_row {
    const char *family, *name, *args;
} tlm_row;

static const tlm_row tlm_rows[] = {
    {"RTN", "RTN 2-bit g128", "--method rtn --bits 2"},
    {"RTN", "RTN 3-bit g128", "--method rtn --bits 3"},
    {"RTN", "RTN 4-bit g128", "--method rtn --bits 4"},
    {"AWQ", "AWQ 3-bit g128", "--method awq --bits 3"},
    {"AWQ", "AWQ 4-bit g128", "--method awq --bits 4"},
    {"GPTQ", "GPTQ 3-bit g128 (act-order)", "--method gptq --bits 3 --act-order"},
    {"GPTQ", "GPTQ 4-bit g128 (act-order)", "--method gptq --bits 4 --act-order"},
    {"SFMP", "SFMP 2.25", "--method sfmp --bpw 2.25"},
    {"SFMP", "SFMP 2.50", "--method sfmp --bpw 2.5"},
    {"SFMP", "SFMP 3.00", "--method sfmp --bpw 3"},
    {"SFMP", "SFMP 3.50", "--method sfmp --bpw 3.5"},
    {"SFMP+reorder", "SFMP 2.25 reordered", "--method sfmp --bpw 2.25 --reorder both"},
    {"SFMP+reorder", "SFMP 2.50 reordered", "--method sfmp --bpw 2.5 --reorder both"},
    {"SFMP+reorder", "SFMP 3.00 reordered", "--method sfmp --bpw 3 --reorder both"},
    {"SFMP+reorder", "SFMP 3.50 reordered", "--method sfmp --bpw 3.5 --reorder both"},
    {"MixLLM", "MixLLM 10% 8-bit", "--method mixllm --fraction 0.1"},
    {"MixLLM", "MixLLM 20% 8-bit", "--method mixllm --fraction 0.2"},
    {"MXINT", "MXINT4 (RTN)", "--method rtn --format mxint --bits 4"},
    /* the least budget MXSens's 4/6/8 templates meet (every map's top 32
       columns at 8 bits), then a quarter bit more, where 6-bit ones appear */
    {"MXSens", "MXSens %.2f (lowest)", "--method mxsens --bpw min"},
    {"MXSens", "MXSens %.2f (lowest + 0.25)", "--method mxsens --bpw min+0.25"},
    /* 0.25 % outliers spread by eq. 9 and 0.25 % significant weights */
    {"ReQuant", "RTN 3-bit + ReQuant", "--method requant --bits 3"},
    {"ReQuant", "AWQ 3-bit + ReQuant", "--method requant --bits 3 --quantizer awq"},
};
enum { TLM_NROWS = (int)(sizeof tlm_rows / sizeof tlm_rows[0]) };

/* PMPD's rows quantize this way and then run their schedules */
#define TLM_PMPD_ARGS "--method rtn --bits 4"

typedef struct ctx {
    mpq_llm *m;
    int32_t *held; /* NHELD windows of TLM_SEQ + 1 bytes */
    tlm_task task;
    mpq_calib_stats S;
} ctx;

typedef struct row {
    char name[64], family[16], note[96];
    double bpw, seconds;
    tlm_result r;
} row;

static row rows[64];
static int nrows;

/* Measures the model as it is now; bpw of its packed maps (or 16). */
static void measure(ctx *C, const char *family, const char *name, const mpq_pmpd_schedule *sched, double bpw, double t0)
{
    row *r = &rows[nrows++];
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->family, sizeof r->family, "%s", family);
    r->bpw = bpw;
    check(tlm_evaluate(C->m, sched, C->held, NHELD, &C->task, &r->r), name);
    r->seconds = now() - t0;
    printf("  %-32s %6.3f bpw   ppl %.4f   arith %5.1f %%   recall %5.1f %%   (%.1f s)\n", name, bpw, r->r.ppl,
           100 * r->r.arith, 100 * r->r.recall, r->seconds);
    fflush(stdout);
}

static void unpack_all(ctx *C)
{
    for (int l = 0; l < C->m->c.layers; l++)
        for (int k = 0; k < MPQ_LIN_COUNT; k++) mpq_linear_unpack(C->m, &C->m->layer[l].lin[k]);
}

static void quantize(ctx *C, const char *args, double *budget, mpq_recipe_result *res)
{
    const row_stats rs = {&C->S, &C->S, NULL, NULL, 0, 0};
    if (quantize_row(args, "", C->m, &rs, NULL, NULL, res, budget) != 0) exit(1);
}

static void run_row(ctx *C, const tlm_row *t)
{
    const double t0 = now();
    double budget = 0;
    mpq_recipe_result res;
    quantize(C, t->args, &budget, &res);
    char name[64];
    if (strstr(t->name, "%.2f")) /* the budget the planner found */
        snprintf(name, sizeof name, t->name, budget);
    else
        snprintf(name, sizeof name, "%s", t->name);
    measure(C, t->family, name, NULL, mpq_llm_bpw(C->m, 2, -1), t0);
    if (res.sparse_weights)
        snprintf(rows[nrows - 1].note, sizeof rows[0].note,
                 "eq. 9 temperature t = %.2f; %zu weights in the sparse parts", res.requant_t, res.sparse_weights);
    if (rows[nrows - 1].note[0]) printf("    (%s)\n", rows[nrows - 1].note);
    unpack_all(C);
}

static void run_pmpd(ctx *C)
{
    double t0 = now();
    mpq_recipe_result res;
    quantize(C, TLM_PMPD_ARGS, NULL, &res);
    const double bits[3] = {mpq_llm_bpw(C->m, 2, 0), mpq_llm_bpw(C->m, 2, 1), mpq_llm_bpw(C->m, 2, 2)};
    const long decode = TLM_SEQ / 2; /* the scored half of each window */
    /* phase-aware: prompt at 4 bits, every decoded token at 3 */
    mpq_pmpd_schedule s;
    memset(&s, 0, sizeof s);
    s.prefill_skip = 0, s.nlevels = 1, s.skip[0] = 1;
    double avg;
    check(mpq_pmpd_average_bits(&s, bits, decode, &avg), "pmpd");
    measure(C, "PMPD", "PMPD 4-bit prompt, 3-bit decode", &s, avg, t0);
    /* progressive: 4 -> 3 -> 2 bits over the decoded tokens */
    t0 = now();
    s.nlevels = 3, s.skip[0] = 0, s.skip[1] = 1, s.skip[2] = 2, s.start[0] = 0, s.start[1] = 4, s.start[2] = 32;
    check(mpq_pmpd_average_bits(&s, bits, decode, &avg), "pmpd");
    measure(C, "PMPD", "PMPD 4->3->2 (switch 4, 32)", &s, avg, t0);
    unpack_all(C);
}

static void write_table(const char *dir, const char *model, const ctx *C)
{
    char p[1024];
    FILE *f = report_open("tinylm", dir, "results.md", p, sizeof p);
    fprintf(f,
            "| method | bpw | held-out ppl | bits/byte | arithmetic | recall |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        fprintf(f, "| %s | %.3f | %.4f | %.4f | %.1f %% | %.1f %% |\n", r->name, r->bpw, r->r.ppl, r->r.nll / log(2.0),
                100 * r->r.arith, 100 * r->r.recall);
    }
    fprintf(f,
            "\nModel `%s`; bpw over the %d linear maps (scales, sparse parts included; PMPD: the average over "
            "decoded tokens); perplexity per byte on the second half of %d held-out windows of %d bytes; exact "
            "match on %d arithmetic and %d recall prompts. Statistics from %d calibration windows of %d bytes "
            "(loss %.4f nats per byte).\n\n",
            model, C->m->c.layers * MPQ_LIN_COUNT, NHELD, TLM_SEQ + 1, NARITH, NRECALL, C->S.windows, C->S.length,
            C->S.loss);
    for (int i = 0; i < nrows; i++)
        if (rows[i].note[0]) fprintf(f, "%s: %s.\n\n", rows[i].name, rows[i].note);
    fprintf(f,
            "Every quantized row is quantized by the recipe `mpq quantize OPTIONS` makes (examples/quantize_row.h), "
            "with these statistics; the options of each:\n\n");
    for (int k = 0; k < TLM_NROWS; k++) fprintf(f, "- %s: `%s`\n", rows[1 + k].name, tlm_rows[k].args);
    fprintf(f, "- PMPD: `%s`, then the schedules\n", TLM_PMPD_ARGS);
    if (fclose(f) != 0) {
        fprintf(stderr, "tinylm: cannot write %s\n", p);
        exit(1);
    }
    printf("wrote %s\n", p);
    plot_point pts[64];
    for (int i = 0; i < nrows; i++)
        pts[i].family = rows[i].family, pts[i].bpw = rows[i].bpw, pts[i].ppl = rows[i].r.ppl;
    report_plot("tinylm", dir, pts, nrows, "held-out perplexity per byte (log scale)", "fp16 weights");
}

/* Statistics from NCAL windows of training text (seed 1), the windows the
   training drew from. */
static void statistics(ctx *C)
{
    const double t0 = now();
    char *train = tlm_corpus(1, (size_t)1 << 20);
    int32_t *cal = (int32_t *)malloc(sizeof(int32_t) * NCAL * (TLM_SEQ + 1));
    if (!train || !cal) check(MPQ_ERR_NOMEM, "statistics");
    tlm_windows(train, NCAL, TLM_SEQ, cal);
    mpq_calib_opts o;
    memset(&o, 0, sizeof o);
    o.what = MPQ_CALIB_ALL | MPQ_CALIB_XTX, o.windows = NCAL, o.length = TLM_SEQ + 1, o.awq_tokens = 256;
    o.pqi_windows = 8;
    mpq_io_err e;
    if (mpq_llm_calibrate(C->m, cal, (size_t)NCAL * (TLM_SEQ + 1), &o, &C->S, &e) != MPQ_OK) {
        fprintf(stderr, "tinylm: statistics: %s\n", e.msg);
        exit(1);
    }
    printf("statistics: %d calibration windows of %d bytes, loss %.4f; Fisher, MixLLM salience, diag(X^T X), AWQ "
           "rows, X^T X, PQI, layer sensitivity (%.1f s)\n",
           C->S.windows, C->S.length, C->S.loss, now() - t0);
    free(train), free(cal);
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
    mpq_io_err e;
    if (mpq_llm_load(model, &C.m, &e) != MPQ_OK) {
        fprintf(stderr, "tinylm: %s\n", e.msg);
        return 1;
    }
    const mpq_llm_config *c = &C.m->c;
    if (c->vocab != TLM_VOCAB || mpq_tokenizer_size(C.m->tok) != TLM_VOCAB) {
        fprintf(stderr, "tinylm: %s: not a byte-level model (vocabulary %d)\n", model, c->vocab);
        return 1;
    }
    size_t params = 0;
    const int np = mpq_llm_params(C.m, NULL, 0);
    mpq_llm_param *p = (mpq_llm_param *)calloc((size_t)np, sizeof *p);
    if (!p) check(MPQ_ERR_NOMEM, "parameters");
    mpq_llm_params(C.m, p, np);
    for (int i = 0; i < np; i++) params += p[i].n;
    free(p);
    printf("tinylm: %s: dim %d, %d layers, %d heads, ffn %d, %zu parameters\n", model, c->dim, c->layers, c->heads,
           c->ffn, params);
    /* held-out windows and prompts from seeds the training never saw */
    char *held = tlm_corpus(1001, (size_t)1 << 20);
    C.held = (int32_t *)malloc(sizeof(int32_t) * NHELD * (TLM_SEQ + 1));
    if (!held || !C.held) check(MPQ_ERR_NOMEM, "held-out text");
    tlm_windows(held, NHELD, TLM_SEQ, C.held);
    free(held);
    tlm_task_make(&C.task, 2001, NARITH, NRECALL);
    report_dir("tinylm", out);
    statistics(&C);
    printf("evaluating (perplexity on %d x %d held-out bytes, %d + %d prompts):\n", NHELD, TLM_SEQ / 2, NARITH,
           NRECALL);
    measure(&C, "fp16", "fp16 weights (as trained)", NULL, 16.0, now());
    for (int k = 0; k < TLM_NROWS; k++) run_row(&C, &tlm_rows[k]);
    run_pmpd(&C);
    write_table(out, model, &C);
    printf("total %.0f s\n", now() - t0);
    mpq_calib_stats_free(&C.S);
    free(C.held);
    tlm_task_free(&C.task);
    mpq_llm_free(C.m);
    return 0;
}
