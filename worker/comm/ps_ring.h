/* Ring allreduce among W workers over TCP (ring mode, docs/operations.md
 * "Ring mode").  No servers: rank r listens on endpoints[r] ("tcp://HOST:PORT";
 * "*" as HOST binds every address) for its left neighbour r-1 and connects
 * nconn sockets to its right neighbour's endpoints[r+1 mod W].  A flat fp32
 * vector is cut into W chunks, each chunk into segments of about
 * segment_bytes on the wire; a chunked, pipelined reduce-scatter (W-1 steps)
 * then all-gather (W-1 steps) leaves the SUM on every rank.  The caller
 * divides by W (ps_ring_allreduce_mean does it the way psd does,
 * g /= (float)W) and applies ps_optim to its own fp32 master copy, so PS
 * mode and ring mode run the same optimizer code.  Plain TCP rather than
 * ZeroMQ for this data path: why, in ps_ring.c.
 *
 * Determinism: chunk c is summed in ring order starting at rank c,
 *   ((x_c + x_{c+1}) + x_{c+2}) + ... + x_{c-1}      (ranks mod W),
 * and the finished chunk is broadcast unchanged, so every rank ends with
 * bit-identical data, and the same inputs give the same bits run after run.
 * psd sums in rank order 0..W-1 instead; that differs from the ring's order
 * by design (each chunk starts at a different rank so that all links work at
 * once), so the two modes agree to fp32 rounding only, not bit for bit.
 *
 * Wire dtypes: fp32, fp16 or bf16 through common/ps_codec.  Received values
 * are decoded and reduced in fp32, but with fp16/bf16 every partial sum is
 * quantised to the wire dtype at each hop, and the finished chunk is rounded
 * once more before the all-gather -- on its owner too, so all ranks stay
 * identical.  Each element thus carries up to W roundings of a value bounded
 * by sum_i |x_i|: |error| <= W * u * sum_i |x_i| (u = 2^-11 fp16, 2^-8 bf16),
 * plus fp16 overflow to Inf above 65504 (scale gradients first).
 * Compressors: dense wire dtypes only.  Top-k, sign and lz4 (ps_codec's
 * TOPK / SIGN / LZ4) are NOT supported in ring mode -- a sparse or 1-bit
 * partial sum is not closed under addition -- so a caller asked for ring
 * mode with one of them must refuse with a clear error.
 *
 * Framing: each connection opens with a 32-byte hello (ps_ring.c) that
 * carries the sender's rank, the world size and the options below; a peer
 * whose options differ is refused by name (PS_EMISMATCH).  Then each message
 * is a 32-byte header (integers little-endian)
 *   u32 magic "PSR1" | u8 dtype | u8 0 | u16 sender rank | u32 op | u32 index
 *   | u64 n | u32 count | u32 0
 * the payload (count elements of the wire dtype, possibly empty) and a
 * u32 trailer, the payload's CRC32C (0 with checksums off).  A trailer and
 * not a header field so that the sender can take the CRC of its own values
 * right after the kernel has copied them, while they are in cache.  Message index i travels on connection i % nconn.  fp32 payloads
 * are sent straight from the caller's data and all-gather payloads received
 * straight into it, so the only copies are the kernel's.
 * op = number of this allreduce on the ring (low 32 bits), index = step * K
 * + segment.  Every field is checked against what this rank expects; a
 * mismatch is PS_EPROTO / PS_EMISMATCH, a bad checksum PS_ECORRUPT.
 *
 * Failures: a neighbour that closes or resets its connection gives PS_EIO
 * at once; no progress (nothing sent or received) for timeout_ms gives
 * PS_ETIMEOUT -- both with a log line naming the neighbour -- so a dead or
 * missing rank never hangs the others.  After any failure the ring is
 * broken (later calls return PS_ESTATE) and its connections are reset, so
 * its neighbours fail promptly too: destroy it and build a new one.
 * Every rank must use the same options (nconn, segment_bytes, checksum).
 * Not thread-safe: one thread drives a ring. */
#ifndef PS_RING_H
#define PS_RING_H
#include <stddef.h>
#include <stdint.h>

