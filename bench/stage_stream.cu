// stage_stream.cu - how fast blocks can stream a matrix through shared
// memory the way the GEMM kernel of mpq_cuda.cu does it, with nothing else
// in the kernel: each block reads contiguous chunks of `chunk` bytes into a
// ring of ns slots with Hopper's bulk copies (one thread issues a chunk,
// which completes on the slot's mbarrier; every thread waits on it, reads
// one word, then a barrier frees the slot). No arithmetic, no activations,
// no sums: what a GEMM of this structure cannot beat, set beside a plain
// grid-stride read of the same bytes (read_all: eight blocks per
// multiprocessor, the fullest read; read_floor.cu's floors take the LUT
// kernel's grid instead).
//
// Swept: chunk size, slots, blocks per multiprocessor (forced through the
// shared memory a block asks for) and three ways of cutting the work: four
// chunks per block (a GEMM block at batch 16 on 8192x8192, many blocks),
// one wave of blocks each taking a contiguous run of chunks, or one wave
// with the chunks dealt round-robin. The bytes: 36 MiB (about an 8192x8192
// code copy), four copies rotated so that the L2 (50-60 MB) holds none.
//
// Usage: bench_stage_stream. sm_90 and later only (elsewhere it says so and
// stops).
#define PROBE_NAME "bench_stage_stream"
#include "bulk_copy.cuh"

#include <algorithm>

namespace
{

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
constexpr int kSlots = 8; // the most slots a block may ask for
#endif

// Block b takes chunks b per, b per + 1, ... (round_robin 0) or b, b +
// gridDim.x, ... (round_robin 1), `per` of them or up to nchunks.
__global__ void __launch_bounds__(256)
    stream_chunks(const char *base, int chunk, int per, int nchunks, int ns, int round_robin, unsigned *sink)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) char ring[];
    __shared__ uint64_t bars[kSlots];
    const int tid = threadIdx.x;
    if (tid < ns) mbar_init(&bars[tid]);
    __syncthreads();
    auto index = [&](int k) {
        return round_robin ? (long)blockIdx.x + (long)k * gridDim.x : (long)blockIdx.x * per + k;
    };
    int mine = 0; // chunks of this block
    while (mine < per && index(mine) < nchunks) mine++;
    auto issue = [&](int k) {
        if (k >= mine || tid != 0) return;
        const int sl = k % ns;
        proxy_fence();
        mbar_expect(&bars[sl], (unsigned)chunk);
        bulk_copy(ring + (size_t)sl * chunk, base + index(k) * (size_t)chunk, (unsigned)chunk, &bars[sl]);
    };
    for (int k = 0; k < ns - 1; k++) issue(k);
    unsigned acc = 0;
    for (int k = 0; k < mine; k++) {
        issue(k + ns - 1); // into the slot freed by the barrier that ended the last step
        const int sl = k % ns;
        mbar_wait(&bars[sl], (unsigned)(k / ns) & 1u);
        acc ^= reinterpret_cast<const unsigned *>(ring + (size_t)sl * chunk)[tid];
        __syncthreads();
    }
    if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc; // the reads must stay; the store almost never happens
#else
    (void)base, (void)chunk, (void)per, (void)nchunks, (void)ns, (void)round_robin, (void)sink;
#endif
}

// The plain floor: every thread four 16-byte loads in flight, grid-stride.
__global__ void __launch_bounds__(256) read_all(const uint4 *__restrict__ p, size_t n16, unsigned *sink)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;
}

} // namespace

int main()
{
    int dev = 0, sms = 0, major = 0, optin = 0, per_sm = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9) {
        printf("bench_stage_stream: bulk copies need sm_90 or later; nothing measured\n");
        return 0;
    }
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    const size_t bytes = (size_t)36 << 20;
    const int copies = 4;
    char *buf = nullptr;
    unsigned *sink = nullptr;
    CK(cudaMalloc(&buf, bytes * copies));
    CK(cudaMemset(buf, 1, bytes * copies));
    CK(cudaMalloc(&sink, 1 << 20));
    const int dyn_max = optin - 128; // room for the static mbarriers
    CK(cudaFuncSetAttribute(stream_chunks, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn_max));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // median over 7 runs of 20 launches, each launch on the next copy: us per launch
    auto time_us = [&](auto launch) {
        float t[7];
        for (int r = 0; r < 7; r++) {
            CK(cudaEventRecord(e0));
            for (int i = 0; i < 20; i++) launch(buf + (size_t)(i % copies) * bytes);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            t[r] = ms * 1000.0f / 20.0f;
        }
        std::sort(t, t + 7);
        return t[3];
    };
    printf("%s, %d SMs; %zu MiB, %d copies rotated\n", prop.name, sms, bytes >> 20, copies);
    const float floor_us = time_us(
        [&](const char *b) { read_all<<<sms * 8, 256>>>(reinterpret_cast<const uint4 *>(b), bytes / 16, sink); });
    CK(cudaGetLastError());
    printf("read_all: %.2f us, %.0f GB/s\n", floor_us, bytes / floor_us / 1e3);
    printf("chunk_KiB slots blocks/SM chunks/block blocks round_robin      us    GB/s  x read_all\n");
    const int chunk_kib[] = {8, 16, 32, 44};
    for (int ck : chunk_kib)
        for (int ns = 2; ns <= 6; ns += ns < 4 ? 1 : 2)
            for (int bps = 1; bps <= 4; bps *= 2) {
                const int chunk = ck * 1024, smem = std::min(dyn_max, per_sm / bps - 1024 - 128);
                if (ns * chunk > smem) continue;
                const int nchunks = (int)(bytes / chunk);
                for (int mode = 0; mode < 3; mode++) { // 4 a block; one wave, runs; one wave, round-robin
                    const int grid = mode == 0 ? (nchunks + 3) / 4 : sms * bps;
                    const int per = mode == 0 ? 4 : (nchunks + grid - 1) / grid;
                    const float t = time_us([&](const char *b) {
                        stream_chunks<<<grid, 256, smem>>>(b, chunk, per, nchunks, ns, mode == 2, sink);
                    });
                    CK(cudaGetLastError());
                    printf("%9d %5d %9d %12d %6d %11d %7.2f %7.0f %10.2f\n", ck, ns, bps, per, grid, mode == 2, t,
                           bytes / t / 1e3, t / floor_us);
                }
            }
    cudaFree(buf);
    cudaFree(sink);
    return 0;
}
