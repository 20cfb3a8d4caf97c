/* The detectors' per-layer hooks (ps_rcnn_hookable, ps_retina_hookable:
 * the tables and set_hooks --overlap takes), on the CPU backend, for tiny
 * Faster R-CNN (backbone stages 2+ trained, and the whole backbone frozen),
 * Mask R-CNN, Cascade R-CNN (three box stages) and RetinaNet.
 *
 * Reference: the same model, init and batch, a training forward + backward
 * with no hooks.  Then with hooks, from the same start:
 *   weights_needed  every parameter, and every running statistic of the
 *                   backbone's frozen BNs (which the forward reads), is NaN
 *                   before the forward and restored only by the hook of its
 *                   group (a statistic with its BN's weight).  A layer that
 *                   read a tensor before its hook would make the losses NaN
 *                   (or move the sampled proposals), so every loss must
 *                   equal the reference's bit for bit; each parameter is
 *                   released exactly once per forward, an inference forward
 *                   included.
 *   grad_ready      each group's gradients are copied when its hook runs;
 *                   the copies must equal the gradients after the whole
 *                   backward and the reference's, bit for bit (a group
 *                   announced before its backward is done would differ);
 *                   each parameter exactly once per backward.
 * Control (the checks can fail): a hook that does not release the box
 * predictor's (RetinaNet: the regression head's) last bias gives other
 * losses. */
#include "tests/lib/tap.h"
#include "worker/det/det_boxes.h"
#include "worker/models/ps_rcnn.h"
#include "worker/models/ps_retinanet.h"

#include "ps_log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SEED 31
#define H 64
#define N 2
#define K 3
#define MAXGT 4
#define NLOSS 5

typedef struct variant {
    const char *name;
    int retina, mask, stages, freeze_at;
    const char *skip; /* control: the parameter the hook keeps NaN, or NULL */
} variant_t;

/* One model behind the few entries the harness needs. */
typedef struct det {
    const variant_t *v;
    ps_rcnn_t *rc;
    ps_retina_t *rt;
    ps_model_hookable_t h;
    float *x, *tgt;
    int32_t *lab, ngt[N], cls[N * MAXGT];
    float gt[N * MAXGT * 4];
    uint8_t *gtmask;
} det_t;

typedef struct hook_state {
    const det_t *d;
    float **w_true, **st_true, **g_seen;
    int *bn_of;         /* param -> its BN's running_mean buffer, or -1 */
    int *seen_w, *seen_g, bad_index, ngroups_w, ngroups_g;
} hook_state_t;

static void release(hook_state_t *s, int i)
{
    const ps_model_hookable_t *h = &s->d->h;
    if (s->d->v->skip && !strcmp(h->params[i].name, s->d->v->skip)) return;
    memcpy(h->params[i].w, s->w_true[i], h->params[i].numel * sizeof(float));
    int b = s->bn_of[i];
    if (b < 0) return;
    for (int j = b; j <= b + 1; j++) /* running_mean, running_var */
        memcpy(h->buffers[j].f32, s->st_true[j], h->buffers[j].numel * sizeof(float));
}

static void on_weights(void *ctx, int first, int n)
{
    hook_state_t *s = ctx;
    s->ngroups_w++;
    if (first < 0 || n < 1 || first + n > s->d->h.nparams) {
        s->bad_index = 1;
        return;
    }
    for (int i = first; i < first + n; i++) {
        s->seen_w[i]++;
        release(s, i);
    }
}

static void on_grad(void *ctx, int first, int n)
{
    hook_state_t *s = ctx;
    s->ngroups_g++;
    if (first < 0 || n < 1 || first + n > s->d->h.nparams) {
        s->bad_index = 1;
        return;
    }
    const ps_model_param_t *p = s->d->h.params;
    for (int i = first; i < first + n; i++) {
        s->seen_g[i]++;
        memcpy(s->g_seen[i], p[i].g, p[i].numel * sizeof(float));
    }
}

/* The anchors' labels and targets for the ground truth (the loaders'
 * matching: RPN 0.7 / 0.3 with one class, RetinaNet 0.5 / 0.4). */
