/* Mask R-CNN's mask loss on the CPU (contract in ps_engine.h): binary
 * cross-entropy with logits on each row's target channel only
 * (torchvision's maskrcnn_loss: mask_logits[arange(R), labels]), summed
 * in double and divided by the normaliser once. */
#include "cpu_layers.h"

#include <math.h>

#include "ps_error.h"
#include "ps_log.h"

static int bad_label(const char *who, const int32_t *labels, int R, int K)
{
    for (int r = 0; r < R; r++)
        if (labels[r] < 0 || labels[r] >= K) {
            ps_error("%s: label %d of row %d outside 0..%d", who, labels[r], r, K - 1);
            return 1;
        }
    return 0;
}

/* max(x, 0) - x t + log(1 + exp(-|x|)): torch's stable form */
static double bce(double x, double t) { return (x > 0 ? x : 0) - x * t + log1p(exp(-fabs(x))); }

int ps_cpu_mask_bce_forward(ps_ctx_t *ctx, float *loss, const float *logits,
                            const int32_t *labels, const float *targets, float normaliser, int R,
                            int K, int MM)
{
    (void)ctx;
    if (R < 0 || K < 1 || MM < 1 || bad_label("mask loss", labels, R, K)) {
        *loss = NAN;
        return PS_EINVAL;
    }
    double sum = 0;
    for (int r = 0; r < R; r++) {
        const float *x = logits + ((size_t)r * K + labels[r]) * MM;
        const float *t = targets + (size_t)r * MM;
        for (int p = 0; p < MM; p++) sum += bce(x[p], t[p]);
    }
    *loss = R ? (float)(sum / normaliser) : 0.0f;
    return 0;
}

int ps_cpu_mask_bce_backward(ps_ctx_t *ctx, float *dlogits, const float *logits,
                             const int32_t *labels, const float *targets, float dloss,
                             float normaliser, int R, int K, int MM)
{
    (void)ctx;
    if (R < 0 || K < 1 || MM < 1 || bad_label("mask loss backward", labels, R, K))
        return PS_EINVAL;
    double scale = (double)dloss / normaliser;
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) {
            size_t o = ((size_t)r * K + k) * MM;
            for (int p = 0; p < MM; p++) {
                if (k != labels[r]) {
                    dlogits[o + p] = 0;
                    continue;
                }
                double x = logits[o + p];
                double sig = x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
                dlogits[o + p] = (float)((sig - targets[(size_t)r * MM + p]) * scale);
            }
        }
    return 0;
}
