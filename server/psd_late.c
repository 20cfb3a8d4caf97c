/* Who the server waits for.  A sync update waits for every required rank's
 * gradient, a barrier for every required rank's arrival; the server knows
 * which ranks are missing and since when, and says it: STATS ("late", and
 * per rank "behind_s"), the Prometheus gauge psd_rank_behind_seconds, and a
 * log line every 10 s while a wait lasts longer than that, e.g.
 *   step 812: waiting 14.2 s for rank 3 (partitions 0-11)
 *   barrier: 1 of 2 workers arrived 12.0 s ago; waiting for rank 1 (never connected)
 * Also where the sync steps each rank contributed are counted. */
#include "psd.h"

#include <stdio.h>
#include <string.h>

#include "ps_log.h"

#define LATE_LOG_MS 10000

/* The lowest partition this server owns: its pushes count a rank's steps. */
static int first_owned(const psd_t *s)
{
    for (uint32_t i = 0; s->st.have_table && i < s->st.table.nparts; i++)
        if (s->st.parts[i].owned) return (int)i;
    return -1;
}

void psd_late_arrived(psd_t *s, psd_part_t *p, int rank)
{
    int n = 0;
    for (int r = 0; r < s->st.nworkers; r++) n += p->have[r] != 0;
    if (n == 1) p->wait_since_ms = uv_now(s->loop);
    (void)rank;
}

void psd_late_applying(psd_t *s, const psd_part_t *p)
{
    /* counted at the update, not at arrival: a rollback to an aligned
     * checkpoint then restores exactly the counts of its version */
    if ((int)p->id != first_owned(s)) return;
    for (int r = 0; r < s->st.nworkers; r++)
        if (p->have[r]) psd_members_count_step(s, r);
}

/* Rank r holds up p's update: it is required and has not pushed. */
static int holds_up(const psd_t *s, const psd_part_t *p, int r)
{
    return p->owned && p->wait_since_ms && !p->have[r] && psd_members_required(s, r, p->version);
}

double psd_late_seconds(const psd_t *s, int r)
{
    uint64_t now = uv_now(s->loop), since = 0;
    if (r < 0 || r >= s->nworkers) return 0;
    if (s->barrier_since_ms && !s->workers[r].at_barrier && psd_members_required(s, r, UINT64_MAX))
        since = s->barrier_since_ms;
    for (uint32_t i = 0; s->mode == PSD_SYNC && s->st.have_table && i < s->st.table.nparts; i++) {
        const psd_part_t *p = &s->st.parts[i];
        if (holds_up(s, p, r) && (!since || p->wait_since_ms < since)) since = p->wait_since_ms;
    }
    return since ? (double)(now - since) / 1e3 : 0;
}

static const char *why_missing(const psd_worker_t *w)
{
    switch (w->state) {
    case PSD_W_UNKNOWN: return " (never connected)";
    case PSD_W_LOST: return " (lost: silent past --worker-timeout-ms)";
    case PSD_W_LEFT: return " (left with BYE)";
    default: return "";
    }
}

/* ", rank a (why), rank b" of the ranks that `late` selects. */
static size_t list_ranks(const psd_t *s, char *buf, size_t len,
                         int (*late)(const psd_t *, int, void *),
                         void *arg)
{
    size_t n = 0;
    for (int r = 0; r < s->nworkers && n < len; r++)
        if (late(s, r, arg))
            n += (size_t)snprintf(buf + n, len - n, "%s%d%s", n ? ", " : "rank ", r,
                                  why_missing(&s->workers[r]));
    return n;
}

static int barrier_late(const psd_t *s, int r, void *arg)
{
    (void)arg;
    return !s->workers[r].at_barrier && psd_members_required(s, r, UINT64_MAX);
}

static int step_late(const psd_t *s, int r, void *arg)
{
    const uint64_t *version = arg;
    for (uint32_t i = 0; i < s->st.table.nparts; i++) {
        const psd_part_t *p = &s->st.parts[i];
        if (p->version == *version && holds_up(s, p, r)) return 1;
    }
    return 0;
}

void psd_late_describe(const psd_t *s, char *buf, size_t len)
{
    uint64_t now = uv_now(s->loop);
    char who[256] = "";
    buf[0] = 0;
    if (s->barrier_since_ms) {
        int arrived = 0;
        for (int r = 0; r < s->nworkers; r++) arrived += s->workers[r].at_barrier;
        list_ranks(s, who, sizeof who, barrier_late, NULL);
        snprintf(buf, len, "barrier: %d of %d workers arrived %.1f s ago; waiting for %s", arrived,
                 s->nworkers, (double)(now - s->barrier_since_ms) / 1e3, *who ? who : "nobody");
        return;
    }
    if (s->mode != PSD_SYNC || !s->st.have_table) return;
    /* the oldest step some partition waits at, and the partitions waiting there */
    const psd_part_t *old = NULL;
    for (uint32_t i = 0; i < s->st.table.nparts; i++) {
        const psd_part_t *p = &s->st.parts[i];
        if (p->owned && p->wait_since_ms && (!old || p->wait_since_ms < old->wait_since_ms)) old = p;
    }
    if (!old) return;
    uint64_t v = old->version;
    uint32_t lo = UINT32_MAX, hi = 0;
    for (uint32_t i = 0; i < s->st.table.nparts; i++) {
        const psd_part_t *p = &s->st.parts[i];
        if (p->owned && p->wait_since_ms && p->version == v) {
            lo = i < lo ? i : lo;
            hi = i > hi ? i : hi;
        }
    }
    if (!list_ranks(s, who, sizeof who, step_late, &v)) return; /* applied in a moment */
    char parts[48];
    if (lo == hi) snprintf(parts, sizeof parts, "partition %u", lo);
    else snprintf(parts, sizeof parts, "partitions %u-%u", lo, hi);
    snprintf(buf, len, "step %llu: waiting %.1f s for %s (%s of server %d)", (unsigned long long)v,
             (double)(now - old->wait_since_ms) / 1e3, who, parts, s->o.server_id);
}

void psd_late_check(psd_t *s)
{
    char line[512];
    uint64_t now = uv_now(s->loop);
    if (now - s->late_logged_ms < LATE_LOG_MS) return;
    psd_late_describe(s, line, sizeof line);
    if (!line[0]) return;
    double oldest = 0;
    for (int r = 0; r < s->nworkers; r++) {
        double t = psd_late_seconds(s, r);
        oldest = t > oldest ? t : oldest;
    }
    if (oldest * 1e3 < LATE_LOG_MS) return;
    ps_warn("%s", line);
    s->late_logged_ms = now;
}
