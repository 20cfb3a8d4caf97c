/* psworker: one data-parallel training process.  Its parts:
 *
 *   main.c             parse the options, set the task up, run a loop
 *   options.[ch]       the option groups and their checks
 *   task.h, tasks.c    the task table: smoke, video, detection, synthetic
 *   task_*.c           one task each (task_smoke.c with smoke_model.c /
 *                      smoke_data.c, task_video.c with task_video_setup.c /
 *                      task_video_eval.c, task_det.c, task_synthetic.c)
 *   loop_cluster.c     training through psd servers (sync / async / ssp)
 *   loop_ring.c        --mode allreduce: ring or NCCL, local update
 *   loop_standalone.c  --standalone: the one-process reference, and --eval
 *   overlap.c          --overlap: per-layer pushes and weight waits (cluster loop)
 *   step.c             what every loop does around a step: compute, loss
 *                      scaling (and its replay from the servers' verdicts),
 *                      the local update, device memory figures
 *   elastic.c          membership that changes at step boundaries (--join,
 *                      drain): the data split and batch of each step
 *   bn_cross.c         --bn sync: the group the model's BN layers combine
 *                      their statistics over (the job's ring, or a side ring)
 *   state.c            what follows from the step alone (BN
 *                      num_batches_tracked, the dropout counter), set
 *                      before each compute
 *   client.c           the psd client from the options (HELLO, rank)
 *   optim.c            the optimizer configuration and the INIT spec
 *   output.c           CSV, progress lines, the model file, final-line helpers,
 *                      the run's plots (worker/plot/)
 *   metrics.c          --metrics-port: this worker's /metrics
 *
 * The loops see a ps_worker_t and its task (task.h); task state is the
 * task's own (p->ts). */
#ifndef PS_PSWORKER_H
#define PS_PSWORKER_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ps_codec.h"
#include "ps_optim.h"
#include "ps_partition.h"
#include "worker/engine/ps_engine.h"
#include "worker/engine/ps_loss_scale.h"
#include "worker/psworker/options.h"
#include "worker/psworker/task.h"

/* Running sums for the summary and the CSV. */
typedef struct ps_worker_stats {
    double t_start;               /* seconds (monotonic) when training started */
    double sum_step, sum_compute, sum_comm;  /* seconds over counted steps */
    double sum_data;              /* of which waiting for data */
    uint64_t counted;             /* steps in those sums */
    uint64_t samples;             /* samples this process computed on */
    double recent_loss[10];       /* last losses */
    uint64_t nloss;
    uint64_t stale_drops;         /* gradients refused as too stale (ssp) */
    uint64_t wire_sent, wire_recv;/* bytes this rank sent / received while training */
} ps_worker_stats_t;

/* Device memory over the run (engine models on a device that reports it). */
typedef struct ps_worker_devmem {
    size_t alloc_peak, used_peak, total; /* bytes */
} ps_worker_devmem_t;

typedef struct ps_worker_metrics ps_worker_metrics_t; /* metrics.c */

