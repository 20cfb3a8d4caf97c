/* Worker-side client of psd (docs/protocol.md).
 *
 * One DEALER socket per server, owned by a background I/O thread (ZeroMQ
 * sockets are not thread-safe); callers submit requests and get completion
 * handles.  Several requests are in flight at once; queued requests go out
 * front-of-model first (lower partition id = higher priority), so the first
 * layers' weights come back first.  Replies are decoded straight into the
 * caller's buffer; encode buffers are reused, never allocated per message.
 * Requests are idempotent (keyed by rank, partition and iteration), so a
 * request unanswered after retry_ms is sent again (a restarted server or a
 * lost connection costs a retry, never a doubled update). */
/* Flow control, and why it cannot deadlock a sync cluster.
 *
 * A sync server answers a worker's PUSH / PUSHPULL of partition p only once
 * every worker pushed p; a PULL with min_version > 0 and a BARRIER also wait
 * for the others.  Were such requests held back until earlier replies came
 * (a window of N requests awaiting replies), two workers could fill their
 * windows with different partitions (priority sends the lowest queued id
 * first, and workers that push one by one during backward queue them at
 * different times): each server then waits for a copy the other worker
 * never sends, and no window ever frees.  So the rule is:
 *  - a request whose reply may depend on another worker (PUSH, PUSHPULL,
 *    PULL with min_version > 0, BARRIER, HELLO, and all control messages)
 *    is never held back by an outstanding reply;
 *  - pushes are bounded instead by send_queue_bytes: payload bytes handed
 *    to ZeroMQ and not yet written to the socket.  That frees as soon as
 *    ZeroMQ has sent the bytes (psd reads its socket whatever it waits
 *    for), never by a reply, and keeps the send queue short so a
 *    front-of-model partition submitted later still overtakes queued
 *    back-of-model ones; ZMQ_SNDHWM and a full TCP buffer push back the
 *    same way;
 *  - max_inflight bounds only requests the server answers by itself
 *    (PULL with min_version 0, INIT weights), to cap the replies arriving
 *    at once.
 * Every wait of the client is thus on the server's own progress, never on
 * another worker's, for any max_inflight, send_queue_bytes and order of
 * submission. */
#ifndef PS_CLIENT_H
#define PS_CLIENT_H
#include <stddef.h>
#include <stdint.h>

#include "ps_codec.h"
#include "ps_partition.h"

#define PS_CLIENT_SEND_QUEUE_DEFAULT ((size_t)16 << 20)

typedef struct ps_client ps_client_t;
typedef struct ps_req ps_req_t;   /* completion handle; owned by the client */

typedef struct ps_client_opts {
    const char *const *servers;  /* "tcp://host:port", index = server id */
    int nservers;
    int rank;                    /* -1: let server 0 assign */
    int num_workers;             /* expected cluster size (sent in HELLO) */
    const char *hello_endpoint;  /* sent in HELLO for server 0's STATS: this
                                    worker's cross-worker BN ring (NULL none;
                                    must outlive the client) */
    ps_dtype_t dtype;            /* wire dtype of gradients and pulled weights
                                    (partitions flagged PS_PART_EXACT, e.g. BN
                                    statistics, always go raw fp32 both ways) */
    ps_codec_t codec;            /* pushed gradients: raw, lz4, or the lossy topk /
                                    sign, which go through error feedback (ps_ef.h) */
    int timeout_ms;              /* give up on a request after this, counted from
                                    submission, queueing included (0 = never) */
    int retry_ms;                /* resend an unanswered request after this, then
                                    after 2x, 4x ... up to 60 s (0 = off) */
    int heartbeat_ms;            /* HEARTBEAT period to every server (0 = off) */
    int stall_warn_ms;           /* log a warning naming the server, its endpoint,
                                    the message, partitions and step when requests
                                    of a server stay unanswered this long, then at
                                    2x, 4x ... up to every 60 s (0 = off; default
                                    10 s) */
    int max_inflight;            /* PULLs of the current weights (min_version 0) and INIT
                                    weights outstanding per server (default 8);
                                    these are answered by the server on its own.
                                    Never bounds requests whose reply may wait
                                    on other workers (see "Flow control") */
    size_t send_queue_bytes;     /* per server: PUSH / PUSHPULL payload bytes
                                    handed to ZeroMQ but not yet written to the
                                    socket (default 16 MiB; 0 = default); a
                                    larger payload still goes out alone */

    /* Compressed pushes.  Weights are never sent lossy: pulls and
     * the WEIGHTS of a PUSHPULL use pull_codec. */
    int pull_codec;              /* PS_CODEC_RAW or PS_CODEC_LZ4; -1 (default):
                                    codec when that is raw/lz4, else raw */
    float topk_ratio;            /* topk: fraction of elements sent, in (0, 1];
                                    0 (default) = PS_CODEC_TOPK_DEFAULT_RATIO */
    int ef_rounding;             /* fp16/bf16 raw/lz4 pushes: feed the rounding
                                    error back too (default 0: plain rounding) */
    float ef_momentum;           /* topk / sign: DGC momentum correction with this
                                    momentum (ps_ef.h); the servers must then run
                                    plain SGD on these partitions (default 0 = off) */
    int ef_nesterov;             /* ... with Nesterov's form of it */
    uint64_t topk_warmup_steps;  /* topk: density warm-up over the first iterations,
                                    25% down to topk_ratio (ps_ef_topk_warmup_ratio;
                                    default 0 = off) */
    int keep_state;              /* sync: keep an exact copy (weights of two versions,
                                    momentum) of 1/W of the partitions (the j-th of
                                    server s is kept by rank (s + 1 + j) mod W),
                                    brought by their PUSHPULL replies, so a
                                    server that lost everything is rebuilt
                                    (ps_client_rebuild; default 0) */

    /* CURVE: all three set = encrypted, authenticated connections;
     * all unset = plain TCP.  Files hold one Z85 key (40 characters), as
     * `psctl keygen PREFIX` writes PREFIX.pub / PREFIX.key. */
    const char *const *curve_server_keys; /* public key file(s) of the servers:
                                    1 entry (shared by all) or nservers entries */
    int ncurve_server_keys;
    const char *curve_public_key;  /* this client's public key file */
    const char *curve_secret_key;  /* this client's secret key file */
} ps_client_opts_t;

