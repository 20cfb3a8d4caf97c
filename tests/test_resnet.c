/* Whole-model check of the TSM / TSN ResNets against PyTorch (llm.c's
 * debug-state approach): the same hash-generated weights and input on both
 * sides (tests/golden/gen_resnet.py), then logits, loss, every parameter
 * gradient (L2 norm + a deterministic sample of elements) and the updated
 * BN statistics compared with the goldens.  Variants: TSM-ResNet-18 at
 * 2 clips x 8 x 3 x 64 x 64 with training-mode BN; TSN-ResNet-18 (no shift)
 * with dropout 0.5 (the mask is a counter hash, so PyTorch applies the same
 * one); TSM-ResNet-18 and TSM-ResNet-50 (bottlenecks) with partial BN, the
 * last three at 1 clip x 8 x 32 x 32.  Then a few SGD steps on a small
 * generated batch must lower the loss, the tables (names, groups,
 * counts) must be torchvision's, and frozen BN (bn_mode FROZEN) must make
 * a batch of 2 give the mean of two batch-1 gradients.
 *
 * Why ResNet-50 with partial BN: with one clip and training-mode BN, the
 * gradient reaching layer4 is nearly constant over the 8 frames, so BN's
 * backward (dy - mean(dy) - ...) cancels almost completely and even
 * PyTorch's float32 is off by several rms there; 2 clips would double the
 * cost.  Training-mode BN backward is the same layer code in every block and
 * is covered by the ResNet-18 variants.
 *
 * The reference is PyTorch in float64 on the same float32 weights and input.
 * Tolerances (|got-ref| <= atol + rtol*|ref|), and why:
 *   logits, loss: rtol 1e-3, atol 1e-4 -- float32 forward through ~20
 *   conv+BN layers with another summation order (im2col+OpenBLAS vs oneDNN)
 *   stays near 1e-5 relative;
 *   gradients are discontinuous: where a ReLU or max-pool input lies within
 *   rounding of a decision, float32 and float64 route the gradient
 *   differently, and training-mode BN spreads that over the channel (worst
 *   when the batch is small; PyTorch's own float32 run is off by up to 0.2
 *   rms in some tensors of the 2x8x64x64 ResNet-18).  The golden records per
 *   tensor PyTorch's own float32 error (max and 90th percentile, in units
 *   of the gradient's rms; relative norm error), and the engine must have:
 *     norm within 2e-3 + 3*noise_norm (relative);
 *     >= 80% of the sampled elements within 1e-2*|ref| + (2e-3 +
 *     3*noise_p90)*rms  -- a flip touches a few channels, a bug all of them;
 *     every sampled element within 1e-2*|ref| + (0.25 + 3*noise_max)*rms.
 *   BN running statistics: rtol 1e-3, atol 1e-4 (the batch variance over as
 *   few as 8 values).
 * An error in any layer (wrong stride, shift direction, BN mode, missing
 * gradient term) moves these by orders of magnitude more. */
#include "tests/lib/model_check.h"
#include "tests/lib/tap.h"
#include "worker/engine/layers/conv_provider.h"
#include "worker/models/ps_model.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 1234
#define DROPOUT_SEED 42
#define LINE_MAX_ 1000000

typedef struct variant {
    const char *name;
    int depth, shift, pbn, clips, H, K;
    float dropout; /* mask drawn from DROPOUT_SEED, mirrored by gen_resnet.py */
} variant_t;

static void hash_input(float *x, int clips, int T, int H)
{
    ps_model_hash_fill(x, (size_t)clips * T * 3 * H * H, "input", SEED, 1.0);
}

