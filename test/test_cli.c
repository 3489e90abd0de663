/* The `mpq` tool end to end: a checkpoint of synthetic layers quantized by
   every method through the command line, each packed tensor compared byte
   for byte with the library called directly; the other tensors copied; and
   the exit codes and messages of what goes wrong. The tool's path comes in
   MPQ_CLI (set by meson). */
#define _XOPEN_SOURCE 700
#include "common.h"
#include "mpq_io.h"
#include "progress.h"
#include "tmpdir.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];

static void setup(void) { cr_assert(tc_tmpdir_make(dir, sizeof dir, "cli")); }
static void teardown(void) { tc_tmpdir_remove(dir); }

/* Runs `mpq <args>` with stdout and stderr in files; returns the exit code. */
static int run(const char *args)
{
    const char *cli = getenv("MPQ_CLI");
    cr_assert(cli && *cli, "MPQ_CLI is not set");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && %s %s >out.txt 2>err.txt", dir, cli, args);
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "mpq %s did not exit normally", args);
    return WEXITSTATUS(st);
}

static char *text(const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    cr_assert_not_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* ---- the synthetic checkpoint -------------------------------------------- */

enum { NL = 4, TOKENS = 24 };
static const int shapes[NL][2] = {{48, 96}, {40, 160}, {64, 128}, {33, 72}};
static const mpq_dtype dtypes[NL] = {MPQ_DT_F32, MPQ_DT_F16, MPQ_DT_BF16, MPQ_DT_F32};

static void layer_name(int l, char *s, size_t cap) { snprintf(s, cap, "model.layers.%d.proj.weight", l); }

static void path_of(const char *name, char *p, size_t cap) { snprintf(p, cap, "%s/%s", dir, name); }

static int exists(const char *name)
{
    char p[600];
    path_of(name, p, sizeof p);
    return access(p, F_OK) == 0;
}

/* The mpq_calib metadata of the salience files (NULL: none). */
static const char *salience_meta;

/* model.safetensors, salience.safetensors (per-weight Fisher, per-row
   salience, per-column diag(X^T X) under separate files) and calib. */
static void write_inputs(void)
{
    synth_rng r = {314};
    char p[600], name[64], key[96];
    mpq_io_err e;
    mpq_st_writer *m, *sf, *sm, *sx, *ca, *hs;
    path_of("model.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_writer_open(p, &m, &e), MPQ_OK);
    path_of("fisher.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_writer_open(p, &sf, &e), MPQ_OK);
    path_of("rows.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_writer_open(p, &sm, &e), MPQ_OK);
    path_of("cols.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_writer_open(p, &sx, &e), MPQ_OK);
    path_of("calib.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_writer_open(p, &ca, &e), MPQ_OK);
    path_of("hessian.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_writer_open(p, &hs, &e), MPQ_OK);
    if (salience_meta) {
        cr_assert_eq(mpq_st_write_meta(sf, "mpq_calib", salience_meta, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_meta(sm, "mpq_calib", salience_meta, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_meta(sx, "mpq_calib", salience_meta, &e), MPQ_OK);
    }
    float emb[50 * 32], norm[96];
    synth_weights(&r, emb, 50, 32);
    for (int j = 0; j < 96; j++) norm[j] = 1.0f + 0.01f * (float)j;
    cr_assert_eq(mpq_st_write_f32(m, "model.embed.weight", MPQ_DT_F16, 2, (const uint64_t[]){50, 32}, emb, &e), MPQ_OK);
    for (int l = 0; l < NL; l++) {
        const int rows = shapes[l][0], cols = shapes[l][1];
        const uint64_t sh[2] = {(uint64_t)rows, (uint64_t)cols};
        float *W = malloc(sizeof(float) * rows * cols), *S = malloc(sizeof(float) * rows * cols);
        float *X = malloc(sizeof(float) * TOKENS * cols), *rs = malloc(sizeof(float) * rows);
        float *cs = malloc(sizeof(float) * cols);
        synth_weights(&r, W, rows, cols);
        synth_tokens(&r, X, TOKENS, cols, 1000 + (uint64_t)l);
        for (int k = 0; k < rows * cols; k++) S[k] = W[k] * W[k] * (float)(1.0 + synth_unif(&r));
        for (int i = 0; i < rows; i++) rs[i] = (float)synth_unif(&r) * (l + 1);
        for (int j = 0; j < cols; j++) {
            double h = 0;
            for (int t = 0; t < TOKENS; t++) h += (double)X[t * cols + j] * X[t * cols + j];
            cs[j] = (float)h;
        }
        layer_name(l, name, sizeof name);
        cr_assert_eq(mpq_st_write_f32(m, name, dtypes[l], 2, sh, W, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_f32(sf, name, MPQ_DT_F32, 2, sh, S, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_f32(sm, name, MPQ_DT_F32, 1, sh, rs, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_f32(sx, name, MPQ_DT_F32, 1, sh + 1, cs, &e), MPQ_OK);
        const float ls = 0.25f * (float)(l + 1);
        snprintf(key, sizeof key, "%s.layer_sensitivity", name);
        cr_assert_eq(mpq_st_write_f32(sx, key, MPQ_DT_F32, 0, NULL, &ls, &e), MPQ_OK);
        cr_assert_eq(mpq_st_write_f32(ca, name, MPQ_DT_F32, 2, (const uint64_t[]){TOKENS, (uint64_t)cols}, X, &e),
                     MPQ_OK);
        float *H = malloc(sizeof(float) * cols * cols); /* X^T X, named as mpq calibrate names it */
        for (int i = 0; i < cols; i++)
            for (int j = 0; j < cols; j++) {
                double h = 0;
                for (int t = 0; t < TOKENS; t++) h += (double)X[t * cols + i] * X[t * cols + j];
                H[i * cols + j] = (float)h;
            }
        snprintf(key, sizeof key, "%s.xtx", name);
        const uint64_t hshape[2] = {(uint64_t)cols, (uint64_t)cols};
        cr_assert_eq(mpq_st_write_f32(hs, key, MPQ_DT_F32, 2, hshape, H, &e), MPQ_OK);
        free(W), free(S), free(X), free(rs), free(cs), free(H);
    }
    cr_assert_eq(mpq_st_write_f32(m, "model.norm.weight", MPQ_DT_F32, 1, (const uint64_t[]){96}, norm, &e), MPQ_OK);
    const int64_t step = 1234;
    cr_assert_eq(mpq_st_write(m, "step", MPQ_DT_I64, 0, NULL, &step, 8, &e), MPQ_OK);
    cr_assert_eq(mpq_st_write_meta(m, "format", "pt", &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(m, &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(sf, &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(sm, &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(sx, &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(ca, &e), MPQ_OK);
    cr_assert_eq(mpq_st_writer_close(hs, &e), MPQ_OK);
}

static float *read_f32(const char *file, const char *name, size_t *n)
{
    char p[600];
    path_of(file, p, sizeof p);
    mpq_io_err e;
    mpq_st_file *f;
    cr_assert_eq(mpq_st_open(p, &f, &e), MPQ_OK, "%s", e.msg);
    const mpq_st_tensor *t = mpq_st_find(f, name);
    cr_assert_not_null(t, "%s in %s", name, file);
    float *v = malloc(sizeof(float) * (size_t)t->numel + 4);
    cr_assert_eq(mpq_st_read_f32(f, t, v, (size_t)t->numel, &e), MPQ_OK);
    if (n) *n = (size_t)t->numel;
    mpq_st_close(f);
    return v;
}

/* How direct() quantizes: GPTQ (with act-order) instead of round-to-nearest;
   SFMP's reordering (both, unless act-order: rows). */
static int direct_gptq, direct_act_order;
static int direct_rotate; /* 0, or 1 + the seed of --rotate */

/* The X^T X of layer l (what hessian.safetensors holds). */
static float *hessian_of(int l)
{
    char name[64], key[96];
    layer_name(l, name, sizeof name);
    snprintf(key, sizeof key, "%s.xtx", name);
    return read_f32("hessian.safetensors", key, NULL);
}

/* The packed matrices the library makes for `method` when called directly,
   in layer order. */
static void direct(const char *method, const char *opts_group, mpq_packed *out)
{
    char name[64];
    float *W[NL], *stat[NL];
    mpq_plan plan;
    int planned = 0;
    memset(&plan, 0, sizeof plan);
    for (int l = 0; l < NL; l++) {
        layer_name(l, name, sizeof name);
        W[l] = read_f32("model.safetensors", name, NULL);
        stat[l] = NULL;
        if (!strcmp(method, "sfmp")) stat[l] = read_f32("fisher.safetensors", name, NULL);
        if (!strcmp(method, "mixllm")) stat[l] = read_f32("rows.safetensors", name, NULL);
        if (!strcmp(method, "mxsens")) stat[l] = read_f32("cols.safetensors", name, NULL);
    }
    const int group = opts_group ? atoi(opts_group) : 0;
    if (!strcmp(method, "sfmp")) {
        mpq_sfmp_layer L[NL];
        for (int l = 0; l < NL; l++) {
            L[l].S = stat[l], L[l].rows = shapes[l][0], L[l].cols = shapes[l][1];
            if (!direct_act_order) continue;
            /* under act-order SFMP ranks the Fisher diagonal in act-order's column order */
            float *H = hessian_of(l), *S = malloc(sizeof(float) * shapes[l][0] * shapes[l][1]);
            uint32_t *order = malloc(4u * shapes[l][1]);
            cr_assert_eq(mpq_gptq_act_order(H, shapes[l][1], order), MPQ_OK);
            cr_assert_eq(mpq_perm_apply(stat[l], shapes[l][0], shapes[l][1], NULL, order, S), MPQ_OK);
            free(stat[l]), free(H), free(order);
            L[l].S = stat[l] = S;
        }
        mpq_sfmp_desc d = {0};
        d.bpw = 3.3, d.group = group, d.reorder = direct_act_order ? MPQ_REORDER_ROWS : MPQ_REORDER_BOTH;
        cr_assert_eq(mpq_plan_sfmp(L, NL, &d, &plan), MPQ_OK);
        planned = 1;
    } else if (!strcmp(method, "mixllm")) {
        mpq_mixllm_layer L[NL];
        for (int l = 0; l < NL; l++) L[l].salience = stat[l], L[l].rows = shapes[l][0], L[l].cols = shapes[l][1];
        mpq_mixllm_desc d = {0};
        d.fraction = 0.2, d.group = group;
        cr_assert_eq(mpq_plan_mixllm(L, NL, &d, &plan), MPQ_OK);
        planned = 1;
    } else if (!strcmp(method, "mxsens")) {
        mpq_mxsens_layer L[NL];
        for (int l = 0; l < NL; l++)
            L[l].col_sens = stat[l], L[l].layer_sens = 0.25f * (float)(l + 1), L[l].rows = shapes[l][0],
            L[l].cols = shapes[l][1];
        cr_assert_eq(mpq_plan_mxsens(L, NL, 6.0, &plan, NULL), MPQ_OK);
        planned = 1;
    }
    for (int l = 0; l < NL; l++) {
        mpq_bitplane_desc d = {0};
        float *cs = NULL, *clip = NULL, *X = NULL;
        if (planned) {
            cr_assert_eq(mpq_plan_desc(&plan, l, &d), MPQ_OK);
        } else {
            d.rows = shapes[l][0], d.cols = shapes[l][1], d.group = group, d.uniform_bits = 3;
        }
        mpq_rotation rot = {0};
        if (direct_rotate) {
            cr_assert_eq(mpq_rotation_init(&rot, d.cols, (uint64_t)(direct_rotate - 1)), MPQ_OK);
            d.rotation = &rot;
        }
        if (!strcmp(method, "awq")) {
            layer_name(l, name, sizeof name);
            X = read_f32("calib.safetensors", name, NULL);
            const int g = group ? group : 128;
            cs = malloc(sizeof(float) * d.cols);
            clip = malloc(sizeof(float) * d.rows * ((d.cols + g - 1) / g));
            mpq_awq_desc a = {0};
            a.X = X, a.tokens = TOKENS;
            cr_assert_eq(mpq_awq_search(&d, W[l], &a, cs, clip, NULL), MPQ_OK);
            d.col_scale = cs, d.clip = clip;
        }
        if (direct_gptq) {
            float *H = hessian_of(l);
            uint32_t *order = malloc(4u * d.cols);
            if (direct_act_order) { /* rotated: the order of V H V^T's diagonal */
                float *Hr = memcpy(malloc(sizeof(float) * d.cols * d.cols), H, sizeof(float) * d.cols * d.cols);
                if (direct_rotate) cr_assert_eq(mpq_rotation_conjugate(&rot, Hr), MPQ_OK);
                cr_assert_eq(mpq_gptq_act_order(Hr, d.cols, order), MPQ_OK);
                d.p_col = order;
                free(Hr);
            }
            mpq_gptq_desc g = {0};
            g.H = H;
            cr_assert_eq(mpq_gptq_alloc(&d, W[l], &g, &out[l], NULL), MPQ_OK);
            free(H), free(order);
        } else
            cr_assert_eq(mpq_pack_alloc(&d, W[l], &out[l]), MPQ_OK);
        free(cs), free(clip), free(X), free(W[l]), free(stat[l]);
        mpq_rotation_free(&rot);
    }
    if (planned) mpq_plan_free(&plan);
}

/* out.safetensors holds, for every layer, exactly `want`, and every other
   tensor of model.safetensors unchanged. */
static void check_output(const mpq_packed *want)
{
    char p[600], name[64];
    mpq_io_err e;
    mpq_st_file *in, *out;
    path_of("model.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_open(p, &in, &e), MPQ_OK);
    path_of("out.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_open(p, &out, &e), MPQ_OK, "%s", e.msg);
    cr_assert_eq(mpq_st_count(out), mpq_st_count(in));
    cr_assert_str_eq(mpq_st_meta(out, "format"), "pt", "the input's metadata is carried");
    for (int l = 0; l < NL; l++) {
        layer_name(l, name, sizeof name);
        mpq_packed A;
        cr_assert_eq(mpq_st_read_packed(out, name, &A, &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(A.bytes, want[l].bytes, "%s", name);
        cr_assert_eq(memcmp(A.buf, want[l].buf, A.bytes), 0, "%s: the tool and the library agree byte for byte", name);
        mpq_packed_free(&A);
    }
    for (int i = 0; i < mpq_st_count(in); i++) {
        const mpq_st_tensor *t = mpq_st_at(in, i), *u = mpq_st_find(out, t->name);
        cr_assert_not_null(u);
        if (strstr(t->name, ".layers.")) continue;
        cr_assert_eq(u->dtype, t->dtype);
        cr_assert_eq(u->ndim, t->ndim);
        const size_t n = (size_t)(t->end - t->begin);
        uint8_t *a = malloc(n + 1), *b = malloc(n + 1);
        cr_assert_eq(mpq_st_read(in, t, a, n, &e), MPQ_OK);
        cr_assert_eq(mpq_st_read(out, u, b, n, &e), MPQ_OK);
        cr_assert_eq(memcmp(a, b, n), 0, "%s copied unchanged", t->name);
        free(a), free(b);
    }
    mpq_st_close(in);
    mpq_st_close(out);
}

static void method_case(const char *method, const char *args, const char *group)
{
    write_inputs();
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "quantize --method %s %s --exclude '*embed*' model.safetensors out.safetensors", method,
             args);
    int rc = run(cmd);
    cr_assert_eq(rc, 0, "mpq %s: exit %d: %s", cmd, rc, text("err.txt"));
    const char *o = text("out.txt");
    cr_assert(strstr(o, "model.layers.2.proj.weight") && strstr(o, "bits per weight"), "summary table: %s", o);
    mpq_packed want[NL];
    direct(method, group, want);
    check_output(want);
    for (int l = 0; l < NL; l++) mpq_packed_free(&want[l]);
    cr_assert_eq(run("inspect out.safetensors"), 0, "%s", text("err.txt"));
    cr_assert_not_null(strstr(text("out.txt"), "model.embed.weight"));
}

Test(cli, rtn_matches_the_library, .init = setup, .fini = teardown) { method_case("rtn", "--bits 3 --group 32", "32"); }

Test(cli, awq_matches_the_library, .init = setup, .fini = teardown)
{
    method_case("awq", "--bits 3 --group 32 --calib calib.safetensors", "32");
}

Test(cli, gptq_matches_the_library, .init = setup, .fini = teardown)
{
    direct_gptq = 1, direct_act_order = 1;
    method_case("gptq", "--bits 3 --group 32 --hessian hessian.safetensors --act-order", "32");
}

Test(cli, rotated_gptq_and_rtn_match_the_library, .init = setup, .fini = teardown)
{
    direct_gptq = 1, direct_act_order = 1, direct_rotate = 1 + 7;
    method_case("gptq", "--bits 3 --group 32 --hessian hessian.safetensors --act-order --rotate 7", "32");
    cr_assert_null(strstr(text("err.txt"), "plain rounding"), "no warning under GPTQ: %s", text("err.txt"));
    direct_gptq = 0, direct_act_order = 0, direct_rotate = 1 + 0;
    method_case("rtn", "--bits 3 --group 32 --rotate 0", "32");
    cr_assert_eq(run("quantize --bits 3 --group 32 --rotate 0 --exclude '*embed*' model.safetensors o.safetensors"), 0);
    cr_assert_not_null(strstr(text("err.txt"), "--rotate with plain rounding"), "the warning: %s", text("err.txt"));
    cr_assert_eq(run("quantize --rotate -3 model.safetensors o.safetensors"), 1);
    cr_assert_eq(run("quantize --rotate x model.safetensors o.safetensors"), 1);
    cr_assert_eq(run("quantize --rotate 18446744073709551616 model.safetensors o.safetensors"), 1, "past 2^64 - 1");
}

/* The planners under a rotation read statistics gathered in its basis
   (mpq calibrate --rotate SEED records the seed); any other file is an
   input error naming it, and nothing is written. */
Test(cli, rotated_planners_take_statistics_of_their_basis, .init = setup, .fini = teardown)
{
    salience_meta = "{\"windows\":16,\"rotate_seed\":\"5\"}";
    direct_rotate = 1 + 5;
    method_case("sfmp", "--bpw 3.3 --group 32 --reorder both --salience fisher.safetensors --rotate 5", "32");
    method_case("mixllm", "--fraction 0.2 --group 32 --salience rows.safetensors --rotate 5", "32");
    method_case("mxsens", "--bpw 6.0 --salience cols.safetensors --rotate 5", NULL);
    static const char *const bad[][2] = {
        {"--rotate 6", "not 6"},  /* another seed */
        {"", "needs --rotate 5"}, /* rotated statistics, unrotated recipe */
    };
    for (int k = 0; k < 2; k++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "quantize --method sfmp --bpw 3.3 --salience fisher.safetensors %s model.safetensors o.safetensors",
                 bad[k][0]);
        cr_assert_eq(run(cmd), 2, "%s: %s", cmd, text("err.txt"));
        cr_assert(strstr(text("err.txt"), "fisher.safetensors") && strstr(text("err.txt"), bad[k][1]), "%s",
                  text("err.txt"));
        cr_assert(!exists("o.safetensors"), "nothing written");
    }
    salience_meta = NULL; /* unrotated statistics under --rotate */
    write_inputs();
    cr_assert_eq(run("quantize --method mixllm --salience rows.safetensors --rotate 5 model.safetensors o.safetensors"),
                 2);
    cr_assert(strstr(text("err.txt"), "rows.safetensors") && strstr(text("err.txt"), "mpq calibrate --rotate 5"), "%s",
              text("err.txt"));
    cr_assert(!exists("o.safetensors"));
    salience_meta = "{\"rotate_seed\":7}"; /* not a decimal string */
    write_inputs();
    cr_assert_eq(run("quantize --method mixllm --salience rows.safetensors --rotate 7 model.safetensors o.safetensors"),
                 2);
    cr_assert_not_null(strstr(text("err.txt"), "rotate_seed"), "%s", text("err.txt"));
    salience_meta = NULL;
}

Test(cli, sfmp_with_gptq_matches_the_library, .init = setup, .fini = teardown)
{
    direct_gptq = 1;
    method_case("sfmp",
                "--bpw 3.3 --reorder both --salience fisher.safetensors --quantizer gptq "
                "--hessian hessian.safetensors",
                NULL);
}

Test(cli, sfmp_with_gptq_in_act_order_matches_the_library, .init = setup, .fini = teardown)
{
    direct_gptq = 1, direct_act_order = 1;
    method_case("sfmp",
                "--bpw 3.3 --reorder rows --salience fisher.safetensors --quantizer gptq --act-order "
                "--hessian hessian.safetensors",
                NULL);
}

Test(cli, gptq_errors, .init = setup, .fini = teardown)
{
    write_inputs();
    cr_assert_eq(run("quantize --method gptq model.safetensors o.safetensors"), 1, "needs --hessian");
    cr_assert(strstr(text("err.txt"), "--hessian"), "%s", text("err.txt"));
    cr_assert_eq(run("quantize --act-order model.safetensors o.safetensors"), 1, "act-order is GPTQ's");
    cr_assert_eq(run("quantize --method requant --quantizer gptq --salience fisher.safetensors model.safetensors "
                     "o.safetensors"),
                 1);
    /* a Hessian file without the weight's X^T X: exit 2, naming file and tensor */
    cr_assert_eq(run("quantize --method gptq --hessian cols.safetensors --exclude '*embed*' model.safetensors "
                     "o.safetensors"),
                 2);
    const char *e = text("err.txt");
    cr_assert(strstr(e, "cols.safetensors") && strstr(e, "model.layers.0.proj.weight"), "%s", e);
    /* act-order under a plan that permutes the columns itself */
    cr_assert_eq(run("quantize --method sfmp --bpw 3.3 --reorder cols --salience fisher.safetensors --quantizer gptq "
                     "--act-order --hessian hessian.safetensors --exclude '*embed*' model.safetensors o.safetensors"),
                 1);
    cr_assert(strstr(text("err.txt"), "--act-order") && strstr(text("err.txt"), "--reorder cols"), "%s",
              text("err.txt"));
    cr_assert_eq(run("quantize --method mxsens --bpw 6 --salience cols.safetensors --quantizer gptq --act-order "
                     "--hessian hessian.safetensors --exclude '*embed*' model.safetensors o.safetensors"),
                 1);
    cr_assert(strstr(text("err.txt"), "--act-order") && strstr(text("err.txt"), "mxsens"), "%s", text("err.txt"));
    /* X^T X of too few tokens without dampening: not positive definite, exit 4 and no output */
    char p[600];
    path_of("o.safetensors", p, sizeof p);
    cr_assert_eq(run("quantize --method gptq --damp 0 --hessian fisher.safetensors --exclude '*embed*' "
                     "model.safetensors o.safetensors"),
                 2, "the Fisher file's tensors are rows x cols");
    {
        char name[64], key[96], hp[600];
        mpq_io_err er;
        mpq_st_writer *w;
        path_of("rank1.safetensors", hp, sizeof hp);
        cr_assert_eq(mpq_st_writer_open(hp, &w, &er), MPQ_OK);
        for (int l = 0; l < NL; l++) {
            const int cols = shapes[l][1];
            float *H = malloc(sizeof(float) * cols * cols);
            for (int i = 0; i < cols; i++)
                for (int j = 0; j < cols; j++) H[i * cols + j] = (float)((1 + i % 5) * (1 + j % 5));
            layer_name(l, name, sizeof name);
            snprintf(key, sizeof key, "%s.xtx", name);
            cr_assert_eq(
                mpq_st_write_f32(w, key, MPQ_DT_F32, 2, (const uint64_t[]){(uint64_t)cols, (uint64_t)cols}, H, &er),
                MPQ_OK);
            free(H);
        }
        cr_assert_eq(mpq_st_writer_close(w, &er), MPQ_OK);
    }
    cr_assert_eq(run("quantize --method gptq --damp 0 --hessian rank1.safetensors --exclude '*embed*' "
                     "model.safetensors o.safetensors"),
                 4);
    e = text("err.txt");
    cr_assert(strstr(e, "model.layers.0.proj.weight") && strstr(e, "--damp"), "%s", e);
    cr_assert_eq(access(p, F_OK), -1);
    cr_assert_eq(run("quantize --method gptq --hessian rank1.safetensors --exclude '*embed*' model.safetensors "
                     "o.safetensors"),
                 0, "the default dampening makes it definite: %s", text("err.txt"));
}

Test(cli, sfmp_matches_the_library, .init = setup, .fini = teardown)
{
    method_case("sfmp", "--bpw 3.3 --group 32 --reorder both --salience fisher.safetensors", "32");
}

Test(cli, mixllm_matches_the_library, .init = setup, .fini = teardown)
{
    method_case("mixllm", "--fraction 0.2 --group 32 --salience rows.safetensors", "32");
}

Test(cli, mxsens_matches_the_library, .init = setup, .fini = teardown)
{
    method_case("mxsens", "--bpw 6.0 --salience cols.safetensors", NULL);
    /* a budget below the plan without 6-bit columns: exit 1, the lowest
       budget and the tensor that needs the most, no output. Per tensor,
       (8 * 32 + 4 * (cols - 32) + 8 * ceil(cols / 32)) / cols bits; over all
       four 115576 / 21576 = 5.35669; layer 3 (72 columns) alone 6.1111 */
    cr_assert_eq(run("quantize --method mxsens --bpw 5.3 --salience cols.safetensors model.safetensors o.safetensors"),
                 1);
    const char *e = text("err.txt");
    cr_assert(strstr(e, "lowest budget") && strstr(e, "5.3567") && strstr(e, "model.layers.3.proj.weight") &&
                  strstr(e, "6.1111"),
              "%s", e);
    char p[600];
    path_of("o.safetensors", p, sizeof p);
    cr_assert_eq(access(p, F_OK), -1);
    cr_assert_eq(run("quantize --method mxsens --bpw 5.3567 --salience cols.safetensors model.safetensors "
                     "o.safetensors"),
                 0, "%s", text("err.txt"));
}

Test(cli, inspect_and_bench_read_what_quantize_wrote, .init = setup, .fini = teardown)
{
    write_inputs();
    cr_assert_eq(run("quantize --bits 4 --quiet model.safetensors out.safetensors"), 0, "%s", text("err.txt"));
    cr_assert_str_eq(text("out.txt"), "", "--quiet prints nothing");
    cr_assert_eq(run("inspect out.safetensors"), 0);
    const char *o = text("out.txt");
    cr_assert(strstr(o, "bitplane 4") && strstr(o, "4.250"), "%s", o); /* 4 bits + 32/128 */
    cr_assert_eq(run("bench --reps 2 --threads 1 --tensor model.layers.1.proj.weight out.safetensors"), 0, "%s",
                 text("err.txt"));
    o = text("out.txt");
    cr_assert(strstr(o, "model.layers.1.proj.weight") && strstr(o, "read bandwidth"), "%s", o);
    cr_assert_null(strstr(o, "model.layers.0.proj.weight"), "--tensor picks one");
    /* a packed input tensor is carried over, validated */
    cr_assert_eq(run("quantize --bits 2 out.safetensors again.safetensors"), 0, "%s", text("err.txt"));
    o = text("out.txt");
    cr_assert(strstr(o, "bitplane 4 (kept)") && strstr(o, "F32 (kept)"), "%s", o);
    cr_assert_eq(run("inspect again.safetensors"), 0);
    o = text("out.txt");
    cr_assert(strstr(o, "bitplane 4") && !strstr(o, "bitplane 2"), "only float tensors are quantized: %s", o);
}

Test(cli, errors_have_exit_codes_and_name_what_is_wrong, .init = setup, .fini = teardown)
{
    write_inputs();
    cr_assert_eq(run("--help"), 0);
    cr_assert_eq(run("quantize --help"), 0);
    cr_assert_not_null(strstr(text("out.txt"), "--method"));
    cr_assert_eq(run("inspect --help"), 0);
    cr_assert_eq(run("bench --help"), 0);
    cr_assert_eq(run("frobnicate"), 1);
    cr_assert_eq(run("quantize --bits 9 model.safetensors o.safetensors"), 1);
    cr_assert_not_null(strstr(text("err.txt"), "--bits"));
    cr_assert_eq(run("quantize --bogus model.safetensors o.safetensors"), 1);
    cr_assert_eq(run("quantize model.safetensors"), 1);
    cr_assert_eq(run("quantize --method sfmp --bpw 3 model.safetensors o.safetensors"), 1, "needs --salience");
    cr_assert_eq(run("quantize --method awq model.safetensors o.safetensors"), 1, "needs --calib");
    /* input problems: exit 2, naming file and tensor */
    cr_assert_eq(run("quantize missing.safetensors o.safetensors"), 2);
    cr_assert_not_null(strstr(text("err.txt"), "missing.safetensors"));
    cr_assert_eq(run("quantize --method mixllm --salience fisher.safetensors --exclude '*embed*' model.safetensors "
                     "o.safetensors"),
                 2);
    const char *e = text("err.txt");
    cr_assert(strstr(e, "fisher.safetensors") && strstr(e, "model.layers.0.proj.weight") && strstr(e, "shape"), "%s",
              e);
    cr_assert_eq(run("quantize --method awq --calib cols.safetensors model.safetensors o.safetensors"), 2);
    cr_assert(strstr(text("err.txt"), "activations"), "%s", text("err.txt"));
    cr_assert_eq(run("inspect fisher.safetensors"), 0);
    {
        char j[600];
        path_of("junk.safetensors", j, sizeof j);
        FILE *f = fopen(j, "wb");
        fwrite("\x07\0\0\0\0\0\0\0{\"a\":1}", 1, 15, f);
        fclose(f);
    }
    cr_assert_eq(run("inspect junk.safetensors"), 2);
    cr_assert(strstr(text("err.txt"), "junk.safetensors"), "%s", text("err.txt"));
    /* a budget no plan meets: exit 1, the lowest one the tensors allow and the
       tensor that needs the most, and no output file */
    cr_assert_eq(run("quantize --method sfmp --bpw 0.5 --salience fisher.safetensors --exclude '*embed*' "
                     "model.safetensors o.safetensors"),
                 1);
    e = text("err.txt");
    /* 1 + 32 / 128 on layers 0..2 (whole groups), 1 + 32 / 72 on layer 3 (one partial group) */
    cr_assert(strstr(e, "lowest budget") && strstr(e, "model.layers.3.proj.weight") && strstr(e, "1.4444"), "%s", e);
    char p[600];
    path_of("o.safetensors", p, sizeof p);
    cr_assert_eq(access(p, F_OK), -1);
    /* an output that cannot be written: exit 3 */
    cr_assert_eq(run("quantize model.safetensors no/such/dir/o.safetensors"), 3);
    cr_assert(strstr(text("err.txt"), "no/such/dir/o.safetensors"), "%s", text("err.txt"));
}

/* Messages that say what to change (usage errors exit 1, input errors 2). */
Test(cli, messages_say_what_to_change, .init = setup, .fini = teardown)
{
    write_inputs();
    cr_assert_eq(run("quantize --bits 3 --group 100 model.safetensors o.safetensors"), 1,
                 "a group not of whole chunks");
    cr_assert(strstr(text("err.txt"), "--group 100") && strstr(text("err.txt"), "multiple of 8"), "%s",
              text("err.txt"));
    cr_assert_eq(
        run("quantize --method sfmp --bpw 20 --salience fisher.safetensors --exclude '*embed*' model.safetensors "
            "o.safetensors"),
        0);
    cr_assert(strstr(text("err.txt"), "--bpw 20: capped at"), "%s", text("err.txt"));
    char p[600];
    path_of("notes.safetensors", p, sizeof p);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    fputs("These are my notes about the model, not tensors.\n", f);
    fclose(f);
    cr_assert_eq(run("inspect notes.safetensors"), 2);
    cr_assert(strstr(text("err.txt"), "notes.safetensors: not a safetensors file"), "%s", text("err.txt"));
    /* a salience with a negative entry names the file, the tensor and the element */
    mpq_io_err e;
    mpq_st_writer *w;
    path_of("negative.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_writer_open(p, &w, &e), MPQ_OK);
    for (int l = 0; l < NL; l++) {
        char name[64];
        const uint64_t sh[2] = {(uint64_t)shapes[l][0], (uint64_t)shapes[l][1]};
        float *S = malloc(sizeof(float) * shapes[l][0] * shapes[l][1]);
        for (int k = 0; k < shapes[l][0] * shapes[l][1]; k++) S[k] = 1.0f;
        if (l == 2) S[17] = -0.5f;
        layer_name(l, name, sizeof name);
        cr_assert_eq(mpq_st_write_f32(w, name, MPQ_DT_F32, 2, sh, S, &e), MPQ_OK);
        free(S);
    }
    cr_assert_eq(mpq_st_writer_close(w, &e), MPQ_OK);
    cr_assert_eq(
        run("quantize --method sfmp --bpw 3 --salience negative.safetensors --exclude '*embed*' model.safetensors "
            "o.safetensors"),
        2);
    const char *m = text("err.txt");
    cr_assert(strstr(m, "negative.safetensors") && strstr(m, "model.layers.2.proj.weight") && strstr(m, "negative"),
              "%s", m);
}

/* x rounded to bfloat16 (nearest, ties to even; finite x). */
static float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* mpq dequantize: every packed tensor as floats, bit for bit what
   mpq_packed_dequantize gives (f16 and bf16: that, rounded), the other
   tensors as they were. */
Test(cli, dequantize_gives_the_library_floats, .init = setup, .fini = teardown)
{
    write_inputs();
    cr_assert_eq(run("quantize --quiet --bits 3 --exclude '*embed*' model.safetensors q.safetensors"), 0, "%s",
                 text("err.txt"));
    cr_assert_eq(run("dequantize --quiet q.safetensors d32.safetensors"), 0, "%s", text("err.txt"));
    cr_assert_eq(run("dequantize --quiet --dtype f16 --skip-planes 1 q.safetensors d16.safetensors"), 0, "%s",
                 text("err.txt"));
    cr_assert_eq(run("dequantize --quiet --dtype bf16 q.safetensors db.safetensors"), 0, "%s", text("err.txt"));
    char p[600];
    mpq_io_err e;
    mpq_st_file *q, *d[3];
    path_of("q.safetensors", p, sizeof p);
    cr_assert_eq(mpq_st_open(p, &q, &e), MPQ_OK);
    const char *outs[3] = {"d32.safetensors", "d16.safetensors", "db.safetensors"};
    const mpq_dtype dts[3] = {MPQ_DT_F32, MPQ_DT_F16, MPQ_DT_BF16};
    for (int k = 0; k < 3; k++) {
        path_of(outs[k], p, sizeof p);
        cr_assert_eq(mpq_st_open(p, &d[k], &e), MPQ_OK, "%s", e.msg);
        cr_assert_eq(mpq_st_count(d[k]), mpq_st_count(q));
    }
    for (int i = 0; i < mpq_st_count(q); i++) {
        const mpq_st_tensor *t = mpq_st_at(q, i);
        if (!t->packed) { /* kept: the same bytes */
            const mpq_st_tensor *u = mpq_st_find(d[0], t->name);
            cr_assert(u && u->dtype == t->dtype && u->end - u->begin == t->end - t->begin, "%s", t->name);
            continue;
        }
        mpq_packed A;
        cr_assert_eq(mpq_st_read_packed(q, t->name, &A, &e), MPQ_OK);
        const size_t n = (size_t)A.rows * A.cols;
        float *W0 = malloc(sizeof(float) * n), *W1 = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
        cr_assert_eq(mpq_packed_dequantize(&A, 0, W0), MPQ_OK);
        cr_assert_eq(mpq_packed_dequantize(&A, 1, W1), MPQ_OK);
        for (int k = 0; k < 3; k++) {
            const mpq_st_tensor *u = mpq_st_find(d[k], t->name);
            cr_assert(u && u->dtype == dts[k] && u->ndim == 2 && u->shape[0] == (uint64_t)A.rows &&
                          u->shape[1] == (uint64_t)A.cols,
                      "%s in %s", t->name, outs[k]);
            cr_assert_eq(mpq_st_read_f32(d[k], u, got, n, &e), MPQ_OK);
            for (size_t j = 0; j < n; j++) {
                const float want = k == 0 ? W0[j] : k == 1 ? mpq_f16_to_f32(mpq_f32_to_f16(W1[j])) : bf16_round(W0[j]);
                cr_assert(memcmp(&got[j], &want, sizeof want) == 0, "%s %s [%zu]: %.9g, expected %.9g", outs[k],
                          t->name, j, got[j], want);
            }
        }
        free(W0), free(W1), free(got);
        mpq_packed_free(&A);
    }
    for (int k = 0; k < 3; k++) mpq_st_close(d[k]);
    mpq_st_close(q);
    /* errors: usage 1, input 2 */
    cr_assert_eq(run("dequantize --dtype f64 q.safetensors x.safetensors"), 1);
    cr_assert(strstr(text("err.txt"), "f64"), "%s", text("err.txt"));
    cr_assert_eq(run("dequantize q.safetensors"), 1);
    cr_assert_eq(run("dequantize missing.safetensors x.safetensors"), 2);
    cr_assert(strstr(text("err.txt"), "missing.safetensors"), "%s", text("err.txt"));
}

/* The progress line the tool (and the main job) print during long runs
   (util/progress.h), written to a file instead of stderr. */
static const char *progress_text(FILE *f)
{
    static char buf[512];
    fflush(f);
    rewind(f);
    const size_t got = fread(buf, 1, sizeof buf - 1, f);
    buf[got] = 0;
    fseek(f, 0, SEEK_END);
    return buf;
}

Test(cli, progress_lines)
{
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    progress p;
    /* in a log: nothing during the first 15 s, then one line, then nothing for 15 s more */
    progress_start(&p, "who", 1, 10);
    p.out = f, p.tty = 0;
    progress_show(&p, 3, "early");
    cr_assert_str_eq(progress_text(f), "");
    p.t0 -= 16, p.last -= 16;
    progress_show(&p, 4, "quantizing blk.3.attn_q.weight");
    cr_assert_str_eq(progress_text(f), "who: 4/10 after 16 s, 0:24 left quantizing blk.3.attn_q.weight\n");
    progress_show(&p, 5, "again");
    p.last -= 16;
    progress_show(&p, 10, "done: no line");
    cr_assert_str_eq(progress_text(f), "who: 4/10 after 16 s, 0:24 left quantizing blk.3.attn_q.weight\n");
    fclose(f);

    /* on a terminal: a bar redrawn in place, erased at the end */
    f = tmpfile();
    progress_start(&p, "who", 1, 10);
    p.out = f, p.tty = 1, p.t0 -= 100;
    progress_show(&p, 5, "a step whose description is longer than fifty characters in all");
    progress_end(&p);
    cr_assert_str_eq(progress_text(f),
                     "\r\033[K[###############...............] 5/10, 1:40 left a step whose description "
                     "is longer than fifty char\r\033[K");
    fclose(f);

    /* off: nothing at all */
    f = tmpfile();
    progress_start(&p, "who", 0, 10);
    p.out = f, p.tty = 1, p.t0 -= 100, p.last -= 100;
    progress_show(&p, 5, "x");
    progress_end(&p);
    cr_assert_str_eq(progress_text(f), "");
    fclose(f);
}
