// conv2d on the GPU through cuDNN's descriptor API (why this API and not
// the graph API: see the top of backend_cuda.cu and docs/cuda.md).
//
// Each distinct shape (N,C,H,W,K,R,S,stride,pad,dilation,groups) gets its
// descriptors and three algorithms chosen ONCE from cuDNN's heuristics
// (cudnnGet*Algorithm_v7, no timing runs: deterministic and cheap at model
// build) and cached: the first algorithm in cuDNN's ranking that succeeds,
// uses FP32 FMA math (no TF32, for parity with the CPU) and whose workspace
// fits under the state's limit.  The one workspace buffer grows to the
// largest chosen need, so device memory for convolutions is bounded.
//
// --precision fp16|bf16 (mixed.cu): the same calls on half copies of the
// operands (NHWC, fp32 compute type, tensor-op math allowed), cast on the
// fly; results widened back to the fp32 NCHW tensors.  Why still the legacy
// API for this path: docs/cuda.md ("Mixed precision").
#include "cuda_int.h"
#include "half.cuh"

#include <string.h>

static int conv_valid(const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!d || N <= 0 || H <= 0 || W <= 0 || d->C <= 0 || d->K <= 0 || d->R <= 0 ||
        d->S <= 0 || d->stride_h <= 0 || d->stride_w <= 0 || d->pad_h < 0 || d->pad_w < 0 ||
        d->dil_h <= 0 || d->dil_w <= 0 || d->groups <= 0 || d->C % d->groups ||
        d->K % d->groups || ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) <= 0 ||
        ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w) <= 0) {
        ps_error("conv2d (cuda): invalid descriptor or shape (N=%d H=%d W=%d C=%d K=%d "
                 "R=%d S=%d groups=%d)", N, H, W, d ? d->C : 0, d ? d->K : 0, d ? d->R : 0,
                 d ? d->S : 0, d ? d->groups : 0);
        return 0;
    }
    return 1;
}

