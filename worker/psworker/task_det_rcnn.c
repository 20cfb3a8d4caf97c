/* The Faster, Mask and Cascade R-CNN rows of the detection task
 * (task_det.h): ps_rcnn_t behind the rows' entries (Cascade: three box
 * stages; Mask R-CNN: its mask branch on, the loader's masks in training,
 * each detection's mask pasted into the original image and RLE-encoded at
 * evaluation, as torchvision's paste_masks_in_image and its COCO
 * evaluation's masks > 0.5).  The loader matches the RPN's anchors at 0.7
 * / 0.3 and carries each image's boxes for the box head's sampling; the image
 * sizes (the resized image inside the padding) clip the proposals and the
 * detections, as torchvision's image_sizes do.
 *
 * RPN proposal counts: --rpn-{pre,post}-nms-{train,test}, 0 = torchvision's
 * fasterrcnn_resnet50_fpn values (2000 / 2000 training, 1000 / 1000 test,
 * for ~800-pixel images) scaled by min(1, --size / 800) and kept >= 100 /
 * 50: 320 / 320 and 160 / 160 at 128 pixels. */
#include <math.h>
#include <stdlib.h>

#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/det/det_masks.h"
#include "worker/models/ps_rcnn.h"
#include "worker/psworker/task_det.h"

typedef struct rc {
    ps_rcnn_t *m;
    int32_t *hw;  /* (max_n, 2) the images' sizes of the current batch */
} rc_t;

static int rc_max_gt(const det_opts_t *o) { return o->max_gt; }

/* flag value, or torchvision's scaled to the input size */
static int scaled(int flag, int tv, int floor_, int size)
{
    if (flag > 0) return flag;
    double f = size < 800 ? size / 800.0 : 1.0;
    int v = (int)lround(tv * f);
    return v > floor_ ? v : floor_;
}

static int create(void **out, const det_build_t *b, const ps_backend_t *be, ps_ctx_t *ctx,
                  int mask, int stages)
{
    const det_opts_t *o = b->o;
    ps_rcnn_config_t c;
    ps_rcnn_config_default(&c);
    c.mask = mask;
    c.stages = stages;
    c.mask_dim = o->mask_head_dim;
    c.depth = b->depth;
    c.num_classes = b->num_classes;
    c.width = b->width;
    c.fpn_channels = o->fpn_channels;
    c.freeze_at = o->freeze_at;
    c.bn_mode = b->bn_mode;
    c.recompute = b->recompute;
    c.rpn_train.pre_nms_top_n = scaled(o->rpn_pre_train, 2000, 100, b->size);
    c.rpn_train.post_nms_top_n = scaled(o->rpn_post_train, 2000, 100, b->size);
    c.rpn_test.pre_nms_top_n = scaled(o->rpn_pre_test, 1000, 50, b->size);
    c.rpn_test.post_nms_top_n = scaled(o->rpn_post_test, 1000, 50, b->size);
    c.roi.batch = o->box_batch;
    c.representation = o->box_head_dim;
    c.max_gt = o->max_gt;
    c.post.score_thresh = o->score_thresh;
    c.post.max_det = DET_MAX_DETECTIONS;
    rc_t *r = calloc(1, sizeof *r);
    if (!r || !(r->hw = malloc(sizeof(int32_t) * 2 * (size_t)b->max_n))) {
        free(r);
        return PS_ENOMEM;
    }
    int rc = ps_rcnn_create(&r->m, &c, be, ctx, b->max_n, b->size, b->size);
    if (rc) {
        free(r->hw);
        free(r);
        return rc;
    }
    ps_info("%s R-CNN: RPN pre / post NMS %d / %d training, %d / %d test, %d RoIs per "
            "image, box head %d, at most %d boxes per image%s",
            mask ? "Mask" : stages > 1 ? "Cascade" : "Faster",
            c.rpn_train.pre_nms_top_n, c.rpn_train.post_nms_top_n, c.rpn_test.pre_nms_top_n,
            c.rpn_test.post_nms_top_n, c.roi.batch, c.representation, c.max_gt,
            mask ? ", mask head" : "");
    if (mask) ps_info("Mask R-CNN: mask head %d channels, %d x %d masks", c.mask_dim,
                      2 * c.mask_roi_size, 2 * c.mask_roi_size);
    *out = r;
    return 0;
}