static void anchor_targets(det_t *d, const float *anchors, int A, float hi, float lo, int ncls)
{
    int32_t *matched = malloc(sizeof *matched * A), one[MAXGT] = {0};
    for (int i = 0; i < N; i++) {
        const int32_t *c = ncls == 1 ? one : d->cls + i * MAXGT;
        ps_det_assign(matched, anchors, A, d->gt + i * MAXGT * 4, d->ngt[i], hi, lo, NULL);
        ps_det_make_targets(d->lab + (size_t)i * A, d->tgt + (size_t)i * A * 4, matched, anchors,
                            A, d->gt + i * MAXGT * 4, c, d->ngt[i], ncls);
    }
    free(matched);
}

static int make(det_t *d, const variant_t *v, ps_ctx_t *ctx)
{
    memset(d, 0, sizeof *d);
    d->v = v;
    static const float boxes[N][8] = {{8, 8, 40, 36, 30, 20, 62, 60}, {4, 30, 28, 62, 20, 2, 58, 26}};
    for (int i = 0; i < N; i++) {
        d->ngt[i] = 2;
        memcpy(d->gt + i * MAXGT * 4, boxes[i], sizeof boxes[i]);
        d->cls[i * MAXGT] = i;
        d->cls[i * MAXGT + 1] = 2;
    }
    size_t nx = (size_t)N * 3 * H * H;
    d->x = malloc(nx * sizeof *d->x);
    ps_model_hash_fill(d->x, nx, "images", SEED, 1.0);
    int A, r;
    if (v->retina) {
        ps_retina_config_t c;
        ps_retina_config_default(&c);
        c.depth = 18, c.width = 8, c.fpn_channels = 16, c.num_classes = K;
        c.freeze_at = v->freeze_at;
        if ((r = ps_retina_create(&d->rt, &c, &ps_backend_cpu, ctx, N, H, H))) return r;
        ps_retina_init(d->rt, SEED, 1);
        ps_retina_hookable(d->rt, &d->h);
        A = ps_retina_num_anchors(d->rt);
    } else {
        ps_rcnn_config_t c;
        ps_rcnn_config_default(&c);
        c.depth = 18, c.width = 8, c.fpn_channels = 16, c.num_classes = K;
        c.freeze_at = v->freeze_at;
        c.representation = 32;
        c.rpn_batch = 64, c.roi.batch = 32;
        c.rpn_train.pre_nms_top_n = c.rpn_train.post_nms_top_n = 50;
        c.rpn_test.pre_nms_top_n = c.rpn_test.post_nms_top_n = 30;
        c.max_gt = MAXGT;
        c.mask = v->mask;
        c.mask_dim = 8;
        c.stages = v->stages;
        if ((r = ps_rcnn_create(&d->rc, &c, &ps_backend_cpu, ctx, N, H, H))) return r;
        ps_rcnn_init(d->rc, SEED, 1);
        ps_rcnn_hookable(d->rc, &d->h);
        A = ps_rcnn_num_anchors(d->rc);
    }
    d->lab = malloc(sizeof *d->lab * N * A);
    d->tgt = malloc(sizeof *d->tgt * N * A * 4);
    if (v->retina) {
        anchor_targets(d, ps_retina_anchors(d->rt), A, 0.5f, 0.4f, K);
    } else {
        anchor_targets(d, ps_rcnn_anchors(d->rc), A, 0.7f, 0.3f, 1);
        d->gtmask = calloc((size_t)N * MAXGT * H * H, 1); /* each box's mask: its rectangle */
        for (int i = 0; i < N; i++)
            for (int j = 0; j < d->ngt[i]; j++) {
                const float *b = d->gt + (i * MAXGT + j) * 4;
                uint8_t *m = d->gtmask + (size_t)(i * MAXGT + j) * H * H;
                for (int y = (int)b[1]; y < (int)b[3]; y++)
                    for (int x = (int)b[0]; x < (int)b[2]; x++) m[y * H + x] = 1;
            }
    }
    return 0;
}

