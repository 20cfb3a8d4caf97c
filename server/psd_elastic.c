/* Elastic membership (sync mode): which ranks are in the job changes at step
 * boundaries, without restarting anything.
 *
 * psd runs with --num-workers W0 (the workers it starts with) and
 * --max-workers M (the most it may have at once; M > W0 makes the job
 * elastic): every per-rank array is sized M.  The membership is a list of
 * epochs {from, ranks}: from version `from` on, the sync updates wait for
 * exactly those ranks (and divide by how many pushed).  Server 0 decides
 * a new epoch when a worker asks to join (HELLO with PS_FLAG_JOIN) or a
 * rank is drained (MSG_DRAIN, from psctl or the worker itself), at
 * E = its highest partition version + 2: every worker receives one of its
 * replies of version E - 1 (they carry the epoch count, Header.epochs)
 * before it computes step E - 1, asks server 0 for the epochs, tells every
 * server (MSG_MEMBERS, before any push of step E) and re-splits its data
 * for step E.  The learning rate follows the spec's rule: keep-batch (the
 * global batch stays, each worker's batch is global / W; the lr stays) or
 * linear (each worker's batch stays, the lr scales by W / W0).  Epochs are
 * checkpointed with the shard. */
#include "psd.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

/* The epoch in force at version v (NULL: not elastic). */
static const psd_epoch_t *epoch_at(const psd_t *s, uint64_t v)
{
    if (!s->nepochs) return NULL;
    const psd_epoch_t *e = &s->epochs[0];
    for (int i = 1; i < s->nepochs && s->epochs[i].from <= v; i++) e = &s->epochs[i];
    return e;
}

int psd_elastic_active(const psd_t *s, int r, uint64_t v)
{
    if (r < 0 || r >= s->nworkers) return 0;
    const psd_epoch_t *e = epoch_at(s, v);
    return !e || (r < 64 && ((e->ranks >> r) & 1));
}

int psd_elastic_count(const psd_t *s, uint64_t v)
{
    const psd_epoch_t *e = epoch_at(s, v);
    return e ? __builtin_popcountll(e->ranks) : s->nworkers;
}

float psd_elastic_lr_scale(const psd_t *s, uint64_t v)
{
    if (!s->elastic_linear || !s->nepochs || s->w0 <= 0) return 1.0f;
    return (float)psd_elastic_count(s, v) / (float)s->w0;
}

int psd_elastic_init(psd_t *s)
{
    int cap = s->o.max_workers > s->w0 ? s->o.max_workers : s->w0;
    if (cap <= s->w0 || s->nepochs) return 0;
    if (cap > 64) {
        ps_error("--max-workers %d: an elastic job has at most 64 ranks", cap);
        return PS_ERANGE;
    }
    if (!(s->epochs = calloc(1, sizeof *s->epochs))) return PS_ENOMEM;
    s->epochs[0] = (psd_epoch_t){0, (UINT64_C(1) << s->w0) - 1};
    s->nepochs = 1;
    ps_info("elastic: %d workers to start, up to %d (--max-workers)", s->w0, cap);
    return 0;
}

static uint64_t newest(const psd_t *s) { return s->epochs[s->nepochs - 1].ranks; }

/* The step a change decided now takes effect at: this server's highest
 * partition version + 2 (see the top); 0 when it holds none. */
static uint64_t boundary(const psd_t *s)
{
    uint64_t vmax = 0;
    int any = 0;
    for (uint32_t i = 0; s->st.have_table && i < s->st.table.nparts; i++)
        if (s->st.parts[i].owned && s->st.parts[i].initialised) {
            vmax = s->st.parts[i].version > vmax ? s->st.parts[i].version : vmax;
            any = 1;
        }
    return any ? vmax + 2 : 0;
}

/* Keep-batch: the global batch must split over the new count. */
static int splits(const psd_t *s, int n, char *err, size_t len)
{
    if (s->elastic_linear || s->global_batch <= 0) return 0;
    if (n < s->w0)
        snprintf(err, len, "%d workers is fewer than the %d the job started with: under psworker "
                 "--elastic-lr keep-batch each would take a larger batch than it holds (use "
                 "--elastic-lr linear)", n, s->w0);
    else if (s->global_batch % n)
        snprintf(err, len, "the global batch %lld does not split over %d workers (psworker "
                 "--elastic-lr keep-batch); choose --batch so that it does, or --elastic-lr "
                 "linear", s->global_batch, n);
    else
        return 0;
    return PS_EINVAL;
}

static int add_epoch(psd_t *s, uint64_t from, uint64_t ranks)
{
    psd_epoch_t *e = realloc(s->epochs, (size_t)(s->nepochs + 1) * sizeof *e);
    if (!e) return PS_ENOMEM;
    s->epochs = e;
    /* two changes decided before the same boundary merge into one epoch */
    if (s->epochs[s->nepochs - 1].from == from) s->epochs[s->nepochs - 1].ranks = ranks;
    else s->epochs[s->nepochs++] = (psd_epoch_t){from, ranks};
    return 0;
}

