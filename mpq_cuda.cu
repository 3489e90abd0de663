// mpq_cuda.cu - the CUDA backend of mpq: see mpq_cuda.h for what is in.
//
// KERNEL (batch 1..8, every format with group % 32 == 0): one launch per
// product. A block takes a slice of the packed columns (64 table chunks of
// 8 columns, 512 columns at batch 1, fewer at larger batches) and a run of
// row tiles. It first builds, in shared memory, the 256-entry table of every
// chunk of its slice for every vector: T_c[p] = sum_k (bit k of p ? +1 : -1)
// x~[8c + k], with x~ gathered through p_col and scaled by col_scale (the
// fused table building of the design notes). Then each warp takes one tile
// (16 rows) and walks the slice in steps of 8 / batch quads: a lane loads the
// 16 bytes of one quad (4 rows x 32 columns) of one plane and looks up its
// 16 bytes; the 4 lanes of a quad take the 4 bytes of a row in rotated order
// so that the 32 lanes of a warp always read 32 different banks. Plane sums
// are weighted by 2^i (0 for planes a row does not have or skips), scaled by
// the row's s^ and offset by z^ times the quad's activation sum. A block
// walks the slices of its column part one after the other, with the next
// slice's plane loads in flight while it builds that slice's tables. Per-row
// sums of a column part go to a scratch buffer; the last block of a row
// range to finish sums the parts in a fixed order (deterministic), adds the
// sparse part, and scatters through p_row.
//
// PERFORMANCE (H100, bench_gemv_cuda, 2026-11-22): correct everywhere, not
// yet fast. 8192 x 8192 at batch 1 takes 28 us at 2 bits and 35 us at 3.25
// (22-32 % of the copy bandwidth; cuBLAS fp16 49 us), and batches 4 and 8
// are slower than cuBLAS. Nsight Compute on the batch-1 kernel: one wave of
// 256 blocks, 2 blocks (16 warps) per SM for 128 registers, an issue rate
// of 0.42 per scheduler, 13M warp instructions for 19 MB: the work per byte
// is split between building the 256-entry tables (16K entries per block and
// slice), locating each quad's record (two dependent loads, divisions) and
// the lookups themselves, and too few warps hide the latencies. Batches
// 2..8 shrink the slice (tables for every vector share 64 KB), so the table
// building grows with the batch. Next steps: several quads per lane and
// record offsets loaded once per slice (less locating per byte), 16-entry
// nibble or fp16 tables (much cheaper building, wider slices, room for
// every vector), and fewer registers for more warps per SM.
//
// OTHER PATHS: groups that are not a multiple of 32 columns (tails of
// pairs and singles inside every group) use a plain kernel, one thread per
// row and vector, which decodes every weight; batches beyond 8 dequantize to
// fp16 in original coordinates and multiply with cuBLAS (fp32 accumulate).
#include "mpq_cuda.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace {

constexpr int kTile = 16;       // rows of a tile (MPQ_TILE_ROWS)
constexpr int kThreads = 256;   // threads of a GEMV block (8 warps)
constexpr int kWords = 64;      // table words per entry index p: batch * chunks per slice
constexpr int kTableBytes = 256 * kWords * 4;

// The device-side description of an uploaded matrix.
struct dmat {
    int format, rows, cols, group, block_rows, ngroups, ntiles, meta;
    int uniform;              // block_rows % 16 == 0: every row of a record has its planes
    const uint8_t *data;      // the records
    const uint8_t *bits;      // bits map
    const uint32_t *p_row, *p_col;
    const float *cscale;
    const uint32_t *rec;      // (tile, group) -> byte offset of the record / 16
    const uint8_t *planes;    // (tile, group) -> planes stored in the record
    const uint32_t *sp_row_ptr;
    const uint16_t *sp_col16;
    const uint32_t *sp_col32;
    const uint16_t *sp_val;
};

