/* mpq_model_priv.h - what the forward pass (mpq_model.c) shares with the
   calibration passes (mpq_calib.c). Not part of the API: nothing outside
   those files includes it. */
#ifndef MPQ_MODEL_PRIV_H_INCLUDED
#define MPQ_MODEL_PRIV_H_INCLUDED

#include "mpq_model.h"
#include "mpq_priv.h"

/* Seconds on a monotonic clock. */
double mpq__now(void);

/* Y[T x M] = X[T x K] W[M x K]^T in float, OpenMP over M; every output is
   one dot product in a fixed order, whatever the thread count. */
void mpq__sgemm(const float *X, int T, const float *W, int M, int K, float *Y);
/* The same product with map L's weights, float (L->W) or in place (L->Ws,
   converted four rows at a time: the same bits). */
mpq_status mpq__sgemm_lin(const mpq_linear *L, const float *X, int T, float *Y);
/* y = x / sqrt(mean(x^2) + eps) * w for T rows of D. */
void mpq__rmsnorm(const float *x, const float *w, float *y, int T, int D, double eps);
/* The cos (first half of each row) and sin (second half) of the rotary
   angles of positions pos .. pos + T - 1: T x head_dim. */
void mpq__rope_table(const mpq_llm *m, int pos, int T, float *rope);
/* Rotates nh heads of T tokens (rope: T x head_dim, the cos of each
   position's angles in the first half, the sin in the second) in the
   model's pair convention; inverse: by minus the angles, the transpose
   (for gradients). */
void mpq__rotate(const mpq_llm_config *c, const float *rope, float *v, int T, int nh, int inverse);
/* -log softmax(z)[target], in double. */
double mpq__nll(const float *z, int n, int target);
/* The JSON object {keys[i]: vals[i] ..., "source": extra} that a file mpq
   writes keeps in its __metadata__ (*json malloc'ed; extra_json, may be
   NULL, must parse: MPQ_ERR_ARG naming path otherwise). */
mpq_status mpq__meta_json(const char *const *keys, const double *vals, int n, const char *extra_json, const char *path,
                          char **json, mpq_io_err *err);

#endif /* MPQ_MODEL_PRIV_H_INCLUDED */