static int tensor_op(cudnnMathType_t m)
{
    return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// The first acceptable algorithm of a heuristic ranking; the workspace size
// is re-queried for the algorithm (the ranking's figure is an estimate).
#define PICK_ALGO(s, e, PERF_T, COUNT, GET_V7, GET_WS, FALLBACK, ALGO_OUT, WS_OUT, ...)      \
    do {                                                                                \
        PERF_T perf[COUNT];                                                             \
        int got = 0, found = 0;                                                         \
        CUDNN_CHECK(GET_V7(s->cudnn, __VA_ARGS__, COUNT, &got, perf));                   \
        for (int i = 0; i < got && !found; i++) {                                       \
            size_t ws = 0;                                                              \
            if (perf[i].status != CUDNN_STATUS_SUCCESS ||                              \
                (s->prec == PS_PRECISION_FP32 && tensor_op(perf[i].mathType)))              \
                continue;                                                               \
            if (GET_WS(s->cudnn, __VA_ARGS__, perf[i].algo, &ws) != CUDNN_STATUS_SUCCESS) \
                continue;                                                               \
            if (ws > s->ws_limit) continue;                                             \
            ALGO_OUT = perf[i].algo;                                                    \
            WS_OUT = ws;                                                                \
            found = 1;                                                                  \
        }                                                                               \
        if (!found) { /* always supported, small or no workspace */                     \
            ALGO_OUT = FALLBACK;                                                        \
            CUDNN_CHECK(GET_WS(s->cudnn, __VA_ARGS__, FALLBACK, &WS_OUT));               \
            ps_warn("conv2d (cuda): no heuristic algorithm within %zu MiB for N=%d C=%d " \
                    "H=%d W=%d K=%d R=%d; using the fallback (%zu bytes)",              \
                    s->ws_limit >> 20, e->key[0], e->key[1], e->key[2], e->key[3],      \
                    e->key[4], e->key[5], WS_OUT);                                      \
        }                                                                               \
    } while (0)

static ps_cu_conv_entry *conv_entry(ps_cu_state *s, const ps_conv2d_desc_t *d, int N, int H,
                                    int W)
{
    const int key[16] = {N,          H,          W,        d->C,     d->K,
                         d->R,       d->S,       d->stride_h, d->stride_w, d->pad_h,
                         d->pad_w,   d->dil_h,   d->dil_w, d->groups, s->prec, s->nhwc};
    for (int i = 0; i < s->nconv; i++)
        if (!memcmp(s->conv[i].key, key, sizeof key)) return &s->conv[i];
    if (s->nconv == s->capconv) {
        int cap = s->capconv ? 2 * s->capconv : 32;
        void *p = realloc(s->conv, (size_t)cap * sizeof *s->conv);
        if (!p) {
            ps_error("conv2d (cuda): out of host memory for the algorithm cache");
            abort();
        }
        s->conv = (ps_cu_conv_entry *)p;
        s->capconv = cap;
    }
    ps_cu_conv_entry *e = &s->conv[s->nconv];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, sizeof key);
    const int P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h);
    const int Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->y));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&e->w));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&e->conv));
    // fp32: NCHW, FMA math (parity with the CPU).  fp16/bf16: half data,
    // fp32 compute type ("pseudo half"), tensor cores, NHWC unless
    // PS_CUDA_NCHW=1.
    const cudnnDataType_t dt = s->prec == PS_PRECISION_FP16   ? CUDNN_DATA_HALF
                               : s->prec == PS_PRECISION_BF16 ? CUDNN_DATA_BFLOAT16
                                                         : CUDNN_DATA_FLOAT;
    const cudnnTensorFormat_t fmt = s->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->x, fmt, dt, N, d->C, H, W));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(e->w, dt, fmt, d->K, d->C / d->groups, d->R, d->S));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(e->conv, d->pad_h, d->pad_w, d->stride_h,
                                                d->stride_w, d->dil_h, d->dil_w,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionGroupCount(e->conv, d->groups));
    CUDNN_CHECK(cudnnSetConvolutionMathType(
        e->conv, s->prec == PS_PRECISION_FP32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    int on, oc, oh, ow;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(e->conv, e->x, e->w, &on, &oc, &oh, &ow));
    if (on != N || oc != d->K || oh != P || ow != Q) {
        // our size formula and cuDNN's disagree: a broken invariant
        ps_error("conv2d (cuda): cuDNN output %dx%dx%dx%d, expected %dx%dx%dx%d", on, oc, oh,
                 ow, N, d->K, P, Q);
        abort();
    }
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->y, fmt, dt, N, d->K, P, Q));
    PICK_ALGO(s, e, cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
              cudnnGetConvolutionForwardAlgorithm_v7, cudnnGetConvolutionForwardWorkspaceSize,
              CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, e->fwd, e->ws_fwd, e->x, e->w, e->conv,
              e->y);
    PICK_ALGO(s, e, cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
              cudnnGetConvolutionBackwardDataAlgorithm_v7,
              cudnnGetConvolutionBackwardDataWorkspaceSize, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
              e->bwd_data, e->ws_bwd_data, e->w, e->y, e->conv, e->x);
    PICK_ALGO(s, e, cudnnConvolutionBwdFilterAlgoPerf_t,
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
              cudnnGetConvolutionBackwardFilterAlgorithm_v7,
              cudnnGetConvolutionBackwardFilterWorkspaceSize,
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, e->bwd_filter, e->ws_bwd_filter, e->x, e->y,
              e->conv, e->w);
    ps_debug("conv2d (cuda): N=%d C=%d %dx%d K=%d %dx%d/%d g%d: fwd algo %d (%zu B), "
             "bwd data %d (%zu B), bwd filter %d (%zu B)", N, d->C, H, W, d->K, d->R, d->S,
             d->stride_h, d->groups, (int)e->fwd, e->ws_fwd, (int)e->bwd_data, e->ws_bwd_data,
             (int)e->bwd_filter, e->ws_bwd_filter);
    s->nconv++;
    return e;
}

void ps_cu_conv_free(ps_cu_state *s)
{
    for (int i = 0; i < s->nconv; i++) {
        cudnnDestroyTensorDescriptor(s->conv[i].x);
        cudnnDestroyTensorDescriptor(s->conv[i].y);
        cudnnDestroyFilterDescriptor(s->conv[i].w);
        cudnnDestroyConvolutionDescriptor(s->conv[i].conv);
    }
    free(s->conv);
    s->conv = NULL;
    s->nconv = s->capconv = 0;
}

// out (N,K,PQ) += b[k]
__global__ void k_bias_add(float *out, const float *b, size_t n, int K, int PQ)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += b[(i / PQ) % K];
}

// half storage: out (N, PQ, K) NHWC half += b[k]
template <class T>
__global__ void k_h_bias_add(void *out_, const float *b, size_t n, int K)
{
    T *out = (T *)out_;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st(&out[i], ld(out[i]) + b[i % K]);
}

