/* mpq_cuda.h - the CUDA backend of mpq.

   Fills the mpq_backend dispatch table of mpq.h for one CUDA device:

       mpq_backend gpu;
       if (mpq_cuda_backend(0, &gpu) != MPQ_OK) mpq_backend_cpu(&gpu);  // fall back

   What it does:
   - upload copies a packed matrix (bit-plane or MXINT, with permutations,
     column scales, sparse part and rotation) to device memory as it is,
     plus a small
     table of record offsets and plane counts (8 bytes per record of 16 rows
     x group columns); where every group (the last one too) is a multiple of
     32 columns it also builds a copy of the weights' integer codes in 4-bit
     fields (8-bit where a row is wider than 4 bits) for the tensor cores:
     4 or 8 more bits per weight of device memory (without room for it the
     matrix is uploaded without it, and the other kernels take its batches);
     on Hopper, for the wgmma kernel, each row's exponent and its per-group
     constants, 8 bytes per row and group (0.5 bits per weight at groups of
     128 columns; without room for them the kernel works them out itself);
   - gemv: a rotated matrix's input goes through V first (one kernel,
     rotate_input); which kernel runs which batch is one table, kRules in
     mpq_cuda.cu (THE BATCH -> KERNEL RULE): lookup tables in shared
     memory for the smallest batches, the GEMM kernel on the code copy
     from MPQ_CUDA_GEMM_BATCH to MPQ_CUDA_GEMM_MAX (activations in fp16,
     each group of each vector first scaled by a power of two into the
     fp16 range; on Hopper, from MPQ_CUDA_WG_BATCH to MPQ_CUDA_WG_MAX,
     the wgmma kernel instead), the MMA kernel on the code copy (float
     activations kept to about 22 bits) where the GEMM kernel does not
     take the matrix, fp16 dequantization and cuBLAS (fp32 accumulation)
     beyond, and a plain kernel that decodes every weight for groups the
     others do not take. On
     the fp16 path the activations are rounded to fp16 unscaled, so a vector
     with an entry past 65504 gets inf or NaN outputs there, as in an engine
     that holds activations in fp16;
   - mpq_gemv_opts.a8 (8-bit activations, as mpq.h defines them): the
     GEMM and MMA kernels on int8 tensor cores (u8 codes times int8
     activations, int32 sums scaled once per group) and the LUT kernel with
     integer tables (the activations quantized inside it) where they apply,
     else the activations quantized and dequantized first and the kernels
     above; MPQ_ERR_UNSUPPORTED on the fp16-weights backend below;
   - x and y may be device pointers (the call is then asynchronous on the
     backend's stream: synchronize before reading y) or host pointers (staged
     through device buffers; the call returns with y written); they must
     not overlap (MPQ_ERR_ARG); host memory given to pin (mpq_backend) is
     page-locked (cudaHostRegister, for every device), so that those copies
     go by DMA with no staging copy in the driver; pinning a range that is
     pinned already is MPQ_ERR_ARG (ranges that only share a page are not);
   - gemv_n (mpq_backend): in host memory x is copied once, the products
     run one after another, their outputs come back in order and the call
     returns when the last is written; all in device memory it is
     asynchronous, as n calls of gemv; the maps' columns must agree
     (MPQ_ERR_SIZE); each y is bit for bit what gemv writes;
   - products on the backend's stream use programmatic dependent launch
     (sm_90 and later): a product starts loading its (immutable,
     backend-owned) weights while the kernel before it on the stream
     finishes, and reads x only once that kernel is complete, so stream
     order holds as usual (build with -DMPQ_CUDA_PDL=0 for plain launches);
   - every CUDA and cuBLAS error is an mpq_status; a machine without a GPU
     gets MPQ_ERR_NODEVICE from mpq_cuda_backend, never a crash;
   - the library is built for sm_80 (A100), sm_86 (RTX 30, A10), sm_89
     (L4, L40S, RTX 40) and sm_90a (H100, H200: the wgmma kernel needs its
     architecture-specific instructions), plus compute_90 PTX that newer
     GPUs compile at load (meson option gpu_archs; the PTX has no wgmma, so
     there, as with a build without sm_90a, the GEMM kernel runs those
     batches); a device before sm_80, or one the build has no code for,
     gets MPQ_ERR_UNSUPPORTED from mpq_cuda_backend.
   One backend (its stream and scratch buffers) serves one thread at a time.
   Link with the program's MPQ_IMPLEMENTATION translation unit and cuBLAS. */
#ifndef MPQ_CUDA_H_INCLUDED
#define MPQ_CUDA_H_INCLUDED

#include "mpq.h"

/* The largest batch the tensor-core kernel takes (in pieces of 16 vectors)
   on a matrix with the code copy that the GEMM kernel below does not take
   (groups past 256 columns), and with 8-bit activations; larger batches
   dequantize to fp16 and multiply with cuBLAS. The crossover, measured on
   an H200, lies between 40 and 44 (bench/results/NOTES.md). */
