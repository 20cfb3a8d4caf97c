/* The shared /metrics listener (ps_http.h).  Each connection has a deadline
 * timer from the accept: the request and the answer's write must be done by
 * then, or the connection is closed.  A connection lives until both its
 * handles (TCP, timer) are closed; the listener's memory lives until the
 * listener and every connection are. */
#include "ps_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

#define RENDER_CAP0 65536

typedef struct conn {
    uv_tcp_t tcp;
    uv_timer_t deadline;
    uv_write_t wr;
    ps_http_t *h;
    struct conn *prev, *next; /* h->conns */
    int open_handles;         /* freed when the last one closes */
    size_t len;
    char req[4096];
    char *resp;
} conn_t;

struct ps_http {
    uv_loop_t *loop;
    uv_tcp_t listener;
    ps_http_render_fn *render;
    void *arg;
    conn_t *conns;
    ps_http_stats_t st;
    int refs;     /* the listener and every conn_t not yet freed */
    int stopping; /* stop asked: no new connection is served */
    /* ps_http_thread_start: the loop and thread of its own; the joiner frees */
    int threaded;
    uv_loop_t own;
    uv_async_t wake;
    uv_thread_t thread;
};

static void unref(ps_http_t *h)
{
    if (--h->refs == 0 && !h->threaded) free(h);
}

static void on_closed(uv_handle_t *hd)
{
    conn_t *c = hd->data;
    if (--c->open_handles > 0) return;
    ps_http_t *h = c->h;
    free(c->resp);
    free(c);
    unref(h);
}

/* Closes both handles (again: a no-op) and drops c from the open list. */
static void conn_close(conn_t *c)
{
    if (uv_is_closing((uv_handle_t *)&c->tcp)) return;
    ps_http_t *h = c->h;
    if (c->prev) c->prev->next = c->next;
    else h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    h->st.connections--;
    uv_close((uv_handle_t *)&c->deadline, on_closed);
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void on_deadline(uv_timer_t *t)
{
    conn_t *c = t->data;
    c->h->st.timeouts++;
    conn_close(c);
}

static void on_written(uv_write_t *w, int status)
{
    (void)status; /* closed either way; a cancelled write means it is closing already */
    conn_close(w->data);
}

/* Takes body (malloc'd or NULL) and frees it. */
static void respond(conn_t *c, int code, const char *ctype, char *body, size_t blen)
{
    const char *reason = code == 200 ? "OK" : code == 404 ? "Not Found" : "Bad Request";
    size_t cap = blen + 256;
    c->resp = malloc(cap);
    if (!c->resp) {
        free(body);
        conn_close(c);
        return;
    }
    int n = snprintf(c->resp, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     code, reason, ctype, blen);
    if (blen) memcpy(c->resp + n, body, blen);
    free(body);
    uv_buf_t b = uv_buf_init(c->resp, (unsigned)(n + blen));
    c->wr.data = c;
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &b, 1, on_written) < 0) conn_close(c);
}

/* A fixed answer (the body is copied: respond frees what it takes). */
static void respond_text(conn_t *c, int code, const char *text)
{
    size_t len = strlen(text);
    char *b = malloc(len + 1);
    if (b) memcpy(b, text, len + 1);
    respond(c, code, "text/plain", b, b ? len : 0);
}

/* The render's text, in a buffer as large as it asks for. */
static char *render_body(ps_http_t *h, size_t *len)
{
    size_t cap = RENDER_CAP0;
    char *body = malloc(cap);
    if (!body) return NULL;
    size_t n = h->render(h->arg, &h->st, body, cap);
    if (n >= cap) {
        char *big = realloc(body, n + 1);
        if (!big) {
            free(body);
            return NULL;
        }
        body = big;
        cap = n + 1;
        n = h->render(h->arg, &h->st, body, cap);
        if (n >= cap) n = cap - 1; /* grew again in between: cut */
    }
    *len = n;
    return body;
}

static void on_alloc(uv_handle_t *hd, size_t want, uv_buf_t *buf)
{
    (void)want;
    conn_t *c = hd->data;
    *buf = uv_buf_init(c->req + c->len, (unsigned)(sizeof c->req - 1 - c->len));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    conn_t *c = st->data;
    size_t len;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    c->len += (size_t)nread;
    c->req[c->len] = 0;
    if (!strstr(c->req, "\r\n\r\n") && !strstr(c->req, "\n\n")) {
        if (c->len >= sizeof c->req - 1)
            respond_text(c, 400, "request too large\n");
        return;
    }
    if (!strncmp(c->req, "GET /metrics ", 13) || !strncmp(c->req, "GET /metrics?", 13)) {
        char *body = render_body(c->h, &len);
        if (!body) {
            conn_close(c);
            return;
        }
        c->h->st.requests++;
        respond(c, 200, "text/plain; version=0.0.4", body, len);
    } else {
        respond_text(c, 404, "not found\n");
    }
}

/* A new connection: refused (closed at once, rejected) when
 * PS_HTTP_MAX_CONNS are open, else read under its deadline. */