/* A training forward + backward: its losses into loss[NLOSS].  0 or PS_E*. */
static int train(det_t *d, float *loss)
{
    memset(loss, 0, NLOSS * sizeof *loss);
    if (d->rt) {
        ps_retina_zero_grad(d->rt);
        int r = ps_retina_forward(d->rt, d->x, N, d->lab, d->tgt, 1, &loss[0], &loss[1]);
        return r ? r : ps_retina_backward(d->rt);
    }
    ps_rcnn_zero_grad(d->rc);
    ps_rcnn_input_t in = {.images = d->x, .n = N, .rpn_labels = d->lab, .rpn_targets = d->tgt,
                          .gt_boxes = d->gt, .gt_classes = d->cls, .ngt = d->ngt,
                          .gt_stride = MAXGT, .seed = SEED, .gt_masks = d->gtmask};
    ps_rcnn_losses_t L = {0};
    int r = ps_rcnn_forward(d->rc, &in, &L);
    loss[0] = L.objectness, loss[1] = L.rpn_box, loss[2] = L.classifier;
    loss[3] = L.box_reg, loss[4] = L.mask;
    return r ? r : ps_rcnn_backward(d->rc);
}

/* An inference forward (no backward). */
static int infer(det_t *d)
{
    if (d->rt) return ps_retina_forward(d->rt, d->x, N, NULL, NULL, 0, NULL, NULL);
    ps_rcnn_input_t in = {.images = d->x, .n = N};
    return ps_rcnn_forward(d->rc, &in, NULL);
}

static void destroy(det_t *d)
{
    if (d->rt) ps_retina_destroy(&d->rt);
    if (d->rc) ps_rcnn_destroy(&d->rc);
    free(d->x), free(d->lab), free(d->tgt), free(d->gtmask);
}

/* Every parameter's weights and its BN's statistics to NaN. */
static void poison(const ps_model_hookable_t *h, const hook_state_t *s)
{
    for (int i = 0; i < h->nparams; i++) {
        for (size_t k = 0; k < h->params[i].numel; k++) h->params[i].w[k] = NAN;
        if (s->bn_of[i] < 0) continue;
        for (int j = s->bn_of[i]; j <= s->bn_of[i] + 1; j++)
            for (size_t k = 0; k < h->buffers[j].numel; k++) h->buffers[j].f32[k] = NAN;
    }
}

static int all_once(const int *seen, int n, int *which)
{
    for (int i = 0; i < n; i++)
        if (seen[i] != 1) {
            *which = i;
            return 0;
        }
    *which = -1;
    return 1;
}

