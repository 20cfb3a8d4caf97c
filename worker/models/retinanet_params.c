/* RetinaNet tables: torchvision names (backbone.body.*, backbone.fpn.*,
 * head.*), frozen stages, optimizer groups, the deterministic init and the
 * safetensors load / save. */
#include "retinanet_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "worker/models/ps_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_retina_config_default(ps_retina_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->depth = 50;
    c->num_classes = 80;
    c->width = 64;
    c->fpn_channels = 256;
    c->p6_from_p5 = 0;
    c->freeze_at = 2;
    c->bn_eps = 1e-5f;
    c->bn_mode = PS_MODEL_BN_FROZEN;
    c->focal_alpha = 0.25f;
    c->focal_gamma = 2.f;
    c->smoothl1_beta = 1.f / 9.f;
    c->prior = 0.01f;
}

static int def_conv(ps_retina_t *m, rconv_t *c, const char *name, int C, int K, int R, int stride)
{
    return ps_rconv_define(c, &m->params, &m->nparams, &m->cap_params, name, C, K, R, stride);
}

int ps_retina_define(ps_retina_t *m)
{
    char name[160];
    int r = ps_mtab_add_backbone(&m->params, &m->nparams, &m->cap_params, &m->buffers,
                                 &m->nbuffers, m->body, "backbone.body.", m->cfg.freeze_at);
    if (r) return r;
    m->nbody = m->nparams;

    int F = m->cfg.fpn_channels, K = m->cfg.num_classes, nA = PS_RETINA_ANCHORS;
    int first = m->nparams;
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "backbone.fpn.inner_blocks.%d.0", i);
        if ((r = def_conv(m, &m->inner[i], name, m->Cs[i], F, 1, 1))) return r;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "backbone.fpn.layer_blocks.%d.0", i);
        if ((r = def_conv(m, &m->layer[i], name, F, F, 3, 1))) return r;
    }
    int p6in = m->cfg.p6_from_p5 ? F : m->Cs[2];
    if ((r = def_conv(m, &m->p6, "backbone.fpn.extra_blocks.p6", p6in, F, 3, 2))) return r;
    if ((r = def_conv(m, &m->p7, "backbone.fpn.extra_blocks.p7", F, F, 3, 2))) return r;
    m->g_fpn = ps_mgroup_since(first, m->nparams);
    first = m->nparams;
    for (int j = 0; j < 4; j++) {
        snprintf(name, sizeof name, "head.classification_head.conv.%d.0", j);
        if ((r = def_conv(m, &m->cls[j], name, F, F, 3, 1))) return r;
    }
    if ((r = def_conv(m, &m->cls_logits, "head.classification_head.cls_logits", F, nA * K, 3,
                      1)))
        return r;
    m->g_cls = ps_mgroup_since(first, m->nparams);
    first = m->nparams;
    for (int j = 0; j < 4; j++) {
        snprintf(name, sizeof name, "head.regression_head.conv.%d.0", j);
        if ((r = def_conv(m, &m->box[j], name, F, F, 3, 1))) return r;
    }
    if ((r = def_conv(m, &m->bbox_reg, "head.regression_head.bbox_reg", F, nA * 4, 3, 1)))
        return r;
    m->g_box = ps_mgroup_since(first, m->nparams);
    return 0;
}

void ps_retina_set_hooks(ps_retina_t *m, ps_model_hook_fn grad_ready,
                         ps_model_hook_fn weights_needed, void *ctx)
{
    ps_mhooks_set(&m->hooks, m->body, grad_ready, weights_needed, ctx);
}

static void set_hooks_of(void *m, ps_model_hook_fn grad_ready, ps_model_hook_fn weights_needed,
                         void *ctx)
{
    ps_retina_set_hooks(m, grad_ready, weights_needed, ctx);
}

void ps_retina_hookable(ps_retina_t *m, ps_model_hookable_t *h)
{
    ps_mtab_hookable(h, m->params, m->nparams, m->buffers, m->nbuffers, m, set_hooks_of);
}

void ps_retina_free_tables(ps_retina_t *m)
{
    ps_mtab_free(&m->params, &m->nparams, &m->buffers, &m->nbuffers);
}

const ps_model_param_t *ps_retina_params(const ps_retina_t *m, int *n)
{
    if (n) *n = m->nparams;
    return m->params;
}

