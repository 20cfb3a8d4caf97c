/* psd internals shared by the server's files.
 *
 * One thread runs a libuv loop around the ZMQ ROUTER socket; every message is
 * handled to completion on that thread, so the store needs no locks.  Only
 * the data-parallel loops (summing worker slots) fan out to psd_pool.c's
 * threads, checkpoint files are written on libuv's thread pool from a copy
 * of the shard taken on the loop thread, and zero-copy reply buffers are
 * released from ZeroMQ's I/O thread (hence the atomic reference count on
 * psd_buf_t).
 *
 * The files, from the top down; each calls only files below it:
 *   psd_main.c        options, start-up, teardown
 *                     -> loop, checkpoint, metrics, members, reply, store, peers, pool
 *   psd_loop.c        libuv + the ZMQ fd (drain), timers, signals, socket
 *                     monitor (connection log)
 *                     -> handlers, shutdown, checkpoint, metrics, late, curve,
 *                     members, maxmsg, reply
 *   psd_handlers.c    one function per message type; the sync / async update
 *                     path -> rollback, shutdown, checkpoint, spec, metrics,
 *                     jobfail, late, curve, waiters, members, reply, store
 *   psd_jobfail.c     a failed worker stops the job -> waiters, members, reply
 *   psd_rollback.c    MSG_ROLLBACK: restore an aligned checkpoint
 *                     -> checkpoint, waiters, reply, store
 *   psd_shutdown.c    orderly shutdown: the final checkpoint, the answers,
 *                     a linger -> checkpoint, members, reply
 *   psd_checkpoint_*.c  checkpoint files (psd_checkpoint_internal.h):
 *                     psd_checkpoint_write.c snapshot, write off the loop
 *                     thread; psd_checkpoint_load.c verify and load at
 *                     start; psd_checkpoint_files.c names, pruning, the
 *                     failure note -> spec, members, reply, store
 *   psd_spec.c        the INIT spec: parse, check, hold its table
 *                     -> maxmsg, members, store
 *   psd_metrics.c     the STATS reply, stats log line, HTTP /metrics
 *                     -> preflight, late, members
 *   psd_preflight.c   psctl check's STATS members (flags, clock, a probe
 *                     write in the checkpoint directory)
 *   psd_late.c        who the server waits for; steps per rank -> members
 *   psd_curve.c       --curve: CURVE server + ZAP allow-list thread
 *   psd_waiters.c     requests waiting for a partition version -> reply, peers
 *   psd_members.c     ranks, session tokens, liveness, BARRIER, BYE
 *                     -> elastic, curve, reply
 *   psd_elastic.c     membership epochs (join, drain, MEMBERS) -> reply
 *   psd_maxmsg.c      ZMQ_MAXMSGSIZE: message bound, the limit at the bind
 *   psd_reply.c       every send: counters, dropped replies, the ERROR log,
 *                     WEIGHTS -> store
 *   psd_store.c       partitions, slots, versions, sum + apply, encoded
 *                     weights -> skips, pool
 *   psd_skips.c       the sync steps skipped for a loss-scale overflow
 *   psd_peers.c       waiting requests counted per peer
 *   psd_pool.c        summation threads
 * Two calls go back up, at run time: psd_t.drain, which the loop sets and
 * psd_checkpoint_write.c and psd_shutdown.c call after answering from their
 * own libuv callbacks (ZMQ_FD is edge-triggered: sends made outside the
 * poll callback need the socket re-read); and the end of the final
 * checkpoint's write, which finishes a stop (psd_shutdown_checkpoint_done). */
#ifndef PSD_H
#define PSD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <uv.h>

#include "ps_codec.h"
#include "ps_optim.h"
#include "ps_partition.h"
#include "ps_wire.h"

typedef enum { PSD_SYNC = 0, PSD_ASYNC = 1, PSD_SSP = 2 } psd_mode_t;

/* Monotonic seconds (the timing counters, checkpoint durations). */
static inline double psd_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The ROUTER identity of a received message, as (id, idlen) arguments. */
#define PSD_ID_OF(m) zmq_msg_data(&(m)->identity), zmq_msg_size(&(m)->identity)

/* ---- psd_pool.c: fork-join threads for the data-parallel loops ---- */
typedef struct psd_pool psd_pool_t;
typedef void psd_pool_fn(void *arg, size_t chunk);
/* nthreads <= 0: one per CPU, at most 8 (the caller's thread counts). */
int psd_pool_new(psd_pool_t **p, int nthreads);
/* Call fn(arg, c) for every c in [0, nchunks) across the pool; returns when
 * all are done.  Which thread runs a chunk varies, so fn must make each
 * chunk's result independent of that (it is: chunks are disjoint). */
void psd_pool_run(psd_pool_t *p, psd_pool_fn *fn, void *arg, size_t nchunks);
int psd_pool_threads(const psd_pool_t *p);
void psd_pool_destroy(psd_pool_t **p);

