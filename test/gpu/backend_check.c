/* backend_check: the CUDA backend skeleton on a machine with a GPU, without
   Criterion (which the GPU machine does not have): device count, backend
   creation, upload of a packed matrix, the GEMV's honest "unsupported",
   synchronisation and release. Prints one line per check and the summary
   line "N passed, N failed"; exit status 1 on any failure.
   Build: nvcc -arch=sm_90 -I. -Iexamples test/gpu/backend_check.c mpq_cuda.cu */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_cuda.h"
#include "synth.h"

#include <stdio.h>
#include <stdlib.h>

static int passed, failed;
static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

int main(void)
{
    int n = mpq_cuda_device_count();
    printf("CUDA devices: %d\n", n);
    mpq_backend b;
    mpq_status st = mpq_cuda_backend(0, &b);
    if (n == 0) {
        check(st == MPQ_ERR_NODEVICE, "no device: mpq_cuda_backend says MPQ_ERR_NODEVICE");
    } else {
        check(st == MPQ_OK, "backend created");
        check(mpq_cuda_backend(n, &b) == MPQ_ERR_NODEVICE || st != MPQ_OK, "device index past the count: MPQ_ERR_NODEVICE");
        if (st == MPQ_OK) {
            synth_rng r = {1};
            float *W = malloc(sizeof(float) * 512 * 1024), x[1024], y[512];
            synth_weights(&r, W, 512, 1024);
            synth_activations(&r, x, 1024);
            mpq_bitplane_desc d = {0};
            d.rows = 512, d.cols = 1024, d.uniform_bits = 3;
            mpq_packed A;
            check(mpq_pack_alloc(&d, W, &A) == MPQ_OK, "pack on the host");
            void *h = NULL;
            check(b.upload(b.ctx, &A, &h) == MPQ_OK && h, "upload to device memory");
            check(b.gemv(b.ctx, h, x, y, 1, NULL) == MPQ_ERR_UNSUPPORTED, "gemv: MPQ_ERR_UNSUPPORTED (no kernels yet)");
            check(b.gemv(b.ctx, h, x, y, 0, NULL) == MPQ_ERR_SIZE, "gemv batch 0: MPQ_ERR_SIZE");
            check(b.synchronize(b.ctx) == MPQ_OK, "synchronize");
            check((b.caps & MPQ_CAP_BITPLANE) == 0, "caps say no GPU GEMV");
            b.release(b.ctx, h);
            mpq_cuda_backend_destroy(&b);
            check(b.ctx == NULL, "destroyed");
            mpq_packed_free(&A);
            free(W);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
