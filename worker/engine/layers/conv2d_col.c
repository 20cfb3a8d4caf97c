/* im2col / col2im: lay out each receptive field of a convolution as a
 * column, so the convolution becomes one GEMM (W (K x C*R*S) times
 * col (C*R*S x P*Q)).  Rows are (c, r, s) with s fastest, matching the
 * weight layout (K, C/groups, R, S); columns are (image, p, q).  The
 * P x Q block of one row and one image (ps_cpu_col_plane) is shared with
 * vol2col (conv3d_col.c), whose rows add a kernel frame. */
#include "cpu_layers.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

void ps_cpu_col_qrange(int w0, int sw, int W, int Q, int *qlo, int *qhi)
{
    int lo = w0 < 0 ? (-w0 + sw - 1) / sw : 0;
    int hi = W - w0 <= 0 ? 0 : (W - w0 - 1) / sw + 1;
    if (hi > Q) hi = Q;
    if (lo > hi) lo = hi;
    *qlo = lo, *qhi = hi;
}

void ps_cpu_col_plane(float *dst, const float *xp, int H, int W, int P, int Q, int h0, int sh,
                      int w0, int sw)
{
    int qlo, qhi;
    ps_cpu_col_qrange(w0, sw, W, Q, &qlo, &qhi);
    for (int p = 0; p < P; p++, dst += Q) {
        const int h = p * sh + h0;
        if (h < 0 || h >= H) {
            memset(dst, 0, (size_t)Q * sizeof(float));
            continue;
        }
        /* index with w0 added per element: a pointer before the row start
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

void ps_cpu_col_plane_add(float *xp, const float *src, int H, int W, int P, int Q, int h0, int sh,
                          int w0, int sw)
{
    int qlo, qhi;
    ps_cpu_col_qrange(w0, sw, W, Q, &qlo, &qhi);
    for (int p = 0; p < P; p++, src += Q) {
        const int h = p * sh + h0;
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
        float *dst = col + (size_t)row * cols;
        for (int i = 0; i < nc; i++, dst += PQ)
            ps_cpu_col_plane(dst, x + (size_t)i * img_stride + (size_t)c * HW, H, W, P, Q,
                             r * d->dil_h - d->pad_h, d->stride_h, s * d->dil_w - d->pad_w,
                             d->stride_w);
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
                ps_cpu_col_plane_add(xp, col + (size_t)row * cols + (size_t)i * PQ, H, W, P, Q,
                                     r * d->dil_h - d->pad_h, d->stride_h,
                                     s * d->dil_w - d->pad_w, d->stride_w);
            }
    }
}
