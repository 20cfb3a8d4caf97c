/* The CPU convolution providers (worker/engine/layers/conv_provider.h):
 * every row -- im2col + GEMM with each sgemm library, oneDNN -- and the
 * measured selection, forward and both backward directions, through the
 * conv2d and conv3d slots, on the shapes of the ResNets (1x1, 3x3,
 * strides, the 7x7 stem, groups, dilation, bias, odd sizes, asymmetric
 * kernels, planes smaller than the kernel) and of the 3-D models (3x3x3,
 * I3D's 3x1x1, R(2+1)D's 1x3x3, 1x1x1, the 3x7x7 / 5x7x7 stems), a few at
 * ResNet's widths, with one and two threads.
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

static ps_ctx_t ctx_;

typedef struct {
    const char *name;
    ps_conv2d_desc_t d;
    int N, H, W, bias;
    ps_conv3d_desc_t d3; /* used when is3 */
    int is3, D;
} case_t;

/* {C, K, R, S, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups} */
static const case_t cases[] = {
    {"3x3 s1 p1 bias", {8, 12, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 3, 9, 7, 1, {0}, 0, 0},
    {"3x3 s2 p1", {8, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1}, 3, 9, 9, 0, {0}, 0, 0},
    {"1x1 s1 bias", {16, 24, 1, 1, 1, 1, 0, 0, 1, 1, 1}, 3, 6, 5, 1, {0}, 0, 0},
    {"1x1 s2 (downsample)", {16, 32, 1, 1, 2, 2, 0, 0, 1, 1, 1}, 3, 7, 7, 0, {0}, 0, 0},
    {"7x7 s2 p3 (stem)", {3, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1}, 2, 20, 18, 0, {0}, 0, 0},
    {"3x3 dilation 2 p2", {8, 8, 3, 3, 1, 1, 2, 2, 2, 2, 1}, 2, 8, 8, 0, {0}, 0, 0},
    {"3x3 groups 2 bias", {8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2}, 2, 6, 6, 1, {0}, 0, 0},
    {"3x1 s1,2 p1,0", {5, 7, 3, 1, 1, 2, 1, 0, 1, 1, 1}, 3, 7, 9, 0, {0}, 0, 0},
    /* at ResNet's widths, where oneDNN's blocked kernels run */
    {"3x3 64->64 @14 (layer1 kind)", {64, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 2, 14, 14, 0, {0}, 0, 0},
    {"3x3 s2 64->128 @14", {64, 128, 3, 3, 2, 2, 1, 1, 1, 1, 1}, 2, 14, 14, 0, {0}, 0, 0},
    {"1x1 64->256 @14 (bottleneck)", {64, 256, 1, 1, 1, 1, 0, 0, 1, 1, 1}, 2, 14, 14, 0, {0}, 0, 0},
    {"7x7 s2 p3 3->64 @32 (stem)", {3, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1}, 2, 32, 32, 0, {0}, 0, 0},
    /* planes smaller than the kernel (a small model's last stages) */
    {"3x3 64->64 @2x2", {64, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 16, 2, 2, 0, {0}, 0, 0},
    {"3x3 s2 64->128 @2x2", {64, 128, 3, 3, 2, 2, 1, 1, 1, 1, 1}, 16, 2, 2, 0, {0}, 0, 0},
    {"3x3 128->128 @1x1", {128, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1}, 16, 1, 1, 0, {0}, 0, 0},
    {"1x1 s2 64->128 @2x2", {64, 128, 1, 1, 2, 2, 0, 0, 1, 1, 1}, 16, 2, 2, 0, {0}, 0, 0},
    /* 3-D: {C, K, KT, R, S, st, sh, sw, pt, ph, pw, dt, dh, dw, groups}; the
     * shapes of r3d / I3D / R(2+1)D (3x3x3, 3x1x1, 1x3x3, 1x1x1, the 3x7x7
     * and 5x7x7 stems, strided downsamples) */
    {"3-D 3x3x3 s1 p1 bias", {0}, 2, 6, 5, 1, {8, 12, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 1, 4},
    {"3-D 3x3x3 s2 p1", {0}, 2, 7, 7, 0, {8, 16, 3, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1}, 1, 5},
    {"3-D 3x1x1 p1,0,0 (I3D)", {0}, 2, 5, 5, 0, {16, 16, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, 1, 4},
    {"3-D 1x3x3 s1,2,2 (R(2+1)D)", {0}, 2, 8, 8, 0, {8, 12, 1, 3, 3, 1, 2, 2, 0, 1, 1, 1, 1, 1, 1}, 1, 3},
    {"3-D 1x1x1 s1 bias", {0}, 2, 4, 4, 1, {16, 24, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1}, 1, 3},
    {"3-D 1x1x1 s2 (downsample)", {0}, 2, 6, 6, 0, {16, 32, 1, 1, 1, 2, 2, 2, 0, 0, 0, 1, 1, 1, 1}, 1, 4},
    {"3-D 3x7x7 s1,2,2 p1,3,3 (r3d stem)", {0}, 1, 16, 16, 0, {3, 16, 3, 7, 7, 1, 2, 2, 1, 3, 3, 1, 1, 1, 1}, 1, 4},
    {"3-D 5x7x7 s1,2,2 p2,3,3 (I3D stem)", {0}, 1, 16, 16, 0, {3, 16, 5, 7, 7, 1, 2, 2, 2, 3, 3, 1, 1, 1, 1}, 1, 4},
    {"3-D 3x3x3 64->64 @4x7x7", {0}, 2, 7, 7, 0, {64, 64, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 1, 4},
    {"3-D 3x3x3 groups 2, dilation 2,1,1", {0}, 2, 5, 5, 0, {8, 8, 3, 3, 3, 1, 1, 1, 2, 1, 1, 2, 1, 1, 2}, 1, 5},
};

static void case_shape(const case_t *c, ps_conv_shape_t *s, int bias)
{
    if (c->is3)
        ps_conv_shape_3d(s, &c->d3, c->N, c->D, c->H, c->W, bias);
    else
        ps_conv_shape_2d(s, &c->d, c->N, c->H, c->W, bias);
}

static void slot_fwd(const case_t *c, float *y, const float *x, const float *w, const float *b)
{
    if (c->is3)
        ps_cpu_conv3d_forward(&ctx_, y, x, w, b, &c->d3, c->N, c->D, c->H, c->W);
    else
        ps_cpu_conv2d_forward(&ctx_, y, x, w, b, &c->d, c->N, c->H, c->W);
}

static void slot_bwd(const case_t *c, float *dx, float *dw, float *db, const float *dy,
                     const float *x, const float *w)
{
    if (c->is3)
        ps_cpu_conv3d_backward(&ctx_, dx, dw, db, dy, x, w, &c->d3, c->N, c->D, c->H, c->W);
    else
        ps_cpu_conv2d_backward(&ctx_, dx, dw, db, dy, x, w, &c->d, c->N, c->H, c->W);
}

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

static void reference(ref_t *r, const ps_conv_shape_t *s, const float *x, const float *w,
                      const float *b, const float *dy)
{
    const int G = s->groups, Cg = s->C / G, Kg = s->K / G;
    const size_t IN = (size_t)s->in[0] * s->in[1] * s->in[2];
    const size_t OUT = (size_t)s->out[0] * s->out[1] * s->out[2];
    const size_t KER = (size_t)s->ker[0] * s->ker[1] * s->ker[2];
    const size_t nx = (size_t)s->N * s->C * IN, ny = (size_t)s->N * s->K * OUT;
    const size_t nw = (size_t)s->K * Cg * KER;
    r->y = calloc(ny, 8), r->ya = calloc(ny, 8), r->dx = calloc(nx, 8), r->dxa = calloc(nx, 8);
    r->dw = calloc(nw, 8), r->dwa = calloc(nw, 8), r->db = calloc(s->K, 8);
    r->dba = calloc(s->K, 8);
    r->Ly = Cg * (int)KER, r->Ldx = Kg * (int)KER, r->Ldw = s->N * (int)OUT;
    for (int n = 0; n < s->N; n++)
        for (int k = 0; k < s->K; k++)
            for (size_t o = 0; o < OUT; o++) {
                const int op[3] = {(int)(o / ((size_t)s->out[1] * s->out[2])),
                                   (int)(o / s->out[2] % s->out[1]), (int)(o % s->out[2])};
                const size_t yi = ((size_t)n * s->K + k) * OUT + o;
                const double gy = dy[yi];
                r->db[k] += gy, r->dba[k] += fabs(gy);
                for (int c0 = 0; c0 < Cg; c0++)
                    for (size_t t = 0; t < KER; t++) {
                        const int kp[3] = {(int)(t / ((size_t)s->ker[1] * s->ker[2])),
                                           (int)(t / s->ker[2] % s->ker[1]),
                                           (int)(t % s->ker[2])};
                        size_t xo = 0;
                        int inside = 1;
                        for (int a = 0; a < 3 && inside; a++) {
                            const int i = op[a] * s->stride[a] - s->pad[a] + kp[a] * s->dil[a];
                            inside = i >= 0 && i < s->in[a];
                            xo = xo * s->in[a] + (size_t)i;
                        }
                        if (!inside) continue;
                        const size_t xi = ((size_t)n * s->C + (size_t)(k / Kg) * Cg + c0) * IN + xo;
                        const size_t wi = ((size_t)k * Cg + c0) * KER + t;
                        const double xv = x[xi], wv = w[wi];
                        r->y[yi] += xv * wv, r->ya[yi] += fabs(xv * wv);
                        r->dx[xi] += gy * wv, r->dxa[xi] += fabs(gy * wv);
                        r->dw[wi] += gy * xv, r->dwa[wi] += fabs(gy * xv);
                    }
                if (b) r->y[yi] += b[k], r->ya[yi] += fabs(b[k]);
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
    case_shape(c, &s, dir == PS_CONV_FWD && c->bias);
    int n = ps_conv_choices(ch, 64);
    for (int i = 0; i < n && i < 64; i++)
        if (ch[i].dir == dir && !memcmp(&ch[i].shape, &s, sizeof s)) return ch[i].provider;
    return NULL;
}

/* One case's operands and exact results, made once for all configurations. */
typedef struct {
    ps_conv_shape_t sh;
    size_t nx, ny, nw;
    float *x, *w, *b, *dy;
    ref_t r;
} data_t;

static void data_make(data_t *t, const case_t *c)
{
    case_shape(c, &t->sh, c->bias);
    const ps_conv_shape_t *s = &t->sh;
    t->nx = (size_t)s->N * s->C * s->in[0] * s->in[1] * s->in[2];
    t->ny = (size_t)s->N * s->K * s->out[0] * s->out[1] * s->out[2];
    t->nw = (size_t)s->K * (s->C / s->groups) * s->ker[0] * s->ker[1] * s->ker[2];
    t->x = rnd(t->nx, 1), t->w = rnd(t->nw, 2), t->b = c->bias ? rnd(s->K, 3) : NULL;
    t->dy = rnd(t->ny, 4);
    reference(&t->r, s, t->x, t->w, t->b, t->dy);
}

static void data_free(data_t *t)
{
    free(t->x), free(t->w), free(t->b), free(t->dy);
    ref_free(&t->r);
}

static void run_case(const case_t *c, const data_t *t, const cfg_t *k, int threads)
{
    const size_t nx = t->nx, ny = t->ny, nw = t->nw;
    const int K = t->sh.K;
    const float *x = t->x, *w = t->w, *b = t->b, *dy = t->dy;
    const ref_t r = t->r;
    char what[160];
    snprintf(what, sizeof what, "%s, %s, %d thread%s", c->name, k->name, threads,
             threads > 1 ? "s" : "");
    if (!set_cfg(k)) {
        ok(0, "%s: configuration refused", what);
        return;
    }
    ps_ctx_reserve(&ctx_, c->is3 ? ps_conv3d_workspace(&c->d3, c->N, c->D, c->H, c->W)
                                 : ps_conv2d_workspace(&c->d, c->N, c->H, c->W));

    float *y = fill(ny, NAN), *dx = fill(nx, NAN), *dw = fill(nw, PRIOR);
    float *db = fill(K, PRIOR), *dw1 = fill(nw, PRIOR), *dx1 = fill(nx, NAN);
    slot_fwd(c, y, x, w, b);
    slot_bwd(c, dx, dw, b ? db : NULL, dy, x, w);
    slot_bwd(c, NULL, dw1, NULL, dy, x, w);
    slot_bwd(c, dx1, NULL, NULL, dy, x, w);
    char m[256];
    snprintf(m, sizeof m, "%s: forward", what);
    within(m, y, r.y, r.ya, ny, r.Ly, 0);
    snprintf(m, sizeof m, "%s: dinp (overwritten)", what);
    within(m, dx, r.dx, r.dxa, nx, r.Ldx, 0);
    snprintf(m, sizeof m, "%s: dw (accumulated)", what);
    within(m, dw, r.dw, r.dwa, nw, r.Ldw, PRIOR);
    if (b) {
        snprintf(m, sizeof m, "%s: db (accumulated)", what);
        within(m, db, r.db, r.dba, K, r.Ldw, PRIOR);
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
        slot_fwd(c, y2, x, w, b);
        ps_conv_set_kernels(dr);
        slot_bwd(c, dx2, NULL, NULL, dy, x, w);
        ps_conv_set_kernels(wr);
        slot_bwd(c, NULL, dw2, NULL, dy, x, w);
        /* the auto run's backward of both: one joint call when both
         * directions chose the same row (as the dispatcher does), else
         * the two rows in turn */
        if (!strcmp(dr, wr)) {
            ps_conv_set_kernels(dr);
            slot_bwd(c, dx3, dw3, NULL, dy, x, w);
        } else {
            ps_conv_set_kernels(dr);
            slot_bwd(c, dx3, NULL, NULL, dy, x, w);
            ps_conv_set_kernels(wr);
            slot_bwd(c, NULL, dw3, NULL, dy, x, w);
        }
        ok(!memcmp(y, y2, ny * 4) && !memcmp(dx1, dx2, nx * 4) && !memcmp(dw1, dw2, nw * 4) &&
               !memcmp(dx, dx3, nx * 4) && !memcmp(dw, dw3, nw * 4),
           "%s: chose %s / %s / %s, and forcing those reproduces every result bit for bit",
           what, fr, dr, wr);
        free(y2), free(dx2), free(dw2), free(dx3), free(dw3);
    } else {
        ok(0, "%s: the selection reports no choice for this shape", what);
    }
    free(y), free(dx), free(dw), free(db), free(dw1), free(dx1);
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv);
    ps_log_level = PS_LOG_WARN;
    /* a bad PS_CONV_KERNELS: warned, and the selection measures */
    setenv("PS_CONV_KERNELS", "no-such-row", 1);
    ps_engine_init(&ctx_, 2);
    {
        const case_t *c = &cases[0];
        float *x = rnd((size_t)c->N * c->d.C * c->H * c->W, 5);
        float *w = rnd((size_t)c->d.K * c->d.C * 9, 6);
        float *y = fill((size_t)c->N * c->d.K * c->H * c->W, 0);
        ps_cpu_conv2d_forward(&ctx_, y, x, w, NULL, &c->d, c->N, c->H, c->W);
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
        ok(ps_cpu_set_precision(&ctx_, PS_PRECISION_FP16) == PS_EUNSUPPORTED &&
               !ps_engine_cpu_precision_ok(PS_PRECISION_FP16, why, sizeof why),
           "precision fp16 refused on the CPU (%s)", why);
        if (!has_bf16) {
            ps_engine_cpu_precision_ok(PS_PRECISION_BF16, why, sizeof why);
            ok(ps_cpu_set_precision(&ctx_, PS_PRECISION_BF16) == PS_EUNSUPPORTED &&
                   ps_cpu_state(&ctx_)->precision == PS_PRECISION_FP32,
               "precision bf16 refused here, the context stays fp32 (%s)", why);
        } else {
            diag("this CPU has native bf16: test_cpu_bf16 checks it");
        }
        ok(ps_cpu_set_precision(&ctx_, PS_PRECISION_FP32) == 0, "precision fp32 accepted");
    }
    ok(ps_blas_set_library("no-such-blas") == PS_EINVAL, "an unknown sgemm library is refused");
    char dn[96];
    diag("%s; OpenBLAS core %s", ps_conv_onednn_describe(dn, sizeof dn), ps_blas_corename());
    if (!ps_conv_onednn_available()) diag("no oneDNN: its rows fall back to im2col + GEMM");

    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        data_t data;
        data_make(&data, &cases[i]);
        for (int t = 1; t <= 2; t++) {
#ifdef _OPENMP
            omp_set_num_threads(t);
#endif
            for (size_t k = 0; k < sizeof cfgs / sizeof *cfgs; k++) {
                if (cfgs[k].sgemm && !strcmp(cfgs[k].sgemm, "onednn") &&
                    !ps_conv_onednn_available())
                    continue; /* no oneDNN sgemm in this build */
                run_case(&cases[i], &data, &cfgs[k], t);
            }
        }
        data_free(&data);
    }
    char sum[512];
    diag("kernels of the last configuration: %s", ps_conv_summary(sum, sizeof sum));
    ps_conv_set_kernels(NULL);
    ps_blas_set_library(NULL);
    ps_ctx_free(&ctx_);
    return tap_done();
}
