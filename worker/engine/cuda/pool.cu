// Max pooling (with argmax, -inf padding, NaN wins) and global average
// pooling on the GPU; the same results as layers/pool.c, element for
// element (the max scan and the backward's summation order are the CPU's).
#include "cuda_int.h"
#include "half.cuh"

static int pool_valid(const ps_pool_desc_t *d, int N, int C, int H, int W)
{
    if (!d || N <= 0 || C <= 0 || H <= 0 || W <= 0 || d->R <= 0 || d->S <= 0 ||
        d->stride_h <= 0 || d->stride_w <= 0 || d->pad_h < 0 || d->pad_w < 0 ||
        2 * d->pad_h > d->R || 2 * d->pad_w > d->S ||
        ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1) <= 0 ||
        ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1) <= 0) {
        ps_error("maxpool (cuda): invalid window or shape (N=%d C=%d H=%d W=%d)", N, C, H, W);
        return 0;
    }
    return 1;
}

// one thread per output element; scan order and tie rule of the CPU:
// the first strictly greater value wins, a NaN wins at once
__global__ void k_maxpool_fwd(float *out, int32_t *argmax, const float *inp, size_t n, int H,
                              int W, int P, int Q, int R, int S, int sh, int sw, int ph, int pw)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int q = (int)(i % Q), p = (int)((i / Q) % P);
        const float *x = inp + (i / ((size_t)P * Q)) * (size_t)H * W;
        const int h0 = p * sh - ph, w0 = q * sw - pw;
        float m = -INFINITY;
        int32_t idx = -1;
        for (int h = h0 < 0 ? 0 : h0; h < h0 + R && h < H; h++)
            for (int w = w0 < 0 ? 0 : w0; w < w0 + S && w < W; w++) {
                const float v = x[h * W + w];
                if (idx < 0 || v > m || isnan(v)) {
                    m = v;
                    idx = h * W + w;
                    if (isnan(v)) goto done;
                }
            }
    done:
        out[i] = m;
        argmax[i] = idx;
    }
}

// one thread per INPUT element: gathers the windows that chose it, in
// increasing output index (no atomics, deterministic, the CPU's order)
__global__ void k_maxpool_bwd(float *dinp, const float *dout, const int32_t *argmax, size_t n,
                              int H, int W, int P, int Q, int R, int S, int sh, int sw, int ph,
                              int pw)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int w = (int)(i % W), h = (int)((i / W) % H);
        const size_t plane = i / ((size_t)H * W);
        const float *dy = dout + plane * P * Q;
        const int32_t *am = argmax + plane * P * Q;
        // outputs p with p*sh - ph <= h <= p*sh - ph + R - 1
        int p_lo = h + ph - R + 1, q_lo = w + pw - S + 1;
        p_lo = p_lo <= 0 ? 0 : (p_lo + sh - 1) / sh;
        q_lo = q_lo <= 0 ? 0 : (q_lo + sw - 1) / sw;
        int p_hi = (h + ph) / sh, q_hi = (w + pw) / sw;
        if (p_hi > P - 1) p_hi = P - 1;
        if (q_hi > Q - 1) q_hi = Q - 1;
        const int32_t me = h * W + w;
        float s = 0.0f;
        for (int p = p_lo; p <= p_hi; p++)
            for (int q = q_lo; q <= q_hi; q++)
                if (am[p * Q + q] == me) s += dy[p * Q + q];
        dinp[i] = s;
    }
}

// ---- half storage twins (half.cuh): NHWC planes, element (img, h, w, c) at
// ((img*H + h)*W + w)*C + c; one thread per element with the channel
// fastest (coalesced).  argmax keeps the CPU's meaning (h*W + w in the
// (img, c) plane), stored in the output's NHWC order.
template <class T>
__global__ void k_h_maxpool_fwd(void *out_, int32_t *argmax, const void *inp_, size_t n, int C,
                                int H, int W, int P, int Q, int R, int S, int sh, int sw,
                                int ph, int pw)
{
    T *out = (T *)out_;
    const T *inp = (const T *)inp_;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C), q = (int)((i / C) % Q), p = (int)((i / ((size_t)C * Q)) % P);
        const T *x = inp + (i / ((size_t)C * P * Q)) * (size_t)H * W * C + c;
        const int h0 = p * sh - ph, w0 = q * sw - pw;
        float m = -INFINITY;
        int32_t idx = -1;
        for (int h = h0 < 0 ? 0 : h0; h < h0 + R && h < H; h++)
            for (int w = w0 < 0 ? 0 : w0; w < w0 + S && w < W; w++) {
                const float v = ld(x[(size_t)(h * W + w) * C]);
                if (idx < 0 || v > m || isnan(v)) {
                    m = v;
                    idx = h * W + w;
                    if (isnan(v)) goto done;
                }
            }
    done:
        st(&out[i], m);
        argmax[i] = idx;
    }
}
template <class T>
__global__ void k_h_maxpool_bwd(void *dinp_, const void *dout_, const int32_t *argmax, size_t n,
                                int C, int H, int W, int P, int Q, int R, int S, int sh, int sw,
                                int ph, int pw)
{
    T *dinp = (T *)dinp_;
    const T *dout = (const T *)dout_;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C), w = (int)((i / C) % W), h = (int)((i / ((size_t)C * W)) % H);
        const size_t img = i / ((size_t)C * H * W);
        const T *dy = dout + img * P * Q * C + c;
        const int32_t *am = argmax + img * P * Q * C + c;
        int p_lo = h + ph - R + 1, q_lo = w + pw - S + 1;
        p_lo = p_lo <= 0 ? 0 : (p_lo + sh - 1) / sh;
        q_lo = q_lo <= 0 ? 0 : (q_lo + sw - 1) / sw;
        int p_hi = (h + ph) / sh, q_hi = (w + pw) / sw;
        if (p_hi > P - 1) p_hi = P - 1;
        if (q_hi > Q - 1) q_hi = Q - 1;
        const int32_t me = h * W + w;
        float s = 0.0f;
        for (int p = p_lo; p <= p_hi; p++)
            for (int q = q_lo; q <= q_hi; q++)
                if (am[(size_t)(p * Q + q) * C] == me) s += ld(dy[(size_t)(p * Q + q) * C]);
        st(&dinp[i], s);
    }
}
// global average pool: one thread per (img, c), reading across the pixels
// with the channel fastest (neighbouring threads, neighbouring addresses)
template <class T>
__global__ void k_h_avgpool_fwd(void *out_, const void *inp_, size_t planes, int C, int HW,
                                float inv)
{
    T *out = (T *)out_;
    const T *inp = (const T *)inp_;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < planes;
         i += (size_t)gridDim.x * blockDim.x) {
        const T *x = inp + (i / C) * (size_t)HW * C + i % C;
        float s = 0.0f;
        for (int p = 0; p < HW; p++) s += ld(x[(size_t)p * C]);
        st(&out[i], s * inv);
    }
}
template <class T>
__global__ void k_h_avgpool_bwd(void *dinp_, const void *dout_, size_t n, int C, int HW,
                                float inv)
{
    T *dinp = (T *)dinp_;
    const T *dout = (const T *)dout_;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st(&dinp[i], ld(dout[(i / ((size_t)HW * C)) * C + i % C]) * inv);
}

