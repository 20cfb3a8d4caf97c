/* --overlap: per-layer gradient hand-off and per-layer weight waits in the
 * cluster loop (P3 / ByteScheduler style).
 *
 * Without it a step is forward, the whole backward, PUSHPULL of every
 * partition, wait for all of them, next forward.  The task hands over the
 * model's tables and hooks (ps_task_t.hooks -> ps_model_hookable_t): a
 * video model's, or a detector's (its backbone's groups, then the FPN and
 * heads').  With it:
 *  - backward: the model's grad_ready hook (ps_model_set_hooks) fires after
 *    each layer group's backward; a partition whose tensors are all final
 *    is PUSHPULLed at once while backward goes on.  On the CPU backend the
 *    gradient is final when the hook runs, so the training thread pushes
 *    (the client's I/O thread does the sending).  On the CUDA backend the
 *    hook only follows the enqueueing: it records the partition's event and
 *    hands the partition to a communication thread, which waits for the
 *    event, copies the gradient out and pushes;
 *  - next forward: the weights_needed hook waits, before a layer group is
 *    queued, for exactly the partitions holding its parameters and its BNs'
 *    running statistics, runs every check of a cluster step on each reply
 *    (ps_worker_part_complete: versions, OVERFLOW verdict, ROLLBACK, stale
 *    re-pull) and copies the new weights into p->w and the model.  The
 *    client sends front-of-model partitions first, so the first layers'
 *    weights arrive first while the late, big ones are still in flight.
 *
 * Buffers: replies land in wnext (not p->w, which the compute code copies
 * into the model at the start of a step while replies may still arrive),
 * gradients go out of gsend (the compute code rewrites p->grad after
 * backward, while the I/O thread may still read a zero-copy send).
 *
 * Ordering rules that keep a step's semantics those of the plain loop:
 *  - no gradient of step s leaves before every reply of step s-1 has been
 *    checked: the first grad_ready of a step completes whatever is still in
 *    flight (a partition no layer read, e.g.); so a rollback or an error
 *    seen in those replies stops the step before any push (no gradient of
 *    mixed weights reaches a server);
 *  - a partition whose gradient holds Inf/NaN is not pushed: the step fails
 *    with PS_ENONFINITE (the loss check runs only after backward, when
 *    early partitions are already out);
 *  - BN running statistics (the AVERAGE partitions) go out after compute:
 *    their "gradient" w_pulled - local needs the whole forward, and on the
 *    CUDA backend the host may read it only after the final sync;
 *  - before anything that needs every weight (validation, rollback, save,
 *    the end) the loop calls ps_worker_overlap_wait_all.
 *
 * Not with loss scaling: psd skips an overflowed update per partition
 * (server/psd_handlers.c push_sync: p->overflow is per partition), so a
 * worker that found Inf in a late partition after its early partitions
 * were pushed clean would make the servers apply part of a skipped step.
 * The whole-step verdict is only known after the whole backward, so with
 * --loss-scale on the hand-off is off (logged; docs/cuda.md). */
#include "worker/psworker/psworker.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/engine/ps_engine.h"
#include "worker/models/ps_model.h"
#include "worker/client/ps_client.h"

typedef struct ovl_tensor {
    float *w;       /* the model's copy (parameter or running statistic) */
    const float *g; /* the model's gradient; NULL for a running statistic */
    uint32_t p0, p1;/* partitions it spans, inclusive */
} ovl_tensor_t;

