/* Half storage of activations on the CUDA backend (--precision fp16|bf16,
 * docs/cuda.md "Half storage"): every layer forward and backward with its
 * activations and activation gradients stored half NHWC, against the CPU
 * fp32 reference on the same random inputs.  Exits 77 without a GPU
 * (tests/test_cuda_emu.sh runs the same kernels' source on the CPU).
 *
 * Inputs go in through ps_cuda_half_store (fp32 NCHW -> half NHWC, tagged
 * half), outputs come back through ps_cuda_half_load; every output buffer
 * is poisoned first with 0xFF bytes, which is NaN read as fp32, fp16 or
 * bf16, so an element a kernel forgot to write fails.  Parameter gradients
 * start from random values (accumulation is checked).  Half outputs must
 * also be tagged half, fp32 ones (logits, parameter gradients, BN
 * statistics, the model-input gradient) not.
 *
 * Tolerance: |gpu - cpu| <= tol * max|ref| + tol * |ref|, tol 1e-2 (fp16)
 * or 3e-2 (bf16).  The CPU sees the unrounded fp32 inputs, so the error is
 * the input rounding (unit roundoff u = 2^-11 fp16, 2^-8 bf16) carried
 * through the layer plus one output rounding, a few u of the tensor's
 * scale; tol is ~20u (fp16) / ~8u (bf16).  Max pooling gets inputs already
 * rounded to the precision on both sides, so its forward and argmax are
 * exact (ties included).  The worst error of each comparison is printed. */
#include "tests/lib/tap.h"
#include "tests/lib/cuda_testutil.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "ps_error.h"
#include "ps_half.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#include "worker/engine/ps_engine.h"
#include "ps_log.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static ps_ctx_t cctx, gctx;
static const ps_backend_t *C_ = &ps_backend_cpu, *G_ = &ps_backend_cuda;
static int prec;
static double tol;

/* x rounded to the precision under test (what half storage keeps) */
static float hround(float x)
{
    return prec == PS_PRECISION_BF16 ? ps_bf16_to_fp32_1(ps_fp32_to_bf16_1(x))
                                : ps_fp16_to_fp32_1(ps_fp32_to_fp16_1(x));
}
static void *dup_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    if (ps_cuda_malloc(&d, bytes ? bytes : 4) || ps_cuda_memcpy_h2d(d, h, bytes)) {
        printf("Bail out! device allocation/copy failed\n");
        exit(1);
    }
    ps_cuda_device_sync();
    /* a fresh allocation may reuse the address of a freed half tensor */
    ps_cuda_half_forget(&gctx, d);
    return d;
}
static float *dev(const float *h, size_t n) { return dup_dev(h, n * sizeof(float)); }
/* 0xFF bytes: NaN as fp32, as fp16 and as bf16 */
static float *dev_poison(size_t n)
{
    unsigned char *h = malloc((n ? n : 1) * sizeof(float));
    memset(h, 0xFF, (n ? n : 1) * sizeof(float));
    float *d = dup_dev(h, n * sizeof(float));
    free(h);
    return d;
}
static void *down_bytes(const void *d, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 4);
    if (ps_cuda_backend_sync(&gctx) || ps_cuda_memcpy_d2h(h, d, bytes)) {
        printf("Bail out! device sync/copy failed (a kernel fault?)\n");
        exit(1);
    }
    return h;
}
static float *down(const float *d, size_t n) { return down_bytes(d, n * sizeof(float)); }
/* a device half tensor holding host NCHW values h (rounded on the way) */
static float *hin(const float *h, int N, int C, int HW)
{
    const size_t n = (size_t)N * C * HW;
    float *tmp = dev(h, n), *d = dev_poison(n);
    if (ps_cuda_half_store(&gctx, d, tmp, N, C, HW) || ps_cuda_backend_sync(&gctx)) {
        printf("Bail out! ps_cuda_half_store failed\n");
        exit(1);
    }
    ps_cuda_free(tmp);
    return d;
}

