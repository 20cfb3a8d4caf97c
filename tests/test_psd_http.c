/* psd's /metrics listener against clients that do not finish: raw TCP
 * connections that send nothing or half a request line are closed at their
 * deadline (PSD_HTTP_DEADLINE_MS, counted in http_timeouts), at most
 * PSD_HTTP_MAX_CONNS are open at once (more are closed at accept, counted in
 * http_rejected), and a well-behaved GET is answered during and after.  The
 * only timing bounds are upper bounds several times the deadline. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* psd_testlib.h helpers this test does not use */
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

/* server/psd.h: PSD_HTTP_MAX_CONNS, PSD_HTTP_DEADLINE_MS */
#define PSD_HTTP_MAX_CONNS 64
#define PSD_HTTP_DEADLINE_MS 5000
#define HELD PSD_HTTP_MAX_CONNS
#define EXTRA 6
#define SLACK_MS 25000 /* on top of the deadline: a loaded machine is slow, never fast */

static int metrics_port;

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

static int tcp_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(metrics_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *s)
{
    size_t n = strlen(s);
    return write(fd, s, n) == (ssize_t)n ? 0 : -1;
}

/* The whole answer to what was sent on fd (read until the server closes);
 * its status code, or -1. */
static int read_answer(int fd, char *resp, size_t cap)
{
    size_t got = 0;
    ssize_t k;
    while (got + 1 < cap && (k = read(fd, resp + got, cap - 1 - got)) > 0) got += (size_t)k;
    resp[got] = 0;
    close(fd);
    return got > 9 && !strncmp(resp, "HTTP/1.1 ", 9) ? atoi(resp + 9) : -1;
}

