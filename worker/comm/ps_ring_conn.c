/* The ring's sockets and connections: endpoint parsing, listening,
 * connecting to the right neighbour (with retries while it is not up yet),
 * accepting the left one and checking its hello (ps_ring.c has the format),
 * set-up and tear-down.  The allreduce itself is in ps_ring.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4 */
#endif
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_ring_int.h"

/* ---- TCP plumbing -------------------------------------------------------- */

/* Resolve "tcp://HOST:PORT" (HOST: a name, an IPv4 literal or [IPv6];
 * passive != 0 also accepts "*", any address, for binding; passive 2 also
 * port 0, any free port).  Returns 0, PS_EINVAL (bad form, logged) or
 * PS_ENOTFOUND (name does not resolve). */
static int net_resolve(const char *ep, int passive, ps_ring_addr_t *a)
{
    char host[256], port[16];
    const char *p = ep && !strncmp(ep, "tcp://", 6) ? ep + 6 : NULL, *colon;
    size_t hl;
    if (!p) goto bad;
    if (*p == '[') { /* [IPv6]:port */
        const char *e = strchr(p, ']');
        if (!e || e[1] != ':') goto bad;
        hl = (size_t)(e - p - 1);
        p++;
        colon = e + 1;
    } else {
        colon = strrchr(p, ':');
        if (!colon) goto bad;
        hl = (size_t)(colon - p);
    }
    if (!hl || hl >= sizeof host) goto bad;
    memcpy(host, p, hl);
    host[hl] = 0;
    char *end;
    long pn = strtol(colon + 1, &end, 10);
    if (colon[1] == 0 || *end || pn < (passive == 2 ? 0 : 1) || pn > 65535) goto bad;
    snprintf(port, sizeof port, "%ld", pn);
    int any = !strcmp(host, "*");
    if (any && !passive) {
        ps_error("ring: endpoint %s: '*' can be bound but not connected to; list each rank's "
                 "address", ep);
        return PS_EINVAL;
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    int g = getaddrinfo(any ? NULL : host, port, &hints, &res);
    if (g || !res) {
        ps_error("ring: endpoint %s: cannot resolve '%s': %s", ep, host, gai_strerror(g));
        if (res) freeaddrinfo(res);
        return PS_ENOTFOUND;
    }
    /* The same name must give the same address to the rank that binds it
     * and to the one that connects ("localhost" lists ::1 and 127.0.0.1 in
     * an order that depends on the host's configuration): take IPv4 when
     * the name has it, else the first address. */
    const struct addrinfo *pick = res;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next)
        if (ai->ai_family == AF_INET) {
            pick = ai;
            break;
        }
    memcpy(&a->sa, pick->ai_addr, pick->ai_addrlen);
    a->len = (socklen_t)pick->ai_addrlen;
    freeaddrinfo(res);
    return 0;
bad:
    ps_error("ring: endpoint '%s' is not tcp://HOST:PORT (port 1-65535)", ep ? ep : "(null)");
    return PS_EINVAL;
}

static void set_nodelay(int fd)
{
    int one = 1; /* segments are large; the header must not wait for Nagle */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Receive buffer for the ring's connections.  A fixed large buffer lets the
 * left neighbour write whole segments while this rank is busy adding: on
 * loopback it gave 1.2-1.4x the bus bandwidth of the kernel's autotuning,
 * which starts at tcp_rmem[1] and grows only as the reader keeps up
 * (docs/performance.md).  A fixed size also switches autotuning off, so it
 * is set only where net.core.rmem_max allows at least 1 MiB; with the
 * stock 208 KiB limit the kernel's autotuning is the better choice. */
#define RING_RCVBUF (4 << 20)
static int rcvbuf_size(void)
{
    FILE *f = fopen("/proc/sys/net/core/rmem_max", "r");
    long max = 0;
    if (f) {
        if (fscanf(f, "%ld", &max) != 1) max = 0;
        fclose(f);
    }
    if (max < (1 << 20)) return 0;
    return max < RING_RCVBUF ? (int)max : RING_RCVBUF;
}

/* A non-blocking, close-on-exec listening socket bound to a (SO_REUSEADDR,
 * so a ring rebuilt at once after a failure can bind its port again).
 * Returns the fd or PS_EIO (logged with what = the endpoint text). */
static int net_listen(const ps_ring_addr_t *a, const char *what)
{
    int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        ps_error("ring: socket for %s: %s", what, strerror(errno));
        return PS_EIO;
    }
    int one = 1, rb = rcvbuf_size();
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* before listen(): accepted sockets inherit it, and the window scale
     * is agreed in the handshake */
    if (rb) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rb, sizeof rb);
    if (bind(fd, (const struct sockaddr *)&a->sa, a->len) || listen(fd, 64)) {
        ps_error("ring: cannot bind %s: %s", what, strerror(errno));
        close(fd);
        return PS_EIO;
    }
    return fd;
}

