/* Worker membership: rank assignment at HELLO (server 0), liveness from any
 * message a worker sends (HEARTBEAT included), BARRIER and BYE.  Once the
 * job has started on this server (a barrier was released or a gradient
 * pushed), a worker that has spoken and then stays silent for
 * --worker-timeout-ms is marked lost (one never heard from is waited for).
 * Before that nobody is: a slow-starting worker must not let the start
 * barrier go without it, or the job would train with fewer than W workers
 * (and that worker's own BARRIER would then wait for workers that are no
 * longer coming to it).  With --on-worker-loss=continue (default) a lost
 * worker no longer holds up barriers or sync updates (they proceed with the
 * workers that remain, averaging over those who pushed); with wait they
 * keep waiting for it.  Either way it is live again as soon as it sends
 * anything (HELLO with its rank, a heartbeat, a push).
 *
 * BARRIER is answered once per request: the ACK can be lost (ROUTER_MANDATORY
 * drops it when the worker's connection came back under a new ZeroMQ
 * identity, or the worker was paused), and the worker then resends the same
 * request_id.  A resend of the barrier last released for that rank is
 * answered again at once; queued, it would wait for workers that have long
 * gone past that barrier (they train, the job never has W workers again). */
#include "psd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

int psd_members_set_count(psd_t *s, int n, char *err, size_t errlen)
{
    if (n <= 0 || n > 65536) {
        snprintf(err, errlen, "num_workers %d out of range 1..65536", n);
        return PS_ERANGE;
    }
    if (s->w0 == n) return 0;
    if (s->w0 > 0) {
        snprintf(err, errlen, "num_workers %d differs from the cluster size %d", n, s->w0);
        return PS_EMISMATCH;
    }
    /* an elastic job has room for --max-workers ranks */
    int cap = s->o.max_workers > n ? s->o.max_workers : n;
    s->workers = calloc(cap, sizeof *s->workers);
    if (!s->workers) {
        snprintf(err, errlen, "out of memory for %d workers", cap);
        return PS_ENOMEM;
    }
    uint64_t now = uv_now(s->loop);
    for (int r = 0; r < cap; r++) s->workers[r].last_seen_ms = now;
    s->nworkers = cap;
    s->w0 = n;
    ps_info("cluster size: %d workers", n);
    int rc = psd_elastic_init(s);
    if (rc) snprintf(err, errlen, "--max-workers: at most 64 in an elastic job");
    return rc;
}

/* Heard from and neither silent nor gone: a rank never heard from is not
 * live (it is still waited for: psd_members_required). */
int psd_members_is_live(const psd_t *s, int r)
{
    return r >= 0 && r < s->nworkers && s->workers[r].state == PSD_W_LIVE;
}

int psd_members_required(const psd_t *s, int r, uint64_t v)
{
    if (!psd_elastic_active(s, r, v)) return 0;
    psd_wstate_t st = s->workers[r].state;
    if (st == PSD_W_UNKNOWN || st == PSD_W_LIVE) return 1;
    /* --on-worker-loss=wait (the default): a lost worker, or one that left
     * before the end, is waited for: a sync job of W workers never goes on
     * with fewer unless the user chose continue. */
    return !s->o.loss_continue && (st == PSD_W_LOST || st == PSD_W_LEFT);
}

int psd_members_live_count(const psd_t *s)
{
    int n = 0;
    for (int r = 0; r < s->nworkers; r++) n += psd_members_is_live(s, r);
    return n;
}

int psd_members_rank_of(const psd_t *s, const ps_wire_msg_t *m)
{
    const Ps__Header *h = m->hdr;
    if (!h->has_session || !h->session) return -1;
    for (int r = 0; r < s->nworkers; r++)
        if (s->workers[r].assigned && s->workers[r].session == h->session) return r;
    return -1;
}

void psd_members_count_step(psd_t *s, int r)
{
    if (r >= 0 && r < s->nworkers) s->workers[r].steps++;
}

char *psd_members_steps_json(const psd_t *s)
{
    size_t cap = 8 + 24 * (size_t)(s->nworkers > 0 ? s->nworkers : 0), n = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    n += (size_t)snprintf(out, cap, "[");
    for (int r = 0; r < s->nworkers; r++)
        n += (size_t)snprintf(out + n, cap - n, "%s%llu", r ? "," : "",
                              (unsigned long long)s->workers[r].steps);
    snprintf(out + n, cap - n, "]");
    return out;
}

