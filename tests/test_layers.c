/* Every CPU layer, forward and backward, against PyTorch's tensors
 * (tests/golden/layers_golden.bin from tests/golden/gen_layers.py).
 * Outputs are poisoned with NaN before each call so an element a layer
 * forgot to write shows up; parameter gradients start from a non-zero
 * value to check they are accumulated, not overwritten. */
#include "tests/lib/golden_io.h"
#include "tests/lib/layer_check.h"
#include "tests/lib/tap.h"
#include "worker/engine/layers/conv_provider.h"
#include "worker/engine/layers/cpu_layers.h"
#include "worker/engine/ps_blas.h"
#include "worker/engine/ps_engine.h"
#include "ps_log.h"

#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- golden file (tests/lib/golden_io.h) ---------------------------------- */

typedef golden_rec_t rec_t;

static rec_t *find(const char *name) { return golden_find(name); }

#define ATOL 1e-4
#define RTOL 1e-4
#define PRIOR 0.25f /* parameter gradients start here: they must accumulate */
#define GUARD 64    /* floats past the stated workspace size that must stay intact */

static ps_ctx_t ctx;
static const ps_backend_t *be = &ps_backend_cpu;

/* ---- conv2d --------------------------------------------------------------- */

/* mode 0: one image per GEMM; 1: two images per GEMM (last chunk may be
 * partial); 2: the default batching */
static void test_conv(int ci, int mode, const char *rows)
{
    char p[32], what[160];
    snprintf(p, sizeof p, "conv.%d.", ci);
    const int32_t *c = I_(p, "cfg");
    const int N = c[0], H = c[2], W = c[3];
    ps_conv2d_desc_t d = {.C = c[1], .K = c[4], .R = c[5], .S = c[6], .stride_h = c[7],
                          .stride_w = c[8], .pad_h = c[9], .pad_w = c[10], .dil_h = c[11],
                          .dil_w = c[12], .groups = c[13]};
    const int bias = c[14];
    const int P = ps_conv_out(H, d.R, d.stride_h, d.pad_h, d.dil_h);
    const int Q = ps_conv_out(W, d.S, d.stride_w, d.pad_w, d.dil_w);
    ps_conv2d_set_gemm_cols(mode == 0 ? 1 : mode == 1 ? (size_t)P * Q + 1 : 0);
    const size_t nx = (size_t)N * d.C * H * W, ny = (size_t)N * d.K * P * Q;
    const size_t nw = (size_t)d.K * (d.C / d.groups) * d.R * d.S;
    const float *x = F_(p, "x", nx), *w = F_(p, "w", nw), *b = bias ? F_(p, "b", d.K) : NULL;
    const float *dy = F_(p, "dout", ny);
    snprintf(what, sizeof what, "conv %d (C%d K%d %dx%d s%d,%d p%d,%d d%d,%d g%d%s, %s, %d img/GEMM)",
             ci, d.C, d.K, d.R, d.S, d.stride_h, d.stride_w, d.pad_h, d.pad_w, d.dil_h,
             d.dil_w, d.groups, bias ? " bias" : "", rows,
             ps_conv2d_images_per_gemm(&d, N, H, W));

    /* workspace sized exactly, with a guard band that must survive */
    size_t ws = ps_conv2d_workspace(&d, N, H, W);
    ps_ctx_free(&ctx);
    ps_ctx_reserve(&ctx, ws + GUARD);
    for (size_t i = 0; i < ws + GUARD; i++) ctx.workspace[i] = 12345.0f;

    float *y = nanbuf(ny);
    be->conv2d_forward(&ctx, y, x, w, b, &d, N, H, W);
    char m[200];
    snprintf(m, sizeof m, "%s forward", what);
    allclose(y, F_(p, "out", ny), (long)ny, ATOL, RTOL, m);

    float *dx = nanbuf(nx), *dw = constbuf(nw, PRIOR), *db = constbuf(d.K, PRIOR);
    be->conv2d_backward(&ctx, dx, dw, bias ? db : NULL, dy, x, w, &d, N, H, W);
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
    /* dinp NULL (first layer): parameter gradients only */
    for (size_t i = 0; i < nw; i++) dw[i] = 0;
    be->conv2d_backward(&ctx, NULL, dw, NULL, dy, x, w, &d, N, H, W);
    snprintf(m, sizeof m, "%s dw with dinp NULL", what);
    allclose(dw, F_(p, "dw", nw), (long)nw, 3 * ATOL, RTOL, m);

    int guard_ok = ctx.workspace_numel == ws + GUARD;
    for (size_t i = ws; i < ws + GUARD && guard_ok; i++) guard_ok = ctx.workspace[i] == 12345.0f;
    ok(guard_ok, "%s: stays inside its stated workspace of %zu floats", what, ws);
    free(y), free(dx), free(dw), free(db), free(rw);
}

