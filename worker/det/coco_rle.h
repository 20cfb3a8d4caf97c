/* COCO run-length encoded (RLE) masks with the semantics of pycocotools'
 * mask API (maskApi.c, pycocotools 2.0), so that masks, areas, boxes and
 * IoUs equal pycocotools' bit for bit (tests/test_coco_mask.c against
 * tests/golden/gen_coco_masks.py):
 *   - an h x w mask is read in column-major order (pixel (x, y) at x*h + y,
 *     COCO's order) as runs alternating 0s and 1s, the first a run of 0s
 *     (empty when the mask starts with a 1); the runs sum to h*w.  Our masks
 *     in memory are row-major (pixel (x, y) at y*stride + x): encode and
 *     decode transpose;
 *   - coordinates: pixel (x, y) covers [x, x+1) x [y, y+1), so a polygon
 *     [0,0, 1,0, 1,1, 0,1] covers exactly the first pixel;
 *   - polygon rasterisation (frPyObjects): vertices rounded to 1/5 pixel,
 *     the boundary walked on that grid, and a pixel is inside when its
 *     centre is inside by the crossing rule (odd number of boundary
 *     crossings above it in its column); points outside the image are
 *     clipped to it;
 *   - merge (union or intersection) gives canonical runs (no empty run but
 *     the first): pycocotools' result for canonical inputs, the same mask
 *     always;
 *   - IoU: |a & b| / |a | b|, or |a & b| / |dt| when the GT is a crowd
 *     region; 0 when the masks do not meet;
 *   - box: [x, y, w, h] of the pixels, with pycocotools' quirk that a run
 *     of 1s crossing a column boundary makes the box full height;
 *   - compressed string: pycocotools' LEB128-like code, 5 bits per
 *     character in ASCII 48..111, each count from the third on stored as
 *     the difference to the count two before.
 * Every function that allocates returns 0, PS_ENOMEM or PS_EINVAL (bad
 * argument, message in err where there is one); an RLE owns its counts. */
#ifndef PS_COCO_RLE_H
#define PS_COCO_RLE_H
#include <stddef.h>
#include <stdint.h>

/* The largest h*w an RLE may describe (counts are 32-bit, as COCO's). */
#define PS_RLE_MAX_PIXELS 0xFFFFFFFFull
/* The most boundary points (on the 1/5-pixel grid) a polygon may have:
 * a perimeter of 3.3 million pixels. */
#define PS_RLE_MAX_POLY_POINTS (1u << 24)

typedef struct ps_rle {
    int h, w;          /* the image's height and width */
    int m;             /* runs */
    uint32_t *cnts;    /* m run lengths, 0s first (NULL when m == 0) */
} ps_rle_t;

void ps_rle_free(ps_rle_t *r);
/* r = a copy of cnts[m] for an h x w image (not checked: ps_rle_check). */
int ps_rle_set(ps_rle_t *r, int h, int w, const uint32_t *cnts, int m);
/* Counts sum to h*w (PS_ECORRUPT with the sum in err otherwise). */
int ps_rle_check(const ps_rle_t *r, char *err, size_t errlen);

/* mask: h rows of w bytes, row stride `stride`; nonzero = 1. */
int ps_rle_encode(ps_rle_t *r, const uint8_t *mask, int stride, int h, int w);
/* mask: h rows of w bytes 0/1 at row stride `stride` (r must be checked). */
void ps_rle_decode(const ps_rle_t *r, uint8_t *mask, int stride);

/* One polygon of k points xy[2k] (x, y pairs, finite, |v| <= 1e6) in an
 * h x w image (pycocotools' frPyObjects of one polygon); PS_EINVAL beyond
 * PS_RLE_MAX_POLY_POINTS. */
int ps_rle_from_polygon(ps_rle_t *r, const double *xy, int k, int h, int w);
/* Union (intersect 0) or intersection of n >= 1 masks of one size into
 * *out (a new RLE; may not alias the inputs).  PS_EINVAL on sizes that
 * differ. */
int ps_rle_merge(ps_rle_t *out, const ps_rle_t *rs, int n, int intersect);

/* Pixels set. */
uint64_t ps_rle_area(const ps_rle_t *r);
/* [x, y, w, h] as pycocotools' toBbox (zeros for an empty mask). */
void ps_rle_to_bbox(const ps_rle_t *r, double bb[4]);
/* IoU of a detection and a GT mask (crowd: intersection / detection's
 * area); -1 when their sizes differ, as pycocotools. */
double ps_rle_iou(const ps_rle_t *dt, const ps_rle_t *gt, int crowd);

/* The compressed string (malloc'd, NUL-terminated), or NULL (no memory). */
char *ps_rle_to_string(const ps_rle_t *r);
/* Parses a compressed string of len bytes for an h x w image.  Errors
 * (PS_ECORRUPT, err says which and where): a character outside 48..111, a
 * count cut off at the end, a count longer than 7 characters, a negative
 * or too-large count, counts not summing to h*w. */
int ps_rle_from_string(ps_rle_t *r, const char *s, size_t len, int h, int w, char *err,
                       size_t errlen);

#endif
