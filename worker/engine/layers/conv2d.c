/* conv2d on the CPU: im2col + OpenBLAS sgemm, per group.
 *
 * Legend: N images, C in / K out channels, G groups (Cg = C/G, Kg = K/G),
 * H,W input and P,Q output plane, R,S kernel; CRS = Cg*R*S.
 *
 * Two ways to feed the GEMM:
 *  - one image at a time (output plane P*Q large, early layers): a GEMM of
 *    Kg x PQ x CRS writes straight into the NCHW output.  A 1x1, stride-1,
 *    unpadded convolution needs no im2col at all: the input plane already
 *    is the (Cg x HW) matrix.
 *  - several images per GEMM (small planes, late layers: 7x7 or 4x4): one
 *    GEMM per image would have only 16-49 columns, where sgemm runs far
 *    below peak, so nb images are im2col'd side by side (nb*PQ columns) and
 *    the (K x nb*PQ) result is scattered back to NCHW.
 * Workspace (ps_conv2d_workspace, exact): CRS*PQ*nb for the columns plus,
 * when nb > 1, K*nb*PQ for the gathered output / output gradient.
 *
 * OpenMP loops (im2col, scatter, bias) and OpenBLAS GEMMs alternate and
 * never overlap, so both pools can use all cores without oversubscribing. */
#include "cpu_layers.h"
#include "ps_log.h"
#include "worker/engine/ps_blas.h"

#include <string.h>

#define DEFAULT_GEMM_COLS 1024 /* enough columns for sgemm to reach its plateau */

static size_t gemm_cols = DEFAULT_GEMM_COLS;

void ps_conv2d_set_gemm_cols(size_t cols)
{
    gemm_cols = cols ? cols : DEFAULT_GEMM_COLS;
}

size_t ps_conv2d_get_gemm_cols(void)
{
    return gemm_cols;
}

/* Validates a descriptor and shape; logs what is wrong. */
static int conv_valid(const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!d || N <= 0 || H <= 0 || W <= 0 || d->C <= 0 || d->K <= 0 || d->R <= 0 ||
        d->S <= 0 || d->stride_h <= 0 || d->stride_w <= 0 || d->pad_h < 0 || d->pad_w < 0 ||
        d->dil_h <= 0 || d->dil_w <= 0 || d->groups <= 0 || d->C % d->groups ||
        d->K % d->groups) {
        ps_error("conv2d: invalid descriptor or shape (N=%d H=%d W=%d C=%d K=%d R=%d S=%d "
                 "groups=%d)", N, H, W, d ? d->C : 0, d ? d->K : 0, d ? d->R : 0,
                 d ? d->S : 0, d ? d->groups : 0);
        return 0;
    }
    if (ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) <= 0 ||
        ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w) <= 0) {
        ps_error("conv2d: kernel %dx%d (dilation %d,%d) larger than padded input %dx%d",
                 d->R, d->S, d->dil_h, d->dil_w, H, W);
        return 0;
    }
    return 1;
}

static int is_pointwise(const ps_conv2d_desc_t *d)
{
    return d->R == 1 && d->S == 1 && d->stride_h == 1 && d->stride_w == 1 && d->pad_h == 0 &&
           d->pad_w == 0;
}

int ps_conv2d_images_per_gemm(const ps_conv2d_desc_t *d, int N, int H, int W)
{
    size_t PQ = (size_t)ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) *
                ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    if (PQ == 0 || PQ >= gemm_cols) return 1;
    size_t nb = (gemm_cols + PQ - 1) / PQ;
    return nb > (size_t)N ? N : (int)nb;
}

size_t ps_conv2d_workspace(const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!conv_valid(d, N, H, W)) return 0;
    size_t PQ = (size_t)ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) *
                ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    size_t CRS = (size_t)(d->C / d->groups) * d->R * d->S;
    int nb = ps_conv2d_images_per_gemm(d, N, H, W);
    if (nb == 1) return is_pointwise(d) ? 0 : CRS * PQ;
    return CRS * PQ * nb + (size_t)d->K * PQ * nb;
}

/* Workspace for this call; grows ctx's if a caller sized it too small. */
static float *conv_workspace(ps_ctx_t *ctx, const ps_conv2d_desc_t *d, int N, int H, int W)
{
    size_t need = ps_conv2d_workspace(d, N, H, W);
    if (need == 0) return ctx->workspace; /* may be NULL: not used */
    if (ctx->workspace_numel < need) {
        static int warned; /* once: a model that never reserves would flood the log */
        if (!warned++)
            ps_warn("conv2d: workspace of %zu floats < %zu needed; growing it (size it with "
                    "ps_conv2d_workspace)", ctx->workspace_numel, need);
        if (ps_ctx_reserve(ctx, need)) return NULL;
    }
    return ctx->workspace;
}

