/* Finite-difference gradient checks for every CPU layer, on small shapes.
 *
 * For each layer: L = sum(out * r) for a fixed random r, so dL/dout = r is
 * handed to backward; each input and parameter element (all of them on
 * these small shapes) is moved by +-eps and the central difference
 * (L(+eps) - L(-eps)) / 2eps, with L summed in double, is compared with the
 * analytic gradient.
 *
 * Tolerance: |numeric - analytic| <= 2e-3 + 1e-2*|analytic|.  Why that
 * wide: the layers compute in float32, so each output carries ~6e-8
 * relative rounding; over ~10^3 outputs and divided by 2*eps (eps = 1e-2,
 * 3e-3 for the smooth non-linear layers BN and softmax, whose O(eps^2)
 * truncation is then ~1e-5) that is up to ~5e-4 of noise.  A wrong
 * gradient (missing term, wrong index, factor 2) is off by O(0.1-1).
 * Piecewise-linear layers (relu, max pool) get inputs at least 2*eps away
 * from their kinks so the difference never straddles one.
 * Also checked: parameter gradients ACCUMULATE (backward twice -> 2x) while
 * input gradients are OVERWRITTEN (backward twice -> same). */
#include "tests/lib/gradcheck.h"
#include "tests/lib/tap.h"
#include "worker/engine/layers/conv_provider.h"
#include "worker/engine/layers/cpu_layers.h"
#include "worker/engine/ps_blas.h"
#include "worker/engine/ps_engine.h"

#include <stdint.h>
#include <string.h>

static ps_ctx_t ctx;
static const ps_backend_t *be = &ps_backend_cpu;

/* ---- conv2d ------------------------------------------------------------------ */

typedef struct {
    ps_conv2d_desc_t d;
    int N, H, W;
    float *x, *w, *b, *y, *r;
    size_t ny;
} conv_t;

static double conv_loss(void *a)
{
    conv_t *c = a;
    be->conv2d_forward(&ctx, c->y, c->x, c->w, c->b, &c->d, c->N, c->H, c->W);
    return dot(c->y, c->r, c->ny);
}

static const char *conv_row = "?"; /* the row under test, for the messages */

static void test_conv(const char *name, ps_conv2d_desc_t d, int N, int H, int W, int bias,
                      size_t gemm_cols)
{
    ps_conv2d_set_gemm_cols(gemm_cols);
    conv_t c = {.d = d, .N = N, .H = H, .W = W};
    const int P = ps_conv_out(H, d.R, d.stride_h, d.pad_h, d.dil_h);
    const int Q = ps_conv_out(W, d.S, d.stride_w, d.pad_w, d.dil_w);
    const size_t nx = (size_t)N * d.C * H * W, nw = (size_t)d.K * (d.C / d.groups) * d.R * d.S;
    c.ny = (size_t)N * d.K * P * Q;
    c.x = rbuf(nx, 1), c.w = rbuf(nw, 0.5f), c.b = bias ? rbuf(d.K, 0.5f) : NULL;
    c.y = zbuf(c.ny), c.r = rbuf(c.ny, 1);
    ps_ctx_reserve(&ctx, ps_conv2d_workspace(&d, N, H, W));
    float *dx = zbuf(nx), *dw = zbuf(nw), *db = zbuf(d.K);
    float *dx2 = zbuf(nx), *dw2 = zbuf(nw), *db2 = zbuf(d.K);
    be->conv2d_backward(&ctx, dx, dw, bias ? db : NULL, c.r, c.x, c.w, &d, N, H, W);
    char m[128];
    snprintf(m, sizeof m, "conv[%s] %s dinp", conv_row, name);
    gradcheck(m, c.x, dx, nx, conv_loss, &c, 1e-2f);
    snprintf(m, sizeof m, "conv[%s] %s dw", conv_row, name);
    gradcheck(m, c.w, dw, nw, conv_loss, &c, 1e-2f);
    if (bias) {
        snprintf(m, sizeof m, "conv[%s] %s db", conv_row, name);
        gradcheck(m, c.b, db, d.K, conv_loss, &c, 1e-2f);
    }
    be->conv2d_backward(&ctx, dx2, dw2, bias ? db2 : NULL, c.r, c.x, c.w, &d, N, H, W);
    be->conv2d_backward(&ctx, dx2, dw2, bias ? db2 : NULL, c.r, c.x, c.w, &d, N, H, W);
    snprintf(m, sizeof m, "conv[%s] %s dw", conv_row, name);
    check_accumulates(m, dw, dw2, nw);
    if (bias) {
        snprintf(m, sizeof m, "conv[%s] %s db", conv_row, name);
        check_accumulates(m, db, db2, d.K);
    }
    snprintf(m, sizeof m, "conv[%s] %s dinp", conv_row, name);
    check_overwrites(m, dx, dx2, nx);
    free(c.x), free(c.w), free(c.b), free(c.y), free(c.r);
    free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
    ps_conv2d_set_gemm_cols(0);
}

