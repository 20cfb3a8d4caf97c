/* A CPU "rounding" backend: the CPU fp32 layers with the CUDA backend's
 * half-storage rounding points (issue 5), the independent reference for
 * the whole-model half tests (tests/test_half_round.c on the CPU,
 * tests/test_cuda_half_model.c on a GPU).
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
 *     parameters and parameter gradients other than conv's stay fp32.
 * Which tensors are half is tracked as the CUDA backend does (mixed.cu): a
 * tag per pointer, set by the layer that writes it.  xent's backward
 * multiplies dloss by the loss scale (the model's gradients come out
 * scaled, like the CUDA backend's).  The fused bn+relu entries are NULL,
 * as on CUDA, so the model takes the same path.
 *
 * State lives in ctx->backend_state (the CPU layers do not use it). */
#ifndef PS_TEST_HALF_ROUND_H
#define PS_TEST_HALF_ROUND_H
#include "worker/engine/ps_engine.h"
#include "worker/models/ps_model.h"

enum { PS_HROUND_OFF = 0, PS_HROUND_FP16 = 1, PS_HROUND_BF16 = 2 };

/* Attach rounding state to ctx (after ps_engine_init): prec as above
 * (OFF: the same calls and copies, rounding the identity; then the model
 * must match the CPU backend bitwise), loss_scale > 0.  0 or PS_EINVAL /
 * PS_ENOMEM. */
int ps_hround_init(ps_ctx_t *ctx, int prec, float loss_scale);
void ps_hround_free(ps_ctx_t *ctx);
/* Forget every tag (a new step writes everything again). */
void ps_hround_forget(ps_ctx_t *ctx);
/* 1 when p was last written in half by a layer of this backend. */
int ps_hround_is_half(ps_ctx_t *ctx, const void *p);
/* Calls whose operands had different storage (the CUDA backend refuses
 * them: a model that makes one is broken) and values rounded so far. */
long ps_hround_mismatches(ps_ctx_t *ctx);
long ps_hround_rounded(ps_ctx_t *ctx);
/* x rounded to the precision (identity for OFF). */
float ps_hround_value(int prec, float x);

extern const ps_backend_t ps_backend_cpu_round;

/* ---- one training step's results, for comparing models ---------------- */

/* What a step produced, copied out of a model (host-readable arena: CPU,
 * or CUDA managed memory after a sync): loss, logits, every trainable
 * parameter's gradient times grad_scale (1 / loss scale), the BN running
 * statistics. */
typedef struct ps_hround_snap {
    double loss;
    float *logits;
    size_t nlogits;
    int np;             /* trainable parameters */
    char **name;        /* np names */
    float **g;          /* np gradients */
    size_t *numel;      /* np sizes */
    float *bufs;        /* f32 BN buffers, concatenated */
    size_t nbufs;
    int nb;             /* f32 buffers: name and offset into bufs (nb + 1) */
    char **bname;
    size_t *boff;
} ps_hround_snap_t;
int ps_hround_snap(ps_hround_snap_t *s, const ps_model_t *m, int nlogits, float loss,
                   double grad_scale);
void ps_hround_snap_free(ps_hround_snap_t *s);
/* how many of s's parameter tensors hold a non-finite gradient */
int ps_hround_snap_nonfinite(const ps_hround_snap_t *s);
/* |a - b|_2 / |b|_2 (|a - b|_2 when b is 0); NaN anywhere -> inf */
double ps_hround_relerr(const float *a, const float *b, size_t n);
/* Compare a with ref: returns the worst per-tensor relative L2 gradient
 * error (inf on a shape mismatch), its tensor in *worst (may be NULL);
 * the logits' and BN buffers' errors in *elog / *ebuf (may be NULL). */
double ps_hround_snap_cmp(const ps_hround_snap_t *a, const ps_hround_snap_t *ref,
                          const char **worst, double *elog, double *ebuf);
/* The f32 buffer of a whose relative L2 error against ref's is largest
 * (NULL on a shape mismatch), that error in *e. */
const char *ps_hround_snap_worst_buf(const ps_hround_snap_t *a, const ps_hround_snap_t *ref,
                                     double *e);
/* 1 when every gradient, the logits, the loss and the buffers are
 * bitwise equal. */
int ps_hround_snap_equal(const ps_hround_snap_t *a, const ps_hround_snap_t *b);
#endif
