/* The event loop: one ZMQ ROUTER socket under libuv, plus timers and
 * signals.  ZMQ_FD only signals *edges* ("something changed"), so after it
 * fires, and after every send we make from a timer, ZMQ_EVENTS is re-read
 * and the socket drained until it reports no more input. */
#include "psd.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"

static int set_int(void *sock, int opt, int v, const char *name)
{
    if (zmq_setsockopt(sock, opt, &v, sizeof v) < 0) {
        ps_error("zmq_setsockopt(%s=%d): %s", name, v, zmq_strerror(errno));
        return PS_EZMQ;
    }
    return 0;
}

/* ---- connection log (zmq_socket_monitor) ----
 * ZeroMQ closes a connection by itself when a frame is over ZMQ_MAXMSGSIZE
 * (or the peer breaks the protocol); the monitor is the only place psd
 * hears of it.  Events name the connection by its fd, and the peer address
 * is read with getpeername when psd handles the ACCEPTED event, which can be
 * after ZeroMQ's I/O thread has closed the fd (a peer that sends one bad
 * frame at once) and even after the fd number was reused for a newer
 * connection.  ZeroMQ queues DISCONNECTED before it closes the fd, so an
 * address is trusted only when no DISCONNECTED for that fd is queued after
 * the ACCEPTED, checked once more after getpeername; otherwise the line says
 * the address was not known, rather than name another peer. */
struct psd_conn {
    int fd;
    char addr[64];
};

typedef struct {
    uint16_t event;
    uint32_t value;
    char where[128];
} mon_event_t;

typedef struct {
    mon_event_t *ev;
    size_t n, cap;
} mon_batch_t;

/* Reads one event; 1 if one was read, 0 if none is waiting. */
static int monitor_read(psd_t *s, mon_event_t *e)
{
    int ev = 0;
    size_t sz = sizeof ev;
    if (!s->monitor || zmq_getsockopt(s->monitor, ZMQ_EVENTS, &ev, &sz) < 0 || !(ev & ZMQ_POLLIN))
        return 0;
    zmq_msg_t f;
    uint8_t head[6] = {0};
    size_t hl = 0;
    e->where[0] = 0;
    /* Frames: u16 event + u32 value (host order), then the endpoint. */
    for (int k = 0;; k++) {
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, s->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            break;
        }
        size_t n = zmq_msg_size(&f);
        if (k == 0) memcpy(head, zmq_msg_data(&f), hl = n < 6 ? n : 6);
        else if (k == 1)
            snprintf(e->where, sizeof e->where, "%.*s", (int)(n < 127 ? n : 127), (char *)zmq_msg_data(&f));
        int more = zmq_msg_more(&f);
        zmq_msg_close(&f);
        if (!more) break;
    }
    if (hl < 6) {
        e->event = 0; /* a short frame: read, but no event to act on */
        return 1;
    }
    memcpy(&e->event, head, 2);
    memcpy(&e->value, head + 2, 4);
    return 1;
}

/* Appends every event waiting on the monitor to b; -1 if memory ran out
 * (the events already read are kept). */
static int monitor_fill(psd_t *s, mon_batch_t *b)
{
    for (;;) {
        if (b->n == b->cap) {
            size_t cap = b->cap ? 2 * b->cap : 32;
            mon_event_t *e = realloc(b->ev, cap * sizeof *e);
            if (!e) return -1;
            b->ev = e, b->cap = cap;
        }
        if (!monitor_read(s, &b->ev[b->n])) return 0;
        b->n++;
    }
}

/* Whether a DISCONNECTED for fd is queued after position i. */
static int closed_later(const mon_batch_t *b, size_t i, int fd)
{
    for (size_t j = i + 1; j < b->n; j++)
        if (b->ev[j].event == ZMQ_EVENT_DISCONNECTED && (int)b->ev[j].value == fd) return 1;
    return 0;
}

