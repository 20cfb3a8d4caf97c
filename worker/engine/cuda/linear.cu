// Fully connected layer on the GPU: cuBLAS sgemm (pure FP32 math mode, set
// at init), PyTorch layout w (K, C), out (N, K) = inp w^T + b.  With
// --precision fp16|bf16 (mixed.cu): cublasGemmEx on half copies of the
// operands with fp32 accumulation and fp32 output (tensor cores), so out,
// dinp and the accumulated dw stay fp32 without a cast back.
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

static cudaDataType_t half_type(const ps_cu_state *s)
{
    return s->prec == PS_PRECISION_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

// C (m x n, fp32, column-major, ldc) = alpha op(A) op(B) + beta C, A and B
// half (the state's precision), fp32 compute.
// half_c: C is half too (half storage of an activation gradient).
static void gemm_half(ps_cu_state *s, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                      int k, const void *A, int lda, const void *B, int ldb, float beta,
                      void *C, int ldc, int half_c)
{
    const float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(s->cublas, ta, tb, m, n, k, &one, A, half_type(s), lda, B,
                              half_type(s), ldb, &beta, C, half_c ? half_type(s) : CUDA_R_32F,
                              ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void ps_cu_linear_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                          const float *b, int N, int C, int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (N <= 0 || C <= 0 || K <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    // out^T (K x N) = w (K x C as col-major C x K, transposed) * inp^T (C x N)
    if (s->prec != PS_PRECISION_FP32) {
        // half storage: a half input (N, C) is read as it is; the output
        // (the logits) is fp32 by design
        const int hin = ps_cu_is_half(s, inp);
        void *xh = hin ? (void *)inp : ps_cu_half_buf(s, PS_CU_H_X, (size_t)N * C);
        void *wh = ps_cu_half_buf(s, PS_CU_H_W, (size_t)K * C);
        if (!hin) ps_cu_to_half(s, xh, inp, 1, 1, N * C, 0); // plain casts, same layout
        ps_cu_to_half(s, wh, w, 1, 1, K * C, 0);
        gemm_half(s, CUBLAS_OP_T, CUBLAS_OP_N, K, N, C, wh, C, xh, C, 0.0f, out, K, 0);
        ps_cu_mark(s, out, 0);
    } else {
        CUBLAS_CHECK(cublasSgemm(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, K, N, C, &one, w, C, inp,
                                 C, &zero, out, K));
    }
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
    if (ps_cu_is_half(s, dout)) { // linear's output is fp32, so is its gradient
        ps_cu_half_mismatch("linear_backward");
        return;
    }
    if (s->prec != PS_PRECISION_FP32 && (dinp || dw)) {
        const int hin = ps_cu_is_half(s, inp); // then dinp is written half too
        void *dyh = ps_cu_half_buf(s, PS_CU_H_Y, (size_t)N * K);
        ps_cu_to_half(s, dyh, dout, 1, 1, N * K, 0);
        if (dinp) {
            void *wh = ps_cu_half_buf(s, PS_CU_H_W, (size_t)K * C);
            ps_cu_to_half(s, wh, w, 1, 1, K * C, 0);
            gemm_half(s, CUBLAS_OP_N, CUBLAS_OP_N, C, N, K, wh, C, dyh, K, 0.0f, dinp, C, hin);
            ps_cu_mark(s, dinp, hin);
        }
        if (dw) {
            void *xh = hin ? (void *)inp : ps_cu_half_buf(s, PS_CU_H_X, (size_t)N * C);
            if (!hin) ps_cu_to_half(s, xh, inp, 1, 1, N * C, 0);
            gemm_half(s, CUBLAS_OP_N, CUBLAS_OP_T, C, K, N, xh, C, dyh, K, 1.0f, dw, C, 0);
        }
        dinp = dw = NULL; // done
    }
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
