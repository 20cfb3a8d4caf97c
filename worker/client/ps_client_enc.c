/* psd client, caller side: encoding a partition's gradient for the wire,
 * with error feedback for the lossy codecs (top-k, sign) and, as an option,
 * for the rounding of fp16/bf16.  Runs in the caller's thread, so encoding
 * overlaps with the I/O thread's sends and decodes. */
#include <stdlib.h>
#include <string.h>

#include "ps_client_int.h"
#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"

/* Grow *buf to need bytes (never shrinks; contents are not kept). */
static int grow(void **buf, size_t *cap, size_t need)
{
    if (*cap >= need) return 0;
    void *p = malloc(need);
    if (!p) return PS_ENOMEM;
    /* Fault every page in now, once, rather than on the first messages. */
    memset(p, 0, need);
    free(*buf);
    *buf = p;
    *cap = need;
    return 0;
}

int ps_client_uses_ef(const ps_client_t *c, ps_dtype_t dt, ps_codec_t codec)
{
    if (codec == PS_CODEC_TOPK || codec == PS_CODEC_SIGN) return 1;
    return c->o.ef_rounding && dt != PS_DT_FP32;
}

/* Take partition part's encode buffer (sized for bound + sbytes of scratch)
 * if no other request holds it; else a temporary buffer owned by r.  Sets
 * *buf / *scratch. */
static int take_buffer(ps_client_t *c, ps_req_t *r, uint32_t part, size_t bound, size_t sbytes,
                       int *mine, void **buf, void **scratch)
{
    pthread_mutex_lock(&c->mu);
    *mine = c->enc_refs[part] == 0;
    if (*mine) c->enc_refs[part] = 1;
    pthread_mutex_unlock(&c->mu);
    if (*mine) {
        r->enc_part = part;
        if (grow(&c->enc[part], &c->enc_cap[part], bound) ||
            (sbytes && grow(&c->enc_scratch[part], &c->enc_scratch_cap[part], sbytes))) {
            ps_client_set_error(c, "partition %u: no memory for a %zu-byte encode buffer", part, bound);
            return PS_ENOMEM;
        }
        *buf = c->enc[part];
        *scratch = sbytes ? c->enc_scratch[part] : NULL;
        return 0;
    }
    /* Two requests on one partition at once (e.g. a push of the next step
     * before the previous one was waited for): rare, a temporary is fine. */
    r->tmp = malloc(bound + sbytes + 64);
    if (!r->tmp) {
        ps_client_set_error(c, "partition %u: no memory for %zu bytes", part, bound);
        return PS_ENOMEM;
    }
    *buf = r->tmp;
    *scratch = sbytes ? (char *)r->tmp + ((bound + 63) & ~(size_t)63) : NULL;
    return 0;
}

/* The raw fp32 payload straight from the caller's buffer (zero-copy). */
static void raw_fp32(ps_req_t *r, const float *src, size_t numel)
{
    r->dtype = PS_DT_FP32;
    r->codec = PS_CODEC_RAW;
    r->payload = src;
    r->payload_len = numel * sizeof(float);
    r->crc = ps_crc32c(0, src, r->payload_len);
}

/* Error-feedback encode: once per partition and iteration.  Under ef_mu the
 * whole way, so two threads pushing the same step cannot both compress it. */
