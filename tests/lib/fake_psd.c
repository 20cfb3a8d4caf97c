/* Scripted fake psd for tests/test_client.c (see fake_psd.h). */
#include "tests/lib/fake_psd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_codec.h"
#include "ps_error.h"
#include "ps_wire.h"

static void reply(fake_psd_t *f, ps_wire_msg_t *m, Ps__Header *h, const void *payload, size_t len)
{
    int n = atomic_load(&f->dup_replies) ? 2 : 1;
    for (int i = 0; i < n; i++)
        ps_wire_send(f->sock, zmq_msg_data(&m->identity), zmq_msg_size(&m->identity), h, payload,
                     len, NULL, NULL, 0);
}

static void ack(fake_psd_t *f, ps_wire_msg_t *m, uint32_t flags, const char *body)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
    h.has_request_id = 1;
    h.request_id = m->hdr->request_id;
    if (flags) {
        h.has_flags = 1;
        h.flags = flags;
    }
    if (body) {
        h.has_body = 1;
        h.body.data = (uint8_t *)body;
        h.body.len = strlen(body);
    }
    reply(f, m, &h, NULL, 0);
}

static void error_reply(fake_psd_t *f, ps_wire_msg_t *m, int code, const char *text)
{
    int n = atomic_load(&f->dup_replies) ? 2 : 1;
    for (int i = 0; i < n; i++)
        ps_wire_send_error(f->sock, zmq_msg_data(&m->identity), zmq_msg_size(&m->identity),
                           m->hdr->request_id, m->hdr->partition, code, "%s", text);
}

/* WEIGHTS of partition p to the request rq from identity id. */
static void weights_to(fake_psd_t *f, const void *id, size_t idlen, const Ps__Header *rq,
                       uint32_t p)
{
    size_t numel = f->t->parts[p].numel;
    ps_dtype_t dt = (ps_dtype_t)rq->dtype;
    ps_codec_t codec = (ps_codec_t)rq->codec;
    if (atomic_load(&f->honor_reply_codec) && rq->has_reply_codec) codec = (ps_codec_t)rq->reply_codec;
    if (atomic_load(&f->force_codec) >= 0) codec = (ps_codec_t)atomic_load(&f->force_codec);
    size_t cap = ps_codec_bound(dt, codec, numel), len = 0;
    size_t sc = ps_codec_scratch_size(dt, codec, numel);
    void *buf = malloc(cap ? cap : 1), *scratch = sc ? malloc(sc) : NULL;
    if (ps_codec_encode(buf, cap, &len, f->w[p], numel, dt, codec, scratch) < 0) {
        ps_wire_send_error(f->sock, id, idlen, rq->request_id, p, PS_EINVAL, "fake: cannot encode");
    } else {
        Ps__Header h;
        ps_wire_header_init(&h, PS__MSG_TYPE__MSG_WEIGHTS);
        h.has_request_id = 1;
        h.request_id = rq->request_id;
        h.has_partition = 1;
        h.partition = p;
        h.has_iteration = 1;
        h.iteration = f->version[p];
        h.has_numel = 1;
        h.numel = numel;
        if ((int)p == atomic_load(&f->bad_weights)) h.numel = numel + 1;
        h.has_dtype = 1;
        h.dtype = rq->dtype;
        h.has_codec = 1;
        h.codec = (Ps__Codec)codec;
        int n = atomic_load(&f->dup_replies) ? 2 : 1;
        for (int i = 0; i < n; i++) ps_wire_send(f->sock, id, idlen, &h, buf, len, NULL, NULL, 0);
    }
    free(buf);
    free(scratch);
}

static void weights(fake_psd_t *f, ps_wire_msg_t *m, uint32_t p)
{
    weights_to(f, zmq_msg_data(&m->identity), zmq_msg_size(&m->identity), m->hdr, p);
}

/* A reply a sync fake holds back until every worker pushed. */
typedef struct fake_waiter {
    struct fake_waiter *next;
    uint32_t part;
    Ps__Header hdr;      /* the request's scalar fields (no body) */
    size_t idlen;
    unsigned char id[256];
} fake_waiter_t;

