/* psd client, I/O thread: the timers -- resends of unanswered requests
 * with exponential backoff, failing them after timeout_ms, the warnings
 * about requests that stay unanswered (and the probe asking a server whom
 * it waits for), heartbeats, and when the loop must wake next. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ps_client_int.h"
#include "ps_error.h"
#include "ps_log.h"

#define RETRY_CAP_MS 60000  /* backoff ceiling */

static void fail_timeout(ps_client_t *c, int s, ps_req_t *r)
{
    ps_client_set_error(c, "server %d: %s (partition %d) got no reply within %d ms (%d sends)", s,
                        ps_wire_type_name(r->type), r->part == PS_PART_NONE ? -1 : (int)r->part,
                        c->o.timeout_ms, r->nsent);
    ps_warn("%s", c->last_error);
    /* ZeroMQ may still hold a frame of it (a peer that accepts the
     * connection but stopped reading); reopening the socket makes it let go,
     * so the waiter can get its buffer back. */
    if (atomic_load(&r->zrefs) > 0) c->srv[s].reset = 1;
    ps_client_io_complete(c, r, PS_ETIMEOUT);
}

/* What a request that stays unanswered waits for, as the server sees it. */
static const char *stall_hint(int type)
{
    switch (type) {
    case PS__MSG_TYPE__MSG_HELLO: return "is psd running there, and is it this job's server?";
    case PS__MSG_TYPE__MSG_BARRIER:
        return "the server holds the barrier for workers that have not arrived (its log and "
               "`psctl status` name them)";
    case PS__MSG_TYPE__MSG_PUSH:
    case PS__MSG_TYPE__MSG_PUSHPULL:
        return "a sync server answers once every worker pushed this step (its log and `psctl "
               "status` name the late ones), or the server is stalled";
    default: return "the server is busy, stalled or gone";
    }
}

/* A TCP connect to a tcp://HOST:PORT endpoint, to say in a stall warning
 * whether anything listens there.  At most 200 ms; "" for other schemes. */
static void probe_endpoint(const char *ep, char *out, size_t len)
{
    char host[256];
    const char *hp = !strncmp(ep, "tcp://", 6) ? ep + 6 : NULL, *colon;
    out[0] = 0;
    if (!hp || !(colon = strrchr(hp, ':')) || (size_t)(colon - hp) >= sizeof host) return;
    int n = (int)(colon - hp);
    if (n >= 2 && hp[0] == '[' && hp[n - 1] == ']') hp++, n -= 2; /* [::1] */
    memcpy(host, hp, (size_t)n);
    host[n] = 0;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) || !ai) {
        snprintf(out, len, "; %s does not resolve", host);
        return;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0), err = 0;
    socklen_t el = sizeof err;
    if (fd >= 0 && (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS)) {
        struct pollfd pf = {fd, POLLOUT, 0};
        if (poll(&pf, 1, 200) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el))
            snprintf(out, len, err ? "; connecting to it: %s (nothing listens at that port?)"
                                   : "; it accepts TCP connections", strerror(err));
    } else if (fd >= 0) {
        snprintf(out, len, "; connecting to it: %s", strerror(errno));
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
}

/* A stalled request that waits on other workers (a sync push, a barrier):
 * ask the server whom it waits for.  The STATS goes with request_id 0,
 * which no request of the pool ever has (generations start at 1), and its
 * answer is logged by late_reply. */
static void late_probe(ps_client_t *c, int s, const ps_req_t *old)
{
    if (old->type != PS__MSG_TYPE__MSG_PUSH && old->type != PS__MSG_TYPE__MSG_PUSHPULL &&
        old->type != PS__MSG_TYPE__MSG_BARRIER)
        return;
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    h.has_rank = 1, h.rank = c->rank;
    h.has_request_id = 1, h.request_id = 0;
    ps_wire_send(c->srv[s].sock, NULL, 0, &h, NULL, 0, NULL, NULL, ZMQ_DONTWAIT);
}

/* Requests of server s unanswered for stall_warn_ms: one line naming the
 * server, its endpoint, what waits (message, partitions, step), for how
 * long and why it may, then again at 2x, 4x ... up to every 60 s while
 * anything stays unanswered.  No wait goes on without a word. */