/* ---- batchnorm -------------------------------------------------------------- */

static void test_bn(void)
{
    const int32_t *c = I_("bn_train.", "cfg");
    check_bn_golden(be, &ctx, "bn_train.", "bn_eval.", c[0], c[1], c[2], "bn");
}

/* fused eval BN + relu (optional table entries) against the two layers
 * above in turn, on the bn_eval golden inputs; in place as a model uses it */
static void test_bn_relu(void)
{
    if (!be->bn_relu_forward_eval || !be->bn_relu_backward_eval) {
        ok(0, "the CPU backend has the fused bn_relu entries");
        return;
    }
    const char *p = "bn_eval.";
    const int32_t *c = I_(p, "cfg");
    const int N = c[0], C = c[1], HW = c[2];
    const size_t n = (size_t)N * C * HW;
    const float eps = 1e-5f;
    const float *x = F_(p, "x", n), *g = F_(p, "gamma", C), *bt = F_(p, "beta", C);
    const float *rm = F_(p, "rm", C), *rv = F_(p, "rv", C), *dy = F_(p, "dout", n);
    float *ry = nanbuf(n), *y = nanbuf(n);
    be->bn_forward_eval(&ctx, ry, x, g, bt, rm, rv, eps, N, C, HW);
    be->relu_forward(&ctx, ry, ry, n);
    memcpy(y, x, n * sizeof(float));
    be->bn_relu_forward_eval(&ctx, y, y, g, bt, rm, rv, eps, N, C, HW);
    allclose(y, ry, (long)n, 0, 0, "bn_relu eval forward (in place) == bn eval, relu");
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) pos += ry[i] > 0;
    ok(pos > n / 5 && pos < n - n / 5, "bn_relu: relu mask is non-trivial (%zu of %zu pass)",
       pos, n);

    float *rdx = nanbuf(n), *rg = constbuf(C, PRIOR), *rb = constbuf(C, PRIOR);
    be->relu_backward(&ctx, rdx, dy, ry, n);
    be->bn_backward_eval(&ctx, rdx, rg, rb, rdx, x, g, rm, rv, eps, N, C, HW);
    float *dx = nanbuf(n), *dg = constbuf(C, PRIOR), *db = constbuf(C, PRIOR);
    memcpy(dx, dy, n * sizeof(float));
    be->bn_relu_backward_eval(&ctx, dx, dg, db, dx, y, x, g, rm, rv, eps, N, C, HW);
    allclose(dx, rdx, (long)n, 1e-6, 1e-6, "bn_relu eval dinp (in place) == relu, bn eval");
    allclose(dg, rg, C, 1e-5, 1e-5, "bn_relu eval dgamma (accumulated)");
    allclose(db, rb, C, 1e-5, 1e-5, "bn_relu eval dbeta (accumulated)");
    float *dx2 = nanbuf(n);
    be->bn_relu_backward_eval(&ctx, dx2, NULL, NULL, dy, y, x, g, rm, rv, eps, N, C, HW);
    allclose(dx2, rdx, (long)n, 1e-6, 1e-6, "bn_relu frozen dinp (dgamma/dbeta NULL)");
    free(ry), free(y), free(rdx), free(rg), free(rb), free(dx), free(dg), free(db), free(dx2);
}

/* ---- pointwise, pooling, linear, loss, shift, consensus ---------------------- */

