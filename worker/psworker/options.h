/* psworker's options, grouped by what they configure.  Each group's flags
 * are rows of one table (options.c: name, type, destination, help and
 * default in one row; ps_config_defaults / ps_config_free derive the
 * rest), so a flag is added in one place.  The groups every run has are
 * here; a task's own flags live with the task (task.h: opt_rows, and its
 * options struct in o->task_opts[]). */
#ifndef PS_WORKER_OPTIONS_H
#define PS_WORKER_OPTIONS_H
#include <stddef.h>
#include <stdint.h>

#include "ps_codec.h"
#include "ps_config.h"
#include "worker/engine/ps_loss_scale.h"

#define PS_WORKER_MAX_TASKS 8

/* The optimizer and schedule the servers (or the local update) run. */
typedef struct ps_worker_optim_opts {
    float lr, momentum, dampening, weight_decay;
    int nesterov;
    int ref_batch;          /* linear scaling rule reference batch (0 = off) */
    uint64_t warmup_steps;
    float warmup_factor;
    char *schedule;         /* const|step|cosine */
    char *milestones;       /* "30,60" (steps) */
    float gamma, min_lr;
} ps_worker_optim_opts_t;

/* What goes on the wire to the servers, and how it is secured. */
typedef struct ps_worker_wire_opts {
    char *dtype;            /* fp32|fp16|bf16 ("" = follows --precision) */
    char *codec;            /* pushes: raw|lz4|topk|sign */
    char *pull_codec;       /* pulls / weights: raw|lz4 ("" = follows codec) */
    float topk_ratio;       /* topk: fraction of elements sent (0 = default) */
    int ef_rounding;        /* fp16/bf16 pushes: feed the rounding error back */
    int dgc_momentum;       /* topk/sign: momentum on the worker (DGC) 1, 0, -1 auto */
    int topk_warmup_steps;  /* topk: density warm-up steps (-1 = auto: steps / 4) */
    char *curve_server_keys, *curve_public_key, *curve_secret_key;
    /* derived by the checks */
    ps_dtype_t dt;
    ps_codec_t codec_id;
    int pull_codec_id;      /* -1: follows codec_id */
} ps_worker_wire_opts_t;

/* --mode allreduce: the ring (or NCCL) in place of servers. */
typedef struct ps_worker_ring_opts {
    char *peers;            /* "tcp://h:p,..." rank r binds the r-th */
    char *allreduce;        /* ring | nccl */
    int ring_conns;         /* ring: connections to the right neighbour */
} ps_worker_ring_opts_t;

/* Compute precision and loss scaling. */
typedef struct ps_worker_precision_opts {
    char *precision;        /* fp32|fp16|bf16 */
    char *loss_scale;       /* dynamic | static:<S> | off | "" (= dynamic for fp16, else off) */
    int loss_scale_window;  /* dynamic: clean steps before the scale doubles */
    int debug_overflow_at;  /* tests: this worker's gradient of that step is Inf (-1 = off) */
    /* derived */
    int ls_on;
    ps_loss_scale_config_t ls_cfg; /* static:S = init = min = max = S */
} ps_worker_precision_opts_t;

/* The data and model shape shared by the tasks that train an engine model
 * on files (video, detection). */
typedef struct ps_worker_data_opts {
    char *root;             /* where the lists' / annotations' files are */
    int size;               /* network input H = W */
    int flip;               /* training horizontal flip */
    int loader_threads, prefetch;
    int skip_bad;           /* skip bad entries / frames / images (counted) */
    int val_every;          /* validation every N steps (0 = at the end only) */
    int val_batch;          /* samples per validation forward (0 = --batch) */
    int width;              /* ResNet stem width (64 = torchvision) */
    int num_classes;        /* 0 = from the data */
    char *weights;          /* safetensors to start from / to evaluate */
    char *predictions;      /* the task's predictions file ("" = none): video --eval's
                               per-video CSV, the detector's COCO results */
    int weights_partial;    /* --weights may lack model tensors / hold others (listed) */
} ps_worker_data_opts_t;