struct cuda_ctx {
    int device, sms;
    cudaStream_t stream;
    cublasHandle_t blas;
    // scratch, grown on demand
    void *scratch;
    size_t scratch_bytes;
    unsigned *counters;
    size_t ncounters;
    // device copies of host x and y (see gemv)
    float *stage;
    size_t stage_bytes;
};

struct cuda_handle {
    mpq_packed view;     // host view (host pointers)
    dmat m;              // device pointers
    void *dbuf;          // the packed buffer in device memory
    void *dside;         // rec + planes
    int fast;            // the quad kernel applies
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

// 2^e for -126 <= e <= 127 (exact, no libm); smaller e (MXINT scales of
// tiny blocks) through ldexpf.
__device__ __forceinline__ float pow2i(int e) { return e >= -126 ? __int_as_float((e + 127) << 23) : ldexpf(1.0f, e); }

// Weight of plane i for a row of width b with `skip` planes dropped
// (at least one plane remains): 2^i for sk <= i < b, else 0.
__device__ __forceinline__ float plane_weight(int i, int b, int skip)
{
    int sk = skip < b - 1 ? skip : b - 1;
    return (i >= sk && i < b) ? pow2i(i) : 0.0f;
}

// The (s^, z^) of row r of a record.
__device__ __forceinline__ void row_pair(const dmat &M, const uint8_t *rec, int r, int b, float &s, float &z)
{
    if (M.format == MPQ_FORMAT_MXINT) {
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

// Table word of vector v, chunk c (of the slice), entry p: a layout in which
// the lanes of one warp step always read 32 different banks (see the top).
template <int B>
__device__ __forceinline__ int tidx(int v, int c, int p)
{
    constexpr int nch = kWords / B, half = nch / 2;
    int sh = (B == 1 || v >= B / 2) ? half : 0;
    return p * kWords + v * nch + ((c + sh) & (nch - 1));
}

// One quad of one tile: where its record is (two small loads), then its
// planes, pairs and widths (the loads that take the time).
struct quad_ref {
    int cq, g, qg, np; // quad in the slice (-1: none), group, quad in the group, planes
    uint32_t rec;      // record offset / 16
};

struct quad_load {
    uint4 u[8];        // plane i of the lane's 4 rows x 32 columns (i < np)
    int bw[4];         // widths of the lane's 4 rows
    float s[4], z[4];
};

__device__ __forceinline__ void quad_locate(const dmat &M, int t, int cq, int c0, int quad_cols, quad_ref &R)
{
    const int col = c0 + 32 * cq;
    R.cq = (t < M.ntiles && col < quad_cols) ? cq : -1;
    R.np = 0;
    if (R.cq < 0) return;
    R.g = col / M.group;
    R.qg = (col - R.g * M.group) / 32;
    const size_t rg = (size_t)t * M.ngroups + R.g;
    R.rec = __ldg(&M.rec[rg]);
    R.np = __ldg(&M.planes[rg]);
}

__device__ __forceinline__ void quad_issue(const dmat &M, int t, int rq, const quad_ref &R, quad_load &L)
{
    if (R.cq < 0) return;
    const uint8_t *rec = M.data + 16 * (size_t)R.rec;
    const int gw = min(M.group, M.cols - R.g * M.group), stride = ((gw + 7) / 8) * 16;
    const uint8_t *pl = rec + M.meta + 64 * R.qg + 16 * rq;
#pragma unroll
    for (int i = 0; i < 8; i++) // every plane in flight at once
        if (i < R.np) L.u[i] = __ldcs(reinterpret_cast<const uint4 *>(pl + (size_t)i * stride));
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const int row = t * kTile + 4 * rq + w;
        L.bw[w] = M.uniform ? (row < M.rows ? R.np : 0) : width_at(M, row, R.g);
    }
    if (M.format == MPQ_FORMAT_MXINT) { // the 4 rows' E8M0 bytes in one load
        const uint32_t e = *reinterpret_cast<const uint32_t *>(rec + 4 * rq);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const int b = L.bw[w];
            L.s[w] = b ? pow2i((int)((e >> (8 * w)) & 255u) - 127 - b + 1) : 0.0f;
            L.z[w] = -L.s[w];
        }
    } else { // the 4 rows' s^ and z^ in two 8-byte loads
        const uint2 sh = *reinterpret_cast<const uint2 *>(rec + 8 * rq), zh = *reinterpret_cast<const uint2 *>(rec + 32 + 8 * rq);
        const uint32_t sw[4] = {sh.x & 0xFFFFu, sh.x >> 16, sh.y & 0xFFFFu, sh.y >> 16};
        const uint32_t zw[4] = {zh.x & 0xFFFFu, zh.x >> 16, zh.y & 0xFFFFu, zh.y >> 16};
#pragma unroll
        for (int w = 0; w < 4; w++) {
            L.s[w] = __half2float(__ushort_as_half((unsigned short)sw[w]));
            L.z[w] = __half2float(__ushort_as_half((unsigned short)zw[w]));
        }
    }
}

constexpr int kTilesPerBlock = kThreads / 32; // one tile per warp

// The quad kernel. Grid: x = column parts of `spp` slices each, y = row
// blocks of one tile per warp. Per slice, the warps' plane loads are in
// flight while the block builds the slice's tables (software pipelining
// over the slices of a part).
template <int B>
__global__ void __launch_bounds__(kThreads, 2) gemv_quads(dmat M, const float *__restrict__ x, int batch, int skip,
                                                          int quad_cols, int spp, float *__restrict__ part,
                                                          unsigned *__restrict__ counters, float *__restrict__ y)
{
    constexpr int nch = kWords / B;       // chunks per slice
    constexpr int scols = nch * 8;        // columns per slice
    constexpr int qps = 8 / B;            // quads per warp step
    extern __shared__ float T[];          // 256 * kWords
    __shared__ float xs[B][scols];
    __shared__ float qsum[B][nch / 4];
    __shared__ bool last;

    const int part_id = blockIdx.x, nparts = gridDim.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int v = lane / (4 * qps), q = (lane / 4) % qps, rq = lane & 3;
    const int t_first = blockIdx.y * kTilesPerBlock, t = t_first + warp;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int s_first = part_id * spp;
    const int s_end = min(s_first + spp, (quad_cols + scols - 1) / scols);

    quad_ref R[2], Rn[2];
    quad_load L[2];
#pragma unroll
    for (int step = 0; step < 2; step++) quad_locate(M, t, step * qps + q, s_first * scols, quad_cols, R[step]);
#pragma unroll
    for (int step = 0; step < 2; step++) quad_issue(M, t, rq, R[step], L[step]);

    for (int sl = s_first; sl < s_end; sl++) {
        const int c0 = sl * scols; // first column of the slice
        if (sl + 1 < s_end)
#pragma unroll
            for (int step = 0; step < 2; step++) quad_locate(M, t, step * qps + q, c0 + scols, quad_cols, Rn[step]);
        // 1. activations of the slice: gather, scale, zero past the quad columns
        for (int k = tid; k < B * scols; k += kThreads) {
            int vv = k / scols, j = k % scols, col = c0 + j;
            float val = 0.0f;
            if (vv < batch && col < quad_cols) {
                int src = M.p_col ? (int)M.p_col[col] : col;
                val = x[(size_t)vv * M.cols + src] * (M.cscale ? M.cscale[col] : 1.0f);
            }
            xs[vv][j] = val;
        }
        __syncthreads();
        // 2. tables: thread -> one (vector, chunk) word and a quarter of the entries
        {
            const int w = tid % kWords, pq = tid / kWords;
            const int vv = w / nch, c = w % nch;
            float xv[8];
#pragma unroll
            for (int k = 0; k < 8; k++) xv[k] = xs[vv][8 * c + k];
            float lo[16], hi4[4];
#pragma unroll
            for (int n = 0; n < 16; n++) {
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; k++) s += (n >> k & 1) ? xv[k] : -xv[k];
                lo[n] = s;
            }
#pragma unroll
            for (int h = 0; h < 4; h++) {
                int n = 4 * pq + h;
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; k++) s += (n >> k & 1) ? xv[4 + k] : -xv[4 + k];
                hi4[h] = s;
            }
#pragma unroll
            for (int h = 0; h < 4; h++)
#pragma unroll
                for (int n = 0; n < 16; n++) T[tidx<B>(vv, c, (4 * pq + h) * 16 + n)] = lo[n] + hi4[h];
        }
        for (int k = tid; k < B * (nch / 4); k += kThreads) {
            int vv = k / (nch / 4), qq = k % (nch / 4);
            float s = 0.0f;
            for (int j = 0; j < 32; j++) s += xs[vv][32 * qq + j];
            qsum[vv][qq] = s;
        }
        __syncthreads();
        // 3. the lookups of the warp's tile
#pragma unroll
        for (int step = 0; step < 2; step++) {
            if (R[step].cq < 0) continue;
            const int cq = R[step].cq;
            int Tk[4];           // the lane's four tables (word of entry 0), in rotated order
            int sh[4];           // the byte each of them reads
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const int j = (kk + rq) & 3;
                Tk[kk] = tidx<B>(v, 4 * cq + j, 0);
                sh[kk] = 8 * j;
            }
            int lo_[4], hi_[4]; // planes lo..hi-1 count for row w
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const int b = L[step].bw[w];
                hi_[w] = b;
                lo_[w] = skip < b - 1 ? skip : b - 1;
            }
            float ps[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (i >= R[step].np) break;
                const uint32_t word[4] = {L[step].u[i].x, L[step].u[i].y, L[step].u[i].z, L[step].u[i].w};
                float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
#pragma unroll
                    for (int w = 0; w < 4; w++) sum[w] += T[Tk[kk] + (int)((word[w] >> sh[kk]) & 255u) * kWords];
#pragma unroll
                for (int w = 0; w < 4; w++) ps[w] += (i >= lo_[w] && i < hi_[w]) ? (float)(1 << i) * sum[w] : 0.0f;
            }
            const float xq = qsum[v][cq];
