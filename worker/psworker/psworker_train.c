/* psworker's training loops.
 *
 * Cluster (sync) step: compute this rank's mean gradient, PUSHPULL every
 * partition (all in flight together, issued in partition order so the
 * client's front-of-model priority matches), wait for all, which also
 * brings back the weights of the next version.  The iteration sent with a
 * partition's gradient is the version of the weights it was computed from;
 * in sync mode that is the step number, in async / bounded-staleness modes
 * the server uses it to measure staleness.  With --overlap
 * (psworker_overlap.c) the pushes leave from the model's backward hooks and
 * the replies are checked, by the same ps_worker_part_complete, from the
 * next forward's hooks.
 *
 * Standalone step: the same gradient over the whole global batch, then the
 * same ps_optim_apply_partition the servers run, partition by partition.
 *
 * Loss scaling (--loss-scale, contract in worker/engine/ps_loss_scale.h):
 * the step's gradient is the backward of scale*loss; it is checked for
 * Inf/NaN and unscaled before the push.  A worker that overflowed flags
 * every PUSH of the step PS_FLAG_OVERFLOW; psd skips the update and echoes
 * the flag on the WEIGHTS of that version, so every worker feeds the same
 * verdict to its scaler and all scales stay identical. */
#include "config.h"
#include "worker/psworker/psworker.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_wire.h"
#include "worker/client/ps_client.h"
#include "worker/engine/ps_engine.h"

/* Loss scaling, before the push: turn p->grad (this step's gradient, from a
 * backward with dloss = 1) into the backward of scale*loss, check it, and
 * unscale it if it is clean.  Returns 1 when this worker overflowed.
 * On the fp32 CPU path, multiplying by a power of two commutes exactly with
 * every operation of backward (barring overflow / underflow, which is what
 * the check is for), so scaling the result is the scaled backward bit for
 * bit; the fp16 CUDA path passes the scale as the loss gradient instead. */
static int ls_in_backend;    /* the CUDA backend scaled this step's loss itself */
static size_t ls_scaled_numel; /* ... which scaled p->grad[0..this) */

/* Before the step's backward: hand the current scale to a backend that
 * applies it in the loss gradient (CUDA: fp16 backward needs the scaled
 * values), else ls_prepare scales afterwards. */
void ps_worker_ls_begin(ps_worker_t *p)
{
    ls_in_backend = p->o->ls_on && p->vid &&
                    ps_worker_video_loss_scale(p, ps_loss_scale_get(&p->ls), &ls_scaled_numel);
}

int ps_worker_ls_prepare(ps_worker_t *p, uint64_t step)
{
    const ps_worker_opts_t *o = p->o;
    if (!o->ls_on)
        return 0;
    const float s = ps_loss_scale_get(&p->ls);
    float *g = p->grad;
    /* what the backend did not scale (all of it on the CPU; BN statistics
     * after the parameters on CUDA), scaled here: one exact unscale below */
    for (size_t i = ls_in_backend ? ls_scaled_numel : 0; i < p->numel; i++) g[i] *= s;
    if (o->debug_overflow_at >= 0 && step == (uint64_t)o->debug_overflow_at && p->numel) {
        ps_warn("step %" PRIu64 ": --debug-overflow-at: gradient set to Inf", step);
        g[0] = INFINITY;
    }
    int ovf = ps_loss_scale_has_overflow(g, p->numel);
    if (!ovf)
        ps_loss_scale_unscale(&p->ls, g, p->numel);
    return ovf;
}

/* Feed the step's cluster-wide verdict to the scaler; logs every change of
 * the scale (one line per event, the sequence tests compare across
 * workers).  Returns 1 when the step was applied, 0 when it was skipped. */
