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
 * torchvision's labels.numel(). */
#include "rcnn_internal.h"

#include "ps_error.h"
#include "ps_log.h"

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

int ps_rcnn_box_define(ps_rcnn_t *m, rcnn_stage_t *s, const char *head, const char *predictor)
{
    const ps_rcnn_config_t *c = &m->cfg;
    int in = c->fpn_channels * c->roi_size * c->roi_size, rep = c->representation;
    int K1 = c->num_classes + 1, r;
    char name[128];
    s->sample = c->roi;
    s->post = c->post;
    snprintf(name, sizeof name, "%s.fc6", head);
    if ((r = def_lin(m, &s->fc6, name, in, rep))) return r;
    snprintf(name, sizeof name, "%s.fc7", head);
    if ((r = def_lin(m, &s->fc7, name, rep, rep))) return r;
    snprintf(name, sizeof name, "%s.cls_score", predictor);
    if ((r = def_lin(m, &s->cls, name, rep, K1))) return r;
    snprintf(name, sizeof name, "%s.bbox_pred", predictor);
    return def_lin(m, &s->bbox, name, rep, K1 * 4);
}

void ps_rcnn_box_layout(ps_rcnn_t *m, rcnn_stage_t *s, ps_arena_t *a)
{
    const ps_rcnn_config_t *c = &m->cfg;
    size_t R = m->Rmax, K1 = c->num_classes + 1, rep = c->representation;
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
    TAKE(s->box_out, R * K1 * 4);
    TAKE(s->dbox, R * K1 * 4);
    TAKE(s->labels, R); /* int32: the size of a float */
    TAKE(s->lab_x, R * K1);
    TAKE(s->tgt_x, R * K1 * 4);
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
 * the (R*(K+1), 4) view the box loss reads. */
static void to_arena(ps_rcnn_t *m, rcnn_stage_t *s, int R, const float *tgt)
{
    int K1 = m->cfg.num_classes + 1;
    ps_rcnn_level_major(s->h_rois, s->img, R, s->pos, s->Rl, s->rois);
    for (int j = 0; j < R; j++) {
        int p = s->pos[j], lab = s->h_labels[j];
        s->labels[p] = lab;
        for (int k = 0; k < K1; k++) {
            size_t row = (size_t)p * K1 + k;
            s->lab_x[row] = lab >= 1 && k == lab;
            if (tgt && lab >= 1 && k == lab)
                memcpy(s->tgt_x + row * 4, tgt + (size_t)j * 4, 4 * sizeof(float));
            else
                memset(s->tgt_x + row * 4, 0, 4 * sizeof(float));
        }
    }
}

int ps_rcnn_box_forward(ps_rcnn_t *m, rcnn_stage_t *s, const ps_rcnn_input_t *in,
                        const float *props, const int *counts, int stride, int training,
                        int site, ps_rcnn_losses_t *l)
{
    const ps_backend_t *be = m->be;
    const ps_rcnn_config_t *c = &m->cfg;
    int K1 = c->num_classes + 1, S = c->roi_size, rep = c->representation, F = c->fpn_channels;
    int in_dim = F * S * S;
    float *tgt = NULL;
    if (training && !(tgt = malloc(sizeof(float) * 4 * (size_t)m->Rmax))) {
        ps_error("rcnn forward: out of memory for %d box targets", m->Rmax);
        return PS_ENOMEM;
    }
    int R = roi_list(m, s, in, props, counts, stride, training, site, tgt);
    if (R >= 0) to_arena(m, s, R, tgt);
    free(tgt);
    if (R < 0) return R;
    s->R = R;
    if (l) l->classifier = l->box_reg = 0.f;
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
    be->linear_forward(m->ctx, s->box_out, s->h7, s->bbox.w, s->bbox.b, R, rep, K1 * 4);
    if (!training) return 0;
    l->classifier = be->xent_forward(m->ctx, s->probs, s->cls_out, s->labels, R, K1);
    be->smoothl1_forward(m->ctx, &l->box_reg, s->box_out, s->tgt_x, s->lab_x, c->smoothl1_beta,
                         (float)R, R * K1);
    return 0;
}

void ps_rcnn_box_backward(ps_rcnn_t *m, rcnn_stage_t *s)
{
    const ps_backend_t *be = m->be;
    const ps_rcnn_config_t *c = &m->cfg;
    int K1 = c->num_classes + 1, S = c->roi_size, rep = c->representation, F = c->fpn_channels;
    int R = s->R, in_dim = F * S * S;
    if (R == 0) return;
    be->xent_backward(m->ctx, s->dcls, s->probs, s->labels, 1.f, R, K1);
    be->smoothl1_backward(m->ctx, s->dbox, s->box_out, s->tgt_x, s->lab_x, 1.f,
                          c->smoothl1_beta, (float)R, R * K1);
    be->linear_backward(m->ctx, s->dh7, s->cls.gw, s->cls.gb, s->dcls, s->h7, s->cls.w, R, rep,
                        K1);
    be->linear_backward(m->ctx, s->dh7b, s->bbox.gw, s->bbox.gb, s->dbox, s->h7, s->bbox.w, R,
                        rep, K1 * 4);
    be->accumulate(m->ctx, s->dh7, s->dh7b, (size_t)R * rep);
    be->relu_backward(m->ctx, s->dh7, s->dh7, s->h7, (size_t)R * rep);
    be->linear_backward(m->ctx, s->dh6, s->fc7.gw, s->fc7.gb, s->dh7, s->h6, s->fc7.w, R, rep,
                        rep);
    be->relu_backward(m->ctx, s->dh6, s->dh6, s->h6, (size_t)R * rep);
    be->linear_backward(m->ctx, s->dpooled, s->fc6.gw, s->fc6.gb, s->dh6, s->pooled, s->fc6.w, R,
                        in_dim, rep);
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
