/* Every layer of the CUDA backend, forward and backward, against the CPU
 * reference (ps_backend_cpu) on random inputs.  Before every call the
 * outputs are poisoned with NaN on both sides (so an element a kernel
 * forgot to write shows up), parameter gradients start from the same
 * random non-zero values (so "accumulate, not overwrite" is checked), and
 * a second backward with dinp = NULL checks that NULL is accepted and the
 * parameter gradients accumulate again.  Exits 77 without a GPU.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol*|cpu|), fp32, inputs in [-1, 1):
 *   exact (atol 0, rtol 0): relu, dropout (mask bit for bit), tshift,
 *     consensus, add, accumulate, maxpool forward/argmax/backward (same scan
 *     and summation order as the CPU);
 *   TOL_RED = atol 2e-5 * max|ref|, rtol 1e-5: reductions whose order
 *     differs (conv via cuDNN, linear via cuBLAS, BN statistics, avgpool,
 *     softmax), i.e. a relative error far below 1e-4 of the tensor's scale.
 * The worst error of every comparison is printed (diag) so the first GPU
 * session can see how much headroom there is. */
#include "tests/lib/tap.h"
#include "tests/lib/cuda_testutil.h"
#include "tests/lib/cuda_devbuf.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "ps_error.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#include "worker/engine/ps_engine.h"
#include "ps_log.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static ps_ctx_t cctx, gctx;
static const ps_backend_t *C_ = &ps_backend_cpu, *G_ = &ps_backend_cuda;

/* ---- host / device buffers --------------------------------------------- */

/* Download after waiting for the backend's stream. */
static float *down(const float *d, size_t n) { return down_ctx(&gctx, d, n * sizeof(float)); }
static void uploaded(void) { ps_cuda_device_sync(); }
static void repoison(float *d, size_t n)
{
    float *h = hnan(n);
    ps_cuda_backend_sync(&gctx);
    ps_cuda_memcpy_h2d(d, h, n * sizeof *h);
    uploaded();
    free(h);
}

/* Worst |err| / max|ref| of the last cmp (the mixed-precision section
 * checks that the half path was really taken). */
static double last_rel_worst;
/* Compare a device tensor with a host reference; prints the worst error. */
static void cmp(const float *dgot, const float *want, size_t n, double atol, double rtol,
                const char *what)
{
    float *got = down(dgot, n);
    last_rel_worst = cmp_report(got, want, n, atol, rtol, what);
    free(got);
}
/* red_tol: 2e-5 for the fp32 backend; the mixed-precision section raises it
 * to its fp16 / bf16 tolerance for conv2d and linear. */
static double red_tol = 2e-5, red_rtol = 1e-5;
#define RED(ref, n) (red_tol * maxabs((ref), (n)) + 1e-30), red_rtol

/* ---- conv2d --------------------------------------------------------------- */

static void test_conv(int N, int C, int H, int W, int K, int R, int S, int sh, int sw, int ph,
                      int pw, int dil, int groups, int bias)
{
    ps_conv2d_desc_t d = {C, K, R, S, sh, sw, ph, pw, dil, dil, groups};
    const int P = ps_conv_out(H, R, sh, ph, dil), Q = ps_conv_out(W, S, sw, pw, dil);
    const size_t ni = (size_t)N * C * H * W, no = (size_t)N * K * P * Q;
    const size_t nw = (size_t)K * (C / groups) * R * S;
    char tag[160];
    snprintf(tag, sizeof tag, "conv N%d C%d %dx%d K%d %dx%d s%d,%d p%d,%d d%d g%d%s", N, C, H,
             W, K, R, S, sh, sw, ph, pw, dil, groups, bias ? " +b" : "");
    /* gctx's host workspace is unused by CUDA; reserved so the harness can
     * also be run with the CPU table on both sides (a self-check of the test) */
    if (ps_ctx_reserve(&cctx, ps_conv2d_workspace(&d, N, H, W)) ||
        ps_ctx_reserve(&gctx, ps_conv2d_workspace(&d, N, H, W))) {
        ok(0, "%s: CPU workspace", tag);
        return;
    }
    float *x = hrand(ni, 1, 0), *w = hrand(nw, 0.5f, 0), *b = hrand(K, 0.5f, 0);
    float *dy = hrand(no, 1, 0), *dw0 = hrand(nw, 0.1f, 0), *db0 = hrand(K, 0.1f, 0);
    float *y = hnan(no), *dx = hnan(ni), *dw = hcopy(dw0, nw), *db = hcopy(db0, K);
    float *gx = dev(x, ni), *gw = dev(w, nw), *gb = dev(b, K), *gdy = dev(dy, no);
    float *gy = dev_nan(no), *gdx = dev_nan(ni), *gdw = dev(dw0, nw), *gdb = dev(db0, K);
    uploaded();
    char what[200];

    C_->conv2d_forward(&cctx, y, x, w, bias ? b : NULL, &d, N, H, W);
    G_->conv2d_forward(&gctx, gy, gx, gw, bias ? gb : NULL, &d, N, H, W);
    snprintf(what, sizeof what, "%s forward", tag);
    cmp(gy, y, no, RED(y, no), what);

    C_->conv2d_backward(&cctx, dx, dw, bias ? db : NULL, dy, x, w, &d, N, H, W);
    G_->conv2d_backward(&gctx, gdx, gdw, bias ? gdb : NULL, gdy, gx, gw, &d, N, H, W);
    snprintf(what, sizeof what, "%s dinp", tag);
    cmp(gdx, dx, ni, RED(dx, ni), what);
    snprintf(what, sizeof what, "%s dw (accumulated)", tag);
    cmp(gdw, dw, nw, RED(dw, nw), what);
    if (bias) {
        snprintf(what, sizeof what, "%s db (accumulated)", tag);
        cmp(gdb, db, K, RED(db, K), what);
    }
    /* again with dinp NULL: dw accumulates a second time */
    C_->conv2d_backward(&cctx, NULL, dw, bias ? db : NULL, dy, x, w, &d, N, H, W);
    G_->conv2d_backward(&gctx, NULL, gdw, bias ? gdb : NULL, gdy, gx, gw, &d, N, H, W);
    snprintf(what, sizeof what, "%s dw after a 2nd backward with dinp NULL", tag);
    cmp(gdw, dw, nw, RED(dw, nw), what);

    free(x); free(w); free(b); free(dy); free(dw0); free(db0); free(y); free(dx); free(dw);
    free(db);
    ps_cuda_free(gx); ps_cuda_free(gw); ps_cuda_free(gb); ps_cuda_free(gdy); ps_cuda_free(gy);
    ps_cuda_free(gdx); ps_cuda_free(gdw); ps_cuda_free(gdb);
}

