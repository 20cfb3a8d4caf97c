/* Physical limits for psbench, measured in the same run as the psd figures
 * so the ratios compare like with like (same kernel, same load): what one
 * TCP stream over 127.0.0.1 moves with large writes, and what one link of
 * the emulated cluster (tc tbf, deploy/netns) carries with several streams. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "psbench.h"
#include "ps_util.h"
#include "ps_log.h"

double psbench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct pump {
    int fd;
    size_t chunk;
    double seconds;
    unsigned long long bytes;
    double elapsed;
} pump_t;

static void *reader(void *arg)
{
    pump_t *p = arg;
    char *buf = malloc(p->chunk);
    if (!buf) return NULL;
    memset(buf, 0, p->chunk);
    double t0 = 0;
    for (;;) {
        ssize_t n = read(p->fd, buf, p->chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (p->bytes == 0) t0 = psbench_now();
        p->bytes += (unsigned long long)n;
    }
    p->elapsed = psbench_now() - t0;
    free(buf);
    return NULL;
}

double psbench_loopback_bps(double seconds, size_t chunk)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), cs = -1, as = -1;
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    pump_t rd = {0};
    pthread_t th;
    char *buf = NULL;
    double bps = 0;

    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 1) < 0 ||
        getsockname(ls, (struct sockaddr *)&a, &alen) < 0) {
        ps_error("loopback pump: listen: %s", strerror(errno));
        goto out;
    }
    cs = socket(AF_INET, SOCK_STREAM, 0);
    if (cs < 0 || connect(cs, (struct sockaddr *)&a, sizeof a) < 0 ||
        (as = accept(ls, NULL, NULL)) < 0) {
        ps_error("loopback pump: connect: %s", strerror(errno));
        goto out;
    }
    buf = malloc(chunk);
    if (!buf) goto out;
    memset(buf, 0x5a, chunk);
    rd.fd = as;
    rd.chunk = chunk;
    if (pthread_create(&th, NULL, reader, &rd) != 0) goto out;
    double t0 = psbench_now();
    while (psbench_now() - t0 < seconds) {
        size_t off = 0;
        while (off < chunk) {
            ssize_t n = write(cs, buf + off, chunk - off);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                ps_error("loopback pump: write: %s", strerror(errno));
                goto stop;
            }
            off += (size_t)n;
        }
    }
stop:
    shutdown(cs, SHUT_WR);
    pthread_join(th, NULL);
    if (rd.elapsed > 0) bps = (double)rd.bytes / rd.elapsed;
out:
    free(buf);
    if (as >= 0) close(as);
    if (cs >= 0) close(cs);
    if (ls >= 0) close(ls);
    return bps;
}

/* ---- one link of the emulated cluster ------------------------------------ */

#define LINK_MAX_STREAMS 64
#define LINK_CHUNK ((size_t)256 << 10)

