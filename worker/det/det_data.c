/* Detection dataset and samples (contract in det_data.h). */
#include "worker/det/det_data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_video.h"
#include "worker/det/det_boxes.h"
#include "worker/det/det_masks.h"

struct ps_det_dataset {
    ps_coco_t coco;
    char *root;
    int K;
    int64_t *cat_of;        /* K category ids, ascending */
    int *index;             /* samples -> coco.images index */
    size_t n;
    /* per image: its annotations (indices into coco.anns) */
    int *ann_start, *ann_count, *ann_list;
    int max_inst;           /* training instances of the fullest sample */
    int unmasked;           /* first training instance without segmentation (-1: none) */
    size_t skipped_empty, skipped_records;
};

/* A training instance: a box with an extent, not a crowd region */
static int is_instance(const ps_coco_ann_t *an)
{
    return !an->iscrowd && an->bbox[2] > 0 && an->bbox[3] > 0;
}

/* Training instances of image ii (an index into coco.images) */
static int image_instances(const ps_det_dataset_t *ds, int ii)
{
    int n = 0;
    for (int j = 0; j < ds->ann_count[ii]; j++)
        n += is_instance(&ds->coco.anns[ds->ann_list[ds->ann_start[ii] + j]]);
    return n;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int ps_det_dataset_load(ps_det_dataset_t **out, const char *json, const char *image_root,
                        int train, int skip_bad, char *err, size_t errlen)
{
    *out = NULL;
    ps_det_dataset_t *ds = calloc(1, sizeof *ds);
    if (!ds) return ps_errf(err, errlen, "out of memory"), PS_ENOMEM;
    ps_coco_skips_t sk = {0, 0, 0};
    int rc = ps_coco_load(&ds->coco, json, skip_bad, &sk, err, errlen);
    if (rc) {
        free(ds);
        return rc;
    }
    ds->skipped_records = (size_t)sk.images + (size_t)sk.anns;
    const ps_coco_t *c = &ds->coco;
    ds->root = strdup(image_root ? image_root : "");
    ds->K = c->ncats;
    ds->cat_of = malloc(sizeof(int64_t) * (size_t)(c->ncats + 1));
    ds->index = malloc(sizeof(int) * (size_t)(c->nimages + 1));
    ds->ann_start = calloc((size_t)c->nimages + 1, sizeof(int));
    ds->ann_count = calloc((size_t)c->nimages + 1, sizeof(int));
    ds->ann_list = malloc(sizeof(int) * (size_t)(c->nanns + 1));
    if (!ds->root || !ds->cat_of || !ds->index || !ds->ann_start || !ds->ann_count ||
        !ds->ann_list) {
        ps_det_dataset_free(&ds);
        return ps_errf(err, errlen, "out of memory for %s", json), PS_ENOMEM;
    }
    if (ds->K < 1) {
        ps_errf(err, errlen, "%s: no categories", json);
        ps_det_dataset_free(&ds);
        return PS_ECORRUPT;
    }
    for (int k = 0; k < ds->K; k++) ds->cat_of[k] = c->cats[k].id;
    qsort(ds->cat_of, (size_t)ds->K, sizeof(int64_t), cmp_i64);
    /* group annotations by image (counting sort keeps file order) */
    int *img_of = malloc(sizeof(int) * (size_t)(c->nanns + 1));
    if (!img_of) {
        ps_det_dataset_free(&ds);
        return ps_errf(err, errlen, "out of memory"), PS_ENOMEM;
    }
    for (int a = 0; a < c->nanns; a++) {
        img_of[a] = ps_coco_find_image(c, c->anns[a].image_id);
        if (img_of[a] >= 0) ds->ann_count[img_of[a]]++;
    }
    for (int i = 1; i < c->nimages; i++) ds->ann_start[i] = ds->ann_start[i - 1] + ds->ann_count[i - 1];
    int *fill = calloc((size_t)c->nimages + 1, sizeof(int));
    if (!fill) {
        free(img_of);
        ps_det_dataset_free(&ds);
        return ps_errf(err, errlen, "out of memory"), PS_ENOMEM;
    }
    for (int a = 0; a < c->nanns; a++)
        if (img_of[a] >= 0) ds->ann_list[ds->ann_start[img_of[a]] + fill[img_of[a]]++] = a;
    free(fill);
    free(img_of);
    for (int i = 0; i < c->nimages; i++) {
        int boxes = image_instances(ds, i);
        if (train && !boxes) {
            ds->skipped_empty++;
            continue;
        }
        if (boxes > ds->max_inst) ds->max_inst = boxes;
        ds->index[ds->n++] = i;
    }
    ds->unmasked = -1;
    for (int a = 0; a < c->nanns && ds->unmasked < 0; a++)
        if (is_instance(&c->anns[a]) && c->anns[a].segm.kind == PS_COCO_SEGM_NONE) ds->unmasked = a;
    if (ds->n == 0) {
        ps_errf(err, errlen, "%s: no usable images (%d images, %zu without boxes)", json,
                c->nimages, ds->skipped_empty);
        ps_det_dataset_free(&ds);
        return PS_EINVAL;
    }
    *out = ds;
    return 0;
}

void ps_det_dataset_free(ps_det_dataset_t **dsp)
{
    ps_det_dataset_t *ds = *dsp;
    if (!ds) return;
    ps_coco_free(&ds->coco);
    free(ds->root), free(ds->cat_of), free(ds->index);
    free(ds->ann_start), free(ds->ann_count), free(ds->ann_list);
    free(ds);
    *dsp = NULL;
}

size_t ps_det_dataset_size(const ps_det_dataset_t *ds) { return ds->n; }
int ps_det_dataset_num_classes(const ps_det_dataset_t *ds) { return ds->K; }
int64_t ps_det_dataset_class_cat(const ps_det_dataset_t *ds, int k) { return ds->cat_of[k]; }
int64_t ps_det_dataset_image_id(const ps_det_dataset_t *ds, size_t i)
{
    return ds->coco.images[ds->index[i]].id;
}
const ps_coco_t *ps_det_dataset_coco(const ps_det_dataset_t *ds) { return &ds->coco; }
size_t ps_det_dataset_skipped_empty(const ps_det_dataset_t *ds) { return ds->skipped_empty; }
size_t ps_det_dataset_skipped_records(const ps_det_dataset_t *ds) { return ds->skipped_records; }
int ps_det_dataset_instances(const ps_det_dataset_t *ds, size_t i)
{
    return i < ds->n ? image_instances(ds, ds->index[i]) : 0;
}
int ps_det_dataset_max_instances(const ps_det_dataset_t *ds) { return ds->max_inst; }
const ps_coco_ann_t *ps_det_dataset_unmasked(const ps_det_dataset_t *ds)
{
    return ds->unmasked < 0 ? NULL : &ds->coco.anns[ds->unmasked];
}

void ps_det_data_opts_default(ps_det_data_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->size = 128;
    o->flip = 1;
    o->fg_iou = 0.5f;
    o->bg_iou = 0.4f;
    o->seed = 1;
    o->world = 1;
    o->batch = 1;
    o->shuffle = o->drop_last = -1;
    o->threads = 1;
    o->prefetch = 2;
}

int ps_det_data_opts_check(const ps_det_data_opts_t *o, char *err, size_t errlen)
{
    int mx = o->max_size ? o->max_size : o->size, mn = o->min_size ? o->min_size : o->size;
    if (o->size < 32 || o->size > 4096 || mx < 8 || mx > o->size || mn < 8 || mn > 4096)
        return ps_errf(err, errlen, "size %d, min_size %d, max_size %d: need 32 <= size <= 4096, "
                       "8 <= max_size <= size, min_size >= 8", o->size, mn, mx), PS_EINVAL;
    if (!(o->bg_iou > 0 && o->bg_iou <= o->fg_iou && o->fg_iou <= 1))
        return ps_errf(err, errlen, "IoU thresholds %g / %g: need 0 < bg <= fg <= 1",
                       (double)o->bg_iou, (double)o->fg_iou), PS_EINVAL;
    if (o->max_instances < 0 || o->max_instances > 100000)
        return ps_errf(err, errlen, "max_instances %d outside 0..100000", o->max_instances),
               PS_EINVAL;
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world || o->batch < 1 || o->threads < 0 ||
        o->threads > 64 || o->prefetch < 1 || o->prefetch > 64)
        return ps_errf(err, errlen, "rank %d / world %d, batch %d, threads %d, prefetch %d out "
                       "of range", o->rank, o->world, o->batch, o->threads, o->prefetch), PS_EINVAL;
    return 0;
}

