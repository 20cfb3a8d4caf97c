/* conv2d on the CPU by im2col + sgemm (ps_blas_sgemm: oneDNN's or
 * OpenBLAS's), per group: the 2-D half of the "gemm" convolution row
 * (conv_gemm.c, conv_provider.h), the readable reference.
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
 *
 * Threads: the batch is cut into chunks of nb images and the OpenMP team
 * works on whole chunks, each thread with its own slice of the workspace
 * and single-threaded im2col + sgemm + col2im.  One parallel region per
 * call instead of one per im2col / GEMM / col2im of every image: the
 * profile of a TSM-ResNet-18 step on 2 shared cores showed ~50% of the CPU
 * time spinning in libgomp barriers (thousands of short regions a step,
 * each waiting for the slowest thread), and the whole im2col -> GEMM ->
 * col2im of one chunk now stays in that thread's cache.  Weight gradients
 * are accumulated per thread (thread 0 straight into dw, the others into
 * zeroed workspace copies; a static share of the chunks each, so the sums
 * are reproducible) and summed once at the end.  With one thread or
 * one image the chunks run in turn and ps_blas_sgemm splits each GEMM.
 * Workspace (ps_conv2d_workspace, exact for the current thread count):
 * per team member CRS*PQ*nb for the columns plus, when nb > 1, K*nb*PQ for
 * the gathered output / output gradient; plus (team-1) dw copies.
 */
#include "conv_provider.h"
#include "cpu_layers.h"
#include "ps_log.h"
#include "worker/engine/ps_blas.h"

#include <stdio.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define DEFAULT_GEMM_COLS 1024 /* enough columns for sgemm to reach its plateau */
#define SINGLE_CHUNK_MAX ((size_t)1 << 22) /* 16 MiB of columns */

static size_t gemm_cols = DEFAULT_GEMM_COLS;

void ps_conv2d_set_gemm_cols(size_t cols)
{
    gemm_cols = cols ? cols : DEFAULT_GEMM_COLS;
}

size_t ps_conv2d_get_gemm_cols(void)
{
    return gemm_cols;
}

int ps_conv2d_valid(const ps_conv2d_desc_t *d, int N, int H, int W)
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

/* How one call is cut: nb images per GEMM, team threads over the chunks. */
typedef struct conv_plan {
    int P, Q, G, C, K, Cg, Kg, CRS, nb, nchunks, team, direct;
    int flip;          /* dinp as a forward conv of dout (see can_flip) */
    size_t HW, PQ, nw;
    size_t per_thread; /* workspace floats per team member */
    size_t shared;     /* after the team's slices: dw copies, flipped weights */
} conv_plan_t;

/* Stride-1 convolutions whose padding is at most the dilated kernel
 * extent: their input gradient is a plain convolution of the output
 * gradient with the flipped, transposed kernel and padding
 * dil*(R-1) - pad, which im2col + GEMM compute straight into dinp.  That
 * replaces col2im's scatter-add (a read-modify-write pass per kernel tap,
 * ~7% of a ResNet-18 step) with im2col's copies. */
static int can_flip(const ps_conv2d_desc_t *d)
{
    return d->stride_h == 1 && d->stride_w == 1 && (d->R > 1 || d->S > 1) &&
           d->pad_h <= d->dil_h * (d->R - 1) && d->pad_w <= d->dil_w * (d->S - 1);
}

/* The plan of a forward (dw 0) or of a backward that computes the weight
 * gradient (dw 1). */
