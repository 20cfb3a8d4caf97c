/* GPU session driver (run by bench/gpu_check.sh; built only with CUDA).
 *
 *   gpu_bench check [-d depth] [-n clips] [-H size] [-b]
 *       The whole-model parity test: the same TSM-ResNet (default
 *       18, 2 clips x 8 frames x 64x64, same weights, input, labels and
 *       dropout seed) through the CPU and the CUDA backends; loss, logits
 *       and every parameter gradient compared.  -b: TSM's shift placement
 *       'block' (the identity shifted too) instead of 'blockres'.  TAP
 *       output, exit 1 on a mismatch, 77 without a GPU.
 *   gpu_bench rcheck [-d depth] [-n images] [-H size] [-K classes]
 *       RetinaNet-FPN (default R18 at the acceptance run's width, 2 images of
 *       128^2, 3 classes): one training step on the CPU and on CUDA, both
 *       losses, the raw outputs and every gradient compared (TAP).
 *   gpu_bench rtime [-d depth] [-n images] [-H size] [-K classes] [-s] [-w]
 *       RetinaNet-R50-FPN training step on the GPU (torchvision widths, 2 x
 *       512^2, 80 classes), images/s, every layer on the GPU (the CUDA
 *       table's detection slots, see "RetinaNet-FPN" below); then the loss
 *       layers alone, the CPU's vs the CUDA table's on the same outputs
 *       (compared, both timed).
 *   gpu_bench time [-d depth] [-n clips] [-H size] [-s steps] [-w warmup] [-z]
 *       Training-step timing on the GPU (default TSM-ResNet-50, 8 clips x 8
 *       frames x 224x224, fp32): median step, forward/backward split, clips/s,
 *       achieved TFLOP/s (from the layer shapes, ps_model_flops, and against
 *       the nominal ~194 GFLOP per clip) and the measured cuBLAS sgemm (fp32)
 *       and fp16 GemmEx peaks, device memory in use.  -z zeroes gradients
 *       every step (a host memset over managed memory: it migrates pages, so
 *       it is off by default; accumulating gradients costs the same FLOPs).
 *       Lines starting with RESULT are for gpu_check.sh.  PS_GPU_PROFILE=1:
 *       every backend call drained and timed, summed per layer kind and
 *       printed as a table (the split of a step, not its speed).
 *   -r (check, time): the model recomputes its stages in the backward
 *       (--recompute): check compares CUDA with recomputation against the
 *       CPU, time reports its step and memory (RESULT ... recompute=1
 *       arena_gib=: the model's arena, half the activations with half
 *       storage).
 *
 * The model is worker/models', written for host pointers: its
 * arena comes from managed memory (ps_cuda_use_managed_arena), so the
 * input/label memcpy at the start of each forward migrates those pages (a
 * few MB..40 MB per step) - the step time includes that; a device-aware
 * model input path removes it (docs/cuda.md).  -p fp16|bf16: conv and
 * linear on half operands, and every activation stored half NHWC unless
 * PS_CUDA_HALF_STORAGE=0 (ps_cuda_backend_set_precision); check compares
 * with the CPU fp32 step under wider tolerances (tols_of), time reports
 * TFLOP/s against the fp16 GemmEx peak. */
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#include "worker/models/ps_model.h"
#include "worker/models/ps_retinanet.h"
#include "worker/models/model_snap.h"
#include "worker/det/det_boxes.h"
#include "worker/engine/backend_half_round.h"

#include "bench/bench_util.h"
#include "bench/gemm_peak.h"
#include "bench/gpu_prof.h"
#include "ps_log.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int nchecks, nfailed;
static void check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int cond, const char *fmt, ...)
{
    va_list ap;
    nchecks++;
    nfailed += !cond;
    printf("%sok %d - ", cond ? "" : "not ", nchecks);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* worst |a-b| - (atol + rtol|b|); <= 0 means within tolerance */
static double excess(const float *a, const float *b, size_t n, double atol, double rtol,
                     double *maxerr)
{
    double worst = -INFINITY;
    *maxerr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) d = INFINITY;
        if (d > *maxerr) *maxerr = d;
        double e = d - (atol + rtol * fabs((double)b[i]));
        if (e > worst) worst = e;
    }
    return n ? worst : 0;
}

static double maxabs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

static int g_recompute; /* -r: the model recomputes its stages (--recompute) */

static void config(ps_model_config_t *c, int depth, int place)
{
    ps_model_config_default(c);
    c->depth = depth;
    c->shift_place = place;
    c->num_classes = 400;
    c->recompute = g_recompute;
}

/* Whole-model tolerances per precision: fp32 from the summation order
 * only; fp16 / bf16 add the operand rounding of every conv / linear (unit
 * roundoff 4.9e-4 / 3.9e-3) compounded over ~20 layers, so ~20x looser;
 * a wrong layout or cast still shows as O(1). */
