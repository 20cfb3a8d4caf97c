/* psd checkpoint writes (the format: psd_checkpoint_internal.h): the
 * shard's state copied on the loop thread, written on libuv's thread pool
 * (at most one write in flight, requests meanwhile coalesced), the outcome
 * counted, logged and answered to the CHECKPOINT requests it covers; the
 * aligned snapshots of --checkpoint-every-steps. */
#include "psd_checkpoint_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

/* A checkpoint taken on the loop thread and written on a pool thread: the
 * writer refers only to the job's own copies (`data`), so the loop may go
 * on changing the live weights while the file is written and fsync'd. */
struct psd_ckpt_job {
    ps_st_writer_t *w;
    float *data;            /* copies of every tensor in the writer */
    char path[4096];
    char marker[4096];      /* the failure note (psd_checkpoint_marker_update) */
    char err[512];
    int rc;
    uint64_t seq, updates;
    uint64_t vmin, vmax;    /* versions of the partitions in the file */
    uint64_t aligned;       /* the aligned version k*N the file holds (0: none) */
    uint32_t nparts;
    size_t bytes;
    double t0, t_snap;      /* start, end of the snapshot */
};

static void job_free(psd_ckpt_job_t *j)
{
    if (!j) return;
    ps_st_writer_destroy(&j->w);
    free(j->data);
    free(j);
}

/* Lowest and highest version of the owned partitions; 0 when there is none
 * or one has no weights yet. */
int psd_checkpoint_versions(const psd_t *s, uint64_t *vmin, uint64_t *vmax)
{
    int any = 0;
    *vmin = UINT64_MAX, *vmax = 0;
    for (uint32_t i = 0; i < s->st.table.nparts; i++) {
        const psd_part_t *p = &s->st.parts[i];
        if (!p->owned) continue;
        if (!p->initialised) return 0;
        *vmin = p->version < *vmin ? p->version : *vmin;
        *vmax = p->version > *vmax ? p->version : *vmax;
        any = 1;
    }
    return any;
}

/* The version k*N (--checkpoint-every-steps, sync) every owned partition
 * is at, which a rollback can restore; 0 when they are not. */
uint64_t psd_checkpoint_aligned_version(const psd_t *s)
{
    uint64_t n = (uint64_t)s->o.checkpoint_every_steps, lo, hi;
    if (!n || s->mode != PSD_SYNC || !psd_checkpoint_versions(s, &lo, &hi) || lo != hi || !lo ||
        lo % n)
        return 0;
    return lo;
}

/* The tensors of one partition into the job (at *dst, advanced): w.i, m.i
 * and g.i.r per pending rank, the CRC over them, and its `versions` entry. */
static int snap_part(psd_t *s, psd_ckpt_job_t *j, uint32_t i, float **dst, uint32_t *crc, cJSON *vers)
{
    psd_part_t *p = &s->st.parts[i];
    int W = s->st.nworkers, rc;
    char names[32];
    int64_t shape[1] = {(int64_t)p->numel};
    size_t nb = p->numel * sizeof(float);
    for (int k = 0; k < 2 + W; k++) {
        if (k >= 2 && (!p->slots || !p->have[k - 2])) continue;
        memcpy(*dst, k == 0 ? p->w : k == 1 ? p->m : psd_store_slot(p, k - 2), nb);
        if (k < 2) snprintf(names, sizeof names, "%c.%u", k ? 'm' : 'w', i);
        else snprintf(names, sizeof names, "g.%u.%d", i, k - 2);
        if ((rc = ps_st_writer_add(j->w, names, PS_ST_F32, 1, shape, *dst))) return rc;
        *crc = ps_crc32c(*crc, *dst, nb);
        *dst += p->numel;
        j->bytes += nb;
    }
    cJSON *e = cJSON_CreateArray(), *pend = cJSON_CreateArray(), *last = cJSON_CreateArray();
    if (!e || !pend || !last) {
        cJSON_Delete(e), cJSON_Delete(pend), cJSON_Delete(last);
        return PS_ENOMEM;
    }
    cJSON_AddItemToArray(e, cJSON_CreateNumber(i));
    cJSON_AddItemToArray(e, cJSON_CreateNumber((double)p->version));
    cJSON_AddItemToArray(e, cJSON_CreateNumber(p->initialised));
    cJSON_AddItemToArray(e, cJSON_CreateNumber(p->overflow));
    for (int r = 0; r < W; r++) {
        cJSON_AddItemToArray(last, cJSON_CreateNumber((double)p->last_iter[r]));
        if (p->slots && p->have[r]) cJSON_AddItemToArray(pend, cJSON_CreateNumber(r));
    }
    cJSON_AddItemToArray(e, pend);
    cJSON_AddItemToArray(e, last);
    cJSON_AddItemToArray(vers, e);
    return 0;
}

