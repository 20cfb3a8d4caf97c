/* conv3d on the CPU: vol2col + GEMM through ps_blas_sgemm, per clip and
 * group; the readable reference the CUDA backend and the 3-D models are
 * checked against, and the 3-D half of the "gemm" convolution row
 * (conv_gemm.c): the conv3d slots choose between it and oneDNN per layer
 * shape (conv_select.c).  This file is meant to be obviously right.
 *
 * Legend: N clips, C in / K out channels, G groups (Cg = C/G, Kg = K/G),
 * D,H,W input and O,P,Q output frames / height / width, KT,R,S kernel;
 * CRS = Cg*KT*R*S rows of the column matrix.
 *
 *  - A 1x1x1, stride-1, unpadded convolution needs no vol2col: the clip's
 *    (Cg x D*H*W) input block already is the column matrix, one GEMM.
 *  - Otherwise the columns of one clip are made a range of output frames
 *    at a time (col_cap floats at most unless one frame needs more), so
 *    the workspace stays bounded for long clips at full resolution; GEMMs
 *    write straight into the NCDHW output (row stride O*P*Q).
 *
 * Threads: with two clips or more and several OpenMP threads, the team
 * works on whole clips, each thread with its own column buffer and
 * single-threaded vol2col + sgemm + col2vol; weight gradients are
 * accumulated per thread (thread 0 straight into dw, the others into
 * zeroed workspace copies; a static share of the clips each, so the sum
 * is reproducible) and summed at the end.  With one clip (or one
 * thread) the clip's vol2col / col2vol rows and GEMMs are split instead.
 * Workspace (ps_conv3d_workspace, exact for the current thread count):
 * team * CRS*P*Q*frames_per_chunk + (team-1) * the weight size. */
#include "cpu_layers.h"
#include "ps_log.h"
#include "worker/engine/ps_blas.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define DEFAULT_COL_CAP ((size_t)1 << 22) /* 16 MiB of columns per thread */

static size_t col_cap = DEFAULT_COL_CAP;

void ps_conv3d_set_col_cap(size_t floats)
{
    col_cap = floats ? floats : DEFAULT_COL_CAP;
}

int ps_conv3d_check(const char *who, const ps_conv3d_desc_t *d, int N, int D, int H, int W)
{
    if (!d || N <= 0 || D <= 0 || H <= 0 || W <= 0 || d->C <= 0 || d->K <= 0 || d->KT <= 0 ||
        d->R <= 0 || d->S <= 0 || d->stride_t <= 0 || d->stride_h <= 0 || d->stride_w <= 0 ||
        d->pad_t < 0 || d->pad_h < 0 || d->pad_w < 0 || d->dil_t <= 0 || d->dil_h <= 0 ||
        d->dil_w <= 0 || d->groups <= 0 || d->C % d->groups || d->K % d->groups) {
        ps_error("%s: invalid descriptor or shape (N=%d D=%d H=%d W=%d C=%d K=%d "
                 "kernel %dx%dx%d groups=%d)", who, N, D, H, W, d ? d->C : 0, d ? d->K : 0,
                 d ? d->KT : 0, d ? d->R : 0, d ? d->S : 0, d ? d->groups : 0);
        return 0;
    }
    if (ps_conv_out(D, d->KT, d->stride_t, d->pad_t, d->dil_t) <= 0 ||
        ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) <= 0 ||
        ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w) <= 0) {
        ps_error("%s: kernel %dx%dx%d (dilation %d,%d,%d) larger than the padded input "
                 "%dx%dx%d", who, d->KT, d->R, d->S, d->dil_t, d->dil_h, d->dil_w, D, H, W);
        return 0;
    }
    return 1;
}

typedef struct plan3 {
    int O, P, Q, G, Cg, Kg, CRS;
    size_t DHW, PQ, OPQ, nw;
    int direct;        /* 1x1x1, stride 1, no padding: no vol2col */
    int fchunk;        /* output frames per column chunk */
    int team;          /* threads over clips; 1 = one clip at a time */
    size_t per_thread; /* column floats per team member */
} plan3_t;

/* 1x1x1, stride 1, no padding: the input block is the column matrix */
static int is_direct(const ps_conv3d_desc_t *d)
{
    return d->KT == 1 && d->R == 1 && d->S == 1 && d->stride_t == 1 && d->stride_h == 1 &&
           d->stride_w == 1 && d->pad_t == 0 && d->pad_h == 0 && d->pad_w == 0;
}

