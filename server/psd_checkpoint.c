/* Shard checkpoints: one safetensors file per checkpoint,
 * DIR/psd-<server>-<seq>.safetensors, holding "w.<part>" (weights) and
 * "m.<part>" (momentum) for every partition this server owns, with metadata:
 *   format       "psd-checkpoint-1"
 *   server_id    this shard
 *   table_hash   hex; spec: the INIT spec JSON (rebuilds the table, optim)
 *   optim        the optimizer config JSON (informational)
 *   versions     JSON [[part, version, initialised, overflow, [pending ranks],
 *                [last iteration + 1 per rank]], ...] in part order
 *   updates      shard updates so far
 *   data_crc32c  hex CRC32C over w.p, m.p, then g.p.r of each pending rank,
 *                in `versions` order
 * "g.<part>.<rank>" are the sync gradients already received (and ACKed) for
 * the current iteration, so a restart does not lose a push that a worker
 * will not send again; the per-rank last iterations keep async retries
 * idempotent across a restart.
 * The writer makes it durable (temp, fsync, rename, fsync dir); the last two
 * are kept, and at start the newest one that verifies is loaded.
 * The state is copied on the loop thread (a memcpy, cheap next to fsync) and
 * written on libuv's thread pool, at most one write in flight.
 * A write that fails (full disk, I/O error, ...) saves nothing: the files
 * before it stand, nothing reports it as done (STATS' checkpoint versions
 * move only on a durable file), it is counted and logged with its cause,
 * a CHECKPOINT request covered by it gets ERROR with that cause, and a
 * failed final checkpoint makes psd exit 1.  A note in the directory
 * (marker_update) lets a restarted server say why it has no checkpoint. */
#include "psd.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

#define CKPT_FORMAT "psd-checkpoint-1"
#define CKPT_KEEP 2

/* Sequence numbers of this server's checkpoint files, newest first. */
static int list_ckpts(const char *dir, int sid, uint64_t **seqs, size_t *n)
{
    DIR *d = opendir(dir);
    *seqs = NULL;
    *n = 0;
    if (!d) return errno == ENOENT ? 0 : PS_EIO;
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "psd-%d-", sid);
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (strncmp(nm, prefix, plen)) continue;
        char *end;
        unsigned long long q = strtoull(nm + plen, &end, 10);
        if (end == nm + plen || strcmp(end, ".safetensors")) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            uint64_t *t = realloc(*seqs, cap * sizeof *t);
            if (!t) break;
            *seqs = t;
        }
        (*seqs)[(*n)++] = q;
    }
    closedir(d);
    /* newest first */
    for (size_t i = 1; i < *n; i++)
        for (size_t j = i; j > 0 && (*seqs)[j] > (*seqs)[j - 1]; j--) {
            uint64_t t = (*seqs)[j];
            (*seqs)[j] = (*seqs)[j - 1];
            (*seqs)[j - 1] = t;
        }
    return 0;
}

/* A writer killed mid-write (SIGKILL, power loss) leaves its temporary file
 * (ps_st_writer_save names it FINAL.tmp.PID) and never a partial FINAL:
 * remove those of this server at start so they do not pile up.  Only one
 * psd per server id uses a directory, so none of them is being written. */
static void remove_stale_tmp(const char *dir, int sid)
{
    DIR *d = opendir(dir);
    if (!d) return;
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "psd-%d-", sid);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, plen) || !strstr(e->d_name, ".safetensors.tmp.")) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) == 0) ps_warn("removed %s (an interrupted checkpoint write)", p);
        else ps_warn("cannot remove stale %s: %s", p, strerror(errno));
    }
    closedir(d);
}

static void ckpt_path(char *buf, size_t cap, const char *dir, int sid, uint64_t seq)
{
    snprintf(buf, cap, "%s/psd-%d-%012llu.safetensors", dir, sid, (unsigned long long)seq);
}

int psd_checkpoint_list(const char *dir, int sid, uint64_t **seqs, size_t *n)
{
    return list_ckpts(dir, sid, seqs, n);
}

void psd_checkpoint_path(char *buf, size_t cap, const char *dir, int sid, uint64_t seq)
{
    ckpt_path(buf, cap, dir, sid, seq);
}

