/* tools/quantize_args.h - the options of `mpq quantize` and the recipe
   (mpq.h section 13) they describe. Shared by the tool and by the main job
   and tinylm (examples/quantize_row.h), whose tables give every row as these
   options: what they measure is what `mpq quantize` writes with them. */
#ifndef MPQ_QUANTIZE_ARGS_H
#define MPQ_QUANTIZE_ARGS_H

#include "cli.h"
#include "mpq_model.h"

enum { M_RTN, M_AWQ, M_GPTQ, M_SFMP, M_MIXLLM, M_MXSENS, M_REQUANT, M_AUTO };
#define QARGS_METHODS "rtn|awq|gptq|sfmp|mixllm|mxsens|requant|auto"
enum { Q_RTN, Q_AWQ, Q_GPTQ, Q_AWQ_GPTQ };
#define QARGS_QUANTIZERS "rtn|awq|gptq|awq+gptq"

/* --bpw: a budget, or the lowest one the planner meets plus a margin. */
typedef struct qargs_bpw {
    int lowest;   /* "min" or "min+X" */
    double value; /* the budget, or X */
} qargs_bpw;

/* --rotate SEED */
typedef struct qargs_rotate {
    int on;
    uint64_t seed;
} qargs_rotate;

typedef struct qargs {
    int method, bits, format, symmetric, group, block_rows, reorder, quantizer, requant, act_order, static_groups;
    int embed_bits, threads, quiet, seq_windows, seq_length;
    double fraction, outliers, significant, damp, max_kld;
    qargs_bpw bpw;
    qargs_rotate rotate;
    const char *salience, *calib, *hessian, *stats, *sequential, *measure;
    cli_list include, exclude;
} qargs;

static inline int qargs_parse_bpw(const char *v, void *field)
{
    qargs_bpw *b = (qargs_bpw *)field;
    char *end;
    b->lowest = !strncmp(v, "min", 3);
    if (b->lowest && !v[3]) return b->value = 0, 1;
    const char *num = b->lowest ? v + 3 : v;
    if (b->lowest && *num != '+') return 0;
    b->value = strtod(num, &end);
    return *num && !*end && b->value >= 0 && b->value <= 64;
}

static inline int qargs_parse_rotate(const char *v, void *field)
{
    qargs_rotate *r = (qargs_rotate *)field;
    return r->on = mpq_calib_parse_seed(v, &r->seed);
}

