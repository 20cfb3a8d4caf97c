/* The 3-D video layers of the CPU backend, forward and backward:
 *  - against PyTorch's tensors (tests/golden/layers3d_golden.bin from
 *    tests/golden/gen_layers3d.py): conv3d (stride, padding, dilation,
 *    groups, bias, 1x1x1), max and average pool 3-d, and BN over
 *    (N, T, H, W) / the global average pool over T x H x W through the 2-D
 *    slots with HW = D*H*W, as the 3-D models use them;
 *  - against float64 central differences (tests/lib/gradcheck.h), with
 *    the accumulate / overwrite contract;
 *  - each conv3d case in three ways of cutting the work: one thread, the
 *    OpenMP team over clips, and a column buffer too small for one clip
 *    (output frames in ranges).
 * Outputs are poisoned with NaN so an element a layer forgot shows up;
 * parameter gradients start from a non-zero value (they must accumulate);
 * the workspace is sized exactly with a guard band that must survive. */
#include "tests/lib/golden_io.h"
#include "tests/lib/layer_check.h"
#include "tests/lib/gradcheck.h"
#include "tests/lib/tap.h"
#include "worker/engine/layers/conv_provider.h"
#include "worker/engine/layers/cpu_layers.h"
#include "worker/engine/ps_blas.h"
#include "worker/engine/ps_engine.h"

#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define ATOL 1e-4
#define RTOL 1e-4
#define PRIOR 0.25f
#define GUARD 64

static ps_ctx_t ctx;
static const ps_backend_t *be = &ps_backend_cpu;


static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* ---- conv3d against PyTorch ----------------------------------------------- */

static ps_conv3d_desc_t conv_desc(const int32_t *c)
{
    return (ps_conv3d_desc_t){.C = c[1], .K = c[5], .KT = c[6], .R = c[7], .S = c[8],
                              .stride_t = c[9], .stride_h = c[10], .stride_w = c[11],
                              .pad_t = c[12], .pad_h = c[13], .pad_w = c[14], .dil_t = c[15],
                              .dil_h = c[16], .dil_w = c[17], .groups = c[18]};
}

static size_t out_numel(const ps_conv3d_desc_t *d, int N, int D, int H, int W)
{
    return (size_t)N * d->K * ps_conv_out(D, d->KT, d->stride_t, d->pad_t, d->dil_t) *
           ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) *
           ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
}

/* mode 0: one thread; 1: the default team (two threads); 2: two threads
 * and a column buffer of one output frame's worth */
