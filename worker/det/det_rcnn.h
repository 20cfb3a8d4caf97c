/* Box logic of the two-stage (R-CNN) detectors, CPU, one image at a time:
 * the fg/bg sampler, the FPN level of a RoI, the RPN's proposal selection,
 * the box head's training targets and its inference post-processing.
 * Conventions and arithmetic follow torchvision 0.14
 * (models/detection/{rpn,roi_heads,_utils}.py, ops/poolers.py) so its
 * modules can check every function here; where we deviate it is said.
 * Boxes are (x1, y1, x2, y2) floats in input-image pixels, rows of 4.
 * Classes: 0..K-1 here (torchvision's labels 1..K; 0 is its background).
 * The box-head pieces take their IoU thresholds and coder weights as
 * parameters, so every stage of a cascade uses them unchanged. */
#ifndef PS_DET_RCNN_H
#define PS_DET_RCNN_H
#include <stddef.h>
#include <stdint.h>

/* ---- balanced positive / negative sampling ----------------------------------
 * torchvision BalancedPositiveNegativeSampler(batch, fraction) with its
 * random permutations replaced by a counter hash, so another
 * implementation can draw the same sample (gen_fasterrcnn.py does):
 * num_pos = min(#positives, (int)(batch * fraction)), num_neg =
 * min(#negatives, batch - num_pos); the positives taken are the num_pos
 * with the smallest u = ps_rng_uniform(key, index) (worker/engine/ps_engine.h;
 * ties: lower index),
 * likewise the negatives -- a uniformly random subset, as a permutation's
 * prefix is.  labels (n) in: >= 1 positive, 0 negative, -1 ignored; out:
 * the same values on the sampled elements, -1 on the others.  Returns the
 * number sampled (positives + negatives), or PS_ENOMEM. */
int ps_det_sample_balanced(int32_t *labels, int n, int batch, float fraction, uint64_t key);
/* The key of image `image` (0-based within a batch) at sampling site
 * `site` (0 the RPN's anchors, 1 + s the box head of stage s) for a step
 * seed: seed ^ (0x9E3779B97F4A7C15 * (site * 65536 + image + 1)), mod 2^64. */
uint64_t ps_det_sample_key(uint64_t seed, int site, int image);

/* ---- FPN level of a RoI (torchvision LevelMapper) ----------------------------
 * floor(k0 + log2(sqrt(area) / canonical) + eps) clamped to [kmin, kmax],
 * minus kmin, in float as torchvision computes it (k0 = 4, canonical 224,
 * eps 1e-6 in Faster R-CNN; levels 2..5 = P2..P5).  A box of negative
 * area (NaN) maps to kmin (torchvision's cast of NaN is undefined). */
int ps_det_roi_level(const float *box, int kmin, int kmax, int k0, float canonical, float eps);

/* ---- RPN proposals (torchvision RegionProposalNetwork.filter_proposals) -----
 * For one image: objectness logits (A) and deltas (A, 4) of the anchors
 * (A, 4), rows level after level (A_per_level[l] each).  Per level the
 * pre_nms_top_n highest logits (ties: lower index), decoded (BoxCoder
 * weights 1), clipped to height x width; boxes narrower or lower than
 * min_size dropped, then scores sigmoid(logit) < score_thresh; NMS at
 * nms_thresh within each level (batched NMS), the result by descending
 * score, at most post_nms_top_n.  out_boxes (post_nms_top_n, 4),
 * out_scores (post_nms_top_n; may be NULL).  Returns the count or
 * PS_ENOMEM. */
typedef struct ps_det_rpn_params {
    int pre_nms_top_n;   /* per level: torchvision 2000 train / 1000 test */
    int post_nms_top_n;  /* per image: 2000 train / 1000 test */
    float nms_thresh;    /* 0.7 */
    float min_size;      /* 1e-3 */
    float score_thresh;  /* 0 */
} ps_det_rpn_params_t;
int ps_det_rpn_proposals(float *out_boxes, float *out_scores, const float *objectness,
                         const float *deltas, const float *anchors, const int *A_per_level,
                         int nlevels, int height, int width, const ps_det_rpn_params_t *p);

