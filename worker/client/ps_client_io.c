/* psd client, I/O thread: owns one DEALER per server, sends queued requests
 * in priority order (flow control: see ps_client.h; never waits for a reply
 * that may depend on another worker before sending the next request),
 * matches replies by request_id, decodes weights into the caller's buffer,
 * resends unanswered requests with exponential backoff, fails them after
 * timeout_ms, and sends heartbeats. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ps_client_int.h"
#include "ps_error.h"
#include "ps_log.h"

#define RETRY_CAP_MS 60000  /* backoff ceiling */
#define BLOCKED_POLL_MS 20  /* re-try sends this often while a server is unreachable */

int64_t ps_client_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ps_client_io_wake(ps_client_t *c)
{
    uint64_t one = 1;
    if (atomic_exchange(&c->wake_pending, 1)) return; /* a wake-up is on its way */
    if (write(c->efd, &one, sizeof one) < 0 && errno != EAGAIN)
        ps_error("eventfd write: %s", strerror(errno));
}

static int setopt_int(void *sock, int opt, int v, const char *name)
{
    if (zmq_setsockopt(sock, opt, &v, sizeof v) < 0) {
        ps_error("zmq_setsockopt(%s=%d): %s", name, v, zmq_strerror(errno));
        return PS_EZMQ;
    }
    return 0;
}

int ps_client_io_open(ps_client_t *c, int s)
{
    ps_client_server_t *sv = &c->srv[s];
    void *sock = zmq_socket(c->zctx, ZMQ_DEALER);
    if (!sock) {
        ps_error("zmq_socket(DEALER): %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    int64_t maxmsg = (int64_t)c->maxmsg;
    int hwm = 4 * c->o.max_inflight + 64;
    int rc = 0;
    /* LINGER 0: nothing may outlive close (frames point at our buffers).
     * IMMEDIATE: queue only to a live connection, so frames sent while a
     * server is down are not parked in a pipe holding our buffers; the
     * request waits in our own queue (and is retried) instead.  The DEALER
     * reconnects on its own to a restarted server. */
    rc |= setopt_int(sock, ZMQ_LINGER, 0, "LINGER");
    rc |= setopt_int(sock, ZMQ_IMMEDIATE, 1, "IMMEDIATE");
    rc |= setopt_int(sock, ZMQ_SNDHWM, hwm, "SNDHWM");
    rc |= setopt_int(sock, ZMQ_RCVHWM, hwm, "RCVHWM");
    rc |= setopt_int(sock, ZMQ_RECONNECT_IVL, 100, "RECONNECT_IVL");
    rc |= setopt_int(sock, ZMQ_RECONNECT_IVL_MAX, 2000, "RECONNECT_IVL_MAX");
    /* Dead peers (no FIN/RST: power loss, cable) are noticed by ZMTP pings. */
    rc |= setopt_int(sock, ZMQ_HEARTBEAT_IVL, 2000, "HEARTBEAT_IVL");
    rc |= setopt_int(sock, ZMQ_HEARTBEAT_TIMEOUT, 20000, "HEARTBEAT_TIMEOUT");
    /* TCP buffers stay under kernel autotuning (setting SO_SNDBUF turns it
     * off and caps the window at wmem_max); PS_TCP_BUF overrides. */
    const char *tb = getenv("PS_TCP_BUF");
    if (tb && atoi(tb) > 0) {
        rc |= setopt_int(sock, ZMQ_SNDBUF, atoi(tb), "SNDBUF");
        rc |= setopt_int(sock, ZMQ_RCVBUF, atoi(tb), "RCVBUF");
    }
    if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) < 0) {
        ps_error("zmq_setsockopt(MAXMSGSIZE): %s", zmq_strerror(errno));
        rc = PS_EZMQ;
    }
    /* CURVE keys must be in place before connect starts the handshake. */
    if (rc == 0) rc = ps_client_curve_apply(c, s, sock);
    if (rc == 0 && zmq_connect(sock, sv->endpoint) < 0) {
        ps_error("server %d: zmq_connect(%s): %s", s, sv->endpoint, zmq_strerror(errno));
        rc = PS_EZMQ;
    }
    if (rc) {
        zmq_close(sock);
        return rc < 0 ? rc : PS_EZMQ;
    }
    sv->sock = sock;
    sv->blocked = 0;
    return 0;
}

