/* Training-step benchmark of the two-stage detectors on the CPU engine:
 * Faster R-CNN-FPN, Mask R-CNN-FPN and Cascade R-CNN-FPN
 * (worker/models/ps_rcnn.h) with a ResNet-18 / -50 backbone, the same
 * step as bench/rcnn_bench_torch.py times for torchvision's FasterRCNN /
 * MaskRCNN (bench/rcnn_bench.sh runs the two alternately and prints the
 * ratio).  One step: the RPN's anchor assignment (0.7 / 0.3, as the
 * detection loader does it and torchvision's RPN does inside its forward),
 * the forward with its losses, the backward; median of S steps after W
 * warm-up steps, images/s.
 *
 *   rcnn_bench [-A] [-o prefix] [-m faster,mask,cascade] [-d depth] [-t threads]
 *              [-s steps] [-w warmup] [-n images] [-H size] [-K classes] [-W width]
 *              [-F fpn] [-z freeze_at] [-R box_head_dim] [-B rois_per_image]
 *              [-M mask_head_dim] [-P rpn_pre_nms] [-Q rpn_post_nms]
 *
 * Defaults are torchvision's (fasterrcnn_resnet50_fpn / maskrcnn_resnet50_fpn
 * with trainable_backbone_layers=3): width 64, FPN 256, freeze_at 2
 * (stem + layer1 frozen), box head 1024, 512 RoIs per image, mask head
 * 256, RPN 2000 / 2000 proposals in training; 2 images of 256x256, 80
 * classes, depth 18, 2 threads.  -A: the narrow from-scratch configuration
 * of the acceptance runs (docs/detection.md: width 16, FPN 32, nothing
 * frozen, box head 256, 128 RoIs, mask head 16, RPN 320 / 320, 8 images of
 * 128x128); any other flag overrides a value of either preset.
 *
 * Inputs: the counter hash's images (ps_model_hash_fill "input", seed 1,
 * +-0.25), three fixed ground-truth boxes per image (classes 0, 1, 2 mod
 * K) and, for Mask R-CNN, the ellipse inscribed in each box as its mask;
 * the torch side makes the same.  -o PREFIX writes each model's initial
 * weights to PREFIX<model>-r<depth>.safetensors (torchvision's names), which
 * the torch side loads (--weights PREFIX): with the same weights and
 * inputs both sides propose the same boxes, so the work that depends on
 * the weights -- proposals after NMS, the box head's RoIs, the mask
 * branch's positive RoIs -- is the same up to float rounding in NMS and
 * the samplers' different random picks.  Those counts are printed per
 * image as the mean over the timed steps, so it can be compared.
 *
 * Lines starting with "RESULT" are machine-readable; "cpu:", "kernels:"
 * and "conv:" say what ran (bench/bench_kernels.h).  Figures mean
 * something only on an otherwise idle machine. */
#include "worker/det/det_boxes.h"
#include "worker/engine/ps_blas.h"
#include "worker/models/ps_rcnn.h"

#include "bench/bench_kernels.h"
#include "bench/bench_util.h"
#include "ps_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NGT 3 /* ground-truth boxes per image */

/* The detectors, as rows: RESULT name, what ps_rcnn_config_t sets. */
typedef struct det_row {
    const char *name, *title;
    int mask, stages;
} det_row_t;

static const det_row_t g_dets[] = {
    {"faster", "Faster R-CNN", 0, 1},
    {"mask", "Mask R-CNN", 1, 1},
    {"cascade", "Cascade R-CNN", 0, PS_RCNN_MAX_STAGES},
    {NULL, NULL, 0, 0},
};

/* A configuration: torchvision's defaults or the narrow acceptance one. */
typedef struct preset {
    int width, fpn, freeze_at, rep, box_batch, mask_dim, H, n, pre, post;
} preset_t;

static const preset_t g_torchvision = {64, 256, 2, 1024, 512, 256, 256, 2, 2000, 2000};
static const preset_t g_acceptance = {16, 32, 0, 256, 128, 16, 128, 8, 320, 320};

typedef struct opts {
    preset_t p;
    int depth, K, threads, steps, warmup;
    const char *save; /* -o: PREFIXmodel-rD.safetensors gets the initial weights */
} opts_t;

/* fractions of the image side: x1 y1 x2 y2 */
static const float g_gt[NGT][4] = {
    {0.10f, 0.10f, 0.50f, 0.45f}, {0.40f, 0.30f, 0.90f, 0.95f}, {0.55f, 0.05f, 0.95f, 0.40f}};

/* The ground truth of every image: boxes (n, NGT, 4) in pixels, classes,
 * counts and the masks (n, NGT, H, H): the pixels whose centre lies inside
 * the ellipse inscribed in the box. */
typedef struct gt {
    float *box;
    int32_t *cls, *count;
    uint8_t *mask;
} gt_t;

