/* psbench: push+pull throughput of an N-byte FP32 gradient per worker per
 * iteration through synchronous psd, against the loopback TCP ceiling
 * measured in the same run, with the CPU it took (psd and workers); the
 * side-by-side comparison with ps-lite is bench/pslite_compare.sh.
 *
 *   psbench --servers 1,2 --workers 1,2 --bytes 25M,100M --codec raw --dtype fp32
 *   psbench --model tsm-r50 --compute-ms 200 --overlap on,off --netns psn42 ...
 *   psbench --mode ring --workers 2,4 --model tsm-r50 --dtype fp16 ...
 *
 * starts S psd processes (the psd binary next to this one, --port 0 with
 * --port-file) and W worker processes for every configuration, and prints
 * one key=value line per configuration. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "psbench.h"
#include "worker/models/model_sizes.h"
#include "ps_error.h"
#include "ps_log.h"

#define MAXLIST 16
#define MAXPROC 64

static pid_t g_children[MAXPROC];
static int g_nchildren;
static char g_tmpdir[PATH_MAX];
static const char *g_psd_args[32]; /* --psd-arg: passed on to every psd */
static int g_npsd_args;

static void kill_children(int sig)
{
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] > 0) kill(g_children[i], sig);
}

static void on_signal(int sig)
{
    kill_children(SIGKILL);
    /* async-signal-safe cleanup only; the temp dir is left (it is tiny) */
    _exit(128 + sig);
}

static void forget_child(pid_t pid)
{
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] == pid) g_children[i] = 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psbench [options]\n"
            "  --servers LIST          psd processes (default 1); LIST = n[,n...]\n"
            "  --workers LIST          worker processes (default 1); zipped with --servers\n"
            "                          when both are lists, otherwise crossed\n"
            "  --bytes LIST            FP32 gradient bytes per worker (default 25M; K/M/G = KiB/MiB/GiB)\n"
            "  --dtype LIST            wire dtype fp32|fp16|bf16 (default fp32)\n"
            "  --codec LIST            raw|lz4|topk|sign (default raw); topk and sign push\n"
            "                          compressed gradients with error feedback, weights\n"
            "                          come back raw (lz4 with --codec lz4)\n"
            "  --topk-ratio R          topk: fraction of elements pushed (default 0.01)\n"
            "  --pull-codec raw|lz4    codec of the weights (default: lz4 with --codec lz4,\n"
            "                          else raw)\n"
            "  --iters K               timed iterations (default 20)\n"
            "  --warmup K              untimed iterations first (default 3)\n"
            "  --partition-bytes N     partition size (default 1M, psworker's)\n"
            "  --max-inflight N        client window per server (default 8); bounds only\n"
            "                          requests answered without other workers (initial\n"
            "                          pulls), never pushes (see ps_client.h)\n"
            "  --psd PATH              psd binary (default: next to psbench)\n"
            "  --psd-arg ARG           pass ARG on to every psd (repeat for more:\n"
            "                          --psd-arg --threads --psd-arg 1)\n"
            "  --mode ps|ring          ps (default): psd servers; ring: no servers, the\n"
            "                          workers allreduce over a ZeroMQ ring (worker/comm/ps_ring.h;\n"
            "                          dense dtypes only, --servers ignored, servers=0)\n"
            "  --pump-seconds S        loopback TCP ceiling duration (default 2; 0 = skip)\n"
            "  --timeout-s S           give up on the whole run after S seconds (default 900)\n"
            "  --log-level L           error|warn|info|debug (default warn)\n"
            "  --model NAME            push the real layout of NAME instead of --bytes: %s\n"
            "  --compute-ms X          emulated forward+backward per step (a sleep, so many\n"
            "                          workers fit on few cores; default 0)\n"
            "  --overlap LIST          off|on|fwd (default off): on = forward takes X/3, then\n"
            "                          each partition is pushed as its share of the backward\n"
            "                          (2X/3, last partition first) ends; fwd = on, and the\n"
            "                          next step's forward waits for each partition's new\n"
            "                          weights just before that partition's forward share\n"
            "                          (P3-style); off = all pushes after X.  A step is then\n"
            "                          timed from one backward's end to the next\n"
            "  --schedule flops|params how X is split over the partitions (default flops:\n"
            "                          by the forward MACs of their layers, worker/models/model_sizes.h;\n"
            "                          params: by their sizes; without --model: by size)\n"
            "  --pull-credit N         0 (default): one PUSHPULL per partition, the server\n"
            "                          replies in the order partitions are aggregated (last\n"
            "                          layers first); N > 0: PUSH, then PULL the new weights\n"
            "                          with at most N pulls outstanding per server, lowest\n"
            "                          partition first (ByteScheduler-style credit), so the\n"
            "                          first layers' weights overtake the last layers'\n"
            "  --send-queue-bytes N    client send_queue_bytes per server (default: client's\n"
            "                          16M): pushes queued in ZeroMQ that a later, front-of-\n"
            "                          model push cannot overtake\n"
            "  --netns PREFIX          run server s in namespace PREFIX-h<s> and worker w in\n"
            "                          PREFIX-h<S+w> (made by deploy/netns/up.sh; needs root)\n"
            "  --colocate              with --netns: worker w in PREFIX-h<w>, server s beside\n"
            "                          worker s (needs servers <= workers)\n"
            "  --netns-net A.B.C       the hosts' /24 (default 10.213.0): host i is A.B.C.<i+1>\n"
            "  --link-streams LIST     with --netns and --pump-seconds > 0: measure what the\n"
            "                          link host 0 -> host 1 carries with each number of TCP\n"
            "                          streams (default 1,8) instead of the loopback ceiling;\n"
            "                          the best is the physical limit of the lines below\n"
            "  --link-only             measure the link (or loopback) and stop\n"
            "  --check                 verify the final weights against the closed form\n"
            "                          (topk/sign: exact with the worker's residual for one\n"
            "                          worker, check=skipped with several)\n"
            "                          (uses lr 0.1 instead of 1e-4; for tests, not timing)\n"
            "  --help\n"
            "Output: one line per configuration, key=value; GB = 1e9 bytes; gbps_per_worker =\n"
            "bytes / median step time, a step being pushpull of every partition and the wait;\n"
            "compute_s / comm_wait_s = medians of each step's emulated compute and of the rest\n"
            "(waiting for the communication after the compute ended).  With a measured link:\n"
            "link_floor_s = the bytes of the busiest link per step (one direction) at that\n"
            "rate, ratio_link_floor = link_floor_s / median_s.\n",
            psbench_model_names());
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v <= 0) return -1;
    switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1024 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' && end[1] == 'B') end += 2;
    else if (*end == 'B') end++;
    if (*end || v > 64.0 * 1024 * 1024 * 1024) return -1;
    *out = (size_t)v;
    return 0;
}