static void conn_accepted(psd_t *s, mon_batch_t *b, size_t i)
{
    int fd = (int)b->ev[i].value;
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    char host[48], port[8], addr[64];
    int known = !closed_later(b, i, fd) &&
                getpeername(fd, (struct sockaddr *)&a, &al) == 0 &&
                getnameinfo((struct sockaddr *)&a, al, host, sizeof host, port, sizeof port,
                            NI_NUMERICHOST | NI_NUMERICSERV) == 0;
    if (known) { /* the fd may have closed while getpeername ran: look again */
        monitor_fill(s, b);
        known = !closed_later(b, i, fd);
    }
    if (known) snprintf(addr, sizeof addr, "%s:%s", host, port);
    else snprintf(addr, sizeof addr, "fd %d (closed before psd read its address)", fd);
    size_t k = 0;
    while (k < s->nconns && s->conns[k].fd != fd) k++;
    if (k == s->nconns) {
        if (s->nconns == s->conns_cap) {
            size_t cap = s->conns_cap ? 2 * s->conns_cap : 64;
            struct psd_conn *c = realloc(s->conns, cap * sizeof *c);
            if (!c) return; /* only the log line loses the address */
            s->conns = c, s->conns_cap = cap;
        }
        s->nconns++;
    }
    s->conns[k].fd = fd;
    snprintf(s->conns[k].addr, sizeof s->conns[k].addr, "%s", addr);
}

/* Close lines are rate-limited so that a flood of connections cannot fill
 * the disk: the first CONNLOG_BURST of an interval of CONNLOG_INTERVAL_MS
 * are logged one by one, the rest summed up in one line when the interval
 * ends (or psd stops).  peer_disconnects counts every close regardless. */
#define CONNLOG_BURST 5
#define CONNLOG_INTERVAL_MS 10000

/* Ends the interval when it is over (or at once with force): the summary
 * line of the closes not logged, if any; the next close opens a new one. */
static void conn_log_flush(psd_t *s, int force)
{
    uint64_t now = s->loop ? uv_now(s->loop) : 0;
    if (!s->connlog_lines && !s->connlog_more) return; /* no interval open */
    uint64_t ms = now > s->connlog_since ? now - s->connlog_since : 0;
    if (!force && ms < CONNLOG_INTERVAL_MS) return;
    if (s->connlog_more)
        ps_info("... and %llu more connections closed in the last %llu s (logged one by one: the "
                "first %d per %d s; peer_disconnects counts all)",
                (unsigned long long)s->connlog_more,
                (unsigned long long)(ms < 1000 ? 1 : (ms + 500) / 1000), CONNLOG_BURST,
                CONNLOG_INTERVAL_MS / 1000);
    s->connlog_lines = 0;
    s->connlog_more = 0;
}

/* Whether this close gets its own line (else it is counted for the summary). */
static int conn_log_admit(psd_t *s)
{
    conn_log_flush(s, 0);
    if (!s->connlog_lines && !s->connlog_more) s->connlog_since = s->loop ? uv_now(s->loop) : 0;
    if (s->connlog_lines < CONNLOG_BURST) {
        s->connlog_lines++;
        return 1;
    }
    s->connlog_more++;
    return 0;
}

static void conn_closed(psd_t *s, int fd)
{
    char addr[64] = "an unknown peer";
    for (size_t i = 0; i < s->nconns; i++)
        if (s->conns[i].fd == fd) {
            snprintf(addr, sizeof addr, "%s", s->conns[i].addr);
            s->conns[i] = s->conns[--s->nconns];
            break;
        }
    s->mx.disconnects++;
    if (!conn_log_admit(s)) return;
    ps_info("connection from %s closed (the peer went away, or ZeroMQ dropped it for a protocol "
            "error such as a frame over ZMQ_MAXMSGSIZE %lld bytes)",
            addr, (long long)s->maxmsg);
}

