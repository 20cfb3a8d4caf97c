/* Tensor layouts of ResNet-18/50 (torchvision), I3D-ResNet-50 (the video
 * model psworker trains, in its 3x1x1 and 3x3x3 variants) and
 * RetinaNet-R50-FPN (torchvision v1), in the order of named_parameters(),
 * with each layer's forward MACs per input frame at 224x224 (for the
 * emulated compute schedule). */
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

/* flops: the forward MACs this tensor's layer costs per frame (see
 * model_sizes.h) */
static void add(builder_t *b, const char *name, size_t numel, double flops)
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
        double *f = realloc(b->m->flops, cap * sizeof *f);
        if (!f) {
            b->err = PS_ENOMEM;
            return;
        }
        b->m->flops = f;
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
    b->m->flops[b->m->ntensors - 1] = flops;
    b->m->total_numel += numel;
    b->m->total_flops += flops;
}

/* conv weight [out, in, kt, k, k] (kt = 1: 2-D) with hw output pixels per
 * input frame (a layer at half the frames: half its pixels per frame) */
static void conv(builder_t *b, const char *name, size_t out, size_t in, size_t kt, size_t k,
                 double hw)
{
    size_t numel = out * in * kt * k * k;
    add(b, name, numel, (double)numel * hw);
}

/* BN over ch channels of hw pixels per input frame: a scale and a shift per
 * element (its cost is memory traffic on a GPU; counted as ops it is ~1% of
 * a ResNet) */
static void bn(builder_t *b, const char *prefix, size_t ch, int frozen, double hw)
{
    char n[160];
    if (frozen) return; /* FrozenBatchNorm2d: weight/bias are buffers */
    snprintf(n, sizeof n, "%s.weight", prefix);
    add(b, n, ch, (double)ch * hw);
    snprintf(n, sizeof n, "%s.bias", prefix);
    add(b, n, ch, (double)ch * hw);
}

typedef struct resnet_shape {
    int bottleneck;      /* 1: ResNet-50 bottleneck blocks, 0: basic blocks */
    int blocks[4];
    size_t kt_stem;      /* temporal size of conv1 */
    /* Per stage, one character per block: '1' gives that block a temporal
     * kernel of 3 (padded: the frames are kept), '0' or NULL none. */
    const char *inflate[4];
    int t_conv;          /* which conv of an inflated block has it: 1 or 2 */
    int t_pool;          /* 1: a 2x1x1 max pool (stride 2) after layer1 */
    int frozen_bn;
    const char *prefix;  /* "" or "backbone.body." */
} resnet_shape_t;

/* Temporal size of conv c (1, 2) of block k of stage L. */
static size_t block_kt(const resnet_shape_t *s, int L, int k, int c)
{
    const char *f = s->inflate[L];
    return f && (size_t)k < strlen(f) && f[k] == '1' && s->t_conv == c ? 3 : 1;
}

/* Returns the output channels of each stage in ch[4].  Output sizes at a
 * 224x224 input: conv1 (stride 2) 112^2, after the max pool 56^2, and each
 * stage after the first halves it in its first block (torchvision v1.5:
 * the stride is on the 3x3 conv, or on conv1 of a basic block, and on the
 * downsample), so layer1..4 run at 56, 28, 14, 7.  With t_pool, layer2..4
 * run at half the input's frames, so half their pixels per input frame. */
