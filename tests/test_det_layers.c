/* The detection layers (the CPU backend's detection slots, worker/engine/
 * layers/) and box geometry (worker/det) against torchvision goldens
 * (tests/golden/gen_det.py -> det_golden.bin) and finite differences. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "tests/lib/golden_io.h"
#include "tests/lib/tap.h"
#include "worker/det/det_boxes.h"
#include "worker/engine/ps_engine.h"

typedef golden_rec_t rec_t;

static rec_t *need(const char *name)
{
    rec_t *r = golden_find(name);
    if (r) return r;
    printf("Bail out! golden record %s missing\n", name);
    exit(1);
}
static float *F32(const char *n) { return (float *)need(n)->data; }
static int32_t *I32(const char *n) { return (int32_t *)need(n)->data; }
static int NUMEL(const char *n) { return (int)need(n)->numel; }

/* the layers under test: the CPU reference (they take no state from ctx) */
static ps_ctx_t ctx;
static const ps_backend_t *const be = &ps_backend_cpu;

static void test_upsample(const char *c)
{
    char k[64];
#define K(s) (snprintf(k, sizeof k, "%s.%s", c, s), k)
    int32_t *cfg = I32(K("cfg"));
    int N = cfg[0], C = cfg[1], H = cfg[2], W = cfg[3], P = cfg[4], Q = cfg[5];
    size_t nl = (size_t)N * C * P * Q, nt = (size_t)N * C * H * W;
    float *out = malloc(nl * 4), *dlat = malloc(nl * 4), *dtop = malloc(nt * 4);
    be->upsample_add_forward(&ctx, out, F32(K("lat")), F32(K("top")), N, C, H, W, P, Q);
    allclose(out, F32(K("out")), (long)nl, 0, 0, c);
    be->upsample_add_backward(&ctx, dlat, dtop, F32(K("dout")), N, C, H, W, P, Q);
    allclose(dlat, F32(K("dlat")), (long)nl, 0, 0, "dlateral");
    allclose(dtop, F32(K("dtop")), (long)nt, 1e-6, 1e-6, "dtop");
    /* in place: out aliases lateral */
    memcpy(out, F32(K("lat")), nl * 4);
    be->upsample_add_forward(&ctx, out, out, F32(K("top")), N, C, H, W, P, Q);
    allclose(out, F32(K("out")), (long)nl, 0, 0, "in place (out == lateral)");
    be->upsample_add_backward(&ctx, NULL, dtop, F32(K("dout")), N, C, H, W, P, Q);
    allclose(dtop, F32(K("dtop")), (long)nt, 1e-6, 1e-6, "dtop with dlateral NULL");
    free(out), free(dlat), free(dtop);
#undef K
}

static void test_focal(void)
{
    int32_t *cfg = I32("focal.cfg");
    int A = cfg[0], K = cfg[1], norm = cfg[2];
    float *x = F32("focal.logits");
    int32_t *lab = I32("focal.labels");
    is_int(be->count_pos(&ctx, lab, A), norm, "focal: positives = normaliser");
    float loss;
    is_int(be->focal_forward(&ctx, &loss, x, lab, 0.25f, 2.0f, (float)norm, A, K), 0,
           "focal forward rc");
    is_close(loss, F32("focal.loss")[0], 0, 1e-6, "focal loss vs torchvision");
    float *dx = malloc((size_t)A * K * 4);
    for (int i = 0; i < A * K; i++) dx[i] = NAN; /* overwritten, ignored rows too */
    be->focal_backward(&ctx, dx, x, lab, F32("focal.dloss")[0], 0.25f, 2.0f, (float)norm, A, K);
    allclose(dx, F32("focal.dlogits"), (long)A * K, 1e-7, 1e-5, "focal dlogits vs autograd");

    /* finite differences of the loss, in double around float inputs */
    float *xp = malloc((size_t)A * K * 4);
    memcpy(xp, x, (size_t)A * K * 4);
    be->focal_backward(&ctx, dx, x, lab, 1.0f, 0.25f, 2.0f, (float)norm, A, K);
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < A * K; i++) {
        if (fabsf(x[i]) > 8) continue; /* saturated: derivative ~ 0, FD meaningless in float */
        float h = 1e-2f, lp, lm;
        xp[i] = x[i] + h;
        be->focal_forward(&ctx, &lp, xp, lab, 0.25f, 2.0f, (float)norm, A, K);
        xp[i] = x[i] - h;
        be->focal_forward(&ctx, &lm, xp, lab, 0.25f, 2.0f, (float)norm, A, K);
        xp[i] = x[i];
        double fd = ((double)lp - lm) / (2.0 * h), e = fabs(fd - dx[i]);
        if (e > worst) worst = e;
        if (e > 2e-4 + 2e-3 * fabs(fd)) bad++;
    }
    ok(bad == 0, "focal gradient vs central differences (%d bad, worst abs err %.2g)", bad, worst);

    /* stability: huge logits stay finite */
    float big[4] = {1e4f, -1e4f, 80.0f, -80.0f}, l2, d2[4];
    int32_t lb[2] = {1, 0};
    be->focal_forward(&ctx, &l2, big, lb, 0.25f, 2.0f, 1.0f, 2, 2);
    be->focal_backward(&ctx, d2, big, lb, 1.0f, 0.25f, 2.0f, 1.0f, 2, 2);
    ok(isfinite(l2) && isfinite(d2[0]) && isfinite(d2[1]) && isfinite(d2[2]) && isfinite(d2[3]),
       "focal: |logit| 1e4 gives finite loss %g and gradients", l2);
    /* closed form: x = 0, positive: 0.25 * 0.5^2 * log 2 */
    float z = 0, lz;
    int32_t one = 1;
    be->focal_forward(&ctx, &lz, &z, &one, 0.25f, 2.0f, 1.0f, 1, 1);
    is_close(lz, 0.25 * 0.25 * log(2.0), 0, 1e-6, "focal closed form at x=0");
    int32_t badl[2] = {1, 7};
    is_int(be->focal_forward(&ctx, &l2, big, badl, 0.25f, 2.0f, 1.0f, 2, 2), PS_EINVAL,
           "focal: label > K rejected");
    ok(isnan(l2), "focal: rejected labels give NaN loss");
    free(dx), free(xp);
}