static int encode_ef(ps_client_t *c, ps_req_t *r, uint32_t part, const float *src, size_t numel)
{
    ps_dtype_t dt = r->dtype;
    ps_codec_t codec = r->codec;
    int rc = 0;
    if (r->flags & PS_FLAG_OVERFLOW) {
        /* The caller's loss scaler saw the overflow: nothing to compress,
         * and the residual must not absorb Inf. */
        raw_fp32(r, src, numel);
        return 0;
    }
    pthread_mutex_lock(&c->ef_mu);
    if (c->ef_valid[part] && c->ef_iter[part] == r->iteration) {
        /* Already compressed (a retried step): resend the very same bytes;
         * compressing again would subtract what was sent twice.  The buffer
         * is unchanged: it is only rewritten for another iteration. */
        pthread_mutex_lock(&c->mu);
        c->enc_refs[part]++;
        pthread_mutex_unlock(&c->mu);
        r->enc_part = part;
        r->payload = c->enc[part];
        r->payload_len = c->ef_len[part];
        r->crc = c->ef_crc[part];
        pthread_mutex_unlock(&c->ef_mu);
        return 0;
    }
    /* top-k warm-up: a denser push in the first iterations */
    ps_codec_params_t params = c->params;
    if (codec == PS_CODEC_TOPK)
        params.topk_ratio = ps_ef_topk_warmup_ratio(params.topk_ratio, c->o.topk_warmup_steps,
                                                    r->iteration);
    size_t bound = ps_ef_bound(c->ef, part, dt, codec, &params);
    void *buf = NULL, *scratch = NULL;
    int mine = 0;
    if ((rc = take_buffer(c, r, part, bound, 0, &mine, &buf, &scratch)) < 0) goto out;
    if (mine) c->ef_valid[part] = 0; /* being rewritten */
    size_t len = 0;
    rc = ps_ef_compress(c->ef, part, src, numel, dt, codec, &params, buf, bound, &len);
    if (rc == PS_ENONFINITE) {
        /* Loss-scale overflow: the residual is untouched; the server skips
         * the step for everybody and does not read the payload. */
        ps_warn("partition %u iteration %llu: gradient holds NaN/Inf; sent as an overflowed step",
                part, (unsigned long long)r->iteration);
        r->flags |= PS_FLAG_OVERFLOW;
        raw_fp32(r, src, numel);
        rc = 0;
        goto out;
    }
    if (rc < 0) {
        ps_client_set_error(c, "partition %u: compressing %zu elements as %s/%s failed: %s", part,
                            numel, ps_dtype_name(dt), ps_codec_name(codec), ps_strerror(rc));
        ps_error("%s", c->last_error);
        goto out;
    }
    r->payload = buf;
    r->payload_len = len;
    r->crc = ps_crc32c(0, buf, len);
    if (mine) {
        c->ef_valid[part] = 1;
        c->ef_iter[part] = r->iteration;
        c->ef_len[part] = len;
        c->ef_crc[part] = r->crc;
    }
    /* Compressed into a temporary (the partition's buffer was busy with
     * another iteration): not remembered, so a re-push of this iteration
     * would compress again.  Only a caller that pipelines several steps of
     * one partition AND re-pushes one of them can get there. */
out:
    pthread_mutex_unlock(&c->ef_mu);
    return rc;
}

int ps_client_encode_part(ps_client_t *c, ps_req_t *r, uint32_t part, const float *src,
                          ps_dtype_t dt, ps_codec_t codec)
{
    size_t numel = c->t->parts[part].numel;
    r->dtype = dt;
    r->codec = codec;
    r->numel = numel;
    if (c->ef && r->type != PS__MSG_TYPE__MSG_INIT && ps_client_uses_ef(c, dt, codec))
        return encode_ef(c, r, part, src, numel);
    if (dt == PS_DT_FP32 && codec == PS_CODEC_RAW) {
        raw_fp32(r, src, numel);
        return 0;
    }
    size_t bound = ps_codec_bound_ex(dt, codec, numel, &c->params);
    size_t sbytes = ps_codec_scratch_size(dt, codec, numel);
    void *buf, *scratch;
    int mine, rc;
    if ((rc = take_buffer(c, r, part, bound, sbytes, &mine, &buf, &scratch)) < 0) return rc;
    if (mine) {
        /* A plain encode overwrites the buffer an EF payload was kept in. */
        pthread_mutex_lock(&c->ef_mu);
        if (c->ef_valid) c->ef_valid[part] = 0;
        pthread_mutex_unlock(&c->ef_mu);
    }
    size_t len = 0;
    rc = ps_codec_encode_ex(buf, bound, &len, src, numel, dt, codec, &c->params, scratch);
    if (rc < 0) {
        ps_client_set_error(c, "partition %u: encoding %zu elements as %s/%s failed: %s", part,
                            numel, ps_dtype_name(dt), ps_codec_name(codec), ps_strerror(rc));
        ps_error("%s", c->last_error);
        return rc;
    }
    r->payload = buf;
    r->payload_len = len;
    r->crc = ps_crc32c(0, buf, len);
    return 0;
}

void ps_client_ef_reset(ps_client_t *c)
{
    if (!c || !c->ef) return;
    pthread_mutex_lock(&c->ef_mu);
    ps_ef_reset(c->ef);
    memset(c->ef_valid, 0, c->t->nparts);
    pthread_mutex_unlock(&c->ef_mu);
}

const float *ps_client_ef_residual(const ps_client_t *c, uint32_t part)
{
    return c && c->ef ? ps_ef_residual(c->ef, part) : NULL;
}