int ps_worker_ls_finish(ps_worker_t *p, uint64_t step, const char *where, int verdict)
{
    if (!p->o->ls_on)
        return 1;
    float before = ps_loss_scale_get(&p->ls);
    int applied = ps_loss_scale_update(&p->ls, verdict);
    float after = ps_loss_scale_get(&p->ls);
    if (!applied)
        ps_info("loss scale: step %" PRIu64 " skipped (overflow %s), scale %.0f -> %.0f", step,
                where, (double)before, (double)after);
    else if (after != before)
        ps_info("loss scale: step %" PRIu64 " clean, scale %.0f -> %.0f", step, (double)before,
                (double)after);
    return applied;
}

void ps_worker_ls_report(const ps_worker_t *p)
{
    if (p->o->ls_on)
        ps_info("loss scale: final %.0f, %" PRIu64 " of %" PRIu64 " steps skipped for overflow",
                (double)ps_loss_scale_get(&p->ls), p->ls.skipped, p->ls.steps);
}

int ps_worker_apply_local(ps_worker_t *p, uint64_t step)
{
    for (uint32_t i = 0; i < p->table.nparts; i++) {
        size_t off = p->table.parts[i].offset;
        int rc = ps_optim_apply_partition(&p->optim, &p->table, i, p->w + off, p->mom + off,
                                          p->grad + off, step);
        if (rc) {
            ps_error("optimizer update of partition %u failed: %s", i, ps_strerror(rc));
            return rc;
        }
    }
    return 0;
}

/* Peak device memory (a backend with memory figures: CUDA): sampled after
 * each step's backward (the backend frees nothing inside a step, so usage
 * is at its highest there), printed every --progress-every steps and at
 * the end. */
static struct {
    size_t alloc_peak, used_peak, total; /* bytes, over the run */
} devmem;

static void devmem_step(ps_worker_t *p, uint64_t step)
{
    ps_ctx_t *ctx;
    const ps_backend_t *be;
    ps_backend_mem_t m;
    /* a backend without device memory (the CPU) has no figures */
    if (!ps_worker_video_model(p, &ctx, &be) || be->mem_stats(ctx, &m, 1))
        return;
    if (m.alloc_peak > devmem.alloc_peak) devmem.alloc_peak = m.alloc_peak;
    if (m.dev_used_peak > devmem.used_peak) devmem.used_peak = m.dev_used_peak;
    devmem.total = m.dev_total;
    int every = p->o->progress_every;
    if (every > 0 && (step + 1) % (uint64_t)every == 0)
        ps_info("device memory, step %" PRIu64 ": peak %.0f MiB allocated by the backend, "
                "%.0f of %.0f MiB in use on the device", step, m.alloc_peak / 1048576.0,
                m.dev_used_peak / 1048576.0, m.dev_total / 1048576.0);
}

/* One stdout line before "final:" (bench/gpu_check.sh reads it). */
static void devmem_report(const ps_worker_t *p)
{
    if (!devmem.total)
        return;
    printf("device_memory: peak_alloc_mib=%.1f peak_used_mib=%.1f total_mib=%.1f\n",
           devmem.alloc_peak / 1048576.0, devmem.used_peak / 1048576.0,
           devmem.total / 1048576.0);
    fflush(stdout);
}

static int check_loss(const ps_worker_t *p, double loss, uint64_t step)
{
    if (isfinite(loss))
        return 0;
    if (p->compute_rc) /* the cause (bad data, ...) is already logged */
        return p->compute_rc;
    ps_error("loss is not finite at step %" PRIu64 " (diverged: try a lower --lr)", step);
    return PS_ENONFINITE;
}