static int rc_create(void **out, const det_build_t *b, const ps_backend_t *be, ps_ctx_t *ctx)
{
    return create(out, b, be, ctx, 0, 1);
}

static int mrc_create(void **out, const det_build_t *b, const ps_backend_t *be, ps_ctx_t *ctx)
{
    return create(out, b, be, ctx, 1, 1);
}

static int crc_create(void **out, const det_build_t *b, const ps_backend_t *be, ps_ctx_t *ctx)
{
    return create(out, b, be, ctx, 0, PS_RCNN_MAX_STAGES);
}

static void rc_destroy(void **m)
{
    rc_t *r = *m;
    if (!r) return;
    ps_rcnn_destroy(&r->m);
    free(r->hw);
    free(r);
    *m = NULL;
}

#define M(x) (((const rc_t *)(x))->m)
static void rc_init(void *m, uint64_t seed) { ps_rcnn_init(M(m), seed, 0); }
static int rc_load(void *m, const char *path, int partial)
{
    return ps_rcnn_load_weights(M(m), path, partial);
}
static int rc_save(const void *m, const char *path) { return ps_rcnn_save(M(m), path); }
static const ps_model_param_t *rc_params(const void *m, int *n) { return ps_rcnn_params(M(m), n); }
static const ps_model_buffer_t *rc_buffers(const void *m, int *n)
{
    return ps_rcnn_buffers(M(m), n);
}
static int rc_find(const void *m, const char *name) { return ps_rcnn_find_param(M(m), name); }
static void rc_hookable(void *m, ps_model_hookable_t *h) { ps_rcnn_hookable(M(m), h); }
static int rc_specs(const void *m, ps_tensor_spec_t **s) { return ps_rcnn_tensor_specs(M(m), s); }
static int rc_groups(const void *m, ps_param_group_t *g, int max)
{
    return ps_rcnn_groups(M(m), g, max);
}
static void rc_zero_grad(void *m) { ps_rcnn_zero_grad(M(m)); }
static int rc_num_anchors(const void *m) { return ps_rcnn_num_anchors(M(m)); }
static const float *rc_anchors(const void *m) { return ps_rcnn_anchors(M(m)); }

static ps_rcnn_input_t input_of(rc_t *r, const ps_det_batch_t *b, int n)
{
    for (int i = 0; i < n; i++) {
        r->hw[2 * i] = b->geom[i].h;
        r->hw[2 * i + 1] = b->geom[i].w;
    }
    return (ps_rcnn_input_t){.images = b->img, .n = n, .image_hw = r->hw};
}

static int rc_train(void *m, const ps_det_batch_t *b, int n, uint64_t seed, float *loss)
{
    rc_t *r = m;
    ps_rcnn_input_t in = input_of(r, b, n);
    in.rpn_labels = b->labels;
    in.rpn_targets = b->box_targets;
    in.gt_boxes = b->gt_boxes;
    in.gt_classes = b->gt_classes;
    in.ngt = b->gt_count;
    in.gt_stride = b->max_inst;
    in.gt_masks = b->gt_masks; /* NULL unless the loader carries masks (Mask R-CNN) */
    in.seed = seed;
    ps_rcnn_losses_t l = {0};
    int rc = ps_rcnn_forward(r->m, &in, &l);
    if (!rc) rc = ps_rcnn_backward(r->m);
    ps_debug("losses: objectness %.5f rpn_box_reg %.5f classifier %.5f box_reg %.5f mask %.5f",
             l.objectness, l.rpn_box, l.classifier, l.box_reg, l.mask);
    *loss = l.objectness + l.rpn_box + l.classifier + l.box_reg + l.mask;
    return rc;
}

static int rc_infer(void *m, const ps_det_batch_t *b, int n)
{
    rc_t *r = m;
    ps_rcnn_input_t in = input_of(r, b, n);
    return ps_rcnn_forward(r->m, &in, NULL);
}

