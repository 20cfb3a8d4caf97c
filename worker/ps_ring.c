/* Ring allreduce over ZeroMQ PUSH/PULL: chunked, pipelined reduce-scatter
 * + all-gather.  The contract and the determinism / quantisation notes are
 * in ps_ring.h.
 *
 * Schedule (rank r, W ranks, K segments per chunk, global step s in
 * [0, 2W-2)):
 *   reduce-scatter s <  W-1: send chunk (r - s), receive chunk (r - s - 1)
 *                            and add it to the local values;
 *   all-gather  s >= W-1, t = s-(W-1): send chunk (r + 1 - t), receive chunk
 *                            (r - t) and overwrite.
 * Message index i = s*K + k.  Sending i (s > 0) needs received i - K: what is
 * sent at step s is exactly what arrived at step s-1 (plus, during the
 * reduce-scatter, this rank's own values).  Nothing else orders the loop, so
 * segment k of step s+1 leaves while segment k+1 of step s is still on the
 * wire -- that is the pipelining.  Each chunk region is received at most
 * twice (reduce-scatter step s1, all-gather step s1+W... i.e. after the data
 * has travelled once round the ring), so a message can never land in a
 * region this rank still has to read: the ring's causality orders it.
 *
 * With several connections per neighbour messages may arrive out of order,
 * which the index handles; the left neighbour may even start the next
 * allreduce (op + 1) before this rank has received its last segments of op,
 * so such messages are kept (stash) for the next call. */
#include "ps_ring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"

#define RING_MAGIC 0x31525350u /* "PSR1" little-endian */
#define RING_HDR 32u
#define RING_MAX_CONN 16
#define RING_MAX_N ((size_t)1 << 40)

/* A received message: header frame and payload frame. */
typedef struct ring_msg {
    zmq_msg_t hdr, pl;
} ring_msg_t;

struct ps_ring {
    int rank, world;
    ps_ring_opts_t o;
    void *ctx;
    void *pull;                  /* bound; messages from the left neighbour */
    void *push[RING_MAX_CONN];   /* connected to the right neighbour */
    char *ep_self, *ep_left, *ep_right;
    uint32_t op;                 /* allreduces started so far */
    int broken;                  /* an allreduce failed: ring unusable */
    ring_msg_t *stash;           /* early messages of the next op */
    size_t nstash, stash_cap;
    uint8_t *done;               /* per message index: received */
    ring_msg_t *fwd;             /* per message index: all-gather payload to pass on */
    size_t done_cap;
    uint64_t bytes_sent, bytes_recv;
};

/* One allreduce in progress. */
typedef struct ring_job {
    float *data;
    size_t n;
    ps_dtype_t dt;
    size_t es;         /* wire element size */
    size_t seg;        /* elements per segment */
    uint32_t K;        /* segments per chunk */
    uint32_t total;    /* messages each way: 2(W-1)K */
    uint32_t nrecv;
} ring_job_t;

