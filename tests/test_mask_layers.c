/* Mask R-CNN's two layers (and Cascade R-CNN's scale) on the CPU table (worker/engine/layers/deconv.c,
 * mask_bce.c) against PyTorch goldens (tests/golden/gen_mask_layers.py ->
 * mask_layers_golden.bin): the transposed convolution whose kernel equals
 * its stride (torch conv_transpose2d: forward, input, weight and bias
 * gradients; strides 1, 2, 3, with and without bias, the mask predictor's
 * 14 x 14 -> 28 x 28) and the mask loss (binary_cross_entropy_with_logits
 * on each row's target channel, mean; soft and hard targets, saturated
 * logits of +-80), goldens in float64 rounded to float.  Then the
 * contracts: weight / bias gradients accumulate, the input gradient is
 * overwritten, dinp NULL accepted, every channel but the target's gets a
 * zero gradient, R = 0 gives a zero loss, a label outside 0..K-1 is
 * refused with NaN. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "tests/lib/golden_io.h"
#include "tests/lib/tap.h"
#include "worker/engine/ps_engine.h"

static ps_ctx_t ctx;
static const ps_backend_t *const be = &ps_backend_cpu;

static golden_rec_t *need(const char *c, const char *what)
{
    char k[64];
    snprintf(k, sizeof k, "%s.%s", c, what);
    golden_rec_t *r = golden_find(k);
    if (r) return r;
    printf("Bail out! golden record %s missing\n", k);
    exit(1);
}
#define F32(c, what) ((const float *)need(c, what)->data)

static float *filled(size_t n, float v)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}

static void check_deconv(const char *c)
{
    const int32_t *cfg = need(c, "cfg")->data;
    int N = cfg[0], C = cfg[1], K = cfg[2], H = cfg[3], W = cfg[4], s = cfg[5], bias = cfg[6];
    size_t ni = (size_t)N * C * H * W, no = (size_t)N * K * H * W * s * s, nw = (size_t)C * K * s * s;
    float *out = filled(no, NAN), *dinp = filled(ni, NAN);
    float *dw = filled(nw, 0.5f), *db = filled((size_t)K, 0.25f);
    const float *w = F32(c, "w"), *b = bias ? F32(c, "b") : NULL;
    char what[96];
    be->deconv_forward(&ctx, out, F32(c, "inp"), w, b, N, C, K, H, W, s);
    snprintf(what, sizeof what, "deconv %s (N %d C %d K %d %dx%d s %d bias %d) forward", c, N, C,
             K, H, W, s, bias);
    allclose(out, F32(c, "out"), (long)no, 1e-5, 1e-5, what);
    be->deconv_backward(&ctx, dinp, dw, bias ? db : NULL, F32(c, "dout"), F32(c, "inp"), w, N, C,
                        K, H, W, s);
    snprintf(what, sizeof what, "deconv %s input gradient", c);
    allclose(dinp, F32(c, "dinp"), (long)ni, 1e-5, 1e-5, what);
    /* parameter gradients accumulate onto what was there (0.5, 0.25) */
    for (size_t i = 0; i < nw; i++) dw[i] -= 0.5f;
    for (int k = 0; k < K; k++) db[k] -= 0.25f;
    snprintf(what, sizeof what, "deconv %s weight gradient (+= onto 0.5)", c);
    allclose(dw, F32(c, "dw"), (long)nw, 1e-4, 1e-5, what);
    if (bias) {
        snprintf(what, sizeof what, "deconv %s bias gradient (+= onto 0.25)", c);
        allclose(db, F32(c, "db"), K, 1e-4, 1e-5, what);
    }
    /* dinp NULL: not needed (and nothing else changes) */
    memset(dw, 0, nw * sizeof *dw);
    be->deconv_backward(&ctx, NULL, dw, NULL, F32(c, "dout"), F32(c, "inp"), w, N, C, K, H, W, s);
    snprintf(what, sizeof what, "deconv %s weight gradient with dinp NULL", c);
    allclose(dw, F32(c, "dw"), (long)nw, 1e-4, 1e-5, what);
    free(out), free(dinp), free(dw), free(db);
}

