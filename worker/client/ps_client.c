/* psd client, caller side: options, the request pool, encoding, submit and
 * wait, and the blocking conveniences (HELLO, INIT, BARRIER, STATS, ...).
 * The I/O thread is in ps_client_io.c (its replies in ps_client_recv.c, its
 * timers in ps_client_timers.c); shared state in ps_client_int.h. */
#include "ps_client.h"

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "ps_client_int.h"
#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"

void ps_client_opts_default(ps_client_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->rank = -1;
    o->num_workers = 1;
    o->dtype = PS_DT_FP32;
    o->codec = PS_CODEC_RAW;
    /* A sync PUSHPULL waits for the slowest worker's backward pass, so the
     * first retry comes late and backs off: a resend costs a whole
     * gradient's bandwidth.  Lost messages are rare (a restarted server). */
    o->timeout_ms = 300000;
    o->retry_ms = 5000;
    o->heartbeat_ms = 1000;
    o->stall_warn_ms = 10000;
    o->max_inflight = 8;
    o->send_queue_bytes = PS_CLIENT_SEND_QUEUE_DEFAULT;
    o->pull_codec = -1;
}

void ps_client_set_error(ps_client_t *c, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&c->mu);
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&c->mu);
}

const char *ps_client_last_error(const ps_client_t *c)
{
    return c ? c->last_error : "no client";
}

int ps_client_rank(const ps_client_t *c)
{
    return c->rank;
}

void ps_client_counters(const ps_client_t *c, ps_client_counters_t *out)
{
    out->bytes_out = atomic_load(&((ps_client_t *)c)->bytes_out);
    out->bytes_in = atomic_load(&((ps_client_t *)c)->bytes_in);
    out->requests = atomic_load(&((ps_client_t *)c)->requests);
    out->retries = atomic_load(&((ps_client_t *)c)->retries);
    out->errors = atomic_load(&((ps_client_t *)c)->errors);
}

void ps_client_zc_free(void *data, void *hint)
{
    ps_req_t *r = hint;
    ps_client_t *c = r->c;
    (void)data;
    /* ZeroMQ has written (or dropped) the payload: its bytes leave the send
     * queue bound, and the I/O thread may hand the next push over. */
    atomic_fetch_sub(&c->srv[r->server].unsent, (long long)r->payload_len);
    ps_client_io_wake(c);
    /* After the decrement r may be released by a waiter: only touch c. */
    if (atomic_fetch_sub(&r->zrefs, 1) == 1) {
        pthread_mutex_lock(&c->mu);
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
}

void ps_client_complete_locked(ps_client_t *c, ps_req_t *r, int result)
{
    r->result = result;
    r->state = RQ_DONE;
    if (result < 0) atomic_fetch_add(&c->errors, 1);
    pthread_cond_broadcast(&c->cv);
}

/* Large receive buffers are allocated by ZeroMQ per message.  glibc serves
 * big allocations with fresh mmap()s whose pages fault in one by one on
 * every message (what costs ps-lite half its time); keeping them on the
 * heap instead lets the same pages be reused from message to message. */
static void tune_malloc_once(void)
{
    if (getenv("PS_NO_MALLOC_TUNE")) return;
    /* 32 MiB is the largest threshold glibc accepts on 64-bit (HEAP_MAX/2);
     * partitions are 4 MiB by default, so every message stays below it. */
    if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) || !mallopt(M_TRIM_THRESHOLD, 512 << 20))
        ps_warn("mallopt refused the mmap / trim thresholds; large messages may page-fault");
}

static void tune_malloc(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, tune_malloc_once);
}

/* ---- lifecycle -------------------------------------------------------- */

