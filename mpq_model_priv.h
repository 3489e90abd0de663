/* mpq_model_priv.h - what the forward pass (mpq_model.c) shares with the
   calibration passes (mpq_calib.c). Not part of the API: nothing outside
   those files includes it. */
#ifndef MPQ_MODEL_PRIV_H_INCLUDED
#define MPQ_MODEL_PRIV_H_INCLUDED

/* Y[T x M] = X[T x K] W[M x K]^T in float, OpenMP over M; every output is
   one dot product in a fixed order, whatever the thread count. */
void mpq__sgemm(const float *X, int T, const float *W, int M, int K, float *Y);
/* y = x / sqrt(mean(x^2) + eps) * w for T rows of D. */
void mpq__rmsnorm(const float *x, const float *w, float *y, int T, int D, double eps);
/* -log softmax(z)[target], in double. */
double mpq__nll(const float *z, int n, int target);

#endif /* MPQ_MODEL_PRIV_H_INCLUDED */
