/* The models the video task trains, as rows: the --model name, how it
 * fills the model configuration (the 2-D TSM / TSN ResNets, or a 3-D model
 * of worker/models/ps_video3d.h), the clip layout it takes and the frame
 * sampling it defaults to.  task_video.c looks a name up here and never
 * tests which kind of model it holds. */
#ifndef PS_VIDEO_MODELS_H
#define PS_VIDEO_MODELS_H

#include "worker/models/ps_model.h"

typedef struct ps_video_model_row {
    const char *name;     /* --model value */
    /* fill cfg's architecture fields (depth / shift, or arch) */
    void (*config)(ps_model_config_t *cfg, const struct ps_video_model_row *r);
    int depth, shift;     /* 2-D rows */
    const char *layout;   /* what the model computes on, for the log line */
    int sampling;         /* default --sampling: PS_VIDEO_SAMPLING_* */
    int stride;           /* default --stride (dense sampling) */
} ps_video_model_row_t;

/* --sampling (tsn|dense, "" = the row's) and --stride (0 = the row's for
 * dense sampling, 1 otherwise) resolved into *kind (PS_VIDEO_SAMPLING_*)
 * and *stride; 0, or PS_EINVAL after a message naming the flag. */
int ps_video_model_sampling(const ps_video_model_row_t *row, const char *sampling, int *stride,
                            int *kind);

/* What loading cost per clip so far (a training loader; NULL or before the
 * first batch: zeros): frames, encoded bytes, ms reading and decoding. */
struct ps_video_loader;
typedef struct ps_video_clip_cost { double frames, bytes, read_ms, decode_ms; } ps_video_clip_cost_t;
ps_video_clip_cost_t ps_video_clip_cost(const struct ps_video_loader *ld);

/* The row of a --model name, or NULL. */
const ps_video_model_row_t *ps_video_model_find(const char *name);
/* "tsm-r18|tsm-r34|... " for messages and --help. */
const char *ps_video_model_names(void);

#endif