/* ---- batchnorm ------------------------------------------------------------ */

static void test_bn(int N, int C, int HW, int affine, float offset)
{
    const size_t n = (size_t)N * C * HW;
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "bn N%d C%d HW%d%s offset %g", N, C, HW, affine ? "" : " no-affine",
             (double)offset);
    float *x = hrand(n, 1, offset), *g = hrand(C, 0.5f, 1.0f), *be = hrand(C, 0.5f, 0);
    float *rm = hrand(C, 0.2f, 0), *rv = hrand(C, 0.4f, 1.0f), *dy = hrand(n, 1, 0);
    float *dg0 = hrand(C, 0.1f, 0), *db0 = hrand(C, 0.1f, 0);
    float *y = hnan(n), *sm = hnan(C), *sr = hnan(C), *dx = hnan(n);
    float *crm = hcopy(rm, C), *crv = hcopy(rv, C), *dg = hcopy(dg0, C), *db = hcopy(db0, C);
    float *gx = dev(x, n), *gg = dev(g, C), *gbe = dev(be, C), *grm = dev(rm, C),
          *grv = dev(rv, C), *gdy = dev(dy, n), *gy = dev_nan(n), *gsm = dev_nan(C),
          *gsr = dev_nan(C), *gdx = dev_nan(n), *gdg = dev(dg0, C), *gdb = dev(db0, C);
    uploaded();
    const float *A = affine ? g : NULL, *B = affine ? be : NULL;
    const float *GA = affine ? gg : NULL, *GB = affine ? gbe : NULL;

    /* train */
    C_->bn_forward_train(&cctx, y, sm, sr, crm, crv, x, A, B, 1e-5f, 0.1f, N, C, HW);
    G_->bn_forward_train(&gctx, gy, gsm, gsr, grm, grv, gx, GA, GB, 1e-5f, 0.1f, N, C, HW);
    snprintf(what, sizeof what, "%s train forward", tag);
    cmp(gy, y, n, RED(y, n), what);
    snprintf(what, sizeof what, "%s save_mean", tag);
    cmp(gsm, sm, C, 1e-6 * (1 + fabs(offset)), 1e-5, what);
    snprintf(what, sizeof what, "%s save_rstd", tag);
    cmp(gsr, sr, C, 0, 2e-5, what);
    snprintf(what, sizeof what, "%s running_mean", tag);
    cmp(grm, crm, C, 1e-6 * (1 + fabs(offset)), 1e-5, what);
    snprintf(what, sizeof what, "%s running_var (unbiased)", tag);
    cmp(grv, crv, C, 0, 2e-5, what);

    C_->bn_backward_train(&cctx, dx, affine ? dg : NULL, affine ? db : NULL, dy, x, A, sm, sr,
                          N, C, HW);
    G_->bn_backward_train(&gctx, gdx, affine ? gdg : NULL, affine ? gdb : NULL, gdy, gx, GA,
                          gsm, gsr, N, C, HW);
    snprintf(what, sizeof what, "%s train dinp", tag);
    cmp(gdx, dx, n, RED(dx, n), what);
    if (affine) {
        snprintf(what, sizeof what, "%s train dgamma (accumulated)", tag);
        cmp(gdg, dg, C, RED(dg, C), what);
        snprintf(what, sizeof what, "%s train dbeta (accumulated)", tag);
        cmp(gdb, db, C, RED(db, C), what);
    }

    /* eval with the (updated) running stats, then frozen backward */
    float *y2 = hnan(n), *dx2 = hnan(n);
    float *gy2 = dev_nan(n), *gdx2 = dev_nan(n);
    uploaded();
    C_->bn_forward_eval(&cctx, y2, x, A, B, crm, crv, 1e-5f, N, C, HW);
    G_->bn_forward_eval(&gctx, gy2, gx, GA, GB, grm, grv, 1e-5f, N, C, HW);
    snprintf(what, sizeof what, "%s eval forward", tag);
    cmp(gy2, y2, n, RED(y2, n), what);
    C_->bn_backward_eval(&cctx, dx2, affine ? dg : NULL, affine ? db : NULL, dy, x, A, crm, crv,
                         1e-5f, N, C, HW);
    G_->bn_backward_eval(&gctx, gdx2, affine ? gdg : NULL, affine ? gdb : NULL, gdy, gx, GA,
                         grm, grv, 1e-5f, N, C, HW);
    snprintf(what, sizeof what, "%s eval dinp", tag);
    cmp(gdx2, dx2, n, RED(dx2, n), what);
    if (affine) {
        snprintf(what, sizeof what, "%s eval dgamma (accumulated twice)", tag);
        cmp(gdg, dg, C, RED(dg, C), what);
        snprintf(what, sizeof what, "%s eval dbeta (accumulated twice)", tag);
        cmp(gdb, db, C, RED(db, C), what);
    }
    /* frozen: dgamma/dbeta NULL, dinp only */
    repoison(gdx2, n);
    for (size_t i = 0; i < n; i++) dx2[i] = NAN;
    C_->bn_backward_eval(&cctx, dx2, NULL, NULL, dy, x, A, crm, crv, 1e-5f, N, C, HW);
    G_->bn_backward_eval(&gctx, gdx2, NULL, NULL, gdy, gx, GA, grm, grv, 1e-5f, N, C, HW);
    snprintf(what, sizeof what, "%s frozen dinp (dgamma/dbeta NULL)", tag);
    cmp(gdx2, dx2, n, RED(dx2, n), what);

    float *hs[] = {x, g, be, rm, rv, dy, dg0, db0, y, sm, sr, dx, crm, crv, dg, db, y2, dx2};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
    float *ds[] = {gx, gg, gbe, grm, grv, gdy, gy, gsm, gsr, gdx, gdg, gdb, gy2, gdx2};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) ps_cuda_free(ds[i]);
}