static void test_conv(int ci, int mode, const char *row)
{
    char p[32], what[192], m[256];
    snprintf(p, sizeof p, "conv3d.%d.", ci);
    const int32_t *c = I_(p, "cfg");
    const int N = c[0], D = c[2], H = c[3], W = c[4], bias = c[19];
    ps_conv3d_desc_t d = conv_desc(c);
    set_threads(mode == 0 ? 1 : 2);
    ps_conv3d_set_col_cap(mode == 2 ? 1 : 0);
    const size_t nx = (size_t)N * d.C * D * H * W, ny = out_numel(&d, N, D, H, W);
    const size_t nw = (size_t)d.K * (d.C / d.groups) * d.KT * d.R * d.S;
    const float *x = F_(p, "x", nx), *w = F_(p, "w", nw), *b = bias ? F_(p, "b", d.K) : NULL;
    const float *dy = F_(p, "dout", ny);
    snprintf(what, sizeof what, "conv3d %d (C%d K%d %dx%dx%d s%d,%d,%d p%d,%d,%d d%d,%d,%d g%d%s, %s, %s)",
             ci, d.C, d.K, d.KT, d.R, d.S, d.stride_t, d.stride_h, d.stride_w, d.pad_t, d.pad_h,
             d.pad_w, d.dil_t, d.dil_h, d.dil_w, d.groups, bias ? " bias" : "", row,
             mode == 0 ? "1 thread" : mode == 1 ? "2 threads" : "2 threads, frame chunks");

    size_t ws = ps_conv3d_workspace(&d, N, D, H, W);
    ps_ctx_free(&ctx);
    ps_ctx_reserve(&ctx, ws + GUARD);
    for (size_t i = 0; i < ws + GUARD; i++) ctx.workspace[i] = 12345.0f;

    float *y = nanbuf(ny);
    be->conv3d_forward(&ctx, y, x, w, b, &d, N, D, H, W);
    snprintf(m, sizeof m, "%s forward", what);
    allclose(y, F_(p, "out", ny), (long)ny, ATOL, RTOL, m);

    float *dx = nanbuf(nx), *dw = constbuf(nw, PRIOR), *db = constbuf(d.K, PRIOR);
    be->conv3d_backward(&ctx, dx, dw, bias ? db : NULL, dy, x, w, &d, N, D, H, W);
    snprintf(m, sizeof m, "%s dinp", what);
    allclose(dx, F_(p, "dx", nx), (long)nx, ATOL, RTOL, m);
    float *rw = plus(F_(p, "dw", nw), nw, PRIOR);
    snprintf(m, sizeof m, "%s dw (accumulated)", what);
    allclose(dw, rw, (long)nw, 3 * ATOL, RTOL, m);
    if (bias) {
        float *rb = plus(F_(p, "db", d.K), d.K, PRIOR);
        snprintf(m, sizeof m, "%s db (accumulated)", what);
        allclose(db, rb, d.K, 3 * ATOL, RTOL, m);
        free(rb);
    }
    for (size_t i = 0; i < nw; i++) dw[i] = 0;
    be->conv3d_backward(&ctx, NULL, dw, NULL, dy, x, w, &d, N, D, H, W);
    snprintf(m, sizeof m, "%s dw with dinp NULL", what);
    allclose(dw, F_(p, "dw", nw), (long)nw, 3 * ATOL, RTOL, m);

    int guard_ok = ctx.workspace_numel == ws + GUARD;
    for (size_t i = ws; i < ws + GUARD && guard_ok; i++) guard_ok = ctx.workspace[i] == 12345.0f;
    ok(guard_ok, "%s: stays inside its stated workspace of %zu floats", what, ws);
    free(y), free(dx), free(dw), free(db), free(rw);
    ps_conv3d_set_col_cap(0);
}

/* ---- pools against PyTorch ------------------------------------------------- */

static ps_pool3d_desc_t pool_desc(const int32_t *c, int cip)
{
    return (ps_pool3d_desc_t){.KT = c[5], .R = c[6], .S = c[7], .stride_t = c[8],
                              .stride_h = c[9], .stride_w = c[10], .pad_t = c[11],
                              .pad_h = c[12], .pad_w = c[13], .count_include_pad = cip};
}

static size_t pool_out(const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W)
{
    return (size_t)N * C * ps_conv_out(D, d->KT, d->stride_t, d->pad_t, 1) *
           ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1) *
           ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1);
}

static void test_pools(void)
{
    char p[32], m[96];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "maxpool3d.%d.", i);
        const int32_t *c = I_(p, "cfg");
        const int N = c[0], C = c[1], D = c[2], H = c[3], W = c[4];
        ps_pool3d_desc_t d = pool_desc(c, 1);
        const size_t nx = (size_t)N * C * D * H * W, ny = pool_out(&d, N, C, D, H, W);
        float *y = nanbuf(ny), *dx = nanbuf(nx);
        int32_t *am = malloc(ny * sizeof *am);
        be->maxpool3d_forward(&ctx, y, am, F_(p, "x", nx), &d, N, C, D, H, W);
        snprintf(m, sizeof m, "maxpool3d %d forward", i);
        allclose(y, F_(p, "out", ny), (long)ny, 0, 0, m);
        const int32_t *ref = I_(p, "idx");
        size_t bad = 0;
        for (size_t j = 0; j < ny; j++) bad += am[j] != ref[j];
        ok(bad == 0, "maxpool3d %d argmax = PyTorch's indices (%zu differ)", i, bad);
        be->maxpool3d_backward(&ctx, dx, F_(p, "dout", ny), am, &d, N, C, D, H, W);
        snprintf(m, sizeof m, "maxpool3d %d dinp", i);
        allclose(dx, F_(p, "dx", nx), (long)nx, 1e-6, 1e-6, m);
        free(y), free(dx), free(am);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "avgpool3d.%d.", i);
        const int32_t *c = I_(p, "cfg");
        const int N = c[0], C = c[1], D = c[2], H = c[3], W = c[4];
        ps_pool3d_desc_t d = pool_desc(c, c[14]);
        const size_t nx = (size_t)N * C * D * H * W, ny = pool_out(&d, N, C, D, H, W);
        float *y = nanbuf(ny), *dx = nanbuf(nx);
        be->avgpool3d_forward(&ctx, y, F_(p, "x", nx), &d, N, C, D, H, W);
        snprintf(m, sizeof m, "avgpool3d %d (count_include_pad %d) forward", i, c[14]);
        allclose(y, F_(p, "out", ny), (long)ny, 1e-5, 1e-5, m);
        be->avgpool3d_backward(&ctx, dx, F_(p, "dout", ny), &d, N, C, D, H, W);
        snprintf(m, sizeof m, "avgpool3d %d (count_include_pad %d) dinp", i, c[14]);
        allclose(dx, F_(p, "dx", nx), (long)nx, 1e-5, 1e-5, m);
        free(y), free(dx);
    }
}

