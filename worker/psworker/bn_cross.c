/* Cross-worker BN (--bn sync): the group the task's model combines its
 * batch-norm statistics over (ps_engine.h, ps_bn_group_t), carried by the
 * collectives of worker/comm as small messages.
 *
 *   ring mode   the job's own allreduce (the TCP ring or NCCL): each BN
 *               layer's gather runs between the step's gradient
 *               allreduces, on the same connections, in the same order on
 *               every rank (the model's layer order).
 *   PS mode     a side ring of the workers.  Each binds a free port before
 *               its HELLO and sends it there ("endpoint"); every worker has
 *               said HELLO once the start barrier is released, and server 0
 *               then lists every rank's endpoint in STATS, so nobody needs a
 *               list of peers.  The address sent is the one this host uses
 *               to reach server 0 (--bn-sync-addr overrides it).
 *
 * Set-up ends with a handshake gather (rank, W, the model's BN channel
 * count) under a short timeout: a peer that never connects, or that runs
 * another model, is named within seconds instead of stalling the first
 * step.  A failure later (a peer gone) fails the step on every rank: the
 * ring breaks and resets its connections, the BN layers stop exchanging
 * (the group's error is sticky), ps_worker_compute reports it. */
#include "worker/psworker/psworker.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/client/ps_client.h"
#include "worker/comm/ps_allreduce.h"
#include "worker/comm/ps_ring.h"

/* A peer that is not there at set-up is named after this long. */
#define SETUP_TIMEOUT_MS 10000

static int gather(void *arg, const float *mine, float *all, size_t n)
{
    return ps_allreduce_gather(arg, mine, all, n);
}

/* Every rank's (rank, W, BN channels) must be what this rank expects. */
static int handshake(ps_worker_t *p, ps_allreduce_t *ar, char **eps)
{
    const int W = p->nworkers;
    float mine[3] = {(float)p->rank, (float)W, (float)p->bn_cross};
    float *all = malloc(sizeof(float) * 3 * (size_t)W);
    if (!all) return PS_ENOMEM;
    int rc = ps_allreduce_gather(ar, mine, all, 3);
    for (int r = 0; !rc && r < W; r++) {
        const float *a = all + 3 * (size_t)r;
        if (a[0] != (float)r || a[1] != (float)W || a[2] != (float)p->bn_cross) {
            ps_error("--bn sync: rank %d%s%s is not this job's peer: it says rank %.0f of %.0f "
                     "workers with %.0f BN channels, this rank expects rank %d of %d with %d "
                     "(another model or --num-workers?)", r, eps ? " at " : "", eps ? eps[r] : "",
                     a[0], a[1], a[2], r, W, p->bn_cross);
            rc = PS_EMISMATCH;
        }
    }
    free(all);
    return rc;
}

static void attach(ps_worker_t *p, ps_allreduce_t *ar)
{
    p->bn_group = (ps_bn_group_t){
        .rank = p->rank, .size = p->nworkers, .gather = gather, .arg = ar};
    if (p->ctx) p->ctx->bn_group = &p->bn_group;
    ps_info("--bn sync: BN statistics over %d workers (%d channels per step and direction)",
            p->nworkers, p->bn_cross);
}

int ps_worker_bn_use(ps_worker_t *p, struct ps_allreduce *ar)
{
    if (!p->bn_cross || p->nworkers < 2) return 0;
    int rc = handshake(p, ar, NULL);
    if (rc) {
        ps_error("--bn sync: the set-up exchange over the job's allreduce failed: %s",
                 ps_strerror(rc));
        return rc;
    }
    attach(p, ar);
    return 0;
}

/* The address this host uses to reach server 0's host (a UDP "connect"
 * sends nothing): the one the other workers can reach it on too, when they
 * reach server 0 the same way. */
static int local_addr_towards(const char *ep, char *out, size_t len)
{
    char host[256];
    const char *h = strncmp(ep, "tcp://", 6) ? ep : ep + 6, *colon = strrchr(h, ':');
    size_t hl = colon ? (size_t)(colon - h) : strlen(h);
    if (hl >= sizeof host || !hl) return PS_EINVAL;
    memcpy(host, h, hl);
    host[hl] = 0;
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') { /* [IPv6] */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (getaddrinfo(host, "9", &hints, &res) || !res) return PS_ENOTFOUND;
    int rc = PS_EIO, fd = socket(res->ai_family, SOCK_DGRAM, 0);
    struct sockaddr_storage me;
    socklen_t ml = sizeof me;
    if (fd >= 0 && !connect(fd, res->ai_addr, res->ai_addrlen) &&
        !getsockname(fd, (struct sockaddr *)&me, &ml)) {
        const void *a = me.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&me)->sin6_addr
                                                 : (const void *)&((struct sockaddr_in *)&me)->sin_addr;
        char buf[INET6_ADDRSTRLEN];
        if (inet_ntop(me.ss_family, a, buf, sizeof buf)) {
            snprintf(out, len, me.ss_family == AF_INET6 ? "[%s]" : "%s", buf);
            rc = 0;
        }
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return rc;
}