static void prune(psd_t *s)
{
    uint64_t *seqs;
    size_t n;
    if (list_ckpts(s->o.checkpoint_dir, s->o.server_id, &seqs, &n)) return;
    for (size_t i = CKPT_KEEP; i < n; i++) {
        char p[4096];
        ckpt_path(p, sizeof p, s->o.checkpoint_dir, s->o.server_id, seqs[i]);
        if (unlink(p) < 0) ps_warn("cannot remove old checkpoint %s: %s", p, strerror(errno));
    }
    free(seqs);
}

/* A failed write leaves a note, DIR/psd-<server>.ckpt-failed holding
 * "<UTC time> <cause>", which the next write that succeeds removes.  A
 * server restarted after its writes failed finds no checkpoint of the job,
 * and the note is how it can tell the workers why.  Best effort: on a full
 * disk the note may stay empty (creating it needs no data block). */
static void marker_path(char *buf, size_t cap, const char *dir, int sid)
{
    snprintf(buf, cap, "%s/psd-%d.ckpt-failed", dir, sid);
}

/* Pool thread (or the loop thread for a synchronous write). */
static void marker_update(const char *path, int failed, const char *cause)
{
    if (!failed) {
        if (unlink(path) < 0 && errno != ENOENT) ps_warn("cannot remove %s: %s", path, strerror(errno));
        return;
    }
    char stamp[32], line[768];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(line, sizeof line, "%s %s\n", stamp, cause);
    size_t len = (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1);
    /* Overwritten in place, then cut: a note already there keeps its data
     * block, so a full disk cannot take it away between two failures. */
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || pwrite(fd, line, len, 0) != (ssize_t)len || ftruncate(fd, (off_t)len) < 0)
        ps_debug("cannot record the failure in %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
}

/* The note a previous run left: 1 and its text in buf ("" when it could
 * not be written), or 0 when there is none. */
static int marker_read(const char *dir, int sid, char *buf, size_t cap)
{
    char path[4096];
    marker_path(path, sizeof path, dir, sid);
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(buf, (int)cap, f)) buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return 1;
}

/* A checkpoint taken on the loop thread and written on a pool thread: the
 * writer refers only to the job's own copies (`data`), so the loop may go
 * on changing the live weights while the file is written and fsync'd. */
