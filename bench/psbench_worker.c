/* psbench worker process: one client, the sync training loop's
 * communication alone (pushpull of every partition, all in flight, wait). */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "psbench.h"
#include "worker/models/model_sizes.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_util.h"
#include "ps_partition.h"
#include "worker/client/ps_client.h"

/* Gradient-like content (roughly normal * 1e-3): what LZ4 sees matters, and
 * constant or zero buffers would flatter it. */
static void fill_grad(float *g, size_t n, unsigned seed)
{
    uint64_t x = 0x9E3779B97F4A7C15ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int k = 0; k < 4; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s += (double)(x >> 11) * (1.0 / 9007199254740992.0);
        }
        g[i] = (float)((s - 2.0) * 1.7e-3);
    }
}

int psbench_npsd;
int psbench_psd_pid[64];

/* CPU seconds (user + system) and context switches of process pid so far,
 * from /proc; 0 when it cannot be read. */
static void proc_cpu(int pid, double *cpu, double *csw)
{
    char path[64], line[256];
    *cpu = *csw = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f) {
        char buf[1024];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        /* fields after the ")" of the command name: state is field 3;
         * utime and stime are fields 14 and 15 */
        char *p = strrchr(buf, ')');
        unsigned long long ut = 0, st = 0;
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2)
            *cpu = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    }
    /* context switches are counted per thread */
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/%d/task/%.16s/status", pid, e->d_name);
        if (!(f = fopen(path, "r"))) continue;
        while (fgets(line, sizeof line, f)) {
            unsigned long long v;
            if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
                sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
                *csw += (double)v;
        }
        fclose(f);
    }
    if (d) closedir(d);
}

/* This process's CPU and context switches so far (every thread's). */
void psbench_self_cpu(double *cpu, double *csw)
{
    proc_cpu((int)getpid(), cpu, csw);
}

/* rank 0: the psd processes' CPU and context switches so far, summed. */
static void psd_cpu(double *cpu, double *csw)
{
    *cpu = *csw = 0;
    for (int s = 0; s < psbench_npsd; s++) {
        double c, k;
        proc_cpu(psbench_psd_pid[s], &c, &k);
        *cpu += c, *csw += k;
    }
}

/* --check needs updates large against the wire's rounding of w. */
static double bench_lr(const psbench_cfg_t *cfg)
{
    return cfg->check ? 0.1 : 1e-4;
}

/* Closed form of `steps` sync SGD steps with the same gradient g_r from
 * every rank r: w = w0 - steps * lr * mean_r(g_r).  Returns the worst
 * |pulled - expected| / tolerance, the tolerance covering the wire dtype's
 * rounding of the pulled weights and of every pushed gradient.
 * With error feedback (one worker only: the residuals of other workers are
 * not known here) what reached the server is steps * g - residual, exactly
 * up to fp32 rounding: res is that residual (flat, numel), else NULL. */
static double check_weights(const psbench_cfg_t *cfg, const float *w0, const float *got,
                            size_t numel, int steps, const float *res)
{
    double *mean = calloc(numel, sizeof *mean);
    float *g = malloc(numel * sizeof *g);
    double worst = 1e30, lr = bench_lr(cfg), gmax = 0;
    if (!mean || !g) goto out;
    for (int r = 0; r < cfg->workers; r++) {
        fill_grad(g, numel, 100u + (unsigned)r);
        for (size_t i = 0; i < numel; i++) {
            mean[i] += (double)g[i] / cfg->workers;
            if (fabs(g[i]) > gmax) gmax = fabs(g[i]);
        }
    }
    double rq = cfg->dtype == PS_DT_BF16 ? 1.0 / 256 : cfg->dtype == PS_DT_FP16 ? 1.0 / 2048 : 1e-6;
    if (res) rq = cfg->dtype == PS_DT_FP32 ? 1e-6 : rq; /* pushed values: EF keeps their rounding */
    worst = 0;
    for (size_t i = 0; i < numel; i++) {
        double want = (double)w0[i] - steps * lr * mean[i] + (res ? lr * (double)res[i] : 0);
        double tol = rq * fabs(want) + steps * lr * rq * gmax + 1e-7;
        double e = fabs((double)got[i] - want) / tol;
        if (!(e <= worst)) worst = e; /* NaN counts as the worst */
    }
out:
    free(mean);
    free(g);
    return worst;
}