void ps_cpu_conv2d_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!conv_valid(d, N, H, W)) return;
    const int P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h);
    const int Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    const int G = d->groups, C = d->C, K = d->K, Cg = C / G, Kg = K / G;
    const int CRS = Cg * d->R * d->S, nb = ps_conv2d_images_per_gemm(d, N, H, W);
    const size_t HW = (size_t)H * W, PQ = (size_t)P * Q;
    float *ws = conv_workspace(ctx, d, N, H, W);
    if (!ws && ps_conv2d_workspace(d, N, H, W)) return;

    for (int n0 = 0; n0 < N; n0 += nb) {
        const int nc = N - n0 < nb ? N - n0 : nb;
        const size_t cols = (size_t)nc * PQ;
        if (nb == 1) {
            for (int g = 0; g < G; g++) {
                const float *xg = inp + ((size_t)n0 * C + (size_t)g * Cg) * HW;
                const float *B = xg;
                if (!is_pointwise(d)) {
                    ps_cpu_im2col(ws, xg, (size_t)C * HW, 1, Cg, H, W, d, P, Q);
                    B = ws;
                }
                ps_blas_sgemm(0, 0, Kg, (int)PQ, CRS, 1.0f, w + (size_t)g * Kg * CRS, CRS, B,
                              (int)PQ, 0.0f, out + ((size_t)n0 * K + (size_t)g * Kg) * PQ,
                              (int)PQ);
            }
        } else {
            float *col = ws, *tmp = ws + (size_t)CRS * PQ * nb; /* tmp: K x cols */
            for (int g = 0; g < G; g++) {
                const float *xg = inp + ((size_t)n0 * C + (size_t)g * Cg) * HW;
                ps_cpu_im2col(col, xg, (size_t)C * HW, nc, Cg, H, W, d, P, Q);
                ps_blas_sgemm(0, 0, Kg, (int)cols, CRS, 1.0f, w + (size_t)g * Kg * CRS, CRS, col,
                              (int)cols, 0.0f, tmp + (size_t)g * Kg * cols, (int)cols);
            }
            /* (K, nc, PQ) -> (nc, K, PQ) */
#pragma omp parallel for collapse(2) schedule(static)
            for (int i = 0; i < nc; i++)
                for (int k = 0; k < K; k++)
                    memcpy(out + ((size_t)(n0 + i) * K + k) * PQ,
                           tmp + (size_t)k * cols + (size_t)i * PQ, PQ * sizeof(float));
        }
    }
    if (b) {
#pragma omp parallel for collapse(2) schedule(static)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                float *o = out + ((size_t)n * K + k) * PQ, bk = b[k];
#pragma omp simd
                for (size_t i = 0; i < PQ; i++) o[i] += bk;
            }
    }
}

void ps_cpu_conv2d_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w,
                            const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!conv_valid(d, N, H, W)) return;
    const int P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h);
    const int Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    const int G = d->groups, C = d->C, K = d->K, Cg = C / G, Kg = K / G;
    const int CRS = Cg * d->R * d->S, nb = ps_conv2d_images_per_gemm(d, N, H, W);
    const size_t HW = (size_t)H * W, PQ = (size_t)P * Q;
    const int direct = nb == 1 && is_pointwise(d);

    if (db) {
        /* bias gradient: sum of dout over images and the plane (accumulated) */
#pragma omp parallel for schedule(static)
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
    if (!dw && !dinp) return;
    float *ws = conv_workspace(ctx, d, N, H, W);
    if (!ws && ps_conv2d_workspace(d, N, H, W)) return;
    if (dinp && !direct) {
        /* col2im adds into dinp, whose contract is "overwrite" */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memset(dinp + (size_t)n * C * HW, 0, C * HW * sizeof(float));
    }

    for (int n0 = 0; n0 < N; n0 += nb) {
        const int nc = N - n0 < nb ? N - n0 : nb;
        const size_t cols = (size_t)nc * PQ;
        const float *dy; /* (K x cols) view of this chunk's output gradient */
        float *col = ws;
        size_t ldy;
        if (nb == 1) {
            dy = dout + (size_t)n0 * K * PQ;
            ldy = PQ;
        } else {
            float *tmp = ws + (size_t)CRS * PQ * nb;
#pragma omp parallel for collapse(2) schedule(static)
            for (int i = 0; i < nc; i++)
                for (int k = 0; k < K; k++)
                    memcpy(tmp + (size_t)k * cols + (size_t)i * PQ,
                           dout + ((size_t)(n0 + i) * K + k) * PQ, PQ * sizeof(float));
            dy = tmp;
            ldy = cols;
        }
        for (int g = 0; g < G; g++) {
            const float *xg = inp + ((size_t)n0 * C + (size_t)g * Cg) * HW;
            const float *dyg = dy + (size_t)g * Kg * ldy;
            const float *wg = w + (size_t)g * Kg * CRS;
            float *dxg = dinp ? dinp + ((size_t)n0 * C + (size_t)g * Cg) * HW : NULL;
            if (direct) {
                /* dW += dY (Kg x HW) * X^T;  dX = W^T (Cg x Kg) * dY */
                if (dw)
                    ps_blas_sgemm(0, 1, Kg, Cg, (int)PQ, 1.0f, dyg, (int)ldy, xg, (int)HW, 1.0f,
                                  dw + (size_t)g * Kg * CRS, CRS);
                if (dxg)
                    ps_blas_sgemm(1, 0, Cg, (int)PQ, Kg, 1.0f, wg, CRS, dyg, (int)ldy, 0.0f, dxg,
                                  (int)HW);
                continue;
            }
            if (dw) {
                ps_cpu_im2col(col, xg, (size_t)C * HW, nc, Cg, H, W, d, P, Q);
                ps_blas_sgemm(0, 1, Kg, CRS, (int)cols, 1.0f, dyg, (int)ldy, col, (int)cols,
                              1.0f, dw + (size_t)g * Kg * CRS, CRS);
            }
            if (dxg) {
                /* dcol = W^T (CRS x Kg) * dY (Kg x cols), reusing the column buffer */
                ps_blas_sgemm(1, 0, CRS, (int)cols, Kg, 1.0f, wg, CRS, dyg, (int)ldy, 0.0f, col,
                              (int)cols);
                ps_cpu_col2im(dxg, col, (size_t)C * HW, nc, Cg, H, W, d, P, Q);
            }
        }
    }
}
