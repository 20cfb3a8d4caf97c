/* RetinaNet-FPN as an ONNX graph (ps_retina_export_onnx): the ResNet trunk
 * (onnx_resnet.c, names under backbone.body.), the FPN's top-down path and
 * P6 / P7, and the two heads on every level, their rows in torchvision's
 * order (ps_retinanet.h).  What ps_retina_forward computes without
 * targets; anchors, decoding and NMS stay outside the graph. */
#include "retinanet_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "worker/models/onnx_graph.h"

#include <stdio.h>
#include <string.h>

static const char *rconv(ps_onnx_t *g, const ps_retina_t *m, const rconv_t *c, const char *name,
                         const char *x)
{
    const ps_model_param_t *w = &m->params[c->pw], *b = &m->params[c->pb];
    /* a head's weights serve every level: one initializer, added once */
    const char *wn = ps_onnx_weight(g, w->name, w->ndim, w->shape, w->w);
    const char *bn = ps_onnx_weight(g, b->name, b->ndim, b->shape, b->w);
    return ps_onnx_conv(g, name, x, wn, bn, &c->d);
}

/* The conv's name: its weight's without ".weight", plus a suffix. */
static const char *cname(char *buf, size_t len, const ps_retina_t *m, const rconv_t *c,
                         const char *suffix)
{
    const char *w = m->params[c->pw].name;
    snprintf(buf, len, "%.*s%s", (int)(strlen(w) - 7), w, suffix);
    return buf;
}

/* A head conv on level l (suffix ".p3" ...): the first level adds the
 * shared weights, the others name them. */
static const char *head_conv(ps_onnx_t *g, const ps_retina_t *m, const rconv_t *c, int l,
                             const char *lv, const char *x)
{
    char n[256];
    cname(n, sizeof n, m, c, lv);
    if (!l) return rconv(g, m, c, n, x);
    return ps_onnx_conv(g, n, x, m->params[c->pw].name, m->params[c->pb].name, &c->d);
}

/* One subnet on level l: 4 x (conv3x3, ReLU), the output conv, then the
 * rows (N, H*W*nA, D) (head_permute_forward). */
static const char *head(ps_onnx_t *g, const ps_retina_t *m, const rconv_t *convs,
                        const rconv_t *out, int D, int l, const char *x)
{
    char n[256], lv[16], sfx[32];
    int h = m->lh[l], w = m->lw[l], nA = PS_RETINA_ANCHORS;
    snprintf(lv, sizeof lv, ".p%d", l + 3);
    for (int j = 0; j < 4; j++) {
        x = head_conv(g, m, &convs[j], l, lv, x);
        snprintf(sfx, sizeof sfx, "%s.relu", lv);
        x = ps_onnx_relu(g, cname(n, sizeof n, m, &convs[j], sfx), x);
    }
    x = head_conv(g, m, out, l, lv, x);
    int64_t view[5] = {-1, nA, D, h, w}, perm[5] = {0, 3, 4, 1, 2};
    int64_t rows[3] = {-1, (int64_t)h * w * nA, D};
    snprintf(sfx, sizeof sfx, "%s.view", lv);
    x = ps_onnx_reshape(g, cname(n, sizeof n, m, out, sfx), x, 5, view);
    snprintf(sfx, sizeof sfx, "%s.perm", lv);
    x = ps_onnx_transpose(g, cname(n, sizeof n, m, out, sfx), x, 5, perm);
    snprintf(sfx, sizeof sfx, "%s.rows", lv);
    return ps_onnx_reshape(g, cname(n, sizeof n, m, out, sfx), x, 3, rows);
}

int ps_retina_export_onnx(const ps_retina_t *m, const char *path)
{
    const ps_retina_config_t *c = &m->cfg;
    ps_onnx_t *g = NULL;
    char arch[64], n[256];
    snprintf(arch, sizeof arch, "retinanet-resnet%d-fpn", c->depth);
    int rc = ps_onnx_new(&g, arch);
    if (rc) return rc;
    int K = c->num_classes;
    int64_t in_dims[4] = {0, 3, m->H, m->W}, cls_dims[3] = {0, m->A, K}, box_dims[3] = {0, m->A, 4};
    const char *batch[3] = {"batch"};
    const char *x = ps_onnx_input(g, "images", 4, in_dims, batch);
    const char *stage[4] = {NULL, NULL, NULL, NULL};
    ps_resnet_onnx_trunk(g, m->body, "backbone.body.", x, stage);
    const char *C[3] = {stage[1], stage[2], stage[3]}, *inner[3], *P[PS_RETINA_LEVELS];
    /* FPN top-down (torchvision FeaturePyramidNetwork) */
    inner[2] = rconv(g, m, &m->inner[2], cname(n, sizeof n, m, &m->inner[2], ""), C[2]);
    P[2] = rconv(g, m, &m->layer[2], cname(n, sizeof n, m, &m->layer[2], ""), inner[2]);
    for (int i = 1; i >= 0; i--) {
        const char *lat = rconv(g, m, &m->inner[i], cname(n, sizeof n, m, &m->inner[i], ""), C[i]);
        inner[i] = ps_onnx_upsample_add(g, cname(n, sizeof n, m, &m->inner[i], ".merged"), lat,
                                        inner[i + 1]);
        P[i] = rconv(g, m, &m->layer[i], cname(n, sizeof n, m, &m->layer[i], ""), inner[i]);
    }
    /* LastLevelP6P7: P6 on C5 (or P5), P7 = conv(relu(P6)) */
    P[3] = rconv(g, m, &m->p6, cname(n, sizeof n, m, &m->p6, ""), c->p6_from_p5 ? P[2] : C[2]);
    const char *p6r = ps_onnx_relu(g, cname(n, sizeof n, m, &m->p6, ".relu"), P[3]);
    P[4] = rconv(g, m, &m->p7, cname(n, sizeof n, m, &m->p7, ""), p6r);
    const char *cls[PS_RETINA_LEVELS], *box[PS_RETINA_LEVELS];
    for (int l = 0; l < PS_RETINA_LEVELS; l++) {
        cls[l] = head(g, m, m->cls, &m->cls_logits, K, l, P[l]);
        box[l] = head(g, m, m->box, &m->bbox_reg, 4, l, P[l]);
    }
    const char *co = ps_onnx_concat(g, "cls_logits", PS_RETINA_LEVELS, cls, 1);
    const char *bo = ps_onnx_concat(g, "bbox_regression", PS_RETINA_LEVELS, box, 1);
    ps_onnx_output(g, co, 3, cls_dims, batch);
    ps_onnx_output(g, bo, 3, box_dims, batch);
    ps_onnx_meta(g, "ps.arch", arch);
    snprintf(n, sizeof n, "%d", K);
    ps_onnx_meta(g, "ps.num_classes", n);
    snprintf(n, sizeof n, "%d", m->H);
    ps_onnx_meta(g, "ps.input_size", n);
    ps_onnx_meta(g, "ps.outputs", "cls_logits (batch, A, K) before the sigmoid; bbox_regression "
                 "(batch, A, 4) deltas to decode against the anchors (torchvision's row order: "
                 "level P3..P7, location row-major, 9 anchors)");
    rc = ps_onnx_save(g, path);
    ps_onnx_destroy(&g);
    return rc;
}
