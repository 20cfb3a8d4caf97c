/* The detection slots of the CUDA table (worker/engine/cuda/det_layers.cu)
 * against the CPU table's (worker/engine/layers/upsample_add.c, focal.c,
 * smoothl1.c, head_permute.c, themselves checked against PyTorch by
 * tests/test_det_layers): FPN upsample-add (2x, odd sizes as
 * torchvision's FPN makes them, same size, a shrink), sigmoid focal loss
 * (mixed labels, no positives, all ignored, K = 1, |logit| up to 1e4, a bad
 * label), smooth-L1 (both sides of beta), the head permute and the positive
 * count.  Outputs are poisoned with NaN before every call, so an element a
 * kernel forgot shows up; a rejected call must leave its output untouched.
 * Exits 77 without a GPU.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol |cpu|):
 *   exact: upsample-add forward and backward (the kernel gathers in the
 *     CPU's float summation order), head permute, smooth-L1 backward (the
 *     same double formula, no sum), the positive count;
 *   rtol 1e-6 (atol 1e-7 x max|ref|): the losses (double sums in another
 *     order, then rounded to float) and focal backward (double exp / pow /
 *     log1p of the GPU's libm: a few double ulps before the float rounding).
 * Far below the 1e-4 a wrong formula or index would exceed. */
#include "tests/lib/tap.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#include "worker/engine/ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static ps_ctx_t g, c; /* the CUDA backend's context, the CPU's */
static const ps_backend_t *const gpu = &ps_backend_cuda, *const cpu = &ps_backend_cpu;

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static float frand(void) /* [-1, 1) */
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static float *hrand(size_t n, float scale)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}
static float *hfill(size_t n, float v)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}
static void *dev(const void *h, size_t bytes)
{
    void *d = NULL;
    if (ps_cuda_malloc(&d, bytes ? bytes : 4) || ps_cuda_memcpy_h2d(d, h, bytes) ||
        ps_cuda_device_sync()) {
        printf("Bail out! device allocation/copy failed\n");
        exit(1);
    }
    return d;
}
static float *down(const void *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (ps_cuda_backend_sync(&g) || ps_cuda_memcpy_d2h(h, d, n * sizeof *h)) {
        printf("Bail out! device sync/copy failed (a kernel fault?)\n");
        exit(1);
    }
    return h;
}
static double maxabs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}
static void cmp(const float *dgot, const float *want, size_t n, double atol, double rtol,
                const char *what)
{
    float *got = down(dgot, n);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
    }
    allclose(got, want, (long)n, atol, rtol, what);
    diag("  %s: max |err| %.3g (max |ref| %.3g)", what, worst, maxabs(want, n));
    free(got);
}
#define REL(ref, n) (1e-7 * maxabs((ref), (n)) + 1e-30), 1e-6

/* ---- upsample-add --------------------------------------------------------- */

static void test_upsample(int N, int C, int H, int W, int P, int Q)
{
    char what[128];
    size_t nt = (size_t)N * C * H * W, nl = (size_t)N * C * P * Q;
    float *top = hrand(nt, 1), *lat = hrand(nl, 1), *dout = hrand(nl, 1);
    float *out = hfill(nl, NAN), *dtop = hfill(nt, NAN), *dlat = hfill(nl, NAN);
    float *gtop = dev(top, nt * 4), *glat = dev(lat, nl * 4), *gdout = dev(dout, nl * 4);
    float *gout = dev(out, nl * 4), *gdtop = dev(dtop, nt * 4), *gdlat = dev(dlat, nl * 4);

    cpu->upsample_add_forward(&c, out, lat, top, N, C, H, W, P, Q);
    gpu->upsample_add_forward(&g, gout, glat, gtop, N, C, H, W, P, Q);
    snprintf(what, sizeof what, "upsample-add forward N%d C%d %dx%d -> %dx%d", N, C, H, W, P, Q);
    cmp(gout, out, nl, 0, 0, what);
    /* in place (out = lateral), as the model calls it */
    gpu->upsample_add_forward(&g, glat, glat, gtop, N, C, H, W, P, Q);
    cmp(glat, out, nl, 0, 0, "  ... in place (out aliases lateral)");

    cpu->upsample_add_backward(&c, dlat, dtop, dout, N, C, H, W, P, Q);
    gpu->upsample_add_backward(&g, gdlat, gdtop, gdout, N, C, H, W, P, Q);
    snprintf(what, sizeof what, "upsample-add backward dtop N%d C%d %dx%d <- %dx%d", N, C, H, W,
             P, Q);
    cmp(gdtop, dtop, nt, 0, 0, what);
    cmp(gdlat, dlat, nl, 0, 0, "  ... dlateral = dout");
    /* dlateral NULL (the model's call), dtop re-poisoned */
    float *poison = hfill(nt, NAN);
    ps_cuda_backend_sync(&g);
    ps_cuda_memcpy_h2d(gdtop, poison, nt * 4);
    ps_cuda_device_sync();
    gpu->upsample_add_backward(&g, NULL, gdtop, gdout, N, C, H, W, P, Q);
    cmp(gdtop, dtop, nt, 0, 0, "  ... dtop with dlateral NULL");
    free(poison);
    free(top), free(lat), free(dout), free(out), free(dtop), free(dlat);
    ps_cuda_free(gtop), ps_cuda_free(glat), ps_cuda_free(gdout), ps_cuda_free(gout);
    ps_cuda_free(gdtop), ps_cuda_free(gdlat);
}

