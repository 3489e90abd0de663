// mpq_cuda.cu - the CUDA backend of mpq: see mpq_cuda.h for what is in.
//
// Which kernel runs which batch is one table, kRules (THE BATCH -> KERNEL
// RULE, beside gemv_device); the kernels are described here.
//
// LUT KERNEL (small batches; every format with group % 32 == 0): one
// launch per product, for any mix of widths. B is the batch rounded up to
// 1, 2, 4, 8.
//
//   Grid. A slice is 512 / B columns (64 / B chunks of 8 per vector). A
//   block takes a column part of one or more slices (512 columns in all
//   where the matrix allows) and a row block of `tpb` tiles of 16 rows,
//   sized so that one wave of blocks fills every multiprocessor. For each
//   slice it builds, in shared memory, the 256-entry table of every chunk
//   for every vector, T_c[p] = sum_k (bit k of p ? +1 : -1) x~[8c + k],
//   with x~ gathered through p_col and scaled by col_scale (the fused table
//   building of the design notes): 64 KB of float32, built once per slice
//   and used by every tile of the row block.
//
//   Lookups. Warp w takes tiles w, w + 8, ... of the row block, two steps
//   per tile and slice. In a step a lane holds one 16-byte load per plane:
//   4 rows x 32 columns (one quad) of one plane; the 4 lanes of a quad take
//   its 4 chunks in rotated order and the table puts step S's chunks of
//   vector v in words 32 S + v 32 / B + c, so the 32 lanes of every lookup
//   read 32 different banks. The table address of a byte is one byte
//   permute (PRMT) of the plane word with a per-lane key: a lookup is
//   PRMT, LDS, FADD. Plane sums are weighted by 2^i (planes under
//   skip_planes are not even loaded when a tile has one width), scaled by
//   the row's s^ and offset by z^ times the quad's activation sum. The next
//   step's loads are in flight (registers, one step ahead) while a step is
//   looked up; registers hold up to 4, 6 or 8 planes (three variants, by
//   the widest row of the matrix).
//
//   Sums. A part of one slice writes its per-row sums to a scratch buffer;
//   longer parts first add up their slices in shared memory. The last block
//   of a row block to finish adds the parts in a fixed order
//   (deterministic), adds the sparse part, and scatters through p_row.
//
//   8-bit activations: the same kernel (A8) quantizes each slice's
//   activations itself and fills the tables with integers, see gemv_lut.
//
//   Launch. Programmatic dependent launch (MPQ_CUDA_PDL, default 1; sm_90
//   and later, plain stream order before): a launch's blocks locate and
//   load their first records, the column sources and the column scales
//   while the grid before it retires, and wait (griddepcontrol.wait) before
//   reading x or touching the scratch sums, which the grid before may still
//   use.
//
// MMA KERNEL (groups and the last group of whole quads, any mix of widths):
// the codes of a device copy in the CODE LAYOUT on the tensor cores, see
// gemv_mma; up to 16 vectors a launch. Its cost hardly depends on the
// batch; the LUT kernel's grows with B (it runs batch 3 as 4), and the two
// cross between batch 2 and 3 on the H100 (bench/results/NOTES.md). It
// runs the batches of the GEMM kernel's range on matrices that kernel does
// not take, and 8-bit activations.
//
// GEMM KERNEL (batches MPQ_CUDA_GEMM_BATCH .. MPQ_CUDA_GEMM_MAX; groups of
// whole quads up to 256 columns): the code copy streamed once per output
// tile of 256 rows and up to 64 vectors, see gemm_codes; with 8-bit
// activations (MPQ_CUDA_GEMM_A8_BATCH .. MPQ_CUDA_GEMM_A8_MAX) the same
// kernel on the int8 tensor cores.
//
// WGMMA KERNEL (sm_90a, batches MPQ_CUDA_WG_BATCH .. MPQ_CUDA_WG_MAX, ahead
// of the GEMM kernel on the same matrices): the GEMM kernel's tiles on
// Hopper's warpgroup tensor cores, the weights made fp16 in registers, see
// gemm_wg.
//
// OTHER PATHS: groups that are not a multiple of 32 columns (tails of pairs
// and singles inside every group) use a plain kernel, one thread per row and
// vector, which decodes every weight; larger batches dequantize to fp16
// (rows in original order, columns in packed order; from the code copy
// where there is one, a block per tile staged through shared memory, see
// dequant_codes), gather the activations through p_col into fp16, and
// multiply with cuBLAS (fp32 accumulate).
//
// 8-BIT ACTIVATIONS (mpq_gemv_opts.a8): the activations quantized as
// mpq_quantize_act8 does, in the matrix's groups (x~ = x[p_col] col_scale,
// s^_a = fp16(max |x~| / 127), q = rne(x~ / s^_a) clamped to +-127), as the
// CPU's a8 product does. On a matrix with the code copy: the GEMM kernel
// (gemm_rows8) or the MMA kernel on int8 (mma.sync m16n8k32, u8 codes
// times s8 activations, int32 sums), one k32 product per quad where float
// activations take two k16 ones (four in the MMA kernel: two k steps, hi
// and lo); a group's int32 sum is scaled once by s^ s^_a (MixLLM's
// two-step dequantization), and where a group's sums stay below 2^22 the
// accumulator starts at the bits of 1.5 * 2^23, so that its bits read as a
// float are 1.5 * 2^23 plus the sum (one FADD instead of a conversion);
// the MMA kernel takes a batch in one launch, pieces of 32 vectors along
// grid z, where the GEMM kernel does not take the matrix.
// The LUT kernel with integer tables, quantizing the activations of each
// slice itself (see gemv_lut). Other batches and matrices (fp16 + cuBLAS,
// faster past MPQ_CUDA_MMA_MAX than this kernel, see bench/results/NOTES.md;
// groups the LUT kernel does not take: the plain kernel) multiply the
// dequantized activations s^_a q on the float kernels (gemv_a8_float).
//
// FP16 BASELINE (mpq_cuda_backend_fp16): upload dequantizes the matrix once
// into a resident fp16 copy (w16) and drops the code copy; every product is
// gemm_f16 on it, as an engine with fp16 weights would run it.
//
// Measurements of these kernels, the variants tried and dropped, and where
// the time goes: bench/results/NOTES.md, "The CUDA kernels".
#include "mpq_cuda.h"

#include <cublas_v2.h>
#include <cuda.h>         // CUtensorMap (the driver's function comes through the runtime)
#include <cudaTypedefs.h> // its type
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Programmatic dependent launch of the LUT kernel (1) or plain stream order
// (0): see Launch above.
#ifndef MPQ_CUDA_PDL
#define MPQ_CUDA_PDL 1
#endif
// The MMA kernel takes batches from this size up to 16 (17: never).
#ifndef MPQ_CUDA_MMA_BATCH
#define MPQ_CUDA_MMA_BATCH 3
#endif

namespace
{

constexpr int kTile = MPQ_TILE_ROWS; // rows of a tile
static_assert(kTile == 16, "the lane mappings of every kernel assume tiles of 16 rows");
constexpr int kThreads = 256; // threads of a GEMV block
constexpr int kWarps = kThreads / 32;
constexpr int kWords = 64; // table words per entry index p: batch * chunks per slice
constexpr int kTableBytes = 256 * kWords * 4;
static_assert(kThreads == 4 * kWords, "the table build gives each thread a word and a quarter of its entries");

// The device-side description of an uploaded matrix.
struct dmat {
    int e8m0; // the format's record metadata (its traits row): one E8M0 byte a row, else fp16 s^ and z^
    int rows, cols, group, block_rows, ngroups, ntiles, meta;
    int uniform;         // block_rows % 16 == 0: every row of a record has its planes
    const uint8_t *data; // the records
    const uint8_t *bits; // bits map
    const uint32_t *p_row, *p_col;
    const float *cscale;
    const uint2 *rec; // (tile, group) -> {byte offset of the record / 16, planes in it}
    const uint32_t *sp_row_ptr;
    const uint16_t *sp_col16;
    const uint32_t *sp_col32;
    const uint16_t *sp_val;
    const uint8_t *codes; // the CODE LAYOUT copy (see the MMA kernel), or null
    int crec, crow;       // its bytes per record of a whole group and per tile
    // the input-side rotation V (mpq.h, "AN INCOHERENCE ROTATION"), in the packed buffer; rot_m 0: none
    const float *rot_R;
    const uint8_t *rot_sign;
    int rot_p, rot_m;
    const int *wexp;  // per row: the wgmma kernel's weight exponent R (wg_rows), or null where it does not apply
    const uint2 *wgw; // the wgmma kernel's row constants without skipped planes (wg_words), or null
};

struct cuda_ctx {
    int device, sms;
    int cc;           // compute capability, 10 major + minor (80, 86, 89, 90, ...)
    int occ[2][4][3]; // resident blocks per multiprocessor of kLut[a8][batch][widest row]
    int smem_sm, smem_reserved, mma_static, mma_dmax; // shared memory: per SM, per block, the MMA kernel's
    cudaStream_t stream;
    cublasHandle_t blas;
    // scratch, grown on demand
    void *scratch;
    size_t scratch_bytes;
    unsigned *counters;
    size_t counters_bytes;
    // device copies of host x and y (see gemv)
    float *stage;
    size_t stage_bytes;
    float *a8x; // 8-bit activations, dequantized, for the kernels that read float ones (gemv_a8_float)
    size_t a8x_bytes;
    float *rotx; // V x of a rotated matrix's batch (rotate_input), what its kernels read
    size_t rotx_bytes;
    int rot_smem;      // the most shared memory rotate_input may take (its vector: cols floats)
    int fp16_weights;  // mpq_cuda_backend_fp16: every matrix as resident fp16 weights
    int wgmma;         // the wgmma kernel's code for this device is in the build (wg_probe), tensor maps in the driver
    void *tmap_encode; // cuTensorMapEncodeTiled, from the driver (the wgmma kernel's activations)
};

struct cuda_handle {
    mpq_packed view; // host view (host pointers)
    dmat m;          // device pointers
    void *dbuf;      // the packed buffer in device memory
    void *drec;      // the record table
    void *dcodes;    // the CODE LAYOUT copy
    int *dwexp;      // the wgmma kernel's row exponents (M.wexp)
    uint2 *dwgw;     // its row constants (M.wgw)
    int fast;        // the LUT kernel applies
    int maxw;        // the largest width in the matrix
    int cb;          // code field bits of the copy: 4 or 8
    __half *w16;     // mpq_cuda_backend_fp16: the weights in fp16 (rows in original order, packed columns)
    // which kernel variant holds the widest record: up to 4, 6 or 8 planes
    int variant() const { return maxw <= 4 ? 0 : maxw <= 6 ? 1 : 2; }
};

mpq_status map_error(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return MPQ_OK;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice: return MPQ_ERR_NODEVICE;
    case cudaErrorMemoryAllocation: return MPQ_ERR_NOMEM;
    case cudaErrorNoKernelImageForDevice: // built without code for this device's architecture
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorUnsupportedPtxVersion: return MPQ_ERR_UNSUPPORTED;
    default: return MPQ_ERR_DEVICE;
    }
}

mpq_status map_blas(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return MPQ_OK;
    case CUBLAS_STATUS_ALLOC_FAILED: return MPQ_ERR_NOMEM;
    case CUBLAS_STATUS_NOT_SUPPORTED: return MPQ_ERR_UNSUPPORTED;
    default: return MPQ_ERR_DEVICE;
    }
}

// ---------------------------------------------------------------- device code

// Programmatic dependent launch inside a kernel (sm_90 and later; on older
// devices the launch attribute is off, see launch_pdl, and stream order
// alone orders the grids): let the next grid start, and wait until the grid
// before this one has finished and its writes are visible.
__device__ __forceinline__ void pdl_release()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void pdl_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// 2^e for -126 <= e <= 127 (exact, no libm); smaller e (MXINT scales of
// tiny blocks) through ldexpf.
__device__ __forceinline__ float pow2i(int e) { return e >= -126 ? __int_as_float((e + 127) << 23) : ldexpf(1.0f, e); }

// Weight of plane i for a row of width b with `skip` planes dropped
// (mpq_first_plane): 2^i for sk <= i < b, else 0.
__device__ __forceinline__ float plane_weight(int i, int b, int skip)
{
    const int sk = mpq_first_plane(b, skip);
    return (i >= sk && i < b) ? pow2i(i) : 0.0f;
}

// The (s^, z^) of row r of a record.
__device__ __forceinline__ void row_pair(const dmat &M, const uint8_t *rec, int r, int b, float &s, float &z)
{
    if (M.e8m0) {
        s = b ? pow2i((int)rec[r] - 127 - b + 1) : 0.0f;
        z = -s;
    } else {
        s = __half2float(__ushort_as_half(reinterpret_cast<const uint16_t *>(rec)[r]));
        z = __half2float(__ushort_as_half(reinterpret_cast<const uint16_t *>(rec + 32)[r]));
    }
}

__device__ __forceinline__ int width_at(const dmat &M, int row, int g)
{
    return row < M.rows ? M.bits[(size_t)(row / M.block_rows) * M.ngroups + g] : 0;
}

// Row `orow` (original coordinates) of the sparse part times x.
__device__ float sparse_dot(const dmat &M, int orow, const float *xv)
{
    float sum = 0.0f;
    if (M.sp_row_ptr)
        for (uint32_t e = M.sp_row_ptr[orow]; e < M.sp_row_ptr[orow + 1]; e++) {
            const uint32_t c = M.sp_col16 ? M.sp_col16[e] : M.sp_col32[e];
            sum += __half2float(__ushort_as_half(M.sp_val[e])) * xv[c];
        }
    return sum;
}

// 8-bit activations (mpq_quantize_act8 of mpq.h): the fp16 scale s^_a of a
// group whose largest |x~| is amax (65504 where amax / 127 is past fp16),
// and the code of x~ under it.
__device__ __forceinline__ float act8_scale(float amax)
{
    const float s = __half2float(__float2half_rn(amax / 127.0f));
    return s <= 65504.0f ? s : 65504.0f;
}
__device__ __forceinline__ float act8_code(float x, float s)
{
    return s > 0.0f ? fminf(fmaxf(rintf(x / s), -127.0f), 127.0f) : 0.0f;
}

// Table word of vector v, chunk c of the slice (entry p adds p * kWords).
// A warp step reads 32 / B chunks of each of the B vectors: step S of the
// slice owns words 32 S .. 32 S + 31, vector v words 32 / B of them. So the
// 32 lanes of one lookup instruction always read 32 different banks, and the
// second step's words are the first step's plus 32 (a constant offset).
template <int B> __device__ __forceinline__ int tword(int v, int c)
{
    constexpr int per = 32 / B; // chunks of one vector in one step
    return 32 * (c / per) + v * per + c % per;
}

// What a lane needs of the columns it reads at step S of a slice (the same
// for every tile): the group, the quad inside it, the bytes of one plane.
struct lane_cols {
    const uint2 *rec; // the record table at (tile 0, the lane's group): add tile * ngroups
    uint32_t off;     // the lane's 16 bytes of plane 0 inside a record
    uint32_t stride;  // bytes of one plane of the record
    int g;
    bool ok; // the lane's quad lies inside the matrix
};

// The loads of one warp step for one lane: 4 rows x 32 columns of every
// plane the step needs, and the rows' pairs (or E8M0 bytes) and widths.
template <int MAXP> struct step_buf {
    uint4 u[MAXP];
    uint2 sh, zh; // fp16 s^ and z^ of the 4 rows; MXINT: sh.x = their E8M0 bytes
    int np;       // planes in the record, 0: no step
    int bw;       // the 4 rows' widths, a byte each (tiles of mixed widths only)
};

// Streaming 16-byte load of packed planes (read once: keep them out of L1).
__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// Issues the loads of one step: record `rec` (offset / 16, planes) of tile
// t. In tiles of one width the planes under `skip` are not read at all.
template <int MAXP>
__device__ __forceinline__ void step_issue(const dmat &M, uint2 rec, const lane_cols &C, int t, int rq, int skip,
                                           step_buf<MAXP> &L)
{
    L.np = 0;
    if (t < 0 || rec.y == 0) return; // past the warp's tiles, or a quad outside the matrix
    const uint8_t *r = M.data + 16 * (size_t)rec.x;
    const int np = (int)rec.y;
    L.np = np;
    const uint8_t *pl = r + C.off;
    const int lo = M.uniform ? mpq_first_plane(np, skip) : 0;
#pragma unroll
    for (int i = 0; i < MAXP; i++)
        if (i >= lo && i < np) L.u[i] = ld_stream(pl + i * C.stride);
    if (M.e8m0) {
        L.sh.x = *reinterpret_cast<const uint32_t *>(r + 4 * rq);
    } else {
        L.sh = *reinterpret_cast<const uint2 *>(r + 8 * rq);
        L.zh = *reinterpret_cast<const uint2 *>(r + 32 + 8 * rq);
    }
    if (!M.uniform) {
        int bw = 0;
#pragma unroll
        for (int w = 0; w < 4; w++) bw |= width_at(M, t * kTile + 4 * rq + w, C.g) << (8 * w);
        L.bw = bw;
    }
}

__device__ __forceinline__ float half_lo(uint32_t h)
{
    return __half2float(__ushort_as_half((unsigned short)(h & 0xFFFFu)));
}
__device__ __forceinline__ float half_hi(uint32_t h)
{
    return __half2float(__ushort_as_half((unsigned short)(h >> 16)));
}

// The key of one lookup: the table address of byte j of a plane word is
// one byte permute, __byte_perm(word, key.x, key.y) = byte j * 256 (entry
// p's row of kWords words) + the chunk's word offset * 4: key.x holds the
// offset in byte 0, key.y selects key.x byte 0, word byte j, and key.x
// byte 3 (zero) twice.
__device__ __forceinline__ uint2 lut_key(int j, int word0)
{
    return make_uint2((uint32_t)(4 * word0), 0x7704u | ((uint32_t)j << 4));
}

// One plane of the lane's quad: sum[w] = sum_k T_k[byte k of row w's word]
// over the lane's four chunks (keys, in the lane's rotated order).
__device__ __forceinline__ void lut_plane(const char *Tb, const uint4 &u, const uint2 (&key)[4], float (&sum)[4])
{
    const uint32_t word[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        float s = *reinterpret_cast<const float *>(Tb + __byte_perm(word[w], key[0].x, key[0].y));
#pragma unroll
        for (int kk = 1; kk < 4; kk++)
            s += *reinterpret_cast<const float *>(Tb + __byte_perm(word[w], key[kk].x, key[kk].y));
        sum[w] = s;
    }
}

// The lookups of one step (S: which of the slice's two): plane i of row w
// adds 2^i times its plane sum, for the planes the row has and skip_planes
// keeps; then s^ times that plus z^ times the quad's activation sum. With
// 8-bit activations (A8) the tables, plane sums and xq are integers (exact,
// see gemv_lut) and s^ and z^ are first multiplied by the quad's s^_a (sa):
// fp16 times fp16, exact in float.
template <int S, int MAXP, bool A8>
__device__ __forceinline__ void step_compute(const dmat &M, const step_buf<MAXP> &L, const uint2 (&key)[4], int skip,
                                             float xq, float sa, float (&acc)[4])
{
    extern __shared__ float T[];
    const char *Tb = reinterpret_cast<const char *>(T) + 128 * S; // step S: words 32 S ..
    const int np = L.np;
    if (np == 0) return;
    float ps[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int bw[4];       // the rows' widths
    if (M.uniform) { // every row has the record's planes: one lower plane for all
        const int lo = mpq_first_plane(np, skip);
#pragma unroll
        for (int i = 0; i < MAXP; i++) {
            if (i < lo || i >= np) continue;
            float sum[4];
            lut_plane(Tb, L.u[i], key, sum);
#pragma unroll
            for (int w = 0; w < 4; w++) ps[w] = fmaf((float)(1 << i), sum[w], ps[w]);
        }
#pragma unroll
        for (int w = 0; w < 4; w++) bw[w] = np;
    } else { // rows of several widths in the tile: plane i counts where lo_w <= i < b_w
        int lo_[4];
#pragma unroll
        for (int w = 0; w < 4; w++) {
            bw[w] = (L.bw >> (8 * w)) & 255;
            lo_[w] = mpq_first_plane(bw[w], skip);
        }
#pragma unroll
        for (int i = 0; i < MAXP; i++) {
            if (i >= np) continue;
            float sum[4];
            lut_plane(Tb, L.u[i], key, sum);
#pragma unroll
            for (int w = 0; w < 4; w++) ps[w] += (i >= lo_[w] && i < bw[w]) ? (float)(1 << i) * sum[w] : 0.0f;
        }
    }
    if (M.e8m0) {
#pragma unroll
        for (int w = 0; w < 4; w++) {
            float s = bw[w] ? pow2i((int)((L.sh.x >> (8 * w)) & 255u) - 127 - bw[w] + 1) : 0.0f;
            if (A8) s *= sa;
            acc[w] += s * (ps[w] - xq);
        }
    } else {
        float s[4] = {half_lo(L.sh.x), half_hi(L.sh.x), half_lo(L.sh.y), half_hi(L.sh.y)};
        float z[4] = {half_lo(L.zh.x), half_hi(L.zh.x), half_lo(L.zh.y), half_hi(L.zh.y)};
#pragma unroll
        for (int w = 0; w < 4 && A8; w++) s[w] *= sa, z[w] *= sa;
#pragma unroll
        for (int w = 0; w < 4; w++) acc[w] += s[w] * ps[w] + z[w] * xq;
    }
}

// Called by every thread of each of the nparts blocks of a split product
// once the block has written its part's sums: counts the block in on
// *counter and says whether it is the last to arrive, which then sees every
// part's sums (and must set *counter back to 0 when done with them).
__device__ bool last_part(unsigned *counter, unsigned nparts)
{
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == nparts - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// The end of a product split over column parts: every block has written
// its per-row sums of rows r0 .. r0 + nr - 1 (a multiple of 4) for vectors
// 0 .. batch - 1 to `part` (part p of vector v, row r at p * pstride + v *
// rows16 + r); the last of the nparts blocks of this row block to finish
// (counting on *counter) adds the parts in a fixed order (deterministic),
// adds the sparse part, and scatters through p_row.
__device__ void sum_parts(const dmat &M, const float *__restrict__ x, int batch, const float *part, int nparts,
                          size_t pstride, unsigned *__restrict__ counter, float *__restrict__ y, int r0, int nr)
{
    const int tid = threadIdx.x, nthr = blockDim.x;
    const size_t rows16 = (size_t)M.ntiles * kTile; // row stride of `part`
    if (!last_part(counter, (unsigned)nparts)) return;
    for (int k = tid; k < batch * nr / 4; k += nthr) {
        const int vv = k / (nr / 4), r = r0 + 4 * (k % (nr / 4));
        int orow[4]; // loaded with the parts, not after them
#pragma unroll
        for (int w = 0; w < 4; w++) orow[w] = r + w >= M.rows ? -1 : M.p_row ? (int)M.p_row[r + w] : r + w;
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int p = 0; p < nparts; p++) {
            const float4 a = __ldcg(reinterpret_cast<const float4 *>(&part[(size_t)p * pstride + vv * rows16 + r]));
            sum.x += a.x, sum.y += a.y, sum.z += a.z, sum.w += a.w;
        }
        const float sw[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
        for (int w = 0; w < 4; w++)
            if (orow[w] >= 0)
                y[(size_t)vv * M.rows + orow[w]] = sw[w] + sparse_dot(M, orow[w], x + (size_t)vv * M.cols);
    }
    if (tid == 0) *counter = 0; // ready for the next launch
}

// The LUT kernel. Grid: x = column parts of `sps` slices (a slice is
// 512 / B columns, 64 / B chunks per vector), y = row blocks of `tpb` tiles.
// For each slice of its part a block builds the slice's tables, then every
// warp streams tiles warp, warp + 8, ... of the row block through them, two
// steps (256 / B columns each) per tile, with the next step's loads in
// flight while it looks up the current one. A part of one slice keeps its
// sums in registers; longer parts add them up in shared memory (`accs`,
// after the tables). The block's sums go to `part`; the last block of a row
// block to finish adds the parts in a fixed order (deterministic), adds the
// sparse part, and scatters through p_row.
//
// With 8-bit activations (A8) the block quantizes the slice's activations
// itself: the largest |x~| of every group the slice touches (columns of its
// first and last group outside the slice read from x as well), s^_a and the
// codes q as act8_dequant makes them; xs then holds the codes, so every
// table entry is an integer (|T| <= 8 * 127), a plane's sum over a lane's 4
// chunks too (<= 4064), and a step's sum over the planes is at most 4064 *
// (2^8 - 1) < 2^24: integers, exact in float (and FADD is twice as fast as IADD
// on sm_90), so a quad's product with a row is exact until step_compute
// scales it once by s^ s^_a (MixLLM's two-step dequantization). The sparse
// part multiplies x.
template <int B, int MAXP, bool A8>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_lut(dmat M, const float *__restrict__ x, int batch, int skip, int quad_cols, int tpb, int sps,
             float *__restrict__ part, unsigned *__restrict__ counters, float *__restrict__ y)
{
    constexpr int nch = kWords / B; // chunks per vector and slice
    constexpr int scols = nch * 8;  // columns per slice
    constexpr int qps = 8 / B;      // quads per warp step
    extern __shared__ float T[];    // 256 * kWords, then accs[B][tpb * 16] when sps > 1
    float *accs = T + 256 * kWords;
    __shared__ float xs[B][scols];
    __shared__ float qsum[B][nch / 4];
    constexpr int ngs = A8 ? scols / 32 + 1 : 1; // groups a slice can touch (A8)
    __shared__ unsigned amax[A8 ? B : 1][ngs];   // their largest |x~|, as bits
    __shared__ float ascale[A8 ? B : 1][ngs];    // their s^_a

    const int part_id = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int v = lane / (4 * qps), q = (lane / 4) % qps, rq = lane & 3;
    const int t_first = blockIdx.y * tpb, t_end = min(M.ntiles, t_first + tpb);
    const int ntw = t_end - t_first > warp ? (t_end - t_first - warp + kWarps - 1) / kWarps : 0;
    const size_t rows16 = (size_t)M.ntiles * kTile; // row stride of `part`
    const int s_first = part_id * sps, s_end = min(s_first + sps, (quad_cols + scols - 1) / scols);
    const bool many = s_end - s_first > 1;
    if (many)
        for (int k = tid; k < B * tpb * kTile; k += kThreads) accs[k] = 0.0f;

    for (int sl = s_first; sl < s_end; sl++) {
        const int c0 = sl * scols;
        // the lane's columns at the two steps, and its lookup addressing
        lane_cols C[2];
        uint2 key[4];
#pragma unroll
        for (int S = 0; S < 2; S++) {
            const int cq = S * qps + q, col = c0 + 32 * cq;
            const int g = col / M.group, qg = (col - g * M.group) / 32;
            C[S].ok = col < quad_cols;
            C[S].g = g;
            C[S].rec = M.rec + g;
            C[S].off = (uint32_t)(M.meta + 64 * qg + 16 * rq);
            C[S].stride = (uint32_t)((min(M.group, M.cols - g * M.group) + 7) / 8) * 16;
            if (S == 0)
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    const int j = (kk + rq) & 3;
                    key[kk] = lut_key(j, tword<B>(v, 4 * cq + j));
                    // opaque: under register pressure the compiler would rebuild
                    // the keys before every plane (about 20 instructions)
                    asm volatile("" : "+r"(key[kk].x), "+r"(key[kk].y));
                }
        }
        auto tile_of = [&](int k) { return k < ntw ? t_first + warp + k * kWarps : -1; };
        auto locate = [&](int k, int S) {
            const int t = tile_of(k);
            return (t >= 0 && C[S].ok) ? __ldg(C[S].rec + (size_t)t * M.ngroups) : make_uint2(0, 0);
        };

        // the slice's column sources and scales (the matrix's: read before
        // the wait below, so that only x is read after it)
        static_assert(B * scols == 2 * kThreads, "two activations of the slice per thread");
        int src[2];
        float csc[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int col = c0 + (tid + h * kThreads) % scols;
            src[h] = col < quad_cols ? (M.p_col ? (int)M.p_col[col] : col) : -1;
            csc[h] = col < quad_cols && M.cscale ? M.cscale[col] : 1.0f;
        }
        // the first step's loads go out before the tables are built
        step_buf<MAXP> L[2];
        uint2 R[2];
        R[0] = locate(0, 0);
        step_issue(M, R[0], C[0], tile_of(0), rq, skip, L[0]);
        R[1] = locate(0, 1);
        if (sl == s_first) {
            // Above this line only the packed matrix is read. With
            // programmatic dependent launch (MPQ_CUDA_PDL) the next launch may
            // start its own first loads as this grid's blocks retire, and this
            // grid waits here until the launch before it is complete: x may be
            // its output, and part and counters are shared.
            pdl_release();
            pdl_wait();
        }

        if (sl > s_first) __syncthreads(); // every warp is done with the last slice's tables
#pragma unroll
        for (int h = 0; h < 2; h++) { // activations of the slice: gather, scale, zero past the quad columns
            const int k = tid + h * kThreads, vv = k / scols;
            xs[vv][k % scols] = vv < batch && src[h] >= 0 ? x[(size_t)vv * M.cols + src[h]] * csc[h] : 0.0f;
        }
        const int g0 = c0 / M.group; // the slice's first group
        if (A8 && tid < B * ngs) amax[tid / ngs][tid % ngs] = 0u;
        __syncthreads();
        if (A8) {
            // the 32 lanes of a warp hold one quad of one vector: one group
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int k = tid + h * kThreads, vv = k / scols;
                unsigned a = __float_as_uint(fabsf(xs[vv][k % scols])); // |x~| >= 0: ordered as its bits
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) a = max(a, __shfl_xor_sync(0xffffffffu, a, o));
                if (lane == 0) atomicMax(&amax[vv][(c0 + k % scols) / M.group - g0], a);
            }
            // the columns of the first and last group outside the slice
            const int end = min(c0 + scols, quad_cols), gl = (end - 1) / M.group;
            const int nlo = c0 - g0 * M.group, nhi = min((gl + 1) * M.group, M.cols) - end, ne = nlo + nhi;
            for (int k = tid; k < batch * ne; k += kThreads) {
                const int vv = k / ne, i = k % ne, col = i < nlo ? g0 * M.group + i : end + i - nlo;
                const float xt =
                    x[(size_t)vv * M.cols + (M.p_col ? (int)M.p_col[col] : col)] * (M.cscale ? M.cscale[col] : 1.0f);
                atomicMax(&amax[vv][col / M.group - g0], __float_as_uint(fabsf(xt)));
            }
            __syncthreads();
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int k = tid + h * kThreads, vv = k / scols;
                const float sa = act8_scale(__uint_as_float(amax[vv][(c0 + k % scols) / M.group - g0]));
                xs[vv][k % scols] = act8_code(xs[vv][k % scols], sa);
            }
            if (tid < B * ngs) ascale[tid / ngs][tid % ngs] = act8_scale(__uint_as_float(amax[tid / ngs][tid % ngs]));
            __syncthreads();
        }
        // tables: thread -> one (vector, chunk) word and a quarter of the entries
        {
            const int w = tid % kWords, pq = tid / kWords;
            const int vv = w / nch, c = w % nch;
            float xv[8];
#pragma unroll
            for (int k = 0; k < 8; k++) xv[k] = xs[vv][8 * c + k];
            // lo[n] = sum_k (bit k of n ? +1 : -1) x_k over the low 4 columns,
            // by doubling: setting bit k adds 2 x_k
            float lo[16], hi4[4];
            lo[0] = -((xv[0] + xv[1]) + (xv[2] + xv[3]));
#pragma unroll
            for (int n = 1; n < 16; n++) { // k: the highest bit of n
                const int k = n >= 8 ? 3 : n >= 4 ? 2 : n >= 2 ? 1 : 0;
                lo[n] = fmaf(2.0f, xv[k], lo[n ^ 1 << k]);
            }
#pragma unroll
            for (int h = 0; h < 4; h++) {
                const int n = 4 * pq + h;
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; k++) s += (n >> k & 1) ? xv[4 + k] : -xv[4 + k];
                hi4[h] = s;
            }
            const int word = tword<B>(vv, c);
