/* Writes test/data/packed_v1.safetensors: packed matrices in format version 1
   (the layout before rotations existed), each with an input batch x and the
   float64 reference product y = mpq_gemv_ref(A, x). test_io opens the file
   with the current library and checks that every matrix opens, re-packs to
   the same bytes and multiplies to the same y. Kept as written by mpq 0.1.0;
   rerunning it must reproduce the file byte for byte.

     cc -O2 -I. test/data/make_packed_v1.c mpq_io.c -lcjson -lm -o mk && ./mk OUT */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_io.h"

#include <stdio.h>
#include <stdlib.h>

static uint64_t state = 0x5eed0001u;

static double uniform(void)
{
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

/* Heavy-tailed weights: a normal times a scale that is large for a few columns. */
static float weight(int j) { return (float)((uniform() - 0.5) * (j % 13 == 0 ? 6.0 : 1.0)); }

static int add(mpq_st_writer *w, const char *name, const mpq_bitplane_desc *d, const float *W, int batch)
{
    mpq_packed A;
    mpq_io_err err;
    if (mpq_pack_alloc(d, W, &A) != MPQ_OK) return 1;
    float *x = malloc(sizeof(float) * (size_t)batch * (size_t)d->cols);
    double *y = malloc(sizeof(double) * (size_t)batch * (size_t)d->rows);
    for (int k = 0; k < batch * d->cols; k++) x[k] = (float)(uniform() * 2.0 - 1.0);
    int bad = mpq_gemv_ref(&A, x, y, batch, 0) != MPQ_OK;
    char key[64];
    uint64_t xs[2] = {(uint64_t)batch, (uint64_t)d->cols}, ys[2] = {(uint64_t)batch, (uint64_t)d->rows};
    bad = bad || mpq_st_write_packed(w, name, &A, &err) != MPQ_OK;
    snprintf(key, sizeof key, "%s.x", name);
    bad = bad || mpq_st_write_f32(w, key, MPQ_DT_F32, 2, xs, x, &err) != MPQ_OK;
    snprintf(key, sizeof key, "%s.y", name);
    bad = bad || mpq_st_write(w, key, MPQ_DT_F64, 2, ys, y, sizeof(double) * (size_t)batch * (size_t)d->rows, &err);
    mpq_packed_free(&A);
    free(x), free(y);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    mpq_st_writer *w;
    if (mpq_st_writer_open(argv[1], &w, NULL) != MPQ_OK) return 1;
    int bad = 0;
    { /* mixed widths, both permutations, column scales, a sparse part; awkward sizes */
        enum { R = 37, C = 200, G = 64 };
        static float W[R * C], D[R * C], cs[C];
        static uint8_t bits[3 * 4], mask[R * C];
        static uint32_t pr[R], pc[C];
        for (int k = 0; k < R * C; k++) W[k] = weight(k % C);
        for (int k = 0; k < 12; k++) bits[k] = (uint8_t)(2 + k % 5);
        for (int i = 0; i < R; i++) pr[i] = (uint32_t)((i * 5 + 3) % R);
        for (int j = 0; j < C; j++) pc[j] = (uint32_t)((j * 7 + 11) % C), cs[j] = (float)(0.5 + uniform());
        mpq_bitplane_desc d = {0};
        d.rows = R, d.cols = C, d.group = G, d.block_rows = 16, d.bits = bits, d.p_row = pr, d.p_col = pc;
        d.col_scale = cs;
        mpq_packed A;
        bad |= mpq_pack_alloc(&d, W, &A) != MPQ_OK || mpq_packed_dequantize(&A, 0, D) != MPQ_OK;
        mpq_packed_free(&A);
        for (int k = 0; k < R * C; k++) mask[k] = k % 97 == 5;
        mpq_sparse S;
        bad |= mpq_sparse_from_mask(W, D, mask, R, C, &S) != MPQ_OK;
        d.sparse = &S;
        bad |= add(w, "mixed", &d, W, 3);
        mpq_sparse_free(&S);
    }
    { /* MXINT, widths 3..5 in blocks of 8 rows */
        enum { R = 20, C = 96 };
        static float W[R * C];
        static uint8_t bits[3 * 3];
        for (int k = 0; k < R * C; k++) W[k] = weight(k % C);
        for (int k = 0; k < 9; k++) bits[k] = (uint8_t)(3 + k % 3);
        mpq_bitplane_desc d = {0};
        d.rows = R, d.cols = C, d.block_rows = 8, d.bits = bits, d.format = MPQ_FORMAT_MXINT;
        bad |= add(w, "mxint", &d, W, 2);
    }
    { /* uniform 3-bit, symmetric, group 128 */
        enum { R = 48, C = 256 };
        static float W[R * C];
        for (int k = 0; k < R * C; k++) W[k] = weight(k % C);
        mpq_bitplane_desc d = {0};
        d.rows = R, d.cols = C, d.uniform_bits = 3, d.symmetric = 1u << 3;
        bad |= add(w, "uniform", &d, W, 1);
    }
    if (bad) {
        mpq_st_writer_abort(w);
        return 1;
    }
    return mpq_st_writer_close(w, NULL) != MPQ_OK;
}
