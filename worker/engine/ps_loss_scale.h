/* Dynamic loss scaling for mixed-precision training (SimpleDet,
 * Micikevicius et al. 2018).  The loss is multiplied by `scale` before
 * backward so small fp16 gradients do not flush to zero; the gradients are
 * divided by it again (exactly: the scale is always a power of two) before
 * they go on the wire.  If any gradient is Inf/NaN the step is skipped and
 * the scale halves; after `growth_interval` clean steps in a row it doubles.
 *
 * The policy is plain C with no device code, so it is unit-tested on the
 * CPU (tests/test_loss_scale.c); the overflow check of a device buffer is
 * ps_cuda_check_overflow() (worker/engine/cuda/ps_cuda_backend.h), the host
 * one ps_loss_scale_has_overflow() below.
 *
 * Cluster contract ("an overflow on any worker skips the step everywhere";
 * the server side belongs to psd, this is what it must implement):
 *   1. Each worker checks its own (scaled) gradient of step i; a worker that
 *      found an overflow sets PS_FLAG_OVERFLOW (common/ps_wire.h) on EVERY
 *      PUSH of step i, and pushes its gradient unchanged (the payload is
 *      ignored).  With loss scaling on, the worker checks the whole gradient
 *      before its first push of the step (one pass over the gradient
 *      arena, ~0.1 ms on a GPU), so the flag is the same on all its pushes.
 *   2. A server applies no update of step i to any partition for which any
 *      worker's PUSH of step i carries the flag: weights, optimizer state
 *      and learning-rate schedule stay as they were; the partition's version
 *      still advances so pulls do not stall.  Replies (PUSHPULL / PULL) of
 *      that step carry PS_FLAG_OVERFLOW so every worker learns the verdict.
 *   3. Each worker computes the step's verdict as the OR of its own flag and
 *      the flags on its replies of step i (ps_loss_scale_agree()), then calls
 *      ps_loss_scale_update() with it - every worker sees the same verdict,
 *      so every worker's scale stays identical.
 *   Ring mode: the flag is OR-reduced with the gradients (one extra element).
 */
#ifndef PS_LOSS_SCALE_H
#define PS_LOSS_SCALE_H
#include <stddef.h>
#include <stdint.h>

typedef struct ps_loss_scale_config {
    float init_scale;     /* 65536 (2^16) */
    float min_scale;      /* 1: the scale never halves below this */
    float max_scale;      /* 2^24: nor doubles above this */
    int growth_interval;  /* clean steps in a row before doubling: 2000 */
} ps_loss_scale_config_t;

typedef struct ps_loss_scale {
    ps_loss_scale_config_t cfg;
    float scale;          /* current loss scale (power of two) */
    int clean;            /* clean steps since the last change */
    uint64_t steps;       /* steps seen by ps_loss_scale_update */
    uint64_t skipped;     /* of which skipped for overflow */
} ps_loss_scale_t;

/* Defaults above; values that are not powers of two or out of order are
 * refused (PS_EINVAL, logged). cfg NULL = defaults. */
void ps_loss_scale_config_default(ps_loss_scale_config_t *cfg);
int ps_loss_scale_init(ps_loss_scale_t *ls, const ps_loss_scale_config_t *cfg);

/* 1 if any of g[0..n) is Inf or NaN (the CPU check), else 0. */
int ps_loss_scale_has_overflow(const float *g, size_t n);

/* The Header.flags bits for this worker's PUSHes of a step. */
uint32_t ps_loss_scale_push_flags(int local_overflow);
/* The step's verdict from this worker's flag and the flags of the replies
 * (or, on a server, of every worker's PUSH) of the step: 1 = overflow. */
int ps_loss_scale_agree(int local_overflow, const uint32_t *flags, size_t n);

/* Record the step's verdict: on overflow halve the scale (not below
 * min_scale) and return 0 (skip the step); else count a clean step,
 * double the scale after growth_interval of them (not above max_scale) and
 * return 1 (apply).  The returned decision is for the step just done. */
int ps_loss_scale_update(ps_loss_scale_t *ls, int overflow);

/* Multiply the loss by this before backward / the gradient by the inverse
 * after it (exact: powers of two). */
static inline float ps_loss_scale_get(const ps_loss_scale_t *ls) { return ls->scale; }
/* g *= 1/scale on the host (the device version: ps_cuda_scale()). */
void ps_loss_scale_unscale(const ps_loss_scale_t *ls, float *g, size_t n);
#endif
