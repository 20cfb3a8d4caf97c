/* R-CNN tables: torchvision's names (backbone.body.*, backbone.fpn.*,
 * rpn.head.*, roi_heads.*), the defaults of fasterrcnn_resnet50_fpn, frozen
 * stages, optimizer groups, the deterministic init and safetensors. */
#include "rcnn_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "worker/models/ps_weights.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void ps_rcnn_config_default(ps_rcnn_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->depth = 50;
    c->num_classes = 80;
    c->width = 64;
    c->fpn_channels = 256;
    c->freeze_at = 2;
    c->bn_eps = 1e-5f;
    c->bn_mode = PS_MODEL_BN_FROZEN;
    c->rpn_train = (ps_det_rpn_params_t){2000, 2000, 0.7f, 1e-3f, 0.0f};
    c->rpn_test = (ps_det_rpn_params_t){1000, 1000, 0.7f, 1e-3f, 0.0f};
    c->rpn_batch = 256;
    c->rpn_fraction = 0.5f;
    c->representation = 1024;
    c->roi_size = 7;
    c->roi_sampling = 2;
    c->roi = (ps_det_roi_sample_params_t){0.5f, 0.5f, 512, 0.25f, {10.f, 10.f, 5.f, 5.f}};
    c->post = (ps_det_roi_post_params_t){0.05f, 0.5f, 100, 1e-2f, {10.f, 10.f, 5.f, 5.f}};
    c->smoothl1_beta = 1.f / 9.f;
    c->max_gt = 100;
    c->mask = 0;
    c->mask_dim = 256;
    c->mask_roi_size = 14;
    c->stages = 1;
    static const float ious[PS_RCNN_MAX_STAGES] = {0.5f, 0.6f, 0.7f};
    static const float w[PS_RCNN_MAX_STAGES][4] = {
        {10, 10, 5, 5}, {20, 20, 10, 10}, {30, 30, 15, 15}};
    memcpy(c->cascade_iou, ious, sizeof ious);
    memcpy(c->cascade_weights, w, sizeof w);
    c->cascade_beta = 0.f;
}

int ps_rcnn_define(ps_rcnn_t *m)
{
    int r = ps_mtab_add_backbone(&m->params, &m->nparams, &m->cap_params, &m->buffers,
                                 &m->nbuffers, m->body, "backbone.body.", m->cfg.freeze_at);
    if (r) return r;
    m->nbody = m->nparams;
    m->g_body = ps_mgroup_since(0, m->nparams);
    int first = m->nparams;
    if ((r = ps_rcnn_fpn_define(m))) return r;
    m->g_fpn = ps_mgroup_since(first, m->nparams);
    first = m->nparams;
    if ((r = ps_rcnn_rpn_define(m))) return r;
    m->g_rpn = ps_mgroup_since(first, m->nparams);
    if (m->nstages == 1 &&
        (r = ps_rcnn_box_define(m, &m->stage[0], "roi_heads.box_head", "roi_heads.box_predictor")))
        return r;
    /* Cascade: the stages' heads as ModuleLists (Detectron2's
     * roi_heads.box_head.k, roi_heads.box_predictor.k) */
    for (int k = 0; m->nstages > 1 && k < m->nstages; k++) {
        char head[64], pred[64];
        snprintf(head, sizeof head, "roi_heads.box_head.%d", k);
        snprintf(pred, sizeof pred, "roi_heads.box_predictor.%d", k);
        if ((r = ps_rcnn_box_define(m, &m->stage[k], head, pred))) return r;
    }
    first = m->nparams;
    if (m->cfg.mask && (r = ps_rcnn_mask_define(m))) return r;
    m->g_mask = ps_mgroup_since(first, m->nparams);
    return 0;
}

void ps_rcnn_set_hooks(ps_rcnn_t *m, ps_model_hook_fn grad_ready, ps_model_hook_fn weights_needed,
                       void *ctx)
{
    ps_mhooks_set(&m->hooks, m->body, grad_ready, weights_needed, ctx);
}

static void set_hooks_of(void *m, ps_model_hook_fn grad_ready, ps_model_hook_fn weights_needed,
                         void *ctx)
{
    ps_rcnn_set_hooks(m, grad_ready, weights_needed, ctx);
}

void ps_rcnn_hookable(ps_rcnn_t *m, ps_model_hookable_t *h)
{
    ps_mtab_hookable(h, m->params, m->nparams, m->buffers, m->nbuffers, m, set_hooks_of);
}

void ps_rcnn_free_tables(ps_rcnn_t *m)
{
    ps_mtab_free(&m->params, &m->nparams, &m->buffers, &m->nbuffers);
}

void ps_rlin_resolve(rlin_t *l, const ps_model_param_t *params)
{
    l->w = params[l->pw].w;
    l->gw = params[l->pw].g;
    l->b = params[l->pb].w;
    l->gb = params[l->pb].g;
}

const ps_model_param_t *ps_rcnn_params(const ps_rcnn_t *m, int *n)
{
    if (n) *n = m->nparams;
    return m->params;
}

const ps_model_buffer_t *ps_rcnn_buffers(const ps_rcnn_t *m, int *n)
{
    if (n) *n = m->nbuffers;
    return m->buffers;
}

int ps_rcnn_find_param(const ps_rcnn_t *m, const char *name)
{
    return ps_mtab_find(m->params, m->nparams, name);
}

int ps_rcnn_groups(const ps_rcnn_t *m, ps_param_group_t *groups, int max)
{
    return ps_model_groups(m->body, groups, max);
}

