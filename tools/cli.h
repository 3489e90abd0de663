/* tools/cli.h - what the commands of the mpq tool share: exit codes, error
   messages, option parsing, and the progress line of util/progress.h.
   Included by tools/mpq_tool.c (quantize, inspect, bench, main) and
   tools/mpq_llm.c (eval, run, speed, calibrate, schedule). */
#ifndef MPQ_CLI_H
#define MPQ_CLI_H

#include "mpq.h"
#include "progress.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
   option parsing: --name value or --name=value
   ------------------------------------------------------------------------ */

typedef struct args {
    int argc, i;
    char **argv;
    const char *cmd;
} args;

/* Is argv[i] the option `name`? Sets *val for options that take a value. */
static inline int opt(args *a, const char *name, const char **val, int *bad)
{
    const char *s = a->argv[a->i];
    const size_t n = strlen(name);
    if (strncmp(s, name, n) != 0) return 0;
    if (!val) return s[n] == 0;
    if (s[n] == '=') {
        *val = s + n + 1;
        return 1;
    }
    if (s[n] != 0) return 0;
    if (a->i + 1 >= a->argc) {
        fail(EXIT_USAGE, "%s %s: needs a value", a->cmd, name);
        *bad = 1;
        return 1;
    }
    *val = a->argv[++a->i];
    return 1;
}

static inline int parse_int(const char *cmd, const char *name, const char *v, int lo, int hi, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi)
        return fail(EXIT_USAGE, "%s %s: '%s' is not an integer in %d..%d", cmd, name, v, lo, hi), 0;
    *out = (int)x;
    return 1;
}

static inline int parse_double(const char *cmd, const char *name, const char *v, double lo, double hi, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x >= lo && x <= hi))
        return fail(EXIT_USAGE, "%s %s: '%s' is not a number in %g..%g", cmd, name, v, lo, hi), 0;
    *out = x;
    return 1;
}

/* The commands of tools/mpq_llm.c. */
int cmd_eval(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_speed(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_schedule(int argc, char **argv);
int cmd_gen_eval(int argc, char **argv);

#endif
