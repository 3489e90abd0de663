/* Test helpers: an independent reader of the packed bit-plane layout, written
   from the BYTE LAYOUT comment in mpq.h (not from the library's code), a
   float64 reference GEMV on top of it, and random problem generators. */
#ifndef MPQ_TEST_COMMON_H
#define MPQ_TEST_COMMON_H

#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "synth.h"

#ifdef MPQ_TEST_SHIM
#include "criterion_shim.h"
#else
#include <criterion/criterion.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t tc_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
    return v;
}
static inline uint32_t tc_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint16_t tc_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* binary16 -> double by the definition (sign, exponent, fraction). */
static inline double tc_half(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, f = h & 1023;
    double v = e == 0 ? ldexp(f, -24) : (e == 31 ? (f ? NAN : INFINITY) : ldexp(1024 + f, e - 25));
    return s ? -v : v;
}

/* A decoded bit-plane matrix in packed coordinates. */
typedef struct tc_mat {
    int format, rows, cols, group, block_rows, ngroups;
    uint8_t *code;   /* rows x cols */
    uint8_t *width;  /* rows x ngroups */
    double *sh, *zh; /* rows x ngroups */
    uint32_t *prow, *pcol;
    float *cscale;
    size_t sp_nnz; /* sparse part (original coordinates), 0 when absent */
    int *sp_row, *sp_col;
    double *sp_val;
} tc_mat;

static inline int tc_slab_off(int c, int r, int nch)
{
    int q4 = nch / 4 * 4;
    if (c < q4) return (c / 4) * 64 + r * 4 + c % 4;
    int base = q4 * 16, k = c - q4;
    if (nch & 2) {
        if (k < 2) return base + r * 2 + k;
        base += 32;
    }
    return base + r;
}

/* Reads buf the way the layout comment describes it. */
static inline void tc_decode(const uint8_t *buf, tc_mat *M)
{
    int format = (int)tc_u32(buf + 12), meta = format == 2 ? 16 : 64; /* MXINT: one E8M0 byte per row */
    int rows = (int)tc_u32(buf + 16), cols = (int)tc_u32(buf + 20), group = (int)tc_u32(buf + 24);
    int br = (int)tc_u32(buf + 28), band = (int)tc_u32(buf + 36), flags = (int)tc_u32(buf + 40);
    int ng = (cols + group - 1) / group, ntiles = (rows + 15) / 16, nbands = (rows + band - 1) / band;
    uint64_t off_bits = tc_u64(buf + 56), off_prow = tc_u64(buf + 64), off_pcol = tc_u64(buf + 72);
    uint64_t off_cs = tc_u64(buf + 80), off_index = tc_u64(buf + 88), off_data = tc_u64(buf + 96);
    M->format = format, M->rows = rows, M->cols = cols, M->group = group, M->block_rows = br, M->ngroups = ng;
    M->code = calloc((size_t)rows * cols, 1);
    M->width = calloc((size_t)rows * ng, 1);
    M->sh = calloc((size_t)rows * ng, sizeof(double));
    M->zh = calloc((size_t)rows * ng, sizeof(double));
    M->prow = malloc(sizeof(uint32_t) * rows);
    M->pcol = malloc(sizeof(uint32_t) * cols);
    M->cscale = malloc(sizeof(float) * cols);
    for (int i = 0; i < rows; i++) M->prow[i] = (flags & 1) ? tc_u32(buf + off_prow + 4 * i) : (uint32_t)i;
    for (int j = 0; j < cols; j++) {
        M->pcol[j] = (flags & 2) ? tc_u32(buf + off_pcol + 4 * j) : (uint32_t)j;
        uint32_t u = (flags & 4) ? tc_u32(buf + off_cs + 4 * j) : 0x3F800000u;
        memcpy(&M->cscale[j], &u, 4);
    }
    for (int i = 0; i < rows; i++)
        for (int g = 0; g < ng; g++) M->width[i * ng + g] = buf[off_bits + (i / br) * ng + g];
    for (int b = 0; b < nbands; b++) {
        uint64_t pos = off_data + tc_u64(buf + off_index + 8 * b);
        int t0 = b * band / 16, t1 = t0 + band / 16 < ntiles ? t0 + band / 16 : ntiles;
        for (int g = 0; g < ng; g++) {
            int gw = cols - g * group < group ? cols - g * group : group, nch = (gw + 7) / 8;
            for (int t = t0; t < t1; t++) {
                int planes = 0;
                for (int r = 0; r < 16 && t * 16 + r < rows; r++)
                    if (M->width[(t * 16 + r) * ng + g] > planes) planes = M->width[(t * 16 + r) * ng + g];
                for (int r = 0; r < 16 && t * 16 + r < rows; r++) {
                    int i = t * 16 + r, w = M->width[i * ng + g];
                    if (format == 2) { /* s^ = 2^(X-k+1), z^ = -s^ */
                        M->sh[i * ng + g] = ldexp(1.0, (int)buf[pos + r] - 127 - w + 1);
                        M->zh[i * ng + g] = -M->sh[i * ng + g];
                    } else {
                        M->sh[i * ng + g] = tc_half(tc_u16(buf + pos + 2 * r));
                        M->zh[i * ng + g] = tc_half(tc_u16(buf + pos + 32 + 2 * r));
                    }
                    for (int j = 0; j < gw; j++) {
                        int q = 0;
                        for (int p = 0; p < w; p++)
                            q |=
                                ((buf[pos + meta + (uint64_t)p * nch * 16 + tc_slab_off(j / 8, r, nch)] >> (j % 8)) & 1)
                                << p;
                        M->code[(size_t)i * cols + g * group + j] = (uint8_t)q;
                    }
                }
                pos += (uint64_t)meta + (uint64_t)planes * nch * 16;
            }
        }
    }
    /* sparse part: header bytes 112 (offset) and 120 (entries) */
    M->sp_nnz = 0, M->sp_row = NULL, M->sp_col = NULL, M->sp_val = NULL;
    if (flags & 8) {
        uint64_t off = tc_u64(buf + 112), nnz = tc_u64(buf + 120);
        int cb = cols <= 65536 ? 2 : 4;
        const uint8_t *rp = buf + off, *cp = rp + 4 * ((uint64_t)rows + 1), *vp = cp + cb * nnz;
        M->sp_nnz = (size_t)nnz;
        M->sp_row = malloc(sizeof(int) * (nnz + 1));
        M->sp_col = malloc(sizeof(int) * (nnz + 1));
        M->sp_val = malloc(sizeof(double) * (nnz + 1));
        for (int i = 0; i < rows; i++)
            for (uint32_t k = tc_u32(rp + 4 * i); k < tc_u32(rp + 4 * (i + 1)); k++) {
                M->sp_row[k] = i;
                M->sp_col[k] = cb == 2 ? tc_u16(cp + 2 * k) : (int)tc_u32(cp + 4 * k);
                M->sp_val[k] = tc_half(tc_u16(vp + 2 * k));
            }
    }
}