/* ---- batchnorm ----------------------------------------------------------------- */

typedef struct {
    int N, C, HW, train;
    float *x, *g, *b, *y, *r, *mean, *rstd, *rm, *rv;
} bn_t;

static double bn_loss(void *a)
{
    bn_t *s = a;
    if (s->train)
        be->bn_forward_train(&ctx, s->y, s->mean, s->rstd, NULL, NULL, s->x, s->g, s->b, 1e-5f,
                             0.1f, s->N, s->C, s->HW);
    else
        be->bn_forward_eval(&ctx, s->y, s->x, s->g, s->b, s->rm, s->rv, 1e-5f, s->N, s->C,
                            s->HW);
    return dot(s->y, s->r, (size_t)s->N * s->C * s->HW);
}

static void test_bn(int train)
{
    bn_t s = {.N = 3, .C = 4, .HW = 5, .train = train};
    const size_t n = (size_t)s.N * s.C * s.HW;
    s.x = rbuf(n, 2), s.g = rbuf(s.C, 1), s.b = rbuf(s.C, 1), s.y = zbuf(n), s.r = rbuf(n, 1);
    s.mean = zbuf(s.C), s.rstd = zbuf(s.C), s.rm = rbuf(s.C, 1), s.rv = rbuf(s.C, 0.4f);
    for (int c = 0; c < s.C; c++) s.rv[c] += 1.0f;
    bn_loss(&s); /* saved mean/rstd for backward */
    float *dx = zbuf(n), *dg = zbuf(s.C), *db = zbuf(s.C);
    float *dx2 = zbuf(n), *dg2 = zbuf(s.C), *db2 = zbuf(s.C);
    const char *mode = train ? "train" : "eval";
    char m[96];
    for (int rep = 0; rep < 3; rep++) {
        float *X = rep ? dx2 : dx, *G = rep ? dg2 : dg, *B = rep ? db2 : db;
        if (train)
            be->bn_backward_train(&ctx, X, G, B, s.r, s.x, s.g, s.mean, s.rstd, s.N, s.C, s.HW);
        else
            be->bn_backward_eval(&ctx, X, G, B, s.r, s.x, s.g, s.rm, s.rv, 1e-5f, s.N, s.C,
                                 s.HW);
    }
    snprintf(m, sizeof m, "bn %s dinp", mode);
    gradcheck(m, s.x, dx, n, bn_loss, &s, 3e-3f);
    snprintf(m, sizeof m, "bn %s dgamma", mode);
    gradcheck(m, s.g, dg, s.C, bn_loss, &s, 3e-3f);
    snprintf(m, sizeof m, "bn %s dbeta", mode);
    gradcheck(m, s.b, db, s.C, bn_loss, &s, 3e-3f);
    snprintf(m, sizeof m, "bn %s dgamma", mode);
    check_accumulates(m, dg, dg2, s.C);
    snprintf(m, sizeof m, "bn %s dbeta", mode);
    check_accumulates(m, db, db2, s.C);
    snprintf(m, sizeof m, "bn %s dinp", mode);
    check_overwrites(m, dx, dx2, n);
    free(s.x), free(s.g), free(s.b), free(s.y), free(s.r), free(s.mean), free(s.rstd);
    free(s.rm), free(s.rv), free(dx), free(dg), free(db), free(dx2), free(dg2), free(db2);
}

/* ---- single-input layers: relu, pools, dropout, shift, consensus -------------- */

typedef struct {
    int kind; /* which layer */
    float *x, *y, *r;
    size_t nx, ny;
    int N, C, H, W, T;
    ps_pool_desc_t pd;
    int32_t *am;
    uint8_t *mask;
} one_t;

enum { K_RELU, K_MAXPOOL, K_AVGPOOL, K_DROPOUT, K_TSHIFT, K_CONSENSUS };

static double one_loss(void *a)
{
    one_t *s = a;
    switch (s->kind) {
    case K_RELU: be->relu_forward(&ctx, s->y, s->x, s->nx); break;
    case K_MAXPOOL:
        be->maxpool_forward(&ctx, s->y, s->am, s->x, &s->pd, s->N, s->C, s->H, s->W);
        break;
    case K_AVGPOOL: be->avgpool_forward(&ctx, s->y, s->x, s->N, s->C, s->H * s->W); break;
    case K_DROPOUT: be->dropout_forward(&ctx, s->y, s->mask, s->x, s->nx, 0.4f, 77); break;
    case K_TSHIFT:
        be->tshift_forward(&ctx, s->y, s->x, s->N / s->T, s->T, s->C, s->H * s->W, 4);
        break;
    case K_CONSENSUS: be->consensus_forward(&ctx, s->y, s->x, s->N / s->T, s->T, s->C); break;
    }
    return dot(s->y, s->r, s->ny);
}

