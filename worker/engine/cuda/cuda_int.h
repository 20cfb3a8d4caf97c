// Private to the CUDA backend's .cu files: the state behind
// ctx->backend_state, the call-site check macros and launch helpers.  The
// layer entry points are in cuda_layers.h (plain C, so the table can be
// filled by slot name in backend_cuda_table.c).
//
// Legend as in ps_engine.h (N images, C/K channels, H,W / P,Q planes).
#ifndef PS_CUDA_INT_H
#define PS_CUDA_INT_H
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "ps_error.h"
#include "ps_log.h"
#include "worker/engine/cuda/cuda_layers.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
}

// Inside a layer (void functions) a failed CUDA / cuDNN / cuBLAS call is a
// device fault: log it with the call site and abort (a layer has no error
// return, and going on would compute on garbage).  Outside layers (init,
// helpers returning int) the _RET forms log and return PS_ECUDA instead.
void ps_cu_fail_(const char *what, const char *err, const char *file, int line);
#define CU_CHECK(call)                                                                  \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) ps_cu_fail_(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#define CUDNN_CHECK(call)                                                               \
    do {                                                                                \
        cudnnStatus_t s_ = (call);                                                      \
        if (s_ != CUDNN_STATUS_SUCCESS)                                                 \
            ps_cu_fail_(#call, cudnnGetErrorString(s_), __FILE__, __LINE__);            \
    } while (0)
#define CUBLAS_CHECK(call)                                                              \
    do {                                                                                \
        cublasStatus_t s_ = (call);                                                     \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                \
            ps_cu_fail_(#call, cublasGetStatusString(s_), __FILE__, __LINE__);          \
    } while (0)
// After every kernel launch: catches bad launch configurations at once
// (the kernel's own faults show at the next synchronising call).
#define CU_LAUNCHED() CU_CHECK(cudaGetLastError())

#define CU_RET(call)                                                                    \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) {                                                        \
            ps_error("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            return PS_ECUDA;                                                            \
        }                                                                               \
    } while (0)
#define CUDNN_RET(call)                                                                 \
    do {                                                                                \
        cudnnStatus_t s_ = (call);                                                      \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                               \
            ps_error("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudnnGetErrorString(s_)); \
            return PS_ECUDA;                                                            \
        }                                                                               \
    } while (0)
#define CUBLAS_RET(call)                                                                \
    do {                                                                                \
        cublasStatus_t s_ = (call);                                                     \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                              \
            ps_error("%s:%d: %s: %s", __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
            return PS_ECUDA;                                                            \
        }                                                                               \
    } while (0)

// One cached convolution shape: descriptors and the algorithms chosen once
// (conv2d.cu).
struct ps_cu_conv_entry {
    int key[16]; // N C H W K R S stride_h stride_w pad_h pad_w dil_h dil_w groups prec nhwc
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t ws_fwd, ws_bwd_data, ws_bwd_filter; // bytes
};

struct ps_cu_conv3d_entry; // conv3d.cu: one shape's graph-API plans

struct ps_cu_state {
    int device;
    cudaStream_t stream;
    cudnnHandle_t cudnn;
    cublasHandle_t cublas;
    // cuDNN workspace: grown to the largest need of a chosen algorithm, which
    // is never above ws_limit (algorithms that need more are skipped).
    void *ws;
    size_t ws_bytes, ws_limit;
    // small device scratch for reductions (xent's per-row loss, flags)
    void *scratch;
    size_t scratch_bytes;
    // conv algorithm cache, linear search (a model has < ~60 shapes)
    ps_cu_conv_entry *conv;
    int nconv, capconv;
    // conv3d plan cache (conv3d.cu) and the device-properties descriptor
    // its heuristics and plans are made for (a cudnnBackendDescriptor_t)
    ps_cu_conv3d_entry *conv3d;
    int nconv3d, capconv3d;
    void *c3_devprop;
    // mixed precision (mixed.cu): PS_PRECISION_FP32/FP16/BF16 for conv2d and
    // linear, their half operands NHWC (nhwc) or NCHW; the loss scale xent's
    // backward multiplies dloss by (1 = off)
    int prec, nhwc;
    float loss_scale;
    void *half[4];        // PS_CU_NHALF staging buffers for half operands
    size_t half_bytes[4];
    // completion events (ps_cuda_backend_events): one per hand-off slot
    cudaEvent_t *ev;
    int nev;
    // half storage of activations (mixed.cu, docs/cuda.md "Half storage"):
    // on when prec is fp16/bf16 (unless turned off); then every tensor a
    // layer of this backend wrote in half is in this set (open addressing,
    // pointer -> 1 half NHWC / 0 fp32 NCHW).  A pointer not in it is fp32:
    // the host wrote it (the model input) or an fp32 layer did.
    int hstore;
    const void **hkey;
    unsigned char *hval;
    size_t hcap, hcount;
};
#define PS_CU_NHALF 4
enum { PS_CU_H_X = 0, PS_CU_H_W = 1, PS_CU_H_Y = 2, PS_CU_H_DW = 3 };

static inline ps_cu_state *cu_state(ps_ctx_t *ctx)
{
    ps_cu_state *s = ctx ? (ps_cu_state *)ctx->backend_state : NULL;
    if (!s) {
        ps_error("CUDA backend used without ps_cuda_backend_init()");
        abort(); // a broken invariant: every layer would write nothing
    }
    return s;
}

// Device memory of at least `bytes` from the state's scratch / workspace.
void *ps_cu_scratch(ps_cu_state *s, size_t bytes);
void *ps_cu_workspace(ps_cu_state *s, size_t bytes);

// Device bytes allocated (+) or freed (-) by the backend, for the
// ps_cuda_backend_mem_stats high-water mark.
void ps_cu_mem_account(long long delta);
// Mixed precision (mixed.cu).  A staging buffer of >= elems 2-byte values
// (one per role, grown on demand).  to_half: src (N,C,HW) fp32 NCHW -> dst
// half in the state's precision, NHWC when nhwc; from_half: the reverse,
// dst = or += (acc) the widened values.
void *ps_cu_half_buf(ps_cu_state *s, int which, size_t elems);
void ps_cu_to_half(ps_cu_state *s, void *dst, const float *src, int N, int C, int HW, int nhwc);
void ps_cu_from_half(ps_cu_state *s, float *dst, const void *src, int N, int C, int HW,
                     int nhwc, int acc);

// Half storage (mixed.cu).  ps_cu_is_half: p holds half NHWC data written
// by a layer (always 0 when half storage is off).  ps_cu_mark: record what
// a layer is about to write into p (1 half, 0 fp32); a no-op when half
// storage is off.  ps_cu_half_mismatch: log that a layer got tensors of
// different storage (the call then does nothing, like a bad shape).
int ps_cu_is_half(const ps_cu_state *s, const void *p);
void ps_cu_mark(ps_cu_state *s, const void *p, int half);
void ps_cu_half_mismatch(const char *layer);
void ps_cu_hset_free(ps_cu_state *s);

// Grid for a grid-stride loop over n elements.
static inline unsigned cu_grid(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 1 ? 1 : g > 65535u * 8 ? 65535u * 8 : g);
}
#define CU_BLOCK 256

// conv2d.cu: free the algorithm cache's descriptors
void ps_cu_conv_free(ps_cu_state *s);
// conv3d.cu: free the 3-D plan cache
void ps_cu_conv3d_free(ps_cu_state *s);
// batchnorm.cu: per-channel sum of x (N, C, HW) ADDED into acc[c] (conv
// bias gradient)
void ps_cu_channel_sum_acc(ps_cu_state *s, float *acc, const float *x, int N, int C, int HW);
#endif