static void test_relu(void)
{
    const char *p = "relu.";
    const size_t n = (size_t)I_(p, "cfg")[0];
    const float *x = F_(p, "x", n);
    float *y = nanbuf(n), *dx = nanbuf(n);
    be->relu_forward(&ctx, y, x, n);
    allclose(y, F_(p, "out", n), (long)n, 0, 0, "relu forward");
    be->relu_backward(&ctx, dx, F_(p, "dout", n), y, n);
    allclose(dx, F_(p, "dx", n), (long)n, 0, 0, "relu dinp");
    /* in place, as the models use it */
    memcpy(dx, x, n * sizeof(float));
    be->relu_forward(&ctx, dx, dx, n);
    allclose(dx, F_(p, "out", n), (long)n, 0, 0, "relu forward in place");
    free(y), free(dx);
}

static void test_maxpool(int pi)
{
    char p[32], m[128];
    snprintf(p, sizeof p, "maxpool.%d.", pi);
    const int32_t *c = I_(p, "cfg");
    const int N = c[0], C = c[1], H = c[2], W = c[3];
    ps_pool_desc_t d = {.R = c[4], .S = c[5], .stride_h = c[6], .stride_w = c[7],
                        .pad_h = c[8], .pad_w = c[9]};
    const int P = ps_conv_out(H, d.R, d.stride_h, d.pad_h, 1);
    const int Q = ps_conv_out(W, d.S, d.stride_w, d.pad_w, 1);
    const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * P * Q;
    float *y = nanbuf(ny), *dx = nanbuf(nx);
    int32_t *am = malloc(ny * sizeof(int32_t));
    memset(am, 0xff, ny * sizeof(int32_t));
    be->maxpool_forward(&ctx, y, am, F_(p, "x", nx), &d, N, C, H, W);
    snprintf(m, sizeof m, "maxpool %dx%d/%d pad %d forward", d.R, d.S, d.stride_h, d.pad_h);
    allclose(y, F_(p, "out", ny), (long)ny, 0, 0, m);
    const int32_t *ri = I_(p, "idx");
    size_t bad = 0;
    for (size_t i = 0; i < ny; i++) bad += am[i] != ri[i];
    ok(bad == 0, "maxpool %d: argmax equals PyTorch's indices (%zu differ)", pi, bad);
    be->maxpool_backward(&ctx, dx, F_(p, "dout", ny), am, &d, N, C, H, W);
    snprintf(m, sizeof m, "maxpool %dx%d/%d pad %d dinp", d.R, d.S, d.stride_h, d.pad_h);
    allclose(dx, F_(p, "dx", nx), (long)nx, 1e-6, 1e-6, m);
    free(y), free(dx), free(am);
}

static void test_avgpool(void)
{
    const char *p = "avgpool.";
    const int32_t *c = I_(p, "cfg");
    const int N = c[0], C = c[1], HW = c[2];
    const size_t nx = (size_t)N * C * HW, ny = (size_t)N * C;
    float *y = nanbuf(ny), *dx = nanbuf(nx);
    be->avgpool_forward(&ctx, y, F_(p, "x", nx), N, C, HW);
    allclose(y, F_(p, "out", ny), (long)ny, 1e-6, 1e-5, "global avgpool forward");
    be->avgpool_backward(&ctx, dx, F_(p, "dout", ny), N, C, HW);
    allclose(dx, F_(p, "dx", nx), (long)nx, 1e-6, 1e-5, "global avgpool dinp");
    free(y), free(dx);
}

static void test_linear(void)
{
    const char *p = "linear.";
    const int32_t *c = I_(p, "cfg");
    const int N = c[0], C = c[1], K = c[2];
    const float *x = F_(p, "x", (size_t)N * C), *w = F_(p, "w", (size_t)K * C);
    float *y = nanbuf((size_t)N * K), *dx = nanbuf((size_t)N * C);
    float *dw = constbuf((size_t)K * C, PRIOR), *db = constbuf(K, PRIOR);
    be->linear_forward(&ctx, y, x, w, F_(p, "b", K), N, C, K);
    allclose(y, F_(p, "out", (size_t)N * K), N * K, ATOL, RTOL, "linear forward");
    be->linear_backward(&ctx, dx, dw, db, F_(p, "dout", (size_t)N * K), x, w, N, C, K);
    allclose(dx, F_(p, "dx", (size_t)N * C), N * C, ATOL, RTOL, "linear dinp");
    float *rw = plus(F_(p, "dw", (size_t)K * C), (size_t)K * C, PRIOR);
    float *rb = plus(F_(p, "db", K), K, PRIOR);
    allclose(dw, rw, K * C, ATOL, RTOL, "linear dw (accumulated)");
    allclose(db, rb, K, ATOL, RTOL, "linear db (accumulated)");
    free(y), free(dx), free(dw), free(db), free(rw), free(rb);
}