/* Start a non-blocking connect to a.  Returns the fd (*in_progress = 1 while
 * the handshake runs: wait for POLLOUT, then net_connected) or a negative
 * errno (-ECONNREFUSED ...: retry later). */
static int net_connect(const ps_ring_addr_t *a, int *in_progress)
{
    *in_progress = 0;
    int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    set_nodelay(fd);
    if (!connect(fd, (const struct sockaddr *)&a->sa, a->len)) return fd;
    if (errno == EINPROGRESS) {
        *in_progress = 1;
        return fd;
    }
    int e = errno;
    close(fd);
    return -e;
}

/* After POLLOUT on a connecting fd: 0 connected, else the errno of the
 * failed connect. */
static int net_connected(int fd)
{
    int err = 0;
    socklen_t l = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l)) return errno;
    return err;
}

/* Accept one pending connection (non-blocking, close-on-exec, TCP_NODELAY):
 * the fd, -EAGAIN when none is waiting, or another negative errno. */
static int net_accept(int lfd)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    set_nodelay(fd);
    return fd;
}

/* Close fd; abort != 0 resets the connection (RST) so the peer learns at
 * once that this side gave up, instead of waiting for its timeout. */
static void net_close(int fd, int abort)
{
    if (fd < 0) return;
    if (abort) {
        struct linger l = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    close(fd);
}

/* ---- buffers ------------------------------------------------------------- */

uint8_t *ps_ring_pool_get(ps_ring_t *r)
{
    if (r->npool) return r->pool[--r->npool];
    uint8_t *b = malloc(r->o.segment_bytes + 8);
    if (!b) ps_error("ring: cannot allocate a %zu-byte buffer", r->o.segment_bytes);
    return b;
}

void ps_ring_pool_put(ps_ring_t *r, uint8_t *b)
{
    if (!b) return;
    if (r->npool == r->pool_cap) {
        size_t cap = r->pool_cap ? 2 * r->pool_cap : 16;
        uint8_t **p = realloc(r->pool, cap * sizeof *p);
        if (!p) {
            free(b);
            return;
        }
        r->pool = p;
        r->pool_cap = cap;
    }
    r->pool[r->npool++] = b;
}

/* ---- set-up and tear-down ------------------------------------------------ */

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
        o.nconn < 1 || o.nconn > RING_MAX_CONN || o.window < 0) {
        ps_error("ring: invalid options (timeout_ms %d, segment_bytes %zu, nconn %d, window %d)",
                 o.timeout_ms, o.segment_bytes, o.nconn, o.window);
        return PS_EINVAL;
    }
    ps_ring_t *r = calloc(1, sizeof *r);
    if (!r) return PS_ENOMEM;
    r->rank = rank;
    r->world = world;
    r->o = o;
    r->lfd = -1;
    for (int c = 0; c < RING_MAX_CONN; c++) {
        r->out[c].fd = -1;
        r->in[c].fd = -1;
    }
    r->ep_self = strdup(endpoints[rank]);
    r->ep_left = strdup(endpoints[mod(rank - 1, world)]);
    r->ep_right = strdup(endpoints[(rank + 1) % world]);
    if (!r->ep_self || !r->ep_left || !r->ep_right) {
        ps_ring_destroy(&r);
        return PS_ENOMEM;
    }
    *out = r;
    if (world == 1) { /* nothing to talk to */
        if (o.listen_fd >= 0) net_close(o.listen_fd, 0);
        return 0;
    }

    ps_ring_addr_t self;
    int rc = net_resolve(r->ep_right, 0, &r->right);
    if (!rc && o.listen_fd >= 0) {
        r->lfd = o.listen_fd; /* bound by ps_ring_listen, now the ring's */
    } else if (!rc && !(rc = net_resolve(r->ep_self, 1, &self))) {
        r->lfd = net_listen(&self, r->ep_self);
        if (r->lfd < 0) rc = r->lfd;
    }
    for (int c = 0; !rc && c < o.nconn; c++)
        if (!(r->in[c].scratch = malloc(PIECE + 8))) rc = PS_ENOMEM;
    if (rc) {
        ps_ring_destroy(out);
        return rc;
    }
    ps_debug("ring: rank %d/%d listening on %s, %d connection(s) to %s", rank, world, r->ep_self,
             o.nconn, r->ep_right);
    return 0;
}