#pragma unroll
            for (int w = 0; w < 4; w++) acc[w] += L[step].s[w] * ps[w] + L[step].z[w] * xq;
        }
        // 4. the next slice's planes in flight before the tables are rebuilt
        if (sl + 1 < s_end) {
#pragma unroll
            for (int step = 0; step < 2; step++) {
                R[step] = Rn[step];
                quad_issue(M, t, rq, R[step], L[step]);
            }
        }
        __syncthreads();
    }
    // lanes of the same (vector, row quartet) hold parts of the same rows
#pragma unroll
    for (int off = 4; off < 4 * qps; off <<= 1)
#pragma unroll
        for (int w = 0; w < 4; w++) acc[w] += __shfl_xor_sync(0xffffffffu, acc[w], off);
    if (q == 0 && v < batch && t < M.ntiles)
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const int row = t * kTile + 4 * rq + w;
            if (row < M.rows) part[((size_t)part_id * batch + v) * M.rows + row] = acc[w];
        }

    // 5. the last block of this row range sums the column parts in order
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&counters[blockIdx.y], 1u) == (unsigned)nparts - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int r0 = t_first * kTile, r1 = min(M.rows, (t_first + kTilesPerBlock) * kTile);
    for (int k = tid; k < (r1 - r0) * batch; k += kThreads) {
        const int row = r0 + k % (r1 - r0), vv = k / (r1 - r0);
        float sum = 0.0f;
        for (int pp = 0; pp < nparts; pp++) sum += __ldcg(&part[((size_t)pp * batch + vv) * M.rows + row]);
        const int orow = M.p_row ? (int)M.p_row[row] : row;
        y[(size_t)vv * M.rows + orow] = sum + sparse_dot(M, orow, x + (size_t)vv * M.cols);
    }
    if (tid == 0) counters[blockIdx.y] = 0; // ready for the next launch
}