typedef struct { double loss, logit, grad_a, grad_r, bn_a, bn_r; } tols_t;
static tols_t tols_of(ps_precision_t prec)
{
    if (prec == PS_PRECISION_FP16) return (tols_t){1e-2, 2e-2, 5e-2, 5e-2, 1e-3, 2e-2};
    if (prec == PS_PRECISION_BF16) return (tols_t){3e-2, 5e-2, 1e-1, 1e-1, 3e-3, 5e-2};
    return (tols_t){1e-4, 1e-4, 2e-3, 1e-3, 1e-5, 1e-4};
}

static int run_check(int depth, int clips, int HW, ps_precision_t prec, int place)
{
    const tols_t tl = tols_of(prec);
    /* half: the backend scales the loss (as psworker does) and the check
     * unscales, so the scaled path is part of what is compared */
    const float lscale = prec == PS_PRECISION_FP32 ? 1.0f : 1024.0f;
    ps_model_config_t cfg;
    config(&cfg, depth, place);
    ps_ctx_t cctx, gctx;
    ps_model_t *mc = NULL, *mg = NULL;
    if (ps_engine_init(&cctx, 0) || ps_engine_init(&gctx, 0) || ps_cuda_backend_init(&gctx, 0) ||
        ps_cuda_backend_set_precision(&gctx, prec) ||
        ps_cuda_backend_set_loss_scale(&gctx, lscale))
        return 1;
    /* CPU model first with host memory, then the GPU one with managed memory */
    if (ps_model_create(&mc, &cfg, &ps_backend_cpu, &cctx, clips, HW, HW)) return 1;
    if (ps_cuda_use_managed_arena() ||
        ps_model_create(&mg, &cfg, &ps_backend_cuda, &gctx, clips, HW, HW))
        return 1;
    ps_arena_set_allocator(NULL);
    ps_model_init(mc, 7, 1);
    ps_model_init(mg, 7, 1);
    ps_model_set_seed(mc, 99);
    ps_model_set_seed(mg, 99);
    const int T = cfg.n_segment, K = cfg.num_classes;
    const size_t nin = (size_t)clips * T * 3 * HW * HW;
    float *in = malloc(nin * sizeof *in);
    int32_t *lab = malloc(clips * sizeof *lab);
    ps_model_hash_fill(in, nin, "input", 5, 1.0);
    for (int i = 0; i < clips; i++) lab[i] = (int32_t)((i * 37 + 11) % K);
    printf("# TSM-ResNet-%d, %d clips x %d frames x %dx%d, CPU fp32 vs CUDA %s (loss scale %g, "
           "half storage of activations %s)\n", depth, clips, T, HW, HW, ps_precision_name(prec),
           (double)lscale, ps_cuda_backend_half_storage(&gctx) ? "on" : "off");
    float lc = NAN, lg = NAN;
    int rc = ps_model_forward(mc, in, clips, lab, 1, &lc) | ps_model_backward(mc);
    rc |= ps_model_forward(mg, in, clips, lab, 1, &lg) | ps_model_backward(mg);
    rc |= ps_cuda_backend_sync(&gctx);
    check(rc == 0, "forward + backward ran on both backends");
    /* half: the CPU rounding model (worker/engine/backend_half_round.h) says
     * what half storage costs inherently; each gradient's bound is derived
     * from it */
    ps_model_snap_t rs;
    memset(&rs, 0, sizeof rs);
    if (prec != PS_PRECISION_FP32) {
        ps_ctx_t rctx;
        ps_model_t *mr = NULL;
        float lr = NAN;
        int rrc = ps_engine_init(&rctx, 0) ||
                  ps_hround_init(&rctx, prec, lscale) ||
                  ps_model_create(&mr, &cfg, &ps_backend_cpu_round, &rctx, clips, HW, HW);
        if (!rrc) {
            ps_model_init(mr, 7, 1);
            ps_model_set_seed(mr, 99);
            rrc = ps_model_forward(mr, in, clips, lab, 1, &lr) | ps_model_backward(mr);
        }
        if (!rrc) rrc = ps_model_snap(&rs, mr, clips * K, lr, 1.0 / lscale);
        check(rrc == 0, "CPU rounding model (%s storage points) ran: loss %.7g",
              ps_precision_name(prec), lr);
        ps_model_destroy(&mr);
        ps_hround_free(&rctx);
        ps_ctx_free(&rctx);
    }
    check(fabs(lg - lc) <= tl.loss * fabs(lc), "loss: cpu %.7g cuda %.7g (rel %.2g, tol %g)", lc,
          lg, fabs(lg - lc) / fabs(lc), tl.loss);
    double me;
    const float *zc = ps_model_logits(mc), *zg = ps_model_logits(mg);
    double ex = excess(zg, zc, (size_t)clips * K, tl.logit * maxabs(zc, (size_t)clips * K),
                       tl.logit, &me);
    check(ex <= 0, "logits within atol %g*max|ref|, rtol %g (max err %.3g)", tl.logit, tl.logit,
          me);
    /* Gradients: deep fp32 chains with a different summation order in every
     * conv differ by ~1e-5..1e-4 relative; 2e-3 of each tensor's scale is
     * far below what a wrong kernel produces (O(1)). */
    int np = 0, np2 = 0, bad = 0;
    const ps_model_param_t *pc = ps_model_params(mc, &np), *pg = ps_model_params(mg, &np2);
    double worst_rel = 0, worst_r = 0;
    const char *worst_name = "";
    for (int i = 0, t = 0; i < np && np == np2; i++) {
        const double scale = maxabs(pc[i].g, pc[i].numel);
        for (size_t k = 0; lscale != 1.0f && k < pg[i].numel; k++) pg[i].g[k] /= lscale;
        ex = excess(pg[i].g, pc[i].g, pc[i].numel, tl.grad_a * scale + 1e-12, tl.grad_r, &me);
        const double rel = scale > 0 ? me / scale : me;
        if (prec != PS_PRECISION_FP32 && pc[i].trainable && t < rs.np &&
            rs.numel[t] == pc[i].numel) {
            /* half: max error of its scale within 2x the rounding model's
             * (two draws of the same rounding error) + 0.01 */
            double mr;
            excess(rs.g[t], pc[i].g, pc[i].numel, 0, 0, &mr);
            const double rel_r = scale > 0 ? mr / scale : mr;
            worst_r = rel_r > worst_r ? rel_r : worst_r;
            ex = rel - (2 * rel_r + 0.01);
        }
        if (pc[i].trainable) t++;
        if (rel > worst_rel) {
            worst_rel = rel;
            worst_name = pc[i].name;
        }
        if (ex > 0) {
            bad++;
            if (bad <= 10)
                printf("#   %s: max err %.3g, max |ref| %.3g\n", pc[i].name, me, scale);
        }
    }
    if (prec == PS_PRECISION_FP32)
        check(np == np2 && bad == 0, "all %d parameter gradients within atol %g*max|ref|, rtol "
              "%g (worst %s: %.3g of its scale)", np, tl.grad_a, tl.grad_r, worst_name,
              worst_rel);
    else
        check(np == np2 && bad == 0 && rs.np > 0, "all %d parameter gradients: max error within "
              "2x the CPU rounding model's + 0.01 of each tensor's scale (CUDA worst %s: %.3g; "
              "rounding model worst %.3g)", np, worst_name, worst_rel, worst_r);
    ps_model_snap_free(&rs);
    /* BN running statistics moved the same way */
    int nb = 0;
    const ps_model_buffer_t *bc = ps_model_buffers(mc, &nb), *bg = ps_model_buffers(mg, &nb);
    bad = 0;
    for (int i = 0; i < nb; i++)
        if (bc[i].f32 && excess(bg[i].f32, bc[i].f32, bc[i].numel, tl.bn_a, tl.bn_r, &me) > 0)
            bad++;
    check(bad == 0, "BN running statistics agree (%d buffers)", nb);
    ps_model_destroy(&mg);
    ps_model_destroy(&mc);
    ps_cuda_backend_free(&gctx);
    ps_ctx_free(&gctx);
    ps_ctx_free(&cctx);
    free(in);
    free(lab);
    printf("1..%d\n", nchecks);
    return nfailed ? 1 : 0;
}