int ps_worker_run_standalone(ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    int rc = ps_worker_output_open(p);
    if (rc)
        return rc;
    if (o->ls_on && (rc = ps_loss_scale_init(&p->ls, &o->ls_cfg)))
        return rc;
    ps_worker_initial_eval(p);
    p->st.t_start = ps_worker_now();
    for (uint64_t s = 0; s < o->steps; s++) {
        double t0 = ps_worker_now();
        ps_worker_ls_begin(p);
        double loss = ps_worker_compute(p, s);
        if ((rc = check_loss(p, loss, s)))
            return rc;
        devmem_step(p, s);
        int ovf = ps_worker_ls_prepare(p, s);
        double t1 = ps_worker_now();
        /* Skipped: no update at all (weights, momentum), as on the servers;
         * the schedule still counts the step. */
        if (ps_worker_ls_finish(p, s, PS_WORKER_LS_WHERE(ovf), ovf) &&
            (rc = ps_worker_apply_local(p, s)))
            return rc;
        double t2 = ps_worker_now();
        ps_worker_record_step(p, s, loss, t2 - t0, t1 - t0, 0);
        ps_worker_maybe_validate(p, s + 1);
    }
    ps_worker_ls_report(p);
    if ((rc = ps_worker_save_model(p)))
        return rc;
    devmem_report(p);
    ps_worker_print_final(p, o->steps);
    return 0;
}

/* Split "a,b,c" into a NULL-terminated array (one allocation). */
static char **split_servers(const char *list, int *n)
{
    size_t len = strlen(list);
    int cnt = 1;
    for (const char *q = list; *q; q++) cnt += *q == ',';
    char **v = malloc(sizeof(char *) * (size_t)(cnt + 1) + len + 1);
    if (!v)
        return NULL;
    char *buf = (char *)(v + cnt + 1);
    memcpy(buf, list, len + 1);
    *n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
        if (*tok) v[(*n)++] = tok;
    v[*n] = NULL;
    return v;
}

/* Wait for every request in req[0..n) (NULL entries skipped), in order. */
static int wait_all(ps_client_t *c, ps_req_t **req, uint64_t *ver, uint32_t n, const char *what)
{
    int first_err = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!req[i])
            continue;
        int rc = ps_client_wait(c, req[i], -1, &ver[i]);
        req[i] = NULL;
        if (rc && !first_err) {
            ps_error("%s of partition %u failed: %s (%s)", what, i, ps_strerror(rc),
                     ps_client_last_error(c));
            first_err = rc;
        }
    }
    return first_err;
}

static int pull_all(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver)
{
    for (uint32_t i = 0; i < p->table.nparts; i++) {
        int rc = ps_client_pull(c, i, 0, p->w + p->table.parts[i].offset, &req[i]);
        if (rc) {
            ps_error("pull of partition %u: %s", i, ps_strerror(rc));
            wait_all(c, req, ver, i, "pull");
            return rc;
        }
    }
    return wait_all(c, req, ver, p->table.nparts, "pull");
}

/* Partition i's PUSHPULL of `step` (req[i]) is done or about to be: wait
 * for it and run every check of a cluster step on it (OVERFLOW verdict,
 * ROLLBACK, stale drop and re-pull in async modes, exactly one update per
 * step in sync mode, versions going back).  Used by cluster_step after all
 * pushes and by the overlap hooks (psworker_overlap.c) one partition at a
 * time, as the next forward needs it.  dst: where the partition's weights
 * land (the re-pull after a stale drop goes there too).  Returns 0 or the
 * PS_E*; *first_rc keeps the first error of the step, logged once. */