void psd_members_steps_load(psd_t *s, const char *json)
{
    const char *c = json && *json == '[' ? json + 1 : NULL;
    for (int r = 0; c && r < s->nworkers && *c && *c != ']'; r++) {
        char *end;
        unsigned long long v = strtoull(c, &end, 10);
        if (end == c) break;
        s->workers[r].steps = v;
        c = *end == ',' ? end + 1 : end;
    }
}

void psd_members_seen(psd_t *s, int r)
{
    if (r < 0 || r >= s->nworkers) return;
    psd_worker_t *w = &s->workers[r];
    w->last_seen_ms = uv_now(s->loop);
    if (w->state == PSD_W_DONE || w->state == PSD_W_FAILED)
        return; /* its late messages (a heartbeat racing the BYE) do not revive it */
    if (w->state == PSD_W_LOST || w->state == PSD_W_LEFT)
        ps_info("worker rank %d is back", r);
    w->state = PSD_W_LIVE;
}

void psd_members_pushed(psd_t *s, int r)
{
    s->job_started = 1;
    if (r >= 0 && r < s->nworkers) s->workers[r].rejoined = 0;
}

static void barrier_ack(psd_t *s, const void *id, size_t idlen, uint64_t req, int r)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
    h.has_request_id = 1;
    h.request_id = req;
    h.has_rank = 1;
    h.rank = r;
    psd_send(s, id, idlen, &h, NULL, 0);
}

/* The membership a barrier waits for: the one in force at this server's
 * lowest partition version (the start: 0; the end: the last step), or the
 * newest before the table is known. */
static uint64_t barrier_version(const psd_t *s)
{
    uint64_t v = UINT64_MAX;
    for (uint32_t i = 0; s->st.have_table && i < s->st.table.nparts; i++)
        if (s->st.parts[i].owned && s->st.parts[i].version < v) v = s->st.parts[i].version;
    return v;
}

static void barrier_try_release(psd_t *s)
{
    int arrived = 0;
    for (int r = 0; r < s->nworkers; r++) {
        if (s->workers[r].at_barrier) arrived++;
        else if (psd_members_required(s, r, barrier_version(s))) return;
    }
    if (!arrived) return;
    ps_info("barrier released (%d workers)", arrived);
    s->barrier_since_ms = 0;
    int starts = !s->job_started;
    s->job_started = 1;
    uint64_t now = uv_now(s->loop);
    for (int r = 0; r < s->nworkers; r++) {
        psd_worker_t *w = &s->workers[r];
        if (!w->at_barrier) continue;
        /* Lost means silent for the timeout after joining: a worker slow to
         * start is not dropped the moment the job it just joined begins. */
        if (starts && w->last_seen_ms < now) w->last_seen_ms = now;
        barrier_ack(s, w->bid, w->bidlen, w->barrier_req, r);
        w->barrier_done = w->barrier_req;
        w->at_barrier = 0;
    }
}

void psd_members_fail_barrier(psd_t *s, int code, const char *text)
{
    for (int r = 0; r < s->nworkers; r++) {
        psd_worker_t *w = &s->workers[r];
        if (!w->at_barrier) continue;
        Ps__Header q;
        ps_wire_header_init(&q, PS__MSG_TYPE__MSG_BARRIER);
        q.request_id = w->barrier_req;
        psd_send_error(s, w->bid, w->bidlen, &q, code, "%s", text);
        w->barrier_done = w->barrier_req;
        w->at_barrier = 0;
    }
    s->barrier_since_ms = 0;
}

void psd_members_notify_shutdown(psd_t *s, const char *why)
{
    for (int r = 0; r < s->nworkers; r++) {
        psd_worker_t *w = &s->workers[r];
        if (!w->assigned || w->state == PSD_W_DONE || w->state == PSD_W_LEFT) continue;
        Ps__Header h;
        ps_wire_header_init(&h, PS__MSG_TYPE__MSG_SHUTDOWN);
        h.error_text = (char *)why;
        psd_send(s, w->id, w->idlen, &h, NULL, 0);
    }
}

/* A HELLO for rank r was refused (text: why).  Before the job started that
 * worker cannot join, so the job cannot start: the refusal goes to the
 * caller, which stops it (the workers at the start barrier, and those that
 * come, get the reason instead of a silent wait).  Once the job runs, a
 * refused HELLO is a stranger's and changes nothing. */
