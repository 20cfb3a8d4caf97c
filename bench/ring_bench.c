/* Bus bandwidth of the ring allreduce (worker/comm/ps_ring.c) with W processes on
 * loopback, in the units NCCL's and gloo's benchmarks use:
 *   busbw = 2 (W-1) / W * bytes / time
 * time = median over K iterations of the slowest rank's allreduce time.
 * Before each timed call a one-element allreduce lines the ranks up (it
 * cannot finish on any rank before every rank has entered it), so a rank's
 * timed call does not include waiting for a late peer's previous iteration.
 *
 * One output line per configuration (bench/ring_bench.sh parses them):
 *   RESULT ring n=W bytes=B nconn=C dtype=D median_s=T busbw_GBps=X
 * (ring_nocrc instead of ring with -x).
 * Usage: ring_bench [-n 2,4] [-s 16,100 (MiB)] [-k iters] [-w warmup]
 *                   [-c nconn list] [-g segment KiB] [-d fp32|fp16|bf16]
 *                   [-W window segments]
 *                   [-x (payload checksums off)] */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/ps_error.h"
#include "common/ps_log.h"
#include "worker/comm/ps_ring.h"

#define MAXL 8

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int parse_list(const char *s, double *v, int max)
{
    int n = 0;
    char *end;
    while (*s && n < max) {
        v[n++] = strtod(s, &end);
        if (end == s) return -1;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Free loopback endpoints (bound once, noted, closed). */
static int free_endpoints(char eps[][64], int w)
{
    void *ctx = zmq_ctx_new();
    void *s[64];
    int rc = 0;
    for (int i = 0; i < w; i++) {
        s[i] = zmq_socket(ctx, ZMQ_PULL);
        size_t len = 64;
        if (zmq_bind(s[i], "tcp://127.0.0.1:*") ||
            zmq_getsockopt(s[i], ZMQ_LAST_ENDPOINT, eps[i], &len))
            rc = -1;
    }
    for (int i = 0; i < w; i++) zmq_close(s[i]);
    zmq_ctx_term(ctx);
    return rc;
}

/* One rank: writes K doubles (its timed allreduce times) to fd. */
static int rank_main(int rank, int W, const char *const *eps, const ps_ring_opts_t *o, size_t n,
                     ps_dtype_t dt, int K, int warm, int fd)
{
    ps_ring_t *r = NULL;
    int rc = ps_ring_new(&r, rank, W, eps, o);
    float *x = malloc(n * sizeof *x), one = 1.f;
    double *t = calloc((size_t)K, sizeof *t);
    if (!x || !t) rc = PS_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) x[i] = (float)((i * 2654435761u + rank) % 1000) * 1e-3f;
    for (int it = 0; !rc && it < warm + K; it++) {
        if ((rc = ps_ring_allreduce(r, &one, 1, PS_DT_FP32))) break;
        double t0 = now_s();
        rc = ps_ring_allreduce(r, x, n, dt);
        if (it >= warm) t[it - warm] = now_s() - t0;
        /* keep values bounded so fp16 does not overflow over iterations */
        for (size_t i = 0; !rc && dt != PS_DT_FP32 && i < n; i += 4096) x[i] = 0.f;
    }
    ps_ring_destroy(&r);
    if (!rc && write(fd, t, (size_t)K * sizeof *t) != (ssize_t)((size_t)K * sizeof *t)) rc = PS_EIO;
    free(x);
    free(t);
    return rc;
}

static int run_config(int W, size_t bytes, const ps_ring_opts_t *o, ps_dtype_t dt, int K, int warm)
{
    char eps[64][64];
    const char *ep[64];
    if (free_endpoints(eps, W)) {
        fprintf(stderr, "ring_bench: cannot find free loopback ports\n");
        return 1;
    }
    for (int i = 0; i < W; i++) ep[i] = eps[i];
    size_t n = bytes / sizeof(float);
    int fds[64];
    pid_t pid[64];
    for (int r = 0; r < W; r++) {
        int p[2];
        if (pipe(p)) return 1;
        fflush(NULL);
        pid[r] = fork();
        if (pid[r] == 0) {
            close(p[0]);
            int rc = rank_main(r, W, ep, o, n, dt, K, warm, p[1]);
            _exit(rc ? 1 : 0);
        }
        close(p[1]);
        fds[r] = p[0];
    }
    double *tmax = calloc((size_t)K, sizeof *tmax), *t = calloc((size_t)K, sizeof *t);
    int fail = 0;
    for (int r = 0; r < W; r++) {
        size_t want = (size_t)K * sizeof *t, got = 0;
        while (got < want) {
            ssize_t m = read(fds[r], (char *)t + got, want - got);
            if (m <= 0) break;
            got += (size_t)m;
        }
        close(fds[r]);
        if (got != want) fail = 1;
        for (int i = 0; i < K && !fail; i++)
            if (t[i] > tmax[i]) tmax[i] = t[i];
    }
    for (int r = 0; r < W; r++) {
        int st;
        waitpid(pid[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) fail = 1;
    }
    if (fail) {
        fprintf(stderr, "ring_bench: a rank failed (n=%d, %zu bytes); see its log above\n", W, bytes);
        free(tmax);
        free(t);
        return 1;
    }
    qsort(tmax, (size_t)K, sizeof *tmax, cmp_d);
    double med = K % 2 ? tmax[K / 2] : 0.5 * (tmax[K / 2 - 1] + tmax[K / 2]);
    double busbw = 2.0 * (W - 1) / W * (double)(n * sizeof(float)) / med / 1e9;
    printf("RESULT %s n=%d bytes=%zu nconn=%d dtype=%s median_s=%.6f busbw_GBps=%.3f\n",
           o->checksum ? "ring" : "ring_nocrc", W, n * sizeof(float), o->nconn, ps_dtype_name(dt),
           med, busbw);
    fflush(stdout);
    free(tmax);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    double ns[MAXL] = {2, 4}, sizes[MAXL] = {16, 100}, conns[MAXL] = {1};
    int nn = 2, nsz = 2, nc = 1, K = 10, warm = 2, opt;
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    ps_dtype_t dt = PS_DT_FP32;
    ps_log_set_prog("ring_bench");
    while ((opt = getopt(argc, argv, "n:s:k:w:c:g:d:W:xh")) != -1) {
        switch (opt) {
        case 'n': nn = parse_list(optarg, ns, MAXL); break;
        case 's': nsz = parse_list(optarg, sizes, MAXL); break;
        case 'c': nc = parse_list(optarg, conns, MAXL); break;
        case 'k': K = atoi(optarg); break;
        case 'w': warm = atoi(optarg); break;
        case 'x': o.checksum = 0; break;
        case 'W': o.window = atoi(optarg); break;
        case 'g': o.segment_bytes = (size_t)(atof(optarg) * 1024); break;
        case 'd':
            if (ps_dtype_parse(optarg, &dt)) nn = -1;
            break;
        default:
            fprintf(stderr, "usage: %s [-n 2,4] [-s 16,100 (MiB)] [-k iters] [-w warmup] "
                            "[-c nconn,...] [-g segment KiB] [-d fp32|fp16|bf16] [-W window] [-x: no checksum]\n", argv[0]);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (nn < 1 || nsz < 1 || nc < 1 || K < 1 || warm < 0) {
        fprintf(stderr, "ring_bench: bad arguments (see -h)\n");
        return 2;
    }
    int fail = 0;
    for (int c = 0; c < nc; c++)
        for (int i = 0; i < nn; i++)
            for (int s = 0; s < nsz; s++) {
                o.nconn = (int)conns[c];
                if (ns[i] < 2 || ns[i] > 64) {
                    fprintf(stderr, "ring_bench: world size %g not in 2..64\n", ns[i]);
                    return 2;
                }
                fail |= run_config((int)ns[i], (size_t)(sizes[s] * 1048576.0), &o, dt, K, warm);
            }
    return fail;
}