/* The metadata of the file (see psd_checkpoint_internal.h). */
static int snap_meta(psd_t *s, psd_ckpt_job_t *j, const char *vjson, uint32_t crc)
{
    psd_store_t *st = &s->st;
    char num[64];
    int rc;
    snprintf(num, sizeof num, "%d", s->o.server_id);
    if ((rc = ps_st_writer_meta(j->w, "format", CKPT_FORMAT)) ||
        (rc = ps_st_writer_meta(j->w, "server_id", num)) ||
        (rc = ps_st_writer_meta(j->w, "spec", st->spec_json)) ||
        (rc = ps_st_writer_meta(j->w, "optim", st->optim_json ? st->optim_json : "{}")) ||
        (rc = ps_st_writer_meta(j->w, "versions", vjson)))
        return rc;
    snprintf(num, sizeof num, "%016llx", (unsigned long long)st->table.hash);
    if ((rc = ps_st_writer_meta(j->w, "table_hash", num))) return rc;
    snprintf(num, sizeof num, "%llu", (unsigned long long)st->updates);
    if ((rc = ps_st_writer_meta(j->w, "updates", num))) return rc;
    char *skips = psd_skips_json(st), *steps = psd_members_steps_json(s);
    char *epochs = s->nepochs ? psd_elastic_json(s) : NULL;
    rc = skips && steps && (epochs || !s->nepochs) ? ps_st_writer_meta(j->w, "skipped_steps", skips)
                                                   : PS_ENOMEM;
    if (!rc) rc = ps_st_writer_meta(j->w, "rank_steps", steps);
    if (!rc && epochs) rc = ps_st_writer_meta(j->w, "epochs", epochs);
    free(skips);
    free(steps);
    free(epochs);
    if (rc) return rc;
    snprintf(num, sizeof num, "%08x", crc);
    return ps_st_writer_meta(j->w, "data_crc32c", num);
}

/* Copy the shard's state into a new job (loop thread).  NULL on failure,
 * with the cause in err. */
static psd_ckpt_job_t *snapshot(psd_t *s, char *err, size_t errlen)
{
    psd_store_t *st = &s->st;
    int rc = PS_ENOMEM;
    int W = st->nworkers;
    psd_ckpt_job_t *j = calloc(1, sizeof *j);
    cJSON *vers = cJSON_CreateArray();
    char *vjson = NULL;
    if (!j || !vers) goto out;
    j->t0 = psd_now_s();
    size_t total = 0;
    for (uint32_t i = 0; i < st->table.nparts; i++) {
        const psd_part_t *p = &st->parts[i];
        if (!p->owned) continue;
        size_t k = 2;
        for (int r = 0; r < W; r++) k += p->slots && p->have[r];
        total += k * p->numel;
    }
    j->w = ps_st_writer_new();
    j->data = malloc((total ? total : 1) * sizeof(float));
    if (!j->w || !j->data) goto out;
    float *dst = j->data;
    uint32_t crc = 0;
    for (uint32_t i = 0; i < st->table.nparts; i++)
        if (st->parts[i].owned && (rc = snap_part(s, j, i, &dst, &crc, vers))) goto out;
    rc = PS_ENOMEM;
    if (!(vjson = cJSON_PrintUnformatted(vers)) || (rc = snap_meta(s, j, vjson, crc))) goto out;
    /* Sequence numbers are taken here, in snapshot order, so files sort
     * by the state they hold. */
    j->seq = ++s->ckpt_seq;
    j->updates = st->updates;
    j->nparts = st->nowned;
    if (!psd_checkpoint_versions(s, &j->vmin, &j->vmax)) j->vmin = j->vmax = 0;
    j->aligned = psd_checkpoint_aligned_version(s);
    psd_checkpoint_path(j->path, sizeof j->path, s->o.checkpoint_dir, s->o.server_id, j->seq);
    psd_checkpoint_marker_path(j->marker, sizeof j->marker, s->o.checkpoint_dir, s->o.server_id);
    j->t_snap = psd_now_s();
    rc = 0;
out:
    if (rc) {
        snprintf(err, errlen, "snapshot of the shard: %s", ps_strerror(rc));
        job_free(j);
        j = NULL;
    }
    free(vjson);
    cJSON_Delete(vers);
    return j;
}