/* ---- pooling ---------------------------------------------------------------- */

static void test_maxpool(int N, int C, int H, int W, int R, int st, int pad)
{
    ps_pool_desc_t d = {R, R, st, st, pad, pad};
    const int P = ps_conv_out(H, R, st, pad, 1), Q = ps_conv_out(W, R, st, pad, 1);
    const size_t ni = (size_t)N * C * H * W, no = (size_t)N * C * P * Q;
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "maxpool N%d C%d %dx%d %dx%d/%d pad %d", N, C, H, W, R, R, st, pad);
    float *x = hrand(ni, 1, 0), *dy = hrand(no, 1, 0), *y = hnan(no), *dx = hnan(ni);
    /* ties: a few equal values so the first-max rule matters */
    for (size_t i = 0; i + 1 < ni; i += 7) x[i + 1] = x[i];
    int32_t *am = malloc(no * 4), *gam_h = malloc(no * 4);
    for (size_t i = 0; i < no; i++) am[i] = -7;
    float *gx = dev(x, ni), *gdy = dev(dy, no), *gy = dev_nan(no), *gdx = dev_nan(ni);
    int32_t *gam = dup_dev(am, no * 4);
    uploaded();
    C_->maxpool_forward(&cctx, y, am, x, &d, N, C, H, W);
    G_->maxpool_forward(&gctx, gy, gam, gx, &d, N, C, H, W);
    snprintf(what, sizeof what, "%s forward", tag);
    cmp(gy, y, no, 0, 0, what);
    ps_cuda_backend_sync(&gctx);
    ps_cuda_memcpy_d2h(gam_h, gam, no * 4);
    ok(!memcmp(gam_h, am, no * 4), "%s argmax identical", tag);
    C_->maxpool_backward(&cctx, dx, dy, am, &d, N, C, H, W);
    G_->maxpool_backward(&gctx, gdx, gdy, gam, &d, N, C, H, W);
    snprintf(what, sizeof what, "%s backward", tag);
    cmp(gdx, dx, ni, 0, 0, what);
    free(x); free(dy); free(y); free(dx); free(am); free(gam_h);
    ps_cuda_free(gx); ps_cuda_free(gdy); ps_cuda_free(gy); ps_cuda_free(gdx); ps_cuda_free(gam);
}

