/* Transposed convolution whose kernel equals its stride (contract in
 * ps_engine.h; Mask R-CNN's ConvTranspose2d(C, K, 2, stride 2)), on the
 * CPU.  The windows do not overlap, so per image the layer is one GEMM:
 * col (K*s*s, H*W) = w^T (K*s*s x C) . inp (C x H*W), whose row (k, i, j)
 * is the output plane k's pixels (s*y + i, s*x + j); backward gathers
 * dout into that layout and runs the two transposed GEMMs.  col lives in
 * ctx's workspace (K*s*s*H*W floats; grown, with a warning, when a caller
 * sized it smaller).  The copies between col and the planes are plain
 * loops: a parallel region per image (hundreds of RoIs a call) would cost
 * more in thread wake-ups than the copies themselves. */
#include "cpu_layers.h"
#include "worker/engine/ps_blas.h"

#include "ps_log.h"

static float *col_buffer(ps_ctx_t *ctx, size_t need)
{
    if (ctx->workspace_numel < need) {
        static int warned; /* once: a caller that never reserves would flood the log */
        if (!warned++)
            ps_warn("deconv: workspace of %zu floats < %zu needed; growing it",
                    ctx->workspace_numel, need);
        if (ps_ctx_reserve(ctx, need)) return NULL;
    }
    return ctx->workspace;
}

static int bad_shape(const char *who, int N, int C, int K, int H, int W, int s)
{
    if (N > 0 && C > 0 && K > 0 && H > 0 && W > 0 && s > 0) return 0;
    ps_error("%s: invalid shape N=%d C=%d K=%d %dx%d stride %d", who, N, C, K, H, W, s);
    return 1;
}

void ps_cpu_deconv_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, int N, int C, int K, int H, int W, int s)
{
    if (bad_shape("deconv", N, C, K, H, W, s)) return;
    int HW = H * W, Kss = K * s * s, OW = W * s;
    float *col = col_buffer(ctx, (size_t)Kss * HW);
    if (!col) return;
    for (int n = 0; n < N; n++) {
        ps_blas_sgemm(1, 0, Kss, HW, C, 1.0f, w, Kss, inp + (size_t)n * C * HW, HW, 0.0f, col,
                      HW);
        float *o = out + (size_t)n * K * HW * s * s;
        for (int k = 0; k < K; k++) {
            float bias = b ? b[k] : 0.0f;
            float *plane = o + (size_t)k * HW * s * s;
            for (int i = 0; i < s; i++)
                for (int j = 0; j < s; j++) {
                    const float *row = col + ((size_t)(k * s + i) * s + j) * HW;
                    for (int y = 0; y < H; y++)
                        for (int x = 0; x < W; x++)
                            plane[(size_t)(s * y + i) * OW + s * x + j] = row[y * W + x] + bias;
                }
        }
    }
}

void ps_cpu_deconv_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w, int N, int C,
                            int K, int H, int W, int s)
{
    if (bad_shape("deconv backward", N, C, K, H, W, s)) return;
    int HW = H * W, Kss = K * s * s, OW = W * s;
    float *col = col_buffer(ctx, (size_t)Kss * HW);
    if (!col) return;
    for (int n = 0; n < N; n++) {
        const float *o = dout + (size_t)n * K * HW * s * s;
        for (int k = 0; k < K; k++) {
            const float *plane = o + (size_t)k * HW * s * s;
            for (int i = 0; i < s; i++)
                for (int j = 0; j < s; j++) {
                    float *row = col + ((size_t)(k * s + i) * s + j) * HW;
                    for (int y = 0; y < H; y++)
                        for (int x = 0; x < W; x++)
                            row[y * W + x] = plane[(size_t)(s * y + i) * OW + s * x + j];
                }
            if (db) {
                float sum = 0;
                for (size_t p = 0; p < (size_t)HW * s * s; p++) sum += plane[p];
                db[k] += sum;
            }
        }
        /* dinp (C, HW) = w (C x Kss) . col;  dw (C, Kss) += inp (C x HW) . col^T */
        if (dinp)
            ps_blas_sgemm(0, 0, C, HW, Kss, 1.0f, w, Kss, col, HW, 0.0f,
                          dinp + (size_t)n * C * HW, HW);
        if (dw)
            ps_blas_sgemm(0, 1, C, Kss, HW, 1.0f, inp + (size_t)n * C * HW, HW, col, HW, 1.0f,
                          dw, Kss);
    }
}
