/* psd client, I/O thread: owns one DEALER per server, sends queued requests
 * in priority order (flow control: see ps_client.h; never waits for a reply
 * that may depend on another worker before sending the next request),
 * and runs the loop: replies are read and matched in ps_client_recv.c,
 * resends, timeouts, stall warnings and heartbeats are ps_client_timers.c's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ps_client_int.h"
#include "ps_error.h"
#include "ps_log.h"

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
        if (c->o.hello_endpoint && *c->o.hello_endpoint) h->endpoint = (char *)c->o.hello_endpoint;
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
int ps_client_io_send(ps_client_t *c, int s, ps_req_t *r)
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

void ps_client_io_complete(ps_client_t *c, ps_req_t *r, int result)
{
    pthread_mutex_lock(&c->mu);
    ps_client_complete_locked(c, r, result);
    pthread_mutex_unlock(&c->mu);
}

void ps_client_io_list_remove(ps_req_t **head, ps_req_t *r)
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
int ps_client_io_windowed(const ps_req_t *r)
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
        int win = ps_client_io_windowed(r);
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
        int rc = ps_client_io_send(c, s, r);
        if (rc == PS_EAGAIN) {
            sv->blocked = 1;
            break;
        }
        *pp = r->next;
        r->next = NULL;
        if (rc < 0) {
            ps_client_set_error(c, "server %d: sending %s failed: %s", s,
                                ps_wire_type_name(r->type), ps_strerror(rc));
            ps_client_io_complete(c, r, rc);
            continue;
        }
        if (r->no_reply) {
            ps_client_io_complete(c, r, 0);
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
        if (c->srv[r->server].shut) ps_client_io_complete(c, r, PS_ESHUTDOWN);
        else pending_insert(&c->srv[r->server], r);
        r = next;
    }
}

void ps_client_io_fail_all(ps_client_t *c, ps_req_t *r, int result)
{
    while (r) {
        ps_req_t *next = r->next;
        r->next = NULL;
        ps_client_io_complete(c, r, result);
        r = next;
    }
}

static void drop_marked(ps_client_t *c, ps_req_t **head, int *ninflight)
{
    for (ps_req_t **pp = head; *pp;) {
        ps_req_t *r = *pp;
        pthread_mutex_lock(&c->mu);
        int drop = r->cancel;
        pthread_mutex_unlock(&c->mu);
        if (!drop) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        r->next = NULL;
        if (ninflight) *ninflight -= ps_client_io_windowed(r);
        ps_client_io_complete(c, r, PS_ECANCELED);
    }
}

void ps_client_io_drop_cancelled(ps_client_t *c)
{
    if (!atomic_exchange(&c->cancel_pending, 0)) return;
    for (int s = 0; s < c->o.nservers; s++) {
        drop_marked(c, &c->srv[s].pending, NULL);
        drop_marked(c, &c->srv[s].inflight, &c->srv[s].ninflight);
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
        int rc = zmq_poll(items, S + 1, ps_client_timers_next(c, now));
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
        ps_client_io_drop_cancelled(c);
        for (int s = 0; s < S; s++) {
            if (items[s + 1].revents & ZMQ_POLLIN) ps_client_recv_drain(c, s);
            c->srv[s].blocked = 0; /* POLLOUT, or the periodic re-try */
        }
        ps_client_timers_run(c, now);
        for (int s = 0; s < S; s++) {
            if (c->srv[s].reset) reset_server(c, s, now);
            dispatch(c, s, now);
        }
    }

    take_submitted(c, now);
    for (int s = 0; s < S; s++) {
        ps_client_io_fail_all(c, c->srv[s].pending, PS_ESHUTDOWN);
        ps_client_io_fail_all(c, c->srv[s].inflight, PS_ESHUTDOWN);
        c->srv[s].pending = c->srv[s].inflight = NULL;
        c->srv[s].ninflight = 0;
    }
    ps_client_io_close_all(c, 1);
    free(items);
    return NULL;
}
