/* COCO-format JSON through cJSON: ground truth (images,
 * annotations with bbox [x,y,w,h], category_id, area, iscrowd; categories)
 * and detections in the results format ([{image_id, category_id, bbox,
 * score}, ...]).  Writers too, for the generator and for evaluation output.
 *
 * Validation (every message names the file and the field, e.g.
 * "instances_val.json: annotations[12].bbox: [630,2,20,20] outside image 7
 * (640x480)"):
 *   - malformed JSON (with line:column), missing or mistyped fields;
 *   - duplicate image / annotation / category ids;
 *   - annotations or detections naming an unknown image_id or category_id
 *     (pycocotools asserts on unknown images and silently drops unknown
 *     categories; we say so);
 *   - GT boxes with w or h < 0, non-finite numbers, or outside the image by
 *     more than PS_COCO_BOX_SLACK pixels (COCO's polygon-derived boxes poke
 *     out by fractions of a pixel); detection boxes only need to be finite
 *     with w, h >= 0 (a detector may predict past the border);
 *   - area optional (default: the mask's pixel count with a segmentation,
 *     else w*h), >= 0; iscrowd optional (0/1 or bool);
 *   - segmentation optional (coco_segm.c): polygons [[x,y,...],...] (each an
 *     even count of finite numbers, at least 3 points, every point inside
 *     the image but for PS_COCO_BOX_SLACK), an uncompressed RLE {"size":
 *     [h,w], "counts": [n,...]} or a compressed one (counts a string,
 *     coco_rle.h); an RLE's size must be the image's and its counts must sum
 *     to h*w.  Messages name the annotation's index and id: "t.json:
 *     annotations[3] (id 17).segmentation[1]: odd number of coordinates (7)".
 *     Detections (results) may carry an RLE segmentation (never polygons,
 *     as pycocotools' loadRes), read by ps_coco_parse_results.
 * Strict mode (lenient = 0): the first bad record is an error (PS_ECORRUPT,
 * PS_EINVAL for a bad argument).  Lenient mode: a bad image / annotation /
 * detection is skipped with a warning and counted in ps_coco_skips_t (an
 * annotation of a skipped image is then skipped too, as unknown image);
 * malformed JSON, a bad top-level structure, bad categories and duplicate
 * ids stay errors (no way to tell which duplicate is right).
 */
#ifndef PS_COCO_JSON_H
#define PS_COCO_JSON_H
#include <stddef.h>
#include <stdint.h>

#include "worker/det/coco_rle.h"

#define PS_COCO_BOX_SLACK 1.0

typedef struct ps_coco_image {
    int64_t id;
    int width, height;
    char *file_name;       /* "" when absent */
} ps_coco_image_t;

/* An annotation's segmentation, in the form the file gives it (written
 * back in that form). */
enum {
    PS_COCO_SEGM_NONE = 0,  /* no segmentation */
    PS_COCO_SEGM_POLY,      /* polygons */
    PS_COCO_SEGM_RLE,       /* uncompressed RLE (counts list) */
    PS_COCO_SEGM_RLE_STR    /* compressed RLE (counts string) */
};

typedef struct ps_coco_segm {
    int kind;              /* PS_COCO_SEGM_* */
    int npoly;             /* POLY: polygons */
    int *poly_len;         /* POLY: points of each (>= 3) */
    double *xy;            /* POLY: their x, y pairs, one polygon after another */
    ps_rle_t rle;          /* RLE, RLE_STR: the mask at the image's size */
} ps_coco_segm_t;

typedef struct ps_coco_ann {
    int64_t id, image_id;
    int64_t category_id;
    double bbox[4];        /* x, y, w, h (pixels, top-left origin) */
    double area;           /* segmentation area in COCO; used for small/medium/large */
    int iscrowd;
    ps_coco_segm_t segm;   /* kind PS_COCO_SEGM_NONE without one */
} ps_coco_ann_t;

typedef struct ps_coco_cat {
    int64_t id;
    char *name;
} ps_coco_cat_t;

