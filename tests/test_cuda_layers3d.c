/* The CUDA backend's 3-D video layers (conv3d through cuDNN's graph API,
 * max / average pool 3-d kernels), forward and backward, against the CPU
 * reference on random inputs; exits 77 without a GPU.  As in
 * tests/test_cuda_layers.c: outputs poisoned with NaN on both sides,
 * parameter gradients start from the same non-zero values (accumulate, not
 * overwrite), a second backward with dinp NULL.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol*|cpu|):
 *   pools: exact (the kernels scan and sum in the CPU's order);
 *   conv3d fp32: atol 2e-5 * max|ref|, rtol 1e-5 (cuDNN sums in another
 *     order; engines that down-convert to TF32 are excluded);
 *   conv3d fp16 / bf16 operands (fp32 accumulation, results widened to
 *     fp32): atol 2e-3 / 1e-2 * max|ref| -- one rounding of each operand
 *     to 11 / 8 significant bits, averaged over the reduction. */
#include "tests/lib/cuda_testutil.h"
#include "tests/lib/cuda_devbuf.h"
#include "tests/lib/tap.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#include "worker/engine/ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static ps_ctx_t cctx, gctx;
static const ps_backend_t *C_ = &ps_backend_cpu, *G_ = &ps_backend_cuda;

static void *down_bytes(const void *d, size_t bytes) { return down_ctx(&gctx, d, bytes); }
static void cmp(const float *dgot, const float *want, size_t n, double atol, double rtol,
                const char *what)
{
    float *got = down_bytes(dgot, n * sizeof(float));
    cmp_report(got, want, n, atol, rtol, what);
    free(got);
}

static size_t conv_out(const ps_conv3d_desc_t *d, int N, int D, int H, int W)
{
    return (size_t)N * d->K * ps_conv_out(D, d->KT, d->stride_t, d->pad_t, d->dil_t) *
           ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) *
           ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
}

/* tol: atol as a fraction of max|ref| */
static void test_conv(const char *name, ps_conv3d_desc_t d, int N, int D, int H, int W,
                      int bias, double tol)
{
    const size_t nx = (size_t)N * d.C * D * H * W, ny = conv_out(&d, N, D, H, W);
    const size_t nw = (size_t)d.K * (d.C / d.groups) * d.KT * d.R * d.S;
    float *x = hrand(nx, 1, 0), *w = hrand(nw, 0.3f, 0), *b = hrand(d.K, 0.5f, 0);
    float *dy = hrand(ny, 1, 0), *dw0 = hrand(nw, 0.5f, 0), *db0 = hrand(d.K, 0.5f, 0);
    float *gx = dev(x, nx), *gw = dev(w, nw), *gb = dev(b, d.K), *gdy = dev(dy, ny);
    float *gy = dev_nan(ny), *gdx = dev_nan(nx), *gdw = dev(dw0, nw), *gdb = dev(db0, d.K);
    float *y = hnan(ny), *dx = hnan(nx), *dw = hcopy(dw0, nw), *db = hcopy(db0, d.K);
    ps_ctx_reserve(&cctx, ps_conv3d_workspace(&d, N, D, H, W));
    char m[192];

    C_->conv3d_forward(&cctx, y, x, w, bias ? b : NULL, &d, N, D, H, W);
    G_->conv3d_forward(&gctx, gy, gx, gw, bias ? gb : NULL, &d, N, D, H, W);
    snprintf(m, sizeof m, "conv3d %s forward", name);
    cmp(gy, y, ny, tol * maxabs(y, ny), 1e-5, m);

    C_->conv3d_backward(&cctx, dx, dw, bias ? db : NULL, dy, x, w, &d, N, D, H, W);
    G_->conv3d_backward(&gctx, gdx, gdw, bias ? gdb : NULL, gdy, gx, gw, &d, N, D, H, W);
    snprintf(m, sizeof m, "conv3d %s dinp", name);
    cmp(gdx, dx, nx, tol * maxabs(dx, nx), 1e-5, m);
    snprintf(m, sizeof m, "conv3d %s dw (accumulated)", name);
    cmp(gdw, dw, nw, tol * maxabs(dw, nw), 1e-5, m);
    if (bias) {
        snprintf(m, sizeof m, "conv3d %s db (accumulated)", name);
        cmp(gdb, db, d.K, 2e-5 * maxabs(db, d.K), 1e-5, m);
    }
    C_->conv3d_backward(&cctx, NULL, dw, NULL, dy, x, w, &d, N, D, H, W);
    G_->conv3d_backward(&gctx, NULL, gdw, NULL, gdy, gx, gw, &d, N, D, H, W);
    snprintf(m, sizeof m, "conv3d %s dw again with dinp NULL", name);
    cmp(gdw, dw, nw, tol * maxabs(dw, nw), 1e-5, m);

    ps_cuda_free(gx), ps_cuda_free(gw), ps_cuda_free(gb), ps_cuda_free(gdy);
    ps_cuda_free(gy), ps_cuda_free(gdx), ps_cuda_free(gdw), ps_cuda_free(gdb);
    free(x), free(w), free(b), free(dy), free(dw0), free(db0);
    free(y), free(dx), free(dw), free(db);
}