static const float MEAN[3] = {0.485f, 0.456f, 0.406f}, STD[3] = {0.229f, 0.224f, 0.225f};

/* Reads and decodes image ii (path: root/file_name) into rgb (w x h); its
 * size must be the one the JSON gives */
static int read_image(const ps_det_dataset_t *ds, int ii, char *path, size_t pathlen,
                      uint8_t **rgb, int *w, int *h, char *err, size_t errlen)
{
    const ps_coco_image_t *im = &ds->coco.images[ii];
    if (snprintf(path, pathlen, "%s%s%s", ds->root, *ds->root ? "/" : "", im->file_name) >=
        (int)pathlen)
        return ps_errf(err, errlen, "image path too long: %s", im->file_name), PS_EINVAL;
    uint8_t *buf = NULL;
    size_t len;
    int rc;
    char e2[512];
    if ((rc = ps_read_file(path, &buf, &len, e2, sizeof e2)))
        return ps_errf(err, errlen, "image %lld: %s", (long long)im->id, e2), rc;
    rc = ps_jpeg_decode(buf, len, rgb, w, h, e2, sizeof e2);
    free(buf);
    if (rc) return ps_errf(err, errlen, "%s: %s", path, e2), rc;
    if (*w != im->width || *h != im->height) {
        free(*rgb);
        *rgb = NULL;
        return ps_errf(err, errlen, "%s: image is %dx%d, the annotations say %dx%d", path, *w, *h,
                       im->width, im->height), PS_ECORRUPT;
    }
    return 0;
}

