/* A program outside the repository that uses an installed mpq (or mpq as a
   meson subproject): the header's implementation here, the io library
   linked. It packs a matrix, writes it to a safetensors file, reads it back
   and checks that the product of the copy read back gives the same bits. */
#define MPQ_IMPLEMENTATION
#include <mpq.h>
#include <mpq_io.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "consumer.safetensors";
    enum { M = 48, N = 256 };
    static float W[M * N], x[N], y0[M], y1[M];
    for (int k = 0; k < M * N; k++) W[k] = (float)((k * 7919) % 401 - 200) / 400.0f;
    for (int j = 0; j < N; j++) x[j] = (float)(j % 17) / 8.0f - 1.0f;
    mpq_bitplane_desc d = {0};
    d.rows = M, d.cols = N, d.uniform_bits = 4;
    mpq_packed A, B;
    mpq_io_err err = {0};
    mpq_st_writer *w = NULL;
    mpq_st_file *f = NULL;
    if (mpq_pack_alloc(&d, W, &A) != MPQ_OK || mpq_gemv(&A, x, y0, 1, NULL, NULL, 0) != MPQ_OK) return 1;
    if (mpq_st_writer_open(path, &w, &err) != MPQ_OK || mpq_st_write_packed(w, "w", &A, &err) != MPQ_OK ||
        mpq_st_writer_close(w, &err) != MPQ_OK || mpq_st_open(path, &f, &err) != MPQ_OK ||
        mpq_st_read_packed(f, "w", &B, &err) != MPQ_OK) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        return 1;
    }
    const int same = mpq_gemv(&B, x, y1, 1, NULL, NULL, 0) == MPQ_OK && memcmp(y0, y1, sizeof y0) == 0;
    printf("mpq %d.%d.%d: %d x %d packed in %zu bytes, read back from %s: %s\n", MPQ_VERSION_MAJOR, MPQ_VERSION_MINOR,
           MPQ_VERSION_PATCH, M, N, A.bytes, path, same ? "same product" : "DIFFERENT product");
    mpq_st_close(f);
    mpq_packed_free(&A);
    mpq_packed_free(&B);
    return same ? 0 : 1;
}