static void run_variant(ps_ctx_t *ctx, const variant_t *v)
{
    det_t d;
    if (!ok(make(&d, v, ctx) == 0, "%s: created", v->name)) return;
    const ps_model_hookable_t *h = &d.h;
    int np = h->nparams, nb = h->nbuffers;
    hook_state_t s = {.d = &d};
    s.w_true = calloc(np, sizeof *s.w_true);
    s.g_seen = calloc(np, sizeof *s.g_seen);
    s.st_true = calloc(nb, sizeof *s.st_true);
    s.bn_of = malloc(np * sizeof(int));
    s.seen_w = calloc(np, sizeof(int));
    s.seen_g = calloc(np, sizeof(int));
    float **g_ref = calloc(np, sizeof *g_ref);
    int nstats = 0;
    for (int i = 0; i < np; i++) {
        size_t bytes = h->params[i].numel * sizeof(float);
        s.w_true[i] = malloc(bytes);
        s.g_seen[i] = malloc(bytes);
        g_ref[i] = malloc(bytes);
        memcpy(s.w_true[i], h->params[i].w, bytes);
        /* "<bn>.weight" -> the buffers "<bn>.running_mean", "<bn>.running_var" */
        s.bn_of[i] = -1;
        size_t L = strlen(h->params[i].name);
        for (int b = 0; b + 1 < nb && L > 7 && !strcmp(h->params[i].name + L - 7, ".weight"); b++)
            if (h->buffers[b].f32 && !strncmp(h->buffers[b].name, h->params[i].name, L - 6) &&
                !strcmp(h->buffers[b].name + L - 6, "running_mean"))
                s.bn_of[i] = b;
        nstats += s.bn_of[i] >= 0;
    }
    for (int b = 0; b < nb; b++)
        if (h->buffers[b].f32) {
            s.st_true[b] = malloc(h->buffers[b].numel * sizeof(float));
            memcpy(s.st_true[b], h->buffers[b].f32, h->buffers[b].numel * sizeof(float));
        }

    /* reference: no hooks */
    float ref[NLOSS], got[NLOSS];
    int rc = train(&d, ref);
    for (int i = 0; i < np; i++) memcpy(g_ref[i], h->params[i].g, h->params[i].numel * 4);
    int fin = 1;
    for (int k = 0; k < NLOSS; k++) fin &= isfinite(ref[k]);
    ok(rc == 0 && fin && ref[0] > 0, "%s: reference step (%d parameters, %d BNs' statistics): "
       "losses %.5f %.5f %.5f %.5f %.5f", v->name, np, nstats, ref[0], ref[1], ref[2], ref[3],
       ref[4]);

    /* with hooks, from NaN weights and statistics */
    poison(h, &s);
    h->set_hooks(h->model, on_grad, on_weights, &s);
    rc = train(&d, got);
    int which;
    if (v->skip) {
        ok(rc != 0 || memcmp(got, ref, sizeof ref),
           "%s (control): %s never released changes the losses (%.5f %.5f %.5f %.5f)", v->name,
           v->skip, got[0], got[1], got[2], got[3]);
        goto out;
    }
    ok(rc == 0 && !memcmp(got, ref, sizeof ref) && !s.bad_index,
       "%s: with hooks from NaN weights, losses bit for bit the reference's (%d groups)",
       v->name, s.ngroups_w);
    int once = all_once(s.seen_w, np, &which);
    ok(once, "%s: weights_needed released every parameter once (first other: %s)", v->name,
       which < 0 ? "none" : h->params[which].name);
    once = all_once(s.seen_g, np, &which);
    ok(once, "%s: grad_ready announced every parameter once in %d "
       "groups (first other: %s)", v->name, s.ngroups_g, which < 0 ? "none" : h->params[which].name);
    int early = -1, diff = -1;
    for (int i = np - 1; i >= 0; i--) {
        size_t bytes = h->params[i].numel * sizeof(float);
        if (memcmp(s.g_seen[i], h->params[i].g, bytes)) early = i;
        if (memcmp(h->params[i].g, g_ref[i], bytes)) diff = i;
    }
    ok(early < 0, "%s: each gradient at its grad_ready is the final one, bit for bit (first "
       "other: %s)", v->name, early < 0 ? "none" : h->params[early].name);
    ok(diff < 0, "%s: gradients equal the reference's, bit for bit (first other: %s)", v->name,
       diff < 0 ? "none" : h->params[diff].name);

    /* an inference forward releases every parameter once too */
    poison(h, &s);
    memset(s.seen_w, 0, np * sizeof(int));
    rc = infer(&d);
    once = all_once(s.seen_w, np, &which);
    ok(rc == 0 && once, "%s: inference forward released every "
       "parameter once (first other: %s)", v->name, which < 0 ? "none" : h->params[which].name);
out:
    h->set_hooks(h->model, NULL, NULL, NULL);
    for (int i = 0; i < np; i++) free(s.w_true[i]), free(s.g_seen[i]), free(g_ref[i]);
    for (int b = 0; b < nb; b++) free(s.st_true[b]);
    free(s.w_true), free(s.g_seen), free(g_ref), free(s.st_true), free(s.bn_of);
    free(s.seen_w), free(s.seen_g);
    destroy(&d);
}

int main(void)
{
    ps_ctx_t ctx;
    ps_log_level = PS_LOG_WARN;
    ps_engine_init(&ctx, 1);
    static const variant_t variants[] = {
        {"Faster R-CNN", 0, 0, 1, 2, NULL},
        {"Faster R-CNN, backbone frozen", 0, 0, 1, 5, NULL},
        {"Mask R-CNN", 0, 1, 1, 2, NULL},
        {"Cascade R-CNN", 0, 0, 3, 2, NULL},
        {"RetinaNet", 1, 0, 1, 2, NULL},
        {"RetinaNet, stem trained", 1, 0, 1, 0, NULL},
        {"Faster R-CNN", 0, 0, 1, 2, "roi_heads.box_predictor.bbox_pred.bias"},
        {"RetinaNet", 1, 0, 1, 2, "head.regression_head.bbox_reg.bias"},
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) run_variant(&ctx, &variants[i]);
    ps_ctx_free(&ctx);
    return tap_done();
}
