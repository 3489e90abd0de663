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

/* Every row's facts are what packing and the rules do: the record's
   metadata bytes, bpw's metadata bits, the lowest width, the default and
   fixed group, the symmetric flag, the range; and its rules agree with the
   generic calls and with the formats' definitions (fp16 pairs decoded by
   hand; MXINT by mpq_mxint_value). */
Test(backend, traits_rows_say_what_the_formats_are)
{
    const mpq_format formats[2] = {MPQ_FORMAT_BITPLANE, MPQ_FORMAT_MXINT};
    synth_rng r = {606};
    for (int k = 0; k < 2; k++) {
        const mpq_format_traits *f = mpq_format_get(formats[k]);
        cr_assert_not_null(f);
        cr_assert_eq(f->format, formats[k]);
        cr_assert_str_eq(f->name, k ? "mxint" : "bitplane");
        const int G = f->default_group, rows = 37, cols = 3 * G;
        float *W = malloc(sizeof(float) * rows * cols);
        synth_weights(&r, W, rows, cols);
        mpq_bitplane_desc d = {0};
        d.format = f->format, d.rows = rows, d.cols = cols, d.uniform_bits = 5;
        mpq_packed A;
        cr_assert_eq(mpq_pack_alloc(&d, W, &A), MPQ_OK);
        cr_assert_eq(A.group, G, "%s: group 0 is the default", f->name);
        cr_assert_eq(memcmp(A.buf, f->magic, 8), 0);
        int meta = 0;
        cr_assert_eq(mpq_packed_records(&A, NULL, NULL, &meta), MPQ_OK);
        cr_assert_eq(meta, f->meta_bytes);
        cr_assert_float_eq(mpq_packed_bpw(&A, 1) - mpq_packed_bpw(&A, 0), (double)f->meta_bits / G, 1e-12);
        mpq_packed_free(&A);
        size_t bytes;
        uint8_t bits[3 * 3];
        memset(bits, f->min_bits, sizeof bits);
        d.bits = bits;
        cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_OK);
        bits[4] = (uint8_t)(f->min_bits - 1);
        cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), MPQ_ERR_BITS, "%s: below the lowest width", f->name);
        d.bits = NULL, d.group = G + 8;
        cr_assert_eq(mpq_bitplane_bytes(&d, &bytes), f->fixed_group ? MPQ_ERR_SIZE : MPQ_OK);
        d.group = 0;
        /* the range: twice the largest value */
        const float keep = W[3];
        W[3] = f->max_abs < 1e30f ? 2.0f * f->max_abs : 1e30f;
        cr_assert_eq(mpq_pack_alloc(&d, W, &A), f->max_abs < 1e30f ? MPQ_ERR_RANGE : MPQ_OK);
        if (f->max_abs >= 1e30f) mpq_packed_free(&A);
        W[3] = keep;
        /* the rules, group by group, for every width */
        for (int b = f->min_bits; b <= 8; b++)
            for (int sym = 0; sym < 2; sym++) {
                const float *v = W + (size_t)(b * 3 + sym) * cols;
                uint8_t q[128], qq[128];
                uint16_t sh, zh;
                f->quantize_group(v, G, b, sym, q, &sh, &zh);
                cr_assert(f->meta_valid(sh, zh));
                mpq_bitplane_desc one = {0};
                one.format = f->format, one.rows = 1, one.cols = G, one.uniform_bits = b,
                one.symmetric = sym ? 1u << b : 0;
                uint16_t sh2, zh2;
                float back[128];
                cr_assert_eq(mpq_quantize(&one, v, qq, &sh2, &zh2), MPQ_OK);
                cr_assert(sh2 == sh && zh2 == zh && !memcmp(q, qq, (size_t)G), "%s %d bits: mpq_quantize", f->name, b);
                cr_assert_eq(mpq_dequantize(&one, q, &sh, &zh, back), MPQ_OK);
                float s, z;
                f->pair(b, sh, zh, &s, &z);
                if (sym && f->symmetric) cr_assert_eq(z, -s, "symmetric: z^ = -s^");
                const int qmax = (1 << b) - 1;
                for (int j = 0; j < G; j++) {
                    double want;
                    if (f->e8m0)
                        want = mpq_mxint_value(q[j] - (1 << (b - 1)), b, (uint8_t)sh);
                    else
                        want = tc_half(sh) * (2.0 * q[j] - qmax) + tc_half(zh);
                    cr_assert_leq(fabs(back[j] - want), 1e-6 * (fabs(tc_half(sh)) * qmax + fabs(want)) + 1e-30,
                                  "%s %d bits: code %d is worth %g, %g by definition", f->name, b, q[j], back[j], want);
                    cr_assert_eq(back[j], s * (float)(2 * q[j] - qmax) + z, "the pair gives the value");
                    float val;
                    cr_assert_eq(f->code_of(b, sh, s, z, v[j], &val), q[j], "%s %d bits: code_of agrees", f->name, b);
                    cr_assert_eq(val, back[j]);
                }
                /* the metadata in a record, written and read */
                uint8_t rec[64] = {0};
                f->meta_write(rec, 5, sh, zh);
                uint16_t a, c;
                f->meta_read(rec, 5, &a, &c);
                cr_assert(a == sh && c == zh);
            }
        cr_assert(!f->meta_valid(k ? 0xFF : 0x7C00, 0), "%s: NaN or Inf metadata", f->name);
        if (k) cr_assert(!f->meta_valid(3, 1), "MXINT has no second field");
        free(W);
    }
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
