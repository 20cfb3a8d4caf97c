/* The NCCL row of the allreduce kinds (ps_allreduce.h): the host buffer is
 * copied to the device, reduced by NCCL (ps_nccl.h) and copied back.  Built
 * with the CUDA backend (libps_nccl.a); without libnccl ps_nccl_* are stubs
 * and `available` says so. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/comm/ps_allreduce.h"
#include "worker/comm/ps_nccl.h"
#include "worker/engine/cuda/ps_cuda.h"

typedef struct nccl_state {
    ps_nccl_t *nccl;
    float *dbuf;      /* (max_numel) device copy of the buffer */
    size_t cap;
} nccl_state_t;

static int nccl_available(char *why, size_t len)
{
    if (ps_nccl_compiled()) return 0;
    snprintf(why, len, "this psworker was built with CUDA but configure found no libnccl; "
             "use --allreduce ring");
    return PS_EUNSUPPORTED;
}

static void nccl_close(void *state)
{
    nccl_state_t *s = state;
    if (!s) return;
    if (s->dbuf) ps_cuda_free(s->dbuf);
    ps_nccl_destroy(&s->nccl);
    free(s);
}

static int nccl_open(void **state, int rank, int world, const char *const *peers,
                     const ps_allreduce_opts_t *o)
{
    int dev = 0, ndev = ps_cuda_device_count(), rc;
    *state = NULL;
    if (o->device && !strncmp(o->device, "cuda:", 5)) dev = atoi(o->device + 5);
    else if (ndev > 0) dev = rank % ndev; /* one GPU per rank on a multi-GPU host */
    if (ndev < 1) {
        ps_error("--allreduce nccl: no CUDA device visible");
        return PS_EUNSUPPORTED;
    }
    nccl_state_t *s = calloc(1, sizeof *s);
    if (!s) return PS_ENOMEM;
    if ((rc = ps_nccl_new(&s->nccl, rank, world, peers[0], dev, o->timeout_ms))) {
        ps_error("NCCL communicator (rank %d of %d, rendezvous %s, device %d): %s", rank, world,
                 peers[0], dev, ps_strerror(rc));
    } else if ((rc = ps_cuda_malloc((void **)&s->dbuf, (o->max_numel ? o->max_numel : 1) *
                                                            sizeof(float)))) {
        ps_error("--allreduce nccl: no device memory for a %zu-float buffer", o->max_numel);
    }
    if (rc) {
        nccl_close(s);
        return rc;
    }
    s->cap = o->max_numel;
    *state = s;
    return 0;
}

static int nccl_mean(void *state, float *buf, size_t n, ps_dtype_t dt)
{
    nccl_state_t *s = state;
    if (n > s->cap) {
        ps_error("--allreduce nccl: %zu floats over the %zu the buffer was made for", n, s->cap);
        return PS_EINVAL;
    }
    int rc = ps_cuda_memcpy_h2d(s->dbuf, buf, n * sizeof(float));
    if (!rc) rc = ps_nccl_allreduce_mean(s->nccl, s->dbuf, n, dt, NULL);
    if (!rc) rc = ps_cuda_memcpy_d2h(buf, s->dbuf, n * sizeof(float));
    return rc;
}

/* The device buffer holds this rank's slot's copy at the front and the
 * gathered W*n after it: max_numel covers BN's vectors for any W the
 * gradient's size allows (they are a few KiB). */
static int nccl_gather(void *state, const float *mine, float *all, size_t n)
{
    nccl_state_t *s = state;
    const size_t W = (size_t)ps_nccl_world(s->nccl);
    if (n * (W + 1) > s->cap) {
        ps_error("--allreduce nccl: a gather of %zu x %zu floats over the %zu-float buffer", W, n,
                 s->cap);
        return PS_EINVAL;
    }
    int rc = ps_cuda_memcpy_h2d(s->dbuf, mine, n * sizeof(float));
    if (!rc) rc = ps_nccl_allgather(s->nccl, s->dbuf, s->dbuf + n, n, NULL);
    if (!rc) rc = ps_cuda_memcpy_d2h(all, s->dbuf + n, W * n * sizeof(float));
    return rc;
}

const ps_allreduce_kind_t ps_allreduce_nccl = {
    .name = "nccl",
    .available = nccl_available,
    .open = nccl_open,
    .mean = nccl_mean,
    .gather = nccl_gather,
    .bytes = NULL,
    .close = nccl_close,
};