static void sync_push(fake_psd_t *f, ps_wire_msg_t *m, uint32_t p)
{
    const Ps__Header *h = m->hdr;
    size_t numel = f->t->parts[p].numel;
    int rank = h->has_rank ? h->rank : -1;
    if (rank < 0 || rank >= f->sync_workers || rank >= 32 || zmq_msg_size(&m->identity) > 256) {
        error_reply(f, m, PS_EINVAL, "fake sync: bad rank");
        return;
    }
    if (h->iteration > f->version[p]) {
        error_reply(f, m, PS_ESTATE, "fake sync: push from the future");
        return;
    }
    if (h->iteration == f->version[p] && !(f->pushed[p] & (1u << rank))) {
        float *g = malloc(numel * sizeof *g);
        int rc = ps_codec_decode(g, numel, m->has_payload ? zmq_msg_data(&m->payload) : "",
                                 m->has_payload ? zmq_msg_size(&m->payload) : 0,
                                 (ps_dtype_t)h->dtype, (ps_codec_t)h->codec, 0, NULL);
        if (rc < 0) {
            free(g);
            error_reply(f, m, rc, "fake sync: gradient does not decode");
            return;
        }
        for (size_t i = 0; i < numel; i++) f->acc[p][i] += g[i];
        free(g);
        f->pushed[p] |= 1u << rank;
    }
    if (h->iteration < f->version[p]) { /* a retry of an applied step */
        if (h->type == PS__MSG_TYPE__MSG_PUSH) ack(f, m, 0, NULL);
        else weights(f, m, p);
        return;
    }
    fake_waiter_t *w = calloc(1, sizeof *w);
    w->part = p;
    w->hdr = *h;
    w->hdr.has_body = 0;
    w->idlen = zmq_msg_size(&m->identity);
    memcpy(w->id, zmq_msg_data(&m->identity), w->idlen);
    w->next = f->waiters;
    f->waiters = w;
    if (f->pushed[p] != (1u << f->sync_workers) - 1) return;
    for (size_t i = 0; i < numel; i++) {
        f->w[p][i] -= f->acc[p][i];
        f->acc[p][i] = 0;
    }
    f->version[p]++;
    f->pushed[p] = 0;
    pthread_mutex_lock(&f->mu);
    f->napplied++;
    pthread_mutex_unlock(&f->mu);
    for (fake_waiter_t **pp = &f->waiters; *pp;) {
        fake_waiter_t *x = *pp;
        if (x->part != p) {
            pp = &x->next;
            continue;
        }
        *pp = x->next;
        if (x->hdr.type == PS__MSG_TYPE__MSG_PUSHPULL) {
            weights_to(f, x->id, x->idlen, &x->hdr, p);
        } else {
            Ps__Header a;
            ps_wire_header_init(&a, PS__MSG_TYPE__MSG_ACK);
            a.has_request_id = 1;
            a.request_id = x->hdr.request_id;
            ps_wire_send(f->sock, x->id, x->idlen, &a, NULL, 0, NULL, NULL, 0);
        }
        free(x);
    }
}

/* PUSH / PUSHPULL: decode the gradient and apply w -= g once per iteration;
 * returns 0 or a PS_E* (then an ERROR was sent). */