// Decodes weight (row, col) of the packed matrix (packed coordinates) with
// `skip` planes dropped, without the column scale.
__device__ float decode_weight(const dmat &M, int row, int col, int skip)
{
    const int t = row / kTile, r = row % kTile, g = col / M.group, j = col - g * M.group;
    const size_t rg = (size_t)t * M.ngroups + g;
    const uint8_t *rec = M.data + 16 * (size_t)M.rec[rg];
    const int b = width_at(M, row, g), gw = min(M.group, M.cols - g * M.group), nchg = (gw + 7) / 8;
    float s, z;
    row_pair(M, rec, r, b, s, z);
    const int c = j / 8, q4 = nchg & ~3;
    size_t off; // the byte of chunk c of row r inside a plane (BYTE LAYOUT)
    if (c < q4)
        off = (size_t)(c >> 2) * 64 + (size_t)r * 4 + (c & 3);
    else {
        off = (size_t)q4 * 16;
        int cc = c - q4;
        if (nchg & 2) {
            if (cc < 2) off += (size_t)r * 2 + cc;
            else off += 32 + (size_t)r;
        } else
            off += (size_t)r;
    }
    float m = 0.0f;
    for (int i = 0; i < b; i++) {
        const int bit = rec[M.meta + (size_t)i * nchg * 16 + off] >> (j & 7) & 1;
        m += plane_weight(i, b, skip) * (bit ? 1.0f : -1.0f);
    }
    return s * m + z;
}

