/* im2col / col2im: lay out each receptive field of a convolution as a
 * column, so the convolution becomes one GEMM (W (K x C*R*S) times
 * col (C*R*S x P*Q)).  Rows are (c, r, s) with s fastest, matching the
 * weight layout (K, C/groups, R, S); columns are (image, p, q). */
#include "cpu_layers.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

void ps_cpu_im2col(float *col, const float *x, size_t img_stride, int nc, int Cg, int H,
                   int W, const ps_conv2d_desc_t *d, int P, int Q)
{
    const int R = d->R, S = d->S, rows = Cg * R * S;
    const size_t PQ = (size_t)P * Q, cols = (size_t)nc * PQ, HW = (size_t)H * W;
    /* rows are independent and write disjoint memory; dynamic chunks keep
     * both threads busy even if one is preempted */
/* inside conv2d's per-chunk threads: run on the calling thread */
#pragma omp parallel for schedule(dynamic, 4) if (!omp_in_parallel())
    for (int row = 0; row < rows; row++) {
        const int c = row / (R * S), r = (row / S) % R, s = row % S;
        const int w0 = s * d->dil_w - d->pad_w, sw = d->stride_w;
        /* q range whose input column w = q*sw + w0 lies inside [0, W) */
        int qlo = w0 < 0 ? (-w0 + sw - 1) / sw : 0;
        int qhi = W - w0 <= 0 ? 0 : (W - w0 - 1) / sw + 1;
        if (qhi > Q) qhi = Q;
        if (qlo > qhi) qlo = qhi;
        float *dst = col + (size_t)row * cols;
        for (int i = 0; i < nc; i++) {
            const float *xp = x + (size_t)i * img_stride + (size_t)c * HW;
            for (int p = 0; p < P; p++, dst += Q) {
                const int h = p * d->stride_h - d->pad_h + r * d->dil_h;
                if (h < 0 || h >= H) {
                    memset(dst, 0, (size_t)Q * sizeof(float));
                    continue;
                }
                /* index with w0 added per element: a pointer before the
                 * row start would be undefined behaviour */
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

void ps_cpu_col2im(float *dx, const float *col, size_t img_stride, int nc, int Cg, int H,
                   int W, const ps_conv2d_desc_t *d, int P, int Q)
{
    const int R = d->R, S = d->S;
    const size_t PQ = (size_t)P * Q, cols = (size_t)nc * PQ, HW = (size_t)H * W;
    /* Each (image, channel) plane of dx is written by exactly one thread
     * (all its R*S rows), so the scatter-add needs no atomics. */
#pragma omp parallel for schedule(dynamic, 1) if (!omp_in_parallel())
    for (int ic = 0; ic < nc * Cg; ic++) {
        const int i = ic / Cg, c = ic % Cg;
        float *xp = dx + (size_t)i * img_stride + (size_t)c * HW;
        for (int r = 0; r < R; r++)
            for (int s = 0; s < S; s++) {
                const int row = (c * R + r) * S + s;
                const int w0 = s * d->dil_w - d->pad_w, sw = d->stride_w;
                int qlo = w0 < 0 ? (-w0 + sw - 1) / sw : 0;
                int qhi = W - w0 <= 0 ? 0 : (W - w0 - 1) / sw + 1;
                if (qhi > Q) qhi = Q;
                if (qlo > qhi) qlo = qhi;
                const float *src = col + (size_t)row * cols + (size_t)i * PQ;
                for (int p = 0; p < P; p++, src += Q) {
                    const int h = p * d->stride_h - d->pad_h + r * d->dil_h;
                    if (h < 0 || h >= H) continue;
                    float *xr = xp + (size_t)h * W;
                    if (sw == 1) {
#pragma omp simd
                        for (int q = qlo; q < qhi; q++) xr[q + w0] += src[q];
                    } else {
                        for (int q = qlo; q < qhi; q++) xr[q * sw + w0] += src[q];
                    }
                }
            }
    }
}