int ps_worker_part_complete(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver,
                            uint32_t i, float *dst, uint64_t step, int sync, int *remote_ovf,
                            int *first_rc)
{
    if (!req[i])
        return 0;
    uint64_t v = 0;
    uint32_t rflags = 0;
    int r = ps_client_wait_flags(c, req[i], -1, &v, &rflags);
    req[i] = NULL;
    /* psd's verdict on this step (sync): WEIGHTS of a skipped update */
    if (!r && (rflags & PS_FLAG_OVERFLOW))
        *remote_ovf = 1;
    if (r == PS_ESTATE && sync && (rflags & PS_FLAG_ROLLBACK)) {
        /* A server restarted from an older checkpoint (v): cluster_train
         * rolls every server back once this step's requests are done. */
        if (!p->rollback || v < p->rollback_to)
            p->rollback_to = v;
        p->rollback = 1;
        return 0;
    }
    if (r == PS_ESTALE && !sync) {
        p->st.stale_drops++;
        ps_debug("partition %u: gradient of version %" PRIu64 " too stale, pulling", i, ver[i]);
        r = ps_client_pull(c, i, 0, dst, &req[i]);
        if (!r)
            r = ps_client_wait(c, req[i], -1, &v);
        req[i] = NULL;
    }
    if (r) {
        if (!*first_rc)
            ps_error("step %" PRIu64 ": partition %u failed: %s (%s)", step, i, ps_strerror(r),
                     ps_client_last_error(c));
        *first_rc = *first_rc ? *first_rc : r;
        return r;
    }
    if (sync && v != step + 1 && !*first_rc) {
        /* Exactly one update per step: anything else is a lost or doubled one. */
        ps_error("step %" PRIu64 ": partition %u came back at version %" PRIu64
                 ", expected %" PRIu64 " (lost or doubled update; or the servers do not "
                 "run --mode sync: give psworker the same --mode)", step, i, v, step + 1);
        *first_rc = PS_ESTATE;
    }
    if (!sync && v < ver[i]) {
        /* The partition's version went backwards: its server restarted
         * from an older checkpoint.  Residuals of lossy pushes were
         * accumulated against weights that no longer exist. */
        ps_warn("partition %u went back from version %" PRIu64 " to %" PRIu64
                " (server restored a checkpoint): resetting error feedback", i, ver[i], v);
        ps_client_ef_reset(c);
    }
    ver[i] = v;
    return *first_rc;
}

/* One cluster step: push the gradient of every partition and get the new
 * weights back.  A gradient refused as too stale (bounded staleness) is
 * dropped and the partition's newest weights are pulled instead. */
static int cluster_step(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver,
                        uint64_t step, int sync, int local_ovf, int *remote_ovf)
{
    uint32_t n = p->table.nparts;
    uint32_t pflags = ps_loss_scale_push_flags(local_ovf);
    int rc = 0;
    *remote_ovf = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        size_t off = p->table.parts[i].offset;
        rc = ps_client_pushpull(c, i, sync ? step : ver[i], p->grad + off, p->w + off, pflags,
                                &req[i]);
        if (rc)
            ps_error("pushpull of partition %u at step %" PRIu64 ": %s", i, step,
                     ps_strerror(rc));
    }
    for (uint32_t i = 0; i < n; i++)
        ps_worker_part_complete(p, c, req, ver, i, p->w + p->table.parts[i].offset, step, sync,
                                remote_ovf, &rc);
    return rc;
}

/* Roll every server back to p->rollback_to (ps_client_rollback: the lowest
 * version some server can restore), pull the weights of that version and
 * return it in *next: the step to compute next.  The data of a step is a
 * function of the step alone, so the steps redone repeat the lost ones. */
static int rollback(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver, uint64_t step,
                    uint64_t *next)
{
    uint64_t v = p->rollback_to;
    int rc;
    for (int tries = 0; tries < 8; tries++) {
        p->rollback = 0;
        ps_warn("step %" PRIu64 ": a server restarted from its checkpoint of version %" PRIu64
                ": rolling every server back to it", step, v);
        if ((rc = ps_client_rollback(c, &v))) {
            ps_error("rollback to version %" PRIu64 " failed: %s (%s)", v, ps_strerror(rc),
                     ps_client_last_error(c));
            return rc;
        }
        if ((rc = pull_all(p, c, req, ver)))
            return rc;
        uint64_t lo = ver[0], hi = ver[0];
        for (uint32_t i = 1; i < p->table.nparts; i++) {
            lo = ver[i] < lo ? ver[i] : lo;
            hi = ver[i] > hi ? ver[i] : hi;
        }
        if (lo == v && hi == v) {
            /* Residuals of lossy pushes belong to the weights abandoned. */
            ps_client_ef_reset(c);
            ps_info("rolled back to step %" PRIu64 " (%" PRIu64 " step(s) to redo)", v, step - v);
            *next = v;
            return 0;
        }
        /* Another worker rolled some server further back meanwhile. */
        v = lo;
    }
    ps_error("rollback: partition versions keep moving; giving up");
    return PS_ESTATE;
}