/* Defaults: rank -1, num_workers 1, fp32/raw, timeout 300 s, retry 5 s (a
 * sync PUSHPULL legitimately waits for the slowest worker, and every resend
 * costs a whole gradient of bandwidth), heartbeat 1 s, max_inflight 8, send_queue_bytes 16 MiB. */
void ps_client_opts_default(ps_client_opts_t *o);

/* Connect (does not block on the servers being up). t must outlive c.
 * The first client of a process also raises glibc's mmap threshold (large
 * receive buffers are then reused instead of page-faulted in per message;
 * set PS_NO_MALLOC_TUNE in the environment to keep glibc's defaults). */
int ps_client_new(ps_client_t **c, const ps_client_opts_t *o, const ps_partition_table_t *t);
/* Send BYE (waiting up to 300 ms for the ACKs), stop the I/O thread, close
 * sockets, free; NULLs *c.  Requests still outstanding complete with
 * PS_ESHUTDOWN and their handles die with the client: no thread may be
 * waiting on c any more. */
void ps_client_destroy(ps_client_t **c);

/* HELLO to server 0, which assigns the rank, then with that rank to every
 * other server (each binds the rank to this process's session token):
 * returns the rank (>= 0) or a negative PS_E*. */
int ps_client_hello(ps_client_t *c);
/* Elastic sync jobs (psd --max-workers above --num-workers):
 * join: HELLO with PS_FLAG_JOIN instead: server 0 gives a new rank, in the
 * job from step *from on; returns the rank or PS_E*.
 * members: the membership epochs (JSON [[from,[ranks]],...], from server
 * 0's STATS "epochs") to every server; a worker does it before it pushes
 * the first step of a new epoch.  0 or PS_E*.
 * drain: ask server 0 to take `rank` out of the job; *from = its first step
 * without it.  0 or PS_E* (text in last_error).
 * epochs_seen: the most membership epochs any reply named (a change to
 * fetch when above what the caller knows). */
int ps_client_join(ps_client_t *c, uint64_t *from);
int ps_client_members(ps_client_t *c, const char *json);
int ps_client_drain(ps_client_t *c, int rank, uint64_t *from);
unsigned ps_client_epochs_seen(const ps_client_t *c);

/* How this worker's BYE (at ps_client_destroy) ends its part in the job:
 * PS_CLIENT_DONE, it finished; PS_CLIENT_FAILED, it failed with `code` and
 * `text` (the servers stop the job and give every worker that error);
 * PS_CLIENT_LEFT (the default until one of the others is set), it left
 * early.  Call before ps_client_destroy; the last call wins. */