static void test_smoothl1(void)
{
    int32_t *cfg = I32("sl1.cfg");
    int A = cfg[0], norm = cfg[1];
    float *p = F32("sl1.pred"), *t = F32("sl1.target");
    int32_t *lab = I32("sl1.labels");
    const float beta = 1.0f / 9;
    float loss;
    be->smoothl1_forward(&ctx, &loss, p, t, lab, beta, (float)norm, A);
    is_close(loss, F32("sl1.loss")[0], 0, 1e-6, "smooth-L1 loss vs torch");
    float *dp = malloc((size_t)A * 16), *pp = malloc((size_t)A * 16);
    for (int i = 0; i < A * 4; i++) dp[i] = NAN;
    be->smoothl1_backward(&ctx, dp, p, t, lab, F32("sl1.dloss")[0], beta, (float)norm, A);
    allclose(dp, F32("sl1.dpred"), (long)A * 4, 1e-7, 1e-5, "smooth-L1 dpred vs autograd");
    be->smoothl1_backward(&ctx, dp, p, t, lab, 1.0f, beta, (float)norm, A);
    memcpy(pp, p, (size_t)A * 16);
    int bad = 0, n = 0;
    for (int i = 0; i < A * 4; i++) {
        float h = 1e-3f, lp, lm, d = fabsf(p[i] - t[i]);
        if (fabsf(d - beta) < 3 * h) continue; /* the kink */
        pp[i] = p[i] + h;
        be->smoothl1_forward(&ctx, &lp, pp, t, lab, beta, (float)norm, A);
        pp[i] = p[i] - h;
        be->smoothl1_forward(&ctx, &lm, pp, t, lab, beta, (float)norm, A);
        pp[i] = p[i];
        double fd = ((double)lp - lm) / (2.0 * h);
        if (fabs(fd - dp[i]) > 1e-3 + 1e-2 * fabs(fd)) bad++;
        n++;
    }
    ok(bad == 0 && n > A * 3, "smooth-L1 gradient vs central differences (%d of %d bad)", bad, n);
    free(dp), free(pp);
}

static void test_anchors(void)
{
    for (int l = 0; l < 3; l++) {
        char k[64];
        snprintf(k, sizeof k, "anchors%d.cfg", l);
        int32_t *cfg = I32(k);
        int stride = cfg[0], H = cfg[1], W = cfg[2];
        float sizes[3], cell[36];
        ps_det_retina_sizes(sizes, stride);
        snprintf(k, sizeof k, "anchors%d.sizes", l);
        allclose(sizes, F32(k), 3, 0, 0, "anchor sizes 4*stride*2^(i/3)");
        ps_det_cell_anchors(cell, sizes, 3, ps_det_retina_ratios, 3);
        float *an = malloc((size_t)H * W * 9 * 16);
        ps_det_grid_anchors(an, cell, 9, H, W, stride);
        snprintf(k, sizeof k, "anchors%d.out", l);
        is_int(NUMEL(k), H * W * 9 * 4, "anchor count level %d", l);
        allclose(an, F32(k), (long)H * W * 36, 0, 0, "anchors vs torchvision AnchorGenerator");
        free(an);
    }
}