static void hello_refused(psd_t *s, int r, const char *text, char *refusal, size_t len)
{
    if (s->job_started) return;
    /* A rank already held (or, asking for any rank, all of them held): the
     * job has its workers, and the refused one is not one of them. */
    int free_rank = 0;
    for (int q = 0; q < s->nworkers; q++)
        free_rank |= (r < 0 || q == r) && !s->workers[q].assigned;
    if (s->nworkers > 0 && !free_rank) return;
    if (r >= 0 && r < s->nworkers) {
        snprintf(s->workers[r].refused, sizeof s->workers[r].refused, "%s", text);
        snprintf(refusal, len, "worker rank %d cannot join: its HELLO was refused: %s", r, text);
    } else {
        snprintf(refusal, len, "a worker cannot join: its HELLO was refused: %s", text);
    }
}

int psd_handle_hello(psd_t *s, ps_wire_msg_t *m, char *refusal, size_t len)
{
    refusal[0] = 0;
    const Ps__Header *h = m->hdr;
    char err[256] = "";
    int rc;

    /* Checked before anything is kept, so a misconfigured worker that
     * comes first cannot make the cluster's table its own. */
    uint32_t nserv = s->st.have_table ? s->st.table.nservers
                                      : (uint32_t)(s->o.num_servers > 0 ? s->o.num_servers : 0);
    if (h->has_num_servers && h->num_servers && nserv && h->num_servers != nserv) {
        char why[200];
        snprintf(why, sizeof why, "the worker's --servers lists %u server(s), the cluster has %u "
                 "(psd --num-servers): give every worker all the servers, server 0 first",
                 h->num_servers, nserv);
        psd_send_error(s, PSD_ID_OF(m), h, PS_EMISMATCH, "%s", why);
        hello_refused(s, h->has_rank ? h->rank : -1, why, refusal, len);
        return -1;
    }
    if (h->has_table_hash) {
        uint64_t known = s->st.have_table ? s->st.table.hash : s->table_hash_seen;
        if ((s->st.have_table || s->have_hash_seen) && h->table_hash != known) {
            char why[200];
            snprintf(why, sizeof why, "partition table hash 0x%016llx differs from the cluster's "
                     "0x%016llx: the worker's model or partition_bytes / num_servers differ",
                     (unsigned long long)h->table_hash, (unsigned long long)known);
            psd_send_error(s, PSD_ID_OF(m), h, PS_EMISMATCH, "%s", why);
            hello_refused(s, h->has_rank ? h->rank : -1, why, refusal, len);
            return -1;
        }
    }
    if (h->has_num_workers && h->num_workers > 0 &&
        (rc = psd_members_set_count(s, (int)h->num_workers, err, sizeof err))) {
        psd_send_error(s, PSD_ID_OF(m), h, rc, "HELLO: %s", err);
        if (rc == PS_EMISMATCH) hello_refused(s, h->has_rank ? h->rank : -1, err, refusal, len);
        return -1;
    }
    if (h->has_table_hash) {
        s->table_hash_seen = h->table_hash;
        s->have_hash_seen = 1;
    }
    if (s->nworkers <= 0) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ESTATE,
                       "HELLO: cluster size unknown (send num_workers or start psd with --num-workers)");
        return -1;
    }
    int rank = h->has_rank ? h->rank : -1;
    uint64_t join_at = 0;
    if (h->has_flags && (h->flags & PS_FLAG_JOIN)) {
        /* psworker --join: a new rank from the next step boundary on */
        char why[300] = "";
        if ((rank = psd_elastic_join(s, &join_at, why, sizeof why)) < 0) {
            psd_send_error(s, PSD_ID_OF(m), h, PS_ESTATE, "HELLO to join: %s", why);
            return -1;
        }
    } else if (rank < 0) {
        if (s->o.server_id != 0) {
            psd_send_error(s, PSD_ID_OF(m), h, PS_ESTATE,
                           "HELLO with rank -1 must go to server 0 (this is server %d)", s->o.server_id);
            return -1;
        }
        /* A retried HELLO comes from the same socket: same rank again. */
        for (int r = 0; r < s->nworkers && rank < 0; r++)
            if (s->workers[r].assigned &&
                psd_reply_same_id(s->workers[r].id, s->workers[r].idlen, m))
                rank = r;
        for (int r = 0; r < s->nworkers && rank < 0; r++)
            if (!s->workers[r].assigned) rank = r;
        /* A restarted worker takes over the rank of a lost or departed one. */
        for (int r = 0; r < s->nworkers && rank < 0; r++)
            if (s->workers[r].state == PSD_W_LOST || s->workers[r].state == PSD_W_LEFT) rank = r;
        if (rank < 0) {
            psd_send_error(s, PSD_ID_OF(m), h, PS_ERANGE, "HELLO: all %d ranks are taken by live workers",
                           s->nworkers);
            return -1;
        }
    } else if (rank >= s->nworkers) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ERANGE, "HELLO: rank %d but the cluster has %d workers", rank,
                       s->nworkers);
        return -1;
    }
    psd_worker_t *w = &s->workers[rank];
    uint64_t session = h->has_session ? h->session : 0;
    if (!w->assigned || !psd_reply_same_id(w->id, w->idlen, m) || w->session != session) {
        /* A new process (or a first HELLO) for this rank: its request ids
         * start over, so nothing of a previous life's barriers applies, and
         * a rank that had finished, failed or left is in the job again. */
        w->at_barrier = 0;
        w->barrier_done = 0;
        w->rejoined = s->job_started;
        if (w->state == PSD_W_DONE || w->state == PSD_W_FAILED || w->state == PSD_W_LEFT)
            w->state = PSD_W_UNKNOWN;
    }
    w->assigned = 1;
    w->session = session;
    w->refused[0] = 0;
    psd_reply_keep_id(w->id, &w->idlen, m);
    if (h->has_body) {
        size_t n = h->body.len < sizeof w->host - 1 ? h->body.len : sizeof w->host - 1;
        memcpy(w->host, h->body.data, n);
        w->host[n] = 0;
        for (size_t i = 0; i < n; i++)
            if (w->host[i] < 0x20 || w->host[i] > 0x7e) w->host[i] = '?';
    }
    psd_members_seen(s, rank);
    ps_info("HELLO: rank %d (%s) of %d", rank, w->host[0] ? w->host : "?", s->nworkers);

    Ps__Header r;
    ps_wire_header_init(&r, PS__MSG_TYPE__MSG_WELCOME);
    r.has_request_id = 1, r.request_id = h->request_id;
    r.has_rank = 1, r.rank = rank;
    r.has_num_workers = 1, r.num_workers = (uint32_t)s->nworkers;
    r.has_num_servers = 1;
    r.num_servers = s->st.have_table ? s->st.table.nservers
                                     : (uint32_t)(s->o.num_servers > 0 ? s->o.num_servers : 0);
    if (s->st.have_table || s->have_hash_seen) {
        r.has_table_hash = 1;
        r.table_hash = s->st.have_table ? s->st.table.hash : s->table_hash_seen;
    }
    if (s->st.from_ckpt) r.has_flags = 1, r.flags = PS_FLAG_FROM_CKPT;
    if (join_at) r.has_flags = 1, r.flags |= PS_FLAG_JOIN, r.has_iteration = 1, r.iteration = join_at;
    if (s->nepochs) r.has_epochs = 1, r.epochs = (uint32_t)s->nepochs;
    psd_send(s, PSD_ID_OF(m), &r, NULL, 0);
    return rank;
}

