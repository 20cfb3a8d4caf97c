/* One box head stage of the R-CNN (torchvision RoIHeads' box branch, 0.14):
 * the RoIs of each image (its proposals, or in training the sampled
 * proposals + ground truth, ps_det_roi_targets), MultiScaleRoIAlign on
 * P2..P5, TwoMLPHead, FastRCNNPredictor and fastrcnn_loss, with their
 * backward; everything between the RoI list and the losses through the
 * backend table.  The stage's sampling and coder weights are its own
 * (rcnn_stage_t), so a cascade runs this once per stage.
 *
 * Row order: the host builds the RoI list in torchvision's order (image by
 * image), then the arena holds it level-major (P2's RoIs first, each level
 * in that order), so each level is one roi_align call on a contiguous
 * block; pos[] maps torchvision's row j to its arena row.  The losses are
 * sums over rows, so the order changes nothing but float summation.
 *
 * The class-specific box loss (smooth-L1 on the target class's four deltas
 * only) runs through the smooth-L1 slot on the (R*(K+1), 4) view of the
 * deltas: the one row per RoI that holds its target class is labelled 1
 * (positive), every other row 0, so the slot's positive-only sum is
 * torchvision's box_regression[pos, labels_pos] loss; normaliser R as
 * torchvision's labels.numel().
 *
 * Cascade R-CNN (Detectron2's CascadeROIHeads): stage k > 0 runs on stage
 * k-1's refined boxes (its deltas decoded with its weights, clipped; in
 * training the empty ones dropped and the rest relabelled at the stage's
 * IoU, without sampling or appended ground truth), its regression is
 * class-agnostic (4 deltas per RoI: the (R, 4) view, one row per RoI), and
 * the gradient into each stage's pooled features is scaled by 1 / stages
 * (Detectron2's _ScaleGradient: the stages' losses add up, the shared
 * features see their mean). */
#include "rcnn_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "worker/det/det_boxes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAKE(ptr, n) ((ptr) = (void *)ps_arena_take(a, (n)))

static int def_lin(ps_rcnn_t *m, rlin_t *l, const char *name, int C, int K)
{
    char full[160];
    int shape[2] = {K, C};
    l->C = C;
    l->K = K;
    snprintf(full, sizeof full, "%s.weight", name);
    l->pw = ps_mtab_add_param(&m->params, &m->nparams, &m->cap_params, full, 2, shape,
                              PS_MODEL_GROUP_WEIGHT, 1);
    if (l->pw < 0) return l->pw;
    snprintf(full, sizeof full, "%s.bias", name);
    l->pb = ps_mtab_add_param(&m->params, &m->nparams, &m->cap_params, full, 1, &K,
                              PS_MODEL_GROUP_BIAS, 1);
    return l->pb < 0 ? l->pb : 0;
}

/* box rows per RoI: one per class, or one (class-agnostic) */
static int nbox(const ps_rcnn_t *m, const rcnn_stage_t *s)
{
    return s->agnostic ? 1 : m->cfg.num_classes + 1;
}

int ps_rcnn_box_define(ps_rcnn_t *m, rcnn_stage_t *s, const char *head, const char *predictor)
{
    const ps_rcnn_config_t *c = &m->cfg;
    int in = c->fpn_channels * c->roi_size * c->roi_size, rep = c->representation;
    int K1 = c->num_classes + 1, r;
    char name[128];
    s->sample = c->roi;
    s->post = c->post;
    s->beta = c->smoothl1_beta;
    if (m->nstages > 1) { /* Detectron2's cascade: its IoU, weights and loss */
        s->agnostic = 1;
        s->beta = c->cascade_beta;
        s->sample.fg_iou = s->sample.bg_iou = c->cascade_iou[s->k];
        memcpy(s->sample.weights, c->cascade_weights[s->k], sizeof s->sample.weights);
        memcpy(s->post.weights, c->cascade_weights[s->k], sizeof s->post.weights);
        s->post.min_size = 0.f; /* fast_rcnn_inference keeps empty boxes */
    }
    snprintf(name, sizeof name, "%s.fc6", head);
    if ((r = def_lin(m, &s->fc6, name, in, rep))) return r;
    snprintf(name, sizeof name, "%s.fc7", head);
    if ((r = def_lin(m, &s->fc7, name, rep, rep))) return r;
    snprintf(name, sizeof name, "%s.cls_score", predictor);
    if ((r = def_lin(m, &s->cls, name, rep, K1))) return r;
    snprintf(name, sizeof name, "%s.bbox_pred", predictor);
    if ((r = def_lin(m, &s->bbox, name, rep, nbox(m, s) * 4))) return r;
    s->rows = ps_mgroup_since(s->fc6.pw, m->nparams); /* fc6 .. bbox_pred */
    return 0;
}

