/* batchnorm2d on the CPU, (N, C, HW) tensors, one channel per loop trip.
 * Train: batch statistics (biased variance to normalise, unbiased for the
 * running update, as PyTorch).  Eval / frozen: running statistics.
 * Channel sums: float within one plane (vectorised by omp simd), double
 * across planes - with N*HW up to ~10^6 elements a float sum over the whole
 * channel would lose the small differences the variance is made of.
 * gamma/beta NULL means affine=False (1 and 0). */
#include "cpu_layers.h"
#include "ps_log.h"

#include <math.h>

static int bn_valid(const char *what, int N, int C, int HW)
{
    if (N <= 0 || C <= 0 || HW <= 0) {
        ps_error("%s: invalid shape N=%d C=%d HW=%d", what, N, C, HW);
        return 0;
    }
    return 1;
}

void ps_cpu_bn_forward_train(ps_ctx_t *ctx, float *out, float *save_mean, float *save_rstd,
                             float *run_mean, float *run_var, const float *inp,
                             const float *gamma, const float *beta, float eps, float momentum,
                             int N, int C, int HW)
{
    (void)ctx;
    if (!bn_valid("bn_forward_train", N, C, HW)) return;
    const size_t M = (size_t)N * HW;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double s = 0, v = 0;
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            float sp = 0;
#pragma omp simd reduction(+ : sp)
            for (int i = 0; i < HW; i++) sp += x[i];
            s += sp;
        }
        const double mean = s / (double)M;
        const float meanf = (float)mean;
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
        const double var = v / (double)M;
        const float rstd = (float)(1.0 / sqrt(var + eps));
        if (save_mean) save_mean[c] = (float)mean;
        if (save_rstd) save_rstd[c] = rstd;
        if (run_mean) run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * (float)mean;
        if (run_var) {
            double uvar = M > 1 ? v / (double)(M - 1) : var;
            run_var[c] = (1.0f - momentum) * run_var[c] + momentum * (float)uvar;
        }
        const float scale = (gamma ? gamma[c] : 1.0f) * rstd;
        const float shift = (beta ? beta[c] : 0.0f) - (float)mean * scale;
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            float *y = out + ((size_t)n * C + c) * HW;
#pragma omp simd
            for (int i = 0; i < HW; i++) y[i] = x[i] * scale + shift;
        }
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

void ps_cpu_bn_backward_train(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                              const float *dout, const float *inp, const float *gamma,
                              const float *save_mean, const float *save_rstd, int N, int C,
                              int HW)
{
    (void)ctx;
    if (!bn_valid("bn_backward_train", N, C, HW)) return;
    const double M = (double)N * HW;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        const float mean = save_mean[c], rstd = save_rstd[c];
        double sdy, sdyx;
        bn_channel_sums(dout, inp, N, C, HW, c, mean, rstd, &sdy, &sdyx);
        if (dbeta) dbeta[c] += (float)sdy;
        if (dgamma) dgamma[c] += (float)sdyx;
        if (!dinp) continue;
        /* dx = gamma*rstd * (dy - mean(dy) - xhat * mean(dy*xhat)) */
        const float k = (gamma ? gamma[c] : 1.0f) * rstd;
        const float mdy = (float)(sdy / M), mdyx = (float)(sdyx / M);
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            const float *dy = dout + ((size_t)n * C + c) * HW;
            float *dx = dinp + ((size_t)n * C + c) * HW;
#pragma omp simd
            for (int i = 0; i < HW; i++)
                dx[i] = k * (dy[i] - mdy - (x[i] - mean) * rstd * mdyx);
        }
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
