/* The CUDA backend of the engine (ps_backend_cuda): the same table as the
 * CPU reference (worker/engine/ps_engine.h), every pointer a DEVICE pointer
 * (or managed memory), fp32 NCHW.  Compiled only when configure found the
 * toolkit (Makefile.am "cuda" section); the design and the cuDNN API choice
 * are written down in docs/cuda.md.
 *
 * Life cycle: ps_engine_init(ctx, n) (host threads for the CPU parts), then
 * ps_cuda_backend_init(ctx, dev) puts a cudnnHandle_t, a cublasHandle_t, a
 * stream and the convolution algorithm cache in ctx->backend_state.  Every
 * layer call is queued on that stream and returns at once, except
 * xent_forward (it returns the loss, so it waits).  Call
 * ps_cuda_backend_sync() before the host reads or writes anything a layer
 * touched.  A CUDA/cuDNN/cuBLAS failure inside a layer is a device fault:
 * it is logged with the call site and aborts (STYLE.md); bad shapes are
 * logged and the call does nothing, as on the CPU.
 *
 * Beyond the table's contract: tshift_forward/backward also work in place
 * (out == inp) on this backend.  Tensors are fp32 NCHW; with
 * ps_cuda_backend_set_precision(FP16|BF16) conv2d and linear compute on
 * half operands and the activations are stored half NHWC in their float
 * slots (docs/cuda.md, "Mixed precision", "Half storage").
 */
#ifndef PS_CUDA_BACKEND_H
#define PS_CUDA_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "worker/engine/ps_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const ps_backend_t ps_backend_cuda;

/* Select device `dev`, create the handles and the stream.  Returns 0 or
 * PS_ECUDA (logged).  ctx must have been through ps_engine_init(). */
int ps_cuda_backend_init(ps_ctx_t *ctx, int dev);
/* The `--device` option: "cpu" -> *be = &ps_backend_cpu (ctx untouched);
 * "cuda" or "cuda:N" -> ps_cuda_backend_init(ctx, N) and *be =
 * &ps_backend_cuda.  Returns 0, PS_EINVAL (bad string, logged) or
 * PS_ECUDA.  Callers build with PS_HAVE_CUDA (config.h) to link this. */
int ps_cuda_backend_select(const char *device, ps_ctx_t *ctx, const ps_backend_t **be);
/* Destroy what ps_cuda_backend_init created (NULLs ctx->backend_state). */
void ps_cuda_backend_free(ps_ctx_t *ctx);
/* Wait for every queued layer; 0 or PS_ECUDA. */
int ps_cuda_backend_sync(ps_ctx_t *ctx);
/* The backend's stream (a cudaStream_t), e.g. to record events after a
 * layer's backward and hand its gradient to the communication thread. */
void *ps_cuda_backend_stream(ps_ctx_t *ctx);
/* Per-layer gradient hand-off (issue 5): n reusable events ("slots", e.g.
 * one per gradient partition; n = 0 frees them).  The training thread
 * records slot i on the backend's stream right after the backward of the
 * last layer that writes partition i's gradient and goes on queueing the
 * rest of backward; the communication thread waits for (or polls) slot i
 * and then pushes partition i while the GPU still computes.  Re-recording
 * a slot in the next step is fine once its wait returned.
 * record / wait: 0 or PS_EINVAL (slot) / PS_ECUDA; query: 1 done, 0 still
 * pending, or a negative PS_E*.  All calls are thread-safe (CUDA's). */
int ps_cuda_backend_events(ps_ctx_t *ctx, int n);
int ps_cuda_backend_event_record(ps_ctx_t *ctx, int slot);
int ps_cuda_backend_event_query(ps_ctx_t *ctx, int slot);
int ps_cuda_backend_event_wait(ps_ctx_t *ctx, int slot);
/* Upper bound of the cuDNN convolution workspace in bytes (default 512 MiB,
 * or $PS_CUDNN_WORKSPACE_MB).  Algorithms needing more are not chosen.
 * Takes effect for shapes not yet in the algorithm cache. */
void ps_cuda_backend_set_workspace_limit(ps_ctx_t *ctx, size_t bytes);
/* Mixed precision (--precision, docs/cuda.md): PS_CUDA_FP16 / PS_CUDA_BF16
 * make conv2d and linear compute on fp16 / bf16 operands (NHWC for cuDNN,
 * tensor cores, fp32 accumulation) and turn on half storage of the
 * activations (below); BN statistics, parameters and the loss stay fp32.
 * Setting a precision forgets every half tag.  BF16 needs sm_80+.  Returns 0, PS_EINVAL, PS_EUNSUPPORTED or PS_ECUDA (logged). */
