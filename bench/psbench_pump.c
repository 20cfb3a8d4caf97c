/* Loopback TCP ceiling for psbench: what one TCP stream over 127.0.0.1 moves
 * on this machine with large writes, measured in the same run as the psd
 * figures so the ratio compares like with like (same kernel, same load). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "psbench.h"
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
