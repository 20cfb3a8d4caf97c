/* psworker internals shared by its files: the run options, the per-process
 * trainer state, and the pieces of a training run (model glue, the two
 * training loops, metrics output).
 *
 *   psworker_main.c    options (flags / config file), validation, dispatch
 *   psworker_model.c   model + data + partition table + optimizer config
 *   psworker_train.c   the cluster loop (psd) and the standalone loop
 *   psworker_overlap.c --overlap: per-layer pushes and weight waits (cluster loop)
 *   psworker_output.c  CSV, progress lines, model file, final summary
 *   psworker_video.c   TSM / TSN models on the video data pipeline */
#ifndef PS_PSWORKER_H
#define PS_PSWORKER_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ps_codec.h"
#include "ps_optim.h"
#include "ps_partition.h"
#include "worker/psworker/smoke_data.h"
#include "worker/psworker/smoke_model.h"
#include "worker/engine/ps_loss_scale.h"

/* Everything a run is configured with (flags / config keys of the same name). */
typedef struct ps_worker_opts {
    char *servers;          /* "tcp://h:p,tcp://h:p" (server 0 first) */
    int rank;               /* -1: assigned by server 0 */
    int num_workers;        /* W */
    char *model;            /* "smoke" */
    char *mode;             /* sync|async|ssp: what the servers run (checks only) */
    uint64_t steps;
    int batch;              /* B: samples per worker per step */
    float lr, momentum, dampening, weight_decay, gamma, warmup_factor, min_lr;
    int nesterov;
    int ref_batch;          /* linear scaling rule reference batch (0 = off) */
    uint64_t warmup_steps;
    char *schedule;         /* const|step|cosine */
    char *milestones;       /* "30,60" (steps) */
    char *dtype;            /* wire dtype */
    char *codec;            /* pushes: raw|lz4|topk|sign */
    char *pull_codec;       /* pulls / weights: raw|lz4 ("" = follows codec) */
    float topk_ratio;       /* topk: fraction of elements sent (0 = default) */
    int ef_rounding;        /* fp16/bf16 pushes: feed the rounding error back */
    int dgc_momentum;       /* topk/sign: momentum on the worker (DGC momentum
                               correction), plain SGD on the servers; 1 on,
                               0 off, -1 auto (ps_worker_ef_momentum) */
    int topk_warmup_steps;  /* topk: density warm-up steps (-1 = auto: steps / 4) */
    char *curve_server_keys;/* CURVE: server public key file(s), comma-separated */
    char *curve_public_key; /* CURVE: this worker's public key file */
    char *curve_secret_key; /* CURVE: this worker's secret key file */
    char *device;           /* cpu | cuda | cuda:N (video models) */
    char *bn;               /* video: BN mode train|partial|frozen ("" = --partial-bn) */
    uint64_t partition_bytes;
    uint64_t seed;          /* weights init */
    uint64_t data_seed;     /* generated dataset */
    char *out;              /* run directory ("" = none) */
    char *log_level;
    int standalone;         /* no servers: same model, same ps_optim, one process */
    int progress_every;     /* progress line every N steps (0 = off) */
    int eval_samples;       /* held-out samples for eval loss/accuracy */
    int timeout_ms, retry_ms, heartbeat_ms;
    int shutdown_servers;   /* rank 0 sends SHUTDOWN to every psd at the end */
    int step_sleep_ms;      /* extra "compute" per step: slows runs for demos and
                               fault tests (a kill must land mid-run) */
    /* video models (--model tsm-r18 ...) */
    char *train_list, *val_list;   /* TSM list files (or pack dirs with --packed) */
    char *root;             /* frame_dir prefix */
    char *tmpl;             /* frame file name template */
    int packed;             /* lists are psdata pack directories */
    int frames;             /* T segments per clip */
    int size;               /* crop H = W */
    int scale_size;         /* test: shorter side before the centre crop (0 = size*256/224) */
    int flip;               /* training horizontal flip (off for direction data) */
    int loader_threads, prefetch;
    int skip_bad;           /* skip bad list entries / frames (counted) */
    int val_every;          /* validation every N steps (0 = at the end only) */
    int val_batch;          /* clips per validation forward (0 = batch) */
    int val_clips;          /* clips per validation video */
    float dropout;
    int partial_bn;
    int width;              /* ResNet stem width (64 = torchvision) */
    int num_classes;        /* 0 = from the lists */
    int threads;            /* compute threads (0 = all cores) */
    int eval;               /* --eval: evaluate --weights on --val-list and exit */
    char *weights;          /* safetensors to start from / to evaluate */
    /* detector (--model retinanet-r18|34|50, psworker_det.c) */
    char *train_json, *val_json;  /* COCO annotations */
    char *val_root;         /* val images ("" = --root) */
    int fpn_channels;       /* FPN / head width (256 = torchvision) */
    int freeze_at;          /* frozen backbone stages (ps_retina_config_t) */
    float clip_grad;        /* clip this worker's gradient to this L2 norm (0 = off) */
    float score_thresh;     /* detector post-processing: keep scores above (0.05) */
    int bn_sync;            /* video: average BN running statistics over the workers
                               through the servers (1, default) or keep each
                               worker's own (0) */
    int save_all_ranks;     /* every rank r > 0 also writes model-rank<r>.safetensors */
    char *predictions;      /* --eval: per-video CSV (video,label,pred,logits...) */
    /* mixed precision / loss scaling (issue 5; docs/cuda.md) */
    char *precision;        /* compute precision fp32|fp16|bf16 */
    char *loss_scale;       /* dynamic | static:<S> | off | "" (= dynamic for fp16, else off) */
    int loss_scale_window;  /* dynamic: clean steps before the scale doubles */
    int debug_overflow_at;  /* tests: this worker's gradient of that step is Inf (-1 = off) */
    /* ring mode and synthetic compute (worker/psworker/psworker_allreduce.c, _synth.c) */
    char *peers;            /* --mode allreduce: "tcp://h:p,..." rank r binds the r-th */
    char *allreduce;        /* ring | nccl */
    int ring_conns;         /* ring: connections to the right neighbour */
    char *compute;          /* "" = the model; "synthetic:<model>:<ms>" */
    char *overlap;          /* on | off | "" (= on where it applies; psworker_overlap.c) */
    /* derived */
    ps_dtype_t dt;
    ps_codec_t codec_id;
    int pull_codec_id;      /* -1: follows codec_id */
    int bn_mode;            /* PS_MODEL_BN_* value, -1 = from --partial-bn */
    int ls_on;              /* loss scaling on (dynamic or static) */
    ps_loss_scale_config_t ls_cfg; /* static:S = init = min = max = S */
} ps_worker_opts_t;

