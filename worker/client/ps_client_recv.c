/* psd client, I/O thread: the replies -- matched to their request by
 * request_id, checked against what the request asked for, weights decoded
 * into the caller's buffer (or kept, ps_client_keep.c), a server that says
 * it shuts down failing whatever waits on it. */
#include <stdlib.h>
#include <string.h>

#include "ps_client_int.h"
#include "ps_error.h"
#include "ps_log.h"

static ps_req_t *lookup(ps_client_t *c, int s, const Ps__Header *h)
{
    if (!h->has_request_id) return NULL;
    uint32_t slot = (uint32_t)(h->request_id & 0xFFFFFFFFu);
    uint32_t gen = (uint32_t)(h->request_id >> 32);
    if (slot >= c->npool) return NULL;
    ps_req_t *r = &c->pool[slot];
    /* A waiter may be recycling this slot (gen, state) right now. */
    pthread_mutex_lock(&c->mu);
    int match = r->gen == gen && r->state == RQ_SENT && r->server == s;
    pthread_mutex_unlock(&c->mu);
    return match ? r : NULL;
}

static int decode_weights(ps_client_t *c, int s, ps_req_t *r, ps_wire_msg_t *m)
{
    const Ps__Header *h = m->hdr;
    if (!h->has_partition || h->partition != r->part) {
        ps_client_set_error(c, "server %d: WEIGHTS for partition %u answer a request for %u", s,
                            h->partition, r->part);
        return PS_EPROTO;
    }
    if (!h->has_numel || h->numel != r->dst_numel) {
        ps_client_set_error(c, "server %d: partition %u WEIGHTS has numel %llu, table says %zu", s,
                            r->part, (unsigned long long)h->numel, r->dst_numel);
        return PS_EMISMATCH;
    }
    ps_dtype_t dt = (ps_dtype_t)h->dtype;
    ps_codec_t codec = (ps_codec_t)h->codec;
    if (codec != PS_CODEC_RAW && codec != PS_CODEC_LZ4) {
        ps_client_set_error(c, "server %d: partition %u WEIGHTS came %s-compressed: weights must "
                            "not be lossy (asked for %s)", s, r->part, ps_codec_name(codec),
                            ps_codec_name(r->reply_codec));
        return PS_EPROTO;
    }
    size_t need = ps_codec_scratch_size(dt, codec, r->dst_numel);
    if (need > c->dec_scratch_cap) {
        void *p = malloc(need);
        if (!p) return PS_ENOMEM;
        memset(p, 0, need);  /* fault it in once; it is reused from now on */
        free(c->dec_scratch);
        c->dec_scratch = p;
        c->dec_scratch_cap = need;
    }
    const void *src = m->has_payload ? zmq_msg_data(&m->payload) : NULL;
    size_t len = m->has_payload ? zmq_msg_size(&m->payload) : 0;
    int rc = ps_codec_decode(r->dst, r->dst_numel, src ? src : "", len, dt, codec, 0,
                             need ? c->dec_scratch : NULL);
    if (rc < 0)
        ps_client_set_error(c, "server %d: partition %u WEIGHTS (%s/%s, %zu bytes) do not decode: %s",
                            s, r->part, ps_dtype_name(dt), ps_codec_name(codec), len,
                            ps_strerror(rc));
    r->version = h->iteration;
    return rc;
}

/* A PUSHPULL answered with lossy (TOPK / SIGN) weights comes from a psd
 * that ignores Header.reply_codec and encodes WEIGHTS with the push's
 * codec.  The push is applied by then, so the request becomes a PULL of
 * the version just reported, with the pull codec: one more round trip,
 * exact weights.  A new generation drops the old request's duplicates. */
static int repull_exact(ps_client_t *c, int s, ps_req_t *r, const Ps__Header *h)
{
    if (r->type != PS__MSG_TYPE__MSG_PUSHPULL || h->type != PS__MSG_TYPE__MSG_WEIGHTS ||
        !h->has_codec || (h->codec != PS__CODEC__CODEC_TOPK && h->codec != PS__CODEC__CODEC_SIGN) ||
        !h->has_iteration)
        return 0;
    if (!c->warned_reply_codec) {
        c->warned_reply_codec = 1;
        ps_warn("server %d answers PUSHPULL with %s weights (it ignores reply_codec): pulling "
                "them again as %s, one more round trip per partition; update psd",
                s, ps_codec_name((ps_codec_t)h->codec), ps_codec_name(r->reply_codec));
    }
    pthread_mutex_lock(&c->mu);
    if (++r->gen == 0) r->gen = 1;
    r->type = PS__MSG_TYPE__MSG_PULL;
    r->min_version = h->iteration;
    r->codec = r->reply_codec;
    pthread_mutex_unlock(&c->mu);
    /* No payload for a PULL: the frames ZeroMQ may still hold stay counted
     * in zrefs, the encode buffer stays ours until the handle is released. */
    r->payload = NULL;
    r->payload_len = 0;
    r->crc = 0;
    int64_t now = ps_client_now_ms();
    if (ps_client_io_send(c, s, r) == 0) {
        r->retry_delay = c->o.retry_ms;
        r->t_retry = c->o.retry_ms > 0 ? now + c->o.retry_ms : 0;
    } else {
        r->t_retry = now + PS_CLIENT_BLOCKED_POLL_MS;
    }
    return 1;
}