static void monitor_drain(psd_t *s)
{
    mon_batch_t b = {0};
    /* Until the monitor is empty: the ZMQ_FD poll fires on edges only. */
    while (monitor_fill(s, &b), b.n > 0) {
        for (size_t i = 0; i < b.n; i++) {
            const mon_event_t *e = &b.ev[i];
            if (e->event == ZMQ_EVENT_ACCEPTED) conn_accepted(s, &b, i);
            else if (e->event == ZMQ_EVENT_DISCONNECTED) conn_closed(s, (int)e->value);
            else if (e->event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
                ps_warn("ZMTP handshake on %s failed: protocol error 0x%x (not a ZeroMQ peer, or "
                        "an incompatible one)", e->where, e->value);
        }
        b.n = 0;
    }
    free(b.ev);
    conn_log_flush(s, 0); /* the drain timer calls here: summaries come on time */
}

static void on_monitor(uv_poll_t *h, int status, int events)
{
    monitor_drain(h->data);
}

/* Before the bind, so that no accepted connection goes unseen.  Failure
 * only costs the log lines: psd serves without them. */
static void monitor_open(psd_t *s)
{
    char ep[64];
    int fd, zero = 0;
    size_t fsz = sizeof fd;
    snprintf(ep, sizeof ep, "inproc://psd-monitor-%p", (void *)s);
    if (zmq_socket_monitor(s->sock, ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                                            ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) < 0 ||
        !(s->monitor = zmq_socket(s->zctx, ZMQ_PAIR)) ||
        zmq_setsockopt(s->monitor, ZMQ_LINGER, &zero, sizeof zero) < 0 ||
        zmq_connect(s->monitor, ep) < 0 || zmq_getsockopt(s->monitor, ZMQ_FD, &fd, &fsz) < 0 ||
        uv_poll_init(s->loop, &s->monpoll, fd) < 0) {
        ps_warn("zmq_socket_monitor: %s: disconnects will not be logged", zmq_strerror(errno));
        if (s->monitor) zmq_close(s->monitor);
        s->monitor = NULL;
        return;
    }
    s->monpoll.data = s;
    uv_poll_start(&s->monpoll, UV_READABLE, on_monitor);
}

static void handle_bad(psd_t *s, ps_wire_msg_t *m, int rc, const char *err)
{
    if (!m->has_identity) return;
    psd_send_error(s, PSD_ID_OF(m), m->hdr, rc, "%s", err);
}

/* Re-read ZMQ_EVENTS and handle everything queued: after the poll fires,
 * and after sends made outside it (ZMQ_FD is edge-triggered). */
static void drain(psd_t *s)
{
    static int draining;
    if (draining) return; /* a handler's send must not recurse into here */
    draining = 1;
    while (!s->stopping) {
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(s->sock, ZMQ_EVENTS, &ev, &sz) < 0) {
            ps_error("zmq_getsockopt(ZMQ_EVENTS): %s", zmq_strerror(errno));
            break;
        }
        if (!(ev & ZMQ_POLLIN)) break;
        ps_wire_msg_t m;
        char err[512];
        int rc = ps_wire_recv(s->sock, &m, 1, ZMQ_DONTWAIT, err, sizeof err);
        if (rc == PS_EAGAIN) break;
        s->mx.bytes_in += m.wire_bytes;
        if (rc == 0) psd_handle(s, &m);
        else if (rc != PS_EZMQ) handle_bad(s, &m, rc, err);
        ps_wire_msg_close(&m);
        if (rc == PS_EZMQ) break;
    }
    draining = 0;
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    psd_t *s = h->data;
    if (status < 0) ps_warn("uv_poll on the ZMQ fd: %s", uv_strerror(status));
    drain(s);
}

static void on_hb(uv_timer_t *t)
{
    psd_t *s = t->data;
    /* Read what is queued first: after a stall of psd itself (a loaded
     * machine), the workers' heartbeats are waiting in the socket, and
     * checking before reading them declared every worker lost at once. */
    drain(s);
    if (psd_members_check(s)) psd_recheck_pending(s);
    psd_late_check(s);
    psd_errors_log_flush(s);
    drain(s);
}