static int apply_push(fake_psd_t *f, ps_wire_msg_t *m, uint32_t p)
{
    const Ps__Header *h = m->hdr;
    size_t numel = f->t->parts[p].numel;
    if (h->iteration < f->version[p]) return 0; /* a retry of an applied push */
    if (h->iteration > f->version[p]) {
        error_reply(f, m, PS_ESTATE, "fake: push from the future");
        return PS_ESTATE;
    }
    float *g = malloc(numel * sizeof *g);
    size_t sc = ps_codec_scratch_size((ps_dtype_t)h->dtype, (ps_codec_t)h->codec, numel);
    void *scratch = sc ? malloc(sc) : NULL;
    int rc = ps_codec_decode(g, numel, m->has_payload ? zmq_msg_data(&m->payload) : "",
                             m->has_payload ? zmq_msg_size(&m->payload) : 0,
                             (ps_dtype_t)h->dtype, (ps_codec_t)h->codec, 0, scratch);
    if (rc == 0) {
        int ovf = h->has_flags && (h->flags & PS_FLAG_OVERFLOW);
        if (!ovf)
            for (size_t i = 0; i < numel; i++) f->w[p][i] -= g[i];
        f->version[p]++;
        pthread_mutex_lock(&f->mu);
        f->noverflow += ovf;
        if ((unsigned)h->codec < 4) f->push_codec[h->codec]++;
        f->napplied++;
        pthread_mutex_unlock(&f->mu);
    } else {
        error_reply(f, m, rc, "fake: gradient does not decode");
    }
    free(g);
    free(scratch);
    return rc;
}

/* Replies a broken or hostile server could send: each must be dropped (or
 * fail only the request it names) without crashing the client. */
static void send_garbage(fake_psd_t *f, ps_wire_msg_t *m)
{
    const void *id = zmq_msg_data(&m->identity);
    size_t idlen = zmq_msg_size(&m->identity);
    static const char junk[] = "\x08\xff\xff\xff\xff\x0f garbage";
    Ps__Header h;

    /* not a protobuf header */
    zmq_send(f->sock, id, idlen, ZMQ_SNDMORE);
    zmq_send(f->sock, junk, sizeof junk, 0);
    /* empty header frame */
    zmq_send(f->sock, id, idlen, ZMQ_SNDMORE);
    zmq_send(f->sock, "", 0, 0);
    /* three frames */
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
    uint8_t hb[64];
    size_t hl = ps__header__pack(&h, hb);
    zmq_send(f->sock, id, idlen, ZMQ_SNDMORE);
    zmq_send(f->sock, hb, hl, ZMQ_SNDMORE);
    zmq_send(f->sock, "a", 1, ZMQ_SNDMORE);
    zmq_send(f->sock, "b", 1, 0);
    /* the right request id, but payload_len disagrees with the frame */
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_WEIGHTS);
    h.has_request_id = 1;
    h.request_id = m->hdr->request_id;
    h.has_payload_len = 1;
    h.payload_len = 999;
    hl = ps__header__pack(&h, hb);
    zmq_send(f->sock, id, idlen, ZMQ_SNDMORE);
    zmq_send(f->sock, hb, hl, ZMQ_SNDMORE);
    zmq_send(f->sock, "12345678", 8, 0);
    /* the right id, a checksum that does not match */
    h.payload_len = 8;
    h.has_checksum = 1;
    h.checksum = 0xdeadbeef;
    hl = ps__header__pack(&h, hb);
    zmq_send(f->sock, id, idlen, ZMQ_SNDMORE);
    zmq_send(f->sock, hb, hl, ZMQ_SNDMORE);
    zmq_send(f->sock, "12345678", 8, 0);
    /* wrong protocol version */
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
    h.version = 99;
    h.has_request_id = 1;
    h.request_id = m->hdr->request_id;
    hl = ps__header__pack(&h, hb);
    zmq_send(f->sock, id, idlen, ZMQ_SNDMORE);
    zmq_send(f->sock, hb, hl, 0);
    /* ids that name no live request */
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
    h.has_request_id = 1;
    h.request_id = 0xFFFFFFFFFFFFFFFFull;
    ps_wire_send(f->sock, id, idlen, &h, NULL, 0, NULL, NULL, 0);
    h.request_id = m->hdr->request_id + (1ull << 32); /* right slot, other generation */
    ps_wire_send(f->sock, id, idlen, &h, NULL, 0, NULL, NULL, 0);
    /* an ERROR that names no request */
    ps_wire_send_error(f->sock, id, idlen, 0, 0, PS_EPROTO, "fake: unsolicited error");
    /* raw fp32 WEIGHTS that fit the request in every field but the
     * checksum: the client checks it while copying them into place */
    uint32_t part = m->hdr->partition;
    size_t n = f->t->parts[part].numel;
    float *junkw = malloc(n * sizeof(float));
    if (junkw) {
        for (size_t i = 0; i < n; i++) junkw[i] = 12345.0f;
        ps_wire_header_init(&h, PS__MSG_TYPE__MSG_WEIGHTS);
        h.has_request_id = 1, h.request_id = m->hdr->request_id;
        h.has_partition = 1, h.partition = part;
        h.has_numel = 1, h.numel = n;
        h.has_dtype = 1, h.dtype = PS__DTYPE__DT_FP32;
        h.has_codec = 1, h.codec = PS__CODEC__CODEC_RAW;
        h.has_iteration = 1, h.iteration = 0;
        uint32_t bad = ps_crc32c(0, junkw, n * sizeof(float)) ^ 1u;
        ps_wire_send_crc(f->sock, id, idlen, &h, junkw, n * sizeof(float), bad, NULL, NULL, 0);
        free(junkw);
    }
}