int psd_elastic_join(psd_t *s, uint64_t *from, char *err, size_t len)
{
    if (s->o.server_id != 0 || !s->nepochs || s->mode != PSD_SYNC) {
        snprintf(err, len, "joining needs server 0 of a sync job started with --max-workers above "
                 "--num-workers");
        return -1;
    }
    uint64_t ranks = newest(s);
    int r = 0;
    while (r < s->nworkers && (((ranks >> r) & 1) ||
                               s->workers[r].state == PSD_W_LIVE))
        r++;
    uint64_t e = boundary(s);
    if (r >= s->nworkers) {
        snprintf(err, len, "the job has its --max-workers %d workers", s->nworkers);
        return -1;
    }
    if (!e) {
        snprintf(err, len, "the job has not started here yet (join once it trains)");
        return -1;
    }
    if (splits(s, __builtin_popcountll(ranks) + 1, err, len) || add_epoch(s, e, ranks | (UINT64_C(1) << r))) {
        if (!err[0]) snprintf(err, len, "out of memory");
        return -1;
    }
    *from = e;
    ps_info("elastic: rank %d joins at step %llu (%d workers from then on)", r,
            (unsigned long long)e, __builtin_popcountll(newest(s)));
    return r;
}

char *psd_elastic_json(const psd_t *s)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < s->nepochs; i++) {
        cJSON *e = cJSON_CreateArray(), *rs = cJSON_CreateArray();
        for (int r = 0; r < 64 && e && rs; r++)
            if ((s->epochs[i].ranks >> r) & 1) cJSON_AddItemToArray(rs, cJSON_CreateNumber(r));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)s->epochs[i].from));
        cJSON_AddItemToArray(e, rs);
        cJSON_AddItemToArray(a, e);
    }
    char *txt = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    return txt;
}

int psd_elastic_parse(psd_t *s, const char *json, char *err, size_t len)
{
    cJSON *a = cJSON_Parse(json), *e;
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    psd_epoch_t *ep = n > 0 ? calloc((size_t)n, sizeof *ep) : NULL;
    int i = 0, ok = ep != NULL;
    cJSON *list = ok ? a : NULL;
    cJSON_ArrayForEach(e, list)
    {
        const cJSON *f = cJSON_GetArrayItem(e, 0), *rs = cJSON_GetArrayItem(e, 1), *r;
        if (!cJSON_IsNumber(f) || f->valuedouble < 0 || !cJSON_IsArray(rs) ||
            (i > 0 && (uint64_t)f->valuedouble <= ep[i - 1].from)) {
            ok = 0;
            break;
        }
        ep[i].from = (uint64_t)f->valuedouble;
        cJSON_ArrayForEach(r, rs)
        {
            if (!cJSON_IsNumber(r) || r->valuedouble < 0 || r->valuedouble >= s->nworkers ||
                r->valuedouble >= 64) {
                ok = 0;
                break;
            }
            ep[i].ranks |= UINT64_C(1) << (int)r->valuedouble;
        }
        if (!ep[i].ranks) ok = 0;
        i++;
    }
    cJSON_Delete(a);
    if (!ok) {
        free(ep);
        snprintf(err, len, "membership epochs are not [[from_step,[ranks < %d]],...] in step order",
                 s->nworkers);
        return PS_EINVAL;
    }
    /* epochs only grow: the longer list is the newer one */
    if (n > s->nepochs) {
        free(s->epochs);
        s->epochs = ep;
        s->nepochs = n;
        ps_info("elastic: %d workers from step %llu", __builtin_popcountll(newest(s)),
                (unsigned long long)s->epochs[n - 1].from);
    } else {
        free(ep);
    }
    return 0;
}

void psd_handle_members(psd_t *s, ps_wire_msg_t *m)
{
    const Ps__Header *h = m->hdr;
    char err[200] = "";
    char *body = h->has_body ? strndup((const char *)h->body.data, h->body.len) : NULL;
    int rc = !body ? PS_EPROTO : s->nworkers <= 0 ? PS_ESTATE : psd_elastic_parse(s, body, err, sizeof err);
    free(body);
    if (rc) {
        psd_send_error(s, PSD_ID_OF(m), h, rc, "MEMBERS: %s", err[0] ? err : "no body, or no cluster size yet");
        return;
    }
    psd_send_ack(s, PSD_ID_OF(m), h->request_id);
    psd_recheck_pending(s);
}

void psd_handle_drain(psd_t *s, ps_wire_msg_t *m)
{
    const Ps__Header *h = m->hdr;
    int r = h->has_rank ? h->rank : -1;
    char err[300] = "";
    uint64_t e = s->nepochs ? boundary(s) : 0;
    if (s->o.server_id != 0 || !s->nepochs)
        snprintf(err, sizeof err, "draining needs server 0 of a sync job started with "
                 "--max-workers above --num-workers");
    else if (r < 0 || r >= s->nworkers || !((newest(s) >> r) & 1))
        snprintf(err, sizeof err, "rank %d is not in the job", r);
    else if (r == 0)
        snprintf(err, sizeof err, "rank 0 writes the model and stays to the end: drain another rank");
    else if (!e)
        snprintf(err, sizeof err, "the job has not started here yet");
    else if (!splits(s, __builtin_popcountll(newest(s)) - 1, err, sizeof err) &&
             add_epoch(s, e, newest(s) & ~(UINT64_C(1) << r)))
        snprintf(err, sizeof err, "out of memory");
    if (err[0]) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_EINVAL, "DRAIN: %s", err);
        return;
    }
    ps_info("elastic: rank %d drained at step %llu (%d workers from then on)", r,
            (unsigned long long)e, __builtin_popcountll(newest(s)));
    Ps__Header a;
    ps_wire_header_init(&a, PS__MSG_TYPE__MSG_ACK);
    a.has_request_id = 1, a.request_id = h->request_id;
    a.has_iteration = 1, a.iteration = e;
    psd_send(s, PSD_ID_OF(m), &a, NULL, 0);
}
