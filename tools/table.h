/* tools/table.h - the per-tensor summary table that quantize, inspect and
   dequantize print (rows collected in a stb_ds array), and the copy of a
   tensor they carry over unchanged. */
#ifndef MPQ_TABLE_H
#define MPQ_TABLE_H

#include "cli.h"
#include "mpq.h"
#include "mpq_io.h"

#include <stb/stb_ds.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct row {
    const char *name;
    char shape[48], kind[80];
    double bpw; /* -1 for tensors kept as they are */
    uint64_t bytes_in, bytes_out, weights;
} row;

static inline void shape_text(int ndim, const uint64_t *shape, char *s, size_t cap)
{
    s[0] = 0;
    for (int k = 0; k < ndim; k++) {
        size_t n = strlen(s);
        snprintf(s + n, cap - n, "%s%llu", k ? "x" : "", (unsigned long long)shape[k]);
    }
    if (!ndim) snprintf(s, cap, "scalar");
}

/* The widths of a packed matrix and the share of weights at each:
   "3:75% 4:25%", or "4" when all have one. */
static inline void widths_text(const mpq_packed *A, char *s, size_t cap)
{
    double w[MPQ_MAX_BITS + 1] = {0}, total = 0;
    const int nbr = (A->rows + A->block_rows - 1) / A->block_rows;
    for (int b = 0; b < nbr; b++)
        for (int g = 0; g < A->ngroups; g++) {
            const int r = A->rows - b * A->block_rows < A->block_rows ? A->rows - b * A->block_rows : A->block_rows;
            const int c = A->cols - g * A->group < A->group ? A->cols - g * A->group : A->group;
            w[A->bits[(size_t)b * A->ngroups + g]] += (double)r * c;
            total += (double)r * c;
        }
    s[0] = 0;
    for (int k = 1; k <= MPQ_MAX_BITS; k++)
        if (w[k] > 0) {
            size_t n = strlen(s);
            if (w[k] == total)
                snprintf(s + n, cap - n, "%s%d", n ? " " : "", k);
            else
                snprintf(s + n, cap - n, "%s%d:%.0f%%", n ? " " : "", k, 100.0 * w[k] / total);
        }
}

/* A row's description of a packed matrix: format, widths, sparse part,
   then `suffix`; its bpw, bytes and weights. */
static inline void row_packed(row *r, const mpq_packed *A, const char *suffix)
{
    char wt[32];
    widths_text(A, wt, sizeof wt);
    snprintf(r->kind, sizeof r->kind, "%s %s%s%s", mpq_format_get((mpq_format)A->format)->name, wt,
             A->sp_row_ptr ? " +sparse" : "", suffix);
    r->bpw = mpq_packed_bpw(A, 2), r->bytes_out = A->bytes, r->weights = (uint64_t)A->rows * (uint64_t)A->cols;
}

/* The summary table; `quantized` adds the bytes before quantization. */
static inline void print_rows(const row *rows, int quantized)
{
    if (quantized)
        printf("%-40s %-13s %-24s %8s %12s %12s\n", "tensor", "shape", "stored as", "bpw", "bytes in", "bytes out");
    else
        printf("%-40s %-13s %-24s %8s %12s\n", "tensor", "shape", "stored as", "bpw", "bytes");
    uint64_t in = 0, out = 0, wq = 0;
    double bits = 0;
    for (ptrdiff_t i = 0; i < arrlen(rows); i++) {
        const row *r = &rows[i];
        char bpw[16];
        if (r->bpw >= 0)
            snprintf(bpw, sizeof bpw, "%.3f", r->bpw);
        else
            snprintf(bpw, sizeof bpw, "-");
        printf("%-40.40s %-13s %-24.24s %8s", r->name, r->shape, r->kind, bpw);
        if (quantized) printf(" %12llu", (unsigned long long)r->bytes_in);
        printf(" %12llu\n", (unsigned long long)r->bytes_out);
        in += r->bytes_in, out += r->bytes_out;
        if (r->bpw >= 0) wq += r->weights, bits += r->bpw * (double)r->weights;
    }
    printf("%ld tensors, %llu packed weights at %.3f bits per weight (scales and sparse parts included); ",
           (long)arrlen(rows), (unsigned long long)wq, wq ? bits / (double)wq : 0.0);
    if (quantized)
        printf("%llu -> %llu bytes (%.2fx)\n", (unsigned long long)in, (unsigned long long)out,
               out ? (double)in / (double)out : 0.0);
    else
        printf("%llu bytes of tensors\n", (unsigned long long)out);
}

/* Copies tensor t of f into w as it is (its bytes); its row in r. 0, or
   the exit code after a message naming the file and the tensor. */
static inline int copy_st_tensor(mpq_st_file *f, const mpq_st_tensor *t, mpq_st_writer *w, row *r)
{
    mpq_io_err e;
    const size_t bytes = (size_t)(t->end - t->begin);
    void *buf = malloc(bytes + 1);
    int rc = 0;
    if (!buf)
        rc = fail(EXIT_INPUT, "%s: tensor '%s': out of memory", mpq_st_path(f), t->name);
    else if (mpq_st_read(f, t, buf, bytes, &e) != MPQ_OK)
        rc = fail(EXIT_INPUT, "%s", e.msg);
    else if (mpq_st_write(w, t->name, t->dtype, t->ndim, t->shape, buf, bytes, &e) != MPQ_OK)
        rc = fail(EXIT_OUTPUT, "%s", e.msg);
    free(buf);
    shape_text(t->ndim, t->shape, r->shape, sizeof r->shape);
    snprintf(r->kind, sizeof r->kind, "%s (kept)", mpq_dtype_name(t->dtype));
    r->bytes_out = bytes;
    return rc;
}

#endif