int ps_ring_listen(const char *bind_ep, int *fd, int *port)
{
    ps_ring_addr_t a;
    int rc = net_resolve(bind_ep, 2, &a);
    if (rc) return rc;
    int lfd = net_listen(&a, bind_ep);
    if (lfd < 0) return lfd;
    struct sockaddr_storage got;
    socklen_t len = sizeof got;
    if (getsockname(lfd, (struct sockaddr *)&got, &len)) {
        ps_error("ring: getsockname of %s: %s", bind_ep, strerror(errno));
        net_close(lfd, 0);
        return PS_EIO;
    }
    *port = got.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&got)->sin6_port)
                                      : ntohs(((struct sockaddr_in *)&got)->sin_port);
    *fd = lfd;
    return 0;
}

int ps_ring_set_timeout(ps_ring_t *r, int timeout_ms)
{
    if (!r || timeout_ms <= 0) return PS_EINVAL;
    r->o.timeout_ms = timeout_ms;
    return 0;
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

/* Close every socket; abort = reset them (after a failure). */
void ps_ring_close_all(ps_ring_t *r, int abort)
{
    for (int c = 0; c < RING_MAX_CONN; c++) {
        net_close(r->out[c].fd, abort);
        r->out[c].fd = -1;
        r->out[c].state = OUT_IDLE;
        r->out[c].busy = 0;
        ps_ring_pool_put(r, r->out[c].owned);
        r->out[c].owned = NULL;
        net_close(r->in[c].fd, abort);
        r->in[c].fd = -1;
        ps_ring_pool_put(r, r->in[c].buf);
        r->in[c].buf = NULL;
    }
    for (int p = 0; p < r->npend; p++) net_close(r->pend[p].fd, abort);
    r->npend = r->nin = r->nout = 0;
    net_close(r->lfd, 0);
    r->lfd = -1;
}

void ps_ring_destroy(ps_ring_t **rp)
{
    if (!rp || !*rp) return;
    ps_ring_t *r = *rp;
    /* A graceful close: the kernel still delivers what was written (the last
     * all-gather segments) after this returns, even if the process exits. */
    ps_ring_close_all(r, 0);
    if (r->fwd)
        for (size_t i = 0; i < r->done_cap; i++) free(r->fwd[i]);
    for (size_t i = 0; i < r->npool; i++) free(r->pool[i]);
    for (int c = 0; c < RING_MAX_CONN; c++) free(r->in[c].scratch);
    free(r->pool);
    free(r->done);
    free(r->fwd);
    free(r->crcs);
    free(r->ep_self);
    free(r->ep_left);
    free(r->ep_right);
    free(r);
    *rp = NULL;
}

/* ---- connections --------------------------------------------------------- */

/* Start, finish or retry connection c to the right neighbour; once it is
 * up, its hello is the first thing it sends. */
int ps_ring_conn_out(ps_ring_t *r, int c, double now)
{
    out_conn_t *oc = &r->out[c];
    if (oc->state == OUT_IDLE) {
        if (now < oc->retry_at) return 0;
        int inprog, fd = net_connect(&r->right, &inprog);
        if (fd < 0) {
            oc->retry_at = now + RETRY_MS;
            return 0;
        }
        oc->fd = fd;
        oc->rev = 0;
        oc->state = OUT_CONNECTING;
        if (inprog) return 0;
    } else if (oc->state == OUT_CONNECTING) {
        if (!oc->rev) return 0;
        if (net_connected(oc->fd)) { /* refused: not up yet */
            net_close(oc->fd, 0);
            oc->fd = -1;
            oc->state = OUT_IDLE;
            oc->retry_at = now + RETRY_MS;
            return 0;
        }
    } else {
        return 0;
    }
    uint8_t *h = oc->hdr;
    memset(h, 0, RING_HDR);
    ps_le_put32(h, HELLO_MAGIC);
    ps_le_put16(h + 4, 1);
    ps_le_put16(h + 6, (uint16_t)r->rank);
    ps_le_put32(h + 8, (uint32_t)r->world);
    ps_le_put16(h + 12, (uint16_t)c);
    ps_le_put16(h + 14, (uint16_t)r->o.nconn);
    ps_le_put64(h + 16, r->o.segment_bytes);
    ps_le_put32(h + 24, (uint32_t)r->o.checksum);
    oc->pl = NULL;
    oc->plen = oc->sent = 0;
    oc->owned = NULL;
    oc->crc_live = -1; /* -1: a hello, no trailer */
    oc->busy = 1;
    oc->state = OUT_READY;
    r->nout++;
    return 1;
}

/* A complete hello on pending connection p: adopt it as connection c from
 * the left neighbour, drop it (not a ring peer: 0), or fail. */
static int hello_check(ps_ring_t *r, pending_t *p)
{
    const uint8_t *h = p->h;
    int left = left_of(r);
    if (ps_le_get32(h) != HELLO_MAGIC) {
        ps_warn("ring: rank %d: a connection to %s is not a ring peer (no hello); closed", r->rank,
                r->ep_self);
        net_close(p->fd, 1);
        return 0;
    }
    unsigned ver = ps_le_get16(h + 4), from = ps_le_get16(h + 6), c = ps_le_get16(h + 12), nc = ps_le_get16(h + 14);
    uint32_t world = ps_le_get32(h + 8), cks = ps_le_get32(h + 24);
    uint64_t seg = ps_le_get64(h + 16);
    const char *what = NULL;
    if (ver != 1) what = "protocol version";
    else if (world != (uint32_t)r->world) what = "number of ranks";
    else if (from != (unsigned)left) what = "rank (not this rank's left neighbour)";
    else if (nc != (unsigned)r->o.nconn) what = "connections per neighbour";
    else if (seg != r->o.segment_bytes) what = "segment size";
    else if (cks != (uint32_t)r->o.checksum) what = "checksum setting";
    if (what) {
        ps_error("ring: rank %d (of %d, left neighbour rank %d): a peer at %s says it is rank %u of "
                 "%u with version %u, %u connection(s), %llu-byte segments, checksum %u: its %s "
                 "does not match; every rank must get the same --peers list and ring options",
                 r->rank, r->world, left, r->ep_self, from, world, ver, nc, (unsigned long long)seg,
                 cks, what);
        net_close(p->fd, 1);
        return ver != 1 ? PS_EVERSION : PS_EMISMATCH;
    }
    if (c >= (unsigned)r->o.nconn || r->in[c].fd >= 0) {
        ps_error("ring: rank %d: left neighbour rank %d opened connection %u twice", r->rank, left, c);
        net_close(p->fd, 1);
        return PS_EPROTO;
    }
    r->in[c].fd = p->fd;
    r->nin++;
    return 1;
}

/* Accept connections from the left and read their hellos. */
int ps_ring_conn_accept(ps_ring_t *r)
{
    int prog = 0;
    for (;;) {
        int fd = net_accept(r->lfd);
        if (fd < 0) {
            if (fd != -EAGAIN && fd != -EINTR && fd != -ECONNABORTED)
                ps_warn("ring: rank %d: accept on %s: %s", r->rank, r->ep_self, strerror(-fd));
            break;
        }
        if (r->npend == MAX_PENDING) { /* silent connections: drop the oldest */
            ps_warn("ring: rank %d: %d connections to %s sent no hello; dropping the oldest",
                    r->rank, MAX_PENDING, r->ep_self);
            net_close(r->pend[0].fd, 1);
            memmove(r->pend, r->pend + 1, (MAX_PENDING - 1) * sizeof *r->pend);
            r->npend--;
        }
        r->pend[r->npend++] = (pending_t){.fd = fd};
        prog = 1;
    }
    for (int i = 0; i < r->npend;) {
        pending_t *p = &r->pend[i];
        ssize_t g = recv(p->fd, p->h + p->got, RING_HDR - p->got, MSG_DONTWAIT);
        if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            i++;
            continue;
        }
        int rc = 0;
        if (g > 0) {
            prog = 1;
            p->got += (size_t)g;
            if (p->got < RING_HDR) continue;
            rc = hello_check(r, p);
        } else {
            net_close(p->fd, 0); /* gone before its hello */
        }
        memmove(p, p + 1, (size_t)(r->npend - i - 1) * sizeof *p);
        r->npend--;
        if (rc < 0) return rc;
    }
    return prog;
}
