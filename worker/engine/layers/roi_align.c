/* RoIAlign on the CPU (contract in ps_engine.h): torchvision.ops.roi_align
 * (0.14) in float, in torchvision's operation order, so its goldens match
 * to the last bit where torchvision's own CPU kernel does.
 *
 * Per RoI a "plan" holds, for every bin (ph, pw) and sampling point (iy,
 * ix), the four bilinear taps and weights (torchvision's pre_calc); the
 * channels of the RoI then reuse it.  Threads split the channels: a
 * feature plane (n, c) belongs to one thread, so the backward's
 * scatter-add visits it in torchvision's order (RoIs, then bins, then
 * points) and needs no atomics. */
#include "cpu_layers.h"

#include <math.h>
#include <stdlib.h>

#include "ps_log.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct roi_tap {
    int32_t p1, p2, p3, p4; /* offsets in the H x W plane */
    float w1, w2, w3, w4;   /* all 0 for a point off the map */
} roi_tap_t;

/* One RoI's geometry on the map (torchvision roi_align_forward_kernel_impl). */
typedef struct roi_geom {
    int n;                  /* batch index; -1 when outside 0..N-1 */
    float start_h, start_w, bin_h, bin_w;
    int grid_h, grid_w;     /* sampling points per bin and axis */
    float count;            /* max(grid_h * grid_w, 1) */
} roi_geom_t;

static void geom_of(roi_geom_t *g, const float *roi, int N, int PH, int PW, float scale,
                    int sampling_ratio, int aligned)
{
    float off = aligned ? 0.5f : 0.0f;
    int n = (int)roi[0];
    g->n = (roi[0] >= 0 && n < N) ? n : -1;
    g->start_w = roi[1] * scale - off;
    g->start_h = roi[2] * scale - off;
    float end_w = roi[3] * scale - off, end_h = roi[4] * scale - off;
    float rw = end_w - g->start_w, rh = end_h - g->start_h;
    if (!aligned) { /* force malformed RoIs to be 1x1 */
        rw = fmaxf(rw, 1.0f);
        rh = fmaxf(rh, 1.0f);
    }
    g->bin_h = rh / (float)PH;
    g->bin_w = rw / (float)PW;
    g->grid_h = sampling_ratio > 0 ? sampling_ratio : (int)ceilf(rh / (float)PH);
    g->grid_w = sampling_ratio > 0 ? sampling_ratio : (int)ceilf(rw / (float)PW);
    int cnt = g->grid_h * g->grid_w;
    g->count = (float)(cnt > 1 ? cnt : 1);
}

/* torchvision's bilinear_interpolate(_gradient): taps and weights of point
 * (y, x); a point more than one pixel off the map gets zero weights. */
static void tap_of(roi_tap_t *t, int H, int W, float y, float x)
{
    if (y < -1.0f || y > (float)H || x < -1.0f || x > (float)W) {
        *t = (roi_tap_t){0, 0, 0, 0, 0.f, 0.f, 0.f, 0.f};
        return;
    }
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
    float ly = y - (float)yl, lx = x - (float)xl, hy = 1.0f - ly, hx = 1.0f - lx;
    t->p1 = yl * W + xl;
    t->p2 = yl * W + xh;
    t->p3 = yh * W + xl;
    t->p4 = yh * W + xh;
    t->w1 = hy * hx;
    t->w2 = hy * lx;
    t->w3 = ly * hx;
    t->w4 = ly * lx;
}

/* The taps of every (ph, pw, iy, ix) of one RoI into *plan (grown as
 * needed, capacity *cap); returns the taps per bin, or -1 out of memory. */
static int plan_of(roi_tap_t **plan, size_t *cap, const roi_geom_t *g, int H, int W, int PH,
                   int PW)
{
    int per_bin = g->grid_h > 0 && g->grid_w > 0 ? g->grid_h * g->grid_w : 0;
    size_t need = (size_t)PH * PW * (per_bin ? per_bin : 1);
    if (need > *cap) {
        roi_tap_t *p = realloc(*plan, need * sizeof *p);
        if (!p) return -1;
        *plan = p;
        *cap = need;
    }
    roi_tap_t *t = *plan;
    for (int ph = 0; ph < PH; ph++)
        for (int pw = 0; pw < PW; pw++)
            for (int iy = 0; iy < g->grid_h; iy++) {
                float y = g->start_h + (float)ph * g->bin_h +
                          (float)(iy + .5f) * g->bin_h / (float)g->grid_h;
                for (int ix = 0; ix < g->grid_w; ix++) {
                    float x = g->start_w + (float)pw * g->bin_w +
                              (float)(ix + .5f) * g->bin_w / (float)g->grid_w;
                    tap_of(t++, H, W, y, x);
                }
            }
    return per_bin;
}