struct psd_ckpt_job {
    ps_st_writer_t *w;
    float *data;            /* copies of every tensor in the writer */
    char path[4096];
    char marker[4096];      /* the failure note (marker_update) */
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
static int shard_versions(const psd_t *s, uint64_t *vmin, uint64_t *vmax)
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
static uint64_t aligned_version(const psd_t *s)
{
    uint64_t n = (uint64_t)s->o.checkpoint_every_steps, lo, hi;
    if (!n || s->mode != PSD_SYNC || !shard_versions(s, &lo, &hi) || lo != hi || !lo || lo % n) return 0;
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

/* The metadata of the file (see the top of this file). */
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
    if (!shard_versions(s, &j->vmin, &j->vmax)) j->vmin = j->vmax = 0;
    j->aligned = aligned_version(s);
    ckpt_path(j->path, sizeof j->path, s->o.checkpoint_dir, s->o.server_id, j->seq);
    marker_path(j->marker, sizeof j->marker, s->o.checkpoint_dir, s->o.server_id);
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
    marker_update(j->marker, j->rc != 0, j->err);
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
    prune(s);
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
static void final_checkpoint_done(psd_t *s, int rc);

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
    if (!s->ckpt_job && s->shutting) final_checkpoint_done(s, rc);
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
    uint64_t v = aligned_version(s);
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

/* Forget a half-loaded state so the next candidate (or INIT) starts clean. */
static void reset_state(psd_t *s)
{
    psd_store_free(&s->st);
    free(s->workers);
    s->workers = NULL;
    s->nworkers = s->w0 = 0;
    free(s->epochs);
    s->epochs = NULL;
    s->nepochs = 0;
    char err[128];
    if (s->o.num_workers > 0) psd_members_set_count(s, s->o.num_workers, err, sizeof err);
}

static int bad(char *err, size_t errlen, const char *fmt, const char *a)
{
    snprintf(err, errlen, fmt, a);
    return PS_ECORRUPT;
}

/* The pending sync gradients and per-rank last iterations of one entry
 * [part, version, init, overflow, [ranks], [last]] (absent in older files).
 * Pending gradients only matter to a sync server; another mode drops them. */
static int load_pending(psd_t *s, const ps_st_file_t *f, psd_part_t *p, const cJSON *e, char *err,
                        size_t errlen)
{
    const cJSON *ovf = cJSON_GetArrayItem(e, 3), *pend = cJSON_GetArrayItem(e, 4),
                *last = cJSON_GetArrayItem(e, 5), *x;
    int W = s->st.nworkers;
    if (cJSON_IsNumber(ovf) && p->slots) p->overflow = ovf->valuedouble != 0;
    if (cJSON_IsArray(last)) {
        int r = 0;
        cJSON_ArrayForEach(x, last)
        {
            if (r < W && cJSON_IsNumber(x) && x->valuedouble >= 0) p->last_iter[r] = (uint64_t)x->valuedouble;
            r++;
        }
    }
    if (!cJSON_IsArray(pend) || !p->slots) return 0;
    cJSON_ArrayForEach(x, pend)
    {
        int r = (int)x->valuedouble;
        char nm[48], rerr[256];
        if (r >= W) {
            snprintf(err, errlen, "partition %u: pending gradient of rank %d but the cluster has %d", p->id,
                     r, W);
            return PS_ECORRUPT;
        }
        snprintf(nm, sizeof nm, "g.%u.%d", p->id, r);
        if (ps_st_read_f32(f, nm, p->slots + (size_t)r * p->numel, p->numel, rerr, sizeof rerr)) {
            snprintf(err, errlen, "%s", rerr);
            return PS_ECORRUPT;
        }
        p->have[r] = 1;
    }
    return 0;
}

/* The metadata of a checkpoint file (pointing into the file). */
typedef struct ckpt_meta {
    const char *fmt, *sid, *spec, *vj, *hash, *crcs, *upd;
} ckpt_meta_t;

/* Read the metadata and check it: the format, every key there, and the
 * file written by this server.  0 or PS_ECORRUPT. */
static int read_meta(psd_t *s, const ps_st_file_t *f, ckpt_meta_t *mt, char *err, size_t errlen)
{
    mt->fmt = ps_st_meta(f, "format");
    mt->sid = ps_st_meta(f, "server_id");
    mt->spec = ps_st_meta(f, "spec");
    mt->vj = ps_st_meta(f, "versions");
    mt->hash = ps_st_meta(f, "table_hash");
    mt->crcs = ps_st_meta(f, "data_crc32c");
    mt->upd = ps_st_meta(f, "updates");
    if (!mt->fmt || strcmp(mt->fmt, CKPT_FORMAT))
        return bad(err, errlen, "metadata format is \"%s\", want " CKPT_FORMAT,
                   mt->fmt ? mt->fmt : "(missing)");
    if (!mt->sid || !mt->spec || !mt->vj || !mt->hash || !mt->crcs)
        return bad(err, errlen,
                   "%smetadata key missing (server_id, spec, versions, table_hash, data_crc32c)", "");
    if (atoi(mt->sid) != s->o.server_id) return bad(err, errlen, "written by server %s", mt->sid);
    return 0;
}

/* The checksum over every tensor that `versions` names (w.p, m.p, then
 * g.p.r of each pending rank), checked before any of the data is trusted.
 * 0 or PS_ECORRUPT. */
static int verify_data(const ps_st_file_t *f, const cJSON *vers, const char *crcs, char *err,
                       size_t errlen)
{
    uint32_t crc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vers)
    {
        const cJSON *id = cJSON_GetArrayItem(e, 0);
        if (!cJSON_IsNumber(id) || id->valuedouble < 0)
            return bad(err, errlen, "%sbad entry in metadata versions", "");
        const cJSON *pend = cJSON_GetArrayItem(e, 4);
        int np = cJSON_IsArray(pend) ? cJSON_GetArraySize(pend) : 0;
        for (int k = 0; k < 2 + np; k++) {
            char nm[48];
            const cJSON *r = k >= 2 ? cJSON_GetArrayItem(pend, k - 2) : NULL;
            if (k >= 2 && (!cJSON_IsNumber(r) || r->valuedouble < 0 || r->valuedouble > 65535))
                return bad(err, errlen, "%sbad pending rank in metadata versions", "");
            if (k < 2) snprintf(nm, sizeof nm, "%c.%u", k ? 'm' : 'w', (unsigned)id->valuedouble);
            else snprintf(nm, sizeof nm, "g.%u.%d", (unsigned)id->valuedouble, (int)r->valuedouble);
            const ps_st_tensor_t *t = ps_st_find(f, nm);
            if (!t || t->dtype != PS_ST_F32) return bad(err, errlen, "tensor %s missing or not F32", nm);
            crc = ps_crc32c(crc, ps_st_tensor_data(f, t), t->nbytes);
        }
    }
    if (strtoul(crcs, NULL, 16) != crc) {
        snprintf(err, errlen, "data checksum mismatch (metadata %s, computed %08x)", crcs, crc);
        return PS_ECORRUPT;
    }
    return 0;
}

/* Every entry of `versions` into the shard just built from the file's
 * spec: weights, momentum, version, pending state; each one must be a
 * partition of this shard, and every partition of it must be there.
 * 0 or PS_ECORRUPT (the state is then half-loaded: reset_state). */
static int load_parts(psd_t *s, const ps_st_file_t *f, const cJSON *vers, char *err, size_t errlen)
{
    psd_store_t *st = &s->st;
    uint32_t loaded = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vers)
    {
        const cJSON *id = cJSON_GetArrayItem(e, 0), *v = cJSON_GetArrayItem(e, 1),
                    *ini = cJSON_GetArrayItem(e, 2);
        uint32_t i = (uint32_t)id->valuedouble;
        if (i >= st->table.nparts || !st->parts[i].owned || !cJSON_IsNumber(v) || v->valuedouble < 0 ||
            !cJSON_IsNumber(ini)) {
            snprintf(err, errlen, "partition %u in metadata versions is not one of this shard's", i);
            return PS_ECORRUPT;
        }
        psd_part_t *p = &st->parts[i];
        char nm[32], rerr[256];
        snprintf(nm, sizeof nm, "w.%u", i);
        psd_store_weights_writable(s, p);
        int rc = ps_st_read_f32(f, nm, p->w, p->numel, rerr, sizeof rerr);
        if (rc == 0) {
            nm[0] = 'm';
            rc = ps_st_read_f32(f, nm, p->m, p->numel, rerr, sizeof rerr);
        }
        if (rc) {
            snprintf(err, errlen, "%s", rerr);
            return PS_ECORRUPT;
        }
        p->version = (uint64_t)v->valuedouble;
        p->initialised = ini->valuedouble != 0;
        if ((rc = load_pending(s, f, p, e, err, errlen))) return rc;
        loaded++;
    }
    if (loaded != st->nowned) {
        snprintf(err, errlen, "holds %u of the shard's %u partitions", loaded, st->nowned);
        return PS_ECORRUPT;
    }
    return 0;
}