typedef struct ps_worker {
    const ps_worker_opts_t *o;
    const ps_task_t *task;
    void *ts;               /* the task's state */
    /* the engine the task's model runs on (NULL: not an engine model) */
    const ps_backend_t *be;
    ps_ctx_t *ctx;
    int rank, nworkers, batch;    /* this process's rank, W, samples per step */
    ps_partition_table_t table;
    ps_optim_config_t optim;
    size_t numel;
    size_t nparam_numel;    /* p->grad[0..this) are trainable parameters; the rest
                               (BN running statistics) are not gradients */
    float *w;       /* (numel) current weights, model order */
    float *grad;    /* (numel) this step's mean gradient */
    float *mom;     /* (numel) momentum buffers (local update only) */
    double t_data;  /* seconds the last compute waited for data */
    /* what loading the last compute's batch cost (the loader's threads; 0
     * for tasks that do not measure it): encoded bytes read, seconds reading
     * them and seconds decoding them into the input */
    uint64_t data_bytes;
    double t_read, t_decode;
    int compute_rc; /* PS_E* when the last compute failed for a reason other
                       than divergence (already logged) */
    FILE *csv;
    ps_worker_metrics_t *mx;  /* --metrics-port: the /metrics snapshot (NULL: off) */
    ps_worker_stats_t st;
    ps_worker_devmem_t devmem;
    size_t arena_peak;      /* bytes: the most the engine's model arenas held at once */
    int rollback;           /* sync: a server asked to roll back (restarted from a checkpoint) */
    uint64_t rollback_to;   /* the lowest version asked for this step */
    int behind;             /* sync: the servers went on without this rank (it
                               was lost under --on-worker-loss continue) */
    uint64_t rebuild;       /* sync: servers that restarted empty (PS_FLAG_REBUILD),
                               bit s for server s (bit 63: 63 and above) */
    int resync;             /* sync: replies of this step given up on when a
                               server said it is being rebuilt (they may wait
                               on a worker that waits for it): pull again */
    unsigned rebuilds_seen; /* ps_client_rebuilds when the last rebuild ended */
    /* loss scaling: identical on every worker, each feeds it the cluster's
     * verdict; this step's backend part (step.c) */
    ps_loss_scale_t ls;
    int ls_in_backend;      /* the backend scaled this step's loss itself */
    size_t ls_scaled_numel; /* ... which scaled p->grad[0..this) */
    /* the model's step counters (BN num_batches_tracked), set from the step
     * before each compute (state.c) */
    struct ps_worker_counter *counters;
    int ncounters;
    /* sync through servers: the steps each rank contributed, as the servers
     * counted them ("140,140"; a lost rank under --on-worker-loss continue
     * shows fewer), for the final line; "" otherwise */
    char rank_steps[256];
    /* elastic membership (elastic.c): the epochs known, W and B the job
     * started with; before each compute: this rank's place among the
     * ranks of the step (shard) and the step's first sample */
    struct ps_worker_epoch *epochs;
    int nepochs;
    int w0, b0;
    int shard;
    uint64_t step_first;
    int drain_asked;        /* SIGTERM: this worker asked server 0 to drain it */
    uint64_t join_at;       /* --join: the first step of this rank (server 0's WELCOME) */
    int drained;            /* this rank left the job (its steps end at steps_done) */
    uint64_t steps_done;
    /* --bn sync (bn_cross.c): the task's setup sets bn_cross to its
     * model's BN channel count when its BN layers want the group; the loop
     * then gives the context the group (the job's allreduce in ring mode,
     * a side ring in PS mode) */
    int bn_cross;
    ps_bn_group_t bn_group;
    struct ps_allreduce *bn_ar; /* PS mode: the side ring (owned) */
    int bn_lfd;                 /* PS mode: its listening socket until the ring takes it */
    char bn_endpoint[160];      /* PS mode: where it listens, sent in HELLO */
} ps_worker_t;

/* step.c: what every loop does around a step. */
/* The task's setup, with the common state; ps_worker_teardown frees both. */
int ps_worker_setup(ps_worker_t *p, const ps_worker_opts_t *o, uint32_t nservers);
void ps_worker_teardown(ps_worker_t *p);
/* The engine's threads and --device for a task's model: *be and p->be /
 * p->ctx set; a device that cannot be used is PS_EINVAL (logged, exit 2). */
int ps_worker_open_device(ps_worker_t *p, ps_ctx_t *ctx, const ps_backend_t **be);
/* Output files and the task's start: once the rank is known, before step 0. */
int ps_worker_start(ps_worker_t *p);
/* The task's compute of `step` (after --step-sleep-ms). */
double ps_worker_compute(ps_worker_t *p, uint64_t step);
/* 0, or the PS_E* of a non-finite loss (the cause logged once). */
int ps_worker_check_loss(const ps_worker_t *p, double loss, uint64_t step);
/* The task's periodic validation after `step` steps (0 without one). */
int ps_worker_validate(ps_worker_t *p, uint64_t step);
/* --val-every says `step` validates (and it is not the last step). */
int ps_worker_val_due(const ps_worker_t *p, uint64_t step);
/* Dynamic loss scaling around a step's compute (PS and ring mode share it:
 * same scaling, same log lines, which the tests compare across modes).
 * begin: before the backward (the task may hand the scale to its backend);
 * prepare: p->grad := the backward of scale*loss, checked, unscaled when
 * clean; returns 1 when this worker overflowed; finish: the step's
 * cluster-wide verdict (where: for the log), returns 1 = apply, 0 = skip;
 * report: the final line.  No-ops (prepare 0, finish 1) without it. */
void ps_worker_ls_begin(ps_worker_t *p);
int ps_worker_ls_prepare(ps_worker_t *p, uint64_t step);
int ps_worker_ls_finish(ps_worker_t *p, uint64_t step, const char *where, int verdict);
void ps_worker_ls_report(const ps_worker_t *p);
/* Sync: the scaler as an uninterrupted run holds it before `step`: from its
 * start, over steps 0..step-1 with the cluster's verdicts (skips: the steps
 * whose update the servers skipped, ascending).  A worker that resumes or
 * rolls back calls it.  0, or the PS_E* of the scaler's settings. */