/* Command line / config file (psd_main.c fills it through ps_config). */
typedef struct psd_opts {
    int port;              /* 0: pick a free port */
    char *bind;            /* tcp://HOST or tcp://STAR (any), or ipc://PATH */
    char *port_file;       /* write the bound port here (tests) */
    int server_id;
    int num_servers;
    int num_workers;       /* 0: learn from HELLO / INIT */
    int max_workers;       /* elastic (sync): the most workers at once (> num_workers
                            * makes the job elastic; psd_elastic.c) */
    char *mode;            /* sync | async | ssp */
    int staleness;         /* ssp: refuse pushes older than version - staleness */
    int threads;           /* summation threads (0: one per CPU, at most 8) */
    char *checkpoint_dir;  /* NULL / "": no checkpoints */
    int checkpoint_every;  /* shard updates between checkpoints (0: only on demand) */
    int checkpoint_every_steps; /* sync: aligned checkpoints when every owned
                             * partition reaches version k*N (0: off); what a
                             * rollback (MSG_ROLLBACK) restores */
    int metrics_port;      /* 0: off */
    char *metrics_bind;
    int heartbeat_ms;
    int worker_timeout_ms; /* 0: never declare a worker lost */
    int reject_nonfinite;
    int max_msg_mb;        /* explicit ZMQ_MAXMSGSIZE in MiB: wins over the two
                            * bounds below (0: derived, the default) */
    uint64_t max_partition_bytes; /* fresh start: largest partition an INIT may
                            * bring; sizes ZMQ_MAXMSGSIZE before the bind (a
                            * table loaded from a checkpoint gives the exact one) */
    int stats_every_s;     /* periodic stats log line (0: off) */
    char *log_level;
    char *on_worker_loss;  /* wait | continue (a lost worker no longer holds up steps) */
    int loss_continue;     /* parsed on_worker_loss */
    int max_peer_inflight; /* requests waiting for a reply per peer (0: no cap) */
    int io_threads;        /* ZMQ I/O threads (one connection uses one) */
    int sock_buf_kb;       /* SO_SNDBUF / SO_RCVBUF (0: kernel autotuning) */
    int curve;             /* CURVE server + ZAP allow-list (psd_curve.c) */
    char *curve_secret_key;/* file: Z85 secret key of this server */
    char *curve_allow;     /* file or directory of allowed Z85 public keys */
    char *curve_admin;     /* file of admin Z85 public keys (CHECKPOINT / SHUTDOWN) */
    int debug_die_state_v; /* tests: SIGKILL before the keeper's reply of version N (0: off) */
} psd_opts_t;

/* An encoded WEIGHTS payload shared by every reply of one version: one
 * reference for the partition's cache, one per zero-copy send in flight. */
typedef struct psd_buf {
    atomic_int refs;
    uint64_t version;
    size_t len;
    uint32_t crc;
    /* 16-aligned: for fp32 raw replies this is the weights array itself. */
    _Alignas(16) unsigned char data[];
} psd_buf_t;

void psd_buf_unref(psd_buf_t *b);
/* zmq_free_fn for zero-copy sends of a psd_buf_t (hint = the buffer). */
void psd_buf_zmq_free(void *data, void *hint);

/* A request waiting for a partition to reach a version. */
typedef struct psd_waiter {
    struct psd_waiter *next;
    uint8_t id[256];        /* ROUTER identity of the requester */
    uint8_t idlen;
    uint64_t request_id;
    uint64_t min_version;   /* reply once version >= this */
    int exact;              /* PS_FLAG_EXACT: only version == min_version will do */
    int state;              /* PS_FLAG_STATE: the reply carries weights and momentum */
    int dtype, codec;       /* encoding of the WEIGHTS reply */
} psd_waiter_t;

#define PSD_NDTYPE 3
#define PSD_NCODEC 4
#define PSD_MAX_WAITERS 4096 /* per partition: bounds memory against floods */

/* One tensor's piece of a partition: the optimizer step of the fused
 * sum + apply pass uses the tensor's group lr / weight decay. */
typedef struct psd_seg {
    size_t off, n;          /* elements [off, off + n) of the partition */
    int group;
    float lr, wd;           /* of the update in progress */
} psd_seg_t;

typedef struct psd_part {
    uint32_t id;
    size_t numel;
    int owned;              /* this server holds it */
    int initialised;        /* weights arrived (INIT or checkpoint) */
    int rebuilt;            /* sync: state given back by a worker (a lost server
                               rebuilt), no update applied since */
    float *w;               /* (numel) fp32 master weights = wbuf->data */
    psd_buf_t *wbuf;        /* the weights, also sent zero-copy as the fp32 raw
                             * WEIGHTS reply; replaced (copy on write) when an
                             * update finds a send of it still in flight */
    psd_seg_t *seg;         /* tensor pieces tiling the partition, in order
                             * (NULL: use ps_optim_apply_partition) */
    uint32_t nseg;
    const float *direct;    /* sync: the completing push's raw fp32 payload,
                             * summed straight from the ZMQ message (no slot
                             * copy); only set while its handler runs */
    int direct_rank;
    zmq_msg_t *held;        /* (W) sync: a rank's raw fp32 push kept as the
                             * received message instead of copied to its slot */
    uint8_t *held_on;       /* (W) held[r] is in use */
    int nheld;              /* W (entries of held) */
    float *m;               /* (numel) momentum buffer */
    uint64_t version;       /* updates applied */
    float *slots;           /* (W, numel) sync: per-rank decoded gradients */
    uint8_t *have;          /* (W) sync: rank's gradient for `version` is in */
    int overflow;           /* a push for `version` carried PS_FLAG_OVERFLOW */
    uint64_t skipped_ver;   /* sync: the version an overflow-skipped update
                             * produced (0: none); WEIGHTS of exactly that
                             * version carry PS_FLAG_OVERFLOW so every worker
                             * learns the step was skipped (not checkpointed) */
    uint64_t *last_iter;    /* (W) async/ssp: last iteration applied per rank + 1 (0: none) */
    psd_buf_t *prevbuf;     /* sync: the weights of version prev_version, the one
                             * before `version`, kept by every update: a worker
                             * that died between its pushes of that step computes
                             * it again from them (PULL with PS_FLAG_EXACT) when
                             * some partitions are already one update ahead.  An
                             * update writes the new weights into the buffer of
                             * the version before and swaps it with wbuf, so the
                             * version it replaces is kept without a copy (and a
                             * reply of it in flight needs no copy either); NULL
                             * until the first update */
    uint64_t prev_version;  /* UINT64_MAX: prev holds no version */
    int prev_skipped;       /* version prev_version came from a skipped update */
    uint64_t wait_since_ms; /* sync: uv_now of the first push for `version` (psd_late.c) */
    psd_waiter_t *waiters;  /* PULL / PUSHPULL replies pending on a version */
    int nwaiters;
    psd_buf_t *cache[PSD_NDTYPE][PSD_NCODEC]; /* encoded weights at `version` */
} psd_part_t;