static void check_bce(const char *c)
{
    const int32_t *cfg = need(c, "cfg")->data;
    int R = cfg[0], K = cfg[1], MM = cfg[2];
    size_t n = (size_t)R * K * MM;
    const float *x = F32(c, "logits"), *t = F32(c, "targets");
    const int32_t *lab = need(c, "labels")->data;
    float loss = NAN, *dx = filled(n, NAN);
    is_int(be->mask_bce_forward(&ctx, &loss, x, lab, t, (float)R * MM, R, K, MM), 0,
           "mask loss %s (R %d K %d MM %d)", c, R, K, MM);
    is_close(loss, F32(c, "loss")[0], 1e-6, 1e-5, "mask loss %s vs binary_cross_entropy_with_logits",
             c);
    is_int(be->mask_bce_backward(&ctx, dx, x, lab, t, 1.0f, (float)R * MM, R, K, MM), 0,
           "mask loss %s backward", c);
    char what[96];
    snprintf(what, sizeof what, "mask loss %s gradient (zero off the target channel)", c);
    allclose(dx, F32(c, "dlogits"), (long)n, 1e-9, 1e-5, what);
    int finite = 1;
    for (size_t i = 0; i < n; i++) finite &= isfinite(dx[i]);
    ok(finite && isfinite(loss), "mask loss %s: finite loss and gradient", c);
    free(dx);
}

static void check_bce_contract(void)
{
    float x[2 * 3 * 4] = {0}, t[2 * 4] = {0}, loss = 1.0f, dx[24];
    int32_t lab[2] = {1, 3};
    is_int(be->mask_bce_forward(&ctx, &loss, x, lab, t, 8.0f, 2, 3, 4), PS_EINVAL,
           "mask loss: label 3 of 3 channels refused");
    ok(isnan(loss), "mask loss: NaN after a bad label");
    lab[1] = -1;
    is_int(be->mask_bce_backward(&ctx, dx, x, lab, t, 1.0f, 8.0f, 2, 3, 4), PS_EINVAL,
           "mask loss backward: label -1 refused");
    loss = 7.0f;
    is_int(be->mask_bce_forward(&ctx, &loss, x, lab, t, 1.0f, 0, 3, 4), 0, "mask loss: R = 0");
    ok(loss == 0.0f, "mask loss: R = 0 gives 0 (torchvision: mask_logits.sum() * 0)");
    /* closed form: logit 0 on every pixel -> log 2 whatever the target */
    lab[0] = 2, lab[1] = 0;
    t[1] = 1.0f, t[6] = 0.25f;
    is_int(be->mask_bce_forward(&ctx, &loss, x, lab, t, 8.0f, 2, 3, 4), 0, "mask loss: zeros");
    is_close(loss, log(2.0), 1e-7, 1e-6, "mask loss of zero logits = log 2");
}

int main(int argc, char **argv)
{
    ps_engine_init(&ctx, 2);
    if (argc > 1) {
        if (golden_load(argv[1], 200)) {
            printf("Bail out! cannot load %s\n", argv[1]);
            return 1;
        }
    } else {
        golden_load_or_bail("tests/golden/mask_layers_golden.bin", 200);
    }
    const char *dc[] = {"dc2", "dc3", "dc_head", "dc1"};
    for (int i = 0; i < 4; i++) check_deconv(dc[i]);
    const char *bce[] = {"bce", "bce_sat", "bce_one"};
    for (int i = 0; i < 3; i++) check_bce(bce[i]);
    check_bce_contract();
    /* the scale slot (Cascade R-CNN's feature-gradient scale): x *= alpha */
    float v[5] = {3.0f, -1.5f, 0.0f, 6e-39f, 1e30f};
    be->scale(&ctx, v, 1.0f / 3.0f, 5);
    ok(v[0] == 1.0f && v[1] == -0.5f && v[2] == 0.0f && v[3] == 6e-39f * (1.0f / 3.0f) &&
       v[4] == 1e30f * (1.0f / 3.0f), "scale: x *= 1/3 elementwise");
    golden_free();
    ps_ctx_free(&ctx);
    return tap_done();
}