/* ---- focal loss and smooth-L1 --------------------------------------------- */

/* mode 0: labels -1..K mixed; 1: no positives (0 / -1); 2: all ignored */
static void test_losses(int A, int K, float scale, int mode, const char *tag)
{
    const float alpha = 0.25f, gamma = 2.0f, beta = 1.0f / 9.0f;
    size_t nk = (size_t)A * K, n4 = (size_t)A * 4;
    float *x = hrand(nk, scale), *pred = hrand(n4, 0.3f), *tgt = hrand(n4, 0.3f);
    int32_t *lab = malloc((size_t)A * sizeof *lab);
    for (int a = 0; a < A; a++) {
        int r = (int)((frand() + 1.0f) * 1000.0f);
        lab[a] = mode == 2 ? -1 : mode == 1 ? (r % 3 == 0 ? -1 : 0) : r % (K + 2) - 1;
    }
    if (scale > 100 && A > 3) { /* the extremes, both labels */
        x[0] = 1e4f, x[1] = -1e4f, x[nk - 1] = 1e4f, x[nk - 2] = -1e4f;
    }
    int npos = cpu->count_pos(&c, lab, A);
    float norm = npos > 1 ? (float)npos : 1.0f;
    int32_t *glab = dev(lab, (size_t)A * 4);
    float *gx = dev(x, nk * 4), *gpred = dev(pred, n4 * 4), *gtgt = dev(tgt, n4 * 4);
    float *dx = hfill(nk, NAN), *dp = hfill(n4, NAN);
    float *gdx = dev(dx, nk * 4), *gdp = dev(dp, n4 * 4);

    is_int(gpu->count_pos(&g, glab, A), npos, "%s: count_pos (%d)", tag, npos);
    float lc = NAN, lg = NAN;
    int rc = cpu->focal_forward(&c, &lc, x, lab, alpha, gamma, norm, A, K);
    int rg = gpu->focal_forward(&g, &lg, gx, glab, alpha, gamma, norm, A, K);
    ok(rc == 0 && rg == 0, "%s: focal forward accepted", tag);
    is_close(lg, lc, 1e-30, 1e-6, "%s: focal loss %.9g (A %d K %d, normaliser %g)", tag, lc, A,
             K, norm);
    ok(isfinite(lg), "%s: focal loss finite", tag);
    cpu->focal_backward(&c, dx, x, lab, 1.3f, alpha, gamma, norm, A, K);
    rg = gpu->focal_backward(&g, gdx, gx, glab, 1.3f, alpha, gamma, norm, A, K);
    is_int(rg, 0, "%s: focal backward accepted", tag);
    cmp(gdx, dx, nk, REL(dx, nk), "focal backward dlogits");

    cpu->smoothl1_forward(&c, &lc, pred, tgt, lab, beta, norm, A);
    gpu->smoothl1_forward(&g, &lg, gpred, gtgt, glab, beta, norm, A);
    is_close(lg, lc, 1e-30, 1e-6, "%s: smooth-L1 loss %.9g", tag, lc);
    cpu->smoothl1_backward(&c, dp, pred, tgt, lab, 0.7f, beta, norm, A);
    gpu->smoothl1_backward(&g, gdp, gpred, gtgt, glab, 0.7f, beta, norm, A);
    cmp(gdp, dp, n4, 0, 0, "smooth-L1 backward dpred (0 off the positives)");

    free(x), free(pred), free(tgt), free(lab), free(dx), free(dp);
    ps_cuda_free(glab), ps_cuda_free(gx), ps_cuda_free(gpred), ps_cuda_free(gtgt);
    ps_cuda_free(gdx), ps_cuda_free(gdp);
}

