/* Fully connected layer, PyTorch layout: w (K, C), out = inp w^T + b. */
#include "cpu_layers.h"
#include "worker/engine/ps_blas.h"

void ps_cpu_linear_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, int N, int C, int K)
{
    (void)ctx;
    if (N <= 0 || C <= 0 || K <= 0) return;
    ps_blas_sgemm(0, 1, N, K, C, 1.0f, inp, C, w, C, 0.0f, out, K);
    if (b)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) out[(size_t)n * K + k] += b[k];
}

void ps_cpu_linear_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w, int N, int C,
                            int K)
{
    (void)ctx;
    if (N <= 0 || C <= 0 || K <= 0) return;
    if (dinp) /* dX (N,C) = dY (N,K) W (K,C) */
        ps_blas_sgemm(0, 0, N, C, K, 1.0f, dout, K, w, C, 0.0f, dinp, C);
    if (dw) /* dW (K,C) += dY^T X */
        ps_blas_sgemm(1, 0, K, C, N, 1.0f, dout, K, inp, C, 1.0f, dw, C);
    if (db)
        for (int k = 0; k < K; k++) {
            float s = 0;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * K + k];
            db[k] += s;
        }
}
