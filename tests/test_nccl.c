/* ps_nccl: NCCL allreduce among ranks forked from this process (one GPU per
 * rank when there are two, else both on device 0 -- which NCCL refuses, so
 * that case is reported as a skip and a one-rank communicator is checked
 * instead), the ZeroMQ rendezvous and its failure paths.
 *
 * Every value is a small integer, so the reference is exact: the sum and the
 * mean (sum / (float)W) must come back bit for bit, in fp32, fp16 and bf16
 * on the wire alike (|x| <= 16, sums of a few ranks fit every wire dtype).
 *
 * CUDA does not survive fork(): the parent never touches it (it even counts
 * the GPUs in a child) and each rank initialises it in its own process.
 * Exits 77 without a GPU or without NCCL. */
#include "config.h"

#include <signal.h>
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
#include "tests/lib/tap.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/comm/ps_nccl.h"

#define COUNT ((size_t)1 << 20 | 5) /* odd: no dtype gets a round size */
#define CHILD_ALARM_S 90            /* a hung rank is killed, never waited for */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Run fn(arg) in a child; returns its exit status, 200 + signal if killed. */
static int run_child(int (*fn)(const void *), const void *arg, pid_t *pid_out)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return -1;
    }
    if (pid == 0) {
        alarm(CHILD_ALARM_S);
        _exit(fn(arg));
    }
    if (pid_out) {
        *pid_out = pid;
        return 0;
    }
    int st = 0;
    if (waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 200 + WTERMSIG(st);
}

