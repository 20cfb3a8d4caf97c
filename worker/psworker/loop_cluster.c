/* Training through psd servers (sync, async or bounded staleness).
 *
 * Step: compute this rank's mean gradient, PUSHPULL every partition (all in
 * flight together, issued in partition order so the client's
 * front-of-model priority matches), wait for all, which also brings back
 * the weights of the next version.  The iteration sent with a partition's
 * gradient is the version of the weights it was computed from; in sync mode
 * that is the step number, in async / bounded-staleness modes the server
 * uses it to measure staleness.  With --overlap (overlap.c) the pushes
 * leave from the model's backward hooks and the replies are checked, by
 * the same ps_worker_part_complete, from the next forward's hooks.
 *
 * Loss scaling: a worker that overflowed flags every PUSH of the step
 * PS_FLAG_OVERFLOW; psd skips the update and echoes the flag on the
 * WEIGHTS of that version, so every worker feeds the same verdict to its
 * scaler and all scales stay identical. */
#include "worker/psworker/psworker.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_wire.h"
#include "worker/client/ps_client.h"

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

/* Pull every partition's current weights into p->w (flags: PS_FLAG_REBUILD
 * waits for partitions a server being rebuilt does not hold yet). */
static int pull_all_ex(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver,
                       uint32_t flags)
{
    for (uint32_t i = 0; i < p->table.nparts; i++) {
        int rc = ps_client_pull_ex(c, i, 0, flags, p->w + p->table.parts[i].offset, &req[i]);
        if (rc) {
            ps_error("pull of partition %u: %s", i, ps_strerror(rc));
            wait_all(c, req, ver, i, "pull");
            return rc;
        }
    }
    return wait_all(c, req, ver, p->table.nparts, "pull");
}

static int pull_all(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver)
{
    return pull_all_ex(p, c, req, ver, 0);
}