static void test_avgpool(int N, int C, int HW)
{
    const size_t ni = (size_t)N * C * HW, no = (size_t)N * C;
    char what[96];
    float *x = hrand(ni, 1, 0.5f), *dy = hrand(no, 1, 0), *y = hnan(no), *dx = hnan(ni);
    float *gx = dev(x, ni), *gdy = dev(dy, no), *gy = dev_nan(no), *gdx = dev_nan(ni);
    uploaded();
    C_->avgpool_forward(&cctx, y, x, N, C, HW);
    G_->avgpool_forward(&gctx, gy, gx, N, C, HW);
    snprintf(what, sizeof what, "avgpool N%d C%d HW%d forward", N, C, HW);
    cmp(gy, y, no, RED(y, no), what);
    C_->avgpool_backward(&cctx, dx, dy, N, C, HW);
    G_->avgpool_backward(&gctx, gdx, gdy, N, C, HW);
    snprintf(what, sizeof what, "avgpool N%d C%d HW%d backward", N, C, HW);
    cmp(gdx, dx, ni, 0, 0, what);
    free(x); free(dy); free(y); free(dx);
    ps_cuda_free(gx); ps_cuda_free(gdy); ps_cuda_free(gy); ps_cuda_free(gdx);
}

/* ---- linear ------------------------------------------------------------------- */

static void test_linear(int N, int C, int K, int bias)
{
    const size_t ni = (size_t)N * C, no = (size_t)N * K, nw = (size_t)K * C;
    char tag[64], what[128];
    snprintf(tag, sizeof tag, "linear N%d C%d K%d%s", N, C, K, bias ? " +b" : "");
    float *x = hrand(ni, 1, 0), *w = hrand(nw, 0.3f, 0), *b = hrand(K, 0.3f, 0);
    float *dy = hrand(no, 1, 0), *dw0 = hrand(nw, 0.1f, 0), *db0 = hrand(K, 0.1f, 0);
    float *y = hnan(no), *dx = hnan(ni), *dw = hcopy(dw0, nw), *db = hcopy(db0, K);
    float *gx = dev(x, ni), *gw = dev(w, nw), *gb = dev(b, K), *gdy = dev(dy, no);
    float *gy = dev_nan(no), *gdx = dev_nan(ni), *gdw = dev(dw0, nw), *gdb = dev(db0, K);
    uploaded();
    C_->linear_forward(&cctx, y, x, w, bias ? b : NULL, N, C, K);
    G_->linear_forward(&gctx, gy, gx, gw, bias ? gb : NULL, N, C, K);
    snprintf(what, sizeof what, "%s forward", tag);
    cmp(gy, y, no, RED(y, no), what);
    C_->linear_backward(&cctx, dx, dw, bias ? db : NULL, dy, x, w, N, C, K);
    G_->linear_backward(&gctx, gdx, gdw, bias ? gdb : NULL, gdy, gx, gw, N, C, K);
    snprintf(what, sizeof what, "%s dinp", tag);
    cmp(gdx, dx, ni, RED(dx, ni), what);
    snprintf(what, sizeof what, "%s dw (accumulated)", tag);
    cmp(gdw, dw, nw, RED(dw, nw), what);
    if (bias) {
        snprintf(what, sizeof what, "%s db (accumulated)", tag);
        cmp(gdb, db, K, RED(db, K), what);
    }
    C_->linear_backward(&cctx, NULL, dw, NULL, dy, x, w, N, C, K);
    G_->linear_backward(&gctx, NULL, gdw, NULL, gdy, gx, gw, N, C, K);
    snprintf(what, sizeof what, "%s dw after a 2nd backward with dinp NULL", tag);
    cmp(gdw, dw, nw, RED(dw, nw), what);
    free(x); free(w); free(b); free(dy); free(dw0); free(db0); free(y); free(dx); free(dw);
    free(db);
    ps_cuda_free(gx); ps_cuda_free(gw); ps_cuda_free(gb); ps_cuda_free(gdy); ps_cuda_free(gy);
    ps_cuda_free(gdx); ps_cuda_free(gdw); ps_cuda_free(gdb);
}

/* ---- the small layers -------------------------------------------------------- */