static void check_variant(ps_ctx_t *ctx, const variant_t *v)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/resnet_%s.txt", srcdir(), v->name);
    FILE *f = fopen(path, "r");
    if (!ok(f != NULL, "%s: open %s", v->name, path)) return;

    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = v->depth;
    cfg.shift = v->shift;
    cfg.partial_bn = v->pbn;
    cfg.num_classes = v->K;
    cfg.dropout = v->dropout;
    ps_model_t *m = NULL;
    int r = ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, v->clips, v->H, v->H);
    is_int(r, 0, "%s: create", v->name);
    if (r) {
        fclose(f);
        return;
    }
    ps_model_init(m, SEED, 1);
    ps_model_set_seed(m, DROPOUT_SEED);
    int T = cfg.n_segment;
    float *x = malloc(sizeof(float) * v->clips * T * 3 * v->H * v->H);
    int32_t labels[8];
    for (int b = 0; b < v->clips; b++) labels[b] = (b * 7 + 3) % v->K;
    hash_input(x, v->clips, T, v->H);
    float loss = -1;
    ps_model_zero_grad(m);
    is_int(ps_model_forward(m, x, v->clips, labels, 1, &loss), 0, "%s: forward", v->name);
    is_int(ps_model_backward(m), 0, "%s: backward", v->name);

    char *line = malloc(LINE_MAX_);
    int ngrad = 0, nbuf = 0, bad_grad = 0, bad_buf = 0, nparams;
    double worst_norm = 0, worst_elem = 0;
    const ps_model_param_t *P = ps_model_params(m, &nparams);
    int *seen = calloc(nparams, sizeof *seen);
    while (fgets(line, LINE_MAX_, f)) {
        char name[128];
        int off = 0;
        if (line[0] == '#') continue;
        if (!strncmp(line, "loss ", 5)) {
            is_close(loss, strtod(line + 5, NULL), 1e-4, 1e-3, "%s: loss", v->name);
        } else if (!strncmp(line, "logits ", 7)) {
            char *p = line + 7, *e;
            long n = strtol(p, &e, 10);
            is_int(n, v->clips * v->K, "%s: logits count", v->name);
            float *ref = malloc(sizeof(float) * (n > 0 ? n : 1));
            for (long i = 0; i < n; i++) ref[i] = strtof(e, &e);
            char what[64];
            snprintf(what, sizeof what, "%s: logits", v->name);
            allclose(ps_model_logits(m), ref, n, 1e-4, 1e-3, what);
            free(ref);
        } else if (sscanf(line, "grad %127s %*d %*f %*f %*f %*f%n", name, &off) == 1 &&
                   off > 0) {
            int pi = ps_model_find_param(m, name);
            if (!ok(pi >= 0, "%s: gradient of %s exists in the model", v->name, name)) continue;
            seen[pi] = 1;
            ngrad++;
            double ref_norm;
            bad_grad += check_grad_line(v->name, name, line, off, &P[pi], &ref_norm, &worst_norm,
                                        &worst_elem);
        } else {
            check_buffer_line(m, v->name, line, &nbuf, &bad_buf);
        }
    }
    int unseen = 0;
    for (int i = 0; i < nparams; i++) unseen += !seen[i];
    is_int(ngrad, nparams, "%s: golden has a gradient for all %d parameters", v->name, nparams);
    is_int(unseen, 0, "%s: every model parameter compared", v->name);
    ok(bad_grad == 0, "%s: %d gradients match PyTorch float64 (worst norm error %.2g, worst "
       "element error %.2g rms)", v->name, ngrad, worst_norm, worst_elem);
    ok(nbuf > 0 && bad_buf == 0, "%s: %d BN buffers match PyTorch after one step", v->name,
       nbuf);
    free(seen);
    free(line);
    free(x);
    fclose(f);
    ps_model_destroy(&m);
}

/* Loss falls: a few steps of the shared optimizer (ps_optim_sgd: momentum
 * 0.9, weight decay 1e-4, the TSM group multipliers) on one small generated
 * batch of a narrow TSM-ResNet-18 with dropout and partial BN as in
 * training. */
static void check_loss_falls(ps_ctx_t *ctx)
{
    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = 18;
    cfg.width = 16;
    cfg.num_classes = 4;
    cfg.dropout = 0.5f;
    cfg.partial_bn = 1;
    int clips = 4, H = 32, T = cfg.n_segment;
    ps_model_t *m = NULL;
    if (!ok(ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, clips, H, H) == 0,
            "loss-falls model created"))
        return;
    ps_model_init(m, 99, 0);
    ps_model_set_seed(m, 5);
    size_t nx = (size_t)clips * T * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    ps_model_hash_fill(x, nx, "batch", 3, 1.0);
    int32_t labels[4] = {0, 1, 2, 3};
    int np;
    const ps_model_param_t *P = ps_model_params(m, &np);
    ps_optim_config_t oc;
    ps_optim_config_default(&oc);
    oc.lr = 0.005f;
    oc.momentum = 0.9f;
    oc.weight_decay = 1e-4f;
    oc.ngroups = ps_model_groups(m, oc.groups, PS_OPTIM_MAX_GROUPS);
    float **buf = alloc_like(P, np);
    float first = 0, last = 0, tail = 0; /* tail: mean of the last 3 (dropout is noisy) */
    int steps = 10, fails = 0;
    for (int s = 0; s < steps; s++) {
        float loss;
        ps_model_zero_grad(m);
        fails += ps_model_forward(m, x, clips, labels, 1, &loss) != 0;
        fails += ps_model_backward(m) != 0;
        if (s == 0) first = loss;
        last = loss;
        if (s >= steps - 3) tail += loss / 3;
        diag("step %d loss %.5f", s, loss);
        sgd_step(P, np, buf, &oc, s == 0);
    }
    is_int(fails, 0, "training steps ran");
    ok(isfinite(last) && tail < 0.75f * first,
       "loss falls: %.4f -> %.4f (mean of the last 3) in %d SGD steps", first, tail, steps);
    /* frozen BN (partial BN) must not have collected gradient */
    int frozen_nonzero = 0, nfrozen = 0;
    for (int i = 0; i < np; i++)
        if (!P[i].trainable) {
            nfrozen++;
            frozen_nonzero += l2(P[i].g, P[i].numel) != 0;
        }
    ok(nfrozen > 0 && frozen_nonzero == 0, "partial BN: %d frozen tensors, no gradient", nfrozen);
    free_like(buf, np);
    free(x);
    ps_model_destroy(&m);
}

