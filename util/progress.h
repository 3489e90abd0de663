/* util/progress.h - the progress line of long runs, shared by the mpq tool
   and the main job (examples/llm/llm_methods.c): on a terminal, a bar on stderr
   with the time left, redrawn in place and erased at the end; elsewhere
   (logs, pipes) a plain line "WHO: done/total after N s, M:SS left, WHAT"
   at most every 15 seconds. Nothing at all when off. */
#ifndef MPQ_UTIL_PROGRESS_H
#define MPQ_UTIL_PROGRESS_H

#include <math.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

typedef struct progress {
    const char *who; /* the program's name, before every plain line */
    FILE *out;       /* stderr */
    int on, tty, total;
    double t0, last;
} progress;

static inline double progress_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void progress_start(progress *p, const char *who, int on, int total)
{
    p->who = who, p->out = stderr, p->on = on, p->tty = isatty(2), p->total = total;
    p->t0 = p->last = progress_now();
}

/* done of total steps finished; what: the step under way (shortened to 50
   characters), or NULL. */
static inline void progress_show(progress *p, int done, const char *what)
{
    if (!p->on) return;
    const double now = progress_now(), el = now - p->t0;
    char eta[32] = "";
    if (done > 0 && done < p->total) {
        const double left = el / done * (p->total - done);
        snprintf(eta, sizeof eta, ", %d:%02d left", (int)(left / 60), (int)fmod(left, 60));
    }
    if (p->tty) {
        const int w = 30, fill = p->total ? done * w / p->total : w;
        fprintf(p->out, "\r\033[K[");
        for (int k = 0; k < w; k++) fputc(k < fill ? '#' : '.', p->out);
        fprintf(p->out, "] %d/%d%s %.50s", done, p->total, eta, what ? what : "");
        fflush(p->out);
    } else if (now - p->last >= 15.0 && done < p->total) {
        fprintf(p->out, "%s: %d/%d after %.0f s%s %.50s\n", p->who, done, p->total, el, eta, what ? what : "");
        p->last = now;
    }
}

static inline void progress_end(progress *p)
{
    if (p->on && p->tty) fprintf(p->out, "\r\033[K");
}

#endif