/* Channels [*c0, *c1) of this thread's share. */
static void chunk(int C, int *c0, int *c1)
{
    int t = 0, nt = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    nt = omp_get_num_threads();
#endif
    *c0 = (int)((long)C * t / nt);
    *c1 = (int)((long)C * (t + 1) / nt);
}

/* The forward (out given) or the backward (dfeat given) of every RoI on
 * this thread's channels. */
static void roi_pass(float *out, const float *feat, float *dfeat, const float *dout,
                     const float *rois, int R, int N, int C, int H, int W, int PH, int PW,
                     float scale, int sampling_ratio, int aligned, int c0, int c1, int *oom)
{
    const size_t plane = (size_t)H * W, bins = (size_t)PH * PW;
    roi_tap_t *plan = NULL;
    size_t cap = 0;
    for (int r = 0; r < R && c0 < c1; r++) {
        roi_geom_t g;
        geom_of(&g, rois + (size_t)r * 5, N, PH, PW, scale, sampling_ratio, aligned);
        int per_bin = g.n >= 0 ? plan_of(&plan, &cap, &g, H, W, PH, PW) : 0;
        if (per_bin < 0) {
            *oom = 1;
            break;
        }
        /* torchvision divides each backward share by the point count; for a
         * power of two (sampling ratio 2: 4) multiplying by its inverse is
         * the same to the bit and cheaper */
        int cnt = (int)g.count, pow2 = (cnt & (cnt - 1)) == 0;
        float inv = 1.0f / g.count;
        for (int c = c0; c < c1; c++) {
            size_t o = ((size_t)r * C + c) * bins;
            const roi_tap_t *t = plan;
            if (out && g.n < 0) {
                for (size_t b = 0; b < bins; b++) out[o + b] = 0.f;
                continue;
            }
            if (g.n < 0) continue;
            const float *f = feat ? feat + ((size_t)g.n * C + c) * plane : NULL;
            float *df = dfeat ? dfeat + ((size_t)g.n * C + c) * plane : NULL;
            for (size_t b = 0; b < bins; b++) {
                if (out) {
                    float v = 0.f;
                    for (int k = 0; k < per_bin; k++, t++)
                        v += t->w1 * f[t->p1] + t->w2 * f[t->p2] + t->w3 * f[t->p3] +
                             t->w4 * f[t->p4];
                    out[o + b] = v / g.count;
                    continue;
                }
                float gb = dout[o + b];
                for (int k = 0; k < per_bin; k++, t++) {
                    /* off the map (torchvision's x_low = -1): an in-map
                     * point's weights sum to 1 */
                    if (t->w1 == 0.f && t->w2 == 0.f && t->w3 == 0.f && t->w4 == 0.f) continue;
                    if (pow2) {
                        df[t->p1] += gb * t->w1 * inv;
                        df[t->p2] += gb * t->w2 * inv;
                        df[t->p3] += gb * t->w3 * inv;
                        df[t->p4] += gb * t->w4 * inv;
                    } else {
                        df[t->p1] += gb * t->w1 / g.count;
                        df[t->p2] += gb * t->w2 / g.count;
                        df[t->p3] += gb * t->w3 / g.count;
                        df[t->p4] += gb * t->w4 / g.count;
                    }
                }
            }
        }
    }
    free(plan);
}

/* Both directions: the threads split the channels (chunk), so each map
 * plane has one writer. */
static void roi_run(float *out, const float *feat, float *dfeat, const float *dout,
                    const float *rois, int R, int N, int C, int H, int W, int PH, int PW,
                    float scale, int sampling_ratio, int aligned, const char *who)
{
    int oom = 0;
#pragma omp parallel reduction(| : oom)
    {
        int c0, c1;
        chunk(C, &c0, &c1);
        roi_pass(out, feat, dfeat, dout, rois, R, N, C, H, W, PH, PW, scale, sampling_ratio,
                 aligned, c0, c1, &oom);
    }
    /* a layer has no error return: a plan that does not fit in memory is a
     * broken invariant (it is PH*PW*grid^2 taps of 32 bytes) */
    if (oom) {
        ps_error("%s: out of memory for the sampling plan", who);
        abort();
    }
}

void ps_cpu_roi_align_forward(ps_ctx_t *ctx, float *out, const float *feat, const float *rois,
                              int R, int N, int C, int H, int W, int PH, int PW,
                              float spatial_scale, int sampling_ratio, int aligned)
{
    roi_run(out, feat, NULL, NULL, rois, R, N, C, H, W, PH, PW, spatial_scale, sampling_ratio,
            aligned, "roi_align forward");
}

void ps_cpu_roi_align_backward(ps_ctx_t *ctx, float *dfeat, const float *dout,
                               const float *rois, int R, int N, int C, int H, int W, int PH,
                               int PW, float spatial_scale, int sampling_ratio, int aligned)
{
    roi_run(NULL, NULL, dfeat, dout, rois, R, N, C, H, W, PH, PW, spatial_scale,
            sampling_ratio, aligned, "roi_align backward");
}