#pragma unroll
            for (int h = 0; h < 4; h++)
#pragma unroll
                for (int n = 0; n < 16; n++) T[((4 * pq + h) * 16 + n) * kWords + word] = lo[n] + hi4[h];
            // entry 255 is the chunk's sum; the 4 chunks of a quad are in 4
            // adjacent lanes (every lane of these warps has pq = 3)
            if (pq == 3) {
                float q4 = lo[15] + hi4[3];
                q4 += __shfl_xor_sync(0xffffffffu, q4, 1);
                q4 += __shfl_xor_sync(0xffffffffu, q4, 2);
                if ((c & 3) == 0) qsum[vv][c / 4] = q4;
            }
        }
        __syncthreads();
        const float xq0 = qsum[v][q], xq1 = qsum[v][qps + q];
        const float sa0 = A8 ? ascale[v][(c0 + 32 * q) / M.group - g0] : 1.0f;
        const float sa1 = A8 ? ascale[v][(c0 + 32 * (qps + q)) / M.group - g0] : 1.0f;

        for (int k = 0; k < ntw; k++) {
            const int t = tile_of(k);
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            step_issue(M, R[1], C[1], t, rq, skip, L[1]);
            R[0] = locate(k + 1, 0);
            step_compute<0, MAXP, A8>(M, L[0], key, skip, xq0, sa0, acc);
            step_issue(M, R[0], C[0], tile_of(k + 1), rq, skip, L[0]);
            R[1] = locate(k + 1, 1);
            step_compute<1, MAXP, A8>(M, L[1], key, skip, xq1, sa1, acc);
            // lanes of the same (vector, row quartet) hold parts of the same rows
#pragma unroll
            for (int off = 4; off < 4 * qps; off <<= 1)
#pragma unroll
                for (int w = 0; w < 4; w++) acc[w] += __shfl_xor_sync(0xffffffffu, acc[w], off);
            if (q == 0 && v < batch) {
                const int r = (t - t_first) * kTile + 4 * rq;
                if (many) {
                    float4 *a = reinterpret_cast<float4 *>(&accs[v * tpb * kTile + r]);
                    const float4 o = *a;
                    *a = make_float4(o.x + acc[0], o.y + acc[1], o.z + acc[2], o.w + acc[3]);
                } else {
                    *reinterpret_cast<float4 *>(
                        &part[((size_t)part_id * batch + v) * rows16 + (size_t)t_first * kTile + r]) =
                        make_float4(acc[0], acc[1], acc[2], acc[3]);
                }
            }
        }
    }
    const int r0 = t_first * kTile, nr = (t_end - t_first) * kTile; // rows of the row block, whole tiles
    if (many) {
        __syncthreads();
        for (int k = tid; k < batch * nr / 4; k += kThreads) {
            const int vv = k / (nr / 4), r = 4 * (k % (nr / 4));
            *reinterpret_cast<float4 *>(&part[((size_t)part_id * batch + vv) * rows16 + r0 + r]) =
                *reinterpret_cast<const float4 *>(&accs[vv * tpb * kTile + r]);
        }
    }

    sum_parts(M, x, batch, part, gridDim.x, (size_t)batch * M.ntiles * kTile, &counters[blockIdx.y], y, r0, nr);
}

// ------------------------------------------------------------ tensor cores
// CODE LAYOUT: the device copy the MMA kernel reads, built by `transcode` at
// upload for matrices whose groups (the last one too) are whole quads of 32
// columns; the file format and the planes the other kernels read stay as
// they are. Each weight's code u = sum_{i < b} 2^i bit_i (b: its row's
// width) sits in a field of CB bits, CB = 4 where the widest row of the
// matrix has at most 4 bits, else 8 (so a 3.25-bit matrix takes 4 bits per
// weight more on the device). Unit (tile t, group g) is one record of crec
// bytes (r_g: fewer for a narrower last group, crow - (ngroups - 1) crec,
// crow being a tile's bytes over all groups). The copy is row blocks of
// kCodeTiles tiles (the last one padded with zero records); in a row block
// the records of group g lie side by side, tile after tile, so record (t,
// g) starts at byte (t / kCodeTiles) kCodeTiles crow + g kCodeTiles crec +
// (t % kCodeTiles) r_g (code_offset), and the records of a row block over
// a range of groups, what a GEMM stage reads, are one contiguous range. A
// record:
//   header: the packed record's metadata (M.meta bytes: fp16 s^ then z^ of
//           the 16 rows, or their E8M0 bytes), then the 16 rows' widths, a
//           byte each;
//   codes:  for each quad of the group, 32 lanes x 2 CB bytes: lane (m, c)
//           = (lane / 4, lane % 4) holds the 16 codes of its mma fragments,
//           tile rows 2m + rr at columns c + 4 (2 S + h) + 16 e of the quad
//           (rr, S, h, e in {0, 1}); CB = 4: 32-bit word S, nibble rr + 2 h +
//           4 e; CB = 8: word 2 S + rr, byte 2 h + e.
// A lane's A fragment of k step S then comes out of one word with one
// LOP3 (nibbles) or PRMT (bytes) and one HFMA2 per register (code_frags).
constexpr int kCodeTiles = 16; // tiles of a row block of the CODE LAYOUT

// Byte offset of record (tile t, group g) in the CODE LAYOUT copy.
__host__ __device__ inline size_t code_offset(const dmat &M, int t, int g)
{
    const int rg = g == M.ngroups - 1 ? M.crow - g * M.crec : M.crec;
    return (size_t)(t / kCodeTiles) * kCodeTiles * M.crow + (size_t)g * kCodeTiles * M.crec +
        (size_t)(t % kCodeTiles) * rg;
}
//
// MMA KERNEL (batches from MPQ_CUDA_MMA_BATCH up to 16 on a matrix with a
// code copy, where they lie below MPQ_CUDA_GEMM_BATCH or the GEMM kernel
// does not take the matrix; any mix of widths): codes multiplied on the tensor cores
// (mma.sync m16n8k16, fp16 in, fp32 accumulate), the batch's vectors as the
// 8 columns of the product (two products per code fragment, vectors 0..7 and
// 8..15, for batches past 8). About one instruction per register of 2
// weights whatever the width, against the LUT kernel's lookup per vector
// and plane byte.
//
//   Codes. With planes lo .. b - 1 kept (lo = mpq_first_plane(b, skip)), the
//   weight is s^ Q + z^ with Q = sum_{lo <= i < b} 2^i (2 bit_i - 1) = 2 u'
//   - C, u' = u without its lowest lo bits, C = 2^b - 2^lo. A field masked
//   to u' and ORed into the fp16 pattern of 1024 reads 1024 + u' (1024 + 16
//   u' for a high nibble); one HFMA2 maps that to 2 u' - (C - C % 2), an
//   integer below 512 in magnitude, exact in fp16 (C itself may be odd,
//   2048 + C then not an fp16 number); the odd 1 goes to the epilogue as
//   s^ times the group's activation sum, subtracted from z^'s.
//
//   Fragments. mma row m (0..7) is tile row 2 m and row m + 8 tile row 2 m +
//   1. The k order inside a quad is free (the activations follow it): for
//   k16 step S of the quad, k = 2 c + 8 h + e (c = lane % 4) is column c + 4
//   (2 S + h) + 16 e.
//
//   Activations. x (gathered through p_col, times col_scale) is split into
//   fp16 hi + lo parts, x = 2^E (hi + lo) with a power of two E per vector
//   and group that puts max |x| in [2^14, 2^15): two products per k step,
//   about 22 bits of x kept (fp32 tables keep 24). mma_prep builds them once
//   per product in fragment order, with every group's sum (for z^), one
//   block per group; each block of the MMA kernel copies its column part
//   into shared memory. Vectors past the batch are zeros, so that the
//   fragment addresses are constants.
//
//   Units. A warp's unit of work is a pair of tiles (32 rows) and one
//   group: the two tiles' code fragments are multiplied by the same
//   activation fragments (one shared-memory load serves both), and their
//   products are independent chains in flight together. The hi and lo
//   products of a k step add into one accumulator.
//
//   Streaming. Each warp streams its units' records, whole, into a ring of
//   kMmaRing unit slots (two records each) in shared memory with cp.async,
//   kMmaRing - 1 units ahead (the first ones before the dependent wait);
//   code words are read from there. A table in shared memory gives each
//   row's masks and HFMA2 constants by width. The sums of a column part go
//   through `part` and sum_parts, as in the LUT kernel.
#ifndef MPQ_CUDA_MMA_RING
#define MPQ_CUDA_MMA_RING 2
#endif
constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaPair = 2;                 // tiles per unit
constexpr int kMmaRing = MPQ_CUDA_MMA_RING; // units per warp: kMmaRing - 1 in flight while one is multiplied
constexpr int kMmaFragBytes = 64 * 1024;    // the most x fragments of one column part (see launch_mma)
constexpr int kMmaBlocks1 = 3;              // resident blocks per multiprocessor the kernel is built for (batch <= 8)

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronous (cp.async; L1 bypassed).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 8-bit activations: codes (u8, 4 per register) times int8 activations,
// int32 accumulate.
__device__ __forceinline__ void mma_16832(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// a * b + c for half2 words (in code_frags every result is an exact integer).
__device__ __forceinline__ uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c)
{
    const __half2 r = __hfma2(*reinterpret_cast<const __half2 *>(&a), *reinterpret_cast<const __half2 *>(&b),
                              *reinterpret_cast<const __half2 *>(&c));
    return *reinterpret_cast<const uint32_t *>(&r);
}

__device__ __forceinline__ uint32_t half2_of(float v) { return 0x00010001u * __half_as_ushort(__float2half_rn(v)); }

// How a lane turns its two rows' fields (rr = 0: tile row 2m, 1: 2m + 1)
// into 2 u' - (C - odd): a mask keeping the fields' bits lo and up, and the
// HFMA2's factor and addend (both half2 words), from a table of code_row
// entries by row parity and width (0: past the matrix, whose codes are 0).
struct code_rows {
    uint32_t mask[2], mul[2], add[2];
};

// The HFMA2's factor for a row of parity rr, twice in a half2 word: 2, or
// for the high nibbles of CB = 4 (16 times too large) 0.125 (fp16 0x4000,
// 0x3000).
template <int CB> __host__ __device__ constexpr uint32_t code_mul(int rr)
{
    return CB == 4 && rr ? 0x30003000u : 0x40004000u;
}

// {mask, factor, addend, C % 2} for a row of parity rr and width b.
template <int CB> __device__ uint4 code_row(int rr, int b, int skip)
{
    const int lo = b ? mpq_first_plane(b, skip) : 0, C = b ? (1 << b) - (1 << lo) : 0;
    if (CB == 4) { // rr = 1 reads its nibbles 16 times too large
        const uint32_t keep = (0xFu << lo) & 0xFu;
        return make_uint4((keep << (4 * rr)) * 0x00010001u, code_mul<4>(rr),
                          half2_of(-(float)((rr ? 128 : 2048) + C - (C & 1))), (uint32_t)(C & 1));
    }
    return make_uint4(((0xFFu << lo) & 0xFFu) * 0x01010101u, code_mul<8>(rr), half2_of(-(float)(2048 + C - (C & 1))),
                      (uint32_t)(C & 1));
}

// The block's table of code_row by (row parity, width), filled by its
// first threads (read after the block's next barrier).
template <int CB> __device__ __forceinline__ void code_row_table(uint4 (&rtab)[2][MPQ_MAX_BITS + 1], int skip)
{
    const int tid = threadIdx.x;
    if (tid < 2 * (MPQ_MAX_BITS + 1))
        rtab[tid / (MPQ_MAX_BITS + 1)][tid % (MPQ_MAX_BITS + 1)] =
            code_row<CB>(tid / (MPQ_MAX_BITS + 1), tid % (MPQ_MAX_BITS + 1), skip);
}

// The A fragments of k steps 0 and 1 of one quad from the lane's code words
// at p (CODE LAYOUT): register 0 row 2m, h = 0; 1 row 2m + 1, h = 0; 2 row
// 2m, h = 1; 3 row 2m + 1, h = 1; the two halves of a register e = 0, 1.
template <int CB> __device__ __forceinline__ void code_frags(const char *p, const code_rows &R, uint32_t (&a)[2][4])
{
    if (CB == 4) {
        const uint2 w = *reinterpret_cast<const uint2 *>(p);
        const uint32_t ws[2] = {w.x, w.y};
#pragma unroll
        for (int S = 0; S < 2; S++) {
            const uint32_t W = ws[S], Wh = W >> 8;
            a[S][0] = hfma2_bits((W & R.mask[0]) | 0x64006400u, R.mul[0], R.add[0]);
            a[S][1] = hfma2_bits((W & R.mask[1]) | 0x64006400u, R.mul[1], R.add[1]);
            a[S][2] = hfma2_bits((Wh & R.mask[0]) | 0x64006400u, R.mul[0], R.add[0]);
            a[S][3] = hfma2_bits((Wh & R.mask[1]) | 0x64006400u, R.mul[1], R.add[1]);
        }
    } else {
        const uint4 w = *reinterpret_cast<const uint4 *>(p);
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int S = 0; S < 2; S++) { // bytes e = 0, 1 over 0x64: the fp16 pattern of 1024 + u'
            const uint32_t m0 = ws[2 * S] & R.mask[0], m1 = ws[2 * S + 1] & R.mask[1];
            a[S][0] = hfma2_bits(__byte_perm(m0, 0x64646464u, 0x4140), R.mul[0], R.add[0]);
            a[S][1] = hfma2_bits(__byte_perm(m1, 0x64646464u, 0x4140), R.mul[1], R.add[1]);
            a[S][2] = hfma2_bits(__byte_perm(m0, 0x64646464u, 0x4342), R.mul[0], R.add[0]);
            a[S][3] = hfma2_bits(__byte_perm(m1, 0x64646464u, 0x4342), R.mul[1], R.add[1]);
        }
    }
}

// With 8-bit activations: the u8 A fragment of one quad (k32) from the
// lane's code words at p, fields masked to u' (keep[rr]: the kept bits of
// row 2m + rr in every byte): register 0 row 2m, step 0; 1 row 2m + 1, step
// 0; 2 and 3 the same for step 1. Byte j holds (h, e) = (j % 2, j / 2) of
// 4-bit fields (nibble rr + 2 h + 4 e of word S), (j / 2, j % 2) of 8-bit
// ones (byte 2 h + e of word 2 S + rr); mma_prep orders the activations so.
template <int CB>
__device__ __forceinline__ void code_frags8(const char *p, const uint32_t (&keep)[2], uint32_t (&a)[4])
{
    if (CB == 4) {
        const uint2 w = *reinterpret_cast<const uint2 *>(p);
        a[0] = w.x & keep[0], a[1] = (w.x >> 4) & keep[1], a[2] = w.y & keep[0], a[3] = (w.y >> 4) & keep[1];
    } else {
        const uint4 w = *reinterpret_cast<const uint4 *>(p);
        a[0] = w.x & keep[0], a[1] = w.y & keep[1], a[2] = w.z & keep[0], a[3] = w.w & keep[1];
    }
}

// The kept bits of a code field of width b with `skip` planes dropped, in
// every byte (code_frags8's keep; 0 for width 0), and C = 2^b - 2^lo.
template <int CB> __device__ __forceinline__ uint32_t code_keep8(int b, int skip, int &C)
{
    const int lo = b ? mpq_first_plane(b, skip) : 0;
    C = b ? (1 << b) - (1 << lo) : 0;
    return b ? (((1u << CB) - 1u) << lo & ((1u << CB) - 1u)) * 0x01010101u : 0u;
}

// A word of four int8 activation codes in the byte order of cb-bit code
// fields (see code_frags8): qhe the code of (h, e); byte j holds (h, e) =
// (j / 2, j % 2) for 8-bit fields, (j % 2, j / 2) for 4-bit ones.
__device__ __forceinline__ uint32_t act8_word(int q00, int q01, int q10, int q11, int cb)
{
    const uint32_t b1 = (uint32_t)((cb == 8 ? q01 : q10) & 255), b2 = (uint32_t)((cb == 8 ? q10 : q01) & 255);
    return (uint32_t)(q00 & 255) | b1 << 8 | b2 << 16 | (uint32_t)(q11 & 255) << 24;
}

// The int32 sums of mma_16832 as floats. Where a group's sums stay below
// 2^22 in magnitude (a8_magic: cb-bit codes, groups of `group` columns) the
// accumulator starts at the bits of 1.5 * 2^23 (a8_sum_start), so that its
// bits read as a float are 1.5 * 2^23 plus the sum: one FADD instead of a
// conversion (a8_sum_float).
__device__ __forceinline__ bool a8_magic(int cb, int group) { return ((1 << cb) - 1) * 127 * group < (1 << 22); }
__device__ __forceinline__ int a8_sum_start(bool magic) { return magic ? 0x4B400000 : 0; }
__device__ __forceinline__ float a8_sum_float(int d, bool magic)
{
    return magic ? __int_as_float(d) - 12582912.0f : (float)d;
}

// Builds the CODE LAYOUT copy `out` from the planes: one thread per (tile,
// quad of the matrix, lane), the first lane of a record's first quad also
// writing its header.
template <int CB> __global__ void transcode(dmat M, uint8_t *__restrict__ out)
{
    const int nqm = M.cols / 32;
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)M.ntiles * nqm * 32) return;
    const int lane = (int)(k % 32), qm = (int)(k / 32 % nqm), t = (int)(k / 32 / nqm);
    const int m = lane >> 2, c = lane & 3, g = 32 * qm / M.group, q = qm - g * (M.group / 32);
    const int gw = min(M.group, M.cols - g * M.group), hdr = M.meta + kTile;
    const uint8_t *rec = M.data + 16 * (size_t)M.rec[(size_t)t * M.ngroups + g].x;
    uint8_t *dst = out + code_offset(M, t, g);
    if (q == 0 && lane == 0) {
        for (int i = 0; i < M.meta; i++) dst[i] = rec[i];
        for (int r = 0; r < kTile; r++) dst[M.meta + r] = (uint8_t)width_at(M, t * kTile + r, g);
    }
    uint32_t w[CB == 4 ? 2 : 4] = {};
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int b = width_at(M, t * kTile + 2 * m + rr, g);
        for (int i = 0; i < b; i++) { // plane i's word of the row in this quad (BYTE LAYOUT)
            const uint32_t pw =
                *reinterpret_cast<const uint32_t *>(rec + M.meta + (size_t)i * 2 * gw + 64 * q + 4 * (2 * m + rr));
#pragma unroll
            for (int f = 0; f < 8; f++) { // f = 4 S + 2 h + e
                const int S = f >> 2, h = (f >> 1) & 1, e = f & 1;
                const uint32_t bit = pw >> (c + 4 * (2 * S + h) + 16 * e) & 1u;
                if (CB == 4)
                    w[S] |= bit << (4 * (rr + 2 * h + 4 * e) + i);
                else
                    w[2 * S + rr] |= bit << (8 * (2 * h + e) + i);
            }
        }
    }
    uint32_t *o = reinterpret_cast<uint32_t *>(dst + hdr + (size_t)q * 64 * CB + (size_t)lane * 2 * CB);
#pragma unroll
    for (int j = 0; j < (CB == 4 ? 2 : 4); j++) o[j] = w[j];
}

// The activations of the MMA kernel, prepared once per product by
// mma_prep and copied whole into each block's shared memory. Per column
// part of `gpp` groups (nv = 8 NT vectors, those past the batch zero): x
// fragments, the groups' sums [gpp][nv], then their scales [gpp][nv];
// `bytes` per part, a multiple of 16. Float activations (vb = 4 bytes per
// value): fragments [2 quads per group, gpp groups][nv][4] (uint4: hi of
// (h, e) = (0, 0), (0, 1), then (1, 0), (1, 1); then lo the same), sums of
// x, scales 2^E. 8-bit activations (vb = 1): fragments [quads per group,
// gpp groups][nv][4] (uint2: the int8 codes of k steps 0 and 1, see
// gemv_mma), sums of the codes (integers, exact in float), scales s^_a.
struct mma_part {
    int gsum, xscale, bytes;
    __host__ __device__ mma_part(int gpp, int group, int nv, int vb)
    {
        gsum = gpp * group * nv * vb;
        xscale = gsum + 4 * gpp * nv;
        bytes = (xscale + 4 * gpp * nv + 15) / 16 * 16;
    }
};

// Warps that share the groups of one pair of tiles in a row block of tpb
// tiles (2, 4 or a multiple of 8): 1 where the block has a pair per warp.
__host__ __device__ inline int mma_wpt(int tpb) { return tpb >= kMmaPair * kMmaWarps ? 1 : kMmaWarps * kMmaPair / tpb; }

// Shared memory of the MMA kernel, in bytes from the start: the part's
// mma_part block, the warps' sums [8][2][16][nv] where warps share a pair
// (wpt > 1), then the warps' rings.
struct mma_smem {
    int wsum, ring;
    __host__ __device__ mma_smem(int part_bytes, int nv, int wpt)
    {
        wsum = part_bytes;
        ring = wsum + (wpt > 1 ? 4 * kMmaWarps * kMmaPair * kTile * nv : 0);
    }
};

