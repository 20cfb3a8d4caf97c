/* Internals of the psd client shared by ps_client.c (caller-side API, request
 * pool) and the I/O thread that owns the sockets: ps_client_io.c (its loop,
 * sending), ps_client_recv.c (replies), ps_client_timers.c (resends,
 * timeouts, stall warnings, heartbeats).
 *
 * Threads and ownership:
 *  - caller threads allocate a request from the pool, encode the payload
 *    (so encoding runs beside the I/O thread), append it to submitq and wake
 *    the I/O thread through an eventfd;
 *  - the I/O thread alone touches the DEALER sockets, the per-server pending
 *    (priority) and in-flight lists, and decodes replies into dst;
 *  - c->mu protects the free list, submitq, request state/result fields
 *    read by waiters, enc_refs and last_error; c->cv signals completions.
 * A request's payload may be handed to ZeroMQ zero-copy; zrefs counts the
 * frames ZeroMQ still holds, and a handle is only given back to the pool
 * once zrefs is 0, so ZeroMQ never reads a buffer the caller reuses. */
#ifndef PS_CLIENT_INT_H
#define PS_CLIENT_INT_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ps_client.h"
#include "ps_ef.h"
#include "ps_wire.h"

#define PS_PART_NONE 0xFFFFFFFFu  /* control messages: no partition */
#define PS_CLIENT_BLOCKED_POLL_MS 20 /* re-try sends this often while a server is unreachable */

enum { RQ_FREE = 0, RQ_SUBMITTED, RQ_PENDING, RQ_SENT, RQ_DONE };

struct ps_req {
    ps_client_t *c;
    uint32_t slot;          /* index in c->pool */
    uint32_t gen;           /* bumped on every reuse: stale replies are dropped */
    int state;              /* RQ_*; under c->mu once submitted */
    int type;               /* Ps__MsgType of the request */
    int server;
    uint32_t part;          /* partition or PS_PART_NONE */
    uint64_t iteration, min_version;
    uint32_t flags;
    int rank_arg;           /* DRAIN: the rank to take out (Header.rank) */
    uint64_t seq;           /* submission order, ties in the priority queue */
    int no_reply;           /* PS_FLAG_NO_REPLY push: done once sent */
    int cancel;             /* ps_client_cancel: the I/O thread drops it (under mu) */

    /* payload (encoded); points into the caller's buffer (raw fp32), the
     * partition's encode buffer (enc_part >= 0) or tmp (a malloc'd fallback) */
    const void *payload;
    size_t payload_len;
    uint32_t crc;
    ps_dtype_t dtype;
    ps_codec_t codec;
    ps_codec_t reply_codec; /* PULL / PUSHPULL: codec wanted for the WEIGHTS */
    uint64_t numel;
    int64_t enc_part;       /* partition whose encode buffer we hold, -1 none */
    void *tmp;
    char *body;             /* owned copy of a control body (JSON, hostname) */
    size_t body_len;

    /* where WEIGHTS go */
    float *dst;
    size_t dst_numel;

    /* result (written by the I/O thread before state = RQ_DONE) */
    int result;
    uint64_t version;
    uint32_t reply_flags;
    int32_t reply_rank;
    uint64_t reply_hash;
    uint32_t reply_nworkers, reply_nservers;
    int reply_has_hash;
    char *reply_body;       /* malloc'd copy (STATS) */
    size_t reply_body_len;

    /* timers (I/O thread, monotonic ms) */
    int64_t t_submit;       /* when the I/O thread took it */
    int64_t t_deadline;     /* 0 = never */
    int64_t t_retry;        /* next resend, 0 = none */
    int retry_delay;
    int nsent;

    atomic_int zrefs;       /* zero-copy frames ZeroMQ still holds */
    struct ps_req *next;    /* submitq / pending / in-flight / free list link */
};

