/* Inverted dropout: keep an element when ps_rng_uniform(seed, i) >= p and
 * scale it by 1/(1-p), so evaluation needs no rescaling.  The mask is a pure
 * function of (seed, index), hence the same on any thread layout or device. */
#include "cpu_layers.h"
#include "ps_log.h"

static int p_valid(float p)
{
    if (!(p >= 0.0f && p <= 1.0f)) {
        ps_error("dropout: probability %g outside [0, 1]", (double)p);
        return 0;
    }
    return 1;
}

void ps_cpu_dropout_forward(ps_ctx_t *ctx, float *out, uint8_t *mask, const float *inp,
                            size_t n, float p, uint64_t seed)
{
    (void)ctx;
    if (!p_valid(p)) return;
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const uint8_t keep = ps_rng_uniform(seed, i) >= p;
        mask[i] = keep;
        out[i] = keep ? inp[i] * scale : 0.0f;
    }
}

void ps_cpu_dropout_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                             const uint8_t *mask, size_t n, float p)
{
    (void)ctx;
    if (!dinp || !p_valid(p)) return;
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = mask[i] ? dout[i] * scale : 0.0f;
}
