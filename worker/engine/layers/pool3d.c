/* Windowed max and average pooling over (frames, height, width) on the
 * CPU, NCDHW.  Max: padding acts as -inf (never wins) and a NaN in the
 * window wins, as in PyTorch, so NaNs are not hidden.  Average: the
 * divisor is the whole window (count_include_pad, PyTorch's default) or
 * the part of it inside the input.  No ceil mode: output sizes are
 * ps_conv_out()'s. */
#include "cpu_layers.h"
#include "ps_log.h"

#include <math.h>
#include <string.h>

static int pool3d_valid(const char *what, const ps_pool3d_desc_t *d, int N, int C, int D,
                        int H, int W)
{
    if (!d || N <= 0 || C <= 0 || D <= 0 || H <= 0 || W <= 0 || d->KT <= 0 || d->R <= 0 ||
        d->S <= 0 || d->stride_t <= 0 || d->stride_h <= 0 || d->stride_w <= 0 ||
        d->pad_t < 0 || d->pad_h < 0 || d->pad_w < 0 || 2 * d->pad_t > d->KT ||
        2 * d->pad_h > d->R || 2 * d->pad_w > d->S ||
        ps_conv_out(D, d->KT, d->stride_t, d->pad_t, 1) <= 0 ||
        ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1) <= 0 ||
        ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1) <= 0) {
        ps_error("%s: invalid window or shape (N=%d C=%d D=%d H=%d W=%d, window %dx%dx%d "
                 "stride %d,%d,%d pad %d,%d,%d; pad must be <= half the window)", what, N, C, D,
                 H, W, d ? d->KT : 0, d ? d->R : 0, d ? d->S : 0, d ? d->stride_t : 0,
                 d ? d->stride_h : 0, d ? d->stride_w : 0, d ? d->pad_t : 0, d ? d->pad_h : 0,
                 d ? d->pad_w : 0);
        return 0;
    }
    return 1;
}

/* Output extent and the clipped window [lo, hi) of output index i on one axis. */
static void window(int i, int stride, int pad, int k, int in, int *lo, int *hi)
{
    int a = i * stride - pad, b = a + k;
    *lo = a < 0 ? 0 : a;
    *hi = b > in ? in : b;
}

typedef struct out3 { int O, P, Q; } out3_t;

static out3_t out_size(const ps_pool3d_desc_t *d, int D, int H, int W)
{
    out3_t o = {ps_conv_out(D, d->KT, d->stride_t, d->pad_t, 1),
                ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1),
                ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1)};
    return o;
}

void ps_cpu_maxpool3d_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    (void)ctx;
    if (!pool3d_valid("maxpool3d", d, N, C, D, H, W)) return;
    const out3_t o = out_size(d, D, H, W);
    const size_t DHW = (size_t)D * H * W, OPQ = (size_t)o.O * o.P * o.Q;
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        const float *x = inp + (size_t)nc * DHW;
        float *y = out + (size_t)nc * OPQ;
        int32_t *am = argmax + (size_t)nc * OPQ;
        size_t j = 0;
        for (int ot = 0; ot < o.O; ot++)
            for (int p = 0; p < o.P; p++)
                for (int q = 0; q < o.Q; q++, j++) {
                    int t0, t1, h0, h1, w0, w1;
                    window(ot, d->stride_t, d->pad_t, d->KT, D, &t0, &t1);
                    window(p, d->stride_h, d->pad_h, d->R, H, &h0, &h1);
                    window(q, d->stride_w, d->pad_w, d->S, W, &w0, &w1);
                    float m = -INFINITY;
                    int32_t idx = -1;
                    for (int t = t0; t < t1; t++)
                        for (int h = h0; h < h1; h++)
                            for (int w = w0; w < w1; w++) {
                                const int32_t i = (int32_t)(((size_t)t * H + h) * W + w);
                                const float v = x[i];
                                if (idx < 0 || v > m || isnan(v)) {
                                    m = v;
                                    idx = i;
                                    if (isnan(v)) goto done;
                                }
                            }
                done:
                    y[j] = m;
                    am[j] = idx;
                }
    }
}