/* ---- psd_peers.c: requests waiting for a reply, counted per peer ---- */
typedef struct psd_peers psd_peers_t;
/* Count one more waiting request of peer id; 0, or PS_EAGAIN when the peer
 * already has `cap` waiting (cap <= 0: no cap), PS_ENOMEM. */
int psd_peers_acquire(psd_peers_t **pp, const void *id, size_t idlen, int cap);
void psd_peers_release(psd_peers_t *p, const void *id, size_t idlen);
void psd_peers_free(psd_peers_t **pp);

/* An INIT spec parsed and checked (psd_spec.c), its table not yet held. */
typedef struct psd_spec {
    ps_partition_table_t table;
    ps_optim_config_t optim;
    int nworkers;                /* W */
    int elastic_linear;          /* "elastic": {"lr": "linear"} */
    long long global_batch;      /* "elastic": {"global_batch": N} (0: none) */
    size_t max_numel;            /* largest partition this server would own */
    const char *json;            /* the spec as received (len bytes) */
    size_t len;
} psd_spec_t;

typedef struct psd_store {
    int have_table;
    ps_partition_table_t table;
    char *spec_json;             /* the INIT spec as received (checkpointed) */
    ps_optim_config_t optim;
    char *optim_json;
    int nworkers;                /* W: slots per partition */
    psd_part_t *parts;           /* (table.nparts) */
    uint32_t nowned;
    size_t max_numel;            /* largest owned partition */
    float *gsum;                 /* (max_numel) reduction result */
    void *scratch;               /* codec scratch */
    size_t scratch_cap;
    int from_ckpt;               /* state was loaded from a checkpoint */
    uint64_t updates;            /* shard updates applied (all partitions) */
    uint64_t *skips;             /* sync: versions whose update was skipped for a
                                  * loss-scale overflow, ascending (psd_skips.c) */
    size_t nskips, skips_cap;
} psd_store_t;

/* Worker membership (psd_members.c). */
/* UNKNOWN: never heard from; LOST: silent past the timeout; LEFT: said BYE
 * before the end; DONE: said BYE after its last step; FAILED: said it
 * failed (the job stops, psd_jobfail.c). */
typedef enum {
    PSD_W_UNKNOWN = 0, PSD_W_LIVE, PSD_W_LOST, PSD_W_LEFT, PSD_W_DONE, PSD_W_FAILED
} psd_wstate_t;

typedef struct psd_worker {
    psd_wstate_t state;
    uint64_t last_seen_ms;      /* uv_now of the last message (or start) */
    uint8_t id[256];            /* HELLO identity that got this rank */
    uint8_t idlen;
    int assigned;
    int at_barrier;
    uint64_t barrier_req;       /* request_id of its BARRIER */
    uint8_t bid[256];           /* identity of its BARRIER */
    uint8_t bidlen;
    uint64_t barrier_done;      /* request_id of its last released BARRIER (0:
                                 * none): a resend of it (its ACK was lost, e.g.
                                 * the connection came back under a new ZeroMQ
                                 * identity) is answered again, not queued */
    int silent_warned;          /* silent before the job started: warned once */
    int rejoined;               /* a new process took this rank after the job
                                 * started and has not pushed yet: its first
                                 * BARRIER is its start barrier, which the
                                 * others passed long ago (answered at once) */
    char host[64];
    char endpoint[128];         /* its HELLO's endpoint (BN ring; "" none) */
    uint64_t lost_ms;           /* uv_now when it was declared lost */
    uint64_t session;           /* its process's token from HELLO (0: none sent) */
    uint64_t steps;             /* sync steps it contributed (pushes of this
                                 * server's first partition counted once each) */
    int back;                   /* said HELLO again after the job failed */
    char refused[224];          /* why its last HELLO was refused ("" none) */
} psd_worker_t;