static void test_pool(const char *name, int max, ps_pool3d_desc_t d, int N, int C, int D, int H,
                      int W)
{
    const size_t nx = (size_t)N * C * D * H * W;
    const size_t ny = (size_t)N * C * ps_conv_out(D, d.KT, d.stride_t, d.pad_t, 1) *
                      ps_conv_out(H, d.R, d.stride_h, d.pad_h, 1) *
                      ps_conv_out(W, d.S, d.stride_w, d.pad_w, 1);
    float *x = hrand(nx, 1, 0), *dy = hrand(ny, 1, 0), *y = hnan(ny), *dx = hnan(nx);
    int32_t *am = calloc(ny, sizeof *am);
    float *gx = dev(x, nx), *gdy = dev(dy, ny), *gy = dev_nan(ny), *gdx = dev_nan(nx);
    int32_t *gam = dup_dev(am, ny * sizeof *am);
    char m[160];
    if (max) {
        C_->maxpool3d_forward(&cctx, y, am, x, &d, N, C, D, H, W);
        G_->maxpool3d_forward(&gctx, gy, gam, gx, &d, N, C, D, H, W);
        int32_t *got = down_bytes(gam, ny * sizeof *got);
        size_t bad = 0;
        for (size_t i = 0; i < ny; i++) bad += got[i] != am[i];
        ok(bad == 0, "maxpool3d %s argmax equal (%zu differ)", name, bad);
        free(got);
        C_->maxpool3d_backward(&cctx, dx, dy, am, &d, N, C, D, H, W);
        G_->maxpool3d_backward(&gctx, gdx, gdy, gam, &d, N, C, D, H, W);
    } else {
        C_->avgpool3d_forward(&cctx, y, x, &d, N, C, D, H, W);
        G_->avgpool3d_forward(&gctx, gy, gx, &d, N, C, D, H, W);
        C_->avgpool3d_backward(&cctx, dx, dy, &d, N, C, D, H, W);
        G_->avgpool3d_backward(&gctx, gdx, gdy, &d, N, C, D, H, W);
    }
    snprintf(m, sizeof m, "%s %s forward", max ? "maxpool3d" : "avgpool3d", name);
    cmp(gy, y, ny, 0, 0, m);
    snprintf(m, sizeof m, "%s %s dinp", max ? "maxpool3d" : "avgpool3d", name);
    cmp(gdx, dx, nx, 0, 0, m);
    ps_cuda_free(gx), ps_cuda_free(gdy), ps_cuda_free(gy), ps_cuda_free(gdx), ps_cuda_free(gam);
    free(x), free(dy), free(y), free(dx), free(am);
}

