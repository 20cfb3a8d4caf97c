/* The workers as the servers' replicas (opts.keep_state, sync mode).
 *
 * Each worker keeps the state of 1/W of the partitions (ps_client_keeps):
 * their PUSHPULLs ask for it (PS_FLAG_STATE) and the server's WEIGHTS reply
 * then carries the partition's raw fp32 weights and momentum of the new
 * version.  The worker keeps that version and the weights of the one
 * before (two weight buffers that swap roles, and the momentum), so when a
 * server restarts empty -- its disk gone with it -- the workers that keep
 * its partitions give them back: the spec, then per partition the state
 * (INIT with PS_FLAG_STATE at its version) and the previous weights
 * (PS_FLAG_STATE | PS_FLAG_EXACT), so a worker one step behind still finds
 * the version it computes from.  The I/O thread does it the moment the
 * server's first PS_FLAG_REBUILD error arrives (ps_client_keep_give_back):
 * a training thread blocked on another server's reply -- which waits for a
 * worker that waits for this rebuild -- cannot hold it up; the training
 * loop's ps_client_rebuild repeats it with handles (idempotent).  The weights of the
 * reply go to the caller's buffer as the request's wire dtype would have
 * brought them (rounded for fp16 / bf16), so keeping state changes no
 * worker's arithmetic. */
#include <stdlib.h>
#include <string.h>

#include "ps_client_int.h"
#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"

struct ps_client_keep {
    float *w[2];        /* (numel) the weights of version v (w[cur]) and v - 1 */
    float *m;           /* (numel) the momentum of version v */
    int cur;
    uint64_t v;         /* UINT64_MAX: nothing kept yet */
    int have_prev;      /* w[!cur] holds version v - 1 */
};

int ps_client_set_spec(ps_client_t *c, const char *spec_json)
{
    char *copy = spec_json ? strdup(spec_json) : NULL;
    if (spec_json && !copy) return PS_ENOMEM;
    free(c->spec);
    c->spec = copy;
    return 0;
}

/* The worker that keeps partition p: p being the j-th partition of server
 * s, worker (s + 1 + j) mod W.  A server's partitions spread over the
 * workers, and a host that runs psd s beside worker s does not keep its
 * own server's state (both would be lost together). */
int ps_client_keep_init(ps_client_t *c)
{
    uint32_t np = c->t->nparts, ns = (uint32_t)c->o.nservers, W = (uint32_t)c->o.num_workers;
    if (!c->o.keep_state || W == 0) return 0;
    uint32_t *j = calloc(ns ? ns : 1, sizeof *j);
    c->keeper = malloc((np ? np : 1) * sizeof *c->keeper);
    if (!j || !c->keeper) {
        free(j);
        return PS_ENOMEM;
    }
    for (uint32_t p = 0; p < np; p++) {
        uint32_t s = c->t->parts[p].server;
        c->keeper[p] = (int)((s + 1 + (s < ns ? j[s]++ : 0)) % W);
    }
    free(j);
    return 0;
}

int ps_client_keeps(const ps_client_t *c, uint32_t part)
{
    return c->keeper && c->rank >= 0 && part < c->t->nparts && c->keeper[part] == c->rank;
}

void ps_client_keep_free(ps_client_t *c)
{
    for (uint32_t p = 0; c->keep && p < c->t->nparts; p++) {
        free(c->keep[p].w[0]);
        free(c->keep[p].w[1]);
        free(c->keep[p].m);
    }
    free(c->keep);
    c->keep = NULL;
    free(c->spec);
    c->spec = NULL;
    free(c->keeper);
    c->keeper = NULL;
}

/* Weights rounded as the wire dtype dt would bring them (fp32: as they are). */
static int as_wire(ps_client_t *c, float *dst, const float *w, size_t n, ps_dtype_t dt)
{
    if (dt == PS_DT_FP32) {
        memcpy(dst, w, n * sizeof(float));
        return 0;
    }
    size_t cap = ps_codec_bound(dt, PS_CODEC_RAW, n), len = 0;
    void *buf = malloc(cap ? cap : 1);
    int rc = buf ? ps_codec_encode(buf, cap, &len, w, n, dt, PS_CODEC_RAW, NULL) : PS_ENOMEM;
    if (!rc) rc = ps_codec_decode(dst, n, buf, len, dt, PS_CODEC_RAW, 0, NULL);
    free(buf);
    if (rc) ps_client_set_error(c, "rounding kept weights to %s: %s", ps_dtype_name(dt),
                                ps_strerror(rc));
    return rc;
}

