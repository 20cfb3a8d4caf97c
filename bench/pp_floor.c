/* pp_floor: the floor of a synchronous push + pull, measured with bare TCP
 * sockets and no server logic, in the process layout of psbench and of
 * ps-lite's bench_pp: S server processes and W worker processes on
 * 127.0.0.1.  Each iteration every worker sends its N-byte "gradient" cut
 * into S equal slices, one per server; a server waits until the slices of
 * all W workers are in (as a sync server must before it can answer), then
 * sends each worker N/S bytes back; the worker's iteration ends when every
 * server's slice is back.  No checksum, no summation, no copy beyond the
 * kernel's: what a parameter server moving these bytes cannot beat with the
 * same sockets and the same push-then-pull order.
 *
 *   pp_floor --servers S --workers W --bytes N [--iters K] [--warmup K]
 *
 * prints: floor S= W= bytes= iters= median_s= p10_s= p90_s= gbps=
 * (gbps = N / median iteration / 1e9, psbench's gbps_per_worker). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXP 32

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "pp_floor: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* Bytes of server s's slice of an n-byte gradient (the last takes the rest). */
static size_t slice_of(size_t n, int s, int S)
{
    size_t base = n / (size_t)S / 4 * 4;
    return s == S - 1 ? n - base * (size_t)(S - 1) : base;
}

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Move len[i] bytes on every fd[i] at once, in the direction `out` (send)
 * or not (receive), with poll: a blocking loop over the peers in turn would
 * serialise them (and two senders facing each other could stall). */
static void move_all(int *fd, char **buf, const size_t *len, int n, int out)
{
    size_t done[MAXP] = {0};
    struct pollfd pf[MAXP];
    int left = 0;
    for (int i = 0; i < n; i++) left += len[i] > 0;
    while (left > 0) {
        int np = 0, map[MAXP];
        for (int i = 0; i < n; i++)
            if (done[i] < len[i]) {
                pf[np].fd = fd[i];
                pf[np].events = out ? POLLOUT : POLLIN;
                map[np++] = i;
            }
        if (poll(pf, (nfds_t)np, 30000) <= 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "pp_floor: no progress for 30 s (%d peers left)\n", left);
            exit(1);
        }
        for (int k = 0; k < np; k++) {
            if (!pf[k].revents) continue;
            int i = map[k];
            ssize_t r = out ? send(fd[i], buf[i] + done[i], len[i] - done[i], MSG_DONTWAIT)
                            : recv(fd[i], buf[i] + done[i], len[i] - done[i], MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (r <= 0) {
                fprintf(stderr, "pp_floor: peer closed or failed: %s\n", r ? strerror(errno) : "EOF");
                exit(1);
            }
            done[i] += (size_t)r;
            if (done[i] == len[i]) left--;
        }
    }
}

static void server(int lfd, int S, int s, int W, size_t n, int total)
{
    int fd[MAXP];
    char *in[MAXP], *out[MAXP];
    size_t len[MAXP];
    size_t sl = slice_of(n, s, S);
    char *w = malloc(sl);
    if (!w) die("malloc");
    memset(w, 1, sl);
    for (int i = 0; i < W; i++) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0) die("accept");
        int rank;
        if (recv(c, &rank, sizeof rank, MSG_WAITALL) != sizeof rank || rank < 0 || rank >= W) die("hello");
        nodelay(c);
        fd[rank] = c;
    }
    for (int i = 0; i < W; i++) {
        in[i] = malloc(sl); /* one receive buffer per worker, as a server's slots */
        if (!in[i]) die("malloc");
        out[i] = w;
        len[i] = sl;
    }
    for (int it = 0; it < total; it++) {
        move_all(fd, in, len, W, 0);
        move_all(fd, out, len, W, 1);
    }
    exit(0);
}