static int rc_detect(void *m, int i, const ps_det_geom_t *g, float score_thresh, float *boxes,
                     float *scores, int32_t *classes)
{
    (void)g;          /* the forward clipped to the image's size already */
    (void)score_thresh; /* in the model's post-processing parameters */
    return ps_rcnn_detect(M(m), i, boxes, scores, classes);
}

/* Each detection's mask probabilities pasted into the original image
 * (its box / scale; a flipped image's mask mirrored after), > 0.5, as an
 * RLE. */
static int mrc_detect_masks(void *m, int i, const ps_det_geom_t *g, int n, const float *boxes,
                            ps_rle_t *out)
{
    const ps_rcnn_config_t *c = ps_rcnn_config(M(m));
    int MM = 4 * c->mask_roi_size * c->mask_roi_size, h = g->orig_h, w = g->orig_w, rc = 0;
    float *probs = malloc(sizeof(float) * MM * (size_t)(n > 0 ? n : 1));
    float *img = malloc(sizeof(float) * (size_t)h * w);
    uint8_t *bits = malloc((size_t)h * w);
    if (!probs || !img || !bits) rc = PS_ENOMEM;
    if (!rc && ps_rcnn_detect_masks(M(m), i, probs) != n) {
        ps_error("Mask R-CNN: image %d's masks do not match its %d detections", i, n);
        rc = PS_ESTATE;
    }
    float sx = (float)g->w / g->orig_w, sy = (float)g->h / g->orig_h;
    int k = 0;
    for (; k < n && !rc; k++) {
        const float *b = boxes + 4 * k;
        float box[4] = {b[0] / sx, b[1] / sy, b[2] / sx, b[3] / sy};
        int side = 2 * c->mask_roi_size;
        if ((rc = ps_det_mask_paste(img, h, w, probs + (size_t)k * MM, side, box))) break;
        for (size_t p = 0; p < (size_t)h * w; p++) bits[p] = img[p] > 0.5f;
        if (g->flip)
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w / 2; x++) {
                    uint8_t t = bits[(size_t)y * w + x];
                    bits[(size_t)y * w + x] = bits[(size_t)y * w + w - 1 - x];
                    bits[(size_t)y * w + w - 1 - x] = t;
                }
        if ((rc = ps_rle_encode(&out[k], bits, w, h, w))) break;
    }
    if (rc)
        for (int j = 0; j < k; j++) ps_rle_free(&out[j]);
    free(probs), free(img), free(bits);
    return rc;
}

/* the entries the two rows share (RPN anchors matched at 0.7 / 0.3) */
#define RCNN_ROW_ENTRIES                                                                     \
    .fg_iou = 0.7f, .bg_iou = 0.3f, .classes_per = 1, .classes_extra = 1,                    \
    .max_gt = rc_max_gt, .destroy = rc_destroy,                                              \
    .init = rc_init, .load = rc_load, .save = rc_save, .params = rc_params,                  \
    .buffers = rc_buffers,                                                                   \
    .find_param = rc_find, .hookable = rc_hookable,                                          \
    .tensor_specs = rc_specs, .groups = rc_groups,                                           \
    .zero_grad = rc_zero_grad, .num_anchors = rc_num_anchors, .anchors = rc_anchors,         \
    .train = rc_train, .infer = rc_infer, .detect = rc_detect

const det_kind_t det_kind_rcnn = {
    .prefix = "fasterrcnn-r",
    .name = "Faster R-CNN",
    .classes_tensor = "roi_heads.box_predictor.cls_score.bias",
    .create = rc_create,
    RCNN_ROW_ENTRIES,
};

const det_kind_t det_kind_maskrcnn = {
    .prefix = "maskrcnn-r",
    .name = "Mask R-CNN",
    .classes_tensor = "roi_heads.box_predictor.cls_score.bias",
    .create = mrc_create,
    .masks = 1,
    .detect_masks = mrc_detect_masks,
    RCNN_ROW_ENTRIES,
};

const det_kind_t det_kind_cascade = {
    .prefix = "cascade-r",
    .name = "Cascade R-CNN",
    .classes_tensor = "roi_heads.box_predictor.0.cls_score.bias",
    .create = crc_create,
    RCNN_ROW_ENTRIES,
};