static int expected_reply(int req_type, int reply_type)
{
    switch (req_type) {
    case PS__MSG_TYPE__MSG_PULL:
    case PS__MSG_TYPE__MSG_PUSHPULL: return reply_type == PS__MSG_TYPE__MSG_WEIGHTS;
    case PS__MSG_TYPE__MSG_HELLO: return reply_type == PS__MSG_TYPE__MSG_WELCOME;
    default:
        return reply_type == PS__MSG_TYPE__MSG_ACK || reply_type == PS__MSG_TYPE__MSG_STATS ||
               reply_type == PS__MSG_TYPE__MSG_WELCOME;
    }
}

/* Server s said it shuts down (an unsolicited SHUTDOWN): everything waiting
 * on it, and everything sent to it from now on, fails at once with
 * PS_ESHUTDOWN instead of waiting for the request timeout. */
static void server_shut(ps_client_t *c, int s, const char *why)
{
    ps_client_server_t *sv = &c->srv[s];
    if (!sv->shut) {
        ps_client_set_error(c, "server %d (%s) shut down%s%s", s, sv->endpoint, *why ? ": " : "",
                            why);
        if (sv->pending || sv->inflight) ps_error("%s", c->last_error);
        else ps_info("%s", c->last_error);
    }
    sv->shut = 1;
    ps_client_io_fail_all(c, sv->pending, PS_ESHUTDOWN);
    ps_client_io_fail_all(c, sv->inflight, PS_ESHUTDOWN);
    sv->pending = sv->inflight = NULL;
    sv->ninflight = 0;
}

/* The answer to late_probe: the server's "late" line, e.g. "step 812:
 * waiting 4.1 s for rank 3 (partitions 0-11 of server 1)". */
static void late_reply(ps_client_t *c, int s, const Ps__Header *h)
{
    char late[400] = "";
    const char *b = (const char *)h->body.data, *end = b + h->body.len;
    const char *k = memmem(b, h->body.len, "\"late\":\"", 8);
    if (k) {
        size_t n = 0;
        for (k += 8; k < end && *k != '"' && n + 1 < sizeof late; k++) late[n++] = *k;
        late[n] = 0;
    }
    if (late[0]) ps_warn("server %d (%s) says: %s", s, c->srv[s].endpoint, late);
}

