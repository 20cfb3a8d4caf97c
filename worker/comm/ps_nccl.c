/* NCCL allreduce with a ZeroMQ rendezvous and bounded waits (ps_nccl.h).
 * Plain C against NCCL's and the CUDA runtime's C headers; the one kernel it
 * needs (the mean's division) is in ps_nccl_div.cu. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/comm/ps_nccl.h"

#ifdef PS_HAVE_NCCL
#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <time.h>
#include <zmq.h>

#include "worker/engine/cuda/ps_cuda.h"

/* ps_nccl_div.cu */
int ps_nccl_div_f32(float *d, size_t n, float w, void *stream);

#define RDV_MAGIC 0x314e5350u /* "PSN1" little-endian */
#define RDV_REQ_BYTES 16
#define RDV_REP_BYTES (16 + sizeof(ncclUniqueId))

struct ps_nccl {
    int rank, world, device, timeout_ms;
    ncclComm_t comm;    /* NULL once aborted */
    int broken;         /* an allreduce failed: only destroy is left */
    void *stage;        /* device staging buffer for fp16 / bf16 on the wire */
    size_t stage_bytes;
};

int ps_nccl_compiled(void) { return 1; }

/* ---- call-site checks ---------------------------------------------------- */

/* ncclInProgress is not an error on a non-blocking communicator: the caller
 * then waits with wait_comm.  Invalid usage is mostly "two ranks on one GPU"
 * (or mismatched calls), which no retry fixes. */
static int nccl_code(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
    case ncclInProgress: return 0;
    case ncclInvalidArgument: return PS_EINVAL;
    case ncclInvalidUsage: return PS_EUNSUPPORTED;
    default: return PS_ECUDA;
    }
}

static int nccl_check_(ncclResult_t r, ncclComm_t comm, const char *what, const char *file,
                       int line)
{
    int rc = nccl_code(r);
    if (rc) {
        const char *last = ncclGetLastError(comm);
        ps_log_write(PS_LOG_ERROR, file, line, "%s: %s%s%s", what, ncclGetErrorString(r),
                     last && *last ? ": " : "", last ? last : "");
    }
    return rc;
}
#define NCCL_CHECK(call, comm) nccl_check_((call), (comm), #call, __FILE__, __LINE__)

static int cuda_check_(cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess) return 0;
    ps_log_write(PS_LOG_ERROR, file, line, "%s: %s", what, cudaGetErrorString(e));
    return PS_ECUDA;
}
#define CUDA_CHECK(call) cuda_check_((call), #call, __FILE__, __LINE__)

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void nap(long us)
{
    struct timespec t = {0, us * 1000};
    nanosleep(&t, NULL);
}

/* Poll a non-blocking communicator until its last call has left
 * ncclInProgress.  A dead peer shows up as an async error or as no progress;
 * the caller aborts the communicator in both cases. */
static int wait_comm(ncclComm_t comm, const char *what, int64_t deadline, int timeout_ms)
{
    for (;;) {
        ncclResult_t st = ncclInProgress;
        int rc = NCCL_CHECK(ncclCommGetAsyncError(comm, &st), comm);
        if (rc) return rc;
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) {
            const char *last = ncclGetLastError(comm);
            ps_error("nccl: %s failed: %s%s%s", what, ncclGetErrorString(st),
                     last && *last ? ": " : "", last ? last : "");
            return nccl_code(st);
        }
        if (now_ms() >= deadline) {
            ps_error("nccl: %s made no progress within %d ms (a rank missing or dead?)", what,
                     timeout_ms);
            return PS_ETIMEOUT;
        }
        nap(200);
    }
}

/* Abort (never blocks on peers) and mark the object broken; returns rc. */
static int fail(ps_nccl_t *n, int rc)
{
    if (n->comm) {
        ncclResult_t r = ncclCommAbort(n->comm);
        if (r != ncclSuccess && r != ncclInProgress)
            ps_warn("nccl: ncclCommAbort: %s", ncclGetErrorString(r));
        n->comm = NULL;
    }
    n->broken = 1;
    return rc;
}