static inline void tc_free(tc_mat *M)
{
    free(M->code), free(M->width), free(M->sh), free(M->zh), free(M->prow), free(M->pcol), free(M->cscale);
    free(M->sp_row), free(M->sp_col), free(M->sp_val);
}

/* w^ of packed weight (i, j) with `skip` planes dropped, by the mirror-form
   definition: s^ * sum_{p >= skip} 2^p (2 bit_p - 1) + z^. */
static inline double tc_weight(const tc_mat *M, int i, int j, int skip)
{
    int g = j / M->group, w = M->width[i * M->ngroups + g], q = M->code[(size_t)i * M->cols + j];
    int sk = skip < w - 1 ? skip : w - 1;
    double s = 0;
    for (int p = sk; p < w; p++) s += ldexp(1.0, p) * (((q >> p) & 1) ? 1.0 : -1.0);
    return M->sh[i * M->ngroups + g] * s + M->zh[i * M->ngroups + g];
}

/* Reference y = W x in float64 (original coordinates), and the magnitude
   bound A_i = sum over terms of |each term| used for float tolerances. */
static inline void tc_gemv(const tc_mat *M, const float *x, int batch, int skip, double *y, double *mag)
{
    for (int v = 0; v < batch; v++)
        for (int i = 0; i < M->rows; i++) {
            double s = 0, a = 0;
            for (int j = 0; j < M->cols; j++) {
                int g = j / M->group, w = M->width[i * M->ngroups + g];
                double xt = (double)x[(size_t)v * M->cols + M->pcol[j]] * M->cscale[j];
                s += tc_weight(M, i, j, skip) * xt;
                a += (fabs(M->sh[i * M->ngroups + g]) * (ldexp(1.0, w) - 1) + fabs(M->zh[i * M->ngroups + g])) *
                    fabs(xt);
            }
            y[(size_t)v * M->rows + M->prow[i]] = s;
            if (mag) mag[(size_t)v * M->rows + M->prow[i]] = a;
        }
    for (int v = 0; v < batch; v++) /* the sparse part, in original coordinates */
        for (size_t k = 0; k < M->sp_nnz; k++) {
            double t = M->sp_val[k] * (double)x[(size_t)v * M->cols + M->sp_col[k]];
            y[(size_t)v * M->rows + M->sp_row[k]] += t;
            if (mag) mag[(size_t)v * M->rows + M->sp_row[k]] += fabs(t);
        }
}