typedef struct ps_worker_opts {
    /* the job */
    char *servers;          /* "tcp://h:p,tcp://h:p" (server 0 first) */
    int standalone;         /* no servers: same model, same ps_optim, one process */
    int eval;               /* --eval: evaluate --weights and exit */
    char *export_onnx;      /* --export-onnx FILE: write the model as ONNX and exit ("" = no) */
    int rank;               /* -1: assigned by server 0 */
    int num_workers;        /* W */
    char *model;
    char *mode;             /* sync|async|ssp (what the servers run) | allreduce */
    uint64_t steps;
    int batch;              /* B: samples per worker per step */
    uint64_t seed;          /* weights init */
    uint64_t data_seed;     /* data order / augmentation / generated data */
    uint64_t partition_bytes;
    char *device;           /* cpu | cuda | cuda:N */
    int threads;            /* compute threads (0 = all cores) */
    char *conv_kernels;     /* CPU convolution kernels: "" | auto | gemm | onednn */
    char *overlap;          /* on | off | "" (on where it applies) */
    char *out;              /* run directory ("" = none) */
    int save_all_ranks;     /* every rank r > 0 also writes model-rank<r>.safetensors */
    char *log_level;
    int progress_every;     /* progress line every N steps (0 = off) */
    int timeout_ms, retry_ms, heartbeat_ms;
    int stall_warn_ms;      /* log what a request waits for after this long (0 = off) */
    int shutdown_servers;   /* rank 0 sends SHUTDOWN to every psd at the end */
    int step_sleep_ms;      /* extra "compute" per step (demos, fault tests) */
    int join;               /* sync: join a running elastic job (psd --max-workers) */
    char *elastic_lr;       /* keep-batch | linear: the lr / batch rule when W changes */
    int replicate_state;    /* sync: keep 1/W of the servers' state (weights,
                             * momentum) so a server that lost it is rebuilt */
    int debug_die_mid_step; /* tests (sync, servers): at this step push half the
                             * partitions, wait for their weights, then SIGKILL
                             * this process (-1 = off) */
    int metrics_port;       /* /metrics on this port (0 = off) */
    char *metrics_bind;     /* ... on this address */
    int plots;              /* rank 0 draws DIR/plots/ at the end (--out) */
    ps_worker_optim_opts_t optim;
    ps_worker_wire_opts_t wire;
    ps_worker_ring_opts_t ring;
    ps_worker_precision_opts_t prec;
    ps_worker_data_opts_t data;
    /* the claiming task (task.h) and each task's own options */
    int task;
    void *task_opts[PS_WORKER_MAX_TASKS];
    ps_opt_t *rows;         /* the whole option table (for ps_config_free) */
} ps_worker_opts_t;

/* Parse flags and --config files, check every option (the task's through
 * its check) and find the task.  Returns 0; 1 when --help was printed;
 * PS_EINVAL after a message naming the flag (psworker exits 2). */
int ps_worker_opts_parse(ps_worker_opts_t *o, int argc, char **argv);
void ps_worker_opts_free(ps_worker_opts_t *o);
/* The claiming task's own options. */
void *ps_worker_task_opts(const ps_worker_opts_t *o);
/* "psworker: <message>" on stderr, for a bad option; returns PS_EINVAL. */
__attribute__((format(printf, 1, 2))) int ps_worker_opt_error(const char *fmt, ...);
/* Checks of the data group (the tasks that use it call this). */
int ps_worker_data_opts_check(const ps_worker_opts_t *o);
/* --device is not cpu: refused with the task's reason (0 when it is cpu). */
int ps_worker_cpu_only(const ps_worker_opts_t *o, const char *why);
/* --precision other than fp32 refused with the task's reason. */
int ps_worker_fp32_only(const ps_worker_opts_t *o, const char *why);

/* --mode allreduce options (loop_ring.c). */
int ps_worker_ring_check(ps_worker_opts_t *o);
/* Comma-separated non-empty fields of s. */
int ps_worker_count_fields(const char *s);
/* "a,b,c" as a NULL-terminated array of its non-empty fields (one
 * allocation, free() it); *n their number. */
char **ps_worker_split_list(const char *list, int *n);
#endif