/* Resizes rgb (w x h) with scale = min(min_size / shorter side, max_size /
 * longer side), each side rounded and kept within 1..size: *rs (nw x nh) */
static int resize_image(const ps_det_data_opts_t *o, const uint8_t *rgb, int w, int h,
                        uint8_t **rs, int *nw, int *nh, const char *path, char *err,
                        size_t errlen)
{
    int S = o->size, mx = o->max_size ? o->max_size : S, mn = o->min_size ? o->min_size : S;
    int sh = w < h ? w : h, lg = w < h ? h : w;
    double scale = (double)mn / sh;
    if (scale * lg > mx) scale = (double)mx / lg;
    *nw = (int)floor(w * scale + 0.5), *nh = (int)floor(h * scale + 0.5);
    if (*nw < 1) *nw = 1;
    if (*nh < 1) *nh = 1;
    if (*nw > S) *nw = S;
    if (*nh > S) *nh = S;
    *rs = malloc((size_t)*nw * *nh * 3);
    if (!*rs) return ps_errf(err, errlen, "out of memory"), PS_ENOMEM;
    int rc = ps_image_resize(rgb, w * 3, w, h, *rs, *nw, *nh);
    if (rc) {
        free(*rs);
        *rs = NULL;
        return ps_errf(err, errlen, "%s: resize to %dx%d failed", path, *nw, *nh), rc;
    }
    return 0;
}

/* ImageNet normalisation of rs (nw x nh, mirrored when flip) into img's top
 * left corner, zero padding the rest of its size x size planes */
static void normalize_pad(float *img, const uint8_t *rs, int nw, int nh, int S, int flip)
{
    size_t plane = (size_t)S * S;
    memset(img, 0, sizeof(float) * plane * 3);
    for (int y = 0; y < nh; y++)
        for (int x = 0; x < nw; x++) {
            const uint8_t *px = rs + ((size_t)y * nw + (flip ? nw - 1 - x : x)) * 3;
            for (int ch = 0; ch < 3; ch++)
                img[ch * plane + (size_t)y * S + x] = (px[ch] / 255.0f - MEAN[ch]) / STD[ch];
        }
}