static void test_small_layers(void)
{
    char what[128];
    /* relu, out of place and in place; exact zeros and negative zeros included */
    {
        const size_t n = 10007;
        float *x = hrand(n, 1, 0), *dy = hrand(n, 1, 0), *y = hnan(n), *dx = hnan(n);
        for (size_t i = 0; i < n; i += 97) x[i] = (i / 97) % 2 ? 0.0f : -0.0f;
        float *gx = dev(x, n), *gdy = dev(dy, n), *gy = dev_nan(n), *gdx = dev_nan(n);
        uploaded();
        C_->relu_forward(&cctx, y, x, n);
        G_->relu_forward(&gctx, gy, gx, n);
        cmp(gy, y, n, 0, 0, "relu forward");
        C_->relu_backward(&cctx, dx, dy, y, n);
        G_->relu_backward(&gctx, gdx, gdy, gy, n);
        cmp(gdx, dx, n, 0, 0, "relu backward");
        G_->relu_forward(&gctx, gx, gx, n); /* in place */
        cmp(gx, y, n, 0, 0, "relu forward in place");
        G_->relu_backward(&gctx, gdy, gdy, gy, n); /* dinp aliases dout */
        cmp(gdy, dx, n, 0, 0, "relu backward in place");
        free(x); free(dy); free(y); free(dx);
        ps_cuda_free(gx); ps_cuda_free(gdy); ps_cuda_free(gy); ps_cuda_free(gdx);
    }
    /* add / accumulate, including aliasing */
    {
        const size_t n = 4099;
        float *a = hrand(n, 1, 0), *b = hrand(n, 1, 0), *y = hnan(n), *acc = hcopy(a, n);
        float *ga = dev(a, n), *gb = dev(b, n), *gy = dev_nan(n);
        uploaded();
        C_->add(&cctx, y, a, b, n);
        G_->add(&gctx, gy, ga, gb, n);
        cmp(gy, y, n, 0, 0, "add");
        C_->accumulate(&cctx, acc, b, n);
        G_->accumulate(&gctx, ga, gb, n);
        cmp(ga, acc, n, 0, 0, "accumulate");
        C_->add(&cctx, acc, acc, b, n);
        G_->add(&gctx, ga, ga, gb, n); /* out aliases a */
        cmp(ga, acc, n, 0, 0, "add with out aliasing a");
        free(a); free(b); free(y); free(acc);
        ps_cuda_free(ga); ps_cuda_free(gb); ps_cuda_free(gy);
    }
    /* dropout: the mask is ps_rng_uniform's, bit for bit */
    for (int k = 0; k < 3; k++) {
        const size_t n = 100003;
        const float p = k == 0 ? 0.5f : k == 1 ? 0.2f : 0.0f;
        const uint64_t seed = 0x1234567ull * (k + 1);
        float *x = hrand(n, 1, 0), *dy = hrand(n, 1, 0), *y = hnan(n), *dx = hnan(n);
        uint8_t *m = malloc(n), *gm_h = malloc(n);
        memset(m, 0xAA, n);
        float *gx = dev(x, n), *gdy = dev(dy, n), *gy = dev_nan(n), *gdx = dev_nan(n);
        uint8_t *gm = dup_dev(m, n);
        uploaded();
        C_->dropout_forward(&cctx, y, m, x, n, p, seed);
        G_->dropout_forward(&gctx, gy, gm, gx, n, p, seed);
        snprintf(what, sizeof what, "dropout p=%.1f forward", (double)p);
        cmp(gy, y, n, 0, 0, what);
        ps_cuda_backend_sync(&gctx);
        ps_cuda_memcpy_d2h(gm_h, gm, n);
        ok(!memcmp(gm_h, m, n), "dropout p=%.1f mask identical to the CPU's", (double)p);
        C_->dropout_backward(&cctx, dx, dy, m, n, p);
        G_->dropout_backward(&gctx, gdx, gdy, gm, n, p);
        snprintf(what, sizeof what, "dropout p=%.1f backward", (double)p);
        cmp(gdx, dx, n, 0, 0, what);
        free(x); free(dy); free(y); free(dx); free(m); free(gm_h);
        ps_cuda_free(gx); ps_cuda_free(gdy); ps_cuda_free(gy); ps_cuda_free(gdx);
        ps_cuda_free(gm);
    }
    /* softmax cross-entropy */
    for (int k = 0; k < 3; k++) {
        const int N = k == 0 ? 6 : k == 1 ? 16 : 300, K = k == 0 ? 10 : k == 1 ? 400 : 7;
        const size_t n = (size_t)N * K;
        float *x = hrand(n, 5, 0), *pr = hnan(n), *dx = hnan(n);
        int32_t *lab = malloc(N * 4);
        for (int i = 0; i < N; i++) lab[i] = (int32_t)((i * 7919u + 3) % K);
        float *gx = dev(x, n), *gpr = dev_nan(n), *gdx = dev_nan(n);
        int32_t *glab = dup_dev(lab, N * 4);
        uploaded();
        const float lc = C_->xent_forward(&cctx, pr, x, lab, N, K);
        const float lg = G_->xent_forward(&gctx, gpr, gx, glab, N, K);
        is_close(lg, lc, 0, 1e-6, "xent N%d K%d loss (cpu %.7g)", N, K, (double)lc);
        snprintf(what, sizeof what, "xent N%d K%d probs", N, K);
        cmp(gpr, pr, n, 1e-7, 1e-5, what);
        C_->xent_backward(&cctx, dx, pr, lab, 1.3f, N, K);
        G_->xent_backward(&gctx, gdx, gpr, glab, 1.3f, N, K);
        snprintf(what, sizeof what, "xent N%d K%d backward", N, K);
        cmp(gdx, dx, n, 1e-7, 1e-5, what);
        if (k == 0) { /* a bad label: NaN loss, reported */
            lab[2] = K;
            ps_cuda_memcpy_h2d(glab, lab, N * 4);
            uploaded();
            ps_log_level = -1; /* the error is expected */
            const float bad = G_->xent_forward(&gctx, gpr, gx, glab, N, K);
            ps_log_level = PS_LOG_WARN;
            ok(isnan(bad), "xent with a label outside [0,K) returns NaN");
        }
        free(x); free(pr); free(dx); free(lab);
        ps_cuda_free(gx); ps_cuda_free(gpr); ps_cuda_free(gdx); ps_cuda_free(glab);
    }
    /* temporal shift */
    const int ts[][5] = {{2, 4, 16, 5, 8}, {2, 8, 8, 3, 4}, {1, 3, 7, 2, 8}, {3, 8, 64, 49, 8}};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        const int B = ts[k][0], T = ts[k][1], C = ts[k][2], HW = ts[k][3], fd = ts[k][4];
        const size_t n = (size_t)B * T * C * HW;
        float *x = hrand(n, 1, 0), *y = hnan(n), *dx = hnan(n);
        float *gx = dev(x, n), *gy = dev_nan(n), *gdx = dev_nan(n);
        uploaded();
        C_->tshift_forward(&cctx, y, x, B, T, C, HW, fd);
        G_->tshift_forward(&gctx, gy, gx, B, T, C, HW, fd);
        snprintf(what, sizeof what, "tshift B%d T%d C%d HW%d fold_div %d forward", B, T, C, HW,
                 fd);
        cmp(gy, y, n, 0, 0, what);
        C_->tshift_backward(&cctx, dx, x, B, T, C, HW, fd);
        G_->tshift_backward(&gctx, gdx, gx, B, T, C, HW, fd);
        snprintf(what, sizeof what, "tshift B%d T%d C%d HW%d fold_div %d backward", B, T, C, HW,
                 fd);
        cmp(gdx, dx, n, 0, 0, what);
        /* the kernel also works in place (one pass, columns walked in the
         * direction of the shift), though the table's contract doesn't ask */
        G_->tshift_forward(&gctx, gx, gx, B, T, C, HW, fd);
        snprintf(what, sizeof what, "tshift B%d T%d C%d HW%d fold_div %d forward in place", B,
                 T, C, HW, fd);
        cmp(gx, y, n, 0, 0, what);
        free(x); free(y); free(dx);
        ps_cuda_free(gx); ps_cuda_free(gy); ps_cuda_free(gdx);
    }
    /* segment consensus */
    {
        const int B = 3, T = 8, K = 10;
        const size_t ni = (size_t)B * T * K, no = (size_t)B * K;
        float *x = hrand(ni, 3, 0), *dy = hrand(no, 1, 0), *y = hnan(no), *dx = hnan(ni);
        float *gx = dev(x, ni), *gdy = dev(dy, no), *gy = dev_nan(no), *gdx = dev_nan(ni);
        uploaded();
        C_->consensus_forward(&cctx, y, x, B, T, K);
        G_->consensus_forward(&gctx, gy, gx, B, T, K);
        cmp(gy, y, no, 0, 0, "consensus forward");
        C_->consensus_backward(&cctx, dx, dy, B, T, K);
        G_->consensus_backward(&gctx, gdx, gdy, B, T, K);
        cmp(gdx, dx, ni, 0, 0, "consensus backward");
        free(x); free(dy); free(y); free(dx);
        ps_cuda_free(gx); ps_cuda_free(gdy); ps_cuda_free(gy); ps_cuda_free(gdx);
    }
    /* the loss-scale overflow check on the device */
    {
        const size_t n = 1 << 20;
        float *g = hrand(n, 1e4f, 0);
        float *gg = dev(g, n);
        uploaded();
        int found = -1;
        ok(ps_cuda_check_overflow(gg, n, &found, NULL) == 0 && found == 0,
           "device overflow check: clean buffer");
        const float bad[] = {INFINITY, -INFINITY, NAN};
        const size_t at[] = {0, n / 2 + 1, n - 1};
        int all = 1;
        for (int b = 0; b < 3; b++) {
            ps_cuda_memcpy_h2d(gg + at[b], &bad[b], sizeof(float));
            found = 0;
            all &= ps_cuda_check_overflow(gg, n, &found, NULL) == 0 && found == 1;
            ps_cuda_memcpy_h2d(gg + at[b], &g[at[b]], sizeof(float));
        }
        ok(all, "device overflow check finds Inf, -Inf and NaN at start, middle, end");
        ok(ps_cuda_scale(gg, n, 0.25f, NULL) == 0, "device unscale launch");
        ps_cuda_device_sync();
        for (size_t i = 0; i < n; i++) g[i] *= 0.25f;
        cmp(gg, g, n, 0, 0, "device unscale by 1/4 is exact");
        free(g);
        ps_cuda_free(gg);
    }
}