static int validate_opts(const ps_client_opts_t *o, const ps_partition_table_t *t)
{
    if (!o || !t || !o->servers || o->nservers <= 0) {
        ps_error("ps_client_new: no servers given");
        return PS_EINVAL;
    }
    if ((uint32_t)o->nservers != t->nservers) {
        ps_error("ps_client_new: %d server addresses but the partition table has %u servers",
                 o->nservers, t->nservers);
        return PS_EMISMATCH;
    }
    for (int s = 0; s < o->nservers; s++)
        if (!o->servers[s] || !o->servers[s][0]) {
            ps_error("ps_client_new: server %d has no address", s);
            return PS_EINVAL;
        }
    if (ps_dtype_size(o->dtype) == 0 || (unsigned)o->codec > PS_CODEC_SIGN) {
        ps_error("ps_client_new: unsupported wire dtype %d / codec %d", (int)o->dtype, (int)o->codec);
        return PS_EINVAL;
    }
    if (o->pull_codec != -1 && o->pull_codec != PS_CODEC_RAW && o->pull_codec != PS_CODEC_LZ4) {
        ps_error("ps_client_new: pull codec %d: weights are pulled raw or lz4, never lossy",
                 o->pull_codec);
        return PS_EINVAL;
    }
    if (!(o->topk_ratio >= 0.f && o->topk_ratio <= 1.f)) {
        ps_error("ps_client_new: topk_ratio %g not in (0, 1] (0 = default %g)", (double)o->topk_ratio,
                 (double)PS_CODEC_TOPK_DEFAULT_RATIO);
        return PS_EINVAL;
    }
    if (!(o->ef_momentum >= 0.f && o->ef_momentum < 1.f)) {
        ps_error("ps_client_new: ef_momentum %g not in [0, 1)", (double)o->ef_momentum);
        return PS_EINVAL;
    }
    if (o->num_workers <= 0 || o->timeout_ms < 0 || o->retry_ms < 0 || o->heartbeat_ms < 0) {
        ps_error("ps_client_new: num_workers must be > 0, timeouts >= 0");
        return PS_EINVAL;
    }
    return 0;
}

/* Error-feedback state: residuals sized by the partition table. */
static int ef_new(ps_client_t *c)
{
    uint32_t n = c->t->nparts;
    size_t *numel = calloc(n ? n : 1, sizeof *numel);
    c->ef_valid = calloc(n ? n : 1, 1);
    c->ef_iter = calloc(n ? n : 1, sizeof *c->ef_iter);
    c->ef_len = calloc(n ? n : 1, sizeof *c->ef_len);
    c->ef_crc = calloc(n ? n : 1, sizeof *c->ef_crc);
    int rc = PS_ENOMEM;
    if (numel && c->ef_valid && c->ef_iter && c->ef_len && c->ef_crc) {
        for (uint32_t p = 0; p < n; p++) numel[p] = c->t->parts[p].numel;
        rc = ps_ef_new(&c->ef, n, numel);
        if (!rc && c->o.ef_momentum > 0.f)
            rc = ps_ef_set_momentum(c->ef, c->o.ef_momentum, c->o.ef_nesterov);
        /* top-k / sign per model tensor, not per partition (ps_ef_set_blocks);
         * a table given as bare partitions (no tensors) has one block each */
        for (uint32_t p = 0; !rc && c->t->tensor_offset && c->t->ntensors && p < n; p++) {
            ps_partition_segment_t sg[64], *seg = sg;
            uint32_t ns = ps_partition_segments(c->t, p, sg, 64);
            if (ns > 64 && (seg = malloc(ns * sizeof *seg)))
                ps_partition_segments(c->t, p, seg, ns);
            /* sign: one scale per 128 elements at most within a tensor: one
             * mean |x| over a heavy-tailed tensor is set by its few large
             * gradients and sends their size to all the small ones (8 bytes
             * of length + scale per 16 bytes of sign bits: 1.5 bits/element) */
            size_t nb = 0, bucket = c->o.codec == PS_CODEC_SIGN ? 128 : SIZE_MAX;
            for (uint32_t i = 0; seg && i < ns; i++)
                nb += seg[i].numel / bucket + (seg[i].numel % bucket != 0);
            size_t *bl = seg ? malloc((nb ? nb : 1) * sizeof *bl) : NULL;
            nb = 0;
            for (uint32_t i = 0; bl && i < ns; i++)
                for (size_t o = 0; o < seg[i].numel; o += bucket)
                    bl[nb++] = seg[i].numel - o < bucket ? seg[i].numel - o : bucket;
            rc = bl ? ps_ef_set_blocks(c->ef, p, bl, nb) : PS_ENOMEM;
            free(bl);
            if (seg != sg) free(seg);
        }
    }
    free(numel);
    if (rc < 0) ps_error("ps_client_new: error-feedback state: %s", ps_strerror(rc));
    return rc;
}