/* Verify and load one file; on failure the server state is left empty. */
static int try_load(psd_t *s, const char *path, char *err, size_t errlen)
{
    ps_st_file_t f;
    int rc = ps_st_open(&f, path, err, errlen);
    if (rc) return rc;
    ckpt_meta_t mt;
    cJSON *vers = NULL;
    if ((rc = read_meta(s, &f, &mt, err, errlen))) goto out;
    vers = cJSON_Parse(mt.vj);
    if (!cJSON_IsArray(vers)) {
        rc = bad(err, errlen, "metadata versions is not a JSON array: %.60s", mt.vj);
        goto out;
    }
    if ((rc = verify_data(&f, vers, mt.crcs, err, errlen))) goto out;
    /* The table, cluster size and message-size bound the spec implies, as
     * an INIT of it would set them. */
    uint64_t want = strtoull(mt.hash, NULL, 16);
    char serr[512] = "";
    if ((rc = psd_spec_hold(s, mt.spec, strlen(mt.spec), &want, serr, sizeof serr))) {
        snprintf(err, errlen, "stored spec: %s", serr);
        reset_state(s);
        goto out;
    }
    if ((rc = load_parts(s, &f, vers, err, errlen))) {
        reset_state(s);
        goto out;
    }
    psd_store_t *st = &s->st;
    const char *skips = ps_st_meta(&f, "skipped_steps"); /* absent: an older file */
    if (skips && (rc = psd_skips_parse(st, skips, err, errlen))) {
        reset_state(s);
        goto out;
    }
    psd_members_steps_load(s, ps_st_meta(&f, "rank_steps"));
    const char *epochs = ps_st_meta(&f, "epochs");
    if (epochs && (rc = psd_elastic_parse(s, epochs, err, errlen))) {
        reset_state(s);
        goto out;
    }
    st->updates = mt.upd ? strtoull(mt.upd, NULL, 10) : 0;
    st->from_ckpt = 1;
    s->updates_at_ckpt = st->updates;
    s->table_hash_seen = st->table.hash;
    s->have_hash_seen = 1;
out:
    cJSON_Delete(vers);
    ps_st_close(&f);
    return rc;
}