static double last_rel_worst;
static void cmp_host(const float *got, const float *want, size_t n, double atol, double rtol,
                     const char *what)
{
    last_rel_worst = cmp_report(got, want, n, atol, rtol, what);
}
/* an fp32 device result (parameter gradients, statistics, logits) */
static void fcmp(const float *dgot, const float *want, size_t n, const char *what)
{
    ok(!ps_cuda_is_half(&gctx, dgot), "%s: stored fp32", what);
    float *got = down(dgot, n);
    cmp_host(got, want, n, tol * maxabs(want, n) + 1e-30, tol, what);
    free(got);
}
/* a half device result (N, C, HW) NHWC against the NCHW reference */
static void hcmp_tol(const float *dgot, const float *want, int N, int C, int HW, double t,
                     const char *what)
{
    const size_t n = (size_t)N * C * HW;
    ok(ps_cuda_is_half(&gctx, dgot), "%s: stored half", what);
    float *tmp = dev_poison(n);
    if (ps_cuda_half_load(&gctx, tmp, dgot, N, C, HW)) {
        ok(0, "%s: ps_cuda_half_load", what);
        ps_cuda_free(tmp);
        return;
    }
    float *got = down(tmp, n);
    cmp_host(got, want, n, t * maxabs(want, n) + 1e-30, t, what);
    free(got);
    ps_cuda_free(tmp);
}
#define hcmp(d, w, N, C, HW, what) hcmp_tol((d), (w), (N), (C), (HW), tol, (what))

/* ---- elementwise: relu, add, accumulate, mixed-storage refusals ---------- */

static void test_elementwise(void)
{
    const int N = 2, C = 16, HW = 49;
    const size_t n = (size_t)N * C * HW;
    float *x = hrand(n, 1, 0), *b = hrand(n, 1, 0), *dy = hrand(n, 1, 0);
    float *y = hnan(n), *dx = hnan(n), *s = hnan(n);
    float *gx = hin(x, N, C, HW), *gb = hin(b, N, C, HW), *gdy = hin(dy, N, C, HW);
    float *gy = dev_poison(n), *gs = dev_poison(n);

    C_->relu_forward(&cctx, y, x, n);
    G_->relu_forward(&gctx, gy, gx, n);
    hcmp(gy, y, N, C, HW, "relu forward");
    ok(last_rel_worst > 1e-7, "the half path ran (relu error %.3g of max|ref| > fp32 rounding)",
       last_rel_worst);
    C_->relu_backward(&cctx, dx, dy, y, n);
    G_->relu_backward(&gctx, gdy, gdy, gy, n); /* in place, as the model calls it */
    hcmp(gdy, dx, N, C, HW, "relu backward (in place)");

    C_->add(&cctx, s, x, b, n);
    G_->add(&gctx, gs, gx, gb, n);
    hcmp(gs, s, N, C, HW, "add");
    C_->accumulate(&cctx, s, x, n);
    G_->accumulate(&gctx, gs, gx, n);
    hcmp(gs, s, N, C, HW, "accumulate");

    /* mixed storage: refused with a logged error, nothing written */
    float *gf = dev(b, n), *gz = dev_poison(n);
    G_->add(&gctx, gz, gx, gf, n);
    unsigned *bits = down_bytes(gz, n * sizeof(float));
    int untouched = 1;
    for (size_t i = 0; i < n; i++) untouched &= bits[i] == 0xFFFFFFFFu;
    ok(untouched && !ps_cuda_is_half(&gctx, gz),
       "add of a half and an fp32 tensor is refused, output untouched");
    free(bits);
    float *lg = hin(x, 7, 10, 1), *pr = dev_poison(70);
    int32_t lab[7] = {0, 1, 2, 3, 4, 5, 6};
    int32_t *glab = dup_dev(lab, sizeof lab);
    float loss = G_->xent_forward(&gctx, pr, lg, glab, 7, 10);
    ok(isnan(loss), "xent on half logits is refused (loss NaN): loss stays fp32");

    free(x), free(b), free(dy), free(y), free(dx), free(s);
    float *ds[] = {gx, gb, gdy, gy, gs, gf, gz, lg, pr, (float *)glab};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) ps_cuda_free(ds[i]);
}

