/* RetinaNet-FPN on the engine: a ResNet-18/34/50 backbone with frozen BN
 * (FrozenBatchNorm2d: running statistics, affine frozen), an FPN P3..P7 and
 * the shared classification / box heads, with the training loss (sigmoid
 * focal + smooth-L1, the detection slots of the backend table,
 * worker/engine/ps_engine.h) and the raw outputs for inference
 * post-processing (ps_det_postprocess, det_boxes.h).  Every layer,
 * detection layers included, goes through the backend the model was
 * created with, so the same code runs on the CPU and the GPU.
 *
 * Names are torchvision.models.detection.retinanet_resnet50_fpn's state
 * dict (0.14): backbone.body.* (the ResNet, no fc), backbone.fpn.
 * inner_blocks.{0,1,2}.0.{weight,bias} (1x1 laterals on C3..C5),
 * backbone.fpn.layer_blocks.{0,1,2}.0.* (3x3 outputs), backbone.fpn.
 * extra_blocks.p6.* / p7.*, head.classification_head.conv.{0..3}.0.*,
 * head.classification_head.cls_logits.*, head.regression_head.conv.{0..3}.0.*,
 * head.regression_head.bbox_reg.*.
 *
 * P6/P7 follow torchvision's LastLevelP6P7(in, out): P6 = conv3x3/2 on C5
 * when in != out (the paper, SimpleDet, retinanet_resnet50_fpn_v2), on P5
 * when in == out (retinanet_resnet50_fpn v1 passes (256, 256)): choose with
 * p6_from_p5 (only the p6 weight's input channel count differs);
 * P7 = conv3x3/2(relu(P6)).  Strides 8, 16, 32, 64, 128.
 *
 * Legend: N images of 3 x H x W; F = fpn_channels; K foreground classes;
 * nA = 9 anchors per location; level l = 0..4 is P3..P7 with H_l x W_l
 * locations; A = sum_l H_l*W_l*nA anchors per image.  Per-anchor rows are
 * ordered image, then level, then location (row-major), then anchor
 * (torchvision's order; ps_det_grid_anchors / the head_permute_forward slot).
 *
 * One arena for the FPN and heads (parameters, gradients, activations); the
 * backbone is a ps_model_t in features mode with its own arena.  Tables name
 * every tensor with its full torchvision name.
 */
#ifndef PS_RETINANET_H
#define PS_RETINANET_H
#include <stdint.h>

#include "ps_model.h"

#define PS_RETINA_LEVELS 5
#define PS_RETINA_ANCHORS 9

typedef struct ps_retina_config {
    int depth;          /* backbone 18, 34 or 50 */
    int num_classes;    /* K foreground classes (sigmoid, no background column) */
    int width;          /* backbone stem width: 64 = torchvision; less for tests */
    int fpn_channels;   /* F: 256; less for tests */
    int p6_from_p5;     /* 0: P6 on C5 (paper / SimpleDet); 1: on P5 (torchvision v1) */
    int freeze_at;      /* 0 nothing frozen; 1 stem (conv1, bn1); 2 stem + layer1
                           (default: SimpleDet, torchvision trainable_layers=3); k:
                           stem + layer1..layer(k-1), up to 5.  Frozen layers get
                           no backward at all */
    float bn_eps;       /* 1e-5 (FrozenBatchNorm2d) */
    int bn_mode;        /* the backbone's BN: PS_MODEL_BN_FROZEN (default,
                           FrozenBatchNorm2d: a fixed scale and bias) or
                           PS_MODEL_BN_TRAIN (BatchNorm2d: batch statistics in
                           a training forward, running ones updated, affine
                           trained outside the frozen stages; with the
                           context's bn_group the statistics are the group's:
                           SimpleDet's cross-GPU BN) */
    int recompute;      /* the backbone recomputes its stages in the backward
                           (ps_model_config_t.recompute) */
    float focal_alpha;  /* 0.25 */
    float focal_gamma;  /* 2 */
    float smoothl1_beta; /* 1/9 */
    float prior;        /* 0.01: cls_logits bias -log((1-prior)/prior) */
} ps_retina_config_t;

