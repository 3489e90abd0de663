/* tinylm train: trains a tinylm (tinylm.h) on the corpus of data.h through
   mpq_model's backward pass and writes it as fp16 safetensors.

   usage: tinylm_train [--steps N] [--batch B] [--lr X] [--seed S] [--threads T]
                       [--out FILE] [--dim D] [--layers L] [--heads H] [--ffn F]
                       [--stop-at K --save-state FILE] [--resume FILE]

   --stop-at K --save-state FILE stops after step K and writes the whole
   training state (weights, moments, step, data position); --resume FILE
   continues from it with the same other arguments. A run cut this way ends
   bit for bit where the uninterrupted run ends.

   Initialisation: every value N(0, 0.02), drawn in the order embedding,
   output norm, head, then per layer its two norms and seven linear maps;
   the output projections (o, down) scaled by 1/sqrt(2 layers); the norm
   gains then set to 1. AdamW (beta 0.9, 0.95; weight decay 0.1 on the
   matrices), gradient norm clipped at 1, 100 warm-up steps then cosine
   decay to a tenth of the rate. Each step's loss is the mean over B windows
   of 129 bytes drawn from 16 MB of training text (seed S) of the window's
   mean next-byte loss (mpq_llm_backward_params, summed over the windows,
   divided by B); the held-out loss is on text from seed S + 1000, which the
   evaluation uses too. The result depends only on the arguments: every sum
   has a fixed order. */
#define _POSIX_C_SOURCE 200809L
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "data.h"
#include "tinylm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every parameter and its optimiser state. */
typedef struct params {
    int n;               /* tensors */
    mpq_llm_param *p;    /* the model's, mpq_llm_params order */
    float **g, **m, **v; /* gradient, Adam's two moments */
} params;

static int params_init(const mpq_llm *model, params *P)
{
    memset(P, 0, sizeof *P);
    P->n = mpq_llm_params(model, NULL, 0);
    P->p = (mpq_llm_param *)calloc((size_t)P->n, sizeof *P->p);
    P->g = (float **)calloc((size_t)P->n, sizeof(float *));
    P->m = (float **)calloc((size_t)P->n, sizeof(float *));
    P->v = (float **)calloc((size_t)P->n, sizeof(float *));
    if (!P->p || !P->g || !P->m || !P->v) return -1;
    mpq_llm_params(model, P->p, P->n);
    for (int i = 0; i < P->n; i++)
        if (!(P->g[i] = (float *)calloc(P->p[i].n, sizeof(float))) ||
            !(P->m[i] = (float *)calloc(P->p[i].n, sizeof(float))) ||
            !(P->v[i] = (float *)calloc(P->p[i].n, sizeof(float))))
            return -1;
    return 0;
}

static void params_free(params *P)
{
    for (int i = 0; i < P->n; i++) free(P->g[i]), free(P->m[i]), free(P->v[i]);
    free(P->p), free(P->g), free(P->m), free(P->v);
}

static int is_norm(const mpq_llm_param *p)
{
    return p->role == MPQ_PARAM_OUT_NORM || p->role == MPQ_PARAM_ATTN_NORM || p->role == MPQ_PARAM_FFN_NORM;
}

static void init_weights(params *P, int layers, uint64_t seed)
{
    uint64_t s = seed;
    /* the draw order: embedding, output norm, head, then the layers' */
    static const mpq_param_role first[3] = {MPQ_PARAM_EMBED, MPQ_PARAM_OUT_NORM, MPQ_PARAM_HEAD};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < P->n; i++)
            if (P->p[i].role == first[k])
                for (size_t j = 0; j < P->p[i].n; j++) P->p[i].data[j] = (float)(0.02 * tlm_gauss(&s));
    for (int i = 0; i < P->n; i++)
        if (P->p[i].layer >= 0)
            for (size_t j = 0; j < P->p[i].n; j++) P->p[i].data[j] = (float)(0.02 * tlm_gauss(&s));
    const double k = 1.0 / sqrt(2.0 * layers);
    for (int i = 0; i < P->n; i++) {
        const mpq_llm_param *p = &P->p[i];
        const int out_proj = p->role == MPQ_PARAM_LINEAR && (p->lin == MPQ_LIN_O || p->lin == MPQ_LIN_DOWN);
        for (size_t j = 0; j < p->n; j++)
            p->data[j] = is_norm(p) ? 1.0f : out_proj ? (float)(p->data[j] * k) : p->data[j];
    }
}

