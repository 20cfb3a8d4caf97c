/* Mask R-CNN's mask branch (torchvision 0.14 RoIHeads' mask part,
 * maskrcnn_resnet50_fpn): MultiScaleRoIAlign on P2..P5 (mask_roi_size
 * square, sampling 2, aligned=False, the box head's level mapper),
 * MaskRCNNHeads (four 3x3 conv + ReLU of mask_dim channels:
 * roi_heads.mask_head.{0..3}.0), MaskRCNNPredictor (conv5_mask, a 2x2
 * stride-2 transposed conv + ReLU, and mask_fcn_logits, a 1x1 conv to K+1
 * channels of 2S x 2S), every layer through the backend table.
 *
 * Training (maskrcnn_loss): the rows are the box stage's sampled RoIs with
 * a foreground label, image by image in its order; each row's target is
 * its matched ground truth's mask cut out by RoIAlign on the row's box
 * (ps_det_mask_target: project_masks_on_boxes), its channel the label;
 * BCE with logits on that channel only, the mean over rows x pixels (the
 * mask_bce slots).  No foreground row: loss 0, no gradient (torchvision's
 * mask_logits.sum() * 0).
 * Inference (maskrcnn_inference): the rows are the detections of every
 * image; the host takes the sigmoid of each one's class channel
 * (ps_rcnn_detect_masks).  Rows go to the arena level-major as the box
 * stage's (ps_rcnn_level_major).
 *
 * The number of rows changes from step to step (positives sampled,
 * detections kept), and the CPU backend chooses a convolution kernel per
 * layer shape by timing it the first time it meets the shape, batch
 * included (conv_select.c; oneDNN also builds a primitive per shape).  So
 * the head and the predictor run on the rows rounded up to a bucket
 * (ps_rcnn_mask_bucket: at most 1/8 more rows, 8 sizes per doubling): a
 * training run meets a few dozen shapes instead of one per count.  The
 * extra rows are zero features with a zero output gradient, so they add
 * exactly nothing to the parameter gradients; the loss and the outputs
 * read the real rows only. */
#include "rcnn_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "worker/det/det_masks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAKE(ptr, n) ((ptr) = (void *)ps_arena_take(a, (n)))

static int S_of(const ps_rcnn_t *m) { return m->cfg.mask_roi_size; }

int ps_rcnn_mask_bucket(int rows)
{
    if (rows <= 16) return rows;
    int e = 0;
    while (rows >> (e + 1)) e++; /* 2^e <= rows < 2^(e+1) */
    const int step = 1 << (e - 3);
    return (rows + step - 1) / step * step;
}
static int MM_of(const ps_rcnn_t *m) { return 4 * S_of(m) * S_of(m); }

int ps_rcnn_mask_define(ps_rcnn_t *m)
{
    rcnn_mask_t *k = &m->mask;
    int D = m->cfg.mask_dim, F = m->cfg.fpn_channels, K1 = m->cfg.num_classes + 1, r;
    char name[96];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "roi_heads.mask_head.%d.0", i);
        if ((r = ps_rconv_define(&k->head[i], &m->params, &m->nparams, &m->cap_params, name,
                                 i ? D : F, D, 3, 1)))
            return r;
    }
    int shape[4] = {D, D, 2, 2};
    k->pdw = ps_mtab_add_param(&m->params, &m->nparams, &m->cap_params,
                               "roi_heads.mask_predictor.conv5_mask.weight", 4, shape,
                               PS_MODEL_GROUP_WEIGHT, 1);
    if (k->pdw < 0) return k->pdw;
    k->pdb = ps_mtab_add_param(&m->params, &m->nparams, &m->cap_params,
                               "roi_heads.mask_predictor.conv5_mask.bias", 1, &D,
                               PS_MODEL_GROUP_BIAS, 1);
    if (k->pdb < 0) return k->pdb;
    return ps_rconv_define(&k->logits, &m->params, &m->nparams, &m->cap_params,
                           "roi_heads.mask_predictor.mask_fcn_logits", D, K1, 1, 1);
}

