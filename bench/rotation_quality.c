/* bench_rotation_quality - what an incoherence rotation (mpq.h section 14)
   does to GPTQ and RTN on a real model, measured by perplexity and KL
   divergence to the float model, before the rotation is part of the packed
   format:

     bench_rotation_quality [--model GGUF] [--eval TEXT] [--hessian FILE]
                            [--chunks N] [--seed S]

   For each quantizer (RTN, GPTQ with act-order; 3 and 4 bits, groups of
   128) and each of "plain" and "rotated", every linear map of the layers is
   quantized and dequantized back into the model's float weights (the
   embedding and head stay float): rotated, W V^T is quantized with
   X^T X's rotation V X^T X V^T (exact: the rotated activations are V x),
   and the dequantized matrix is rotated back, W^ = Q(W V^T) V, each map its
   own V (size: its columns; seed S + the map's index). The defaults are the
   files examples/run.sh writes; --hessian is `mpq calibrate --stats xtx`'s.
   The rows are printed as a markdown table. */
#define _POSIX_C_SOURCE 200809L
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_io.h"
#include "mpq_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what, mpq_status st)
{
    fprintf(stderr, "bench_rotation_quality: %s: %s\n", what, mpq_status_str(st));
    exit(1);
}

/* H (n x n, symmetric) <- V H V^T: the rows rotated (H V^T), transposed,
   the rows rotated again. */
static void rotate_hessian(const mpq_rotation *r, float *H, float *tmp)
{
    const int n = r->n;
    mpq_status st = mpq_rotation_apply(r, H, n, 0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) tmp[(size_t)j * n + i] = H[(size_t)i * n + j];
    if (st == MPQ_OK) st = mpq_rotation_apply(r, tmp, n, 0);
    if (st != MPQ_OK) die("rotating X^T X", st);
    for (size_t k = 0; k < (size_t)n * n; k++) H[k] = tmp[k];
}

/* Map L's weights replaced by their quantization (bits; GPTQ with H or
   round to nearest), rotated by V first when rot. */
static void fake_quantize(mpq_linear *L, const float *W0, const float *H0, int bits, int gptq, const mpq_rotation *rot)
{
    const size_t nw = (size_t)L->rows * L->cols, nh = (size_t)L->cols * L->cols;
    float *W = malloc(sizeof(float) * nw), *H = malloc(sizeof(float) * nh), *tmp = malloc(sizeof(float) * nh);
    if (!W || !H || !tmp) die("memory", MPQ_ERR_NOMEM);
    memcpy(W, W0, sizeof(float) * nw);
    memcpy(H, H0, sizeof(float) * nh);
    if (rot) {
        mpq_status st = mpq_rotation_apply(rot, W, L->rows, 0); /* each row w -> V w: W V^T */
        if (st != MPQ_OK) die("rotating W", st);
        rotate_hessian(rot, H, tmp);
    }
    mpq_recipe r;
    memset(&r, 0, sizeof r);
    r.bits = bits, r.gptq = gptq, r.act_order = gptq;
    mpq_recipe_map m;
    memset(&m, 0, sizeof m);
    m.rows = L->rows, m.cols = L->cols, m.W = W, m.H = H;
    mpq_packed A;
    mpq_status st = mpq_recipe_quantize(&r, 0, &m, NULL, &A);
    if (st != MPQ_OK) die("quantizing", st);
    st = mpq_packed_dequantize(&A, 0, L->W);
    mpq_packed_free(&A);
    if (st == MPQ_OK && rot) st = mpq_rotation_apply(rot, L->W, L->rows, 1); /* w -> V^T w: W^ V */
    if (st != MPQ_OK) die("dequantizing", st);
    free(W), free(H), free(tmp);
}

static int32_t *tokens_of(const mpq_llm *m, const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    if (!s || fread(s, 1, (size_t)len, f) != (size_t)len) die(path, MPQ_ERR_IO);
    fclose(f);
    size_t k = (size_t)len;
    if (k && s[k - 1] == '\n') k--; /* as llama-perplexity reads a file */
    int32_t *tok;
    mpq_io_err e;
    if (mpq_tokenize(m->tok, s, k, MPQ_TOK_BOS, &tok, n, &e) != MPQ_OK) {
        fprintf(stderr, "bench_rotation_quality: %s\n", e.msg);
        exit(1);
    }
    free(s);
    return tok;
}