int ps_client_new(ps_client_t **cp, const ps_client_opts_t *o, const ps_partition_table_t *t)
{
    int rc = validate_opts(o, t);
    *cp = NULL;
    if (rc) return rc;

    ps_client_t *c = calloc(1, sizeof *c);
    if (!c) return PS_ENOMEM;
    c->o = *o;
    if (c->o.max_inflight <= 0) c->o.max_inflight = 8;
    if (c->o.send_queue_bytes == 0) c->o.send_queue_bytes = PS_CLIENT_SEND_QUEUE_DEFAULT;
    c->t = t;
    c->rank = o->rank;
    /* The session token binds this process to its rank on every server;
     * 0 means none, so draw again on the 2^-64 chance. */
    while (!c->session && getrandom(&c->session, sizeof c->session, 0) != sizeof c->session) {
    }
    c->efd = -1;
    c->params.topk_ratio = o->topk_ratio;
    c->pull_codec = o->pull_codec >= 0 ? (ps_codec_t)o->pull_codec
                    : o->codec == PS_CODEC_LZ4 ? PS_CODEC_LZ4 : PS_CODEC_RAW;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->ef_mu, NULL);
    pthread_mutex_init(&c->keep_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);

    /* Largest frame a server may send us: any partition's weights in any
     * dtype/codec it might choose, plus slack for the header frame. */
    size_t maxnumel = 1;
    for (uint32_t p = 0; p < t->nparts; p++)
        if (t->parts[p].numel > maxnumel) maxnumel = t->parts[p].numel;
    size_t b1 = ps_codec_bound(PS_DT_FP32, PS_CODEC_LZ4, maxnumel);
    size_t b2 = maxnumel * 4 * (o->keep_state ? 2 : 1); /* state replies: weights, momentum */
    c->maxmsg = (b1 > b2 ? b1 : b2) + PS_WIRE_MAX_HEADER + 4096;
    tune_malloc();

    /* Every partition may have a pull and a push in flight, plus control. */
    c->npool = 4 * t->nparts + 4 * (uint32_t)o->nservers * (uint32_t)c->o.max_inflight + 64;
    c->pool = calloc(c->npool, sizeof *c->pool);
    c->srv = calloc((size_t)o->nservers, sizeof *c->srv);
    c->enc = calloc(t->nparts, sizeof *c->enc);
    c->enc_cap = calloc(t->nparts, sizeof *c->enc_cap);
    c->enc_scratch = calloc(t->nparts, sizeof *c->enc_scratch);
    c->enc_scratch_cap = calloc(t->nparts, sizeof *c->enc_scratch_cap);
    c->enc_refs = calloc(t->nparts, sizeof *c->enc_refs);
    if (!c->pool || !c->srv || !c->enc || !c->enc_cap || !c->enc_scratch ||
        !c->enc_scratch_cap || !c->enc_refs) {
        rc = PS_ENOMEM;
        goto fail;
    }
    if (ps_client_uses_ef(c, o->dtype, o->codec) && (rc = ef_new(c)) < 0) goto fail;
    if ((rc = ps_client_keep_init(c)) < 0) goto fail;
    if ((rc = ps_client_curve_load(c)) < 0) goto fail;
    for (uint32_t i = c->npool; i-- > 0;) {
        ps_req_t *r = &c->pool[i];
        r->c = c;
        r->slot = i;
        r->gen = 1;
        r->enc_part = -1;
        atomic_init(&r->zrefs, 0);
        r->next = c->free_list;
        c->free_list = r;
    }
    for (int s = 0; s < o->nservers; s++) {
        c->srv[s].endpoint = strdup(o->servers[s]);
        if (!c->srv[s].endpoint) {
            rc = PS_ENOMEM;
            goto fail;
        }
    }

    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->efd < 0) {
        ps_error("eventfd: %s", strerror(errno));
        rc = PS_EIO;
        goto fail;
    }
    c->zctx = zmq_ctx_new();
    if (!c->zctx) {
        ps_error("zmq_ctx_new: %s", zmq_strerror(errno));
        rc = PS_EZMQ;
        goto fail;
    }
    for (int s = 0; s < o->nservers; s++)
        if ((rc = ps_client_io_open(c, s)) < 0) goto fail;

    /* Sockets created here migrate to the I/O thread: pthread_create is the
     * full memory barrier ZeroMQ asks for. */
    if ((rc = pthread_create(&c->io, NULL, ps_client_io_main, c)) != 0) {
        ps_error("pthread_create: %s", strerror(rc));
        rc = PS_ENOMEM;
        goto fail;
    }
    c->io_started = 1;
    *cp = c;
    return 0;