// Half storage: mark out with inp's storage; 1 = run the half kernel.
static int pool_half(ps_cu_state *s, void *out, const void *inp)
{
    if (!s->hstore) return 0;
    const int h = ps_cu_is_half(s, inp);
    ps_cu_mark(s, out, h);
    return h;
}

void ps_cu_maxpool_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                           const ps_pool_desc_t *d, int N, int C, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!pool_valid(d, N, C, H, W)) return;
    const int P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1);
    const int Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1);
    const size_t n = (size_t)N * C * P * Q;
    if (pool_half(s, out, inp)) {
        HLAUNCH(k_h_maxpool_fwd, n, out, argmax, inp, n, C, H, W, P, Q, d->R, d->S, d->stride_h,
                d->stride_w, d->pad_h, d->pad_w);
        return;
    }
    k_maxpool_fwd<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(
        out, argmax, inp, n, H, W, P, Q, d->R, d->S, d->stride_h, d->stride_w, d->pad_h,
        d->pad_w);
    CU_LAUNCHED();
}

void ps_cu_maxpool_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                            const int32_t *argmax, const ps_pool_desc_t *d, int N, int C,
                            int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || !pool_valid(d, N, C, H, W)) return;
    const int P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1);
    const int Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1);
    const size_t n = (size_t)N * C * H * W;
    if (pool_half(s, dinp, dout)) {
        HLAUNCH(k_h_maxpool_bwd, n, dinp, dout, argmax, n, C, H, W, P, Q, d->R, d->S,
                d->stride_h, d->stride_w, d->pad_h, d->pad_w);
        return;
    }
    k_maxpool_bwd<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(
        dinp, dout, argmax, n, H, W, P, Q, d->R, d->S, d->stride_h, d->stride_w, d->pad_h,
        d->pad_w);
    CU_LAUNCHED();
}

// one warp per (n, c) plane
__global__ void k_avgpool_fwd(float *out, const float *inp, size_t planes, int HW, float inv)
{
    const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (warp >= planes) return; // whole warps leave together (blockDim % 32 == 0)
    const float *x = inp + warp * HW;
    float s = 0.0f;
    for (int i = lane; i < HW; i += 32) s += x[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) out[warp] = s * inv;
}

__global__ void k_avgpool_bwd(float *dinp, const float *dout, size_t n, int HW, float inv)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dinp[i] = dout[i / HW] * inv;
}

void ps_cu_avgpool_forward(ps_ctx_t *ctx, float *out, const float *inp, int N, int C, int HW)
{
    ps_cu_state *s = cu_state(ctx);
    if (N <= 0 || C <= 0 || HW <= 0) return;
    const size_t planes = (size_t)N * C;
    if (pool_half(s, out, inp)) {
        HLAUNCH(k_h_avgpool_fwd, planes, out, inp, planes, C, HW, 1.0f / (float)HW);
        return;
    }
    const size_t threads = planes * 32;
    const size_t blocks = (threads + CU_BLOCK - 1) / CU_BLOCK;
    k_avgpool_fwd<<<(unsigned)blocks, CU_BLOCK, 0, s->stream>>>(out, inp, planes, HW,
                                                                1.0f / (float)HW);
    CU_LAUNCHED();
}

void ps_cu_avgpool_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int N, int C, int HW)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || N <= 0 || C <= 0 || HW <= 0) return;
    const size_t n = (size_t)N * C * HW;
    if (pool_half(s, dinp, dout)) {
        HLAUNCH(k_h_avgpool_bwd, n, dinp, dout, n, C, HW, 1.0f / (float)HW);
        return;
    }
    k_avgpool_bwd<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(dinp, dout, n, HW,
                                                                    1.0f / (float)HW);
    CU_LAUNCHED();
}