// The plain kernel: one thread per (row, vector), every weight decoded.
__global__ void gemv_plain(dmat M, const float *__restrict__ x, int batch, int skip, float *__restrict__ y)
{
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= M.rows * batch) return;
    const int row = k % M.rows, v = k / M.rows;
    const float *xv = x + (size_t)v * M.cols;
    float sum = 0.0f;
    for (int col = 0; col < M.cols; col++) {
        const int src = M.p_col ? (int)M.p_col[col] : col;
        sum += decode_weight(M, row, col, skip) * (xv[src] * (M.cscale ? M.cscale[col] : 1.0f));
    }
    const int orow = M.p_row ? (int)M.p_row[row] : row;
    y[(size_t)v * M.rows + orow] = sum + sparse_dot(M, orow, xv);
}

// Dequantizes to fp16 in ORIGINAL coordinates (for the cuBLAS path): one
// thread per packed weight; the sparse part is added in float first.
__global__ void dequant_f16(dmat M, int skip, __half *__restrict__ W)
{
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)M.rows * M.cols) return;
    const int row = (int)(k / M.cols), col = (int)(k % M.cols);
    float w = decode_weight(M, row, col, skip) * (M.cscale ? M.cscale[col] : 1.0f);
    const int orow = M.p_row ? (int)M.p_row[row] : row, ocol = M.p_col ? (int)M.p_col[col] : col;
    if (M.sp_row_ptr) { // binary search of the original column in the row's entries
        uint32_t lo = M.sp_row_ptr[orow], hi = M.sp_row_ptr[orow + 1];
        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2, c = M.sp_col16 ? M.sp_col16[mid] : M.sp_col32[mid];
            if (c < (uint32_t)ocol) lo = mid + 1;
            else hi = mid;
        }
        if (lo < M.sp_row_ptr[orow + 1] && (M.sp_col16 ? M.sp_col16[lo] : M.sp_col32[lo]) == (uint32_t)ocol)
            w += __half2float(__ushort_as_half(M.sp_val[lo]));
    }
    W[(size_t)orow * M.cols + ocol] = __float2half_rn(w);
}

__global__ void to_f16(const float *__restrict__ x, size_t n, __half *__restrict__ out)
{
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) out[k] = __float2half_rn(x[k]);
}

// ------------------------------------------------------------------ host code