/* Partition i's PUSHPULL of `step` (req[i]) is done or about to be: wait
 * for it and run every check of a cluster step on it (OVERFLOW verdict,
 * ROLLBACK, stale drop and re-pull in async modes, exactly one update per
 * step in sync mode, versions going back).  Used by cluster_step after all
 * pushes and by the overlap hooks (overlap.c) one partition at a
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
    int pending = 0;
    int r = sync ? ps_client_wait_unless(c, req[i], p->rebuilds_seen, &v, &rflags, &pending)
                 : ps_client_wait_flags(c, req[i], -1, &v, &rflags);
    if (pending) {
        /* A server said it is being rebuilt while this reply was still
         * due: it may wait on a worker that waits for that rebuild (one a
         * step behind this one, when the lost server had gone a step
         * further than the copy it is rebuilt from).  The rebuild pulls
         * every partition again, so stop waiting for this one. */
        ps_client_cancel(c, req[i]);
        req[i] = NULL;
        p->resync = 1;
        return 0;
    }
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
    if (r == PS_ESTATE && sync && (rflags & PS_FLAG_REBUILD)) {
        /* A server restarted with nothing of the job: cluster_one rebuilds
         * it from the workers' copies once this step's requests are done. */
        uint32_t srv = p->table.parts[i].server;
        p->rebuild |= UINT64_C(1) << (srv < 63 ? srv : 63);
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
    if (sync && v > step + 1) {
        /* The servers went on without this rank (declared lost under
         * --on-worker-loss continue while it was stopped or cut off): its
         * push was answered as a retry with the current weights.  The loop
         * catches up from the servers' version (catch_up). */
        if (!p->behind)
            ps_warn("step %" PRIu64 ": partition %u is at version %" PRIu64 " already: the "
                    "servers went on without this rank (--on-worker-loss continue); catching up",
                    step, i, v);
        p->behind = 1;
    } else if (sync && v != step + 1 && !*first_rc) {
        /* Exactly one update per step: anything else is a lost one. */
        ps_error("step %" PRIu64 ": partition %u came back at version %" PRIu64
                 ", expected %" PRIu64 " (lost update; or the servers do not "
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
    int die = p->o->debug_die_mid_step >= 0 && step == (uint64_t)p->o->debug_die_mid_step;
    if (die) n = n > 1 ? n / 2 : n;
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
    if (die) {
        /* --debug-die-mid-step: a worker lost between its pushes of a step,
         * deterministically (a timed kill hits this only by chance): the
         * partitions below n are updated with its gradient, the rest wait
         * for it. */
        ps_warn("step %" PRIu64 ": --debug-die-mid-step: %u of %u partitions pushed and "
                "answered; SIGKILL now", step, n, p->table.nparts);
        raise(SIGKILL);
    }
    return rc;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sync with loss scaling, resuming or rolling back to `step`: the scale an
 * uninterrupted run holds there, replayed from the steps the servers
 * skipped (STATS skipped_steps of every server, merged). */
static int restore_loss_scale(ps_worker_t *p, ps_client_t *c, uint64_t step)
{
    if (!p->o->prec.ls_on) return 0;
    uint64_t *skips = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (uint32_t s = 0; s < p->table.nservers && !rc; s++) {
        char *json = NULL;
        if ((rc = ps_client_stats(c, (int)s, &json))) {
            ps_error("STATS of server %u (for the loss-scale verdicts): %s (%s)", s,
                     ps_strerror(rc), ps_client_last_error(c));
            break;
        }
        const char *k = json ? strstr(json, "\"skipped_steps\":[") : NULL;
        for (char *e = k ? (char *)k + 17 : NULL; e && *e != ']';) {
            char *end;
            unsigned long long v = strtoull(e, &end, 10);
            if (end == e) break;
            if (n == cap) {
                uint64_t *nn = realloc(skips, (cap = cap ? 2 * cap : 64) * sizeof *nn);
                if (!nn) { rc = PS_ENOMEM; break; }
                skips = nn;
            }
            if (v < step) skips[n++] = v;
            e = *end == ',' ? end + 1 : end;
        }
        free(json);
    }
    if (!rc) {
        if (n) qsort(skips, n, sizeof *skips, cmp_u64); /* skips is NULL when n is 0 */
        rc = ps_worker_ls_replay(p, step, skips, n);
    }
    free(skips);
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
            return restore_loss_scale(p, c, v);
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
    int rc = ps_worker_overlap_end(ov, t_wait), remote = 0;
    if (rc || p->rollback || p->behind || p->rebuild || p->resync || p->compute_rc)
        return rc;
    if (s + 1 == p->o->steps || ps_worker_val_due(p, s + 1)) {
        double t0 = ps_worker_now();
        rc = ps_worker_overlap_wait_all(ov, &remote);
        *t_wait += ps_worker_now() - t0;
    }
    return rc;
}

/* The state one cluster run carries between its phases. */
typedef struct cluster {
    ps_worker_t *p;
    ps_client_t *c;
    ps_req_t **req;
    uint64_t *ver;
    ps_worker_overlap_t *ov;
    int sync;
} cluster_t;

/* Rank 0 sends the INIT (the spec and its initial weights); a server that
 * holds a checkpoint of this model answers that it resumes from it. */
static int send_init(cluster_t *k)
{
    ps_worker_t *p = k->p;
    int from_ckpt = 0;
    char *spec = ps_worker_spec_json(p);
    if (!spec) {
        ps_error("cannot build the model spec: out of memory");
        return PS_ENOMEM;
    }
    int rc = ps_client_init(k->c, spec, p->w, &from_ckpt);
    free(spec);
    if (rc) {
        ps_error("INIT failed: %s (%s)", ps_strerror(rc), ps_client_last_error(k->c));
        return rc;
    }
    if (from_ckpt) ps_info("servers hold a checkpoint of this model: resuming from it");
    return 0;
}

/* A worker that died between its pushes of step `lo` left the partitions
 * it had pushed one update ahead (the others' gradients and its own were
 * in); it must compute step lo from version lo everywhere, so those
 * partitions are pulled again at exactly lo (the servers keep one version
 * back).  0, PS_EAGAIN when a partition moved meanwhile (pull again), or
 * the PS_E* of a failed pull. */
static int pull_ahead_at(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver,
                         uint64_t lo)
{
    uint32_t n = 0;
    int rc = 0;
    for (uint32_t i = 0; i < p->table.nparts && !rc; i++)
        if (ver[i] != lo) {
            rc = ps_client_pull_exact(c, i, lo, p->w + p->table.parts[i].offset, &req[i]);
            n++;
        }
    if (rc) ps_error("pull of version %" PRIu64 ": %s", lo, ps_strerror(rc));
    int wrc = wait_all(c, req, ver, p->table.nparts, "pull of the version before");
    if (rc || wrc) return rc ? rc : wrc == PS_ESTATE ? PS_EAGAIN : wrc;
    ps_info("%u partition(s) one step ahead (this rank's pushes of step %" PRIu64 " were in "
            "there before it stopped or lost them): pulled at version %" PRIu64
            " with the others", n, lo, lo);
    return 0;
}

/* Pull every partition and find the step to compute: the lowest version
 * (sync; partitions one ahead pulled again at it, pull_ahead_at), 0 in
 * async modes (versions count pushes there). */
static int pull_start(cluster_t *k, uint64_t *start, uint32_t flags)
{
    ps_worker_t *p = k->p;
    int rc;
    for (int tries = 0;; tries++) {
        if ((rc = pull_all_ex(p, k->c, k->req, k->ver, flags))) return rc;
        uint64_t lo = k->ver[0], hi = k->ver[0];
        for (uint32_t i = 1; i < p->table.nparts; i++) {
            lo = k->ver[i] < lo ? k->ver[i] : lo;
            hi = k->ver[i] > hi ? k->ver[i] : hi;
        }
        *start = k->sync ? lo : 0; /* versions count pushes, not steps, in async modes */
        if (!k->sync || hi == lo) break;
        if (hi - lo > 1) {
            ps_error("partitions start at different versions (%" PRIu64 " and %" PRIu64
                     "): servers restored from checkpoints of different steps", lo, hi);
            return PS_ESTATE;
        }
        /* One apart: this rank rejoins a step its previous process left
         * half pushed. */
        rc = pull_ahead_at(p, k->c, k->req, k->ver, lo);
        if (rc != PS_EAGAIN) {
            if (rc) return rc;
            break;
        }
        if (tries == 8) {
            ps_error("partition versions keep moving while this worker joins; giving up");
            return PS_ESTATE;
        }
        /* a server being rebuilt may not have the version before yet */
        struct timespec ts = {0, 50000000L * (tries + 1)};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* Elastic membership: a reply named more epochs than this worker knows.
 * Take them from server 0 (STATS "epochs") and tell every server, before
 * any push of the step the change begins at (elastic.c). */
static int elastic_sync(cluster_t *k)
{
    char *json = NULL;
    int rc = ps_client_stats(k->c, 0, &json);
    const char *e = json ? strstr(json, "\"epochs\":[") : NULL;
    if (!rc && !e) rc = PS_EPROTO;
    if (!rc) {
        /* the array: up to its matching bracket */
        const char *a = e + 9, *z = a;
        for (int depth = 0; *z; z++) {
            depth += *z == '[' ? 1 : *z == ']' ? -1 : 0;
            if (!depth) break;
        }
        char *list = strndup(a, (size_t)(z - a) + 1);
        rc = !list ? PS_ENOMEM : ps_worker_elastic_set(k->p, list);
        if (!rc) rc = ps_client_members(k->c, list);
        free(list);
    }
    free(json);
    if (rc) ps_error("membership change: %s (%s)", ps_strerror(rc), ps_client_last_error(k->c));
    return rc;
}

/* --join: server 0 gave this rank its first step; the others compute the
 * steps before it.  Pull the weights of that version (waiting for it). */
static int join_begin(cluster_t *k, uint64_t *start)
{
    ps_worker_t *p = k->p;
    int rc = elastic_sync(k);
    uint32_t n = p->table.nparts;
    ps_info("joining the running job at step %" PRIu64, p->join_at);
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = ps_client_pull(k->c, i, p->join_at, p->w + p->table.parts[i].offset, &k->req[i]);
    int wrc = wait_all(k->c, k->req, k->ver, n, "pull of the joining step");
    if (rc || wrc) return rc ? rc : wrc;
    for (uint32_t i = 0; i < n; i++)
        if (k->ver[i] != p->join_at) {
            ps_error("joining at step %" PRIu64 ": partition %u is at version %" PRIu64, p->join_at,
                     i, k->ver[i]);
            return PS_ESTATE;
        }
    *start = p->join_at;
    return 0;
}

/* INIT, the start barrier (or joining a job under way), the first pull:
 * *start = the step to compute first. */
static int cluster_begin(cluster_t *k, uint64_t *start)
{
    ps_worker_t *p = k->p;
    int rc;
    if (p->o->join) return join_begin(k, start);
    if (p->rank == 0 && (rc = send_init(k))) return rc;
    if (k->sync && job_under_way(k->c, p->table.nservers))
        ps_info("the servers are past version 0: joining the running job (no start barrier)");
    else if ((rc = ps_client_barrier(k->c))) {
        ps_error("start barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(k->c));
        return rc;
    }
    if ((rc = pull_start(k, start, 0))) return rc;
    if (k->sync && *start > 0) ps_info("resuming at step %" PRIu64, *start);
    return 0;
}

/* The servers went on without this rank: pull, start again at their
 * version with the loss scale of that step, forget error feedback (it
 * belongs to weights long gone). */
static int catch_up(cluster_t *k, uint64_t step, uint64_t *next)
{
    ps_worker_t *p = k->p;
    p->behind = 0;
    int rc = pull_start(k, next, 0);
    if (rc) return rc;
    ps_client_ef_reset(k->c);
    ps_warn("step %" PRIu64 ": caught up with the servers at step %" PRIu64 " (%" PRIu64
            " step(s) of this rank missed)", step, *next, *next - step - 1);
    return restore_loss_scale(p, k->c, *next);
}

/* A server restarted with nothing of the job (its disk lost too): every
 * worker gives it the spec and the partitions it keeps (--replicate-state),
 * then pulls everything, waiting for the partitions the others give back,
 * and goes on from the lowest version (a worker one step ahead computes
 * that step again: its data is a function of the step, and the servers
 * keep the version before).  Nothing is lost or redone on the servers. */
static int rebuild(cluster_t *k, uint64_t step, uint64_t *next)
{
    ps_worker_t *p = k->p;
    int rc = 0;
    uint64_t lost = p->rebuild;
    p->rebuild = 0;
    p->resync = 0;
    if (!p->o->replicate_state) {
        ps_error("step %" PRIu64 ": a server restarted without the job's state (%s), and this "
                 "job keeps no copy of it: run with --replicate-state to rebuild a lost server, "
                 "or give psd a --checkpoint-dir that survives", step, ps_client_last_error(k->c));
        return PS_ESTATE;
    }
    char *spec = ps_worker_spec_json(p);
    if (!spec) return PS_ENOMEM;
    for (uint32_t s = 0; s < p->table.nservers && !rc; s++) {
        if (!(lost & (UINT64_C(1) << (s < 63 ? s : 63)))) continue;
        ps_warn("step %" PRIu64 ": server %u restarted with nothing of the job: rebuilding it "
                "from the workers' copies", step, s);
        rc = ps_client_rebuild(k->c, (int)s, spec);
    }
    free(spec);
    if (!rc) rc = pull_start(k, next, PS_FLAG_REBUILD);
    /* the verdicts up to here are answered by this pull */
    p->rebuilds_seen = ps_client_rebuilds(k->c);
    if (rc) {
        ps_error("rebuilding a server failed: %s (%s)", ps_strerror(rc), ps_client_last_error(k->c));
        return rc;
    }
    ps_client_ef_reset(k->c);
    ps_info("servers whole again: going on at step %" PRIu64, *next);
    return restore_loss_scale(p, k->c, *next);
}

static volatile sig_atomic_t sigterm_seen;
static void on_sigterm(int sig) { (void)sig; sigterm_seen = 1; }

/* SIGTERM in a sync job: leave gracefully -- ask server 0 to drain this
 * rank; it trains to the step before the boundary and ends there. */
static int drain_self(cluster_t *k)
{
    ps_worker_t *p = k->p;
    uint64_t from = 0;
    p->drain_asked = 1;
    int rc = ps_client_drain(k->c, p->rank, &from);
    if (rc) {
        ps_error("SIGTERM: cannot leave the job gracefully: %s (%s); stopping", ps_strerror(rc),
                 ps_client_last_error(k->c));
        return PS_ESHUTDOWN;
    }
    ps_warn("SIGTERM: leaving the job at step %" PRIu64 " (drained; the others go on)", from);
    return 0;
}

/* One step of the loop; *next = the step after it (a rollback moves it back). */
static int cluster_one(cluster_t *k, uint64_t s, uint64_t *next)
{
    ps_worker_t *p = k->p;
    int rc;
    double t0 = ps_worker_now();
    *next = s + 1;
    if (sigterm_seen && !p->drain_asked && (rc = drain_self(k))) return rc;
    if (k->sync && !ps_worker_elastic_at(p, s)) {
        /* drained: this rank is not in the job from step s on */
        ps_info("membership: rank %d leaves the job at step %" PRIu64, p->rank, s);
        p->drained = 1;
        *next = p->o->steps;
        return 0;
    }
    ps_worker_ls_begin(p);
    if (k->ov) ps_worker_overlap_begin(k->ov, s);
    double loss = ps_worker_compute(p, s), t_wait = 0;
    if (k->ov && (rc = overlap_step(p, k->ov, s, &t_wait))) return rc;
    if (!(k->ov && (p->rollback || p->behind || p->rebuild || p->resync)) &&
        (rc = ps_worker_check_loss(p, loss, s)))
        return rc;
    ps_worker_devmem_step(p, s);
    int ovf = ps_worker_ls_prepare(p, s), remote = 0; /* ls is off with --overlap */
    double t1 = ps_worker_now();
    if (!k->ov && (rc = cluster_step(p, k->c, k->req, k->ver, s, k->sync, ovf, &remote)))
        return rc;
    if (p->rollback) return rollback(p, k->c, k->req, k->ver, s, next);
    if (p->behind) return catch_up(k, s, next);
    if (p->rebuild || p->resync) return rebuild(k, s, next);
    if (k->sync && ps_client_epochs_seen(k->c) > (unsigned)p->nepochs && (rc = elastic_sync(k)))
        return rc;
    if (ovf && k->sync && !remote)
        /* Our flagged pushes were skipped, yet no reply says so: a psd
         * without the echo; the other workers cannot know either. */
        ps_warn("step %" PRIu64 ": overflow pushed but no server reported the skip: "
                "workers' loss scales may diverge (psd too old?)", s);
    /* Async / bounded staleness: no step is shared, each worker's own
     * overflow is its verdict (psd drops just that push). */
    ps_worker_ls_finish(p, s, PS_WORKER_LS_WHERE(ovf), ovf || (k->sync && remote));
    double t2 = ps_worker_now();
    /* --overlap: the waits inside compute and after it are communication */
    ps_worker_record_step(p, s, loss, t2 - t0, t1 - t0 - t_wait, t2 - t1 + t_wait);
    /* rank 0 validated: the others wait here, not in a PUSHPULL */
    if (ps_worker_validate(p, s + 1) && (rc = ps_client_barrier(k->c))) {
        ps_error("validation barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(k->c));
        return rc;
    }
    return 0;
}

/* Sync: the steps each rank contributed, as the servers counted them (the
 * largest count over servers: one that owns nothing counts nothing), into
 * p->rank_steps for the final line.  Best effort: left "" on a failure. */
static void count_rank_steps(ps_worker_t *p, ps_client_t *c)
{
    uint64_t most[64] = {0};
    int n = 0; /* every rank the servers list (an elastic job's joiners too) */
    for (uint32_t s = 0; s < p->table.nservers; s++) {
        char *json = NULL;
        if (ps_client_stats(c, (int)s, &json) || !json) return;
        const char *k = strstr(json, "\"workers\":[");
        int r = 0;
        for (; k && r < 64 && (k = strstr(k, "\"steps\":")); r++) {
            uint64_t v = strtoull(k + 8, NULL, 10);
            most[r] = v > most[r] ? v : most[r];
            k += 8;
        }
        n = r > n ? r : n;
        free(json);
    }
    size_t len = 0;
    for (int r = 0; r < n && len < sizeof p->rank_steps; r++)
        len += (size_t)snprintf(p->rank_steps + len, sizeof p->rank_steps - len, "%s%llu",
                                r ? "," : "", (unsigned long long)most[r]);
}

/* Everyone finished: in async modes the newest weights are on the servers,
 * so every rank reads them back before evaluating / saving; a second
 * barrier, so that nobody still pulls when rank 0 shuts the servers down. */
static int cluster_end(cluster_t *k)
{
    ps_worker_t *p = k->p;
    int rc;
    if ((rc = ps_client_barrier(k->c))) {
        ps_error("final barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(k->c));
        return rc;
    }
    if (k->sync) count_rank_steps(p, k->c);
    if ((rc = pull_all(p, k->c, k->req, k->ver)) || (rc = ps_worker_finish(p, p->o->steps)))
        return rc;
    if ((rc = ps_client_barrier(k->c))) {
        ps_error("exit barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(k->c));
        return rc;
    }
    if (p->rank == 0 && p->o->shutdown_servers && (rc = ps_client_shutdown_servers(k->c))) {
        ps_error("SHUTDOWN of the servers failed: %s (%s)", ps_strerror(rc),
                 ps_client_last_error(k->c));
        return rc;
    }
    return 0;
}

static int cluster_train(cluster_t *k)
{
    ps_worker_t *p = k->p;
    uint64_t start = 0;
    int rc;
    if (k->ov && p->o->debug_die_mid_step >= 0) {
        ps_error("--debug-die-mid-step needs --overlap off (it splits the plain loop's pushes)");
        return PS_EINVAL;
    }
    if ((rc = cluster_begin(k, &start)) || (rc = ps_worker_bn_open_side(p, k->c)) ||
        (rc = ps_worker_start(p)))
        return rc;
    if (p->o->prec.ls_on && (rc = ps_loss_scale_init(&p->ls, &p->o->prec.ls_cfg))) return rc;
    if (k->sync && start > 0 && (rc = restore_loss_scale(p, k->c, start))) return rc;
    ps_client_counters_t c0, c1;
    ps_client_counters(k->c, &c0);
    p->st.t_start = ps_worker_now();
    uint64_t s = start, next;
    /* While it trains, a sync worker's first SIGTERM leaves the job
     * gracefully at the next step boundary (drain_self); the handler
     * resets itself, so a second SIGTERM stops it at once, as before and
     * after the loop. */
    struct sigaction sa = {.sa_handler = on_sigterm, .sa_flags = SA_RESETHAND}, old_sa;
    if (k->sync) sigaction(SIGTERM, &sa, &old_sa);
    for (; s < p->o->steps && !p->drained && !rc; s = next) {
        p->steps_done = s;
        rc = cluster_one(k, s, &next);
    }
    if (k->sync && !sigterm_seen) sigaction(SIGTERM, &old_sa, NULL);
    if (rc) return rc;
    ps_client_counters(k->c, &c1);
    p->st.wire_sent = c1.bytes_out - c0.bytes_out;
    p->st.wire_recv = c1.bytes_in - c0.bytes_in;
    /* drained: the others go on; this rank's part ends here */
    if (p->drained) return ps_worker_finish(p, p->steps_done);
    return cluster_end(k);
}

int ps_worker_run_cluster(ps_worker_t *p)
{
    ps_client_t *c = NULL;
    ps_worker_overlap_t *ov = NULL;
    int rc, sync = !strcmp(p->o->mode, "sync");
    char *spec = NULL;
    ps_req_t **req = calloc(p->table.nparts, sizeof *req);
    uint64_t *ver = calloc(p->table.nparts, sizeof *ver);

    if (!req || !ver) {
        rc = PS_ENOMEM;
        goto out;
    }
    if (p->o->join && !(p->task->flags & PS_TASK_ELASTIC)) {
        ps_error("--join: the %s task shards its data once, at start; joining a running job "
                 "needs --model smoke for now", p->task->name);
        rc = PS_EINVAL;
        goto out;
    }
    if ((rc = ps_worker_bn_prepare(p)) || (rc = ps_worker_client_connect(p, &c)))
        goto out;
    /* --replicate-state: the client gives a server that lost its state the
     * spec and the partitions kept here as soon as it says so */
    if (p->o->replicate_state && sync &&
        (!(spec = ps_worker_spec_json(p)) || ps_client_set_spec(c, spec))) {
        rc = PS_ENOMEM;
        goto out;
    }
    if ((rc = ps_worker_overlap_new(p, c, req, ver, sync, &ov)))
        goto out;

    cluster_t k = {p, c, req, ver, ov, sync};
    rc = cluster_train(&k);
out:
    /* The BYE tells the servers how this worker's part ended: finished, or
     * failed with its first error (then they stop the job for everyone,
     * rather than let the others train on with fewer). */
    if (c && !rc) {
        ps_client_set_outcome(c, PS_CLIENT_DONE, 0, NULL);
    } else if (c) {
        char why[512];
        ps_log_first_error(why, sizeof why);
        ps_client_set_outcome(c, PS_CLIENT_FAILED, rc, why[0] ? why : ps_strerror(rc));
    }
    /* Destroying the client stops its I/O thread before the buffers that
     * in-flight requests point into (p->w, p->grad, the overlap's) are
     * freed; the overlap's communication thread is idle between steps. */
    ps_client_destroy(&c);
    ps_worker_overlap_free(&ov);
    free(spec);
    free(req);
    free(ver);
    return rc;
}