static void on_conn(uv_stream_t *server, int status)
{
    ps_http_t *h = server->data;
    if (status < 0 || h->stopping) return;
    conn_t *c = calloc(1, sizeof *c);
    if (!c) return;
    c->h = h;
    h->refs++;
    uv_tcp_init(h->loop, &c->tcp);
    uv_timer_init(h->loop, &c->deadline);
    c->tcp.data = c->deadline.data = c;
    c->open_handles = 2;
    c->next = h->conns;
    if (c->next) c->next->prev = c;
    h->conns = c;
    h->st.connections++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    if (h->st.connections > PS_HTTP_MAX_CONNS) {
        h->st.rejected++;
        conn_close(c);
        return;
    }
    uv_timer_start(&c->deadline, on_deadline, PS_HTTP_DEADLINE_MS, 0);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void on_listener_closed(uv_handle_t *hd)
{
    unref(hd->data);
}

static int listen_on(ps_http_t *h, uv_loop_t *loop, const char *bind, int port)
{
    struct sockaddr_storage addr;
    const char *host = bind && bind[0] ? bind : "127.0.0.1";
    int rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&addr);
    if (rc < 0) rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr);
    if (rc < 0) {
        ps_error("--metrics-bind %s: not an IP address", host);
        return PS_EINVAL;
    }
    h->loop = loop;
    h->refs = 1;
    uv_tcp_init(loop, &h->listener);
    h->listener.data = h;
    if ((rc = uv_tcp_bind(&h->listener, (struct sockaddr *)&addr, 0)) < 0 ||
        (rc = uv_listen((uv_stream_t *)&h->listener, PS_HTTP_MAX_CONNS, on_conn)) < 0) {
        ps_error("/metrics: cannot listen on %s:%d (--metrics-bind, --metrics-port): %s", host,
                 port, uv_strerror(rc));
        /* h goes with the listener's close (threaded: after the caller's run) */
        uv_close((uv_handle_t *)&h->listener, on_listener_closed);
        return PS_EIO;
    }
    ps_info("metrics on http://%s:%d/metrics", host, port);
    return 0;
}

int ps_http_start(ps_http_t **out, uv_loop_t *loop, const char *bind, int port,
                  ps_http_render_fn *render, void *arg)
{
    *out = NULL;
    ps_http_t *h = calloc(1, sizeof *h);
    if (!h) return PS_ENOMEM;
    h->render = render;
    h->arg = arg;
    int rc = listen_on(h, loop, bind, port);
    if (rc) {
        if (!h->refs) free(h); /* else freed by the listener's close, when the loop runs */
        return rc;
    }
    *out = h;
    return 0;
}

static void stop_all(ps_http_t *h)
{
    h->stopping = 1;
    if (!uv_is_closing((uv_handle_t *)&h->listener))
        uv_close((uv_handle_t *)&h->listener, on_listener_closed);
    while (h->conns) conn_close(h->conns);
}

void ps_http_stop(ps_http_t **hp)
{
    ps_http_t *h = *hp;
    if (!h) return;
    *hp = NULL;
    stop_all(h);
}

void ps_http_stats(const ps_http_t *h, ps_http_stats_t *st)
{
    if (h) *st = h->st;
    else memset(st, 0, sizeof *st);
}

/* ---- on a thread of its own ---- */

static void on_wake(uv_async_t *a)
{
    ps_http_t *h = a->data;
    uv_close((uv_handle_t *)&h->wake, NULL);
    stop_all(h);
}

static void thread_main(void *arg)
{
    ps_http_t *h = arg;
    uv_run(&h->own, UV_RUN_DEFAULT);
}

int ps_http_thread_start(ps_http_t **out, const char *bind, int port, ps_http_render_fn *render,
                         void *arg)
{
    *out = NULL;
    ps_http_t *h = calloc(1, sizeof *h);
    if (!h) return PS_ENOMEM;
    h->render = render;
    h->arg = arg;
    h->threaded = 1;
    int rc = uv_loop_init(&h->own);
    if (rc < 0) {
        ps_error("/metrics: cannot create its event loop: %s", uv_strerror(rc));
        free(h);
        return PS_EIO;
    }
    if ((rc = listen_on(h, &h->own, bind, port))) {
        uv_run(&h->own, UV_RUN_DEFAULT); /* the listener's close */
        uv_loop_close(&h->own);
        free(h);
        return rc;
    }
    h->wake.data = h;
    int e;
    if ((e = uv_async_init(&h->own, &h->wake, on_wake)) < 0 ||
        (e = uv_thread_create(&h->thread, thread_main, h)) < 0) {
        ps_error("/metrics: cannot start its thread: %s", uv_strerror(e));
        if (uv_is_active((uv_handle_t *)&h->wake)) uv_close((uv_handle_t *)&h->wake, NULL);
        stop_all(h);
        uv_run(&h->own, UV_RUN_DEFAULT);
        uv_loop_close(&h->own);
        free(h);
        return PS_EIO;
    }
    *out = h;
    return 0;
}

void ps_http_thread_stop(ps_http_t **hp)
{
    ps_http_t *h = *hp;
    if (!h) return;
    *hp = NULL;
    uv_async_send(&h->wake);
    uv_thread_join(&h->thread);
    if (uv_loop_close(&h->own) < 0) ps_warn("/metrics: its loop still had handles at exit");
    free(h);
}
