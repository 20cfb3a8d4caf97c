/* Replies: every message psd sends goes out through here, so the counters
 * (messages and bytes out, replies dropped, ERRORs by code) and the rate
 * limit on ERROR log lines live in one place.  A reply the peer cannot take
 * (gone, or not reading) is dropped rather than queued: requests are
 * idempotent, the peer retries.  Uses only the socket in psd_t and the
 * store's encoded weights; it calls nothing above it. */
#include "psd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"

int psd_send(psd_t *s, const void *id, size_t idlen, Ps__Header *h, const void *payload, size_t len)
{
    int rc = ps_wire_send(s->sock, id, idlen, h, payload, len, NULL, NULL, ZMQ_DONTWAIT);
    if (rc) {
        /* The peer is gone or not reading: it will retry (requests are
         * idempotent), so the reply is dropped rather than queued. */
        s->mx.dropped_replies++;
        ps_debug("reply %s dropped: %s", ps_wire_type_name(h->type), ps_strerror(rc));
        return rc;
    }
    s->mx.msgs_out++;
    s->mx.bytes_out += ps__header__get_packed_size(h) + len;
    return 0;
}

void psd_send_ack(psd_t *s, const void *id, size_t idlen, uint64_t request_id)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
    h.has_request_id = 1, h.request_id = request_id;
    psd_send(s, id, idlen, &h, NULL, 0);
}

/* psd_errors_total{code}: errors[-code], errors[0] for codes out of range. */
static void count_error(psd_t *s, int code)
{
    int i = -code;
    if (i > 0 && i < PSD_NERR) s->mx.errors[i]++;
    else s->mx.errors[0]++;
}

/* Every error is counted, but a flood of bad messages must not flood the
 * log: at most 20 lines a second, then one line saying how many were left
 * out (flushed from here and from the heartbeat timer). */
static uint64_t err_window_ms, err_suppressed;
static int err_in_window;

void psd_errors_log_flush(psd_t *s)
{
    uint64_t now = s->loop ? uv_now(s->loop) : 0;
    if (!s->stopping && now - err_window_ms < 1000) return;
    if (err_suppressed)
        ps_warn("%llu more ERROR replies in the last %.1f s not logged (see psd_errors_total)",
                (unsigned long long)err_suppressed, (now - err_window_ms) / 1000.0);
    err_window_ms = now;
    err_in_window = 0;
    err_suppressed = 0;
}

void psd_send_error(psd_t *s, const void *id, size_t idlen, const Ps__Header *req, int code,
                    const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    count_error(s, code);
    psd_errors_log_flush(s);
    if (err_in_window++ < 20)
        ps_warn("%s from rank %d: %s: %s", req ? ps_wire_type_name(req->type) : "message",
                req && req->has_rank ? req->rank : -1, ps_errname(code), text);
    else
        err_suppressed++;
    uint64_t rid = req ? req->request_id : 0;
    uint32_t part = req ? req->partition : 0;
    if (ps_wire_send_error(s->sock, id, idlen, rid, part, code, "%s", text) == 0) {
        s->mx.msgs_out++;
        s->mx.bytes_out += 32 + strlen(text);
    } else {
        s->mx.dropped_replies++;
    }
}

void psd_send_rebuild_error(psd_t *s, const void *id, size_t idlen, const Ps__Header *req,
                            const char *text)
{
    count_error(s, PS_ESTATE);
    psd_errors_log_flush(s);
    if (err_in_window++ < 20)
        ps_warn("%s from rank %d: %s (the workers rebuild this server)",
                ps_wire_type_name(req->type), req->has_rank ? req->rank : -1, text);
    else
        err_suppressed++;
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ERROR);
    h.has_request_id = 1, h.request_id = req->request_id;
    h.has_partition = req->has_partition, h.partition = req->partition;
    h.has_error_code = 1, h.error_code = PS_ESTATE;
    h.error_text = (char *)text;
    h.has_flags = 1, h.flags = PS_FLAG_REBUILD;
    psd_send(s, id, idlen, &h, NULL, 0);
}

void psd_send_rollback_error(psd_t *s, const void *id, size_t idlen, const Ps__Header *req,
                             uint64_t v, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    count_error(s, PS_ESTATE);
    ps_warn("%s from rank %d: %s (workers roll back to %llu)", ps_wire_type_name(req->type),
            req->has_rank ? req->rank : -1, text, (unsigned long long)v);
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ERROR);
    h.has_request_id = 1, h.request_id = req->request_id;
    h.has_partition = req->has_partition, h.partition = req->partition;
    h.has_error_code = 1, h.error_code = PS_ESTATE;
    h.error_text = text;
    h.has_flags = 1, h.flags = PS_FLAG_ROLLBACK;
    h.has_iteration = 1, h.iteration = v;
    psd_send(s, id, idlen, &h, NULL, 0);
}

int psd_reply_codec(const Ps__Header *h)
{
    return h->has_reply_codec ? (int)h->reply_codec : (int)h->codec;
}

/* WEIGHTS of p at version v from the encoded buffer b (one reference,
 * handed to the send), zero-copy.  flags: PS_FLAG_OVERFLOW when the update
 * that made this version was skipped for a loss-scale overflow (every
 * worker's scaler must see the same verdict), PS_FLAG_STATE when b holds
 * weights then momentum. */
