/* mpq_llm.c - the model commands of the mpq tool: eval, run, speed,
   calibrate, schedule, gen-eval.

     mpq eval [options] MODEL TEXT
     mpq run [options] MODEL --prompt TEXT
     mpq speed [options] MODEL
     mpq calibrate [options] MODEL TEXT -o STATS
     mpq schedule [options] MODEL TEXT -o SCHEDULE
     mpq gen-eval [options] MODEL TEXT --reference REF --schedule SPEC...

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
#include "cli.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---------------------------------------------------------------------------
   what the commands share: loading a model on a device, reading a text
   ------------------------------------------------------------------------ */

typedef struct llm_opts {
    int threads, quiet;
    const char *device; /* "cpu", "cuda" or "cuda-fp16" */
    int a8;             /* packed maps multiply 8-bit activations */
} llm_opts;

/* Options every model command takes; 1 when argv[a->i] was one of them. */
static int common_opt(args *a, llm_opts *o, int *bad)
{
    const char *v = NULL;
    if (opt(a, "--threads", &v, bad)) {
        *bad = *bad || !parse_int(a->cmd, "--threads", v, 1, 4096, &o->threads);
        return 1;
    }
    if (opt(a, "--device", &v, bad)) {
        if (!*bad && strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "cuda-fp16"))
            *bad = fail(EXIT_USAGE, "%s --device: '%s' is not cpu, cuda or cuda-fp16", a->cmd, v);
        o->device = v;
        return 1;
    }
    if (opt(a, "--quiet", NULL, bad)) {
        o->quiet = 1;
        return 1;
    }
    if (opt(a, "--a8", NULL, bad)) {
        o->a8 = 1;
        return 1;
    }
    return 0;
}

#define COMMON_HELP                                                                                                    \
    "  --threads T        CPU threads (default all)\n"                                                                 \
    "  --device D         cpu | cuda: where the packed matrices are multiplied (default cpu);\n"                       \
    "                     cuda-fp16: on the GPU as float16 weights through cuBLAS (the baseline)\n"                    \
    "  --quiet            no progress\n"                                                                               \
    "  --a8               packed linear maps multiply activations quantized to int8 per group\n"                       \
    "                     (MixLLM's W*A8; on the CPU)\n"

typedef struct loaded {
    mpq_llm *m;
    mpq_backend be;
    int have_be;
} loaded;

static void unload(loaded *L)
{
    if (L->m && L->have_be) mpq_llm_use_backend(L->m, NULL);
#ifdef MPQ_HAVE_CUDA
    if (L->have_be) mpq_cuda_backend_destroy(&L->be);
#endif
    mpq_llm_free(L->m);
    memset(L, 0, sizeof *L);
}

static int load(const char *path, const llm_opts *o, loaded *L)
{
    memset(L, 0, sizeof *L);
#ifdef _OPENMP
    if (o->threads) omp_set_num_threads(o->threads);
#endif
    mpq_io_err e;
    const double t0 = cli_now();
    mpq_status st = mpq_llm_load(path, &L->m, &e);
    if (st != MPQ_OK) return fail(EXIT_INPUT, "%s", e.msg);
    if (o->a8 && o->device && !strcmp(o->device, "cuda-fp16")) {
        unload(L);
        return fail(EXIT_USAGE,
                    "--a8: 8-bit activations run on --device cpu or cuda (cuda-fp16 holds float16 weights)");
    }
    L->m->a8 = o->a8;
    if (o->device && strcmp(o->device, "cpu")) {
#ifdef MPQ_HAVE_CUDA
        st = strcmp(o->device, "cuda") ? mpq_cuda_backend_fp16(0, &L->be) : mpq_cuda_backend(0, &L->be);
        if (st != MPQ_OK) {
            unload(L);
            return fail(EXIT_INPUT, "--device %s: %s", o->device, mpq_status_str(st));
        }
        L->have_be = 1;
        if ((st = mpq_llm_use_backend(L->m, &L->be)) != MPQ_OK) {
            unload(L);
            return fail(EXIT_QUANT, "--device %s: uploading the packed matrices: %s", o->device, mpq_status_str(st));
        }
#else
        unload(L);
        return fail(EXIT_USAGE, "--device %s: this build has no CUDA backend", o->device);
#endif
    }
    if (!o->quiet) {
        const mpq_llm_config *c = &L->m->c;
        const double bpw = mpq_llm_bpw(L->m, 2, -1);
        char lin[64];
        if (bpw > 0)
            snprintf(lin, sizeof lin, "linear maps packed, %.3f bpw", bpw);
        else
            snprintf(lin, sizeof lin, "float weights");
        fprintf(stderr,
                "mpq: %s: %s, %d layers, dim %d, %d/%d heads, vocab %d; %s; %.1f MB of weights; loaded in "
                "%.1f s\n",
                path, c->arch, c->layers, c->dim, c->heads, c->kv_heads, c->vocab, lin,
                (double)mpq_llm_weight_bytes(L->m) / 1e6, cli_now() - t0);
    }
    return 0;
}

/* A whole file (NUL-terminated; *n bytes). */
static int read_text(const char *path, char **text, size_t *n)
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

/* argv[a->i] when no option matched: an unknown option, or MODEL or TEXT
   (pos, *npos so far); sets *bad on a mistake. */
static void model_text_arg(args *a, const char **pos, int *npos, int *bad)
{
    const char *v = a->argv[a->i];
    if (v[0] == '-' && v[1])
        *bad = fail(EXIT_USAGE, "%s: unknown option '%s' (see mpq %s --help)", a->cmd, v, a->cmd);
    else if (*npos < 2)
        pos[(*npos)++] = v;
    else
        *bad = fail(EXIT_USAGE, "%s: more than MODEL and TEXT given", a->cmd);
}

/* ---------------------------------------------------------------------------
   eval
   ------------------------------------------------------------------------ */

typedef struct eval_progress {
    progress p;
} eval_progress;

static void eval_step(void *user, int done, int total, double ppl, double seconds)
{
    eval_progress *ep = (eval_progress *)user;
    char what[64];
    snprintf(what, sizeof what, " ppl %.4f, %.1f s", ppl, seconds);
    (void)total;
    progress_show(&ep->p, done, what);
}

