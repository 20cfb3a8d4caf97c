/* Box geometry for RetinaNet, CPU: anchors, box coding, IoU,
 * anchor assignment, class-wise NMS and the inference post-processing.
 * Boxes are (x1, y1, x2, y2) floats in input-image pixels, rows of 4.
 * Conventions follow torchvision's RetinaNet (0.14) so goldens come straight
 * from torchvision; where we deviate it is said below.
 */
#ifndef PS_DET_BOXES_H
#define PS_DET_BOXES_H
#include <stddef.h>
#include <stdint.h>

/* log(1000/16): torchvision's bbox_xform_clip, the cap on decoded dw/dh. */
#define PS_DET_BBOX_CLIP 4.135166556742356f

/* ---- anchors ---------------------------------------------------------------
 * torchvision AnchorGenerator conventions:
 *   - cell anchors per (ratio r, size s), ratio-major: index = ri*nsizes + si;
 *     h = sqrt(r) * s, w = s / sqrt(r) (r = h/w), cell anchor =
 *     round([-w, -h, w, h] / 2) with round-half-even (torch.round), float32;
 *   - centred on (x*stride, y*stride) — the top-left corner of each cell, no
 *     half-pixel offset;
 *   - order: location-major, row-major over the map, anchor-minor:
 *     row = (y*W + x)*nA + a  (nA = nratios*nsizes).
 * Sizes are SimpleDet's 4 * stride * 2^(i/3), i = 0,1,2 as
 * floats (torchvision's default list truncates them to ints: 32, 40, 50 for
 * stride 8; we keep 40.3, 50.8 before the rounding of the corners). */
#define PS_DET_NUM_ANCHORS 9  /* 3 sizes x 3 ratios */
/* sizes[3] = 4*stride*2^(i/3);  ratios[3] = 0.5, 1, 2 */
void ps_det_retina_sizes(float *sizes, int stride);
extern const float ps_det_retina_ratios[3];
/* cell (nratios*nsizes, 4) */
void ps_det_cell_anchors(float *cell, const float *sizes, int nsizes, const float *ratios,
                         int nratios);
/* anchors (H*W*ncell, 4) for a H x W map with the given stride. */
void ps_det_grid_anchors(float *anchors, const float *cell, int ncell, int H, int W,
                         int stride);

/* ---- box coding (torchvision BoxCoder, weights (1,1,1,1)) ------------------
 * encode: dx = (gcx - acx)/aw, dy likewise, dw = log(gw/aw), dh = log(gh/ah),
 *   widths x2-x1 (no +1), centres x1 + 0.5 w.
 * decode: dw, dh clamped above at PS_DET_BBOX_CLIP, cx = dx*aw + acx,
 *   w = exp(dw)*aw, box = (cx - 0.5w, cy - 0.5h, cx + 0.5w, cy + 0.5h). */
void ps_det_box_encode(float *deltas, const float *gt, const float *anchors, int n);
void ps_det_box_decode(float *boxes, const float *deltas, const float *anchors, int n);
/* The same with torchvision BoxCoder's weights (wx, wy, ww, wh): encode
 * dx = wx * (gcx - acx) / aw, dw = ww * log(gw / aw), ...; decode divides
 * the deltas by the weights first, then clamps dw, dh as above.  Weights
 * (1,1,1,1) give the functions above bit for bit; the R-CNN box heads use
 * (10,10,5,5) (Cascade's later stages (20,20,10,10), (30,30,15,15)). */
void ps_det_box_encode_w(float *deltas, const float *gt, const float *anchors, int n,
                         const float *weights);
void ps_det_box_decode_w(float *boxes, const float *deltas, const float *anchors, int n,
                         const float *weights);
/* clamp x to [0, width], y to [0, height] (torchvision clip_boxes_to_image) */
void ps_det_box_clip(float *boxes, int n, int height, int width);

/* iou (M,N) of boxes a (M,4) and b (N,4), torchvision box_iou: inter/union
 * in float, area (x2-x1)*(y2-y1), empty intersections 0.  0/0 (two empty
 * boxes) gives NaN as torchvision. */
void ps_det_box_iou(float *iou, const float *a, int M, const float *b, int N);