/* The newest durable checkpoint, for log lines. */
static void durable_desc(const psd_t *s, char *buf, size_t cap)
{
    if (s->have_ckpt) snprintf(buf, cap, "version %llu", (unsigned long long)s->ckpt_version);
    else snprintf(buf, cap, "none");
}

/* A failed checkpoint write (any kind, at any stage): counted, kept for
 * STATS, logged with what it was and the cause; a failure that repeats
 * every step is logged at most once every CKPT_FAIL_LOG_S seconds. */
#define CKPT_FAIL_LOG_S 10.0
static void record_failure(psd_t *s, const char *what, const char *cause)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    s->mx.ckpt_failures++;
    s->mx.ckpt_fail_time = now.tv_sec + now.tv_nsec * 1e-9;
    snprintf(s->mx.ckpt_error, sizeof s->mx.ckpt_error, "%s", cause);
    double t = psd_now_s();
    if (s->ckpt_fail_logged > 0 && t - s->ckpt_fail_logged < CKPT_FAIL_LOG_S) {
        s->ckpt_fail_quiet++;
        return;
    }
    char dur[64], quiet[96] = "";
    durable_desc(s, dur, sizeof dur);
    if (s->ckpt_fail_quiet)
        snprintf(quiet, sizeof quiet, ", %llu of them since the previous line not logged",
                 (unsigned long long)s->ckpt_fail_quiet);
    ps_error("checkpoint %s not written: %s (%llu failed write(s) so far%s; newest durable "
             "checkpoint: %s)", what, cause, (unsigned long long)s->mx.ckpt_failures, quiet, dur);
    s->ckpt_fail_logged = t;
    s->ckpt_fail_quiet = 0;
}

static void record_success(psd_t *s, const psd_ckpt_job_t *j)
{
    s->mx.ckpt_writes++;
    /* One write at a time, in snapshot order: this file is the newest. */
    s->ckpt_version = j->vmin;
    s->have_ckpt = 1;
    if (j->aligned) s->aligned_v = j->aligned;
    if (s->ckpt_fail_logged > 0)
        ps_warn("checkpoint writes succeed again (%llu failed before)",
                (unsigned long long)s->mx.ckpt_failures);
    s->ckpt_fail_logged = 0;
    s->ckpt_fail_quiet = 0;
}

/* The slow part, off the loop thread: write, fsync, rename, fsync dir;
 * then the failure note. */
static void job_save(psd_ckpt_job_t *j)
{
    j->rc = ps_st_writer_save(j->w, j->path, j->err, sizeof j->err);
    if (j->rc && !j->err[0]) snprintf(j->err, sizeof j->err, "%s", ps_strerror(j->rc));
    psd_checkpoint_marker_update(j->marker, j->rc != 0, j->err);
}

/* Back on the loop thread: count, log, prune, remember. */
static int job_finish(psd_t *s, psd_ckpt_job_t *j)
{
    if (j->rc) {
        char what[4200];
        snprintf(what, sizeof what, "%s (versions %llu..%llu%s)", j->path,
                 (unsigned long long)j->vmin, (unsigned long long)j->vmax,
                 j->aligned ? ", aligned" : "");
        record_failure(s, what, j->err);
        return j->rc;
    }
    ps_info("checkpoint written: %s (%u partitions, versions %llu..%llu%s, %.1f MiB, snapshot %.0f ms, "
            "write %.0f ms)", j->path, j->nparts, (unsigned long long)j->vmin,
            (unsigned long long)j->vmax, j->aligned ? ", aligned" : "", j->bytes / 1048576.0,
            (j->t_snap - j->t0) * 1e3, (psd_now_s() - j->t_snap) * 1e3);
    record_success(s, j);
    psd_checkpoint_prune(s);
    return 0;
}