/* After a checkpoint was loaded: what STATS reports of it, and a warning
 * when the previous run's last write had failed (the file is older than
 * the state that server reached). */
static void loaded(psd_t *s, const char *path, const char *note, int noted)
{
    uint64_t vmin = 0, vmax = 0;
    if (!shard_versions(s, &vmin, &vmax)) vmin = vmax = 0;
    s->ckpt_version = vmin;
    s->have_ckpt = 1;
    if ((s->aligned_v = aligned_version(s))) s->aligned_taken = s->aligned_v;
    ps_info("loaded checkpoint %s: %u partitions, versions %llu..%llu, table 0x%016llx", path,
            s->st.nowned, (unsigned long long)vmin, (unsigned long long)vmax,
            (unsigned long long)s->st.table.hash);
    if (noted)
        ps_warn("the last checkpoint write before this start failed (%s): resumed from the newest "
                "file that exists, older than the state this server had reached",
                note[0] ? note : "cause not recorded");
}

int psd_checkpoint_load(psd_t *s)
{
    const char *dir = s->o.checkpoint_dir;
    if (!dir || !dir[0]) return 0;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        ps_error("--checkpoint-dir %s: %s", dir, strerror(errno));
        return PS_EIO;
    }
    remove_stale_tmp(dir, s->o.server_id);
    uint64_t *seqs;
    size_t n;
    if (list_ckpts(dir, s->o.server_id, &seqs, &n)) {
        ps_error("--checkpoint-dir %s: cannot list: %s", dir, strerror(errno));
        return PS_EIO;
    }
    char note[600];
    int noted = marker_read(dir, s->o.server_id, note, sizeof note);
    if (n) s->ckpt_seq = seqs[0]; /* new files sort after every existing one */
    for (size_t i = 0; i < n; i++) {
        char path[4096], err[1024] = "";
        ckpt_path(path, sizeof path, dir, s->o.server_id, seqs[i]);
        int lrc = try_load(s, path, err, sizeof err);
        if (lrc == 0) {
            loaded(s, path, note, noted);
            free(seqs);
            return 0;
        }
        ps_warn("checkpoint %s unusable: %s%s", path, err,
                i + 1 < n ? "; trying the previous one" : "");
        /* Set a corrupt file aside so it does not count as one of the
         * checkpoints kept, and so the next start does not try it again. */
        if (lrc == PS_ECORRUPT) {
            char aside[4200];
            snprintf(aside, sizeof aside, "%s.corrupt", path);
            if (rename(path, aside) == 0) ps_warn("renamed to %s", aside);
        }
    }
    /* No state: a worker of a job under way will be told why. */
    if (noted && note[0])
        snprintf(s->ckpt_none, sizeof s->ckpt_none, "its last write failed: %s", note);
    else if (noted)
        snprintf(s->ckpt_none, sizeof s->ckpt_none,
                 "its last write failed; the cause could not be recorded, the disk may be full");
    else if (n)
        snprintf(s->ckpt_none, sizeof s->ckpt_none, "none of the %zu file(s) in %s is usable", n, dir);
    else
        snprintf(s->ckpt_none, sizeof s->ckpt_none, "none in %s", dir);
    if (n || noted)
        ps_error("no usable checkpoint in %s (%s): starting empty (INIT will set the weights)", dir,
                 s->ckpt_none);
    free(seqs);
    return 0;
}

