/* The CPU convolution providers (worker/engine/layers/conv_provider.h):
 * every row -- im2col + GEMM with each sgemm library, oneDNN -- and the
 * measured selection, forward and both backward directions, on the shapes
 * of the ResNets (1x1, 3x3, strides, the 7x7 stem, groups, dilation,
 * bias, odd sizes, asymmetric kernels) and a few at ResNet's widths, with
 * one and two threads.
 *
 * Reference: the convolution summed in double.  Tolerance, derived rather
 * than tuned: an fp32 sum of L products computed in ANY order (blocked,
 * reordered, FMA or not) is within gamma_L = L*u/(1-L*u) (u = 2^-24) of
 * the exact sum, relative to the sum of the products' magnitudes
 * (Higham, Accuracy and Stability, 3.1); each element is checked against
 * (L+2)*u * sum|terms| (+2 for the bias / prior value added and the
 * product roundings being inside gamma).  A wrong index or a missing
 * term is off by a whole term, far outside that.
 *
 * Also: the dispatcher runs the row it reports (the auto mode's result
 * equals, bit for bit, the reported row forced), weight gradients
 * accumulate and input gradients overwrite (NaN-poisoned outputs), a
 * bad PS_CONV_KERNELS falls back to measurement and a bad mode is
 * refused. */
#include "tests/lib/tap.h"
#include "worker/engine/layers/conv_provider.h"
#include "worker/engine/layers/cpu_layers.h"
#include "worker/engine/ps_blas.h"
#include "worker/engine/ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define U 5.9604644775390625e-08 /* 2^-24 */
#define PRIOR 0.25f

typedef struct {
    const char *name;
    ps_conv2d_desc_t d;
    int N, H, W, bias;
} case_t;

/* {C, K, R, S, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups} */
static const case_t cases[] = {
    {"3x3 s1 p1 bias", {8, 12, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 3, 9, 7, 1},
    {"3x3 s2 p1", {8, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1}, 3, 9, 9, 0},
    {"1x1 s1 bias", {16, 24, 1, 1, 1, 1, 0, 0, 1, 1, 1}, 3, 6, 5, 1},
    {"1x1 s2 (downsample)", {16, 32, 1, 1, 2, 2, 0, 0, 1, 1, 1}, 3, 7, 7, 0},
    {"7x7 s2 p3 (stem)", {3, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1}, 2, 20, 18, 0},
    {"3x3 dilation 2 p2", {8, 8, 3, 3, 1, 1, 2, 2, 2, 2, 1}, 2, 8, 8, 0},
    {"3x3 groups 2 bias", {8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2}, 2, 6, 6, 1},
    {"3x1 s1,2 p1,0", {5, 7, 3, 1, 1, 2, 1, 0, 1, 1, 1}, 3, 7, 9, 0},
    /* at ResNet's widths, where oneDNN's blocked kernels run */
    {"3x3 64->64 @14 (layer1 kind)", {64, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 2, 14, 14, 0},
    {"3x3 s2 64->128 @14", {64, 128, 3, 3, 2, 2, 1, 1, 1, 1, 1}, 2, 14, 14, 0},
    {"1x1 64->256 @14 (bottleneck)", {64, 256, 1, 1, 1, 1, 0, 0, 1, 1, 1}, 2, 14, 14, 0},
    {"7x7 s2 p3 3->64 @32 (stem)", {3, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1}, 2, 32, 32, 0},
    /* planes smaller than the kernel (a small model's last stages) */
    {"3x3 64->64 @2x2", {64, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 16, 2, 2, 0},
    {"3x3 s2 64->128 @2x2", {64, 128, 3, 3, 2, 2, 1, 1, 1, 1, 1}, 16, 2, 2, 0},
    {"3x3 128->128 @1x1", {128, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 16, 1, 1, 0},
    {"1x1 s2 64->128 @2x2", {64, 128, 1, 1, 2, 2, 0, 0, 1, 1, 1}, 16, 2, 2, 0},
};

/* ways to run: a forced row and sgemm library, or the measured selection */
typedef struct {
    const char *name, *mode, *sgemm;
} cfg_t;
static const cfg_t cfgs[] = {
    {"gemm (OpenBLAS)", "gemm", "openblas"},
    {"gemm (oneDNN sgemm)", "gemm", "onednn"},
    {"onednn", "onednn", NULL},
    {"auto", "auto", NULL},
};

static ps_ctx_t ctx;

static float *rnd(size_t n, unsigned seed)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    return p;
}

static float *fill(size_t n, float v)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}

/* Exact (double) results and the magnitude sums that bound fp32 error. */
typedef struct {
    double *y, *ya, *dx, *dxa, *dw, *dwa, *db, *dba;
    int Ly, Ldx, Ldw; /* terms per element (upper bound) */
} ref_t;

static void reference(ref_t *r, const case_t *c, int P, int Q, const float *x, const float *w,
                      const float *b, const float *dy)
{
    const ps_conv2d_desc_t *d = &c->d;
    const int N = c->N, H = c->H, W = c->W, G = d->groups, Cg = d->C / G, Kg = d->K / G;
    const size_t nx = (size_t)N * d->C * H * W, ny = (size_t)N * d->K * P * Q;
    const size_t nw = (size_t)d->K * Cg * d->R * d->S;
    r->y = calloc(ny, 8), r->ya = calloc(ny, 8), r->dx = calloc(nx, 8), r->dxa = calloc(nx, 8);
    r->dw = calloc(nw, 8), r->dwa = calloc(nw, 8), r->db = calloc(d->K, 8);
    r->dba = calloc(d->K, 8);
    r->Ly = Cg * d->R * d->S, r->Ldx = Kg * d->R * d->S, r->Ldw = N * P * Q;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < d->K; k++) {
            const int g = k / Kg;
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++) {
                    const size_t yi = (((size_t)n * d->K + k) * P + p) * Q + q;
                    const double gy = dy[yi];
                    r->db[k] += gy, r->dba[k] += fabs(gy);
                    for (int c0 = 0; c0 < Cg; c0++)
                        for (int i = 0; i < d->R; i++)
                            for (int j = 0; j < d->S; j++) {
                                const int h = p * d->stride_h - d->pad_h + i * d->dil_h;
                                const int ww = q * d->stride_w - d->pad_w + j * d->dil_w;
                                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                                const size_t xi =
                                    (((size_t)n * d->C + g * Cg + c0) * H + h) * W + ww;
                                const size_t wi = (((size_t)k * Cg + c0) * d->R + i) * d->S + j;
                                const double xv = x[xi], wv = w[wi];
                                r->y[yi] += xv * wv, r->ya[yi] += fabs(xv * wv);
                                r->dx[xi] += gy * wv, r->dxa[xi] += fabs(gy * wv);
                                r->dw[wi] += gy * xv, r->dwa[wi] += fabs(gy * xv);
                            }
                    if (b) r->y[yi] += b[k], r->ya[yi] += fabs(b[k]);
                }
        }
}

