// RoIAlign (the roi_align slots of ps_engine.h) on the GPU, beside its CPU
// reference worker/engine/layers/roi_align.c, same signatures; every tensor
// a device (or managed) pointer.
//   * forward: one thread per output element (RoI, channel, bin), the bin's
//     points in the CPU's order with the CPU's float operations (products and
//     sums through __fmul_rn / __fadd_rn, so nvcc cannot contract them into
//     FMAs): bit for bit the CPU's result;
//   * backward: one thread per output element, scatter-adding its points'
//     shares into dfeat with atomicAdd (torchvision's CUDA kernel does the
//     same): the sum order varies run to run, so parity with the CPU is to
//     float rounding, not bit for bit.
// Legend as in ps_engine.h's roi_align slots (R RoIs of (batch, x1, y1, x2,
// y2); feature map N x C x H x W; PH x PW bins).
#include "cuda_int.h"

#include <math.h>

#define ROI_THREADS 256
#define ROI_STRIDE(i, n)                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

// One RoI on the map: roi_align.c's geom_of.
struct roi_geom {
    int n;
    float start_h, start_w, bin_h, bin_w, count;
    int grid_h, grid_w;
};

__device__ roi_geom d_roi_geom(const float *roi, int N, int PH, int PW, float scale,
                               int sampling_ratio, int aligned)
{
    roi_geom g;
    const float off = aligned ? 0.5f : 0.0f;
    const int n = (int)roi[0];
    g.n = (roi[0] >= 0 && n < N) ? n : -1;
    g.start_w = __fmul_rn(roi[1], scale) - off;
    g.start_h = __fmul_rn(roi[2], scale) - off;
    const float end_w = __fmul_rn(roi[3], scale) - off, end_h = __fmul_rn(roi[4], scale) - off;
    float rw = end_w - g.start_w, rh = end_h - g.start_h;
    if (!aligned) {
        rw = fmaxf(rw, 1.0f);
        rh = fmaxf(rh, 1.0f);
    }
    g.bin_h = __fdiv_rn(rh, (float)PH);
    g.bin_w = __fdiv_rn(rw, (float)PW);
    g.grid_h = sampling_ratio > 0 ? sampling_ratio : (int)ceilf(__fdiv_rn(rh, (float)PH));
    g.grid_w = sampling_ratio > 0 ? sampling_ratio : (int)ceilf(__fdiv_rn(rw, (float)PW));
    const int cnt = g.grid_h * g.grid_w;
    g.count = (float)(cnt > 1 ? cnt : 1);
    return g;
}

// Output element i of (R, C, PH, PW): its RoI, channel and bin.
__device__ __forceinline__ void d_roi_index(size_t i, int C, int PH, int PW, size_t *r, int *c,
                                            int *ph, int *pw)
{
    *pw = (int)(i % PW);
    *ph = (int)((i / PW) % PH);
    const size_t rc = i / ((size_t)PW * PH);
    *c = (int)(rc % C);
    *r = rc / C;
}

// Coordinate of sampling point i of bin b along one axis (roi_align.c's
// plan_of: start + b*bin + (i+.5)*bin/grid, left to right).
__device__ __forceinline__ float d_roi_coord(float start, int b, float bin, int i, int grid)
{
    return __fadd_rn(__fadd_rn(start, __fmul_rn((float)b, bin)),
                     __fdiv_rn(__fmul_rn((float)i + .5f, bin), (float)grid));
}

// Bilinear taps of (y, x): roi_align.c's tap_of; returns 0 off the map.
__device__ int d_roi_taps(int H, int W, float y, float x, int *p, float *w)
{
    if (y < -1.0f || y > (float)H || x < -1.0f || x > (float)W) return 0;
    if (y <= 0) y = 0;
    if (x <= 0) x = 0;
    int yl = (int)y, xl = (int)x, yh, xh;
    if (yl >= H - 1) {
        yh = yl = H - 1;
        y = (float)yl;
    } else {
        yh = yl + 1;
    }
    if (xl >= W - 1) {
        xh = xl = W - 1;
        x = (float)xl;
    } else {
        xh = xl + 1;
    }
    const float ly = y - (float)yl, lx = x - (float)xl, hy = 1.0f - ly, hx = 1.0f - lx;
    p[0] = yl * W + xl;
    p[1] = yl * W + xh;
    p[2] = yh * W + xl;
    p[3] = yh * W + xh;
    w[0] = __fmul_rn(hy, hx);
    w[1] = __fmul_rn(hy, lx);
    w[2] = __fmul_rn(ly, hx);
    w[3] = __fmul_rn(ly, lx);
    return 1;
}

