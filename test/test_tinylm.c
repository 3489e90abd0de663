/* tinylm (examples/tinylm): the byte vocabulary is the identity on bytes;
   a model saved by tlm_save loads back with the same values (F16) and
   description; the evaluation (perplexity and tasks on packed matrices,
   with a PMPD schedule) does not depend on the thread count; the data
   generator's answers are right; the committed model loads through
   mpq_model and has learned its text. */
#define _XOPEN_SOURCE 700
#include "common.h"
#include "eval.h"
#include "tmpdir.h"

#include <stdio.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static char tmpdir[256];
static void make_tmpdir(void) { cr_assert(tc_tmpdir_make(tmpdir, sizeof tmpdir, "tinylm")); }
static void remove_tmpdir(void) { tc_tmpdir_remove(tmpdir); }

TestSuite(tinylm, .init = make_tmpdir, .fini = remove_tmpdir, .timeout = 600);

/* A small random tinylm: values N(0, 0.3) off the initial symmetry, gains
   near 1. */
static mpq_llm *random_model(int dim, int layers, int heads, int ffn, uint64_t seed)
{
    const mpq_llm_config c = tlm_config(dim, layers, heads, ffn);
    mpq_llm *m = tlm_create(&c);
    cr_assert_not_null(m);
    mpq_llm_param p[64];
    const int n = mpq_llm_params(m, p, 64);
    cr_assert(n <= 64);
    uint64_t s = seed;
    for (int i = 0; i < n; i++)
        for (size_t j = 0; j < p[i].n; j++)
            p[i].data[j] =
                (float)((p[i].cols ? 0.3 / sqrt((double)p[i].cols) : 0.1) * tlm_gauss(&s)) + (p[i].cols ? 0.0f : 1.0f);
    return m;
}

Test(tinylm, the_byte_vocabulary_is_the_identity_on_bytes)
{
    const mpq_llm_config c = tlm_config(32, 1, 2, 48);
    mpq_llm *m = tlm_create(&c);
    cr_assert_not_null(m);
    cr_assert_eq(mpq_tokenizer_size(m->tok), 256);
    cr_assert_eq(mpq_tokenizer_adds_bos(m->tok), 0);
    for (int b = 0; b < 256; b++) {
        size_t len = 0;
        const int32_t id = b;
        char *text = NULL;
        cr_assert_eq(mpq_detokenize(m->tok, &id, 1, 0, &text, &len), MPQ_OK);
        cr_assert(len == 1 && (uint8_t)text[0] == b, "token %d", b);
        free(text);
        cr_assert_not(mpq_token_is_end(m->tok, id));
    }
    char *t = tlm_corpus(9, 4096);
    int32_t *tok = NULL;
    size_t n = 0;
    cr_assert_eq(mpq_tokenize(m->tok, t, 4096, 0, &tok, &n, NULL), MPQ_OK);
    cr_assert_eq(n, 4096);
    for (size_t i = 0; i < n; i++) cr_assert_eq(tok[i], (uint8_t)t[i], "byte %zu", i);
    free(tok), free(t);
    mpq_llm_free(m);
}

Test(tinylm, a_saved_model_loads_back)
{
    mpq_llm *m = random_model(48, 2, 3, 40, 4);
    char path[600];
    snprintf(path, sizeof path, "%s/t.safetensors", tmpdir);
    const char *meta[] = {"tinylm.command", "test", "tinylm.seed", "4"};
    cr_assert_eq(tlm_save(m, path, meta, 2), 0);
    mpq_llm *r = NULL;
    mpq_io_err e;
    cr_assert_eq(mpq_llm_load(path, &r, &e), MPQ_OK, "%s", e.msg);
    cr_assert(!memcmp(&m->c, &r->c, sizeof m->c), "the description changed");
    mpq_llm_param a[64], b[64];
    const int n = mpq_llm_params(m, a, 64);
    cr_assert_eq(mpq_llm_params(r, b, 64), n);
    for (int i = 0; i < n; i++) {
        cr_assert_str_eq(a[i].name, b[i].name);
        for (size_t j = 0; j < a[i].n; j++)
            cr_assert_eq(b[i].data[j], mpq_f16_to_f32(mpq_f32_to_f16(a[i].data[j])), "%s", a[i].name);
    }
    mpq_llm_free(r);
    mpq_llm_free(m);
    unlink(path);
}

/* Every linear map packed a different way: uniform, mixed widths, MXINT. */
static void quantize_all(mpq_llm *m, uint64_t seed)
{
    uint64_t s = seed;
    for (int l = 0; l < m->c.layers; l++)
        for (int k = 0; k < MPQ_LIN_COUNT; k++) {
            mpq_linear *L = &m->layer[l].lin[k];
            mpq_bitplane_desc d;
            memset(&d, 0, sizeof d);
            d.rows = L->rows, d.cols = L->cols, d.group = 32, d.uniform_bits = 3;
            uint8_t bits[256];
            if (k % 3 == 1) {
                const int nb = (L->rows + 15) / 16 * ((L->cols + 31) / 32);
                for (int b = 0; b < nb; b++) bits[b] = (uint8_t)(2 + tlm_rand(&s) % 4);
                d.bits = bits;
            } else if (k % 3 == 2) {
                d.format = MPQ_FORMAT_MXINT, d.uniform_bits = 4;
            }
            mpq_packed A;
            cr_assert_eq(mpq_pack_alloc(&d, L->W, &A), MPQ_OK);
            cr_assert_eq(mpq_linear_set_packed(m, L, &A), MPQ_OK);
        }
}

