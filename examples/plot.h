/* examples/plot.h - perplexity against bits per weight as an SVG file, one
   polyline per family of methods (the shape of SFMP's figure 1); the first
   point is the unquantized reference, drawn as a dashed line. The main
   jobs draw it through report.h. */
#ifndef MPQ_EXAMPLES_PLOT_H
#define MPQ_EXAMPLES_PLOT_H

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct plot_point {
    const char *family;
    double bpw, ppl;
} plot_point;

/* p[0] is the reference; the x axis spans the others' bits per weight, the
   y axis (log scale) every perplexity up to 20 times the reference: a
   point above that is drawn on the top edge as a triangle with its value. */
static inline void plot_ppl_vs_bpw(FILE *f, const plot_point *p, int n, const char *xlabel, const char *ylabel,
                                   const char *reflabel)
{
    double x0 = 1e9, x1 = 0, y0 = 1e9, y1 = 0;
    for (int i = 1; i < n; i++) {
        x0 = fmin(x0, p[i].bpw), x1 = fmax(x1, p[i].bpw);
        y0 = fmin(y0, p[i].ppl), y1 = fmax(y1, p[i].ppl);
    }
    y0 = fmin(y0, p[0].ppl);
    const double cap = 20.0 * p[0].ppl;
    y1 = fmin(y1, cap);
    x0 = floor(x0 * 2) / 2, x1 = ceil(x1 * 2) / 2;
    if (x1 <= x0) x1 = x0 + 0.5;
    const double ly0 = log(y0) - 0.02, ly1 = log(y1) + 0.02;
    const int W = 720, H = 460, L = 70, R = 190, T = 20, Bm = 50;
#define PX(x) (L + ((x)-x0) / (x1 - x0) * (W - L - R))
#define PY(y) (H - Bm - (log(fmin(y, cap)) - ly0) / (ly1 - ly0) * (H - T - Bm))
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - Bm, W - R, H - Bm);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L, H - Bm);
    for (double x = x0; x <= x1 + 1e-9; x += 0.5)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.1f</text>\n", PX(x), H - Bm + 16, x);
    for (int k = 0; k <= 5; k++) {
        const double y = exp(ly0 + (ly1 - ly0) * k / 5);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>\n", L - 6, PY(y) + 4, y);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", (L + W - R) / 2, H - 10, xlabel);
    fprintf(f, "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" text-anchor=\"middle\">%s</text>\n",
            (T + H - Bm) / 2, (T + H - Bm) / 2, ylabel);
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"gray\" stroke-dasharray=\"4 3\"/>\n", L,
            PY(p[0].ppl), W - R, PY(p[0].ppl));
    static const char *const colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    const char *fams[32];
    int nf = 0;
    for (int i = 1; i < n; i++) {
        int k = 0;
        while (k < nf && strcmp(fams[k], p[i].family)) k++;
        if (k == nf && nf < 32) fams[nf++] = p[i].family;
    }
    for (int k = 0; k < nf; k++) {
        const char *col = colors[k % 10];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", col);
        for (int i = 1; i < n; i++)
            if (!strcmp(p[i].family, fams[k])) fprintf(f, "%.1f,%.1f ", PX(p[i].bpw), PY(p[i].ppl));
        fprintf(f, "\"/>\n");
        for (int i = 1; i < n; i++) {
            if (strcmp(p[i].family, fams[k])) continue;
            if (p[i].ppl <= cap) {
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", PX(p[i].bpw), PY(p[i].ppl),
                        col);
            } else {
                const double x = PX(p[i].bpw), y = PY(cap);
                fprintf(f, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\"/>\n", x - 5, y + 4, x + 5,
                        y + 4, x, y - 5, col);
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">%.3g</text>\n", x + 7, y + 4, p[i].ppl);
            }
        }
        fprintf(f, "<circle cx=\"%d\" cy=\"%d\" r=\"4\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n", W - R + 16,
                T + 10 + 18 * k, col, W - R + 26, T + 14 + 18 * k, fams[k]);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"gray\">- - %s</text>\n", W - R + 12, T + 14 + 18 * nf, reflabel);
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
}

#endif
