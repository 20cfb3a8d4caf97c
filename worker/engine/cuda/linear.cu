// Fully connected layer on the GPU: cuBLAS sgemm (pure FP32 math mode, set
// at init), PyTorch layout w (K, C), out (N, K) = inp w^T + b.
//
// cuBLAS is column-major: a row-major (R, C) matrix is the column-major
// (C, R) one, so every product below is written for the transposes.
#include "cuda_int.h"

__global__ void k_bias_rows(float *out, const float *b, size_t n, int K)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += b[i % K];
}

// db[k] += sum_n dout[n, k], summed in n order like the CPU
__global__ void k_bias_grad(float *db, const float *dout, int N, int K)
{
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= K) return;
    float s = 0.0f;
    for (int n = 0; n < N; n++) s += dout[(size_t)n * K + k];
    db[k] += s;
}

void ps_cu_linear_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                          const float *b, int N, int C, int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (N <= 0 || C <= 0 || K <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    // out^T (K x N) = w (K x C as col-major C x K, transposed) * inp^T (C x N)
    CUBLAS_CHECK(cublasSgemm(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, K, N, C, &one, w, C, inp, C,
                             &zero, out, K));
    if (b) {
        const size_t n = (size_t)N * K;
        k_bias_rows<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, b, n, K);
        CU_LAUNCHED();
    }
}

void ps_cu_linear_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                           const float *dout, const float *inp, const float *w, int N, int C,
                           int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (N <= 0 || C <= 0 || K <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (dinp) // dX^T (C x N) = W^T-as-stored (C x K) * dY^T (K x N); overwrite
        CUBLAS_CHECK(cublasSgemm(s->cublas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, K, &one, w, C, dout,
                                 K, &zero, dinp, C));
    if (dw) // dW^T (C x K) += X^T (C x N) * dY (N x K); accumulate
        CUBLAS_CHECK(cublasSgemm(s->cublas, CUBLAS_OP_N, CUBLAS_OP_T, C, K, N, &one, inp, C, dout,
                                 K, &one, dw, C));
    if (db) {
        k_bias_grad<<<(K + 127) / 128, 128, 0, s->stream>>>(db, dout, N, K);
        CU_LAUNCHED();
    }
}