static void worker(const int *port, int S, int r, size_t n, int warmup, int iters, int res_fd)
{
    int fd[MAXP];
    char *g = malloc(n), *wb = malloc(n), *pg[MAXP], *pw[MAXP];
    size_t len[MAXP], off = 0;
    double *t = malloc(sizeof(double) * (size_t)iters);
    if (!g || !wb || !t) die("malloc");
    memset(g, 2, n);
    for (int s = 0; s < S; s++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port[s]),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        fd[s] = socket(AF_INET, SOCK_STREAM, 0);
        if (fd[s] < 0 || connect(fd[s], (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        nodelay(fd[s]);
        if (send(fd[s], &r, sizeof r, 0) != sizeof r) die("hello");
        len[s] = slice_of(n, s, S);
        pg[s] = g + off;
        pw[s] = wb + off;
        off += len[s];
    }
    for (int it = 0; it < warmup + iters; it++) {
        double t0 = now_s();
        move_all(fd, pg, len, S, 1);
        move_all(fd, pw, len, S, 0);
        if (it >= warmup) t[it - warmup] = now_s() - t0;
    }
    if (write(res_fd, t, sizeof(double) * (size_t)iters) != (ssize_t)(sizeof(double) * (size_t)iters))
        die("write results");
    exit(0);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int S = 1, W = 1, iters = 40, warmup = 3;
    size_t n = 25u << 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--servers")) S = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--workers")) W = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--bytes")) n = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: pp_floor --servers S --workers W --bytes N [--iters K] [--warmup K]\n");
            return 2;
        }
    }
    if (argc % 2 == 0 || S < 1 || S > MAXP || W < 1 || W > MAXP || iters < 1 || warmup < 0 ||
        n < (size_t)S * 4) {
        fprintf(stderr, "pp_floor: bad arguments (1 <= S, W <= %d; iters >= 1; bytes >= 4 S)\n", MAXP);
        return 2;
    }
    int port[MAXP], lfd[MAXP], pipes[MAXP][2];
    pid_t kids[2 * MAXP];
    int nk = 0;
    for (int s = 0; s < S; s++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        lfd[s] = socket(AF_INET, SOCK_STREAM, 0);
        if (lfd[s] < 0 || bind(lfd[s], (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd[s], 64) < 0 ||
            getsockname(lfd[s], (struct sockaddr *)&a, &al) < 0)
            die("listen");
        port[s] = ntohs(a.sin_port);
    }
    for (int s = 0; s < S; s++) {
        pid_t p = fork();
        if (p < 0) die("fork");
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            server(lfd[s], S, s, W, n, warmup + iters);
        }
        kids[nk++] = p;
    }
    for (int w = 0; w < W; w++) {
        if (pipe(pipes[w]) < 0) die("pipe");
        pid_t p = fork();
        if (p < 0) die("fork");
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(pipes[w][0]);
            worker(port, S, w, n, warmup, iters, pipes[w][1]);
        }
        close(pipes[w][1]);
        kids[nk++] = p;
    }
    double *all = malloc(sizeof(double) * (size_t)iters * (size_t)W);
    if (!all) die("malloc");
    int bad = 0;
    for (int w = 0; w < W; w++) {
        size_t want = sizeof(double) * (size_t)iters, got = 0;
        while (got < want) {
            ssize_t r = read(pipes[w][0], (char *)(all + (size_t)w * iters) + got, want - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        bad |= got != want;
    }
    for (int i = 0; i < nk; i++) {
        int st;
        if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
    }
    if (bad) {
        fprintf(stderr, "pp_floor: a process failed\n");
        return 1;
    }
    /* every worker's iterations pooled, as psbench does */
    int m = iters * W;
    qsort(all, (size_t)m, sizeof *all, cmp_d);
    double med = all[m / 2], p10 = all[m / 10], p90 = all[m * 9 / 10];
    printf("floor S=%d W=%d bytes=%zu iters=%d median_s=%.6f p10_s=%.6f p90_s=%.6f gbps=%.3f\n", S, W, n,
           iters, med, p10, p90, (double)n / med / 1e9);
    return 0;
}