static int http_get(const char *path, char *resp, size_t cap)
{
    char req[256];
    int fd = tcp_connect();
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    if (fd < 0 || send_all(fd, req) < 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return read_answer(fd, resp, cap);
}

/* A counter or gauge of the /metrics text; -1 if absent. */
static double metric(const char *text, const char *name)
{
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = strstr(text, pat);
    return p ? atof(p + strlen(pat)) : -1;
}

static double stats_num(void *d, const char *key)
{
    Ps__Header h;
    char body[16384], pat[64];
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    if (t_call(d, &h, NULL, 0, NULL, 0, NULL, body, sizeof body) != PS__MSG_TYPE__MSG_ACK) return -1;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(body, pat);
    return p ? atof(p + strlen(pat)) : -1;
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Waits until the server has closed every fd of fds[0..n) (a read sees EOF
 * or a reset) or timeout_ms passed; the number closed.  Closed fds are
 * closed here too and set to -1. */
static int wait_closed(int *fds, int n, int timeout_ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int closed = 0;
    for (int i = 0; i < n; i++) closed += fds[i] < 0;
    while (closed < n && ms_since(&t0) < timeout_ms) {
        struct pollfd pf[HELD + EXTRA];
        int m = 0, idx[HELD + EXTRA];
        for (int i = 0; i < n; i++)
            if (fds[i] >= 0) pf[m] = (struct pollfd){fds[i], POLLIN, 0}, idx[m++] = i;
        if (poll(pf, (nfds_t)m, 200) <= 0) continue;
        for (int j = 0; j < m; j++) {
            char b[256];
            if (!pf[j].revents) continue;
            if (read(pf[j].fd, b, sizeof b) > 0) continue; /* an answer: not what is waited for */
            close(pf[j].fd);
            fds[idx[j]] = -1;
            closed++;
        }
    }
    return closed;
}

/* A request sent in two parts, the second after a pause well inside the
 * deadline, is answered like any other. */
static void slow_but_complete(void)
{
    char resp[65536];
    int fd = tcp_connect();
    int sent = fd >= 0 && send_all(fd, "GET /metr") == 0;
    t_sleep_ms(300);
    sent = sent && send_all(fd, "ics HTTP/1.1\r\nHost: x\r\n\r\n") == 0;
    int code = sent ? read_answer(fd, resp, sizeof resp) : -1;
    if (!sent && fd >= 0) close(fd);
    is_int(code, 200, "a request line sent in two parts 300 ms apart is answered");
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    metrics_port = free_port();
    char mport[16], resp[65536];
    snprintf(mport, sizeof mport, "%d", metrics_port);
    tpsd_t S;
    const char *args[] = {"--num-workers", "1", "--worker-timeout-ms", "0", "--metrics-port", mport,
                          "--log-level", "info", NULL};
    if (!ok(tpsd_start(&S, "http", args) == 0, "psd started with --metrics-port %s", mport))
        return tap_done();
    void *d = t_dealer(S.port);
    int code = -1;
    for (int i = 0; i < 100 && code != 200; i++, t_sleep_ms(50)) code = http_get("/metrics", resp, sizeof resp);
    is_int(code, 200, "GET /metrics answers");
    ok(metric(resp, "psd_http_timeouts_total") == 0 && metric(resp, "psd_http_rejected_total") == 0,
       "... with psd_http_timeouts_total 0 and psd_http_rejected_total 0");
    slow_but_complete();

    /* Half of the held connections send nothing, half a request line. */
    int held[HELD], extra[EXTRA];
    int opened = 0;
    for (int i = 0; i < 20; i++) {
        held[i] = tcp_connect();
        if (i % 2 && held[i] >= 0) send_all(held[i], "GET /metrics HTT");
        opened += held[i] >= 0;
    }
    is_int(opened, 20, "20 connections open: 10 silent, 10 with half a request line");
    code = http_get("/metrics", resp, sizeof resp);
    is_int(code, 200, "GET /metrics is answered while they are open");
    for (int i = 20; i < HELD; i++) opened += (held[i] = tcp_connect()) >= 0;
    is_int(opened, HELD, "%d silent or half-sent connections open", HELD);
    double open_now = -1;
    for (int i = 0; i < 100 && open_now != HELD; i++, t_sleep_ms(50))
        open_now = stats_num(d, "http_connections");
    ok(open_now == HELD, "STATS http_connections = %.0f (want %d)", open_now, HELD);

    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < EXTRA; i++) extra[i] = tcp_connect();
    int refused = wait_closed(extra, EXTRA, SLACK_MS);
    is_int(refused, EXTRA, "%d more connections are closed by the server at accept", EXTRA);
    is_int((int)stats_num(d, "http_rejected"), EXTRA, "STATS http_rejected counts them");

    int closed = wait_closed(held, HELD, PSD_HTTP_DEADLINE_MS + SLACK_MS);
    double ms = ms_since(&t0);
    is_int(closed, HELD, "the server closed all %d held connections at their deadline (%d ms; "
           "all in %.0f ms)", HELD, PSD_HTTP_DEADLINE_MS, ms);
    for (int i = 0; i < HELD; i++)
        if (held[i] >= 0) close(held[i]);

    code = http_get("/metrics", resp, sizeof resp);
    is_int(code, 200, "GET /metrics is answered after them");
    is_int((int)metric(resp, "psd_http_timeouts_total"), HELD, "psd_http_timeouts_total = %d", HELD);
    is_int((int)metric(resp, "psd_http_rejected_total"), EXTRA, "psd_http_rejected_total = %d", EXTRA);
    is_int((int)metric(resp, "psd_http_connections"), 1, "psd_http_connections = 1 (this one)");
    is_int((int)stats_num(d, "http_timeouts"), HELD, "STATS http_timeouts = %d", HELD);
    code = http_get("/other", resp, sizeof resp);
    is_int(code, 404, "GET /other -> 404");

    /* Shutdown with connections still open frees them (no hang, clean exit). */
    int last = tcp_connect();
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "psd exits 0 on SIGTERM with a /metrics connection open");
    if (last >= 0) close(last);
    if (tap_failed_) tpsd_dump_log(&S, 30);
    unlink(S.log);
    zmq_ctx_term(t_ctx);
    return tap_done();
}