/* ---- box head targets (torchvision RoIHeads.select_training_samples) --------
 * For one image: the proposals (P, 4) with the ground truth (M, 4) appended
 * (as torchvision's add_gt_proposals), matched to the ground truth
 * (ps_det_match, fg_iou / bg_iou, no low-quality matches), labelled (class
 * + 1, 0 background below bg_iou, ignored between), sampled
 * (ps_det_sample_balanced with key) and kept in index order.  Writes the
 * sampled boxes (S, 4), labels (S: 0 background, c + 1 class c),
 * encoded targets (S, 4; coder weights; zero on background rows: unused)
 * and, when gt_index is not NULL, each row's matched ground truth (S: its
 * index 0..M-1 on foreground rows, -1 on background ones; Mask R-CNN's
 * mask targets).
 * The outputs hold at most min(batch, P + M) rows.  M = 0 (an image
 * without boxes): every proposal is background.  Returns S, PS_EINVAL (a
 * class outside 0..K-1, logged) or PS_ENOMEM. */
typedef struct ps_det_roi_sample_params {
    float fg_iou, bg_iou;  /* 0.5, 0.5 (Cascade: 0.6, 0.7 in later stages) */
    int batch;             /* RoIs per image: 512 */
    float fraction;        /* positives: 0.25 */
    float weights[4];      /* box coder: 10, 10, 5, 5 */
} ps_det_roi_sample_params_t;
int ps_det_roi_targets(float *rois, int32_t *labels, float *targets, int32_t *gt_index,
                       const float *proposals, int P, const float *gt, const int32_t *gt_class, int M, int K,
                       const ps_det_roi_sample_params_t *p, uint64_t key);

/* ---- a cascade stage's targets (Detectron2 CascadeROIHeads._match_and_label_boxes)
 * For one image: every RoI (R, 4: the previous stage's refined boxes, no
 * sampling, no ground truth appended) matched to the ground truth at
 * p->fg_iou (Matcher([t], [0, 1]) without low-quality matches: IoU >= t
 * foreground, else background), labels (R: 0 or class + 1), targets (R,
 * 4; encoded with p->weights; 0 on background) and, when not NULL, the
 * matched ground truth (-1 background).  Returns R, PS_EINVAL (a class
 * outside 0..K-1) or PS_ENOMEM. */
int ps_det_roi_relabel(int32_t *labels, float *targets, int32_t *gt_index, const float *rois,
                       int R, const float *gt, const int32_t *gt_class, int M, int K,
                       const ps_det_roi_sample_params_t *p);

/* ---- box head post-processing (torchvision RoIHeads.postprocess_detections)
 * For one image: class logits (R, K+1; column 0 background) and class
 * deltas (R, (K+1)*4) on the RoIs (R, 4): softmax, every class's box
 * decoded (weights) and clipped to height x width, background dropped,
 * scores > score_thresh, boxes narrower or lower than min_size dropped,
 * class-wise NMS at nms_thresh, at most max_det by descending score.
 * Outputs (max_det rows): boxes, scores, classes 0..K-1.  Returns the
 * count or PS_ENOMEM. */
typedef struct ps_det_roi_post_params {
    float score_thresh;  /* 0.05 */
    float nms_thresh;    /* 0.5 */
    int max_det;         /* 100 */
    float min_size;      /* 1e-2 */
    float weights[4];    /* 10, 10, 5, 5 */
} ps_det_roi_post_params_t;
int ps_det_roi_postprocess(float *out_boxes, float *out_scores, int32_t *out_classes,
                           const float *class_logits, const float *box_deltas,
                           const float *rois, int R, int K, int height, int width,
                           const ps_det_roi_post_params_t *p);
/* The softmax of class_logits (R, K+1) into probs, as the post-processing
 * computes it. */
void ps_det_roi_softmax(float *probs, const float *class_logits, int R, int K);
/* The same selection on given class probabilities (R, K+1) and one decoded
 * box per RoI (R, 4) for every class (Detectron2's fast_rcnn_inference
 * with class-agnostic boxes: Cascade R-CNN's mean scores over its stages
 * and its last stage's boxes): clipped, scores > score_thresh, boxes
 * smaller than min_size dropped, class-wise NMS, max_det. */
int ps_det_roi_select(float *out_boxes, float *out_scores, int32_t *out_classes,
                      const float *probs, const float *boxes, int R, int K, int height, int width,
                      const ps_det_roi_post_params_t *p);

#endif
