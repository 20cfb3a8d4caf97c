/* Two-stage R-CNN detectors on the engine: Faster R-CNN with a
 * ResNet-18/34/50-FPN backbone (torchvision.models.detection.
 * fasterrcnn_resnet50_fpn, 0.14), every layer through the backend the model
 * was created with; the box logic between the stages (proposals, sampling,
 * targets, post-processing) on the host (worker/det/det_rcnn.h).
 *
 * Backbone: the ResNet with frozen BN (FrozenBatchNorm2d), an FPN on C2..C5
 * (1x1 laterals, nearest top-down, 3x3 outputs) giving P2..P5 and P6 =
 * max_pool2d(P5, 1, stride 2) (torchvision's LastLevelMaxPool); strides 4..64.
 * RPN: one 3x3 conv + ReLU shared by the levels, 1x1 objectness (3) and
 * deltas (12) per location; anchors of size 32 << l on level l with ratios
 * 0.5, 1, 2 (torchvision's AnchorGenerator: rounded cell corners, no
 * half-pixel offset); proposals per image (ps_det_rpn_proposals).
 * Box head (one stage; a cascade stacks more with their own IoU and coder
 * weights): MultiScaleRoIAlign on P2..P5 (7 x 7, sampling 2, aligned=False,
 * level by ps_det_roi_level with k0 4 / canonical 224; scale 1 / stride,
 * see docs/detection.md for torchvision's inferred scale), TwoMLPHead (fc6,
 * fc7 + ReLU), FastRCNNPredictor (cls_score K+1, bbox_pred (K+1)*4).
 *
 * Training losses, torchvision's: RPN objectness BCE over the sampled
 * anchors (mean) and smooth-L1 (beta 1/9) on the sampled positives over
 * the sampled count; box head cross-entropy over the sampled RoIs (mean)
 * and smooth-L1 (beta 1/9) on the target class's deltas over the RoI count.
 * All four are means over this batch's n images (per-worker normalisation,
 * as RetinaNet's).
 *
 * Names are torchvision's state dict: backbone.body.*, backbone.fpn.
 * inner_blocks.{0..3}.0.*, backbone.fpn.layer_blocks.{0..3}.0.*, rpn.head.
 * conv.0.0.*, rpn.head.cls_logits.*, rpn.head.bbox_pred.*, roi_heads.
 * box_head.fc6.*, .fc7.*, roi_heads.box_predictor.cls_score.*, .bbox_pred.*.
 *
 * Fixed bounds chosen at creation keep the arena static: max_n images of
 * H x W; the larger post_nms count of proposals per image; at most
 * box_batch RoIs per image in training (sampled from the proposals and at
 * most max_gt ground truth), every proposal at test time.
 *
 * Legend: n images of 3 x H x W; F = fpn_channels; K foreground classes;
 * A anchors per image over P2..P6, rows level, then location (row-major),
 * then anchor (3); R RoIs of the box head.
 */
#ifndef PS_RCNN_H
#define PS_RCNN_H
#include <stdint.h>

#include "ps_model.h"
#include "worker/det/det_rcnn.h"

#define PS_RCNN_LEVELS 5     /* P2..P6 */
#define PS_RCNN_ROI_LEVELS 4 /* P2..P5: the RoI pooler's */
#define PS_RCNN_ANCHORS 3    /* per location: one size, three ratios */
#define PS_RCNN_MAX_STAGES 3 /* box head stages: 1, or Cascade R-CNN's 3 */