/* ---- dropout (mask bit for bit), tshift, consensus ------------------------ */

static void test_dropout_shift_consensus(void)
{
    const int N = 16, F = 64;
    const size_t n = (size_t)N * F;
    float *x = hrand(n, 1, 0), *dy = hrand(n, 1, 0), *y = hnan(n), *dx = hnan(n);
    uint8_t *m = malloc(n);
    float *gx = hin(x, N, F, 1), *gdy = hin(dy, N, F, 1), *gy = dev_poison(n),
          *gdx = dev_poison(n);
    uint8_t *gm = dup_dev(m, n);
    C_->dropout_forward(&cctx, y, m, x, n, 0.3f, 77);
    G_->dropout_forward(&gctx, gy, gm, gx, n, 0.3f, 77);
    uint8_t *hm = down_bytes(gm, n);
    ok(!memcmp(hm, m, n), "dropout mask bit for bit the CPU's ((N, F) features)");
    hcmp(gy, y, N, F, 1, "dropout forward");
    C_->dropout_backward(&cctx, dx, dy, m, n, 0.3f);
    G_->dropout_backward(&gctx, gdx, gdy, gm, n, 0.3f);
    hcmp(gdx, dx, N, F, 1, "dropout backward");
    free(x), free(dy), free(y), free(dx), free(m), free(hm);
    ps_cuda_free(gx), ps_cuda_free(gdy), ps_cuda_free(gy), ps_cuda_free(gdx), ps_cuda_free(gm);

    /* temporal shift on (B*T, C, HW) frames */
    const int B = 2, T = 8, C = 16, HW = 9, fd = 8;
    const size_t ns = (size_t)B * T * C * HW;
    float *a = hrand(ns, 1, 0), *ya = hnan(ns), *da = hnan(ns);
    float *ga = hin(a, B * T, C, HW), *gya = dev_poison(ns), *gda = dev_poison(ns);
    C_->tshift_forward(&cctx, ya, a, B, T, C, HW, fd);
    G_->tshift_forward(&gctx, gya, ga, B, T, C, HW, fd);
    hcmp(gya, ya, B * T, C, HW, "tshift forward (NHWC frames)");
    C_->tshift_backward(&cctx, da, a, B, T, C, HW, fd);
    G_->tshift_backward(&gctx, gda, ga, B, T, C, HW, fd);
    hcmp(gda, da, B * T, C, HW, "tshift backward");
    G_->tshift_forward(&gctx, ga, ga, B, T, C, HW, fd);
    hcmp(ga, ya, B * T, C, HW, "tshift forward in place");
    free(a), free(ya), free(da);
    ps_cuda_free(ga), ps_cuda_free(gya), ps_cuda_free(gda);

    /* consensus over half (B, T, K) */
    const int K = 10;
    const size_t ni = (size_t)B * T * K, no = (size_t)B * K;
    float *l = hrand(ni, 2, 0), *dl = hrand(no, 1, 0), *c = hnan(no), *dc = hnan(ni);
    float *gl = hin(l, B * T, K, 1), *gdl = hin(dl, B, K, 1), *gc = dev_poison(no),
          *gdc = dev_poison(ni);
    C_->consensus_forward(&cctx, c, l, B, T, K);
    G_->consensus_forward(&gctx, gc, gl, B, T, K);
    hcmp(gc, c, B, K, 1, "consensus forward (half)");
    C_->consensus_backward(&cctx, dc, dl, B, T, K);
    G_->consensus_backward(&gctx, gdc, gdl, B, T, K);
    hcmp(gdc, dc, B * T, K, 1, "consensus backward (half)");
    free(l), free(dl), free(c), free(dc);
    ps_cuda_free(gl), ps_cuda_free(gdl), ps_cuda_free(gc), ps_cuda_free(gdc);
}

/* ---- pooling ---------------------------------------------------------------- */