// One block per group and piece of nv vectors (grid y; 8-bit activations
// only, else one piece): its activations (gathered through p_col, times
// col_scale) as items k = (vector n, quad q, step S, c), each columns c + 4
// (2 S + h) + 16 e of quad q for (h, e) = (0, 0), (0, 1), (1, 0), (1, 1),
// first as floats in shared memory (their loads all out before any is
// used), then their quad sums (added in order into the group sums) and each
// vector's max |x| over the group, which sets its scale. Float activations:
// x = 2^E (hi + lo), max |x| / 2^E in [2^14, 2^15), 2^E a normal float;
// then split into fp16 hi + lo and written out (mma_part). A8: s^_a and the
// int8 codes, 4 per word in the byte order of the code fields (cb: 4 or 8
// bits, see gemv_mma), and the codes' sum.
template <int NT, bool A8>
__global__ void __launch_bounds__(kMmaThreads)
    mma_prep(dmat M, const float *__restrict__ x, int batch, int gpp, int cb, uint8_t *__restrict__ out)
{
    constexpr int nv = 8 * NT;
    extern __shared__ uint4 smem4[];
    __shared__ float xscale[nv];
    __shared__ unsigned xmax[nv];
    __shared__ int csum[nv];
    const int tid = threadIdx.x, g = blockIdx.x, gl = g % gpp;
    const int c0 = g * M.group, qpg = min(M.group, M.cols - c0) / 32;
    const mma_part P(gpp, M.group, nv, A8 ? 1 : 4);
    x += (size_t)blockIdx.y * nv * M.cols, batch -= blockIdx.y * nv;
    out += (size_t)blockIdx.y * ((M.ngroups + gpp - 1) / gpp) * P.bytes;
    uint4 *frag = smem4;
    float *qsum = reinterpret_cast<float *>(smem4 + 2 * qpg * nv * 4); // [qpg][nv]
    pdl_release();
    pdl_wait();
    if (tid < nv) xmax[tid] = 0u, csum[tid] = 0;
    const int nitems = nv * qpg * 8;
    // A thread's items share (c, S) = (ic, is) = (tid % 4, tid / 4 % 2).
    const int ic = tid & 3, is = (tid >> 2) & 1;
#pragma unroll 8
    for (int k = tid; k < nitems; k += kMmaThreads) { // independent items: the loads of 8 go out together
        const int q = (k >> 3) % qpg, n = (k >> 3) / qpg;
        float v[4];
#pragma unroll
        for (int f = 0; f < 4; f++) {
            const int col = c0 + 32 * q + ic + 4 * (2 * is + (f >> 1)) + 16 * (f & 1);
            v[f] = n < batch
                ? x[(size_t)n * M.cols + (M.p_col ? (int)M.p_col[col] : col)] * (M.cscale ? M.cscale[col] : 1.0f)
                : 0.0f;
        }
        frag[((2 * q + is) * nv + n) * 4 + ic] =
            make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    }
    __syncthreads();
    // quad sums (8 adjacent lanes, in order) and max |x| per vector
    for (int k0 = 0; k0 < nitems; k0 += kMmaThreads) {
        const int k = k0 + tid, q = (k >> 3) % qpg, n = (k >> 3) / qpg;
        const bool ok = k < nitems; // the same for the 8 lanes of a quad
        const uint4 f = ok ? frag[((2 * q + is) * nv + n) * 4 + ic] : make_uint4(0, 0, 0, 0);
        const float v[4] = {__uint_as_float(f.x), __uint_as_float(f.y), __uint_as_float(f.z), __uint_as_float(f.w)};
        float sum = (v[0] + v[1]) + (v[2] + v[3]);
        unsigned a = __float_as_uint(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
            a = max(a, __shfl_xor_sync(0xffffffffu, a, o)); // |x| >= 0: ordered as its bits
        }
        if (ok && (k & 7) == 0) {
            qsum[q * nv + n] = sum;
            atomicMax(&xmax[n], a);
        }
    }
    __syncthreads();
    uint8_t *o = out + (size_t)(g / gpp) * P.bytes;
    if (tid < nv) {
        const float amax = __uint_as_float(xmax[tid]);
        if (A8) {
            xscale[tid] = act8_scale(amax);
        } else {
            const int e = amax > 0.0f && amax <= FLT_MAX ? max(ilogbf(amax) - 14, -126) : 0;
            float sum = 0.0f;
            for (int q = 0; q < qpg; q++) sum += qsum[q * nv + tid];
            xscale[tid] = ldexpf(1.0f, e);
            reinterpret_cast<float *>(o + P.gsum)[gl * nv + tid] = sum;
        }
        reinterpret_cast<float *>(o + P.xscale)[gl * nv + tid] = xscale[tid];
    }
    __syncthreads();
    if (A8) { // item k = ((2 q + S) nv + n) 4 + c: word S of uint2 (q, n, c)
        uint32_t *ow = reinterpret_cast<uint32_t *>(o) + (size_t)gl * (M.group / 32) * nv * 8;
        for (int k = tid; k < nitems; k += kMmaThreads) {
            const int n = (k >> 2) % nv, qs = (k >> 2) / nv;
            const float s = xscale[n];
            const uint4 f = frag[k]; // (h, e) = (0, 0), (0, 1), (1, 0), (1, 1)
            const int q0 = (int)act8_code(__uint_as_float(f.x), s), q1 = (int)act8_code(__uint_as_float(f.y), s);
            const int q2 = (int)act8_code(__uint_as_float(f.z), s), q3 = (int)act8_code(__uint_as_float(f.w), s);
            ow[(((qs >> 1) * nv + n) * 4 + (k & 3)) * 2 + (qs & 1)] = act8_word(q0, q1, q2, q3, cb);
            atomicAdd(&csum[n], q0 + q1 + q2 + q3);
        }
        __syncthreads();
        if (tid < nv) reinterpret_cast<float *>(o + P.gsum)[gl * nv + tid] = (float)csum[tid];
        return;
    }
    uint4 *of = reinterpret_cast<uint4 *>(o) + (size_t)gl * (M.group / 16) * nv * 4;
    for (int k = tid; k < nitems; k += kMmaThreads) {   // hi + lo, written out in the same order
        const float inv = 1.0f / xscale[(k >> 2) % nv]; // a power of two: exact
        const uint4 f = frag[k];
        const uint32_t w[4] = {f.x, f.y, f.z, f.w};
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float v = __uint_as_float(w[i]) * inv;
            const __half h = __float2half_rn(v);
            hi[i] = __half_as_ushort(h);
            lo[i] = __half_as_ushort(__float2half_rn(v - __half2float(h)));
        }
        of[k] = make_uint4(hi[0] | hi[1] << 16, hi[2] | hi[3] << 16, lo[0] | lo[1] << 16, lo[2] | lo[3] << 16);
    }
}

// The scale s^, offset z^ (less s^ where C is odd, see Codes) and code
// constants of lane rows 2m, 2m + 1 of the record at rec (CODE LAYOUT
// header); with live false (a tile past the matrix), zeros and the
// constants of width 0, which decode every field to 0.
__device__ __forceinline__ void mma_rows(const dmat &M, const char *rec, bool live, int m,
                                         const uint4 (*rtab)[MPQ_MAX_BITS + 1], code_rows &R, float (&s)[2],
                                         float (&z)[2])
{
    const int b0 = live ? (uint8_t)rec[M.meta + 2 * m] : 0, b1 = live ? (uint8_t)rec[M.meta + 2 * m + 1] : 0;
    if (!live) {
        s[0] = s[1] = z[0] = z[1] = 0.0f;
    } else if (M.e8m0) {
        const uint32_t e = *reinterpret_cast<const uint16_t *>(rec + 2 * m);
        s[0] = b0 ? pow2i((int)(e & 255u) - 127 - b0 + 1) : 0.0f;
        s[1] = b1 ? pow2i((int)(e >> 8) - 127 - b1 + 1) : 0.0f;
        z[0] = -s[0], z[1] = -s[1];
    } else {
        const uint32_t sw = *reinterpret_cast<const uint32_t *>(rec + 4 * m);
        const uint32_t zw = *reinterpret_cast<const uint32_t *>(rec + 32 + 4 * m);
        s[0] = half_lo(sw), s[1] = half_hi(sw), z[0] = half_lo(zw), z[1] = half_hi(zw);
    }
    const uint4 R0 = rtab[0][b0], R1 = rtab[1][b1];
    R = {{R0.x, R1.x}, {R0.y, R1.y}, {R0.z, R1.z}};
    z[0] -= R0.w ? s[0] : 0.0f, z[1] -= R1.w ? s[1] : 0.0f;
}

// Grid: x = column parts of `gpp` groups, y = row blocks of `tpb` tiles
// (2, 4 or a multiple of 8). With tpb >= 16 warp w takes the pairs of
// tiles w, w + 8, ... with all the part's groups; with fewer the wpt warps
// of a pair share its groups and add up in shared memory. CB: bits of a
// code field (CODE LAYOUT). NT: blocks of 8 vectors (mma column tiles; 2
// for batches 9..16), each code fragment multiplied by all of them. A8:
// 8-bit activations (grid z: pieces of nv vectors). xprep: the parts'
// activations from mma_prep. slot: bytes of a record's copy.
template <int CB, int NT, bool A8>
__global__ void __launch_bounds__(kMmaThreads, NT == 1 ? kMmaBlocks1 : 2)
    gemv_mma(dmat M, const float *__restrict__ x, int batch, int skip, int tpb, int gpp, int slot,
             const uint8_t *__restrict__ xprep, float *__restrict__ part, unsigned *__restrict__ counters,
             float *__restrict__ y)
{
    constexpr int nv = 8 * NT;
    extern __shared__ uint4 smem4[];
    __shared__ uint4 rtab[2][MPQ_MAX_BITS + 1]; // code_row of (row parity, width)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, m = lane >> 2, c = lane & 3;
    const int G = M.group, g0 = blockIdx.x * gpp, ng = min(gpp, M.ngroups - g0);
    const int t_first = blockIdx.y * tpb, t_end = min(M.ntiles, t_first + tpb), nt = t_end - t_first;
    const int hdr = M.meta + kTile, wpt = mma_wpt(tpb);
    const mma_part P(gpp, G, nv, A8 ? 1 : 4);
    if (A8) { // the piece of vectors of grid z: its activations, outputs, sums and counters
        const size_t z = blockIdx.z;
        x += z * nv * M.cols, y += z * nv * M.rows, batch = min(nv, batch - (int)z * nv);
        xprep += z * gridDim.x * P.bytes, part += z * gridDim.x * nv * (size_t)M.ntiles * kTile;
        counters += z * gridDim.y;
    }
    // A8: the group sums' conversion to float (a8_sum_float)
    const bool magic = A8 && a8_magic(CB, G);
    const mma_smem L(P.bytes, nv, wpt);
    char *const sbase = reinterpret_cast<char *>(smem4);
    const uint4 *frag = smem4;
    const float *gsum = reinterpret_cast<const float *>(sbase + P.gsum);
    float *wsum = reinterpret_cast<float *>(sbase + L.wsum);
    char *ring = sbase + L.ring + (size_t)warp * kMmaRing * kMmaPair * slot;
    code_row_table<CB>(rtab, skip);

    // the warp's units u = (pair, group): with wpt == 1 pairs warp, warp +
    // 8, ... with every group; else one pair, every wpt-th group
    const int pair0 = warp / wpt, gshare = warp % wpt, npairs = (nt + kMmaPair - 1) / kMmaPair;
    const int npw = pair0 >= npairs ? 0 : wpt == 1 ? (npairs - pair0 + kMmaWarps - 1) / kMmaWarps : 1;
    const int gpw = ng > gshare ? (ng - gshare + wpt - 1) / wpt : 0; // groups per pair for this warp
    const int nunits = npw * gpw;
    // the (first tile, group) of the next unit to copy and of the next to
    // multiply, advanced without divisions; j counts the warp's groups of
    // the pair
    struct cursor {
        int t, g, j;
    };
    auto advance = [&](cursor &p) {
        if (++p.j == gpw)
            p.j = 0, p.t += kMmaPair * kMmaWarps, p.g = g0 + gshare;
        else
            p.g += wpt;
    };
    cursor cmul = {t_first + kMmaPair * pair0, g0 + gshare, 0}, ccopy = cmul;
    // copies the records of unit u into its ring slot (the second tile's
    // where it is inside the row block); one commit group per unit, empty
    // past the last
    auto issue = [&](int u) {
        if (u < nunits) {
            char *dst = ring + (size_t)(u % kMmaRing) * kMmaPair * slot;
            const int bytes = hdr + min(G, M.cols - ccopy.g * G) * 2 * CB;
#pragma unroll
            for (int k = 0; k < kMmaPair; k++)
                if (ccopy.t + k < t_end) {
                    const uint8_t *src = M.codes + code_offset(M, ccopy.t + k, ccopy.g);
                    for (int o = 16 * lane; o < bytes; o += 512) cp_async16(smem_addr(dst + k * slot + o), src + o);
                }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        advance(ccopy);
    };
    for (int u = 0; u < kMmaRing - 1; u++) issue(u); // the first records go out before the wait
    pdl_release();
    pdl_wait();
    // the part's activations (one more commit group: the ring's first ones
    // are complete too after the wait below, which the stream's counting of
    // groups allows)
    const uint8_t *src = xprep + (size_t)blockIdx.x * P.bytes;
    for (int o = 16 * tid; o < P.bytes; o += 16 * kMmaThreads) cp_async16(smem_addr(sbase + o), src + o);
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();

    // the stream: lane (m, c) sums rows 2m, 2m + 1 of both tiles for
    // vectors 8 j + 2c, 8 j + 2c + 1 (j < NT)
    const size_t rows16 = (size_t)M.ntiles * kTile;
    const float *xsc = reinterpret_cast<const float *>(sbase + P.xscale); // [group][nv]
    // (tile k of the pair, vector block j): (row 2m, 2c), (2m, 2c + 1), (2m + 1, 2c), (2m + 1, 2c + 1)
    float acc[kMmaPair][NT][4] = {};
    for (int u = 0; u < nunits; u++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kMmaRing - 2) : "memory");
        __syncwarp(); // every lane's copies of unit u are in; every lane is done with unit u - 1
        issue(u + kMmaRing - 1);
        const int t = cmul.t, g = cmul.g;
        const bool two = t + 1 < t_end;
        const char *rec = ring + (size_t)(u % kMmaRing) * kMmaPair * slot;
        const int gw = min(G, M.cols - g * G);
        code_rows R[kMmaPair];
        float s[kMmaPair][2], z[kMmaPair][2];
        mma_rows(M, rec, true, m, rtab, R[0], s[0], z[0]);
        mma_rows(M, rec + slot, two, m, rtab, R[1], s[1], z[1]);
        float d[kMmaPair][NT][2][4] = {}; // k steps 0 and 1: short chains, hi and lo into the same one
        int di[kMmaPair][NT][4];          // A8: sum u' q per (tile, vector block)
        float cq[kMmaPair][2];            // A8: C - C % 2 of the lane's rows
        // a lone tile decodes its own words again with the constants of width 0
        const char *cw0 = rec + hdr + 2 * CB * lane, *cw1 = cw0 + (two ? slot : 0);
        if (A8) {
            uint32_t keep[kMmaPair][2];
#pragma unroll
            for (int k = 0; k < kMmaPair; k++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int b = k == 0 || two ? (uint8_t)rec[k * slot + M.meta + 2 * m + rr] : 0;
                    int C;
                    keep[k][rr] = code_keep8<CB>(b, skip, C);
                    cq[k][rr] = (float)(C - (C & 1));
                }
#pragma unroll
            for (int k = 0; k < kMmaPair; k++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int f = 0; f < 4; f++) di[k][j][f] = a8_sum_start(magic);
            const uint2 *fr8 = reinterpret_cast<const uint2 *>(sbase) + ((g - g0) * (G / 32) * nv + m) * 4 + c;
            for (int q = 0; q < gw / 32; q++, cw0 += 64 * CB, cw1 += 64 * CB) {
                uint32_t a0[4], a1[4];
                code_frags8<CB>(cw0, keep[0], a0);
                code_frags8<CB>(cw1, keep[1], a1);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const uint2 bf = fr8[(q * nv + 8 * j) * 4];
                    mma_16832(di[0][j], a0, bf.x, bf.y);
                    mma_16832(di[1][j], a1, bf.x, bf.y);
                }
            }
        } else {
            const uint4 *fr = frag + ((g - g0) * G / 16 * nv + m) * 4 + c;
            for (int q = 0; q < gw / 32; q++, cw0 += 64 * CB, cw1 += 64 * CB) {
                uint32_t a0[2][4], a1[2][4];
                code_frags<CB>(cw0, R[0], a0);
                code_frags<CB>(cw1, R[1], a1);
#pragma unroll
                for (int S = 0; S < 2; S++)
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        const uint4 bf = fr[(2 * q + S) * nv * 4 + 32 * j];
                        mma_16816(d[0][j][S], a0[S], bf.x, bf.y);
                        mma_16816(d[1][j][S], a1[S], bf.x, bf.y);
                        mma_16816(d[0][j][S], a0[S], bf.z, bf.w);
                        mma_16816(d[1][j][S], a1[S], bf.z, bf.w);
                    }
            }
        }
#pragma unroll
        for (int k = 0; k < kMmaPair; k++)
#pragma unroll
            for (int j = 0; j < NT; j++) {
                float e[4];
                if (!A8)
#pragma unroll
                    for (int f = 0; f < 4; f++) e[f] = d[k][j][0][f] + d[k][j][1][f];
                const int n0 = 8 * j + 2 * c;
                float2 xg = *reinterpret_cast<const float2 *>(gsum + (g - g0) * nv + n0);
                const float2 sc = *reinterpret_cast<const float2 *>(xsc + (g - g0) * nv + n0);
                if (A8) { // sum Q q = 2 sum u' q - C sum q (the odd part of C is in z^), exact below 2^24
#pragma unroll
                    for (int f = 0; f < 4; f++) {
                        const float u = a8_sum_float(di[k][j][f], magic);
                        e[f] = fmaf(2.0f, u, -cq[k][f >> 1] * ((f & 1) ? xg.y : xg.x));
                    }
                    xg = make_float2(sc.x * xg.x, sc.y * xg.y); // the sum of x~ = s^_a q
                }
                acc[k][j][0] += s[k][0] * (sc.x * e[0]) + z[k][0] * xg.x;
                acc[k][j][1] += s[k][0] * (sc.y * e[1]) + z[k][0] * xg.y;
                acc[k][j][2] += s[k][1] * (sc.x * e[2]) + z[k][1] * xg.x;
                acc[k][j][3] += s[k][1] * (sc.y * e[3]) + z[k][1] * xg.y;
            }
        if (cmul.j == gpw - 1) { // the warp's last group of the pair
#pragma unroll
            for (int k = 0; k < kMmaPair; k++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int f = 0; f < 4; f++) {
                        const int n = 8 * j + 2 * c + (f & 1), r = 2 * m + (f >> 1);
                        if (n < batch && (k == 0 || two)) {
                            if (wpt == 1)
                                part[((size_t)blockIdx.x * batch + n) * rows16 + (size_t)(t + k) * kTile + r] =
                                    acc[k][j][f];
                            else
                                wsum[((warp * kMmaPair + k) * kTile + r) * nv + n] = acc[k][j][f];
                        }
                        acc[k][j][f] = 0.0f;
                    }
        }
        advance(cmul);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (wpt > 1) { // the warps of a pair add up in order
        __syncthreads();
        for (int k = tid; k < nt * kTile * batch; k += kMmaThreads) {
            const int tl = k / (kTile * batch), r = k / batch % kTile, n = k % batch, pl = tl / kMmaPair;
            float sum = 0.0f;
            for (int w = pl * wpt; w < pl * wpt + min(wpt, ng); w++)
                sum += wsum[((w * kMmaPair + tl % kMmaPair) * kTile + r) * nv + n];
            part[((size_t)blockIdx.x * batch + n) * rows16 + (size_t)(t_first + tl) * kTile + r] = sum;
        }
    }
    sum_parts(M, x, batch, part, gridDim.x, (size_t)batch * M.ntiles * kTile, &counters[blockIdx.y], y, t_first * kTile,
              nt * kTile);
}

typedef void (*mma_kernel)(dmat, const float *, int, int, int, int, int, const uint8_t *, float *, unsigned *, float *);
typedef void (*prep_kernel)(dmat, const float *, int, int, int, uint8_t *);
// [activations: float, 8-bit][vector blocks 1, 2, 4][code bits 4, 8]; no float kernel for 4 blocks
constexpr mma_kernel kMma[2][3][2] = {
    {{gemv_mma<4, 1, false>, gemv_mma<8, 1, false>}, {gemv_mma<4, 2, false>, gemv_mma<8, 2, false>}, {}},
    {{gemv_mma<4, 1, true>, gemv_mma<8, 1, true>},
     {gemv_mma<4, 2, true>, gemv_mma<8, 2, true>},
     {gemv_mma<4, 4, true>, gemv_mma<8, 4, true>}}};
constexpr prep_kernel kPrep[2][3] = {{mma_prep<1, false>, mma_prep<2, false>, nullptr},
                                     {mma_prep<1, true>, mma_prep<2, true>, mma_prep<4, true>}};

// ------------------------------------------------------------------ the GEMM
// GEMM KERNEL (batches from MPQ_CUDA_GEMM_BATCH up on a matrix with the code
// copy whose groups are at most kGemmCols columns; any mix of widths): the
// weights stream from device memory once per tile of the output into
// shared memory, their codes become exact fp16 integers in registers, and
// the tensor cores (mma.sync m16n8k16, fp16 in, fp32 accumulate; sm_80 and
// later) multiply them with a tile of the batch.
//
//   Output tile. A block takes 256 rows (kGemmTiles tiles, a pair per warp)
//   and BN = 8 NB vectors (NB = 2, 4 or 8, see launch_gemm): grid x. Grid z:
//   row blocks; grid y: parts of the columns (split-k) where the row blocks
//   and vector tiles alone leave multiprocessors idle. Blocks next to each
//   other in x read the same codes, so a batch of several vector tiles reads
//   them from device memory about once and from L2 for the others.
//
//   Stages. A stage is sg whole groups (sg = kGemmStageCols / group where
//   that is more than one, else one group): three contiguous ranges, the
//   block's records of those groups in the CODE LAYOUT, the vector tile's
//   fragments of those columns and its groups' sums and scales. Up to
//   kGemmStages stages (as many as shared memory holds, at least two) are
//   in flight, the first ones' codes issued before the dependent wait (they
//   do not depend on the grid before). On sm_90 one thread issues a stage
//   as three bulk copies (cp.async.bulk, the tensor memory accelerator)
//   that complete on the slot's mbarrier, which every thread waits on;
//   before sm_90 every thread copies 16-byte pieces with cp.async, one
//   commit group per stage. One barrier per stage frees its slot.
//
//   Weights. As in the MMA kernel (Codes): code_frags turns each field into
//   the exact integer Q' = 2 u' - (C - C % 2) in fp16, and a group's
//   products sum_k Q' x_k (fp32) are scaled once per group and row: the
//   sum += s^ (sum Q' x) + z^' (sum x), z^' = z^ less s^ where C is odd
//   (mma_rows). The weights are exact; only the activations are rounded.
//   Centered first (gemm_rows): z^' is brought within s^ of 0 by an even
//   multiple c of s^, the codes shifted by -c to match, so that both terms
//   stay near the size of the weights. Where a weight near 0 meets a huge
//   activation, the uncentered terms would each be about z^' x and cancel,
//   leaving fp32 rounding far above |w x|.
//
//   Activations. gemm_prep scales each group of each vector by a power of
//   two 2^-E that puts its largest |x~| (x gathered through p_col, times
//   col_scale) in [2^14, 2^15), so no activation overflows fp16 and each
//   down to 2^-28 of its group's largest keeps 11 significant bits, and
//   writes them once per product in fp16 in the order of the B fragments:
//   per quad of 32 columns and vector, lane c's 16 bytes are its registers
//   b0, b1 of k steps 0 and 1 (columns c + 4 f + 16 e, f = 2 S + h, e the
//   half), so a warp's read of one n8 block is 512 contiguous bytes of
//   shared memory. Also each group's sum of the fp16 values (fp32, in a
//   fixed order) and its 2^E, which the per-group scaling takes in: the sum
//   += (s^ 2^E) (sum Q' x^) + z^' (2^E sum x^). Vectors past the batch are
//   zeros. One warp per group and vector, so the preparation is spread over
//   the whole GPU.
//
//   8-bit activations (A8). gemm_prep quantizes each group of each vector
//   as act8 does and writes the int8 codes in the order of the m16n8k32 B
//   fragments (8 bytes a lane), with s^_a times the exact sum of the codes
//   and s^_a; code_frags8 masks the code fields to the kept planes (u8),
//   one mma.sync m16n8k32 (u8 x s8, int32 sums) takes a quad, and the
//   group's exact int32 sum is scaled once in fp32 (gemm_rows8): no
//   centering is needed.
//
//   Sums. With one part the block writes y itself (sparse part added,
//   scattered through p_row); with several, each writes its sums to `part`
//   as they lie in its lanes (coalesced, 512 bytes a warp and fragment)
//   and the last block of a (row block, vector tile) to finish adds them in
//   the parts' order, reading them in the same layout, and writes y:
//   deterministic either way.
constexpr int kGemmWarps = 8;
constexpr int kGemmThreads = 32 * kGemmWarps;
constexpr int kGemmTiles = kMmaPair * kGemmWarps; // 16 tiles: 256 rows per block
static_assert(kGemmTiles == kCodeTiles, "a GEMM stage is one range of the CODE LAYOUT");
constexpr int kGemmCols = 256;      // the widest group the kernel takes
constexpr int kGemmStages = 4;      // stages in flight, at most
constexpr int kGemmStageCols = 256; // columns of a stage where groups are narrower
constexpr int kGemmMaxParts = 8;    // column parts (split-k), at most (gemm_parts)
static_assert(kGemmStages >= 2 && kGemmStages <= 4, "gemm_codes waits for 0, 1 or 2 stages still out");

// Resident blocks per multiprocessor the GEMM and wgmma kernels are built
// for: two for vector tiles of 16 and 32 (a block's 8 warps alone leave the
// schedulers idle most cycles, waiting on the latency of the decoding and
// the tensor cores), one for 64 and 128 (their accumulators).
__host__ __device__ constexpr int gemm_blocks(int nb) { return nb <= 4 ? 2 : 1; }

