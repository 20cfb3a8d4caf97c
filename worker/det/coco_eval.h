/* COCO-style evaluation in C with pycocotools' COCOeval semantics
 * (iouType "bbox" or "segm", useCats 1, default Params):
 *   - images: all GT image ids, ascending; categories: all GT category ids,
 *     ascending (a category without GT boxes gets precision -1 and is left
 *     out of every mean, as pycocotools);
 *   - per image and category: detections sorted by descending score, stable
 *     (mergesort: ties keep their order in the detections file), cut to
 *     maxDets 100; IoU of boxes as maskApi's bbIou, or of masks as its
 *     rleIou (segm; coco_rle.h), a crowd GT's union being the detection's
 *     area in both;
 *   - segm: a GT's mask is its segmentation at its image's size (polygons
 *     rasterised and merged); a detection's area is its mask's pixel count
 *     (pycocotools' loadRes of results without "bbox": Detectron2 drops the
 *     box before a segm evaluation, torchvision's reference never writes
 *     one, so small / medium / large go by mask area); every GT needs a
 *     segmentation and every mask its image's size (else PS_EINVAL, the
 *     record named in the log);
 *   - per area range (all [0,1e10], small [0,32^2], medium [32^2,96^2],
 *     large [96^2,1e10], by the GT's 'area', bounds inclusive) and IoU
 *     threshold (.50:.05:.95): GT ignored if crowd or outside the range,
 *     non-ignored GTs first (stable); greedy matching in score order, a
 *     detection taking the best-IoU GT not yet matched (crowd GTs can be
 *     matched repeatedly), never leaving a regular GT for an ignored one,
 *     later GTs winning IoU ties; a detection matched to an ignored GT is
 *     ignored, so is an unmatched one whose area (w*h) is outside the range;
 *   - accumulation per category, area and maxDets (1, 10, 100): detections
 *     of all images (image-id order) stably sorted by score, cumulative
 *     TP/FP, precision tp/(tp+fp+eps) made monotone from the right, sampled
 *     at the 101 recall points 0:.01:1 (searchsorted left; points beyond the
 *     last recall give 0); recall = last cumulative recall.
 * One documented difference: pycocotools tests "matched" with the GT's id
 * (an annotation id 0 would count as unmatched there); we keep a flag.
 */
#ifndef PS_COCO_EVAL_H
#define PS_COCO_EVAL_H
#include "worker/det/coco_json.h"

/* stats[] index, same order as COCOeval.stats */
enum {
    PS_COCO_AP = 0,     /* AP @[.50:.95], area all, maxDets 100 */
    PS_COCO_AP50,
    PS_COCO_AP75,
    PS_COCO_AP_SMALL,
    PS_COCO_AP_MEDIUM,
    PS_COCO_AP_LARGE,
    PS_COCO_AR1,        /* AR @[.50:.95], maxDets 1 */
    PS_COCO_AR10,
    PS_COCO_AR100,
    PS_COCO_AR_SMALL,   /* maxDets 100 */
    PS_COCO_AR_MEDIUM,
    PS_COCO_AR_LARGE,
    PS_COCO_NSTATS
};

typedef struct ps_coco_eval_result {
    double stats[PS_COCO_NSTATS];  /* -1 where nothing is defined */
    int ncats;
    int64_t *cat_ids;              /* ncats, ascending */
    double *cat_ap;                /* AP @[.50:.95], all, 100 per category; -1 without GT */
    double *cat_ap50;
} ps_coco_eval_result_t;

/* Evaluates dets against gt (indexed by the loader).  Detections of
 * categories or images not in gt are ignored (the loader already rejects
 * them).  Returns 0, PS_ENOMEM or PS_EINVAL (gt not indexed). */
int ps_coco_evaluate(ps_coco_eval_result_t *res, const ps_coco_t *gt, const ps_coco_det_t *dets,
                     int ndets);
/* The same with iouType "segm": masks[i] is detection i's mask (its bbox
 * is not read). */
int ps_coco_evaluate_segm(ps_coco_eval_result_t *res, const ps_coco_t *gt,
                          const ps_coco_det_t *dets, const ps_rle_t *masks, int ndets);
/* "<p>map=%.4f <p>ap50=%.4f <p>ap75=%.4f" with prefix p ("" for boxes,
 * "segm_" for masks): the keys of the detectors' val: and final: lines.
 * Returns snprintf's count. */
int ps_coco_eval_keys(const ps_coco_eval_result_t *res, const char *prefix, char *buf, size_t len);
void ps_coco_eval_free(ps_coco_eval_result_t *res);
/* The 12-line summary pycocotools prints, into buf. */
void ps_coco_eval_format(const ps_coco_eval_result_t *res, char *buf, size_t len);

#endif
