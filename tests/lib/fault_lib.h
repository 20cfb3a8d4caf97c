/* Shared by the fault tests (docs/reliability.md): a fixed model whose
 * sync-mode result is exactly computable in fp32, and a raw sync worker built
 * on ps_wire DEALER sockets (no psworker, no ps_client), so the tests drive
 * psd the way a worker does while the faults are injected around it.
 *
 * Exactness: weights start at multiples of 0.5, gradients are small
 * integers, lr = 0.25 and momentum 0, so every sum, mean (the mean of W
 * integers with W | 2*sum), product and difference is representable and the
 * expected weights after K steps are exact: a lost, doubled or half-applied
 * push shows up as a bitwise mismatch, not as a tolerance question.
 * With same_grad every rank pushes the same gradient, so the mean does not
 * depend on how many workers contributed (the --on-worker-loss=continue
 * tests, where a paused worker misses steps), while a wrong divisor (mean
 * over W instead of over the pushers) or a doubled slot still changes it.
 *
 * The worker keeps one iteration counter per partition: it pushes
 * PUSHPULL(iteration = it_p) and sets it_p to the version in the WEIGHTS
 * reply.  Normally that is it_p + 1; after it missed steps (declared lost
 * and continued without it) psd answers its old push with the current
 * weights and version, and the worker catches up from there.  Pushes are
 * resent unchanged (same request id) when no reply came within retry_ms:
 * psd keys them by (rank, partition, iteration), so a resend is never
 * applied twice.  While waiting it heartbeats every server. */
#ifndef FAULT_LIB_H
#define FAULT_LIB_H

#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "ps_codec.h"
#include "ps_error.h"
#include "ps_partition.h"
#include "ps_wire.h"

#define FL_MAXS 4
#define FL_MAXP 64
#define FL_NT 3
static const ps_tensor_spec_t FL_TS[FL_NT] = {{"conv.weight", 2500, 0}, {"conv.bias", 60, 0},
                                              {"fc.weight", 1536, 0}};
#define FL_N 4096
#define FL_PBYTES 4096 /* 1024 floats per partition: 4 partitions */
static const char *FL_OPTIM = "{\"lr\":0.25,\"momentum\":0,\"weight_decay\":0,\"sched\":\"const\","
                              "\"warmup_steps\":0,\"ref_batch\":0}";

typedef struct fl_cfg {
    const char *host;       /* server address, e.g. 127.0.0.1 */
    const char *src;        /* source address to connect from (NULL: any) */
    int nservers;
    int ports[FL_MAXS];
    int rank, nworkers;
    uint64_t steps;
    int same_grad;
    int hb_ms, retry_ms, deadline_s;
    int pace_ms;            /* at least this long between a reply and the next push */
} fl_cfg_t;

static double fl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float fl_w0(size_t i) { return 0.5f * (float)(i % 23) - 3.0f; }

static float fl_grad(int same, int rank, uint64_t it, size_t i)
{
    return (float)((same ? 1 : rank + 1) + (int)(it % 7) + (int)(i % 5));
}

/* Expected weights after `steps` sync steps, every rank of W pushing each
 * step (with same_grad: any non-empty set of ranks). */
static void fl_expected(float *w, int W, uint64_t steps, int same)
{
    for (size_t i = 0; i < FL_N; i++) {
        double x = fl_w0(i);
        for (uint64_t it = 0; it < steps; it++) {
            double sum = 0;
            for (int r = 0; r < W; r++) sum += fl_grad(same, r, it, i);
            x -= 0.25 * (sum / W);
        }
        w[i] = (float)x;
    }
}

static int fl_table(ps_partition_table_t *t, int nservers)
{
    return ps_partition_table_build(t, FL_TS, FL_NT, FL_PBYTES, (uint32_t)nservers);
}

