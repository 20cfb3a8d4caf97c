/* What the CPU convolutions (conv2d.c, conv3d.c, conv_select.c) share:
 * the team a call may use, the bias gradient and the reduction of
 * per-thread weight gradients. */
#include "cpu_layers.h"

#ifdef _OPENMP
#include <omp.h>
#endif

int ps_cpu_team_threads(void)
{
#ifdef _OPENMP
    return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
    return 1;
#endif
}

void ps_cpu_conv_bias_grad(float *db, const float *dout, int N, int K, size_t PQ)
{
    /* float within one plane (vectorised), double across planes */
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
    for (int k = 0; k < K; k++) {
        double s = 0;
        for (int n = 0; n < N; n++) {
            const float *o = dout + ((size_t)n * K + k) * PQ;
            float sp = 0;
#pragma omp simd reduction(+ : sp)
            for (size_t i = 0; i < PQ; i++) sp += o[i];
            s += sp;
        }
        db[k] += (float)s;
    }
}

void ps_cpu_sum_partials(float *dw, const float *red, size_t nw, int nth)
{
#pragma omp for schedule(static)
    for (size_t i = 0; i < nw; i++) {
        float s = dw[i];
        for (int u = 1; u < nth; u++) s += red[nw * (u - 1) + i];
        dw[i] = s;
    }
}