void ps_rcnn_mask_layout(ps_rcnn_t *m, ps_arena_t *a)
{
    rcnn_mask_t *k = &m->mask;
    size_t R = (size_t)ps_rcnn_mask_bucket(m->Rmask), D = m->cfg.mask_dim;
    size_t F = m->cfg.fpn_channels, SS = (size_t)S_of(m) * S_of(m), MM = MM_of(m);
    size_t K1 = m->cfg.num_classes + 1;
    TAKE(k->rois, R * 5);
    TAKE(k->pooled, R * F * SS);
    TAKE(k->dpooled, R * F * SS);
    for (int i = 0; i < 4; i++) TAKE(k->h[i], R * D * SS);
    TAKE(k->da, R * D * SS);
    TAKE(k->db_, R * D * SS);
    TAKE(k->up, R * D * MM);
    TAKE(k->dup, R * D * MM);
    TAKE(k->out, R * K1 * MM);
    TAKE(k->dout, R * K1 * MM);
    TAKE(k->targets, R * MM);
    TAKE(k->labels, R); /* int32: the size of a float */
}

void ps_rcnn_mask_resolve(ps_rcnn_t *m)
{
    rcnn_mask_t *k = &m->mask;
    for (int i = 0; i < 4; i++) ps_rconv_resolve(&k->head[i], m->params);
    ps_rconv_resolve(&k->logits, m->params);
    k->dw = m->params[k->pdw].w;
    k->gdw = m->params[k->pdw].g;
    k->db = m->params[k->pdb].w;
    k->gdb = m->params[k->pdb].g;
}

/* The convolutions' and the deconv's scratch (ctx workspace floats). */
size_t ps_rcnn_mask_workspace(const ps_rcnn_t *m)
{
    const rcnn_mask_t *k = &m->mask;
    int S = S_of(m), N = ps_rcnn_mask_bucket(m->Rmask);
    size_t ws = (size_t)m->cfg.mask_dim * MM_of(m); /* the deconv's columns: D*2*2 x S*S */
    for (int i = 0; i < 4; i++) {
        size_t c = ps_rconv_workspace(&k->head[i], N, S, S);
        if (c > ws) ws = c;
    }
    size_t c = ps_rconv_workspace(&k->logits, N, 2 * S, 2 * S);
    return c > ws ? c : ws;
}

int ps_rcnn_mask_host(ps_rcnn_t *m)
{
    rcnn_mask_t *k = &m->mask;
    size_t R = (size_t)(m->Rmask ? m->Rmask : 1);
    k->pos = malloc(sizeof(int32_t) * R);
    k->img = malloc(sizeof(int32_t) * R);
    k->h_labels = malloc(sizeof(int32_t) * R);
    k->h_rois = malloc(sizeof(float) * 4 * R);
    return k->pos && k->img && k->h_labels && k->h_rois ? 0 : PS_ENOMEM;
}

void ps_rcnn_mask_free_host(ps_rcnn_t *m)
{
    rcnn_mask_t *k = &m->mask;
    free(k->pos), free(k->img), free(k->h_labels), free(k->h_rois);
    k->pos = k->img = k->h_labels = NULL;
    k->h_rois = NULL;
}

/* torchvision's init: the heads and the predictor's weights
 * kaiming_normal_(fan_out, relu) -- std sqrt(2 / fan_out), here uniform of
 * that std (bound sqrt(3) std) --, the heads' biases 0, the predictor's
 * biases PyTorch's default (uniform in +-1/sqrt(fan_in), fan_in = size(1)
 * x kernel area).  random (tests): the heads' biases (2u-1) * 0.1 too. */
void ps_rcnn_mask_init(ps_rcnn_t *m, uint64_t seed, int random)
{
    rcnn_mask_t *k = &m->mask;
    int D = m->cfg.mask_dim, K1 = m->cfg.num_classes + 1;
    for (int i = 0; i < 4; i++)
        ps_rconv_init(&k->head[i], m->params, seed, sqrt(3.0 * 2.0 / (D * 9.0)), random, 0.f);
    ps_model_param_t *w = &m->params[k->pdw], *b = &m->params[k->pdb];
    ps_model_hash_fill(w->w, w->numel, w->name, seed, sqrt(3.0 * 2.0 / (D * 4.0)));
    ps_model_hash_fill(b->w, b->numel, b->name, seed, 1.0 / sqrt(D * 4.0));
    w = &m->params[k->logits.pw];
    b = &m->params[k->logits.pb];
    ps_model_hash_fill(w->w, w->numel, w->name, seed, sqrt(3.0 * 2.0 / K1));
    ps_model_hash_fill(b->w, b->numel, b->name, seed, 1.0 / sqrt((double)D));
}