static void *fl_dealer(void *ctx, const char *host, const char *src, int port)
{
    char ep[160];
    int linger = 0, hwm = 10000;
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    if (!d) return NULL;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(d, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(d, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (src && *src) snprintf(ep, sizeof ep, "tcp://%s:0;%s:%d", src, host, port);
    else snprintf(ep, sizeof ep, "tcp://%s:%d", host, port);
    if (zmq_connect(d, ep)) {
        fprintf(stderr, "connect %s: %s\n", ep, zmq_strerror(zmq_errno()));
        zmq_close(d);
        return NULL;
    }
    return d;
}

/* One request, one reply (request id matched, others dropped) within tmo_ms:
 * the reply's type or a negative PS_E*; weights (fp32) into out. */
static int fl_call(void *d, Ps__Header *h, const void *pl, size_t len, float *out, size_t cap,
                   uint64_t *version, int tmo_ms)
{
    static uint64_t rid = 1;
    h->has_request_id = 1, h->request_id = (1ull << 62) | rid++;
    if (ps_wire_send(d, NULL, 0, h, pl, len, NULL, NULL, 0)) return PS_EZMQ;
    double end = fl_now() + tmo_ms / 1000.0;
    for (;;) {
        zmq_pollitem_t pi = {d, 0, ZMQ_POLLIN, 0};
        int left = (int)((end - fl_now()) * 1000);
        if (left <= 0 || zmq_poll(&pi, 1, left) <= 0) return PS_ETIMEOUT;
        ps_wire_msg_t m;
        char err[256];
        int rc = ps_wire_recv(d, &m, 0, 0, err, sizeof err);
        if (rc == 0 && m.hdr->request_id == h->request_id) {
            rc = m.hdr->type == PS__MSG_TYPE__MSG_ERROR ? m.hdr->error_code : (int)m.hdr->type;
            if (m.hdr->type == PS__MSG_TYPE__MSG_ERROR)
                fprintf(stderr, "error reply: %s\n", m.hdr->error_text ? m.hdr->error_text : "?");
            if (version) *version = m.hdr->iteration;
            if (out && m.has_payload && m.hdr->numel <= cap &&
                ps_codec_decode(out, m.hdr->numel, zmq_msg_data(&m.payload), zmq_msg_size(&m.payload),
                                (ps_dtype_t)m.hdr->dtype, (ps_codec_t)m.hdr->codec, 0, NULL))
                rc = PS_ECORRUPT;
            ps_wire_msg_close(&m);
            return rc;
        }
        ps_wire_msg_close(&m);
    }
}

/* INIT every server (spec + its partitions' initial weights); 0 or -1. */
static int fl_init(const fl_cfg_t *c)
{
    ps_partition_table_t t;
    if (fl_table(&t, c->nservers)) return -1;
    char spec[2048];
    size_t o = (size_t)snprintf(spec, sizeof spec, "{\"tensors\":[");
    for (int i = 0; i < FL_NT; i++)
        o += (size_t)snprintf(spec + o, sizeof spec - o, "%s[\"%s\",%zu,%d]", i ? "," : "",
                              FL_TS[i].name, FL_TS[i].numel, FL_TS[i].group);
    snprintf(spec + o, sizeof spec - o,
             "],\"partition_bytes\":%d,\"num_servers\":%d,\"num_workers\":%d,\"optim\":%s}",
             FL_PBYTES, c->nservers, c->nworkers, FL_OPTIM);
    void *ctx = zmq_ctx_new();
    int bad = 0;
    for (int s = 0; s < c->nservers && !bad; s++) {
        void *d = fl_dealer(ctx, c->host, c->src, c->ports[s]);
        Ps__Header h;
        ps_wire_header_init(&h, PS__MSG_TYPE__MSG_INIT);
        h.has_rank = 1, h.rank = 0;
        h.has_partition = 1, h.partition = 0xFFFFFFFFu;
        h.has_table_hash = 1, h.table_hash = t.hash;
        h.has_body = 1, h.body.data = (uint8_t *)spec, h.body.len = strlen(spec);
        int rc = d ? fl_call(d, &h, NULL, 0, NULL, 0, NULL, 10000) : PS_EZMQ;
        if (rc != PS__MSG_TYPE__MSG_ACK) fprintf(stderr, "INIT spec on server %d: %d\n", s, rc), bad = 1;
        for (uint32_t p = 0; p < t.nparts && !bad; p++) {
            if ((int)t.parts[p].server != s) continue;
            float w[FL_N];
            for (size_t i = 0; i < t.parts[p].numel; i++) w[i] = fl_w0(t.parts[p].offset + i);
            ps_wire_header_init(&h, PS__MSG_TYPE__MSG_INIT);
            h.has_rank = 1, h.rank = 0;
            h.has_partition = 1, h.partition = p;
            h.has_numel = 1, h.numel = t.parts[p].numel;
            rc = fl_call(d, &h, w, t.parts[p].numel * 4, NULL, 0, NULL, 10000);
            if (rc != PS__MSG_TYPE__MSG_ACK) fprintf(stderr, "INIT part %u: %d\n", p, rc), bad = 1;
        }
        if (d) zmq_close(d);
    }
    zmq_ctx_term(ctx);
    ps_partition_table_free(&t);
    return bad ? -1 : 0;
}

/* PULL everything: versions into ver[part] (may be NULL), weights into w. */
static int fl_pull_all(const fl_cfg_t *c, float *w, uint64_t *ver, uint32_t *nparts)
{
    ps_partition_table_t t;
    if (fl_table(&t, c->nservers)) return -1;
    void *ctx = zmq_ctx_new();
    int bad = 0;
    for (uint32_t p = 0; p < t.nparts && !bad; p++) {
        void *d = fl_dealer(ctx, c->host, c->src, c->ports[t.parts[p].server]);
        Ps__Header h;
        ps_wire_header_init(&h, PS__MSG_TYPE__MSG_PULL);
        h.has_rank = 1, h.rank = -1;
        h.has_partition = 1, h.partition = p;
        h.has_min_version = 1, h.min_version = 0;
        uint64_t v = 0;
        int rc = d ? fl_call(d, &h, NULL, 0, w + t.parts[p].offset, t.parts[p].numel, &v, 10000)
                   : PS_EZMQ;
        if (rc != PS__MSG_TYPE__MSG_WEIGHTS) fprintf(stderr, "PULL part %u: %d\n", p, rc), bad = 1;
        if (ver) ver[p] = v;
        if (d) zmq_close(d);
    }
    if (nparts) *nparts = t.nparts;
    zmq_ctx_term(ctx);
    ps_partition_table_free(&t);
    return bad ? -1 : 0;
}

typedef struct fl_result {
    uint64_t jumps;   /* replies that skipped iterations (caught up) */
    uint64_t resends; /* pushes resent after retry_ms */
    uint64_t steps;   /* pushes answered */
} fl_result_t;

static void fl_send_push(void *d, const fl_cfg_t *c, const ps_partition_t *pt, uint64_t it,
                         uint64_t rid, float *g)
{
    for (size_t i = 0; i < pt->numel; i++) g[i] = fl_grad(c->same_grad, c->rank, it, pt->offset + i);
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_PUSHPULL);
    h.has_rank = 1, h.rank = c->rank;
    h.has_partition = 1, h.partition = pt->id;
    h.has_iteration = 1, h.iteration = it;
    h.has_numel = 1, h.numel = pt->numel;
    h.has_request_id = 1, h.request_id = rid;
    if (ps_wire_send(d, NULL, 0, &h, g, pt->numel * 4, NULL, NULL, 0))
        fprintf(stderr, "rank %d: send failed: %s\n", c->rank, zmq_strerror(zmq_errno()));
}

static void fl_heartbeat(void *const *d, const fl_cfg_t *c)
{
    for (int s = 0; s < c->nservers; s++) {
        Ps__Header h;
        ps_wire_header_init(&h, PS__MSG_TYPE__MSG_HEARTBEAT);
        h.has_rank = 1, h.rank = c->rank;
        h.has_flags = 1, h.flags = PS_FLAG_NO_REPLY;
        ps_wire_send(d[s], NULL, 0, &h, NULL, 0, NULL, NULL, ZMQ_DONTWAIT);
    }
}

/* Run the worker until every partition reached c->steps: 0, or -1 (deadline,
 * fatal error reply).  Uses its own ZMQ context (call it after fork). */
static int fl_work(const fl_cfg_t *c, fl_result_t *res)
{
    ps_partition_table_t t;
    memset(res, 0, sizeof *res);
    if (fl_table(&t, c->nservers) || t.nparts > FL_MAXP) return -1;
    void *ctx = zmq_ctx_new();
    void *d[FL_MAXS];
    for (int s = 0; s < c->nservers; s++) d[s] = fl_dealer(ctx, c->host, c->src, c->ports[s]);
    uint64_t it[FL_MAXP], rid[FL_MAXP];
    double sent[FL_MAXP], due[FL_MAXP];
    int inflight[FL_MAXP];
    float g[FL_N];
    uint64_t seq = 0;
    for (uint32_t p = 0; p < t.nparts; p++) it[p] = 0, due[p] = 0, inflight[p] = 0;
    double end = fl_now() + c->deadline_s, last_hb = 0;
    int rc = -1;
    for (;;) {
        uint32_t left = 0;
        for (uint32_t p = 0; p < t.nparts; p++) left += it[p] < c->steps;
        if (!left) {
            rc = 0;
            break;
        }
        double now = fl_now();
        if (now > end) {
            fprintf(stderr, "rank %d: deadline (%d s) passed with %u partitions unfinished\n", c->rank,
                    c->deadline_s, left);
            break;
        }
        if (now - last_hb >= c->hb_ms / 1000.0) fl_heartbeat(d, c), last_hb = now;
        int tmo = c->hb_ms;
        for (uint32_t p = 0; p < t.nparts; p++) {
            if (it[p] >= c->steps) continue;
            if (!inflight[p] && now >= due[p]) {
                rid[p] = ((uint64_t)c->rank << 40) | ++seq;
                fl_send_push(d[t.parts[p].server], c, &t.parts[p], it[p], rid[p], g);
                sent[p] = now, inflight[p] = 1;
            } else if (inflight[p] && now - sent[p] > c->retry_ms / 1000.0) {
                fl_send_push(d[t.parts[p].server], c, &t.parts[p], it[p], rid[p], g);
                sent[p] = now;
                res->resends++;
            } else if (!inflight[p]) {
                tmo = 1;
            }
        }
        zmq_pollitem_t pi[FL_MAXS];
        for (int s = 0; s < c->nservers; s++) pi[s] = (zmq_pollitem_t){d[s], 0, ZMQ_POLLIN, 0};
        if (zmq_poll(pi, c->nservers, tmo) <= 0) continue;
        for (int s = 0; s < c->nservers; s++) {
            if (!(pi[s].revents & ZMQ_POLLIN)) continue;
            for (;;) {
                ps_wire_msg_t m;
                char err[256];
                int r = ps_wire_recv(d[s], &m, 0, ZMQ_DONTWAIT, err, sizeof err);
                if (r == PS_EAGAIN) {
                    ps_wire_msg_close(&m);
                    break;
                }
                uint32_t p = r == 0 ? m.hdr->partition : UINT32_MAX;
                if (r == 0 && p < t.nparts && m.hdr->request_id == rid[p]) {
                    if (m.hdr->type == PS__MSG_TYPE__MSG_WEIGHTS && m.hdr->iteration > it[p]) {
                        if (m.hdr->iteration > it[p] + 1) res->jumps++;
                        it[p] = m.hdr->iteration;
                        res->steps++;
                        inflight[p] = 0;
                        due[p] = fl_now() + c->pace_ms / 1000.0;
                    } else if (m.hdr->type == PS__MSG_TYPE__MSG_ERROR) {
                        /* PS_EAGAIN (in-flight cap) and the like: the resend timer retries. */
                        fprintf(stderr, "rank %d part %u it %llu: error %d: %s\n", c->rank, p,
                                (unsigned long long)it[p], m.hdr->error_code,
                                m.hdr->error_text ? m.hdr->error_text : "");
                        if (m.hdr->error_code != PS_EAGAIN && m.hdr->error_code != PS_ESTATE) end = 0;
                    }
                }
                ps_wire_msg_close(&m);
            }
        }
    }
    for (int s = 0; s < c->nservers; s++) zmq_close(d[s]);
    zmq_ctx_term(ctx);
    ps_partition_table_free(&t);
    return rc;
}

/* Final check: every partition at `steps`, weights bitwise equal to the
 * expected ones; prints why not to stderr.  0 or -1. */
static int fl_verify(const fl_cfg_t *c, uint64_t steps, int *nbad_out)
{
    static float w[FL_N], want[FL_N];
    uint64_t ver[FL_MAXP];
    uint32_t np = 0;
    if (fl_pull_all(c, w, ver, &np)) return -1;
    int bad = 0;
    for (uint32_t p = 0; p < np; p++)
        if (ver[p] != steps)
            fprintf(stderr, "partition %u at version %llu, want %llu\n", p, (unsigned long long)ver[p],
                    (unsigned long long)steps),
                bad++;
    fl_expected(want, c->nworkers, steps, c->same_grad);
    int nbad = 0;
    for (size_t i = 0; i < FL_N; i++)
        if (memcmp(&w[i], &want[i], 4)) {
            if (nbad++ < 3) fprintf(stderr, "w[%zu] = %.9g, want %.9g\n", i, w[i], want[i]);
        }
    if (nbad_out) *nbad_out = nbad;
    return bad || nbad ? -1 : 0;
}

#endif
