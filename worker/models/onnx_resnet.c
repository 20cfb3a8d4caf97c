/* TSM / TSN ResNets as ONNX graphs (ps_model_export_onnx), and the ResNet
 * trunk that RetinaNet's graph starts with (ps_resnet_onnx_trunk).  The
 * graph computes what ps_model_forward computes in evaluation mode: BN
 * with running statistics, no dropout, fc on every frame, the mean over
 * the T segments. */
#include "resnet_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "worker/models/onnx_graph.h"

#include <stdio.h>
#include <string.h>

/* "<prefix><tensor name>" */
static const char *full(char *buf, size_t len, const char *prefix, const char *name)
{
    snprintf(buf, len, "%s%s", prefix, name);
    return buf;
}

static const char *param(ps_onnx_t *g, const ps_model_t *m, const char *prefix, int i)
{
    char n[256];
    const ps_model_param_t *p = &m->params[i];
    return ps_onnx_weight(g, full(n, sizeof n, prefix, p->name), p->ndim, p->shape, p->w);
}

static const char *buffer(ps_onnx_t *g, const ps_model_t *m, const char *prefix, int i)
{
    char n[256];
    const ps_model_buffer_t *b = &m->buffers[i];
    int len = (int)b->numel;
    return ps_onnx_weight(g, full(n, sizeof n, prefix, b->name), 1, &len, b->f32);
}

/* The layer's name: its weight's without ".weight" */
static const char *layer_name(char *buf, size_t len, const char *prefix, const ps_model_t *m,
                              int pw)
{
    const char *w = m->params[pw].name;
    size_t l = strlen(w);
    snprintf(buf, len, "%s%.*s", prefix, (int)(l > 7 ? l - 7 : l), w);
    return buf;
}

static const char *conv(ps_onnx_t *g, const ps_model_t *m, const char *prefix, const conv_t *c,
                        const char *x)
{
    char n[256];
    const char *w = param(g, m, prefix, c->pw);
    return ps_onnx_conv(g, layer_name(n, sizeof n, prefix, m, c->pw), x, w, NULL, &c->d);
}

static const char *bn(ps_onnx_t *g, const ps_model_t *m, const char *prefix, const bn_t *b,
                      const char *x)
{
    char n[256];
    const char *s = param(g, m, prefix, b->pg), *bi = param(g, m, prefix, b->pb);
    const char *mu = buffer(g, m, prefix, b->brm), *var = buffer(g, m, prefix, b->brv);
    return ps_onnx_batchnorm(g, layer_name(n, sizeof n, prefix, m, b->pg), x, s, bi, mu, var,
                             m->cfg.bn_eps);
}

static const char *relu(ps_onnx_t *g, const char *name, const char *suffix, const char *x)
{
    char n[256];
    snprintf(n, sizeof n, "%s%s", name, suffix);
    return ps_onnx_relu(g, n, x);
}

/* One residual block (block_fwd in resnet.c); its output value is named
 * after the block ("layer1.0"). */
static const char *block(ps_onnx_t *g, const ps_model_t *m, const char *prefix, int bi,
                         const char *x)
{
    const block_t *b = &m->blocks[bi];
    char name[256], n[256];
    /* "layer3.1" from "layer3.1.conv1" */
    layer_name(name, sizeof name, prefix, m, b->conv[0].pw);
    name[strlen(name) - 6] = 0;
    const char *in = x, *id = x;
    if (b->shift) {
        in = ps_onnx_tshift(g, full(n, sizeof n, name, ".shift"), x, m->cfg.n_segment, b->cin,
                            b->H, b->W, m->cfg.shift_div);
        if (b->shift == SHIFT_BLOCK) id = in;
    }
    for (int j = 0; j < b->nconv; j++) {
        in = bn(g, m, prefix, &b->bn[j], conv(g, m, prefix, &b->conv[j], in));
        if (j < b->nconv - 1) {
            char s[16];
            snprintf(s, sizeof s, ".relu%d", j + 1);
            in = relu(g, name, s, in);
        }
    }
    if (b->has_ds) id = bn(g, m, prefix, &b->dsbn, conv(g, m, prefix, &b->ds, id));
    return ps_onnx_relu(g, name, ps_onnx_add(g, full(n, sizeof n, name, ".add"), in, id));
}

const char *ps_resnet_onnx_trunk(ps_onnx_t *g, const ps_model_t *m, const char *prefix,
                                 const char *x, const char *stage_out[4])
{
    char n[256];
    x = bn(g, m, prefix, &m->bn1, conv(g, m, prefix, &m->conv1, x));
    x = ps_onnx_relu(g, full(n, sizeof n, prefix, "relu"), x);
    x = ps_onnx_maxpool(g, full(n, sizeof n, prefix, "maxpool"), x, &m->pool);
    for (int bi = 0, s = 0; bi < m->nblocks; bi++) {
        x = block(g, m, prefix, bi, x);
        if (s < 4 && bi == m->stage_end[s] && stage_out) stage_out[s++] = x;
    }
    return x;
}

static int meta_int(ps_onnx_t *g, const char *key, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    return ps_onnx_meta(g, key, buf);
}

int ps_model_export_onnx(const ps_model_t *m, const char *path)
{
    if (m->features_only) {
        ps_error("onnx export %s: a detector backbone exports with its detector", path);
        return PS_EINVAL;
    }
    const ps_model_config_t *c = &m->cfg;
    ps_onnx_t *g = NULL;
    char arch[64];
    snprintf(arch, sizeof arch, "%s-resnet%d", c->shift ? "tsm" : "tsn", c->depth);
    int rc = ps_onnx_new(&g, arch);
    if (rc) return rc;
    int T = c->n_segment, K = c->num_classes;
    /* clips (batch, T, 3, H, W), ImageNet-normalised RGB, as psworker's loader */
    int64_t in_dims[5] = {0, T, 3, m->H, m->W}, frames[4] = {-1, 3, m->H, m->W};
    int64_t seg[3] = {-1, T, K}, out_dims[2] = {0, K};
    const char *batch[5] = {"batch"};
    const char *x = ps_onnx_input(g, "clips", 5, in_dims, batch);
    x = ps_onnx_reshape(g, "frames", x, 4, frames);
    x = ps_resnet_onnx_trunk(g, m, "", x, NULL);
    x = ps_onnx_avgpool_flat(g, "avgpool", x);
    x = ps_onnx_linear(g, "fc", x, param(g, m, "", m->fc_pw), param(g, m, "", m->fc_pb));
    /* segment consensus: the mean of the T frames' logits */
    x = ps_onnx_reshape(g, "fc.segments", x, 3, seg);
    x = ps_onnx_mean(g, "logits", x, 1, 0);
    ps_onnx_output(g, x, 2, out_dims, batch);
    static const char *const places[] = {"blockres", "block"};
    ps_onnx_meta(g, "ps.arch", arch);
    meta_int(g, "ps.n_segment", T);
    meta_int(g, "ps.num_classes", K);
    meta_int(g, "ps.input_size", m->H);
    if (c->shift) {
        meta_int(g, "ps.shift_div", c->shift_div);
        ps_onnx_meta(g, "ps.shift_place", places[c->shift_place]);
    }
    ps_onnx_meta(g, "ps.input", "clips: (batch, T, 3, H, W) RGB / 255, minus mean (0.485, 0.456, "
                 "0.406), over std (0.229, 0.224, 0.225)");
    rc = ps_onnx_save(g, path);
    ps_onnx_destroy(&g);
    return rc;
}