/* ---- sending ------------------------------------------------------------ */

static void fill_header(ps_client_t *c, ps_req_t *r, Ps__Header *h)
{
    ps_wire_header_init(h, (Ps__MsgType)r->type);
    h->has_rank = 1;
    h->rank = r->type == PS__MSG_TYPE__MSG_DRAIN ? r->rank_arg : c->rank;
    h->has_request_id = 1;
    h->request_id = ((uint64_t)r->gen << 32) | r->slot;
    if (r->part != PS_PART_NONE) {
        h->has_partition = 1;
        h->partition = r->part;
        h->has_numel = 1;
        h->numel = r->numel;
        h->has_dtype = 1;
        h->dtype = (Ps__DType)r->dtype;
        h->has_codec = 1;
        h->codec = (Ps__Codec)r->codec;
    } else if (r->type == PS__MSG_TYPE__MSG_INIT) {
        h->has_partition = 1;
        h->partition = PS_PART_NONE;
    }
    if (r->type == PS__MSG_TYPE__MSG_PUSH || r->type == PS__MSG_TYPE__MSG_PUSHPULL ||
        r->type == PS__MSG_TYPE__MSG_ROLLBACK ||
        (r->type == PS__MSG_TYPE__MSG_INIT && (r->flags & PS_FLAG_STATE))) {
        h->has_iteration = 1;
        h->iteration = r->iteration;
    }
    if (r->type == PS__MSG_TYPE__MSG_PULL) {
        h->has_min_version = 1;
        h->min_version = r->min_version;
    }
    if (r->type == PS__MSG_TYPE__MSG_PULL || r->type == PS__MSG_TYPE__MSG_PUSHPULL) {
        h->has_reply_codec = 1;
        h->reply_codec = (Ps__Codec)r->reply_codec;
    }
    if (r->flags) {
        h->has_flags = 1;
        h->flags = r->flags;
    }
    h->has_table_hash = 1;
    h->table_hash = c->t->hash;
    h->has_num_workers = 1;
    h->num_workers = (uint32_t)c->o.num_workers;
    if (r->type == PS__MSG_TYPE__MSG_HELLO) {
        h->has_num_servers = 1;
        h->num_servers = (uint32_t)c->o.nservers;
    }
    h->has_session = 1;
    h->session = c->session;
    h->has_num_servers = 1;
    h->num_servers = c->t->nservers;
    if (r->body) {
        h->has_body = 1;
        h->body.data = (uint8_t *)r->body;
        h->body.len = r->body_len;
    }
}

/* One (re)send of r.  Returns 0, PS_EAGAIN (no live connection / HWM), or
 * another PS_E* (the request fails). */
static int send_req(ps_client_t *c, int s, ps_req_t *r)
{
    Ps__Header h;
    fill_header(c, r, &h);
    int rc;
    if (r->payload) {
        /* Zero-copy: ZeroMQ reads the payload straight from our (or the
         * caller's) buffer; zrefs keeps the handle alive until it is done. */
        atomic_fetch_add(&r->zrefs, 1);
        /* counted before the send: ZeroMQ may write and release the frame
         * (ps_client_zc_free) before zmq_msg_send returns */
        atomic_fetch_add(&c->srv[s].unsent, (long long)r->payload_len);
        rc = ps_wire_send_crc(c->srv[s].sock, NULL, 0, &h, r->payload, r->payload_len, r->crc,
                              ps_client_zc_free, r, ZMQ_DONTWAIT);
        if (rc < 0) { /* ownership did not pass */
            atomic_fetch_sub(&c->srv[s].unsent, (long long)r->payload_len);
            atomic_fetch_sub(&r->zrefs, 1);
        }
    } else {
        rc = ps_wire_send(c->srv[s].sock, NULL, 0, &h, NULL, 0, NULL, NULL, ZMQ_DONTWAIT);
    }
    if (rc == 0) {
        atomic_fetch_add(&c->bytes_out, ps__header__get_packed_size(&h) + r->payload_len);
        r->nsent++;
    }
    return rc;
}

