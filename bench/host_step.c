/* bench_host_step - what a decode step costs on the host around its products.

     bench_host_step MODEL [SEQS [STEPS]]

   loads MODEL (as the model commands do), puts its packed linear maps on a
   backend whose products only zero their outputs, and decodes STEPS tokens
   (default 16) of each of SEQS sequences at once (default 64; mpq_llm_decode,
   as `mpq speed -b SEQS` does), so that the time per step is everything the
   forward pass does besides the products: embedding, norms, rotary and
   cache rows, attention, SwiGLU, the float maps. With a GPU backend the
   products come on top of it, plus their copies. The null products zero
   their outputs on the caller's thread (the forward pass reads them), where
   a GPU backend's copies back write them: their time is measured and given
   apart, and "the rest" is the host's share. The same threads as the model commands
   (OMP_NUM_THREADS). */
#define _XOPEN_SOURCE 700 /* clock_gettime, in bench_util.h */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "bench_util.h"
#include "mpq_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct null_handle {
    int rows;
} null_handle;

static mpq_status null_upload(void *ctx, const mpq_packed *A, void **handle)
{
    (void)ctx;
    null_handle *h = (null_handle *)malloc(sizeof *h);
    if (!h) return MPQ_ERR_NOMEM;
    h->rows = A->rows;
    *handle = h;
    return MPQ_OK;
}

static void null_release(void *ctx, void *handle)
{
    (void)ctx;
    free(handle);
}

/* Seconds spent in null_gemv (the forward pass calls the backend from one
   thread). */
static double null_seconds;

static mpq_status null_gemv(void *ctx, void *handle, const float *x, float *y, int batch, const mpq_gemv_opts *opts)
{
    (void)ctx, (void)x, (void)opts;
    const double t0 = bench_now();
    memset(y, 0, sizeof(float) * (size_t)batch * (size_t)((const null_handle *)handle)->rows);
    null_seconds += bench_now() - t0;
    return MPQ_OK;
}

static mpq_status null_sync(void *ctx)
{
    (void)ctx;
    return MPQ_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: bench_host_step MODEL [SEQS [STEPS]]\n");
        return 1;
    }
    const int nb = argc > 2 ? atoi(argv[2]) : 64, steps = argc > 3 ? atoi(argv[3]) : 16;
    if (nb < 1 || nb > 4096 || steps < 1 || steps > 100000) {
        fprintf(stderr, "bench_host_step: SEQS 1..4096, STEPS 1..100000\n");
        return 1;
    }
    mpq_llm *m = NULL;
    mpq_io_err e;
    if (mpq_llm_load(argv[1], &m, &e) != MPQ_OK) {
        fprintf(stderr, "bench_host_step: %s\n", e.msg);
        return 2;
    }
    mpq_backend be;
    memset(&be, 0, sizeof be);
    be.name = "null", be.caps = MPQ_CAP_BITPLANE | MPQ_CAP_HOST_MEMORY;
    be.upload = null_upload, be.release = null_release, be.gemv = null_gemv, be.synchronize = null_sync;
    mpq_status st = mpq_llm_use_backend(m, &be);
    mpq_llm_state work, *seqs = (mpq_llm_state *)calloc((size_t)nb, sizeof *seqs);
    mpq_llm_state **sp = (mpq_llm_state **)calloc((size_t)nb, sizeof *sp);
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)nb);
    float *logits = (float *)malloc(sizeof(float) * (size_t)nb * (size_t)m->c.vocab);
    memset(&work, 0, sizeof work);
    int made = 0;
    if (st == MPQ_OK && (!seqs || !sp || !tok || !logits)) st = MPQ_ERR_NOMEM;
    if (st == MPQ_OK) st = mpq_llm_state_init(m, steps + 1, nb, &work);
    for (; st == MPQ_OK && made < nb; made++) {
        st = mpq_llm_state_init(m, steps + 1, 1, &seqs[made]);
        sp[made] = &seqs[made];
        tok[made] = (int32_t)((made * 7919) % m->c.vocab);
    }
    double t0 = bench_now(), t1 = t0;
    null_seconds = 0.0;
    if (st == MPQ_OK) {
        for (int s = 0; s < steps && st == MPQ_OK; s++) st = mpq_llm_decode(m, sp, nb, tok, 0, &work, logits);
        t1 = bench_now();
    }
    if (st == MPQ_OK)
        printf("%s: %d layers, %d sequences: %.3f ms per step on the host (%d steps), of which %.3f in the null "
               "products zeroing their outputs, %.3f the rest\n",
               argv[1], m->c.layers, nb, 1e3 * (t1 - t0) / steps, steps, 1e3 * null_seconds / steps,
               1e3 * (t1 - t0 - null_seconds) / steps);
    else
        fprintf(stderr, "bench_host_step: %s\n", mpq_status_str(st));
    for (int i = 0; i < made; i++) mpq_llm_state_free(&seqs[i]);
    mpq_llm_state_free(&work);
    free(seqs), free(sp), free(tok), free(logits);
    mpq_llm_use_backend(m, NULL);
    mpq_llm_free(m);
    return st == MPQ_OK ? 0 : 3;
}
