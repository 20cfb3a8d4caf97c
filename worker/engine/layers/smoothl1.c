/* Smooth-L1 on the positive anchors' box deltas, on the CPU (contract in
 * ps_engine.h); the sum in double, rounded to float once. */
#include "cpu_layers.h"

#include <math.h>

void ps_cpu_smoothl1_forward(ps_ctx_t *ctx, float *loss, const float *pred,
                             const float *target, const int32_t *labels, float beta,
                             float normaliser, int A)
{
    double sum = 0;
    for (int a = 0; a < A; a++) {
        if (labels[a] < 1) continue;
        for (int j = 0; j < 4; j++) {
            double d = fabs((double)pred[a * 4 + j] - target[a * 4 + j]);
            sum += d < beta ? 0.5 * d * d / beta : d - 0.5 * beta;
        }
    }
    *loss = (float)(sum / normaliser);
}

void ps_cpu_smoothl1_backward(ps_ctx_t *ctx, float *dpred, const float *pred,
                              const float *target, const int32_t *labels, float dloss,
                              float beta, float normaliser, int A)
{
    double scale = (double)dloss / normaliser;
    for (int a = 0; a < A; a++)
        for (int j = 0; j < 4; j++) {
            long i = (long)a * 4 + j;
            if (labels[a] < 1) {
                dpred[i] = 0;
                continue;
            }
            double d = (double)pred[i] - target[i];
            double g = fabs(d) < beta ? d / beta : (d > 0 ? 1.0 : -1.0);
            dpred[i] = (float)(g * scale);
        }
}
