/* Section 6: the format traits table and the backends. */
#include "common.h"
#ifdef MPQ_HAVE_CUDA
#include "mpq_cuda.h"
#endif

Test(backend, traits_table_has_the_bitplane_row)
{
    const mpq_format_traits *f = mpq_format_get(MPQ_FORMAT_BITPLANE);
    cr_assert_not_null(f);
    cr_assert_str_eq(f->name, "bitplane");
    cr_assert_eq(memcmp(f->magic, "MPQBITP", 8), 0);
    cr_assert_null(mpq_format_get((mpq_format)77));
}

Test(backend, cpu_backend_gives_the_same_bits_as_mpq_gemv)
{
    synth_rng r = {41};
    const int m = 150, n = 260, batch = 5;
    float *W = malloc(sizeof(float) * m * n), x[5 * 260], y1[5 * 150], y2[5 * 150];
    synth_weights(&r, W, m, n);
    synth_activations(&r, x, batch * n);
    mpq_bitplane_desc d = {0};
    d.rows = m, d.cols = n, d.uniform_bits = 3;
    mpq_packed A;
    cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
    mpq_backend be;
    mpq_backend_cpu(&be);
    cr_assert_str_eq(be.name, "cpu");
    cr_assert(be.caps & MPQ_CAP_BITPLANE);
    void *h = NULL;
    cr_assert_eq(be.upload(be.ctx, &A, &h), MPQ_OK);
    mpq_gemv_opts o = {0};
    o.skip_planes = 1;
    cr_assert_eq(be.gemv(be.ctx, h, x, y1, 1, &o), MPQ_OK); /* grows its workspace below */
    cr_assert_eq(be.gemv(be.ctx, h, x, y1, batch, &o), MPQ_OK);
    cr_assert_eq(be.synchronize(be.ctx), MPQ_OK);
    cr_assert_eq(mpq_gemv(&A, x, y2, batch, &o, NULL, 0), MPQ_OK);
    cr_assert_eq(memcmp(y1, y2, sizeof(float) * m * batch), 0);
    cr_assert_eq(be.gemv(be.ctx, h, x, y1, 0, &o), MPQ_ERR_SIZE);
    cr_assert_eq(be.gemv(be.ctx, NULL, x, y1, 1, &o), MPQ_ERR_ARG);
    be.release(be.ctx, h);
    be.release(be.ctx, NULL);
    cr_assert_eq(be.upload(be.ctx, NULL, &h), MPQ_ERR_ARG);
    mpq_packed_free(&A);
    free(W);
}

#ifdef MPQ_HAVE_CUDA
Test(backend, cuda_backend_without_a_gpu_is_a_clear_status)
{
    mpq_backend b;
    memset(&b, 0, sizeof b);
    if (mpq_cuda_device_count() > 0) cr_skip_test("a GPU is present: this case is for machines without one");
    cr_assert_eq(mpq_cuda_backend(0, &b), MPQ_ERR_NODEVICE);
    cr_assert_null(b.upload, "nothing filled on error");
    cr_assert_eq(mpq_cuda_backend(-1, &b), MPQ_ERR_ARG);
}

/* With a GPU, test/gpu/cuda_check.c checks every kernel (registered as the
   test "cuda"; it reports itself skipped on machines without one). */
#endif
