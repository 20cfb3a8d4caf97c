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
    float momentum;   /* DGC momentum correction: 0 = off */
    int nesterov;
    float **velocity; /* (nparts) x numel[p] when momentum > 0, allocated on first use */
    size_t **blocks;  /* (nparts) x nblocks[p] tensor lengths, or NULL (one block) */
    size_t *nblocks;  /* (nparts) */
};

void ps_ef_destroy(ps_ef_t **efp)
{
    if (!efp || !*efp) return;
    ps_ef_t *ef = *efp;
    for (size_t p = 0; ef->residual && p < ef->nparts; p++) free(ef->residual[p]);
    for (size_t p = 0; ef->velocity && p < ef->nparts; p++) free(ef->velocity[p]);
    for (size_t p = 0; ef->blocks && p < ef->nparts; p++) free(ef->blocks[p]);
    free(ef->residual);
    free(ef->velocity);
    free(ef->blocks);
    free(ef->nblocks);
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
    ef->blocks = calloc(nparts ? nparts : 1, sizeof *ef->blocks);
    ef->nblocks = calloc(nparts ? nparts : 1, sizeof *ef->nblocks);
    if (!ef->numel || !ef->residual || !ef->blocks || !ef->nblocks) goto oom;
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

/* params, with the partition's blocks when params has none */
static ps_codec_params_t with_blocks(const ps_ef_t *ef, size_t part, const ps_codec_params_t *params)
{
    ps_codec_params_t prm = params ? *params : (ps_codec_params_t){0};
    if (!prm.nblocks && ef->nblocks[part] > 1) {
        prm.block_len = ef->blocks[part];
        prm.nblocks = ef->nblocks[part];
    }
    return prm;
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
    float *r = ef->residual[part], *w = ef->work, *u = NULL;
    const float m = ef->momentum;
    if (m > 0.f) {
        if (!ef->velocity[part] && !(ef->velocity[part] = calloc(numel ? numel : 1, sizeof(float)))) {
            ps_error("ps_ef_compress: out of memory for the velocity of partition %zu", part);
            return PS_ENOMEM;
        }
        u = ef->velocity[part];
    }
    /* An Inf/NaN (a loss-scale overflow) would poison the residual for good:
     * refuse the step and keep the residual; the caller skips or flags it.
     * The velocity is not written before the encode succeeded either: the
     * same expression is evaluated again below, so both agree bit for bit. */
    int finite = 1;
    if (u && ef->nesterov) {
        for (size_t i = 0; i < numel; i++) {
            w[i] = r[i] + (grad[i] + m * (m * u[i] + grad[i]));
            finite &= (w[i] - w[i]) == 0.f; /* false for Inf and NaN; vectorises */
        }
    } else if (u) {
        for (size_t i = 0; i < numel; i++) {
            w[i] = r[i] + (m * u[i] + grad[i]);
            finite &= (w[i] - w[i]) == 0.f;
        }
    } else {
        for (size_t i = 0; i < numel; i++) {
            w[i] = grad[i] + r[i];
            finite &= (w[i] - w[i]) == 0.f;
        }
    }
    if (!finite) {
        ps_error("ps_ef_compress: partition %zu: gradient holds NaN or Inf; step not compressed", part);
        return PS_ENONFINITE;
    }
    ps_codec_params_t prm = with_blocks(ef, part, params);
    size_t n = 0;
    int rc = ps_codec_encode_ex(dst, cap, &n, w, numel, dt, c, &prm, NULL);
    if (rc) return rc;
    /* decode what the server will see and keep the rest */
    rc = ps_codec_decode_ex(w, numel, dst, n, dt, c, PS_DECODE_SUB, NULL);
    if (rc) {
        ps_error("ps_ef_compress: partition %zu: our own %s/%s payload does not decode (%s)", part,
                 ps_dtype_name(dt), ps_codec_name(c), ps_strerror(rc));
        return rc;
    }
    memcpy(r, w, numel * sizeof(float));
    if (u) {
        for (size_t i = 0; i < numel; i++) u[i] = m * u[i] + grad[i];
        /* Momentum-factor masking (DGC): the velocity of a sent element has
         * reached the server.  Sign sends every element, but only its mean
         * magnitude: its velocity is kept (masking it all would be plain
         * EF-SGD without momentum). */
        if (c == PS_CODEC_TOPK) ps_codec_topk_zero_sent(u, numel, dst, n, dt);
    }
    *len = n;
    return 0;
}

size_t ps_ef_bound(const ps_ef_t *ef, size_t part, ps_dtype_t dt, ps_codec_t c,
                   const ps_codec_params_t *params)
{
    if (!ef || part >= ef->nparts) return 0;
    ps_codec_params_t prm = with_blocks(ef, part, params);
    return ps_codec_bound_ex(dt, c, ef->numel[part], &prm);
}

int ps_ef_set_blocks(ps_ef_t *ef, size_t part, const size_t *len, size_t n)
{
    if (!ef || part >= ef->nparts || (n && !len)) {
        ps_error("ps_ef_set_blocks: partition %zu not in 0..%zu", part, ef ? ef->nparts : 0);
        return PS_EINVAL;
    }
    size_t sum = 0;
    for (size_t b = 0; b < n; b++) sum += len[b];
    if (n && sum != ef->numel[part]) {
        ps_error("ps_ef_set_blocks: partition %zu: blocks add up to %zu, not %zu", part, sum,
                 ef->numel[part]);
        return PS_EINVAL;
    }
    /* at most ps_codec_sign_max_blocks: runs of neighbours merged */
    size_t lim = ps_codec_sign_max_blocks(ef->numel[part]), m = 0;
    if (lim < 2) n = 0;
    size_t run = n ? (n + lim - 1) / lim : 1;
    size_t *bl = n > 1 ? malloc(((n + run - 1) / run) * sizeof *bl) : NULL;
    if (n > 1 && !bl) return PS_ENOMEM;
    for (size_t b = 0; n > 1 && b < n; b += run) {
        size_t l = 0;
        for (size_t i = b; i < n && i < b + run; i++) l += len[i];
        if (l) bl[m++] = l; /* an empty tensor is no block */
    }
    free(ef->blocks[part]);
    ef->blocks[part] = bl;
    ef->nblocks[part] = m;
    return 0;
}

int ps_ef_set_momentum(ps_ef_t *ef, float momentum, int nesterov)
{
    if (!ef || !(momentum >= 0.f && momentum < 1.f)) {
        ps_error("ps_ef_set_momentum: momentum %g not in [0, 1)", (double)momentum);
        return PS_EINVAL;
    }
    if (momentum > 0.f && !ef->velocity) {
        ef->velocity = calloc(ef->nparts ? ef->nparts : 1, sizeof *ef->velocity);
        if (!ef->velocity) {
            ps_error("ps_ef_set_momentum: out of memory");
            return PS_ENOMEM;
        }
    }
    ef->momentum = momentum;
    ef->nesterov = nesterov != 0;
    for (size_t p = 0; ef->velocity && p < ef->nparts; p++)
        if (ef->velocity[p]) memset(ef->velocity[p], 0, ef->numel[p] * sizeof(float));
    return 0;
}

float ps_ef_topk_warmup_ratio(float target, uint64_t warmup_steps, uint64_t step)
{
    if (target <= 0.f) target = PS_CODEC_TOPK_DEFAULT_RATIO;
    if (step >= warmup_steps || target >= 0.25f) return target;
    int stages = 0;
    for (float d = 0.25f; d > target; d *= 0.25f) stages++;
    uint64_t j = step * (uint64_t)stages / warmup_steps;
    float d = 0.25f;
    for (uint64_t i = 0; i < j; i++) d *= 0.25f;
    return d > target ? d : target;
}

const float *ps_ef_residual(const ps_ef_t *ef, size_t part)
{
    return ef && part < ef->nparts ? ef->residual[part] : NULL;
}

const float *ps_ef_velocity(const ps_ef_t *ef, size_t part)
{
    return ef && ef->velocity && part < ef->nparts ? ef->velocity[part] : NULL;
}

void ps_ef_reset(ps_ef_t *ef)
{
    for (size_t p = 0; ef && p < ef->nparts; p++) {
        memset(ef->residual[p], 0, ef->numel[p] * sizeof(float));
        if (ef->velocity && ef->velocity[p]) memset(ef->velocity[p], 0, ef->numel[p] * sizeof(float));
    }
}