static void handle_reply(ps_client_t *c, int s, ps_wire_msg_t *m, int rc, const char *err)
{
    ps_client_server_t *sv = &c->srv[s];
    atomic_fetch_add(&c->bytes_in, m->wire_bytes);
    if (rc < 0) {
        /* A damaged reply is dropped.  If it still names a live request,
         * that request is resent at once (retries on) or fails with the
         * reason (retries off) instead of waiting for its timeout. */
        atomic_fetch_add(&c->errors, 1);
        ps_client_set_error(c, "server %d: bad reply dropped: %s", s, err);
        ps_warn("%s", c->last_error);
        ps_req_t *r = m->hdr && m->hdr->version == PS_PROTO_VERSION ? lookup(c, s, m->hdr) : NULL;
        if (r && c->o.retry_ms > 0) {
            r->t_retry = ps_client_now_ms();
        } else if (r) {
            ps_client_io_list_remove(&sv->inflight, r);
            sv->ninflight -= ps_client_io_windowed(r);
            ps_client_io_complete(c, r, rc);
        }
        return;
    }
    const Ps__Header *h = m->hdr;
    if (h->type == PS__MSG_TYPE__MSG_SHUTDOWN && !h->request_id) {
        server_shut(c, s, h->error_text ? h->error_text : "");
        return;
    }
    if (h->type == PS__MSG_TYPE__MSG_ACK && !h->request_id && h->has_body) {
        late_reply(c, s, h);
        return;
    }
    ps_req_t *r = lookup(c, s, h);
    if (h->has_epochs && h->epochs > atomic_load(&c->epochs_seen))
        atomic_store(&c->epochs_seen, h->epochs); /* elastic: a membership change */
    if (h->type == PS__MSG_TYPE__MSG_ERROR && h->has_flags && (h->flags & PS_FLAG_REBUILD))
        ps_client_keep_give_back(c, s);
    else if (h->type == PS__MSG_TYPE__MSG_WEIGHTS)
        sv->gave_back = 0; /* whole again: a later loss is given back again */
    if (h->type == PS__MSG_TYPE__MSG_ERROR) {
        atomic_fetch_add(&c->errors, 1);
        ps_client_set_error(c, "server %d: %s (%s, partition %d): %s", s,
                            ps_errname(h->error_code), r ? ps_wire_type_name(r->type) : "request",
                            h->has_partition ? (int)h->partition : -1,
                            h->error_text ? h->error_text : "");
        if (!r) {
            ps_warn("%s", c->last_error);
            return;
        }
    }
    if (!r) {
        /* Duplicate reply, reply to a retried request already answered,
         * or a heartbeat ACK. */
        ps_debug("server %d: unmatched %s reply (request_id %llx) dropped", s,
                 ps_wire_type_name(h->type), (unsigned long long)h->request_id);
        return;
    }

    if (repull_exact(c, s, r, h)) return; /* still in flight, as a PULL */
    int result = 0;
    if (h->type == PS__MSG_TYPE__MSG_ERROR) {
        result = h->has_error_code && h->error_code < 0 ? h->error_code : PS_EPROTO;
        /* counted before the completion wakes the waiters (ps_client_wait_unless) */
        if (h->has_flags && (h->flags & PS_FLAG_REBUILD)) atomic_fetch_add(&c->rebuilds, 1);
        /* PS_FLAG_ROLLBACK: `iteration` is the version to roll back to. */
        r->reply_flags = h->has_flags ? h->flags : 0;
        if (h->has_iteration) r->version = h->iteration;
    } else if (!expected_reply(r->type, h->type)) {
        ps_client_set_error(c, "server %d: %s reply to a %s request", s,
                            ps_wire_type_name(h->type), ps_wire_type_name(r->type));
        ps_warn("%s", c->last_error);
        result = PS_EPROTO;
    } else if (h->type == PS__MSG_TYPE__MSG_WEIGHTS && h->has_flags &&
               (h->flags & PS_FLAG_STATE)) {
        /* a partition this worker keeps: weights and momentum */
        r->reply_flags = h->flags;
        r->version = h->iteration;
        result = ps_client_keep_reply(c, r, h->iteration,
                                      m->has_payload ? zmq_msg_data(&m->payload) : "",
                                      m->has_payload ? zmq_msg_size(&m->payload) : 0);
    } else if (h->type == PS__MSG_TYPE__MSG_WEIGHTS) {
        r->reply_flags = h->has_flags ? h->flags : 0; /* PS_FLAG_OVERFLOW: step skipped */
        result = decode_weights(c, s, r, m);
    } else {
        r->reply_flags = h->has_flags ? h->flags : 0;
        r->reply_rank = h->has_rank ? h->rank : -1;
        if (h->has_iteration) r->version = h->iteration; /* WELCOME to join, DRAIN: a step */
        r->reply_has_hash = h->has_table_hash;
        r->reply_hash = h->table_hash;
        r->reply_nworkers = h->has_num_workers ? h->num_workers : 0;
        r->reply_nservers = h->has_num_servers ? h->num_servers : 0;
        if (h->has_body && h->body.len) {
            r->reply_body = malloc(h->body.len);
            if (r->reply_body) {
                memcpy(r->reply_body, h->body.data, h->body.len);
                r->reply_body_len = h->body.len;
            } else {
                result = PS_ENOMEM;
            }
        }
    }
    ps_client_io_list_remove(&sv->inflight, r);
    sv->ninflight -= ps_client_io_windowed(r);
    ps_client_io_complete(c, r, result);
}

void ps_client_recv_drain(ps_client_t *c, int s)
{
    char err[256];
    for (;;) {
        ps_wire_msg_t m;
        int rc = ps_wire_recv(c->srv[s].sock, &m, 0, ZMQ_DONTWAIT, err, sizeof err);
        if (rc == PS_EAGAIN) {
            ps_wire_msg_close(&m);
            return;
        }
        if (rc == PS_EZMQ) {
            ps_wire_msg_close(&m);
            return;
        }
        handle_reply(c, s, &m, rc, err);
        ps_wire_msg_close(&m);
    }
}
