/* The `mpq` tool on language models end to end, on a tiny random model
   written as GGUF and as a Hugging Face directory (test/llm_fixture.h):
   `eval` prints the library's perplexity for both forms and for a file
   `quantize` wrote from each, and its KL divergence to a reference's
   record and its scheduled perplexity; the quantized matrices are those the
   library packs; `run` prints what mpq_llm_generate generates, greedy and
   under a PMPD schedule; and what goes wrong (a text that is not UTF-8, a
   prompt longer than the context, a truncated model) exits 2 with a
   message naming the file, leaving no output file. MPQ_CLI (set by meson)
   is the tool. */
#define _XOPEN_SOURCE 700
#include "common.h"
#include "llm_fixture.h"
#include "mpq_model.h"
#include "tmpdir.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];
static void setup(void) { cr_assert(tc_tmpdir_make(dir, sizeof dir, "cli-llm")); }
static void teardown(void)
{
    char p[600];
    snprintf(p, sizeof p, "%s/hf", dir);
    tc_tmpdir_remove(p);
    tc_tmpdir_remove(dir);
}

static void path_of(const char *name, char *p, size_t cap) { snprintf(p, cap, "%s/%s", dir, name); }

/* Runs `mpq <args>` in dir, stdout and stderr in files; the exit code. */
static int run(const char *args)
{
    const char *cli = getenv("MPQ_CLI");
    cr_assert(cli && *cli, "MPQ_CLI is not set");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && %s %s >out.txt 2>err.txt", dir, cli, args);
    const int st = system(cmd);
    cr_assert(WIFEXITED(st), "mpq %s did not exit normally", args);
    return WEXITSTATUS(st);
}

/* A whole file in the directory, NUL-terminated (malloc). */
static char *whole(const char *name, size_t *len)
{
    char p[600];
    path_of(name, p, sizeof p);
    FILE *f = fopen(p, "rb");
    cr_assert_not_null(f, "%s", p);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    const long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    cr_assert(b && fread(b, 1, (size_t)n, f) == (size_t)n, "%s", p);
    b[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return b;
}

static char *slurp(const char *name, size_t *len)
{
    char p[600];
    path_of(name, p, sizeof p);
    FILE *f = fopen(p, "rb");
    cr_assert_not_null(f, "%s", p);
    static char buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    if (len) *len = n;
    return buf;
}

static mpq_llm *load(const char *name)
{
    char p[600];
    path_of(name, p, sizeof p);
    mpq_llm *m = NULL;
    mpq_io_err e;
    cr_assert_eq(mpq_llm_load(p, &m, &e), MPQ_OK, "%s", e.msg);
    return m;
}

enum { CTX = 16 };

/* The perplexity the library computes on text.txt at context CTX. */
static double library_ppl(const mpq_llm *m, const char *text, size_t len)
{
    int32_t *tok;
    size_t n;
    mpq_io_err e;
    cr_assert_eq(mpq_tokenize(m->tok, text, len, MPQ_TOK_BOS, &tok, &n, &e), MPQ_OK, "%s", e.msg);
    mpq_ppl_opts o;
    memset(&o, 0, sizeof o);
    o.ctx = CTX;
    mpq_ppl_result r;
    cr_assert_eq(mpq_llm_perplexity(m, tok, n, &o, &r), MPQ_OK);
    cr_assert_geq(r.chunks, 3);
    free(tok);
    return r.ppl;
}

/* `mpq eval --ctx CTX MODEL text.txt` prints the library's perplexity. */
static void eval_matches(const char *model, const mpq_llm *m, const char *text, size_t len)
{
    char args[700], want[64];
    snprintf(args, sizeof args, "eval --quiet --ctx %d %s text.txt", CTX, model);
    cr_assert_eq(run(args), 0, "mpq %s: %s", args, slurp("err.txt", NULL));
    snprintf(want, sizeof want, "perplexity: %.4f ", library_ppl(m, text, len));
    const char *o = slurp("out.txt", NULL);
    cr_assert(strstr(o, want), "mpq %s printed \"%s\", the library gives \"%s\"", args, o, want);
}

/* The bytes `mpq run` prints for a greedy generation of n tokens. */
static void run_matches(const char *model, const mpq_llm *m, const char *schedule, const mpq_pmpd_schedule *s, int n)
{
    const char *prompt = "abc de";
    int32_t *tok, out[64];
    size_t nt;
    cr_assert_eq(mpq_tokenize(m->tok, prompt, strlen(prompt), MPQ_TOK_BOS | MPQ_TOK_SPECIAL, &tok, &nt, NULL), MPQ_OK);
    mpq_llm_state st;
    cr_assert_eq(mpq_llm_state_init(m, (int)nt + n, 64, &st), MPQ_OK);
    mpq_gen_opts g;
    memset(&g, 0, sizeof g);
    g.max_tokens = n, g.schedule = s;
    mpq_gen_result r;
    cr_assert_eq(mpq_llm_generate(m, &st, tok, (int)nt, &g, out, n, &r), MPQ_OK);
    char want[4096];
    size_t k = 0;
    for (int i = 0; i < r.tokens; i++) {
        if (mpq_token_is_special(m->tok, out[i])) continue;
        size_t b = 0;
        const char *bytes = mpq_token_bytes(m->tok, out[i], &b);
        if (!bytes) continue; /* a row past the vocabulary prints nothing */
        memcpy(want + k, bytes, b);
        k += b;
    }
    want[k++] = '\n';
    char args[700];
    snprintf(args, sizeof args, "run %s -n %d --prompt '%s'%s%s", model, n, prompt, schedule ? " --schedule " : "",
             schedule ? schedule : "");
    cr_assert_eq(run(args), 0, "mpq %s: %s", args, slurp("err.txt", NULL));
    size_t len;
    const char *o = slurp("out.txt", &len);
    cr_assert(len == k && !memcmp(o, want, k), "mpq %s printed \"%s\"", args, o);
    const char *e = slurp("err.txt", NULL);
    cr_assert(strstr(e, "decode:"), "%s", e);
    if (schedule) cr_assert(strstr(e, "skip 1 ("), "the time at each level: %s", e);
    mpq_llm_state_free(&st);
    free(tok);
}

/* Q holds the library's packing of F's floats at `bits` (default group). */
static int same_packing(const mpq_linear *F, const mpq_linear *Q, int bits)
{
    if (!Q->A.buf || !F->W) return 0;
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    d.rows = F->rows, d.cols = F->cols, d.uniform_bits = bits;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, F->W, &A), MPQ_OK);
    const size_t n = (size_t)F->rows * F->cols;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    cr_assert_eq(mpq_packed_dequantize(&A, 0, a), MPQ_OK);
    const int same = mpq_packed_dequantize(&Q->A, 0, b) == MPQ_OK && !memcmp(a, b, sizeof(float) * n);
    free(a), free(b);
    mpq_packed_free(&A);
    return same;
}

static void make_model(tl_model *tm, char *text, size_t *len)
{
    memset(tm, 0, sizeof *tm);
    tm->vocab_rows = 320, tm->dim = 64, tm->layers = 2, tm->heads = 4, tm->kv_heads = 2, tm->head_dim = 16;
    tm->ffn = 96, tm->theta = 10000.0, tm->eps = 1e-5;
    tl_make(tm, 77);
    char p[600];
    path_of("hf", p, sizeof p);
    mkdir(p, 0755);
    tl_write_hf(tm, p, MPQ_DT_BF16);
    path_of("m.gguf", p, sizeof p);
    tl_write_gguf(tm, p);
    /* text over the vocabulary's letters: a few chunks of CTX tokens */
    synth_rng r = {5};
    size_t k = 0;
    while (k < 600) {
        const int w = 1 + synth_int(&r, 6);
        for (int i = 0; i < w; i++) text[k++] = (char)('a' + synth_int(&r, 5));
        text[k++] = synth_int(&r, 8) ? ' ' : '\n';
    }
    text[k] = 0;
    *len = k;
    path_of("text.txt", p, sizeof p);
    tl_spit(p, text);
}

