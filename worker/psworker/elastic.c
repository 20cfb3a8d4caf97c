/* Elastic membership on the worker (sync through servers; the servers'
 * side and the protocol: server/psd_elastic.c, docs/protocol.md).
 *
 * The job's membership is a list of epochs {from, ranks}; the worker knows
 * it from server 0 (STATS "epochs") whenever a reply names more epochs than
 * it knows, tells every server before its next push, and before each
 * step's compute takes the epoch in force: W = its rank count, this
 * rank's shard = its place among them (not in them: it has left), its
 * batch by the rule of --elastic-lr:
 *   keep-batch  the global batch G = W0 * B0 stays; each worker computes
 *               G / W samples (W >= W0, so no batch outgrows its buffers);
 *               the servers' lr stays.  The job then equals one process
 *               with batch G (the reference tests/test_elastic.sh uses).
 *   linear      each worker's batch B0 stays, the global batch is W * B0,
 *               and the servers scale the lr by W / W0 (Goyal et al.'s
 *               linear scaling rule, applied at each change).
 * The samples of step s are the global stream's positions from
 * step_first(s) = the sum of the global batches of the steps before it, so
 * a re-split neither repeats nor skips data. */
#include "worker/psworker/psworker.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

struct ps_worker_epoch {
    uint64_t from;
    uint64_t ranks;     /* bit r: rank r */
};

int ps_worker_elastic_init(ps_worker_t *p)
{
    p->w0 = p->nworkers;
    p->b0 = p->batch;
    if (!(p->epochs = calloc(1, sizeof *p->epochs))) return PS_ENOMEM;
    p->epochs[0].from = 0;
    p->epochs[0].ranks = p->w0 >= 64 ? ~UINT64_C(0) : (UINT64_C(1) << p->w0) - 1;
    p->nepochs = 1;
    p->shard = p->rank;
    return 0;
}

void ps_worker_elastic_free(ps_worker_t *p)
{
    free(p->epochs);
    p->epochs = NULL;
    p->nepochs = 0;
}

static int count(uint64_t ranks) { return __builtin_popcountll(ranks); }

/* The batch of each worker and the global batch under n workers. */
static void batches(const ps_worker_t *p, int n, int *per, uint64_t *global)
{
    int linear = !strcmp(p->o->elastic_lr, "linear");
    *per = linear ? p->b0 : (int)((uint64_t)p->w0 * (uint64_t)p->b0 / (uint64_t)n);
    *global = linear ? (uint64_t)n * (uint64_t)p->b0 : (uint64_t)p->w0 * (uint64_t)p->b0;
}

int ps_worker_elastic_at(ps_worker_t *p, uint64_t step)
{
    if (p->nepochs <= 1) { /* the membership the job started with (any size) */
        p->nworkers = p->w0;
        p->batch = p->b0;
        p->shard = p->rank;
        p->step_first = step * (uint64_t)p->w0 * (uint64_t)p->b0;
        return p->rank < p->w0;
    }
    uint64_t first = 0;
    int k = 0;
    for (; k + 1 < p->nepochs && p->epochs[k + 1].from <= step; k++) {
        int per;
        uint64_t g;
        batches(p, count(p->epochs[k].ranks), &per, &g);
        first += (p->epochs[k + 1].from - p->epochs[k].from) * g;
    }
    uint64_t ranks = p->epochs[k].ranks, g;
    int n = count(ranks), per;
    batches(p, n, &per, &g);
    p->step_first = first + (step - p->epochs[k].from) * g;
    p->nworkers = n;
    p->batch = per;
    if (p->rank < 0 || p->rank >= 64 || !((ranks >> p->rank) & 1)) return 0;
    p->shard = count(ranks & ((UINT64_C(1) << p->rank) - 1));
    return 1;
}

int ps_worker_elastic_set(ps_worker_t *p, const char *json)
{
    /* [[from,[r,...]],...] from server 0's STATS */
    const char *c = json && *json == '[' ? json + 1 : NULL;
    struct ps_worker_epoch *ep = NULL;
    int n = 0;
    while (c && *c == '[') {
        char *end;
        struct ps_worker_epoch e = {strtoull(c + 1, &end, 10), 0};
        if (*end != ',' || end[1] != '[') break;
        for (c = end + 2; *c != ']';) {
            long r = strtol(c, &end, 10);
            if (end == c || r < 0 || r >= 64) { c = NULL; break; }
            e.ranks |= UINT64_C(1) << r;
            c = *end == ',' ? end + 1 : end;
        }
        if (!c) break;
        struct ps_worker_epoch *ne = realloc(ep, (size_t)(n + 1) * sizeof *ne);
        if (!ne) break;
        ep = ne;
        ep[n++] = e;
        c += 2; /* "]]" */
        if (*c == ',') c++;
    }
    if (!c || *c != ']' || n < 1 || (p->task->flags & PS_TASK_ELASTIC) == 0) {
        free(ep);
        if (n >= 1 && !(p->task->flags & PS_TASK_ELASTIC)) {
            ps_error("the job's membership changed, but the %s task shards its data once, at "
                     "start: elastic membership needs --model smoke for now", p->task->name);
            return PS_EUNSUPPORTED;
        }
        ps_error("membership epochs from server 0 do not parse: %.120s", json ? json : "(none)");
        return PS_EPROTO;
    }
    for (int i = 0; i < n; i++) {
        int per;
        uint64_t g;
        batches(p, count(ep[i].ranks), &per, &g);
        if (i >= p->nepochs || ep[i].ranks != p->epochs[i].ranks)
            ps_info("membership: %d worker(s) from step %" PRIu64 ", %d sample(s) each (global "
                    "batch %" PRIu64 ", --elastic-lr %s)", count(ep[i].ranks), ep[i].from, per, g,
                    p->o->elastic_lr);
    }
    free(p->epochs);
    p->epochs = ep;
    p->nepochs = n;
    return 0;
}
