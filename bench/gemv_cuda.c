/* bench_gemv_cuda: the CUDA GEMV (the LUT kernel; the tensor-core kernel for
   batches 3 to 16) on the shapes and widths of LLM layers, against the copy
   bandwidth and cuBLAS fp16 measured in the same run.

   usage: bench_gemv_cuda [--quick] [--reorder] [--prefill | --sweep | --batches N1,N2,...] [--floors] [--a8] [--fp8]
                          [--rotation] [--graph] [--shape MxN] [--bits B] [--batch N] [--reps R]

   --shape, --bits and --batch keep one shape, width or batch (any batch
   from 1; for a profiler or a crossover); --quick keeps the first shape and
   the first two widths; --reorder packs with random row and column
   permutations and column scales (as SFMP's reordering and AWQ leave a
   matrix); --prefill times batches 16 (the tensor-core kernel), 64, 256
   and 1024 (the path that dequantizes to fp16 and calls cuBLAS) at 3.25
   bits unless --bits says otherwise; --sweep times batches 1, 2, 4, 8, 16,
   32, 64, 256, 1024 and 4096 at 3.25 bits on 8192x8192, 28672x8192 and
   8192x28672 unless --shape, --bits or --batches say otherwise, and --batches
   N1,N2,... any list; with batch 1 first, every line also gives its time
   over batch 1's (same width, same run); --floors adds, under every
   batch-1 line, the dependent floors of bench/read_floor.cu: what a launch
   that reads as many bytes costs when it also waits for the launch before
   it, and when it also ends with the LUT kernel's sum of column parts, or
   float atomics instead of it; --a8 also times every product with 8-bit
   activations (mpq_gemv_opts.a8) and gives its time, its speedup over
   cuBLAS fp16 and over the same product with float activations;
   --fp8 (on by --sweep) also times cuBLASLt's FP8 product (e4m3 weights
   and activations, bf16 out; "-" where the GPU has none) and gives mpq's
   speedup over it; --rotation also packs every matrix with an incoherence rotation of its
   input size and times the two in turn, five rounds each, and prints the
   rotated product's median and the median of the per-round ratios;
   --graph times every run of 20 products (mpq's, cuBLAS's and FP8's alike)
   as the replay of a CUDA graph captured from them, which leaves the
   host's launches out of the times.

   For every shape, weight width b (2, 2.5, 3, 3.25, 4, 4.25 bits; fractional
   widths mix floor(b) and ceil(b) over random 16 x 128 blocks, plus 0.25 bpw
   of fp16 scales and zeros at group 128) and batch (1, 4, 8): the median
   time of one product, timed with CUDA events on the backend's stream over
   runs of 20 products that rotate over enough uploaded copies of the matrix
   that the 50 MB L2 cannot hold them; the packed bytes per second; that as
   a share of the device-to-device copy bandwidth (bytes read + written)
   measured first; the time of a kernel that only reads as many bytes,
   launched the same way (bench/read_floor.cu), and that as a share of the
   product's time: what is left between the two is the product's own fixed
   cost (waiting for the launch before it, tables, sums); and cuBLAS fp16
   (cublasGemmEx, fp16 weights and inputs, fp32 accumulation and output) on
   the same shape and batch, timed the same way, and the speedup over it. */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_cuda.h"
#include "synth.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double floor_seconds(size_t bytes, int rows, int cols, int mode, int reps); /* bench/read_floor.cu */

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                                \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static inline uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float frand(void) { return (float)((double)(rnd() >> 11) * (1.0 / 9007199254740992.0)) - 0.5f; }

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(double), cmpd);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Device-to-device copy of 1 GiB: (read + written bytes) / time. */
static double copy_bandwidth(void)
{
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[9];
    for (int k = 0; k < 11; k++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (k >= 2) t[k - 2] = ms * 1e-3;
    }
    cudaFree(a), cudaFree(b);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 2.0 * (double)bytes / median(t, 9);
}

/* Median seconds per call of fn over runs of `per` calls on `stream`; with
   --graph (use_graph) the `per` calls are captured once into a CUDA graph
   and each run replays it, so that the host's launches are out of the time,
   as in an engine that captures its decoding step. */
