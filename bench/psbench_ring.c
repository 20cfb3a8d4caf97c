/* psbench --mode ring: the worker body for ring allreduce (worker/comm/ps_ring.h),
 * with the same layouts (--bytes or --model), compute emulation and result
 * record as the parameter-server worker (psbench_worker.c), so the two modes
 * are measured by one driver with one definition of a step.
 *
 * A step: emulated forward + backward (a sleep), then the mean gradient of
 * every partition over the ring.  Overlap off: one allreduce of the whole
 * gradient after the compute.  Overlap on: a communication thread reduces
 * buckets of partitions (about BUCKET_BYTES of fp32 each, built from the
 * last partition backwards, as PyTorch DDP / Horovod fuse gradients) as
 * soon as the emulated backward has produced all of a bucket's partitions;
 * the compute side follows psbench_worker.c's schedule exactly (forward
 * 1/3, backward 2/3 shared by size, last partition first).
 * Top-k / sign / lz4 are not ring codecs (ps_ring.h): such a configuration
 * is refused by the driver before any process starts. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker/models/model_sizes.h"
#include "ps_error.h"
#include "ps_log.h"
#include "psbench.h"
#include "worker/comm/ps_ring.h"

#define BUCKET_BYTES (25u << 20) /* DDP's default bucket_cap_mb */

typedef struct bucket {
    uint32_t first_part; /* lowest partition id in the bucket */
    size_t off, numel;
} bucket_t;

typedef struct comm {
    ps_ring_t *ring;
    float *g;
    ps_dtype_t dt;
    const bucket_t *b;
    int nb;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t ready_from; /* partitions >= ready_from have their gradient */
    int go, quit, done_steps, err;
    pthread_t th;
} comm_t;

