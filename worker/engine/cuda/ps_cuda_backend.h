/* The CUDA backend of the engine (ps_backend_cuda): the same table as the
 * CPU reference (worker/engine/ps_engine.h), every pointer a DEVICE pointer
 * (or managed memory), fp32 NCHW.  Compiled only when configure found the
 * toolkit (Makefile.am "engine/cuda" block); the design and the cuDNN API
 * choice are written down in docs/cuda.md.
 *
 * Device-neutral code opens it through the engine's device table: the
 * program that parses --device adds ps_device_cuda (below) with
 * ps_engine_add_device() and ps_engine_open_device("cuda:N", ...) does the
 * rest; after that it uses the table's slots only.  The ps_cuda_backend_*
 * functions below are the table's device-control slots (and CUDA-only
 * extras), callable directly by CUDA-only code (tests, the GPU bench).
 *
 * Life cycle: ps_engine_init(ctx, n) (host threads for the CPU parts), then
 * ps_cuda_backend_init(ctx, dev) puts a cudnnHandle_t, a cublasHandle_t, a
 * stream and the convolution algorithm cache in ctx->backend_state.  Every
 * layer call is queued on that stream and returns at once (the table's
 * async = 1), except those that return a host value (xent_forward's loss,
 * count_pos, the detection losses): they wait.  Call ps_cuda_backend_sync()
 * before the host reads or writes anything a layer touched.  A CUDA /
 * cuDNN / cuBLAS failure inside a layer is a device fault: it is logged
 * with the call site and aborts; bad shapes are logged and the call does
 * nothing, as on the CPU.
 *
 * Beyond the table's contract: tshift_forward/backward also work in place
 * (out == inp) on this backend.  Tensors are fp32 NCHW; with
 * set_precision(FP16|BF16) conv2d and linear compute on half operands and
 * the activations are stored half NHWC in their float slots (docs/cuda.md,
 * "Mixed precision", "Half storage").  The detection layers read fp32
 * only: they do not know half storage.
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
/* The "cuda" row of the device table: open(ctx, N) = the device count
 * check, ps_cuda_backend_init(ctx, N) and ps_cuda_use_managed_arena(). */
extern const ps_device_t ps_device_cuda;

/* Select device `dev`, create the handles and the stream.  Returns 0,
 * PS_ESTATE (ctx has a backend state already) or PS_ECUDA (logged).  ctx
 * must have been through ps_engine_init(). */
int ps_cuda_backend_init(ps_ctx_t *ctx, int dev);
/* Destroy what ps_cuda_backend_init created (NULLs ctx->backend_state):
 * the table's release slot. */
void ps_cuda_backend_free(ps_ctx_t *ctx);
/* Wait for every queued layer; 0 or PS_ECUDA (the sync slot). */
int ps_cuda_backend_sync(ps_ctx_t *ctx);
/* The backend's stream (a cudaStream_t), for CUDA-only code that queues
 * its own work behind the layers (prefetches, copies). */
void *ps_cuda_backend_stream(ps_ctx_t *ctx);
/* The events slots (contract in ps_engine.h): cudaEvent_t's recorded on the
 * backend's stream.  events(ctx, n > 0) is PS_EUNSUPPORTED (logged at info,
 * naming the device) without concurrent managed access, which the host
 * needs to read a gradient from the managed arena while kernels run.
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
/* The set_precision slot (docs/cuda.md "Mixed precision"): FP16 / BF16
 * make conv2d and linear compute on fp16 / bf16 operands (NHWC for cuDNN,
 * tensor cores, fp32 accumulation) and turn on half storage of the
 * activations (below); BN statistics, parameters and the loss stay fp32.
 * Setting a precision forgets every half tag.  BF16 needs sm_80+.
 * Returns 0, PS_EINVAL, PS_EUNSUPPORTED or PS_ECUDA (logged). */
int ps_cuda_backend_set_precision(ps_ctx_t *ctx, ps_precision_t prec);
ps_precision_t ps_cuda_backend_precision(ps_ctx_t *ctx);
/* Half storage of activations (docs/cuda.md, "Half storage"): on by
 * default with FP16/BF16 ($PS_CUDA_HALF_STORAGE=0 or PS_CUDA_NCHW=1: off).
 * Then every activation and activation gradient a layer writes is half
 * (the precision's type) in NHWC order inside its float slot; parameters,
 * parameter gradients, BN statistics, the model input (anything the host
 * wrote), linear's output (logits), softmax / loss stay fp32 NCHW.  The
 * backend knows which pointer holds what from the writes it performed.
 * set: 0, PS_EINVAL (fp32, NCHW or no state; logged).  get: 1 on, 0 off. */
int ps_cuda_backend_set_half_storage(ps_ctx_t *ctx, int on);
/* The act_elsize slot: 2 while half storage is on (a model then sizes its
 * activation slots in 2-byte elements, and the backend must not go back
 * to fp32 storage under it: that is logged), else 4. */
size_t ps_cuda_backend_act_elsize(ps_ctx_t *ctx);
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
/* The set_loss_scale slot: xent_backward multiplies its dloss by `scale`
 * (a power of two; 1 = off), so every gradient comes out scaled and fp16
 * backward does not flush small values to zero; returns 0 (PS_EINVAL for
 * a scale not finite and > 0).  The caller unscales (ps_cuda_scale) after
 * checking for overflow (ps_cuda_check_overflow). */
int ps_cuda_backend_set_loss_scale(ps_ctx_t *ctx, float scale);

/* Number of distinct convolution shapes seen (algorithm cache entries). */
int ps_cuda_backend_conv_shapes(ps_ctx_t *ctx);

/* Make ps_arena_commit() take its one allocation from cudaMallocManaged, so
 * a model written for host pointers (it memcpy's the input and labels into
 * its arena, zeroes gradients with memset, reads logits) runs on the GPU
 * unchanged.  Host touches then migrate pages; a device-aware model should
 * use plain device memory instead (docs/cuda.md).  Returns 0,
 * PS_EUNSUPPORTED (no managed memory) or PS_ECUDA. */
int ps_cuda_use_managed_arena(void);
/* Prefetch [p, p+bytes) of managed memory to the current device. */
int ps_cuda_prefetch(const void *p, size_t bytes, void *stream);

/* Wait for all work on the device (every stream, copies included). */
int ps_cuda_device_sync(void);

/* Device memory in use (total - free, from cudaMemGetInfo), in bytes. */
size_t ps_cuda_mem_used(void);

/* The mem_stats slot (ps_backend_mem_t, ps_engine.h).  alloc_*: what this
 * backend allocated itself (managed arenas, cuDNN workspace, scratch, half
 * staging); dev_*: cudaMemGetInfo's total - free.  Both are process-wide
 * (every context of this backend); the peak windows too.  0 or PS_EINVAL
 * (m NULL). */
int ps_cuda_backend_mem_stats(ps_ctx_t *ctx, ps_backend_mem_t *m, int reset_peak);

/* Loss-scale overflow check on the device: *found (host int) = 1 when any
 * of grad[0..n) is Inf or NaN.  Waits on `stream` (NULL = default).
 * Returns 0 or PS_ECUDA. */
int ps_cuda_check_overflow(const float *grad, size_t n, int *found, void *stream);
/* Multiply grad[0..n) by s on the device (unscaling by 1/loss_scale). */
int ps_cuda_scale(float *grad, size_t n, float s, void *stream);

#ifdef __cplusplus
}
#endif
#endif