// With half storage the only fp32 tensor a conv reads is the model input.
// The model fills it through the table's copy_in (one DMA on the stream,
// ps_cu_copy_in), so its pages normally sit on the device already; a
// caller that wrote it from the host instead (a wrapper table without
// copy_in) would leave them to page faults, far below the link's speed.
// So it is prefetched to the device on the stream before the cast:
// a no-op when resident.  Best effort: memory that is not managed refuses
// the prefetch, which changes nothing.  (It is not sent back to the host
// after conv1's backward: the next copy_in writes it on the device.)
static void input_prefetch(ps_cu_state *s, const float *p, size_t numel)
{
    if (!s->hstore || !numel) return;
    cudaMemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = cudaMemLocationTypeDevice;
    loc.id = s->device;
    if (cudaMemPrefetchAsync(p, numel * sizeof(float), loc, 0, s->stream) != cudaSuccess)
        (void)cudaGetLastError(); // not managed memory: nothing to move
}

void ps_cu_conv2d_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                          const float *b, const ps_conv2d_desc_t *d, int N, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!conv_valid(d, N, H, W)) return;
    ps_cu_conv_entry *e = conv_entry(s, d, N, H, W);
    const float one = 1.0f, zero = 0.0f;
    const int PQ = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) *
                   ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    if (s->prec != PS_PRECISION_FP32) { // half operands, fp32 accumulation, fp32 result
        const int Cg = d->C / d->groups, RS = d->R * d->S;
        // half storage: a half input is used as it is (only the model
        // input, written by the host, is fp32 and cast here), the output
        // is written half NHWC in place; the weights are cast per call
        // (fp32 KCRS masters -> half KRSC; docs/cuda.md says why per call)
        const int hin = ps_cu_is_half(s, inp);
        void *xh = hin ? (void *)inp : ps_cu_half_buf(s, PS_CU_H_X, (size_t)N * d->C * H * W);
        void *wh = ps_cu_half_buf(s, PS_CU_H_W, (size_t)d->K * Cg * RS);
        void *yh = s->hstore ? (void *)out : ps_cu_half_buf(s, PS_CU_H_Y, (size_t)N * d->K * PQ);
        if (!hin) {
            input_prefetch(s, inp, (size_t)N * d->C * H * W);
            ps_cu_to_half(s, xh, inp, N, d->C, H * W, s->nhwc);
        }
        ps_cu_to_half(s, wh, w, d->K, Cg, RS, s->nhwc); // KCRS -> KRSC
        void *ws = ps_cu_workspace(s, e->ws_fwd);
        CUDNN_CHECK(cudnnConvolutionForward(s->cudnn, &one, e->x, xh, e->w, wh, e->conv, e->fwd,
                                            ws, e->ws_fwd, &zero, e->y, yh));
        if (s->hstore)
            ps_cu_mark(s, out, 1);
        else
            ps_cu_from_half(s, out, yh, N, d->K, PQ, s->nhwc, 0);
    } else {
        void *ws = ps_cu_workspace(s, e->ws_fwd);
        CUDNN_CHECK(cudnnConvolutionForward(s->cudnn, &one, e->x, inp, e->w, w, e->conv, e->fwd,
                                            ws, e->ws_fwd, &zero, e->y, out));
    }
    if (b && ps_cu_is_half(s, out)) {
        const size_t n = (size_t)N * d->K * PQ;
        HLAUNCH(k_h_bias_add, n, out, b, n, d->K);
    } else if (b) {
        const size_t n = (size_t)N * d->K * PQ;
        k_bias_add<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, b, n, d->K, PQ);
        CU_LAUNCHED();
    }
}