static int link_enter(const char *prefix, int host)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/run/netns/%s-h%d", prefix, host);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
        ps_error("link pump: entering %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

/* Receiver (in host `to`): binds NET.<to+1>:0, tells the parent its port,
 * accepts `streams` connections and reads them all to EOF; sends back
 * {bytes, seconds from the first byte to the last EOF}. */
static int link_recv(const char *addr, int streams, int fd)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t alen = sizeof a;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), cs[LINK_MAX_STREAMS], n = 0;
    if (ls < 0 || inet_pton(AF_INET, addr, &a.sin_addr) != 1 ||
        bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, streams) < 0 ||
        getsockname(ls, (struct sockaddr *)&a, &alen) < 0) {
        ps_error("link pump: listen on %s: %s", addr, strerror(errno));
        return 1;
    }
    int port = ntohs(a.sin_port);
    if (ps_write_all(fd, &port, sizeof port) < 0) return 1;
    struct pollfd pf[LINK_MAX_STREAMS + 1];
    char *buf = malloc(LINK_CHUNK);
    double r[2] = {0, 0}, t0 = 0, t1 = 0;
    int done = 0;
    if (!buf) return 1;
    pf[0].fd = ls;
    pf[0].events = POLLIN;
    while (done < streams) {
        if (poll(pf, (nfds_t)(n + 1), 60000) <= 0) {
            ps_error("link pump: no data for 60 s (%d of %d streams done)", done, streams);
            return 1;
        }
        if (n < streams && (pf[0].revents & POLLIN)) {
            int c = accept(ls, NULL, NULL);
            if (c >= 0) {
                cs[n] = c;
                pf[n + 1].fd = c;
                pf[n + 1].events = POLLIN;
                n++;
            }
        }
        for (int i = 0; i < n; i++) {
            if (pf[i + 1].fd < 0 || !(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t k = read(cs[i], buf, LINK_CHUNK);
            if (k < 0 && errno == EINTR) continue;
            if (k > 0) {
                if (r[0] == 0) t0 = psbench_now();
                r[0] += (double)k;
                continue;
            }
            close(cs[i]);
            pf[i + 1].fd = -1;
            done++;
            t1 = psbench_now();
        }
    }
    r[1] = t1 - t0;
    free(buf);
    return ps_write_all(fd, r, sizeof r) < 0;
}

typedef struct link_writer {
    int fd;
    double until;
    const char *buf;
} link_writer_t;

static void *link_write_main(void *arg)
{
    link_writer_t *w = arg;
    while (psbench_now() < w->until)
        if (ps_write_all(w->fd, w->buf, LINK_CHUNK) < 0) break;
    shutdown(w->fd, SHUT_WR);
    return NULL;
}

/* Sender (in host `from`): `streams` connections to addr:port, one writer
 * thread each, for `seconds`. */
static int link_send(const char *addr, int port, int streams, double seconds)
{
    pthread_t th[LINK_MAX_STREAMS];
    link_writer_t w[LINK_MAX_STREAMS];
    char *buf = malloc(LINK_CHUNK);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    int rc = 0, started = 0;
    if (!buf || inet_pton(AF_INET, addr, &a.sin_addr) != 1) return 1;
    memset(buf, 0x5a, LINK_CHUNK);
    double until = psbench_now() + seconds;
    for (int i = 0; i < streams && rc == 0; i++) {
        w[i].fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        w[i].until = until;
        w[i].buf = buf;
        if (w[i].fd < 0 || connect(w[i].fd, (struct sockaddr *)&a, sizeof a) < 0) {
            ps_error("link pump: connect %s:%d: %s", addr, port, strerror(errno));
            rc = 1;
            break;
        }
        if (pthread_create(&th[i], NULL, link_write_main, &w[i]) != 0) {
            rc = 1;
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < started; i++) close(w[i].fd);
    free(buf);
    return rc;
}

double psbench_link_bps(const char *prefix, const char *net, int from, int to, int streams,
                        double seconds)
{
    char to_addr[32];
    int p[2], port = 0, st;
    double r[2] = {0, 0};
    pid_t rp, sp;
    if (streams < 1 || streams > LINK_MAX_STREAMS) {
        ps_error("link pump: streams %d not in [1, %d]", streams, LINK_MAX_STREAMS);
        return 0;
    }
    snprintf(to_addr, sizeof to_addr, "%s.%d", net, to + 1);
    if (pipe(p) < 0) return 0;
    if ((rp = fork()) < 0) {
        close(p[0]);
        close(p[1]);
        return 0;
    }
    if (rp == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        _exit(link_enter(prefix, to) < 0 ? 126 : link_recv(to_addr, streams, p[1]));
    }
    close(p[1]);
    ssize_t k = read(p[0], &port, sizeof port);
    if (k != (ssize_t)sizeof port || port <= 0) {
        ps_error("link pump: the receiver in %s-h%d did not start", prefix, to);
        kill(rp, SIGKILL);
        waitpid(rp, NULL, 0);
        close(p[0]);
        return 0;
    }
    if ((sp = fork()) == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        _exit(link_enter(prefix, from) < 0 ? 126 : link_send(to_addr, port, streams, seconds));
    }
    size_t got = 0;
    while (sp > 0 && got < sizeof r) {
        k = read(p[0], (char *)r + got, sizeof r - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(p[0]);
    if (sp > 0) waitpid(sp, &st, 0);
    else kill(rp, SIGKILL);
    waitpid(rp, &st, 0);
    if (got != sizeof r || r[1] <= 0) {
        ps_error("link pump: %s-h%d -> h%d measured nothing", prefix, from, to);
        return 0;
    }
    return r[0] / r[1];
}