static void plan3(plan3_t *p, const ps_conv3d_desc_t *d, int N, int D, int H, int W)
{
    p->O = ps_conv_out(D, d->KT, d->stride_t, d->pad_t, d->dil_t);
    p->P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h);
    p->Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    p->G = d->groups, p->Cg = d->C / d->groups, p->Kg = d->K / d->groups;
    p->CRS = p->Cg * d->KT * d->R * d->S;
    p->DHW = (size_t)D * H * W, p->PQ = (size_t)p->P * p->Q, p->OPQ = p->PQ * p->O;
    p->nw = (size_t)d->K * p->CRS;
    p->direct = is_direct(d);
    size_t frame_cols = (size_t)p->CRS * p->PQ, f = col_cap / frame_cols;
    p->fchunk = f < 1 ? 1 : f > (size_t)p->O ? p->O : (int)f;
    const int nt = ps_cpu_team_threads();
    p->team = N >= 2 && nt > 1 ? (N < nt ? N : nt) : 1;
    p->per_thread = p->direct ? 0 : frame_cols * (size_t)p->fchunk;
}

size_t ps_conv3d_workspace(const ps_conv3d_desc_t *d, int N, int D, int H, int W)
{
    if (!ps_conv3d_check("conv3d", d, N, D, H, W)) return 0;
    plan3_t p;
    plan3(&p, d, N, D, H, W);
    return p.per_thread * p.team + (p.team > 1 ? p.nw * (p.team - 1) : 0);
}

/* Workspace for this call; grows ctx's if a caller sized it too small. */
static float *workspace3(ps_ctx_t *ctx, const ps_conv3d_desc_t *d, int N, int D, int H, int W,
                         int *failed)
{
    size_t need = ps_conv3d_workspace(d, N, D, H, W);
    *failed = 0;
    if (need == 0) return ctx->workspace;
    if (ctx->workspace_numel < need) {
        static int warned; /* once: a model that never reserves would flood the log */
        if (!warned++)
            ps_warn("conv3d: workspace of %zu floats < %zu needed; growing it (size it with "
                    "ps_conv3d_workspace)", ctx->workspace_numel, need);
        if (ps_ctx_reserve(ctx, need)) {
            *failed = 1;
            return NULL;
        }
    }
    return ctx->workspace;
}

/* Forward of clip n with column buffer ws. */
static void fwd_clip(const plan3_t *p, const ps_conv3d_desc_t *d, float *out, const float *inp,
                     const float *w, const float *b, float *ws, int n, int D, int H, int W)
{
    for (int g = 0; g < p->G; g++) {
        const float *xg = inp + ((size_t)n * d->C + (size_t)g * p->Cg) * p->DHW;
        const float *wg = w + (size_t)g * p->Kg * p->CRS;
        float *yg = out + ((size_t)n * d->K + (size_t)g * p->Kg) * p->OPQ;
        if (p->direct) {
            ps_blas_sgemm(0, 0, p->Kg, (int)p->OPQ, p->CRS, 1.0f, wg, p->CRS, xg, (int)p->DHW,
                          0.0f, yg, (int)p->OPQ);
            continue;
        }
        for (int o0 = 0; o0 < p->O; o0 += p->fchunk) {
            const int o1 = o0 + p->fchunk < p->O ? o0 + p->fchunk : p->O;
            const int cols = (int)((size_t)(o1 - o0) * p->PQ);
            ps_cpu_vol2col(ws, xg, p->Cg, D, H, W, d, p->P, p->Q, o0, o1);
            ps_blas_sgemm(0, 0, p->Kg, cols, p->CRS, 1.0f, wg, p->CRS, ws, cols, 0.0f,
                          yg + (size_t)o0 * p->PQ, (int)p->OPQ);
        }
    }
    if (b)
        for (int k = 0; k < d->K; k++) {
            float *o = out + ((size_t)n * d->K + k) * p->OPQ, bk = b[k];
#pragma omp simd
            for (size_t i = 0; i < p->OPQ; i++) o[i] += bk;
        }
}

void ps_conv3d_gemm_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                            const float *b, const ps_conv3d_desc_t *d, int N, int D, int H,
                            int W)
{
    if (!ps_conv3d_check("conv3d", d, N, D, H, W)) return;
    plan3_t p;
    plan3(&p, d, N, D, H, W);
    int failed;
    float *ws = workspace3(ctx, d, N, D, H, W, &failed);
    if (failed) return;
    if (p.team > 1) {
#pragma omp parallel num_threads(p.team)
        {
            int t = 0;
#ifdef _OPENMP
            t = omp_get_thread_num();
#endif
            float *my = ws ? ws + p.per_thread * t : NULL;
#pragma omp for schedule(dynamic, 1)
            for (int n = 0; n < N; n++) fwd_clip(&p, d, out, inp, w, b, my, n, D, H, W);
        }
        return;
    }
    for (int n = 0; n < N; n++) fwd_clip(&p, d, out, inp, w, b, ws, n, D, H, W);
}

/* Backward of clip n: its dinp overwritten (if dinp), dW accumulated into
 * dwacc (if not NULL). */