/* The directory, made if missing; PS_EIO recorded as a failed write. */
static int mkdir_ckpt(psd_t *s)
{
    if (mkdir(s->o.checkpoint_dir, 0755) < 0 && errno != EEXIST) {
        char cause[600];
        snprintf(cause, sizeof cause, "mkdir %s: %s", s->o.checkpoint_dir, strerror(errno));
        record_failure(s, "directory", cause);
        return PS_EIO;
    }
    return 0;
}

/* mkdir + snapshot; NULL when either failed (recorded). */
static psd_ckpt_job_t *job_new(psd_t *s, int *rc)
{
    char err[512];
    if ((*rc = mkdir_ckpt(s))) return NULL;
    psd_ckpt_job_t *j = snapshot(s, err, sizeof err);
    *rc = j ? 0 : PS_ENOMEM;
    if (!j) record_failure(s, "snapshot", err);
    return j;
}

int psd_checkpoint_write(psd_t *s)
{
    if (!s->st.have_table) return PS_ESTATE;
    int rc;
    s->updates_at_ckpt = s->st.updates;
    psd_ckpt_job_t *j = job_new(s, &rc);
    if (!j) return rc;
    job_save(j);
    rc = job_finish(s, j);
    job_free(j);
    return rc;
}

/* CHECKPOINT requests covered by a write that ended with rc: ACK when the
 * file is durable, else ERROR with the cause. */
static void answer_waiters(psd_t *s, psd_ackwait_t *list, int rc)
{
    while (list) {
        psd_ackwait_t *w = list;
        list = w->next;
        if (rc == 0) {
            psd_send_ack(s, w->id, w->idlen, w->request_id);
        } else {
            Ps__Header q;
            ps_wire_header_init(&q, (Ps__MsgType)w->type);
            q.request_id = w->request_id;
            psd_send_error(s, w->id, w->idlen, &q, rc, "server %d: checkpoint not written: %s",
                           s->o.server_id, s->mx.ckpt_error[0] ? s->mx.ckpt_error : ps_strerror(rc));
        }
        free(w);
    }
    /* These sends may come from outside the poll callback (a write that
     * completed, a signal): the loop re-reads the socket, ZMQ_FD being
     * edge-triggered (inside the poll callback this does nothing). */
    if (s->drain) s->drain(s);
}

static void free_waiters(psd_ackwait_t *w)
{
    while (w) {
        psd_ackwait_t *n = w->next;
        free(w);
        w = n;
    }
}

static void on_work(uv_work_t *req)
{
    job_save(req->data);
}

static int launch(psd_t *s);
static void after_work(uv_work_t *req, int status);

/* Write j on the pool (or here when no pool thread can take it: better
 * than not at all).  Returns 1 when queued (s->ckpt_job = j, finished by
 * after_work), else job_finish's result for the write done here. */
static int queue_job(psd_t *s, psd_ckpt_job_t *j)
{
    s->ckpt_work.data = j;
    int rc = uv_queue_work(s->loop, &s->ckpt_work, on_work, after_work);
    if (rc < 0) {
        ps_warn("uv_queue_work: %s; writing the checkpoint on the loop thread", uv_strerror(rc));
        job_save(j);
        rc = job_finish(s, j);
        job_free(j);
        return rc;
    }
    s->ckpt_job = j;
    return 1;
}

static void after_work(uv_work_t *req, int status)
{
    psd_t *s = (psd_t *)((char *)req - offsetof(psd_t, ckpt_work));
    psd_ckpt_job_t *j = req->data;
    if (status < 0) {
        j->rc = PS_EIO;
        snprintf(j->err, sizeof j->err, "the write did not run: %s", uv_strerror(status));
    }
    int rc = job_finish(s, j);
    job_free(j);
    s->ckpt_job = NULL;
    /* The waiters' state is in the file just written only if they were
     * queued before its snapshot; later ones wait for the next write. */
    psd_ackwait_t *done = s->ckpt_waiters_done;
    s->ckpt_waiters_done = NULL;
    if (s->stopping) { /* the loop is closing: nobody to answer */
        job_free(s->ckpt_next);
        s->ckpt_next = NULL;
        free_waiters(done);
        return;
    }
    if (s->ckpt_next) { /* an aligned snapshot waited for this write */
        psd_ckpt_job_t *nj = s->ckpt_next;
        s->ckpt_next = NULL;
        queue_job(s, nj);
    }
    answer_waiters(s, done, rc);
    if (s->ckpt_again && !s->ckpt_job) {
        s->ckpt_again = 0;
        rc = launch(s);
        if (rc || !s->ckpt_job) {
            done = s->ckpt_waiters;
            s->ckpt_waiters = NULL;
            answer_waiters(s, done, rc);
        }
    }
    /* Stopping: the write that ended last holds the final state. */
    if (!s->ckpt_job && s->shutting) psd_shutdown_checkpoint_done(s, rc);
}

