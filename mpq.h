/* mpq.h - mixed-precision quantization of LLM weights, in one header.     v0.1.0

   mpq turns float weight matrices into compact packed matrices at any average
   bit width (1..8 bits per weight, mixed per block) and multiplies activations
   by them with a lookup-table GEMV that never dequantizes.

   QUICK START

     In exactly one C or C++ file:

       #define MPQ_IMPLEMENTATION
       #include "mpq.h"

     Everywhere else just #include "mpq.h".

       mpq_bitplane_desc d = {0};          // zero means "default" for every field
       d.rows = m; d.cols = n;             // W is m x n, row-major float32, y = W x
       d.uniform_bits = 3;                 // or d.bits = per-block widths map
       mpq_packed A;
       mpq_status st = mpq_pack_alloc(&d, W, &A);   // quantize + pack (allocates)
       if (st != MPQ_OK) fprintf(stderr, "%s\n", mpq_status_str(st));

       size_t wb = mpq_gemv_work_bytes(&A, 1);      // tables for one vector
       void *work = mpq_aligned_alloc(wb);
       mpq_gemv_opts o = {0};                       // o.skip_planes = 1: one bit less
       st = mpq_gemv(&A, x, y, 1, &o, work, wb);    // y (m) = W x (n)
       mpq_aligned_free(work);
       mpq_packed_free(&A);

     A packed matrix is one self-describing byte buffer (A.buf, A.bytes) that
     can be written to a file as it is; mpq_packed_open() validates such a
     buffer before anything reads it.

   CONFIGURATION MACROS (define before including)

     MPQ_IMPLEMENTATION   emit the implementation in this translation unit
     MPQ_STATIC           make every function static to this translation unit
     MPQ_MALLOC(sz)       allocator (default malloc)      \ both or neither; the
     MPQ_FREE(p)          deallocator (default free)      / header's code calls
                          no other allocator (it never reallocates). They
                          govern this header only: mpq_io.c, mpq_model.c, the
                          tools and the CUDA host code use malloc and free
     MPQ_ASSERT(x)        internal invariants only, never user input
                          (default assert)
     MPQ_NO_SIMD          compile only the portable scalar code
     MPQ_NO_F16C          convert halves in software even where F16C exists
     MPQ_NO_LOAD          always use the threads asked for (no reading of
                          /proc/stat; see "THREADS ON A SHARED MACHINE")
     MPQ_GPTQ_F32_TOL     GPTQ keeps a float32 factorisation when its backward
                          error is at most this times the dampening
                          (default 0.01; 0: always float64; section 8)

     SIMD paths. With GCC or Clang on x86 every path is compiled whatever the
     flags (each kernel carries its own target attribute) and MPQ_PATH_AUTO
     picks, at run time, the best one the CPU running the code supports:
     AVX-512 VBMI + VNNI (int16 tables; Ice Lake, Zen 4 and later), then
     AVX2 + FMA + F16C (int16 tables), else scalar. The CPU is probed once (cpuid,
     and the OS's saved register state). `cc -O2` is enough; -march=native
     only lets the compiler vectorise the rest of the code for the build
     machine (and a binary built so runs only on CPUs like it). Other
     compilers (MSVC) compile a path when they target it (/arch:AVX2,
     /arch:AVX512). On AArch64 (GCC, Clang) the NEON path is compiled and
     is AUTO's choice. The scalar path is always compiled and is what the tests
     compare every other path against. F16C conversions are used when the
     compiler targets F16C (-mf16c); otherwise halves are converted in
     software, with the same results. OpenMP (-fopenmp)
     parallelises the products and the packers over row tiles; without it
     mpq is single-threaded and still correct. On Linux a product uses
     fewer threads than the cores that other processes keep busy.

   CONTENTS (declarations, then implementation, in this order)

     1. Basics ............ version, linkage, mpq_status, aligned memory, threads
     2. Half precision .... float <-> fp16, round-to-nearest-even
     3. Group quantization  uniform asymmetric / symmetric, 1..8 bits; 8-bit
                            activations (MixLLM); MXINT blocks
     4. Bit-plane matrices  mpq_bitplane_desc, byte layout, MXINT, pack, open;
                            implementation: 4.1 header and layout, 4.2 checks
                            and the sparse part, 4.3 packing, 4.4 opening,
                            4.5 dequantization
     5. Products .......... lookup tables, GEMV / small GEMM, the path a product
                            takes (mpq_gemv_path), products in phases for
                            callers with their own threads (mpq_gemv_job),
                            float64 reference; implementation: 5.1 tables and
                            the CPU probe, 5.2 workspace, 5.3 records, 5.4
                            kernels per path, 5.5 the table of paths (one row
                            per path: feature, tables, tiles per task, kernel),
                            the phases and the product, 5.6 the reference
     6. Formats, backends . format traits table, backend dispatch table; the
                            entry points of 4 and 5 that go through the format
                            table (mpq_packed_open, mpq_packed_dequantize[_row],
                            mpq_gemv_work_bytes, mpq_gemv) are defined here
     7. AWQ ............... activation-aware column scales and clip search
     8. GPTQ .............. column-by-column quantization with error feedback
                            through the Cholesky factor of the Hessian
     9. Selection, perms .. quantile, top-k (also across layers), stable
                            argsort, permutations from salience
    10. Statistics ........ streaming Fisher, diag(X^T X), mean |x|, MixLLM
                            salience, PQI, MXSens layer sensitivity
    11. Plans ............. mpq_plan (data), the SFMP, MixLLM and MXSens
                            planners, ReQuant's dense-and-sparse split (by a
                            model's loss, or from statistics alone), the
                            allocation from measured losses (for a size or
                            for a loss) and its plan
    12. Schedules ......... PMPD: precision over the tokens of a generation
                            (skip_planes), static and phase-aware search,
                            the learned scheduler (attention over a
                            prompt's KV cache, an MLP; training)
    13. Recipes ........... how the linear maps of a model are quantized
                            (widths uniform, given or planned; act-order,
                            AWQ, GPTQ or rounding; ReQuant's sparse part),
                            and one call over a list of maps, streamed
    14. Rotations ......... incoherence processing: a seeded orthogonal
                            transform (random signs, Walsh-Hadamard times a
                            small random orthogonal factor) for any size,
                            applied in float and float64, a stored one
                            checked, X^T X conjugated

   NOTATION (see docs/DESIGN.md, the design notes, for the math)

     W is rows x cols (m x n), y = W x, batched Y = X W^T with X batch x n.
     Permutations: the packed matrix holds W~[i][j] = W[p_row[i]][p_col[j]];
     at run time x~[j] = x[p_col[j]] * col_scale[j] and y[p_row[i]] = y~[i].
     A group is `group` consecutive columns of one row with its own scale and
     zero; a block is block_rows x group weights sharing one bit width.

   FORMATS (one row each in the format traits table, section 6)
     Bit-plane ("mirror", +-1) format: section 4, "BYTE LAYOUT".
     MXINT with 2..8-bit mantissas, stored in the same bit planes: section 4,
     "MXINT" (set mpq_bitplane_desc.format = MPQ_FORMAT_MXINT).
     Either may carry a sparse part (CSR, fp16 values) that every product
     adds: section 4, "SPARSE PART"; and an incoherence rotation V that
     every product applies to its input (format version 2): section 4,
     "AN INCOHERENCE ROTATION".

   LICENSE: MIT (end of file).
*/
#ifndef MPQ_H_INCLUDED
#define MPQ_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

/* ========================================================================== */
/* 1. Basics                                                                  */
/* ========================================================================== */

#define MPQ_VERSION_MAJOR 0
#define MPQ_VERSION_MINOR 1
#define MPQ_VERSION_PATCH 0
#define MPQ_VERSION       ((MPQ_VERSION_MAJOR * 10000) + (MPQ_VERSION_MINOR * 100) + MPQ_VERSION_PATCH)

#if defined(__GNUC__) || defined(__clang__)
#define MPQ__UNUSED __attribute__((unused))
#else
#define MPQ__UNUSED
#endif

#ifdef MPQ_STATIC
#define MPQ_DEF static MPQ__UNUSED
#else
#define MPQ_DEF extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Every fallible function returns one of these. MPQ_OK is zero, errors are
   negative. On error, no output has been written. */
typedef enum mpq_status {
    MPQ_OK = 0,
    MPQ_ERR_ARG = -1,          /* a NULL pointer or an option out of range */
    MPQ_ERR_SIZE = -2,         /* rows, cols, group, batch or a buffer size is wrong */
    MPQ_ERR_NONFINITE = -3,    /* NaN or Inf in an input that must be finite */
    MPQ_ERR_BITS = -4,         /* a bit width outside 1..8 */
    MPQ_ERR_PERM = -5,         /* not a permutation (index out of range or repeated) */
    MPQ_ERR_RANGE = -6,        /* a value outside what can be stored or met: an fp16 overflow,
                                  a budget no plan can meet, a parameter out of its range */
    MPQ_ERR_FORMAT = -7,       /* a packed buffer is malformed or corrupted */
    MPQ_ERR_ALIGN = -8,        /* a buffer is not aligned as required */
    MPQ_ERR_NOMEM = -9,        /* an allocation failed */
    MPQ_ERR_UNSUPPORTED = -10, /* the operation or code path is not available in this build */
    MPQ_ERR_NODEVICE = -11,    /* no usable accelerator */
    MPQ_ERR_DEVICE = -12,      /* the accelerator runtime reported an error */
    MPQ_ERR_IO = -13,          /* a file could not be opened, read or written (file
                                  I/O lives beside the header, in mpq_io.h) */
    MPQ_ERR_NOTPD = -14,       /* a matrix that must be positive definite is not (GPTQ's
                                  Hessian after dampening) */
    MPQ_ERR_CANCELLED = -15    /* the caller asked a long run to stop (it can be resumed
                                  where it says so) */
} mpq_status;

/* A short English description of a status code; never NULL. */
MPQ_DEF const char *mpq_status_str(mpq_status st);

/* 64-byte aligned allocation through MPQ_MALLOC; NULL on failure or size 0.
   Free with mpq_aligned_free (NULL is accepted). */
MPQ_DEF void *mpq_aligned_alloc(size_t bytes);
MPQ_DEF void mpq_aligned_free(void *p);

/* Runs fn(ctx, task) for task = 0 .. ntasks-1 on up to `threads` threads
   (0: the OpenMP default), the caller's included; every task has run when
   it returns. The products use it; it is public so that the code around
   them (an engine's attention, say) gets the same defence against a busy
   machine: on Linux, fewer threads than the cores other processes keep
   busy (see "THREADS ON A SHARED MACHINE" in the implementation). Tasks
   must be independent and may run on any thread, in any order. Without
   OpenMP they run in order on the caller. MPQ_ERR_ARG for a NULL fn or a
   negative count. */
typedef void (*mpq_task_fn)(void *ctx, int task);
MPQ_DEF mpq_status mpq_parallel(int ntasks, int threads, mpq_task_fn fn, void *ctx);
/* The threads mpq_parallel would run on now for `threads` (0: the OpenMP
   default), for a caller that opens its own parallel region (1 without
   OpenMP). */
MPQ_DEF int mpq_threads(int threads);

/* ========================================================================== */
/* 2. Half precision                                                          */
/* ========================================================================== */

/* IEEE 754 binary16 <-> binary32. float -> half rounds to nearest, ties to
   even; overflow gives +-Inf; subnormal halves are produced and read; NaN
   keeps its sign and the top 9 payload bits and is made quiet (as F16C does).
   half -> float is exact; a signalling NaN half comes back quiet. The scalar
   code and the F16C instructions agree bit for bit; the array versions use
   F16C where the compiler targets it. */
MPQ_DEF uint16_t mpq_f32_to_f16(float f);
MPQ_DEF float mpq_f16_to_f32(uint16_t h);
MPQ_DEF void mpq_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
MPQ_DEF void mpq_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
/* The portable versions, always compiled (the tests compare both). */
MPQ_DEF uint16_t mpq_f32_to_f16_soft(float f);
MPQ_DEF float mpq_f16_to_f32_soft(uint16_t h);

/* ========================================================================== */
/* 3. Group quantization                                                      */
/* ========================================================================== */

/* Uniform group quantization in the AWQ convention (design notes), stored in
   the +-1 "mirror" form the kernels use. For a group v of width b:

     asymmetric:  s = (max - min) / (2^b - 1),  z = clamp(round(-min / s), 0, 2^b - 1)
     symmetric:   s = 2 max|v| / (2^b - 1),     z = 2^(b-1)

   and the stored pair is  s^ = fp16(s / 2),  z^ = fp16(s ((2^b - 1)/2 - z))
   (symmetric: z^ = -s^ exactly). The code of each element is then chosen
   against the *stored* pair, q = clamp(round((v - z^) / (2 s^) + (2^b - 1)/2)),
   so that the dequantized value

     w^ = s^ (2 q - (2^b - 1)) + z^

   is within s^ (half a step) of v for every value the grid covers. Rounding is
   to nearest, ties to even, independent of the FPU rounding mode. A constant
   group (max == min), symmetric or not, has s^ = 0 and z^ = fp16(v): it
   reconstructs exactly when v is representable in fp16. So does a group
   whose step is below fp16 resolution (z^ = fp16 of its midrange). NaN or Inf anywhere is MPQ_ERR_NONFINITE; a
   value above 65504 in magnitude is MPQ_ERR_RANGE (s^, z^ are fp16). */
MPQ_DEF mpq_status mpq_quantize_group(const float *v, int len, int bits, int symmetric, uint8_t *q, uint16_t *s_hat,
                                      uint16_t *z_hat);

/* w^ for one code (the formula above), and with the lowest `skip` planes
   dropped: s^ sum_{i>=skip} 2^i sigma_i + z^, the midpoint of the coarser
   (bits - skip)-bit bucket (design notes, "nested precision"). */
MPQ_DEF float mpq_dequant_value(uint8_t q, int bits, int skip, float s_hat, float z_hat);

/* The rule of skip_planes, for every product on every device: a code of
   `bits` planes keeps planes mpq_first_plane(bits, skip) .. bits - 1, the
   lowest ones dropped and at least one kept (skip <= 0: all). */
#if defined(__CUDACC__)
#define MPQ__HOST_DEVICE __host__ __device__
#else
#define MPQ__HOST_DEVICE
#endif
static inline MPQ__HOST_DEVICE int mpq_first_plane(int bits, int skip)
{
    return skip <= 0 ? 0 : skip < bits ? skip : bits - 1;
}

/* Whole-matrix quantization under a per-block bits map: see mpq_bitplane_desc
   (section 4) for the shape fields and the format; permutations, col_scale
   and the rotation are ignored here (codes are in the coordinates of W). Outputs:
   codes (rows*cols bytes), s_hat and z_hat (rows * ceil(cols/group) each,
   row-major by group): each group's stored metadata, the fp16 bits of s^
   and z^ (MXINT: the E8M0 byte in s_hat, 0 in z_hat; section 6, the format
   traits). */
struct mpq_bitplane_desc;
MPQ_DEF mpq_status mpq_quantize(const struct mpq_bitplane_desc *d, const float *W, uint8_t *codes, uint16_t *s_hat,
                                uint16_t *z_hat);
/* Inverse of mpq_quantize: W (rows*cols floats) from codes and metadata. */
MPQ_DEF mpq_status mpq_dequantize(const struct mpq_bitplane_desc *d, const uint8_t *codes, const uint16_t *s_hat,
                                  const uint16_t *z_hat, float *W);

/* 8-bit activations (MixLLM, its sections 3.1 and 4): x (n values) in
   groups of `group` consecutive values (the last may be shorter), each
   symmetric int8 with one fp16 scale (scale has ceil(n / group) entries):
     s^ = fp16(amax / 127),  q = clamp(rne(x / s^), -127, 127),  x ~ q s^,
   so |x - q s^| <= s^ / 2 except where fp16 rounded s^ down (then the
   largest |x| is clamped, off by less than 127 s^ 2^-11). A group whose
   amax / 127 rounds to zero in fp16 gets s^ = 0 and q = 0. NaN or Inf is
   MPQ_ERR_NONFINITE, amax / 127 beyond fp16 MPQ_ERR_RANGE; nothing is
   written then. MixLLM's configuration is group = 128, the reduction
   dimension's groups. */
MPQ_DEF mpq_status mpq_quantize_act8(const float *x, int n, int group, int8_t *q, uint16_t *scale);
/* x[k] = q[k] s^ of its group. Scales must be finite. */
MPQ_DEF mpq_status mpq_dequantize_act8(const int8_t *q, const uint16_t *scale, int n, int group, float *x);

/* One MXINT block (the rules: section 4, "MXINT"): mant[k] = P, *e8m0 = X +
   127. */
MPQ_DEF mpq_status mpq_mxint_quantize_block(const float *v, int len, int bits, int8_t *mant, uint8_t *e8m0);
/* The value of one MXINT element: P * 2^(X - (k - 2)). */
MPQ_DEF double mpq_mxint_value(int mant, int bits, uint8_t e8m0);

/* ========================================================================== */
/* 4. Bit-plane matrices                                                      */
/* ========================================================================== */

#define MPQ_TILE_ROWS 16 /* rows interleaved in one record (one SIMD register) */
#define MPQ_MX_BLOCK  32 /* elements sharing one E8M0 exponent (MXINT) */
#define MPQ_MAX_BITS  8

/* AN INCOHERENCE ROTATION (QuIP#, QuaRot): an orthogonal V of size n from a
   seed, fast to apply, that spreads each weight row's and each activation's
   outliers over all its coordinates before quantization; W x = (W V^T)(V x)
   for any W. Here

     V = (H_p / sqrt(p)  (x)  R_m) diag(s),   n = p m,  p = 2^k,  m odd,

   s random signs, H_p the Sylvester Walsh-Hadamard matrix (H_p[i][j] =
   (-1)^popcount(i & j)), R_m a random orthogonal m x m matrix (the Q of a
   Gaussian matrix's Householder QR in float64, column signs fixed so that R
   is Haar-distributed; R_1 = +-1), and (x) the Kronecker product over the
   index j = i m + l (i < p, l < m). The sizes of the Llama, Mistral, Qwen2
   and SmolLM families have small odd parts (576 = 64 x 9, 4864 = 256 x 19,
   14336 = 2048 x 7, 11008 = 256 x 43); a Hadamard matrix of order 4m would
   also do, but the usual constructions do not give one for every m, while
   R_m exists for every m (docs/DESIGN.md, "Rotations"). Applying V costs
   n (log2 p + m) multiply-adds. The seed fixes s, and R_m up to the
   rounding of its float64 QR (the same on every machine that does not
   contract multiply-adds); a packed matrix stores both, so its products
   never depend on it. */
typedef struct mpq_rotation {
    int n, p, m; /* n = p m, p a power of two, m odd (at most MPQ_ROTATION_MAX_ODD); n 0: none */
    uint64_t seed;
    const uint8_t *sign; /* ceil(n / 8) bytes: bit j % 8 of byte j / 8 set -> s_j = -1, else +1 */
    const float *R;      /* m x m, row-major, orthogonal to float rounding */
    void *mem;           /* what mpq_rotation_init allocated; NULL in a packed matrix's view */
} mpq_rotation;

#define MPQ_ROTATION_MAX_ODD 1023 /* the largest odd factor m (R_m: 4 MB) */

/* Describes a bit-plane matrix to pack. Zero-initialise, then set fields;
   every zero field means the default written next to it. */
typedef struct mpq_bitplane_desc {
    int rows;                        /* m, output features (required, >= 1) */
    int cols;                        /* n, input features (required, >= 1) */
    int group;                       /* columns per group, a multiple of 8; 0 -> 128 */
    int block_rows;                  /* rows per bit-width block; 0 -> 16 */
    const uint8_t *bits;             /* ceil(rows/block_rows) x ceil(cols/group) widths in
                                        1..8, in packed (permuted) coordinates; NULL ->
                                        every block has uniform_bits */
    int uniform_bits;                /* used when bits == NULL; 0 -> 4 */
    unsigned symmetric;              /* bit b set: b-bit blocks are quantized symmetrically
                                        (MixLLM: 1u << 8); 0 -> all asymmetric */
    const uint32_t *p_row;           /* optional row permutation (length rows): packed row i
                                        holds W row p_row[i] */
    const uint32_t *p_col;           /* optional column permutation (length cols) */
    const float *col_scale;          /* optional per packed column activation scale c[j]
                                        (finite, non-zero): x~[j] = x[p_col[j]] * c[j], and
                                        the packer quantizes W~[i][j] / c[j] so that the
                                        product still approximates W x (AWQ fills it) */
    int format;                      /* 0 or MPQ_FORMAT_BITPLANE: groups with fp16 pairs;
                                        MPQ_FORMAT_MXINT: group is 32 (0 -> 32), widths
                                        2..8 are mantissa bits, symmetric is ignored;
                                        see "MXINT" below */
    const float *clip;               /* optional, rows x ceil(cols/group) in packed
                                        coordinates: before quantization the values
                                        W~[i][j] / c[j] of that group are clamped to
                                        [-clip, +clip]; 0 means no clipping (AWQ's clip
                                        search fills it; it is not stored) */
    const struct mpq_sparse *sparse; /* optional sparse part (ReQuant), stored
                               beside the dense part and added by every
                               product; see "SPARSE PART" */
    const mpq_rotation *rotation;    /* optional input-side rotation V (n = cols), stored
                                        with the matrix: every product computes W~ (V x),
                                        so everything above that names columns (p_col,
                                        col_scale, clip, bits, the sparse part) is in the
                                        coordinates of V x, and mpq_pack quantizes the
                                        rows of W V^T (W still in original coordinates) */
} mpq_bitplane_desc;

/* SPARSE PART (dense-and-sparse decomposition, PQI/ReQuant eq. 8). A matrix
   S in compressed sparse row form, in ORIGINAL coordinates (no permutation,
   no column scale; with a rotation, the coordinates of V x): every product
   computes y = W^ x + S x (W^ V x + S V x) and the dequantized matrix is
   W^ + S ((W^ + S) V), where W^ is the dense quantized part. mpq
   stores the values as fp16, so they must be finite with |v| <= 65504; the
   column indices as uint16 when cols <= 65536, else uint32. Stored bytes:
   4 (rows + 1) + (2 + 2 or 4) nnz. */
typedef struct mpq_sparse {
    int rows, cols;    /* the matrix's shape */
    size_t nnz;        /* entries, at most 2^32 - 1 */
    uint32_t *row_ptr; /* rows + 1: row i holds entries row_ptr[i] .. row_ptr[i+1]-1;
                          row_ptr[0] = 0, non-decreasing, row_ptr[rows] = nnz */
    uint32_t *col;     /* nnz column indices, strictly increasing inside a row */
    float *val;        /* nnz values */
} mpq_sparse;

/* Release the arrays of a sparse part made by mpq_sparse_from_mask. */
MPQ_DEF void mpq_sparse_free(mpq_sparse *S);
/* The sparse part that makes dense + sparse reproduce W at the marked
   positions: S[i][j] = W[i][j] - D[i][j] where mask[i*cols + j] != 0, with D
   the dense reconstruction (mpq_packed_dequantize of the dense part). W, D
   and mask are rows x cols, original coordinates. Allocates (free with
   mpq_sparse_free); values beyond the fp16 range are MPQ_ERR_RANGE. */
MPQ_DEF mpq_status mpq_sparse_from_mask(const float *W, const float *D, const uint8_t *mask, int rows, int cols,
                                        mpq_sparse *out);

/* BYTE LAYOUT of a packed bit-plane matrix (format versions 1 and 2).
   Little-endian. One buffer, every section starting at a multiple of 64
   bytes:

     header      128 bytes, see mpq__bp_header in the implementation: magic
                 "MPQBITP\0", version, format, rows, cols, group, block_rows,
                 band_rows, flags (1 p_row, 2 p_col, 4 col_scale, 8 sparse
                 part, 16 rotation), the rotation's m (else 0), the offset
                 of every section and the total size
     bits        ceil(rows/block_rows) * ceil(cols/group) bytes, row-major
     p_row       rows  x uint32   (if flag 1)
     p_col       cols  x uint32   (if flag 2)
     col_scale   cols  x float32  (if flag 4)
     rotation    (if flag 16) 64 bytes: uint32 kind (1, the only one: V of
                 "AN INCOHERENCE ROTATION"), n, p, m, uint64 seed, 40 zero
                 bytes; then R_m, m x m float32 row-major; then the n sign
                 bits (bit j % 8 of byte j / 8 set: s_j = -1). The stored s
                 and R are what every product uses; the seed records where
                 they came from
     band index  (nbands + 1) x uint64: byte offset of each band in `data`,
                 the last entry is the size of `data`
     data        the records, band after band
     sparse      (if flag 8, "SPARSE PART") row_ptr (rows + 1) x uint32,
                 col nnz x uint16 (cols <= 65536) or uint32, val nnz x fp16;
                 the header's off_sparse and sparse_nnz locate it

   Version 2 is version 1 plus the rotation: a buffer has version 2 exactly
   when flag 16 is set, so a matrix without a rotation is written byte for
   byte as mpq 0.1.0 wrote it, and its files still open everywhere. The
   rotation's section sits where the header's offsets leave room for it
   (after col_scale, before the band index); readers compute its place.

   Rows are cut into tiles of 16 (the last one padded with rows that are all
   zero). A band is block_rows rows when block_rows is a multiple of 16 (then a
   block's records are adjacent), otherwise one tile. Inside a band, for each
   group g, for each tile of the band, one RECORD:

     s^[16]  fp16, one per row of the tile (padding rows 0)         32 bytes
     z^[16]  fp16                                                   32 bytes
     plane 0, plane 1, ..., plane B-1      each nch * 16 bytes

   where nch = ceil(width of group g / 8) and B = the largest width of the
   tile's rows in group g. A row whose own width b < B stores zero bytes in
   planes b..B-1 (only tiles that straddle blocks of different widths, which
   happens only when block_rows is not a multiple of 16, have such rows).

   A PLANE of a record holds bit i of the code of every weight of the tile's
   16 rows x group columns: "chunk" c is columns 8c..8c+7 of the group, one
   byte per row, bit k = column 8c+k. Chunks are laid out in three kinds of
   segment so that the same columns of all 16 rows sit in one SIMD register:

     quads      chunks 4u..4u+3 for u < nch/4: 64 bytes each, row r at bytes
                4r..4r+3 (a 16 x uint32 vector: lane r = 32 columns of row r)
     pair       if nch & 2: the next 2 chunks, 32 bytes, row r at bytes 2r, 2r+1
     single     if nch & 1: the last chunk, 16 bytes, row r at byte r

   Every record and segment is a multiple of 16 bytes, so 16-byte loads are
   always aligned when the buffer is. Padding columns (past `cols`) have bit 0;
   the kernels give them zero activations, so they never change a result. */

/* MXINT (format MPQ_FORMAT_MXINT). The element rules of the OCP Microscaling
   Formats (MX) v1.0 specification for MXINT8, extended to k = 2..8 bits:

     block      32 consecutive elements of a packed row (the last block of a
                row may be shorter), one shared scale 2^X stored as E8M0: the
                byte X + 127; X ranges over -127..127 (byte 0xFF, NaN, is
                rejected as a malformed buffer)
     element    a k-bit two's-complement integer P in [-2^(k-1), 2^(k-1) - 1]
                with an implicit binary point after the sign and one integer
                bit: value P * 2^-(k-2), so every k has the range [-2, 2) and
                the largest power of two of the element format is 2^0
     scale      X = floor(log2(max |v|)) - 0, clamped to -127..127 (so values
                below 2^-127 keep what precision the elements give them)
     elements   P = clamp(round(v / 2^X * 2^(k-2)), -2^(k-1), 2^(k-1) - 1),
                rounding to nearest, ties to even; values that round past the
                largest element saturate (v = 1.999 * 2^X -> 127/64 at k = 8)
     zero       an all-zero block has X = -127 (byte 0) and all P = 0
     NaN, Inf   the specification gives the block a NaN scale; mpq rejects
                them (MPQ_ERR_NONFINITE), as everywhere

   The value P * 2^(X-k+2) is stored as the unsigned k-bit code q = P + 2^(k-1)
   in k bit planes, exactly the symmetric group form with s^ = 2^(X-k+1) and
   z^ = -s^: an MXINT matrix is a bit-plane matrix with group 32 whose records
   hold 16 E8M0 bytes (one per row) instead of the 64 bytes of fp16 pairs.
   Storage is k + 8/32 bits per weight. Everything else (tiles, planes,
   permutations, column scales, validation, every GEMV path, skip_planes) is
   shared; header magic "MPQMXIN\0", format 2. mpq_mxint_quantize_block and
   mpq_mxint_value (section 3) quantize one block and evaluate one element by
   these rules. */

/* A packed matrix: a validated view into one buffer. `buf` is owned by
   whoever allocated it (mpq_pack_alloc: free with mpq_packed_free). */
typedef struct mpq_packed {
    int format; /* MPQ_FORMAT_BITPLANE or MPQ_FORMAT_MXINT */
    int rows, cols, group, block_rows, band_rows;
    int ngroups, nbands;
    const uint8_t *bits;
    const uint32_t *p_row, *p_col; /* NULL when absent */
    const float *col_scale;        /* NULL when absent */
    size_t sp_nnz;                 /* sparse part: entries (0 when absent) */
    const uint32_t *sp_row_ptr;    /* rows + 1, NULL when there is no sparse part */
    const uint16_t *sp_col16;      /* column indices when cols <= 65536 ... */
    const uint32_t *sp_col32;      /* ... else these (the other one is NULL) */
    const uint16_t *sp_val;        /* fp16 values */
    const uint64_t *band_off;
    const uint8_t *data;
    mpq_rotation rot; /* the input-side rotation (rot.n 0: none), a view into buf */
    const void *buf;
    size_t bytes;
    int owned; /* buf allocated by mpq_pack_alloc */
} mpq_packed;

/* Exact size in bytes of the packed buffer for d (validates d's shape, bits
   and option pointers, not the weights). */
MPQ_DEF mpq_status mpq_bitplane_bytes(const mpq_bitplane_desc *d, size_t *bytes);
/* Quantize W (rows x cols, row-major float32, original coordinates) and pack
   it into buf (size from mpq_bitplane_bytes, 64-byte aligned). On success *out
   is a view into buf. Validates everything first: on error buf is untouched. */
MPQ_DEF mpq_status mpq_pack(const mpq_bitplane_desc *d, const float *W, void *buf, size_t bytes, mpq_packed *out);
/* The same, allocating the buffer (mpq_packed_free releases it). */
MPQ_DEF mpq_status mpq_pack_alloc(const mpq_bitplane_desc *d, const float *W, mpq_packed *out);
/* Pack codes and metadata computed elsewhere (mpq_quantize, or another
   quantizer), given in packed coordinates: codes[i*cols + j] is the code of
   W~[i][j], s_hat and z_hat as mpq_quantize writes them. Codes must fit
   their block's width, the metadata must be valid for the format (finite
   halves; an E8M0 byte below 0xFF and z_hat 0). */
MPQ_DEF mpq_status mpq_pack_quantized(const mpq_bitplane_desc *d, const uint8_t *codes, const uint16_t *s_hat,
                                      const uint16_t *z_hat, void *buf, size_t bytes, mpq_packed *out);
/* Validate a buffer (from memory or a file) and make a view of it. Checks
   the header, every size and offset (overflow-safe), the bits map, the
   permutations, col_scale, the band index, that every s^ and z^ is finite
   and that padding rows are zero. Never reads outside [buf, buf + bytes).
   buf must be 16-byte aligned. */
MPQ_DEF mpq_status mpq_packed_open(const void *buf, size_t bytes, mpq_packed *out);
/* Frees the buffer of a matrix made by mpq_pack_alloc; clears *A. */
MPQ_DEF void mpq_packed_free(mpq_packed *A);
/* Width of the block holding packed row i, packed group g. */
MPQ_DEF int mpq_packed_bits_at(const mpq_packed *A, int i, int g);
/* Where the records are (BYTE LAYOUT), for kernels that read them their own
   way (the CUDA backend): for tile t (of ceil(rows / 16)) and group g,
   off[t * ngroups + g] is the byte offset of record (t, g) in A->data and
   planes[t * ngroups + g] its plane count; *meta is the bytes of metadata
   that open every record (64: fp16 pairs; MXINT: 16 E8M0 bytes). Any of
   the three may be NULL. */
MPQ_DEF mpq_status mpq_packed_records(const mpq_packed *A, uint64_t *off, uint8_t *planes, int *meta);
/* Average stored bits per weight. level 0: the weight bits; 1: plus the
   per-group metadata (bit-plane: fp16 scale + zero, 32/group bpw for full
   groups; MXINT: the E8M0 byte, 8/32 bpw), the budget convention of the
   design notes; 2: plus the sparse part's bytes (mpq_packed_sparse_bytes)
   and the rotation's (BYTE LAYOUT). */
MPQ_DEF double mpq_packed_bpw(const mpq_packed *A, int level);
/* Bytes of the sparse part as stored (0 when there is none). */
MPQ_DEF size_t mpq_packed_sparse_bytes(const mpq_packed *A);
/* Dequantize to a rows x cols float matrix in ORIGINAL coordinates (undoing
   the permutations and multiplying by col_scale; with a rotation, each row
   of the rotated matrix W~ times V, i.e. V^T applied to it as a vector by
   mpq_rotation_apply), with the lowest skip_planes planes dropped (at least
   one plane always remains). */
MPQ_DEF mpq_status mpq_packed_dequantize(const mpq_packed *A, int skip_planes, float *W);
/* One row of that matrix: row `row` of W in original coordinates, cols
   floats, bit for bit what mpq_packed_dequantize writes there (an embedding
   lookup from a packed table). With a row permutation the packed row is
   found by a scan of p_row. */
MPQ_DEF mpq_status mpq_packed_dequantize_row(const mpq_packed *A, int skip_planes, int row, float *w);

/* ========================================================================== */
/* 5. Products                                                                */
/* ========================================================================== */

typedef enum mpq_path {
    MPQ_PATH_AUTO = 0,        /* the fastest path this CPU supports */
    MPQ_PATH_SCALAR = 1,      /* portable: 256-entry float tables per 8 activations */
    MPQ_PATH_AVX2 = 2,        /* 16-entry float tables, 8 rows per instruction */
    MPQ_PATH_AVX512 = 3,      /* 16-entry float tables, 16 rows per instruction */
    MPQ_PATH_AVX512_VNNI = 4, /* 16-entry int16 tables (AVX-512 VBMI + VNNI): 64
                                lookups per instruction; see "QUANTIZED TABLES" */
    MPQ_PATH_AVX2_INT = 5,    /* the same int16 tables on AVX2: vpshufb looks up
                                 32 bytes, vpmaddubsw / vpmaddwd sum them; the
                                 same sums as MPQ_PATH_AVX512_VNNI */
    MPQ_PATH_NEON = 6         /* the same int16 tables on AArch64 NEON: vqtbl1q
                                 looks up 16 bytes; the same sums again */
} mpq_path;

/* QUANTIZED TABLES (MPQ_PATH_AVX512_VNNI, MPQ_PATH_AVX2_INT, MPQ_PATH_NEON).
   The 16-entry tables of one group are stored as int16, q = rne(Q / 2^e),
   with one power-of-two scale 2^e per group and input vector: the smallest
   e with max|Q| / 2^e <= 32639 (so that q = 256 hi + lo with signed bytes
   hi and lo), where max|Q| over the group is the largest sum of 4
   activation magnitudes. The three paths compute the same integer sums, so
   their results agree bit for bit on bit-plane matrices. A group's sum is an int32, safe
   up to 1024 columns (256 quads x 255 x 32639 < 2^31): wider groups
   (per-channel quantization, say) use the fastest float path under AUTO,
   and asking for an int16 path with them is MPQ_ERR_UNSUPPORTED. Only that
   rounding differs from the float paths: for row r of group g,

     |y_quantized - y_float| <= |s^_r| * (sum of the plane weights 2^i used)
                                * (quads of 4 columns in the group) * 2^e / 2

   (plus float32 rounding), and the result is exact when every Q is a
   multiple of 2^e (small integer activations, say). That is about 2^-15 of
   the group's largest table entry per lookup, finer than rounding the
   activations to fp16 unless the group holds an activation outlier. AUTO
   takes an int16 path where the CPU has one; the float paths (SCALAR, AVX2,
   AVX512) stay available for exact tables.

   8-BIT ACTIVATIONS (mpq_gemv_opts.a8, MixLLM's W*A8). Each vector's x~ is
   quantized as mpq_quantize_act8 does, in the matrix's groups (MixLLM runs
   group 128 for both), before the tables are built: the dense part
   multiplies x~ = q s^_a (the sparse part still multiplies x). The tables
   of a group are then s^_a times integers of at most 8 x 127 = 1016, so the
   int16 paths take s^_a as the group's table scale instead of 2^e and their
   tables are exact: on every path the result is the product of the
   dequantized weights and the dequantized activations up to float32
   rounding, and the quantized-table bound above does not apply. An x~ whose
   amax / 127 is beyond fp16 saturates (s^_a = 65504, codes clamped). */

typedef struct mpq_gemv_opts {
    int skip_planes; /* drop the lowest planes of every group (nested
                        precision, PMPD); at least one plane always
                        remains; 0 -> full precision */
    int threads;     /* OpenMP threads at most (fewer on Linux while other
                        processes keep cores busy: mpq_parallel); 0 ->
                        the OpenMP default */
    mpq_path path;   /* 0 -> MPQ_PATH_AUTO */
    int a8;          /* 1: activations in int8 per group (see "8-BIT
                        ACTIVATIONS" above); 0 -> float activations */
} mpq_gemv_opts;

/* Is `path` compiled into this build and supported by the CPU running it
   (AUTO and SCALAR always are)? Asking for a path that is not gives
   MPQ_ERR_UNSUPPORTED. */
MPQ_DEF int mpq_path_available(mpq_path path);
MPQ_DEF const char *mpq_path_name(mpq_path path);
/* The path mpq_gemv takes on A with opts (NULL: defaults): AUTO resolved to
   this CPU's choice (the int16 paths give way to the fastest float path on
   groups wider than 1024 columns); MPQ_ERR_UNSUPPORTED where mpq_gemv would
   refuse the path asked for, MPQ_ERR_ARG for a NULL A or path. */
MPQ_DEF mpq_status mpq_gemv_path(const mpq_packed *A, const mpq_gemv_opts *opts, mpq_path *path);

/* Workspace for one call with `batch` vectors on any path: the lookup tables,
   built once per input vector. Thread-safe if every thread has its own. */
MPQ_DEF size_t mpq_gemv_work_bytes(const mpq_packed *A, int batch);

/* y = W x for `batch` vectors: x is batch x cols, y is batch x rows, both
   row-major float32 in original coordinates. A rotation is applied first
   (x <- V x, as mpq_rotation_apply does, into the workspace), the p_col
   gather and col_scale while building the tables, the p_row scatter in the
   epilogue.
   work: mpq_gemv_work_bytes(A, batch) bytes, 64-byte aligned, or NULL (then
   the call allocates and frees it). x must be finite. */
MPQ_DEF mpq_status mpq_gemv(const mpq_packed *A, const float *x, float *y, int batch, const mpq_gemv_opts *opts,
                            void *work, size_t work_bytes);

/* PRODUCTS IN PHASES, for callers that run their own threads. mpq_gemv
   runs each product in a parallel region of its own. A caller that runs
   many small products in a row (a model's decode step: seven per layer) can
   instead run a whole layer or token in one parallel region and split each
   product between its threads. mpq_gemv_job_init checks one product and
   describes it; its work is MPQ_GEMV_PHASES phases of j->tasks[phase]
   independent tasks, each phase reading what the one before wrote:
     0  V x of each vector (a rotated matrix; no tasks otherwise)
     1  x~, the group sums and the tables: one task per vector and group
     2  the rows: one task per block of tiles, their sparse part included
   mpq_gemv_job_run(j, phase, t0, t1) runs tasks t0 .. t1-1 of a phase. Any
   thread may run any task, in any order, provided that every task of a
   phase has finished before a task of the next one starts (a barrier). y
   is then mpq_gemv's result bit for bit, whatever the split. Phases 0 and 1
   check x: a task that meets NaN or Inf returns MPQ_ERR_NONFINITE, and the
   caller must then not run phase 2 (y is untouched until phase 2).
   Products of one input share their tables: a job made with `tables`, the
   job of an earlier product of the same x, batch and options whose matrix
   has the same tables (mpq_gemv_tables_shared), has no tasks in phases 0
   and 1 and reads that job's workspace, which must stay as it is until the
   job's phase 2 has run; its own work may then be NULL. mpq_gemv_job_init
   does not read x and does not allocate; opts->threads is not read (the
   caller's threads run the tasks). Its errors are mpq_gemv's for the same
   arguments, except MPQ_ERR_NONFINITE (see above), plus MPQ_ERR_ARG for
   tables that cannot be shared and for a NULL work without them; on error
   *j has no tasks. */
#define MPQ_GEMV_PHASES 3
typedef struct mpq_gemv_job {
    int tasks[MPQ_GEMV_PHASES]; /* tasks of each phase */
    /* the rest is private to the library */
    const mpq_packed *A;
    const float *x;  /* the vectors as given */
    const float *xs; /* what the tables and the sparse part read: x, or V x in the workspace */
    float *y;
    uint8_t *work; /* the tables: this job's workspace, or the shared job's */
    size_t vstride;
    int batch, skip, a8, path, tiles;
} mpq_gemv_job;

MPQ_DEF mpq_status mpq_gemv_job_init(mpq_gemv_job *j, const mpq_packed *A, const float *x, float *y, int batch,
                                     const mpq_gemv_opts *opts, void *work, size_t work_bytes,
                                     const mpq_gemv_job *tables);
MPQ_DEF mpq_status mpq_gemv_job_run(const mpq_gemv_job *j, int phase, int t0, int t1);
/* Whether A's tables are B's for every x: the same columns, groups, column
   permutation, column scales and rotation (contents compared, so matrices
   packed apart with the same AWQ scales share); 0 for NULL. */
MPQ_DEF int mpq_gemv_tables_shared(const mpq_packed *A, const mpq_packed *B);

/* The reference: the dequantized matrix (mpq_packed_dequantize) times x,
   accumulated in float64, row by row; with a rotation, the rotated matrix
   times V x, both in float64 (mpq_rotation_apply_f64). Slow; allocates;
   for tests. */
MPQ_DEF mpq_status mpq_gemv_ref(const mpq_packed *A, const float *x, double *y, int batch, int skip_planes);

/* The tables themselves, exposed for tests and for other kernels.
   T has 128 entries: T[p] = sum_k (bit k of p ? +1 : -1) * x8[k], p < 128;
   the other half is T[p ^ 0xFF] = -T[p] (the "mirror"). Q16 has 16 entries
   over 4 activations, T[p] = Q16(x8[0..3])[p & 15] + Q16(x8[4..7])[p >> 4]. */
MPQ_DEF void mpq_lut128(const float x8[8], float T[128]);
MPQ_DEF float mpq_lut128_get(const float T[128], uint8_t p);
MPQ_DEF void mpq_lut16(const float x4[4], float Q[16]);

/* ========================================================================== */
/* 6. Formats, backends                                                       */
/* ========================================================================== */

typedef enum mpq_format {
    MPQ_FORMAT_BITPLANE = 1, /* uniform groups, fp16 (s^, z^) per group */
    MPQ_FORMAT_MXINT = 2     /* OCP MXINT blocks of 32 with k-bit mantissas, in bit planes */
} mpq_format;

/* One row per packed format: its facts and rules, and its entry points.
   Generic code reads the row instead of testing which format it has, so
   that a format is added by adding a row. In the rules, a group's stored
   METADATA is the pair (sh, zh) of 16-bit fields: the fp16 bits of s^ and
   z^ (bit-plane), or the E8M0 byte in sh and zh = 0 (MXINT); every code q
   of b bits is worth s^ (2q - (2^b - 1)) + z^. */
typedef struct mpq_format_traits {
    mpq_format format;
    const char *name;
    char magic[8];
    int e8m0;          /* a record's metadata: 1: one E8M0 byte a row; 0: the rows' fp16 s^,
                          then their fp16 z^ */
    int meta_bytes;    /* bytes of metadata that open a record (64; MXINT 16) */
    int meta_bits;     /* stored metadata bits per row and group, counted in bpw (32; MXINT 8) */
    int min_bits;      /* the lowest width (1; MXINT 2: a sign and one bit) */
    int default_group; /* columns per group when a description says 0 (128; MXINT 32) */
    int fixed_group;   /* the only group the format has, or 0: any multiple of 8 (MXINT 32) */
    int symmetric;     /* 1: honours mpq_bitplane_desc.symmetric (MXINT: symmetric by its rules) */
    float max_abs;     /* the largest |weight| it stores (fp16 pairs: 65504; MXINT: any float) */
    /* One group of len values (at most the group) at `bits`: codes q and the metadata. */
    void (*quantize_group)(const float *v, int len, int bits, int symmetric, uint8_t *q, uint16_t *sh, uint16_t *zh);
    /* The value of a code: s^ and z^ of the metadata for `bits`-bit codes. */
    void (*pair)(int bits, uint16_t sh, uint16_t zh, float *s_hat, float *z_hat);
    /* The code the quantizer gives v on a group's grid (GPTQ places values one
       at a time), and its value; s_hat and z_hat: pair() of sh and zh. */
    uint8_t (*code_of)(int bits, uint16_t sh, float s_hat, float z_hat, float v, float *value);
    /* Whether stored metadata is valid (finite halves; an E8M0 byte other than 0xFF). */
    int (*meta_valid)(uint16_t sh, uint16_t zh);
    /* Row r's metadata in a record (BYTE LAYOUT), written and read. */
    void (*meta_write)(uint8_t *rec, int r, uint16_t sh, uint16_t zh);
    void (*meta_read)(const uint8_t *rec, int r, uint16_t *sh, uint16_t *zh);
    mpq_status (*open)(const void *buf, size_t bytes, mpq_packed *out);
    mpq_status (*dequantize)(const mpq_packed *A, int skip_planes, float *W);
    mpq_status (*dequantize_row)(const mpq_packed *A, int skip_planes, int row, float *w);
    mpq_status (*gemv)(const mpq_packed *A, const float *x, float *y, int batch, const mpq_gemv_opts *opts, void *work,
                       size_t work_bytes);
    size_t (*work_bytes)(const mpq_packed *A, int batch);
} mpq_format_traits;

/* The traits of a format, or NULL if unknown. */
MPQ_DEF const mpq_format_traits *mpq_format_get(mpq_format f);

#define MPQ_CAP_BITPLANE      1u /* multiplies bit-plane (and MXINT) matrices */
#define MPQ_CAP_HOST_MEMORY   2u /* x and y may be host pointers */
#define MPQ_CAP_DEVICE_MEMORY 4u /* x and y may be the backend's device pointers */

/* A compute backend: a table of function pointers. The CPU backend is in this
   header; mpq_cuda.h provides the CUDA one. `ctx` is the backend's own state.
   upload makes a backend-side handle for a validated matrix (the CPU backend
   keeps a view and a workspace, and does not copy the weights); gemv takes x
   and y in the backend's memory space (see caps). A handle is used by one
   thread at a time. pin and unpin may be NULL (the CPU backend's are): pin
   makes host memory that gemv will read and write quicker for the backend
   to reach (the CUDA backend page-locks it, so that its copies go by DMA
   without a staging copy), unpin undoes it and must come before the memory
   is freed; a failed pin changes nothing and the memory works as before.
   mpq_llm_state_init pins a state's scratch on the model's backend and
   mpq_llm_state_free unpins it (mpq_model.h). gemv_n may be NULL too (the
   CPU backend's is): the products y[k] = A_k x of one input by n maps
   (handles[k], all with the same columns), each y[k] as gemv would give
   it, so that a backend that copies x to its memory copies it once and
   waits once; the model's forward pass uses it for q, k and v and for
   gate and up. */
typedef struct mpq_backend {
    const char *name;
    unsigned caps;
    void *ctx;
    mpq_status (*upload)(void *ctx, const mpq_packed *A, void **handle);
    void (*release)(void *ctx, void *handle);
    mpq_status (*gemv)(void *ctx, void *handle, const float *x, float *y, int batch, const mpq_gemv_opts *opts);
    mpq_status (*synchronize)(void *ctx);
    mpq_status (*pin)(void *ctx, void *p, size_t bytes);
    void (*unpin)(void *ctx, void *p);
    mpq_status (*gemv_n)(void *ctx, int n, void *const *handles, const float *x, float *const *y, int batch,
                         const mpq_gemv_opts *opts);
} mpq_backend;

/* Fills *b with the CPU backend. */
MPQ_DEF void mpq_backend_cpu(mpq_backend *b);

/* ========================================================================== */
/* 7. AWQ                                                                     */
/* ========================================================================== */

/* Activation-aware weight quantization (Lin et al., AWQ; the quantizer SFMP
   builds on), for either packed format, with any bits map and permutations:

   1. scales: for alpha = k / grid, k = 0 .. grid-1, s_j = max(mean_t |X[t][j]|,
      1e-4)^alpha, normalised by sqrt(max s * min s); the layer is quantized
      as W diag(s) and multiplied by diag(1/s) x, and the alpha with the least
      output error on X wins (alpha = 0 is plain round-to-nearest, so the
      result is never worse than RTN on X). The objective is
      mean over tokens and rows of (sum_j (w^_ij - w_ij) x_tj)^2.
   2. clipping: for every group of every row, the scaled weights are clamped
      to r * max|w| for r = 1 - k * max_shrink / clip_steps, k = 0 .. clip_steps,
      and the r with the least output error of that group on a sample of
      tokens wins (r = 1, no clip, is a candidate: no group gets worse there).

   Outputs: col_scale (cols floats, packed column order: c[j] = 1 / s of the
   original column p_col[j]) and clip (rows x ceil(cols/group), packed
   coordinates, 0 = none); put both in the description and call mpq_pack.
   The scales cost nothing at inference: the GEMV applies them while it
   builds its tables. X is read in place (one gathered copy when d has a
   column permutation), never copied per grid point. d->col_scale and
   d->clip are ignored. Alphas whose scaled weights leave the fp16 range of
   the bit-plane pairs are skipped. */
typedef struct mpq_awq_desc {
    const float *X;   /* calibration activations, tokens x cols, row-major,
                         original column order (required) */
    int tokens;       /* rows of X (required, >= 1) */
    int grid;         /* alphas k / grid; 0 -> 20 */
    int clip_steps;   /* clip ratios; 0 -> 20; negative: no clip search */
    float max_shrink; /* smallest clip ratio is 1 - max_shrink; 0 -> 0.5 */
    int clip_tokens;  /* tokens of X (evenly spaced) for the clip search;
                         0 -> min(tokens, 32) */
} mpq_awq_desc;

typedef struct mpq_awq_result {
    float alpha;        /* the chosen ratio */
    double loss_rtn;    /* objective at alpha = 0 without clipping: plain RTN */
    double loss_scaled; /* at the chosen alpha, without clipping */
    double loss_final;  /* at the chosen alpha with the chosen clips */
} mpq_awq_result;

/* W: rows x cols float32 in original coordinates, as for mpq_pack, and X
   in original column order; with d->rotation the search runs on W V^T and
   X V^T (its outputs are then in the coordinates of V x, as d's are). clip
   may be NULL when a->clip_steps < 0. res may be NULL. */
MPQ_DEF mpq_status mpq_awq_search(const mpq_bitplane_desc *d, const float *W, const mpq_awq_desc *a, float *col_scale,
                                  float *clip, mpq_awq_result *res);

/* ========================================================================== */
/* 8. GPTQ                                                                    */
/* ========================================================================== */

/* GPTQ (Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training
   Quantization for Generative Pre-trained Transformers", ICLR 2023): the
   columns of W are quantized one at a time, in packed column order, and the
   error of each is fed back into the columns not yet quantized so that the
   layer's output error ||(W - Q) X||^2 = tr((W - Q) H (W - Q)^T), H = X^T X,
   stays small (the Optimal Brain Surgeon update, one column at a time;
   the paper's algorithm 1):

     for j = 0 .. cols-1:   q_j = quant(w_j),  e_j = (w_j - q_j) / U[j][j],
                            w_k -= e_j U[j][k]   for every k > j,

   where U is the upper Cholesky factor of the inverse of the damped
   Hessian, (H + lambda I)^-1 = U^T U. mpq forms neither that inverse nor
   U whole: with H + lambda I = R R^T, R upper triangular (the Cholesky
   factor taken from the last column backwards), U = R^-1, and the loop
   above gives W - Q = E U (E the errors e_j), so E = (W - Q) R. Hence,
   with d_i = w_i - q_i (original weights) and a_k = sum_{i < b} d_i R[i][k]
   over the columns of the blocks before the one that starts at b, the
   weights the loop sees at the start of that block are

     w~_k = w_k + sum_{b <= l <= k} a_l U[l][k]

   which needs U only inside the block's diagonal block (the inverse of
   R's, block x block). So: one Cholesky factorisation in float64
   (cols^3 / 3 flops), the diagonal blocks inverted, and inside a block
   the paper's loop through U; the sums a cross blocks through R (the
   lazy batch below). The loss sum e_j^2 is ||(W - Q) X||^2 under
   H + lambda I. As in the paper:

   - dampening: lambda = damp * mean(diag H) (damp 0.01 by default);
   - dead columns (H[j][j] = 0: an input that is always zero) get
     H[j][j] = 1 and weight 0 before anything else;
   - lazy batches: the columns of a block (128) update each other at once,
     the columns after it in one matrix product per block (the result is the
     column-by-column algorithm's, up to float rounding);
   - groups: a group's scale and zero (or MXINT exponent) are computed when
     its first column is reached, from the group's weights as the error
     feedback has left them (all earlier columns applied), clamped to
     +-clip first where d->clip gives one; static_groups computes every
     group's pair from the weights before any feedback instead (GPTQ's
     "static groups", which keeps groups stable under act-order);
   - act-order: columns processed in order of decreasing diag(H). In mpq the
     processing order is the packed column order, so act-order is the column
     permutation mpq_gptq_act_order returns, put in d->p_col: it costs
     nothing at inference (the GEMV gathers x through p_col anyway) and the
     groups are runs of consecutive processed columns, so act-order and
     groups combine without GPTQ's group index.

   Everything in the description is honoured: any group, per-block widths
   from a plan (bits, block_rows; SFMP, MixLLM), symmetric widths, either
   format (bit-plane or MXINT), p_row, p_col, col_scale (then GPTQ runs on
   the scaled layer, W~ / c with inputs x~ = c x, whose Hessian is
   diag(c) H diag(c): AWQ's scales and clips applied first), and a sparse
   part, which is stored as given. The output is an ordinary packed matrix.
   The factorisation is made in float32 first when there is dampening, and
   kept when its backward error, measured on two fixed vectors, is at most
   MPQ_GPTQ_F32_TOL (0.01) times lambda: it is then the exact factor of a
   matrix that differs from H + lambda I by at most a hundredth of what the
   dampening already changes (measured on SmolLM2's and synthetic 4096- and
   14336-column Hessians: 0.0001-0.0013 lambda; bench/results/NOTES.md,
   "Models larger than memory"). Otherwise (no dampening, a pivot that is
   not positive, a larger error) it is made in float64.
   mpq_gptq_result.factor_bits says which was kept. The weights and their
   updates are float32. Memory: cols^2 (4 + 2) bytes besides the packed
   buffer and a float copy of W (cols^2 (8 + 2) in float64). */
typedef struct mpq_gptq_cache mpq_gptq_cache; /* below */

#ifndef MPQ_GPTQ_F32_TOL
#define MPQ_GPTQ_F32_TOL 0.01
#endif

typedef struct mpq_gptq_desc {
    const float *H;        /* cols x cols, X^T X of the layer's inputs (any positive
                              multiple: GPTQ's 2 X^T X is the same), ORIGINAL column
                              order; symmetric: only H[i][j] with j <= i is read
                              (required; finite, diag >= 0) */
    double damp;           /* lambda = damp * mean(diag H); 0 -> 0.01; negative: no
                              dampening */
    int block;             /* columns per lazy batch; 0 -> 128 (rounded to whole
                              groups, at least one group) */
    int static_groups;     /* 1: every group's pair from the weights before any
                              error feedback */
    mpq_gptq_cache *cache; /* optional (mpq_gptq_cache_new): the last
                              factorisation, reused by a call with the same H,
                              p_col, col_scale, damp, block and float64 */
    int float64;           /* 1: factorise in float64 only (0: float32 first,
                              kept when its check passes; see above) */
} mpq_gptq_desc;

typedef struct mpq_gptq_result {
    double loss;     /* sum over columns and rows of e_j^2 / rows: the
                        mean over rows of ||(W - Q) X||^2 under H + lambda I,
                        in the coordinates of W (col_scale undone) */
    double lambda;   /* the dampening added to the diagonal */
    int dead;        /* columns with H[j][j] = 0 */
    int block;       /* the lazy batch used */
    int factor_bits; /* 32 or 64: the precision of the factorisation kept
                        (MPQ_GPTQ_F32_TOL) */
} mpq_gptq_result;

/* Quantize W (rows x cols float32, original coordinates, as for mpq_pack)
   with GPTQ into buf (size from mpq_bitplane_bytes(d), 64-byte aligned). On
   success *out is a view into buf. Errors: those of mpq_pack; H not finite
   (MPQ_ERR_NONFINITE) or with a negative diagonal, or damp not finite
   (MPQ_ERR_RANGE); MPQ_ERR_NOTPD when H + lambda I is not positive definite
   (raise damp). On error buf is untouched. res may be NULL. With
   d->rotation, W and H are still in original coordinates: GPTQ runs on W
   V^T under V H V^T (mpq_rotation_conjugate). */
MPQ_DEF mpq_status mpq_gptq(const mpq_bitplane_desc *d, const float *W, const mpq_gptq_desc *g, void *buf, size_t bytes,
                            mpq_packed *out, mpq_gptq_result *res);
/* The same, allocating the buffer (mpq_packed_free releases it). */
MPQ_DEF mpq_status mpq_gptq_alloc(const mpq_bitplane_desc *d, const float *W, const mpq_gptq_desc *g, mpq_packed *out,
                                  mpq_gptq_result *res);
/* GPTQ's act-order as a column permutation: p_col[j] = the column with the
   j-th largest H[c][c] (ties: lower column first). Put it in d->p_col (with
   a bits map whose widths do not vary along columns, or one planned in that
   order). */
MPQ_DEF mpq_status mpq_gptq_act_order(const float *H, int cols, uint32_t *p_col);

/* Maps with the same inputs (q, k, v; gate, up) share one X^T X, so
   GPTQ's factorisation of it can be shared: a cache (mpq_gptq_desc.cache)
   keeps the last one, with a copy of the H (lower triangle), p_col and
   col_scale it was made from, and a call whose H, p_col, col_scale (all bit
   for bit), damp, block and float64 match reuses it; any other call
   replaces it.
   The result is the same bits with or without the cache. It holds about
   cols^2 (2 + 2) bytes until freed or replaced. Not for two calls at once. */
MPQ_DEF mpq_gptq_cache *mpq_gptq_cache_new(void); /* NULL without memory */
MPQ_DEF void mpq_gptq_cache_free(mpq_gptq_cache *c);

/* ========================================================================== */
/* 9. Selection, permutations                                                 */
/* ========================================================================== */

/* The building blocks of the planners. Values must be finite (NaN or Inf is
   MPQ_ERR_NONFINITE, nothing written). Ties are always broken the same way:
   the lower index (and, across layers, the earlier layer) ranks first, so
   every result is deterministic. Functions that need scratch memory
   allocate it (MPQ_MALLOC) and free it before returning. */

/* idx (n entries) = 0..n-1 sorted by v descending; stable (equal values keep
   index order). O(n log n) merge sort. */
MPQ_DEF mpq_status mpq_argsort_desc(const float *v, size_t n, uint32_t *idx);

/* The value of rank floor(q (n - 1)) in ascending order (the lower
   q-quantile, no interpolation), q in [0, 1]. Expected O(n) (three-way
   quickselect, median-of-three pivots, a sort as the fallback when the
   partitions keep coming out unbalanced). */
MPQ_DEF mpq_status mpq_quantile(const float *v, size_t n, double q, float *out);

/* The k largest values: idx (k entries) receives their indices in ascending
   index order. Expected O(n). k = 0 writes nothing and succeeds. */
MPQ_DEF mpq_status mpq_top_k(const float *v, size_t n, size_t k, uint32_t *idx);

/* One layer's values for the global selection. */
typedef struct mpq_span {
    const float *v;
    size_t n;
} mpq_span;

/* The k largest values over all spans at once ("global": across the layers
   of a model): selected[l][i] = 1 for the chosen, 0 for the others, in every
   span l. Expected O(total). */
MPQ_DEF mpq_status mpq_top_k_global(const mpq_span *spans, int nspans, size_t k, uint8_t *const *selected);

/* Permutations from salience S (rows x cols, row-major), SFMP eq. 11-12:
   row sums s_row = S 1 and column sums s_col = S^T 1 (in float64), each
   argsorted descending, so that p_row[0] is the most salient row. Either
   output may be NULL (reorder the other dimension only). */
MPQ_DEF mpq_status mpq_perm_from_salience(const float *S, int rows, int cols, uint32_t *p_row, uint32_t *p_col);
/* MPQ_OK when p is a permutation of 0..n-1, MPQ_ERR_PERM otherwise. */
MPQ_DEF mpq_status mpq_perm_validate(const uint32_t *p, int n);
/* inv[p[i]] = i. */
MPQ_DEF mpq_status mpq_perm_invert(const uint32_t *p, int n, uint32_t *inv);
/* Gathering by `first` and then by `second` (y[i] = x[first[i]], then
   z[i] = y[second[i]]) equals gathering by out: out[i] = first[second[i]]. */
MPQ_DEF mpq_status mpq_perm_compose(const uint32_t *first, const uint32_t *second, int n, uint32_t *out);
/* out[i][j] = W[p_row[i]][p_col[j]] (SFMP eq. 13, offline; at run time the
   packed matrix carries the permutations). Either permutation may be NULL
   (identity). out must not overlap W. */
MPQ_DEF mpq_status mpq_perm_apply(const float *W, int rows, int cols, const uint32_t *p_row, const uint32_t *p_col,
                                  float *out);

/* ========================================================================== */
/* 10. Statistics                                                             */
/* ========================================================================== */

/* Salience statistics, accumulated a batch at a time in O(size of the
   statistic) memory (float64 sums and a sample count): a caller never needs
   all its calibration data at once. Every *_add rejects NaN and Inf
   (MPQ_ERR_NONFINITE) and a size that does not match the statistic
   (MPQ_ERR_SIZE), and then leaves the statistic unchanged. */
typedef struct mpq_stat {
    double *sum; /* n sums (owned; mpq_stat_free) */
    size_t n;
    uint64_t count; /* samples: gradients for the gradient statistics, tokens for the activation ones */
} mpq_stat;

MPQ_DEF mpq_status mpq_stat_init(mpq_stat *st, size_t n);
MPQ_DEF void mpq_stat_free(mpq_stat *st);
/* out[i] = sum[i] / count: the mean (MPQ_ERR_SIZE before any sample). */
MPQ_DEF mpq_status mpq_stat_mean(const mpq_stat *st, float *out);
/* out[i] = sum[i]: for diag(X^T X), which is a sum. */
MPQ_DEF mpq_status mpq_stat_sum(const mpq_stat *st, float *out);

/* Fisher diagonal (SFMP alg. 1): one gradient of the loss with respect to the
   st->n weights per call; the mean of g^2 is the salience. */
MPQ_DEF mpq_status mpq_fisher_add(mpq_stat *st, const float *grad, size_t n);
/* Column Hessian diagonal H_jj = sum_k X_kj^2 (MXSens alg. 1), X: tokens x
   cols (st->n = cols); mpq_stat_sum reads it. */
MPQ_DEF mpq_status mpq_hessian_diag_add(mpq_stat *st, const float *X, int tokens, int cols);
/* Mean |x| per column (AWQ), X: tokens x cols; mpq_stat_mean reads it. */
MPQ_DEF mpq_status mpq_mean_abs_add(mpq_stat *st, const float *X, int tokens, int cols);
/* MixLLM's output-channel salience (its eq. 4): for one sample d with the
   gradient G (rows x cols) of the loss with respect to the layer's weights
   and the quantization delta D = W_q - W (rows x cols), adds
   |g_c^T d_c + (g_c^T d_c)^2 / 2| for every output channel (row) c
   (st->n = rows); the mean over samples is S_c. */
MPQ_DEF mpq_status mpq_mixllm_add(mpq_stat *st, const float *G, const float *D, int rows, int cols);

/* Gradient callback for PQI: grad = dF/dw at the n weights w. A non-OK
   status stops the computation and is returned. */
typedef mpq_status (*mpq_grad_fn)(void *user, const float *w, float *grad, size_t n);

/* Post-quantization integral (PQI/ReQuant eq. 7):
   v[i] = (1/N) sum_{k=1..N} |dF/dw_i (w + k/N (w~ - w))|, a right-endpoint
   Riemann sum along the path from w to its quantized value w~, with N
   gradient calls. Memory: two vectors of n floats and n doubles. */
MPQ_DEF mpq_status mpq_pqi(const float *w, const float *w_q, size_t n, int N, mpq_grad_fn grad, void *user, float *v);

/* Delta F_PQI (eq. 6) of a rows x cols layer: v_i |w~_i - w_i| per weight
   (per_weight, rows x cols), summed per row (rows), per column (cols), per
   block (ceil(rows/block_rows) x ceil(cols/group)) and for the layer; every
   output may be NULL. Sums in float64. */
MPQ_DEF mpq_status mpq_pqi_delta(const float *v, const float *w, const float *w_q, int rows, int cols, int block_rows,
                                 int group, float *per_weight, double *per_row, double *per_col, double *per_block,
                                 double *layer);

/* MXSens layer sensitivity (its alg. 3): S_i = e_i / max e from the output
   errors e_i the caller measured by quantizing one layer at a time; in
   [0, 1]. Errors must be finite, >= 0, and not all zero. */
MPQ_DEF mpq_status mpq_mxsens_layer_sensitivity(const double *errors, int nlayers, float *S);

/* ========================================================================== */
/* 11. Plans                                                                  */
/* ========================================================================== */

/* A plan is data: for every layer the permutations, the group, block_rows,
   format and bits map, and the budget it achieves. Planners fill plans and
   never quantize; mpq_plan_desc turns a layer's plan into the description
   that mpq_pack (the quantizer) takes. Budgets follow the design notes: bits
   per weight count weight bits plus per-group metadata (32/group for the
   fp16 pairs of the bit-plane format, 8/32 for MXINT's E8M0 byte);
   permutations and bits maps are reported separately, in bytes. */
typedef struct mpq_layer_plan {
    int rows, cols, group, block_rows, format;
    unsigned symmetric; /* widths quantized symmetrically (bit b: b bits), as in mpq_bitplane_desc */
    uint8_t *bits;      /* ceil(rows/block_rows) x ceil(cols/group), packed coordinates */
    uint32_t *p_row;    /* NULL: identity */
    uint32_t *p_col;    /* NULL: identity */
    double weight_bits; /* sum of the widths of all weights */
    double meta_bits;   /* scales and zeros (or exponents) */
    size_t outliers;    /* weights to keep in the sparse part (mpq_plan_requant); 0: none */
    double loss;        /* the predicted loss (mpq_plan_measured); 0 from other planners */
} mpq_layer_plan;

typedef struct mpq_plan {
    int nlayers;
    mpq_layer_plan *layers; /* owned: mpq_plan_free */
    double bpw;             /* achieved: (weight + metadata bits) / weights, over all layers */
    double index_bytes;     /* permutations and bits maps, reported apart from bpw */
    double sparse_bytes;    /* the planned sparse parts (outliers) as stored, apart from bpw */
    double loss;            /* the predicted loss, the layers' sum (mpq_plan_measured); 0 otherwise */
} mpq_plan;

MPQ_DEF void mpq_plan_free(mpq_plan *p);
/* The description that packs layer l as planned (pointers into the plan). */
MPQ_DEF mpq_status mpq_plan_desc(const mpq_plan *p, int layer, mpq_bitplane_desc *d);
/* A readable summary (one line per layer: shape, widths histogram, bpw) into
   buf, like snprintf: returns the length it needs. Prints nothing itself. */
MPQ_DEF size_t mpq_plan_summary(const mpq_plan *p, char *buf, size_t size);
/* How two plans of the same layers differ: blocks whose width differs (a
   block is compared by its weights' widths, so plans with different blocks
   or permutations compare weight by weight: differing weights), and the
   difference in bpw (b - a). */
typedef struct mpq_plan_diff {
    double weights_differing; /* weights whose width differs */
    double bpw_delta;
} mpq_plan_diff;
MPQ_DEF mpq_status mpq_plan_compare(const mpq_plan *a, const mpq_plan *b, mpq_plan_diff *out);

/* SFMP (its section 4 and algorithm 2): block-wise fractional bit widths from
   salience. Every layer is cut into block_rows x group blocks (after the
   optional reordering by row and column salience sums, eq. 11-13), a block's
   salience is the sum of its weights' salience (eq. 9), and the blocks of all
   layers are ranked together: the most salient get ceil(b) bits, the rest
   floor(b) (eq. 10), where b is the weight-bit budget left after metadata.
   The fraction at ceil(b) is the largest prefix of the ranking that fits the
   budget, so the plan meets it exactly (whole blocks) or from below; ties
   rank the earlier layer and block first. A budget whose weight bits fall
   below 1 is MPQ_ERR_RANGE; above 8, every block gets 8. */
enum { MPQ_REORDER_NONE = 0, MPQ_REORDER_ROWS = 1, MPQ_REORDER_COLS = 2, MPQ_REORDER_BOTH = 3 };

typedef struct mpq_sfmp_layer {
    const float *S; /* salience per weight, rows x cols (the Fisher diagonal), finite and >= 0 */
    int rows, cols;
} mpq_sfmp_layer;

typedef struct mpq_sfmp_desc {
    double bpw;     /* budget over all layers, weight bits + metadata (required) */
    int group;      /* 0 -> 128 */
    int block_rows; /* 0 -> 16 */
    int reorder;    /* MPQ_REORDER_*; 0 -> none */
} mpq_sfmp_desc;

MPQ_DEF mpq_status mpq_plan_sfmp(const mpq_sfmp_layer *layers, int nlayers, const mpq_sfmp_desc *d, mpq_plan *out);
/* SFMP in two steps, for salience that does not fit in memory at once (an
   8B model's Fisher diagonal is 28 GB of float32): mpq_sfmp_reduce turns one
   layer's salience into all that the plan reads of it, the permutations of
   the reordering (eq. 11-13) and the block sums after it (eq. 9), about
   1/(block_rows x group) of its size; mpq_plan_sfmp_reduced ranks reduced
   layers as mpq_plan_sfmp ranks the layers themselves, and gives the same
   plan bit for bit (mpq_plan_sfmp is these two steps). A reduced layer
   belongs to the group, block_rows and reorder of the description it was
   made with: another description is MPQ_ERR_ARG. */
typedef struct mpq_sfmp_reduced {
    int rows, cols, group, block_rows, reorder;
    float *block_sal; /* ceil(rows/block_rows) x ceil(cols/group): eq. 9 on the reordered salience */
    uint32_t *p_row;  /* MPQ_REORDER_ROWS: the rows' order (as the plan's); else NULL */
    uint32_t *p_col;  /* MPQ_REORDER_COLS: the columns' order; else NULL */
} mpq_sfmp_reduced;

/* Errors as mpq_plan_sfmp's for the layer's shape and values; *out is
   written only on success (free it with mpq_sfmp_reduced_free). */
MPQ_DEF mpq_status mpq_sfmp_reduce(const mpq_sfmp_layer *layer, const mpq_sfmp_desc *d, mpq_sfmp_reduced *out);
MPQ_DEF void mpq_sfmp_reduced_free(mpq_sfmp_reduced *r); /* NULL and zeroed are accepted */
/* The plan copies what it keeps (the layers stay the caller's). Block sums
   that are not finite or negative and permutations that are not ones are
   refused as mpq_plan_sfmp refuses such salience. */
MPQ_DEF mpq_status mpq_plan_sfmp_reduced(const mpq_sfmp_reduced *layers, int nlayers, const mpq_sfmp_desc *d,
                                         mpq_plan *out);
/* The budgets mpq_plan_sfmp can meet for these layers and d (d->bpw is not
   read): *lo = 1 + the metadata's bits per weight (every block at 1 bit;
   less is MPQ_ERR_RANGE), *hi = 8 + the same (every block at 8 bits; a
   larger budget gives the same plan). */
MPQ_DEF mpq_status mpq_sfmp_bpw_range(const mpq_sfmp_layer *layers, int nlayers, const mpq_sfmp_desc *d, double *lo,
                                      double *hi);

/* MixLLM (its section 3.2 and algorithm 1): output channels of all layers are
   ranked together by their salience (mpq_mixllm_add: the loss estimate of
   quantizing that channel), and the top `count` channels (or `fraction` of
   all channels when count is 0) get the high width, symmetric, the rest the
   low width, asymmetric; group-wise. Widths are per row (block_rows = 1) and
   each layer's rows are permuted so that its high-width rows come first
   (then by salience), which keeps them contiguous: only the tile at the
   boundary mixes widths. Ties rank the earlier layer and row first. */
typedef struct mpq_mixllm_layer {
    const float *salience; /* rows values, finite and >= 0 */
    int rows, cols;
} mpq_mixllm_layer;

typedef struct mpq_mixllm_desc {
    long long count; /* channels at the high width over all layers; 0 -> use fraction */
    double fraction; /* of all channels, in [0, 1] (used when count is 0) */
    int high_bits;   /* 0 -> 8 (symmetric) */
    int low_bits;    /* 0 -> 4 (asymmetric) */
    int group;       /* 0 -> 128 */
} mpq_mixllm_desc;

MPQ_DEF mpq_status mpq_plan_mixllm(const mpq_mixllm_layer *layers, int nlayers, const mpq_mixllm_desc *d,
                                   mpq_plan *out);

/* MXSens (its section 4.2, algorithm 2 and theorem A.1), for the MXINT
   format: in every layer the columns are ranked by sensitivity (diag(X^T X))
   and permuted so; the top 32 (one MXINT block) get 8-bit mantissas, the next
   N6 columns 6 bits and the rest 4, with N6 = R * S_layer * (d_in - 32) and
   one global R chosen for the budget. Differences from the paper, so that
   the budget always holds:
   - the budget is bits per weight including the E8M0 byte (8/32 bpw), and R
     weights every column by its layer's rows; with equal rows this is the
     paper's eq. 2 exactly;
   - N6 is rounded down to whole 32-column blocks (the last, partial block is
     the least sensitive and stays at 4 bits);
   - where R * S_layer would give more 6-bit columns than a layer has, the
     layer is capped and R is solved again over the other layers;
   - a layer of 32 columns or fewer is one block at 8 bits; when those fixed
     costs (each layer's first block at 8 bits, the rest at 4, the E8M0
     bytes) exceed the budget, the result is MPQ_ERR_RANGE:
     mpq_mxsens_bpw_min gives the lowest budget that is met. */
typedef struct mpq_mxsens_layer {
    const float *col_sens; /* cols values, diag(X^T X) (finite, >= 0) */
    float layer_sens;      /* S_layer in [0, 1] (mpq_mxsens_layer_sensitivity) */
    int rows, cols;
} mpq_mxsens_layer;

/* *R_out (may be NULL) receives the final R. */
MPQ_DEF mpq_status mpq_plan_mxsens(const mpq_mxsens_layer *layers, int nlayers, double bpw, mpq_plan *out,
                                   double *R_out);
/* *lo = the lowest budget mpq_plan_mxsens meets for these layers (the plan
   of no 6-bit columns: 8.25 bits per weight in each layer's first block, 4.25
   in the others); less is MPQ_ERR_RANGE. Validates the layers as the
   planner does. */
MPQ_DEF mpq_status mpq_mxsens_bpw_min(const mpq_mxsens_layer *layers, int nlayers, double *lo);

/* ReQuant (PQI/ReQuant section 6): a dense-and-sparse split on top of any
   dense plan, W^ = Q(W - W_o) + W_o + W_s (eq. 8). Its pipeline, with the
   caller's quantizer and loss in callbacks (the planner never quantizes):

   1. pre-quantize W~ = Q(W); PQI v along W -> W~ (mpq_pqi) gives each
      layer's mean Delta F_PQI (mpq_pqi_delta's layer sum / weights);
   2. mpq_plan_requant: outlier counts per layer from a global ratio r_o and
      a temperature t (eq. 9, mpq_requant_outlier_counts), t by grid search
      against the caller's loss of each candidate (its algorithm 1);
   3. mpq_requant_outliers marks the largest |w| of each layer; the dense
      part quantizes W with those weights set to 0;
   4. mpq_requant_significant detaches the weights with the largest
      v (.) |W^ - W| over all layers, beta at a time, PQI refreshed between
      steps by a callback (its algorithm 2);
   5. mpq_sparse_from_mask turns the marked weights (outliers and
      significant) into the sparse part, pack with d.sparse set.

   One difference from the paper: the sparse part stores W - Q(W - W_o) at
   an outlier, not W_o, so dense + sparse reproduces the outlier (up to fp16)
   instead of W_o + Q(0). */

/* Eq. 9 with layer sizes: counts[l] = K * n_l dF_l^t / sum_i n_i dF_i^t for
   K = floor(ratio * sum n) outliers, where dF_l is the layer's MEAN Delta
   F_PQI per weight (the paper's table 4). With layers of equal size this is
   eq. 9 exactly; weighting by n_l makes t = 0 the uniform ratio (every layer
   r_o of its weights), the baseline the paper improves on. Counts are whole
   numbers summing to exactly K (largest remainders, ties to the earlier
   layer) and never exceed a layer's size (the excess goes to the others).
   dF must be finite and > 0 when t != 0; ratio in [0, 1]; t finite. */
MPQ_DEF mpq_status mpq_requant_outlier_counts(const double *layer_dF, const size_t *layer_n, int nlayers, double ratio,
                                              double t, size_t *counts);

/* The caller's loss F of the model quantized with these outlier counts (its
   algorithm 1's inner step: select, quantize W - W_o, add W_o, evaluate). */
typedef mpq_status (*mpq_requant_loss_fn)(void *user, const size_t *counts, int nlayers, double *loss);

/* Algorithm 1 on a plan: t = 0, t_step, 2 t_step, ... below 1 (t_step 0 ->
   0.1), the t with the least loss wins (the first on ties), and
   p->layers[l].outliers receives its counts; p->sparse_bytes accounts the
   sparse parts they will take. layer_dF: one value per plan layer (as in
   mpq_requant_outlier_counts). *t_best (may be NULL) receives t. A loss
   that is not finite is MPQ_ERR_NONFINITE; on any error the plan is
   unchanged. */
MPQ_DEF mpq_status mpq_plan_requant(mpq_plan *p, const double *layer_dF, double ratio, double t_step,
                                    mpq_requant_loss_fn loss, void *user, double *t_best);

/* mask[i] = 1 for the `count` entries of W (n values) with the largest |w|
   (ties: lower index first), 0 elsewhere. */
MPQ_DEF mpq_status mpq_requant_outliers(const float *W, size_t n, size_t count, uint8_t *mask);

/* One layer in the significant-weight search. */
typedef struct mpq_requant_layer {
    const float *W; /* original weights (n) */
    float *Wq;      /* the current reconstruction W^ (n): set to W where detached */
    float *v;       /* PQI along W -> Wq (n), written by the refresh callback */
    uint8_t *mask;  /* 1 where the weight is already in the sparse part (n); updated */
    size_t n;
} mpq_requant_layer;

/* Refreshes every layer's v for the current Wq (mpq_pqi with the model's
   gradient). */
typedef mpq_status (*mpq_requant_pqi_fn)(void *user, mpq_requant_layer *layers, int nlayers);

/* Algorithm 2: in `steps` passes (r_s / beta), refresh v, then detach the
   weights with the largest v_i |Wq_i - W_i| over all layers among those not
   yet detached (Wq_i = W_i, mask_i = 1); the passes detach `total` weights
   in all (step s takes floor(total (s+1)/steps) - floor(total s/steps)).
   Ties: earlier layer, lower index. total may not exceed the weights not yet
   masked. */
MPQ_DEF mpq_status mpq_requant_significant(mpq_requant_layer *layers, int nlayers, size_t total, int steps,
                                           mpq_requant_pqi_fn refresh, void *user);

/* THE STATISTICS-ONLY SPLIT: the pipeline above over n maps, with each
   map's PQI v computed beforehand (along W -> Q(W) for some quantizer Q,
   e.g. mpq_model.h's calibration) instead of from the model's gradients.
   Two steps differ from the paper, which runs the model at every
   candidate: the temperature t of eq. 9 (0, 0.25, 0.5, 0.75) is chosen by
   the first-order loss the PQI itself estimates, sum v |W^ - W| over all
   maps (eq. 6), W^ the dense part with the candidate's outliers exact;
   and the significant weights are detached in one step with that v
   (algorithm 2 without refreshes). Eq. 9 weighs each map by its mean
   Delta F_PQI (eq. 6) against its dense part. Memory: besides the masks, 8
   bytes per weight of all the maps at once. */
typedef struct mpq_requant_map {
    const float *W;      /* rows x cols (d.rows x d.cols), original coordinates; with
                            d.rotation, those of the columns: W V^T (the rotation is stored
                            with the matrix, not applied to W again) */
    const float *pqi;    /* rows x cols, finite and >= 0, in the coordinates of W */
    mpq_bitplane_desc d; /* the dense part's description (d.sparse ignored; permutations,
                            AWQ's col_scale and clip, a rotation allowed) */
    uint8_t *mask;       /* out: rows x cols (the caller's), 1 where the weight goes to the
                            sparse part; in the coordinates of W */
} mpq_requant_map;

/* outliers and significant: fractions of all the maps' weights (eq. 9's
   r_o and the paper's r_s), in [0, 0.5]. *t_best, *sparse (may be NULL):
   the temperature chosen and the weights marked in all. */
MPQ_DEF mpq_status mpq_requant_masks(mpq_requant_map *maps, int n, double outliers, double significant, double *t_best,
                                     size_t *sparse);
/* The packed matrix of one map (allocated; mpq_packed_free): the dense
   part of W with the marked weights at zero, and the sparse part that
   restores them (W - dense there, fp16). */
MPQ_DEF mpq_status mpq_requant_pack(const mpq_requant_map *map, mpq_packed *out);

/* ALLOCATION from predicted losses: the widths of every map chosen so that
   the model's predicted loss (the KL divergence to the float model) is
   least for a size, or the size least for a loss. Map i has options
   k = 0 .. nopt - 1 (a width, or any setting the caller measured): bits[k],
   its size in bits (weights and metadata), and loss[k], the predicted
   growth of the model's loss when map i alone is quantized so. The
   model's predicted loss is the sum of its maps' (the measurements say how
   well that holds). A map may also mix two of its options block by block
   (SFMP's ranking puts the most salient blocks at the wider one): a share
   t of it at option hi and 1 - t at lo, its bits and loss interpolated
   linearly (promoting the most salient blocks first, the real loss lies on
   or below that line).

   With mixing, a map's least loss for x bits is the lower convex hull of
   its options, so both problems are separable and convex: start every map
   at its cheapest option (fewest bits; of equal ones the least loss), then
   take the hull steps of all the maps one at a time, the one that saves
   the most loss per bit first (ties: the lowest map index), until the
   budget or the bound is reached. That walk is optimal (each step taken
   saves at least as much per bit as any step left, which is the
   Lagrangian condition of the convex problem), and it leaves at most one
   map mixed: the step it reaches the budget or the bound in, taken in
   part. Options off the hull (more bits for no less loss, or above the
   chord of their neighbours) are never chosen: a mix beats them. */
typedef struct mpq_alloc_map {
    int nopt;
    const double *bits; /* nopt sizes, finite and > 0 */
    const double *loss; /* nopt predicted losses, finite and >= 0 */
} mpq_alloc_map;

typedef struct mpq_alloc_choice {
    int lo, hi;        /* options: the map is option lo, or (t > 0) a mix of lo and hi */
    double t;          /* share at hi, in [0, 1) */
    double bits, loss; /* the map's: (1 - t) lo's + t hi's */
} mpq_alloc_choice;

/* A map's predicted loss at width b (1..8) from its measurements at the
   distinct widths wb[0 .. n-1] (1..8) with losses loss[k] (finite, >= 0):
   at a measured width the measurement; between two measured widths the
   log-linear interpolation (a power law in the quantizer's error energy,
   which falls about 4x a bit); beyond them the line through the two nearest
   measurements, its slope at most 0 (the loss does not grow with the
   width), or with one measurement the 4x a bit of the error energy (a loss
   in proportion to it, as small perturbations give). Then made monotone:
   never above the prediction at a narrower width. Losses below 1e-30 count
   as 1e-30. */
MPQ_DEF mpq_status mpq_alloc_predict(const int *wb, const double *loss, int n, int b, double *out);

/* The sizes and losses the walk spans: *bits_min and *loss_max at every
   map's cheapest option, *bits_max and *loss_min where every map has
   reached its least loss (the end of its hull). Any pointer but maps may
   be NULL. MPQ_ERR_ARG / MPQ_ERR_SIZE / MPQ_ERR_NONFINITE / MPQ_ERR_RANGE
   for a map without options or with sizes or losses out of range. */
MPQ_DEF mpq_status mpq_alloc_range(const mpq_alloc_map *maps, int n, double *bits_min, double *loss_max,
                                   double *bits_max, double *loss_min);
/* The least predicted loss within `budget` bits: out[i] per map (the
   caller's, n of them). A budget below bits_min is MPQ_ERR_RANGE; from
   bits_max on, every map is at its least loss. The total size is at most
   the budget and, below bits_max, equal to it up to rounding. */
MPQ_DEF mpq_status mpq_alloc_for_bits(const mpq_alloc_map *maps, int n, double budget, mpq_alloc_choice *out);
/* The fewest bits whose predicted loss is at most `bound`: a bound below
   loss_min is MPQ_ERR_RANGE; from loss_max on, every map is at its
   cheapest option (the caller decides whether such a bound is useful). */
MPQ_DEF mpq_status mpq_alloc_for_loss(const mpq_alloc_map *maps, int n, double bound, mpq_alloc_choice *out);

/* The plan from measured losses (`mpq quantize --method auto`). Map i was
   measured at the widths d->widths: the model's loss (its KL divergence
   to the float model, mpq_model.h's mpq_llm_measure) when map i alone is
   quantized so. Its loss at each candidate width d->min_bits ..
   d->max_bits is predicted from them (mpq_alloc_predict), its size there
   is rows x cols x width plus 32 bits of scale and zero per row and group,
   and the allocation chooses: mpq_alloc_for_bits under the budget d->bpw
   (bits per weight with the metadata), or mpq_alloc_for_loss under the
   bound d->max_loss. Every map gets one width but at most one, which mixes
   two: its block rows at the wider width, the most salient first (the sums
   of row_salience over each block row; in order without it), as many as
   its share of the wider width holds: at most the share under a budget
   (the budget kept), at least it under a bound (the bound kept). Each plan
   layer is bit-plane, uniform per block row, with `loss` its predicted loss
   (its block rows' predictions weighted by their rows); the plan's `loss`
   is their sum. Whether the sum predicts the model's loss is a matter of
   measurement: bench/results/NOTES.md, "Allocation from measured KL
   divergence". */
typedef struct mpq_measured_layer {
    int rows, cols;
    const double *loss;        /* d->nwidths measured losses, finite and >= 0 */
    const float *row_salience; /* rows, finite and >= 0 (may be NULL): how much each output row matters, e.g.
                                  the row sums of the Fisher diagonal */
} mpq_measured_layer;

typedef struct mpq_measured_desc {
    const int *widths;      /* the measured widths, distinct, 1..8 */
    int nwidths;            /* 1..8 */
    int min_bits, max_bits; /* the candidate widths; 0 -> 2 and 8 */
    double bpw;             /* > 0: the budget in bits per weight, metadata included; or */
    double max_loss;        /* > 0 (bpw 0): the fewest bits whose predicted loss is at most this */
    int group, block_rows;  /* 0 -> 128 (a multiple of 8) and 16 */
    int symmetric;          /* 1: symmetric groups */
} mpq_measured_desc;

/* The range the allocation spans: *bpw_lo and *loss_hi with every map at
   min_bits, *bpw_hi and *loss_lo where every map has reached its least
   predicted loss (d->bpw and d->max_loss are not read; any pointer but
   layers and d may be NULL). */
MPQ_DEF mpq_status mpq_plan_measured_range(const mpq_measured_layer *layers, int n, const mpq_measured_desc *d,
                                           double *bpw_lo, double *bpw_hi, double *loss_lo, double *loss_hi);
/* The plan (mpq_plan_free). MPQ_ERR_RANGE for a budget outside [bpw_lo,
   bpw_hi] or a bound outside [loss_lo, loss_hi) (no plan meets it, or
   every plan does); MPQ_ERR_ARG for both or neither of bpw and max_loss,
   or descriptions out of range; MPQ_ERR_BITS, MPQ_ERR_NONFINITE and
   MPQ_ERR_RANGE as mpq_alloc_predict for the measurements; MPQ_ERR_SIZE
   for an empty shape. */
MPQ_DEF mpq_status mpq_plan_measured(const mpq_measured_layer *layers, int n, const mpq_measured_desc *d,
                                     mpq_plan *out);

/* ========================================================================== */
/* 12. Precision schedules (PMPD)                                             */
/* ========================================================================== */

/* Phase-aware and progressive mixed-precision decoding (PMPD sections 4.1 to
   4.3). Precision levels are `skip_planes` values of one nested packed model
   (design notes, "Nested precision"): a larger skip is a lower precision, and
   switching is a change of mpq_gemv_opts.skip_planes between tokens. The
   prompt is processed at prefill_skip; decoded token t (0-based) at level k
   for start[k] <= t < start[k+1], the last level until the end. Levels are
   progressive: skip[] strictly increases and start[] does not decrease
   (PMPD eq. 3); equal starts give a level no tokens. */
#define MPQ_PMPD_MAX_LEVELS 8

typedef struct mpq_pmpd_schedule {
    int prefill_skip;                /* skip_planes for the prompt (>= 0) */
    int nlevels;                     /* 1 .. MPQ_PMPD_MAX_LEVELS */
    int skip[MPQ_PMPD_MAX_LEVELS];   /* per level, strictly increasing, >= 0 */
    long start[MPQ_PMPD_MAX_LEVELS]; /* first decoded token of each level; start[0] = 0 */
} mpq_pmpd_schedule;

MPQ_DEF mpq_status mpq_pmpd_validate(const mpq_pmpd_schedule *s);
/* skip_planes for decoded token t (t < 0: the prompt, prefill_skip); -1 when
   the schedule is invalid. */
MPQ_DEF int mpq_pmpd_skip_at(const mpq_pmpd_schedule *s, long t);
/* Average bits per weight read while decoding `length` tokens:
   (1/length) sum_t bits[skip at t], where bits[k] is the model's weight bits
   per weight at skip k (mpq_packed_bpw_skip), for k up to the schedule's
   largest skip. */
MPQ_DEF mpq_status mpq_pmpd_average_bits(const mpq_pmpd_schedule *s, const double *bits, long length, double *avg);
/* Bits per weight a product with this skip_planes reads: the weight bits
   max(b - skip, 1) of every weight plus the metadata (level 1 of
   mpq_packed_bpw). */
MPQ_DEF double mpq_packed_bpw_skip(const mpq_packed *A, int skip_planes);

/* The caller's quality q(S) of a schedule on its validation set (higher is
   better: accuracy, -perplexity, ROUGE...). */
typedef mpq_status (*mpq_pmpd_quality_fn)(void *user, const mpq_pmpd_schedule *s, double *quality);

/* The static scheduler (section 4.3). Candidate switch points are
   round(k * length / (N - 1)), k = 0 .. N-1 (0 and length included; a level
   starting at `length` is never used). Every progressive schedule over the
   levels skip[0..nlevels-1] with starts from the candidates is ranked by its
   average bits (the objective: minimize what decoding reads), cheapest
   first, and the first whose quality is at least target (q_ref - epsilon)
   is returned: the cheapest schedule that meets the target, with one
   quality call per schedule cheaper than it. Ties in average bits: the
   schedule that keeps higher precision longer first. Candidates: at most
   MPQ_PMPD_MAX_SEARCH schedules (MPQ_ERR_RANGE beyond). No schedule meeting
   the target (not even all tokens at skip[0]) is MPQ_ERR_RANGE. */
#define MPQ_PMPD_MAX_SEARCH 100000
typedef struct mpq_pmpd_search {
    int prefill_skip;
    int nlevels;                   /* levels to schedule, 1 .. MPQ_PMPD_MAX_LEVELS */
    int skip[MPQ_PMPD_MAX_LEVELS]; /* strictly increasing */
    const double *bits;            /* bits[k] per weight at skip k, as for average_bits */
    long length;                   /* OL, the generation length the average is over */
    int candidates;                /* N >= 2 */
    double target;                 /* q_ref - epsilon */
} mpq_pmpd_search;

/* *out: the schedule; *quality (may be NULL): its quality; *evaluated (may
   be NULL): quality calls made. */
MPQ_DEF mpq_status mpq_pmpd_static_search(const mpq_pmpd_search *d, mpq_pmpd_quality_fn q, void *user,
                                          mpq_pmpd_schedule *out, double *quality, int *evaluated);

/* Phase-aware precision allocation (section 4.1): over the pairs (prefill
   skip, decode skip) with both in skips[0..n-1] (n <= 8, skips 0..7) and
   the prefill at least as precise as the decode (prefill skip <= decode
   skip), the pair with the fewest decode bits (then the fewest prefill bits)
   whose single-level schedule meets the target. bits as above. Pairs are
   tried cheapest first, so the quality calls stop at the answer;
   MPQ_ERR_RANGE when no pair meets the target. */
MPQ_DEF mpq_status mpq_pmpd_phase_allocate(const int *skips, int n, const double *bits, double target,
                                           mpq_pmpd_quality_fn q, void *user, mpq_pmpd_schedule *out);

/* PMPD's LEARNED SCHEDULER (section 4.2, appendix A.1): a schedule for each
   prompt from the KV cache the prompt's pass left in one layer of the model,
   K (T x dk) and V (T x dv), T the prompt's tokens:

     a = softmax(q K^T / sqrt(dk))       T weights; q is a learned query
     o = (a V - mean) * inv_sd           dv features, normalised by constants
     h = relu(W1 o + b1)                 hidden
     p = softmax(W2 h + b2)              classes

   Two precisions: class c decodes the first round(c * length / (classes - 1))
   tokens at skip_high and the rest at skip_low (the static scheduler's
   candidate switch points, so class 0 is all low and the last class keeps
   skip_high for `length` tokens); the prediction is the most probable class
   (the lowest among equal ones). Training (appendix A.1.2) minimises the
   mean cross-entropy of labelled samples plus l2/2 |W1|^2 + l2/2 |W2|^2 with
   Adam over the whole set at every step; mean and inv_sd are set first from
   the samples' mean-pooled values (a uniform), and stay. The caller makes
   the samples: the label of a prompt is the fewest high-precision tokens
   whose quality meets the static criterion (mpq_model.h,
   mpq_llm_pmpd_sample). */
typedef struct mpq_pmpd_learned {
    int layer;                             /* the layer whose cache it reads (the caller's meaning) */
    int prefill_skip, skip_high, skip_low; /* 0 <= skip_high < skip_low < MPQ_MAX_BITS */
    long length;                           /* decoded tokens the switch points divide */
    int dk, dv, hidden, classes;           /* classes 2 .. MPQ_PMPD_MAX_CLASSES */
    float *q;                              /* dk: the learned query */
    float *w1, *b1;                        /* hidden x dv, hidden */
    float *w2, *b2;                        /* classes x hidden, classes */
    float *mean, *inv_sd;                  /* dv each: the input normalisation (not trained) */
    float *mem;                            /* the one allocation behind the arrays */
} mpq_pmpd_learned;
#define MPQ_PMPD_MAX_CLASSES 64

/* Allocates the arrays for these sizes (dk, dv, hidden 1 .. 65536) and
   initialises them: q = 0 (attention starts as the mean over positions),
   W1 and W2 uniform in +-sqrt(6 / fan_in) from seed, biases 0, mean 0,
   inv_sd 1. The schedule fields are zero: set them before use. */
MPQ_DEF mpq_status mpq_pmpd_learned_init(mpq_pmpd_learned *n, int dk, int dv, int hidden, int classes, uint64_t seed);
MPQ_DEF void mpq_pmpd_learned_free(mpq_pmpd_learned *n); /* the arrays; NULL is accepted */
/* Sizes, schedule fields, and that every array is finite (inv_sd > 0). */
MPQ_DEF mpq_status mpq_pmpd_learned_validate(const mpq_pmpd_learned *n);
/* The trainable parameters in the order of a gradient: q, W1, b1, W2, b2. */
MPQ_DEF long mpq_pmpd_learned_params(const mpq_pmpd_learned *n);

/* p (classes) for one prompt's K (T x dk) and V (T x dv), rows contiguous;
   T >= 1; non-finite K or V (or a logit that overflows) is
   MPQ_ERR_NONFINITE. */
MPQ_DEF mpq_status mpq_pmpd_learned_forward(const mpq_pmpd_learned *n, const float *K, const float *V, int T,
                                            double *p);
/* The schedule of class c. */
MPQ_DEF mpq_status mpq_pmpd_learned_class_schedule(const mpq_pmpd_learned *n, int c, mpq_pmpd_schedule *out);
/* The predicted class (*cls, may be NULL) and its schedule. */
MPQ_DEF mpq_status mpq_pmpd_learned_predict(const mpq_pmpd_learned *n, const float *K, const float *V, int T,
                                            mpq_pmpd_schedule *out, int *cls);

typedef struct mpq_pmpd_sample {
    const float *K, *V; /* T x dk, T x dv */
    int T;
    int label; /* 0 .. classes - 1 */
} mpq_pmpd_sample;

/* The training objective over ns samples and, when grad is not NULL, its
   gradient (mpq_pmpd_learned_params doubles, in that order). */
MPQ_DEF mpq_status mpq_pmpd_learned_loss(const mpq_pmpd_learned *n, const mpq_pmpd_sample *s, int ns, double l2,
                                         double *loss, double *grad);

typedef struct mpq_pmpd_train_opts {
    int steps; /* Adam steps over the whole set; 0 -> 500 */
    double lr; /* 0 -> 0.01 */
    double l2; /* 0 -> none; < 0 is an error */
} mpq_pmpd_train_opts;

/* Sets mean and inv_sd from the samples, then trains from n's parameters.
   *loss (may be NULL): the objective at the end. On an error n is
   unchanged. */
MPQ_DEF mpq_status mpq_pmpd_learned_train(mpq_pmpd_learned *n, const mpq_pmpd_sample *s, int ns,
                                          const mpq_pmpd_train_opts *o, double *loss);

/* ========================================================================== */
/* 13. Recipes                                                                */
/* ========================================================================== */

/* A RECIPE is how the linear maps of a model are quantized, in one
   zero-initialised description; mpq_recipe_run applies it to a list of
   maps. It composes the sections above in one fixed order:

     widths       uniform (`bits`), or a plan: given (`plan`), or made here
                  over all the maps at once by SFMP, MixLLM or MXSens from
                  their statistics, or from the KL divergence measured with
                  each map quantized (`planner`, section 11)
     1. act-order the packed column order by decreasing diag(H), GPTQ's
                  act-order (mpq_gptq_act_order): free at inference
     2. AWQ       column scales and clips searched on the map's
                  activations under its description (mpq_awq_search)
     3. GPTQ      error feedback through H (mpq_gptq), or round to nearest
                  (mpq_pack)
     4. ReQuant   a sparse part: outliers and significant weights chosen
                  over all the maps from their PQI (mpq_requant_masks); the
                  dense part quantizes W with them at zero (RTN or AWQ, not
                  GPTQ: MPQ_ERR_UNSUPPORTED)

   `mpq quantize`, the main job (examples/llm) and tinylm all call
   mpq_recipe_run: the same recipe on the same maps gives the same bytes,
   whoever runs it.

   Act-order and plans. A plan's widths are in the packed coordinates it
   describes, so with act-order they apply to act-order's columns: the
   SFMP planner therefore ranks each map's Fisher diagonal with its columns
   in act-order (MixLLM's widths are per row and need no change). A plan
   with a column permutation of its own (MXSens; SFMP reordering columns)
   cannot take act-order (MPQ_ERR_ARG). */
typedef enum mpq_planner {
    MPQ_PLANNER_NONE = 0,   /* the widths of `plan`, or uniform `bits` without one */
    MPQ_PLANNER_SFMP = 1,   /* mpq_plan_sfmp over the maps' fisher: bpw, group, block_rows, reorder */
    MPQ_PLANNER_MIXLLM = 2, /* mpq_plan_mixllm over their channel salience: fraction, high_bits,
                               bits (the low width), group */
    MPQ_PLANNER_MXSENS = 3, /* mpq_plan_mxsens over col_sens and layer_sens: bpw (MXINT) */
    MPQ_PLANNER_KLD = 4     /* mpq_plan_measured over their kld: bpw or max_kld, kld_widths, group,
                               block_rows, symmetric; fisher (may be NULL) ranks the block rows of the
                               map that mixes two widths */
} mpq_planner;

typedef struct mpq_recipe {
    /* the widths */
    mpq_planner planner;
    const mpq_plan *plan;  /* planner NONE: map i is the plan's layer i; NULL: uniform */
    int format;            /* uniform: MPQ_FORMAT_*; 0 -> bit-plane */
    int bits;              /* uniform, and MixLLM's low width: 1..8 (MXINT 2..8); 0 -> 4 */
    int symmetric;         /* uniform: 1 -> symmetric groups; 0 -> asymmetric */
    int group;             /* uniform, SFMP, MixLLM: columns per group; 0 -> 128 (MXINT 32) */
    int block_rows;        /* uniform, SFMP: rows per width block; 0 -> 16 */
    double bpw;            /* SFMP, MXSens, KLD: the budget, bits per weight with the
                              metadata (required but for KLD's max_kld; mpq_recipe_bpw_range
                              gives SFMP's and MXSens's range, mpq_plan_measured_range KLD's) */
    int reorder;           /* SFMP: MPQ_REORDER_*; 0 -> none */
    double fraction;       /* MixLLM: share of all channels at high_bits, in [0, 1] */
    int high_bits;         /* MixLLM: 0 -> 8 (symmetric) */
    const int *kld_widths; /* KLD: the widths each map's kld was measured at, distinct, 1..8 */
    int kld_nwidths;       /* KLD: 1..8 */
    double max_kld;        /* KLD: > 0 (bpw 0): the fewest bits whose predicted KLD is at most this */
    /* the quantizer chain */
    int act_order;           /* 1: GPTQ's act-order (needs H) */
    int awq;                 /* 1: AWQ's scale and clip search (needs X) */
    mpq_awq_desc awq_opts;   /* its settings; X and tokens are each map's */
    int gptq;                /* 1: GPTQ (needs H); 0: round to nearest */
    mpq_gptq_desc gptq_opts; /* its settings; H is each map's */
    int requant;             /* 1: ReQuant's sparse part (needs pqi) */
    double outliers;         /* ReQuant: share of all the maps' weights kept as
                                outliers (eq. 9); 0 -> 0.0025, negative: none */
    double significant;      /* ReQuant: share detached as significant weights;
                                0 -> 0.0025, negative: none */
    /* the basis */
    int rotate;           /* 1: every map gets the rotation V of its column count from
                             rotate_seed (maps with the same input share V), stored with
                             it; act-order, AWQ and GPTQ see W V^T, X V^T and V H V^T,
                             computed here from the maps' W, X and H (which stay in
                             original coordinates). The planners' salience (fisher,
                             channel, col_sens, layer_sens) and ReQuant's pqi must be
                             those of W V^T: they do not follow from the unrotated ones
                             and are gathered in the rotated basis (mpq_model.h's
                             calibration with the same seed). ReQuant's masks and sparse
                             parts are then in the coordinates of W V^T, and it holds
                             W V^T of every map besides W */
    uint64_t rotate_seed; /* the seed of mpq_rotation_init */
} mpq_recipe;

/* One linear map and what the recipe may read of it. The shape is
   required; the rest only where the recipe needs it (mpq_recipe_needs). */
typedef struct mpq_recipe_map {
    int rows, cols;
    const char *name;      /* for progress (may be NULL) */
    const float *W;        /* rows x cols float32, original coordinates */
    const float *X;        /* AWQ: tokens x cols activations, original column order */
    int tokens;            /* rows of X */
    const float *H;        /* act-order, GPTQ: cols x cols X^T X (as mpq_gptq_desc.H) */
    const float *pqi;      /* ReQuant: rows x cols PQI (finite, >= 0) */
    const float *fisher;   /* SFMP: rows x cols salience (finite, >= 0) */
    const float *channel;  /* MixLLM: rows output-channel salience (finite, >= 0) */
    const float *col_sens; /* MXSens: cols, diag(X^T X) (finite, >= 0) */
    float layer_sens;      /* MXSens: S_layer in [0, 1] */
    const double *kld;     /* KLD: the model's KL divergence with this map alone quantized at each of
                              r->kld_widths (mpq_model.h's mpq_llm_measure) */
} mpq_recipe_map;

/* What a recipe reads of a map, as flags: */
#define MPQ_RECIPE_WEIGHTS  1u  /* W */
#define MPQ_RECIPE_ACTS     2u  /* X and tokens (AWQ) */
#define MPQ_RECIPE_HESSIAN  4u  /* H (act-order, GPTQ) */
#define MPQ_RECIPE_PQI      8u  /* pqi (ReQuant) */
#define MPQ_RECIPE_SALIENCE 16u /* the planner's: fisher, channel, col_sens and layer_sens, or kld */
MPQ_DEF unsigned mpq_recipe_needs(const mpq_recipe *r);

/* How mpq_recipe_run reaches the maps' data and hands back the results,
   so that a caller can stream them from files (every member may be NULL):

     fetch     fill the fields `need` names in map i (shape and name stay);
               NULL: every map already holds what the recipe needs
     release   the run is done with what fetch filled for map i
     store     take map i's packed matrix (the callee owns it after an
               MPQ_OK return; on an error the run frees it); NULL: out[i]
     progress  step ("planning", "ReQuant", "quantizing"), maps done of
               total, the map's name

   Maps are visited in order in each pass: planning fetches each map's
   salience (with H for SFMP under act-order), keeps what the planner reads
   of it (SFMP: mpq_sfmp_reduce's block sums and permutations; MixLLM,
   MXSens: a copy of the channel or column salience) and releases it before
   the next fetch; ReQuant
   fetches and holds every map's weights, PQI and activations, then packs
   and stores them in order; otherwise each map is fetched, quantized,
   released and stored before the next. Every fetch is matched by one
   release, on errors too. */
typedef struct mpq_recipe_io {
    mpq_status (*fetch)(void *user, int i, unsigned need, mpq_recipe_map *map);
    void (*release)(void *user, int i, mpq_recipe_map *map);
    mpq_status (*store)(void *user, int i, mpq_packed *A);
    void (*progress)(void *user, const char *step, int done, int total, const char *name);
    void *user;
} mpq_recipe_io;

typedef struct mpq_recipe_result {
    double requant_t;      /* ReQuant: the eq. 9 temperature chosen */
    size_t sparse_weights; /* ReQuant: weights in the sparse parts */
    double bpw;            /* the planner's budget reached (0 without a planner) */
    double loss;           /* the KLD planner's predicted KLD (0 for the others) */
    int map;               /* on error: the map it concerns, -1 for none in particular */
    const char *step;      /* on error: "recipe" (its fields, the maps' shapes), "planning",
                              "act-order", "AWQ", "GPTQ", "pack", "ReQuant", "fetch" or
                              "store" */
} mpq_recipe_result;

/* Quantizes maps[0 .. n-1] as r says: out[i] receives map i's packed
   matrix (free each with mpq_packed_free) unless io->store takes it; io
   and res may be NULL. On an error nothing is written to out (matrices
   already stored stay with the callee), and res says where it happened.
   Errors: MPQ_ERR_ARG for a missing statistic or a combination the
   recipe cannot make, MPQ_ERR_UNSUPPORTED for ReQuant under GPTQ,
   MPQ_ERR_SIZE for a plan of other shapes, MPQ_ERR_RANGE for a budget
   the planner cannot meet, and those of the sections above. */
MPQ_DEF mpq_status mpq_recipe_run(const mpq_recipe *r, mpq_recipe_map *maps, int n, const mpq_recipe_io *io,
                                  mpq_packed *out, mpq_recipe_result *res);

/* The plan r->planner makes for these maps (mpq_recipe_run's first step),
   to inspect or keep; MPQ_ERR_ARG without a planner. */
MPQ_DEF mpq_status mpq_recipe_plan(const mpq_recipe *r, mpq_recipe_map *maps, int n, const mpq_recipe_io *io,
                                   mpq_plan *out);

/* The budgets r->planner can meet for maps of these shapes: [*lo, *hi]
   (SFMP: mpq_sfmp_bpw_range; MXSens: from mpq_mxsens_bpw_min to the
   budget of every column past each map's first block at 6 bits, beyond
   which the plan stays the same), and *worst (may be NULL), the map whose
   own lowest budget is the highest: the one to leave out when the budget
   is too low. Reads only the shapes; MPQ_ERR_ARG for other planners. */
MPQ_DEF mpq_status mpq_recipe_bpw_range(const mpq_recipe *r, const mpq_recipe_map *maps, int n, double *lo, double *hi,
                                        int *worst);

/* One map through the chain (steps 1 to 3) under the description of its
   index i (layer i of r->plan, or the uniform fields), with a sparse part
   for the weights where mask is 1 (mask may be NULL; not with GPTQ; under
   r->rotate in the coordinates of W V^T, as ReQuant's masks are).
   r->planner must be NONE and r->requant 0: their choices need every map. */
MPQ_DEF mpq_status mpq_recipe_quantize(const mpq_recipe *r, int i, const mpq_recipe_map *m, const uint8_t *mask,
                                       mpq_packed *out);

/* ========================================================================== */
/* 14. Rotations                                                              */
/* ========================================================================== */

/* The rotation V and its type, mpq_rotation: section 4 ("AN INCOHERENCE
   ROTATION"), beside the packed matrices that store one. */

/* V of size n from seed (mpq_rotation_free releases it). MPQ_ERR_SIZE
   when n < 1 or its odd part exceeds MPQ_ROTATION_MAX_ODD. */
MPQ_DEF mpq_status mpq_rotation_init(mpq_rotation *r, int n, uint64_t seed);
MPQ_DEF void mpq_rotation_free(mpq_rotation *r); /* NULL and zeroed are accepted */
/* x <- V x (transpose: x <- V^T x) for `count` vectors of n floats, one
   after another, in place; the arithmetic in float, in a fixed order (every
   product path applies V to its input this way). MPQ_ERR_NONFINITE for a
   NaN or infinite input (x unchanged). */
MPQ_DEF mpq_status mpq_rotation_apply(const mpq_rotation *r, float *x, int count, int transpose);
/* The same in float64 (the references). */
MPQ_DEF mpq_status mpq_rotation_apply_f64(const mpq_rotation *r, double *x, int count, int transpose);
/* H <- V H V^T for a symmetric n x n matrix (X^T X of inputs x becomes that
   of the inputs V x): the lower triangle is read, the whole matrix written,
   each row transformed in float64 and rounded once. MPQ_ERR_NONFINITE for a
   NaN or infinite entry (H unchanged). */
MPQ_DEF mpq_status mpq_rotation_conjugate(const mpq_rotation *r, float *H);
/* A rotation as stored (a packed matrix's, or one built elsewhere) is
   usable: n = p m >= 1 with p a power of two and m odd <= MPQ_ROTATION_MAX_ODD,
   sign and R present, no sign bit set past n, R finite and orthogonal
   (|R^T R - I| <= 1e-5 entry by entry, in float64). MPQ_ERR_ARG, else
   MPQ_ERR_FORMAT. */
MPQ_DEF mpq_status mpq_rotation_check(const mpq_rotation *r);

#ifdef __cplusplus
}
#endif
#endif /* MPQ_H_INCLUDED */

/* ========================================================================== */
/*                              IMPLEMENTATION                                */
/* ========================================================================== */
#if defined(MPQ_IMPLEMENTATION) && !defined(MPQ__IMPLEMENTED)
#define MPQ__IMPLEMENTED

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h> /* qsort, and the default allocator */
#include <string.h>

#if !defined(MPQ_MALLOC) && !defined(MPQ_FREE)
#define MPQ_MALLOC(sz) malloc(sz)
#define MPQ_FREE(p)    free(p)
#elif !defined(MPQ_MALLOC) || !defined(MPQ_FREE)
#error "mpq.h: define both MPQ_MALLOC and MPQ_FREE, or neither"
#endif
#ifndef MPQ_ASSERT
#include <assert.h>
#define MPQ_ASSERT(x) assert(x)
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

/* SIMD paths. With GCC or Clang on x86 every path is compiled whatever the
   -m flags, each kernel under a target attribute (MPQ__T_AVX2, MPQ__T_AVX512,
   MPQ__T_VNNI), and the CPU running the code is probed once (mpq__cpu) before
   a path is used. Other compilers (MSVC) compile a path when they target it
   (/arch:AVX2, /arch:AVX512) and use it unconditionally. */
#if !defined(MPQ_NO_SIMD) && (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MPQ__X86_DISPATCH 1
#define MPQ__HAVE_AVX2    1
#define MPQ__HAVE_AVX512  1
#define MPQ__HAVE_VNNI    1
#define MPQ__T_AVX2       __attribute__((target("avx2,fma,f16c")))
#define MPQ__T_AVX512     __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#define MPQ__T_VNNI       __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")))
#include <cpuid.h>
#else
#if !defined(MPQ_NO_SIMD) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MPQ__HAVE_AVX512 1
#endif
#if defined(MPQ__HAVE_AVX512) && defined(__AVX512VBMI__) && defined(__AVX512VNNI__)
#define MPQ__HAVE_VNNI 1
#endif
#if !defined(MPQ_NO_SIMD) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MPQ__HAVE_AVX2 1
#endif
#define MPQ__T_AVX2
#define MPQ__T_AVX512
#define MPQ__T_VNNI
#endif
#if !defined(MPQ_NO_F16C) && defined(__F16C__)
#define MPQ__HAVE_F16C 1
#endif
#if defined(MPQ__HAVE_AVX512) || defined(MPQ__HAVE_AVX2) || defined(MPQ__HAVE_F16C)
#include <immintrin.h>
#endif
/* AArch64 always has NEON (Advanced SIMD); its path needs no probe. */
#if !defined(MPQ_NO_SIMD) && defined(__aarch64__) && defined(__ARM_NEON)
#define MPQ__HAVE_NEON 1
#include <arm_neon.h>
#endif
/* g++ 12 reports maybe-uninitialized inside its own AVX-512 intrinsics (they
   start from an intentionally undefined register); it is not about mpq. */
#if defined(__cplusplus) && defined(__GNUC__) && !defined(__clang__) && defined(MPQ__HAVE_AVX512)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define MPQ__POP_DIAGNOSTIC 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MPQ__INLINE      static inline __attribute__((always_inline))
#define MPQ__NOINLINE    __attribute__((noinline))
#define MPQ__PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 3)
#else
#define MPQ__INLINE static inline
#define MPQ__NOINLINE
#define MPQ__PREFETCH(p) ((void)(p))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ========================================================================== */
/* 1. Basics                                                                  */
/* ========================================================================== */

MPQ_DEF const char *mpq_status_str(mpq_status st)
{
    switch (st) {
    case MPQ_OK: return "ok";
    case MPQ_ERR_ARG: return "invalid argument (NULL pointer or option out of range)";
    case MPQ_ERR_SIZE: return "invalid size (rows, cols, group, batch or buffer size)";
    case MPQ_ERR_NONFINITE: return "NaN or Inf in an input that must be finite";
    case MPQ_ERR_BITS: return "bit width outside 1..8";
    case MPQ_ERR_PERM: return "not a permutation (index out of range or repeated)";
    case MPQ_ERR_RANGE: return "value out of range (beyond fp16, a budget that cannot be met, or a bad parameter)";
    case MPQ_ERR_FORMAT: return "packed buffer is malformed or corrupted";
    case MPQ_ERR_ALIGN: return "buffer is not aligned as required";
    case MPQ_ERR_NOMEM: return "out of memory";
    case MPQ_ERR_UNSUPPORTED: return "not supported by this build";
    case MPQ_ERR_NODEVICE: return "no usable accelerator";
    case MPQ_ERR_DEVICE: return "accelerator runtime error";
    case MPQ_ERR_IO: return "file could not be opened, read or written";
    case MPQ_ERR_NOTPD: return "matrix is not positive definite (raise the dampening)";
    case MPQ_ERR_CANCELLED: return "stopped at the caller's request";
    }
    return "unknown status";
}

MPQ_DEF void *mpq_aligned_alloc(size_t bytes)
{
    const size_t extra = 64 + sizeof(void *);
    if (bytes == 0 || bytes > SIZE_MAX - extra) return NULL;
    unsigned char *raw = (unsigned char *)MPQ_MALLOC(bytes + extra);
    if (!raw) return NULL;
    uintptr_t p = ((uintptr_t)(raw + sizeof(void *)) + 63u) & ~(uintptr_t)63u;
    memcpy((unsigned char *)p - sizeof(void *), &raw, sizeof(void *));
    return (void *)p;
}

MPQ_DEF void mpq_aligned_free(void *p)
{
    if (!p) return;
    void *raw;
    memcpy(&raw, (unsigned char *)p - sizeof(void *), sizeof(void *));
    MPQ_FREE(raw);
}

/* mpq_parallel and the products' threads.

   THREADS ON A SHARED MACHINE. An OpenMP region ends when every thread of
   its team has arrived. When another process holds a core, a team thread
   may not run before the scheduler's next time slice (milliseconds, against
   tens of microseconds for a small product), the caller waits for it, and
   threads that spin while they wait take CPU time from the ones that work.
   So a call uses fewer threads than the cores other processes keep busy
   (Linux, GCC or Clang, with OpenMP): at most every MPQ__LOAD_PERIOD a call
   reads the time the machine's cores spent busy (/proc/stat) and the CPU
   time of this process (clock()), and from their growth since the last
   reading the cores that other processes kept busy; calls then use at most
   round(online cores - those) threads, and at least one. The reading is
   internal state of the process, shared by every caller through relaxed
   atomics. MPQ_NO_LOAD turns it off (the threads asked for, always). */

/* Threads for a call that may use nth, given free256 = (online cores -
   cores busy with other processes) x 256: that rounded, at least 1. */
MPQ__UNUSED static int mpq__load_team(int nth, long long free256)
{
    const long long f = (free256 + 128) / 256;
    return f < 1 ? 1 : f < nth ? (int)f : nth;
}

/* The busy time of all cores, in ticks, from /proc/stat's first line
   ("cpu  user nice system idle iowait irq softirq [steal ...]"): user +
   nice + system + irq + softirq + steal (time a hypervisor gave to others).
   -1 if the text does not start with such a line. */
MPQ__UNUSED static long long mpq__proc_stat_busy(const char *text)
{
    if (strncmp(text, "cpu ", 4) != 0) return -1;
    const char *p = text + 4;
    long long v[8] = {0};
    int k = 0;
    for (; k < 8; k++) {
        while (*p == ' ') p++;
        if (*p < '0' || *p > '9') break;
        for (v[k] = 0; *p >= '0' && *p <= '9'; p++) {
            if (v[k] > (LLONG_MAX / 64 - 9) / 10) return -1; /* far beyond any uptime */
            v[k] = v[k] * 10 + (*p - '0');
        }
    }
    if (k < 7 || (*p != ' ' && *p != '\n' && *p != '\0')) return -1;
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
}

#if defined(_OPENMP) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && !defined(MPQ_NO_LOAD)
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
#define MPQ__LOAD_PERIOD 100000  /* microseconds between readings of the machine's load */
static long long mpq__load_free; /* (online cores - cores busy with others) x 256; 0: no estimate yet */
static int mpq__load_lock;       /* a reading in progress */
static long long mpq__load_t;    /* last reading (0: none): omp_get_wtime() in microseconds, */
static long long mpq__load_sys;  /* busy ticks of all cores (/proc/stat), */
static long long mpq__load_own;  /* CPU microseconds of this process */

/* One reading (one thread at a time, under mpq__load_lock). */
static void mpq__load_read(long long now)
{
    char buf[256];
    const int fd = open("/proc/stat", O_RDONLY);
    if (fd < 0) return;
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    const long hz = sysconf(_SC_CLK_TCK), ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const clock_t c = clock();
    if (n <= 0 || hz <= 0 || ncpu <= 0 || c == (clock_t)-1) return;
    buf[n] = '\0';
    const long long ticks = mpq__proc_stat_busy(buf);
    if (ticks < 0) return;
    const long long own = (long long)((double)c * 1e6 / CLOCKS_PER_SEC);
    const long long t0 = __atomic_load_n(&mpq__load_t, __ATOMIC_RELAXED);
    if (now > t0 && t0 > 0) { /* microseconds of other processes' CPU time per microsecond */
        const double busy = (double)(ticks - mpq__load_sys) * 1e6 / (double)hz;
        const double others = (busy - (double)(own - mpq__load_own)) / (double)(now - t0);
        double free256 = 256.0 * ((double)ncpu - (others > 0 ? others : 0));
        __atomic_store_n(&mpq__load_free, free256 < 1 ? 1LL : (long long)free256, __ATOMIC_RELAXED);
    }
    mpq__load_sys = ticks, mpq__load_own = own;
    __atomic_store_n(&mpq__load_t, now, __ATOMIC_RELAXED);
}

/* The threads a call that may use nth gets. */
static int mpq__load_threads(int nth)
{
    const long long now = (long long)(omp_get_wtime() * 1e6);
    int unlocked = 0;
    if (now - __atomic_load_n(&mpq__load_t, __ATOMIC_RELAXED) >= MPQ__LOAD_PERIOD &&
        __atomic_compare_exchange_n(&mpq__load_lock, &unlocked, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        mpq__load_read(now);
        __atomic_store_n(&mpq__load_lock, 0, __ATOMIC_RELEASE);
    }
    const long long f = __atomic_load_n(&mpq__load_free, __ATOMIC_RELAXED);
    return f > 0 ? mpq__load_team(nth, f) : nth;
}
#else
static int mpq__load_threads(int nth) { return nth; }
#endif

static void mpq__run(int ntasks, int nth, mpq_task_fn fn, void *ctx)
{
    int n = mpq__load_threads(nth < ntasks ? nth : ntasks);
    n = n > 1 ? n : 1;
    (void)n;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n) if (n > 1)
#endif
    for (int t = 0; t < ntasks; t++) fn(ctx, t);
}

MPQ_DEF int mpq_threads(int threads)
{
#ifdef _OPENMP
    if (threads <= 0) threads = omp_get_max_threads();
    const int n = mpq__load_threads(threads);
    return n > 1 ? n : 1;
#else
    (void)threads;
    return 1;
#endif
}

MPQ_DEF mpq_status mpq_parallel(int ntasks, int threads, mpq_task_fn fn, void *ctx)
{
    if (ntasks < 0 || threads < 0 || !fn) return MPQ_ERR_ARG;
#ifdef _OPENMP
    if (threads == 0) threads = omp_get_max_threads();
#endif
    if (ntasks > 0) mpq__run(ntasks, threads, fn, ctx);
    return MPQ_OK;
}

static size_t mpq__align64(size_t x) { return (x + 63u) & ~(size_t)63u; }
static int mpq__finite(float f) { return f - f == 0.0f; }                    /* false for NaN and Inf */
static int mpq__half_finite(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; } /* fp16 bits */

/* MPQ_ERR_NONFINITE when any of v[0..n) is NaN or infinite. */
static mpq_status mpq__check_finite(const float *v, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (!mpq__finite(v[k])) return MPQ_ERR_NONFINITE;
    return MPQ_OK;
}

/* ========================================================================== */
/* 2. Half precision                                                          */
/* ========================================================================== */

MPQ_DEF uint16_t mpq_f32_to_f16_soft(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) /* Inf, or NaN made quiet with its top payload bits */
        return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u | ((ax >> 13) & 0x3FFu) : 0u));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to Inf */
    if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal half */
        if (ax <= 0x33000000u) return (uint16_t)sign;         /* <= 2^-25 rounds to zero */
        uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e, r = m >> shift, rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax >> 13) - (112u << 10), rem = ax & 0x1FFFu; /* rebias 127 -> 15 */
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;     /* may carry into the exponent */
    return (uint16_t)(sign | r);
}

MPQ_DEF float mpq_f16_to_f32_soft(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu, x;
    if (e == 0x1Fu)
        x = sign | 0x7F800000u | (m ? (m << 13) | 0x400000u : 0u);
    else if (e == 0) {
        if (m == 0)
            x = sign;
        else {
            uint32_t ee = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                ee--;
            }
            x = sign | (ee << 23) | ((m & 0x3FFu) << 13);
        }
    } else
        x = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

MPQ_DEF uint16_t mpq_f32_to_f16(float f)
{
#ifdef MPQ__HAVE_F16C
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    return mpq_f32_to_f16_soft(f);
#endif
}

MPQ_DEF float mpq_f16_to_f32(uint16_t h)
{
#ifdef MPQ__HAVE_F16C
    return _cvtsh_ss(h);
#else
    return mpq_f16_to_f32_soft(h);
#endif
}

MPQ_DEF void mpq_f32_to_f16_n(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
#ifdef MPQ__HAVE_F16C
    const size_t nv = n & ~(size_t)7;
    for (; i < nv; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) dst[i] = mpq_f32_to_f16(src[i]);
}

MPQ_DEF void mpq_f16_to_f32_n(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
#ifdef MPQ__HAVE_F16C
    const size_t nv = n & ~(size_t)7;
    for (; i < nv; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = mpq_f16_to_f32(src[i]);
}

/* ========================================================================== */
/* 3. Group quantization                                                      */
/* ========================================================================== */

#define MPQ__F16_MAX 65504.0f

/* Round to nearest, ties to even, whatever the FPU rounding mode. */
static float mpq__rne(float x)
{
    float r = floorf(x), d = x - r; /* exact for |x| < 2^23; larger x are integers */
    if (d > 0.5f || (d == 0.5f && fmodf(r, 2.0f) != 0.0f)) r += 1.0f;
    return r;
}

/* The quantizer proper; the caller has checked its arguments. */
static void mpq__quant_group(const float *v, int len, int bits, int symmetric, uint8_t *q, uint16_t *s_hat,
                             uint16_t *z_hat)
{
    const int qmax = (1 << bits) - 1;
    float mnl[16], mxl[16], aml[16]; /* 16 lanes of each, so that the loop vectorises */
    for (int l = 0; l < 16; l++) mnl[l] = mxl[l] = v[0], aml[l] = fabsf(v[0]);
    int k0 = 0;
    for (; k0 + 16 <= len; k0 += 16)
        for (int l = 0; l < 16; l++) {
            const float x = v[k0 + l], ax = fabsf(x);
            mnl[l] = x < mnl[l] ? x : mnl[l];
            mxl[l] = x > mxl[l] ? x : mxl[l];
            aml[l] = ax > aml[l] ? ax : aml[l];
        }
    for (; k0 < len; k0++) {
        mnl[0] = v[k0] < mnl[0] ? v[k0] : mnl[0];
        mxl[0] = v[k0] > mxl[0] ? v[k0] : mxl[0];
        aml[0] = fabsf(v[k0]) > aml[0] ? fabsf(v[k0]) : aml[0];
    }
    float mn = mnl[0], mx = mxl[0], amax = aml[0];
    for (int l = 1; l < 16; l++) {
        mn = mnl[l] < mn ? mnl[l] : mn;
        mx = mxl[l] > mx ? mxl[l] : mx;
        amax = aml[l] > amax ? aml[l] : amax;
    }
    float s = symmetric ? 2.0f * amax / (float)qmax : (mx - mn) / (float)qmax;
    uint16_t hs = mpq_f32_to_f16(0.5f * s);
    float sh = mpq_f16_to_f32(hs);
    if (mn == mx || sh == 0.0f) { /* constant group, or a step below fp16 resolution */
        *s_hat = 0;
        *z_hat = mpq_f32_to_f16(0.5f * mn + 0.5f * mx);
        memset(q, 0, (size_t)len);
        return;
    }
    uint16_t hz;
    if (symmetric)
        hz = (uint16_t)(hs | 0x8000u); /* z^ = s((2^b-1)/2 - 2^(b-1)) = -s/2 = -s^ */
    else {
        float z = mpq__rne(-mn / s);
        z = z < 0.0f ? 0.0f : (z > (float)qmax ? (float)qmax : z);
        hz = mpq_f32_to_f16(s * (0.5f * (float)qmax - z));
    }
    const float zh = mpq_f16_to_f32(hz), step = 2.0f * sh, mid = 0.5f * (float)qmax;
    /* codes against the stored pair: mpq__rne after the clamp (the same
       result), with the parity of a small integer, 16 at a time into a local
       array (q may alias v), so that it vectorises */
    for (int k0 = 0; k0 < len; k0 += 16) {
        const int nk = len - k0 < 16 ? len - k0 : 16;
        float x[16];
        uint8_t c[16];
        memcpy(x, v + k0, sizeof(float) * (size_t)nk);
        for (int l = nk; l < 16; l++) x[l] = zh;
        for (int l = 0; l < 16; l++) {
            float t = (x[l] - zh) / step + mid;
            t = t < 0.0f ? 0.0f : t;
            t = t > (float)qmax ? (float)qmax : t;
            const float r = floorf(t), f = t - r;
            const int ri = (int)r;
            c[l] = (uint8_t)(ri + ((f > 0.5f) | ((f == 0.5f) & ri & 1)));
        }
        memcpy(q + k0, c, (size_t)nk);
    }
    *s_hat = hs;
    *z_hat = hz;
}

static mpq_status mpq__check_values(const float *v, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (!mpq__finite(v[k])) return MPQ_ERR_NONFINITE;
        if (fabsf(v[k]) > MPQ__F16_MAX) return MPQ_ERR_RANGE;
    }
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_quantize_group(const float *v, int len, int bits, int symmetric, uint8_t *q, uint16_t *s_hat,
                                      uint16_t *z_hat)
{
    if (!v || !q || !s_hat || !z_hat) return MPQ_ERR_ARG;
    if (len < 1) return MPQ_ERR_SIZE;
    if (bits < 1 || bits > MPQ_MAX_BITS) return MPQ_ERR_BITS;
    mpq_status st = mpq__check_values(v, (size_t)len);
    if (st != MPQ_OK) return st;
    mpq__quant_group(v, len, bits, symmetric, q, s_hat, z_hat);
    return MPQ_OK;
}

/* 8-bit activations: the fp16 scale of a group (saturating at 65504; the
   public function refuses that case first) and one code. */
static uint16_t mpq__act8_scale(float amax)
{
    const uint16_t h = mpq_f32_to_f16(amax / 127.0f);
    return mpq__half_finite(h) ? h : (uint16_t)0x7BFFu;
}

static float mpq__act8_code(float x, float sh)
{
    const float r = sh > 0.0f ? mpq__rne(x / sh) : 0.0f;
    return r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
}

MPQ_DEF mpq_status mpq_quantize_act8(const float *x, int n, int group, int8_t *q, uint16_t *scale)
{
    if (!x || !q || !scale) return MPQ_ERR_ARG;
    if (n < 1 || group < 1) return MPQ_ERR_SIZE;
    /* everything checked before anything is written */
    for (int g0 = 0; g0 < n; g0 += group) {
        const int len = n - g0 < group ? n - g0 : group;
        float amax = 0.0f;
        for (int k = 0; k < len; k++) {
            if (!mpq__finite(x[g0 + k])) return MPQ_ERR_NONFINITE;
            amax = fabsf(x[g0 + k]) > amax ? fabsf(x[g0 + k]) : amax;
        }
        if (!mpq__half_finite(mpq_f32_to_f16(amax / 127.0f))) return MPQ_ERR_RANGE;
        if (n - g0 <= group) break; /* g0 + group would overflow for the largest n */
    }
    for (int g0 = 0, g = 0;; g0 += group, g++) {
        const int len = n - g0 < group ? n - g0 : group;
        float amax = 0.0f;
        for (int k = 0; k < len; k++) amax = fabsf(x[g0 + k]) > amax ? fabsf(x[g0 + k]) : amax;
        const uint16_t hs = mpq__act8_scale(amax);
        const float sh = mpq_f16_to_f32(hs);
        scale[g] = hs;
        for (int k = 0; k < len; k++) q[g0 + k] = (int8_t)mpq__act8_code(x[g0 + k], sh);
        if (n - g0 <= group) break;
    }
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_dequantize_act8(const int8_t *q, const uint16_t *scale, int n, int group, float *x)
{
    if (!q || !scale || !x) return MPQ_ERR_ARG;
    if (n < 1 || group < 1) return MPQ_ERR_SIZE;
    const int ng = (n - 1) / group + 1;
    for (int g = 0; g < ng; g++)
        if (!mpq__half_finite(scale[g])) return MPQ_ERR_NONFINITE;
    for (int k = 0; k < n; k++) x[k] = (float)q[k] * mpq_f16_to_f32(scale[k / group]);
    return MPQ_OK;
}

/* sum_{i>=skip} 2^i sigma_i = 2 (q with the low `skip` bits cleared) - (2^b - 2^skip) */
static int mpq__mirror_sum(unsigned q, int bits, int skip)
{
    return 2 * (int)(q & ~((1u << skip) - 1u)) - ((1 << bits) - (1 << skip));
}

MPQ_DEF float mpq_dequant_value(uint8_t q, int bits, int skip, float s_hat, float z_hat)
{
    if (bits < 1) bits = 1;
    if (bits > MPQ_MAX_BITS) bits = MPQ_MAX_BITS;
    skip = mpq_first_plane(bits, skip);
    return s_hat * (float)mpq__mirror_sum(q & ((1u << bits) - 1u), bits, skip) + z_hat;
}

/* One MXINT block (rules in section 4): signed mantissas and the E8M0 byte. */
static void mpq__mx_quant_block(const float *v, int len, int k, int8_t *mant, uint8_t *e8m0)
{
    float amax = 0.0f;
    for (int i = 0; i < len; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
    int X = -127;
    if (amax > 0.0f) {
        int e;
        frexpf(amax, &e); /* amax = m 2^e, m in [0.5, 1): floor(log2 amax) = e - 1 */
        X = e - 1 < -127 ? -127 : e - 1;
    }
    const int pmax = (1 << (k - 1)) - 1, pmin = -(1 << (k - 1));
    for (int i = 0; i < len; i++) {
        /* v / 2^X * 2^(k-2): two exact power-of-two scalings, split so that
           neither over- nor underflows */
        float t = mpq__rne(ldexpf(ldexpf(v[i], -X / 2), -(X - X / 2) + k - 2));
        t = t > (float)pmax ? (float)pmax : (t < (float)pmin ? (float)pmin : t);
        mant[i] = (int8_t)t;
    }
    *e8m0 = (uint8_t)(X + 127);
}

MPQ_DEF mpq_status mpq_mxint_quantize_block(const float *v, int len, int bits, int8_t *mant, uint8_t *e8m0)
{
    if (!v || !mant || !e8m0) return MPQ_ERR_ARG;
    if (len < 1 || len > MPQ_MX_BLOCK) return MPQ_ERR_SIZE;
    if (bits < 2 || bits > MPQ_MAX_BITS) return MPQ_ERR_BITS;
    for (int i = 0; i < len; i++)
        if (!mpq__finite(v[i])) return MPQ_ERR_NONFINITE;
    mpq__mx_quant_block(v, len, bits, mant, e8m0);
    return MPQ_OK;
}

MPQ_DEF double mpq_mxint_value(int mant, int bits, uint8_t e8m0)
{
    return ldexp((double)mant, (int)e8m0 - 127 - (bits - 2));
}

/* s^ = 2^e as a float: exact for normal results, ldexpf below. */
static float mpq__exp2i(int e)
{
    if (e < -126 || e > 127) return ldexpf(1.0f, e);
    uint32_t u = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- The formats' rules: their rows of the traits table (section 6) ---- */

static void mpq__bp_quantize_group(const float *v, int len, int bits, int symmetric, uint8_t *q, uint16_t *sh,
                                   uint16_t *zh)
{
    mpq__quant_group(v, len, bits, symmetric, q, sh, zh);
}

static void mpq__mx_quantize_group(const float *v, int len, int bits, int symmetric, uint8_t *q, uint16_t *sh,
                                   uint16_t *zh)
{
    (void)symmetric;
    int8_t mant[MPQ_MX_BLOCK];
    uint8_t e;
    mpq__mx_quant_block(v, len, bits, mant, &e);
    for (int k = 0; k < len; k++) q[k] = (uint8_t)(mant[k] + (1 << (bits - 1)));
    *sh = e;
    *zh = 0;
}

static void mpq__bp_pair(int bits, uint16_t sh, uint16_t zh, float *s_hat, float *z_hat)
{
    (void)bits;
    *s_hat = mpq_f16_to_f32(sh);
    *z_hat = mpq_f16_to_f32(zh);
}

/* MXINT: P 2^(X-b+2) = s^ (2q - (2^b - 1)) + z^ with q = P + 2^(b-1),
   s^ = 2^(X-b+1), z^ = -s^ (every step exact: powers of two times small
   integers, the smallest 2^-134 a float subnormal). */
static void mpq__mx_pair(int bits, uint16_t sh, uint16_t zh, float *s_hat, float *z_hat)
{
    (void)zh;
    *s_hat = bits ? mpq__exp2i((int)sh - 127 - bits + 1) : 0.0f;
    *z_hat = -*s_hat;
}

static uint8_t mpq__bp_code_of(int bits, uint16_t sh, float s_hat, float z_hat, float v, float *value)
{
    (void)sh;
    const int qmax = (1 << bits) - 1;
    if (s_hat == 0.0f) { /* a constant group: every code 0, the value z^ */
        *value = z_hat;
        return 0;
    }
    float t = mpq__rne((v - z_hat) / (2.0f * s_hat) + 0.5f * (float)qmax);
    t = t < 0.0f ? 0.0f : (t > (float)qmax ? (float)qmax : t);
    *value = s_hat * (float)mpq__mirror_sum((unsigned)t, bits, 0) + z_hat;
    return (uint8_t)t;
}

static uint8_t mpq__mx_code_of(int bits, uint16_t sh, float s_hat, float z_hat, float v, float *value)
{
    (void)s_hat, (void)z_hat;
    const int X = (int)sh - 127, pmax = (1 << (bits - 1)) - 1, pmin = -(1 << (bits - 1));
    float t = mpq__rne(ldexpf(ldexpf(v, -X / 2), -(X - X / 2) + bits - 2));
    t = t > (float)pmax ? (float)pmax : (t < (float)pmin ? (float)pmin : t);
    *value = ldexpf(t, X - bits + 2);
    return (uint8_t)((int)t + (1 << (bits - 1)));
}

static int mpq__bp_meta_valid(uint16_t sh, uint16_t zh) { return mpq__half_finite(sh) && mpq__half_finite(zh); }
static int mpq__mx_meta_valid(uint16_t sh, uint16_t zh) { return sh < 0xFFu && zh == 0; }

static void mpq__bp_meta_write(uint8_t *rec, int r, uint16_t sh, uint16_t zh)
{
    memcpy(rec + 2 * r, &sh, 2);
    memcpy(rec + 32 + 2 * r, &zh, 2);
}

static void mpq__mx_meta_write(uint8_t *rec, int r, uint16_t sh, uint16_t zh)
{
    (void)zh;
    rec[r] = (uint8_t)sh;
}

static void mpq__bp_meta_read(const uint8_t *rec, int r, uint16_t *sh, uint16_t *zh)
{
    memcpy(sh, rec + 2 * r, 2);
    memcpy(zh, rec + 32 + 2 * r, 2);
}

static void mpq__mx_meta_read(const uint8_t *rec, int r, uint16_t *sh, uint16_t *zh)
{
    *sh = rec[r];
    *zh = 0;
}

/* One group of a packed row in the format f, after clamping to +-clip
   (clip > 0); tmp holds len floats. */
static void mpq__quant_any(const mpq_format_traits *f, int b, int symmetric, const float *v, int len, float clip,
                           float *tmp, uint8_t *q, uint16_t *sh, uint16_t *zh)
{
    if (clip > 0.0f) {
        for (int k = 0; k < len; k++) tmp[k] = v[k] > clip ? clip : (v[k] < -clip ? -clip : v[k]);
        v = tmp;
    }
    f->quantize_group(v, len, b, symmetric, q, sh, zh);
}

/* A bit-plane shape with its defaults resolved. */
typedef struct mpq__shape {
    const mpq_format_traits *f; /* the format's row of the traits table */
    int format, meta;           /* MPQ_FORMAT_*, metadata bytes at the start of a record */
    int rows, cols, group, block_rows, ngroups, nbrows, band_rows, nbands, ntiles, ubits;
    unsigned symmetric;
    const uint8_t *bits; /* NULL: uniform */
    uint64_t sp_nnz;     /* entries of the sparse part (flag MPQ__FLAG_SPARSE) */
    int rot_m;           /* the rotation's odd factor m (flag MPQ__FLAG_ROT); 0: none */
} mpq__shape;

static int mpq__bits_at(const mpq__shape *s, int i, int g)
{
    if (i >= s->rows) return 0;
    return s->bits ? s->bits[(size_t)(i / s->block_rows) * (size_t)s->ngroups + (size_t)g] : s->ubits;
}

static int mpq__group_cols(const mpq__shape *s, int g)
{
    int w = s->cols - g * s->group;
    return w < s->group ? w : s->group;
}

static mpq_status mpq__shape_fill(mpq__shape *s, int format, int rows, int cols, int group, int block_rows)
{
    memset(s, 0, sizeof *s);
    if (!(s->f = mpq_format_get((mpq_format)format))) return MPQ_ERR_ARG;
    s->format = format;
    s->meta = s->f->meta_bytes;
    if (rows < 1 || cols < 1 || group < 8 || group % 8 || block_rows < 1) return MPQ_ERR_SIZE;
    if (s->f->fixed_group && group != s->f->fixed_group) return MPQ_ERR_SIZE;
    s->rows = rows;
    s->cols = cols;
    s->group = group;
    s->block_rows = block_rows;
    s->ngroups = (int)(((int64_t)cols + group - 1) / group);
    s->nbrows = (int)(((int64_t)rows + block_rows - 1) / block_rows);
    s->ntiles = (int)(((int64_t)rows + MPQ_TILE_ROWS - 1) / MPQ_TILE_ROWS);
    s->band_rows = block_rows % MPQ_TILE_ROWS == 0 ? block_rows : MPQ_TILE_ROWS;
    s->nbands = (int)(((int64_t)rows + s->band_rows - 1) / s->band_rows);
    return MPQ_OK;
}

static mpq_status mpq__shape_from_desc(const mpq_bitplane_desc *d, mpq__shape *s)
{
    if (!d) return MPQ_ERR_ARG;
    const mpq_format_traits *f = mpq_format_get((mpq_format)(d->format ? d->format : MPQ_FORMAT_BITPLANE));
    if (!f) return MPQ_ERR_ARG;
    mpq_status st = mpq__shape_fill(s, f->format, d->rows, d->cols, d->group ? d->group : f->default_group,
                                    d->block_rows ? d->block_rows : 16);
    if (st != MPQ_OK) return st;
    s->ubits = d->uniform_bits ? d->uniform_bits : 4;
    s->symmetric = f->symmetric ? d->symmetric : 0u;
    s->bits = d->bits;
    if (d->sparse) {
        if (d->sparse->rows != d->rows || d->sparse->cols != d->cols) return MPQ_ERR_SIZE;
        if ((uint64_t)d->sparse->nnz > 0xFFFFFFFFu) return MPQ_ERR_SIZE;
        if (!d->sparse->row_ptr || (d->sparse->nnz && (!d->sparse->col || !d->sparse->val))) return MPQ_ERR_ARG;
        s->sp_nnz = (uint64_t)d->sparse->nnz;
    }
    if (d->rotation) {
        if (mpq_rotation_check(d->rotation) != MPQ_OK) return MPQ_ERR_ARG;
        if (d->rotation->n != d->cols) return MPQ_ERR_SIZE;
        s->rot_m = d->rotation->m;
    }
    const int bmin = f->min_bits;
    if (d->bits) {
        size_t nb = (size_t)s->nbrows * (size_t)s->ngroups;
        for (size_t k = 0; k < nb; k++)
            if (d->bits[k] < bmin || d->bits[k] > MPQ_MAX_BITS) return MPQ_ERR_BITS;
    } else if (s->ubits < bmin || s->ubits > MPQ_MAX_BITS)
        return MPQ_ERR_BITS;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_quantize(const mpq_bitplane_desc *d, const float *W, uint8_t *codes, uint16_t *s_hat,
                                uint16_t *z_hat)
{
    mpq__shape s;
    mpq_status st = mpq__shape_from_desc(d, &s);
    if (st != MPQ_OK) return st;
    if (!W || !codes || !s_hat || !z_hat) return MPQ_ERR_ARG;
    for (size_t k = 0; k < (size_t)s.rows * (size_t)s.cols; k++) {
        if (!mpq__finite(W[k])) return MPQ_ERR_NONFINITE;
        if (fabsf(W[k]) > s.f->max_abs) return MPQ_ERR_RANGE;
    }
    for (int i = 0; i < s.rows; i++)
        for (int g = 0; g < s.ngroups; g++) {
            int b = mpq__bits_at(&s, i, g);
            size_t o = (size_t)i * (size_t)s.cols + (size_t)g * (size_t)s.group;
            size_t p = (size_t)i * (size_t)s.ngroups + (size_t)g;
            s.f->quantize_group(W + o, mpq__group_cols(&s, g), b, (int)((s.symmetric >> b) & 1u), codes + o, s_hat + p,
                                z_hat + p);
        }
    return MPQ_OK;
}

/* Codes that fit their block's width, metadata the format can store. */
static mpq_status mpq__check_quantized(const mpq__shape *s, const uint8_t *codes, const uint16_t *s_hat,
                                       const uint16_t *z_hat)
{
    const size_t np = (size_t)s->rows * (size_t)s->ngroups;
    for (size_t p = 0; p < np; p++)
        if (!s->f->meta_valid(s_hat[p], z_hat[p])) return MPQ_ERR_NONFINITE;
    for (int i = 0; i < s->rows; i++)
        for (int j = 0; j < s->cols; j++)
            if (codes[(size_t)i * (size_t)s->cols + (size_t)j] >> mpq__bits_at(s, i, j / s->group)) return MPQ_ERR_BITS;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_dequantize(const mpq_bitplane_desc *d, const uint8_t *codes, const uint16_t *s_hat,
                                  const uint16_t *z_hat, float *W)
{
    mpq__shape s;
    mpq_status st = mpq__shape_from_desc(d, &s);
    if (st != MPQ_OK) return st;
    if (!W || !codes || !s_hat || !z_hat) return MPQ_ERR_ARG;
    if ((st = mpq__check_quantized(&s, codes, s_hat, z_hat)) != MPQ_OK) return st;
    for (int i = 0; i < s.rows; i++)
        for (int j = 0; j < s.cols; j++) {
            int g = j / s.group, b = mpq__bits_at(&s, i, g);
            size_t p = (size_t)i * (size_t)s.ngroups + (size_t)g, o = (size_t)i * (size_t)s.cols + (size_t)j;
            float sh, zh;
            s.f->pair(b, s_hat[p], z_hat[p], &sh, &zh);
            W[o] = mpq_dequant_value(codes[o], b, 0, sh, zh);
        }
    return MPQ_OK;
}

/* ========================================================================== */
/* 4. Bit-plane matrices                                                      */
/* ========================================================================== */

/* ---- 4.1 Header, layout, and the walk over a tile's records ---- */

#ifdef __cplusplus
#define MPQ__STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define MPQ__STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

#define MPQ__BP_VERSION     1u /* without a rotation: the layout of mpq 0.1.0, unchanged */
#define MPQ__BP_VERSION_ROT 2u /* with one (flag 16) */
#define MPQ__FLAG_PROW      1u
#define MPQ__FLAG_PCOL      2u
#define MPQ__FLAG_CSCALE    4u
#define MPQ__FLAG_SPARSE    8u
#define MPQ__FLAG_ROT       16u
#define MPQ__FLAGS_ALL      31u
#define MPQ__ROT_KIND       1u /* the one transform kind: V = (H_p / sqrt(p) (x) R_m) diag(s) on the input side */

/* The header at the start of every packed bit-plane buffer (little-endian). */
typedef struct mpq__bp_header {
    char magic[8]; /* "MPQBITP\0" */
    uint32_t version, format;
    uint32_t rows, cols, group, block_rows;
    uint32_t tile_rows, band_rows, flags, rot_m; /* rot_m: the rotation's m (version 2), else 0 */
    uint64_t total_bytes, off_bits, off_prow, off_pcol, off_cscale, off_index, off_data, data_bytes;
    uint64_t off_sparse, sparse_nnz; /* both 0 without flag 8 */
} mpq__bp_header;
MPQ__STATIC_ASSERT(sizeof(mpq__bp_header) == 128, "bit-plane header must be 128 bytes");
MPQ__STATIC_ASSERT(sizeof(float) == 4 && sizeof(uint64_t) == 8, "float32 and uint64 expected");

/* The start of the rotation section (version 2, flag 16). */
typedef struct mpq__rot_header {
    uint32_t kind, n, p, m; /* MPQ__ROT_KIND; n = cols = p m */
    uint64_t seed;          /* what mpq_rotation_init made it from (a record: the stored s and R are used) */
    uint64_t zero[5];
} mpq__rot_header;
MPQ__STATIC_ASSERT(sizeof(mpq__rot_header) == 64, "rotation header must be 64 bytes");

typedef struct mpq__layout {
    uint64_t off_bits, off_prow, off_pcol, off_cscale, off_rot, off_index, off_data, data_bytes, off_sparse, total;
} mpq__layout;

/* Bytes of the rotation section: its header, R (m x m float32), the n sign bits. */
static uint64_t mpq__rot_bytes(int n, int m)
{
    return sizeof(mpq__rot_header) + 4u * (uint64_t)m * (uint64_t)m + ((uint64_t)n + 7u) / 8u;
}

/* x <- V x (transpose: V^T x) for one vector, tmp of m floats (section 14). */
static void mpq__rot_run(const mpq_rotation *r, float *X, float *tmp, int transpose);

/* Bytes of one sparse column index: uint16 while every index fits. */
static uint64_t mpq__sp_colbytes(int cols) { return cols <= 65536 ? 2u : 4u; }

/* Stored bytes of a sparse part: row pointers, column indices, fp16 values. */
static uint64_t mpq__sparse_size(int rows, int cols, uint64_t nnz)
{
    return 4u * ((uint64_t)rows + 1u) + (mpq__sp_colbytes(cols) + 2u) * nnz;
}

static uint64_t mpq__sp_bytes(const mpq__shape *s) { return mpq__sparse_size(s->rows, s->cols, s->sp_nnz); }

static int mpq__nch(const mpq__shape *s, int g) { return (mpq__group_cols(s, g) + 7) / 8; }

/* Planes stored in the record of tile t, group g: the largest width of its rows. */
static int mpq__tile_planes(const mpq__shape *s, int t, int g)
{
    if (!s->bits) return s->ubits;
    int r0 = t * MPQ_TILE_ROWS, r1 = r0 + MPQ_TILE_ROWS < s->rows ? r0 + MPQ_TILE_ROWS : s->rows;
    int b = 0;
    for (int br = r0 / s->block_rows; br <= (r1 - 1) / s->block_rows; br++) {
        int w = s->bits[(size_t)br * (size_t)s->ngroups + (size_t)g];
        b = w > b ? w : b;
    }
    return b;
}

/* Bytes of a record of group g with that many planes: metadata, planes. */
static uint64_t mpq__rec_size(const mpq__shape *s, int planes, int g)
{
    return (uint64_t)s->meta + (uint64_t)planes * (uint64_t)mpq__nch(s, g) * 16u;
}

static uint64_t mpq__rec_bytes(const mpq__shape *s, int t, int g)
{
    return mpq__rec_size(s, mpq__tile_planes(s, t, g), g);
}

/* Byte offset, inside one plane, of chunk c of row r (see BYTE LAYOUT). */
static size_t mpq__slab_off(int c, int r, int nch)
{
    int q4 = nch & ~3;
    if (c < q4) return (size_t)(c >> 2) * 64u + (size_t)r * 4u + (size_t)(c & 3);
    size_t off = (size_t)q4 * 16u;
    c -= q4;
    if (nch & 2) {
        if (c < 2) return off + (size_t)r * 2u + (size_t)c;
        off += 32u;
    }
    return off + (size_t)r;
}

static void mpq__band_tiles(const mpq__shape *s, int band, int *t0, int *nt)
{
    int per = s->band_rows / MPQ_TILE_ROWS;
    *t0 = band * per;
    *nt = *t0 + per < s->ntiles ? per : s->ntiles - *t0;
}

/* Offsets of every section. The band index (nbands + 1 entries) is written
   to fill when given, and compared with expect when given: the result is 0
   when expect differs from the index the bits map implies, else 1. */
static int mpq__layout_compute(const mpq__shape *s, unsigned flags, mpq__layout *L, uint64_t *fill,
                               const uint64_t *expect)
{
    uint64_t off = sizeof(mpq__bp_header);
    L->off_bits = off;
    off = mpq__align64(off + (uint64_t)s->nbrows * (uint64_t)s->ngroups);
    L->off_prow = (flags & MPQ__FLAG_PROW) ? off : 0;
    if (flags & MPQ__FLAG_PROW) off = mpq__align64(off + 4u * (uint64_t)s->rows);
    L->off_pcol = (flags & MPQ__FLAG_PCOL) ? off : 0;
    if (flags & MPQ__FLAG_PCOL) off = mpq__align64(off + 4u * (uint64_t)s->cols);
    L->off_cscale = (flags & MPQ__FLAG_CSCALE) ? off : 0;
    if (flags & MPQ__FLAG_CSCALE) off = mpq__align64(off + 4u * (uint64_t)s->cols);
    L->off_rot = (flags & MPQ__FLAG_ROT) ? off : 0;
    if (flags & MPQ__FLAG_ROT) off = mpq__align64(off + mpq__rot_bytes(s->cols, s->rot_m));
    L->off_index = off;
    off = mpq__align64(off + 8u * ((uint64_t)s->nbands + 1u));
    L->off_data = off;
    uint64_t pos = 0;
    int same = 1;
    for (int b = 0; b <= s->nbands; b++) {
        if (fill) fill[b] = pos;
        if (expect && expect[b] != pos) same = 0;
        if (b == s->nbands) break;
        int t0, nt;
        mpq__band_tiles(s, b, &t0, &nt);
        for (int g = 0; g < s->ngroups; g++)
            for (int t = t0; t < t0 + nt; t++) pos += mpq__rec_bytes(s, t, g);
    }
    L->data_bytes = pos;
    L->total = L->off_data + pos;
    L->off_sparse = 0;
    if (flags & MPQ__FLAG_SPARSE) {
        L->off_sparse = mpq__align64(L->total);
        L->total = L->off_sparse + mpq__sp_bytes(s);
    }
    return same;
}

/* Walks the records of one tile in group order. Section g of a band holds
   the band's records of group g, one per tile; in a band of several tiles
   they all have the same size, so the tile's record is at section start +
   (its index in the band) * size. With lookahead > 0, a second walker that
   many records ahead prefetches. */
typedef struct mpq__walk {
    const mpq__shape *s;
    const uint8_t *data;
    const uint8_t *brow; /* the tile's block row of the bits map, when uniform */
    int t, nt, g, pf_g, uniform;
    int skip; /* planes a product skips (prefetches leave them out); 0 after init */
    uint64_t tl, sec, pf_sec;
} mpq__walk;

static void mpq__walk_init(mpq__walk *w, const mpq__shape *s, const uint64_t *index, const uint8_t *data, int t)
{
    const int band = t * MPQ_TILE_ROWS / s->band_rows;
    int t0;
    mpq__band_tiles(s, band, &t0, &w->nt);
    w->s = s;
    w->data = data;
    w->t = t;
    w->g = w->pf_g = 0;
    w->skip = 0;
    w->tl = (uint64_t)(t - t0);
    w->sec = w->pf_sec = index[band];
    /* with block_rows a multiple of 16 every tile lies in one block row */
    w->uniform = s->bits && s->block_rows % MPQ_TILE_ROWS == 0;
    w->brow = s->bits ? s->bits + (size_t)(t * MPQ_TILE_ROWS / s->block_rows) * (size_t)s->ngroups : NULL;
}

static int mpq__walk_planes(const mpq__walk *w, int g)
{
    return w->uniform ? w->brow[g] : mpq__tile_planes(w->s, w->t, g);
}

/* Prefetches what a product reads of record p (group g, B planes): its
   metadata and the planes from the first one read after w->skip on (every
   plane when the tile's rows differ in width), so that the product does
   not ask for the planes PMPD skips (the CPU's own stream prefetcher may
   still bring them in: bench/results/NOTES.md, "Whole models on the CPU"). */
MPQ__INLINE void mpq__walk_prefetch(const mpq__walk *w, const uint8_t *p, int g, int B)
{
    const mpq__shape *s = w->s;
    const uint64_t rb = mpq__rec_size(s, B, g);
    uint64_t from = (uint64_t)s->meta;
    if (w->skip && w->uniform) from += (uint64_t)mpq_first_plane(B, w->skip) * (uint64_t)mpq__nch(s, g) * 16u;
    for (uint64_t o = 0; o < (uint64_t)s->meta; o += 64) MPQ__PREFETCH(p + o);
    for (uint64_t o = from; o < rb; o += 64) MPQ__PREFETCH(p + o);
}

/* The record of group w->g; moves to the next group. */
static const uint8_t *mpq__walk_next(mpq__walk *w, int lookahead)
{
    for (; lookahead && w->pf_g < w->s->ngroups && w->pf_g <= w->g + lookahead; w->pf_g++) {
        const int B = mpq__walk_planes(w, w->pf_g);
        const uint64_t rb = mpq__rec_size(w->s, B, w->pf_g);
        mpq__walk_prefetch(w, w->data + w->pf_sec + w->tl * rb, w->pf_g, B);
        w->pf_sec += (uint64_t)w->nt * rb;
    }
    const uint64_t rb = mpq__rec_size(w->s, mpq__walk_planes(w, w->g), w->g);
    const uint8_t *p = w->data + w->sec + w->tl * rb;
    w->sec += (uint64_t)w->nt * rb;
    w->g++;
    return p;
}

/* Prefetches the first n records of tile t (a tile this thread takes next),
   so that its streams do not start cold. */
static void mpq__walk_warm(const mpq__shape *s, const uint64_t *index, const uint8_t *data, int t, int n, int skip)
{
    if (t >= s->ntiles) return;
    mpq__walk w;
    mpq__walk_init(&w, s, index, data, t);
    w.skip = skip;
    for (int g = 0; g < n && g < s->ngroups; g++) {
        const int B = mpq__walk_planes(&w, g);
        mpq__walk_prefetch(&w, mpq__walk_next(&w, 0), g, B);
    }
}

/* ---- 4.2 Checks of descriptions and their parts; the sparse part ---- */

static mpq_status mpq__perm_check(const uint32_t *p, int n)
{
    uint8_t *seen = (uint8_t *)MPQ_MALLOC(((size_t)n + 7u) / 8u);
    if (!seen) return MPQ_ERR_NOMEM;
    memset(seen, 0, ((size_t)n + 7u) / 8u);
    mpq_status st = MPQ_OK;
    for (int i = 0; i < n && st == MPQ_OK; i++) {
        uint32_t v = p[i];
        if (v >= (uint32_t)n || (seen[v >> 3] >> (v & 7u) & 1u))
            st = MPQ_ERR_PERM;
        else
            seen[v >> 3] |= (uint8_t)(1u << (v & 7u));
    }
    MPQ_FREE(seen);
    return st;
}

static mpq_status mpq__scale_check(const float *c, int n)
{
    for (int j = 0; j < n; j++)
        if (!mpq__finite(c[j]) || c[j] == 0.0f) return c[j] == 0.0f ? MPQ_ERR_RANGE : MPQ_ERR_NONFINITE;
    return MPQ_OK;
}

static mpq_status mpq__clip_check(const float *c, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (!mpq__finite(c[k])) return MPQ_ERR_NONFINITE;
        if (c[k] < 0.0f) return MPQ_ERR_RANGE;
    }
    return MPQ_OK;
}

static unsigned mpq__desc_flags(const mpq_bitplane_desc *d)
{
    return (d->p_row ? MPQ__FLAG_PROW : 0u) | (d->p_col ? MPQ__FLAG_PCOL : 0u) |
        (d->col_scale ? MPQ__FLAG_CSCALE : 0u) | (d->sparse ? MPQ__FLAG_SPARSE : 0u) |
        (d->rotation ? MPQ__FLAG_ROT : 0u);
}

/* A sparse part is well formed: CSR structure (every row pointer within
   0..nnz and non-decreasing, checked before the row is read), indices in
   range and strictly increasing inside a row. Values are checked by the
   callers (floats when packing, halves when opening). */
static mpq_status mpq__sparse_check(const uint32_t *row_ptr, const uint16_t *c16, const uint32_t *c32, int rows,
                                    int cols, uint64_t nnz)
{
    if (row_ptr[0] != 0 || (uint64_t)row_ptr[rows] != nnz) return MPQ_ERR_FORMAT;
    for (int i = 0; i < rows; i++) {
        if (row_ptr[i + 1] < row_ptr[i] || (uint64_t)row_ptr[i + 1] > nnz) return MPQ_ERR_FORMAT;
        uint64_t prev = 0;
        for (uint32_t k = row_ptr[i]; k < row_ptr[i + 1]; k++) {
            uint64_t c = c16 ? (uint64_t)c16[k] : (uint64_t)c32[k];
            if (c >= (uint64_t)cols || (k > row_ptr[i] && c <= prev)) return MPQ_ERR_FORMAT;
            prev = c;
        }
    }
    return MPQ_OK;
}

MPQ_DEF void mpq_sparse_free(mpq_sparse *S)
{
    if (!S) return;
    MPQ_FREE(S->row_ptr);
    MPQ_FREE(S->col);
    MPQ_FREE(S->val);
    memset(S, 0, sizeof *S);
}

MPQ_DEF mpq_status mpq_sparse_from_mask(const float *W, const float *D, const uint8_t *mask, int rows, int cols,
                                        mpq_sparse *out)
{
    if (!W || !D || !mask || !out) return MPQ_ERR_ARG;
    if (rows < 1 || cols < 1) return MPQ_ERR_SIZE;
    const size_t n = (size_t)rows * (size_t)cols;
    size_t nnz = 0;
    for (size_t k = 0; k < n; k++) {
        if (!mask[k]) continue;
        if (!mpq__finite(W[k]) || !mpq__finite(D[k])) return MPQ_ERR_NONFINITE;
        if (fabs((double)W[k] - (double)D[k]) > MPQ__F16_MAX) return MPQ_ERR_RANGE;
        nnz++;
    }
    if ((uint64_t)nnz > 0xFFFFFFFFu) return MPQ_ERR_SIZE;
    mpq_sparse S;
    memset(&S, 0, sizeof S);
    S.rows = rows;
    S.cols = cols;
    S.nnz = nnz;
    S.row_ptr = (uint32_t *)MPQ_MALLOC(4u * ((size_t)rows + 1u));
    S.col = (uint32_t *)MPQ_MALLOC(4u * (nnz ? nnz : 1u));
    S.val = (float *)MPQ_MALLOC(4u * (nnz ? nnz : 1u));
    if (!S.row_ptr || !S.col || !S.val) {
        mpq_sparse_free(&S);
        return MPQ_ERR_NOMEM;
    }
    size_t k = 0;
    for (int i = 0; i < rows; i++) {
        S.row_ptr[i] = (uint32_t)k;
        for (int j = 0; j < cols; j++) {
            size_t o = (size_t)i * (size_t)cols + (size_t)j;
            if (!mask[o]) continue;
            S.col[k] = (uint32_t)j;
            S.val[k++] = (float)((double)W[o] - (double)D[o]);
        }
    }
    S.row_ptr[rows] = (uint32_t)k;
    *out = S;
    return MPQ_OK;
}

/* ---- 4.3 Packing: sizes, sections, records ---- */

MPQ_DEF mpq_status mpq_bitplane_bytes(const mpq_bitplane_desc *d, size_t *bytes)
{
    mpq__shape s;
    mpq_status st = mpq__shape_from_desc(d, &s);
    if (st != MPQ_OK) return st;
    if (!bytes) return MPQ_ERR_ARG;
    mpq__layout L;
    mpq__layout_compute(&s, mpq__desc_flags(d), &L, NULL, NULL);
    if (L.total > (uint64_t)SIZE_MAX) return MPQ_ERR_SIZE;
    *bytes = (size_t)L.total;
    return MPQ_OK;
}

/* Checks shared by both packers; on success *L and *s describe the buffer. */
static mpq_status mpq__pack_check(const mpq_bitplane_desc *d, void *buf, size_t bytes, mpq_packed *out, mpq__shape *s,
                                  mpq__layout *L)
{
    mpq_status st = mpq__shape_from_desc(d, s);
    if (st != MPQ_OK) return st;
    if (!buf || !out) return MPQ_ERR_ARG;
    if ((uintptr_t)buf % 16u) return MPQ_ERR_ALIGN;
    mpq__layout_compute(s, mpq__desc_flags(d), L, NULL, NULL);
    if (L->total != (uint64_t)bytes) return MPQ_ERR_SIZE;
    if (d->p_row && (st = mpq__perm_check(d->p_row, s->rows)) != MPQ_OK) return st;
    if (d->p_col && (st = mpq__perm_check(d->p_col, s->cols)) != MPQ_OK) return st;
    if (d->col_scale && (st = mpq__scale_check(d->col_scale, s->cols)) != MPQ_OK) return st;
    if (d->clip && (st = mpq__clip_check(d->clip, (size_t)s->rows * (size_t)s->ngroups)) != MPQ_OK) return st;
    if (d->sparse) {
        const mpq_sparse *S = d->sparse;
        if (mpq__sparse_check(S->row_ptr, NULL, S->col, s->rows, s->cols, s->sp_nnz) != MPQ_OK) return MPQ_ERR_ARG;
        for (size_t k = 0; k < S->nnz; k++) {
            if (!mpq__finite(S->val[k])) return MPQ_ERR_NONFINITE;
            if (fabsf(S->val[k]) > MPQ__F16_MAX) return MPQ_ERR_RANGE;
        }
    }
    return MPQ_OK;
}

/* Writes the header and every section but the records. */
static void mpq__write_sections(const mpq_bitplane_desc *d, const mpq__shape *s, const mpq__layout *L, uint8_t *buf)
{
    memset(buf, 0, (size_t)L->off_data);
    mpq__bp_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, s->f->magic, 8);
    h.version = d->rotation ? MPQ__BP_VERSION_ROT : MPQ__BP_VERSION;
    h.format = (uint32_t)s->format;
    h.rows = (uint32_t)s->rows;
    h.cols = (uint32_t)s->cols;
    h.group = (uint32_t)s->group;
    h.block_rows = (uint32_t)s->block_rows;
    h.tile_rows = MPQ_TILE_ROWS;
    h.band_rows = (uint32_t)s->band_rows;
    h.flags = mpq__desc_flags(d);
    h.rot_m = (uint32_t)s->rot_m;
    h.total_bytes = L->total;
    h.off_bits = L->off_bits;
    h.off_prow = L->off_prow;
    h.off_pcol = L->off_pcol;
    h.off_cscale = L->off_cscale;
    h.off_index = L->off_index;
    h.off_data = L->off_data;
    h.data_bytes = L->data_bytes;
    h.off_sparse = L->off_sparse;
    h.sparse_nnz = s->sp_nnz;
    memcpy(buf, &h, sizeof h);
    size_t nb = (size_t)s->nbrows * (size_t)s->ngroups;
    if (s->bits)
        memcpy(buf + L->off_bits, s->bits, nb);
    else
        memset(buf + L->off_bits, s->ubits, nb);
    if (d->p_row) memcpy(buf + L->off_prow, d->p_row, 4u * (size_t)s->rows);
    if (d->p_col) memcpy(buf + L->off_pcol, d->p_col, 4u * (size_t)s->cols);
    if (d->col_scale) memcpy(buf + L->off_cscale, d->col_scale, 4u * (size_t)s->cols);
    if (d->rotation) {
        const mpq_rotation *r = d->rotation;
        mpq__rot_header rh;
        memset(&rh, 0, sizeof rh);
        rh.kind = MPQ__ROT_KIND, rh.n = (uint32_t)r->n, rh.p = (uint32_t)r->p, rh.m = (uint32_t)r->m;
        rh.seed = r->seed;
        uint8_t *p = buf + L->off_rot;
        memcpy(p, &rh, sizeof rh);
        memcpy(p + sizeof rh, r->R, 4u * (size_t)r->m * (size_t)r->m);
        memcpy(p + sizeof rh + 4u * (size_t)r->m * (size_t)r->m, r->sign, ((size_t)r->n + 7u) / 8u);
    }
    mpq__layout Lx;
    mpq__layout_compute(s, h.flags, &Lx, (uint64_t *)(void *)(buf + L->off_index), NULL);
    if (d->sparse) { /* CSR after the records; the gap before it is zero */
        const mpq_sparse *S = d->sparse;
        uint8_t *p = buf + L->off_sparse;
        memset(buf + L->off_data + L->data_bytes, 0, (size_t)(L->total - L->off_data - L->data_bytes));
        memcpy(p, S->row_ptr, 4u * ((size_t)s->rows + 1u));
        p += 4u * ((size_t)s->rows + 1u);
        const int cb = (int)mpq__sp_colbytes(s->cols);
        for (size_t k = 0; k < S->nnz; k++, p += cb) {
            if (cb == 2) {
                uint16_t c = (uint16_t)S->col[k];
                memcpy(p, &c, 2);
            } else
                memcpy(p, &S->col[k], 4);
        }
        for (size_t k = 0; k < S->nnz; k++, p += 2) {
            uint16_t h16 = mpq_f32_to_f16(S->val[k]);
            memcpy(p, &h16, 2);
        }
    }
}

/* One record: tile t, group g. codes: the tile's rows, row stride cstride,
   starting at the group's first column; sh/zh: the metadata of the tile's
   16 rows. */
static void mpq__write_record(uint8_t *rec, const mpq__shape *s, int t, int g, const uint8_t *codes, size_t cstride,
                              const uint16_t *sh, const uint16_t *zh)
{
    const int planes = mpq__tile_planes(s, t, g), nch = mpq__nch(s, g), gw = mpq__group_cols(s, g);
    const int nr = s->rows - t * MPQ_TILE_ROWS < MPQ_TILE_ROWS ? s->rows - t * MPQ_TILE_ROWS : MPQ_TILE_ROWS;
    const size_t pbytes = (size_t)nch * 16u;
    memset(rec, 0, (size_t)s->meta + (size_t)planes * pbytes);
    for (int r = 0; r < nr; r++) {
        s->f->meta_write(rec, r, sh[r], zh[r]);
        const int b = mpq__bits_at(s, t * MPQ_TILE_ROWS + r, g);
        const uint8_t *q = codes + (size_t)r * cstride;
        for (int c = 0; c < nch; c++) {
            uint8_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int k = 0; k < 8 && 8 * c + k < gw; k++) v[k] = q[8 * c + k];
            size_t o = (size_t)s->meta + mpq__slab_off(c, r, nch);
            for (int i = 0; i < b; i++, o += pbytes) {
                unsigned byte = 0;
                for (int k = 0; k < 8; k++) byte |= ((unsigned)(v[k] >> i) & 1u) << k;
                rec[o] = (uint8_t)byte;
            }
        }
    }
}

/* Writes every record of tile t from the tile's codes and pairs. */
static void mpq__write_tile(uint8_t *data, const mpq__shape *s, const uint64_t *index, int t, const uint8_t *codes,
                            size_t cstride, const uint16_t *sh, const uint16_t *zh, size_t pstride)
{
    mpq__walk w;
    mpq__walk_init(&w, s, index, data, t);
    uint16_t tsh[MPQ_TILE_ROWS], tzh[MPQ_TILE_ROWS];
    for (int g = 0; g < s->ngroups; g++) {
        for (int r = 0; r < MPQ_TILE_ROWS; r++) {
            int ok = t * MPQ_TILE_ROWS + r < s->rows;
            tsh[r] = ok ? sh[(size_t)r * pstride + (size_t)g] : 0;
            tzh[r] = ok ? zh[(size_t)r * pstride + (size_t)g] : 0;
        }
        uint8_t *rec = data + (mpq__walk_next(&w, 0) - data); /* the walker reads; this one writes */
        mpq__write_record(rec, s, t, g, codes + (size_t)g * (size_t)s->group, cstride, tsh, tzh);
    }
}

static void mpq__view(mpq_packed *A, const mpq__shape *s, const mpq__layout *L, const uint8_t *buf, unsigned flags)
{
    memset(A, 0, sizeof *A);
    A->format = s->format;
    A->rows = s->rows;
    A->cols = s->cols;
    A->group = s->group;
    A->block_rows = s->block_rows;
    A->band_rows = s->band_rows;
    A->ngroups = s->ngroups;
    A->nbands = s->nbands;
    A->bits = buf + L->off_bits;
    A->p_row = (flags & MPQ__FLAG_PROW) ? (const uint32_t *)(const void *)(buf + L->off_prow) : NULL;
    A->p_col = (flags & MPQ__FLAG_PCOL) ? (const uint32_t *)(const void *)(buf + L->off_pcol) : NULL;
    A->col_scale = (flags & MPQ__FLAG_CSCALE) ? (const float *)(const void *)(buf + L->off_cscale) : NULL;
    if (flags & MPQ__FLAG_ROT) {
        mpq__rot_header rh;
        memcpy(&rh, buf + L->off_rot, sizeof rh);
        A->rot.n = (int)rh.n, A->rot.p = (int)rh.p, A->rot.m = (int)rh.m, A->rot.seed = rh.seed;
        A->rot.R = (const float *)(const void *)(buf + L->off_rot + sizeof rh);
        A->rot.sign = buf + L->off_rot + sizeof rh + 4u * (uint64_t)rh.m * rh.m;
    }
    A->band_off = (const uint64_t *)(const void *)(buf + L->off_index);
    A->data = buf + L->off_data;
    if (flags & MPQ__FLAG_SPARSE) {
        const uint8_t *p = buf + L->off_sparse;
        A->sp_nnz = (size_t)s->sp_nnz;
        A->sp_row_ptr = (const uint32_t *)(const void *)p;
        p += 4u * ((size_t)s->rows + 1u);
        if (mpq__sp_colbytes(s->cols) == 2)
            A->sp_col16 = (const uint16_t *)(const void *)p;
        else
            A->sp_col32 = (const uint32_t *)(const void *)p;
        A->sp_val = (const uint16_t *)(const void *)(p + mpq__sp_colbytes(s->cols) * s->sp_nnz);
    }
    A->buf = buf;
    A->bytes = (size_t)L->total;
}

static void mpq__shape_of(const mpq_packed *A, mpq__shape *s)
{
    mpq__shape_fill(s, A->format, A->rows, A->cols, A->group, A->block_rows);
    s->bits = A->bits;
    s->ubits = 0;
    s->symmetric = 0;
    s->sp_nnz = (uint64_t)A->sp_nnz;
    s->rot_m = A->rot.n ? A->rot.m : 0;
}

static int mpq__max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int mpq__thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static int mpq__team_size(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* mpq_pack after its checks, W in the coordinates of the columns (rotated). */
static mpq_status mpq__pack_rows(const mpq_bitplane_desc *d, const mpq__shape *sp, const mpq__layout *Lp,
                                 const float *W, void *buf, mpq_packed *out)
{
    const mpq__shape s = *sp;
    const mpq__layout L = *Lp;
    const size_t n = (size_t)s.cols;
    for (int i = 0; i < s.rows; i++) { /* every value that will be quantized */
        const float *src = W + (size_t)(d->p_row ? d->p_row[i] : (uint32_t)i) * n;
        for (size_t j = 0; j < n; j++) {
            float v = src[d->p_col ? d->p_col[j] : j];
            if (!mpq__finite(v)) return MPQ_ERR_NONFINITE;
            if (d->col_scale) v /= d->col_scale[j];
            if (!mpq__finite(v) || fabsf(v) > s.f->max_abs) return MPQ_ERR_RANGE;
        }
    }
    const int nth = mpq__max_threads();
    /* per thread: the tile's rows as floats, their pairs, their codes, a group */
    const size_t per = mpq__align64(MPQ_TILE_ROWS * n * (sizeof(float) + 1u) + 4u * MPQ_TILE_ROWS * (size_t)s.ngroups) +
        mpq__align64(sizeof(float) * (size_t)s.group);
    uint8_t *scratch = (uint8_t *)mpq_aligned_alloc(per * (size_t)nth);
    if (!scratch) return MPQ_ERR_NOMEM;
    uint8_t *b8 = (uint8_t *)buf;
    mpq__write_sections(d, &s, &L, b8);
    const uint64_t *index = (const uint64_t *)(const void *)(b8 + L.off_index);
    const int ntiles = s.ntiles;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 4)
#endif
    for (int t = 0; t < ntiles; t++) {
        uint8_t *mine = scratch + per * (size_t)mpq__thread_id();
        float *v = (float *)(void *)mine;
        uint16_t *sh = (uint16_t *)(void *)(mine + MPQ_TILE_ROWS * n * sizeof(float));
        uint16_t *zh = sh + MPQ_TILE_ROWS * (size_t)s.ngroups;
        uint8_t *q = (uint8_t *)(zh + MPQ_TILE_ROWS * (size_t)s.ngroups);
        float *tmp = (float *)(void *)(mine + per - mpq__align64(sizeof(float) * (size_t)s.group));
        for (int r = 0; r < MPQ_TILE_ROWS && t * MPQ_TILE_ROWS + r < s.rows; r++) {
            int i = t * MPQ_TILE_ROWS + r;
            const float *src = W + (size_t)(d->p_row ? d->p_row[i] : (uint32_t)i) * n;
            float *row = v + (size_t)r * n;
            for (size_t j = 0; j < n; j++) {
                row[j] = src[d->p_col ? d->p_col[j] : j];
                if (d->col_scale) row[j] /= d->col_scale[j];
            }
            for (int g = 0; g < s.ngroups; g++) {
                int b = mpq__bits_at(&s, i, g);
                size_t o = (size_t)g * (size_t)s.group, p = (size_t)r * (size_t)s.ngroups + (size_t)g;
                float clip = d->clip ? d->clip[(size_t)i * (size_t)s.ngroups + (size_t)g] : 0.0f;
                mpq__quant_any(s.f, b, (int)((s.symmetric >> b) & 1u), row + o, mpq__group_cols(&s, g), clip, tmp,
                               q + (size_t)r * n + o, sh + p, zh + p);
            }
        }
        mpq__write_tile(b8 + L.off_data, &s, index, t, q, n, sh, zh, (size_t)s.ngroups);
    }
    mpq_aligned_free(scratch);
    mpq__view(out, &s, &L, b8, mpq__desc_flags(d));
    return MPQ_OK;
}

/* A copy of W with each row w replaced by V w (W V^T), and one of H as V H
   V^T: what a rotated matrix's quantizers work on. *Hr is NULL when H is. */
static mpq_status mpq__rotated_copies(const mpq_rotation *r, int rows, const float *W, const float *H, float **Wr,
                                      float **Hr)
{
    const size_t n = (size_t)r->n, nw = (size_t)rows * n;
    *Wr = NULL, *Hr = NULL;
    mpq_status st = mpq__check_finite(W, nw);
    if (st != MPQ_OK) return st;
    float *a = (float *)MPQ_MALLOC(sizeof(float) * nw), *b = H ? (float *)MPQ_MALLOC(sizeof(float) * n * n) : NULL;
    float *tmp = (float *)MPQ_MALLOC(sizeof(float) * (size_t)r->m);
    if (!a || !tmp || (H && !b)) st = MPQ_ERR_NOMEM;
    if (st == MPQ_OK) {
        memcpy(a, W, sizeof(float) * nw);
        for (int i = 0; i < rows; i++) mpq__rot_run(r, a + (size_t)i * n, tmp, 0);
        if (H) {
            memcpy(b, H, sizeof(float) * n * n);
            st = mpq_rotation_conjugate(r, b);
        }
    }
    MPQ_FREE(tmp);
    if (st != MPQ_OK) {
        MPQ_FREE(a);
        MPQ_FREE(b);
        return st;
    }
    *Wr = a, *Hr = b;
    return MPQ_OK;
}

/* mpq_pack; rotated: W is already in the coordinates of the columns (W
   V^T) and d->rotation is only stored. */
static mpq_status mpq__pack_as(const mpq_bitplane_desc *d, const float *W, int rotated, void *buf, size_t bytes,
                               mpq_packed *out)
{
    mpq__shape s;
    mpq__layout L;
    mpq_status st = mpq__pack_check(d, buf, bytes, out, &s, &L);
    if (st != MPQ_OK) return st;
    if (!W) return MPQ_ERR_ARG;
    if (!d->rotation || rotated) return mpq__pack_rows(d, &s, &L, W, buf, out);
    float *Wr, *none; /* the rows of W V^T */
    if ((st = mpq__rotated_copies(d->rotation, s.rows, W, NULL, &Wr, &none)) != MPQ_OK) return st;
    st = mpq__pack_rows(d, &s, &L, Wr, buf, out);
    MPQ_FREE(Wr);
    return st;
}

MPQ_DEF mpq_status mpq_pack(const mpq_bitplane_desc *d, const float *W, void *buf, size_t bytes, mpq_packed *out)
{
    return mpq__pack_as(d, W, 0, buf, bytes, out);
}

static mpq_status mpq__pack_alloc_as(const mpq_bitplane_desc *d, const float *W, int rotated, mpq_packed *out)
{
    size_t bytes;
    mpq_status st = mpq_bitplane_bytes(d, &bytes);
    if (st != MPQ_OK) return st;
    if (!out) return MPQ_ERR_ARG;
    void *buf = mpq_aligned_alloc(bytes);
    if (!buf) return MPQ_ERR_NOMEM;
    st = mpq__pack_as(d, W, rotated, buf, bytes, out);
    if (st != MPQ_OK) {
        mpq_aligned_free(buf);
        return st;
    }
    out->owned = 1;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_pack_alloc(const mpq_bitplane_desc *d, const float *W, mpq_packed *out)
{
    return mpq__pack_alloc_as(d, W, 0, out);
}

/* Writes the records of every tile from codes and pairs in packed
   coordinates (either format). */
static void mpq__write_all(const mpq__shape *s, const mpq__layout *L, uint8_t *b8, const uint8_t *codes,
                           const uint16_t *s_hat, const uint16_t *z_hat)
{
    const uint64_t *index = (const uint64_t *)(const void *)(b8 + L->off_index);
    const int ntiles = s->ntiles;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 4)
#endif
    for (int t = 0; t < ntiles; t++) {
        size_t r0 = (size_t)t * MPQ_TILE_ROWS;
        mpq__write_tile(b8 + L->off_data, s, index, t, codes + r0 * (size_t)s->cols, (size_t)s->cols,
                        s_hat + r0 * (size_t)s->ngroups, z_hat + r0 * (size_t)s->ngroups, (size_t)s->ngroups);
    }
}

MPQ_DEF mpq_status mpq_pack_quantized(const mpq_bitplane_desc *d, const uint8_t *codes, const uint16_t *s_hat,
                                      const uint16_t *z_hat, void *buf, size_t bytes, mpq_packed *out)
{
    mpq__shape s;
    mpq__layout L;
    mpq_status st = mpq__pack_check(d, buf, bytes, out, &s, &L);
    if (st != MPQ_OK) return st;
    if (!codes || !s_hat || !z_hat) return MPQ_ERR_ARG;
    if ((st = mpq__check_quantized(&s, codes, s_hat, z_hat)) != MPQ_OK) return st;
    uint8_t *b8 = (uint8_t *)buf;
    mpq__write_sections(d, &s, &L, b8);
    mpq__write_all(&s, &L, b8, codes, s_hat, z_hat);
    mpq__view(out, &s, &L, b8, mpq__desc_flags(d));
    return MPQ_OK;
}

/* ---- 4.4 Opening a buffer; what a packed matrix reports ---- */

static mpq_status mpq__open_format(const void *buf, size_t bytes, mpq_packed *out, int format)
{
    if (!buf || !out) return MPQ_ERR_ARG;
    if ((uintptr_t)buf % 16u) return MPQ_ERR_ALIGN;
    if (bytes < sizeof(mpq__bp_header)) return MPQ_ERR_FORMAT;
    const uint8_t *b8 = (const uint8_t *)buf;
    mpq__bp_header h;
    memcpy(&h, b8, sizeof h);
    const mpq_format_traits *f = mpq_format_get((mpq_format)format);
    /* version 1: no rotation; version 2: a rotation (flag 16, its m in the header) */
    const int rot = h.version == MPQ__BP_VERSION_ROT;
    if (!f || memcmp(h.magic, f->magic, 8) || (h.version != MPQ__BP_VERSION && !rot) ||
        !!(h.flags & MPQ__FLAG_ROT) != rot || (!rot && h.rot_m) ||
        (rot && (h.rot_m % 2 == 0 || h.rot_m > MPQ_ROTATION_MAX_ODD || h.rot_m > h.cols)) ||
        h.format != (uint32_t)format || h.tile_rows != MPQ_TILE_ROWS || (h.flags & ~MPQ__FLAGS_ALL) ||
        h.rows > INT_MAX || h.cols > INT_MAX || h.group > INT_MAX || h.block_rows > INT_MAX ||
        h.total_bytes != (uint64_t)bytes)
        return MPQ_ERR_FORMAT;
    mpq__shape s;
    if (mpq__shape_fill(&s, format, (int)h.rows, (int)h.cols, (int)h.group, (int)h.block_rows) != MPQ_OK ||
        h.band_rows != (uint32_t)s.band_rows)
        return MPQ_ERR_FORMAT;
    /* Bound every loop below by the buffer size before running it. */
    uint64_t nb = (uint64_t)s.nbrows * (uint64_t)s.ngroups;
    if (h.off_bits != sizeof h || nb > bytes - sizeof h ||
        (uint64_t)s.ntiles * (uint64_t)s.ngroups > bytes / (uint64_t)s.meta)
        return MPQ_ERR_FORMAT;
    const uint8_t *bits = b8 + h.off_bits;
    for (uint64_t k = 0; k < nb; k++)
        if (bits[k] < f->min_bits || bits[k] > MPQ_MAX_BITS) return MPQ_ERR_FORMAT;
    s.bits = bits;
    /* bounds the sparse sizes too: every entry takes at least 4 bytes */
    if (((h.flags & MPQ__FLAG_SPARSE) ? h.sparse_nnz > (bytes - sizeof h) / 4u || h.sparse_nnz > 0xFFFFFFFFu
                                      : (h.sparse_nnz | h.off_sparse) != 0) ||
        (uint64_t)s.rows + 1u > (bytes - sizeof h) / 4u)
        return MPQ_ERR_FORMAT;
    s.sp_nnz = h.sparse_nnz;
    s.rot_m = (int)h.rot_m; /* at most 1023: the section's size cannot overflow */
    mpq__layout L;
    mpq__layout_compute(&s, h.flags, &L, NULL, NULL);
    if (L.total != bytes || L.off_sparse != h.off_sparse || L.off_prow != h.off_prow || L.off_pcol != h.off_pcol ||
        L.off_cscale != h.off_cscale || L.off_index != h.off_index || L.off_data != h.off_data ||
        L.data_bytes != h.data_bytes)
        return MPQ_ERR_FORMAT;
    /* The band index must be exactly the one the bits map implies. */
    const uint64_t *index = (const uint64_t *)(const void *)(b8 + L.off_index);
    if (!mpq__layout_compute(&s, h.flags, &L, NULL, index)) return MPQ_ERR_FORMAT;
    mpq_status st;
    if ((h.flags & MPQ__FLAG_PROW) &&
        (st = mpq__perm_check((const uint32_t *)(const void *)(b8 + L.off_prow), s.rows)) != MPQ_OK)
        return st == MPQ_ERR_PERM ? MPQ_ERR_FORMAT : st;
    if ((h.flags & MPQ__FLAG_PCOL) &&
        (st = mpq__perm_check((const uint32_t *)(const void *)(b8 + L.off_pcol), s.cols)) != MPQ_OK)
        return st == MPQ_ERR_PERM ? MPQ_ERR_FORMAT : st;
    if ((h.flags & MPQ__FLAG_CSCALE) &&
        mpq__scale_check((const float *)(const void *)(b8 + L.off_cscale), s.cols) != MPQ_OK)
        return MPQ_ERR_FORMAT;
    if (rot) { /* a transform of the one known kind, of this size, usable */
        mpq__rot_header rh;
        memcpy(&rh, b8 + L.off_rot, sizeof rh);
        int zero = 1;
        for (int k = 0; k < 5; k++) zero &= rh.zero[k] == 0;
        if (rh.kind != MPQ__ROT_KIND || rh.n != h.cols || rh.m != h.rot_m || !zero) return MPQ_ERR_FORMAT;
        mpq_packed v;
        mpq__view(&v, &s, &L, b8, h.flags);
        if (mpq_rotation_check(&v.rot) != MPQ_OK) return MPQ_ERR_FORMAT;
    }
    /* Every row's metadata valid (finite pairs; no NaN exponent); padding
       rows of the last tile all zero. */
    for (int t = 0; t < s.ntiles; t++) {
        mpq__walk w;
        mpq__walk_init(&w, &s, index, b8 + L.off_data, t);
        for (int g = 0; g < s.ngroups; g++) {
            const uint8_t *rec = mpq__walk_next(&w, 0);
            for (int r = 0; r < MPQ_TILE_ROWS; r++) {
                const int pad = t * MPQ_TILE_ROWS + r >= s.rows;
                uint16_t sh, zh;
                f->meta_read(rec, r, &sh, &zh);
                if (!f->meta_valid(sh, zh) || (pad && (sh | zh))) return MPQ_ERR_FORMAT;
            }
        }
    }
    if (h.flags & MPQ__FLAG_SPARSE) {
        mpq_packed v;
        mpq__view(&v, &s, &L, b8, h.flags);
        if (mpq__sparse_check(v.sp_row_ptr, v.sp_col16, v.sp_col32, s.rows, s.cols, s.sp_nnz) != MPQ_OK)
            return MPQ_ERR_FORMAT;
        for (size_t k = 0; k < v.sp_nnz; k++) {
            uint16_t h16;
            memcpy(&h16, v.sp_val + k, 2);
            if (!mpq__half_finite(h16)) return MPQ_ERR_FORMAT;
        }
    }
    mpq__view(out, &s, &L, b8, h.flags);
    return MPQ_OK;
}

static mpq_status mpq__bp_open(const void *buf, size_t bytes, mpq_packed *out)
{
    return mpq__open_format(buf, bytes, out, MPQ_FORMAT_BITPLANE);
}

static mpq_status mpq__mx_open(const void *buf, size_t bytes, mpq_packed *out)
{
    return mpq__open_format(buf, bytes, out, MPQ_FORMAT_MXINT);
}

MPQ_DEF void mpq_packed_free(mpq_packed *A)
{
    if (!A) return;
    if (A->owned) mpq_aligned_free((void *)(uintptr_t)A->buf);
    memset(A, 0, sizeof *A);
}

MPQ_DEF int mpq_packed_bits_at(const mpq_packed *A, int i, int g)
{
    if (!A || i < 0 || i >= A->rows || g < 0 || g >= A->ngroups) return 0;
    return A->bits[(size_t)(i / A->block_rows) * (size_t)A->ngroups + (size_t)g];
}

MPQ_DEF mpq_status mpq_packed_records(const mpq_packed *A, uint64_t *off, uint8_t *planes, int *meta)
{
    if (!A || !A->band_off) return MPQ_ERR_ARG;
    mpq__shape s;
    mpq__shape_of(A, &s);
    if (meta) *meta = s.meta;
    for (int b = 0; b < s.nbands; b++) {
        int t0, nt;
        mpq__band_tiles(&s, b, &t0, &nt);
        uint64_t pos = A->band_off[b]; /* inside a band: group after group, tile after tile */
        for (int g = 0; g < s.ngroups; g++)
            for (int t = t0; t < t0 + nt; t++) {
                const size_t k = (size_t)t * (size_t)s.ngroups + (size_t)g;
                const int np = mpq__tile_planes(&s, t, g);
                if (off) off[k] = pos;
                if (planes) planes[k] = (uint8_t)np;
                pos += mpq__rec_size(&s, np, g);
            }
    }
    return MPQ_OK;
}

MPQ_DEF size_t mpq_packed_sparse_bytes(const mpq_packed *A)
{
    if (!A || !A->sp_row_ptr) return 0;
    mpq__shape s;
    mpq__shape_of(A, &s);
    return (size_t)mpq__sp_bytes(&s);
}

MPQ_DEF double mpq_packed_bpw(const mpq_packed *A, int level)
{
    if (!A || !A->bits) return 0.0;
    mpq__shape s;
    mpq__shape_of(A, &s);
    double bits = 0.0;
    for (int br = 0; br < s.nbrows; br++) {
        int r = (br + 1) * s.block_rows < s.rows ? s.block_rows : s.rows - br * s.block_rows;
        for (int g = 0; g < s.ngroups; g++)
            bits +=
                (double)r * (double)mpq__group_cols(&s, g) * (double)s.bits[(size_t)br * (size_t)s.ngroups + (size_t)g];
    }
    if (level >= 1) bits += (double)s.f->meta_bits * (double)s.rows * (double)s.ngroups;
    if (level >= 2) bits += 8.0 * (double)mpq_packed_sparse_bytes(A);
    if (level >= 2 && A->rot.n) bits += 8.0 * (double)mpq__rot_bytes(A->rot.n, A->rot.m);
    return bits / ((double)s.rows * (double)s.cols);
}

/* ---- 4.5 Decoding: dequantization of a matrix or a row ---- */

/* The (s^, z^) of the 16 rows of record (t, g): fp16 pairs, or from the
   E8M0 byte and the row's width k, s^ = 2^(X-k+1), z^ = -s^ (MXINT). b is
   the record's width when every row has it, else 0. */
static void mpq__rec_pairs(const mpq__shape *s, const uint8_t *rec, int t, int g, int b, float sh[MPQ_TILE_ROWS],
                           float zh[MPQ_TILE_ROWS])
{
    if (!s->f->e8m0) { /* the rows' fp16 s^, then their z^: converted together */
        mpq_f16_to_f32_n((const uint16_t *)(const void *)rec, sh, MPQ_TILE_ROWS);
        mpq_f16_to_f32_n((const uint16_t *)(const void *)(rec + 32), zh, MPQ_TILE_ROWS);
        return;
    }
    for (int r = 0; r < MPQ_TILE_ROWS; r++) {
        const int k = b ? b : mpq__bits_at(s, t * MPQ_TILE_ROWS + r, g);
        uint16_t a, c;
        s->f->meta_read(rec, r, &a, &c);
        s->f->pair(k, a, c, &sh[r], &zh[r]);
    }
}

/* Byte k of the result is bit k of v: v copied into every byte, byte k
   keeping bit k, and 0x7f added so that bit 7 of a byte is set where any
   bit of it is (no carries: a byte holds at most 0x80). */
static inline uint64_t mpq__spread8(unsigned v)
{
    const uint64_t one = ((uint64_t)v * 0x0101010101010101ull) & 0x8040201008040201ull;
    return (one + 0x7f7f7f7f7f7f7f7full) >> 7 & 0x0101010101010101ull;
}

/* Decodes row r of record (t, g) into out[0 .. group width): values in
   float64, exact (fp16 times a small integer plus fp16). Eight columns at
   a time: the byte of each kept plane spread into the bytes of one word
   (mpq__spread8), plane i shifted to bit i, so that byte k of the word is
   column k's code without the skipped planes. */
static void mpq__decode_row(const mpq__shape *s, const uint8_t *rec, int t, int g, int r, int skip, double *out)
{
    const int b = mpq__bits_at(s, t * MPQ_TILE_ROWS + r, g), nch = mpq__nch(s, g), gw = mpq__group_cols(s, g);
    const int sk = mpq_first_plane(b, skip);
    uint16_t sh, zh;
    float sf, zf;
    s->f->meta_read(rec, r, &sh, &zh);
    s->f->pair(b, sh, zh, &sf, &zf);
    const double S = (double)sf, Z = (double)zf;
    const size_t stride = (size_t)nch * 16u; /* from a plane's bytes to the next plane's */
    const int C = (1 << b) - (1 << sk);      /* mpq__mirror_sum(q, b, sk) = 2 q - C, planes below sk dropped */
    for (int c = 0; c < nch; c++) {
        const uint8_t *p = rec + (size_t)s->meta + mpq__slab_off(c, r, nch) + (size_t)sk * stride;
        uint64_t q = 0;
        for (int i = sk; i < b; i++, p += stride) q |= mpq__spread8(*p) << i;
        const int n = gw - 8 * c < 8 ? gw - 8 * c : 8;
        for (int k = 0; k < n; k++) out[8 * c + k] = S * (double)(2 * (int)(q >> (8 * k) & 255u) - C) + Z;
    }
}

/* Calls emit(row, col, value) in original coordinates for every weight. */
typedef void (*mpq__emit_fn)(void *u, int row, int col, double w);

static void mpq__bp_decode_all(const mpq_packed *A, int skip, mpq__emit_fn emit, void *u, double *tmp)
{
    mpq__shape s;
    mpq__shape_of(A, &s);
    for (int t = 0; t < s.ntiles; t++) {
        mpq__walk w;
        mpq__walk_init(&w, &s, A->band_off, A->data, t);
        for (int g = 0; g < s.ngroups; g++) {
            const uint8_t *rec = mpq__walk_next(&w, 0);
            for (int r = 0; r < MPQ_TILE_ROWS && t * MPQ_TILE_ROWS + r < s.rows; r++) {
                int i = t * MPQ_TILE_ROWS + r, gw = mpq__group_cols(&s, g);
                mpq__decode_row(&s, rec, t, g, r, skip, tmp);
                int orow = A->p_row ? (int)A->p_row[i] : i;
                for (int k = 0; k < gw; k++) {
                    int j = g * s.group + k;
                    double wt = tmp[k] * (A->col_scale ? (double)A->col_scale[j] : 1.0);
                    emit(u, orow, A->p_col ? (int)A->p_col[j] : j, wt);
                }
            }
        }
    }
}

typedef struct mpq__emit_f32 {
    float *W;
    size_t cols;
} mpq__emit_f32;

static void mpq__emit_float(void *u, int row, int col, double w)
{
    mpq__emit_f32 *e = (mpq__emit_f32 *)u;
    e->W[(size_t)row * e->cols + (size_t)col] = (float)w;
}

/* Column index k of the sparse part. */
static uint32_t mpq__sp_col(const mpq_packed *A, size_t k)
{
    return A->sp_col16 ? (uint32_t)A->sp_col16[k] : A->sp_col32[k];
}

/* Calls emit(row, col, value) for every entry of the sparse part. */
static void mpq__sparse_emit(const mpq_packed *A, mpq__emit_fn emit, void *u)
{
    if (!A->sp_row_ptr) return;
    for (int i = 0; i < A->rows; i++)
        for (uint32_t k = A->sp_row_ptr[i]; k < A->sp_row_ptr[i + 1]; k++)
            emit(u, i, (int)mpq__sp_col(A, k), (double)mpq_f16_to_f32(A->sp_val[k]));
}

static void mpq__emit_add_float(void *u, int row, int col, double w)
{
    mpq__emit_f32 *e = (mpq__emit_f32 *)u;
    float *p = e->W + (size_t)row * e->cols + (size_t)col;
    *p = (float)((double)*p + w);
}

static mpq_status mpq__bp_dequantize(const mpq_packed *A, int skip_planes, float *W)
{
    if (!A || !W || !A->data) return MPQ_ERR_ARG;
    if (skip_planes < 0) return MPQ_ERR_ARG;
    double *tmp = (double *)MPQ_MALLOC(sizeof(double) * (size_t)(A->group > A->rot.m ? A->group : A->rot.m));
    if (!tmp) return MPQ_ERR_NOMEM;
    mpq__emit_f32 e = {W, (size_t)A->cols};
    mpq__bp_decode_all(A, skip_planes, mpq__emit_float, &e, tmp);
    mpq__sparse_emit(A, mpq__emit_add_float, &e);
    for (int i = 0; i < A->rows && A->rot.n; i++) /* row w~ of W~ V is V^T w~; tmp holds m <= cols floats */
        mpq__rot_run(&A->rot, W + (size_t)i * (size_t)A->cols, (float *)(void *)tmp, 1);
    MPQ_FREE(tmp);
    return MPQ_OK;
}

static mpq_status mpq__bp_dequantize_row(const mpq_packed *A, int skip_planes, int row, float *w)
{
    if (!A || !w || !A->data || skip_planes < 0 || row < 0 || row >= A->rows) return MPQ_ERR_ARG;
    int i = row;
    if (A->p_row)
        for (i = 0; i < A->rows && (int)A->p_row[i] != row; i++) continue;
    if (i == A->rows) return MPQ_ERR_FORMAT; /* mpq_packed_open checked p_row: not reached */
    double *tmp = (double *)MPQ_MALLOC(sizeof(double) * (size_t)(A->group > A->rot.m ? A->group : A->rot.m));
    if (!tmp) return MPQ_ERR_NOMEM;
    mpq__shape s;
    mpq__shape_of(A, &s);
    const int t = i / MPQ_TILE_ROWS, r = i % MPQ_TILE_ROWS;
    mpq__walk wk;
    mpq__walk_init(&wk, &s, A->band_off, A->data, t);
    for (int g = 0; g < s.ngroups; g++) {
        const uint8_t *rec = mpq__walk_next(&wk, 0);
        const int gw = mpq__group_cols(&s, g);
        mpq__decode_row(&s, rec, t, g, r, skip_planes, tmp);
        for (int k = 0; k < gw; k++) { /* the arithmetic of mpq__bp_decode_all and mpq__emit_float */
            const int j = g * s.group + k;
            const double wt = tmp[k] * (A->col_scale ? (double)A->col_scale[j] : 1.0);
            w[A->p_col ? (int)A->p_col[j] : j] = (float)wt;
        }
    }
    if (A->sp_row_ptr) /* as mpq__emit_add_float */
        for (uint32_t k = A->sp_row_ptr[row]; k < A->sp_row_ptr[row + 1]; k++) {
            float *p = &w[mpq__sp_col(A, k)];
            *p = (float)((double)*p + (double)mpq_f16_to_f32(A->sp_val[k]));
        }
    if (A->rot.n) mpq__rot_run(&A->rot, w, (float *)(void *)tmp, 1);
    MPQ_FREE(tmp);
    return MPQ_OK;
}

/* ========================================================================== */
/* 5. Products                                                                */
/* ========================================================================== */

/* ---- 5.1 Lookup tables; the CPU probe ---- */

MPQ_DEF void mpq_lut16(const float x4[4], float Q[16])
{
    /* Same operation order for p and p ^ 15 with every sign flipped, so the
       mirror Q[p ^ 15] = -Q[p] holds exactly in floating point. */
    for (int p = 0; p < 16; p++) {
        float v = (p & 1) ? x4[0] : -x4[0];
        v += (p & 2) ? x4[1] : -x4[1];
        v += (p & 4) ? x4[2] : -x4[2];
        v += (p & 8) ? x4[3] : -x4[3];
        Q[p] = v;
    }
}

MPQ_DEF void mpq_lut128(const float x8[8], float T[128])
{
    float L[16], H[16];
    mpq_lut16(x8, L);
    mpq_lut16(x8 + 4, H);
    for (int p = 0; p < 128; p++) T[p] = L[p & 15] + H[p >> 4];
}

MPQ_DEF float mpq_lut128_get(const float T[128], uint8_t p) { return (p & 0x80u) ? -T[p ^ 0xFFu] : T[p]; }

/* What the CPU running this code supports, of what is compiled in. */
#define MPQ__CPU_AVX2   1u /* AVX2, FMA, F16C; the OS saves YMM state */
#define MPQ__CPU_AVX512 2u /* and AVX-512 F, BW, VL; the OS saves ZMM and opmask state */
#define MPQ__CPU_VNNI   4u /* and AVX-512 VBMI, VNNI */

#if defined(MPQ__X86_DISPATCH)
static unsigned mpq__cpu_probe(void)
{
    unsigned a, b, c, d, lo, hi, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned fma = (c >> 12) & 1u, osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u, f16c = (c >> 29) & 1u;
    if (!osxsave || !avx || __get_cpuid_max(0, NULL) < 7) return 0;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); /* XCR0: the state the OS saves */
    (void)hi;
    if ((lo & 0x06u) != 0x06u) return 0; /* XMM, YMM */
    __cpuid_count(7, 0, a, b, c, d);
    if (fma && f16c && ((b >> 5) & 1u)) f |= MPQ__CPU_AVX2;
    if ((f & MPQ__CPU_AVX2) && (lo & 0xE0u) == 0xE0u && ((b >> 16) & 1u) && ((b >> 30) & 1u) && ((b >> 31) & 1u))
        f |= MPQ__CPU_AVX512;                                                             /* opmask, ZMM; F, BW, VL */
    if ((f & MPQ__CPU_AVX512) && ((c >> 1) & 1u) && ((c >> 11) & 1u)) f |= MPQ__CPU_VNNI; /* VBMI, VNNI */
    return f;
}
#endif

/* The probe runs once; threads that race on the first call compute and store
   the same value (atomically), so the cache needs no lock. */
static unsigned mpq__cpu(void)
{
#if defined(MPQ__X86_DISPATCH)
    static unsigned cached; /* 0: not probed yet; bit 31 marks a probed value */
    unsigned f = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (!f) {
        f = mpq__cpu_probe() | 0x80000000u;
        __atomic_store_n(&cached, f, __ATOMIC_RELAXED);
    }
    return f;
#else
    unsigned f = 0;
#ifdef MPQ__HAVE_AVX2
    f |= MPQ__CPU_AVX2;
#endif
#ifdef MPQ__HAVE_AVX512
    f |= MPQ__CPU_AVX512;
#endif
#ifdef MPQ__HAVE_VNNI
    f |= MPQ__CPU_VNNI;
#endif
    return f;
#endif
}

/* The kinds of lookup table a path reads (built by mpq__build_group). */
typedef enum mpq__tab {
    MPQ__TAB_FLOAT256,   /* 256-entry float tables per chunk (the mirror halves written out) */
    MPQ__TAB_FLOAT16,    /* two 16-entry float tables per chunk */
    MPQ__TAB_INT16,      /* int16 16-entry tables, the layout of the VNNI path */
    MPQ__TAB_INT16_LANES /* the same tables in two 16-byte lanes (AVX2 int, NEON) */
} mpq__tab;

#define MPQ__Q16_MAX_GROUP 1024 /* int32 sums are safe up to this group width: 256 lookups x 255 x 32639 < 2^31 */

/* ---- 5.2 The workspace and the tables of each input vector ---- */

/* Workspace of one input vector, each part 64-byte aligned:
     tab    1024 bytes per chunk of 8 columns: the scalar path's 256-entry
            float tables (mpq_lut128's and its mirror), the float SIMD
            paths' two 16-entry tables (first 128 bytes), or the int16
            tables (256 bytes per unit of up to 4 chunks)
     xt     x~: x gathered through p_col, times col_scale, zero past cols
     gsum   sum of x~ over each group (the z^ term)
     gscale the table scale of each group (int16 tables): a power of two, or s^_a with 8-bit activations */
typedef struct mpq__vecwork {
    size_t tab, xt, gsum, gscale, bytes;
} mpq__vecwork;

static mpq__vecwork mpq__vec_layout(const mpq_packed *A)
{
    const size_t nchunks = ((size_t)A->cols + 7u) / 8u, ng = (size_t)A->ngroups;
    mpq__vecwork w;
    w.tab = 0;
    w.xt = mpq__align64(nchunks * 1024u);
    w.gsum = w.xt + mpq__align64(nchunks * 8u * sizeof(float));
    w.gscale = w.gsum + mpq__align64(ng * sizeof(float));
    w.bytes = w.gscale + mpq__align64(ng * sizeof(float));
    return w;
}

/* Bytes after the vectors' workspaces: with a rotation, V x of every vector
   (batch x cols floats). */
static size_t mpq__rot_work_bytes(const mpq_packed *A, int batch)
{
    if (!A->rot.n) return 0;
    return mpq__align64(sizeof(float) * (size_t)batch * (size_t)A->cols);
}

static size_t mpq__bp_work_bytes(const mpq_packed *A, int batch)
{
    if (!A || batch < 1) return 0;
    return (size_t)batch * mpq__vec_layout(A).bytes + mpq__rot_work_bytes(A, batch);
}

#define MPQ__Q16_MAX 32639.0f /* 127 * 256 + 127: q = 256 hi + lo, signed bytes */

/* Units of the int16 tables of a group of nch chunks: one per 4 chunks, one
   for a trailing pair, one for a trailing single (the record's segments). */
static int mpq__units(int nch) { return nch / 4 + ((nch & 2) ? 1 : 0) + (nch & 1); }

#ifdef MPQ__HAVE_VNNI
/* The int16 tables of a group whose units are all full (nch a multiple of
   4), 16 entries a register: xt, the group's x~; inv = 2^-e. */
MPQ__T_VNNI static void mpq__build_q16_vnni(const float *xt, int nch, float inv, uint8_t *T)
{
    const __m512 sg0 = _mm512_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1);
    const __m512 sg1 = _mm512_setr_ps(-1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1);
    const __m512 sg2 = _mm512_setr_ps(-1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1);
    const __m512 sg3 = _mm512_setr_ps(-1, -1, -1, -1, -1, -1, -1, -1, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512 vinv = _mm512_set1_ps(inv), lim = _mm512_set1_ps(MPQ__Q16_MAX);
    for (int c = 0; c < nch; c++)
        for (int h = 0; h < 2; h++) {
            const float *a = xt + 8 * c + 4 * h;
            /* same operation order as mpq_lut16: ((+-a0 +- a1) +- a2) +- a3 */
            __m512 q = _mm512_mul_ps(sg0, _mm512_set1_ps(a[0]));
            q = _mm512_add_ps(q, _mm512_mul_ps(sg1, _mm512_set1_ps(a[1])));
            q = _mm512_add_ps(q, _mm512_mul_ps(sg2, _mm512_set1_ps(a[2])));
            q = _mm512_add_ps(q, _mm512_mul_ps(sg3, _mm512_set1_ps(a[3])));
            q = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(q, vinv), _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
            __m512i qi = _mm512_cvt_roundps_epi32(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            uint8_t *dst = T + (size_t)(c / 4) * 256u + (size_t)h * 128u + (size_t)(16 * (c % 4));
            _mm_storeu_si128((__m128i *)(void *)dst, _mm512_cvtepi32_epi8(qi));
            _mm_storeu_si128((__m128i *)(void *)(dst + 64),
                             _mm512_cvtepi32_epi8(_mm512_srai_epi32(_mm512_add_epi32(qi, _mm512_set1_epi32(128)), 8)));
        }
}
#endif

/* The int16 tables of MPQ_PATH_AVX2_INT. A unit's planes are read as
   registers of two 16-byte lanes, each lane one chunk of the unit for the
   16 rows of the tile (see mpq__avx2q_split): a full unit as the chunk pairs
   (0, 2) and (1, 3), a pair as (0, 1), a single chunk as (0, none). Each
   register has four tables, 32 bytes each, one 16-entry table per lane:
   columns 0-3 of the chunk (h = 0) low bytes, high bytes, then columns 4-7
   (h = 1) low bytes, high bytes; a unit is 256 bytes as on the VNNI path.
   The offset in its unit of entry 0 of the low-byte table of chunk `pos`,
   half h, in a unit of `count` chunks: */
static size_t mpq__q16_avx2_at(int count, int pos, int h)
{
    const int reg = count == 4 ? pos & 1 : 0, lane = count == 4 ? pos >> 1 : pos;
    return (size_t)reg * 128u + (size_t)h * 64u + (size_t)lane * 16u;
}

#ifdef MPQ__HAVE_AVX2
/* mpq__build_q16_vnni's tables in the layout of MPQ_PATH_AVX2_INT (every
   unit full), the same values: 16 entries as two registers of 8. */
MPQ__T_AVX2 static void mpq__build_q16_avx2(const float *xt, int nch, float inv, uint8_t *T)
{
    const __m256 sg0 = _mm256_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1), sg1 = _mm256_setr_ps(-1, -1, 1, 1, -1, -1, 1, 1);
    const __m256 sg2 = _mm256_setr_ps(-1, -1, -1, -1, 1, 1, 1, 1);
    const __m256 vinv = _mm256_set1_ps(inv), lim = _mm256_set1_ps(MPQ__Q16_MAX), nlim = _mm256_set1_ps(-MPQ__Q16_MAX);
    const __m256i pack = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                                          -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    for (int c = 0; c < nch; c++)
        for (int h = 0; h < 2; h++) {
            const float *a = xt + 8 * c + 4 * h;
            /* same operation order as mpq_lut16: ((+-a0 +- a1) +- a2) +- a3; entries 0-7 have -a3, 8-15 +a3 */
            __m256 q = _mm256_mul_ps(sg0, _mm256_set1_ps(a[0]));
            q = _mm256_add_ps(q, _mm256_mul_ps(sg1, _mm256_set1_ps(a[1])));
            q = _mm256_add_ps(q, _mm256_mul_ps(sg2, _mm256_set1_ps(a[2])));
            const __m256 a3 = _mm256_set1_ps(a[3]);
            __m256 qs[2] = {_mm256_sub_ps(q, a3), _mm256_add_ps(q, a3)};
            uint8_t *dst = T + (size_t)(c / 4) * 256u + mpq__q16_avx2_at(4, c % 4, h);
            for (int k = 0; k < 2; k++) {
                __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(qs[k], vinv), nlim), lim);
                __m256i qi = _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                __m256i hi = _mm256_srai_epi32(_mm256_add_epi32(qi, _mm256_set1_epi32(128)), 8);
                /* the low byte of each int32, 4 per lane, then the two lanes' 4 side by side */
                __m256i lo8 = _mm256_shuffle_epi8(qi, pack), hi8 = _mm256_shuffle_epi8(hi, pack);
                uint32_t l0 = (uint32_t)_mm256_extract_epi32(lo8, 0), l1 = (uint32_t)_mm256_extract_epi32(lo8, 4);
                uint32_t h0 = (uint32_t)_mm256_extract_epi32(hi8, 0), h1 = (uint32_t)_mm256_extract_epi32(hi8, 4);
                memcpy(dst + 8 * k, &l0, 4), memcpy(dst + 8 * k + 4, &l1, 4);
                memcpy(dst + 32 + 8 * k, &h0, 4), memcpy(dst + 32 + 8 * k + 4, &h1, 4);
            }
        }
}
#endif

/* Tables of group g of one vector: its part of x~ and its group sum first,
   then its tables of kind `tab`. MPQ_ERR_NONFINITE (and nothing written)
   when the group's columns of x hold NaN or Inf. */
static mpq_status mpq__build_group(const mpq_packed *A, const float *x, mpq__tab tab, int a8, uint8_t *w, int g)
{
    const mpq__vecwork L = mpq__vec_layout(A);
    const int nchunks = (A->cols + 7) / 8, cpg = A->group / 8;
    const int j0 = g * A->group, j1 = j0 + A->group < 8 * nchunks ? j0 + A->group : 8 * nchunks;
    const int c1 = (g + 1) * cpg < nchunks ? (g + 1) * cpg : nchunks;
    float *xt = (float *)(void *)(w + L.xt), *gsum = (float *)(void *)(w + L.gsum);
    float *gscale = (float *)(void *)(w + L.gscale);
    for (int j = j0; j < j1 && j < A->cols; j++)
        if (!mpq__finite(x[A->p_col ? A->p_col[j] : (uint32_t)j])) return MPQ_ERR_NONFINITE;
    for (int j = j0; j < j1; j++)
        xt[j] = j < A->cols ? x[A->p_col ? A->p_col[j] : (uint32_t)j] * (A->col_scale ? A->col_scale[j] : 1.0f) : 0.0f;
    if (a8) { /* x~ = q s^_a per group; s^_a is the group's table scale on the int16 paths */
        float amax = 0.0f;
        for (int j = j0; j < j1; j++) amax = fabsf(xt[j]) > amax ? fabsf(xt[j]) : amax;
        const float sh = mpq_f16_to_f32(mpq__act8_scale(amax));
        for (int j = j0; j < j1; j++) xt[j] = mpq__act8_code(xt[j], sh) * sh;
        gscale[g] = sh;
    }
    gsum[g] = 0.0f;
    for (int c = g * cpg; c < c1; c++) {
        const float *x8 = xt + 8 * c;
        gsum[g] += ((x8[0] + x8[1]) + (x8[2] + x8[3])) + ((x8[4] + x8[5]) + (x8[6] + x8[7]));
    }
    float *ft = (float *)(void *)(w + L.tab);
    switch (tab) {
    case MPQ__TAB_FLOAT256:
        for (int c = g * cpg; c < c1; c++) { /* the mirrored half written out: entry p >= 128 is -T[255 - p] */
            float *T = ft + (size_t)c * 256u;
            mpq_lut128(xt + 8 * c, T);
            for (int p = 128; p < 256; p++) T[p] = -T[255 - p];
        }
        break;
    case MPQ__TAB_INT16:
    case MPQ__TAB_INT16_LANES: {
        const int ufull = mpq__units(cpg), avx2 = tab == MPQ__TAB_INT16_LANES;
        const int c0 = g * cpg, nch = (A->cols - g * A->group < A->group ? (A->cols - g * A->group + 7) / 8 : cpg);
        float inv;
        if (a8) /* the tables are s^_a times integers: Q / s^_a rounds to them exactly */
            inv = gscale[g] > 0.0f ? 1.0f / gscale[g] : 0.0f;
        else { /* the power-of-two scale: smallest e with max|Q| / 2^e <= 32767 */
            float mx = 0.0f;
            for (int c = c0; c < c0 + nch; c++)
                for (int h = 0; h < 2; h++) {
                    const float *a = xt + 8 * c + 4 * h;
                    float sabs = ((fabsf(a[0]) + fabsf(a[1])) + fabsf(a[2])) + fabsf(a[3]);
                    mx = sabs > mx ? sabs : mx;
                }
            int e = 0;
            if (mx > 0.0f) {
                frexpf(mx, &e);
                e -= 15;
                if (ldexpf(mx, -e) > MPQ__Q16_MAX) e++;
            }
            gscale[g] = mx > 0.0f ? ldexpf(1.0f, e) : 0.0f;
            inv = mx > 0.0f ? ldexpf(1.0f, -e) : 0.0f;
        }
        uint8_t *T = w + L.tab + (size_t)g * (size_t)ufull * 256u;
        const int nq = nch / 4, nu = mpq__units(nch);
#ifdef MPQ__HAVE_VNNI
        if (!avx2 && nch % 4 == 0) { /* every unit full: 16 entries a register */
            mpq__build_q16_vnni(xt + 8 * c0, nch, inv, T);
            break;
        }
#endif
#ifdef MPQ__HAVE_AVX2
        if (avx2 && nch % 4 == 0) {
            mpq__build_q16_avx2(xt + 8 * c0, nch, inv, T);
            break;
        }
#endif
        memset(T, 0, (size_t)nu * 256u);
        for (int u = 0; u < nu; u++) {
            int first, count; /* chunks of this unit, as the record's segments */
            if (u < nq)
                first = 4 * u, count = 4;
            else if (u == nq && (nch & 2))
                first = 4 * nq, count = 2;
            else
                first = nch - 1, count = 1;
            for (int pos = 0; pos < count; pos++)
                for (int h = 0; h < 2; h++) {
                    float Q[16];
                    mpq_lut16(xt + 8 * (c0 + first + pos) + 4 * h, Q);
                    for (int p = 0; p < 16; p++) {
                        float qv = mpq__rne(Q[p] * inv);
                        /* clamped; NaN (activations whose sums overflow, Inf * 0) to 0 */
                        qv = qv > MPQ__Q16_MAX ? MPQ__Q16_MAX : (qv < -MPQ__Q16_MAX ? -MPQ__Q16_MAX : qv);
                        qv = qv == qv ? qv : 0.0f;
                        int q = (int)qv, lo = (int)(int8_t)(uint8_t)(q & 0xFF), hi = (q - lo) / 256;
                        uint8_t *e = T + (size_t)u * 256u +
                            (avx2 ? mpq__q16_avx2_at(count, pos, h) + (size_t)p
                                  : (size_t)h * 128u + (size_t)(16 * pos + p));
                        e[0] = (uint8_t)(lo & 0xFF);
                        e[avx2 ? 32 : 64] = (uint8_t)(hi & 0xFF);
                    }
                }
        }
        break;
    }
    case MPQ__TAB_FLOAT16:
        for (int c = g * cpg; c < c1; c++) {
            mpq_lut16(xt + 8 * c, ft + (size_t)c * 32u);
            mpq_lut16(xt + 8 * c + 4, ft + (size_t)c * 32u + 16u);
        }
        break;
    }
    return MPQ_OK;
}

/* ---- 5.3 Records as the kernels see them ---- */

#define MPQ__BATCH_STEP 8 /* vectors per pass over a tile's records */
#define MPQ__LOOKAHEAD  4 /* records prefetched ahead of the one in use */

/* Everything a tile kernel needs about one record. */
typedef struct mpq__rec {
    const uint8_t *p;                        /* the record */
    const uint8_t *pl;                       /* its first plane */
    int nch;                                 /* chunks of 8 columns */
    int i0, np;                              /* first plane read, planes read */
    int uniform;                             /* every row has the same width and skip */
    float mult[MPQ_MAX_BITS][MPQ_TILE_ROWS]; /* non-uniform: weight of plane i0+p for row r, or 0 */
} mpq__rec;

/* Which planes of record (t, g) count for each row, after skip_planes. */
static void mpq__rec_setup(const mpq__shape *s, const uint8_t *data, uint64_t pos, int t, int g, int skip, mpq__rec *R)
{
    const int r0 = t * MPQ_TILE_ROWS, nr = s->rows - r0 < MPQ_TILE_ROWS ? s->rows - r0 : MPQ_TILE_ROWS;
    const int B = mpq__tile_planes(s, t, g);
    R->p = data + pos;
    R->pl = R->p + s->meta;
    R->nch = mpq__nch(s, g);
    int bmin = B;
    for (int br = r0 / s->block_rows; br <= (r0 + nr - 1) / s->block_rows; br++) {
        int w = s->bits[(size_t)br * (size_t)s->ngroups + (size_t)g];
        bmin = w < bmin ? w : bmin;
    }
    R->uniform = bmin == B;
    int i0 = B;
    int sk[MPQ_TILE_ROWS], w[MPQ_TILE_ROWS];
    for (int r = 0; r < MPQ_TILE_ROWS; r++) {
        w[r] = r < nr ? mpq__bits_at(s, r0 + r, g) : B; /* padding rows: zero pairs, any width */
        sk[r] = mpq_first_plane(w[r], skip);
        i0 = sk[r] < i0 ? sk[r] : i0;
        if (R->uniform) break;
    }
    R->i0 = i0;
    R->np = B - i0;
    if (!R->uniform)
        for (int p = 0; p < R->np; p++)
            for (int r = 0; r < MPQ_TILE_ROWS; r++) {
                int i = i0 + p;
                R->mult[p][r] = (i >= sk[r] && i < w[r]) ? (float)(1 << i) : 0.0f;
            }
}

/* Walkers of tiles t0 .. t0+nt-1, one task's; the first records of the
   next nt tiles (the task a thread takes next: threads take runs of tasks)
   are prefetched. */
static void mpq__walk_block(const mpq__shape *s, const mpq_packed *A, int t0, int nt, int skip, mpq__walk *w)
{
    for (int k = 0; k < nt; k++) {
        mpq__walk_init(&w[k], s, A->band_off, A->data, t0 + k);
        w[k].skip = skip;
        mpq__walk_warm(s, A->band_off, A->data, t0 + nt + k, MPQ__LOOKAHEAD, skip);
    }
}

/* The next record of walker w (group g of its tile) into R, its planes
   after skip_planes; returns the planes it stores. */
static int mpq__walk_rec(const mpq__shape *s, const uint8_t *data, mpq__walk *w, int g, int skip, mpq__rec *R)
{
    const int B = mpq__walk_planes(w, g);
    const uint8_t *rec = mpq__walk_next(w, MPQ__LOOKAHEAD);
    MPQ_ASSERT(B >= 1 && B <= MPQ_MAX_BITS);
    if (w->uniform) {
        R->p = rec;
        R->pl = rec + s->meta;
        R->nch = mpq__nch(s, g);
        R->uniform = 1;
        R->i0 = mpq_first_plane(B, skip);
        R->np = B - R->i0;
    } else
        mpq__rec_setup(s, data, (uint64_t)(rec - data), w->t, g, skip, R);
    return B;
}

static float mpq__plane_weight(const mpq__rec *R, int p, int r)
{
    return R->uniform ? (float)(1 << (R->i0 + p)) : R->mult[p][r];
}

/* ---- 5.4 The kernels of each path (sub-banners below) ---- */

/* ---- scalar path: 256-entry tables, one byte = 8 weights ---- */

/* All 16 rows of a record, plane by plane, a row's chunks in order (the
   group's tables, 1 KB a chunk, stay in L1 while the 16 rows use them); the
   16 rows are independent chains. */
static void mpq__tile_scalar(const mpq__rec *R, const float *T, float acc[MPQ_TILE_ROWS])
{
    const size_t pbytes = (size_t)R->nch * 16u;
    const int nq = R->nch / 4;
    const size_t tail = (size_t)nq * 64u; /* the pair, then the single chunk, after the full units */
    const float *Tt = T + (size_t)nq * 1024u;
    for (int r = 0; r < MPQ_TILE_ROWS; r++) acc[r] = 0.0f;
    for (int p = 0; p < R->np; p++) {
        const uint8_t *q = R->pl + (size_t)(R->i0 + p) * pbytes;
        for (int r = 0; r < MPQ_TILE_ROWS; r++) {
            const uint8_t *qr = q + 4 * r;
            const float *t = T;
            float s = 0.0f;
            for (int u = 0; u < nq; u++, qr += 64, t += 1024) {
                s += t[qr[0]];
                s += t[256 + qr[1]];
                s += t[512 + qr[2]];
                s += t[768 + qr[3]];
            }
            if (R->nch & 2) {
                s += Tt[q[tail + 2 * r]];
                s += Tt[256 + q[tail + 2 * r + 1]];
            }
            if (R->nch & 1) s += Tt[(R->nch & 2 ? 512 : 0) + q[tail + (R->nch & 2 ? 32 : 0) + r]];
            acc[r] += s * mpq__plane_weight(R, p, r);
        }
    }
}

/* ---- AVX-512 path: 16-entry float tables, vpermps looks up 16 rows ---- */
#ifdef MPQ__HAVE_AVX512
/* lane r of v holds nq nibbles of row r; nibble k indexes table Q + 16k. */
MPQ__INLINE MPQ__T_AVX512 __m512 mpq__lk512(__m512i v, const __m512 *t, int nq)
{
    __m512 a = _mm512_permutexvar_ps(v, t[0]);
    __m512 b = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), t[1]);
    if (nq == 2) return _mm512_add_ps(a, b);
    a = _mm512_add_ps(a, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 8), t[2]));
    b = _mm512_add_ps(b, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 12), t[3]));
    if (nq == 4) return _mm512_add_ps(a, b);
    __m512 c = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 16), t[4]);
    __m512 d = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 20), t[5]);
    c = _mm512_add_ps(c, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 24), t[6]));
    d = _mm512_add_ps(d, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 28), t[7]));
    return _mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d));
}

/* sum over planes p < NP of weight_p * (lookups of plane i0 + p); NP is a
   compile-time constant in each caller so the accumulators stay in registers. */
MPQ__INLINE MPQ__T_AVX512 __m512 mpq__group512(const mpq__rec *R, const float *Q, const int NP)
{
    const uint8_t *pl = R->pl + (size_t)R->i0 * (size_t)R->nch * 16u;
    const size_t pb = (size_t)R->nch * 16u;
    const int nq = R->nch >> 2;
    __m512 acc[MPQ_MAX_BITS], t[8];
    for (int p = 0; p < NP; p++) acc[p] = _mm512_setzero_ps();
    for (int u = 0; u < nq; u++) {
        for (int k = 0; k < 8; k++) t[k] = _mm512_loadu_ps(Q + (size_t)(8 * u + k) * 16u);
        for (int p = 0; p < NP; p++)
            acc[p] = _mm512_add_ps(acc[p],
                                   mpq__lk512(_mm512_loadu_si512((const void *)(pl + p * pb + (size_t)u * 64u)), t, 8));
    }
    size_t off = (size_t)nq * 64u;
    const float *Qr = Q + (size_t)nq * 128u;
    if (R->nch & 2) {
        for (int k = 0; k < 4; k++) t[k] = _mm512_loadu_ps(Qr + 16 * k);
        for (int p = 0; p < NP; p++)
            acc[p] = _mm512_add_ps(acc[p],
                                   mpq__lk512(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                                  (const __m256i *)(const void *)(pl + p * pb + off))),
                                              t, 4));
        off += 32u;
        Qr += 64;
    }
    if (R->nch & 1) {
        for (int k = 0; k < 2; k++) t[k] = _mm512_loadu_ps(Qr + 16 * k);
        for (int p = 0; p < NP; p++)
            acc[p] = _mm512_add_ps(
                acc[p],
                mpq__lk512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(pl + p * pb + off))), t,
                           2));
    }
    __m512 r = _mm512_setzero_ps();
    for (int p = 0; p < NP; p++)
        r = _mm512_fmadd_ps(acc[p],
                            R->uniform ? _mm512_set1_ps((float)(1 << (R->i0 + p))) : _mm512_loadu_ps(R->mult[p]), r);
    return r;
}

MPQ__T_AVX512 static __m512 mpq__group512_any(const mpq__rec *R, const float *Q)
{
    switch (R->np) {
    case 1: return mpq__group512(R, Q, 1);
    case 2: return mpq__group512(R, Q, 2);
    case 3: return mpq__group512(R, Q, 3);
    case 4: return mpq__group512(R, Q, 4);
    case 5: return mpq__group512(R, Q, 5);
    case 6: return mpq__group512(R, Q, 6);
    case 7: return mpq__group512(R, Q, 7);
    default: return mpq__group512(R, Q, 8);
    }
}

/* y += s^ (the record's sum) + z^ gs, for its 16 rows. */
MPQ__T_AVX512 static void mpq__rec512(const mpq__rec *R, const float *Q, const float *sh, const float *zh, float gs,
                                      float *y)
{
    __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(sh), mpq__group512_any(R, Q), _mm512_loadu_ps(y));
    _mm512_storeu_ps(y, _mm512_fmadd_ps(_mm512_loadu_ps(zh), _mm512_set1_ps(gs), v));
}
#endif

/* ---- AVX-512 VBMI + VNNI path: int16 tables, vpermb looks up 64 bytes ---- */
#ifdef MPQ__HAVE_VNNI
#define MPQ__VNNI_TILES 4 /* tiles (64 rows) sharing the group's tables in L1 */

/* One 64-byte unit of one plane: lane r of v = 4 bytes = 4 chunks of row r.
   Byte position p of a lane selects table p of the unit (index = nibble |
   p << 4); the int16 entries are 256 hi + lo with signed bytes in separate
   64-entry tables; vpdpbusd multiplies each looked-up byte by the row's
   plane weight (u8 in m: 2^i, or 0 for a plane the row does not use) and
   adds the 4 bytes of a lane, i.e. of one row. */
MPQ__INLINE MPQ__T_VNNI void mpq__lkq(__m512i v, const __m512i *t, __m512i m, __m512i *acc)
{
    const __m512i m0f = _mm512_set1_epi8(0x0F), pos = _mm512_set1_epi32(0x30201000);
    __m512i il = _mm512_ternarylogic_epi32(v, m0f, pos, 0xEA); /* (v & 0x0F) | pos */
    __m512i ih = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m0f, pos, 0xEA);
    /* four independent sums (low/high byte x low/high nibble): vpdpbusd's
       latency, not its throughput, would bound a single chain */
    acc[0] = _mm512_dpbusd_epi32(acc[0], m, _mm512_permutexvar_epi8(il, t[0]));
    acc[1] = _mm512_dpbusd_epi32(acc[1], m, _mm512_permutexvar_epi8(il, t[1]));
    acc[2] = _mm512_dpbusd_epi32(acc[2], m, _mm512_permutexvar_epi8(ih, t[2]));
    acc[3] = _mm512_dpbusd_epi32(acc[3], m, _mm512_permutexvar_epi8(ih, t[3]));
}

/* One plane of one segment: a full unit (kind 4), a pair or a single chunk. */
MPQ__INLINE MPQ__T_VNNI __m512i mpq__lkq_load(const uint8_t *a, int kind)
{
    return kind == 4 ? _mm512_loadu_si512((const void *)a)
        : kind == 2  ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)a))
                     : _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)a));
}

/* All planes of one segment of a record: even planes into acc[0..3], odd
   ones into acc[4..7], eight chains in flight. */
MPQ__INLINE MPQ__T_VNNI void mpq__lkq_planes(const uint8_t *pl, size_t pb, int np, int kind, const __m512i *tb,
                                             const __m512i *m, __m512i *acc)
{
    int p = 0;
    for (; p + 1 < np; p += 2) {
        mpq__lkq(mpq__lkq_load(pl + (size_t)p * pb, kind), tb, m[p], acc);
        mpq__lkq(mpq__lkq_load(pl + (size_t)(p + 1) * pb, kind), tb, m[p + 1], acc + 4);
    }
    if (p < np) mpq__lkq(mpq__lkq_load(pl + (size_t)p * pb, kind), tb, m[p], acc);
}

/* The planes of one record against the group's tables: sum of the int16
   entries times the plane weights, per row (lane). NP is a compile-time
   constant in each instance (see mpq__vnni_rec_any), so that a record costs
   one predictable dispatch instead of a loop whose trip count changes from
   record to record in mixed-width matrices. */
MPQ__INLINE MPQ__T_VNNI __m512i mpq__vnni_rec(const uint8_t *pl, size_t pb, int nch, const uint8_t *T, const __m512i *m,
                                              const int NP)
{
    __m512i tb[4], acc[8];
    for (int a = 0; a < 8; a++) acc[a] = _mm512_setzero_si512();
    const int nq = nch >> 2;
    for (int u = 0; u < nq; u++, T += 256, pl += 64) {
        for (int q = 0; q < 4; q++) tb[q] = _mm512_loadu_si512((const void *)(T + 64 * q));
        mpq__lkq_planes(pl, pb, NP, 4, tb, m, acc);
    }
    if (nch & 2) {
        for (int q = 0; q < 4; q++) tb[q] = _mm512_loadu_si512((const void *)(T + 64 * q));
        mpq__lkq_planes(pl, pb, NP, 2, tb, m, acc);
        pl += 32;
        T += 256;
    }
    if (nch & 1) {
        for (int q = 0; q < 4; q++) tb[q] = _mm512_loadu_si512((const void *)(T + 64 * q));
        mpq__lkq_planes(pl, pb, NP, 1, tb, m, acc);
    }
    /* low-byte sums + 256 * high-byte sums */
    __m512i lo = _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[2]), _mm512_add_epi32(acc[4], acc[6]));
    __m512i hi = _mm512_add_epi32(_mm512_add_epi32(acc[1], acc[3]), _mm512_add_epi32(acc[5], acc[7]));
    return _mm512_add_epi32(lo, _mm512_slli_epi32(hi, 8));
}

MPQ__T_VNNI static __m512i mpq__vnni_rec_any(const uint8_t *pl, size_t pb, int nch, const uint8_t *T, const __m512i *m,
                                             int np)
{
    switch (np) {
    case 1: return mpq__vnni_rec(pl, pb, nch, T, m, 1);
    case 2: return mpq__vnni_rec(pl, pb, nch, T, m, 2);
    case 3: return mpq__vnni_rec(pl, pb, nch, T, m, 3);
    case 4: return mpq__vnni_rec(pl, pb, nch, T, m, 4);
    case 5: return mpq__vnni_rec(pl, pb, nch, T, m, 5);
    case 6: return mpq__vnni_rec(pl, pb, nch, T, m, 6);
    case 7: return mpq__vnni_rec(pl, pb, nch, T, m, 7);
    default: return mpq__vnni_rec(pl, pb, nch, T, m, 8);
    }
}

/* The planes of one record against NV vectors' tables at once (NV <= 4):
   a plane's lookup indices are formed once for all of them, and each
   vector's four tables of a unit stay in registers across the planes.
   tot[j] is mpq__vnni_rec's result for the tables T[j], the same integers
   (int32 addition in another order). */
MPQ__INLINE MPQ__T_VNNI void mpq__vnni_rec_nv(const uint8_t *pl, size_t pb, int nch, const uint8_t *const *T,
                                              const __m512i *m, int np, const int NV, __m512i *tot)
{
    const __m512i m0f = _mm512_set1_epi8(0x0F), pos = _mm512_set1_epi32(0x30201000);
    __m512i lo[4], hi[4], tb[4][4];
    for (int j = 0; j < NV; j++) lo[j] = hi[j] = _mm512_setzero_si512();
    const int nq = nch >> 2, nseg = nq + ((nch & 2) ? 1 : 0) + (nch & 1);
    size_t toff = 0;
    for (int u = 0; u < nseg; u++, toff += 256) {
        const int kind = u < nq ? 4 : (u == nq && (nch & 2)) ? 2 : 1;
        for (int j = 0; j < NV; j++)
            for (int q = 0; q < 4; q++) tb[j][q] = _mm512_loadu_si512((const void *)(T[j] + toff + 64 * q));
        for (int p = 0; p < np; p++) {
            const __m512i v = mpq__lkq_load(pl + (size_t)p * pb, kind);
            const __m512i il = _mm512_ternarylogic_epi32(v, m0f, pos, 0xEA);
            const __m512i ih = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m0f, pos, 0xEA);
            for (int j = 0; j < NV; j++) {
                lo[j] = _mm512_dpbusd_epi32(lo[j], m[p], _mm512_permutexvar_epi8(il, tb[j][0]));
                hi[j] = _mm512_dpbusd_epi32(hi[j], m[p], _mm512_permutexvar_epi8(il, tb[j][1]));
                lo[j] = _mm512_dpbusd_epi32(lo[j], m[p], _mm512_permutexvar_epi8(ih, tb[j][2]));
                hi[j] = _mm512_dpbusd_epi32(hi[j], m[p], _mm512_permutexvar_epi8(ih, tb[j][3]));
            }
        }
        pl += kind * 16;
    }
    for (int j = 0; j < NV; j++) tot[j] = _mm512_add_epi32(lo[j], _mm512_slli_epi32(hi[j], 8));
}

/* One record of a tile block: where it is and which planes count. */
typedef struct mpq__qrec {
    const uint8_t *p;
    int b, i0, np;
    __m512i m[MPQ_MAX_BITS]; /* plane weights, u8 in every byte of a row's lane */
} mpq__qrec;

/* Tiles t0 .. t0+nt-1 (at most MPQ__VNNI_TILES), vectors b0 .. b0+nb-1,
   group by group: the group's tables are read from L2 once for the whole
   block, and a record's planes from memory once for all vectors, which
   take it four at a time (mpq__vnni_rec_nv; a lone vector takes
   mpq__vnni_rec's eight chains). y~ of tile t0+k, vector b0+v into
   yt[k][v]. */
MPQ__T_VNNI static void mpq__tiles_vnni(const mpq__shape *s, const mpq_packed *A, int t0, int nt, const uint8_t *work,
                                        size_t vstride, int b0, int nb, int skip,
                                        float (*yt)[MPQ__BATCH_STEP][MPQ_TILE_ROWS])
{
    const mpq__vecwork L = mpq__vec_layout(A);
    const int cpg = s->group / 8, ng = s->ngroups, nch_last = mpq__nch(s, ng - 1);
    const size_t qstride = (size_t)mpq__units(cpg) * 256u;
    mpq__walk w[MPQ__VNNI_TILES];
    mpq__walk_block(s, A, t0, nt, skip, w);
    for (int k = 0; k < nt; k++)
        for (int v = 0; v < nb; v++) _mm512_storeu_ps(yt[k][v], _mm512_setzero_ps());
    mpq__qrec R[MPQ__VNNI_TILES];
    mpq__rec G; /* the general (non-uniform) description, when needed */
    for (int g = 0; g < ng; g++) {
        const int nch = g < ng - 1 ? cpg : nch_last;
        const size_t pb = (size_t)nch * 16u;
        for (int k = 0; k < nt; k++) {
            const int B = mpq__walk_planes(&w[k], g);
            MPQ_ASSERT(B >= 1 && B <= MPQ_MAX_BITS);
            R[k].p = mpq__walk_next(&w[k], MPQ__LOOKAHEAD);
            R[k].b = B;
            if (w[k].uniform) {
                R[k].i0 = mpq_first_plane(B, skip);
                R[k].np = B - R[k].i0;
                for (int p = 0; p < R[k].np; p++) R[k].m[p] = _mm512_set1_epi8((char)(1u << (R[k].i0 + p)));
            } else {
                mpq__rec_setup(s, A->data, (uint64_t)(R[k].p - A->data), t0 + k, g, skip, &G);
                R[k].i0 = G.i0;
                R[k].np = G.np;
                for (int p = 0; p < G.np; p++)
                    R[k].m[p] = G.uniform ? _mm512_set1_epi8((char)(1u << (G.i0 + p)))
                                          : _mm512_mullo_epi32(_mm512_cvttps_epi32(_mm512_loadu_ps(G.mult[p])),
                                                               _mm512_set1_epi32(0x01010101));
            }
        }
        for (int k = 0; k < nt; k++) {
            __m512 sh, zh;     /* the rows' s^ and z^ */
            if (!s->f->e8m0) { /* fp16 s^ of the 16 rows, then z^ */
                sh = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)R[k].p));
                zh = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(R[k].p + 32)));
            } else if (w[k].uniform) { /* E8M0: s^ = 2^(X - k + 1) = 2^(byte - 127 - k + 1), z^ = -s^ */
                __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)R[k].p));
                sh = _mm512_scalef_ps(_mm512_set1_ps(1.0f),
                                      _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(126 + R[k].b))));
                zh = _mm512_sub_ps(_mm512_setzero_ps(), sh);
            } else {
                float shf[MPQ_TILE_ROWS], zhf[MPQ_TILE_ROWS];
                mpq__rec_pairs(s, R[k].p, t0 + k, g, 0, shf, zhf);
                sh = _mm512_loadu_ps(shf);
                zh = _mm512_loadu_ps(zhf);
            }
            const uint8_t *pl = R[k].p + s->meta + (size_t)R[k].i0 * pb;
            for (int v0 = 0; v0 < nb; v0 += 4) {
                const int nv = nb - v0 < 4 ? nb - v0 : 4;
                const uint8_t *T[4];
                __m512i tot[4];
                for (int j = 0; j < nv; j++)
                    T[j] = work + (size_t)(b0 + v0 + j) * vstride + L.tab + (size_t)g * qstride;
                switch (nv) {
                case 1: tot[0] = mpq__vnni_rec_any(pl, pb, nch, T[0], R[k].m, R[k].np); break;
                case 2: mpq__vnni_rec_nv(pl, pb, nch, T, R[k].m, R[k].np, 2, tot); break;
                case 3: mpq__vnni_rec_nv(pl, pb, nch, T, R[k].m, R[k].np, 3, tot); break;
                default: mpq__vnni_rec_nv(pl, pb, nch, T, R[k].m, R[k].np, 4, tot); break;
                }
                for (int j = 0; j < nv; j++) {
                    const int v = v0 + j;
                    const uint8_t *vw = work + (size_t)(b0 + v) * vstride;
                    const float gsc = ((const float *)(const void *)(vw + L.gscale))[g];
                    const float gs = ((const float *)(const void *)(vw + L.gsum))[g];
                    const __m512 acc = _mm512_mul_ps(_mm512_cvtepi32_ps(tot[j]), _mm512_set1_ps(gsc));
                    __m512 y = _mm512_fmadd_ps(sh, acc, _mm512_loadu_ps(yt[k][v]));
                    _mm512_storeu_ps(yt[k][v], _mm512_fmadd_ps(zh, _mm512_set1_ps(gs), y));
                }
            }
        }
    }
}
#endif

/* ---- AVX2 path: 16-entry tables as two 8-entry halves, 8 rows a register ---- */
#ifdef MPQ__HAVE_AVX2
MPQ__INLINE MPQ__T_AVX2 __m256 mpq__lk256_1(__m256i idx, const float *Q)
{
    __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(Q), idx);
    __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(Q + 8), idx);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

MPQ__INLINE MPQ__T_AVX2 __m256 mpq__lk256(__m256i v, const float *Q, int nq)
{
    __m256 a = mpq__lk256_1(v, Q), b = mpq__lk256_1(_mm256_srli_epi32(v, 4), Q + 16);
    for (int k = 2; k < nq; k += 2) {
        a = _mm256_add_ps(a, mpq__lk256_1(_mm256_srli_epi32(v, 4 * k), Q + 16 * k));
        b = _mm256_add_ps(b, mpq__lk256_1(_mm256_srli_epi32(v, 4 * k + 4), Q + 16 * k + 16));
    }
    return _mm256_add_ps(a, b);
}

/* One half (rows 8h .. 8h+7) of a record. */
MPQ__INLINE MPQ__T_AVX2 __m256 mpq__group256(const mpq__rec *R, const float *Q, int h, const int NP)
{
    const uint8_t *pl = R->pl + (size_t)R->i0 * (size_t)R->nch * 16u;
    const size_t pb = (size_t)R->nch * 16u;
    const int nq = R->nch >> 2;
    __m256 acc[MPQ_MAX_BITS];
    for (int p = 0; p < NP; p++) acc[p] = _mm256_setzero_ps();
    for (int u = 0; u < nq; u++)
        for (int p = 0; p < NP; p++)
            acc[p] = _mm256_add_ps(
                acc[p],
                mpq__lk256(_mm256_loadu_si256(
                               (const __m256i *)(const void *)(pl + p * pb + (size_t)u * 64u + 32u * (size_t)h)),
                           Q + (size_t)u * 128u, 8));
    size_t off = (size_t)nq * 64u;
    const float *Qr = Q + (size_t)nq * 128u;
    if (R->nch & 2) {
        for (int p = 0; p < NP; p++)
            acc[p] = _mm256_add_ps(acc[p],
                                   mpq__lk256(_mm256_cvtepu16_epi32(_mm_loadu_si128((
                                                  const __m128i *)(const void *)(pl + p * pb + off + 16u * (size_t)h))),
                                              Qr, 4));
        off += 32u;
        Qr += 64;
    }
    if (R->nch & 1)
        for (int p = 0; p < NP; p++)
            acc[p] = _mm256_add_ps(acc[p],
                                   mpq__lk256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                                  (const __m128i *)(const void *)(pl + p * pb + off + 8u * (size_t)h))),
                                              Qr, 2));
    __m256 r = _mm256_setzero_ps();
    for (int p = 0; p < NP; p++)
        r = _mm256_fmadd_ps(
            acc[p], R->uniform ? _mm256_set1_ps((float)(1 << (R->i0 + p))) : _mm256_loadu_ps(R->mult[p] + 8 * h), r);
    return r;
}

MPQ__T_AVX2 static __m256 mpq__group256_any(const mpq__rec *R, const float *Q, int h)
{
    switch (R->np) {
    case 1: return mpq__group256(R, Q, h, 1);
    case 2: return mpq__group256(R, Q, h, 2);
    case 3: return mpq__group256(R, Q, h, 3);
    case 4: return mpq__group256(R, Q, h, 4);
    case 5: return mpq__group256(R, Q, h, 5);
    case 6: return mpq__group256(R, Q, h, 6);
    case 7: return mpq__group256(R, Q, h, 7);
    default: return mpq__group256(R, Q, h, 8);
    }
}

/* y += s^ (the record's sum) + z^ gs, for its 16 rows, 8 at a time. */
MPQ__T_AVX2 static void mpq__rec256(const mpq__rec *R, const float *Q, const float *sh, const float *zh, float gs,
                                    float *y)
{
    for (int h = 0; h < 2; h++) {
        __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(sh + 8 * h), mpq__group256_any(R, Q, h), _mm256_loadu_ps(y + 8 * h));
        _mm256_storeu_ps(y + 8 * h, _mm256_fmadd_ps(_mm256_loadu_ps(zh + 8 * h), _mm256_set1_ps(gs), v));
    }
}

/* ---- AVX2 int16-table path: vpshufb looks up 32 bytes, vpmaddubsw sums ---- */
#define MPQ__AVX2Q_TILES 4                        /* tiles (64 rows) sharing the group's tables in L1 */
#define MPQ__AVX2Q_IX    (MPQ__Q16_MAX_GROUP / 8) /* index registers of one plane of the widest group */

/* One plane of a record (nch chunks) as vpshufb indices, a pair of
   registers per 32 bytes: the low nibbles (columns 0-3 of each chunk), then
   the high ones (columns 4-7); byte r of a lane is row r, each lane one
   chunk: a full unit as the chunk pairs (0, 2) and (1, 3), a pair as (0, 1),
   a single chunk as (0, none). A unit's 64 bytes hold 4 bytes per row (row
   r: bytes 4r .. 4r+3, one per chunk): a byte shuffle turns each 16-byte
   lane into 4 dwords of 4 rows each, one dword per chunk, and a dword
   permute gathers a chunk's dwords into 8-byte halves of the lanes; a
   pair's 32 bytes (2 per row) likewise. */
MPQ__T_AVX2 static void mpq__avx2q_split(const uint8_t *q, int nch, __m256i *ix)
{
    const __m256i tr4 = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13,
                                         2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i tr2 = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                         14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), m0f = _mm256_set1_epi8(0x0F);
    __m256i *o = ix;
    for (int u = 0; u < nch >> 2; u++, q += 64) {
        const __m256i a = _mm256_permutevar8x32_epi32(
            _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(const void *)q), tr4), perm);
        const __m256i b = _mm256_permutevar8x32_epi32(
            _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(const void *)(q + 32)), tr4), perm);
        const __m256i c02 = _mm256_unpacklo_epi64(a, b), c13 = _mm256_unpackhi_epi64(a, b);
        *o++ = _mm256_and_si256(c02, m0f);
        *o++ = _mm256_and_si256(_mm256_srli_epi16(c02, 4), m0f);
        *o++ = _mm256_and_si256(c13, m0f);
        *o++ = _mm256_and_si256(_mm256_srli_epi16(c13, 4), m0f);
    }
    if (nch & 2) {
        const __m256i a = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(const void *)q), tr2), 0xD8);
        *o++ = _mm256_and_si256(a, m0f);
        *o++ = _mm256_and_si256(_mm256_srli_epi16(a, 4), m0f);
        q += 32;
    }
    if (nch & 1) { /* lane 1 looks up entry 0 of zero tables */
        const __m256i a =
            _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)(const void *)q), 0);
        *o++ = _mm256_and_si256(a, m0f);
        *o++ = _mm256_and_si256(_mm256_srli_epi16(a, 4), m0f);
    }
}

/* The lookups of one register pair (n0, n1) in its four tables T
   (mpq__q16_avx2_at): the columns 0-3 and 4-7 of each row summed by
   vpmaddubsw into int16, acc[0] low table bytes of rows 0-7, acc[1] of rows
   8-15, acc[2], acc[3] the high bytes; lane k of each accumulator is the
   chunk of lane k. */
MPQ__INLINE MPQ__T_AVX2 void mpq__lk2q(__m256i n0, __m256i n1, const uint8_t *T, __m256i *acc)
{
    const __m256i ones = _mm256_set1_epi8(1);
    const __m256i l0 = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(const void *)T), n0);
    const __m256i h0 = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(const void *)(T + 32)), n0);
    const __m256i l1 = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(const void *)(T + 64)), n1);
    const __m256i h1 = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(const void *)(T + 96)), n1);
    acc[0] = _mm256_add_epi16(acc[0], _mm256_maddubs_epi16(ones, _mm256_unpacklo_epi8(l0, l1)));
    acc[1] = _mm256_add_epi16(acc[1], _mm256_maddubs_epi16(ones, _mm256_unpackhi_epi8(l0, l1)));
    acc[2] = _mm256_add_epi16(acc[2], _mm256_maddubs_epi16(ones, _mm256_unpacklo_epi8(h0, h1)));
    acc[3] = _mm256_add_epi16(acc[3], _mm256_maddubs_epi16(ones, _mm256_unpackhi_epi8(h0, h1)));
}

/* One plane against one vector's tables T of the group: per row, the sum
   of the int16 entries looked up, as int32 in the row order of v[0] = rows
   0-3 | 8-11, v[1] = rows 4-7 | 12-15. The two lanes (two chunks) are added
   in int16 first: a row's low-byte (or high-byte) sum over the whole group
   is at most 2 x 128 per chunk in magnitude, inside int16 up to 128 chunks
   (1024 columns, the widest group the int16 tables take); vpmaddwd then
   forms low + 256 high. */
MPQ__T_AVX2 static void mpq__avx2q_plane(const __m256i *ix, int nch, const uint8_t *T, __m256i v[2])
{
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int u = 0; u < nch >> 2; u++, ix += 4, T += 256) {
        mpq__lk2q(ix[0], ix[1], T, acc);
        mpq__lk2q(ix[2], ix[3], T + 128, acc);
    }
    if (nch & 2) {
        mpq__lk2q(ix[0], ix[1], T, acc);
        ix += 2;
        T += 256;
    }
    if (nch & 1) mpq__lk2q(ix[0], ix[1], T, acc);
    const __m256i lo = _mm256_add_epi16(_mm256_permute2x128_si256(acc[0], acc[1], 0x20),
                                        _mm256_permute2x128_si256(acc[0], acc[1], 0x31));
    const __m256i hi = _mm256_add_epi16(_mm256_permute2x128_si256(acc[2], acc[3], 0x20),
                                        _mm256_permute2x128_si256(acc[2], acc[3], 0x31));
    const __m256i k = _mm256_set1_epi32(0x01000001); /* int16 pairs (1, 256) */
    v[0] = _mm256_madd_epi16(_mm256_unpacklo_epi16(lo, hi), k);
    v[1] = _mm256_madd_epi16(_mm256_unpackhi_epi16(lo, hi), k);
}

/* Tiles t0 .. t0+nt-1 (at most MPQ__AVX2Q_TILES), vectors b0 .. b0+nb-1,
   group by group: each plane is split into indices once for all vectors,
   and the group's tables are read from L2 once for the whole block. y~ of
   tile t0+k, vector b0+v into yt[k][v]. */
MPQ__T_AVX2 static void mpq__tiles_avx2q(const mpq__shape *s, const mpq_packed *A, int t0, int nt, const uint8_t *work,
                                         size_t vstride, int b0, int nb, int skip,
                                         float (*yt)[MPQ__BATCH_STEP][MPQ_TILE_ROWS])
{
    const mpq__vecwork L = mpq__vec_layout(A);
    const int cpg = s->group / 8, ng = s->ngroups;
    const size_t qstride = (size_t)mpq__units(cpg) * 256u;
    mpq__walk w[MPQ__AVX2Q_TILES];
    mpq__walk_block(s, A, t0, nt, skip, w);
    memset(yt, 0, sizeof yt[0] * (size_t)nt);
    mpq__rec R;
    __m256i ix[MPQ__AVX2Q_IX], tot[MPQ__BATCH_STEP][2];
    for (int g = 0; g < ng; g++)
        for (int k = 0; k < nt; k++) {
            const int B = mpq__walk_rec(s, A->data, &w[k], g, skip, &R);
            const uint8_t *rec = R.p;
            const size_t pb = (size_t)R.nch * 16u;
            for (int v = 0; v < nb; v++) tot[v][0] = tot[v][1] = _mm256_setzero_si256();
            for (int p = 0; p < R.np; p++) {
                __m256i wa, wb; /* the plane's weight per row, in the order of mpq__avx2q_plane */
                if (R.uniform)
                    wa = wb = _mm256_set1_epi32(1 << (R.i0 + p));
                else {
                    const __m256i m0 = _mm256_cvttps_epi32(_mm256_loadu_ps(R.mult[p]));
                    const __m256i m1 = _mm256_cvttps_epi32(_mm256_loadu_ps(R.mult[p] + 8));
                    wa = _mm256_permute2x128_si256(m0, m1, 0x20);
                    wb = _mm256_permute2x128_si256(m0, m1, 0x31);
                }
                mpq__avx2q_split(R.pl + (size_t)(R.i0 + p) * pb, R.nch, ix);
                for (int v = 0; v < nb; v++) {
                    __m256i pv[2];
                    mpq__avx2q_plane(ix, R.nch, work + (size_t)(b0 + v) * vstride + L.tab + (size_t)g * qstride, pv);
                    tot[v][0] = _mm256_add_epi32(tot[v][0], _mm256_mullo_epi32(pv[0], wa));
                    tot[v][1] = _mm256_add_epi32(tot[v][1], _mm256_mullo_epi32(pv[1], wb));
                }
            }
            float sh[MPQ_TILE_ROWS], zh[MPQ_TILE_ROWS];
            if (!s->f->e8m0)
                for (int h = 0; h < 2; h++) { /* s^ of the 16 rows, then z^, as fp16 */
                    const __m128i *ps = (const __m128i *)(const void *)(rec + 16 * h);
                    const __m128i *pz = (const __m128i *)(const void *)(rec + 32 + 16 * h);
                    _mm256_storeu_ps(sh + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128(ps)));
                    _mm256_storeu_ps(zh + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128(pz)));
                }
            else
                mpq__rec_pairs(s, rec, t0 + k, g, w[k].uniform ? B : 0, sh, zh);
            for (int v = 0; v < nb; v++) {
                const uint8_t *vw = work + (size_t)(b0 + v) * vstride;
                const __m256 gsc = _mm256_set1_ps(((const float *)(const void *)(vw + L.gscale))[g]);
                const __m256 gs = _mm256_set1_ps(((const float *)(const void *)(vw + L.gsum))[g]);
                const __m256i rows[2] = {_mm256_permute2x128_si256(tot[v][0], tot[v][1], 0x20),  /* rows 0-7 */
                                         _mm256_permute2x128_si256(tot[v][0], tot[v][1], 0x31)}; /* rows 8-15 */
                for (int h = 0; h < 2; h++) {
                    const __m256 acc = _mm256_mul_ps(_mm256_cvtepi32_ps(rows[h]), gsc);
                    float *y = yt[k][v] + 8 * h;
                    __m256 yv = _mm256_fmadd_ps(_mm256_loadu_ps(sh + 8 * h), acc, _mm256_loadu_ps(y));
                    _mm256_storeu_ps(y, _mm256_fmadd_ps(_mm256_loadu_ps(zh + 8 * h), gs, yv));
                }
            }
        }
}
#endif

/* ---- NEON path (AArch64): the tables of MPQ_PATH_AVX2_INT, vqtbl1q looks up 16 rows ---- */
#ifdef MPQ__HAVE_NEON
#define MPQ__NEON_TILES 4 /* tiles (64 rows) sharing the group's tables in L1 */

/* One chunk x (byte r = row r) against its tables T (mpq__q16_avx2_at: low
   bytes of the entries for columns 0-3 at T, high bytes at T + 32, columns
   4-7 at T + 64 and T + 96): both nibbles looked up and added, widened to
   int16, into lo[0] (rows 0-7), lo[1] (rows 8-15) and hi[0], hi[1]. */
MPQ__INLINE void mpq__neon_lk(uint8x16_t x, const uint8_t *T, int16x8_t lo[2], int16x8_t hi[2])
{
    const uint8x16_t n0 = vandq_u8(x, vdupq_n_u8(0x0F)), n1 = vshrq_n_u8(x, 4);
    const int8x16_t l0 = vqtbl1q_s8(vld1q_s8((const int8_t *)(const void *)T), n0);
    const int8x16_t h0 = vqtbl1q_s8(vld1q_s8((const int8_t *)(const void *)(T + 32)), n0);
    const int8x16_t l1 = vqtbl1q_s8(vld1q_s8((const int8_t *)(const void *)(T + 64)), n1);
    const int8x16_t h1 = vqtbl1q_s8(vld1q_s8((const int8_t *)(const void *)(T + 96)), n1);
    lo[0] = vaddq_s16(lo[0], vaddl_s8(vget_low_s8(l0), vget_low_s8(l1)));
    lo[1] = vaddq_s16(lo[1], vaddl_high_s8(l0, l1));
    hi[0] = vaddq_s16(hi[0], vaddl_s8(vget_low_s8(h0), vget_low_s8(h1)));
    hi[1] = vaddq_s16(hi[1], vaddl_high_s8(h0, h1));
}

/* One plane q of a record (nch chunks) against one vector's tables T of the
   group: per row, the sum of the int16 entries looked up, as int32, rows
   4k .. 4k+3 in v[k]. vld4q (a full unit: 4 bytes per row, one per chunk)
   and vld2q (a pair) de-interleave the chunks into registers of 16 rows.
   The int16 sums are safe for the reason given at mpq__avx2q_plane. */
static void mpq__neon_plane(const uint8_t *q, int nch, const uint8_t *T, int32x4_t v[4])
{
    int16x8_t lo[2] = {vdupq_n_s16(0), vdupq_n_s16(0)}, hi[2] = {vdupq_n_s16(0), vdupq_n_s16(0)};
    for (int u = 0; u < nch >> 2; u++, q += 64, T += 256) {
        const uint8x16x4_t c = vld4q_u8(q);
        mpq__neon_lk(c.val[0], T, lo, hi);
        mpq__neon_lk(c.val[1], T + 128, lo, hi);
        mpq__neon_lk(c.val[2], T + 16, lo, hi);
        mpq__neon_lk(c.val[3], T + 144, lo, hi);
    }
    if (nch & 2) {
        const uint8x16x2_t c = vld2q_u8(q);
        mpq__neon_lk(c.val[0], T, lo, hi);
        mpq__neon_lk(c.val[1], T + 16, lo, hi);
        q += 32;
        T += 256;
    }
    if (nch & 1) mpq__neon_lk(vld1q_u8(q), T, lo, hi);
    for (int h = 0; h < 2; h++) { /* low + 256 high */
        v[2 * h] = vaddw_s16(vshll_n_s16(vget_low_s16(hi[h]), 8), vget_low_s16(lo[h]));
        v[2 * h + 1] = vaddw_high_s16(vshll_high_n_s16(hi[h], 8), lo[h]);
    }
}

/* Tiles t0 .. t0+nt-1 (at most MPQ__NEON_TILES), vectors b0 .. b0+nb-1,
   as mpq__tiles_avx2q. */
static void mpq__tiles_neon(const mpq__shape *s, const mpq_packed *A, int t0, int nt, const uint8_t *work,
                            size_t vstride, int b0, int nb, int skip, float (*yt)[MPQ__BATCH_STEP][MPQ_TILE_ROWS])
{
    const mpq__vecwork L = mpq__vec_layout(A);
    const int cpg = s->group / 8, ng = s->ngroups;
    const size_t qstride = (size_t)mpq__units(cpg) * 256u;
    mpq__walk w[MPQ__NEON_TILES];
    mpq__walk_block(s, A, t0, nt, skip, w);
    memset(yt, 0, sizeof yt[0] * (size_t)nt);
    mpq__rec R;
    int32x4_t tot[MPQ__BATCH_STEP][4];
    for (int g = 0; g < ng; g++)
        for (int k = 0; k < nt; k++) {
            const int B = mpq__walk_rec(s, A->data, &w[k], g, skip, &R);
            const uint8_t *rec = R.p;
            const size_t pb = (size_t)R.nch * 16u;
            for (int v = 0; v < nb; v++)
                for (int j = 0; j < 4; j++) tot[v][j] = vdupq_n_s32(0);
            for (int p = 0; p < R.np; p++) {
                int32x4_t wt[4]; /* the plane's weight per row */
                for (int j = 0; j < 4; j++)
                    wt[j] = R.uniform ? vdupq_n_s32(1 << (R.i0 + p)) : vcvtq_s32_f32(vld1q_f32(R.mult[p] + 4 * j));
                const uint8_t *q = R.pl + (size_t)(R.i0 + p) * pb;
                for (int v = 0; v < nb; v++) {
                    int32x4_t pv[4];
                    mpq__neon_plane(q, R.nch, work + (size_t)(b0 + v) * vstride + L.tab + (size_t)g * qstride, pv);
                    for (int j = 0; j < 4; j++) tot[v][j] = vmlaq_s32(tot[v][j], pv[j], wt[j]);
                }
            }
            float sh[MPQ_TILE_ROWS], zh[MPQ_TILE_ROWS];
            mpq__rec_pairs(s, rec, t0 + k, g, w[k].uniform ? B : 0, sh, zh);
            for (int v = 0; v < nb; v++) {
                const uint8_t *vw = work + (size_t)(b0 + v) * vstride;
                const float32x4_t gsc = vdupq_n_f32(((const float *)(const void *)(vw + L.gscale))[g]);
                const float32x4_t gs = vdupq_n_f32(((const float *)(const void *)(vw + L.gsum))[g]);
                for (int j = 0; j < 4; j++) {
                    const float32x4_t acc = vmulq_f32(vcvtq_f32_s32(tot[v][j]), gsc);
                    float *y = yt[k][v] + 4 * j;
                    const float32x4_t yv = vfmaq_f32(vld1q_f32(y), vld1q_f32(sh + 4 * j), acc);
                    vst1q_f32(y, vfmaq_f32(yv, vld1q_f32(zh + 4 * j), gs));
                }
            }
        }
}
#endif

/* ---- 5.5 The product: the table of paths, tiles over threads, the sparse part ---- */

/* A float-table path's kernel for one record: y += s^ (its sum) + z^ gs. */
typedef void (*mpq__rec_fn)(const mpq__rec *R, const float *Q, const float *sh, const float *zh, float gs, float *y);

/* A path's kernel: tiles t0 .. t0+nt-1 (at most its row's `tiles`), vectors
   b0 .. b0+nb-1, their rows' sums y~ into yt[tile][vector][row]. */
typedef void (*mpq__tiles_fn)(const mpq__shape *s, const mpq_packed *A, int t0, int nt, const uint8_t *work,
                              size_t vstride, int b0, int nb, int skip, float (*yt)[MPQ__BATCH_STEP][MPQ_TILE_ROWS]);

/* One CPU path: everything dispatch, naming and availability read. */
typedef struct mpq__path_row {
    mpq_path path;
    const char *name; /* mpq_path_name */
    unsigned cpu;     /* MPQ__CPU_* the CPU must have (0: none) */
    mpq__tab tables;  /* the tables it reads */
    int tiles;        /* tiles a task takes (that share each group's tables in the cache) */
    mpq_task_fn task; /* one task: `tiles` tiles, every vector; NULL when this build lacks the path */
} mpq__path_row;

#if defined(MPQ__HAVE_AVX2) || defined(MPQ__HAVE_AVX512)
/* One tile on a float 16-entry path, vectors b0 .. b0+nb-1: y~ of its 16
   rows into yt[v][r], a record at a time through `kernel`. The records of
   tile t are found by walking its band's sections: section g holds the
   band's nt records of group g, and every record of a band with more than
   one tile has the same size. */
static void mpq__tile(const mpq__shape *s, const mpq_packed *A, mpq__rec_fn kernel, int t, const uint8_t *work,
                      size_t vstride, int b0, int nb, int skip, float yt[MPQ__BATCH_STEP][MPQ_TILE_ROWS])
{
    const mpq__vecwork L = mpq__vec_layout(A);
    const int cpg = s->group / 8, ng = s->ngroups;
    for (int v = 0; v < nb; v++)
        for (int r = 0; r < MPQ_TILE_ROWS; r++) yt[v][r] = 0.0f;
    mpq__walk w;
    mpq__walk_init(&w, s, A->band_off, A->data, t);
    w.skip = skip;
    mpq__walk_warm(s, A->band_off, A->data, t + 1, MPQ__LOOKAHEAD, skip); /* the next tile */
    mpq__rec R;
    for (int g = 0; g < ng; g++) {
        const int B = mpq__walk_rec(s, A->data, &w, g, skip, &R);
        float sh[MPQ_TILE_ROWS], zh[MPQ_TILE_ROWS];
        mpq__rec_pairs(s, R.p, t, g, w.uniform ? B : 0, sh, zh);
        for (int v = 0; v < nb; v++) {
            const uint8_t *vw = work + (size_t)(b0 + v) * vstride;
            const float *tab = (const float *)(const void *)(vw + L.tab);
            kernel(&R, tab + (size_t)g * (size_t)cpg * 32u, sh, zh, ((const float *)(const void *)(vw + L.gsum))[g],
                   yt[v]);
        }
    }
}
#endif

#ifdef MPQ__HAVE_AVX512
static void mpq__tiles_avx512(const mpq__shape *s, const mpq_packed *A, int t0, int nt, const uint8_t *work,
                              size_t vstride, int b0, int nb, int skip, float (*yt)[MPQ__BATCH_STEP][MPQ_TILE_ROWS])
{
    (void)nt; /* one tile a task */
    mpq__tile(s, A, mpq__rec512, t0, work, vstride, b0, nb, skip, yt[0]);
}
#endif
#ifdef MPQ__HAVE_AVX2
static void mpq__tiles_avx2(const mpq__shape *s, const mpq_packed *A, int t0, int nt, const uint8_t *work,
                            size_t vstride, int b0, int nb, int skip, float (*yt)[MPQ__BATCH_STEP][MPQ_TILE_ROWS])
{
    (void)nt; /* one tile a task */
    mpq__tile(s, A, mpq__rec256, t0, work, vstride, b0, nb, skip, yt[0]);
}
#endif

#define MPQ__SCALAR_TILES 8 /* tiles sharing each group's 256-entry tables (16 KB for 128 columns) */

/* Tiles t0 .. t0+nt-1 (at most MPQ__SCALAR_TILES) on the scalar path,
   vectors b0 .. b0+nb-1, group by group, so that the group's tables are
   read from memory once for the whole block; each tile's sums are those of
   mpq__tile. Kept out of line: gcc 12 compiles it slower inlined into its
   task (bench/results/NOTES.md, "One task per path"). */
MPQ__NOINLINE static void mpq__tiles_scalar(const mpq__shape *s, const mpq_packed *A, int t0, int nt,
                                            const uint8_t *work, size_t vstride, int b0, int nb, int skip,
                                            float (*yt)[MPQ__BATCH_STEP][MPQ_TILE_ROWS])
{
    const mpq__vecwork L = mpq__vec_layout(A);
    const int cpg = s->group / 8, ng = s->ngroups;
    mpq__walk w[MPQ__SCALAR_TILES];
    mpq__walk_block(s, A, t0, nt, skip, w);
    memset(yt, 0, sizeof yt[0] * (size_t)nt);
    mpq__rec R;
    for (int g = 0; g < ng; g++)
        for (int k = 0; k < nt; k++) {
            const int B = mpq__walk_rec(s, A->data, &w[k], g, skip, &R);
            const uint8_t *rec = R.p;
            float sh[MPQ_TILE_ROWS], zh[MPQ_TILE_ROWS];
            mpq__rec_pairs(s, rec, t0 + k, g, w[k].uniform ? B : 0, sh, zh);
            for (int v = 0; v < nb; v++) {
                const uint8_t *vw = work + (size_t)(b0 + v) * vstride;
                const float *tab = (const float *)(const void *)(vw + L.tab);
                const float gs = ((const float *)(const void *)(vw + L.gsum))[g];
                float acc[MPQ_TILE_ROWS];
                mpq__tile_scalar(&R, tab + (size_t)g * (size_t)cpg * 256u, acc);
                for (int r = 0; r < MPQ_TILE_ROWS; r++) yt[k][v][r] += sh[r] * acc[r] + zh[r] * gs;
            }
        }
}

/* One product's phase-2 tasks: blocks of tiles, or tiles. */
typedef struct mpq__gemv_job {
    const mpq__shape *s;
    const mpq_packed *A;
    float *y;
    const uint8_t *w; /* the vectors' tables */
    const float *xs;  /* the vectors the sparse part multiplies */
    size_t vstride;
    int batch, skip;
    int tiles; /* tiles a task takes: at most the row's */
    const mpq__path_row *row;
} mpq__gemv_job;

/* y rows of tile t from yt (rows of the tile, vectors b0 .. b0+nb-1), each
   with its row of the sparse part added (float64 sums in entry order). */
static void mpq__gemv_store(const mpq__gemv_job *J, int t, int b0, int nb, const float *yt, size_t vstep)
{
    const mpq_packed *A = J->A;
    const size_t rows = (size_t)A->rows;
    const int nr = A->rows - t * MPQ_TILE_ROWS < MPQ_TILE_ROWS ? A->rows - t * MPQ_TILE_ROWS : MPQ_TILE_ROWS;
    float *y = J->y + (size_t)b0 * rows;
    if (!A->p_row) {
        for (int v = 0; v < nb; v++)
            memcpy(y + (size_t)v * rows + (size_t)t * MPQ_TILE_ROWS, yt + (size_t)v * vstep,
                   sizeof(float) * (size_t)nr);
    } else
        for (int r = 0; r < nr; r++) {
            const size_t oi = A->p_row[t * MPQ_TILE_ROWS + r];
            for (int v = 0; v < nb; v++) y[(size_t)v * rows + oi] = yt[(size_t)v * vstep + r];
        }
    if (!A->sp_row_ptr || !A->sp_nnz) return;
    for (int r = 0; r < nr; r++) {
        const int i = t * MPQ_TILE_ROWS + r, oi = A->p_row ? (int)A->p_row[i] : i;
        const uint32_t k0 = A->sp_row_ptr[oi], k1 = A->sp_row_ptr[oi + 1];
        for (int v = 0; k0 < k1 && v < nb; v++) {
            const float *xv = J->xs + (size_t)(b0 + v) * (size_t)A->cols;
            double acc = 0.0;
            for (uint32_t k = k0; k < k1; k++)
                acc += (double)mpq_f16_to_f32(A->sp_val[k]) * (double)xv[mpq__sp_col(A, k)];
            float *yo = y + (size_t)v * rows + (size_t)oi;
            *yo = (float)((double)*yo + acc);
        }
    }
}

#define MPQ__MAX_TILES MPQ__SCALAR_TILES /* the most tiles any path's task takes */

/* One task of a product: `T` tiles from block blk on, every vector, through
   `kernel`. Each path's task below is this body with its own kernel and T
   constant, so that the compiler calls (and may inline) the kernel directly;
   a call through a pointer in the row is measurably slower on the integer
   paths (bench/results/NOTES.md, "One task per path"). */
MPQ__INLINE void mpq__gemv_tiles(const mpq__gemv_job *J, int blk, mpq__tiles_fn kernel, const int T)
{
    const int per = J->tiles < T ? J->tiles : T, t0 = blk * per, nt = J->s->ntiles - t0 < per ? J->s->ntiles - t0 : per;
    float yt[MPQ__MAX_TILES][MPQ__BATCH_STEP][MPQ_TILE_ROWS];
    for (int b0 = 0; b0 < J->batch; b0 += MPQ__BATCH_STEP) {
        const int nb = J->batch - b0 < MPQ__BATCH_STEP ? J->batch - b0 : MPQ__BATCH_STEP;
        kernel(J->s, J->A, t0, nt, J->w, J->vstride, b0, nb, J->skip, yt);
        for (int k = 0; k < nt; k++) mpq__gemv_store(J, t0 + k, b0, nb, yt[k][0], MPQ_TILE_ROWS);
    }
}

/* A path's task (mpq__run): the body above with its kernel and tile count. */
#define MPQ__GEMV_TASK(name, target, kernel, T)                                                                        \
    target static void name(void *ctx, int blk) { mpq__gemv_tiles((const mpq__gemv_job *)ctx, blk, kernel, T); }

/* THE CPU PATHS, one row each, in the order AUTO prefers them. A build
   without a path's kernels has no task for it (and never offers it). */
#ifdef MPQ__HAVE_VNNI
MPQ__GEMV_TASK(mpq__gemv_vnni, MPQ__T_VNNI, mpq__tiles_vnni, MPQ__VNNI_TILES)
#define MPQ__VNNI_TASK mpq__gemv_vnni
#else
#define MPQ__VNNI_TASK  NULL
#define MPQ__VNNI_TILES 1
#endif
#ifdef MPQ__HAVE_AVX2
MPQ__GEMV_TASK(mpq__gemv_avx2q, MPQ__T_AVX2, mpq__tiles_avx2q, MPQ__AVX2Q_TILES)
MPQ__GEMV_TASK(mpq__gemv_avx2, MPQ__T_AVX2, mpq__tiles_avx2, 1)
#define MPQ__AVX2Q_TASK mpq__gemv_avx2q
#define MPQ__AVX2_TASK  mpq__gemv_avx2
#else
#define MPQ__AVX2Q_TASK  NULL
#define MPQ__AVX2_TASK   NULL
#define MPQ__AVX2Q_TILES 1
#endif
#ifdef MPQ__HAVE_NEON
MPQ__GEMV_TASK(mpq__gemv_neon, , mpq__tiles_neon, MPQ__NEON_TILES)
#define MPQ__NEON_TASK mpq__gemv_neon
#else
#define MPQ__NEON_TASK  NULL
#define MPQ__NEON_TILES 1
#endif
#ifdef MPQ__HAVE_AVX512
MPQ__GEMV_TASK(mpq__gemv_avx512, MPQ__T_AVX512, mpq__tiles_avx512, 1)
#define MPQ__AVX512_TASK mpq__gemv_avx512
#else
#define MPQ__AVX512_TASK NULL
#endif
MPQ__GEMV_TASK(mpq__gemv_scalar, , mpq__tiles_scalar, MPQ__SCALAR_TILES)
static const mpq__path_row mpq__paths[] = {
    {MPQ_PATH_AVX512_VNNI, "avx512-vnni", MPQ__CPU_VNNI, MPQ__TAB_INT16, MPQ__VNNI_TILES, MPQ__VNNI_TASK},
    {MPQ_PATH_AVX2_INT, "avx2-int", MPQ__CPU_AVX2, MPQ__TAB_INT16_LANES, MPQ__AVX2Q_TILES, MPQ__AVX2Q_TASK},
    {MPQ_PATH_NEON, "neon", 0, MPQ__TAB_INT16_LANES, MPQ__NEON_TILES, MPQ__NEON_TASK},
    {MPQ_PATH_AVX512, "avx512", MPQ__CPU_AVX512, MPQ__TAB_FLOAT16, 1, MPQ__AVX512_TASK},
    {MPQ_PATH_AVX2, "avx2", MPQ__CPU_AVX2, MPQ__TAB_FLOAT16, 1, MPQ__AVX2_TASK},
    {MPQ_PATH_SCALAR, "scalar", 0, MPQ__TAB_FLOAT256, MPQ__SCALAR_TILES, mpq__gemv_scalar},
};
enum { MPQ__NPATHS = (int)(sizeof mpq__paths / sizeof mpq__paths[0]) };

static const mpq__path_row *mpq__path_row_of(mpq_path path)
{
    for (int k = 0; k < MPQ__NPATHS; k++)
        if (mpq__paths[k].path == path) return &mpq__paths[k];
    return NULL;
}

MPQ_DEF int mpq_path_available(mpq_path path)
{
    if (path == MPQ_PATH_AUTO) return 1;
    const mpq__path_row *r = mpq__path_row_of(path);
    return r && r->task && (mpq__cpu() & r->cpu) == r->cpu;
}

MPQ_DEF const char *mpq_path_name(mpq_path path)
{
    const mpq__path_row *r = mpq__path_row_of(path);
    return path == MPQ_PATH_AUTO ? "auto" : r ? r->name : "unknown";
}

/* The first available row of the preference order; `kinds` limits it to
   tables of those kinds (a bit per mpq__tab), 0 to any. */
static const mpq__path_row *mpq__best_path(unsigned kinds)
{
    for (int k = 0; k < MPQ__NPATHS; k++)
        if ((!kinds || (kinds >> mpq__paths[k].tables & 1u)) && mpq_path_available(mpq__paths[k].path))
            return &mpq__paths[k];
    return &mpq__paths[MPQ__NPATHS - 1];
}

/* AUTO resolved to this CPU's choice (the benches name the path they time). */
static mpq_path mpq__resolve_path(mpq_path p) { return p == MPQ_PATH_AUTO ? mpq__best_path(0)->path : p; }

MPQ_DEF mpq_status mpq_gemv_path(const mpq_packed *A, const mpq_gemv_opts *opts, mpq_path *path)
{
    if (!A || !path) return MPQ_ERR_ARG;
    const mpq_path asked = opts ? opts->path : MPQ_PATH_AUTO;
    if (!mpq_path_available(asked)) return MPQ_ERR_UNSUPPORTED;
    const mpq__path_row *r = mpq__path_row_of(mpq__resolve_path(asked));
    const int int16 = r->tables == MPQ__TAB_INT16 || r->tables == MPQ__TAB_INT16_LANES;
    if (int16 && A->group > MPQ__Q16_MAX_GROUP) { /* the int32 sums would overflow: the fastest exact tables */
        if (asked != MPQ_PATH_AUTO) return MPQ_ERR_UNSUPPORTED;
        r = mpq__best_path(1u << MPQ__TAB_FLOAT16 | 1u << MPQ__TAB_FLOAT256);
    }
    *path = r->path;
    return MPQ_OK;
}

/* ---- the phases of a product (mpq_gemv_job), and mpq_gemv ---- */

/* Tiles per phase-2 task: the path's (tiles that share each group's tables
   in the cache), fewer for matrices of under 32 x that many tiles, so that
   a small matrix (SmolLM2's 576 rows: 36 tiles) still splits evenly
   between threads; at least one. */
#define MPQ__TASKS_WANTED 32
static int mpq__task_tiles(int ntiles, int path_tiles)
{
    const int t = ntiles / MPQ__TASKS_WANTED;
    return t < 1 ? 1 : t < path_tiles ? t : path_tiles;
}

static int mpq__rot_same(const mpq_rotation *a, const mpq_rotation *b)
{
    if (a->n != b->n) return 0;
    if (!a->n) return 1;
    return a->p == b->p && a->m == b->m && a->seed == b->seed &&
        (a->sign == b->sign || !memcmp(a->sign, b->sign, ((size_t)a->n + 7u) / 8u)) &&
        (a->R == b->R || !memcmp(a->R, b->R, sizeof(float) * (size_t)a->m * (size_t)a->m));
}

MPQ_DEF int mpq_gemv_tables_shared(const mpq_packed *A, const mpq_packed *B)
{
    if (!A || !B || A->cols != B->cols || A->group != B->group || !A->p_col != !B->p_col ||
        !A->col_scale != !B->col_scale)
        return 0;
    const size_t n = (size_t)A->cols;
    if (A->p_col && A->p_col != B->p_col && memcmp(A->p_col, B->p_col, n * sizeof(uint32_t))) return 0;
    if (A->col_scale && A->col_scale != B->col_scale && memcmp(A->col_scale, B->col_scale, n * sizeof(float))) return 0;
    return mpq__rot_same(&A->rot, &B->rot);
}

MPQ_DEF mpq_status mpq_gemv_job_init(mpq_gemv_job *j, const mpq_packed *A, const float *x, float *y, int batch,
                                     const mpq_gemv_opts *opts, void *work, size_t work_bytes,
                                     const mpq_gemv_job *tables)
{
    if (!j) return MPQ_ERR_ARG;
    memset(j, 0, sizeof *j);
    if (!A || !x || !y || !A->data || !A->band_off || !mpq_format_get((mpq_format)A->format)) return MPQ_ERR_ARG;
    if (batch < 1) return MPQ_ERR_SIZE;
    mpq_gemv_opts o;
    memset(&o, 0, sizeof o);
    if (opts) o = *opts;
    if (o.skip_planes < 0 || o.threads < 0 || o.a8 < 0 || o.a8 > 1) return MPQ_ERR_ARG;
    mpq_path path;
    const mpq_status ps = mpq_gemv_path(A, &o, &path);
    if (ps != MPQ_OK) return ps;
    const size_t vstride = mpq__vec_layout(A).bytes;
    if (tables) {
        if (tables->batch != batch || tables->a8 != o.a8 || tables->path != (int)path || !tables->work ||
            tables->xs != (A->rot.n ? (const float *)(const void *)(tables->work + (size_t)batch * vstride) : x) ||
            !mpq_gemv_tables_shared(A, tables->A))
            return MPQ_ERR_ARG;
        j->work = tables->work;
        j->xs = tables->xs;
    } else {
        if (!work) return MPQ_ERR_ARG;
        if (work_bytes < mpq__bp_work_bytes(A, batch)) return MPQ_ERR_SIZE;
        if ((uintptr_t)work % 64u) return MPQ_ERR_ALIGN;
        j->work = (uint8_t *)work;
        j->xs = A->rot.n ? (const float *)(const void *)(j->work + (size_t)batch * vstride) : x;
        j->tasks[0] = A->rot.n ? batch : 0;
        j->tasks[1] = batch * A->ngroups;
    }
    const mpq__path_row *row = mpq__path_row_of(path);
    mpq__shape s;
    mpq__shape_of(A, &s);
    j->tiles = mpq__task_tiles(s.ntiles, row->tiles);
    j->tasks[2] = (s.ntiles + j->tiles - 1) / j->tiles;
    j->A = A;
    j->y = y;
    j->vstride = vstride;
    j->x = x;
    j->batch = batch, j->skip = o.skip_planes, j->a8 = o.a8, j->path = (int)path;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_gemv_job_run(const mpq_gemv_job *j, int phase, int t0, int t1)
{
    if (!j || phase < 0 || phase >= MPQ_GEMV_PHASES || t0 < 0 || t1 > j->tasks[phase]) return MPQ_ERR_ARG;
    const mpq_packed *A = j->A;
    const mpq__path_row *row = t0 < t1 ? mpq__path_row_of((mpq_path)j->path) : NULL;
    if (phase == 0) /* V x of vectors t0 .. t1-1, into the workspace */
        for (int v = t0; v < t1; v++) {
            const float *xv = j->x + (size_t)v * (size_t)A->cols;
            float *xr = (float *)(void *)(j->work + (size_t)j->batch * j->vstride) + (size_t)v * (size_t)A->cols;
            float tmp[MPQ_ROTATION_MAX_ODD];
            const mpq_status st = mpq__check_finite(xv, (size_t)A->cols);
            if (st != MPQ_OK) return st;
            memcpy(xr, xv, sizeof(float) * (size_t)A->cols);
            mpq__rot_run(&A->rot, xr, tmp, 0);
        }
    else if (phase == 1) /* task v * ngroups + g: group g of vector v */
        for (int t = t0; t < t1; t++) {
            const int v = t / A->ngroups, g = t % A->ngroups;
            const mpq_status st = mpq__build_group(A, j->xs + (size_t)v * (size_t)A->cols, row->tables, j->a8,
                                                   j->work + (size_t)v * j->vstride, g);
            if (st != MPQ_OK) return st;
        }
    else if (t0 < t1) {
        mpq__shape s;
        mpq__shape_of(A, &s);
        mpq__gemv_job J = {&s, A, j->y, j->work, j->xs, j->vstride, j->batch, j->skip, j->tiles, row};
        for (int t = t0; t < t1; t++) row->task(&J, t);
    }
    return MPQ_OK;
}

static mpq_status mpq__bp_gemv(const mpq_packed *A, const float *x, float *y, int batch, const mpq_gemv_opts *opts,
                               void *work, size_t work_bytes)
{
    mpq_gemv_job j;
    uint8_t *own = NULL;
    if (!A || !x || !y || !A->data || !A->band_off) return MPQ_ERR_ARG;
    if (batch < 1) return MPQ_ERR_SIZE;
    if (!work) {
        work_bytes = mpq__bp_work_bytes(A, batch);
        if (!(work = own = (uint8_t *)mpq_aligned_alloc(work_bytes))) return MPQ_ERR_NOMEM;
    }
    mpq_status st = mpq_gemv_job_init(&j, A, x, y, batch, opts, work, work_bytes, NULL);
    if (st == MPQ_OK) { /* one parallel region: the phases split between its threads, a barrier after each */
        const int most = j.tasks[1] > j.tasks[2] ? j.tasks[1] : j.tasks[2];
        const int want = opts && opts->threads ? opts->threads : mpq__max_threads();
        int n = mpq__load_threads(want < most ? want : most);
        n = n > 1 ? n : 1;
        (void)n;
#ifdef _OPENMP
#pragma omp parallel num_threads(n) if (n > 1)
#endif
        { /* every thread meets every barrier; an error only stops the work. Phase 2
             (the one that writes y) starts after the last barrier, when every
             error of phases 0 and 1 has been stored and no other can come. */
            const int tid = mpq__thread_id(), nt = mpq__team_size();
            for (int ph = 0; ph < MPQ_GEMV_PHASES; ph++) {
                if (!j.tasks[ph] || (ph == MPQ_GEMV_PHASES - 1 && __atomic_load_n(&st, __ATOMIC_RELAXED) != MPQ_OK))
                    continue;
                if (__atomic_load_n(&st, __ATOMIC_RELAXED) == MPQ_OK) {
                    const mpq_status e = mpq_gemv_job_run(&j, ph, (int)((long long)j.tasks[ph] * tid / nt),
                                                          (int)((long long)j.tasks[ph] * (tid + 1) / nt));
                    if (e != MPQ_OK) __atomic_store_n(&st, e, __ATOMIC_RELAXED);
                }
#ifdef _OPENMP
                if (ph < MPQ_GEMV_PHASES - 1) {
#pragma omp barrier
                }
#endif
            }
        }
    }
    mpq_aligned_free(own);
    return st;
}

/* ---- 5.6 The float64 reference (mpq_gemv_ref) ---- */

typedef struct mpq__emit_gemv {
    const double *x;
    double *y;
    int batch, rows, cols;
} mpq__emit_gemv;

static void mpq__emit_dot(void *u, int row, int col, double w)
{
    mpq__emit_gemv *e = (mpq__emit_gemv *)u;
    for (int v = 0; v < e->batch; v++)
        e->y[(size_t)v * (size_t)e->rows + (size_t)row] += w * e->x[(size_t)v * (size_t)e->cols + (size_t)col];
}

MPQ_DEF mpq_status mpq_gemv_ref(const mpq_packed *A, const float *x, double *y, int batch, int skip_planes)
{
    if (!A || !x || !y || !mpq_format_get((mpq_format)A->format) || !A->data) return MPQ_ERR_ARG;
    if (batch < 1) return MPQ_ERR_SIZE;
    if (skip_planes < 0) return MPQ_ERR_ARG;
    for (size_t k = 0; k < (size_t)batch * (size_t)A->cols; k++)
        if (!mpq__finite(x[k])) return MPQ_ERR_NONFINITE;
    const size_t nx = (size_t)batch * (size_t)A->cols;
    double *tmp = (double *)MPQ_MALLOC(sizeof(double) * (size_t)A->group);
    double *xd = (double *)MPQ_MALLOC(sizeof(double) * nx);
    if (!tmp || !xd) {
        MPQ_FREE(tmp);
        MPQ_FREE(xd);
        return MPQ_ERR_NOMEM;
    }
    for (size_t k = 0; k < nx; k++) xd[k] = (double)x[k];
    mpq_status st = A->rot.n ? mpq_rotation_apply_f64(&A->rot, xd, batch, 0) : MPQ_OK;
    if (st == MPQ_OK) {
        for (size_t k = 0; k < (size_t)batch * (size_t)A->rows; k++) y[k] = 0.0;
        mpq__emit_gemv e = {xd, y, batch, A->rows, A->cols};
        mpq__bp_decode_all(A, skip_planes, mpq__emit_dot, &e, tmp);
        mpq__sparse_emit(A, mpq__emit_dot, &e);
    }
    MPQ_FREE(tmp);
    MPQ_FREE(xd);
    return st;
}

/* ========================================================================== */
/* 6. Formats, backends                                                       */
/* ========================================================================== */

/* The formats (see mpq_format_traits for what each field means). MXINT
   shares the record layout and every kernel; only the metadata differs. */
static const mpq_format_traits mpq__formats[] = {
    {MPQ_FORMAT_BITPLANE,
     "bitplane",
     {'M', 'P', 'Q', 'B', 'I', 'T', 'P', 0},
     /* e8m0, meta_bytes, meta_bits, min_bits, default_group, fixed_group, symmetric, max_abs */
     0,
     4 * MPQ_TILE_ROWS,
     32,
     1,
     128,
     0,
     1,
     MPQ__F16_MAX,
     mpq__bp_quantize_group,
     mpq__bp_pair,
     mpq__bp_code_of,
     mpq__bp_meta_valid,
     mpq__bp_meta_write,
     mpq__bp_meta_read,
     mpq__bp_open,
     mpq__bp_dequantize,
     mpq__bp_dequantize_row,
     mpq__bp_gemv,
     mpq__bp_work_bytes},
    {MPQ_FORMAT_MXINT,
     "mxint",
     {'M', 'P', 'Q', 'M', 'X', 'I', 'N', 0},
     1,
     MPQ_TILE_ROWS,
     8,
     2,
     MPQ_MX_BLOCK,
     MPQ_MX_BLOCK,
     0,
     FLT_MAX,
     mpq__mx_quantize_group,
     mpq__mx_pair,
     mpq__mx_code_of,
     mpq__mx_meta_valid,
     mpq__mx_meta_write,
     mpq__mx_meta_read,
     mpq__mx_open,
     mpq__bp_dequantize,
     mpq__bp_dequantize_row,
     mpq__bp_gemv,
     mpq__bp_work_bytes},
};

MPQ_DEF const mpq_format_traits *mpq_format_get(mpq_format f)
{
    for (size_t k = 0; k < sizeof mpq__formats / sizeof mpq__formats[0]; k++)
        if (mpq__formats[k].format == f) return &mpq__formats[k];
    return NULL;
}

MPQ_DEF mpq_status mpq_packed_open(const void *buf, size_t bytes, mpq_packed *out)
{
    if (!buf || !out) return MPQ_ERR_ARG;
    if ((uintptr_t)buf % 16u) return MPQ_ERR_ALIGN;
    if (bytes < 8) return MPQ_ERR_FORMAT;
    for (size_t k = 0; k < sizeof mpq__formats / sizeof mpq__formats[0]; k++)
        if (!memcmp(buf, mpq__formats[k].magic, 8)) return mpq__formats[k].open(buf, bytes, out);
    return MPQ_ERR_FORMAT;
}

MPQ_DEF mpq_status mpq_packed_dequantize(const mpq_packed *A, int skip_planes, float *W)
{
    const mpq_format_traits *f = A ? mpq_format_get((mpq_format)A->format) : NULL;
    return f ? f->dequantize(A, skip_planes, W) : MPQ_ERR_ARG;
}

MPQ_DEF mpq_status mpq_packed_dequantize_row(const mpq_packed *A, int skip_planes, int row, float *w)
{
    const mpq_format_traits *f = A ? mpq_format_get((mpq_format)A->format) : NULL;
    return f ? f->dequantize_row(A, skip_planes, row, w) : MPQ_ERR_ARG;
}

MPQ_DEF size_t mpq_gemv_work_bytes(const mpq_packed *A, int batch)
{
    const mpq_format_traits *f = A ? mpq_format_get((mpq_format)A->format) : NULL;
    return f ? f->work_bytes(A, batch) : 0;
}

MPQ_DEF mpq_status mpq_gemv(const mpq_packed *A, const float *x, float *y, int batch, const mpq_gemv_opts *opts,
                            void *work, size_t work_bytes)
{
    const mpq_format_traits *f = A ? mpq_format_get((mpq_format)A->format) : NULL;
    return f ? f->gemv(A, x, y, batch, opts, work, work_bytes) : MPQ_ERR_ARG;
}

/* The CPU backend: a handle is the view plus a workspace grown on demand. */
typedef struct mpq__cpu_handle {
    mpq_packed A;
    void *work;
    size_t work_bytes;
} mpq__cpu_handle;

static mpq_status mpq__cpu_upload(void *ctx, const mpq_packed *A, void **handle)
{
    (void)ctx;
    if (!A || !handle || !mpq_format_get((mpq_format)A->format)) return MPQ_ERR_ARG;
    mpq__cpu_handle *h = (mpq__cpu_handle *)MPQ_MALLOC(sizeof *h);
    if (!h) return MPQ_ERR_NOMEM;
    h->A = *A;
    h->A.owned = 0; /* the caller keeps ownership of the buffer */
    h->work = NULL;
    h->work_bytes = 0;
    *handle = h;
    return MPQ_OK;
}

static void mpq__cpu_release(void *ctx, void *handle)
{
    (void)ctx;
    mpq__cpu_handle *h = (mpq__cpu_handle *)handle;
    if (!h) return;
    mpq_aligned_free(h->work);
    MPQ_FREE(h);
}

static mpq_status mpq__cpu_gemv(void *ctx, void *handle, const float *x, float *y, int batch, const mpq_gemv_opts *opts)
{
    (void)ctx;
    mpq__cpu_handle *h = (mpq__cpu_handle *)handle;
    if (!h) return MPQ_ERR_ARG;
    if (batch < 1) return MPQ_ERR_SIZE;
    size_t need = mpq_gemv_work_bytes(&h->A, batch);
    if (need > h->work_bytes) {
        void *w = mpq_aligned_alloc(need);
        if (!w) return MPQ_ERR_NOMEM;
        mpq_aligned_free(h->work);
        h->work = w;
        h->work_bytes = need;
    }
    return mpq_gemv(&h->A, x, y, batch, opts, h->work, h->work_bytes);
}

static mpq_status mpq__cpu_sync(void *ctx)
{
    (void)ctx;
    return MPQ_OK;
}

MPQ_DEF void mpq_backend_cpu(mpq_backend *b)
{
    if (!b) return;
    b->name = "cpu";
    b->caps = MPQ_CAP_BITPLANE | MPQ_CAP_HOST_MEMORY;
    b->ctx = NULL;
    b->upload = mpq__cpu_upload;
    b->release = mpq__cpu_release;
    b->gemv = mpq__cpu_gemv;
    b->synchronize = mpq__cpu_sync;
    b->pin = NULL; /* the CPU reads its own memory as it is */
    b->unpin = NULL;
    b->gemv_n = NULL; /* nothing to copy: the model calls gemv for each map */
}

/* ========================================================================== */
/* 7. AWQ                                                                     */
/* ========================================================================== */

/* Dense products of AWQ's objective and of GPTQ (the Cholesky
   factorisation and the lazy batches) are one register tile:

     C[r][0 .. NC) += sum_{k < K} A[r][k] B[k][0 .. NC)   for r < MPQ__GR,

   a register tile of MPQ__GR rows and NC columns (MPQ__GCF floats or
   MPQ__GCD doubles), A and C row-major with strides lda and ldc, B with
   stride ldb. The callers pad rows to MPQ__GR and columns to 32 so that
   every tile is whole. Each tile is summed in a fixed order by one thread,
   so results do not depend on the thread count (they depend on the path:
   AVX-512, AVX2, whichever the CPU has, or scalar code). */
#define MPQ__GR   8
#define MPQ__GCF  32
#define MPQ__GCD  16
#define MPQ__GPAD 32 /* column padding: a multiple of MPQ__GCF and MPQ__GCD */

#ifdef MPQ__HAVE_AVX512
MPQ__T_AVX512 static void mpq__gtile_f32_avx512(int K, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                                                size_t ldc)
{
    __m512 c[MPQ__GR][2];
    for (int r = 0; r < MPQ__GR; r++)
        c[r][0] = _mm512_loadu_ps(C + r * ldc), c[r][1] = _mm512_loadu_ps(C + r * ldc + 16);
    for (int k = 0; k < K; k++) {
        const __m512 b0 = _mm512_loadu_ps(B + (size_t)k * ldb), b1 = _mm512_loadu_ps(B + (size_t)k * ldb + 16);
        for (int r = 0; r < MPQ__GR; r++) {
            const __m512 a = _mm512_set1_ps(A[r * lda + (size_t)k]);
            c[r][0] = _mm512_fmadd_ps(a, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(a, b1, c[r][1]);
        }
    }
    for (int r = 0; r < MPQ__GR; r++)
        _mm512_storeu_ps(C + r * ldc, c[r][0]), _mm512_storeu_ps(C + r * ldc + 16, c[r][1]);
}

MPQ__T_AVX512 static void mpq__gtile_f64_avx512(int K, const double *A, size_t lda, const double *B, size_t ldb,
                                                double *C, size_t ldc)
{
    __m512d c[MPQ__GR][2];
    for (int r = 0; r < MPQ__GR; r++)
        c[r][0] = _mm512_loadu_pd(C + r * ldc), c[r][1] = _mm512_loadu_pd(C + r * ldc + 8);
    for (int k = 0; k < K; k++) {
        const __m512d b0 = _mm512_loadu_pd(B + (size_t)k * ldb), b1 = _mm512_loadu_pd(B + (size_t)k * ldb + 8);
        for (int r = 0; r < MPQ__GR; r++) {
            const __m512d a = _mm512_set1_pd(A[r * lda + (size_t)k]);
            c[r][0] = _mm512_fmadd_pd(a, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_pd(a, b1, c[r][1]);
        }
    }
    for (int r = 0; r < MPQ__GR; r++)
        _mm512_storeu_pd(C + r * ldc, c[r][0]), _mm512_storeu_pd(C + r * ldc + 8, c[r][1]);
}
#endif

#ifdef MPQ__HAVE_AVX2
/* The tile as four sub-tiles of 4 rows x 16 floats (8 accumulators each). */
MPQ__T_AVX2 static void mpq__gtile_f32_avx2(int K, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                                            size_t ldc)
{
    for (int r0 = 0; r0 < MPQ__GR; r0 += 4)
        for (int j0 = 0; j0 < MPQ__GCF; j0 += 16) {
            __m256 c[4][2];
            float *Cs = C + (size_t)r0 * ldc + (size_t)j0;
            const float *As = A + (size_t)r0 * lda, *Bs = B + (size_t)j0;
            for (int r = 0; r < 4; r++)
                c[r][0] = _mm256_loadu_ps(Cs + r * ldc), c[r][1] = _mm256_loadu_ps(Cs + r * ldc + 8);
            for (int k = 0; k < K; k++) {
                const __m256 b0 = _mm256_loadu_ps(Bs + (size_t)k * ldb), b1 = _mm256_loadu_ps(Bs + (size_t)k * ldb + 8);
                for (int r = 0; r < 4; r++) {
                    const __m256 a = _mm256_set1_ps(As[r * lda + (size_t)k]);
                    c[r][0] = _mm256_fmadd_ps(a, b0, c[r][0]);
                    c[r][1] = _mm256_fmadd_ps(a, b1, c[r][1]);
                }
            }
            for (int r = 0; r < 4; r++)
                _mm256_storeu_ps(Cs + r * ldc, c[r][0]), _mm256_storeu_ps(Cs + r * ldc + 8, c[r][1]);
        }
}

/* Likewise, sub-tiles of 4 rows x 8 doubles. */
MPQ__T_AVX2 static void mpq__gtile_f64_avx2(int K, const double *A, size_t lda, const double *B, size_t ldb, double *C,
                                            size_t ldc)
{
    for (int r0 = 0; r0 < MPQ__GR; r0 += 4)
        for (int j0 = 0; j0 < MPQ__GCD; j0 += 8) {
            __m256d c[4][2];
            double *Cs = C + (size_t)r0 * ldc + (size_t)j0;
            const double *As = A + (size_t)r0 * lda, *Bs = B + (size_t)j0;
            for (int r = 0; r < 4; r++)
                c[r][0] = _mm256_loadu_pd(Cs + r * ldc), c[r][1] = _mm256_loadu_pd(Cs + r * ldc + 4);
            for (int k = 0; k < K; k++) {
                const __m256d b0 = _mm256_loadu_pd(Bs + (size_t)k * ldb);
                const __m256d b1 = _mm256_loadu_pd(Bs + (size_t)k * ldb + 4);
                for (int r = 0; r < 4; r++) {
                    const __m256d a = _mm256_set1_pd(As[r * lda + (size_t)k]);
                    c[r][0] = _mm256_fmadd_pd(a, b0, c[r][0]);
                    c[r][1] = _mm256_fmadd_pd(a, b1, c[r][1]);
                }
            }
            for (int r = 0; r < 4; r++)
                _mm256_storeu_pd(Cs + r * ldc, c[r][0]), _mm256_storeu_pd(Cs + r * ldc + 4, c[r][1]);
        }
}
#endif

static void mpq__gtile_f32(int K, const float *A, size_t lda, const float *B, size_t ldb, float *C, size_t ldc)
{
    const unsigned f = mpq__cpu();
    (void)f;
#ifdef MPQ__HAVE_AVX512
    if (f & MPQ__CPU_AVX512) {
        mpq__gtile_f32_avx512(K, A, lda, B, ldb, C, ldc);
        return;
    }
#endif
#ifdef MPQ__HAVE_AVX2
    if (f & MPQ__CPU_AVX2) {
        mpq__gtile_f32_avx2(K, A, lda, B, ldb, C, ldc);
        return;
    }
#endif
    for (int r = 0; r < MPQ__GR; r++)
        for (int k = 0; k < K; k++) {
            const float a = A[r * lda + (size_t)k];
            for (int j = 0; j < MPQ__GCF; j++) C[r * ldc + (size_t)j] += a * B[(size_t)k * ldb + (size_t)j];
        }
}

static void mpq__gtile_f64(int K, const double *A, size_t lda, const double *B, size_t ldb, double *C, size_t ldc)
{
    const unsigned f = mpq__cpu();
    (void)f;
#ifdef MPQ__HAVE_AVX512
    if (f & MPQ__CPU_AVX512) {
        mpq__gtile_f64_avx512(K, A, lda, B, ldb, C, ldc);
        return;
    }
#endif
#ifdef MPQ__HAVE_AVX2
    if (f & MPQ__CPU_AVX2) {
        mpq__gtile_f64_avx2(K, A, lda, B, ldb, C, ldc);
        return;
    }
#endif
    for (int r = 0; r < MPQ__GR; r++)
        for (int k = 0; k < K; k++) {
            const double a = A[r * lda + (size_t)k];
            for (int j = 0; j < MPQ__GCD; j++) C[r * ldc + (size_t)j] += a * B[(size_t)k * ldb + (size_t)j];
        }
}

/* y[0 .. n) += a x[0 .. n): GPTQ's steps inside a block. */
#ifdef MPQ__HAVE_AVX512
MPQ__T_AVX512 static void mpq__axpy_f32_avx512(int n, float a, const float *x, float *y)
{
    const __m512 va = _mm512_set1_ps(a);
    int k = 0;
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(y + k, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + k), _mm512_loadu_ps(y + k)));
    if (k < n) {
        const __mmask16 m = (__mmask16)((1u << (n - k)) - 1u);
        _mm512_mask_storeu_ps(y + k, m,
                              _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + k), _mm512_maskz_loadu_ps(m, y + k)));
    }
}
#endif

#ifdef MPQ__HAVE_AVX2
MPQ__T_AVX2 static void mpq__axpy_f32_avx2(int n, float a, const float *x, float *y)
{
    const __m256 va = _mm256_set1_ps(a);
    int k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(y + k, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + k), _mm256_loadu_ps(y + k)));
    for (; k < n; k++) y[k] = fmaf(a, x[k], y[k]);
}
#endif

static void mpq__axpy_f32(int n, float a, const float *x, float *y)
{
    const unsigned f = mpq__cpu();
    (void)f;
#ifdef MPQ__HAVE_AVX512
    if (f & MPQ__CPU_AVX512) {
        mpq__axpy_f32_avx512(n, a, x, y);
        return;
    }
#endif
#ifdef MPQ__HAVE_AVX2
    if (f & MPQ__CPU_AVX2) {
        mpq__axpy_f32_avx2(n, a, x, y);
        return;
    }
#endif
    for (int k = 0; k < n; k++) y[k] += a * x[k];
}

/* Everything one evaluation of the AWQ objective needs. */
typedef struct mpq__awq {
    const mpq__shape *s;
    const mpq_bitplane_desc *d;
    const float *W;
    const float *XT; /* cols x tp: the tokens transposed, packed column order, zero past `tokens` */
    int tokens, tp;  /* tp: tokens rounded up to MPQ__GCF */
} mpq__awq;

#define MPQ__AWQ_ROWS 64  /* rows of W per task of the objective */
#define MPQ__AWQ_KB   256 /* columns per pass over the tokens (a slab of XT that stays in cache) */

/* delta[k] = (q(v_k) - v_k) c_k for one group v (len values, already
   divided by c) quantized as mpq_pack does; tmp: len floats. */
static void mpq__awq_group_delta(const mpq_format_traits *f, int b, int symmetric, const float *v, const float *c,
                                 int len, float clip, float *tmp, uint8_t *q, float *delta)
{
    uint16_t sh, zh;
    float s, z;
    mpq__quant_any(f, b, symmetric, v, len, clip, tmp, q, &sh, &zh);
    f->pair(b, sh, zh, &s, &z);
    const int qmax = (1 << b) - 1;
    for (int k = 0; k < len; k++) delta[k] = (s * (float)(2 * (int)q[k] - qmax) + z - v[k]) * c[k];
}

/* Delta (original scale) of packed row i quantized with column scales c and
   clips (per group of row i, or NULL): delta[j] = (q(w~_j / c_j) - w~_j / c_j) c_j.
   buf: 3 * cols floats. Returns 0 when a scaled weight leaves the format's
   range (the fp16 pairs'). */
static int mpq__awq_delta(const mpq__awq *a, int i, const float *c, const float *clips, float *delta, float *buf)
{
    const mpq__shape *s = a->s;
    const int n = s->cols;
    const float *src = a->W + (size_t)(a->d->p_row ? a->d->p_row[i] : (uint32_t)i) * (size_t)n;
    float *v = buf, *tmp = buf + n;
    uint8_t *q = (uint8_t *)(void *)(buf + 2 * n);
    int ok = 1;
    if (a->d->p_col)
        for (int j = 0; j < n; j++) v[j] = src[a->d->p_col[j]] / c[j];
    else
        for (int j = 0; j < n; j++) v[j] = src[j] / c[j];
    for (int j = 0; j < n; j++) ok &= fabsf(v[j]) <= s->f->max_abs;
    if (!ok) return 0;
    for (int g = 0; g < s->ngroups; g++) {
        const int b = mpq__bits_at(s, i, g), o = g * s->group;
        mpq__awq_group_delta(s->f, b, (int)((s->symmetric >> b) & 1u), v + o, c + o, mpq__group_cols(s, g),
                             clips ? clips[g] : 0.0f, tmp, q, delta + o);
    }
    return 1;
}

/* Scratch per thread of the objective: MPQ__AWQ_ROWS rows of deltas and
   of outputs, and mpq__awq_delta's buffer. */
static size_t mpq__awq_per(const mpq__shape *s, int tp)
{
    return mpq__align64(sizeof(float) * MPQ__AWQ_ROWS * ((size_t)s->cols + (size_t)tp)) +
        mpq__align64(sizeof(float) * 3u * (size_t)s->cols + 64u);
}

/* The objective: mean over tokens and rows of the squared output error,
   the outputs of a task's rows as one product with the tokens. */
static double mpq__awq_loss(const mpq__awq *a, const float *c, const float *clip, uint8_t *work, int nth)
{
    const mpq__shape *s = a->s;
    const size_t n = (size_t)s->cols, tp = (size_t)a->tp, per = mpq__awq_per(s, a->tp);
    const int ntask = (s->rows + MPQ__AWQ_ROWS - 1) / MPQ__AWQ_ROWS;
    double total = 0.0;
    int bad = 0;
    (void)nth;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : total, bad) num_threads(nth)
#endif
    for (int task = 0; task < ntask; task++) {
        uint8_t *mine = work + per * (size_t)mpq__thread_id();
        float *delta = (float *)(void *)mine, *E = delta + MPQ__AWQ_ROWS * n;
        float *buf = (float *)(void *)(mine + mpq__align64(sizeof(float) * MPQ__AWQ_ROWS * (n + tp)));
        const int r0 = task * MPQ__AWQ_ROWS, nr = s->rows - r0 < MPQ__AWQ_ROWS ? s->rows - r0 : MPQ__AWQ_ROWS;
        const int nrp = (nr + MPQ__GR - 1) / MPQ__GR * MPQ__GR;
        for (int r = 0; r < nrp; r++) {
            float *dr = delta + (size_t)r * n;
            if (r >= nr)
                memset(dr, 0, sizeof(float) * n);
            else if (!mpq__awq_delta(a, r0 + r, c, clip ? clip + (size_t)(r0 + r) * (size_t)s->ngroups : NULL, dr, buf))
                bad = 1;
        }
        if (bad) continue;
        memset(E, 0, sizeof(float) * (size_t)nrp * tp);
        for (size_t k0 = 0; k0 < n; k0 += MPQ__AWQ_KB) {
            const int kb = (int)(n - k0 < MPQ__AWQ_KB ? n - k0 : MPQ__AWQ_KB);
            for (size_t t0 = 0; t0 < tp; t0 += MPQ__GCF)
                for (int r = 0; r < nrp; r += MPQ__GR)
                    mpq__gtile_f32(kb, delta + (size_t)r * n + k0, n, a->XT + k0 * tp + t0, tp, E + (size_t)r * tp + t0,
                                   tp);
        }
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < a->tokens; t++) {
                const double e = E[(size_t)r * tp + (size_t)t];
                total += e * e;
            }
    }
    return bad ? HUGE_VAL : total / ((double)a->tokens * (double)s->rows);
}

/* X (tokens x cols, original order) transposed into cols x tp, columns in
   packed order, zero past the tokens taken: token u of the copy is row
   (u * tokens) / count of X (count of them, evenly spaced). */
static float *mpq__awq_transpose(const mpq_bitplane_desc *d, const float *X, int tokens, int count, int cols, int *tp)
{
    *tp = (count + MPQ__GCF - 1) / MPQ__GCF * MPQ__GCF;
    float *XT = (float *)mpq_aligned_alloc(sizeof(float) * (size_t)cols * (size_t)*tp);
    if (!XT) return NULL;
    for (int j = 0; j < cols; j++) {
        float *row = XT + (size_t)j * (size_t)*tp;
        const size_t src = d->p_col ? d->p_col[j] : (uint32_t)j;
        for (int u = 0; u < *tp; u++)
            row[u] = u < count ? X[(size_t)(((int64_t)u * tokens) / count) * (size_t)cols + src] : 0.0f;
    }
    return XT;
}

MPQ_DEF mpq_status mpq_awq_search(const mpq_bitplane_desc *d, const float *W, const mpq_awq_desc *ad, float *col_scale,
                                  float *clip, mpq_awq_result *res)
{
    mpq__shape s;
    mpq_status st = mpq__shape_from_desc(d, &s);
    if (st != MPQ_OK) return st;
    if (!W || !ad || !ad->X || !col_scale) return MPQ_ERR_ARG;
    if (d->rotation) { /* the search on W V^T and the inputs V x (X V^T), the same rows rotation */
        if (ad->tokens < 1) return MPQ_ERR_SIZE;
        float *Wr, *Xr, *none;
        if ((st = mpq__rotated_copies(d->rotation, s.rows, W, NULL, &Wr, &none)) != MPQ_OK) return st;
        if ((st = mpq__rotated_copies(d->rotation, ad->tokens, ad->X, NULL, &Xr, &none)) != MPQ_OK) {
            MPQ_FREE(Wr);
            return st;
        }
        mpq_bitplane_desc dr = *d;
        mpq_awq_desc ar = *ad;
        dr.rotation = NULL, ar.X = Xr;
        st = mpq_awq_search(&dr, Wr, &ar, col_scale, clip, res);
        MPQ_FREE(Wr);
        MPQ_FREE(Xr);
        return st;
    }
    const int grid = ad->grid ? ad->grid : 20, steps = ad->clip_steps ? ad->clip_steps : 20;
    const float shrink = ad->max_shrink != 0.0f ? ad->max_shrink : 0.5f;
    if (ad->tokens < 1 || grid < 1 || ad->clip_tokens < 0) return MPQ_ERR_SIZE;
    if (!(shrink > 0.0f && shrink < 1.0f)) return MPQ_ERR_ARG;
    if (steps > 0 && !clip) return MPQ_ERR_ARG;
    if (d->p_row && (st = mpq__perm_check(d->p_row, s.rows)) != MPQ_OK) return st;
    if (d->p_col && (st = mpq__perm_check(d->p_col, s.cols)) != MPQ_OK) return st;
    for (size_t k = 0; k < (size_t)s.rows * (size_t)s.cols; k++)
        if (!mpq__finite(W[k])) return MPQ_ERR_NONFINITE;
    for (size_t k = 0; k < (size_t)ad->tokens * (size_t)s.cols; k++)
        if (!mpq__finite(ad->X[k])) return MPQ_ERR_NONFINITE;

    const size_t n = (size_t)s.cols;
    const int nth = mpq__max_threads();
    const int ct = ad->clip_tokens ? (ad->clip_tokens < ad->tokens ? ad->clip_tokens : ad->tokens)
                                   : (ad->tokens < 32 ? ad->tokens : 32);
    int tp = 0, ctp = 0;
    float *mean = (float *)MPQ_MALLOC(sizeof(float) * n * 3), *c = mean + n, *best = c + n;
    float *XT = mpq__awq_transpose(d, ad->X, ad->tokens, ad->tokens, s.cols, &tp);
    float *XC = steps > 0 ? mpq__awq_transpose(d, ad->X, ad->tokens, ct, s.cols, &ctp) : NULL;
    const int ncand = (steps + 1 + MPQ__GR - 1) / MPQ__GR * MPQ__GR; /* clip candidates, padded to whole tiles */
    const size_t cslab = mpq__align64(sizeof(float) * (size_t)ncand * ((size_t)s.group + (size_t)ctp));
    const size_t per = mpq__awq_per(&s, tp), cper = cslab + mpq__align64(sizeof(float) * 3u * (size_t)s.group + 64u);
    uint8_t *work = (uint8_t *)mpq_aligned_alloc((per > cper ? per : cper) * (size_t)nth);
    if (!mean || !work || !XT || (steps > 0 && !XC)) {
        MPQ_FREE(mean);
        mpq_aligned_free(work);
        mpq_aligned_free(XT);
        mpq_aligned_free(XC);
        return MPQ_ERR_NOMEM;
    }
    mpq__awq a = {&s, d, W, XT, ad->tokens, tp};

    /* mean |x| per packed column */
    for (size_t j = 0; j < n; j++) {
        double m = 0.0;
        for (int t = 0; t < ad->tokens; t++) m += fabs((double)XT[j * (size_t)tp + (size_t)t]);
        mean[j] = (float)(m / ad->tokens);
    }
    /* 1. the scale grid; alpha = 0 (every c = 1) is plain RTN */
    double best_loss = HUGE_VAL, rtn = HUGE_VAL;
    float best_alpha = 0.0f;
    for (int k = 0; k < grid; k++) {
        const float alpha = (float)k / (float)grid;
        double mx = 0.0, mn = HUGE_VAL;
        for (size_t j = 0; j < n; j++) {
            double sj = pow(fmax((double)mean[j], 1e-4), (double)alpha);
            c[j] = (float)sj;
            mx = sj > mx ? sj : mx;
            mn = sj < mn ? sj : mn;
        }
        const double norm = sqrt(mx * mn);
        for (size_t j = 0; j < n; j++) c[j] = (float)(norm / (double)c[j]); /* c = 1 / (s / norm) */
        double loss = mpq__awq_loss(&a, c, NULL, work, nth);
        if (k == 0) rtn = loss;
        if (loss < best_loss) {
            best_loss = loss;
            best_alpha = alpha;
            memcpy(best, c, sizeof(float) * n);
        }
    }
    if (best_loss == HUGE_VAL) { /* not even RTN fits the fp16 pairs */
        MPQ_FREE(mean);
        mpq_aligned_free(work);
        mpq_aligned_free(XT);
        mpq_aligned_free(XC);
        return MPQ_ERR_RANGE;
    }
    /* 2. clips, group by group, on evenly spaced tokens: the deltas of every
       candidate ratio times the group's slab of those tokens, one product */
    double final = best_loss;
    if (steps > 0) {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 8) num_threads(nth)
#endif
        for (int i = 0; i < s.rows; i++) {
            uint8_t *mine = work + cper * (size_t)mpq__thread_id();
            float *D = (float *)(void *)mine, *E = D + (size_t)ncand * (size_t)s.group;
            float *v = (float *)(void *)(mine + cslab);
            float *tmp = v + s.group;
            uint8_t *q = (uint8_t *)(void *)(tmp + s.group);
            const float *src = W + (size_t)(d->p_row ? d->p_row[i] : (uint32_t)i) * n;
            for (int g = 0; g < s.ngroups; g++) {
                const int b = mpq__bits_at(&s, i, g), o = g * s.group, gw = mpq__group_cols(&s, g);
                const int sym = (int)((s.symmetric >> b) & 1u);
                float amax = 0.0f;
                for (int k = 0; k < gw; k++) {
                    v[k] = src[d->p_col ? d->p_col[o + k] : (uint32_t)(o + k)] / best[o + k];
                    amax = fabsf(v[k]) > amax ? fabsf(v[k]) : amax;
                }
                for (int step = 0; step < ncand; step++) {
                    float *ds = D + (size_t)step * (size_t)s.group;
                    if (step > steps) {
                        memset(ds, 0, sizeof(float) * (size_t)gw);
                        continue;
                    }
                    const float cl = step ? (1.0f - (float)step * shrink / (float)steps) * amax : 0.0f;
                    mpq__awq_group_delta(s.f, b, sym, v, best + o, gw, cl, tmp, q, ds);
                }
                memset(E, 0, sizeof(float) * (size_t)ncand * (size_t)ctp);
                for (int t0 = 0; t0 < ctp; t0 += MPQ__GCF)
                    for (int r = 0; r < ncand; r += MPQ__GR)
                        mpq__gtile_f32(gw, D + (size_t)r * (size_t)s.group, (size_t)s.group,
                                       XC + (size_t)o * (size_t)ctp + t0, (size_t)ctp, E + (size_t)r * (size_t)ctp + t0,
                                       (size_t)ctp);
                double err_best = HUGE_VAL;
                float clip_best = 0.0f;
                for (int step = 0; step <= steps; step++) {
                    double err = 0.0;
                    for (int u = 0; u < ct; u++) {
                        const double e = E[(size_t)step * (size_t)ctp + (size_t)u];
                        err += e * e;
                    }
                    if (err < err_best) {
                        err_best = err;
                        clip_best = step ? (1.0f - (float)step * shrink / (float)steps) * amax : 0.0f;
                    }
                }
                clip[(size_t)i * (size_t)s.ngroups + (size_t)g] = clip_best;
            }
        }
        final = mpq__awq_loss(&a, best, clip, work, nth);
    } else if (clip)
        memset(clip, 0, sizeof(float) * (size_t)s.rows * (size_t)s.ngroups);
    memcpy(col_scale, best, sizeof(float) * n);
    if (res) {
        res->alpha = best_alpha;
        res->loss_rtn = rtn;
        res->loss_scaled = best_loss;
        res->loss_final = final;
    }
    MPQ_FREE(mean);
    mpq_aligned_free(work);
    mpq_aligned_free(XT);
    mpq_aligned_free(XC);
    return MPQ_OK;
}

/* ========================================================================== */
/* 8. GPTQ                                                                    */
/* ========================================================================== */

#define MPQ__CHOL_NB 256 /* columns per panel of the factorisation */
#define MPQ__CHOL_CB 128 /* columns per block of its trailing update (a slab of the panel that stays in cache) */

/* Lower Cholesky factor of the n x n matrix F (row stride ld, at least
   round_up(n, 32) rows and columns, rows and columns past n zero but for
   a unit diagonal), in place: F = L L^T, L in the lower triangle (the upper
   one is left with partial sums). Right-looking, by panels of
   MPQ__CHOL_NB columns: the diagonal block, the panel below it by
   substitution (row by row, the panel's columns as vectors), the rest of
   the lower triangle by one product, in column blocks of MPQ__CHOL_CB. P:
   scratch of MPQ__CHOL_NB x ld doubles. MPQ_ERR_NOTPD when a pivot is not
   positive. */
static mpq_status mpq__cholesky(double *F, int n, size_t ld, double *P, int nth)
{
    const int nr = (n + MPQ__GR - 1) / MPQ__GR * MPQ__GR;
    double *LT = (double *)MPQ_MALLOC(sizeof(double) * (MPQ__CHOL_NB * MPQ__CHOL_NB + MPQ__CHOL_NB));
    if (!LT) return MPQ_ERR_NOMEM;
    double *inv = LT + MPQ__CHOL_NB * MPQ__CHOL_NB;
    for (int kb = 0; kb < n; kb += MPQ__CHOL_NB) {
        const int ke = kb + MPQ__CHOL_NB < n ? kb + MPQ__CHOL_NB : n, nb = ke - kb;
        for (int j = kb; j < ke; j++) { /* the diagonal block */
            double *fj = F + (size_t)j * ld;
            double s = fj[j];
            for (int k = kb; k < j; k++) s -= fj[k] * fj[k];
            if (!(s > 0.0) || !(s < HUGE_VAL)) {
                MPQ_FREE(LT);
                return MPQ_ERR_NOTPD;
            }
            fj[j] = sqrt(s);
            for (int i = j + 1; i < ke; i++) {
                double *fi = F + (size_t)i * ld, t = fi[j];
                for (int k = kb; k < j; k++) t -= fi[k] * fj[k];
                fi[j] = t / fj[j];
            }
        }
        for (int j = 0; j < nb; j++) { /* its transpose and reciprocal diagonal, for the panel */
            inv[j] = 1.0 / F[(size_t)(kb + j) * ld + (size_t)(kb + j)];
            for (int i = j + 1; i < nb; i++)
                LT[(size_t)j * nb + (size_t)i] = F[(size_t)(kb + i) * ld + (size_t)(kb + j)];
        }
        (void)nth;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nth)
#endif
        for (int i = ke; i < nr; i++) { /* the panel: F[i][kb..ke) L_kk^-T; then P = -panel^T */
            double *fi = F + (size_t)i * ld + (size_t)kb;
            for (int j = 0; j < nb; j++) {
                const double x = fi[j] * inv[j], *lt = LT + (size_t)j * nb;
                fi[j] = x;
                for (int k = j + 1; k < nb; k++) fi[k] -= x * lt[k];
            }
            for (int k = 0; k < nb; k++) P[(size_t)k * ld + (size_t)i] = -fi[k];
        }
        const int ncb = ke < n ? (nr - ke + MPQ__CHOL_CB - 1) / MPQ__CHOL_CB : 0; /* none after the last panel */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth)
#endif
        for (int cb = 0; cb < ncb; cb++) { /* the trailing lower triangle, a block of columns at a time */
            const int jb = ke + cb * MPQ__CHOL_CB, je = jb + MPQ__CHOL_CB < nr ? jb + MPQ__CHOL_CB : nr;
            for (int i0 = jb; i0 < nr; i0 += MPQ__GR)
                for (int j0 = jb; j0 < je && j0 < i0 + MPQ__GR; j0 += MPQ__GCD)
                    mpq__gtile_f64(nb, F + (size_t)i0 * ld + (size_t)kb, ld, P + (size_t)j0, ld,
                                   F + (size_t)i0 * ld + (size_t)j0, ld);
        }
    }
    MPQ_FREE(LT);
    return MPQ_OK;
}

/* mpq__cholesky in float32 (the products through mpq__gtile_f32, column
   tiles of MPQ__GCF; the diagonal blocks' sums in float64), with P by
   panels: the negated panel's transpose as ld / MPQ__GCF pieces of nb x
   MPQ__GCF floats, each contiguous (element (k, i) of P^T at
   ((i / MPQ__GCF) nb + k) MPQ__GCF + i % MPQ__GCF), so that the product's
   right-hand operand is read from a few pages. P: scratch of MPQ__CHOL_NB x
   ld floats, zero past row n. */
static mpq_status mpq__cholesky_f32(float *F, int n, size_t ld, float *P, int nth)
{
    const int nr = (n + MPQ__GR - 1) / MPQ__GR * MPQ__GR;
    float *LT = (float *)MPQ_MALLOC(sizeof(float) * (MPQ__CHOL_NB * MPQ__CHOL_NB + MPQ__CHOL_NB));
    if (!LT) return MPQ_ERR_NOMEM;
    float *inv = LT + MPQ__CHOL_NB * MPQ__CHOL_NB;
    for (int kb = 0; kb < n; kb += MPQ__CHOL_NB) {
        const int ke = kb + MPQ__CHOL_NB < n ? kb + MPQ__CHOL_NB : n, nb = ke - kb;
        for (int j = kb; j < ke; j++) { /* the diagonal block */
            float *fj = F + (size_t)j * ld;
            double s = fj[j];
            for (int k = kb; k < j; k++) s -= (double)fj[k] * fj[k];
            if (!(s > 0.0) || !(s < HUGE_VAL) || !((float)sqrt(s) > 0.0f)) {
                MPQ_FREE(LT);
                return MPQ_ERR_NOTPD;
            }
            fj[j] = (float)sqrt(s);
            for (int i = j + 1; i < ke; i++) {
                float *fi = F + (size_t)i * ld;
                double t = fi[j];
                for (int k = kb; k < j; k++) t -= (double)fi[k] * fj[k];
                fi[j] = (float)(t / fj[j]);
            }
        }
        for (int j = 0; j < nb; j++) { /* its transpose and reciprocal diagonal, for the panel */
            inv[j] = 1.0f / F[(size_t)(kb + j) * ld + (size_t)(kb + j)];
            for (int i = j + 1; i < nb; i++)
                LT[(size_t)j * nb + (size_t)i] = F[(size_t)(kb + i) * ld + (size_t)(kb + j)];
        }
        (void)nth;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nth)
#endif
        for (int i = ke; i < nr; i++) { /* the panel: F[i][kb..ke) L_kk^-T; then P = -panel^T */
            float *fi = F + (size_t)i * ld + (size_t)kb;
            for (int j = 0; j < nb; j++) {
                const float x = fi[j] * inv[j], *lt = LT + (size_t)j * nb;
                fi[j] = x;
                for (int k = j + 1; k < nb; k++) fi[k] -= x * lt[k];
            }
            float *pi = P + ((size_t)(i / MPQ__GCF) * (size_t)nb) * MPQ__GCF + (size_t)(i % MPQ__GCF);
            for (int k = 0; k < nb; k++) pi[(size_t)k * MPQ__GCF] = -fi[k];
        }
        const int ncb = ke < n ? (nr - ke + MPQ__CHOL_CB - 1) / MPQ__CHOL_CB : 0; /* none after the last panel */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth)
#endif
        for (int cb = 0; cb < ncb; cb++) { /* the trailing lower triangle, a block of columns at a time */
            const int jb = ke + cb * MPQ__CHOL_CB, je = jb + MPQ__CHOL_CB < nr ? jb + MPQ__CHOL_CB : nr;
            for (int i0 = jb; i0 < nr; i0 += MPQ__GR)
                for (int j0 = jb; j0 < je && j0 < i0 + MPQ__GR; j0 += MPQ__GCF)
                    mpq__gtile_f32(nb, F + (size_t)i0 * ld + (size_t)kb, ld,
                                   P + (size_t)(j0 / MPQ__GCF) * (size_t)nb * MPQ__GCF, MPQ__GCF,
                                   F + (size_t)i0 * ld + (size_t)j0, ld);
        }
    }
    MPQ_FREE(LT);
    return MPQ_OK;
}

/* The quantization grid of one group of one row: the stored metadata and
   what the column loop needs to place a value on it. */
typedef struct mpq__gq {
    const mpq_format_traits *f;
    int bits;
    uint16_t sh, zh; /* as stored */
    float s, z;      /* s^ and z^ of that metadata */
} mpq__gq;

static void mpq__gq_set(mpq__gq *q, const mpq_format_traits *f, int bits, uint16_t sh, uint16_t zh)
{
    q->f = f, q->bits = bits, q->sh = sh, q->zh = zh;
    f->pair(bits, sh, zh, &q->s, &q->z);
}

/* The code of v on the grid and its value (bit for bit what the packed
   matrix dequantizes to). */
static uint8_t mpq__gq_code(const mpq__gq *q, float v, float *value)
{
    return q->f->code_of(q->bits, q->sh, q->s, q->z, v, value);
}

/* Everything the row tiles share. */
typedef struct mpq__gptq {
    const mpq__shape *s;
    const mpq_bitplane_desc *d;
    const float *Wp;    /* rows (padded to MPQ__GR) x ld: W~ / c in packed coordinates */
    const float *Rp;    /* R right of each block, as panels (mpq__gptq_rows) */
    const size_t *roff; /* where each block's panels start in Rp */
    const float *Ub;    /* U inside each block, block x block floats a block */
    const double *ud;   /* U[j][j] = 1 / R[j][j] */
    size_t ld;          /* row stride of Wp: round_up(cols, 32) + 32 */
    int block, static_groups;
    uint8_t *codes;    /* rows x cols, packed coordinates */
    uint16_t *sh, *zh; /* rows x ngroups */
} mpq__gptq;

#define MPQ__GPTQ_TILE  64      /* rows of W per task: each task runs GPTQ on its rows alone */
#define MPQ__GPTQ_ROWS  MPQ__GR /* rows whose column loops run side by side (tasks are whole multiples of it) */
/* A task's sums a (mpq__gptq_tile) lie by panels of MPQ__GCF columns, each
   MPQ__GPTQ_TILE rows x MPQ__GCF floats: column k of a row at this offset
   from the row's start in the first panel. */
#define MPQ__GPTQ_AT(k) ((size_t)((k) / MPQ__GCF) * MPQ__GPTQ_TILE * MPQ__GCF + (size_t)((k) % MPQ__GCF))

/* The pair of group g of packed row i from the group's current weights v. */
static int mpq__gptq_pair(const mpq__gptq *G, int i, int g, const float *v, float *tmp, uint8_t *qtmp, mpq__gq *q)
{
    const mpq__shape *s = G->s;
    const int b = mpq__bits_at(s, i, g), gw = mpq__group_cols(s, g);
    const float clip = G->d->clip ? G->d->clip[(size_t)i * (size_t)s->ngroups + (size_t)g] : 0.0f;
    uint16_t sh, zh;
    for (int k = 0; k < gw; k++)
        if (!(fabsf(v[k]) <= s->f->max_abs)) return 0;
    mpq__quant_any(s->f, b, (int)((s->symmetric >> b) & 1u), v, gw, clip, tmp, qtmp, &sh, &zh);
    if (!s->f->meta_valid(sh, zh)) return 0;
    mpq__gq_set(q, s->f, b, sh, zh);
    G->sh[(size_t)i * (size_t)s->ngroups + (size_t)g] = sh;
    G->zh[(size_t)i * (size_t)s->ngroups + (size_t)g] = zh;
    return 1;
}

/* GPTQ on the rows [r0, r1) (a multiple of MPQ__GR rows, the last ones
   padding), block by block (section 8's note on R and U). A: MPQ__GPTQ_TILE
   x ld floats, the sums a_k = sum_{i < b0} d_i R[i][k] of the blocks before
   (d_i = w_i - q_i), laid out as MPQ__GPTQ_AT says; D: MPQ__GPTQ_TILE x
   block floats, d of the block's columns; v: MPQ__GPTQ_ROWS x block floats,
   those rows' current weights in the block; tmp: a group of floats and one
   of codes; gq: MPQ__GPTQ_TILE x ngroups grids. Returns 0 when a group's
   pair leaves the fp16 range. */
static int mpq__gptq_tile(const mpq__gptq *G, int r0, int r1, float *A, float *D, float *v, float *tmp, mpq__gq *gq,
                          double *loss)
{
    const mpq__shape *s = G->s;
    const int n = s->cols, B = G->block, rows = s->rows;
    const size_t ld = G->ld;
    uint8_t *qtmp = (uint8_t *)(void *)(tmp + s->group);
    double acc = 0.0;
    memset(A, 0, sizeof(float) * MPQ__GPTQ_TILE * ld);
    if (G->static_groups)
        for (int i = r0; i < r1 && i < rows; i++)
            for (int g = 0; g < s->ngroups; g++)
                if (!mpq__gptq_pair(G, i, g, G->Wp + (size_t)i * ld + (size_t)g * (size_t)s->group, tmp, qtmp,
                                    &gq[(size_t)(i - r0) * s->ngroups + g]))
                    return 0;
    for (int b0 = 0; b0 < n; b0 += B) {
        const int b1 = b0 + B < n ? b0 + B : n, bw = b1 - b0;
        const float *ub = G->Ub + (size_t)(b0 / B) * (size_t)B * (size_t)B;
        for (int i0 = r0; i0 < r1; i0 += MPQ__GPTQ_ROWS) {
            /* MPQ__GPTQ_ROWS rows side by side, a column at a time: each row's
               column loop is a chain of dependent steps, the rows' chains are
               independent */
            const int ie = i0 + MPQ__GPTQ_ROWS < rows ? i0 + MPQ__GPTQ_ROWS : rows;
            for (int i = i0; i < i0 + MPQ__GPTQ_ROWS; i++) {
                const float *w = G->Wp + (size_t)i * ld;
                const float *a = A + (size_t)(i - r0) * MPQ__GCF; /* a_k at a[MPQ__GPTQ_AT(k)] */
                float *vi = v + (size_t)(i - i0) * (size_t)B;
                if (i >= rows) { /* padding rows: nothing to feed forward */
                    memset(D + (size_t)(i - r0) * (size_t)B, 0, sizeof(float) * (size_t)bw);
                    continue;
                }
                /* the block as the earlier blocks left it: v_k = w_k + sum_{b0 <= l <= k} a_l U[l][k] */
                for (int k = b0; k < b1; k++) vi[k - b0] = w[k] + (float)((double)a[MPQ__GPTQ_AT(k)] * G->ud[k]);
                for (int l = 0; l < bw; l++)
                    mpq__axpy_f32(bw - l - 1, a[MPQ__GPTQ_AT(b0 + l)], ub + (size_t)l * (size_t)B + l + 1, vi + l + 1);
            }
            for (int j = b0; j < b1; j++) { /* then the paper's column loop inside the block */
                const int g = j / s->group, jb = j - b0;
                const float *uj = ub + (size_t)jb * (size_t)B + jb + 1;
                for (int i = i0; i < ie; i++) {
                    float *vi = v + (size_t)(i - i0) * (size_t)B, value;
                    mpq__gq *q = gq + (size_t)(i - r0) * s->ngroups + g;
                    if (!G->static_groups && j == g * s->group && !mpq__gptq_pair(G, i, g, vi + jb, tmp, qtmp, q))
                        return 0;
                    G->codes[(size_t)i * (size_t)n + (size_t)j] = mpq__gq_code(q, vi[jb], &value);
                    const float e = (float)((double)(vi[jb] - value) / G->ud[j]);
                    acc += (double)e * e;
                    D[(size_t)(i - r0) * (size_t)B + (size_t)jb] = G->Wp[(size_t)i * ld + (size_t)j] - value;
                    mpq__axpy_f32(bw - jb - 1, -e, uj, vi + jb + 1);
                }
            }
        }
        if (b1 >= n) break;
        /* the lazy batch: every later column of these rows at once */
        const float *rp = G->Rp + G->roff[b0 / B];
        for (int j0 = b1 / MPQ__GCF * MPQ__GCF; j0 < n; j0 += MPQ__GCF, rp += (size_t)bw * MPQ__GCF)
            for (int i = r0; i < r1; i += MPQ__GR)
                mpq__gtile_f32(bw, D + (size_t)(i - r0) * (size_t)B, (size_t)B, rp, MPQ__GCF,
                               A + MPQ__GPTQ_AT(j0) + (size_t)(i - r0) * MPQ__GCF, MPQ__GCF);
    }
    *loss += acc;
    return 1;
}

MPQ_DEF mpq_status mpq_gptq_act_order(const float *H, int cols, uint32_t *p_col)
{
    if (!H || !p_col) return MPQ_ERR_ARG;
    if (cols < 1) return MPQ_ERR_SIZE;
    float *diag = (float *)MPQ_MALLOC(sizeof(float) * (size_t)cols);
    if (!diag) return MPQ_ERR_NOMEM;
    for (int j = 0; j < cols; j++) diag[j] = H[(size_t)j * (size_t)cols + (size_t)j];
    mpq_status st = mpq_argsort_desc(diag, (size_t)cols, p_col);
    MPQ_FREE(diag);
    return st;
}

/* One factorisation of GPTQ's Hessian, in the form the row tiles read. */
typedef struct mpq__gfac {
    int n, B, ndead, bits; /* bits: 32 or 64, the factorisation's precision */
    double lambda;
    uint8_t *dead;  /* packed columns with H[j][j] = 0 */
    double *ud;     /* U[j][j] */
    size_t *roff;   /* where each block's panels start in Rp */
    float *Rp, *Ub; /* as mpq__gptq's */
} mpq__gfac;

static void mpq__gfac_free(mpq__gfac *f)
{
    MPQ_FREE(f->dead);
    MPQ_FREE(f->ud);
    MPQ_FREE(f->roff);
    mpq_aligned_free(f->Rp);
    mpq_aligned_free(f->Ub);
    memset(f, 0, sizeof *f);
}

/* H~ = diag(c) H[p][p] diag(c) in packed order, flipped (row a of F is
   packed column n-1-a), into the lower triangle of Fd (float64) or Ff
   (float32), np x np, zero elsewhere: F = L L^T then makes H~ = R R^T with
   the upper R[j][k] = L[n-1-j][n-1-k]. By tiles of MPQ__GPAD x MPQ__GPAD,
   so that the reads of H (along its rows when there is no permutation)
   and the writes of F both stay in cache. */
static void mpq__gfac_fill(const mpq_bitplane_desc *d, const float *H, int n, size_t np, double *Fd, float *Ff, int nth)
{
    const int nt = (int)(np / MPQ__GPAD);
    (void)nth;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth)
#endif
    for (int ta = 0; ta < nt; ta++) {
        const int a0 = ta * MPQ__GPAD, a1 = a0 + MPQ__GPAD < n ? a0 + MPQ__GPAD : n;
        if (Fd)
            memset(Fd + (size_t)a0 * np, 0, sizeof(double) * np * MPQ__GPAD);
        else
            memset(Ff + (size_t)a0 * np, 0, sizeof(float) * np * MPQ__GPAD);
        for (int b0 = 0; b0 < a1; b0 += MPQ__GPAD)
            for (int b = b0; b < b0 + MPQ__GPAD && b < a1; b++) {
                const int y = n - 1 - b;
                const uint32_t py = d->p_col ? d->p_col[y] : (uint32_t)y;
                const double cy = d->col_scale ? (double)d->col_scale[y] : 1.0;
                for (int a = a0 > b ? a0 : b; a < a1; a++) {
                    const int x = n - 1 - a;
                    const uint32_t px = d->p_col ? d->p_col[x] : (uint32_t)x;
                    const double cx = d->col_scale ? (double)d->col_scale[x] : 1.0;
                    const size_t at = px >= py ? (size_t)px * (size_t)n + py : (size_t)py * (size_t)n + px;
                    const double v = cx * cy * (double)H[at];
                    if (Fd)
                        Fd[(size_t)a * np + (size_t)b] = v;
                    else
                        Ff[(size_t)a * np + (size_t)b] = (float)v;
                }
            }
    }
}

/* y = A v for the symmetric A whose lower triangle is Ff's (n x n, row
   stride np), in float64. */
static void mpq__sym_mv(const float *Ff, int n, size_t np, const double *v, double *y)
{
    for (int a = 0; a < n; a++) y[a] = 0.0;
    for (int a = 0; a < n; a++) {
        const float *fa = Ff + (size_t)a * np;
        double s = 0.0;
        for (int b = 0; b < a; b++) {
            s += (double)fa[b] * v[b];
            y[b] += (double)fa[b] * v[a];
        }
        y[a] += s + (double)fa[a] * v[a];
    }
}

/* y = L L^T v for the lower L in Ff, in float64 (t: n doubles). */
static void mpq__llt_mv(const float *Ff, int n, size_t np, const double *v, double *t, double *y)
{
    for (int i = 0; i < n; i++) t[i] = 0.0;
    for (int a = 0; a < n; a++) /* t = L^T v */
        for (int i = 0; i <= a; i++) t[i] += (double)Ff[(size_t)a * np + (size_t)i] * v[a];
    for (int a = 0; a < n; a++) { /* y = L t */
        double s = 0.0;
        for (int i = 0; i <= a; i++) s += (double)Ff[(size_t)a * np + (size_t)i] * t[i];
        y[a] = s;
    }
}

#define MPQ__GFAC_PROBES 2 /* vectors the float32 factorisation is checked on */

/* The factorisation of H~ = diag(c) H[p][p] diag(c) + lambda I (packed
   order, d's p_col and col_scale) for lazy batches of B columns. With
   dampening it is first made in float32 and kept when its backward error
   is small against lambda: for MPQ__GFAC_PROBES fixed vectors v of +-1,
   ||(L L^T - A) v|| <= MPQ_GPTQ_F32_TOL lambda ||v||, A the matrix it
   factorised; the float32 factor is then the exact one of a matrix that
   differs from A by far less than the dampening already does. Otherwise
   (no dampening, a pivot not positive, a larger error) in float64. */
static mpq_status mpq__gfac_make(const mpq_bitplane_desc *d, const float *H, int n, int B, double damp, int f64,
                                 mpq__gfac *f)
{
    memset(f, 0, sizeof *f);
    const size_t np = ((size_t)n + MPQ__GPAD - 1) / MPQ__GPAD * MPQ__GPAD;
    const int nth = mpq__max_threads(), nblk = (n + B - 1) / B;
    double *F = NULL, *P = NULL, *urow = NULL, mean = 0.0;
    float *Ff = NULL, *Pf = NULL;
    size_t rfloats = 0;
    mpq_status st = MPQ_OK;
    f->n = n, f->B = B;
    f->ud = (double *)MPQ_MALLOC(sizeof(double) * (size_t)n);
    f->dead = (uint8_t *)MPQ_MALLOC((size_t)n);
    f->roff = (size_t *)MPQ_MALLOC(sizeof(size_t) * (size_t)nblk);
    if (!f->ud || !f->dead || !f->roff) {
        st = MPQ_ERR_NOMEM;
        goto done;
    }
    for (int prec = damp > 0.0 && !f64 ? 32 : 64; prec <= 64; prec += 32) {
        if (prec == 32) {
            Ff = (float *)mpq_aligned_alloc(sizeof(float) * np * np);
            Pf = (float *)mpq_aligned_alloc(sizeof(float) * MPQ__CHOL_NB * np);
            if (!Ff || !Pf) {
                st = MPQ_ERR_NOMEM;
                goto done;
            }
            memset(Pf, 0, sizeof(float) * MPQ__CHOL_NB * np);
        } else {
            F = (double *)mpq_aligned_alloc(sizeof(double) * np * np);
            P = (double *)mpq_aligned_alloc(sizeof(double) * MPQ__CHOL_NB * np);
            if (!F || !P) {
                st = MPQ_ERR_NOMEM;
                goto done;
            }
            memset(P, 0, sizeof(double) * MPQ__CHOL_NB * np);
        }
        mpq__gfac_fill(d, H, n, np, F, Ff, nth);
        mean = 0.0, f->ndead = 0;
        for (int a = 0; a < n; a++) {
            const int x = n - 1 - a;
            const size_t at = (size_t)a * np + (size_t)a;
            f->dead[x] = (F ? F[at] : (double)Ff[at]) == 0.0;
            if (f->dead[x]) {
                if (F)
                    F[at] = 1.0;
                else
                    Ff[at] = 1.0f;
                f->ndead++;
            }
            mean += F ? F[at] : (double)Ff[at];
        }
        f->lambda = damp * mean / n;
        for (size_t a = 0; a < np; a++) {
            const size_t at = a * np + a;
            if (F)
                F[at] = a < (size_t)n ? F[at] + f->lambda : 1.0;
            else
                Ff[at] = a < (size_t)n ? (float)((double)Ff[at] + f->lambda) : 1.0f;
        }
        if (prec == 64) {
            if ((st = mpq__cholesky(F, n, np, P, nth)) != MPQ_OK) goto done;
            break;
        }
        /* float32: A v for the probes before the factorisation overwrites A */
        double *pv = (double *)MPQ_MALLOC(sizeof(double) * (size_t)n * (2u * MPQ__GFAC_PROBES + 2u));
        if (!pv) {
            st = MPQ_ERR_NOMEM;
            goto done;
        }
        double *Av = pv + (size_t)n * MPQ__GFAC_PROBES, *y = Av + (size_t)n * MPQ__GFAC_PROBES, *t = y + n;
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (int q = 0; q < MPQ__GFAC_PROBES; q++) {
            for (int a = 0; a < n; a++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                pv[(size_t)q * n + (size_t)a] = (x >> 40) & 1u ? 1.0 : -1.0;
            }
            mpq__sym_mv(Ff, n, np, pv + (size_t)q * n, Av + (size_t)q * n);
        }
        int keep = mpq__cholesky_f32(Ff, n, np, Pf, nth) == MPQ_OK;
        for (int q = 0; q < MPQ__GFAC_PROBES && keep; q++) {
            mpq__llt_mv(Ff, n, np, pv + (size_t)q * n, t, y);
            double e = 0.0;
            for (int a = 0; a < n; a++) e += (y[a] - Av[(size_t)q * n + a]) * (y[a] - Av[(size_t)q * n + a]);
            keep = sqrt(e) <= MPQ_GPTQ_F32_TOL * f->lambda * sqrt((double)n);
        }
        MPQ_FREE(pv);
        mpq_aligned_free(Pf);
        Pf = NULL;
        if (keep) break;
        mpq_aligned_free(Ff);
        Ff = NULL;
    }
    mpq_aligned_free(P);
    P = NULL;
    f->bits = Ff ? 32 : 64;
    /* Rp: for each block, R[b0 .. b1)[c0 ..) with c0 = b1 rounded down to
       MPQ__GCF, as panels of MPQ__GCF columns, each bw x MPQ__GCF floats
       contiguous (the right-hand operand of the lazy batch, read by every
       row tile), zero left of b1 and past n. Ub: U inside each block, B x B
       floats, row j - b0, column k - b0, zero on and below the diagonal. */
    for (int bb = 0; bb < nblk; bb++) {
        const int b0 = bb * B, b1 = b0 + B < n ? b0 + B : n;
        const int c0 = b1 / MPQ__GCF * MPQ__GCF;
        f->roff[bb] = rfloats;
        if (b1 < n) rfloats += (size_t)(b1 - b0) * (((size_t)(n - c0) + MPQ__GCF - 1) / MPQ__GCF * MPQ__GCF);
    }
    f->Rp = (float *)mpq_aligned_alloc(sizeof(float) * (rfloats ? rfloats : 1u));
    f->Ub = (float *)mpq_aligned_alloc(sizeof(float) * (size_t)nblk * (size_t)B * (size_t)B);
    urow = (double *)MPQ_MALLOC(sizeof(double) * (size_t)B * ((size_t)B + 1u) * (size_t)nth);
    if (!f->Rp || !f->Ub || !urow) {
        st = MPQ_ERR_NOMEM;
        goto done;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth)
#endif
    for (int bb = 0; bb < nblk; bb++) { /* R[j][k] = L[n-1-j][n-1-k]; U's diagonal blocks invert R's */
        const int b0 = bb * B, b1 = b0 + B < n ? b0 + B : n, bw = b1 - b0;
        const int c0 = b1 / MPQ__GCF * MPQ__GCF, npan = b1 < n ? (n - c0 + MPQ__GCF - 1) / MPQ__GCF : 0;
        double *rb = urow + (size_t)B * ((size_t)B + 1u) * (size_t)mpq__thread_id(), *t = rb + (size_t)B * B;
        float *ub = f->Ub + (size_t)bb * (size_t)B * (size_t)B;
        for (int j = b0; j < b1; j++) {
            const size_t rj = (size_t)(n - 1 - j) * np + (size_t)(n - 1); /* R[j][k] at rj - k */
#define MPQ__R(k) (F ? F[rj - (size_t)(k)] : (double)Ff[rj - (size_t)(k)])
            for (int p = 0; p < npan; p++) {
                float *pr = f->Rp + f->roff[bb] + ((size_t)p * (size_t)bw + (size_t)(j - b0)) * MPQ__GCF;
                const int k0 = c0 + p * MPQ__GCF;
                for (int c = 0; c < MPQ__GCF; c++) pr[c] = k0 + c >= b1 && k0 + c < n ? (float)MPQ__R(k0 + c) : 0.0f;
            }
            for (int k = j; k < b1; k++) rb[(size_t)(j - b0) * bw + (k - b0)] = MPQ__R(k);
            f->ud[j] = 1.0 / MPQ__R(j);
#undef MPQ__R
        }
        memset(ub, 0, sizeof(float) * (size_t)B * (size_t)B);
        for (int j = 0; j < bw; j++) { /* row j of U inside the block: U R = I, by substitution */
            float *uj = ub + (size_t)j * (size_t)B;
            for (int k = j; k < bw; k++) t[k] = 0.0;
            for (int l = j; l < bw; l++) {
                const double *rl = rb + (size_t)l * bw, u = l == j ? 1.0 / rl[l] : -t[l] / rl[l];
                if (l > j) uj[l] = (float)u;
                for (int k = l + 1; k < bw; k++) t[k] += u * rl[k];
            }
        }
    }
done:
    mpq_aligned_free(F);
    mpq_aligned_free(P);
    mpq_aligned_free(Ff);
    mpq_aligned_free(Pf);
    MPQ_FREE(urow);
    if (st != MPQ_OK) mpq__gfac_free(f);
    return st;
}

/* The last factorisation and what it was made from (mpq_gptq_cache). */
struct mpq_gptq_cache {
    mpq__gfac f; /* f.n == 0: none */
    double damp;
    int f64;          /* mpq_gptq_desc.float64 */
    float *H;         /* its lower triangle, row by row: n (n + 1) / 2 floats */
    uint32_t *p_col;  /* NULL: none */
    float *col_scale; /* NULL: none */
};

MPQ_DEF mpq_gptq_cache *mpq_gptq_cache_new(void)
{
    mpq_gptq_cache *c = (mpq_gptq_cache *)MPQ_MALLOC(sizeof *c);
    if (c) memset(c, 0, sizeof *c);
    return c;
}

static void mpq__gcache_clear(mpq_gptq_cache *c)
{
    mpq__gfac_free(&c->f);
    MPQ_FREE(c->H);
    MPQ_FREE(c->p_col);
    MPQ_FREE(c->col_scale);
    c->H = NULL, c->p_col = NULL, c->col_scale = NULL;
}

MPQ_DEF void mpq_gptq_cache_free(mpq_gptq_cache *c)
{
    if (!c) return;
    mpq__gcache_clear(c);
    MPQ_FREE(c);
}

/* Whether c holds the factorisation of exactly this H, p_col, col_scale,
   dampening and batch: every value compared bit for bit. */
static int mpq__gcache_hit(const mpq_gptq_cache *c, const mpq_bitplane_desc *d, const float *H, int n, int B,
                           double damp, int f64)
{
    if (!c || c->f.n != n || c->f.B != B || c->f64 != f64 || memcmp(&c->damp, &damp, sizeof damp) != 0) return 0;
    if (!d->p_col != !c->p_col || (d->p_col && memcmp(d->p_col, c->p_col, sizeof(uint32_t) * (size_t)n) != 0)) return 0;
    if (!d->col_scale != !c->col_scale ||
        (d->col_scale && memcmp(d->col_scale, c->col_scale, sizeof(float) * (size_t)n) != 0))
        return 0;
    const float *h = c->H;
    for (int i = 0; i < n; h += i + 1, i++)
        if (memcmp(h, H + (size_t)i * (size_t)n, sizeof(float) * ((size_t)i + 1u)) != 0) return 0;
    return 1;
}

/* Keeps f in c with what it was made from; without the memory for the
   copies c is left empty and f is freed. */
static void mpq__gcache_keep(mpq_gptq_cache *c, const mpq_bitplane_desc *d, const float *H, int n, double damp, int f64,
                             mpq__gfac *f)
{
    mpq__gcache_clear(c);
    c->H = (float *)MPQ_MALLOC(sizeof(float) * ((size_t)n * ((size_t)n + 1u) / 2u));
    c->p_col = d->p_col ? (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)n) : NULL;
    c->col_scale = d->col_scale ? (float *)MPQ_MALLOC(sizeof(float) * (size_t)n) : NULL;
    if (!c->H || (d->p_col && !c->p_col) || (d->col_scale && !c->col_scale)) {
        mpq__gcache_clear(c);
        mpq__gfac_free(f);
        return;
    }
    float *h = c->H;
    for (int i = 0; i < n; h += i + 1, i++) memcpy(h, H + (size_t)i * (size_t)n, sizeof(float) * ((size_t)i + 1u));
    if (d->p_col) memcpy(c->p_col, d->p_col, sizeof(uint32_t) * (size_t)n);
    if (d->col_scale) memcpy(c->col_scale, d->col_scale, sizeof(float) * (size_t)n);
    c->damp = damp, c->f64 = f64;
    c->f = *f;
    memset(f, 0, sizeof *f);
}

/* mpq_gptq with W and H in the coordinates of the columns (rotated). */
static mpq_status mpq__gptq_rows(const mpq_bitplane_desc *d, const float *W, const mpq_gptq_desc *g, void *buf,
                                 size_t bytes, mpq_packed *out, mpq_gptq_result *res)
{
    mpq__shape s;
    mpq__layout L;
    mpq_status st = mpq__pack_check(d, buf, bytes, out, &s, &L);
    if (st != MPQ_OK) return st;
    if (!W || !g || !g->H) return MPQ_ERR_ARG;
    const int n = s.cols, m = s.rows;
    const double damp = g->damp == 0.0 ? 0.01 : (g->damp < 0.0 ? 0.0 : g->damp);
    if (!(damp < HUGE_VAL) || g->block < 0) return MPQ_ERR_RANGE;
    const float *H = g->H;
    for (int i = 0; i < n; i++) { /* the lower triangle is what is read */
        for (int j = 0; j <= i; j++)
            if (!mpq__finite(H[(size_t)i * (size_t)n + (size_t)j])) return MPQ_ERR_NONFINITE;
        if (H[(size_t)i * (size_t)n + (size_t)i] < 0.0f) return MPQ_ERR_RANGE;
    }
    for (int i = 0; i < m; i++) { /* every value that will be quantized, as mpq_pack checks it */
        const float *src = W + (size_t)(d->p_row ? d->p_row[i] : (uint32_t)i) * (size_t)n;
        for (int j = 0; j < n; j++) {
            float v = src[d->p_col ? d->p_col[j] : (uint32_t)j];
            if (!mpq__finite(v)) return MPQ_ERR_NONFINITE;
            if (d->col_scale) v /= d->col_scale[j];
            if (!mpq__finite(v) || fabsf(v) > s.f->max_abs) return MPQ_ERR_RANGE;
        }
    }
    int B = g->block ? g->block : 128;
    B = B <= s.group ? s.group : B / s.group * s.group;
    const size_t np = ((size_t)n + MPQ__GPAD - 1) / MPQ__GPAD * MPQ__GPAD, ld = np + MPQ__GPAD;
    const size_t mp = ((size_t)m + MPQ__GR - 1) / MPQ__GR * MPQ__GR;
    const int nth = mpq__max_threads();
    mpq__gfac own, *f = &own;
    memset(&own, 0, sizeof own);
    if (mpq__gcache_hit(g->cache, d, H, n, B, damp, g->float64 != 0)) {
        f = &g->cache->f;
    } else {
        if (g->cache) mpq__gcache_clear(g->cache); /* its memory first */
        if ((st = mpq__gfac_make(d, H, n, B, damp, g->float64 != 0, &own)) != MPQ_OK) return st;
    }
    float *Wp = (float *)mpq_aligned_alloc(sizeof(float) * mp * ld);
    if (!Wp) {
        st = MPQ_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < mp; i++) { /* the weights GPTQ works on: W~ / c, dead columns zero */
        float *w = Wp + i * ld;
        memset(w, 0, sizeof(float) * ld);
        if (i >= (size_t)m) continue;
        const float *src = W + (size_t)(d->p_row ? d->p_row[i] : (uint32_t)i) * (size_t)n;
        for (int j = 0; j < n; j++)
            if (!f->dead[j])
                w[j] = d->col_scale ? src[d->p_col ? d->p_col[j] : (uint32_t)j] / d->col_scale[j]
                                    : src[d->p_col ? d->p_col[j] : (uint32_t)j];
    }
    {
        uint8_t *codes = (uint8_t *)MPQ_MALLOC((size_t)m * (size_t)n);
        uint16_t *pairs = (uint16_t *)MPQ_MALLOC(sizeof(uint16_t) * 2u * (size_t)m * (size_t)s.ngroups);
        const size_t sa = sizeof(float) * MPQ__GPTQ_TILE * ld,
                     sd = mpq__align64(sizeof(float) * MPQ__GPTQ_TILE * (size_t)B);
        const size_t sv = mpq__align64(sizeof(float) * MPQ__GPTQ_ROWS * (size_t)B);
        const size_t stmp = mpq__align64(sizeof(float) * (size_t)s.group + (size_t)s.group);
        const size_t per = sa + sd + sv + stmp + mpq__align64(sizeof(mpq__gq) * MPQ__GPTQ_TILE * (size_t)s.ngroups);
        uint8_t *scratch = (uint8_t *)mpq_aligned_alloc(per * (size_t)nth);
        if (!codes || !pairs || !scratch) st = MPQ_ERR_NOMEM;
        mpq__gptq G = {&s,
                       d,
                       Wp,
                       f->Rp,
                       f->roff,
                       f->Ub,
                       f->ud,
                       ld,
                       B,
                       g->static_groups != 0,
                       codes,
                       pairs,
                       pairs ? pairs + (size_t)m * (size_t)s.ngroups : NULL};
        const int ntask = (int)((mp + MPQ__GPTQ_TILE - 1) / MPQ__GPTQ_TILE);
        double loss = 0.0;
        int ok = 1;
        if (st == MPQ_OK) {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : loss) reduction(&& : ok) num_threads(nth)
#endif
            for (int t = 0; t < ntask; t++) {
                uint8_t *mine = scratch + per * (size_t)mpq__thread_id();
                float *A = (float *)(void *)mine, *D = (float *)(void *)(mine + sa);
                float *v = (float *)(void *)(mine + sa + sd), *tmp = (float *)(void *)(mine + sa + sd + sv);
                mpq__gq *gq = (mpq__gq *)(void *)((uint8_t *)tmp + stmp);
                const int r0 = t * MPQ__GPTQ_TILE, r1 = r0 + MPQ__GPTQ_TILE < (int)mp ? r0 + MPQ__GPTQ_TILE : (int)mp;
                ok = ok && mpq__gptq_tile(&G, r0, r1, A, D, v, tmp, gq, &loss);
            }
            if (!ok) st = MPQ_ERR_RANGE;
        }
        if (st == MPQ_OK) {
            uint8_t *b8 = (uint8_t *)buf;
            mpq__write_sections(d, &s, &L, b8);
            mpq__write_all(&s, &L, b8, codes, G.sh, G.zh);
            mpq__view(out, &s, &L, b8, mpq__desc_flags(d));
            if (res) {
                res->loss = loss / m;
                res->lambda = f->lambda;
                res->dead = f->ndead;
                res->block = B;
                res->factor_bits = f->bits;
            }
        }
        MPQ_FREE(codes);
        MPQ_FREE(pairs);
        mpq_aligned_free(scratch);
    }
done:
    mpq_aligned_free(Wp);
    if (f == &own) {
        if (g->cache && st == MPQ_OK)
            mpq__gcache_keep(g->cache, d, H, n, damp, g->float64 != 0, &own);
        else
            mpq__gfac_free(&own);
    }
    return st;
}

MPQ_DEF mpq_status mpq_gptq(const mpq_bitplane_desc *d, const float *W, const mpq_gptq_desc *g, void *buf, size_t bytes,
                            mpq_packed *out, mpq_gptq_result *res)
{
    if (!d || !d->rotation) return mpq__gptq_rows(d, W, g, buf, bytes, out, res);
    mpq__shape s;
    mpq__layout L;
    mpq_status st = mpq__pack_check(d, buf, bytes, out, &s, &L);
    if (st != MPQ_OK) return st;
    if (!W || !g || !g->H) return MPQ_ERR_ARG;
    float *Wr, *Hr;
    if ((st = mpq__rotated_copies(d->rotation, s.rows, W, g->H, &Wr, &Hr)) != MPQ_OK) return st;
    mpq_gptq_desc gr = *g;
    gr.H = Hr;
    st = mpq__gptq_rows(d, Wr, &gr, buf, bytes, out, res);
    MPQ_FREE(Wr);
    MPQ_FREE(Hr);
    return st;
}

MPQ_DEF mpq_status mpq_gptq_alloc(const mpq_bitplane_desc *d, const float *W, const mpq_gptq_desc *g, mpq_packed *out,
                                  mpq_gptq_result *res)
{
    size_t bytes;
    mpq_status st = mpq_bitplane_bytes(d, &bytes);
    if (st != MPQ_OK) return st;
    if (!out) return MPQ_ERR_ARG;
    void *buf = mpq_aligned_alloc(bytes);
    if (!buf) return MPQ_ERR_NOMEM;
    st = mpq_gptq(d, W, g, buf, bytes, out, res);
    if (st != MPQ_OK) {
        mpq_aligned_free(buf);
        return st;
    }
    out->owned = 1;
    return MPQ_OK;
}

/* ========================================================================== */
/* 9. Selection, permutations                                                 */
/* ========================================================================== */

/* Merge sort of indices: v descending, then index ascending. */
MPQ_DEF mpq_status mpq_argsort_desc(const float *v, size_t n, uint32_t *idx)
{
    if ((!v || !idx) && n) return MPQ_ERR_ARG;
    if (n > UINT32_MAX) return MPQ_ERR_SIZE;
    mpq_status st = mpq__check_finite(v, n);
    if (st != MPQ_OK) return st;
    if (n == 0) return MPQ_OK;
    uint32_t *tmp = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * n);
    if (!tmp) return MPQ_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    uint32_t *a = idx, *b = tmp;
    for (size_t w = 1; w < n; w *= 2) { /* bottom-up: runs of w are sorted */
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, o = lo;
            while (i < mid && j < hi) b[o++] = v[a[j]] > v[a[i]] ? a[j++] : a[i++]; /* ties: the left run first */
            while (i < mid) b[o++] = a[i++];
            while (j < hi) b[o++] = a[j++];
        }
        uint32_t *t = a;
        a = b;
        b = t;
    }
    if (a != idx) memcpy(idx, a, sizeof(uint32_t) * n);
    MPQ_FREE(tmp);
    return MPQ_OK;
}

static int mpq__cmp_float(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

/* The k-th smallest (0-based) of a[0..n), reordering a: three-way
   quickselect with median-of-three pivots; after 2 log2(n) + 8 rounds it
   sorts what is left, so the worst case stays O(n log n). */
static float mpq__select(float *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n - 1;
    int budget = 8;
    for (size_t m = n; m > 1; m >>= 1) budget += 2;
    while (hi > lo) {
        if (budget-- == 0) {
            qsort(a + lo, hi - lo + 1, sizeof(float), mpq__cmp_float);
            return a[k];
        }
        size_t mid = lo + (hi - lo) / 2;
        float x = a[lo], y = a[mid], z = a[hi];
        float p = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        size_t lt = lo, i = lo, gt = hi; /* [lo, lt) < p, [lt, i) == p, (gt, hi] > p */
        while (i <= gt) {
            if (a[i] < p) {
                float t = a[i];
                a[i++] = a[lt];
                a[lt++] = t;
            } else if (a[i] > p) {
                float t = a[i];
                a[i] = a[gt];
                a[gt] = t;
                if (gt == 0) break;
                gt--;
            } else
                i++;
        }
        if (k < lt)
            hi = lt - 1;
        else if (k > gt)
            lo = gt + 1;
        else
            return p;
    }
    return a[k];
}

MPQ_DEF mpq_status mpq_quantile(const float *v, size_t n, double q, float *out)
{
    if (!v || !out) return MPQ_ERR_ARG;
    if (n == 0) return MPQ_ERR_SIZE;
    if (!(q >= 0.0 && q <= 1.0)) return MPQ_ERR_ARG;
    mpq_status st = mpq__check_finite(v, n);
    if (st != MPQ_OK) return st;
    float *a = (float *)MPQ_MALLOC(sizeof(float) * n);
    if (!a) return MPQ_ERR_NOMEM;
    memcpy(a, v, sizeof(float) * n);
    size_t k = (size_t)floor(q * (double)(n - 1));
    *out = mpq__select(a, n, k < n ? k : n - 1);
    MPQ_FREE(a);
    return MPQ_OK;
}

/* The threshold of the k largest over the spans (k >= 1): the k-th largest
   value, and how many of the chosen equal it (the rest are above it). */
static mpq_status mpq__top_threshold(const mpq_span *sp, int ns, size_t total, size_t k, float *thr, size_t *ties)
{
    float *a = (float *)MPQ_MALLOC(sizeof(float) * total);
    if (!a) return MPQ_ERR_NOMEM;
    size_t o = 0;
    for (int l = 0; l < ns; l++) {
        memcpy(a + o, sp[l].v, sizeof(float) * sp[l].n);
        o += sp[l].n;
    }
    const float t = mpq__select(a, total, total - k);
    size_t above = 0;
    for (size_t i = 0; i < total; i++) above += a[i] > t;
    MPQ_FREE(a);
    *thr = t;
    *ties = k - above;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_top_k_global(const mpq_span *spans, int nspans, size_t k, uint8_t *const *selected)
{
    if (!spans || !selected || nspans < 1) return MPQ_ERR_ARG;
    size_t total = 0;
    for (int l = 0; l < nspans; l++) {
        if ((!spans[l].v || !selected[l]) && spans[l].n) return MPQ_ERR_ARG;
        mpq_status st = mpq__check_finite(spans[l].v, spans[l].n);
        if (st != MPQ_OK) return st;
        total += spans[l].n;
    }
    if (k > total) return MPQ_ERR_SIZE;
    float thr = 0.0f;
    size_t ties = 0;
    if (k > 0) {
        mpq_status st = mpq__top_threshold(spans, nspans, total, k, &thr, &ties);
        if (st != MPQ_OK) return st;
    }
    for (int l = 0; l < nspans; l++) /* above the threshold, then ties in order */
        for (size_t i = 0; i < spans[l].n; i++) {
            const float x = spans[l].v[i];
            int take = k > 0 && (x > thr || (x == thr && ties > 0));
            if (k > 0 && x == thr && ties > 0) ties--;
            selected[l][i] = (uint8_t)take;
        }
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_top_k(const float *v, size_t n, size_t k, uint32_t *idx)
{
    if (!v || (!idx && k)) return MPQ_ERR_ARG;
    if (k > n) return MPQ_ERR_SIZE;
    mpq_status st = mpq__check_finite(v, n);
    if (st != MPQ_OK || k == 0) return st;
    mpq_span sp = {v, n};
    float thr;
    size_t ties;
    if ((st = mpq__top_threshold(&sp, 1, n, k, &thr, &ties)) != MPQ_OK) return st;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] > thr || (v[i] == thr && ties > 0 && ties--)) idx[o++] = (uint32_t)i;
    MPQ_ASSERT(o == k);
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_perm_from_salience(const float *S, int rows, int cols, uint32_t *p_row, uint32_t *p_col)
{
    if (!S) return MPQ_ERR_ARG;
    if (rows < 1 || cols < 1) return MPQ_ERR_SIZE;
    mpq_status st = mpq__check_finite(S, (size_t)rows * (size_t)cols);
    if (st != MPQ_OK) return st;
    double *rs = (double *)MPQ_MALLOC(sizeof(double) * ((size_t)rows + (size_t)cols)), *cs = rs + rows;
    float *f = (float *)MPQ_MALLOC(sizeof(float) * ((size_t)rows > (size_t)cols ? (size_t)rows : (size_t)cols));
    if (!rs || !f) {
        MPQ_FREE(rs);
        MPQ_FREE(f);
        return MPQ_ERR_NOMEM;
    }
    for (int j = 0; j < cols; j++) cs[j] = 0.0;
    for (int i = 0; i < rows; i++) { /* SFMP eq. 11 */
        double r = 0.0;
        for (int j = 0; j < cols; j++) {
            r += S[(size_t)i * (size_t)cols + (size_t)j];
            cs[j] += S[(size_t)i * (size_t)cols + (size_t)j];
        }
        rs[i] = r;
    }
    /* eq. 12; sums of floats fit a float's range, and ranking their float
       roundings keeps ties stable */
    if (p_row) {
        for (int i = 0; i < rows; i++) f[i] = (float)rs[i];
        st = mpq_argsort_desc(f, (size_t)rows, p_row);
    }
    if (st == MPQ_OK && p_col) {
        for (int j = 0; j < cols; j++) f[j] = (float)cs[j];
        st = mpq_argsort_desc(f, (size_t)cols, p_col);
    }
    MPQ_FREE(rs);
    MPQ_FREE(f);
    return st == MPQ_ERR_NONFINITE ? MPQ_ERR_RANGE : st;
}

MPQ_DEF mpq_status mpq_perm_validate(const uint32_t *p, int n)
{
    if (!p) return MPQ_ERR_ARG;
    if (n < 1) return MPQ_ERR_SIZE;
    return mpq__perm_check(p, n);
}

MPQ_DEF mpq_status mpq_perm_invert(const uint32_t *p, int n, uint32_t *inv)
{
    if (!inv) return MPQ_ERR_ARG;
    mpq_status st = mpq_perm_validate(p, n);
    if (st != MPQ_OK) return st;
    for (int i = 0; i < n; i++) inv[p[i]] = (uint32_t)i;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_perm_compose(const uint32_t *first, const uint32_t *second, int n, uint32_t *out)
{
    if (!out || !second) return MPQ_ERR_ARG;
    mpq_status st = mpq_perm_validate(first, n);
    if (st != MPQ_OK || (st = mpq_perm_validate(second, n)) != MPQ_OK) return st;
    if (out == first || out == second) return MPQ_ERR_ARG;
    for (int i = 0; i < n; i++) out[i] = first[second[i]];
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_perm_apply(const float *W, int rows, int cols, const uint32_t *p_row, const uint32_t *p_col,
                                  float *out)
{
    if (!W || !out || out == W) return MPQ_ERR_ARG;
    if (rows < 1 || cols < 1) return MPQ_ERR_SIZE;
    mpq_status st;
    if (p_row && (st = mpq_perm_validate(p_row, rows)) != MPQ_OK) return st;
    if (p_col && (st = mpq_perm_validate(p_col, cols)) != MPQ_OK) return st;
    for (int i = 0; i < rows; i++) {
        const float *src = W + (size_t)(p_row ? p_row[i] : (uint32_t)i) * (size_t)cols;
        float *dst = out + (size_t)i * (size_t)cols;
        for (int j = 0; j < cols; j++) dst[j] = src[p_col ? p_col[j] : (uint32_t)j];
    }
    return MPQ_OK;
}

/* ========================================================================== */
/* 10. Statistics                                                             */
/* ========================================================================== */

MPQ_DEF mpq_status mpq_stat_init(mpq_stat *st, size_t n)
{
    if (!st) return MPQ_ERR_ARG;
    if (n == 0 || n > SIZE_MAX / sizeof(double)) return MPQ_ERR_SIZE;
    double *sum = (double *)MPQ_MALLOC(sizeof(double) * n);
    if (!sum) return MPQ_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) sum[i] = 0.0;
    st->sum = sum;
    st->n = n;
    st->count = 0;
    return MPQ_OK;
}

MPQ_DEF void mpq_stat_free(mpq_stat *st)
{
    if (!st) return;
    MPQ_FREE(st->sum);
    memset(st, 0, sizeof *st);
}

MPQ_DEF mpq_status mpq_stat_mean(const mpq_stat *st, float *out)
{
    if (!st || !st->sum || !out) return MPQ_ERR_ARG;
    if (st->count == 0) return MPQ_ERR_SIZE;
    for (size_t i = 0; i < st->n; i++) out[i] = (float)(st->sum[i] / (double)st->count);
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_stat_sum(const mpq_stat *st, float *out)
{
    if (!st || !st->sum || !out) return MPQ_ERR_ARG;
    for (size_t i = 0; i < st->n; i++) out[i] = (float)st->sum[i];
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_fisher_add(mpq_stat *st, const float *grad, size_t n)
{
    if (!st || !st->sum || !grad) return MPQ_ERR_ARG;
    if (n != st->n) return MPQ_ERR_SIZE;
    mpq_status r = mpq__check_finite(grad, n);
    if (r != MPQ_OK) return r;
    for (size_t i = 0; i < n; i++) st->sum[i] += (double)grad[i] * (double)grad[i];
    st->count++;
    return MPQ_OK;
}

/* Per-column sums of |x| (power 1) or x^2 (power 2) over a batch of tokens. */
static mpq_status mpq__col_add(mpq_stat *st, const float *X, int tokens, int cols, int power)
{
    if (!st || !st->sum || !X) return MPQ_ERR_ARG;
    if (tokens < 1 || cols < 1 || (size_t)cols != st->n) return MPQ_ERR_SIZE;
    mpq_status r = mpq__check_finite(X, (size_t)tokens * (size_t)cols);
    if (r != MPQ_OK) return r;
    for (int t = 0; t < tokens; t++)
        for (int j = 0; j < cols; j++) {
            double x = X[(size_t)t * (size_t)cols + (size_t)j];
            st->sum[j] += power == 2 ? x * x : fabs(x);
        }
    st->count += (uint64_t)tokens;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_hessian_diag_add(mpq_stat *st, const float *X, int tokens, int cols)
{
    return mpq__col_add(st, X, tokens, cols, 2);
}

MPQ_DEF mpq_status mpq_mean_abs_add(mpq_stat *st, const float *X, int tokens, int cols)
{
    return mpq__col_add(st, X, tokens, cols, 1);
}

MPQ_DEF mpq_status mpq_mixllm_add(mpq_stat *st, const float *G, const float *D, int rows, int cols)
{
    if (!st || !st->sum || !G || !D) return MPQ_ERR_ARG;
    if (rows < 1 || cols < 1 || (size_t)rows != st->n) return MPQ_ERR_SIZE;
    mpq_status r = mpq__check_finite(G, (size_t)rows * (size_t)cols);
    if (r != MPQ_OK || (r = mpq__check_finite(D, (size_t)rows * (size_t)cols)) != MPQ_OK) return r;
    for (int c = 0; c < rows; c++) { /* MixLLM eq. 4: first- plus second-order Taylor term */
        double gd = 0.0;
        for (int j = 0; j < cols; j++)
            gd += (double)G[(size_t)c * (size_t)cols + (size_t)j] * D[(size_t)c * (size_t)cols + (size_t)j];
        st->sum[c] += fabs(gd + 0.5 * gd * gd);
    }
    st->count++;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_pqi(const float *w, const float *w_q, size_t n, int N, mpq_grad_fn grad, void *user, float *v)
{
    if (!w || !w_q || !grad || !v) return MPQ_ERR_ARG;
    if (n == 0 || N < 1) return MPQ_ERR_SIZE;
    mpq_status st = mpq__check_finite(w, n);
    if (st != MPQ_OK || (st = mpq__check_finite(w_q, n)) != MPQ_OK) return st;
    float *p = (float *)MPQ_MALLOC(sizeof(float) * n * 2), *g = p ? p + n : NULL;
    double *acc = (double *)MPQ_MALLOC(sizeof(double) * n);
    if (!p || !acc) {
        MPQ_FREE(p);
        MPQ_FREE(acc);
        return MPQ_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) acc[i] = 0.0;
    for (int k = 1; k <= N && st == MPQ_OK; k++) { /* eq. 7: the points w + k/N (w~ - w) */
        const double t = (double)k / (double)N;
        for (size_t i = 0; i < n; i++) p[i] = (float)((double)w[i] + t * ((double)w_q[i] - (double)w[i]));
        st = grad(user, p, g, n);
        if (st == MPQ_OK) st = mpq__check_finite(g, n);
        if (st == MPQ_OK)
            for (size_t i = 0; i < n; i++) acc[i] += fabs((double)g[i]);
    }
    if (st == MPQ_OK)
        for (size_t i = 0; i < n; i++) v[i] = (float)(acc[i] / N);
    MPQ_FREE(p);
    MPQ_FREE(acc);
    return st;
}

MPQ_DEF mpq_status mpq_pqi_delta(const float *v, const float *w, const float *w_q, int rows, int cols, int block_rows,
                                 int group, float *per_weight, double *per_row, double *per_col, double *per_block,
                                 double *layer)
{
    if (!v || !w || !w_q) return MPQ_ERR_ARG;
    if (rows < 1 || cols < 1 || block_rows < 1 || group < 1) return MPQ_ERR_SIZE;
    const size_t nw = (size_t)rows * (size_t)cols;
    mpq_status st = mpq__check_finite(v, nw);
    if (st != MPQ_OK || (st = mpq__check_finite(w, nw)) != MPQ_OK || (st = mpq__check_finite(w_q, nw)) != MPQ_OK)
        return st;
    const int ng = (cols + group - 1) / group, nbr = (rows + block_rows - 1) / block_rows;
    if (per_row)
        for (int i = 0; i < rows; i++) per_row[i] = 0.0;
    if (per_col)
        for (int j = 0; j < cols; j++) per_col[j] = 0.0;
    if (per_block)
        for (size_t b = 0; b < (size_t)nbr * (size_t)ng; b++) per_block[b] = 0.0;
    double tot = 0.0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            const size_t k = (size_t)i * (size_t)cols + (size_t)j;
            const double d = (double)v[k] * fabs((double)w_q[k] - (double)w[k]); /* eq. 6, term by term */
            if (per_weight) per_weight[k] = (float)d;
            if (per_row) per_row[i] += d;
            if (per_col) per_col[j] += d;
            if (per_block) per_block[(size_t)(i / block_rows) * (size_t)ng + (size_t)(j / group)] += d;
            tot += d;
        }
    if (layer) *layer = tot;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_mxsens_layer_sensitivity(const double *errors, int nlayers, float *S)
{
    if (!errors || !S) return MPQ_ERR_ARG;
    if (nlayers < 1) return MPQ_ERR_SIZE;
    double mx = 0.0;
    for (int i = 0; i < nlayers; i++) {
        if (!(errors[i] - errors[i] == 0.0)) return MPQ_ERR_NONFINITE;
        if (errors[i] < 0.0) return MPQ_ERR_RANGE;
        mx = errors[i] > mx ? errors[i] : mx;
    }
    if (mx == 0.0) return MPQ_ERR_RANGE;
    for (int i = 0; i < nlayers; i++) S[i] = (float)(errors[i] / mx); /* alg. 3, lines 9-10 */
    return MPQ_OK;
}

/* ========================================================================== */
/* 11. Plans                                                                  */
/* ========================================================================== */

MPQ_DEF void mpq_plan_free(mpq_plan *p)
{
    if (!p) return;
    for (int l = 0; l < p->nlayers && p->layers; l++) {
        MPQ_FREE(p->layers[l].bits);
        MPQ_FREE(p->layers[l].p_row);
        MPQ_FREE(p->layers[l].p_col);
    }
    MPQ_FREE(p->layers);
    memset(p, 0, sizeof *p);
}

MPQ_DEF mpq_status mpq_plan_desc(const mpq_plan *p, int layer, mpq_bitplane_desc *d)
{
    if (!p || !d || !p->layers) return MPQ_ERR_ARG;
    if (layer < 0 || layer >= p->nlayers) return MPQ_ERR_SIZE;
    const mpq_layer_plan *L = &p->layers[layer];
    memset(d, 0, sizeof *d);
    d->rows = L->rows, d->cols = L->cols, d->group = L->group, d->block_rows = L->block_rows;
    d->bits = L->bits, d->p_row = L->p_row, d->p_col = L->p_col, d->format = L->format, d->symmetric = L->symmetric;
    return MPQ_OK;
}

static size_t mpq__nblocks(const mpq_layer_plan *L)
{
    return (size_t)((L->rows + L->block_rows - 1) / L->block_rows) * (size_t)((L->cols + L->group - 1) / L->group);
}

/* The width of original weight (i, j) of a planned layer. */
static int mpq__plan_width(const mpq_layer_plan *L, const uint32_t *inv_row, const uint32_t *inv_col, int i, int j)
{
    int pi = inv_row ? (int)inv_row[i] : i, pj = inv_col ? (int)inv_col[j] : j;
    const int ng = (L->cols + L->group - 1) / L->group;
    return L->bits[(size_t)(pi / L->block_rows) * (size_t)ng + (size_t)(pj / L->group)];
}

MPQ_DEF mpq_status mpq_plan_compare(const mpq_plan *a, const mpq_plan *b, mpq_plan_diff *out)
{
    if (!a || !b || !out || !a->layers || !b->layers) return MPQ_ERR_ARG;
    if (a->nlayers != b->nlayers) return MPQ_ERR_SIZE;
    for (int l = 0; l < a->nlayers; l++)
        if (a->layers[l].rows != b->layers[l].rows || a->layers[l].cols != b->layers[l].cols) return MPQ_ERR_SIZE;
    double diff = 0.0;
    for (int l = 0; l < a->nlayers; l++) {
        const mpq_layer_plan *A = &a->layers[l], *B = &b->layers[l];
        uint32_t *inv = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * 2 * ((size_t)A->rows + (size_t)A->cols));
        if (!inv) return MPQ_ERR_NOMEM;
        uint32_t *ar = inv, *ac = ar + A->rows, *br = ac + A->cols, *bc = br + A->rows;
        if (A->p_row) mpq_perm_invert(A->p_row, A->rows, ar);
        if (A->p_col) mpq_perm_invert(A->p_col, A->cols, ac);
        if (B->p_row) mpq_perm_invert(B->p_row, B->rows, br);
        if (B->p_col) mpq_perm_invert(B->p_col, B->cols, bc);
        for (int i = 0; i < A->rows; i++)
            for (int j = 0; j < A->cols; j++)
                diff += mpq__plan_width(A, A->p_row ? ar : NULL, A->p_col ? ac : NULL, i, j) !=
                    mpq__plan_width(B, B->p_row ? br : NULL, B->p_col ? bc : NULL, i, j);
        MPQ_FREE(inv);
    }
    out->weights_differing = diff;
    out->bpw_delta = b->bpw - a->bpw;
    return MPQ_OK;
}

static size_t mpq__append(char *buf, size_t size, size_t pos, const char *s)
{
    size_t n = strlen(s);
    if (buf && pos < size) {
        size_t k = pos + n < size ? n : size - pos - 1;
        memcpy(buf + pos, s, k);
        buf[pos + k] = 0;
    }
    return pos + n;
}

/* Unsigned integer to text (the library prints nothing and avoids stdio). */
static void mpq__utoa(char *t, unsigned long long v)
{
    char r[24];
    int n = 0;
    do r[n++] = (char)('0' + v % 10);
    while ((v /= 10) && n < 23);
    for (int k = 0; k < n; k++) t[k] = r[n - 1 - k];
    t[n] = 0;
}

/* x with 3 decimals. */
static void mpq__ftoa3(char *t, double x)
{
    unsigned long long v = (unsigned long long)(x * 1000.0 + 0.5);
    char a[24], b[24];
    mpq__utoa(a, v / 1000);
    mpq__utoa(b, v % 1000 + 1000); /* leading zeros */
    size_t n = strlen(a);
    memcpy(t, a, n);
    t[n] = '.';
    memcpy(t + n + 1, b + 1, 4);
}

MPQ_DEF size_t mpq_plan_summary(const mpq_plan *p, char *buf, size_t size)
{
    if (buf && size) buf[0] = 0;
    if (!p || !p->layers) return 0;
    size_t pos = 0;
    char t[32];
    for (int l = 0; l < p->nlayers; l++) {
        const mpq_layer_plan *L = &p->layers[l];
        double hist[MPQ_MAX_BITS + 1] = {0};
        const int ng = (L->cols + L->group - 1) / L->group;
        for (int br = 0; br * L->block_rows < L->rows; br++)
            for (int g = 0; g < ng; g++) {
                int r = L->rows - br * L->block_rows < L->block_rows ? L->rows - br * L->block_rows : L->block_rows;
                int c = L->cols - g * L->group < L->group ? L->cols - g * L->group : L->group;
                hist[L->bits[(size_t)br * (size_t)ng + (size_t)g]] += (double)r * c;
            }
        pos = mpq__append(buf, size, pos, "layer ");
        mpq__utoa(t, (unsigned long long)l);
        pos = mpq__append(buf, size, pos, t);
        pos = mpq__append(buf, size, pos, ": ");
        mpq__utoa(t, (unsigned long long)L->rows);
        pos = mpq__append(buf, size, pos, t);
        pos = mpq__append(buf, size, pos, "x");
        mpq__utoa(t, (unsigned long long)L->cols);
        pos = mpq__append(buf, size, pos, t);
        for (int b = 1; b <= MPQ_MAX_BITS; b++)
            if (hist[b] > 0) {
                pos = mpq__append(buf, size, pos, "  ");
                mpq__utoa(t, (unsigned long long)b);
                pos = mpq__append(buf, size, pos, t);
                pos = mpq__append(buf, size, pos, "-bit ");
                mpq__ftoa3(t, 100.0 * hist[b] / ((double)L->rows * L->cols));
                pos = mpq__append(buf, size, pos, t);
                pos = mpq__append(buf, size, pos, "%");
            }
        if (L->outliers) {
            pos = mpq__append(buf, size, pos, "  outliers ");
            mpq__utoa(t, (unsigned long long)L->outliers);
            pos = mpq__append(buf, size, pos, t);
        }
        pos = mpq__append(buf, size, pos, "  bpw ");
        mpq__ftoa3(t, (L->weight_bits + L->meta_bits) / ((double)L->rows * L->cols));
        pos = mpq__append(buf, size, pos, t);
        pos = mpq__append(buf, size, pos, "\n");
    }
    pos = mpq__append(buf, size, pos, "total bpw ");
    mpq__ftoa3(t, p->bpw);
    pos = mpq__append(buf, size, pos, t);
    pos = mpq__append(buf, size, pos, " (weights + metadata), index bytes ");
    mpq__utoa(t, (unsigned long long)p->index_bytes);
    pos = mpq__append(buf, size, pos, t);
    if (p->sparse_bytes > 0.0) {
        pos = mpq__append(buf, size, pos, ", sparse bytes ");
        mpq__utoa(t, (unsigned long long)p->sparse_bytes);
        pos = mpq__append(buf, size, pos, t);
    }
    pos = mpq__append(buf, size, pos, "\n");
    return pos;
}

/* Fills the accounting fields of a plan from its layers' bits maps. */
static void mpq__plan_account(mpq_plan *p)
{
    double wb = 0.0, mb = 0.0, nw = 0.0, ib = 0.0;
    for (int l = 0; l < p->nlayers; l++) {
        mpq_layer_plan *L = &p->layers[l];
        const int ng = (L->cols + L->group - 1) / L->group;
        L->weight_bits = 0.0;
        for (int br = 0; br * L->block_rows < L->rows; br++)
            for (int g = 0; g < ng; g++) {
                int r = L->rows - br * L->block_rows < L->block_rows ? L->rows - br * L->block_rows : L->block_rows;
                int c = L->cols - g * L->group < L->group ? L->cols - g * L->group : L->group;
                L->weight_bits += (double)r * c * L->bits[(size_t)br * (size_t)ng + (size_t)g];
            }
        L->meta_bits = (double)mpq_format_get((mpq_format)L->format)->meta_bits * (double)L->rows * ng;
        wb += L->weight_bits;
        mb += L->meta_bits;
        nw += (double)L->rows * L->cols;
        ib += (double)mpq__nblocks(L) + (L->p_row ? 4.0 * L->rows : 0.0) + (L->p_col ? 4.0 * L->cols : 0.0);
    }
    p->bpw = (wb + mb) / nw;
    p->index_bytes = ib;
}

/* A planner's last step: on success account the plan and hand it over, on
   error free what was built. */
static mpq_status mpq__plan_finish(mpq_plan *P, mpq_status st, mpq_plan *out)
{
    if (st != MPQ_OK) {
        mpq_plan_free(P);
        return st;
    }
    mpq__plan_account(P);
    *out = *P;
    return MPQ_OK;
}

/* d's block shape (MPQ_ERR_ARG for one SFMP refuses). */
static mpq_status mpq__sfmp_blocks(const mpq_sfmp_desc *d, int *G, int *BR)
{
    *G = d->group ? d->group : 128, *BR = d->block_rows ? d->block_rows : 16;
    const int ok = *G >= 8 && *G % 8 == 0 && *BR >= 1 && d->reorder >= 0 && d->reorder <= MPQ_REORDER_BOTH;
    return ok ? MPQ_OK : MPQ_ERR_ARG;
}

/* Adds a rows x cols layer's weights, metadata bits (an fp16 pair per row
   and group) and blocks to the sums; MPQ_ERR_SIZE for an empty shape. */
static mpq_status mpq__sfmp_add(int rows, int cols, int G, int BR, double *nw, double *meta, size_t *nblocks)
{
    if (rows < 1 || cols < 1) return MPQ_ERR_SIZE;
    const int ng = (cols + G - 1) / G;
    *nw += (double)rows * (double)cols;
    *meta += 32.0 * (double)rows * ng;
    *nblocks += (size_t)((rows + BR - 1) / BR) * (size_t)ng;
    return MPQ_OK;
}

/* The layers' weights, metadata bits and blocks; MPQ_ERR_ARG /
   MPQ_ERR_SIZE for what mpq_plan_sfmp refuses (values are checked in the
   block-sum pass). */
static mpq_status mpq__sfmp_sizes(const mpq_sfmp_layer *layers, int nlayers, const mpq_sfmp_desc *d, double *nw,
                                  double *meta, size_t *nblocks)
{
    if (!layers || !d) return MPQ_ERR_ARG;
    if (nlayers < 1) return MPQ_ERR_SIZE;
    int G, BR;
    mpq_status st = mpq__sfmp_blocks(d, &G, &BR);
    *nw = 0.0, *meta = 0.0, *nblocks = 0;
    for (int l = 0; l < nlayers && st == MPQ_OK; l++)
        st = layers[l].S ? mpq__sfmp_add(layers[l].rows, layers[l].cols, G, BR, nw, meta, nblocks) : MPQ_ERR_ARG;
    return st;
}

MPQ_DEF mpq_status mpq_sfmp_bpw_range(const mpq_sfmp_layer *layers, int nlayers, const mpq_sfmp_desc *d, double *lo,
                                      double *hi)
{
    double nw, meta;
    size_t nblocks;
    if (!lo || !hi) return MPQ_ERR_ARG;
    const mpq_status st = mpq__sfmp_sizes(layers, nlayers, d, &nw, &meta, &nblocks);
    if (st != MPQ_OK) return st;
    /* the smallest doubles that pass mpq_plan_sfmp's own test (bpw nw - meta
       >= b nw, rounded as it rounds) */
    double e[2];
    for (int k = 0; k < 2; k++) {
        const double b = k ? 8.0 : 1.0;
        double v = b + meta / nw;
        while (v * nw - meta < b * nw) v = nextafter(v, HUGE_VAL);
        while (nextafter(v, 0.0) * nw - meta >= b * nw) v = nextafter(v, 0.0);
        e[k] = v;
    }
    *lo = e[0], *hi = e[1];
    return MPQ_OK;
}

/* The budget's split for nw weights with meta metadata bits: every block
   at *lo bits, *extra bits left for promotions to lo + 1. */
static mpq_status mpq__sfmp_budget(const mpq_sfmp_desc *d, double nw, double meta, int *lo, double *extra)
{
    if (!(d->bpw - d->bpw == 0.0)) return MPQ_ERR_ARG;
    const double bits_avail = d->bpw * nw - meta; /* weight bits the budget leaves */
    if (bits_avail < nw) return MPQ_ERR_RANGE;    /* below 1 bit per weight */
    *lo = bits_avail >= 8.0 * nw ? 8 : (int)floor(bits_avail / nw);
    *extra = *lo < 8 ? bits_avail - (double)*lo * nw : 0.0;
    return MPQ_OK;
}

MPQ_DEF void mpq_sfmp_reduced_free(mpq_sfmp_reduced *r)
{
    if (!r) return;
    MPQ_FREE(r->block_sal);
    MPQ_FREE(r->p_row);
    MPQ_FREE(r->p_col);
    memset(r, 0, sizeof *r);
}

MPQ_DEF mpq_status mpq_sfmp_reduce(const mpq_sfmp_layer *layer, const mpq_sfmp_desc *d, mpq_sfmp_reduced *out)
{
    double nw, meta;
    size_t nb;
    if (!out) return MPQ_ERR_ARG;
    mpq_status st = mpq__sfmp_sizes(layer, 1, d, &nw, &meta, &nb);
    if (st != MPQ_OK) return st;
    const int G = d->group ? d->group : 128, BR = d->block_rows ? d->block_rows : 16;
    const int rows = layer->rows, cols = layer->cols, ng = (cols + G - 1) / G, nbr = (rows + BR - 1) / BR;
    mpq_sfmp_reduced R;
    memset(&R, 0, sizeof R);
    R.rows = rows, R.cols = cols, R.group = G, R.block_rows = BR, R.reorder = d->reorder;
    R.block_sal = (float *)MPQ_MALLOC(sizeof(float) * nb);
    double *acc = (double *)MPQ_MALLOC(sizeof(double) * nb);
    if (d->reorder & MPQ_REORDER_ROWS) R.p_row = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)rows);
    if (d->reorder & MPQ_REORDER_COLS) R.p_col = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)cols);
    if (!R.block_sal || !acc || ((d->reorder & MPQ_REORDER_ROWS) && !R.p_row) ||
        ((d->reorder & MPQ_REORDER_COLS) && !R.p_col))
        st = MPQ_ERR_NOMEM;
    if (st == MPQ_OK && d->reorder) st = mpq_perm_from_salience(layer->S, rows, cols, R.p_row, R.p_col);
    if (st == MPQ_OK) {
        /* eq. 9 on the reordered salience, read through the permutations;
           the same pass checks every value (finite, >= 0) */
        const float *S = layer->S;
        const uint32_t *pr = R.p_row, *pc = R.p_col;
        int bad_nan = 0, bad_neg = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) reduction(| : bad_nan, bad_neg)
#endif
        for (int br = 0; br < nbr; br++) {
            double *arow = acc + (size_t)br * (size_t)ng;
            for (int g = 0; g < ng; g++) arow[g] = 0.0;
            for (int i = br * BR; i < rows && i < (br + 1) * BR; i++) {
                const float *srow = S + (size_t)(pr ? pr[i] : (uint32_t)i) * (size_t)cols;
                for (int g = 0; g < ng; g++) {
                    const int j1 = g * G + G < cols ? g * G + G : cols;
                    float part = 0.0f, lo_v = 0.0f;
                    for (int j = g * G; j < j1; j++) {
                        const float v = srow[pc ? pc[j] : (uint32_t)j];
                        part += v;
                        lo_v = v < lo_v ? v : lo_v;
                    }
                    bad_nan |= !mpq__finite(part); /* NaN or Inf anywhere makes the sum so */
                    bad_neg |= lo_v < 0.0f;
                    arow[g] += (double)part;
                }
            }
        }
        if (bad_nan || bad_neg) st = bad_nan ? MPQ_ERR_NONFINITE : MPQ_ERR_RANGE;
        for (size_t b = 0; b < nb && st == MPQ_OK; b++) R.block_sal[b] = (float)acc[b];
    }
    MPQ_FREE(acc);
    if (st != MPQ_OK) {
        mpq_sfmp_reduced_free(&R);
        return st;
    }
    *out = R;
    return MPQ_OK;
}

/* A reduced layer against d (its own fields, permutations and values). */
static mpq_status mpq__sfmp_check_reduced(const mpq_sfmp_reduced *R, const mpq_sfmp_desc *d)
{
    const int G = d->group ? d->group : 128, BR = d->block_rows ? d->block_rows : 16;
    if (!R->block_sal || R->group != G || R->block_rows != BR || R->reorder != d->reorder) return MPQ_ERR_ARG;
    if (!(d->reorder & MPQ_REORDER_ROWS) != !R->p_row || !(d->reorder & MPQ_REORDER_COLS) != !R->p_col)
        return MPQ_ERR_ARG;
    mpq_status st = R->p_row ? mpq_perm_validate(R->p_row, R->rows) : MPQ_OK;
    if (st == MPQ_OK && R->p_col) st = mpq_perm_validate(R->p_col, R->cols);
    const size_t nb = (size_t)((R->rows + BR - 1) / BR) * (size_t)((R->cols + G - 1) / G);
    if (st == MPQ_OK) st = mpq__check_finite(R->block_sal, nb);
    for (size_t b = 0; b < nb && st == MPQ_OK; b++)
        if (R->block_sal[b] < 0.0f) st = MPQ_ERR_RANGE;
    return st;
}

MPQ_DEF mpq_status mpq_plan_sfmp_reduced(const mpq_sfmp_reduced *layers, int nlayers, const mpq_sfmp_desc *d,
                                         mpq_plan *out)
{
    if (!layers || !d || !out) return MPQ_ERR_ARG;
    if (nlayers < 1) return MPQ_ERR_SIZE;
    int G, BR, lo;
    double nw = 0.0, meta = 0.0, extra;
    size_t nblocks = 0;
    mpq_status st = mpq__sfmp_blocks(d, &G, &BR);
    if (st != MPQ_OK) return st;
    for (int l = 0; l < nlayers; l++)
        if ((st = mpq__sfmp_add(layers[l].rows, layers[l].cols, G, BR, &nw, &meta, &nblocks)) != MPQ_OK) return st;
    st = mpq__sfmp_budget(d, nw, meta, &lo, &extra);
    for (int l = 0; l < nlayers && st == MPQ_OK; l++) st = mpq__sfmp_check_reduced(&layers[l], d);
    if (st != MPQ_OK) return st;

    mpq_plan P;
    memset(&P, 0, sizeof P);
    P.nlayers = nlayers;
    P.layers = (mpq_layer_plan *)MPQ_MALLOC(sizeof(mpq_layer_plan) * (size_t)nlayers);
    float *sal = (float *)MPQ_MALLOC(sizeof(float) * nblocks);
    uint32_t *order = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * nblocks);
    double *cost = (double *)MPQ_MALLOC(sizeof(double) * nblocks);
    st = (P.layers && sal && order && cost) ? MPQ_OK : MPQ_ERR_NOMEM;
    if (P.layers) memset(P.layers, 0, sizeof(mpq_layer_plan) * (size_t)nlayers);
    size_t b0 = 0;
    for (int l = 0; l < nlayers && st == MPQ_OK; l++) {
        const mpq_sfmp_reduced *R = &layers[l];
        mpq_layer_plan *L = &P.layers[l];
        const int ng = (R->cols + G - 1) / G, nbr = (R->rows + BR - 1) / BR;
        L->rows = R->rows, L->cols = R->cols, L->group = G, L->block_rows = BR, L->format = MPQ_FORMAT_BITPLANE;
        L->bits = (uint8_t *)MPQ_MALLOC((size_t)nbr * (size_t)ng);
        if (R->p_row) L->p_row = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)R->rows);
        if (R->p_col) L->p_col = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)R->cols);
        if (!L->bits || (R->p_row && !L->p_row) || (R->p_col && !L->p_col)) {
            st = MPQ_ERR_NOMEM;
            break;
        }
        if (R->p_row) memcpy(L->p_row, R->p_row, sizeof(uint32_t) * (size_t)R->rows);
        if (R->p_col) memcpy(L->p_col, R->p_col, sizeof(uint32_t) * (size_t)R->cols);
        for (int br = 0; br < nbr; br++)
            for (int g = 0; g < ng; g++) {
                const size_t b = (size_t)br * (size_t)ng + (size_t)g;
                const int r = R->rows - br * BR < BR ? R->rows - br * BR : BR,
                          c = R->cols - g * G < G ? R->cols - g * G : G;
                sal[b0 + b] = R->block_sal[b];
                cost[b0 + b] = (double)r * c;
                L->bits[b] = (uint8_t)lo;
            }
        b0 += (size_t)nbr * (size_t)ng;
    }
    /* eq. 10 as a ranking: the most salient blocks, across all layers, take
       lo + 1 bits while the budget lasts (stable: ties keep layer and block
       order) */
    if (st == MPQ_OK && extra > 0.0 && (st = mpq_argsort_desc(sal, nblocks, order)) == MPQ_OK) {
        for (size_t k = 0; k < nblocks; k++) {
            const uint32_t b = order[k];
            if (cost[b] > extra) break;
            extra -= cost[b];
            size_t base = 0;
            for (int l = 0; l < nlayers; l++) { /* the layer of block b */
                size_t nb = mpq__nblocks(&P.layers[l]);
                if (b < base + nb) {
                    P.layers[l].bits[b - base] = (uint8_t)(lo + 1);
                    break;
                }
                base += nb;
            }
        }
    }
    MPQ_FREE(sal);
    MPQ_FREE(order);
    MPQ_FREE(cost);
    return mpq__plan_finish(&P, st, out);
}

MPQ_DEF mpq_status mpq_plan_sfmp(const mpq_sfmp_layer *layers, int nlayers, const mpq_sfmp_desc *d, mpq_plan *out)
{
    if (!layers || !d || !out) return MPQ_ERR_ARG;
    double nw, meta, extra;
    size_t nblocks;
    int lo;
    mpq_status st = mpq__sfmp_sizes(layers, nlayers, d, &nw, &meta, &nblocks);
    if (st == MPQ_OK) st = mpq__sfmp_budget(d, nw, meta, &lo, &extra); /* before any salience is read */
    if (st != MPQ_OK) return st;
    mpq_sfmp_reduced *R = (mpq_sfmp_reduced *)MPQ_MALLOC(sizeof *R * (size_t)nlayers);
    if (!R) return MPQ_ERR_NOMEM;
    memset(R, 0, sizeof *R * (size_t)nlayers);
    for (int l = 0; l < nlayers && st == MPQ_OK; l++) st = mpq_sfmp_reduce(&layers[l], d, &R[l]);
    if (st == MPQ_OK) st = mpq_plan_sfmp_reduced(R, nlayers, d, out);
    for (int l = 0; l < nlayers; l++) mpq_sfmp_reduced_free(&R[l]);
    MPQ_FREE(R);
    return st;
}

MPQ_DEF mpq_status mpq_plan_mixllm(const mpq_mixllm_layer *layers, int nlayers, const mpq_mixllm_desc *d, mpq_plan *out)
{
    if (!layers || !d || !out) return MPQ_ERR_ARG;
    if (nlayers < 1) return MPQ_ERR_SIZE;
    const int hi = d->high_bits ? d->high_bits : 8, lo = d->low_bits ? d->low_bits : 4, G = d->group ? d->group : 128;
    if (hi < 1 || hi > MPQ_MAX_BITS || lo < 1 || lo > MPQ_MAX_BITS) return MPQ_ERR_BITS;
    if (G < 8 || G % 8 || d->count < 0 || !(d->fraction >= 0.0 && d->fraction <= 1.0)) return MPQ_ERR_ARG;
    mpq_span *sp = (mpq_span *)MPQ_MALLOC(sizeof(mpq_span) * (size_t)nlayers);
    uint8_t **sel = (uint8_t **)MPQ_MALLOC(sizeof(uint8_t *) * (size_t)nlayers);
    if (!sp || !sel) {
        MPQ_FREE(sp);
        MPQ_FREE(sel);
        return MPQ_ERR_NOMEM;
    }
    size_t total = 0;
    mpq_status st = MPQ_OK;
    for (int l = 0; l < nlayers; l++) sel[l] = NULL;
    for (int l = 0; l < nlayers && st == MPQ_OK; l++) {
        if (!layers[l].salience)
            st = MPQ_ERR_ARG;
        else if (layers[l].rows < 1 || layers[l].cols < 1)
            st = MPQ_ERR_SIZE;
        else if ((st = mpq__check_finite(layers[l].salience, (size_t)layers[l].rows)) == MPQ_OK)
            for (int i = 0; i < layers[l].rows; i++)
                if (layers[l].salience[i] < 0.0f) st = MPQ_ERR_RANGE;
        sp[l].v = layers[l].salience;
        sp[l].n = (size_t)layers[l].rows;
        total += sp[l].n;
    }
    const size_t k = d->count ? (size_t)d->count : (size_t)floor(d->fraction * (double)total);
    if (st == MPQ_OK && k > total) st = MPQ_ERR_SIZE;
    for (int l = 0; l < nlayers && st == MPQ_OK; l++)
        if (!(sel[l] = (uint8_t *)MPQ_MALLOC((size_t)layers[l].rows))) st = MPQ_ERR_NOMEM;
    if (st == MPQ_OK) st = mpq_top_k_global(sp, nlayers, k, sel); /* algorithm 1: the global ranking */
    mpq_plan P;
    memset(&P, 0, sizeof P);
    if (st == MPQ_OK) {
        P.nlayers = nlayers;
        P.layers = (mpq_layer_plan *)MPQ_MALLOC(sizeof(mpq_layer_plan) * (size_t)nlayers);
        if (!P.layers)
            st = MPQ_ERR_NOMEM;
        else
            memset(P.layers, 0, sizeof(mpq_layer_plan) * (size_t)nlayers);
    }
    for (int l = 0; l < nlayers && st == MPQ_OK; l++) {
        const int m = layers[l].rows, ng = (layers[l].cols + G - 1) / G;
        mpq_layer_plan *L = &P.layers[l];
        L->rows = m, L->cols = layers[l].cols, L->group = G, L->block_rows = 1, L->format = MPQ_FORMAT_BITPLANE;
        L->symmetric = 1u << hi;
        L->bits = (uint8_t *)MPQ_MALLOC((size_t)m * (size_t)ng);
        L->p_row = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)m);
        float *key = (float *)MPQ_MALLOC(sizeof(float) * (size_t)m);
        if (!L->bits || !L->p_row || !key) {
            MPQ_FREE(key);
            st = MPQ_ERR_NOMEM;
            break;
        }
        /* high-width rows first, each part by salience: the chosen rows carry
           their salience + 1 above every unchosen one (ranks only) */
        float top = 0.0f;
        for (int i = 0; i < m; i++) top = layers[l].salience[i] > top ? layers[l].salience[i] : top;
        for (int i = 0; i < m; i++)
            key[i] = sel[l][i] ? 2.0f + layers[l].salience[i] / (top > 0.0f ? top : 1.0f)
                               : layers[l].salience[i] / (top > 0.0f ? top : 1.0f);
        st = mpq_argsort_desc(key, (size_t)m, L->p_row);
        MPQ_FREE(key);
        for (int i = 0; i < m && st == MPQ_OK; i++)
            memset(L->bits + (size_t)i * (size_t)ng, sel[l][L->p_row[i]] ? hi : lo, (size_t)ng);
    }
    for (int l = 0; l < nlayers; l++) MPQ_FREE(sel[l]);
    MPQ_FREE(sel);
    MPQ_FREE(sp);
    return mpq__plan_finish(&P, st, out);
}

/* The layers' checks, and the budget's terms: nw weights, *meta bits of
   E8M0 bytes and *fixed mantissa bits of the plan without 6-bit columns. */
static mpq_status mpq__mxsens_sizes(const mpq_mxsens_layer *layers, int nlayers, double *nw, double *meta,
                                    double *fixed)
{
    if (!layers) return MPQ_ERR_ARG;
    if (nlayers < 1) return MPQ_ERR_SIZE;
    for (int l = 0; l < nlayers; l++) {
        const mpq_mxsens_layer *Ly = &layers[l];
        if (!Ly->col_sens) return MPQ_ERR_ARG;
        if (Ly->rows < 1 || Ly->cols < 1) return MPQ_ERR_SIZE;
        if (!mpq__finite(Ly->layer_sens)) return MPQ_ERR_NONFINITE;
        if (Ly->layer_sens < 0.0f || Ly->layer_sens > 1.0f) return MPQ_ERR_RANGE;
        mpq_status st = mpq__check_finite(Ly->col_sens, (size_t)Ly->cols);
        if (st != MPQ_OK) return st;
        for (int j = 0; j < Ly->cols; j++)
            if (Ly->col_sens[j] < 0.0f) return MPQ_ERR_RANGE;
    }
    *nw = *meta = *fixed = 0.0;
    for (int l = 0; l < nlayers; l++) {
        const double r = layers[l].rows, d = layers[l].cols, nb = (double)((layers[l].cols + 31) / 32);
        *nw += r * d;
        *meta += 8.0 * r * nb;
        const double d8 = d < 32 ? d : 32; /* the 8-bit block; the rest starts at 4 bits */
        *fixed += r * (8.0 * d8 + 4.0 * (d - d8));
    }
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_mxsens_bpw_min(const mpq_mxsens_layer *layers, int nlayers, double *lo)
{
    if (!lo) return MPQ_ERR_ARG;
    double nw, meta, fixed;
    const mpq_status st = mpq__mxsens_sizes(layers, nlayers, &nw, &meta, &fixed);
    if (st != MPQ_OK) return st;
    /* the smallest double that passes mpq_plan_mxsens's own test, rounded as
       it rounds */
    double v = (fixed + meta) / nw;
    while (v * nw - meta < fixed) v = nextafter(v, HUGE_VAL);
    while (nextafter(v, 0.0) * nw - meta >= fixed) v = nextafter(v, 0.0);
    *lo = v;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_plan_mxsens(const mpq_mxsens_layer *layers, int nlayers, double bpw, mpq_plan *out,
                                   double *R_out)
{
    if (!layers || !out) return MPQ_ERR_ARG;
    if (nlayers < 1) return MPQ_ERR_SIZE;
    if (!(bpw - bpw == 0.0)) return MPQ_ERR_ARG;
    double nw, meta, fixed;
    const mpq_status sz = mpq__mxsens_sizes(layers, nlayers, &nw, &meta, &fixed);
    if (sz != MPQ_OK) return sz;
    /* Mantissa bits available: the budget less the E8M0 byte of every block. */
    const double avail = bpw * nw - meta;
    if (avail < fixed) return MPQ_ERR_RANGE;
    /* R over the layers not yet capped: sum over them of 2 r S (d - 32) R
       equals what is left (theorem A.1 with rows as weights); capped layers
       take all their 6-bit columns. */
    uint8_t *capped = (uint8_t *)MPQ_MALLOC((size_t)nlayers);
    if (!capped) return MPQ_ERR_NOMEM;
    memset(capped, 0, (size_t)nlayers);
    double R = 0.0;
    for (int round = 0; round <= nlayers; round++) {
        double left = avail - fixed, den = 0.0;
        for (int l = 0; l < nlayers; l++) {
            const double r = layers[l].rows, rest = layers[l].cols > 32 ? layers[l].cols - 32 : 0;
            if (capped[l])
                left -= 2.0 * r * rest;
            else
                den += 2.0 * r * (double)layers[l].layer_sens * rest;
        }
        R = den > 0.0 && left > 0.0 ? left / den : 0.0;
        int changed = 0;
        for (int l = 0; l < nlayers; l++)
            if (!capped[l] && R * layers[l].layer_sens > 1.0) capped[l] = 1, changed = 1;
        if (!changed) break;
    }
    mpq_plan P;
    memset(&P, 0, sizeof P);
    P.nlayers = nlayers;
    P.layers = (mpq_layer_plan *)MPQ_MALLOC(sizeof(mpq_layer_plan) * (size_t)nlayers);
    mpq_status st = P.layers ? MPQ_OK : MPQ_ERR_NOMEM;
    if (P.layers) memset(P.layers, 0, sizeof(mpq_layer_plan) * (size_t)nlayers);
    for (int l = 0; l < nlayers && st == MPQ_OK; l++) {
        const mpq_mxsens_layer *Ly = &layers[l];
        mpq_layer_plan *L = &P.layers[l];
        const int nb = (Ly->cols + 31) / 32, rest = Ly->cols > 32 ? Ly->cols - 32 : 0;
        L->rows = Ly->rows, L->cols = Ly->cols, L->group = MPQ_MX_BLOCK, L->block_rows = Ly->rows;
        L->format = MPQ_FORMAT_MXINT;
        L->bits = (uint8_t *)MPQ_MALLOC((size_t)nb);
        L->p_col = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)Ly->cols);
        if (!L->bits || !L->p_col) {
            st = MPQ_ERR_NOMEM;
            break;
        }
        if ((st = mpq_argsort_desc(Ly->col_sens, (size_t)Ly->cols, L->p_col)) != MPQ_OK) break;
        /* algorithm 2, line 8, rounded down to whole blocks */
        double n6 = capped[l] ? (double)rest : floor(R * (double)Ly->layer_sens * (double)rest);
        int b6 = (int)(n6 / 32.0);
        if (b6 > nb - 1) b6 = nb - 1;
        for (int b = 0; b < nb; b++) L->bits[b] = (uint8_t)(b == 0 ? 8 : (b <= b6 ? 6 : 4));
    }
    MPQ_FREE(capped);
    if (st == MPQ_OK && R_out) *R_out = R;
    return mpq__plan_finish(&P, st, out);
}

/* ReQuant. Weights of eq. 9 with layer sizes; see the declaration. */
MPQ_DEF mpq_status mpq_requant_outlier_counts(const double *layer_dF, const size_t *layer_n, int nlayers, double ratio,
                                              double t, size_t *counts)
{
    if (!layer_dF || !layer_n || !counts || nlayers < 1) return MPQ_ERR_ARG;
    if (!(ratio >= 0.0 && ratio <= 1.0) || !isfinite(t)) return MPQ_ERR_RANGE;
    double total = 0.0;
    for (int l = 0; l < nlayers; l++) {
        if (!isfinite(layer_dF[l])) return MPQ_ERR_NONFINITE;
        if (layer_dF[l] < 0.0 || (layer_dF[l] == 0.0 && t < 0.0)) return MPQ_ERR_RANGE;
        total += (double)layer_n[l];
    }
    double *w = (double *)MPQ_MALLOC(sizeof(double) * (size_t)nlayers * 2u);
    if (!w) return MPQ_ERR_NOMEM;
    double *frac = w + nlayers, wsum = 0.0;
    for (int l = 0; l < nlayers; l++) {
        frac[l] = 0.0;
        w[l] = layer_n[l] ? (double)layer_n[l] * pow(layer_dF[l], t) : 0.0;
        wsum += w[l];
    }
    size_t K = (size_t)floor(ratio * total);
    if (!isfinite(wsum) || (wsum <= 0.0 && K > 0)) {
        MPQ_FREE(w);
        return MPQ_ERR_RANGE;
    }
    for (int l = 0; l < nlayers; l++) counts[l] = (size_t)-1; /* -1: not settled */
    /* water-filling: a layer whose share reaches its size is capped and the
       rest is shared again among the others */
    for (;;) {
        double ws = 0.0;
        for (int l = 0; l < nlayers; l++)
            if (counts[l] == (size_t)-1) ws += w[l];
        int capped = 0;
        for (int l = 0; l < nlayers; l++)
            if (counts[l] == (size_t)-1 && ws > 0.0 && (double)K * (w[l] / ws) >= (double)layer_n[l]) {
                counts[l] = layer_n[l];
                K -= layer_n[l];
                capped = 1;
            }
        if (capped) continue;
        size_t given = 0;
        for (int l = 0; l < nlayers; l++) {
            if (counts[l] != (size_t)-1) continue;
            double q = ws > 0.0 ? (double)K * (w[l] / ws) : 0.0;
            counts[l] = (size_t)floor(q);
            frac[l] = q - floor(q);
            given += counts[l];
        }
        /* what rounding left: the largest remainders, earlier layers first,
           then (only when every weight left is zero) layers with room, in order */
        size_t left = K - given;
        for (; left > 0; left--) {
            int best = -1;
            for (int l = 0; l < nlayers; l++)
                if (frac[l] > 0.0 && counts[l] < layer_n[l] && (best < 0 || frac[l] > frac[best])) best = l;
            if (best < 0)
                for (int l = 0; l < nlayers && best < 0; l++)
                    if (counts[l] < layer_n[l]) best = l;
            counts[best]++;
            frac[best] = 0.0;
        }
        break;
    }
    MPQ_FREE(w);
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_plan_requant(mpq_plan *p, const double *layer_dF, double ratio, double t_step,
                                    mpq_requant_loss_fn loss, void *user, double *t_best)
{
    if (!p || !p->layers || p->nlayers < 1 || !layer_dF || !loss) return MPQ_ERR_ARG;
    if (t_step == 0.0) t_step = 0.1;
    if (!(t_step > 0.0 && t_step <= 1.0)) return MPQ_ERR_RANGE;
    const int L = p->nlayers;
    size_t *buf = (size_t *)MPQ_MALLOC(sizeof(size_t) * (size_t)L * 3u);
    if (!buf) return MPQ_ERR_NOMEM;
    size_t *n = buf, *cand = buf + L, *best = buf + 2 * L;
    for (int l = 0; l < L; l++) n[l] = (size_t)p->layers[l].rows * (size_t)p->layers[l].cols;
    double best_loss = INFINITY, tb = 0.0;
    mpq_status st = MPQ_OK;
    for (int k = 0; st == MPQ_OK && (double)k * t_step < 1.0 - 1e-12; k++) {
        const double t = (double)k * t_step;
        double f = 0.0;
        if ((st = mpq_requant_outlier_counts(layer_dF, n, L, ratio, t, cand)) != MPQ_OK) break;
        if ((st = loss(user, cand, L, &f)) != MPQ_OK) break;
        if (!isfinite(f))
            st = MPQ_ERR_NONFINITE;
        else if (f < best_loss) {
            best_loss = f;
            tb = t;
            memcpy(best, cand, sizeof(size_t) * (size_t)L);
        }
    }
    if (st == MPQ_OK) {
        p->sparse_bytes = 0.0;
        for (int l = 0; l < L; l++) {
            mpq_layer_plan *Ly = &p->layers[l];
            Ly->outliers = best[l];
            p->sparse_bytes += best[l] ? (double)mpq__sparse_size(Ly->rows, Ly->cols, best[l]) : 0.0;
        }
        if (t_best) *t_best = tb;
    }
    MPQ_FREE(buf);
    return st;
}

MPQ_DEF mpq_status mpq_requant_outliers(const float *W, size_t n, size_t count, uint8_t *mask)
{
    if (!W || !mask) return MPQ_ERR_ARG;
    if (count > n) return MPQ_ERR_SIZE;
    mpq_status st = mpq__check_finite(W, n);
    if (st != MPQ_OK) return st;
    float *a = (float *)MPQ_MALLOC(sizeof(float) * (n ? n : 1u));
    if (!a) return MPQ_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) a[i] = fabsf(W[i]);
    mpq_span sp = {a, n};
    st = mpq_top_k_global(&sp, 1, count, &mask);
    MPQ_FREE(a);
    return st;
}

MPQ_DEF mpq_status mpq_requant_significant(mpq_requant_layer *layers, int nlayers, size_t total, int steps,
                                           mpq_requant_pqi_fn refresh, void *user)
{
    if (!layers || nlayers < 1 || !refresh) return MPQ_ERR_ARG;
    if (steps < 1) return MPQ_ERR_RANGE;
    size_t free_w = 0, all = 0;
    for (int l = 0; l < nlayers; l++) {
        const mpq_requant_layer *Ly = &layers[l];
        if (Ly->n && (!Ly->W || !Ly->Wq || !Ly->v || !Ly->mask)) return MPQ_ERR_ARG;
        for (size_t i = 0; i < Ly->n; i++) free_w += !Ly->mask[i];
        all += Ly->n;
    }
    if (total > free_w) return MPQ_ERR_SIZE;
    float *score = (float *)MPQ_MALLOC(sizeof(float) * (all ? all : 1u));
    uint8_t *sel = (uint8_t *)MPQ_MALLOC(all ? all : 1u);
    mpq_span *sp = (mpq_span *)MPQ_MALLOC(sizeof(mpq_span) * (size_t)nlayers);
    uint8_t **selp = (uint8_t **)MPQ_MALLOC(sizeof(uint8_t *) * (size_t)nlayers);
    mpq_status st = score && sel && sp && selp ? MPQ_OK : MPQ_ERR_NOMEM;
    const size_t q = total / (size_t)steps, r = total % (size_t)steps;
    for (int s = 0; s < steps && st == MPQ_OK; s++) {
        /* floor(total (s+1) / steps) - floor(total s / steps), without overflow */
        const size_t k = q + (r * (size_t)(s + 1)) / (size_t)steps - (r * (size_t)s) / (size_t)steps;
        if ((st = refresh(user, layers, nlayers)) != MPQ_OK) break;
        size_t o = 0;
        for (int l = 0; l < nlayers && st == MPQ_OK; l++) {
            const mpq_requant_layer *Ly = &layers[l];
            for (size_t i = 0; i < Ly->n; i++) {
                const float v = Ly->v[i], d = fabsf(Ly->Wq[i] - Ly->W[i]);
                if (!mpq__finite(v) || !mpq__finite(d)) {
                    st = MPQ_ERR_NONFINITE;
                    break;
                }
                /* masked weights rank below every free one (scores are >= 0) */
                score[o + i] = Ly->mask[i] ? -1.0f : fabsf(v) * d;
            }
            sp[l].v = score + o;
            sp[l].n = Ly->n;
            selp[l] = sel + o;
            o += Ly->n;
        }
        if (st != MPQ_OK || (st = mpq_top_k_global(sp, nlayers, k, selp)) != MPQ_OK) break;
        for (int l = 0; l < nlayers; l++)
            for (size_t i = 0; i < layers[l].n; i++)
                if (selp[l][i]) {
                    layers[l].Wq[i] = layers[l].W[i];
                    layers[l].mask[i] = 1;
                }
    }
    MPQ_FREE(score);
    MPQ_FREE(sel);
    MPQ_FREE(sp);
    MPQ_FREE(selp);
    return st;
}

/* ---- The statistics-only split ---- */

/* The dense reconstruction D of map M with the masked weights at zero
   (mask NULL: none), and the sparse part restoring them (S may be NULL). */
static mpq_status mpq__rq_split(const mpq_requant_map *M, const uint8_t *mask, float *D, mpq_sparse *S)
{
    const size_t n = (size_t)M->d.rows * (size_t)M->d.cols;
    float *Wz = (float *)MPQ_MALLOC(sizeof(float) * n);
    if (!Wz) return MPQ_ERR_NOMEM;
    for (size_t k = 0; k < n; k++) Wz[k] = mask && mask[k] ? 0.0f : M->W[k];
    mpq_bitplane_desc d = M->d;
    d.sparse = NULL, d.rotation = NULL; /* W is already in the coordinates of the columns */
    mpq_packed A;
    mpq_status st = mpq_pack_alloc(&d, Wz, &A);
    if (st == MPQ_OK) {
        st = mpq_packed_dequantize(&A, 0, D);
        mpq_packed_free(&A);
    }
    if (st == MPQ_OK && S) st = mpq_sparse_from_mask(M->W, D, mask, d.rows, d.cols, S);
    MPQ_FREE(Wz);
    return st;
}

MPQ_DEF mpq_status mpq_requant_pack(const mpq_requant_map *M, mpq_packed *out)
{
    if (!M || !out || !M->W || !M->mask) return MPQ_ERR_ARG;
    if (M->d.rows < 1 || M->d.cols < 1) return MPQ_ERR_SIZE;
    const size_t n = (size_t)M->d.rows * (size_t)M->d.cols;
    float *D = (float *)MPQ_MALLOC(sizeof(float) * n), *Wz = (float *)MPQ_MALLOC(sizeof(float) * n);
    mpq_sparse S;
    memset(&S, 0, sizeof S);
    mpq_status st = D && Wz ? mpq__rq_split(M, M->mask, D, &S) : MPQ_ERR_NOMEM;
    for (size_t k = 0; st == MPQ_OK && k < n; k++) Wz[k] = M->mask[k] ? 0.0f : M->W[k];
    if (st == MPQ_OK) {
        mpq_bitplane_desc d = M->d;
        d.sparse = &S;
        st = mpq__pack_alloc_as(&d, Wz, 1, out);
    }
    mpq_sparse_free(&S);
    MPQ_FREE(D);
    MPQ_FREE(Wz);
    return st;
}

/* Algorithm 1's loss of a candidate: sum over maps of v |W^ - W| where W^
   is the dense part without the `counts` largest weights (exact there). */
static mpq_status mpq__rq_loss(void *user, const size_t *counts, int nl, double *loss)
{
    const mpq_requant_map *maps = (const mpq_requant_map *)user;
    double total = 0;
    mpq_status st = MPQ_OK;
    for (int i = 0; i < nl && st == MPQ_OK; i++) {
        const mpq_requant_map *M = &maps[i];
        const size_t n = (size_t)M->d.rows * (size_t)M->d.cols;
        uint8_t *mask = (uint8_t *)MPQ_MALLOC(n);
        float *D = (float *)MPQ_MALLOC(sizeof(float) * n);
        st = mask && D ? MPQ_OK : MPQ_ERR_NOMEM;
        if (st == MPQ_OK) memset(mask, 0, n);
        if (st == MPQ_OK) st = mpq_requant_outliers(M->W, n, counts[i], mask);
        if (st == MPQ_OK) st = mpq__rq_split(M, mask, D, NULL);
        for (size_t k = 0; st == MPQ_OK && k < n; k++)
            if (!mask[k]) total += (double)M->pqi[k] * fabs((double)D[k] - M->W[k]);
        MPQ_FREE(mask);
        MPQ_FREE(D);
    }
    *loss = total;
    return st;
}

/* The significant-weight step reuses the given PQI. */
static mpq_status mpq__rq_refresh(void *user, mpq_requant_layer *L, int nl)
{
    const mpq_requant_map *maps = (const mpq_requant_map *)user;
    for (int i = 0; i < nl; i++) memcpy(L[i].v, maps[i].pqi, sizeof(float) * L[i].n);
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_requant_masks(mpq_requant_map *maps, int n, double outliers, double significant, double *t_best,
                                     size_t *sparse)
{
    if (!maps || n < 1 || !(outliers >= 0 && outliers <= 0.5) || !(significant >= 0 && significant <= 0.5))
        return MPQ_ERR_ARG;
    for (int i = 0; i < n; i++) {
        if (!maps[i].W || !maps[i].pqi || !maps[i].mask) return MPQ_ERR_ARG;
        if (maps[i].d.rows < 1 || maps[i].d.cols < 1) return MPQ_ERR_SIZE;
    }
    double *dF = (double *)MPQ_MALLOC(sizeof(double) * (size_t)n);
    mpq_requant_layer *L = (mpq_requant_layer *)MPQ_MALLOC(sizeof *L * (size_t)n);
    mpq_plan p;
    memset(&p, 0, sizeof p);
    p.nlayers = n;
    p.layers = (mpq_layer_plan *)MPQ_MALLOC(sizeof *p.layers * (size_t)n);
    mpq_status st = dF && L && p.layers ? MPQ_OK : MPQ_ERR_NOMEM;
    if (L) memset(L, 0, sizeof *L * (size_t)n);
    if (p.layers) memset(p.layers, 0, sizeof *p.layers * (size_t)n);
    size_t total = 0;
    /* each map's mean Delta F_PQI (eq. 6) for eq. 9; the plan only carries
       the shapes mpq_plan_requant counts with */
    for (int i = 0; i < n && st == MPQ_OK; i++) {
        const mpq_requant_map *M = &maps[i];
        const size_t nw = (size_t)M->d.rows * (size_t)M->d.cols;
        float *D = (float *)MPQ_MALLOC(sizeof(float) * nw);
        st = D ? mpq__rq_split(M, NULL, D, NULL) : MPQ_ERR_NOMEM;
        double layer = 0;
        if (st == MPQ_OK)
            st = mpq_pqi_delta(M->pqi, M->W, D, M->d.rows, M->d.cols, 16, 128, NULL, NULL, NULL, NULL, &layer);
        MPQ_FREE(D);
        dF[i] = layer / (double)nw > 1e-30 ? layer / (double)nw : 1e-30;
        mpq_layer_plan *P = &p.layers[i];
        P->rows = M->d.rows, P->cols = M->d.cols, P->group = 128, P->block_rows = 16;
        const size_t nb = (size_t)((P->rows + 15) / 16) * (size_t)((P->cols + 127) / 128);
        if (st == MPQ_OK && !(P->bits = (uint8_t *)MPQ_MALLOC(nb))) st = MPQ_ERR_NOMEM;
        if (st == MPQ_OK) memset(P->bits, 4, nb);
        P->weight_bits = 4.0 * (double)nw;
        total += nw;
    }
    double t = 0;
    if (st == MPQ_OK) st = mpq_plan_requant(&p, dF, outliers, 0.25, mpq__rq_loss, maps, &t);
    /* outliers, and the reconstruction the significant search starts from */
    for (int i = 0; i < n && st == MPQ_OK; i++) {
        const mpq_requant_map *M = &maps[i];
        const size_t nw = (size_t)M->d.rows * (size_t)M->d.cols;
        memset(M->mask, 0, nw);
        L[i].W = M->W, L[i].mask = M->mask, L[i].n = nw;
        L[i].Wq = (float *)MPQ_MALLOC(sizeof(float) * nw), L[i].v = (float *)MPQ_MALLOC(sizeof(float) * nw);
        st = L[i].Wq && L[i].v ? mpq_requant_outliers(M->W, nw, p.layers[i].outliers, M->mask) : MPQ_ERR_NOMEM;
        if (st == MPQ_OK) st = mpq__rq_split(M, M->mask, L[i].Wq, NULL);
        for (size_t k = 0; st == MPQ_OK && k < nw; k++)
            if (M->mask[k]) L[i].Wq[k] = M->W[k];
    }
    const size_t sig = (size_t)(significant * (double)total);
    if (st == MPQ_OK && sig) st = mpq_requant_significant(L, n, sig, 1, mpq__rq_refresh, maps);
    size_t marked = 0;
    for (int i = 0; i < n && st == MPQ_OK; i++)
        for (size_t k = 0; k < L[i].n; k++) marked += maps[i].mask[k] != 0;
    for (int i = 0; L && i < n; i++) {
        MPQ_FREE(L[i].Wq);
        MPQ_FREE(L[i].v);
    }
    MPQ_FREE(L);
    MPQ_FREE(dF);
    mpq_plan_free(&p);
    if (st != MPQ_OK) return st;
    if (t_best) *t_best = t;
    if (sparse) *sparse = marked;
    return MPQ_OK;
}

/* One map's hull for the allocation: its options in walk order, from the
   cheapest to the least loss, each step saving loss at a lower rate per
   bit than the one before. */
typedef struct mpq__hull {
    int *opt; /* options on the hull, in order */
    int n;    /* how many */
} mpq__hull;

static mpq_status mpq__alloc_check(const mpq_alloc_map *maps, int n)
{
    if (!maps) return MPQ_ERR_ARG;
    if (n < 1) return MPQ_ERR_SIZE;
    for (int i = 0; i < n; i++) {
        if (maps[i].nopt < 1) return MPQ_ERR_SIZE;
        if (!maps[i].bits || !maps[i].loss) return MPQ_ERR_ARG;
        for (int k = 0; k < maps[i].nopt; k++) {
            const double b = maps[i].bits[k], l = maps[i].loss[k];
            if (!(b - b == 0.0) || !(l - l == 0.0)) return MPQ_ERR_NONFINITE;
            if (!(b > 0.0) || l < 0.0) return MPQ_ERR_RANGE;
        }
    }
    return MPQ_OK;
}

/* The lower convex hull of map m's options from its cheapest option to
   its least loss (into h->opt, nopt ints the caller gives). */
static void mpq__alloc_hull(const mpq_alloc_map *m, int *idx, mpq__hull *h)
{
    const double *b = m->bits, *l = m->loss;
    for (int k = 0; k < m->nopt; k++) idx[k] = k;
    /* by bits, then loss, then index (insertion sort: a handful of options) */
    for (int k = 1; k < m->nopt; k++) {
        const int v = idx[k];
        int j = k - 1;
        while (j >= 0 &&
               (b[idx[j]] > b[v] || (b[idx[j]] == b[v] && (l[idx[j]] > l[v] || (l[idx[j]] == l[v] && idx[j] > v))))) {
            idx[j + 1] = idx[j];
            j--;
        }
        idx[j + 1] = v;
    }
    h->n = 0;
    for (int k = 0; k < m->nopt; k++) {
        const int v = idx[k];
        if (h->n > 0 && l[v] >= l[h->opt[h->n - 1]]) continue; /* no less loss for more bits */
        /* drop the last point while it lies on or above the chord from the
           one before it to v (cross product, exact in sign for what it
           decides: the steps' rates must strictly fall) */
        while (h->n >= 2) {
            const int a = h->opt[h->n - 2], c = h->opt[h->n - 1];
            const double cross = (b[c] - b[a]) * (l[v] - l[a]) - (l[c] - l[a]) * (b[v] - b[a]);
            if (cross > 0.0) break; /* c below the chord: keep it */
            h->n--;
        }
        h->opt[h->n++] = v;
    }
}

/* The walk of both allocations: for_bits (1) stops at `limit` bits, else
   at a predicted loss of `limit`. */
static mpq_status mpq__alloc_walk(const mpq_alloc_map *maps, int n, int for_bits, double limit, mpq_alloc_choice *out)
{
    mpq_status st = mpq__alloc_check(maps, n);
    if (st != MPQ_OK) return st;
    if (!out) return MPQ_ERR_ARG;
    if (!(limit - limit == 0.0)) return MPQ_ERR_ARG;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)maps[i].nopt;
    int *mem = (int *)MPQ_MALLOC(sizeof(int) * (2 * total + (size_t)n));
    mpq__hull *H = (mpq__hull *)MPQ_MALLOC(sizeof(mpq__hull) * (size_t)n);
    if (!mem || !H) {
        MPQ_FREE(mem);
        MPQ_FREE(H);
        return MPQ_ERR_NOMEM;
    }
    int *at = mem + 2 * total; /* each map's position on its hull */
    double bits = 0.0, loss = 0.0, loss_min = 0.0;
    for (int i = 0, *p = mem; i < n; i++) {
        H[i].opt = p;
        mpq__alloc_hull(&maps[i], p + maps[i].nopt, &H[i]);
        p += 2 * maps[i].nopt;
        at[i] = 0;
        bits += maps[i].bits[H[i].opt[0]];
        loss += maps[i].loss[H[i].opt[0]];
        loss_min += maps[i].loss[H[i].opt[H[i].n - 1]];
    }
    int part = -1; /* the map whose step is taken in part */
    double t = 0.0;
    if (for_bits ? bits > limit : loss_min > limit) st = MPQ_ERR_RANGE;
    while (st == MPQ_OK && (for_bits ? bits < limit : loss > limit)) {
        int best = -1;
        double rate = 0.0;
        for (int i = 0; i < n; i++) { /* the step that saves the most loss per bit */
            if (at[i] + 1 >= H[i].n) continue;
            const int a = H[i].opt[at[i]], c = H[i].opt[at[i] + 1];
            const double r = (maps[i].loss[a] - maps[i].loss[c]) / (maps[i].bits[c] - maps[i].bits[a]);
            if (best < 0 || r > rate) best = i, rate = r;
        }
        if (best < 0) break; /* every map at its least loss */
        const int a = H[best].opt[at[best]], c = H[best].opt[at[best] + 1];
        const double db = maps[best].bits[c] - maps[best].bits[a], dl = maps[best].loss[a] - maps[best].loss[c];
        if (for_bits ? bits + db > limit : loss - dl < limit) { /* the last step, in part */
            part = best;
            t = for_bits ? (limit - bits) / db : (loss - limit) / dl;
            break;
        }
        bits += db, loss -= dl;
        at[best]++;
    }
    if (st == MPQ_OK)
        for (int i = 0; i < n; i++) {
            mpq_alloc_choice *o = &out[i];
            o->lo = o->hi = H[i].opt[at[i]];
            o->t = 0.0;
            if (i == part && t > 0.0) {
                o->hi = H[i].opt[at[i] + 1];
                o->t = t < 1.0 ? t : nextafter(1.0, 0.0);
            }
            o->bits = (1.0 - o->t) * maps[i].bits[o->lo] + o->t * maps[i].bits[o->hi];
            o->loss = (1.0 - o->t) * maps[i].loss[o->lo] + o->t * maps[i].loss[o->hi];
        }
    MPQ_FREE(mem);
    MPQ_FREE(H);
    return st;
}

MPQ_DEF mpq_status mpq_alloc_for_bits(const mpq_alloc_map *maps, int n, double budget, mpq_alloc_choice *out)
{
    return mpq__alloc_walk(maps, n, 1, budget, out);
}

MPQ_DEF mpq_status mpq_alloc_for_loss(const mpq_alloc_map *maps, int n, double bound, mpq_alloc_choice *out)
{
    return mpq__alloc_walk(maps, n, 0, bound, out);
}

MPQ_DEF mpq_status mpq_alloc_predict(const int *wb, const double *loss, int n, int b, double *out)
{
    if (!wb || !loss || !out) return MPQ_ERR_ARG;
    if (n < 1 || n > 8) return MPQ_ERR_SIZE;
    if (b < 1 || b > 8) return MPQ_ERR_BITS;
    double L[9], val[9];
    int have[9] = {0}, w[8], m = 0;
    for (int k = 0; k < n; k++) {
        if (wb[k] < 1 || wb[k] > 8) return MPQ_ERR_BITS;
        if (have[wb[k]]) return MPQ_ERR_ARG;
        if (!(loss[k] - loss[k] == 0.0)) return MPQ_ERR_NONFINITE;
        if (loss[k] < 0.0) return MPQ_ERR_RANGE;
        have[wb[k]] = 1;
        val[wb[k]] = loss[k];
        L[wb[k]] = log(loss[k] > 1e-30 ? loss[k] : 1e-30);
    }
    for (int x = 1; x <= 8; x++)
        if (have[x]) w[m++] = x; /* the measured widths, ascending */
    for (int x = 1; x <= 8; x++) {
        if (have[x]) continue;
        if (m == 1) { /* the error energy's 4x a bit */
            val[x] = exp(L[w[0]] - (x - w[0]) * log(4.0));
            continue;
        }
        int a = 0; /* the measurements w[a] < w[a + 1] whose line gives x */
        if (x > w[m - 1])
            a = m - 2;
        else
            while (x > w[0] && w[a + 1] < x) a++;
        double slope = (L[w[a + 1]] - L[w[a]]) / (double)(w[a + 1] - w[a]);
        const int inside = x > w[0] && x < w[m - 1];
        if (!inside && slope > 0.0) slope = 0.0;
        const int from = x > w[m - 1] ? w[m - 1] : w[a];
        val[x] = exp(L[from] + (x - from) * slope);
    }
    double v = val[1];
    for (int x = 2; x <= b; x++) v = val[x] < v ? val[x] : v;
    *out = v;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_alloc_range(const mpq_alloc_map *maps, int n, double *bits_min, double *loss_max,
                                   double *bits_max, double *loss_min)
{
    mpq_status st = mpq__alloc_check(maps, n);
    if (st != MPQ_OK) return st;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)maps[i].nopt;
    int *mem = (int *)MPQ_MALLOC(sizeof(int) * 2 * total);
    if (!mem) return MPQ_ERR_NOMEM;
    double v[4] = {0.0, 0.0, 0.0, 0.0};
    for (int i = 0, *p = mem; i < n; i++) {
        mpq__hull h;
        h.opt = p;
        mpq__alloc_hull(&maps[i], p + maps[i].nopt, &h);
        p += 2 * maps[i].nopt;
        v[0] += maps[i].bits[h.opt[0]], v[1] += maps[i].loss[h.opt[0]];
        v[2] += maps[i].bits[h.opt[h.n - 1]], v[3] += maps[i].loss[h.opt[h.n - 1]];
    }
    MPQ_FREE(mem);
    if (bits_min) *bits_min = v[0];
    if (loss_max) *loss_max = v[1];
    if (bits_max) *bits_max = v[2];
    if (loss_min) *loss_min = v[3];
    return MPQ_OK;
}

/* The allocation's options for mpq_plan_measured: map i's sizes and
   predicted losses at the candidate widths b0 .. b0 + nc - 1. */
typedef struct mpq__measured {
    int G, BR, b0, nc;
    double nw;           /* weights */
    double *bits, *loss; /* n x nc */
    mpq_alloc_map *A;    /* n */
} mpq__measured;

static void mpq__measured_free(mpq__measured *M)
{
    MPQ_FREE(M->bits);
    MPQ_FREE(M->loss);
    MPQ_FREE(M->A);
    M->bits = M->loss = NULL, M->A = NULL;
}

static mpq_status mpq__measured_init(const mpq_measured_layer *layers, int n, const mpq_measured_desc *d,
                                     mpq__measured *M)
{
    memset(M, 0, sizeof *M);
    if (!layers || !d || !d->widths) return MPQ_ERR_ARG;
    if (n < 1 || d->nwidths < 1 || d->nwidths > 8) return MPQ_ERR_SIZE;
    mpq_sfmp_desc sd; /* the same group and block-row rules as SFMP's */
    memset(&sd, 0, sizeof sd);
    sd.group = d->group, sd.block_rows = d->block_rows;
    mpq_status st = mpq__sfmp_blocks(&sd, &M->G, &M->BR);
    const int lo = d->min_bits ? d->min_bits : 2, hi = d->max_bits ? d->max_bits : 8;
    if (st == MPQ_OK && (lo < 1 || hi > MPQ_MAX_BITS || lo > hi)) st = MPQ_ERR_BITS;
    if (st == MPQ_OK && (d->symmetric < 0 || d->symmetric > 1)) st = MPQ_ERR_ARG;
    if (st != MPQ_OK) return st;
    M->b0 = lo, M->nc = hi - lo + 1;
    const size_t all = (size_t)n * (size_t)M->nc;
    M->bits = (double *)MPQ_MALLOC(sizeof(double) * all);
    M->loss = (double *)MPQ_MALLOC(sizeof(double) * all);
    M->A = (mpq_alloc_map *)MPQ_MALLOC(sizeof *M->A * (size_t)n);
    if (!M->bits || !M->loss || !M->A) st = MPQ_ERR_NOMEM;
    for (int i = 0; i < n && st == MPQ_OK; i++) {
        const mpq_measured_layer *L = &layers[i];
        if (L->rows < 1 || L->cols < 1) st = MPQ_ERR_SIZE;
        if (st == MPQ_OK && !L->loss) st = MPQ_ERR_ARG;
        for (int r = 0; r < L->rows && st == MPQ_OK && L->row_salience; r++)
            if (!(L->row_salience[r] - L->row_salience[r] == 0.0f))
                st = MPQ_ERR_NONFINITE;
            else if (L->row_salience[r] < 0.0f)
                st = MPQ_ERR_RANGE;
        const double w = (double)L->rows * (double)L->cols, meta = 32.0 * L->rows * ((L->cols + M->G - 1) / M->G);
        for (int k = 0; k < M->nc && st == MPQ_OK; k++) {
            M->bits[(size_t)i * M->nc + k] = w * (M->b0 + k) + meta;
            st = mpq_alloc_predict(d->widths, L->loss, d->nwidths, M->b0 + k, &M->loss[(size_t)i * M->nc + k]);
        }
        M->nw += w;
        M->A[i].nopt = M->nc, M->A[i].bits = M->bits + (size_t)i * M->nc, M->A[i].loss = M->loss + (size_t)i * M->nc;
    }
    if (st != MPQ_OK) mpq__measured_free(M);
    return st;
}

MPQ_DEF mpq_status mpq_plan_measured_range(const mpq_measured_layer *layers, int n, const mpq_measured_desc *d,
                                           double *bpw_lo, double *bpw_hi, double *loss_lo, double *loss_hi)
{
    mpq__measured M;
    mpq_status st = mpq__measured_init(layers, n, d, &M);
    double b[2] = {0.0, 0.0};
    if (st == MPQ_OK) st = mpq_alloc_range(M.A, n, &b[0], loss_hi, &b[1], loss_lo);
    if (st == MPQ_OK && bpw_lo) *bpw_lo = b[0] / M.nw;
    if (st == MPQ_OK && bpw_hi) *bpw_hi = b[1] / M.nw;
    mpq__measured_free(&M);
    return st;
}

/* Layer i of the plan: width lo, and under a mix block rows at hi (most
   salient first) for `room` bits, within it when `within` (a budget), else
   until it is spent (a bound). */
static mpq_status mpq__measured_layer(const mpq_measured_layer *L, const mpq__measured *M, int i,
                                      const mpq_alloc_choice *c, int within, unsigned symmetric, mpq_layer_plan *P)
{
    const int ng = (L->cols + M->G - 1) / M->G, nbr = (L->rows + M->BR - 1) / M->BR;
    const int lo = M->b0 + c->lo, hi = M->b0 + c->hi;
    P->rows = L->rows, P->cols = L->cols, P->group = M->G, P->block_rows = M->BR;
    P->format = MPQ_FORMAT_BITPLANE, P->symmetric = symmetric;
    P->bits = (uint8_t *)MPQ_MALLOC((size_t)nbr * (size_t)ng);
    if (!P->bits) return MPQ_ERR_NOMEM;
    memset(P->bits, lo, (size_t)nbr * (size_t)ng);
    if (c->t > 0.0) {
        float *sal = (float *)MPQ_MALLOC(sizeof(float) * (size_t)nbr);
        uint32_t *order = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)nbr);
        mpq_status st = sal && order ? MPQ_OK : MPQ_ERR_NOMEM;
        if (st == MPQ_OK) memset(sal, 0, sizeof(float) * (size_t)nbr);
        for (int b = 0; b < nbr && st == MPQ_OK; b++) {
            double s = 0.0; /* in double: the sum of a block row's rows */
            for (int r = b * M->BR; L->row_salience && r < L->rows && r < (b + 1) * M->BR; r++) s += L->row_salience[r];
            sal[b] = (float)s;
        }
        if (st == MPQ_OK) st = mpq_argsort_desc(sal, (size_t)nbr, order); /* stable: in order for equal sums */
        double room = c->t * (double)L->rows * (double)L->cols * (hi - lo);
        for (int k = 0; k < nbr && st == MPQ_OK && room > 0.0; k++) {
            const int b = (int)order[k], rr = L->rows - b * M->BR < M->BR ? L->rows - b * M->BR : M->BR;
            const double cost = (double)rr * L->cols * (hi - lo);
            if (within && cost > room) continue;
            room -= cost;
            memset(P->bits + (size_t)b * ng, hi, (size_t)ng);
        }
        MPQ_FREE(sal);
        MPQ_FREE(order);
        if (st != MPQ_OK) return st;
    }
    for (int b = 0; b < nbr; b++) {
        const int rr = L->rows - b * M->BR < M->BR ? L->rows - b * M->BR : M->BR, w = P->bits[(size_t)b * ng];
        P->loss += M->loss[(size_t)i * M->nc + (w - M->b0)] * rr / L->rows;
    }
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_plan_measured(const mpq_measured_layer *layers, int n, const mpq_measured_desc *d, mpq_plan *out)
{
    if (!out) return MPQ_ERR_ARG;
    memset(out, 0, sizeof *out);
    if (!d || !(d->bpw >= 0.0) || !(d->max_loss >= 0.0) || (d->bpw > 0.0) == (d->max_loss > 0.0)) return MPQ_ERR_ARG;
    mpq__measured M;
    mpq_status st = mpq__measured_init(layers, n, d, &M);
    if (st != MPQ_OK) return st;
    double blo = 0.0, bhi = 0.0, llo = 0.0, lhi = 0.0;
    st = mpq_alloc_range(M.A, n, &blo, &lhi, &bhi, &llo);
    const int by_bits = d->bpw > 0.0;
    double budget = d->bpw * M.nw;
    /* the ends of the range are allowed up to the rounding of bits per weight */
    if (st == MPQ_OK &&
        (by_bits ? budget < blo * (1.0 - 1e-12) || budget > bhi * (1.0 + 1e-12)
                 : d->max_loss < llo || d->max_loss >= lhi))
        st = MPQ_ERR_RANGE;
    budget = budget < blo ? blo : budget > bhi ? bhi : budget;
    mpq_alloc_choice *c = (mpq_alloc_choice *)MPQ_MALLOC(sizeof *c * (size_t)n);
    if (st == MPQ_OK && !c) st = MPQ_ERR_NOMEM;
    if (st == MPQ_OK) st = by_bits ? mpq_alloc_for_bits(M.A, n, budget, c) : mpq_alloc_for_loss(M.A, n, d->max_loss, c);
    if (st == MPQ_OK && !(out->layers = (mpq_layer_plan *)MPQ_MALLOC(sizeof(mpq_layer_plan) * (size_t)n)))
        st = MPQ_ERR_NOMEM;
    if (st == MPQ_OK) {
        memset(out->layers, 0, sizeof(mpq_layer_plan) * (size_t)n);
        out->nlayers = n;
    }
    for (int i = 0; i < n && st == MPQ_OK; i++) {
        st = mpq__measured_layer(&layers[i], &M, i, &c[i], by_bits, d->symmetric ? 0x1FEu : 0u, &out->layers[i]);
        out->loss += out->layers[i].loss;
    }
    if (st == MPQ_OK) mpq__plan_account(out);
    MPQ_FREE(c);
    mpq__measured_free(&M);
    if (st != MPQ_OK) mpq_plan_free(out);
    return st;
}

/* ========================================================================== */
/* 12. Precision schedules (PMPD)                                             */
/* ========================================================================== */

MPQ_DEF mpq_status mpq_pmpd_validate(const mpq_pmpd_schedule *s)
{
    if (!s) return MPQ_ERR_ARG;
    if (s->nlevels < 1 || s->nlevels > MPQ_PMPD_MAX_LEVELS || s->prefill_skip < 0 || s->skip[0] < 0 || s->start[0] != 0)
        return MPQ_ERR_RANGE;
    for (int k = 1; k < s->nlevels; k++)
        if (s->skip[k] <= s->skip[k - 1] || s->start[k] < s->start[k - 1]) return MPQ_ERR_RANGE;
    return MPQ_OK;
}

MPQ_DEF int mpq_pmpd_skip_at(const mpq_pmpd_schedule *s, long t)
{
    if (mpq_pmpd_validate(s) != MPQ_OK) return -1;
    if (t < 0) return s->prefill_skip;
    int k = 0;
    while (k + 1 < s->nlevels && t >= s->start[k + 1]) k++;
    return s->skip[k];
}

/* Tokens of `length` decoded at each level. */
static void mpq__pmpd_counts(const mpq_pmpd_schedule *s, long length, long *cnt)
{
    for (int k = 0; k < s->nlevels; k++) {
        long a = s->start[k] < length ? s->start[k] : length;
        long b = k + 1 < s->nlevels ? (s->start[k + 1] < length ? s->start[k + 1] : length) : length;
        cnt[k] = b - a;
    }
}

static double mpq__pmpd_avg(const mpq_pmpd_schedule *s, const double *bits, long length)
{
    long cnt[MPQ_PMPD_MAX_LEVELS];
    mpq__pmpd_counts(s, length, cnt);
    double sum = 0.0;
    for (int k = 0; k < s->nlevels; k++) sum += (double)cnt[k] * bits[s->skip[k]];
    return sum / (double)length;
}

static mpq_status mpq__bits_check(const double *bits, int n)
{
    for (int k = 0; k < n; k++)
        if (!isfinite(bits[k]) || bits[k] < 0.0) return MPQ_ERR_RANGE;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_pmpd_average_bits(const mpq_pmpd_schedule *s, const double *bits, long length, double *avg)
{
    mpq_status st = mpq_pmpd_validate(s);
    if (st != MPQ_OK) return st;
    if (!bits || !avg) return MPQ_ERR_ARG;
    if (length < 1) return MPQ_ERR_SIZE;
    if ((st = mpq__bits_check(bits, s->skip[s->nlevels - 1] + 1)) != MPQ_OK) return st;
    *avg = mpq__pmpd_avg(s, bits, length);
    return MPQ_OK;
}

MPQ_DEF double mpq_packed_bpw_skip(const mpq_packed *A, int skip_planes)
{
    if (!A || !A->bits || skip_planes < 0) return 0.0;
    mpq__shape s;
    mpq__shape_of(A, &s);
    double bits = (double)s.f->meta_bits * (double)s.rows * (double)s.ngroups;
    for (int br = 0; br < s.nbrows; br++) {
        int r = (br + 1) * s.block_rows < s.rows ? s.block_rows : s.rows - br * s.block_rows;
        for (int g = 0; g < s.ngroups; g++) {
            int b = s.bits[(size_t)br * (size_t)s.ngroups + (size_t)g] - skip_planes;
            bits += (double)r * (double)mpq__group_cols(&s, g) * (double)(b < 1 ? 1 : b);
        }
    }
    return bits / ((double)s.rows * (double)s.cols);
}

typedef struct mpq__pmpd_cand {
    double cost;
    long cnt[MPQ_PMPD_MAX_LEVELS];
    long start[MPQ_PMPD_MAX_LEVELS];
} mpq__pmpd_cand;

static int mpq__pmpd_cmp(const void *x, const void *y)
{
    const mpq__pmpd_cand *a = (const mpq__pmpd_cand *)x, *b = (const mpq__pmpd_cand *)y;
    if (a->cost != b->cost) return a->cost < b->cost ? -1 : 1;
    for (int k = 0; k < MPQ_PMPD_MAX_LEVELS; k++) /* more tokens at the higher precision first */
        if (a->cnt[k] != b->cnt[k]) return a->cnt[k] > b->cnt[k] ? -1 : 1;
    return 0;
}

MPQ_DEF mpq_status mpq_pmpd_static_search(const mpq_pmpd_search *d, mpq_pmpd_quality_fn q, void *user,
                                          mpq_pmpd_schedule *out, double *quality, int *evaluated)
{
    if (!d || !q || !out || !d->bits) return MPQ_ERR_ARG;
    if (d->length < 1 || d->candidates < 2) return MPQ_ERR_SIZE;
    if (!isfinite(d->target)) return MPQ_ERR_NONFINITE;
    mpq_pmpd_schedule base;
    memset(&base, 0, sizeof base);
    base.prefill_skip = d->prefill_skip;
    base.nlevels = d->nlevels;
    if (d->nlevels < 1 || d->nlevels > MPQ_PMPD_MAX_LEVELS) return MPQ_ERR_RANGE;
    for (int k = 0; k < d->nlevels; k++) base.skip[k] = d->skip[k];
    mpq_status st = mpq_pmpd_validate(&base);
    if (st != MPQ_OK) return st;
    if ((st = mpq__bits_check(d->bits, d->skip[d->nlevels - 1] + 1)) != MPQ_OK) return st;
    /* count the schedules: non-decreasing choices of nlevels-1 starts from N
       candidates, C(N + L - 2, L - 1) */
    const int N = d->candidates, S = d->nlevels - 1;
    double ncand = 1.0;
    for (int k = 1; k <= S; k++) ncand = ncand * (double)(N - 1 + k) / (double)k;
    if (ncand > (double)MPQ_PMPD_MAX_SEARCH) return MPQ_ERR_RANGE;
    const size_t cap = (size_t)(ncand + 0.5) + 1u;
    mpq__pmpd_cand *c = (mpq__pmpd_cand *)MPQ_MALLOC(sizeof(mpq__pmpd_cand) * cap);
    if (!c) return MPQ_ERR_NOMEM;
    size_t nc = 0;
    int idx[MPQ_PMPD_MAX_LEVELS] = {0};
    for (;;) { /* idx[1..S] non-decreasing in 0..N-1 */
        mpq_pmpd_schedule sc = base;
        for (int k = 1; k <= S; k++) sc.start[k] = (long)floor((double)idx[k] * (double)d->length / (N - 1) + 0.5);
        if (nc == cap) break; /* cannot happen: cap is the count plus one */
        mpq__pmpd_cand *e = &c[nc++];
        memset(e, 0, sizeof *e);
        e->cost = mpq__pmpd_avg(&sc, d->bits, d->length);
        mpq__pmpd_counts(&sc, d->length, e->cnt);
        for (int k = 0; k <= S; k++) e->start[k] = sc.start[k];
        int k = S;
        while (k >= 1 && idx[k] == N - 1) k--;
        if (k < 1) break;
        idx[k]++;
        for (int j = k + 1; j <= S; j++) idx[j] = idx[k];
    }
    qsort(c, nc, sizeof *c, mpq__pmpd_cmp);
    int evals = 0;
    st = MPQ_ERR_RANGE;
    for (size_t i = 0; i < nc; i++) {
        if (i > 0 && mpq__pmpd_cmp(&c[i], &c[i - 1]) == 0) continue; /* the same tokens at the same levels */
        mpq_pmpd_schedule sc = base;
        for (int k = 0; k <= S; k++) sc.start[k] = c[i].start[k];
        double qv = 0.0;
        mpq_status qs = q(user, &sc, &qv);
        evals++;
        if (qs != MPQ_OK) {
            st = qs;
            break;
        }
        if (!isfinite(qv)) {
            st = MPQ_ERR_NONFINITE;
            break;
        }
        if (qv >= d->target) {
            *out = sc;
            if (quality) *quality = qv;
            st = MPQ_OK;
            break;
        }
    }
    MPQ_FREE(c);
    if (evaluated) *evaluated = evals;
    return st;
}

MPQ_DEF mpq_status mpq_pmpd_phase_allocate(const int *skips, int n, const double *bits, double target,
                                           mpq_pmpd_quality_fn q, void *user, mpq_pmpd_schedule *out)
{
    if (!skips || !bits || !q || !out) return MPQ_ERR_ARG;
    if (n < 1 || n > MPQ_PMPD_MAX_LEVELS) return MPQ_ERR_SIZE;
    if (!isfinite(target)) return MPQ_ERR_NONFINITE;
    int mx = 0;
    for (int k = 0; k < n; k++) {
        if (skips[k] < 0 || skips[k] >= MPQ_MAX_BITS) return MPQ_ERR_RANGE;
        mx = skips[k] > mx ? skips[k] : mx;
    }
    mpq_status st = mpq__bits_check(bits, mx + 1);
    if (st != MPQ_OK) return st;
    /* pairs (prefill p, decode d) with p <= d, cheapest decode first, then
       cheapest prefill */
    int pr[MPQ_PMPD_MAX_LEVELS * MPQ_PMPD_MAX_LEVELS][2], np = 0;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            if (skips[a] <= skips[b]) pr[np][0] = skips[a], pr[np++][1] = skips[b];
    for (int i = 1; i < np; i++) { /* insertion sort, stable */
        int p0 = pr[i][0], d0 = pr[i][1], j = i;
        for (; j > 0; j--) {
            int pp = pr[j - 1][0], dd = pr[j - 1][1];
            int later = bits[dd] > bits[d0] || (bits[dd] == bits[d0] && bits[pp] > bits[p0]);
            if (!later) break;
            pr[j][0] = pp, pr[j][1] = dd;
        }
        pr[j][0] = p0, pr[j][1] = d0;
    }
    for (int i = 0; i < np; i++) {
        if (i > 0 && pr[i][0] == pr[i - 1][0] && pr[i][1] == pr[i - 1][1]) continue;
        mpq_pmpd_schedule sc;
        memset(&sc, 0, sizeof sc);
        sc.prefill_skip = pr[i][0];
        sc.nlevels = 1;
        sc.skip[0] = pr[i][1];
        double qv = 0.0;
        if ((st = q(user, &sc, &qv)) != MPQ_OK) return st;
        if (!isfinite(qv)) return MPQ_ERR_NONFINITE;
        if (qv >= target) {
            *out = sc;
            return MPQ_OK;
        }
    }
    return MPQ_ERR_RANGE;
}

/* --- the learned scheduler ------------------------------------------------ */

static uint64_t mpq__splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int mpq__pl_sizes_ok(int dk, int dv, int hidden, int classes)
{
    return dk >= 1 && dk <= 65536 && dv >= 1 && dv <= 65536 && hidden >= 1 && hidden <= 65536 && classes >= 2 &&
        classes <= MPQ_PMPD_MAX_CLASSES;
}

MPQ_DEF long mpq_pmpd_learned_params(const mpq_pmpd_learned *n)
{
    if (!n || !mpq__pl_sizes_ok(n->dk, n->dv, n->hidden, n->classes)) return 0;
    return (long)n->dk + (long)n->hidden * n->dv + n->hidden + (long)n->classes * n->hidden + n->classes;
}

MPQ_DEF mpq_status mpq_pmpd_learned_init(mpq_pmpd_learned *n, int dk, int dv, int hidden, int classes, uint64_t seed)
{
    if (!n) return MPQ_ERR_ARG;
    if (!mpq__pl_sizes_ok(dk, dv, hidden, classes)) return MPQ_ERR_SIZE;
    mpq_pmpd_learned t;
    memset(&t, 0, sizeof t);
    t.dk = dk, t.dv = dv, t.hidden = hidden, t.classes = classes;
    const size_t total = (size_t)mpq_pmpd_learned_params(&t) + 2u * (size_t)dv;
    if (!(t.mem = (float *)MPQ_MALLOC(sizeof(float) * total))) return MPQ_ERR_NOMEM;
    memset(t.mem, 0, sizeof(float) * total);
    t.q = t.mem; /* the trainable parameters first, in gradient order */
    t.w1 = t.q + dk;
    t.b1 = t.w1 + (size_t)hidden * dv;
    t.w2 = t.b1 + hidden;
    t.b2 = t.w2 + (size_t)classes * hidden;
    t.mean = t.b2 + classes;
    t.inv_sd = t.mean + dv;
    uint64_t r = seed;
    const double a1 = sqrt(6.0 / dv), a2 = sqrt(6.0 / hidden);
    for (size_t i = 0; i < (size_t)hidden * dv; i++)
        t.w1[i] = (float)(a1 * (2.0 * (double)(mpq__splitmix(&r) >> 11) / 9007199254740992.0 - 1.0));
    for (size_t i = 0; i < (size_t)classes * hidden; i++)
        t.w2[i] = (float)(a2 * (2.0 * (double)(mpq__splitmix(&r) >> 11) / 9007199254740992.0 - 1.0));
    for (int i = 0; i < dv; i++) t.inv_sd[i] = 1.0f;
    *n = t;
    return MPQ_OK;
}

MPQ_DEF void mpq_pmpd_learned_free(mpq_pmpd_learned *n)
{
    if (!n) return;
    MPQ_FREE(n->mem);
    memset(n, 0, sizeof *n);
}

MPQ_DEF mpq_status mpq_pmpd_learned_validate(const mpq_pmpd_learned *n)
{
    if (!n || !n->q || !n->w1 || !n->b1 || !n->w2 || !n->b2 || !n->mean || !n->inv_sd) return MPQ_ERR_ARG;
    if (!mpq__pl_sizes_ok(n->dk, n->dv, n->hidden, n->classes)) return MPQ_ERR_SIZE;
    if (n->layer < 0 || n->prefill_skip < 0 || n->prefill_skip >= MPQ_MAX_BITS || n->skip_high < 0 ||
        n->skip_low <= n->skip_high || n->skip_low >= MPQ_MAX_BITS || n->length < 1)
        return MPQ_ERR_RANGE;
    const float *arr[7] = {n->q, n->w1, n->b1, n->w2, n->b2, n->mean, n->inv_sd};
    const size_t len[7] = {(size_t)n->dk,      (size_t)n->hidden * n->dv,
                           (size_t)n->hidden,  (size_t)n->classes * n->hidden,
                           (size_t)n->classes, (size_t)n->dv,
                           (size_t)n->dv};
    for (int k = 0; k < 7; k++)
        for (size_t i = 0; i < len[k]; i++)
            if (!isfinite(arr[k][i]) || (k == 6 && !(arr[k][i] > 0.0f))) return MPQ_ERR_NONFINITE;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_pmpd_learned_class_schedule(const mpq_pmpd_learned *n, int c, mpq_pmpd_schedule *out)
{
    mpq_status st = mpq_pmpd_learned_validate(n);
    if (st != MPQ_OK) return st;
    if (!out) return MPQ_ERR_ARG;
    if (c < 0 || c >= n->classes) return MPQ_ERR_RANGE;
    memset(out, 0, sizeof *out);
    out->prefill_skip = n->prefill_skip;
    out->nlevels = 2;
    out->skip[0] = n->skip_high, out->skip[1] = n->skip_low;
    out->start[1] = (long)floor((double)c * (double)n->length / (n->classes - 1) + 0.5);
    return MPQ_OK;
}

/* Scratch of one sample's forward and backward pass, in doubles. */
typedef struct mpq__pl_work {
    double *a, *da, *u, *o, *z1, *h, *p, *dz, *dh, *du;
} mpq__pl_work;

static double *mpq__pl_work_init(const mpq_pmpd_learned *n, int T, mpq__pl_work *w)
{
    const size_t sz = 2u * (size_t)T + 3u * (size_t)n->dv + 3u * (size_t)n->hidden + 2u * (size_t)n->classes;
    double *m = (double *)MPQ_MALLOC(sizeof(double) * sz);
    if (!m) return NULL;
    w->a = m, w->da = w->a + T, w->u = w->da + T, w->o = w->u + n->dv, w->du = w->o + n->dv;
    w->z1 = w->du + n->dv, w->h = w->z1 + n->hidden, w->dh = w->h + n->hidden;
    w->p = w->dh + n->hidden, w->dz = w->p + n->classes;
    return m;
}

/* Forward pass into w (w->p the probabilities); 0 when K or V is not
   finite, or a value overflows. */
static int mpq__pl_forward(const mpq_pmpd_learned *n, const float *K, const float *V, int T, mpq__pl_work *w)
{
    const int dk = n->dk, dv = n->dv, H = n->hidden, C = n->classes;
    const double rs = 1.0 / sqrt((double)dk);
    double mx = -HUGE_VAL;
    for (int t = 0; t < T; t++) {
        double s = 0.0;
        for (int j = 0; j < dk; j++) s += (double)n->q[j] * K[(size_t)t * dk + j];
        w->a[t] = s * rs;
        if (!isfinite(w->a[t])) return 0;
        mx = w->a[t] > mx ? w->a[t] : mx;
    }
    double sum = 0.0;
    for (int t = 0; t < T; t++) sum += (w->a[t] = exp(w->a[t] - mx));
    for (int t = 0; t < T; t++) w->a[t] /= sum;
    for (int j = 0; j < dv; j++) w->u[j] = 0.0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < dv; j++) w->u[j] += w->a[t] * V[(size_t)t * dv + j];
    for (int j = 0; j < dv; j++) {
        if (!isfinite(w->u[j])) return 0;
        w->o[j] = (w->u[j] - n->mean[j]) * n->inv_sd[j];
    }
    for (int i = 0; i < H; i++) {
        double s = n->b1[i];
        for (int j = 0; j < dv; j++) s += (double)n->w1[(size_t)i * dv + j] * w->o[j];
        w->z1[i] = s;
        w->h[i] = s > 0.0 ? s : 0.0;
    }
    mx = -HUGE_VAL;
    for (int c = 0; c < C; c++) {
        double s = n->b2[c];
        for (int i = 0; i < H; i++) s += (double)n->w2[(size_t)c * H + i] * w->h[i];
        if (!isfinite(s)) return 0; /* weights large enough to overflow */
        w->p[c] = s;
        mx = s > mx ? s : mx;
    }
    sum = 0.0;
    for (int c = 0; c < C; c++) sum += (w->p[c] = exp(w->p[c] - mx));
    for (int c = 0; c < C; c++) w->p[c] /= sum;
    return 1;
}

MPQ_DEF mpq_status mpq_pmpd_learned_forward(const mpq_pmpd_learned *n, const float *K, const float *V, int T, double *p)
{
    mpq_status st = mpq_pmpd_learned_validate(n);
    if (st != MPQ_OK) return st;
    if (!K || !V || !p) return MPQ_ERR_ARG;
    if (T < 1) return MPQ_ERR_SIZE;
    mpq__pl_work w;
    double *m = mpq__pl_work_init(n, T, &w);
    if (!m) return MPQ_ERR_NOMEM;
    const int ok = mpq__pl_forward(n, K, V, T, &w);
    if (ok) memcpy(p, w.p, sizeof(double) * (size_t)n->classes);
    MPQ_FREE(m);
    return ok ? MPQ_OK : MPQ_ERR_NONFINITE;
}

MPQ_DEF mpq_status mpq_pmpd_learned_predict(const mpq_pmpd_learned *n, const float *K, const float *V, int T,
                                            mpq_pmpd_schedule *out, int *cls)
{
    double p[MPQ_PMPD_MAX_CLASSES];
    if (!out) return MPQ_ERR_ARG;
    mpq_status st = mpq_pmpd_learned_forward(n, K, V, T, p);
    if (st != MPQ_OK) return st;
    int best = 0;
    for (int c = 1; c < n->classes; c++) best = p[c] > p[best] ? c : best;
    if (cls) *cls = best;
    return mpq_pmpd_learned_class_schedule(n, best, out);
}

static mpq_status mpq__pl_samples_check(const mpq_pmpd_learned *n, const mpq_pmpd_sample *s, int ns)
{
    if (!s) return MPQ_ERR_ARG;
    if (ns < 1) return MPQ_ERR_SIZE;
    for (int i = 0; i < ns; i++) {
        if (!s[i].K || !s[i].V) return MPQ_ERR_ARG;
        if (s[i].T < 1) return MPQ_ERR_SIZE;
        if (s[i].label < 0 || s[i].label >= n->classes) return MPQ_ERR_RANGE;
    }
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_pmpd_learned_loss(const mpq_pmpd_learned *n, const mpq_pmpd_sample *s, int ns, double l2,
                                         double *loss, double *grad)
{
    mpq_status st = mpq_pmpd_learned_validate(n);
    if (st != MPQ_OK) return st;
    if (!loss) return MPQ_ERR_ARG;
    if (!(l2 >= 0.0) || !isfinite(l2)) return MPQ_ERR_RANGE;
    if ((st = mpq__pl_samples_check(n, s, ns)) != MPQ_OK) return st;
    const int dk = n->dk, dv = n->dv, H = n->hidden, C = n->classes;
    int Tmax = 1;
    for (int i = 0; i < ns; i++) Tmax = s[i].T > Tmax ? s[i].T : Tmax;
    mpq__pl_work w;
    double *m = mpq__pl_work_init(n, Tmax, &w);
    if (!m) return MPQ_ERR_NOMEM;
    const long P = mpq_pmpd_learned_params(n);
    if (grad) memset(grad, 0, sizeof(double) * (size_t)P);
    double *gq = grad, *gw1 = grad ? gq + dk : NULL, *gb1 = grad ? gw1 + (size_t)H * dv : NULL;
    double *gw2 = grad ? gb1 + H : NULL, *gb2 = grad ? gw2 + (size_t)C * H : NULL;
    double total = 0.0;
    const double rs = 1.0 / sqrt((double)dk), inv = 1.0 / ns;
    for (int i = 0; i < ns && st == MPQ_OK; i++) {
        const float *K = s[i].K, *V = s[i].V;
        const int T = s[i].T;
        if (!mpq__pl_forward(n, K, V, T, &w)) {
            st = MPQ_ERR_NONFINITE;
            break;
        }
        total -= log(w.p[s[i].label] > 1e-300 ? w.p[s[i].label] : 1e-300);
        if (!grad) continue;
        for (int c = 0; c < C; c++) w.dz[c] = (w.p[c] - (c == s[i].label)) * inv;
        for (int c = 0; c < C; c++) {
            gb2[c] += w.dz[c];
            for (int h = 0; h < H; h++) gw2[(size_t)c * H + h] += w.dz[c] * w.h[h];
        }
        for (int h = 0; h < H; h++) {
            double d = 0.0;
            for (int c = 0; c < C; c++) d += (double)n->w2[(size_t)c * H + h] * w.dz[c];
            w.dh[h] = w.z1[h] > 0.0 ? d : 0.0;
        }
        for (int j = 0; j < dv; j++) w.du[j] = 0.0;
        for (int h = 0; h < H; h++) {
            if (w.dh[h] == 0.0) continue;
            gb1[h] += w.dh[h];
            for (int j = 0; j < dv; j++) {
                gw1[(size_t)h * dv + j] += w.dh[h] * w.o[j];
                w.du[j] += (double)n->w1[(size_t)h * dv + j] * w.dh[h];
            }
        }
        for (int j = 0; j < dv; j++) w.du[j] *= n->inv_sd[j];
        /* through the attention: da_t = V_t . du, ds_t = a_t (da_t - sum a da) */
        double abar = 0.0;
        for (int t = 0; t < T; t++) {
            double d = 0.0;
            for (int j = 0; j < dv; j++) d += (double)V[(size_t)t * dv + j] * w.du[j];
            w.da[t] = d;
            abar += w.a[t] * d;
        }
        for (int t = 0; t < T; t++) {
            const double ds = w.a[t] * (w.da[t] - abar) * rs;
            for (int j = 0; j < dk; j++) gq[j] += ds * K[(size_t)t * dk + j];
        }
    }
    MPQ_FREE(m);
    if (st != MPQ_OK) return st;
    double reg = 0.0;
    for (size_t k = 0; k < (size_t)H * dv; k++) reg += (double)n->w1[k] * n->w1[k];
    for (size_t k = 0; k < (size_t)C * H; k++) reg += (double)n->w2[k] * n->w2[k];
    if (grad && l2 > 0.0) {
        for (size_t k = 0; k < (size_t)H * dv; k++) gw1[k] += l2 * n->w1[k];
        for (size_t k = 0; k < (size_t)C * H; k++) gw2[k] += l2 * n->w2[k];
    }
    *loss = total * inv + 0.5 * l2 * reg;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_pmpd_learned_train(mpq_pmpd_learned *n, const mpq_pmpd_sample *s, int ns,
                                          const mpq_pmpd_train_opts *o, double *loss)
{
    mpq_status st = mpq_pmpd_learned_validate(n);
    if (st != MPQ_OK) return st;
    if ((st = mpq__pl_samples_check(n, s, ns)) != MPQ_OK) return st;
    mpq_pmpd_train_opts d;
    memset(&d, 0, sizeof d);
    if (o) d = *o;
    const int steps = d.steps ? d.steps : 500;
    const double lr = d.lr != 0.0 ? d.lr : 0.01, l2 = d.l2;
    if (steps < 1 || !(lr > 0.0) || !isfinite(lr) || !(l2 >= 0.0) || !isfinite(l2)) return MPQ_ERR_RANGE;
    const int dk = n->dk, dv = n->dv;
    const size_t P = (size_t)mpq_pmpd_learned_params(n), all = P + 2u * (size_t)dv;
    /* a copy to train, so that n changes only on success */
    mpq_pmpd_learned t = *n;
    t.mem = (float *)MPQ_MALLOC(sizeof(float) * all);
    double *buf = (double *)MPQ_MALLOC(sizeof(double) * 4u * P);
    if (!t.mem || !buf) {
        MPQ_FREE(t.mem), MPQ_FREE(buf);
        return MPQ_ERR_NOMEM;
    }
    t.q = t.mem, t.w1 = t.q + dk, t.b1 = t.w1 + (size_t)n->hidden * dv, t.w2 = t.b1 + n->hidden;
    t.b2 = t.w2 + (size_t)n->classes * n->hidden, t.mean = t.b2 + n->classes, t.inv_sd = t.mean + dv;
    float *const dst[5] = {t.q, t.w1, t.b1, t.w2, t.b2}, *const src[5] = {n->q, n->w1, n->b1, n->w2, n->b2};
    const size_t len[5] = {(size_t)dk, (size_t)n->hidden * dv, (size_t)n->hidden, (size_t)n->classes * n->hidden,
                           (size_t)n->classes};
    for (int k = 0; k < 5; k++) memcpy(dst[k], src[k], sizeof(float) * len[k]);
    /* the normalisation: mean and standard deviation over the samples of
       their mean-pooled V */
    double *g = buf, *m1 = buf + P, *m2 = buf + 2 * P, *th = buf + 3 * P;
    double *mu = m1, *sq = m2; /* dv each, before Adam needs them */
    for (int j = 0; j < dv; j++) mu[j] = sq[j] = 0.0;
    for (int i = 0; i < ns && st == MPQ_OK; i++)
        for (int j = 0; j < dv; j++) {
            double u = 0.0;
            for (int tt = 0; tt < s[i].T; tt++) u += s[i].V[(size_t)tt * dv + j];
            u /= s[i].T;
            if (!isfinite(u)) st = MPQ_ERR_NONFINITE;
            mu[j] += u, sq[j] += u * u;
        }
    for (int j = 0; j < dv && st == MPQ_OK; j++) {
        const double mean = mu[j] / ns, var = sq[j] / ns - mean * mean;
        t.mean[j] = (float)mean;
        t.inv_sd[j] = (float)(var > 1e-12 * (1.0 + mean * mean) ? 1.0 / sqrt(var) : 1.0);
        if (!isfinite(t.inv_sd[j]) || !(t.inv_sd[j] > 0.0f)) t.inv_sd[j] = 1.0f;
    }
    for (size_t k = 0; k < P; k++) th[k] = t.mem[k], m1[k] = m2[k] = 0.0;
    double f = 0.0, b1t = 1.0, b2t = 1.0;
    for (int it = 0; it < steps && st == MPQ_OK; it++) {
        if ((st = mpq_pmpd_learned_loss(&t, s, ns, l2, &f, g)) != MPQ_OK) break;
        b1t *= 0.9, b2t *= 0.999;
        for (size_t k = 0; k < P; k++) {
            m1[k] = 0.9 * m1[k] + 0.1 * g[k];
            m2[k] = 0.999 * m2[k] + 0.001 * g[k] * g[k];
            th[k] -= lr * (m1[k] / (1.0 - b1t)) / (sqrt(m2[k] / (1.0 - b2t)) + 1e-8);
            t.mem[k] = (float)th[k];
        }
    }
    if (st == MPQ_OK) st = mpq_pmpd_learned_loss(&t, s, ns, l2, &f, NULL);
    if (st == MPQ_OK && !isfinite(f)) st = MPQ_ERR_NONFINITE;
    if (st == MPQ_OK) {
        for (int k = 0; k < 5; k++) memcpy(src[k], dst[k], sizeof(float) * len[k]);
        memcpy(n->mean, t.mean, sizeof(float) * (size_t)dv);
        memcpy(n->inv_sd, t.inv_sd, sizeof(float) * (size_t)dv);
        if (loss) *loss = f;
    }
    MPQ_FREE(t.mem), MPQ_FREE(buf);
    return st;
}

/* ========================================================================== */
/* 13. Recipes                                                                */
/* ========================================================================== */

MPQ_DEF unsigned mpq_recipe_needs(const mpq_recipe *r)
{
    if (!r) return 0;
    return MPQ_RECIPE_WEIGHTS | (r->awq ? MPQ_RECIPE_ACTS : 0u) | (r->act_order || r->gptq ? MPQ_RECIPE_HESSIAN : 0u) |
        (r->requant ? MPQ_RECIPE_PQI : 0u) | (r->planner != MPQ_PLANNER_NONE ? MPQ_RECIPE_SALIENCE : 0u);
}

/* ReQuant's shares with their defaults resolved (negative: none). */
static double mpq__recipe_share(double v) { return v == 0.0 ? 0.0025 : v < 0.0 ? 0.0 : v; }

/* The recipe's own fields. */
static mpq_status mpq__recipe_check_options(const mpq_recipe *r)
{
    if (r->planner < MPQ_PLANNER_NONE || r->planner > MPQ_PLANNER_KLD) return MPQ_ERR_ARG;
    if (r->format != 0 && !mpq_format_get((mpq_format)r->format)) return MPQ_ERR_ARG;
    if (r->bits < 0 || r->bits > MPQ_MAX_BITS || r->high_bits < 0 || r->high_bits > MPQ_MAX_BITS) return MPQ_ERR_BITS;
    if (r->requant && r->gptq) return MPQ_ERR_UNSUPPORTED;
    if (r->rotate < 0 || r->rotate > 1) return MPQ_ERR_ARG;
    if (r->requant && !(mpq__recipe_share(r->outliers) <= 0.5 && mpq__recipe_share(r->significant) <= 0.5))
        return MPQ_ERR_ARG;
    if (r->act_order &&
        (r->planner == MPQ_PLANNER_MXSENS || (r->planner == MPQ_PLANNER_SFMP && (r->reorder & MPQ_REORDER_COLS))))
        return MPQ_ERR_ARG;
    return MPQ_OK;
}

/* Map i against the recipe's given plan. */
static mpq_status mpq__recipe_check_map(const mpq_recipe *r, int i, const mpq_recipe_map *m)
{
    if (m->rows < 1 || m->cols < 1) return MPQ_ERR_SIZE;
    if (r->planner != MPQ_PLANNER_NONE || !r->plan) return MPQ_OK;
    if (!r->plan->layers || i >= r->plan->nlayers) return MPQ_ERR_SIZE;
    const mpq_layer_plan *L = &r->plan->layers[i];
    if (L->rows != m->rows || L->cols != m->cols) return MPQ_ERR_SIZE;
    return r->act_order && L->p_col ? MPQ_ERR_ARG : MPQ_OK;
}

/* What a recipe asks for, checked before any map is touched. */
static mpq_status mpq__recipe_check(const mpq_recipe *r, const mpq_recipe_map *maps, int n)
{
    if (!r || !maps) return MPQ_ERR_ARG;
    if (n < 1) return MPQ_ERR_SIZE;
    mpq_status st = mpq__recipe_check_options(r);
    if (st == MPQ_OK && r->planner == MPQ_PLANNER_NONE && r->plan && r->plan->nlayers != n) st = MPQ_ERR_SIZE;
    for (int i = 0; i < n && st == MPQ_OK; i++) st = mpq__recipe_check_map(r, i, &maps[i]);
    return st;
}

/* Fetches the `need` fields of map i (when the caller streams them) and
   checks that they are there. *fetched says whether a release is owed. */
static mpq_status mpq__recipe_fetch(const mpq_recipe *r, const mpq_recipe_io *io, int i, unsigned need,
                                    mpq_recipe_map *m, int *fetched)
{
    const int rows = m->rows, cols = m->cols;
    const char *name = m->name;
    *fetched = 0;
    if (io && io->fetch) {
        *fetched = 1;
        const mpq_status st = io->fetch(io->user, i, need, m);
        m->rows = rows, m->cols = cols, m->name = name;
        if (st != MPQ_OK) return st;
    }
    if ((need & MPQ_RECIPE_WEIGHTS) && !m->W) return MPQ_ERR_ARG;
    if ((need & MPQ_RECIPE_ACTS) && (!m->X || m->tokens < 1)) return MPQ_ERR_ARG;
    if ((need & MPQ_RECIPE_HESSIAN) && !m->H) return MPQ_ERR_ARG;
    if ((need & MPQ_RECIPE_PQI) && !m->pqi) return MPQ_ERR_ARG;
    if (need & MPQ_RECIPE_SALIENCE) {
        const int ok = r->planner == MPQ_PLANNER_SFMP ? m->fisher != NULL
            : r->planner == MPQ_PLANNER_MIXLLM        ? m->channel != NULL
            : r->planner == MPQ_PLANNER_KLD           ? m->kld != NULL
                                                      : m->col_sens != NULL;
        if (!ok) return MPQ_ERR_ARG;
    }
    return MPQ_OK;
}

static void mpq__recipe_release(const mpq_recipe_io *io, int i, mpq_recipe_map *m, int *fetched)
{
    if (*fetched && io && io->release) io->release(io->user, i, m);
    *fetched = 0;
}

static void mpq__recipe_progress(const mpq_recipe_io *io, const char *step, int done, int total, const char *name)
{
    if (io && io->progress) io->progress(io->user, step, done, total, name);
}

static mpq_status mpq__recipe_fail(mpq_recipe_result *res, mpq_status st, int map, const char *step)
{
    if (res) res->map = map, res->step = step;
    return st;
}

/* SFMP's description from the recipe's fields. */
static mpq_sfmp_desc mpq__recipe_sfmp_desc(const mpq_recipe *r)
{
    mpq_sfmp_desc d;
    memset(&d, 0, sizeof d);
    d.bpw = r->bpw, d.group = r->group, d.block_rows = r->block_rows, d.reorder = r->reorder;
    return d;
}

/* The planner over the maps' salience as the planning pass kept it: SFMP's
   reduced layers R, MixLLM's channel and MXSens's column salience S, or
   the KLD planner's measurements K (kld_nwidths a map) and row salience S
   (NULL where a map has no Fisher). */
static mpq_status mpq__recipe_call_planner(const mpq_recipe *r, const mpq_recipe_map *maps, int n,
                                           const mpq_sfmp_reduced *R, const float *const *S, const double *K,
                                           mpq_plan *out)
{
    mpq_status st = MPQ_ERR_NOMEM;
    if (r->planner == MPQ_PLANNER_KLD) {
        mpq_measured_layer *L = (mpq_measured_layer *)MPQ_MALLOC(sizeof *L * (size_t)n);
        if (L) {
            for (int i = 0; i < n; i++)
                L[i].rows = maps[i].rows, L[i].cols = maps[i].cols, L[i].loss = K + (size_t)i * r->kld_nwidths,
                L[i].row_salience = S[i];
            mpq_measured_desc d;
            memset(&d, 0, sizeof d);
            d.widths = r->kld_widths, d.nwidths = r->kld_nwidths, d.bpw = r->bpw, d.max_loss = r->max_kld;
            d.group = r->group, d.block_rows = r->block_rows, d.symmetric = r->symmetric;
            st = mpq_plan_measured(L, n, &d, out);
            MPQ_FREE(L);
        }
    } else if (r->planner == MPQ_PLANNER_SFMP) {
        const mpq_sfmp_desc d = mpq__recipe_sfmp_desc(r);
        st = mpq_plan_sfmp_reduced(R, n, &d, out);
    } else if (r->planner == MPQ_PLANNER_MIXLLM) {
        mpq_mixllm_layer *L = (mpq_mixllm_layer *)MPQ_MALLOC(sizeof *L * (size_t)n);
        if (L) {
            for (int i = 0; i < n; i++) L[i].salience = S[i], L[i].rows = maps[i].rows, L[i].cols = maps[i].cols;
            mpq_mixllm_desc d;
            memset(&d, 0, sizeof d);
            d.fraction = r->fraction, d.high_bits = r->high_bits, d.low_bits = r->bits, d.group = r->group;
            st = mpq_plan_mixllm(L, n, &d, out);
            MPQ_FREE(L);
        }
    } else {
        mpq_mxsens_layer *L = (mpq_mxsens_layer *)MPQ_MALLOC(sizeof *L * (size_t)n);
        if (L) {
            for (int i = 0; i < n; i++)
                L[i].col_sens = S[i], L[i].layer_sens = maps[i].layer_sens, L[i].rows = maps[i].rows,
                L[i].cols = maps[i].cols;
            st = mpq_plan_mxsens(L, n, r->bpw, out, NULL);
            MPQ_FREE(L);
        }
    }
    return st;
}

/* GPTQ's act-order of map m: by diag(H), or with the recipe's rotation by
   diag(V H V^T), the X^T X of the inputs V x (rot: the map's V). */
static mpq_status mpq__recipe_act_order(const mpq_recipe_map *m, const mpq_rotation *rot, uint32_t *order)
{
    if (!rot) return mpq_gptq_act_order(m->H, m->cols, order);
    const size_t nn = (size_t)m->cols * (size_t)m->cols;
    float *Hr = (float *)MPQ_MALLOC(sizeof(float) * nn);
    if (!Hr) return MPQ_ERR_NOMEM;
    memcpy(Hr, m->H, sizeof(float) * nn);
    mpq_status st = mpq_rotation_conjugate(rot, Hr);
    if (st == MPQ_OK) st = mpq_gptq_act_order(Hr, m->cols, order);
    MPQ_FREE(Hr);
    return st;
}

/* What the planning pass keeps of fetched map m: SFMP's reduction of its
   Fisher diagonal (under act-order with the columns in act-order); the KLD
   planner's measurements (into K) and the row sums of the Fisher diagonal,
   where there is one; else a copy of its channel or column salience. */
static mpq_status mpq__recipe_keep_salience(const mpq_recipe *r, const mpq_recipe_map *m, mpq_sfmp_reduced *R,
                                            float **S, double *K, const char **step)
{
    if (r->planner == MPQ_PLANNER_KLD) {
        memcpy(K, m->kld, sizeof(double) * (size_t)r->kld_nwidths);
        if (!m->fisher) return MPQ_OK;
        *S = (float *)MPQ_MALLOC(sizeof(float) * (size_t)m->rows);
        if (!*S) return MPQ_ERR_NOMEM;
        for (int i = 0; i < m->rows; i++) {
            double sum = 0.0;
            for (int j = 0; j < m->cols; j++) sum += m->fisher[(size_t)i * m->cols + j];
            (*S)[i] = (float)sum;
        }
        return MPQ_OK;
    }
    if (r->planner != MPQ_PLANNER_SFMP) {
        const size_t k = r->planner == MPQ_PLANNER_MIXLLM ? (size_t)m->rows : (size_t)m->cols;
        *S = (float *)MPQ_MALLOC(sizeof(float) * k);
        if (!*S) return MPQ_ERR_NOMEM;
        memcpy(*S, r->planner == MPQ_PLANNER_MIXLLM ? m->channel : m->col_sens, sizeof(float) * k);
        return MPQ_OK;
    }
    const mpq_sfmp_desc d = mpq__recipe_sfmp_desc(r);
    mpq_sfmp_layer L;
    L.S = m->fisher, L.rows = m->rows, L.cols = m->cols;
    if (!r->act_order) return mpq_sfmp_reduce(&L, &d, R);
    *step = "act-order";
    uint32_t *order = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)m->cols);
    float *F = (float *)MPQ_MALLOC(sizeof(float) * (size_t)m->rows * (size_t)m->cols);
    mpq_rotation rot;
    memset(&rot, 0, sizeof rot);
    mpq_status st = order && F ? MPQ_OK : MPQ_ERR_NOMEM;
    if (st == MPQ_OK && r->rotate) st = mpq_rotation_init(&rot, m->cols, r->rotate_seed);
    if (st == MPQ_OK) st = mpq__recipe_act_order(m, r->rotate ? &rot : NULL, order);
    mpq_rotation_free(&rot);
    if (st == MPQ_OK) st = mpq_perm_apply(m->fisher, m->rows, m->cols, NULL, order, F);
    if (st == MPQ_OK) {
        *step = "planning";
        L.S = F;
        st = mpq_sfmp_reduce(&L, &d, R);
    }
    MPQ_FREE(order);
    MPQ_FREE(F);
    return st;
}

/* The planning step: each map's salience is fetched (with H for SFMP under
   act-order), reduced to what its planner reads and released before the
   next, then the plan is made from the reductions. */
static mpq_status mpq__recipe_plan(const mpq_recipe *r, mpq_recipe_map *maps, int n, const mpq_recipe_io *io,
                                   mpq_plan *out, mpq_recipe_result *res)
{
    const unsigned need =
        MPQ_RECIPE_SALIENCE | (r->act_order && r->planner == MPQ_PLANNER_SFMP ? MPQ_RECIPE_HESSIAN : 0u);
    if (r->planner == MPQ_PLANNER_KLD && (!r->kld_widths || r->kld_nwidths < 1 || r->kld_nwidths > 8))
        return mpq__recipe_fail(res, MPQ_ERR_ARG, -1, "recipe");
    mpq_sfmp_reduced *R = (mpq_sfmp_reduced *)MPQ_MALLOC(sizeof *R * (size_t)n);
    float **S = (float **)MPQ_MALLOC(sizeof(float *) * (size_t)n);
    double *K =
        r->planner == MPQ_PLANNER_KLD ? (double *)MPQ_MALLOC(sizeof(double) * (size_t)n * r->kld_nwidths) : NULL;
    if (!R || !S || (r->planner == MPQ_PLANNER_KLD && !K)) {
        MPQ_FREE(R);
        MPQ_FREE(S);
        MPQ_FREE(K);
        return mpq__recipe_fail(res, MPQ_ERR_NOMEM, -1, "planning");
    }
    memset(R, 0, sizeof *R * (size_t)n);
    for (int i = 0; i < n; i++) S[i] = NULL;
    mpq_status st = MPQ_OK;
    int at = -1;
    const char *step = "planning";
    if (r->planner == MPQ_PLANNER_SFMP) { /* the budget, from the shapes alone, before any salience is read */
        const mpq_sfmp_desc d = mpq__recipe_sfmp_desc(r);
        double nw = 0.0, meta = 0.0, extra;
        size_t nblocks = 0;
        int G, BR, lo;
        st = mpq__sfmp_blocks(&d, &G, &BR);
        for (int i = 0; i < n && st == MPQ_OK; i++)
            st = mpq__sfmp_add(maps[i].rows, maps[i].cols, G, BR, &nw, &meta, &nblocks);
        if (st == MPQ_OK) st = mpq__sfmp_budget(&d, nw, meta, &lo, &extra);
    }
    for (int i = 0; i < n && st == MPQ_OK; i++) {
        mpq__recipe_progress(io, "planning", i, n, maps[i].name);
        int fetched = 0;
        at = i, step = "fetch";
        st = mpq__recipe_fetch(r, io, i, need, &maps[i], &fetched);
        if (st == MPQ_OK) {
            step = "planning";
            st = mpq__recipe_keep_salience(r, &maps[i], &R[i], &S[i], K ? K + (size_t)i * r->kld_nwidths : NULL, &step);
        }
        mpq__recipe_release(io, i, &maps[i], &fetched);
    }
    if (st == MPQ_OK) {
        at = -1, step = "planning";
        mpq__recipe_progress(io, "planning", n, n, NULL);
        st = mpq__recipe_call_planner(r, maps, n, R, (const float *const *)S, K, out);
    }
    for (int i = 0; i < n; i++) {
        mpq_sfmp_reduced_free(&R[i]);
        MPQ_FREE(S[i]);
    }
    MPQ_FREE(R);
    MPQ_FREE(S);
    MPQ_FREE(K);
    return st == MPQ_OK ? MPQ_OK : mpq__recipe_fail(res, st, at, step);
}

/* What one map carries from its preparation to its packing. */
typedef struct mpq__recipe_job {
    mpq_bitplane_desc d;
    uint32_t *order;  /* act-order (d.p_col) */
    float *cs, *clip; /* AWQ (d.col_scale, d.clip) */
    mpq_rotation rot; /* d.rotation */
    float *Wr;        /* ReQuant under a rotation: W V^T (mpq__recipe_sparse_w) */
} mpq__recipe_job;

static void mpq__recipe_job_free(mpq__recipe_job *J)
{
    MPQ_FREE(J->order);
    MPQ_FREE(J->cs);
    MPQ_FREE(J->clip);
    MPQ_FREE(J->Wr);
    mpq_rotation_free(&J->rot);
    memset(J, 0, sizeof *J);
}

/* The weights ReQuant's masks and sparse part are in (*W, unless W is
   NULL): W, or under a rotation W V^T, made here and kept in J->Wr; the
   coordinates of mpq_requant_map. */
static mpq_status mpq__recipe_sparse_w(const mpq_recipe_map *m, mpq__recipe_job *J, const float **W)
{
    mpq_status st = MPQ_OK;
    float *none;
    if (J->d.rotation) st = mpq__rotated_copies(J->d.rotation, m->rows, m->W, NULL, &J->Wr, &none);
    if (W) *W = J->d.rotation ? J->Wr : m->W;
    return st;
}

/* Steps before the quantizer: the description (plan layer i, or the
   uniform fields), act-order, AWQ. */
static mpq_status mpq__recipe_prepare(const mpq_recipe *r, const mpq_plan *plan, int i, const mpq_recipe_map *m,
                                      mpq__recipe_job *J, const char **step)
{
    memset(J, 0, sizeof *J);
    mpq_bitplane_desc *d = &J->d;
    *step = "pack";
    if (plan) {
        const mpq_status st = mpq_plan_desc(plan, i, d);
        if (st != MPQ_OK) return st;
        if (d->rows != m->rows || d->cols != m->cols) return MPQ_ERR_SIZE;
    } else {
        d->rows = m->rows, d->cols = m->cols, d->group = r->group, d->block_rows = r->block_rows;
        d->uniform_bits = r->bits, d->format = r->format;
        if (r->symmetric) d->symmetric = 1u << (r->bits ? r->bits : 4);
    }
    mpq_status st = MPQ_OK;
    if (r->rotate) {
        *step = "rotation";
        if ((st = mpq_rotation_init(&J->rot, m->cols, r->rotate_seed)) != MPQ_OK) return st;
        d->rotation = &J->rot;
    }
    if (r->act_order) {
        *step = "act-order";
        if (d->p_col) return MPQ_ERR_ARG;
        J->order = (uint32_t *)MPQ_MALLOC(sizeof(uint32_t) * (size_t)m->cols);
        st = J->order ? mpq__recipe_act_order(m, r->rotate ? &J->rot : NULL, J->order) : MPQ_ERR_NOMEM;
        d->p_col = J->order;
    }
    if (st == MPQ_OK && r->awq) {
        *step = "AWQ";
        const mpq_format_traits *f = mpq_format_get((mpq_format)(d->format ? d->format : MPQ_FORMAT_BITPLANE));
        const int group = d->group ? d->group : f ? f->default_group : 128;
        J->cs = (float *)MPQ_MALLOC(sizeof(float) * (size_t)m->cols);
        J->clip = (float *)MPQ_MALLOC(sizeof(float) * (size_t)m->rows * (size_t)((m->cols + group - 1) / group));
        mpq_awq_desc a = r->awq_opts;
        a.X = m->X, a.tokens = m->tokens;
        st = J->cs && J->clip ? mpq_awq_search(d, m->W, &a, J->cs, J->clip, NULL) : MPQ_ERR_NOMEM;
        d->col_scale = J->cs, d->clip = J->clip;
    }
    if (st == MPQ_OK) *step = r->gptq ? "GPTQ" : "pack";
    return st;
}

/* The quantizer on a prepared map: GPTQ (its factorisations through
   cache where the recipe's settings name none), or round to nearest, with
   the sparse part of mask (ReQuant). */
static mpq_status mpq__recipe_pack(const mpq_recipe *r, const mpq_recipe_map *m, const mpq__recipe_job *J,
                                   const uint8_t *mask, mpq_gptq_cache *cache, mpq_packed *out)
{
    if (mask) {
        mpq_requant_map M;
        memset(&M, 0, sizeof M);
        M.W = J->Wr ? J->Wr : m->W, M.d = J->d, M.mask = (uint8_t *)(uintptr_t)mask;
        return mpq_requant_pack(&M, out);
    }
    if (r->gptq) {
        mpq_gptq_desc g = r->gptq_opts;
        g.H = m->H;
        if (!g.cache) g.cache = cache;
        return mpq_gptq_alloc(&J->d, m->W, &g, out, NULL);
    }
    return mpq_pack_alloc(&J->d, m->W, out);
}

MPQ_DEF mpq_status mpq_recipe_quantize(const mpq_recipe *r, int i, const mpq_recipe_map *m, const uint8_t *mask,
                                       mpq_packed *out)
{
    if (!r || !m || !out || i < 0) return MPQ_ERR_ARG;
    mpq_status st = mpq__recipe_check_options(r);
    if (st == MPQ_OK) st = mpq__recipe_check_map(r, i, m);
    if (st != MPQ_OK) return st;
    if (r->planner != MPQ_PLANNER_NONE || r->requant || (mask && r->gptq)) return MPQ_ERR_ARG;
    mpq_recipe_map c = *m;
    int fetched = 0;
    if ((st = mpq__recipe_fetch(r, NULL, i, mpq_recipe_needs(r), &c, &fetched)) != MPQ_OK) return st;
    mpq__recipe_job J;
    const char *step;
    st = mpq__recipe_prepare(r, r->plan, i, m, &J, &step);
    if (st == MPQ_OK && mask) st = mpq__recipe_sparse_w(m, &J, NULL);
    if (st == MPQ_OK) st = mpq__recipe_pack(r, m, &J, mask, NULL, out);
    mpq__recipe_job_free(&J);
    return st;
}

MPQ_DEF mpq_status mpq_recipe_plan(const mpq_recipe *r, mpq_recipe_map *maps, int n, const mpq_recipe_io *io,
                                   mpq_plan *out)
{
    if (!out) return MPQ_ERR_ARG;
    mpq_status st = mpq__recipe_check(r, maps, n);
    if (st != MPQ_OK) return st;
    if (r->planner == MPQ_PLANNER_NONE) return MPQ_ERR_ARG;
    return mpq__recipe_plan(r, maps, n, io, out, NULL);
}

/* Hands a finished matrix over: to io->store, or into tmp[i]. */
static mpq_status mpq__recipe_store(const mpq_recipe_io *io, int i, mpq_packed *A, mpq_packed *tmp)
{
    if (io && io->store) {
        const mpq_status st = io->store(io->user, i, A);
        if (st != MPQ_OK) mpq_packed_free(A);
        return st;
    }
    tmp[i] = *A;
    memset(A, 0, sizeof *A);
    return MPQ_OK;
}

/* ReQuant: every map prepared and held, the masks over all of them, then
   each map packed with its sparse part. */
static mpq_status mpq__recipe_requant(const mpq_recipe *r, const mpq_plan *plan, mpq_recipe_map *maps, int n,
                                      const mpq_recipe_io *io, mpq_packed *tmp, mpq_recipe_result *res)
{
    const unsigned need = mpq_recipe_needs(r) & ~MPQ_RECIPE_SALIENCE;
    mpq__recipe_job *J = (mpq__recipe_job *)MPQ_MALLOC(sizeof *J * (size_t)n);
    mpq_requant_map *M = (mpq_requant_map *)MPQ_MALLOC(sizeof *M * (size_t)n);
    int *fetched = (int *)MPQ_MALLOC(sizeof(int) * (size_t)n);
    if (!J || !M || !fetched) {
        MPQ_FREE(J);
        MPQ_FREE(M);
        MPQ_FREE(fetched);
        return mpq__recipe_fail(res, MPQ_ERR_NOMEM, -1, "ReQuant");
    }
    memset(J, 0, sizeof *J * (size_t)n);
    memset(M, 0, sizeof *M * (size_t)n);
    for (int i = 0; i < n; i++) fetched[i] = 0;
    mpq_status st = MPQ_OK;
    int at = -1;
    const char *step = "ReQuant";
    for (int i = 0; i < n && st == MPQ_OK; i++) {
        mpq__recipe_progress(io, "ReQuant", i, n, maps[i].name);
        at = i, step = "fetch";
        st = mpq__recipe_fetch(r, io, i, need, &maps[i], &fetched[i]);
        if (st == MPQ_OK) st = mpq__recipe_prepare(r, plan, i, &maps[i], &J[i], &step);
        if (st != MPQ_OK) break;
        step = "ReQuant"; /* the map's own faults, before the ranking over all of them */
        const size_t nw = (size_t)maps[i].rows * (size_t)maps[i].cols;
        st = mpq__check_finite(maps[i].W, nw);
        if (st == MPQ_OK && (st = mpq__check_finite(maps[i].pqi, nw)) == MPQ_OK)
            for (size_t k = 0; k < nw && st == MPQ_OK; k++)
                if (maps[i].pqi[k] < 0.0f) st = MPQ_ERR_RANGE;
        if (st == MPQ_OK) st = mpq__recipe_sparse_w(&maps[i], &J[i], &M[i].W);
        if (st != MPQ_OK) break;
        M[i].pqi = maps[i].pqi, M[i].d = J[i].d;
        M[i].mask = (uint8_t *)MPQ_MALLOC((size_t)maps[i].rows * (size_t)maps[i].cols);
        if (!M[i].mask) st = MPQ_ERR_NOMEM;
    }
    if (st == MPQ_OK) {
        at = -1, step = "ReQuant";
        mpq__recipe_progress(io, "ReQuant", n, n, NULL);
        double t = 0;
        size_t marked = 0;
        st = mpq_requant_masks(M, n, mpq__recipe_share(r->outliers), mpq__recipe_share(r->significant), &t, &marked);
        if (st == MPQ_OK && res) res->requant_t = t, res->sparse_weights = marked;
    }
    for (int i = 0; i < n && st == MPQ_OK; i++) {
        mpq__recipe_progress(io, "quantizing", i, n, maps[i].name);
        at = i, step = "pack";
        mpq_packed A;
        st = mpq_requant_pack(&M[i], &A);
        MPQ_FREE(M[i].mask);
        M[i].mask = NULL;
        mpq__recipe_job_free(&J[i]);
        mpq__recipe_release(io, i, &maps[i], &fetched[i]);
        if (st == MPQ_OK) step = "store", st = mpq__recipe_store(io, i, &A, tmp);
    }
    for (int i = 0; i < n; i++) {
        MPQ_FREE(M[i].mask);
        mpq__recipe_job_free(&J[i]);
        mpq__recipe_release(io, i, &maps[i], &fetched[i]);
    }
    MPQ_FREE(J);
    MPQ_FREE(M);
    MPQ_FREE(fetched);
    return st == MPQ_OK ? MPQ_OK : mpq__recipe_fail(res, st, at, step);
}

MPQ_DEF mpq_status mpq_recipe_run(const mpq_recipe *r, mpq_recipe_map *maps, int n, const mpq_recipe_io *io,
                                  mpq_packed *out, mpq_recipe_result *res)
{
    if (res) memset(res, 0, sizeof *res), res->map = -1;
    mpq_status st = mpq__recipe_check(r, maps, n);
    if (st != MPQ_OK) return mpq__recipe_fail(res, st, -1, "recipe");
    if (!out && !(io && io->store)) return mpq__recipe_fail(res, MPQ_ERR_ARG, -1, "store");
    mpq_plan own;
    memset(&own, 0, sizeof own);
    const mpq_plan *plan = r->plan;
    if (r->planner != MPQ_PLANNER_NONE) {
        if ((st = mpq__recipe_plan(r, maps, n, io, &own, res)) != MPQ_OK) return st;
        plan = &own;
        if (res) res->bpw = own.bpw, res->loss = own.loss;
    }
    /* results go to a scratch array first: out is written only on success */
    mpq_packed *tmp = NULL;
    if (!(io && io->store)) {
        tmp = (mpq_packed *)MPQ_MALLOC(sizeof *tmp * (size_t)n);
        if (!tmp) {
            mpq_plan_free(&own);
            return mpq__recipe_fail(res, MPQ_ERR_NOMEM, -1, "store");
        }
        memset(tmp, 0, sizeof *tmp * (size_t)n);
    }
    if (r->requant && (mpq__recipe_share(r->outliers) > 0.0 || mpq__recipe_share(r->significant) > 0.0)) {
        st = mpq__recipe_requant(r, plan, maps, n, io, tmp, res);
    } else {
        const unsigned need = mpq_recipe_needs(r) & ~(MPQ_RECIPE_SALIENCE | MPQ_RECIPE_PQI);
        mpq_gptq_cache *cache = r->gptq && !r->gptq_opts.cache ? mpq_gptq_cache_new() : NULL; /* q, k, v; gate, up */
        for (int i = 0; i < n && st == MPQ_OK; i++) {
            mpq__recipe_progress(io, "quantizing", i, n, maps[i].name);
            int fetched = 0;
            const char *step = "fetch";
            mpq__recipe_job J;
            memset(&J, 0, sizeof J);
            mpq_packed A;
            memset(&A, 0, sizeof A);
            st = mpq__recipe_fetch(r, io, i, need, &maps[i], &fetched);
            if (st == MPQ_OK) st = mpq__recipe_prepare(r, plan, i, &maps[i], &J, &step);
            if (st == MPQ_OK) st = mpq__recipe_pack(r, &maps[i], &J, NULL, cache, &A);
            mpq__recipe_job_free(&J);
            mpq__recipe_release(io, i, &maps[i], &fetched);
            if (st == MPQ_OK) step = "store", st = mpq__recipe_store(io, i, &A, tmp);
            if (st != MPQ_OK) mpq__recipe_fail(res, st, i, step);
        }
        mpq_gptq_cache_free(cache);
    }
    if (st == MPQ_OK) mpq__recipe_progress(io, "quantizing", n, n, NULL);
    mpq_plan_free(&own);
    if (tmp) {
        for (int i = 0; i < n; i++) {
            if (st == MPQ_OK)
                out[i] = tmp[i];
            else
                mpq_packed_free(&tmp[i]);
        }
        MPQ_FREE(tmp);
    }
    return st;
}

MPQ_DEF mpq_status mpq_recipe_bpw_range(const mpq_recipe *r, const mpq_recipe_map *maps, int n, double *lo, double *hi,
                                        int *worst)
{
    if (!r || !maps || !lo || !hi) return MPQ_ERR_ARG;
    if (n < 1) return MPQ_ERR_SIZE;
    if (r->planner != MPQ_PLANNER_SFMP && r->planner != MPQ_PLANNER_MXSENS) return MPQ_ERR_ARG;
    int maxc = 1;
    for (int i = 0; i < n; i++) {
        if (maps[i].rows < 1 || maps[i].cols < 1) return MPQ_ERR_SIZE;
        maxc = maps[i].cols > maxc ? maps[i].cols : maxc;
    }
    /* the range depends on the shapes only: the planners' layers get zeros
       for their statistics */
    float *zero = (float *)MPQ_MALLOC(sizeof(float) * (size_t)maxc);
    if (!zero) return MPQ_ERR_NOMEM;
    memset(zero, 0, sizeof(float) * (size_t)maxc);
    mpq_status st = MPQ_OK;
    double l = 0, h = 0, wl = -1;
    int w = 0;
    for (int k = -1; k < n && st == MPQ_OK; k++) { /* k = -1: all maps; then each alone */
        const int first = k < 0 ? 0 : k, count = k < 0 ? n : 1;
        double lk = 0, hk = 0;
        if (r->planner == MPQ_PLANNER_SFMP) {
            /* mpq_sfmp_bpw_range reads the shapes and that S is set */
            mpq_sfmp_layer one, *L = count == 1 ? &one : (mpq_sfmp_layer *)MPQ_MALLOC(sizeof *L * (size_t)count);
            if (!L) {
                st = MPQ_ERR_NOMEM;
                break;
            }
            for (int i = 0; i < count; i++)
                L[i].S = zero, L[i].rows = maps[first + i].rows, L[i].cols = maps[first + i].cols;
            mpq_sfmp_desc d;
            memset(&d, 0, sizeof d);
            d.group = r->group, d.block_rows = r->block_rows, d.reorder = r->reorder;
            st = mpq_sfmp_bpw_range(L, count, &d, &lk, &hk);
            if (L != &one) MPQ_FREE(L);
        } else {
            mpq_mxsens_layer one, *L = count == 1 ? &one : (mpq_mxsens_layer *)MPQ_MALLOC(sizeof *L * (size_t)count);
            if (!L) {
                st = MPQ_ERR_NOMEM;
                break;
            }
            double nw = 0, six = 0;
            for (int i = 0; i < count; i++) {
                const mpq_recipe_map *m = &maps[first + i];
                L[i].col_sens = zero, L[i].layer_sens = 1.0f, L[i].rows = m->rows, L[i].cols = m->cols;
                /* at most: every column after the first block at 6 bits (as the
                   planner counts them, before rounding to whole blocks) */
                nw += (double)m->rows * m->cols;
                six += m->cols > MPQ_MX_BLOCK ? 2.0 * m->rows * (double)(m->cols - MPQ_MX_BLOCK) : 0.0;
            }
            st = mpq_mxsens_bpw_min(L, count, &lk);
            hk = lk + six / nw;
            if (L != &one) MPQ_FREE(L);
        }
        if (k < 0)
            l = lk, h = hk;
        else if (lk > wl)
            wl = lk, w = k;
    }
    MPQ_FREE(zero);
    if (st != MPQ_OK) return st;
    *lo = l, *hi = h;
    if (worst) *worst = w;
    return MPQ_OK;
}

/* ========================================================================== */
/* 14. Rotations                                                              */
/* ========================================================================== */

/* A standard normal from the generator (Box-Muller on two 53-bit uniforms). */
static double mpq__gauss(uint64_t *s)
{
    const double u = ((double)(mpq__splitmix(s) >> 11) + 0.5) / 9007199254740992.0;
    const double v = (double)(mpq__splitmix(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Q of the Householder QR of the m x m matrix A (row-major, overwritten),
   columns multiplied by the signs of R's diagonal: into Q (m x m). */
static void mpq__haar_q(double *A, int m, double *Q, double *v)
{
    for (int i = 0; i < m * m; i++) Q[i] = 0;
    for (int i = 0; i < m; i++) Q[(size_t)i * m + i] = 1;
    for (int k = 0; k < m; k++) {
        double norm = 0;
        for (int i = k; i < m; i++) norm += A[(size_t)i * m + k] * A[(size_t)i * m + k];
        norm = sqrt(norm);
        const double a = A[(size_t)k * m + k], alpha = a > 0 ? -norm : norm; /* R[k][k] = alpha */
        for (int i = 0; i < m; i++) v[i] = i < k ? 0 : A[(size_t)i * m + k];
        v[k] -= alpha;
        double vv = 0;
        for (int i = k; i < m; i++) vv += v[i] * v[i];
        if (vv > 0) {
            for (int j = k; j < m; j++) { /* A <- (I - 2 v v^T / v^T v) A */
                double d = 0;
                for (int i = k; i < m; i++) d += v[i] * A[(size_t)i * m + j];
                d *= 2 / vv;
                for (int i = k; i < m; i++) A[(size_t)i * m + j] -= d * v[i];
            }
            for (int i = 0; i < m; i++) { /* Q <- Q (I - 2 v v^T / v^T v) */
                double d = 0;
                for (int j = k; j < m; j++) d += Q[(size_t)i * m + j] * v[j];
                d *= 2 / vv;
                for (int j = k; j < m; j++) Q[(size_t)i * m + j] -= d * v[j];
            }
        }
        if (A[(size_t)k * m + k] < 0) /* R[k][k] > 0: Q's column k times -1 */
            for (int i = 0; i < m; i++) Q[(size_t)i * m + k] = -Q[(size_t)i * m + k];
    }
}

MPQ_DEF void mpq_rotation_free(mpq_rotation *r)
{
    if (!r) return;
    MPQ_FREE(r->mem);
    memset(r, 0, sizeof *r);
}

MPQ_DEF mpq_status mpq_rotation_init(mpq_rotation *r, int n, uint64_t seed)
{
    if (!r) return MPQ_ERR_ARG;
    memset(r, 0, sizeof *r);
    if (n < 1) return MPQ_ERR_SIZE;
    int p = 1;
    while ((n / p) % 2 == 0) p *= 2;
    const int m = n / p;
    if (m > MPQ_ROTATION_MAX_ODD) return MPQ_ERR_SIZE;
    /* one block: R (m x m floats), then the sign bits */
    const size_t rfloats = sizeof(float) * (size_t)m * (size_t)m, sbytes = ((size_t)n + 7u) / 8u;
    uint8_t *mem = (uint8_t *)MPQ_MALLOC(rfloats + sbytes);
    double *A = (double *)MPQ_MALLOC(sizeof(double) * (2 * (size_t)m * (size_t)m + (size_t)m));
    if (!mem || !A) {
        MPQ_FREE(A);
        MPQ_FREE(mem);
        return MPQ_ERR_NOMEM;
    }
    float *R = (float *)(void *)mem;
    uint8_t *sign = mem + rfloats;
    memset(sign, 0, sbytes);
    uint64_t s = seed ^ 0x6D70712D726F7461ull; /* the stream of rotations */
    for (int j = 0; j < n; j++)
        if (mpq__splitmix(&s) >> 63) sign[j / 8] |= (uint8_t)(1u << (j % 8));
    for (int i = 0; i < m * m; i++) A[i] = mpq__gauss(&s);
    double *Q = A + (size_t)m * m;
    mpq__haar_q(A, m, Q, Q + (size_t)m * m);
    for (int i = 0; i < m * m; i++) R[i] = (float)Q[i];
    MPQ_FREE(A);
    r->n = n, r->p = p, r->m = m, r->seed = seed;
    r->sign = sign, r->R = R, r->mem = mem;
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_rotation_check(const mpq_rotation *r)
{
    if (!r || !r->sign || !r->R) return MPQ_ERR_ARG;
    const int n = r->n, p = r->p, m = r->m;
    if (n < 1 || p < 1 || (p & (p - 1)) || m < 1 || !(m & 1) || m > MPQ_ROTATION_MAX_ODD || (int64_t)p * m != n)
        return MPQ_ERR_FORMAT;
    if ((n % 8) && (r->sign[n / 8] >> (n % 8))) return MPQ_ERR_FORMAT;
    for (int a = 0; a < m * m; a++)
        if (!mpq__finite(r->R[a])) return MPQ_ERR_FORMAT;
    for (int a = 0; a < m; a++)
        for (int b = a; b < m; b++) {
            double d = 0;
            for (int c = 0; c < m; c++) d += (double)r->R[(size_t)c * m + a] * (double)r->R[(size_t)c * m + b];
            if (fabs(d - (a == b ? 1.0 : 0.0)) > 1e-5) return MPQ_ERR_FORMAT;
        }
    return MPQ_OK;
}

/* In-place Walsh-Hadamard over the p rows of X (p x m, row-major): X <- H_p
   X. The rows a stage pairs lie in two runs of h m floats. */
static void mpq__fwht_rows(float *X, int p, int m)
{
    for (int h = 1; h < p; h *= 2) {
        const size_t run = (size_t)h * (size_t)m;
        for (int i = 0; i < p; i += 2 * h) {
            float *u = X + (size_t)i * m, *w = u + run;
            for (size_t l = 0; l < run; l++) {
                const float x = u[l], y = w[l];
                u[l] = x + y, w[l] = x - y;
            }
        }
    }
}

/* x <- s (.) x, the signs as bits. */
static void mpq__rot_signs(const uint8_t *sign, float *x, int n)
{
    for (int j = 0; j < n; j++) x[j] = ((sign[j / 8] >> (j % 8)) & 1u) ? -x[j] : x[j];
}

/* x <- V x (transpose: V^T x), one vector of r->n floats; tmp holds m
   floats. The arithmetic of mpq_rotation_apply (and of every product). */
static void mpq__rot_run(const mpq_rotation *r, float *X, float *tmp, int transpose)
{
    const int n = r->n, p = r->p, m = r->m;
    if (!transpose) mpq__rot_signs(r->sign, X, n);
    if (m > 1)
        for (int i = 0; i < p; i++) { /* each row of X times R^T (transpose: times R) */
            float *row = X + (size_t)i * m;
            for (int a = 0; a < m; a++) {
                float acc = 0;
                for (int b = 0; b < m; b++)
                    acc += (transpose ? r->R[(size_t)b * m + a] : r->R[(size_t)a * m + b]) * row[b];
                tmp[a] = acc;
            }
            memcpy(row, tmp, sizeof(float) * (size_t)m);
        }
    else if (r->R[0] != 1.0f) /* R_1 = -1 (a stored one may be any orthogonal 1 x 1, to rounding) */
        for (int j = 0; j < n; j++) X[j] *= r->R[0];
    mpq__fwht_rows(X, p, m); /* H_p is symmetric: the same both ways */
    const float scale = (float)(1.0 / sqrt((double)p));
    if (scale != 1.0f)
        for (int j = 0; j < n; j++) X[j] *= scale;
    if (transpose) mpq__rot_signs(r->sign, X, n);
}

MPQ_DEF mpq_status mpq_rotation_apply(const mpq_rotation *r, float *x, int count, int transpose)
{
    if (!r || !r->sign || !r->R || r->n < 1 || (count > 0 && !x) || count < 0) return MPQ_ERR_ARG;
    mpq_status st = mpq__check_finite(x, (size_t)r->n * (size_t)count);
    if (st != MPQ_OK) return st;
    float *tmp = (float *)MPQ_MALLOC(sizeof(float) * (size_t)r->m);
    if (!tmp) return MPQ_ERR_NOMEM;
    for (int v = 0; v < count; v++) mpq__rot_run(r, x + (size_t)v * (size_t)r->n, tmp, transpose);
    MPQ_FREE(tmp);
    return MPQ_OK;
}

/* Each row of the n x n matrix A <- V row, in float64. */
static mpq_status mpq__rot_rows_f64(const mpq_rotation *r, float *A, double *row)
{
    const int n = r->n;
    for (int i = 0; i < n; i++) {
        float *a = A + (size_t)i * (size_t)n;
        for (int j = 0; j < n; j++) row[j] = (double)a[j];
        const mpq_status st = mpq_rotation_apply_f64(r, row, 1, 0);
        if (st != MPQ_OK) return st;
        for (int j = 0; j < n; j++) a[j] = (float)row[j];
    }
    return MPQ_OK;
}

MPQ_DEF mpq_status mpq_rotation_conjugate(const mpq_rotation *r, float *H)
{
    if (!r || !r->sign || !r->R || r->n < 1 || !H) return MPQ_ERR_ARG;
    const size_t n = (size_t)r->n;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++)
            if (!mpq__finite(H[i * n + j])) return MPQ_ERR_NONFINITE;
    double *row = (double *)MPQ_MALLOC(sizeof(double) * n);
    if (!row) return MPQ_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) /* H, both triangles */
        for (size_t j = i + 1; j < n; j++) H[i * n + j] = H[j * n + i];
    mpq_status st = mpq__rot_rows_f64(r, H, row);  /* H V^T; finite stays finite short of overflow */
    for (size_t i = 0; i < n && st == MPQ_OK; i++) /* (H V^T)^T = V H */
        for (size_t j = i + 1; j < n; j++) {
            const float t = H[i * n + j];
            H[i * n + j] = H[j * n + i], H[j * n + i] = t;
        }
    if (st == MPQ_OK) st = mpq__rot_rows_f64(r, H, row); /* V H V^T */
    MPQ_FREE(row);
    return st;
}

MPQ_DEF mpq_status mpq_rotation_apply_f64(const mpq_rotation *r, double *x, int count, int transpose)
{
    if (!r || !r->sign || !r->R || r->n < 1 || (count > 0 && !x) || count < 0) return MPQ_ERR_ARG;
    const int n = r->n, p = r->p, m = r->m;
    for (size_t k = 0; k < (size_t)n * (size_t)count; k++)
        if (!isfinite(x[k])) return MPQ_ERR_NONFINITE;
    double *tmp = (double *)MPQ_MALLOC(sizeof(double) * (size_t)m);
    if (!tmp) return MPQ_ERR_NOMEM;
    for (int v = 0; v < count; v++) {
        double *X = x + (size_t)v * (size_t)n;
        for (int j = 0; j < n && !transpose; j++)
            if ((r->sign[j / 8] >> (j % 8)) & 1u) X[j] = -X[j];
        for (int i = 0; i < p; i++) {
            double *row = X + (size_t)i * m;
            for (int a = 0; a < m; a++) {
                double acc = 0;
                for (int b = 0; b < m; b++)
                    acc += (double)(transpose ? r->R[(size_t)b * m + a] : r->R[(size_t)a * m + b]) * row[b];
                tmp[a] = acc;
            }
            memcpy(row, tmp, sizeof(double) * (size_t)m);
        }
        for (int h = 1; h < p; h *= 2)
            for (int i = 0; i < p; i += 2 * h)
                for (size_t l = 0; l < (size_t)h * (size_t)m; l++) {
                    double *u = X + (size_t)i * m + l, *w = u + (size_t)h * m;
                    const double a = *u, b = *w;
                    *u = a + b, *w = a - b;
                }
        for (int j = 0; j < n; j++) X[j] /= sqrt((double)p);
        for (int j = 0; j < n && transpose; j++)
            if ((r->sign[j / 8] >> (j % 8)) & 1u) X[j] = -X[j];
    }
    MPQ_FREE(tmp);
    return MPQ_OK;
}

#ifdef __cplusplus
}
#endif
#ifdef MPQ__POP_DIAGNOSTIC
#pragma GCC diagnostic pop
#endif
#endif /* MPQ_IMPLEMENTATION */

/*
   VERSION HISTORY
     0.1.0  bit-plane packed matrices (mixed widths 1..8 per block, row and
            column permutations, column scales, a sparse part) and MXINT with
            2..8-bit mantissas in the same layout; group quantization and fp16;
            MixLLM's group-wise int8 activations, which every product path
            takes (mpq_gemv_opts.a8); the LUT GEMV for any batch on scalar, AVX2,
            AVX-512, AVX-512 VNNI, AVX2 int16 and NEON paths, chosen at run time
            (mpq_gemv_path says which); threads that yield to busy cores; AWQ
            and GPTQ (act-order, static groups); selection, salience statistics
            (Fisher, diag(X^T X), MixLLM, PQI, MXSens) and the SFMP, MixLLM,
            MXSens and ReQuant planners, with the lowest budgets SFMP and
            MXSens can meet; PMPD precision schedules (static, phase-aware and
            the learned scheduler with its training); recipes, the one
            description and call by which every program quantizes a model;
            seeded incoherence rotations of any size, stored with a packed
            matrix (format version 2) and applied by every product,
            with rounding, AWQ and GPTQ on the rotated weights;
            the CPU backend of the dispatch table (mpq_cuda.h adds the GPU one).

   LICENSE (MIT)
   Copyright (c) 2026 the mpq authors.
   Permission is hereby granted, free of charge, to any person obtaining a copy
   of this software and associated documentation files (the "Software"), to
   deal in the Software without restriction, including without limitation the
   rights to use, copy, modify, merge, publish, distribute, sublicense, and/or
   sell copies of the Software, and to permit persons to whom the Software is
   furnished to do so, subject to the following conditions: The above copyright
   notice and this permission notice shall be included in all copies or
   substantial portions of the Software. THE SOFTWARE IS PROVIDED "AS IS",
   WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED
   TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
   NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE
   FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT,
   TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR
   THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