static void ref_free(ref_t *r)
{
    free(r->y), free(r->ya), free(r->dx), free(r->dxa), free(r->dw), free(r->dwa);
    free(r->db), free(r->dba);
}

/* got[i] against exact[i] + prior within (L+2)*u*(abs[i] + |prior|). */
static int within(const char *what, const float *got, const double *exact, const double *abs,
                  size_t n, int L, float prior)
{
    size_t bad = 0, worst = 0;
    double worst_ratio = 0;
    for (size_t i = 0; i < n; i++) {
        const double want = exact[i] + prior, bound = (L + 2) * U * (abs[i] + fabs(prior)) + 1e-30;
        const double err = fabs((double)got[i] - want);
        if (!(err <= bound)) bad++;
        if (!(err / bound <= worst_ratio)) worst_ratio = err / bound, worst = i;
    }
    int r = ok(bad == 0, "%s: %zu elements within (L+2)u*sum|terms| (L=%d; worst at %.2f of it)",
               what, n, L, worst_ratio);
    if (!r)
        printf("#   %zu outside; worst at %zu: got %.9g want %.9g bound %.3g\n", bad, worst,
               (double)got[worst], exact[worst] + prior,
               (L + 2) * U * (abs[worst] + fabs(prior)));
    return r;
}

static int set_cfg(const cfg_t *k)
{
    if (ps_blas_set_library(k->sgemm)) return 0;
    return ps_conv_set_kernels(k->mode) == 0;
}

/* the row the selection reports for (case, dir) right now, or NULL */
static const char *reported(const case_t *c, ps_conv_dir_t dir)
{
    ps_conv_choice_t ch[64];
    ps_conv_shape_t s;
    ps_conv_shape_2d(&s, &c->d, c->N, c->H, c->W, dir == PS_CONV_FWD && c->bias);
    int n = ps_conv_choices(ch, 64);
    for (int i = 0; i < n && i < 64; i++)
        if (ch[i].dir == dir && !memcmp(&ch[i].shape, &s, sizeof s)) return ch[i].provider;
    return NULL;
}