static void on_drain_timer(uv_timer_t *t)
{
    /* Safety net for a missed edge; costs one getsockopt every 100 ms. */
    drain(t->data);
    monitor_drain(t->data);
}

static void on_stats(uv_timer_t *t)
{
    psd_stats_log(t->data);
}

static void on_signal(uv_signal_t *h, int signum)
{
    psd_t *s = h->data;
    /* Checkpoint first (the write in flight, if any, is waited for). */
    psd_shutdown_begin(s, signum == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
}

static int write_port_file(const char *path, int port)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        ps_error("cannot write port file %s: %s", tmp, strerror(errno));
        return PS_EIO;
    }
    fprintf(f, "%d\n", port);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        ps_error("cannot write port file %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    return 0;
}

static int bind_socket(psd_t *s)
{
    char ep[512], last[512];
    const char *b = s->o.bind && s->o.bind[0] ? s->o.bind : "tcp://*";
    int tcp = !strncmp(b, "tcp://", 6);
    if (tcp && s->o.port > 0) snprintf(ep, sizeof ep, "%s:%d", b, s->o.port);
    else if (tcp) snprintf(ep, sizeof ep, "%s:*", b);
    else snprintf(ep, sizeof ep, "%s", b);
    if (zmq_bind(s->sock, ep) < 0) {
        ps_error("cannot bind %s: %s", ep, zmq_strerror(errno));
        return PS_EZMQ;
    }
    size_t n = sizeof last;
    if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, last, &n) < 0) snprintf(last, sizeof last, "%s", ep);
    snprintf(s->endpoint, sizeof s->endpoint, "%s", last);
    const char *colon = strrchr(last, ':');
    s->port = tcp && colon ? atoi(colon + 1) : 0;
    if (tcp) ps_info("listening on %s:%d (server %d)", b, s->port, s->o.server_id);
    else ps_info("listening on %s (server %d)", last, s->o.server_id);
    if (s->o.port_file && s->o.port_file[0]) return write_port_file(s->o.port_file, s->port);
    return 0;
}

