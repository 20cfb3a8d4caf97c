/* Sigmoid focal loss on the CPU, and the positive count that normalises it
 * (contracts in ps_engine.h).  Sums and gradients in double, rounded to
 * float once: the CUDA kernels compute the same formulas. */
#include "cpu_layers.h"

#include <math.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

int ps_cpu_count_pos(ps_ctx_t *ctx, const int32_t *labels, int A)
{
    int n = 0;
    for (int a = 0; a < A; a++) n += labels[a] >= 1;
    return n;
}

/* softplus(x) = log(1 + e^x), stable for any x */
static double softplus(double x)
{
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

static int check_labels(const int32_t *labels, int A, int K, const char *who)
{
    for (int a = 0; a < A; a++)
        if (labels[a] < -1 || labels[a] > K) {
            ps_error("%s: label %d of anchor %d outside -1..%d", who, labels[a], a, K);
            return PS_EINVAL;
        }
    return 0;
}

int ps_cpu_focal_forward(ps_ctx_t *ctx, float *loss, const float *logits,
                         const int32_t *labels, float alpha, float gamma, float normaliser,
                         int A, int K)
{
    if (check_labels(labels, A, K, "focal loss")) {
        *loss = NAN;
        return PS_EINVAL;
    }
    double sum = 0;
    for (int a = 0; a < A; a++) {
        if (labels[a] < 0) continue;
        const float *x = logits + (long)a * K;
        for (int k = 0; k < K; k++) {
            double v = x[k], p = 1.0 / (1.0 + exp(-v));
            /* log p = -softplus(-x), log(1-p) = -softplus(x) */
            if (labels[a] == k + 1)
                sum += alpha * pow(1.0 - p, gamma) * softplus(-v);
            else
                sum += (1.0 - alpha) * pow(p, gamma) * softplus(v);
        }
    }
    *loss = (float)(sum / normaliser);
    return 0;
}

int ps_cpu_focal_backward(ps_ctx_t *ctx, float *dlogits, const float *logits,
                          const int32_t *labels, float dloss, float alpha, float gamma,
                          float normaliser, int A, int K)
{
    if (check_labels(labels, A, K, "focal loss backward")) return PS_EINVAL;
    double scale = (double)dloss / normaliser;
    for (int a = 0; a < A; a++) {
        const float *x = logits + (long)a * K;
        float *dx = dlogits + (long)a * K;
        if (labels[a] < 0) {
            memset(dx, 0, (size_t)K * sizeof(float));
            continue;
        }
        for (int k = 0; k < K; k++) {
            double v = x[k], p = 1.0 / (1.0 + exp(-v)), q = 1.0 / (1.0 + exp(v)); /* q = 1-p */
            double g;
            if (labels[a] == k + 1) /* d/dx[-a (1-p)^g log p] = a (1-p)^g (g p log p - (1-p)) */
                g = alpha * pow(q, gamma) * (gamma * p * -softplus(-v) - q);
            else /* d/dx[-(1-a) p^g log(1-p)] = (1-a) p^g (p - g (1-p) log(1-p)) */
                g = (1.0 - alpha) * pow(p, gamma) * (p + gamma * q * softplus(v));
            dx[k] = (float)(g * scale);
        }
    }
    return 0;
}