/* bn_mode FROZEN (every BN, bn1 included, on running statistics with a
 * frozen affine; dropout 0): the property data-parallel reproducibility
 * needs -- one worker with batch 2 gets the mean of the gradients two
 * workers with batch 1 get -- plus training forward == eval forward,
 * running statistics untouched and no BN gradient.  Under TRAIN the same
 * comparison must FAIL (batch statistics couple the clips), which shows the
 * check can tell. */
static double batch_split_error(ps_ctx_t *ctx, int bn_mode, int *frozen_ok, int *stats_ok,
                                double *eval_err)
{
    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = 18;
    cfg.width = 8;
    cfg.num_classes = 5;
    cfg.dropout = 0.f;
    cfg.partial_bn = 0;
    cfg.bn_mode = bn_mode;
    int T = cfg.n_segment, H = 32;
    ps_model_t *m = NULL;
    if (ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, 2, H, H)) return INFINITY;
    ps_model_init(m, 11, 1);
    size_t per = (size_t)T * 3 * H * H;
    float *x = malloc(2 * per * sizeof *x);
    ps_model_hash_fill(x, 2 * per, "split", 5, 1.0);
    int32_t lab[2] = {1, 4};
    int np, nb;
    const ps_model_param_t *P = ps_model_params(m, &np);
    const ps_model_buffer_t *Bf = ps_model_buffers(m, &nb);
    float **acc = alloc_like(P, np), loss;
    /* two "workers": one clip each, mean of their gradients */
    for (int w = 0; w < 2; w++) {
        ps_model_zero_grad(m);
        ps_model_forward(m, x + w * per, 1, lab + w, 1, &loss);
        ps_model_backward(m);
        for (int i = 0; i < np; i++)
            for (size_t k = 0; k < P[i].numel; k++) acc[i][k] += 0.5f * P[i].g[k];
    }
    /* one worker, both clips */
    float *rm0 = malloc(Bf[0].numel * sizeof(float));
    memcpy(rm0, Bf[0].f32, Bf[0].numel * sizeof(float));
    ps_model_zero_grad(m);
    ps_model_forward(m, x, 2, lab, 1, &loss);
    float train_logits[10];
    memcpy(train_logits, ps_model_logits(m), sizeof train_logits);
    ps_model_backward(m);
    double worst = 0;
    *frozen_ok = 1;
    for (int i = 0; i < np; i++) {
        double n = l2(acc[i], P[i].numel), d = 0;
        for (size_t k = 0; k < P[i].numel; k++)
            d += ((double)P[i].g[k] - acc[i][k]) * ((double)P[i].g[k] - acc[i][k]);
        if (n > 0 && sqrt(d) / n > worst) worst = sqrt(d) / n;
        if (strstr(P[i].name, "bn") || strstr(P[i].name, "downsample.1"))
            *frozen_ok &= !P[i].trainable && l2(P[i].g, P[i].numel) == 0;
    }
    *stats_ok = !memcmp(rm0, Bf[0].f32, Bf[0].numel * sizeof(float));
    ps_model_forward(m, x, 2, NULL, 0, NULL);
    *eval_err = 0;
    for (int i = 0; i < 10; i++) {
        double e = fabs(train_logits[i] - ps_model_logits(m)[i]);
        if (e > *eval_err) *eval_err = e;
    }
    free_like(acc, np);
    free(rm0);
    free(x);
    ps_model_destroy(&m);
    return worst;
}

