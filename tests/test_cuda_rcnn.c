/* The two-stage detectors' slots of the CUDA table (worker/engine/cuda/
 * roi_align.cu) against the CPU table's (worker/engine/layers/roi_align.c,
 * itself checked against torchvision by tests/test_roi_align): RoIAlign
 * forward and backward on boxes inside, off, tiny and huge, fixed and
 * adaptive sampling, aligned both ways, several images, the detector's
 * shape (7 x 7, sampling 2, hundreds of RoIs).  Outputs are poisoned with
 * NaN first, so an element a kernel forgot shows up.  Exits 77 without a
 * GPU.
 *
 * Tolerances: forward exact (the kernel spells out the CPU's float
 * operations); backward 1e-6 x max|ref| + 1e-5 |ref| (atomic scatter-adds
 * in another order than the CPU's sequential ones: float rounding only).
 *
 * Then a whole Faster R-CNN-R18-FPN training step (width 16, FPN 32, 2
 * images of 128 x 128, nothing frozen) on the CUDA table against the CPU
 * table: the box heads on the same proposals (the CPU RPN's, given to
 * both, so a proposal kept on one side and dropped on the other cannot
 * change the RoIs), the four losses (1e-4 relative), the RPN and box head
 * outputs (1e-4 x max|ref| + 1e-4 |ref|), every trainable gradient (2e-3 x
 * its max + 1e-3 |ref|: cuDNN / cuBLAS sum in other orders, ~30 layers;
 * bench/gpu_bench.c's fp32 tolerances), then the CUDA model's own
 * proposals and detections (inference) against the CPU's as sets.  Mask R-CNN's deconv
 * and mask loss against the CPU's too (test_mask_layers). */
#include "tests/lib/cuda_testutil.h"
#include "tests/lib/tap.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#include "worker/det/det_boxes.h"
#include "worker/engine/ps_engine.h"
#include "worker/models/ps_rcnn.h"
#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>

static ps_ctx_t g, c; /* the CUDA backend's context, the CPU's */

static void *dev(const void *h, size_t bytes) { return cu_upload(h, bytes); }
static float *down(const void *d, size_t n) { return cu_download(&g, d, n); }

/* R random RoIs over a (16/scale)-pixel image: a mix of ordinary, off-map,
 * tiny and huge boxes on N images */
static float *make_rois(int R, int N, float img)
{
    float *r = malloc((size_t)R * 5 * sizeof *r);
    for (int i = 0; i < R; i++) {
        float *b = r + 5 * i, cx = (frand() * 0.75f + 0.5f) * img, cy = (frand() * 0.75f + 0.5f) * img;
        float side = i % 4 == 0 ? 0.3f : i % 4 == 1 ? img * 3 : (frand() + 1.2f) * img * 0.3f;
        b[0] = (float)(i % N);
        b[1] = cx - side * (0.5f + 0.2f * frand());
        b[2] = cy - side * (0.5f + 0.2f * frand());
        b[3] = cx + side * (0.5f + 0.2f * frand());
        b[4] = cy + side * (0.5f + 0.2f * frand());
    }
    return r;
}