static void complete(ps_client_t *c, ps_req_t *r, int result)
{
    pthread_mutex_lock(&c->mu);
    ps_client_complete_locked(c, r, result);
    pthread_mutex_unlock(&c->mu);
}

static void list_remove(ps_req_t **head, ps_req_t *r)
{
    for (ps_req_t **pp = head; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            r->next = NULL;
            return;
        }
}

/* Front of the model first: control messages, then partitions in id order;
 * equal keys keep submission order. */
static uint64_t prio(const ps_req_t *r)
{
    return r->part == PS_PART_NONE ? 0 : (uint64_t)r->part + 1;
}

static void pending_insert(ps_client_server_t *sv, ps_req_t *r)
{
    ps_req_t **pp = &sv->pending;
    uint64_t k = prio(r);
    while (*pp && (prio(*pp) < k || (prio(*pp) == k && (*pp)->seq < r->seq))) pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
}

/* Whether max_inflight bounds r: only requests the server answers on its
 * own (INIT weights, a PULL of whatever version it holds).  Anything whose
 * reply may wait on another worker (PUSH / PUSHPULL in sync mode, a PULL of
 * a future version, BARRIER, HELLO's rendezvous) must never hold back the
 * requests queued behind it: that is the cross-worker deadlock described in
 * ps_client.h. */
static int windowed(const ps_req_t *r)
{
    if (r->type == PS__MSG_TYPE__MSG_PULL) return r->min_version == 0;
    return r->type == PS__MSG_TYPE__MSG_INIT && r->payload != NULL;
}

static void dispatch(ps_client_t *c, int s, int64_t now)
{
    ps_client_server_t *sv = &c->srv[s];
    long long qmax = (long long)c->o.send_queue_bytes;
    int bytes_full = 0; /* a push waits for ZeroMQ to write: so do lower-priority ones */
    ps_req_t **pp = &sv->pending;
    while (*pp && !sv->blocked) {
        ps_req_t *r = *pp;
        int win = windowed(r);
        if (win && sv->ninflight >= c->o.max_inflight) {
            pp = &r->next; /* a reply will free the window; others may go */
            continue;
        }
        if (!win && r->payload_len > 0) {
            long long q = atomic_load(&sv->unsent);
            if (bytes_full || (q > 0 && q + (long long)r->payload_len > qmax)) {
                bytes_full = 1; /* ps_client_zc_free wakes us when bytes leave */
                pp = &r->next;
                continue;
            }
        }
        int rc = send_req(c, s, r);
        if (rc == PS_EAGAIN) {
            sv->blocked = 1;
            break;
        }
        *pp = r->next;
        r->next = NULL;
        if (rc < 0) {
            ps_client_set_error(c, "server %d: sending %s failed: %s", s,
                                ps_wire_type_name(r->type), ps_strerror(rc));
            complete(c, r, rc);
            continue;
        }
        if (r->no_reply) {
            complete(c, r, 0);
            continue;
        }
        pthread_mutex_lock(&c->mu);
        r->state = RQ_SENT;
        pthread_mutex_unlock(&c->mu);
        r->retry_delay = c->o.retry_ms;
        r->t_retry = c->o.retry_ms > 0 ? now + c->o.retry_ms : 0;
        r->next = sv->inflight;
        sv->inflight = r;
        sv->ninflight += win;
    }
}

/* ---- receiving ---------------------------------------------------------- */

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
    if (send_req(c, s, r) == 0) {
        r->retry_delay = c->o.retry_ms;
        r->t_retry = c->o.retry_ms > 0 ? now + c->o.retry_ms : 0;
    } else {
        r->t_retry = now + BLOCKED_POLL_MS;
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

static void fail_all(ps_client_t *c, ps_req_t *r, int result);

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
    fail_all(c, sv->pending, PS_ESHUTDOWN);
    fail_all(c, sv->inflight, PS_ESHUTDOWN);
    sv->pending = sv->inflight = NULL;
    sv->ninflight = 0;
}

/* A stalled request that waits on other workers (a sync push, a barrier):
 * ask the server whom it waits for.  The STATS goes with request_id 0,
 * which no request of the pool ever has (generations start at 1), and its
 * answer is logged by late_reply. */
