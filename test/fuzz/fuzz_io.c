/* libFuzzer target: the safetensors reader and the packed-matrix loader on
   arbitrary bytes. Whatever opens is read completely: every float tensor
   converted (read, and mapped in place: the same values), every packed
   matrix validated (read, and used in place from a 64-byte aligned copy
   of the input: the same answer and bytes), dequantized and multiplied.
   Built and run by test/run.sh (clang -fsanitize=fuzzer,address,undefined)
   for a bounded time, seeded with the files test_io writes. */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_io.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mpq_st_file *f;
    mpq_io_err e;
    uint8_t *al = (uint8_t *)aligned_alloc(64, (size + 64) / 64 * 64); /* so that matrices can lie on boundaries */
    if (!al) abort();
    memcpy(al, data, size);
    if (mpq_st_open_memory(al, size, &f, &e) != MPQ_OK) {
        if (!e.msg[0]) abort(); /* every rejection says why */
        free(al);
        return 0;
    }
    for (int i = 0; i < mpq_st_count(f); i++) {
        const mpq_st_tensor *t = mpq_st_at(f, i);
        /* sizes were checked against the input, so these allocations are
           bounded by it (F16 and BF16 at most double) */
        if (t->dtype == MPQ_DT_F32 || t->dtype == MPQ_DT_F16 || t->dtype == MPQ_DT_BF16 || t->dtype == MPQ_DT_F64) {
            float *x = (float *)malloc(sizeof(float) * (size_t)t->numel + 1);
            float *y = (float *)malloc(sizeof(float) * (size_t)t->numel + 1);
            if (!x || !y || mpq_st_read_f32(f, t, x, (size_t)t->numel, &e) != MPQ_OK) abort();
            /* the same values in place: the mapped bytes (here the input itself) converted */
            const void *p = NULL;
            const uint32_t g = t->dtype == MPQ_DT_F32 ? MPQ_GGML_F32
                : t->dtype == MPQ_DT_F16              ? MPQ_GGML_F16
                : t->dtype == MPQ_DT_BF16             ? MPQ_GGML_BF16
                                                      : MPQ_GGML_F64;
            if (mpq_st_map(f, t, &p, &e) != MPQ_OK || mpq_gguf_decode(g, p, t->numel, y) != MPQ_OK) abort();
            for (uint64_t k = 0; k < t->numel; k++) /* bit for bit; a NaN may come back quieted */
                if (memcmp(&x[k], &y[k], 4) != 0 && !(x[k] != x[k] && y[k] != y[k])) abort();
            free(x), free(y);
        }
        if (!t->packed) continue;
        mpq_packed A, V;
        const mpq_status rs = mpq_st_read_packed(f, t->name, &A, &e);
        if (mpq_st_map_packed(f, t->name, &V, &e) != rs) abort(); /* in place: the same verdict */
        if (rs != MPQ_OK) {
            if (!e.msg[0]) abort();
            continue;
        }
        if (V.bytes != A.bytes || memcmp(V.buf, A.buf, A.bytes) != 0) abort();
        mpq_packed_free(&V);
        const size_t mn = (size_t)A.rows * (size_t)A.cols;
        if (mn <= ((size_t)1 << 22)) { /* a valid header can describe a big matrix in few bytes */
            float *W = (float *)malloc(sizeof(float) * mn);
            float *x = (float *)calloc((size_t)A.cols, sizeof(float));
            float *y = (float *)malloc(sizeof(float) * (size_t)A.rows);
            if (!W || !x || !y) abort();
            for (int j = 0; j < A.cols; j++) x[j] = (float)(j % 7) - 3.0f;
            if (mpq_packed_dequantize(&A, 0, W) != MPQ_OK) abort();
            mpq_gemv_opts o;
            memset(&o, 0, sizeof o);
            o.threads = 1;
            if (mpq_gemv(&A, x, y, 1, &o, NULL, 0) != MPQ_OK) abort();
            free(W), free(x), free(y);
        }
        mpq_packed_free(&A);
    }
    mpq_st_close(f);
    free(al);
    return 0;
}