/* Image ii's training boxes (not crowd, not empty) in the resized image
 * (scales sx, sy; mirrored in width nw when flip): gt (x1, y1, x2, y2) and
 * their classes, *M of them */
static int gt_boxes(const ps_det_dataset_t *ds, int ii, float sx, float sy, int nw, int flip,
                    float *gt, int32_t *cls, int *M, char *err, size_t errlen)
{
    *M = 0;
    for (int j = 0; j < ds->ann_count[ii]; j++) {
        const ps_coco_ann_t *an = &ds->coco.anns[ds->ann_list[ds->ann_start[ii] + j]];
        if (!is_instance(an)) continue;
        int k = 0;
        while (k < ds->K && ds->cat_of[k] != an->category_id) k++;
        if (k == ds->K) /* coco_json rejects unknown categories; keep the check local */
            return ps_errf(err, errlen, "annotation %lld: unknown category %lld", (long long)an->id,
                           (long long)an->category_id), PS_ECORRUPT;
        float x1 = (float)an->bbox[0] * sx, x2 = (float)(an->bbox[0] + an->bbox[2]) * sx;
        float y1 = (float)an->bbox[1] * sy, y2 = (float)(an->bbox[1] + an->bbox[3]) * sy;
        if (flip) {
            float t = (float)nw - x2;
            x2 = (float)nw - x1;
            x1 = t;
        }
        gt[4 * *M] = x1, gt[4 * *M + 1] = y1, gt[4 * *M + 2] = x2, gt[4 * *M + 3] = y2;
        cls[(*M)++] = k;
    }
    return 0;
}

/* Anchor assignment and RetinaNet targets (labels, box_targets) for image
 * ii's boxes; returns the positive anchors, or PS_E* with err set */
static int anchor_targets(const ps_det_dataset_t *ds, const ps_det_data_opts_t *o, int ii,
                          const float *anchors, int A, float sx, float sy, int nw, int flip,
                          int32_t *labels, float *box_targets, const char *path, char *err,
                          size_t errlen)
{
    int M, na = ds->ann_count[ii], rc;
    float *gt = malloc(sizeof(float) * 4 * (size_t)(na + 1));
    int32_t *cls = malloc(sizeof(int32_t) * (size_t)(na + 1));
    int32_t *matched = malloc(sizeof(int32_t) * (size_t)A);
    float *scratch = malloc(sizeof(float) * (size_t)A * (size_t)(na + 1));
    if (!gt || !cls || !matched || !scratch) {
        free(gt), free(cls), free(matched), free(scratch);
        return ps_errf(err, errlen, "out of memory"), PS_ENOMEM;
    }
    if ((rc = gt_boxes(ds, ii, sx, sy, nw, flip, gt, cls, &M, err, errlen))) {
        free(gt), free(cls), free(matched), free(scratch);
        return rc;
    }
    if (M == 0) {
        /* only on a dataset loaded without train: all background */
        for (int a = 0; a < A; a++) labels[a] = 0;
        memset(box_targets, 0, sizeof(float) * 4 * (size_t)A);
        rc = 0;
    } else {
        rc = ps_det_assign(matched, anchors, A, gt, M, o->fg_iou, o->bg_iou, scratch);
        if (rc >= 0)
            rc = ps_det_make_targets(labels, box_targets, matched, anchors, A, gt, cls, M, ds->K);
    }
    free(gt), free(cls), free(matched), free(scratch);
    if (rc < 0) ps_errf(err, errlen, "%s: anchor assignment failed (%s)", path, ps_strerror(rc));
    return rc;
}

