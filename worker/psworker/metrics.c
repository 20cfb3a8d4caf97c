/* psworker's /metrics (--metrics-port): the figures of the steps so far in
 * Prometheus text, beside psd's.  common/ps_http.c serves them on a thread
 * and loop of its own, so a client -- slow, stuck or many -- never holds up
 * training: after each step the training thread copies a few numbers into
 * the snapshot under a mutex, and the HTTP thread renders from a copy taken
 * under the same mutex (both hold it for a struct copy, never for I/O). */
#include "worker/psworker/psworker.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_http.h"
#include "ps_log.h"

#define RECENT 10 /* steps in the samples-per-second gauge */

typedef struct snap {
    uint64_t steps;       /* steps recorded by this process */
    int64_t step;         /* the last one's index (-1: none yet) */
    double loss, lr, loss_scale;
    uint64_t ls_skipped;
    double last[4];       /* the last step: step, data wait, compute, comm wait (s) */
    double sum[4];        /* the same summed over every step */
    uint64_t samples;
    double per_s;         /* samples over the last RECENT steps / their time */
    size_t arena_bytes;
} snap_t;

static const char *const part_names[4] = {"step", "data_wait", "compute", "comm_wait"};

struct ps_worker_metrics {
    pthread_mutex_t mu;
    snap_t s;             /* under mu */
    ps_http_t *http;
    /* set at start, read-only after */
    int rank, nworkers;
    char model[64], mode[16], unit[16];
    /* the training thread's own: the last RECENT steps' times */
    double recent[RECENT];
};

/* Label values are program-made names, but keep the text well-formed. */
static void label_copy(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    for (; src && *src && n + 1 < cap; src++)
        dst[n++] = (*src == '"' || *src == '\\' || *src == '\n') ? '_' : *src;
    dst[n] = 0;
}

static size_t render(void *arg, const ps_http_stats_t *st, char *buf, size_t cap)
{
    ps_worker_metrics_t *m = arg;
    snap_t s;
    pthread_mutex_lock(&m->mu);
    s = m->s;
    pthread_mutex_unlock(&m->mu);
    const ps_http_stats_t hs = *st;
    char r[32];
    snprintf(r, sizeof r, "rank=\"%d\"", m->rank);
    size_t n = 0;
#define P(...) (n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__))
#define GAUGE(name, help, fmt, v) \
    P("# HELP " name " " help "\n# TYPE " name " gauge\n" name "{%s} " fmt "\n", r, v)
#define COUNTER(name, help, fmt, v) \
    P("# HELP " name " " help "\n# TYPE " name " counter\n" name "{%s} " fmt "\n", r, v)
    P("# HELP psworker_info The job this worker runs (value 1).\n# TYPE psworker_info gauge\n"
      "psworker_info{%s,model=\"%s\",mode=\"%s\",unit=\"%s\"} 1\n", r, m->model, m->mode, m->unit);
    GAUGE("psworker_rank", "This worker's rank.", "%d", m->rank);
    GAUGE("psworker_workers", "Workers in the job (W).", "%d", m->nworkers);
    GAUGE("psworker_step", "Index of the last step recorded (-1: none yet; lower after a "
          "rollback).", "%lld", (long long)s.step);
    COUNTER("psworker_steps_total", "Steps this process recorded.", "%llu",
            (unsigned long long)s.steps);
    COUNTER("psworker_samples_total", "Samples (clips, images) this worker computed on.", "%llu",
            (unsigned long long)s.samples);
    GAUGE("psworker_samples_per_second", "This worker's throughput over its last 10 steps "
          "(clips/s for video models, images/s for detectors; psworker_info's unit).", "%.6g",
          s.per_s);
    GAUGE("psworker_loss", "Training loss of the last step (this worker's batch).", "%.9g", s.loss);
    GAUGE("psworker_lr", "Learning rate of the last step.", "%.9g", s.lr);
    GAUGE("psworker_loss_scale", "Loss scale in force (1: no loss scaling).", "%.9g", s.loss_scale);
    COUNTER("psworker_loss_scale_skipped_steps_total", "Steps skipped for a loss-scale overflow "
            "(on any worker).", "%llu", (unsigned long long)s.ls_skipped);
    GAUGE("psworker_arena_bytes", "Bytes of the model arenas (parameters, gradients, "
          "activations) this process holds.", "%zu", s.arena_bytes);
    P("# HELP psworker_last_step_seconds The last step's time: the whole step and its split "
      "(data wait, compute, communication wait).\n# TYPE psworker_last_step_seconds gauge\n");
    for (int i = 0; i < 4; i++)
        P("psworker_last_step_seconds{%s,part=\"%s\"} %.9f\n", r, part_names[i], s.last[i]);
    P("# HELP psworker_step_seconds_total Time in steps, whole and split (data wait, compute, "
      "communication wait); divide its rate by psworker_steps_total's for seconds per step.\n"
      "# TYPE psworker_step_seconds_total counter\n");
    for (int i = 0; i < 4; i++)
        P("psworker_step_seconds_total{%s,part=\"%s\"} %.9f\n", r, part_names[i], s.sum[i]);
    GAUGE("psworker_http_connections", "Open connections to this /metrics listener.", "%d",
          hs.connections);
    COUNTER("psworker_http_timeouts_total", "/metrics connections closed for not completing "
            "their request in time.", "%llu", (unsigned long long)hs.timeouts);
    COUNTER("psworker_http_rejected_total", "/metrics connections closed at accept (too many "
            "open).", "%llu", (unsigned long long)hs.rejected);
#undef COUNTER
#undef GAUGE
#undef P
    return n;
}

