// Max and average pooling over (frames, height, width) on the GPU, fp32
// NCDHW, as own kernels (not cuDNN): the argmax the table's contract saves
// is not something cuDNN's pooling returns, and each kernel follows the
// CPU reference (layers/pool3d.c) step for step.
//
// Forward: one thread per output, scanning its window in the CPU's order
// (so the max, its argmax and the average's sum are bit for bit the CPU's).
// Backward: one thread per INPUT element, gathering the outputs whose
// windows hold it in increasing output order -- the order in which the
// CPU's scatter adds them -- so the result is deterministic (no atomics)
// and equal to the CPU's.  One template per direction, MAX choosing the
// kind (the loops are the same).
#include "cuda_int.h"

#include <math.h>

struct pool3 {
    int D, H, W, O, P, Q;
    int KT, R, S, st, sh, sw, pt, ph, pw, cip;
};

// a window or a range of outputs: [t0,t1) x [h0,h1) x [w0,w1)
struct box3 {
    int t0, t1, h0, h1, w0, w1;
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

__device__ __forceinline__ void p3_clip(int i, int stride, int pad, int k, int in, int *lo,
                                        int *hi)
{
    int a = i * stride - pad, b = a + k;
    *lo = a < 0 ? 0 : a;
    *hi = b > in ? in : b;
}

// The window of output j (within a plane), clipped to the input.
__device__ __forceinline__ box3 p3_window(const pool3 &p, size_t j)
{
    box3 b;
    p3_clip((int)(j / ((size_t)p.P * p.Q)), p.st, p.pt, p.KT, p.D, &b.t0, &b.t1);
    p3_clip((int)(j / p.Q % p.P), p.sh, p.ph, p.R, p.H, &b.h0, &b.h1);
    p3_clip((int)(j % p.Q), p.sw, p.pw, p.S, p.W, &b.w0, &b.w1);
    return b;
}

// Outputs o of one axis whose window [o*stride - pad, + k) holds x.
__device__ __forceinline__ void p3_cover(int x, int stride, int pad, int k, int out, int *lo,
                                         int *hi)
{
    int a = x + pad - k + 1; // o*stride >= a
    int h = (x + pad) / stride + 1; // o*stride <= x + pad
    *lo = a <= 0 ? 0 : (a + stride - 1) / stride;
    *hi = h > out ? out : h;
}

// The outputs whose windows hold input k (within a plane).
__device__ __forceinline__ box3 p3_covering(const pool3 &p, size_t k)
{
    box3 b;
    p3_cover((int)(k / ((size_t)p.H * p.W)), p.st, p.pt, p.KT, p.O, &b.t0, &b.t1);
    p3_cover((int)(k / p.W % p.H), p.sh, p.ph, p.R, p.P, &b.h0, &b.h1);
    p3_cover((int)(k % p.W), p.sw, p.pw, p.S, p.Q, &b.w0, &b.w1);
    return b;
}

__device__ __forceinline__ float p3_divisor(const pool3 &p, const box3 &b)
{
    return p.cip ? (float)(p.KT * p.R * p.S)
                 : (float)((b.t1 - b.t0) * (b.h1 - b.h0) * (b.w1 - b.w0));
}

template <bool MAX>
__global__ void k_pool3d_fwd(float *out, int32_t *argmax, const float *inp, size_t n, pool3 p)
{
    const size_t OPQ = (size_t)p.O * p.P * p.Q, DHW = (size_t)p.D * p.H * p.W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const box3 b = p3_window(p, i % OPQ);
        const float *x = inp + i / OPQ * DHW;
        float m = MAX ? -INFINITY : 0.0f;
        int32_t idx = -1;
        for (int t = b.t0; t < b.t1 && !(MAX && idx >= 0 && isnan(m)); t++)
            for (int h = b.h0; h < b.h1 && !(MAX && idx >= 0 && isnan(m)); h++)
                for (int w = b.w0; w < b.w1; w++) {
                    const int32_t k = (int32_t)(((size_t)t * p.H + h) * p.W + w);
                    const float v = x[k];
                    if (!MAX) {
                        m += v;
                    } else if (idx < 0 || v > m || isnan(v)) {
                        m = v;
                        idx = k;
                        if (isnan(v)) break;
                    }
                }
        if (MAX) {
            out[i] = m;
            argmax[i] = idx;
        } else {
            out[i] = m / p3_divisor(p, b);
        }
    }
}

template <bool MAX>
__global__ void k_pool3d_bwd(float *dinp, const float *dout, const int32_t *argmax, size_t n,
                             pool3 p)
{
    const size_t OPQ = (size_t)p.O * p.P * p.Q, DHW = (size_t)p.D * p.H * p.W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t k = i % DHW, base = i / DHW * OPQ;
        const box3 c = p3_covering(p, k);
        float g = 0.0f;
        for (int o = c.t0; o < c.t1; o++)
            for (int q = c.h0; q < c.h1; q++)
                for (int r = c.w0; r < c.w1; r++) {
                    const size_t j = ((size_t)o * p.P + q) * p.Q + r;
                    if (!MAX)
                        g += dout[base + j] / p3_divisor(p, p3_window(p, j));
                    else if (argmax[base + j] == (int32_t)k)
                        g += dout[base + j];
                }
        dinp[i] = g;
    }
}

void ps_cu_maxpool3d_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                             const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!ps_pool3d_check("maxpool3d (cuda)", d, N, C, D, H, W)) return;
    const pool3 p = make_pool3(d, D, H, W);
    const size_t n = (size_t)N * C * p.O * p.P * p.Q;
    k_pool3d_fwd<true><<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, argmax, inp, n, p);
    CU_LAUNCHED();
    ps_cu_mark(s, out, 0);
}

void ps_cu_maxpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                              const int32_t *argmax, const ps_pool3d_desc_t *d, int N, int C,
                              int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || !ps_pool3d_check("maxpool3d (cuda)", d, N, C, D, H, W)) return;
    const pool3 p = make_pool3(d, D, H, W);
    const size_t n = (size_t)N * C * D * H * W;
    k_pool3d_bwd<true><<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(dinp, dout, argmax, n,
                                                                          p);
    CU_LAUNCHED();
    ps_cu_mark(s, dinp, 0);
}

void ps_cu_avgpool3d_forward(ps_ctx_t *ctx, float *out, const float *inp,
                             const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!ps_pool3d_check("avgpool3d (cuda)", d, N, C, D, H, W)) return;
    const pool3 p = make_pool3(d, D, H, W);
    const size_t n = (size_t)N * C * p.O * p.P * p.Q;
    k_pool3d_fwd<false><<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, NULL, inp, n, p);
    CU_LAUNCHED();
    ps_cu_mark(s, out, 0);
}

void ps_cu_avgpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || !ps_pool3d_check("avgpool3d (cuda)", d, N, C, D, H, W)) return;
    const pool3 p = make_pool3(d, D, H, W);
    const size_t n = (size_t)N * C * D * H * W;
    k_pool3d_bwd<false><<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(dinp, dout, NULL, n, p);
    CU_LAUNCHED();
    ps_cu_mark(s, dinp, 0);
}