int cmd_eval(int argc, char **argv)
{
    args a = {argc, 0, argv, "eval"};
    llm_opts lo = {0, 0, "cpu", 0};
    mpq_ppl_opts po;
    memset(&po, 0, sizeof po);
    po.ctx = 512;
    const char *pos[2] = {0};
    int npos = 0, bad = 0;
    for (a.i = 1; a.i < argc && !bad; a.i++) {
        const char *v = NULL;
        if (opt(&a, "--help", NULL, &bad) || opt(&a, "-h", NULL, &bad)) {
            puts("usage: mpq eval [options] MODEL TEXT\n"
                 "\n"
                 "Perplexity of MODEL on the text file TEXT (UTF-8), computed as llama.cpp's\n"
                 "llama-perplexity computes it: the text (less one final newline) is tokenized, BOS\n"
                 "first when the model asks for it; the tokens are cut into chunks of --ctx, the\n"
                 "remainder dropped; each chunk starts from an empty cache, its first token replaced\n"
                 "by BOS when the model adds BOS, and the second half of it is scored. Prints\n"
                 "ppl +/- its standard error, the tokens scored, and tokens per second.\n"
                 "\n"
                 "  --ctx N            tokens per chunk (default 512)\n"
                 "  --chunks N         evaluate at most N chunks (default all)\n"
                 "  --skip-planes K    drop the K lowest bit planes of every packed linear map\n"
                 "  --batch N          tokens per forward piece (default 64)\n" COMMON_HELP);
            return 0;
        } else if (common_opt(&a, &lo, &bad)) {
        } else if (opt(&a, "--ctx", &v, &bad)) {
            bad = bad || !parse_int("eval", "--ctx", v, 4, 1 << 20, &po.ctx);
        } else if (opt(&a, "--chunks", &v, &bad)) {
            bad = bad || !parse_int("eval", "--chunks", v, 1, INT32_MAX, &po.chunks);
        } else if (opt(&a, "--skip-planes", &v, &bad)) {
            bad = bad || !parse_int("eval", "--skip-planes", v, 0, 7, &po.skip_planes);
        } else if (opt(&a, "--batch", &v, &bad)) {
            bad = bad || !parse_int("eval", "--batch", v, 1, 4096, &po.batch);
        } else {
            model_text_arg(&a, pos, &npos, &bad);
        }
    }
    if (bad) return EXIT_USAGE;
    if (npos != 2) return fail(EXIT_USAGE, "eval: needs MODEL TEXT (see mpq eval --help)");
    char *text = NULL;
    size_t len = 0;
    int rc = read_text(pos[1], &text, &len);
    if (rc) return rc;
    if (len && text[len - 1] == '\n') len--; /* as llama.cpp reads -f */
    loaded L;
    if ((rc = load(pos[0], &lo, &L)) != 0) {
        free(text);
        return rc;
    }
    mpq_io_err e;
    int32_t *tok = NULL;
    size_t nt = 0;
    const double t0 = cli_now();
    mpq_status st = mpq_tokenize(L.m->tok, text, len, MPQ_TOK_BOS, &tok, &nt, &e);
    if (st != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", pos[1], e.msg);
    else if (nt < (size_t)po.ctx)
        rc = fail(EXIT_INPUT, "%s: %zu tokens, fewer than one chunk of %d", pos[1], nt, po.ctx);
    if (!rc) {
        const size_t chunks = nt / (size_t)po.ctx;
        const int run = (int)(po.chunks && (size_t)po.chunks < chunks ? (size_t)po.chunks : chunks);
        if (!lo.quiet)
            fprintf(stderr, "mpq: %s: %zu bytes, %zu tokens (%.2f s); %d of %zu chunks of %d\n", pos[1], len, nt,
                    cli_now() - t0, run, chunks, po.ctx);
        eval_progress ep;
        progress_start(&ep.p, "mpq", !lo.quiet, run);
        po.progress = eval_step, po.user = &ep;
        mpq_ppl_result r;
        st = mpq_llm_perplexity(L.m, tok, nt, &po, &r);
        progress_end(&ep.p);
        if (st != MPQ_OK) {
            rc = fail(EXIT_QUANT, "eval: %s", mpq_status_str(st));
        } else {
            printf("perplexity: %.4f +/- %.5f over %d chunks of %d (%ld tokens scored, nll %.5f), %.1f tokens/s\n",
                   r.ppl, r.ppl_err, r.chunks, po.ctx, r.count, r.nll, r.tokens_per_second);
        }
    }
    free(tok);
    free(text);
    unload(&L);
    return rc;
}

/* ---------------------------------------------------------------------------
   run
   ------------------------------------------------------------------------ */

/* "P:S@T,S@T,..." -> a schedule: prompt at skip P, decoded token T on at
   skip S. */
static int parse_schedule(const char *v, mpq_pmpd_schedule *s)
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

/* A schedule given as P:S@T,... or as a file whose first line is one (what
   `mpq schedule` writes); 0 when neither. */
static int read_schedule(const char *v, mpq_pmpd_schedule *s)
{
    if (parse_schedule(v, s)) return 1;
    FILE *f = fopen(v, "r");
    if (!f) return 0;
    char line[512];
    const int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok) return 0;
    line[strcspn(line, "\r\n #")] = 0;
    return parse_schedule(line, s);
}

/* The schedule as P:S@T,... */
static void schedule_text(const mpq_pmpd_schedule *s, char *buf, size_t cap)
{
    int k = snprintf(buf, cap, "%d:", s->prefill_skip);
    for (int i = 0; i < s->nlevels && k > 0 && (size_t)k < cap; i++)
        k += snprintf(buf + k, cap - (size_t)k, "%s%d@%ld", i ? "," : "", s->skip[i], s->start[i]);
}

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