Test(cli_llm, eval_quantize_and_run_on_gguf_and_hf, .init = setup, .fini = teardown)
{
    tl_model tm;
    char text[700];
    size_t len;
    make_model(&tm, text, &len);
    mpq_llm *g = load("m.gguf"), *h = load("hf");
    eval_matches("m.gguf", g, text, len);
    eval_matches("hf", h, text, len);

    /* quantize both forms: the matrices are the library's packing of the
       same floats, the embedding (= head) at --embed-bits */
    cr_assert_eq(run("quantize --quiet --bits 4 --embed-bits 8 m.gguf qg.safetensors"), 0, "%s",
                 slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --quiet --bits 3 --embed-bits 6 hf qh.safetensors"), 0, "%s", slurp("err.txt", NULL));
    mpq_llm *qg = load("qg.safetensors"), *qh = load("qh.safetensors");
    const mpq_llm *from[2] = {g, h}, *to[2] = {qg, qh};
    const int bits[2] = {4, 3};
    for (int w = 0; w < 2; w++) {
        cr_assert_eq(to[w]->c.rope_style, from[w]->c.rope_style, "the rotary convention goes with the rows");
        for (int l = 0; l < tm.layers; l++)
            for (int k = 0; k < MPQ_LIN_COUNT; k++)
                cr_assert(same_packing(&from[w]->layer[l].lin[k], &to[w]->layer[l].lin[k], bits[w]),
                          "form %d, layer %d, map %d", w, l, k);
        cr_assert(same_packing(&from[w]->embed, &to[w]->embed, w ? 6 : 8), "the embedding at --embed-bits");
        cr_assert_eq(mpq_tokenizer_size(to[w]->tok), mpq_tokenizer_size(from[w]->tok), "the tokenizer goes along");
    }
    eval_matches("qg.safetensors", qg, text, len);
    eval_matches("qh.safetensors", qh, text, len);
    /* --a8: the packed maps multiply 8-bit activations, as the library does
       with m->a8 (which changes the perplexity); not on the fp16-weights
       device, not for calibrate */
    {
        const double ppl16 = library_ppl(qg, text, len);
        qg->a8 = 1;
        const double ppl8 = library_ppl(qg, text, len);
        qg->a8 = 0;
        cr_assert(ppl8 != ppl16, "8-bit activations change the perplexity (%.9g)", ppl8);
        char args[700], want[64];
        snprintf(args, sizeof args, "eval --quiet --a8 --ctx %d qg.safetensors text.txt", CTX);
        cr_assert_eq(run(args), 0, "%s", slurp("err.txt", NULL));
        snprintf(want, sizeof want, "perplexity: %.4f ", ppl8);
        cr_assert(strstr(slurp("out.txt", NULL), want), "%s: %s", want, slurp("out.txt", NULL));
        cr_assert_eq(run("eval --a8 --device cuda-fp16 qg.safetensors text.txt"), 1);
        cr_assert(strstr(slurp("err.txt", NULL), "cpu or cuda (cuda-fp16"), "%s", slurp("err.txt", NULL));
        cr_assert_eq(run("calibrate --a8 hf text.txt -o s.safetensors"), 1);
        cr_assert(strstr(slurp("err.txt", NULL), "float activations"), "%s", slurp("err.txt", NULL));
    }
    /* --cpu-path: the packed maps run on the kernels named, as the library
       does with m->cpu_path (the float-table path's perplexity differs from
       the int16-table paths' in the last digits at most); a path this build
       or CPU lacks is a usage error */
    {
        qg->cpu_path = MPQ_PATH_SCALAR;
        const double ppls = library_ppl(qg, text, len);
        qg->cpu_path = MPQ_PATH_AUTO;
        char args[700], want[64], other[64];
        mpq_path autop;
        cr_assert_eq(mpq_gemv_path(&qg->layer[0].lin[0].A, NULL, &autop), MPQ_OK);
        snprintf(other, sizeof other, "perplexity: %.4f ", library_ppl(qg, text, len));
        snprintf(args, sizeof args, "eval --quiet --cpu-path scalar --ctx %d qg.safetensors text.txt", CTX);
        cr_assert_eq(run(args), 0, "%s", slurp("err.txt", NULL));
        snprintf(want, sizeof want, "perplexity: %.4f ", ppls);
        cr_assert(strstr(slurp("out.txt", NULL), want), "%s: %s", want, slurp("out.txt", NULL));
        if (autop != MPQ_PATH_SCALAR && autop != MPQ_PATH_AVX2 && autop != MPQ_PATH_AVX512)
            cr_assert(strcmp(want, other), "the int16 tables print another perplexity (%s)", other);
        const mpq_path absent = mpq_path_available(MPQ_PATH_NEON) ? MPQ_PATH_AVX2 : MPQ_PATH_NEON;
        if (!mpq_path_available(absent)) {
            snprintf(args, sizeof args, "eval --cpu-path %s qg.safetensors text.txt", mpq_path_name(absent));
            cr_assert_eq(run(args), 1);
            cr_assert(strstr(slurp("err.txt", NULL), "does not have it"), "%s", slurp("err.txt", NULL));
        }
    }
    /* without --embed-bits the embedding (= head) stays as it was */
    cr_assert_eq(run("quantize --quiet --bits 4 m.gguf qd.safetensors"), 0, "%s", slurp("err.txt", NULL));
    mpq_llm *qd = load("qd.safetensors");
    cr_assert(!qd->embed.A.buf && qd->embed.W, "the embedding stays float by default");
    cr_assert(same_packing(&g->layer[0].lin[0], &qd->layer[0].lin[0], 4), "the linear maps are quantized");
    mpq_llm_free(qd);

    /* generation: greedy, and PMPD with the decode at 3 bits from token 4 */
    run_matches("m.gguf", g, NULL, NULL, 12);
    run_matches("qg.safetensors", qg, NULL, NULL, 12);
    mpq_pmpd_schedule s;
    memset(&s, 0, sizeof s);
    s.prefill_skip = 0, s.nlevels = 2, s.skip[0] = 0, s.skip[1] = 1, s.start[1] = 4;
    run_matches("qg.safetensors", qg, "0:0@0,1@4", &s, 12);
    const char *e = slurp("err.txt", NULL);
    cr_assert(strstr(e, "skip 0 (") && strstr(e, "skip 1 ("), "%s", e);
    cr_assert_eq(run("run m.gguf -n 4 --prompt 'abc'"), 0);
    cr_assert_null(strstr(slurp("err.txt", NULL), "skip 0"), "a float model has no planes to skip");

    /* speed: one sequence and three decoded together; bad -b and --device */
    cr_assert_eq(run("speed --quiet -p 4 -n 3 -b 3 -r 1 qg.safetensors"), 0, "%s", slurp("err.txt", NULL));
    const char *o = slurp("out.txt", NULL);
    cr_assert(strstr(o, "| pp4 |") && strstr(o, "| tg3 x 3 sequences |"), "%s", o);
    cr_assert_eq(run("speed --quiet -p 0 -n 3 -r 1 qg.safetensors"), 0);
    cr_assert(strstr(slurp("out.txt", NULL), "| tg3 |"));
    cr_assert_eq(run("speed -b 0 qg.safetensors"), 1);
    cr_assert(strstr(slurp("err.txt", NULL), "-b"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("speed -b 513 qg.safetensors"), 1);
    cr_assert_eq(run("speed --device gpu qg.safetensors"), 1);
    cr_assert(strstr(slurp("err.txt", NULL), "not cpu, cuda or cuda-fp16"), "%s", slurp("err.txt", NULL));

    mpq_llm_free(g), mpq_llm_free(h), mpq_llm_free(qg), mpq_llm_free(qh);
    tl_free(&tm);
}

/* The library's perplexity run on text.txt at context CTX with o's other
   options (kl_ref, schedule). */
static mpq_ppl_result library_run(const mpq_llm *m, const char *text, size_t len, mpq_ppl_opts o)
{
    int32_t *tok;
    size_t n;
    mpq_io_err e;
    cr_assert_eq(mpq_tokenize(m->tok, text, len, MPQ_TOK_BOS, &tok, &n, &e), MPQ_OK, "%s", e.msg);
    o.ctx = CTX;
    mpq_ppl_result r;
    cr_assert_eq(mpq_llm_perplexity(m, tok, n, &o, &r), MPQ_OK);
    free(tok);
    return r;
}

Test(cli_llm, eval_kl_divergence_and_schedules_print_the_library, .init = setup, .fini = teardown)
{
    tl_model tm;
    char text[700], args[700], want[256], p[600];
    size_t len;
    make_model(&tm, text, &len);
    cr_assert_eq(run("quantize --quiet --bits 3 m.gguf q.safetensors"), 0, "%s", slurp("err.txt", NULL));
    mpq_llm *g = load("m.gguf"), *q = load("q.safetensors");
    /* the reference's record, then the 3-bit model against it */
    snprintf(args, sizeof args, "eval --quiet --ctx %d --kl-base base.klb --kl-top 40 m.gguf text.txt", CTX);
    cr_assert_eq(run(args), 0, "%s", slurp("err.txt", NULL));
    mpq_kl_base b;
    mpq_io_err e;
    path_of("base.klb", p, sizeof p);
    cr_assert_eq(mpq_kl_base_read(p, &b, &e), MPQ_OK, "%s", e.msg);
    cr_assert(b.top == 40 && b.ctx == CTX && b.vocab == 320);
    mpq_ppl_opts o;
    memset(&o, 0, sizeof o);
    o.kl_ref = &b;
    const mpq_kl_result k = library_run(q, text, len, o).kl;
    cr_assert(k.kld > 0);
    cr_assert_eq(run("eval --quiet --kl base.klb q.safetensors text.txt"), 0, "%s", slurp("err.txt", NULL));
    const char *out = slurp("out.txt", NULL);
    snprintf(want, sizeof want, "KL divergence: %.6f +/- %.6f (median %.6f, 90%% %.6f, 99%% %.6f, max %.6f) over %ld",
             k.kld, k.kld_err, k.median, k.p90, k.p99, k.max, k.count);
    cr_assert(strstr(out, want), "printed \"%s\", the library gives \"%s\"", out, want);
    snprintf(want, sizeof want, "same top token: %.3f +/- %.3f %%", 100 * k.same_top, 100 * k.same_top_err);
    cr_assert(strstr(out, want), "%s", out);
    snprintf(want, sizeof want, "mean %.3f %%, mean |Delta p| %.3f %%, RMS %.3f %%", 100 * k.dp_mean, 100 * k.dp_abs,
             100 * k.dp_rms);
    cr_assert(strstr(out, want), "%s", out);
    /* the reference against itself, in place and read into memory, and the chunks taken from the file */
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(run(k ? "eval --quiet --in-memory --kl base.klb m.gguf text.txt"
                           : "eval --quiet --kl base.klb m.gguf text.txt"),
                     0, "%s", slurp("err.txt", NULL));
        out = slurp("out.txt", NULL);
        cr_assert(strstr(out, "KL divergence: 0.000000 +/- 0.000000") && strstr(out, "same top token: 100.000"), "%s",
                  out);
    }
    /* a static PMPD schedule: the library's scheduled perplexity */
    mpq_pmpd_schedule s;
    memset(&s, 0, sizeof s);
    s.prefill_skip = 1, s.nlevels = 2, s.skip[0] = 0, s.skip[1] = 1, s.start[1] = 3;
    memset(&o, 0, sizeof o);
    o.schedule = &s;
    snprintf(args, sizeof args, "eval --quiet --ctx %d --schedule 1:0@0,1@3 q.safetensors text.txt", CTX);
    cr_assert_eq(run(args), 0, "%s", slurp("err.txt", NULL));
    snprintf(want, sizeof want, "perplexity: %.4f ", library_run(q, text, len, o).ppl);
    cr_assert(strstr(slurp("out.txt", NULL), want), "%s: %s", want, slurp("out.txt", NULL));
    /* refused: another text (exit 2, both files named), another --ctx, a
       truncated file, and options that do not go together (exit 1) */
    path_of("other.txt", p, sizeof p);
    text[3] = text[3] == 'a' ? 'b' : 'a';
    tl_spit(p, text);
    cr_assert_eq(run("eval --kl base.klb q.safetensors other.txt"), 2);
    const char *err = slurp("err.txt", NULL);
    cr_assert(strstr(err, "base.klb") && strstr(err, "another text") && strstr(err, "other.txt"), "%s", err);
    snprintf(args, sizeof args, "eval --ctx %d --kl base.klb q.safetensors text.txt", CTX + 1);
    cr_assert_eq(run(args), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "chunks of 16 tokens"), "%s", slurp("err.txt", NULL));
    path_of("base.klb", p, sizeof p);
    FILE *f = fopen(p, "rb");
    static char buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    path_of("cut.klb", p, sizeof p);
    f = fopen(p, "wb");
    fwrite(buf, 1, n - 9, f);
    fclose(f);
    cr_assert_eq(run("eval --kl cut.klb q.safetensors text.txt"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "cut.klb"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("eval --kl-top 8 q.safetensors text.txt"), 1);
    cr_assert_eq(run("eval --schedule learned:x.safetensors q.safetensors text.txt"), 1);
    cr_assert_eq(run("eval --schedule 0:0@0,1@3 --skip-planes 1 q.safetensors text.txt"), 1);
    mpq_kl_base_free(&b);
    mpq_llm_free(g), mpq_llm_free(q);
    tl_free(&tm);
}

Test(cli_llm, bad_inputs_exit_2_naming_the_file, .init = setup, .fini = teardown)
{
    tl_model tm;
    char text[700], p[600];
    size_t len;
    make_model(&tm, text, &len);
    /* a text that is not UTF-8 */
    path_of("bad.txt", p, sizeof p);
    tl_spit(p, "good text, then \xc3( a broken sequence");
    cr_assert_eq(run("eval m.gguf bad.txt"), 2);
    const char *e = slurp("err.txt", NULL);
    cr_assert(strstr(e, "bad.txt") && strstr(e, "UTF-8"), "%s", e);
    cr_assert_eq(run("run m.gguf --prompt-file bad.txt"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "bad.txt"), "%s", slurp("err.txt", NULL));
    /* a text shorter than one chunk */
    path_of("short.txt", p, sizeof p);
    tl_spit(p, "ab cd");
    cr_assert_eq(run("eval --ctx 16 m.gguf short.txt"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "short.txt"), "%s", slurp("err.txt", NULL));
    /* a prompt longer than the context */
    cr_assert_eq(run("run m.gguf --ctx 8 --prompt 'a b c d e a b c d e a b c d e'"), 2);
    e = slurp("err.txt", NULL);
    cr_assert(strstr(e, "--prompt") && strstr(e, "does not fit"), "%s", e);
    /* a truncated model: the file named, and no output file */
    size_t n;
    uint8_t *b = tl_gguf(&tm, &n);
    path_of("cut.gguf", p, sizeof p);
    FILE *f = fopen(p, "wb");
    cr_assert_eq(fwrite(b, 1, n - 100, f), n - 100);
    fclose(f);
    free(b);
    cr_assert_eq(run("eval cut.gguf text.txt"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "cut.gguf"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --bits 4 cut.gguf out.safetensors"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "cut.gguf"), "%s", slurp("err.txt", NULL));
    path_of("out.safetensors", p, sizeof p);
    cr_assert_eq(access(p, F_OK), -1, "no partial output");
    /* a config that disagrees with the tensors (five heads of 16) */
    path_of("hf/config.json", p, sizeof p);
    char cfg[2048];
    tm.heads = 5;
    tl_config_json(&tm, cfg, sizeof cfg);
    tl_spit(p, cfg);
    cr_assert_eq(run("eval hf text.txt"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "hf"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --bits 4 hf out.safetensors"), 2);
    cr_assert_eq(access(p, F_OK), 0);
    path_of("out.safetensors", p, sizeof p);
    cr_assert_eq(access(p, F_OK), -1, "no partial output");
    tm.heads = 4;
    tl_free(&tm);
}

/* Packed map Q equals the library's packing of F under layer l of plan p
   (with AWQ's scales and clips from X when X is not NULL). */
static int same_as_plan(const mpq_linear *F, const mpq_linear *Q, const mpq_plan *p, int l, const float *X, int tokens)
{
    mpq_bitplane_desc d;
    cr_assert_eq(mpq_plan_desc(p, l, &d), MPQ_OK);
    float *cs = NULL, *clip = NULL;
    if (X) {
        cs = malloc(sizeof(float) * (size_t)F->cols);
        clip = malloc(sizeof(float) * (size_t)F->rows * (size_t)((F->cols + d.group - 1) / d.group));
        mpq_awq_desc a;
        memset(&a, 0, sizeof a);
        a.X = X, a.tokens = tokens;
        cr_assert_eq(mpq_awq_search(&d, F->W, &a, cs, clip, NULL), MPQ_OK);
        d.col_scale = cs, d.clip = clip;
    }
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, F->W, &A), MPQ_OK);
    const int same = A.bytes == Q->A.bytes && !memcmp(A.buf, Q->A.buf, A.bytes);
    mpq_packed_free(&A);
    free(cs), free(clip);
    return same;
}

Test(cli_llm, calibrate_then_every_method_and_a_schedule, .init = setup, .fini = teardown, .timeout = 600)
{
    tl_model tm;
    char text[700];
    size_t len;
    make_model(&tm, text, &len);
    cr_assert_eq(run("calibrate --windows 4 --length 16 --pqi-windows 2 --sens-tokens 12 hf text.txt -o s.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    cr_assert(strstr(slurp("out.txt", NULL), "statistics of 14 linear maps from 4 windows of 16 tokens"), "%s",
              slurp("out.txt", NULL));
    mpq_llm *h = load("hf");
    /* bf16 weights as float: calibrate's model is the same */
    char p[600];
    path_of("s.safetensors", p, sizeof p);
    mpq_calib_stats s;
    mpq_io_err e;
    cr_assert_eq(mpq_calib_read(h, p, &s, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(s.what, MPQ_CALIB_ALL);
    /* sfmp (RTN and AWQ underneath) and mixllm: the library's plans from the file's statistics */
    cr_assert_eq(run("quantize --quiet --method sfmp --bpw 3.5 --stats s.safetensors hf q1.safetensors"), 0, "%s",
                 slurp("err.txt", NULL));
    cr_assert_eq(
        run("quantize --quiet --method sfmp --bpw 3.5 --quantizer awq --stats s.safetensors hf q2.safetensors"), 0,
        "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --quiet --method mixllm --fraction 0.2 --stats s.safetensors hf q3.safetensors"), 0,
                 "%s", slurp("err.txt", NULL));
    mpq_sfmp_layer SL[14];
    mpq_mixllm_layer ML[14];
    for (int i = 0; i < 14; i++) {
        const mpq_linear *L = &h->layer[i / 7].lin[i % 7];
        SL[i].S = s.fisher[i], SL[i].rows = L->rows, SL[i].cols = L->cols;
        ML[i].salience = s.mixllm[i], ML[i].rows = L->rows, ML[i].cols = L->cols;
    }
    mpq_sfmp_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.bpw = 3.5;
    mpq_mixllm_desc md;
    memset(&md, 0, sizeof md);
    md.fraction = 0.2;
    mpq_plan ps, pm;
    cr_assert_eq(mpq_plan_sfmp(SL, 14, &sd, &ps), MPQ_OK);
    cr_assert_eq(mpq_plan_mixllm(ML, 14, &md, &pm), MPQ_OK);
    mpq_llm *q1 = load("q1.safetensors"), *q2 = load("q2.safetensors"), *q3 = load("q3.safetensors");
    for (int i = 0; i < 14; i++) {
        const mpq_linear *F = &h->layer[i / 7].lin[i % 7];
        cr_assert(same_as_plan(F, &q1->layer[i / 7].lin[i % 7], &ps, i, NULL, 0), "sfmp, map %d", i);
        cr_assert(same_as_plan(F, &q2->layer[i / 7].lin[i % 7], &ps, i, s.awq[i], s.awq_tokens), "sfmp + awq, map %d",
                  i);
        cr_assert(same_as_plan(F, &q3->layer[i / 7].lin[i % 7], &pm, i, NULL, 0), "mixllm, map %d", i);
    }
    mpq_plan_free(&ps), mpq_plan_free(&pm);
    /* mxsens from diag(X^T X) and the layer sensitivities (maps of 64 and 96 columns: the
       8-bit block alone is 6.25 bpw); requant on RTN and AWQ */
    cr_assert_eq(run("quantize --quiet --method mxsens --bpw 6.75 --stats s.safetensors hf q4.safetensors"), 0, "%s",
                 slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --method requant --bits 3 --stats s.safetensors hf q5.safetensors"), 0, "%s",
                 slurp("err.txt", NULL));
    cr_assert(strstr(slurp("err.txt", NULL), "requant: t = "), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --quiet --method requant --quantizer awq --bits 3 --outliers 0.01 --significant 0.01 "
                     "--stats s.safetensors hf q6.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    mpq_llm *q5 = load("q5.safetensors"), *q6 = load("q6.safetensors");
    double nnz5 = 0, nnz6 = 0, weights = 0;
    for (int i = 0; i < 14; i++) {
        const mpq_linear *A = &q5->layer[i / 7].lin[i % 7], *B = &q6->layer[i / 7].lin[i % 7];
        weights += (double)A->rows * A->cols;
        nnz5 += (double)A->A.sp_nnz, nnz6 += (double)B->A.sp_nnz;
        /* the sparse part restores its weights: dense + sparse = W there (fp16) */
        float *D = malloc(sizeof(float) * (size_t)A->rows * A->cols);
        cr_assert_eq(mpq_packed_dequantize(&B->A, 0, D), MPQ_OK);
        const float *W = h->layer[i / 7].lin[i % 7].W;
        for (int r = 0; r < B->rows; r++)
            for (uint32_t k = B->A.sp_row_ptr[r]; k < B->A.sp_row_ptr[r + 1]; k++) {
                const size_t j = (size_t)r * B->cols + B->A.sp_col16[k];
                cr_assert(fabsf(D[j] - W[j]) <= 2e-3f * fabsf(W[j]) + 1e-4f, "map %d (%d, %zu): %g, weight %g", i, r,
                          j % B->cols, D[j], W[j]);
            }
        free(D);
    }
    /* 0.25 % + 0.25 % of the weights (floor per count), and 1 % + 1 % */
    cr_assert(nnz5 >= 0.005 * weights - 16 && nnz5 <= 0.005 * weights + 1, "requant rtn: %g of %g", nnz5, weights);
    cr_assert(nnz6 >= 0.02 * weights - 16 && nnz6 <= 0.02 * weights + 1, "requant awq: %g of %g", nnz6, weights);
    char args[200];
    for (int k = 4; k <= 6; k++) {
        snprintf(args, sizeof args, "eval --quiet --ctx %d q%d.safetensors text.txt", CTX, k);
        cr_assert_eq(run(args), 0, "%s: %s", args, slurp("err.txt", NULL));
    }
    /* PMPD: the static search on q1; any schedule meets a loose target, so the
       cheapest (every decoded token at skip 1) wins; a target of no loss keeps
       skip 0 for every scored token */
    cr_assert_eq(run("quantize --quiet --bits 4 hf q7.safetensors"), 0);
    cr_assert_eq(run("schedule --quiet --ctx 16 --chunks 3 --levels 0,1 --max-increase 1000 q7.safetensors text.txt "
                     "-o loose.txt"),
                 0, "%s", slurp("err.txt", NULL));
    cr_assert(!strncmp(slurp("loose.txt", NULL), "0:0@0,1@0 ", 10), "%s", slurp("loose.txt", NULL));
    cr_assert_eq(run("schedule --quiet --ctx 16 --chunks 3 --levels 0,1 --max-increase 0 q7.safetensors text.txt "
                     "-o tight.txt"),
                 0, "%s", slurp("err.txt", NULL));
    const char *t = slurp("tight.txt", NULL);
    cr_assert(!strncmp(t, "0:0@0,1@", 8) && atoi(t + 8) >= 1, "%s", t);
    cr_assert_eq(run("run q7.safetensors -n 6 --prompt 'abc' --schedule loose.txt"), 0, "%s", slurp("err.txt", NULL));
    cr_assert(strstr(slurp("err.txt", NULL), "skip 1 ("), "%s", slurp("err.txt", NULL));

    mpq_llm_free(q1), mpq_llm_free(q2), mpq_llm_free(q3), mpq_llm_free(q5), mpq_llm_free(q6);
    mpq_calib_stats_free(&s);
    mpq_llm_free(h);
    tl_free(&tm);
}

/* PMPD's learned scheduler from the tool: trained on the text (with a loose
   target every window's label is class 0, all decoded tokens low), run by
   `mpq run`, and `mpq gen-eval`'s figures against the library's own
   generation and the reference's likelihood. */
Test(cli_llm, learned_scheduler_and_gen_eval, .init = setup, .fini = teardown, .timeout = 600)
{
    tl_model tm;
    char text[700];
    size_t len;
    make_model(&tm, text, &len);
    cr_assert_eq(run("quantize --quiet --bits 4 hf q.safetensors"), 0, "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("schedule --learned --quiet --ctx 16 --windows 6 --levels 0,1 --max-increase 1000 --steps 50 "
                     "q.safetensors text.txt -o l.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    const char *o = slurp("out.txt", NULL);
    cr_assert(strstr(o, "learned scheduler on layer 1 (5 classes") && strstr(o, "labels per class 6,0,0,0,0") &&
                  strstr(o, "training accuracy 1.000") &&
                  strstr(o, "(predicted 6,0,0,0,0); weight decay 0.001; held") &&
                  strstr(o,
                         "held out 2 windows (layer 1, weight decay 0.001): accuracy 1.000 (0 predicted fewer "
                         "high-precision tokens than their label, 0 more)") &&
                  strstr(o, "the label frequencies of the others: accuracy 1.000"),
              "%s", o);
    mpq_llm *q = load("q.safetensors"), *ref = load("hf");
    char p[600];
    path_of("l.safetensors", p, sizeof p);
    mpq_pmpd_learned n;
    mpq_io_err e;
    cr_assert_eq(mpq_pmpd_learned_read(q, p, &n, &e), MPQ_OK, "%s", e.msg);
    cr_assert(n.layer == 1 && n.length == 7 && n.skip_high == 0 && n.skip_low == 1 && n.classes == 5 && n.hidden == 32);
    mpq_pmpd_learned_free(&n);
    cr_assert_eq(run("run q.safetensors -n 6 --prompt 'abc' --schedule learned:l.safetensors"), 0, "%s",
                 slurp("err.txt", NULL));
    cr_assert(strstr(slurp("err.txt", NULL), "learned schedule 0:0@0,1@0 (class 0 of 5"), "%s", slurp("err.txt", NULL));
    char first[4096];
    snprintf(first, sizeof first, "%s", slurp("out.txt", NULL));
    cr_assert_eq(run("run q.safetensors -n 6 --prompt 'abc' --schedule 0:0@0,1@0"), 0);
    cr_assert_str_eq(slurp("out.txt", NULL), first);

    /* gen-eval: 3 prompts of 6 tokens, 5 generated */
    cr_assert_eq(run("gen-eval --quiet q.safetensors text.txt --reference hf --schedule 0:0@0 --schedule "
                     "learned:l.safetensors --prompts 3 --prompt-tokens 6 -n 5"),
                 0, "%s", slurp("err.txt", NULL));
    char out[8192];
    snprintf(out, sizeof out, "%s", slurp("out.txt", NULL));
    int32_t *tok;
    size_t nt;
    cr_assert_eq(mpq_tokenize(q->tok, text, len, 0, &tok, &nt, NULL), MPQ_OK);
    const size_t avail = nt / 12; /* windows of a prompt and the text's next 5 + 1 tokens */
    const int V = q->c.vocab;
    mpq_llm_state s;
    cr_assert_eq(mpq_llm_state_init(q, 11, 8, &s), MPQ_OK);
    double nll[2] = {0, 0}, tf[2] = {0, 0};
    long cnt[2] = {0, 0};
    for (int i = 0; i < 3; i++) {
        int32_t seq[11];
        const int32_t *w = tok + (size_t)((double)i * (avail - 1) / 2 + 0.5) * 12;
        memcpy(seq, w, sizeof(int32_t) * 6);
        if (mpq_tokenizer_adds_bos(q->tok)) seq[0] = mpq_tokenizer_bos(q->tok);
        for (int k = 0; k < 2; k++) {
            mpq_pmpd_schedule sc = {0};
            sc.nlevels = 1, sc.skip[0] = k; /* the learned one runs every decoded token at skip 1 */
            mpq_gen_opts g = {0};
            g.schedule = &sc;
            mpq_gen_result r;
            cr_assert_eq(mpq_llm_generate(q, &s, seq, 6, &g, seq + 6, 5, &r), MPQ_OK);
            float *z = malloc(sizeof(float) * 11 * V);
            mpq_llm_state rs;
            cr_assert_eq(mpq_llm_state_init(ref, 11, 11, &rs), MPQ_OK);
            cr_assert_eq(mpq_llm_forward(ref, &rs, seq, 6 + r.tokens - 1, 0, z, 5), MPQ_OK);
            for (int t = 0; t < r.tokens; t++) {
                const float *zt = z + (size_t)t * V;
                double mx = zt[0], sum = 0;
                for (int v = 1; v < V; v++) mx = fmax(mx, zt[v]);
                for (int v = 0; v < V; v++) sum += exp(zt[v] - mx);
                nll[k] += log(sum) + mx - zt[seq[6 + t]], cnt[k]++;
            }
            /* the text's next tokens, teacher-forced: the prompt at skip 0, then
               w[6..10] at skip k predicting w[7..11] */
            mpq_llm_state_reset(&s);
            cr_assert_eq(mpq_llm_forward(q, &s, seq, 6, 0, NULL, 6), MPQ_OK);
            cr_assert_eq(mpq_llm_forward(q, &s, w + 6, 5, k, z, 0), MPQ_OK);
            for (int t = 0; t < 5; t++) {
                const float *zt = z + (size_t)t * V;
                double mx = zt[0], sum = 0;
                for (int v = 1; v < V; v++) mx = fmax(mx, zt[v]);
                for (int v = 0; v < V; v++) sum += exp(zt[v] - mx);
                tf[k] += log(sum) + mx - zt[w[7 + t]];
            }
            mpq_llm_state_free(&rs);
            free(z);
        }
    }
    char want[2][160];
    snprintf(want[0], sizeof want[0], "| 0:0@0 | %.3f | %.4f | +0.00 %% | %.4f | +0.00 %% | 100.0 %% | ",
             mpq_llm_bpw(q, 1, 0), exp(nll[0] / cnt[0]), exp(tf[0] / 15));
    snprintf(want[1], sizeof want[1], "| learned:l.safetensors | %.3f | %.4f | %+.2f %% | %.4f | ",
             mpq_llm_bpw(q, 1, 1), exp(nll[1] / cnt[1]), 100 * (exp(nll[1] / cnt[1]) / exp(nll[0] / cnt[0]) - 1),
             exp(tf[1] / 15));
    cr_assert(strstr(out, want[0]), "wanted '%s' in\n%s", want[0], out);
    cr_assert(strstr(out, want[1]), "wanted '%s' in\n%s", want[1], out);
    cr_assert(strstr(out, " | 3,0,0,0,0 ("), "every prompt class 0:\n%s", out);
    mpq_llm_state_free(&s);
    free(tok);

    /* mistakes */
    cr_assert_eq(run("run q.safetensors -n 2 --prompt 'abc' --schedule learned:none.safetensors"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "none.safetensors"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("schedule --learned --quiet --ctx 16 --windows 10 --layer 0,1 --levels 0,1 --steps 20 "
                     "q.safetensors text.txt -o l2.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    o = slurp("out.txt", NULL);
    cr_assert(strstr(o, "layers by cross-validated cross-entropy: 0: ") && strstr(o, ", 1: ") &&
                  strstr(o, "(held-out cross-entropy over 4 folds), chose "),
              "%s", o);
    cr_assert_eq(run("schedule --learned --ctx 16 --layer 0,5 q.safetensors text.txt -o x.safetensors"), 1);
    cr_assert(strstr(slurp("err.txt", NULL), "5, but q.safetensors has 2 layers"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("schedule --learned --l2 0.1,x q.safetensors text.txt -o x.safetensors"), 1);
    cr_assert_eq(run("schedule --learned --levels 0,1,2 q.safetensors text.txt -o x.safetensors"), 1);
    cr_assert(strstr(slurp("err.txt", NULL), "two levels"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("gen-eval q.safetensors text.txt --schedule 0:0@0"), 1);
    cr_assert_eq(run("gen-eval --quiet q.safetensors text.txt --reference hf --schedule 0:0@0 --prompts 1000"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "text.txt"), "%s", slurp("err.txt", NULL));
    mpq_llm_free(q), mpq_llm_free(ref);
    tl_free(&tm);
}

/* A statistic file that is wrong in one tensor: exit 2 naming the file, the
   tensor and the rule; no output. */
Test(cli_llm, bad_statistics_exit_2, .init = setup, .fini = teardown)
{
    tl_model tm;
    char text[700], p[600];
    size_t len;
    make_model(&tm, text, &len);
    path_of("short.txt", p, sizeof p);
    tl_spit(p, "ab cd ab");
    cr_assert_eq(run("calibrate --length 16 hf short.txt -o s.safetensors"), 2);
    const char *e = slurp("err.txt", NULL);
    cr_assert(strstr(e, "short.txt") && strstr(e, "shorter than one calibration window"), "%s", e);
    path_of("s.safetensors", p, sizeof p);
    cr_assert_eq(access(p, F_OK), -1, "no output");
    cr_assert_eq(run("calibrate --quiet --windows 2 --length 16 --stats fisher,acts hf text.txt -o s.safetensors"), 0,
                 "%s", slurp("err.txt", NULL));
    mpq_llm *h = load("hf");
    mpq_calib_stats s;
    mpq_io_err err;
    cr_assert_eq(mpq_calib_read(h, p, &s, &err), MPQ_OK, "%s", err.msg);
    cr_assert_eq(s.what, MPQ_CALIB_FISHER | MPQ_CALIB_ACTS);
    { /* --in-memory: the model as float32, the statistics held to the end; the same values */
        cr_assert_eq(run("calibrate --quiet --in-memory --windows 2 --length 16 --stats fisher,acts hf text.txt -o "
                         "s2.safetensors"),
                     0, "%s", slurp("err.txt", NULL));
        char q[600];
        path_of("s2.safetensors", q, sizeof q);
        mpq_calib_stats s2;
        cr_assert_eq(mpq_calib_read(h, q, &s2, &err), MPQ_OK, "%s", err.msg);
        for (int i = 0; i < s.nlin; i++) {
            const mpq_linear *L = &h->layer[i / 7].lin[i % 7];
            const size_t nw = (size_t)L->rows * L->cols, nc = (size_t)L->cols;
            cr_assert(!memcmp(s.fisher[i], s2.fisher[i], 4 * nw) && !memcmp(s.xtx_diag[i], s2.xtx_diag[i], 4 * nc) &&
                          !memcmp(s.mean_abs[i], s2.mean_abs[i], 4 * nc) &&
                          !memcmp(s.awq[i], s2.awq[i], 4 * nc * (size_t)s.awq_tokens) && s.loss == s2.loss,
                      "map %d: --in-memory differs", i);
        }
        mpq_calib_stats_free(&s2);
        unlink(q);
        /* --resume DIR: the same values */
        char rd[600];
        path_of("rd", rd, sizeof rd);
        cr_assert_eq(mkdir(rd, 0700), 0);
        cr_assert_eq(run("calibrate --quiet --resume rd --windows 2 --length 16 --stats fisher,acts hf text.txt -o "
                         "s2.safetensors"),
                     0, "%s", slurp("err.txt", NULL));
        cr_assert_eq(mpq_calib_read(h, q, &s2, &err), MPQ_OK, "%s", err.msg);
        for (int i = 0; i < s.nlin; i++)
            cr_assert(!memcmp(s.fisher[i], s2.fisher[i],
                              4 * (size_t)h->layer[i / 7].lin[i % 7].rows * h->layer[i / 7].lin[i % 7].cols),
                      "map %d: --resume differs", i);
        mpq_calib_stats_free(&s2);
        unlink(q);
        /* every statistic, PQI and the sensitivity too: the file of a run without --resume, byte for byte */
        const char *all = "calibrate --quiet --windows 2 --length 16 --pqi-windows 1 --pqi-steps 2 --sens-tokens 8 "
                          "hf text.txt";
        char cmd[400];
        snprintf(cmd, sizeof cmd, "%s --resume rd -o s3.safetensors", all);
        cr_assert_eq(run(cmd), 0, "%s", slurp("err.txt", NULL));
        snprintf(cmd, sizeof cmd, "%s -o s4.safetensors", all);
        cr_assert_eq(run(cmd), 0, "%s", slurp("err.txt", NULL));
        size_t n3, n4;
        char *b3 = whole("s3.safetensors", &n3), *b4 = whole("s4.safetensors", &n4);
        cr_assert(n3 == n4 && !memcmp(b3, b4, n3), "--resume with every statistic: another file");
        cr_assert(strstr(b3 + 8, ".pqi\"") && strstr(b3 + 8, ".layer_sensitivity\""), "PQI and the sensitivity");
        free(b3), free(b4);
        cr_assert_eq(rmdir(rd), 0, "the resume directory is emptied");
    }
    static const char *const why[] = {"not finite", "negative"};
    for (int k = 0; k < 2; k++) {
        s.fisher[9][5] = k ? -1.0f : NAN;
        char q[600];
        path_of("bad.safetensors", q, sizeof q);
        cr_assert_eq(mpq_calib_write(h, &s, NULL, q, &err), MPQ_OK, "%s", err.msg);
        cr_assert_eq(run("quantize --method sfmp --bpw 3 --stats bad.safetensors hf out.safetensors"), 2);
        e = slurp("err.txt", NULL);
        cr_assert(strstr(e, "bad.safetensors") && strstr(e, "model.layers.1.self_attn.v_proj.weight.fisher") &&
                      strstr(e, why[k]),
                  "%s", e);
        path_of("out.safetensors", q, sizeof q);
        cr_assert_eq(access(q, F_OK), -1, "no partial output");
    }
    /* statistics the method needs but the file lacks */
    cr_assert_eq(run("quantize --method mixllm --stats s.safetensors hf out.safetensors"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "mixllm"), "%s", slurp("err.txt", NULL));
    mpq_calib_stats_free(&s);
    mpq_llm_free(h);
    tl_free(&tm);
}

/* The main job's rows (examples/llm/rows.h): for every row, what the main
   job packs in memory from the statistics is byte for byte what `mpq
   quantize` writes with the row's options, every linear map and the
   embedding. */
#include "rows.h"

/* The predicted KLD of the plan `quantize --method auto` recorded in its
   output's metadata ("mpq_auto"). */
static double recorded_kld(const char *name)
{
    char p[600];
    path_of(name, p, sizeof p);
    mpq_st_file *f;
    mpq_io_err e;
    cr_assert_eq(mpq_st_open(p, &f, &e), MPQ_OK, "%s", e.msg);
    const char *meta = mpq_st_meta(f, "mpq_auto"), *at = meta ? strstr(meta, "\"predicted_kld\":") : NULL, *last = NULL;
    while (at) last = at, at = strstr(at + 1, "\"predicted_kld\":");
    cr_assert_not_null(last, "%s: no plan recorded", name);
    const double v = atof(last + strlen("\"predicted_kld\":"));
    mpq_st_close(f);
    return v;
}

Test(cli_llm, main_job_rows_are_what_quantize_writes, .init = setup, .fini = teardown, .timeout = 900)
{
    tl_model tm;
    char text[700];
    size_t len;
    make_model(&tm, text, &len);
    cr_assert_eq(run("calibrate --quiet --stats all,xtx --windows 4 --length 16 --pqi-windows 2 --sens-tokens 12 hf "
                     "text.txt -o s.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    /* the rotated rows' Fisher, gathered in the rotated basis */
    cr_assert_eq(
        run("calibrate --quiet --stats fisher --rotate 1 --windows 4 --length 16 hf text.txt -o r.safetensors"), 0,
        "%s", slurp("err.txt", NULL));
    mpq_llm *h = load("hf");
    char p[600];
    path_of("s.safetensors", p, sizeof p);
    mpq_calib_stats s, sr;
    mpq_io_err e;
    cr_assert_eq(mpq_calib_read(h, p, &s, &e), MPQ_OK, "%s", e.msg);
    path_of("r.safetensors", p, sizeof p);
    cr_assert_eq(mpq_calib_read(h, p, &sr, &e), MPQ_OK, "%s", e.msg);
    cr_assert(sr.rotate == 1 && sr.rotate_seed == 1 && !s.rotate);
    /* the auto rows' measurements (ROW_MEASURE, ROW_MEASURE256: the main job adds --measure MEASURE or
       MEASURE256) */
    cr_assert_eq(run("measure --quiet " LLM_MEASURE_ARGS " --stats s.safetensors --windows 2 --length 16 hf text.txt "
                     "-o k.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("measure --quiet " LLM_MEASURE_ARGS " --group 256 --stats s.safetensors --windows 2 --length 16 "
                     "hf text.txt -o k256.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    int32_t *seq_text = NULL; /* the text as mpq quantize --sequential reads it */
    size_t nseq = 0;
    cr_assert_eq(mpq_tokenize(h->tok, text, len, 0, &seq_text, &nseq, &e), MPQ_OK);
    /* every row, and a sequential one (ROW_SEQ: the main job adds --sequential CALIB) */
    static const llm_row seq_row = {"AWQ+GPTQ+rot+seq", "AWQ + GPTQ 3-bit, rotated, sequential",
                                    "--method gptq --quantizer awq+gptq --bits 3 --act-order --rotate 1", ROW_SEQ};
    for (int k = 0; k <= LLM_NROWS; k++) {
        const llm_row *row = k < LLM_NROWS ? &llm_rows[k] : &seq_row;
        const int rot = strstr(row->args, "--rotate") != NULL, seq = (row->flags & ROW_SEQ) != 0;
        char args[1500], rargs[700], margs[1400], kpath[600];
        const char *kname = row->flags & ROW_MEASURE ? "k.safetensors"
            : row->flags & ROW_MEASURE256            ? "k256.safetensors"
                                                     : NULL;
        if (kname) path_of(kname, kpath, sizeof kpath);
        snprintf(rargs, sizeof rargs, "%s%s%s%s", row->args,
                 seq ? " --sequential text.txt --seq-windows 4 --seq-length 16" : "", kname ? " --measure " : "",
                 kname ? kname : "");
        /* the main job's options: the measurements' path from here */
        snprintf(margs, sizeof margs, "%s%s%s%s", row->args,
                 seq ? " --sequential text.txt --seq-windows 4 --seq-length 16" : "", kname ? " --measure " : "",
                 kname ? kpath : "");
        snprintf(args, sizeof args, "quantize --quiet %s %s --stats s.safetensors%s hf q.safetensors", rargs,
                 LLM_ROW_COMMON, rot ? " --salience r.safetensors" : "");
        const int rc = run(args);
        mpq_recipe_result res;
        const row_stats rs = {&s, &s, &sr, seq_text, nseq, 0};
        if (rc == 1 && strstr(row->args, "--max-kld") && strstr(slurp("err.txt", NULL), "every plan meets it")) {
            /* a bound this small model's measurements cannot take: refused the same way */
            cr_assert_eq(quantize_row(margs, LLM_ROW_COMMON, h, &rs, NULL, NULL, &res, NULL), 1, "%s", row->name);
            continue;
        }
        cr_assert_eq(rc, 0, "mpq %s: %s", args, slurp("err.txt", NULL));
        cr_assert_eq(quantize_row(margs, LLM_ROW_COMMON, h, &rs, NULL, NULL, &res, NULL), 0, "%s", row->name);
        if (kname) /* the prediction the tool records is the main job's */
            cr_assert_float_eq(res.loss, recorded_kld("q.safetensors"), 1e-9 * res.loss + 1e-15, "%s", row->name);
        mpq_llm *q = load("q.safetensors");
        for (int i = 0; i <= 14; i++) {
            const mpq_linear *A = i < 14 ? &h->layer[i / 7].lin[i % 7] : &h->embed;
            const mpq_linear *B = i < 14 ? &q->layer[i / 7].lin[i % 7] : &q->embed;
            cr_assert(A->A.buf && B->A.buf, "%s: map %d packed both ways", row->name, i);
            cr_assert(A->A.bytes == B->A.bytes && !memcmp(A->A.buf, B->A.buf, A->A.bytes),
                      "%s: map %d: the main job's bytes differ from mpq quantize's", row->name, i);
        }
        mpq_llm_free(q);
        for (int i = 0; i < 14; i++) mpq_linear_unpack(h, &h->layer[i / 7].lin[i % 7]);
        mpq_linear_unpack(h, &h->embed);
    }
    /* --sequential gathers its own X^T X: no statistics file is needed (the same maps as with one) */
    cr_assert_eq(run("quantize --quiet --method gptq --bits 3 --sequential text.txt --seq-windows 4 --seq-length 16 "
                     "hf q2.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --quiet --method gptq --bits 3 --sequential text.txt --seq-windows 4 --seq-length 16 "
                     "--stats s.safetensors hf q3.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    {
        mpq_llm *a = load("q2.safetensors"), *b = load("q3.safetensors");
        for (int i = 0; i < 14; i++) {
            const mpq_packed *A = &a->layer[i / 7].lin[i % 7].A, *B = &b->layer[i / 7].lin[i % 7].A;
            cr_assert(A->buf && A->bytes == B->bytes && !memcmp(A->buf, B->buf, A->bytes), "map %d", i);
        }
        mpq_llm_free(a), mpq_llm_free(b);
        path_of("q3.safetensors", p, sizeof p);
        unlink(p);
        path_of("q2.safetensors", p, sizeof p);
        unlink(p);
    }
    /* --sequential: only under GPTQ, over every linear map, from a text that exists */
    cr_assert_eq(run("quantize --quiet --bits 3 --sequential text.txt hf q2.safetensors"), 1);
    cr_assert_not_null(strstr(slurp("err.txt", NULL), "GPTQ"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --quiet --method gptq --sequential text.txt --seq-length 16 --include '*q_proj*' "
                     "--stats s.safetensors hf q2.safetensors"),
                 1);
    cr_assert_not_null(strstr(slurp("err.txt", NULL), "every linear map"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --quiet --method gptq --sequential none.txt --stats s.safetensors hf q2.safetensors"),
                 2);
    cr_assert_not_null(strstr(slurp("err.txt", NULL), "none.txt"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --quiet --method gptq --sequential text.txt --stats s.safetensors hf q2.safetensors"), 2,
                 "a text shorter than one window of 512");
    path_of("q2.safetensors", p, sizeof p);
    cr_assert_eq(access(p, F_OK), -1, "nothing written");
    mpq_calib_stats_free(&s), mpq_calib_stats_free(&sr);
    free(seq_text);
    mpq_llm_free(h);
    tl_free(&tm);
}

static mpq_status rtn_quantize(void *user, int i, int bits, const float *W, float *Wq)
{
    const mpq_llm *m = (const mpq_llm *)user;
    const mpq_linear *L = &m->layer[i / 7].lin[i % 7];
    mpq_bitplane_desc d;
    memset(&d, 0, sizeof d);
    d.rows = L->rows, d.cols = L->cols, d.uniform_bits = bits;
    mpq_packed A;
    mpq_status st = mpq_pack_alloc(&d, W, &A);
    if (st == MPQ_OK) st = mpq_packed_dequantize(&A, 0, Wq);
    mpq_packed_free(&A);
    return st;
}

/* The file of `mpq measure` holds what mpq_llm_measure gives (RTN
   underneath: the library's quantizer here); GPTQ from the statistics
   moves the model less than RTN; bad requests write nothing. */
Test(cli_llm, measure_writes_what_the_library_measures, .init = setup, .fini = teardown, .timeout = 600)
{
    tl_model tm;
    char text[700], p[600];
    size_t len;
    make_model(&tm, text, &len);
    cr_assert_eq(run("measure --quiet --widths 2,4 --windows 2 --length 16 hf text.txt -o k.safetensors"), 0, "%s",
                 slurp("err.txt", NULL));
    mpq_llm *h = load("hf");
    int32_t *tok = NULL;
    size_t nt = 0;
    mpq_io_err e;
    cr_assert_eq(mpq_tokenize(h->tok, text, len, 0, &tok, &nt, &e), MPQ_OK);
    const int bits[2] = {2, 4}, nlin = tm.layers * 7;
    mpq_measure_opts o;
    memset(&o, 0, sizeof o);
    o.bits = bits, o.nbits = 2, o.quantize = rtn_quantize, o.user = h, o.windows = 2, o.length = 16;
    double want[2 * 7 * 2];
    cr_assert_eq(mpq_llm_measure(h, tok, nt, &o, want, &e), MPQ_OK, "%s", e.msg);
    mpq_st_file *f;
    path_of("k.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_open(p, &f, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_count(f), nlin);
    mpq_measure_info info;
    cr_assert_eq(mpq_measure_read(f, p, NULL, 0, &info, NULL, &e), MPQ_OK, "%s", e.msg);
    cr_assert(info.nbits == 2 && info.bits[0] == 2 && info.bits[1] == 4 && !strcmp(info.quantizer, "rtn"));
    cr_assert(info.windows == 2 && info.length == 16 && info.group == 128 && !info.act_order && !info.rotate);
    cr_assert(info.layers == tm.layers && info.dim == tm.dim && info.vocab == h->c.vocab && !strcmp(info.model, "hf"));
    cr_assert_eq(info.text_hash, mpq_text_hash(text, len));
    cr_assert_eq(info.tokens, nt);
    double rtn2 = 0;
    for (int i = 0; i < nlin; i++) {
        char name[128], full[160];
        mpq_llm_linear_name(0, i / 7, i % 7, 0, name, sizeof name);
        snprintf(full, sizeof full, "%s.kld", name);
        const mpq_st_tensor *t = mpq_st_find(f, full);
        cr_assert_not_null(t, "%s", full);
        float v[2];
        cr_assert_eq(mpq_st_read_f32(f, t, v, 2, &e), MPQ_OK);
        for (int k = 0; k < 2; k++)
            cr_assert_eq(v[k], (float)want[i * 2 + k], "%s at %d bits: %g, library %g", full, bits[k], v[k],
                         want[i * 2 + k]);
        rtn2 += v[0];
    }
    mpq_st_close(f);
    /* GPTQ under it, from X^T X of the same windows */
    cr_assert_eq(run("calibrate --quiet --stats xtx --windows 2 --length 16 hf text.txt -o s.safetensors"), 0, "%s",
                 slurp("err.txt", NULL));
    cr_assert_eq(run("measure --quiet --method gptq --stats s.safetensors --widths 2 --windows 2 --length 16 hf "
                     "text.txt -o g.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    path_of("g.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_open(p, &f, &e), MPQ_OK, "%s", e.msg);
    double gptq2 = 0;
    for (int i = 0; i < mpq_st_count(f); i++) {
        float v;
        cr_assert_eq(mpq_st_read_f32(f, mpq_st_at(f, i), &v, 1, &e), MPQ_OK);
        cr_assert(v >= 0 && v - v == 0);
        gptq2 += v;
    }
    mpq_st_close(f);
    cr_assert_lt(gptq2, rtn2, "GPTQ %g, RTN %g at 2 bits", gptq2, rtn2);
    /* bad requests: exit 1 or 2, no file */
    static const struct {
        const char *args;
        int code;
        const char *says;
    } bad[] = {
        {"measure --quiet hf text.txt", 1, "-o FILE"},
        {"measure --quiet --widths 2,2 hf text.txt -o x.safetensors", 1, "each once"},
        {"measure --quiet --widths 9 hf text.txt -o x.safetensors", 1, "1..8"},
        {"measure --quiet --method sfmp --bpw 3 --stats s.safetensors hf text.txt -o x.safetensors", 1, "rtn, awq"},
        {"measure --quiet --method gptq hf text.txt -o x.safetensors", 1, "--hessian"},
        {"measure --quiet --include '*q_proj*' hf text.txt -o x.safetensors", 1, "every linear map"},
        {"measure --quiet --length 4000 hf text.txt -o x.safetensors", 2, "shorter than one window"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cr_assert_eq(run(bad[k].args), bad[k].code, "%s", bad[k].args);
        const char *err = slurp("err.txt", NULL);
        cr_assert(strstr(err, bad[k].says), "%s: %s", bad[k].args, err);
        path_of("x.safetensors", p, sizeof p);
        cr_assert_eq(access(p, F_OK), -1, "%s: no output", bad[k].args);
    }
    free(tok);
    mpq_llm_free(h);
    tl_free(&tm);
}

/* Bits per weight of a quantized model file's linear maps as the plan
   counts them (weights and group scales), from its packed matrices. */
static double maps_bpw(const char *name, int layers, double *weights)
{
    char p[600];
    path_of(name, p, sizeof p);
    mpq_st_file *f;
    mpq_io_err e;
    cr_assert_eq(mpq_st_open(p, &f, &e), MPQ_OK, "%s", e.msg);
    double bits = 0, nw = 0;
    for (int i = 0; i < layers * 7; i++) {
        char n[128];
        mpq_llm_linear_name(0, i / 7, i % 7, 0, n, sizeof n);
        mpq_packed A;
        cr_assert_eq(mpq_st_read_packed(f, n, &A, &e), MPQ_OK, "%s", e.msg);
        const double w = (double)A.rows * A.cols;
        bits += mpq_packed_bpw(&A, 1) * w;
        nw += w;
        mpq_packed_free(&A);
    }
    mpq_st_close(f);
    if (weights) *weights = nw;
    return bits / nw;
}

/* The predicted KLD quantize prints for its plan. */
static double printed_kld(void)
{
    const char *o = slurp("out.txt", NULL), *at = strstr(o, "predicted KLD ");
    const char *last = NULL;
    while (at) last = at, at = strstr(at + 1, "predicted KLD ");
    cr_assert_not_null(last, "%s", o);
    return atof(last + strlen("predicted KLD "));
}

/* A copy of the measurements file f as name, without tensor `skip` (-1:
   none), with the metadata meta. */
static void copy_measure(mpq_st_file *f, const char *name, int skip, const char *meta)
{
    char q[600];
    mpq_io_err e;
    mpq_st_writer *w;
    path_of(name, q, sizeof q);
    cr_assert_eq(mpq_st_writer_open(q, &w, &e), MPQ_OK);
    for (int i = 0; i < mpq_st_count(f); i++) {
        if (i == skip) continue;
        const mpq_st_tensor *t = mpq_st_at(f, i);
        float v[8];
        cr_assert_eq(mpq_st_read_f32(f, t, v, (size_t)t->numel, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_f32(w, t->name, MPQ_DT_F32, t->ndim, t->shape, v, &e), MPQ_OK);
    }
    cr_assert_eq(mpq_st_write_meta(w, "mpq_measure", meta, &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK);
}

/* --method auto: the budget met from below by less than one block row,
   the bound honoured by the prediction, and every way it is refused. */
Test(cli_llm, auto_meets_the_budget_and_the_bound, .init = setup, .fini = teardown, .timeout = 600)
{
    tl_model tm;
    char text[700], p[600];
    size_t len;
    make_model(&tm, text, &len);
    cr_assert_eq(run("measure --quiet --widths 2,3,5 --windows 2 --length 16 hf text.txt -o k.safetensors"), 0, "%s",
                 slurp("err.txt", NULL));
    const double budgets[3] = {2.6, 3.55, 4.9};
    double prev = INFINITY;
    for (int k = 0; k < 3; k++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "quantize --method auto --bpw %g --measure k.safetensors hf a.safetensors",
                 budgets[k]);
        cr_assert_eq(run(cmd), 0, "%s: %s", cmd, slurp("err.txt", NULL));
        double nw;
        const double got = maps_bpw("a.safetensors", tm.layers, &nw), kld = printed_kld();
        /* one block row of the widest map at one more bit, at most */
        cr_assert(got <= budgets[k] + 1e-9 && got >= budgets[k] - 16.0 * tm.ffn * 6 / nw, "--bpw %g: %.6f", budgets[k],
                  got);
        cr_assert_lt(kld, prev, "more bits, less predicted KLD");
        prev = kld;
        mpq_llm *q = load("a.safetensors");
        cr_assert_not_null(q);
        mpq_llm_free(q);
    }
    /* the inverse: the fewest bits for a bound between the ends */
    cr_assert_eq(run("quantize --method auto --bpw 3.55 --measure k.safetensors hf a.safetensors"), 0);
    const double k355 = printed_kld();
    char cmd[256];
    const double bound = k355 * (1 + 1e-4); /* above that plan's (printed to 6 digits) */
    snprintf(cmd, sizeof cmd, "quantize --method auto --max-kld %.9g --measure k.safetensors hf b.safetensors", bound);
    cr_assert_eq(run(cmd), 0, "%s", slurp("err.txt", NULL));
    cr_assert_leq(printed_kld(), bound, "the bound kept by the prediction");
    double nw;
    const double bb = maps_bpw("b.safetensors", tm.layers, &nw);
    cr_assert_leq(bb, 3.55 + 16.0 * tm.ffn * 6 / nw, "no more bits than the budget that predicts it (%.6f)", bb);
    /* refused: exit 1 or 2 and no output */
    static const struct {
        const char *args;
        int code;
        const char *says;
    } bad[] = {
        {"quantize --method auto --bpw 1.5 --measure k.safetensors hf x.safetensors", 1, "allow"},
        {"quantize --method auto --bpw 9 --measure k.safetensors hf x.safetensors", 1, "allow"},
        {"quantize --method auto --max-kld 1e-12 --measure k.safetensors hf x.safetensors", 1, "no plan meets it"},
        {"quantize --method auto --max-kld 1000 --measure k.safetensors hf x.safetensors", 1, "every plan meets it"},
        {"quantize --method auto --bpw 3 hf x.safetensors", 1, "--measure"},
        {"quantize --method auto --measure k.safetensors hf x.safetensors", 1, "--bpw X or --max-kld"},
        {"quantize --method rtn --max-kld 0.1 hf x.safetensors", 1, "for --method auto"},
        {"quantize --method auto --bpw 3 --group 64 --measure k.safetensors hf x.safetensors", 2,
         "measured with group"},
        {"quantize --method auto --bpw 3 --measure text.txt hf x.safetensors", 2, "text.txt"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cr_assert_eq(run(bad[k].args), bad[k].code, "%s: %s", bad[k].args, slurp("err.txt", NULL));
        const char *err = slurp("err.txt", NULL);
        cr_assert(strstr(err, bad[k].says), "%s: %s", bad[k].args, err);
        path_of("x.safetensors", p, sizeof p);
        cr_assert_eq(access(p, F_OK), -1, "%s: no output", bad[k].args);
    }
    /* a measurement missing for one map: exit 2 naming it */
    mpq_st_file *f;
    mpq_io_err e;
    path_of("k.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_open(p, &f, &e), MPQ_OK);
    copy_measure(f, "k2.safetensors", 0, mpq_st_meta(f, "mpq_measure"));
    const char *missing = mpq_st_at(f, 0)->name;
    cr_assert_eq(run("quantize --method auto --bpw 3 --measure k2.safetensors hf x.safetensors"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), missing), "%s", slurp("err.txt", NULL));
    /* measured on a model of another shape: exit 2 naming both */
    const char *meta = mpq_st_meta(f, "mpq_measure"), *at = strstr(meta, "\"layers\":2");
    cr_assert_not_null(at, "%s", meta);
    char other[1024];
    snprintf(other, sizeof other, "%.*s\"layers\":3%s", (int)(at - meta), meta, at + strlen("\"layers\":2"));
    copy_measure(f, "k3.safetensors", -1, other);
    cr_assert_eq(run("quantize --method auto --bpw 3 --measure k3.safetensors hf x.safetensors"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "3 layers") && strstr(slurp("err.txt", NULL), "not this model"), "%s",
              slurp("err.txt", NULL));
    mpq_st_close(f);
    /* statistics of another text beside the measurements: exit 2 */
    char q[600];
    path_of("text2.txt", q, sizeof q);
    tl_spit(q,
            "ab ba cab abc bca cc aa bb a b c abc cab\nba ab ca ac cb bc abc acb bac bca cab cba abc acb\n"
            "bac bca cab cba aa bb cc ab ba ca ac bc cb a b c ab ba\n");
    cr_assert_eq(run("calibrate --quiet --stats fisher --windows 1 --length 16 hf text2.txt -o s2.safetensors"), 0,
                 "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --method auto --bpw 3 --stats s2.safetensors --measure k.safetensors hf x.safetensors"),
                 2);
    cr_assert(strstr(slurp("err.txt", NULL), "another text"), "%s", slurp("err.txt", NULL));
    path_of("x.safetensors", p, sizeof p);
    cr_assert_eq(access(p, F_OK), -1, "no output");
    /* the plan, as mpq inspect shows it from the output's metadata */
    cr_assert_eq(run("calibrate --quiet --stats fisher --windows 2 --length 16 hf text.txt -o s3.safetensors"), 0);
    cr_assert_eq(run("quantize --method auto --bpw 3.55 --stats s3.safetensors --measure k.safetensors hf "
                     "a.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    const double with_fisher = printed_kld();
    cr_assert_float_eq(with_fisher, k355, 1e-5 * k355, "the Fisher ranks block rows; the prediction is the same");
    cr_assert_eq(run("inspect a.safetensors"), 0);
    const char *shown = slurp("out.txt", NULL);
    cr_assert(strstr(shown, "auto plan (quantize --method auto --bpw 3.55 --measure k.safetensors)") &&
                  strstr(shown, "model.layers.1.mlp.down_proj.weight"),
              "%s", shown);
    cr_assert_float_eq(recorded_kld("a.safetensors"), with_fisher, 1e-5 * with_fisher);
    /* other quantizers underneath: rotated, and AWQ + GPTQ; each refuses the other's measurements */
    cr_assert_eq(run("calibrate --quiet --stats all,xtx --windows 2 --length 16 --pqi-windows 1 --sens-tokens 12 hf "
                     "text.txt -o s4.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    static const char *const quantizers[2] = {"--method rtn --rotate 1", "--method gptq --quantizer awq+gptq"};
    for (int k = 0; k < 2; k++) {
        char cmd[400];
        snprintf(cmd, sizeof cmd,
                 "measure --quiet %s --stats s4.safetensors --widths 2,4 --windows 2 --length 16 hf "
                 "text.txt -o m%d.safetensors",
                 quantizers[k], k);
        cr_assert_eq(run(cmd), 0, "%s: %s", cmd, slurp("err.txt", NULL));
    }
    cr_assert_eq(run("quantize --method auto --bpw 3 --rotate 1 --measure m0.safetensors hf r.safetensors"), 0, "%s",
                 slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --method auto --bpw 3 --quantizer awq+gptq --stats s4.safetensors --measure "
                     "m1.safetensors hf g.safetensors"),
                 0, "%s", slurp("err.txt", NULL));
    for (int k = 0; k < 2; k++) {
        mpq_llm *q = load(k ? "g.safetensors" : "r.safetensors");
        cr_assert_not_null(q);
        cr_assert_leq(maps_bpw(k ? "g.safetensors" : "r.safetensors", tm.layers, NULL), 3.0 + 1e-9);
        mpq_llm_free(q);
    }
    cr_assert_eq(run("quantize --method auto --bpw 3 --measure m0.safetensors hf x.safetensors"), 2);
    cr_assert(strstr(slurp("err.txt", NULL), "rotate 1"), "%s", slurp("err.txt", NULL));
    cr_assert_eq(run("quantize --method auto --bpw 3 --quantizer gptq --stats s4.safetensors --measure m1.safetensors "
                     "hf x.safetensors"),
                 2);
    cr_assert(strstr(slurp("err.txt", NULL), "awq+gptq"), "%s", slurp("err.txt", NULL));
    tl_free(&tm);
}