fail:
    ps_client_destroy(&c);
    return rc;
}

void ps_client_destroy(ps_client_t **cp)
{
    ps_client_t *c = cp ? *cp : NULL;
    if (!c) return;
    if (c->io_started) {
        atomic_store(&c->stop, 1);
        ps_client_io_wake(c);
        pthread_join(c->io, NULL);  /* the thread sends BYE and closes */
    } else if (c->srv) {
        ps_client_io_close_all(c, 0);
    }
    /* Terminating the context releases every frame ZeroMQ still held, so
     * no zero-copy free function runs after this point. */
    if (c->zctx) zmq_ctx_term(c->zctx);
    if (c->efd >= 0) close(c->efd);
    if (c->srv)
        for (int s = 0; s < c->o.nservers; s++) free(c->srv[s].endpoint);
    if (c->pool)
        for (uint32_t i = 0; i < c->npool; i++) {
            free(c->pool[i].tmp);
            free(c->pool[i].body);
            free(c->pool[i].reply_body);
        }
    if (c->enc)
        for (uint32_t p = 0; p < c->t->nparts; p++) {
            free(c->enc[p]);
            free(c->enc_scratch[p]);
        }
    free(c->enc);
    free(c->enc_cap);
    free(c->enc_scratch);
    free(c->enc_scratch_cap);
    free(c->enc_refs);
    ps_ef_destroy(&c->ef);
    free(c->ef_valid);
    free(c->ef_iter);
    free(c->ef_len);
    free(c->ef_crc);
    if (c->curve_server) memset(c->curve_server, 0, (size_t)c->o.nservers * sizeof *c->curve_server);
    free(c->curve_server);
    memset(c->curve_secret, 0, sizeof c->curve_secret);
    free(c->dec_scratch);
    free(c->pool);
    free(c->srv);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->ef_mu);
    ps_client_keep_free(c);
    pthread_mutex_destroy(&c->keep_mu);
    free(c);
    *cp = NULL;
}

/* ---- requests ----------------------------------------------------------- */

static ps_req_t *req_alloc(ps_client_t *c, int type, int server, uint32_t part)
{
    pthread_mutex_lock(&c->mu);
    ps_req_t *r = c->free_list;
    if (r) {
        c->free_list = r->next;
        r->state = RQ_SUBMITTED;
    }
    pthread_mutex_unlock(&c->mu);
    if (!r) {
        ps_client_set_error(c, "all %u request handles are in use (requests not waited for?)",
                            c->npool);
        ps_error("%s", c->last_error);
        return NULL;
    }
    r->next = NULL;
    r->type = type;
    r->server = server;
    r->part = part;
    r->iteration = r->min_version = 0;
    r->flags = 0;
    r->no_reply = 0;
    r->cancel = 0;
    r->payload = NULL;
    r->payload_len = 0;
    r->crc = 0;
    r->dtype = c->o.dtype;
    r->codec = c->o.codec;
    r->reply_codec = c->pull_codec;
    r->numel = 0;
    r->enc_part = -1;
    r->dst = NULL;
    r->dst_numel = 0;
    r->result = 0;
    r->version = 0;
    r->reply_flags = 0;
    r->reply_rank = -1;
    r->reply_hash = 0;
    r->reply_has_hash = 0;
    r->reply_nworkers = r->reply_nservers = 0;
    r->t_deadline = r->t_retry = 0;
    r->retry_delay = 0;
    r->nsent = 0;
    return r;
}

/* Under c->mu.  Only once ZeroMQ has let go of every frame. */
static void req_release_locked(ps_client_t *c, ps_req_t *r)
{
    if (r->enc_part >= 0) c->enc_refs[r->enc_part]--;
    r->enc_part = -1;
    free(r->tmp);
    r->tmp = NULL;
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
    free(r->reply_body);
    r->reply_body = NULL;
    r->reply_body_len = 0;
    r->state = RQ_FREE;
    if (++r->gen == 0) r->gen = 1; /* request_id 0 never names a request */
    r->next = c->free_list;
    c->free_list = r;
}

/* Give back a request that was never submitted. */
static void req_abandon(ps_client_t *c, ps_req_t *r)
{
    pthread_mutex_lock(&c->mu);
    req_release_locked(c, r);
    pthread_mutex_unlock(&c->mu);
}

