/* The detection heads' output permute on the CPU: conv channels (nA*D)
 * to anchor-major rows (H*W*nA, D), and back (contract in ps_engine.h). */
#include "cpu_layers.h"

void ps_cpu_head_permute_forward(ps_ctx_t *ctx, float *out, const float *inp, int nA, int D,
                                 int H, int W)
{
    long HW = (long)H * W;
    for (int a = 0; a < nA; a++)
        for (int d = 0; d < D; d++) {
            const float *src = inp + ((long)a * D + d) * HW;
            for (long s = 0; s < HW; s++) out[(s * nA + a) * D + d] = src[s];
        }
}

void ps_cpu_head_permute_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int nA,
                                  int D, int H, int W)
{
    long HW = (long)H * W;
    for (int a = 0; a < nA; a++)
        for (int d = 0; d < D; d++) {
            float *dst = dinp + ((long)a * D + d) * HW;
            for (long s = 0; s < HW; s++) dst[s] = dout[(s * nA + a) * D + d];
        }
}
