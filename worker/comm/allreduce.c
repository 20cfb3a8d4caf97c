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
};

static int ring_open(void **state, int rank, int world, const char *const *peers,
                     const ps_allreduce_opts_t *o)
{
    ps_ring_opts_t ro;
    ps_ring_opts_default(&ro);
    ro.timeout_ms = o->timeout_ms;
    ro.nconn = o->nconn;
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
    .bytes = ring_bytes,
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