int main(int argc, char **argv)
{
    const char *model = "build/models/SmolLM2-135M-Instruct.Q4_1.gguf", *eval = "build/text/eval.txt",
               *hessian = "build/llm/hessian.safetensors";
    int chunks = 8;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v)
            model = v, i++;
        else if (!strcmp(a, "--eval") && v)
            eval = v, i++;
        else if (!strcmp(a, "--hessian") && v)
            hessian = v, i++;
        else if (!strcmp(a, "--chunks") && v)
            chunks = atoi(v), i++;
        else if (!strcmp(a, "--seed") && v)
            seed = strtoull(v, NULL, 10), i++;
        else {
            fprintf(stderr, "usage: %s [--model GGUF] [--eval TEXT] [--hessian FILE] [--chunks N] [--seed S]\n",
                    argv[0]);
            return 1;
        }
    }
    mpq_llm *m = NULL;
    mpq_io_err e;
    if (mpq_llm_load(model, &m, &e) != MPQ_OK) {
        fprintf(stderr, "bench_rotation_quality: %s\n", e.msg);
        return 1;
    }
    mpq_calib_stats Hs;
    if (mpq_calib_read(m, hessian, &Hs, &e) != MPQ_OK || !Hs.xtx) {
        fprintf(stderr, "bench_rotation_quality: %s\n", Hs.xtx ? e.msg : "no X^T X in the file");
        return 1;
    }
    size_t nt;
    int32_t *tok = tokens_of(m, eval, &nt);
    const int nl = m->c.layers * MPQ_LIN_COUNT;
    float **W0 = malloc(sizeof(float *) * nl);
    for (int i = 0; i < nl; i++) {
        const mpq_linear *L = &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
        W0[i] = malloc(sizeof(float) * (size_t)L->rows * L->cols);
        memcpy(W0[i], L->W, sizeof(float) * (size_t)L->rows * L->cols);
    }
    mpq_kl_base base;
    mpq_ppl_opts o;
    memset(&o, 0, sizeof o);
    o.chunks = chunks, o.kl_record = &base;
    mpq_ppl_result ref;
    mpq_status st = mpq_llm_perplexity(m, tok, nt, &o, &ref);
    if (st != MPQ_OK) die("the reference", st);
    printf("%s, %s: %d chunks of 512; reference perplexity %.4f; the linear maps quantized and dequantized, the "
           "embedding and head float; rotation seed %llu\n\n",
           model, eval, ref.chunks, ref.ppl, (unsigned long long)seed);
    printf("| quantizer | bits | rotated | perplexity | vs float | KLD | +/- | same top |\n"
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
    fflush(stdout);
    o.kl_record = NULL, o.kl_ref = &base;
    for (int gptq = 0; gptq <= 1; gptq++)
        for (int bits = 3; bits <= 4; bits++)
            for (int rot = 0; rot <= 1; rot++) {
                for (int i = 0; i < nl; i++) {
                    mpq_linear *L = &m->layer[i / MPQ_LIN_COUNT].lin[i % MPQ_LIN_COUNT];
                    mpq_rotation V;
                    if (rot && (st = mpq_rotation_init(&V, L->cols, seed + (uint64_t)i)) != MPQ_OK) die("rotation", st);
                    fake_quantize(L, W0[i], Hs.xtx[i], bits, gptq, rot ? &V : NULL);
                    if (rot) mpq_rotation_free(&V);
                }
                mpq_ppl_result r;
                if ((st = mpq_llm_perplexity(m, tok, nt, &o, &r)) != MPQ_OK) die("evaluating", st);
                printf("| %s | %d | %s | %.4g | %+.1f %% | %.4f | %.4f | %.1f %% |\n",
                       gptq ? "GPTQ (act-order)" : "RTN", bits, rot ? "yes" : "no", r.ppl, 100 * (r.ppl / ref.ppl - 1),
                       r.kl.kld, r.kl.kld_err, 100 * r.kl.same_top);
                fflush(stdout);
            }
    for (int i = 0; i < nl; i++) free(W0[i]);
    free(W0), free(tok);
    mpq_kl_base_free(&base);
    mpq_calib_stats_free(&Hs);
    mpq_llm_free(m);
    return 0;
}