/* ---- rendezvous over ZeroMQ ---------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}
static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int zfail(const char *what, const char *ep)
{
    ps_error("nccl rendezvous: %s %s: %s", what, ep ? ep : "", zmq_strerror(zmq_errno()));
    return PS_EZMQ;
}

static int setopt_int(void *s, int opt, int v)
{
    return zmq_setsockopt(s, opt, &v, sizeof v) ? zfail("zmq_setsockopt", NULL) : 0;
}

/* Wait for readability until `deadline`; 1 = readable, 0 = timed out. */
static int poll_in(void *s, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) return 0;
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(&it, 1, (long)left);
        if (rc > 0) return 1;
        if (rc < 0 && zmq_errno() != EINTR) return zfail("zmq_poll", NULL);
    }
}

/* Answer one request on the ROUTER: [identity][""][16-byte request].
 * Returns the rank accepted (>= 1), 0 for a refused or malformed request, or
 * a negative PS_E*. */
static int root_serve_one(void *s, const ps_nccl_t *n, const ncclUniqueId *id, char *seen)
{
    zmq_msg_t f[3];
    int nf = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, 0) < 0) {
            zmq_msg_close(&m);
            for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
            return zfail("zmq_msg_recv", NULL);
        }
        more = zmq_msg_more(&m);
        if (nf < 3) f[nf++] = m;
        else zmq_msg_close(&m), nf = 4; /* too many frames: drop below */
    }
    if (nf != 3 || zmq_msg_size(&f[1]) != 0) {
        ps_warn("nccl rendezvous: dropping a malformed request (%d frames)", nf);
        for (int i = 0; i < nf && i < 3; i++) zmq_msg_close(&f[i]);
        return 0;
    }
    const uint8_t *q = zmq_msg_data(&f[2]);
    int status = 0, peer = -1;
    if (zmq_msg_size(&f[2]) != RDV_REQ_BYTES || get_u32(q) != RDV_MAGIC) {
        ps_error("nccl rendezvous: request of %zu bytes is not a PSN1 request",
                 zmq_msg_size(&f[2]));
        status = PS_EPROTO;
    } else {
        peer = (int)get_u32(q + 4);
        uint32_t w = get_u32(q + 8);
        if (w != (uint32_t)n->world) {
            ps_error("nccl rendezvous: rank %d says world %u, rank 0 has %d", peer, w, n->world);
            status = PS_EMISMATCH;
        } else if (peer < 1 || peer >= n->world) {
            ps_error("nccl rendezvous: rank %d out of range 1..%d", peer, n->world - 1);
            status = PS_EINVAL;
        } else if (seen[peer]) {
            ps_error("nccl rendezvous: rank %d asked twice (two workers with one rank?)", peer);
            status = PS_EINVAL;
        }
    }
    uint8_t rep[RDV_REP_BYTES];
    memset(rep, 0, sizeof rep);
    put_u32(rep, RDV_MAGIC);
    put_u32(rep + 4, (uint32_t)status);
    put_u32(rep + 8, (uint32_t)n->world);
    if (!status) memcpy(rep + 16, id, sizeof *id);
    int rc = 0;
    if (zmq_msg_send(&f[0], s, ZMQ_SNDMORE) < 0 || zmq_msg_send(&f[1], s, ZMQ_SNDMORE) < 0 ||
        zmq_send(s, rep, sizeof rep, 0) < 0)
        rc = zfail("cannot answer rank", NULL);
    for (int i = 0; i < 3; i++) zmq_msg_close(&f[i]); /* no-op for frames sent */
    if (rc) return rc;
    if (status) return 0;
    seen[peer] = 1;
    return peer;
}

/* Rank 0: hand the id to ranks 1..world-1, each once. */
static int rendezvous_root(const ps_nccl_t *n, const char *ep, const ncclUniqueId *id)
{
    int64_t deadline = now_ms() + n->timeout_ms;
    int rc = 0, served = 0;
    char *seen = calloc((size_t)n->world, 1);
    void *ctx = zmq_ctx_new(), *s = NULL;
    if (!seen) { rc = PS_ENOMEM; goto out; }
    if (!ctx) { rc = zfail("zmq_ctx_new", NULL); goto out; }
    if (!(s = zmq_socket(ctx, ZMQ_ROUTER))) { rc = zfail("zmq_socket(ROUTER)", NULL); goto out; }
    /* linger so that the last replies still go out after close */
    if ((rc = setopt_int(s, ZMQ_LINGER, n->timeout_ms))) goto out;
    if (zmq_bind(s, ep)) { rc = zfail("cannot bind", ep); goto out; }
    while (served < n->world - 1) {
        int r = poll_in(s, deadline);
        if (r < 0) { rc = r; goto out; }
        if (r == 0) {
            int first = 1;
            while (first < n->world && seen[first]) first++;
            ps_error("nccl rendezvous: %d of %d ranks did not ask %s within %d ms (rank %d first)",
                     n->world - 1 - served, n->world - 1, ep, n->timeout_ms, first);
            rc = PS_ETIMEOUT;
            goto out;
        }
        if ((r = root_serve_one(s, n, id, seen)) < 0) { rc = r; goto out; }
        if (r > 0) served++;
    }
out:
    if (s) zmq_close(s);
    if (ctx) zmq_ctx_term(ctx);
    free(seen);
    return rc;
}