static void handle(fake_psd_t *f, ps_wire_msg_t *m)
{
    Ps__Header *h = m->hdr;
    uint32_t p = h->has_partition ? h->partition : 0xFFFFFFFFu;
    int data = h->type == PS__MSG_TYPE__MSG_PUSH || h->type == PS__MSG_TYPE__MSG_PULL ||
               h->type == PS__MSG_TYPE__MSG_PUSHPULL;

    if (data) {
        pthread_mutex_lock(&f->mu);
        if (f->norder < FAKE_MAX_LOG) f->order[f->norder++] = p;
        pthread_mutex_unlock(&f->mu);
        if (p >= f->t->nparts || f->t->parts[p].server != (uint32_t)f->server_id) {
            error_reply(f, m, PS_ERANGE, "fake: partition not on this server");
            return;
        }
        if (h->numel != f->t->parts[p].numel) {
            error_reply(f, m, PS_EMISMATCH, "fake: numel mismatch");
            return;
        }
        if (atomic_load(&f->drop_requests) > 0) {
            atomic_fetch_sub(&f->drop_requests, 1);
            return;
        }
        if ((int)p == atomic_load(&f->silent_part)) return;
        if ((int)p == atomic_load(&f->err_part)) {
            error_reply(f, m, PS_ESTALE, "fake stale push for this partition");
            return;
        }
        int d = atomic_load(&f->delay_ms);
        if (d > 0) usleep((useconds_t)d * 1000);
        if (atomic_load(&f->garbage)) send_garbage(f, m);
    }

    switch (h->type) {
    case PS__MSG_TYPE__MSG_HELLO: {
        pthread_mutex_lock(&f->mu);
        f->nhello++;
        pthread_mutex_unlock(&f->mu);
        if (h->table_hash != f->table_hash) {
            error_reply(f, m, PS_EMISMATCH, "fake: partition table hash differs");
            return;
        }
        Ps__Header r;
        ps_wire_header_init(&r, PS__MSG_TYPE__MSG_WELCOME);
        r.has_request_id = 1;
        r.request_id = h->request_id;
        r.has_rank = 1;
        r.rank = h->rank >= 0 ? h->rank : f->next_rank++;
        r.has_table_hash = 1;
        r.table_hash = f->table_hash;
        r.has_num_servers = 1;
        r.num_servers = f->t->nservers;
        r.has_num_workers = 1;
        r.num_workers = h->num_workers;
        reply(f, m, &r, NULL, 0);
        return;
    }
    case PS__MSG_TYPE__MSG_INIT:
        if (p == 0xFFFFFFFFu) {
            pthread_mutex_lock(&f->mu);
            f->nspec++;
            pthread_mutex_unlock(&f->mu);
            ack(f, m, f->from_ckpt ? PS_FLAG_FROM_CKPT : 0, NULL);
            return;
        }
        if (p >= f->t->nparts || h->numel != f->t->parts[p].numel ||
            !m->has_payload || h->dtype != PS__DTYPE__DT_FP32 ||
            ps_codec_decode(f->w[p], h->numel, zmq_msg_data(&m->payload),
                            zmq_msg_size(&m->payload), PS_DT_FP32, PS_CODEC_RAW, 0, NULL) < 0) {
            error_reply(f, m, PS_EINVAL, "fake: bad INIT");
            return;
        }
        pthread_mutex_lock(&f->mu);
        f->ninit_w++;
        pthread_mutex_unlock(&f->mu);
        ack(f, m, 0, NULL);
        return;
    case PS__MSG_TYPE__MSG_PUSH:
    case PS__MSG_TYPE__MSG_PUSHPULL:
        if (f->sync_workers > 1) {
            sync_push(f, m, p);
            return;
        }
        if (apply_push(f, m, p) < 0) return;
        if (h->has_flags && (h->flags & PS_FLAG_NO_REPLY)) return;
        if (atomic_load(&f->drop_replies) > 0) {
            atomic_fetch_sub(&f->drop_replies, 1);
            return;
        }
        if (h->type == PS__MSG_TYPE__MSG_PUSH) ack(f, m, 0, NULL);
        else weights(f, m, p);
        return;
    case PS__MSG_TYPE__MSG_PULL:
        pthread_mutex_lock(&f->mu);
        f->npull++;
        pthread_mutex_unlock(&f->mu);
        if (f->version[p] < h->min_version) {
            error_reply(f, m, PS_ESTATE, "fake: version not reached");
            return;
        }
        if (atomic_load(&f->drop_replies) > 0) {
            atomic_fetch_sub(&f->drop_replies, 1);
            return;
        }
        weights(f, m, p);
        return;
    case PS__MSG_TYPE__MSG_BARRIER:
        pthread_mutex_lock(&f->mu);
        f->nbarrier++;
        pthread_mutex_unlock(&f->mu);
        ack(f, m, 0, NULL);
        return;
    case PS__MSG_TYPE__MSG_STATS: {
        char body[64];
        snprintf(body, sizeof body, "{\"fake\":true,\"server\":%d}", f->server_id);
        pthread_mutex_lock(&f->mu);
        f->nstats++;
        pthread_mutex_unlock(&f->mu);
        ack(f, m, 0, body);
        return;
    }
    case PS__MSG_TYPE__MSG_CHECKPOINT:
    case PS__MSG_TYPE__MSG_SHUTDOWN:
        pthread_mutex_lock(&f->mu);
        if (h->type == PS__MSG_TYPE__MSG_CHECKPOINT) f->nckpt++;
        else f->nshutdown++;
        pthread_mutex_unlock(&f->mu);
        ack(f, m, 0, NULL);
        return;
    case PS__MSG_TYPE__MSG_HEARTBEAT:
    case PS__MSG_TYPE__MSG_BYE:
        pthread_mutex_lock(&f->mu);
        if (h->type == PS__MSG_TYPE__MSG_BYE) f->nbye++;
        else f->nheartbeat++;
        pthread_mutex_unlock(&f->mu);
        if (!(h->has_flags && (h->flags & PS_FLAG_NO_REPLY))) ack(f, m, 0, NULL);
        return;
    default:
        error_reply(f, m, PS_EPROTO, "fake: unexpected message type");
    }
}