static void one_backward(one_t *s, float *dx)
{
    switch (s->kind) {
    case K_RELU: be->relu_backward(&ctx, dx, s->r, s->y, s->nx); break;
    case K_MAXPOOL:
        be->maxpool_backward(&ctx, dx, s->r, s->am, &s->pd, s->N, s->C, s->H, s->W);
        break;
    case K_AVGPOOL: be->avgpool_backward(&ctx, dx, s->r, s->N, s->C, s->H * s->W); break;
    case K_DROPOUT: be->dropout_backward(&ctx, dx, s->r, s->mask, s->nx, 0.4f); break;
    case K_TSHIFT:
        be->tshift_backward(&ctx, dx, s->r, s->N / s->T, s->T, s->C, s->H * s->W, 4);
        break;
    case K_CONSENSUS: be->consensus_backward(&ctx, dx, s->r, s->N / s->T, s->T, s->C); break;
    }
}

static void test_one(const char *name, int kind)
{
    one_t s = {.kind = kind, .N = 4, .C = 8, .H = 5, .W = 6, .T = 4,
               .pd = {.R = 3, .S = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}};
    s.nx = (size_t)s.N * s.C * s.H * s.W;
    s.ny = s.nx;
    if (kind == K_MAXPOOL)
        s.ny = (size_t)s.N * s.C * ps_conv_out(s.H, 3, 2, 1, 1) * ps_conv_out(s.W, 3, 2, 1, 1);
    if (kind == K_AVGPOOL) s.ny = (size_t)s.N * s.C;
    if (kind == K_CONSENSUS) s.nx = (size_t)s.N * s.C, s.ny = (size_t)s.N / s.T * s.C;
    s.x = rbuf(s.nx, 1), s.y = zbuf(s.ny), s.r = rbuf(s.ny, 1);
    s.am = calloc(s.ny, sizeof(int32_t)), s.mask = calloc(s.nx, 1);
    if (kind == K_RELU)
        for (size_t i = 0; i < s.nx; i++) s.x[i] += s.x[i] < 0 ? -0.05f : 0.05f;
    if (kind == K_MAXPOOL) /* distinct values 0.05 apart, shuffled */
        for (size_t i = 0; i < s.nx; i++) {
            size_t j = (size_t)((frand() + 1) * 0.5 * (i + 1));
            if (j > i) j = i;
            s.x[i] = s.x[j];
            s.x[j] = 0.05f * (float)i - 3.0f;
        }
    one_loss(&s);
    float *dx = zbuf(s.nx), *dx2 = zbuf(s.nx);
    one_backward(&s, dx);
    one_backward(&s, dx2);
    one_backward(&s, dx2);
    gradcheck(name, s.x, dx, s.nx, one_loss, &s, 1e-2f);
    check_overwrites(name, dx, dx2, s.nx);
    free(s.x), free(s.y), free(s.r), free(s.am), free(s.mask), free(dx), free(dx2);
}

/* ---- linear ---------------------------------------------------------------------- */

typedef struct {
    int N, C, K;
    float *x, *w, *b, *y, *r;
} lin_t;

static double lin_loss(void *a)
{
    lin_t *s = a;
    be->linear_forward(&ctx, s->y, s->x, s->w, s->b, s->N, s->C, s->K);
    return dot(s->y, s->r, (size_t)s->N * s->K);
}

static void test_linear(void)
{
    lin_t s = {.N = 4, .C = 9, .K = 5};
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.K * s.C, ny = (size_t)s.N * s.K;
    s.x = rbuf(nx, 1), s.w = rbuf(nw, 0.5f), s.b = rbuf(s.K, 1), s.y = zbuf(ny), s.r = rbuf(ny, 1);
    float *dx = zbuf(nx), *dw = zbuf(nw), *db = zbuf(s.K);
    float *dx2 = zbuf(nx), *dw2 = zbuf(nw), *db2 = zbuf(s.K);
    be->linear_backward(&ctx, dx, dw, db, s.r, s.x, s.w, s.N, s.C, s.K);
    be->linear_backward(&ctx, dx2, dw2, db2, s.r, s.x, s.w, s.N, s.C, s.K);
    be->linear_backward(&ctx, dx2, dw2, db2, s.r, s.x, s.w, s.N, s.C, s.K);
    gradcheck("linear dinp", s.x, dx, nx, lin_loss, &s, 1e-2f);
    gradcheck("linear dw", s.w, dw, nw, lin_loss, &s, 1e-2f);
    gradcheck("linear db", s.b, db, s.K, lin_loss, &s, 1e-2f);
    check_accumulates("linear dw", dw, dw2, nw);
    check_accumulates("linear db", db, db2, s.K);
    check_overwrites("linear dinp", dx, dx2, nx);
    free(s.x), free(s.w), free(s.b), free(s.y), free(s.r);
    free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
}