static int run_time(int depth, int clips, int HW, int steps, int warm, int zero,
                    ps_precision_t prec)
{
    ps_model_config_t cfg;
    config(&cfg, depth, PS_MODEL_SHIFT_BLOCKRES);
    ps_ctx_t ctx;
    ps_model_t *m = NULL;
    char info[256] = "";
    if (ps_engine_init(&ctx, 0) || ps_cuda_backend_init(&ctx, 0) ||
        ps_cuda_backend_set_precision(&ctx, prec))
        return 1;
    ps_cuda_open(0, info, sizeof info);
    double pk32 = 0, pk16 = 0;
    if (ps_cuda_gemm_peak(0, 20, &pk32) || ps_cuda_gemm_peak(1, 50, &pk16)) return 1;
    const size_t mem0 = ps_cuda_mem_used();
    const char *pe = getenv("PS_GPU_PROFILE");
    const int profile = pe && *pe == '1';
    if (ps_cuda_use_managed_arena() ||
        ps_model_create(&m, &cfg, profile ? gpu_prof_backend() : &ps_backend_cuda, &ctx, clips, HW,
                        HW))
        return 1;
    ps_model_init(m, 1, 0);
    const int T = cfg.n_segment, K = cfg.num_classes;
    const size_t nin = (size_t)clips * T * 3 * HW * HW;
    float *in = malloc(nin * sizeof *in);
    int32_t *lab = malloc(clips * sizeof *lab);
    ps_model_hash_fill(in, nin, "input", 5, 1.0);
    for (int i = 0; i < clips; i++) lab[i] = i % K;
    int np = 0;
    const ps_model_param_t *p = ps_model_params(m, &np);
    for (int i = 0; i < np; i++) { /* weights were written by the host: move them back */
        ps_cuda_prefetch(p[i].w, p[i].numel * sizeof(float), ps_cuda_backend_stream(&ctx));
        ps_cuda_prefetch(p[i].g, p[i].numel * sizeof(float), ps_cuda_backend_stream(&ctx));
    }
    double *tf = malloc(steps * sizeof *tf), *tb = malloc(steps * sizeof *tb),
           *ts = malloc(steps * sizeof *ts);
    float loss = NAN;
    for (int it = -warm; it < steps; it++) {
        if (zero) ps_model_zero_grad(m);
        if (profile && it == 0) gpu_prof_reset(); /* count the measured steps only */
        const double t0 = bench_now();
        if (ps_model_forward(m, in, clips, lab, 1, &loss)) return 1; /* waits for the loss */
        const double t1 = bench_now();
        if (ps_model_backward(m) || ps_cuda_backend_sync(&ctx)) return 1;
        const double t2 = bench_now();
        if (it >= 0) {
            tf[it] = t1 - t0;
            tb[it] = t2 - t1;
            ts[it] = t2 - t0;
        }
    }
    const double mf = bench_median(tf, steps), mb = bench_median(tb, steps);
    const double mstep = bench_median(ts, steps);
    double ffwd = 0, fbwd = 0;
    ps_model_flops(m, clips, &ffwd, &fbwd);
    const double flops = ffwd + fbwd, nominal = 194e9 * clips * (HW * HW) / (224.0 * 224.0);
    const size_t mem = ps_cuda_mem_used();
    ps_backend_mem_t mm;
    ps_cuda_backend_mem_stats(&ctx, &mm, 0);
    const double peak = prec == PS_PRECISION_FP32 ? pk32 : pk16; /* this precision's peak */
    printf("device: %s\n", info);
    printf("TSM-ResNet-%d %s, %d clips x %d frames x %dx%d, %d steps (median), loss %.4f\n",
           depth, ps_precision_name(prec), clips, T, HW, HW, steps, loss);
    printf("  step %.1f ms (forward %.1f, backward %.1f), %.1f clips/s\n", mstep * 1e3,
           mf * 1e3, mb * 1e3, clips / mstep);
    printf("  FLOPs/step: %.1f G counted (%.1f G nominal at 194 G/clip)\n", flops / 1e9,
           nominal / 1e9);
    printf("  achieved %.1f TFLOP/s counted; measured peaks: sgemm %.1f, fp16 GemmEx %.1f "
           "TFLOP/s -> %.0f%% of the %s peak\n", flops / mstep / 1e12, pk32, pk16,
           100.0 * flops / mstep / 1e12 / peak, prec == PS_PRECISION_FP32 ? "fp32" : "fp16");
    printf("  backend allocations: peak %.2f GiB (arena + workspace + half staging)\n",
           mm.alloc_peak / 1073741824.0);
    printf("  device memory in use: %.2f GiB (model + workspaces %.2f GiB), %d conv shapes\n",
           mem / 1073741824.0, (mem - mem0) / 1073741824.0, ps_cuda_backend_conv_shapes(&ctx));
    printf("RESULT precision=%s depth=%d clips=%d size=%d step_ms=%.2f fwd_ms=%.2f "
           "bwd_ms=%.2f clips_s=%.2f tflops=%.2f peak_sgemm=%.2f peak_hgemm=%.2f mem_gib=%.2f "
           "alloc_peak_gib=%.2f loss=%.4f half_storage=%d recompute=%d arena_gib=%.3f\n",
           ps_precision_name(prec), depth, clips, HW, mstep * 1e3, mf * 1e3, mb * 1e3,
           clips / mstep, flops / mstep / 1e12, pk32, pk16, mem / 1073741824.0,
           mm.alloc_peak / 1073741824.0, loss, ps_cuda_backend_half_storage(&ctx), g_recompute,
           ps_model_arena_bytes(m) / 1073741824.0);
    if (profile) gpu_prof_print(steps, mstep);
    ps_model_destroy(&m);
    ps_cuda_backend_free(&ctx);
    ps_ctx_free(&ctx);
    free(in); free(lab); free(tf); free(tb); free(ts);
    return isfinite(loss) ? 0 : 1;
}

