/* RetinaNet-FPN against PyTorch (tests/golden/gen_retinanet.py: torchvision's
 * BackboneWithFPN + LastLevelP6P7 + RetinaNetHead around the ResNet replica),
 * llm.c's debug-state approach as tests/test_resnet.c: the same hash weights,
 * input and per-anchor targets on both sides; both losses, a sample of the
 * outputs, and every parameter gradient (L2 norm + a deterministic sample)
 * compared with PyTorch float64.  Variants: ResNet-18 width 8, FPN 16, 3
 * classes, 2 images of 64x64, nothing frozen, P6 on C5 (gradient through
 * the stem); ResNet-50 width 8, 1 image, conv1 + layer1 frozen, P6 on P5.
 * Then: inference outputs == training outputs (frozen BN), post-processing
 * on them, a few SGD steps lower the loss, safetensors round trip, and bad
 * arguments are refused.
 *
 * Tolerances as tests/test_resnet.c (same reasoning, see there): outputs
 * and losses rtol 1e-3 / atol 1e-4 (float32 through ~25 conv layers);
 * gradients: norm within 2e-3 + 3*noise_norm, >= 80% of the samples within
 * 1e-2*|ref| + (2e-3 + 3*noise_p90)*rms, every sample within 1e-2*|ref| +
 * (0.25 + 3*noise_max)*rms, where noise_* is PyTorch's own float32 error
 * recorded in the golden.  BN is frozen here, so the float32 noise is far
 * below the ResNet's. */
#include "tests/lib/model_check.h"
#include "tests/lib/tap.h"
#include "worker/det/det_boxes.h"
#include "worker/models/ps_retinanet.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEED 1234
#define LINE_MAX_ 1000000

/* gen_retinanet.py targets(): u < 0.1 ignore, < 0.8 background, else a
 * class from a second hash; box targets (2u-1). */
static void make_targets(int32_t *lab, float *box, size_t rows, int K, uint64_t seed)
{
    uint64_t kl = seed ^ ps_model_fnv1a64("labels"), kc = seed ^ ps_model_fnv1a64("classes");
    for (size_t r = 0; r < rows; r++) {
        float u = ps_rng_uniform(kl, r);
        uint64_t k = (uint64_t)(ps_rng_uniform(kc, r) * 16777216.0f);
        lab[r] = u < 0.1f ? -1 : u < 0.8f ? 0 : 1 + (int32_t)((k * (uint64_t)K) >> 24);
    }
    ps_model_hash_fill(box, rows * 4, "box_targets", seed, 1.0);
}

typedef struct variant {
    const char *name;
    int depth, width, fpn, K, n, H, freeze_at, p6_from_p5;
} variant_t;

static ps_retina_t *make(ps_ctx_t *ctx, const variant_t *v)
{
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    c.depth = v->depth;
    c.width = v->width;
    c.fpn_channels = v->fpn;
    c.num_classes = v->K;
    c.freeze_at = v->freeze_at;
    c.p6_from_p5 = v->p6_from_p5;
    ps_retina_t *m = NULL;
    int r = ps_retina_create(&m, &c, &ps_backend_cpu, ctx, v->n, v->H, v->H);
    is_int(r, 0, "%s: create", v->name);
    return m;
}

/* "what N idx:val ..." against out[] */
static void check_samples(const char *line, const char *what, const float *out, size_t numel,
                          const char *vname)
{
    char *e;
    long n = strtol(line + strlen(what) + 1, &e, 10);
    is_int(n, (long)numel, "%s: %s count", vname, what);
    int cnt = 0, bad = check_sample_list(e, out, numel, vname, what, &cnt);
    ok(cnt > 0 && bad == 0, "%s: %d sampled %s match PyTorch", vname, cnt, what);
}

