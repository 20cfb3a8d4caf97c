/* The psd client's control calls: HELLO (and joining an elastic job),
 * INIT, barriers, rollback, membership, STATS, CHECKPOINT, SHUTDOWN.  Each
 * is one request per server, waited for here (blocking); the data path
 * (PUSH / PULL / PUSHPULL) is ps_client.c's. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_client_int.h"
#include "ps_error.h"
#include "ps_log.h"

static ps_req_t *ctl_req(ps_client_t *c, int type, int server, const char *body, size_t blen)
{
    ps_req_t *r = ps_client_req_alloc(c, type, server, PS_PART_NONE);
    if (!r) return NULL;
    if (body) {
        r->body = malloc(blen + 1);
        if (!r->body) {
            ps_client_req_abandon(c, r);
            return NULL;
        }
        memcpy(r->body, body, blen);
        r->body[blen] = 0;
        r->body_len = blen;
    }
    return r;
}

/* Submit a control request and wait for it; on success the reply fields are
 * read by `read` (may be NULL) before the handle goes back to the pool. */
typedef int (*reply_fn)(ps_client_t *c, ps_req_t *r, void *arg);
static int ctl_call(ps_client_t *c, ps_req_t *r, reply_fn read, void *arg)
{
    ps_client_req_submit(c, r);
    ps_client_wait_done_locked(c, r, -1);
    int rc = r->result;
    pthread_mutex_unlock(&c->mu);
    if (rc == 0 && read) rc = read(c, r, arg);
    pthread_mutex_lock(&c->mu);
    ps_client_req_release_locked(c, r);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int read_welcome(ps_client_t *c, ps_req_t *r, void *arg)
{
    if (arg) *(uint64_t *)arg = r->version; /* joining: the first step */
    if (r->reply_has_hash && r->reply_hash != c->t->hash) {
        ps_client_set_error(c, "server 0 has partition table hash %016llx, this worker %016llx",
                            (unsigned long long)r->reply_hash, (unsigned long long)c->t->hash);
        ps_error("%s", c->last_error);
        return PS_EMISMATCH;
    }
    if (r->reply_nservers && r->reply_nservers != c->t->nservers) {
        ps_client_set_error(c, "server 0 says the cluster has %u servers, this worker's "
                            "--servers lists %u", r->reply_nservers, c->t->nservers);
        ps_error("%s", c->last_error);
        return PS_EMISMATCH;
    }
    if (r->reply_rank < 0 || (c->o.rank >= 0 && r->reply_rank != c->o.rank)) {
        ps_client_set_error(c, "server 0 gave rank %d (asked for %d)", r->reply_rank, c->o.rank);
        ps_error("%s", c->last_error);
        return PS_EPROTO;
    }
    c->rank = r->reply_rank;
    return 0;
}

/* The WELCOME of server s > 0: the rank server 0 gave, the same table. */
static int read_welcome_other(ps_client_t *c, ps_req_t *r, int s)
{
    if (r->result < 0) return r->result;
    if (r->reply_has_hash && r->reply_hash != c->t->hash) {
        ps_client_set_error(c, "server %d (%s) has partition table hash %016llx, this worker "
                            "%016llx", s, c->endpoints[s], (unsigned long long)r->reply_hash,
                            (unsigned long long)c->t->hash);
        ps_error("%s", c->last_error);
        return PS_EMISMATCH;
    }
    if (r->reply_rank != c->rank) {
        ps_client_set_error(c, "server %d (%s) gave rank %d, server 0 gave %d", s,
                            c->endpoints[s], r->reply_rank, c->rank);
        ps_error("%s", c->last_error);
        return PS_EPROTO;
    }
    return 0;
}

static int hello(ps_client_t *c, uint32_t flags, uint64_t *from)
{
    char host[256] = "?";
    if (!c) return PS_EINVAL;
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    ps_req_t *r = ctl_req(c, PS__MSG_TYPE__MSG_HELLO, 0, host, strlen(host));
    if (!r) return PS_ENOMEM;
    r->flags = flags;
    int rc = ctl_call(c, r, read_welcome, from);
    if (rc < 0) return rc;
    /* The other servers, all at once, with the rank server 0 gave. */
    int S = c->o.nservers;
    ps_req_t **rs = calloc((size_t)S, sizeof *rs);
    if (!rs) return PS_ENOMEM;
    for (int s = 1; s < S && !rc; s++) {
        if (!(rs[s] = ctl_req(c, PS__MSG_TYPE__MSG_HELLO, s, host, strlen(host)))) rc = PS_ENOMEM;
        else ps_client_req_submit(c, rs[s]);
    }
    for (int s = 1; s < S && rs[s]; s++) {
        ps_client_wait_done_locked(c, rs[s], -1);
        pthread_mutex_unlock(&c->mu); /* done: the reply fields no longer change */
        int r1 = read_welcome_other(c, rs[s], s);
        pthread_mutex_lock(&c->mu);
        ps_client_req_release_locked(c, rs[s]);
        pthread_mutex_unlock(&c->mu);
        if (r1 < 0 && rc == 0) rc = r1;
    }
    free(rs);
    return rc < 0 ? rc : c->rank;
}

int ps_client_hello(ps_client_t *c) { return hello(c, 0, NULL); }

int ps_client_join(ps_client_t *c, uint64_t *from)
{
    return hello(c, PS_FLAG_JOIN, from);
}

int ps_client_members(ps_client_t *c, const char *json)
{
    int rc = 0;
    for (int s = 0; s < c->o.nservers && !rc; s++) {
        ps_req_t *r = ctl_req(c, PS__MSG_TYPE__MSG_MEMBERS, s, json, strlen(json));
        rc = r ? ctl_call(c, r, NULL, NULL) : PS_ENOMEM;
    }
    return rc;
}

static int read_step(ps_client_t *c, ps_req_t *r, void *arg)
{
    (void)c;
    *(uint64_t *)arg = r->version;
    return 0;
}

int ps_client_drain(ps_client_t *c, int rank, uint64_t *from)
{
    ps_req_t *r = ctl_req(c, PS__MSG_TYPE__MSG_DRAIN, 0, NULL, 0);
    if (!r) return PS_ENOMEM;
    r->rank_arg = rank;
    return ctl_call(c, r, read_step, from);
}

unsigned ps_client_epochs_seen(const ps_client_t *c)
{
    return atomic_load(&c->epochs_seen);
}

void ps_client_set_outcome(ps_client_t *c, int outcome, int code, const char *text)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->outcome = outcome;
    c->outcome_code = code;
    snprintf(c->outcome_text, sizeof c->outcome_text, "%s", text ? text : "");
    pthread_mutex_unlock(&c->mu);
}

