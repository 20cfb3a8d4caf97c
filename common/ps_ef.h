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
 * DGC's momentum correction (accumulate velocity rather than gradient on the
 * worker, with momentum-factor masking) is not done here: it moves momentum
 * from the server's optimizer to the worker, so it needs the server to run
 * plain SGD for those partitions — a switch in the optimizer/server config,
 * not in this module.  With server-side momentum the residual here holds
 * gradient, as in EF-SGD.
 *
 * Thread safety: none inside one ps_ef_t (it owns one work buffer so that a
 * failed encode leaves the residual untouched); a worker that compresses
 * from several threads gives each thread its own ps_ef_t. */
#ifndef PS_EF_H
#define PS_EF_H
#include "ps_codec.h"

#include <stddef.h>

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

/* The residual of a partition (numel floats), or NULL for a bad index. */
const float *ps_ef_residual(const ps_ef_t *ef, size_t part);
/* Zero every residual (after restoring weights from a checkpoint, or when a
 * step is abandoned and its residual should not carry over). */
void ps_ef_reset(ps_ef_t *ef);
#endif
