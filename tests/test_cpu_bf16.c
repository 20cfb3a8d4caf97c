/* The CPU backend at bf16 precision (set_precision; psworker --precision
 * bf16 --device cpu): convolutions through oneDNN's bf16 primitives and
 * linear layers on bf16-rounded operands, fp32 accumulation, fp32 BN,
 * loss and weights.  Runs only on a CPU with native bf16 (AVX-512 BF16 or
 * AMX) and a build with oneDNN: exit 77 elsewhere, saying why.  (Refusal
 * where bf16 is absent is checked by test_conv_providers, everywhere.)
 *
 * Layers: forward and both backward directions of every convolution shape
 * of the ResNets (and linear) against the convolution summed in double
 * over the SAME bf16-rounded operands, within (L+2)*u*sum|terms| (u =
 * 2^-24): a product of two bf16 values is exact in fp32, so only the fp32
 * summation rounds, in whatever order (the bound of test_conv_providers).
 * That the rounding happened at all: the results differ from the fp32
 * layer on the unrounded operands.
 *
 * Whole model: a small TSM-ResNet-18 step (the one test_half_round
 * measures) at bf16 against fp32: every gradient's relative L2 error at
 * most 2x that of the rounding reference backend (backend_half_round.h,
 * which rounds at every place the GPU stores half, a superset of what the
 * CPU rounds) + 0.01 -- the bound gpu_bench check uses for the GPU -- and
 * above zero. */
#include "tests/lib/tap.h"
#include "worker/engine/backend_half_round.h"
#include "worker/engine/layers/conv_provider.h"
#include "worker/engine/layers/cpu_layers.h"
#include "worker/engine/ps_blas.h"
#include "worker/engine/ps_engine.h"
#include "worker/models/model_snap.h"
#include "worker/models/ps_model.h"
#include "ps_error.h"
#include "ps_half.h"
#include "ps_log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define U 5.9604644775390625e-08 /* 2^-24 */
#define PRIOR 0.25f

static float r16(float x) { return ps_bf16_to_fp32_1(ps_fp32_to_bf16_1(x)); }

static float *rnd(size_t n, unsigned seed, int rounded)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
        if (rounded) p[i] = r16(p[i]);
    }
    return p;
}

static float *fill(size_t n, float v)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}

/* got vs exact + prior within (L+2)u(abs + |prior|) */
static void within(const char *what, const float *got, const double *exact, const double *abs,
                   size_t n, int L, float prior)
{
    size_t bad = 0, worst = 0;
    double wr = 0;
    for (size_t i = 0; i < n; i++) {
        const double bound = (L + 2) * U * (abs[i] + fabs(prior)) + 1e-30;
        const double r = fabs((double)got[i] - (exact[i] + prior)) / bound;
        if (!(r <= 1)) bad++;
        if (!(r <= wr)) wr = r, worst = i;
    }
    if (!ok(bad == 0, "%s: %zu elements within (L+2)u*sum|terms| of the bf16 operands (L=%d; "
            "worst %.2f of it)", what, n, L, wr))
        printf("#   %zu outside; worst at %zu: got %.9g want %.9g\n", bad, worst,
               (double)got[worst], exact[worst] + prior);
}

typedef struct {
    const char *name;
    ps_conv2d_desc_t d;
    int N, H, W;
} case_t;