static void conv_plan(conv_plan_t *p, const ps_conv2d_desc_t *d, int N, int H, int W, int dw)
{
    p->P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h);
    p->Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    p->G = d->groups, p->C = d->C, p->K = d->K, p->Cg = d->C / d->groups;
    p->Kg = d->K / d->groups, p->CRS = p->Cg * d->R * d->S;
    p->HW = (size_t)H * W, p->PQ = (size_t)p->P * p->Q, p->nw = (size_t)d->K * p->CRS;
    int nb = 1;
    /* a 1x1 convolution with a plane of a quarter of the GEMM target or
     * more stays one image per GEMM: batching would cost a copy of its
     * input (im2col) and of its output (scatter) for a small gain in width */
    if (p->PQ < gemm_cols && !(is_pointwise(d) && p->PQ * 4 >= gemm_cols)) {
        size_t want = (gemm_cols + p->PQ - 1) / p->PQ;
        nb = want > (size_t)N ? N : (int)want;
    }
    const int nt = ps_cpu_team_threads();
    int nchunks = (N + nb - 1) / nb;
    if (nt > 1 && nchunks % nt) {
        /* a multiple of the team (3 chunks on 2 threads would leave one
         * idle for a third of the call): smaller GEMMs, all threads busy */
        nchunks = (nchunks + nt - 1) / nt * nt;
        if (nchunks > N) nchunks = N;
        nb = (N + nchunks - 1) / nchunks;
        nchunks = (N + nb - 1) / nb;
    }
    /* Weight gradients of big weights on small planes (ResNet's last
     * stages: 512x4608 weights on 4x4 planes): a private copy per thread
     * (zeroed, then summed) moves more memory than the thread's columns.
     * There the whole batch is one chunk and ps_blas_sgemm splits each GEMM
     * over the team instead, when the batch's columns stay within
     * SINGLE_CHUNK_MAX floats (measured on TSM-R18's 512 @4x4: backward
     * 17.2 vs 18.5 ms; its forward was 4% slower that way, so it keeps the
     * chunks). */
    if (dw && nt > 1 && !is_pointwise(d) && p->nw * (nt - 1) > (size_t)p->CRS * p->PQ * nb &&
        (size_t)p->CRS * p->PQ * N <= SINGLE_CHUNK_MAX)
        nb = N, nchunks = 1;
    p->nb = nb, p->nchunks = nchunks;
    p->team = nchunks < nt ? nchunks : nt;
    p->direct = nb == 1 && is_pointwise(d);
    p->flip = !p->direct && can_flip(d);
    size_t col = p->direct ? 0 : (size_t)p->CRS * p->PQ * nb;
    size_t tmp = nb > 1 ? (size_t)p->K * p->PQ * nb : 0;
    if (p->flip) {
        size_t fcol = (size_t)p->Kg * d->R * d->S * p->HW * nb; /* im2col of dout */
        size_t ftmp = nb > 1 ? (size_t)p->Cg * p->HW * nb : 0;  /* one group's dX */
        if (fcol > col) col = fcol;
        if (ftmp > tmp) tmp = ftmp;
    }
    p->per_thread = col + tmp;
    p->shared = (p->team > 1 ? p->nw * (p->team - 1) : 0) + (p->flip ? p->nw : 0);
}

/* wt[g][c][(k*R + r)*S + s] = w[g*Kg + k][c][R-1-r][S-1-s]: per group the
 * (Cg x Kg*R*S) matrix of the flipped, transposed kernel. */
static void flip_weights(float *wt, const float *w, const ps_conv2d_desc_t *d,
                         const conv_plan_t *p)
{
    const int R = d->R, S = d->S, RS = R * S, Cg = p->Cg, Kg = p->Kg;
#pragma omp for schedule(static)
    for (int gc = 0; gc < p->G * Cg; gc++) {
        const int g = gc / Cg, c = gc % Cg;
        float *dst = wt + (size_t)gc * Kg * RS;
        for (int k = 0; k < Kg; k++) {
            const float *src = w + ((size_t)(g * Kg + k) * Cg + c) * RS;
            for (int rs = 0; rs < RS; rs++) dst[(size_t)k * RS + rs] = src[RS - 1 - rs];
        }
    }
}

int ps_conv2d_images_per_gemm(const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!ps_conv2d_valid(d, N, H, W)) return 1;
    conv_plan_t p;
    conv_plan(&p, d, N, H, W, 0);
    return p.nb;
}

size_t ps_conv2d_workspace(const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!ps_conv2d_valid(d, N, H, W)) return 0;
    conv_plan_t f, b;
    conv_plan(&f, d, N, H, W, 0);
    conv_plan(&b, d, N, H, W, 1);
    const size_t nf = f.per_thread * f.team + f.shared, nb = b.per_thread * b.team + b.shared;
    return nf > nb ? nf : nb;
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