int ps_client_send_spec(ps_client_t *c, int server, const char *spec_json)
{
    ps_req_t *r = ctl_req(c, PS__MSG_TYPE__MSG_INIT, server, spec_json, strlen(spec_json));
    return r ? ctl_call(c, r, NULL, NULL) : PS_ENOMEM;
}

int ps_client_init(ps_client_t *c, const char *spec_json, const float *flat_weights,
                   int *from_ckpt)
{
    int S = c ? c->o.nservers : 0, rc = 0, nckpt = 0;
    if (from_ckpt) *from_ckpt = 0;
    if (!c || !spec_json || !flat_weights) return PS_EINVAL;

    ps_req_t **rs = calloc((size_t)S + c->t->nparts, sizeof *rs);
    int *ckpt = calloc((size_t)S, sizeof *ckpt);
    if (!rs || !ckpt) {
        free(rs);
        free(ckpt);
        return PS_ENOMEM;
    }
    /* The spec goes to every server at once; weights follow only after each
     * server built its table (and told us whether it restored a checkpoint). */
    for (int s = 0; s < S; s++) {
        rs[s] = ctl_req(c, PS__MSG_TYPE__MSG_INIT, s, spec_json, strlen(spec_json));
        if (!rs[s]) {
            rc = PS_ENOMEM;
            break;
        }
        ps_client_req_submit(c, rs[s]);
    }
    for (int s = 0; s < S && rs[s]; s++) {
        ps_client_wait_done_locked(c, rs[s], -1);
        int r1 = rs[s]->result;
        ckpt[s] = r1 == 0 && (rs[s]->reply_flags & PS_FLAG_FROM_CKPT);
        ps_client_req_release_locked(c, rs[s]);
        pthread_mutex_unlock(&c->mu);
        if (r1 < 0 && rc == 0) rc = r1;
        nckpt += ckpt[s];
    }
    if (rc == 0 && nckpt > 0 && nckpt < S)
        ps_warn("%d of %d servers restored a checkpoint; sending initial weights to the others",
                nckpt, S);
    /* Residuals belong to the weights they were computed against. */
    if (rc == 0 && nckpt > 0) ps_client_ef_reset(c);

    uint32_t n = 0;
    for (uint32_t p = 0; rc == 0 && p < c->t->nparts; p++) {
        const ps_partition_t *pt = &c->t->parts[p];
        if (ckpt[pt->server]) continue;
        ps_req_t *r = ps_client_req_alloc(c, PS__MSG_TYPE__MSG_INIT, (int)pt->server, p);
        if (!r) {
            rc = PS_EAGAIN;
            break;
        }
        rc = ps_client_encode_part(c, r, p, flat_weights + pt->offset, PS_DT_FP32, PS_CODEC_RAW);
        if (rc < 0) {
            ps_client_req_abandon(c, r);
            break;
        }
        ps_client_req_submit(c, r);
        rs[S + n++] = r;
    }
    for (uint32_t i = 0; i < n; i++) {
        int r1 = ps_client_wait(c, rs[S + i], -1, NULL);
        if (r1 < 0 && rc == 0) rc = r1;
    }
    if (rc == 0 && from_ckpt) *from_ckpt = nckpt == S;
    free(rs);
    free(ckpt);
    return rc;
}