void ps_cpu_maxpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                               const int32_t *argmax, const ps_pool3d_desc_t *d, int N, int C,
                               int D, int H, int W)
{
    (void)ctx;
    if (!dinp || !pool3d_valid("maxpool3d", d, N, C, D, H, W)) return;
    const out3_t o = out_size(d, D, H, W);
    const size_t DHW = (size_t)D * H * W, OPQ = (size_t)o.O * o.P * o.Q;
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        float *dx = dinp + (size_t)nc * DHW;
        const float *dy = dout + (size_t)nc * OPQ;
        const int32_t *am = argmax + (size_t)nc * OPQ;
        memset(dx, 0, DHW * sizeof(float));
        /* windows may overlap, so one input can receive several */
        for (size_t i = 0; i < OPQ; i++)
            if (am[i] >= 0 && (size_t)am[i] < DHW) dx[am[i]] += dy[i];
    }
}

/* The divisor of one window: its full size, or its part inside the input. */
static float divisor(const ps_pool3d_desc_t *d, int t0, int t1, int h0, int h1, int w0, int w1)
{
    if (d->count_include_pad) return (float)(d->KT * d->R * d->S);
    return (float)((t1 - t0) * (h1 - h0) * (w1 - w0));
}

void ps_cpu_avgpool3d_forward(ps_ctx_t *ctx, float *out, const float *inp,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    (void)ctx;
    if (!pool3d_valid("avgpool3d", d, N, C, D, H, W)) return;
    const out3_t o = out_size(d, D, H, W);
    const size_t DHW = (size_t)D * H * W, OPQ = (size_t)o.O * o.P * o.Q;
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        const float *x = inp + (size_t)nc * DHW;
        float *y = out + (size_t)nc * OPQ;
        size_t j = 0;
        for (int ot = 0; ot < o.O; ot++)
            for (int p = 0; p < o.P; p++)
                for (int q = 0; q < o.Q; q++, j++) {
                    int t0, t1, h0, h1, w0, w1;
                    window(ot, d->stride_t, d->pad_t, d->KT, D, &t0, &t1);
                    window(p, d->stride_h, d->pad_h, d->R, H, &h0, &h1);
                    window(q, d->stride_w, d->pad_w, d->S, W, &w0, &w1);
                    float s = 0;
                    for (int t = t0; t < t1; t++)
                        for (int h = h0; h < h1; h++)
                            for (int w = w0; w < w1; w++) s += x[((size_t)t * H + h) * W + w];
                    y[j] = s / divisor(d, t0, t1, h0, h1, w0, w1);
                }
    }
}

void ps_cpu_avgpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                               const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    (void)ctx;
    if (!dinp || !pool3d_valid("avgpool3d", d, N, C, D, H, W)) return;
    const out3_t o = out_size(d, D, H, W);
    const size_t DHW = (size_t)D * H * W, OPQ = (size_t)o.O * o.P * o.Q;
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        float *dx = dinp + (size_t)nc * DHW;
        const float *dy = dout + (size_t)nc * OPQ;
        memset(dx, 0, DHW * sizeof(float));
        size_t j = 0;
        for (int ot = 0; ot < o.O; ot++)
            for (int p = 0; p < o.P; p++)
                for (int q = 0; q < o.Q; q++, j++) {
                    int t0, t1, h0, h1, w0, w1;
                    window(ot, d->stride_t, d->pad_t, d->KT, D, &t0, &t1);
                    window(p, d->stride_h, d->pad_h, d->R, H, &h0, &h1);
                    window(q, d->stride_w, d->pad_w, d->S, W, &w0, &w1);
                    const float g = dy[j] / divisor(d, t0, t1, h0, h1, w0, w1);
                    for (int t = t0; t < t1; t++)
                        for (int h = h0; h < h1; h++)
                            for (int w = w0; w < w1; w++) dx[((size_t)t * H + h) * W + w] += g;
                }
    }
}