static void test_maxpool(int N, int C, int H, int W, int R, int st, int pad)
{
    ps_pool_desc_t d = {R, R, st, st, pad, pad};
    const int P = ps_conv_out(H, R, st, pad, 1), Q = ps_conv_out(W, R, st, pad, 1);
    const size_t ni = (size_t)N * C * H * W, no = (size_t)N * C * P * Q;
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "maxpool N%d C%d %dx%d %d/%d pad %d", N, C, H, W, R, st, pad);
    float *x = hrand(ni, 1, 0), *dy = hrand(no, 1, 0), *y = hnan(no), *dx = hnan(ni);
    for (size_t i = 0; i < ni; i++) x[i] = hround(x[i]);
    for (size_t i = 0; i + 1 < ni; i += 7) x[i + 1] = x[i]; /* ties */
    for (size_t i = 0; i < no; i++) dy[i] = hround(dy[i]);
    int32_t *am = malloc(no * 4), *gam = NULL;
    float *gx = hin(x, N, C, H * W), *gdy = hin(dy, N, C, P * Q), *gy = dev_poison(no),
          *gdx = dev_poison(ni);
    gam = dup_dev(am, no * 4);
    C_->maxpool_forward(&cctx, y, am, x, &d, N, C, H, W);
    G_->maxpool_forward(&gctx, gy, gam, gx, &d, N, C, H, W);
    snprintf(what, sizeof what, "%s forward (exact on rounded inputs)", tag);
    hcmp_tol(gy, y, N, C, P * Q, 0, what);
    /* the GPU's argmax is in the output's NHWC order */
    int32_t *h = down_bytes(gam, no * 4);
    int same = 1;
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < P * Q; p++)
                same &= h[((size_t)i * P * Q + p) * C + c] == am[((size_t)i * C + c) * P * Q + p];
    ok(same, "%s argmax identical (ties included)", tag);
    C_->maxpool_backward(&cctx, dx, dy, am, &d, N, C, H, W);
    G_->maxpool_backward(&gctx, gdx, gdy, gam, &d, N, C, H, W);
    snprintf(what, sizeof what, "%s backward", tag);
    hcmp(gdx, dx, N, C, H * W, what);
    free(x), free(dy), free(y), free(dx), free(am), free(h);
    ps_cuda_free(gx), ps_cuda_free(gdy), ps_cuda_free(gy), ps_cuda_free(gdx);
    ps_cuda_free(gam);
}

static void test_avgpool(int N, int C, int HW)
{
    const size_t n = (size_t)N * C * HW, no = (size_t)N * C;
    char what[96];
    float *x = hrand(n, 1, 0.5f), *dy = hrand(no, 1, 0), *y = hnan(no), *dx = hnan(n);
    float *gx = hin(x, N, C, HW), *gdy = hin(dy, N, C, 1), *gy = dev_poison(no),
          *gdx = dev_poison(n);
    C_->avgpool_forward(&cctx, y, x, N, C, HW);
    G_->avgpool_forward(&gctx, gy, gx, N, C, HW);
    snprintf(what, sizeof what, "avgpool N%d C%d HW%d forward", N, C, HW);
    hcmp(gy, y, N, C, 1, what);
    C_->avgpool_backward(&cctx, dx, dy, N, C, HW);
    G_->avgpool_backward(&gctx, gdx, gdy, N, C, HW);
    snprintf(what, sizeof what, "avgpool N%d C%d HW%d backward", N, C, HW);
    hcmp(gdx, dx, N, C, HW, what);
    free(x), free(dy), free(y), free(dx);
    ps_cuda_free(gx), ps_cuda_free(gdy), ps_cuda_free(gy), ps_cuda_free(gdx);
}

/* ---- batchnorm: half activations, fp32 statistics and parameters --------- */