/* ---- assignment (torchvision Matcher(0.5, 0.4, allow_low_quality=True)) ----
 * matched[a] for each of the A anchors: index of the GT with the highest IoU
 * if that IoU >= hi; -1 (PS_DET_BELOW) if < lo; -2 (PS_DET_BETWEEN) otherwise.
 * Low-quality matches: for every GT, each anchor whose IoU with it equals
 * the GT's best IoU (ties: all of them) gets back its own arg-max GT (as
 * torchvision: the anchor keeps its best GT, which is usually this one), so
 * every GT has at least one positive anchor.  Choice kept from torchvision
 * (Detectron's RetinaNet does the same); one deviation: a GT whose best IoU
 * is 0 (no anchor overlaps it at all, e.g. a degenerate box) adds no low-
 * quality matches — torchvision would turn every non-overlapping anchor
 * into a positive of GT 0 there.  Ties in the arg-max go to the lower GT
 * index.  iou_scratch: M*A floats (NULL = allocated here).  Returns the
 * number of positive anchors, or PS_ENOMEM. */
#define PS_DET_BELOW (-1)
#define PS_DET_BETWEEN (-2)
int ps_det_assign(int32_t *matched, const float *anchors, int A, const float *gt, int M,
                  float hi, float lo, float *iou_scratch);
/* The Matcher with allow_low_quality_matches as a flag: ps_det_assign is
 * low_quality 1; the R-CNN box heads match proposals with 0
 * (Matcher(0.5, 0.5, False)). */
int ps_det_match(int32_t *matched, const float *boxes, int A, const float *gt, int M, float hi,
                 float lo, int low_quality, float *iou_scratch);
/* Training targets from an assignment: labels[a] (the convention of the
 * detection slots of the backend table, worker/engine/ps_engine.h: -1
 * ignore, 0 background, gt_class+1 foreground, gt_class in 0..K-1) and
 * box_targets (A,4) = encode(gt[matched], anchor) on positives, 0 elsewhere.
 * Returns the number of positives, PS_EINVAL for a class outside 0..K-1. */
int ps_det_make_targets(int32_t *labels, float *box_targets, const int32_t *matched,
                        const float *anchors, int A, const float *gt, const int32_t *gt_class,
                        int M, int K);

/* ---- NMS ------------------------------------------------------------------
 * Greedy NMS as torchvision.ops.nms: visit boxes by descending score, keep a
 * box and suppress every later one with IoU > thresh (strictly).  Ties in
 * score: lower index first (torchvision's sort is not stable; inputs with
 * tied scores may order differently there).  keep receives the kept indices
 * in visiting order; returns their count or PS_ENOMEM. */
int ps_det_nms(int32_t *keep, const float *boxes, const float *scores, int n, float thresh);
/* Class-wise (batched) NMS: NMS within each label, result ordered by
 * descending score (ties lower index first), as torchvision batched_nms. */
int ps_det_batched_nms(int32_t *keep, const float *boxes, const float *scores,
                       const int32_t *labels, int n, float thresh);

/* ---- inference post-processing (torchvision RetinaNet
 * .postprocess_detections, one image) ---------------------------------------
 * Per level l: scores = sigmoid(logits[l]) (A_l, K) flattened anchor-major,
 * keep scores > score_thresh, the top `topk` of those (descending), decode
 * their anchors' deltas, clip to the image; then batched NMS over all levels
 * and the first max_det.  Outputs boxes (max_det,4), scores, labels
 * (0..K-1); returns the number of detections (<= max_det) or PS_ENOMEM. */
typedef struct ps_det_post_params {
    float score_thresh;  /* 0.05 */
    int topk;            /* 1000 per level */
    float nms_thresh;    /* 0.5 */
    int max_det;         /* 100 */
} ps_det_post_params_t;
void ps_det_post_defaults(ps_det_post_params_t *p);
int ps_det_postprocess(float *out_boxes, float *out_scores, int32_t *out_labels,
                       const float *const *logits, const float *const *deltas,
                       const float *const *anchors, const int *A, int nlevels, int K,
                       int height, int width, const ps_det_post_params_t *p);

#endif