static void test_roi_align(int R, int N, int C, int H, int W, int PH, int PW, float scale,
                           int sr, int aligned)
{
    char what[160];
    size_t nf = (size_t)N * C * H * W, no = (size_t)R * C * PH * PW;
    float *f = hrand(nf, 1, 0), *dy = hrand(no, 1, 0), *rois = make_rois(R, N, H / scale);
    float *y = hnan(no), *dx = calloc(nf, sizeof *dx), *poison = hnan(no);
    ps_backend_cpu.roi_align_forward(&c, y, f, rois, R, N, C, H, W, PH, PW, scale, sr, aligned);
    ps_backend_cpu.roi_align_backward(&c, dx, dy, rois, R, N, C, H, W, PH, PW, scale, sr,
                                      aligned);
    float *df = dev(f, nf * 4), *ddy = dev(dy, no * 4), *drois = dev(rois, (size_t)R * 20);
    float *dyo = dev(poison, no * 4), *ddx = dev(dx, nf * 4); /* backward accumulates: 2 x */
    ps_backend_cuda.roi_align_forward(&g, dyo, df, drois, R, N, C, H, W, PH, PW, scale, sr,
                                      aligned);
    ps_backend_cuda.roi_align_backward(&g, ddx, ddy, drois, R, N, C, H, W, PH, PW, scale, sr,
                                       aligned);
    float *gy = down(dyo, no), *gdx = down(ddx, nf);
    for (size_t i = 0; i < nf; i++) dx[i] *= 2;
    snprintf(what, sizeof what, "roi_align R=%d N=%d C=%d %dx%d -> %dx%d sampling %d aligned %d",
             R, N, C, H, W, PH, PW, sr, aligned);
    cmp_report(gy, y, no, 0, 0, what);
    snprintf(what, sizeof what, "roi_align backward (accumulated twice) R=%d sampling %d "
             "aligned %d", R, sr, aligned);
    cmp_report(gdx, dx, nf, 1e-6 * maxabs(dx, nf), 1e-5, what);
    ps_cuda_free(df), ps_cuda_free(ddy), ps_cuda_free(drois), ps_cuda_free(dyo), ps_cuda_free(ddx);
    free(f), free(dy), free(rois), free(y), free(dx), free(poison), free(gy), free(gdx);
}

/* Mask R-CNN's deconv (2 x 2 stride 2 and 3 x 3 stride 3) and mask loss:
 * CUDA vs CPU.  The deconv kernels sum in float in another order than the
 * CPU's GEMM (1e-5 relative to the largest); the loss to 1e-6 relative
 * (per-block double sums), its gradient to float rounding. */