typedef struct ps_rcnn_config {
    int depth;          /* backbone 18, 34 or 50 */
    int num_classes;    /* K foreground classes (the predictor has K + 1) */
    int width;          /* backbone stem width: 64 = torchvision */
    int fpn_channels;   /* F: 256 */
    int freeze_at;      /* as ps_retina_config_t: 0 nothing ... 5 the whole body */
    float bn_eps;       /* 1e-5 */
    int bn_mode;        /* backbone BN, as ps_retina_config_t: FROZEN (default) | TRAIN */
    int recompute;      /* the backbone recomputes its stages (ps_model_config_t) */
    /* RPN (torchvision fasterrcnn_resnet50_fpn's values as defaults) */
    ps_det_rpn_params_t rpn_train, rpn_test; /* pre 2000 / post 2000, pre / post 1000 */
    int rpn_batch;      /* anchors sampled per image: 256 */
    float rpn_fraction; /* positives among them: 0.5 */
    /* box head */
    int representation; /* fc6 / fc7 width: 1024 */
    int roi_size;       /* RoIAlign output: 7 */
    int roi_sampling;   /* RoIAlign sampling ratio: 2 */
    ps_det_roi_sample_params_t roi; /* 0.5 / 0.5, 512, 0.25, (10, 10, 5, 5) */
    ps_det_roi_post_params_t post;  /* 0.05, 0.5, 100, 1e-2, (10, 10, 5, 5) */
    float smoothl1_beta; /* 1/9 */
    int max_gt;         /* ground-truth boxes per image at most: 100 */
    /* Mask R-CNN's mask branch (0: Faster R-CNN) */
    int mask;
    int mask_dim;       /* MaskRCNNHeads' four convs and the predictor's deconv: 256 */
    int mask_roi_size;  /* its RoIAlign output: 14 (the logits are twice that: 28) */
    /* Cascade R-CNN (Detectron2's CascadeROIHeads): stages 3 (1: one box
     * head, torchvision's); stage k matches at cascade_iou[k] and codes
     * boxes with cascade_weights[k] (stage 0: roi's IoU and weights are
     * replaced by these); class-agnostic boxes, smooth-L1 beta
     * cascade_beta (Detectron2's 0: L1) */
    int stages;
    float cascade_iou[PS_RCNN_MAX_STAGES];        /* 0.5, 0.6, 0.7 */
    float cascade_weights[PS_RCNN_MAX_STAGES][4]; /* (10,10,5,5), (20,20,10,10), (30,30,15,15) */
    float cascade_beta;                           /* 0 */
} ps_rcnn_config_t;

/* Faster R-CNN ResNet-50-FPN as torchvision builds it (80 classes, width 64,
 * F 256, freeze_at 2, the values above). */
void ps_rcnn_config_default(ps_rcnn_config_t *c);

typedef struct ps_rcnn ps_rcnn_t;

/* Build for batches of at most max_n images of 3 x H x W (H, W >= 64,
 * divisible by 64 so every level's stride is exact).  Starts from
 * ps_rcnn_init(m, 0, 0).  0, PS_EINVAL (logged) or PS_ENOMEM. */
int ps_rcnn_create(ps_rcnn_t **out, const ps_rcnn_config_t *cfg, const ps_backend_t *be,
                   ps_ctx_t *ctx, int max_n, int H, int W);
void ps_rcnn_destroy(ps_rcnn_t **m);
const ps_rcnn_config_t *ps_rcnn_config(const ps_rcnn_t *m);

/* Deterministic init from the counter hash (ps_model.h), torchvision's
 * schemes: backbone ps_model_init; FPN kaiming_uniform(a=1) (bound
 * sqrt(3/fan_in)), bias 0; RPN normal(std 0.01) as uniform (bound
 * 0.01 sqrt(3)), bias 0; fc6 / fc7 / predictor nn.Linear's default (weight
 * and bias uniform in +-1/sqrt(fan_in)).  random != 0 (tests): random BN,
 * RPN weights uniform in +-0.1 and every conv bias (2u-1) * 0.1 (so each
 * term carries signal; tests/golden/gen_fasterrcnn.py mirrors this). */
void ps_rcnn_init(ps_rcnn_t *m, uint64_t seed, int random);

/* One forward.  Inference: images, n, image_hw (may be NULL).  Training:
 * also the RPN's anchor targets (the detection loader's, matched at 0.7 /
 * 0.3: labels -1 / 0 / >= 1, encoded deltas) and the ground truth, and a
 * sampling seed (ps_det_sample_key: RPN anchors at site 0, the box head
 * at site 1).  proposals (tests): the box head runs on these instead of
 * the RPN's (torchvision's roi_heads on given proposals), in training and
 * inference. */