static void test_xent(void)
{
    const char *p = "xent.";
    const int32_t *c = I_(p, "cfg");
    const int N = c[0], K = c[1];
    const size_t n = (size_t)N * K;
    float *pr = nanbuf(n), *dx = nanbuf(n);
    float loss = be->xent_forward(&ctx, pr, F_(p, "x", n), I_(p, "labels"), N, K);
    is_close(loss, F_(p, "loss", 1)[0], 1e-5, 1e-5, "cross-entropy loss (mean over N)");
    allclose(pr, F_(p, "probs", n), (long)n, 1e-6, 1e-5, "softmax probabilities");
    be->xent_backward(&ctx, dx, pr, I_(p, "labels"), F_(p, "dloss", 1)[0], N, K);
    allclose(dx, F_(p, "dx", n), (long)n, 1e-6, 1e-5, "cross-entropy dlogits");
    /* a label out of range is reported (NaN), not a crash */
    int32_t badlab[64];
    for (int i = 0; i < N && i < 64; i++) badlab[i] = 0;
    badlab[N - 1] = K;
    int lvl = ps_log_level;
    ps_log_level = -1; /* the error line is expected */
    ok(isnan(be->xent_forward(&ctx, pr, F_(p, "x", n), badlab, N, K)),
       "cross-entropy: out-of-range label gives NaN");
    ps_log_level = lvl;
    free(pr), free(dx);
}

static void test_tshift(int ti)
{
    char p[32], m[128];
    snprintf(p, sizeof p, "tshift.%d.", ti);
    const int32_t *c = I_(p, "cfg");
    const int B = c[0], T = c[1], C = c[2], HW = c[3], fd = c[4];
    const size_t n = (size_t)B * T * C * HW;
    float *y = nanbuf(n), *dx = nanbuf(n);
    be->tshift_forward(&ctx, y, F_(p, "x", n), B, T, C, HW, fd);
    snprintf(m, sizeof m, "temporal shift B%d T%d C%d fold_div %d forward", B, T, C, fd);
    allclose(y, F_(p, "out", n), (long)n, 0, 0, m);
    be->tshift_backward(&ctx, dx, F_(p, "dout", n), B, T, C, HW, fd);
    snprintf(m, sizeof m, "temporal shift B%d T%d C%d fold_div %d dinp", B, T, C, fd);
    allclose(dx, F_(p, "dx", n), (long)n, 0, 0, m);
    free(y), free(dx);
}

static void test_consensus(void)
{
    const char *p = "consensus.";
    const int32_t *c = I_(p, "cfg");
    const int B = c[0], T = c[1], K = c[2];
    float *y = nanbuf((size_t)B * K), *dx = nanbuf((size_t)B * T * K);
    be->consensus_forward(&ctx, y, F_(p, "x", (size_t)B * T * K), B, T, K);
    allclose(y, F_(p, "out", (size_t)B * K), B * K, 1e-6, 1e-5, "segment consensus forward");
    be->consensus_backward(&ctx, dx, F_(p, "dout", (size_t)B * K), B, T, K);
    allclose(dx, F_(p, "dx", (size_t)B * T * K), B * T * K, 1e-6, 1e-5, "segment consensus dinp");
    free(y), free(dx);
}

/* Dropout cannot come from torch (different generator): check it against
 * its definition and its statistics instead. */
