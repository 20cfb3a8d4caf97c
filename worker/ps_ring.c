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
 * wire -- that is the pipelining.  A chunk region is received at most
 * twice: at reduce-scatter step s1 and at global step W + s1 (all-gather
 * t = s1 + 1).  The second message exists only after the data this rank sent
 * at step s1 + 1 has gone once round the ring, so a message never lands in a
 * region this rank has still to send: the ring's causality orders it, with
 * any number of connections.
 *
 * With several connections per neighbour messages may arrive out of order,
 * which the index handles; the left neighbour may even start the next
 * allreduce (op + 1) before this rank has received its last segments of op,
 * so such messages are kept (stash) for the next call.
 *
 * Passes over memory per byte: the kernel's two copies (send, receive) and
 * the reduction or (all-gather) the copy into data; the checksums ride on
 * the latter while the bytes are in cache (check_decode), except for the
 * first reduce-scatter step's own values.  fp32 payloads are sent without a
 * user-space copy (see build_msg). */
#include "ps_ring.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdatomic.h>
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
    uint8_t *done;               /* per message index: 0 not yet received, 1 received,
                                    2 received and its payload held in fwd */
    ring_msg_t *fwd;             /* per message index: all-gather payload to pass on */
    uint32_t *ocrc;              /* per message index i (fp32, reduce-scatter): CRC32C
                                    of the sums it produced, which message i + K sends */
    size_t done_cap;
    uint64_t bytes_sent, bytes_recv;
    atomic_int zc_out;           /* zero-copy payloads ZeroMQ still holds */
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
    o->segment_bytes = 256u << 10;
    o->nconn = 1;
    o->io_threads = 0;
    o->checksum = 1;
    o->window = 8;
}

static void msg_close(ring_msg_t *m);

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

/* ZeroMQ is done with a zero-copy payload (called from its I/O thread). */
static void zc_release(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub(&((ps_ring_t *)hint)->zc_out, 1);
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
        o.nconn < 1 || o.nconn > RING_MAX_CONN || o.io_threads < 0 || o.io_threads > 64 ||
        o.window < 0) {
        ps_error("ring: invalid options (timeout_ms %d, segment_bytes %zu, nconn %d, io_threads %d, "
                 "window %d)", o.timeout_ms, o.segment_bytes, o.nconn, o.io_threads, o.window);
        return PS_EINVAL;
    }
    if (!o.io_threads) o.io_threads = o.nconn + 1;
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

int ps_ring_tune_malloc(void)
{
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
    /* 32 MiB is glibc's largest mmap threshold on 64-bit hosts */
    if (mallopt(M_MMAP_THRESHOLD, 32 << 20) != 1 || mallopt(M_TRIM_THRESHOLD, 512 << 20) != 1) {
        ps_warn("ring: mallopt refused the buffer settings");
        return PS_EUNSUPPORTED;
    }
    return 0;
#else
    return PS_EUNSUPPORTED;
#endif
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
    for (size_t i = 0; i < r->nstash; i++) msg_close(&r->stash[i]);
    free(r->stash);
    if (r->pull) zmq_close(r->pull);
    for (int c = 0; c < RING_MAX_CONN; c++)
        if (r->push[c]) zmq_close(r->push[c]);
    if (r->ctx) zmq_ctx_term(r->ctx);
    free(r->done);
    free(r->fwd);
    free(r->ocrc);
    free(r->ep_self);
    free(r->ep_left);
    free(r->ep_right);
    free(r);
    *rp = NULL;
}

static void msg_close(ring_msg_t *m)
{
    zmq_msg_close(&m->hdr);
    zmq_msg_close(&m->pl);
}

/* After a failure: drop the sockets at once (linger 0).  Unsent zero-copy
 * payloads still point into the caller's data; once zmq_ctx_term returns no
 * I/O thread reads them any more, so the caller may free its buffer as soon
 * as ps_ring_allreduce returns, failed or not. */
