/* The /metrics listener psd and psworker share: a tiny HTTP/1.1 server on
 * libuv that answers GET /metrics with the text a callback renders (and
 * anything else with 404), one request per connection (Connection: close).
 *
 * Clients that do not finish cannot pile up: each connection must send its
 * request and take the answer within PS_HTTP_DEADLINE_MS of the accept or
 * it is closed (counted in timeouts), and at most PS_HTTP_MAX_CONNS are
 * open at a time (more are closed at accept, counted in rejected).  A
 * scraper that connects and sends its GET at once is never affected.
 *
 * Two ways to run it: on the caller's loop (psd: every callback, the
 * render included, runs on that loop's thread), or on a thread and loop of
 * its own (psworker: the training thread never waits for a client; the
 * render runs on that thread and must take its figures under the caller's
 * own lock). */
#ifndef PS_HTTP_H
#define PS_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define PS_HTTP_MAX_CONNS 64
#define PS_HTTP_DEADLINE_MS 5000

typedef struct ps_http ps_http_t;

typedef struct ps_http_stats {
    int connections;     /* open now (the one asking included) */
    uint64_t requests;   /* GET /metrics answered */
    uint64_t timeouts;   /* closed at their deadline */
    uint64_t rejected;   /* closed at accept: PS_HTTP_MAX_CONNS were open */
} ps_http_stats_t;

/* Writes the /metrics body into buf[0..cap) and returns its whole length,
 * which may be >= cap (snprintf's rule: it is then called again with a
 * buffer that large).  st: the listener's own counters, to report. */
typedef size_t ps_http_render_fn(void *arg, const ps_http_stats_t *st, char *buf, size_t cap);

/* Listen on bind:port (an IPv4 or IPv6 address; NULL or "" = 127.0.0.1)
 * on `loop`.  0 and *out, or PS_EINVAL (bind is not an address) /
 * PS_EIO (cannot listen), logged naming --metrics-bind / --metrics-port. */
int ps_http_start(ps_http_t **out, uv_loop_t *loop, const char *bind, int port,
                  ps_http_render_fn *render, void *arg);
/* Close the listener and every open connection; the memory goes when the
 * loop has run their close callbacks.  *h is NULLed; NULL is a no-op. */
void ps_http_stop(ps_http_t **h);

/* The same on a thread of its own (its own loop); stop joins it. */
int ps_http_thread_start(ps_http_t **out, const char *bind, int port, ps_http_render_fn *render,
                         void *arg);
void ps_http_thread_stop(ps_http_t **h);

/* The counters (zeros for NULL).  On the listener's loop thread only (the
 * render gets them as its argument). */
void ps_http_stats(const ps_http_t *h, ps_http_stats_t *st);

#endif