// Record offsets and plane counts of every (tile, group), from the BYTE
// LAYOUT of mpq.h: band after band, inside a band group after group, inside
// a group tile after tile; a record is the metadata then its planes.
bool record_table(const mpq_packed *A, uint32_t *rec, uint8_t *planes)
{
    const int ntiles = (A->rows + kTile - 1) / kTile, tiles_per_band = A->band_rows / kTile;
    const int meta = A->format == MPQ_FORMAT_MXINT ? kTile : 4 * kTile;
    for (int b = 0; b < A->nbands; b++) {
        uint64_t pos = A->band_off[b];
        const int t0 = b * tiles_per_band, t1 = t0 + tiles_per_band < ntiles ? t0 + tiles_per_band : ntiles;
        for (int g = 0; g < A->ngroups; g++) {
            const int gw = A->cols - g * A->group < A->group ? A->cols - g * A->group : A->group;
            for (int t = t0; t < t1; t++) {
                int np = 0;
                for (int r = t * kTile; r < (t + 1) * kTile && r < A->rows; r++) {
                    int w = A->bits[(size_t)(r / A->block_rows) * A->ngroups + g];
                    np = w > np ? w : np;
                }
                if (pos % 16 || pos / 16 > 0xFFFFFFFFull) return false;
                rec[(size_t)t * A->ngroups + g] = (uint32_t)(pos / 16);
                planes[(size_t)t * A->ngroups + g] = (uint8_t)np;
                pos += (uint64_t)meta + (uint64_t)np * (uint64_t)((gw + 7) / 8) * 16u;
            }
        }
        if (pos != A->band_off[b + 1]) return false;
    }
    return true;
}

template <typename P>
P *dev_ptr(const cuda_handle *h, const void *host)
{
    if (!host) return nullptr;
    const uint8_t *base = static_cast<const uint8_t *>(h->view.buf);
    return reinterpret_cast<P *>(static_cast<uint8_t *>(h->dbuf) + (static_cast<const uint8_t *>(host) - base));
}