void psd_checkpoint_why_none(const psd_t *s, char *buf, size_t cap)
{
    if (!s->o.checkpoint_dir || !s->o.checkpoint_dir[0])
        snprintf(buf, cap, "server %d holds no state of this job: no INIT since it started, and it "
                 "runs without --checkpoint-dir (a restart loses the job)", s->o.server_id);
    else
        snprintf(buf, cap, "server %d has no checkpoint of this job (%s) and no INIT since it started",
                 s->o.server_id, s->ckpt_none[0] ? s->ckpt_none : "none loaded");
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

#define PSD_LINGER_MS 300

/* The end of an orderly stop: psd_loop_run returns. */
static void on_linger(uv_timer_t *t)
{
    psd_t *s = t->data;
    if (s->stopping) return;
    s->stopping = 1;
    ps_info("stopping: shutdown complete");
    uv_stop(s->loop);
}

/* SHUTDOWN requests get ACK once the final checkpoint's outcome is known:
 * the server stops either way.  When that checkpoint failed the ACK's body
 * says so (and psd exits 1). */
static void answer_shutdown(psd_t *s)
{
    psd_ackwait_t *list = s->shutdown_waiters;
    char body[800] = "";
    s->shutdown_waiters = NULL;
    if (s->final_rc)
        snprintf(body, sizeof body, "server %d stops without a final checkpoint (exit status 1): %s",
                 s->o.server_id, s->mx.ckpt_error);
    while (list) {
        psd_ackwait_t *w = list;
        list = w->next;
        Ps__Header h;
        ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
        h.has_request_id = 1, h.request_id = w->request_id;
        if (body[0]) h.has_body = 1, h.body.data = (uint8_t *)body, h.body.len = strlen(body);
        psd_send(s, w->id, w->idlen, &h, NULL, 0);
        free(w);
    }
    if (s->drain) s->drain(s);
}

/* Answer, and keep the loop (and the socket) up a little, so the ACKs just
 * queued leave before the socket closes, and retries still get an answer. */
static void shutdown_finish(psd_t *s)
{
    /* Asked to (SHUTDOWN): the job ends here, and its workers are told at
     * once rather than retrying into a closed socket.  A signal may be a
     * restart: the workers keep retrying (and say whom they wait for). */
    int notify = s->shutdown_asked && !uv_is_active((uv_handle_t *)&s->linger_timer);
    answer_shutdown(s); /* first: the requester's own wait ends with its ACK */
    if (notify)
        psd_members_notify_shutdown(s, "asked to by a SHUTDOWN request (psctl shutdown, or "
                                       "rank 0's --shutdown-servers)");
    if (!uv_is_active((uv_handle_t *)&s->linger_timer))
        uv_timer_start(&s->linger_timer, on_linger, PSD_LINGER_MS, 0);
}

/* The final checkpoint ended with rc (0: durable).  A server that could
 * not save its state must not look like one that did: exit status 1. */
static void final_checkpoint_done(psd_t *s, int rc)
{
    if (s->final_done) return;
    s->final_done = 1;
    s->final_rc = rc;
    if (rc) {
        s->exit_code = 1;
        if (s->have_ckpt)
            ps_error("final checkpoint not written: %s; stopping anyway, exit status 1 (newest durable "
                     "checkpoint: version %llu; the updates since are lost)", s->mx.ckpt_error,
                     (unsigned long long)s->ckpt_version);
        else
            ps_error("final checkpoint not written: %s; stopping anyway, exit status 1 (no durable "
                     "checkpoint: this shard's state is lost)", s->mx.ckpt_error);
    }
    shutdown_finish(s);
}

void psd_shutdown_begin(psd_t *s, const char *why, psd_ackwait_t *w)
{
    if (s->stopping) {
        free(w);
        return;
    }
    if (w) {
        w->next = s->shutdown_waiters;
        s->shutdown_waiters = w;
        s->shutdown_asked = 1;
    }
    if (!s->shutting) {
        int save = s->o.checkpoint_dir && s->o.checkpoint_dir[0] && s->st.have_table;
        s->shutting = 1;
        ps_info("shutting down (%s): no further updates%s", why ? why : "?",
                save ? "; checkpointing first" : "");
        if (!save) {
            final_checkpoint_done(s, 0);
            return;
        }
        int rc = psd_checkpoint_start(s, NULL);
        if (!s->ckpt_job) final_checkpoint_done(s, rc); /* written here, or failed */
        return; /* else after_work ends the stop */
    }
    /* A repeated SHUTDOWN (a retry) or a signal: answered like the first
     * once the final checkpoint's outcome is known. */
    if (s->final_done) shutdown_finish(s);
}
