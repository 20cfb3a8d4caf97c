/* Residual add, gradient accumulation and scaling (element-wise, may alias: 'simd'
 * tells the compiler the aliasing is harmless so it vectorises). */
#include "cpu_layers.h"

void ps_cpu_add(ps_ctx_t *ctx, float *out, const float *a, const float *b, size_t n)
{
    (void)ctx;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void ps_cpu_accumulate(ps_ctx_t *ctx, float *acc, const float *x, size_t n)
{
    (void)ctx;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

void ps_cpu_scale(ps_ctx_t *ctx, float *x, float alpha, size_t n)
{
    (void)ctx;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= alpha;
}