/* Forward of images [n0, n0+nc) with workspace ws (per_thread floats). */
static void fwd_chunk(const conv_plan_t *p, const ps_conv2d_desc_t *d, float *out,
                      const float *inp, const float *w, float *ws, int n0, int nc, int H, int W)
{
    const int G = p->G, C = p->C, K = p->K, Cg = p->Cg, Kg = p->Kg, CRS = p->CRS;
    const size_t HW = p->HW, PQ = p->PQ, cols = (size_t)nc * PQ;
    if (p->nb == 1) {
        for (int g = 0; g < G; g++) {
            const float *xg = inp + ((size_t)n0 * C + (size_t)g * Cg) * HW;
            const float *B = xg;
            if (!p->direct) {
                ps_cpu_im2col(ws, xg, (size_t)C * HW, 1, Cg, H, W, d, p->P, p->Q);
                B = ws;
            }
            ps_blas_sgemm(0, 0, Kg, (int)PQ, CRS, 1.0f, w + (size_t)g * Kg * CRS, CRS, B, (int)PQ,
                          0.0f, out + ((size_t)n0 * K + (size_t)g * Kg) * PQ, (int)PQ);
        }
        return;
    }
    float *col = ws, *tmp = ws + (size_t)CRS * PQ * p->nb; /* tmp: K x cols */
    for (int g = 0; g < G; g++) {
        const float *xg = inp + ((size_t)n0 * C + (size_t)g * Cg) * HW;
        ps_cpu_im2col(col, xg, (size_t)C * HW, nc, Cg, H, W, d, p->P, p->Q);
        ps_blas_sgemm(0, 0, Kg, (int)cols, CRS, 1.0f, w + (size_t)g * Kg * CRS, CRS, col,
                      (int)cols, 0.0f, tmp + (size_t)g * Kg * cols, (int)cols);
    }
    /* (K, nc, PQ) -> (nc, K, PQ) */
#pragma omp parallel for collapse(2) schedule(static) if (ps_cpu_team_threads() > 1)
    for (int i = 0; i < nc; i++)
        for (int k = 0; k < K; k++)
            memcpy(out + ((size_t)(n0 + i) * K + k) * PQ, tmp + (size_t)k * cols + (size_t)i * PQ,
                   PQ * sizeof(float));
}

void ps_conv2d_gemm_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                            const float *b, const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!ps_conv2d_valid(d, N, H, W)) return;
    conv_plan_t p;
    conv_plan(&p, d, N, H, W, 0);
    float *ws = conv_workspace(ctx, d, N, H, W);
    if (!ws && ps_conv2d_workspace(d, N, H, W)) return;
    const int K = p.K;
    const size_t PQ = p.PQ;

    if (p.team > 1) {
#pragma omp parallel num_threads(p.team)
        {
            int t = 0;
#ifdef _OPENMP
            t = omp_get_thread_num();
#endif
            float *my = ws ? ws + p.per_thread * t : NULL;
#pragma omp for schedule(dynamic, 1)
            for (int c = 0; c < p.nchunks; c++) {
                const int n0 = c * p.nb, nc = N - n0 < p.nb ? N - n0 : p.nb;
                fwd_chunk(&p, d, out, inp, w, my, n0, nc, H, W);
                if (b)
                    for (int i = n0; i < n0 + nc; i++)
                        for (int k = 0; k < K; k++) {
                            float *o = out + ((size_t)i * K + k) * PQ, bk = b[k];
#pragma omp simd
                            for (size_t j = 0; j < PQ; j++) o[j] += bk;
                        }
            }
        }
        return;
    }
    for (int n0 = 0; n0 < N; n0 += p.nb)
        fwd_chunk(&p, d, out, inp, w, ws, n0, N - n0 < p.nb ? N - n0 : p.nb, H, W);
    if (b) {
#pragma omp parallel for collapse(2) schedule(static) if (ps_cpu_team_threads() > 1)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                float *o = out + ((size_t)n * K + k) * PQ, bk = b[k];
#pragma omp simd
                for (size_t i = 0; i < PQ; i++) o[i] += bk;
            }
    }
}

