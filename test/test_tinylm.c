/* tinylm (examples/tinylm): the quantized model run on the packed bytes
   (mpq_gemv) equals the model run on their dequantized copies; the
   evaluation is deterministic, whatever the thread count; the data
   generator's answers are right; the committed model loads and has learned
   its text. */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "ckpt.h"
#include "eval.h"

#include <criterion/criterion.h>
#include <stdio.h>

static void random_model(tlm_model *m, tlm_config c, uint64_t seed)
{
    cr_assert_eq(tlm_model_init(m, &c), 0);
    tlm_params_init(&c, &m->p, seed);
    uint64_t s = seed + 99;
    for (size_t i = 0; i < m->p.n; i++) m->p.data[i] += (real)(0.05 * tlm_gauss(&s));
}

/* Every linear map packed a different way: uniform, mixed widths with
   permutations and column scales, MXINT, a sparse part. */
static void quantize_all(const tlm_model *m, tlm_qmodel *q, uint64_t seed)
{
    const tlm_config *c = &m->c;
    uint64_t s = seed;
    memset(q, 0, sizeof *q);
    for (int l = 0; l < c->layers; l++)
        for (int w = 0; w < TLM_NLIN; w++) {
            const int rows = tlm_lin_rows(c, w), cols = tlm_lin_cols(c, w), kind = (l * TLM_NLIN + w) % 4;
            mpq_bitplane_desc d;
            memset(&d, 0, sizeof d);
            d.rows = rows, d.cols = cols, d.group = 32, d.uniform_bits = 3;
            uint8_t bits[256];
            uint32_t *pr = NULL, *pc = NULL;
            float *cs = NULL;
            mpq_sparse S;
            memset(&S, 0, sizeof S);
            if (kind == 1) {
                const int nb = (rows + 15) / 16 * ((cols + 31) / 32);
                for (int k = 0; k < nb; k++) bits[k] = (uint8_t)(2 + tlm_rand(&s) % 4);
                d.bits = bits;
                pr = malloc(4 * rows), pc = malloc(4 * cols), cs = malloc(4 * cols);
                for (int i = 0; i < rows; i++) pr[i] = (uint32_t)((i * 7 + 3) % rows);
                for (int j = 0; j < cols; j++)
                    pc[j] = (uint32_t)((j * 5 + 1) % cols), cs[j] = 0.75f + 0.5f * (float)tlm_unif(&s);
                d.p_row = pr, d.p_col = pc, d.col_scale = cs;
            } else if (kind == 2) {
                d.format = MPQ_FORMAT_MXINT, d.uniform_bits = 4;
            } else if (kind == 3) {
                uint8_t *mask = calloc((size_t)rows * cols, 1);
                float *D = calloc((size_t)rows * cols, sizeof(float));
                for (int k = 0; k < rows * cols / 100; k++) mask[tlm_rand(&s) % ((uint64_t)rows * cols)] = 1;
                cr_assert_eq(mpq_sparse_from_mask(m->p.w[l][w], D, mask, rows, cols, &S), MPQ_OK);
                d.sparse = &S;
                free(mask), free(D);
            }
            cr_assert_eq(mpq_pack_alloc(&d, m->p.w[l][w], &q->A[l][w]), MPQ_OK);
            mpq_sparse_free(&S);
            free(pr), free(pc), free(cs);
        }
    cr_assert_eq(tlm_qmodel_dequantize(q, c, 3), 0);
}

static void logits(const tlm_model *m0, const tlm_qmodel *q, int packed, mpq_path path, const mpq_pmpd_schedule *sched,
                   const uint8_t *tok, int B, float *out)
{
    tlm_model m = *m0;
    tlm_run r;
    memset(&r, 0, sizeof r);
    r.q = q, r.use_packed = packed, r.path = path, r.sched = sched;
    int len[8];
    for (int b = 0; b < B; b++) len[b] = 3 + b;
    r.prompt_len = len;
    m.hook = tlm_hook, m.hook_user = &r;
    tlm_acts a;
    cr_assert_eq(tlm_acts_alloc(&m.c, B, &a), 0);
    tlm_forward(&m, tok, NULL, &a, B);
    memcpy(out, a.logits, sizeof(float) * (size_t)B * m.c.seq * TLM_VOCAB);
    tlm_acts_free(&a);
}