enum { PS_CLIENT_LEFT = 0, PS_CLIENT_DONE = 1, PS_CLIENT_FAILED = 2 };
void ps_client_set_outcome(ps_client_t *c, int outcome, int code, const char *text);
int ps_client_rank(const ps_client_t *c);

/* Rank 0 only: send the model spec (JSON, see docs/protocol.md) to every
 * server and then the initial fp32 weights (flat vector of the whole model,
 * t->total_numel elements) for every partition.  *from_ckpt is set when the
 * servers already held state from a checkpoint (weights were not sent). */
int ps_client_init(ps_client_t *c, const char *spec_json, const float *flat_weights,
                   int *from_ckpt);

/* Asynchronous requests on partition `part`.  grad / dst point to that
 * partition's elements (t->parts[part].numel floats) and must stay valid
 * until ps_client_wait returned for the request (with fp32/raw the gradient
 * is sent zero-copy from grad; other wire formats encode it during the
 * call, into a per-partition buffer that is reused).  *req receives a
 * handle to wait on; every handle must be waited for exactly once (the pool
 * holds 4 per partition plus 4*max_inflight per server; when it is empty
 * the call fails with PS_EAGAIN).  Returns 0 or PS_ERANGE (partition),
 * PS_EINVAL (NULL buffer), PS_EAGAIN, PS_ENOMEM, or an encode error.
 * push: gradient for `iteration`; flags = PS_FLAG_* (ps_wire.h).
 * pull: weights with version >= min_version into dst; *version is set.
 * pushpull: push, then the updated weights (version iteration+1) into dst. */
int ps_client_push(ps_client_t *c, uint32_t part, uint64_t iteration, const float *grad,
                   uint32_t flags, ps_req_t **req);
int ps_client_pull(ps_client_t *c, uint32_t part, uint64_t min_version, float *dst,
                   ps_req_t **req);
int ps_client_pushpull(ps_client_t *c, uint32_t part, uint64_t iteration, const float *grad,
                       float *dst, uint32_t flags, ps_req_t **req);
/* pull_exact (sync): the weights of exactly `version` (PS_FLAG_EXACT): the
 * current ones, or those of the version before, which a sync server keeps;
 * waits while the partition is below it, and fails with PS_ESTATE when it
 * is further ahead.  A worker that died between its pushes of a step finds
 * some partitions one update ahead and computes the step from these. */
int ps_client_pull_exact(ps_client_t *c, uint32_t part, uint64_t version, float *dst,
                         ps_req_t **req);
/* pull with Header.flags (PS_FLAG_REBUILD: wait for the partition's INIT on a
 * server being rebuilt, instead of an error). */
int ps_client_pull_ex(ps_client_t *c, uint32_t part, uint64_t min_version, uint32_t flags,
                      float *dst, ps_req_t **req);

/* Wait for one request (timeout_ms < 0: forever).  Returns the request's
 * result: 0, or the server's PS_E* code (its text via ps_client_last_error),
 * or PS_ETIMEOUT.  *version (may be NULL) gets the weights' version.  The
 * handle is released by this call unless it returned PS_ETIMEOUT due to
 * timeout_ms (then wait again). */
int ps_client_wait(ps_client_t *c, ps_req_t *req, int timeout_ms, uint64_t *version);
/* ps_client_wait that tells the two PS_ETIMEOUTs apart: *still_pending (may
 * be NULL) is 1 when timeout_ms ran out and the handle is still live (wait
 * again), 0 when the handle was released (the request itself completed,
 * possibly with PS_ETIMEOUT after opts.timeout_ms). */
int ps_client_wait_ex(ps_client_t *c, ps_req_t *req, int timeout_ms, uint64_t *version,
                      int *still_pending);
/* ps_client_wait that also returns the reply's Header.flags in *flags (may
 * be NULL; 0 when the reply had none or the request failed locally): on the
 * WEIGHTS of a PUSHPULL / PULL, PS_FLAG_OVERFLOW means the update that
 * produced that version was skipped for a loss-scale overflow on some
 * worker; on a PS_ESTATE ERROR, PS_FLAG_ROLLBACK means the server restarted
 * from an older checkpoint and *version is its version (ps_client_rollback). */
int ps_client_wait_flags(ps_client_t *c, ps_req_t *req, int timeout_ms, uint64_t *version,
                         uint32_t *flags);
/* How many replies so far said a server is being rebuilt (PS_FLAG_REBUILD
 * on an ERROR to a live request).  A training loop that waits on the other
 * requests of its step -- which may wait on a worker that waits for this
 * rebuild -- stops waiting once it moves (ps_client_wait_unless). */