/* ---- RetinaNet-FPN -------------------------------------------------------------
 * The GPU model is ps_backend_cuda, detection slots included
 * (det_layers.cu), so every layer is queued on the backend's stream and the
 * step waits only where the model needs a host value (the positives count
 * and the two losses, in forward; the model's sync before it writes the
 * labels) and at the end.  The arena is managed memory: the host writes the
 * images and targets into it at the start of each forward (page migration,
 * counted in the step). */

/* Two ground-truth boxes per image through the real assignment, so the
 * losses see positives (as bench/retina_bench.c). */
static void retina_targets(const ps_retina_t *m, int n, int H, int K, int32_t *lab, float *box)
{
    const int A = ps_retina_num_anchors(m);
    int32_t *matched = malloc(A * sizeof *matched);
    const float s = (float)H;
    const float gt[8] = {0.1f * s, 0.1f * s, 0.5f * s, 0.45f * s,
                         0.4f * s, 0.3f * s, 0.9f * s, 0.95f * s};
    const int32_t gcls[2] = {0, K > 1 ? 1 : 0};
    for (int i = 0; i < n; i++) {
        ps_det_assign(matched, ps_retina_anchors(m), A, gt, 2, 0.5f, 0.4f, NULL);
        ps_det_make_targets(lab + (size_t)i * A, box + (size_t)i * A * 4, matched,
                            ps_retina_anchors(m), A, gt, gcls, 2, K);
    }
    free(matched);
}