/* ResNet-50, 80 classes, width 64, F 256, P6 on C5, freeze_at 2, frozen BN,
 * no recompute, eps 1e-5,
 * alpha 0.25, gamma 2, beta 1/9, prior 0.01. */
void ps_retina_config_default(ps_retina_config_t *c);

typedef struct ps_retina ps_retina_t;

/* Build for batches of at most max_n images of 3 x H x W (H, W >= 32; a
 * multiple of 128 keeps every level's stride exact).  Starts from
 * ps_retina_init(m, 0, 0).  Returns 0, PS_EINVAL (logged) or PS_ENOMEM. */
int ps_retina_create(ps_retina_t **out, const ps_retina_config_t *cfg, const ps_backend_t *be,
                     ps_ctx_t *ctx, int max_n, int H, int W);
void ps_retina_destroy(ps_retina_t **m);
const ps_retina_config_t *ps_retina_config(const ps_retina_t *m);

/* Deterministic init from the counter hash (ps_model.h).  Backbone:
 * ps_model_init(body, seed, random) with the backbone's own names (no
 * "backbone.body." prefix in the hash key).  FPN convs: uniform with
 * torchvision's kaiming_uniform_(a=1) bound sqrt(3/fan_in), bias 0.  Heads:
 * uniform with std 0.01 (bound 0.01*sqrt(3)), bias 0, cls_logits bias
 * -log((1-prior)/prior).  random != 0 (tests): random BN as in
 * ps_model_init, head weights with the FPN's bound and every bias
 * (2u-1)*0.1 added, so each term carries signal. */
void ps_retina_init(ps_retina_t *m, uint64_t seed, int random);

/* Geometry: total anchors A per image; per level H_l, W_l, stride and the
 * offset of its first row within an image's A rows (any may be NULL). */
int ps_retina_num_anchors(const ps_retina_t *m);
void ps_retina_level(const ps_retina_t *m, int l, int *H, int *W, int *stride, int *offset);
/* The anchors (A, 4) for the model's input size, torchvision AnchorGenerator
 * conventions with SimpleDet's sizes (ps_det_retina_sizes, det_boxes.h), at
 * the nominal strides 8..128 (owned by the model). */
const float *ps_retina_anchors(const ps_retina_t *m);

/* Forward over n images (n*3*H*W floats, copied).  labels (n*A; -1 ignore,
 * 0 background, 1..K class) and box_targets (n*A*4, encoded deltas on
 * positives) may both be NULL (inference); else the losses are written:
 * focal over non-ignored anchors and smooth-L1 over positives, both divided
 * by max(1, positives in the batch) (Detectron / SimpleDet; torchvision
 * normalises per image, which is the same for n = 1).  training: BN batch
 * statistics (cfg.bn_mode TRAIN) and a backward may follow.  Returns 0 or
 * PS_EINVAL (bad label, logged). */
int ps_retina_forward(ps_retina_t *m, const float *images, int n, const int32_t *labels,
                      const float *box_targets, int training, float *cls_loss,
                      float *box_loss);
/* Outputs of the last forward: cls logits (n, A, K) and box deltas (n, A, 4)
 * in the row order above.  For ps_det_postprocess on image i, level l:
 * logits + (i*A + offset_l)*K, deltas + (i*A + offset_l)*4, anchors +
 * offset_l*4, H_l*W_l*nA rows. */
const float *ps_retina_cls_out(const ps_retina_t *m);
const float *ps_retina_box_out(const ps_retina_t *m);
/* Backward of the last training forward with targets (d(cls+box)/d.);
 * gradients ACCUMULATE into the tables' g.  PS_ESTATE otherwise. */
int ps_retina_backward(ps_retina_t *m);
void ps_retina_zero_grad(ps_retina_t *m);
/* Bytes of the model's arenas (the backbone's and the FPN / heads'). */
size_t ps_retina_arena_bytes(const ps_retina_t *m);
/* Floating-point operations of one forward / backward over n images from
 * the conv shapes (2 per multiply-add; frozen stages get no backward, the
 * image no input gradient). */