static void test_anchor_ties(void)
{
    float cell[36], an[2 * 3 * 9 * 4];
    ps_det_cell_anchors(cell, F32("anchors_tie.sizes"), 3, F32("anchors_tie.ratios"), 3);
    ps_det_grid_anchors(an, cell, 9, 2, 3, 4);
    allclose(an, F32("anchors_tie.out"), 2 * 3 * 9 * 4, 0, 0,
             "anchors with .5 corners: round half to even as torch.round");
}

static void test_coding(void)
{
    int n = NUMEL("code.anchors") / 4;
    float *o = malloc((size_t)n * 16);
    ps_det_box_encode(o, F32("code.gt"), F32("code.anchors"), n);
    allclose(o, F32("code.enc"), n * 4, 1e-6, 1e-5, "box encode vs BoxCoder");
    ps_det_box_decode(o, F32("code.deltas"), F32("code.anchors"), n);
    allclose(o, F32("code.dec"), n * 4, 1e-4, 1e-6, "box decode (with dw/dh clamp) vs BoxCoder");
    memcpy(o, F32("code.clipin"), (size_t)n * 16);
    ps_det_box_clip(o, n, 70, 80);
    allclose(o, F32("code.clip"), n * 4, 0, 0, "clip_boxes_to_image");
    /* round trip */
    float *d = malloc((size_t)n * 16);
    ps_det_box_encode(d, F32("code.gt"), F32("code.anchors"), n);
    ps_det_box_decode(o, d, F32("code.anchors"), n);
    allclose(o, F32("code.gt"), n * 4, 1e-3, 1e-5, "decode(encode(gt)) == gt");
    free(o), free(d);
}

static void test_iou_assign(void)
{
    int M = NUMEL("iou.a") / 4, N = NUMEL("iou.b") / 4;
    float *iou = malloc((size_t)M * N * 4);
    ps_det_box_iou(iou, F32("iou.a"), M, F32("iou.b"), N);
    allclose(iou, F32("iou.out"), M * N, 1e-7, 1e-6, "IoU matrix vs box_iou");
    free(iou);

    int A = NUMEL("assign.anchors") / 4, G = NUMEL("assign.gt") / 4;
    int32_t *m = malloc((size_t)A * 4), *lab = malloc((size_t)A * 4);
    float *bt = malloc((size_t)A * 16);
    int npos = ps_det_assign(m, F32("assign.anchors"), A, F32("assign.gt"), G, 0.5f, 0.4f, NULL);
    int32_t *want = I32("assign.matched");
    int diff = 0, wpos = 0, nbetween = 0;
    for (int a = 0; a < A; a++) {
        diff += m[a] != want[a];
        wpos += want[a] >= 0;
        nbetween += want[a] == -2;
    }
    ok(diff == 0, "assignment vs torchvision Matcher (%d of %d anchors differ)", diff, A);
    is_int(npos, wpos, "assignment positives");
    ok(wpos >= G && nbetween > 0, "assignment case is non-trivial (%d pos, %d ignored)", wpos, nbetween);
    int np2 = ps_det_make_targets(lab, bt, m, F32("assign.anchors"), A, F32("assign.gt"),
                                  I32("assign.gt_cls"), G, 4);
    is_int(np2, wpos, "make_targets positives");
    int32_t *wl = I32("assign.labels");
    diff = 0;
    for (int a = 0; a < A; a++) diff += lab[a] != wl[a];
    ok(diff == 0, "labels (-1 ignore / 0 bg / class+1) (%d differ)", diff);
    allclose(bt, F32("assign.box_targets"), A * 4, 1e-6, 1e-5, "box targets");
    int32_t badcls[1] = {4};
    is_int(ps_det_make_targets(lab, bt, m, F32("assign.anchors"), A, F32("assign.gt"), badcls, 1, 4),
           PS_EINVAL, "make_targets: class >= K rejected");
    /* documented deviation: a GT overlapping no anchor adds no low-quality matches */
    float far[4] = {5000, 5000, 5010, 5010};
    npos = ps_det_assign(m, F32("assign.anchors"), A, far, 1, 0.5f, 0.4f, NULL);
    is_int(npos, 0, "GT overlapping no anchor: no positives");
    is_int(ps_det_assign(m, F32("assign.anchors"), A, far, 0, 0.5f, 0.4f, NULL), 0, "no GT: no positives");
    ok(m[0] == PS_DET_BELOW && m[A - 1] == PS_DET_BELOW, "no GT: all negative");
    free(m), free(lab), free(bt);
}