/* A worker (re)started while the job runs must not wait at the start
 * barrier (the others are training, not at the barrier): every server
 * reporting a version above 0 means the job is under way or resumed from
 * checkpoints, and the weights are there to pull. */
static int job_under_way(ps_client_t *c, int nservers)
{
    for (int s = 0; s < nservers; s++) {
        char *json = NULL;
        if (ps_client_stats(c, s, &json) || !json)
            return 0;
        const char *k = strstr(json, "\"version\":");
        unsigned long long v = k ? strtoull(k + 10, NULL, 10) : 0;
        free(json);
        if (v == 0)
            return 0;
    }
    return 1;
}

/* --overlap: the step of the loop once ps_worker_compute returned.  The
 * hooks already pushed what backward finished and checked the previous
 * step's replies as the forward needed them; the rest is pushed here.
 * Before a step that validates and after the last one every reply is
 * checked at once, as the plain loop does within the step.  *t_wait: time
 * blocked on replies.  Returns 0, or the PS_E*, with p->rollback set when
 * the loop must roll back. */
static int overlap_step(ps_worker_t *p, ps_worker_overlap_t *ov, uint64_t s, double *t_wait)
{
    const ps_worker_opts_t *o = p->o;
    int rc = ps_worker_overlap_end(ov, t_wait), remote = 0;
    if (rc || p->rollback || p->compute_rc)
        return rc;
    if (s + 1 == o->steps || (o->val_every > 0 && (s + 1) % (uint64_t)o->val_every == 0)) {
        double t0 = ps_worker_now();
        rc = ps_worker_overlap_wait_all(ov, &remote);
        *t_wait += ps_worker_now() - t0;
    }
    return rc;
}