/* Split a comma list; returns the count or -1. */
static int split(const char *arg, char items[MAXLIST][64])
{
    int n = 0;
    const char *p = arg;
    while (*p) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (n == MAXLIST || len == 0 || len >= 64) return -1;
        memcpy(items[n], p, len);
        items[n][len] = 0;
        n++;
        p += len + (q ? 1 : 0);
        if (q && !*p) return -1;
    }
    return n;
}

static int parse_int_list(const char *arg, int *out, int lo, int hi, const char *name)
{
    char it[MAXLIST][64];
    int n = split(arg, it);
    for (int i = 0; i < n; i++) {
        char *end;
        long v = strtol(it[i], &end, 10);
        if (*end || v < lo || v > hi) n = -1;
        else out[i] = (int)v;
    }
    if (n <= 0) fprintf(stderr, "psbench: --%s %s: want integers in [%d, %d]\n", name, arg, lo, hi);
    return n;
}

/* Move the calling (child) process into host `host` of the emulated
 * cluster.  The namespace file is the one `ip netns add` made. */
static int enter_netns(const char *prefix, int host)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/run/netns/%s-h%d", prefix, host);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "psbench: %s: %s (deploy/netns/up.sh made too few hosts?)\n", path,
                strerror(errno));
        return -1;
    }
    int rc = setns(fd, CLONE_NEWNET);
    if (rc < 0) fprintf(stderr, "psbench: setns %s: %s\n", path, strerror(errno));
    close(fd);
    return rc;
}

static void host_addr(const psbench_cfg_t *cfg, int host, char *out, size_t len)
{
    if (cfg->netns) snprintf(out, len, "%s.%d", cfg->netns_net, host + 1);
    else snprintf(out, len, "127.0.0.1");
}