/* Backward of images [n0, n0+nc): dinp of these images overwritten (if
 * dinp), dW accumulated into dwacc (if not NULL). */
static void bwd_chunk(const conv_plan_t *p, const ps_conv2d_desc_t *d, float *dinp,
                      float *dwacc, const float *dout, const float *inp, const float *w,
                      const float *wt, float *ws, int n0, int nc, int H, int W)
{
    const int G = p->G, C = p->C, K = p->K, Cg = p->Cg, Kg = p->Kg, CRS = p->CRS;
    const size_t HW = p->HW, PQ = p->PQ, cols = (size_t)nc * PQ;
    const float *dy; /* (K x cols) view of this chunk's output gradient */
    float *col = ws;
    size_t ldy;
    if (p->nb == 1) {
        dy = dout + (size_t)n0 * K * PQ;
        ldy = PQ;
    } else {
        float *tmp = ws + (size_t)CRS * PQ * p->nb;
#pragma omp parallel for collapse(2) schedule(static) if (ps_cpu_team_threads() > 1)
        for (int i = 0; i < nc; i++)
            for (int k = 0; k < K; k++)
                memcpy(tmp + (size_t)k * cols + (size_t)i * PQ,
                       dout + ((size_t)(n0 + i) * K + k) * PQ, PQ * sizeof(float));
        dy = tmp;
        ldy = cols;
    }
    /* col2im adds into dinp, whose contract is "overwrite" */
    if (dinp && !p->direct && !p->flip)
        memset(dinp + (size_t)n0 * C * HW, 0, (size_t)nc * C * HW * sizeof(float));
    for (int g = 0; g < G; g++) {
        /* inp is NULL when only dinp is wanted, w when only dw is */
        const float *xg = dwacc ? inp + ((size_t)n0 * C + (size_t)g * Cg) * HW : NULL;
        const float *dyg = dy + (size_t)g * Kg * ldy;
        const float *wg = dinp ? w + (size_t)g * Kg * CRS : NULL;
        float *dxg = dinp ? dinp + ((size_t)n0 * C + (size_t)g * Cg) * HW : NULL;
        if (p->direct) {
            /* dW += dY (Kg x HW) * X^T;  dX = W^T (Cg x Kg) * dY */
            if (dwacc)
                ps_blas_sgemm(0, 1, Kg, Cg, (int)PQ, 1.0f, dyg, (int)ldy, xg, (int)HW, 1.0f,
                              dwacc + (size_t)g * Kg * CRS, CRS);
            if (dxg)
                ps_blas_sgemm(1, 0, Cg, (int)PQ, Kg, 1.0f, wg, CRS, dyg, (int)ldy, 0.0f, dxg,
                              (int)HW);
            continue;
        }
        if (dwacc) {
            ps_cpu_im2col(col, xg, (size_t)C * HW, nc, Cg, H, W, d, p->P, p->Q);
            ps_blas_sgemm(0, 1, Kg, CRS, (int)cols, 1.0f, dyg, (int)ldy, col, (int)cols, 1.0f,
                          dwacc + (size_t)g * Kg * CRS, CRS);
        }
        if (dxg && !p->flip) {
            /* dcol = W^T (CRS x Kg) * dY (Kg x cols), reusing the column buffer */
            ps_blas_sgemm(1, 0, CRS, (int)cols, Kg, 1.0f, wg, CRS, dyg, (int)ldy, 0.0f, col,
                          (int)cols);
            ps_cpu_col2im(dxg, col, (size_t)C * HW, nc, Cg, H, W, d, p->P, p->Q);
        }
    }
    if (dinp && p->flip) {
        /* dX_g (Cg x nc*HW) = wt_g (Cg x Kg*R*S) * im2col(dY_g, pad') */
        ps_conv2d_desc_t fd = *d;
        fd.pad_h = d->dil_h * (d->R - 1) - d->pad_h;
        fd.pad_w = d->dil_w * (d->S - 1) - d->pad_w;
        const int KRS = Kg * d->R * d->S;
        const size_t hcols = (size_t)nc * HW;
        float *tmp = ws + (size_t)p->per_thread - (p->nb > 1 ? (size_t)Cg * HW * p->nb : 0);
        for (int g = 0; g < G; g++) {
            const float *dyg = dout + ((size_t)n0 * K + (size_t)g * Kg) * PQ;
            ps_cpu_im2col(col, dyg, (size_t)K * PQ, nc, Kg, p->P, p->Q, &fd, H, W);
            float *dxg = dinp + ((size_t)n0 * C + (size_t)g * Cg) * HW;
            if (p->nb == 1 || HW * 4 >= gemm_cols) {
                /* planes of a quarter of the GEMM target and more: one GEMM
                 * per image straight into dinp, no scatter pass */
                for (int i = 0; i < nc; i++)
                    ps_blas_sgemm(0, 0, Cg, (int)HW, KRS, 1.0f, wt + (size_t)g * Cg * KRS, KRS,
                                  col + (size_t)i * HW, (int)hcols, 0.0f,
                                  dxg + (size_t)i * C * HW, (int)HW);
                continue;
            }
            ps_blas_sgemm(0, 0, Cg, (int)hcols, KRS, 1.0f, wt + (size_t)g * Cg * KRS, KRS, col,
                          (int)hcols, 0.0f, tmp, (int)hcols);
            /* (Cg, nc, HW) -> (nc, Cg, HW) */
#pragma omp parallel for collapse(2) schedule(static) if (ps_cpu_team_threads() > 1)
            for (int i = 0; i < nc; i++)
                for (int c = 0; c < Cg; c++)
                    memcpy(dxg + ((size_t)i * C + c) * HW, tmp + (size_t)c * hcols + (size_t)i * HW,
                           HW * sizeof(float));
        }
    }
}