/* A CHECKPOINT / SHUTDOWN requester waiting for the checkpoint in flight. */
typedef struct psd_ackwait {
    struct psd_ackwait *next;
    uint8_t id[256];
    uint8_t idlen;
    uint64_t request_id;
    int type;                   /* PS__MSG_TYPE__MSG_CHECKPOINT or _SHUTDOWN */
} psd_ackwait_t;

typedef struct psd_ckpt_job psd_ckpt_job_t; /* psd_checkpoint_write.c */

/* Elastic membership (psd_elastic.c): from version `from` on, the sync
 * updates wait for the ranks in `ranks` (bit r: rank r). */
typedef struct psd_epoch {
    uint64_t from;
    uint64_t ranks;
} psd_epoch_t;

/* Counters, incremented where things happen, reported by psd_metrics.c. */
#define PSD_NERR 21 /* PS_E* codes are -1..-20 */
typedef struct psd_metrics {
    uint64_t bytes_in, bytes_out, msgs_in, msgs_out, updates, skipped;
    uint64_t errors[PSD_NERR];
    uint64_t dropped_replies;
    uint64_t weights_cow;  /* updates that found the weights still being sent
                            * and copied them (in place: async modes) */
    uint64_t weights_left; /* sync updates that found the weights still being
                            * sent and left them to the replies (the version
                            * before), no copy */
    uint64_t disconnects;  /* peer connections closed (a message over
                            * ZMQ_MAXMSGSIZE ends its connection this way) */
    double agg_seconds, apply_seconds;
    uint64_t agg_count, apply_count;
    /* Checkpoint writes (psd_checkpoint_write.c).  A failed write is an error:
     * STATS `errors` counts it with the ERROR replies. */
    uint64_t ckpt_writes;   /* files made durable (fsync'd, renamed into place) */
    uint64_t ckpt_failures; /* writes that saved nothing (the previous files stand) */
    double ckpt_fail_time;  /* wall clock (Unix seconds) of the last failure, 0: none */
    char ckpt_error[640];   /* its cause: path and errno text ("" : none) */
} psd_metrics_t;

typedef struct psd {
    psd_opts_t o;
    psd_mode_t mode;
    uv_loop_t *loop;
    void *zctx, *sock;
    uv_poll_t zpoll;
    /* Set by psd_loop_open: re-read ZMQ_EVENTS and handle what is queued.
     * A send made outside the loop's poll callback (from a libuv callback
     * of a lower file) is followed by this, ZMQ_FD being edge-triggered. */
    void (*drain)(struct psd *s);
    uv_timer_t hb_timer, stats_timer, drain_timer;
    uv_signal_t sigterm, sigint;
    struct ps_http *http;       /* the /metrics listener (NULL: off); its counters
                                 * are the psd_http_* metrics */
    int port;                   /* bound port */
    char endpoint[512];         /* bound endpoint (ZMQ_LAST_ENDPOINT) */
    int64_t maxmsg_table;       /* psd_maxmsg_bound of a table loaded before the bind (0: none) */
    int64_t maxmsg;             /* ZMQ_MAXMSGSIZE in force (set at the bind) */
    const char *maxmsg_from;    /* the flag (or table) that set it, for errors */
    void *monitor;              /* PAIR end of zmq_socket_monitor (disconnect log) */
    uv_poll_t monpoll;
    struct psd_conn *conns;     /* accepted connections: fd -> peer address */
    size_t nconns, conns_cap;
    /* The close log's rate limit (psd_loop.c): lines logged one by one in
     * the interval that began at connlog_since (uv_now ms), and the closes
     * past the burst, summed up in one line when the interval ends. */
    uint64_t connlog_since;
    unsigned connlog_lines;
    uint64_t connlog_more;
    int stopping;
    int exit_code;              /* process exit status once the loop ends */
    psd_store_t st;
    psd_pool_t *pool;           /* summation threads */
    psd_worker_t *workers;      /* (nworkers) */
    int nworkers;               /* ranks: W, or --max-workers in an elastic job; 0 until known */
    int w0;                     /* the workers the job starts with (HELLO / INIT num_workers) */
    psd_epoch_t *epochs;        /* elastic: the membership epochs, by `from` (NULL: fixed W) */
    int nepochs;
    int elastic_linear;         /* the spec's lr rule: 1 linear scaling, 0 keep-batch */
    long long global_batch;     /* the spec's global batch (keep-batch must split it) */
    int job_started;            /* a barrier was released or a gradient pushed
                                 * here: only from then on can a silent worker
                                 * be declared lost (psd_members.c) */
    uint64_t table_hash_seen;   /* first hash from HELLO / INIT (server 0 check) */
    int have_hash_seen;
    psd_metrics_t mx;
    uint64_t updates_at_ckpt;
    uint64_t aligned_v;         /* version of the newest aligned checkpoint that is durable
                                 * (written here, loaded at start, or restored; 0: none) */
    uint64_t aligned_taken;     /* version of the newest aligned snapshot taken, written or
                                 * not: one snapshot per version */
    uint64_t ckpt_version;      /* shard version (slowest partition) of the newest durable
                                 * checkpoint written or loaded, if have_ckpt */
    int have_ckpt;
    char ckpt_none[700];        /* no checkpoint was loaded at start: why (the ERROR text a
                                 * worker of a job under way gets names it) */
    double ckpt_fail_logged;    /* psd_now_s of the last failure logged (0: log the next) */
    uint64_t ckpt_fail_quiet;   /* failures since then not logged (rate limit) */
    uint64_t rollbacks;         /* MSG_ROLLBACKs that restored partitions */
    uint64_t ckpt_seq;
    /* Checkpoint writer (psd_checkpoint_write.c): at most one write in flight on
     * libuv's thread pool; requests arriving meanwhile are coalesced. */
    uv_work_t ckpt_work;
    psd_ckpt_job_t *ckpt_job;   /* in flight, NULL when idle */
    psd_ckpt_job_t *ckpt_next;  /* aligned snapshot taken while a write was in
                                 * flight: written next (it cannot wait to be
                                 * taken, the versions move on) */
    int ckpt_again;             /* another checkpoint wanted after this one */
    psd_ackwait_t *ckpt_waiters;/* not yet in a snapshot: the next write answers them */
    psd_ackwait_t *ckpt_waiters_done; /* covered by the write in flight */
    /* Orderly stop: SHUTDOWN / signal refuse further updates, wait for the
     * final checkpoint, answer, keep serving replies for a short linger,
     * exit: 0, or 1 when the final checkpoint could not be written. */
    int shutting;               /* no more updates; exit once the checkpoint is out */
    int final_done;             /* the final checkpoint's outcome is known */
    int final_rc;               /* and it is 0 or the PS_E* of its write */
    psd_ackwait_t *shutdown_waiters; /* SHUTDOWN requests, answered when final_done */
    uv_timer_t linger_timer;
    psd_peers_t *peers;         /* waiting requests per peer (--max-peer-inflight) */
    void *zap;                  /* psd_curve.c: ZAP handler state, NULL without --curve */
    /* The job failed (psd_jobfail.c): every training request gets fail_text
     * until every rank has said HELLO again. */
    int shutdown_asked;         /* a SHUTDOWN request (not only a signal) stops this server */
    int job_failed;
    char fail_text[512];
    uint64_t barrier_since_ms;  /* uv_now of the first arrival at the pending barrier */
    uint64_t late_logged_ms;    /* last "waiting for ..." log line (psd_late.c) */
} psd_t;

