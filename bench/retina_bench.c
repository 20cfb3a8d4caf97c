/* Training-step benchmark of RetinaNet-FPN on the CPU engine (the
 * throughput of the detector training step): ResNet-18 / -50 backbone with
 * frozen BN and conv1 + layer1 frozen, FPN 256, 9 anchors, 80 classes; a
 * real per-anchor assignment (two GT boxes per image through
 * ps_det_assign) so the losses see positives; forward and backward timed
 * separately, median of N steps, images/s.
 *
 *   retina_bench [-t threads] [-s steps] [-w warmup] [-n images] [-H size] [-d depth] [-K classes]
 *                [-W width] [-F fpn_channels] [-z freeze_at]
 *
 * -W / -F / -z: the narrow from-scratch configuration of the acceptance run
 * (docs/detection.md) instead of torchvision's 64 / 256 / 2.
 *
 * Lines starting with "RESULT" are machine-readable.  Figures mean
 * something only on an otherwise idle machine. */
#include "worker/det/det_boxes.h"
#include "worker/engine/ps_blas.h"
#include "worker/models/ps_retinanet.h"

#include "bench/bench_kernels.h"
#include "bench/bench_util.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_width = 64, g_fpn = 256, g_freeze = 2;

static int bench(ps_ctx_t *ctx, int depth, int n, int H, int K, int steps, int warmup)
{
    ps_retina_config_t cfg;
    ps_retina_config_default(&cfg);
    cfg.depth = depth;
    cfg.num_classes = K;
    cfg.width = g_width;
    cfg.fpn_channels = g_fpn;
    cfg.freeze_at = g_freeze;
    ps_retina_t *m = NULL;
    if (ps_retina_create(&m, &cfg, &ps_backend_cpu, ctx, n, H, H)) return 1;
    ps_retina_init(m, 1, 0);
    int A = ps_retina_num_anchors(m);
    size_t nx = (size_t)n * 3 * H * H, rows = (size_t)n * A;
    float *x = malloc(nx * sizeof *x), *box = calloc(rows * 4, sizeof *box);
    int32_t *lab = malloc(rows * sizeof *lab), *matched = malloc(A * sizeof *matched);
    double *tf = malloc(steps * sizeof *tf), *tb = malloc(steps * sizeof *tb);
    double *ts = malloc(steps * sizeof *ts);
    if (!x || !box || !lab || !matched || !tf || !tb || !ts) return 1;
    ps_model_hash_fill(x, nx, "input", 1, 1.0);
    float s = (float)H;
    float gt[8] = {0.1f * s, 0.1f * s, 0.5f * s, 0.45f * s, 0.4f * s, 0.3f * s, 0.9f * s, 0.95f * s};
    int32_t gcls[2] = {0, K > 1 ? 1 : 0};
    for (int i = 0; i < n; i++) {
        ps_det_assign(matched, ps_retina_anchors(m), A, gt, 2, 0.5f, 0.4f, NULL);
        ps_det_make_targets(lab + (size_t)i * A, box + (size_t)i * A * 4, matched,
                            ps_retina_anchors(m), A, gt, gcls, 2, K);
    }
    float lc = 0, lb = 0;
    for (int st = -warmup; st < steps; st++) {
        ps_retina_zero_grad(m);
        double t0 = bench_now();
        ps_retina_forward(m, x, n, lab, box, 1, &lc, &lb);
        double t1 = bench_now();
        ps_retina_backward(m);
        double t2 = bench_now();
        if (st >= 0) {
            tf[st] = t1 - t0;
            tb[st] = t2 - t1;
            ts[st] = t2 - t0;
        }
    }
    double mf = bench_median(tf, steps), mb = bench_median(tb, steps);
    double ms = bench_median(ts, steps);
    double ff, fb;
    ps_retina_flops(m, n, &ff, &fb);
    printf("RetinaNet-ResNet-%d-FPN (width %d, FPN %d, freeze_at %d) %dx3x%dx%d, %d anchors/image, K %d: fwd %.1f ms, bwd %.1f "
           "ms, step %.1f ms, %.2f images/s, %.1f GFLOP/step, %.1f GFLOP/s (loss %.3f + "
           "%.3f)\n", depth, g_width, g_fpn, g_freeze, n, H, H, A, K, mf * 1e3, mb * 1e3, ms * 1e3, n / ms,
           (ff + fb) * 1e-9, (ff + fb) / ms * 1e-9, lc, lb);
    printf("RESULT impl=c model=retinanet depth=%d width=%d fpn=%d images=%d size=%d fwd_ms=%.2f bwd_ms=%.2f "
           "step_ms=%.2f images_per_s=%.3f gflop_step=%.3f gflops=%.2f\n", depth, g_width, g_fpn, n, H,
           mf * 1e3, mb * 1e3, ms * 1e3, n / ms, (ff + fb) * 1e-9, (ff + fb) / ms * 1e-9);
    fflush(stdout);
    free(x), free(box), free(lab), free(matched), free(tf), free(tb), free(ts);
    ps_retina_destroy(&m);
    return 0;
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv); /* may re-exec with a better OpenBLAS core */
    int threads = 2, steps = 5, warmup = 1, n = 2, H = 256, depth = 0, K = 80, opt;
    while ((opt = getopt(argc, argv, "t:s:w:n:H:d:K:W:F:z:")) != -1) {
        switch (opt) {
        case 't': threads = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 'n': n = atoi(optarg); break;
        case 'H': H = atoi(optarg); break;
        case 'd': depth = atoi(optarg); break;
        case 'K': K = atoi(optarg); break;
        case 'W': g_width = atoi(optarg); break;
        case 'F': g_fpn = atoi(optarg); break;
        case 'z': g_freeze = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: retina_bench [-t threads] [-s steps] [-w warmup] "
                            "[-n images] [-H size] [-d depth (0 = 18 and 50)] [-K classes] "
                            "[-W width] [-F fpn] [-z freeze_at]\n");
            return 2;
        }
    }
    if (steps < 1 || warmup < 0 || n < 1 || H < 32 || K < 1 || g_width < 8 || g_fpn < 8 || g_freeze < 0 || g_freeze > 5) return 2;
    ps_log_level = PS_LOG_WARN;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, threads);
    bench_print_cpu(stdout);
    printf("OpenBLAS core %s, %d threads\n", ps_blas_corename(), ctx.nthreads);
    int rc = 0;
    if (depth == 0 || depth == 18) rc |= bench(&ctx, 18, n, H, K, steps, warmup);
    if (depth == 0 || depth == 50) rc |= bench(&ctx, 50, n, H, K, steps, warmup);
    if (depth == 34) rc |= bench(&ctx, 34, n, H, K, steps, warmup);
    bench_print_conv_kernels(stdout, 0);
    ps_ctx_free(&ctx);
    return rc;
}