int cmd_run(int argc, char **argv)
{
    args a = {argc, 0, argv, "run"};
    llm_opts lo = {0, 0, "cpu", 0};
    mpq_gen_opts g;
    memset(&g, 0, sizeof g);
    g.seed = 1;
    int ntok = 128, ctx = 0, chat = 0, special = 1, show_special = 0, bad = 0;
    double temp = 0, top_p = 1;
    const char *model = NULL, *prompt = NULL, *prompt_file = NULL, *system = NULL;
    mpq_pmpd_schedule sched;
    mpq_pmpd_learned learned;
    memset(&learned, 0, sizeof learned);
    int have_sched = 0;
    const char *learned_path = NULL;
    for (a.i = 1; a.i < argc && !bad; a.i++) {
        const char *v = NULL;
        if (opt(&a, "--help", NULL, &bad) || opt(&a, "-h", NULL, &bad)) {
            puts("usage: mpq run [options] MODEL --prompt TEXT\n"
                 "\n"
                 "Generates text after a prompt with a KV cache: the prompt in one batched pass, then a\n"
                 "token at a time, printed as it comes; then the prompt and decode rates on stderr.\n"
                 "\n"
                 "  --prompt TEXT        the prompt (or --prompt-file FILE); control tokens such as\n"
                 "                       <|im_start|> in it are those tokens (--no-special: text)\n"
                 "  --chat               wrap the prompt in the model's chat format (ChatML or Llama 3)\n"
                 "  --system TEXT        with --chat: a system message first\n"
                 "  -n, --tokens N       tokens to generate at most (default 128); an end token stops\n"
                 "  --temp T             0 is greedy (default); else sample from softmax(logits / T)\n"
                 "  --top-p P            sample among the likeliest tokens holding P of the mass (1)\n"
                 "  --seed S             sampling seed (default 1)\n"
                 "  --ctx N              cache size (default: prompt + tokens, at most the model's)\n"
                 "  --skip-planes K      every packed linear map reads K planes less (nested precision)\n"
                 "  --schedule P:S@T,..  PMPD: the prompt at skip P; decoded token T onwards at skip S,\n"
                 "                       T and S increasing (e.g. 0:0@0,1@32,2@96); the stderr report\n"
                 "                       gives the decode time per token at each level; or a file\n"
                 "                       whose first line is one (what `mpq schedule` writes)\n"
                 "  --schedule learned:FILE  PMPD's learned scheduler (`mpq schedule --learned`): the\n"
                 "                       schedule of this prompt from the cache its pass leaves\n"
                 "  --show-special       print control tokens too\n" COMMON_HELP);
            return 0;
        } else if (common_opt(&a, &lo, &bad)) {
        } else if (opt(&a, "--prompt", &v, &bad)) {
            prompt = v;
        } else if (opt(&a, "--prompt-file", &v, &bad)) {
            prompt_file = v;
        } else if (opt(&a, "--system", &v, &bad)) {
            system = v;
        } else if (opt(&a, "--chat", NULL, &bad)) {
            chat = 1;
        } else if (opt(&a, "--no-special", NULL, &bad)) {
            special = 0;
        } else if (opt(&a, "--show-special", NULL, &bad)) {
            show_special = 1;
        } else if (opt(&a, "--tokens", &v, &bad) || opt(&a, "-n", &v, &bad)) {
            bad = bad || !parse_int("run", "--tokens", v, 1, 1 << 24, &ntok);
        } else if (opt(&a, "--temp", &v, &bad)) {
            bad = bad || !parse_double("run", "--temp", v, 0, 100, &temp);
        } else if (opt(&a, "--top-p", &v, &bad)) {
            bad = bad || !parse_double("run", "--top-p", v, 0, 1, &top_p);
        } else if (opt(&a, "--seed", &v, &bad)) {
            int s;
            bad = bad || !parse_int("run", "--seed", v, 0, INT32_MAX, &s);
            g.seed = (uint64_t)s;
        } else if (opt(&a, "--ctx", &v, &bad)) {
            bad = bad || !parse_int("run", "--ctx", v, 2, 1 << 24, &ctx);
        } else if (opt(&a, "--skip-planes", &v, &bad)) {
            bad = bad || !parse_int("run", "--skip-planes", v, 0, 7, &g.skip_planes);
        } else if (opt(&a, "--schedule", &v, &bad)) {
            if (!bad && !strncmp(v, "learned:", 8))
                learned_path = v + 8;
            else if (!bad && !read_schedule(v, &sched))
                bad = fail(EXIT_USAGE,
                           "run --schedule: '%s' is not P:S@T,S@T,... with S and T increasing, nor a file "
                           "holding one, nor learned:FILE",
                           v);
            have_sched = learned_path == NULL;
        } else if (argv[a.i][0] == '-' && argv[a.i][1]) {
            bad = fail(EXIT_USAGE, "run: unknown option '%s' (see mpq run --help)", argv[a.i]);
        } else if (!model) {
            model = argv[a.i];
        } else {
            bad = fail(EXIT_USAGE, "run: one MODEL only");
        }
    }
    if (bad) return EXIT_USAGE;
    if (!model) return fail(EXIT_USAGE, "run: needs MODEL (see mpq run --help)");
    if (!prompt == !prompt_file) return fail(EXIT_USAGE, "run: needs one of --prompt and --prompt-file");
    if (system && !chat) return fail(EXIT_USAGE, "run: --system goes with --chat");
    char *ptext = NULL;
    size_t plen = 0;
    int rc = 0;
    if (prompt_file && (rc = read_text(prompt_file, &ptext, &plen)) != 0) return rc;
    if (prompt && !(ptext = strdup(prompt))) return fail(EXIT_INPUT, "out of memory");
    if (prompt) plen = strlen(ptext);
    loaded L;
    if ((rc = load(model, &lo, &L)) != 0) {
        free(ptext);
        return rc;
    }
    const char *what = prompt_file ? prompt_file : "--prompt";
    mpq_io_err le;
    if (learned_path && mpq_pmpd_learned_read(L.m, learned_path, &learned, &le) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s", le.msg);
    if (!rc && chat) {
        char *c = memchr(ptext, 0, plen) ? NULL : chat_prompt(L.m->tok, system, ptext);
        if (!c)
            rc = fail(EXIT_INPUT, "%s: --chat: the vocabulary has no chat tokens mpq knows (ChatML, Llama 3)", model);
        free(ptext);
        ptext = c, plen = c ? strlen(c) : 0;
    }
    mpq_io_err e;
    int32_t *tok = NULL, *out = NULL;
    size_t nt = 0;
    if (!rc &&
        mpq_tokenize(L.m->tok, ptext, plen, MPQ_TOK_BOS | (special ? MPQ_TOK_SPECIAL : 0), &tok, &nt, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", what, e.msg);
    if (!rc && nt == 0) rc = fail(EXIT_INPUT, "%s: the prompt is empty", what);
    const int model_ctx = L.m->c.ctx;
    if (!rc && ctx == 0) ctx = (int)(nt + (size_t)ntok < (size_t)model_ctx ? nt + (size_t)ntok : (size_t)model_ctx);
    if (!rc && nt >= (size_t)ctx)
        rc = fail(EXIT_INPUT, "%s: a prompt of %zu tokens does not fit a context of %d (the model's: %d)", what, nt,
                  ctx, model_ctx);
    mpq_llm_state s;
    memset(&s, 0, sizeof s);
    mpq_status st = MPQ_OK;
    if (!rc && (st = mpq_llm_state_init(L.m, ctx, 64, &s)) != MPQ_OK)
        rc = fail(EXIT_QUANT, "run: a cache of %d positions: %s", ctx, mpq_status_str(st));
    if (!rc && !(out = (int32_t *)malloc(sizeof(int32_t) * (size_t)ntok))) rc = fail(EXIT_QUANT, "out of memory");
    if (!rc) {
        stream sm = {L.m->tok, show_special};
        g.max_tokens = ntok, g.temperature = (float)temp, g.top_p = (float)top_p;
        g.schedule = have_sched ? &sched : NULL;
        g.learned = learned_path ? &learned : NULL;
        g.on_token = print_token, g.user = &sm;
        mpq_gen_result r;
        st = mpq_llm_generate(L.m, &s, tok, (int)nt, &g, out, ntok, &r);
        printf("\n");
        if (st != MPQ_OK) {
            rc = fail(EXIT_QUANT, "run: %s", mpq_status_str(st));
        } else if (!lo.quiet) {
            const int dec = r.tokens > 0 ? r.tokens - 1 : 0; /* the first token comes from the prompt's pass */
            fprintf(stderr,
                    "mpq: prompt: %d tokens in %.3f s (%.1f tokens/s); decode: %d tokens in %.3f s (%.1f "
                    "tokens/s)%s\n",
                    r.prompt_tokens, r.prefill_seconds, r.prompt_tokens / r.prefill_seconds, dec, r.decode_seconds,
                    r.decode_seconds > 0 ? dec / r.decode_seconds : 0.0, r.ended ? "; stopped at an end token" : "");
            if (learned_path) {
                char t[128];
                schedule_text(&r.schedule, t, sizeof t);
                fprintf(stderr, "mpq: learned schedule %s (class %d of %d, predicted in %.2f ms)\n", t, r.learned_class,
                        learned.classes, 1e3 * r.schedule_seconds);
            }
            for (int k = 0; k < MPQ_MAX_BITS && L.m->layer[0].lin[0].A.buf; k++) /* packed models only */
                if (r.tokens_at_skip[k])
                    fprintf(stderr, "mpq:   skip %d (%.3f bpw read): %d tokens, %.2f ms per token\n", k,
                            mpq_llm_bpw(L.m, 1, k), r.tokens_at_skip[k],
                            1e3 * r.seconds_at_skip[k] / r.tokens_at_skip[k]);
        }
    }
    mpq_llm_state_free(&s);
    mpq_pmpd_learned_free(&learned);
    free(out);
    free(tok);
    free(ptext);
    unload(&L);
    return rc;
}

/* ---------------------------------------------------------------------------
   speed
   ------------------------------------------------------------------------ */

static void mean_sd(const double *v, int n, double *mean, double *sd)
{
    double m = 0, s = 0;
    for (int i = 0; i < n; i++) m += v[i];
    m /= n;
    for (int i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
    *mean = m, *sd = n > 1 ? sqrt(s / (n - 1)) : 0;
}

int cmd_speed(int argc, char **argv)
{
    args a = {argc, 0, argv, "speed"};
    llm_opts lo = {0, 0, "cpu", 0};
    int np = 128, ng = 64, nb = 1, reps = 5, skip = 0, bad = 0;
    const char *model = NULL;
    for (a.i = 1; a.i < argc && !bad; a.i++) {
        const char *v = NULL;
        if (opt(&a, "--help", NULL, &bad) || opt(&a, "-h", NULL, &bad)) {
            puts("usage: mpq speed [options] MODEL\n"
                 "\n"
                 "Tokens per second as llama.cpp's llama-bench measures them: a prompt of -p tokens in\n"
                 "one batched pass from an empty cache (pp), and -n tokens generated one at a time from\n"
                 "an empty cache (tg); each -r times after one warm-up, mean +/- standard deviation.\n"
                 "With -b B, B sequences are generated together (a server's B users): each step\n"
                 "runs the linear maps on B tokens at once, and tokens/s counts all of them.\n"
                 "Tokens are drawn at random (the time does not depend on them).\n"
                 "\n"
                 "  -p N               prompt tokens (default 128; 0 skips the prompt test)\n"
                 "  -n N               generated tokens (default 64; 0 skips the generation test)\n"
                 "  -b B               sequences generated together (default 1, at most 512)\n"
                 "  -r N               repetitions (default 5)\n"
                 "  --skip-planes K    drop the K lowest bit planes of every packed linear map\n" COMMON_HELP);
            return 0;
        } else if (common_opt(&a, &lo, &bad)) {
        } else if (opt(&a, "-p", &v, &bad)) {
            bad = bad || !parse_int("speed", "-p", v, 0, 1 << 20, &np);
        } else if (opt(&a, "-n", &v, &bad)) {
            bad = bad || !parse_int("speed", "-n", v, 0, 1 << 20, &ng);
        } else if (opt(&a, "-b", &v, &bad)) {
            bad = bad || !parse_int("speed", "-b", v, 1, 512, &nb);
        } else if (opt(&a, "-r", &v, &bad)) {
            bad = bad || !parse_int("speed", "-r", v, 1, 1000, &reps);
        } else if (opt(&a, "--skip-planes", &v, &bad)) {
            bad = bad || !parse_int("speed", "--skip-planes", v, 0, 7, &skip);
        } else if (argv[a.i][0] == '-' && argv[a.i][1]) {
            bad = fail(EXIT_USAGE, "speed: unknown option '%s' (see mpq speed --help)", argv[a.i]);
        } else if (!model) {
            model = argv[a.i];
        } else {
            bad = fail(EXIT_USAGE, "speed: one MODEL only");
        }
    }
    if (bad) return EXIT_USAGE;
    if (!model) return fail(EXIT_USAGE, "speed: needs MODEL (see mpq speed --help)");
    if (np == 0 && ng == 0) return fail(EXIT_USAGE, "speed: -p and -n are both 0");
    loaded L;
    int rc = load(model, &lo, &L);
    if (rc) return rc;
    const int ctx = (np > ng ? np : ng) + 1, V = L.m->c.vocab;
    mpq_llm_state s; /* the prompt's cache, and the scratch of -b steps */
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)ctx * nb);
    float *logits = (float *)malloc(sizeof(float) * (size_t)V * nb);
    double *pp = (double *)calloc((size_t)reps, sizeof(double)), *tg = (double *)calloc((size_t)reps, sizeof(double));
    mpq_llm_state *seqs = nb > 1 ? (mpq_llm_state *)calloc((size_t)nb, sizeof *seqs) : NULL;
    mpq_llm_state **sp = nb > 1 ? (mpq_llm_state **)calloc((size_t)nb, sizeof *sp) : NULL;
    mpq_status st = mpq_llm_state_init(L.m, ctx, 512, &s);
    for (int i = 0; i < nb && nb > 1 && st == MPQ_OK && seqs && sp; i++) {
        st = mpq_llm_state_init(L.m, ctx, 1, &seqs[i]);
        sp[i] = &seqs[i];
    }
    if (st != MPQ_OK || !tok || !logits || !pp || !tg || (nb > 1 && (!seqs || !sp))) {
        rc = fail(EXIT_QUANT, "speed: %s", st != MPQ_OK ? mpq_status_str(st) : "out of memory");
    } else {
        uint64_t r = 12345;
        for (int i = 0; i < ctx * nb; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            tok[i] = (int32_t)((r >> 33) % (uint64_t)mpq_tokenizer_size(L.m->tok));
        }
        progress pr;
        progress_start(&pr, "mpq", !lo.quiet, reps + 1);
        for (int rep = -1; rep < reps && st == MPQ_OK; rep++) { /* rep -1: warm-up */
            char what[48];
            snprintf(what, sizeof what, rep < 0 ? "speed: warm-up" : "speed: repetition %d", rep + 1);
            progress_show(&pr, rep + 1, what);
            if (np) {
                mpq_llm_state_reset(&s);
                const double t0 = cli_now();
                st = mpq_llm_forward(L.m, &s, tok, np, skip, logits, np - 1);
                if (rep >= 0) pp[rep] = np / (cli_now() - t0);
            }
            if (ng && st == MPQ_OK) {
                mpq_llm_state_reset(&s);
                for (int i = 0; i < nb && nb > 1; i++) mpq_llm_state_reset(&seqs[i]);
                const double t0 = cli_now();
                for (int i = 0; i < ng && st == MPQ_OK; i++)
                    st = nb == 1 ? mpq_llm_forward(L.m, &s, &tok[i], 1, skip, logits, 0)
                                 : mpq_llm_decode(L.m, sp, nb, &tok[(size_t)i * nb], skip, &s, logits);
                if (rep >= 0) tg[rep] = (double)ng * nb / (cli_now() - t0);
            }
        }
        progress_end(&pr);
        if (st != MPQ_OK) {
            rc = fail(EXIT_QUANT, "speed: %s", mpq_status_str(st));
        } else {
            int threads = 1;
#ifdef _OPENMP
            threads = omp_get_max_threads();
#endif
            const double bpw = mpq_llm_bpw(L.m, 2, -1);
            printf(
                "| model | linear bpw | MB | threads | test | tokens/s |\n| --- | ---: | ---: | ---: | --- | ---: |\n");
            double m, sd;
            if (np) {
                mean_sd(pp, reps, &m, &sd);
                printf("| %s | %.3f | %.1f | %d | pp%d | %.2f +/- %.2f |\n", model, bpw,
                       (double)mpq_llm_weight_bytes(L.m) / 1e6, threads, np, m, sd);
            }
            if (ng) {
                mean_sd(tg, reps, &m, &sd);
                char test[48];
                if (nb > 1)
                    snprintf(test, sizeof test, "tg%d x %d sequences", ng, nb);
                else
                    snprintf(test, sizeof test, "tg%d", ng);
                printf("| %s | %.3f | %.1f | %d | %s | %.2f +/- %.2f |\n", model, bpw,
                       (double)mpq_llm_weight_bytes(L.m) / 1e6, threads, test, m, sd);
            }
        }
    }
    mpq_llm_state_free(&s);
    for (int i = 0; i < nb && seqs; i++) mpq_llm_state_free(&seqs[i]);
    free(seqs), free(sp);
    free(tok), free(logits), free(pp), free(tg);
    unload(&L);
    return rc;
}

/* ---------------------------------------------------------------------------
   calibrate
   ------------------------------------------------------------------------ */

typedef struct calib_progress {
    progress p;
    const char *phase;
} calib_progress;

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

/* "fisher,mixllm,..." -> MPQ_CALIB_* flags; 0 when a name is unknown. */
static unsigned parse_stats(const char *v)
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
    return f;
}

int cmd_calibrate(int argc, char **argv)
{
    args a = {argc, 0, argv, "calibrate"};
    llm_opts lo = {0, 0, "cpu", 0};
    mpq_calib_opts co;
    memset(&co, 0, sizeof co);
    const char *pos[2] = {0}, *out = NULL;
    int npos = 0, bad = 0;
    for (a.i = 1; a.i < argc && !bad; a.i++) {
        const char *v = NULL;
        if (opt(&a, "--help", NULL, &bad) || opt(&a, "-h", NULL, &bad)) {
            puts("usage: mpq calibrate [options] MODEL TEXT -o STATS.safetensors\n"
                 "\n"
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
                 "  N.xtx                cols x cols  X^T X, position 0 included (only with --stats xtx;\n"
                 "                                    GPTQ's --hessian)\n"
                 "Windows are taken evenly from the whole text; position 0 of each (BOS, an attention\n"
                 "sink) is left out of the activation statistics but X^T X. Memory does not grow with\n"
                 "--windows; the result is the same for any --threads.\n"
                 "\n"
                 "  -o FILE            the statistics file (required)\n"
                 "  --windows N        calibration windows (default 16)\n"
                 "  --length N         tokens per window (default 512)\n"
                 "  --stats LIST       fisher,mixllm,acts,pqi,sensitivity,xtx or all (default all:\n"
                 "                     everything but xtx, which is cols^2 per map)\n"
                 "  --awq-tokens N     input rows kept per map for AWQ (default 128)\n"
                 "  --mixllm-bits B    MixLLM's low width, the delta of its salience (default 4)\n"
                 "  --pqi-bits B       PQI's target: RTN at B bits, g128 (default 3)\n"
                 "  --pqi-steps N      gradient points along the path (default 4)\n"
                 "  --pqi-windows N    windows of each PQI gradient (default 4)\n"
                 "  --sens-tokens N    tokens of the layer-sensitivity passes (default 256)\n" COMMON_HELP);
            return 0;
        } else if (common_opt(&a, &lo, &bad)) {
        } else if (opt(&a, "-o", &v, &bad) || opt(&a, "--output", &v, &bad)) {
            out = v;
        } else if (opt(&a, "--windows", &v, &bad)) {
            bad = bad || !parse_int("calibrate", "--windows", v, 1, 1 << 20, &co.windows);
        } else if (opt(&a, "--length", &v, &bad)) {
            bad = bad || !parse_int("calibrate", "--length", v, 2, 1 << 16, &co.length);
        } else if (opt(&a, "--awq-tokens", &v, &bad)) {
            bad = bad || !parse_int("calibrate", "--awq-tokens", v, 1, 1 << 20, &co.awq_tokens);
        } else if (opt(&a, "--mixllm-bits", &v, &bad)) {
            bad = bad || !parse_int("calibrate", "--mixllm-bits", v, 1, 8, &co.mixllm_bits);
        } else if (opt(&a, "--pqi-bits", &v, &bad)) {
            bad = bad || !parse_int("calibrate", "--pqi-bits", v, 1, 8, &co.pqi_bits);
        } else if (opt(&a, "--pqi-steps", &v, &bad)) {
            bad = bad || !parse_int("calibrate", "--pqi-steps", v, 1, 1000, &co.pqi_steps);
        } else if (opt(&a, "--pqi-windows", &v, &bad)) {
            bad = bad || !parse_int("calibrate", "--pqi-windows", v, 1, 1 << 20, &co.pqi_windows);
        } else if (opt(&a, "--sens-tokens", &v, &bad)) {
            bad = bad || !parse_int("calibrate", "--sens-tokens", v, 2, 1 << 16, &co.sens_tokens);
        } else if (opt(&a, "--stats", &v, &bad)) {
            if (!bad && !(co.what = parse_stats(v)))
                bad = fail(EXIT_USAGE,
                           "calibrate --stats: '%s' is not a list of fisher, mixllm, acts, pqi, "
                           "sensitivity, xtx, all",
                           v);
        } else {
            model_text_arg(&a, pos, &npos, &bad);
        }
    }
    if (bad) return EXIT_USAGE;
    if (lo.a8) return fail(EXIT_USAGE, "calibrate --a8: the statistics are gathered with float activations");
    if (npos != 2 || !out) return fail(EXIT_USAGE, "calibrate: needs MODEL TEXT -o FILE (see mpq calibrate --help)");
    if (lo.device && strcmp(lo.device, "cpu"))
        return fail(EXIT_USAGE, "calibrate: runs on the CPU only (--device cpu)");
    char *text = NULL;
    size_t len = 0;
    int rc = read_text(pos[1], &text, &len);
    if (rc) return rc;
    loaded L;
    if ((rc = load(pos[0], &lo, &L)) != 0) {
        free(text);
        return rc;
    }
    mpq_io_err e;
    int32_t *tok = NULL;
    size_t nt = 0;
    mpq_status st = mpq_tokenize(L.m->tok, text, len, 0, &tok, &nt, &e);
    if (st != MPQ_OK) rc = fail(EXIT_INPUT, "%s: %s", pos[1], e.msg);
    const int length = co.length ? co.length : 512;
    if (!rc && nt < (size_t)length)
        rc = fail(EXIT_INPUT, "%s: %zu tokens, shorter than one calibration window of %d (--length)", pos[1], nt,
                  length);
    mpq_calib_stats s;
    memset(&s, 0, sizeof s);
    if (!rc) {
        const int windows = co.windows ? co.windows : 16;
        if (!lo.quiet)
            fprintf(stderr, "mpq: %s: %zu tokens; %d windows of %d%s\n", pos[1], nt,
                    (size_t)windows <= nt / (size_t)length ? windows : (int)(nt / (size_t)length), length,
                    (size_t)windows <= nt / (size_t)length ? "" : " (all that fit)");
        calib_progress cp;
        memset(&cp, 0, sizeof cp);
        cp.p.on = !lo.quiet;
        co.progress = calib_step, co.user = &cp;
        const double t0 = cli_now();
        st = mpq_llm_calibrate(L.m, tok, nt, &co, &s, &e);
        progress_end(&cp.p);
        if (st != MPQ_OK)
            rc = fail(st == MPQ_ERR_NOMEM ? EXIT_QUANT : EXIT_INPUT, "%s", e.msg);
        else if (!lo.quiet)
            fprintf(stderr, "mpq: calibration loss %.4f over %d windows (%.1f s)\n", s.loss, s.windows, cli_now() - t0);
    }
    if (!rc) {
        char extra[2048];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", pos[0]);
        cJSON_AddStringToObject(o, "text", pos[1]);
        cJSON_AddNumberToObject(o, "text_bytes", (double)len);
        snprintf(extra, sizeof extra, "%016llx", (unsigned long long)mpq_text_hash(text, len));
        cJSON_AddStringToObject(o, "text_fnv1a", extra);
        char *j = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!j || (st = mpq_calib_write(L.m, &s, j, out, &e)) != MPQ_OK)
            rc = fail(EXIT_OUTPUT, "%s", j ? e.msg : "out of memory");
        else if (!lo.quiet)
            printf("%s: statistics of %d linear maps from %d windows of %d tokens\n", out, s.nlin, s.windows, s.length);
        free(j);
    }
    mpq_calib_stats_free(&s);
    free(tok);
    free(text);
    unload(&L);
    return rc;
}

