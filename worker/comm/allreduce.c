/* The allreduce kinds (ps_allreduce.h) and the TCP ring's row. */
#include "worker/comm/ps_allreduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/comm/ps_ring.h"

struct ps_allreduce {
    const ps_allreduce_kind_t *k;
    void *state;
    int rank, world;
};

static int ring_open(void **state, int rank, int world, const char *const *peers,
                     const ps_allreduce_opts_t *o)
{
    ps_ring_opts_t ro;
    ps_ring_opts_default(&ro);
    ro.timeout_ms = o->timeout_ms;
    ro.nconn = o->nconn;
    ro.listen_fd = o->listen_fd > 0 ? o->listen_fd : -1;
    ps_ring_t *r = NULL;
    int rc = ps_ring_new(&r, rank, world, peers, &ro);
    if (rc)
        ps_error("cannot create ring rank %d of %d (bind %s): %s", rank, world, peers[rank],
                 ps_strerror(rc));
    *state = r;
    return rc;
}

static int ring_mean(void *state, float *buf, size_t n, ps_dtype_t dt)
{
    return ps_ring_allreduce_mean(state, buf, n, dt);
}

/* The zero-padded allreduce: every slot but this rank's is 0, and x + 0
 * (or 0 + x) is x in fp32, so the sum is the gather; the own slot is put
 * back afterwards because +0 + -0 is +0, not the -0 this rank sent. */
static int ring_gather(void *state, const float *mine, float *all, size_t n)
{
    ps_ring_t *r = state;
    const int rank = ps_ring_rank(r), W = ps_ring_world(r);
    memset(all, 0, (size_t)W * n * sizeof *all);
    memcpy(all + (size_t)rank * n, mine, n * sizeof *mine);
    int rc = ps_ring_allreduce(r, all, (size_t)W * n, PS_DT_FP32);
    if (!rc) memcpy(all + (size_t)rank * n, mine, n * sizeof *mine);
    return rc;
}

static int ring_set_timeout(void *state, int timeout_ms)
{
    return ps_ring_set_timeout(state, timeout_ms);
}

static void ring_bytes(void *state, uint64_t *sent, uint64_t *recv)
{
    ps_ring_bytes(state, sent, recv);
}

static void ring_close(void *state)
{
    ps_ring_t *r = state;
    ps_ring_destroy(&r);
}

const ps_allreduce_kind_t ps_allreduce_ring = {
    .name = "ring",
    .available = NULL,
    .open = ring_open,
    .mean = ring_mean,
    .gather = ring_gather,
    .bytes = ring_bytes,
    .set_timeout = ring_set_timeout,
    .close = ring_close,
};

#define MAX_KINDS 8
static const ps_allreduce_kind_t *kinds[MAX_KINDS] = {&ps_allreduce_ring};

int ps_allreduce_add_kind(const ps_allreduce_kind_t *k)
{
    for (int i = 0; i < MAX_KINDS; i++) {
        if (kinds[i] == k) return 0;
        if (!kinds[i]) {
            kinds[i] = k;
            return 0;
        }
    }
    return PS_ENOMEM;
}

static const ps_allreduce_kind_t *find(const char *name)
{
    for (int i = 0; i < MAX_KINDS && kinds[i]; i++)
        if (!strcmp(kinds[i]->name, name)) return kinds[i];
    return NULL;
}

int ps_allreduce_check(const char *name, char *why, size_t len)
{
    const ps_allreduce_kind_t *k = find(name);
    if (!k) {
        snprintf(why, len, "this build has no \"%s\" allreduce (built without CUDA/NCCL?)", name);
        return PS_EINVAL;
    }
    return k->available ? k->available(why, len) : 0;
}

int ps_allreduce_open(ps_allreduce_t **ar, const char *kind, int rank, int world,
                      const char *const *peers, const ps_allreduce_opts_t *o)
{
    char why[256];
    *ar = NULL;
    if (ps_allreduce_check(kind, why, sizeof why)) {
        ps_error("--allreduce %s: %s", kind, why);
        return PS_EUNSUPPORTED;
    }
    ps_allreduce_t *a = calloc(1, sizeof *a);
    if (!a) return PS_ENOMEM;
    a->k = find(kind);
    a->rank = rank;
    a->world = world;
    int rc = a->k->open(&a->state, rank, world, peers, o);
    if (rc) {
        free(a);
        return rc;
    }
    *ar = a;
    return 0;
}

int ps_allreduce_mean(ps_allreduce_t *ar, float *buf, size_t n, ps_dtype_t dt)
{
    return ar->k->mean(ar->state, buf, n, dt);
}

int ps_allreduce_gather(ps_allreduce_t *ar, const float *mine, float *all, size_t n)
{
    return ar->k->gather(ar->state, mine, all, n);
}

int ps_allreduce_set_timeout(ps_allreduce_t *ar, int timeout_ms)
{
    if (!ar || timeout_ms <= 0) return PS_EINVAL;
    return ar->k->set_timeout ? ar->k->set_timeout(ar->state, timeout_ms) : 0;
}

int ps_allreduce_rank(const ps_allreduce_t *ar) { return ar ? ar->rank : -1; }
int ps_allreduce_world(const ps_allreduce_t *ar) { return ar ? ar->world : 0; }

void ps_allreduce_bytes(const ps_allreduce_t *ar, uint64_t *sent, uint64_t *recv)
{
    *sent = *recv = 0;
    if (ar && ar->k->bytes) ar->k->bytes(ar->state, sent, recv);
}

void ps_allreduce_close(ps_allreduce_t **ar)
{
    if (!*ar) return;
    (*ar)->k->close((*ar)->state);
    free(*ar);
    *ar = NULL;
}