/* ---- mixed precision: conv2d / linear on fp16 / bf16 operands ------------
 * Tolerance (atol = tol * max|ref|, rtol = tol) from the rounding of the
 * operands and of the result: fp16 has a unit roundoff of 2^-11 = 4.9e-4,
 * bf16 2^-9 = 2e-3; a K-term dot product of rounded inputs is off by about
 * 2u * |term| * sqrt(K), well under u * max|out|, plus one rounding of the
 * result (u of the value; dw is rounded before it is added in fp32).  So
 * fp16: 2e-3, bf16: 1e-2 leave a margin of ~4x; the fp32 reference is the
 * CPU backend. */
static void test_mixed(int prec, const char *name, double tol)
{
    int rc = ps_cuda_backend_set_precision(&gctx, prec);
    if (rc == PS_EUNSUPPORTED) {
        ok(1, "%s # SKIP not supported on this device", name);
        return;
    }
    ok(rc == 0, "%s: precision set", name);
    if (rc) return;
    /* fp32 tensors, half operand copies inside conv / linear: the form
     * without half storage (tests/test_cuda_half.c covers half storage) */
    ok(ps_cuda_backend_set_half_storage(&gctx, 0) == 0, "%s: half storage off", name);
    red_tol = red_rtol = tol;
    diag("---- %s operands, fp32 accumulation: tolerance %g of max|ref|", name, tol);
    /*        N  C   H   W   K  R  S sh sw ph pw dil g bias */
    test_conv(2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1);
    ok(last_rel_worst > 1e-6, "%s: the half path is taken (conv error %.3g of max|ref| is "
       "above fp32 rounding)", name, last_rel_worst);
    test_conv(2, 8, 10, 10, 12, 3, 3, 2, 2, 1, 1, 1, 1, 0);
    test_conv(3, 16, 14, 14, 32, 1, 1, 2, 2, 0, 0, 1, 1, 0);
    test_conv(2, 3, 23, 23, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1);  /* stem: C = 3 */
    /* (no grouped convolution: ResNets have none, and a cuDNN refusal of
     * grouped NHWC half would abort the whole run on a short GPU lease) */
    test_conv(1, 4, 8, 12, 6, 3, 5, 2, 1, 1, 2, 1, 1, 1);   /* asymmetric */
    test_conv(4, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1, 0); /* ResNet-sized */
    test_conv(2, 64, 14, 14, 256, 1, 1, 1, 1, 0, 0, 1, 1, 0);
    test_linear(6, 32, 10, 1);
    test_linear(64, 2048, 400, 1);
    ok(last_rel_worst > 1e-6, "%s: the half path is taken (linear error %.3g)", name,
       last_rel_worst);
    red_tol = 2e-5, red_rtol = 1e-5;
    ok(ps_cuda_backend_set_precision(&gctx, PS_PRECISION_FP32) == 0, "%s: back to fp32", name);
}