static void sleep_until(double until)
{
    for (;;) {
        double left = until - psbench_now();
        if (left <= 0) return;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* One step of the communication thread: bucket k (from the back) starts
 * once every partition in it is ready. */
static void *comm_main(void *arg)
{
    comm_t *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->go && !c->quit) pthread_cond_wait(&c->cv, &c->mu);
        if (c->quit) break;
        c->go = 0;
        for (int k = 0; k < c->nb && !c->err; k++) {
            while (c->ready_from > c->b[k].first_part) pthread_cond_wait(&c->cv, &c->mu);
            pthread_mutex_unlock(&c->mu);
            int rc = ps_ring_allreduce_mean(c->ring, c->g + c->b[k].off, c->b[k].numel, c->dt);
            pthread_mutex_lock(&c->mu);
            if (rc) c->err = rc;
        }
        c->done_steps++;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int psbench_ring_worker(const psbench_cfg_t *cfg, int rank, char **endpoints, int fd)
{
    size_t numel = cfg->bytes / sizeof(float);
    ps_tensor_spec_t spec = {"bench.weight", numel, 0};
    psbench_model_t model = {0};
    ps_partition_table_t t = {0};
    bucket_t *bk = NULL;
    float *g = NULL;
    double *times = NULL, *ctimes = NULL, *fwd = NULL;
    comm_t cm;
    int rc, status = 1, nb = 0, thread = 0;

    memset(&cm, 0, sizeof cm);
    if (cfg->model && psbench_model_build(&model, cfg->model) < 0) return 1;
    rc = cfg->model ? ps_partition_table_build(&t, model.tensors, model.ntensors,
                                               cfg->partition_bytes, 1)
                    : ps_partition_table_build(&t, &spec, 1, cfg->partition_bytes, 1);
    if (rc < 0) {
        ps_error("ring worker %d: partition table: %s", rank, ps_strerror(rc));
        psbench_model_free(&model);
        return 1;
    }
    g = malloc(t.total_numel * sizeof *g);
    bk = calloc(t.nparts, sizeof *bk);
    times = calloc((size_t)cfg->iters, sizeof *times);
    ctimes = calloc((size_t)cfg->iters, sizeof *ctimes);
    fwd = calloc(t.nparts, sizeof *fwd);
    if (!g || !bk || !times || !ctimes || !fwd) {
        ps_error("ring worker %d: out of memory", rank);
        goto out;
    }
    if (psbench_model_schedule(cfg->model, cfg->sched_params, cfg->compute_ms / 1e3, &t, fwd) < 0)
        goto out;
    for (size_t i = 0; i < t.total_numel; i++)
        g[i] = (float)((i * 2654435761u + (unsigned)rank * 40503u) % 2001u) * 1e-6f - 1e-3f;
    /* Buckets from the last partition backwards, each up to BUCKET_BYTES. */
    for (uint32_t k = t.nparts; k-- > 0;) {
        const ps_partition_t *p = &t.parts[k];
        if (nb == 0 || (bk[nb - 1].numel + p->numel) * sizeof(float) > BUCKET_BYTES) nb++;
        bucket_t *b = &bk[nb - 1];
        b->first_part = k;
        b->off = p->offset;
        b->numel += p->numel;
    }
    ps_ring_opts_t ro;
    ps_ring_opts_default(&ro);
    ro.timeout_ms = cfg->timeout_ms;
    if ((rc = ps_ring_new(&cm.ring, rank, cfg->workers, (const char *const *)endpoints, &ro))) {
        ps_error("ring worker %d: ring: %s", rank, ps_strerror(rc));
        goto out;
    }
    cm.g = g;
    cm.dt = cfg->dtype;
    cm.b = bk;
    cm.nb = nb;
    pthread_mutex_init(&cm.mu, NULL);
    pthread_cond_init(&cm.cv, NULL);
    if (pthread_create(&cm.th, NULL, comm_main, &cm)) {
        ps_error("ring worker %d: cannot start the communication thread", rank);
        goto out;
    }
    thread = 1;
    uint64_t s0 = 0, r0 = 0, s1, r1;
    double comp = cfg->compute_ms / 1e3, cpu0 = 0, csw0 = 0;
    for (int it = 0; it < cfg->warmup + cfg->iters; it++) {
        if (it == cfg->warmup) {
            ps_ring_bytes(cm.ring, &s0, &r0);
            psbench_self_cpu(&cpu0, &csw0);
        }
        double t0 = psbench_now(), tc;
        pthread_mutex_lock(&cm.mu);
        cm.ready_from = t.nparts; /* nothing computed yet */
        cm.go = 1;
        int target = cm.done_steps + 1;
        pthread_cond_broadcast(&cm.cv);
        pthread_mutex_unlock(&cm.mu);
        if (!cfg->overlap || comp <= 0) {
            if (comp > 0) sleep_until(t0 + comp);
            pthread_mutex_lock(&cm.mu);
            cm.ready_from = 0;
            pthread_cond_broadcast(&cm.cv);
            pthread_mutex_unlock(&cm.mu);
        } else {
            double at = t0;
            for (uint32_t k = 0; k < t.nparts; k++) at += fwd[k]; /* the forward */
            for (uint32_t k = t.nparts; k-- > 0;) {
                at += 2 * fwd[k]; /* same schedule as PS mode (model_sizes.h) */
                sleep_until(at);
                pthread_mutex_lock(&cm.mu);
                cm.ready_from = k;
                pthread_cond_broadcast(&cm.cv);
                pthread_mutex_unlock(&cm.mu);
            }
        }
        tc = psbench_now();
        pthread_mutex_lock(&cm.mu);
        while (cm.done_steps < target) pthread_cond_wait(&cm.cv, &cm.mu);
        rc = cm.err;
        pthread_mutex_unlock(&cm.mu);
        if (rc) {
            ps_error("ring worker %d: step %d: %s", rank, it, ps_strerror(rc));
            goto out;
        }
        if (it >= cfg->warmup) {
            times[it - cfg->warmup] = psbench_now() - t0;
            ctimes[it - cfg->warmup] = tc - t0;
        }
    }
    ps_ring_bytes(cm.ring, &s1, &r1);
    double cpu1, csw1;
    psbench_self_cpu(&cpu1, &csw1);
    psbench_result_t res = {(double)(s1 - s0) / cfg->iters, (double)(r1 - r0) / cfg->iters, 0, 0,
                            cpu1 - cpu0, csw1 - csw0, 0, 0};
    if (psbench_send_result(fd, times, ctimes, cfg->iters, &res) < 0) {
        ps_error("ring worker %d: writing results: %s", rank, strerror(errno));
        goto out;
    }
    status = 0;
out:
    if (thread) {
        pthread_mutex_lock(&cm.mu);
        cm.quit = 1;
        pthread_cond_broadcast(&cm.cv);
        pthread_mutex_unlock(&cm.mu);
        pthread_join(cm.th, NULL);
    }
    ps_ring_destroy(&cm.ring);
    ps_partition_table_free(&t);
    psbench_model_free(&model);
    free(g);
    free(bk);
    free(fwd);
    free(times);
    free(ctimes);
    return status;
}