static void test_mask_layers(int N, int C, int K, int H, int W, int sd)
{
    size_t ni = (size_t)N * C * H * W, no = (size_t)N * K * H * W * sd * sd;
    size_t nw = (size_t)C * K * sd * sd;
    float *x = hrand(ni, 1, 0), *w = hrand(nw, 1, 0), *b = hrand(K, 1, 0), *dy = hrand(no, 1, 0);
    float *y = hnan(no), *dx = hnan(ni), *dw = hrand(nw, 1, 0), *db = hrand(K, 1, 0);
    float *dx_, *x_ = dev(x, ni * 4), *w_ = dev(w, nw * 4), *b_ = dev(b, K * 4);
    float *dy_ = dev(dy, no * 4), *y_ = dev(y, no * 4), *dw_ = dev(dw, nw * 4), *db_ = dev(db, K * 4);
    dx_ = dev(dx, ni * 4);
    ps_backend_cpu.deconv_forward(&c, y, x, w, b, N, C, K, H, W, sd);
    ps_backend_cpu.deconv_backward(&c, dx, dw, db, dy, x, w, N, C, K, H, W, sd);
    ps_backend_cuda.deconv_forward(&g, y_, x_, w_, b_, N, C, K, H, W, sd);
    ps_backend_cuda.deconv_backward(&g, dx_, dw_, db_, dy_, x_, w_, N, C, K, H, W, sd);
    float *gy = down(y_, no), *gdx = down(dx_, ni), *gdw = down(dw_, nw), *gdb = down(db_, K);
    char what[128];
    snprintf(what, sizeof what, "deconv N=%d C=%d K=%d %dx%d stride %d forward", N, C, K, H, W, sd);
    cmp_report(gy, y, no, 1e-5 * maxabs(y, no), 1e-5, what);
    snprintf(what, sizeof what, "deconv stride %d input gradient", sd);
    cmp_report(gdx, dx, ni, 1e-5 * maxabs(dx, ni), 1e-5, what);
    snprintf(what, sizeof what, "deconv stride %d weight gradient (accumulated)", sd);
    cmp_report(gdw, dw, nw, 1e-5 * maxabs(dw, nw), 1e-5, what);
    snprintf(what, sizeof what, "deconv stride %d bias gradient (accumulated)", sd);
    cmp_report(gdb, db, K, 1e-5 * maxabs(db, K), 1e-5, what);
    ps_cuda_free(x_), ps_cuda_free(w_), ps_cuda_free(b_), ps_cuda_free(dy_), ps_cuda_free(y_);
    ps_cuda_free(dx_), ps_cuda_free(dw_), ps_cuda_free(db_);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
    free(gy), free(gdx), free(gdw), free(gdb);

    /* the mask loss on the predictor's shape: R rows, K + 1 channels of 28 x 28 */
    int R = N * 16, K1 = K + 1, MM = 28 * 28;
    size_t nl = (size_t)R * K1 * MM;
    float *lg = hrand(nl, 4, 0), *t = hrand((size_t)R * MM, 0.5f, 0.5f), *dl = hnan(nl);
    int32_t *lab = malloc(sizeof(int32_t) * R);
    for (int r = 0; r < R; r++) lab[r] = r % K1;
    float lc = NAN, lgpu = NAN;
    float *lg_ = dev(lg, nl * 4), *t_ = dev(t, (size_t)R * MM * 4), *dl_ = dev(dl, nl * 4);
    int32_t *lab_ = dev(lab, (size_t)R * 4);
    ps_backend_cpu.mask_bce_forward(&c, &lc, lg, lab, t, (float)R * MM, R, K1, MM);
    ps_backend_cpu.mask_bce_backward(&c, dl, lg, lab, t, 1.0f, (float)R * MM, R, K1, MM);
    is_int(ps_backend_cuda.mask_bce_forward(&g, &lgpu, lg_, lab_, t_, (float)R * MM, R, K1, MM), 0,
           "mask loss (cuda) accepts");
    ps_backend_cuda.mask_bce_backward(&g, dl_, lg_, lab_, t_, 1.0f, (float)R * MM, R, K1, MM);
    is_close(lgpu, lc, 0, 1e-6, "mask loss R=%d K+1=%d: cuda %.9g vs cpu %.9g", R, K1, lgpu, lc);
    float *gdl = down(dl_, nl);
    cmp_report(gdl, dl, nl, 1e-6 * maxabs(dl, nl), 1e-6, "mask loss gradient");
    lab[R - 1] = K1;
    ps_cuda_free(lab_);
    lab_ = dev(lab, (size_t)R * 4);
    is_int(ps_backend_cuda.mask_bce_forward(&g, &lgpu, lg_, lab_, t_, 1.0f, R, K1, MM), PS_EINVAL,
           "mask loss (cuda): a label of K+1 channels refused");
    float *sc = dev(lg, nl * 4);
    ps_backend_cuda.scale(&g, sc, 1.0f / 3.0f, nl);
    ps_backend_cpu.scale(&c, lg, 1.0f / 3.0f, nl);
    float *gsc = down(sc, nl);
    cmp_report(gsc, lg, nl, 0, 0, "scale by 1/3 (Cascade R-CNN)");
    ps_cuda_free(sc), free(gsc);
    ps_cuda_free(lg_), ps_cuda_free(t_), ps_cuda_free(dl_), ps_cuda_free(lab_);
    free(lg), free(t), free(dl), free(lab), free(gdl);
}

static double excess(const float *a, const float *b, size_t n, double atol, double rtol,
                     double *maxerr)
{
    double worst = 0;
    *maxerr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) d = INFINITY;
        if (d > *maxerr) *maxerr = d;
        double e = d - (atol + rtol * fabs((double)b[i]));
        if (e > worst) worst = e;
    }
    return worst;
}

static ps_rcnn_t *make_model(const ps_backend_t *be, ps_ctx_t *ctx, int n, int H)
{
    ps_rcnn_config_t c;
    ps_rcnn_config_default(&c);
    c.depth = 18;
    c.num_classes = 3;
    c.width = 16;
    c.fpn_channels = 32;
    c.freeze_at = 0;
    c.representation = 64;
    c.roi.batch = 128;
    c.rpn_train.pre_nms_top_n = c.rpn_train.post_nms_top_n = 200;
    c.rpn_test.pre_nms_top_n = c.rpn_test.post_nms_top_n = 100;
    c.post.score_thresh = 0.001f;
    c.max_gt = 4;
    ps_rcnn_t *m = NULL;
    if (ps_rcnn_create(&m, &c, be, ctx, n, H, H)) return NULL;
    ps_rcnn_init(m, 11, 1);
    return m;
}