/* ---- softmax cross-entropy: L = loss * r0 (so dloss = r0) ------------------------- */

typedef struct {
    int N, K;
    float *x, *p, r0;
    int32_t lab[8];
} xent_t;

static double xent_loss(void *a)
{
    xent_t *s = a;
    return (double)be->xent_forward(&ctx, s->p, s->x, s->lab, s->N, s->K) * s->r0;
}

static void test_xent(void)
{
    xent_t s = {.N = 6, .K = 7, .r0 = 1.7f};
    const size_t n = (size_t)s.N * s.K;
    s.x = rbuf(n, 3), s.p = zbuf(n);
    for (int i = 0; i < s.N; i++) s.lab[i] = (i * 3 + 1) % s.K;
    xent_loss(&s);
    float *dx = zbuf(n);
    be->xent_backward(&ctx, dx, s.p, s.lab, s.r0, s.N, s.K);
    gradcheck("softmax cross-entropy dlogits", s.x, dx, n, xent_loss, &s, 3e-3f);
    free(s.x), free(s.p), free(dx);
}

/* ---- add: out = a + b, both inputs get dout ---------------------------------------- */

typedef struct {
    float *a, *b, *y, *r;
    size_t n;
} add_t;

static double add_loss(void *arg)
{
    add_t *s = arg;
    be->add(&ctx, s->y, s->a, s->b, s->n);
    return dot(s->y, s->r, s->n);
}

static void test_add(void)
{
    add_t s = {.n = 50};
    s.a = rbuf(s.n, 1), s.b = rbuf(s.n, 1), s.y = zbuf(s.n), s.r = rbuf(s.n, 1);
    /* the gradient of a residual add is dout to both branches; the model
     * adds the second with accumulate() */
    float *g = zbuf(s.n);
    be->accumulate(&ctx, g, s.r, s.n);
    gradcheck("add: d/da", s.a, g, s.n, add_loss, &s, 1e-2f);
    gradcheck("add: d/db", s.b, g, s.n, add_loss, &s, 1e-2f);
    free(s.a), free(s.b), free(s.y), free(s.r), free(g);
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv);
    ps_engine_init(&ctx, 0);
    /* every convolution row of the CPU backend (conv_provider.h): the
     * oneDNN one falls back to im2col + GEMM in a build without it */
    static const char *const rows[] = {"gemm", "onednn"};
    for (int r = 0; r < 2; r++) {
    ps_conv_set_kernels(rows[r]);
    conv_row = rows[r];
    /* name, desc {C,K,R,S,sh,sw,ph,pw,dh,dw,groups}, N, H, W, bias, gemm cols */
    test_conv("3x3 s1 p1 bias", (ps_conv2d_desc_t){3, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 2, 6, 5,
              1, 0);
    test_conv("3x3 s2 p1 groups 2 (per image)",
              (ps_conv2d_desc_t){4, 6, 3, 3, 2, 2, 1, 1, 1, 1, 2}, 2, 7, 6, 0, 1);
    test_conv("3x3 dil 2 p2", (ps_conv2d_desc_t){3, 4, 3, 3, 1, 1, 2, 2, 2, 2, 1}, 2, 7, 7, 1,
              0);
    test_conv("1x1 direct GEMM", (ps_conv2d_desc_t){5, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1}, 2, 4, 5,
              1, 1);
    test_conv("1x1 batched", (ps_conv2d_desc_t){5, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1}, 3, 4, 5, 0,
              0);
    test_conv("depthwise 3x3 s2", (ps_conv2d_desc_t){4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 4}, 2, 6, 6,
              1, 0);
    test_conv("7x7 s2 p3", (ps_conv2d_desc_t){2, 3, 7, 7, 2, 2, 3, 3, 1, 1, 1}, 1, 9, 8, 0, 0);
    }
    ps_conv_set_kernels(NULL);
    test_bn(1);
    test_bn(0);
    test_one("relu dinp", K_RELU);
    test_one("maxpool 3x3/2 pad 1 dinp", K_MAXPOOL);
    test_one("global avgpool dinp", K_AVGPOOL);
    test_one("dropout p=0.4 dinp", K_DROPOUT);
    test_one("temporal shift fold_div 4 dinp", K_TSHIFT);
    test_one("segment consensus dinp", K_CONSENSUS);
    test_linear();
    test_xent();
    test_add();
    ps_ctx_free(&ctx);
    return tap_done();
}