/* BN over (N, T, H, W) and the global average pool over T x H x W: the
 * 2-D slots with HW = D*H*W on NCDHW tensors, against BatchNorm3d /
 * AdaptiveAvgPool3d(1). */
static void test_bn_gap(void)
{
    const int32_t *c = I_("bn3d_train.", "cfg");
    check_bn_golden(be, &ctx, "bn3d_train.", "bn3d_eval.", c[0], c[1], c[2] * c[3] * c[4],
                    "bn3d (N,T,H,W)");

    const char *p = "gap3d.";
    c = I_(p, "cfg");
    const int gN = c[0], gC = c[1], gHW = c[2] * c[3] * c[4];
    float *y = nanbuf((size_t)gN * gC), *dx = nanbuf((size_t)gN * gC * gHW);
    be->avgpool_forward(&ctx, y, F_(p, "x", (size_t)gN * gC * gHW), gN, gC, gHW);
    allclose(y, F_(p, "out", gN * gC), gN * gC, 1e-6, 1e-5, "global average pool over TxHxW");
    be->avgpool_backward(&ctx, dx, F_(p, "dout", gN * gC), gN, gC, gHW);
    allclose(dx, F_(p, "dx", (size_t)gN * gC * gHW), (long)gN * gC * gHW, 1e-6, 1e-5,
             "global average pool over TxHxW dinp");
    free(y), free(dx);
}

/* ---- central differences ------------------------------------------------------ */

typedef struct {
    ps_conv3d_desc_t d;
    int N, D, H, W;
    float *x, *w, *b, *y, *r;
    size_t ny;
} fconv_t;

static double conv_loss(void *a)
{
    fconv_t *c = a;
    be->conv3d_forward(&ctx, c->y, c->x, c->w, c->b, &c->d, c->N, c->D, c->H, c->W);
    return dot(c->y, c->r, c->ny);
}

static const char *conv_row = "?"; /* the row under test, for messages */

static void fd_conv(const char *name, ps_conv3d_desc_t d, int N, int D, int H, int W, int bias)
{
    fconv_t c = {.d = d, .N = N, .D = D, .H = H, .W = W};
    const size_t nx = (size_t)N * d.C * D * H * W;
    const size_t nw = (size_t)d.K * (d.C / d.groups) * d.KT * d.R * d.S;
    c.ny = out_numel(&d, N, D, H, W);
    c.x = rbuf(nx, 1), c.w = rbuf(nw, 0.5f), c.b = bias ? rbuf(d.K, 0.5f) : NULL;
    c.y = zbuf(c.ny), c.r = rbuf(c.ny, 1);
    ps_ctx_reserve(&ctx, ps_conv3d_workspace(&d, N, D, H, W));
    float *dx = zbuf(nx), *dw = zbuf(nw), *db = zbuf(d.K);
    float *dx2 = zbuf(nx), *dw2 = zbuf(nw), *db2 = zbuf(d.K);
    be->conv3d_backward(&ctx, dx, dw, bias ? db : NULL, c.r, c.x, c.w, &d, N, D, H, W);
    char m[128];
    snprintf(m, sizeof m, "conv3d[%s] %s dinp", conv_row, name);
    gradcheck(m, c.x, dx, nx, conv_loss, &c, 1e-2f);
    snprintf(m, sizeof m, "conv3d[%s] %s dw", conv_row, name);
    gradcheck(m, c.w, dw, nw, conv_loss, &c, 1e-2f);
    if (bias) {
        snprintf(m, sizeof m, "conv3d[%s] %s db", conv_row, name);
        gradcheck(m, c.b, db, d.K, conv_loss, &c, 1e-2f);
    }
    for (int rep = 0; rep < 2; rep++)
        be->conv3d_backward(&ctx, dx2, dw2, bias ? db2 : NULL, c.r, c.x, c.w, &d, N, D, H, W);
    snprintf(m, sizeof m, "conv3d[%s] %s dw", conv_row, name);
    check_accumulates(m, dw, dw2, nw);
    if (bias) {
        snprintf(m, sizeof m, "conv3d[%s] %s db", conv_row, name);
        check_accumulates(m, db, db2, d.K);
    }
    snprintf(m, sizeof m, "conv3d[%s] %s dinp", conv_row, name);
    check_overwrites(m, dx, dx2, nx);
    free(c.x), free(c.w), free(c.b), free(c.y), free(c.r);
    free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
}

