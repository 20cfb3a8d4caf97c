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

void psd_loop_set_maxmsg(psd_t *s, int64_t bytes)
{
    int64_t cap = (int64_t)s->o.max_msg_mb << 20;
    /* A listener copies the socket options when it is bound, and unbinding
     * it would drop every connected worker, so the limit derived from the
     * table only applies when the table is known before the bind (state
     * loaded from a checkpoint); otherwise --max-msg-mb stays in force. */
    if (s->sock) {
        ps_debug("largest valid message %.2f MiB; ZMQ_MAXMSGSIZE stays %d MiB (already bound)",
                 bytes / 1048576.0, s->o.max_msg_mb);
        return;
    }
    s->maxmsg = bytes < cap ? bytes : cap;
}

static void handle_bad(psd_t *s, ps_wire_msg_t *m, int rc, const char *err)
{
    if (!m->has_identity) return;
    psd_send_error(s, zmq_msg_data(&m->identity), zmq_msg_size(&m->identity), m->hdr, rc, "%s", err);
}

void psd_drain(psd_t *s)
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
    psd_drain(s);
}

static void on_hb(uv_timer_t *t)
{
    psd_t *s = t->data;
    psd_members_check(s);
    psd_errors_log_flush(s);
    psd_drain(s);
}

static void on_drain_timer(uv_timer_t *t)
{
    /* Safety net for a missed edge; costs one getsockopt every 100 ms. */
    psd_drain(t->data);
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

void psd_stop(psd_t *s, const char *why)
{
    if (s->stopping) return;
    s->stopping = 1;
    ps_info("stopping: %s", why);
    uv_stop(s->loop);
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
    int64_t maxmsg = s->maxmsg > 0 ? s->maxmsg : (int64_t)s->o.max_msg_mb << 20;
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
    if (zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) < 0) {
        ps_error("zmq_setsockopt(ZMQ_MAXMSGSIZE): %s", zmq_strerror(errno));
        return PS_EZMQ;
    }
    if ((rc = psd_curve_setup(s, s->sock)) || (rc = bind_socket(s))) return rc;
    ps_info("max message size %.2f MiB%s", maxmsg / 1048576.0,
            s->maxmsg > 0 ? " (largest partition of the checkpointed table)" : " (--max-msg-mb)");

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
    psd_drain(s);
    uv_run(s->loop, UV_RUN_DEFAULT);
    return 0;
}

static void close_walk(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

void psd_loop_close(psd_t *s)
{
    if (s->loop) {
        psd_metrics_stop(s);
        uv_walk(s->loop, close_walk, NULL);
        uv_run(s->loop, UV_RUN_DEFAULT);
        uv_loop_close(s->loop);
        s->loop = NULL;
    }
    if (s->sock) zmq_close(s->sock);
    s->sock = NULL;
    psd_curve_stop(s);
    if (s->zctx) zmq_ctx_term(s->zctx);
    s->zctx = NULL;
}