static void test_model(void)
{
    enum { N = 2, H = 128, G = 4 };
    ps_rcnn_t *mc = make_model(&ps_backend_cpu, &c, N, H), *mg = NULL;
    if (!ps_cuda_use_managed_arena()) mg = make_model(&ps_backend_cuda, &g, N, H);
    ps_arena_set_allocator(NULL);
    if (!ok(mc && mg, "Faster R-CNN-R18-FPN built on both tables")) return;
    int A = ps_rcnn_num_anchors(mc), Rm = ps_rcnn_max_rois(mc);
    size_t nx = (size_t)N * 3 * H * H;
    float *x = malloc(nx * sizeof *x), *tgt = malloc(sizeof(float) * 4 * N * A);
    int32_t *lab = malloc(sizeof(int32_t) * N * A), *matched = malloc(sizeof(int32_t) * A);
    ps_model_hash_fill(x, nx, "input", 5, 0.25);
    float gt[N][G * 4] = {{8, 8, 60, 50, 70, 20, 120, 90, 30, 70, 80, 126},
                          {4, 60, 50, 124, 40, 10, 110, 70, 0, 0, 0, 0}};
    int32_t cls[N][G] = {{0, 2, 1}, {1, 0}}, ngt[N] = {3, 2};
    for (int i = 0; i < N; i++) {
        ps_det_assign(matched, ps_rcnn_anchors(mc), A, gt[i], ngt[i], 0.7f, 0.3f, NULL);
        ps_det_make_targets(lab + (size_t)i * A, tgt + (size_t)i * A * 4, matched,
                            ps_rcnn_anchors(mc), A, gt[i], cls[i], ngt[i], 3);
    }
    ps_rcnn_input_t in = {.images = x, .n = N, .rpn_labels = lab, .rpn_targets = tgt,
                          .gt_boxes = gt[0], .gt_classes = cls[0], .ngt = ngt, .gt_stride = G,
                          .seed = 99};
    /* the CPU RPN's proposals, given to both box heads */
    ps_rcnn_losses_t lc, lg;
    int rc = ps_rcnn_forward(mc, &in, &lc);
    float *props = malloc(sizeof(float) * 4 * N * 200);
    int32_t np[N];
    for (int i = 0; i < N; i++) {
        const float *p = ps_rcnn_proposals(mc, i, &np[i]);
        memcpy(props + (size_t)i * 200 * 4, p, sizeof(float) * 4 * np[i]);
    }
    in.proposals = props, in.nproposals = np, in.proposal_stride = 200;
    ps_rcnn_zero_grad(mc);
    ps_rcnn_zero_grad(mg);
    rc |= ps_rcnn_forward(mc, &in, &lc) | ps_rcnn_backward(mc);
    rc |= ps_rcnn_forward(mg, &in, &lg) | ps_rcnn_backward(mg) | ps_cuda_backend_sync(&g);
    is_int(rc, 0, "training step on both tables");
    const float vc[4] = {lc.objectness, lc.rpn_box, lc.classifier, lc.box_reg};
    const float vg[4] = {lg.objectness, lg.rpn_box, lg.classifier, lg.box_reg};
    static const char *ln[4] = {"objectness", "rpn_box_reg", "classifier", "box_reg"};
    for (int k = 0; k < 4; k++)
        ok(fabs(vg[k] - vc[k]) <= 1e-4 * fabs(vc[k]) + 1e-7, "loss %s: cpu %.7g cuda %.7g",
           ln[k], vc[k], vg[k]);
    double me = 0;
    const float *oc = ps_rcnn_objectness(mc), *og = ps_rcnn_objectness(mg);
    ok(excess(og, oc, (size_t)N * A, 1e-4 * maxabs(oc, (size_t)N * A), 1e-4, &me) <= 0,
       "RPN objectness (max err %.3g)", me);
    float *c1 = malloc(sizeof(float) * 16 * Rm), *c2 = malloc(sizeof(float) * 16 * Rm);
    int R1 = ps_rcnn_box_outputs(mc, NULL, NULL, NULL, NULL, c1);
    int R2 = ps_rcnn_box_outputs(mg, NULL, NULL, NULL, NULL, c2);
    ok(R1 == R2 && R1 > 0 &&
       excess(c2, c1, (size_t)R1 * 16, 1e-4 * maxabs(c1, (size_t)R1 * 16), 1e-4, &me) <= 0,
       "box head deltas on the same %d sampled RoIs (max err %.3g)", R1, me);
    int n1, n2, bad = 0;
    const ps_model_param_t *pc = ps_rcnn_params(mc, &n1), *pg = ps_rcnn_params(mg, &n2);
    for (int i = 0; i < n1 && n1 == n2; i++) {
        if (!pc[i].trainable) continue;
        double scale = maxabs(pc[i].g, pc[i].numel);
        if (excess(pg[i].g, pc[i].g, pc[i].numel, 2e-3 * scale + 1e-12, 1e-3, &me) > 0 &&
            ++bad <= 10)
            diag("%s: max err %.3g, max |ref| %.3g", pc[i].name, me, scale);
    }
    ok(n1 == n2 && bad == 0, "all %d parameter gradients", n1);
    /* inference on each side's own proposals */
    ps_rcnn_input_t ev = {.images = x, .n = N};
    rc = ps_rcnn_forward(mc, &ev, NULL) | ps_rcnn_forward(mg, &ev, NULL) | ps_cuda_backend_sync(&g);
    for (int i = 0; i < N && !rc; i++) {
        int k1, k2, match = 0;
        const float *p1 = ps_rcnn_proposals(mc, i, &k1), *p2 = ps_rcnn_proposals(mg, i, &k2);
        for (int a = 0; a < k1; a++)
            for (int b = 0; b < k2; b++) {
                int same = 1;
                for (int q = 0; q < 4; q++) same &= fabsf(p1[4 * a + q] - p2[4 * b + q]) <= 0.01f;
                if (same) {
                    match++;
                    break;
                }
            }
        ok(k1 == k2 && match >= k1 - 1, "image %d: inference proposals %d / %d, %d matched", i,
           k1, k2, match);
        float b1[400], b2[400], s1[100], s2[100];
        int32_t l1[100], l2[100];
        int d1 = ps_rcnn_detect(mc, i, b1, s1, l1), d2 = ps_rcnn_detect(mg, i, b2, s2, l2);
        ok(d1 > 0 && d1 == d2, "image %d: %d detections on the CPU, %d on CUDA", i, d1, d2);
    }
    free(x), free(tgt), free(lab), free(matched), free(props), free(c1), free(c2);
    ps_rcnn_destroy(&mg);
    ps_rcnn_destroy(&mc);
}