int ps_client_barrier(ps_client_t *c)
{
    if (!c) return PS_EINVAL;
    ps_req_t *r = ctl_req(c, PS__MSG_TYPE__MSG_BARRIER, 0, NULL, 0);
    return r ? ctl_call(c, r, NULL, NULL) : PS_EAGAIN;
}

static int read_body(ps_client_t *c, ps_req_t *r, void *arg)
{
    char **json = arg;
    (void)c;
    *json = malloc(r->reply_body_len + 1);
    if (!*json) return PS_ENOMEM;
    if (r->reply_body_len) memcpy(*json, r->reply_body, r->reply_body_len);
    (*json)[r->reply_body_len] = 0;
    return 0;
}

int ps_client_rollback(ps_client_t *c, uint64_t *version)
{
    if (!c || !version) return PS_EINVAL;
    /* Each round either succeeds on every server or lowers the target to
     * the version of a server that is behind it; versions only go down, and
     * a server's own version is always restorable by it, so this ends. */
    for (int round = 0; round < 16; round++) {
        uint64_t v = *version, lower = v;
        int rc = 0;
        for (int s = 0; s < c->o.nservers && !rc && lower == v; s++) {
            ps_req_t *r = ctl_req(c, PS__MSG_TYPE__MSG_ROLLBACK, s, NULL, 0);
            if (!r) return PS_EAGAIN;
            r->iteration = v;
            ps_client_req_submit(c, r);
            ps_client_wait_done_locked(c, r, -1);
            rc = r->result;
            if (rc == PS_ESTATE && (r->reply_flags & PS_FLAG_ROLLBACK) && r->version < v) {
                lower = r->version;
                rc = 0;
            }
            ps_client_req_release_locked(c, r);
            pthread_mutex_unlock(&c->mu);
        }
        if (rc) return rc;
        if (lower == v) return 0;
        ps_warn("a server is at version %llu, below %llu: rolling back to %llu",
                (unsigned long long)lower, (unsigned long long)v, (unsigned long long)lower);
        *version = lower;
    }
    ps_client_set_error(c, "rollback: the servers' versions kept changing");
    return PS_ESTATE;
}

int ps_client_stats_ex(ps_client_t *c, int server, uint32_t flags, char **json)
{
    if (json) *json = NULL;
    if (!c || !json || server < 0 || server >= c->o.nservers) return PS_EINVAL;
    ps_req_t *r = ctl_req(c, PS__MSG_TYPE__MSG_STATS, server, NULL, 0);
    if (r) r->flags = flags;
    return r ? ctl_call(c, r, read_body, json) : PS_EAGAIN;
}

int ps_client_stats(ps_client_t *c, int server, char **json)
{
    return ps_client_stats_ex(c, server, 0, json);
}

int ps_client_checkpoint(ps_client_t *c, int server)
{
    if (!c || server < 0 || server >= c->o.nservers) return PS_EINVAL;
    ps_req_t *r = ctl_req(c, PS__MSG_TYPE__MSG_CHECKPOINT, server, NULL, 0);
    return r ? ctl_call(c, r, NULL, NULL) : PS_EAGAIN;
}

int ps_client_shutdown_servers(ps_client_t *c)
{
    int rc = 0;
    if (!c) return PS_EINVAL;
    for (int s = 0; s < c->o.nservers; s++) {
        ps_req_t *r = ctl_req(c, PS__MSG_TYPE__MSG_SHUTDOWN, s, NULL, 0);
        int r1 = r ? ctl_call(c, r, NULL, NULL) : PS_EAGAIN;
        if (r1 < 0 && rc == 0) rc = r1;
    }
    return rc;
}