/* The int16 table scale 2^e of group g, by the documented rule: the smallest
   e with max over quads of (sum of 4 |x~|) / 2^e <= 32639. */
static inline double tc_q16_scale(const tc_mat *M, const float *x, int g)
{
    double mx = 0;
    for (int j0 = g * M->group; j0 < (g + 1) * M->group && j0 < M->cols; j0 += 4) {
        double s = 0;
        for (int j = j0; j < j0 + 4 && j < M->cols; j++) s += fabs((double)x[M->pcol[j]] * M->cscale[j]);
        mx = s > mx ? s : mx;
    }
    if (mx == 0) return 0;
    int e = -200;
    while (mx / ldexp(1.0, e) > 32639.0) e++;
    return ldexp(1.0, e);
}

/* Documented bound of the quantized-table path for row i (packed), summed
   over groups: |s^| * (sum of plane weights used) * quads * 2^e / 2. */
static inline double tc_q16_bound(const tc_mat *M, const float *x, int i, int skip)
{
    double b = 0;
    for (int g = 0; g < M->ngroups; g++) {
        int w = M->width[i * M->ngroups + g], sk = skip < w - 1 ? skip : w - 1;
        int gw = M->cols - g * M->group < M->group ? M->cols - g * M->group : M->group;
        double planes = ldexp(1.0, w) - ldexp(1.0, sk);
        b += fabs(M->sh[i * M->ngroups + g]) * planes * (2.0 * ((gw + 7) / 8)) * tc_q16_scale(M, x, g) / 2.0;
    }
    return b;
}

static const mpq_path tc_paths[] = {MPQ_PATH_SCALAR,      MPQ_PATH_AVX2,     MPQ_PATH_AVX512,
                                    MPQ_PATH_AVX512_VNNI, MPQ_PATH_AVX2_INT, MPQ_PATH_NEON};
#define TC_NPATHS (int)(sizeof tc_paths / sizeof tc_paths[0])

/* The paths with the quantized int16 tables (and their error bound). */
static inline int tc_int16_path(mpq_path p)
{
    return p == MPQ_PATH_AVX512_VNNI || p == MPQ_PATH_AVX2_INT || p == MPQ_PATH_NEON;
}

/* Compares y from `path` with the reference, row by row: float32 rounding
   bounded by gamma * (sum of term magnitudes), plus the documented bound of
   the quantized tables on that path. */
static inline void tc_check_gemv(const mpq_packed *A, const tc_mat *M, const float *x, int batch, int skip,
                                 mpq_path path, const float *y, const double *ref, const double *mag)
{
    const int cpg = A->group / 8;
    const double gamma = 2.0 * (2 * cpg + A->ngroups + 32) * ldexp(1.0, -24);
    for (int v = 0; v < batch; v++)
        for (int i = 0; i < A->rows; i++) { /* i: packed row */
            size_t o = (size_t)v * A->rows + M->prow[i];
            double tol = gamma * mag[o] + 1e-30;
            if (tc_int16_path(path)) tol += tc_q16_bound(M, x + (size_t)v * A->cols, i, skip) * (1 + 1e-6);
            cr_assert(isfinite(y[o]), "%s: y[%zu] not written", mpq_path_name(path), o);
            cr_assert_leq(fabs(y[o] - ref[o]), tol,
                          "%s %dx%d G%d br%d skip %d batch %d: row %d: %.9g vs %.9g (tol %.3g)", mpq_path_name(path),
                          A->rows, A->cols, A->group, A->block_rows, skip, batch, M->prow[i], (double)y[o], ref[o],
                          tol);
        }
}

static inline void tc_poison(float *y, size_t n)
{
    for (size_t k = 0; k < n; k++) y[k] = NAN;
}

/* mpq_gemv on every path this build has, y (batch x rows) poisoned first,
   each result checked against the reference ref/mag of tc_gemv. */
static inline void tc_gemv_every_path(const mpq_packed *A, const tc_mat *M, const float *x, int batch, int skip,
                                      float *y, const double *ref, const double *mag)
{
    for (int p = 0; p < TC_NPATHS; p++) {
        if (!mpq_path_available(tc_paths[p])) continue;
        mpq_gemv_opts o = {0};
        o.path = tc_paths[p], o.skip_planes = skip;
        tc_poison(y, (size_t)batch * A->rows);
        cr_assert_eq(mpq_gemv(A, x, y, batch, &o, NULL, 0), MPQ_OK);
        tc_check_gemv(A, M, x, batch, skip, tc_paths[p], y, ref, mag);
    }
}

static inline void *tc_alloc(size_t bytes) { return mpq_aligned_alloc(bytes ? bytes : 1); }

#endif
