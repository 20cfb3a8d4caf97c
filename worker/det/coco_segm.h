/* COCO "segmentation" fields in JSON, for coco_json.c (the rules are in
 * coco_json.h; the masks' semantics in coco_rle.h).  Internal to
 * worker/det: these take cJSON items. */
#ifndef PS_COCO_SEGM_H
#define PS_COCO_SEGM_H
#include <cjson/cJSON.h>

#include "worker/det/coco_json.h"

/* Parses segmentation item it of a record in an h x w image into *s
 * (results: RLE only).  where names the record in messages ("t.json:
 * annotations[3] (id 17)").  0, PS_ECORRUPT (err says why), PS_ENOMEM;
 * on error *s is left empty. */
int ps_coco_segm_parse(ps_coco_segm_t *s, const cJSON *it, int h, int w, int results,
                       const char *where, char *err, size_t errlen);
/* The JSON of s in its own form (NULL: no memory). */
cJSON *ps_coco_segm_json(const ps_coco_segm_t *s);
/* {"size": [h, w], "counts": "<compressed>"} (NULL: no memory). */
cJSON *ps_coco_rle_json(const ps_rle_t *r);

#endif