enum { PS_CUDA_FP32 = 0, PS_CUDA_FP16 = 1, PS_CUDA_BF16 = 2 };
int ps_cuda_backend_set_precision(ps_ctx_t *ctx, int prec);
int ps_cuda_backend_precision(ps_ctx_t *ctx);
/* Half storage of activations (docs/cuda.md, "Half storage"): on by
 * default with FP16/BF16 ($PS_CUDA_HALF_STORAGE=0 or PS_CUDA_NCHW=1: off).
 * Then every activation and activation gradient a layer writes is half
 * (the precision's type) in NHWC order inside its float slot; parameters,
 * parameter gradients, BN statistics, the model input (anything the host
 * wrote), linear's output (logits), softmax / loss stay fp32 NCHW.  The
 * backend knows which pointer holds what from the writes it performed.
 * set: 0, PS_EINVAL (fp32, NCHW or no state; logged).  get: 1 on, 0 off. */
int ps_cuda_backend_set_half_storage(ps_ctx_t *ctx, int on);
int ps_cuda_backend_half_storage(ps_ctx_t *ctx);
/* 1 when device pointer p holds a half tensor written by this backend. */
int ps_cuda_is_half(ps_ctx_t *ctx, const void *p);
/* The host (or anything but a layer) wrote fp32 data at p, or p was freed
 * and may be reused: forget its half tag (p NULL: forget every tag).  The
 * models need none: their host writes (input, labels) go to buffers no
 * layer writes. */
void ps_cuda_half_forget(ps_ctx_t *ctx, const void *p);
/* Tests and tools: dst (device, distinct from src) = the fp32 NCHW
 * (N, C, HW) device tensor src stored as half NHWC and tagged half;
 * load: the reverse into fp32 NCHW dst.  Queued on the backend's stream.
 * 0, PS_EINVAL (bad arguments, load of an untagged source), PS_ESTATE
 * (store with half storage off). */
int ps_cuda_half_store(ps_ctx_t *ctx, float *dst, const float *src, int N, int C, int HW);
int ps_cuda_half_load(ps_ctx_t *ctx, float *dst, const float *src, int N, int C, int HW);
/* Loss scaling: xent_backward multiplies its dloss by `scale` (a power of
 * two; 1 = off), so every gradient comes out scaled and fp16 backward does
 * not flush small values to zero.  The caller unscales (ps_cuda_scale) after
 * checking for overflow (ps_cuda_check_overflow). */
int ps_cuda_backend_set_loss_scale(ps_ctx_t *ctx, float scale);

/* Number of distinct convolution shapes seen (algorithm cache entries). */
int ps_cuda_backend_conv_shapes(ps_ctx_t *ctx);

/* Make ps_arena_commit() take its one allocation from cudaMallocManaged, so
 * a model written for host pointers (it memcpy's the input and labels into
 * its arena, zeroes gradients with memset, reads logits) runs on the GPU
 * unchanged.  Host touches then migrate pages; a device-aware model should
 * use plain device memory instead (docs/cuda.md).  Returns 0 or PS_ECUDA. */
int ps_cuda_use_managed_arena(void);
/* Prefetch [p, p+bytes) of managed memory to the current device. */
int ps_cuda_prefetch(const void *p, size_t bytes, void *stream);

/* Wait for all work on the device (every stream, copies included). */
int ps_cuda_device_sync(void);

/* Device memory in use (total - free, from cudaMemGetInfo), in bytes. */
size_t ps_cuda_mem_used(void);

/* Device memory figures, bytes.  alloc_*: what this backend allocated
 * itself (managed arenas, cuDNN workspace, scratch; a high-water mark kept
 * on every allocation, so it is exact whenever the peak happens).  dev_*:
 * cudaMemGetInfo's total - free, which adds the CUDA context, cuDNN /
 * cuBLAS internals and other processes; its peak is over the calls of
 * ps_cuda_mem_stats (sample it where usage is highest: after a step's
 * backward, as the backend frees nothing inside a step). */
typedef struct ps_cuda_mem {
    size_t alloc_now, alloc_peak;
    size_t dev_used, dev_used_peak, dev_total;
} ps_cuda_mem_t;
void ps_cuda_mem_stats(ps_cuda_mem_t *m);
/* Start a new peak window (e.g. per step): alloc_peak = alloc_now,
 * dev_used_peak = 0. */
void ps_cuda_mem_reset_peak(void);

/* Loss-scale overflow check on the device: *found (host int) = 1 when any
 * of grad[0..n) is Inf or NaN.  Waits on `stream` (NULL = default).
 * Returns 0 or PS_ECUDA. */
int ps_cuda_check_overflow(const float *grad, size_t n, int *found, void *stream);
/* Multiply grad[0..n) by s on the device (unscaling by 1/loss_scale). */
int ps_cuda_scale(float *grad, size_t n, float s, void *stream);

/* Measured matrix peak: TFLOP/s of a large cuBLAS GEMM (m=n=k=8192 for
 * fp32, 16384-ish for fp16) on the current device, averaged over `iters`.
 * half != 0: fp16 inputs, fp32 accumulate (cublasGemmEx, tensor cores).
 * Returns 0 or PS_ECUDA. */
int ps_cuda_gemm_peak(int half, int iters, double *tflops);

#ifdef __cplusplus
}
#endif
#endif
