// util/bulk_copy.cuh - the pieces of Hopper's bulk copies that the
// standalone CUDA probes share (bench/stage_stream.cu,
// test/gpu/cluster_probe.cu): a check of every runtime call, and on sm_90
// and later an mbarrier's init, expected bytes and parity wait, the fence
// before copies into shared memory, and a bulk copy of contiguous bytes
// completing on an mbarrier, as mpq_cuda.cu issues them
// (which keeps its own, so that it stays one file).
#ifndef MPQ_UTIL_BULK_COPY_CUH
#define MPQ_UTIL_BULK_COPY_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// A runtime call that must succeed: else the program (PROBE_NAME, a string
// the includer defines) says where and why, and exits with status 2.
#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s: %s:%d: %s\n", PROBE_NAME, __FILE__, __LINE__, cudaGetErrorString(e_));                \
            exit(2);                                                                                                   \
        }                                                                                                              \
    } while (0)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// One arrival completes a phase; made visible to the async proxy and the cluster.
static __device__ __forceinline__ void mbar_init(uint64_t *bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// The arrival of the phase, which then waits for `bytes` of copies.
static __device__ __forceinline__ void mbar_expect(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n"
                 "}" ::"r"(smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}
// Orders this block's generic accesses to shared memory, made visible to
// the issuing thread by a barrier, before its next copies into it.
static __device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// `bytes` (a multiple of 16) from src to this block's shared memory at dst,
// both 16-byte aligned.
static __device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}
#endif

#endif
