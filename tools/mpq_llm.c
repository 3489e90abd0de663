/* mpq_llm.c - the model commands of the mpq tool: eval, run, speed,
   calibrate, gen-eval (schedule is in schedule.c), and what they share
   (model_cmd.h).

   MODEL is a GGUF file, a Hugging Face checkpoint directory or a
   safetensors file (one `mpq quantize` wrote, or a checkpoint with its
   config.json beside it). Exit codes as for the other commands: 1 usage, 2
   a model or text that cannot be read or does not fit, 4 a failure while
   running. */
#define _XOPEN_SOURCE 700
#include "mpq.h"
#include "mpq_model.h"
#ifdef MPQ_HAVE_CUDA
#include "mpq_cuda.h"
#endif
#include "model_cmd.h"
#include "tool.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---------------------------------------------------------------------------
   what the commands share (model_cmd.h)
   ------------------------------------------------------------------------ */

void model_unload(loaded *L)
{
    if (L->m && L->have_be) mpq_llm_use_backend(L->m, NULL);
#ifdef MPQ_HAVE_CUDA
    if (L->have_be) mpq_cuda_backend_destroy(&L->be);
#endif
    mpq_llm_free(L->m);
    memset(L, 0, sizeof *L);
}

/* The model's packed matrices on the GPU backend o asks for. */
static int use_device(const llm_opts *o, loaded *L)
{
#ifdef MPQ_HAVE_CUDA
    mpq_status st = o->device == DEVICE_CUDA ? mpq_cuda_backend(0, &L->be) : mpq_cuda_backend_fp16(0, &L->be);
    if (st != MPQ_OK) return fail(EXIT_INPUT, "--device %s: %s", cli_device_names[o->device], mpq_status_str(st));
    L->have_be = 1;
    if ((st = mpq_llm_use_backend(L->m, &L->be)) != MPQ_OK)
        return fail(EXIT_QUANT, "--device %s: uploading the packed matrices: %s", cli_device_names[o->device],
                    mpq_status_str(st));
    return 0;
#else
    (void)L;
    return fail(EXIT_USAGE, "--device %s: this build has no CUDA backend", cli_device_names[o->device]);
#endif
}

int model_load(const char *path, const llm_opts *o, loaded *L)
{
    memset(L, 0, sizeof *L);
#ifdef _OPENMP
    if (o->threads) omp_set_num_threads(o->threads);
#endif
    mpq_io_err e;
    const double t0 = cli_now();
    if (o->a8 && o->device == DEVICE_CUDA_FP16)
        return fail(EXIT_USAGE,
                    "--a8: 8-bit activations run on --device cpu or cuda (cuda-fp16 holds float16 weights)");
    if (!mpq_path_available((mpq_path)o->path))
        return fail(EXIT_USAGE, "--cpu-path %s: this build or this CPU does not have it",
                    mpq_path_name((mpq_path)o->path));
    mpq_llm_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.in_place = !o->floats;
    if (mpq_llm_load_with(path, &lo, &L->m, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    L->m->a8 = o->a8;
    L->m->cpu_path = (mpq_path)o->path;
    int rc = o->device != DEVICE_CPU ? use_device(o, L) : 0;
    if (rc) {
        model_unload(L);
        return rc;
    }
    if (!o->quiet) {
        const mpq_llm_config *c = &L->m->c;
        const double bpw = mpq_llm_bpw(L->m, 2, -1);
        char lin[64];
        if (bpw > 0)
            snprintf(lin, sizeof lin, "linear maps packed, %.3f bpw", bpw);
        else
            snprintf(lin, sizeof lin, "float weights%s", L->m->src ? " (in place)" : "");
        fprintf(stderr,
                "mpq: %s: %s, %d layers, dim %d, %d/%d heads, vocab %d; %s; %.1f MB of weights; loaded in "
                "%.1f s\n",
                path, c->arch, c->layers, c->dim, c->heads, c->kv_heads, c->vocab, lin,
                (double)mpq_llm_weight_bytes(L->m) / 1e6, cli_now() - t0);
    }
    return 0;
}

int text_read(const char *path, char **text, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fail(EXIT_INPUT, "%s: cannot open: %s", path, strerror(errno));
    char *b = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 65536) {
            cap = cap ? 2 * cap : 1 << 20;
            char *nb = (char *)realloc(b, cap + 1);
            if (!nb) {
                free(b);
                fclose(f);
                return fail(EXIT_INPUT, "%s: out of memory", path);
            }
            b = nb;
        }
        const size_t k = fread(b + len, 1, cap - len, f);
        len += k;
        if (k == 0) break;
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        return fail(EXIT_INPUT, "%s: read failed", path);
    }
    b[len] = 0;
    *text = b, *n = len;
    return 0;
}

/* "P:S@T,S@T,..." -> a schedule. */
static int schedule_parse(const char *v, mpq_pmpd_schedule *s)
{
    memset(s, 0, sizeof *s);
    char *end;
    long p = strtol(v, &end, 10);
    if (end == v || *end != ':' || p < 0 || p > 7) return 0;
    s->prefill_skip = (int)p;
    const char *q = end + 1;
    while (*q) {
        if (s->nlevels == MPQ_PMPD_MAX_LEVELS) return 0;
        long k = strtol(q, &end, 10);
        if (end == q || *end != '@' || k < 0 || k > 7) return 0;
        q = end + 1;
        long t = strtol(q, &end, 10);
        if (end == q || t < 0) return 0;
        s->skip[s->nlevels] = (int)k, s->start[s->nlevels] = t, s->nlevels++;
        q = end;
        if (*q == ',')
            q++;
        else if (*q)
            return 0;
    }
    return s->nlevels > 0 && mpq_pmpd_validate(s) == MPQ_OK;
}

int schedule_read(const char *v, mpq_pmpd_schedule *s)
{
    if (schedule_parse(v, s)) return 1;
    FILE *f = fopen(v, "r");
    if (!f) return 0;
    char line[512];
    const int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok) return 0;
    line[strcspn(line, "\r\n #")] = 0;
    return schedule_parse(line, s);
}

void schedule_text(const mpq_pmpd_schedule *s, char *buf, size_t cap)
{
    int k = snprintf(buf, cap, "%d:", s->prefill_skip);
    for (int i = 0; i < s->nlevels && k > 0 && (size_t)k < cap; i++)
        k += snprintf(buf + k, cap - (size_t)k, "%s%d@%ld", i ? "," : "", s->skip[i], s->start[i]);
}

int schedule_arg_parse(const char *v, void *field)
{
    schedule_arg *a = (schedule_arg *)field;
    a->text = v;
    a->learned = !strncmp(v, "learned:", 8);
    return a->learned || schedule_read(v, &a->s);
}

/* ---------------------------------------------------------------------------
   eval
   ------------------------------------------------------------------------ */

typedef struct eval_args {
    llm_opts lo;
    int ctx, chunks, batch, kl_top;
    const char *kl_base, *kl;
    mpq_pmpd_schedule schedule;
} eval_args;

/* A static PMPD schedule "P:S@T,..." (or a file whose first line is one). */
static int eval_schedule_parse(const char *v, void *field)
{
    return strncmp(v, "learned:", 8) && schedule_read(v, (mpq_pmpd_schedule *)field);
}