int ps_worker_ls_replay(ps_worker_t *p, uint64_t step, const uint64_t *skips, size_t n);
#define PS_WORKER_LS_WHERE(local) ((local) ? "on this worker" : "on another worker")
/* The step's update on this worker's own fp32 master copy (--standalone,
 * ring mode): ps_optim over every partition of p->grad into p->w / p->mom.
 * 0 or the optimizer's PS_E* (logged). */
int ps_worker_apply_local(ps_worker_t *p, uint64_t step);
/* Device memory after a step's backward (the peak is there) and the line
 * before "final:"; nothing where the backend has no figures. */
void ps_worker_devmem_step(ps_worker_t *p, uint64_t step);
void ps_worker_devmem_report(const ps_worker_t *p);
/* After the last step: the loss-scale summary, the model file, the device
 * memory line and the task's final line.  0 or the save's PS_E*. */
int ps_worker_finish(ps_worker_t *p, uint64_t steps_done);

/* state.c: what follows from the step alone (the model's step counters,
 * its dropout counter), set before each compute so a restarted or rolled
 * back run holds what an uninterrupted one does.  init after the task's
 * setup (their values at step 0); at: set them for `step`; spec: the INIT
 * spec's ",\"counters\":[...]" member into buf (cap bytes; buf NULL:
 * measure), returns its length (0: none). */
int ps_worker_state_init(ps_worker_t *p);
void ps_worker_state_at(ps_worker_t *p, uint64_t step);
void ps_worker_state_free(ps_worker_t *p);
size_t ps_worker_state_spec(const ps_worker_t *p, char *buf, size_t cap);

/* elastic.c: membership that changes at step boundaries.  init: the
 * starting epoch (W0 = p->nworkers, B0 = p->batch); at: set p->nworkers,
 * p->batch, p->shard and p->step_first for `step`, 1 when this rank is in
 * the job then; set: the epochs from server 0 (JSON [[from,[ranks]],...]),
 * 0 or PS_E* (logged; PS_EUNSUPPORTED for a task without PS_TASK_ELASTIC). */
int ps_worker_elastic_init(ps_worker_t *p);
int ps_worker_elastic_at(ps_worker_t *p, uint64_t step);
int ps_worker_elastic_set(ps_worker_t *p, const char *json);
void ps_worker_elastic_free(ps_worker_t *p);

/* bn_cross.c: --bn sync.  Each returns 0 at once when the task wants no
 * group (bn_cross 0) or W is 1.  use: ring mode, over the job's allreduce;
 * prepare (PS mode, before HELLO): bind the BN ring's port, p->bn_endpoint;
 * open_side (PS mode, after the start barrier): the side ring from server
 * 0's list of endpoints; both end with a handshake that names a missing or
 * mismatched peer within seconds.  0 or PS_E* (logged).  close: detach and
 * free (before the allreduce it uses is closed). */
struct ps_allreduce;
struct ps_client;
int ps_worker_bn_use(ps_worker_t *p, struct ps_allreduce *ar);
int ps_worker_bn_prepare(ps_worker_t *p);
int ps_worker_bn_open_side(ps_worker_t *p, struct ps_client *c);
void ps_worker_bn_close(ps_worker_t *p);

/* optim.c */
int ps_worker_build_optim(ps_worker_t *p);
/* The momentum the worker's error feedback keeps (DGC momentum correction:
 * --dgc-momentum with topk/sign pushes to servers), 0 when the servers keep
 * it; ps_worker_build_optim then gives the servers momentum 0. */
float ps_worker_ef_momentum(const ps_worker_opts_t *o);
/* --topk-warmup-steps with -1 (auto) resolved. */
uint64_t ps_worker_topk_warmup(const ps_worker_opts_t *o);
/* The INIT spec JSON (docs/protocol.md); malloc'd, NULL on failure. */
char *ps_worker_spec_json(const ps_worker_t *p);

/* client.c: the client for --servers (CURVE keys, wire options, timeouts),
 * HELLO, rank checks against --rank / --num-workers; sets p->rank and the
 * log tag.  *c is NULL unless 0 is returned. */
struct ps_client;
int ps_worker_client_connect(ps_worker_t *p, struct ps_client **c);

