/* mpq_model, sections 2 to 5, on tiny random models written as a Hugging
   Face directory and as GGUF (test/llm_fixture.h): both forms against a
   float64 reference forward pass written the simple way, so the two rotary
   conventions are checked against each other and against the reference;
   Qwen2's biases, untied heads, GQA, rotary scaling; the KV cache against
   whole-sequence passes; packed linear maps against their dequantized
   floats; perplexity as llama-perplexity computes it; KL divergence to a
   reference against float64 and its file; generation with
   PMPD schedules; and models that are wrong in every way the loader
   checks. */
#define _XOPEN_SOURCE 700
#include "common.h"
#include "llm_fixture.h"
#include "mpq_model.h"
#include "tmpdir.h"

#include <fcntl.h>
#include <sys/stat.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <unistd.h>

static char tmpdir[256];
static void make_tmpdir(void) { cr_assert(tc_tmpdir_make(tmpdir, sizeof tmpdir, "model")); }

/* the tmpdir holds a subdirectory or two: remove those first */
static void remove_tmpdir(void)
{
    char p[600];
    static const char *const subs[] = {"hf", "hf2"};
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/%s", tmpdir, subs[k]);
        tc_tmpdir_remove(p);
    }
    tc_tmpdir_remove(tmpdir);
}

static void shape(tl_model *m, int qwen, int tied, int bias)
{
    memset(m, 0, sizeof *m);
    m->vocab_rows = 320, m->dim = 48, m->layers = 2, m->heads = 6, m->kv_heads = 2, m->head_dim = 16, m->ffn = 80;
    m->qwen = qwen, m->tied = tied, m->bias = bias;
    m->theta = 10000.0, m->eps = 1e-5;
}

static mpq_llm *load(const char *path)
{
    mpq_llm *m = NULL;
    mpq_io_err e;
    cr_assert_eq(mpq_llm_load(path, &m, &e), MPQ_OK, "%s", e.msg);
    return m;
}

/* With MPQ_FUZZ_CORPUS set to a directory, the model files written here
   are also saved there (seeds of test/fuzz/fuzz_model.c; a learned
   scheduler's file, ext "pmpd", behind "PMPD" as that target reads it;
   a KL base file, ext "klb", behind "KLB"). */
static void corpus_save(const char *from, const char *ext)
{
    static int seq;
    const char *dir = getenv("MPQ_FUZZ_CORPUS");
    if (!dir || !*dir) return;
    char p[512];
    snprintf(p, sizeof p, "%s/model-%ld-%03d.%s", dir, (long)getpid(), seq++, ext);
    FILE *in = fopen(from, "rb"), *out = fopen(p, "wb");
    if (out && !strcmp(ext, "pmpd")) fputs("PMPD", out);
    if (out && !strcmp(ext, "klb")) fputs("KLB", out);
    char buf[65536];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    if (in) fclose(in);
    if (out) fclose(out);
}

static void paths(char *hf, char *gguf)
{
    sprintf(hf, "%s/hf", tmpdir);
    sprintf(gguf, "%s/m.gguf", tmpdir);
    mkdir(hf, 0755);
}

/* Logits of n tokens in one call. */
static float *logits_of(const mpq_llm *m, const int32_t *tok, int n, int batch, int skip)
{
    mpq_llm_state s;
    cr_assert_eq(mpq_llm_state_init(m, n, batch, &s), MPQ_OK);
    float *z = malloc(sizeof(float) * (size_t)n * m->c.vocab);
    cr_assert_eq(mpq_llm_forward(m, &s, tok, n, skip, z, 0), MPQ_OK);
    mpq_llm_state_free(&s);
    return z;
}

/* max |a - b| over max |b| */
static double rel_diff(const float *a, const double *b, size_t n)
{
    double d = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs(b[i]));
    }
    return d / mx;
}

static void random_tokens(synth_rng *r, int32_t *tok, int n, int vocab)
{
    for (int i = 0; i < n; i++) tok[i] = synth_int(r, vocab);
}

/* Both forms of a model give the reference's logits. */
static void both_forms_match_reference(tl_model *tm, uint64_t seed)
{
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(tm, seed);
    tl_write_hf(tm, hf, MPQ_DT_F32);
    tl_write_gguf(tm, gguf);
    char tj[700];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", hf);
    corpus_save(gguf, "gguf");
    corpus_save(tj, "json");
    mpq_llm *a = load(hf), *b = load(gguf);
    cr_assert_eq(a->c.rope_style, MPQ_ROPE_HALF);
    cr_assert_eq(b->c.rope_style, tm->qwen ? MPQ_ROPE_HALF : MPQ_ROPE_ADJACENT);
    cr_assert(!a->c.gguf_names && b->c.gguf_names);
    cr_assert_eq(a->c.tied, tm->tied);
    cr_assert_eq(b->c.tied, tm->tied);
    cr_assert_eq(a->c.qkv_bias, tm->bias);
    cr_assert_eq(b->c.qkv_bias, tm->bias);
    cr_assert_eq(a->c.vocab, 320);
    synth_rng r = {seed + 1};
    enum { N = 24 };
    int32_t tok[N];
    random_tokens(&r, tok, N, tm->v->n);
    double *ref = malloc(sizeof(double) * N * 320);
    tl_reference(tm, NULL, tok, N, ref);
    float *za = logits_of(a, tok, N, 7, 0), *zb = logits_of(b, tok, N, 64, 0);
    const double da = rel_diff(za, ref, (size_t)N * 320), db = rel_diff(zb, ref, (size_t)N * 320);
    cr_assert(da < 2e-5, "Hugging Face form against the float64 reference: %.3g", da);
    cr_assert(db < 2e-5, "GGUF form (%s pairs) against the float64 reference: %.3g", tm->qwen ? "half" : "adjacent",
              db);
    free(za), free(zb), free(ref);
    mpq_llm_free(a), mpq_llm_free(b);
}

Test(model, llama_in_both_rotary_conventions_gives_the_reference, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 0, 0);
    both_forms_match_reference(&tm, 11);
    tl_free(&tm);
    shape(&tm, 0, 1, 0); /* tied head */
    both_forms_match_reference(&tm, 12);
    tl_free(&tm);
    shape(&tm, 0, 0, 1); /* Llama with attention biases */
    both_forms_match_reference(&tm, 15);
    tl_free(&tm);
}

Test(model, qwen2_with_biases_gives_the_reference, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 1, 0, 1);
    tm.heads = 4, tm.kv_heads = 1, tm.head_dim = 12; /* GQA 4:1, q of 48, heads of 12 */
    both_forms_match_reference(&tm, 13);
    tl_free(&tm);
}

/* Heads of 40 floats (past two vectors of every SIMD width, with a tail)
   in groups of 4 (the attention's runs, whole) and of 6 (a run of 4 and
   one of 2): the float64 reference, and the same bits for every batch
   (pieces of 1, 5 and 64 tokens split the heads differently). */
Test(model, wide_heads_in_groups_give_the_reference_and_the_same_bits, .init = make_tmpdir, .fini = remove_tmpdir)
{
    for (int k = 0; k < 2; k++) {
        tl_model tm;
        shape(&tm, k, 0, k);
        tm.heads = k ? 12 : 8, tm.kv_heads = 2, tm.head_dim = 40;
        both_forms_match_reference(&tm, 17 + (uint64_t)k);
        char hf[600], gguf[600];
        paths(hf, gguf);
        mpq_llm *m = load(gguf);
        enum { N = 29 };
        int32_t tok[N];
        synth_rng r = {23 + (uint64_t)k};
        random_tokens(&r, tok, N, tm.v->n);
        float *whole = logits_of(m, tok, N, 64, 0);
        for (int b = 1; b <= 5; b += 4) {
            float *z = logits_of(m, tok, N, b, 0);
            cr_assert(!memcmp(z, whole, sizeof(float) * N * 320), "groups of %d, batch %d: not bit for bit",
                      tm.heads / tm.kv_heads, b);
            free(z);
        }
        free(whole);
        mpq_llm_free(m);
        tl_free(&tm);
    }
}

Test(model, rotary_scaling_gives_the_reference, .init = make_tmpdir, .fini = remove_tmpdir)
{
    for (int sc = 1; sc <= 2; sc++) {
        tl_model tm;
        shape(&tm, 0, 1, 0);
        tm.theta = 500000, tm.scaling = sc, tm.factor = 8, tm.low = 1, tm.high = 4, tm.orig_ctx = 64;
        char hf[600], gguf[600];
        paths(hf, gguf);
        tl_make(&tm, 20 + (uint64_t)sc);
        tl_write_hf(&tm, hf, MPQ_DT_F32);
        mpq_llm *a = load(hf);
        cr_assert_eq(a->c.rope_scaling, sc == 1 ? MPQ_ROPE_SCALING_LINEAR : MPQ_ROPE_SCALING_LLAMA3);
        for (int i = 0; i < tm.head_dim / 2; i++)
            cr_assert(fabs(a->rope_freq[i] - tl_freq(&tm, i)) <= 1e-6 * tl_freq(&tm, i), "frequency %d: %g, want %g", i,
                      a->rope_freq[i], tl_freq(&tm, i));
        enum { N = 40 };
        int32_t tok[N];
        synth_rng r = {7};
        random_tokens(&r, tok, N, tm.v->n);
        double *ref = malloc(sizeof(double) * N * 320);
        tl_reference(&tm, NULL, tok, N, ref);
        float *z = logits_of(a, tok, N, 16, 0);
        const double d = rel_diff(z, ref, (size_t)N * 320);
        cr_assert(d < 2e-5, "scaling %d: %.3g", sc, d);
        free(z), free(ref);
        mpq_llm_free(a);
        tl_free(&tm);
    }
}

/* ---- the cache ------------------------------------------------------------------- */