// Bytes of a quad's activations for one vector: 32 fp16 values, or 32
// int8 codes with 8-bit activations.
__host__ __device__ constexpr int gemm_quad_bytes(bool a8) { return a8 ? 32 : 64; }

// Bytes of one stage: the codes of kGemmTiles tiles x sg records, the
// activations of sg groups for BN vectors, then the groups' sums and
// scales [sg][2][BN].
struct gemm_stage {
    int codes, sums, bytes;
    __host__ __device__ gemm_stage(int sg, int crec, int group, int bn, bool a8)
    {
        codes = kGemmTiles * sg * crec;
        sums = codes + sg * group / 32 * bn * gemm_quad_bytes(a8);
        bytes = sums + sg * bn * 8;
    }
};

// What gemm_prep writes for a product, in the scratch buffer, per vector
// tile of BN vectors (bnpad / BN of them) so that a stage's share is one
// range of each part: the B fragments [tile][quad][BN][4] (fp16: uint4;
// int8: uint2), then per group two floats [tile][group][2][BN]: the sum of
// x and the scale 2^E (fp16), or s^_a times the sum of the codes and s^_a
// (int8).
struct gemm_xp {
    size_t sums, bytes;
    __host__ __device__ gemm_xp(int cols, int ngroups, int bnpad, bool a8)
    {
        sums = (size_t)cols * bnpad * gemm_quad_bytes(a8) / 32;
        bytes = sums + (size_t)ngroups * bnpad * 8;
    }
};

// One warp per (group, vector): grid x = ngroups * bnpad / 8 blocks of 8
// warps, warp u taking group u / bnpad, vector u % bnpad. Lane l takes item
// l of the group (quad l / 4, fragment lane c = l % 4; a group of at most
// kGemmCols columns has at most 32 items): its 8 values, columns c + 4 f +
// 16 e of the quad. The group's largest |x~| (a warp maximum) sets E; the
// values times 2^-E are rounded to fp16 and written as the lane's 16-byte
// fragment, and the sum of the rounded values (each lane's in column order,
// then a fixed butterfly over the lanes) times 2^E is the group sum.
// A8 (8-bit activations): the largest |x~| sets s^_a (act8_scale), the
// values become int8 codes (act8_code) written as the lane's 8-byte
// fragment of an m16n8k32 product, word S holding k step S's four codes in
// the byte order of the code fields (cb, see code_frags8), and the group's
// two floats are s^_a times the (exact) sum of the codes, and s^_a.
template <bool A8>
__global__ void __launch_bounds__(256)
    gemm_prep(dmat M, const float *__restrict__ x, int batch, int bnpad, int bn, int cb, uint8_t *__restrict__ out)
{
    pdl_release();
    const int lane = threadIdx.x & 31, u = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (u >= M.ngroups * bnpad) return;
    const int g = u / bnpad, n = u % bnpad, vt = n / bn, nn = n % bn, ql = lane >> 2, c = lane & 3;
    const int nq = min(M.group, M.cols - g * M.group) / 32, q = g * (M.group / 32) + ql;
    const gemm_xp X(M.cols, M.ngroups, bnpad, A8);
    const bool item = ql < nq, live = item && n < batch;
    pdl_wait();
    float v[8];
    unsigned mx = 0; // max |x~| as its bits (|x| >= 0 orders as its bits; NaN above inf)
#pragma unroll
    for (int k = 0; k < 8; k++) { // k = 2 f + e
        const int col = 32 * q + c + 4 * (k >> 1) + 16 * (k & 1);
        v[k] = live ? x[(size_t)n * M.cols + (M.p_col ? (int)M.p_col[col] : col)] * (M.cscale ? M.cscale[col] : 1.0f)
                    : 0.0f;
        mx = max(mx, __float_as_uint(fabsf(v[k])));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float *gs = reinterpret_cast<float *>(out + X.sums) + ((size_t)vt * M.ngroups + g) * 2 * bn + nn;
    const size_t frag = ((size_t)vt * (M.cols / 32) + q) * bn + nn; // the lane's fragment: [frag][4]
    if (A8) {
        const float sa = act8_scale(__uint_as_float(mx));
        int code[8], sum = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) sum += code[k] = (int)act8_code(v[k], sa);
        // word S holds values 4 S .. 4 S + 3, (h, e) = (0, 0), (0, 1), (1, 0), (1, 1)
        if (item)
            reinterpret_cast<uint2 *>(out)[frag * 4 + c] = make_uint2(
                act8_word(code[0], code[1], code[2], code[3], cb), act8_word(code[4], code[5], code[6], code[7], cb));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) gs[0] = sa * (float)sum, gs[bn] = sa;
        return;
    }
    // E: the exponent of max |x~| less 14 (0 for a zero group), kept where 2^-E and 2^E are normal floats
    const int e = mx == 0u ? 0 : min(max((int)(mx >> 23 & 255u) - 127 - 14, -100), 100);
    const float inv = __int_as_float((127 - e) << 23);
    uint32_t h[4];
    float sum = 0.0f;
#pragma unroll
    for (int f = 0; f < 4; f++) {
        const __half lo = __float2half_rn(v[2 * f] * inv), hi = __float2half_rn(v[2 * f + 1] * inv);
        sum += __half2float(lo) + __half2float(hi);
        h[f] = (uint32_t)__half_as_ushort(lo) | (uint32_t)__half_as_ushort(hi) << 16;
    }
    if (item) reinterpret_cast<uint4 *>(out)[frag * 4 + c] = make_uint4(h[0], h[1], h[2], h[3]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
        const float scale = __int_as_float((127 + e) << 23);
        gs[0] = sum * scale, gs[bn] = scale;
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Hopper's bulk copies (the tensor memory accelerator, one thread issuing a
// whole range) completing on an mbarrier in shared memory.
__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
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
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}
constexpr bool kGemmBulk = true;
#else
constexpr bool kGemmBulk = false;
#endif

// The row a lane works out for its warp in gemm_rows and gemm_rows8: lane
// 16 i + r takes row r of tile i (records rec0, rec1; live1 false: tile 1
// is past the matrix, and its rows get width 0 and s^ = z^ = 0). Returns
// the row's width, with its s^ and z^ in s and z.
__device__ __forceinline__ int gemm_lane_row(const dmat &M, const char *rec0, const char *rec1, bool live1, float &s,
                                             float &z)
{
    const int lane = threadIdx.x & 31, r = lane & 15;
    const bool live = lane < 16 || live1;
    const char *rec = lane < 16 ? rec0 : rec1;
    const int b = live ? (uint8_t)rec[M.meta + r] : 0;
    s = z = 0.0f;
    if (live) row_pair(M, reinterpret_cast<const uint8_t *>(rec), r, b, s, z);
    return b;
}

// Hands each lane (m, c) the value v of its four rows, as gemm_lane_row
// spread them: out[i][rr] from lane 16 i + 2m + rr (row 2m + rr of tile i).
template <typename T> __device__ __forceinline__ void gemm_share(T v, int m, T (&out)[kMmaPair][2])
{
#pragma unroll
    for (int i = 0; i < kMmaPair; i++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) out[i][rr] = __shfl_sync(0xffffffffu, v, 16 * i + 2 * m + rr);
}

// The centering of one row: z^ less s^ where C is odd (odd: its code_row
// entry's w), then plus c s^; returns c.
__device__ __forceinline__ float gemm_center(float s, float &z, bool odd)
{
    z -= odd ? s : 0.0f;
    // 1 / s^, approximate and with a subnormal s^ (MXINT scales below 2^-126)
    // flushed to 0: any even c within the bounds keeps every value exact,
    // such an s^ only leaves z^' less well centered
    float rcp;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(rcp) : "f"(s));
    const float c = s != 0.0f ? fminf(fmaxf(2.0f * rintf(-0.5f * z * rcp), -1792.0f), 1792.0f) : 0.0f;
    z = fmaf(s, c, z);
    return c;
}

// The per-group constants of a lane's four rows (tiles 0 and 1 of its
// pair, rows 2m and 2m + 1 of each), as mma_rows gives them and then
// centered (see Weights). The four lanes of a row group need the same rows,
// so each row is worked out once per warp, by lane 16 i + r for row r of
// tile i, and handed to the others by shuffles. Centering: an even c = 2
// rint(-z^' / 2 s^), at most 1792 in magnitude, moves c s^ from the codes
// into the offset: Q' - c and z^' + c s^. The HFMA2's addend less c is an
// even integer below 4096 in magnitude and its results below 4096 (even
// past 2048), all exact in fp16. rec0, rec1: the records of tiles 0 and 1
// (live1 false: tile 1 is past the matrix, its rows get the constants of
// width 0).
template <int CB>
__device__ __forceinline__ void gemm_rows(const dmat &M, const char *rec0, const char *rec1, bool live1, int m,
                                          const uint4 (*rtab)[MPQ_MAX_BITS + 1], code_rows (&R)[kMmaPair],
                                          float (&s)[kMmaPair][2], float (&z)[kMmaPair][2])
{
    float sr, zr;
    const int b = gemm_lane_row(M, rec0, rec1, live1, sr, zr);
    const uint4 E = rtab[threadIdx.x & 1][b]; // (the row's parity is the lane's)
    const uint32_t add = half2_of(half_lo(E.z) - gemm_center(sr, zr, E.w != 0));
    uint32_t adds[kMmaPair][2], masks[kMmaPair][2];
    gemm_share(sr, m, s), gemm_share(zr, m, z), gemm_share(add, m, adds), gemm_share(E.x, m, masks);
#pragma unroll
    for (int i = 0; i < kMmaPair; i++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++)
            R[i].add[rr] = adds[i][rr], R[i].mask[rr] = masks[i][rr], R[i].mul[rr] = code_mul<CB>(rr);
}

// The wgmma kernel's per-group constants of one row: those of gemm_rows,
// with s^ and the centered z^' times 2^R of the row (p2r) as fp16 values
// s~ and z~, packed with the HFMA2's addend and the mask's first byte into
// two words: {s~ | z~ << 16, addend | mask byte << 16}. s and z: the row's
// s^ and z^ (row_pair; 0 for a row past the matrix), E: its code_row entry.
__device__ __forceinline__ uint2 wg_row_words(float s, float z, const uint4 &E, float p2r)
{
    const float c = gemm_center(s, z, E.w != 0);
    auto bits = [](float v) { return (uint32_t)__half_as_ushort(__float2half_rn(v)); };
    return make_uint2(bits(s * p2r) | bits(z * p2r) << 16, bits(half_lo(E.z) - c) | (E.x & 0xFFu) << 16);
}

// A lane's four rows' constants (tiles 0 and 1 of its pair, rows 2m and 2m
// + 1 of each) from their wg_row_words (sz, am): s~ and z~ as half2 words
// s16 and z16, the mask and addend in R. PRMT unpacks them (masks of CB = 4
// repeat bytes k, 0; of CB = 8 byte k).
template <int CB>
__device__ __forceinline__ void wg_unpack(const uint32_t (&sz)[kMmaPair][2], const uint32_t (&am)[kMmaPair][2],
                                          code_rows (&R)[kMmaPair], uint32_t (&s16)[kMmaPair][2],
                                          uint32_t (&z16)[kMmaPair][2])
{
#pragma unroll
    for (int i = 0; i < kMmaPair; i++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            s16[i][rr] = __byte_perm(sz[i][rr], 0u, 0x1010), z16[i][rr] = __byte_perm(sz[i][rr], 0u, 0x3232);
            R[i].add[rr] = __byte_perm(am[i][rr], 0u, 0x1010);
            R[i].mask[rr] = __byte_perm(am[i][rr], 0u, CB == 4 ? 0x4242 : 0x2222);
            R[i].mul[rr] = code_mul<CB>(rr);
            // kept in registers: left to itself ptxas redoes the PRMTs in
            // every quad of the group
            asm volatile("" : "+r"(s16[i][rr]), "+r"(z16[i][rr]), "+r"(R[i].add[rr]), "+r"(R[i].mask[rr]));
        }
}

// The same four rows' constants worked out by the warp from the group's
// records (p2r: the factor 2^R of the lane's own row in gemm_lane_row),
// where the matrix has no wg_words for the product's skip: each row once,
// by lane 16 i + r for row r of tile i, its two words handed to the lanes
// that need them by two shuffles.
template <int CB>
__device__ __forceinline__ void wg_group_rows(const dmat &M, const char *rec0, const char *rec1, bool live1, int m,
                                              float p2r, const uint4 (*rtab)[MPQ_MAX_BITS + 1],
                                              code_rows (&R)[kMmaPair], uint32_t (&s16)[kMmaPair][2],
                                              uint32_t (&z16)[kMmaPair][2])
{
    float sr, zr;
    const int b = gemm_lane_row(M, rec0, rec1, live1, sr, zr);
    const uint2 w = wg_row_words(sr, zr, rtab[threadIdx.x & 1][b], p2r); // (the row's parity is the lane's)
    uint32_t szs[kMmaPair][2], ams[kMmaPair][2];
    gemm_share(w.x, m, szs), gemm_share(w.y, m, ams);
    wg_unpack<CB>(szs, ams, R, s16, z16);
}

// With 8-bit activations (A8): the same four rows' kept bits of their code
// fields (keep, as code_frags8 takes them), 2 s^ and z^ - s^ C. The tensor
// cores sum u' q over a group exactly (u': the field masked to the kept
// planes, q: the activations' int8 codes), and with x~ = s^_a q and Q = 2 u'
// - C the group's sum of w x~ is (2 s^) s^_a (sum u' q) + (z^ - s^ C) s^_a
// (sum q): no centering needed.
template <int CB>
__device__ __forceinline__ void gemm_rows8(const dmat &M, const char *rec0, const char *rec1, bool live1, int skip,
                                           int m, uint32_t (&keep)[kMmaPair][2], float (&s2)[kMmaPair][2],
                                           float (&z2)[kMmaPair][2])
{
    float sr, zr;
    const int b = gemm_lane_row(M, rec0, rec1, live1, sr, zr);
    int C;
    const uint32_t kp = code_keep8<CB>(b, skip, C);
    gemm_share(2.0f * sr, m, s2), gemm_share(fmaf(-sr, (float)C, zr), m, z2), gemm_share(kp, m, keep);
}

// The GEMM kernel (see above). Grid: x = vector tiles of BN = 8 NB, y =
// column parts of spp stages, z = row blocks. sg: groups per stage; ns:
// stages in flight; bnpad: vectors of xprep (the batch rounded up to BN).
// A8: 8-bit activations on the int8 tensor cores (gemm_rows8).
template <int CB, int NB, bool A8>
__global__ void __launch_bounds__(kGemmThreads, gemm_blocks(NB))
    gemm_codes(dmat M, const float *__restrict__ x, int batch, int skip, int sg, int ns, int spp, int bnpad,
               const uint8_t *__restrict__ xprep, float *__restrict__ part, unsigned *__restrict__ counters,
               float *__restrict__ y)
{
    constexpr int BN = 8 * NB, QB = gemm_quad_bytes(A8);
    extern __shared__ uint4 smem4[];
    __shared__ uint4 rtab[2][MPQ_MAX_BITS + 1]; // code_row of (row parity, width)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ uint64_t bars[kGemmStages]; // the slots' mbarriers (bulk copies)
#endif
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, m = lane >> 2, c = lane & 3;
    const int G = M.group, hdr = M.meta + kTile, n0 = blockIdx.x * BN;
    const int nst = (M.ngroups + sg - 1) / sg, st0 = blockIdx.y * spp, nstp = min(spp, nst - st0);
    const int t0 = blockIdx.z * kGemmTiles + kMmaPair * warp; // the warp's first tile
    const bool live0 = t0 < M.ntiles, live1 = t0 + 1 < M.ntiles;
    const gemm_stage L(sg, M.crec, G, BN, A8);
    // A8: the group sums' conversion to float (a8_sum_float)
    const bool magic = A8 && a8_magic(CB, G);
    const gemm_xp X(M.cols, M.ngroups, bnpad, A8);
    char *const sbase = reinterpret_cast<char *>(smem4);
    if constexpr (!A8) code_row_table<CB>(rtab, skip); // (gemm_rows8 needs no table)

    // Stage k: groups g0 = (st0 + k) sg .. g0 + sg - 1. Its three ranges:
    // the row block's records of those groups in the CODE LAYOUT (kGemmTiles
    // sg crec bytes), the vector tile's fragments of their columns and their
    // sums and scales in xprep; only the matrix's last stage may hold fewer
    // groups, the last one narrower.
    const int last_ngs = M.ngroups - (nst - 1) * sg, last_cols = M.cols - (M.ngroups - 1) * G;
    const int last_rec = M.crow - (M.ngroups - 1) * M.crec; // r_g of the last group
    const char *csrc = reinterpret_cast<const char *>(M.codes) + code_offset(M, blockIdx.z * kGemmTiles, st0 * sg);
    const char *fsrc =
        reinterpret_cast<const char *>(xprep) + ((size_t)blockIdx.x * (M.cols / 32) + st0 * sg * G / 32) * BN * QB;
    const char *ssrc =
        reinterpret_cast<const char *>(xprep) + X.sums + ((size_t)blockIdx.x * M.ngroups + st0 * sg) * BN * 8;
    struct ranges {
        int codes, frags, sums; // bytes
    };
    auto stage_bytes = [&](int k) {
        const bool last = st0 + k == nst - 1;
        const int ngs = last ? last_ngs : sg, cols = last ? (last_ngs - 1) * G + last_cols : sg * G;
        return ranges{kGemmTiles * ((ngs - 1) * M.crec + (last ? last_rec : M.crec)), cols / 32 * BN * QB,
                      ngs * BN * 8};
    };
    auto slot_at = [&](int sl) { return sbase + sl * L.bytes; };
    // a generic copy of one range by all the block's threads (cp.async, 16 bytes each)
    auto copy_all = [&](char *dst, const char *src, int bytes) {
        for (int o = 16 * tid; o < bytes; o += 16 * kGemmThreads) cp_async16(smem_addr(dst + o), src + o);
    };
    // stage k into slot sl: the weights (which do not depend on the grid before), then the activations
    auto issue_codes = [&](int k, int sl) {
        if (k >= nstp) return;
        const ranges R = stage_bytes(k);
        const char *src = csrc + (size_t)k * kGemmTiles * sg * M.crec;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (tid == 0) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); // after the generic reads of the slot
            mbar_expect(&bars[sl], (unsigned)(R.codes + R.frags + R.sums));
            bulk_copy(slot_at(sl), src, (unsigned)R.codes, &bars[sl]);
        }
#else
        copy_all(slot_at(sl), src, R.codes);