/* Ranks 1..world-1: ask rank 0 for the id. */
static int rendezvous_peer(const ps_nccl_t *n, const char *ep, ncclUniqueId *id)
{
    int64_t deadline = now_ms() + n->timeout_ms;
    int rc = 0;
    void *ctx = zmq_ctx_new(), *s = NULL;
    uint8_t req[RDV_REQ_BYTES] = {0}, rep[RDV_REP_BYTES + 1];
    if (!ctx) return zfail("zmq_ctx_new", NULL);
    if (!(s = zmq_socket(ctx, ZMQ_REQ))) { rc = zfail("zmq_socket(REQ)", NULL); goto out; }
    if ((rc = setopt_int(s, ZMQ_LINGER, 0)) || (rc = setopt_int(s, ZMQ_SNDTIMEO, n->timeout_ms)))
        goto out;
    if (zmq_connect(s, ep)) { rc = zfail("cannot connect to", ep); goto out; }
    put_u32(req, RDV_MAGIC);
    put_u32(req + 4, (uint32_t)n->rank);
    put_u32(req + 8, (uint32_t)n->world);
    if (zmq_send(s, req, sizeof req, 0) < 0) {
        rc = zmq_errno() == EAGAIN ? PS_ETIMEOUT : zfail("cannot send to", ep);
        goto out;
    }
    int r = poll_in(s, deadline);
    if (r <= 0) {
        if (r == 0)
            ps_error("nccl rendezvous: rank %d: no answer from rank 0 at %s within %d ms",
                     n->rank, ep, n->timeout_ms);
        rc = r ? r : PS_ETIMEOUT;
        goto out;
    }
    int len = zmq_recv(s, rep, sizeof rep, ZMQ_DONTWAIT);
    if (len < 0) { rc = zfail("cannot receive from", ep); goto out; }
    if (len != (int)RDV_REP_BYTES || get_u32(rep) != RDV_MAGIC) {
        ps_error("nccl rendezvous: rank 0 at %s answered %d bytes, not a PSN1 reply", ep, len);
        rc = PS_EPROTO;
        goto out;
    }
    int status = (int)get_u32(rep + 4);
    if (status) {
        ps_error("nccl rendezvous: rank 0 refused rank %d of world %d: %s", n->rank, n->world,
                 ps_strerror(status));
        rc = status < 0 && status >= PS_ECUDA ? status : PS_EPROTO;
        goto out;
    }
    if (get_u32(rep + 8) != (uint32_t)n->world) {
        ps_error("nccl rendezvous: rank 0 has world %u, this rank %d", get_u32(rep + 8), n->world);
        rc = PS_EMISMATCH;
        goto out;
    }
    memcpy(id, rep + 16, sizeof *id);
out:
    if (s) zmq_close(s);
    zmq_ctx_term(ctx);
    return rc;
}

/* ---- public API ----------------------------------------------------------- */