void ps_ring_opts_default(ps_ring_opts_t *o)
{
    o->timeout_ms = 30000;
    o->segment_bytes = 1u << 20;
    o->nconn = 1;
    o->io_threads = 0;
    o->checksum = 1;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int mod(int a, int w)
{
    return ((a % w) + w) % w;
}

/* First element and length of chunk c: n split as evenly as possible, the
 * first n % W chunks one element longer. */
static void chunk_range(size_t n, int W, int c, size_t *off, size_t *len)
{
    size_t base = n / (size_t)W, rem = n % (size_t)W, cc = (size_t)c;
    *off = cc * base + (cc < rem ? cc : rem);
    *len = base + (cc < rem);
}

/* Elements [*off, *off + *len) of the data that message index i carries,
 * seen from rank r (recv = 1: what r receives, 0: what r sends). */
static void msg_range(const ps_ring_t *r, const ring_job_t *j, uint32_t i, int recv, size_t *off,
                      size_t *len, int *chunk)
{
    int W = r->world, s = (int)(i / j->K), k = (int)(i % j->K), c;
    if (s < W - 1) c = recv ? r->rank - s - 1 : r->rank - s;
    else c = recv ? r->rank - (s - (W - 1)) : r->rank + 1 - (s - (W - 1));
    c = mod(c, W);
    size_t coff, clen, lo = (size_t)k * j->seg;
    chunk_range(j->n, W, c, &coff, &clen);
    *off = coff + (lo < clen ? lo : clen);
    *len = lo < clen ? (clen - lo < j->seg ? clen - lo : j->seg) : 0;
    *chunk = c;
}

static int zmq_fail(const char *what, const char *ep)
{
    ps_error("ring: %s %s: %s", what, ep ? ep : "", zmq_strerror(zmq_errno()));
    return PS_EZMQ;
}

static int setopt_int(void *s, int opt, int v, const char *name)
{
    if (zmq_setsockopt(s, opt, &v, sizeof v)) {
        ps_error("ring: zmq_setsockopt(%s=%d): %s", name, v, zmq_strerror(zmq_errno()));
        return PS_EZMQ;
    }
    return 0;
}

int ps_ring_new(ps_ring_t **out, int rank, int world, const char *const *endpoints,
                const ps_ring_opts_t *opts)
{
    if (!out) return PS_EINVAL;
    *out = NULL;
    if (world < 1 || world > 65535 || rank < 0 || rank >= world || !endpoints) {
        ps_error("ring: invalid rank %d of world %d%s", rank, world, endpoints ? "" : " (no endpoints)");
        return PS_EINVAL;
    }
    for (int i = 0; i < world; i++)
        if (!endpoints[i] || !endpoints[i][0]) {
            ps_error("ring: endpoint of rank %d is missing", i);
            return PS_EINVAL;
        }
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    if (opts) o = *opts;
    if (o.timeout_ms <= 0 || o.segment_bytes < 64 || o.segment_bytes > ((size_t)1 << 30) ||
        o.nconn < 1 || o.nconn > RING_MAX_CONN || o.io_threads < 0 || o.io_threads > 64) {
        ps_error("ring: invalid options (timeout_ms %d, segment_bytes %zu, nconn %d, io_threads %d)",
                 o.timeout_ms, o.segment_bytes, o.nconn, o.io_threads);
        return PS_EINVAL;
    }
    if (!o.io_threads) o.io_threads = o.nconn;
    ps_ring_t *r = calloc(1, sizeof *r);
    if (!r) return PS_ENOMEM;
    r->rank = rank;
    r->world = world;
    r->o = o;
    r->ep_self = strdup(endpoints[rank]);
    r->ep_left = strdup(endpoints[mod(rank - 1, world)]);
    r->ep_right = strdup(endpoints[(rank + 1) % world]);
    if (!r->ep_self || !r->ep_left || !r->ep_right) {
        ps_ring_destroy(&r);
        return PS_ENOMEM;
    }
    *out = r;
    if (world == 1) return 0; /* nothing to talk to */

    int rc = 0;
    r->ctx = zmq_ctx_new();
    if (!r->ctx || zmq_ctx_set(r->ctx, ZMQ_IO_THREADS, o.io_threads)) {
        rc = zmq_fail("cannot create context", NULL);
        goto fail;
    }
    r->pull = zmq_socket(r->ctx, ZMQ_PULL);
    if (!r->pull) {
        rc = zmq_fail("cannot create PULL socket", NULL);
        goto fail;
    }
    /* The algorithm bounds what is in flight (at most one op's messages plus
     * the next op's early ones), so no high-water mark is needed; a message
     * larger than a segment is refused by ZeroMQ before it is buffered. */
    int64_t maxmsg = (int64_t)(RING_HDR + o.segment_bytes + 4);
    if ((rc = setopt_int(r->pull, ZMQ_RCVHWM, 0, "RCVHWM")) ||
        (rc = setopt_int(r->pull, ZMQ_LINGER, 0, "LINGER")))
        goto fail;
    if (zmq_setsockopt(r->pull, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg)) {
        rc = zmq_fail("setsockopt MAXMSGSIZE", NULL);
        goto fail;
    }
    if (zmq_bind(r->pull, r->ep_self)) {
        rc = zmq_fail("cannot bind", r->ep_self);
        goto fail;
    }
    for (int c = 0; c < o.nconn; c++) {
        void *s = r->push[c] = zmq_socket(r->ctx, ZMQ_PUSH);
        if (!s) {
            rc = zmq_fail("cannot create PUSH socket", NULL);
            goto fail;
        }
        /* IMMEDIATE: a send to a neighbour that is not connected waits (and
         * times out) instead of queueing into nowhere.  LINGER: destroy waits
         * for the last all-gather segments, but never forever. */
        if ((rc = setopt_int(s, ZMQ_SNDHWM, 0, "SNDHWM")) ||
            (rc = setopt_int(s, ZMQ_IMMEDIATE, 1, "IMMEDIATE")) ||
            (rc = setopt_int(s, ZMQ_LINGER, o.timeout_ms, "LINGER")))
            goto fail;
        if (zmq_connect(s, r->ep_right)) {
            rc = zmq_fail("cannot connect to", r->ep_right);
            goto fail;
        }
    }
    ps_debug("ring: rank %d/%d bound %s, connected %d x to %s", rank, world, r->ep_self, o.nconn,
             r->ep_right);
    return 0;
fail:
    ps_ring_destroy(out);
    return rc;
}

int ps_ring_rank(const ps_ring_t *r)
{
    return r ? r->rank : -1;
}

int ps_ring_world(const ps_ring_t *r)
{
    return r ? r->world : 0;
}

void ps_ring_bytes(const ps_ring_t *r, uint64_t *sent, uint64_t *received)
{
    if (sent) *sent = r ? r->bytes_sent : 0;
    if (received) *received = r ? r->bytes_recv : 0;
}

void ps_ring_destroy(ps_ring_t **rp)
{
    if (!rp || !*rp) return;
    ps_ring_t *r = *rp;
    for (size_t i = 0; i < r->nstash; i++) zmq_msg_close(&r->stash[i]);
    free(r->stash);
    if (r->pull) zmq_close(r->pull);
    for (int c = 0; c < RING_MAX_CONN; c++)
        if (r->push[c]) zmq_close(r->push[c]);
    if (r->ctx) zmq_ctx_term(r->ctx);
    free(r->done);
    free(r->ep_self);
    free(r->ep_left);
    free(r->ep_right);
    free(r);
    *rp = NULL;
}

/* Build message i (header + encoded payload).  When it is the first
 * all-gather step with a narrow wire dtype, the finished chunk is also
 * rounded in place to what the other ranks will decode, so that every rank
 * ends with the same bits. */
static int build_msg(ps_ring_t *r, ring_job_t *j, uint32_t i, zmq_msg_t *m)
{
    size_t off, len, wlen = 0;
    int chunk;
    msg_range(r, j, i, 0, &off, &len, &chunk);
    if (zmq_msg_init_size(m, RING_HDR + len * j->es)) {
        ps_error("ring: cannot allocate a %zu-byte message", RING_HDR + len * j->es);
        return PS_ENOMEM;
    }
    uint8_t *p = zmq_msg_data(m), *pl = p + RING_HDR;
    int rc = len ? ps_codec_encode(pl, len * j->es, &wlen, j->data + off, len, j->dt, PS_CODEC_RAW, NULL)
                 : 0;
    if (!rc && len && j->dt != PS_DT_FP32 && i / j->K == (uint32_t)r->world - 1)
        rc = ps_codec_decode_ex(j->data + off, len, pl, wlen, j->dt, PS_CODEC_RAW, PS_DECODE_SET, NULL);
    if (rc) {
        zmq_msg_close(m);
        return rc;
    }
    put32(p, RING_MAGIC);
    p[4] = (uint8_t)j->dt;
    p[5] = 0;
    p[6] = (uint8_t)(r->rank & 0xff);
    p[7] = (uint8_t)(r->rank >> 8);
    put32(p + 8, r->op);
    put32(p + 12, i);
    put64(p + 16, j->n);
    put32(p + 24, (uint32_t)len);
    put32(p + 28, r->o.checksum ? ps_crc32c(0, pl, wlen) : 0);
    return 0;
}

/* Check and apply one received message of the current op. */
static int take_msg(ps_ring_t *r, ring_job_t *j, zmq_msg_t *m)
{
    const uint8_t *p = zmq_msg_data(m);
    size_t sz = zmq_msg_size(m);
    int left = mod(r->rank - 1, r->world);
    uint32_t i = get32(p + 12), count = get32(p + 24);
    int sender = p[6] | p[7] << 8;
    if (p[4] != (uint8_t)j->dt) {
        ps_error("ring: rank %d sent dtype %u, this rank %d reduces %s: every rank must use the same dtype",
                 left, p[4], r->rank, ps_dtype_name(j->dt));
        return PS_EMISMATCH;
    }
    if (get64(p + 16) != j->n) {
        ps_error("ring: rank %d reduces %llu elements, this rank %d %zu: every rank must pass the same n",
                 left, (unsigned long long)get64(p + 16), r->rank, j->n);
        return PS_EMISMATCH;
    }
    if (sender != left || i >= j->total || r->done[i]) {
        ps_error("ring: rank %d got message %u from rank %d (expected rank %d, index < %u, once)",
                 r->rank, i, sender, left, j->total);
        return PS_EPROTO;
    }
    size_t off, len;
    int chunk;
    msg_range(r, j, i, 1, &off, &len, &chunk);
    if (count != len || sz != RING_HDR + len * j->es) {
        ps_error("ring: rank %d: message %u (chunk %d) carries %u elements in %zu bytes, expected %zu",
                 r->rank, i, chunk, count, sz, len);
        return PS_EMISMATCH;
    }
    const uint8_t *pl = p + RING_HDR;
    if (r->o.checksum && ps_crc32c(0, pl, sz - RING_HDR) != get32(p + 28)) {
        ps_error("ring: rank %d: checksum mismatch in message %u from rank %d (%s)", r->rank, i, left,
                 r->ep_left);
        return PS_ECORRUPT;
    }
    int rs = i / j->K < (uint32_t)r->world - 1;
    int rc = len ? ps_codec_decode_ex(j->data + off, len, pl, sz - RING_HDR, j->dt, PS_CODEC_RAW,
                                      rs ? PS_DECODE_ADD : PS_DECODE_SET, NULL)
                 : 0;
    if (rc) return rc;
    r->done[i] = 1;
    j->nrecv++;
    return 0;
}

/* A message just received: apply it, keep it for the next op, or fail.
 * Takes ownership of *m. */
static int on_msg(ps_ring_t *r, ring_job_t *j, zmq_msg_t *m)
{
    int rc = 0;
    size_t sz = zmq_msg_size(m);
    const uint8_t *p = zmq_msg_data(m);
    if (sz < RING_HDR || get32(p) != RING_MAGIC) {
        ps_error("ring: rank %d: %zu-byte message from %s is not a ring message", r->rank, sz,
                 r->ep_left);
        rc = PS_EPROTO;
    } else if (get32(p + 8) == r->op + 1) {
        if (r->nstash == r->stash_cap) {
            size_t cap = r->stash_cap ? 2 * r->stash_cap : 16;
            zmq_msg_t *s = realloc(r->stash, cap * sizeof *s);
            if (!s) {
                zmq_msg_close(m);
                return PS_ENOMEM;
            }
            r->stash = s;
            r->stash_cap = cap;
        }
        zmq_msg_init(&r->stash[r->nstash]);
        zmq_msg_move(&r->stash[r->nstash++], m);
    } else if (get32(p + 8) != r->op) {
        ps_error("ring: rank %d is in allreduce #%u but rank %d sent one of #%u: the ranks "
                 "disagree on the sequence of calls",
                 r->rank, r->op, mod(r->rank - 1, r->world), get32(p + 8));
        rc = PS_EPROTO;
    } else {
        rc = take_msg(r, j, m);
    }
    zmq_msg_close(m);
    return rc;
}

static int run(ps_ring_t *r, ring_job_t *j)
{
    int rc = 0, have = 0, W = r->world;
    uint32_t next = 0;
    zmq_msg_t out;
    /* messages of this op that arrived during the previous call */
    size_t ns = r->nstash;
    r->nstash = 0;
    for (size_t s = 0; s < ns; s++)
        if (!rc) rc = on_msg(r, j, &r->stash[s]);
        else zmq_msg_close(&r->stash[s]);
    double last = now_ms();
    while (!rc && (j->nrecv < j->total || next < j->total)) {
        while (next < j->total) {
            if (next >= j->K && !r->done[next - j->K]) break;
            if (!have && (rc = build_msg(r, j, next, &out))) break;
            have = 1;
            size_t sz = zmq_msg_size(&out);
            if (zmq_msg_send(&out, r->push[next % (uint32_t)r->o.nconn], ZMQ_DONTWAIT) < 0) {
                if (zmq_errno() == EAGAIN) break;
                rc = zmq_fail("send to", r->ep_right);
                break;
            }
            have = 0;
            r->bytes_sent += sz;
            next++;
            last = now_ms();
        }
        if (rc || (j->nrecv == j->total && next == j->total)) break;
        zmq_pollitem_t it[2] = {{r->pull, 0, ZMQ_POLLIN, 0}, {NULL, 0, ZMQ_POLLOUT, 0}};
        int nit = 1;
        if (have) it[nit++].socket = r->push[next % (uint32_t)r->o.nconn];
        double left_ms = last + r->o.timeout_ms - now_ms();
        if (left_ms <= 0) {
            int sending = have;
            ps_error("ring: rank %d/%d: no progress for %d ms in allreduce #%u of %zu %s elements "
                     "(received %u/%u segments from left rank %d at %s, sent %u/%u to right rank %d "
                     "at %s): %s",
                     r->rank, W, r->o.timeout_ms, r->op, j->n, ps_dtype_name(j->dt), j->nrecv,
                     j->total, mod(r->rank - 1, W), r->ep_left, next, j->total, (r->rank + 1) % W,
                     r->ep_right,
                     sending ? "right neighbour not connected or not reading (dead or not started?)"
                             : "left neighbour silent (dead, not started, or stuck?)");
            rc = PS_ETIMEOUT;
            break;
        }
        int prc = zmq_poll(it, nit, (long)left_ms + 1);
        if (prc < 0) {
            if (zmq_errno() == EINTR) continue;
            rc = zmq_fail("poll", NULL);
            break;
        }
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        for (;;) { /* drain: POLLIN is level-triggered here, but batching is cheaper */
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, r->pull, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                if (zmq_errno() != EAGAIN) rc = zmq_fail("receive from", r->ep_left);
                break;
            }
            r->bytes_recv += zmq_msg_size(&m);
            last = now_ms();
            if ((rc = on_msg(r, j, &m))) break;
        }
    }
    if (have) zmq_msg_close(&out);
    return rc;
}

