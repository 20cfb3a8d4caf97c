/* Generated detection dataset (`psdata gen-det`, docs/detection.md):
 * shapes of several classes, sizes and colours on cluttered backgrounds,
 * several objects per image, written as JPEG images + COCO JSON:
 *
 *   out_dir/train/000001.jpg ...            n_images training images
 *   out_dir/val/000001.jpg ...              opts->n_val validation images
 *   out_dir/annotations/instances_train.json
 *   out_dir/annotations/instances_val.json
 *
 * (COCO's own layout; file_name is relative to the split's image folder.)
 * Categories: 1 circle, 2 square, 3 triangle, 4 diamond, 5 cross, 6 ring
 * (a circle with a hole; only with classes = 6).  A shape's pixels are the
 * pixels whose centres lie inside it.  Objects never overlap (a 2-pixel
 * gap), so every box is the tight extent of its shape's pixels; area is
 * the shape's pixel count (as COCO's segmentation area); iscrowd 0.  With
 * masks, each annotation also has its exact instance mask as COCO's
 * "segmentation": a polygon along the pixel edges for shapes with one run
 * of pixels per row (which pycocotools rasterises back to exactly those
 * pixels: coco_rle.h), a compressed RLE for the others (the ring, whose
 * hole a union of polygons cannot express).  The images are the same with
 * or without masks.  Clutter (thin lines, small dots, noise) is kept below
 * the smallest object size.  Deterministic for a given seed and options.
 */
#ifndef PS_GEN_DET_H
#define PS_GEN_DET_H
#include <stddef.h>
#include <stdint.h>

#define PS_DET_GEN_NCLASSES 6       /* shapes there are */
#define PS_DET_GEN_DEFAULT_CLASSES 5 /* shapes used by default (no ring) */

typedef struct ps_det_gen_opts {
    int n_val;            /* validation images (default max(1, n_images/5)) */
    int min_objects;      /* per image (default 2) */
    int max_objects;      /* per image (default 6; fewer if they do not fit) */
    float min_size;       /* object side as a fraction of the image side (0.12) */
    float max_size;       /* (0.40) */
    int quality;          /* JPEG quality (90) */
    int classes;          /* shape classes used, the first `classes` of the
                             six (1..6, default 5); categories lists only them */
    int masks;            /* 1: annotations carry "segmentation" (default 0) */
} ps_det_gen_opts_t;

void ps_det_gen_defaults(ps_det_gen_opts_t *o, int n_images);

/* Writes the dataset; size x size images (32..4096).  opts NULL = defaults.
 * Returns 0, PS_EINVAL (bad argument, message in err), PS_EIO (cannot
 * create/write, with the path and strerror), PS_ENOMEM. */
int ps_det_gen(const char *out_dir, int n_images, int size, uint64_t seed,
               const ps_det_gen_opts_t *opts, char *err, size_t errlen);

#endif