int ps_det_load_sample(const ps_det_dataset_t *ds, const ps_det_data_opts_t *o,
                       const float *anchors, int A, uint64_t epoch, size_t index, float *img,
                       int32_t *labels, float *box_targets, ps_det_geom_t *geom, int *npos,
                       char *err, size_t errlen)
{
    if (index >= ds->n) return ps_errf(err, errlen, "sample %zu out of range", index), PS_EINVAL;
    int ii = ds->index[index];
    char path[4096];
    uint8_t *rgb = NULL, *rs = NULL;
    int w, h, nw, nh;
    int rc = read_image(ds, ii, path, sizeof path, &rgb, &w, &h, err, errlen);
    if (rc) return rc;
    rc = resize_image(o, rgb, w, h, &rs, &nw, &nh, path, err, errlen);
    free(rgb);
    if (rc) return rc;
    int flip = 0;
    if (o->train && o->flip) {
        ps_vrng_t r = ps_vrng_sample(o->seed, epoch, (uint64_t)index);
        flip = ps_vrng_below(&r, 2) == 1;
    }
    normalize_pad(img, rs, nw, nh, o->size, flip);
    free(rs);
    /* exact per-axis scales: the resized size was rounded */
    float sx = (float)nw / w, sy = (float)nh / h;
    if (geom) *geom = (ps_det_geom_t){sx, nw, nh, w, h, flip};
    if (npos) *npos = 0;
    if (!labels) return 0;
    rc = anchor_targets(ds, o, ii, anchors, A, sx, sy, nw, flip, labels, box_targets, path, err,
                        errlen);
    if (rc < 0) return rc;
    if (npos) *npos = rc;
    return 0;
}

/* Instance j's mask (annotation an of image im, orig_w x orig_h) into slot
 * (size x size), resized to the geometry's w x h and mirrored with it */
static int instance_mask(const ps_coco_ann_t *an, const ps_coco_image_t *im,
                         const ps_det_geom_t *g, int size, uint8_t *slot, uint8_t *scratch,
                         char *err, size_t errlen)
{
    ps_rle_t r;
    int rc = ps_coco_segm_rle(&an->segm, im->height, im->width, &r);
    if (rc == PS_EINVAL)
        return ps_errf(err, errlen, "annotation %lld (image %lld): no segmentation, and masks "
                       "are asked for", (long long)an->id, (long long)im->id), PS_EINVAL;
    if (rc) return ps_errf(err, errlen, "out of memory"), rc;
    ps_rle_decode(&r, scratch, im->width);
    ps_rle_free(&r);
    memset(slot, 0, (size_t)size * size);
    ps_det_mask_resize(slot, size, g->h, g->w, scratch, im->width, im->height, im->width, g->flip);
    return 0;
}

int ps_det_sample_instances(const ps_det_dataset_t *ds, const ps_det_data_opts_t *o, size_t index,
                            const ps_det_geom_t *g, float *boxes, int32_t *classes,
                            uint8_t *masks, int max_inst, char *err, size_t errlen)
{
    if (index >= ds->n) return ps_errf(err, errlen, "sample %zu out of range", index), PS_EINVAL;
    int ii = ds->index[index], M, rc;
    const ps_coco_image_t *im = &ds->coco.images[ii];
    int n = image_instances(ds, ii);
    if (n > max_inst)
        return ps_errf(err, errlen, "image %lld (%s): %d instances, more than the %d a batch "
                       "holds (max_instances)", (long long)im->id, im->file_name, n, max_inst),
               PS_ERANGE;
    float sx = (float)g->w / g->orig_w, sy = (float)g->h / g->orig_h;
    if ((rc = gt_boxes(ds, ii, sx, sy, g->w, g->flip, boxes, classes, &M, err, errlen))) return rc;
    if (!masks) return M;
    uint8_t *scratch = malloc((size_t)im->width * im->height);
    if (!scratch) return ps_errf(err, errlen, "out of memory"), PS_ENOMEM;
    size_t plane = (size_t)o->size * o->size;
    for (int j = 0, k = 0; j < ds->ann_count[ii] && !rc; j++) {
        const ps_coco_ann_t *an = &ds->coco.anns[ds->ann_list[ds->ann_start[ii] + j]];
        if (!is_instance(an)) continue;
        rc = instance_mask(an, im, g, o->size, masks + plane * k++, scratch, err, errlen);
    }
    free(scratch);
    return rc ? rc : M;
}