static void late_probe(ps_client_t *c, int s, const ps_req_t *old)
{
    if (old->type != PS__MSG_TYPE__MSG_PUSH && old->type != PS__MSG_TYPE__MSG_PUSHPULL &&
        old->type != PS__MSG_TYPE__MSG_BARRIER)
        return;
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    h.has_rank = 1, h.rank = c->rank;
    h.has_request_id = 1, h.request_id = 0;
    ps_wire_send(c->srv[s].sock, NULL, 0, &h, NULL, 0, NULL, NULL, ZMQ_DONTWAIT);
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
            list_remove(&sv->inflight, r);
            sv->ninflight -= windowed(r);
            complete(c, r, rc);
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
    list_remove(&sv->inflight, r);
    sv->ninflight -= windowed(r);
    complete(c, r, result);
}

static void drain_socket(ps_client_t *c, int s)
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

/* ---- timers ------------------------------------------------------------- */

static void fail_timeout(ps_client_t *c, int s, ps_req_t *r)
{
    ps_client_set_error(c, "server %d: %s (partition %d) got no reply within %d ms (%d sends)", s,
                        ps_wire_type_name(r->type), r->part == PS_PART_NONE ? -1 : (int)r->part,
                        c->o.timeout_ms, r->nsent);
    ps_warn("%s", c->last_error);
    /* ZeroMQ may still hold a frame of it (a peer that accepts the
     * connection but stopped reading); reopening the socket makes it let go,
     * so the waiter can get its buffer back. */
    if (atomic_load(&r->zrefs) > 0) c->srv[s].reset = 1;
    complete(c, r, PS_ETIMEOUT);
}

/* What a request that stays unanswered waits for, as the server sees it. */
static const char *stall_hint(int type)
{
    switch (type) {
    case PS__MSG_TYPE__MSG_HELLO: return "is psd running there, and is it this job's server?";
    case PS__MSG_TYPE__MSG_BARRIER:
        return "the server holds the barrier for workers that have not arrived (its log and "
               "`psctl status` name them)";
    case PS__MSG_TYPE__MSG_PUSH:
    case PS__MSG_TYPE__MSG_PUSHPULL:
        return "a sync server answers once every worker pushed this step (its log and `psctl "
               "status` name the late ones), or the server is stalled";
    default: return "the server is busy, stalled or gone";
    }
}

/* A TCP connect to a tcp://HOST:PORT endpoint, to say in a stall warning
 * whether anything listens there.  At most 200 ms; "" for other schemes. */
static void probe_endpoint(const char *ep, char *out, size_t len)
{
    char host[256];
    const char *hp = !strncmp(ep, "tcp://", 6) ? ep + 6 : NULL, *colon;
    out[0] = 0;
    if (!hp || !(colon = strrchr(hp, ':')) || (size_t)(colon - hp) >= sizeof host) return;
    int n = (int)(colon - hp);
    if (n >= 2 && hp[0] == '[' && hp[n - 1] == ']') hp++, n -= 2; /* [::1] */
    memcpy(host, hp, (size_t)n);
    host[n] = 0;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) || !ai) {
        snprintf(out, len, "; %s does not resolve", host);
        return;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0), err = 0;
    socklen_t el = sizeof err;
    if (fd >= 0 && (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS)) {
        struct pollfd pf = {fd, POLLOUT, 0};
        if (poll(&pf, 1, 200) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el))
            snprintf(out, len, err ? "; connecting to it: %s (nothing listens at that port?)"
                                   : "; it accepts TCP connections", strerror(err));
    } else if (fd >= 0) {
        snprintf(out, len, "; connecting to it: %s", strerror(errno));
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
}

/* Requests of server s unanswered for stall_warn_ms: one line naming the
 * server, its endpoint, what waits (message, partitions, step), for how
 * long and why it may, then again at 2x, 4x ... up to every 60 s while
 * anything stays unanswered.  No wait goes on without a word. */