static int make_gt(gt_t *g, int n, int H, int K, int masks)
{
    g->box = malloc(sizeof(float) * 4 * NGT * n);
    g->cls = malloc(sizeof(int32_t) * NGT * n);
    g->count = malloc(sizeof(int32_t) * n);
    g->mask = masks ? calloc((size_t)n * NGT * H * H, 1) : NULL;
    if (!g->box || !g->cls || !g->count || (masks && !g->mask)) return 1;
    for (int i = 0; i < n; i++) {
        g->count[i] = NGT;
        for (int j = 0; j < NGT; j++) {
            float *b = g->box + ((size_t)i * NGT + j) * 4;
            for (int k = 0; k < 4; k++) b[k] = g_gt[j][k] * (float)H;
            g->cls[i * NGT + j] = j % K;
            if (!masks) continue;
            uint8_t *mk = g->mask + ((size_t)i * NGT + j) * H * H;
            double cx = 0.5 * (b[0] + b[2]), cy = 0.5 * (b[1] + b[3]);
            double rx = 0.5 * (b[2] - b[0]), ry = 0.5 * (b[3] - b[1]);
            for (int y = 0; y < H; y++)
                for (int x = 0; x < H; x++) {
                    double u = (x + 0.5 - cx) / rx, v = (y + 0.5 - cy) / ry;
                    mk[(size_t)y * H + x] = u * u + v * v <= 1.0;
                }
        }
    }
    return 0;
}

static void free_gt(gt_t *g)
{
    free(g->box), free(g->cls), free(g->count), free(g->mask);
}

static ps_rcnn_t *create(ps_ctx_t *ctx, const opts_t *o, const det_row_t *d, int depth)
{
    const preset_t *p = &o->p;
    ps_rcnn_config_t c;
    ps_rcnn_config_default(&c);
    c.depth = depth;
    c.num_classes = o->K;
    c.width = p->width;
    c.fpn_channels = p->fpn;
    c.freeze_at = p->freeze_at;
    c.representation = p->rep;
    c.roi.batch = p->box_batch;
    c.mask = d->mask;
    c.mask_dim = p->mask_dim;
    c.stages = d->stages;
    c.rpn_train.pre_nms_top_n = p->pre;
    c.rpn_train.post_nms_top_n = p->post;
    ps_rcnn_t *m = NULL;
    if (ps_rcnn_create(&m, &c, &ps_backend_cpu, ctx, p->n, p->H, p->H)) return NULL;
    ps_rcnn_init(m, 1, 0);
    return m;
}

/* the work of the last forward that depends on the weights, summed into w:
 * proposals, box head RoIs (every stage), mask rows */
static void count_work(const ps_rcnn_t *m, int n, int stages, double w[3])
{
    for (int i = 0; i < n; i++) {
        int c = 0;
        ps_rcnn_proposals(m, i, &c);
        w[0] += c;
    }
    for (int k = 0; k < stages; k++)
        w[1] += ps_rcnn_stage_outputs(m, k, NULL, NULL, NULL, NULL, NULL);
    w[2] += ps_rcnn_mask_outputs(m, NULL, NULL);
}