typedef struct ps_rcnn_input {
    const float *images;       /* (n, 3, H, W) */
    int n;
    const int32_t *image_hw;   /* (n, 2) unpadded height, width; NULL = H, W */
    const int32_t *rpn_labels; /* (n, A); NULL = inference */
    const float *rpn_targets;  /* (n, A, 4) */
    const float *gt_boxes;     /* (n, gt_stride, 4) network pixels */
    const int32_t *gt_classes; /* (n, gt_stride) 0..K-1 */
    const int32_t *ngt;        /* (n) */
    int gt_stride;
    uint64_t seed;
    const float *proposals;    /* (n, proposal_stride, 4) or NULL */
    const int32_t *nproposals; /* (n) */
    int proposal_stride;
    /* Mask R-CNN training: each ground-truth box's mask, 0/1, H x W at the
     * network input (the loader's gt_masks: zero outside image_hw) */
    const uint8_t *gt_masks;   /* (n, gt_stride, H, W) */
} ps_rcnn_input_t;

/* torchvision's loss dict: loss_objectness, loss_rpn_box_reg,
 * loss_classifier, loss_box_reg */
typedef struct ps_rcnn_losses {
    float objectness, rpn_box, classifier, box_reg;
    float mask; /* loss_mask (Mask R-CNN; 0 otherwise) */
    /* Cascade R-CNN: each stage's; classifier and box_reg are their sums */
    float stage_classifier[PS_RCNN_MAX_STAGES], stage_box_reg[PS_RCNN_MAX_STAGES];
} ps_rcnn_losses_t;

/* training (rpn_labels given) needs losses; the backbone always runs with
 * frozen BN.  0, PS_EINVAL (bad arguments, a label or class out of range,
 * more ground truth than max_gt or proposals than the bound; logged) or
 * PS_ENOMEM. */
int ps_rcnn_forward(ps_rcnn_t *m, const ps_rcnn_input_t *in, ps_rcnn_losses_t *losses);
/* Backward of the last training forward (d(sum of the four)/d.);
 * gradients ACCUMULATE into the tables' g.  PS_ESTATE otherwise. */
int ps_rcnn_backward(ps_rcnn_t *m);
void ps_rcnn_zero_grad(ps_rcnn_t *m);

/* Outputs of the last forward (host-readable after the backend's sync). */
int ps_rcnn_num_anchors(const ps_rcnn_t *m);
const float *ps_rcnn_anchors(const ps_rcnn_t *m);         /* (A, 4) */
const float *ps_rcnn_objectness(const ps_rcnn_t *m);      /* (n, A) logits */
const float *ps_rcnn_rpn_deltas(const ps_rcnn_t *m);      /* (n, A, 4) */
/* image i's proposals (*count rows of 4) */
const float *ps_rcnn_proposals(const ps_rcnn_t *m, int i, int *count);
/* The box head's R RoIs, in torchvision's order (image by image; per image
 * the sampled ones in proposal order, then the ground truth's, or every
 * proposal at test time): for row j of that order, rois[j*4..], its image
 * img[j], labels[j] (training: 0 background, c+1) and the outputs
 * class_logits (R, K+1) and box_deltas (R, (K+1)*4).  Copied into the
 * caller's arrays (each may be NULL; sized by ps_rcnn_max_rois); returns R. */
int ps_rcnn_box_outputs(const ps_rcnn_t *m, float *rois, int32_t *img, int32_t *labels,
                        float *class_logits, float *box_deltas);
/* The same for box head stage k (0 .. stages-1; Cascade R-CNN: its RoIs
 * are stage k-1's refined boxes, its deltas class-agnostic: 4 per RoI). */
int ps_rcnn_stage_outputs(const ps_rcnn_t *m, int k, float *rois, int32_t *img,
                          int32_t *labels, float *class_logits, float *box_deltas);
