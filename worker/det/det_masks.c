/* Instance masks: torchvision's nearest resize and mask targets
 * (contracts in det_masks.h). */
#include "worker/det/det_masks.h"

#include <math.h>
#include <stddef.h>

#include "ps_util.h"

void ps_det_mask_resize(uint8_t *dst, int dst_stride, int oh, int ow, const uint8_t *src,
                        int src_stride, int ih, int iw, int flip)
{
    for (int y = 0; y < oh; y++) {
        const uint8_t *row = src + (size_t)ps_nearest_src(y, ih, oh) * src_stride;
        uint8_t *d = dst + (size_t)y * dst_stride;
        for (int x = 0; x < ow; x++) d[flip ? ow - 1 - x : x] = row[ps_nearest_src(x, iw, ow)];
    }
}

/* One bilinear sample of mask at (y, x) with roi_align's edge rules */
static float sample(const uint8_t *mask, int stride, int h, int w, float y, float x)
{
    if (y < -1.0f || y > (float)h || x < -1.0f || x > (float)w) return 0;
    if (y <= 0) y = 0;
    if (x <= 0) x = 0;
    int y0 = (int)y, x0 = (int)x, y1, x1;
    if (y0 >= h - 1) y1 = y0 = h - 1, y = (float)y0;
    else y1 = y0 + 1;
    if (x0 >= w - 1) x1 = x0 = w - 1, x = (float)x0;
    else x1 = x0 + 1;
    float ly = y - (float)y0, lx = x - (float)x0, hy = 1.0f - ly, hx = 1.0f - lx;
    float w1 = hy * hx, w2 = hy * lx, w3 = ly * hx, w4 = ly * lx;
    const uint8_t *r0 = mask + (size_t)y0 * stride, *r1 = mask + (size_t)y1 * stride;
    /* the kernel's order: w1*v1 + w2*v2 + w3*v3 + w4*v4, left to right */
    return w1 * (float)r0[x0] + w2 * (float)r0[x1] + w3 * (float)r1[x0] + w4 * (float)r1[x1];
}

void ps_det_mask_target(float *out, int M, const uint8_t *mask, int stride, int h, int w,
                        const float box[4])
{
    float x1 = box[0], y1 = box[1];
    float bw = fmaxf(box[2] - x1, 1.0f), bh = fmaxf(box[3] - y1, 1.0f);
    float bin_w = bw / (float)M, bin_h = bh / (float)M;
    int gw = (int)ceilf(bw / (float)M), gh = (int)ceilf(bh / (float)M);
    float count = (float)(gh * gw > 1 ? gh * gw : 1);
    for (int ph = 0; ph < M; ph++)
        for (int pw = 0; pw < M; pw++) {
            float acc = 0;
            for (int iy = 0; iy < gh; iy++) {
                float y = y1 + (float)ph * bin_h + ((float)iy + .5f) * bin_h / (float)gh;
                for (int ix = 0; ix < gw; ix++) {
                    float x = x1 + (float)pw * bin_w + ((float)ix + .5f) * bin_w / (float)gw;
                    acc += sample(mask, stride, h, w, y, x);
                }
            }
            out[ph * M + pw] = acc / count;
        }
}