/* The loss scale is applied in xent's backward: dlogits = scale * the
 * unscaled ones, exactly (a power of two). */
static void test_xent_scale(void)
{
    const int N = 5, K = 7;
    const size_t n = (size_t)N * K;
    float *z = hrand(n, 3, 0);
    int32_t lab[5] = {0, 6, 3, 3, 1};
    float *gz = dev(z, n), *gp = dev_nan(n), *gdz = dev_nan(n);
    int32_t *glab = (int32_t *)dup_dev(lab, sizeof lab);
    uploaded();
    G_->xent_forward(&gctx, gp, gz, glab, N, K);
    G_->xent_backward(&gctx, gdz, gp, glab, 1.0f, N, K);
    float *unscaled = down(gdz, n);
    ok(ps_cuda_backend_set_loss_scale(&gctx, 1024.0f) == 0, "loss scale 1024 set");
    repoison(gdz, n);
    G_->xent_backward(&gctx, gdz, gp, glab, 1.0f, N, K);
    for (size_t i = 0; i < n; i++) unscaled[i] *= 1024.0f;
    cmp(gdz, unscaled, n, 0, 0, "xent backward with loss scale 1024 = 1024 x unscaled, exactly");
    is_int(ps_cuda_backend_set_loss_scale(&gctx, 0.0f), PS_EINVAL, "loss scale 0 refused");
    ps_cuda_backend_set_loss_scale(&gctx, 1.0f);
    free(z); free(unscaled);
    ps_cuda_free(gz); ps_cuda_free(gp); ps_cuda_free(gdz); ps_cuda_free(glab);
}