static void stall_check(ps_client_t *c, int s, int64_t now)
{
    ps_client_server_t *sv = &c->srv[s];
    const ps_req_t *old = NULL;
    uint32_t plo = UINT32_MAX, phi = 0;
    int n = 0;
    for (int list = 0; list < 2; list++)
        for (const ps_req_t *r = list ? sv->inflight : sv->pending; r; r = r->next) {
            n++;
            if (!old || r->t_submit < old->t_submit) old = r;
            if (r->part != PS_PART_NONE) {
                plo = r->part < plo ? r->part : plo;
                phi = r->part > phi ? r->part : phi;
            }
        }
    if (!old || c->o.stall_warn_ms <= 0 || now - old->t_submit < c->o.stall_warn_ms) {
        sv->stall_next = 0;
        sv->stall_gap = c->o.stall_warn_ms;
        return;
    }
    if (sv->stall_next && now < sv->stall_next) return;
    char parts[48] = "", step[40] = "", probe[320] = "";
    if (plo != UINT32_MAX)
        snprintf(parts, sizeof parts, plo == phi ? " of partition %u" : " of partitions %u-%u",
                 plo, phi);
    if (old->type == PS__MSG_TYPE__MSG_PUSH || old->type == PS__MSG_TYPE__MSG_PUSHPULL)
        snprintf(step, sizeof step, " at step %llu", (unsigned long long)old->iteration);
    if (old->type == PS__MSG_TYPE__MSG_HELLO || old->nsent == 0)
        probe_endpoint(sv->endpoint, probe, sizeof probe);
    ps_warn("server %d (%s): %d request(s) unanswered for %.1f s, the oldest %s%s%s (sent %d "
            "time(s))%s; %s", s, sv->endpoint, n, (double)(now - old->t_submit) / 1e3,
            ps_wire_type_name(old->type), parts, step, old->nsent, probe, stall_hint(old->type));
    if (old->nsent > 0) late_probe(c, s, old);
    sv->stall_gap = sv->stall_gap * 2 > 60000 ? 60000 : sv->stall_gap * 2;
    sv->stall_next = now + sv->stall_gap;
}

static void run_timers(ps_client_t *c, int64_t now)
{
    for (int s = 0; s < c->o.nservers; s++) {
        ps_client_server_t *sv = &c->srv[s];
        for (ps_req_t **pp = &sv->pending; *pp;) {
            ps_req_t *r = *pp;
            if (r->t_deadline && now >= r->t_deadline) {
                *pp = r->next;
                r->next = NULL;
                fail_timeout(c, s, r);
            } else {
                pp = &r->next;
            }
        }
        for (ps_req_t **pp = &sv->inflight; *pp;) {
            ps_req_t *r = *pp;
            if (r->t_deadline && now >= r->t_deadline) {
                *pp = r->next;
                r->next = NULL;
                sv->ninflight -= windowed(r);
                fail_timeout(c, s, r);
                continue;
            }
            if (r->t_retry && now >= r->t_retry) {
                int rc = send_req(c, s, r);
                if (rc == 0) {
                    atomic_fetch_add(&c->retries, 1);
                    ps_debug("server %d: resent %s partition %d (send %d)", s,
                             ps_wire_type_name(r->type), (int)r->part, r->nsent);
                    r->retry_delay = r->retry_delay * 2 > RETRY_CAP_MS ? RETRY_CAP_MS
                                                                      : r->retry_delay * 2;
                    /* retries off: this was the one resend after a reconnect */
                    r->t_retry = c->o.retry_ms > 0 ? now + r->retry_delay : 0;
                } else {
                    r->t_retry = now + BLOCKED_POLL_MS;
                }
            }
            pp = &r->next;
        }
        stall_check(c, s, now);
        if (c->o.heartbeat_ms > 0 && now >= sv->next_heartbeat) {
            Ps__Header h;
            ps_wire_header_init(&h, PS__MSG_TYPE__MSG_HEARTBEAT);
            h.has_rank = 1;
            h.rank = c->rank;
            h.has_flags = 1;
            h.flags = PS_FLAG_NO_REPLY; /* liveness only: an ACK would be noise */
            if (c->rank >= 0) ps_wire_send(sv->sock, NULL, 0, &h, NULL, 0, NULL, NULL, ZMQ_DONTWAIT);
            sv->next_heartbeat = now + c->o.heartbeat_ms;
        }
    }
}