static void *run(void *arg)
{
    fake_psd_t *f = arg;
    char err[256];
    while (!atomic_load(&f->stop)) {
        if (atomic_load(&f->stall)) {
            usleep(5000);
            continue;
        }
        zmq_pollitem_t it = {f->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) <= 0 || atomic_load(&f->stall)) continue;
        ps_wire_msg_t m;
        int rc = ps_wire_recv(f->sock, &m, 1, ZMQ_DONTWAIT, err, sizeof err);
        if (rc == 0) {
            handle(f, &m);
        } else if (rc != PS_EAGAIN) {
            pthread_mutex_lock(&f->mu);
            f->nbad++;
            pthread_mutex_unlock(&f->mu);
        }
        ps_wire_msg_close(&m);
    }
    return NULL;
}

static int start_impl(fake_psd_t *f, int server_id, const ps_partition_table_t *t, int port,
                      const char *curve_secret, int sync_workers);

int fake_psd_start(fake_psd_t *f, int server_id, const ps_partition_table_t *t, int port)
{
    return fake_psd_start_ex(f, server_id, t, port, NULL);
}

int fake_psd_start_ex(fake_psd_t *f, int server_id, const ps_partition_table_t *t, int port,
                      const char *curve_secret)
{
    return start_impl(f, server_id, t, port, curve_secret, 1);
}