const ps_model_buffer_t *ps_retina_buffers(const ps_retina_t *m, int *n)
{
    if (n) *n = m->nbuffers;
    return m->buffers;
}

int ps_retina_find_param(const ps_retina_t *m, const char *name)
{
    return ps_mtab_find(m->params, m->nparams, name);
}

int ps_retina_groups(const ps_retina_t *m, ps_param_group_t *groups, int max)
{
    return ps_model_groups(m->body, groups, max);
}

int ps_retina_tensor_specs(const ps_retina_t *m, ps_tensor_spec_t **specs)
{
    return ps_mtab_tensor_specs(m->params, m->nparams, specs);
}

void ps_retina_zero_grad(ps_retina_t *m) { ps_mtab_zero_grad(m->params, m->nparams); }

static void init_conv(ps_retina_t *m, const rconv_t *c, uint64_t seed, double bound, int random,
                      float bias0)
{
    ps_rconv_init(c, m->params, seed, bound, random, bias0);
}

static double fan_in(const rconv_t *c) { return ps_rconv_fan_in(c); }

void ps_retina_init(ps_retina_t *m, uint64_t seed, int random)
{
    ps_model_init(m->body, seed, random);
    /* FPN: kaiming_uniform_(a=1) -> bound sqrt(6/((1+1) fan_in)) */
    rconv_t *fpn[8] = {&m->inner[0], &m->inner[1], &m->inner[2], &m->layer[0],
                       &m->layer[1], &m->layer[2], &m->p6,       &m->p7};
    for (int i = 0; i < 8; i++) init_conv(m, fpn[i], seed, sqrt(3.0 / fan_in(fpn[i])), random, 0.f);
    /* heads: normal(std 0.01) -> uniform bound 0.01*sqrt(3) */
    rconv_t *head[10] = {&m->cls[0], &m->cls[1], &m->cls[2], &m->cls[3], &m->cls_logits,
                         &m->box[0], &m->box[1], &m->box[2], &m->box[3], &m->bbox_reg};
    double p = m->cfg.prior;
    float prior_bias = (float)-log((1.0 - p) / p);
    for (int i = 0; i < 10; i++)
        init_conv(m, head[i], seed, random ? sqrt(3.0 / fan_in(head[i])) : 0.01 * sqrt(3.0),
                  random, head[i] == &m->cls_logits ? prior_bias : 0.f);
    ps_retina_zero_grad(m);
}

/* ---- safetensors ------------------------------------------------------------ */

int ps_retina_save(const ps_retina_t *m, const char *path)
{
    char arch[64];
    snprintf(arch, sizeof arch, "retinanet-resnet%d-fpn", m->cfg.depth);
    return ps_mtab_save(m->params, m->nparams, m->buffers, m->nbuffers, arch, "retinanet", path);
}

/* The file kinds a detector starts from (ps_weights.h): its own checkpoint
 * (torchvision's retinanet names), or an ImageNet classifier for the
 * backbone alone (ps_weights_det_backbone_formats: a torchvision ResNet, or
 * an official TSM checkpoint) whose classifier is skipped and whose absent
 * FPN and heads keep their initialisation. */
static const ps_weights_format_t own = {.name = "retinanet", .detect = "backbone."};

static int load(ps_retina_t *m, const char *path, const ps_weights_format_t *const *formats,
                int n, unsigned flags)
{
    ps_weights_target_t t = {.what = "retinanet", .params = m->params, .nparams = m->nparams,
                             .buffers = m->buffers, .nbuffers = m->nbuffers};
    int r = ps_weights_load(&t, path, formats, n, flags, NULL);
    if (!r) ps_retina_zero_grad(m);
    return r;
}

int ps_retina_load_weights(ps_retina_t *m, const char *path, int partial)
{
    const ps_weights_format_t *const all[] = {&own, ps_weights_det_backbone_formats[0],
                                              ps_weights_det_backbone_formats[1]};
    return load(m, path, all, 3, partial ? PS_WEIGHTS_PARTIAL : 0);
}

int ps_retina_load(ps_retina_t *m, const char *path) { return ps_retina_load_weights(m, path, 0); }

int ps_retina_load_backbone(ps_retina_t *m, const char *path)
{
    return load(m, path, ps_weights_det_backbone_formats, PS_WEIGHTS_DET_BACKBONE_NFORMATS, 0);
}
