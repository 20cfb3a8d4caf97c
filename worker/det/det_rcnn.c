/* Box logic of the two-stage detectors (contracts in det_rcnn.h).  Float
 * arithmetic in torchvision's order, as det_boxes.c. */
#include "worker/det/det_rcnn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/det/det_boxes.h"
#include "worker/data/ps_video.h"

/* (key, index) pairs ordered by ascending key, then index: a total order */
typedef struct keyed {
    float key;
    int32_t idx;
} keyed_t;

static int cmp_keyed(const void *pa, const void *pb)
{
    const keyed_t *a = pa, *b = pb;
    if (a->key < b->key) return -1;
    if (a->key > b->key) return 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

/* ---- sampler ------------------------------------------------------------------ */

uint64_t ps_det_sample_key(uint64_t seed, int site, int image)
{
    return seed ^ (0x9E3779B97F4A7C15ull * ((uint64_t)site * 65536u + (uint64_t)image + 1u));
}

/* 2^24 ps_rng_uniform(key, i) (worker/engine/ps_engine.h), the same
 * SplitMix64 step as the video sampler's mix: an integer, exact in float */
static float hash24(uint64_t key, int i)
{
    return (float)(ps_vrng_mix(key + (uint64_t)i * 0x9E3779B97F4A7C15ull) >> 40);
}

/* keep the `take` elements of class `want` (1: positive, 0: negative) with
 * the smallest hash; the rest of that class become -1 */
static void keep_smallest(int32_t *labels, int n, int want, int count, int take, uint64_t key,
                          keyed_t *buf)
{
    if (take >= count) return;
    int m = 0;
    for (int i = 0; i < n; i++)
        if ((want ? labels[i] >= 1 : labels[i] == 0))
            buf[m++] = (keyed_t){hash24(key, i), i};
    qsort(buf, (size_t)m, sizeof *buf, cmp_keyed);
    for (int j = take; j < m; j++) labels[buf[j].idx] = -1;
}

int ps_det_sample_balanced(int32_t *labels, int n, int batch, float fraction, uint64_t key)
{
    int npos = 0, nneg = 0;
    for (int i = 0; i < n; i++) {
        npos += labels[i] >= 1;
        nneg += labels[i] == 0;
    }
    int want_pos = (int)((float)batch * fraction);
    int tpos = npos < want_pos ? npos : want_pos;
    int tneg = nneg < batch - tpos ? nneg : batch - tpos;
    if (tpos < npos || tneg < nneg) {
        keyed_t *buf = malloc(sizeof *buf * (size_t)(npos > nneg ? npos : nneg));
        if (!buf) {
            ps_error("fg/bg sampling: out of memory (%d elements)", n);
            return PS_ENOMEM;
        }
        keep_smallest(labels, n, 1, npos, tpos, key, buf);
        keep_smallest(labels, n, 0, nneg, tneg, key, buf);
        free(buf);
    }
    return tpos + tneg;
}

/* ---- level mapper ------------------------------------------------------------- */

int ps_det_roi_level(const float *b, int kmin, int kmax, int k0, float canonical, float eps)
{
    float s = sqrtf((b[2] - b[0]) * (b[3] - b[1]));
    float lvl = floorf((float)k0 + log2f(s / canonical) + eps);
    if (!(lvl >= (float)kmin)) lvl = (float)kmin; /* NaN too (a box of negative area) */
    if (lvl > (float)kmax) lvl = (float)kmax;
    return (int)lvl - kmin;
}

/* ---- RPN proposals ------------------------------------------------------------- */

static int small_box(const float *b, float min_size)
{
    return !(b[2] - b[0] >= min_size && b[3] - b[1] >= min_size);
}

int ps_det_rpn_proposals(float *out_boxes, float *out_scores, const float *objectness,
                         const float *deltas, const float *anchors, const int *A_per_level,
                         int nlevels, int height, int width, const ps_det_rpn_params_t *p)
{
    int total = 0, cap = 0, maxA = 0;
    for (int l = 0; l < nlevels; l++) {
        total += A_per_level[l];
        cap += A_per_level[l] < p->pre_nms_top_n ? A_per_level[l] : p->pre_nms_top_n;
        if (A_per_level[l] > maxA) maxA = A_per_level[l];
    }
    keyed_t *ord = malloc(sizeof *ord * (size_t)(maxA ? maxA : 1));
    float *boxes = malloc(sizeof(float) * 4 * (size_t)(cap ? cap : 1));
    float *scores = malloc(sizeof(float) * (size_t)(cap ? cap : 1));
    int32_t *lvl = malloc(sizeof(int32_t) * (size_t)(cap ? cap : 1));
    int32_t *keep = malloc(sizeof(int32_t) * (size_t)(cap ? cap : 1));
    int n = 0, rc;
    if (!ord || !boxes || !scores || !lvl || !keep) {
        ps_error("rpn proposals: out of memory (%d anchors)", total);
        rc = PS_ENOMEM;
        goto out;
    }
    for (int l = 0, off = 0; l < nlevels; off += A_per_level[l], l++) {
        int A = A_per_level[l];
        for (int a = 0; a < A; a++) ord[a] = (keyed_t){-objectness[off + a], a};
        qsort(ord, (size_t)A, sizeof *ord, cmp_keyed);
        int top = A < p->pre_nms_top_n ? A : p->pre_nms_top_n;
        for (int j = 0; j < top; j++) {
            int a = off + ord[j].idx;
            float *b = boxes + (size_t)n * 4;
            ps_det_box_decode(b, deltas + (size_t)a * 4, anchors + (size_t)a * 4, 1);
            ps_det_box_clip(b, 1, height, width);
            float s = 1.0f / (1.0f + expf(-objectness[a]));
            if (small_box(b, p->min_size) || !(s >= p->score_thresh)) continue;
            scores[n] = s;
            lvl[n++] = l;
        }
    }
    rc = ps_det_batched_nms(keep, boxes, scores, lvl, n, p->nms_thresh);
    if (rc < 0) goto out;
    if (rc > p->post_nms_top_n) rc = p->post_nms_top_n;
    for (int i = 0; i < rc; i++) {
        memcpy(out_boxes + (size_t)i * 4, boxes + (size_t)keep[i] * 4, 4 * sizeof(float));
        if (out_scores) out_scores[i] = scores[keep[i]];
    }
out:
    free(ord), free(boxes), free(scores), free(lvl), free(keep);
    return rc;
}

/* ---- box head targets ------------------------------------------------------------- */

int ps_det_roi_targets(float *rois, int32_t *labels, float *targets, int32_t *gt_index,
                       const float *proposals, int P, const float *gt, const int32_t *gt_class, int M, int K,
                       const ps_det_roi_sample_params_t *p, uint64_t key)
{
    for (int g = 0; g < M; g++)
        if (gt_class[g] < 0 || gt_class[g] >= K) {
            ps_error("box head targets: class %d of gt %d outside 0..%d", gt_class[g], g, K - 1);
            return PS_EINVAL;
        }
    int n = P + M, rc;
    float *cand = malloc(sizeof(float) * 4 * (size_t)(n ? n : 1));
    int32_t *matched = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!cand || !matched || !lab) {
        ps_error("box head targets: out of memory (%d proposals)", n);
        rc = PS_ENOMEM;
        goto out;
    }
    memcpy(cand, proposals, sizeof(float) * 4 * (size_t)P);
    memcpy(cand + (size_t)P * 4, gt, sizeof(float) * 4 * (size_t)M);
    if ((rc = ps_det_match(matched, cand, n, gt, M, p->fg_iou, p->bg_iou, 0, NULL)) < 0) goto out;
    for (int i = 0; i < n; i++)
        lab[i] = matched[i] >= 0 ? gt_class[matched[i]] + 1 : matched[i] == PS_DET_BELOW ? 0 : -1;
    if ((rc = ps_det_sample_balanced(lab, n, p->batch, p->fraction, key)) < 0) goto out;
    int s = 0;
    for (int i = 0; i < n; i++) {
        if (lab[i] < 0) continue;
        memcpy(rois + (size_t)s * 4, cand + (size_t)i * 4, 4 * sizeof(float));
        labels[s] = lab[i];
        if (gt_index) gt_index[s] = lab[i] >= 1 ? matched[i] : -1;
        if (lab[i] >= 1)
            ps_det_box_encode_w(targets + (size_t)s * 4, gt + (size_t)matched[i] * 4,
                                cand + (size_t)i * 4, 1, p->weights);
        else
            memset(targets + (size_t)s * 4, 0, 4 * sizeof(float));
        s++;
    }
    rc = s;
out:
    free(cand), free(matched), free(lab);
    return rc;
}