static void test_nms(void)
{
    int n = NUMEL("nms.scores");
    int32_t *keep = malloc((size_t)n * 4);
    int nk = ps_det_nms(keep, F32("nms.boxes"), F32("nms.scores"), n, 0.5f);
    int wn = NUMEL("nms.keep");
    is_int(nk, wn, "nms: kept count");
    ok(nk == wn && !memcmp(keep, I32("nms.keep"), (size_t)wn * 4), "nms: keep indices == torchvision");
    ok(nk < n * 3 / 4, "nms case suppresses (%d of %d kept)", nk, n);
    nk = ps_det_batched_nms(keep, F32("nms.boxes"), F32("nms.scores"), I32("nms.labels"), n, 0.5f);
    wn = NUMEL("nms.bkeep");
    is_int(nk, wn, "batched nms: kept count");
    ok(nk == wn && !memcmp(keep, I32("nms.bkeep"), (size_t)wn * 4), "batched nms: keep indices");
    free(keep);
}

static void test_post(const char *name, int min_det, int max_det)
{
    char k[64], p[16];
    snprintf(p, sizeof p, "%s.", name);
#define K(s) (snprintf(k, sizeof k, "%s%s", p, s), k)
    int32_t *cfg = I32(K("cfg"));
    int H = cfg[0], W = cfg[1], Kc = cfg[2], L = cfg[4];
    const float *lg[4], *dl[4], *an[4];
    int A[4];
    for (int l = 0; l < L; l++) {
        char s[32];
        snprintf(s, sizeof s, "anchors%d", l);
        an[l] = F32(K(s));
        A[l] = NUMEL(k) / 4;
        snprintf(s, sizeof s, "logits%d", l);
        lg[l] = F32(K(s));
        snprintf(s, sizeof s, "deltas%d", l);
        dl[l] = F32(K(s));
    }
    ps_det_post_params_t pp;
    ps_det_post_defaults(&pp);
    pp.topk = cfg[3];
    float boxes[400], scores[100];
    int32_t labels[100];
    int n = ps_det_postprocess(boxes, scores, labels, lg, dl, an, A, L, Kc, H, W, &pp);
    int wn = NUMEL(K("scores"));
    is_int(n, wn, "post-processing (%s, topk %d): detections", name, cfg[3]);
    if (n == wn && n > 0) {
        allclose(scores, F32(K("scores")), n, 0, 1e-6, "post: scores");
        allclose(boxes, F32(K("boxes")), n * 4, 1e-4, 1e-5, "post: boxes");
        ok(!memcmp(labels, I32(K("labels")), (size_t)n * 4), "post: labels");
    }
    ok(wn >= min_det && wn <= max_det, "post case non-trivial (%d detections)", wn);
    float lo = 1;
    for (int i = 0; i < wn; i++) lo = fminf(lo, F32(K("scores"))[i]);
    diag("%s: lowest kept score %.3f", name, lo);
#undef K
}

static void test_permute(void)
{
    enum { nA = 3, D = 2, H = 2, W = 3 };
    float in[nA * D * H * W], out[nA * D * H * W], back[nA * D * H * W];
    for (int i = 0; i < nA * D * H * W; i++) in[i] = (float)i;
    be->head_permute_forward(&ctx, out, in, nA, D, H, W);
    /* out row (y, x, a), column d = in channel a*D+d at (y, x) */
    is_close(out[((1 * W + 2) * nA + 2) * D + 1], in[(2 * D + 1) * H * W + 1 * W + 2], 0, 0,
             "permute: (y=1,x=2,a=2,d=1)");
    be->head_permute_backward(&ctx, back, out, nA, D, H, W);
    allclose(back, in, nA * D * H * W, 0, 0, "permute backward inverts forward");
}

int main(void)
{
    if (ps_engine_init(&ctx, 1)) return 1;
    golden_load_or_bail("tests/golden/det_golden.bin", 256);
    test_upsample("up2x");
    test_upsample("upodd");
    test_focal();
    test_smoothl1();
    test_anchors();
    test_anchor_ties();
    test_coding();
    test_iou_assign();
    test_nms();
    test_post("post1000", 100, 100);
    test_post("post60", 20, 100);
    test_post("postlow", 5, 99); /* < max_det: the score threshold decides */
    test_permute();
    return tap_done();
}
