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

int ps_pool3d_check(const char *who, const ps_pool3d_desc_t *d, int N, int C, int D, int H,
                    int W)
{
    if (!d || N <= 0 || C <= 0 || D <= 0 || H <= 0 || W <= 0 || d->KT <= 0 || d->R <= 0 ||
        d->S <= 0 || d->stride_t <= 0 || d->stride_h <= 0 || d->stride_w <= 0 ||
        d->pad_t < 0 || d->pad_h < 0 || d->pad_w < 0 || 2 * d->pad_t > d->KT ||
        2 * d->pad_h > d->R || 2 * d->pad_w > d->S ||
        ps_conv_out(D, d->KT, d->stride_t, d->pad_t, 1) <= 0 ||
        ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1) <= 0 ||
        ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1) <= 0) {
        ps_error("%s: invalid window or shape (N=%d C=%d D=%d H=%d W=%d, window %dx%dx%d "
                 "stride %d,%d,%d pad %d,%d,%d; pad must be <= half the window)", who, N, C, D,
                 H, W, d ? d->KT : 0, d ? d->R : 0, d ? d->S : 0, d ? d->stride_t : 0,
                 d ? d->stride_h : 0, d ? d->stride_w : 0, d ? d->pad_t : 0, d ? d->pad_h : 0,
                 d ? d->pad_w : 0);
        return 0;
    }
    return 1;
}

/* The output grid and, for output j, its window clipped to the input:
 * frames [t0,t1), rows [h0,h1), columns [w0,w1). */
typedef struct grid3 { int D, H, W, O, P, Q; } grid3_t;
typedef struct win3 { int t0, t1, h0, h1, w0, w1; } win3_t;

static grid3_t grid(const ps_pool3d_desc_t *d, int D, int H, int W)
{
    grid3_t g = {D, H, W, ps_conv_out(D, d->KT, d->stride_t, d->pad_t, 1),
                 ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1),
                 ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1)};
    return g;
}

static void clip1(int i, int stride, int pad, int k, int in, int *lo, int *hi)
{
    int a = i * stride - pad, b = a + k;
    *lo = a < 0 ? 0 : a;
    *hi = b > in ? in : b;
}

static win3_t window(const ps_pool3d_desc_t *d, const grid3_t *g, size_t j)
{
    win3_t w;
    clip1((int)(j / ((size_t)g->P * g->Q)), d->stride_t, d->pad_t, d->KT, g->D, &w.t0, &w.t1);
    clip1((int)(j / g->Q % g->P), d->stride_h, d->pad_h, d->R, g->H, &w.h0, &w.h1);
    clip1((int)(j % g->Q), d->stride_w, d->pad_w, d->S, g->W, &w.w0, &w.w1);
    return w;
}

/* The divisor of one window: its full size, or its part inside the input. */
static float divisor(const ps_pool3d_desc_t *d, const win3_t *w)
{
    if (d->count_include_pad) return (float)(d->KT * d->R * d->S);
    return (float)((w->t1 - w->t0) * (w->h1 - w->h0) * (w->w1 - w->w0));
}

/* One pass of either forward: max (argmax saved) or average. */
static void pool_forward(int max, float *out, int32_t *argmax, const float *inp,
                         const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    const grid3_t g = grid(d, D, H, W);
    const size_t DHW = (size_t)D * H * W, OPQ = (size_t)g.O * g.P * g.Q;
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        const float *x = inp + (size_t)nc * DHW;
        for (size_t j = 0; j < OPQ; j++) {
            const win3_t b = window(d, &g, j);
            float m = max ? -INFINITY : 0.0f;
            int32_t idx = -1;
            for (int t = b.t0; t < b.t1; t++)
                for (int h = b.h0; h < b.h1; h++)
                    for (int w = b.w0; w < b.w1; w++) {
                        const int32_t i = (int32_t)(((size_t)t * H + h) * W + w);
                        const float v = x[i];
                        if (!max) {
                            m += v;
                        } else if (idx < 0 || v > m || isnan(v)) {
                            m = v;
                            idx = i;
                            if (isnan(v)) goto done;
                        }
                    }
        done:
            out[(size_t)nc * OPQ + j] = max ? m : m / divisor(d, &b);
            if (max) argmax[(size_t)nc * OPQ + j] = idx;
        }
    }
}

void ps_cpu_maxpool3d_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    (void)ctx;
    if (ps_pool3d_check("maxpool3d", d, N, C, D, H, W))
        pool_forward(1, out, argmax, inp, d, N, C, D, H, W);
}

void ps_cpu_maxpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                               const int32_t *argmax, const ps_pool3d_desc_t *d, int N, int C,
                               int D, int H, int W)
{
    (void)ctx;
    if (!dinp || !ps_pool3d_check("maxpool3d", d, N, C, D, H, W)) return;
    const grid3_t g = grid(d, D, H, W);
    const size_t DHW = (size_t)D * H * W, OPQ = (size_t)g.O * g.P * g.Q;
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

void ps_cpu_avgpool3d_forward(ps_ctx_t *ctx, float *out, const float *inp,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    (void)ctx;
    if (ps_pool3d_check("avgpool3d", d, N, C, D, H, W))
        pool_forward(0, out, NULL, inp, d, N, C, D, H, W);
}

void ps_cpu_avgpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                               const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    (void)ctx;
    if (!dinp || !ps_pool3d_check("avgpool3d", d, N, C, D, H, W)) return;
    const grid3_t g = grid(d, D, H, W);
    const size_t DHW = (size_t)D * H * W, OPQ = (size_t)g.O * g.P * g.Q;
#pragma omp parallel for schedule(static)
    for (int nc = 0; nc < N * C; nc++) {
        float *dx = dinp + (size_t)nc * DHW;
        memset(dx, 0, DHW * sizeof(float));
        for (size_t j = 0; j < OPQ; j++) {
            const win3_t b = window(d, &g, j);
            const float gv = dout[(size_t)nc * OPQ + j] / divisor(d, &b);
            for (int t = b.t0; t < b.t1; t++)
                for (int h = b.h0; h < b.h1; h++)
                    for (int w = b.w0; w < b.w1; w++) dx[((size_t)t * H + h) * W + w] += gv;
        }
    }
}