typedef struct {
    int max; /* 1 max pool, 0 average */
    ps_pool3d_desc_t d;
    int N, C, D, H, W;
    float *x, *y, *r;
    int32_t *am;
    size_t nx, ny;
} fpool_t;

static double pool_loss(void *a)
{
    fpool_t *s = a;
    if (s->max)
        be->maxpool3d_forward(&ctx, s->y, s->am, s->x, &s->d, s->N, s->C, s->D, s->H, s->W);
    else
        be->avgpool3d_forward(&ctx, s->y, s->x, &s->d, s->N, s->C, s->D, s->H, s->W);
    return dot(s->y, s->r, s->ny);
}

static void fd_pool(const char *name, int max, ps_pool3d_desc_t d)
{
    fpool_t s = {.max = max, .d = d, .N = 2, .C = 3, .D = 4, .H = 5, .W = 5};
    s.nx = (size_t)s.N * s.C * s.D * s.H * s.W;
    s.ny = pool_out(&d, s.N, s.C, s.D, s.H, s.W);
    s.x = rbuf(s.nx, 1), s.y = zbuf(s.ny), s.r = rbuf(s.ny, 1);
    s.am = calloc(s.ny, sizeof *s.am);
    if (max) /* distinct values 0.05 apart, shuffled: no tie within 2 eps */
        for (size_t i = 0; i < s.nx; i++) {
            size_t j = (size_t)((frand() + 1) * 0.5 * (i + 1));
            if (j > i) j = i;
            s.x[i] = s.x[j];
            s.x[j] = 0.05f * (float)i - 3.0f;
        }
    pool_loss(&s);
    float *dx = zbuf(s.nx), *dx2 = zbuf(s.nx);
    for (int rep = 0; rep < 3; rep++) {
        float *X = rep ? dx2 : dx;
        if (max)
            be->maxpool3d_backward(&ctx, X, s.r, s.am, &d, s.N, s.C, s.D, s.H, s.W);
        else
            be->avgpool3d_backward(&ctx, X, s.r, &d, s.N, s.C, s.D, s.H, s.W);
    }
    gradcheck(name, s.x, dx, s.nx, pool_loss, &s, 1e-2f);
    check_overwrites(name, dx, dx2, s.nx);
    free(s.x), free(s.y), free(s.r), free(s.am), free(dx), free(dx2);
}

