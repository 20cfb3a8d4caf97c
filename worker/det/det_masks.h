/* Instance masks in the detection pipeline, with torchvision's (0.14)
 * arithmetic so that a Mask R-CNN's targets equal torchvision's:
 *   - ps_det_mask_resize: a mask to the network's image size as
 *     GeneralizedRCNNTransform resizes target masks (F.interpolate, mode
 *     "nearest": source index floor(dst * (float)in / out), at most in - 1,
 *     in float), then mirrored when the image is;
 *   - ps_det_mask_target: the M x M training target of one ground-truth
 *     mask for one box, as roi_heads.project_masks_on_boxes makes it:
 *     torchvision.ops.roi_align of the 0/1 mask as floats, spatial scale 1,
 *     sampling_ratio -1 (ceil(box side / M) points per bin and axis),
 *     aligned=False (box sides at least 1 pixel), bilinear samples with
 *     torchvision's edge rules (zero beyond one pixel outside the mask,
 *     clamped to the last row / column), all in float.
 * Masks are uint8 0/1, row-major with a row stride; h x w is the image as
 * resized (ps_det_geom_t w, h), not the padded input: torchvision's masks
 * are never padded, and roi_align's edge rules see their true size.
 * Checked against torchvision in tests/test_det_masks.c
 * (tests/golden/gen_det_masks.py). */
#ifndef PS_DET_MASKS_H
#define PS_DET_MASKS_H
#include <stdint.h>

/* dst (oh x ow at dst_stride) from src (ih x iw at src_stride); flip:
 * mirrored left-right after the resize. */
void ps_det_mask_resize(uint8_t *dst, int dst_stride, int oh, int ow, const uint8_t *src,
                        int src_stride, int ih, int iw, int flip);

/* out (M x M floats in [0, 1]) for box (x1, y1, x2, y2) in mask pixels. */
void ps_det_mask_target(float *out, int M, const uint8_t *mask, int stride, int h, int w,
                        const float box[4]);

/* Mask R-CNN inference: one detection's M x M mask probabilities pasted
 * into an h x w image at box (x1, y1, x2, y2, image pixels), as
 * torchvision's paste_masks_in_image (padding 1): the mask padded with a
 * zero border to M + 2, the box widened about its centre by (M + 2) / M
 * (float) and truncated to integers, the padded mask resized to the box's
 * (x2 - x1 + 1) x (y2 - y1 + 1) pixels (F.interpolate bilinear,
 * align_corners=False, in float) and written where it lies inside the
 * image; out (h x w floats, row stride w) is 0 elsewhere.  A box wholly
 * outside the image gives an empty mask (torchvision's negative slices
 * would err or paste elsewhere; its clipped detections never meet that).
 * Returns 0 or PS_ENOMEM. */
int ps_det_mask_paste(float *out, int h, int w, const float *prob, int M, const float box[4]);

#endif