/* The rows of the forward into the host arrays: training the positive
 * sampled RoIs (targets written into the arena), inference the
 * detections.  Returns the row count or PS_E*. */
static int mask_rows(ps_rcnn_t *m, const ps_rcnn_input_t *in, int training)
{
    rcnn_mask_t *k = &m->mask;
    const rcnn_stage_t *s = &m->stage[0];
    int R = 0;
    if (!training) {
        for (int i = 0; i < in->n; i++)
            for (int d = 0; d < m->det_count[i]; d++, R++) {
                size_t src = (size_t)i * m->cfg.post.max_det + d;
                memcpy(k->h_rois + (size_t)R * 4, m->det_boxes + src * 4, 4 * sizeof(float));
                k->img[R] = i;
                k->h_labels[R] = m->det_classes[src] + 1;
            }
        return R;
    }
    if (!in->gt_masks) {
        ps_error("mask r-cnn forward: training needs the ground truth's masks (gt_masks)");
        return PS_EINVAL;
    }
    for (int j = 0; j < s->R; j++) {
        if (s->h_labels[j] < 1) continue;
        if (R == m->Rmask) {
            ps_error("mask r-cnn forward: more than %d positive RoIs", m->Rmask);
            return PS_EINVAL;
        }
        memcpy(k->h_rois + (size_t)R * 4, s->h_rois + (size_t)j * 4, 4 * sizeof(float));
        k->img[R] = s->img[j];
        k->h_labels[R] = s->h_labels[j];
        R++;
    }
    /* targets need the arena rows: placed after ps_rcnn_level_major */
    return R;
}

static void mask_targets(ps_rcnn_t *m, const ps_rcnn_input_t *in)
{
    rcnn_mask_t *k = &m->mask;
    const rcnn_stage_t *s = &m->stage[0];
    int M = 2 * S_of(m), r = 0;
    size_t plane = (size_t)m->H * m->W;
    for (int j = 0; j < s->R; j++) {
        if (s->h_labels[j] < 1) continue;
        int i = s->img[j], g = s->h_gt[j];
        const uint8_t *mask = in->gt_masks + ((size_t)i * in->gt_stride + g) * plane;
        ps_det_mask_target(k->targets + (size_t)k->pos[r] * M * M, M, mask, m->W, m->hw[2 * i],
                           m->hw[2 * i + 1], s->h_rois + (size_t)j * 4);
        r++;
    }
}

int ps_rcnn_mask_forward(ps_rcnn_t *m, const ps_rcnn_input_t *in, int training,
                         ps_rcnn_losses_t *l)
{
    const ps_backend_t *be = m->be;
    rcnn_mask_t *k = &m->mask;
    int S = S_of(m), MM = MM_of(m), D = m->cfg.mask_dim, F = m->cfg.fpn_channels;
    int K1 = m->cfg.num_classes + 1;
    int R = mask_rows(m, in, training);
    if (R < 0) return R;
    k->R = R;
    if (l) l->mask = 0.f;
    if (R == 0) return 0;
    ps_rcnn_level_major(k->h_rois, k->img, R, k->pos, k->Rl, k->rois);
    for (int j = 0; j < R; j++) k->labels[k->pos[j]] = k->h_labels[j];
    if (training) mask_targets(m, in);
    size_t off = 0, in_dim = (size_t)F * S * S;
    /* the bucket's extra rows: zero features in, zero gradient back */
    const int Rc = ps_rcnn_mask_bucket(R);
    k->Rc = Rc;
    memset(k->pooled + (size_t)R * in_dim, 0, (size_t)(Rc - R) * in_dim * sizeof(float));
    memset(k->dout + (size_t)R * K1 * MM, 0, (size_t)(Rc - R) * K1 * MM * sizeof(float));
    for (int lv = 0; lv < PS_RCNN_ROI_LEVELS; lv++) {
        if (k->Rl[lv])
            be->roi_align_forward(m->ctx, k->pooled + off * in_dim, m->fpn.P[lv],
                                  k->rois + off * 5, k->Rl[lv], in->n, F, m->lh[lv], m->lw[lv],
                                  S, S, 1.0f / (float)m->lstride[lv], m->cfg.roi_sampling, 0);
        off += (size_t)k->Rl[lv];
    }
    const float *x = k->pooled;
    for (int i = 0; i < 4; i++) {
        ps_rconv_forward(be, m->ctx, &k->head[i], k->h[i], x, Rc, S, S);
        be->relu_forward(m->ctx, k->h[i], k->h[i], (size_t)Rc * D * S * S);
        x = k->h[i];
    }
    be->deconv_forward(m->ctx, k->up, k->h[3], k->dw, k->db, Rc, D, D, S, S, 2);
    be->relu_forward(m->ctx, k->up, k->up, (size_t)Rc * D * MM);
    ps_rconv_forward(be, m->ctx, &k->logits, k->out, k->up, Rc, 2 * S, 2 * S);
    if (!training) return 0;
    /* the loss reads labels 0..K: the channel of each row */
    return be->mask_bce_forward(m->ctx, &l->mask, k->out, k->labels, k->targets,
                                (float)R * MM, R, K1, MM);
}