static void test_bn(int N, int C, int HW, int affine)
{
    const size_t n = (size_t)N * C * HW;
    char tag[64], what[160];
    snprintf(tag, sizeof tag, "bn N%d C%d HW%d%s", N, C, HW, affine ? "" : " no-affine");
    float *x = hrand(n, 1, 0.5f), *g = hrand(C, 0.5f, 1.0f), *be = hrand(C, 0.5f, 0);
    float *rm = hrand(C, 0.2f, 0), *rv = hrand(C, 0.4f, 1.0f), *dy = hrand(n, 1, 0);
    float *dg0 = hrand(C, 0.1f, 0), *db0 = hrand(C, 0.1f, 0);
    float *y = hnan(n), *sm = hnan(C), *sr = hnan(C), *dx = hnan(n);
    float *dg = hcopy(dg0, C), *db = hcopy(db0, C);
    float *gx = hin(x, N, C, HW), *gdy = hin(dy, N, C, HW), *gg = dev(g, C), *gbe = dev(be, C),
          *grm = dev(rm, C), *grv = dev(rv, C), *gy = dev_poison(n), *gsm = dev_poison(C),
          *gsr = dev_poison(C), *gdx = dev_poison(n), *gdg = dev(dg0, C), *gdb = dev(db0, C);
    const float *A = affine ? g : NULL, *B = affine ? be : NULL;
    const float *GA = affine ? gg : NULL, *GB = affine ? gbe : NULL;

    C_->bn_forward_train(&cctx, y, sm, sr, rm, rv, x, A, B, 1e-5f, 0.1f, N, C, HW);
    G_->bn_forward_train(&gctx, gy, gsm, gsr, grm, grv, gx, GA, GB, 1e-5f, 0.1f, N, C, HW);
#define W_(s) (snprintf(what, sizeof what, "%s %s", tag, s), what)
    hcmp(gy, y, N, C, HW, W_("train forward"));
    fcmp(gsm, sm, C, W_("save_mean (fp32)"));
    fcmp(gsr, sr, C, W_("save_rstd (fp32)"));
    fcmp(grm, rm, C, W_("running_mean (fp32)"));
    fcmp(grv, rv, C, W_("running_var (fp32, unbiased)"));
    C_->bn_backward_train(&cctx, dx, affine ? dg : NULL, affine ? db : NULL, dy, x, A, sm, sr,
                          N, C, HW);
    G_->bn_backward_train(&gctx, gdx, affine ? gdg : NULL, affine ? gdb : NULL, gdy, gx, GA,
                          gsm, gsr, N, C, HW);
    hcmp(gdx, dx, N, C, HW, W_("train dinp"));
    if (affine) {
        fcmp(gdg, dg, C, W_("train dgamma (fp32, accumulated)"));
        fcmp(gdb, db, C, W_("train dbeta (fp32, accumulated)"));
    }
    float *y2 = hnan(n), *dx2 = hnan(n), *gy2 = dev_poison(n), *gdx2 = dev_poison(n);
    C_->bn_forward_eval(&cctx, y2, x, A, B, rm, rv, 1e-5f, N, C, HW);
    G_->bn_forward_eval(&gctx, gy2, gx, GA, GB, grm, grv, 1e-5f, N, C, HW);
    hcmp(gy2, y2, N, C, HW, W_("eval forward"));
    C_->bn_backward_eval(&cctx, dx2, affine ? dg : NULL, affine ? db : NULL, dy, x, A, rm, rv,
                         1e-5f, N, C, HW);
    G_->bn_backward_eval(&gctx, gdx2, affine ? gdg : NULL, affine ? gdb : NULL, gdy, gx, GA,
                         grm, grv, 1e-5f, N, C, HW);
    hcmp(gdx2, dx2, N, C, HW, W_("eval dinp"));
    if (affine) fcmp(gdg, dg, C, W_("eval dgamma (accumulated twice)"));
    C_->bn_backward_eval(&cctx, dx2, NULL, NULL, dy, x, A, rm, rv, 1e-5f, N, C, HW);
    G_->bn_backward_eval(&gctx, gdx, NULL, NULL, gdy, gx, GA, grm, grv, 1e-5f, N, C, HW);
    hcmp(gdx, dx2, N, C, HW, W_("frozen dinp"));
#undef W_
    float *hs[] = {x, g, be, rm, rv, dy, dg0, db0, y, sm, sr, dx, dg, db, y2, dx2};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
    float *ds[] = {gx, gdy, gg, gbe, grm, grv, gy, gsm, gsr, gdx, gdg, gdb, gy2, gdx2};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) ps_cuda_free(ds[i]);
}