/* The training state in three files: PREFIX.0 the next step, the data
   position, the loss average and the weights; PREFIX.1 and PREFIX.2 Adam's
   two moments (every tensor in mpq_llm_params order). */
static int state_io(const char *prefix, int writing, int *next, uint64_t *r, double *avg, params *P)
{
    for (int k = 0; k < 3; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s.%d", prefix, k);
        FILE *f = fopen(path, writing ? "wb" : "rb");
        if (!f) return -1;
        int ok = 1;
        if (k == 0)
            ok = writing ? fwrite(next, sizeof *next, 1, f) == 1 && fwrite(r, sizeof *r, 1, f) == 1 &&
                    fwrite(avg, sizeof *avg, 1, f) == 1
                         : fread(next, sizeof *next, 1, f) == 1 && fread(r, sizeof *r, 1, f) == 1 &&
                    fread(avg, sizeof *avg, 1, f) == 1;
        for (int i = 0; i < P->n && ok; i++) {
            float *a = k == 0 ? P->p[i].data : k == 1 ? P->m[i] : P->v[i];
            ok =
                (writing ? fwrite(a, sizeof(float), P->p[i].n, f) : fread(a, sizeof(float), P->p[i].n, f)) == P->p[i].n;
        }
        if ((fclose(f) != 0 && writing) || !ok) return -1;
    }
    return 0;
}

/* Mean loss of B windows (tok: B x (T + 1)). */
static double mean_loss(const mpq_llm *m, mpq_llm_train *t, const int32_t *tok, int B)
{
    double sum = 0;
    for (int b = 0; b < B; b++) {
        double l = 0;
        if (mpq_llm_backward(m, t, tok + (size_t)b * (TLM_SEQ + 1), TLM_SEQ + 1, NULL, NULL, NULL, NULL, &l) != MPQ_OK)
            abort();
        sum += l;
    }
    return sum / B;
}