struct ps_worker_overlap {
    ps_worker_t *p;
    ps_client_t *c;
    ps_req_t **req;
    uint64_t *ver;
    ps_model_hookable_t m;   /* the model's tables and hooks */
    int hooked;              /* m.set_hooks installed ours */
    const ps_backend_t *be;  /* the model's backend and context */
    ps_ctx_t *ctx;
    int async;               /* be->async: hand gradients to the communication thread */
    int sync;
    uint64_t step;           /* the step being computed */
    float *wnext;            /* (numel) replies land here */
    float *gsend;            /* (numel) gradients handed to the client */
    ovl_tensor_t *t;         /* (ntensors) table tensor -> model */
    int *tens_of;            /* (nparams of the model) -> table tensor or -1 (frozen) */
    int (*stats_of)[2];      /* (nparams) BN weight -> its running mean / var tensors */
    uint32_t *segs0;         /* (nparts+1) first segment of each partition */
    ps_partition_segment_t *segs;
    uint32_t *npend0;        /* (nparts) tensors to become final before a push */
    uint32_t *npend;
    uint64_t *req_step;      /* (nparts) step of the request in flight */
    uint8_t *inflight;       /* (nparts) reply not yet checked */
    uint8_t *pushed;         /* (nparts) pushed this step */
    int grads_started;       /* this step's first grad_ready ran */
    int failed;              /* this step pushes nothing more (error / rollback) */
    int rc;                  /* first error */
    int remote_ovf;          /* an OVERFLOW verdict seen */
    double t_wait;           /* seconds blocked on replies this step */
    /* over the run, logged at the end (tests read it) */
    uint64_t n_push, n_early;  /* pushes; of which handed off by grad_ready */
    uint64_t n_done, n_fwd;    /* replies checked; of which by weights_needed */
    int in_fwd;                /* inside weights_needed */
    int in_end;                /* inside ps_worker_overlap_end: not "early" */
    /* CUDA: the communication thread and its queue of partitions */
    pthread_t thr;
    int thr_on, stop, busy, mu_on;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t *q;             /* (nparts) ring */
    uint32_t qhead, qlen;
};

/* ---- completing requests ---------------------------------------------------- */

/* Partition i's weights from wnext into p->w and the model. */
static void install(ps_worker_overlap_t *ov, uint32_t i)
{
    const ps_partition_t *pt = &ov->p->table.parts[i];
    memcpy(ov->p->w + pt->offset, ov->wnext + pt->offset, pt->numel * sizeof(float));
    const ps_partition_table_t *tb = &ov->p->table;
    for (uint32_t k = ov->segs0[i]; k < ov->segs0[i + 1]; k++) {
        const ps_partition_segment_t *sg = &ov->segs[k];
        size_t in_t = pt->offset + sg->part_offset - tb->tensor_offset[sg->tensor];
        memcpy(ov->t[sg->tensor].w + in_t, ov->wnext + pt->offset + sg->part_offset,
               sg->numel * sizeof(float));
    }
}

/* Wait for partition i's reply if one is in flight; on success its weights
 * go into p->w and (model_too) the model. */
static void complete(ps_worker_overlap_t *ov, uint32_t i, int model_too)
{
    if (!ov->inflight[i])
        return;
    ps_worker_t *p = ov->p;
    double t0 = ps_worker_now();
    int r = ps_worker_part_complete(p, ov->c, ov->req, ov->ver, i,
                                    ov->wnext + p->table.parts[i].offset, ov->req_step[i],
                                    ov->sync, &ov->remote_ovf, &ov->rc);
    ov->t_wait += ps_worker_now() - t0;
    ov->inflight[i] = 0;
    ov->n_done++;
    ov->n_fwd += ov->in_fwd;
    if (r || ov->rc || p->rollback || p->behind || p->rebuild || p->resync) {
        ov->failed = 1; /* the step ends without another push */
        return;
    }
    if (model_too)
        install(ov, i);
    else
        memcpy(p->w + p->table.parts[i].offset, ov->wnext + p->table.parts[i].offset,
               p->table.parts[i].numel * sizeof(float));
}

static void complete_tensor(ps_worker_overlap_t *ov, int j)
{
    if (j < 0) return;
    for (uint32_t i = ov->t[j].p0; i <= ov->t[j].p1; i++) complete(ov, i, 1);
}

static void on_weights_needed(void *ctx, int first, int n)
{
    ps_worker_overlap_t *ov = ctx;
    ov->in_fwd = 1;
    for (int k = first; k < first + n; k++) {
        complete_tensor(ov, ov->tens_of[k]);
        complete_tensor(ov, ov->stats_of[k][0]);
        complete_tensor(ov, ov->stats_of[k][1]);
    }
    ov->in_fwd = 0;
}