/* ---------------------------------------------------------------------------
   schedule
   ------------------------------------------------------------------------ */

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

int cmd_schedule(int argc, char **argv)
{
    args a = {argc, 0, argv, "schedule"};
    llm_opts lo = {0, 0, "cpu", 0};
    mpq_pmpd_search d;
    memset(&d, 0, sizeof d);
    d.nlevels = 2, d.skip[0] = 0, d.skip[1] = 1, d.candidates = 5;
    double max_increase = 0.10;
    int ctx = 512, chunks = 4, learned = 0;
    learn_opts lrn = {64, 32, 1, 0, {0}, 0.25, {300, 0.01, 0}, 5, {1e-3, 1e-2, 1e-1, 1, 10}};
    const char *pos[2] = {0}, *out = NULL;
    int npos = 0, bad = 0;
    for (a.i = 1; a.i < argc && !bad; a.i++) {
        const char *v = NULL;
        if (opt(&a, "--help", NULL, &bad) || opt(&a, "-h", NULL, &bad)) {
            puts("usage: mpq schedule [options] MODEL TEXT -o SCHEDULE\n"
                 "\n"
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
                 "  -o FILE            where the schedule goes (required)\n"
                 "  --levels LIST      skip_planes of the levels, increasing (default 0,1)\n"
                 "  --prefill K        skip_planes of the prompt (default 0)\n"
                 "  --max-increase X   allowed perplexity increase over the first level (default 0.10)\n"
                 "  --candidates N     switch points, 0 and L included (default 5)\n"
                 "  --ctx N            tokens per chunk (default 512; L = N - N/2 decoded tokens)\n"
                 "  --chunks N         chunks of TEXT per quality (default 4)\n"
                 "\n"
                 "--learned trains PMPD's learned scheduler instead (section 4.2, appendix A.1): for\n"
                 "each of --windows windows of --ctx tokens of TEXT, the first half the prompt, the\n"
                 "label is the fewest decoded tokens at the first level (of the N candidates) whose\n"
                 "perplexity of the rest of the window, teacher-forced, is within --max-increase of\n"
                 "all tokens at the first level; the network (attention of a learned query over the\n"
                 "prompt's keys and values in one layer, then an MLP) learns the label from the\n"
                 "cache. Writes a safetensors file that `mpq run --schedule learned:FILE` reads.\n"
                 "  --learned          train the learned scheduler (two levels; -o FILE.safetensors)\n"
                 "  --windows N        training windows (default 64)\n"
                 "  --layer LIST       the layer whose cache it reads (default the last); with several,\n"
                 "                     the one whose cache predicts the labels best (cross-validated)\n"
                 "  --hidden H         hidden units of the MLP (default 32)\n"
                 "  --steps N          Adam steps over all windows (default 300)\n"
                 "  --lr X             learning rate (default 0.01)\n"
                 "  --l2 LIST          weight decays of the MLP's matrices to choose from by 4-fold\n"
                 "                     cross-validation (default 0.001,0.01,0.1,1,10)\n"
                 "  --seed S           initialisation (default 1)\n"
                 "  --holdout F        first train without a fraction F of the windows and report how\n"
                 "                     well it predicts them (default 0.25; 0: skip); then train on all\n" COMMON_HELP);
            return 0;
        } else if (common_opt(&a, &lo, &bad)) {
        } else if (opt(&a, "-o", &v, &bad) || opt(&a, "--output", &v, &bad)) {
            out = v;
        } else if (opt(&a, "--levels", &v, &bad)) {
            if (!bad && !(d.nlevels = parse_levels(v, d.skip)))
                bad = fail(EXIT_USAGE, "schedule --levels: '%s' is not increasing skips 0..7", v);
        } else if (opt(&a, "--prefill", &v, &bad)) {
            bad = bad || !parse_int("schedule", "--prefill", v, 0, 7, &d.prefill_skip);
        } else if (opt(&a, "--max-increase", &v, &bad)) {
            bad = bad || !parse_double("schedule", "--max-increase", v, 0, 1e6, &max_increase);
        } else if (opt(&a, "--candidates", &v, &bad)) {
            bad = bad || !parse_int("schedule", "--candidates", v, 2, 64, &d.candidates);
        } else if (opt(&a, "--ctx", &v, &bad)) {
            bad = bad || !parse_int("schedule", "--ctx", v, 4, 1 << 20, &ctx);
        } else if (opt(&a, "--chunks", &v, &bad)) {
            bad = bad || !parse_int("schedule", "--chunks", v, 1, 1 << 20, &chunks);
        } else if (opt(&a, "--learned", NULL, &bad)) {
            learned = 1;
        } else if (opt(&a, "--windows", &v, &bad)) {
            bad = bad || !parse_int("schedule", "--windows", v, 2, 1 << 20, &lrn.windows);
        } else if (opt(&a, "--layer", &v, &bad)) {
            double x[8];
            if (!bad && !(lrn.nlayers = parse_list(v, x, 8)))
                bad = fail(EXIT_USAGE, "schedule --layer: '%s' is not a list of at most 8 layers", v);
            for (int k = 0; k < lrn.nlayers && !bad; k++) {
                if (x[k] != (int)x[k]) bad = fail(EXIT_USAGE, "schedule --layer: %g is not a layer", x[k]);
                lrn.layers[k] = (int)x[k];
            }
        } else if (opt(&a, "--hidden", &v, &bad)) {
            bad = bad || !parse_int("schedule", "--hidden", v, 1, 4096, &lrn.hidden);
        } else if (opt(&a, "--steps", &v, &bad)) {
            bad = bad || !parse_int("schedule", "--steps", v, 1, 1 << 20, &lrn.train.steps);
        } else if (opt(&a, "--lr", &v, &bad)) {
            bad = bad || !parse_double("schedule", "--lr", v, 1e-9, 10, &lrn.train.lr);
        } else if (opt(&a, "--l2", &v, &bad)) {
            if (!bad && !(lrn.nl2 = parse_list(v, lrn.l2, 8)))
                bad = fail(EXIT_USAGE, "schedule --l2: '%s' is not a list of at most 8 numbers in [0, 1000]", v);
        } else if (opt(&a, "--seed", &v, &bad)) {
            bad = bad || !parse_int("schedule", "--seed", v, 0, INT32_MAX, &lrn.seed);
        } else if (opt(&a, "--holdout", &v, &bad)) {
            bad = bad || !parse_double("schedule", "--holdout", v, 0, 0.9, &lrn.holdout);
        } else {
            model_text_arg(&a, pos, &npos, &bad);
        }
    }
    if (bad) return EXIT_USAGE;
    if (npos != 2 || !out) return fail(EXIT_USAGE, "schedule: needs MODEL TEXT -o FILE (see mpq schedule --help)");
    if (learned && d.nlevels != 2)
        return fail(EXIT_USAGE, "schedule --learned: two levels (--levels HIGH,LOW), not %d", d.nlevels);
    char *text = NULL;
    size_t len = 0;
    int rc = read_text(pos[1], &text, &len);
    if (rc) return rc;
    if (len && text[len - 1] == '\n') len--;
    loaded L;
    if ((rc = load(pos[0], &lo, &L)) != 0) {
        free(text);
        return rc;
    }
    mpq_io_err e;
    sched_ctx C;
    memset(&C, 0, sizeof C);
    C.m = L.m, C.quiet = lo.quiet;
    C.po.ctx = ctx, C.po.chunks = chunks;
    int32_t *tok = NULL;
    double bits[MPQ_MAX_BITS + 1];
    if (mpq_llm_bpw(L.m, 1, -1) <= 0) rc = fail(EXIT_INPUT, "%s: no packed linear maps: nothing to schedule", pos[0]);
    if (!rc && mpq_tokenize(L.m->tok, text, len, MPQ_TOK_BOS, &tok, &C.n, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", pos[1], e.msg);
    if (!rc && C.n < (size_t)ctx) rc = fail(EXIT_INPUT, "%s: %zu tokens, fewer than one chunk of %d", pos[1], C.n, ctx);
    C.tok = tok;
    if (!rc && learned) {
        rc = schedule_learned(L.m, pos[0], pos[1], tok, C.n, &d, max_increase, ctx, &lrn, lo.quiet, out);
        free(tok);
        free(text);
        unload(&L);
        return rc;
    }
    for (int k = 0; k <= d.skip[d.nlevels - 1] && k <= MPQ_MAX_BITS; k++) bits[k] = mpq_llm_bpw(L.m, 1, k);
    d.bits = bits, d.length = ctx - ctx / 2;
    mpq_pmpd_schedule ref, best;
    memset(&ref, 0, sizeof ref);
    ref.prefill_skip = d.prefill_skip, ref.nlevels = 1, ref.skip[0] = d.skip[0];
    double qref = 0, q = 0;
    int evaluated = 0;
    mpq_status st = MPQ_OK;
    if (!rc && (st = sched_quality(&C, &ref, &qref)) != MPQ_OK)
        rc = fail(EXIT_QUANT, "schedule: %s", mpq_status_str(st));
    if (!rc) {
        d.target = qref * (1 + max_increase); /* qualities are -ppl */
        st = mpq_pmpd_static_search(&d, sched_quality, &C, &best, &q, &evaluated);
        if (st == MPQ_ERR_RANGE)
            rc = fail(EXIT_QUANT, "schedule: no schedule meets perplexity %.4f", -d.target);
        else if (st != MPQ_OK)
            rc = fail(EXIT_QUANT, "schedule: %s", mpq_status_str(st));
    }
    if (!rc) {
        double avg = 0;
        mpq_pmpd_average_bits(&best, bits, d.length, &avg);
        char t[128];
        schedule_text(&best, t, sizeof t);
        FILE *f = fopen(out, "w");
        if (!f) {
            rc = fail(EXIT_OUTPUT, "%s: cannot open: %s", out, strerror(errno));
        } else {
            fprintf(f,
                    "%s # PMPD static schedule: %.3f bits per weight per decoded token over %ld tokens, ppl %.4f "
                    "(first level %.4f, target %.4f) on %s\n",
                    t, avg, d.length, -q, -qref, -d.target, pos[1]);
            if (fclose(f) != 0) rc = fail(EXIT_OUTPUT, "%s: write failed", out);
        }
        if (!rc)
            printf("%s: %s  %.3f bits per decoded token (first level %.3f); ppl %.4f, first level %.4f; %d schedules "
                   "evaluated\n",
                   out, t, avg, bits[d.skip[0]], -q, -qref, evaluated + 1);
    }
    free(tok);
    free(text);
    unload(&L);
    return rc;
}

/* ---------------------------------------------------------------------------
   gen-eval
   ------------------------------------------------------------------------ */

#define GE_MAX_SPECS 8

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

int cmd_gen_eval(int argc, char **argv)
{
    args a = {argc, 0, argv, "gen-eval"};
    llm_opts lo = {0, 0, "cpu", 0};
    const char *pos[2] = {0}, *ref_path = NULL;
    int npos = 0, bad = 0, nspec = 0, nprompts = 16, P = 128, L = 128;
    ge_spec *sp = (ge_spec *)calloc(GE_MAX_SPECS, sizeof *sp);
    if (!sp) return fail(EXIT_QUANT, "out of memory");
    for (a.i = 1; a.i < argc && !bad; a.i++) {
        const char *v = NULL;
        if (opt(&a, "--help", NULL, &bad) || opt(&a, "-h", NULL, &bad)) {
            puts("usage: mpq gen-eval [options] MODEL TEXT --reference REF --schedule SPEC [--schedule SPEC]...\n"
                 "\n"
                 "Generation under PMPD precision schedules, measured as PMPD's evaluation does: --prompts\n"
                 "prompts of --prompt-tokens tokens taken evenly from TEXT (evaluation text, never the\n"
                 "text a scheduler was made on), each continued greedily for up to -n tokens under\n"
                 "every SPEC. Per SPEC: the bits per weight read per decoded token (averaged over all\n"
                 "decoded tokens), the perplexity of the continuations under REF (the reference model,\n"
                 "each continuation after its prompt), the perplexity of TEXT's own next -n tokens\n"
                 "read under the SPEC's schedule for that prompt (teacher-forced, as `mpq schedule`\n"
                 "measures quality), how many tokens equal the first SPEC's at the same position and\n"
                 "how long the common start is, and the decode rate.\n"
                 "\n"
                 "  --reference REF      the model that scores the continuations (float weights)\n"
                 "  --schedule SPEC      P:S@T,... (or a file whose first line is one), or\n"
                 "                       learned:FILE (`mpq schedule --learned`); up to 8, the first\n"
                 "                       is the baseline the others are compared with\n"
                 "  --prompts N          prompts (default 16)\n"
                 "  --prompt-tokens N    tokens per prompt (default 128)\n"
                 "  -n, --tokens N       tokens to generate per prompt (default 128)\n" COMMON_HELP);
            free(sp);
            return 0;
        } else if (common_opt(&a, &lo, &bad)) {
        } else if (opt(&a, "--reference", &v, &bad)) {
            ref_path = v;
        } else if (opt(&a, "--schedule", &v, &bad)) {
            if (bad) break;
            if (nspec == GE_MAX_SPECS) {
                bad = fail(EXIT_USAGE, "gen-eval: at most %d --schedule", GE_MAX_SPECS);
                break;
            }
            sp[nspec].text = v;
            sp[nspec].learned = !strncmp(v, "learned:", 8);
            if (!sp[nspec].learned && !read_schedule(v, &sp[nspec].s))
                bad = fail(EXIT_USAGE,
                           "gen-eval --schedule: '%s' is not P:S@T,S@T,... with S and T increasing, nor a file "
                           "holding one, nor learned:FILE",
                           v);
            nspec++;
        } else if (opt(&a, "--prompts", &v, &bad)) {
            bad = bad || !parse_int("gen-eval", "--prompts", v, 1, 1 << 20, &nprompts);
        } else if (opt(&a, "--prompt-tokens", &v, &bad)) {
            bad = bad || !parse_int("gen-eval", "--prompt-tokens", v, 1, 1 << 20, &P);
        } else if (opt(&a, "--tokens", &v, &bad) || opt(&a, "-n", &v, &bad)) {
            bad = bad || !parse_int("gen-eval", "--tokens", v, 1, 1 << 20, &L);
        } else {
            model_text_arg(&a, pos, &npos, &bad);
        }
    }
    if (!bad && (npos != 2 || !ref_path || !nspec))
        bad = fail(EXIT_USAGE, "gen-eval: needs MODEL TEXT --reference REF --schedule SPEC (see mpq gen-eval --help)");
    if (bad) {
        free(sp);
        return EXIT_USAGE;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = read_text(pos[1], &text, &len);
    loaded M, R;
    memset(&M, 0, sizeof M), memset(&R, 0, sizeof R);
    llm_opts ro = lo;
    ro.device = "cpu", ro.a8 = 0;
    if (!rc) rc = load(pos[0], &lo, &M);
    if (!rc) rc = load(ref_path, &ro, &R);
    if (!rc && mpq_llm_bpw(M.m, 1, -1) <= 0) rc = fail(EXIT_INPUT, "%s: no packed linear maps to schedule", pos[0]);
    if (!rc && R.m->c.vocab != M.m->c.vocab)
        rc = fail(EXIT_INPUT, "%s: vocabulary of %d, %s has %d", ref_path, R.m->c.vocab, pos[0], M.m->c.vocab);
    for (int j = 0; j < nspec && !rc; j++) {
        mpq_io_err e;
        if (sp[j].learned && mpq_pmpd_learned_read(M.m, sp[j].text + 8, &sp[j].n, &e) != MPQ_OK)
            rc = fail(EXIT_INPUT, "%s", e.msg);
    }
    int32_t *tok = NULL, *prompt = NULL, *outs = NULL;
    size_t nt = 0;
    mpq_io_err e;
    if (!rc && mpq_tokenize(M.m->tok, text, len, 0, &tok, &nt, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s: %s", pos[1], e.msg);
    const size_t win = (size_t)P + (size_t)L + 1, avail = nt / win; /* a prompt, its own next L + 1 tokens */
    if (!rc && avail < (size_t)nprompts)
        rc = fail(EXIT_INPUT, "%s: %zu tokens: fewer than %d windows of %d prompt and %d + 1 following tokens", pos[1],
                  nt, nprompts, P, L);
    const int V = M.m ? M.m->c.vocab : 0, ctx = P + L;
    mpq_llm_state s, rs, ts;
    memset(&s, 0, sizeof s), memset(&rs, 0, sizeof rs), memset(&ts, 0, sizeof ts);
    float *z0 = NULL, *z = NULL;
    mpq_status st = MPQ_OK;
    if (!rc &&
        ((st = mpq_llm_state_init(M.m, ctx, 64, &s)) != MPQ_OK ||
         (st = mpq_llm_state_init(R.m, ctx, 64, &rs)) != MPQ_OK ||
         (st = mpq_llm_state_init(M.m, ctx, 64, &ts)) != MPQ_OK))
        rc = fail(EXIT_QUANT, "gen-eval: a cache of %d positions: %s", ctx, mpq_status_str(st));
    if (!rc &&
        (!(prompt = (int32_t *)malloc(sizeof(int32_t) * (size_t)P)) ||
         !(outs = (int32_t *)malloc(sizeof(int32_t) * (size_t)nspec * L)) ||
         !(z0 = (float *)malloc(sizeof(float) * (size_t)V)) || !(z = (float *)malloc(sizeof(float) * (size_t)L * V))))
        rc = fail(EXIT_QUANT, "out of memory");
    double bits[MPQ_MAX_BITS];
    for (int k = 0; k < MPQ_MAX_BITS && !rc; k++) bits[k] = mpq_llm_bpw(M.m, 1, k);
    int ntok[GE_MAX_SPECS] = {0};
    progress pr;
    progress_start(&pr, "mpq", !lo.quiet, nprompts);
    const double t0 = cli_now();
    for (int i = 0; i < nprompts && !rc; i++) {
        const size_t at = (size_t)((double)i * (double)(avail - 1) / (nprompts > 1 ? nprompts - 1 : 1) + 0.5) * win;
        const int32_t *truth = tok + at + P;
        int tf_prefill = -1; /* the prefill skip whose prompt pass ts holds */
        memcpy(prompt, tok + at, sizeof(int32_t) * (size_t)P);
        if (mpq_tokenizer_adds_bos(M.m->tok) && mpq_tokenizer_bos(M.m->tok) >= 0)
            prompt[0] = mpq_tokenizer_bos(M.m->tok);
        for (int j = 0; j < nspec && !rc; j++) {
            mpq_gen_opts g;
            memset(&g, 0, sizeof g);
            g.max_tokens = L;
            g.schedule = sp[j].learned ? NULL : &sp[j].s;
            g.learned = sp[j].learned ? &sp[j].n : NULL;
            mpq_gen_result r;
            int32_t *o = outs + (size_t)j * L;
            if ((st = mpq_llm_generate(M.m, &s, prompt, P, &g, o, L, &r)) != MPQ_OK) {
                rc = fail(EXIT_QUANT, "gen-eval: prompt %d, schedule %s: %s", i, sp[j].text, mpq_status_str(st));
                break;
            }
            ntok[j] = r.tokens;
            double avg = 0;
            if (r.tokens > 0 && mpq_pmpd_average_bits(&r.schedule, bits, r.tokens, &avg) == MPQ_OK)
                sp[j].bits += avg * r.tokens;
            sp[j].tokens += r.tokens;
            sp[j].passes += r.tokens > 0 ? r.tokens - 1 : 0;
            sp[j].decode_s += r.decode_seconds, sp[j].predict_s += r.schedule_seconds;
            if (r.learned_class >= 0) sp[j].classes[r.learned_class]++;
            int pre = 0;
            while (pre < ntok[j] && pre < ntok[0] && o[pre] == outs[pre]) pre++;
            sp[j].prefix += pre;
            for (int t = 0; t < ntok[j] && t < ntok[0]; t++) sp[j].same += o[t] == outs[t];
            /* the text's own continuation under this prompt's schedule: pass t
               (token truth[t]) at the schedule's skip for t predicts truth[t + 1] */
            if (r.schedule.prefill_skip != tf_prefill) {
                mpq_llm_state_reset(&ts);
                if ((st = mpq_llm_forward(M.m, &ts, prompt, P, r.schedule.prefill_skip, NULL, P)) != MPQ_OK) break;
                tf_prefill = r.schedule.prefill_skip;
            }
            ts.pos = P;
            for (int p = 0; p < L && st == MPQ_OK;) {
                const int k = mpq_pmpd_skip_at(&r.schedule, p);
                int q = p + 1;
                while (q < L && mpq_pmpd_skip_at(&r.schedule, q) == k) q++;
                st = mpq_llm_forward(M.m, &ts, truth + p, q - p, k, z + (size_t)p * V, 0);
                p = q;
            }
            for (int t = 0; t < L && st == MPQ_OK; t++) sp[j].tf_nll += nll_of(z + (size_t)t * V, V, truth[t + 1]);
            sp[j].tf_scored += L;
        }
        if (!rc && st != MPQ_OK)
            rc = fail(EXIT_QUANT, "gen-eval: prompt %d, the text's continuation: %s", i, mpq_status_str(st));
        /* the continuations under the reference, after the prompt's one pass */
        mpq_llm_state_reset(&rs);
        if (!rc && (st = mpq_llm_forward(R.m, &rs, prompt, P, 0, z0, P - 1)) != MPQ_OK)
            rc = fail(EXIT_QUANT, "gen-eval: the reference: %s", mpq_status_str(st));
        for (int j = 0; j < nspec && !rc; j++) {
            const int32_t *o = outs + (size_t)j * L;
            const int n = ntok[j];
            if (n == 0) continue;
            rs.pos = P;
            if (n > 1 && (st = mpq_llm_forward(R.m, &rs, o, n - 1, 0, z, 0)) != MPQ_OK) {
                rc = fail(EXIT_QUANT, "gen-eval: the reference: %s", mpq_status_str(st));
                break;
            }
            sp[j].nll += nll_of(z0, V, o[0]);
            for (int t = 1; t < n; t++) sp[j].nll += nll_of(z + (size_t)(t - 1) * V, V, o[t]);
            sp[j].scored += n;
        }
        char what[64];
        snprintf(what, sizeof what, " prompts, %.0f s", cli_now() - t0);
        progress_show(&pr, i + 1, what);
    }
    progress_end(&pr);
    if (!rc) {
        printf("%d prompts of %d tokens from %s, up to %d tokens each, greedy; continuations scored by %s\n\n",
               nprompts, P, pos[1], L, ref_path);
        printf("| schedule | bits per decoded token | generated: ppl under the reference | vs first | text: ppl "
               "(teacher-forced) | vs first | same tokens as first | common start | decode tokens/s | classes |\n"
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
        const double ppl0 = exp(sp[0].nll / (double)sp[0].scored), tf0 = exp(sp[0].tf_nll / (double)sp[0].tf_scored);
        for (int j = 0; j < nspec; j++) {
            const double ppl = exp(sp[j].nll / (double)sp[j].scored);
            char cls[256] = "";
            int k = 0;
            for (int c = 0; sp[j].learned && c < sp[j].n.classes; c++)
                k += snprintf(cls + k, sizeof cls - (size_t)k, "%s%d", c ? "," : "", sp[j].classes[c]);
            if (sp[j].learned)
                snprintf(cls + k, sizeof cls - (size_t)k, " (%.2f ms each)", 1e3 * sp[j].predict_s / nprompts);
            const double tf = exp(sp[j].tf_nll / (double)sp[j].tf_scored);
            printf("| %s | %.3f | %.4f | %+.2f %% | %.4f | %+.2f %% | %.1f %% | %.1f | %.1f | %s |\n", sp[j].text,
                   sp[j].bits / (double)sp[j].tokens, ppl, 100 * (ppl / ppl0 - 1), tf, 100 * (tf / tf0 - 1),
                   100.0 * (double)sp[j].same / (double)sp[0].tokens, (double)sp[j].prefix / nprompts,
                   sp[j].decode_s > 0 ? (double)sp[j].passes / sp[j].decode_s : 0.0, cls);
        }
    }
    for (int j = 0; j < nspec; j++) mpq_pmpd_learned_free(&sp[j].n);
    mpq_llm_state_free(&s), mpq_llm_state_free(&rs), mpq_llm_state_free(&ts);
    free(sp), free(tok), free(prompt), free(outs), free(z0), free(z), free(text);
    unload(&M), unload(&R);
    return rc;
}