#ifndef MPQ_CUDA_MMA_MAX
#define MPQ_CUDA_MMA_MAX 40
#endif

/* Batches from MPQ_CUDA_GEMM_BATCH to MPQ_CUDA_GEMM_MAX run on the GEMM
   kernel (weights streamed once per output tile of up to 64 vectors,
   exact codes times fp16 activations on the tensor cores, fp32 sums) on a
   matrix with the code copy and groups of at most 256 columns. Measured on
   an H200 (bench/results/NOTES.md, "The GEMM kernel"), against what ran
   these batches before: 1.17-1.35x the MMA kernel at batches 3 to 6,
   1.2-1.4x at 8, 1.4-2.2x at 9 to 15; 0.90-1.40x fp16 dequantization +
   cuBLAS at 96 and 128 (1.12-1.14x over the three shapes), which is
   faster from 256 on. Batches 1 and 2 stay on the lookup tables (at
   batch 2 the GEMM kernel was slower on five of six shapes, faster only on
   8192x28672). */
#ifndef MPQ_CUDA_GEMM_BATCH
#define MPQ_CUDA_GEMM_BATCH 3
#endif
#ifndef MPQ_CUDA_GEMM_MAX
#define MPQ_CUDA_GEMM_MAX 128
#endif

/* On Hopper (sm_90a code: H100, H200) batches MPQ_CUDA_WG_BATCH to
   MPQ_CUDA_WG_MAX run on the wgmma kernel ahead of the GEMM kernel: the
   same output tiles on the warpgroup tensor cores, the weights made fp16
   in registers (one rounding of each weight), on a matrix with the code
   copy, groups of at most 256 columns and every scale exact in fp16 after
   one power of two per row (else the rows below run it). Measured on an
   H200 at 3.25 bits (bench/results/NOTES.md, "Activations through a
   tensor map"), against the kernels the rule would run otherwise, on four
   shapes: 1.05-1.22x the GEMM kernel at batch 24 (the GEMM kernel's tiles
   of 32 vectors start at 17), 0.80-0.95x at 16; against fp16 + cuBLAS
   at 1024, 0.87-1.04x (faster on one shape of four). */
#ifndef MPQ_CUDA_WG_BATCH
#define MPQ_CUDA_WG_BATCH 17
#endif
#ifndef MPQ_CUDA_WG_MAX
#define MPQ_CUDA_WG_MAX 512
#endif

/* With 8-bit activations (mpq_gemv_opts.a8) the GEMM kernel runs batches
   MPQ_CUDA_GEMM_A8_BATCH to MPQ_CUDA_GEMM_A8_MAX on the int8 tensor cores
   (the activations quantized once per product, the codes' sums exact in
   int32, scaled once per group in fp32), on the same matrices. Measured on
   an H200 (bench/results/NOTES.md, "8-bit activations on the GEMM
   kernel"): at batch 2 0.93-1.45x the LUT kernel with integer tables
   (faster on four shapes of six, the four largest; slower on 4096x4096
   and 4096x14336), 1.03-1.24x the 8-bit MMA kernel at batches 3 to 8,
   1.19-1.97x what ran 16 to 128 before (that kernel, or the activations
   dequantized onto the float kernels); at 256 as fast as fp16
   dequantization + cuBLAS (0.97-1.03x), at 1024 0.60-0.67x. */
#ifndef MPQ_CUDA_GEMM_A8_BATCH
#define MPQ_CUDA_GEMM_A8_BATCH 2
#endif
#ifndef MPQ_CUDA_GEMM_A8_MAX
#define MPQ_CUDA_GEMM_A8_MAX 128
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *b for CUDA device `device` (0-based). MPQ_ERR_NODEVICE when there
   is no such device or no driver; MPQ_ERR_DEVICE for other CUDA errors.
   On success release it with mpq_cuda_backend_destroy. */
mpq_status mpq_cuda_backend(int device, mpq_backend *b);
void mpq_cuda_backend_destroy(mpq_backend *b);

/* The same backend (name "cuda-fp16") holding float16 weights instead, the
   baseline of end-to-end timings: upload dequantizes each packed matrix
   once into a resident fp16 copy (2 bytes per weight; the packed buffer
   stays for its column permutation), and every product, batch 1 included,
   is cuBLAS's fp16 GEMM with fp32 accumulation, as an engine with fp16
   weights runs it (activations rounded to fp16 as well). skip_planes > 0
   is MPQ_ERR_UNSUPPORTED (the weights are fixed at upload). Released with
   mpq_cuda_backend_destroy. */
mpq_status mpq_cuda_backend_fp16(int device, mpq_backend *b);

/* Number of CUDA devices, 0 when there is no driver or no GPU. */
int mpq_cuda_device_count(void);

/* The backend's stream (a cudaStream_t), for callers that order their own
   work or events with the products; NULL for a backend that is not CUDA's. */
void *mpq_cuda_stream(const mpq_backend *b);

#ifdef __cplusplus
}
#endif
#endif