int ps_rcnn_box_host(ps_rcnn_t *m, rcnn_stage_t *s)
{
    size_t R = (size_t)m->Rmax;
    s->pos = malloc(sizeof(int32_t) * R);
    s->img = malloc(sizeof(int32_t) * R);
    s->h_rois = malloc(sizeof(float) * 4 * R);
    s->h_labels = malloc(sizeof(int32_t) * R);
    s->h_gt = malloc(sizeof(int32_t) * R);
    s->h_next = malloc(sizeof(float) * 4 * R);
    return s->pos && s->img && s->h_rois && s->h_labels && s->h_gt && s->h_next ? 0 : PS_ENOMEM;
}

void ps_rcnn_box_free_host(rcnn_stage_t *s)
{
    free(s->pos), free(s->img), free(s->h_rois), free(s->h_labels), free(s->h_gt);
    free(s->h_next);
}

void ps_rcnn_box_layout(ps_rcnn_t *m, rcnn_stage_t *s, ps_arena_t *a)
{
    const ps_rcnn_config_t *c = &m->cfg;
    size_t R = m->Rmax, K1 = c->num_classes + 1, rep = c->representation, nb = nbox(m, s);
    size_t in = (size_t)c->fpn_channels * c->roi_size * c->roi_size;
    TAKE(s->rois, R * 5);
    TAKE(s->pooled, R * in);
    TAKE(s->dpooled, R * in);
    TAKE(s->h6, R * rep);
    TAKE(s->h7, R * rep);
    TAKE(s->dh6, R * rep);
    TAKE(s->dh7, R * rep);
    TAKE(s->dh7b, R * rep);
    TAKE(s->cls_out, R * K1);
    TAKE(s->probs, R * K1);
    TAKE(s->dcls, R * K1);
    TAKE(s->box_out, R * nb * 4);
    TAKE(s->dbox, R * nb * 4);
    TAKE(s->labels, R); /* int32: the size of a float */
    TAKE(s->lab_x, R * nb);
    TAKE(s->tgt_x, R * nb * 4);
}

/* The RoI list of every image in torchvision's order into the host arrays
 * (training: sampled with the ground truth, targets into tgt); returns R. */
static int roi_list(ps_rcnn_t *m, rcnn_stage_t *s, const ps_rcnn_input_t *in,
                    const float *all, const int *counts, int stride, int training, int site,
                    float *tgt)
{
    int R = 0, K = m->cfg.num_classes;
    for (int i = 0; i < in->n; i++) {
        const float *props = all + (size_t)i * stride * 4;
        int P = counts[i], k;
        if (training) {
            int M = in->ngt[i];
            if (M < 0 || M > m->cfg.max_gt || M > in->gt_stride) {
                ps_error("rcnn forward: image %d has %d ground-truth boxes, the bound is %d", i,
                         M, m->cfg.max_gt < in->gt_stride ? m->cfg.max_gt : in->gt_stride);
                return PS_EINVAL;
            }
            k = ps_det_roi_targets(s->h_rois + (size_t)R * 4, s->h_labels + R,
                                   tgt + (size_t)R * 4, s->h_gt + R, props, P,
                                   in->gt_boxes + (size_t)i * in->gt_stride * 4,
                                   in->gt_classes + (size_t)i * in->gt_stride, M, K, &s->sample,
                                   ps_det_sample_key(in->seed, site, i));
            if (k < 0) return k;
        } else {
            memcpy(s->h_rois + (size_t)R * 4, props, sizeof(float) * 4 * (size_t)P);
            memset(s->h_labels + R, 0, sizeof(int32_t) * (size_t)P);
            k = P;
        }
        for (int j = R; j < R + k; j++) s->img[j] = i;
        R += k;
    }
    return R;
}

void ps_rcnn_level_major(const float *h_rois, const int32_t *img, int R, int32_t *pos, int *Rl,
                         float *rois)
{
    int off[PS_RCNN_ROI_LEVELS];
    memset(Rl, 0, sizeof(int) * PS_RCNN_ROI_LEVELS);
    for (int j = 0; j < R; j++) {
        pos[j] = ps_det_roi_level(h_rois + (size_t)j * 4, 2, 5, 4, 224.f, 1e-6f);
        Rl[pos[j]]++;
    }
    off[0] = 0;
    for (int l = 1; l < PS_RCNN_ROI_LEVELS; l++) off[l] = off[l - 1] + Rl[l - 1];
    for (int j = 0; j < R; j++) {
        int p = off[pos[j]]++;
        pos[j] = p;
        float *r = rois + (size_t)p * 5;
        r[0] = (float)img[j];
        memcpy(r + 1, h_rois + (size_t)j * 4, 4 * sizeof(float));
    }
}

