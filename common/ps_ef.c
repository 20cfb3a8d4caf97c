/* Error-feedback state for a worker's pushes (see ps_ef.h).
 *
 * The accumulated gradient is built in a work buffer, not in the residual,
 * so an encode that fails (buffer too small, NaN for the sign codec) leaves
 * the residual as it was; after a successful encode the payload is decoded
 * back in subtract mode (work -= sent), which makes the residual exactly the
 * part of grad + residual that did not reach the server, including the
 * rounding of fp16/bf16 values. */
#include "ps_ef.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdlib.h>
#include <string.h>

struct ps_ef {
    size_t nparts;
    size_t *numel;    /* (nparts) */
    float **residual; /* (nparts) x numel[p], zero at start */
    float *work;      /* (max numel) grad + residual for the step in progress */
};

void ps_ef_destroy(ps_ef_t **efp)
{
    if (!efp || !*efp) return;
    ps_ef_t *ef = *efp;
    for (size_t p = 0; ef->residual && p < ef->nparts; p++) free(ef->residual[p]);
    free(ef->residual);
    free(ef->numel);
    free(ef->work);
    free(ef);
    *efp = NULL;
}

int ps_ef_new(ps_ef_t **efp, size_t nparts, const size_t *numel)
{
    if (!efp) return PS_EINVAL;
    *efp = NULL;
    if (nparts && !numel) {
        ps_error("ps_ef_new: %zu partitions but no sizes", nparts);
        return PS_EINVAL;
    }
    ps_ef_t *ef = calloc(1, sizeof *ef);
    if (!ef) goto oom;
    ef->nparts = nparts;
    ef->numel = calloc(nparts ? nparts : 1, sizeof *ef->numel);
    ef->residual = calloc(nparts ? nparts : 1, sizeof *ef->residual);
    if (!ef->numel || !ef->residual) goto oom;
    size_t maxn = 1;
    for (size_t p = 0; p < nparts; p++) {
        if (numel[p] > SIZE_MAX / sizeof(float) / 2) {
            ps_error("ps_ef_new: partition %zu has %zu elements, too many", p, numel[p]);
            ps_ef_destroy(&ef);
            return PS_EINVAL;
        }
        ef->numel[p] = numel[p];
        ef->residual[p] = calloc(numel[p] ? numel[p] : 1, sizeof(float));
        if (!ef->residual[p]) goto oom;
        if (numel[p] > maxn) maxn = numel[p];
    }
    ef->work = malloc(maxn * sizeof(float));
    if (!ef->work) goto oom;
    *efp = ef;
    return 0;
oom:
    ps_error("ps_ef_new: out of memory for %zu residual partitions", nparts);
    ps_ef_destroy(&ef);
    return PS_ENOMEM;
}

int ps_ef_compress(ps_ef_t *ef, size_t part, const float *grad, size_t numel, ps_dtype_t dt,
                   ps_codec_t c, const ps_codec_params_t *params, void *dst, size_t cap,
                   size_t *len)
{
    if (!ef || !len || part >= ef->nparts) {
        ps_error("ps_ef_compress: partition %zu not in 0..%zu", part, ef ? ef->nparts : 0);
        return PS_EINVAL;
    }
    if (numel != ef->numel[part]) {
        ps_error("ps_ef_compress: partition %zu has %zu elements, gradient has %zu", part,
                 ef->numel[part], numel);
        return PS_EMISMATCH;
    }
    float *r = ef->residual[part], *w = ef->work;
    /* An Inf/NaN (a loss-scale overflow) would poison the residual for good:
     * refuse the step and keep the residual; the caller skips or flags it. */
    int finite = 1;
    for (size_t i = 0; i < numel; i++) {
        w[i] = grad[i] + r[i];
        finite &= (w[i] - w[i]) == 0.f; /* false for Inf and NaN; vectorises */
    }
    if (!finite) {
        ps_error("ps_ef_compress: partition %zu: gradient holds NaN or Inf; step not compressed", part);
        return PS_ENONFINITE;
    }
    size_t n = 0;
    int rc = ps_codec_encode_ex(dst, cap, &n, w, numel, dt, c, params, NULL);
    if (rc) return rc;
    /* decode what the server will see and keep the rest */
    rc = ps_codec_decode_ex(w, numel, dst, n, dt, c, PS_DECODE_SUB, NULL);
    if (rc) {
        ps_error("ps_ef_compress: partition %zu: our own %s/%s payload does not decode (%s)", part,
                 ps_dtype_name(dt), ps_codec_name(c), ps_strerror(rc));
        return rc;
    }
    memcpy(r, w, numel * sizeof(float));
    *len = n;
    return 0;
}

const float *ps_ef_residual(const ps_ef_t *ef, size_t part)
{
    return ef && part < ef->nparts ? ef->residual[part] : NULL;
}

void ps_ef_reset(ps_ef_t *ef)
{
    for (size_t p = 0; ef && p < ef->nparts; p++) memset(ef->residual[p], 0, ef->numel[p] * sizeof(float));
}
