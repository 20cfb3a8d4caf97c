// Max and average pooling over (frames, height, width) on the GPU, fp32
// NCDHW, as own kernels (not cuDNN): the argmax the table's contract saves
// is not something cuDNN's pooling returns, and each kernel is a few lines
// that follow the CPU reference (layers/pool3d.c) step for step.
//
// Forward: one thread per output, scanning its window in the CPU's order
// (so the max, its argmax and the average's sum are bit for bit the CPU's).
// Backward: one thread per INPUT element, gathering the outputs whose
// windows hold it in increasing output order -- the order in which the
// CPU's scatter adds them -- so the result is deterministic (no atomics)
// and equal to the CPU's.
#include "cuda_int.h"

#include <math.h>

struct pool3 {
    int D, H, W, O, P, Q;
    int KT, R, S, st, sh, sw, pt, ph, pw, cip;
};

static pool3 make_pool3(const ps_pool3d_desc_t *d, int D, int H, int W)
{
    pool3 p;
    p.D = D, p.H = H, p.W = W;
    p.O = ps_conv_out(D, d->KT, d->stride_t, d->pad_t, 1);
    p.P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1);
    p.Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1);
    p.KT = d->KT, p.R = d->R, p.S = d->S;
    p.st = d->stride_t, p.sh = d->stride_h, p.sw = d->stride_w;
    p.pt = d->pad_t, p.ph = d->pad_h, p.pw = d->pad_w, p.cip = d->count_include_pad;
    return p;
}

static int pool3d_valid(const char *what, const ps_pool3d_desc_t *d, int N, int C, int D, int H,
                        int W)
{
    if (!d || N <= 0 || C <= 0 || D <= 0 || H <= 0 || W <= 0 || d->KT <= 0 || d->R <= 0 ||
        d->S <= 0 || d->stride_t <= 0 || d->stride_h <= 0 || d->stride_w <= 0 ||
        d->pad_t < 0 || d->pad_h < 0 || d->pad_w < 0 || 2 * d->pad_t > d->KT ||
        2 * d->pad_h > d->R || 2 * d->pad_w > d->S ||
        ps_conv_out(D, d->KT, d->stride_t, d->pad_t, 1) <= 0 ||
        ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1) <= 0 ||
        ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1) <= 0) {
        ps_error("%s (cuda): invalid window or shape (N=%d C=%d D=%d H=%d W=%d)", what, N, C, D,
                 H, W);
        return 0;
    }
    return 1;
}

__device__ static void win(int i, int stride, int pad, int k, int in, int *lo, int *hi)
{
    int a = i * stride - pad, b = a + k;
    *lo = a < 0 ? 0 : a;
    *hi = b > in ? in : b;
}

// Outputs o of one axis whose window [o*stride - pad, + k) holds x.
__device__ static void covering(int x, int stride, int pad, int k, int out, int *lo, int *hi)
{
    int a = x + pad - k + 1; // o*stride >= a
    int l = a <= 0 ? 0 : (a + stride - 1) / stride;
    int h = (x + pad) / stride + 1; // o*stride <= x + pad
    *lo = l;
    *hi = h > out ? out : h;
}

__device__ static float divisor3(const pool3 &p, int t0, int t1, int h0, int h1, int w0, int w1)
{
    return p.cip ? (float)(p.KT * p.R * p.S) : (float)((t1 - t0) * (h1 - h0) * (w1 - w0));
}

__global__ void k_maxpool3d_fwd(float *out, int32_t *argmax, const float *inp, size_t n,
                                pool3 p)
{
    const size_t OPQ = (size_t)p.O * p.P * p.Q, DHW = (size_t)p.D * p.H * p.W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t nc = i / OPQ, j = i % OPQ;
        const int ot = (int)(j / ((size_t)p.P * p.Q)), pp = (int)(j / p.Q % p.P),
                  q = (int)(j % p.Q);
        int t0, t1, h0, h1, w0, w1;
        win(ot, p.st, p.pt, p.KT, p.D, &t0, &t1);
        win(pp, p.sh, p.ph, p.R, p.H, &h0, &h1);
        win(q, p.sw, p.pw, p.S, p.W, &w0, &w1);
        const float *x = inp + nc * DHW;
        float m = -INFINITY;
        int32_t idx = -1;
        for (int t = t0; t < t1 && !(idx >= 0 && isnan(m)); t++)
            for (int h = h0; h < h1 && !(idx >= 0 && isnan(m)); h++)
                for (int w = w0; w < w1; w++) {
                    const int32_t k = (int32_t)(((size_t)t * p.H + h) * p.W + w);
                    const float v = x[k];
                    if (idx < 0 || v > m || isnan(v)) {
                        m = v;
                        idx = k;
                        if (isnan(v)) break;
                    }
                }
        out[i] = m;
        argmax[i] = idx;
    }
}