static int next_timeout(ps_client_t *c, int64_t now)
{
    int64_t next = INT64_MAX;
    for (int s = 0; s < c->o.nservers; s++) {
        ps_client_server_t *sv = &c->srv[s];
        if (sv->blocked && sv->pending) next = now + BLOCKED_POLL_MS;
        int64_t stall = c->o.stall_warn_ms > 0 ? c->o.stall_warn_ms : INT64_MAX / 4;
        for (ps_req_t *r = sv->pending; r; r = r->next) {
            if (r->t_deadline && r->t_deadline < next) next = r->t_deadline;
            if (!sv->stall_next && r->t_submit + stall < next) next = r->t_submit + stall;
        }
        for (ps_req_t *r = sv->inflight; r; r = r->next) {
            if (r->t_deadline && r->t_deadline < next) next = r->t_deadline;
            if (r->t_retry && r->t_retry < next) next = r->t_retry;
            if (!sv->stall_next && r->t_submit + stall < next) next = r->t_submit + stall;
        }
        if (sv->stall_next && sv->stall_next < next) next = sv->stall_next;
        if (c->o.heartbeat_ms > 0 && sv->next_heartbeat < next) next = sv->next_heartbeat;
    }
    if (next == INT64_MAX) return -1;
    return next <= now ? 0 : (int)(next - now > 60000 ? 60000 : next - now);
}

static void reset_server(ps_client_t *c, int s, int64_t now)
{
    ps_client_server_t *sv = &c->srv[s];
    ps_warn("server %d: reopening the connection to %s", s, sv->endpoint);
    zmq_close(sv->sock);
    sv->sock = NULL;
    sv->reset = 0;
    if (ps_client_io_open(c, s) < 0) {
        sv->reset = 1; /* try again on the next pass */
        return;
    }
    /* Whatever was in flight on the old socket is lost: resend it now. */
    for (ps_req_t *r = sv->inflight; r; r = r->next) r->t_retry = now;
}

/* ---- main loop ---------------------------------------------------------- */

static void take_submitted(ps_client_t *c, int64_t now)
{
    pthread_mutex_lock(&c->mu);
    ps_req_t *r = c->submitq;
    c->submitq = c->submitq_tail = NULL;
    for (ps_req_t *q = r; q; q = q->next) q->state = RQ_PENDING;
    pthread_mutex_unlock(&c->mu);
    while (r) {
        ps_req_t *next = r->next;
        r->next = NULL;
        r->t_submit = now;
        r->t_deadline = c->o.timeout_ms > 0 ? now + c->o.timeout_ms : 0;
        if (c->srv[r->server].shut) complete(c, r, PS_ESHUTDOWN);
        else pending_insert(&c->srv[r->server], r);
        r = next;
    }
}

static void fail_all(ps_client_t *c, ps_req_t *r, int result)
{
    while (r) {
        ps_req_t *next = r->next;
        r->next = NULL;
        complete(c, r, result);
        r = next;
    }
}

/* request_id of BYE: generation 0 never names a pooled request. */
#define BYE_REQUEST_ID 1u
#define BYE_WAIT_MS 300

/* Say BYE to every server and wait (briefly) for the ACKs, so a server does
 * not answer into a socket that is already gone. */