int ps_nccl_new(ps_nccl_t **np, int rank, int world, const char *endpoint0, int device,
                int timeout_ms)
{
    if (!np) return PS_EINVAL;
    *np = NULL;
    if (world < 1 || rank < 0 || rank >= world || (world > 1 && !endpoint0) || device < 0 ||
        timeout_ms <= 0) {
        ps_error("nccl: bad arguments (rank %d, world %d, endpoint %s, device %d, timeout %d ms)",
                 rank, world, endpoint0 ? endpoint0 : "NULL", device, timeout_ms);
        return PS_EINVAL;
    }
    ps_nccl_t *n = calloc(1, sizeof *n);
    if (!n) return PS_ENOMEM;
    n->rank = rank, n->world = world, n->device = device, n->timeout_ms = timeout_ms;

    /* the rendezvous comes first and needs no GPU, so a missing rank 0 is
     * reported the same way on every machine */
    ncclUniqueId id;
    int rc = 0;
    memset(&id, 0, sizeof id);
    if (rank == 0) {
        if (!(rc = NCCL_CHECK(ncclGetUniqueId(&id), NULL)) && world > 1)
            rc = rendezvous_root(n, endpoint0, &id);
    } else {
        rc = rendezvous_peer(n, endpoint0, &id);
    }
    if (!rc) rc = CUDA_CHECK(cudaSetDevice(device));
    if (rc) {
        free(n);
        return rc;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* every wait below is ours, with a deadline */
    rc = NCCL_CHECK(ncclCommInitRankConfig(&n->comm, world, id, rank, &cfg), NULL);
    if (!rc && n->comm)
        rc = wait_comm(n->comm, "ncclCommInitRankConfig", now_ms() + timeout_ms, timeout_ms);
    else if (!rc)
        rc = PS_ECUDA; /* success without a communicator: never seen, but be safe */
    if (rc) {
        fail(n, rc);
        free(n);
        return rc;
    }
    *np = n;
    return 0;
}

/* Wait for the stream (which holds our allreduce) while watching NCCL for a
 * peer failure: cudaStreamSynchronize would wait forever for a dead rank. */
static int wait_stream(ps_nccl_t *n, void *stream, int64_t deadline)
{
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return CUDA_CHECK(e);
        ncclResult_t st = ncclSuccess;
        int rc = NCCL_CHECK(ncclCommGetAsyncError(n->comm, &st), n->comm);
        if (!rc && st != ncclSuccess && st != ncclInProgress) {
            ps_error("nccl: allreduce failed: %s (%s)", ncclGetErrorString(st),
                     ncclGetLastError(n->comm));
            rc = nccl_code(st);
        }
        if (rc) return rc;
        if (now_ms() >= deadline) {
            ps_error("nccl: allreduce (rank %d of %d) not done within %d ms (a rank dead?)",
                     n->rank, n->world, n->timeout_ms);
            return PS_ETIMEOUT;
        }
        nap(50);
    }
}

static int allreduce(ps_nccl_t *n, float *buf, size_t count, ps_dtype_t dt, void *stream,
                     int mean)
{
    if (!n) return PS_EINVAL;
    if (n->broken) {
        ps_error("nccl: communicator broken by an earlier failure; destroy and rebuild it");
        return PS_ESTATE;
    }
    if (count == 0) return 0;
    if (!buf || (dt != PS_DT_FP32 && dt != PS_DT_FP16 && dt != PS_DT_BF16) ||
        count > SIZE_MAX / sizeof(float)) {
        ps_error("nccl: bad allreduce arguments (buf %p, count %zu, dtype %d)", (void *)buf,
                 count, (int)dt);
        return PS_EINVAL;
    }
    int rc = CUDA_CHECK(cudaSetDevice(n->device));
    if (rc) return rc;
    void *wire = buf;
    ncclDataType_t t = ncclFloat;
    if (dt != PS_DT_FP32) {
        size_t need = count * sizeof(uint16_t);
        if (n->stage_bytes < need) {
            ps_cuda_free(n->stage); /* earlier calls waited for their work */
            n->stage = NULL, n->stage_bytes = 0;
            if ((rc = ps_cuda_malloc(&n->stage, need))) return rc;
            n->stage_bytes = need;
        }
        wire = n->stage;
        t = dt == PS_DT_FP16 ? ncclHalf : ncclBfloat16;
        rc = dt == PS_DT_FP16 ? ps_cuda_f32_to_f16(wire, buf, count, stream)
                              : ps_cuda_f32_to_bf16(wire, buf, count, stream);
        if (rc) return rc;
    }
    int64_t deadline = now_ms() + n->timeout_ms;
    /* from here on work is queued on the communicator: any failure aborts it */
    rc = NCCL_CHECK(ncclAllReduce(wire, wire, count, t, ncclSum, n->comm, (cudaStream_t)stream),
                    n->comm);
    if (!rc) rc = wait_comm(n->comm, "ncclAllReduce", deadline, n->timeout_ms);
    if (!rc && dt == PS_DT_FP16) rc = ps_cuda_f16_to_f32(buf, wire, count, stream);
    if (!rc && dt == PS_DT_BF16) rc = ps_cuda_bf16_to_f32(buf, wire, count, stream);
    if (!rc && mean && n->world > 1) rc = ps_nccl_div_f32(buf, count, (float)n->world, stream);
    if (!rc) rc = wait_stream(n, stream, deadline);
    return rc ? fail(n, rc) : 0;
}

