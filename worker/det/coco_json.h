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
 *   - area optional (default w*h), >= 0; iscrowd optional (0/1 or bool).
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

#define PS_COCO_BOX_SLACK 1.0

typedef struct ps_coco_image {
    int64_t id;
    int width, height;
    char *file_name;       /* "" when absent */
} ps_coco_image_t;

typedef struct ps_coco_ann {
    int64_t id, image_id;
    int64_t category_id;
    double bbox[4];        /* x, y, w, h (pixels, top-left origin) */
    double area;           /* segmentation area in COCO; used for small/medium/large */
    int iscrowd;
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

/* Detections (results format) checked against gt; *dets malloc'd. */
int ps_coco_parse_dets(ps_coco_det_t **dets, int *ndets, const char *text, size_t len,
                       const char *name, const ps_coco_t *gt, int lenient,
                       ps_coco_skips_t *skips, char *err, size_t errlen);
int ps_coco_load_dets(ps_coco_det_t **dets, int *ndets, const char *path, const ps_coco_t *gt,
                      int lenient, ps_coco_skips_t *skips, char *err, size_t errlen);

/* Writers (numbers with %.17g, so a load gives back the same doubles). */
int ps_coco_save(const ps_coco_t *c, const char *path, char *err, size_t errlen);
int ps_coco_save_dets(const ps_coco_det_t *dets, int ndets, const char *path, char *err,
                      size_t errlen);

#endif