/* Running sums for the summary and the CSV. */
typedef struct ps_worker_stats {
    double t_start;               /* seconds (monotonic) when training started */
    double sum_step, sum_compute, sum_comm;  /* seconds over counted steps */
    double sum_data;              /* of which waiting for data (video) */
    uint64_t counted;             /* steps in those sums */
    uint64_t samples;             /* samples this process computed on */
    double recent_loss[10];       /* last losses (ring) */
    uint64_t nloss;
    uint64_t stale_drops;         /* gradients refused as too stale (ssp) */
    uint64_t wire_sent, wire_recv;/* ring mode: bytes this rank sent / received */
} ps_worker_stats_t;

struct ps_worker_video;
struct ps_worker_det;

typedef struct ps_worker {
    const ps_worker_opts_t *o;
    struct ps_worker_video *vid;  /* video model state (NULL for smoke) */
    struct ps_worker_det *det;    /* detector state (NULL otherwise) */
    double t_data;  /* seconds the last ps_worker_compute waited for data */
    int compute_rc; /* PS_E* when the last compute failed for a reason other
                       than divergence (already logged) */
    double top1, top5, val_loss;  /* last validation (video) */
    size_t val_nonfinite;  /* videos of the last validation whose logits were
                              NaN/Inf: counted wrong, val_loss NaN */
    ps_smoke_dims_t dims;
    ps_smoke_data_t data;
    ps_smoke_work_t work;
    ps_partition_table_t table;
    ps_optim_config_t optim;
    int rank, nworkers, batch;    /* this process's rank, W, samples per step */
    size_t numel;
    float *w;       /* (numel) current weights, model order */
    float *grad;    /* (numel) this step's mean gradient */
    float *mom;     /* (numel) momentum buffers (standalone only) */
    double *wd, *gd;/* (numel) double scratch for the model */
    float *x;       /* (max(batch, eval), D) inputs */
    int *y;         /* (max(batch, eval)) labels */
    int cap;        /* rows of x / y */
    FILE *csv;
    FILE *val_csv;  /* rank 0, video: one row per validation */
    ps_worker_stats_t st;
    double init_eval_loss, init_eval_acc;
    int rollback;           /* sync: a server asked to roll back (restarted from a checkpoint) */
    uint64_t rollback_to;   /* the lowest version asked for this step */
    ps_loss_scale_t ls;   /* the loss scaler (o->ls_on); identical on every
                             worker: each feeds it the cluster's verdict */
} ps_worker_t;

