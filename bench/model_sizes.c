/* Tensor layouts of ResNet-18/50 (torchvision), their I3D inflation and
 * RetinaNet-R50-FPN (torchvision v1), in the order of named_parameters(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_sizes.h"
#include "ps_error.h"
#include "ps_log.h"

typedef struct builder {
    psbench_model_t *m;
    unsigned cap;
    int err;
} builder_t;

static void add(builder_t *b, const char *name, size_t numel)
{
    if (b->err) return;
    if (b->m->ntensors == b->cap) {
        unsigned cap = b->cap ? 2 * b->cap : 256;
        ps_tensor_spec_t *t = realloc(b->m->tensors, cap * sizeof *t);
        if (!t) {
            b->err = PS_ENOMEM;
            return;
        }
        b->m->tensors = t;
        b->cap = cap;
    }
    char *n = strdup(name);
    if (!n) {
        b->err = PS_ENOMEM;
        return;
    }
    ps_tensor_spec_t *t = &b->m->tensors[b->m->ntensors++];
    t->name = n;
    t->numel = numel;
    t->group = 0;
    b->m->total_numel += numel;
}

/* conv weight [out, in, kt, k, k] (kt = 1: 2-D) */
static void conv(builder_t *b, const char *name, size_t out, size_t in, size_t kt, size_t k)
{
    add(b, name, out * in * kt * k * k);
}

static void bn(builder_t *b, const char *prefix, size_t ch, int frozen)
{
    char n[160];
    if (frozen) return; /* FrozenBatchNorm2d: weight/bias are buffers */
    snprintf(n, sizeof n, "%s.weight", prefix);
    add(b, n, ch);
    snprintf(n, sizeof n, "%s.bias", prefix);
    add(b, n, ch);
}

typedef struct resnet_shape {
    int bottleneck;      /* 1: ResNet-50 bottleneck blocks, 0: basic blocks */
    int blocks[4];
    size_t kt_stem;      /* temporal size of conv1 */
    size_t kt_3x3;       /* temporal size of every 3x3 conv */
    int frozen_bn;
    const char *prefix;  /* "" or "backbone.body." */
} resnet_shape_t;

/* Returns the output channels of each stage in ch[4]. */
static void resnet(builder_t *b, const resnet_shape_t *s, size_t ch[4])
{
    char n[160];
    const char *p = s->prefix;
    size_t exp = s->bottleneck ? 4 : 1, inplanes = 64;
    snprintf(n, sizeof n, "%sconv1.weight", p);
    conv(b, n, 64, 3, s->kt_stem, 7);
    snprintf(n, sizeof n, "%sbn1", p);
    bn(b, n, 64, s->frozen_bn);
    for (int L = 0; L < 4; L++) {
        size_t planes = (size_t)64 << L;
        for (int k = 0; k < s->blocks[L]; k++) {
            char blk[96], cn[160];
            snprintf(blk, sizeof blk, "%slayer%d.%d", p, L + 1, k);
            if (s->bottleneck) {
                snprintf(cn, sizeof cn, "%s.conv1.weight", blk);
                conv(b, cn, planes, inplanes, 1, 1);
                snprintf(cn, sizeof cn, "%s.bn1", blk);
                bn(b, cn, planes, s->frozen_bn);
                snprintf(cn, sizeof cn, "%s.conv2.weight", blk);
                conv(b, cn, planes, planes, s->kt_3x3, 3);
                snprintf(cn, sizeof cn, "%s.bn2", blk);
                bn(b, cn, planes, s->frozen_bn);
                snprintf(cn, sizeof cn, "%s.conv3.weight", blk);
                conv(b, cn, planes * exp, planes, 1, 1);
                snprintf(cn, sizeof cn, "%s.bn3", blk);
                bn(b, cn, planes * exp, s->frozen_bn);
            } else {
                snprintf(cn, sizeof cn, "%s.conv1.weight", blk);
                conv(b, cn, planes, inplanes, s->kt_3x3, 3);
                snprintf(cn, sizeof cn, "%s.bn1", blk);
                bn(b, cn, planes, s->frozen_bn);
                snprintf(cn, sizeof cn, "%s.conv2.weight", blk);
                conv(b, cn, planes, planes, s->kt_3x3, 3);
                snprintf(cn, sizeof cn, "%s.bn2", blk);
                bn(b, cn, planes, s->frozen_bn);
            }
            /* torchvision: a projection where the stride or width changes */
            if (k == 0 && (L > 0 || inplanes != planes * exp)) {
                snprintf(cn, sizeof cn, "%s.downsample.0.weight", blk);
                conv(b, cn, planes * exp, inplanes, 1, 1);
                snprintf(cn, sizeof cn, "%s.downsample.1", blk);
                bn(b, cn, planes * exp, s->frozen_bn);
            }
            inplanes = planes * exp;
        }
        ch[L] = planes * exp;
    }
}

