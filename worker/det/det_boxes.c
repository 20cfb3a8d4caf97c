/* Box geometry for RetinaNet, CPU (contracts in det_boxes.h).  Arithmetic is
 * float in the same order as torchvision's so goldens match to an ulp. */
#include "worker/det/det_boxes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

const float ps_det_retina_ratios[3] = {0.5f, 1.0f, 2.0f};

void ps_det_retina_sizes(float *sizes, int stride)
{
    for (int i = 0; i < 3; i++) sizes[i] = (float)((double)(4 * stride) * pow(2.0, i / 3.0));
}

void ps_det_cell_anchors(float *cell, const float *sizes, int nsizes, const float *ratios,
                         int nratios)
{
    for (int r = 0; r < nratios; r++) {
        float hr = sqrtf(ratios[r]), wr = 1.0f / hr;
        for (int s = 0; s < nsizes; s++) {
            float ws = wr * sizes[s], hs = hr * sizes[s];
            float *c = cell + (r * nsizes + s) * 4;
            /* rintf: round half to even in the default rounding mode, as torch.round */
            c[0] = rintf(-ws / 2.0f);
            c[1] = rintf(-hs / 2.0f);
            c[2] = rintf(ws / 2.0f);
            c[3] = rintf(hs / 2.0f);
        }
    }
}

void ps_det_grid_anchors(float *anchors, const float *cell, int ncell, int H, int W, int stride)
{
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            float sx = (float)(x * stride), sy = (float)(y * stride);
            float *o = anchors + ((long)(y * W + x) * ncell) * 4;
            for (int a = 0; a < ncell; a++) {
                o[a * 4 + 0] = sx + cell[a * 4 + 0];
                o[a * 4 + 1] = sy + cell[a * 4 + 1];
                o[a * 4 + 2] = sx + cell[a * 4 + 2];
                o[a * 4 + 3] = sy + cell[a * 4 + 3];
            }
        }
}

static const float unit_weights[4] = {1.f, 1.f, 1.f, 1.f};

void ps_det_box_encode(float *deltas, const float *gt, const float *anchors, int n)
{
    ps_det_box_encode_w(deltas, gt, anchors, n, unit_weights);
}

void ps_det_box_decode(float *boxes, const float *deltas, const float *anchors, int n)
{
    ps_det_box_decode_w(boxes, deltas, anchors, n, unit_weights);
}

/* torchvision encode_boxes: wx * (gcx - acx) / aw left to right (a weight 1
 * multiplies exactly, so the unweighted results are unchanged) */
void ps_det_box_encode_w(float *deltas, const float *gt, const float *anchors, int n,
                         const float *wt)
{
    for (int i = 0; i < n; i++) {
        const float *a = anchors + i * 4, *g = gt + i * 4;
        float aw = a[2] - a[0], ah = a[3] - a[1];
        float acx = a[0] + 0.5f * aw, acy = a[1] + 0.5f * ah;
        float gw = g[2] - g[0], gh = g[3] - g[1];
        float gcx = g[0] + 0.5f * gw, gcy = g[1] + 0.5f * gh;
        deltas[i * 4 + 0] = wt[0] * (gcx - acx) / aw;
        deltas[i * 4 + 1] = wt[1] * (gcy - acy) / ah;
        deltas[i * 4 + 2] = wt[2] * logf(gw / aw);
        deltas[i * 4 + 3] = wt[3] * logf(gh / ah);
    }
}

/* torchvision BoxCoder.decode_single: the deltas divided by the weights
 * (a division by 1 is exact) */
void ps_det_box_decode_w(float *boxes, const float *deltas, const float *anchors, int n,
                         const float *wt)
{
    for (int i = 0; i < n; i++) {
        const float *a = anchors + i * 4;
        const float d[4] = {deltas[i * 4] / wt[0], deltas[i * 4 + 1] / wt[1],
                            deltas[i * 4 + 2] / wt[2], deltas[i * 4 + 3] / wt[3]};
        float w = a[2] - a[0], h = a[3] - a[1];
        float cx = a[0] + 0.5f * w, cy = a[1] + 0.5f * h;
        float dw = fminf(d[2], PS_DET_BBOX_CLIP), dh = fminf(d[3], PS_DET_BBOX_CLIP);
        if (isnan(d[2])) dw = d[2]; /* clamp keeps NaN, as torch.clamp */
        if (isnan(d[3])) dh = d[3];
        float pcx = d[0] * w + cx, pcy = d[1] * h + cy;
        float pw = expf(dw) * w, ph = expf(dh) * h;
        float hw = 0.5f * pw, hh = 0.5f * ph;
        boxes[i * 4 + 0] = pcx - hw;
        boxes[i * 4 + 1] = pcy - hh;
        boxes[i * 4 + 2] = pcx + hw;
        boxes[i * 4 + 3] = pcy + hh;
    }
}