Test(tinylm, evaluation_is_deterministic_whatever_the_threads)
{
    mpq_llm *m = random_model(64, 2, 2, 96, 8);
    quantize_all(m, 9);
    char *held = tlm_corpus(1001, 1 << 14);
    enum { B = 3 };
    int32_t tok[B * (TLM_SEQ + 1)];
    tlm_windows(held, B, TLM_SEQ, tok);
    tlm_task k;
    tlm_task_make(&k, 2001, 6, 3);
    mpq_pmpd_schedule sch;
    memset(&sch, 0, sizeof sch);
    sch.nlevels = 2, sch.skip[0] = 0, sch.skip[1] = 1, sch.start[1] = 3;
    tlm_result r[3], plain;
#ifdef _OPENMP
    const int keep = omp_get_max_threads();
#endif
    for (int run = 0; run < 3; run++) {
#ifdef _OPENMP
        omp_set_num_threads(run == 2 ? 1 : keep);
#endif
        cr_assert_eq(tlm_evaluate(m, &sch, tok, B, &k, &r[run]), MPQ_OK);
    }
#ifdef _OPENMP
    omp_set_num_threads(keep);
#endif
    for (int run = 1; run < 3; run++) {
        cr_assert_eq(memcmp(&r[0].nll, &r[run].nll, sizeof(double)), 0, "run %d: nll %.17g vs %.17g", run, r[run].nll,
                     r[0].nll);
        cr_assert_eq(r[0].arith, r[run].arith);
        cr_assert_eq(r[0].recall, r[run].recall);
    }
    cr_assert(isfinite(r[0].nll) && r[0].nll > 0);
    /* the schedule changes the measured loss (its later tokens read fewer planes) */
    cr_assert_eq(tlm_evaluate(m, NULL, tok, B, &k, &plain), MPQ_OK);
    cr_assert_neq(plain.nll, r[0].nll);
    tlm_task_free(&k);
    free(held);
    mpq_llm_free(m);
}

Test(tinylm, generated_answers_are_right)
{
    tlm_task k;
    tlm_task_make(&k, 77, 2000, 1000);
    for (int i = 0; i < k.n; i++) {
        const char *p = k.prompt[i];
        cr_assert_eq(p[0], '\n');
        if (i < k.narith) {
            int a, b;
            char op;
            cr_assert_eq(sscanf(p + 1, "%d%c%d=", &a, &op, &b), 3, "%s", p + 1);
            cr_assert(op == '+' || (op == '-' && a >= b), "%s", p + 1);
            cr_assert(a >= 0 && a < 1000 && b >= 0 && b < 1000);
            cr_assert_eq(atoi(k.answer[i]), op == '+' ? a + b : a - b, "%s%s", p + 1, k.answer[i]);
        } else {
            /* "k=v k=v ... ? k=": the answer is the value given for that key */
            const char *q = strstr(p, "? ");
            cr_assert_not_null(q);
            const char key = q[2];
            int found = 0;
            for (const char *t = p + 1; t < q; t += 4) {
                cr_assert(t[1] == '=' && t[3] == ' ', "%s", p + 1);
                if (t[0] == key) {
                    found++;
                    cr_assert_eq(t[2], k.answer[i][0]);
                }
            }
            cr_assert_eq(found, 1, "the key appears once: %s", p + 1);
        }
    }
    tlm_task_free(&k);
    /* the corpus is printable lines */
    char *t = tlm_corpus(5, 1 << 16);
    for (size_t i = 0; i < 1 << 16; i++) cr_assert(t[i] == '\n' || (t[i] >= ' ' && t[i] < 127));
    free(t);
}

Test(tinylm, the_committed_model_has_learned_its_text)
{
    const char *root = getenv("MPQ_SOURCE_ROOT");
    cr_assert(root && *root, "MPQ_SOURCE_ROOT is not set");
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/tinylm/tinylm.safetensors", root);
    mpq_llm *m = NULL;
    mpq_io_err e;
    cr_assert_eq(mpq_llm_load(path, &m, &e), MPQ_OK, "%s", e.msg);
    const mpq_llm_config want = tlm_config(256, 4, 4, 512);
    cr_assert(!memcmp(&m->c, &want, sizeof want), "not the description of tinylm.h");
    char *held = tlm_corpus(1001, 1 << 16);
    enum { B = 4 };
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * B * (TLM_SEQ + 1));
    tlm_windows(held, B, TLM_SEQ, tok);
    mpq_llm_train *t = NULL;
    cr_assert_eq(mpq_llm_train_init(m, TLM_SEQ + 1, &t), MPQ_OK);
    double sum = 0;
    for (int b = 0; b < B; b++) {
        double l = 0;
        cr_assert_eq(mpq_llm_backward(m, t, tok + (size_t)b * (TLM_SEQ + 1), TLM_SEQ + 1, NULL, NULL, NULL, NULL, &l),
                     MPQ_OK);
        sum += l;
    }
    /* uniform bytes would be log 256 = 5.55 nats; the training log ends at 0.884 */
    cr_assert(sum / B < 1.0, "held-out loss %.4f", sum / B);
    mpq_llm_train_free(t);
    free(tok), free(held);
    mpq_llm_free(m);
}