__global__ void k_maxpool3d_bwd(float *dinp, const float *dout, const int32_t *argmax, size_t n,
                                pool3 p)
{
    const size_t OPQ = (size_t)p.O * p.P * p.Q, DHW = (size_t)p.D * p.H * p.W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t nc = i / DHW, k = i % DHW;
        const int t = (int)(k / ((size_t)p.H * p.W)), h = (int)(k / p.W % p.H),
                  w = (int)(k % p.W);
        int o0, o1, p0, p1, q0, q1;
        covering(t, p.st, p.pt, p.KT, p.O, &o0, &o1);
        covering(h, p.sh, p.ph, p.R, p.P, &p0, &p1);
        covering(w, p.sw, p.pw, p.S, p.Q, &q0, &q1);
        const float *dy = dout + nc * OPQ;
        const int32_t *am = argmax + nc * OPQ;
        float g = 0.0f;
        for (int o = o0; o < o1; o++)
            for (int pp = p0; pp < p1; pp++)
                for (int q = q0; q < q1; q++) {
                    const size_t j = ((size_t)o * p.P + pp) * p.Q + q;
                    if (am[j] == (int32_t)k) g += dy[j];
                }
        dinp[i] = g;
    }
}

__global__ void k_avgpool3d_fwd(float *out, const float *inp, size_t n, pool3 p)
{
    const size_t OPQ = (size_t)p.O * p.P * p.Q, DHW = (size_t)p.D * p.H * p.W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t nc = i / OPQ, j = i % OPQ;
        const int ot = (int)(j / ((size_t)p.P * p.Q)), pp = (int)(j / p.Q % p.P),
                  q = (int)(j % p.Q);
        int t0, t1, h0, h1, w0, w1;
        win(ot, p.st, p.pt, p.KT, p.D, &t0, &t1);
        win(pp, p.sh, p.ph, p.R, p.H, &h0, &h1);
        win(q, p.sw, p.pw, p.S, p.W, &w0, &w1);
        const float *x = inp + nc * DHW;
        float s = 0.0f;
        for (int t = t0; t < t1; t++)
            for (int h = h0; h < h1; h++)
                for (int w = w0; w < w1; w++) s += x[((size_t)t * p.H + h) * p.W + w];
        out[i] = s / divisor3(p, t0, t1, h0, h1, w0, w1);
    }
}

__global__ void k_avgpool3d_bwd(float *dinp, const float *dout, size_t n, pool3 p)
{
    const size_t OPQ = (size_t)p.O * p.P * p.Q, DHW = (size_t)p.D * p.H * p.W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t nc = i / DHW, k = i % DHW;
        const int t = (int)(k / ((size_t)p.H * p.W)), h = (int)(k / p.W % p.H),
                  w = (int)(k % p.W);
        int o0, o1, p0, p1, q0, q1;
        covering(t, p.st, p.pt, p.KT, p.O, &o0, &o1);
        covering(h, p.sh, p.ph, p.R, p.P, &p0, &p1);
        covering(w, p.sw, p.pw, p.S, p.Q, &q0, &q1);
        const float *dy = dout + nc * OPQ;
        float g = 0.0f;
        for (int o = o0; o < o1; o++)
            for (int pp = p0; pp < p1; pp++)
                for (int q = q0; q < q1; q++) {
                    int t0, t1, h0, h1, w0, w1;
                    win(o, p.st, p.pt, p.KT, p.D, &t0, &t1);
                    win(pp, p.sh, p.ph, p.R, p.H, &h0, &h1);
                    win(q, p.sw, p.pw, p.S, p.W, &w0, &w1);
                    g += dy[((size_t)o * p.P + pp) * p.Q + q] /
                         divisor3(p, t0, t1, h0, h1, w0, w1);
                }
        dinp[i] = g;
    }
}

void ps_cu_maxpool3d_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                             const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!pool3d_valid("maxpool3d", d, N, C, D, H, W)) return;
    const pool3 p = make_pool3(d, D, H, W);
    const size_t n = (size_t)N * C * p.O * p.P * p.Q;
    k_maxpool3d_fwd<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, argmax, inp, n, p);
    CU_LAUNCHED();
    ps_cu_mark(s, out, 0);
}

void ps_cu_maxpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                              const int32_t *argmax, const ps_pool3d_desc_t *d, int N, int C,
                              int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || !pool3d_valid("maxpool3d", d, N, C, D, H, W)) return;
    const pool3 p = make_pool3(d, D, H, W);
    const size_t n = (size_t)N * C * D * H * W;
    k_maxpool3d_bwd<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(dinp, dout, argmax, n, p);
    CU_LAUNCHED();
    ps_cu_mark(s, dinp, 0);
}

void ps_cu_avgpool3d_forward(ps_ctx_t *ctx, float *out, const float *inp,
                             const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!pool3d_valid("avgpool3d", d, N, C, D, H, W)) return;
    const pool3 p = make_pool3(d, D, H, W);
    const size_t n = (size_t)N * C * p.O * p.P * p.Q;
    k_avgpool3d_fwd<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, inp, n, p);
    CU_LAUNCHED();
    ps_cu_mark(s, out, 0);
}

void ps_cu_avgpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || !pool3d_valid("avgpool3d", d, N, C, D, H, W)) return;
    const pool3 p = make_pool3(d, D, H, W);
    const size_t n = (size_t)N * C * D * H * W;
    k_avgpool3d_bwd<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(dinp, dout, n, p);
    CU_LAUNCHED();
    ps_cu_mark(s, dinp, 0);
}