static int wait_child(pid_t pid)
{
    int st = 0;
    if (waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 200 + WTERMSIG(st);
}

static int count_gpus(const void *arg)
{
    (void)arg;
    int n = ps_cuda_device_count();
    return n > 100 ? 100 : n;
}

static float value(size_t i, int rank) { return (float)((int)((i * 7 + (size_t)rank * 13) % 33) - 16); }

typedef struct {
    int rank, world, device;
    const char *ep;
} rank_args_t;

/* One rank: exit 0 when every check passed, 77 when NCCL refused the setup
 * (two ranks on one GPU), else the number of the failed step (details on
 * stderr, which the test log keeps). */
static int rank_main(const void *p)
{
    const rank_args_t *a = p;
    ps_nccl_t *n = NULL;
    int rc = ps_nccl_new(&n, a->rank, a->world, a->ep, a->device, 30000);
    if (rc == PS_EUNSUPPORTED) return 77;
    if (rc) {
        fprintf(stderr, "rank %d: ps_nccl_new: %s\n", a->rank, ps_strerror(rc));
        return 10;
    }
    if (ps_nccl_rank(n) != a->rank || ps_nccl_world(n) != a->world) return 11;
    float *x = malloc(COUNT * sizeof *x), *out = malloc(COUNT * sizeof *out);
    float *sum = malloc(COUNT * sizeof *sum);
    void *d = NULL;
    if (!x || !out || !sum || ps_cuda_malloc(&d, COUNT * sizeof(float))) return 12;
    for (size_t i = 0; i < COUNT; i++) {
        x[i] = value(i, a->rank);
        int s = 0;
        for (int r = 0; r < a->world; r++) s += (int)value(i, r);
        sum[i] = (float)s;
    }
    const ps_dtype_t dts[3] = {PS_DT_FP32, PS_DT_FP16, PS_DT_BF16};
    int step = 20;
    for (int k = 0; k < 3; k++) {
        for (int mean = 0; mean < 2; mean++, step += 2) {
            if (ps_cuda_memcpy_h2d(d, x, COUNT * sizeof(float))) return step;
            rc = mean ? ps_nccl_allreduce_mean(n, d, COUNT, dts[k], NULL)
                      : ps_nccl_allreduce(n, d, COUNT, dts[k], NULL);
            if (rc) {
                fprintf(stderr, "rank %d: allreduce dtype %d mean %d: %s\n", a->rank, (int)dts[k],
                        mean, ps_strerror(rc));
                return step;
            }
            if (ps_cuda_memcpy_d2h(out, d, COUNT * sizeof(float))) return step;
            for (size_t i = 0; i < COUNT; i++) {
                float want = mean ? sum[i] / (float)a->world : sum[i];
                if (memcmp(&out[i], &want, sizeof want)) {
                    fprintf(stderr, "rank %d: dtype %d mean %d: [%zu] = %.9g, want %.9g\n",
                            a->rank, (int)dts[k], mean, i, out[i], want);
                    return step + 1;
                }
            }
        }
    }
    /* argument errors are refused without breaking the communicator */
    if (ps_nccl_allreduce(n, NULL, 5, PS_DT_FP32, NULL) != PS_EINVAL) return 40;
    if (ps_nccl_allreduce(n, d, 5, (ps_dtype_t)7, NULL) != PS_EINVAL) return 41;
    if (ps_nccl_allreduce(n, d, 0, PS_DT_FP32, NULL) != 0) return 42;
    if (ps_cuda_memcpy_h2d(d, x, 64 * sizeof(float)) ||
        ps_nccl_allreduce(n, d, 64, PS_DT_FP32, NULL) ||
        ps_cuda_memcpy_d2h(out, d, 64 * sizeof(float)) || memcmp(out, sum, 64 * sizeof(float)))
        return 43;
    ps_nccl_destroy(&n);
    if (n) return 44;
    ps_cuda_free(d);
    free(x), free(out), free(sum);
    return 0;
}

/* rank 0 of `world` with nobody else: must give up with PS_ETIMEOUT */
static int lonely_root(const void *p)
{
    const rank_args_t *a = p;
    ps_nccl_t *n = NULL;
    int rc = ps_nccl_new(&n, 0, a->world, a->ep, a->device, 500);
    return rc < 0 ? -rc : 99;
}

/* rank 0 whose only peer takes the id and vanishes: NCCL's own setup must
 * then time out (or fail), never hang */
static int deserted_root(const void *p)
{
    const rank_args_t *a = p;
    ps_nccl_t *n = NULL;
    int rc = ps_nccl_new(&n, 0, 2, a->ep, a->device, 3000);
    ps_nccl_destroy(&n);
    return rc < 0 ? -rc : 99;
}

/* A fake rank 1 (plain ZeroMQ, no CUDA): one request; returns the status
 * rank 0 answered, or 1000 + reason for a missing / malformed reply. */
static int fake_request(const char *ep, uint32_t rank, uint32_t world)
{
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_REQ);
    int zero = 0, t = 10000, st = 1000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &t, sizeof t);
    uint8_t req[16] = {'P', 'S', 'N', '1'}, rep[256];
    memcpy(req + 4, &rank, 4); /* the test machines are little-endian */
    memcpy(req + 8, &world, 4);
    if (zmq_connect(s, ep) == 0 && zmq_send(s, req, sizeof req, 0) == sizeof req) {
        int len = zmq_recv(s, rep, sizeof rep, 0);
        if (len == 144 && !memcmp(rep, "PSN1", 4)) {
            int32_t v;
            memcpy(&v, rep + 4, 4);
            st = v;
        } else {
            st = 1001;
        }
    }
    zmq_close(s);
    zmq_ctx_term(ctx);
    return st;
}