static void test_dropout(void)
{
    const size_t n = 200000;
    const float p = 0.3f;
    const uint64_t seed = 0xC0FFEE;
    float *x = malloc(n * sizeof(float)), *y = nanbuf(n), *dx = nanbuf(n);
    uint8_t *mask = malloc(n);
    for (size_t i = 0; i < n; i++) x[i] = 1.0f + (float)(i % 7);
    be->dropout_forward(&ctx, y, mask, x, n, p, seed);
    size_t wrong = 0, kept = 0;
    double sum_in = 0, sum_out = 0;
    for (size_t i = 0; i < n; i++) {
        int keep = ps_rng_uniform(seed, i) >= p;
        float want = keep ? x[i] / (1.0f - p) : 0.0f;
        wrong += mask[i] != keep || fabsf(y[i] - want) > 1e-6f * fabsf(want);
        kept += keep;
        sum_in += x[i];
        sum_out += y[i];
    }
    ok(wrong == 0, "dropout: mask and scaled output follow the definition (%zu wrong)", wrong);
    /* binomial: sd of the kept fraction = sqrt(p(1-p)/n) ~ 0.001 */
    is_close((double)kept / n, 1.0 - p, 0.005, 0, "dropout: kept fraction ~ 1-p");
    is_close(sum_out / sum_in, 1.0, 0.01, 0, "dropout: expectation preserved (inverted scaling)");
    be->dropout_backward(&ctx, dx, x, mask, n, p);
    wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += dx[i] != y[i];
    ok(wrong == 0, "dropout backward: same mask and scale as forward (%zu wrong)", wrong);
    be->dropout_forward(&ctx, y, mask, x, n, p, seed + 1);
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += mask[i] == (ps_rng_uniform(seed, i) >= p);
    ok(same < n * 0.7, "dropout: another seed draws another mask (%zu of %zu agree)", same, n);
    free(x), free(y), free(dx), free(mask);
}

static void test_elementwise(void)
{
    float a[37], b[37], o[37], r[37];
    for (int i = 0; i < 37; i++) a[i] = (float)i * 0.5f - 3, b[i] = (float)(i * i) * 0.01f;
    for (int i = 0; i < 37; i++) r[i] = a[i] + b[i], o[i] = NAN;
    be->add(&ctx, o, a, b, 37);
    allclose(o, r, 37, 0, 0, "add");
    be->add(&ctx, a, a, b, 37); /* aliasing as in a residual */
    allclose(a, r, 37, 0, 0, "add in place");
    for (int i = 0; i < 37; i++) r[i] = a[i] + b[i];
    be->accumulate(&ctx, a, b, 37);
    allclose(a, r, 37, 0, 0, "accumulate");
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv);
    ps_engine_init(&ctx, 0);
    diag("OpenBLAS core %s, %d threads", ps_blas_corename(), ctx.nthreads);
    golden_load_or_bail("tests/golden/layers_golden.bin", 512);
    int nconv = 0;
    for (char nm[32]; snprintf(nm, sizeof nm, "conv.%d.cfg", nconv), find(nm);) nconv++;
    ok(nconv >= 8, "golden file holds %d conv cases", nconv);
    /* conv2d works differently with one thread (chunks in turn, each GEMM
     * split) and with a team (whole chunks per thread, private dw copies
     * summed at the end), and the team shrinks the images per GEMM: run
     * every case both ways, whatever this machine's core count. */
#ifdef _OPENMP
    const int teams[2] = {1, ctx.nthreads > 1 ? ctx.nthreads : 2};
#else
    const int teams[2] = {1, 1};
#endif
    for (int tm = 0; tm < 2; tm++) {
#ifdef _OPENMP
        omp_set_num_threads(teams[tm]);
#endif
        diag("conv2d with %d thread(s)", teams[tm]);
        /* im2col + GEMM in its three batchings with the default sgemm
         * library, with OpenBLAS's, and the oneDNN row (where this build
         * has it; else it falls back to the GEMM row) */
        ps_conv_set_kernels("gemm");
        for (int i = 0; i < nconv; i++)
            for (int mode = 0; mode < 3; mode++) test_conv(i, mode, ps_blas_library());
        ps_blas_set_library("openblas");
        for (int i = 0; i < nconv; i++) test_conv(i, 2, "OpenBLAS");
        ps_blas_set_library(NULL);
        ps_conv_set_kernels("onednn");
        for (int i = 0; i < nconv; i++) test_conv(i, 2, "oneDNN row");
        ps_conv_set_kernels(NULL);
    }
#ifdef _OPENMP
    omp_set_num_threads(ctx.nthreads);
#endif
    ps_conv2d_set_gemm_cols(0);
    test_bn();
    test_relu();
    test_bn_relu();
    for (int i = 0; i < 2; i++) test_maxpool(i);
    test_avgpool();
    test_linear();
    test_xent();
    for (int i = 0; i < 3; i++) test_tshift(i);
    test_consensus();
    test_dropout();
    test_elementwise();
    ps_ctx_free(&ctx);
    golden_free();
    return tap_done();
}