static void say_bye(ps_client_t *c)
{
    int S = c->o.nservers, waiting = 0;
    int *sent = calloc((size_t)S, sizeof *sent);
    zmq_pollitem_t *items = calloc((size_t)S, sizeof *items);
    if (!sent || !items) goto out;
    for (int s = 0; s < S; s++) {
        Ps__Header h;
        ps_wire_header_init(&h, PS__MSG_TYPE__MSG_BYE);
        h.has_rank = 1;
        h.rank = c->rank;
        h.has_request_id = 1;
        h.request_id = BYE_REQUEST_ID;
        h.has_session = 1;
        h.session = c->session;
        pthread_mutex_lock(&c->mu);
        if (c->outcome == PS_CLIENT_DONE) {
            h.has_flags = 1, h.flags = PS_FLAG_DONE;
        } else if (c->outcome == PS_CLIENT_FAILED) {
            h.has_flags = 1, h.flags = PS_FLAG_FAILED;
            h.has_error_code = 1, h.error_code = c->outcome_code;
            h.error_text = c->outcome_text;
        }
        pthread_mutex_unlock(&c->mu);
        sent[s] = c->srv[s].sock && !c->srv[s].shut &&
                  ps_wire_send(c->srv[s].sock, NULL, 0, &h, NULL, 0, NULL, NULL, ZMQ_DONTWAIT) == 0;
        waiting += sent[s];
    }
    int64_t end = ps_client_now_ms() + BYE_WAIT_MS;
    while (waiting > 0) {
        int64_t left = end - ps_client_now_ms();
        if (left <= 0) break;
        for (int s = 0; s < S; s++) {
            items[s].socket = c->srv[s].sock;
            items[s].events = sent[s] ? ZMQ_POLLIN : 0;
        }
        if (zmq_poll(items, S, (long)left) <= 0) break;
        for (int s = 0; s < S; s++) {
            if (!(items[s].revents & ZMQ_POLLIN)) continue;
            ps_wire_msg_t m;
            char err[64];
            for (;;) {
                int rc = ps_wire_recv(c->srv[s].sock, &m, 0, ZMQ_DONTWAIT, err, sizeof err);
                if (rc == 0 && m.hdr->request_id == BYE_REQUEST_ID && sent[s]) {
                    sent[s] = 0;
                    waiting--;
                }
                ps_wire_msg_close(&m);
                if (rc == PS_EAGAIN || rc == PS_EZMQ) break;
            }
        }
    }
out:
    free(sent);
    free(items);
}

void ps_client_io_close_all(ps_client_t *c, int send_bye)
{
    if (send_bye && c->rank >= 0) say_bye(c);
    for (int s = 0; s < c->o.nservers; s++) {
        ps_client_server_t *sv = &c->srv[s];
        if (!sv->sock) continue;
        zmq_close(sv->sock);
        sv->sock = NULL;
    }
}

void *ps_client_io_main(void *arg)
{
    ps_client_t *c = arg;
    int S = c->o.nservers;
    zmq_pollitem_t *items = calloc((size_t)S + 1, sizeof *items);
    if (!items) {
        ps_error("I/O thread: out of memory");
        return NULL;
    }
    int64_t now = ps_client_now_ms();
    for (int s = 0; s < S; s++) c->srv[s].next_heartbeat = now + c->o.heartbeat_ms;

    while (!atomic_load(&c->stop)) {
        now = ps_client_now_ms();
        items[0].socket = NULL;
        items[0].fd = c->efd;
        items[0].events = ZMQ_POLLIN;
        for (int s = 0; s < S; s++) {
            items[s + 1].socket = c->srv[s].sock;
            items[s + 1].events = ZMQ_POLLIN;
            if (c->srv[s].blocked && c->srv[s].pending) items[s + 1].events |= ZMQ_POLLOUT;
        }
        int rc = zmq_poll(items, S + 1, next_timeout(c, now));
        if (rc < 0) {
            if (errno == EINTR) continue;
            if (errno == ETERM) break;
            ps_error("zmq_poll: %s", zmq_strerror(errno));
            continue;
        }
        now = ps_client_now_ms();
        if (items[0].revents & ZMQ_POLLIN) {
            uint64_t v;
            if (read(c->efd, &v, sizeof v) < 0 && errno != EAGAIN)
                ps_error("eventfd read: %s", strerror(errno));
        }
        atomic_store(&c->wake_pending, 0);
        take_submitted(c, now);
        for (int s = 0; s < S; s++) {
            if (items[s + 1].revents & ZMQ_POLLIN) drain_socket(c, s);
            c->srv[s].blocked = 0; /* POLLOUT, or the periodic re-try */
        }
        run_timers(c, now);
        for (int s = 0; s < S; s++) {
            if (c->srv[s].reset) reset_server(c, s, now);
            dispatch(c, s, now);
        }
    }

    take_submitted(c, now);
    for (int s = 0; s < S; s++) {
        fail_all(c, c->srv[s].pending, PS_ESHUTDOWN);
        fail_all(c, c->srv[s].inflight, PS_ESHUTDOWN);
        c->srv[s].pending = c->srv[s].inflight = NULL;
        c->srv[s].ninflight = 0;
    }
    ps_client_io_close_all(c, 1);
    free(items);
    return NULL;
}
