/* tools/cli.h - what the commands of the mpq tool share: exit codes, error
   messages, and options declared once, as tables, from which both the
   parsing and `--help` come.

   A command describes itself with a cli_spec: its usage line, a paragraph
   saying what it does, and up to four option tables (cli_opt rows), each
   parsed into a struct of its own (the command's, or a shared one such as
   the model options, cli_model_opts). A row names the option, its kind,
   where its value goes (offsetof), its range or choices, its default (as
   it would be typed) and its help; cli_parse sets every default first,
   then parses argv, and prints the help for -h and --help. */
#ifndef MPQ_CLI_H
#define MPQ_CLI_H

#include "mpq.h"
#include "progress.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EXIT_USAGE = 1, EXIT_INPUT = 2, EXIT_OUTPUT = 3, EXIT_QUANT = 4 };

/* "mpq: <message>" on stderr; returns code. */
static inline int fail(int code, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static inline int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("mpq: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

/* The exit code for a status from the library (not from a file). */
static inline int quant_fail(const char *name, mpq_status st, const char *what)
{
    return fail(EXIT_QUANT, "tensor '%s': %s: %s", name, what, mpq_status_str(st));
}

static inline double cli_now(void) { return progress_now(); }

/* ---------------------------------------------------------------------------
   options as tables
   ------------------------------------------------------------------------ */

typedef enum cli_kind {
    CLI_FLAG,   /* int, 1 when given */
    CLI_INT,    /* int in [lo, hi] */
    CLI_DOUBLE, /* double in [lo, hi] */
    CLI_STR,    /* const char * (the argument itself) */
    CLI_CHOICE, /* int: the index of the value among `choices`, "a|b|c" */
    CLI_LIST,   /* cli_list: every value given, in order (the option repeats) */
    CLI_PARSE   /* parse(value, field) returns nonzero when the value is good;
                   `choices` says what a good value is, for the message */
} cli_kind;

#define CLI_LIST_MAX 64
typedef struct cli_list {
    int n;
    const char *v[CLI_LIST_MAX];
} cli_list;

typedef struct cli_opt {
    const char *names; /* "--bits", or spellings "-n|--tokens" (the last is the one shown first) */
    cli_kind kind;
    size_t off;          /* offsetof the field in the set's struct */
    const char *arg;     /* the value's placeholder in the help ("B"); NULL for flags */
    double lo, hi;       /* CLI_INT, CLI_DOUBLE */
    const char *choices; /* CLI_CHOICE: "a|b|c"; CLI_PARSE: what the value must be */
    int (*parse)(const char *v, void *field);
    const char *def;  /* the default as it would be typed, shown in the help; NULL: none (0, NULL) */
    const char *help; /* lines separated by '\n' */
} cli_opt;

typedef struct cli_set {
    const cli_opt *opts; /* ends with a row whose names is NULL */
    size_t base;         /* offsetof its struct in the command's */
} cli_set;

typedef struct cli_spec {
    const char *cmd;   /* "eval" */
    const char *usage; /* after "mpq eval ": "[options] MODEL TEXT" */
    const char *about; /* what the command does (printed as it is) */
    cli_set sets[4];   /* the first {NULL} ends the list */
    int min_pos, max_pos;
    const char *tail; /* printed after the options (exit codes, examples), or NULL */
} cli_spec;

/* Which options a parse saw (by row), for "only with --x" checks. */
typedef struct cli_seen {
    const cli_opt *opt[CLI_LIST_MAX];
    int n;
} cli_seen;

/* Whether option `name` (one of a row's spellings) was given. */
int cli_was_given(const cli_seen *s, const char *name);
/* The k-th of the choices "a|b|c", into buf. */
const char *cli_nth(const char *choices, int k, char *buf, size_t cap);
/* Prints the help: usage, about, the options of every set, the tail. */
void cli_help(const cli_spec *s);
/* Parses argv (argv[0] is the command) into the command's struct of `size`
   bytes (set k at offset s->sets[k].base), zeroed, then every default set; positional
   arguments go to pos (at most s->max_pos, at least s->min_pos). Returns
   0, -1 after printing the help (for -h and --help), or EXIT_USAGE after
   a message. seen (may be NULL): the options given. */
int cli_parse(const cli_spec *s, int argc, char **argv, void *cmd_struct, size_t size, const char **pos, int *npos,
              cli_seen *seen);

/* Shorthands for the rows: the field of struct T. */
#define CLI_AT(T, field) offsetof(T, field)

/* ---------------------------------------------------------------------------
   what several commands take
   ------------------------------------------------------------------------ */

/* Where and how a model runs (every model command). */
typedef struct llm_opts {
    int threads, quiet;
    int device; /* cpu, cuda, cuda-fp16 */
    int a8;     /* packed maps multiply 8-bit activations */
    int path;   /* --cpu-path: an mpq_path (the choices are in enum order) */
    int skip;   /* --skip-planes, for the commands that take cli_skip_opts */
    int floats; /* --in-memory: float weights read into memory as float32, not used in place */
} llm_opts;

enum { DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_FP16 };
static const char *const cli_device_names[] = {"cpu", "cuda", "cuda-fp16"};

static const cli_opt cli_model_opts[] = {
    {"--threads", CLI_INT, CLI_AT(llm_opts, threads), "T", 1, 4096, NULL, NULL, NULL, "CPU threads (default all)"},
    {"--device", CLI_CHOICE, CLI_AT(llm_opts, device), "D", 0, 0, "cpu|cuda|cuda-fp16", NULL, "cpu",
     "cpu | cuda: where the packed matrices are multiplied;\n"
     "cuda-fp16: on the GPU as float16 weights through cuBLAS (the baseline)"},
    {"--quiet", CLI_FLAG, CLI_AT(llm_opts, quiet), NULL, 0, 0, NULL, NULL, NULL, "no progress"},
    {"--a8", CLI_FLAG, CLI_AT(llm_opts, a8), NULL, 0, 0, NULL, NULL, NULL,
     "packed linear maps multiply activations quantized to int8 per group\n(MixLLM's W*A8; CPU and cuda)"},
    {"--cpu-path", CLI_CHOICE, CLI_AT(llm_opts, path), "P", 0, 0, "auto|scalar|avx2|avx512|avx512-vnni|avx2-int|neon",
     NULL, "auto", "the CPU kernels of the packed products (auto: the fastest this CPU has)"},
    {"--in-memory", CLI_FLAG, CLI_AT(llm_opts, floats), NULL, 0, 0, NULL, NULL, NULL,
     "read float weights into memory as float32 (default: used in place from the\n"
     "mapped file in their stored type, converted as products need them: the same results)"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};

/* Nested precision: the products read fewer planes. */
static const cli_opt cli_skip_opts[] = {
    {"--skip-planes", CLI_INT, CLI_AT(llm_opts, skip), "K", 0, 7, NULL, NULL, NULL,
     "drop the K lowest bit planes of every packed linear map (at least one stays)"},
    {NULL, CLI_FLAG, 0, NULL, 0, 0, NULL, NULL, NULL, NULL},
};

#endif
