/* examples/report.h - where the main jobs (examples/llm/llm_methods.c,
   examples/tinylm/tinylm.c) write: their output folder, a file in it, and
   the plot of perplexity against bits per weight (plot.h). A failure ends
   the program with a message naming the path. */
#ifndef MPQ_EXAMPLES_REPORT_H
#define MPQ_EXAMPLES_REPORT_H

#include "plot.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* dir and the folders above it, created where missing. */
static inline void report_dir(const char *prog, const char *dir)
{
    char p[1024];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1;; s++)
        if (*s == '/' || !*s) {
            const char keep = *s;
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "%s: cannot create %s: %s\n", prog, p, strerror(errno));
                exit(1);
            }
            if (!keep) return;
            *s = keep;
        }
}

/* dir/name opened for writing, its path in p. */
static inline FILE *report_open(const char *prog, const char *dir, const char *name, char *p, size_t cap)
{
    snprintf(p, cap, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (!f) {
        fprintf(stderr, "%s: cannot write %s: %s\n", prog, p, strerror(errno));
        exit(1);
    }
    return f;
}

/* dir/ppl_vs_bpw.svg: the points p[0..n) (p[0] the reference). */
static inline void report_plot(const char *prog, const char *dir, const plot_point *pts, int n, const char *ylabel,
                               const char *reflabel)
{
    char p[1024];
    FILE *f = report_open(prog, dir, "ppl_vs_bpw.svg", p, sizeof p);
    plot_ppl_vs_bpw(f, pts, n, "bits per weight (linear maps)", ylabel, reflabel);
    if (fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write %s: %s\n", prog, p, strerror(errno));
        exit(1);
    }
    printf("wrote %s\n", p);
}

#endif