static void req_submit(ps_client_t *c, ps_req_t *r)
{
    pthread_mutex_lock(&c->mu);
    r->seq = ++c->seq;
    r->state = RQ_SUBMITTED;
    r->next = NULL;
    if (c->submitq_tail) c->submitq_tail->next = r;
    else c->submitq = r;
    c->submitq_tail = r;
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(&c->requests, 1);
    ps_client_io_wake(c);
}

ps_req_t *ps_client_req_alloc(ps_client_t *c, int type, int server, uint32_t part)
{
    return req_alloc(c, type, server, part);
}

void ps_client_req_abandon(ps_client_t *c, ps_req_t *r) { req_abandon(c, r); }

void ps_client_req_submit(ps_client_t *c, ps_req_t *r) { req_submit(c, r); }

void ps_client_req_release_locked(ps_client_t *c, ps_req_t *r) { req_release_locked(c, r); }

static int check_part(ps_client_t *c, uint32_t part, const void *p1, const void *p2)
{
    if (part >= c->t->nparts) {
        ps_client_set_error(c, "partition %u out of range (table has %u)", part, c->t->nparts);
        ps_error("%s", c->last_error);
        return PS_ERANGE;
    }
    if (!p1 || !p2) {
        ps_client_set_error(c, "partition %u: NULL buffer", part);
        return PS_EINVAL;
    }
    return 0;
}

static int data_req(ps_client_t *c, int type, uint32_t part, uint64_t iteration,
                    uint64_t min_version, const float *grad, float *dst, uint32_t flags,
                    ps_req_t **out)
{
    int rc;
    if (out) *out = NULL;
    if (!c || !out) return PS_EINVAL;
    if ((rc = check_part(c, part, type == PS__MSG_TYPE__MSG_PULL ? (const void *)dst : grad,
                         type == PS__MSG_TYPE__MSG_PUSH ? (const void *)grad : dst)) < 0)
        return rc;
    ps_req_t *r = req_alloc(c, type, (int)c->t->parts[part].server, part);
    if (!r) return PS_EAGAIN;
    r->iteration = iteration;
    r->min_version = min_version;
    r->flags = flags;
    r->numel = c->t->parts[part].numel;
    if (type == PS__MSG_TYPE__MSG_PUSH && (flags & PS_FLAG_NO_REPLY)) r->no_reply = 1;
    /* the partitions this worker keeps: their weights and momentum come back */
    if (type == PS__MSG_TYPE__MSG_PUSHPULL && ps_client_keeps(c, part)) r->flags |= PS_FLAG_STATE;
    /* PS_PART_EXACT (BN statistics): raw fp32 both ways, whatever the wire
     * dtype / codec; the server answers in the request's dtype and
     * reply_codec, and decodes each push by its own header. */
    int exact = (c->t->parts[part].flags & PS_PART_EXACT) != 0;
    if (exact) r->dtype = PS_DT_FP32, r->reply_codec = PS_CODEC_RAW;
    if (type == PS__MSG_TYPE__MSG_PULL) {
        r->codec = r->reply_codec; /* no payload: the header asks for the reply's codec */
    } else if ((rc = ps_client_encode_part(c, r, part, grad, exact ? PS_DT_FP32 : c->o.dtype,
                                           exact ? PS_CODEC_RAW : c->o.codec)) < 0) {
        req_abandon(c, r);
        return rc;
    }
    if (type != PS__MSG_TYPE__MSG_PUSH) {
        r->dst = dst;
        r->dst_numel = c->t->parts[part].numel;
    }
    req_submit(c, r);
    *out = r;
    return 0;
}

int ps_client_push(ps_client_t *c, uint32_t part, uint64_t iteration, const float *grad,
                   uint32_t flags, ps_req_t **req)
{
    return data_req(c, PS__MSG_TYPE__MSG_PUSH, part, iteration, 0, grad, NULL, flags, req);
}

int ps_client_pull(ps_client_t *c, uint32_t part, uint64_t min_version, float *dst, ps_req_t **req)
{
    return data_req(c, PS__MSG_TYPE__MSG_PULL, part, 0, min_version, NULL, dst, 0, req);
}

int ps_client_pull_ex(ps_client_t *c, uint32_t part, uint64_t min_version, uint32_t flags,
                      float *dst, ps_req_t **req)
{
    return data_req(c, PS__MSG_TYPE__MSG_PULL, part, 0, min_version, NULL, dst, flags, req);
}

