/* Error feedback for lossy gradient codecs (top-k, sign, and the rounding of
 * fp16/bf16), kept on the worker, one residual per partition.
 *
 * Each step, for partition p:  acc = grad + residual[p];  send encode(acc);
 * residual[p] = acc - decode(sent).  What a codec drops is not lost but
 * delayed: summed over steps, sent + final residual == sum of gradients (up
 * to fp32 rounding), which is what lets top-k at 0.1-1% and 1-bit sign
 * converge like uncompressed SGD (Seide et al. 2014, Lin et al. 2018 "Deep
 * Gradient Compression", Karimireddy et al. 2019).
 *
 * DGC's momentum correction (Lin et al. 2018), as an option
 * (ps_ef_set_momentum): the worker keeps a velocity u per partition and
 * accumulates it instead of the gradient,
 *     u = m*u + g;   acc = residual + (nesterov ? g + m*u : u)
 * sends encode(acc), keeps residual = acc - sent and, for top-k, zeroes u
 * where an element was sent (momentum-factor masking: that velocity has been
 * delivered and must not push the weight again).  The servers must then run
 * plain SGD (momentum 0) on these pushes, otherwise momentum is applied twice;
 * psworker sends momentum 0 in the INIT optimizer config when this is on.
 * Why: with server-side momentum a top-k element that waits 100 steps in the
 * residual arrives as one big gradient that momentum then stretches over
 * the next ~1/(1-m) steps -- late twice; accumulating velocity on the worker
 * sends what momentum SGD would have applied by now.  Without the option the
 * residual holds gradient, as in EF-SGD (Karimireddy et al. 2019).
 *
 * Blocks (ps_ef_set_blocks): a partition holds many model tensors; top-k
 * is taken per tensor (as DGC does per layer) and sign keeps one scale per
 * block, so a tensor with small gradients is neither starved by the big ones
 * nor sent their magnitude.
 *
 * Top-k density warm-up (DGC's "warm-up training"): ps_ef_topk_warmup_ratio
 * gives the fraction to send at a step, exponentially decreasing from 25%
 * to the target over the first steps, so the early, fast-changing gradients
 * are not delayed for hundreds of steps in the residual.
 *
 * Thread safety: none inside one ps_ef_t (it owns one work buffer so that a
 * failed encode leaves the residual untouched); a worker that compresses
 * from several threads gives each thread its own ps_ef_t. */
#ifndef PS_EF_H
#define PS_EF_H
#include "ps_codec.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ps_ef ps_ef_t;

/* Residuals for nparts partitions of numel[p] elements, all zero.
 * Returns 0, PS_EINVAL or PS_ENOMEM; *ef is NULL on failure. */
int ps_ef_new(ps_ef_t **ef, size_t nparts, const size_t *numel);
/* Frees and NULLs *ef (NULL-safe). */
void ps_ef_destroy(ps_ef_t **ef);

/* Compress grad[0..numel) of partition part into dst (capacity cap, see
 * ps_codec_bound_ex), *len = bytes written, and update the residual.  numel
 * must match the partition.  Works with every codec (for RAW/LZ4 the residual
 * carries the fp16/bf16 rounding error; with fp32 it stays zero).  Returns 0
 * or the encode error (PS_ERANGE, PS_EINVAL, ...), PS_EMISMATCH for a wrong
 * numel, PS_ENONFINITE when grad + residual holds NaN/Inf (a loss-scale
 * overflow: send that step flagged and uncompressed, or skip it); on any
 * error the residual is unchanged.  Call it once per partition and step: a
 * retried send must resend the same payload, not compress again (that would
 * subtract what was sent twice). */
int ps_ef_compress(ps_ef_t *ef, size_t part, const float *grad, size_t numel, ps_dtype_t dt,
                   ps_codec_t c, const ps_codec_params_t *params, void *dst, size_t cap,
                   size_t *len);

/* Turn DGC momentum correction on (momentum in (0, 1)) or off (0) for every
 * partition; the velocities start at zero (allocated on the first compress
 * of each partition).  Returns 0 or PS_EINVAL for momentum outside [0, 1). */
int ps_ef_set_momentum(ps_ef_t *ef, float momentum, int nesterov);

/* Compress partition part as n blocks of len[0..n) elements (its model
 * tensors, in order; they must add up to its numel): top-k per block, one
 * sign scale per block (ps_codec_params_t.block_len).  More than
 * ps_codec_sign_max_blocks(numel) blocks are merged in runs of neighbours.  Used when the
 * params given to ps_ef_compress carry no blocks.  Returns 0, PS_EINVAL or
 * PS_ENOMEM. */
int ps_ef_set_blocks(ps_ef_t *ef, size_t part, const size_t *len, size_t n);

/* Bytes ps_ef_compress may write for partition part with these params
 * (ps_codec_bound_ex with the partition's blocks); 0 for a bad index. */
size_t ps_ef_bound(const ps_ef_t *ef, size_t part, ps_dtype_t dt, ps_codec_t c,
                   const ps_codec_params_t *params);

/* Top-k fraction for step `step` (0-based) with a warm-up of warmup_steps:
 * the warm-up is cut into J equal stages, stage j sending 0.25 / 4^j, where
 * J is the number of such densities above target (DGC's 25%, 6.25%, 1.56%,
 * 0.39% for a 0.1% target); from warmup_steps on, or when the target is at
 * least 25% or warmup_steps is 0, target itself.  target 0 = the codec's
 * default ratio. */
float ps_ef_topk_warmup_ratio(float target, uint64_t warmup_steps, uint64_t step);

/* The residual of a partition (numel floats), or NULL for a bad index. */
const float *ps_ef_residual(const ps_ef_t *ef, size_t part);
/* The velocity of a partition under momentum correction (numel floats), or
 * NULL when momentum is off, the index is bad or nothing was compressed yet. */
const float *ps_ef_velocity(const ps_ef_t *ef, size_t part);
/* Zero every residual and velocity (after restoring weights from a checkpoint, or when a
 * step is abandoned and its residual should not carry over). */
void ps_ef_reset(ps_ef_t *ef);
#endif
