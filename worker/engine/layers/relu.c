/* relu on the CPU.  Backward reads the forward OUTPUT (out > 0 iff inp > 0),
 * so the input can be overwritten in place by the forward pass.
 * 'simd': the loops must compile to blends, not branches - on random signs
 * a branch mispredicts half the time (measured 4x slower); and out may alias
 * inp, which keeps the compiler from vectorising at -O2 on its own. */
#include "cpu_layers.h"

void ps_cpu_relu_forward(ps_ctx_t *ctx, float *out, const float *inp, size_t n)
{
    (void)ctx;
    /* x < 0 ? 0 : x keeps a NaN as NaN, like PyTorch */
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] < 0.0f ? 0.0f : inp[i];
}

void ps_cpu_relu_backward(ps_ctx_t *ctx, float *dinp, const float *dout, const float *out,
                          size_t n)
{
    (void)ctx;
    if (!dinp) return;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}