int ps_det_roi_relabel(int32_t *labels, float *targets, int32_t *gt_index, const float *rois,
                       int R, const float *gt, const int32_t *gt_class, int M, int K,
                       const ps_det_roi_sample_params_t *p)
{
    for (int g = 0; g < M; g++)
        if (gt_class[g] < 0 || gt_class[g] >= K) {
            ps_error("cascade stage targets: class %d of gt %d outside 0..%d", gt_class[g], g,
                     K - 1);
            return PS_EINVAL;
        }
    int32_t *matched = malloc(sizeof(int32_t) * (size_t)(R ? R : 1));
    if (!matched) {
        ps_error("cascade stage targets: out of memory (%d RoIs)", R);
        return PS_ENOMEM;
    }
    int rc = ps_det_match(matched, rois, R, gt, M, p->fg_iou, p->fg_iou, 0, NULL);
    for (int r = 0; rc >= 0 && r < R; r++) {
        int fg = matched[r] >= 0;
        labels[r] = fg ? gt_class[matched[r]] + 1 : 0;
        if (gt_index) gt_index[r] = fg ? matched[r] : -1;
        if (fg)
            ps_det_box_encode_w(targets + (size_t)r * 4, gt + (size_t)matched[r] * 4,
                                rois + (size_t)r * 4, 1, p->weights);
        else
            memset(targets + (size_t)r * 4, 0, 4 * sizeof(float));
    }
    free(matched);
    return rc < 0 ? rc : R;
}