int psd_loop_open(psd_t *s)
{
    int rc;
    s->loop = uv_default_loop();
    s->drain = drain;
    signal(SIGPIPE, SIG_IGN);
    s->zctx = zmq_ctx_new();
    if (!s->zctx) {
        ps_error("zmq_ctx_new: %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    /* A connection is served by one I/O thread; with several workers more
     * than one lets their receives run in parallel (--io-threads). */
    zmq_ctx_set(s->zctx, ZMQ_IO_THREADS, s->o.io_threads > 0 ? s->o.io_threads : 2);
    s->sock = zmq_socket(s->zctx, ZMQ_ROUTER);
    if (!s->sock) {
        ps_error("zmq_socket(ROUTER): %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    /* ZMQ_MAXMSGSIZE is fixed here, for the life of the listener
     * (psd_maxmsg.c). */
    if ((rc = psd_maxmsg_at_bind(s))) return rc;
    int hb = s->o.heartbeat_ms > 0 ? s->o.heartbeat_ms : 0;
    int hb_tmo = hb ? (s->o.worker_timeout_ms > 3 * hb ? s->o.worker_timeout_ms : 3 * hb) : 0;
    if ((rc = set_int(s->sock, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY")) ||
        /* In-flight requests are bounded by the clients' max_inflight; the
         * HWM only has to stay clear of that for every worker. */
        (rc = set_int(s->sock, ZMQ_SNDHWM, 10000, "ZMQ_SNDHWM")) ||
        (rc = set_int(s->sock, ZMQ_RCVHWM, 10000, "ZMQ_RCVHWM")) ||
        (s->o.sock_buf_kb > 0 &&
         ((rc = set_int(s->sock, ZMQ_SNDBUF, s->o.sock_buf_kb << 10, "ZMQ_SNDBUF")) ||
          (rc = set_int(s->sock, ZMQ_RCVBUF, s->o.sock_buf_kb << 10, "ZMQ_RCVBUF")))) ||
        /* Replies queued at SHUTDOWN still get out before the process ends. */
        (rc = set_int(s->sock, ZMQ_LINGER, 2000, "ZMQ_LINGER")) ||
        (hb && (rc = set_int(s->sock, ZMQ_HEARTBEAT_IVL, hb, "ZMQ_HEARTBEAT_IVL"))) ||
        (hb && (rc = set_int(s->sock, ZMQ_HEARTBEAT_TIMEOUT, hb_tmo, "ZMQ_HEARTBEAT_TIMEOUT"))))
        return rc;
    if (zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &s->maxmsg, sizeof s->maxmsg) < 0) {
        ps_error("zmq_setsockopt(ZMQ_MAXMSGSIZE): %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    monitor_open(s);
    if ((rc = psd_curve_setup(s, s->sock)) || (rc = bind_socket(s))) return rc;
    ps_info("max message size %lld bytes (%.2f MiB, set by %s)", (long long)s->maxmsg,
            s->maxmsg / 1048576.0, s->maxmsg_from);

    int fd;
    size_t fsz = sizeof fd;
    if (zmq_getsockopt(s->sock, ZMQ_FD, &fd, &fsz) < 0) {
        ps_error("zmq_getsockopt(ZMQ_FD): %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    if ((rc = uv_poll_init(s->loop, &s->zpoll, fd)) < 0) {
        ps_error("uv_poll_init: %s", uv_strerror(rc));
        return PS_EIO;
    }
    s->zpoll.data = s;
    uv_poll_start(&s->zpoll, UV_READABLE, on_poll);

    uv_timer_init(s->loop, &s->hb_timer);
    s->hb_timer.data = s;
    int hb_every = hb > 0 ? hb : 1000;
    uv_timer_start(&s->hb_timer, on_hb, hb_every, hb_every);
    uv_timer_init(s->loop, &s->drain_timer);
    s->drain_timer.data = s;
    uv_timer_start(&s->drain_timer, on_drain_timer, 100, 100);
    uv_timer_init(s->loop, &s->stats_timer);
    s->stats_timer.data = s;
    if (s->o.stats_every_s > 0)
        uv_timer_start(&s->stats_timer, on_stats, s->o.stats_every_s * 1000ull,
                       s->o.stats_every_s * 1000ull);
    uv_timer_init(s->loop, &s->linger_timer);
    s->linger_timer.data = s;
    uv_signal_init(s->loop, &s->sigterm);
    uv_signal_init(s->loop, &s->sigint);
    s->sigterm.data = s->sigint.data = s;
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    return 0;
}

int psd_loop_run(psd_t *s)
{
    /* Messages that arrived before the poll was armed produce no new edge. */
    drain(s);
    uv_run(s->loop, UV_RUN_DEFAULT);
    return 0;
}

static void close_walk(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

void psd_loop_close(psd_t *s)
{
    conn_log_flush(s, 1); /* closes not yet summed up */
    if (s->loop) {
        psd_metrics_stop(s);
        uv_walk(s->loop, close_walk, NULL);
        uv_run(s->loop, UV_RUN_DEFAULT);
        uv_loop_close(s->loop);
        s->loop = NULL;
    }
    if (s->monitor) {
        zmq_socket_monitor(s->sock, NULL, 0);
        zmq_close(s->monitor);
        s->monitor = NULL;
    }
    free(s->conns);
    s->conns = NULL;
    s->nconns = s->conns_cap = 0;
    if (s->sock) zmq_close(s->sock);
    s->sock = NULL;
    psd_curve_stop(s);
    if (s->zctx) zmq_ctx_term(s->zctx);
    s->zctx = NULL;
}