/* ---- pushing ---------------------------------------------------------------- */

/* Gradient of partition i into gsend (the statistics' part is already
 * there), checked, then PUSHPULL.  Runs on the training thread (CPU) or the
 * communication thread (CUDA; the event has fired). */
static void push_now(ps_worker_overlap_t *ov, uint32_t i)
{
    ps_worker_t *p = ov->p;
    const ps_partition_t *pt = &p->table.parts[i];
    for (uint32_t k = ov->segs0[i]; k < ov->segs0[i + 1]; k++) {
        const ps_partition_segment_t *sg = &ov->segs[k];
        const ovl_tensor_t *t = &ov->t[sg->tensor];
        if (!t->g) continue;
        size_t in_t = pt->offset + sg->part_offset - p->table.tensor_offset[sg->tensor];
        memcpy(ov->gsend + pt->offset + sg->part_offset, t->g + in_t, sg->numel * sizeof(float));
    }
    if (ps_loss_scale_has_overflow(ov->gsend + pt->offset, pt->numel)) {
        ps_error("step %llu: the gradient of partition %u is not finite: not pushed (diverged: "
                 "try a lower --lr)", (unsigned long long)ov->step, i);
        ov->rc = ov->rc ? ov->rc : PS_ENONFINITE;
        ov->failed = 1;
        return;
    }
    int r = ps_client_pushpull(ov->c, i, ov->sync ? ov->step : ov->ver[i], ov->gsend + pt->offset,
                               ov->wnext + pt->offset, 0, &ov->req[i]);
    if (r) {
        ps_error("pushpull of partition %u at step %llu: %s", i, (unsigned long long)ov->step,
                 ps_strerror(r));
        ov->rc = ov->rc ? ov->rc : r;
        ov->failed = 1;
        return;
    }
    ov->req_step[i] = ov->step;
    ov->inflight[i] = 1;
    ov->n_push++;
}

/* The communication thread (asynchronous backends only: on the CPU the
 * training thread pushes, the gradient being final when the hook runs). */
static void *comm_main(void *arg)
{
    ps_worker_overlap_t *ov = arg;
    pthread_mutex_lock(&ov->mu);
    for (;;) {
        while (!ov->qlen && !ov->stop) pthread_cond_wait(&ov->cv, &ov->mu);
        if (!ov->qlen) break; /* stop */
        uint32_t i = ov->q[ov->qhead];
        ov->qhead = (ov->qhead + 1) % ov->p->table.nparts;
        ov->qlen--;
        ov->busy = 1;
        pthread_mutex_unlock(&ov->mu);
        int r = ov->be->event_wait(ov->ctx, (int)i);
        if (r) {
            ps_error("partition %u: waiting for its gradient event failed: %s", i, ps_strerror(r));
            ov->rc = ov->rc ? ov->rc : r;
            ov->failed = 1;
        }
        if (!ov->failed) push_now(ov, i);
        pthread_mutex_lock(&ov->mu);
        ov->busy = 0;
        pthread_cond_broadcast(&ov->cv);
    }
    pthread_mutex_unlock(&ov->mu);
    return NULL;
}

/* Wait until the communication thread has pushed everything queued: after
 * that the training thread may use the client again. */
static void drain(ps_worker_overlap_t *ov)
{
    if (!ov->thr_on) return;
    pthread_mutex_lock(&ov->mu);
    while (ov->qlen || ov->busy) pthread_cond_wait(&ov->cv, &ov->mu);
    pthread_mutex_unlock(&ov->mu);
}

