/* psctl export --onnx: the weights pulled from the servers as an ONNX file.
 * The servers hold tensors by name and size only (the INIT spec), so the
 * architecture comes from --model (and --frames, --size, --shift-place,
 * --shift-div), and the rest from the pulled sizes: the stem width from
 * conv1.weight, the class count from the classifier's bias, a detector's
 * FPN width from its first lateral's bias.  The model is built on the CPU,
 * --like's file (when given) loaded into it, then every tensor the servers
 * hold written over it; a tensor neither has (the BN statistics of frozen
 * BNs, which never travel) is an error naming it and --like. */
#include "worker/tools/psctl_onnx.h"

#include "ps_error.h"
#include "ps_log.h"
#include "worker/models/ps_model.h"
#include "worker/models/ps_retinanet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pulled values of tensor `name` and their count, or NULL. */
static const float *pulled(const ps_partition_table_t *t, const float *w, const char *name,
                           size_t *numel)
{
    int i = ps_partition_tensor_index(t, name);
    if (i < 0) return NULL;
    *numel = t->tensors[i].numel;
    return w + t->tensor_offset[i];
}

/* Its element count on the servers (0: not there). */
static size_t pulled_numel(const ps_partition_table_t *t, const char *name)
{
    int i = ps_partition_tensor_index(t, name);
    return i < 0 ? 0 : t->tensors[i].numel;
}

/* Every parameter and float buffer of the tables from the servers, else
 * (have_like) as --like left it, else an error naming the tensor. */
static int fill(ps_model_param_t *P, int np, ps_model_buffer_t *B, int nb,
                const ps_partition_table_t *t, const float *w, int have_like)
{
    int from_servers = 0, from_like = 0;
    for (int i = 0; i < np + nb; i++) {
        const char *name = i < np ? P[i].name : B[i - np].name;
        float *dst = i < np ? P[i].w : B[i - np].f32;
        size_t want = i < np ? P[i].numel : B[i - np].numel, n = 0;
        if (!dst) continue; /* num_batches_tracked: not in an inference graph */
        const float *src = pulled(t, w, name, &n);
        if (src && n != want) {
            fprintf(stderr, "psctl: export --onnx: %s has %zu elements on the servers, the "
                    "model needs %zu (another --model / --size?)\n", name, n, want);
            return PS_EMISMATCH;
        }
        if (src) {
            memcpy(dst, src, want * sizeof(float));
            from_servers++;
        } else if (have_like) {
            from_like++;
        } else {
            fprintf(stderr, "psctl: export --onnx: %s is not on the servers (BN statistics that "
                    "do not train never travel): give --like FILE with the full model, e.g. "
                    "psworker's model.safetensors or the --weights it started from\n", name);
            return PS_ENOTFOUND;
        }
    }
    printf("onnx: %d tensors from the servers, %d from --like\n", from_servers, from_like);
    return 0;
}

static int video(const psctl_onnx_opts_t *o, const ps_partition_table_t *t, const float *w,
                 const char *path, ps_ctx_t *ctx)
{
    ps_model_config_t c;
    ps_model_config_default(&c);
    ps_model_parse_name(o->model, &c.depth, &c.shift);
    size_t stem = pulled_numel(t, "conv1.weight"), K = pulled_numel(t, "fc.bias");
    if (!stem || stem % (3 * 7 * 7) || K < 2) {
        fprintf(stderr, "psctl: export --onnx: the servers hold no conv1.weight / fc.bias of a "
                "ResNet classifier (is --model %s right?)\n", o->model);
        return PS_EMISMATCH;
    }
    c.width = (int)(stem / (3 * 7 * 7));
    c.num_classes = (int)K;
    c.n_segment = o->frames;
    c.shift_div = o->shift_div;
    c.shift_place = !strcmp(o->shift_place, "block") ? PS_MODEL_SHIFT_BLOCK
                                                      : PS_MODEL_SHIFT_BLOCKRES;
    c.partial_bn = 0;
    ps_model_t *m = NULL;
    int rc = ps_model_create(&m, &c, &ps_backend_cpu, ctx, 1, o->size, o->size);
    if (!rc && o->like && *o->like)
        rc = ps_model_load(m, o->like, PS_MODEL_LOAD_STRICT);
    int np, nb;
    if (!rc) {
        ps_model_param_t *P = (ps_model_param_t *)ps_model_params(m, &np);
        ps_model_buffer_t *B = (ps_model_buffer_t *)ps_model_buffers(m, &nb);
        rc = fill(P, np, B, nb, t, w, o->like && *o->like);
    }
    if (!rc) rc = ps_model_export_onnx(m, path);
    ps_model_destroy(&m);
    return rc;
}

static int detector(const psctl_onnx_opts_t *o, const ps_partition_table_t *t, const float *w,
                    const char *path, ps_ctx_t *ctx)
{
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    char *end;
    long depth = strtol(o->model + 11, &end, 10);
    size_t stem = pulled_numel(t, "backbone.body.conv1.weight");
    size_t F = pulled_numel(t, "backbone.fpn.inner_blocks.0.0.bias");
    size_t cls = pulled_numel(t, "head.classification_head.cls_logits.bias");
    if (*end || (depth != 18 && depth != 34 && depth != 50) || !stem || stem % (3 * 7 * 7) || !F ||
        !cls || cls % PS_RETINA_ANCHORS) {
        fprintf(stderr, "psctl: export --onnx: --model %s: want retinanet-r18|34|50 and the "
                "servers to hold a RetinaNet's conv1, FPN and heads\n", o->model);
        return PS_EMISMATCH;
    }
    c.depth = (int)depth;
    c.width = (int)(stem / (3 * 7 * 7));
    c.fpn_channels = (int)F;
    c.num_classes = (int)(cls / PS_RETINA_ANCHORS);
    ps_retina_t *m = NULL;
    int rc = ps_retina_create(&m, &c, &ps_backend_cpu, ctx, 1, o->size, o->size);
    if (!rc && o->like && *o->like) rc = ps_retina_load(m, o->like);
    int np, nb;
    if (!rc) {
        ps_model_param_t *P = (ps_model_param_t *)ps_retina_params(m, &np);
        ps_model_buffer_t *B = (ps_model_buffer_t *)ps_retina_buffers(m, &nb);
        rc = fill(P, np, B, nb, t, w, o->like && *o->like);
    }
    if (!rc) rc = ps_retina_export_onnx(m, path);
    ps_retina_destroy(&m);
    return rc;
}

int psctl_onnx_export(const psctl_onnx_opts_t *o, const ps_partition_table_t *t, const float *w,
                      const char *path)
{
    int d, s, det = !strncmp(o->model, "retinanet-r", 11);
    if (!det && ps_model_parse_name(o->model, &d, &s)) {
        fprintf(stderr, "psctl: export --onnx needs --model tsm-r18|34|50, tsn-r18|34|50 or "
                "retinanet-r18|34|50 (got \"%s\")\n", o->model);
        return PS_EINVAL;
    }
    if (o->frames < 1 || o->frames > 256 || o->size < 32 || o->size > 4096 || o->shift_div < 2 ||
        (strcmp(o->shift_place, "blockres") && strcmp(o->shift_place, "block"))) {
        fprintf(stderr, "psctl: export --onnx: --frames 1..256, --size 32..4096, --shift-div >= 2, "
                "--shift-place blockres|block\n");
        return PS_EINVAL;
    }
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 1);
    int rc = det ? detector(o, t, w, path, &ctx) : video(o, t, w, path, &ctx);
    ps_ctx_free(&ctx);
    if (!rc) printf("exported %s as ONNX to %s\n", o->model, path);
    return rc;
}