mpq_status upload(void *ctx, const mpq_packed *A, void **handle)
{
    cuda_ctx *c = static_cast<cuda_ctx *>(ctx);
    if (!c || !A || !handle || !A->buf || A->bytes == 0 || !A->bits || !A->band_off) return MPQ_ERR_ARG;
    if (A->format != MPQ_FORMAT_BITPLANE && A->format != MPQ_FORMAT_MXINT) return MPQ_ERR_UNSUPPORTED;
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return map_error(e);
    const int ntiles = (A->rows + kTile - 1) / kTile;
    const size_t nrec = (size_t)ntiles * (size_t)A->ngroups;
    uint8_t *side = static_cast<uint8_t *>(malloc(nrec * 5));
    cuda_handle *h = static_cast<cuda_handle *>(calloc(1, sizeof(cuda_handle)));
    if (!side || !h) {
        free(side), free(h);
        return MPQ_ERR_NOMEM;
    }
    uint32_t *rec = reinterpret_cast<uint32_t *>(side);
    uint8_t *planes = side + nrec * 4;
    if (!record_table(A, rec, planes)) {
        free(side), free(h);
        return MPQ_ERR_FORMAT;
    }
    h->view = *A;
    h->view.owned = 0;
    e = cudaMalloc(&h->dbuf, A->bytes);
    if (e == cudaSuccess) e = cudaMalloc(&h->dside, nrec * 5);
    if (e == cudaSuccess) e = cudaMemcpyAsync(h->dbuf, A->buf, A->bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(h->dside, side, nrec * 5, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    free(side);
    if (e != cudaSuccess) {
        cudaFree(h->dbuf), cudaFree(h->dside);
        free(h);
        return map_error(e);
    }
    dmat &M = h->m;
    M.format = A->format, M.rows = A->rows, M.cols = A->cols, M.group = A->group, M.block_rows = A->block_rows;
    M.ngroups = A->ngroups, M.ntiles = ntiles, M.meta = A->format == MPQ_FORMAT_MXINT ? kTile : 4 * kTile;
    M.data = dev_ptr<const uint8_t>(h, A->data);
    M.bits = dev_ptr<const uint8_t>(h, A->bits);
    M.p_row = dev_ptr<const uint32_t>(h, A->p_row);
    M.p_col = dev_ptr<const uint32_t>(h, A->p_col);
    M.cscale = dev_ptr<const float>(h, A->col_scale);
    M.rec = static_cast<const uint32_t *>(h->dside);
    M.planes = static_cast<const uint8_t *>(h->dside) + nrec * 4;
    M.sp_row_ptr = dev_ptr<const uint32_t>(h, A->sp_row_ptr);
    M.sp_col16 = dev_ptr<const uint16_t>(h, A->sp_col16);
    M.sp_col32 = dev_ptr<const uint32_t>(h, A->sp_col32);
    M.sp_val = dev_ptr<const uint16_t>(h, A->sp_val);
    M.uniform = A->block_rows % kTile == 0;
    h->fast = A->group % 32 == 0;
    *handle = h;
    return MPQ_OK;
}

void release(void *ctx, void *handle)
{
    (void)ctx;
    cuda_handle *h = static_cast<cuda_handle *>(handle);
    if (!h) return;
    cudaFree(h->dbuf);
    cudaFree(h->dside);
    free(h);
}

mpq_status grow(cuda_ctx *c, size_t scratch, size_t counters)
{
    if (scratch > c->scratch_bytes) {
        cudaFree(c->scratch);
        c->scratch = nullptr;
        c->scratch_bytes = 0;
        cudaError_t e = cudaMalloc(&c->scratch, scratch);
        if (e != cudaSuccess) return map_error(e);
        c->scratch_bytes = scratch;
    }
    if (counters > c->ncounters) {
        cudaFree(c->counters);
        c->counters = nullptr;
        c->ncounters = 0;
        cudaError_t e = cudaMalloc(&c->counters, counters * sizeof(unsigned));
        if (e == cudaSuccess) e = cudaMemsetAsync(c->counters, 0, counters * sizeof(unsigned), c->stream);
        if (e != cudaSuccess) return map_error(e);
        c->ncounters = counters;
    }
    return MPQ_OK;
}

template <int B>
mpq_status launch_quads(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    const dmat &M = h->m;
    // columns in whole quads: all but the tail chunks of a partial last group
    const int glast = M.ngroups - 1, gw = M.cols - glast * M.group;
    const int quad_cols = glast * M.group + (gw / 32) * 32;
    if (quad_cols != M.cols) return MPQ_ERR_UNSUPPORTED; // tails: the plain kernel
    constexpr int scols = (kWords / B) * 8;
    const int nslices = (quad_cols + scols - 1) / scols;
    // row blocks of one tile per warp; column parts of whole slices: enough
    // blocks for two per multiprocessor, as few parts as that allows
    const int nrb = (M.ntiles + kTilesPerBlock - 1) / kTilesPerBlock;
    int nparts = (2 * c->sms + nrb - 1) / nrb;
    nparts = nparts < 1 ? 1 : (nparts > nslices ? nslices : nparts);
    const int spp = (nslices + nparts - 1) / nparts;
    nparts = (nslices + spp - 1) / spp;
    mpq_status st = grow(c, sizeof(float) * (size_t)nparts * batch * M.rows, (size_t)nrb);
    if (st != MPQ_OK) return st;
    gemv_quads<B><<<dim3(nparts, nrb), kThreads, kTableBytes, c->stream>>>(
        M, x, batch, skip, quad_cols, spp, static_cast<float *>(c->scratch), c->counters, y);
    return map_error(cudaGetLastError());
}

mpq_status gemv_batched(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    const dmat &M = h->m;
    const size_t wn = (size_t)M.rows * M.cols, xn = (size_t)batch * M.cols;
    mpq_status st = grow(c, sizeof(__half) * (wn + xn), 1);
    if (st != MPQ_OK) return st;
    __half *W16 = static_cast<__half *>(c->scratch), *X16 = W16 + wn;
    dequant_f16<<<(unsigned)((wn + 255) / 256), 256, 0, c->stream>>>(M, skip, W16);
    to_f16<<<(unsigned)((xn + 255) / 256), 256, 0, c->stream>>>(x, xn, X16);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return map_error(e);
    const float one = 1.0f, zero = 0.0f;
    // column-major view: Y^T (rows x batch) = W (rows x cols) X^T (cols x batch)
    return map_blas(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, M.rows, batch, M.cols, &one, W16, CUDA_R_16F, M.cols,
                                 X16, CUDA_R_16F, M.cols, &zero, y, CUDA_R_32F, M.rows, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

mpq_status gemv_device(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip);

bool on_device(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// x and y may live on the host: then they are staged through device buffers
// and the call returns when y is back (device pointers: asynchronous).
mpq_status gemv(void *ctx, void *handle, const float *x, float *y, int batch, const mpq_gemv_opts *opts)
{
    cuda_ctx *c = static_cast<cuda_ctx *>(ctx);
    const cuda_handle *h = static_cast<const cuda_handle *>(handle);
    if (!c || !h || !x || !y) return MPQ_ERR_ARG;
    if (batch < 1) return MPQ_ERR_SIZE;
    const int skip = opts ? opts->skip_planes : 0;
    if (skip < 0) return MPQ_ERR_ARG;
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur != c->device) e = cudaSetDevice(c->device);
    if (e != cudaSuccess) return map_error(e);
    if (on_device(x) && on_device(y)) return gemv_device(c, h, x, y, batch, skip);
    const size_t xn = (size_t)batch * h->m.cols, yn = (size_t)batch * h->m.rows;
    if ((xn + yn) * sizeof(float) > c->stage_bytes) {
        cudaFree(c->stage);
        c->stage = nullptr;
        c->stage_bytes = 0;
        if ((e = cudaMalloc(&c->stage, (xn + yn) * sizeof(float))) != cudaSuccess) return map_error(e);
        c->stage_bytes = (xn + yn) * sizeof(float);
    }
    float *dx = c->stage, *dy = c->stage + xn;
    e = cudaMemcpyAsync(dx, x, xn * sizeof(float), cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) return map_error(e);
    mpq_status st = gemv_device(c, h, dx, dy, batch, skip);
    if (st != MPQ_OK) return st;
    e = cudaMemcpyAsync(y, dy, yn * sizeof(float), cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    return map_error(e);
}

mpq_status gemv_device(cuda_ctx *c, const cuda_handle *h, const float *x, float *y, int batch, int skip)
{
    if (batch > 8) return gemv_batched(c, h, x, y, batch, skip);
    mpq_status st = MPQ_ERR_UNSUPPORTED;
    if (h->fast) {
        if (batch == 1) st = launch_quads<1>(c, h, x, y, batch, skip);
        else if (batch == 2) st = launch_quads<2>(c, h, x, y, batch, skip);
        else if (batch <= 4) st = launch_quads<4>(c, h, x, y, batch, skip);
        else st = launch_quads<8>(c, h, x, y, batch, skip);
    }
    if (st != MPQ_ERR_UNSUPPORTED) return st;
    const int n = h->m.rows * batch;
    gemv_plain<<<(n + 127) / 128, 128, 0, c->stream>>>(h->m, x, batch, skip, y);
    return map_error(cudaGetLastError());
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
    e = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c);
        return map_error(e);
    }
    // the kernels' table space (64 KB) is past the default 48 KB: raise it once
    if (e == cudaSuccess) e = cudaFuncSetAttribute(gemv_quads<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kTableBytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(gemv_quads<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kTableBytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(gemv_quads<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, kTableBytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(gemv_quads<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, kTableBytes);
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
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    free(c);
    memset(b, 0, sizeof *b);
}

extern "C" void *mpq_cuda_stream(const mpq_backend *b)
{
    if (!b || !b->ctx || !b->name || strcmp(b->name, "cuda")) return nullptr;
    return static_cast<void *>(static_cast<const cuda_ctx *>(b->ctx)->stream);
}
