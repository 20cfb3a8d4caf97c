/* The RetinaNet row of the detection task (task_det.h): ps_retina_t behind
 * the row's entries; inference post-processing by ps_det_postprocess
 * (sigmoid, score > --score-thresh, top 1000 per level, class-wise NMS 0.5,
 * 100 per image). */
#include "worker/det/det_boxes.h"
#include "worker/models/ps_retinanet.h"
#include "worker/psworker/task_det.h"

static int r_max_gt(const det_opts_t *o) { return 0; }

static int r_create(void **m, const det_build_t *b, const ps_backend_t *be, ps_ctx_t *ctx)
{
    ps_retina_config_t cfg;
    ps_retina_config_default(&cfg);
    cfg.depth = b->depth;
    cfg.num_classes = b->num_classes;
    cfg.width = b->width;
    cfg.fpn_channels = b->o->fpn_channels;
    cfg.freeze_at = b->o->freeze_at;
    cfg.bn_mode = b->bn_mode;
    cfg.recompute = b->recompute;
    return ps_retina_create((ps_retina_t **)m, &cfg, be, ctx, b->max_n, b->size, b->size);
}

static void r_destroy(void **m) { ps_retina_destroy((ps_retina_t **)m); }
static void r_init(void *m, uint64_t seed) { ps_retina_init(m, seed, 0); }
static int r_load(void *m, const char *path, int partial)
{
    return ps_retina_load_weights(m, path, partial);
}
static int r_onnx(const void *m, const char *path) { return ps_retina_export_onnx(m, path); }
static int r_save(const void *m, const char *path) { return ps_retina_save(m, path); }
static const ps_model_param_t *r_params(const void *m, int *n) { return ps_retina_params(m, n); }
static const ps_model_buffer_t *r_buffers(const void *m, int *n)
{
    return ps_retina_buffers(m, n);
}
static int r_find(const void *m, const char *name) { return ps_retina_find_param(m, name); }
static void r_hookable(void *m, ps_model_hookable_t *h) { ps_retina_hookable(m, h); }
static int r_specs(const void *m, ps_tensor_spec_t **s) { return ps_retina_tensor_specs(m, s); }
static int r_groups(const void *m, ps_param_group_t *g, int max)
{
    return ps_retina_groups(m, g, max);
}
static void r_zero_grad(void *m) { ps_retina_zero_grad(m); }
static int r_num_anchors(const void *m) { return ps_retina_num_anchors(m); }
static const float *r_anchors(const void *m) { return ps_retina_anchors(m); }

static int r_train(void *m, const ps_det_batch_t *b, int n, uint64_t seed, float *loss)
{
    float lc = 0, lb = 0;
    int rc = ps_retina_forward(m, b->img, n, b->labels, b->box_targets, 1, &lc, &lb);
    if (!rc) rc = ps_retina_backward(m);
    *loss = lc + lb;
    return rc;
}

static int r_infer(void *m, const ps_det_batch_t *b, int n)
{
    return ps_retina_forward(m, b->img, n, NULL, NULL, 0, NULL, NULL);
}

static int r_detect(void *m, int i, const ps_det_geom_t *g, float score_thresh, float *boxes,
                    float *scores, int32_t *classes)
{
    const float *lg[PS_RETINA_LEVELS], *dl[PS_RETINA_LEVELS], *an[PS_RETINA_LEVELS];
    int An[PS_RETINA_LEVELS], A = ps_retina_num_anchors(m);
    int K = ps_retina_config(m)->num_classes;
    const float *L = ps_retina_cls_out(m), *B = ps_retina_box_out(m);
    for (int l = 0; l < PS_RETINA_LEVELS; l++) {
        int H, W, off;
        ps_retina_level(m, l, &H, &W, NULL, &off);
        lg[l] = L + ((size_t)i * A + off) * K;
        dl[l] = B + ((size_t)i * A + off) * 4;
        an[l] = ps_retina_anchors(m) + (size_t)off * 4;
        An[l] = H * W * PS_RETINA_ANCHORS;
    }
    ps_det_post_params_t pp;
    ps_det_post_defaults(&pp);
    pp.score_thresh = score_thresh;
    pp.max_det = DET_MAX_DETECTIONS;
    return ps_det_postprocess(boxes, scores, classes, lg, dl, an, An, PS_RETINA_LEVELS, K, g->h,
                              g->w, &pp);
}

const det_kind_t det_kind_retina = {
    .prefix = "retinanet-r",
    .name = "RetinaNet",
    .fg_iou = 0.5f,
    .bg_iou = 0.4f,
    .classes_tensor = "head.classification_head.cls_logits.bias",
    .classes_per = PS_RETINA_ANCHORS,
    .classes_extra = 0,
    .max_gt = r_max_gt,
    .create = r_create,
    .destroy = r_destroy,
    .init = r_init,
    .load = r_load,
    .save = r_save,
    .params = r_params,
    .buffers = r_buffers,
    .find_param = r_find,
    .hookable = r_hookable,
    .tensor_specs = r_specs,
    .groups = r_groups,
    .zero_grad = r_zero_grad,
    .num_anchors = r_num_anchors,
    .anchors = r_anchors,
    .train = r_train,
    .infer = r_infer,
    .detect = r_detect,
    .export_onnx = r_onnx,
};