int ps_worker_metrics_start(ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    if (o->metrics_port <= 0 || p->mx) return 0;
    ps_worker_metrics_t *m = calloc(1, sizeof *m);
    if (!m) return PS_ENOMEM;
    pthread_mutex_init(&m->mu, NULL);
    m->rank = p->rank;
    m->nworkers = p->nworkers;
    label_copy(m->model, sizeof m->model, o->model);
    label_copy(m->mode, sizeof m->mode, o->standalone ? "standalone" : o->mode);
    label_copy(m->unit, sizeof m->unit, p->task->unit ? p->task->unit : "samples");
    m->s.step = -1;
    m->s.loss_scale = 1;
    m->s.arena_bytes = ps_arena_bytes();
    int rc = ps_http_thread_start(&m->http, o->metrics_bind, o->metrics_port, render, m);
    if (rc) {
        pthread_mutex_destroy(&m->mu);
        free(m);
        return rc;
    }
    p->mx = m;
    return 0;
}

void ps_worker_metrics_step(ps_worker_t *p, uint64_t step, double loss, float lr,
                            const double t[4])
{
    ps_worker_metrics_t *m = p->mx;
    if (!m) return;
    snap_t *s = &m->s;
    /* the window is the training thread's own; only the result goes under mu */
    uint64_t k = s->steps; /* s->steps is written by this thread only */
    m->recent[k % RECENT] = t[0];
    double tw = 0;
    uint64_t nw = k + 1 < RECENT ? k + 1 : RECENT;
    for (uint64_t i = 0; i < nw; i++) tw += m->recent[i];
    double per_s = tw > 0 ? (double)p->batch * (double)nw / tw : 0;
    float scale = p->o->prec.ls_on ? ps_loss_scale_get(&p->ls) : 1.0f;
    size_t arena = ps_arena_bytes();
    pthread_mutex_lock(&m->mu);
    s->steps++;
    s->step = (int64_t)step;
    s->loss = loss;
    s->lr = lr;
    s->loss_scale = scale;
    s->ls_skipped = p->ls.skipped;
    for (int i = 0; i < 4; i++) {
        s->last[i] = t[i];
        s->sum[i] += t[i];
    }
    s->samples += (uint64_t)p->batch;
    s->per_s = per_s;
    s->arena_bytes = arena;
    pthread_mutex_unlock(&m->mu);
}

void ps_worker_metrics_stop(ps_worker_t *p)
{
    ps_worker_metrics_t *m = p->mx;
    if (!m) return;
    p->mx = NULL;
    ps_http_thread_stop(&m->http);
    pthread_mutex_destroy(&m->mu);
    free(m);
}
