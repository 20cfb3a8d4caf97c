/* vol2col / col2vol: lay out each receptive field of a 3-D convolution as
 * a column, so the convolution becomes one GEMM (W (Kg x Cg*KT*R*S) times
 * col (Cg*KT*R*S x columns)).  Rows are (c, kt, r, s) with s fastest,
 * matching the weight layout (K, C/groups, KT, R, S); columns are the
 * output positions (o, p, q) of output frames [o0, o1), so a caller can
 * cut a large clip into frame ranges that bound the column buffer. */
#include "cpu_layers.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The q range [*qlo, *qhi) whose input column q*stride + w0 lies in [0, W). */
static void q_range(int w0, int sw, int W, int Q, int *qlo, int *qhi)
{
    int lo = w0 < 0 ? (-w0 + sw - 1) / sw : 0;
    int hi = W - w0 <= 0 ? 0 : (W - w0 - 1) / sw + 1;
    if (hi > Q) hi = Q;
    if (lo > hi) lo = hi;
    *qlo = lo, *qhi = hi;
}

void ps_cpu_vol2col(float *col, const float *x, int Cg, int D, int H, int W,
                    const ps_conv3d_desc_t *d, int P, int Q, int o0, int o1)
{
    const int KT = d->KT, R = d->R, S = d->S, rows = Cg * KT * R * S;
    const size_t PQ = (size_t)P * Q, ncols = (size_t)(o1 - o0) * PQ, HW = (size_t)H * W;
/* inside conv3d's per-clip threads: run on the calling thread */
#pragma omp parallel for schedule(dynamic, 4) if (!omp_in_parallel())
    for (int row = 0; row < rows; row++) {
        const int c = row / (KT * R * S), kt = (row / (R * S)) % KT;
        const int r = (row / S) % R, s = row % S;
        const int w0 = s * d->dil_w - d->pad_w, sw = d->stride_w;
        int qlo, qhi;
        q_range(w0, sw, W, Q, &qlo, &qhi);
        float *dst = col + (size_t)row * ncols;
        for (int o = o0; o < o1; o++) {
            const int t = o * d->stride_t - d->pad_t + kt * d->dil_t;
            if (t < 0 || t >= D) {
                memset(dst, 0, PQ * sizeof(float));
                dst += PQ;
                continue;
            }
            const float *xp = x + ((size_t)c * D + t) * HW;
            for (int p = 0; p < P; p++, dst += Q) {
                const int h = p * d->stride_h - d->pad_h + r * d->dil_h;
                if (h < 0 || h >= H) {
                    memset(dst, 0, (size_t)Q * sizeof(float));
                    continue;
                }
                /* w0 added per element: a pointer before the row start
                 * would be undefined behaviour */
                const float *xr = xp + (size_t)h * W;
                for (int q = 0; q < qlo; q++) dst[q] = 0.0f;
                if (sw == 1) {
                    memcpy(dst + qlo, xr + qlo + w0, (size_t)(qhi - qlo) * sizeof(float));
                } else {
                    for (int q = qlo; q < qhi; q++) dst[q] = xr[q * sw + w0];
                }
                for (int q = qhi; q < Q; q++) dst[q] = 0.0f;
            }
        }
    }
}

void ps_cpu_col2vol(float *dx, const float *col, int Cg, int D, int H, int W,
                    const ps_conv3d_desc_t *d, int P, int Q, int o0, int o1)
{
    const int KT = d->KT, R = d->R, S = d->S;
    const size_t PQ = (size_t)P * Q, ncols = (size_t)(o1 - o0) * PQ, HW = (size_t)H * W;
    /* each channel block of dx is written by one thread (all its KT*R*S
     * rows), so the scatter-add needs no atomics */
#pragma omp parallel for schedule(dynamic, 1) if (!omp_in_parallel())
    for (int c = 0; c < Cg; c++) {
        float *xc = dx + (size_t)c * D * HW;
        for (int kt = 0; kt < KT; kt++)
            for (int r = 0; r < R; r++)
                for (int s = 0; s < S; s++) {
                    const int row = ((c * KT + kt) * R + r) * S + s;
                    const int w0 = s * d->dil_w - d->pad_w, sw = d->stride_w;
                    int qlo, qhi;
                    q_range(w0, sw, W, Q, &qlo, &qhi);
                    const float *src = col + (size_t)row * ncols;
                    for (int o = o0; o < o1; o++, src += PQ) {
                        const int t = o * d->stride_t - d->pad_t + kt * d->dil_t;
                        if (t < 0 || t >= D) continue;
                        float *xp = xc + (size_t)t * HW;
                        const float *sp = src;
                        for (int p = 0; p < P; p++, sp += Q) {
                            const int h = p * d->stride_h - d->pad_h + r * d->dil_h;
                            if (h < 0 || h >= H) continue;
                            float *xr = xp + (size_t)h * W;
                            if (sw == 1) {
#pragma omp simd
                                for (int q = qlo; q < qhi; q++) xr[q + w0] += sp[q];
                            } else {
                                for (int q = qlo; q < qhi; q++) xr[q * sw + w0] += sp[q];
                            }
                        }
                    }
                }
    }
}