static int start_psd(const char *psd, int s, const psbench_cfg_t *cfg, char *endpoint, size_t eplen)
{
    char portfile[PATH_MAX + 32], a_id[16], a_ns[16], a_nw[16], addr[32], bind[48];
    host_addr(cfg, s, addr, sizeof addr);
    snprintf(bind, sizeof bind, "tcp://%s", addr);
    snprintf(portfile, sizeof portfile, "%s/port.%d", g_tmpdir, s);
    unlink(portfile);
    snprintf(a_id, sizeof a_id, "%d", s);
    snprintf(a_ns, sizeof a_ns, "%d", cfg->servers);
    snprintf(a_nw, sizeof a_nw, "%d", cfg->workers);
    /* psd bounds its messages by the largest partition it will accept */
    char a_pb[32];
    snprintf(a_pb, sizeof a_pb, "%zu", cfg->partition_bytes);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        ps_error("fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive psbench */
        if (getppid() != parent) _exit(1);
        if (cfg->netns && enter_netns(cfg->netns, s) < 0) _exit(126);
        const char *argv[64] = {"psd", "--port", "0", "--bind", bind, "--port-file", portfile,
              "--server-id", a_id, "--num-servers", a_ns, "--num-workers", a_nw,
              "--max-partition-bytes", a_pb, "--log-level", ps_log_level >= PS_LOG_INFO ? "info" : "warn",
              "--stats-every-s", "0"};
        int na = 0;
        while (argv[na]) na++;
        for (int k = 0; k < g_npsd_args && na < 63; k++) argv[na++] = g_psd_args[k];
        argv[na] = NULL;
        execv(psd, (char *const *)argv);
        fprintf(stderr, "psbench: exec %s: %s\n", psd, strerror(errno));
        _exit(127);
    }
    g_children[g_nchildren++] = pid;
    /* The port file appears once psd is bound. */
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(portfile, "r");
        int port = 0;
        if (f) {
            int got = fscanf(f, "%d", &port);
            fclose(f);
            if (got == 1 && port > 0) {
                snprintf(endpoint, eplen, "tcp://%s:%d", addr, port);
                return 0;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            forget_child(pid);
            ps_error("psd %d exited before binding (status %d)", s, st);
            return -1;
        }
        usleep(10 * 1000);
    }
    ps_error("psd %d did not write %s within 10 s", s, portfile);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    forget_child(pid);
    return -1;
}