Test(model, every_batch_and_the_cache_give_the_same_logits, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 0, 0);
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(&tm, 31);
    tl_write_gguf(&tm, gguf);
    mpq_llm *m = load(gguf);
    enum { N = 37 };
    int32_t tok[N];
    synth_rng r = {3};
    random_tokens(&r, tok, N, tm.v->n);
    for (int packed = 0; packed < 2; packed++) {
        if (packed) /* every linear map packed at 4 bits, the embedding at 8 */
            for (int i = -1; i < m->c.layers * MPQ_LIN_COUNT; i++) {
                mpq_linear *L = i < 0 ? &m->embed : &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
                mpq_bitplane_desc d = {0};
                d.rows = L->rows, d.cols = L->cols, d.uniform_bits = i < 0 ? 8 : 4, d.group = 16;
                mpq_packed A;
                cr_assert_eq(mpq_pack_alloc(&d, L->W, &A), MPQ_OK);
                cr_assert_eq(mpq_linear_set_packed(m, L, &A), MPQ_OK);
            }
        float *whole = logits_of(m, tok, N, 64, 0);
        for (int b = 1; b <= 16; b *= 4) {
            float *z = logits_of(m, tok, N, b, 0);
            cr_assert(!memcmp(z, whole, sizeof(float) * N * 320), "batch %d, packed %d: not bit for bit", b, packed);
            free(z);
        }
        /* token by token through the cache, logits of one token at a time */
        mpq_llm_state s;
        cr_assert_eq(mpq_llm_state_init(m, N, 8, &s), MPQ_OK);
        float z[320];
        for (int t = 0; t < N; t++) {
            cr_assert_eq(mpq_llm_forward(m, &s, &tok[t], 1, 0, z, 0), MPQ_OK);
            cr_assert(!memcmp(z, whole + (size_t)t * 320, sizeof z), "decode step %d, packed %d", t, packed);
        }
        /* a full cache, a token outside the vocabulary: errors, nothing run */
        cr_assert_eq(mpq_llm_forward(m, &s, tok, 1, 0, z, 0), MPQ_ERR_RANGE);
        cr_assert_eq(s.pos, N);
        mpq_llm_state_reset(&s);
        const int32_t bad[2] = {1, 320};
        cr_assert_eq(mpq_llm_forward(m, &s, bad, 2, 0, z, 1), MPQ_ERR_ARG);
        cr_assert_eq(s.pos, 0);
        cr_assert_eq(mpq_llm_forward(m, &s, bad, 1, 0, z, 2), MPQ_ERR_ARG, "first past n");
        mpq_llm_state_free(&s);
        /* three sequences (streams at offsets 0, 11, 20 of tok; prompts of 6, 1
           and 9 tokens) decoded together: each step's logits equal those of the
           sequence run alone, bit for bit */
        enum { NS = 3, STEPS = 7 };
        const int off[NS] = {0, 11, 20}, pre[NS] = {6, 1, 9};
        mpq_llm_state seq[NS], work;
        mpq_llm_state *sp[NS];
        float *alone[NS], zs[NS * 320];
        cr_assert_eq(mpq_llm_state_init(m, 16, 4, &work), MPQ_OK);
        for (int i = 0; i < NS; i++) {
            alone[i] = logits_of(m, tok + off[i], pre[i] + STEPS, 64, 0);
            cr_assert_eq(mpq_llm_state_init(m, 16, 8, &seq[i]), MPQ_OK);
            cr_assert_eq(mpq_llm_forward(m, &seq[i], tok + off[i], pre[i] - 1, 0, NULL, 0), MPQ_OK);
            sp[i] = &seq[i];
        }
        for (int k = 0; k < STEPS; k++) {
            int32_t next[NS];
            for (int i = 0; i < NS; i++) next[i] = tok[off[i] + pre[i] - 1 + k];
            /* the scratch: a state of its own, or one of the sequences */
            cr_assert_eq(mpq_llm_decode(m, sp, NS, next, 0, k % 2 ? &work : sp[1], zs), MPQ_OK);
            for (int i = 0; i < NS; i++) {
                cr_assert_eq(seq[i].pos, pre[i] + k);
                cr_assert(!memcmp(zs + (size_t)i * 320, alone[i] + (size_t)(pre[i] - 1 + k) * 320, sizeof(float) * 320),
                          "sequence %d, step %d, packed %d: not bit for bit", i, k, packed);
            }
        }
        /* errors change nothing: a sequence twice, more than the scratch's
           batch, a token outside the vocabulary, a full cache */
        mpq_llm_state *twice[2] = {sp[0], sp[0]}, small;
        const int32_t two[3] = {1, 2, 3}, bad2[3] = {1, 320, 2};
        cr_assert_eq(mpq_llm_state_init(m, 16, 2, &small), MPQ_OK);
        cr_assert_eq(mpq_llm_decode(m, twice, 2, two, 0, &work, zs), MPQ_ERR_ARG);
        cr_assert_eq(mpq_llm_decode(m, sp, 3, two, 0, &small, zs), MPQ_ERR_SIZE, "3 tokens, a scratch of batch 2");
        mpq_llm_state_free(&small);
        cr_assert_eq(mpq_llm_decode(m, sp, 3, bad2, 0, &work, zs), MPQ_ERR_ARG);
        seq[2].pos = seq[2].ctx;
        cr_assert_eq(mpq_llm_decode(m, sp, 3, two, 0, &work, zs), MPQ_ERR_RANGE);
        for (int i = 0; i < 2; i++) cr_assert_eq(seq[i].pos, pre[i] + STEPS - 1, "sequence %d moved", i);
        for (int i = 0; i < NS; i++) mpq_llm_state_free(&seq[i]), free(alone[i]);
        mpq_llm_state_free(&work);
        free(whole);
    }
    mpq_llm_free(m);
    tl_free(&tm);
}

/* A piece runs on a team of threads in one parallel region (mpq_model.c,
   "THE THREADS OF A PIECE") unless its model is observed or it has one
   thread: the team's logits must be a lone thread's and the observed
   model's, bit for bit. The maps: q, k and v under one column scale (their
   products read one set of tables), gate and up under scales of their own,
   o and down rotated, one float down map among the packed ones, Qwen2's
   biases, a packed head. A NaN weight makes every thread stop with
   MPQ_ERR_NONFINITE, the cache untouched. */
static int observed_calls;
static void count_observe(void *user, int layer, int lin, const float *x, int tokens, int cols)
{
    (void)user, (void)layer, (void)lin, (void)x, (void)tokens, (void)cols;
    observed_calls++;
}

static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n > 0 ? n : omp_get_num_procs());
#else
    (void)n;
#endif
}

static float *logits_on(const mpq_llm *m, const int32_t *tok, int n, int threads, int *team)
{
    set_threads(threads);
    mpq_llm_state s;
    cr_assert_eq(mpq_llm_state_init(m, n, 8, &s), MPQ_OK);
    float *z = malloc(sizeof(float) * (size_t)n * m->c.vocab);
    for (int t = 0; t < n; t += 5) { /* a prompt of 5, then pieces of 5 */
        cr_assert_eq(mpq_llm_forward(m, &s, tok + t, n - t < 5 ? n - t : 5, 0, z + (size_t)t * m->c.vocab, 0), MPQ_OK);
        *team = s.team > *team ? s.team : *team;
    }
    mpq_llm_state_free(&s);
    return z;
}

Test(model, a_team_of_threads_gives_the_logits_of_one_thread, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 1, 0, 1);
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(&tm, 47);
    tl_write_gguf(&tm, gguf);
    mpq_llm *m = load(gguf);
    synth_rng r = {5};
    const int D = m->c.dim, F = m->c.ffn;
    float *cs = malloc(sizeof(float) * (size_t)(F > D ? F : D) * 3);
    for (int j = 0; j < 3 * (F > D ? F : D); j++) cs[j] = 0.5f + (float)synth_unif(&r);
    mpq_rotation rot[2];
    cr_assert_eq(mpq_rotation_init(&rot[0], m->c.heads * m->c.head_dim, 11), MPQ_OK);
    cr_assert_eq(mpq_rotation_init(&rot[1], F, 12), MPQ_OK);
    for (int i = -1; i < m->c.layers * MPQ_LIN_COUNT; i++) {
        const int lin = i % MPQ_LIN_COUNT;
        if (i == MPQ_LIN_DOWN) continue; /* layer 0's down map stays float */
        mpq_linear *L = i < 0 ? &m->head : &m->layer[i / MPQ_LIN_COUNT].lin[lin];
        mpq_bitplane_desc d = {0};
        d.rows = L->rows, d.cols = L->cols, d.uniform_bits = i < 0 ? 8 : 3 + (i & 1), d.group = 16;
        if (i >= 0 && lin <= MPQ_LIN_V) d.col_scale = cs;
        if (lin == MPQ_LIN_GATE || lin == MPQ_LIN_UP) d.col_scale = cs + (lin - MPQ_LIN_GATE + 1) * D;
        if (i >= 0 && lin == MPQ_LIN_O) d.rotation = &rot[0];
        if (i >= 0 && lin == MPQ_LIN_DOWN) d.rotation = &rot[1];
        mpq_packed A;
        const mpq_status st = mpq_pack_alloc(&d, L->W, &A);
        cr_assert_eq(st, MPQ_OK, "map %d: %s", i, mpq_status_str(st));
        cr_assert_eq(mpq_linear_set_packed(m, L, &A), MPQ_OK);
    }
    const mpq_linear *L0 = m->layer[0].lin;
    cr_assert(mpq_gemv_tables_shared(&L0[MPQ_LIN_Q].A, &L0[MPQ_LIN_V].A));
    cr_assert(!mpq_gemv_tables_shared(&L0[MPQ_LIN_GATE].A, &L0[MPQ_LIN_UP].A));
    enum { N = 23 };
    int32_t tok[N];
    random_tokens(&r, tok, N, m->c.vocab);
    int team = 0, one = 0;
    float *z1 = logits_on(m, tok, N, 1, &one);
    cr_assert_eq(one, 1);
    float *zt = NULL;
    for (int attempt = 0; attempt < 5 && team < 2; attempt++) { /* a busy machine may leave one core */
        free(zt);
        zt = logits_on(m, tok, N, 3, &team);
    }
    if (team < 2) {
        free(z1), free(zt), free(cs);
        mpq_rotation_free(&rot[0]), mpq_rotation_free(&rot[1]);
        mpq_llm_free(m);
        tl_free(&tm);
        cr_skip_test("no second core was free for a team");
    }
    cr_assert(!memcmp(zt, z1, sizeof(float) * N * m->c.vocab), "a team of %d: not bit for bit", team);
    m->observe = count_observe;
    int obs = 0;
    float *zo = logits_on(m, tok, N, 3, &obs);
    cr_assert_eq(obs, 1, "an observed model runs without a team");
    cr_assert_eq(observed_calls, 5 * m->c.layers * MPQ_LIN_COUNT);
    cr_assert(!memcmp(zo, z1, sizeof(float) * N * m->c.vocab), "observed: not bit for bit");
    m->observe = NULL;
    /* a NaN weight in layer 0's float down map: h is NaN from there on */
    m->layer[0].lin[MPQ_LIN_DOWN].W[7] = NAN;
    for (int threads = 1; threads <= 3; threads += 2) {
        set_threads(threads);
        mpq_llm_state s;
        cr_assert_eq(mpq_llm_state_init(m, N, 8, &s), MPQ_OK);
        cr_assert_eq(mpq_llm_forward(m, &s, tok, 4, 0, zo, 0), MPQ_ERR_NONFINITE, "%d threads", threads);
        cr_assert_eq(s.pos, 0);
        mpq_llm_state_free(&s);
    }
    set_threads(0);
    free(z1), free(zt), free(zo), free(cs);
    mpq_rotation_free(&rot[0]), mpq_rotation_free(&rot[1]);
    mpq_llm_free(m);
    tl_free(&tm);
}

/* ---- weights in place --------------------------------------------------------------- */

/* A model loaded with in_place keeps its float matrices in the file (Ws, no
   W) and gives the logits of the same file loaded as float32, bit for bit,
   on one thread and on a team: Hugging Face directories with F32, F16 and
   BF16 maps (an untied head in place too, a tied one, Qwen2's biases) and
   GGUF files with F32, F16, BF16, Q8_0 and Q4_1 maps (shapes whose columns
   are whole blocks of 32). What differentiates weights refuses the model. */
static mpq_llm *load_in_place(const char *path)
{
    mpq_llm *m = NULL;
    mpq_io_err e;
    mpq_llm_load_opts o = {1, 0};
    cr_assert_eq(mpq_llm_load_with(path, &o, &m, &e), MPQ_OK, "%s", e.msg);
    return m;
}

