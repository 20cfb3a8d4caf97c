/* R-CNN build, the order of a forward and a backward over the backbone,
 * FPN (rcnn_fpn.c), RPN (rcnn_rpn.c) and box head (rcnn_box.c), and the
 * outputs.  The anchors are computed once on the host at build time
 * (det_boxes.h); the host work between the stages runs after a sync of the
 * backend, on the outputs in the (managed) arena. */
#include "rcnn_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "worker/det/det_boxes.h"

#include <stdlib.h>
#include <string.h>

#define TAKE(ptr, n) ((ptr) = (void *)ps_arena_take(a, (n)))

static size_t umax(size_t a, size_t b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

static void layout(ps_rcnn_t *m, ps_arena_t *a)
{
    for (int i = m->nbody; i < m->nparams; i++) TAKE(m->params[i].w, m->params[i].numel);
    for (int i = m->nbody; i < m->nparams; i++) TAKE(m->params[i].g, m->params[i].numel);
    ps_rcnn_fpn_layout(m, a);
    ps_rcnn_rpn_layout(m, a);
    for (int k = 0; k < m->nstages; k++) ps_rcnn_box_layout(m, &m->stage[k], a);
    if (m->cfg.mask) ps_rcnn_mask_layout(m, a);
    size_t scratch = (size_t)m->max_n * umax(m->cfg.fpn_channels, 4 * PS_RCNN_ANCHORS) *
                     m->lh[0] * m->lw[0];
    TAKE(m->s1, scratch);
    TAKE(m->s2, scratch);
    TAKE(m->s3, scratch);
    TAKE(m->s4, scratch);
    TAKE(m->anchors, (size_t)m->A * 4);
}

/* The level sizes and strides (torchvision: image size // map size, which
 * must be exact here) and the anchors. */
static int levels(ps_rcnn_t *m)
{
    rcnn_fpn_t *f = &m->fpn;
    for (int i = 0; i < 4; i++) {
        ps_resnet_stage_out(m->body, i, &f->Cs[i], &f->Hs[i], &f->Ws[i]);
        m->lh[i] = f->Hs[i];
        m->lw[i] = f->Ws[i];
    }
    m->lh[4] = ps_conv_out(m->lh[3], 1, 2, 0, 1);
    m->lw[4] = ps_conv_out(m->lw[3], 1, 2, 0, 1);
    m->A = 0;
    for (int l = 0; l < PS_RCNN_LEVELS; l++) {
        m->lstride[l] = m->H / m->lh[l];
        if (m->lstride[l] * m->lh[l] != m->H || m->W / m->lw[l] != m->lstride[l] ||
            m->lstride[l] * m->lw[l] != m->W || m->lstride[l] != 4 << l) {
            ps_error("rcnn: a %dx%d input gives level P%d %dx%d: sides must be multiples of 64",
                     m->H, m->W, l + 2, m->lh[l], m->lw[l]);
            return PS_EINVAL;
        }
        m->loff[l] = m->A;
        m->A += m->lh[l] * m->lw[l] * PS_RCNN_ANCHORS;
    }
    return 0;
}

static void make_anchors(ps_rcnn_t *m)
{
    float cell[PS_RCNN_ANCHORS * 4];
    for (int l = 0; l < PS_RCNN_LEVELS; l++) {
        float size = (float)(32 << l);
        ps_det_cell_anchors(cell, &size, 1, ps_det_retina_ratios, 3);
        ps_det_grid_anchors(m->anchors + (size_t)m->loff[l] * 4, cell, PS_RCNN_ANCHORS, m->lh[l],
                            m->lw[l], m->lstride[l]);
    }
}

static int host_arrays(ps_rcnn_t *m)
{
    rcnn_rpn_t *r = &m->rpn;
    r->props = malloc(sizeof(float) * 4 * (size_t)m->max_n * r->post_max);
    r->nprops = calloc((size_t)m->max_n, sizeof(int));
    m->hw = malloc(sizeof(int32_t) * 2 * (size_t)m->max_n);
    for (int k = 0; k < m->nstages; k++)
        if (ps_rcnn_box_host(m, &m->stage[k])) return PS_ENOMEM;
    size_t D = (size_t)m->max_n * m->cfg.post.max_det;
    m->det_boxes = malloc(sizeof(float) * 4 * D);
    m->det_scores = malloc(sizeof(float) * D);
    m->det_classes = malloc(sizeof(int32_t) * D);
    m->det_count = calloc((size_t)m->max_n, sizeof(int));
    if (m->cfg.mask && ps_rcnn_mask_host(m)) return PS_ENOMEM;
    return r->props && r->nprops && m->hw && m->det_boxes && m->det_scores && m->det_classes &&
                   m->det_count
               ? 0
               : PS_ENOMEM;
}

static int build(ps_rcnn_t *m)
{
    const ps_rcnn_config_t *c = &m->cfg;
    ps_model_config_t bc;
    ps_model_config_default(&bc);
    bc.depth = c->depth;
    bc.width = c->width;
    bc.bn_eps = c->bn_eps;
    bc.partial_bn = 0;
    bc.bn_mode = c->bn_mode; /* FROZEN: FrozenBatchNorm2d */
    bc.recompute = c->recompute;
    m->nstages = c->stages;
    for (int k = 0; k < m->nstages; k++) m->stage[k].k = k;
    int r = ps_resnet_create_features(&m->body, &bc, m->be, m->ctx, m->max_n, m->H, m->W);
    if (r || (r = levels(m))) return r;
    /* RoIs per image: training samples at most box-batch of the proposals
     * + ground truth, inference takes every proposal; given proposals
     * (tests) may number post_max in either */
    m->rpn.post_max = imax(c->rpn_train.post_nms_top_n, c->rpn_test.post_nms_top_n);
    int per_image = imax(imin(c->roi.batch, m->rpn.post_max + c->max_gt), m->rpn.post_max);
    m->Rmax = m->max_n * imax(per_image, 1);
    /* mask rows: the positives sampled (training) or the detections */
    if (c->mask)
        m->Rmask = m->max_n * imax((int)(c->roi.batch * c->roi.fraction), c->post.max_det);
    if ((r = ps_rcnn_define(m))) return r;
    ps_arena_begin_sizing(&m->arena);
    layout(m, &m->arena);
    if ((r = ps_arena_commit(&m->arena))) return r;
    layout(m, &m->arena);
    if (m->arena.used > m->arena.size) return PS_ENOMEM;
    if ((r = host_arrays(m))) return r;

    rcnn_fpn_t *f = &m->fpn;
    size_t ws = 0;
    int N = m->max_n;
    for (int i = 0; i < 4; i++) {
        ps_rconv_resolve(&f->inner[i], m->params);
        ps_rconv_resolve(&f->layer[i], m->params);
        ws = umax(ws, ps_rconv_workspace(&f->inner[i], N, f->Hs[i], f->Ws[i]));
        ws = umax(ws, ps_rconv_workspace(&f->layer[i], N, f->Hs[i], f->Ws[i]));
    }
    rconv_t *rpn[3] = {&m->rpn.conv, &m->rpn.cls, &m->rpn.bbox};
    for (int i = 0; i < 3; i++) {
        ps_rconv_resolve(rpn[i], m->params);
        ws = umax(ws, ps_rconv_workspace(rpn[i], N, m->lh[0], m->lw[0])); /* largest on P2 */
    }
    for (int k = 0; k < m->nstages; k++) {
        ps_rlin_resolve(&m->stage[k].fc6, m->params);
        ps_rlin_resolve(&m->stage[k].fc7, m->params);
        ps_rlin_resolve(&m->stage[k].cls, m->params);
        ps_rlin_resolve(&m->stage[k].bbox, m->params);
    }
    if (c->mask) {
        ps_rcnn_mask_resolve(m);
        ws = umax(ws, ps_rcnn_mask_workspace(m));
    }
    make_anchors(m);
    return ps_ctx_reserve(m->ctx, ws);
}

static int bad_config(const ps_rcnn_config_t *c)
{
    const ps_det_rpn_params_t *rp[2] = {&c->rpn_train, &c->rpn_test};
    for (int i = 0; i < 2; i++)
        if (rp[i]->pre_nms_top_n < 1 || rp[i]->post_nms_top_n < 1 ||
            rp[i]->post_nms_top_n > 100000 || rp[i]->pre_nms_top_n > 1000000 ||
            !(rp[i]->nms_thresh > 0 && rp[i]->nms_thresh <= 1) || !(rp[i]->min_size >= 0))
            return 1;
    return (c->depth != 18 && c->depth != 34 && c->depth != 50) || c->num_classes < 1 ||
           c->num_classes > 100000 || c->width < 1 || c->width > 4096 || c->fpn_channels < 1 ||
           c->fpn_channels > 4096 || c->freeze_at < 0 || c->freeze_at > 5 ||
           (c->bn_mode != PS_MODEL_BN_FROZEN && c->bn_mode != PS_MODEL_BN_TRAIN) ||
           (c->recompute != 0 && c->recompute != 1) || !(c->bn_eps > 0.f) || c->rpn_batch < 1 || !(c->rpn_fraction > 0 && c->rpn_fraction <= 1) ||
           c->representation < 1 || c->representation > 65536 || c->roi_size < 1 ||
           c->roi_size > 64 || c->roi_sampling < 0 || c->roi.batch < 1 ||
           !(c->roi.fraction > 0 && c->roi.fraction <= 1) ||
           !(c->roi.bg_iou > 0 && c->roi.bg_iou <= c->roi.fg_iou && c->roi.fg_iou <= 1) ||
           !(c->post.nms_thresh > 0 && c->post.nms_thresh <= 1) || c->post.max_det < 1 ||
           !(c->smoothl1_beta > 0.f) || c->max_gt < 1 || c->max_gt > 100000 ||
           (c->mask && (c->mask_dim < 1 || c->mask_dim > 4096 || c->mask_roi_size < 1 ||
                        c->mask_roi_size > 64)) ||
           (c->stages != 1 && c->stages != PS_RCNN_MAX_STAGES) || (c->mask && c->stages > 1) ||
           !(c->cascade_beta >= 0.f);
}

int ps_rcnn_create(ps_rcnn_t **out, const ps_rcnn_config_t *cfg, const ps_backend_t *be,
                   ps_ctx_t *ctx, int max_n, int H, int W)
{
    *out = NULL;
    if (!cfg || !be || !ctx) return PS_EINVAL;
    if (bad_config(cfg)) {
        ps_error("rcnn: bad config (depth %d, classes %d, width %d, fpn %d, freeze_at %d, RPN "
                 "pre/post %d/%d train, %d/%d test, RPN batch %d, representation %d, RoI %d x "
                 "%d sampling %d, box batch %d, max_gt %d)", cfg->depth, cfg->num_classes,
                 cfg->width, cfg->fpn_channels, cfg->freeze_at, cfg->rpn_train.pre_nms_top_n,
                 cfg->rpn_train.post_nms_top_n, cfg->rpn_test.pre_nms_top_n,
                 cfg->rpn_test.post_nms_top_n, cfg->rpn_batch, cfg->representation,
                 cfg->roi_size, cfg->roi_size, cfg->roi_sampling, cfg->roi.batch, cfg->max_gt);
        return PS_EINVAL;
    }
    if (max_n < 1 || max_n > 4096 || H < 64 || W < 64 || H > 4096 || W > 4096) {
        ps_error("rcnn: bad batch geometry (max_n %d, H %d, W %d; H, W >= 64)", max_n, H, W);
        return PS_EINVAL;
    }
    ps_rcnn_t *m = calloc(1, sizeof *m);
    if (!m) return PS_ENOMEM;
    m->cfg = *cfg;
    m->be = be;
    m->ctx = ctx;
    m->max_n = max_n;
    m->H = H;
    m->W = W;
    int r = build(m);
    if (r) {
        ps_error("rcnn: cannot build %s R-CNN ResNet-%d-FPN for %d images of %dx%d: %s",
                 cfg->mask ? "Mask" : cfg->stages > 1 ? "Cascade" : "Faster", cfg->depth, max_n,
                 H, W, ps_strerror(r));
        ps_rcnn_destroy(&m);
        return r;
    }
    ps_rcnn_init(m, 0, 0);
    *out = m;
    return 0;
}

void ps_rcnn_destroy(ps_rcnn_t **mp)
{
    if (!mp || !*mp) return;
    ps_rcnn_t *m = *mp;
    ps_rcnn_free_tables(m);
    ps_model_destroy(&m->body);
    ps_arena_free(&m->arena);
    free(m->rpn.props), free(m->rpn.nprops), free(m->hw);
    for (int k = 0; k < PS_RCNN_MAX_STAGES; k++) ps_rcnn_box_free_host(&m->stage[k]);
    free(m->det_boxes), free(m->det_scores), free(m->det_classes);
    free(m->det_count);
    ps_rcnn_mask_free_host(m);
    free(m);
    *mp = NULL;
}

const ps_rcnn_config_t *ps_rcnn_config(const ps_rcnn_t *m) { return &m->cfg; }
int ps_rcnn_num_anchors(const ps_rcnn_t *m) { return m->A; }
const float *ps_rcnn_anchors(const ps_rcnn_t *m) { return m->anchors; }
const float *ps_rcnn_objectness(const ps_rcnn_t *m) { return m->rpn.obj; }
const float *ps_rcnn_rpn_deltas(const ps_rcnn_t *m) { return m->rpn.box; }
int ps_rcnn_max_rois(const ps_rcnn_t *m) { return m->Rmax; }

const float *ps_rcnn_proposals(const ps_rcnn_t *m, int i, int *count)
{
    if (count) *count = m->rpn.nprops[i];
    return m->rpn.props + (size_t)i * m->rpn.post_max * 4;
}

/* ---- forward / backward ------------------------------------------------------ */

static int detect_all(ps_rcnn_t *m, int n);

static int check_input(const ps_rcnn_t *m, const ps_rcnn_input_t *in, ps_rcnn_losses_t *l)
{
    if (!in || !in->images || in->n < 1 || in->n > m->max_n) {
        ps_error("rcnn forward: bad arguments (n %d, max %d)", in ? in->n : 0, m->max_n);
        return PS_EINVAL;
    }
    if (in->rpn_labels && (!in->rpn_targets || !in->gt_boxes || !in->gt_classes || !in->ngt ||
                           in->gt_stride < 1 || !l)) {
        ps_error("rcnn forward: training needs the RPN targets, the ground truth (boxes, "
                 "classes, counts, stride >= 1) and the loss outputs");
        return PS_EINVAL;
    }
    if (in->proposals && (!in->nproposals || in->proposal_stride < 1)) {
        ps_error("rcnn forward: given proposals need their counts and a stride >= 1");
        return PS_EINVAL;
    }
    for (int i = 0; in->image_hw && i < in->n; i++)
        if (in->image_hw[2 * i] < 1 || in->image_hw[2 * i] > m->H || in->image_hw[2 * i + 1] < 1 ||
            in->image_hw[2 * i + 1] > m->W) {
            ps_error("rcnn forward: image %d is %dx%d, outside the %dx%d input", i,
                     in->image_hw[2 * i + 1], in->image_hw[2 * i], m->W, m->H);
            return PS_EINVAL;
        }
    return 0;
}

int ps_rcnn_forward(ps_rcnn_t *m, const ps_rcnn_input_t *in, ps_rcnn_losses_t *l)
{
    int rc = check_input(m, in, l);
    if (rc) return rc;
    int n = in->n, training = in->rpn_labels != NULL;
    for (int i = 0; i < n; i++) {
        m->hw[2 * i] = in->image_hw ? in->image_hw[2 * i] : m->H;
        m->hw[2 * i + 1] = in->image_hw ? in->image_hw[2 * i + 1] : m->W;
    }
    m->last_training = 0;
    ps_resnet_forward_features(m->body, in->images, n, training); /* fires its own hooks */
    ps_mhooks_need(&m->hooks, m->g_fpn);
    ps_rcnn_fpn_forward(m, n);
    ps_mhooks_need(&m->hooks, m->g_rpn);
    ps_rcnn_rpn_forward(m, n);
    /* the host reads the RPN's outputs and writes the RoIs and targets */
    if ((rc = m->be->sync(m->ctx))) {
        ps_error("rcnn forward: device sync failed: %s", ps_strerror(rc));
        return rc;
    }
    if ((rc = ps_rcnn_rpn_proposals(m, in, training))) return rc;
    if (training && (rc = ps_rcnn_rpn_loss(m, in, l))) return rc;
    m->last_n = n;
    ps_rcnn_losses_t *lt = training ? l : NULL;
    ps_mhooks_need(&m->hooks, m->stage[0].rows);
    if ((rc = ps_rcnn_box_forward(m, &m->stage[0], in, m->rpn.props, m->rpn.nprops,
                                  m->rpn.post_max, training, 1, lt)))
        return rc;
    for (int k = 1; k < m->nstages; k++) {
        /* the host refines the previous stage's RoIs into this one's */
        if ((rc = m->be->sync(m->ctx))) {
            ps_error("rcnn forward: device sync failed: %s", ps_strerror(rc));
            return rc;
        }
        ps_rcnn_box_refine(m, &m->stage[k - 1]);
        ps_mhooks_need(&m->hooks, m->stage[k].rows);
        if ((rc = ps_rcnn_box_forward_next(m, &m->stage[k], &m->stage[k - 1], in, training, lt)))
            return rc;
    }
    if (lt) {
        lt->classifier = lt->box_reg = 0.f;
        for (int k = 0; k < m->nstages; k++) {
            lt->classifier += lt->stage_classifier[k];
            lt->box_reg += lt->stage_box_reg[k];
        }
    }
    if (!training) {
        /* the host post-processes the box head's outputs; Mask R-CNN's mask
         * branch then runs on those detections */
        if ((rc = m->be->sync(m->ctx))) {
            ps_error("rcnn forward: device sync failed: %s", ps_strerror(rc));
            return rc;
        }
        if ((rc = detect_all(m, n))) return rc;
    }
    ps_mhooks_need(&m->hooks, m->g_mask);
    if (m->cfg.mask && (rc = ps_rcnn_mask_forward(m, in, training, training ? l : NULL)))
        return rc;
    m->last_training = training;
    return 0;
}

int ps_rcnn_backward(ps_rcnn_t *m)
{
    if (!m->last_training) {
        ps_error("rcnn backward: needs a training forward first");
        return PS_ESTATE;
    }
    /* each head's group is final once its own backward is queued (grad_ready
     * hooks): the RPN head, the box stages, the mask branch, then the FPN
     * and the backbone (ps_rcnn_fpn_backward) */
    ps_rcnn_rpn_backward(m, m->last_n);      /* writes dP */
    ps_mhooks_ready(&m->hooks, m->g_rpn);
    for (int k = 0; k < m->nstages; k++) {
        ps_rcnn_box_backward(m, &m->stage[k]); /* adds RoIAlign's share to dP2..dP5 */
        ps_mhooks_ready(&m->hooks, m->stage[k].rows);
    }
    int rc = m->cfg.mask ? ps_rcnn_mask_backward(m) : 0; /* and the mask branch's */
    if (rc) return rc;
    ps_mhooks_ready(&m->hooks, m->g_mask);
    ps_rcnn_fpn_backward(m, m->last_n);       /* and on into the backbone */
    return 0;
}

/* ---- outputs ------------------------------------------------------------------ */

int ps_rcnn_box_outputs(const ps_rcnn_t *m, float *rois, int32_t *img, int32_t *labels,
                        float *class_logits, float *box_deltas)
{
    return ps_rcnn_stage_outputs(m, 0, rois, img, labels, class_logits, box_deltas);
}

int ps_rcnn_stage_outputs(const ps_rcnn_t *m, int k, float *rois, int32_t *img,
                          int32_t *labels, float *class_logits, float *box_deltas)
{
    if (k < 0 || k >= m->nstages) return 0;
    const rcnn_stage_t *s = &m->stage[k];
    size_t K1 = (size_t)m->cfg.num_classes + 1, nb = s->agnostic ? 1 : K1;
    for (int j = 0; j < s->R; j++) {
        size_t p = (size_t)s->pos[j];
        if (rois) memcpy(rois + (size_t)j * 4, s->h_rois + (size_t)j * 4, 4 * sizeof(float));
        if (img) img[j] = s->img[j];
        if (labels) labels[j] = s->h_labels[j];
        if (class_logits)
            memcpy(class_logits + j * K1, s->cls_out + p * K1, K1 * sizeof(float));
        if (box_deltas)
            memcpy(box_deltas + j * nb * 4, s->box_out + p * nb * 4, nb * 4 * sizeof(float));
    }
    return s->R;
}

int ps_rcnn_detect(const ps_rcnn_t *m, int i, float *boxes, float *scores, int32_t *classes)
{
    int n = m->det_count[i];
    size_t src = (size_t)i * m->cfg.post.max_det;
    memcpy(boxes, m->det_boxes + src * 4, sizeof(float) * 4 * (size_t)n);
    memcpy(scores, m->det_scores + src, sizeof(float) * (size_t)n);
    memcpy(classes, m->det_classes + src, sizeof(int32_t) * (size_t)n);
    return n;
}

/* Image i's detections into the caches (ps_det_roi_postprocess of its
 * RoIs' outputs); count or PS_ENOMEM. */
/* Cascade R-CNN (Detectron2): the mean of the stages' class
 * probabilities on the last stage's RoIs (row j of every stage is the same
 * RoI refined: nothing is dropped at inference) and the last stage's
 * refined boxes (h_next, made by detect_all); count or PS_ENOMEM. */
static int detect_cascade(ps_rcnn_t *m, int i)
{
    int K = m->cfg.num_classes, K1 = K + 1, first = 0, R = 0, ns = m->nstages;
    rcnn_stage_t *last = &m->stage[ns - 1];
    while (first < last->R && last->img[first] < i) first++;
    while (first + R < last->R && last->img[first + R] == i) R++;
    float *mean = calloc((size_t)(R ? R : 1) * K1, sizeof(float));
    float *p = malloc(sizeof(float) * (size_t)(R ? R : 1) * K1);
    float *lg = malloc(sizeof(float) * (size_t)(R ? R : 1) * K1);
    if (!mean || !p || !lg) {
        free(mean), free(p), free(lg);
        ps_error("cascade detect: out of memory (%d RoIs)", R);
        return PS_ENOMEM;
    }
    for (int k = 0; k < ns; k++) {
        const rcnn_stage_t *s = &m->stage[k];
        for (int j = 0; j < R; j++)
            memcpy(lg + (size_t)j * K1, s->cls_out + (size_t)s->pos[first + j] * K1,
                   sizeof(float) * K1);
        ps_det_roi_softmax(p, lg, R, K);
        for (size_t q = 0; q < (size_t)R * K1; q++) mean[q] += p[q];
    }
    for (size_t q = 0; q < (size_t)R * K1; q++) mean[q] *= 1.0f / (float)ns;
    size_t dst = (size_t)i * m->cfg.post.max_det;
    int rc = ps_det_roi_select(m->det_boxes + dst * 4, m->det_scores + dst, m->det_classes + dst,
                               mean, last->h_next + (size_t)first * 4, R, K, m->hw[2 * i],
                               m->hw[2 * i + 1], &last->post);
    free(mean), free(p), free(lg);
    return rc;
}

static int detect_image(ps_rcnn_t *m, int i)
{
    if (m->nstages > 1) return detect_cascade(m, i);
    const rcnn_stage_t *s = &m->stage[0];
    int K = m->cfg.num_classes, first = 0, R = 0;
    size_t K1 = (size_t)K + 1;
    while (first < s->R && s->img[first] < i) first++;
    while (first + R < s->R && s->img[first + R] == i) R++;
    float *lg = malloc(sizeof(float) * K1 * (size_t)(R ? R : 1));
    float *dl = malloc(sizeof(float) * K1 * 4 * (size_t)(R ? R : 1));
    if (!lg || !dl) {
        free(lg), free(dl);
        ps_error("rcnn detect: out of memory (%d RoIs)", R);
        return PS_ENOMEM;
    }
    for (int j = 0; j < R; j++) {
        size_t p = (size_t)s->pos[first + j];
        memcpy(lg + j * K1, s->cls_out + p * K1, K1 * sizeof(float));
        memcpy(dl + j * K1 * 4, s->box_out + p * K1 * 4, K1 * 4 * sizeof(float));
    }
    size_t dst = (size_t)i * m->cfg.post.max_det;
    int rc = ps_det_roi_postprocess(m->det_boxes + dst * 4, m->det_scores + dst,
                                    m->det_classes + dst, lg, dl, s->h_rois + (size_t)first * 4,
                                    R, K, m->hw[2 * i], m->hw[2 * i + 1], &s->post);
    free(lg), free(dl);
    return rc;
}

static int detect_all(ps_rcnn_t *m, int n)
{
    if (m->nstages > 1) ps_rcnn_box_refine(m, &m->stage[m->nstages - 1]);
    for (int i = 0; i < n; i++) {
        int k = detect_image(m, i);
        if (k < 0) return k;
        m->det_count[i] = k;
    }
    return 0;
}
