// cluster_probe.cu - whether compute-sanitizer's racecheck reports hazards
// on the mbarriers of a kernel launched in thread block clusters where no
// block touches another block's mbarrier. The clustered end of the wgmma
// kernel (bench/results/NOTES.md, "Where a wgmma product's time goes")
// drew "barrier operation" hazards on the mbarriers of cluster rank 0 from
// threads of ranks 1 to 3, with right and deterministic outputs; this
// kernel has the same pieces and nothing else, so that racecheck's answer
// on it says whether such reports come from the pattern or from the tool.
//
// Each block streams nst stages of `chunk` 32-bit words through a ring of
// ns slots as mpq_cuda.cu's GEMM and wgmma kernels do: one thread inits
// the slots' mbarriers (fence.mbarrier_init.release.cluster), then issues
// each stage as one bulk copy (cp.async.bulk.shared::cluster with a
// CTA-local address) completing on its slot's mbarrier; every thread waits
// on it by parity, sums its words, and a block barrier frees the slot. At
// the end each thread's sum goes to shared memory; with `dsmem`, after a
// cluster barrier, each block adds the sums of the next rank of its
// cluster, read through mapa and ld.shared::cluster, and a second cluster
// barrier keeps every block's shared memory alive until all have read it.
// The sums are of integers modulo 2^32, checked against the host's.
// Variants bring in the other pieces of the wgmma kernel: stages copied
// through a tensor map (cp.async.bulk.tensor, rows of 256 words, a box a
// stage), or half through the tensor map and half by a bulk copy on the
// same mbarrier, as the wgmma kernel takes its activations and codes; and
// the launch as a programmatic dependent launch (griddepcontrol.wait after
// the first stages are issued) behind a launch of the same kernel.
//
// Usage: cluster_probe [CASE]: the cases (cluster size, slots, dsmem, way
// of copying, dependent launch) are printed with their results; CASE runs
// one of them alone (for racecheck, one report per case). Exit status 1 if
// any output is wrong, 2 on a CUDA error, 0 otherwise; sm_90 and later
// only (elsewhere it says so and exits 0). Measured:
// bench/results/NOTES.md, "Racecheck on clusters, alone".
#define PROBE_NAME "cluster_probe"
#include "bulk_copy.cuh"

#include <cuda.h> // CUtensorMap (the driver's function comes through the runtime)
#include <cudaTypedefs.h>

#include <vector>

namespace
{

constexpr int kThreads = 256;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
constexpr int kMaxSlots = 4;
#endif

// Stage copies: a bulk copy of the whole stage, the tensor map's box, or
// the box's first half by the tensor map and the second by a bulk copy.
enum copy_way { kBulk, kTma, kBoth };
constexpr int kRow = 256; // words of a row of the tensor map

__global__ void __launch_bounds__(kThreads)
    probe(const uint32_t *__restrict__ src, const __grid_constant__ CUtensorMap map, int nst, int chunk, int ns,
          int dsmem, int way, int pdl, uint32_t *__restrict__ out)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint32_t ring[];
    __shared__ uint64_t bars[kMaxSlots];
    __shared__ uint32_t sums[kThreads];
    const int tid = threadIdx.x;
    const uint32_t *mine = src + (size_t)blockIdx.x * nst * chunk;
    if (tid < ns) mbar_init(&bars[tid]);
    __syncthreads();
    const unsigned bytes = (unsigned)chunk * 4u;
    auto issue = [&](int k) {
        if (k >= nst || tid != 0) return;
        const int sl = k % ns;
        proxy_fence();
        mbar_expect(&bars[sl], bytes);
        uint32_t *dst = ring + (size_t)sl * chunk;
        const int rows = chunk / kRow, row0 = (int)((blockIdx.x * (size_t)nst + k) * rows);
        if (way != kBulk) // the box: rows / 2 rows for kBoth, all of them for kTma
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
                         "{%2, %3}], [%4];" ::"r"(smem_addr(dst)),
                         "l"(reinterpret_cast<uint64_t>(&map)), "r"(0), "r"(row0), "r"(smem_addr(&bars[sl]))
                         : "memory");
        if (way != kTma) {
            const int skip = way == kBoth ? chunk / 2 : 0;
            bulk_copy(dst + skip, mine + (size_t)k * chunk + skip, bytes - 4u * (unsigned)skip, &bars[sl]);
        }
    };
    for (int k = 0; k < ns - 1; k++) issue(k);
    if (pdl) { // the grid before this one wrote out: wait for it before writing
        asm volatile("griddepcontrol.launch_dependents;");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    uint32_t acc = 0;
    for (int k = 0; k < nst; k++) {
        issue(k + ns - 1); // into the slot that the barrier ending the last stage freed
        const int sl = k % ns;
        mbar_wait(&bars[sl], (unsigned)(k / ns) & 1u);
        for (int i = tid; i < chunk; i += kThreads) acc += ring[(size_t)sl * chunk + i];
        __syncthreads();
    }
    sums[tid] = acc;
    if (dsmem) {
        uint32_t rank, size;
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
        uint32_t remote, v;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                     : "=r"(remote)
                     : "r"(smem_addr(&sums[tid])), "r"((rank + 1) % size));
        asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
        acc += v;
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    }
    out[(size_t)blockIdx.x * kThreads + tid] = acc;
#else
    (void)src, (void)map, (void)nst, (void)chunk, (void)ns, (void)dsmem, (void)way, (void)pdl, (void)out;