static int check_rank(psd_t *s, ps_wire_msg_t *m, const char *what)
{
    const Ps__Header *h = m->hdr;
    if (s->nworkers <= 0) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ESTATE, "%s before the cluster size is known (HELLO / INIT)",
                       what);
        return -1;
    }
    if (!h->has_rank || h->rank < 0 || h->rank >= s->nworkers) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ERANGE, "%s: rank %d not in 0..%d", what,
                       h->has_rank ? h->rank : -1, s->nworkers - 1);
        return -1;
    }
    return h->rank;
}

void psd_handle_barrier(psd_t *s, ps_wire_msg_t *m)
{
    int r = check_rank(s, m, "BARRIER");
    if (r < 0) return;
    psd_worker_t *w = &s->workers[r];
    if (m->hdr->request_id && m->hdr->request_id == w->barrier_done) {
        /* Never the pending entry: a late duplicate must not replace the
         * request of the barrier the worker is waiting at now. */
        ps_info("BARRIER from rank %d resent after its release (the ACK was lost): answered again",
                r);
        barrier_ack(s, PSD_ID_OF(m), m->hdr->request_id, r);
        return;
    }
    if (w->rejoined) {
        /* A worker restarted into a running job: the others train and will
         * not come to a start barrier again.  (Workers all at a barrier, or
         * all gone, as when a new job starts on this psd: wait as usual.) */
        w->rejoined = 0;
        int running = 0;
        for (int q = 0; q < s->nworkers; q++)
            if (q != r && s->workers[q].state == PSD_W_LIVE && !s->workers[q].at_barrier) running = 1;
        if (running) {
            ps_info("BARRIER from rank %d, restarted into the running job: answered at once", r);
            barrier_ack(s, PSD_ID_OF(m), m->hdr->request_id, r);
            w->barrier_done = m->hdr->request_id;
            return;
        }
    }
    /* A retry replaces the pending entry: one reply, to the latest request. */
    if (!s->barrier_since_ms) s->barrier_since_ms = uv_now(s->loop);
    w->at_barrier = 1;
    w->barrier_req = m->hdr->request_id;
    psd_reply_keep_id(w->bid, &w->bidlen, m);
    barrier_try_release(s);
}