static void test_bad_shapes(void)
{
    /* a bad descriptor is logged and leaves the output alone, never a crash */
    ps_conv3d_desc_t d = {.C = 3, .K = 2, .KT = 5, .R = 3, .S = 3, .stride_t = 1,
                          .stride_h = 1, .stride_w = 1, .dil_t = 1, .dil_h = 1, .dil_w = 1,
                          .groups = 1};
    float x[3 * 2 * 4 * 4], y[4] = {7, 7, 7, 7}, w[2 * 3 * 5 * 9];
    memset(x, 0, sizeof x), memset(w, 0, sizeof w);
    be->conv3d_forward(&ctx, y, x, w, NULL, &d, 1, 2, 4, 4); /* 5 frames of kernel > 2 */
    ok(y[0] == 7 && y[3] == 7, "conv3d: kernel longer than the clip is refused, output untouched");
    ok(ps_conv3d_workspace(&d, 1, 2, 4, 4) == 0, "conv3d: workspace of a bad shape is 0");
    d.KT = 1, d.groups = 2;
    be->conv3d_forward(&ctx, y, x, w, NULL, &d, 1, 2, 4, 4); /* 3 channels in 2 groups */
    ok(y[0] == 7, "conv3d: channels not divisible by groups refused");
    ps_pool3d_desc_t pd = {.KT = 2, .R = 2, .S = 2, .stride_t = 1, .stride_h = 1,
                           .stride_w = 1, .pad_t = 2};
    int32_t am[4];
    be->maxpool3d_forward(&ctx, y, am, x, &pd, 1, 1, 2, 4, 4); /* pad > half the window */
    ok(y[0] == 7, "maxpool3d: padding over half the window refused");
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv);
    ps_engine_init(&ctx, 2);
    golden_load_or_bail("tests/golden/layers3d_golden.bin", 512);
    /* the rows of conv_provider.h: vol2col + GEMM in its three ways of
     * cutting the work, then oneDNN's (the GEMM row again in a build
     * without oneDNN) with one and two threads */
    ps_conv_set_kernels("gemm");
    for (int ci = 0; ci < 11; ci++)
        for (int mode = 0; mode < 3; mode++) test_conv(ci, mode, "gemm");
    ps_conv_set_kernels("onednn");
    for (int ci = 0; ci < 11; ci++)
        for (int mode = 0; mode < 2; mode++) test_conv(ci, mode, "onednn");
    ps_conv_set_kernels(NULL);
    set_threads(2);
    test_pools();
    test_bn_gap();

    static const char *const rows[] = {"gemm", "onednn"};
    for (int r = 0; r < 2; r++) {
    ps_conv_set_kernels(rows[r]);
    conv_row = rows[r];
    /* name, desc {C,K,KT,R,S, st,sh,sw, pt,ph,pw, dt,dh,dw, groups}, N, D, H, W, bias */
    fd_conv("3x3x3 s1 p1 bias", (ps_conv3d_desc_t){3, 4, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
            2, 4, 5, 4, 1);
    fd_conv("3x3x3 s2 groups 2", (ps_conv3d_desc_t){4, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 2},
            2, 5, 5, 5, 0);
    fd_conv("1x1x1 direct", (ps_conv3d_desc_t){5, 3, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1}, 2,
            3, 4, 4, 1);
    fd_conv("3x1x1 p1,0,0", (ps_conv3d_desc_t){3, 4, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, 2,
            5, 3, 3, 0);
    fd_conv("1x3x3 s1,2,2 dil 1,2,1",
            (ps_conv3d_desc_t){3, 2, 1, 3, 3, 1, 2, 2, 0, 2, 1, 1, 2, 1, 1}, 1, 3, 7, 6, 0);
    set_threads(1);
    fd_conv("3x3x3 dil 2,1,1 (1 thread)",
            (ps_conv3d_desc_t){2, 3, 3, 3, 3, 1, 1, 1, 2, 1, 1, 2, 1, 1, 1}, 2, 5, 4, 4, 1);
    set_threads(2);
    }
    ps_conv_set_kernels(NULL);
    fd_pool("maxpool3d 1x3x3 s1,2,2 p0,1,1 dinp", 1,
            (ps_pool3d_desc_t){1, 3, 3, 1, 2, 2, 0, 1, 1, 1});
    fd_pool("maxpool3d 3x3x3 s2 p1 dinp", 1, (ps_pool3d_desc_t){3, 3, 3, 2, 2, 2, 1, 1, 1, 1});
    fd_pool("avgpool3d 2x3x3 s1,2,2 p1,1,1 include pad dinp", 0,
            (ps_pool3d_desc_t){2, 3, 3, 1, 2, 2, 1, 1, 1, 1});
    fd_pool("avgpool3d 3x3x3 s2 p1 exclude pad dinp", 0,
            (ps_pool3d_desc_t){3, 3, 3, 2, 2, 2, 1, 1, 1, 0});
    test_bad_shapes();
    golden_free();
    ps_ctx_free(&ctx);
    return tap_done();
}