static void stop_psd(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGTERM);
    for (int i = 0; i < n; i++) {
        if (pids[i] <= 0) continue;
        int st, done = 0;
        for (int k = 0; k < 300 && !done; k++) {
            if (waitpid(pids[i], &st, WNOHANG) == pids[i]) done = 1;
            else usleep(10 * 1000);
        }
        if (!done) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], &st, 0);
        }
        forget_child(pids[i]);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, int n, double q)
{
    double pos = q * (n - 1);
    int i = (int)pos;
    if (i + 1 >= n) return v[n - 1];
    return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

/* Read every worker's results as they come; the first worker that dies
 * without them brings the others down at once (they would otherwise sit in
 * a barrier or a sync step until their timeout). */
static int collect(const psbench_cfg_t *cfg, int *fds, pid_t *wpids, double *times,
                   double *ctimes, psbench_result_t *sum)
{
    int W = cfg->workers, open_fds = W, rc = 0;
    size_t per = 2 * (size_t)cfg->iters * sizeof(double) + sizeof(psbench_result_t);
    char *buf = calloc((size_t)W, per);
    size_t *got = calloc((size_t)W, sizeof *got);
    struct pollfd *pf = calloc((size_t)W, sizeof *pf);
    if (!buf || !got || !pf) {
        rc = -1;
        goto out;
    }
    for (int w = 0; w < W; w++) {
        pf[w].fd = fds[w];
        pf[w].events = POLLIN;
    }
    while (open_fds > 0 && rc == 0) {
        if (poll(pf, (nfds_t)W, -1) < 0) {
            if (errno == EINTR) continue;
            ps_error("poll: %s", strerror(errno));
            rc = -1;
            break;
        }
        for (int w = 0; w < W; w++) {
            if (pf[w].fd < 0 || !(pf[w].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = read(pf[w].fd, buf + (size_t)w * per + got[w], per - got[w]);
            if (n < 0 && errno == EINTR) continue;
            if (n > 0) got[w] += (size_t)n;
            if (n <= 0 || got[w] == per) {
                close(pf[w].fd);
                pf[w].fd = -1;
                open_fds--;
                if (got[w] != per) {
                    ps_error("worker %d died without results (see its log above); stopping the others", w);
                    rc = -1;
                }
            }
        }
    }
    if (rc < 0)
        for (int w = 0; w < W; w++)
            if (wpids[w] > 0) kill(wpids[w], SIGKILL);
    for (int w = 0; w < W; w++) {
        if (pf[w].fd >= 0) close(pf[w].fd);
        if (rc == 0) {
            const char *d = buf + (size_t)w * per;
            psbench_result_t r;
            size_t tb = (size_t)cfg->iters * sizeof(double);
            memcpy(times + (size_t)w * cfg->iters, d, tb);
            memcpy(ctimes + (size_t)w * cfg->iters, d + tb, tb);
            memcpy(&r, d + 2 * tb, sizeof r);
            sum->wire_out += r.wire_out / W;
            sum->wire_in += r.wire_in / W;
            if (!(r.check_err <= sum->check_err)) sum->check_err = r.check_err;
            sum->check_skipped |= r.check_skipped;
            sum->cpu_self += r.cpu_self, sum->csw_self += r.csw_self;
            sum->cpu_psd += r.cpu_psd, sum->csw_psd += r.csw_psd; /* rank 0's alone */
        }
    }
out:
    free(buf);
    free(got);
    free(pf);
    return rc;
}

/* --mode ring: W endpoints, one per worker.  Loopback: ports the kernel
 * hands out now (bound and released; another process taking one in
 * between makes that worker fail to bind, reported).  Emulated cluster:
 * worker w is host w, and every host has its own port space. */
static int ring_endpoints(const psbench_cfg_t *cfg, char eps[][64], char **epp)
{
    int fds[MAXPROC], nfd = 0, rc = 0;
    for (int w = 0; w < cfg->workers && !rc; w++) {
        epp[w] = eps[w];
        if (cfg->netns) {
            char host[32];
            host_addr(cfg, w, host, sizeof host);
            snprintf(eps[w], 64, "tcp://%s:29500", host);
            continue;
        }
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
            getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
            ps_error("ring: no free loopback port: %s", strerror(errno));
            if (fd >= 0) close(fd);
            rc = -1;
            break;
        }
        snprintf(eps[w], 64, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
        fds[nfd++] = fd; /* held until all are chosen, so none comes twice */
    }
    for (int i = 0; i < nfd; i++) close(fds[i]);
    return rc;
}

/* Bytes the busiest host link carries per step in one direction, for
 * per-worker wire bytes G (the larger of push and pull).  Dedicated servers:
 * a server's link carries W / S gradients' worth (G / S from each worker),
 * a worker's G.  Co-located (server s on worker s's host; its own worker's
 * share stays on the host): host s sends G (S-1)/S as a worker and
 * G (W-1)/S as a server.  Ring: what a rank sends, 2(W-1)/W of the
 * gradient, is its wire_out already. */
static double busiest_link_bytes(const psbench_cfg_t *cfg, double wire_out, double wire_in)
{
    double G = wire_out > wire_in ? wire_out : wire_in, S = cfg->servers, W = cfg->workers;
    if (cfg->ring) return wire_out;
    if (cfg->colocate) return G * (S - 1) / S + G * (W - 1) / S;
    return W / S > 1 ? G * W / S : G;
}

static const char *overlap_name(int o)
{
    return o == PSBENCH_OVERLAP_FWD ? "fwd" : o ? "on" : "off";
}

static int run_config(const char *psd, const psbench_cfg_t *cfg, double loop_bps, double link_bps)
{
    char eps[MAXPROC][64];
    char *epp[MAXPROC];
    pid_t spids[MAXPROC] = {0}, wpids[MAXPROC] = {0};
    int fds[MAXPROC], nw = 0, rc = 0;
    int S = cfg->servers, W = cfg->workers;
    double *times = calloc((size_t)W * cfg->iters, sizeof *times);
    double *ctimes = calloc((size_t)W * cfg->iters, sizeof *ctimes);
    double *wtimes = calloc((size_t)W * cfg->iters, sizeof *wtimes);
    psbench_result_t res = {0};
    if (!times || !ctimes || !wtimes) {
        free(times);
        free(ctimes);
        free(wtimes);
        return -1;
    }

    if (cfg->ring) {
        S = 0;
        if (ring_endpoints(cfg, eps, epp) < 0) {
            rc = -1;
            goto out;
        }
    }
    for (int s = 0; s < S; s++) {
        if (start_psd(psd, s, cfg, eps[s], sizeof eps[s]) < 0) {
            rc = -1;
            goto out;
        }
        spids[s] = g_children[g_nchildren - 1];
        psbench_psd_pid[s] = (int)spids[s];
        psbench_npsd = s + 1;
        epp[s] = eps[s];
    }
    for (int w = 0; w < W; w++) {
        int p[2];
        if (pipe(p) < 0) {
            ps_error("pipe: %s", strerror(errno));
            rc = -1;
            goto out;
        }
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) {
            ps_error("fork: %s", strerror(errno));
            close(p[0]);
            close(p[1]);
            rc = -1;
            goto out;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            close(p[0]);
            for (int i = 0; i < nw; i++) close(fds[i]);
            char tag[32];
            snprintf(tag, sizeof tag, "psbench-w%d", w);
            ps_log_set_prog(tag);
            if (cfg->netns && enter_netns(cfg->netns, cfg->colocate ? w : S + w) < 0) _exit(126);
            _exit(cfg->ring ? psbench_ring_worker(cfg, w, epp, p[1])
                            : psbench_worker(cfg, w, epp, p[1]));
        }
        close(p[1]);
        g_children[g_nchildren++] = pid;
        wpids[w] = pid;
        fds[nw++] = p[0];
    }
    if (collect(cfg, fds, wpids, times, ctimes, &res) < 0) rc = -1;
    for (int w = 0; w < W; w++) {
        int st;
        if (waitpid(wpids[w], &st, 0) == wpids[w] && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            ps_error("worker %d failed (status %d)", w, st);
            rc = -1;
        }
        forget_child(wpids[w]);
        wpids[w] = 0;
    }
out:
    for (int w = 0; w < W; w++)
        if (wpids[w] > 0) {
            kill(wpids[w], SIGKILL);
            waitpid(wpids[w], NULL, 0);
            forget_child(wpids[w]);
        }
    stop_psd(spids, S);
    if (rc == 0) {
        int n = W * cfg->iters;
        for (int i = 0; i < n; i++) wtimes[i] = times[i] - ctimes[i];
        qsort(times, (size_t)n, sizeof *times, cmp_double);
        qsort(ctimes, (size_t)n, sizeof *ctimes, cmp_double);
        qsort(wtimes, (size_t)n, sizeof *wtimes, cmp_double);
        double med = pct(times, n, 0.5), p10 = pct(times, n, 0.1), p90 = pct(times, n, 0.9);
        double gbps = (double)cfg->bytes / med / 1e9, lg = loop_bps / 1e9;
        char ratio[48] = "";
        if (cfg->codec == PS_CODEC_TOPK)
            snprintf(ratio, sizeof ratio, " topk_ratio=%g",
                     cfg->topk_ratio > 0 ? (double)cfg->topk_ratio : (double)PS_CODEC_TOPK_DEFAULT_RATIO);
        if (cfg->pull_codec >= 0)
            snprintf(ratio + strlen(ratio), sizeof ratio - strlen(ratio), " pull_codec=%s",
                     ps_codec_name((ps_codec_t)cfg->pull_codec));
        char infl[16];
        snprintf(infl, sizeof infl, "%d", cfg->max_inflight);
        printf("psbench mode=%s servers=%d workers=%d bytes=%zu dtype=%s codec=%s%s "
               "partition_bytes=%zu max_inflight=%s iters=%d median_s=%.6f p10_s=%.6f p90_s=%.6f "
               "gbps_per_worker=%.3f wire_out_per_iter=%.0f wire_in_per_iter=%.0f",
               cfg->ring ? "ring" : "ps", S, W, cfg->bytes, ps_dtype_name(cfg->dtype),
               ps_codec_name(cfg->codec), ratio, cfg->partition_bytes, infl, cfg->iters, med, p10, p90, gbps,
               res.wire_out, res.wire_in);
        if (cfg->model || cfg->compute_ms > 0 || cfg->netns)
            printf(" model=%s compute_ms=%g overlap=%s schedule=%s compute_s=%.6f comm_wait_s=%.6f "
                   "comm_wait_p90_s=%.6f steps_per_s=%.3f netns=%s placement=%s send_queue_bytes=%zu "
                   "pull_credit=%d",
                   cfg->model ? cfg->model : "none", cfg->compute_ms, overlap_name(cfg->overlap),
                   cfg->model && !cfg->sched_params ? "flops" : "params",
                   pct(ctimes, n, 0.5), pct(wtimes, n, 0.5), pct(wtimes, n, 0.9), 1.0 / med,
                   cfg->netns ? cfg->netns : "none", cfg->colocate ? "colocated" : "dedicated",
                   cfg->send_queue_bytes, cfg->pull_credit);
        if (link_bps > 0) {
            double fl = busiest_link_bytes(cfg, res.wire_out, res.wire_in) / link_bps;
            printf(" link_mbit=%.1f link_floor_s=%.6f ratio_link_floor=%.3f", link_bps * 8 / 1e6,
                   fl, fl / med);
        }
        if (lg > 0) printf(" loopback_gbps=%.3f ratio_loopback=%.3f", lg, gbps / lg);
        else printf(" loopback_gbps=NA ratio_loopback=NA");
        /* CPU per GB of gradient pushed by all workers over the timed
         * iterations, and context switches per iteration */
        double gb = (double)W * (double)cfg->bytes * cfg->iters / 1e9;
        if (!cfg->ring)
            printf(" cpu_psd_s_per_gb=%.3f", res.cpu_psd / gb);
        printf(" cpu_worker_s_per_gb=%.3f csw_per_iter_psd=%.1f csw_per_iter_workers=%.1f",
               res.cpu_self / gb, res.csw_psd / cfg->iters, res.csw_self / cfg->iters);
        if (cfg->check && res.check_skipped) {
            printf(" check=skipped");
        } else if (cfg->check) {
            printf(" check=%s check_err=%.3g", res.check_err <= 1 ? "ok" : "FAIL", res.check_err);
            if (!(res.check_err <= 1)) rc = -1;
        }
        printf("\n");
        fflush(stdout);
    } else {
        printf("psbench mode=%s servers=%d workers=%d bytes=%zu dtype=%s codec=%s status=FAILED\n",
               cfg->ring ? "ring" : "ps", S, W, cfg->bytes, ps_dtype_name(cfg->dtype), ps_codec_name(cfg->codec));
        fflush(stdout);
    }
    free(times);
    free(ctimes);
    free(wtimes);
    return rc;
}

int main(int argc, char **argv)
{
    int servers[MAXLIST] = {1}, workers[MAXLIST] = {1}, ns = 1, nwk = 1, nb = 1, nd = 1, nc = 1;
    int overlaps[MAXLIST] = {0}, no = 1, bytes_given = 0;
    size_t bytes[MAXLIST] = {(size_t)25 << 20};
    ps_dtype_t dts[MAXLIST] = {PS_DT_FP32};
    ps_codec_t cds[MAXLIST] = {PS_CODEC_RAW};
    psbench_cfg_t base = {0};
    base.partition_bytes = (size_t)1 << 20;
    base.pull_codec = -1;
    base.iters = 20;
    base.warmup = 3;
    base.max_inflight = 8;
    base.timeout_ms = 120000;
    base.netns_net = "10.213.0";
    double pump_s = 2;
    int timeout_s = 900, link_streams[MAXLIST] = {1, 8}, nls = 2, link_only = 0;
    const char *psd = NULL;
    char psd_buf[PATH_MAX];
    char it[MAXLIST][64];

    ps_log_set_prog("psbench");
    ps_log_set_level_str("warn");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--check")) {
            base.check = 1;
            continue;
        }
        if (!strcmp(a, "--colocate")) {
            base.colocate = 1;
            continue;
        }
        if (!strcmp(a, "--link-only")) {
            link_only = 1;
            continue;
        }
        if (strncmp(a, "--", 2) || !v) {
            fprintf(stderr, "psbench: %s: %s (see --help)\n", a,
                    strncmp(a, "--", 2) ? "unexpected argument" : "needs a value");
            return 2;
        }
        i++;
        int bad = 0;
        if (!strcmp(a, "--servers")) bad = (ns = parse_int_list(v, servers, 1, 16, "servers")) < 0;
        else if (!strcmp(a, "--workers")) bad = (nwk = parse_int_list(v, workers, 1, 32, "workers")) < 0;
        else if (!strcmp(a, "--bytes")) {
            bytes_given = 1;
            nb = split(v, it);
            for (int k = 0; k < nb && !bad; k++)
                bad = parse_size(it[k], &bytes[k]) < 0 || bytes[k] % 4 || bytes[k] < 4;
            bad |= nb <= 0;
        } else if (!strcmp(a, "--dtype")) {
            nd = split(v, it);
            for (int k = 0; k < nd && !bad; k++) bad = ps_dtype_parse(it[k], &dts[k]) < 0;
            bad |= nd <= 0;
        } else if (!strcmp(a, "--codec")) {
            nc = split(v, it);
            for (int k = 0; k < nc && !bad; k++)
                bad = ps_codec_parse(it[k], &cds[k]) < 0;
            bad |= nc <= 0;
        } else if (!strcmp(a, "--topk-ratio"))
            bad = !((base.topk_ratio = (float)atof(v)) > 0.f && base.topk_ratio <= 1.f);
        else if (!strcmp(a, "--pull-codec")) {
            ps_codec_t pc;
            bad = ps_codec_parse(v, &pc) < 0 || (pc != PS_CODEC_RAW && pc != PS_CODEC_LZ4);
            base.pull_codec = (int)pc;
        } else if (!strcmp(a, "--iters")) bad = (base.iters = atoi(v)) < 1;
        else if (!strcmp(a, "--warmup")) bad = (base.warmup = atoi(v)) < 0 || !strchr("0123456789", v[0]);
        else if (!strcmp(a, "--partition-bytes")) bad = parse_size(v, &base.partition_bytes) < 0 || base.partition_bytes < 4;
        else if (!strcmp(a, "--max-inflight")) bad = (base.max_inflight = atoi(v)) < 1;
        else if (!strcmp(a, "--psd")) psd = v;
        else if (!strcmp(a, "--psd-arg")) bad = g_npsd_args == 32 || !(g_psd_args[g_npsd_args++] = v);
        else if (!strcmp(a, "--model")) {
            psbench_model_t m;
            bad = psbench_model_build(&m, v) < 0;
            if (!bad) {
                base.model = v;
                bytes[0] = m.total_numel * sizeof(float);
                psbench_model_free(&m);
            }
        } else if (!strcmp(a, "--compute-ms")) {
            char *end;
            base.compute_ms = strtod(v, &end);
            bad = *end || !(base.compute_ms >= 0 && base.compute_ms <= 3600e3);
        } else if (!strcmp(a, "--overlap")) {
            no = split(v, it);
            for (int k = 0; k < no && !bad; k++) {
                bad = strcmp(it[k], "on") && strcmp(it[k], "off") && strcmp(it[k], "fwd");
                overlaps[k] = !strcmp(it[k], "fwd") ? PSBENCH_OVERLAP_FWD
                              : !strcmp(it[k], "on") ? PSBENCH_OVERLAP_ON
                                                     : PSBENCH_OVERLAP_OFF;
            }
            bad |= no <= 0;
        } else if (!strcmp(a, "--netns")) {
            bad = !*v || strlen(v) > 40 || strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(v);
            base.netns = v;
        } else if (!strcmp(a, "--netns-net")) {
            unsigned o1, o2, o3;
            char extra;
            bad = sscanf(v, "%u.%u.%u%c", &o1, &o2, &o3, &extra) != 3 || o1 > 255 || o2 > 255 || o3 > 255;
            base.netns_net = v;
        }
        else if (!strcmp(a, "--schedule")) {
            bad = strcmp(v, "flops") && strcmp(v, "params");
            base.sched_params = !strcmp(v, "params");
        } else if (!strcmp(a, "--pull-credit"))
            bad = (base.pull_credit = atoi(v)) < 0 || !strchr("0123456789", v[0]);
        else if (!strcmp(a, "--send-queue-bytes"))
            bad = parse_size(v, &base.send_queue_bytes) < 0;
        else if (!strcmp(a, "--link-streams"))
            bad = (nls = parse_int_list(v, link_streams, 1, 64, "link-streams")) < 0;
        else if (!strcmp(a, "--mode")) {
            bad = strcmp(v, "ps") && strcmp(v, "ring");
            base.ring = !strcmp(v, "ring");
        }
        else if (!strcmp(a, "--pump-seconds")) bad = (pump_s = atof(v)) < 0;
        else if (!strcmp(a, "--timeout-s")) bad = (timeout_s = atoi(v)) < 1;
        else if (!strcmp(a, "--log-level")) bad = ps_log_set_level_str(v) < 0;
        else {
            fprintf(stderr, "psbench: unknown option %s (see --help)\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "psbench: bad value for %s: '%s' (see --help)\n", a, v);
            return 2;
        }
    }
    for (int k = 0; k < no && base.ring; k++)
        if (overlaps[k] == PSBENCH_OVERLAP_FWD) {
            fprintf(stderr, "psbench: --overlap fwd (per-partition waits in the next forward) "
                    "is emulated for --mode ps only\n");
            return 2;
        }
    if (base.ring && base.pull_credit > 0) {
        fprintf(stderr, "psbench: --pull-credit is for --mode ps\n");
        return 2;
    }
    for (int k = 0; k < nc && base.ring; k++)
        if (cds[k] != PS_CODEC_RAW) {
            fprintf(stderr, "psbench: --mode ring carries dense fp32/fp16/bf16 partial sums only; "
                    "--codec %s (a sparse, 1-bit or lz4 partial sum is not closed under "
                    "addition) is a parameter-server codec\n", ps_codec_name(cds[k]));
            return 2;
        }
    if (base.model) {
        if (bytes_given) {
            fprintf(stderr, "psbench: --model and --bytes exclude each other\n");
            return 2;
        }
        nb = 1; /* bytes[0] = the model's size */
    }
    /* a request may take as long as the run is allowed to (slow emulated
     * links), never less than the 120 s default */
    if ((long long)timeout_s * 1000 > base.timeout_ms)
        base.timeout_ms = timeout_s > INT_MAX / 1000 ? INT_MAX : timeout_s * 1000;
    int zip = ns > 1 && nwk > 1;
    if (zip && ns != nwk) {
        fprintf(stderr, "psbench: --servers and --workers lists differ in length (%d vs %d)\n", ns, nwk);
        return 2;
    }
    if (!psd) {
        ssize_t n = readlink("/proc/self/exe", psd_buf, sizeof psd_buf - 8);
        if (n <= 0) {
            fprintf(stderr, "psbench: cannot find myself (/proc/self/exe); use --psd\n");
            return 2;
        }
        psd_buf[n] = 0;
        char *d = dirname(psd_buf);
        memmove(psd_buf, d, strlen(d) + 1);
        strcat(psd_buf, "/psd");
        psd = psd_buf;
    }
    if (access(psd, X_OK) != 0) {
        fprintf(stderr, "psbench: psd binary %s: %s (use --psd PATH)\n", psd, strerror(errno));
        return 2;
    }

    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/psbench.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_tmpdir)) {
        fprintf(stderr, "psbench: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGALRM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    alarm((unsigned)timeout_s);

    /* The ceiling first, while nothing else of ours runs: in the emulated
     * cluster what one link carries (tbf's burst and queue can hold TCP
     * below the set rate), else loopback TCP. */
    double loop_bps = 0, link_bps = 0;
    if (pump_s > 0 && base.netns) {
        for (int k = 0; k < nls; k++) {
            double b = psbench_link_bps(base.netns, base.netns_net, 0, 1, link_streams[k], pump_s);
            printf("psbench link from=%s-h0 to=%s-h1 streams=%d seconds=%.1f mbit_per_s=%.1f\n",
                   base.netns, base.netns, link_streams[k], pump_s, b * 8 / 1e6);
            if (b > link_bps) link_bps = b;
        }
    } else if (pump_s > 0) {
        loop_bps = psbench_loopback_bps(pump_s, (size_t)1 << 20);
        printf("psbench loopback_tcp_gbps=%.3f seconds=%.1f write_bytes=%d\n", loop_bps / 1e9,
               pump_s, 1 << 20);
    }
    fflush(stdout);
    if (link_only) {
        rmdir(g_tmpdir);
        return pump_s > 0 && !(loop_bps > 0 || link_bps > 0);
    }

    int failed = 0, nsw = zip ? ns : ns * nwk;
    for (int i = 0; i < nsw; i++)
        for (int b = 0; b < nb; b++)
            for (int d = 0; d < nd; d++)
                for (int k = 0; k < nc * no; k++) {
                    psbench_cfg_t c = base;
                    c.overlap = overlaps[k % no];
                    c.servers = zip ? servers[i] : servers[i / nwk];
                    c.workers = zip ? workers[i] : workers[i % nwk];
                    c.bytes = bytes[b];
                    c.dtype = dts[d];
                    c.codec = cds[k / no];
                    if (c.servers + c.workers > MAXPROC) {
                        fprintf(stderr, "psbench: too many processes\n");
                        return 2;
                    }
                    if (c.colocate && (c.ring || !c.netns || c.servers > c.workers)) {
                        fprintf(stderr, "psbench: --colocate needs --netns, --mode ps and "
                                "servers <= workers (got %d servers, %d workers)\n",
                                c.servers, c.workers);
                        return 2;
                    }
                    failed |= run_config(psd, &c, loop_bps, link_bps) < 0;
                }

    char pf[PATH_MAX + 32];
    for (int s = 0; s < 16; s++) {
        snprintf(pf, sizeof pf, "%s/port.%d", g_tmpdir, s);
        unlink(pf);
    }
    rmdir(g_tmpdir);
    return failed ? 1 : 0;
}