static void check_variant(ps_ctx_t *ctx, const variant_t *v)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/retinanet_%s.txt", srcdir(), v->name);
    FILE *f = fopen(path, "r");
    if (!ok(f != NULL, "%s: open %s", v->name, path)) return;
    ps_retina_t *m = make(ctx, v);
    if (!m) {
        fclose(f);
        return;
    }
    ps_retina_init(m, SEED, 1);
    int A = ps_retina_num_anchors(m);
    size_t rows = (size_t)v->n * A, nx = (size_t)v->n * 3 * v->H * v->H;
    float *x = malloc(nx * sizeof *x), *box = malloc(rows * 4 * sizeof *box);
    int32_t *lab = malloc(rows * sizeof *lab);
    ps_model_hash_fill(x, nx, "input", SEED, 1.0);
    make_targets(lab, box, rows, v->K, SEED);
    float lc = -1, lb = -1;
    ps_retina_zero_grad(m);
    is_int(ps_retina_forward(m, x, v->n, lab, box, 1, &lc, &lb), 0, "%s: forward", v->name);
    is_int(ps_retina_backward(m), 0, "%s: backward", v->name);

    char *line = malloc(LINE_MAX_);
    int np, ngrad = 0, bad = 0;
    double worst_norm = 0, worst_elem = 0;
    const ps_model_param_t *P = ps_retina_params(m, &np);
    int *seen = calloc(np, sizeof *seen);
    while (fgets(line, LINE_MAX_, f)) {
        char name[160];
        int off = 0;
        if (line[0] == '#') continue;
        if (!strncmp(line, "anchors ", 8)) {
            is_int(atoi(line + 8), A, "%s: anchors per image", v->name);
        } else if (!strncmp(line, "cls_loss ", 9)) {
            is_close(lc, strtod(line + 9, NULL), 1e-4, 1e-3, "%s: focal loss", v->name);
        } else if (!strncmp(line, "box_loss ", 9)) {
            is_close(lb, strtod(line + 9, NULL), 1e-4, 1e-3, "%s: smooth-L1 loss", v->name);
        } else if (!strncmp(line, "cls_out ", 8)) {
            check_samples(line, "cls_out", ps_retina_cls_out(m), rows * v->K, v->name);
        } else if (!strncmp(line, "box_out ", 8)) {
            check_samples(line, "box_out", ps_retina_box_out(m), rows * 4, v->name);
        } else if (sscanf(line, "grad %159s %*d %*f %*f %*f %*f%n", name, &off) == 1 && off > 0) {
            int pi = ps_retina_find_param(m, name);
            if (pi < 0) {
                bad++;
                diag("%s: %s not in the model", v->name, name);
                continue;
            }
            seen[pi] = 1;
            ngrad++;
            const ps_model_param_t *p = &P[pi];
            double ref_norm;
            bad += check_grad_line(v->name, name, line, off, p, &ref_norm, &worst_norm,
                                   &worst_elem);
            if (ref_norm >= 0 && (ref_norm == 0) != !p->trainable) {
                bad++;
                diag("%s: %s trainable %d but PyTorch's gradient norm is %g", v->name, name,
                     p->trainable, ref_norm);
            }
        }
    }
    int unseen = 0;
    for (int i = 0; i < np; i++) unseen += !seen[i];
    is_int(ngrad, np, "%s: golden has a gradient for all %d parameters", v->name, np);
    is_int(unseen, 0, "%s: every model parameter compared", v->name);
    ok(bad == 0, "%s: %d gradients match PyTorch float64 (worst norm error %.2g, worst element "
       "error %.2g rms)", v->name, ngrad, worst_norm, worst_elem);

    /* inference path: frozen BN, so the outputs equal the training ones */
    float *cls = malloc(rows * v->K * sizeof *cls);
    memcpy(cls, ps_retina_cls_out(m), rows * v->K * sizeof *cls);
    is_int(ps_retina_forward(m, x, v->n, NULL, NULL, 0, NULL, NULL), 0, "%s: inference", v->name);
    ok(!memcmp(cls, ps_retina_cls_out(m), rows * v->K * sizeof *cls),
       "%s: inference outputs == training outputs (frozen BN)", v->name);
    ps_log_level = -1;
    is_int(ps_retina_backward(m), PS_ESTATE, "%s: backward after inference refused", v->name);
    ps_log_level = PS_LOG_WARN;
    free(cls);
    free(seen);
    free(line);
    free(x);
    free(box);
    free(lab);
    fclose(f);
    ps_retina_destroy(&m);
}