/* psworker_model.c */
int ps_worker_setup(ps_worker_t *p, const ps_worker_opts_t *o, uint32_t nservers);
/* Open --device into ctx (after ps_engine_init): 0 and *be its backend
 * table, or PS_EINVAL with the cause logged (a device that cannot be used
 * is a usage error). */
struct ps_ctx;
struct ps_backend;
int ps_worker_open_device(const ps_worker_opts_t *o, struct ps_ctx *ctx,
                          const struct ps_backend **be);
void ps_worker_teardown(ps_worker_t *p);
/* Mean loss and gradient (into p->grad) of this rank's samples of `step`:
 * global batch positions step*W*B + rank*B ... + B-1. */
double ps_worker_compute(ps_worker_t *p, uint64_t step);
/* Loss and accuracy of p->w over the held-out samples. */
double ps_worker_eval(ps_worker_t *p, double *accuracy);
/* The INIT spec JSON (docs/protocol.md); malloc'd, NULL on failure. */
char *ps_worker_spec_json(const ps_worker_t *p);

/* First evaluation before training (smoke: cheap; video: skipped). */
void ps_worker_initial_eval(ps_worker_t *p);
/* Periodic validation after `step` steps when --val-every says so. */
/* Returns 1 when `step` is a validation step (on every rank: the cluster
 * loop then meets the others at a barrier), else 0. */
int ps_worker_maybe_validate(ps_worker_t *p, uint64_t step);
int ps_worker_build_optim(ps_worker_t *p);
/* The momentum the worker's error feedback keeps (DGC momentum correction:
 * --dgc-momentum with topk/sign pushes to servers), 0 when the servers keep
 * it; ps_worker_build_optim then gives the servers momentum 0. */
float ps_worker_ef_momentum(const ps_worker_opts_t *o);
/* --topk-warmup-steps with -1 (auto) resolved. */
uint64_t ps_worker_topk_warmup(const ps_worker_opts_t *o);

/* psworker_video.c */
int ps_worker_is_video(const ps_worker_opts_t *o);
/* --precision fp32|fp16|bf16 on the model's backend (0 or PS_E*, logged). */
int ps_worker_video_precision(ps_worker_t *p, const char *precision);
/* 1 when the backend applies the loss scale itself (CUDA), else 0;
 * *scaled: elements of p->grad[0..) that come out scaled (parameters). */