static void check_frozen_bn(ps_ctx_t *ctx)
{
    int frozen_ok, stats_ok;
    double eval_err;
    double e = batch_split_error(ctx, PS_MODEL_BN_FROZEN, &frozen_ok, &stats_ok, &eval_err);
    /* float32 sums in another order: ~1e-6 relative; 1e-4 leaves room */
    ok(e < 1e-4, "frozen BN: batch-2 gradient == mean of two batch-1 gradients (worst %.2g "
       "relative L2)", e);
    ok(frozen_ok, "frozen BN: every BN affine frozen (trainable 0, no gradient)");
    ok(stats_ok, "frozen BN: running statistics unchanged by a training step");
    ok(eval_err == 0, "frozen BN: training forward == eval forward (dropout 0)");
    e = batch_split_error(ctx, PS_MODEL_BN_TRAIN, &frozen_ok, &stats_ok, &eval_err);
    ok(e > 1e-2, "train BN: the same comparison differs (%.2g): the check can fail", e);

    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = 18;
    cfg.width = 8;
    ps_model_t *m = NULL;
    ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, 1, 32, 32);
    is_int(m ? ps_model_bn_mode(m) : -1, PS_MODEL_BN_PARTIAL, "default: partial_bn -> PARTIAL");
    ps_model_destroy(&m);
    cfg.partial_bn = 0;
    ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, 1, 32, 32);
    is_int(m ? ps_model_bn_mode(m) : -1, PS_MODEL_BN_TRAIN, "partial_bn 0 -> TRAIN");
    ps_model_destroy(&m);
    cfg.bn_mode = 3;
    ps_log_level = -1;
    ok(ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, 1, 32, 32) == PS_EINVAL,
       "bn_mode 3 refused");
    ps_log_level = PS_LOG_WARN;
}

/* Names, groups and layout facts that the PS side relies on. */
static void check_tables(ps_ctx_t *ctx)
{
    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = 50;
    cfg.num_classes = 400;
    cfg.partial_bn = 0;
    ps_model_t *m = NULL;
    if (!ok(ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, 1, 32, 32) == 0, "R50 created"))
        return;
    int np, nb;
    const ps_model_param_t *P = ps_model_params(m, &np);
    ps_model_buffers(m, &nb);
    size_t total = 0;
    for (int i = 0; i < np; i++) total += P[i].numel;
    /* torchvision resnet50(num_classes=400): 161 parameter tensors, 23,528,522
     * elements (25,557,032 for 1000 classes minus 600*2049) */
    is_int(np, 161, "R50: 161 parameter tensors");
    is_int(total, 25557032 - 600 * 2049, "R50: element count equals torchvision's");
    is_int(nb, 53 * 3, "R50: 53 BNs x 3 buffers");
    ok(!strcmp(P[0].name, "conv1.weight") && !strcmp(P[np - 1].name, "fc.bias"),
       "R50: model order starts at conv1.weight, ends at fc.bias");
    int i = ps_model_find_param(m, "layer2.0.downsample.0.weight");
    ok(i >= 0 && P[i].shape[0] == 512 && P[i].shape[1] == 256, "R50: downsample conv shape");
    i = ps_model_find_param(m, "layer2.0.conv2.weight");
    ok(i >= 0 && P[i].shape[2] == 3, "R50: v1.5 bottleneck (3x3 in conv2)");
    is_int(P[ps_model_find_param(m, "fc.bias")].group, PS_MODEL_GROUP_BIAS, "fc.bias group");
    is_int(P[ps_model_find_param(m, "bn1.weight")].group, PS_MODEL_GROUP_BN, "bn1 group");
    is_int(P[0].group, PS_MODEL_GROUP_WEIGHT, "conv1.weight group");
    ps_param_group_t g[PS_MODEL_NGROUPS];
    is_int(ps_model_groups(m, g, PS_MODEL_NGROUPS), PS_MODEL_NGROUPS, "groups");
    ok(g[1].lr_mult == 2 && g[1].wd_mult == 0 && g[2].wd_mult == 0 && g[3].lr_mult == 5 &&
       g[4].lr_mult == 10 && g[4].wd_mult == 0 && g[0].wd_mult == 1, "TSM group multipliers");
    ps_tensor_spec_t *specs = NULL;
    int ns = ps_model_tensor_specs(m, &specs);
    is_int(ns, np, "no partial BN: every tensor trainable");
    free(specs);
    double fwd, bwd;
    ps_model_flops(m, 1, &fwd, &bwd);
    /* ResNet-50 at 224: 4.09 GMAC per image; at 32x32 (1/49 of the pixels,
     * rounding of the stem aside) ~8 frames * 2 * 4.09e9/49 */
    ok(fwd > 1.0e9 && fwd < 1.8e9, "R50 32x32 x8 forward %.3g FLOP", fwd);
    ps_model_destroy(&m);

    cfg.partial_bn = 1;
    is_int(ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, 1, 32, 32), 0, "R50 pbn created");
    ns = ps_model_tensor_specs(m, &specs);
    is_int(ns, np - 2 * 52, "partial BN: 52 BNs frozen (2 tensors each)");
    free(specs);
    ps_model_destroy(&m);

    /* ResNet-18 / -34: torchvision's element counts (11,689,512 and
     * 21,797,672 at 1000 classes; fc is 600*513 smaller at 400), and a
     * ResNet-34 step runs to a finite loss */
    static const int depths[2] = {18, 34};
    static const size_t want[2] = {11689512 - 600 * 513, 21797672 - 600 * 513};
    for (int d = 0; d < 2; d++) {
        cfg.depth = depths[d];
        cfg.partial_bn = 0;
        if (!ok(ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, 1, 32, 32) == 0, "R%d created",
                depths[d]))
            continue;
        P = ps_model_params(m, &np);
        total = 0;
        for (int k = 0; k < np; k++) total += P[k].numel;
        is_int(total, want[d], "R%d: element count equals torchvision's", depths[d]);
        if (depths[d] == 34) {
            float *x = malloc(sizeof(float) * 8 * 3 * 32 * 32), loss = NAN;
            int32_t lab = 7;
            ps_model_hash_fill(x, 8 * 3 * 32 * 32, "input", 1, 1.0);
            ps_model_init(m, 3, 1);
            int ran = ps_model_forward(m, x, 1, &lab, 1, &loss) == 0 && ps_model_backward(m) == 0;
            ok(ran && isfinite(loss), "R34 training step runs (loss %.3f)", loss);
            free(x);
        }
        ps_model_destroy(&m);
    }

    ps_log_level = -1; /* the refusals below log errors by design */
    cfg.depth = 20;
    ok(ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, 1, 32, 32) == PS_EINVAL && !m,
       "depth 20 refused");
    cfg.depth = 18;
    ok(ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, 1, 16, 32) == PS_EINVAL && !m,
       "input under 32 pixels refused");
    ps_log_level = PS_LOG_WARN;
}