/* The three loops: 0 or a negative PS_E* (already reported). */
int ps_worker_run_cluster(ps_worker_t *p);
int ps_worker_run_ring(ps_worker_t *p);
int ps_worker_run_standalone(ps_worker_t *p);
int ps_worker_run_eval(ps_worker_t *p);
/* --export-onnx: the task's model as ONNX (loop_standalone.c). */
int ps_worker_run_export(ps_worker_t *p);
/* loop_cluster.c: wait for partition i's request req[i] of `step` and run
 * every check of a cluster step on it (verdict, rollback, stale re-pull
 * into dst, version); 0 or the PS_E*, the step's first error kept (and
 * logged once) in *first_rc.  overlap.c completes replies with it. */
struct ps_req;
int ps_worker_part_complete(ps_worker_t *p, struct ps_client *c, struct ps_req **req,
                            uint64_t *ver, uint32_t i, float *dst, uint64_t step, int sync,
                            int *remote_ovf, int *first_rc);

/* overlap.c: --overlap.  Each partition's PUSHPULL leaves as soon as the
 * model's backward made its gradient final (ps_model_set_hooks), and the
 * next forward waits, layer by layer, only for the partitions that layer
 * reads.  Replies land in a second buffer and are checked with
 * ps_worker_part_complete as they are needed.  new: *out NULL (and 0
 * returned) when overlap does not apply (logged). */
typedef struct ps_worker_overlap ps_worker_overlap_t;
int ps_worker_overlap_new(ps_worker_t *p, struct ps_client *c, struct ps_req **req, uint64_t *ver,
                          int sync, ps_worker_overlap_t **out);
/* Around the compute of `step`: begin arms the hooks; end pushes what the
 * hooks did not (nothing once a rollback or an error was seen: no gradient
 * of mixed weights leaves) and returns 0 or the step's first error;
 * *t_wait: seconds the step spent blocked on replies. */
void ps_worker_overlap_begin(ps_worker_overlap_t *ov, uint64_t step);
int ps_worker_overlap_end(ps_worker_overlap_t *ov, double *t_wait);
/* Complete every partition in flight (into p->w, all checks): before
 * anything that reads all the weights (validation, save, rollback, end);
 * *remote_ovf |= any OVERFLOW verdict.  0 or the first error. */
int ps_worker_overlap_wait_all(ps_worker_overlap_t *ov, int *remote_ovf);
void ps_worker_overlap_free(ps_worker_overlap_t **ov);

/* output.c */
double ps_worker_now(void);
/* The per-step CSV (metrics-rankR.csv); 0 or PS_E*. */
int ps_worker_output_open(ps_worker_t *p);
/* mkdir -p; 0 or PS_E* (logged). */
int ps_worker_make_dirs(const char *path);
/* Rank 0 with --out: DIR/val.csv (val-standalone.csv) created with its
 * header line, line-buffered, in *f; else *f NULL.  0 or PS_EIO (logged). */
int ps_worker_val_csv_open(const ps_worker_t *p, const char *header, FILE **f);
void ps_worker_record_step(ps_worker_t *p, uint64_t step, double loss, double t_step,
                           double t_compute, double t_comm);
/* The task's model file (rank 0; every rank with --save-all-ranks). */
int ps_worker_save_model(ps_worker_t *p);
/* The model arenas' bytes now, the peak kept in p->arena_peak (host or
 * managed memory: CPU and CUDA alike; static within a run, so its peak is
 * its size), for the progress and final lines. */
size_t ps_worker_arena_peak(ps_worker_t *p);
/* Mean of the last (up to 10) losses; NAN before any step. */
double ps_worker_recent_loss(const ps_worker_t *p);
/* Samples per second over the counted steps. */
double ps_worker_per_s(const ps_worker_t *p);
/* " rank_steps=A,B out=DIR model=model.safetensors" (rank 0) at the end of
 * a final: line. */
void ps_worker_print_out(const ps_worker_t *p);
/* Rank 0 with --out and --plots 1, after its loop (done or failed): the
 * run directory's PNG plots (worker/plot/ps_plot.h).  A plot that cannot
 * be made (gnuplot missing, ...) is a warning saying how to make it later,
 * never a failed run. */
void ps_worker_plot(const ps_worker_t *p);

/* metrics.c: --metrics-port.  start: once the rank is known (0, or the
 * listener's PS_E*, logged); step: after each step, t = {step, data wait,
 * compute, comm wait} seconds; stop: in teardown.  No-ops when off. */
int ps_worker_metrics_start(ps_worker_t *p);
void ps_worker_metrics_step(ps_worker_t *p, uint64_t step, double loss, float lr,
                            const double t[4]);
void ps_worker_metrics_stop(ps_worker_t *p);
#endif