int ps_worker_bn_prepare(ps_worker_t *p)
{
    p->bn_lfd = -1;
    if (!p->bn_cross || p->nworkers < 2) return 0;
    const ps_worker_opts_t *o = p->o;
    char addr[160] = "";
    int n = 0, port = 0, rc;
    char **servers = ps_worker_split_list(o->servers, &n);
    if (!servers) return PS_ENOMEM;
    if (*o->ring.bn_sync_addr) snprintf(addr, sizeof addr, "%s", o->ring.bn_sync_addr);
    else if ((rc = local_addr_towards(servers[0], addr, sizeof addr)))
        ps_warn("--bn sync: no route to server 0 (%s) to find this host's address (%s): "
                "advertising 127.0.0.1 (give --bn-sync-addr)", servers[0], ps_strerror(rc));
    free(servers);
    if (!*addr) snprintf(addr, sizeof addr, "127.0.0.1");
    const int v6 = addr[0] == '[';
    if ((rc = ps_ring_listen(v6 ? "tcp://[::]:0" : "tcp://*:0", &p->bn_lfd, &port))) {
        ps_error("--bn sync: cannot listen for the BN ring: %s", ps_strerror(rc));
        return rc;
    }
    snprintf(p->bn_endpoint, sizeof p->bn_endpoint, "tcp://%s:%d", addr, port);
    ps_info("--bn sync: BN ring of this worker at %s (sent to server 0 in HELLO)", p->bn_endpoint);
    return 0;
}

/* Rank r's endpoint from server 0's STATS ("workers": [{"rank", "endpoint"}]). */
static int endpoints_from(ps_worker_t *p, const char *json, char **eps)
{
    cJSON *o = cJSON_Parse(json);
    const cJSON *ws = o ? cJSON_GetObjectItemCaseSensitive(o, "workers") : NULL;
    const cJSON *w;
    int rc = ws ? 0 : PS_EPROTO;
    cJSON_ArrayForEach(w, ws)
    {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(w, "rank");
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(w, "endpoint");
        if (cJSON_IsNumber(r) && r->valueint >= 0 && r->valueint < p->nworkers &&
            cJSON_IsString(e) && !eps[r->valueint])
            eps[r->valueint] = strdup(e->valuestring);
    }
    for (int r = 0; !rc && r < p->nworkers; r++)
        if (!eps[r]) {
            ps_error("--bn sync: server 0 knows no BN ring endpoint of rank %d: was it started "
                     "with --bn sync?", r);
            rc = PS_ENOTFOUND;
        }
    cJSON_Delete(o);
    return rc;
}

int ps_worker_bn_open_side(ps_worker_t *p, struct ps_client *c)
{
    if (!p->bn_cross || p->nworkers < 2) return 0;
    const int W = p->nworkers;
    char *json = NULL;
    char **eps = calloc((size_t)W, sizeof *eps);
    int rc = eps ? ps_client_stats(c, 0, &json) : PS_ENOMEM;
    if (rc) ps_error("--bn sync: STATS from server 0: %s", ps_strerror(rc));
    if (!rc) rc = endpoints_from(p, json, eps);
    if (!rc && strcmp(eps[p->rank], p->bn_endpoint)) {
        ps_error("--bn sync: server 0 lists %s for rank %d, this worker listens at %s",
                 eps[p->rank], p->rank, p->bn_endpoint);
        rc = PS_EMISMATCH;
    }
    ps_allreduce_opts_t ao = {.timeout_ms = SETUP_TIMEOUT_MS, .nconn = 1, .listen_fd = p->bn_lfd};
    if (!rc) {
        rc = ps_allreduce_open(&p->bn_ar, "ring", p->rank, W, (const char *const *)eps, &ao);
        p->bn_lfd = -1; /* the ring's now, whatever happened */
    }
    if (!rc) {
        ps_info("--bn sync: waiting up to %d s for the BN ring's %d peers (left %s, right %s)",
                SETUP_TIMEOUT_MS / 1000, W - 1, eps[(p->rank + W - 1) % W],
                eps[(p->rank + 1) % W]);
        rc = handshake(p, p->bn_ar, eps);
    }
    if (!rc) rc = ps_allreduce_set_timeout(p->bn_ar, p->o->timeout_ms > 0 ? p->o->timeout_ms
                                                                          : 24 * 3600 * 1000);
    if (rc) ps_error("--bn sync: the BN ring of %d workers could not be set up: %s", W,
                     ps_strerror(rc));
    else attach(p, p->bn_ar);
    for (int r = 0; eps && r < W; r++) free(eps[r]);
    free(eps);
    free(json);
    return rc;
}

void ps_worker_bn_close(ps_worker_t *p)
{
    if (p->ctx && p->ctx->bn_group == &p->bn_group) p->ctx->bn_group = NULL;
    if (p->bn_group.gather)
        ps_info("--bn sync: %llu exchanges", (unsigned long long)p->bn_group.gathers);
    ps_bn_group_free_buf(&p->bn_group);
    p->bn_group.gather = NULL; /* detached; its count stays for the final line */
    p->bn_group.arg = NULL;
    ps_allreduce_close(&p->bn_ar);
    if (p->bn_lfd >= 0) close(p->bn_lfd);
    p->bn_lfd = -1;
}
