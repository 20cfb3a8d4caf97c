/* Max pooling (windowed, padded) and global average pooling on the CPU.
 * Max pool padding acts as -inf (PyTorch): a padded position never wins.
 * A NaN in the window wins, as in PyTorch, so NaNs are not hidden. */
#include "cpu_layers.h"
#include "ps_log.h"

#include <math.h>
#include <string.h>

static int pool_valid(const ps_pool_desc_t *d, int N, int C, int H, int W)
{
    if (!d || N <= 0 || C <= 0 || H <= 0 || W <= 0 || d->R <= 0 || d->S <= 0 ||
        d->stride_h <= 0 || d->stride_w <= 0 || d->pad_h < 0 || d->pad_w < 0 ||
        2 * d->pad_h > d->R || 2 * d->pad_w > d->S ||
        ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1) <= 0 ||
        ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1) <= 0) {
        ps_error("maxpool: invalid window or shape (N=%d C=%d H=%d W=%d, window %dx%d "
                 "stride %d,%d pad %d,%d; pad must be <= half the window)", N, C, H, W,
                 d ? d->R : 0, d ? d->S : 0, d ? d->stride_h : 0, d ? d->stride_w : 0,
                 d ? d->pad_h : 0, d ? d->pad_w : 0);
        return 0;
    }
    return 1;
}

void ps_cpu_maxpool_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                            const ps_pool_desc_t *d, int N, int C, int H, int W)
{
    (void)ctx;
    if (!pool_valid(d, N, C, H, W)) return;
    const int P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1);
    const int Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1);
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        const float *x = inp + (size_t)nc * H * W;
        float *y = out + (size_t)nc * P * Q;
        int32_t *am = argmax + (size_t)nc * P * Q;
        for (int p = 0; p < P; p++)
            for (int q = 0; q < Q; q++) {
                const int h0 = p * d->stride_h - d->pad_h, w0 = q * d->stride_w - d->pad_w;
                float m = -INFINITY;
                int32_t idx = -1;
                for (int h = h0 < 0 ? 0 : h0; h < h0 + d->R && h < H; h++)
                    for (int w = w0 < 0 ? 0 : w0; w < w0 + d->S && w < W; w++) {
                        const float v = x[h * W + w];
                        if (idx < 0 || v > m || isnan(v)) {
                            m = v;
                            idx = h * W + w;
                            if (isnan(v)) goto done;
                        }
                    }
            done:
                y[p * Q + q] = m;
                am[p * Q + q] = idx;
            }
    }
}

void ps_cpu_maxpool_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                             const int32_t *argmax, const ps_pool_desc_t *d, int N, int C,
                             int H, int W)
{
    (void)ctx;
    if (!dinp || !pool_valid(d, N, C, H, W)) return;
    const int P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1);
    const int Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1);
    const int HW = H * W;
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        float *dx = dinp + (size_t)nc * HW;
        const float *dy = dout + (size_t)nc * P * Q;
        const int32_t *am = argmax + (size_t)nc * P * Q;
        memset(dx, 0, (size_t)HW * sizeof(float));
        /* windows overlap (3x3 stride 2), so one input can receive several */
        for (int i = 0; i < P * Q; i++)
            if (am[i] >= 0 && am[i] < HW) dx[am[i]] += dy[i];
    }
}

void ps_cpu_avgpool_forward(ps_ctx_t *ctx, float *out, const float *inp, int N, int C, int HW)
{
    (void)ctx;
    if (N <= 0 || C <= 0 || HW <= 0) return;
    const float inv = 1.0f / (float)HW;
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        const float *x = inp + (size_t)nc * HW;
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < HW; i++) s += x[i];
        out[nc] = s * inv;
    }
}

void ps_cpu_avgpool_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int N, int C,
                             int HW)
{
    (void)ctx;
    if (!dinp || N <= 0 || C <= 0 || HW <= 0) return;
    const float inv = 1.0f / (float)HW;
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        float *dx = dinp + (size_t)nc * HW;
        const float g = dout[nc] * inv;
        for (int i = 0; i < HW; i++) dx[i] = g;
    }
}
