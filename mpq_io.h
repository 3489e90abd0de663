/* mpq_io.h - safetensors files in and out for mpq.

   The companion of mpq.h for programs that read and write model files (the
   `mpq` tool, the examples). mpq.h itself does no file I/O and stays usable
   alone; this part needs cJSON (Debian libcjson-dev) and a POSIX system, and
   is compiled from mpq_io.c, which includes the implementation of nothing
   else: link it with one translation unit that defines MPQ_IMPLEMENTATION.

   SAFETENSORS, as read here

     u64 (little-endian) N, the header length; N bytes of UTF-8 JSON; data.
     The JSON is one object: "__metadata__" (optional) maps strings to
     strings; every other key is a tensor name mapping to
       {"dtype": "F16", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
     with offsets relative to the start of the data. The reader checks, in
     this order and before any tensor byte is read: N <= MPQ_ST_MAX_HEADER
     and N <= file size - 8; the header is valid UTF-8, starts with '{', has
     no NUL (raw or escaped) and parses as JSON to its end (trailing spaces
     allowed); no name appears twice; every dtype is known; every dimension
     and offset is an integer below 2^53; at most MPQ_ST_MAX_DIMS dimensions;
     element count times element size does not overflow and equals end -
     begin; sorted by offset, the tensors tile the data exactly (the first
     begins at 0, each begins where the previous ended, the last ends at the
     end of the file): no gaps, no overlaps, no trailing bytes. These are the
     rules of the reference implementation. Tensors are then read one at a
     time with positioned reads, so a file is never loaded whole.

   PACKED MATRICES IN SAFETENSORS (mpq file convention 1)

     A packed matrix (mpq.h section 4, either format, with every optional
     section) is stored as one tensor of dtype U8 and shape [bytes] holding
     its buffer exactly, so it round-trips bit for bit and any safetensors
     reader opens the file. __metadata__ describes it, all values strings:

       "mpq.version"            "1"
       "mpq.<name>.format"      "bitplane" | "mxint"   (marks <name> as packed)
       "mpq.<name>.shape"       "rows,cols"            (of W, original order)
       "mpq.<name>.group"       columns per group
       "mpq.<name>.block_rows"  rows per bit-width block
       "mpq.<name>.bits"        the widths used, ascending: "3,4"
       "mpq.<name>.bpw"         bits per weight with metadata and sparse part
                                (mpq_packed_bpw level 2), "%.6f"
       "mpq.<name>.sections"    where the parts of the buffer are, as
                                "part:offset:bytes" separated by spaces, for
                                parts bits, p_row, p_col, col_scale,
                                band_index, data and (with a sparse part)
                                sp_row_ptr, sp_col, sp_val; a reader in
                                another language can slice the U8 tensor
                                with these (p_row is little-endian u32, ...)

     Reading a packed tensor validates the buffer (mpq_packed_open) and then
     checks every one of these values against the buffer: a file whose
     metadata disagrees with its matrix is rejected. Other tensors (norms,
     embeddings) sit beside packed ones unchanged.

   ERRORS

     Every function returns mpq_status; functions that touch a file also
     fill an optional mpq_io_err with one line naming the file, the tensor
     and what is wrong. MPQ_ERR_IO: the system refused (open, read, write,
     rename); MPQ_ERR_FORMAT: the file is not valid safetensors or its
     packed metadata is wrong; MPQ_ERR_ARG: a tensor that is not there, or a
     dtype that cannot be converted; MPQ_ERR_SIZE: a caller's buffer does not
     match the tensor. On error nothing is written to the caller's outputs.

   WRITING

     mpq_st_writer_open names the final file; tensors are added in order
     (their bytes go to an unlinked spool file beside the target, so memory
     stays flat); mpq_st_writer_close writes the header and the data to a
     temporary name in the same directory, syncs it and renames it into
     place. A crash or an error at any point never leaves a half-written
     file under the final name; mpq_st_writer_abort discards everything. The
     header is padded with spaces to a multiple of 8 bytes, as the reference
     writer does. */
#ifndef MPQ_IO_H_INCLUDED
#define MPQ_IO_H_INCLUDED

#include "mpq.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MPQ_ST_MAX_HEADER (100u << 20) /* largest JSON header accepted (as the reference) */
#define MPQ_ST_MAX_DIMS 8

/* The dtypes of safetensors. Every one is understood for sizes and offsets;
   mpq_st_read_f32 converts F32, F16, BF16 and F64. */
typedef enum mpq_dtype {
    MPQ_DT_BOOL, MPQ_DT_U8, MPQ_DT_I8, MPQ_DT_F8_E5M2, MPQ_DT_F8_E4M3, MPQ_DT_I16, MPQ_DT_U16,
    MPQ_DT_F16, MPQ_DT_BF16, MPQ_DT_I32, MPQ_DT_U32, MPQ_DT_F32, MPQ_DT_F64, MPQ_DT_I64,
    MPQ_DT_U64, MPQ_DT_COUNT
} mpq_dtype;