/* ---- box head post-processing ------------------------------------------------------- */

/* The candidates (r, k) with probs[r][k] > score_thresh, their box either
 * boxes[r] (one per RoI) or class k's deltas of RoI r decoded, clipped,
 * small ones dropped, then class-wise NMS and the best max_det. */
static int select_dets(float *out_boxes, float *out_scores, int32_t *out_classes,
                       const float *probs, const float *box_deltas, const float *given,
                       const float *rois, int R, int K, int height, int width,
                       const ps_det_roi_post_params_t *p)
{
    size_t cap = (size_t)R * K;
    float *boxes = malloc(sizeof(float) * 4 * (cap ? cap : 1));
    float *scores = malloc(sizeof(float) * (cap ? cap : 1));
    int32_t *cls = malloc(sizeof(int32_t) * (cap ? cap : 1));
    int32_t *keep = malloc(sizeof(int32_t) * (cap ? cap : 1));
    int n = 0, rc;
    if (!boxes || !scores || !cls || !keep) {
        ps_error("box head post-processing: out of memory (%d RoIs x %d classes)", R, K);
        rc = PS_ENOMEM;
        goto out;
    }
    for (int r = 0; r < R; r++)
        for (int k = 1; k <= K; k++) {
            float s = probs[(size_t)r * (K + 1) + k];
            if (!(s > p->score_thresh)) continue;
            float *b = boxes + (size_t)n * 4;
            if (given)
                memcpy(b, given + (size_t)r * 4, 4 * sizeof(float));
            else
                ps_det_box_decode_w(b, box_deltas + ((size_t)r * (K + 1) + k) * 4,
                                    rois + (size_t)r * 4, 1, p->weights);
            ps_det_box_clip(b, 1, height, width);
            if (small_box(b, p->min_size)) continue;
            scores[n] = s;
            cls[n++] = k - 1;
        }
    rc = ps_det_batched_nms(keep, boxes, scores, cls, n, p->nms_thresh);
    if (rc < 0) goto out;
    if (rc > p->max_det) rc = p->max_det;
    for (int i = 0; i < rc; i++) {
        memcpy(out_boxes + (size_t)i * 4, boxes + (size_t)keep[i] * 4, 4 * sizeof(float));
        out_scores[i] = scores[keep[i]];
        out_classes[i] = cls[keep[i]];
    }
out:
    free(boxes), free(scores), free(cls), free(keep);
    return rc;
}

void ps_det_roi_softmax(float *probs, const float *class_logits, int R, int K)
{
    for (int r = 0; r < R; r++) {
        /* softmax as the xent layer: exp(x - max), double sum, times 1/sum */
        const float *x = class_logits + (size_t)r * (K + 1);
        float *q = probs + (size_t)r * (K + 1);
        float m = x[0];
        for (int k = 1; k <= K; k++) m = x[k] > m ? x[k] : m;
        double sum = 0;
        for (int k = 0; k <= K; k++) sum += q[k] = expf(x[k] - m);
        float inv = (float)(1.0 / sum);
        for (int k = 0; k <= K; k++) q[k] *= inv;
    }
}

int ps_det_roi_postprocess(float *out_boxes, float *out_scores, int32_t *out_classes,
                           const float *class_logits, const float *box_deltas,
                           const float *rois, int R, int K, int height, int width,
                           const ps_det_roi_post_params_t *p)
{
    float *probs = malloc(sizeof(float) * (size_t)(R ? R : 1) * (K + 1));
    if (!probs) {
        ps_error("box head post-processing: out of memory (%d RoIs x %d classes)", R, K);
        return PS_ENOMEM;
    }
    ps_det_roi_softmax(probs, class_logits, R, K);
    int rc = select_dets(out_boxes, out_scores, out_classes, probs, box_deltas, NULL, rois, R, K,
                         height, width, p);
    free(probs);
    return rc;
}

int ps_det_roi_select(float *out_boxes, float *out_scores, int32_t *out_classes,
                      const float *probs, const float *boxes, int R, int K, int height, int width,
                      const ps_det_roi_post_params_t *p)
{
    return select_dets(out_boxes, out_scores, out_classes, probs, NULL, boxes, NULL, R, K, height,
                       width, p);
}
