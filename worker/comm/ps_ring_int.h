/* Internals of the ring (worker/comm/ps_ring.c: the allreduce; worker/
 * ps_ring_conn.c: sockets, connections, set-up and tear-down).  Not for use
 * outside libps_comm. */
#ifndef PS_RING_INT_H
#define PS_RING_INT_H
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

#include "ps_le.h"
#include "ps_ring.h"

typedef struct ps_ring_addr {
    struct sockaddr_storage sa;
    socklen_t len;
} ps_ring_addr_t;

#define RING_MAGIC 0x31525350u  /* "PSR1" little-endian */
#define HELLO_MAGIC 0x48525350u /* "PSRH" */
#define RING_HDR 32u
#define RING_MAX_CONN 16
#define RING_MAX_N ((size_t)1 << 40)
/* Receive unit: a piece is checked and reduced right after the kernel wrote
 * it, while it is in L2 (with the data it is added to: 2 x 256 KiB of a
 * 1 MiB L2).  256 KiB rather than 64: fewer receive calls, each of which
 * also makes TCP send a window update (n = 2: 1.05 vs 0.95 GB/s at 100 MiB,
 * docs/performance.md). */
#define PIECE (256u << 10)
#define MAX_PENDING 8
/* A wait without progress is logged after this long, then at 2x, 4x ... */
#define RING_WARN_MS 10000.0
#define RETRY_MS 20.0

enum { OUT_IDLE, OUT_CONNECTING, OUT_READY };
enum { PL_DIRECT, PL_ADD, PL_SET, PL_KEEP };

/* A connection to the right neighbour and the one message it is sending. */
typedef struct out_conn {
    int fd, state;
    short rev;            /* poll result of the last wait */
    double retry_at;
    int busy;
    uint8_t hdr[RING_HDR];
    const uint8_t *pl;
    size_t plen, sent;    /* sent: header, payload and trailer bytes written */
    uint8_t trl[4];       /* the payload's CRC32C */
    int crc_live;         /* trl not known yet: taken as the payload goes out */
    uint32_t crc;
    uint8_t *owned;       /* pool buffer to give back once sent */
} out_conn_t;

/* A connection from the left neighbour and the message it is receiving. */
typedef struct in_conn {
    int fd;
    uint32_t nexp;        /* next message index this connection carries */
    uint8_t hdr[RING_HDR];
    size_t hgot;
    uint8_t trl[4];
    size_t tgot;          /* trailer bytes read */
    int in_pl, mode;
    uint32_t idx, crc, ocrc;
    size_t off, plen, pgot, eoff, carry;
    uint8_t *buf;         /* PL_KEEP: the wire payload, passed on next step */
    uint8_t *scratch;     /* PIECE + 8 bytes: PL_ADD / PL_SET */
} in_conn_t;

/* An accepted connection whose hello has not arrived yet. */
typedef struct pending {
    int fd;
    size_t got;
    uint8_t h[RING_HDR];
} pending_t;

struct ps_ring {
    int rank, world;
    ps_ring_opts_t o;
    char *ep_self, *ep_left, *ep_right;
    ps_ring_addr_t right;
    int lfd;
    out_conn_t out[RING_MAX_CONN];
    in_conn_t in[RING_MAX_CONN];
    pending_t pend[MAX_PENDING];
    int npend, nin, nout;        /* pending; connections ready each way */
    uint32_t op;                 /* allreduces started so far */
    int broken;
    uint8_t *done;               /* per message index: received */
    uint32_t *crcs;              /* per received index: the CRC of what message
                                    index + K sends (sums or forwarded payload) */
    uint8_t **fwd;               /* per received index: half payload to pass on */
    size_t done_cap;
    uint8_t **pool;              /* free segment-sized buffers */
    size_t npool, pool_cap;
    uint64_t bytes_sent, bytes_recv;
};


static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline int mod(int a, int w)
{
    return ((a % w) + w) % w;
}

static inline int left_of(const ps_ring_t *r)
{
    return mod(r->rank - 1, r->world);
}

static inline int right_of(const ps_ring_t *r)
{
    return (r->rank + 1) % r->world;
}


/* Segment-sized buffers (half payloads), kept for reuse (ps_ring_conn.c). */
uint8_t *ps_ring_pool_get(ps_ring_t *r);
void ps_ring_pool_put(ps_ring_t *r, uint8_t *b);

/* Connection c to the right neighbour: start, finish or retry it; once up,
 * its hello is queued as the first thing it sends.  1 = it came up. */
int ps_ring_conn_out(ps_ring_t *r, int c, double now);

/* Accept connections from the left neighbour and read their hellos: 1 =
 * progress, 0 = none, < 0 = a peer started with other options. */
int ps_ring_conn_accept(ps_ring_t *r);

/* Close every socket; abort = reset them (after a failure). */
void ps_ring_close_all(ps_ring_t *r, int abort);
#endif