static int bench(ps_ctx_t *ctx, const opts_t *o, const det_row_t *d, int depth)
{
    const preset_t *p = &o->p;
    int n = p->n, H = p->H, steps = o->steps, rc = 1;
    ps_rcnn_t *m = create(ctx, o, d, depth);
    if (!m) {
        fprintf(stderr, "rcnn_bench: cannot build %s ResNet-%d-FPN (see the error above)\n",
                d->title, depth);
        return 1;
    }
    if (o->save) {
        char path[4096];
        snprintf(path, sizeof path, "%s%s-r%d.safetensors", o->save, d->name, depth);
        if (ps_rcnn_save(m, path)) {
            fprintf(stderr, "rcnn_bench: -o: cannot write the weights to %s\n", path);
            ps_rcnn_destroy(&m);
            return 1;
        }
    }
    int A = ps_rcnn_num_anchors(m);
    size_t nx = (size_t)n * 3 * H * H;
    float *x = malloc(nx * sizeof *x), *tgt = malloc(sizeof(float) * 4 * A * n);
    int32_t *lab = malloc(sizeof(int32_t) * A * n), *matched = malloc(sizeof(int32_t) * A);
    double *tf = malloc(steps * sizeof *tf), *tb = malloc(steps * sizeof *tb);
    double *ts = malloc(steps * sizeof *ts);
    gt_t g = {0};
    if (!x || !tgt || !lab || !matched || !tf || !tb || !ts || make_gt(&g, n, H, o->K, d->mask)) {
        fprintf(stderr, "rcnn_bench: out of memory for %d images of %dx%d\n", n, H, H);
        goto out;
    }
    /* inputs of a few tenths: the FPN's outputs stay moderate under the
     * identity frozen BN, so the RPN proposes boxes of many sizes */
    ps_model_hash_fill(x, nx, "input", 1, 0.25);
    ps_rcnn_input_t in = {.images = x, .n = n, .rpn_labels = lab, .rpn_targets = tgt,
                          .gt_boxes = g.box, .gt_classes = g.cls, .ngt = g.count,
                          .gt_stride = NGT, .gt_masks = g.mask};
    ps_rcnn_losses_t l = {0};
    double work[3] = {0, 0, 0};
    int shapes0 = 0; /* convolution shapes met before the timed steps */
    for (int st = -o->warmup; st < steps; st++) {
        ps_rcnn_zero_grad(m);
        in.seed = (uint64_t)(st + o->warmup + 1);
        if (st == 0) shapes0 = ps_conv_choices(NULL, 0);
        double t0 = bench_now();
        for (int i = 0; i < n; i++) {
            const float *gb = g.box + (size_t)i * NGT * 4;
            if (ps_det_assign(matched, ps_rcnn_anchors(m), A, gb, NGT, 0.7f, 0.3f, NULL) < 0 ||
                ps_det_make_targets(lab + (size_t)i * A, tgt + (size_t)i * A * 4, matched,
                                    ps_rcnn_anchors(m), A, gb, g.cls + i * NGT, NGT, o->K) < 0) {
                fprintf(stderr, "rcnn_bench: anchor assignment failed (image %d)\n", i);
                goto out;
            }
        }
        int r = ps_rcnn_forward(m, &in, &l);
        double t1 = bench_now();
        if (r == 0) r = ps_rcnn_backward(m);
        double t2 = bench_now();
        if (r) {
            fprintf(stderr, "rcnn_bench: %s ResNet-%d step %d failed (%d)\n", d->title, depth,
                    st, r);
            goto out;
        }
        if (st < 0) continue;
        tf[st] = t1 - t0;
        tb[st] = t2 - t1;
        ts[st] = t2 - t0;
        count_work(m, n, d->stages, work);
    }
    float loss = l.objectness + l.rpn_box + l.classifier + l.box_reg + l.mask;
    if (!isfinite(loss)) {
        fprintf(stderr, "rcnn_bench: %s ResNet-%d: the loss is not finite (%g)\n", d->title,
                depth, loss);
        goto out;
    }
    double mf = bench_median(tf, steps), mb = bench_median(tb, steps);
    double ms = bench_median(ts, steps), per = (double)steps * n;
    /* The kernel selection measures every new convolution shape on first
     * use (conv_select.c); the warm-up steps are meant to absorb it.  The
     * mask head's convolutions take the positive RoI count as their batch:
     * constant here (the weights do not change between steps), but a timed
     * step that still met a new shape is said so, with the count. */
    int new_shapes = ps_conv_choices(NULL, 0) - shapes0;
    if (new_shapes > 0)
        printf("note: %d convolution shape-directions were new during the timed steps (selection "
               "%s): their kernel measurement is inside the step times\n", new_shapes,
               ps_conv_get_kernels());
    printf("%s-ResNet-%d-FPN (width %d, FPN %d, freeze_at %d, box head %d, %d RoIs/image, mask "
           "head %d, RPN %d/%d) %dx3x%dx%d, K %d: fwd %.1f ms, bwd %.1f ms, step %.1f ms, %.2f "
           "images/s; per image %.0f proposals, %.0f box RoIs, %.1f mask RoIs (loss %.3f)\n",
           d->title, depth, p->width, p->fpn, p->freeze_at, p->rep, p->box_batch,
           d->mask ? p->mask_dim : 0, p->pre, p->post, n, H, H, o->K, mf * 1e3, mb * 1e3,
           ms * 1e3, n / ms, work[0] / per, work[1] / per, work[2] / per, loss);
    printf("RESULT impl=c model=%s depth=%d width=%d fpn=%d size=%d batch=%d threads=%d "
           "fwd_ms=%.2f bwd_ms=%.2f step_ms=%.2f images_per_s=%.3f proposals=%.1f rois=%.1f "
           "mask_rois=%.1f new_conv_shapes=%d loss=%.4f\n", d->name, depth, p->width, p->fpn, H, n,
           ctx->nthreads, mf * 1e3, mb * 1e3, ms * 1e3, n / ms, work[0] / per, work[1] / per,
           work[2] / per, new_shapes, loss);
    fflush(stdout);
    rc = 0;
out:
    free(x), free(tgt), free(lab), free(matched), free(tf), free(tb), free(ts);
    free_gt(&g);
    ps_rcnn_destroy(&m);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: rcnn_bench [-A] [-o weights_prefix] [-m faster,mask,cascade] "
                    "[-d depth (18, 34, 50; 0 = 18 and 50)] [-t threads] [-s steps] [-w warmup] "
                    "[-n images] [-H size] [-K classes] [-W width] [-F fpn] [-z freeze_at] "
                    "[-R box_head_dim] "
                    "[-B rois_per_image] [-M mask_head_dim] [-P rpn_pre_nms] [-Q rpn_post_nms]\n");
}