int main(void)
{
    if (ps_cuda_device_count() == 0) tap_skip_all("no CUDA device");
    ps_log_level = PS_LOG_WARN;
    if (ps_engine_init(&c, 1) || ps_engine_init(&g, 1) || ps_cuda_backend_init(&g, 0)) {
        printf("Bail out! cannot initialise the CUDA backend\n");
        return 1;
    }
    char info[256] = "";
    ps_cuda_open(0, info, sizeof info);
    diag("device %s", info);
    /*              R  N  C   H   W  PH PW scale  sr al */
    test_roi_align(40, 2, 3, 10, 12, 7, 7, 0.25f, 2, 0);
    test_roi_align(40, 2, 3, 10, 12, 7, 7, 0.25f, 0, 0);
    test_roi_align(40, 2, 3, 10, 12, 3, 5, 0.25f, 1, 1);
    test_roi_align(40, 2, 3, 10, 12, 7, 7, 0.25f, 0, 1);
    test_roi_align(1024, 4, 64, 32, 32, 7, 7, 0.25f, 2, 0); /* the detector's P2 */
    test_roi_align(300, 2, 256, 13, 17, 14, 14, 0.0625f, 2, 0); /* Mask R-CNN's 14 x 14 */
    test_mask_layers(3, 16, 8, 14, 14, 2); /* the mask predictor (reduced width) */
    test_mask_layers(2, 5, 3, 4, 3, 3);
    test_model();
    ps_cuda_backend_free(&g);
    ps_ctx_free(&g);
    ps_ctx_free(&c);
    return tap_done();
}