#endif
    };
    auto issue_x = [&](int k, int sl) {
        if (k >= nstp) return;
        const ranges R = stage_bytes(k);
        const char *fs = fsrc + (size_t)k * sg * G / 32 * BN * QB, *ss = ssrc + (size_t)k * sg * BN * 8;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (tid == 0) {
            bulk_copy(slot_at(sl) + L.codes, fs, (unsigned)R.frags, &bars[sl]);
            bulk_copy(slot_at(sl) + L.sums, ss, (unsigned)R.sums, &bars[sl]);
        }
#else
        copy_all(slot_at(sl) + L.codes, fs, R.frags);
        copy_all(slot_at(sl) + L.sums, ss, R.sums);
#endif
    };
    // Bulk copies: stage k is in once its slot's mbarrier has completed the
    // phase of parity k / ns. cp.async: stage 0's codes and activations are
    // the first commit group and each later stage's one more, so once only
    // ns - 2 groups are out the stage after the one in hand is in (the
    // prologue commits ns - 1 groups, every iteration one), which the
    // barrier that ends the iteration shares with every thread.
    auto wait_next = [&]() {
        if (ns == 2)
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        else if (ns == 3)
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        else
            asm volatile("cp.async.wait_group 2;" ::: "memory");
    };
    if (kGemmBulk && tid < ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        mbar_init(&bars[tid]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
    }
    __syncthreads(); // the barriers and rtab
    for (int k = 0; k < ns - 1; k++) issue_codes(k, k);
    pdl_wait();
    for (int k = 0; k < ns - 1; k++) {
        issue_x(k, k);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    if (!kGemmBulk) {
        wait_next();
        __syncthreads();
    }

    // lane (m, c) sums rows 2m, 2m + 1 of both tiles for vectors 8 j + 2c, 8 j + 2c + 1
    float acc[kMmaPair][NB][4] = {};
    int sl_use = 0, sl_issue = ns - 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned phase = 0; // of the slots' mbarriers in this round over the slots
#endif
    for (int k = 0; k < nstp; k++) {
        issue_codes(k + ns - 1, sl_issue); // into the slot of stage k - 1, which every warp is done with
        issue_x(k + ns - 1, sl_issue);
        asm volatile("cp.async.commit_group;" ::: "memory");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        mbar_wait(&bars[sl_use], phase);
#endif
        if (live0) {
            const int ngs = st0 + k == nst - 1 ? last_ngs : sg, g0 = (st0 + k) * sg;
            const char *slot = slot_at(sl_use);
            const float *gs = reinterpret_cast<const float *>(slot + L.sums) + 2 * c;
            for (int j = 0; j < ngs; j++, gs += 2 * BN) {
                const bool lastg = g0 + j == M.ngroups - 1;
                const int rs = lastg ? last_rec : M.crec, nq = lastg ? last_cols / 32 : G / 32;
                const char *rec0 = slot + j * kGemmTiles * M.crec + kMmaPair * warp * rs;
                const char *rec1 = rec0 + (live1 ? rs : 0);
                const char *cw0 = rec0 + hdr + 2 * CB * lane, *cw1 = rec1 + hdr + 2 * CB * lane;
                if constexpr (A8) {
                    uint32_t keep[kMmaPair][2];
                    float sv[kMmaPair][2], zv[kMmaPair][2];
                    gemm_rows8<CB>(M, rec0, rec1, live1, skip, m, keep, sv, zv);
                    const uint2 *xq =
                        reinterpret_cast<const uint2 *>(slot + L.codes) + m * 4 + c + j * (G / 32) * BN * 4;
                    int d[kMmaPair][NB][4]; // the group's sum u' q (a8_sum_start)
#pragma unroll
                    for (int i = 0; i < kMmaPair; i++)
#pragma unroll
                        for (int jn = 0; jn < NB; jn++)
#pragma unroll
                            for (int f = 0; f < 4; f++) d[i][jn][f] = a8_sum_start(magic);
#pragma unroll(NB == 2 ? 4 : 1)
                    for (int q = 0; q < nq; q++) {
                        uint32_t a[kMmaPair][4];
                        code_frags8<CB>(cw0 + q * 64 * CB, keep[0], a[0]);
                        code_frags8<CB>(cw1 + q * 64 * CB, keep[1], a[1]);
#pragma unroll
                        for (int jn = 0; jn < NB; jn++) {
                            const uint2 bf = xq[q * BN * 4 + jn * 32];
#pragma unroll
                            for (int i = 0; i < kMmaPair; i++) mma_16832(d[i][jn], a[i], bf.x, bf.y);
                        }
                    }
#pragma unroll
                    for (int jn = 0; jn < NB; jn++) { // sum += (2 s^) (s^_a sum u' q) + (z^ - s^ C) (s^_a sum q)
                        const float2 xg = *reinterpret_cast<const float2 *>(gs + 8 * jn);
                        const float2 xa = *reinterpret_cast<const float2 *>(gs + BN + 8 * jn);
#pragma unroll
                        for (int i = 0; i < kMmaPair; i++)
#pragma unroll
                            for (int f = 0; f < 4; f++) {
                                const float u = a8_sum_float(d[i][jn][f], magic);
                                acc[i][jn][f] = fmaf(sv[i][f >> 1], ((f & 1) ? xa.y : xa.x) * u,
                                                     fmaf(zv[i][f >> 1], (f & 1) ? xg.y : xg.x, acc[i][jn][f]));
                            }
                    }
                    continue;
                }
                const uint4 *xq = reinterpret_cast<const uint4 *>(slot + L.codes) + m * 4 + c + j * (G / 32) * BN * 4;
                code_rows R[kMmaPair];
                float sv[kMmaPair][2], zv[kMmaPair][2];
                gemm_rows<CB>(M, rec0, rec1, live1, m, rtab, R, sv, zv);
                float d[kMmaPair][NB][4] = {}; // the group's sum Q' x^
#pragma unroll(NB == 2 ? 4 : 1)
                for (int q = 0; q < nq; q++) {
                    uint32_t a[kMmaPair][2][4];
                    code_frags<CB>(cw0 + q * 64 * CB, R[0], a[0]);
                    code_frags<CB>(cw1 + q * 64 * CB, R[1], a[1]);
#pragma unroll
                    for (int jn = 0; jn < NB; jn++) {
                        const uint4 bf = xq[q * BN * 4 + jn * 32];
#pragma unroll
                        for (int i = 0; i < kMmaPair; i++) {
                            mma_16816(d[i][jn], a[i][0], bf.x, bf.y);
                            mma_16816(d[i][jn], a[i][1], bf.z, bf.w);
                        }
                    }
                }
#pragma unroll
                for (int jn = 0; jn < NB; jn++) { // sum += (s^ 2^E) d + z^' X
                    const float2 xg = *reinterpret_cast<const float2 *>(gs + 8 * jn);
                    const float2 xe = *reinterpret_cast<const float2 *>(gs + BN + 8 * jn);
#pragma unroll
                    for (int i = 0; i < kMmaPair; i++)
#pragma unroll
                        for (int f = 0; f < 4; f++)
                            acc[i][jn][f] = fmaf(sv[i][f >> 1] * ((f & 1) ? xe.y : xe.x), d[i][jn][f],
                                                 fmaf(zv[i][f >> 1], (f & 1) ? xg.y : xg.x, acc[i][jn][f]));
                }
            }
        }
        sl_use = sl_use + 1 == ns ? 0 : sl_use + 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        phase ^= sl_use == 0;
#endif
        sl_issue = sl_issue + 1 == ns ? 0 : sl_issue + 1;
        if (!kGemmBulk) wait_next(); // stage k + 1 is in
        __syncthreads();             // and every warp is done with stage k
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    // only now may the next product's grids start: launched at the top, they
    // would hold the multiprocessors' second block slot (and all their
    // registers) while this grid still runs, and the next gemm_prep could
    // not start until this grid's blocks left (bench/results/NOTES.md)
    pdl_release();

    const int nvec = min(BN, batch - n0); // vectors of this tile
    // y from a warp's sums v (acc's layout), the sparse part added, the rows
    // scattered through p_row
    auto write_y = [&](const float(&v)[kMmaPair][NB][4]) {
#pragma unroll
        for (int jn = 0; jn < NB; jn++)
#pragma unroll
            for (int i = 0; i < kMmaPair; i++)
#pragma unroll
                for (int f = 0; f < 4; f++) {
                    const int n = 8 * jn + 2 * c + (f & 1), row = (t0 + i) * kTile + 2 * m + (f >> 1);
                    if (n >= nvec || (i == 1 && !live1) || row >= M.rows) continue;
                    const int orow = M.p_row ? (int)M.p_row[row] : row;
                    y[(size_t)(n0 + n) * M.rows + orow] =
                        v[i][jn][f] + sparse_dot(M, orow, x + (size_t)(n0 + n) * M.cols);
                }
    };
    if (gridDim.y == 1) { // one part: the block writes y
        if (live0) write_y(acc);
        return;
    }
    // Column parts: each block writes its sums as they lie in the lanes, a
    // warp's 512 contiguous bytes per (tile, vector block), at [row block]
    // [vector tile][part][warp][tile][vector block][lane]; the last block of
    // the (row block, vector tile) to finish adds the parts in their order
    // from 0, so that the result does not depend on which block that is.
    constexpr int kPart = kMmaPair * NB * 32; // float4 of a warp's sums
    float4 *const pw = reinterpret_cast<float4 *>(part) +
        (((size_t)blockIdx.z * gridDim.x + blockIdx.x) * gridDim.y * kGemmWarps + warp) * kPart + lane;
    const size_t pstride = (size_t)kGemmWarps * kPart; // between the parts of a block's sums
    if (live0)
#pragma unroll
        for (int i = 0; i < kMmaPair; i++)
#pragma unroll
            for (int jn = 0; jn < NB; jn++)
                pw[blockIdx.y * pstride + (i * NB + jn) * 32] =
                    make_float4(acc[i][jn][0], acc[i][jn][1], acc[i][jn][2], acc[i][jn][3]);
    unsigned *const counter = &counters[(size_t)blockIdx.z * gridDim.x + blockIdx.x];
    if (!last_part(counter, gridDim.y)) return;
    if (live0) {
        float sum[kMmaPair][NB][4] = {};
#pragma unroll(NB == 2 ? 4 : NB == 4 ? 2 : 1)
        for (unsigned p = 0; p < gridDim.y; p++)
#pragma unroll
            for (int i = 0; i < kMmaPair; i++)
#pragma unroll
                for (int jn = 0; jn < NB; jn++) {
                    const float4 a = __ldcg(&pw[p * pstride + (i * NB + jn) * 32]);
                    sum[i][jn][0] += a.x, sum[i][jn][1] += a.y, sum[i][jn][2] += a.z, sum[i][jn][3] += a.w;
                }
        write_y(sum);
    }
    if (tid == 0) *counter = 0; // ready for the next launch
}

typedef void (*gemm_kernel)(dmat, const float *, int, int, int, int, int, int, const uint8_t *, float *, unsigned *,
                            float *);
// [activations: fp16, int8][code bits 4, 8][vector blocks 2, 4, 8]
constexpr gemm_kernel kGemm[2][2][3] = {{{gemm_codes<4, 2, false>, gemm_codes<4, 4, false>, gemm_codes<4, 8, false>},
                                         {gemm_codes<8, 2, false>, gemm_codes<8, 4, false>, gemm_codes<8, 8, false>}},
                                        {{gemm_codes<4, 2, true>, gemm_codes<4, 4, true>, gemm_codes<4, 8, true>},
                                         {gemm_codes<8, 2, true>, gemm_codes<8, 4, true>, gemm_codes<8, 8, true>}}};

// WGMMA KERNEL (sm_90a: batches from MPQ_CUDA_WG_BATCH up on a matrix with
// the code copy, groups of at most kGemmCols columns, any mix of widths):
// the GEMM kernel's output tiles, stages and split, on Hopper's warpgroup
// tensor cores (wgmma.mma_async) with the weights made fp16 in registers.
//
//   Output tile. 256 rows and BN = 8 NB vectors (NB = 4, 8 or 16) a block,
//   two warpgroups of four warps; warp w keeps the pair of tiles of the
//   CODE LAYOUT that the GEMM kernel gives it, and warpgroup u multiplies
//   two m64nBNk16 products per k step: the first tiles of its four warps'
//   pairs, then the second ones (rows 16 w' + r of an m64 product are row
//   r of warp w' = w - 4u's tile). A from registers: the A fragment of a
//   warp's rows in a wgmma is the mma.sync m16n8k16 one, so code_frags
//   gives it as for the other kernels.
//
//   Weights. Each field becomes the centered integer Q' - c of gemm_rows,
//   then one more HFMA2 per register makes the weight itself in fp16,
//   fp16(s~ (Q' - c) + z~) with s~ = s^ 2^R and z~ = fp16((z^' + c s^)
//   2^R): one rounding of the exact product (the HFMA2 is fused) and of the
//   centered offset, which is at most s^ in magnitude, so every weight
//   keeps 11 significant bits relative to |w| + s^ of its group (the
//   centering moves at most 1792 s^, as in the GEMM kernel). R, one
//   exponent per row (wg_rows at upload), puts the row's largest |z^| +
//   s^ (2^b - 1) below 2^13; a matrix whose s~ would not be an exact normal
//   fp16 number in some group (E8M0 scales far from their rows' offsets)
//   is not taken (MPQ_ERR_UNSUPPORTED: the next row of the rule runs it).
//   The tensor cores then add over all the columns with no per-group
//   work, in fp32.
//
//   Row constants. Each row's per-group words (s~, z~, the addend, the
//   mask: wg_row_words) are worked out at upload for the product without
//   skipped planes (wg_words, 8 bytes per row and group, in the CODE
//   LAYOUT's row blocks) and copied with each stage's codes, so that a lane
//   loads its four rows' words with two 16-byte shared-memory loads. Where
//   planes are skipped, or there was no room for them, the warp works them
//   out from the records' headers (wg_group_rows), the same bits.
//
//   Activations. wg_prep scales each vector by one power of two 2^-E that
//   puts its largest |x~| in [2^14, 2^15) (x gathered through p_col, times
//   col_scale; no overflow, 11 bits kept down to 2^-28 of the largest) and
//   writes it in fp16, a row per vector with the columns of each k step
//   (16) in the k order of the A fragments (Fragments above); the tensor
//   memory accelerator copies a stage's box of it, through a tensor map,
//   into shared memory in the K-major layout with the 128-byte swizzle
//   that the B descriptor names (wg_xbytes, wg_desc). y = 2^(E - R) times
//   the sums.
//
//   Pipeline. As the GEMM kernel's: a bulk copy of each stage's codes (and one
//   of their row constants) and a tensor copy of its activations on the slot's
//   mbarrier, one barrier of the block per stage. Per quad a warpgroup decodes
//   its A fragments, fences, issues its four products and commits them as a
//   group; it then waits for the group before, so that one quad's products are
//   in flight while the next is decoded, across the end of a stage too: with
//   three slots or more a slot is refilled two stages after its own (by then
//   every product that read it is done), with two one stage after, each
//   stage's products waited for at its end.
//
//   End. The block's sums go through shared memory (every slot is free by
//   then): each thread takes four rows for a quarter of the vectors and
//   scales them by 2^(E - R), adds the sparse part and writes y, four rows
//   in one store where they are in order (wg_store): coalesced along the
//   rows, and a short loop. The GEMM kernel's end, fully unrolled from the
//   lanes' registers, took longer here than the main loop at batch 128
//   (bench/results/NOTES.md). With column parts (split-k) each block writes
//   its sums to `part` as they are, and they are added in their order from
//   0 and written the same way, deterministic: in tiles of up to kWgFuseBn
//   vectors by the last block of the row block to finish (counters), in
//   wider ones by wg_sum, a kernel of its own spread over the GPU.
//
//   Tiles and parts (launch_wg): 32 vectors up to batch 32, 64 up to 64,
//   then tiles of 128; two blocks per multiprocessor for tiles of 32 (each
//   in half the shared memory; their 8 warps alone leave the schedulers
//   waiting on the decoding's latency), one for the wider ones or where
//   two would not hold two stages each; stages of 256 columns where three
//   fit the block's shared memory, else 128; the column parts as gemm_parts
//   chooses them for that many resident blocks.

// The wgmma kernel's end stages its sums through shared memory, a row of
// kWgTileStride floats per vector (the pad spreads a warp's stores over the
// banks): wg_tile_bytes of them.
constexpr int kWgTileStride = kGemmTiles * kTile + 4;
__host__ __device__ constexpr int wg_tile_bytes(int bn) { return bn * kWgTileStride * 4; }

// Bytes of one wgmma stage: the activations of sg groups' columns for BN
// vectors (xb, a multiple of 1024 bytes: stages of 128 or 256 columns),
// then the codes of kGemmTiles tiles x sg records, then (words: the matrix's
// wg_words serve the product) the row constants of those records, from
// woff (records and constants are multiples of 16 bytes); a slot of
// `bytes` is rounded up to 1024, where the 128-byte swizzle's pattern
// repeats.
constexpr int kWgSlotAlign = 1024;
constexpr int kWgWordBytes = kGemmTiles * kTile * (int)sizeof(uint2); // a row block's constants of one group
struct wg_stage {
    int xb, woff, bytes;
    __host__ __device__ wg_stage(int sg, int crec, int group, int bn, bool words)
    {
        xb = sg * group * bn * 2;
        woff = xb + kGemmTiles * sg * crec;
        bytes = (woff + (words ? sg * kWgWordBytes : 0) + kWgSlotAlign - 1) / kWgSlotAlign * kWgSlotAlign;
    }
};

// What wg_prep writes for a product: per vector a row of xcols fp16 values
// (the columns padded with zeros to whole stages), item it = 2 kk + h of
// the row being the 8 values of k half h of k step kk in the k order of
// the A fragments (xcols * bnpad * 2 bytes), then each vector's E (int).
// The kernel reads a stage's B operand from it through a tensor map of
// three dimensions (64 values, vectors, blocks of 64 values) with the
// 128-byte swizzle: a box lands in shared memory as [block of 64 k][vector]
// [128 bytes, their 16-byte pieces permuted within each 8 vectors], the
// K-major layout with the 128-byte swizzle that the wgmma's descriptor
// names (wg_desc).
__host__ __device__ inline size_t wg_xbytes(int xcols, int bnpad) { return (size_t)xcols * bnpad * 2; }

// One block of kWgPrepThreads per vector (bnpad of them). Thread u takes
// items u, u + kWgPrepThreads, ...: item 2 kk + h is k half h of k step kk,
// the columns of k = 8 h + j (j = 2 c + e: column c + 4 (2 S + h) + 16 e of
// quad kk / 2, S = kk % 2). It loads its first kWgPrepItems items' values
// and keeps them; the largest |x~| of the vector (a block maximum) sets E;
// then the values times 2^-E are rounded to fp16 and written, 16 bytes an
// item, a warp's 32 items side by side (items past the kept ones, in
// vectors of more than kWgPrepThreads x kWgPrepItems x 8 columns, are
// loaded again).
constexpr int kWgPrepThreads = 1024, kWgPrepItems = 4;
__global__ void __launch_bounds__(kWgPrepThreads)
    wg_prep(dmat M, const float *__restrict__ x, int batch, int xcols, int bnpad, uint8_t *__restrict__ out)
{
    pdl_release();
    __shared__ unsigned red[kWgPrepThreads / 32];
    const int n = blockIdx.x, tid = threadIdx.x;
    const int nit = M.cols / 8, nitp = xcols / 8; // items of the matrix's columns, of the row
    const bool live = n < batch;
    const float *xv = x + (size_t)n * M.cols;
    // the 8 values of item it: v[2 p] column col0 + p, v[2 p + 1] column col0 + p + 16
    // (without p_col, from 16-byte aligned vectors, two 16-byte loads: col0 is a multiple of 4)
    const bool vec4 = !M.p_col && (reinterpret_cast<uintptr_t>(xv) & 15) == 0;
    auto load = [&](int it, float(&v)[8]) {
        const int kk = it >> 1, col0 = 32 * (kk >> 1) + 8 * (kk & 1) + 4 * (it & 1);
        if (!(live && it < nit)) {
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = 0.0f;
        } else if (vec4) {
            const float4 a = *reinterpret_cast<const float4 *>(xv + col0),
                         b = *reinterpret_cast<const float4 *>(xv + col0 + 16);
            v[0] = a.x, v[1] = b.x, v[2] = a.y, v[3] = b.y, v[4] = a.z, v[5] = b.z, v[6] = a.w, v[7] = b.w;
            if (M.cscale)
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] *= M.cscale[col0 + (j >> 1) + 16 * (j & 1)];
        } else
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int col = col0 + (j >> 1) + 16 * (j & 1);
                v[j] = xv[M.p_col ? (int)M.p_col[col] : col] * (M.cscale ? M.cscale[col] : 1.0f);
            }
    };
    pdl_wait();
    float v[kWgPrepItems][8];
    unsigned mx = 0; // max |x~| as its bits (NaN above inf)
#pragma unroll
    for (int k = 0; k < kWgPrepItems; k++) {
        load(tid + k * kWgPrepThreads, v[k]);
#pragma unroll
        for (int j = 0; j < 8; j++) mx = max(mx, __float_as_uint(fabsf(v[k][j])));
    }
    for (int it = tid + kWgPrepItems * kWgPrepThreads; it < nit; it += kWgPrepThreads) {
        float w[8];
        load(it, w);
#pragma unroll
        for (int j = 0; j < 8; j++) mx = max(mx, __float_as_uint(fabsf(w[j])));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((tid & 31) == 0) red[tid >> 5] = mx;
    __syncthreads();
    mx = 0;
#pragma unroll
    for (int w = 0; w < kWgPrepThreads / 32; w++) mx = max(mx, red[w]);
    const int e = mx == 0u ? 0 : min(max((int)(mx >> 23 & 255u) - 127 - 14, -100), 100);
    const float inv = __int_as_float((127 - e) << 23);
    auto store = [&](int it, const float(&w)[8]) {
        uint32_t h[4];
#pragma unroll
        for (int p = 0; p < 4; p++)
            h[p] = (uint32_t)__half_as_ushort(__float2half_rn(w[2 * p] * inv)) |
                (uint32_t)__half_as_ushort(__float2half_rn(w[2 * p + 1] * inv)) << 16;
        *reinterpret_cast<uint4 *>(out + ((size_t)n * nitp + it) * 16) = make_uint4(h[0], h[1], h[2], h[3]);
    };
#pragma unroll
    for (int k = 0; k < kWgPrepItems; k++)
        if (tid + k * kWgPrepThreads < nitp) store(tid + k * kWgPrepThreads, v[k]);
    for (int it = tid + kWgPrepItems * kWgPrepThreads; it < nitp; it += kWgPrepThreads) {
        float w[8];
        load(it, w); // zeros past the matrix's columns
        store(it, w);
    }
    if (tid == 0) reinterpret_cast<int *>(out + wg_xbytes(xcols, bnpad))[n] = e;
}

// At upload, one thread per row: the row's exponent R (see Weights) from
// its groups' headers in the code copy, and *ok cleared where some group's
// s^ 2^R is not an exact normal fp16 number (or the row's bound is not
// finite).
__global__ void wg_rows(dmat M, int *__restrict__ wexp, int *__restrict__ ok)
{
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M.rows) return;
    const int t = row / kTile, r = row % kTile;
    float bound = 0.0f;
    for (int g = 0; g < M.ngroups; g++) {
        const uint8_t *rec = M.codes + code_offset(M, t, g);
        const int b = rec[M.meta + r];
        float s, z;
        row_pair(M, rec, r, b, s, z);
        bound = fmaxf(bound, fabsf(z) + s * (float)((1 << b) - 1));
    }
    const int R = bound > 0.0f && bound <= FLT_MAX ? min(max(12 - ilogbf(bound), -100), 100) : 0;
    const float p = __int_as_float((127 + R) << 23);
    bool good = bound <= FLT_MAX && bound * p < 16384.0f;
    for (int g = 0; g < M.ngroups && good; g++) {
        const uint8_t *rec = M.codes + code_offset(M, t, g);
        const int b = rec[M.meta + r];
        float s, z;
        row_pair(M, rec, r, b, s, z);
        const float ss = s * p;
        good = ss == 0.0f || (ss >= 0x1p-14f && __half2float(__float2half_rn(ss)) == ss);
    }
    wexp[row] = R;
    if (!good) atomicAnd(ok, 0);
}

// At upload, one thread per row slot of the CODE LAYOUT's row blocks and
// group: the row's wg_row_words with no planes skipped, as the warp works
// them out in wg_group_rows (the rows of tiles past the matrix: those of
// width 0), at
// ((row block ngroups + g) kCodeTiles + tile of the block) kTile + row of
// the tile, so that a stage's constants are one range (wg_stage).
static_assert(kGemmTiles == kCodeTiles, "a stage's row block is one of the CODE LAYOUT");
template <int CB> __global__ void wg_words(dmat M, uint2 *__restrict__ out)
{
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int nrb = (M.ntiles + kCodeTiles - 1) / kCodeTiles;
    if (k >= (size_t)nrb * M.ngroups * kCodeTiles * kTile) return;
    const int r = (int)(k % kTile), tl = (int)(k / kTile % kCodeTiles);
    const size_t q = k / (kTile * kCodeTiles);
    const int g = (int)(q % M.ngroups), t = (int)(q / M.ngroups) * kCodeTiles + tl, row = t * kTile + r;
    int b = 0;
    float s = 0.0f, z = 0.0f;
    if (t < M.ntiles) {
        const uint8_t *rec = M.codes + code_offset(M, t, g);
        b = rec[M.meta + r];
        row_pair(M, rec, r, b, s, z);
    }
    const float p2r = __int_as_float((127 + (row < M.rows ? M.wexp[row] : 0)) << 23);
    out[k] = wg_row_words(s, z, code_row<CB>(r & 1, b, 0), p2r);
}

// Says whether this build holds the wgmma kernel's code for the device
// (sm_90a machine code; PTX for other targets has none).
__global__ void wg_probe(int *has)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *has = 1;
#else
    *has = 0;
#endif
}

// Where the wgmma kernel's outputs of a thread's four rows r0 + rq .. + 3
// (of nrow rows in the row block from r0) go: their rows of y (p_row; -1
// past the matrix) and exponents R, and whether the four are one 16-byte
// store: rows r0 + rq .. + 3 of y in order (no p_row), all in the matrix,
// and every vector's first one aligned (a warp's 4-byte stores at a
// 16-byte stride write each 32-byte sector four times).
struct wg_rows4 {
    int orow[4], R[4];
    bool whole;
};
__device__ __forceinline__ wg_rows4 wg_out_rows(const dmat &M, int r0, int rq, int nrow, const float *y)
{
    wg_rows4 o;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int row = r0 + rq + k;
        o.orow[k] = rq + k < nrow ? (M.p_row ? (int)M.p_row[row] : row) : -1;
        o.R[k] = rq + k < nrow ? M.wexp[row] : 0;
    }
    o.whole = !M.p_row && rq + 4 <= nrow && (M.rows & 3) == 0 && (reinterpret_cast<uintptr_t>(y) & 15) == 0;
    return o;
}

// Vector n's outputs at those rows (row0 = r0 + rq) from the sums v of its
// fp16 products: v 2^(E - R) in two exact steps, plus the sparse part.
__device__ __forceinline__ void wg_store(const dmat &M, const float *x, const wg_rows4 &o, int row0, int n, int E,
                                         float4 v, float *y)
{
    const float vk[4] = {v.x, v.y, v.z, v.w};
    float out[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int e = E - o.R[k], e1 = e >> 1; // each step within 2^+-100
        out[k] = o.orow[k] < 0 ? 0.0f
                               : vk[k] * __int_as_float((127 + e1) << 23) * __int_as_float((127 + e - e1) << 23) +
                sparse_dot(M, o.orow[k], x + (size_t)n * M.cols);
    }
    float *const yv = y + (size_t)n * M.rows;
    if (o.whole)
        *reinterpret_cast<float4 *>(yv + row0) = make_float4(out[0], out[1], out[2], out[3]);
    else
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (o.orow[k] >= 0) yv[o.orow[k]] = out[k];
}

// The column parts' sums of the wgmma kernel's output tile (vector tile
// xt of ntn, row block z), where launch_wg splits the columns: nparts
// tiles of bn x kWgRows floats, [part][vector][row of the block], each part
// as its block left it; the float4 of rows 4 (tid % 64) .. + 3 of part 0,
// vector 0 for thread tid.
constexpr int kWgRows = kGemmTiles * kTile; // rows of a row block
__device__ __forceinline__ float4 *wg_parts_at(float *part, int z, int ntn, int xt, int nparts, int bn, int tid)
{
    return reinterpret_cast<float4 *>(part) + ((size_t)z * ntn + xt) * nparts * (bn * kWgRows / 4) + (tid & 63);
}

// The sums over the parts (pb from wg_parts_at) of vectors n, n + 4, n + 8
// and n + 12 of the tile, added in their order from 0 with every load in
// flight at once; vectors from nvec on get 0.
__device__ __forceinline__ void wg_add_parts(const float4 *pb, int nparts, int bn, int n, int nvec, float4 (&v)[4])
{
    const size_t tile4 = (size_t)bn * kWgRows / 4;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int p = 0; p < kGemmMaxParts; p++)
            if (p < nparts && n + 4 * j < nvec) {
                const float4 a = __ldcg(pb + p * tile4 + (size_t)(n + 4 * j) * (kWgRows / 4));
                v[j].x += a.x, v[j].y += a.y, v[j].z += a.z, v[j].w += a.w;
            }
    }
}

// Vector tiles up to this width have their column parts added by the
// wgmma kernel's last block of each row block (its end): no kernel of its
// own to wait for, the same bits. Wider ones by wg_sum: a last block adding
// 64 or 128 vectors of every part alone was slower on an H200
// (bench/results/NOTES.md, "Activations through a tensor map").
#ifndef MPQ_CUDA_WG_FUSE_BN
#define MPQ_CUDA_WG_FUSE_BN 32
#endif
constexpr int kWgFuseBn = MPQ_CUDA_WG_FUSE_BN;

// The sum of the wgmma kernel's column parts where the kernel leaves it
// to a kernel of its own (launch_wg): grid x = vector tiles of bn, y =
// slices of kWgSumVectors vectors of a tile, z = row blocks. Thread u takes
// rows 4 (u % 64) .. + 3 of its row block and vectors u / 64 + 4 j of its
// slice and writes y as the kernel does with one part: spread over the
// GPU, where the last block of a row block to finish would add them alone,
// the other multiprocessors idle meanwhile.
constexpr int kWgSumVectors = 16;
__global__ void __launch_bounds__(kGemmThreads)
    wg_sum(dmat M, const float *__restrict__ x, int batch, int bn, int nparts, const int *__restrict__ E,
           float *__restrict__ part, float *__restrict__ y)
{
    static_assert(kWgSumVectors == 16, "a thread adds four vectors (wg_add_parts)");
    pdl_release();
    const int tid = threadIdx.x, rq = 4 * (tid & 63), r0 = blockIdx.z * kWgRows, nrow = min(kWgRows, M.rows - r0);
    const int nt0 = blockIdx.x * bn, n = blockIdx.y * kWgSumVectors + (tid >> 6), nvec = batch - nt0;
    const float4 *const pb = wg_parts_at(part, blockIdx.z, gridDim.x, blockIdx.x, nparts, bn, tid);
    const wg_rows4 o = wg_out_rows(M, r0, rq, nrow, y);
    pdl_wait();
    float4 v[4];
    wg_add_parts(pb, nparts, bn, n, nvec, v);
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (n + 4 * j < nvec) wg_store(M, x, o, r0 + rq, nt0 + n + 4 * j, E[nt0 + n + 4 * j], v[j], y);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The warpgroup's matrix instructions: a fence before products that read
// registers written since, the commit of the products issued as a group,
// a wait until at most N groups are still out.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Ties the accumulators to the code after a wait, so that no use of them
// moves above it.
template <int K> __device__ __forceinline__ void wgmma_touch(float (&d)[K])
{
#pragma unroll
    for (int k = 0; k < K; k++) asm volatile("" : "+f"(d[k])::"memory");
}

// The B descriptor of k step kk of a stage at shared address xs (the
// tensor map's box, see wg_xbytes): K-major with the 128-byte swizzle
// (layout type 1), rows of 64 k values 128 bytes long, 8 rows (1024 bytes)
// apart from one block of 8 vectors to the next; k step kk starts 32 kk
// bytes into its block's rows (the swizzle applies to the address as a
// whole, so the start moves as in an unswizzled row), the blocks of 64 k
// BN * 128 bytes apart. The byte offset between k halves is unused with
// this swizzle (1 by convention).
template <int BN> __device__ __forceinline__ uint64_t wg_desc(uint32_t xs, int kk)
{
    const uint32_t a = xs + (kk >> 2) * BN * 128 + (kk & 3) * 32;
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

// A box of the tensor map at its coordinates (c0, c1, c2) to shared memory
// at dst, completing on the mbarrier bar.
__device__ __forceinline__ void tma_load3(void *dst, const CUtensorMap *map, int c0, int c1, int c2, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4}], [%5];" ::"r"(smem_addr(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
                 : "memory");
}