Test(model, weights_in_place_give_the_float32_logits_bit_for_bit, .init = make_tmpdir, .fini = remove_tmpdir)
{
    static const struct {
        int gguf;
        uint32_t type; /* ggml type (GGUF) or mpq_dtype (HF) */
        int qwen, tied;
    } cases[] = {{0, MPQ_DT_BF16, 0, 0}, {0, MPQ_DT_F16, 1, 1}, {0, MPQ_DT_F32, 0, 1}, {1, 0, 0, 0},
                 {1, 1, 1, 0},           {1, 30, 0, 1},         {1, 8, 0, 0},          {1, 3, 1, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tl_model tm;
        shape(&tm, cases[c].qwen, cases[c].tied, cases[c].qwen);
        tm.dim = 64, tm.heads = 4, tm.kv_heads = 2, tm.head_dim = 16, tm.ffn = 96; /* columns of 64 and 96 */
        tl_make(&tm, 60 + c);
        char hf[600], gguf[600];
        paths(hf, gguf);
        if (cases[c].gguf)
            tl_write_gguf_typed(&tm, gguf, cases[c].type);
        else
            tl_write_hf(&tm, hf, (mpq_dtype)cases[c].type);
        const char *path = cases[c].gguf ? gguf : hf;
        mpq_llm *f = load(path), *p = load_in_place(path);
        cr_assert_not_null(p->src);
        cr_assert_eq(mpq_llm_check_files(p, NULL), MPQ_OK);
        for (int l = 0; l < p->c.layers; l++)
            for (int k = 0; k < MPQ_LIN_COUNT; k++) {
                const mpq_linear *L = &p->layer[l].lin[k];
                cr_assert(!L->W && L->Ws && L->ws_row == mpq_gguf_type_bytes(L->ws_type, (uint64_t)L->cols),
                          "case %zu: map %d.%d is not in place", c, l, k);
            }
        cr_assert(!p->embed.W && p->embed.Ws && !p->head.W && p->head.Ws, "case %zu", c);
        if (cases[c].type != 0 && cases[c].type != MPQ_DT_F32)
            cr_assert_lt(mpq_llm_weight_bytes(p), mpq_llm_weight_bytes(f), "case %zu", c);
        mpq_llm_param par[64];
        const int np = mpq_llm_params(p, par, 64);
        for (int i = 0; i < np && i < 64; i++)
            if (par[i].role == MPQ_PARAM_LINEAR) cr_assert_null(par[i].data);
        mpq_llm_train *t = NULL;
        cr_assert_eq(mpq_llm_train_init(p, 8, &t), MPQ_ERR_UNSUPPORTED, "case %zu", c);
        synth_rng r = {70 + c};
        enum { N = 17 };
        int32_t tok[N];
        random_tokens(&r, tok, N, p->c.vocab);
        int t1 = 0, tt = 0, tf = 0;
        float *zf = logits_on(f, tok, N, 1, &tf), *z1 = logits_on(p, tok, N, 1, &t1), *zt = NULL;
        for (int attempt = 0; attempt < 5 && tt < 2; attempt++) {
            free(zt);
            zt = logits_on(p, tok, N, 3, &tt);
        }
        cr_assert(!memcmp(z1, zf, sizeof(float) * N * p->c.vocab), "case %zu: one thread, not bit for bit", c);
        cr_assert(!memcmp(zt, zf, sizeof(float) * N * p->c.vocab), "case %zu: a team of %d, not bit for bit", c, tt);
        /* two sequences decoded side by side, their first tokens after a prompt of 3 */
        set_threads(0);
        mpq_llm_state a[2], b[2], scratch[2];
        float za[2 * 512], zb[2 * 512];
        cr_assert_leq(p->c.vocab, 512);
        for (int q = 0; q < 2; q++) {
            const mpq_llm *mm = q ? p : f;
            mpq_llm_state *S = q ? b : a;
            cr_assert_eq(mpq_llm_state_init(mm, 8, 2, &scratch[q]), MPQ_OK);
            for (int i = 0; i < 2; i++) {
                cr_assert_eq(mpq_llm_state_init(mm, 8, 4, &S[i]), MPQ_OK);
                cr_assert_eq(mpq_llm_forward(mm, &S[i], tok + 3 * i, 3, 0, NULL, 0), MPQ_OK);
            }
            mpq_llm_state *const seqs[2] = {&S[0], &S[1]};
            cr_assert_eq(mpq_llm_decode(mm, seqs, 2, tok + 10, 0, &scratch[q], q ? zb : za), MPQ_OK);
        }
        cr_assert(!memcmp(za, zb, sizeof(float) * 2 * p->c.vocab), "case %zu: decode, not bit for bit", c);
        for (int q = 0; q < 2; q++) {
            mpq_llm_state_free(&scratch[q]);
            mpq_llm_state_free(&a[q]), mpq_llm_state_free(&b[q]);
        }
        free(zf), free(z1), free(zt);
        mpq_llm_free(f), mpq_llm_free(p);
        tl_free(&tm);
    }
}

/* A file that changes under a model in place stops the forward pass
   (MPQ_ERR_IO, the cache untouched) with the file named; a weight that is
   not finite, or one stored where a GGUF block's scale is infinite, is
   refused at load naming the tensor; the pieces below the model refuse bad
   arguments. */
Test(model, weights_in_place_refuse_changed_files_and_bad_values, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 0, 0);
    tm.dim = 64, tm.heads = 4, tm.kv_heads = 2, tm.head_dim = 16, tm.ffn = 96;
    tl_make(&tm, 81);
    char hf[600], gguf[600], st[700];
    paths(hf, gguf);
    tl_write_hf(&tm, hf, MPQ_DT_BF16);
    snprintf(st, sizeof st, "%s/model.safetensors", hf);
    const int32_t tok[4] = {1, 2, 3, 4};
    for (int how = 0; how < 2; how++) {
        mpq_llm *p = load_in_place(hf);
        mpq_llm_state s;
        cr_assert_eq(mpq_llm_state_init(p, 16, 4, &s), MPQ_OK);
        cr_assert_eq(mpq_llm_forward(p, &s, tok, 2, 0, NULL, 0), MPQ_OK);
        if (how == 0) { /* grows by a byte */
            FILE *f = fopen(st, "ab");
            cr_assert_not_null(f);
            fputc(0, f);
            fclose(f);
        } else { /* the same size, another modification time */
            struct timespec ts[2] = {{1000000000, 0}, {1000000000, 0}};
            cr_assert_eq(utimensat(AT_FDCWD, st, ts, 0), 0);
        }
        cr_assert_eq(mpq_llm_forward(p, &s, tok + 2, 2, 0, NULL, 0), MPQ_ERR_IO, "change %d", how);
        cr_assert_eq(s.pos, 2);
        mpq_io_err e;
        cr_assert_eq(mpq_llm_check_files(p, &e), MPQ_ERR_IO);
        cr_assert(strstr(e.msg, "model.safetensors") && strstr(e.msg, "changed since it was opened"), "%s", e.msg);
        mpq_llm_state_free(&s);
        mpq_llm_free(p);
        tl_write_hf(&tm, hf, MPQ_DT_BF16); /* a fresh file for the next change */
    }
    /* a NaN weight: refused in place as in float32, naming the tensor */
    tm.w[1][MPQ_LIN_UP][17] = NAN;
    tl_write_hf(&tm, hf, MPQ_DT_BF16);
    mpq_llm *m = NULL;
    mpq_io_err e;
    mpq_llm_load_opts o = {1, 0};
    cr_assert_eq(mpq_llm_load_with(hf, &o, &m, &e), MPQ_ERR_NONFINITE);
    cr_assert(strstr(e.msg, "model.layers.1.mlp.up_proj.weight") && strstr(e.msg, "value 17 is NaN"), "%s", e.msg);
    cr_assert_null(m);
    tm.w[1][MPQ_LIN_UP][17] = 0.0f;
    /* a Q8_0 block whose scale is infinite */
    tm.w[0][MPQ_LIN_K][40] = 1e9f; /* d = 1e9 / 127 is beyond fp16 */
    tl_write_gguf_typed(&tm, gguf, 8);
    cr_assert_eq(mpq_llm_load_with(gguf, &o, &m, &e), MPQ_ERR_NONFINITE);
    cr_assert(strstr(e.msg, "blk.0.attn_k.weight") && strstr(e.msg, "m.gguf"), "%s", e.msg);
    cr_assert_eq(mpq_llm_load_with(gguf, NULL, &m, &e), MPQ_ERR_ARG);
    /* the conversion and the mapping below the model */
    float v[64];
    const uint8_t raw[64] = {0};
    cr_assert_eq(mpq_gguf_decode(4, raw, 32, v), MPQ_ERR_ARG);                 /* no such type */
    cr_assert_eq(mpq_gguf_decode(MPQ_GGML_Q8_0, raw, 33, v), MPQ_ERR_ARG);     /* not whole blocks */
    cr_assert_eq(mpq_gguf_decode(MPQ_GGML_Q2_K - 1, raw, 32, v), MPQ_ERR_ARG); /* Q8_1: not converted */
    cr_assert_eq(mpq_gguf_decode(MPQ_GGML_F16, NULL, 2, v), MPQ_ERR_ARG);
    cr_assert_eq(mpq_gguf_decode(MPQ_GGML_Q8_0, raw, 32, v), MPQ_OK);
    cr_assert_eq(mpq_gguf_type_bytes(MPQ_GGML_Q4_1, 64), 40);
    cr_assert_eq(mpq_gguf_type_bytes(MPQ_GGML_Q4_1, 63), 0);
    cr_assert_eq(mpq_gguf_type_bytes(4, 32), 0);
    cr_assert_eq(mpq_gguf_type_bytes(MPQ_GGML_BF16, 5), 10);
    mpq_source *src = NULL;
    cr_assert_eq(mpq_source_open(gguf, &src, &e), MPQ_OK, "%s", e.msg);
    const void *data = NULL;
    uint32_t type = 99;
    const mpq_source_tensor *t = mpq_source_find(src, "blk.0.attn_q.weight");
    cr_assert_eq(mpq_source_map(src, t, &data, NULL, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_source_map(src, NULL, &data, &type, &e), MPQ_ERR_ARG);
    cr_assert_eq(mpq_source_map(src, t, &data, &type, &e), MPQ_OK, "%s", e.msg);
    cr_assert(data && type == MPQ_GGML_Q8_0);
    cr_assert_eq(mpq_source_check(src, &e), MPQ_OK);
    cr_assert_eq(mpq_source_check(NULL, &e), MPQ_ERR_ARG);
    mpq_source_close(src);
    tl_free(&tm);
}

/* ---- packed linear maps ------------------------------------------------------------ */

Test(model, packed_linear_maps_equal_their_dequantized_floats, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 0, 0);
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(&tm, 41);
    tl_write_hf(&tm, hf, MPQ_DT_BF16);
    mpq_llm *m = load(hf);
    const int nl = m->c.layers * MPQ_LIN_COUNT;
    float *(*deq)[7] = calloc((size_t)m->c.layers, sizeof *deq);
    synth_rng r = {9};
    /* widths, formats, permutations and column scales of every kind */
    for (int i = 0; i < nl; i++) {
        mpq_linear *L = &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
        mpq_bitplane_desc d = {0};
        d.rows = L->rows, d.cols = L->cols, d.uniform_bits = 2 + i % 4, d.group = 16;
        uint32_t *pr = NULL, *pc = NULL;
        float *cs = NULL;
        if (i % 3 == 1) {
            d.format = MPQ_FORMAT_MXINT, d.group = 0;
        } else if (i % 3 == 2) {
            pr = malloc(sizeof(uint32_t) * (size_t)L->rows), pc = malloc(sizeof(uint32_t) * (size_t)L->cols);
            cs = malloc(sizeof(float) * (size_t)L->cols);
            synth_perm(&r, pr, L->rows);
            synth_perm(&r, pc, L->cols);
            for (int j = 0; j < L->cols; j++) cs[j] = 0.5f + (float)synth_unif(&r);
            d.p_row = pr, d.p_col = pc, d.col_scale = cs;
        }
        mpq_packed A;
        cr_assert_eq(mpq_pack_alloc(&d, L->W, &A), MPQ_OK, "layer map %d", i);
        cr_assert_eq(mpq_linear_set_packed(m, L, &A), MPQ_OK);
        cr_assert_null(A.buf, "the model took the buffer");
        free(pr), free(pc), free(cs);
    }
    enum { N = 20 };
    int32_t tok[N];
    random_tokens(&r, tok, N, tm.v->n);
    for (int skip = 0; skip <= 1; skip++) {
        for (int i = 0; i < nl; i++) {
            const mpq_linear *L = &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
            free(deq[i / MPQ_LIN_COUNT][i % MPQ_LIN_COUNT]);
            float *W = malloc(sizeof(float) * (size_t)L->rows * L->cols);
            cr_assert_eq(mpq_packed_dequantize(&L->A, skip, W), MPQ_OK);
            deq[i / MPQ_LIN_COUNT][i % MPQ_LIN_COUNT] = W;
        }
        double *ref = malloc(sizeof(double) * N * 320);
        tl_reference(&tm, (float *const(*)[7])deq, tok, N, ref);
        float *z = logits_of(m, tok, N, 8, skip);
        const double d = rel_diff(z, ref, (size_t)N * 320);
        /* the products' own rounding (the int16 tables of the VNNI path at most
           2^-15 of a group's largest table entry per lookup) */
        cr_assert(d < 2e-3, "skip %d: packed forward against the reference on the dequantized weights: %.3g", skip, d);
        cr_log_info("skip %d: packed forward within %.2g of the float64 reference on the dequantized weights", skip, d);
        free(z), free(ref);
    }
    { /* the same maps in the model's file: loaded in place, each map on a 64-byte boundary of the file is a view
         into its mapping (the others copies), and the logits are those of the model loaded into memory */
        char file[700];
        snprintf(file, sizeof file, "%s/model.safetensors", hf);
        mpq_st_file *in;
        mpq_st_writer *w;
        mpq_io_err e;
        cr_assert_eq(mpq_st_open(file, &in, &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(mpq_st_writer_open(file, &w, &e), MPQ_OK, "%s", e.msg);
        for (int k = 0; k < mpq_st_count(in); k++) {
            const mpq_st_tensor *t = mpq_st_at(in, k);
            const mpq_packed *A = NULL;
            char nm[256];
            for (int i = 0; i < nl && !A; i++)
                if (!strcmp(mpq_llm_linear_name(0, i / MPQ_LIN_COUNT, i % MPQ_LIN_COUNT, 0, nm, sizeof nm), t->name))
                    A = &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT].A;
            if (A) {
                cr_assert_eq(mpq_st_write_packed(w, t->name, A, &e), MPQ_OK, "%s", e.msg);
                continue;
            }
            float *v = malloc(sizeof(float) * (size_t)t->numel);
            cr_assert_eq(mpq_st_read_f32(in, t, v, (size_t)t->numel, &e), MPQ_OK, "%s", e.msg);
            cr_assert_eq(mpq_st_write_f32(w, t->name, t->dtype, t->ndim, t->shape, v, &e), MPQ_OK, "%s", e.msg);
            free(v);
        }
        cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK, "%s", e.msg);
        mpq_st_close(in);
        mpq_llm *a = NULL, *b = NULL, *c = load_in_place(hf); /* c: the packed products moved to huge pages */
        mpq_llm_load_opts oa = {0, 1}, ob = {1, 1};           /* a, b: kept as loading reads them */
        cr_assert_eq(mpq_llm_load_with(hf, &oa, &a, &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(mpq_llm_load_with(hf, &ob, &b, &e), MPQ_OK, "%s", e.msg);
        cr_assert(!a->arena && !b->arena);
        cr_assert_eq(mpq_st_open(file, &in, &e), MPQ_OK, "%s", e.msg);
        int views = 0;
        for (int i = 0; i < nl; i++) {
            const mpq_linear *La = &a->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
            const mpq_linear *Lb = &b->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
            char nm[256];
            mpq_llm_linear_name(0, i / MPQ_LIN_COUNT, i % MPQ_LIN_COUNT, 0, nm, sizeof nm);
            const mpq_st_tensor *t = mpq_st_find(in, nm);
            cr_assert(t && La->A.buf && La->A.owned && Lb->A.bytes == La->A.bytes);
            cr_assert(!memcmp(La->A.buf, Lb->A.buf, La->A.bytes), "map %d", i);
            const void *at;
            cr_assert_eq(mpq_st_map(in, t, &at, &e), MPQ_OK, "%s", e.msg);
            const int aligned = (uintptr_t)at % 64 == 0;
            cr_assert_eq(!Lb->A.owned, aligned, "map %d: in place exactly when on a 64-byte boundary", i);
            views += aligned;
            const mpq_linear *Lc = &c->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
            const uint8_t *cb = (const uint8_t *)Lc->A.buf, *ar = (const uint8_t *)c->arena;
            if (ar) /* where the system has huge pages: every packed product in the one region, the same bytes */
                cr_assert(!Lc->A.owned && cb >= ar && cb + Lc->A.bytes <= ar + c->arena_bytes, "map %d", i);
            cr_assert(Lc->A.bytes == La->A.bytes && !memcmp(La->A.buf, cb, La->A.bytes), "map %d", i);
        }
        mpq_st_close(in);
        cr_assert(views > 0, "some map lies on a boundary");
        cr_log_info("in place: %d of %d maps used from the mapping", views, nl);
#ifdef __linux__
        cr_assert_not_null(c->arena, "Linux has MADV_HUGEPAGE");
#endif
        float *za = logits_of(a, tok, N, 8, 0), *zb = logits_of(b, tok, N, 8, 0), *zc = logits_of(c, tok, N, 8, 0);
        cr_assert(!memcmp(za, zb, sizeof(float) * N * (size_t)a->c.vocab), "in place: the same logits");
        cr_assert(!memcmp(za, zc, sizeof(float) * N * (size_t)a->c.vocab), "in huge pages: the same logits");
        free(za), free(zb), free(zc);
        mpq_llm_free(a), mpq_llm_free(b), mpq_llm_free(c);
    }
    cr_assert(mpq_llm_bpw(m, 1, -1) > 2.0 && mpq_llm_bpw(m, 1, 1) < mpq_llm_bpw(m, 1, 0));
    /* the embedding packed: lookups dequantize one row, bit for bit */
    mpq_bitplane_desc d = {0};
    d.rows = m->embed.rows, d.cols = m->embed.cols, d.uniform_bits = 8;
    mpq_packed E;
    cr_assert_eq(mpq_pack_alloc(&d, m->embed.W, &E), MPQ_OK);
    float *Ed = malloc(sizeof(float) * (size_t)d.rows * d.cols), row[48];
    cr_assert_eq(mpq_packed_dequantize(&E, 0, Ed), MPQ_OK);
    for (int i = 0; i < d.rows; i += 7) {
        cr_assert_eq(mpq_packed_dequantize_row(&E, 0, i, row), MPQ_OK);
        cr_assert(!memcmp(row, Ed + (size_t)i * d.cols, sizeof row), "row %d", i);
    }
    cr_assert_eq(mpq_packed_dequantize_row(&E, 0, d.rows, row), MPQ_ERR_ARG);
    cr_assert_eq(mpq_linear_set_packed(m, &m->embed, &E), MPQ_OK);
    cr_assert(m->head.A.buf == m->embed.A.buf || !m->c.tied);
    free(Ed);
    for (int l = 0; l < m->c.layers; l++)
        for (int k = 0; k < 7; k++) free(deq[l][k]);
    free(deq);
    mpq_llm_free(m);
    tl_free(&tm);
}

/* ---- perplexity ---------------------------------------------------------------------- */

/* llama-perplexity's computation written out over the reference forward;
 *err: its uncertainty, ppl * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1)). */
static double ref_ppl(const tl_model *tm, const int32_t *tok, size_t n, int ctx, int bos, long *count, double *err)
{
    double nll = 0, nll2 = 0;
    *count = 0;
    int32_t *chunk = malloc(sizeof(int32_t) * (size_t)ctx);
    double *z = malloc(sizeof(double) * (size_t)ctx * 320);
    for (size_t c = 0; c + 1 <= n / (size_t)ctx; c++) {
        memcpy(chunk, tok + c * (size_t)ctx, sizeof(int32_t) * (size_t)ctx);
        if (bos >= 0) chunk[0] = bos;
        tl_reference(tm, NULL, chunk, ctx, z);
        for (int i = ctx / 2; i < ctx - 1; i++) {
            const double *zi = z + (size_t)i * 320;
            double mx = zi[0], s = 0;
            for (int v = 1; v < 320; v++) mx = fmax(mx, zi[v]);
            for (int v = 0; v < 320; v++) s += exp(zi[v] - mx);
            const double v = log(s) + mx - zi[chunk[i + 1]];
            nll += v, nll2 += v * v;
            (*count)++;
        }
    }
    free(chunk), free(z);
    const double mean = nll / *count, ppl = exp(mean);
    if (err) *err = ppl * sqrt((nll2 / *count - mean * mean) / (*count - 1));
    return ppl;
}

/* Every linear map of the layers packed at `bits`, groups of 16. */
static void pack_all(mpq_llm *m, int bits)
{
    for (int i = 0; i < m->c.layers * MPQ_LIN_COUNT; i++) {
        mpq_linear *L = &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
        mpq_bitplane_desc d = {0};
        d.rows = L->rows, d.cols = L->cols, d.uniform_bits = bits, d.group = 16;
        mpq_packed A;
        cr_assert_eq(mpq_pack_alloc(&d, L->W, &A), MPQ_OK);
        cr_assert_eq(mpq_linear_set_packed(m, L, &A), MPQ_OK);
    }
}

/* ---- another backend ----------------------------------------------------------------- */

/* The CPU backend's functions, with a pin and an unpin that record their
   calls (and a pin that can be made to fail). */
typedef struct pin_log {
    int pins, unpins, fail;
    void *p, *unpinned;
    size_t bytes;
} pin_log;

static mpq_status log_pin(void *ctx, void *p, size_t bytes)
{
    pin_log *g = (pin_log *)ctx;
    g->pins++;
    if (g->fail) return MPQ_ERR_DEVICE;
    g->p = p, g->bytes = bytes;
    return MPQ_OK;
}

static void log_unpin(void *ctx, void *p)
{
    pin_log *g = (pin_log *)ctx;
    g->unpins++, g->unpinned = p;
}

/* [p, p + n floats) inside the pinned range */
static int inside(const pin_log *g, const float *p, size_t n)
{
    const char *lo = (const char *)g->p, *a = (const char *)p;
    return a >= lo && a + sizeof(float) * n <= lo + g->bytes;
}

Test(model, a_backend_pins_the_scratch_of_its_states, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 0, 0);
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(&tm, 47);
    tl_write_hf(&tm, hf, MPQ_DT_F32);
    mpq_llm *m = load(hf);
    pack_all(m, 3);
    enum { N = 13, B = 5, S = 3 };
    synth_rng r = {48};
    int32_t tok[N];
    random_tokens(&r, tok, N, tm.v->n);
    const size_t V = (size_t)m->c.vocab;
    float *want = logits_of(m, tok, N, B, 0); /* on this CPU, no backend */
    mpq_backend be;
    mpq_backend_cpu(&be);
    cr_assert(!be.pin && !be.unpin, "the CPU backend has nothing to pin");
    pin_log g = {0};
    be.ctx = &g, be.pin = log_pin, be.unpin = log_unpin;
    cr_assert_eq(mpq_llm_use_backend(m, &be), MPQ_OK);
    mpq_llm_state s;
    cr_assert_eq(mpq_llm_state_init(m, N, B, &s), MPQ_OK);
    cr_assert(g.pins == 1 && g.p == (void *)s.mem && g.unpins == 0);
    const size_t D = (size_t)m->c.dim, F = (size_t)m->c.ffn, hd = (size_t)m->c.head_dim;
    const size_t qd = (size_t)m->c.heads * hd, kvd = (size_t)m->c.kv_heads * hd;
    cr_assert(inside(&g, s.x, B * D) && inside(&g, s.h, B * D) && inside(&g, s.q, B * qd) && inside(&g, s.k, B * kvd) &&
                  inside(&g, s.v, B * kvd) && inside(&g, s.a, B * (qd > D ? qd : D)) && inside(&g, s.g, B * F) &&
                  inside(&g, s.u, B * F),
              "every buffer that the products read or write is pinned");
    float *z = malloc(sizeof(float) * N * V);
    cr_assert_eq(mpq_llm_forward(m, &s, tok, N, 0, z, 0), MPQ_OK);
    cr_assert(!memcmp(z, want, sizeof(float) * N * V), "the backend's products give the CPU's logits");
    mpq_llm_state_free(&s);
    cr_assert(g.pins == 1 && g.unpins == 1 && g.unpinned == g.p, "free unpins what init pinned, once");
    /* several sequences and a work state: each pinned once and unpinned once */
    mpq_llm_state seq[S], work, *sp[S];
    g = (pin_log){0};
    cr_assert_eq(mpq_llm_state_init(m, 4, S, &work), MPQ_OK);
    for (int i = 0; i < S; i++) {
        cr_assert_eq(mpq_llm_state_init(m, 4, 1, &seq[i]), MPQ_OK);
        sp[i] = &seq[i];
    }
    cr_assert_eq(g.pins, S + 1);
    cr_assert_eq(mpq_llm_decode(m, sp, S, tok, 0, &work, z), MPQ_OK);
    for (int i = 0; i < S; i++) mpq_llm_state_free(&seq[i]);
    void *wm = work.mem;
    mpq_llm_state_free(&work);
    cr_assert(g.pins == S + 1 && g.unpins == S + 1 && g.unpinned == wm);
    { /* a prompt in one piece of 400 x 48 floats a row: its per-token steps on the state's threads */
        enum { NP = 400 };
        int32_t *tp = malloc(sizeof(int32_t) * NP);
        random_tokens(&r, tp, NP, tm.v->n);
        float *zb = logits_of(m, tp, NP, NP, 0);
        cr_assert_eq(mpq_llm_use_backend(m, NULL), MPQ_OK);
        float *zc = logits_of(m, tp, NP, NP, 0);
        cr_assert(!memcmp(zb, zc, sizeof(float) * NP * V), "a long piece through the backend: the CPU's logits");
        cr_assert_eq(mpq_llm_use_backend(m, &be), MPQ_OK);
        free(tp), free(zb), free(zc);
    }
    /* a pin that fails: the state is made unpinned, gives the same logits, and free unpins nothing */
    g = (pin_log){0};
    g.fail = 1;
    cr_assert_eq(mpq_llm_state_init(m, N, B, &s), MPQ_OK);
    cr_assert(g.pins == 1 && !s.unpin);
    memset(z, 0, sizeof(float) * N * V);
    cr_assert_eq(mpq_llm_forward(m, &s, tok, N, 0, z, 0), MPQ_OK);
    cr_assert(!memcmp(z, want, sizeof(float) * N * V));
    mpq_llm_state_free(&s);
    cr_assert_eq(g.unpins, 0);
    /* back on the CPU: nothing pinned */
    cr_assert_eq(mpq_llm_use_backend(m, NULL), MPQ_OK);
    g = (pin_log){0};
    cr_assert_eq(mpq_llm_state_init(m, N, B, &s), MPQ_OK);
    mpq_llm_state_free(&s);
    cr_assert(g.pins == 0 && g.unpins == 0);
    free(z), free(want);
    mpq_llm_free(m);
    tl_free(&tm);
}

/* The CPU backend's functions, with a gemv_n that records its calls and
   makes them as n calls of the CPU backend's gemv (that backend's ctx is
   NULL: it is not passed on). */
typedef struct many_log {
    mpq_status (*gemv)(void *ctx, void *handle, const float *x, float *y, int batch, const mpq_gemv_opts *opts);
    int calls, maps[4], fail; /* maps[n]: calls of n maps */
} many_log;

static mpq_status log_gemv_n(void *ctx, int n, void *const *handles, const float *x, float *const *y, int batch,
                             const mpq_gemv_opts *opts)
{
    many_log *g = (many_log *)ctx;
    g->calls++;
    if (n >= 1 && n <= 3) g->maps[n]++;
    if (g->fail) return MPQ_ERR_DEVICE;
    for (int k = 0; k < n; k++) {
        const mpq_status st = g->gemv(NULL, handles[k], x, y[k], batch, opts);
        if (st != MPQ_OK) return st;
    }
    return MPQ_OK;
}

Test(model, products_of_one_input_go_to_the_backend_in_one_call, .init = make_tmpdir, .fini = remove_tmpdir)
{
    for (int bias = 0; bias < 2; bias++) {
        tl_model tm;
        shape(&tm, bias, 0, bias); /* with biases: q, k and v's added after the call */
        char hf[600], gguf[600];
        paths(hf, gguf);
        tl_make(&tm, 61 + bias);
        tl_write_hf(&tm, hf, MPQ_DT_F32);
        mpq_llm *m = load(hf);
        pack_all(m, 3);
        enum { N = 11, B = 4, S = 3 };
        synth_rng r = {62};
        int32_t tok[N];
        random_tokens(&r, tok, N, tm.v->n);
        const size_t V = (size_t)m->c.vocab;
        float *want = logits_of(m, tok, N, B, 0), *z = malloc(sizeof(float) * N * V);
        mpq_backend be;
        mpq_backend_cpu(&be);
        cr_assert_null(be.gemv_n, "the CPU backend copies nothing: it has no gemv_n");
        many_log g = {be.gemv, 0, {0}, 0};
        be.ctx = &g, be.gemv_n = log_gemv_n;
        cr_assert_eq(mpq_llm_use_backend(m, &be), MPQ_OK);
        float *got = logits_of(m, tok, N, B, 0);
        cr_assert(!memcmp(got, want, sizeof(float) * N * V), "bias %d: the CPU's logits", bias);
        const int pieces = (N + B - 1) / B, L = m->c.layers;
        cr_assert(g.maps[3] == pieces * L && g.maps[2] == pieces * L && g.maps[1] == 0 && g.calls == 2 * pieces * L,
                  "q, k, v in one call and gate, up in one, per layer and piece: %d %d %d", g.maps[1], g.maps[2],
                  g.maps[3]);
        /* several sequences at once */
        mpq_llm_state seq[S], work, *sp[S];
        cr_assert_eq(mpq_llm_state_init(m, 4, S, &work), MPQ_OK);
        for (int i = 0; i < S; i++) {
            cr_assert_eq(mpq_llm_state_init(m, 4, 1, &seq[i]), MPQ_OK);
            sp[i] = &seq[i];
        }
        g.calls = 0;
        cr_assert_eq(mpq_llm_decode(m, sp, S, tok, 0, &work, z), MPQ_OK);
        cr_assert_eq(g.calls, 2 * L);
        /* a failing call fails the step */
        g.fail = 1;
        cr_assert_eq(mpq_llm_decode(m, sp, S, tok, 0, &work, z), MPQ_ERR_DEVICE);
        for (int i = 0; i < S; i++) mpq_llm_state_free(&seq[i]);
        mpq_llm_state_free(&work);
        free(want), free(got), free(z);
        mpq_llm_free(m);
        tl_free(&tm);
    }
}

Test(model, perplexity_as_llama_perplexity_computes_it, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 1, 0);
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(&tm, 51);
    tl_write_gguf(&tm, gguf);
    mpq_llm *m = load(gguf);
    enum { CTX = 16, N = 3 * CTX + 5 };
    int32_t tok[N];
    synth_rng r = {4};
    random_tokens(&r, tok, N, tm.v->n);
    long count;
    double want_err;
    const double want = ref_ppl(&tm, tok, N, CTX, -1, &count, &want_err);
    mpq_ppl_opts o = {0};
    o.ctx = CTX, o.batch = 5;
    mpq_ppl_result res;
    cr_assert_eq(mpq_llm_perplexity(m, tok, N, &o, &res), MPQ_OK);
    cr_assert_eq(res.count, count);
    cr_assert_eq(res.count, 3 * (CTX - 1 - CTX / 2));
    cr_assert_eq(res.chunks, 3);
    cr_assert(fabs(res.ppl / want - 1) < 1e-5, "ppl %.9g, the reference %.9g", res.ppl, want);
    cr_assert(fabs(res.ppl_err / want_err - 1) < 1e-3, "uncertainty %.9g, the reference %.9g", res.ppl_err, want_err);
    o.chunks = 2;
    cr_assert_eq(mpq_llm_perplexity(m, tok, N, &o, &res), MPQ_OK);
    cr_assert_eq(res.chunks, 2);
    cr_assert_eq(mpq_llm_perplexity(m, tok, CTX - 1, &o, &res), MPQ_ERR_SIZE, "fewer tokens than a chunk");
    /* with BOS: the first token of every chunk becomes BOS */
    char hf_dir[600];
    snprintf(hf_dir, sizeof hf_dir, "%s/hf", tmpdir);
    tl_write_hf(&tm, hf_dir, MPQ_DT_F32);
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", hf_dir);
    tl_spit(p, "{\"add_bos_token\": true, \"bos_token\": \"<|endoftext|>\"}");
    mpq_llm *mb = load(hf_dir);
    cr_assert(mpq_tokenizer_adds_bos(mb->tok));
    const double want_bos = ref_ppl(&tm, tok, N, CTX, mpq_tokenizer_bos(mb->tok), &count, NULL);
    o.chunks = 0;
    cr_assert_eq(mpq_llm_perplexity(mb, tok, N, &o, &res), MPQ_OK);
    cr_assert(fabs(res.ppl / want_bos - 1) < 1e-5, "with BOS: %.9g, the reference %.9g", res.ppl, want_bos);
    mpq_llm_free(mb);
    /* with a PMPD schedule: the same as running the second half token by
       token at the schedule's levels */
    pack_all(m, 4);
    mpq_pmpd_schedule sc = {0};
    sc.prefill_skip = 0, sc.nlevels = 2, sc.skip[0] = 1, sc.skip[1] = 2, sc.start[1] = 3;
    o.schedule = &sc;
    cr_assert_eq(mpq_llm_perplexity(m, tok, N, &o, &res), MPQ_OK);
    double nll = 0;
    long cnt = 0;
    mpq_llm_state s;
    cr_assert_eq(mpq_llm_state_init(m, CTX, 4, &s), MPQ_OK);
    float z[320];
    for (int c = 0; c < 3; c++) {
        mpq_llm_state_reset(&s);
        const int32_t *ch = tok + c * CTX;
        cr_assert_eq(mpq_llm_forward(m, &s, ch, CTX / 2, 0, NULL, CTX / 2), MPQ_OK);
        for (int t = CTX / 2; t < CTX - 1; t++) {
            cr_assert_eq(mpq_llm_forward(m, &s, &ch[t], 1, mpq_pmpd_skip_at(&sc, t - CTX / 2), z, 0), MPQ_OK);
            double mx = z[0], sum = 0;
            for (int v = 1; v < 320; v++) mx = fmax(mx, z[v]);
            for (int v = 0; v < 320; v++) sum += exp(z[v] - mx);
            nll += log(sum) + mx - z[ch[t + 1]], cnt++;
        }
    }
    mpq_llm_state_free(&s);
    cr_assert_eq(res.count, cnt);
    cr_assert(fabs(res.ppl / exp(nll / cnt) - 1) < 1e-6, "scheduled %.9g, token by token %.9g", res.ppl,
              exp(nll / cnt));
    sc.skip[1] = 0; /* not increasing */
    cr_assert_eq(mpq_llm_perplexity(m, tok, N, &o, &res), MPQ_ERR_ARG);
    mpq_llm_free(m);
    tl_free(&tm);
}