static void ring_break(ps_ring_t *r)
{
    int zero = 0;
    r->broken = 1;
    for (int c = 0; c < RING_MAX_CONN; c++)
        if (r->push[c]) {
            zmq_setsockopt(r->push[c], ZMQ_LINGER, &zero, sizeof zero);
            zmq_close(r->push[c]);
            r->push[c] = NULL;
        }
    if (r->pull) zmq_close(r->pull);
    r->pull = NULL;
    if (r->ctx) zmq_ctx_term(r->ctx);
    r->ctx = NULL;
}

/* Payload of message i:
 *  - fp32, not forwarded: zero-copy from data.  The region is not written
 *    again before ZeroMQ has sent it: a reduce-scatter chunk is next written
 *    when it comes back in the all-gather, which needs the right neighbour
 *    to have received this message first, and the first all-gather chunk is
 *    never written again in this call.  Before returning, run() waits until
 *    ZeroMQ has released every such payload (zc_release), so the caller may
 *    change or free data afterwards;
 *  - later all-gather steps: the payload frame received one step earlier,
 *    forwarded as is (no copy, no re-encode, checksum reused);
 *  - fp16 / bf16: an encoded copy; at the first all-gather step the finished
 *    chunk is also rounded in place to what the other ranks will decode, so
 *    that every rank ends with the same bits.
 * The header frame is filled here too. */
static int build_msg(ps_ring_t *r, ring_job_t *j, uint32_t i, zmq_msg_t *hdr, zmq_msg_t *pl)
{
    size_t off, len, wlen;
    int chunk, s = (int)(i / j->K), W = r->world, rc = 0;
    uint32_t crc = 0;
    msg_range(r, j, i, 0, &off, &len, &chunk);
    wlen = len * j->es;
    if (s >= W && len) {
        ring_msg_t *f = &r->fwd[i - j->K];
        crc = get32((const uint8_t *)zmq_msg_data(&f->hdr) + 28);
        zmq_msg_init(pl);
        zmq_msg_move(pl, &f->pl);
        msg_close(f);
        r->done[i - j->K] = 1; /* no longer holding a payload to pass on */
    } else if (j->dt == PS_DT_FP32 && len) {
        atomic_fetch_add(&r->zc_out, 1);
        if (zmq_msg_init_data(pl, j->data + off, wlen, zc_release, r)) {
            atomic_fetch_sub(&r->zc_out, 1);
            return zmq_fail("zmq_msg_init_data", NULL);
        }
        /* Steps 1 .. W-1 send exactly the sums that reducing message i - K
         * wrote (same chunk, same segment; nothing writes them in between,
         * see above), and check_decode took their CRC while they were in
         * cache.  Step 0 sends this rank's own values: one pass here. */
        if (r->o.checksum) crc = s > 0 ? r->ocrc[i - j->K] : ps_crc32c(0, j->data + off, wlen);
    } else {
        if (zmq_msg_init_size(pl, wlen)) {
            ps_error("ring: cannot allocate a %zu-byte message", wlen);
            return PS_ENOMEM;
        }
        void *p = zmq_msg_data(pl);
        size_t got = 0;
        if (len) rc = ps_codec_encode(p, wlen, &got, j->data + off, len, j->dt, PS_CODEC_RAW, NULL);
        if (!rc && len && j->dt != PS_DT_FP32 && s == W - 1)
            rc = ps_codec_decode_ex(j->data + off, len, p, wlen, j->dt, PS_CODEC_RAW, PS_DECODE_SET, NULL);
        if (rc) {
            zmq_msg_close(pl);
            return rc;
        }
        if (r->o.checksum) crc = ps_crc32c(0, p, wlen);
    }
    if (zmq_msg_init_size(hdr, RING_HDR)) {
        zmq_msg_close(pl);
        return PS_ENOMEM;
    }
    uint8_t *h = zmq_msg_data(hdr);
    put32(h, RING_MAGIC);
    h[4] = (uint8_t)j->dt;
    h[5] = 0;
    h[6] = (uint8_t)(r->rank & 0xff);
    h[7] = (uint8_t)(r->rank >> 8);
    put32(h + 8, r->op);
    put32(h + 12, i);
    put64(h + 16, j->n);
    put32(h + 24, (uint32_t)len);
    put32(h + 28, crc);
    return 0;
}