int ps_rcnn_mask_backward(ps_rcnn_t *m)
{
    const ps_backend_t *be = m->be;
    rcnn_mask_t *k = &m->mask;
    int S = S_of(m), MM = MM_of(m), D = m->cfg.mask_dim, F = m->cfg.fpn_channels;
    int K1 = m->cfg.num_classes + 1, R = k->R, Rc = k->Rc, rc;
    if (R == 0) return 0;
    /* the real rows' gradient; the bucket's extra rows of dout stay 0 */
    if ((rc = be->mask_bce_backward(m->ctx, k->dout, k->out, k->labels, k->targets, 1.f,
                                    (float)R * MM, R, K1, MM)))
        return rc;
    ps_rconv_backward(be, m->ctx, &k->logits, k->dup, k->dout, k->up, Rc, 2 * S, 2 * S);
    be->relu_backward(m->ctx, k->dup, k->dup, k->up, (size_t)Rc * D * MM);
    be->deconv_backward(m->ctx, k->da, k->gdw, k->gdb, k->dup, k->h[3], k->dw, Rc, D, D, S, S,
                        2);
    float *d = k->da, *other = k->db_;
    for (int i = 3; i >= 0; i--) {
        be->relu_backward(m->ctx, d, d, k->h[i], (size_t)Rc * D * S * S);
        float *dx = i ? other : k->dpooled;
        ps_rconv_backward(be, m->ctx, &k->head[i], dx, d, i ? k->h[i - 1] : k->pooled, Rc, S,
                          S);
        other = d;
        d = dx;
    }
    size_t off = 0, in_dim = (size_t)F * S * S;
    for (int lv = 0; lv < PS_RCNN_ROI_LEVELS; lv++) {
        if (k->Rl[lv])
            be->roi_align_backward(m->ctx, m->fpn.dP[lv], k->dpooled + off * in_dim,
                                   k->rois + off * 5, k->Rl[lv], m->last_n, F, m->lh[lv],
                                   m->lw[lv], S, S, 1.0f / (float)m->lstride[lv],
                                   m->cfg.roi_sampling, 0);
        off += (size_t)k->Rl[lv];
    }
    return 0;
}

int ps_rcnn_max_mask_rois(const ps_rcnn_t *m) { return m->Rmask; }

int ps_rcnn_mask_outputs(const ps_rcnn_t *m, float *logits, int32_t *labels)
{
    const rcnn_mask_t *k = &m->mask;
    if (!m->cfg.mask) return 0;
    size_t row = (size_t)(m->cfg.num_classes + 1) * MM_of(m);
    for (int j = 0; j < k->R; j++) {
        if (logits) memcpy(logits + j * row, k->out + k->pos[j] * row, row * sizeof(float));
        if (labels) labels[j] = k->h_labels[j];
    }
    return k->R;
}

int ps_rcnn_detect_masks(const ps_rcnn_t *m, int i, float *probs)
{
    const rcnn_mask_t *k = &m->mask;
    if (!m->cfg.mask) {
        ps_error("rcnn: masks asked of a model without the mask branch");
        return PS_ESTATE;
    }
    int MM = MM_of(m), n = 0;
    size_t row = (size_t)(m->cfg.num_classes + 1) * MM;
    for (int j = 0; j < k->R; j++) {
        if (k->img[j] != i) continue;
        const float *x = k->out + k->pos[j] * row + (size_t)k->h_labels[j] * MM;
        float *p = probs + (size_t)n * MM;
        for (int q = 0; q < MM; q++) p[q] = 1.0f / (1.0f + expf(-x[q]));
        n++;
    }
    return n;
}
