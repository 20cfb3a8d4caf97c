/* batchnorm2d on the CPU, (N, C, HW) tensors, one channel per loop trip.
 * Train: batch statistics (biased variance to normalise, unbiased for the
 * running update, as PyTorch).  Eval / frozen: running statistics.
 * Channel sums: float within one plane (vectorised by omp simd), double
 * across planes - with N*HW up to ~10^6 elements a float sum over the whole
 * channel would lose the small differences the variance is made of.
 * gamma/beta NULL means affine=False (1 and 0).  With ctx->bn_group (--bn
 * sync) the training statistics and backward sums are the group's
 * (ps_engine.h; bn_group.c combines them): the per-channel work is then
 * split in two loops around the one exchange per call. */
#include "cpu_layers.h"
#include "ps_error.h"
#include "ps_log.h"

#include <math.h>
#include <stdlib.h>

static int bn_valid(const char *what, int N, int C, int HW)
{
    if (N <= 0 || C <= 0 || HW <= 0) {
        ps_error("%s: invalid shape N=%d C=%d HW=%d", what, N, C, HW);
        return 0;
    }
    return 1;
}

/* y = x * scale + shift over channel c's planes: the one place a training
 * forward's output is computed, so bn_forward_saved repeats it bit for bit. */
static void bn_apply_channel(float *out, const float *inp, int N, int C, int HW, int c,
                             float scale, float shift)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + ((size_t)n * C + c) * HW;
        float *y = out + ((size_t)n * C + c) * HW;
#pragma omp simd
        for (int i = 0; i < HW; i++) y[i] = x[i] * scale + shift;
    }
}

/* Channel c's mean and sum of squared deviations (about the mean rounded
 * to float, the value the deviations are taken from). */
static void bn_moments(const float *inp, int N, int C, int HW, int c, double *mean, double *m2)
{
    const size_t M = (size_t)N * HW;
    double s = 0, v = 0;
    for (int n = 0; n < N; n++) {
        const float *x = inp + ((size_t)n * C + c) * HW;
        float sp = 0;
#pragma omp simd reduction(+ : sp)
        for (int i = 0; i < HW; i++) sp += x[i];
        s += sp;
    }
    *mean = s / (double)M;
    const float meanf = (float)*mean;
    for (int n = 0; n < N; n++) {
        const float *x = inp + ((size_t)n * C + c) * HW;
        float vp = 0;
#pragma omp simd reduction(+ : vp)
        for (int i = 0; i < HW; i++) {
            float d = x[i] - meanf;
            vp += d * d;
        }
        v += vp;
    }
    *m2 = v;
}

/* From the batch's count M, channel mean and M2: the saved statistics, the
 * running update (unbiased variance) and the output. */
static void bn_finish_channel(float *out, float *save_mean, float *save_rstd, float *run_mean,
                              float *run_var, const float *inp, const float *gamma,
                              const float *beta, float eps, float momentum, int N, int C, int HW,
                              int c, double M, double mean, double m2)
{
    const double var = m2 / M;
    const float rstd = (float)(1.0 / sqrt(var + eps));
    if (save_mean) save_mean[c] = (float)mean;
    if (save_rstd) save_rstd[c] = rstd;
    if (run_mean) run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * (float)mean;
    if (run_var) {
        double uvar = M > 1 ? m2 / (M - 1) : var;
        run_var[c] = (1.0f - momentum) * run_var[c] + momentum * (float)uvar;
    }
    const float scale = (gamma ? gamma[c] : 1.0f) * rstd;
    const float shift = (beta ? beta[c] : 0.0f) - (float)mean * scale;
    bn_apply_channel(out, inp, N, C, HW, c, scale, shift);
}

/* --bn sync: every channel's moments first, then the group's, then the
 * rest.  Returns 0 when it ran; else the caller runs the local path (no
 * memory for the moments: the group is marked failed). */
static int bn_forward_group(ps_ctx_t *ctx, float *out, float *save_mean, float *save_rstd,
                            float *run_mean, float *run_var, const float *inp,
                            const float *gamma, const float *beta, float eps, float momentum,
                            int N, int C, int HW)
{
    ps_bn_group_t *g = ctx->bn_group;
    double *mean = malloc(2 * sizeof(double) * (size_t)C), *m2 = mean + C;
    if (!mean) {
        ps_error("bn_forward_train: no memory for %d channels' moments", C);
        g->err = PS_ENOMEM;
        return PS_ENOMEM;
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) bn_moments(inp, N, C, HW, c, &mean[c], &m2[c]);
    double M = (double)N * HW;
    ps_bn_group_moments(g, C, &M, mean, m2); /* on failure: this rank's own */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        bn_finish_channel(out, save_mean, save_rstd, run_mean, run_var, inp, gamma, beta, eps,
                          momentum, N, C, HW, c, M, mean[c], m2[c]);
    free(mean);
    return 0;
}