void ps_retina_flops(const ps_retina_t *m, int n, double *fwd, double *bwd);

/* Tables (owned by the model; names are full torchvision names).  Frozen
 * tensors (backbone BN affine, frozen stages) have trainable 0 and keep a
 * zero gradient.  Buffers: the backbone's BN running statistics. */
const ps_model_param_t *ps_retina_params(const ps_retina_t *m, int *n);
const ps_model_buffer_t *ps_retina_buffers(const ps_retina_t *m, int *n);
int ps_retina_find_param(const ps_retina_t *m, const char *name);
/* Optimizer groups: weights decay, biases lr x2 no decay (Detectron's
 * BIAS_LR_FACTOR 2 / no bias decay), the 5 PS_MODEL_GROUP_* slots as the
 * ResNet uses them.  Returns PS_MODEL_NGROUPS or PS_EINVAL. */
int ps_retina_groups(const ps_retina_t *m, ps_param_group_t *groups, int max);
/* Trainable tensors in model order as partition specs (malloc'd). */
int ps_retina_tensor_specs(const ps_retina_t *m, ps_tensor_spec_t **specs);

/* Per-layer hooks, ps_model_set_hooks' contract over ps_retina_params'
 * rows.  Groups: the backbone's stem and blocks (its own hooks), the FPN
 * (inner, layer, p6, p7), the classification head, the regression head.
 * weights_needed in forward order (backbone, FPN, both heads before the
 * per-level loop that interleaves them); grad_ready once each group's
 * backward is queued: both heads (after the last level), the FPN, then
 * the backbone top down.  ps_retina_hookable: the tables and
 * ps_retina_set_hooks for --overlap. */
void ps_retina_set_hooks(ps_retina_t *m, ps_model_hook_fn grad_ready,
                         ps_model_hook_fn weights_needed, void *ctx);
void ps_retina_hookable(ps_retina_t *m, ps_model_hookable_t *h);

/* safetensors with the torchvision names (every parameter and buffer,
 * num_batches_tracked as I64 0-dim: torchvision's FrozenBatchNorm2d drops it
 * on load, BatchNorm2d keeps it), metadata ps.arch "retinanet-resnetD-fpn". */
int ps_retina_save(const ps_retina_t *m, const char *path);
/* Load through ps_weights.h: a detector checkpoint (torchvision names; all
 * present with the same shape, nothing unknown, num_batches_tracked
 * optional), or an ImageNet classifier for the backbone -- a torchvision
 * ResNet state dict (conv1.weight, layer1.0.bn1.running_mean, ...) converted
 * by worker/models/torch2safetensors.py, or an official TSM checkpoint --
 * whose fc is skipped (logged) and whose missing FPN and heads keep their
 * init.  partial: PS_WEIGHTS_PARTIAL (missing tensors keep their init,
 * unknown ones are skipped, all listed).  Nothing changes on error;
 * gradients are zeroed.  Returns as ps_weights_load. */
int ps_retina_load_weights(ps_retina_t *m, const char *path, int partial);
/* ps_retina_load_weights(m, path, 0). */
int ps_retina_load(ps_retina_t *m, const char *path);
/* The model without its losses as an ONNX graph (onnx_graph.h: opset 17;
 * onnx_retinanet.c): input "images" (batch, 3, H, W) at the size the model
 * was created for; outputs "cls_logits" (batch, A, K) and "bbox_regression"
 * (batch, A, 4), ps_retina_cls_out / ps_retina_box_out of an inference
 * forward.  Anchors, decoding and NMS stay outside.  Written atomically;
 * 0 or PS_E* (logged). */
int ps_retina_export_onnx(const ps_retina_t *m, const char *path);
/* Only the classifier kinds above (a detector checkpoint is refused). */
int ps_retina_load_backbone(ps_retina_t *m, const char *path);

#endif
