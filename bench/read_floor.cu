// read_floor.cu - for bench_gemv_cuda: the time of a kernel that does
// nothing but stream the same number of bytes from device memory, launched
// the way the LUT kernel is (one wave of 256-thread blocks, programmatic
// dependent launch, copies rotating past the L2). A product cannot beat it:
// it is the floor that the fixed cost of a launch leaves at each size.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>

namespace {

__global__ void __launch_bounds__(256) read_all(const uint4 *__restrict__ p, size_t n16, unsigned *sink)
{
    asm volatile("griddepcontrol.launch_dependents;");
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) { // four 16-byte loads in flight per thread
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                         : "l"(p + i + u * stride));
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc; // the loads must stay; the store almost never happens
}

} // namespace

// Median seconds per kernel over `reps` runs of 20 back-to-back launches;
// negative when the device refuses.
extern "C" double read_floor_seconds(size_t bytes, int reps)
{
    bytes = (bytes + 15) / 16 * 16;
    const int copies = (int)(200e6 / (double)bytes) + 2;
    int dev = 0, sms = 0, per_sm = 0;
    unsigned *sink = nullptr;
    uint4 **buf = static_cast<uint4 **>(calloc((size_t)copies, sizeof(uint4 *)));
    double *t = static_cast<double *>(malloc(sizeof(double) * (size_t)reps));
    cudaStream_t s = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    double result = -1.0;
    bool ok = buf && t && cudaGetDevice(&dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
              cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, read_all, 256, 0) == cudaSuccess &&
              cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
              cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
              cudaMalloc(&sink, sizeof(unsigned) * (size_t)sms * (size_t)per_sm) == cudaSuccess;
    for (int c = 0; ok && c < copies; c++)
        ok = cudaMalloc(&buf[c], bytes) == cudaSuccess && cudaMemset(buf[c], c, bytes) == cudaSuccess;
    if (ok) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        cfg.gridDim = dim3((unsigned)(sms * (per_sm < 2 ? per_sm : 2))); // as many blocks as the LUT kernel's wave
        cfg.blockDim = dim3(256);
        cfg.stream = s;
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int call = 0;
        for (int r = -1; ok && r < reps; r++) { // r = -1: warm-up
            ok = cudaEventRecord(e0, s) == cudaSuccess;
            for (int k = 0; ok && k < 20; k++, call++)
                ok = cudaLaunchKernelEx(&cfg, read_all, (const uint4 *)buf[call % copies], bytes / 16, sink) == cudaSuccess;
            float ms = 0.0f;
            ok = ok && cudaEventRecord(e1, s) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
                 cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
            if (r >= 0) t[r] = ms * 1e-3 / 20;
        }
        if (ok) {
            std::sort(t, t + reps);
            result = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        }
    }
    for (int c = 0; buf && c < copies; c++) cudaFree(buf[c]);
    cudaFree(sink);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    free(buf), free(t);
    return result;
}
