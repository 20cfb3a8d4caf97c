/* RetinaNet tables: torchvision names (backbone.body.*, backbone.fpn.*,
 * head.*), frozen stages, optimizer groups, the deterministic init and the
 * safetensors load / save. */
#include "retinanet_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"
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

static int add_param(ps_retina_t *m, const char *name, int ndim, const int *shape, int group,
                     int trainable)
{
    return ps_mtab_add_param(&m->params, &m->nparams, &m->cap_params, name, ndim, shape, group,
                             trainable);
}

static int def_conv(ps_retina_t *m, rconv_t *c, const char *name, int C, int K, int R, int stride)
{
    memset(c, 0, sizeof *c);
    c->d = (ps_conv2d_desc_t){.C = C, .K = K, .R = R, .S = R, .stride_h = stride,
                              .stride_w = stride, .pad_h = R / 2, .pad_w = R / 2, .dil_h = 1,
                              .dil_w = 1, .groups = 1};
    int shape[4] = {K, C, R, R};
    char full[128];
    snprintf(full, sizeof full, "%s.weight", name);
    if ((c->pw = add_param(m, full, 4, shape, PS_MODEL_GROUP_WEIGHT, 1)) < 0) return c->pw;
    snprintf(full, sizeof full, "%s.bias", name);
    if ((c->pb = add_param(m, full, 1, &K, PS_MODEL_GROUP_BIAS, 1)) < 0) return c->pb;
    return 0;
}

/* torchvision trainable_layers: freeze_at 1 freezes the stem, k >= 2 also
 * layer1..layer(k-1). */
static int frozen_name(const char *name, int freeze_at)
{
    if (freeze_at >= 1 && (!strncmp(name, "conv1.", 6) || !strncmp(name, "bn1.", 4))) return 1;
    for (int s = 1; s < freeze_at && s <= 4; s++) {
        char pre[16];
        snprintf(pre, sizeof pre, "layer%d.", s);
        if (!strncmp(name, pre, strlen(pre))) return 1;
    }
    return 0;
}

int ps_retina_define(ps_retina_t *m)
{
    static const char pre[] = "backbone.body.";
    char name[160];
    int nb, nbuf, r;
    const ps_model_param_t *bp = ps_model_params(m->body, &nb);
    const ps_model_buffer_t *bb = ps_model_buffers(m->body, &nbuf);
    for (int i = 0; i < nb; i++) {
        snprintf(name, sizeof name, "%s%s", pre, bp[i].name);
        int trainable = bp[i].trainable && !frozen_name(bp[i].name, m->cfg.freeze_at);
        if ((r = add_param(m, name, bp[i].ndim, bp[i].shape, bp[i].group, trainable)) < 0)
            return r;
        m->params[r].w = bp[i].w;
        m->params[r].g = bp[i].g;
    }
    m->nbody = nb;
    m->buffers = calloc(nbuf ? nbuf : 1, sizeof *m->buffers);
    if (!m->buffers) return PS_ENOMEM;
    for (int i = 0; i < nbuf; i++) {
        m->buffers[i] = bb[i];
        snprintf(name, sizeof name, "%s%s", pre, bb[i].name);
        if (!(m->buffers[i].name = strdup(name))) return PS_ENOMEM;
        m->nbuffers++;
    }

    int F = m->cfg.fpn_channels, K = m->cfg.num_classes, nA = PS_RETINA_ANCHORS;
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
    for (int j = 0; j < 4; j++) {
        snprintf(name, sizeof name, "head.classification_head.conv.%d.0", j);
        if ((r = def_conv(m, &m->cls[j], name, F, F, 3, 1))) return r;
    }
    if ((r = def_conv(m, &m->cls_logits, "head.classification_head.cls_logits", F, nA * K, 3,
                      1)))
        return r;
    for (int j = 0; j < 4; j++) {
        snprintf(name, sizeof name, "head.regression_head.conv.%d.0", j);
        if ((r = def_conv(m, &m->box[j], name, F, F, 3, 1))) return r;
    }
    return def_conv(m, &m->bbox_reg, "head.regression_head.bbox_reg", F, nA * 4, 3, 1);
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
    ps_model_param_t *w = &m->params[c->pw], *b = &m->params[c->pb];
    ps_model_hash_fill(w->w, w->numel, w->name, seed, bound);
    if (random) ps_model_hash_fill(b->w, b->numel, b->name, seed, 0.1);
    else memset(b->w, 0, b->numel * sizeof(float));
    for (size_t i = 0; i < b->numel; i++) b->w[i] += bias0;
}

static double fan_in(const rconv_t *c) { return (double)c->d.C * c->d.R * c->d.S; }

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
 * backbone alone -- a torchvision ResNet, or an official TSM checkpoint --
 * whose classifier is skipped and whose absent FPN and heads keep their
 * initialisation. */
static const ps_weights_rule_t tsm_backbone_rules[] = {
    {PS_WEIGHTS_DROP, "module.new_fc.", NULL},
    {PS_WEIGHTS_DROP, "module.base_model.fc.", NULL},
    {PS_WEIGHTS_PREFIX, "module.base_model.", "backbone.body."},
    {PS_WEIGHTS_INFIX, ".net.", "."},
};
static const ps_weights_rule_t tv_backbone_rules[] = {
    {PS_WEIGHTS_DROP, "fc.", NULL},
    {PS_WEIGHTS_PREFIX, "", "backbone.body."},
};
static const ps_weights_format_t own = {.name = "retinanet", .detect = "backbone."};
static const ps_weights_format_t tsm_backbone = {
    .name = "tsm backbone", .detect = "module.base_model.", .rules = tsm_backbone_rules,
    .nrules = 4, .covers = "backbone.body."};
static const ps_weights_format_t tv_backbone = {
    .name = "torchvision backbone", .rules = tv_backbone_rules, .nrules = 2,
    .covers = "backbone.body."};

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
    static const ps_weights_format_t *const all[] = {&own, &tsm_backbone, &tv_backbone};
    return load(m, path, all, 3, partial ? PS_WEIGHTS_PARTIAL : 0);
}

int ps_retina_load(ps_retina_t *m, const char *path) { return ps_retina_load_weights(m, path, 0); }

int ps_retina_load_backbone(ps_retina_t *m, const char *path)
{
    static const ps_weights_format_t *const bb[] = {&tsm_backbone, &tv_backbone};
    return load(m, path, bb, 2, 0);
}