/* Partition i's gradient is complete (queued, on CUDA). */
static void hand_off(ps_worker_overlap_t *ov, uint32_t i)
{
    ov->pushed[i] = 1;
    if (ov->failed) return;
    ov->n_early += !ov->in_end;
    if (!ov->thr_on) {
        push_now(ov, i);
        return;
    }
    int r = ov->be->event_record(ov->ctx, (int)i);
    if (r) {
        ps_error("partition %u: recording its gradient event failed: %s", i, ps_strerror(r));
        ov->rc = ov->rc ? ov->rc : r;
        ov->failed = 1;
        return;
    }
    pthread_mutex_lock(&ov->mu);
    ov->q[(ov->qhead + ov->qlen) % ov->p->table.nparts] = i;
    ov->qlen++;
    pthread_cond_broadcast(&ov->cv);
    pthread_mutex_unlock(&ov->mu);
}

static void tensor_final(ps_worker_overlap_t *ov, int j)
{
    if (j < 0) return;
    for (uint32_t i = ov->t[j].p0; i <= ov->t[j].p1; i++)
        if (ov->npend[i] && --ov->npend[i] == 0 && !ov->pushed[i]) hand_off(ov, i);
}

static void on_grad_ready(void *ctx, int first, int n)
{
    ps_worker_overlap_t *ov = ctx;
    if (!ov->grads_started) {
        /* Forward is over: every reply of the previous step is checked
         * before the first gradient of this one leaves. */
        ov->grads_started = 1;
        for (uint32_t i = 0; i < ov->p->table.nparts; i++) complete(ov, i, 0);
    }
    for (int k = first; k < first + n; k++) tensor_final(ov, ov->tens_of[k]);
}

/* ---- the loop's interface --------------------------------------------------- */

void ps_worker_overlap_begin(ps_worker_overlap_t *ov, uint64_t step)
{
    ov->step = step;
    ov->grads_started = 0;
    ov->t_wait = 0;
    ov->failed = ov->rc != 0;
    memcpy(ov->npend, ov->npend0, ov->p->table.nparts * sizeof *ov->npend);
    memset(ov->pushed, 0, ov->p->table.nparts);
}

int ps_worker_overlap_wait_all(ps_worker_overlap_t *ov, int *remote_ovf)
{
    drain(ov);
    double tw = ov->t_wait;
    for (uint32_t i = 0; i < ov->p->table.nparts; i++) complete(ov, i, 0);
    ov->t_wait = tw; /* the caller times this itself */
    if (remote_ovf) *remote_ovf |= ov->remote_ovf;
    ov->remote_ovf = 0;
    return ov->rc;
}

int ps_worker_overlap_end(ps_worker_overlap_t *ov, double *t_wait)
{
    ps_worker_t *p = ov->p;
    drain(ov);
    if (!ov->grads_started) /* compute stopped before backward */
        on_grad_ready(ov, 0, 0);
    if (ov->failed || p->compute_rc) {
        /* nothing more leaves; what is in flight is checked (its errors
         * reported, a rollback's versions known) */
        ps_worker_overlap_wait_all(ov, NULL);
    } else {
        /* BN statistics: w_pulled - local (task_video.c), then every
         * partition the hooks did not push */
        ov->in_end = 1;
        for (uint32_t j = 0; j < p->table.ntensors; j++) {
            if (ov->t[j].g) continue;
            size_t off = p->table.tensor_offset[j], n = p->table.tensors[j].numel;
            for (size_t k = 0; k < n; k++) ov->gsend[off + k] = p->w[off + k] - ov->t[j].w[k];
            tensor_final(ov, (int)j);
        }
        drain(ov);
        for (uint32_t i = 0; i < p->table.nparts && !ov->failed; i++)
            if (!ov->pushed[i]) {
                ov->pushed[i] = 1;
                push_now(ov, i);
            }
        ov->in_end = 0;
        if (ov->failed) ps_worker_overlap_wait_all(ov, NULL);
    }
    *t_wait = ov->t_wait;
    return ov->rc;
}

static int find_param(const ps_model_hookable_t *m, const char *name)
{
    for (int k = 0; k < m->nparams; k++)
        if (!strcmp(m->params[k].name, name)) return k;
    return -1;
}