/* Tables: torchvision's names, frozen flags, groups; a default-init model's
 * cls_logits bias is the prior. */
static void check_tables(ps_ctx_t *ctx)
{
    variant_t v = {"tables", 50, 64, 256, 91, 1, 64, 2, 1};
    ps_retina_t *m = make(ctx, &v);
    if (!m) return;
    int np, nb;
    const ps_model_param_t *P = ps_retina_params(m, &np);
    ps_retina_buffers(m, &nb);
    static const char *names[] = {
        "backbone.fpn.inner_blocks.0.0.weight", "backbone.fpn.layer_blocks.2.0.bias",
        "backbone.fpn.extra_blocks.p6.weight", "backbone.fpn.extra_blocks.p7.bias",
        "head.classification_head.conv.3.0.weight", "head.classification_head.cls_logits.bias",
        "head.regression_head.conv.0.0.bias", "backbone.body.layer4.0.downsample.1.weight"};
    /* torchvision retinanet_resnet50_fpn(weights=None, num_classes=91):
     * sum(p.numel() for p in model.parameters()) = 34,068,119 */
    check_r50_detector_table(P, np, nb, 34068119, "head.regression_head.bbox_reg.bias", names, 8);
    int i = ps_retina_find_param(m, "head.classification_head.cls_logits.weight");
    ok(i >= 0 && P[i].shape[0] == 9 * 91 && P[i].shape[1] == 256, "cls_logits (819, 256, 3, 3)");
    i = ps_retina_find_param(m, "head.classification_head.cls_logits.bias");
    ok(i >= 0 && fabs(P[i].w[5] + 4.59512f) < 1e-4, "cls_logits bias -log(99) = %.5f",
       i >= 0 ? P[i].w[5] : NAN);
    i = ps_retina_find_param(m, "backbone.fpn.extra_blocks.p6.weight");
    ok(i >= 0 && P[i].shape[1] == 256, "p6_from_p5: p6 takes 256 channels");
    is_int(P[ps_retina_find_param(m, "backbone.fpn.inner_blocks.1.0.bias")].group,
           PS_MODEL_GROUP_BIAS, "FPN bias group");
    ps_tensor_spec_t *specs = NULL;
    int ns = ps_retina_tensor_specs(m, &specs);
    ok(ns > 0 && ns < np, "%d of %d tensors trainable", ns, np);
    free(specs);
    ps_retina_destroy(&m);

    ps_log_level = -1;
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    c.freeze_at = 6;
    ok(ps_retina_create(&m, &c, &ps_backend_cpu, ctx, 1, 64, 64) == PS_EINVAL && !m,
       "freeze_at 6 refused");
    c.freeze_at = 2;
    ok(ps_retina_create(&m, &c, &ps_backend_cpu, ctx, 1, 16, 64) == PS_EINVAL && !m,
       "16-pixel input refused");
    ps_log_level = PS_LOG_WARN;
}