// d += A B for m64nNk16 (N = 32, 64, 128), fp16 in, fp32 accumulate, A
// from registers (a), B through its descriptor.
__device__ __forceinline__ void wgmma_n32(float (&d)[16], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
                 "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
__device__ __forceinline__ void wgmma_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
                   "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
__device__ __forceinline__ void wgmma_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
                   "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
                   "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
                   "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
                   "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <int NB> __device__ __forceinline__ void wgmma_nb(float (&d)[NB * 4], const uint32_t (&a)[4], uint64_t desc)
{
    if constexpr (NB == 4)
        wgmma_n32(d, a, desc);
    else if constexpr (NB == 8)
        wgmma_n64(d, a, desc);
    else
        wgmma_n128(d, a, desc);
}
#endif

// The wgmma kernel (see above). Grid: x = vector tiles of BN = 8 NB, y =
// column parts of spp stages, z = row blocks; sg: groups per stage; ns:
// stages in flight; xmap: the tensor map of wg_prep's B operand, E its
// vectors' exponents; counters: where the kernel's last blocks add the
// parts (null: wg_sum does).
template <int CB, int NB>
__global__ void __launch_bounds__(kGemmThreads, gemm_blocks(NB))
    gemm_wg(dmat M, const float *__restrict__ x, int batch, int skip, int sg, int ns, int spp,
            const __grid_constant__ CUtensorMap xmap, const int *__restrict__ E, float *__restrict__ part,
            unsigned *__restrict__ counters, float *__restrict__ y)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BN = 8 * NB;
    extern __shared__ uint4 smem4[]; // (launch_wg asks for kWgSlotAlign more bytes: the slots are aligned here)
    __shared__ uint4 rtab[2][MPQ_MAX_BITS + 1]; // code_row of (row parity, width)
    __shared__ uint64_t bars[kGemmStages];      // the slots' mbarriers
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, m = lane >> 2;
    const int G = M.group, hdr = M.meta + kTile, n0 = blockIdx.x * BN;
    const int nst = (M.ngroups + sg - 1) / sg, st0 = blockIdx.y * spp, nstp = min(spp, nst - st0);
    const int t0 = blockIdx.z * kGemmTiles + kMmaPair * warp; // the warp's first tile
    const bool live1 = t0 + 1 < M.ntiles;
    const bool pre = M.wgw != nullptr; // the row constants from wg_words (launch_wg: none where planes are skipped)
    const wg_stage L(sg, M.crec, G, BN, pre);
    char *const sbase = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(smem4) + kWgSlotAlign - 1) &
                                                 ~(uintptr_t)(kWgSlotAlign - 1));
    code_row_table<CB>(rtab, skip);
    // 2^R of the row the lane works out in wg_group_rows (past the matrix: 1)
    const int lrow = (t0 + (lane >> 4)) * kTile + (lane & 15);
    const float p2r = __int_as_float((127 + (lrow < M.rows ? M.wexp[lrow] : 0)) << 23);

    // stage k: groups (st0 + k) sg ..; the row block's records in the CODE
    // LAYOUT, one range (only the matrix's last stage may hold fewer groups,
    // the last one narrower), and the vector tile's B operand of their
    // columns, a box of xmap (whole stages: wg_prep pads the columns)
    const int last_ngs = M.ngroups - (nst - 1) * sg, last_cols = M.cols - (M.ngroups - 1) * G;
    const int last_rec = M.crow - (M.ngroups - 1) * M.crec;
    const char *csrc = reinterpret_cast<const char *>(M.codes) + code_offset(M, blockIdx.z * kGemmTiles, st0 * sg);
    const char *wsrc = pre
        ? reinterpret_cast<const char *>(M.wgw) + ((size_t)blockIdx.z * M.ngroups + (size_t)st0 * sg) * kWgWordBytes
        : nullptr;
    auto slot_at = [&](int sl) { return sbase + sl * L.bytes; };
    auto issue = [&](int k, int sl, bool codes) {
        if (k >= nstp || tid != 0) return;
        const bool last = st0 + k == nst - 1;
        const int ngs = last ? last_ngs : sg;
        const unsigned cb = (unsigned)(kGemmTiles * ((ngs - 1) * M.crec + (last ? last_rec : M.crec)));
        if (codes) {
            const unsigned wb = pre ? (unsigned)(ngs * kWgWordBytes) : 0u;
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mbar_expect(&bars[sl], cb + wb + (unsigned)L.xb); // the codes, their constants and the box
            bulk_copy(slot_at(sl) + L.xb, csrc + (size_t)k * kGemmTiles * sg * M.crec, cb, &bars[sl]);
            if (pre) bulk_copy(slot_at(sl) + L.woff, wsrc + (size_t)k * sg * kWgWordBytes, wb, &bars[sl]);
        } else {
            tma_load3(slot_at(sl), &xmap, 0, blockIdx.x * BN, (st0 + k) * sg * G / 64, &bars[sl]);
        }
    };
    if (tid < ns) {
        mbar_init(&bars[tid]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads(); // the barriers and rtab
    // stages issued ahead of the one in hand: with three slots or more, the
    // last products of a stage stay in flight into the next one, so that a
    // slot is refilled two stages after its own (with two, one after, each
    // stage's products waited for at its end)
    const int ahead = ns >= 3 ? ns - 2 : 1;
    for (int k = 0; k < ahead; k++) issue(k, k, true);
    pdl_wait();
    for (int k = 0; k < ahead; k++) issue(k, k, false);

    // lane (m, c) of warp w sums rows 2m, 2m + 1 of both tiles for vectors
    // 8 j + 2c, 8 j + 2c + 1: acc[i] is the accumulator of product i
    float acc[kMmaPair][NB][4] = {};
    auto accv = [&](int i) -> float(&)[NB * 4] { return *reinterpret_cast<float(*)[NB * 4]>(&acc[i][0][0]); };
    for (int k = 0; k < nstp; k++) {
        issue(k + ahead, (k + ahead) % ns, true); // every product on that slot is done (see ahead)
        issue(k + ahead, (k + ahead) % ns, false);
        mbar_wait(&bars[k % ns], (unsigned)(k / ns) & 1u);
        const int ngs = st0 + k == nst - 1 ? last_ngs : sg, g0 = (st0 + k) * sg;
        const char *slot = slot_at(k % ns) + L.xb; // the codes, then their constants
        const uint4 *words = reinterpret_cast<const uint4 *>(slot_at(k % ns) + L.woff);
        const uint32_t xs = smem_addr(slot_at(k % ns));
        int kk = 0; // k step of the stage
        for (int j = 0; j < ngs; j++) {
            const bool lastg = g0 + j == M.ngroups - 1;
            const int rs = lastg ? last_rec : M.crec, nq = lastg ? last_cols / 32 : G / 32;
            const char *rec0 = slot + j * kGemmTiles * M.crec + kMmaPair * warp * rs;
            const char *rec1 = rec0 + (live1 ? rs : 0);
            const char *cw0 = rec0 + hdr + 2 * CB * lane, *cw1 = rec1 + hdr + 2 * CB * lane;
            code_rows R[kMmaPair];
            uint32_t s16[kMmaPair][2], z16[kMmaPair][2];
            if (pre) { // rows 2m, 2m + 1 of tile i of the pair: 16 bytes
                uint32_t szs[kMmaPair][2], ams[kMmaPair][2];
#pragma unroll
                for (int i = 0; i < kMmaPair; i++) {
                    const uint4 v = words[(j * kGemmTiles + kMmaPair * warp + i) * (kTile / 2) + m];
                    szs[i][0] = v.x, ams[i][0] = v.y, szs[i][1] = v.z, ams[i][1] = v.w;
                }
                wg_unpack<CB>(szs, ams, R, s16, z16);
            } else
                wg_group_rows<CB>(M, rec0, rec1, live1, m, p2r, rtab, R, s16, z16);
            // A wgmma reads its A registers while it runs, and ptxas does
            // not keep them for it (writing them before the wait is
            // undefined): the loop's two copies alternate two sets of
            // registers, but a group of one quad decodes into the set of
            // the odd quad at the end of a group, which the group before
            // may still be reading. Its products are waited for first.
            if (nq == 1) wgmma_wait<0>();
#pragma unroll 2
            for (int q = 0; q < nq; q++) {
                uint32_t a[kMmaPair][2][4];
                code_frags<CB>(cw0 + q * 64 * CB, R[0], a[0]);
                code_frags<CB>(cw1 + q * 64 * CB, R[1], a[1]);
#pragma unroll
                for (int i = 0; i < kMmaPair; i++)
#pragma unroll
                    for (int S = 0; S < 2; S++)
#pragma unroll
                        for (int f = 0; f < 4; f++) a[i][S][f] = hfma2_bits(a[i][S][f], s16[i][f & 1], z16[i][f & 1]);
                wgmma_fence();
#pragma unroll
                for (int S = 0; S < 2; S++) {
                    const uint64_t d = wg_desc<BN>(xs, kk + 2 * q + S);
#pragma unroll
                    for (int i = 0; i < kMmaPair; i++) wgmma_nb<NB>(accv(i), a[i][S], d);
                }
                wgmma_commit();
                wgmma_wait<1>();
            }
            kk += 2 * nq;
        }
        if (ns < 3) wgmma_wait<0>();
        __syncthreads(); // every warp is done with stage k (and its products, but for the last group, with ns > 2)
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kMmaPair; i++) wgmma_touch(accv(i));
    pdl_release(); // (see gemm_codes)

    // The end (see End): the block's sums as T[vector][row of the block],
    // kWgTileStride floats a vector, then y, or with parts the tile as it is
    // to `part`.
    static_assert(kGemmThreads == kGemmTiles * kTile, "the end gives each thread four rows of four vectors in turn");
    static_assert(BN <= 128, "evs holds a tile's E");
    __shared__ int evs[128]; // the vectors' E
    constexpr int kTileFloats = BN * kWgRows;
    const int nvec = min(BN, batch - n0), r0 = blockIdx.z * kWgRows, nrow = min(kWgRows, M.rows - r0);
    if (tid < nvec) evs[tid] = E[n0 + tid];
    __syncthreads();
    float *const T = reinterpret_cast<float *>(sbase);
#pragma unroll
    for (int i = 0; i < kMmaPair; i++)
#pragma unroll
        for (int jn = 0; jn < NB; jn++)
#pragma unroll
            for (int f = 0; f < 4; f++)
                T[(8 * jn + 2 * (lane & 3) + (f & 1)) * kWgTileStride + (kMmaPair * warp + i) * kTile + 2 * m +
                  (f >> 1)] = acc[i][jn][f];
    __syncthreads();
    // thread u: rows 4 (u % 64) .. + 3 of the block, vectors u / 64 + 4 j
    const int rq = 4 * (tid & 63), nv0 = tid >> 6;
    auto tile4 = [&](int n) { return *reinterpret_cast<const float4 *>(&T[n * kWgTileStride + rq]); };
    if (gridDim.y > 1) { // the tile as it is to `part`, then added there by the last part or by wg_sum
        float4 *const pb = wg_parts_at(part, blockIdx.z, gridDim.x, blockIdx.x, gridDim.y, BN, tid);
#pragma unroll 4
        for (int n = nv0; n < nvec; n += 4) pb[(blockIdx.y * kTileFloats + n * kWgRows) / 4] = tile4(n);
        if (!counters) return;
        unsigned *const counter = &counters[(size_t)blockIdx.z * gridDim.x + blockIdx.x];
        if (!last_part(counter, gridDim.y)) return;
        const wg_rows4 o = wg_out_rows(M, r0, rq, nrow, y);
        for (int n = nv0; n < nvec; n += 16) {
            float4 v[4];
            wg_add_parts(pb, gridDim.y, BN, n, nvec, v);
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (n + 4 * j < nvec) wg_store(M, x, o, r0 + rq, n0 + n + 4 * j, evs[n + 4 * j], v[j], y);
        }
        if (tid == 0) *counter = 0; // ready for the next launch
        return;
    }
    const wg_rows4 o = wg_out_rows(M, r0, rq, nrow, y);
#pragma unroll 2
    for (int n = nv0; n < nvec; n += 4) wg_store(M, x, o, r0 + rq, n0 + n, evs[n], tile4(n), y);
#else
    (void)M, (void)x, (void)batch, (void)skip, (void)sg, (void)ns, (void)spp, (void)xmap, (void)E, (void)part;
    (void)counters, (void)y;
    __trap(); // launched only where wg_probe found this code (launch_wg)
#endif
}

typedef void (*wg_kernel)(dmat, const float *, int, int, int, int, int, const CUtensorMap, const int *, float *,
                          unsigned *, float *);
// [code bits 4, 8][vector blocks 4, 8, 16]
constexpr wg_kernel kWg[2][3] = {{gemm_wg<4, 4>, gemm_wg<4, 8>, gemm_wg<4, 16>},
                                 {gemm_wg<8, 4>, gemm_wg<8, 8>, gemm_wg<8, 16>}};

// Decodes row `row`, columns col0 .. col0 + N - 1 of the packed matrix
// (packed coordinates) with `skip` planes dropped, without the column
// scale. N = 8: one chunk (col0 % 8 == 0, inside one group); N = 32: a quad
// of one group (chunks c .. c + 3, c % 4 == 0, below the group's tail
// chunks), whose 4 bytes per row and plane are one 32-bit word (BYTE
// LAYOUT); bit j of the byte or word is column col0 + j. Columns past the
// matrix get what their zero bits decode to; callers drop them.
template <int N> __device__ void decode_cols(const dmat &M, int row, int col0, int skip, float (&w)[N])
{
    static_assert(N == 8 || N == 32, "a chunk or a quad");
    const int t = row / kTile, r = row % kTile, g = col0 / M.group, c = (col0 - g * M.group) / 8;
    const uint8_t *rec = M.data + 16 * (size_t)M.rec[(size_t)t * M.ngroups + g].x;
    const int b = width_at(M, row, g), gw = min(M.group, M.cols - g * M.group), nchg = (gw + 7) / 8;
    float s, z;
    row_pair(M, rec, r, b, s, z);
    const int q4 = nchg & ~3;
    size_t off; // the byte of chunk c of row r inside a plane (BYTE LAYOUT)
    if (c < q4)
        off = (size_t)(c >> 2) * 64 + (size_t)r * 4 + (c & 3);
    else {
        off = (size_t)q4 * 16;
        int cc = c - q4;
        if (nchg & 2) {
            if (cc < 2)
                off += (size_t)r * 2 + cc;
            else
                off += 32 + (size_t)r;
        } else
            off += (size_t)r;
    }
    float m[N];
#pragma unroll
    for (int k = 0; k < N; k++) m[k] = 0.0f;
    for (int i = 0; i < b; i++) {
        const uint8_t *p = rec + M.meta + (size_t)i * nchg * 16 + off;
        const uint32_t bits = N == 8 ? *p : *reinterpret_cast<const uint32_t *>(p);
        const float pw = plane_weight(i, b, skip);
#pragma unroll
        for (int k = 0; k < N; k++) m[k] += pw * ((bits >> k & 1) ? 1.0f : -1.0f);
    }
#pragma unroll
    for (int k = 0; k < N; k++) w[k] = s * m[k] + z;
}

// The plain kernel: one thread per (row, vector), every weight decoded,
// a chunk of 8 at a time.
__global__ void gemv_plain(dmat M, const float *__restrict__ x, int batch, int skip, float *__restrict__ y)
{
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= M.rows * batch) return;
    const int row = k % M.rows, v = k / M.rows;
    const float *xv = x + (size_t)v * M.cols;
    float sum = 0.0f;
    for (int col0 = 0; col0 < M.cols; col0 += 8) {
        float w[8];
        decode_cols(M, row, col0, skip, w);
        const int n = min(8, M.cols - col0);
        for (int kk = 0; kk < n; kk++) {
            const int col = col0 + kk, src = M.p_col ? (int)M.p_col[col] : col;
            sum += w[kk] * (xv[src] * (M.cscale ? M.cscale[col] : 1.0f));
        }
    }
    const int orow = M.p_row ? (int)M.p_row[row] : row;
    y[(size_t)v * M.rows + orow] = sum + sparse_dot(M, orow, xv);
}

// Weight (orow, ocol) of the sparse part in original coordinates, or 0
// (binary search of the row's entries).
__device__ float sparse_at(const dmat &M, int orow, int ocol)
{
    uint32_t lo = M.sp_row_ptr[orow], hi = M.sp_row_ptr[orow + 1];
    const uint32_t end = hi;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2, c = M.sp_col16 ? M.sp_col16[mid] : M.sp_col32[mid];
        if (c < (uint32_t)ocol)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < end && (M.sp_col16 ? M.sp_col16[lo] : M.sp_col32[lo]) == (uint32_t)ocol
        ? __half2float(__ushort_as_half(M.sp_val[lo]))
        : 0.0f;
}

// The fp16 values of 8 decoded weights w of original row orow, packed
// columns col0 .. col0 + 7: column scale applied, the sparse part (at the
// original column p_col[col]) added in float first. store_chunk writes them
// into row orow of W at their packed columns: the activations are gathered
// through p_col instead (gather_f16), so W's columns stay in packed order
// and its rows are written in whole pieces.
__device__ __forceinline__ void chunk_f16(const dmat &M, int orow, int col0, const float *w, __half *h)
{
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        const int col = min(col0 + kk, M.cols - 1); // past the last column: not stored
        float v = w[kk] * (M.cscale ? M.cscale[col] : 1.0f);
        if (M.sp_row_ptr) v += sparse_at(M, orow, M.p_col ? (int)M.p_col[col] : col);
        h[kk] = __float2half_rn(v);
    }
}

__device__ __forceinline__ void store_chunk(const dmat &M, __half *__restrict__ W, int orow, int col0, const float *w)
{
    const int n = min(8, M.cols - col0);
    __half h[8];
    chunk_f16(M, orow, col0, w, h);
    if (n == 8 && M.cols % 8 == 0) { // one 16-byte store
        uint4 u;
        memcpy(&u, h, sizeof u);
        *reinterpret_cast<uint4 *>(W + (size_t)orow * M.cols + col0) = u;
    } else {
        for (int kk = 0; kk < n; kk++) W[(size_t)orow * M.cols + col0 + kk] = h[kk];
    }
}

// Dequantizes to fp16 for the cuBLAS path, rows in original order and
// columns in packed order (see store_chunk): one thread per row and 32
// columns, the 16 rows of a tile on consecutive threads. Where the 32 columns are a quad of one group (groups of a
// multiple of 32 columns) a plane is one 32-bit word per row; elsewhere
// (tail chunks, other groups) they are decoded chunk by chunk.
__global__ void dequant_f16(dmat M, int skip, __half *__restrict__ W)
{
    const int nq = (M.cols + 31) / 32;
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)M.ntiles * kTile * nq) return;
    const int r = (int)(k % kTile), u = (int)(k / kTile % nq), t = (int)(k / kTile / nq);
    const int row = t * kTile + r, col0 = 32 * u;
    if (row >= M.rows) return;
    const int orow = M.p_row ? (int)M.p_row[row] : row;
    const int g = col0 / M.group, c0 = (col0 - g * M.group) / 8;
    const int gw = min(M.group, M.cols - g * M.group), nchg = (gw + 7) / 8;
    if (M.group % 32 == 0 && c0 + 4 <= (nchg & ~3)) {
        float w[32];
        decode_cols(M, row, col0, skip, w);
#pragma unroll
        for (int cc = 0; cc < 4; cc++) store_chunk(M, W, orow, col0 + 8 * cc, w + 8 * cc);
    } else {
        for (int cc = 0; cc < 4 && col0 + 8 * cc < M.cols; cc++) {
            float w[8];
            decode_cols(M, row, col0 + 8 * cc, skip, w);
            store_chunk(M, W, orow, col0 + 8 * cc, w);
        }
    }
}

// dequant_f16 from the CODE LAYOUT copy, staged through shared memory so
// that both sides are whole pieces: a block takes one tile and kDqQuads
// quads (kDqQuads * 32 columns). Decoding, thread (r, q) = (tid % 16, tid /
// 16) reads the 32 codes of tile row r in quad q (the words of lanes (r / 2,
// 0..3), so a warp reads 2 quads' 512 contiguous bytes) and writes them in
// fp16 to its row of the staging tile; writing out, a warp stores 512
// contiguous bytes of one row, at its original row.
constexpr int kDqQuads = 16, kDqPad = 8; // the pad spreads the 16 rows over the banks
template <int CB>
__global__ void __launch_bounds__(kTile *kDqQuads) dequant_codes(dmat M, int skip, __half *__restrict__ W)
{
    constexpr int kRow = 32 * kDqQuads + kDqPad;
    __shared__ __align__(16) __half st[kTile * kRow];
    const int nqm = M.cols / 32, t = (int)blockIdx.y, r = threadIdx.x % kTile;
    const int qq = threadIdx.x / kTile, qm = (int)blockIdx.x * kDqQuads + qq, row = t * kTile + r;
    if (qm < nqm && row < M.rows) {
        const int orow = M.p_row ? (int)M.p_row[row] : row;
        const int g = 32 * qm / M.group, q = qm - g * (M.group / 32);
        const uint8_t *rec = M.codes + code_offset(M, t, g);
        const int b = rec[M.meta + r], lo = mpq_first_plane(b, skip), C = (1 << b) - (1 << lo), rr = r & 1;
        const uint32_t keep = (0xFFu << lo) & 0xFFu;
        float s, z;
        row_pair(M, rec, r, b, s, z);
        const uint8_t *cw = rec + M.meta + kTile + (size_t)q * 64 * CB + (size_t)(r / 2) * 8 * CB;
        // Q = 2 u' - C in float without an integer conversion: the bits
        // 0x4B000000 | u' read 2^23 + u'; 2 (2^23 + u') - 2^24 and then - C
        // are exact (C may be odd: 2^24 + C is no float)
        const uint32_t magic = 0x4B000000u;
        const float Cf = (float)C;
        float w[32];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t wd[2]; // the words of k steps 0 and 1 that hold row r
            if (CB == 4)
                memcpy(wd, cw + 8 * c, 8);
            else
                memcpy(&wd[0], cw + 16 * c + 4 * rr, 4), memcpy(&wd[1], cw + 16 * c + 8 + 4 * rr, 4);
#pragma unroll
            for (int f = 0; f < 8; f++) { // f = 4 S + 2 h + e: column c + 4 (2 S + h) + 16 e
                const int S = f >> 2, h = (f >> 1) & 1, e = f & 1;
                const uint32_t u = CB == 4 ? wd[S] >> (4 * (rr + 2 * h + 4 * e)) & 0xFu & keep
                                           : wd[S] >> (8 * (2 * h + e)) & 0xFFu & keep;
                const float Q = fmaf(2.0f, __uint_as_float(magic | u), -16777216.0f) - Cf;
                w[c + 4 * (2 * S + h) + 16 * e] = fmaf(s, Q, z);
            }
        }
        if (!M.cscale && !M.sp_row_ptr) { // the common case: two weights per conversion
#pragma unroll
            for (int cc = 0; cc < 4; cc++) {
                __half2 hv[4];
#pragma unroll
                for (int k = 0; k < 4; k++) hv[k] = __floats2half2_rn(w[8 * cc + 2 * k], w[8 * cc + 2 * k + 1]);
                memcpy(&st[r * kRow + 32 * qq + 8 * cc], hv, sizeof hv);
            }
        } else {
#pragma unroll
            for (int cc = 0; cc < 4; cc++) {
                __half hv[8];
                chunk_f16(M, orow, 32 * qm + 8 * cc, w + 8 * cc, hv);
                memcpy(&st[r * kRow + 32 * qq + 8 * cc], hv, sizeof hv);
            }
        }
    }
    __syncthreads();
    const int col0 = (int)blockIdx.x * 32 * kDqQuads;
    for (int i = threadIdx.x; i < kTile * 4 * kDqQuads; i += blockDim.x) {
        const int rr = i / (4 * kDqQuads), seg = i % (4 * kDqQuads), prow = t * kTile + rr;
        if (prow >= M.rows || col0 + 8 * seg >= M.cols) continue;
        const int orow = M.p_row ? (int)M.p_row[prow] : prow;
        *reinterpret_cast<uint4 *>(W + (size_t)orow * M.cols + col0 + 8 * seg) =
            *reinterpret_cast<const uint4 *>(&st[rr * kRow + 8 * seg]);
    }
}

// 8-bit activations for the kernels that read float ones (LUT, plain, fp16
// + cuBLAS): xh[v][j] = q s^_a of x~_j = x[v][p_col[j]] col_scale[j], in
// packed column order, as mpq_quantize_act8 makes them; one block per group
// and vector (grid y strides over the batch).
constexpr int kA8Threads = 128;
__global__ void __launch_bounds__(kA8Threads)
    act8_dequant(dmat M, const float *__restrict__ x, int batch, float *__restrict__ xh)
{
    __shared__ unsigned wmax[kA8Threads / 32];
    const int tid = threadIdx.x, j0 = blockIdx.x * M.group, j1 = min(M.cols, j0 + M.group);
    pdl_release(); // the product's kernel waits for all of this grid
    pdl_wait();
    for (int v = blockIdx.y; v < batch; v += gridDim.y) {
        const float *xv = x + (size_t)v * M.cols;
        auto xt = [&](int j) { return xv[M.p_col ? (int)M.p_col[j] : j] * (M.cscale ? M.cscale[j] : 1.0f); };
        unsigned a = 0u; // |x~| >= 0: ordered as its bits
        for (int j = j0 + tid; j < j1; j += kA8Threads) a = max(a, __float_as_uint(fabsf(xt(j))));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) a = max(a, __shfl_xor_sync(0xffffffffu, a, o));
        if ((tid & 31) == 0) wmax[tid >> 5] = a;
        __syncthreads();
        for (int w = 0; w < kA8Threads / 32; w++) a = max(a, wmax[w]);
        __syncthreads(); // wmax is free for the next vector
        const float s = act8_scale(__uint_as_float(a));
        for (int j = j0 + tid; j < j1; j += kA8Threads) xh[(size_t)v * M.cols + j] = act8_code(xt(j), s) * s;
    }
}

// y[v][orow] += row orow of the sparse part times x[v] (after a product of
// the dense part alone).
__global__ void add_sparse(dmat M, const float *__restrict__ x, int batch, float *__restrict__ y)
{
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)batch * M.rows) return;
    const int orow = (int)(k % M.rows);
    const size_t v = k / M.rows;
    y[k] += sparse_dot(M, orow, x + v * M.cols);
}

// out[v][j] = x[v][p_col[j]] in fp16, for `batch` vectors: the activations
// in the packed column order of dequant_f16's W.
__global__ void gather_f16(dmat M, const float *__restrict__ x, int batch, __half *__restrict__ out)
{
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)batch * M.cols) return;
    const size_t v = k / (size_t)M.cols;
    const int j = (int)(k - v * (size_t)M.cols);
    out[k] = __float2half_rn(x[v * (size_t)M.cols + (M.p_col ? M.p_col[j] : (uint32_t)j)]);
}

// ------------------------------------------------------------------ host code

// Launches the dequantization of h's matrix into W (dequant_f16's order),
// from the code copy where it exists.
cudaError_t dequantize(cuda_ctx *c, const cuda_handle *h, int skip, __half *W)
{
    const dmat &M = h->m;
    if (M.codes) {
        const dim3 grid((unsigned)((M.cols / 32 + kDqQuads - 1) / kDqQuads), (unsigned)M.ntiles);
        if (h->cb == 4)
            dequant_codes<4><<<grid, kTile * kDqQuads, 0, c->stream>>>(M, skip, W);
        else
            dequant_codes<8><<<grid, kTile * kDqQuads, 0, c->stream>>>(M, skip, W);
    } else {
        const size_t threads = (size_t)M.ntiles * kTile * (size_t)((M.cols + 31) / 32);
        dequant_f16<<<(unsigned)((threads + 255) / 256), 256, 0, c->stream>>>(M, skip, W);
    }
    return cudaGetLastError();
}