int ps_nccl_allreduce(ps_nccl_t *n, float *dev_buf, size_t count, ps_dtype_t dtype, void *stream)
{
    return allreduce(n, dev_buf, count, dtype, stream, 0);
}

int ps_nccl_allreduce_mean(ps_nccl_t *n, float *dev_buf, size_t count, ps_dtype_t dtype,
                           void *stream)
{
    return allreduce(n, dev_buf, count, dtype, stream, 1);
}

int ps_nccl_allgather(ps_nccl_t *n, const float *dev_send, float *dev_recv, size_t count,
                      void *stream)
{
    if (!n) return PS_EINVAL;
    if (n->broken) {
        ps_error("nccl: communicator broken by an earlier failure; destroy and rebuild it");
        return PS_ESTATE;
    }
    if (count == 0) return 0;
    if (!dev_send || !dev_recv || count > SIZE_MAX / sizeof(float) / (size_t)n->world) {
        ps_error("nccl: bad allgather arguments (count %zu)", count);
        return PS_EINVAL;
    }
    int rc = CUDA_CHECK(cudaSetDevice(n->device));
    if (rc) return rc;
    int64_t deadline = now_ms() + n->timeout_ms;
    rc = NCCL_CHECK(ncclAllGather(dev_send, dev_recv, count, ncclFloat, n->comm,
                                  (cudaStream_t)stream),
                    n->comm);
    if (!rc) rc = wait_comm(n->comm, "ncclAllGather", deadline, n->timeout_ms);
    if (!rc) rc = wait_stream(n, stream, deadline);
    return rc ? fail(n, rc) : 0;
}

int ps_nccl_rank(const ps_nccl_t *n) { return n ? n->rank : -1; }
int ps_nccl_world(const ps_nccl_t *n) { return n ? n->world : -1; }

void ps_nccl_destroy(ps_nccl_t **np)
{
    if (!np || !*np) return;
    ps_nccl_t *n = *np;
    if (n->comm) {
        /* finalize flushes outstanding work with the peers; bounded like
         * everything else, and an abort if it does not finish */
        int rc = CUDA_CHECK(cudaSetDevice(n->device));
        if (!rc) rc = NCCL_CHECK(ncclCommFinalize(n->comm), n->comm);
        if (!rc)
            rc = wait_comm(n->comm, "ncclCommFinalize", now_ms() + n->timeout_ms, n->timeout_ms);
        if (!rc && NCCL_CHECK(ncclCommDestroy(n->comm), n->comm) == 0)
            n->comm = NULL;
        else
            fail(n, rc);
    }
    ps_cuda_free(n->stage);
    free(n);
    *np = NULL;
}

#else /* !PS_HAVE_NCCL: stubs, so callers link the same way everywhere */

struct ps_nccl {
    int rank, world;
};

int ps_nccl_compiled(void) { return 0; }

int ps_nccl_new(ps_nccl_t **n, int rank, int world, const char *endpoint0, int device,
                int timeout_ms)
{
    (void)rank, (void)world, (void)endpoint0, (void)device, (void)timeout_ms;
    if (n) *n = NULL;
    ps_error("nccl: this build has no NCCL (configure did not find libnccl)");
    return PS_EUNSUPPORTED;
}

int ps_nccl_allreduce(ps_nccl_t *n, float *dev_buf, size_t count, ps_dtype_t dtype, void *stream)
{
    (void)n, (void)dev_buf, (void)count, (void)dtype, (void)stream;
    return PS_EUNSUPPORTED;
}

int ps_nccl_allreduce_mean(ps_nccl_t *n, float *dev_buf, size_t count, ps_dtype_t dtype,
                           void *stream)
{
    (void)n, (void)dev_buf, (void)count, (void)dtype, (void)stream;
    return PS_EUNSUPPORTED;
}

int ps_nccl_allgather(ps_nccl_t *n, const float *dev_send, float *dev_recv, size_t count,
                      void *stream)
{
    (void)n, (void)dev_send, (void)dev_recv, (void)count, (void)stream;
    return PS_EUNSUPPORTED;
}

int ps_nccl_rank(const ps_nccl_t *n) { return n ? n->rank : -1; }
int ps_nccl_world(const ps_nccl_t *n) { return n ? n->world : -1; }

void ps_nccl_destroy(ps_nccl_t **n)
{
    if (n) *n = NULL;
}
#endif