/* ---- psd_loop.c ---- */
int psd_loop_open(psd_t *s);
int psd_loop_run(psd_t *s);
void psd_loop_close(psd_t *s);

/* ---- psd_handlers.c ---- */
void psd_handle(psd_t *s, ps_wire_msg_t *m);
/* After a worker was lost or left: partitions whose remaining slots are complete. */
void psd_recheck_pending(psd_t *s);

/* ---- psd_elastic.c: membership that changes at step boundaries ---- */
/* Rank r is in the job at version v (always, in a job that is not elastic). */
int psd_elastic_active(const psd_t *s, int r, uint64_t v);
/* How many ranks are in the job at version v. */
int psd_elastic_count(const psd_t *s, uint64_t v);
/* The lr factor of version v: W_v / W0 under linear scaling, else 1. */
float psd_elastic_lr_scale(const psd_t *s, uint64_t v);
/* Once the cluster size is known: the first epoch when --max-workers > W0
 * (0, or PS_E* logged). */
int psd_elastic_init(psd_t *s);
/* HELLO with PS_FLAG_JOIN on server 0: the rank the joiner gets (its first
 * step in *from), or -1 with the cause in err. */
int psd_elastic_join(psd_t *s, uint64_t *from, char *err, size_t len);
/* The epochs as JSON [[from,[ranks]],...] (malloc'd), and back (a longer
 * list replaces the one held; 0 or PS_EINVAL with the cause). */
char *psd_elastic_json(const psd_t *s);
int psd_elastic_parse(psd_t *s, const char *json, char *err, size_t len);
void psd_handle_members(psd_t *s, ps_wire_msg_t *m);
void psd_handle_drain(psd_t *s, ps_wire_msg_t *m);

/* ---- psd_rollback.c ---- */
/* MSG_ROLLBACK(V), sync mode: restore every owned partition above version V
 * from this server's aligned checkpoint of version V (weights, momentum;
 * the schedule follows the version), clear its pending gradients and
 * answer its waiters ERROR(PS_ESTATE, PS_FLAG_ROLLBACK, V).  Partitions at
 * V are kept as they are (a repeated ROLLBACK is a no-op). */
void psd_handle_rollback(psd_t *s, ps_wire_msg_t *m);
/* Sync: a push from a step past this server's version, on a server that
 * restarted from an older checkpoint or rolled back -- every push of the
 * round held here is dropped and its waiting worker answered with the
 * rollback verdict: the round is redone by all after the rollback.  Returns
 * the partitions whose pushes were dropped. */
uint32_t psd_rollback_drop_round(psd_t *s);

/* ---- psd_shutdown.c ---- */
/* Orderly stop (SHUTDOWN request w, or a signal with w NULL): refuse
 * further updates, checkpoint when a directory is set, answer w ACK once
 * that write ended, keep serving for a short linger so replies get out,
 * then stop the loop.  A final checkpoint that fails does not keep the
 * server up: it is logged, the ACK's body says so, and psd exits 1. */
void psd_shutdown_begin(psd_t *s, const char *why, psd_ackwait_t *w);