int main(void)
{
    ps_ctx_t ctx;
    ps_log_level = PS_LOG_WARN;
    ps_engine_init(&ctx, 0);
    static const variant_t vs[] = {
        {"r18_tsm", 18, 1, 0, 2, 64, 10, 0.f},
        {"r18_tsn", 18, 0, 0, 1, 32, 5, 0.5f},
        {"r18_tsm_pbn", 18, 1, 1, 1, 32, 5, 0.f},
        {"r50_tsm_pbn", 50, 1, 1, 1, 32, 10, 0.f},
    };
    /* the convolution rows of conv_provider.h in turn: the reference
     * im2col + GEMM one (with the default sgemm library), then oneDNN's.
     * oneDNN rounds differently from PyTorch's fp32 run, and in
     * r50_tsm_pbn that flips one ReLU decision (a pre-activation of 1e-6 in
     * layer 3), which the training-mode bn1 spreads over its channel:
     * |grad bn1.bias| moves by 0.4% of itself, past the 2e-3 + 3x PyTorch's
     * own noise the reference row meets.  The oneDNN pass allows 6e-3 on
     * the norms; every element check is the same. */
    static const char *const rows[] = {"gemm", "onednn"};
    for (int r = 0; r < 2; r++) {
        if (r == 1 && !ps_conv_onednn_available()) {
            diag("no oneDNN in this build: its row is the GEMM one");
            break;
        }
        ps_conv_set_kernels(rows[r]);
        model_check_norm_slack = r ? 6e-3 : 2e-3;
        diag("conv2d through the %s row", rows[r]);
        for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) check_variant(&ctx, &vs[i]);
    }
    ps_conv_set_kernels(NULL);
    model_check_norm_slack = 2e-3;
    check_tables(&ctx);
    check_loss_falls(&ctx);
    check_frozen_bn(&ctx);
    ps_ctx_free(&ctx);
    return tap_done();
}