int psd_handle_bye(psd_t *s, ps_wire_msg_t *m)
{
    const Ps__Header *h = m->hdr;
    int r = check_rank(s, m, "BYE");
    if (r < 0) return PSD_BYE_REFUSED;
    psd_worker_t *w = &s->workers[r];
    uint64_t session = h->has_session ? h->session : 0;
    /* Only the process that holds the rank may take it out of the job (or
     * an admin key under --curve): a BYE is a membership change. */
    if (!(s->o.curve && psd_curve_is_admin(s, m)) && (!w->assigned || w->session != session)) {
        ps_warn("BYE for rank %d refused: it does not come from the process that said HELLO as "
                "rank %d (session %016llx, that process's is %016llx)", r, r,
                (unsigned long long)session, (unsigned long long)w->session);
        psd_send_error(s, PSD_ID_OF(m), h, PS_EAUTH,
                       "BYE for rank %d refused: not the process that holds rank %d", r, r);
        return PSD_BYE_REFUSED;
    }
    uint32_t f = h->has_flags ? h->flags : 0;
    int out = f & PS_FLAG_FAILED ? PSD_BYE_FAILED : f & PS_FLAG_DONE ? PSD_BYE_DONE : PSD_BYE_LEFT;
    w->state = out == PSD_BYE_FAILED ? PSD_W_FAILED : out == PSD_BYE_DONE ? PSD_W_DONE : PSD_W_LEFT;
    w->at_barrier = 0;
    if (out == PSD_BYE_DONE)
        ps_info("worker rank %d finished (BYE); %d live", r, psd_members_live_count(s));
    else if (out == PSD_BYE_LEFT)
        ps_info("worker rank %d left before the end (BYE); %d live; %s", r,
                psd_members_live_count(s),
                s->o.loss_continue ? "steps go on without it (--on-worker-loss=continue)"
                                   : "steps wait for it to come back (--on-worker-loss=wait)");
    psd_send_ack(s, PSD_ID_OF(m), h->request_id);
    if (out != PSD_BYE_FAILED) barrier_try_release(s);
    return out;
}

int psd_members_check(psd_t *s)
{
    if (s->o.worker_timeout_ms <= 0 || s->nworkers <= 0) return 0;
    uint64_t now = uv_now(s->loop);
    int changed = 0;
    for (int r = 0; r < s->nworkers; r++) {
        psd_worker_t *w = &s->workers[r];
        /* A rank never heard from is waited for (start-up is slow and
         * uneven); only one that has spoken and then fell silent is lost. */
        if (w->state != PSD_W_LIVE || now - w->last_seen_ms <= (uint64_t)s->o.worker_timeout_ms)
            continue;
        if (!s->job_started) {
            /* Not in the job yet: dropping it would start training without
             * it.  Waited for, as a rank never heard from. */
            if (!w->silent_warned)
                ps_warn("worker rank %d silent for %llu ms (timeout %d ms) before the job started: "
                        "still waited for (only a worker that joined the job can be lost)",
                        r, (unsigned long long)(now - w->last_seen_ms), s->o.worker_timeout_ms);
            w->silent_warned = 1;
            continue;
        }
        w->state = PSD_W_LOST;
        w->lost_ms = now;
        /* Its BARRIER (if any) stays: it did arrive.  continue: released with
         * the others, its ACK waits for it (or a resend gets it again). */
        changed = 1;
        ps_warn("worker rank %d lost: silent for %llu ms (timeout %d ms); %d live workers remain; %s",
                r, (unsigned long long)(now - w->last_seen_ms), s->o.worker_timeout_ms,
                psd_members_live_count(s),
                s->o.loss_continue ? "steps go on without it (--on-worker-loss=continue)"
                                   : "steps wait for it (--on-worker-loss=wait)");
    }
    if (changed) barrier_try_release(s);
    return changed;
}