// ROTATION (a matrix that carries V): y = W~ (V x). One block per vector
// computes V x = (H_p / sqrt(p) (x) R_m) diag(s) x into shared memory:
// each coordinate (i, a) of the p x m view is sum_b R[a][b] s x[i m + b],
// then log2(p) butterfly stages over rows h apart (two runs of h m floats,
// as the CPU's mpq__fwht_rows), then the scale. Every kernel of the rule
// table then reads V x as its input, so permutations, column scales, the
// sparse part, skip_planes and 8-bit activations apply to it unchanged. The
// float sums may round differently from the CPU's (contracted to FMA). It is
// launched without programmatic dependent launch, so it starts after the
// grid before it ends and the product's kernel after it ends: launched as
// the products are, 8-bit activations with integer tables on 14336 columns
// gave results that differed from run to run on an H200 (not yet
// understood; bench/results/NOTES.md, "Rotations").
__global__ void __launch_bounds__(1024)
    rotate_input(const float *__restrict__ x, float *__restrict__ out, int n, int p, int lp, int m,
                 const float *__restrict__ R, const uint8_t *__restrict__ sign, float scale)
{
    extern __shared__ float t[];
    const float *xv = x + (size_t)blockIdx.x * n;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const int i = j / m, a = j - i * m;
        float acc = 0.0f;
        for (int b = 0; b < m; b++) {
            const int k = i * m + b;
            const float v = xv[k];
            acc += R[a * m + b] * (((sign[k >> 3] >> (k & 7)) & 1) ? -v : v);
        }
        t[j] = acc;
    }
    __syncthreads();
    for (int lh = 0; lh < lp; lh++) { // h = 2^lh: pair (i, i + h) of rows i with bit lh clear
        const int run = m << lh;
        for (int e = threadIdx.x; e < n / 2; e += blockDim.x) {
            const int q = m == 1 ? e : e / m, r = e - q * m; // q: the pair's row among p / 2, r: its column
            const int u = (((q >> lh) << (lh + 1)) | (q & ((1 << lh) - 1))) * m + r;
            const float a = t[u], b = t[u + run];
            t[u] = a + b, t[u + run] = a - b;
        }
        __syncthreads();
    }
    float *ov = out + (size_t)blockIdx.x * n;
    for (int j = threadIdx.x; j < n; j += blockDim.x) ov[j] = t[j] * scale;
}

// Record offsets / 16 and plane counts of every (tile, group), as mpq.h
// lays them out (mpq_packed_records); MPQ_ERR_FORMAT where an offset does
// not fit.
mpq_status record_table(const mpq_packed *A, uint2 *rec)
{
    const size_t n = (size_t)((A->rows + kTile - 1) / kTile) * (size_t)A->ngroups;
    uint64_t *off = static_cast<uint64_t *>(malloc(sizeof(uint64_t) * n));
    uint8_t *np = static_cast<uint8_t *>(malloc(n));
    mpq_status st = off && np ? mpq_packed_records(A, off, np, nullptr) : MPQ_ERR_NOMEM;
    for (size_t k = 0; st == MPQ_OK && k < n; k++) {
        if (off[k] % 16 || off[k] / 16 > 0xFFFFFFFFull) st = MPQ_ERR_FORMAT;
        rec[k] = make_uint2((uint32_t)(off[k] / 16), (uint32_t)np[k]);
    }
    free(off);
    free(np);
    return st;
}

template <typename P> P *dev_ptr(const cuda_handle *h, const void *host)
{
    if (!host) return nullptr;
    const uint8_t *base = static_cast<const uint8_t *>(h->view.buf);
    return reinterpret_cast<P *>(static_cast<uint8_t *>(h->dbuf) + (static_cast<const uint8_t *>(host) - base));
}

void release(void *ctx, void *handle);

mpq_status upload(void *ctx, const mpq_packed *A, void **handle)
{
    cuda_ctx *c = static_cast<cuda_ctx *>(ctx);
    if (!c || !A || !handle || !A->buf || A->bytes == 0 || !A->bits || !A->band_off) return MPQ_ERR_ARG;
    const mpq_format_traits *f = mpq_format_get((mpq_format)A->format);
    if (!f) return MPQ_ERR_UNSUPPORTED;
    if (A->rot.n && (size_t)A->cols * sizeof(float) > (size_t)c->rot_smem)
        return MPQ_ERR_UNSUPPORTED; // V x does not fit one block's shared memory (past about 57000 columns)
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return map_error(e);
    const int ntiles = (A->rows + kTile - 1) / kTile;
    const size_t nrec = (size_t)ntiles * (size_t)A->ngroups;
    uint2 *rec = static_cast<uint2 *>(malloc(nrec * sizeof(uint2)));
    cuda_handle *h = static_cast<cuda_handle *>(calloc(1, sizeof(cuda_handle)));
    if (!rec || !h) {
        free(rec), free(h);
        return MPQ_ERR_NOMEM;
    }
    const mpq_status rs = record_table(A, rec);
    if (rs != MPQ_OK) {
        free(rec), free(h);
        return rs;
    }
    h->view = *A;
    h->view.owned = 0;
    e = cudaMalloc(&h->dbuf, A->bytes);
    if (e == cudaSuccess) e = cudaMalloc(&h->drec, nrec * sizeof(uint2));
    if (e == cudaSuccess) e = cudaMemcpyAsync(h->dbuf, A->buf, A->bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(h->drec, rec, nrec * sizeof(uint2), cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    free(rec);
    if (e != cudaSuccess) {
        cudaFree(h->dbuf), cudaFree(h->drec);
        free(h);
        return map_error(e);
    }
    dmat &M = h->m;
    M.e8m0 = f->e8m0, M.rows = A->rows, M.cols = A->cols, M.group = A->group, M.block_rows = A->block_rows;
    M.ngroups = A->ngroups, M.ntiles = ntiles;
    mpq_packed_records(A, nullptr, nullptr, &M.meta);
    M.data = dev_ptr<const uint8_t>(h, A->data);
    M.bits = dev_ptr<const uint8_t>(h, A->bits);
    M.p_row = dev_ptr<const uint32_t>(h, A->p_row);
    M.p_col = dev_ptr<const uint32_t>(h, A->p_col);
    M.cscale = dev_ptr<const float>(h, A->col_scale);
    M.rec = static_cast<const uint2 *>(h->drec);
    M.sp_row_ptr = dev_ptr<const uint32_t>(h, A->sp_row_ptr);
    M.sp_col16 = dev_ptr<const uint16_t>(h, A->sp_col16);
    M.sp_col32 = dev_ptr<const uint32_t>(h, A->sp_col32);
    M.sp_val = dev_ptr<const uint16_t>(h, A->sp_val);
    M.uniform = A->block_rows % kTile == 0;
    if (A->rot.n) {
        M.rot_R = dev_ptr<const float>(h, A->rot.R), M.rot_sign = dev_ptr<const uint8_t>(h, A->rot.sign);
        M.rot_p = A->rot.p, M.rot_m = A->rot.m;
    }
    h->fast = A->group % 32 == 0;
    const size_t nbits = (size_t)((A->rows + A->block_rows - 1) / A->block_rows) * (size_t)A->ngroups;
    for (size_t k = 0; k < nbits; k++) h->maxw = A->bits[k] > h->maxw ? A->bits[k] : h->maxw;
    // the CODE LAYOUT copy of the MMA kernel and the fp16 path, where every
    // group (the last one too) is whole quads; without room for it the
    // matrix is uploaded without it (the LUT kernel and fp16 + cuBLAS serve
    // every batch)
    const int last = A->cols - (A->ngroups - 1) * A->group;
    if (A->group % 32 == 0 && last % 32 == 0) {
        const int cb = h->maxw <= 4 ? 4 : 8, hdr = M.meta + kTile;
        M.crec = hdr + A->group * 2 * cb;
        M.crow = (A->ngroups - 1) * M.crec + hdr + last * 2 * cb;
        const size_t threads = (size_t)ntiles * (size_t)(A->cols / 32) * 32;
        const size_t bytes = (size_t)(ntiles + kCodeTiles - 1) / kCodeTiles * kCodeTiles * (size_t)M.crow;
        e = cudaMalloc(&h->dcodes, bytes);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            h->dcodes = nullptr;
            e = cudaSuccess;
        } else if (e == cudaSuccess) {
            M.codes = static_cast<const uint8_t *>(h->dcodes);
            h->cb = cb;
            e = cudaMemsetAsync(h->dcodes, 0, bytes, c->stream); // the padding records of the last row block
            if (e == cudaSuccess) {
                const unsigned nb = (unsigned)((threads + 255) / 256);
                if (cb == 4)
                    transcode<4><<<nb, 256, 0, c->stream>>>(M, static_cast<uint8_t *>(h->dcodes));
                else
                    transcode<8><<<nb, 256, 0, c->stream>>>(M, static_cast<uint8_t *>(h->dcodes));
                e = cudaGetLastError();
            }
        }
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) {
            release(ctx, h);
            return map_error(e);
        }
    }
    // the wgmma kernel's row exponents, where it has code for this device
    // and takes the matrix (wg_rows; else M.wexp stays null)
    if (c->wgmma && !c->fp16_weights && M.codes && A->group <= kGemmCols) {
        int *ok = nullptr, good = 0;
        e = cudaMalloc(&h->dwexp, sizeof(int) * (size_t)A->rows);
        if (e == cudaSuccess) e = cudaMalloc(&ok, sizeof(int));
        if (e == cudaSuccess) e = cudaMemsetAsync(ok, 0xFF, sizeof(int), c->stream);
        if (e == cudaSuccess) {
            wg_rows<<<(A->rows + 127) / 128, 128, 0, c->stream>>>(M, h->dwexp, ok);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaMemcpyAsync(&good, ok, sizeof(int), cudaMemcpyDeviceToHost, c->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
        cudaFree(ok);
        if (e != cudaSuccess) {
            release(ctx, h);
            return map_error(e);
        }
        if (good)
            M.wexp = h->dwexp;
        else
            cudaFree(h->dwexp), h->dwexp = nullptr;
    }
    // its row constants without skipped planes (wg_words), where there is
    // room for them (else the warps work them out for every product)
    if (M.wexp) {
        const size_t n = (size_t)(ntiles + kCodeTiles - 1) / kCodeTiles * (size_t)A->ngroups * kCodeTiles * kTile;
        e = cudaMalloc(&h->dwgw, sizeof(uint2) * n);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            h->dwgw = nullptr;
            e = cudaSuccess;
        } else if (e == cudaSuccess) {
            const unsigned nb = (unsigned)((n + 255) / 256);
            if (h->cb == 4)
                wg_words<4><<<nb, 256, 0, c->stream>>>(M, h->dwgw);
            else
                wg_words<8><<<nb, 256, 0, c->stream>>>(M, h->dwgw);
            e = cudaGetLastError();
            if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
            if (e == cudaSuccess) M.wgw = h->dwgw;
        }
        if (e != cudaSuccess) {
            release(ctx, h);
            return map_error(e);
        }
    }
    if (c->fp16_weights) { // the fp16 baseline: dequantized once; the packed buffer stays for p_col (gather_f16)
        e = cudaMalloc(&h->w16, sizeof(__half) * (size_t)A->rows * (size_t)A->cols);
        if (e == cudaSuccess) e = dequantize(c, h, 0, h->w16);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) {
            release(ctx, h);
            return map_error(e);
        }
        cudaFree(h->dcodes);
        h->dcodes = nullptr, M.codes = nullptr, h->cb = 0;
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
    cudaFree(h->drec);
    cudaFree(h->dcodes);
    cudaFree(h->dwexp);
    cudaFree(h->dwgw);
    cudaFree(h->w16);
    free(h);
}

// Makes *buf a device buffer of at least `bytes` (*have: its size), in place
// of a smaller one (freed first, its contents lost: *fresh says so).
template <typename T> mpq_status reserve(T **buf, size_t *have, size_t bytes, bool *fresh = nullptr)
{
    if (fresh) *fresh = false;
    if (bytes <= *have) return MPQ_OK;
    cudaFree(*buf);
    *buf = nullptr;
    *have = 0;
    cudaError_t e = cudaMalloc(reinterpret_cast<void **>(buf), bytes);
    if (e != cudaSuccess) return map_error(e);
    *have = bytes;
    if (fresh) *fresh = true;
    return MPQ_OK;
}

// The scratch buffer (the kernels' partial sums, the fp16 path's matrix and
// activations) of at least `scratch` bytes, and `counters` row-block
// counters, zero.
mpq_status grow(cuda_ctx *c, size_t scratch, size_t counters)
{
    bool fresh = false;
    mpq_status st = reserve(&c->scratch, &c->scratch_bytes, scratch);
    if (st == MPQ_OK) st = reserve(&c->counters, &c->counters_bytes, counters * sizeof(unsigned), &fresh);
    if (st == MPQ_OK && fresh) {
        cudaError_t e = cudaMemsetAsync(c->counters, 0, c->counters_bytes, c->stream);
        if (e != cudaSuccess) c->counters_bytes = 0; // not zeroed: replaced at the next call
        st = map_error(e);
    }
    return st;
}

// The LUT kernels: (float, 8-bit activations) x (batch 1, 2, 4, 8) x (widest
// row up to 4, 6, 8 bits), and how many blocks of each fit on a
// multiprocessor (set at creation).
typedef void (*lut_kernel)(dmat, const float *, int, int, int, int, int, float *, unsigned *, float *);
constexpr lut_kernel kLut[2][4][3] = {{{gemv_lut<1, 4, false>, gemv_lut<1, 6, false>, gemv_lut<1, 8, false>},
                                       {gemv_lut<2, 4, false>, gemv_lut<2, 6, false>, gemv_lut<2, 8, false>},
                                       {gemv_lut<4, 4, false>, gemv_lut<4, 6, false>, gemv_lut<4, 8, false>},
                                       {gemv_lut<8, 4, false>, gemv_lut<8, 6, false>, gemv_lut<8, 8, false>}},
                                      {{gemv_lut<1, 4, true>, gemv_lut<1, 6, true>, gemv_lut<1, 8, true>},
                                       {gemv_lut<2, 4, true>, gemv_lut<2, 6, true>, gemv_lut<2, 8, true>},
                                       {gemv_lut<4, 4, true>, gemv_lut<4, 6, true>, gemv_lut<4, 8, true>},
                                       {gemv_lut<8, 4, true>, gemv_lut<8, 6, true>, gemv_lut<8, 8, true>}}};
constexpr int kAccBytes = 32 * 1024; // the most shared memory a block's sums over several slices take
constexpr int kLutSmem = kTableBytes + kAccBytes;

// Launches `kernel` on the backend's stream with programmatic dependent
// launch (MPQ_CUDA_PDL): see Launch at the top.
template <typename Kernel, typename... Args>
mpq_status launch_pdl(cuda_ctx *c, Kernel kernel, dim3 grid, int threads, int smem, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = c->stream;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = MPQ_CUDA_PDL && c->cc >= 90;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e == cudaSuccess) e = cudaGetLastError();
    return map_error(e);
}

mpq_status launch_lut(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip, bool a8)
{
    const dmat &M = h->m;
    // columns in whole quads: all but the tail chunks of a partial last group
    const int glast = M.ngroups - 1, gw = M.cols - glast * M.group;
    const int quad_cols = glast * M.group + (gw / 32) * 32;
    if (quad_cols != M.cols) return MPQ_ERR_UNSUPPORTED; // tails: the plain kernel
    const int bi = batch == 1 ? 0 : batch == 2 ? 1 : batch <= 4 ? 2 : 3, B = 1 << bi;
    const int wi = h->variant();
    const int nslices = (quad_cols + 512 / B - 1) / (512 / B);
    // Blocks of 512 columns (B slices) for a small sum buffer, narrower when
    // that leaves the multiprocessors without a full wave of blocks; row
    // blocks of a multiple of 8 tiles (the warps) where there are enough.
    const int want = c->occ[a8][bi][wi] * c->sms;
    int sps = B, nparts, nrb, tpb;
    for (;;) {
        nparts = (nslices + sps - 1) / sps;
        nrb = want / nparts < 1 ? 1 : want / nparts;
        tpb = (M.ntiles + nrb - 1) / nrb;
        if (tpb > kWarps) tpb = (tpb + kWarps - 1) / kWarps * kWarps;
        if (sps > 1 && tpb * kTile * B * 4 > kAccBytes) tpb = kAccBytes / (kTile * B * 4);
        nrb = (M.ntiles + tpb - 1) / tpb;
        if (sps == 1 || 4 * nrb * nparts >= 3 * want) break;
        sps /= 2;
    }
    nparts = (nslices + sps - 1) / sps;
    const int smem = kTableBytes + (nparts < nslices ? tpb * kTile * B * 4 : 0);
    mpq_status st = grow(c, sizeof(float) * (size_t)nparts * batch * M.ntiles * kTile, (size_t)nrb);
    if (st != MPQ_OK) return st;
    return launch_pdl(c, kLut[a8][bi][wi], dim3(nparts, nrb), kThreads, smem, M, x, batch, skip, quad_cols, tpb, sps,
                      static_cast<float *>(c->scratch), c->counters, y);
}

// The MMA kernel for a batch of 1..16 (matrices with a code copy), after
// mma_prep; with 8-bit activations (a8) larger batches too, in pieces of up
// to 32 vectors along grid z.
mpq_status launch_mma(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip, bool a8)
{
    const dmat &M = h->m;
    if (!M.codes) return MPQ_ERR_UNSUPPORTED;
    // Column parts of whole groups, of equal size, whose fragments fit
    // kMmaFragBytes; row blocks of 2, 4 or a multiple of 8 tiles. Of the
    // part counts from the fewest to twice that, the one whose blocks fill
    // the waves of resident blocks best (the fewest parts on a tie).
    // Batches up to 8 take parts of at most 32 KB of fragments (3 blocks per
    // multiprocessor) unless that makes more than 8 parts: the partial sums
    // of more parts cost more than the third block gains (bench/results).
    // So do batches of 8-bit activations in one piece: with parts of 64 KB
    // and the warps' sums of 32 vectors only one block fitted per
    // multiprocessor (bench/results/NOTES.md, "8-bit activations on the GPU").
    const int ti = batch > 16 && a8 ? 2 : batch > 8 ? 1 : 0, nt_ = 1 << ti, nv = 8 * nt_, vb = a8 ? 1 : 4;
    const int nz = (batch + nv - 1) / nv; // pieces of nv vectors (one without a8: batch <= 16)
    if (4 * nv * M.group > kMmaFragBytes) return MPQ_ERR_UNSUPPORTED; // mma_prep stages a group's floats
    int gmax = kMmaFragBytes / 2 / (vb * nv * M.group);
    if ((nt_ > 1 && !(a8 && nz == 1)) || gmax < 1 || (M.ngroups + gmax - 1) / gmax > 8)
        gmax = kMmaFragBytes / (vb * nv * M.group);
    if (gmax < 1) return MPQ_ERR_UNSUPPORTED;
    const int slot = M.crec; // a multiple of 16
    const int ng0 = gmax < M.ngroups ? gmax : M.ngroups;
    const int ring = kMmaWarps * kMmaRing * kMmaPair * slot;
    const int smem = mma_smem(mma_part(ng0, M.group, nv, vb).bytes, nv, 1).ring + ring;
    if (smem > c->mma_dmax) return MPQ_ERR_UNSUPPORTED;
    int occ = c->smem_sm / (smem + c->mma_static + c->smem_reserved);
    const int omax = nt_ == 1 ? kMmaBlocks1 : 2;
    occ = occ > omax ? omax : occ < 1 ? 1 : occ;
    const int want = occ * c->sms, pmin = (M.ngroups + gmax - 1) / gmax;
    int nparts = 0, gpp = 0, tpb = 0, nrb = 0;
    double best = 0.0;
    for (int p = pmin; p <= 2 * pmin && p <= M.ngroups; p++) {
        const int gp = (M.ngroups + p - 1) / p, np_ = (M.ngroups + gp - 1) / gp;
        const int nrb0 = want / (np_ * nz) < 1 ? 1 : want / (np_ * nz);
        int tp = (M.ntiles + nrb0 - 1) / nrb0;
        tp = tp > 4 ? (tp + kMmaWarps - 1) / kMmaWarps * kMmaWarps : tp > 2 ? 4 : 2;
        const int nr = (M.ntiles + tp - 1) / tp, blocks = np_ * nr * nz, waves = (blocks + want - 1) / want;
        const double fill = (double)blocks / ((double)waves * want);
        if (fill > best + 1e-9) best = fill, nparts = np_, gpp = gp, tpb = tp, nrb = nr;
    }
    const mma_part P(gpp, M.group, nv, vb);
    const int smem_used = mma_smem(P.bytes, nv, mma_wpt(tpb)).ring + ring;
    if (smem_used > c->mma_dmax) return MPQ_ERR_UNSUPPORTED;
    const size_t part_bytes = (sizeof(float) * (size_t)nparts * nz * nv * M.ntiles * kTile + 255) / 256 * 256;
    mpq_status st = grow(c, part_bytes + (size_t)nz * nparts * P.bytes, (size_t)nz * nrb);
    if (st != MPQ_OK) return st;
    uint8_t *xprep = static_cast<uint8_t *>(c->scratch) + part_bytes;
    st = launch_pdl(c, kPrep[a8][ti], dim3(M.ngroups, nz), kMmaThreads, 4 * M.group * nv + M.group / 32 * nv * 4, M, x,
                    batch, gpp, h->cb, xprep);
    if (st != MPQ_OK) return st;
    return launch_pdl(c, kMma[a8][ti][h->cb == 8], dim3(nparts, nrb, nz), kMmaThreads, smem_used, M, x, batch, skip,
                      tpb, gpp, slot, static_cast<const uint8_t *>(xprep), static_cast<float *>(c->scratch),
                      c->counters, y);
}

// The time gemm_parts estimates for a split into column parts, in stages of
// one block: per wave of blocks, a block's stages, kGemmBlockCost for its
// start and end, and with parts kGemmPartCost per part and 16 vectors of
// the tile for the last block's sum of the parts. Chosen from the H200's
// figures at batches 16 to 128 (bench/results/NOTES.md, "The GEMM kernel,
// a fourth round"): more parts fill the multiprocessors better, but adding
// eight parts of sums costs the last block about two stages, and a split
// into more waves pays that in each. The wgmma kernel takes them as they
// are (not refitted to it: its parts are added by a last block only in
// tiles of 32 vectors, else by wg_sum over the whole GPU).
constexpr double kGemmBlockCost = 1.5, kGemmPartCost = 0.25;

// The column parts (split-k) of the GEMM and wgmma kernels: `blocks` output
// tiles of bn vectors, nst stages each, `slots` blocks resident at once; 1
// to 8 parts of at least two stages each, the count of least estimated time
// (waves x (stages + kGemmBlockCost + kGemmPartCost x parts x bn / 16)),
// the fewest on a tie within 2 %. Returns the parts, with their stages in
// spp (the last part may hold fewer).
int gemm_parts(int blocks, int nst, int slots, int bn, int &spp)
{
    int nparts = 1;
    double best = 0.0;
    for (int p = 1; p <= kGemmMaxParts && (p == 1 || 2 * p <= nst); p++) {
        const int spp_ = (nst + p - 1) / p, np_ = (nst + spp_ - 1) / spp_;
        const long total = (long)blocks * np_, waves = (total + slots - 1) / slots;
        const double t = (double)waves * (spp_ + kGemmBlockCost + (np_ > 1 ? kGemmPartCost * np_ * bn / 16 : 0.0));
        if (p == 1 || t < best * 0.98) best = t, nparts = np_;
    }
    spp = (nst + nparts - 1) / nparts;
    return (nst + spp - 1) / spp;
}

// The GEMM kernel (matrices with a code copy and groups of at most
// kGemmCols columns), after gemm_prep. Vector tiles: 16 vectors up to batch
// 16, 32 up to 32, one of 64 up to 48, and beyond that tiles of 32 again
// (two blocks of 32 on a multiprocessor, the codes read once per tile, the
// later ones mostly from L2, were faster than one block of 64 on most shapes
// at batches 64 to 128 on an H200, slower at 33; bench/results/NOTES.md); as
// many stages in flight as fit shared memory (at least two, with one block
// per multiprocessor where two blocks would leave less); the column parts
// as gemm_parts chooses them. a8: 8-bit activations on the int8 tensor
// cores. The rule
// table calls it through run_gemm and run_gemm_a8 (MPQ_ERR_UNSUPPORTED for
// a matrix it does not take).
mpq_status launch_gemm(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip, bool a8)
{
    const dmat &M = h->m;
    if (!M.codes || M.group > kGemmCols) return MPQ_ERR_UNSUPPORTED;
    const int ni = batch <= 16 ? 0 : batch <= 32 || batch > 48 ? 1 : 2, bn = 16 << ni;
    const int ntn = (batch + bn - 1) / bn, bnpad = ntn * bn;
    const int sg = M.group < kGemmStageCols ? kGemmStageCols / M.group : 1, nst = (M.ngroups + sg - 1) / sg;
    const int stage = gemm_stage(sg, M.crec, M.group, bn, a8).bytes;
    // stages in flight at occ blocks per multiprocessor: as the kernel is
    // built for, or one where two stages would not fit beside a second
    // block (8-bit codes in groups of 256 columns)
    auto stages_at = [&](int occ_) {
        return min(kGemmStages, min(c->mma_dmax, c->smem_sm / occ_ - c->smem_reserved - c->mma_static) / stage);
    };
    int occ = gemm_blocks(bn / 8), ns = stages_at(occ);
    if (ns < 2) occ = 1, ns = stages_at(1);
    if (ns < 2) return MPQ_ERR_UNSUPPORTED;
    const int nrb = (M.ntiles + kGemmTiles - 1) / kGemmTiles, blocks = ntn * nrb;
    int spp;
    const int nparts = gemm_parts(blocks, nst, occ * c->sms, bn, spp);
    // the parts' sums (gemm_codes): 256 rows x bn vectors of floats per block and part
    const size_t part_bytes = nparts > 1 ? (size_t)nparts * blocks * kGemmTiles * kTile * bn * sizeof(float) : 0;
    const gemm_xp X(M.cols, M.ngroups, bnpad, a8);
    mpq_status st = grow(c, part_bytes + X.bytes, (size_t)blocks);
    if (st != MPQ_OK) return st;
    uint8_t *xprep = static_cast<uint8_t *>(c->scratch) + part_bytes;
    st = launch_pdl(c, a8 ? gemm_prep<true> : gemm_prep<false>, dim3((unsigned)(((size_t)M.ngroups * bnpad + 7) / 8)),
                    256, 0, M, x, batch, bnpad, bn, h->cb, xprep);
    if (st != MPQ_OK) return st;
    return launch_pdl(c, kGemm[a8][h->cb == 8][ni], dim3(ntn, nparts, nrb), kGemmThreads, ns * stage, M, x, batch, skip,
                      sg, ns, spp, bnpad, static_cast<const uint8_t *>(xprep), static_cast<float *>(c->scratch),
                      c->counters, y);
}