/* "F16", ...; NULL for a value out of range. */
const char *mpq_dtype_name(mpq_dtype t);
/* Bytes per element; 0 for a value out of range. */
size_t mpq_dtype_size(mpq_dtype t);

/* One line describing the last error of a call: "<file>: tensor '<name>':
   <what>". Optional everywhere (pass NULL). */
typedef struct mpq_io_err {
    char msg[512];
} mpq_io_err;

/* A tensor as the header describes it. */
typedef struct mpq_st_tensor {
    const char *name;
    mpq_dtype dtype;
    int ndim;
    uint64_t shape[MPQ_ST_MAX_DIMS];
    uint64_t numel;         /* product of shape (1 for a scalar) */
    uint64_t begin, end;    /* data_offsets, relative to the data */
    int packed;             /* 0, or MPQ_FORMAT_BITPLANE / MPQ_FORMAT_MXINT when
                               the metadata marks it as a packed matrix */
} mpq_st_tensor;

typedef struct mpq_st_file mpq_st_file;

/* Open and check a file (everything listed under SAFETENSORS). Reads only
   the header; keeps the file open for mpq_st_read*. */
mpq_status mpq_st_open(const char *path, mpq_st_file **out, mpq_io_err *err);
/* The same over bytes in memory (kept by the caller until mpq_st_close). */
mpq_status mpq_st_open_memory(const void *buf, size_t bytes, mpq_st_file **out, mpq_io_err *err);
void mpq_st_close(mpq_st_file *f); /* NULL is accepted */

/* Tensors in header order. */
int mpq_st_count(const mpq_st_file *f);
const mpq_st_tensor *mpq_st_at(const mpq_st_file *f, int i);
/* By name; NULL when absent. */
const mpq_st_tensor *mpq_st_find(const mpq_st_file *f, const char *name);
/* __metadata__: entries in header order, and by key (NULL when absent). */
int mpq_st_meta_count(const mpq_st_file *f);
void mpq_st_meta_at(const mpq_st_file *f, int i, const char **key, const char **value);
const char *mpq_st_meta(const mpq_st_file *f, const char *key);
/* The size of the whole file (memory: the buffer), and the file's name. */
uint64_t mpq_st_file_bytes(const mpq_st_file *f);
const char *mpq_st_path(const mpq_st_file *f);

/* The raw bytes of a tensor (little-endian, as stored); bytes must equal
   end - begin. */
mpq_status mpq_st_read(mpq_st_file *f, const mpq_st_tensor *t, void *dst, size_t bytes, mpq_io_err *err);
/* The values of an F32, F16, BF16 or F64 tensor as float (n = numel),
   converted exactly where float can hold them (F64 rounds). F32 is read
   straight into dst, the others through a 1 MiB buffer. Every check comes
   before the first byte is read; only MPQ_ERR_IO (a file that shrank or
   failed under the reader) can leave dst partly written. */
mpq_status mpq_st_read_f32(mpq_st_file *f, const mpq_st_tensor *t, float *dst, size_t n, mpq_io_err *err);
/* A packed matrix stored under `name` (see PACKED MATRICES): read into a
   64-byte aligned buffer, validated, metadata checked; free with
   mpq_packed_free. */
mpq_status mpq_st_read_packed(mpq_st_file *f, const char *name, mpq_packed *out, mpq_io_err *err);

typedef struct mpq_st_writer mpq_st_writer;

mpq_status mpq_st_writer_open(const char *path, mpq_st_writer **out, mpq_io_err *err);
/* A tensor from raw little-endian bytes: bytes must equal numel * dtype size;
   shape may be NULL when ndim is 0. Names are unique, valid UTF-8, not
   "__metadata__". */
mpq_status mpq_st_write(mpq_st_writer *w, const char *name, mpq_dtype dtype, int ndim, const uint64_t *shape,
                        const void *data, size_t bytes, mpq_io_err *err);
/* A tensor from floats, stored as F32, F16 or BF16 (round to nearest even;
   values beyond the F16 range become Inf, as a cast does). */
mpq_status mpq_st_write_f32(mpq_st_writer *w, const char *name, mpq_dtype dtype, int ndim, const uint64_t *shape,
                            const float *x, mpq_io_err *err);
/* A packed matrix and its metadata (see PACKED MATRICES). */
mpq_status mpq_st_write_packed(mpq_st_writer *w, const char *name, const mpq_packed *A, mpq_io_err *err);
/* One __metadata__ entry; keys starting with "mpq." are the writer's own. */
mpq_status mpq_st_write_meta(mpq_st_writer *w, const char *key, const char *value, mpq_io_err *err);
/* Write the file (temporary name, sync, rename) and free the writer, which
   is gone whatever the result. */
mpq_status mpq_st_writer_close(mpq_st_writer *w, mpq_io_err *err);
/* Free the writer and remove what it wrote. NULL is accepted. */
void mpq_st_writer_abort(mpq_st_writer *w);

/* bf16 <-> float: the upper half of the float, rounding to nearest even
   (NaN stays NaN, made quiet). */
uint16_t mpq_f32_to_bf16(float f);
float mpq_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif /* MPQ_IO_H_INCLUDED */
