/* Averaging a gradient over W workers without servers: the kinds of
 * allreduce psworker's ring mode can use, as rows of a table.
 *
 *   ring   TCP ring (ps_ring.h): reduce-scatter + all-gather on the host;
 *          its gather is an allreduce of a buffer that is zero but for each
 *          rank's own slot (x + 0 is exact: the ranks' values arrive bit for
 *          bit, at twice an allgather's traffic, which for BN's few
 *          kilobytes per layer is latency, not bandwidth)
 *   nccl   NCCL (ps_nccl.h) on a device copy of the buffer (gather:
 *          ncclAllGather); compiled with
 *          CUDA, and added by the program that reads --allreduce
 *          (ps_allreduce_add_kind(&ps_allreduce_nccl)), so this library
 *          never needs CUDA to link
 *
 * Every rank calls mean with the same n and dtype in the same order and
 * gets the same bits back (the sum divided by (float)W as psd divides). */
#ifndef PS_ALLREDUCE_H
#define PS_ALLREDUCE_H
#include <stddef.h>
#include <stdint.h>

#include "ps_codec.h"

typedef struct ps_allreduce_opts {
    int timeout_ms;          /* longest wait for a peer (> 0) */
    int nconn;               /* ring: connections to the right neighbour */
    const char *device;      /* nccl: "cuda:N", else one GPU per rank (rank % visible) */
    size_t max_numel;        /* nccl: largest buffer mean will be given */
    int listen_fd;           /* ring: a socket ps_ring_listen bound for this rank
                                (-1 or 0 fields left unset: bind peers[rank]) */
} ps_allreduce_opts_t;

typedef struct ps_allreduce_kind {
    const char *name;
    /* 0 when this build can run it, else PS_EUNSUPPORTED with the reason in why */
    int (*available)(char *why, size_t len);
    int (*open)(void **state, int rank, int world, const char *const *peers,
                const ps_allreduce_opts_t *o);
    int (*mean)(void *state, float *buf, size_t n, ps_dtype_t dt);
    /* all[r*n .. r*n+n) := rank r's mine[0..n) for every rank, bit for bit
     * (host memory; cross-worker BN, ps_engine.h's ps_bn_group_t) */
    int (*gather)(void *state, const float *mine, float *all, size_t n);
    void (*bytes)(void *state, uint64_t *sent, uint64_t *recv); /* NULL: not counted */
    int (*set_timeout)(void *state, int timeout_ms); /* NULL: fixed at open */
    void (*close)(void *state);
} ps_allreduce_kind_t;

typedef struct ps_allreduce ps_allreduce_t;

extern const ps_allreduce_kind_t ps_allreduce_ring;
extern const ps_allreduce_kind_t ps_allreduce_nccl; /* libps_nccl.a (CUDA builds) */

/* Add a kind (the ring is always there).  0, or PS_ENOMEM when the table is full. */
int ps_allreduce_add_kind(const ps_allreduce_kind_t *k);
/* 0 when `name` can run here; else PS_EINVAL (no such kind in this build)
 * or the kind's PS_EUNSUPPORTED, the reason in why. */
int ps_allreduce_check(const char *name, char *why, size_t len);
/* Rank `rank` of `world`: peers[r] is rank r's endpoint.  0 or PS_E* (logged). */
int ps_allreduce_open(ps_allreduce_t **ar, const char *kind, int rank, int world,
                      const char *const *peers, const ps_allreduce_opts_t *o);
/* buf[0..n) := the mean over the ranks, in place on the host. */
int ps_allreduce_mean(ps_allreduce_t *ar, float *buf, size_t n, ps_dtype_t dt);
/* The kind's gather (above); the same order of calls on every rank, mixed
 * freely with mean.  0 or PS_E* (logged). */
int ps_allreduce_gather(ps_allreduce_t *ar, const float *mine, float *all, size_t n);
/* From now on wait at most timeout_ms (> 0) for a peer (a short bound for
 * a set-up exchange, the job's after it); 0, or PS_EINVAL. */
int ps_allreduce_set_timeout(ps_allreduce_t *ar, int timeout_ms);
int ps_allreduce_rank(const ps_allreduce_t *ar);
int ps_allreduce_world(const ps_allreduce_t *ar);
/* Bytes this rank sent / received so far (0 where the kind does not count). */
void ps_allreduce_bytes(const ps_allreduce_t *ar, uint64_t *sent, uint64_t *recv);
void ps_allreduce_close(ps_allreduce_t **ar);
#endif
