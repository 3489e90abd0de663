/* tinylm (examples/tinylm/model.h): the backward pass against central finite
   differences, in float64, on a small random model with every kind of
   parameter (embedding, gains, the seven linear maps, the head) sampled. */
#define TLM_REAL double
#include "model.h"

#include <criterion/criterion.h>
#include <stdio.h>

static void check_grad(tlm_config c, int B, uint64_t seed)
{
    tlm_model m;
    cr_assert_eq(tlm_model_init(&m, &c), 0);
    tlm_params_init(&c, &m.p, seed);
    uint64_t s = seed * 31 + 7;
    for (size_t i = 0; i < m.p.n; i++) m.p.data[i] += 0.3 * tlm_gauss(&s); /* off the initial symmetry */
    const int M = B * c.seq;
    uint8_t *tok = malloc((size_t)M);
    int *tgt = malloc(sizeof(int) * M);
    for (int i = 0; i < M; i++) tok[i] = (uint8_t)(tlm_rand(&s) % 256), tgt[i] = (int)(tlm_rand(&s) % 256);
    tgt[1] = -1; /* an uncounted position */
    tlm_acts a;
    tlm_grad_work w;
    tlm_params g;
    cr_assert_eq(tlm_acts_alloc(&c, B, &a), 0);
    cr_assert_eq(tlm_grad_work_alloc(&c, B, &w), 0);
    cr_assert_eq(tlm_params_alloc(&c, &g), 0);
    tlm_forward(&m, tok, tgt, &a, B);
    tlm_backward(&m, tok, tgt, &a, &g, &w, B);
    /* every tensor: a few entries each, plus random ones */
    size_t idx[4096];
    int n = 0;
    real *starts[3 + 2 * TLM_MAX_LAYERS + TLM_MAX_LAYERS * TLM_NLIN];
    int ns = 0;
    starts[ns++] = m.p.emb + (size_t)tok[0] * c.dim; /* a row that is used */
    starts[ns++] = m.p.norm_f;
    starts[ns++] = m.p.head;
    for (int l = 0; l < c.layers; l++) {
        starts[ns++] = m.p.norm1[l];
        starts[ns++] = m.p.norm2[l];
        for (int k = 0; k < TLM_NLIN; k++) starts[ns++] = m.p.w[l][k];
    }
    for (int t = 0; t < ns; t++)
        for (int k = 0; k < 6; k++) idx[n++] = (size_t)(starts[t] - m.p.data) + (size_t)(tlm_rand(&s) % (size_t)c.dim);
    while (n < 400) idx[n++] = (size_t)(tlm_rand(&s) % m.p.n);
    double worst = 0;
    for (int k = 0; k < n; k++) {
        const size_t i = idx[k];
        const double keep = m.p.data[i], h = 1e-5;
        m.p.data[i] = keep + h;
        const double lp = tlm_forward(&m, tok, tgt, &a, B);
        m.p.data[i] = keep - h;
        const double lm = tlm_forward(&m, tok, tgt, &a, B);
        m.p.data[i] = keep;
        const double fd = (lp - lm) / (2 * h), an = g.data[i];
        const double err = fabs(fd - an) / (fabs(fd) + fabs(an) + 1e-6);
        worst = err > worst ? err : worst;
        cr_assert(err < 1e-4, "parameter %zu: finite difference %.10g, backward %.10g", i, fd, an);
    }
    cr_log_info("worst relative error over %d parameters: %.3g", n, worst);
    tlm_acts_free(&a);
    tlm_grad_work_free(&w);
    tlm_params_free(&g);
    tlm_model_free(&m);
    free(tok), free(tgt);
}

Test(tinylm, backward_matches_finite_differences)
{
    tlm_config c = {16, 2, 2, 24, 7};
    check_grad(c, 2, 3);
}

Test(tinylm, backward_matches_finite_differences_at_awkward_sizes)
{
    /* dims that are not multiples of the vector width or the 4 x 4 tiles */
    tlm_config c = {18, 3, 3, 22, 5};
    check_grad(c, 3, 11);
}