static void stall_check(ps_client_t *c, int s, int64_t now)
{
    ps_client_server_t *sv = &c->srv[s];
    const ps_req_t *old = NULL;
    uint32_t plo = UINT32_MAX, phi = 0;
    int n = 0;
    for (int list = 0; list < 2; list++)
        for (const ps_req_t *r = list ? sv->inflight : sv->pending; r; r = r->next) {
            n++;
            if (!old || r->t_submit < old->t_submit) old = r;
            if (r->part != PS_PART_NONE) {
                plo = r->part < plo ? r->part : plo;
                phi = r->part > phi ? r->part : phi;
            }
        }
    if (!old || c->o.stall_warn_ms <= 0 || now - old->t_submit < c->o.stall_warn_ms) {
        sv->stall_next = 0;
        sv->stall_gap = c->o.stall_warn_ms;
        return;
    }
    if (sv->stall_next && now < sv->stall_next) return;
    char parts[48] = "", step[40] = "", probe[320] = "";
    if (plo != UINT32_MAX)
        snprintf(parts, sizeof parts, plo == phi ? " of partition %u" : " of partitions %u-%u",
                 plo, phi);
    if (old->type == PS__MSG_TYPE__MSG_PUSH || old->type == PS__MSG_TYPE__MSG_PUSHPULL)
        snprintf(step, sizeof step, " at step %llu", (unsigned long long)old->iteration);
    if (old->type == PS__MSG_TYPE__MSG_HELLO || old->nsent == 0)
        probe_endpoint(sv->endpoint, probe, sizeof probe);
    ps_warn("server %d (%s): %d request(s) unanswered for %.1f s, the oldest %s%s%s (sent %d "
            "time(s))%s; %s", s, sv->endpoint, n, (double)(now - old->t_submit) / 1e3,
            ps_wire_type_name(old->type), parts, step, old->nsent, probe, stall_hint(old->type));
    if (old->nsent > 0) late_probe(c, s, old);
    sv->stall_gap = sv->stall_gap * 2 > 60000 ? 60000 : sv->stall_gap * 2;
    sv->stall_next = now + sv->stall_gap;
}

void ps_client_timers_run(ps_client_t *c, int64_t now)
{
    for (int s = 0; s < c->o.nservers; s++) {
        ps_client_server_t *sv = &c->srv[s];
        for (ps_req_t **pp = &sv->pending; *pp;) {
            ps_req_t *r = *pp;
            if (r->t_deadline && now >= r->t_deadline) {
                *pp = r->next;
                r->next = NULL;
                fail_timeout(c, s, r);
            } else {
                pp = &r->next;
            }
        }
        for (ps_req_t **pp = &sv->inflight; *pp;) {
            ps_req_t *r = *pp;
            if (r->t_deadline && now >= r->t_deadline) {
                *pp = r->next;
                r->next = NULL;
                sv->ninflight -= ps_client_io_windowed(r);
                fail_timeout(c, s, r);
                continue;
            }
            if (r->t_retry && now >= r->t_retry) {
                int rc = ps_client_io_send(c, s, r);
                if (rc == 0) {
                    atomic_fetch_add(&c->retries, 1);
                    ps_debug("server %d: resent %s partition %d (send %d)", s,
                             ps_wire_type_name(r->type), (int)r->part, r->nsent);
                    r->retry_delay = r->retry_delay * 2 > RETRY_CAP_MS ? RETRY_CAP_MS
                                                                      : r->retry_delay * 2;
                    /* retries off: this was the one resend after a reconnect */
                    r->t_retry = c->o.retry_ms > 0 ? now + r->retry_delay : 0;
                } else {
                    r->t_retry = now + PS_CLIENT_BLOCKED_POLL_MS;
                }
            }
            pp = &r->next;
        }
        stall_check(c, s, now);
        if (c->o.heartbeat_ms > 0 && now >= sv->next_heartbeat) {
            Ps__Header h;
            ps_wire_header_init(&h, PS__MSG_TYPE__MSG_HEARTBEAT);
            h.has_rank = 1;
            h.rank = c->rank;
            h.has_flags = 1;
            h.flags = PS_FLAG_NO_REPLY; /* liveness only: an ACK would be noise */
            if (c->rank >= 0) ps_wire_send(sv->sock, NULL, 0, &h, NULL, 0, NULL, NULL, ZMQ_DONTWAIT);
            sv->next_heartbeat = now + c->o.heartbeat_ms;
        }
    }
}

int ps_client_timers_next(ps_client_t *c, int64_t now)
{
    int64_t next = INT64_MAX;
    for (int s = 0; s < c->o.nservers; s++) {
        ps_client_server_t *sv = &c->srv[s];
        if (sv->blocked && sv->pending) next = now + PS_CLIENT_BLOCKED_POLL_MS;
        int64_t stall = c->o.stall_warn_ms > 0 ? c->o.stall_warn_ms : INT64_MAX / 4;
        for (ps_req_t *r = sv->pending; r; r = r->next) {
            if (r->t_deadline && r->t_deadline < next) next = r->t_deadline;
            if (!sv->stall_next && r->t_submit + stall < next) next = r->t_submit + stall;
        }
        for (ps_req_t *r = sv->inflight; r; r = r->next) {
            if (r->t_deadline && r->t_deadline < next) next = r->t_deadline;
            if (r->t_retry && r->t_retry < next) next = r->t_retry;
            if (!sv->stall_next && r->t_submit + stall < next) next = r->t_submit + stall;
        }
        if (sv->stall_next && sv->stall_next < next) next = sv->stall_next;
        if (c->o.heartbeat_ms > 0 && sv->next_heartbeat < next) next = sv->next_heartbeat;
    }
    if (next == INT64_MAX) return -1;
    return next <= now ? 0 : (int)(next - now > 60000 ? 60000 : next - now);
}