/* ---- conv2d: half in / half out; fp32 in (the model input) / half out ---- */

static void test_conv(int N, int C, int H, int W, int K, int R, int st, int pad, int bias,
                      int fp32_in)
{
    ps_conv2d_desc_t d = {C, K, R, R, st, st, pad, pad, 1, 1, 1};
    const int P = ps_conv_out(H, R, st, pad, 1), Q = ps_conv_out(W, R, st, pad, 1);
    const size_t ni = (size_t)N * C * H * W, no = (size_t)N * K * P * Q, nw = (size_t)K * C * R * R;
    char tag[128], what[200];
    snprintf(tag, sizeof tag, "conv N%d C%d %dx%d K%d %dx%d/%d p%d%s, %s input", N, C, H, W, K,
             R, R, st, pad, bias ? " +b" : "", fp32_in ? "fp32" : "half");
    if (ps_ctx_reserve(&cctx, ps_conv2d_workspace(&d, N, H, W))) {
        ok(0, "%s: CPU workspace", tag);
        return;
    }
    float *x = hrand(ni, 1, 0), *w = hrand(nw, 0.5f, 0), *b = hrand(K, 0.5f, 0);
    float *dy = hrand(no, 1, 0), *dw0 = hrand(nw, 0.1f, 0), *db0 = hrand(K, 0.1f, 0);
    float *y = hnan(no), *dx = hnan(ni), *dw = hcopy(dw0, nw), *db = hcopy(db0, K);
    float *gx = fp32_in ? dev(x, ni) : hin(x, N, C, H * W), *gw = dev(w, nw), *gb = dev(b, K);
    float *gdy = hin(dy, N, K, P * Q), *gy = dev_poison(no), *gdx = dev_poison(ni),
          *gdw = dev(dw0, nw), *gdb = dev(db0, K);
#define W_(s) (snprintf(what, sizeof what, "%s %s", tag, s), what)
    C_->conv2d_forward(&cctx, y, x, w, bias ? b : NULL, &d, N, H, W);
    G_->conv2d_forward(&gctx, gy, gx, gw, bias ? gb : NULL, &d, N, H, W);
    hcmp(gy, y, N, K, P * Q, W_("forward"));
    C_->conv2d_backward(&cctx, dx, dw, bias ? db : NULL, dy, x, w, &d, N, H, W);
    G_->conv2d_backward(&gctx, gdx, gdw, bias ? gdb : NULL, gdy, gx, gw, &d, N, H, W);
    if (fp32_in)
        fcmp(gdx, dx, ni, W_("dinp (fp32 like its input)"));
    else
        hcmp(gdx, dx, N, C, H * W, W_("dinp"));
    fcmp(gdw, dw, nw, W_("dw (fp32, accumulated)"));
    if (bias) fcmp(gdb, db, K, W_("db (fp32, accumulated, from half dout)"));
#undef W_
    free(x), free(w), free(b), free(dy), free(dw0), free(db0), free(y), free(dx), free(dw);
    free(db);
    float *ds[] = {gx, gw, gb, gdy, gy, gdx, gdw, gdb};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) ps_cuda_free(ds[i]);
}

/* ---- linear: half features in, fp32 logits out ----------------------------- */

