/* The R-CNN's region proposal network (torchvision RegionProposalNetwork +
 * RPNHead, 0.14): the shared head through the backend table, the proposals
 * per image on the host (ps_det_rpn_proposals), the anchor sampling and the
 * two losses.
 *
 * Objectness BCE through the focal-loss slot: with gamma 0 and alpha 0.5
 * the focal term is exactly half the binary cross-entropy (alpha_t = 0.5
 * for both classes, (1 - p_t)^0 = 1), so a normaliser of half the sampled
 * count gives torchvision's mean BCE over the sampled anchors; the scaling
 * by two is exact. */
#include "rcnn_internal.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdlib.h>
#include <string.h>

#define TAKE(ptr, n) ((ptr) = (void *)ps_arena_take(a, (n)))

int ps_rcnn_rpn_define(ps_rcnn_t *m)
{
    rcnn_rpn_t *r = &m->rpn;
    int F = m->cfg.fpn_channels, nA = PS_RCNN_ANCHORS, rc;
    if ((rc = ps_rconv_define(&r->conv, &m->params, &m->nparams, &m->cap_params,
                              "rpn.head.conv.0.0", F, F, 3, 1)) ||
        (rc = ps_rconv_define(&r->cls, &m->params, &m->nparams, &m->cap_params,
                              "rpn.head.cls_logits", F, nA, 1, 1)))
        return rc;
    return ps_rconv_define(&r->bbox, &m->params, &m->nparams, &m->cap_params,
                           "rpn.head.bbox_pred", F, nA * 4, 1, 1);
}

void ps_rcnn_rpn_layout(ps_rcnn_t *m, ps_arena_t *a)
{
    rcnn_rpn_t *r = &m->rpn;
    size_t N = m->max_n, F = m->cfg.fpn_channels, nA = PS_RCNN_ANCHORS, A = m->A;
    for (int l = 0; l < PS_RCNN_LEVELS; l++) {
        size_t hw = (size_t)m->lh[l] * m->lw[l];
        TAKE(r->t[l], N * F * hw);
        TAKE(r->obj_o[l], N * nA * hw);
        TAKE(r->box_o[l], N * nA * 4 * hw);
    }
    TAKE(r->obj, N * A);
    TAKE(r->box, N * A * 4);
    TAKE(r->dobj, N * A);
    TAKE(r->dbox, N * A * 4);
    TAKE(r->labels, N * A); /* int32: the size of a float */
    TAKE(r->targets, N * A * 4);
}

void ps_rcnn_rpn_forward(ps_rcnn_t *m, int n)
{
    rcnn_rpn_t *r = &m->rpn;
    const ps_backend_t *be = m->be;
    int F = m->cfg.fpn_channels, nA = PS_RCNN_ANCHORS;
    for (int l = 0; l < PS_RCNN_LEVELS; l++) {
        int h = m->lh[l], w = m->lw[l];
        size_t hw = (size_t)h * w;
        ps_rconv_forward(be, m->ctx, &r->conv, r->t[l], m->fpn.P[l], n, h, w);
        be->relu_forward(m->ctx, r->t[l], r->t[l], (size_t)n * F * hw);
        ps_rconv_forward(be, m->ctx, &r->cls, r->obj_o[l], r->t[l], n, h, w);
        ps_rconv_forward(be, m->ctx, &r->bbox, r->box_o[l], r->t[l], n, h, w);
        for (int i = 0; i < n; i++) {
            size_t row = (size_t)i * m->A + m->loff[l];
            be->head_permute_forward(m->ctx, r->obj + row, r->obj_o[l] + (size_t)i * nA * hw,
                                     nA, 1, h, w);
            be->head_permute_forward(m->ctx, r->box + row * 4,
                                     r->box_o[l] + (size_t)i * nA * 4 * hw, nA, 4, h, w);
        }
    }
}

/* Each image's proposals into the host arrays: the given ones (tests) or
 * the RPN's; the host reads the outputs, so the caller synced. */