/* Checksum and decode a payload in blocks that stay in cache (L1 / L2)
 * between the passes (one pass over memory instead of two or three): the
 * payload's CRC, the reduction into data, and -- fp32 reduce-scatter, whose
 * sums this rank sends next, zero-copy, as message i + K -- the CRC of those
 * sums, kept in r->ocrc[i] so build_msg does not read them from memory
 * again (and a sum changed in memory before it is sent is then caught by
 * the receiver too).  32 KiB: two of ps_crc32c's 16 KiB blocks (its fastest
 * path), and payload + sums stay in L2.  A bad checksum is found only after
 * the blocks were applied; the allreduce then fails and the data holds
 * partial sums, as ps_ring.h says for every failure. */
static int check_decode(ps_ring_t *r, ring_job_t *j, uint32_t i, size_t off, size_t len,
                        const uint8_t *pl, uint32_t want, int add)
{
    const size_t blk = (32u << 10) / j->es;
    const int out = r->o.checksum && add && j->dt == PS_DT_FP32;
    uint32_t crc = 0, ocrc = 0;
    for (size_t b = 0; b < len; b += blk) {
        size_t m = len - b < blk ? len - b : blk;
        if (r->o.checksum) crc = ps_crc32c(crc, pl + b * j->es, m * j->es);
        int rc = ps_codec_decode_ex(j->data + off + b, m, pl + b * j->es, m * j->es, j->dt,
                                    PS_CODEC_RAW, add ? PS_DECODE_ADD : PS_DECODE_SET, NULL);
        if (rc) return rc;
        if (out) ocrc = ps_crc32c(ocrc, j->data + off + b, m * sizeof(float));
    }
    if (out) r->ocrc[i] = ocrc;
    if (r->o.checksum && crc != want) {
        ps_error("ring: rank %d: checksum mismatch in message %u from rank %d (%s)", r->rank, i,
                 mod(r->rank - 1, r->world), r->ep_left);
        return PS_ECORRUPT;
    }
    return 0;
}

/* Check and apply one received message of the current op.  Takes *m: an
 * all-gather message that will be passed on is kept in r->fwd. */
static int take_msg(ps_ring_t *r, ring_job_t *j, ring_msg_t *m)
{
    const uint8_t *p = zmq_msg_data(&m->hdr);
    size_t sz = zmq_msg_size(&m->pl);
    int left = mod(r->rank - 1, r->world), W = r->world, rc = 0;
    uint32_t i = get32(p + 12), count = get32(p + 24);
    int sender = p[6] | p[7] << 8;
    size_t off = 0, len = 0;
    int chunk = 0;
    if (p[4] != (uint8_t)j->dt) {
        ps_error("ring: rank %d sent dtype %u, this rank %d reduces %s: every rank must use the same dtype",
                 left, p[4], r->rank, ps_dtype_name(j->dt));
        rc = PS_EMISMATCH;
    } else if (get64(p + 16) != j->n) {
        ps_error("ring: rank %d reduces %llu elements, this rank %d %zu: every rank must pass the same n",
                 left, (unsigned long long)get64(p + 16), r->rank, j->n);
        rc = PS_EMISMATCH;
    } else if (sender != left || i >= j->total || r->done[i]) {
        ps_error("ring: rank %d got message %u from rank %d (expected rank %d, index < %u, once)",
                 r->rank, i, sender, left, j->total);
        rc = PS_EPROTO;
    }
    if (!rc) {
        msg_range(r, j, i, 1, &off, &len, &chunk);
        if (count != len || sz != len * j->es) {
            ps_error("ring: rank %d: message %u (chunk %d) carries %u elements in %zu bytes, expected %zu",
                     r->rank, i, chunk, count, sz, len);
            rc = PS_EMISMATCH;
        }
    }
    const void *pl = zmq_msg_data(&m->pl);
    int s = (int)(i / j->K);
    if (!rc && len) rc = check_decode(r, j, i, off, len, pl, get32(p + 28), s < W - 1);
    if (rc) {
        msg_close(m);
        return rc;
    }
    r->done[i] = 1;
    j->nrecv++;
    if (s >= W - 1 && s < 2 * W - 3 && len) { /* pass it on at the next step */
        r->done[i] = 2;
        zmq_msg_init(&r->fwd[i].hdr);
        zmq_msg_init(&r->fwd[i].pl);
        zmq_msg_move(&r->fwd[i].hdr, &m->hdr);
        zmq_msg_move(&r->fwd[i].pl, &m->pl);
    }
    msg_close(m);
    return 0;
}