static void retina_cfg(ps_retina_config_t *c, int depth, int K, int small)
{
    ps_retina_config_default(c);
    c->depth = depth;
    c->num_classes = K;
    if (small) { /* the acceptance run's narrow model, every stage trained */
        c->width = 16;
        c->fpn_channels = 32;
        c->freeze_at = 0;
    }
}

/* rcheck: one RetinaNet training step on the CPU and on CUDA (fp32), same
 * weights, images and targets: both losses, the raw outputs and every
 * trainable gradient. */
static int run_retina_check(int depth, int n, int HW, int K)
{
    const tols_t tl = tols_of(PS_PRECISION_FP32);
    ps_retina_config_t cfg;
    retina_cfg(&cfg, depth, K, 1);
    ps_ctx_t cctx, gctx;
    ps_retina_t *mc = NULL, *mg = NULL;
    if (ps_engine_init(&cctx, 0) || ps_engine_init(&gctx, 0) || ps_cuda_backend_init(&gctx, 0))
        return 1;
    if (ps_retina_create(&mc, &cfg, &ps_backend_cpu, &cctx, n, HW, HW)) return 1;
    if (ps_cuda_use_managed_arena() ||
        ps_retina_create(&mg, &cfg, &ps_backend_cuda, &gctx, n, HW, HW))
        return 1;
    ps_arena_set_allocator(NULL);
    ps_retina_init(mc, 3, 1);
    ps_retina_init(mg, 3, 1);
    const int A = ps_retina_num_anchors(mc);
    const size_t nin = (size_t)n * 3 * HW * HW, rows = (size_t)n * A;
    float *in = malloc(nin * sizeof *in), *box = calloc(rows * 4, sizeof *box);
    int32_t *lab = malloc(rows * sizeof *lab);
    ps_model_hash_fill(in, nin, "input", 5, 1.0);
    retina_targets(mc, n, HW, K, lab, box);
    printf("# RetinaNet-ResNet-%d-FPN (width 16, FPN 32), %d images %dx%d, K %d: CPU vs CUDA "
           "fp32 (CUDA detection layers)\n", depth, n, HW, HW, K);
    float cc = NAN, cb = NAN, gc = NAN, gb = NAN;
    int rc = ps_retina_forward(mc, in, n, lab, box, 1, &cc, &cb) | ps_retina_backward(mc);
    rc |= ps_retina_forward(mg, in, n, lab, box, 1, &gc, &gb) | ps_retina_backward(mg);
    rc |= ps_cuda_backend_sync(&gctx);
    check(rc == 0, "forward + backward ran on both backends");
    check(fabs(gc - cc) <= tl.loss * fabs(cc), "focal loss: cpu %.7g cuda %.7g", cc, gc);
    check(fabs(gb - cb) <= tl.loss * fabs(cb) + 1e-7, "smooth-L1 loss: cpu %.7g cuda %.7g", cb,
          gb);
    double me;
    const float *oc = ps_retina_cls_out(mc), *og = ps_retina_cls_out(mg);
    double ex = excess(og, oc, rows * K, tl.logit * maxabs(oc, rows * K), tl.logit, &me);
    check(ex <= 0, "classification logits (max err %.3g)", me);
    oc = ps_retina_box_out(mc), og = ps_retina_box_out(mg);
    ex = excess(og, oc, rows * 4, tl.logit * maxabs(oc, rows * 4), tl.logit, &me);
    check(ex <= 0, "box deltas (max err %.3g)", me);
    int np = 0, np2 = 0, bad = 0;
    const ps_model_param_t *pc = ps_retina_params(mc, &np), *pg = ps_retina_params(mg, &np2);
    double worst_rel = 0;
    const char *worst_name = "";
    for (int i = 0; i < np && np == np2; i++) {
        if (!pc[i].trainable) continue;
        const double scale = maxabs(pc[i].g, pc[i].numel);
        ex = excess(pg[i].g, pc[i].g, pc[i].numel, tl.grad_a * scale + 1e-12, tl.grad_r, &me);
        const double rel = scale > 0 ? me / scale : me;
        if (rel > worst_rel) worst_rel = rel, worst_name = pc[i].name;
        if (ex > 0 && ++bad <= 10)
            printf("#   %s: max err %.3g, max |ref| %.3g\n", pc[i].name, me, scale);
    }
    check(np == np2 && bad == 0, "all %d parameter gradients within atol %g*max|ref|, rtol %g "
          "(worst %s: %.3g of its scale)", np, tl.grad_a, tl.grad_r, worst_name, worst_rel);
    ps_retina_destroy(&mg);
    ps_retina_destroy(&mc);
    ps_cuda_backend_free(&gctx);
    ps_ctx_free(&gctx);
    ps_ctx_free(&cctx);
    free(in), free(box), free(lab);
    printf("1..%d\n", nchecks);
    return nfailed ? 1 : 0;
}