int fake_psd_start_sync(fake_psd_t *f, int server_id, const ps_partition_table_t *t, int port,
                        int nworkers)
{
    return start_impl(f, server_id, t, port, NULL, nworkers);
}

static int start_impl(fake_psd_t *f, int server_id, const ps_partition_table_t *t, int port,
                      const char *curve_secret, int sync_workers)
{
    memset(f, 0, sizeof *f);
    f->sync_workers = sync_workers;
    f->server_id = server_id;
    f->t = t;
    f->table_hash = t->hash;
    atomic_init(&f->err_part, -1);
    atomic_init(&f->silent_part, -1);
    atomic_init(&f->bad_weights, -1);
    atomic_init(&f->force_codec, -1);
    pthread_mutex_init(&f->mu, NULL);
    f->w = calloc(t->nparts, sizeof *f->w);
    f->version = calloc(t->nparts, sizeof *f->version);
    f->acc = calloc(t->nparts, sizeof *f->acc);
    f->pushed = calloc(t->nparts, sizeof *f->pushed);
    for (uint32_t p = 0; p < t->nparts; p++) {
        f->w[p] = calloc(t->parts[p].numel, sizeof(float));
        f->acc[p] = calloc(t->parts[p].numel, sizeof(float));
    }

    f->ctx = zmq_ctx_new();
    f->sock = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0, mandatory = 1, hwm = 2;
    zmq_setsockopt(f->sock, ZMQ_LINGER, &linger, sizeof linger);
    /* a stalled fake then pushes back on the client within a few messages */
    zmq_setsockopt(f->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(f->sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
    if (curve_secret) {
        int one = 1;
        if (zmq_setsockopt(f->sock, ZMQ_CURVE_SERVER, &one, sizeof one) < 0 ||
            zmq_setsockopt(f->sock, ZMQ_CURVE_SECRETKEY, curve_secret, 40) < 0) {
            fprintf(stderr, "fake_psd: CURVE: %s\n", zmq_strerror(errno));
            return -1;
        }
    }
    char addr[64];
    if (port) snprintf(addr, sizeof addr, "tcp://127.0.0.1:%d", port);
    else snprintf(addr, sizeof addr, "tcp://127.0.0.1:*");
    if (zmq_bind(f->sock, addr) < 0) {
        fprintf(stderr, "fake_psd: bind %s: %s\n", addr, zmq_strerror(errno));
        return -1;
    }
    size_t len = sizeof f->endpoint;
    zmq_getsockopt(f->sock, ZMQ_LAST_ENDPOINT, f->endpoint, &len);
    /* Sockets may move to another thread after a full barrier (pthread_create). */
    return pthread_create(&f->th, NULL, run, f) == 0 ? 0 : -1;
}

void fake_psd_stop(fake_psd_t *f)
{
    if (!f->ctx) return;
    atomic_store(&f->stop, 1);
    pthread_join(f->th, NULL);
    zmq_close(f->sock);
    zmq_ctx_term(f->ctx);
    f->ctx = NULL;
    for (uint32_t p = 0; p < f->t->nparts; p++) {
        free(f->w[p]);
        free(f->acc[p]);
    }
    free(f->w);
    free(f->acc);
    free(f->pushed);
    while (f->waiters) {
        struct fake_waiter *x = f->waiters;
        f->waiters = x->next;
        free(x);
    }
    free(f->version);
    pthread_mutex_destroy(&f->mu);
}
