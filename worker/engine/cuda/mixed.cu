// Mixed precision on the CUDA backend (issue 5, --precision fp16|bf16):
// the precision switch, the loss scale the backend applies in xent's
// backward, and the layout-changing casts conv2d.cu / linear.cu use to feed
// cuDNN and cuBLAS fp16/bf16 operands (tensor cores, fp32 accumulation).
//
// What is half here and what is not (docs/cuda.md, "Mixed precision"):
// conv2d and linear compute on fp16/bf16 copies of their operands, cast
// here on the fly (activations NCHW fp32 -> NHWC half, weights KCRS fp32 ->
// KRSC half), with fp32 accumulation; their results are cast back to the
// fp32 NCHW tensors the rest of the table reads.  BN (statistics and
// normalisation), softmax / cross-entropy and the loss stay fp32, as the
// issue asks; so does everything stored in the model's arena (fp16 storage
// of the activations is the next step, see docs/cuda.md).
//
// Legend: N images, C channels, HW = H*W pixels.
#include "cuda_int.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// One grid-stride loop per element of the DESTINATION: consecutive threads
// write consecutive destination elements (coalesced stores; the strided
// reads go through L2, which holds a whole (C x HW) image for these sizes).
__global__ void k_nchw_to_nhwc_f16(__half *dst, const float *src, size_t n, int C, int HW)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t c = i % C, p = (i / C) % HW, img = i / ((size_t)C * HW);
        dst[i] = __float2half_rn(src[(img * C + c) * HW + p]);
    }
}
__global__ void k_nchw_to_nhwc_bf16(__nv_bfloat16 *dst, const float *src, size_t n, int C,
                                    int HW)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t c = i % C, p = (i / C) % HW, img = i / ((size_t)C * HW);
        dst[i] = __float2bfloat16_rn(src[(img * C + c) * HW + p]);
    }
}
// dst (N,C,HW) fp32 = src (N,HW,C) half, or dst += src when acc.
__global__ void k_nhwc_f16_to_nchw(float *dst, const __half *src, size_t n, int C, int HW,
                                   int acc)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t p = i % HW, c = (i / HW) % C, img = i / ((size_t)C * HW);
        const float v = __half2float(src[(img * HW + p) * C + c]);
        dst[i] = acc ? dst[i] + v : v;
    }
}
__global__ void k_nhwc_bf16_to_nchw(float *dst, const __nv_bfloat16 *src, size_t n, int C,
                                    int HW, int acc)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t p = i % HW, c = (i / HW) % C, img = i / ((size_t)C * HW);
        const float v = __bfloat162float(src[(img * HW + p) * C + c]);
        dst[i] = acc ? dst[i] + v : v;
    }
}

void ps_cu_to_half(ps_cu_state *s, void *dst, const float *src, int N, int C, int HW, int nhwc)
{
    const size_t n = (size_t)N * C * HW;
    if (!n) return;
    if (!nhwc) { // same layout: the plain casts of ps_cuda.cu
        int rc = s->prec == PS_CUDA_BF16
                     ? ps_cuda_f32_to_bf16((uint16_t *)dst, src, n, s->stream)
                     : ps_cuda_f32_to_f16((uint16_t *)dst, src, n, s->stream);
        if (rc) ps_cu_fail_("cast to half", "launch failed", __FILE__, __LINE__);
        return;
    }
    if (s->prec == PS_CUDA_BF16)
        k_nchw_to_nhwc_bf16<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(
            (__nv_bfloat16 *)dst, src, n, C, HW);
    else
        k_nchw_to_nhwc_f16<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>((__half *)dst, src,
                                                                              n, C, HW);
    CU_LAUNCHED();
}

void ps_cu_from_half(ps_cu_state *s, float *dst, const void *src, int N, int C, int HW,
                     int nhwc, int acc)
{
    const size_t n = (size_t)N * C * HW;
    if (!n) return;
    // NCHW half is NHWC with HW = 1 and C = C*HW: one kernel serves both
    const int c = nhwc ? C : 1, hw = nhwc ? HW : (int)((size_t)C * HW);
    if (s->prec == PS_CUDA_BF16)
        k_nhwc_bf16_to_nchw<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(
            dst, (const __nv_bfloat16 *)src, n, c, hw, acc);
    else
        k_nhwc_f16_to_nchw<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(
            dst, (const __half *)src, n, c, hw, acc);
    CU_LAUNCHED();
}

void *ps_cu_half_buf(ps_cu_state *s, int which, size_t elems)
{
    const size_t bytes = elems * 2;
    if (which < 0 || which >= PS_CU_NHALF) abort();
    if (bytes > s->half_bytes[which]) {
        CU_CHECK(cudaStreamSynchronize(s->stream)); // the old buffer may be in use
        if (s->half[which]) CU_CHECK(cudaFree(s->half[which]));
        ps_cu_mem_account(-(long long)s->half_bytes[which]);
        s->half[which] = NULL;
        s->half_bytes[which] = 0;
        CU_CHECK(cudaMalloc(&s->half[which], bytes));
        s->half_bytes[which] = bytes;
        ps_cu_mem_account((long long)bytes);
    }
    return s->half[which];
}

extern "C" int ps_cuda_backend_set_precision(ps_ctx_t *ctx, int prec)
{
    if (!ctx || !ctx->backend_state) return PS_EINVAL;
    if (prec != PS_CUDA_FP32 && prec != PS_CUDA_FP16 && prec != PS_CUDA_BF16) {
        ps_error("ps_cuda_backend_set_precision: unknown precision %d", prec);
        return PS_EINVAL;
    }
    ps_cu_state *s = (ps_cu_state *)ctx->backend_state;
    if (prec == PS_CUDA_BF16) {
        int major = 0;
        CU_RET(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s->device));
        if (major < 8) {
            ps_error("cuda:%d: bf16 needs sm_80 or newer (this is sm_%d.x)", s->device, major);
            return PS_EUNSUPPORTED;
        }
    }
    s->prec = prec;
    // NHWC is where cuDNN's fp16/bf16 tensor-core kernels run without an
    // internal transpose; PS_CUDA_NCHW=1 keeps NCHW half (for comparison).
    const char *e = getenv("PS_CUDA_NCHW");
    s->nhwc = prec != PS_CUDA_FP32 && !(e && *e == '1');
    return 0;
}

extern "C" int ps_cuda_backend_precision(ps_ctx_t *ctx)
{
    return ctx && ctx->backend_state ? ((ps_cu_state *)ctx->backend_state)->prec : PS_CUDA_FP32;
}

extern "C" int ps_cuda_backend_set_loss_scale(ps_ctx_t *ctx, float scale)
{
    if (!ctx || !ctx->backend_state) return PS_EINVAL;
    if (!(scale > 0) || !isfinite(scale)) {
        ps_error("ps_cuda_backend_set_loss_scale: scale %g must be finite and > 0",
                 (double)scale);
        return PS_EINVAL;
    }
    ((ps_cu_state *)ctx->backend_state)->loss_scale = scale;
    return 0;
}