typedef void (*call_fn)(void *u, int k);
static int use_graph;
static double time_calls(cudaStream_t stream, call_fn fn, void *u, int reps, int per)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int k = 0; k < 3; k++) fn(u, k); /* warm-up */
    cudaGraphExec_t g = NULL;
    if (use_graph) {
        cudaGraph_t cg;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < per; k++) fn(u, k);
        CK(cudaStreamEndCapture(stream, &cg));
        CK(cudaGraphInstantiate(&g, cg, 0));
        CK(cudaGraphDestroy(cg));
        CK(cudaGraphLaunch(g, stream)); /* its first replay uploads it */
    }
    double *t = malloc(sizeof(double) * reps);
    int call = 0;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, stream));
        if (g)
            CK(cudaGraphLaunch(g, stream));
        else
            for (int k = 0; k < per; k++) fn(u, call++);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[r] = ms * 1e-3 / per;
    }
    double m = median(t, reps);
    free(t);
    if (g) CK(cudaGraphExecDestroy(g));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return m;
}

typedef struct mpq_calls {
    mpq_backend *be;
    void **h;
    int copies, batch;
    const float *x;
    float *y;
    const mpq_gemv_opts *opts;
} mpq_calls;

static void call_mpq(void *u, int k)
{
    mpq_calls *c = (mpq_calls *)u;
    mpq_status st = c->be->gemv(c->be->ctx, c->h[k % c->copies], c->x, c->y, c->batch, c->opts);
    if (st != MPQ_OK) {
        fprintf(stderr, "gemv: %s\n", mpq_status_str(st));
        exit(1);
    }
}

typedef struct blas_calls {
    cublasHandle_t h;
    uint16_t **W;
    int copies, m, n, batch;
    const uint16_t *x;
    float *y;
} blas_calls;

static void call_blas(void *u, int k)
{
    blas_calls *c = (blas_calls *)u;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s =
        cublasGemmEx(c->h, CUBLAS_OP_T, CUBLAS_OP_N, c->m, c->batch, c->n, &one, c->W[k % c->copies], CUDA_R_16F, c->n,
                     c->x, CUDA_R_16F, c->n, &zero, c->y, CUDA_R_32F, c->m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublas: %d\n", (int)s);
        exit(1);
    }
}

/* cuBLASLt FP8: D (bf16, m x batch) = W (e4m3, m x n) X (e4m3, n x batch),
   fp32 accumulation, unit scales, as an engine with FP8 weights and
   activations multiplies (torch._scaled_mm calls the same); column-major
   views as in call_blas. */
typedef struct fp8_calls {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    uint8_t **W;
    int copies;
    const uint8_t *x;
    void *y, *ws;
    size_t ws_bytes;
    cudaStream_t stream;
} fp8_calls;

static void call_fp8(void *u, int k)
{
    fp8_calls *f = (fp8_calls *)u;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasLtMatmul(f->lt, f->op, &one, f->W[k % f->copies], f->la, f->x, f->lb, &zero, f->y, f->ld,
                                      f->y, f->ld, &f->algo, f->ws, f->ws_bytes, f->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasLt fp8: %d\n", (int)s);
        exit(1);
    }
}

/* The FP8 product's descriptors for one batch; 0 when cuBLASLt has no
   algorithm for it (a GPU before sm_89), then nothing is left to free. */
static int fp8_setup(fp8_calls *f, int m, int n, int batch)
{
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    f->op = NULL, f->la = f->lb = f->ld = NULL;
    if (cublasLtMatmulDescCreate(&f->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(f->op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(f->op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&f->la, CUDA_R_8F_E4M3, (uint64_t)n, (uint64_t)m, n) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&f->lb, CUDA_R_8F_E4M3, (uint64_t)n, (uint64_t)batch, n) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&f->ld, CUDA_R_16BF, (uint64_t)m, (uint64_t)batch, m) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &f->ws_bytes,
                                             sizeof f->ws_bytes) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoGetHeuristic(f->lt, f->op, f->la, f->lb, f->ld, f->ld, pref, 1, &res, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0)
        f->algo = res.algo;
    else
        found = 0;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!found) {
        if (f->op) cublasLtMatmulDescDestroy(f->op);
        if (f->la) cublasLtMatrixLayoutDestroy(f->la);
        if (f->lb) cublasLtMatrixLayoutDestroy(f->lb);
        if (f->ld) cublasLtMatrixLayoutDestroy(f->ld);
    }
    return found > 0;
}

