/* vol2col / col2vol: lay out each receptive field of a 3-D convolution as
 * a column, so the convolution becomes one GEMM (W (Kg x Cg*KT*R*S) times
 * col (Cg*KT*R*S x columns)).  Rows are (c, kt, r, s) with s fastest,
 * matching the weight layout (K, C/groups, KT, R, S); columns are the
 * output positions (o, p, q) of output frames [o0, o1), so a caller can
 * cut a large clip into frame ranges that bound the column buffer.  Each
 * output frame's P x Q block is im2col's (ps_cpu_col_plane) on the input
 * frame the kernel frame kt reads, or zeros in the temporal padding. */
#include "cpu_layers.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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
        float *dst = col + (size_t)row * ncols;
        for (int o = o0; o < o1; o++, dst += PQ) {
            const int t = o * d->stride_t - d->pad_t + kt * d->dil_t;
            if (t < 0 || t >= D)
                memset(dst, 0, PQ * sizeof(float));
            else
                ps_cpu_col_plane(dst, x + ((size_t)c * D + t) * HW, H, W, P, Q,
                                 r * d->dil_h - d->pad_h, d->stride_h, s * d->dil_w - d->pad_w,
                                 d->stride_w);
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
                    const float *src = col + (size_t)(((c * KT + kt) * R + r) * S + s) * ncols;
                    for (int o = o0; o < o1; o++, src += PQ) {
                        const int t = o * d->stride_t - d->pad_t + kt * d->dil_t;
                        if (t < 0 || t >= D) continue;
                        ps_cpu_col_plane_add(xc + (size_t)t * HW, src, H, W, P, Q,
                                             r * d->dil_h - d->pad_h, d->stride_h,
                                             s * d->dil_w - d->pad_w, d->stride_w);
                    }
                }
    }
}