int ps_rcnn_tensor_specs(const ps_rcnn_t *m, ps_tensor_spec_t **specs)
{
    return ps_mtab_tensor_specs(m->params, m->nparams, specs);
}

void ps_rcnn_zero_grad(ps_rcnn_t *m) { ps_mtab_zero_grad(m->params, m->nparams); }

/* nn.Linear's default init: weight and bias uniform in +-1/sqrt(fan_in) */
static void init_lin(ps_rcnn_t *m, const rlin_t *l, uint64_t seed)
{
    ps_model_param_t *w = &m->params[l->pw], *b = &m->params[l->pb];
    double bound = 1.0 / sqrt((double)l->C);
    ps_model_hash_fill(w->w, w->numel, w->name, seed, bound);
    ps_model_hash_fill(b->w, b->numel, b->name, seed, bound);
}

/* weight uniform in +-bound, bias 0 */
static void init_lin_bound(ps_rcnn_t *m, const rlin_t *l, uint64_t seed, double bound)
{
    ps_model_param_t *w = &m->params[l->pw], *b = &m->params[l->pb];
    ps_model_hash_fill(w->w, w->numel, w->name, seed, bound);
    memset(b->w, 0, b->numel * sizeof(float));
}

void ps_rcnn_init(ps_rcnn_t *m, uint64_t seed, int random)
{
    ps_model_init(m->body, seed, random);
    rcnn_fpn_t *f = &m->fpn;
    /* FPN: kaiming_uniform_(a=1) -> bound sqrt(6/((1+1) fan_in)) */
    for (int i = 0; i < 4; i++) {
        ps_rconv_init(&f->inner[i], m->params, seed, sqrt(3.0 / ps_rconv_fan_in(&f->inner[i])),
                      random, 0.f);
        ps_rconv_init(&f->layer[i], m->params, seed, sqrt(3.0 / ps_rconv_fan_in(&f->layer[i])),
                      random, 0.f);
    }
    /* RPN head: normal(std 0.01) -> uniform bound 0.01*sqrt(3) */
    const rconv_t *rpn[3] = {&m->rpn.conv, &m->rpn.cls, &m->rpn.bbox};
    for (int i = 0; i < 3; i++)
        ps_rconv_init(rpn[i], m->params, seed, random ? 0.1 : 0.01 * sqrt(3.0), random, 0.f);
    for (int k = 0; k < m->nstages; k++) {
        const rcnn_stage_t *s = &m->stage[k];
        if (m->nstages == 1) {
            init_lin(m, &s->fc6, seed);
            init_lin(m, &s->fc7, seed);
            init_lin(m, &s->cls, seed);
            init_lin(m, &s->bbox, seed);
            continue;
        }
        /* Detectron2's: FastRCNNConvFCHead's fcs c2_xavier_fill
         * (kaiming_uniform a=1: bound sqrt(3 / fan_in)), the predictor's
         * cls_score normal(std 0.01) and bbox_pred normal(std 0.001) as
         * uniforms of those stds; biases 0 */
        init_lin_bound(m, &s->fc6, seed, sqrt(3.0 / s->fc6.C));
        init_lin_bound(m, &s->fc7, seed, sqrt(3.0 / s->fc7.C));
        init_lin_bound(m, &s->cls, seed, 0.01 * sqrt(3.0));
        init_lin_bound(m, &s->bbox, seed, 0.001 * sqrt(3.0));
    }
    if (m->cfg.mask) ps_rcnn_mask_init(m, seed, random);
    ps_rcnn_zero_grad(m);
}

int ps_rcnn_save(const ps_rcnn_t *m, const char *path)
{
    char arch[64];
    const char *kind = m->cfg.mask ? "maskrcnn" : m->nstages > 1 ? "cascade" : "fasterrcnn";
    snprintf(arch, sizeof arch, "%s-resnet%d-fpn", kind, m->cfg.depth);
    return ps_mtab_save(m->params, m->nparams, m->buffers, m->nbuffers, arch, kind, path);
}

/* Its own checkpoint (torchvision's fasterrcnn names), or an ImageNet
 * classifier for the backbone alone (ps_weights_det_backbone_formats). */
static const ps_weights_format_t own = {.name = "fasterrcnn", .detect = "backbone."};

static int load(ps_rcnn_t *m, const char *path, const ps_weights_format_t *const *formats, int n,
                unsigned flags)
{
    ps_weights_target_t t = {.what = "fasterrcnn", .params = m->params, .nparams = m->nparams,
                             .buffers = m->buffers, .nbuffers = m->nbuffers};
    int r = ps_weights_load(&t, path, formats, n, flags, NULL);
    if (!r) ps_rcnn_zero_grad(m);
    return r;
}

int ps_rcnn_load_weights(ps_rcnn_t *m, const char *path, int partial)
{
    const ps_weights_format_t *const all[] = {&own, ps_weights_det_backbone_formats[0],
                                              ps_weights_det_backbone_formats[1]};
    return load(m, path, all, 3, partial ? PS_WEIGHTS_PARTIAL : 0);
}

int ps_rcnn_load(ps_rcnn_t *m, const char *path) { return ps_rcnn_load_weights(m, path, 0); }

int ps_rcnn_load_backbone(ps_rcnn_t *m, const char *path)
{
    return load(m, path, ps_weights_det_backbone_formats, PS_WEIGHTS_DET_BACKBONE_NFORMATS, 0);
}