static void conv_cases(double tol)
{
    /* name, {C,K,KT,R,S, st,sh,sw, pt,ph,pw, dt,dh,dw, groups}, N, D, H, W, bias */
    test_conv("3x3x3 p1 bias", (ps_conv3d_desc_t){8, 16, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
              2, 6, 9, 9, 1, tol);
    test_conv("3x3x3 s2", (ps_conv3d_desc_t){8, 12, 3, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1}, 2, 8,
              10, 10, 0, tol);
    test_conv("1x1x1", (ps_conv3d_desc_t){16, 32, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1}, 2, 4, 7,
              7, 0, tol);
    test_conv("1x1x1 s1,2,2", (ps_conv3d_desc_t){16, 32, 1, 1, 1, 1, 2, 2, 0, 0, 0, 1, 1, 1, 1},
              2, 4, 14, 14, 0, tol);
    test_conv("5x7x7 stem", (ps_conv3d_desc_t){3, 16, 5, 7, 7, 1, 2, 2, 2, 3, 3, 1, 1, 1, 1}, 1,
              8, 32, 32, 0, tol);
    test_conv("3x1x1", (ps_conv3d_desc_t){16, 16, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, 2, 8, 7,
              7, 0, tol);
    test_conv("1x3x3 s1,2,2", (ps_conv3d_desc_t){8, 16, 1, 3, 3, 1, 2, 2, 0, 1, 1, 1, 1, 1, 1}, 2,
              4, 14, 14, 1, tol);
    test_conv("groups 2 dil 2,1,1", (ps_conv3d_desc_t){8, 8, 3, 3, 3, 1, 1, 1, 2, 1, 1, 2, 1, 1, 2},
              2, 6, 8, 8, 1, tol);
    test_conv("R3D-sized 64x64 3x3x3", (ps_conv3d_desc_t){64, 64, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1,
              1, 1}, 2, 8, 14, 14, 0, tol);
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
    conv_cases(2e-5);
    test_pool("1x3x3 s1,2,2 p0,1,1", 1, (ps_pool3d_desc_t){1, 3, 3, 1, 2, 2, 0, 1, 1, 1}, 2, 8, 6,
              11, 11);
    test_pool("2x1x1 s2,1,1", 1, (ps_pool3d_desc_t){2, 1, 1, 2, 1, 1, 0, 0, 0, 1}, 2, 8, 8, 7, 7);
    test_pool("3x3x3 s2 p1", 1, (ps_pool3d_desc_t){3, 3, 3, 2, 2, 2, 1, 1, 1, 1}, 1, 4, 7, 9, 9);
    test_pool("3x3x3 s1,2,2 p1 incl. pad", 0, (ps_pool3d_desc_t){3, 3, 3, 1, 2, 2, 1, 1, 1, 1}, 2,
              4, 5, 9, 9);
    test_pool("3x3x3 s2 p1 excl. pad", 0, (ps_pool3d_desc_t){3, 3, 3, 2, 2, 2, 1, 1, 1, 0}, 1, 4,
              7, 9, 9);
    static const struct { int prec; const char *name; double tol; } half[] = {
        {PS_PRECISION_FP16, "fp16", 2e-3}, {PS_PRECISION_BF16, "bf16", 1e-2}};
    for (int i = 0; i < 2; i++) {
        if (!ok(ps_cuda_backend_set_precision(&gctx, half[i].prec) == 0, "precision %s",
                half[i].name))
            continue;
        diag("conv3d on %s operands", half[i].name);
        conv_cases(half[i].tol);
        ok(ps_cuda_backend_set_precision(&gctx, PS_PRECISION_FP32) == 0, "back to fp32");
    }
    ps_cuda_backend_free(&gctx);
    ps_ctx_free(&gctx);
    ps_ctx_free(&cctx);
    return tap_done();
}
