/* tinylm train: trains the model of model.h on the corpus of data.h and
   writes it as fp16 safetensors.

   usage: tinylm_train [--steps N] [--batch B] [--lr X] [--seed S] [--threads T]
                       [--out FILE] [--dim D] [--layers L] [--heads H] [--ffn F]
                       [--stop-at K --save-state FILE] [--resume FILE]

   --stop-at K --save-state FILE stops after step K and writes the whole
   training state (weights, moments, step, data position); --resume FILE
   continues from it with the same other arguments. A run cut this way ends
   bit for bit where the uninterrupted run ends.

   AdamW (beta 0.9, 0.95; weight decay 0.1 on matrices), gradient norm
   clipped at 1, 100 warm-up steps then cosine decay to a tenth of the rate.
   Windows of 129 bytes are drawn from 16 MB of training text (seed S); the
   held-out loss is on text from seed S + 1000, which the evaluation uses too.
   The result depends only on the arguments: every sum has a fixed order. */
#define _POSIX_C_SOURCE 200809L
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "ckpt.h"
#include "data.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The training state in three files (each under 16 MB for this model):
   PREFIX.0 the next step, the data position, the loss average and the
   weights; PREFIX.1 and PREFIX.2 Adam's two moments. */
static int state_file(const char *prefix, int k, const char *mode, FILE **f)
{
    char p[1024];
    snprintf(p, sizeof p, "%s.%d", prefix, k);
    return (*f = fopen(p, mode)) == NULL;
}

static int write_state(const char *prefix, int next, uint64_t r, double avg, const tlm_params *p, const tlm_params *mom,
                       const tlm_params *var)
{
    const tlm_params *parts[3] = {p, mom, var};
    for (int k = 0; k < 3; k++) {
        FILE *f;
        if (state_file(prefix, k, "wb", &f)) return -1;
        int ok = !k ? fwrite(&next, sizeof next, 1, f) == 1 && fwrite(&r, sizeof r, 1, f) == 1 &&
                fwrite(&avg, sizeof avg, 1, f) == 1
                    : 1;
        ok = ok && fwrite(parts[k]->data, sizeof(real), parts[k]->n, f) == parts[k]->n;
        if (fclose(f) != 0 || !ok) return -1;
    }
    return 0;
}

