// mpq_cuda.cu - the CUDA backend of mpq: see mpq_cuda.h for what is in.
#include "mpq_cuda.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

namespace {

struct cuda_ctx {
    int device;
    cudaStream_t stream;
};

struct cuda_handle {
    mpq_packed view;  // host view; its pointers refer to host memory
    void *dbuf;       // the same buffer in device memory
    size_t bytes;
};

mpq_status map_error(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return MPQ_OK;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice: return MPQ_ERR_NODEVICE;
    case cudaErrorMemoryAllocation: return MPQ_ERR_NOMEM;
    default: return MPQ_ERR_DEVICE;
    }
}

mpq_status upload(void *ctx, const mpq_packed *A, void **handle)
{
    cuda_ctx *c = static_cast<cuda_ctx *>(ctx);
    if (!c || !A || !handle || !A->buf || A->bytes == 0) return MPQ_ERR_ARG;
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return map_error(e);
    cuda_handle *h = static_cast<cuda_handle *>(malloc(sizeof(cuda_handle)));
    if (!h) return MPQ_ERR_NOMEM;
    h->view = *A;
    h->view.owned = 0;
    h->bytes = A->bytes;
    h->dbuf = nullptr;
    e = cudaMalloc(&h->dbuf, A->bytes);
    if (e == cudaSuccess) e = cudaMemcpyAsync(h->dbuf, A->buf, A->bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        if (h->dbuf) cudaFree(h->dbuf);
        free(h);
        return map_error(e);
    }
    *handle = h;
    return MPQ_OK;
}

void release(void *ctx, void *handle)
{
    (void)ctx;
    cuda_handle *h = static_cast<cuda_handle *>(handle);
    if (!h) return;
    cudaFree(h->dbuf);
    free(h);
}

mpq_status gemv(void *ctx, void *handle, const float *x, float *y, int batch, const mpq_gemv_opts *opts)
{
    (void)ctx;
    (void)opts;
    if (!handle || !x || !y) return MPQ_ERR_ARG;
    if (batch < 1) return MPQ_ERR_SIZE;
    return MPQ_ERR_UNSUPPORTED; // the kernels come with the CUDA backend work
}

mpq_status synchronize(void *ctx)
{
    cuda_ctx *c = static_cast<cuda_ctx *>(ctx);
    if (!c) return MPQ_ERR_ARG;
    return map_error(cudaStreamSynchronize(c->stream));
}

} // namespace

extern "C" int mpq_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

extern "C" mpq_status mpq_cuda_backend(int device, mpq_backend *b)
{
    if (!b || device < 0) return MPQ_ERR_ARG;
    if (device >= mpq_cuda_device_count()) return MPQ_ERR_NODEVICE;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return map_error(e);
    cuda_ctx *c = static_cast<cuda_ctx *>(malloc(sizeof(cuda_ctx)));
    if (!c) return MPQ_ERR_NOMEM;
    c->device = device;
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c);
        return map_error(e);
    }
    memset(b, 0, sizeof *b);
    b->name = "cuda";
    b->caps = 0; // no packed format is multiplied on the GPU yet
    b->ctx = c;
    b->upload = upload;
    b->release = release;
    b->gemv = gemv;
    b->synchronize = synchronize;
    return MPQ_OK;
}

extern "C" void mpq_cuda_backend_destroy(mpq_backend *b)
{
    if (!b || !b->ctx) return;
    cuda_ctx *c = static_cast<cuda_ctx *>(b->ctx);
    cudaStreamDestroy(c->stream);
    free(c);
    memset(b, 0, sizeof *b);
}