static void test_linear(int N, int C, int K)
{
    const size_t ni = (size_t)N * C, no = (size_t)N * K, nw = (size_t)K * C;
    char what[128];
    float *x = hrand(ni, 1, 0), *w = hrand(nw, 0.3f, 0), *b = hrand(K, 0.5f, 0);
    float *dy = hrand(no, 1, 0), *dw0 = hrand(nw, 0.1f, 0), *db0 = hrand(K, 0.1f, 0);
    float *y = hnan(no), *dx = hnan(ni), *dw = hcopy(dw0, nw), *db = hcopy(db0, K);
    float *gx = hin(x, N, C, 1), *gw = dev(w, nw), *gb = dev(b, K), *gdy = dev(dy, no);
    float *gy = dev_poison(no), *gdx = dev_poison(ni), *gdw = dev(dw0, nw), *gdb = dev(db0, K);
    C_->linear_forward(&cctx, y, x, w, b, N, C, K);
    G_->linear_forward(&gctx, gy, gx, gw, gb, N, C, K);
    snprintf(what, sizeof what, "linear N%d C%d K%d forward (fp32 logits)", N, C, K);
    fcmp(gy, y, no, what);
    C_->linear_backward(&cctx, dx, dw, db, dy, x, w, N, C, K);
    G_->linear_backward(&gctx, gdx, gdw, gdb, gdy, gx, gw, N, C, K);
    snprintf(what, sizeof what, "linear N%d C%d K%d dinp (half)", N, C, K);
    hcmp(gdx, dx, N, C, 1, what);
    snprintf(what, sizeof what, "linear N%d C%d K%d dw (fp32, accumulated)", N, C, K);
    fcmp(gdw, dw, nw, what);
    snprintf(what, sizeof what, "linear N%d C%d K%d db (fp32, accumulated)", N, C, K);
    fcmp(gdb, db, K, what);
    free(x), free(w), free(b), free(dy), free(dw0), free(db0), free(y), free(dx), free(dw);
    free(db);
    float *ds[] = {gx, gw, gb, gdy, gy, gdx, gdw, gdb};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) ps_cuda_free(ds[i]);
}

static void run(int p, const char *name, double t)
{
    int rc = ps_cuda_backend_set_precision(&gctx, p);
    if (rc == PS_EUNSUPPORTED) {
        ok(1, "%s # SKIP not supported on this device", name);
        return;
    }
    ok(rc == 0, "%s: precision set", name);
    if (rc) return;
    ok(ps_cuda_backend_half_storage(&gctx) == 1, "%s: half storage on by default", name);
    prec = p;
    tol = t;
    diag("---- %s storage: tolerance %g of max|ref| (+ %g relative)", name, t, t);
    test_elementwise();
    test_dropout_shift_consensus();
    test_maxpool(2, 8, 11, 11, 3, 2, 1);
    test_maxpool(1, 5, 8, 8, 2, 2, 0);
    test_avgpool(4, 16, 49);
    test_avgpool(2, 8, 1);
    test_bn(4, 8, 25, 1);
    test_bn(2, 16, 49, 0);
    test_bn(3, 5, 1, 1);
    /*        N  C   H   W   K  R st pad bias fp32_in */
    test_conv(2, 8, 9, 9, 16, 3, 1, 1, 1, 0);
    test_conv(3, 16, 14, 14, 32, 1, 2, 0, 0, 0);
    test_conv(2, 3, 23, 23, 8, 7, 2, 3, 1, 1); /* the stem on the fp32 model input */
    test_linear(16, 64, 10);
    ok(ps_cuda_backend_set_precision(&gctx, PS_PRECISION_FP32) == 0 &&
           ps_cuda_backend_half_storage(&gctx) == 0, "%s: back to fp32, storage off", name);
}

int main(void)
{
    if (ps_cuda_device_count() == 0) tap_skip_all("no CUDA device");
    ps_log_level = PS_LOG_WARN;
    if (ps_engine_init(&cctx, 0) || ps_engine_init(&gctx, 0) ||
        ps_cuda_backend_init(&gctx, 0)) {
        printf("Bail out! cannot initialise the engines\n");
        return 1;
    }
    ok(ps_cuda_backend_set_half_storage(&gctx, 1) == PS_EINVAL,
       "half storage refused in fp32 mode");
    run(PS_PRECISION_FP16, "fp16", 1e-2);
    run(PS_PRECISION_BF16, "bf16", 3e-2);
    ps_cuda_backend_free(&gctx);
    ps_ctx_free(&cctx);
    ps_ctx_free(&gctx);
    return tap_done();
}