/* A message just received: apply it, keep it for the next op, or fail.
 * Takes *m. */
static int on_msg(ps_ring_t *r, ring_job_t *j, ring_msg_t *m)
{
    size_t sz = zmq_msg_size(&m->hdr);
    const uint8_t *p = zmq_msg_data(&m->hdr);
    if (sz != RING_HDR || get32(p) != RING_MAGIC) {
        ps_error("ring: rank %d: a %zu-byte header from %s is not a ring message", r->rank, sz,
                 r->ep_left);
        msg_close(m);
        return PS_EPROTO;
    }
    if (get32(p + 8) == r->op + 1) {
        if (r->nstash == r->stash_cap) {
            size_t cap = r->stash_cap ? 2 * r->stash_cap : 16;
            ring_msg_t *st = realloc(r->stash, cap * sizeof *st);
            if (!st) {
                msg_close(m);
                return PS_ENOMEM;
            }
            r->stash = st;
            r->stash_cap = cap;
        }
        ring_msg_t *d = &r->stash[r->nstash++];
        zmq_msg_init(&d->hdr);
        zmq_msg_init(&d->pl);
        zmq_msg_move(&d->hdr, &m->hdr);
        zmq_msg_move(&d->pl, &m->pl);
        msg_close(m);
        return 0;
    }
    if (get32(p + 8) != r->op) {
        ps_error("ring: rank %d is in allreduce #%u but rank %d sent one of #%u: the ranks "
                 "disagree on the sequence of calls",
                 r->rank, r->op, mod(r->rank - 1, r->world), get32(p + 8));
        msg_close(m);
        return PS_EPROTO;
    }
    return take_msg(r, j, m);
}

/* Receive one two-frame message (DONTWAIT).  1 = got one, 0 = none waiting,
 * < 0 = error. */
static int recv_msg(ps_ring_t *r, ring_msg_t *m)
{
    zmq_msg_init(&m->hdr);
    zmq_msg_init(&m->pl);
    if (zmq_msg_recv(&m->hdr, r->pull, ZMQ_DONTWAIT) < 0) {
        msg_close(m);
        return zmq_errno() == EAGAIN ? 0 : zmq_fail("receive from", r->ep_left);
    }
    int bad = !zmq_msg_more(&m->hdr);
    if (!bad) bad = zmq_msg_recv(&m->pl, r->pull, 0) < 0 || zmq_msg_more(&m->pl);
    if (bad) {
        ps_error("ring: rank %d: message from %s is not [header][payload]", r->rank, r->ep_left);
        while (zmq_msg_more(&m->pl)) { /* the rest of an over-long message */
            zmq_msg_close(&m->pl);
            zmq_msg_init(&m->pl);
            if (zmq_msg_recv(&m->pl, r->pull, 0) < 0) break;
        }
        msg_close(m);
        return PS_EPROTO;
    }
    r->bytes_recv += zmq_msg_size(&m->hdr) + zmq_msg_size(&m->pl);
    return 1;
}