int ps_worker_video_loss_scale(ps_worker_t *p, float scale, size_t *scaled);
int ps_worker_video_setup(ps_worker_t *p, uint32_t nservers);
int ps_worker_video_groups(ps_worker_t *p);
void ps_worker_video_teardown(ps_worker_t *p);
double ps_worker_video_compute(ps_worker_t *p, uint64_t step);
/* Validation over the whole --val-list: mean loss, top-1/top-5 accuracy.
 * Videos with non-finite logits count as wrong and make the loss NaN; their
 * number goes to p->val_nonfinite. */
double ps_worker_video_eval(ps_worker_t *p, double *top1, double *top5, size_t *videos);
int ps_worker_video_save(ps_worker_t *p, const char *path);
/* The model (NULL without one): psworker_overlap.c sets its hooks; *ctx,
 * *be: its backend context and table. */
struct ps_model *ps_worker_video_model(ps_worker_t *p, struct ps_ctx **ctx,
                                       const struct ps_backend **be);
/* CRC32C of this worker's BN running statistics (the AVERAGE tensors of
 * p->w; 0 when there are none): equal on every rank when they agree. */
uint32_t ps_worker_video_bn_crc(const ps_worker_t *p, int *ntensors);
size_t ps_worker_video_clip_floats(const ps_worker_t *p);
/* Fractional epoch after `steps` steps (0 before the loader exists). */
double ps_worker_video_epoch(const ps_worker_t *p, uint64_t steps);
/* --eval: evaluate --weights on --val-list, print a final: line. */
int ps_worker_run_eval(ps_worker_t *p);

/* psworker_det.c (RetinaNet; worker/det/det_stub.c without libjpeg) */
int ps_worker_is_det(const ps_worker_opts_t *o);
int ps_worker_det_setup(ps_worker_t *p, uint32_t nservers);
int ps_worker_det_groups(ps_worker_t *p);
void ps_worker_det_teardown(ps_worker_t *p);
double ps_worker_det_compute(ps_worker_t *p, uint64_t step);
/* As ps_worker_maybe_validate: 1 when this step validates (rank 0 runs it). */
int ps_worker_det_maybe_validate(ps_worker_t *p, uint64_t step);
int ps_worker_det_save(ps_worker_t *p, const char *path);
/* The final: line with map= ap50= ap75= (rank 0 validates first). */
void ps_worker_det_print_final(ps_worker_t *p, uint64_t steps_done);
/* --eval: COCO evaluation of --weights on --val-json, a final: line. */
int ps_worker_det_run_eval(ps_worker_t *p);

/* psworker_train.c: return 0 or a negative PS_E* (already reported). */
/* Client for --servers (CURVE keys, wire options, timeouts from the
 * options), HELLO, rank checks against --rank / --num-workers; sets
 * p->rank and the log tag.  *c is NULL unless 0 is returned. */
struct ps_client;
int ps_worker_client_connect(ps_worker_t *p, struct ps_client **c);
int ps_worker_run_cluster(ps_worker_t *p);
/* Wait for partition i's request req[i] of `step` and run every check of a
 * cluster step on it (verdict, rollback, stale re-pull into dst, version);
 * 0 or the PS_E*, the step's first error kept (and logged once) in *first_rc. */
struct ps_req;
int ps_worker_part_complete(ps_worker_t *p, struct ps_client *c, struct ps_req **req,
                            uint64_t *ver, uint32_t i, float *dst, uint64_t step, int sync,
                            int *remote_ovf, int *first_rc);

/* psworker_overlap.c: --overlap (issues 5 and 7).  Each partition's
 * PUSHPULL leaves as soon as the model's backward made its gradient final
 * (ps_model_set_hooks), and the next forward waits, layer by layer, only
 * for the partitions that layer reads.  Replies land in a second buffer
 * and are checked with ps_worker_part_complete as they are needed.
 * new: *out NULL (and 0 returned) when overlap does not apply (logged). */