/* Sleep until the absolute CLOCK_MONOTONIC time `until` (seconds, the
 * psbench_now() clock): deadlines, not durations, so that many short
 * per-partition sleeps do not drift. */
static void sleep_until(double until)
{
    struct timespec ts;
    ts.tv_sec = (time_t)until;
    ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* Init spec JSON for the table's tensors (heap: a model has hundreds). */
static char *spec_json(const psbench_cfg_t *cfg, const ps_partition_table_t *t)
{
    size_t cap = 256 + (size_t)t->ntensors * 160, len = 0;
    char *j = malloc(cap);
    if (!j) return NULL;
    len += (size_t)snprintf(j + len, cap - len, "{\"tensors\":[");
    for (uint32_t i = 0; i < t->ntensors; i++)
        len += (size_t)snprintf(j + len, cap - len, "%s[\"%s\",%zu,0]", i ? "," : "",
                                t->tensors[i].name, t->tensors[i].numel);
    /* ps-lite's benchmark update: w -= lr * sum / N, no momentum */
    snprintf(j + len, cap - len,
             "],\"partition_bytes\":%zu,\"num_servers\":%d,\"num_workers\":%d,"
             "\"optim\":{\"lr\":%g,\"momentum\":0}}",
             cfg->partition_bytes, cfg->servers, cfg->workers, bench_lr(cfg));
    return j;
}

/* One step's pushes.  Without compute emulation, or with overlap off: the
 * forward+backward time first, then every partition in flight (the client
 * sends the lowest id first).  With overlap: the forward (sum of fwd), then
 * backward walks the partitions from the last to the first, each taking
 * 2 fwd[p], and each partition's pushpull goes out as soon as its share
 * ends, as a framework's gradient hook would.  With forward overlap
 * (--overlap fwd) the forward walks the partitions first to last and waits,
 * before each one's share, for that partition's pushpull of the previous
 * step only (rq[p] still set; P3 / ByteScheduler): the first layers compute
 * while the last layers' weights are still on the wire.  *waited = seconds
 * spent in those waits.  Returns the client's error or 0; *compute_end =
 * when the last share ended. */
static int step_push(ps_client_t *c, const psbench_cfg_t *cfg, const ps_partition_table_t *t,
                     uint64_t it, const float *g, float *dst, ps_req_t **rq, const double *fwd,
                     double t0, double *compute_end, double *waited)
{
    double comp = cfg->compute_ms / 1e3;
    int rc = 0;
    *waited = 0;
    if (!cfg->overlap || comp <= 0) {
        if (comp > 0) sleep_until(t0 + comp);
        *compute_end = psbench_now();
        for (uint32_t p = 0; p < t->nparts && rc == 0; p++)
            rc = ps_client_pushpull(c, p, it, g + t->parts[p].offset, dst + t->parts[p].offset, 0,
                                    &rq[p]);
        return rc;
    }
    double at = t0;
    for (uint32_t p = 0; p < t->nparts && rc == 0; p++) {
        if (rq[p]) { /* forward overlap: this layer needs its new weights */
            int pend = 0;
            rc = ps_client_wait_ex(c, rq[p], 0, NULL, &pend);
            if (pend) { /* not here yet: the layer starts when they are */
                double w0 = psbench_now();
                rc = ps_client_wait(c, rq[p], -1, NULL);
                double w1 = psbench_now();
                *waited += w1 - w0;
                if (w1 > at) at = w1;
            } /* else they were in before now: a late wake-up is no reason to
               * shift the schedule (deadlines stay absolute) */
            rq[p] = NULL;
        }
        at += fwd[p];
        sleep_until(at);
    }
    for (uint32_t k = t->nparts; k-- > 0 && rc == 0;) {
        at += 2 * fwd[k];
        sleep_until(at);
        rc = ps_client_pushpull(c, k, it, g + t->parts[k].offset, dst + t->parts[k].offset, 0,
                                &rq[k]);
    }
    *compute_end = psbench_now();
    return rc;
}

/* --pull-credit N: a worker-side scheduler in the manner of ByteScheduler
 * (Peng et al. 2019) over plain PUSH and PULL.  psd answers requests in
 * the order they become ready, so with PUSHPULL the last layers' weights
 * (aggregated first) sit in a server's send queue ahead of the first
 * layers' (pushed last, needed first by the next forward).  Here each
 * partition is PUSHed as its backward ends, and its PULL (min_version =
 * the step's new version) is only requested while fewer than N pulls are
 * outstanding at its server, lowest partition first: what waits is in our
 * own priority queue, and a server never holds more than N of this worker's
 * replies.  Pushes are never held back by pulls, so the sync servers always
 * get every push (no cross-worker deadlock, ps_client.h "Flow control"). */
enum { PT_IDLE = 0, PT_PUSHED, PT_PULLING, PT_DONE };

typedef struct credit_sched {
    ps_client_t *c;
    const ps_partition_table_t *t;
    int credit;           /* pulls outstanding per server at most */
    unsigned char *state; /* (nparts) PT_* of the current step's pull */
    ps_req_t **push, **pull;
    int *out;             /* (nservers) pulls outstanding */
    float *dst;
    uint64_t version;     /* what the step's pulls ask for */
} credit_sched_t;

/* Reap finished pulls (without blocking) and request the pulls the credit
 * allows.  Push acknowledgements are reaped when the partition is pushed
 * again (step_credit) or at the end (credit_drain): polling them here, every
 * millisecond, would only cost CPU the emulation needs.  Returns 0 or the
 * first request's error. */
static int credit_poll(credit_sched_t *k)
{
    const ps_partition_table_t *t = k->t;
    int rc = 0;
    for (uint32_t p = 0; p < t->nparts; p++) {
        int pend = 0, r1;
        if (k->pull[p]) {
            r1 = ps_client_wait_ex(k->c, k->pull[p], 0, NULL, &pend);
            if (!pend) {
                k->pull[p] = NULL;
                k->state[p] = PT_DONE;
                k->out[t->parts[p].server]--;
                if (r1 < 0 && rc == 0) rc = r1;
            }
        }
    }
    for (uint32_t p = 0; p < t->nparts && rc == 0; p++) { /* lowest id first */
        uint32_t s = t->parts[p].server;
        if (k->state[p] != PT_PUSHED || k->out[s] >= k->credit) continue;
        rc = ps_client_pull(k->c, p, k->version, k->dst + t->parts[p].offset, &k->pull[p]);
        if (rc == 0) {
            k->state[p] = PT_PULLING;
            k->out[s]++;
        }
    }
    return rc;
}

/* Sleep until `until`, keeping the pulls flowing (every 1 ms). */
static int credit_sleep_until(credit_sched_t *k, double until)
{
    for (;;) {
        int rc = credit_poll(k);
        double now = psbench_now();
        if (rc < 0 || now >= until) return rc;
        sleep_until(now + 0.001 < until ? now + 0.001 : until);
    }
}

/* Until partition p's pull is back (p pushed this step, or nothing to wait
 * for).  Returns 0 or an error. */
static int credit_wait_part(credit_sched_t *k, uint32_t p)
{
    while (k->state[p] == PT_PUSHED || k->state[p] == PT_PULLING) {
        int rc = credit_poll(k);
        if (rc < 0) return rc;
        if (k->state[p] == PT_DONE) break;
        if (k->pull[p]) { /* block on it a little: it is usually the next */
            int pend = 0, r1 = ps_client_wait_ex(k->c, k->pull[p], 1, NULL, &pend);
            if (!pend) {
                k->pull[p] = NULL;
                k->state[p] = PT_DONE;
                k->out[k->t->parts[p].server]--;
                if (r1 < 0) return r1;
            }
        } else {
            sleep_until(psbench_now() + 0.001);
        }
    }
    return 0;
}

/* One step with the credit scheduler: the forward waits per partition for
 * the previous step's pulls (--overlap fwd) or all are waited for at the
 * step's end (on / off); the backward pushes.  Same timing outputs as
 * step_push. */
static int step_credit(credit_sched_t *k, const psbench_cfg_t *cfg, uint64_t it, const float *g,
                       const double *fwd, double t0, double *compute_end, double *waited)
{
    const ps_partition_table_t *t = k->t;
    double at = t0;
    int rc = 0, fwd_ov = cfg->overlap == PSBENCH_OVERLAP_FWD;
    *waited = 0;
    for (uint32_t p = 0; p < t->nparts && rc == 0; p++) {
        if (fwd_ov && (rc = credit_poll(k)) == 0 &&
            (k->state[p] == PT_PUSHED || k->state[p] == PT_PULLING)) { /* see step_push */
            double w0 = psbench_now();
            rc = credit_wait_part(k, p);
            double w1 = psbench_now();
            *waited += w1 - w0;
            if (w1 > at) at = w1;
        }
        at += fwd[p];
        if (rc == 0) rc = credit_sleep_until(k, at);
    }
    /* every pull of the last step is in (or none was made): a new step */
    for (uint32_t p = 0; p < t->nparts && rc == 0; p++) k->state[p] = PT_IDLE;
    k->version = it + 1;
    if (!cfg->overlap) { /* the whole backward, then every push */
        for (uint32_t q = 0; q < t->nparts; q++) at += 2 * fwd[q];
        if (rc == 0) rc = credit_sleep_until(k, at);
    }
    for (uint32_t q = t->nparts; q-- > 0 && rc == 0;) {
        if (cfg->overlap) {
            at += 2 * fwd[q];
            rc = credit_sleep_until(k, at);
        }
        if (rc == 0 && k->push[q]) { /* last step's ack: in long ago (its pull is) */
            rc = ps_client_wait(k->c, k->push[q], -1, NULL);
            k->push[q] = NULL;
        }
        if (rc == 0) rc = ps_client_push(k->c, q, it, g + t->parts[q].offset, 0, &k->push[q]);
        if (rc == 0) k->state[q] = PT_PUSHED;
    }
    *compute_end = psbench_now();
    if (rc == 0) rc = credit_poll(k);
    if (fwd_ov || rc < 0) return rc;
    double w0 = psbench_now();
    for (uint32_t p = 0; p < t->nparts && rc == 0; p++) rc = credit_wait_part(k, p);
    *waited = psbench_now() - w0;
    return rc;
}

/* Whatever is still outstanding (the last step's pulls, an error's
 * leftovers): every handle waited for once. */
static int credit_drain(credit_sched_t *k)
{
    int rc = 0;
    for (uint32_t p = 0; p < k->t->nparts; p++) {
        int r1 = credit_wait_part(k, p);
        if (r1 < 0 && rc == 0) rc = r1;
        if (r1 < 0) break;
    }
    for (uint32_t p = 0; p < k->t->nparts; p++) {
        ps_req_t **q[2] = {&k->push[p], &k->pull[p]};
        for (int i = 0; i < 2; i++)
            if (*q[i]) {
                int r1 = ps_client_wait(k->c, *q[i], -1, NULL);
                *q[i] = NULL;
                if (r1 < 0 && rc == 0) rc = r1;
            }
    }
    return rc;
}

int psbench_send_result(int fd, const double *times, const double *ctimes, int iters,
                        const psbench_result_t *res)
{
    return ps_write_all(fd, times, (size_t)iters * sizeof *times) < 0 ||
                   ps_write_all(fd, ctimes, (size_t)iters * sizeof *ctimes) < 0 ||
                   ps_write_all(fd, res, sizeof *res) < 0
               ? -1
               : 0;
}

int psbench_worker(const psbench_cfg_t *cfg, int rank, char **endpoints, int fd)
{
    size_t numel = cfg->bytes / sizeof(float);
    ps_tensor_spec_t spec = {"bench.weight", numel, 0};
    psbench_model_t model = {0};
    ps_partition_table_t t = {0};
    ps_client_t *c = NULL;
    float *w = NULL, *g = NULL, *dst = NULL;
    double *fwd = NULL;
    credit_sched_t ks = {0};
    ps_req_t **rq = NULL;
    double *times = NULL, *ctimes = NULL;
    char *json = NULL;
    int rc, status = 1;

    if (cfg->model && psbench_model_build(&model, cfg->model) < 0) return 1;
    rc = cfg->model ? ps_partition_table_build(&t, model.tensors, model.ntensors,
                                               cfg->partition_bytes, (uint32_t)cfg->servers)
                    : ps_partition_table_build(&t, &spec, 1, cfg->partition_bytes,
                                               (uint32_t)cfg->servers);
    if (rc < 0) {
        ps_error("worker %d: partition table: %s", rank, ps_strerror(rc));
        psbench_model_free(&model);
        return 1;
    }
    if (t.total_numel != numel) {
        ps_error("worker %d: model has %zu floats, psbench said %zu", rank, t.total_numel, numel);
        goto out;
    }
    ps_client_opts_t o;
    ps_client_opts_default(&o);
    o.servers = (const char *const *)endpoints;
    o.nservers = cfg->servers;
    o.rank = rank;
    o.num_workers = cfg->workers;
    o.dtype = cfg->dtype;
    o.codec = cfg->codec;
    o.topk_ratio = cfg->topk_ratio;
    o.pull_codec = cfg->pull_codec;
    o.timeout_ms = cfg->timeout_ms;
    /* A loopback benchmark loses nothing: never resend early.  In the
     * emulated cluster a sync step of many workers behind one slow server
     * link takes longer than 30 s, and a resent 100 MB gradient would only
     * add to the queue: wait the whole timeout there. */
    o.retry_ms = cfg->netns ? cfg->timeout_ms : 30000;
    /* Pushes issued one by one during backward (--overlap on) are safe with
     * any window: the client never holds a push back for a reply that
     * depends on another worker (ps_client.h, "Flow control"). */
    o.max_inflight = cfg->max_inflight;
    o.send_queue_bytes = cfg->send_queue_bytes; /* 0: the client's default */
    if ((rc = ps_client_new(&c, &o, &t)) < 0) goto out;
    if ((rc = ps_client_hello(c)) < 0) {
        ps_error("worker %d: hello: %s (%s)", rank, ps_strerror(rc), ps_client_last_error(c));
        goto out;
    }

    w = malloc(numel * sizeof *w);
    g = malloc(numel * sizeof *g);
    dst = malloc(numel * sizeof *dst);
    rq = calloc(t.nparts, sizeof *rq);
    fwd = calloc(t.nparts, sizeof *fwd);
    times = calloc((size_t)cfg->iters, sizeof *times);
    ctimes = calloc((size_t)cfg->iters, sizeof *ctimes);
    if (!w || !g || !dst || !rq || !fwd || !times || !ctimes) {
        ps_error("worker %d: out of memory for %zu-byte buffers", rank, cfg->bytes);
        goto out;
    }
    if (psbench_model_schedule(cfg->model, cfg->sched_params, cfg->compute_ms / 1e3, &t, fwd) < 0)
        goto out;
    fill_grad(w, numel, 1);
    fill_grad(g, numel, 100u + (unsigned)rank);
    memset(dst, 0, numel * sizeof *dst); /* fault the pages in before timing */

    if (rank == 0) {
        if (!(json = spec_json(cfg, &t))) {
            ps_error("worker 0: out of memory for the init spec");
            goto out;
        }
        int ck = 0;
        if ((rc = ps_client_init(c, json, w, &ck)) < 0) {
            ps_error("worker 0: init: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
            goto out;
        }
    }
    if ((rc = ps_client_barrier(c)) < 0) {
        ps_error("worker %d: barrier: %s (%s)", rank, ps_strerror(rc), ps_client_last_error(c));
        goto out;
    }
    for (uint32_t p = 0; p < t.nparts && rc == 0; p++)
        rc = ps_client_pull(c, p, 0, dst + t.parts[p].offset, &rq[p]);
    for (uint32_t p = 0; p < t.nparts; p++)
        if (rq[p]) {
            int r1 = ps_client_wait(c, rq[p], -1, NULL);
            if (r1 < 0 && rc == 0) rc = r1;
        }
    if (rc < 0) {
        ps_error("worker %d: initial pull: %s (%s)", rank, ps_strerror(rc), ps_client_last_error(c));
        goto out;
    }

    /* With forward overlap a step's pulls end inside the next step's
     * forward, so a step is timed from one backward's end to the next (the
     * period of the pipeline) and its compute is that period less the
     * forward's waits; the last step's pulls are waited for after the loop. */
    int fwd_ov = cfg->overlap == PSBENCH_OVERLAP_FWD && cfg->compute_ms > 0;
    /* Wire bytes: every step moves the same, so they are counted over all
     * steps, warmup included (with forward overlap a step's pushes may
     * still be queued when the next one starts). */
    ps_client_counters_t k0, k1;
    double prev_end = psbench_now();
    int nsteps = cfg->warmup + cfg->iters;
    ks.c = c;
    ks.t = &t;
    ks.credit = cfg->pull_credit;
    ks.dst = dst;
    if (cfg->pull_credit > 0) {
        ks.state = calloc(t.nparts, 1);
        ks.push = calloc(t.nparts, sizeof *ks.push);
        ks.pull = calloc(t.nparts, sizeof *ks.pull);
        ks.out = calloc((size_t)cfg->servers, sizeof *ks.out);
        if (!ks.state || !ks.push || !ks.pull || !ks.out) {
            ps_error("worker %d: out of memory for the pull scheduler", rank);
            goto out;
        }
    }
    memset(rq, 0, t.nparts * sizeof *rq);
    ps_client_counters(c, &k0);
    double cpu0 = 0, csw0 = 0, pcpu0 = 0, pcsw0 = 0, cpu1, csw1, pcpu1 = 0, pcsw1 = 0;
    for (int it = 0; it < nsteps; it++) {
        if (it == cfg->warmup) {
            psbench_self_cpu(&cpu0, &csw0);
            if (rank == 0) psd_cpu(&pcpu0, &pcsw0);
        }
        double t0 = psbench_now(), tc = t0, waited = 0;
        if (!fwd_ov) memset(rq, 0, t.nparts * sizeof *rq);
        if (cfg->pull_credit > 0)
            rc = step_credit(&ks, cfg, (uint64_t)it, g, fwd, t0, &tc, &waited);
        else
            rc = step_push(c, cfg, &t, (uint64_t)it, g, dst, rq, fwd, t0, &tc, &waited);
        for (uint32_t p = 0; p < t.nparts && !(fwd_ov && rc == 0); p++)
            if (rq[p]) {
                int r1 = ps_client_wait(c, rq[p], -1, NULL);
                rq[p] = NULL;
                if (r1 < 0 && rc == 0) rc = r1;
            }
        if (rc < 0) {
            ps_error("worker %d: step %d: %s (%s)", rank, it, ps_strerror(rc),
                     ps_client_last_error(c));
            if (cfg->pull_credit > 0) credit_drain(&ks);
            goto out;
        }
        double end = psbench_now();
        if (it >= cfg->warmup) {
            times[it - cfg->warmup] = fwd_ov ? tc - prev_end : end - t0;
            ctimes[it - cfg->warmup] = fwd_ov ? tc - prev_end - waited : tc - t0;
        }
        prev_end = fwd_ov ? tc : end;
    }
    if (cfg->pull_credit > 0) {
        int r1 = credit_drain(&ks);
        if (r1 < 0 && rc == 0) rc = r1;
    }
    for (uint32_t p = 0; p < t.nparts; p++) /* forward overlap: the last pulls */
        if (rq[p]) {
            int r1 = ps_client_wait(c, rq[p], -1, NULL);
            rq[p] = NULL;
            if (r1 < 0 && rc == 0) rc = r1;
        }
    if (rc < 0) {
        ps_error("worker %d: last pulls: %s (%s)", rank, ps_strerror(rc), ps_client_last_error(c));
        goto out;
    }
    psbench_self_cpu(&cpu1, &csw1);
    if (rank == 0) psd_cpu(&pcpu1, &pcsw1);
    ps_client_counters(c, &k1);
    psbench_result_t res = {(double)(k1.bytes_out - k0.bytes_out) / nsteps,
                            (double)(k1.bytes_in - k0.bytes_in) / nsteps, 0, 0,
                            cpu1 - cpu0, csw1 - csw0, pcpu1 - pcpu0, pcsw1 - pcsw0};
    int lossy = cfg->codec == PS_CODEC_TOPK || cfg->codec == PS_CODEC_SIGN;
    if (cfg->check && lossy && cfg->workers > 1) {
        res.check_skipped = 1;
    } else if (cfg->check) {
        float *flat_res = NULL;
        if (lossy && (flat_res = malloc(numel * sizeof *flat_res)) != NULL)
            for (uint32_t p = 0; p < t.nparts; p++)
                memcpy(flat_res + t.parts[p].offset, ps_client_ef_residual(c, p),
                       t.parts[p].numel * sizeof(float));
        res.check_err = lossy && !flat_res ? 1e30
                        : check_weights(cfg, w, dst, numel, cfg->warmup + cfg->iters, flat_res);
        free(flat_res);
    }
    if (psbench_send_result(fd, times, ctimes, cfg->iters, &res) < 0) {
        ps_error("worker %d: writing results: %s", rank, strerror(errno));
        goto out;
    }
    status = 0;
out:
    ps_client_destroy(&c);
    ps_partition_table_free(&t);
    psbench_model_free(&model);
    free(json);
    free(ctimes);
    free(w);
    free(g);
    free(dst);
    free(rq);
    free(fwd);
    free(ks.state);
    free(ks.push);
    free(ks.pull);
    free(ks.out);
    free(times);
    return status;
}
