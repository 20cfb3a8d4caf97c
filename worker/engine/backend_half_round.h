/* A CPU "rounding" backend (ps_backend_cpu_round): the CPU fp32 layers with
 * the CUDA backend's half-storage rounding points, the independent
 * reference for whole-model half tests (tests/test_half_round.c on the CPU,
 * tests/test_cuda_half_model.c and bench/gpu_bench.c on a GPU): what half
 * storage costs inherently, measured without a GPU.
 *
 * Every call runs the CPU fp32 layer (ps_backend_cpu) and rounds to fp16 /
 * bf16 (round to nearest even, ps_half.h: the conversion the kernels use)
 * exactly what the CUDA backend stores or feeds in half:
 *   - conv2d / linear operands: the input (the model input is cast on the
 *     way in, as worker/engine/cuda/conv2d.cu does), the weights (cast per
 *     call), the output gradient;
 *   - conv2d's output and input gradient (always: cuDNN writes them half),
 *     its filter gradient (cuDNN writes it half; it is then added in fp32);
 *   - every other layer's output when its input is a half tensor (BN,
 *     ReLU, pools, dropout, add, accumulate, shift, consensus);
 *   - linear's output (the logits), softmax, the loss, BN statistics,
 *     parameters and parameter gradients other than conv's stay fp32;
 *   - conv3d (cuda/conv3d.cu): its operands (input, weights, output
 *     gradient) and results are rounded, its outputs stay fp32 storage, so
 *     a 3-D model's other layers run unrounded, as on CUDA.
 * Which tensors are half is tracked as the CUDA backend does (mixed.cu): a
 * tag per pointer, set by the layer that writes it.  xent's backward
 * multiplies dloss by the loss scale (set_loss_scale returns 0: the model's
 * gradients come out scaled, like the CUDA backend's).  The fused bn+relu
 * entries are NULL, as on CUDA, so the model takes the same path.  The
 * detection layers are the CPU's (CUDA runs them in fp32 too).
 *
 * State lives in ctx->backend_state (the CPU layers do not use it); the
 * table's release slot is ps_hround_free. */
#ifndef PS_BACKEND_HALF_ROUND_H
#define PS_BACKEND_HALF_ROUND_H
#include "worker/engine/ps_engine.h"

/* Attach rounding state to ctx (after ps_engine_init): prec FP16 or BF16,
 * or FP32 (rounding off: the same calls and copies with the identity as
 * rounding; then a model must match the CPU backend bitwise); loss_scale
 * > 0.  The table's set_precision / set_loss_scale change both later.
 * 0 or PS_EINVAL / PS_ENOMEM / PS_ESTATE (ctx has a state already). */
int ps_hround_init(ps_ctx_t *ctx, ps_precision_t prec, float loss_scale);
void ps_hround_free(ps_ctx_t *ctx);
/* Forget every tag (a new step writes everything again). */
void ps_hround_forget(ps_ctx_t *ctx);
/* 1 when p was last written in half by a layer of this backend. */
int ps_hround_is_half(ps_ctx_t *ctx, const void *p);
/* Calls whose operands had different storage (the CUDA backend refuses
 * them: a model that makes one is broken) and values rounded so far. */
long ps_hround_mismatches(ps_ctx_t *ctx);
long ps_hround_rounded(ps_ctx_t *ctx);
/* x rounded to the precision (identity for FP32). */
float ps_hround_value(ps_precision_t prec, float x);

extern const ps_backend_t ps_backend_cpu_round;
#endif