static float clampf(float v, float lo, float hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

void ps_det_box_clip(float *boxes, int n, int height, int width)
{
    for (int i = 0; i < n; i++) {
        float *b = boxes + i * 4;
        b[0] = clampf(b[0], 0, (float)width);
        b[1] = clampf(b[1], 0, (float)height);
        b[2] = clampf(b[2], 0, (float)width);
        b[3] = clampf(b[3], 0, (float)height);
    }
}

static float iou1(const float *a, float area_a, const float *b, float area_b)
{
    float w = fminf(a[2], b[2]) - fmaxf(a[0], b[0]);
    float h = fminf(a[3], b[3]) - fmaxf(a[1], b[1]);
    if (w < 0) w = 0;
    if (h < 0) h = 0;
    float inter = w * h;
    return inter / (area_a + area_b - inter);
}

static float area(const float *b)
{
    return (b[2] - b[0]) * (b[3] - b[1]);
}

void ps_det_box_iou(float *iou, const float *a, int M, const float *b, int N)
{
    for (int i = 0; i < M; i++) {
        float aa = area(a + i * 4);
        for (int j = 0; j < N; j++) iou[(long)i * N + j] = iou1(a + i * 4, aa, b + j * 4, area(b + j * 4));
    }
}

int ps_det_assign(int32_t *matched, const float *anchors, int A, const float *gt, int M,
                  float hi, float lo, float *iou_scratch)
{
    return ps_det_match(matched, anchors, A, gt, M, hi, lo, 1, iou_scratch);
}

int ps_det_match(int32_t *matched, const float *anchors, int A, const float *gt, int M, float hi,
                 float lo, int low_quality, float *iou_scratch)
{
    if (M <= 0) {
        for (int a = 0; a < A; a++) matched[a] = PS_DET_BELOW;
        return 0;
    }
    float *iou = iou_scratch;
    float *best_gt = malloc((size_t)M * sizeof(float));
    int32_t *argmax = malloc((size_t)A * sizeof(int32_t));
    if (!iou) iou = malloc((size_t)M * A * sizeof(float));
    if (!iou || !best_gt || !argmax) {
        ps_error("anchor assignment: out of memory (%d gt x %d anchors)", M, A);
        if (iou != iou_scratch) free(iou);
        free(best_gt);
        free(argmax);
        return PS_ENOMEM;
    }
    ps_det_box_iou(iou, gt, M, anchors, A);
    for (int g = 0; g < M; g++) {
        float m = iou[(long)g * A];
        for (int a = 1; a < A; a++) m = fmaxf(m, iou[(long)g * A + a]);
        best_gt[g] = m;
    }
    for (int a = 0; a < A; a++) {
        int arg = 0;
        float v = iou[a];
        for (int g = 1; g < M; g++)
            if (iou[(long)g * A + a] > v) { /* strict: ties keep the lower gt */
                v = iou[(long)g * A + a];
                arg = g;
            }
        argmax[a] = arg;
        matched[a] = v >= hi ? arg : v < lo ? PS_DET_BELOW : PS_DET_BETWEEN;
    }
    /* allow_low_quality_matches: every anchor that is some GT's best keeps its own arg-max */
    for (int g = 0; g < M && low_quality; g++) {
        if (!(best_gt[g] > 0)) continue; /* deviation from torchvision, see header */
        for (int a = 0; a < A; a++)
            if (iou[(long)g * A + a] == best_gt[g]) matched[a] = argmax[a];
    }
    int npos = 0;
    for (int a = 0; a < A; a++) npos += matched[a] >= 0;
    if (iou != iou_scratch) free(iou);
    free(best_gt);
    free(argmax);
    return npos;
}

int ps_det_make_targets(int32_t *labels, float *box_targets, const int32_t *matched,
                        const float *anchors, int A, const float *gt, const int32_t *gt_class,
                        int M, int K)
{
    for (int g = 0; g < M; g++)
        if (gt_class[g] < 0 || gt_class[g] >= K) {
            ps_error("detection targets: class %d of gt %d outside 0..%d", gt_class[g], g, K - 1);
            return PS_EINVAL;
        }
    int npos = 0;
    for (int a = 0; a < A; a++) {
        int m = matched[a];
        if (m >= 0 && m < M) {
            labels[a] = gt_class[m] + 1;
            ps_det_box_encode(box_targets + (long)a * 4, gt + m * 4, anchors + (long)a * 4, 1);
            npos++;
        } else {
            labels[a] = m == PS_DET_BETWEEN ? -1 : 0;
            memset(box_targets + (long)a * 4, 0, 4 * sizeof(float));
        }
    }
    return npos;
}

/* ---- NMS -------------------------------------------------------------------- */

typedef struct {
    float score;
    int32_t idx;
} scored_t;

/* descending score, then ascending index: a total order, so qsort is stable here */
static int cmp_scored(const void *pa, const void *pb)
{
    const scored_t *a = pa, *b = pb;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

static int nms_impl(int32_t *keep, const float *boxes, const float *scores,
                    const int32_t *labels, int n, float thresh)
{
    if (n <= 0) return 0;
    scored_t *ord = malloc((size_t)n * sizeof(*ord));
    uint8_t *supp = calloc((size_t)n, 1);
    float *areas = malloc((size_t)n * sizeof(float));
    if (!ord || !supp || !areas) {
        ps_error("nms: out of memory (%d boxes)", n);
        free(ord);
        free(supp);
        free(areas);
        return PS_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        ord[i].score = scores[i];
        ord[i].idx = i;
        areas[i] = area(boxes + i * 4);
    }
    qsort(ord, (size_t)n, sizeof(*ord), cmp_scored);
    int nk = 0;
    for (int oi = 0; oi < n; oi++) {
        int i = ord[oi].idx;
        if (supp[oi]) continue;
        keep[nk++] = i;
        const float *bi = boxes + i * 4;
        for (int oj = oi + 1; oj < n; oj++) {
            int j = ord[oj].idx;
            if (supp[oj] || (labels && labels[j] != labels[i])) continue;
            /* torchvision nms_kernel: ovr = inter / (iarea + areas[j] - inter) */
            const float *bj = boxes + j * 4;
            float w = fmaxf(0.0f, fminf(bi[2], bj[2]) - fmaxf(bi[0], bj[0]));
            float h = fmaxf(0.0f, fminf(bi[3], bj[3]) - fmaxf(bi[1], bj[1]));
            float inter = w * h;
            if (inter / (areas[i] + areas[j] - inter) > thresh) supp[oj] = 1;
        }
    }
    free(ord);
    free(supp);
    free(areas);
    return nk;
}

int ps_det_nms(int32_t *keep, const float *boxes, const float *scores, int n, float thresh)
{
    return nms_impl(keep, boxes, scores, NULL, n, thresh);
}

int ps_det_batched_nms(int32_t *keep, const float *boxes, const float *scores,
                       const int32_t *labels, int n, float thresh)
{
    return nms_impl(keep, boxes, scores, labels, n, thresh);
}

/* ---- post-processing ---------------------------------------------------------- */

void ps_det_post_defaults(ps_det_post_params_t *p)
{
    p->score_thresh = 0.05f;
    p->topk = 1000;
    p->nms_thresh = 0.5f;
    p->max_det = 100;
}

int ps_det_postprocess(float *out_boxes, float *out_scores, int32_t *out_labels,
                       const float *const *logits, const float *const *deltas,
                       const float *const *anchors, const int *A, int nlevels, int K,
                       int height, int width, const ps_det_post_params_t *p)
{
    long cap = 0, maxcand = 0;
    for (int l = 0; l < nlevels; l++) {
        long c = (long)A[l] * K;
        cap += c < p->topk ? c : p->topk;
        if (c > maxcand) maxcand = c;
    }
    float *boxes = malloc((size_t)(cap ? cap : 1) * 4 * sizeof(float));
    float *scores = malloc((size_t)(cap ? cap : 1) * sizeof(float));
    int32_t *labels = malloc((size_t)(cap ? cap : 1) * sizeof(int32_t));
    int32_t *keep = malloc((size_t)(cap ? cap : 1) * sizeof(int32_t));
    scored_t *cand = malloc((size_t)(maxcand ? maxcand : 1) * sizeof(*cand));
    int n = 0, rc = 0;
    if (!boxes || !scores || !labels || !keep || !cand) {
        ps_error("detection post-processing: out of memory");
        rc = PS_ENOMEM;
        goto out;
    }
    for (int l = 0; l < nlevels; l++) {
        long nc = 0, total = (long)A[l] * K;
        for (long i = 0; i < total; i++) {
            float s = 1.0f / (1.0f + expf(-logits[l][i]));
            if (s > p->score_thresh) {
                cand[nc].score = s;
                cand[nc].idx = (int32_t)i;
                nc++;
            }
        }
        qsort(cand, (size_t)nc, sizeof(*cand), cmp_scored);
        if (nc > p->topk) nc = p->topk;
        for (long c = 0; c < nc; c++) {
            int a = cand[c].idx / K;
            ps_det_box_decode(boxes + (long)n * 4, deltas[l] + (long)a * 4, anchors[l] + (long)a * 4, 1);
            ps_det_box_clip(boxes + (long)n * 4, 1, height, width);
            scores[n] = cand[c].score;
            labels[n] = cand[c].idx % K;
            n++;
        }
    }
    int nk = ps_det_batched_nms(keep, boxes, scores, labels, n, p->nms_thresh);
    if (nk < 0) {
        rc = nk;
        goto out;
    }
    if (nk > p->max_det) nk = p->max_det;
    for (int i = 0; i < nk; i++) {
        memcpy(out_boxes + i * 4, boxes + (long)keep[i] * 4, 4 * sizeof(float));
        out_scores[i] = scores[keep[i]];
        out_labels[i] = labels[keep[i]];
    }
    rc = nk;
out:
    free(boxes);
    free(scores);
    free(labels);
    free(keep);
    free(cand);
    return rc;
}
