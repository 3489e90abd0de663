/* mpq_io.h - model files in and out for mpq: safetensors (read and write),
   GGUF (read), and a model's tensors whatever file or directory holds them.

   The companion of mpq.h for programs that read and write model files (the
   `mpq` tool, the examples). mpq.h itself does no file I/O and stays usable
   alone; this part needs cJSON (Debian libcjson-dev) and a POSIX system, and
   is compiled from mpq_io.c (safetensors), mpq_io_gguf.c (GGUF) and
   mpq_io_source.c (model sources), which include the implementation of
   nothing else: link them with one translation unit that defines
   MPQ_IMPLEMENTATION.

   CONTENTS: SAFETENSORS (reader, packed matrices, errors, writer), GGUF,
   MODEL SOURCES. Each section's declarations follow its description.

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
                                rotation, band_index, data and (with a sparse part)
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
     place (after mpq_st_writer_reserve, the spool itself becomes the file,
     with no copy). A crash or an error at any point never leaves a half-written
     file under the final name; mpq_st_writer_abort discards everything. The
     header is padded with spaces so that the data starts at a multiple of
     64 bytes (the format allows any padding; its reference writer pads to
     8): a packed matrix after tensors whose sizes are multiples of 64 then
     lies on a 64-byte boundary and can be used in place
     (mpq_st_map_packed). */
#ifndef MPQ_IO_H_INCLUDED
#define MPQ_IO_H_INCLUDED

#include "mpq.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MPQ_ST_MAX_HEADER (100u << 20) /* largest JSON header accepted (as the reference) */
#define MPQ_ST_MAX_DIMS   8

/* The dtypes of safetensors. Every one is understood for sizes and offsets;
   mpq_st_read_f32 converts F32, F16, BF16 and F64. */