static void resnet(builder_t *b, const resnet_shape_t *s, size_t ch[4])
{
    char n[160];
    const char *p = s->prefix;
    size_t exp = s->bottleneck ? 4 : 1, inplanes = 64;
    snprintf(n, sizeof n, "%sconv1.weight", p);
    conv(b, n, 64, 3, s->kt_stem, 7, 112 * 112);
    snprintf(n, sizeof n, "%sbn1", p);
    bn(b, n, 64, s->frozen_bn, 112 * 112);
    for (int L = 0; L < 4; L++) {
        size_t planes = (size_t)64 << L, side = (size_t)(56 >> L); /* this stage's output */
        double hw = (double)(side * side) * (L > 0 && s->t_pool ? 0.5 : 1);
        for (int k = 0; k < s->blocks[L]; k++) {
            /* the first block's conv1 of a bottleneck still sees the
             * previous stage's resolution */
            double hw_in = k == 0 && L > 0 ? 4 * hw : hw;
            size_t kt1 = block_kt(s, L, k, 1), kt2 = block_kt(s, L, k, 2);
            char blk[96], cn[160];
            snprintf(blk, sizeof blk, "%slayer%d.%d", p, L + 1, k);
            if (s->bottleneck) {
                snprintf(cn, sizeof cn, "%s.conv1.weight", blk);
                conv(b, cn, planes, inplanes, kt1, 1, hw_in);
                snprintf(cn, sizeof cn, "%s.bn1", blk);
                bn(b, cn, planes, s->frozen_bn, hw_in);
                snprintf(cn, sizeof cn, "%s.conv2.weight", blk);
                conv(b, cn, planes, planes, kt2, 3, hw);
                snprintf(cn, sizeof cn, "%s.bn2", blk);
                bn(b, cn, planes, s->frozen_bn, hw);
                snprintf(cn, sizeof cn, "%s.conv3.weight", blk);
                conv(b, cn, planes * exp, planes, 1, 1, hw);
                snprintf(cn, sizeof cn, "%s.bn3", blk);
                bn(b, cn, planes * exp, s->frozen_bn, hw);
            } else {
                snprintf(cn, sizeof cn, "%s.conv1.weight", blk);
                conv(b, cn, planes, inplanes, kt1, 3, hw);
                snprintf(cn, sizeof cn, "%s.bn1", blk);
                bn(b, cn, planes, s->frozen_bn, hw);
                snprintf(cn, sizeof cn, "%s.conv2.weight", blk);
                conv(b, cn, planes, planes, kt2, 3, hw);
                snprintf(cn, sizeof cn, "%s.bn2", blk);
                bn(b, cn, planes, s->frozen_bn, hw);
            }
            /* torchvision: a projection where the stride or width changes */
            if (k == 0 && (L > 0 || inplanes != planes * exp)) {
                snprintf(cn, sizeof cn, "%s.downsample.0.weight", blk);
                conv(b, cn, planes * exp, inplanes, 1, 1, hw);
                snprintf(cn, sizeof cn, "%s.downsample.1", blk);
                bn(b, cn, planes * exp, s->frozen_bn, hw);
            }
            inplanes = planes * exp;
        }
        ch[L] = planes * exp;
    }
}

/* after the global average pool: one output pixel */
static void fc(builder_t *b, size_t in, size_t classes)
{
    add(b, "fc.weight", classes * in, (double)(classes * in));
    add(b, "fc.bias", classes, 0);
}

static void conv_b(builder_t *b, const char *prefix, size_t out, size_t in, size_t k, size_t hw)
{
    char n[160];
    snprintf(n, sizeof n, "%s.weight", prefix);
    conv(b, n, out, in, 1, k, hw);
    snprintf(n, sizeof n, "%s.bias", prefix);
    add(b, n, out, 0);
}

/* At 224x224 (like the video models; the shares change little with the
 * input size): C3..C5 and P3..P5 are 28, 14, 7 pixels wide, P6 4 and P7 2
 * (stride-2 3x3 convs, padding 1), and the heads run on all five levels. */
static void retinanet(builder_t *b)
{
    resnet_shape_t s = {.bottleneck = 1, .blocks = {3, 4, 6, 3}, .kt_stem = 1, .frozen_bn = 1,
                        .prefix = "backbone.body."};
    size_t ch[4], A = 9, K = 91, lvl[3] = {28 * 28, 14 * 14, 7 * 7};
    size_t heads = 28 * 28 + 14 * 14 + 7 * 7 + 4 * 4 + 2 * 2;
    char n[160];
    resnet(b, &s, ch);
    for (int i = 0; i < 3; i++) { /* returned layers 2, 3, 4 */
        snprintf(n, sizeof n, "backbone.fpn.inner_blocks.%d.0", i);
        conv_b(b, n, 256, ch[i + 1], 1, lvl[i]);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(n, sizeof n, "backbone.fpn.layer_blocks.%d.0", i);
        conv_b(b, n, 256, 256, 3, lvl[i]);
    }
    conv_b(b, "backbone.fpn.extra_blocks.p6", 256, 256, 3, 4 * 4);
    conv_b(b, "backbone.fpn.extra_blocks.p7", 256, 256, 3, 2 * 2);
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "head.classification_head.conv.%d.0", i);
        conv_b(b, n, 256, 256, 3, heads);
    }
    conv_b(b, "head.classification_head.cls_logits", A * K, 256, 3, heads);
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "head.regression_head.conv.%d.0", i);
        conv_b(b, n, 256, 256, 3, heads);
    }
    conv_b(b, "head.regression_head.bbox_reg", A * 4, 256, 3, heads);
}