typedef struct ps_coco {
    ps_coco_image_t *images;  /* file order */
    int nimages;
    ps_coco_ann_t *anns;      /* file order (kept: evaluation ties depend on it) */
    int nanns;
    ps_coco_cat_t *cats;
    int ncats;
    /* lookup (built by the loader, or by ps_coco_index()) */
    int64_t *img_sorted_ids;  /* nimages ids ascending */
    int *img_sorted_idx;      /* index into images[] for each sorted id */
} ps_coco_t;

typedef struct ps_coco_det {
    int64_t image_id;
    int64_t category_id;
    double bbox[4];           /* x, y, w, h */
    double score;
} ps_coco_det_t;

typedef struct ps_coco_skips {
    int images, anns, dets;   /* records skipped in lenient mode */
} ps_coco_skips_t;

/* Parses ground truth from text (name is used in messages) or a file.
 * On error *out is left empty (nothing to free) and err says why.
 * skips may be NULL. */
int ps_coco_parse(ps_coco_t *out, const char *text, size_t len, const char *name, int lenient,
                  ps_coco_skips_t *skips, char *err, size_t errlen);
int ps_coco_load(ps_coco_t *out, const char *path, int lenient, ps_coco_skips_t *skips,
                 char *err, size_t errlen);
void ps_coco_free(ps_coco_t *c);
/* (Re)builds the image-id lookup after filling a ps_coco_t by hand;
 * PS_EINVAL on duplicate image ids, PS_ENOMEM. */
int ps_coco_index(ps_coco_t *c, char *err, size_t errlen);
/* Index into c->images of an image id, or -1. */
int ps_coco_find_image(const ps_coco_t *c, int64_t id);
/* Index into c->cats of a category id, or -1. */
int ps_coco_find_cat(const ps_coco_t *c, int64_t id);

/* The mask of a segmentation in an h x w image (pycocotools' annToRLE:
 * polygons rasterised and merged, an RLE copied) into *out.  PS_EINVAL
 * without a segmentation, PS_ENOMEM. */
int ps_coco_segm_rle(const ps_coco_segm_t *s, int h, int w, ps_rle_t *out);
void ps_coco_segm_free(ps_coco_segm_t *s);

/* Detections (results format) checked against gt; *dets malloc'd. */
int ps_coco_parse_dets(ps_coco_det_t **dets, int *ndets, const char *text, size_t len,
                       const char *name, const ps_coco_t *gt, int lenient,
                       ps_coco_skips_t *skips, char *err, size_t errlen);
int ps_coco_load_dets(ps_coco_det_t **dets, int *ndets, const char *path, const ps_coco_t *gt,
                      int lenient, ps_coco_skips_t *skips, char *err, size_t errlen);

/* Results with masks: as ps_coco_parse_dets, with (*masks)[i] the RLE of
 * the i-th detection kept (malloc'd; free each with ps_rle_free).  Every
 * detection needs a "segmentation" RLE of its image's size; its "bbox" may
 * be left out (then pycocotools' toBbox of the mask). */
int ps_coco_parse_results(ps_coco_det_t **dets, ps_rle_t **masks, int *ndets, const char *text,
                          size_t len, const char *name, const ps_coco_t *gt, int lenient,
                          ps_coco_skips_t *skips, char *err, size_t errlen);
int ps_coco_load_results(ps_coco_det_t **dets, ps_rle_t **masks, int *ndets, const char *path,
                         const ps_coco_t *gt, int lenient, ps_coco_skips_t *skips, char *err,
                         size_t errlen);

/* Writers (numbers printed so that a load gives back the same doubles;
 * written to a temporary file renamed over path, so a failed write leaves
 * no half-written file). */
int ps_coco_save(const ps_coco_t *c, const char *path, char *err, size_t errlen);
int ps_coco_save_dets(const ps_coco_det_t *dets, int ndets, const char *path, char *err,
                      size_t errlen);
/* The results file of a detector (COCO's results format, which pycocotools'
 * loadRes reads): image_id, category_id, bbox [x,y,w,h], score and, with
 * masks (may be NULL), "segmentation" {"size": [h,w], "counts": compressed
 * RLE string}. */
int ps_coco_save_results(const ps_coco_det_t *dets, const ps_rle_t *masks, int ndets,
                         const char *path, char *err, size_t errlen);

#endif