static void run_case(const case_t *c, const cfg_t *k, int threads)
{
    const ps_conv2d_desc_t *d = &c->d;
    const int P = ps_conv_out(c->H, d->R, d->stride_h, d->pad_h, d->dil_h);
    const int Q = ps_conv_out(c->W, d->S, d->stride_w, d->pad_w, d->dil_w);
    const size_t nx = (size_t)c->N * d->C * c->H * c->W, ny = (size_t)c->N * d->K * P * Q;
    const size_t nw = (size_t)d->K * (d->C / d->groups) * d->R * d->S;
    float *x = rnd(nx, 1), *w = rnd(nw, 2), *b = c->bias ? rnd(d->K, 3) : NULL;
    float *dy = rnd(ny, 4);
    ref_t r;
    reference(&r, c, P, Q, x, w, b, dy);
    char what[160];
    snprintf(what, sizeof what, "%s, %s, %d thread%s", c->name, k->name, threads,
             threads > 1 ? "s" : "");
    if (!set_cfg(k)) {
        ok(0, "%s: configuration refused", what);
        return;
    }
    ps_ctx_reserve(&ctx, ps_conv2d_workspace(d, c->N, c->H, c->W));

    float *y = fill(ny, NAN), *dx = fill(nx, NAN), *dw = fill(nw, PRIOR);
    float *db = fill(d->K, PRIOR), *dw1 = fill(nw, PRIOR), *dx1 = fill(nx, NAN);
    ps_cpu_conv2d_forward(&ctx, y, x, w, b, d, c->N, c->H, c->W);
    ps_cpu_conv2d_backward(&ctx, dx, dw, b ? db : NULL, dy, x, w, d, c->N, c->H, c->W);
    ps_cpu_conv2d_backward(&ctx, NULL, dw1, NULL, dy, x, w, d, c->N, c->H, c->W);
    ps_cpu_conv2d_backward(&ctx, dx1, NULL, NULL, dy, x, w, d, c->N, c->H, c->W);
    char m[256];
    snprintf(m, sizeof m, "%s: forward", what);
    within(m, y, r.y, r.ya, ny, r.Ly, 0);
    snprintf(m, sizeof m, "%s: dinp (overwritten)", what);
    within(m, dx, r.dx, r.dxa, nx, r.Ldx, 0);
    snprintf(m, sizeof m, "%s: dw (accumulated)", what);
    within(m, dw, r.dw, r.dwa, nw, r.Ldw, PRIOR);
    if (b) {
        snprintf(m, sizeof m, "%s: db (accumulated)", what);
        within(m, db, r.db, r.dba, d->K, r.Ldw, PRIOR);
    }
    snprintf(m, sizeof m, "%s: dw alone (dinp NULL)", what);
    within(m, dw1, r.dw, r.dwa, nw, r.Ldw, PRIOR);
    snprintf(m, sizeof m, "%s: dinp alone (dw NULL)", what);
    within(m, dx1, r.dx, r.dxa, nx, r.Ldx, 0);

    /* the mode's rows are the ones reported; in auto, forcing the
     * reported row reproduces the result bit for bit */
    const char *rf = reported(c, PS_CONV_FWD), *rd = reported(c, PS_CONV_BWD_DATA);
    const char *rw = reported(c, PS_CONV_BWD_WEIGHTS);
    if (strcmp(k->mode, "auto")) {
        const int want_onednn = !strcmp(k->mode, "onednn") && ps_conv_onednn_available();
        const char *want = want_onednn ? "onednn" : "gemm";
        ok(rf && rd && rw && !strcmp(rf, want) && !strcmp(rd, want) && !strcmp(rw, want),
           "%s: reported rows %s / %s / %s (forced %s)", what, rf ? rf : "-", rd ? rd : "-",
           rw ? rw : "-", want);
    } else if (rf && rd && rw) {
        float *y2 = fill(ny, NAN), *dx2 = fill(nx, NAN), *dw2 = fill(nw, PRIOR);
        float *dx3 = fill(nx, NAN), *dw3 = fill(nw, PRIOR);
        char fr[16], dr[16], wr[16];
        snprintf(fr, sizeof fr, "%s", rf), snprintf(dr, sizeof dr, "%s", rd);
        snprintf(wr, sizeof wr, "%s", rw);
        ps_conv_set_kernels(fr);
        ps_cpu_conv2d_forward(&ctx, y2, x, w, b, d, c->N, c->H, c->W);
        ps_conv_set_kernels(dr);
        ps_cpu_conv2d_backward(&ctx, dx2, NULL, NULL, dy, x, w, d, c->N, c->H, c->W);
        ps_conv_set_kernels(wr);
        ps_cpu_conv2d_backward(&ctx, NULL, dw2, NULL, dy, x, w, d, c->N, c->H, c->W);
        /* the auto run's joint backward against the same rows */
        ps_conv_set_kernels(dr);
        ps_cpu_conv2d_backward(&ctx, dx3, NULL, NULL, dy, x, w, d, c->N, c->H, c->W);
        ps_conv_set_kernels(wr);
        ps_cpu_conv2d_backward(&ctx, NULL, dw3, NULL, dy, x, w, d, c->N, c->H, c->W);
        ok(!memcmp(y, y2, ny * 4) && !memcmp(dx1, dx2, nx * 4) && !memcmp(dw1, dw2, nw * 4) &&
               !memcmp(dx, dx3, nx * 4),
           "%s: chose %s / %s / %s, and forcing those reproduces every result bit for bit",
           what, fr, dr, wr);
        free(y2), free(dx2), free(dw2), free(dx3), free(dw3);
    } else {
        ok(0, "%s: the selection reports no choice for this shape", what);
    }
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(dw1);
    free(dx1);
    ref_free(&r);
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv);
    ps_log_level = PS_LOG_WARN;
    /* a bad PS_CONV_KERNELS: warned, and the selection measures */
    setenv("PS_CONV_KERNELS", "no-such-row", 1);
    ps_engine_init(&ctx, 2);
    {
        const case_t *c = &cases[0];
        float *x = rnd((size_t)c->N * c->d.C * c->H * c->W, 5);
        float *w = rnd((size_t)c->d.K * c->d.C * 9, 6);
        float *y = fill((size_t)c->N * c->d.K * c->H * c->W, 0);
        ps_cpu_conv2d_forward(&ctx, y, x, w, NULL, &c->d, c->N, c->H, c->W);
        ok(!strcmp(ps_conv_get_kernels(), "auto"),
           "PS_CONV_KERNELS=no-such-row: ignored, kernels chosen by measurement (%s)",
           ps_conv_get_kernels());
        free(x), free(w), free(y);
    }
    ok(ps_conv_set_kernels("no-such-row") == PS_EINVAL, "an unknown row name is refused");
    /* precisions: fp16 never on the CPU; bf16 only with native bf16 (its
     * arithmetic is test_cpu_bf16's) -- refused, the context stays fp32 */
    {
        char why[192];
        const int has_bf16 = ps_engine_cpu_precision_ok(PS_PRECISION_BF16, why, sizeof why);
        ok(ps_cpu_set_precision(&ctx, PS_PRECISION_FP16) == PS_EUNSUPPORTED &&
               !ps_engine_cpu_precision_ok(PS_PRECISION_FP16, why, sizeof why),
           "precision fp16 refused on the CPU (%s)", why);
        if (!has_bf16) {
            ps_engine_cpu_precision_ok(PS_PRECISION_BF16, why, sizeof why);
            ok(ps_cpu_set_precision(&ctx, PS_PRECISION_BF16) == PS_EUNSUPPORTED &&
                   ps_cpu_state(&ctx)->precision == PS_PRECISION_FP32,
               "precision bf16 refused here, the context stays fp32 (%s)", why);
        } else {
            diag("this CPU has native bf16: test_cpu_bf16 checks it");
        }
        ok(ps_cpu_set_precision(&ctx, PS_PRECISION_FP32) == 0, "precision fp32 accepted");
    }
    ok(ps_blas_set_library("no-such-blas") == PS_EINVAL, "an unknown sgemm library is refused");
    char dn[96];
    diag("%s; OpenBLAS core %s", ps_conv_onednn_describe(dn, sizeof dn), ps_blas_corename());
    if (!ps_conv_onednn_available()) diag("no oneDNN: its rows fall back to im2col + GEMM");

    for (int t = 1; t <= 2; t++) {
#ifdef _OPENMP
        omp_set_num_threads(t);
#endif
        for (size_t k = 0; k < sizeof cfgs / sizeof *cfgs; k++) {
            if (cfgs[k].sgemm && !strcmp(cfgs[k].sgemm, "onednn") &&
                !ps_conv_onednn_available())
                continue; /* no oneDNN sgemm in this build */
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
                run_case(&cases[i], &cfgs[k], t);
        }
    }
    char sum[512];
    diag("kernels of the last configuration: %s", ps_conv_summary(sum, sizeof sum));
    ps_conv_set_kernels(NULL);
    ps_blas_set_library(NULL);
    ps_ctx_free(&ctx);
    return tap_done();
}