// The wgmma kernel (a device and build with its code, a matrix it takes:
// M.wexp), after wg_prep; tiles, stages and parts as Tiles and parts says
// (groups of 256 columns: a stage of one group), as many stages in flight
// as fit (at least two). A stage must be a multiple of 64 columns (the
// tensor map's blocks): groups of 160 or 224 columns, one to a stage, are
// left to the GEMM kernel.
mpq_status launch_wg(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    dmat M = h->m;
    if (!c->wgmma || !M.codes || !M.wexp || M.group > kGemmCols) return MPQ_ERR_UNSUPPORTED;
    if (skip) M.wgw = nullptr; // wg_words holds the constants of every plane: the warps work them out
    const bool words = M.wgw != nullptr;
    const int ni = batch <= 32 ? 0 : batch <= 64 ? 1 : 2, bn = 32 << ni;
    const int ntn = (batch + bn - 1) / bn, bnpad = ntn * bn;
    // the stages of a block when occ blocks share a multiprocessor: sg
    // groups each, ns in flight (0: two do not fit), smem bytes of shared
    // memory in all
    int sg = 0, ns = 0, smem = 0;
    auto plan = [&](int occ_) {
        const int room = min(c->mma_dmax, c->smem_sm / occ_ - c->smem_reserved - c->mma_static);
        sg = ns = 0;
        for (int cols = 256; cols >= 128 && ns < 3; cols /= 2) {
            const int g = M.group < cols ? cols / M.group : 1;
            if (g * M.group % 64) continue; // a stage is whole blocks of 64 columns of the tensor map
            sg = g, ns = min(kGemmStages, (room - kWgSlotAlign) / wg_stage(g, M.crec, M.group, bn, words).bytes);
        }
        smem = ns ? max(ns * wg_stage(sg, M.crec, M.group, bn, words).bytes, wg_tile_bytes(bn)) + kWgSlotAlign : 0;
        if (ns < 2 || smem > room) ns = 0;
    };
    // as many blocks per multiprocessor as the kernel is built for
    // (gemm_blocks: two for tiles of 32 vectors), one where two would not
    // hold two stages each
    int occ = gemm_blocks(bn / 8);
    plan(occ);
    if (ns == 0 && occ > 1) plan(occ = 1);
    if (ns == 0) return MPQ_ERR_UNSUPPORTED;
    const int nst = (M.ngroups + sg - 1) / sg;
    const int nrb = (M.ntiles + kGemmTiles - 1) / kGemmTiles, blocks = ntn * nrb;
    int spp;
    const int nparts = gemm_parts(blocks, nst, occ * c->sms, bn, spp);
    const size_t part_bytes = nparts > 1 ? (size_t)nparts * blocks * kGemmTiles * kTile * bn * sizeof(float) : 0;
    const int xcols = nst * sg * M.group; // wg_prep's rows: whole stages
    const size_t xbytes = wg_xbytes(xcols, bnpad) + sizeof(int) * (size_t)bnpad;
    const bool fuse = bn <= kWgFuseBn;
    mpq_status st = grow(c, part_bytes + xbytes, fuse ? (size_t)blocks : 0);
    if (st != MPQ_OK) return st;
    uint8_t *xprep = static_cast<uint8_t *>(c->scratch) + part_bytes;
    float *part = static_cast<float *>(c->scratch);
    const int *E = reinterpret_cast<const int *>(xprep + wg_xbytes(xcols, bnpad));
    // the tensor map of xprep (see wg_xbytes): dimensions 64 values, the
    // vectors, blocks of 64 values; a box is a stage of a vector tile
    CUtensorMap xmap;
    const cuuint64_t dims[3] = {64, (cuuint64_t)bnpad, (cuuint64_t)xcols / 64};
    const cuuint64_t strides[2] = {(cuuint64_t)xcols * 2, 128}; // bytes, of dimensions 1 and 2
    const cuuint32_t box[3] = {64, (cuuint32_t)bn, (cuuint32_t)(sg * M.group / 64)}, unit[3] = {1, 1, 1};
    const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(c->tmap_encode);
    if (encode(&xmap, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, xprep, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return MPQ_ERR_UNSUPPORTED;
    st = launch_pdl(c, wg_prep, dim3((unsigned)bnpad), kWgPrepThreads, 0, M, x, batch, xcols, bnpad, xprep);
    if (st != MPQ_OK) return st;
    st = launch_pdl(c, kWg[h->cb == 8][ni], dim3(ntn, nparts, nrb), kGemmThreads, smem, M, x, batch, skip, sg, ns, spp,
                    xmap, E, part, fuse ? c->counters : nullptr, y);
    if (st != MPQ_OK || nparts == 1 || fuse) return st;
    return launch_pdl(c, wg_sum, dim3(ntn, bn / kWgSumVectors, nrb), kGemmThreads, 0, M, x, batch, bn, nparts, E, part,
                      y);
}

// y = W16 x through cuBLAS (fp16 in, fp32 accumulate), the activations
// gathered into X16 first (packed column order, see dequant_f16).
mpq_status gemm_f16(cuda_ctx *c, const dmat &M, const __half *W16, __half *X16, const float *x, float *y, int batch)
{
    const size_t xn = (size_t)batch * M.cols;
    gather_f16<<<(unsigned)((xn + 255) / 256), 256, 0, c->stream>>>(M, x, batch, X16);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return map_error(e);
    const float one = 1.0f, zero = 0.0f;
    // column-major view: Y^T (rows x batch) = W (rows x cols) X^T (cols x batch)
    return map_blas(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, M.rows, batch, M.cols, &one, W16, CUDA_R_16F,
                                 M.cols, X16, CUDA_R_16F, M.cols, &zero, y, CUDA_R_32F, M.rows, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

// Batches past the tensor-core kernel's: dequantize to fp16 in scratch, then
// gemm_f16.
mpq_status gemv_batched(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    const dmat &M = h->m;
    const size_t wn = (size_t)M.rows * M.cols, xn = (size_t)batch * M.cols;
    mpq_status st = grow(c, sizeof(__half) * (wn + xn), 1);
    if (st != MPQ_OK) return st;
    __half *W16 = static_cast<__half *>(c->scratch), *X16 = W16 + wn;
    cudaError_t e = dequantize(c, h, skip, W16);
    return e != cudaSuccess ? map_error(e) : gemm_f16(c, M, W16, X16, x, y, batch);
}

mpq_status gemv_device(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip, bool a8);
mpq_status gemv_rules(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip, bool a8);

// 8-bit activations on the kernels that read float ones: the activations
// quantized and dequantized in packed column order (act8_dequant), the
// dense part multiplied by them as a matrix without p_col, col_scale and
// sparse part, then the sparse part times x added. Every value s^_a q is
// exact in float, so the MMA and plain kernels multiply exactly the 8-bit
// activations; the fp16 path rounds them to fp16 as it rounds x.
mpq_status gemv_a8_float(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    mpq_status st = reserve(&c->a8x, &c->a8x_bytes, sizeof(float) * batch * (size_t)h->m.cols);
    if (st != MPQ_OK) return st;
    st = launch_pdl(c, act8_dequant, dim3(h->m.ngroups, min(batch, 65535)), kA8Threads, 0, h->m, x, batch, c->a8x);
    if (st != MPQ_OK) return st;
    cuda_handle dense = *h;
    dense.m.p_col = nullptr, dense.m.cscale = nullptr, dense.m.sp_row_ptr = nullptr;
    st = gemv_rules(c, &dense, c->a8x, y, batch, skip, false);
    if (st != MPQ_OK || !h->m.sp_row_ptr) return st;
    const size_t n = (size_t)batch * h->m.rows;
    add_sparse<<<(unsigned)((n + 255) / 256), 256, 0, c->stream>>>(h->m, x, batch, y);
    return map_error(cudaGetLastError());
}

bool on_device(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// The checks of a product's arguments (of each of gemv_n's), and the
// device made current.
mpq_status gemv_args(cuda_ctx *c, const cuda_handle *h, const float *x, const float *y, int batch,
                     const mpq_gemv_opts *opts)
{
    if (!c || !h || !x || !y) return MPQ_ERR_ARG;
    if (batch < 1) return MPQ_ERR_SIZE;
    if (opts && (opts->skip_planes < 0 || opts->a8 < 0 || opts->a8 > 1)) return MPQ_ERR_ARG;
    const uintptr_t xa = reinterpret_cast<uintptr_t>(x), ya = reinterpret_cast<uintptr_t>(y);
    if (xa < ya + sizeof(float) * batch * (size_t)h->m.rows && ya < xa + sizeof(float) * batch * (size_t)h->m.cols)
        return MPQ_ERR_ARG; // y overlaps x: some blocks may still read x while others write y
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur != c->device) e = cudaSetDevice(c->device);
    return map_error(e);
}

// x and y may live on the host: then they are staged through device buffers
// and the call returns when y is back (device pointers: asynchronous).
mpq_status gemv(void *ctx, void *handle, const float *x, float *y, int batch, const mpq_gemv_opts *opts)
{
    cuda_ctx *c = static_cast<cuda_ctx *>(ctx);
    const cuda_handle *h = static_cast<const cuda_handle *>(handle);
    mpq_status st = gemv_args(c, h, x, y, batch, opts);
    if (st != MPQ_OK) return st;
    const int skip = opts ? opts->skip_planes : 0;
    const bool a8 = opts && opts->a8;
    if (on_device(x) && on_device(y)) return gemv_device(c, h, x, y, batch, skip, a8);
    const size_t xn = (size_t)batch * h->m.cols, yn = (size_t)batch * h->m.rows;
    st = reserve(&c->stage, &c->stage_bytes, (xn + yn) * sizeof(float));
    if (st != MPQ_OK) return st;
    float *dx = c->stage, *dy = c->stage + xn;
    cudaError_t e = cudaMemcpyAsync(dx, x, xn * sizeof(float), cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) return map_error(e);
    st = gemv_device(c, h, dx, dy, batch, skip, a8);
    if (st != MPQ_OK) return st;
    e = cudaMemcpyAsync(y, dy, yn * sizeof(float), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    return map_error(e);
}

// n products of one x. In host memory, x and every y: x is staged once, the
// products run one after another into the stage, their y are copied back
// in order and the call waits once; all on the device: asynchronous, as n
// calls of gemv; a mix: those n calls.
mpq_status gemv_n(void *ctx, int n, void *const *handles, const float *x, float *const *y, int batch,
                  const mpq_gemv_opts *opts)
{
    cuda_ctx *c = static_cast<cuda_ctx *>(ctx);
    if (!c || n < 1 || !handles || !y) return MPQ_ERR_ARG;
    size_t yn = 0;
    for (int k = 0; k < n; k++) {
        const cuda_handle *h = static_cast<const cuda_handle *>(handles[k]);
        const mpq_status st = gemv_args(c, h, x, y[k], batch, opts);
        if (st != MPQ_OK) return st;
        if (h->m.cols != static_cast<const cuda_handle *>(handles[0])->m.cols) return MPQ_ERR_SIZE;
        yn += (size_t)batch * h->m.rows;
    }
    const int skip = opts ? opts->skip_planes : 0;
    const bool a8 = opts && opts->a8;
    int on = on_device(x);
    for (int k = 0; k < n; k++) on += on_device(y[k]);
    for (int k = 0; on > 0 && k < n; k++) { // all on the device, or a mix: a product at a time
        const mpq_status st = on == n + 1
            ? gemv_device(c, static_cast<const cuda_handle *>(handles[k]), x, y[k], batch, skip, a8)
            : gemv(ctx, handles[k], x, y[k], batch, opts);
        if (st != MPQ_OK || k == n - 1) return st;
    }
    const size_t xn = (size_t)batch * static_cast<const cuda_handle *>(handles[0])->m.cols;
    mpq_status st = reserve(&c->stage, &c->stage_bytes, (xn + yn) * sizeof(float));
    if (st != MPQ_OK) return st;
    cudaError_t e = cudaMemcpyAsync(c->stage, x, xn * sizeof(float), cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) return map_error(e);
    float *dy = c->stage + xn;
    for (int k = 0; k < n; k++) {
        const cuda_handle *h = static_cast<const cuda_handle *>(handles[k]);
        if ((st = gemv_device(c, h, c->stage, dy, batch, skip, a8)) != MPQ_OK) return st;
        e = cudaMemcpyAsync(y[k], dy, (size_t)batch * h->m.rows * sizeof(float), cudaMemcpyDeviceToHost, c->stream);
        if (e != cudaSuccess) return map_error(e);
        dy += (size_t)batch * h->m.rows;
    }
    return map_error(cudaStreamSynchronize(c->stream));
}

// The kernels as the rule table calls them: each answers MPQ_ERR_UNSUPPORTED
// for a matrix it does not take, and the rule goes on to the next row.
mpq_status run_mma(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    return launch_mma(c, h, x, y, batch, skip, false);
}
mpq_status run_mma_a8(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    return launch_mma(c, h, x, y, batch, skip, true);
}
mpq_status run_gemm(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    return launch_gemm(c, h, x, y, batch, skip, false);
}
mpq_status run_gemm_a8(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    return launch_gemm(c, h, x, y, batch, skip, true);
}
mpq_status run_wg(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    return launch_wg(c, h, x, y, batch, skip);
}
mpq_status run_lut(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    return launch_lut(c, h, x, y, batch, skip, false);
}
mpq_status run_lut_a8(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    return launch_lut(c, h, x, y, batch, skip, true);
}
mpq_status run_plain(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    const int n = h->m.rows * batch;
    gemv_plain<<<(n + 127) / 128, 128, 0, c->stream>>>(h->m, x, batch, skip, y);
    return map_error(cudaGetLastError());
}
// pieces of 16 vectors (the rest last), each a product of its own: the MMA
// kernel, or the LUT kernel for a rest below MPQ_CUDA_MMA_BATCH
mpq_status run_pieces(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    mpq_status st = MPQ_OK;
    for (int v = 0; v < batch && st == MPQ_OK; v += 16)
        st = gemv_rules(c, h, x + (size_t)v * h->m.cols, y + (size_t)v * h->m.rows, min(16, batch - v), skip, false);
    return st;
}

// THE BATCH -> KERNEL RULE (mpq_cuda.h, docs/DESIGN.md and the README point
// here). Rows are tried in order; the first whose activations, batch range
// and need hold and whose kernel takes the matrix runs the product. Needs:
// kQuads, the LUT kernel's layout (groups and the last group of whole
// quads; the MMA kernel also needs the code copy and says so by its
// answer); kCodes, the code copy. The crossovers behind the ranges are measured in
// bench/results/NOTES.md ("The CUDA kernels", "The GEMM kernel", "The wgmma
// kernel"). A kernel that cannot take a matrix (the GEMM kernel: groups
// past kGemmCols, or too little shared memory; the wgmma kernel also: a
// build or device without its code, or scales that one power of two per
// row does not make exact fp16 numbers) answers MPQ_ERR_UNSUPPORTED and the
// next row runs it.
enum rule_need { kAny, kQuads, kCodes };
struct kernel_rule {
    bool a8;        // 8-bit activations
    int lo, hi;     // batches
    rule_need need; // what the matrix must have
    mpq_status (*run)(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip);
};
constexpr int kAll = 1 << 30;
const kernel_rule kRules[] = {
    {true, MPQ_CUDA_GEMM_A8_BATCH, MPQ_CUDA_GEMM_A8_MAX, kCodes, run_gemm_a8}, // the GEMM kernel on int8 tensor cores
    {true, MPQ_CUDA_MMA_BATCH, MPQ_CUDA_MMA_MAX, kQuads, run_mma_a8},  // int8 tensor cores, pieces of 32 along grid z
    {true, 1, 8, kQuads, run_lut_a8},                                  // integer tables, activations quantized inside
    {true, 1, kAll, kAny, gemv_a8_float},                              // quantized, dequantized, then the rows below
    {false, MPQ_CUDA_WG_BATCH, MPQ_CUDA_WG_MAX, kCodes, run_wg},       // sm_90a: wgmma, fp16 weights in registers
    {false, MPQ_CUDA_GEMM_BATCH, MPQ_CUDA_GEMM_MAX, kCodes, run_gemm}, // groups up to kGemmCols, exact codes
    {false, 17, MPQ_CUDA_MMA_MAX, kCodes, run_pieces},                 // wider groups: the MMA kernel, 16 at a time
    {false, 17, kAll, kAny, gemv_batched},                             // fp16 weights and activations, cuBLAS
    {false, MPQ_CUDA_MMA_BATCH, 16, kQuads, run_mma},                  // fp16 tensor cores on the code copy
    {false, 9, 16, kAny, gemv_batched},                                // where the MMA kernel does not apply
    {false, 1, 8, kQuads, run_lut},                                    // lookup tables in shared memory
    {false, 1, 8, kAny, run_plain},                                    // every weight decoded, any group
};

// A product on device pointers: V x first for a rotated matrix (ROTATION),
// then the rule table.
mpq_status gemv_device(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip, bool a8)
{
    if (h->m.rot_m) {
        const dmat &M = h->m;
        const size_t bytes = sizeof(float) * (size_t)batch * (size_t)M.cols;
        mpq_status st = reserve(&c->rotx, &c->rotx_bytes, bytes);
        if (st != MPQ_OK) return st;
        int lp = 0;
        while ((1 << lp) < M.rot_p) lp++;
        rotate_input<<<batch, 1024, bytes / batch, c->stream>>>(x, c->rotx, M.cols, M.rot_p, lp, M.rot_m, M.rot_R,
                                                                M.rot_sign, (float)(1.0 / sqrt((double)M.rot_p)));
        if ((st = map_error(cudaGetLastError())) != MPQ_OK) return st;
        x = c->rotx;
    }
    return gemv_rules(c, h, x, y, batch, skip, a8);
}

// The rule table on the input the kernels read (V x for a rotated matrix).
mpq_status gemv_rules(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip, bool a8)
{
    if (h->w16) {                                       // the fp16 baseline
        if (skip > 0 || a8) return MPQ_ERR_UNSUPPORTED; // col_scale and the sparse part are inside its weights
        mpq_status st = grow(c, sizeof(__half) * (size_t)batch * h->m.cols, 1);
        return st != MPQ_OK ? st : gemm_f16(c, h->m, h->w16, static_cast<__half *>(c->scratch), x, y, batch);
    }
    for (const kernel_rule &r : kRules) {
        if (r.a8 != a8 || batch < r.lo || batch > r.hi) continue;
        if ((r.need == kQuads && !h->fast) || (r.need == kCodes && !h->m.codes)) continue;
        const mpq_status st = r.run(c, h, x, y, batch, skip);
        if (st != MPQ_ERR_UNSUPPORTED) return st;
    }
    return MPQ_ERR_UNSUPPORTED;
}

// Host memory page-locked for every device (portable), so that gemv's
// copies of it go by DMA, asynchronous on the stream, with no staging copy
// through the driver's own buffers. unpin does not read ctx: it may run
// after mpq_cuda_backend_destroy.
mpq_status pin(void *ctx, void *p, size_t bytes)
{
    const cuda_ctx *c = static_cast<const cuda_ctx *>(ctx);
    if (!c || !p || bytes == 0) return MPQ_ERR_ARG;
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur != c->device) e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (e == cudaSuccess) return MPQ_OK;
    cudaGetLastError(); // not sticky: clear it for the calls after
    return e == cudaErrorHostMemoryAlreadyRegistered ? MPQ_ERR_ARG : map_error(e);
}

void unpin(void *ctx, void *p)
{
    (void)ctx;
    if (p && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
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
    cuda_ctx *c = static_cast<cuda_ctx *>(calloc(1, sizeof(cuda_ctx)));
    if (!c) return MPQ_ERR_NOMEM;
    c->device = device;
    int major = 0, minor = 0;
    e = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    c->cc = 10 * major + minor;
    if (e == cudaSuccess && c->cc < 80) e = cudaErrorNoKernelImageForDevice; // cp.async and mma.sync need sm_80
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c);
        return map_error(e);
    }
    // the kernels' table space (64 KB) is past the default 48 KB: raise it
    // once, then ask how many blocks of each fit on a multiprocessor
    for (int k = 0; k < 24 && e == cudaSuccess; k++) {
        const lut_kernel kernel = kLut[k / 12][k / 3 % 4][k % 3];
        int *occ = &c->occ[k / 12][k / 3 % 4][k % 3];
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kLutSmem);
        if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(occ, kernel, kThreads, kLutSmem);
        if (e == cudaSuccess && *occ < 1) e = cudaErrorInvalidConfiguration;
    }
    // the MMA kernel: its shared memory is sized per launch (launch_mma)
    int per_block = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c->smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&c->smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
    c->mma_static = 0;
    for (int k = 0; k < 12 && e == cudaSuccess; k++) { // the most static memory of them all
        cudaFuncAttributes fa;
        if (kMma[k / 6][k / 2 % 3][k % 2]) e = cudaFuncGetAttributes(&fa, kMma[k / 6][k / 2 % 3][k % 2]);
        if (e == cudaSuccess && kMma[k / 6][k / 2 % 3][k % 2] && (int)fa.sharedSizeBytes > c->mma_static)
            c->mma_static = (int)fa.sharedSizeBytes;
    }
    for (int k = 0; k < 12 && e == cudaSuccess; k++) { // and of the GEMM kernels, which share mma_dmax
        cudaFuncAttributes fa;
        e = cudaFuncGetAttributes(&fa, kGemm[k / 6][k / 3 % 2][k % 3]);
        if (e == cudaSuccess && (int)fa.sharedSizeBytes > c->mma_static) c->mma_static = (int)fa.sharedSizeBytes;
    }
    // the wgmma kernels, which share it too (every entry of their table)
    constexpr int nwg = (int)(sizeof(kWg) / sizeof(kWg[0][0]));
    for (int k = 0; k < nwg && e == cudaSuccess; k++) {
        cudaFuncAttributes fa;
        e = cudaFuncGetAttributes(&fa, (&kWg[0][0])[k]);
        if (e == cudaSuccess && (int)fa.sharedSizeBytes > c->mma_static) c->mma_static = (int)fa.sharedSizeBytes;
    }
    c->mma_dmax = per_block - c->mma_static;
    c->rot_smem = per_block;
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(rotate_input, cudaFuncAttributeMaxDynamicSharedMemorySize, per_block);
    for (int k = 0; k < 12 && e == cudaSuccess; k++)
        if (kMma[k / 6][k / 2 % 3][k % 2])
            e = cudaFuncSetAttribute(kMma[k / 6][k / 2 % 3][k % 2], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     c->mma_dmax);
    for (int k = 0; k < 12 && e == cudaSuccess; k++)
        e = cudaFuncSetAttribute(kGemm[k / 6][k / 3 % 2][k % 3], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 c->mma_dmax);
    for (int k = 0; k < nwg && e == cudaSuccess; k++)
        e = cudaFuncSetAttribute((&kWg[0][0])[k], cudaFuncAttributeMaxDynamicSharedMemorySize, c->mma_dmax);
    if (e == cudaSuccess) { // does this build have the wgmma kernel's code for the device?
        int *has = nullptr;
        e = cudaMalloc(&has, sizeof(int));
        if (e == cudaSuccess) {
            wg_probe<<<1, 1, 0, c->stream>>>(has);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaMemcpyAsync(&c->wgmma, has, sizeof(int), cudaMemcpyDeviceToHost, c->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
        cudaFree(has);
    }
    if (e == cudaSuccess && c->wgmma) { // its activations come through a tensor map, encoded by the driver
        cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
        const cudaError_t f =
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &c->tmap_encode, 12000, cudaEnableDefault, &q);
#else
        const cudaError_t f = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &c->tmap_encode, cudaEnableDefault, &q);
#endif
        if (f != cudaSuccess || q != cudaDriverEntryPointSuccess)
            c->tmap_encode = nullptr, c->wgmma = 0, (void)cudaGetLastError();
    }
    for (int k = 0; k < 6 && e == cudaSuccess; k++) // a group's activations (at most kMmaFragBytes) and quad sums
        if (kPrep[k / 3][k % 3])
            e = cudaFuncSetAttribute(kPrep[k / 3][k % 3], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kMmaFragBytes + kMmaFragBytes / 32);
    if (e != cudaSuccess) {
        cudaStreamDestroy(c->stream);
        free(c);
        return map_error(e);
    }
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(c->blas, c->stream);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(c->stream);
        free(c);
        return map_blas(bs);
    }
    memset(b, 0, sizeof *b);
    b->name = "cuda";
    b->caps = MPQ_CAP_BITPLANE | MPQ_CAP_HOST_MEMORY | MPQ_CAP_DEVICE_MEMORY;
    b->ctx = c;
    b->upload = upload;
    b->release = release;
    b->gemv = gemv;
    b->synchronize = synchronize;
    b->pin = pin;
    b->unpin = unpin;
    b->gemv_n = gemv_n;
    return MPQ_OK;
}

extern "C" mpq_status mpq_cuda_backend_fp16(int device, mpq_backend *b)
{
    mpq_status st = mpq_cuda_backend(device, b);
    if (st != MPQ_OK) return st;
    static_cast<cuda_ctx *>(b->ctx)->fp16_weights = 1;
    b->name = "cuda-fp16";
    return MPQ_OK;
}

extern "C" void mpq_cuda_backend_destroy(mpq_backend *b)
{
    if (!b || !b->ctx) return;
    cuda_ctx *c = static_cast<cuda_ctx *>(b->ctx);
    cudaStreamSynchronize(c->stream);
    cudaFree(c->scratch);
    cudaFree(c->counters);
    cudaFree(c->stage);
    cudaFree(c->a8x);
    cudaFree(c->rotx);
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    free(c);
    memset(b, 0, sizeof *b);
}

extern "C" void *mpq_cuda_stream(const mpq_backend *b)
{
    if (!b || !b->ctx || !b->name || (strcmp(b->name, "cuda") && strcmp(b->name, "cuda-fp16"))) return nullptr;
    return static_cast<void *>(static_cast<const cuda_ctx *>(b->ctx)->stream);
}
