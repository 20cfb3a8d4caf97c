// Mixed precision on the CUDA backend (--precision fp16|bf16):
// the precision switch, the loss scale the backend applies in xent's
// backward, and the layout-changing casts conv2d.cu / linear.cu use to feed
// cuDNN and cuBLAS fp16/bf16 operands (tensor cores, fp32 accumulation).
//
// What is half here and what is not (docs/cuda.md, "Mixed precision"):
// conv2d and linear compute on fp16/bf16 copies of their operands, cast
// here on the fly (activations NCHW fp32 -> NHWC half, weights KCRS fp32 ->
// KRSC half), with fp32 accumulation; their results are cast back to the
// fp32 NCHW tensors the rest of the table reads, or, with half storage on
// (the default of fp16 / bf16, the set of half tensors below), kept half
// NHWC in their float slots.  BN statistics, softmax / cross-entropy, the
// loss, parameters and their gradients stay fp32.
//
// Legend: N images, C channels, HW = H*W pixels.
#include "cuda_int.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <string.h>

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
        int rc = s->prec == PS_PRECISION_BF16
                     ? ps_cuda_f32_to_bf16((uint16_t *)dst, src, n, s->stream)
                     : ps_cuda_f32_to_f16((uint16_t *)dst, src, n, s->stream);
        if (rc) ps_cu_fail_("cast to half", "launch failed", __FILE__, __LINE__);
        return;
    }
    if (s->prec == PS_PRECISION_BF16)
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
    if (s->prec == PS_PRECISION_BF16)
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

// A model sized its activation slots with 2 bytes (act_elsize) and the
// backend now stores 4: its layers would write past the slots.
static void warn_sized_half(ps_cu_state *s)
{
    if (s->act2 && !s->hstore)
        ps_warn("cuda: half storage is off now, but a model of this context sized its "
                "activations for 2-byte elements: create it again before running it");
}

// The act_elsize slot: 2-byte activations while half storage is on.
extern "C" size_t ps_cuda_backend_act_elsize(ps_ctx_t *ctx)
{
    ps_cu_state *s = cu_state(ctx);
    if (!s->hstore) return sizeof(float);
    s->act2 = 1;
    return 2;
}

extern "C" int ps_cuda_backend_set_precision(ps_ctx_t *ctx, ps_precision_t prec)
{
    if (!ctx || !ctx->backend_state) return PS_EINVAL;
    if (prec != PS_PRECISION_FP32 && prec != PS_PRECISION_FP16 && prec != PS_PRECISION_BF16) {
        ps_error("ps_cuda_backend_set_precision: unknown precision %d", (int)prec);
        return PS_EINVAL;
    }
    ps_cu_state *s = (ps_cu_state *)ctx->backend_state;
    if (prec == PS_PRECISION_BF16) {
        int major = 0;
        CU_RET(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s->device));
        if (major < 8) {
            ps_error("cuda:%d: bf16 needs sm_80 or newer (this is sm_%d.x)", s->device, major);
            return PS_EUNSUPPORTED;
        }
    }
    s->prec = prec;
    // NHWC is where cuDNN's fp16/bf16 tensor-core kernels run without an
    // internal transpose; PS_CUDA_NCHW=1 keeps NCHW half (for comparison,
    // operands only: half storage is NHWC by definition).
    const char *e = getenv("PS_CUDA_NCHW");
    s->nhwc = prec != PS_PRECISION_FP32 && !(e && *e == '1');
    // half storage of the activations is the default of fp16/bf16;
    // PS_CUDA_HALF_STORAGE=0 keeps the older form (fp32 tensors, half
    // operand copies inside conv / linear) for comparison
    const char *h = getenv("PS_CUDA_HALF_STORAGE");
    s->hstore = prec != PS_PRECISION_FP32 && s->nhwc && !(h && *h == '0');
    warn_sized_half(s);
    s->hcount = 0; // a precision change forgets every tag (nothing is half yet)
    if (s->hval) memset(s->hval, 0, s->hcap);
    if (s->hkey) memset(s->hkey, 0, s->hcap * sizeof *s->hkey);
    return 0;
}

// ---- half storage: the set of tensors written in half --------------------

static size_t hslot(const ps_cu_state *s, const void *p)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (s->hcap - 1);
}

int ps_cu_is_half(const ps_cu_state *s, const void *p)
{
    if (!s->hstore || !p || !s->hcap) return 0;
    for (size_t i = hslot(s, p);; i = (i + 1) & (s->hcap - 1)) {
        if (s->hkey[i] == p) return s->hval[i];
        if (!s->hkey[i]) return 0;
    }
}

static void hput(ps_cu_state *s, const void *p, int half)
{
    size_t i = hslot(s, p);
    while (s->hkey[i] && s->hkey[i] != p) i = (i + 1) & (s->hcap - 1);
    if (!s->hkey[i]) s->hcount++;
    s->hkey[i] = p;
    s->hval[i] = (unsigned char)half;
}