static int run(ps_ring_t *r, ring_job_t *j)
{
    int rc = 0, have = 0, W = r->world;
    uint32_t next = 0;
    zmq_msg_t oh, op;
    /* messages of this op that arrived during the previous call */
    size_t ns = r->nstash;
    r->nstash = 0;
    for (size_t s = 0; s < ns; s++)
        if (!rc) rc = on_msg(r, j, &r->stash[s]);
        else msg_close(&r->stash[s]);
    double last = now_ms();
    while (!rc && (j->nrecv < j->total || next < j->total)) {
        while (next < j->total) {
            if (next >= j->K && !r->done[next - j->K]) break;
            /* window: no deadlock, the lowest message not yet received
             * anywhere can always be sent (its sender has received every
             * lower index, so it is not ahead of its receives) */
            if (r->o.window && !have && next >= j->nrecv + (uint32_t)r->o.window) break;
            if (!have && (rc = build_msg(r, j, next, &oh, &op))) break;
            have = 1;
            void *sock = r->push[next % (uint32_t)r->o.nconn];
            size_t sz = RING_HDR + zmq_msg_size(&op);
            /* ZeroMQ queues a multipart message atomically: once the first
             * frame is accepted, the second is too (no HWM is set) */
            if (zmq_msg_send(&oh, sock, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) {
                if (zmq_errno() == EAGAIN) break;
                rc = zmq_fail("send to", r->ep_right);
                break;
            }
            if (zmq_msg_send(&op, sock, 0) < 0) {
                zmq_msg_close(&op);
                have = 0;
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
            ps_error("ring: rank %d/%d: no progress for %d ms in allreduce #%u of %zu %s elements "
                     "(received %u/%u segments from left rank %d at %s, sent %u/%u to right rank %d "
                     "at %s): %s",
                     r->rank, W, r->o.timeout_ms, r->op, j->n, ps_dtype_name(j->dt), j->nrecv,
                     j->total, mod(r->rank - 1, W), r->ep_left, next, j->total, (r->rank + 1) % W,
                     r->ep_right,
                     have ? "right neighbour not connected or not reading (dead or not started?)"
                          : "left neighbour silent (dead, not started, or stuck?)");
            rc = PS_ETIMEOUT;
            break;
        }
        if (zmq_poll(it, nit, (long)left_ms + 1) < 0) {
            if (zmq_errno() == EINTR) continue;
            rc = zmq_fail("poll", NULL);
            break;
        }
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        for (;;) { /* drain what is waiting before sending again */
            ring_msg_t m;
            int got = recv_msg(r, &m);
            if (got <= 0) {
                rc = got;
                break;
            }
            last = now_ms();
            if ((rc = on_msg(r, j, &m))) break;
        }
    }
    if (have) {
        zmq_msg_close(&oh);
        zmq_msg_close(&op);
    }
    for (uint32_t i = 0; i < j->total; i++) /* left over only after a failure */
        if (r->done[i] == 2) msg_close(&r->fwd[i]);
    /* The caller may change or free data once this returns: wait until
     * ZeroMQ has handed every zero-copy payload to the kernel (quick: the
     * right neighbour needs them all to finish, so it keeps reading). */
    while (!rc && atomic_load(&r->zc_out) > 0) {
        if (now_ms() - last > r->o.timeout_ms) {
            ps_error("ring: rank %d: %d segments still unsent to rank %d (%s) after %d ms",
                     r->rank, atomic_load(&r->zc_out), (r->rank + 1) % W, r->ep_right,
                     r->o.timeout_ms);
            rc = PS_ETIMEOUT;
            break;
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
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
        if (d) r->done = d;
        ring_msg_t *f = realloc(r->fwd, total * sizeof *f);
        if (f) r->fwd = f;
        uint32_t *oc = realloc(r->ocrc, total * sizeof *oc);
        if (oc) r->ocrc = oc;
        if (!d || !f || !oc) return PS_ENOMEM;
        r->done_cap = total;
    }
    memset(r->done, 0, total);
    r->op++;
    int rc = run(r, &j);
    if (rc) ring_break(r);
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
