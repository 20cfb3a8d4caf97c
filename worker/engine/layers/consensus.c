/* TSN segment consensus: the clip's logits are the mean of its T frames'. */
#include "cpu_layers.h"

void ps_cpu_consensus_forward(ps_ctx_t *ctx, float *out, const float *inp, int B, int T,
                              int K)
{
    (void)ctx;
    if (B <= 0 || T <= 0 || K <= 0) return;
    const float inv = 1.0f / (float)T;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < K; k++) {
            float s = 0;
            for (int t = 0; t < T; t++) s += inp[((size_t)b * T + t) * K + k];
            out[(size_t)b * K + k] = s * inv;
        }
}

void ps_cpu_consensus_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T,
                               int K)
{
    (void)ctx;
    if (!dinp || B <= 0 || T <= 0 || K <= 0) return;
    const float inv = 1.0f / (float)T;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                dinp[((size_t)b * T + t) * K + k] = dout[(size_t)b * K + k] * inv;
}