// Backward on half operands: the filter gradient first (it needs the input
// in the X staging buffer, which the data gradient then reuses for dinp),
// computed with beta 0 and ADDED in fp32 to dw; dinp overwritten.
static void conv_backward_half(ps_ctx_t *ctx, ps_cu_state *s, ps_cu_conv_entry *e, float *dinp,
                               float *dw, const float *dout, const float *inp, const float *w,
                               const ps_conv2d_desc_t *d, int N, int H, int W)
{
    (void)ctx;
    const float one = 1.0f, zero = 0.0f;
    const int PQ = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) *
                   ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    const int Cg = d->C / d->groups, RS = d->R * d->S;
    // half storage: half dout / inp are read as they are, dinp is written
    // half in place when inp is half (a gradient has its tensor's storage)
    const int hdy = ps_cu_is_half(s, dout), hin = ps_cu_is_half(s, inp);
    void *dyh = hdy ? (void *)dout : ps_cu_half_buf(s, PS_CU_H_Y, (size_t)N * d->K * PQ);
    // the X staging buffer only for an fp32 input (its cast, and dinp
    // before it is widened back)
    void *xh = hin ? NULL : ps_cu_half_buf(s, PS_CU_H_X, (size_t)N * d->C * H * W);
    if (!hdy) ps_cu_to_half(s, dyh, dout, N, d->K, PQ, s->nhwc);
    if (dw) {
        void *dwh = ps_cu_half_buf(s, PS_CU_H_DW, (size_t)d->K * Cg * RS);
        const void *xin = hin ? (const void *)inp : xh;
        if (!hin) {
            input_prefetch(s, inp, (size_t)N * d->C * H * W);
            ps_cu_to_half(s, xh, inp, N, d->C, H * W, s->nhwc);
        }
        void *ws = ps_cu_workspace(s, e->ws_bwd_filter);
        CUDNN_CHECK(cudnnConvolutionBackwardFilter(s->cudnn, &one, e->x, xin, e->y, dyh, e->conv,
                                                   e->bwd_filter, ws, e->ws_bwd_filter, &zero,
                                                   e->w, dwh));
        ps_cu_from_half(s, dw, dwh, d->K, Cg, RS, s->nhwc, 1);
    }
    if (dinp) {
        void *wh = ps_cu_half_buf(s, PS_CU_H_W, (size_t)d->K * Cg * RS);
        ps_cu_to_half(s, wh, w, d->K, Cg, RS, s->nhwc);
        void *dxh = hin ? (void *)dinp : xh;
        void *ws = ps_cu_workspace(s, e->ws_bwd_data);
        CUDNN_CHECK(cudnnConvolutionBackwardData(s->cudnn, &one, e->w, wh, e->y, dyh, e->conv,
                                                 e->bwd_data, ws, e->ws_bwd_data, &zero, e->x,
                                                 dxh));
        if (hin) {
            ps_cu_mark(s, dinp, 1);
        } else {
            ps_cu_from_half(s, dinp, xh, N, d->C, H * W, s->nhwc, 0);
            ps_cu_mark(s, dinp, 0);
        }
    }
}

void ps_cu_conv2d_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const ps_conv2d_desc_t *d, int N,
                           int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!conv_valid(d, N, H, W)) return;
    ps_cu_conv_entry *e = conv_entry(s, d, N, H, W);
    const float one = 1.0f, zero = 0.0f;
    if (s->prec != PS_PRECISION_FP32) {
        conv_backward_half(ctx, s, e, dinp, dw, dout, inp, w, d, N, H, W);
        dinp = dw = NULL; // done; the bias gradient below reads the fp32 dout
    }
    if (dinp) { // input gradient: OVERWRITE (beta 0)
        void *ws = ps_cu_workspace(s, e->ws_bwd_data);
        CUDNN_CHECK(cudnnConvolutionBackwardData(s->cudnn, &one, e->w, w, e->y, dout, e->conv,
                                                 e->bwd_data, ws, e->ws_bwd_data, &zero, e->x,
                                                 dinp));
    }
    if (dw) { // parameter gradient: ACCUMULATE (beta 1)
        void *ws = ps_cu_workspace(s, e->ws_bwd_filter);
        cudnnStatus_t st = cudnnConvolutionBackwardFilter(s->cudnn, &one, e->x, inp, e->y, dout,
                                                          e->conv, e->bwd_filter, ws,
                                                          e->ws_bwd_filter, &one, e->w, dw);
        if (st == CUDNN_STATUS_NOT_SUPPORTED) {
            // an algorithm that cannot blend (beta != 0): compute into
            // scratch with beta 0, then accumulate
            const size_t nw = (size_t)d->K * (d->C / d->groups) * d->R * d->S;
            float *tmp = (float *)ps_cu_scratch(s, nw * sizeof(float));
            ws = ps_cu_workspace(s, e->ws_bwd_filter);
            CUDNN_CHECK(cudnnConvolutionBackwardFilter(s->cudnn, &one, e->x, inp, e->y, dout,
                                                       e->conv, e->bwd_filter, ws,
                                                       e->ws_bwd_filter, &zero, e->w, tmp));
            ps_cu_accumulate(ctx, dw, tmp, nw);
        } else {
            CUDNN_CHECK(st);
        }
    }
    if (db) {
        const int PQ = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) *
                       ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
        ps_cu_channel_sum_acc(s, db, dout, N, d->K, PQ);
    }
}
