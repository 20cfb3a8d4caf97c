/* Instance masks: torchvision's nearest resize and mask targets
 * and the inference masks pasted into the image (contracts in det_masks.h). */
#include "worker/det/det_masks.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

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

/* torch's bilinear source index (align_corners=False): the lower tap, its
 * weight on the upper one, and whether an upper one exists */
static void bilinear_src(int dst, float scale, int in, int *lo, float *lambda, int *step)
{
    float src = scale * ((float)dst + 0.5f) - 0.5f;
    if (src < 0) src = 0;
    *lo = (int)src;
    *step = *lo < in - 1;
    *lambda = src - (float)*lo;
}

int ps_det_mask_paste(float *out, int h, int w, const float *prob, int M, const float box[4])
{
    memset(out, 0, sizeof(float) * (size_t)h * w);
    int P = M + 2;
    float scale = (float)((double)P / M);
    float wh = (box[2] - box[0]) * 0.5f * scale, hh = (box[3] - box[1]) * 0.5f * scale;
    float xc = (box[2] + box[0]) * 0.5f, yc = (box[3] + box[1]) * 0.5f;
    long b0 = (long)(xc - wh), b1 = (long)(yc - hh), b2 = (long)(xc + wh), b3 = (long)(yc + hh);
    long bw = b2 - b0 + 1 > 1 ? b2 - b0 + 1 : 1, bh = b3 - b1 + 1 > 1 ? b3 - b1 + 1 : 1;
    long x0 = b0 > 0 ? b0 : 0, x1 = b2 + 1 < w ? b2 + 1 : w;
    long y0 = b1 > 0 ? b1 : 0, y1 = b3 + 1 < h ? b3 + 1 : h;
    if (x1 <= x0 || y1 <= y0) return 0;
    /* the padded mask: a zero border of one pixel */
    float *pad = calloc((size_t)P * P, sizeof *pad);
    if (!pad) {
        ps_error("mask paste: out of memory");
        return PS_ENOMEM;
    }
    for (int y = 0; y < M; y++)
        memcpy(pad + (size_t)(y + 1) * P + 1, prob + (size_t)y * M, sizeof(float) * M);
    float sy = (float)P / (float)bh, sx = (float)P / (float)bw;
    for (long y = y0; y < y1; y++) {
        int ty, dy;
        float ly;
        bilinear_src((int)(y - b1), sy, P, &ty, &ly, &dy);
        const float *r0 = pad + (size_t)ty * P, *r1 = r0 + (size_t)dy * P;
        for (long x = x0; x < x1; x++) {
            int tx, dx;
            float lx;
            bilinear_src((int)(x - b0), sx, P, &tx, &lx, &dx);
            float top = (1.0f - lx) * r0[tx] + lx * r0[tx + dx];
            float bot = (1.0f - lx) * r1[tx] + lx * r1[tx + dx];
            out[(size_t)y * w + x] = (1.0f - ly) * top + ly * bot;
        }
    }
    free(pad);
    return 0;
}