/* A label outside -1..K: refused with PS_EINVAL, NaN loss, nothing written. */
static void test_bad_label(void)
{
    const int A = 300, K = 4;
    float *x = hrand((size_t)A * K, 2), *sent = hfill((size_t)A * K, 7.0f);
    int32_t *lab = calloc(A, sizeof *lab);
    lab[5] = 1;
    lab[211] = K + 1;
    lab[250] = -2;
    int32_t *glab = dev(lab, (size_t)A * 4);
    float *gx = dev(x, (size_t)A * K * 4), *gdx = dev(sent, (size_t)A * K * 4);
    float l = 0;
    is_int(gpu->focal_forward(&g, &l, gx, glab, 0.25f, 2, 1, A, K), PS_EINVAL,
           "bad label: focal forward refuses (PS_EINVAL)");
    ok(isnan(l), "bad label: loss is NaN");
    is_int(gpu->focal_backward(&g, gdx, gx, glab, 1, 0.25f, 2, 1, A, K), PS_EINVAL,
           "bad label: focal backward refuses");
    cmp(gdx, sent, (size_t)A * K, 0, 0, "bad label: dlogits untouched");
    free(x), free(sent), free(lab);
    ps_cuda_free(glab), ps_cuda_free(gx), ps_cuda_free(gdx);
}

/* ---- head permute ---------------------------------------------------------- */

static void test_permute(int nA, int D, int H, int W)
{
    size_t n = (size_t)nA * D * H * W;
    float *x = hrand(n, 1), *y = hfill(n, NAN), *dx = hfill(n, NAN);
    float *gx = dev(x, n * 4), *gy = dev(y, n * 4), *gdx = dev(dx, n * 4);
    char what[96];
    cpu->head_permute_forward(&c, y, x, nA, D, H, W);
    gpu->head_permute_forward(&g, gy, gx, nA, D, H, W);
    snprintf(what, sizeof what, "head permute forward nA%d D%d %dx%d", nA, D, H, W);
    cmp(gy, y, n, 0, 0, what);
    cpu->head_permute_backward(&c, dx, y, nA, D, H, W);
    gpu->head_permute_backward(&g, gdx, gy, nA, D, H, W);
    cmp(gdx, dx, n, 0, 0, "  ... backward (inverse permute)");
    cmp(gdx, x, n, 0, 0, "  ... backward(forward(x)) == x");
    free(x), free(y), free(dx);
    ps_cuda_free(gx), ps_cuda_free(gy), ps_cuda_free(gdx);
}

int main(void)
{
    if (ps_cuda_device_count() == 0) tap_skip_all("no CUDA device");
    ps_log_level = PS_LOG_WARN; /* the bad-label checks log an error on purpose */
    if (ps_engine_init(&c, 1) || ps_engine_init(&g, 1) || ps_cuda_backend_init(&g, 0)) {
        printf("Bail out! cannot initialise the CUDA backend\n");
        return 1;
    }
    char info[256] = "";
    ps_cuda_open(0, info, sizeof info);
    diag("device %s", info);

    /*            N  C  H   W   P   Q */
    test_upsample(2, 3, 4, 5, 8, 10);    /* exact 2x */
    test_upsample(2, 3, 5, 7, 9, 13);    /* odd lateral: torchvision's FPN on 9x13 */
    test_upsample(1, 2, 3, 3, 7, 7);     /* non-integer scale 7/3 */
    test_upsample(1, 4, 7, 6, 7, 6);     /* same size */
    test_upsample(2, 2, 6, 5, 3, 4);     /* shrink: some top pixels get nothing */
    test_upsample(2, 64, 25, 25, 50, 50); /* a 400 px image's C5 -> C4 */

    test_losses(1000, 7, 5.0f, 0, "mixed labels");
    test_losses(4097, 3, 3.0f, 0, "odd A");
    test_losses(777, 5, 2.0f, 1, "no positives (normaliser 1)");
    test_losses(300, 4, 2.0f, 2, "all ignored");
    test_losses(513, 1, 4.0f, 0, "K = 1");
    test_losses(200, 6, 1e4f, 0, "|logit| up to 1e4");
    test_losses(9 * (64 * 64 + 32 * 32 + 16 * 16 + 8 * 8 + 4 * 4) * 2, 80, 6.0f, 0,
                "RetinaNet 512 px, 2 images, 80 classes");
    test_bad_label();

    test_permute(9, 5, 3, 7);
    test_permute(9, 4, 1, 1);
    test_permute(9, 80, 16, 16);

    ps_cuda_backend_free(&g);
    ps_ctx_free(&g);
    ps_ctx_free(&c);
    return tap_done();
}
