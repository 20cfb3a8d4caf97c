/* Softmax cross-entropy with integer labels, mean over the batch.
 * Stable: probabilities from x - max(x), and the loss from
 * log-sum-exp - x[label] rather than -log(prob), which would turn a tiny
 * probability into log(0) = -inf. */
#include "cpu_layers.h"
#include "ps_log.h"

#include <math.h>

float ps_cpu_xent_forward(ps_ctx_t *ctx, float *probs, const float *logits,
                          const int32_t *labels, int N, int K)
{
    (void)ctx;
    if (N <= 0 || K <= 0) {
        ps_error("xent: invalid shape N=%d K=%d", N, K);
        return NAN;
    }
    double loss = 0;
    int bad = -1;
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * K;
        float *pr = probs + (size_t)n * K;
        float m = x[0];
        for (int k = 1; k < K; k++) m = x[k] > m ? x[k] : m;
        double s = 0;
        for (int k = 0; k < K; k++) {
            pr[k] = expf(x[k] - m);
            s += pr[k];
        }
        const float inv = (float)(1.0 / s);
        for (int k = 0; k < K; k++) pr[k] *= inv;
        if (labels[n] < 0 || labels[n] >= K) {
            if (bad < 0) bad = n;
            continue;
        }
        loss += (double)m + log(s) - x[labels[n]];
    }
    if (bad >= 0) {
        ps_error("xent: label %d of sample %d outside [0, %d)", (int)labels[bad], bad, K);
        return NAN;
    }
    return (float)(loss / N);
}

void ps_cpu_xent_backward(ps_ctx_t *ctx, float *dlogits, const float *probs,
                          const int32_t *labels, float dloss, int N, int K)
{
    (void)ctx;
    if (!dlogits || N <= 0 || K <= 0) return;
    const float g = dloss / (float)N;
    for (int n = 0; n < N; n++) {
        const float *pr = probs + (size_t)n * K;
        float *dx = dlogits + (size_t)n * K;
        for (int k = 0; k < K; k++) dx[k] = pr[k] * g;
        /* a bad label was reported by forward; leave its row without the one-hot */
        if (labels[n] >= 0 && labels[n] < K) dx[labels[n]] -= g;
    }
}