static void bwd_clip(const plan3_t *p, const ps_conv3d_desc_t *d, float *dinp, float *dwacc,
                     const float *dout, const float *inp, const float *w, float *ws, int n,
                     int D, int H, int W)
{
    const int Cg = p->Cg, Kg = p->Kg, CRS = p->CRS;
    /* col2vol adds into dinp, whose contract is "overwrite" */
    if (dinp && !p->direct)
        memset(dinp + (size_t)n * d->C * p->DHW, 0, (size_t)d->C * p->DHW * sizeof(float));
    for (int g = 0; g < p->G; g++) {
        /* inp is NULL when only dinp is wanted, w when only dw is */
        const float *xg = dwacc ? inp + ((size_t)n * d->C + (size_t)g * Cg) * p->DHW : NULL;
        const float *wg = dinp ? w + (size_t)g * Kg * CRS : NULL;
        const float *dyg = dout + ((size_t)n * d->K + (size_t)g * Kg) * p->OPQ;
        float *dwg = dwacc ? dwacc + (size_t)g * Kg * CRS : NULL;
        float *dxg = dinp ? dinp + ((size_t)n * d->C + (size_t)g * Cg) * p->DHW : NULL;
        if (p->direct) {
            /* dW += dY (Kg x DHW) * X^T;  dX = W^T (Cg x Kg) * dY */
            if (dwg)
                ps_blas_sgemm(0, 1, Kg, Cg, (int)p->OPQ, 1.0f, dyg, (int)p->OPQ, xg,
                              (int)p->DHW, 1.0f, dwg, CRS);
            if (dxg)
                ps_blas_sgemm(1, 0, Cg, (int)p->OPQ, Kg, 1.0f, wg, CRS, dyg, (int)p->OPQ, 0.0f,
                              dxg, (int)p->DHW);
            continue;
        }
        for (int o0 = 0; o0 < p->O; o0 += p->fchunk) {
            const int o1 = o0 + p->fchunk < p->O ? o0 + p->fchunk : p->O;
            const int cols = (int)((size_t)(o1 - o0) * p->PQ);
            const float *dy = dyg + (size_t)o0 * p->PQ;
            if (dwg) {
                ps_cpu_vol2col(ws, xg, Cg, D, H, W, d, p->P, p->Q, o0, o1);
                ps_blas_sgemm(0, 1, Kg, CRS, cols, 1.0f, dy, (int)p->OPQ, ws, cols, 1.0f, dwg,
                              CRS);
            }
            if (dxg) {
                /* dcol = W^T (CRS x Kg) * dY (Kg x cols), in the column buffer */
                ps_blas_sgemm(1, 0, CRS, cols, Kg, 1.0f, wg, CRS, dy, (int)p->OPQ, 0.0f, ws,
                              cols);
                ps_cpu_col2vol(dxg, ws, Cg, D, H, W, d, p->P, p->Q, o0, o1);
            }
        }
    }
}

void ps_conv3d_gemm_backward(ps_ctx_t *ctx, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, const ps_conv3d_desc_t *d, int N,
                             int D, int H, int W)
{
    if (!ps_conv3d_check("conv3d", d, N, D, H, W)) return;
    plan3_t p;
    plan3(&p, d, N, D, H, W);
    if (!dw && !dinp) return;
    int failed;
    float *ws = workspace3(ctx, d, N, D, H, W, &failed);
    if (failed) return;
    if (p.team > 1) {
        float *red = ws + p.per_thread * p.team; /* (team-1) private dw copies */
#pragma omp parallel num_threads(p.team)
        {
            int t = 0, nth = 1;
#ifdef _OPENMP
            t = omp_get_thread_num(), nth = omp_get_num_threads();
#endif
            float *my = ws + p.per_thread * t;
            float *mydw = !dw ? NULL : t == 0 ? dw : red + p.nw * (t - 1);
            if (mydw && t > 0) memset(mydw, 0, p.nw * sizeof(float));
            /* static: each thread always sums the same clips into its dw
             * copy, so the weight gradient is the same bit for bit on every
             * run with this thread count */
#pragma omp for schedule(static)
            for (int n = 0; n < N; n++) bwd_clip(&p, d, dinp, mydw, dout, inp, w, my, n, D, H, W);
            /* (implicit barrier) the threads' partial weight gradients */
            if (dw && nth > 1) ps_cpu_sum_partials(dw, red, p.nw, nth);
        }
        return;
    }
    for (int n = 0; n < N; n++) bwd_clip(&p, d, dinp, dw, dout, inp, w, ws, n, D, H, W);
}

const char *ps_conv3d_gemm_scheme(const ps_conv3d_desc_t *d, int data_grad)
{
    return is_direct(d) ? "sgemm" : data_grad ? "sgemm+col2vol" : "vol2col+sgemm";
}