#include "ps_codec.h"

typedef struct ps_ring ps_ring_t;

typedef struct ps_ring_opts {
    int timeout_ms;        /* longest time without progress; default 30000 */
    size_t segment_bytes;  /* wire payload bytes per message (pipelining unit);
                              default 512 KiB, at least 64 */
    int nconn;             /* connections to the right neighbour (bandwidth),
                              1..16, default 1; segments go round-robin */
    int window;            /* at most this many segments sent but not yet matched
                              by segments received (flow control: keeps the
                              buffers few and cache-warm); default 8, 0 = no limit */
    int checksum;          /* 1 = CRC32C over every payload (default), 0 = off
                              (the crc field is then 0 and not checked) */
    int listen_fd;         /* >= 0: a socket ps_ring_listen bound, which the ring
                              takes over (closes) instead of binding
                              endpoints[rank] itself; -1 (default): bind */
} ps_ring_opts_t;

/* Defaults as listed above. */
void ps_ring_opts_default(ps_ring_opts_t *o);

/* Create rank `rank` of a ring of `world` ranks.  endpoints[0..world) are the
 * endpoints ("tcp://HOST:PORT") each rank listens on; this rank binds
 * endpoints[rank] and connects to endpoints[(rank+1) % world].  Neighbours
 * may start later (connections retry until the first allreduce times out).
 * opts may be NULL (defaults).  Returns 0 with *r set, PS_EINVAL (bad rank,
 * world outside 1..65535, missing or malformed endpoint, bad options),
 * PS_ENOTFOUND (a host name does not resolve), PS_EIO (bind failed, logged
 * with the reason) or PS_ENOMEM. */
int ps_ring_new(ps_ring_t **r, int rank, int world, const char *const *endpoints,
                const ps_ring_opts_t *opts);

/* Bind a listening socket for a ring whose endpoints are not known yet
 * (cross-worker BN in PS mode: each worker binds first, then tells the
 * others through server 0): bind_ep "tcp://HOST:PORT", PORT 0 = any free
 * port.  *fd (pass it as ps_ring_opts_t.listen_fd, or close it), *port the
 * port bound.  0, PS_EINVAL, PS_ENOTFOUND, PS_EIO (logged). */
int ps_ring_listen(const char *bind_ep, int *fd, int *port);

/* Sum data[0..n) over all ranks in place; every rank must call it with the
 * same n and dt, in the same order of calls.  world == 1 or n == 0 returns
 * at once without communicating (so a missing rank is not noticed then).
 * Returns 0; PS_EINVAL (NULL data with n > 0, unknown dtype, n >= 2^40);
 * PS_ETIMEOUT (a neighbour dead or missing); PS_EPROTO / PS_EMISMATCH (a
 * neighbour disagrees on n, dtype, world or call order); PS_ECORRUPT (bad
 * checksum); PS_EIO (a neighbour closed or reset its connection);
 * PS_EVERSION; PS_ENOMEM; PS_ESTATE (ring broken by an earlier
 * failure).  On failure data holds partial sums. */
int ps_ring_allreduce(ps_ring_t *r, float *data, size_t n, ps_dtype_t dt);

/* ps_ring_allreduce then data[i] /= (float)world, the division psd uses for
 * its mean gradient, so ps_optim sees the same kind of value in both modes. */
int ps_ring_allreduce_mean(ps_ring_t *r, float *data, size_t n, ps_dtype_t dt);

/* The longest time without progress from now on (> 0); 0 or PS_EINVAL. */
int ps_ring_set_timeout(ps_ring_t *r, int timeout_ms);

int ps_ring_rank(const ps_ring_t *r);
int ps_ring_world(const ps_ring_t *r);

/* Wire bytes this rank sent and received so far (headers included). */
void ps_ring_bytes(const ps_ring_t *r, uint64_t *sent, uint64_t *received);

/* Close the sockets and free the ring; NULLs *r.  Everything an allreduce
 * sent was handed to the kernel before it returned, and a graceful close
 * lets the kernel deliver it, so the caller may exit at once. */
void ps_ring_destroy(ps_ring_t **r);
#endif
