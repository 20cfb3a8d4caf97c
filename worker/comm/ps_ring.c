/* Ring allreduce over TCP: chunked, pipelined reduce-scatter + all-gather.
 * The contract and the determinism / quantisation notes are in ps_ring.h.
 *
 * Schedule (rank r, W ranks, K segments per chunk, global step s in
 * [0, 2W-2)):
 *   reduce-scatter s <  W-1: send chunk (r - s), receive chunk (r - s - 1)
 *                            and add it to the local values;
 *   all-gather  s >= W-1, t = s-(W-1): send chunk (r + 1 - t), receive chunk
 *                            (r - t) and overwrite.
 * Message index i = s*K + k, sent on connection i % nconn (so each
 * connection carries its indices in increasing order).  Sending i (s > 0)
 * needs received i - K: what is sent at step s is exactly what arrived at
 * step s-1 (plus, during the reduce-scatter, this rank's own values).
 * Nothing else orders the loop, so segment k of step s+1 leaves while
 * segment k+1 of step s is still on the wire -- that is the pipelining.  A
 * chunk region is received at most twice: at reduce-scatter step s1 and at
 * global step W + s1 (all-gather t = s1 + 1).  The second message exists
 * only after the data this rank sent at step s1 + 1 has gone once round the
 * ring, so a message never lands in a region this rank has still to send:
 * the ring's causality orders it, with any number of connections.  That is
 * also why fp32 payloads can be sent straight from the caller's data and
 * all-gather payloads received straight into it.
 *
 * Why plain TCP and not ZeroMQ (which psd and the PS-mode workers use):
 * the ring moves every byte of the gradient 2(W-1)/W times per step, so its
 * CPU cost per byte is what decides its speed on a small host.  ZeroMQ hands
 * each received frame over from an I/O thread in a buffer of its own, so
 * the all-gather paid a copy out of that buffer and every reduction read a
 * buffer another thread had just written (cache misses), with two extra
 * threads per rank to schedule.  Here one thread per rank reads each
 * message in pieces of up to 256 KiB: all-gather pieces land in their final place,
 * reduce-scatter pieces in a small buffer that is still in cache when the
 * checksum and the addition read it (docs/performance.md has the numbers).
 *
 * Connections: every rank listens on its endpoint; the first allreduce
 * connects nconn sockets to the right neighbour (retrying while it is not
 * up yet) and accepts nconn from the left one.  Each connection starts with
 * a 32-byte hello
 *   u32 magic "PSRH" | u16 version 1 | u16 sender rank | u32 world
 *   | u16 connection index | u16 nconn | u64 segment_bytes | u32 checksum | u32 0
 * so that ranks started with other options are refused at once, by name.
 * A connection to the listening port that is not a ring peer (wrong magic)
 * is closed with a warning and does not disturb the ring. */
#include "ps_ring.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_ring_int.h"

/* One allreduce in progress. */
typedef struct ring_job {
    float *data;
    size_t n;
    ps_dtype_t dt;
    size_t es;         /* wire element size */
    size_t seg;        /* elements per segment */
    uint32_t K;        /* segments per chunk */
    uint32_t total;    /* messages each way: 2(W-1)K */
    uint32_t nrecv, next;
} ring_job_t;