/* ---- KL divergence ---------------------------------------------------------------------- */

/* softmax(z) in double */
static void softmax64(const float *z, int V, double *p)
{
    double mx = z[0], s = 0;
    for (int v = 1; v < V; v++) mx = fmax(mx, z[v]);
    for (int v = 0; v < V; v++) s += (p[v] = exp((double)z[v] - mx));
    for (int v = 0; v < V; v++) p[v] /= s;
}

typedef struct kl_ref64 {
    double *kld; /* per position */
    long n, same;
    double dp, dp2, dpa;
} kl_ref64;

/* The KL divergence of q's distributions from p's on the scored positions,
   written the simple way in double: the full distributions (top 0), or
   coarsened to p's `top` most probable tokens (by logit, then lower id)
   and one outcome for all the others. */
static void kl_reference(const mpq_llm *p, const mpq_llm *q, const int32_t *tok, int ctx, int chunks, int top,
                         kl_ref64 *out)
{
    const int V = p->c.vocab, first = ctx / 2;
    out->kld = malloc(sizeof(double) * (size_t)chunks * ctx);
    out->n = 0, out->same = 0, out->dp = out->dp2 = out->dpa = 0;
    double *P = malloc(sizeof(double) * V), *Q = malloc(sizeof(double) * V);
    int *in = malloc(sizeof(int) * V);
    for (int c = 0; c < chunks; c++) {
        float *zp = logits_of(p, tok + (size_t)c * ctx, ctx, 4, 0),
              *zq = logits_of(q, tok + (size_t)c * ctx, ctx, 4, 0);
        for (int i = first; i < ctx - 1; i++) {
            const float *a = zp + (size_t)i * V, *b = zq + (size_t)i * V;
            softmax64(a, V, P), softmax64(b, V, Q);
            double kl = 0;
            if (!top) {
                for (int v = 0; v < V; v++) kl += P[v] * (log(P[v]) - log(Q[v]));
            } else {
                for (int v = 0; v < V; v++) in[v] = 0;
                double pr = 1, qr = 1;
                for (int k = 0; k < top; k++) { /* the k-th most probable of p, by selection */
                    int best = -1;
                    for (int v = 0; v < V; v++)
                        if (!in[v] && (best < 0 || a[v] > a[best])) best = v;
                    in[best] = 1;
                    kl += P[best] * (log(P[best]) - log(Q[best]));
                    pr -= P[best], qr -= Q[best];
                }
                if (pr > 0) kl += pr * (log(pr) - log(qr));
            }
            int ta = 0, tb = 0;
            for (int v = 1; v < V; v++) ta = a[v] > a[ta] ? v : ta, tb = b[v] > b[tb] ? v : tb;
            const int next = tok[(size_t)c * ctx + i + 1];
            const double dp = Q[next] - P[next];
            out->kld[out->n++] = kl;
            out->same += ta == tb, out->dp += dp, out->dp2 += dp * dp, out->dpa += fabs(dp);
        }
        free(zp), free(zq);
    }
    free(P), free(Q), free(in);
}