int ps_rcnn_rpn_proposals(ps_rcnn_t *m, const ps_rcnn_input_t *in, int training)
{
    rcnn_rpn_t *r = &m->rpn;
    int Al[PS_RCNN_LEVELS];
    for (int l = 0; l < PS_RCNN_LEVELS; l++) Al[l] = m->lh[l] * m->lw[l] * PS_RCNN_ANCHORS;
    const ps_det_rpn_params_t *p = training ? &m->cfg.rpn_train : &m->cfg.rpn_test;
    for (int i = 0; i < in->n; i++) {
        float *out = r->props + (size_t)i * r->post_max * 4;
        if (in->proposals) {
            int k = in->nproposals[i];
            if (k < 0 || k > r->post_max || k > in->proposal_stride) {
                ps_error("rcnn forward: image %d has %d given proposals, the bound is %d", i, k,
                         r->post_max);
                return PS_EINVAL;
            }
            memcpy(out, in->proposals + (size_t)i * in->proposal_stride * 4,
                   sizeof(float) * 4 * (size_t)k);
            r->nprops[i] = k;
            continue;
        }
        int k = ps_det_rpn_proposals(out, NULL, r->obj + (size_t)i * m->A,
                                     r->box + (size_t)i * m->A * 4, m->anchors, Al,
                                     PS_RCNN_LEVELS, m->hw[2 * i], m->hw[2 * i + 1], p);
        if (k < 0) return k;
        r->nprops[i] = k;
    }
    return 0;
}

/* The sampled anchors' labels (-1 / 0 / 1) and targets, then both losses. */
int ps_rcnn_rpn_loss(ps_rcnn_t *m, const ps_rcnn_input_t *in, ps_rcnn_losses_t *l)
{
    rcnn_rpn_t *r = &m->rpn;
    const ps_backend_t *be = m->be;
    size_t rows = (size_t)in->n * m->A;
    int sampled = 0;
    for (int i = 0; i < in->n; i++) {
        int32_t *lab = r->labels + (size_t)i * m->A;
        const int32_t *src = in->rpn_labels + (size_t)i * m->A;
        for (int a = 0; a < m->A; a++) {
            if (src[a] < -1) {
                ps_error("rcnn forward: RPN label %d of image %d anchor %d below -1", src[a], i,
                         a);
                return PS_EINVAL;
            }
            lab[a] = src[a] >= 1 ? 1 : src[a];
        }
        int s = ps_det_sample_balanced(lab, m->A, m->cfg.rpn_batch, m->cfg.rpn_fraction,
                                       ps_det_sample_key(in->seed, 0, i));
        if (s < 0) return s;
        sampled += s;
    }
    memcpy(r->targets, in->rpn_targets, sizeof(float) * 4 * rows);
    /* torchvision divides by the sampled count; none sampled (no anchors
     * at all) leaves both sums 0 */
    float ns = sampled > 0 ? (float)sampled : 1.f;
    r->norm = ns / 2.f;
    int rc = be->focal_forward(m->ctx, &l->objectness, r->obj, r->labels, 0.5f, 0.f, r->norm,
                               (int)rows, 1);
    if (rc) return rc;
    be->smoothl1_forward(m->ctx, &l->rpn_box, r->box, r->targets, r->labels,
                         m->cfg.smoothl1_beta, ns, (int)rows);
    return 0;
}

void ps_rcnn_rpn_backward(ps_rcnn_t *m, int n)
{
    rcnn_rpn_t *r = &m->rpn;
    const ps_backend_t *be = m->be;
    int F = m->cfg.fpn_channels, nA = PS_RCNN_ANCHORS, rows = n * m->A;
    be->focal_backward(m->ctx, r->dobj, r->obj, r->labels, 1.f, 0.5f, 0.f, r->norm, rows, 1);
    be->smoothl1_backward(m->ctx, r->dbox, r->box, r->targets, r->labels, 1.f,
                          m->cfg.smoothl1_beta, 2.f * r->norm, rows);
    /* the shared head's parameter gradients accumulate over the levels */
    for (int l = PS_RCNN_LEVELS - 1; l >= 0; l--) {
        int h = m->lh[l], w = m->lw[l];
        size_t hw = (size_t)h * w;
        for (int i = 0; i < n; i++) {
            size_t row = (size_t)i * m->A + m->loff[l];
            be->head_permute_backward(m->ctx, m->s1 + (size_t)i * nA * hw, r->dobj + row, nA, 1,
                                      h, w);
            be->head_permute_backward(m->ctx, m->s2 + (size_t)i * nA * 4 * hw, r->dbox + row * 4,
                                      nA, 4, h, w);
        }
        ps_rconv_backward(be, m->ctx, &r->cls, m->s3, m->s1, r->t[l], n, h, w);
        ps_rconv_backward(be, m->ctx, &r->bbox, m->s4, m->s2, r->t[l], n, h, w);
        be->accumulate(m->ctx, m->s3, m->s4, (size_t)n * F * hw);
        be->relu_backward(m->ctx, m->s3, m->s3, r->t[l], (size_t)n * F * hw);
        ps_rconv_backward(be, m->ctx, &r->conv, m->fpn.dP[l], m->s3, m->fpn.P[l], n, h, w);
    }
}