static void fp8_free(fp8_calls *f)
{
    cublasLtMatmulDescDestroy(f->op);
    cublasLtMatrixLayoutDestroy(f->la), cublasLtMatrixLayoutDestroy(f->lb), cublasLtMatrixLayoutDestroy(f->ld);
}

int main(int argc, char **argv)
{
    int quick = 0, reorder = 0, prefill = 0, floors = 0, a8 = 0, reps = 15, only_batch = 0, sweep = 0, shape_given = 0;
    int rotation = 0, fp8 = 0;
    double only_bits = 0;
    int shapes[6][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {8192, 8192}, {28672, 8192}, {8192, 28672}};
    int nshapes = 6;
    int list[16], nlist = 0; /* --batches, --sweep */
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--quick"))
            quick = 1;
        else if (!strcmp(argv[a], "--reorder"))
            reorder = 1;
        else if (!strcmp(argv[a], "--prefill"))
            prefill = 1;
        else if (!strcmp(argv[a], "--rotation"))
            rotation = 1;
        else if (!strcmp(argv[a], "--a8"))
            a8 = 1;
        else if (!strcmp(argv[a], "--fp8"))
            fp8 = 1;
        else if (!strcmp(argv[a], "--floors"))
            floors = 1;
        else if (!strcmp(argv[a], "--graph"))
            use_graph = 1;
        else if (!strcmp(argv[a], "--sweep"))
            sweep = 1;
        else if (!strcmp(argv[a], "--batches") && a + 1 < argc) {
            const char *q = argv[++a];
            nlist = 0;
            while (*q) {
                char *end;
                long v = strtol(q, &end, 10);
                if (end == q || v < 1 || v > 8192 || nlist == 16 || (*end && *end != ',')) {
                    fprintf(stderr, "--batches: a list of up to 16 batches of 1 to 8192, such as 1,2,4,8\n");
                    return 2;
                }
                list[nlist++] = (int)v;
                q = *end ? end + 1 : end;
            }
        } else if (!strcmp(argv[a], "--shape") && a + 1 < argc &&
                   sscanf(argv[a + 1], "%dx%d", &shapes[0][0], &shapes[0][1]) == 2)
            nshapes = 1, shape_given = 1, a++;
        else if (!strcmp(argv[a], "--reps") && a + 1 < argc && atoi(argv[a + 1]) >= 1)
            reps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--bits") && a + 1 < argc)
            only_bits = atof(argv[++a]);
        else if (!strcmp(argv[a], "--batch") && a + 1 < argc && atoi(argv[a + 1]) >= 1)
            only_batch = atoi(argv[++a]);
        else {
            fprintf(
                stderr,
                "usage: %s [--quick] [--reorder] [--prefill | --sweep | --batches N1,N2,...] [--floors] [--a8] [--fp8] "
                "[--shape MxN]"
                " [--bits B] [--batch N] [--reps R] [--rotation] [--graph]\n",
                argv[0]);
            return 2;
        }
    }
    if (sweep) {
        fp8 = 1;
        const int sw[10] = {1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096};
        if (nlist == 0)
            for (nlist = 0; nlist < 10; nlist++) list[nlist] = sw[nlist];
        if (!shape_given) {
            const int big[3][2] = {{8192, 8192}, {28672, 8192}, {8192, 28672}};
            memcpy(shapes, big, sizeof big);
            nshapes = 3;
        }
        if (only_bits == 0) only_bits = 3.25;
    }
    if (mpq_cuda_device_count() == 0) {
        printf("no CUDA device: nothing to measure\n");
        return 0;
    }
    mpq_backend be;
    if (mpq_cuda_backend(0, &be) != MPQ_OK) return 1;
    cudaStream_t stream = (cudaStream_t)mpq_cuda_stream(&be);
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const double bw = copy_bandwidth();
    printf("%s, %d SMs, L2 %d MB; copy bandwidth (read + write) %.0f GB/s%s\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, bw / 1e9, reorder ? "; permuted rows and columns, column scales" : "");
    printf("%-12s %5s %5s %5s %9s %9s %6s %8s %6s %10s %8s %6s%s%s\n", "shape", "bits", "+meta", "batch", "mpq us",
           "GB/s", "%copy", "read us", "%read", "cuBLAS us", "speedup", "x b1",
           a8 ? "    a8 us a8 speedup a8/float" : "", fp8 ? "    fp8 us  vs fp8" : "");
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;
    cudaStream_t bstream;
    CK(cudaStreamCreate(&bstream));
    cublasSetStream(blas, bstream);
    const double widths[6] = {2.0, 2.5, 3.0, 3.25, 4.0, 4.25};
    const int decode[3] = {1, 4, 8}, fill[4] = {16, 64, 256, 1024};
    const int *batches = only_batch ? &only_batch : nlist ? list : prefill ? fill : decode;
    const int nb = only_batch ? 1 : nlist ? nlist : prefill ? 4 : 3;
    int maxb = 1;
    for (int bi = 0; bi < nb; bi++) maxb = batches[bi] > maxb ? batches[bi] : maxb;
    if (prefill && only_bits == 0) only_bits = 3.25;
    const int nwidths = quick ? 2 : 6;
    for (int s = 0; s < (quick ? 1 : nshapes); s++) {
        const int m = shapes[s][0], n = shapes[s][1];
        const size_t mn = (size_t)m * n;
        float *W = malloc(sizeof(float) * mn);
        for (size_t k = 0; k < mn; k++) W[k] = 0.05f * frand();
        /* cuBLAS fp16: copies rotating past the L2 */
        const size_t b16 = mn * sizeof(uint16_t);
        const int c16 = (int)(200e6 / (double)b16) + 2;
        uint16_t **W16 = malloc(sizeof(uint16_t *) * c16), *X16;
        uint16_t *h16 = malloc(b16);
        for (size_t k = 0; k < mn; k++) h16[k] = mpq_f32_to_f16(W[k]);
        for (int c = 0; c < c16; c++) {
            CK(cudaMalloc((void **)&W16[c], b16));
            CK(cudaMemcpy(W16[c], h16, b16, cudaMemcpyHostToDevice));
        }
        free(h16);
        float *x, *y;
        CK(cudaMalloc((void **)&x, sizeof(float) * maxb * n));
        CK(cudaMalloc((void **)&y, sizeof(float) * maxb * m));
        CK(cudaMalloc((void **)&X16, sizeof(uint16_t) * maxb * n));
        {
            float *hx = malloc(sizeof(float) * maxb * n);
            uint16_t *hx16 = malloc(sizeof(uint16_t) * maxb * n);
            for (int k = 0; k < maxb * n; k++) hx[k] = frand(), hx16[k] = mpq_f32_to_f16(hx[k]);
            CK(cudaMemcpy(x, hx, sizeof(float) * maxb * n, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(X16, hx16, sizeof(uint16_t) * maxb * n, cudaMemcpyHostToDevice));
            free(hx), free(hx16);
        }
        double tb[16], tf[16];
        for (int bi = 0; bi < nb; bi++) {
            blas_calls bc = {blas, W16, c16, m, n, batches[bi], X16, y};
            tb[bi] = time_calls(bstream, call_blas, &bc, reps, 20);
            tf[bi] = 0.0;
        }
        if (fp8) { /* e4m3 copies of random bytes (no NaN patterns), rotating past the L2 */
            fp8_calls f = {0};
            f.copies = (int)(200e6 / (double)mn) + 2, f.stream = bstream, f.ws_bytes = (size_t)32 << 20;
            f.W = malloc(sizeof(uint8_t *) * f.copies);
            uint8_t *h8 = malloc(mn > (size_t)maxb * n ? mn : (size_t)maxb * n);
            for (size_t k = 0; k < mn || k < (size_t)maxb * n; k++) h8[k] = (uint8_t)(rnd() & 0xF7);
            for (int c = 0; c < f.copies; c++) {
                CK(cudaMalloc((void **)&f.W[c], mn));
                CK(cudaMemcpy(f.W[c], h8, mn, cudaMemcpyHostToDevice));
            }
            uint8_t *x8;
            CK(cudaMalloc((void **)&x8, (size_t)maxb * n));
            CK(cudaMemcpy(x8, h8, (size_t)maxb * n, cudaMemcpyHostToDevice));
            CK(cudaMalloc(&f.ws, f.ws_bytes));
            CK(cudaMalloc(&f.y, sizeof(uint16_t) * maxb * m));
            f.x = x8;
            if (cublasLtCreate(&f.lt) == CUBLAS_STATUS_SUCCESS) {
                for (int bi = 0; bi < nb; bi++)
                    if (fp8_setup(&f, m, n, batches[bi])) {
                        tf[bi] = time_calls(bstream, call_fp8, &f, reps, 20);
                        fp8_free(&f);
                    }
                cublasLtDestroy(f.lt);
            }
            for (int c = 0; c < f.copies; c++) cudaFree(f.W[c]);
            cudaFree(x8), cudaFree(f.ws), cudaFree(f.y);
            free(f.W), free(h8);
        }
        for (int wi = 0; wi < nwidths; wi++) {
            const double b = widths[wi];
            if (only_bits > 0 && fabs(b - only_bits) > 1e-9) continue;
            const int lo = (int)floor(b), nbr = (m + 15) / 16, ngr = (n + 127) / 128;
            uint8_t *bits = malloc((size_t)nbr * ngr);
            const size_t nblk = (size_t)nbr * ngr, nhi = (size_t)llround((b - lo) * (double)nblk);
            for (size_t k = 0; k < nblk; k++) bits[k] = (uint8_t)lo;
            for (size_t k = 0; k < nhi;) { /* random blocks at ceil(b) */
                size_t j = rnd() % nblk;
                if (bits[j] == lo) bits[j] = (uint8_t)(lo + 1), k++;
            }
            mpq_bitplane_desc d = {0};
            d.rows = m, d.cols = n, d.group = 128, d.block_rows = 16, d.bits = bits;
            uint32_t *prow = NULL, *pcol = NULL;
            float *cscale = NULL;
            if (reorder) { /* scales in [0.5, 2) */
                synth_rng pr = {rnd()};
                prow = malloc(sizeof(uint32_t) * m), pcol = malloc(sizeof(uint32_t) * n),
                cscale = malloc(sizeof(float) * n);
                if (!prow || !pcol || !cscale) return 1;
                synth_perm(&pr, prow, m);
                synth_perm(&pr, pcol, n);
                for (int k = 0; k < n; k++) cscale[k] = exp2f(2.0f * frand());
                d.p_row = prow, d.p_col = pcol, d.col_scale = cscale;
            }
            mpq_packed A;
            if (mpq_pack_alloc(&d, W, &A) != MPQ_OK) return 1;
            free(prow), free(pcol), free(cscale);
            const double tr = floor_seconds(A.bytes, m, n, 0, reps);
            if (tr < 0) {
                fprintf(stderr, "read floor: the device refused\n");
                return 1;
            }
            const int copies = (int)(200e6 / (double)A.bytes) + 2;
            void **h = malloc(sizeof(void *) * copies), **hr = NULL;
            for (int c = 0; c < copies; c++)
                if (be.upload(be.ctx, &A, &h[c]) != MPQ_OK) return 1;
            mpq_rotation rot = {0};
            mpq_packed Ar = {0};
            if (rotation) { /* the same widths with V of size n */
                d.rotation = &rot;
                hr = malloc(sizeof(void *) * copies);
                if (mpq_rotation_init(&rot, n, 1) != MPQ_OK || mpq_pack_alloc(&d, W, &Ar) != MPQ_OK) return 1;
                for (int c = 0; c < copies; c++)
                    if (be.upload(be.ctx, &Ar, &hr[c]) != MPQ_OK) return 1;
            }
            double t1 = 0.0; /* batch 1's time, when it comes first */
            for (int bi = 0; bi < nb; bi++) {
                mpq_calls mc = {&be, h, copies, batches[bi], x, y, NULL};
                const double t = time_calls(stream, call_mpq, &mc, reps, 20);
                double t8 = 0.0;
                if (a8) {
                    mpq_gemv_opts o8 = {0};
                    o8.a8 = 1, mc.opts = &o8;
                    t8 = time_calls(stream, call_mpq, &mc, reps, 20);
                }
                if (bi == 0 && batches[0] == 1) t1 = t;
                char rel[16] = "-";
                if (t1 > 0.0) snprintf(rel, sizeof rel, "%.2fx", t / t1);
                const double gbs = (double)A.bytes / t;
                char sh[32];
                snprintf(sh, sizeof sh, "%dx%d", m, n);
                printf("%-12s %5.2f %5.2f %5d %9.2f %9.0f %5.0f%% %8.2f %5.0f%% %10.2f %7.2fx %6s", sh,
                       mpq_packed_bpw(&A, 0), mpq_packed_bpw(&A, 1), batches[bi], t * 1e6, gbs / 1e9, 100.0 * gbs / bw,
                       tr * 1e6, 100.0 * tr / t, tb[bi] * 1e6, tb[bi] / t, rel);
                if (a8) printf(" %9.2f %9.2fx %7.2fx", t8 * 1e6, tb[bi] / t8, t / t8);
                if (fp8 && tf[bi] > 0.0)
                    printf(" %9.2f %6.2fx", tf[bi] * 1e6, tf[bi] / t);
                else if (fp8)
                    printf(" %9s %7s", "-", "-");
                printf("\n");
                if (rotation) { /* plain and rotated in turn */
                    mpq_calls mr = {&be, hr, copies, batches[bi], x, y, NULL};
                    mc.opts = NULL; /* float activations, both */
                    double tp[5], tq[5], ratio[5];
                    for (int k = 0; k < 5; k++) {
                        tp[k] = time_calls(stream, call_mpq, &mc, reps, 20);
                        tq[k] = time_calls(stream, call_mpq, &mr, reps, 20);
                        ratio[k] = tq[k] / tp[k];
                    }
                    const double q = median(tq, 5), rr = median(ratio, 5);
                    printf("%-12s   rotated (V %dx%d): %.2f us (plain %.2f us), rotated / plain %.3fx\n", "", rot.p,
                           rot.m, q * 1e6, median(tp, 5) * 1e6, rr);
                }
                if (floors && batches[bi] == 1) {
                    double f[4];
                    for (int k = 0; k < 4; k++)
                        if ((f[k] = floor_seconds(A.bytes, m, n, k + 1, reps)) < 0) return 1;
                    printf(
                        "%-12s   floors: wait first %.2f us, first loads before the wait %.2f us, and the parts' sum "
                        "%.2f us (%.0f%% of the product's time); atomics instead %.2f us\n",
                        "", f[0] * 1e6, f[1] * 1e6, f[2] * 1e6, 100.0 * f[2] / t, f[3] * 1e6);
                }
                fflush(stdout);
            }
            for (int c = 0; c < copies; c++) be.release(be.ctx, h[c]);
            for (int c = 0; rotation && c < copies; c++) be.release(be.ctx, hr[c]);
            mpq_packed_free(&Ar), mpq_rotation_free(&rot);
            free(h), free(hr), free(bits);
            mpq_packed_free(&A);
        }
        for (int c = 0; c < c16; c++) cudaFree(W16[c]);
        free(W16);
        cudaFree(x), cudaFree(y), cudaFree(X16);
        free(W);
    }
    cublasDestroy(blas);
    cudaStreamDestroy(bstream);
    mpq_cuda_backend_destroy(&be);
    return 0;
}