#endif
}

struct probe_case {
    int cluster, ns, dsmem, way, pdl;
};
const probe_case kCases[] = {
    {1, 3, 0, kBulk, 0}, // no cluster: the GEMM kernel's pattern
    {4, 3, 0, kBulk, 0}, // clusters of 4, no block reads another's memory
    {4, 3, 1, kBulk, 0}, // clusters of 4, the end over the next rank's sums
    {2, 2, 1, kBulk, 0}, // clusters of 2, two slots
    {4, 3, 1, kTma, 0},  // the stages through the tensor map
    {4, 3, 1, kBoth, 0}, // half through the tensor map, half bulk, one mbarrier
    {4, 3, 1, kBoth, 1}, // the same as a programmatic dependent launch
    {1, 3, 0, kBoth, 1}, // no cluster, the tensor map and the dependent launch
};

} // namespace

int main(int argc, char **argv)
{
    const int ncases = (int)(sizeof kCases / sizeof kCases[0]);
    char *end = nullptr;
    const long only = argc > 1 ? strtol(argv[1], &end, 10) : -1;
    if (argc > 2 || (argc > 1 && (end == argv[1] || *end || only < 0 || only >= ncases))) {
        fprintf(stderr, "cluster_probe: CASE is 0 to %d\n", ncases - 1);
        return 2;
    }
    int dev = 0, major = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9) {
        printf("cluster_probe: clusters and bulk copies need sm_90 or later; nothing run\n");
        return 0;
    }
    const int blocks = 32, nst = 8, chunk = 2048; // 8 KiB a stage
    const size_t n = (size_t)blocks * nst * chunk;
    std::vector<uint32_t> host(n);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++)
        s = s * 6364136223846793005ull + 1442695040888963407ull, host[i] = (uint32_t)(s >> 32);
    uint32_t *src = nullptr, *out = nullptr;
    CK(cudaMalloc(&src, n * 4));
    CK(cudaMalloc(&out, (size_t)blocks * kThreads * 4));
    CK(cudaMemcpy(src, host.data(), n * 4, cudaMemcpyHostToDevice));
    // the tensor map: rows of kRow words, a box of a stage's rows (kTma) or half of them (kBoth)
    void *encode_fn = nullptr;
    cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode_fn, 12000, cudaEnableDefault, &q));
#else
    CK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &encode_fn, cudaEnableDefault, &q));
#endif
    if (q != cudaDriverEntryPointSuccess) {
        fprintf(stderr, "cluster_probe: no cuTensorMapEncodeTiled\n");
        return 2;
    }
    const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(encode_fn);
    CUtensorMap maps[2];
    for (int h = 0; h < 2; h++) {
        const cuuint64_t dims[2] = {(cuuint64_t)kRow, (cuuint64_t)(n / kRow)}, strides[1] = {(cuuint64_t)kRow * 4};
        const cuuint32_t box[2] = {(cuuint32_t)kRow, (cuuint32_t)(chunk / kRow / (h ? 2 : 1))}, unit[2] = {1, 1};
        if (encode(&maps[h], CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, src, dims, strides, box, unit,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
            fprintf(stderr, "cluster_probe: the tensor map was not encoded\n");
            return 2;
        }
    }
    // each thread's sum over its words of its block's stages, as the kernel takes them
    std::vector<uint32_t> own((size_t)blocks * kThreads, 0);
    for (int b = 0; b < blocks; b++)
        for (int k = 0; k < nst; k++)
            for (int i = 0; i < chunk; i++)
                own[(size_t)b * kThreads + i % kThreads] += host[((size_t)b * nst + k) * chunk + i];
    int failed = 0;
    for (int ci = 0; ci < ncases; ci++) {
        if (only >= 0 && ci != only) continue;
        const probe_case &pc = kCases[ci];
        const int smem = pc.ns * chunk * 4;
        CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CK(cudaMemset(out, 0xFF, (size_t)blocks * kThreads * 4));
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = (size_t)smem;
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)pc.cluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        const CUtensorMap &map = maps[pc.way == kBoth];
        // with pdl: twice, the second a dependent launch behind the first
        for (int r = 0; r < 1 + pc.pdl; r++) {
            cfg.numAttrs = r ? 2 : 1;
            CK(cudaLaunchKernelEx(&cfg, probe, (const uint32_t *)src, map, nst, chunk, pc.ns, pc.dsmem, pc.way, r,
                                  out));
        }
        CK(cudaDeviceSynchronize());
        std::vector<uint32_t> got((size_t)blocks * kThreads);
        CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int b = 0; b < blocks; b++) {
            const int next = b / pc.cluster * pc.cluster + (b % pc.cluster + 1) % pc.cluster;
            for (int t = 0; t < kThreads; t++) {
                const size_t i = (size_t)b * kThreads + t;
                const uint32_t want = own[i] + (pc.dsmem ? own[(size_t)next * kThreads + t] : 0u);
                bad += got[i] != want;
            }
        }
        static const char *const ways[] = {"bulk", "tensor map", "both"};
        printf("%s case %d: cluster %d, slots %d, dsmem %d, copies %s, pdl %d: %d of %zu outputs wrong\n",
               bad ? "FAIL" : "ok", ci, pc.cluster, pc.ns, pc.dsmem, ways[pc.way], pc.pdl, bad, got.size());
        failed += bad != 0;
    }
    CK(cudaFree(src));
    CK(cudaFree(out));
    return failed ? 1 : 0;
}