typedef struct ps_worker_overlap ps_worker_overlap_t;
int ps_worker_overlap_new(ps_worker_t *p, struct ps_client *c, struct ps_req **req, uint64_t *ver,
                          int sync, ps_worker_overlap_t **out);
/* Around ps_worker_compute of `step`: begin arms the hooks; end pushes what
 * the hooks did not (nothing once a rollback or an error was seen: no
 * gradient of mixed weights leaves) and returns 0 or the step's first error;
 * *t_wait: seconds the step spent blocked on replies. */
void ps_worker_overlap_begin(ps_worker_overlap_t *ov, uint64_t step);
int ps_worker_overlap_end(ps_worker_overlap_t *ov, double *t_wait);
/* Complete every partition in flight (into p->w, all checks): before
 * anything that reads all the weights (validation, save, rollback, end);
 * *remote_ovf |= any OVERFLOW verdict.  0 or the first error. */
int ps_worker_overlap_wait_all(ps_worker_overlap_t *ov, int *remote_ovf);
void ps_worker_overlap_free(ps_worker_overlap_t **ov);
int ps_worker_run_standalone(ps_worker_t *p);

/* psworker_allreduce.c: --mode allreduce (no servers).  The loop calls
 * `compute` (ps_worker_compute for real models) for this rank's mean
 * gradient, averages it over the ring (or NCCL) and applies ps_optim to the
 * local fp32 master copy (local_update 0: skip it, synthetic runs).
 * run_allreduce also saves the model and prints the final line. */
typedef double (*ps_worker_compute_fn)(ps_worker_t *p, uint64_t step);
int ps_worker_allreduce_check(ps_worker_opts_t *o);
int ps_worker_allreduce_train(ps_worker_t *p, ps_worker_compute_fn compute, int local_update);
int ps_worker_run_allreduce(ps_worker_t *p);

/* psworker_synth.c: --compute synthetic:<model>:<ms> (a whole run: setup,
 * PS or ring loop, final line).  Returns 0, PS_EINVAL for a bad spec, or
 * the run's PS_E* (already reported). */
int ps_worker_is_synthetic(const ps_worker_opts_t *o);
int ps_worker_run_synthetic(const ps_worker_opts_t *o);

/* psworker_train.c: dynamic loss scaling around a step's compute (PS and
 * ring mode share it: same scaling, same log lines, which the tests
 * compare across modes).  begin: before the backward (a CUDA backend may
 * apply the scale in the loss gradient); prepare: p->grad := the backward
 * of scale*loss, checked, unscaled when clean; returns 1 when this worker
 * overflowed; finish: the step's cluster-wide verdict (where: "on this
 * worker" / "on another worker", for the log), returns 1 = apply, 0 = skip;
 * report: the final line.  All no-ops (prepare 0, finish 1) without
 * --loss-scale. */
void ps_worker_ls_begin(ps_worker_t *p);
int ps_worker_ls_prepare(ps_worker_t *p, uint64_t step);
int ps_worker_ls_finish(ps_worker_t *p, uint64_t step, const char *where, int verdict);
void ps_worker_ls_report(const ps_worker_t *p);
#define PS_WORKER_LS_WHERE(local) ((local) ? "on this worker" : "on another worker")
/* The step's update on this worker's own FP32 master copy (--standalone,
 * ring mode): ps_optim over every partition of p->grad into p->w / p->mom.
 * Returns 0 or the optimizer's PS_E* (logged). */
int ps_worker_apply_local(ps_worker_t *p, uint64_t step);

/* psworker_output.c */
double ps_worker_now(void);
int ps_worker_output_open(ps_worker_t *p);
void ps_worker_record_step(ps_worker_t *p, uint64_t step, double loss, double t_step,
                           double t_compute, double t_comm);
int ps_worker_save_model(ps_worker_t *p);
void ps_worker_print_final(ps_worker_t *p, uint64_t steps_done);
#endif
