/* Inside of the video task, shared by task_video.c (its table row, its
 * options and a training step), task_video_setup.c (lists, class count,
 * model, the flat vector and its partition table) and task_video_eval.c
 * (validation, the final line and --eval: TSM's test protocol).  Private to
 * psworker. */
#ifndef PS_WORKER_TASK_VIDEO_INTERNAL_H
#define PS_WORKER_TASK_VIDEO_INTERNAL_H
#include <stdint.h>
#include <stdio.h>

#include "worker/data/labels.h"
#include "worker/data/ps_video.h"
#include "worker/models/ps_model.h"
#include "worker/psworker/psworker.h"
#include "worker/psworker/video_models.h"

typedef struct video_opts {
    char *train_list, *val_list;   /* TSM list files (or pack dirs with --packed) */
    char *tmpl;             /* frame file name template */
    int packed;             /* lists are psdata pack directories */
    int frames;             /* T segments per clip */
    int scale_size;         /* test: shorter side before the centre crop (0 = size*256/224) */
    int val_clips;          /* clips per validation video */
    int test_clips;         /* --eval: clips per video (0 = val_clips) */
    int test_crops;         /* --eval: 1 centre crop, 3 TSM's three crops */
    char *shift_place;      /* blockres|block ("" = the --weights checkpoint's, else blockres) */
    int shift_div;          /* 1/N each way (0 = the --weights file's tsm.shift_div, else 8) */
    float dropout;
    int partial_bn;
    int zero_init_residual; /* each residual branch's last BN weight starts at 0 */
    int bn_sync;            /* average BN running statistics over the workers */
    char *video_list, *val_video_list; /* video files decoded on the fly, in place of the lists */
    int short_side;         /* video files: shorter side of the decoded frames */
    float fps;              /* video files: frames per second (0 = every frame) */
    char *class_names;      /* --predictions: class i's name is line i + 1 of this file */
    const char *train_src, *val_src; /* derived: the training / validation list of either kind */
    char *sampling;         /* tsn|dense ("" = the model's) */
    int stride;             /* dense: frame stride (0 = the model's) */
    char *inflate;          /* 2-D --weights into a 3-D model: mean|centre */
    int bn_mode;            /* derived: PS_MODEL_BN_* value, -1 = from --partial-bn */
    int bn_cross;           /* derived: --bn sync (TRAIN over the workers' batches) */
    const ps_video_model_row_t *row; /* derived: --model's row */
    int sampling_kind;      /* derived: PS_VIDEO_SAMPLING_* */
} video_opts_t;

typedef struct video {
    ps_ctx_t ctx;
    const ps_backend_t *be;
    ps_model_t *m;
    ps_video_list_t *train, *val;
    ps_video_loader_t *tl, *vl;
    ps_video_opts_t topt, vopt;
    ps_tensor_spec_t *specs;
    int nspecs;
    int *param_of;          /* spec i -> model param index (i < nparams) or
                               model buffer index (BN statistics, i >= nparams) */
    int nparams;            /* specs[0..nparams) are trainable parameters, the
                               rest BN running statistics (AVERAGE group) */
    float *clips;           /* (max_clips*T, 3, H, W) one batch */
    int32_t *labels;
    int64_t *idx;
    int max_clips, K;
    double top1, top5, val_loss;  /* last validation */
    size_t val_nonfinite;   /* videos of the last validation whose logits were
                               NaN/Inf: counted wrong, val_loss NaN */
    FILE *val_csv;          /* rank 0: one row per validation */
    ps_class_names_t *names; /* --class-names */
} video_t;

static inline const video_opts_t *vopts(const ps_worker_t *p) { return ps_worker_task_opts(p->o); }

/* task_video_setup.c: the task's setup entry -- the lists, the number of
 * classes, the loaders' options, the model, the flat vector's tensors, the
 * partition table, the optimizer groups and p->w / p->grad. */
int ps_task_video_setup(ps_worker_t *p, uint32_t nservers);

/* task_video.c: p->w -> the model's tensors (and BN statistics); the
 * epoch (fractional) that `steps` steps reach. */
void ps_task_video_scatter(ps_worker_t *p);
double ps_task_video_epoch(const ps_worker_t *p, uint64_t steps);

/* task_video_eval.c: the task's validate, print_final and eval entries. */
int ps_task_video_validate(ps_worker_t *p, uint64_t step);
void ps_task_video_print_final(ps_worker_t *p, uint64_t steps_done);
int ps_task_video_eval(ps_worker_t *p);

#endif