/* a flag's integer value in [lo, hi], or -1 with a message naming it */
static int int_arg(int flag, const char *s, int lo, int hi)
{
    char *e;
    long v = strtol(s, &e, 10);
    if (*s && !*e && v >= lo && v <= hi) return (int)v;
    fprintf(stderr, "rcnn_bench: -%c %s: want an integer in %d..%d\n", flag, s, lo, hi);
    return -1;
}

/* "faster,mask" -> a mask of g_dets rows; 0 on an unknown name (named) */
static unsigned parse_models(const char *s)
{
    unsigned set = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        int i = 0;
        while (g_dets[i].name && strcmp(g_dets[i].name, t)) i++;
        if (!g_dets[i].name) {
            fprintf(stderr, "rcnn_bench: -m: unknown model '%s' (faster, mask, cascade)\n", t);
            return 0;
        }
        set |= 1u << i;
    }
    return set;
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv); /* may re-exec with a better OpenBLAS core */
    /* the flags' values, -1 = the preset's */
    int v[128];
    for (int i = 0; i < 128; i++) v[i] = -1;
    opts_t o = {.p = g_torchvision, .depth = 18, .K = 80, .threads = 2, .steps = 5, .warmup = 1};
    unsigned models = 7;
    int opt;
    static const struct {
        char flag;
        int lo, hi;
    } ranges[] = {{'d', 0, 50},  {'t', 1, 256},   {'s', 1, 10000}, {'w', 0, 10000},
                  {'n', 1, 256}, {'H', 64, 4096}, {'K', 1, 100000}, {'W', 1, 4096},
                  {'F', 1, 4096}, {'z', 0, 5},     {'R', 1, 65536}, {'B', 1, 100000},
                  {'M', 1, 4096}, {'P', 1, 1000000}, {'Q', 1, 100000}, {0, 0, 0}};
    while ((opt = getopt(argc, argv, "Ao:m:d:t:s:w:n:H:K:W:F:z:R:B:M:P:Q:")) != -1) {
        if (opt == 'A') {
            o.p = g_acceptance;
            continue;
        }
        if (opt == 'o') {
            o.save = optarg;
            continue;
        }
        if (opt == 'm') {
            if (!(models = parse_models(optarg))) return 2;
            continue;
        }
        int i = 0;
        while (ranges[i].flag && ranges[i].flag != opt) i++;
        if (!ranges[i].flag) {
            usage();
            return 2;
        }
        if ((v[opt] = int_arg(opt, optarg, ranges[i].lo, ranges[i].hi)) < 0) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "rcnn_bench: unexpected argument '%s'\n", argv[optind]);
        usage();
        return 2;
    }
    struct {
        char flag;
        int *dst;
    } set[] = {{'d', &o.depth},       {'t', &o.threads},     {'s', &o.steps},
               {'w', &o.warmup},      {'n', &o.p.n},         {'H', &o.p.H},
               {'K', &o.K},           {'W', &o.p.width},     {'F', &o.p.fpn},
               {'z', &o.p.freeze_at}, {'R', &o.p.rep},       {'B', &o.p.box_batch},
               {'M', &o.p.mask_dim},  {'P', &o.p.pre},       {'Q', &o.p.post}};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        if (v[(int)set[i].flag] >= 0) *set[i].dst = v[(int)set[i].flag];
    if (o.depth != 0 && o.depth != 18 && o.depth != 34 && o.depth != 50) {
        fprintf(stderr, "rcnn_bench: -d %d: want 18, 34, 50 or 0 (18 and 50)\n", o.depth);
        return 2;
    }
    if (o.p.H % 64) {
        fprintf(stderr, "rcnn_bench: -H %d: the side must be a multiple of 64\n", o.p.H);
        return 2;
    }
    ps_log_level = PS_LOG_WARN;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, o.threads);
    bench_print_cpu(stdout);
    printf("OpenBLAS core %s, %d threads\n", ps_blas_corename(), ctx.nthreads);
    int rc = 0;
    static const int depths[] = {18, 34, 50};
    for (int di = 0; di < 3; di++) {
        int dep = depths[di];
        if (o.depth ? o.depth != dep : dep == 34) continue;
        for (int i = 0; g_dets[i].name; i++)
            if (models & (1u << i)) rc |= bench(&ctx, &o, &g_dets[i], dep);
    }
    bench_print_conv_kernels(stdout, 0);
    ps_ctx_free(&ctx);
    return rc;
}