const char *psbench_model_names(void)
{
    return "tsm-r50,tsm-r18,i3d-r50-311,i3d-r50-333,retinanet-r50";
}

/* I3D-ResNet-50 as psworker trains it (worker/models/video3d_arch.c; the
 * Non-local networks' I3D): conv1 5x7x7, a 2x1x1 temporal max pool after
 * layer1, and a temporal kernel of 3 in the blocks flagged below
 * (tests/golden/gen_video3d.py's I3D_INFLATE), on the 3x3 conv (t_conv 2,
 * "333") or on the first 1x1 conv (t_conv 1, "311"); trainable BN and a
 * 400-class fc. */
static void i3d(builder_t *b, int t_conv)
{
    resnet_shape_t s = {.bottleneck = 1, .blocks = {3, 4, 6, 3}, .kt_stem = 5,
                        .inflate = {"111", "1010", "101010", "010"}, .t_conv = t_conv,
                        .t_pool = 1, .prefix = ""};
    size_t ch[4];
    resnet(b, &s, ch);
    fc(b, ch[3], 400);
}

int psbench_model_build(psbench_model_t *m, const char *name)
{
    builder_t b = {m, 0, 0};
    size_t ch[4];
    memset(m, 0, sizeof *m);
    if (!strcmp(name, "tsm-r50")) {
        resnet_shape_t s = {.bottleneck = 1, .blocks = {3, 4, 6, 3}, .kt_stem = 1, .prefix = ""};
        resnet(&b, &s, ch);
        fc(&b, ch[3], 400);
    } else if (!strcmp(name, "tsm-r18")) {
        resnet_shape_t s = {.bottleneck = 0, .blocks = {2, 2, 2, 2}, .kt_stem = 1, .prefix = ""};
        resnet(&b, &s, ch);
        fc(&b, ch[3], 400);
    } else if (!strcmp(name, "i3d-r50-311")) {
        i3d(&b, 1);
    } else if (!strcmp(name, "i3d-r50-333")) {
        i3d(&b, 2);
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
    free(m->flops);
    memset(m, 0, sizeof *m);
}

int psbench_model_part_flops(const psbench_model_t *m, const ps_partition_table_t *t,
                             double *out)
{
    if (t->ntensors != m->ntensors || t->total_numel != m->total_numel) {
        ps_error("partition table (%u tensors, %zu floats) is not this model's layout "
                 "(%u tensors, %zu floats)", t->ntensors, t->total_numel, m->ntensors,
                 m->total_numel);
        return PS_EINVAL;
    }
    uint32_t cap = 64;
    ps_partition_segment_t *seg = malloc(cap * sizeof *seg);
    if (!seg) return PS_ENOMEM;
    for (uint32_t p = 0; p < t->nparts; p++) {
        uint32_t n = ps_partition_segments(t, p, seg, cap);
        if (n > cap) { /* a partition of many small tensors: grow and redo */
            ps_partition_segment_t *g = realloc(seg, n * sizeof *seg);
            if (!g) {
                free(seg);
                return PS_ENOMEM;
            }
            seg = g;
            cap = n;
            n = ps_partition_segments(t, p, seg, cap);
        }
        out[p] = 0;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t k = seg[i].tensor;
            out[p] += m->flops[k] * (double)seg[i].numel / (double)m->tensors[k].numel;
        }
    }
    free(seg);
    return 0;
}

int psbench_model_schedule(const char *name, int by_params, double compute_s,
                           const ps_partition_table_t *t, double *fwd)
{
    double total = 0;
    int rc;
    if (name && !by_params) {
        psbench_model_t m;
        if ((rc = psbench_model_build(&m, name)) < 0) return rc;
        rc = psbench_model_part_flops(&m, t, fwd);
        psbench_model_free(&m);
        if (rc < 0) return rc;
    } else {
        for (uint32_t p = 0; p < t->nparts; p++) fwd[p] = (double)t->parts[p].numel;
    }
    for (uint32_t p = 0; p < t->nparts; p++) total += fwd[p];
    for (uint32_t p = 0; p < t->nparts; p++) fwd[p] = total > 0 ? compute_s / 3 * fwd[p] / total : 0;
    return 0;
}