/* ---- psd_checkpoint_write.c ---- */
/* Snapshot the shard now and write it on a pool thread (0 or PS_E*,
 * logged); if a write is in flight, one more follows it.  w (may be NULL)
 * is answered ACK / ERROR when the write that includes this state ends. */
int psd_checkpoint_start(psd_t *s, psd_ackwait_t *w);
/* Write synchronously on the loop thread (0 or PS_E*); tests of the format. */
int psd_checkpoint_write(psd_t *s);
/* A malloc'd waiter for the request m (NULL when out of memory). */
psd_ackwait_t *psd_ackwait_new(const ps_wire_msg_t *m);
/* Called after updates: checkpoint when checkpoint_every is reached. */
void psd_checkpoint_maybe(psd_t *s);

/* ---- psd_checkpoint_load.c ---- */
/* This server holds no partition table: why it has no state of the job a
 * PUSH / PULL / ROLLBACK presumes (no INIT since it started, and the
 * checkpoint it could have resumed from: none, unusable, or its last
 * write failed), for the ERROR text. */
void psd_checkpoint_why_none(const psd_t *s, char *buf, size_t cap);
/* Load the newest good checkpoint of this server from the directory, if any:
 * 0 (loaded or nothing there) or PS_E* when the directory is unusable. */
int psd_checkpoint_load(psd_t *s);

/* ---- psd_checkpoint_files.c ---- */
/* Sequence numbers of server sid's checkpoint files, newest first
 * (*seqs malloc'd); path of one of them. */
int psd_checkpoint_list(const char *dir, int sid, uint64_t **seqs, size_t *n);
void psd_checkpoint_path(char *buf, size_t cap, const char *dir, int sid, uint64_t seq);

/* ---- psd_spec.c ---- */
/* Hold the table of an INIT spec (received, or stored in a checkpoint):
 * parse and check it (against want_hash when not NULL), size the message
 * limit for it (psd_maxmsg_for_table), set the cluster size, and let the
 * store allocate the shard.  0 (also when the same table is held already),
 * or PS_E* with the cause in err: then no table is held (the cluster size
 * may have been set). */
int psd_spec_hold(psd_t *s, const char *json, size_t len, const uint64_t *want_hash, char *err,
                  size_t errlen);

/* ---- psd_metrics.c ---- */
/* The /metrics listener (common/ps_http.h) serves at most PS_HTTP_MAX_CONNS
 * connections at a time (more are closed at accept) and gives each
 * PS_HTTP_DEADLINE_MS to send its request and take the answer, so idle or
 * half-sent connections cannot pile up until psd runs out of file
 * descriptors. */
int psd_metrics_start(psd_t *s);
void psd_metrics_stop(psd_t *s);
/* STATS body: malloc'd JSON; with preflight, psctl check's members too
 * (psd_preflight.c: that writes a probe file in the checkpoint directory). */
char *psd_stats_json(const psd_t *s, int preflight);

/* ---- psd_preflight.c ---- */
/* Add "preflight": {time_unix, host, num_servers, num_workers (the flags),
 * checkpoint_every_steps, checkpoint_dir, checkpoint_dir_error ("" when a
 * probe file was written and synced there), checkpoint_free_bytes,
 * checkpoint_bytes (one file of this shard, 0 before INIT)} to o. */
struct cJSON;
void psd_preflight_add(const psd_t *s, struct cJSON *o);
void psd_stats_log(psd_t *s);

/* ---- psd_curve.c ---- */
/* --curve: load keys, start the ZAP handler (before the ROUTER binds) and
 * set CURVE server options on sock.  0 or PS_E* (logged): psd must not
 * start without it. */
int psd_curve_setup(psd_t *s, void *sock);
void psd_curve_stop(psd_t *s);
/* The peer of m authenticated with an admin key (always true without --curve). */
int psd_curve_is_admin(const psd_t *s, const ps_wire_msg_t *m);

/* ---- psd_waiters.c: requests waiting for a partition version ---- */
/* Queue m (a PULL / PUSHPULL) on p until p reaches min_version; a retry
 * already queued is not queued twice.  0, or -1 with ERROR sent (the peer
 * or the partition has too many waiting, out of memory). */
int psd_waiters_add(psd_t *s, ps_wire_msg_t *m, psd_part_t *p, uint64_t min_version);
/* Answer WEIGHTS to every waiter of p whose min_version has been reached. */
void psd_waiters_notify(psd_t *s, psd_part_t *p);
/* p was rolled back to v: answer every waiter wanting a later version
 * ERROR(PS_ESTATE, PS_FLAG_ROLLBACK, v). */
void psd_waiters_cancel(psd_t *s, psd_part_t *p, uint64_t v);
/* Answer every waiter of p with ERROR(code, text) (the job failed). */
void psd_waiters_fail(psd_t *s, psd_part_t *p, int code, const char *text);

/* ---- psd_jobfail.c: a failed worker stops the job ---- */
/* Record the failure (the first one wins), log it, answer every waiting
 * request of the job with ERROR(PS_EFAILED, text). */
