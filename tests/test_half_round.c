/* The error half storage of activations makes INHERENTLY, on the CPU, no
 * GPU: the small TSM-ResNet-18 of tests/test_cuda_half_model.c (width 16,
 * 2 clips x 8 frames x 32^2, 10 classes, dropout 0.5, BN train and
 * partial) run through the rounding backend (worker/engine/
 * backend_half_round.h: the CPU layers, rounded to fp16 / bf16 exactly
 * where the CUDA backend stores half) against the plain CPU fp32 model, at loss scale 1024 (what
 * psworker and the GPU test use) and 65536 (PyTorch AMP's start).
 *
 * Checked: the rounding backend itself (rounding off == the CPU backend
 * bitwise, through the same copies and tags; the outputs it tags half are
 * representable in half; no storage mismatch in a whole model step; it
 * really rounds), and that bf16 (8x fp16's epsilon) makes the larger
 * error.  The errors themselves are REPORTED (diag) -- they are the
 * yardstick test_cuda_half_model derives its fp32 bound from -- and
 * bounded loosely (< 1, finite): a step that gets the gradient's direction
 * wrong is not rounding.
 *
 * Also measured: how much a 1-ulp fp32 perturbation of the input moves the
 * rounded model (the "noise floor" that summation-order differences
 * between the GPU and this reference can be expected to reach). */
#include "tests/lib/tap.h"
#include "worker/engine/layers/conv_provider.h"
#include "worker/engine/backend_half_round.h"
#include "worker/engine/ps_engine.h"
#include "worker/models/model_snap.h"
#include "worker/models/ps_model.h"
#include "ps_error.h"
#include "ps_log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CLIPS = 2, HW = 32, NSCALES = 5 };

/* the largest |gradient| (unscaled) */
static double gmax(const ps_model_snap_t *s)
{
    double m = 0;
    for (int i = 0; i < s->np; i++)
        for (size_t j = 0; j < s->numel[i]; j++) m = fmax(m, fabs(s->g[i][j]));
    return m;
}

static const char *pname(ps_precision_t p)
{
    return p == PS_PRECISION_FP32 ? "off" : ps_precision_name(p);
}

/* One step on the CPU (be NULL) or rounding backend; the snapshot holds
 * unscaled gradients.  eps: relative perturbation of the input (0 none). */
static int run(ps_model_snap_t *out, int rounding, ps_precision_t prec, float lscale, int bn_mode,
               double eps, long *mismatches, long *rounded)
{
    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = 18;
    cfg.width = 16;
    cfg.num_classes = 10;
    cfg.partial_bn = 0;
    cfg.bn_mode = bn_mode;
    ps_ctx_t ctx;
    ps_model_t *m = NULL;
    if (ps_engine_init(&ctx, 1)) return -1;
    const ps_backend_t *be = &ps_backend_cpu;
    if (rounding) {
        if (ps_hround_init(&ctx, prec, lscale)) return -1;
        be = &ps_backend_cpu_round;
    } else {
        lscale = 1.0f;
    }
    if (ps_model_create(&m, &cfg, be, &ctx, CLIPS, HW, HW)) return -1;
    ps_model_init(m, 7, 1);
    ps_model_set_seed(m, 99);
    const size_t nin = (size_t)CLIPS * cfg.n_segment * 3 * HW * HW;
    float *in = malloc(nin * sizeof *in);
    if (!in) return -1;
    ps_model_hash_fill(in, nin, "input", 5, 1.0);
    if (eps != 0)
        for (size_t i = 0; i < nin; i++) in[i] *= (float)(1.0 + eps);
    int32_t lab[CLIPS] = {3, 8};
    float loss = NAN;
    int rc = ps_model_forward(m, in, CLIPS, lab, 1, &loss) | ps_model_backward(m);
    if (!rc) rc = ps_model_snap(out, m, CLIPS * cfg.num_classes, loss, 1.0 / lscale);
    if (rounding) {
        if (mismatches) *mismatches = ps_hround_mismatches(&ctx);
        if (rounded) *rounded = ps_hround_rounded(&ctx);
        ps_hround_free(&ctx);
    }
    ps_model_destroy(&m);
    ps_ctx_free(&ctx);
    free(in);
    return rc;
}