void ps_ring_opts_default(ps_ring_opts_t *o)
{
    o->timeout_ms = 30000;
    o->segment_bytes = 512u << 10;
    o->nconn = 1;
    o->checksum = 1;
    o->window = 8;
    o->listen_fd = -1;
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

/* ---- sending ------------------------------------------------------------ */

/* Put message i into its connection's slot.  fp32 payloads point into data
 * (the region is not written again before the right neighbour has all of
 * it, see the top of the file); half payloads are encoded into a pool
 * buffer, or are the buffer received one step earlier, passed on as is. */
static int out_build(ps_ring_t *r, ring_job_t *j, uint32_t i, out_conn_t *oc)
{
    size_t off, len, wlen;
    int chunk, s = (int)(i / j->K), W = r->world;
    uint32_t crc = 0;
    msg_range(r, j, i, 0, &off, &len, &chunk);
    wlen = len * j->es;
    oc->pl = NULL;
    oc->owned = NULL;
    oc->crc_live = 0;
    if (len && j->dt == PS_DT_FP32) {
        oc->pl = (const uint8_t *)(j->data + off);
        /* steps >= 1 send what receiving message i - K produced (sums, or
         * the all-gather payload), whose CRC was taken then, in cache;
         * step 0 sends this rank's own values, whose CRC out_write takes
         * right after the kernel has copied them (in cache again) */
        if (r->o.checksum && s > 0) crc = r->crcs[i - j->K];
        else if (r->o.checksum) oc->crc_live = 1;
    } else if (len && s >= W) {
        oc->pl = oc->owned = r->fwd[i - j->K];
        r->fwd[i - j->K] = NULL;
        crc = r->crcs[i - j->K];
    } else if (len) {
        uint8_t *b = ps_ring_pool_get(r);
        if (!b) return PS_ENOMEM;
        size_t got = 0;
        int rc = ps_codec_encode(b, wlen, &got, j->data + off, len, j->dt, PS_CODEC_RAW, NULL);
        /* the finished chunk: round it here too, so every rank ends equal */
        if (!rc && s == W - 1)
            rc = ps_codec_decode_ex(j->data + off, len, b, wlen, j->dt, PS_CODEC_RAW, PS_DECODE_SET, NULL);
        if (rc) {
            ps_ring_pool_put(r, b);
            return rc;
        }
        if (r->o.checksum) crc = ps_crc32c(0, b, wlen);
        oc->pl = oc->owned = b;
    }
    uint8_t *h = oc->hdr;
    ps_le_put32(h, RING_MAGIC);
    h[4] = (uint8_t)j->dt;
    h[5] = 0;
    ps_le_put16(h + 6, (uint16_t)r->rank);
    ps_le_put32(h + 8, r->op);
    ps_le_put32(h + 12, i);
    ps_le_put64(h + 16, j->n);
    ps_le_put32(h + 24, (uint32_t)len);
    ps_le_put32(h + 28, 0);
    ps_le_put32(oc->trl, crc);
    oc->crc = 0;
    oc->plen = wlen;
    oc->sent = 0;
    oc->busy = 1;
    return 0;
}

/* Write what connection c can take now.  1 = wrote something, 0 = would
 * block, < 0 = failed. */
static int out_write(ps_ring_t *r, int c)
{
    out_conn_t *oc = &r->out[c];
    int prog = 0;
    const size_t tl = oc->crc_live < 0 ? 0 : 4, end = RING_HDR + oc->plen + tl;
    while (oc->busy) {
        struct iovec iov[3];
        int n = 0;
        if (oc->sent < RING_HDR) iov[n++] = (struct iovec){oc->hdr + oc->sent, RING_HDR - oc->sent};
        size_t po = oc->sent > RING_HDR ? oc->sent - RING_HDR : 0;
        if (oc->plen > po) iov[n++] = (struct iovec){(void *)(oc->pl + po), oc->plen - po};
        /* the trailer goes with the payload only once its CRC is known */
        size_t to = oc->sent > RING_HDR + oc->plen ? oc->sent - RING_HDR - oc->plen : 0;
        if (tl && oc->crc_live != 1 && to < tl) iov[n++] = (struct iovec){oc->trl + to, tl - to};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(oc->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return prog;
            ps_error("ring: rank %d: sending to right neighbour rank %d (%s): %s%s", r->rank,
                     right_of(r), r->ep_right, strerror(errno),
                     errno == EPIPE || errno == ECONNRESET ? " (it exited or gave up)" : "");
            return PS_EIO;
        }
        prog = 1;
        if (oc->crc_live == 1) { /* CRC of the payload bytes the kernel just read */
            size_t a = oc->sent > RING_HDR ? oc->sent - RING_HDR : 0;
            size_t b = oc->sent + (size_t)w - RING_HDR;
            if (oc->sent + (size_t)w > RING_HDR && b > a) oc->crc = ps_crc32c(oc->crc, oc->pl + a, b - a);
            if (oc->sent + (size_t)w == RING_HDR + oc->plen) {
                ps_le_put32(oc->trl, oc->crc);
                oc->crc_live = 0;
            }
        }
        oc->sent += (size_t)w;
        r->bytes_sent += (uint64_t)w;
        if (oc->sent == end) {
            oc->busy = 0;
            ps_ring_pool_put(r, oc->owned);
            oc->owned = NULL;
        }
    }
    return prog;
}

/* ---- receiving ---------------------------------------------------------- */

/* A complete header on connection ic: check it against what this rank
 * expects and prepare for the payload. */
static int hdr_take(ps_ring_t *r, ring_job_t *j, in_conn_t *ic)
{
    const uint8_t *p = ic->hdr;
    int left = left_of(r), W = r->world, chunk = 0;
    uint32_t i = ps_le_get32(p + 12);
    size_t off = 0, len = 0;
    if (ps_le_get32(p) != RING_MAGIC) {
        ps_error("ring: rank %d: data from left neighbour rank %d (%s) is not a ring message",
                 r->rank, left, r->ep_left);
        return PS_EPROTO;
    }
    if (ps_le_get32(p + 8) != r->op) {
        ps_error("ring: rank %d is in allreduce #%u but rank %d sent one of #%u: the ranks "
                 "disagree on the sequence of calls", r->rank, r->op, left, ps_le_get32(p + 8));
        return PS_EPROTO;
    }
    if (p[4] != (uint8_t)j->dt) {
        ps_error("ring: rank %d sent dtype %u, this rank %d reduces %s: every rank must use the "
                 "same dtype", left, p[4], r->rank, ps_dtype_name(j->dt));
        return PS_EMISMATCH;
    }
    if (ps_le_get64(p + 16) != j->n) {
        ps_error("ring: rank %d reduces %llu elements, this rank %d %zu: every rank must pass the "
                 "same n", left, (unsigned long long)ps_le_get64(p + 16), r->rank, j->n);
        return PS_EMISMATCH;
    }
    if (ps_le_get16(p + 6) != (unsigned)left || i != ic->nexp) {
        ps_error("ring: rank %d got message %u from rank %u (expected message %u from rank %d)",
                 r->rank, i, ps_le_get16(p + 6), ic->nexp, left);
        return PS_EPROTO;
    }
    msg_range(r, j, i, 1, &off, &len, &chunk);
    if (ps_le_get32(p + 24) != len) {
        ps_error("ring: rank %d: message %u (chunk %d) carries %u elements, expected %zu", r->rank,
                 i, chunk, ps_le_get32(p + 24), len);
        return PS_EMISMATCH;
    }
    int s = (int)(i / j->K);
    ic->idx = i;
    ic->tgot = 0;
    ic->off = off;
    ic->plen = len * j->es;
    ic->pgot = ic->eoff = ic->carry = 0;
    ic->crc = ic->ocrc = 0;
    if (s < W - 1) ic->mode = PL_ADD;
    else if (j->dt == PS_DT_FP32) ic->mode = PL_DIRECT;
    else if (s < 2 * W - 3) ic->mode = PL_KEEP;
    else ic->mode = PL_SET;
    if (ic->mode == PL_KEEP && ic->plen && !(ic->buf = ps_ring_pool_get(r))) return PS_ENOMEM;
    ic->in_pl = 1;
    return 0;
}

/* The whole payload is in: verify and record. */
static int msg_done(ps_ring_t *r, ring_job_t *j, in_conn_t *ic)
{
    uint32_t want = ps_le_get32(ic->trl);
    if (r->o.checksum && ic->crc != want) {
        ps_error("ring: rank %d: checksum mismatch in message %u from rank %d (%s)", r->rank,
                 ic->idx, left_of(r), r->ep_left);
        return PS_ECORRUPT;
    }
    uint32_t i = ic->idx;
    r->done[i] = 1;
    r->crcs[i] = ic->mode == PL_ADD && j->dt == PS_DT_FP32 ? ic->ocrc : want;
    if (ic->mode == PL_KEEP) {
        r->fwd[i] = ic->buf;
        ic->buf = NULL;
    }
    j->nrecv++;
    ic->nexp += (uint32_t)r->o.nconn;
    ic->in_pl = 0;
    ic->hgot = 0;
    return 0;
}

/* Apply payload bytes just received into dst [ic->eoff, ...): the CRC of
 * the wire bytes, the reduction or copy into data, and -- fp32
 * reduce-scatter, whose sums message i + K sends -- the CRC of those sums,
 * all while the piece is in cache.  src holds `avail` wire bytes of which
 * `fresh` (at the end) are new. */
static int piece_apply(ps_ring_t *r, ring_job_t *j, in_conn_t *ic, const uint8_t *src,
                       size_t avail, size_t fresh, ps_decode_mode_t mode)
{
    if (r->o.checksum) ic->crc = ps_crc32c(ic->crc, src + avail - fresh, fresh);
    size_t m = avail / j->es;
    if (!m) return 0;
    float *dst = j->data + ic->off + ic->eoff;
    const int sums = r->o.checksum && mode == PS_DECODE_ADD && j->dt == PS_DT_FP32;
    /* 16 KiB blocks: the sums' CRC reads them while they are in L1, and
     * 16 KiB is the size ps_crc32c's fastest (hybrid) path works in */
    for (size_t b = 0, blk = sums ? 4096 : m; b < m; b += blk) {
        size_t e = m - b < blk ? m - b : blk;
        int rc = ps_codec_decode_ex(dst + b, e, src + b * j->es, e * j->es, j->dt, PS_CODEC_RAW,
                                    mode, NULL);
        if (rc) return rc;
        if (sums) ic->ocrc = ps_crc32c(ic->ocrc, dst + b, e * sizeof(float));
    }
    ic->eoff += m;
    return 0;
}

static int recv_fail(ps_ring_t *r, ssize_t g)
{
    /* the left neighbour giving up may be the echo of this rank's own
     * problem: its connection to the right one never accepted (say so, it
     * is the likelier cause; the two bounds end at about the same time) */
    const int err = errno;
    char why[320] = "";
    if (r->nout < r->o.nconn)
        snprintf(why, sizeof why, "; meanwhile right neighbour rank %d (%s) was still not "
                 "accepting connections (not started, dead or unreachable?)", right_of(r),
                 r->ep_right);
    if (g == 0) {
        ps_error("ring: rank %d: left neighbour rank %d (%s) closed the connection (it exited or "
                 "gave up)%s", r->rank, left_of(r), r->ep_left, why);
    } else {
        ps_error("ring: rank %d: receiving from left neighbour rank %d (%s): %s%s", r->rank,
                 left_of(r), r->ep_left, strerror(err), why);
    }
    return PS_EIO;
}

/* One non-blocking receive into buf: the byte count (> 0), 0 when nothing
 * is waiting, or a PS_E* failure (logged). */
static ssize_t recv_now(ps_ring_t *r, int fd, void *buf, size_t len)
{
    for (;;) {
        ssize_t g = recv(fd, buf, len, MSG_DONTWAIT);
        if (g > 0) {
            r->bytes_recv += (uint64_t)g;
            return g;
        }
        if (g < 0 && errno == EINTR) continue;
        if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return recv_fail(r, g);
    }
}

/* Read what connection c has for this allreduce, up to the end of one
 * message.  1 = progress, 0 = would block, < 0 = failed. */
static int in_read(ps_ring_t *r, ring_job_t *j, int c)
{
    in_conn_t *ic = &r->in[c];
    int prog = 0, rc;
    for (;;) {
        if (!ic->in_pl) {
            if (ic->nexp >= j->total) return prog; /* the rest is the next call's */
            ssize_t g = recv_now(r, ic->fd, ic->hdr + ic->hgot, RING_HDR - ic->hgot);
            if (g <= 0) return g < 0 ? (int)g : prog;
            prog = 1;
            ic->hgot += (size_t)g;
            if (ic->hgot < RING_HDR) continue;
            if ((rc = hdr_take(r, j, ic))) return rc;
            continue;
        }
        if (ic->pgot == ic->plen) { /* the trailer: the payload's CRC32C */
            ssize_t g = recv_now(r, ic->fd, ic->trl + ic->tgot, 4 - ic->tgot);
            if (g <= 0) return g < 0 ? (int)g : prog;
            prog = 1;
            ic->tgot += (size_t)g;
            if (ic->tgot == 4) return (rc = msg_done(r, j, ic)) ? rc : 1;
            continue;
        }
        size_t want = ic->plen - ic->pgot;
        uint8_t *dst;
        if (ic->mode == PL_DIRECT) dst = (uint8_t *)(j->data + ic->off) + ic->pgot;
        else if (ic->mode == PL_KEEP) dst = ic->buf + ic->pgot;
        else {
            dst = ic->scratch + ic->carry;
            if (want > PIECE - ic->carry) want = PIECE - ic->carry;
        }
        if (want > PIECE) want = PIECE;
        ssize_t g = recv_now(r, ic->fd, dst, want);
        if (g <= 0) return g < 0 ? (int)g : prog;
        prog = 1;
        size_t gs = (size_t)g;
        ic->pgot += gs;
        if (ic->mode == PL_DIRECT) {
            /* already in place: only the checksum */
            if (r->o.checksum) ic->crc = ps_crc32c(ic->crc, dst, gs);
        } else if (ic->mode == PL_KEEP) {
            size_t done_b = ic->eoff * j->es;
            rc = piece_apply(r, j, ic, ic->buf + done_b, ic->pgot - done_b, gs, PS_DECODE_SET);
            if (rc) return rc;
        } else {
            size_t avail = ic->carry + gs;
            rc = piece_apply(r, j, ic, ic->scratch, avail, gs,
                             ic->mode == PL_ADD ? PS_DECODE_ADD : PS_DECODE_SET);
            if (rc) return rc;
            size_t used = (avail / j->es) * j->es;
            ic->carry = avail - used; /* part of an element: keep it in front */
            if (ic->carry) memmove(ic->scratch, ic->scratch + used, ic->carry);
        }
    }
}

/* ---- the loop ----------------------------------------------------------- */

static int timeout_error(ps_ring_t *r, ring_job_t *j)
{
    int W = r->world, nbusy = 0;
    for (int c = 0; c < r->o.nconn; c++) nbusy += r->out[c].busy;
    const char *why =
        r->nout < r->o.nconn ? "right neighbour not accepting connections (not started, or dead?)"
        : r->nin < r->o.nconn ? "left neighbour never connected (not started, or dead?)"
        : nbusy               ? "right neighbour not reading (stuck?)"
                              : "left neighbour silent (dead or stuck?)";
    ps_error("ring: rank %d/%d: no progress for %d ms in allreduce #%u of %zu %s elements "
             "(received %u/%u segments from left rank %d at %s, sent %u/%u to right rank %d at "
             "%s): %s",
             r->rank, W, r->o.timeout_ms, r->op, j->n, ps_dtype_name(j->dt), j->nrecv, j->total,
             left_of(r), r->ep_left, j->next, j->total, right_of(r), r->ep_right, why);
    return PS_ETIMEOUT;
}

static int run(ps_ring_t *r, ring_job_t *j)
{
    const int nc = r->o.nconn;
    for (int c = 0; c < nc; c++) r->in[c].nexp = (uint32_t)c;
    double last = now_ms(), warn_after = RING_WARN_MS;
    for (;;) {
        int prog = 0, rc = 0;
        double now = now_ms();
        for (int c = 0; c < nc && r->nout < nc; c++) prog |= ps_ring_conn_out(r, c, now);
        if (r->nin < nc) {
            if ((rc = ps_ring_conn_accept(r)) < 0) return rc;
            prog |= rc;
        }
        /* send: fill the free slots, write, repeat while writes go through */
        for (;;) {
            while (j->next < j->total) {
                uint32_t i = j->next;
                out_conn_t *oc = &r->out[i % (uint32_t)nc];
                if (oc->state != OUT_READY || oc->busy) break;
                if (i >= j->K && !r->done[i - j->K]) break;
                /* window: no deadlock, the lowest message not yet received
                 * anywhere can always be sent (its sender has received
                 * every lower index, so it is not ahead of its receives) */
                if (r->o.window && i >= j->nrecv + (uint32_t)r->o.window) break;
                if ((rc = out_build(r, j, i, oc))) return rc;
                j->next++;
            }
            int wp = 0;
            for (int c = 0; c < nc; c++)
                if (r->out[c].state == OUT_READY && r->out[c].busy) {
                    if ((rc = out_write(r, c)) < 0) return rc;
                    wp |= rc;
                }
            if (!wp) break;
            prog = 1;
        }
        for (int c = 0; c < nc; c++)
            if (r->in[c].fd >= 0) {
                if ((rc = in_read(r, j, c)) < 0) return rc;
                prog |= rc;
            }
        int nbusy = 0;
        for (int c = 0; c < nc; c++) nbusy += r->out[c].busy;
        if (j->nrecv == j->total && j->next == j->total && !nbusy) return 0;
        if (prog) {
            last = now_ms();
            warn_after = RING_WARN_MS;
            continue;
        }
        /* nothing moved: wait for a socket, a connect retry or the timeout */
        struct pollfd pf[2 * RING_MAX_CONN + MAX_PENDING + 1];
        int who[2 * RING_MAX_CONN + MAX_PENDING + 1], np = 0;
        double t = now_ms(), wait = last + r->o.timeout_ms - t;
        if (wait <= 0) return timeout_error(r, j);
        if (t - last >= warn_after) { /* a long wait says what it waits for */
            ps_warn("ring: rank %d/%d: nothing from the neighbours for %.0f s in allreduce #%u of "
                    "%zu elements (received %u/%u from left rank %d at %s, sent %u/%u to right "
                    "rank %d at %s); giving up after %d s", r->rank, r->world, (t - last) / 1e3,
                    r->op, j->n, j->nrecv, j->total, left_of(r), r->ep_left, j->next, j->total,
                    right_of(r), r->ep_right, r->o.timeout_ms / 1000);
            warn_after *= 2;
        }
        if (wait > last + warn_after - t) wait = last + warn_after - t;
        for (int c = 0; c < nc; c++) {
            out_conn_t *oc = &r->out[c];
            oc->rev = 0;
            if (oc->state == OUT_IDLE && oc->retry_at - t < wait)
                wait = oc->retry_at > t ? oc->retry_at - t : 0;
            if (oc->state == OUT_CONNECTING || (oc->state == OUT_READY && oc->busy)) {
                pf[np] = (struct pollfd){oc->fd, POLLOUT, 0};
                who[np++] = c;
            }
            in_conn_t *ic = &r->in[c];
            if (ic->fd >= 0 && (ic->in_pl || ic->nexp < j->total)) {
                pf[np] = (struct pollfd){ic->fd, POLLIN, 0};
                who[np++] = -1;
            }
        }
        if (r->nin < nc) {
            pf[np] = (struct pollfd){r->lfd, POLLIN, 0};
            who[np++] = -1;
            for (int p = 0; p < r->npend; p++) {
                pf[np] = (struct pollfd){r->pend[p].fd, POLLIN, 0};
                who[np++] = -1;
            }
        }
        int pr = poll(pf, (nfds_t)np, (int)wait + 1);
        if (pr < 0 && errno != EINTR) {
            ps_error("ring: rank %d: poll: %s", r->rank, strerror(errno));
            return PS_EIO;
        }
        for (int k = 0; pr > 0 && k < np; k++)
            if (who[k] >= 0) r->out[who[k]].rev = pf[k].revents;
    }
}

static void ring_break(ps_ring_t *r)
{
    r->broken = 1;
    ps_ring_close_all(r, 1); /* reset: the neighbours fail at once instead of timing out */
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
        uint32_t *cr = realloc(r->crcs, total * sizeof *cr);
        if (cr) r->crcs = cr;
        uint8_t **f = realloc(r->fwd, total * sizeof *f);
        if (f) {
            r->fwd = f;
            memset(f + r->done_cap, 0, (total - r->done_cap) * sizeof *f);
        }
        if (!d || !cr || !f) return PS_ENOMEM;
        r->done_cap = total;
    }
    memset(r->done, 0, total);
    r->op++;
    int rc = run(r, &j);
    for (uint32_t i = 0; i < j.total; i++) { /* left over only after a failure */
        ps_ring_pool_put(r, r->fwd[i]);
        r->fwd[i] = NULL;
    }
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
