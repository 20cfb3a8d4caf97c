/* A /metrics listener (common/ps_http.c, in psd or psworker) seen from its
 * clients: raw TCP, well-behaved GETs, and the flood of connections that
 * do not finish.  Only upper bounds on time, several times the deadline (a
 * loaded machine is slow, never fast). */
#ifndef HTTP_TESTLIB_H
#define HTTP_TESTLIB_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "ps_http.h" /* PS_HTTP_MAX_CONNS, PS_HTTP_DEADLINE_MS */
#include "tests/lib/tap.h"

#define HTTP_HELD PS_HTTP_MAX_CONNS
#define HTTP_EXTRA 6
#define HTTP_SLACK_MS 25000

static int http_port; /* the listener under test */

static int http_free_port(void)
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

static int http_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(http_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int http_send(int fd, const char *s)
{
    size_t n = strlen(s);
    return write(fd, s, n) == (ssize_t)n ? 0 : -1;
}

/* The whole answer to what was sent on fd (read until the server closes);
 * its status code, or -1.  Closes fd. */
static int http_answer(int fd, char *resp, size_t cap)
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
    int fd = http_connect();
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    if (fd < 0 || http_send(fd, req) < 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return http_answer(fd, resp, cap);
}

/* GET /metrics until it answers 200 (the listener is starting), up to ~10 s. */
static int http_get_ready(char *resp, size_t cap)
{
    int code = -1;
    for (int i = 0; i < 200 && code != 200; i++) {
        if ((code = http_get("/metrics", resp, cap)) != 200) usleep(50 * 1000);
    }
    return code;
}

/* The value of a sample "name{labels}" (pass the labels as written, or
 * none) in /metrics text; -1 if absent. */
static double http_metric(const char *text, const char *sample)
{
    char pat[256];
    snprintf(pat, sizeof pat, "\n%s ", sample);
    const char *p = strstr(text, pat);
    return p ? atof(p + strlen(pat)) : -1;
}

static double http_ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Waits until the server has closed every fd of fds[0..n) (a read sees EOF
 * or a reset) or timeout_ms passed; the number closed.  Closed fds are
 * closed here too and set to -1. */
static int http_wait_closed(int *fds, int n, int timeout_ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int closed = 0;
    for (int i = 0; i < n; i++) closed += fds[i] < 0;
    while (closed < n && http_ms_since(&t0) < timeout_ms) {
        struct pollfd pf[HTTP_HELD + HTTP_EXTRA];
        int m = 0, idx[HTTP_HELD + HTTP_EXTRA];
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
static void http_slow_but_complete(void)
{
    char resp[65536];
    int fd = http_connect();
    int sent = fd >= 0 && http_send(fd, "GET /metr") == 0;
    usleep(300 * 1000);
    sent = sent && http_send(fd, "ics HTTP/1.1\r\nHost: x\r\n\r\n") == 0;
    int code = sent ? http_answer(fd, resp, sizeof resp) : -1;
    if (!sent && fd >= 0) close(fd);
    is_int(code, 200, "a request line sent in two parts 300 ms apart is answered");
}

/* Clients that do not finish: HTTP_HELD connections (half silent, half
 * with half a request line) are all served or closed at their deadline,
 * HTTP_EXTRA more are closed at accept, and GETs are answered during and
 * after.  The listener's own counters <prefix>_http_*{labels} must say so.
 * at_full(arg) runs while all HTTP_HELD are open, after(arg) at the end. */
static void http_flood_check(const char *prefix, const char *labels, void (*at_full)(void *),
                             void (*after)(void *), void *arg)
{
    char resp[65536], name[128];
    int held[HTTP_HELD], extra[HTTP_EXTRA], opened = 0;
    for (int i = 0; i < 20; i++) {
        held[i] = http_connect();
        if (i % 2 && held[i] >= 0) http_send(held[i], "GET /metrics HTT");
        opened += held[i] >= 0;
    }
    is_int(opened, 20, "20 connections open: 10 silent, 10 with half a request line");
    is_int(http_get("/metrics", resp, sizeof resp), 200, "GET /metrics is answered while they are open");
    for (int i = 20; i < HTTP_HELD; i++) opened += (held[i] = http_connect()) >= 0;
    is_int(opened, HTTP_HELD, "%d silent or half-sent connections open", HTTP_HELD);
    if (at_full) at_full(arg);

    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < HTTP_EXTRA; i++) extra[i] = http_connect();
    is_int(http_wait_closed(extra, HTTP_EXTRA, HTTP_SLACK_MS), HTTP_EXTRA,
           "%d more connections are closed by the server at accept", HTTP_EXTRA);
    int closed = http_wait_closed(held, HTTP_HELD, PS_HTTP_DEADLINE_MS + HTTP_SLACK_MS);
    is_int(closed, HTTP_HELD, "the server closed all %d held connections at their deadline "
           "(%d ms; all in %.0f ms)", HTTP_HELD, PS_HTTP_DEADLINE_MS, http_ms_since(&t0));
    for (int i = 0; i < HTTP_HELD; i++)
        if (held[i] >= 0) close(held[i]);

    is_int(http_get("/metrics", resp, sizeof resp), 200, "GET /metrics is answered after them");
    snprintf(name, sizeof name, "%s_http_timeouts_total%s", prefix, labels);
    is_int((int)http_metric(resp, name), HTTP_HELD, "%s = %d", name, HTTP_HELD);
    snprintf(name, sizeof name, "%s_http_rejected_total%s", prefix, labels);
    is_int((int)http_metric(resp, name), HTTP_EXTRA, "%s = %d", name, HTTP_EXTRA);
    snprintf(name, sizeof name, "%s_http_connections%s", prefix, labels);
    is_int((int)http_metric(resp, name), 1, "%s = 1 (this one)", name);
    is_int(http_get("/other", resp, sizeof resp), 404, "GET /other -> 404");
    if (after) after(arg);
}

#endif