#define QA(field) CLI_AT(qargs, field)
static const cli_opt qargs_opts[] = {
    {"--method", CLI_CHOICE, QA(method), "M", 0, 0, QARGS_METHODS, NULL, "rtn",
     "rtn | awq | gptq | sfmp | mixllm | mxsens | requant | auto (widths from\n"
     "measured KL divergences: --measure, and --bpw or --max-kld)"},
    {"--bits", CLI_INT, QA(bits), "B", 1, 8, NULL, NULL, "4",
     "rtn, awq, gptq, requant: the width 1..8 (mxint: 2..8); mixllm: the low width"},
    {"--format", CLI_CHOICE, QA(format), "F", 0, 0, "bitplane|mxint", NULL, "bitplane",
     "rtn, gptq: bitplane | mxint (mantissa bits 2..8, group 32)"},
    {"--symmetric", CLI_FLAG, QA(symmetric), NULL, 0, 0, NULL, NULL, NULL, "rtn, awq, gptq: symmetric groups"},
    {"--bpw", CLI_PARSE, QA(bpw), "X", 0, 0, "a budget in 0..64, min or min+X", qargs_parse_bpw, NULL,
     "sfmp, mxsens, auto: the budget in bits per weight, scales included; min: the\n"
     "lowest the planner meets for these tensors, min+X that plus X"},
    {"--max-kld", CLI_DOUBLE, QA(max_kld), "K", 0, 1e6, NULL, NULL, NULL,
     "auto: the fewest bits whose predicted KL divergence is at most K\n"
     "(nats per token; instead of --bpw)"},
    {"--measure", CLI_STR, QA(measure), "FILE", 0, 0, NULL, NULL, NULL,
     "auto: what `mpq measure` wrote for this model with this quantizer"},
    {"--fraction", CLI_DOUBLE, QA(fraction), "F", 0, 1, NULL, NULL, "0.1",
     "mixllm: the share of output channels at 8 bits"},
    {"--group", CLI_INT, QA(group), "G", 8, 1 << 20, NULL, NULL, NULL,
     "columns per group, a multiple of 8 (default 128; mxint, mxsens: 32)"},
    {"--block-rows", CLI_INT, QA(block_rows), "R", 1, 1 << 20, NULL, NULL, "16", "rows per bit-width block"},
    {"--reorder", CLI_CHOICE, QA(reorder), "R", 0, 0, "none|rows|cols|both", NULL, "none",
     "sfmp: none | rows | cols | both"},
    {"--quantizer", CLI_CHOICE, QA(quantizer), "Q", 0, 0, QARGS_QUANTIZERS, NULL, NULL,
     "sfmp, mixllm, mxsens, auto: rtn | awq | gptq | awq+gptq (default rtn);\n"
     "requant: rtn | awq; gptq: gptq | awq+gptq. awq: AWQ's scale and\n"
     "clip search under the widths (needs --calib or --stats); gptq: GPTQ's\n"
     "error feedback (needs --hessian or --stats); awq+gptq: both, AWQ first"},
    {"--requant", CLI_FLAG, QA(requant), NULL, 0, 0, NULL, NULL, NULL,
     "ReQuant's sparse part on top (as --method requant does), for rtn,\n"
     "awq, and the planners under --quantizer rtn or awq (needs PQI: --stats)"},
    {"--outliers", CLI_DOUBLE, QA(outliers), "R", 0, 0.5, NULL, NULL, "0.0025",
     "requant: share of all weights kept as outliers, spread over the\n"
     "maps by PQI/ReQuant eq. 9"},
    {"--significant", CLI_DOUBLE, QA(significant), "R", 0, 0.5, NULL, NULL, "0.0025",
     "requant: share detached as significant weights"},
    {"--act-order", CLI_FLAG, QA(act_order), NULL, 0, 0, NULL, NULL, NULL,
     "gptq: columns in order of decreasing diag(X^T X), stored as the packed\n"
     "column permutation (free at inference); sfmp plans in that order (not\n"
     "with --reorder cols or mxsens, which permute the columns themselves)"},
    {"--rotate", CLI_PARSE, QA(rotate), "SEED", 0, 0, "a seed, an integer 0..2^64-1", qargs_parse_rotate, NULL,
     "every method: store each map with the incoherence rotation V of its\n"
     "input size made from SEED (mpq.h, \"AN INCOHERENCE ROTATION\") and\n"
     "quantize W V^T; products multiply by V x. The planners' and requant's\n"
     "statistics must come from `mpq calibrate --rotate SEED`. Pays under\n"
     "GPTQ (SmolLM2 3-bit: +156 % -> +55 %); hurts plain rounding (rtn),\n"
     "which it warns of"},
    {"--static-groups", CLI_FLAG, QA(static_groups), NULL, 0, 0, NULL, NULL, NULL,
     "gptq: every group's scale from the weights before error feedback"},
    {"--damp", CLI_DOUBLE, QA(damp), "X", 0, 1e6, NULL, NULL, "0.01",
     "gptq: X * mean(diag X^T X) added to the diagonal (0: none)"},
    {"--stats", CLI_STR, QA(stats), "FILE", 0, 0, NULL, NULL, NULL,
     "what `mpq calibrate` wrote: --salience, --calib and --hessian at once"},
    {"--salience", CLI_STR, QA(salience), "FILE", 0, 0, NULL, NULL, NULL,
     "safetensors with one tensor per quantized weight, named as the weight\n"
     "or as the weight with the suffix mpq calibrate writes:\n"
     "  sfmp    rows x cols   Fisher diagonal (.fisher)\n"
     "  mixllm  rows          output-channel salience (.mixllm)\n"
     "  requant rows x cols   PQI along W -> Q(W) (.pqi)\n"
     "  mxsens  cols          diag(X^T X) (.xtx_diag); optional scalar\n"
     "                        '<name>.layer_sensitivity' in [0, 1]\n"
     "finite and >= 0"},
    {"--calib", CLI_STR, QA(calib), "FILE", 0, 0, NULL, NULL, NULL,
     "safetensors with activations tokens x cols per weight name (or\n"
     "'<name>.awq'): awq and --quantizer awq, mxsens (diag(X^T X) when no\n"
     "--salience)"},
    {"--hessian", CLI_STR, QA(hessian), "FILE", 0, 0, NULL, NULL, NULL,
     "gptq, --act-order: X^T X of each weight's inputs, cols x cols, named as\n"
     "the weight or '<name>.xtx' (`mpq calibrate --stats xtx`)"},
    {"--sequential", CLI_STR, QA(sequential), "TEXT", 0, 0, NULL, NULL, NULL,
     "gptq: each layer's X^T X from the calibration text TEXT run through\n"
     "the layers before it as they are quantized (GPTQ's order; needs a\n"
     "model input and every linear map of its layers; --hessian then only\n"
     "for sfmp's act-order planning)"},
    {"--seq-windows", CLI_INT, QA(seq_windows), "N", 1, 1 << 20, NULL, NULL, "64",
     "--sequential: windows taken evenly from TEXT"},
    {"--seq-length", CLI_INT, QA(seq_length), "N", 2, 1 << 16, NULL, NULL, "512", "--sequential: tokens per window"},
    {"--embed-bits", CLI_INT, QA(embed_bits), "B", 0, 8, NULL, NULL, "0",
     "the embedding and head by round-to-nearest at B bits, g128 (0: kept)"},
    {"--include", CLI_LIST, QA(include), "GLOB", 0, 0, NULL, NULL, NULL,
     "quantize only matching names (repeatable; default all)"},
    {"--exclude", CLI_LIST, QA(exclude), "GLOB", 0, 0, NULL, NULL, NULL,
     "never quantize matching names (repeatable), e.g. '*.layers.0.*'"},
    {"--threads", CLI_INT, QA(threads), "T", 1, 4096, NULL, NULL, NULL, "OpenMP threads (default all)"},
    {"--quiet", CLI_FLAG, QA(quiet), NULL, 0, 0, NULL, NULL, NULL, "no progress and no table"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};
#undef QA

static const cli_spec qargs_spec = {
    "quantize",
    "[options] IN OUT.safetensors",
    "IN is a safetensors file, a GGUF file or a Hugging Face checkpoint directory.\n"
    "\n"
    "A model (GGUF, a checkpoint directory, or safetensors with a config.json beside it\n"
    "or in its metadata): the linear maps of its layers whose names match --include and\n"
    "not --exclude are quantized by the method; the token embedding and an untied output\n"
    "head stay as they are unless --embed-bits asks for round-to-nearest; everything\n"
    "else is copied. The maps go through the method in the model's order (layer by\n"
    "layer, q k v o gate up down), whatever the order of the file.\n"
    "OUT carries config.json, tokenizer.json and tokenizer_config.json in its metadata,\n"
    "so that `mpq eval` and `mpq run` take it as they take IN. Tensor names and the row\n"
    "order of q and k stay as IN has them (GGUF: adjacent rotary pairs; the config says so).\n"
    "\n"
    "Any other safetensors file: every 2-D float tensor (F32, F16, BF16, F64) whose name\n"
    "matches --include and not --exclude is quantized by the method, except embeddings\n"
    "and output heads (names matching *embed*, *tok_emb*, *wte*, *lm_head*, or output.weight),\n"
    "which --embed-bits governs as above; the rest is copied.\n"
    "\n"
    "A quantized tensor becomes an mpq packed matrix (a U8 tensor described by\n"
    "__metadata__, see mpq_io.h). GGUF tensors that are copied are written as F32 (F16\n"
    "and BF16 stay so). Every method is a recipe of mpq.h (section 13): the widths\n"
    "(uniform or planned), then act-order, AWQ, GPTQ or rounding, and ReQuant's sparse part.",
    {{qargs_opts, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}},
    2,
    2,
    "Exit codes: 0 ok, 1 usage, 2 bad input file, 3 output not written, 4 quantization failed."};

/* What the options ask of the recipe, checked before anything is read:
   fills r (its budget from --bpw unless "min"; qargs_budget settles it
   once the tensors are known). 0, or EXIT_USAGE after a message. */
static inline int qargs_recipe(const qargs *q, const cli_seen *seen, mpq_recipe *r)
{
    char m[16], qn[16];
    cli_nth(QARGS_METHODS, q->method, m, sizeof m);
    cli_nth(QARGS_QUANTIZERS, q->quantizer, qn, sizeof qn);
    const int planner = q->method == M_SFMP || q->method == M_MIXLLM || q->method == M_MXSENS || q->method == M_AUTO;
    const int given_q = cli_was_given(seen, "--quantizer");
    memset(r, 0, sizeof *r);
    if (q->method == M_AUTO) {
        const int b = cli_was_given(seen, "--bpw"), k = cli_was_given(seen, "--max-kld");
        if (b == k) return fail(EXIT_USAGE, "quantize --method auto: needs --bpw X or --max-kld K (one of them)");
        if (b && q->bpw.lowest) return fail(EXIT_USAGE, "quantize --method auto: --bpw min is for sfmp and mxsens");
        if (k && !(q->max_kld > 0)) return fail(EXIT_USAGE, "quantize --max-kld %g: a bound above 0", q->max_kld);
        if (q->requant || q->format == 1)
            return fail(EXIT_USAGE, "quantize --method auto: bit-plane widths, without --requant");
    } else if (cli_was_given(seen, "--max-kld") || q->measure) {
        return fail(EXIT_USAGE, "quantize: --max-kld and --measure are for --method auto");
    }
    if (q->group % 8)
        return fail(EXIT_USAGE, "quantize --group %d: a group is a multiple of 8 columns (%d or %d, say)", q->group,
                    q->group / 8 * 8, q->group / 8 * 8 + 8);
    if ((q->method == M_SFMP || q->method == M_MXSENS) && !cli_was_given(seen, "--bpw"))
        return fail(EXIT_USAGE, "quantize --method %s: needs --bpw", m);
    if (given_q) {
        const int ok = planner || (q->method == M_REQUANT && q->quantizer <= Q_AWQ) ||
            (q->method == M_GPTQ && q->quantizer >= Q_GPTQ);
        if (!ok)
            return fail(EXIT_USAGE,
                        "quantize --quantizer %s: not for --method %s (sfmp, mixllm, mxsens: rtn, awq, gptq "
                        "or awq+gptq; requant: rtn or awq; gptq: gptq or awq+gptq)",
                        qn, m);
    }
    r->awq = q->method == M_AWQ || (given_q && (q->quantizer == Q_AWQ || q->quantizer == Q_AWQ_GPTQ));
    r->gptq = q->method == M_GPTQ || (given_q && q->quantizer >= Q_GPTQ);
    r->requant = q->method == M_REQUANT || q->requant;
    if (q->requant && (r->gptq || !(planner || q->method == M_RTN || q->method == M_AWQ)))
        return fail(EXIT_USAGE,
                    "quantize --requant: for rtn, awq and the planners under --quantizer rtn or awq "
                    "(the dense part is rounded, not GPTQ's)");
    if ((q->act_order || q->static_groups || cli_was_given(seen, "--damp")) && !r->gptq)
        return fail(EXIT_USAGE,
                    "quantize: --act-order, --static-groups and --damp are for GPTQ (--method gptq or "
                    "--quantizer gptq)");
    if ((q->sequential || cli_was_given(seen, "--seq-windows") || cli_was_given(seen, "--seq-length")) && !r->gptq)
        return fail(EXIT_USAGE, "quantize --sequential: changes GPTQ's X^T X only (--method gptq or --quantizer gptq)");
    if (q->act_order && (q->method == M_MXSENS || (q->method == M_SFMP && (q->reorder & MPQ_REORDER_COLS))))
        return fail(EXIT_USAGE, "quantize --act-order: not with %s, which orders the columns itself",
                    q->method == M_MXSENS ? "mxsens" : "--reorder cols");
    if (q->format == 1 && q->method != M_RTN && q->method != M_GPTQ)
        return fail(EXIT_USAGE, "quantize: --format mxint is for rtn and gptq (mxsens plans MXINT itself)");
    if (q->format == 1 && q->bits < 2) return fail(EXIT_USAGE, "quantize --format mxint: --bits must be 2..8");
    if ((q->method == M_MXSENS || q->format == 1) && q->group && q->group != MPQ_MX_BLOCK)
        return fail(EXIT_USAGE, "quantize: MXINT blocks are %d columns; --group %d does not apply", MPQ_MX_BLOCK,
                    q->group);
    r->planner = q->method == M_SFMP ? MPQ_PLANNER_SFMP
        : q->method == M_MIXLLM      ? MPQ_PLANNER_MIXLLM
        : q->method == M_MXSENS      ? MPQ_PLANNER_MXSENS
        : q->method == M_AUTO        ? MPQ_PLANNER_KLD
                                     : MPQ_PLANNER_NONE;
    r->format = q->format == 1 ? MPQ_FORMAT_MXINT : MPQ_FORMAT_BITPLANE;
    r->bits = q->bits, r->symmetric = q->symmetric, r->group = q->group, r->block_rows = q->block_rows;
    r->bpw = q->bpw.lowest ? 0 : q->bpw.value, r->reorder = q->reorder, r->fraction = q->fraction;
    r->act_order = q->act_order, r->max_kld = q->max_kld;
    if (q->method == M_AUTO && q->max_kld > 0) r->bpw = 0;
    r->gptq_opts.static_groups = q->static_groups;
    r->gptq_opts.damp = q->damp == 0 ? -1.0 : q->damp; /* the library: negative is none */
    r->outliers = q->outliers == 0 ? -1.0 : q->outliers, r->significant = q->significant == 0 ? -1.0 : q->significant;
    r->rotate = q->rotate.on, r->rotate_seed = q->rotate.seed;
    if (r->rotate && !r->gptq && !r->awq && !q->quiet)
        fprintf(stderr,
                "mpq: quantize --rotate with plain rounding: on SmolLM2 the rotation made it worse (3-bit "
                "+465 %% -> +2994 %% perplexity); it pays under GPTQ (--method gptq)\n");
    return 0;
}

/* The budget, now that the maps are known: min(+X) resolved, a budget
   below the lowest the planner meets refused (naming the tensor that
   costs the most), one above its highest capped with a note. 0, or
   EXIT_USAGE after a message. */
static inline int qargs_budget(const qargs *q, mpq_recipe *r, const mpq_recipe_map *maps, int n)
{
    if (r->planner != MPQ_PLANNER_SFMP && r->planner != MPQ_PLANNER_MXSENS) return 0;
    double lo = 0, hi = 0;
    int worst = 0;
    const mpq_status st = mpq_recipe_bpw_range(r, maps, n, &lo, &hi, &worst);
    if (st != MPQ_OK) return fail(EXIT_USAGE, "quantize --bpw: %s", mpq_status_str(st));
    if (q->bpw.lowest) {
        r->bpw = lo + q->bpw.value;
        return 0;
    }
    if (r->bpw < lo) {
        double wlo = 0, whi = 0;
        mpq_recipe_bpw_range(r, &maps[worst], 1, &wlo, &whi, NULL);
        if (r->planner == MPQ_PLANNER_SFMP)
            return fail(EXIT_USAGE,
                        "quantize --bpw %g: the lowest budget these %d tensors allow is %.4f bits per weight "
                        "(1-bit weights and their scales and zeros at group %d); tensor '%s' alone needs %.4f",
                        r->bpw, n, lo, r->group ? r->group : 128, maps[worst].name, wlo);
        return fail(EXIT_USAGE,
                    "quantize --bpw %g: the lowest budget MXSens meets for these %d tensors is %.4f bits per weight "
                    "(each one's 32 most sensitive columns at 8 bits, the rest at 4, and the exponents); tensor "
                    "'%s' alone needs %.4f",
                    r->bpw, n, lo, maps[worst].name, wlo);
    }
    if (r->bpw > hi && r->planner == MPQ_PLANNER_SFMP && !q->quiet)
        fprintf(stderr, "mpq: quantize --bpw %g: capped at %.4f bits per weight (every block at 8 bits)\n", r->bpw, hi);
    return 0;
}

/* --method auto: what --measure holds for these maps (mpq_measure_read),
   checked against the recipe (the quantizer, group, act-order, symmetry
   and basis it was measured with), the model (cfg, when given: its layers,
   dim and vocabulary) and the calibration text (text_hash, when not 0:
   that of the statistics beside it); then the budget or the bound against
   the range the measurements allow. On success r's widths and bound are
   set, maps[i].kld points into *kld (n x nbits; free it) and *info holds
   the file's description. 0, or an exit code after a message naming the
   file, the tensor or the budget. */
static inline int qargs_measured(const qargs *q, mpq_recipe *r, mpq_recipe_map *maps, int n, const mpq_llm_config *cfg,
                                 uint64_t text_hash, mpq_measure_info *info, double **kld)
{
    mpq_io_err e;
    mpq_st_file *f = NULL;
    *kld = NULL;
    if (mpq_st_open(q->measure, &f, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    const char **names = (const char **)malloc(sizeof(char *) * (size_t)n);
    double *v = (double *)malloc(sizeof(double) * (size_t)n * 8);
    int rc = names && v ? 0 : fail(EXIT_QUANT, "out of memory");
    for (int i = 0; !rc && i < n; i++) names[i] = maps[i].name;
    if (!rc && mpq_measure_read(f, q->measure, names, n, info, v, &e) != MPQ_OK) rc = fail(EXIT_INPUT, "%s", e.msg);
    mpq_st_close(f);
    free(names);
    const char *qn = r->awq && r->gptq ? "awq+gptq" : r->gptq ? "gptq" : r->awq ? "awq" : "rtn";
    if (!rc && strcmp(info->quantizer, qn))
        rc = fail(EXIT_INPUT, "%s: measured with quantizer %s, this one is %s (measure again with its options)",
                  q->measure, info->quantizer, qn);
    const char *const keys[] = {"group", "act_order", "symmetric", "rotate"};
    const int had[] = {info->group, info->act_order, info->symmetric, info->rotate},
              want[] = {r->group ? r->group : 128, r->act_order, r->symmetric, r->rotate};
    for (int k = 0; k < 4 && !rc; k++)
        if (had[k] != want[k])
            rc = fail(EXIT_INPUT, "%s: measured with %s %d, this quantizer has %d (measure again with its options)",
                      q->measure, keys[k], had[k], want[k]);
    if (!rc && r->rotate && info->rotate_seed != r->rotate_seed)
        rc = fail(EXIT_INPUT, "%s: measured under rotation seed %llu, not %llu", q->measure,
                  (unsigned long long)info->rotate_seed, (unsigned long long)r->rotate_seed);
    if (!rc && cfg && (info->layers != cfg->layers || info->dim != cfg->dim || info->vocab != cfg->vocab))
        rc = fail(EXIT_INPUT,
                  "%s: measured on %s (%d layers, dim %d, vocabulary %d), not this model (%d layers, dim %d, "
                  "vocabulary %d)",
                  q->measure, info->model, info->layers, info->dim, info->vocab, cfg->layers, cfg->dim, cfg->vocab);
    if (!rc && text_hash && info->text_hash != text_hash)
        rc = fail(EXIT_INPUT,
                  "%s: measured on a text of hash %016llx; the statistics beside it are of another text (%016llx)",
                  q->measure, (unsigned long long)info->text_hash, (unsigned long long)text_hash);
    r->kld_widths = info->bits, r->kld_nwidths = info->nbits;
    for (int i = 0; !rc && i < n; i++) maps[i].kld = v + (size_t)i * info->nbits;
    mpq_measured_layer *L = rc ? NULL : (mpq_measured_layer *)calloc((size_t)n, sizeof *L);
    if (!rc && !L) rc = fail(EXIT_QUANT, "out of memory");
    for (int i = 0; !rc && i < n; i++) L[i].rows = maps[i].rows, L[i].cols = maps[i].cols, L[i].loss = maps[i].kld;
    mpq_measured_desc d;
    memset(&d, 0, sizeof d);
    d.widths = info->bits, d.nwidths = info->nbits, d.group = r->group, d.block_rows = r->block_rows;
    d.symmetric = r->symmetric;
    double blo = 0, bhi = 0, llo = 0, lhi = 0;
    mpq_status st = rc ? MPQ_OK : mpq_plan_measured_range(L, n, &d, &blo, &bhi, &llo, &lhi);
    free(L);
    if (!rc && st != MPQ_OK) rc = fail(EXIT_INPUT, "%s: %s", q->measure, mpq_status_str(st));
    if (!rc && r->max_kld == 0 && (r->bpw < blo * (1 - 1e-12) || r->bpw > bhi * (1 + 1e-12))) /* as the library */
        rc = fail(EXIT_USAGE,
                  "quantize --method auto --bpw %g: these %d maps allow %.4f (every map at 2 bits) to %.4f bits per "
                  "weight (each at its least predicted KLD)",
                  r->bpw, n, blo, bhi);
    if (!rc && r->max_kld > 0 && (r->max_kld < llo || r->max_kld >= lhi))
        rc = fail(EXIT_USAGE,
                  "quantize --method auto --max-kld %g: the predicted KLD of these %d maps spans %.5f (the widest "
                  "plan) to %.5f (every map at 2 bits); %s",
                  r->max_kld, n, llo, lhi, r->max_kld < llo ? "no plan meets it" : "every plan meets it");
    if (rc) {
        free(v);
        v = NULL;
        for (int i = 0; i < n; i++) maps[i].kld = NULL;
    }
    *kld = v;
    return rc;
}

#endif