static void send_buf(psd_t *s, const void *id, size_t idlen, uint64_t request_id, psd_part_t *p,
                     psd_buf_t *b, uint64_t v, uint32_t flags, int dtype, int codec)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_WEIGHTS);
    h.has_request_id = 1, h.request_id = request_id;
    h.has_partition = 1, h.partition = p->id;
    h.has_iteration = 1, h.iteration = v;
    h.has_dtype = 1, h.dtype = dtype;
    h.has_codec = 1, h.codec = codec;
    h.has_numel = 1, h.numel = p->numel;
    if (flags) h.has_flags = 1, h.flags = flags;
    if (s->nepochs) h.has_epochs = 1, h.epochs = (uint32_t)s->nepochs; /* elastic */
    /* Zero-copy: every reply of this version shares the one encoded buffer. */
    int rc = ps_wire_send_crc(s->sock, id, idlen, &h, b->data, b->len, b->crc, psd_buf_zmq_free, b,
                              ZMQ_DONTWAIT);
    if (rc) {
        psd_buf_unref(b);
        s->mx.dropped_replies++;
        ps_debug("WEIGHTS %u dropped: %s", p->id, ps_strerror(rc));
        return;
    }
    s->mx.msgs_out++;
    s->mx.bytes_out += b->len + 64;
}

static uint32_t skipped_flag(const psd_part_t *p)
{
    return p->skipped_ver && p->skipped_ver == p->version ? PS_FLAG_OVERFLOW : 0;
}

static void encode_error(psd_t *s, const void *id, size_t idlen, uint64_t request_id,
                         const psd_part_t *p, int dtype, int codec, int err)
{
    Ps__Header q;
    ps_wire_header_init(&q, PS__MSG_TYPE__MSG_PULL);
    q.request_id = request_id;
    q.partition = p->id;
    psd_send_error(s, id, idlen, &q, err, "cannot encode partition %u as %s/%s: %s", p->id,
                   ps_dtype_name(dtype), ps_codec_name(codec), ps_strerror(err));
}

void psd_send_weights(psd_t *s, const void *id, size_t idlen, uint64_t request_id, psd_part_t *p,
                      int dtype, int codec)
{
    int err = 0;
    psd_buf_t *b = psd_store_encoded(s, p, dtype, codec, &err);
    if (!b) {
        encode_error(s, id, idlen, request_id, p, dtype, codec, err);
        return;
    }
    send_buf(s, id, idlen, request_id, p, b, p->version, skipped_flag(p), dtype, codec);
}

void psd_send_state(psd_t *s, const void *id, size_t idlen, uint64_t request_id, psd_part_t *p)
{
    size_t n = p->numel;
    psd_buf_t *b = malloc(sizeof *b + 2 * n * sizeof(float));
    if (!b) {
        encode_error(s, id, idlen, request_id, p, PS_DT_FP32, PS_CODEC_RAW, PS_ENOMEM);
        return;
    }
    atomic_init(&b->refs, 1);
    b->version = p->version;
    b->len = 2 * n * sizeof(float);
    memcpy(b->data, p->w, n * sizeof(float));
    memcpy(b->data + n * sizeof(float), p->m, n * sizeof(float));
    b->crc = ps_crc32c(0, b->data, b->len);
    send_buf(s, id, idlen, request_id, p, b, p->version, skipped_flag(p) | PS_FLAG_STATE,
             PS_DT_FP32, PS_CODEC_RAW);
}

void psd_send_weights_of(psd_t *s, const void *id, size_t idlen, uint64_t request_id,
                         psd_part_t *p, uint64_t v, int dtype, int codec)
{
    if (v == p->version) {
        psd_send_weights(s, id, idlen, request_id, p, dtype, codec);
        return;
    }
    Ps__Header q;
    ps_wire_header_init(&q, PS__MSG_TYPE__MSG_PULL);
    q.request_id = request_id;
    q.has_partition = 1, q.partition = p->id;
    if (v != p->prev_version) {
        psd_send_error(s, id, idlen, &q, PS_ESTATE,
                       "PULL of version %llu exactly: partition %u is at version %llu and keeps "
                       "only the version before it", (unsigned long long)v, p->id,
                       (unsigned long long)p->version);
        return;
    }
    int err = 0;
    psd_buf_t *b = psd_store_encoded_prev(s, p, dtype, codec, &err);
    if (!b) {
        encode_error(s, id, idlen, request_id, p, dtype, codec, err);
        return;
    }
    send_buf(s, id, idlen, request_id, p, b, v, p->prev_skipped ? PS_FLAG_OVERFLOW : 0, dtype,
             codec);
}

void psd_reply_keep_id(uint8_t dst[256], uint8_t *dlen, const ps_wire_msg_t *m)
{
    size_t n = zmq_msg_size((zmq_msg_t *)&m->identity);
    if (n > 255) n = 255; /* ZeroMQ routing ids are at most 255 bytes */
    memcpy(dst, zmq_msg_data((zmq_msg_t *)&m->identity), n);
    *dlen = (uint8_t)n;
}

int psd_reply_same_id(const uint8_t *id, size_t idlen, const ps_wire_msg_t *m)
{
    return idlen == zmq_msg_size((zmq_msg_t *)&m->identity) &&
           !memcmp(id, zmq_msg_data((zmq_msg_t *)&m->identity), idlen);
}
