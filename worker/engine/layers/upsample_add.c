/* FPN top-down merge on the CPU: lateral + nearest upsample of the coarser
 * map (contract in ps_engine.h).  Backward scatters each output pixel's
 * gradient onto its source, rows then columns, float adds from 0: the
 * order the CUDA kernel's gather reproduces bit for bit. */
#include "cpu_layers.h"

#include <math.h>
#include <string.h>

#include "ps_util.h"

void ps_cpu_upsample_add_forward(ps_ctx_t *ctx, float *out, const float *lateral,
                                 const float *top, int N, int C, int H, int W, int P, int Q)
{
    for (long nc = 0; nc < (long)N * C; nc++) {
        const float *t = top + nc * H * W;
        const float *l = lateral + nc * P * Q;
        float *o = out + nc * P * Q;
        for (int p = 0; p < P; p++) {
            const float *trow = t + (long)ps_nearest_src(p, H, P) * W;
            for (int q = 0; q < Q; q++)
                o[p * Q + q] = l[p * Q + q] + trow[ps_nearest_src(q, W, Q)];
        }
    }
}

void ps_cpu_upsample_add_backward(ps_ctx_t *ctx, float *dlateral, float *dtop,
                                  const float *dout, int N, int C, int H, int W, int P, int Q)
{
    size_t nlat = (size_t)N * C * P * Q;
    if (dlateral && dlateral != dout) memcpy(dlateral, dout, nlat * sizeof(float));
    if (!dtop) return;
    memset(dtop, 0, (size_t)N * C * H * W * sizeof(float));
    for (long nc = 0; nc < (long)N * C; nc++) {
        float *t = dtop + nc * H * W;
        const float *g = dout + nc * P * Q;
        for (int p = 0; p < P; p++) {
            float *trow = t + (long)ps_nearest_src(p, H, P) * W;
            for (int q = 0; q < Q; q++) trow[ps_nearest_src(q, W, Q)] += g[p * Q + q];
        }
    }
}