/* The backend on its own: outputs tagged half hold representable values. */
static void layer_checks(void)
{
    for (ps_precision_t prec = PS_PRECISION_FP16; prec <= PS_PRECISION_BF16; prec++) {
        ps_ctx_t ctx;
        if (ps_engine_init(&ctx, 1) || ps_hround_init(&ctx, prec, 1.0f)) {
            ok(0, "%s: rounding backend set up", pname(prec));
            continue;
        }
        const ps_backend_t *be = &ps_backend_cpu_round;
        ps_conv2d_desc_t d = {.C = 3, .K = 4, .R = 3, .S = 3, .stride_h = 1, .stride_w = 1,
                              .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
        enum { N = 2, H = 6, W = 5 };
        float x[N * 3 * H * W], w[4 * 3 * 9], y[N * 4 * H * W], z[N * 4 * H * W];
        float y32[N * 4 * H * W];
        ps_model_hash_fill(x, N * 3 * H * W, "x", 1, 1.0);
        ps_model_hash_fill(w, 4 * 3 * 9, "w", 2, 0.3);
        if (ps_ctx_reserve(&ctx, ps_conv2d_workspace(&d, N, H, W))) abort();
        be->conv2d_forward(&ctx, y, x, w, NULL, &d, N, H, W);
        ps_backend_cpu.conv2d_forward(&ctx, y32, x, w, NULL, &d, N, H, W);
        be->relu_forward(&ctx, z, y, N * 4 * H * W);
        int repr = 1, diff = 0;
        for (int i = 0; i < N * 4 * H * W; i++) {
            repr &= ps_hround_value(prec, y[i]) == y[i] && ps_hround_value(prec, z[i]) == z[i];
            diff |= y[i] != y32[i];
        }
        ok(ps_hround_is_half(&ctx, y) && ps_hround_is_half(&ctx, z) && !ps_hround_is_half(&ctx, x),
           "%s: conv2d's output and relu's after it are tagged half, the fp32 input is not",
           pname(prec));
        ok(repr, "%s: every value of both is representable in %s", pname(prec), pname(prec));
        ok(diff, "%s: and differs from the fp32 conv (the rounding is real)", pname(prec));
        /* a value exactly between two fp16 neighbours goes to the even one */
        const float mid = 1.0f + 1.0f / 2048.0f, mid_b = 1.0f + 1.0f / 256.0f;
        is_close(ps_hround_value(prec, prec == PS_PRECISION_FP16 ? mid : mid_b), 1.0, 0, 0,
                 "%s: 1 + half an ulp rounds to even (1)", pname(prec));
        ps_hround_free(&ctx);
        ps_ctx_free(&ctx);
    }
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    /* The reference convolution row: the noise-floor check below assumes
     * the fp32 model barely moves under a 1-ulp input change, which holds
     * for a given rounding only while no ReLU decision sits within rounding
     * of zero; with oneDNN's rounding one does at this input (a
     * pre-activation of 1e-6 flips and the training-mode BN spreads it).
     * The rounding backend models the GPU's storage on the reference. */
    ps_conv_set_kernels("gemm");
    layer_checks();
    /* 1024: psworker's and the GPU test's; 65536: PyTorch AMP's start; the
     * others show how much of fp16's error is underflow (small scales) */
    const float scales[NSCALES] = {1.0f, 64.0f, 1024.0f, 8192.0f, 65536.0f};
    for (int bm = 0; bm < 2; bm++) {
        const int mode = bm ? PS_MODEL_BN_PARTIAL : PS_MODEL_BN_TRAIN;
        const char *mname = bm ? "BN partial" : "BN train";
        ps_model_snap_t ref, off;
        if (run(&ref, 0, 0, 1, mode, 0, NULL, NULL)) {
            ok(0, "%s: fp32 CPU step ran", mname);
            continue;
        }
        long mis = -1, nr = -1;
        if (run(&off, 1, PS_PRECISION_FP32, 1.0f, mode, 0, &mis, &nr) == 0) {
            ok(ps_model_snap_equal(&off, &ref) && mis == 0,
               "%s: rounding off == the CPU backend bitwise (loss, logits, %d gradients, BN "
               "statistics)", mname, ref.np);
            ps_model_snap_free(&off);
        } else {
            ok(0, "%s: rounding-off step ran", mname);
        }
        double worst[3] = {0, 0, 0}; /* by precision, at scale 1024 */
        for (ps_precision_t prec = PS_PRECISION_FP16; prec <= PS_PRECISION_BF16; prec++)
            for (int si = 0; si < NSCALES; si++) {
                ps_model_snap_t r;
                if (run(&r, 1, prec, scales[si], mode, 0, &mis, &nr)) {
                    ok(0, "%s %s x%g: rounded step ran", mname, pname(prec), scales[si]);
                    continue;
                }
                const char *wn = "";
                double elog, ebuf;
                const double e = ps_model_snap_cmp(&r, &ref, &wn, &elog, &ebuf);
                const double eloss = fabs(r.loss - ref.loss) / fabs(ref.loss);
                const int nof = ps_model_snap_nonfinite(&r);
                if (scales[si] * gmax(&ref) > 65504.0 && prec == PS_PRECISION_FP16) {
                    /* the scaled gradient passes fp16's largest value: an
                     * overflow the dynamic loss scaler must see (and skip) */
                    ok(nof > 0, "%s %s loss scale %g: max |grad| x scale %.3g > 65504: "
                       "%d gradient tensors non-finite (overflow seen, as AMP would skip)",
                       mname, pname(prec), scales[si], scales[si] * gmax(&ref), nof);
                } else {
                    ok(mis == 0 && nr > 0 && nof == 0 && e > 0 && e < 1.0,
                       "%s %s loss scale %g: rounded model vs fp32: worst gradient rel L2 "
                       "%.3g (%s), logits %.3g, loss %.2g, BN stats %.3g (%ld values rounded, "
                       "%ld mismatches)", mname, pname(prec), scales[si], e, wn, elog, eloss,
                       ebuf, nr, mis);
                }
                if (scales[si] == 1024.0f) worst[prec] = e;
                ps_model_snap_free(&r);
            }
        ok(worst[PS_PRECISION_BF16] > worst[PS_PRECISION_FP16],
           "%s: bf16 rounds more than fp16 (%.3g > %.3g)", mname, worst[PS_PRECISION_BF16],
           worst[PS_PRECISION_FP16]);
        /* noise floor: fp32-level perturbation of the input, fp16 model
         * (and the fp32 model: it must barely move, so what moves the
         * rounded one is the rounding) */
        ps_model_snap_t a, b, c;
        if (run(&a, 1, PS_PRECISION_FP16, 1024.0f, mode, 0, NULL, NULL) == 0 &&
            run(&b, 1, PS_PRECISION_FP16, 1024.0f, mode, 0x1p-23, NULL, NULL) == 0 &&
            run(&c, 0, 0, 1, mode, 0x1p-23, NULL, NULL) == 0) {
            const char *wn = "", *wn32 = "";
            double el, el32;
            const double e = ps_model_snap_cmp(&b, &a, &wn, &el, NULL);
            const double e32 = ps_model_snap_cmp(&c, &ref, &wn32, &el32, NULL);
            ok(e32 < 1e-3 && e < worst[PS_PRECISION_FP16] + 1e-12,
               "%s: a 1-ulp fp32 change of the input moves the fp32 model by %.3g (logits "
               "%.3g) and the fp16 rounded model by %.3g (worst %s, logits %.3g; its rounding "
               "error vs fp32: %.3g)", mname, e32, el32, e, wn, el, worst[PS_PRECISION_FP16]);
            ps_model_snap_free(&a);
            ps_model_snap_free(&b);
            ps_model_snap_free(&c);
        }
        ps_model_snap_free(&ref);
    }
    return tap_done();
}