static const cli_opt eval_opts[] = {
    {"--ctx", CLI_INT, CLI_AT(eval_args, ctx), "N", 4, 1 << 20, NULL, NULL, "512",
     "tokens per chunk (with --kl: the base file's)"},
    {"--chunks", CLI_INT, CLI_AT(eval_args, chunks), "N", 1, INT32_MAX, NULL, NULL, NULL,
     "evaluate at most N chunks (default all; with --kl: the base file's)"},
    {"--batch", CLI_INT, CLI_AT(eval_args, batch), "N", 1, 4096, NULL, NULL, "64", "tokens per forward piece"},
    {"--schedule", CLI_PARSE, CLI_AT(eval_args, schedule), "SPEC", 0, 0,
     "P:S@T,... (PMPD: prefill at skip P, then skip S from scored token T on), or a file whose first line is one",
     eval_schedule_parse, NULL,
     "score the second half of each chunk at the schedule's precisions, as\n"
     "generation would run them (the first half is the prompt)"},
    {"--kl-base", CLI_STR, CLI_AT(eval_args, kl_base), "FILE", 0, 0, NULL, NULL, NULL,
     "record this model's predictions at every scored position into FILE\n"
     "(safetensors): the reference for --kl"},
    {"--kl-top", CLI_INT, CLI_AT(eval_args, kl_top), "K", 1, 1 << 24, NULL, NULL, "1024",
     "with --kl-base: tokens kept per position (8 bytes each); the rest of the\n"
     "vocabulary counts as one outcome (K of the vocabulary's size or more: the\n"
     "full divergence)"},
    {"--kl", CLI_STR, CLI_AT(eval_args, kl), "FILE", 0, 0, NULL, NULL, NULL,
     "KL divergence to the predictions recorded in FILE (--kl-base), for the\n"
     "same text, tokenizer, --ctx and --chunks"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};
static const cli_spec eval_spec = {
    "eval",
    "[options] " MODEL_TEXT,
    "Perplexity of MODEL on the text file TEXT (UTF-8), computed as llama.cpp's\n"
    "llama-perplexity computes it: the text (less one final newline) is tokenized, BOS\n"
    "first when the model asks for it; the tokens are cut into chunks of --ctx, the\n"
    "remainder dropped; each chunk starts from an empty cache, its first token replaced\n"
    "by BOS when the model adds BOS, and the second half of it is scored. Prints\n"
    "ppl +/- its standard error, the tokens scored, and tokens per second.\n"
    "\n"
    "KL divergence, as llama-perplexity --kl-divergence reports it: run the reference\n"
    "model once with --kl-base FILE, then any model on the same TEXT with --kl FILE.\n"
    "Prints the mean KL divergence of the model's next-token distributions from the\n"
    "reference's (+/- its standard error), its median, 90th and 99th percentiles and\n"
    "maximum over the scored positions, how often the two agree on the most probable\n"
    "token, and Delta p, the change in the probability of the text's next token. The\n"
    "divergence is over the reference's --kl-top tokens and the rest as one outcome\n"
    "(at most the full divergence; equal to it when K covers the vocabulary).",
    {{eval_opts, 0}, {cli_skip_opts, CLI_AT(eval_args, lo)}, {cli_model_opts, CLI_AT(eval_args, lo)}, {NULL, 0}},
    2,
    2,
    "Exit status 2 for a KL base file that is unreadable, or was recorded for\n"
    "another text, tokenizer, --ctx or --chunks."};

static void eval_step(void *user, int done, int total, double ppl, double seconds)
{
    char what[64];
    snprintf(what, sizeof what, " ppl %.4f, %.1f s", ppl, seconds);
    (void)total;
    progress_show((progress *)user, done, what);
}

static void eval_print_kl(const mpq_kl_result *k)
{
    printf("KL divergence: %.6f +/- %.6f (median %.6f, 90%% %.6f, 99%% %.6f, max %.6f) over %ld positions\n", k->kld,
           k->kld_err, k->median, k->p90, k->p99, k->max, k->count);
    printf("same top token: %.3f +/- %.3f %%\n", 100 * k->same_top, 100 * k->same_top_err);
    printf("Delta p of the next token: mean %.3f %%, mean |Delta p| %.3f %%, RMS %.3f %%\n", 100 * k->dp_mean,
           100 * k->dp_abs, 100 * k->dp_rms);
}

/* The record's source: the model, the text and the reference's perplexity. */
static char *eval_kl_source(const char *model, const char *text, const mpq_ppl_result *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "text", text);
    cJSON_AddNumberToObject(o, "ppl", r->ppl);
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return j;
}

/* Perplexity (and KL divergence) over the tokens of `what`. */
static int eval_tokens(const eval_args *a, const char *model, const mpq_llm *m, const char *what, const int32_t *tok,
                       size_t nt, const mpq_kl_base *ref)
{
    mpq_ppl_opts po;
    memset(&po, 0, sizeof po);
    po.ctx = a->ctx, po.chunks = a->chunks, po.batch = a->batch, po.skip_planes = a->lo.skip;
    po.schedule = a->schedule.nlevels ? &a->schedule : NULL;
    mpq_kl_base rec;
    memset(&rec, 0, sizeof rec);
    if (a->kl_base) po.kl_record = &rec, po.kl_top = a->kl_top;
    po.kl_ref = ref;
    const size_t chunks = nt / (size_t)po.ctx;
    const int run = (int)(po.chunks && (size_t)po.chunks < chunks ? (size_t)po.chunks : chunks);
    if (!a->lo.quiet) fprintf(stderr, "mpq: %s: %zu tokens; %d of %zu chunks of %d\n", what, nt, run, chunks, po.ctx);
    progress p;
    progress_start(&p, "mpq", !a->lo.quiet, run);
    po.progress = eval_step, po.user = &p;
    mpq_ppl_result r;
    const mpq_status st = mpq_llm_perplexity(m, tok, nt, &po, &r);
    progress_end(&p);
    if (st != MPQ_OK) return fail(EXIT_QUANT, "eval: %s", mpq_status_str(st));
    printf("perplexity: %.4f +/- %.5f over %d chunks of %d (%ld tokens scored, nll %.5f), %.1f tokens/s\n", r.ppl,
           r.ppl_err, r.chunks, po.ctx, r.count, r.nll, r.tokens_per_second);
    if (ref) eval_print_kl(&r.kl);
    if (!a->kl_base) return 0;
    char *src = eval_kl_source(model, what, &r);
    mpq_io_err e;
    const mpq_status ws = src ? mpq_kl_base_write(&rec, src, a->kl_base, &e) : MPQ_ERR_NOMEM;
    free(src);
    if (ws == MPQ_OK && !a->lo.quiet)
        fprintf(stderr, "mpq: %s: the predictions at %ld positions, %d tokens each\n", a->kl_base, rec.positions,
                rec.top);
    mpq_kl_base_free(&rec);
    return ws == MPQ_OK ? 0 : fail(EXIT_OUTPUT, "%s", ws == MPQ_ERR_NOMEM ? "out of memory" : e.msg);
}