int ps_client_keep_reply(ps_client_t *c, ps_req_t *r, uint64_t v, const void *payload, size_t len)
{
    size_t n = r->dst_numel;
    if (len != 2 * n * sizeof(float) || r->part >= c->t->nparts) {
        ps_client_set_error(c, "partition %u: a state reply of %zu bytes, want %zu", r->part, len,
                            2 * n * sizeof(float));
        return PS_EPROTO;
    }
    const float *w = payload, *m = w + n;
    pthread_mutex_lock(&c->keep_mu);
    int rc = 0;
    if (!c->keep && !(c->keep = calloc(c->t->nparts, sizeof *c->keep))) rc = PS_ENOMEM;
    struct ps_client_keep *k = rc ? NULL : &c->keep[r->part];
    if (k && !k->m) {
        k->w[0] = malloc(n * sizeof(float));
        k->w[1] = malloc(n * sizeof(float));
        k->m = malloc(n * sizeof(float));
        k->v = UINT64_MAX;
        if (!k->w[0] || !k->w[1] || !k->m) {
            free(k->w[0]), free(k->w[1]), free(k->m);
            memset(k, 0, sizeof *k);
            rc = PS_ENOMEM;
        }
    }
    if (k && !rc && k->v != v) {
        /* the version before moves to the other buffer (a resent reply of
         * the same version changes nothing) */
        k->have_prev = k->v != UINT64_MAX && v == k->v + 1;
        if (k->have_prev) k->cur = !k->cur;
        memcpy(k->w[k->cur], w, n * sizeof(float));
        memcpy(k->m, m, n * sizeof(float));
        k->v = v;
    }
    pthread_mutex_unlock(&c->keep_mu);
    if (rc) {
        ps_client_set_error(c, "partition %u: out of memory for its kept state", r->part);
        return rc;
    }
    return as_wire(c, r->dst, w, n, r->dtype);
}

/* One INIT sent by the I/O thread without a handle (request_id 0: its ACK
 * is dropped); payload copied by ZeroMQ.  0 or PS_E*. */
static int send_init(ps_client_t *c, int s, uint32_t part, uint32_t flags, uint64_t v,
                     const char *body, const float *a, const float *b, size_t n)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_INIT);
    h.has_rank = 1, h.rank = c->rank;
    h.has_session = 1, h.session = c->session;
    h.has_request_id = 1, h.request_id = 0;
    h.has_partition = 1, h.partition = part;
    h.has_table_hash = 1, h.table_hash = c->t->hash;
    h.has_num_workers = 1, h.num_workers = (uint32_t)c->o.num_workers;
    if (body) {
        h.has_body = 1, h.body.data = (uint8_t *)body, h.body.len = strlen(body);
        return ps_wire_send(c->srv[s].sock, NULL, 0, &h, NULL, 0, NULL, NULL, 0);
    }
    h.has_flags = 1, h.flags = flags;
    h.has_iteration = 1, h.iteration = v;
    h.has_dtype = 1, h.dtype = PS__DTYPE__DT_FP32;
    h.has_codec = 1, h.codec = PS__CODEC__CODEC_RAW;
    h.has_numel = 1, h.numel = n;
    size_t len = (b ? 2 : 1) * n * sizeof(float);
    float *buf = malloc(len);
    if (!buf) return PS_ENOMEM;
    memcpy(buf, a, n * sizeof(float));
    if (b) memcpy(buf + n, b, n * sizeof(float));
    int rc = ps_wire_send(c->srv[s].sock, NULL, 0, &h, buf, len, NULL, NULL, 0);
    free(buf);
    return rc;
}