typedef enum mpq_dtype {
    MPQ_DT_BOOL,
    MPQ_DT_U8,
    MPQ_DT_I8,
    MPQ_DT_F8_E5M2,
    MPQ_DT_F8_E4M3,
    MPQ_DT_I16,
    MPQ_DT_U16,
    MPQ_DT_F16,
    MPQ_DT_BF16,
    MPQ_DT_I32,
    MPQ_DT_U32,
    MPQ_DT_F32,
    MPQ_DT_F64,
    MPQ_DT_I64,
    MPQ_DT_U64,
    MPQ_DT_COUNT
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
    uint64_t numel;      /* product of shape (1 for a scalar) */
    uint64_t begin, end; /* data_offsets, relative to the data */
    int packed;          /* 0, or MPQ_FORMAT_BITPLANE / MPQ_FORMAT_MXINT when
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
/* A tensor's bytes in place: the file is mapped read-only, whole, on the
   first call (a file opened from memory: the buffer), and the pointer stays
   valid until mpq_st_close. Not aligned beyond what the file's offsets
   give. A mapped file that shrinks under the reader makes reads of the
   lost pages fault (SIGBUS): callers that keep using a mapping check the
   file first. */
mpq_status mpq_st_map(mpq_st_file *f, const mpq_st_tensor *t, const void **data, mpq_io_err *err);
/* Asks the system to start reading a tensor's bytes into its page cache
   and returns at once (posix_fadvise WILLNEED), so that a read or a mapped
   access a little later finds them there: a reader that works on one
   tensor while the disk brings the next. Only a hint; a file opened from
   memory or a tensor of another file is ignored. */
void mpq_st_prefetch(mpq_st_file *f, const mpq_st_tensor *t);
/* MPQ_ERR_IO naming the file when its size or modification time is not
   what it was when it was opened. */
mpq_status mpq_st_check(const mpq_st_file *f, mpq_io_err *err);
/* A packed matrix stored under `name` (see PACKED MATRICES): read into a
   64-byte aligned buffer, validated, metadata checked; free with
   mpq_packed_free. */
mpq_status mpq_st_read_packed(mpq_st_file *f, const char *name, mpq_packed *out, mpq_io_err *err);
/* The same, used in place where it can be: when the matrix's bytes lie on a
   64-byte boundary of the file (the writer starts the data on one, and
   matrices with groups of 64 or 128 and no sparse part take multiples of
   64 bytes, as do most float tensors of a model), *out is a view into the file's
   read-only mapping (mpq_st_map; owned 0, valid until mpq_st_close), so
   that its pages are the page cache's, not the process's; otherwise it is
   read as mpq_st_read_packed reads it. Validated and checked the same way
   either way. */
mpq_status mpq_st_map_packed(mpq_st_file *f, const char *name, mpq_packed *out, mpq_io_err *err);

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
/* Room for the header before the data, asked before the first tensor
   (header_bytes: for the tensors' entries and the metadata still to come;
   the writer adds what the metadata given so far takes): when
   the header then fits (padded with spaces, as the format allows) and the
   system gives nameless files (Linux O_TMPFILE), close writes it there and
   links the spool into place instead of copying every byte, which halves
   the disk space and the writes of a large file. Otherwise nothing
   changes. */
mpq_status mpq_st_writer_reserve(mpq_st_writer *w, uint64_t header_bytes, mpq_io_err *err);
/* Write the file (temporary name, sync, rename) and free the writer, which
   is gone whatever the result. */
mpq_status mpq_st_writer_close(mpq_st_writer *w, mpq_io_err *err);
/* Free the writer and remove what it wrote. NULL is accepted. */
void mpq_st_writer_abort(mpq_st_writer *w);

/* bf16 <-> float: the upper half of the float, rounding to nearest even
   (NaN stays NaN, made quiet). */
uint16_t mpq_f32_to_bf16(float f);
float mpq_bf16_to_f32(uint16_t h);


/* ========================================================================== */
/* GGUF                                                                       */
/* ========================================================================== */

/* GGUF, as read here (versions 2 and 3, little-endian; the format of
   llama.cpp's model files):

     "GGUF", u32 version, u64 tensor count, u64 key-value count;
     key-value pairs: string key, u32 value type, value (an array is u32
       element type, u64 count, elements; a string is u64 length, bytes);
     tensor infos: string name, u32 dimension count, u64 dimensions (the
       first varies fastest), u32 ggml type, u64 offset into the data;
     padding to the alignment (general.alignment, u32, a power of two;
       32 when absent), then the data section, to the end of the file.

   The reader holds the key-value pairs and tensor infos in memory (at most
   MPQ_GGUF_MAX_META bytes of them) and reads tensors one at a time. Before
   anything is used it checks: the magic and version; that every count,
   length and dimension fits the bytes that remain, so that no allocation is
   larger than the file; keys that are non-empty UTF-8 without NUL and
   unique; value and element types it knows (an array of arrays is
   refused); booleans that are 0 or 1; general.alignment's type and value;
   tensor names that are non-empty UTF-8 without NUL, unique; 1 to 4
   dimensions, each below 2^63; a known ggml type whose block divides the
   first dimension; element and byte counts without overflow; offsets that
   are multiples of the alignment; and that every tensor lies inside the
   file's data section without overlapping another (gaps, the alignment's
   padding, are allowed). Errors are MPQ_ERR_FORMAT with a message naming
   the file, and the tensor or key where there is one.

   mpq_gguf_read_f32 converts F32, F16, BF16, F64, Q8_0, Q4_0, Q4_1, Q5_0
   and Q5_1 (each value exactly as its block defines it: Q4_0 is
   d (q - 8), Q4_1 d q + m, Q8_0 d q, with d and m from fp16); the other
   ggml types (the K-quants, IQ types, ...) are recognised, sized and
   checked, and can be read as raw bytes only. */

#define MPQ_GGUF_MAX_META (256u << 20) /* largest metadata + tensor-info region accepted */
#define MPQ_GGUF_MAX_DIMS 4

/* Value types of the key-value pairs (the numbers are the file's). */
typedef enum mpq_gguf_vtype {
    MPQ_GGUF_U8 = 0,
    MPQ_GGUF_I8 = 1,
    MPQ_GGUF_U16 = 2,
    MPQ_GGUF_I16 = 3,
    MPQ_GGUF_U32 = 4,
    MPQ_GGUF_I32 = 5,
    MPQ_GGUF_F32 = 6,
    MPQ_GGUF_BOOL = 7,
    MPQ_GGUF_STRING = 8,
    MPQ_GGUF_ARRAY = 9,
    MPQ_GGUF_U64 = 10,
    MPQ_GGUF_I64 = 11,
    MPQ_GGUF_F64 = 12
} mpq_gguf_vtype;

/* ggml tensor types mpq converts to float (the numbers are ggml's). */
enum {
    MPQ_GGML_F32 = 0,
    MPQ_GGML_F16 = 1,
    MPQ_GGML_Q4_0 = 2,
    MPQ_GGML_Q4_1 = 3,
    MPQ_GGML_Q5_0 = 6,
    MPQ_GGML_Q5_1 = 7,
    MPQ_GGML_Q8_0 = 8,
    MPQ_GGML_Q2_K = 10, /* the k-quants: super-blocks of 256 (ggml's block layouts) */
    MPQ_GGML_Q3_K = 11,
    MPQ_GGML_Q4_K = 12,
    MPQ_GGML_Q5_K = 13,
    MPQ_GGML_Q6_K = 14,
    MPQ_GGML_IQ4_NL = 20, /* 4-bit codes into a fixed non-uniform table, blocks of 32 */
    MPQ_GGML_IQ4_XS = 23, /* the same in super-blocks of 256 with 6-bit sub-block scales */
    MPQ_GGML_F64 = 28,
    MPQ_GGML_BF16 = 30
};

typedef struct mpq_gguf_tensor {
    const char *name;
    uint32_t type;                  /* ggml type */
    int ndim;                       /* 1 .. MPQ_GGUF_MAX_DIMS */
    uint64_t ne[MPQ_GGUF_MAX_DIMS]; /* as stored: ne[0] varies fastest, so a
                           matrix is ne[1] rows of ne[0] columns; unused 1 */
    uint64_t numel;
    uint64_t offset; /* from the start of the data section */
    uint64_t bytes;
} mpq_gguf_tensor;

typedef struct mpq_gguf_kv {
    const char *key;
    mpq_gguf_vtype type;
    mpq_gguf_vtype elem; /* arrays: the element type */
    uint64_t count;      /* arrays: elements; other values: 1 */
} mpq_gguf_kv;

typedef struct mpq_gguf_file mpq_gguf_file;

/* Open and check a file (everything listed above); tensors are read later. */
mpq_status mpq_gguf_open(const char *path, mpq_gguf_file **out, mpq_io_err *err);
/* The same over bytes in memory (kept by the caller until mpq_gguf_close). */
mpq_status mpq_gguf_open_memory(const void *buf, size_t bytes, mpq_gguf_file **out, mpq_io_err *err);
void mpq_gguf_close(mpq_gguf_file *f); /* NULL is accepted */
const char *mpq_gguf_path(const mpq_gguf_file *f);
uint32_t mpq_gguf_version(const mpq_gguf_file *f);

/* The name of a ggml type ("Q4_1"), NULL for a number that is none; and
   whether mpq_gguf_read_f32 converts it. */
const char *mpq_gguf_type_name(uint32_t type);
int mpq_gguf_type_is_float(uint32_t type);

/* Tensors in file order, and by name (NULL when absent). */
int mpq_gguf_count(const mpq_gguf_file *f);
const mpq_gguf_tensor *mpq_gguf_at(const mpq_gguf_file *f, int i);
const mpq_gguf_tensor *mpq_gguf_find(const mpq_gguf_file *f, const char *name);
/* The raw bytes of a tensor; bytes must equal t->bytes. */
mpq_status mpq_gguf_read(mpq_gguf_file *f, const mpq_gguf_tensor *t, void *dst, size_t bytes, mpq_io_err *err);
/* Its values as float (n = numel), for the types listed above: MPQ_ERR_ARG
   names the type otherwise. Every check comes before the first byte is
   read; only MPQ_ERR_IO can leave dst partly written. */
mpq_status mpq_gguf_read_f32(mpq_gguf_file *f, const mpq_gguf_tensor *t, float *dst, size_t n, mpq_io_err *err);
/* The conversion of mpq_gguf_read_f32 on bytes already in memory: n values
   of a type it converts, stored at src, to float (n a multiple of the
   type's block; MPQ_ERR_ARG otherwise). No check of the values. */
mpq_status mpq_gguf_decode(uint32_t type, const void *src, uint64_t n, float *dst);
/* The bytes n values of a type take; 0 for an unknown type or an n that is
   not a multiple of its block. */
uint64_t mpq_gguf_type_bytes(uint32_t type, uint64_t n);
/* A tensor's bytes in place, and whether the file changed: as mpq_st_map
   and mpq_st_check. */
mpq_status mpq_gguf_map(mpq_gguf_file *f, const mpq_gguf_tensor *t, const void **data, mpq_io_err *err);
mpq_status mpq_gguf_check(const mpq_gguf_file *f, mpq_io_err *err);
/* As mpq_st_prefetch. */
void mpq_gguf_prefetch(mpq_gguf_file *f, const mpq_gguf_tensor *t);

/* Key-value pairs in file order, and by key (NULL when absent). */
int mpq_gguf_kv_count(const mpq_gguf_file *f);
const mpq_gguf_kv *mpq_gguf_kv_at(const mpq_gguf_file *f, int i);
const mpq_gguf_kv *mpq_gguf_kv_find(const mpq_gguf_file *f, const char *key);
/* Value i of a pair (0 for a scalar, an element of an array): integers of
   any width and booleans as int64 (a U64 above INT64_MAX is MPQ_ERR_RANGE),
   F32 and F64 as double, strings as bytes with a length (not
   NUL-terminated; valid until mpq_gguf_close). Another type, or i out of
   range, is MPQ_ERR_ARG. kv must be one of f's. */
mpq_status mpq_gguf_get_int(const mpq_gguf_file *f, const mpq_gguf_kv *kv, uint64_t i, int64_t *out);
mpq_status mpq_gguf_get_float(const mpq_gguf_file *f, const mpq_gguf_kv *kv, uint64_t i, double *out);
mpq_status mpq_gguf_get_str(const mpq_gguf_file *f, const mpq_gguf_kv *kv, uint64_t i, const char **s, size_t *len);


/* ========================================================================== */
/* MODEL SOURCES                                                              */
/* ========================================================================== */

/* A model's tensors, whatever holds them: a GGUF file, a safetensors file (a
   checkpoint, or a file `mpq quantize` wrote), or a Hugging Face checkpoint
   directory (config.json; model.safetensors, or the shards that
   model.safetensors.index.json lists; tokenizer.json). One list of tensors
   with shapes in row-major order (a matrix is rows x cols: GGUF's
   dimensions reversed), each readable as floats or as a packed matrix, and
   the text of the files that describe the model.

   A path that is a directory is read as a Hugging Face checkpoint; a file
   starting with "GGUF" as GGUF; any other file as safetensors. In a
   directory the index is used when present: its weight_map must be a JSON
   object of tensor name -> shard file, shard files plain names inside the
   directory (no '/', not "." or ".."), every listed tensor present in its
   shard; a tensor found in two shards is an error. Index and description
   files are read up to MPQ_SOURCE_MAX_TEXT bytes. Errors name the file and
   the tensor, as everywhere in mpq_io. */

#define MPQ_SOURCE_MAX_TEXT (64u << 20)

typedef enum mpq_source_kind { MPQ_SOURCE_GGUF = 1, MPQ_SOURCE_SAFETENSORS = 2, MPQ_SOURCE_HF_DIR = 3 } mpq_source_kind;

typedef struct mpq_source_tensor {
    const char *name;
    int ndim;
    uint64_t shape[MPQ_ST_MAX_DIMS]; /* row-major: the last dimension varies fastest */
    uint64_t numel;
    const char *type; /* as stored: "BF16", "Q4_1", "mpq bitplane", ... */
    uint64_t bytes;   /* as stored */
    int is_float;     /* readable with mpq_source_read_f32 */
    int packed;       /* MPQ_FORMAT_BITPLANE / MPQ_FORMAT_MXINT for a packed matrix, else 0 */
} mpq_source_tensor;

typedef struct mpq_source mpq_source;

mpq_status mpq_source_open(const char *path, mpq_source **out, mpq_io_err *err);
void mpq_source_close(mpq_source *s); /* NULL is accepted */
mpq_source_kind mpq_source_kind_of(const mpq_source *s);
const char *mpq_source_path(const mpq_source *s);

/* Tensors (GGUF: file order; safetensors: header order, shard after shard),
   and by name (NULL when absent). */
int mpq_source_count(const mpq_source *s);
const mpq_source_tensor *mpq_source_at(const mpq_source *s, int i);
const mpq_source_tensor *mpq_source_find(const mpq_source *s, const char *name);
/* Values as float (n = numel); MPQ_ERR_ARG for a type that is not. */
mpq_status mpq_source_read_f32(mpq_source *s, const mpq_source_tensor *t, float *dst, size_t n, mpq_io_err *err);
/* A packed matrix (t->packed), as mpq_st_read_packed. */
mpq_status mpq_source_read_packed(mpq_source *s, const mpq_source_tensor *t, mpq_packed *out, mpq_io_err *err);
/* ... and as mpq_st_map_packed (valid until mpq_source_close). */
mpq_status mpq_source_map_packed(mpq_source *s, const mpq_source_tensor *t, mpq_packed *out, mpq_io_err *err);
/* IN PLACE. The stored bytes of a tensor that converts to float (is_float),
   in its file's read-only mapping (mpq_st_map, mpq_gguf_map), and their
   type as a ggml type number for mpq_gguf_decode (safetensors F32, F16,
   BF16 and F64 are MPQ_GGML_F32, _F16, _BF16 and _F64); valid until
   mpq_source_close. mpq_source_check: MPQ_ERR_IO naming the first file
   whose size or modification time changed since the source was opened. */
mpq_status mpq_source_map(mpq_source *s, const mpq_source_tensor *t, const void **data, uint32_t *type,
                          mpq_io_err *err);
mpq_status mpq_source_check(const mpq_source *s, mpq_io_err *err);
/* As mpq_st_prefetch, in whichever file holds t. */
void mpq_source_prefetch(mpq_source *s, const mpq_source_tensor *t);

/* The files underneath, for what is format-specific: the GGUF file (NULL
   for other sources), and the safetensors file holding t (with its entry
   there in *st; NULL for GGUF). */
mpq_gguf_file *mpq_source_gguf(const mpq_source *s);
mpq_st_file *mpq_source_st(const mpq_source *s, const mpq_source_tensor *t, const mpq_st_tensor **st);

/* The text of a description file `name` ("config.json", "tokenizer.json",
   "tokenizer_config.json", "generation_config.json"): a safetensors file's
   __metadata__ entry of that name (how mpq's own files carry them), else
   the file of that name in the checkpoint directory (for a safetensors
   file: the directory it is in). *text is NUL-terminated, malloc'ed (free
   it), and NULL with MPQ_OK when there is no such text (always for GGUF,
   which describes the model in its own metadata). */
mpq_status mpq_source_text(const mpq_source *s, const char *name, char **text, size_t *len, mpq_io_err *err);

#ifdef __cplusplus
}
#endif

#endif /* MPQ_IO_H_INCLUDED */