unsigned ps_client_rebuilds(const ps_client_t *c);
/* ps_client_wait_flags (forever) that gives up once ps_client_rebuilds(c)
 * != seen while the request is still pending: then it returns PS_EAGAIN
 * with *pending = 1 and the handle stays live (ps_client_cancel it, or
 * wait again).  *pending = 0 on every other return (handle released). */
int ps_client_wait_unless(ps_client_t *c, ps_req_t *req, unsigned seen, uint64_t *version,
                          uint32_t *flags, int *pending);
/* Stop waiting for a submitted request: the I/O thread drops it (a reply
 * that comes later is ignored), and the handle is released.  Returns once
 * ZeroMQ holds none of its frames, so its buffers may be reused.  What was
 * already sent stays sent: a server may still apply a push. */
void ps_client_cancel(ps_client_t *c, ps_req_t *req);
/* Text of the last error of the client (server's ERROR text or local cause). */
const char *ps_client_last_error(const ps_client_t *c);

/* Blocking conveniences. */
int ps_client_barrier(ps_client_t *c);
/* STATS of one server: *json is malloc'd (caller frees).  _ex: with
 * Header.flags (PS_FLAG_PREFLIGHT: psctl check's members too). */
int ps_client_stats(ps_client_t *c, int server, char **json);
int ps_client_stats_ex(ps_client_t *c, int server, uint32_t flags, char **json);
int ps_client_checkpoint(ps_client_t *c, int server);
/* Sync mode, after a server restarted from an older checkpoint: a push or
 * pushpull then fails with PS_ESTATE and reply flag PS_FLAG_ROLLBACK
 * (ps_client_wait_flags), its *version being the server's version V.  This
 * sends ROLLBACK(*version) to every server in turn: each restores its
 * aligned checkpoint of that version (psd --checkpoint-every-steps);  a
 * server that is further behind makes *version its own and all are asked
 * again.  Returns 0 once every server is at *version (then pull every
 * partition and recompute from step *version), or PS_E* (e.g. PS_ENOTFOUND:
 * a server has no checkpoint of that version; text in last_error). */
int ps_client_rollback(ps_client_t *c, uint64_t *version);
/* Sync with keep_state, after a push failed with PS_ESTATE and reply flag
 * PS_FLAG_REBUILD (the server restarted empty): give server `server` the
 * spec and the state of the partitions this worker keeps (their version,
 * and the weights of the one before).  Every worker calls it; then each
 * pulls with ps_client_pull_ex(..., PS_FLAG_REBUILD, ...), which waits for
 * the partitions other workers give back.  0 or PS_E*. */
int ps_client_rebuild(ps_client_t *c, int server, const char *spec_json);
/* keep_state: the INIT spec (copied), which the client sends a server that
 * lost its state the moment it says so, with the partitions kept here. */
int ps_client_set_spec(ps_client_t *c, const char *spec_json);
int ps_client_shutdown_servers(ps_client_t *c);

/* Error feedback of topk / sign (and ef_rounding) pushes: each partition's
 * gradient is compressed once per iteration (a re-push of the same
 * iteration resends the same bytes), what was not sent is carried into the
 * next step.  A step whose gradient holds NaN/Inf (a loss-scale overflow)
 * goes out flagged PS_FLAG_OVERFLOW with a raw fp32 payload the server does
 * not read, and leaves the residuals alone; so does a push the caller flags
 * PS_FLAG_OVERFLOW itself.
 * ps_client_ef_reset: forget every residual (call it after the servers'
 * weights were restored from a checkpoint; ps_client_init does it when any
 * server says it restored one).  ps_client_ef_residual: partition part's
 * residual (numel floats), NULL without error feedback or for a bad part;
 * do not read it while a push of that partition is being submitted. */
void ps_client_ef_reset(ps_client_t *c);
const float *ps_client_ef_residual(const ps_client_t *c, uint32_t part);

/* Read a Z85 CURVE key file (40 key characters, surrounding whitespace and a
 * trailing newline allowed) into out (NUL-terminated).  Returns 0, PS_EIO
 * (cannot open/read: the message names the file and errno) or PS_EINVAL
 * (wrong length, a character outside Z85, more than one key); logged. */
int ps_client_load_z85_key(const char *path, char out[41]);

/* Wire counters of this client (bytes sent / received, requests, retries). */
typedef struct ps_client_counters {
    uint64_t bytes_out, bytes_in, requests, retries, errors;
} ps_client_counters_t;
void ps_client_counters(const ps_client_t *c, ps_client_counters_t *out);
#endif