void ps_cu_mark(ps_cu_state *s, const void *p, int half)
{
    if (!s->hstore || !p) return;
    if (!half && !ps_cu_is_half(s, p)) return; // absent = fp32 already
    if (2 * (s->hcount + 1) > s->hcap) { // keep the load under 1/2
        const size_t ocap = s->hcap, ncap = ocap ? 2 * ocap : 1024;
        const void **ok = s->hkey;
        unsigned char *ov = s->hval;
        s->hkey = (const void **)calloc(ncap, sizeof *s->hkey);
        s->hval = (unsigned char *)calloc(ncap, 1);
        if (!s->hkey || !s->hval) {
            ps_error("half storage: out of host memory for %zu tensor tags", ncap);
            abort(); // a layer cannot report it; the tags would be lost
        }
        s->hcap = ncap;
        s->hcount = 0;
        for (size_t i = 0; i < ocap; i++)
            if (ok[i]) hput(s, ok[i], ov[i]);
        free(ok);
        free(ov);
    }
    hput(s, p, half);
}

void ps_cu_hset_free(ps_cu_state *s)
{
    free(s->hkey);
    free(s->hval);
    s->hkey = NULL;
    s->hval = NULL;
    s->hcap = s->hcount = 0;
}

void ps_cu_half_mismatch(const char *layer)
{
    ps_error("%s (cuda): operands of different storage (half / fp32) in half-storage mode; "
             "nothing computed", layer);
}

extern "C" int ps_cuda_backend_set_half_storage(ps_ctx_t *ctx, int on)
{
    if (!ctx || !ctx->backend_state) return PS_EINVAL;
    ps_cu_state *s = (ps_cu_state *)ctx->backend_state;
    if (on && (s->prec == PS_PRECISION_FP32 || !s->nhwc)) {
        ps_error("half storage needs --precision fp16|bf16 with NHWC (PS_CUDA_NCHW unset)");
        return PS_EINVAL;
    }
    s->hstore = on != 0;
    warn_sized_half(s);
    s->hcount = 0;
    if (s->hval) memset(s->hval, 0, s->hcap);
    if (s->hkey) memset(s->hkey, 0, s->hcap * sizeof *s->hkey);
    return 0;
}

extern "C" int ps_cuda_backend_half_storage(ps_ctx_t *ctx)
{
    return ctx && ctx->backend_state ? ((ps_cu_state *)ctx->backend_state)->hstore : 0;
}

extern "C" int ps_cuda_is_half(ps_ctx_t *ctx, const void *p)
{
    return ctx && ctx->backend_state ? ps_cu_is_half((ps_cu_state *)ctx->backend_state, p) : 0;
}

extern "C" void ps_cuda_half_forget(ps_ctx_t *ctx, const void *p)
{
    if (!ctx || !ctx->backend_state) return;
    ps_cu_state *s = (ps_cu_state *)ctx->backend_state;
    if (p) {
        ps_cu_mark(s, p, 0);
        return;
    }
    s->hcount = 0;
    if (s->hval) memset(s->hval, 0, s->hcap);
    if (s->hkey) memset(s->hkey, 0, s->hcap * sizeof *s->hkey);
}

extern "C" int ps_cuda_half_store(ps_ctx_t *ctx, float *dst, const float *src, int N, int C,
                                  int HW)
{
    if (!ctx || !ctx->backend_state || !dst || !src || N <= 0 || C <= 0 || HW <= 0 ||
        (const void *)dst == (const void *)src)
        return PS_EINVAL;
    ps_cu_state *s = (ps_cu_state *)ctx->backend_state;
    if (!s->hstore) {
        ps_error("ps_cuda_half_store: half storage is off");
        return PS_ESTATE;
    }
    ps_cu_to_half(s, dst, src, N, C, HW, 1);
    ps_cu_mark(s, dst, 1);
    return 0;
}

extern "C" int ps_cuda_half_load(ps_ctx_t *ctx, float *dst, const float *src, int N, int C,
                                 int HW)
{
    if (!ctx || !ctx->backend_state || !dst || !src || N <= 0 || C <= 0 || HW <= 0 ||
        (const void *)dst == (const void *)src)
        return PS_EINVAL;
    ps_cu_state *s = (ps_cu_state *)ctx->backend_state;
    if (!ps_cu_is_half(s, src)) {
        ps_error("ps_cuda_half_load: the source is not a half tensor");
        return PS_EINVAL;
    }
    ps_cu_from_half(s, dst, src, N, C, HW, 1, 0);
    ps_cu_mark(s, dst, 0);
    return 0;
}

extern "C" ps_precision_t ps_cuda_backend_precision(ps_ctx_t *ctx)
{
    return ctx && ctx->backend_state ? (ps_precision_t)((ps_cu_state *)ctx->backend_state)->prec
                                     : PS_PRECISION_FP32;
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