/* Gradient-ready events: a slot recorded after a layer completes once that
 * layer's output is written, while later work is still queued. */
static void test_events(void)
{
    const size_t n = (size_t)1 << 22;
    float *x = hrand(n, 1, 0), *y = hnan(n);
    float *gx = dev(x, n), *gy = dev_nan(n), *acc = dev_nan(n);
    uploaded();
    ok(ps_cuda_backend_events(&gctx, 2) == 0, "2 event slots made");
    is_int(ps_cuda_backend_event_record(&gctx, 2), PS_EINVAL, "slot 2 of 2: refused");
    G_->relu_forward(&gctx, gy, gx, n);
    ok(ps_cuda_backend_event_record(&gctx, 0) == 0, "slot 0 recorded after relu");
    for (int i = 0; i < 20; i++) G_->add(&gctx, acc, gx, gx, n); /* later work */
    ok(ps_cuda_backend_event_record(&gctx, 1) == 0, "slot 1 recorded after 20 adds");
    ok(ps_cuda_backend_event_wait(&gctx, 0) == 0, "wait for slot 0");
    is_int(ps_cuda_backend_event_query(&gctx, 0), 1, "slot 0 reports done after its wait");
    int q1 = ps_cuda_backend_event_query(&gctx, 1);
    ok(q1 == 0 || q1 == 1, "slot 1 query answers pending or done (%d)", q1);
    ok(ps_cuda_backend_event_wait(&gctx, 1) == 0, "wait for slot 1");
    is_int(ps_cuda_backend_event_query(&gctx, 1), 1, "slot 1 done");
    C_->relu_forward(&cctx, y, x, n);
    cmp(gy, y, n, 0, 0, "the output before slot 0 is complete");
    ok(ps_cuda_backend_events(&gctx, 0) == 0, "slots freed");
    free(x); free(y);
    ps_cuda_free(gx); ps_cuda_free(gy); ps_cuda_free(acc);
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
    char info[256] = "";
    ps_cuda_open(0, info, sizeof info);
    diag("device %s", info);

    /*        N  C   H   W   K  R  S sh sw ph pw dil g bias */
    test_conv(2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1);   /* 3x3 pad 1 */
    test_conv(2, 8, 10, 10, 12, 3, 3, 2, 2, 1, 1, 1, 1, 0); /* 3x3 stride 2 */
    test_conv(2, 16, 7, 7, 32, 1, 1, 1, 1, 0, 0, 1, 1, 0);  /* 1x1 */
    test_conv(3, 16, 14, 14, 32, 1, 1, 2, 2, 0, 0, 1, 1, 0); /* downsample 1x1/2 */
    test_conv(2, 3, 23, 23, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1);  /* stem 7x7/2 pad 3 */
    test_conv(2, 8, 11, 11, 8, 3, 3, 1, 1, 2, 2, 2, 1, 1);  /* dilation 2 */
    test_conv(2, 8, 9, 9, 12, 3, 3, 1, 1, 1, 1, 1, 2, 1);   /* groups 2 */
    test_conv(2, 8, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1, 8, 1);    /* depthwise */
    test_conv(1, 4, 8, 12, 6, 3, 5, 2, 1, 1, 2, 1, 1, 1);   /* asymmetric */
    test_conv(4, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1, 0); /* ResNet-sized */
    test_conv(2, 64, 14, 14, 256, 1, 1, 1, 1, 0, 0, 1, 1, 0); /* bottleneck expand */

    test_bn(4, 8, 25, 1, 0.0f);
    test_bn(2, 16, 49, 0, 0.0f);
    test_bn(3, 5, 1, 1, 0.0f);      /* HW 1: M = 3 */
    test_bn(8, 32, 196, 1, 3.0f);   /* offset mean: variance precision */

    test_maxpool(2, 4, 11, 11, 3, 2, 1); /* ResNet's 3x3/2 pad 1 */
    test_maxpool(2, 3, 8, 8, 2, 2, 0);
    test_maxpool(1, 2, 7, 9, 3, 1, 1);
    test_avgpool(4, 16, 49);
    test_avgpool(2, 8, 1);
    test_avgpool(2, 4, 3137);            /* longer than a warp's stride many times */

    test_linear(6, 32, 10, 1);
    test_linear(5, 17, 3, 0);
    test_linear(64, 2048, 400, 1);       /* TSM-R50 head: N*T frames x 2048 -> 400 */

    test_small_layers();
    test_xent_scale();
    test_events();

    test_mixed(PS_PRECISION_FP16, "fp16", 2e-3);
    test_mixed(PS_PRECISION_BF16, "bf16", 1e-2);

    ps_cuda_backend_free(&gctx);
    ps_ctx_free(&cctx);
    ps_ctx_free(&gctx);
    return tap_done();
}