static int launch(psd_t *s)
{
    /* answer_waiters() drains the socket, and a drained push can reach
     * psd_checkpoint_start() from inside after_work(): the work request may
     * then be queued already.  Queueing it twice would hand one job to two
     * completions (a use-after-free), so follow
     * the write in flight instead. */
    if (s->ckpt_job) {
        s->ckpt_again = 1;
        return 0;
    }
    int rc;
    s->updates_at_ckpt = s->st.updates;
    psd_ckpt_job_t *j = job_new(s, &rc);
    if (!j) return rc;
    if ((rc = queue_job(s, j)) != 1) return rc; /* written here already */
    /* Everyone waiting so far is covered by this snapshot. */
    psd_ackwait_t **tail = &s->ckpt_waiters_done;
    while (*tail) tail = &(*tail)->next;
    *tail = s->ckpt_waiters;
    s->ckpt_waiters = NULL;
    return 0;
}

int psd_checkpoint_start(psd_t *s, psd_ackwait_t *w)
{
    if (!s->st.have_table) {
        free(w);
        return PS_ESTATE;
    }
    if (w) {
        w->next = s->ckpt_waiters;
        s->ckpt_waiters = w;
    }
    if (s->ckpt_job) { /* one write at a time: the next one follows it */
        s->ckpt_again = 1;
        return 0;
    }
    int rc = launch(s);
    if (rc || !s->ckpt_job) {
        /* Failed, or written synchronously: answer now. */
        psd_ackwait_t *list = s->ckpt_waiters;
        s->ckpt_waiters = NULL;
        answer_waiters(s, list, rc);
    }
    return rc;
}

/* Sync mode, --checkpoint-every-steps N: every server snapshots when all
 * its partitions are at the same version k*N.  A sync partition can only
 * go past k*N once every worker got every partition at k*N (a worker pushes
 * step k*N after its whole step k*N-1 came back), so the moment the last
 * owned partition reaches k*N none is beyond it: the snapshot is exactly
 * version k*N on every server, and a rollback to it is consistent.  Taken
 * once per version (aligned_taken); STATS' aligned_checkpoint_version moves
 * only when the file is durable (record_success). */
static void maybe_aligned(psd_t *s)
{
    uint64_t v = psd_checkpoint_aligned_version(s);
    if (!v || v <= s->aligned_taken || s->shutting) return;
    s->aligned_taken = v;
    int rc;
    psd_ckpt_job_t *j = job_new(s, &rc);
    if (!j) return;
    ps_debug("aligned snapshot of version %llu taken: writing %s", (unsigned long long)v, j->path);
    if (s->ckpt_job) {
        /* Only the newest one waits: an older one still queued is dropped
         * (the write in flight keeps the previous version restorable). */
        if (s->ckpt_next) ps_warn("checkpoint writes lag behind --checkpoint-every-steps: one skipped");
        job_free(s->ckpt_next);
        s->ckpt_next = j;
        return;
    }
    queue_job(s, j);
}

void psd_checkpoint_maybe(psd_t *s)
{
    if (!s->o.checkpoint_dir || !s->o.checkpoint_dir[0]) return;
    if (s->o.checkpoint_every_steps > 0 && s->mode == PSD_SYNC && s->st.have_table) maybe_aligned(s);
    if (s->o.checkpoint_every <= 0) return;
    if (s->st.updates - s->updates_at_ckpt >= (uint64_t)s->o.checkpoint_every)
        psd_checkpoint_start(s, NULL);
}

psd_ackwait_t *psd_ackwait_new(const ps_wire_msg_t *m)
{
    psd_ackwait_t *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    psd_reply_keep_id(w->id, &w->idlen, m);
    w->request_id = m->hdr->request_id;
    w->type = m->hdr->type;
    return w;
}
