/* The kinds of work psworker runs, as rows of one table.
 *
 * A task is a model with its data: the smoke MLP, the video models (TSM /
 * TSN), the detector (RetinaNet), or the synthetic compute that moves a
 * named model's real partition layout and sleeps in place of forward and
 * backward (the scaling study).  The loops (loop_cluster.c, loop_ring.c,
 * loop_standalone.c) drive a step -- compute, push / allreduce / local
 * update, record, validate -- through these entries and never ask which
 * task runs.
 *
 * Life of a run: opt_rows (the task's flags, at start) -> check (its own
 * options, after the common ones) -> setup (model, data, the partition
 * table, p->w / p->grad, optimizer groups) -> start (the rank is known:
 * loaders, per-rank outputs, a first evaluation) -> compute per step,
 * validate after it -> save -> print_final -> teardown.  --eval runs setup
 * then eval instead of a loop, --export-onnx setup then export_onnx.
 *
 * A NULL entry means the task has nothing to do there (optional entries are
 * marked); every other entry is filled by every task. */
#ifndef PS_WORKER_TASK_H
#define PS_WORKER_TASK_H
#include <stddef.h>
#include <stdint.h>

#include "ps_config.h"

struct ps_worker;
struct ps_worker_opts;
struct ps_model;
struct ps_model_hookable;

/* Task flags. */
enum {
    /* ring mode leaves out the local optimizer update: it stands for GPU
     * work the emulation does not measure (synthetic compute) */
    PS_TASK_NO_LOCAL_UPDATE = 1u << 0,
    /* the task's compute reads its samples at p->step_first + p->shard *
     * p->batch, so elastic membership can re-split the data at any step
     * (elastic.c); the others shard their loaders once, at start */
    PS_TASK_ELASTIC = 1u << 1,
};

#define PS_TASK_MAX_OPTS 48 /* rows a task's opt_rows may write */

typedef struct ps_task {
    const char *name;   /* "smoke", "video", "detection", "synthetic" */
    const char *models; /* the --model values it takes, for --help and errors */
    unsigned flags;     /* PS_TASK_* */
    const char *unit;   /* what a sample is ("clips", "images"): the CSV's
                           samples column and /metrics say it (NULL: "samples") */
    size_t opts_size;   /* bytes of the task's own options (0: none) */

    /* 1 when this task runs the job the options describe (topts: the
     * task's own options); the first row that claims it wins. */
    int (*claims)(const struct ps_worker_opts *o, const void *topts);
    /* Optional: the task's own flags, written to rows[0..n) (at most
     * PS_TASK_MAX_OPTS) with destinations in topts and defaults inline.
     * Returns n.  Every task's flags are known to every run (a config
     * file may hold them all); only the claiming task reads them. */
    size_t (*opt_rows)(void *topts, ps_opt_t *rows);
    /* The task's options after the common checks: 0, or PS_EINVAL after a
     * message on stderr naming the flag. */
    int (*check)(struct ps_worker_opts *o);
    /* Model, data lists, p->table, p->numel, p->w (initial weights),
     * p->grad, p->mom (standalone), p->optim's groups; p->be / p->ctx when
     * the model runs on the engine.  0 or PS_E* (logged). */
    int (*setup)(struct ps_worker *p, uint32_t nservers);
    /* Optional: the rank is known and training is about to start (loaders
     * sharded by rank, rank 0's validation CSV, a first evaluation). */
    int (*start)(struct ps_worker *p);
    /* This rank's mean loss of `step` and its gradient in p->grad (global
     * batch positions step*W*B + rank*B .. + B-1; PS_TASK_ELASTIC tasks:
     * p->step_first + p->shard*p->batch .. + p->batch-1).  NAN on failure, with
     * p->compute_rc set when the cause is not divergence (logged). */
    double (*compute)(struct ps_worker *p, uint64_t step);
    /* Optional: periodic validation after `step` steps; 1 when `step`
     * validates on this run (rank 0 ran it; the other ranks meet it at the
     * cluster loop's barrier), else 0. */
    int (*validate)(struct ps_worker *p, uint64_t step);
    /* Optional: the model file at path (rank 0, and every rank with
     * --save-all-ranks).  0 or PS_E* (logged by the caller). */
    int (*save)(struct ps_worker *p, const char *path);
    /* Optional: the progress line of `step` (NULL: the common one). */
    void (*progress)(struct ps_worker *p, uint64_t step, double loss, float lr, double per_s,
                     double t_data, double t_compute, double t_comm);
    /* The summary line "final: key=value ..." (rank 0 validates first). */
    void (*print_final)(struct ps_worker *p, uint64_t steps_done);
    /* Optional: --eval, evaluate --weights and print a final: line.
     * NULL: the task has no evaluation (psworker says so). */
    int (*eval)(struct ps_worker *p);
    /* Optional: --export-onnx, the model (as setup left it: --weights or
     * the initialisation) as an ONNX file at path.  NULL: the task has no
     * export (psworker says so). */
    int (*export_onnx)(struct ps_worker *p, const char *path);
    /* Optional: loss scaling inside the backend (CUDA applies the scale in
     * its cross-entropy backward).  1 when it took `scale`, *scaled = the
     * elements p->grad[0..*scaled) that then come out scaled; 0: the loop
     * scales the whole gradient itself. */
    int (*loss_scale)(struct ps_worker *p, float scale, size_t *scaled);
    /* Optional: the video model (its buffers' step counters: state.c). */
    struct ps_model *(*model)(struct ps_worker *p);
    /* Optional: the tables and per-layer hooks --overlap uses (*h filled,
     * returns 1), or 0 with *why saying what keeps this run from them
     * (NULL entry: the task has none; pushes follow the whole backward). */
    int (*hooks)(struct ps_worker *p, struct ps_model_hookable *h, const char **why);
    void (*teardown)(struct ps_worker *p);
} ps_task_t;

/* The table, in claim order (tasks.c); NULL-terminated. */
extern const ps_task_t *const ps_tasks[];
extern const ps_task_t ps_task_smoke, ps_task_video, ps_task_det, ps_task_synthetic;
/* Index of the task that claims the options' job, or -1. */
int ps_task_find(const struct ps_worker_opts *o);
/* "smoke | tsm-r18|... | ..." of every task, for messages. */
const char *ps_task_models(void);
#endif