static void fc(builder_t *b, size_t in, size_t classes)
{
    add(b, "fc.weight", classes * in);
    add(b, "fc.bias", classes);
}

static void conv_b(builder_t *b, const char *prefix, size_t out, size_t in, size_t k)
{
    char n[160];
    snprintf(n, sizeof n, "%s.weight", prefix);
    conv(b, n, out, in, 1, k);
    snprintf(n, sizeof n, "%s.bias", prefix);
    add(b, n, out);
}

static void retinanet(builder_t *b)
{
    resnet_shape_t s = {1, {3, 4, 6, 3}, 1, 1, 1, "backbone.body."};
    size_t ch[4], A = 9, K = 91;
    char n[160];
    resnet(b, &s, ch);
    for (int i = 0; i < 3; i++) { /* returned layers 2, 3, 4 */
        snprintf(n, sizeof n, "backbone.fpn.inner_blocks.%d.0", i);
        conv_b(b, n, 256, ch[i + 1], 1);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(n, sizeof n, "backbone.fpn.layer_blocks.%d.0", i);
        conv_b(b, n, 256, 256, 3);
    }
    conv_b(b, "backbone.fpn.extra_blocks.p6", 256, 256, 3);
    conv_b(b, "backbone.fpn.extra_blocks.p7", 256, 256, 3);
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "head.classification_head.conv.%d.0", i);
        conv_b(b, n, 256, 256, 3);
    }
    conv_b(b, "head.classification_head.cls_logits", A * K, 256, 3);
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "head.regression_head.conv.%d.0", i);
        conv_b(b, n, 256, 256, 3);
    }
    conv_b(b, "head.regression_head.bbox_reg", A * 4, 256, 3);
}

const char *psbench_model_names(void)
{
    return "tsm-r50,tsm-r18,i3d-r50,retinanet-r50";
}

int psbench_model_build(psbench_model_t *m, const char *name)
{
    builder_t b = {m, 0, 0};
    size_t ch[4];
    memset(m, 0, sizeof *m);
    if (!strcmp(name, "tsm-r50") || !strcmp(name, "i3d-r50")) {
        int i3d = name[0] == 'i';
        resnet_shape_t s = {1, {3, 4, 6, 3}, i3d ? 5 : 1, i3d ? 3 : 1, 0, ""};
        resnet(&b, &s, ch);
        fc(&b, ch[3], 400);
    } else if (!strcmp(name, "tsm-r18")) {
        resnet_shape_t s = {0, {2, 2, 2, 2}, 1, 1, 0, ""};
        resnet(&b, &s, ch);
        fc(&b, ch[3], 400);
    } else if (!strcmp(name, "retinanet-r50")) {
        retinanet(&b);
    } else {
        ps_error("unknown model '%s' (known: %s)", name, psbench_model_names());
        return PS_EINVAL;
    }
    if (b.err) {
        ps_error("model %s: out of memory", name);
        psbench_model_free(m);
        return b.err;
    }
    return 0;
}

void psbench_model_free(psbench_model_t *m)
{
    for (unsigned i = 0; i < m->ntensors; i++) free((char *)m->tensors[i].name);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}
