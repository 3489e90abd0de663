/* tools/cli.h - what the commands of the mpq tool share: exit codes, error
   messages, option parsing, the progress line. Included by tools/mpq_tool.c
   (quantize, inspect, bench, main) and tools/mpq_llm.c (eval, run, speed, calibrate,
   schedule). */
#ifndef MPQ_CLI_H
#define MPQ_CLI_H

#include "mpq.h"

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

static inline double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

/* ---------------------------------------------------------------------------
   progress: a bar with the time left on a terminal; elsewhere (logs, pipes)
   a plain line at most every 15 seconds. Nothing at all when off.
   ------------------------------------------------------------------------ */

typedef struct progress {
    int on, tty, total;
    double t0, last;
} progress;

static inline void progress_start(progress *p, int on, int total)
{
    p->on = on, p->tty = isatty(2), p->total = total;
    p->t0 = p->last = cli_now();
}

static inline void progress_show(progress *p, int done, const char *what)
{
    if (!p->on) return;
    const double now = cli_now(), el = now - p->t0;
    char eta[32] = "";
    if (done > 0 && done < p->total) {
        const double left = el / done * (p->total - done);
        snprintf(eta, sizeof eta, ", %d:%02d left", (int)(left / 60), (int)fmod(left, 60));
    }
    if (p->tty) {
        const int w = 30, fill = p->total ? done * w / p->total : w;
        fprintf(stderr, "\r\033[K[");
        for (int k = 0; k < w; k++) fputc(k < fill ? '#' : '.', stderr);
        fprintf(stderr, "] %d/%d%s %.50s", done, p->total, eta, what ? what : "");
        fflush(stderr);
    } else if (now - p->last >= 15.0 && done < p->total) {
        fprintf(stderr, "mpq: %d/%d after %.0f s%s %.50s\n", done, p->total, el, eta, what ? what : "");
        p->last = now;
    }
}

static inline void progress_end(progress *p)
{
    if (p->on && p->tty) fprintf(stderr, "\r\033[K");
}

/* The commands of tools/mpq_llm.c. */
int cmd_eval(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_speed(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_schedule(int argc, char **argv);

#endif