int ps_client_pull_exact(ps_client_t *c, uint32_t part, uint64_t version, float *dst,
                         ps_req_t **req)
{
    return data_req(c, PS__MSG_TYPE__MSG_PULL, part, 0, version, NULL, dst, PS_FLAG_EXACT, req);
}

int ps_client_pushpull(ps_client_t *c, uint32_t part, uint64_t iteration, const float *grad,
                       float *dst, uint32_t flags, ps_req_t **req)
{
    return data_req(c, PS__MSG_TYPE__MSG_PUSHPULL, part, iteration, 0, grad, dst, flags, req);
}

static int valid_req(ps_client_t *c, const ps_req_t *r)
{
    if (!c || !r || r < c->pool || r >= c->pool + c->npool) return 0;
    pthread_mutex_lock(&c->mu);
    int live = r->state != RQ_FREE;
    pthread_mutex_unlock(&c->mu);
    return live;
}

/* Wait until r is done and ZeroMQ holds none of its frames.  Returns 0 when
 * done (under c->mu on return), PS_ETIMEOUT on timeout_ms (mutex released). */
static int wait_done_locked(ps_client_t *c, ps_req_t *r, int timeout_ms, const unsigned *seen)
{
    struct timespec dl;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&c->mu);
    while (!(r->state == RQ_DONE && atomic_load(&r->zrefs) == 0)) {
        if (seen && r->state != RQ_DONE && atomic_load(&c->rebuilds) != *seen) {
            pthread_mutex_unlock(&c->mu);
            return PS_EAGAIN;
        }
        if (timeout_ms < 0) {
            pthread_cond_wait(&c->cv, &c->mu);
        } else if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT &&
                   !(r->state == RQ_DONE && atomic_load(&r->zrefs) == 0)) {
            pthread_mutex_unlock(&c->mu);
            return PS_ETIMEOUT;
        }
    }
    return 0;
}

static int wait_impl(ps_client_t *c, ps_req_t *r, int timeout_ms, uint64_t *version,
                     int *still_pending, uint32_t *flags, const unsigned *seen)
{
    if (still_pending) *still_pending = 0;
    if (flags) *flags = 0;
    if (!valid_req(c, r)) {
        if (c) ps_client_set_error(c, "ps_client_wait: not a live request handle");
        return PS_EINVAL;
    }
    int w = wait_done_locked(c, r, timeout_ms, seen);
    if (w < 0) {
        if (still_pending) *still_pending = 1;
        return w;
    }
    int rc = r->result;
    if (version) *version = r->version;
    if (flags) *flags = r->reply_flags;
    req_release_locked(c, r);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ps_client_wait_ex(ps_client_t *c, ps_req_t *r, int timeout_ms, uint64_t *version,
                      int *still_pending)
{
    return wait_impl(c, r, timeout_ms, version, still_pending, NULL, NULL);
}

int ps_client_wait_flags(ps_client_t *c, ps_req_t *r, int timeout_ms, uint64_t *version,
                         uint32_t *flags)
{
    return wait_impl(c, r, timeout_ms, version, NULL, flags, NULL);
}

unsigned ps_client_rebuilds(const ps_client_t *c)
{
    return atomic_load(&((ps_client_t *)c)->rebuilds);
}

int ps_client_wait_unless(ps_client_t *c, ps_req_t *r, unsigned seen, uint64_t *version,
                          uint32_t *flags, int *pending)
{
    return wait_impl(c, r, -1, version, pending, flags, &seen);
}

void ps_client_cancel(ps_client_t *c, ps_req_t *r)
{
    if (!valid_req(c, r)) return;
    pthread_mutex_lock(&c->mu);
    if (r->state != RQ_DONE) {
        r->cancel = 1;
        atomic_store(&c->cancel_pending, 1);
    }
    pthread_mutex_unlock(&c->mu);
    ps_client_io_wake(c);
    wait_impl(c, r, -1, NULL, NULL, NULL, NULL); /* done (PS_ECANCELED or its reply), released */
}

int ps_client_wait(ps_client_t *c, ps_req_t *req, int timeout_ms, uint64_t *version)
{
    return ps_client_wait_ex(c, req, timeout_ms, version, NULL);
}

int ps_client_wait_done_locked(ps_client_t *c, ps_req_t *r, int timeout_ms)
{
    return wait_done_locked(c, r, timeout_ms, NULL);
}