/* Loss falls, round trip, post-processing, bad labels: a small model. */
static void check_training(ps_ctx_t *ctx)
{
    variant_t v = {"train", 18, 8, 16, 3, 2, 64, 2, 0};
    ps_retina_t *m = make(ctx, &v);
    if (!m) return;
    ps_retina_init(m, 7, 0);
    int A = ps_retina_num_anchors(m), np;
    size_t rows = (size_t)v.n * A, nx = (size_t)v.n * 3 * 64 * 64;
    float *x = malloc(nx * sizeof *x), *box = calloc(rows * 4, sizeof *box);
    int32_t *lab = malloc(rows * sizeof *lab);
    ps_model_hash_fill(x, nx, "images", 3, 1.0);
    /* a real assignment: two GT boxes per image through ps_det_assign */
    const float *anchors = ps_retina_anchors(m);
    float gt[2][8] = {{8, 8, 40, 36, 30, 20, 62, 60}, {4, 30, 28, 62, 20, 2, 58, 26}};
    int32_t gcls[2][2] = {{0, 2}, {1, 0}}, *matched = malloc(A * sizeof *matched);
    int npos = 0;
    for (int i = 0; i < v.n; i++) {
        ps_det_assign(matched, anchors, A, gt[i], 2, 0.5f, 0.4f, NULL);
        npos += ps_det_make_targets(lab + (size_t)i * A, box + (size_t)i * A * 4, matched,
                                    anchors, A, gt[i], gcls[i], 2, v.K);
    }
    ok(npos > 0, "assignment gives %d positive anchors", npos);
    const ps_model_param_t *P = ps_retina_params(m, &np);
    ps_optim_config_t oc;
    ps_optim_config_default(&oc);
    oc.lr = 0.05f;
    oc.momentum = 0.9f;
    oc.weight_decay = 1e-4f;
    oc.ngroups = ps_retina_groups(m, oc.groups, PS_OPTIM_MAX_GROUPS);
    float **mom = alloc_like(P, np);
    float first = 0, last = 0, fc0 = 0, fc1 = 0, fb0 = 0, fb1 = 0;
    int fails = 0, steps = 10;
    for (int s = 0; s < steps; s++) {
        float lc, lb;
        ps_retina_zero_grad(m);
        fails += ps_retina_forward(m, x, v.n, lab, box, 1, &lc, &lb) != 0;
        fails += ps_retina_backward(m) != 0;
        if (s == 0) {
            first = lc + lb;
            fc0 = lc;
            fb0 = lb;
        }
        last = lc + lb;
        fc1 = lc;
        fb1 = lb;
        diag("step %d focal %.5f smooth-l1 %.5f", s, lc, lb);
        sgd_step(P, np, mom, &oc, s == 0);
    }
    is_int(fails, 0, "training steps ran");
    /* from the default init (heads std 0.01, prior bias) the focal term
     * moves slowly at first: it must fall, the box term by a fifth */
    ok(isfinite(last) && last < 0.9f * first && fc1 < fc0 && fb1 < 0.8f * fb0,
       "loss falls: %.4f -> %.4f (focal %.4f -> %.4f, smooth-L1 %.4f -> %.4f) in %d SGD steps",
       first, last, fc0, fc1, fb0, fb1, steps);
    int frozen_nonzero = 0;
    for (int i = 0; i < np; i++)
        if (!P[i].trainable) frozen_nonzero += l2(P[i].g, P[i].numel) != 0;
    is_int(frozen_nonzero, 0, "frozen tensors collected no gradient");

    /* post-processing on image 0's outputs (ps_det_postprocess) */
    ps_retina_forward(m, x, v.n, NULL, NULL, 0, NULL, NULL);
    const float *lg[PS_RETINA_LEVELS], *dl[PS_RETINA_LEVELS], *an[PS_RETINA_LEVELS];
    int Al[PS_RETINA_LEVELS];
    for (int l = 0; l < PS_RETINA_LEVELS; l++) {
        int h, w, off;
        ps_retina_level(m, l, &h, &w, NULL, &off);
        lg[l] = ps_retina_cls_out(m) + (size_t)off * v.K;
        dl[l] = ps_retina_box_out(m) + (size_t)off * 4;
        an[l] = anchors + (size_t)off * 4;
        Al[l] = h * w * PS_RETINA_ANCHORS;
    }
    ps_det_post_params_t pp;
    ps_det_post_defaults(&pp);
    pp.score_thresh = 0.005f; /* the prior (0.01) sits under the default 0.05 */
    float ob[100 * 4], os[100];
    int32_t ol[100];
    int nd = ps_det_postprocess(ob, os, ol, lg, dl, an, Al, PS_RETINA_LEVELS, v.K, 64, 64, &pp);
    int sane = nd > 0 && nd <= 100;
    for (int i = 0; i < nd && sane; i++)
        sane = ol[i] >= 0 && ol[i] < v.K && os[i] > 0.005f && ob[4 * i] >= 0 &&
               ob[4 * i + 2] <= 64 && ob[4 * i] <= ob[4 * i + 2];
    ok(sane, "post-processing of the outputs: %d detections, labels, scores and clipped boxes "
       "in range", nd);

    /* safetensors round trip into a differently initialised model */
    char path[] = "/tmp/test_retinanet_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    is_int(ps_retina_save(m, path), 0, "save");
    ps_retina_t *m2 = make(ctx, &v);
    if (m2) {
        ps_retina_init(m2, 99, 1);
        is_int(ps_retina_load(m2, path), 0, "load");
        int np2, same = 1;
        const ps_model_param_t *Q = ps_retina_params(m2, &np2);
        for (int i = 0; i < np && np2 == np; i++)
            same &= !memcmp(P[i].w, Q[i].w, P[i].numel * sizeof(float));
        const ps_model_buffer_t *B1 = ps_retina_buffers(m, NULL), *B2 = ps_retina_buffers(m2, NULL);
        int nb;
        ps_retina_buffers(m, &nb);
        for (int i = 0; i < nb; i++)
            same &= B1[i].f32 ? !memcmp(B1[i].f32, B2[i].f32, B1[i].numel * sizeof(float))
                              : *B1[i].i64 == *B2[i].i64;
        ok(np2 == np && same, "round trip: every parameter and buffer bit-identical");
        ps_retina_forward(m2, x, v.n, NULL, NULL, 0, NULL, NULL);
        ok(!memcmp(ps_retina_cls_out(m), ps_retina_cls_out(m2), rows * v.K * sizeof(float)),
           "round trip: same outputs");
        /* a model of another class count refuses the file, unchanged */
        variant_t v4 = v;
        v4.K = 4;
        ps_retina_t *m3 = make(ctx, &v4);
        if (m3) {
            ps_log_level = -1;
            is_int(ps_retina_load(m3, path), PS_EMISMATCH, "other class count refused");
            ps_log_level = PS_LOG_WARN;
            ps_retina_destroy(&m3);
        }
        ps_retina_destroy(&m2);
    }
    unlink(path);

    /* an ImageNet-style classifier checkpoint seeds the backbone: the
     * PyTorch-written ResNet-18 width 8 of test_model_io (fc.* ignored) */
    char tpath[1024];
    snprintf(tpath, sizeof tpath, "%s/tests/golden/torch_r18w8.safetensors", srcdir());
    is_int(ps_retina_load_backbone(m, tpath), 0, "backbone loads a PyTorch-written ResNet-18");
    int li = ps_retina_find_param(m, "backbone.body.layer3.1.conv2.weight");
    ok(li >= 0 && fabs(P[li].w[0]) > 0 && l2(P[li].g, P[li].numel) == 0,
       "backbone weights replaced, gradients zeroed");
    ps_log_level = -1;
    variant_t v50 = v;
    v50.depth = 50;
    ps_retina_t *m50 = make(ctx, &v50);
    ok(m50 && ps_retina_load_backbone(m50, tpath) == PS_EMISMATCH,
       "ResNet-18 file refused by a ResNet-50 backbone");
    ps_retina_destroy(&m50);
    ps_log_level = PS_LOG_WARN;

    /* bad arguments */
    ps_log_level = -1;
    float lc, lb;
    lab[5] = v.K + 1;
    is_int(ps_retina_forward(m, x, v.n, lab, box, 1, &lc, &lb), PS_EINVAL, "label K+1 refused");
    is_int(ps_retina_forward(m, x, v.n + 1, NULL, NULL, 0, NULL, NULL), PS_EINVAL,
           "batch over max refused");
    is_int(ps_retina_forward(m, x, v.n, lab, NULL, 1, &lc, &lb), PS_EINVAL,
           "labels without box targets refused");
    ps_log_level = PS_LOG_WARN;
    free_like(mom, np);
    free(matched);
    free(x);
    free(box);
    free(lab);
    ps_retina_destroy(&m);
}

int main(void)
{
    ps_ctx_t ctx;
    ps_log_level = PS_LOG_WARN;
    ps_engine_init(&ctx, 0);
    static const variant_t vs[] = {
        {"r18", 18, 8, 16, 3, 2, 64, 0, 0},
        {"r50", 50, 8, 16, 2, 1, 64, 2, 1},
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) check_variant(&ctx, &vs[i]);
    check_tables(&ctx);
    check_training(&ctx);
    ps_ctx_free(&ctx);
    return tap_done();
}