void ps_cpu_bn_forward_train(ps_ctx_t *ctx, float *out, float *save_mean, float *save_rstd,
                             float *run_mean, float *run_var, const float *inp,
                             const float *gamma, const float *beta, float eps, float momentum,
                             int N, int C, int HW)
{
    if (!bn_valid("bn_forward_train", N, C, HW)) return;
    if (ctx && ctx->bn_group &&
        !bn_forward_group(ctx, out, save_mean, save_rstd, run_mean, run_var, inp, gamma, beta,
                          eps, momentum, N, C, HW))
        return;
    const double M = (double)N * HW;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double mean, m2;
        bn_moments(inp, N, C, HW, c, &mean, &m2);
        bn_finish_channel(out, save_mean, save_rstd, run_mean, run_var, inp, gamma, beta, eps,
                          momentum, N, C, HW, c, M, mean, m2);
    }
}

void ps_cpu_bn_forward_saved(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                             const float *beta, const float *save_mean, const float *save_rstd,
                             int N, int C, int HW)
{
    (void)ctx;
    if (!bn_valid("bn_forward_saved", N, C, HW)) return;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        /* bn_finish_channel's expressions on the values it saved */
        const float scale = (gamma ? gamma[c] : 1.0f) * save_rstd[c];
        const float shift = (beta ? beta[c] : 0.0f) - save_mean[c] * scale;
        bn_apply_channel(out, inp, N, C, HW, c, scale, shift);
    }
}

/* Sums of dy and dy*xhat over one channel; xhat = (x - mean) * rstd. */
static void bn_channel_sums(const float *dout, const float *inp, int N, int C, int HW, int c,
                            float mean, float rstd, double *sdy, double *sdyx)
{
    double a = 0, b = 0;
    for (int n = 0; n < N; n++) {
        const float *x = inp + ((size_t)n * C + c) * HW;
        const float *dy = dout + ((size_t)n * C + c) * HW;
        float ap = 0, bp = 0;
#pragma omp simd reduction(+ : ap, bp)
        for (int i = 0; i < HW; i++) {
            ap += dy[i];
            bp += dy[i] * (x[i] - mean);
        }
        a += ap;
        b += bp;
    }
    b *= rstd; /* sum(dy * xhat) = rstd * sum(dy * (x - mean)) */
    *sdy = a;
    *sdyx = b;
}

/* dx = gamma*rstd * (dy - mean(dy) - xhat * mean(dy*xhat)) over channel c,
 * the means over M values whose sums are sdy, sdyx. */
static void bn_dx_channel(float *dinp, const float *dout, const float *inp, const float *gamma,
                          int N, int C, int HW, int c, float mean, float rstd, double M,
                          double sdy, double sdyx)
{
    const float k = (gamma ? gamma[c] : 1.0f) * rstd;
    const float mdy = (float)(sdy / M), mdyx = (float)(sdyx / M);
    for (int n = 0; n < N; n++) {
        const float *x = inp + ((size_t)n * C + c) * HW;
        const float *dy = dout + ((size_t)n * C + c) * HW;
        float *dx = dinp + ((size_t)n * C + c) * HW;
#pragma omp simd
        for (int i = 0; i < HW; i++) dx[i] = k * (dy[i] - mdy - (x[i] - mean) * rstd * mdyx);
    }
}

/* --bn sync: this rank's sums (its own dgamma / dbeta), the group's for
 * dx.  0 when it ran; else the caller runs the local path. */
static int bn_backward_group(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                             const float *dout, const float *inp, const float *gamma,
                             const float *save_mean, const float *save_rstd, int N, int C,
                             int HW)
{
    ps_bn_group_t *g = ctx->bn_group;
    double *a = malloc(2 * sizeof(double) * (size_t)C), *b = a + C;
    if (!a) {
        ps_error("bn_backward_train: no memory for %d channels' sums", C);
        g->err = PS_ENOMEM;
        return PS_ENOMEM;
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        bn_channel_sums(dout, inp, N, C, HW, c, save_mean[c], save_rstd[c], &a[c], &b[c]);
        if (dbeta) dbeta[c] += (float)a[c];
        if (dgamma) dgamma[c] += (float)b[c];
    }
    double M = (double)N * HW;
    ps_bn_group_sums(g, C, &M, a, b); /* on failure: this rank's own */
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int c = 0; c < C; c++)
            bn_dx_channel(dinp, dout, inp, gamma, N, C, HW, c, save_mean[c], save_rstd[c], M,
                          a[c], b[c]);
    }
    free(a);
    return 0;
}

void ps_cpu_bn_backward_train(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                              const float *dout, const float *inp, const float *gamma,
                              const float *save_mean, const float *save_rstd, int N, int C,
                              int HW)
{
    if (!bn_valid("bn_backward_train", N, C, HW)) return;
    if (ctx && ctx->bn_group &&
        !bn_backward_group(ctx, dinp, dgamma, dbeta, dout, inp, gamma, save_mean, save_rstd, N,
                           C, HW))
        return;
    const double M = (double)N * HW;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        const float mean = save_mean[c], rstd = save_rstd[c];
        double sdy, sdyx;
        bn_channel_sums(dout, inp, N, C, HW, c, mean, rstd, &sdy, &sdyx);
        if (dbeta) dbeta[c] += (float)sdy;
        if (dgamma) dgamma[c] += (float)sdyx;
        if (dinp) bn_dx_channel(dinp, dout, inp, gamma, N, C, HW, c, mean, rstd, M, sdy, sdyx);
    }
}

