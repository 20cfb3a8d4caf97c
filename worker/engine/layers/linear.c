/* Fully connected layer, PyTorch layout: w (K, C), out = inp w^T + b.
 *
 * At bf16 precision (set_precision on a CPU with native bf16) the
 * operands of each product are rounded to bf16 (round to nearest even)
 * and the product accumulates in fp32: conv2d's half-precision contract.
 * The fc layer is small next to the convolutions, so rounded fp32 copies
 * and the fp32 GEMM do it exactly, without a bf16 GEMM. */
#include "conv_provider.h"
#include "cpu_layers.h"
#include "ps_half.h"
#include "worker/engine/ps_blas.h"

/* dst = src rounded to bf16, kept as fp32 */
static void round_bf16(float *dst, const float *src, size_t n)
{
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = ps_bf16_to_fp32_1(ps_fp32_to_bf16_1(src[i]));
}

/* 1 when ctx computes at bf16 */
static int bf16(ps_ctx_t *ctx)
{
    const ps_cpu_state_t *st = ctx ? ctx->cpu_state : NULL;
    return st && st->precision == PS_PRECISION_BF16;
}

/* The operands a..c (sizes na..nc, any may be NULL / 0) rounded to bf16
 * into ctx's scratch; the pointers are replaced.  0, or -1 when out of
 * memory (logged: the caller computes in fp32). */
static int round_operands(ps_ctx_t *ctx, const float **a, size_t na, const float **b, size_t nb,
                          const float **c, size_t nc)
{
    float *s = ps_cpu_scratch(ctx, na + nb + nc);
    if (!s) return -1;
    if (*a) round_bf16(s, *a, na), *a = s;
    if (b && *b) round_bf16(s + na, *b, nb), *b = s + na;
    if (c && *c) round_bf16(s + na + nb, *c, nc), *c = s + na + nb;
    return 0;
}

void ps_cpu_linear_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, int N, int C, int K)
{
    if (N <= 0 || C <= 0 || K <= 0) return;
    if (bf16(ctx)) round_operands(ctx, &inp, (size_t)N * C, &w, (size_t)K * C, NULL, 0);
    ps_blas_sgemm(0, 1, N, K, C, 1.0f, inp, C, w, C, 0.0f, out, K);
    if (b)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) out[(size_t)n * K + k] += b[k];
}

void ps_cpu_linear_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w, int N, int C,
                            int K)
{
    if (N <= 0 || C <= 0 || K <= 0) return;
    if (db) /* from the unrounded gradient, like every parameter gradient's sum */
        for (int k = 0; k < K; k++) {
            float s = 0;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * K + k];
            db[k] += s;
        }
    if (bf16(ctx))
        round_operands(ctx, &dout, (size_t)N * K, dinp ? &w : NULL, (size_t)K * C,
                       dw ? &inp : NULL, (size_t)N * C);
    if (dinp) /* dX (N,C) = dY (N,K) W (K,C) */
        ps_blas_sgemm(0, 0, N, C, K, 1.0f, dout, K, w, C, 0.0f, dinp, C);
    if (dw) /* dW (K,C) += dY^T X */
        ps_blas_sgemm(1, 0, K, C, N, 1.0f, dout, K, inp, C, 1.0f, dw, C);
}
