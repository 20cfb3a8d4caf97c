/* relu on the CPU.  Backward reads the forward OUTPUT (out > 0 iff inp > 0),
 * so the input can be overwritten in place by the forward pass. */
#include "cpu_layers.h"

void ps_cpu_relu_forward(ps_ctx_t *ctx, float *out, const float *inp, size_t n)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void ps_cpu_relu_backward(ps_ctx_t *ctx, float *dinp, const float *dout, const float *out,
                          size_t n)
{
    (void)ctx;
    if (!dinp) return;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}