int ps_ring_allreduce(ps_ring_t *r, float *data, size_t n, ps_dtype_t dt)
{
    if (!r) return PS_EINVAL;
    size_t es = ps_dtype_size(dt);
    if (!es || (n && !data) || n >= RING_MAX_N) {
        ps_error("ring: invalid allreduce (dtype %d, n %zu, data %p)", (int)dt, n, (void *)data);
        return PS_EINVAL;
    }
    if (r->broken) {
        ps_error("ring: rank %d: an earlier allreduce failed; destroy and rebuild the ring", r->rank);
        return PS_ESTATE;
    }
    if (r->world == 1 || n == 0) return 0;
    ring_job_t j = {.data = data, .n = n, .dt = dt, .es = es};
    j.seg = r->o.segment_bytes / es;
    size_t maxchunk = (n + (size_t)r->world - 1) / (size_t)r->world;
    size_t K = (maxchunk + j.seg - 1) / j.seg;
    size_t total = 2 * (size_t)(r->world - 1) * K;
    if (total > UINT32_MAX) {
        ps_error("ring: %zu elements need %zu messages; raise segment_bytes", n, total);
        return PS_EINVAL;
    }
    j.K = (uint32_t)K;
    j.total = (uint32_t)total;
    if (r->done_cap < total) {
        uint8_t *d = realloc(r->done, total);
        if (!d) return PS_ENOMEM;
        r->done = d;
        r->done_cap = total;
    }
    memset(r->done, 0, total);
    r->op++;
    int rc = run(r, &j);
    if (rc) r->broken = 1;
    return rc;
}

int ps_ring_allreduce_mean(ps_ring_t *r, float *data, size_t n, ps_dtype_t dt)
{
    int rc = ps_ring_allreduce(r, data, n, dt);
    if (rc) return rc;
    float div = (float)r->world;
    for (size_t i = 0; i < n; i++) data[i] /= div;
    return 0;
}