/* Level-major arena rows from the host list (R rows); targets expanded to
 * the (R*(K+1), 4) view the box loss reads (class-agnostic: (R, 4)). */
static void to_arena(ps_rcnn_t *m, rcnn_stage_t *s, int R, const float *tgt)
{
    int nb = nbox(m, s);
    ps_rcnn_level_major(s->h_rois, s->img, R, s->pos, s->Rl, s->rois);
    for (int j = 0; j < R; j++) {
        int p = s->pos[j], lab = s->h_labels[j], hit = s->agnostic ? 0 : lab;
        s->labels[p] = lab;
        for (int k = 0; k < nb; k++) {
            size_t row = (size_t)p * nb + k;
            s->lab_x[row] = lab >= 1 && k == hit;
            if (tgt && lab >= 1 && k == hit)
                memcpy(s->tgt_x + row * 4, tgt + (size_t)j * 4, 4 * sizeof(float));
            else
                memset(s->tgt_x + row * 4, 0, 4 * sizeof(float));
        }
    }
}

/* A cascade stage's RoI list: the previous stage's refined boxes, image by
 * image in its order (training: the non-empty ones, relabelled at the
 * stage's IoU, targets into tgt); returns R. */
static int next_list(ps_rcnn_t *m, rcnn_stage_t *s, const rcnn_stage_t *prev,
                     const ps_rcnn_input_t *in, int training, float *tgt)
{
    int R = 0, K = m->cfg.num_classes;
    for (int i = 0; i < in->n; i++) {
        int first = R;
        for (int j = 0; j < prev->R; j++) {
            const float *b = prev->h_next + (size_t)j * 4;
            if (prev->img[j] != i || (training && !(b[2] > b[0] && b[3] > b[1]))) continue;
            memcpy(s->h_rois + (size_t)R * 4, b, 4 * sizeof(float));
            s->img[R++] = i;
        }
        if (!training) {
            memset(s->h_labels + first, 0, sizeof(int32_t) * (size_t)(R - first));
            continue;
        }
        int M = in->ngt[i];
        int k = ps_det_roi_relabel(s->h_labels + first, tgt + (size_t)first * 4, s->h_gt + first,
                                   s->h_rois + (size_t)first * 4, R - first,
                                   in->gt_boxes + (size_t)i * in->gt_stride * 4,
                                   in->gt_classes + (size_t)i * in->gt_stride, M, K, &s->sample);
        if (k < 0) return k;
    }
    return R;
}

void ps_rcnn_box_refine(ps_rcnn_t *m, rcnn_stage_t *s)
{
    int nb = nbox(m, s);
    for (int j = 0; j < s->R; j++) {
        float *b = s->h_next + (size_t)j * 4;
        /* class-agnostic: the RoI's one box (a class-specific stage is
         * never refined: only a cascade's stages are) */
        ps_det_box_decode_w(b, s->box_out + (size_t)s->pos[j] * nb * 4, s->h_rois + (size_t)j * 4,
                            1, s->sample.weights);
        ps_det_box_clip(b, 1, m->hw[2 * s->img[j]], m->hw[2 * s->img[j] + 1]);
    }
}

/* The stage on its R host rows: arena rows, RoIAlign, the heads, the losses. */
static int run_stage(ps_rcnn_t *m, rcnn_stage_t *s, const ps_rcnn_input_t *in, int R,
                     const float *tgt, int training, ps_rcnn_losses_t *l)
{
    const ps_backend_t *be = m->be;
    const ps_rcnn_config_t *c = &m->cfg;
    int K1 = c->num_classes + 1, S = c->roi_size, rep = c->representation, F = c->fpn_channels;
    int in_dim = F * S * S, nb = nbox(m, s);
    to_arena(m, s, R, tgt);
    s->R = R;
    if (l) l->stage_classifier[s->k] = l->stage_box_reg[s->k] = 0.f;
    if (R == 0) return 0; /* no proposals in any image (inference only) */
    size_t off = 0;
    for (int lv = 0; lv < PS_RCNN_ROI_LEVELS; lv++) {
        if (s->Rl[lv])
            be->roi_align_forward(m->ctx, s->pooled + off * in_dim, m->fpn.P[lv],
                                  s->rois + off * 5, s->Rl[lv], in->n, F, m->lh[lv], m->lw[lv],
                                  S, S, 1.0f / (float)m->lstride[lv], c->roi_sampling, 0);
        off += (size_t)s->Rl[lv];
    }
    be->linear_forward(m->ctx, s->h6, s->pooled, s->fc6.w, s->fc6.b, R, in_dim, rep);
    be->relu_forward(m->ctx, s->h6, s->h6, (size_t)R * rep);
    be->linear_forward(m->ctx, s->h7, s->h6, s->fc7.w, s->fc7.b, R, rep, rep);
    be->relu_forward(m->ctx, s->h7, s->h7, (size_t)R * rep);
    be->linear_forward(m->ctx, s->cls_out, s->h7, s->cls.w, s->cls.b, R, rep, K1);
    be->linear_forward(m->ctx, s->box_out, s->h7, s->bbox.w, s->bbox.b, R, rep, nb * 4);
    if (!training) return 0;
    l->stage_classifier[s->k] = be->xent_forward(m->ctx, s->probs, s->cls_out, s->labels, R, K1);
    be->smoothl1_forward(m->ctx, &l->stage_box_reg[s->k], s->box_out, s->tgt_x, s->lab_x, s->beta,
                         (float)R, R * nb);
    return 0;
}