static int build_maps(ps_worker_overlap_t *ov)
{
    ps_worker_t *p = ov->p;
    const ps_partition_table_t *tb = &p->table;
    int np = ov->m.nparams, nb = ov->m.nbuffers;
    const ps_model_param_t *par = ov->m.params;
    const ps_model_buffer_t *bu = ov->m.buffers;
    ov->t = calloc(tb->ntensors, sizeof *ov->t);
    ov->tens_of = malloc(sizeof(int) * (size_t)np);
    ov->stats_of = malloc(sizeof *ov->stats_of * (size_t)np);
    ov->segs0 = calloc(tb->nparts + 1, sizeof *ov->segs0);
    if (!ov->t || !ov->tens_of || !ov->stats_of || !ov->segs0) return PS_ENOMEM;
    for (int k = 0; k < np; k++) ov->tens_of[k] = ov->stats_of[k][0] = ov->stats_of[k][1] = -1;
    for (uint32_t j = 0; j < tb->ntensors; j++) {
        const char *name = tb->tensors[j].name;
        int k = find_param(&ov->m, name);
        ovl_tensor_t *t = &ov->t[j];
        if (k >= 0) {
            t->w = par[k].w;
            t->g = par[k].g;
            ov->tens_of[k] = (int)j;
        } else {
            /* a running statistic "<bn>.running_mean|var": its BN's weight
             * hook asks for it */
            for (int b = 0; b < nb && !t->w; b++)
                if (bu[b].f32 && !strcmp(bu[b].name, name)) t->w = bu[b].f32;
            const char *dot = strrchr(name, '.');
            char wname[256];
            snprintf(wname, sizeof wname, "%.*s.weight", dot ? (int)(dot - name) : 0, name);
            int bw = find_param(&ov->m, wname);
            if (!t->w || bw < 0) {
                ps_error("--overlap: tensor %s of the partition table is not in the model", name);
                return PS_EMISMATCH;
            }
            ov->stats_of[bw][ov->stats_of[bw][0] >= 0] = (int)j;
        }
        t->p0 = ps_partition_at(tb, tb->tensor_offset[j]);
        t->p1 = ps_partition_at(tb, tb->tensor_offset[j] + tb->tensors[j].numel - 1);
    }
    uint32_t total = 0;
    for (uint32_t i = 0; i < tb->nparts; i++) total += ps_partition_segments(tb, i, NULL, 0);
    ov->segs = malloc(sizeof *ov->segs * (total ? total : 1));
    ov->npend0 = calloc(tb->nparts, sizeof *ov->npend0);
    if (!ov->segs || !ov->npend0) return PS_ENOMEM;
    for (uint32_t i = 0; i < tb->nparts; i++) {
        uint32_t n = ps_partition_segments(tb, i, ov->segs + ov->segs0[i], total - ov->segs0[i]);
        ov->segs0[i + 1] = ov->segs0[i] + n;
        ov->npend0[i] = n; /* one segment per tensor in the partition */
    }
    return 0;
}