/* The loss layers alone on this step's outputs: the CPU table's slots
 * against the CUDA table's (det_layers.cu) on copies in device memory
 * (what running them on the GPU saves), compared.  Returns 0, or 1 when
 * they disagree beyond float rounding. */
static int retina_loss_layers(ps_ctx_t *ctx, const ps_retina_t *m, const ps_retina_config_t *c,
                              const int32_t *lab, const float *box, size_t rows, int K,
                              double *host_ms, double *cuda_ms)
{
    const int A = (int)rows;
    const ps_backend_t *cpu = &ps_backend_cpu, *gpu = &ps_backend_cuda;
    ps_ctx_t hctx; /* the CPU slots' context */
    if (ps_engine_init(&hctx, 0)) return 1;
    /* host copies of the managed outputs: the host timing is then compute
     * only, and the uploads read plain host memory */
    float *cls = malloc(rows * K * sizeof *cls), *bx = malloc(rows * 4 * sizeof *bx);
    memcpy(cls, ps_retina_cls_out(m), rows * K * sizeof *cls);
    memcpy(bx, ps_retina_box_out(m), rows * 4 * sizeof *bx);
    const int npos = cpu->count_pos(&hctx, lab, A);
    const float norm = npos > 1 ? (float)npos : 1.0f;
    const size_t nk = rows * K, n4 = rows * 4;
    float *dcls = malloc(nk * sizeof *dcls), *dbox = malloc(n4 * sizeof *dbox);
    float *gout = malloc(nk * sizeof *gout);
    float hf = NAN, hs = NAN, cf = NAN, cs = NAN;
    double t0 = bench_now();
    cpu->focal_forward(&hctx, &hf, cls, lab, c->focal_alpha, c->focal_gamma, norm, A, K);
    cpu->smoothl1_forward(&hctx, &hs, bx, box, lab, c->smoothl1_beta, norm, A);
    cpu->focal_backward(&hctx, dcls, cls, lab, 1.f, c->focal_alpha, c->focal_gamma, norm, A, K);
    cpu->smoothl1_backward(&hctx, dbox, bx, box, lab, 1.f, c->smoothl1_beta, norm, A);
    *host_ms = (bench_now() - t0) * 1e3;
    void *gc = NULL, *gb = NULL, *gl = NULL, *gt = NULL, *gdc = NULL, *gdb = NULL;
    if (ps_cuda_malloc(&gc, nk * 4) || ps_cuda_malloc(&gb, n4 * 4) || ps_cuda_malloc(&gl, rows * 4) ||
        ps_cuda_malloc(&gt, n4 * 4) || ps_cuda_malloc(&gdc, nk * 4) || ps_cuda_malloc(&gdb, n4 * 4) ||
        ps_cuda_memcpy_h2d(gc, cls, nk * 4) || ps_cuda_memcpy_h2d(gb, bx, n4 * 4) ||
        ps_cuda_memcpy_h2d(gl, lab, rows * 4) || ps_cuda_memcpy_h2d(gt, box, n4 * 4) ||
        ps_cuda_device_sync())
        return 1;
    double best = INFINITY;
    for (int rep = 0; rep < 4; rep++) { /* the first is the warm-up */
        t0 = bench_now();
        gpu->focal_forward(ctx, &cf, gc, gl, c->focal_alpha, c->focal_gamma, norm, A, K);
        gpu->smoothl1_forward(ctx, &cs, gb, gt, gl, c->smoothl1_beta, norm, A);
        gpu->focal_backward(ctx, gdc, gc, gl, 1.f, c->focal_alpha, c->focal_gamma, norm, A, K);
        gpu->smoothl1_backward(ctx, gdb, gb, gt, gl, 1.f, c->smoothl1_beta, norm, A);
        if (ps_cuda_backend_sync(ctx)) return 1;
        const double t = (bench_now() - t0) * 1e3;
        if (rep > 0 && t < best) best = t;
    }
    *cuda_ms = best;
    double me = 0;
    int ok = fabs(cf - hf) <= 1e-5 * fabs(hf) && fabs(cs - hs) <= 1e-5 * fabs(hs) + 1e-7;
    if (ps_cuda_memcpy_d2h(gout, gdc, nk * 4)) return 1;
    ok &= excess(gout, dcls, nk, 1e-6 * maxabs(dcls, nk), 1e-5, &me) <= 0;
    printf("  loss layers alone (%d rows x %d classes): host %.1f ms, CUDA %.2f ms; focal %.6g "
           "vs %.6g, smooth-L1 %.6g vs %.6g, dlogits max err %.3g (%s)\n", A, K, *host_ms,
           *cuda_ms, (double)hf, (double)cf, (double)hs, (double)cs, me,
           ok ? "agree" : "DISAGREE");
    ps_cuda_free(gc), ps_cuda_free(gb), ps_cuda_free(gl), ps_cuda_free(gt);
    ps_cuda_free(gdc), ps_cuda_free(gdb);
    free(dcls), free(dbox), free(gout), free(cls), free(bx);
    ps_ctx_free(&hctx);
    return ok ? 0 : 1;
}