static float *targets_buffer(const ps_rcnn_t *m, int training)
{
    float *tgt = training ? malloc(sizeof(float) * 4 * (size_t)m->Rmax) : NULL;
    if (training && !tgt) ps_error("rcnn forward: out of memory for %d box targets", m->Rmax);
    return tgt;
}

int ps_rcnn_box_forward(ps_rcnn_t *m, rcnn_stage_t *s, const ps_rcnn_input_t *in,
                        const float *props, const int *counts, int stride, int training,
                        int site, ps_rcnn_losses_t *l)
{
    float *tgt = targets_buffer(m, training);
    if (training && !tgt) return PS_ENOMEM;
    int R = roi_list(m, s, in, props, counts, stride, training, site, tgt);
    int rc = R < 0 ? R : run_stage(m, s, in, R, tgt, training, l);
    free(tgt);
    return rc;
}

int ps_rcnn_box_forward_next(ps_rcnn_t *m, rcnn_stage_t *s, const rcnn_stage_t *prev,
                             const ps_rcnn_input_t *in, int training, ps_rcnn_losses_t *l)
{
    float *tgt = targets_buffer(m, training);
    if (training && !tgt) return PS_ENOMEM;
    int R = next_list(m, s, prev, in, training, tgt);
    int rc = R < 0 ? R : run_stage(m, s, in, R, tgt, training, l);
    free(tgt);
    return rc;
}

void ps_rcnn_box_backward(ps_rcnn_t *m, rcnn_stage_t *s)
{
    const ps_backend_t *be = m->be;
    const ps_rcnn_config_t *c = &m->cfg;
    int K1 = c->num_classes + 1, S = c->roi_size, rep = c->representation, F = c->fpn_channels;
    int R = s->R, in_dim = F * S * S, nb = nbox(m, s);
    if (R == 0) return;
    be->xent_backward(m->ctx, s->dcls, s->probs, s->labels, 1.f, R, K1);
    be->smoothl1_backward(m->ctx, s->dbox, s->box_out, s->tgt_x, s->lab_x, 1.f, s->beta, (float)R,
                          R * nb);
    be->linear_backward(m->ctx, s->dh7, s->cls.gw, s->cls.gb, s->dcls, s->h7, s->cls.w, R, rep,
                        K1);
    be->linear_backward(m->ctx, s->dh7b, s->bbox.gw, s->bbox.gb, s->dbox, s->h7, s->bbox.w, R,
                        rep, nb * 4);
    be->accumulate(m->ctx, s->dh7, s->dh7b, (size_t)R * rep);
    be->relu_backward(m->ctx, s->dh7, s->dh7, s->h7, (size_t)R * rep);
    be->linear_backward(m->ctx, s->dh6, s->fc7.gw, s->fc7.gb, s->dh7, s->h6, s->fc7.w, R, rep,
                        rep);
    be->relu_backward(m->ctx, s->dh6, s->dh6, s->h6, (size_t)R * rep);
    be->linear_backward(m->ctx, s->dpooled, s->fc6.gw, s->fc6.gb, s->dh6, s->pooled, s->fc6.w, R,
                        in_dim, rep);
    if (m->nstages > 1) be->scale(m->ctx, s->dpooled, 1.0f / (float)m->nstages, (size_t)R * in_dim);
    size_t off = 0;
    for (int lv = 0; lv < PS_RCNN_ROI_LEVELS; lv++) {
        if (s->Rl[lv])
            be->roi_align_backward(m->ctx, m->fpn.dP[lv], s->dpooled + off * in_dim,
                                   s->rois + off * 5, s->Rl[lv], m->last_n, F, m->lh[lv],
                                   m->lw[lv], S, S, 1.0f / (float)m->lstride[lv],
                                   c->roi_sampling, 0);
        off += (size_t)s->Rl[lv];
    }
}