int cmd_eval(int argc, char **argv)
{
    eval_args a;
    const char *pos[2];
    cli_seen seen;
    int npos = 0, rc = cli_parse(&eval_spec, argc, argv, &a, sizeof a, pos, &npos, &seen);
    if (rc) return rc < 0 ? 0 : rc;
    if (a.schedule.nlevels && cli_was_given(&seen, "--skip-planes"))
        return fail(EXIT_USAGE, "eval: --schedule and --skip-planes: give one");
    if (cli_was_given(&seen, "--kl-top") && !a.kl_base) return fail(EXIT_USAGE, "eval: --kl-top only with --kl-base");
    mpq_kl_base ref;
    memset(&ref, 0, sizeof ref);
    mpq_io_err e;
    if (a.kl) { /* the base decides the chunks unless they are given */
        if (mpq_kl_base_read(a.kl, &ref, &e) != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
        if (!cli_was_given(&seen, "--ctx")) a.ctx = ref.ctx;
        if (!cli_was_given(&seen, "--chunks")) a.chunks = ref.chunks;
    }
    char *text = NULL;
    size_t len = 0;
    loaded L;
    memset(&L, 0, sizeof L);
    int32_t *tok = NULL;
    size_t nt = 0;
    if ((rc = text_read(pos[1], &text, &len)) == 0) {
        if (len && text[len - 1] == '\n') len--; /* as llama.cpp reads -f */
        rc = model_load(pos[0], &a.lo, &L);
    }
    if (rc == 0 && mpq_tokenize(L.m->tok, text, len, MPQ_TOK_BOS, &tok, &nt, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", pos[1], e.msg);
    else if (rc == 0 && nt < (size_t)a.ctx)
        rc = fail(EXIT_INPUT, "%s: %zu tokens, fewer than one chunk of %d", pos[1], nt, a.ctx);
    if (rc == 0 && a.kl && mpq_kl_base_check(&ref, L.m, tok, nt, a.ctx, a.chunks, a.kl, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s (with %s and %s)", e.msg, pos[0], pos[1]);
    if (rc == 0) rc = eval_tokens(&a, pos[0], L.m, pos[1], tok, nt, a.kl ? &ref : NULL);
    free(tok);
    free(text);
    if (L.m) model_unload(&L);
    mpq_kl_base_free(&ref);
    return rc;
}

/* ---------------------------------------------------------------------------
   run
   ------------------------------------------------------------------------ */

typedef struct run_args {
    llm_opts lo;
    const char *prompt, *prompt_file, *system;
    int chat, no_special, show_special, tokens, seed, ctx;
    double temp, top_p;
    schedule_arg sched;
} run_args;

#define RA(f) CLI_AT(run_args, f)
static const cli_opt run_opts[] = {
    {"--prompt", CLI_STR, RA(prompt), "TEXT", 0, 0, NULL, NULL, NULL,
     "the prompt (or --prompt-file FILE); control tokens such as\n"
     "<|im_start|> in it are those tokens (--no-special: text)"},
    {"--prompt-file", CLI_STR, RA(prompt_file), "FILE", 0, 0, NULL, NULL, NULL, "the prompt from a file"},
    {"--chat", CLI_FLAG, RA(chat), NULL, 0, 0, NULL, NULL, NULL,
     "wrap the prompt in the model's chat format (ChatML or Llama 3)"},
    {"--system", CLI_STR, RA(system), "TEXT", 0, 0, NULL, NULL, NULL, "with --chat: a system message first"},
    {"--no-special", CLI_FLAG, RA(no_special), NULL, 0, 0, NULL, NULL, NULL, "control tokens' text is text"},
    {"--show-special", CLI_FLAG, RA(show_special), NULL, 0, 0, NULL, NULL, NULL, "print control tokens too"},
    {"-n|--tokens", CLI_INT, RA(tokens), "N", 1, 1 << 24, NULL, NULL, "128",
     "tokens to generate at most; an end token stops"},
    {"--temp", CLI_DOUBLE, RA(temp), "T", 0, 100, NULL, NULL, "0", "0 is greedy; else sample from softmax(logits / T)"},
    {"--top-p", CLI_DOUBLE, RA(top_p), "P", 0, 1, NULL, NULL, "1",
     "sample among the likeliest tokens holding P of the mass"},
    {"--seed", CLI_INT, RA(seed), "S", 0, INT32_MAX, NULL, NULL, "1", "sampling seed"},
    {"--ctx", CLI_INT, RA(ctx), "N", 2, 1 << 24, NULL, NULL, NULL,
     "cache size (default: prompt + tokens, at most the model's)"},
    {"--schedule", CLI_PARSE, RA(sched), "SPEC", 0, 0, SCHEDULE_WHAT, schedule_arg_parse, NULL,
     "PMPD: P:S@T,.. the prompt at skip P; decoded token T onwards at skip S,\n"
     "T and S increasing (e.g. 0:0@0,1@32,2@96); the stderr report gives the\n"
     "decode time per token at each level; or a file whose first line is one\n"
     "(what `mpq schedule` writes); or learned:FILE, PMPD's learned scheduler\n"
     "(`mpq schedule --learned`): the schedule of this prompt from its cache"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};
#undef RA
static const cli_spec run_spec = {
    "run",
    "[options] MODEL --prompt TEXT",
    "Generates text after a prompt with a KV cache: the prompt in one batched pass, then a\n"
    "token at a time, printed as it comes; then the prompt and decode rates on stderr.",
    {{run_opts, 0}, {cli_skip_opts, CLI_AT(run_args, lo)}, {cli_model_opts, CLI_AT(run_args, lo)}, {NULL, 0}},
    1,
    1,
    NULL};

/* The prompt in the model's chat format: ChatML (<|im_start|>) or Llama 3
   (<|start_header_id|>); NULL when the vocabulary has neither. */
static char *chat_prompt(const mpq_tokenizer *t, const char *system, const char *user)
{
    const size_t n = strlen(user) + (system ? strlen(system) : 0) + 256;
    char *s = (char *)malloc(n);
    if (!s) return NULL;
    if (mpq_token_find(t, "<|im_start|>") >= 0 && mpq_token_find(t, "<|im_end|>") >= 0) {
        int k = 0;
        if (system) k = snprintf(s, n, "<|im_start|>system\n%s<|im_end|>\n", system);
        snprintf(s + k, n - (size_t)k, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", user);
    } else if (mpq_token_find(t, "<|start_header_id|>") >= 0 && mpq_token_find(t, "<|eot_id|>") >= 0) {
        int k = 0;
        if (system) k = snprintf(s, n, "<|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>", system);
        snprintf(s + k, n - (size_t)k,
                 "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|><|start_header_id|>assistant"
                 "<|end_header_id|>\n\n",
                 user);
    } else {
        free(s);
        return NULL;
    }
    return s;
}

typedef struct stream {
    const mpq_tokenizer *t;
    int show_special;
} stream;

static int print_token(void *user, int32_t tok)
{
    const stream *s = (const stream *)user;
    if (mpq_token_is_special(s->t, tok) && !s->show_special) return 0;
    size_t n = 0;
    const char *b = mpq_token_bytes(s->t, tok, &n);
    if (!b) return 0; /* an embedding row past the vocabulary: no text */
    fwrite(b, 1, n, stdout);
    fflush(stdout);
    return 0;
}

/* The prompt's tokens: the text (a file or --prompt), in the chat format
   with --chat. */
static int run_prompt(const run_args *a, const mpq_llm *m, int32_t **tok, size_t *nt)
{
    char *ptext = NULL;
    size_t plen = 0;
    int rc = 0;
    if (a->prompt_file && (rc = text_read(a->prompt_file, &ptext, &plen)) != 0) return rc;
    if (a->prompt && !(ptext = strdup(a->prompt))) return fail(EXIT_INPUT, "out of memory");
    if (a->prompt) plen = strlen(ptext);
    const char *what = a->prompt_file ? a->prompt_file : "--prompt";
    if (a->chat) {
        char *c = memchr(ptext, 0, plen) ? NULL : chat_prompt(m->tok, a->system, ptext);
        if (!c)
            rc = fail(EXIT_INPUT, "%s: --chat: the vocabulary has no chat tokens mpq knows (ChatML, Llama 3)", m->path);
        free(ptext);
        ptext = c, plen = c ? strlen(c) : 0;
    }
    mpq_io_err e;
    if (!rc &&
        mpq_tokenize(m->tok, ptext, plen, MPQ_TOK_BOS | (a->no_special ? 0 : MPQ_TOK_SPECIAL), tok, nt, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", what, e.msg);
    if (!rc && *nt == 0) rc = fail(EXIT_INPUT, "%s: the prompt is empty", what);
    free(ptext);
    return rc;
}

/* The rates and the schedule that ran, on stderr. */
static void run_report(const mpq_llm *m, const mpq_gen_result *r, const mpq_pmpd_learned *learned)
{
    const int dec = r->tokens > 0 ? r->tokens - 1 : 0; /* the first token comes from the prompt's pass */
    fprintf(stderr, "mpq: prompt: %d tokens in %.3f s (%.1f tokens/s); decode: %d tokens in %.3f s (%.1f tokens/s)%s\n",
            r->prompt_tokens, r->prefill_seconds, r->prompt_tokens / r->prefill_seconds, dec, r->decode_seconds,
            r->decode_seconds > 0 ? dec / r->decode_seconds : 0.0, r->ended ? "; stopped at an end token" : "");
    if (learned) {
        char t[128];
        schedule_text(&r->schedule, t, sizeof t);
        fprintf(stderr, "mpq: learned schedule %s (class %d of %d, predicted in %.2f ms)\n", t, r->learned_class,
                learned->classes, 1e3 * r->schedule_seconds);
    }
    for (int k = 0; k < MPQ_MAX_BITS && m->layer[0].lin[0].A.buf; k++) /* packed models only */
        if (r->tokens_at_skip[k])
            fprintf(stderr, "mpq:   skip %d (%.3f bpw read): %d tokens, %.2f ms per token\n", k, mpq_llm_bpw(m, 1, k),
                    r->tokens_at_skip[k], 1e3 * r->seconds_at_skip[k] / r->tokens_at_skip[k]);
}

int cmd_run(int argc, char **argv)
{
    run_args a;
    const char *model;
    int npos = 0, rc = cli_parse(&run_spec, argc, argv, &a, sizeof a, &model, &npos, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    if (!a.prompt == !a.prompt_file) return fail(EXIT_USAGE, "run: needs one of --prompt and --prompt-file");
    if (a.system && !a.chat) return fail(EXIT_USAGE, "run: --system goes with --chat");
    loaded L;
    if ((rc = model_load(model, &a.lo, &L)) != 0) return rc;
    mpq_pmpd_learned learned;
    memset(&learned, 0, sizeof learned);
    mpq_io_err le;
    if (a.sched.learned && mpq_pmpd_learned_read(L.m, a.sched.text + 8, &learned, &le) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s", le.msg);
    int32_t *tok = NULL, *out = NULL;
    size_t nt = 0;
    if (!rc) rc = run_prompt(&a, L.m, &tok, &nt);
    const int model_ctx = L.m->c.ctx,
              ctx = a.ctx
        ? a.ctx
        : (int)(nt + (size_t)a.tokens < (size_t)model_ctx ? nt + (size_t)a.tokens : (size_t)model_ctx);
    if (!rc && nt >= (size_t)ctx)
        rc = fail(EXIT_INPUT, "%s: a prompt of %zu tokens does not fit a context of %d (the model's: %d)",
                  a.prompt_file ? a.prompt_file : "--prompt", nt, ctx, model_ctx);
    mpq_llm_state s;
    memset(&s, 0, sizeof s);
    mpq_status st = MPQ_OK;
    if (!rc && (st = mpq_llm_state_init(L.m, ctx, 64, &s)) != MPQ_OK)
        rc = fail(EXIT_QUANT, "run: a cache of %d positions: %s", ctx, mpq_status_str(st));
    if (!rc && !(out = (int32_t *)malloc(sizeof(int32_t) * (size_t)a.tokens))) rc = fail(EXIT_QUANT, "out of memory");
    if (!rc) {
        stream sm = {L.m->tok, a.show_special};
        mpq_gen_opts g;
        memset(&g, 0, sizeof g);
        g.seed = (uint64_t)a.seed, g.skip_planes = a.lo.skip;
        g.max_tokens = a.tokens, g.temperature = (float)a.temp, g.top_p = (float)a.top_p;
        g.schedule = a.sched.text && !a.sched.learned ? &a.sched.s : NULL;
        g.learned = a.sched.learned ? &learned : NULL;
        g.on_token = print_token, g.user = &sm;
        mpq_gen_result r;
        st = mpq_llm_generate(L.m, &s, tok, (int)nt, &g, out, a.tokens, &r);
        printf("\n");
        if (st != MPQ_OK)
            rc = fail(EXIT_QUANT, "run: %s", mpq_status_str(st));
        else if (!a.lo.quiet)
            run_report(L.m, &r, a.sched.learned ? &learned : NULL);
    }
    mpq_llm_state_free(&s);
    mpq_pmpd_learned_free(&learned);
    free(out);
    free(tok);
    model_unload(&L);
    return rc;
}

/* ---------------------------------------------------------------------------
   speed
   ------------------------------------------------------------------------ */

typedef struct speed_args {
    llm_opts lo;
    int np, ng, nb, reps;
} speed_args;

static const cli_opt speed_opts[] = {
    {"-p", CLI_INT, CLI_AT(speed_args, np), "N", 0, 1 << 20, NULL, NULL, "128",
     "prompt tokens (0 skips the prompt test)"},
    {"-n", CLI_INT, CLI_AT(speed_args, ng), "N", 0, 1 << 20, NULL, NULL, "64",
     "generated tokens (0 skips the generation test)"},
    {"-b", CLI_INT, CLI_AT(speed_args, nb), "B", 1, 512, NULL, NULL, "1", "sequences generated together, at most 512"},
    {"-r", CLI_INT, CLI_AT(speed_args, reps), "N", 1, 1000, NULL, NULL, "5", "repetitions"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};
static const cli_spec speed_spec = {
    "speed",
    "[options] MODEL",
    "Tokens per second as llama.cpp's llama-bench measures them: a prompt of -p tokens in\n"
    "one batched pass from an empty cache (pp), and -n tokens generated one at a time from\n"
    "an empty cache (tg); each -r times after one warm-up, mean +/- standard deviation.\n"
    "With -b B, B sequences are generated together (a server's B users): each step\n"
    "runs the linear maps on B tokens at once, and tokens/s counts all of them.\n"
    "Tokens are drawn at random (the time does not depend on them).",
    {{speed_opts, 0}, {cli_skip_opts, CLI_AT(speed_args, lo)}, {cli_model_opts, CLI_AT(speed_args, lo)}, {NULL, 0}},
    1,
    1,
    NULL};

static void mean_sd(const double *v, int n, double *mean, double *sd)
{
    double m = 0, s = 0;
    for (int i = 0; i < n; i++) m += v[i];
    m /= n;
    for (int i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
    *mean = m, *sd = n > 1 ? sqrt(s / (n - 1)) : 0;
}

/* What one run of speed needs: the prompt's cache (also the scratch of -b
   steps), the sequences of -b, random tokens, the rates of each repetition. */
typedef struct speed_run {
    mpq_llm_state s, *seqs, **sp;
    int32_t *tok;
    float *logits;
    double *pp, *tg;
} speed_run;

/* -r repetitions after a warm-up. */
static mpq_status speed_measure(const speed_args *a, const mpq_llm *m, speed_run *S)
{
    const int np = a->np, ng = a->ng, nb = a->nb, skip = a->lo.skip;
    mpq_status st = MPQ_OK;
    progress pr;
    progress_start(&pr, "mpq", !a->lo.quiet, a->reps + 1);
    for (int rep = -1; rep < a->reps && st == MPQ_OK; rep++) { /* rep -1: warm-up */
        char what[48];
        snprintf(what, sizeof what, rep < 0 ? "speed: warm-up" : "speed: repetition %d", rep + 1);
        progress_show(&pr, rep + 1, what);
        if (np) {
            mpq_llm_state_reset(&S->s);
            const double t0 = cli_now();
            st = mpq_llm_forward(m, &S->s, S->tok, np, skip, S->logits, np - 1);
            if (rep >= 0) S->pp[rep] = np / (cli_now() - t0);
        }
        if (ng && st == MPQ_OK) {
            mpq_llm_state_reset(&S->s);
            for (int i = 0; i < nb && nb > 1; i++) mpq_llm_state_reset(&S->seqs[i]);
            const double t0 = cli_now();
            for (int i = 0; i < ng && st == MPQ_OK; i++)
                st = nb == 1 ? mpq_llm_forward(m, &S->s, &S->tok[i], 1, skip, S->logits, 0)
                             : mpq_llm_decode(m, S->sp, nb, &S->tok[(size_t)i * nb], skip, &S->s, S->logits);
            if (rep >= 0) S->tg[rep] = (double)ng * nb / (cli_now() - t0);
        }
    }
    progress_end(&pr);
    return st;
}

/* The table, as llama-bench prints it. */
static void speed_print(const speed_args *a, const char *model, const mpq_llm *m, const speed_run *S)
{
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const double bpw = mpq_llm_bpw(m, 2, -1), mb = (double)mpq_llm_weight_bytes(m) / 1e6;
    printf("| model | linear bpw | MB | threads | test | tokens/s |\n| --- | ---: | ---: | ---: | --- | ---: |\n");
    double mean, sd;
    if (a->np) {
        mean_sd(S->pp, a->reps, &mean, &sd);
        printf("| %s | %.3f | %.1f | %d | pp%d | %.2f +/- %.2f |\n", model, bpw, mb, threads, a->np, mean, sd);
    }
    if (a->ng) {
        mean_sd(S->tg, a->reps, &mean, &sd);
        char test[48];
        if (a->nb > 1)
            snprintf(test, sizeof test, "tg%d x %d sequences", a->ng, a->nb);
        else
            snprintf(test, sizeof test, "tg%d", a->ng);
        printf("| %s | %.3f | %.1f | %d | %s | %.2f +/- %.2f |\n", model, bpw, mb, threads, test, mean, sd);
    }
}

int cmd_speed(int argc, char **argv)
{
    speed_args a;
    const char *model;
    int npos = 0, rc = cli_parse(&speed_spec, argc, argv, &a, sizeof a, &model, &npos, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    if (a.np == 0 && a.ng == 0) return fail(EXIT_USAGE, "speed: -p and -n are both 0");
    loaded L;
    if ((rc = model_load(model, &a.lo, &L)) != 0) return rc;
    const int ctx = (a.np > a.ng ? a.np : a.ng) + 1, V = L.m->c.vocab, nb = a.nb;
    speed_run S;
    memset(&S, 0, sizeof S);
    S.tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)ctx * nb);
    const size_t logit_bytes = sizeof(float) * (size_t)V * nb;
    S.logits = (float *)malloc(logit_bytes);
    S.pp = (double *)calloc((size_t)a.reps, sizeof(double)), S.tg = (double *)calloc((size_t)a.reps, sizeof(double));
    S.seqs = nb > 1 ? (mpq_llm_state *)calloc((size_t)nb, sizeof *S.seqs) : NULL;
    S.sp = nb > 1 ? (mpq_llm_state **)calloc((size_t)nb, sizeof *S.sp) : NULL;
    /* the logits, which the head's products write, pinned as the states' scratch is */
    const mpq_backend *be = L.m->backend;
    const int pinned = S.logits && be && be->pin && be->unpin && be->pin(be->ctx, S.logits, logit_bytes) == MPQ_OK;
    mpq_status st = mpq_llm_state_init(L.m, ctx, 512, &S.s);
    for (int i = 0; i < nb && nb > 1 && st == MPQ_OK && S.seqs && S.sp; i++) {
        st = mpq_llm_state_init(L.m, ctx, 1, &S.seqs[i]);
        S.sp[i] = &S.seqs[i];
    }
    if (st != MPQ_OK || !S.tok || !S.logits || !S.pp || !S.tg || (nb > 1 && (!S.seqs || !S.sp))) {
        rc = fail(EXIT_QUANT, "speed: %s", st != MPQ_OK ? mpq_status_str(st) : "out of memory");
    } else {
        uint64_t r = 12345;
        for (int i = 0; i < ctx * nb; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            S.tok[i] = (int32_t)((r >> 33) % (uint64_t)mpq_tokenizer_size(L.m->tok));
        }
        if ((st = speed_measure(&a, L.m, &S)) != MPQ_OK)
            rc = fail(EXIT_QUANT, "speed: %s", mpq_status_str(st));
        else
            speed_print(&a, model, L.m, &S);
    }
    mpq_llm_state_free(&S.s);
    for (int i = 0; i < nb && S.seqs; i++) mpq_llm_state_free(&S.seqs[i]);
    if (pinned) be->unpin(be->ctx, S.logits);
    free(S.seqs), free(S.sp), free(S.tok), free(S.logits), free(S.pp), free(S.tg);
    model_unload(&L);
    return rc;
}

/* ---------------------------------------------------------------------------
   calibrate
   ------------------------------------------------------------------------ */

typedef struct calib_rotate {
    int on;
    uint64_t seed;
} calib_rotate;

typedef struct calib_args {
    llm_opts lo;
    const char *out;
    mpq_calib_opts co;
    calib_rotate rot;
    int in_memory; /* not an option: --in-memory as given */
} calib_args;

static int parse_rotate(const char *v, void *field)
{
    calib_rotate *r = (calib_rotate *)field;
    return r->on = mpq_calib_parse_seed(v, &r->seed);
}

/* "fisher,mixllm,..." -> MPQ_CALIB_* flags; 0 when a name is unknown. */
static int parse_stats(const char *v, void *field)
{
    static const char *const names[] = {"fisher", "mixllm", "acts", "pqi", "sensitivity", "xtx", "all"};
    static const unsigned flags[] = {MPQ_CALIB_FISHER,     MPQ_CALIB_MIXLLM, MPQ_CALIB_ACTS, MPQ_CALIB_PQI,
                                     MPQ_CALIB_LAYER_SENS, MPQ_CALIB_XTX,    MPQ_CALIB_ALL};
    unsigned f = 0;
    while (*v) {
        const char *e = strchr(v, ',');
        const size_t n = e ? (size_t)(e - v) : strlen(v);
        int found = 0;
        for (int k = 0; k < 7; k++)
            if (strlen(names[k]) == n && !strncmp(v, names[k], n)) f |= flags[k], found = 1;
        if (!found) return 0;
        v += n + (e != NULL);
    }
    *(unsigned *)field = f;
    return f != 0;
}

#define CA(f) CLI_AT(calib_args, co.f)
static const cli_opt calib_opts[] = {
    {"-o|--output", CLI_STR, CLI_AT(calib_args, out), "FILE", 0, 0, NULL, NULL, NULL, "the statistics file (required)"},
    {"--windows", CLI_INT, CA(windows), "N", 1, 1 << 20, NULL, NULL, "16", "calibration windows"},
    {"--length", CLI_INT, CA(length), "N", 2, 1 << 16, NULL, NULL, "512", "tokens per window"},
    {"--stats", CLI_PARSE, CA(what), "LIST", 0, 0, "a list of fisher, mixllm, acts, pqi, sensitivity, xtx, all",
     parse_stats, "all",
     "fisher,mixllm,acts,pqi,sensitivity,xtx or all (all: everything\nbut xtx, which is cols^2 / 2 per input)"},
    {"--awq-tokens", CLI_INT, CA(awq_tokens), "N", 1, 1 << 20, NULL, NULL, "128", "input rows kept per map for AWQ"},
    {"--mixllm-bits", CLI_INT, CA(mixllm_bits), "B", 1, 8, NULL, NULL, "4",
     "MixLLM's low width, the delta of its salience"},
    {"--pqi-bits", CLI_INT, CA(pqi_bits), "B", 1, 8, NULL, NULL, "3", "PQI's target: RTN at B bits, g128"},
    {"--pqi-steps", CLI_INT, CA(pqi_steps), "N", 1, 1000, NULL, NULL, "4", "gradient points along the path"},
    {"--pqi-windows", CLI_INT, CA(pqi_windows), "N", 1, 1 << 20, NULL, NULL, "4", "windows of each PQI gradient"},
    {"--sens-tokens", CLI_INT, CA(sens_tokens), "N", 2, 1 << 16, NULL, NULL, "256",
     "tokens of the layer-sensitivity passes"},
    {"--rotate", CLI_PARSE, CLI_AT(calib_args, rot), "SEED", 0, 0, "a seed, an integer 0..2^64-1", parse_rotate, NULL,
     "the statistics of W V^T, V the rotation that\n"
     "`mpq quantize --rotate SEED` stores (the awq rows and xtx\n"
     "stay in original coordinates)"},
    {"--resume", CLI_STR, CA(resume_dir), "DIR", 0, 0, NULL, NULL, NULL,
     "keep where the passes stand in the directory DIR (it must exist)\n"
     "after every layer: a run stopped at any point (Ctrl-C stops it\n"
     "after the current layer) continues from there when run again\n"
     "with the same DIR, model, text and options"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};
#undef CA
static const cli_spec calib_spec = {
    "calibrate",
    "[options] MODEL TEXT -o STATS.safetensors",
    "Runs MODEL (GGUF, Hugging Face directory, or safetensors with its config; float\n"
    "weights) forward and backward over windows of the text file TEXT and writes every\n"
    "statistic `mpq quantize --stats` reads, under each linear map's weight name N:\n"
    "  N.fisher             rows x cols  mean squared gradient of the loss (sfmp)\n"
    "  N.mixllm             rows         MixLLM's output-channel salience, eq. 4 (mixllm)\n"
    "  N.xtx_diag           cols         diag(X^T X) (mxsens)\n"
    "  N.mean_abs           cols         mean |x|\n"
    "  N.awq                tokens x cols  input rows for AWQ's search (awq, --quantizer awq)\n"
    "  N.pqi                rows x cols  PQI along W -> RTN(W) (requant)\n"
    "  N.layer_sensitivity  scalar       MXSens layer sensitivity in [0, 1] (mxsens)\n"
    "  N.xtx                cols(cols+1)/2  X^T X's lower triangle by rows, position 0\n"
    "                                    included, under the first map of each input (q, o,\n"
    "                                    gate, down; only with --stats xtx; GPTQ's --hessian)\n"
    "With --rotate SEED, fisher, mixllm, xtx_diag, mean_abs, pqi and layer_sensitivity\n"
    "are those of the rotated weights W V^T that `mpq quantize --rotate SEED` quantizes\n"
    "(what its planners and requant need); the file records the seed.\n"
    "Windows are taken evenly from the whole text; position 0 of each (BOS, an attention\n"
    "sink) is left out of the activation statistics but X^T X. The passes take one layer\n"
    "at a time with the weights in place, and each statistic is written as it is final:\n"
    "memory holds one layer's weights and sums and every window's hidden state (pqi:\n"
    "steps x windows of them; sensitivity: one per linear map). The result is the same\n"
    "for any --threads. Runs on the CPU, with float activations (not --device cuda, not\n"
    "--a8).",
    {{calib_opts, 0}, {cli_model_opts, CLI_AT(calib_args, lo)}, {NULL, 0}, {NULL, 0}},
    2,
    2,
    NULL};

typedef struct calib_progress {
    progress p;
    const char *phase;
} calib_progress;

static volatile sig_atomic_t calib_interrupted;
static void calib_sigint(int sig)
{
    (void)sig;
    calib_interrupted = 1;
}
static int calib_cancel(void *user)
{
    (void)user;
    return calib_interrupted != 0;
}

static void calib_step(void *user, const char *phase, int done, int total, double seconds)
{
    calib_progress *cp = (calib_progress *)user;
    if (!cp->phase || strcmp(cp->phase, phase)) { /* a new phase: its own bar and time left */
        progress_end(&cp->p);
        progress_start(&cp->p, "mpq", cp->p.on, total);
        cp->phase = phase;
    }
    char what[64];
    snprintf(what, sizeof what, " %s, %.0f s in all", phase, seconds);
    progress_show(&cp->p, done, what);
}

/* The statistics, and the file that records them with their model and text. */
static int calibrate(const calib_args *a, const mpq_llm *m, const char *model, const char *path, const char *text,
                     size_t len)
{
    mpq_io_err e;
    int32_t *tok = NULL;
    size_t nt = 0;
    int rc = 0;
    mpq_status st = mpq_tokenize(m->tok, text, len, 0, &tok, &nt, &e);
    if (st != MPQ_OK) rc = fail(EXIT_INPUT, "%s: %s", path, e.msg);
    const int length = a->co.length, windows = a->co.windows;
    if (!rc && nt < (size_t)length)
        rc = fail(EXIT_INPUT, "%s: %zu tokens, shorter than one calibration window of %d (--length)", path, nt, length);
    mpq_calib_stats s;
    memset(&s, 0, sizeof s);
    char *j = NULL;
    if (!rc) { /* what the file records of its model and text */
        char hash[32];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", model);
        cJSON_AddStringToObject(o, "text", path);
        cJSON_AddNumberToObject(o, "text_bytes", (double)len);
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)mpq_text_hash(text, len));
        cJSON_AddStringToObject(o, "text_fnv1a", hash);
        j = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!j) rc = fail(EXIT_QUANT, "out of memory");
    }
    if (!rc) {
        const int fit = (size_t)windows <= nt / (size_t)length;
        if (!a->lo.quiet)
            fprintf(stderr, "mpq: %s: %zu tokens; %d windows of %d%s\n", path, nt,
                    fit ? windows : (int)(nt / (size_t)length), length, fit ? "" : " (all that fit)");
        calib_progress cp;
        memset(&cp, 0, sizeof cp);
        cp.p.on = !a->lo.quiet;
        mpq_calib_opts co = a->co;
        co.progress = calib_step, co.user = &cp;
        co.rotate = a->rot.on, co.rotate_seed = a->rot.seed;
        if (co.resume_dir) { /* Ctrl-C stops after the layer that runs, resumable */
            co.cancel = calib_cancel;
            signal(SIGINT, calib_sigint);
        }
        const double t0 = cli_now();
        if (a->in_memory) { /* the model as float32 and every statistic held until the end, then the file */
            st = mpq_llm_calibrate(m, tok, nt, &co, &s, &e);
            if (st == MPQ_OK && (st = mpq_calib_write(m, &s, j, a->out, &e)) != MPQ_OK) {
                mpq_calib_stats_free(&s);
                memset(&s, 0, sizeof s);
            }
        } else {
            st = mpq_llm_calibrate_file(m, tok, nt, &co, j, a->out, &s, &e);
        }
        progress_end(&cp.p);
        if (co.resume_dir) signal(SIGINT, SIG_DFL);
        if (st == MPQ_ERR_CANCELLED)
            rc = fail(EXIT_QUANT, "%s: stopped; run the same command again to continue from %s", a->out, co.resume_dir);
        else if (st != MPQ_OK)
            rc = fail(st == MPQ_ERR_NOMEM                  ? EXIT_QUANT
                          : strstr(e.msg, a->out) == e.msg ? EXIT_OUTPUT
                                                           : EXIT_INPUT,
                      "%s", e.msg);
        else if (!a->lo.quiet) {
            fprintf(stderr, "mpq: calibration loss %.4f over %d windows (%.1f s)\n", s.loss, s.windows, cli_now() - t0);
            printf("%s: statistics of %d linear maps from %d windows of %d tokens\n", a->out, s.nlin, s.windows,
                   s.length);
        }
    }
    free(j);
    mpq_calib_stats_free(&s);
    free(tok);
    return rc;
}

int cmd_calibrate(int argc, char **argv)
{
    calib_args a;
    const char *pos[2];
    int npos = 0, rc = cli_parse(&calib_spec, argc, argv, &a, sizeof a, pos, &npos, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    if (a.lo.a8) return fail(EXIT_USAGE, "calibrate --a8: the statistics are gathered with float activations");
    if (!a.out) return fail(EXIT_USAGE, "calibrate: needs MODEL TEXT -o FILE (see mpq calibrate --help)");
    if (a.lo.device != DEVICE_CPU) return fail(EXIT_USAGE, "calibrate: runs on the CPU only (--device cpu)");
    char *text = NULL;
    size_t len = 0;
    if ((rc = text_read(pos[1], &text, &len)) != 0) return rc;
    loaded L;
    a.in_memory = a.lo.floats; /* else every pass a layer at a time, the weights in place */
    if ((rc = model_load(pos[0], &a.lo, &L)) == 0) rc = calibrate(&a, L.m, pos[0], pos[1], text, len);
    free(text);
    model_unload(&L);
    return rc;
}

/* ---------------------------------------------------------------------------
   gen-eval
   ------------------------------------------------------------------------ */

#define GE_MAX_SPECS 8

typedef struct ge_args {
    llm_opts lo;
    const char *reference;
    cli_list schedules;
    int prompts, prompt_tokens, tokens;
} ge_args;

static const cli_opt ge_opts[] = {
    {"--reference", CLI_STR, CLI_AT(ge_args, reference), "REF", 0, 0, NULL, NULL, NULL,
     "the model that scores the continuations (float weights)"},
    {"--schedule", CLI_LIST, CLI_AT(ge_args, schedules), "SPEC", 0, 0, NULL, NULL, NULL,
     "P:S@T,... (or a file whose first line is one), or learned:FILE\n"
     "(`mpq schedule --learned`); up to 8, the first is the baseline the\n"
     "others are compared with"},
    {"--prompts", CLI_INT, CLI_AT(ge_args, prompts), "N", 1, 1 << 20, NULL, NULL, "16", "prompts"},
    {"--prompt-tokens", CLI_INT, CLI_AT(ge_args, prompt_tokens), "N", 1, 1 << 20, NULL, NULL, "128",
     "tokens per prompt"},
    {"-n|--tokens", CLI_INT, CLI_AT(ge_args, tokens), "N", 1, 1 << 20, NULL, NULL, "128",
     "tokens to generate per prompt"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};
static const cli_spec gen_eval_spec = {
    "gen-eval",
    "[options] MODEL TEXT --reference REF --schedule SPEC [--schedule SPEC]...",
    "Generation under PMPD precision schedules, measured as PMPD's evaluation does: --prompts\n"
    "prompts of --prompt-tokens tokens taken evenly from TEXT (evaluation text, never the\n"
    "text a scheduler was made on), each continued greedily for up to -n tokens under\n"
    "every SPEC. Per SPEC: the bits per weight read per decoded token (averaged over all\n"
    "decoded tokens), the perplexity of the continuations under REF (the reference model,\n"
    "each continuation after its prompt), the perplexity of TEXT's own next -n tokens\n"
    "read under the SPEC's schedule for that prompt (teacher-forced, as `mpq schedule`\n"
    "measures quality), how many tokens equal the first SPEC's at the same position and\n"
    "how long the common start is, and the decode rate.",
    {{ge_opts, 0}, {cli_model_opts, CLI_AT(ge_args, lo)}, {NULL, 0}, {NULL, 0}},
    2,
    2,
    NULL};

/* -log softmax(z)[target], in double */
static double nll_of(const float *z, int n, int target)
{
    double mx = z[0], sum = 0;
    for (int i = 1; i < n; i++) mx = z[i] > mx ? z[i] : mx;
    for (int i = 0; i < n; i++) sum += exp((double)z[i] - mx);
    return log(sum) + mx - z[target];
}

typedef struct ge_spec {
    const char *text;
    int learned;
    mpq_pmpd_schedule s;
    mpq_pmpd_learned n;
    /* sums over the prompts */
    double bits, nll, tf_nll, decode_s, predict_s;
    long tokens, passes, scored, tf_scored, same, prefix;
    int classes[MPQ_PMPD_MAX_CLASSES];
} ge_spec;

/* Everything one gen-eval run holds. */
typedef struct ge_run {
    const ge_args *a;
    loaded M, R; /* the model and the reference */
    ge_spec *sp;
    int nspec;
    int32_t *tok, *prompt, *outs;
    size_t nt, win, avail;
    float *z0, *z;
    mpq_llm_state s, rs, ts;
    double bits[MPQ_MAX_BITS];
} ge_run;

/* The text's own continuation under the schedule that ran: pass t (token
   truth[t]) at the schedule's skip for t predicts truth[t + 1]. *prefill:
   the prefill skip whose prompt pass G->ts holds. */
static mpq_status ge_teacher(ge_run *G, ge_spec *sp, const mpq_pmpd_schedule *sc, const int32_t *truth, int *prefill)
{
    const int P = G->a->prompt_tokens, L = G->a->tokens, V = G->M.m->c.vocab;
    mpq_status st = MPQ_OK;
    if (sc->prefill_skip != *prefill) {
        mpq_llm_state_reset(&G->ts);
        if ((st = mpq_llm_forward(G->M.m, &G->ts, G->prompt, P, sc->prefill_skip, NULL, P)) != MPQ_OK) return st;
        *prefill = sc->prefill_skip;
    }
    G->ts.pos = P;
    for (int p = 0; p < L && st == MPQ_OK;) {
        const int k = mpq_pmpd_skip_at(sc, p);
        int q = p + 1;
        while (q < L && mpq_pmpd_skip_at(sc, q) == k) q++;
        st = mpq_llm_forward(G->M.m, &G->ts, truth + p, q - p, k, G->z + (size_t)p * V, 0);
        p = q;
    }
    for (int t = 0; t < L && st == MPQ_OK; t++) sp->tf_nll += nll_of(G->z + (size_t)t * V, V, truth[t + 1]);
    sp->tf_scored += L;
    return st;
}

/* Prompt i under every schedule, then the continuations under the reference. */
static int ge_prompt(ge_run *G, int i, int *ntok)
{
    const ge_args *a = G->a;
    const int P = a->prompt_tokens, L = a->tokens, V = G->M.m->c.vocab;
    const size_t at =
        (size_t)((double)i * (double)(G->avail - 1) / (a->prompts > 1 ? a->prompts - 1 : 1) + 0.5) * G->win;
    const int32_t *truth = G->tok + at + P;
    int tf_prefill = -1;
    memcpy(G->prompt, G->tok + at, sizeof(int32_t) * (size_t)P);
    if (mpq_tokenizer_adds_bos(G->M.m->tok) && mpq_tokenizer_bos(G->M.m->tok) >= 0)
        G->prompt[0] = mpq_tokenizer_bos(G->M.m->tok);
    mpq_status st = MPQ_OK;
    for (int j = 0; j < G->nspec; j++) {
        ge_spec *sp = &G->sp[j];
        mpq_gen_opts g;
        memset(&g, 0, sizeof g);
        g.max_tokens = L;
        g.schedule = sp->learned ? NULL : &sp->s;
        g.learned = sp->learned ? &sp->n : NULL;
        mpq_gen_result r;
        int32_t *o = G->outs + (size_t)j * L;
        if ((st = mpq_llm_generate(G->M.m, &G->s, G->prompt, P, &g, o, L, &r)) != MPQ_OK)
            return fail(EXIT_QUANT, "gen-eval: prompt %d, schedule %s: %s", i, sp->text, mpq_status_str(st));
        ntok[j] = r.tokens;
        double avg = 0;
        if (r.tokens > 0 && mpq_pmpd_average_bits(&r.schedule, G->bits, r.tokens, &avg) == MPQ_OK)
            sp->bits += avg * r.tokens;
        sp->tokens += r.tokens;
        sp->passes += r.tokens > 0 ? r.tokens - 1 : 0;
        sp->decode_s += r.decode_seconds, sp->predict_s += r.schedule_seconds;
        if (r.learned_class >= 0) sp->classes[r.learned_class]++;
        int pre = 0;
        while (pre < ntok[j] && pre < ntok[0] && o[pre] == G->outs[pre]) pre++;
        sp->prefix += pre;
        for (int t = 0; t < ntok[j] && t < ntok[0]; t++) sp->same += o[t] == G->outs[t];
        if ((st = ge_teacher(G, sp, &r.schedule, truth, &tf_prefill)) != MPQ_OK)
            return fail(EXIT_QUANT, "gen-eval: prompt %d, the text's continuation: %s", i, mpq_status_str(st));
    }
    mpq_llm_state_reset(&G->rs); /* the continuations under the reference, after the prompt's one pass */
    if ((st = mpq_llm_forward(G->R.m, &G->rs, G->prompt, P, 0, G->z0, P - 1)) != MPQ_OK)
        return fail(EXIT_QUANT, "gen-eval: the reference: %s", mpq_status_str(st));
    for (int j = 0; j < G->nspec; j++) {
        const int32_t *o = G->outs + (size_t)j * L;
        const int n = ntok[j];
        if (n == 0) continue;
        G->rs.pos = P;
        if (n > 1 && (st = mpq_llm_forward(G->R.m, &G->rs, o, n - 1, 0, G->z, 0)) != MPQ_OK)
            return fail(EXIT_QUANT, "gen-eval: the reference: %s", mpq_status_str(st));
        G->sp[j].nll += nll_of(G->z0, V, o[0]);
        for (int t = 1; t < n; t++) G->sp[j].nll += nll_of(G->z + (size_t)(t - 1) * V, V, o[t]);
        G->sp[j].scored += n;
    }
    return 0;
}

static void ge_print(const ge_run *G, const char *text)
{
    const ge_args *a = G->a;
    printf("%d prompts of %d tokens from %s, up to %d tokens each, greedy; continuations scored by %s\n\n", a->prompts,
           a->prompt_tokens, text, a->tokens, a->reference);
    printf("| schedule | bits per decoded token | generated: ppl under the reference | vs first | text: ppl "
           "(teacher-forced) | vs first | same tokens as first | common start | decode tokens/s | classes |\n"
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    const ge_spec *sp = G->sp;
    const double ppl0 = exp(sp[0].nll / (double)sp[0].scored), tf0 = exp(sp[0].tf_nll / (double)sp[0].tf_scored);
    for (int j = 0; j < G->nspec; j++) {
        const double ppl = exp(sp[j].nll / (double)sp[j].scored);
        char cls[256] = "";
        int k = 0;
        for (int c = 0; sp[j].learned && c < sp[j].n.classes; c++)
            k += snprintf(cls + k, sizeof cls - (size_t)k, "%s%d", c ? "," : "", sp[j].classes[c]);
        if (sp[j].learned)
            snprintf(cls + k, sizeof cls - (size_t)k, " (%.2f ms each)", 1e3 * sp[j].predict_s / a->prompts);
        const double tf = exp(sp[j].tf_nll / (double)sp[j].tf_scored);
        printf("| %s | %.3f | %.4f | %+.2f %% | %.4f | %+.2f %% | %.1f %% | %.1f | %.1f | %s |\n", sp[j].text,
               sp[j].bits / (double)sp[j].tokens, ppl, 100 * (ppl / ppl0 - 1), tf, 100 * (tf / tf0 - 1),
               100.0 * (double)sp[j].same / (double)sp[0].tokens, (double)sp[j].prefix / a->prompts,
               sp[j].decode_s > 0 ? (double)sp[j].passes / sp[j].decode_s : 0.0, cls);
    }
}

/* The models, the schedules, the text's tokens and the buffers. */
static int ge_setup(ge_run *G, const char *model, const char *path, const char *text, size_t len)
{
    const ge_args *a = G->a;
    llm_opts ro = a->lo;
    ro.device = DEVICE_CPU, ro.a8 = 0;
    int rc = model_load(model, &a->lo, &G->M);
    if (!rc) rc = model_load(a->reference, &ro, &G->R);
    if (!rc && mpq_llm_bpw(G->M.m, 1, -1) <= 0) rc = fail(EXIT_INPUT, "%s: no packed linear maps to schedule", model);
    if (!rc && G->R.m->c.vocab != G->M.m->c.vocab)
        rc = fail(EXIT_INPUT, "%s: vocabulary of %d, %s has %d", a->reference, G->R.m->c.vocab, model, G->M.m->c.vocab);
    mpq_io_err e;
    for (int j = 0; j < G->nspec && !rc; j++)
        if (G->sp[j].learned && mpq_pmpd_learned_read(G->M.m, G->sp[j].text + 8, &G->sp[j].n, &e) != MPQ_OK)
            rc = fail(EXIT_INPUT, "%s", e.msg);
    if (!rc && mpq_tokenize(G->M.m->tok, text, len, 0, &G->tok, &G->nt, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", path, e.msg);
    const int P = a->prompt_tokens, L = a->tokens, V = G->M.m ? G->M.m->c.vocab : 0, ctx = P + L;
    G->win = (size_t)P + (size_t)L + 1, G->avail = G->nt / G->win; /* a prompt, its own next L + 1 tokens */
    if (!rc && G->avail < (size_t)a->prompts)
        rc = fail(EXIT_INPUT, "%s: %zu tokens: fewer than %d windows of %d prompt and %d + 1 following tokens", path,
                  G->nt, a->prompts, P, L);
    mpq_status st = MPQ_OK;
    if (!rc &&
        ((st = mpq_llm_state_init(G->M.m, ctx, 64, &G->s)) != MPQ_OK ||
         (st = mpq_llm_state_init(G->R.m, ctx, 64, &G->rs)) != MPQ_OK ||
         (st = mpq_llm_state_init(G->M.m, ctx, 64, &G->ts)) != MPQ_OK))
        rc = fail(EXIT_QUANT, "gen-eval: a cache of %d positions: %s", ctx, mpq_status_str(st));
    if (!rc &&
        (!(G->prompt = (int32_t *)malloc(sizeof(int32_t) * (size_t)P)) ||
         !(G->outs = (int32_t *)malloc(sizeof(int32_t) * (size_t)G->nspec * L)) ||
         !(G->z0 = (float *)malloc(sizeof(float) * (size_t)V)) ||
         !(G->z = (float *)malloc(sizeof(float) * (size_t)L * V))))
        rc = fail(EXIT_QUANT, "out of memory");
    for (int k = 0; k < MPQ_MAX_BITS && !rc; k++) G->bits[k] = mpq_llm_bpw(G->M.m, 1, k);
    return rc;
}

int cmd_gen_eval(int argc, char **argv)
{
    ge_args a;
    const char *pos[2];
    int npos = 0, rc = cli_parse(&gen_eval_spec, argc, argv, &a, sizeof a, pos, &npos, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    if (!a.reference || !a.schedules.n)
        return fail(EXIT_USAGE, "gen-eval: needs MODEL TEXT --reference REF --schedule SPEC (see mpq gen-eval --help)");
    if (a.schedules.n > GE_MAX_SPECS) return fail(EXIT_USAGE, "gen-eval: at most %d --schedule", GE_MAX_SPECS);
    ge_run G;
    memset(&G, 0, sizeof G);
    G.a = &a, G.nspec = a.schedules.n;
    if (!(G.sp = (ge_spec *)calloc(GE_MAX_SPECS, sizeof *G.sp))) return fail(EXIT_QUANT, "out of memory");
    for (int j = 0; j < G.nspec && !rc; j++) {
        schedule_arg s;
        memset(&s, 0, sizeof s);
        if (!schedule_arg_parse(a.schedules.v[j], &s))
            rc = fail(EXIT_USAGE, "gen-eval --schedule: '%s' is not %s", a.schedules.v[j], SCHEDULE_WHAT);
        G.sp[j].text = s.text, G.sp[j].learned = s.learned, G.sp[j].s = s.s;
    }
    char *text = NULL;
    size_t len = 0;
    if (!rc) rc = text_read(pos[1], &text, &len);
    if (!rc) rc = ge_setup(&G, pos[0], pos[1], text, len);
    int ntok[GE_MAX_SPECS] = {0};
    progress pr;
    progress_start(&pr, "mpq", !a.lo.quiet, a.prompts);
    const double t0 = cli_now();
    for (int i = 0; i < a.prompts && !rc; i++) {
        rc = ge_prompt(&G, i, ntok);
        char what[64];
        snprintf(what, sizeof what, " prompts, %.0f s", cli_now() - t0);
        progress_show(&pr, i + 1, what);
    }
    progress_end(&pr);
    if (!rc) ge_print(&G, pos[1]);
    for (int j = 0; j < G.nspec; j++) mpq_pmpd_learned_free(&G.sp[j].n);
    mpq_llm_state_free(&G.s), mpq_llm_state_free(&G.rs), mpq_llm_state_free(&G.ts);
    free(G.sp), free(G.tok), free(G.prompt), free(G.outs), free(G.z0), free(G.z), free(text);
    model_unload(&G.M), model_unload(&G.R);
    return rc;
}