int ps_worker_overlap_new(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver,
                          int sync, ps_worker_overlap_t **out)
{
    const ps_worker_opts_t *o = p->o;
    int asked = !strcmp(o->overlap, "on");
    *out = NULL;
    if (!strcmp(o->overlap, "off"))
        return 0;
    ps_model_hookable_t m;
    const char *why = NULL;
    if (!p->task->hooks || !p->task->hooks(p, &m, &why)) {
        if (why)
            ps_info("--overlap off: %s", why);
        else if (asked)
            ps_info("--overlap: %s has no per-layer hooks: pushes after the whole backward",
                    o->model);
        return 0;
    }
    if (o->prec.ls_on) {
        ps_info("--overlap off: loss scaling is on, and servers skip an overflowed update per "
                "partition, so early pushes could apply part of a skipped step "
                "(docs/cuda.md)");
        return 0;
    }
    /* An asynchronous backend records an event per partition after its last
     * gradient; the host then reads the gradient (after its event) and
     * writes the next layers' weights while kernels run, which the backend
     * refuses (PS_EUNSUPPORTED, logged) where the device cannot share
     * memory with the host concurrently. */
    uint32_t np = p->table.nparts;
    int async = p->be && p->be->async;
    if (async) {
        int rc = p->be->events(p->ctx, (int)np);
        if (rc == PS_EUNSUPPORTED) {
            ps_info("--overlap off: the device cannot hand gradients to the host during backward");
            return 0;
        }
        if (rc) {
            ps_error("--overlap: cannot create %u device events: %s", np, ps_strerror(rc));
            return rc;
        }
    }
    ps_worker_overlap_t *ov = calloc(1, sizeof *ov);
    if (!ov) {
        if (async) p->be->events(p->ctx, 0);
        return PS_ENOMEM;
    }
    ov->p = p;
    ov->c = c;
    ov->req = req;
    ov->ver = ver;
    ov->m = m;
    ov->be = p->be;
    ov->ctx = p->ctx;
    ov->async = async;
    ov->sync = sync;
    ov->wnext = malloc(p->numel * sizeof(float));
    ov->gsend = malloc(p->numel * sizeof(float));
    ov->npend = calloc(np, sizeof *ov->npend);
    ov->req_step = calloc(np, sizeof *ov->req_step);
    ov->inflight = calloc(np, 1);
    ov->pushed = calloc(np, 1);
    ov->q = calloc(np, sizeof *ov->q);
    int rc = PS_ENOMEM;
    if (!ov->wnext || !ov->gsend || !ov->npend || !ov->req_step || !ov->inflight || !ov->pushed ||
        !ov->q || (rc = build_maps(ov))) {
        if (rc == PS_ENOMEM) ps_error("--overlap: out of memory");
        ps_worker_overlap_free(&ov);
        return rc;
    }
    pthread_mutex_init(&ov->mu, NULL);
    pthread_cond_init(&ov->cv, NULL);
    ov->mu_on = 1;
    if (async) {
        if ((rc = pthread_create(&ov->thr, NULL, comm_main, ov))) {
            ps_error("--overlap: pthread_create: %s", strerror(rc));
            ps_worker_overlap_free(&ov);
            return PS_ENOMEM;
        }
        ov->thr_on = 1;
    }
    m.set_hooks(m.model, on_grad_ready, on_weights_needed, ov);
    ov->hooked = 1;
    ps_info("--overlap on: each partition is pushed when its layers' backward is done%s; the "
            "next forward waits layer by layer for the partitions it reads",
            async ? " (device events, communication thread)" : "");
    *out = ov;
    return 0;
}

void ps_worker_overlap_free(ps_worker_overlap_t **ovp)
{
    ps_worker_overlap_t *ov = *ovp;
    if (!ov) return;
    if (ov->n_push)
        ps_info("--overlap: %llu of %llu partition pushes handed off during backward, %llu of "
                "%llu replies awaited by the next forward's layers",
                (unsigned long long)ov->n_early, (unsigned long long)ov->n_push,
                (unsigned long long)ov->n_fwd, (unsigned long long)ov->n_done);
    if (ov->hooked) ov->m.set_hooks(ov->m.model, NULL, NULL, NULL);
    if (ov->thr_on) {
        pthread_mutex_lock(&ov->mu);
        ov->stop = 1;
        pthread_cond_broadcast(&ov->cv);
        pthread_mutex_unlock(&ov->mu);
        pthread_join(ov->thr, NULL);
    }
    if (ov->async) ov->be->events(ov->ctx, 0);
    if (ov->mu_on) {
        pthread_mutex_destroy(&ov->mu);
        pthread_cond_destroy(&ov->cv);
    }
    free(ov->wnext), free(ov->gsend), free(ov->t), free(ov->tens_of), free(ov->stats_of);
    free(ov->segs0), free(ov->segs), free(ov->npend0), free(ov->npend), free(ov->req_step);
    free(ov->inflight), free(ov->pushed), free(ov->q);
    free(ov);
    *ovp = NULL;
}