int main(int argc, char **argv)
{
    int dim = 256, layers = 4, heads = 4, ffn = 512;
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
            dim = atoi(v), i++;
        else if (!strcmp(argv[i], "--layers"))
            layers = atoi(v), i++;
        else if (!strcmp(argv[i], "--heads"))
            heads = atoi(v), i++;
        else if (!strcmp(argv[i], "--ffn"))
            ffn = atoi(v), i++;
        else if (!strcmp(argv[i], "--threads")) {
#ifdef _OPENMP
            omp_set_num_threads(atoi(v));
#endif
            i++;
        } else {
            fprintf(stderr,
                    "usage: %s [--steps N] [--batch B] [--lr X] [--seed S] [--threads T] [--out FILE] "
                    "[--dim D] [--layers L] [--heads H] [--ffn F] [--stop-at K --save-state FILE] "
                    "[--resume FILE]\n",
                    argv[0]);
            return 1;
        }
    }
    const mpq_llm_config c = tlm_config(dim, layers, heads, ffn);
    mpq_llm *m = steps >= 1 && B >= 1 && heads >= 1 && dim % heads == 0 ? tlm_create(&c) : NULL;
    if (!m) return fprintf(stderr, "tinylm_train: bad configuration\n"), 1;
    params P;
    mpq_llm_train *tr = NULL;
    if (params_init(m, &P) || mpq_llm_train_init(m, TLM_SEQ + 1, &tr) != MPQ_OK)
        return fprintf(stderr, "tinylm_train: out of memory\n"), 1;
    init_weights(&P, layers, seed * 7919 + 17);
    size_t nparams = 0;
    for (int i = 0; i < P.n; i++) nparams += P.p[i].n;
    const size_t text_bytes = (size_t)16 << 20;
    char *text = tlm_corpus(seed, text_bytes), *held = tlm_corpus(seed + 1000, (size_t)1 << 20);
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)B * (TLM_SEQ + 1));
    int32_t *htok = (int32_t *)malloc(sizeof(int32_t) * 16 * (TLM_SEQ + 1));
    if (!text || !held || !tok || !htok) return fprintf(stderr, "tinylm_train: out of memory\n"), 1;
    tlm_windows(held, 16, TLM_SEQ, htok);
    uint64_t r = seed * 1000003 + 5;
    printf("tinylm: dim %d, layers %d, heads %d, ffn %d, seq %d: %zu parameters; %d steps of %d x %d bytes, lr %g, "
           "seed %llu\n",
           dim, layers, heads, ffn, TLM_SEQ, nparams, steps, B, TLM_SEQ, lr, (unsigned long long)seed);
    const double t0 = now();
    double avg = 0;
    int first = 1;
    if (resume && state_io(resume, 0, &first, &r, &avg, &P))
        return fprintf(stderr, "%s.0 .. .2: cannot read the training state\n", resume), 1;
    if (resume) printf("resumed at step %d from %s.0 .. .2\n", first, resume);
    for (int step = first; step <= steps; step++) {
        tlm_batch(text, text_bytes, B, TLM_SEQ, &r, tok);
        for (int i = 0; i < P.n; i++) memset(P.g[i], 0, sizeof(float) * P.p[i].n);
        double loss = 0;
        for (int b = 0; b < B; b++) {
            double l = 0;
            if (mpq_llm_backward_params(m, tr, tok + (size_t)b * (TLM_SEQ + 1), TLM_SEQ + 1, P.g, &l) != MPQ_OK)
                return fprintf(stderr, "tinylm_train: the backward pass failed\n"), 1;
            loss += l;
        }
        loss /= B;
        double norm = 0;
        for (int i = 0; i < P.n; i++)
            for (size_t j = 0; j < P.p[i].n; j++) norm += (double)P.g[i][j] * P.g[i][j];
        norm = sqrt(norm) / B;
        const double scale = (norm > 1.0 ? 1.0 / norm : 1.0) / B; /* the mean over windows, clipped */
        const double warm = step < 100 ? step / 100.0 : 1.0;
        const double prog = (double)step / steps;
        const double rate = lr * warm * (0.1 + 0.9 * 0.5 * (1 + cos(3.141592653589793 * prog)));
        const double b1 = 0.9, b2 = 0.95, c1 = 1 - pow(b1, step), c2 = 1 - pow(b2, step);
        for (int i = 0; i < P.n; i++) {
            const mpq_llm_param *p = &P.p[i];
            const int decay = p->cols != 0; /* the matrices */
            float *w = p->data, *g = P.g[i], *mo = P.m[i], *va = P.v[i];
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
            for (size_t j = 0; j < p->n; j++) {
                const double gj = g[j] * scale;
                mo[j] = (float)(b1 * mo[j] + (1 - b1) * gj);
                va[j] = (float)(b2 * va[j] + (1 - b2) * gj * gj);
                double x = w[j];
                if (decay) x -= rate * 0.1 * x;
                x -= rate * (mo[j] / c1) / (sqrt(va[j] / c2) + 1e-8);
                w[j] = (float)x;
            }
        }
        avg = step == 1 ? loss : 0.98 * avg + 0.02 * loss;
        if (step % 100 == 0 || step == 1 || step == steps) {
            printf("step %5d  loss %.4f  (avg %.4f)  grad norm %.3f  lr %.2e  %.0f s", step, loss, avg, norm, rate,
                   now() - t0);
            if (step % 500 == 0 || step == steps) printf("  held-out %.4f", mean_loss(m, tr, htok, 16));
            printf("\n");
            fflush(stdout);
        }
        if (step == stop_at && save_state) {
            int next = step + 1;
            if (state_io(save_state, 1, &next, &r, &avg, &P))
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
    if (tlm_save(m, out, meta, 3)) return 1;
    printf("wrote %s (%.0f s)\n", out, now() - t0);
    free(text), free(held), free(tok), free(htok);
    params_free(&P);
    mpq_llm_train_free(tr);
    mpq_llm_free(m);
    return 0;
}