/* rtime: RetinaNet-R<depth>-FPN (torchvision widths: stem 64, FPN 256,
 * freeze_at 2) training step on the GPU, fp32, n images of HW^2. */
static int run_retina_time(int depth, int n, int HW, int K, int steps, int warm)
{
    ps_retina_config_t cfg;
    retina_cfg(&cfg, depth, K, 0);
    ps_ctx_t ctx;
    ps_retina_t *m = NULL;
    char info[256] = "";
    if (ps_engine_init(&ctx, 0) || ps_cuda_backend_init(&ctx, 0)) return 1;
    ps_cuda_open(0, info, sizeof info);
    if (ps_cuda_use_managed_arena() ||
        ps_retina_create(&m, &cfg, &ps_backend_cuda, &ctx, n, HW, HW))
        return 1;
    ps_retina_init(m, 1, 0);
    const int A = ps_retina_num_anchors(m);
    const size_t nin = (size_t)n * 3 * HW * HW, rows = (size_t)n * A;
    float *in = malloc(nin * sizeof *in), *box = calloc(rows * 4, sizeof *box);
    int32_t *lab = malloc(rows * sizeof *lab);
    ps_model_hash_fill(in, nin, "input", 5, 1.0);
    retina_targets(m, n, HW, K, lab, box);
    int np = 0;
    const ps_model_param_t *p = ps_retina_params(m, &np);
    for (int i = 0; i < np; i++) { /* written by the host at init: move them back */
        ps_cuda_prefetch(p[i].w, p[i].numel * sizeof(float), ps_cuda_backend_stream(&ctx));
        ps_cuda_prefetch(p[i].g, p[i].numel * sizeof(float), ps_cuda_backend_stream(&ctx));
    }
    double *tf = malloc(steps * sizeof *tf), *tb = malloc(steps * sizeof *tb),
           *ts = malloc(steps * sizeof *ts);
    float lc = NAN, lb = NAN;
    /* gradients accumulate (no host memset of managed memory per step: the
     * same FLOPs, as `time` does without -z) */
    for (int it = -warm; it < steps; it++) {
        const double t0 = bench_now();
        if (ps_retina_forward(m, in, n, lab, box, 1, &lc, &lb)) return 1;
        const double t1 = bench_now();
        if (ps_retina_backward(m) || ps_cuda_backend_sync(&ctx)) return 1;
        const double t2 = bench_now();
        if (it >= 0) tf[it] = t1 - t0, tb[it] = t2 - t1, ts[it] = t2 - t0;
    }
    const double mf = bench_median(tf, steps), mb = bench_median(tb, steps);
    const double ms = bench_median(ts, steps);
    double ff = 0, fb = 0;
    ps_retina_flops(m, n, &ff, &fb);
    ps_backend_mem_t mm;
    ps_cuda_backend_mem_stats(&ctx, &mm, 0);
    printf("device: %s\n", info);
    printf("RetinaNet-ResNet-%d-FPN fp32, %d x 3 x %d^2, K %d, %d anchors/image, %d steps "
           "(median), loss %.4f + %.4f\n", depth, n, HW, K, A, steps, (double)lc, (double)lb);
    printf("  step %.1f ms (forward %.1f, backward %.1f), %.2f images/s, %.1f TFLOP/s counted "
           "(%.1f GFLOP/step); every layer on the GPU\n", ms * 1e3,
           mf * 1e3, mb * 1e3, n / ms, (ff + fb) / ms / 1e12, (ff + fb) / 1e9);
    double lh = 0, lg = 0;
    const int lrc = retina_loss_layers(&ctx, m, &cfg, lab, box, rows, K, &lh, &lg);
    printf("RESULT retina impl=ours depth=%d images=%d size=%d classes=%d step_ms=%.2f "
           "fwd_ms=%.2f bwd_ms=%.2f images_s=%.3f tflops=%.2f alloc_peak_gib=%.2f "
           "loss=%.4f loss_layers_host_ms=%.2f loss_layers_cuda_ms=%.3f\n", depth, n, HW, K,
           ms * 1e3, mf * 1e3, mb * 1e3, n / ms, (ff + fb) / ms / 1e12,
           mm.alloc_peak / 1073741824.0, (double)(lc + lb), lh, lg);
    ps_retina_destroy(&m);
    ps_cuda_backend_free(&ctx);
    ps_ctx_free(&ctx);
    free(in), free(box), free(lab), free(tf), free(tb), free(ts);
    return isfinite(lc) && isfinite(lb) && lrc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "check") && strcmp(argv[1], "time") &&
                     strcmp(argv[1], "rcheck") && strcmp(argv[1], "rtime"))) {
        fprintf(stderr, "usage: %s check|time|rcheck|rtime [-d depth] [-n clips|images] "
                        "[-H size] [-s steps] [-w warmup] [-z] [-p fp32|fp16|bf16] "
                        "[-K classes] [-b] [-r]\n", argv[0]);
        return 2;
    }
    const int timing = !strcmp(argv[1], "time") || !strcmp(argv[1], "rtime");
    const int retina = argv[1][0] == 'r';
    int depth = timing ? 50 : 18, clips = timing ? 8 : 2, HW = timing ? 224 : 64;
    int steps = 10, warm = 3, zero = 0, opt, prec = PS_PRECISION_FP32, K = timing ? 80 : 3;
    int place = PS_MODEL_SHIFT_BLOCKRES;
    if (retina) { /* rtime: 2 x 512^2, R50, 80 classes; rcheck: 2 x 128^2, R18, 3 */
        clips = 2;
        HW = timing ? 512 : 128;
    }
    optind = 2;
    while ((opt = getopt(argc, argv, "d:n:H:s:w:zp:K:br")) != -1) {
        switch (opt) {
        case 'b': place = PS_MODEL_SHIFT_BLOCK; break;
        case 'r': g_recompute = 1; break;
        case 'K': K = atoi(optarg); break;
        case 'd': depth = atoi(optarg); break;
        case 'n': clips = atoi(optarg); break;
        case 'H': HW = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'w': warm = atoi(optarg); break;
        case 'z': zero = 1; break;
        case 'p':
            prec = !strcmp(optarg, "fp16")   ? PS_PRECISION_FP16
                   : !strcmp(optarg, "bf16") ? PS_PRECISION_BF16
                   : !strcmp(optarg, "fp32") ? PS_PRECISION_FP32 : -1;
            if (prec < 0) {
                fprintf(stderr, "-p: expected fp32|fp16|bf16\n");
                return 2;
            }
            break;
        default: return 2;
        }
    }
    if (clips <= 0 || HW < 32 || steps <= 0 || warm < 0 || K < 1) {
        fprintf(stderr, "bad option values\n");
        return 2;
    }
    if (ps_cuda_device_count() == 0) {
        printf("1..0 # SKIP no CUDA device\n");
        return 77;
    }
    ps_log_level = PS_LOG_WARN;
    if (retina && prec != PS_PRECISION_FP32) {
        fprintf(stderr, "rcheck / rtime: fp32 only for now\n");
        return 2;
    }
    if (retina)
        return timing ? run_retina_time(depth, clips, HW, K, steps, warm)
                      : run_retina_check(depth, clips, HW, K);
    return timing ? run_time(depth, clips, HW, steps, warm, zero, prec)
                  : run_check(depth, clips, HW, prec, place);
}
