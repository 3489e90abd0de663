/* mpq_priv.h - helpers shared by the files beside the header: the readers
   and the writer of mpq_io (mpq_io.c, mpq_io_gguf.c, mpq_io_source.c), the
   tokenizer and the model (mpq_tokenizer.c, mpq_model.c, mpq_calib.c).
   Implemented in mpq_io.c. Not part of the API: nothing outside those files
   includes it. */
#ifndef MPQ_PRIV_H_INCLUDED
#define MPQ_PRIV_H_INCLUDED

#include "mpq_io.h"

#include <stddef.h>
#include <stdint.h>

/* err->msg = "<origin>: <what>", origin a file or what failed ("(model)");
   returns st. err may be NULL. The one error message of those files. */
mpq_status mpq__fail(mpq_io_err *err, mpq_status st, const char *origin, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 4, 5)))
#endif /* MPQ_PRIV_H_INCLUDED */
    ;
/* The same naming a tensor: "<path>: tensor '<name>': <what>" (the tensor
   part when name is not NULL). */
mpq_status mpq__io_fail(mpq_io_err *err, mpq_status st, const char *path, const char *name, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 5, 6)))
#endif /* MPQ_PRIV_H_INCLUDED */
    ;

/* malloc'ed copy; NULL when out of memory. */
char *mpq__io_strdup(const char *s);

/* One UTF-8 sequence at s[i] (strict: no overlong forms, surrogates or
   code points past U+10FFFF) into *cp: its length, 0 when it is not valid. */
size_t mpq__utf8_next(const uint8_t *s, size_t n, size_t i, uint32_t *cp);
/* Strict UTF-8 and no NUL byte: the offset of the first bad byte, or n
   when all is well. */
size_t mpq__io_utf8_check(const uint8_t *s, size_t n);

/* What a reader reads from: a regular file through positioned reads, or a
   caller's bytes in memory. A file can also be mapped read-only, whole, on
   first demand (mpq__io_map); the mapping lives until the file is closed. */
typedef struct mpq__io_in {
    char *path; /* the file's name, or "(memory)" */
    int fd;     /* -1 for memory */
    const uint8_t *mem;
    uint64_t bytes;   /* size of the file or of the buffer */
    int64_t mtime_ns; /* the file's modification time when opened */
    void *map;        /* the mapping, or NULL */
} mpq__io_in;

mpq_status mpq__io_in_file(mpq__io_in *in, const char *path, mpq_io_err *err);
mpq_status mpq__io_in_memory(mpq__io_in *in, const void *buf, size_t bytes, mpq_io_err *err);
void mpq__io_in_close(mpq__io_in *in); /* idempotent */
/* n bytes at off; past the end is MPQ_ERR_FORMAT, a failing system MPQ_ERR_IO. */
mpq_status mpq__io_read(const mpq__io_in *in, uint64_t off, void *dst, size_t n, const char *name, mpq_io_err *err);
/* The whole file's bytes in place (bytes in memory: the buffer itself). */
mpq_status mpq__io_map(mpq__io_in *in, const uint8_t **base, mpq_io_err *err);
/* MPQ_ERR_IO when the file's size or modification time is no longer what it
   was when it was opened (bytes in memory: always MPQ_OK). */
mpq_status mpq__io_check(const mpq__io_in *in, mpq_io_err *err);
/* Asks the kernel to start reading bytes [off, off + n) of the file into
   its page cache and returns (posix_fadvise WILLNEED); nothing for bytes in
   memory or a range past the end. A hint: failures are ignored. */
void mpq__io_prefetch(const mpq__io_in *in, uint64_t off, uint64_t n);

#endif /* MPQ_PRIV_H_INCLUDED */