static int cmp64(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void kl_agrees(const mpq_kl_result *r, kl_ref64 *R, double tol, const char *what)
{
    cr_assert_eq(r->count, R->n, "%s: positions", what);
    double s = 0;
    for (long i = 0; i < R->n; i++) s += R->kld[i];
    const double mean = s / R->n;
    qsort(R->kld, (size_t)R->n, sizeof(double), cmp64);
    const double med = 0.5 * (R->kld[(R->n - 1) / 2] + R->kld[R->n / 2]); /* n even or odd */
    cr_assert(fabs(r->kld - mean) <= tol * mean, "%s: mean KLD %.9g, the reference %.9g", what, r->kld, mean);
    cr_assert(fabs(r->median - med) <= tol * mean, "%s: median %.9g, the reference %.9g", what, r->median, med);
    cr_assert(fabs(r->max - R->kld[R->n - 1]) <= tol * mean, "%s: max %.9g, the reference %.9g", what, r->max,
              R->kld[R->n - 1]);
    cr_assert(r->p90 >= r->median && r->p99 >= r->p90 && r->max >= r->p99, "%s: percentiles in order", what);
    cr_assert(fabs(r->same_top - (double)R->same / R->n) < 1e-12, "%s: same top %.6f, the reference %.6f", what,
              r->same_top, (double)R->same / R->n);
    cr_assert(fabs(r->dp_mean - R->dp / R->n) < 1e-6 && fabs(r->dp_rms - sqrt(R->dp2 / R->n)) < 1e-6 &&
                  fabs(r->dp_abs - R->dpa / R->n) < 1e-6,
              "%s: Delta p", what);
    cr_log_info("%s: KLD %.6f +/- %.6f (reference %.6f), same top %.4f", what, r->kld, r->kld_err, mean, r->same_top);
}

Test(model, kl_divergence_against_a_float64_computation, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 1, 0);
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(&tm, 61);
    tl_write_gguf(&tm, gguf);
    mpq_llm *m = load(gguf), *q = load(gguf);
    pack_all(q, 3);
    enum { CTX = 20, CHUNKS = 3, N = CHUNKS * CTX + 3 };
    int32_t tok[N];
    synth_rng r = {8};
    random_tokens(&r, tok, N, tm.v->n);
    mpq_ppl_opts o = {0};
    o.ctx = CTX, o.batch = 6;
    mpq_ppl_result res;
    /* the reference's record: every token, and the 16 most probable */
    mpq_kl_base full, top16;
    o.kl_record = &full, o.kl_top = 100000;
    cr_assert_eq(mpq_llm_perplexity(m, tok, N, &o, &res), MPQ_OK);
    cr_assert_eq(full.top, 320, "top is at most the vocabulary");
    cr_assert_eq(full.positions, CHUNKS * (CTX - 1 - CTX / 2));
    const double ppl = res.ppl;
    o.kl_record = &top16, o.kl_top = 16;
    cr_assert_eq(mpq_llm_perplexity(m, tok, N, &o, &res), MPQ_OK);
    cr_assert_eq(res.ppl, ppl, "recording changes nothing else");
    o.kl_record = NULL;
    /* the reference against itself: exactly 0 */
    o.kl_ref = &top16;
    cr_assert_eq(mpq_llm_perplexity(m, tok, N, &o, &res), MPQ_OK);
    cr_assert(res.kl.kld == 0 && res.kl.max == 0 && res.kl.same_top == 1 && res.kl.dp_abs == 0,
              "itself: KLD %g, max %g, same top %g, |dp| %g", res.kl.kld, res.kl.max, res.kl.same_top, res.kl.dp_abs);
    cr_assert_eq(res.kl.count, top16.positions);
    /* the 3-bit model against both records, and against float64 */
    kl_ref64 R;
    o.kl_ref = &full;
    cr_assert_eq(mpq_llm_perplexity(q, tok, N, &o, &res), MPQ_OK);
    const double kl_full = res.kl.kld;
    cr_assert(kl_full > 1e-3, "the 3-bit model differs (KLD %g)", kl_full);
    kl_reference(m, q, tok, CTX, CHUNKS, 0, &R);
    kl_agrees(&res.kl, &R, 1e-4, "full vocabulary");
    free(R.kld);
    o.kl_ref = &top16;
    cr_assert_eq(mpq_llm_perplexity(q, tok, N, &o, &res), MPQ_OK);
    kl_reference(m, q, tok, CTX, CHUNKS, 16, &R);
    kl_agrees(&res.kl, &R, 1e-4, "top 16 and the rest");
    free(R.kld);
    cr_assert(res.kl.kld <= kl_full * (1 + 1e-9), "coarsened %g is at most the full %g", res.kl.kld, kl_full);
    /* through a file: the same record, the same figures */
    char path[700];
    snprintf(path, sizeof path, "%s/base.klb", tmpdir);
    mpq_io_err e;
    cr_assert_eq(mpq_kl_base_write(&top16, "{\"model\": \"m.gguf\"}", path, &e), MPQ_OK, "%s", e.msg);
    corpus_save(path, "klb");
    mpq_kl_base back;
    cr_assert_eq(mpq_kl_base_read(path, &back, &e), MPQ_OK, "%s", e.msg);
    cr_assert(back.vocab == 320 && back.ctx == CTX && back.chunks == CHUNKS && back.top == 16 &&
              back.positions == top16.positions && back.tokens_hash == top16.tokens_hash &&
              back.vocab_hash == top16.vocab_hash);
    const size_t PK = (size_t)back.positions * 16;
    cr_assert(!memcmp(back.ids, top16.ids, 4 * PK) && !memcmp(back.logp, top16.logp, 4 * PK) &&
              !memcmp(back.rest, top16.rest, 4 * (size_t)back.positions) &&
              !memcmp(back.next_logp, top16.next_logp, 4 * (size_t)back.positions));
    mpq_ppl_result res2;
    o.kl_ref = &back;
    cr_assert_eq(mpq_llm_perplexity(q, tok, N, &o, &res2), MPQ_OK);
    cr_assert(!memcmp(&res2.kl, &res.kl, sizeof res.kl));
    /* another run: each refused with a reason */
    struct {
        int ctx, chunks;
        int32_t tok0;
        const char *why;
    } other[] = {{CTX + 2, 0, -1, "chunks of"}, {CTX, 2, -1, "over 3 chunks"}, {CTX, 0, 5, "another text"}};
    for (int k = 0; k < 3; k++) {
        int32_t t2[N];
        memcpy(t2, tok, sizeof t2);
        if (other[k].tok0 >= 0) t2[CTX + 1] = (tok[CTX + 1] + other[k].tok0) % tm.v->n;
        e.msg[0] = 0;
        cr_assert_eq(mpq_kl_base_check(&back, q, t2, N, other[k].ctx, other[k].chunks, path, &e), MPQ_ERR_ARG);
        cr_assert(strstr(e.msg, other[k].why) && strstr(e.msg, path), "%s", e.msg);
        o.ctx = other[k].ctx, o.chunks = other[k].chunks;
        cr_assert_eq(mpq_llm_perplexity(q, t2, N, &o, &res2), MPQ_ERR_ARG);
    }
    o.ctx = CTX, o.chunks = 0;
    cr_assert_eq(mpq_kl_base_check(&back, q, tok, N, CTX, 0, path, &e), MPQ_OK);
    /* another tokenizer: the same weights with BOS added */
    char hf_dir[600], p[700];
    snprintf(hf_dir, sizeof hf_dir, "%s/hf", tmpdir);
    tl_write_hf(&tm, hf_dir, MPQ_DT_F32);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", hf_dir);
    tl_spit(p, "{\"add_bos_token\": true, \"bos_token\": \"<|endoftext|>\"}");
    mpq_llm *mb = load(hf_dir);
    cr_assert_eq(mpq_kl_base_check(&back, mb, tok, N, CTX, 0, path, &e), MPQ_ERR_ARG);
    cr_assert(strstr(e.msg, "tokenizer"), "%s", e.msg);
    mpq_llm_free(mb);
    /* hostile files: each value rule, and a truncated file */
    for (int k = 0; k < 5; k++) {
        mpq_kl_base bad = back;
        bad.ids = malloc(4 * PK), bad.logp = malloc(4 * PK);
        memcpy(bad.ids, back.ids, 4 * PK), memcpy(bad.logp, back.logp, 4 * PK);
        float rest1 = back.rest[1];
        if (k == 0) bad.ids[5] = 320;                 /* out of the vocabulary */
        if (k == 1) bad.ids[17] = bad.ids[16];        /* repeated */
        if (k == 2) bad.logp[3] = bad.logp[2] + 0.5f; /* increasing */
        if (k == 3) back.rest[1] = 1.5f;              /* a probability above 1 */
        if (k == 4) bad.logp[0] = -1e-3f;             /* sums past 1 */
        char bp[720];
        snprintf(bp, sizeof bp, "%s/bad%d.klb", tmpdir, k);
        cr_assert_eq(mpq_kl_base_write(&bad, NULL, bp, &e), MPQ_OK);
        back.rest[1] = rest1;
        corpus_save(bp, "klb");
        mpq_kl_base x;
        e.msg[0] = 0;
        cr_assert_eq(mpq_kl_base_read(bp, &x, &e), MPQ_ERR_FORMAT, "hostile file %d read", k);
        cr_assert(strstr(e.msg, bp), "%s", e.msg);
        free(bad.ids), free(bad.logp);
    }
    FILE *f = fopen(path, "rb");
    char buf[4096];
    const size_t got = fread(buf, 1, sizeof buf, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/cut.klb", tmpdir);
    f = fopen(p, "wb");
    fwrite(buf, 1, got / 2, f);
    fclose(f);
    corpus_save(p, "klb");
    mpq_kl_base x;
    e.msg[0] = 0;
    cr_assert_neq(mpq_kl_base_read(p, &x, &e), MPQ_OK);
    cr_assert(e.msg[0]);
    mpq_kl_base_free(&back), mpq_kl_base_free(&full), mpq_kl_base_free(&top16);
    mpq_kl_base_free(NULL);
    mpq_llm_free(m), mpq_llm_free(q);
    tl_free(&tm);
}

/* ---- generation ------------------------------------------------------------------------ */

typedef struct seen {
    int32_t tok[64];
    int n, stop_at;
} seen;

static int on_token(void *user, int32_t t)
{
    seen *s = user;
    s->tok[s->n++] = t;
    return s->n == s->stop_at;
}

Test(model, generation_greedy_sampled_and_with_schedules, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 0, 0);
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(&tm, 61);
    tl_write_gguf(&tm, gguf);
    mpq_llm *m = load(gguf);
    /* no token ends the generation here: the vocabulary's end tokens are
       never the argmax of these random weights, which the test checks */
    const int32_t prompt[5] = {3, 77, 120, 9, 200};
    mpq_llm_state s;
    cr_assert_eq(mpq_llm_state_init(m, 64, 8, &s), MPQ_OK);
    int32_t out[40];
    mpq_gen_opts o = {0};
    mpq_gen_result res;
    cr_assert_eq(mpq_llm_generate(m, &s, prompt, 5, &o, out, 20, &res), MPQ_OK);
    cr_assert_eq(res.tokens, 20);
    cr_assert(!res.ended);
    cr_assert_eq(res.prompt_tokens, 5);
    cr_assert_eq(res.tokens_at_skip[0], 19, "the first token comes from the prompt's pass");
    /* greedy = the argmax of the reference at every step */
    int32_t seq[25];
    memcpy(seq, prompt, sizeof prompt);
    for (int t = 0; t < 20; t++) seq[5 + t] = out[t];
    double *ref = malloc(sizeof(double) * 25 * 320);
    tl_reference(&tm, NULL, seq, 24, ref);
    for (int t = 0; t < 20; t++) {
        const double *z = ref + (size_t)(4 + t) * 320;
        int best = 0;
        for (int v = 1; v < 320; v++) best = z[v] > z[best] ? v : best;
        cr_assert_eq(out[t], best, "step %d", t);
        cr_assert(!mpq_token_is_end(m->tok, out[t]));
    }
    free(ref);
    /* sampling: the seed decides; on_token sees every token and can stop */
    o.temperature = 0.8f, o.top_p = 0.9f, o.seed = 42;
    int32_t a[20], b[20];
    cr_assert_eq(mpq_llm_generate(m, &s, prompt, 5, &o, a, 20, &res), MPQ_OK);
    seen sn = {{0}, 0, 7};
    o.on_token = on_token, o.user = &sn;
    cr_assert_eq(mpq_llm_generate(m, &s, prompt, 5, &o, b, 20, &res), MPQ_OK);
    cr_assert_eq(res.tokens, 7);
    cr_assert(!memcmp(a, b, 7 * sizeof(int32_t)) && !memcmp(sn.tok, a, 7 * sizeof(int32_t)));
    o.on_token = NULL;
    /* PMPD: the passes at the schedule's levels, as a hand-run loop does them */
    pack_all(m, 4);
    mpq_pmpd_schedule sc = {0};
    sc.prefill_skip = 0, sc.nlevels = 3, sc.skip[0] = 0, sc.skip[1] = 1, sc.skip[2] = 2, sc.start[1] = 4,
    sc.start[2] = 10;
    memset(&o, 0, sizeof o);
    o.schedule = &sc;
    cr_assert_eq(mpq_llm_generate(m, &s, prompt, 5, &o, out, 16, &res), MPQ_OK);
    cr_assert(res.tokens_at_skip[0] == 4 && res.tokens_at_skip[1] == 6 && res.tokens_at_skip[2] == 5,
              "passes per level: %d %d %d", res.tokens_at_skip[0], res.tokens_at_skip[1], res.tokens_at_skip[2]);
    mpq_llm_state h;
    cr_assert_eq(mpq_llm_state_init(m, 64, 8, &h), MPQ_OK);
    float z[320];
    cr_assert_eq(mpq_llm_forward(m, &h, prompt, 5, 0, z, 4), MPQ_OK);
    for (int t = 0; t < 16; t++) {
        int32_t best = 0;
        for (int v = 1; v < 320; v++) best = z[v] > z[best] ? v : best;
        cr_assert_eq(out[t], best, "scheduled step %d", t);
        if (t < 15) cr_assert_eq(mpq_llm_forward(m, &h, &best, 1, mpq_pmpd_skip_at(&sc, t), z, 0), MPQ_OK);
    }
    mpq_llm_state_free(&h);
    /* a prompt that does not fit */
    int32_t longp[64] = {0};
    cr_assert_eq(mpq_llm_generate(m, &s, longp, 64, &o, out, 4, &res), MPQ_ERR_RANGE);
    mpq_llm_state_free(&s);
    mpq_llm_free(m);
    tl_free(&tm);
}