static int cluster_train(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver,
                         ps_worker_overlap_t *ov)
{
    const ps_worker_opts_t *o = p->o;
    int sync = !strcmp(o->mode, "sync"), rc, from_ckpt = 0;

    if (p->rank == 0) {
        char *spec = ps_worker_spec_json(p);
        if (!spec) {
            ps_error("cannot build the model spec: out of memory");
            return PS_ENOMEM;
        }
        rc = ps_client_init(c, spec, p->w, &from_ckpt);
        free(spec);
        if (rc) {
            ps_error("INIT failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
            return rc;
        }
        if (from_ckpt)
            ps_info("servers hold a checkpoint of this model: resuming from it");
    }
    if (sync && job_under_way(c, p->table.nservers))
        ps_info("the servers are past version 0: joining the running job (no start barrier)");
    else if ((rc = ps_client_barrier(c))) {
        ps_error("start barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
        return rc;
    }
    if ((rc = pull_all(p, c, req, ver)))
        return rc;
    uint64_t start = ver[0], hi = ver[0];
    for (uint32_t i = 1; i < p->table.nparts; i++)
        hi = ver[i] > hi ? ver[i] : hi;
    for (uint32_t i = 1; i < p->table.nparts; i++) {
        /* One apart is a worker rejoining a running job mid-step: the
         * partitions its previous life already pushed are one ahead; it
         * starts from the lowest and those answer its pushes as retries. */
        if (ver[i] != start && sync && hi - (ver[i] < start ? ver[i] : start) > 1) {
            ps_error("partitions start at different versions (%" PRIu64 " and %" PRIu64
                     "): servers restored from checkpoints of different steps",
                     start, ver[i]);
            return PS_ESTATE;
        }
        if (ver[i] < start) start = ver[i];
    }
    if (!sync)
        start = 0; /* versions count pushes, not steps, in async modes */
    else if (start > 0)
        ps_info("resuming at step %" PRIu64, start);
    if ((rc = ps_worker_output_open(p)))
        return rc;
    if (o->ls_on && (rc = ps_loss_scale_init(&p->ls, &o->ls_cfg)))
        return rc;
    ps_worker_initial_eval(p);
    p->st.t_start = ps_worker_now();
    for (uint64_t s = start; s < o->steps; s++) {
        double t0 = ps_worker_now();
        ps_worker_ls_begin(p);
        if (ov)
            ps_worker_overlap_begin(ov, s);
        double loss = ps_worker_compute(p, s), t_wait = 0;
        if (ov && (rc = overlap_step(p, ov, s, &t_wait)))
            return rc;
        if (!(ov && p->rollback) && (rc = check_loss(p, loss, s)))
            return rc;
        devmem_step(p, s);
        int ovf = ps_worker_ls_prepare(p, s), remote = 0; /* ls is off with --overlap */
        double t1 = ps_worker_now();
        if (!ov && (rc = cluster_step(p, c, req, ver, s, sync, ovf, &remote)))
            return rc;
        if (p->rollback) {
            uint64_t next;
            if ((rc = rollback(p, c, req, ver, s, &next)))
                return rc;
            s = next - 1; /* the loop's s++ makes it `next` (unsigned wrap at 0 included) */
            continue;
        }
        if (ovf && sync && !remote)
            /* Our flagged pushes were skipped, yet no reply says so: a psd
             * without the echo; the other workers cannot know either. */
            ps_warn("step %" PRIu64 ": overflow pushed but no server reported the skip: "
                    "workers' loss scales may diverge (psd too old?)", s);
        /* Async / bounded staleness: no step is shared, each worker's own
         * overflow is its verdict (psd drops just that push). */
        ps_worker_ls_finish(p, s, PS_WORKER_LS_WHERE(ovf), ovf || (sync && remote));
        double t2 = ps_worker_now();
        /* --overlap: the waits inside compute and after it are communication */
        ps_worker_record_step(p, s, loss, t2 - t0, t1 - t0 - t_wait, t2 - t1 + t_wait);
        /* rank 0 validated: the others wait here, not in a PUSHPULL */
        if (ps_worker_maybe_validate(p, s + 1) && (rc = ps_client_barrier(c))) {
            ps_error("validation barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
            return rc;
        }
    }
    /* Everyone finished: in async modes the newest weights are on the
     * servers, so every rank reads them back before evaluating / saving. */
    if ((rc = ps_client_barrier(c))) {
        ps_error("final barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
        return rc;
    }
    if ((rc = pull_all(p, c, req, ver)))
        return rc;
    ps_worker_ls_report(p);
    if ((rc = ps_worker_save_model(p)))
        return rc;
    devmem_report(p);
    ps_worker_print_final(p, o->steps);
    /* A second barrier: nobody may still be pulling when rank 0 shuts the
     * servers down. */
    if ((rc = ps_client_barrier(c))) {
        ps_error("exit barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
        return rc;
    }
    if (p->rank == 0 && o->shutdown_servers && (rc = ps_client_shutdown_servers(c))) {
        ps_error("SHUTDOWN of the servers failed: %s (%s)", ps_strerror(rc),
                 ps_client_last_error(c));
        return rc;
    }
    return 0;
}

int ps_worker_client_connect(ps_worker_t *p, ps_client_t **cp)
{
    const ps_worker_opts_t *o = p->o;
    ps_client_opts_t co;
    ps_client_t *c = NULL;
    int nservers = 0, nkeys = 0, rc;
    char **servers = split_servers(o->servers, &nservers);
    char **keys = *o->curve_server_keys ? split_servers(o->curve_server_keys, &nkeys) : NULL;

    *cp = NULL;
    if (!servers || (*o->curve_server_keys && !keys)) {
        rc = PS_ENOMEM;
        goto out;
    }
    ps_client_opts_default(&co);
    co.servers = (const char *const *)servers;
    co.nservers = nservers;
    co.rank = o->rank;
    co.num_workers = o->num_workers;
    co.dtype = o->dt;
    co.codec = o->codec_id;
    co.pull_codec = o->pull_codec_id;
    co.topk_ratio = o->topk_ratio;
    co.ef_rounding = o->ef_rounding;
    co.ef_momentum = ps_worker_ef_momentum(o);
    co.ef_nesterov = o->nesterov;
    co.topk_warmup_steps = ps_worker_topk_warmup(o);
    if (keys) {
        if (nkeys != 1 && nkeys != nservers) {
            ps_error("--curve-server-key: give 1 key file (shared by all servers) or one per "
                     "server (%d), got %d", nservers, nkeys);
            rc = PS_EINVAL;
            goto out;
        }
        co.curve_server_keys = (const char *const *)keys;
        co.ncurve_server_keys = nkeys;
        co.curve_public_key = o->curve_public_key;
        co.curve_secret_key = o->curve_secret_key;
    }
    co.timeout_ms = o->timeout_ms;
    co.retry_ms = o->retry_ms;
    co.heartbeat_ms = o->heartbeat_ms;
    if ((rc = ps_client_new(&c, &co, &p->table))) {
        ps_error("cannot create the client for %s: %s", o->servers, ps_strerror(rc));
        goto out;
    }
    rc = ps_client_hello(c);
    if (rc < 0) {
        ps_error("HELLO to %s failed: %s (%s)", servers[0], ps_strerror(rc),
                 ps_client_last_error(c));
        goto out;
    }
    if (rc >= o->num_workers) {
        ps_error("server 0 assigned rank %d but --num-workers is %d", rc, o->num_workers);
        rc = PS_EMISMATCH;
        goto out;
    }
    if (o->rank >= 0 && rc != o->rank) {
        ps_error("asked for rank %d, server 0 gave %d", o->rank, rc);
        rc = PS_EMISMATCH;
        goto out;
    }
    p->rank = rc;
    rc = 0;
    {
        char tag[32];
        snprintf(tag, sizeof tag, "psworker[%d]", p->rank);
        ps_log_set_prog(tag);
    }
    ps_info("rank %d of %d, %d server(s), wire %s/%s (pull %s)%s, mode %s", p->rank,
            o->num_workers, nservers, ps_dtype_name(o->dt), ps_codec_name(o->codec_id),
            o->pull_codec_id >= 0 ? ps_codec_name((ps_codec_t)o->pull_codec_id) : "auto",
            keys ? ", CURVE" : "", o->mode);
out:
    if (rc) ps_client_destroy(&c);
    *cp = c;
    free(servers);
    free(keys);
    return rc;
}

int ps_worker_run_cluster(ps_worker_t *p)
{
    ps_client_t *c = NULL;
    ps_worker_overlap_t *ov = NULL;
    int rc;
    ps_req_t **req = calloc(p->table.nparts, sizeof *req);
    uint64_t *ver = calloc(p->table.nparts, sizeof *ver);

    if (!req || !ver) {
        rc = PS_ENOMEM;
        goto out;
    }
    if ((rc = ps_worker_client_connect(p, &c)))
        goto out;
    if ((rc = ps_worker_overlap_new(p, c, req, ver, !strcmp(p->o->mode, "sync"), &ov)))
        goto out;
    rc = cluster_train(p, c, req, ver, ov);
out:
    /* Destroying the client stops its I/O thread before the buffers that
     * in-flight requests point into (p->w, p->grad, the overlap's) are
     * freed; the overlap's communication thread is idle between steps. */
    ps_client_destroy(&c);
    ps_worker_overlap_free(&ov);
    free(req);
    free(ver);
    return rc;
}