static int read_state(const char *prefix, int *next, uint64_t *r, double *avg, tlm_params *p, tlm_params *mom,
                      tlm_params *var)
{
    tlm_params *parts[3] = {p, mom, var};
    for (int k = 0; k < 3; k++) {
        FILE *f;
        if (state_file(prefix, k, "rb", &f)) return -1;
        int ok = !k ? fread(next, sizeof *next, 1, f) == 1 && fread(r, sizeof *r, 1, f) == 1 &&
                fread(avg, sizeof *avg, 1, f) == 1
                    : 1;
        ok = ok && fread(parts[k]->data, sizeof(real), parts[k]->n, f) == parts[k]->n;
        fclose(f);
        if (!ok) return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    tlm_config c = {256, 4, 4, 512, 128};
    int steps = 3000, B = 16;
    double lr = 3e-3;
    uint64_t seed = 1;
    const char *out = "tinylm.safetensors", *save_state = NULL, *resume = NULL;
    int stop_at = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--steps"))
            steps = atoi(v), i++;
        else if (!strcmp(argv[i], "--batch"))
            B = atoi(v), i++;
        else if (!strcmp(argv[i], "--lr"))
            lr = atof(v), i++;
        else if (!strcmp(argv[i], "--seed"))
            seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--out"))
            out = v, i++;
        else if (!strcmp(argv[i], "--stop-at"))
            stop_at = atoi(v), i++;
        else if (!strcmp(argv[i], "--save-state"))
            save_state = v, i++;
        else if (!strcmp(argv[i], "--resume"))
            resume = v, i++;
        else if (!strcmp(argv[i], "--dim"))
            c.dim = atoi(v), i++;
        else if (!strcmp(argv[i], "--layers"))
            c.layers = atoi(v), i++;
        else if (!strcmp(argv[i], "--heads"))
            c.heads = atoi(v), i++;
        else if (!strcmp(argv[i], "--ffn"))
            c.ffn = atoi(v), i++;
        else if (!strcmp(argv[i], "--threads")) {
#ifdef _OPENMP
            omp_set_num_threads(atoi(v));
#endif
            i++;
        } else {
            fprintf(stderr,
                    "usage: %s [--steps N] [--batch B] [--lr X] [--seed S] [--threads T] [--out FILE] "
                    "[--dim D] [--layers L] [--heads H] [--ffn F]\n",
                    argv[0]);
            return 1;
        }
    }
    tlm_model m;
    if (steps < 1 || B < 1 || tlm_model_init(&m, &c)) return fprintf(stderr, "bad configuration\n"), 1;
    tlm_params_init(&c, &m.p, seed * 7919 + 17);
    tlm_params g, mom, var;
    tlm_acts a, ah;
    tlm_grad_work gw;
    if (tlm_params_alloc(&c, &g) || tlm_params_alloc(&c, &mom) || tlm_params_alloc(&c, &var) ||
        tlm_acts_alloc(&c, B, &a) || tlm_acts_alloc(&c, 16, &ah) || tlm_grad_work_alloc(&c, B, &gw))
        return fprintf(stderr, "out of memory\n"), 1;
    /* which parameters decay: the matrices */
    uint8_t *decay = calloc(m.p.n, 1);
    for (size_t i = 0; i < (size_t)TLM_VOCAB * c.dim; i++)
        decay[(m.p.emb - m.p.data) + i] = decay[(m.p.head - m.p.data) + i] = 1;
    for (int l = 0; l < c.layers; l++)
        for (int w = 0; w < TLM_NLIN; w++)
            memset(decay + (m.p.w[l][w] - m.p.data), 1, (size_t)tlm_lin_rows(&c, w) * tlm_lin_cols(&c, w));
    const size_t text_bytes = (size_t)16 << 20;
    char *text = tlm_corpus(seed, text_bytes), *held = tlm_corpus(seed + 1000, (size_t)1 << 20);
    uint8_t *tok = malloc((size_t)B * c.seq), *htok = malloc((size_t)16 * c.seq);
    int *tgt = malloc(sizeof(int) * B * c.seq), *htgt = malloc(sizeof(int) * 16 * c.seq);
    tlm_windows(held, 16, c.seq, htok, htgt);
    uint64_t r = seed * 1000003 + 5;
    printf("tinylm: dim %d, layers %d, heads %d, ffn %d, seq %d: %zu parameters; %d steps of %d x %d bytes, lr %g, "
           "seed %llu\n",
           c.dim, c.layers, c.heads, c.ffn, c.seq, m.p.n, steps, B, c.seq, lr, (unsigned long long)seed);
    const double t0 = now();
    double avg = 0;
    int first = 1;
    if (resume && read_state(resume, &first, &r, &avg, &m.p, &mom, &var))
        return fprintf(stderr, "%s.0 .. .2: cannot read the training state\n", resume), 1;
    if (resume) printf("resumed at step %d from %s.0 .. .2\n", first, resume);
    for (int step = first; step <= steps; step++) {
        tlm_batch(text, text_bytes, B, c.seq, &r, tok, tgt);
        const double loss = tlm_forward(&m, tok, tgt, &a, B);
        memset(g.data, 0, sizeof(real) * g.n);
        tlm_backward(&m, tok, tgt, &a, &g, &gw, B);
        double norm = 0;
        for (size_t i = 0; i < g.n; i++) norm += (double)g.data[i] * g.data[i];
        norm = sqrt(norm);
        const double clip = norm > 1.0 ? 1.0 / norm : 1.0;
        const double warm = step < 100 ? step / 100.0 : 1.0;
        const double prog = (double)step / steps;
        const double rate = lr * warm * (0.1 + 0.9 * 0.5 * (1 + cos(3.141592653589793 * prog)));
        const double b1 = 0.9, b2 = 0.95, c1 = 1 - pow(b1, step), c2 = 1 - pow(b2, step);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
        for (size_t i = 0; i < m.p.n; i++) {
            const double gi = g.data[i] * clip;
            mom.data[i] = (real)(b1 * mom.data[i] + (1 - b1) * gi);
            var.data[i] = (real)(b2 * var.data[i] + (1 - b2) * gi * gi);
            double p = m.p.data[i];
            if (decay[i]) p -= rate * 0.1 * p;
            p -= rate * (mom.data[i] / c1) / (sqrt(var.data[i] / c2) + 1e-8);
            m.p.data[i] = (real)p;
        }
        avg = step == 1 ? loss : 0.98 * avg + 0.02 * loss;
        if (step % 100 == 0 || step == 1 || step == steps) {
            printf("step %5d  loss %.4f  (avg %.4f)  grad norm %.3f  lr %.2e  %.0f s", step, loss, avg, norm, rate,
                   now() - t0);
            if (step % 500 == 0 || step == steps) printf("  held-out %.4f", tlm_forward(&m, htok, htgt, &ah, 16));
            printf("\n");
            fflush(stdout);
        }
        if (step == stop_at && save_state) {
            if (write_state(save_state, step + 1, r, avg, &m.p, &mom, &var))
                return fprintf(stderr, "%s.0 .. .2: cannot write the training state\n", save_state), 1;
            printf("stopped after step %d: state in %s\n", step, save_state);
            return 0;
        }
    }
    char cmd[1024] = "", sbuf[32], tbuf[32];
    for (int i = 0; i < argc; i++) { /* the command, less how it was cut into runs */
        if (!strcmp(argv[i], "--stop-at") || !strcmp(argv[i], "--save-state") || !strcmp(argv[i], "--resume")) {
            i++;
            continue;
        }
        strncat(cmd, i ? " " : "", sizeof cmd - strlen(cmd) - 1);
        strncat(cmd, i ? argv[i] : "tinylm_train", sizeof cmd - strlen(cmd) - 1);
    }
    snprintf(sbuf, sizeof sbuf, "%llu", (unsigned long long)seed);
    snprintf(tbuf, sizeof tbuf, "%d", steps);
    const char *meta[] = {"tinylm.command", cmd, "tinylm.seed", sbuf, "tinylm.steps", tbuf};
    if (tlm_save(&m, out, meta, 3)) return 1;
    printf("wrote %s (%.0f s)\n", out, now() - t0);
    free(decay), free(text), free(held), free(tok), free(htok), free(tgt), free(htgt);
    tlm_params_free(&g), tlm_params_free(&mom), tlm_params_free(&var);
    tlm_acts_free(&a), tlm_acts_free(&ah), tlm_grad_work_free(&gw);
    tlm_model_free(&m);
    return 0;
}
