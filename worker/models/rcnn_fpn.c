/* The R-CNN backbone's FPN (torchvision FeaturePyramidNetwork on layer1..4
 * with LastLevelMaxPool): P2..P5 from 1x1 laterals, nearest top-down
 * merges and 3x3 outputs, P6 = max_pool2d(P5, 1, 2); its backward down to
 * the backbone's stages, through the backend table. */
#include "rcnn_internal.h"

#include "ps_error.h"

#include <stdio.h>

#define TAKE(ptr, n) ((ptr) = (void *)ps_arena_take(a, (n)))

int ps_rcnn_fpn_define(ps_rcnn_t *m)
{
    rcnn_fpn_t *f = &m->fpn;
    int F = m->cfg.fpn_channels, r;
    char name[96];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "backbone.fpn.inner_blocks.%d.0", i);
        if ((r = ps_rconv_define(&f->inner[i], &m->params, &m->nparams, &m->cap_params, name,
                                 f->Cs[i], F, 1, 1)))
            return r;
    }
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "backbone.fpn.layer_blocks.%d.0", i);
        if ((r = ps_rconv_define(&f->layer[i], &m->params, &m->nparams, &m->cap_params, name, F,
                                 F, 3, 1)))
            return r;
    }
    return 0;
}

void ps_rcnn_fpn_layout(ps_rcnn_t *m, ps_arena_t *a)
{
    rcnn_fpn_t *f = &m->fpn;
    size_t N = m->max_n, F = m->cfg.fpn_channels;
    for (int i = 0; i < 4; i++) {
        size_t hw = (size_t)f->Hs[i] * f->Ws[i];
        TAKE(f->inner_out[i], N * F * hw);
        TAKE(f->dI[i], N * F * hw);
        TAKE(f->dC[i], N * f->Cs[i] * hw);
    }
    for (int l = 0; l < PS_RCNN_LEVELS; l++) {
        size_t hw = (size_t)m->lh[l] * m->lw[l];
        TAKE(f->P[l], N * F * hw);
        TAKE(f->dP[l], N * F * hw);
    }
    TAKE(f->p6_argmax, N * F * m->lh[4] * m->lw[4]); /* int32: the size of a float */
}

static const ps_pool_desc_t p6_pool = {1, 1, 2, 2, 0, 0};

void ps_rcnn_fpn_forward(ps_rcnn_t *m, int n)
{
    rcnn_fpn_t *f = &m->fpn;
    const ps_backend_t *be = m->be;
    int F = m->cfg.fpn_channels;
    const float *C[4];
    for (int i = 0; i < 4; i++) C[i] = ps_resnet_stage_out(m->body, i, NULL, NULL, NULL);
    ps_rconv_forward(be, m->ctx, &f->inner[3], f->inner_out[3], C[3], n, f->Hs[3], f->Ws[3]);
    ps_rconv_forward(be, m->ctx, &f->layer[3], f->P[3], f->inner_out[3], n, f->Hs[3], f->Ws[3]);
    for (int i = 2; i >= 0; i--) {
        ps_rconv_forward(be, m->ctx, &f->inner[i], f->inner_out[i], C[i], n, f->Hs[i], f->Ws[i]);
        be->upsample_add_forward(m->ctx, f->inner_out[i], f->inner_out[i], f->inner_out[i + 1], n,
                                 F, f->Hs[i + 1], f->Ws[i + 1], f->Hs[i], f->Ws[i]);
        ps_rconv_forward(be, m->ctx, &f->layer[i], f->P[i], f->inner_out[i], n, f->Hs[i],
                         f->Ws[i]);
    }
    be->maxpool_forward(m->ctx, f->P[4], f->p6_argmax, f->P[3], &p6_pool, n, F, m->lh[3],
                        m->lw[3]);
}

void ps_rcnn_fpn_backward(ps_rcnn_t *m, int n)
{
    rcnn_fpn_t *f = &m->fpn;
    const ps_backend_t *be = m->be;
    int F = m->cfg.fpn_channels;
    /* P6 = maxpool(P5) */
    be->maxpool_backward(m->ctx, m->s1, f->dP[4], f->p6_argmax, &p6_pool, n, F, m->lh[3],
                         m->lw[3]);
    be->accumulate(m->ctx, f->dP[3], m->s1, (size_t)n * F * m->lh[3] * m->lw[3]);
    for (int i = 0; i < 4; i++)
        ps_rconv_backward(be, m->ctx, &f->layer[i], f->dI[i], f->dP[i], f->inner_out[i], n,
                          f->Hs[i], f->Ws[i]);
    /* the top-down merges in reverse: finer levels pass their share up */
    for (int i = 0; i < 3; i++) {
        be->upsample_add_backward(m->ctx, NULL, m->s1, f->dI[i], n, F, f->Hs[i + 1],
                                  f->Ws[i + 1], f->Hs[i], f->Ws[i]);
        be->accumulate(m->ctx, f->dI[i + 1], m->s1, (size_t)n * F * f->Hs[i + 1] * f->Ws[i + 1]);
    }
    /* a frozen stage (freeze_at k freezes layer1..layer(k-1)) needs no input gradient */
    const float *C[4], *dstage[4];
    for (int i = 0; i < 4; i++) {
        C[i] = ps_resnet_stage_out(m->body, i, NULL, NULL, NULL);
        int frozen = i + 2 <= m->cfg.freeze_at;
        ps_rconv_backward(be, m->ctx, &f->inner[i], frozen ? NULL : f->dC[i], f->dI[i], C[i], n,
                          f->Hs[i], f->Ws[i]);
        dstage[i] = frozen ? NULL : f->dC[i];
    }
    ps_mhooks_ready(&m->hooks, m->g_fpn);
    if (m->cfg.freeze_at < 5)
        ps_resnet_backward_features(m->body, dstage, n, m->cfg.freeze_at); /* fires its hooks */
    else /* the whole backbone frozen: no backward, its gradients stay as they are */
        ps_mhooks_ready(&m->hooks, m->g_body);
}