Test(tinylm, packed_forward_equals_dequantized_forward)
{
    tlm_config c = {64, 2, 2, 96, 16};
    tlm_model m;
    random_model(&m, c, 5);
    tlm_qmodel q;
    quantize_all(&m, &q, 6);
    const int B = 3, n = B * c.seq * TLM_VOCAB;
    uint8_t tok[3 * 16];
    uint64_t s = 1;
    for (int i = 0; i < B * c.seq; i++) tok[i] = (uint8_t)(tlm_rand(&s) % 256);
    float *dense = malloc(sizeof(float) * n), *packed = malloc(sizeof(float) * n);
    mpq_pmpd_schedule sch;
    memset(&sch, 0, sizeof sch);
    sch.prefill_skip = 0, sch.nlevels = 2, sch.skip[0] = 1, sch.skip[1] = 2, sch.start[1] = 4;
    for (int use_sched = 0; use_sched < 2; use_sched++)
        for (int p = 0; p < 3; p++) {
            const mpq_path path = p == 0 ? MPQ_PATH_SCALAR : p == 1 ? MPQ_PATH_AVX512 : MPQ_PATH_AUTO;
            if (!mpq_path_available(path)) continue;
            logits(&m, &q, 0, 0, use_sched ? &sch : NULL, tok, B, dense);
            logits(&m, &q, 1, path, use_sched ? &sch : NULL, tok, B, packed);
            double worst = 0, mag = 0;
            for (int k = 0; k < n; k++) {
                worst = fmax(worst, fabs((double)dense[k] - packed[k]));
                mag = fmax(mag, fabs((double)dense[k]));
            }
            /* float tables: rounding only; AUTO may use the int16 tables (VNNI),
               whose error bound the header gives */
            const double tol = path == MPQ_PATH_AUTO ? 2e-3 : 2e-5;
            cr_assert(worst <= tol * mag, "%s, schedule %d: max |dense - packed| %.3g of max |logit| %.3g",
                      mpq_path_name(path), use_sched, worst, mag);
        }
    /* the schedule changes the result where it should, and only there */
    logits(&m, &q, 0, 0, NULL, tok, B, dense);
    logits(&m, &q, 0, 0, &sch, tok, B, packed);
    cr_assert_neq(memcmp(dense, packed, sizeof(float) * n), 0);
    free(dense), free(packed);
    tlm_qmodel_free(&q, &c);
    tlm_model_free(&m);
}

Test(tinylm, evaluation_is_deterministic_whatever_the_threads)
{
    tlm_config c = {64, 2, 2, 96, 32};
    tlm_model m;
    random_model(&m, c, 8);
    tlm_qmodel q;
    quantize_all(&m, &q, 9);
    char *held = tlm_corpus(1001, 1 << 14);
    const int B = 4;
    uint8_t tok[4 * 32];
    int tgt[4 * 32];
    tlm_windows(held, B, c.seq, tok, tgt);
    tlm_task k;
    tlm_task_make(&k, 2001, 6, 3);
    mpq_pmpd_schedule sch;
    memset(&sch, 0, sizeof sch);
    sch.nlevels = 1, sch.skip[0] = 1;
    tlm_result r[3];
#ifdef _OPENMP
    const int keep = omp_get_max_threads();
#endif
    for (int run = 0; run < 3; run++) {
#ifdef _OPENMP
        omp_set_num_threads(run == 2 ? 1 : keep);
#endif
        r[run] = tlm_evaluate(&m, &q, &sch, 0, tok, tgt, B, &k);
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
    tlm_task_free(&k);
    free(held);
    tlm_qmodel_free(&q, &c);
    tlm_model_free(&m);
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
    tlm_model m;
    cr_assert_eq(tlm_load(&m, path), 0);
    char *held = tlm_corpus(1001, 1 << 16);
    const int B = 4;
    uint8_t *tok = malloc((size_t)B * m.c.seq);
    int *tgt = malloc(sizeof(int) * B * m.c.seq);
    tlm_windows(held, B, m.c.seq, tok, tgt);
    tlm_acts a;
    cr_assert_eq(tlm_acts_alloc(&m.c, B, &a), 0);
    const double nll = tlm_forward(&m, tok, tgt, &a, B);
    /* uniform bytes would be log 256 = 5.55 nats; the training log ends at 0.884 */
    cr_assert(nll < 1.0, "held-out loss %.4f", nll);
    tlm_acts_free(&a);
    free(tok), free(tgt), free(held);
    tlm_model_free(&m);
}