int main(void)
{
    ps_log_level = PS_LOG_WARN;
    if (!ps_nccl_compiled()) tap_skip_all("built without NCCL (no PS_HAVE_NCCL)");
    int ngpu = run_child(count_gpus, NULL, NULL);
    if (ngpu <= 0 || ngpu >= 200) tap_skip_all("no GPU (ps_cuda_device_count() == 0)");
    diag("%d GPU(s)", ngpu);

    int port = 21000 + (int)(getpid() % 20000);
    char ep[4][64];
    for (int i = 0; i < 4; i++) snprintf(ep[i], sizeof ep[i], "tcp://127.0.0.1:%d", port + i);

    /* argument checks: refused before any socket or GPU is touched */
    ps_nccl_t *n = (ps_nccl_t *)&port;
    is_int(ps_nccl_new(&n, 2, 2, ep[0], 0, 1000), PS_EINVAL, "rank >= world refused");
    ok(n == NULL, "*n NULLed on failure");
    is_int(ps_nccl_new(&n, 0, 0, ep[0], 0, 1000), PS_EINVAL, "world 0 refused");
    is_int(ps_nccl_new(&n, 1, 2, NULL, 0, 1000), PS_EINVAL, "NULL endpoint refused");
    is_int(ps_nccl_new(&n, 1, 2, ep[0], 0, 0), PS_EINVAL, "timeout 0 refused");
    is_int(ps_nccl_new(&n, 1, 2, ep[0], -1, 1000), PS_EINVAL, "device -1 refused");
    is_int(ps_nccl_allreduce(NULL, NULL, 0, PS_DT_FP32, NULL), PS_EINVAL, "NULL communicator");
    ps_nccl_destroy(NULL);
    ps_nccl_destroy(&n);

    /* rendezvous failures (the peer side needs no GPU: run it here) */
    double t0 = now_s();
    is_int(ps_nccl_new(&n, 1, 2, ep[0], 0, 300), PS_ETIMEOUT, "peer without rank 0 times out");
    ok(now_s() - t0 < 5, "... within the timeout (%.2f s)", now_s() - t0);
    rank_args_t la = {0, 3, 0, ep[1]};
    t0 = now_s();
    is_int(run_child(lonely_root, &la, NULL), -PS_ETIMEOUT, "rank 0 without peers times out");
    ok(now_s() - t0 < 30, "... and returns (%.2f s)", now_s() - t0);

    /* rank 0's checks on requests, then a peer that vanishes after the id */
    rank_args_t da = {0, 2, 0, ep[2]};
    pid_t pid;
    t0 = now_s();
    if (run_child(deserted_root, &da, &pid) == 0) {
        is_int(fake_request(ep[2], 1, 3), PS_EMISMATCH, "rank 0 refuses a wrong world");
        is_int(fake_request(ep[2], 2, 2), PS_EINVAL, "rank 0 refuses a rank out of range");
        is_int(fake_request(ep[2], 1, 2), 0, "rank 0 hands out the id");
        int st = wait_child(pid);
        ok(st == -PS_ETIMEOUT || st == -PS_ECUDA,
           "rank 0 deserted during NCCL setup fails cleanly (exit %d: %s)", st,
           st < 100 ? ps_strerror(-st) : "killed or wrong");
        ok(now_s() - t0 < 60, "... without hanging (%.2f s)", now_s() - t0);
    } else {
        ok(0, "fork");
    }

    /* the allreduce itself, W = 2 */
    rank_args_t ra[2] = {{0, 2, 0, ep[3]}, {1, 2, ngpu >= 2 ? 1 : 0, ep[3]}};
    pid_t p0, p1;
    int s0 = -1, s1 = -1;
    if (run_child(rank_main, &ra[0], &p0) == 0 && run_child(rank_main, &ra[1], &p1) == 0) {
        s0 = wait_child(p0);
        s1 = wait_child(p1);
    }
    if (ngpu < 2 && (s0 == 77 || s1 == 77)) {
        ok(1, "W=2 allreduce # SKIP NCCL refuses two ranks on one GPU (1 GPU here)");
    } else {
        is_int(s0, 0, "W=2 rank 0: sum and mean exact in fp32/fp16/bf16 (device 0)");
        is_int(s1, 0, "W=2 rank 1: sum and mean exact in fp32/fp16/bf16 (device %d)",
               ra[1].device);
    }

    /* W = 1 always: setup, staging and the mean's division on one GPU */
    rank_args_t one = {0, 1, 0, NULL};
    is_int(run_child(rank_main, &one, NULL), 0, "W=1: allreduce leaves the data (and /1)");
    return tap_done();
}