/* ---- PMPD's learned scheduler ------------------------------------------------------------ */

/* mean -log softmax(z)[target], in float64 */
static double nll_of(const float *z, int V, int target)
{
    double mx = z[0], sum = 0;
    for (int v = 1; v < V; v++) mx = fmax(mx, z[v]);
    for (int v = 0; v < V; v++) sum += exp(z[v] - mx);
    return log(sum) + mx - z[target];
}

/* A learned scheduler for model m with random parameters (so that the
   attention is far from uniform and the classes differ). */
static void random_scheduler(const mpq_llm *m, mpq_pmpd_learned *n, uint64_t seed)
{
    const int kvd = m->c.kv_heads * m->c.head_dim;
    cr_assert_eq(mpq_pmpd_learned_init(n, kvd, kvd, 6, 4, seed), MPQ_OK);
    synth_rng r = {seed};
    for (int j = 0; j < kvd; j++) n->q[j] = 2.0f * synth_gauss(&r);
    for (int c = 0; c < 4; c++) n->b2[c] = synth_gauss(&r);
    n->layer = m->c.layers - 1, n->prefill_skip = 0, n->skip_high = 1, n->skip_low = 2, n->length = 8;
}

Test(model, learned_scheduler_generation_samples_and_file, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 0, 0);
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(&tm, 67);
    tl_write_gguf(&tm, gguf);
    mpq_llm *m = load(gguf);
    pack_all(m, 4);
    const int kvd = m->c.kv_heads * m->c.head_dim, V = m->c.vocab, P = 6;
    mpq_pmpd_learned n;
    random_scheduler(m, &n, 91);
    const int32_t prompt[6] = {3, 77, 120, 9, 200, 41};
    /* generation: the class the network gives for the cache the prompt
       leaves, computed here from a cache filled by hand, then that schedule */
    mpq_llm_state s, h;
    cr_assert_eq(mpq_llm_state_init(m, 64, 8, &s), MPQ_OK);
    cr_assert_eq(mpq_llm_state_init(m, 64, 8, &h), MPQ_OK);
    cr_assert_eq(mpq_llm_forward(m, &h, prompt, P, 0, NULL, P), MPQ_OK);
    const size_t at = (size_t)n.layer * h.ctx * kvd;
    mpq_pmpd_schedule want;
    int cls = -1;
    cr_assert_eq(mpq_pmpd_learned_predict(&n, h.kc + at, h.vc + at, P, &want, &cls), MPQ_OK);
    mpq_gen_opts o = {0};
    o.learned = &n;
    mpq_gen_result res;
    int32_t out[20], out2[20];
    cr_assert_eq(mpq_llm_generate(m, &s, prompt, P, &o, out, 20, &res), MPQ_OK);
    cr_assert_eq(res.learned_class, cls);
    cr_assert(!memcmp(&res.schedule, &want, sizeof want));
    const long h1 = want.start[1];
    cr_assert_eq(res.tokens_at_skip[1], h1 < 19 ? h1 : 19);
    cr_assert_eq(res.tokens_at_skip[2], 19 - (h1 < 19 ? h1 : 19));
    o.learned = NULL, o.schedule = &want;
    mpq_gen_result res2;
    cr_assert_eq(mpq_llm_generate(m, &s, prompt, P, &o, out2, 20, &res2), MPQ_OK);
    cr_assert(!memcmp(out, out2, sizeof out));
    cr_assert_eq(res2.learned_class, -1);
    o.learned = &n; /* both: an error */
    cr_assert_eq(mpq_llm_generate(m, &s, prompt, P, &o, out2, 20, &res2), MPQ_ERR_ARG);
    o.schedule = NULL, n.layer = m->c.layers;
    cr_assert_eq(mpq_llm_generate(m, &s, prompt, P, &o, out2, 20, &res2), MPQ_ERR_ARG);
    n.layer = m->c.layers - 1;

    /* training samples: every class's mean NLL as a token-by-token run of
       its schedule computes it, and the prompt's cache */
    enum { W = 6 + 8 + 1 };
    int32_t win[W];
    synth_rng r = {5};
    random_tokens(&r, win, W, tm.v->n);
    double nll[4];
    float *K = malloc(sizeof(float) * P * kvd), *Vc = malloc(sizeof(float) * P * kvd);
    cr_assert_eq(mpq_llm_pmpd_sample(m, &s, win, P, &n, nll, K, Vc), MPQ_OK);
    mpq_llm_state_reset(&h);
    cr_assert_eq(mpq_llm_forward(m, &h, win, P, 0, NULL, P), MPQ_OK);
    for (int i = 0; i < P * kvd; i++) {
        cr_assert_float_eq(K[i], h.kc[at + (size_t)i], 1e-6f * (1 + fabsf(K[i])));
        cr_assert_float_eq(Vc[i], h.vc[at + (size_t)i], 1e-6f * (1 + fabsf(Vc[i])));
        /* and the prompt's positions of layer 0 as the prompt left them */
        cr_assert_float_eq(s.kc[i], h.kc[i], 1e-6f * (1 + fabsf(h.kc[i])));
        cr_assert_float_eq(s.vc[i], h.vc[i], 1e-6f * (1 + fabsf(h.vc[i])));
    }
    float *z = malloc(sizeof(float) * V);
    for (int c = 0; c < 4; c++) {
        mpq_pmpd_schedule sc;
        cr_assert_eq(mpq_pmpd_learned_class_schedule(&n, c, &sc), MPQ_OK);
        mpq_llm_state_reset(&h);
        cr_assert_eq(mpq_llm_forward(m, &h, win, P, 0, NULL, P), MPQ_OK);
        double sum = 0;
        for (int t = 0; t < 8; t++) {
            cr_assert_eq(mpq_llm_forward(m, &h, &win[P + t], 1, mpq_pmpd_skip_at(&sc, t), z, 0), MPQ_OK);
            sum += nll_of(z, V, win[P + t + 1]);
        }
        cr_assert_float_eq(nll[c], sum / 8, 1e-5 * (sum / 8), "class %d: %.9g, token by token %.9g", c, nll[c],
                           sum / 8);
    }
    cr_assert(nll[0] != nll[3], "the classes must differ for this test to mean anything");
    cr_assert_eq(mpq_llm_pmpd_sample(m, &s, win, 60, &n, nll, NULL, NULL), MPQ_ERR_SIZE, "beyond the cache");
    win[9] = V;
    cr_assert_eq(mpq_llm_pmpd_sample(m, &s, win, P, &n, nll, NULL, NULL), MPQ_ERR_ARG, "a token past the vocabulary");
    free(K), free(Vc), free(z);

    /* the file: back bit for bit; wrong files refused with a reason */
    char path[700], bad[700];
    snprintf(path, sizeof path, "%s/sched.safetensors", tmpdir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", tmpdir);
    mpq_io_err e;
    cr_assert_eq(mpq_pmpd_learned_write(&n, "{\"model\":\"tiny\"}", path, &e), MPQ_OK, "%s", e.msg);
    corpus_save(path, "pmpd");
    mpq_pmpd_learned b;
    cr_assert_eq(mpq_pmpd_learned_read(m, path, &b, &e), MPQ_OK, "%s", e.msg);
    cr_assert(b.dk == n.dk && b.dv == n.dv && b.hidden == n.hidden && b.classes == n.classes);
    cr_assert(b.layer == n.layer && b.prefill_skip == 0 && b.skip_high == 1 && b.skip_low == 2 && b.length == 8);
    const size_t bytes = sizeof(float) * (size_t)(mpq_pmpd_learned_params(&n) + 2 * kvd);
    cr_assert(!memcmp(b.mem, n.mem, bytes));
    mpq_pmpd_learned_free(&b);
    mpq_st_file *f;
    cr_assert_eq(mpq_st_open(path, &f, &e), MPQ_OK);
    cr_assert(strstr(mpq_st_meta(f, "mpq_pmpd_learned"), "\"source\":{\"model\":\"tiny\"}"));
    mpq_st_close(f);
    n.layer = 5; /* a layer the model lacks: fine alone, not for this model */
    cr_assert_eq(mpq_pmpd_learned_write(&n, NULL, bad, &e), MPQ_OK);
    cr_assert_eq(mpq_pmpd_learned_read(NULL, bad, &b, &e), MPQ_OK);
    mpq_pmpd_learned_free(&b);
    memset(&b, 0x5a, sizeof b);
    mpq_pmpd_learned keep = b;
    cr_assert_eq(mpq_pmpd_learned_read(m, bad, &b, &e), MPQ_ERR_SIZE);
    cr_assert(strstr(e.msg, "bad.safetensors") && strstr(e.msg, "layer 5"), "%s", e.msg);
    cr_assert(!memcmp(&b, &keep, sizeof b), "a failed read leaves the output alone");
    n.layer = 1, n.b1[2] = NAN;
    cr_assert_eq(mpq_pmpd_learned_write(&n, NULL, bad, &e), MPQ_ERR_NONFINITE);
    n.b1[2] = 0;
    /* hand-made files: a tensor missing, a shape off, inv_sd zero, no metadata */
    const uint64_t dq = (uint64_t)kvd, d1[2] = {6, (uint64_t)kvd}, d6 = 6, d2[2] = {4, 6}, d4 = 4;
    float *zeros = calloc((size_t)6 * kvd + 64, sizeof(float));
    for (int v = 0; v < 5; v++) {
        mpq_st_writer *w;
        cr_assert_eq(mpq_st_writer_open(bad, &w, &e), MPQ_OK);
        if (v != 4)
            cr_assert_eq(
                mpq_st_write_meta(w, "mpq_pmpd_learned",
                                  "{\"layer\":1,\"prefill_skip\":0,\"skip_high\":0,\"skip_low\":1,\"length\":9}", &e),
                MPQ_OK);
        const uint64_t wrong = 5;
        cr_assert_eq(mpq_st_write_f32(w, "pmpd.q", MPQ_DT_F32, 1, &dq, zeros, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_f32(w, "pmpd.w1", MPQ_DT_F32, 2, d1, zeros, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_f32(w, "pmpd.b1", MPQ_DT_F32, 1, v == 1 ? &wrong : &d6, zeros, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_f32(w, "pmpd.w2", MPQ_DT_F32, 2, d2, zeros, &e), MPQ_OK);
        if (v != 0) cr_assert_eq(mpq_st_write_f32(w, "pmpd.b2", MPQ_DT_F32, 1, &d4, zeros, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_f32(w, "pmpd.mean", MPQ_DT_F32, 1, &dq, zeros, &e), MPQ_OK);
        float *isd = zeros + (size_t)6 * kvd;
        for (int j = 0; j < 32 && j < kvd; j++) isd[j] = v == 2 ? 0.0f : 1.0f;
        cr_assert_eq(mpq_st_write_f32(w, "pmpd.inv_sd", MPQ_DT_F32, 1, &dq, isd, &e), MPQ_OK);
        cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK);
        const mpq_status st = mpq_pmpd_learned_read(m, bad, &b, &e);
        const mpq_status want_st[5] = {MPQ_ERR_FORMAT, MPQ_ERR_SIZE, MPQ_ERR_NONFINITE, MPQ_OK, MPQ_ERR_FORMAT};
        const char *needle[5] = {"pmpd.b2", "pmpd.b1", "not finite", "", "no mpq_pmpd_learned"};
        cr_assert_eq(st, want_st[v], "file %d: %d (%s)", v, st, e.msg);
        if (st == MPQ_OK)
            mpq_pmpd_learned_free(&b);
        else
            cr_assert(strstr(e.msg, needle[v]) && strstr(e.msg, "bad.safetensors"), "file %d: %s", v, e.msg);
        corpus_save(bad, "pmpd");
    }
    free(zeros);
    mpq_pmpd_learned_free(&n);
    mpq_llm_state_free(&s), mpq_llm_state_free(&h);
    mpq_llm_free(m);
    tl_free(&tm);
}

/* ---- models that are wrong ---------------------------------------------------------------- */

static void expect_load_fails(const char *path, mpq_status want, const char *needle, const char *what)
{
    mpq_llm *m = NULL;
    mpq_io_err e;
    memset(&e, 0, sizeof e);
    const mpq_status st = mpq_llm_load(path, &m, &e);
    cr_assert_eq(st, want, "%s: status %d (%s)", what, st, e.msg);
    cr_assert_null(m);
    cr_assert(strstr(e.msg, needle), "%s: '%s' lacks '%s'", what, e.msg, needle);
}

static void with_config(const char *dir, const char *from, const char *to)
{
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "rb");
    char text[4096];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *at = strstr(text, from);
    cr_assert_not_null(at, "'%s' not in config.json", from);
    char out[4096];
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    tl_spit(p, out);
}

Test(model, wrong_models_are_refused_with_a_reason, .init = make_tmpdir, .fini = remove_tmpdir)
{
    tl_model tm;
    shape(&tm, 0, 0, 0);
    char hf[600], gguf[600];
    paths(hf, gguf);
    tl_make(&tm, 71);
    static const struct {
        const char *from, *to, *needle;
        mpq_status st;
    } cfg[] = {
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4", "not a multiple of 4 key-value heads",
         MPQ_ERR_FORMAT},
        {"\"hidden_size\": 48", "\"hidden_size\": 50", "shape is not", MPQ_ERR_FORMAT},
        {"LlamaForCausalLM", "GPT2LMHeadModel", "architecture 'GPT2LMHeadModel'", MPQ_ERR_UNSUPPORTED},
        {"\"intermediate_size\": 80", "\"intermediate_size\": -1", "intermediate_size", MPQ_ERR_FORMAT},
        {"\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}", "yarn",
         MPQ_ERR_UNSUPPORTED},
        {"\"vocab_size\": 320", "\"vocab_size\": 300", "300", MPQ_ERR_FORMAT},
        {"\"rope_theta\": 10000", "\"rope_theta\": -1", "not positive", MPQ_ERR_FORMAT},
        {"{\"architectures\"", "[\"architectures\"", "not a JSON object", MPQ_ERR_FORMAT},
    };
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        tl_write_hf(&tm, hf, MPQ_DT_F32);
        with_config(hf, cfg[k].from, cfg[k].to);
        expect_load_fails(hf, cfg[k].st, cfg[k].needle, cfg[k].to);
    }
    /* a weight with a NaN, a missing tensor */
    tm.w[1][5][17] = NAN;
    tl_write_hf(&tm, hf, MPQ_DT_F32);
    expect_load_fails(hf, MPQ_ERR_NONFINITE, "model.layers.1.mlp.up_proj.weight': value 17 is NaN", "NaN");
    tm.w[1][5][17] = 0.5f;
    tl_write_gguf(&tm, gguf);
    {
        /* the GGUF with a tensor renamed: one is missing */
        size_t n;
        uint8_t *b = tl_gguf(&tm, &n);
        for (size_t i = 0; i + 15 < n; i++)
            if (!memcmp(b + i, "blk.1.ffn_down.", 15)) {
                b[i + 4] = '7';
                break;
            }
        FILE *f = fopen(gguf, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        expect_load_fails(gguf, MPQ_ERR_FORMAT, "tensor 'blk.1.ffn_down.weight' is missing", "missing tensor");
        /* truncated: every cut fails cleanly */
        for (size_t cut = 0; cut < n; cut += n / 97 + 1) {
            f = fopen(gguf, "wb");
            fwrite(b, 1, cut, f);
            fclose(f);
            mpq_llm *m = NULL;
            mpq_io_err e;
            cr_assert_neq(mpq_llm_load(gguf, &m, &e), MPQ_OK, "a GGUF cut at %zu bytes", cut);
            cr_assert_null(m);
        }
        free(b);
    }
    /* no config, no tokenizer */
    tl_write_hf(&tm, hf, MPQ_DT_F32);
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", hf);
    unlink(p);
    expect_load_fails(hf, MPQ_ERR_FORMAT, "no tokenizer.json", "no tokenizer");
    snprintf(p, sizeof p, "%s/config.json", hf);
    unlink(p);
    expect_load_fails(hf, MPQ_ERR_FORMAT, "no config.json", "no config");
    tl_free(&tm);
    /* a tokenizer with more tokens than the embedding has rows */
    shape(&tm, 0, 0, 0);
    tm.vocab_rows = 300;
    tl_make(&tm, 72);
    tl_write_hf(&tm, hf, MPQ_DT_F32);
    snprintf(p, sizeof p, "%s/tokenizer.json", hf);
    vspecial(tm.v, "<extra>", 1);
    for (int i = 0; i < 30; i++) vspecial(tm.v, "<x>", 1); /* ids past the 300 rows */
    char *j = vjson(tm.v, PRE_SMOLLM, 0);
    tl_spit(p, j);
    free(j);
    expect_load_fails(hf, MPQ_ERR_FORMAT, "tokenizer has", "tokenizer larger than the embedding");
    tl_free(&tm);
}