typedef struct ps_client_server {
    void *sock;
    char *endpoint;
    ps_req_t *pending;      /* sorted: priority, then seq */
    ps_req_t *inflight;     /* sent, awaiting reply */
    int ninflight;          /* of those, the ones max_inflight bounds (windowed()
                               in ps_client_io.c: answered without waiting on
                               any other worker) */
    atomic_llong unsent;    /* payload bytes handed to ZeroMQ and not yet
                               released by it (written to the kernel, or
                               dropped): bounds PUSH / PUSHPULL by
                               send_queue_bytes, freed without any reply */
    int blocked;            /* last send hit EAGAIN: poll for POLLOUT */
    int reset;              /* reopen the socket to make ZeroMQ let go of frames */
    int64_t next_heartbeat;
    int64_t stall_next;     /* next stall warning (0: nothing stalled) */
    int stall_gap;          /* ms to the one after */
    int shut;               /* the server said it shuts down: fail at once */
    int gave_back;          /* keep_state: the partitions kept were given back to
                               this server since it said it lost its state */
} ps_client_server_t;

struct ps_client {
    ps_client_opts_t o;
    const ps_partition_table_t *t;
    char **endpoints;
    void *zctx;
    ps_client_server_t *srv;
    int rank;
    uint64_t session;       /* random token of this process (HELLO binds the rank to it) */
    int outcome, outcome_code;    /* PS_CLIENT_* of the BYE, under mu */
    char outcome_text[256];
    size_t maxmsg;

    pthread_t io;
    int io_started;
    int efd;                /* eventfd: wakes the I/O thread */
    atomic_int wake_pending;
    atomic_int stop;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    ps_req_t *pool;
    uint32_t npool;
    ps_req_t *free_list;
    ps_req_t *submitq, *submitq_tail;
    uint64_t seq;

    /* per-partition encode buffers, allocated (and prefaulted) at first use,
     * then reused for every later request on that partition */
    void **enc;
    size_t *enc_cap;
    void **enc_scratch;
    size_t *enc_scratch_cap;
    int *enc_refs;          /* requests using enc[p] (under mu) */

    /* error feedback (ef != NULL for topk/sign or ef_rounding): the last
     * compressed payload of each partition stays in enc[p] and is resent as
     * is for a re-push of the same iteration (ef_valid/ef_iter, under ef_mu,
     * which also serialises ps_ef_compress: it has one work buffer) */
    ps_ef_t *ef;
    pthread_mutex_t ef_mu;
    unsigned char *ef_valid;
    uint64_t *ef_iter;
    size_t *ef_len;
    uint32_t *ef_crc;
    ps_codec_params_t params;
    ps_codec_t pull_codec;

    /* CURVE keys (Z85), loaded at ps_client_new; curve = 0: plain TCP */
    int curve;
    char (*curve_server)[41]; /* (nservers) */
    char curve_public[41], curve_secret[41];
    int warned_reply_codec;   /* I/O thread: told once that a server ignores reply_codec */

    /* I/O thread only: decode scratch, grown to the largest need and kept */
    void *dec_scratch;
    size_t dec_scratch_cap;

    /* opts.keep_state: the state of the partitions this worker keeps
     * (ps_client_keep.c; written by the I/O thread, read by rebuilds) */
    struct ps_client_keep *keep; /* (nparts), allocated at the first state reply */
    pthread_mutex_t keep_mu;
    char *spec;             /* the INIT spec (ps_client_set_spec): a server's rebuild */
    int *keeper;            /* (nparts) the rank that keeps each partition */

    atomic_uint epochs_seen;  /* elastic: the most membership epochs a reply named */
    atomic_uint rebuilds;     /* ERRORs with PS_FLAG_REBUILD to live requests */
    atomic_int cancel_pending; /* a request was cancelled: the I/O thread drops it */

    char last_error[512];
    atomic_uint_fast64_t bytes_out, bytes_in, requests, retries, errors;
};

/* ps_client_io.c */
void *ps_client_io_main(void *arg);
int ps_client_io_open(ps_client_t *c, int s);
void ps_client_io_close_all(ps_client_t *c, int send_bye);
void ps_client_io_wake(ps_client_t *c);
int64_t ps_client_now_ms(void);
/* I/O thread: one (re)send of r to server s (0, PS_EAGAIN: no live
 * connection / HWM, or another PS_E*: the request fails); r done with
 * result; r out of the list at *head; whether max_inflight bounds r; every
 * request of the list r done with result. */