void ps_conv2d_gemm_backward(ps_ctx_t *ctx, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, const ps_conv2d_desc_t *d, int N,
                             int H, int W)
{
    if (!ps_conv2d_valid(d, N, H, W)) return;
    conv_plan_t p;
    conv_plan(&p, d, N, H, W, dw != NULL);
    if (!dw && !dinp) return;
    float *ws = conv_workspace(ctx, d, N, H, W);
    if (!ws && ps_conv2d_workspace(d, N, H, W)) return;

    float *wt = p.flip && dinp ? ws + p.per_thread * p.team + (p.shared - p.nw) : NULL;
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
            if (wt) flip_weights(wt, w, d, &p); /* ends in a barrier */
            /* a static share of the chunks per thread: each thread's partial
             * weight gradient then sums the same images every run, so dw is
             * reproducible bit for bit (dynamic hand-out was not) */
#pragma omp for schedule(static)
            for (int c = 0; c < p.nchunks; c++) {
                const int n0 = c * p.nb, nc = N - n0 < p.nb ? N - n0 : p.nb;
                bwd_chunk(&p, d, dinp, mydw, dout, inp, w, wt, my, n0, nc, H, W);
            }
            /* (implicit barrier) the threads' partial weight gradients */
            if (dw && nth > 1) ps_cpu_sum_partials(dw, red, p.nw, nth);
        }
        return;
    }
    if (wt) {
#pragma omp parallel if (ps_cpu_team_threads() > 1)
        flip_weights(wt, w, d, &p);
    }
    for (int n0 = 0; n0 < N; n0 += p.nb)
        bwd_chunk(&p, d, dinp, dw, dout, inp, w, wt, ws, n0, N - n0 < p.nb ? N - n0 : p.nb, H,
                  W);
}

const char *ps_conv2d_gemm_scheme(const ps_conv2d_desc_t *d, int N, int H, int W, int data_grad)
{
    conv_plan_t p;
    conv_plan(&p, d, N, H, W, 0);
    return p.direct                 ? "sgemm"
           : data_grad && p.flip    ? "flipped-im2col+sgemm"
           : data_grad              ? "sgemm+col2im"
                                    : "im2col+sgemm";
}