void ps_cpu_bn_forward_eval(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                            const float *beta, const float *run_mean, const float *run_var,
                            float eps, int N, int C, int HW)
{
    (void)ctx;
    if (!bn_valid("bn_forward_eval", N, C, HW)) return;
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            const float rstd = 1.0f / sqrtf(run_var[c] + eps);
            const float scale = (gamma ? gamma[c] : 1.0f) * rstd;
            const float shift = (beta ? beta[c] : 0.0f) - run_mean[c] * scale;
            const float *x = inp + ((size_t)n * C + c) * HW;
            float *y = out + ((size_t)n * C + c) * HW;
#pragma omp simd
            for (int i = 0; i < HW; i++) y[i] = x[i] * scale + shift;
        }
}

void ps_cpu_bn_backward_eval(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                             const float *dout, const float *inp, const float *gamma,
                             const float *run_mean, const float *run_var, float eps, int N,
                             int C, int HW)
{
    (void)ctx;
    if (!bn_valid("bn_backward_eval", N, C, HW)) return;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        const float rstd = 1.0f / sqrtf(run_var[c] + eps);
        if (dgamma || dbeta) {
            double sdy, sdyx;
            bn_channel_sums(dout, inp, N, C, HW, c, run_mean[c], rstd, &sdy, &sdyx);
            if (dbeta) dbeta[c] += (float)sdy;
            if (dgamma) dgamma[c] += (float)sdyx;
        }
        if (!dinp) continue;
        const float k = (gamma ? gamma[c] : 1.0f) * rstd;
        for (int n = 0; n < N; n++) {
            const float *dy = dout + ((size_t)n * C + c) * HW;
            float *dx = dinp + ((size_t)n * C + c) * HW;
#pragma omp simd
            for (int i = 0; i < HW; i++) dx[i] = k * dy[i];
        }
    }
}

/* ---- eval batchnorm fused with the relu after it --------------------------
 * TSM's partial BN leaves every BN but the first in eval mode, and in a
 * ResNet nearly each is followed by a relu: one pass instead of two saves
 * a read and a write of the activation (relu was ~3-4% of a step). */

void ps_cpu_bn_relu_forward_eval(ps_ctx_t *ctx, float *out, const float *inp,
                                 const float *gamma, const float *beta, const float *run_mean,
                                 const float *run_var, float eps, int N, int C, int HW)
{
    (void)ctx;
    if (!bn_valid("bn_relu_forward_eval", N, C, HW)) return;
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            const float rstd = 1.0f / sqrtf(run_var[c] + eps);
            const float scale = (gamma ? gamma[c] : 1.0f) * rstd;
            const float shift = (beta ? beta[c] : 0.0f) - run_mean[c] * scale;
            const float *x = inp + ((size_t)n * C + c) * HW;
            float *y = out + ((size_t)n * C + c) * HW;
#pragma omp simd
            for (int i = 0; i < HW; i++) {
                const float v = x[i] * scale + shift;
                y[i] = v < 0.0f ? 0.0f : v; /* as relu_forward: NaN stays NaN */
            }
        }
}

void ps_cpu_bn_relu_backward_eval(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                                  const float *dout, const float *out, const float *inp,
                                  const float *gamma, const float *run_mean,
                                  const float *run_var, float eps, int N, int C, int HW)
{
    (void)ctx;
    if (!bn_valid("bn_relu_backward_eval", N, C, HW)) return;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        const float rstd = 1.0f / sqrtf(run_var[c] + eps), mean = run_mean[c];
        if (dgamma || dbeta) {
            /* bn_channel_sums over the relu-masked gradient */
            double a = 0, b = 0;
            for (int n = 0; n < N; n++) {
                const size_t o = ((size_t)n * C + c) * HW;
                const float *x = inp + o, *dy = dout + o, *y = out + o;
                float ap = 0, bp = 0;
#pragma omp simd reduction(+ : ap, bp)
                for (int i = 0; i < HW; i++) {
                    const float g = y[i] > 0.0f ? dy[i] : 0.0f;
                    ap += g;
                    bp += g * (x[i] - mean);
                }
                a += ap;
                b += bp;
            }
            b *= rstd;
            if (dbeta) dbeta[c] += (float)a;
            if (dgamma) dgamma[c] += (float)b;
        }
        if (!dinp) continue;
        const float k = (gamma ? gamma[c] : 1.0f) * rstd;
        for (int n = 0; n < N; n++) {
            const size_t o = ((size_t)n * C + c) * HW;
            const float *dy = dout + o, *y = out + o;
            float *dx = dinp + o;
#pragma omp simd
            for (int i = 0; i < HW; i++) dx[i] = y[i] > 0.0f ? k * dy[i] : 0.0f;
        }
    }
}
