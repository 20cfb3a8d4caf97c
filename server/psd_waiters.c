/* Requests waiting for a partition to reach a version: a PULL with
 * min_version above the current one, a PUSHPULL whose update is still
 * pending.  They are queued per partition in arrival order, counted per
 * peer (--max-peer-inflight) and per partition (PSD_MAX_WAITERS) so that a
 * flood cannot grow memory, answered WEIGHTS once the version is reached,
 * and answered ERROR when a rollback takes that version away. */
#include "psd.h"

#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_wire.h"

int psd_waiters_add(psd_t *s, ps_wire_msg_t *m, psd_part_t *p, uint64_t min_version)
{
    const Ps__Header *h = m->hdr;
    /* A retried request already waiting is not queued twice. */
    for (psd_waiter_t *w = p->waiters; w; w = w->next)
        if (w->request_id == h->request_id && w->min_version == min_version &&
            psd_reply_same_id(w->id, w->idlen, m))
            return 0;
    int rc = psd_peers_acquire(&s->peers, PSD_ID_OF(m), s->o.max_peer_inflight);
    if (rc == PS_EAGAIN) {
        /* One peer flooding must not starve the others or grow memory. */
        psd_send_error(s, PSD_ID_OF(m), h, PS_EAGAIN,
                       "%s refused: this peer has %d requests waiting already (--max-peer-inflight)",
                       ps_wire_type_name(h->type), s->o.max_peer_inflight);
        return -1;
    }
    if (rc) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ENOMEM, "out of memory queueing a reply");
        return -1;
    }
    if (p->nwaiters >= PSD_MAX_WAITERS) {
        psd_peers_release(s->peers, PSD_ID_OF(m));
        psd_send_error(s, PSD_ID_OF(m), h, PS_EAGAIN, "partition %u has %d requests waiting already",
                       p->id, p->nwaiters);
        return -1;
    }
    psd_waiter_t *w = calloc(1, sizeof *w);
    if (!w) {
        psd_peers_release(s->peers, PSD_ID_OF(m));
        psd_send_error(s, PSD_ID_OF(m), h, PS_ENOMEM, "out of memory queueing a reply");
        return -1;
    }
    psd_reply_keep_id(w->id, &w->idlen, m);
    w->request_id = h->request_id;
    w->min_version = min_version;
    w->exact = h->type == PS__MSG_TYPE__MSG_PULL && (h->flags & PS_FLAG_EXACT);
    w->state = h->type == PS__MSG_TYPE__MSG_PUSHPULL && (h->flags & PS_FLAG_STATE) &&
               s->mode == PSD_SYNC;
    w->dtype = h->dtype;
    w->codec = psd_reply_codec(h);
    /* Append: replies go out in arrival order. */
    psd_waiter_t **pp = &p->waiters;
    while (*pp) pp = &(*pp)->next;
    *pp = w;
    p->nwaiters++;
    return 0;
}

/* Unlink the waiters of p whose min_version lies in [lo, hi], keeping
 * their order, and release their per-peer counts: the caller answers and
 * frees each one of the returned list. */
static psd_waiter_t *take(psd_t *s, psd_part_t *p, uint64_t lo, uint64_t hi)
{
    psd_waiter_t *out = NULL, **tail = &out, **pp = &p->waiters;
    while (*pp) {
        psd_waiter_t *w = *pp;
        if (w->min_version < lo || w->min_version > hi) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        p->nwaiters--;
        psd_peers_release(s->peers, w->id, w->idlen);
        w->next = NULL;
        *tail = w;
        tail = &w->next;
    }
    return out;
}

/* --debug-die-before-state-reply: a server lost between its replies of an
 * update, deterministically -- the last of its partitions to reach version
 * N answers the workers that keep no state of it and dies before the
 * keeper's reply, so the keeper's copy is one version behind what another
 * worker saw (a timed kill hits this only by chance). */
static void die_before_state(psd_t *s, psd_part_t *p, psd_waiter_t *list)
{
    if (s->o.debug_die_state_v <= 0 || p->version != (uint64_t)s->o.debug_die_state_v) return;
    int keeper = 0;
    for (psd_waiter_t *w = list; w; w = w->next) keeper |= w->state;
    for (uint32_t i = 0; i < s->st.table.nparts; i++)
        if (s->st.parts[i].owned && s->st.parts[i].version < p->version) return;
    if (!keeper) return;
    for (psd_waiter_t *w = list; w; w = w->next)
        if (!w->state)
            psd_send_weights(s, w->id, w->idlen, w->request_id, p, w->dtype, w->codec);
    ps_warn("--debug-die-before-state-reply: partition %u at version %llu answered to all but "
            "its keeper; SIGKILL now", p->id, (unsigned long long)p->version);
    struct timespec ts = {0, 300000000L}; /* for ZeroMQ's I/O thread to write them */
    nanosleep(&ts, NULL);
    raise(SIGKILL);
}

void psd_waiters_notify(psd_t *s, psd_part_t *p)
{
    psd_waiter_t *w = take(s, p, 0, p->version);
    die_before_state(s, p, w);
    while (w) {
        psd_waiter_t *next = w->next;
        if (w->state)
            psd_send_state(s, w->id, w->idlen, w->request_id, p);
        else if (w->exact)
            psd_send_weights_of(s, w->id, w->idlen, w->request_id, p, w->min_version, w->dtype,
                                w->codec);
        else
            psd_send_weights(s, w->id, w->idlen, w->request_id, p, w->dtype, w->codec);
        free(w);
        w = next;
    }
}

void psd_waiters_cancel(psd_t *s, psd_part_t *p, uint64_t v)
{
    psd_waiter_t *w = take(s, p, v + 1, UINT64_MAX);
    while (w) {
        psd_waiter_t *next = w->next;
        Ps__Header q;
        ps_wire_header_init(&q, PS__MSG_TYPE__MSG_PUSHPULL);
        q.request_id = w->request_id;
        q.has_partition = 1, q.partition = p->id;
        psd_send_rollback_error(s, w->id, w->idlen, &q, v,
                                "partition %u rolled back to version %llu: request cancelled",
                                p->id, (unsigned long long)v);
        free(w);
        w = next;
    }
}

void psd_waiters_fail(psd_t *s, psd_part_t *p, int code, const char *text)
{
    psd_waiter_t *w = take(s, p, 0, UINT64_MAX);
    while (w) {
        psd_waiter_t *next = w->next;
        Ps__Header q;
        ps_wire_header_init(&q, PS__MSG_TYPE__MSG_PUSHPULL);
        q.request_id = w->request_id;
        q.has_partition = 1, q.partition = p->id;
        psd_send_error(s, w->id, w->idlen, &q, code, "%s", text);
        free(w);
        w = next;
    }
}
