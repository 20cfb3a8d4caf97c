/* The detectors the detection task (task_det.c) trains, as rows: RetinaNet
 * (task_det_retina.c), Faster, Mask and Cascade R-CNN (task_det_rcnn.c).  The task's
 * set-up, loop entries and evaluation never ask which row runs; a row
 * wraps one model of worker/models/ behind these entries.  Private to
 * psworker. */
#ifndef PS_WORKER_TASK_DET_H
#define PS_WORKER_TASK_DET_H
#include <stdint.h>

#include "worker/det/det_data.h"
#include "worker/models/ps_model.h"

/* The detection task's own flags (task_det.c's rows). */
typedef struct det_opts {
    char *train_json, *val_json;  /* COCO annotations */
    char *val_root;         /* val images ("" = --root) */
    int fpn_channels;       /* FPN / head width (256 = torchvision) */
    int freeze_at;          /* frozen backbone stages */
    float clip_grad;        /* clip this worker's gradient to this L2 norm (0 = off) */
    float score_thresh;     /* post-processing: keep scores above (0.05) */
    /* two-stage detectors (0 = the value scaled to --size, docs/detection.md) */
    int rpn_pre_train, rpn_post_train, rpn_pre_test, rpn_post_test;
    int box_batch;          /* RoIs sampled per image (512) */
    int box_head_dim;       /* TwoMLPHead width (1024) */
    int max_gt;             /* boxes per training image at most (100) */
    int mask_head_dim;      /* Mask R-CNN: MaskRCNNHeads / predictor width (256) */
} det_opts_t;

/* What a row builds its model from. */
typedef struct det_build {
    int depth, num_classes, width, size, max_n;
    const det_opts_t *o;
    int bn_mode;          /* the backbone's BN: PS_MODEL_BN_FROZEN or _TRAIN (--bn) */
    int recompute;        /* --recompute */
} det_build_t;

typedef struct det_kind {
    const char *prefix;   /* --model PREFIX18|34|50, e.g. "retinanet-r" */
    const char *name;     /* "RetinaNet", "Faster R-CNN" (logs) */
    float fg_iou, bg_iou; /* the loader's anchor matching (RetinaNet 0.5 / 0.4, RPN 0.7 / 0.3) */
    /* the class output of a checkpoint: classes_per x K + classes_extra
     * values (K from --weights when there are no annotations) */
    const char *classes_tensor;
    int classes_per, classes_extra;
    /* instances per image the batches carry (the loader's max_instances;
     * 0: none) and, with masks, their masks (Mask R-CNN) */
    int (*max_gt)(const det_opts_t *o);
    int masks;
    int (*create)(void **m, const det_build_t *b, const ps_backend_t *be, ps_ctx_t *ctx);
    void (*destroy)(void **m);
    void (*init)(void *m, uint64_t seed);
    /* --weights (partial: --weights-partial), as ps_retina_load_weights */
    int (*load)(void *m, const char *path, int partial);
    int (*save)(const void *m, const char *path);
    const ps_model_param_t *(*params)(const void *m, int *n);
    const ps_model_buffer_t *(*buffers)(const void *m, int *n); /* BN running statistics */
    int (*find_param)(const void *m, const char *name);
    /* the tables and per-layer hooks --overlap sets (ps_rcnn_hookable) */
    void (*hookable)(void *m, ps_model_hookable_t *h);
    int (*tensor_specs)(const void *m, ps_tensor_spec_t **specs);
    int (*groups)(const void *m, ps_param_group_t *groups, int max);
    void (*zero_grad)(void *m);
    int (*num_anchors)(const void *m);
    const float *(*anchors)(const void *m);
    /* forward and backward of n training images of b; *loss the sum of the
     * model's losses; seed: this step's sampling seed.  0 or PS_E*. */
    int (*train)(void *m, const ps_det_batch_t *b, int n, uint64_t seed, float *loss);
    /* inference forward of n images of b.  0 or PS_E*. */
    int (*infer)(void *m, const ps_det_batch_t *b, int n);
    /* image i's detections of the last inference in network pixels (at
     * most 100; the host reads the outputs: the caller synced), scores
     * above score_thresh, classes 0..K-1.  Count or PS_E*. */
    int (*detect)(void *m, int i, const ps_det_geom_t *g, float score_thresh, float *boxes,
                  float *scores, int32_t *classes);
    /* optional (NULL: --export-onnx refused): the model as an ONNX graph */
    int (*export_onnx)(const void *m, const char *path);
    /* optional (NULL: boxes only): the masks of image i's n detections of
     * the last inference (boxes as detect returned them), each the
     * original image's size (g->orig_h x orig_w), into out[0..n).  0 or
     * PS_E* (masks written so far freed). */
    int (*detect_masks)(void *m, int i, const ps_det_geom_t *g, int n, const float *boxes,
                        ps_rle_t *out);
} det_kind_t;

#define DET_MAX_DETECTIONS 100

extern const det_kind_t det_kind_retina, det_kind_rcnn, det_kind_maskrcnn, det_kind_cascade;

#endif