int ps_client_io_send(ps_client_t *c, int s, ps_req_t *r);
void ps_client_io_complete(ps_client_t *c, ps_req_t *r, int result);
void ps_client_io_list_remove(ps_req_t **head, ps_req_t *r);
int ps_client_io_windowed(const ps_req_t *r);
void ps_client_io_fail_all(ps_client_t *c, ps_req_t *r, int result);
/* I/O thread: every request ps_client_cancel marked is taken out of the
 * lists and done with PS_ECANCELED. */
void ps_client_io_drop_cancelled(ps_client_t *c);

/* ps_client_recv.c: I/O thread, every message waiting on server s's socket. */
void ps_client_recv_drain(ps_client_t *c, int s);

/* ps_client_timers.c: I/O thread, resends, timeouts, stall warnings and
 * heartbeats due at now; the poll timeout until the next one (ms, -1:
 * none). */
void ps_client_timers_run(ps_client_t *c, int64_t now);
int ps_client_timers_next(ps_client_t *c, int64_t now);

/* ps_client_enc.c: encode grad (partition part) into r's payload. */
int ps_client_encode_part(ps_client_t *c, ps_req_t *r, uint32_t part, const float *src,
                          ps_dtype_t dt, ps_codec_t codec);
int ps_client_uses_ef(const ps_client_t *c, ps_dtype_t dt, ps_codec_t codec);

/* ps_client_curve.c: load the key files of c->o (0 or PS_E*, logged), and
 * set the CURVE client options on a DEALER before it connects. */
int ps_client_curve_load(ps_client_t *c);
int ps_client_curve_apply(ps_client_t *c, int s, void *sock);

/* ps_client_keep.c: who keeps which partition (at ps_client_new); whether
 * this worker keeps partition part's state; a
 * WEIGHTS reply with PS_FLAG_STATE for r (payload: weights then momentum)
 * kept, the weights into r->dst as its wire dtype brings them (0 or PS_E*,
 * I/O thread); the kept state freed. */
int ps_client_keep_init(ps_client_t *c);
int ps_client_keeps(const ps_client_t *c, uint32_t part);
int ps_client_keep_reply(ps_client_t *c, ps_req_t *r, uint64_t v, const void *payload, size_t len);
void ps_client_keep_free(ps_client_t *c);
/* I/O thread: server s said it lost its state (PS_FLAG_REBUILD): send it
 * the spec and the partitions kept here, once per loss. */
void ps_client_keep_give_back(ps_client_t *c, int s);

/* ps_client.c (the control calls are in ps_client_ctl.c) */
/* A request handle for (type, server, part), NULL when the pool is empty;
 * give it back unsent with abandon, or hand it to the I/O thread. */
ps_req_t *ps_client_req_alloc(ps_client_t *c, int type, int server, uint32_t part);
void ps_client_req_abandon(ps_client_t *c, ps_req_t *r);
void ps_client_req_submit(ps_client_t *c, ps_req_t *r);
/* Under c->mu: give a finished handle back.  Wait until r is done (or
 * timeout_ms, < 0: forever): 0 with c->mu held, or PS_ETIMEOUT without. */
void ps_client_req_release_locked(ps_client_t *c, ps_req_t *r);
int ps_client_wait_done_locked(ps_client_t *c, ps_req_t *r, int timeout_ms);
/* The INIT spec to one server, waited for: 0 or PS_E*. */
int ps_client_send_spec(ps_client_t *c, int server, const char *spec_json);
void ps_client_set_error(ps_client_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Under c->mu: mark done, wake waiters (I/O thread). */
void ps_client_complete_locked(ps_client_t *c, ps_req_t *r, int result);
/* ZeroMQ free function for zero-copy frames (hint = request). */
void ps_client_zc_free(void *data, void *hint);
#endif