void ps_client_keep_give_back(ps_client_t *c, int s)
{
    if (!c->o.keep_state || !c->spec || c->srv[s].gave_back) return;
    c->srv[s].gave_back = 1;
    int rc = send_init(c, s, PS_PART_NONE, 0, 0, c->spec, NULL, NULL, 0);
    uint32_t n = 0;
    pthread_mutex_lock(&c->keep_mu);
    for (uint32_t p = 0; p < c->t->nparts && !rc; p++) {
        struct ps_client_keep *k = c->keep ? &c->keep[p] : NULL;
        if ((int)c->t->parts[p].server != s || !ps_client_keeps(c, p) || !k || !k->m ||
            k->v == UINT64_MAX)
            continue;
        size_t ne = c->t->parts[p].numel;
        rc = send_init(c, s, p, PS_FLAG_STATE, k->v, NULL, k->w[k->cur], k->m, ne);
        if (!rc && k->have_prev && k->v > 0)
            rc = send_init(c, s, p, PS_FLAG_STATE | PS_FLAG_EXACT, k->v - 1, NULL, k->w[!k->cur],
                           NULL, ne);
        n++;
    }
    pthread_mutex_unlock(&c->keep_mu);
    if (rc) ps_warn("server %d lost its state: giving back the partitions this worker keeps "
                    "failed (%s); the training loop tries again", s, ps_strerror(rc));
    else ps_info("server %d lost its state: gave back the %u partition(s) this worker keeps",
                 s, n);
}

/* An INIT of partition p with PS_FLAG_STATE (| extra), payload = n floats
 * of a then (b != NULL) n of b, at version v; submitted, *out the handle. */
static int init_req(ps_client_t *c, uint32_t p, uint32_t extra, uint64_t v, const float *a,
                    const float *b, ps_req_t **out)
{
    size_t n = c->t->parts[p].numel, len = (b ? 2 : 1) * n * sizeof(float);
    ps_req_t *r = ps_client_req_alloc(c, PS__MSG_TYPE__MSG_INIT, (int)c->t->parts[p].server, p);
    if (!r) return PS_EAGAIN;
    float *buf = malloc(len);
    if (!buf) {
        ps_client_req_abandon(c, r);
        return PS_ENOMEM;
    }
    memcpy(buf, a, n * sizeof(float));
    if (b) memcpy(buf + n, b, n * sizeof(float));
    r->tmp = buf;
    r->payload = buf;
    r->payload_len = len;
    r->crc = ps_crc32c(0, buf, len);
    r->dtype = PS_DT_FP32;
    r->codec = PS_CODEC_RAW;
    r->numel = n;
    r->flags = PS_FLAG_STATE | extra;
    r->iteration = v;
    ps_client_req_submit(c, r);
    *out = r;
    return 0;
}

int ps_client_rebuild(ps_client_t *c, int server, const char *spec_json)
{
    if (!c || server < 0 || server >= c->o.nservers || !spec_json) return PS_EINVAL;
    int rc = ps_client_send_spec(c, server, spec_json);
    if (rc) return rc;
    uint32_t np = c->t->nparts, n = 0, missing = 0;
    uint64_t lo = UINT64_MAX, hi = 0;
    ps_req_t **rs = calloc(2 * (size_t)np, sizeof *rs);
    if (!rs) return PS_ENOMEM;
    pthread_mutex_lock(&c->keep_mu);
    for (uint32_t p = 0; p < np && !rc; p++) {
        if ((int)c->t->parts[p].server != server || !ps_client_keeps(c, p)) continue;
        struct ps_client_keep *k = c->keep ? &c->keep[p] : NULL;
        if (!k || !k->m || k->v == UINT64_MAX) {
            ps_warn("partition %u of server %d: this worker keeps it but holds no copy yet "
                    "(restarted?): the server waits for it", p, server);
            missing++;
            continue;
        }
        rc = init_req(c, p, 0, k->v, k->w[k->cur], k->m, &rs[n++]);
        if (!rc && k->have_prev && k->v > 0)
            rc = init_req(c, p, PS_FLAG_EXACT, k->v - 1, k->w[!k->cur], NULL, &rs[n++]);
        lo = k->v < lo ? k->v : lo;
        hi = k->v > hi ? k->v : hi;
    }
    pthread_mutex_unlock(&c->keep_mu);
    for (uint32_t i = 0; i < n; i++) {
        if (!rs[i]) continue;
        int r1 = ps_client_wait(c, rs[i], -1, NULL);
        if (r1 && !rc) rc = r1;
    }
    free(rs);
    if (rc) {
        ps_error("rebuilding server %d: %s (%s)", server, ps_strerror(rc), c->last_error);
        return rc;
    }
    if (n) ps_info("server %d: gave back the state of the partitions this worker keeps "
                   "(versions %llu..%llu)%s", server, (unsigned long long)lo,
                   (unsigned long long)hi, missing ? ", some missing" : "");
    return 0;
}