static const case_t cases[] = {
    {"3x3 s1 64->64 @14", {64, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 2, 14, 14},
    {"3x3 s2 64->128 @14", {64, 128, 3, 3, 2, 2, 1, 1, 1, 1, 1}, 2, 14, 14},
    {"1x1 s1 64->256 @7", {64, 256, 1, 1, 1, 1, 0, 0, 1, 1, 1}, 2, 7, 7},
    {"1x1 s2 128->256 @8", {128, 256, 1, 1, 2, 2, 0, 0, 1, 1, 1}, 2, 8, 8},
    {"7x7 s2 3->64 @32 (stem)", {3, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1}, 2, 32, 32},
    {"3x3 s1 32->48 @9x7 odd", {32, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 3, 9, 7},
};

static void conv_case(ps_ctx_t *ctx, const case_t *c)
{
    const ps_conv2d_desc_t *d = &c->d;
    const int P = ps_conv_out(c->H, d->R, d->stride_h, d->pad_h, 1);
    const int Q = ps_conv_out(c->W, d->S, d->stride_w, d->pad_w, 1);
    const size_t nx = (size_t)c->N * d->C * c->H * c->W, ny = (size_t)c->N * d->K * P * Q;
    const size_t nw = (size_t)d->K * d->C * d->R * d->S;
    float *x = rnd(nx, 1, 0), *w = rnd(nw, 2, 0), *dy = rnd(ny, 3, 0);
    double *y = calloc(ny, 8), *ya = calloc(ny, 8), *dx = calloc(nx, 8), *dxa = calloc(nx, 8);
    double *dw = calloc(nw, 8), *dwa = calloc(nw, 8);
    for (int n = 0; n < c->N; n++)
        for (int k = 0; k < d->K; k++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++) {
                    const size_t yi = (((size_t)n * d->K + k) * P + p) * Q + q;
                    const double gy = r16(dy[yi]);
                    for (int ci = 0; ci < d->C; ci++)
                        for (int i = 0; i < d->R; i++)
                            for (int j = 0; j < d->S; j++) {
                                const int h = p * d->stride_h - d->pad_h + i;
                                const int ww = q * d->stride_w - d->pad_w + j;
                                if (h < 0 || h >= c->H || ww < 0 || ww >= c->W) continue;
                                const size_t xi = (((size_t)n * d->C + ci) * c->H + h) * c->W + ww;
                                const size_t wi = (((size_t)k * d->C + ci) * d->R + i) * d->S + j;
                                const double xv = r16(x[xi]), wv = r16(w[wi]);
                                y[yi] += xv * wv, ya[yi] += fabs(xv * wv);
                                dx[xi] += gy * wv, dxa[xi] += fabs(gy * wv);
                                dw[wi] += gy * xv, dwa[wi] += fabs(gy * xv);
                            }
                }
    ps_ctx_reserve(ctx, ps_conv2d_workspace(d, c->N, c->H, c->W));
    float *oy = fill(ny, NAN), *odx = fill(nx, NAN), *odw = fill(nw, PRIOR);
    float *fy = fill(ny, NAN);
    ps_cpu_conv2d_forward(ctx, oy, x, w, NULL, d, c->N, c->H, c->W);
    ps_cpu_conv2d_backward(ctx, odx, odw, NULL, dy, x, w, d, c->N, c->H, c->W);
    char m[160];
    snprintf(m, sizeof m, "bf16 conv %s forward", c->name);
    within(m, oy, y, ya, ny, d->C * d->R * d->S, 0);
    snprintf(m, sizeof m, "bf16 conv %s dinp", c->name);
    within(m, odx, dx, dxa, nx, d->K * d->R * d->S, 0);
    snprintf(m, sizeof m, "bf16 conv %s dw (accumulated)", c->name);
    within(m, odw, dw, dwa, nw, c->N * P * Q, PRIOR);
    /* the rounding is real: fp32 on the unrounded operands differs */
    ps_cpu_set_precision(ctx, PS_PRECISION_FP32);
    ps_cpu_conv2d_forward(ctx, fy, x, w, NULL, d, c->N, c->H, c->W);
    ps_cpu_set_precision(ctx, PS_PRECISION_BF16);
    size_t diff = 0;
    for (size_t i = 0; i < ny; i++) diff += fy[i] != oy[i];
    ok(diff > ny / 2, "bf16 conv %s: differs from fp32 in %zu of %zu outputs", c->name, diff, ny);
    free(x), free(w), free(dy), free(y), free(ya), free(dx), free(dxa), free(dw), free(dwa);
    free(oy), free(odx), free(odw), free(fy);
}

static void linear_case(ps_ctx_t *ctx)
{
    enum { N = 16, C = 96, K = 40 };
    float *x = rnd(N * C, 4, 0), *w = rnd(K * C, 5, 0), *dy = rnd(N * K, 6, 0);
    double y[N * K] = {0}, ya[N * K] = {0}, dx[N * C] = {0}, dxa[N * C] = {0};
    double dw[K * C] = {0}, dwa[K * C] = {0};
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int c = 0; c < C; c++) {
                const double xv = r16(x[n * C + c]), wv = r16(w[k * C + c]);
                const double gv = r16(dy[n * K + k]);
                y[n * K + k] += xv * wv, ya[n * K + k] += fabs(xv * wv);
                dx[n * C + c] += gv * wv, dxa[n * C + c] += fabs(gv * wv);
                dw[k * C + c] += gv * xv, dwa[k * C + c] += fabs(gv * xv);
            }
    float *oy = fill(N * K, NAN), *odx = fill(N * C, NAN), *odw = fill(K * C, PRIOR);
    ps_cpu_linear_forward(ctx, oy, x, w, NULL, N, C, K);
    ps_cpu_linear_backward(ctx, odx, odw, NULL, dy, x, w, N, C, K);
    within("bf16 linear forward", oy, y, ya, N * K, C, 0);
    within("bf16 linear dinp", odx, dx, dxa, N * C, K, 0);
    within("bf16 linear dw (accumulated)", odw, dw, dwa, K * C, N, PRIOR);
    free(x), free(w), free(dy), free(oy), free(odx), free(odw);
}

/* One small TSM-ResNet-18 step (test_half_round's): plain CPU at
 * `prec`, or the rounding reference backend at bf16. */
static int model_step(ps_model_snap_t *out, int rounding, ps_precision_t prec)
{
    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = 18, cfg.width = 16, cfg.num_classes = 10, cfg.partial_bn = 0;
    cfg.bn_mode = PS_MODEL_BN_TRAIN;
    enum { CLIPS = 2, HW = 32 };
    ps_ctx_t ctx;
    ps_model_t *m = NULL;
    if (ps_engine_init(&ctx, 0)) return -1;
    const ps_backend_t *be = &ps_backend_cpu;
    if (rounding) {
        if (ps_hround_init(&ctx, PS_PRECISION_BF16, 1.0f)) return -1;
        be = &ps_backend_cpu_round;
    } else if (be->set_precision(&ctx, prec)) {
        return -1;
    }
    if (ps_model_create(&m, &cfg, be, &ctx, CLIPS, HW, HW)) return -1;
    ps_model_init(m, 7, 1);
    ps_model_set_seed(m, 99);
    const size_t nin = (size_t)CLIPS * cfg.n_segment * 3 * HW * HW;
    float *in = malloc(nin * sizeof *in);
    ps_model_hash_fill(in, nin, "input", 5, 1.0);
    int32_t lab[CLIPS] = {3, 8};
    float loss = NAN;
    int rc = ps_model_forward(m, in, CLIPS, lab, 1, &loss) | ps_model_backward(m);
    if (!rc) rc = ps_model_snap(out, m, CLIPS * cfg.num_classes, loss, 1.0);
    if (rounding) ps_hround_free(&ctx);
    ps_model_destroy(&m);
    ps_ctx_free(&ctx);
    free(in);
    return rc;
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv);
    ps_log_level = PS_LOG_WARN;
    char why[192];
    if (!ps_engine_cpu_precision_ok(PS_PRECISION_BF16, why, sizeof why))
        tap_skip_all("no bf16 on this CPU backend: %s", why);
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 0);
    is_int(ps_cpu_set_precision(&ctx, PS_PRECISION_BF16), 0, "set_precision bf16 accepted");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) conv_case(&ctx, &cases[i]);
    linear_case(&ctx);
    char sum[512];
    diag("kernels: %s", ps_conv_summary(sum, sizeof sum));
    ps_ctx_free(&ctx);

    ps_model_snap_t f32, b16, rnd16;
    if (!ok(model_step(&f32, 0, PS_PRECISION_FP32) == 0 &&
                model_step(&b16, 0, PS_PRECISION_BF16) == 0 &&
                model_step(&rnd16, 1, PS_PRECISION_BF16) == 0,
            "TSM-ResNet-18 step at fp32, bf16 and through the bf16 rounding reference"))
        return tap_done();
    const char *wn = "", *wr = "";
    double el, elr;
    const double e = ps_model_snap_cmp(&b16, &f32, &wn, &el, NULL);
    const double er = ps_model_snap_cmp(&rnd16, &f32, &wr, &elr, NULL);
    ok(ps_model_snap_nonfinite(&b16) == 0 && e > 0 && e <= 2 * er + 0.01,
       "bf16 step vs fp32: worst gradient rel L2 %.3g (%s), logits %.3g; the rounding "
       "reference's %.3g (%s): within 2x + 0.01 and above 0", e, wn, el, er, wr);
    ps_model_snap_free(&f32), ps_model_snap_free(&b16), ps_model_snap_free(&rnd16);
    return tap_done();
}