int ps_rcnn_max_rois(const ps_rcnn_t *m);
/* Detections of image i after an inference forward (ps_det_roi_postprocess
 * with the config's post parameters, clipped to image_hw; made by the
 * forward): at most post.max_det rows; returns the count. */
int ps_rcnn_detect(const ps_rcnn_t *m, int i, float *boxes, float *scores, int32_t *classes);
/* Mask R-CNN, after an inference forward: the mask of each of image i's
 * detections (ps_rcnn_detect's order) as torchvision's maskrcnn_inference
 * gives it -- the sigmoid of the detected class's 28 x 28 logits (2 x
 * mask_roi_size square), M*M floats per detection into probs; returns the
 * count, PS_ESTATE without the mask branch. */
int ps_rcnn_detect_masks(const ps_rcnn_t *m, int i, float *probs);
/* Mask R-CNN's last mask logits: rows (torchvision's order: training the
 * positive RoIs image by image, inference the detections), each (K+1) x
 * M x M, copied into logits (may be NULL; sized by ps_rcnn_max_mask_rois),
 * with each row's channel (class + 1) into labels (may be NULL); returns
 * the row count. */
int ps_rcnn_mask_outputs(const ps_rcnn_t *m, float *logits, int32_t *labels);
int ps_rcnn_max_mask_rois(const ps_rcnn_t *m);
/* The rows the mask head computes on for `rows` RoIs: rows up to 16, then
 * rounded up to a multiple of 2^(floor(log2 rows) - 3) -- at most 1/8
 * more, 8 sizes per doubling -- so that the CPU's per-shape kernel choice
 * meets few batch sizes (rcnn_mask.c). */
int ps_rcnn_mask_bucket(int rows);

/* Tables, groups, specs, as ps_retinanet.h's (names are torchvision's). */
const ps_model_param_t *ps_rcnn_params(const ps_rcnn_t *m, int *n);
const ps_model_buffer_t *ps_rcnn_buffers(const ps_rcnn_t *m, int *n);
int ps_rcnn_find_param(const ps_rcnn_t *m, const char *name);
int ps_rcnn_groups(const ps_rcnn_t *m, ps_param_group_t *groups, int max);
int ps_rcnn_tensor_specs(const ps_rcnn_t *m, ps_tensor_spec_t **specs);

/* Per-layer hooks, ps_model_set_hooks' contract over ps_rcnn_params' rows.
 * Groups: the backbone's stem and blocks (its own hooks), the FPN, the RPN
 * head, each box stage (fc6 .. bbox_pred), the mask branch.
 * weights_needed in forward order (backbone, FPN, RPN head, box stages,
 * mask branch; each before the group's first layer is queued); grad_ready
 * as each group's backward is queued: RPN head, box stages, mask branch,
 * FPN, then the backbone top down.  The host work between the stages
 * (proposals, sampling, cascade refinement) runs between the groups as
 * without hooks.  ps_rcnn_hookable: the tables and ps_rcnn_set_hooks for
 * --overlap. */
void ps_rcnn_set_hooks(ps_rcnn_t *m, ps_model_hook_fn grad_ready, ps_model_hook_fn weights_needed,
                       void *ctx);
void ps_rcnn_hookable(ps_rcnn_t *m, ps_model_hookable_t *h);

/* safetensors in torchvision's names (ps.arch "fasterrcnn-resnetD-fpn").
 * load_weights (ps_weights.h, as ps_retina_load_weights): our own
 * checkpoint, strict unless partial, or an ImageNet classifier for the
 * backbone (a torchvision ResNet or an official TSM checkpoint; the FPN and
 * heads keep their init); nothing changes on error.  load = load_weights(m,
 * path, 0); load_backbone takes only the classifier kinds. */
int ps_rcnn_save(const ps_rcnn_t *m, const char *path);
int ps_rcnn_load_weights(ps_rcnn_t *m, const char *path, int partial);
int ps_rcnn_load(ps_rcnn_t *m, const char *path);
int ps_rcnn_load_backbone(ps_rcnn_t *m, const char *path);

#endif