// out (R,C,PH,PW); n = R*C*PH*PW
__global__ void k_roi_align_fwd(float *out, const float *feat, const float *rois, size_t n, int N,
                                int C, int H, int W, int PH, int PW, float scale,
                                int sampling_ratio, int aligned)
{
    ROI_STRIDE(i, n)
    {
        size_t r;
        int c, ph, pw;
        d_roi_index(i, C, PH, PW, &r, &c, &ph, &pw);
        const roi_geom g = d_roi_geom(rois + r * 5, N, PH, PW, scale, sampling_ratio, aligned);
        if (g.n < 0) {
            out[i] = 0.f;
            continue;
        }
        const float *f = feat + ((size_t)g.n * C + c) * H * W;
        float v = 0.f;
        for (int iy = 0; iy < g.grid_h; iy++) {
            const float y = d_roi_coord(g.start_h, ph, g.bin_h, iy, g.grid_h);
            for (int ix = 0; ix < g.grid_w; ix++) {
                const float x = d_roi_coord(g.start_w, pw, g.bin_w, ix, g.grid_w);
                int p[4];
                float w[4] = {0.f, 0.f, 0.f, 0.f};
                if (!d_roi_taps(H, W, y, x, p, w)) p[0] = p[1] = p[2] = p[3] = 0;
                const float s = __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(w[0], f[p[0]]),
                                                              __fmul_rn(w[1], f[p[1]])),
                                                    __fmul_rn(w[2], f[p[2]])),
                                          __fmul_rn(w[3], f[p[3]]));
                v = __fadd_rn(v, s);
            }
        }
        out[i] = __fdiv_rn(v, g.count);
    }
}

// dfeat (N,C,H,W) += the transpose; n = R*C*PH*PW
__global__ void k_roi_align_bwd(float *dfeat, const float *dout, const float *rois, size_t n,
                                int N, int C, int H, int W, int PH, int PW, float scale,
                                int sampling_ratio, int aligned)
{
    ROI_STRIDE(i, n)
    {
        size_t r;
        int c, ph, pw;
        d_roi_index(i, C, PH, PW, &r, &c, &ph, &pw);
        const roi_geom g = d_roi_geom(rois + r * 5, N, PH, PW, scale, sampling_ratio, aligned);
        if (g.n < 0) continue;
        float *df = dfeat + ((size_t)g.n * C + c) * H * W;
        const float gb = dout[i];
        for (int iy = 0; iy < g.grid_h; iy++) {
            const float y = d_roi_coord(g.start_h, ph, g.bin_h, iy, g.grid_h);
            for (int ix = 0; ix < g.grid_w; ix++) {
                const float x = d_roi_coord(g.start_w, pw, g.bin_w, ix, g.grid_w);
                int p[4];
                float w[4];
                if (!d_roi_taps(H, W, y, x, p, w)) continue;
                for (int k = 0; k < 4; k++)
                    atomicAdd(df + p[k], __fdiv_rn(__fmul_rn(gb, w[k]), g.count));
            }
        }
    }
}

// ---- launchers -----------------------------------------------------------------------

static int roi_args_ok(const char *who, int R, int N, int C, int H, int W, int PH, int PW)
{
    if (R < 0 || N <= 0 || C <= 0 || H <= 0 || W <= 0 || PH <= 0 || PW <= 0) {
        ps_error("%s (cuda): invalid shape R=%d N=%d C=%d %dx%d -> %dx%d", who, R, N, C, H, W,
                 PH, PW);
        return 0;
    }
    return 1;
}

extern "C" {

void ps_cu_roi_align_forward(ps_ctx_t *ctx, float *out, const float *feat, const float *rois,
                             int R, int N, int C, int H, int W, int PH, int PW,
                             float spatial_scale, int sampling_ratio, int aligned)
{
    ps_cu_state *s = cu_state(ctx);
    if (!roi_args_ok("roi_align", R, N, C, H, W, PH, PW) || R == 0) return;
    if (ps_cu_is_half(s, feat)) {
        ps_cu_half_mismatch("roi_align (fp32 only)");
        return;
    }
    const size_t n = (size_t)R * C * PH * PW;
    k_roi_align_fwd<<<cu_grid(n, ROI_THREADS), ROI_THREADS, 0, s->stream>>>(
        out, feat, rois, n, N, C, H, W, PH, PW, spatial_scale, sampling_ratio, aligned);
    CU_LAUNCHED();
}

void ps_cu_roi_align_backward(ps_ctx_t *ctx, float *dfeat, const float *dout,
                              const float *rois, int R, int N, int C, int H, int W, int PH,
                              int PW, float spatial_scale, int sampling_ratio, int aligned)
{
    ps_cu_state *s = cu_state(ctx);
    if (!roi_args_ok("roi_align backward", R, N, C, H, W, PH, PW) || R == 0) return;
    const size_t n = (size_t)R * C * PH * PW;
    k_roi_align_bwd<<<cu_grid(n, ROI_THREADS), ROI_THREADS, 0, s->stream>>>(
        dfeat, dout, rois, n, N, C, H, W, PH, PW, spatial_scale, sampling_ratio, aligned);
    CU_LAUNCHED();
}

} // extern "C"