void psd_jobfail(psd_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether m is a training request the failed job refuses (answered here). */
int psd_jobfail_refuse(psd_t *s, ps_wire_msg_t *m);
/* A HELLO of rank r after the failure: when every rank is back, the job
 * may start again (logged). */
void psd_jobfail_hello(psd_t *s, int r);

/* ---- psd_late.c: who the server waits for ---- */
/* Called by the handlers when a rank's gradient for p's current version
 * arrives (the first one starts p's wait). */
void psd_late_arrived(psd_t *s, psd_part_t *p, int rank);
/* A sync update of p is about to be applied: count the step of each rank
 * in it (steps per rank; on this server's first partition). */
void psd_late_applying(psd_t *s, const psd_part_t *p);
/* Seconds rank r has kept this server waiting (0: not late). */
double psd_late_seconds(const psd_t *s, int r);
/* One line of what this server waits for ("" when nothing): the barrier's
 * missing ranks, or the step and partitions the late ranks hold up. */
void psd_late_describe(const psd_t *s, char *buf, size_t len);
/* Timer: log that line every 10 s while a wait lasts over 10 s. */
void psd_late_check(psd_t *s);

/* ---- psd_members.c ---- */
int psd_members_set_count(psd_t *s, int nworkers, char *err, size_t errlen);
void psd_members_seen(psd_t *s, int rank);
/* A PUSH / PUSHPULL from rank: the job is under way here, the rank is in it. */
void psd_members_pushed(psd_t *s, int rank);
int psd_members_is_live(const psd_t *s, int rank);
int psd_members_live_count(const psd_t *s);
/* Rank r's gradient of version v / its barrier (v = UINT64_MAX: at the
 * newest membership) is waited for: it is in the job then, and live, or
 * lost / left under --on-worker-loss=wait. */
int psd_members_required(const psd_t *s, int r, uint64_t v);
/* HELLO: the rank welcomed, or -1 when refused; `refusal` (len bytes) is
 * set when the refusal keeps the job from starting (the caller stops it). */
int psd_handle_hello(psd_t *s, ps_wire_msg_t *m, char *refusal, size_t len);
void psd_handle_barrier(psd_t *s, ps_wire_msg_t *m);
/* BYE: PSD_BYE_REFUSED (not from the process that holds the rank), LEFT,
 * DONE, or FAILED (the caller stops the job: psd_jobfail).  After LEFT /
 * DONE the caller rechecks the pending sync updates (psd_recheck_pending). */
enum { PSD_BYE_REFUSED = 0, PSD_BYE_LEFT, PSD_BYE_DONE, PSD_BYE_FAILED };
int psd_handle_bye(psd_t *s, ps_wire_msg_t *m);
/* The rank of the process whose session m carries (-1: none bound). */
int psd_members_rank_of(const psd_t *s, const ps_wire_msg_t *m);
/* Answer every worker at the barrier with ERROR(code, text). */
void psd_members_fail_barrier(psd_t *s, int code, const char *text);
/* Tell every worker that said HELLO that this server shuts down (an
 * unsolicited SHUTDOWN, so it fails at once instead of timing out). */
void psd_members_notify_shutdown(psd_t *s, const char *why);
/* A sync step of rank r was counted (its first owned partition's push). */
void psd_members_count_step(psd_t *s, int r);
/* The steps each rank contributed as "[n0,n1,...]" (malloc'd, NULL: out of
 * memory), and back from a checkpoint's copy (entries past W ignored). */
char *psd_members_steps_json(const psd_t *s);
void psd_members_steps_load(psd_t *s, const char *json);
/* Timer: mark silent workers lost and release the barriers they block;
 * 1 when one was lost (the caller rechecks the pending sync updates). */
int psd_members_check(psd_t *s);

/* ---- psd_maxmsg.c: ZMQ_MAXMSGSIZE ---- */
/* Largest frame of any valid message about a partition of numel elements:
 * the header bound plus the worst case of every dtype x codec (top-k fp32
 * with k = numel: 8 bytes an element).  ZMQ_MAXMSGSIZE is checked per frame,
 * so the sum is an upper bound for each. */
int64_t psd_maxmsg_bound(size_t numel);
/* A table whose largest owned partition has max_numel elements is about to
 * be held.  Before the bind (checkpoint at start) its bound becomes
 * ZMQ_MAXMSGSIZE (unless --max-msg-mb is set); returns 0.  Once bound:
 * 0 if its messages fit ZMQ_MAXMSGSIZE, else PS_ERANGE with the cause
 * (naming the flag to raise) in err: the INIT is refused. */
int psd_maxmsg_for_table(psd_t *s, size_t max_numel, char *err, size_t errlen);
/* Just before the bind: set s->maxmsg and s->maxmsg_from from --max-msg-mb,
 * else the table loaded from a checkpoint, else --max-partition-bytes.
 * 0, or PS_ERANGE (logged) when --max-msg-mb is below the loaded table's. */
int psd_maxmsg_at_bind(psd_t *s);

/* ---- psd_reply.c: every send; counts bytes, drops (and counts) replies a
 * peer cannot take ---- */
int psd_send(psd_t *s, const void *id, size_t idlen, Ps__Header *h, const void *payload,
             size_t len);
/* ACK carrying only request_id. */
void psd_send_ack(psd_t *s, const void *id, size_t idlen, uint64_t request_id);
/* ERROR(code, text) answering req (may be NULL), counted by code and
 * logged (at most 20 lines a second). */
void psd_send_error(psd_t *s, const void *id, size_t idlen, const Ps__Header *req, int code,
                    const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* ERROR(PS_ESTATE) with PS_FLAG_REBUILD: this server holds nothing of the
 * job (text: why), the workers that keep state rebuild it. */
void psd_send_rebuild_error(psd_t *s, const void *id, size_t idlen, const Ps__Header *req,
                            const char *text);
/* ERROR(PS_ESTATE) with PS_FLAG_ROLLBACK and iteration = v. */
void psd_send_rollback_error(psd_t *s, const void *id, size_t idlen, const Ps__Header *req,
                             uint64_t v, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Log how many ERROR lines the rate limit held back (timer, exit). */
void psd_errors_log_flush(psd_t *s);
/* WEIGHTS of p at its version, zero-copy (ERROR if it cannot be encoded). */
void psd_send_weights(psd_t *s, const void *id, size_t idlen, uint64_t request_id, psd_part_t *p,
                      int dtype, int codec);
/* WEIGHTS of p at its version with PS_FLAG_STATE: raw fp32 weights then
 * momentum, for the worker that keeps p's state. */
void psd_send_state(psd_t *s, const void *id, size_t idlen, uint64_t request_id, psd_part_t *p);
/* WEIGHTS of p at version v exactly: its current weights, or those kept
 * from the version before (p->prevbuf); ERROR(PS_ESTATE) when neither is v. */
void psd_send_weights_of(psd_t *s, const void *id, size_t idlen, uint64_t request_id,
                         psd_part_t *p, uint64_t v, int dtype, int codec);
/* Codec of the WEIGHTS reply: Header.reply_codec when present (a PUSHPULL
 * whose gradient is TOPK / SIGN wants its weights exact), else the request's. */
int psd_reply_codec(const Ps__Header *h);
/* Keep m's routing identity for a later reply (at most 255 bytes); is it id? */
void psd_reply_keep_id(uint8_t dst[256], uint8_t *dlen, const ps_wire_msg_t *m);
int psd_reply_same_id(const uint8_t *id, size_t idlen, const ps_wire_msg_t *m);

/* ---- psd_skips.c: the sync steps skipped for a loss-scale overflow ---- */
/* Record that the update of version v was skipped (once per step). */
void psd_skips_add(psd_store_t *st, uint64_t v);
/* Forget the skips of versions >= v (a rollback to v). */
void psd_skips_cut(psd_store_t *st, uint64_t v);
/* "[v,...]" (malloc'd, NULL when out of memory). */
char *psd_skips_json(const psd_store_t *st);
/* Replace the list with a JSON array of versions (a checkpoint's); 0 or
 * PS_EINVAL with the cause in err. */
int psd_skips_parse(psd_store_t *st, const char *json, char *err, size_t errlen);

/* ---- psd_store.c ---- */
int psd_mode_parse(const char *s, psd_mode_t *m);
/* Hold sp's table (taken over, also on failure) and allocate this shard.
 * 0, or PS_E* with the cause in err, and then no table is held. */
int psd_store_hold(psd_t *s, psd_spec_t *sp, char *err, size_t errlen);
void psd_store_free(psd_store_t *st);
/* Sum slots in rank order / n, apply the optimizer, version++. */
void psd_store_apply_sync(psd_t *s, psd_part_t *p);
/* Async / ssp: apply grad * 1/W right away, version++. */
void psd_store_apply_async(psd_t *s, psd_part_t *p, const float *grad);
/* Encoded weights of p at its current version (new reference) or NULL. */
psd_buf_t *psd_store_encoded(psd_t *s, psd_part_t *p, int dtype, int codec, int *err);
/* The weights of the version before (p->prevbuf), encoded into a buffer of
 * their own (one reference, not cached: asked for only by a rejoining
 * worker), or NULL with *err. */
psd_buf_t *psd_store_encoded_prev(psd_t *s, psd_part_t *p, int dtype, int codec, int *err);
/* Forget the kept previous version (the weights were replaced). */
void psd_store_forget_prev(psd_part_t *p);
/* The weights of version prev_version (NULL: none kept). */
static inline float *psd_store_prev(const psd_part_t *p)
{
    return p->prevbuf ? (float *)p->prevbuf->data : NULL;
}
/* A buffer for the previous version's weights to be written into (the
 * rebuild from the workers' copies), NULL when out of memory. */
float *psd_store_prev_writable(psd_part_t *p);
void psd_store_drop_cache(psd_part_t *p);
/* Before writing p->w: drop the encoded replies and, when a zero-copy send
 * of the weights is still in flight, move them to a fresh buffer.  0, or
 * PS_ENOMEM (logged; the weights are then written in place). */
int psd_store_weights_writable(psd_t *s, psd_part_t *p);
/* Rank r's gradient for p's pending update (p->have[r] set): the message
 * held or being handled, else its slot. */
const float *psd_store_slot(const psd_part_t *p, int r);
/* Close the held messages (after an update, at exit). */
void psd_store_release_held(psd_part_t *p);
/* Forget the round in progress on p: the ranks' pushes (slots, held
 * messages, the direct one), the overflow flag, the late-rank clock.  Its
 * waiters are the caller's to answer. */
void psd_store_drop_pending(psd_t *s, psd_part_t *p);
/* Make sure the codec scratch holds n bytes; 0 or PS_ENOMEM. */
int psd_store_scratch(psd_store_t *st, size_t n);
int psd_store_nonfinite(psd_t *s, const float *g, size_t n);

#endif
