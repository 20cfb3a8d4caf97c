/* COCO JSON loading and saving through cJSON (contracts in coco_json.h). */
#include "worker/det/coco_json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_util.h"
#include "worker/det/coco_segm.h"

/* ps_fail (ps_util.h) with this file's argument order */
#define fail(err, n, code, ...) ps_fail((code), (err), (n), __VA_ARGS__)

/* Parse with a line:column on error. */
static cJSON *parse_json(const char *text, size_t len, const char *name, char *err, size_t n)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (root) return root;
    int line = 1, col = 1;
    size_t pos = end && end >= text ? (size_t)(end - text) : 0;
    for (size_t i = 0; i < pos && i < len; i++) {
        if (text[i] == '\n') line++, col = 1;
        else col++;
    }
    fail(err, n, PS_ECORRUPT, "%s:%d:%d: malformed JSON", name, line, col);
    return NULL;
}

/* An integer-valued number field (ids, sizes). */
static int get_int(const cJSON *obj, const char *key, int64_t *v, int required, int64_t dflt,
                   const char *name, const char *where, int idx, char *err, size_t n)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) {
        if (!required) {
            *v = dflt;
            return 0;
        }
        return fail(err, n, PS_ECORRUPT, "%s: %s[%d]: missing field '%s'", name, where, idx, key);
    }
    if (cJSON_IsBool(it)) {
        *v = cJSON_IsTrue(it);
        return 0;
    }
    double d = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0)
        return fail(err, n, PS_ECORRUPT, "%s: %s[%d].%s: not an integer", name, where, idx, key);
    *v = (int64_t)d;
    return 0;
}

static int get_num(const cJSON *obj, const char *key, double *v, int required, double dflt,
                   const char *name, const char *where, int idx, char *err, size_t n)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) {
        if (!required) {
            *v = dflt;
            return 0;
        }
        return fail(err, n, PS_ECORRUPT, "%s: %s[%d]: missing field '%s'", name, where, idx, key);
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return fail(err, n, PS_ECORRUPT, "%s: %s[%d].%s: not a finite number", name, where, idx, key);
    *v = it->valuedouble;
    return 0;
}

static int get_bbox(const cJSON *obj, double bb[4], const char *name, const char *where, int idx,
                    char *err, size_t n)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, "bbox");
    if (!it) return fail(err, n, PS_ECORRUPT, "%s: %s[%d]: missing field 'bbox'", name, where, idx);
    if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 4)
        return fail(err, n, PS_ECORRUPT, "%s: %s[%d].bbox: not an array of 4 numbers [x,y,w,h]",
                    name, where, idx);
    for (int i = 0; i < 4; i++) {
        const cJSON *e = cJSON_GetArrayItem(it, i);
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
            return fail(err, n, PS_ECORRUPT, "%s: %s[%d].bbox[%d]: not a finite number", name,
                        where, idx, i);
        bb[i] = e->valuedouble;
    }
    if (bb[2] < 0 || bb[3] < 0)
        return fail(err, n, PS_ECORRUPT, "%s: %s[%d].bbox: negative width or height (%g x %g)",
                    name, where, idx, bb[2], bb[3]);
    return 0;
}

static const cJSON *get_array(const cJSON *root, const char *key, const char *name, char *err,
                              size_t n)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || !cJSON_IsArray(it)) {
        fail(err, n, PS_ECORRUPT, "%s: top-level '%s' %s", name, key,
             it ? "is not an array" : "missing");
        return NULL;
    }
    return it;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* ids[0..n) must be distinct (sorts them); what: "images" / "annotations" */
static int check_unique_ids(int64_t *ids, int n, const char *name, const char *what, char *err,
                            size_t errlen)
{
    qsort(ids, (size_t)n, sizeof *ids, cmp_i64);
    for (int k = 1; k < n; k++)
        if (ids[k] == ids[k - 1])
            return fail(err, errlen, PS_ECORRUPT, "%s: %s: duplicate id %lld", name, what,
                        (long long)ids[k]);
    return 0;
}

void ps_coco_free(ps_coco_t *c)
{
    if (!c) return;
    for (int i = 0; i < c->nimages; i++) free(c->images[i].file_name);
    for (int i = 0; i < c->ncats; i++) free(c->cats[i].name);
    for (int i = 0; i < c->nanns; i++) ps_coco_segm_free(&c->anns[i].segm);
    free(c->images);
    free(c->anns);
    free(c->cats);
    free(c->img_sorted_ids);
    free(c->img_sorted_idx);
    memset(c, 0, sizeof *c);
}

typedef struct {
    int64_t id;
    int idx;
} idpair_t;

static int cmp_pair(const void *a, const void *b)
{
    const idpair_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

int ps_coco_index(ps_coco_t *c, char *err, size_t errlen)
{
    free(c->img_sorted_ids);
    free(c->img_sorted_idx);
    c->img_sorted_ids = NULL;
    c->img_sorted_idx = NULL;
    int n = c->nimages;
    idpair_t *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    c->img_sorted_ids = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    c->img_sorted_idx = malloc((size_t)(n ? n : 1) * sizeof(int));
    if (!p || !c->img_sorted_ids || !c->img_sorted_idx) {
        free(p);
        return fail(err, errlen, PS_ENOMEM, "coco index: out of memory (%d images)", n);
    }
    for (int i = 0; i < n; i++) p[i].id = c->images[i].id, p[i].idx = i;
    qsort(p, (size_t)n, sizeof *p, cmp_pair);
    for (int i = 0; i < n; i++) {
        if (i && p[i].id == p[i - 1].id) {
            int64_t id = p[i].id;
            free(p);
            return fail(err, errlen, PS_EINVAL, "images: duplicate id %lld", (long long)id);
        }
        c->img_sorted_ids[i] = p[i].id;
        c->img_sorted_idx[i] = p[i].idx;
    }
    free(p);
    return 0;
}

int ps_coco_find_image(const ps_coco_t *c, int64_t id)
{
    int lo = 0, hi = c->nimages - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c->img_sorted_ids[mid] == id) return c->img_sorted_idx[mid];
        if (c->img_sorted_ids[mid] < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

int ps_coco_find_cat(const ps_coco_t *c, int64_t id)
{
    for (int i = 0; i < c->ncats; i++) /* a handful of categories: linear is fine */
        if (c->cats[i].id == id) return i;
    return -1;
}

static char *dup_str(const cJSON *obj, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    const char *s = cJSON_IsString(it) ? it->valuestring : "";
    return strdup(s);
}

/* One image; 1 = skip (lenient), 0 = ok, <0 = error. */
static int parse_image(ps_coco_image_t *im, const cJSON *o, int i, const char *name, char *err,
                       size_t n)
{
    int64_t id, w, h;
    int rc;
    if (!cJSON_IsObject(o))
        return fail(err, n, PS_ECORRUPT, "%s: images[%d]: not an object", name, i);
    if ((rc = get_int(o, "id", &id, 1, 0, name, "images", i, err, n)) ||
        (rc = get_int(o, "width", &w, 1, 0, name, "images", i, err, n)) ||
        (rc = get_int(o, "height", &h, 1, 0, name, "images", i, err, n)))
        return rc;
    if (w <= 0 || h <= 0 || w > 1000000 || h > 1000000)
        return fail(err, n, PS_ECORRUPT, "%s: images[%d]: width/height %lld x %lld out of range",
                    name, i, (long long)w, (long long)h);
    im->id = id;
    im->width = (int)w;
    im->height = (int)h;
    return 0;
}

/* The annotation's segmentation, if it has one (last: nothing after it can
 * fail, so a bad record never leaves one allocated); with no 'area' field
 * the area is the mask's pixel count. */
static int parse_ann_segm(ps_coco_ann_t *a, const cJSON *o, int i, const ps_coco_image_t *img,
                          int has_area, const char *name, char *err, size_t n)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "segmentation");
    if (!it) return 0;
    char where[256];
    snprintf(where, sizeof where, "%s: annotations[%d] (id %lld)", name, i, (long long)a->id);
    int rc = ps_coco_segm_parse(&a->segm, it, img->height, img->width, 0, where, err, n);
    if (rc || has_area) return rc;
    ps_rle_t r;
    if ((rc = ps_coco_segm_rle(&a->segm, img->height, img->width, &r))) {
        ps_coco_segm_free(&a->segm);
        if (rc == PS_ENOMEM) return fail(err, n, rc, "%s: out of memory", where);
        return fail(err, n, PS_ECORRUPT, "%s.segmentation: a polygon too long to rasterise",
                    where);
    }
    a->area = (double)ps_rle_area(&r);
    ps_rle_free(&r);
    return 0;
}

static int parse_ann(ps_coco_ann_t *a, const cJSON *o, int i, const ps_coco_t *c,
                     const char *name, char *err, size_t n)
{
    int64_t crowd;
    int rc;
    memset(a, 0, sizeof *a);
    if (!cJSON_IsObject(o))
        return fail(err, n, PS_ECORRUPT, "%s: annotations[%d]: not an object", name, i);
    if ((rc = get_int(o, "id", &a->id, 1, 0, name, "annotations", i, err, n)) ||
        (rc = get_int(o, "image_id", &a->image_id, 1, 0, name, "annotations", i, err, n)) ||
        (rc = get_int(o, "category_id", &a->category_id, 1, 0, name, "annotations", i, err, n)) ||
        (rc = get_bbox(o, a->bbox, name, "annotations", i, err, n)) ||
        (rc = get_num(o, "area", &a->area, 0, a->bbox[2] * a->bbox[3], name, "annotations", i,
                      err, n)) ||
        (rc = get_int(o, "iscrowd", &crowd, 0, 0, name, "annotations", i, err, n)))
        return rc;
    if (crowd != 0 && crowd != 1)
        return fail(err, n, PS_ECORRUPT, "%s: annotations[%d].iscrowd: %lld is not 0 or 1", name,
                    i, (long long)crowd);
    a->iscrowd = (int)crowd;
    if (a->area < 0)
        return fail(err, n, PS_ECORRUPT, "%s: annotations[%d].area: negative (%g)", name, i, a->area);
    int im = ps_coco_find_image(c, a->image_id);
    if (im < 0)
        return fail(err, n, PS_ECORRUPT, "%s: annotations[%d].image_id: unknown image %lld", name,
                    i, (long long)a->image_id);
    if (ps_coco_find_cat(c, a->category_id) < 0)
        return fail(err, n, PS_ECORRUPT, "%s: annotations[%d].category_id: unknown category %lld",
                    name, i, (long long)a->category_id);
    const ps_coco_image_t *img = &c->images[im];
    const double *b = a->bbox, s = PS_COCO_BOX_SLACK;
    if (b[0] < -s || b[1] < -s || b[0] + b[2] > img->width + s || b[1] + b[3] > img->height + s)
        return fail(err, n, PS_ECORRUPT,
                    "%s: annotations[%d].bbox: [%g,%g,%g,%g] outside image %lld (%dx%d)", name, i,
                    b[0], b[1], b[2], b[3], (long long)img->id, img->width, img->height);
    return parse_ann_segm(a, o, i, img, cJSON_GetObjectItemCaseSensitive(o, "area") != NULL, name,
                          err, n);
}

/* Categories: always strict (a bad category makes every annotation doubtful). */
static int parse_categories(ps_coco_t *c, const cJSON *jcat, const char *name, char *err,
                            size_t errlen)
{
    int i = 0, rc;
    const cJSON *o;
    cJSON_ArrayForEach(o, jcat)
    {
        int64_t id;
        if (!cJSON_IsObject(o))
            return fail(err, errlen, PS_ECORRUPT, "%s: categories[%d]: not an object", name, i);
        if ((rc = get_int(o, "id", &id, 1, 0, name, "categories", i, err, errlen))) return rc;
        if (ps_coco_find_cat(c, id) >= 0)
            return fail(err, errlen, PS_ECORRUPT, "%s: categories[%d].id: duplicate id %lld", name,
                        i, (long long)id);
        c->cats[c->ncats].id = id;
        c->cats[c->ncats].name = dup_str(o, "name");
        c->ncats++;
        i++;
    }
    return 0;
}

/* Images, their ids into ids[]; lenient: a bad one is skipped and counted. */
static int parse_images(ps_coco_t *c, const cJSON *jim, int64_t *ids, int lenient,
                        ps_coco_skips_t *sk, const char *name, char *err, size_t errlen)
{
    int i = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, jim)
    {
        int rc = parse_image(&c->images[c->nimages], o, i, name, err, errlen);
        if (rc == 0) {
            c->images[c->nimages].file_name = dup_str(o, "file_name");
            ids[c->nimages] = c->images[c->nimages].id;
            c->nimages++;
        } else if (lenient) {
            ps_warn("%s: images[%d] skipped", name, i);
            sk->images++;
        } else {
            return rc;
        }
        i++;
    }
    return 0;
}

/* Annotations (checked against c's images and categories), their ids into
 * ids[]; lenient: a bad one is skipped and counted. */
static int parse_anns(ps_coco_t *c, const cJSON *jan, int64_t *ids, int lenient,
                      ps_coco_skips_t *sk, const char *name, char *err, size_t errlen)
{
    int i = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, jan)
    {
        int rc = parse_ann(&c->anns[c->nanns], o, i, c, name, err, errlen);
        if (rc == 0) {
            ids[c->nanns] = c->anns[c->nanns].id;
            c->nanns++;
        } else if (lenient) {
            ps_warn("%s: annotations[%d] skipped", name, i);
            sk->anns++;
        } else {
            return rc;
        }
        i++;
    }
    return 0;
}

int ps_coco_parse(ps_coco_t *out, const char *text, size_t len, const char *name, int lenient,
                  ps_coco_skips_t *skips, char *err, size_t errlen)
{
    ps_coco_skips_t sk = {0, 0, 0};
    ps_coco_t c;
    memset(&c, 0, sizeof c);
    memset(out, 0, sizeof *out);
    int rc = 0;
    int64_t *ids = NULL; /* image ids, then annotation ids, checked distinct */
    cJSON *root = parse_json(text, len, name, err, errlen);
    if (!root) return PS_ECORRUPT;
    const cJSON *jim, *jan, *jcat;
    if (!cJSON_IsObject(root)) {
        rc = fail(err, errlen, PS_ECORRUPT, "%s: top level is not an object", name);
        goto out;
    }
    if (!(jim = get_array(root, "images", name, err, errlen)) ||
        !(jan = get_array(root, "annotations", name, err, errlen)) ||
        !(jcat = get_array(root, "categories", name, err, errlen))) {
        rc = PS_ECORRUPT;
        goto out;
    }
    int ni = cJSON_GetArraySize(jim), na = cJSON_GetArraySize(jan), nc = cJSON_GetArraySize(jcat);
    c.images = calloc((size_t)ni + 1, sizeof *c.images);
    c.anns = calloc((size_t)na + 1, sizeof *c.anns);
    c.cats = calloc((size_t)nc + 1, sizeof *c.cats);
    if (!c.images || !c.anns || !c.cats) {
        rc = fail(err, errlen, PS_ENOMEM, "%s: out of memory", name);
        goto out;
    }
    if ((rc = parse_categories(&c, jcat, name, err, errlen))) goto out;
    ids = malloc((size_t)(ni + na + 1) * sizeof(int64_t));
    if (!ids) {
        rc = fail(err, errlen, PS_ENOMEM, "%s: out of memory", name);
        goto out;
    }
    /* duplicate image ids: an error even when lenient (which one would be right?) */
    if ((rc = parse_images(&c, jim, ids, lenient, &sk, name, err, errlen)) ||
        (rc = check_unique_ids(ids, c.nimages, name, "images", err, errlen)) ||
        (rc = ps_coco_index(&c, err, errlen)) ||
        (rc = parse_anns(&c, jan, ids, lenient, &sk, name, err, errlen)))
        goto out;
    rc = check_unique_ids(ids, c.nanns, name, "annotations", err, errlen);
out:
    free(ids);
    cJSON_Delete(root);
    if (rc) {
        ps_coco_free(&c);
        return rc;
    }
    if (skips) *skips = sk;
    *out = c;
    return 0;
}

static int read_text(const char *path, char **text, size_t *len, char *err, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, n, PS_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, used = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + used, 1, cap - used, f);
        used += got;
        if (used < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) return fail(err, n, PS_ENOMEM, "%s: out of memory", path);
    if (bad) {
        free(buf);
        return fail(err, n, PS_EIO, "%s: read error", path);
    }
    *text = buf;
    *len = used;
    return 0;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

int ps_coco_load(ps_coco_t *out, const char *path, int lenient, ps_coco_skips_t *skips,
                 char *err, size_t errlen)
{
    char *text;
    size_t len;
    memset(out, 0, sizeof *out);
    int rc = read_text(path, &text, &len, err, errlen);
    if (rc) return rc;
    rc = ps_coco_parse(out, text, len, base_name(path), lenient, skips, err, errlen);
    free(text);
    return rc;
}

/* One detection (record i of a results file): 0, or an error with err set.
 * mask (NULL: segmentation not read): its RLE, which it must have; then a
 * missing bbox is the mask's box, as pycocotools' loadRes makes it. */
static int parse_det(ps_coco_det_t *x, ps_rle_t *mask, const cJSON *o, int i, const char *name,
                     const ps_coco_t *gt, char *err, size_t n)
{
    int rc, im = -1;
    if (!cJSON_IsObject(o)) return fail(err, n, PS_ECORRUPT, "%s: [%d]: not an object", name, i);
    if ((rc = get_int(o, "image_id", &x->image_id, 1, 0, name, "", i, err, n)) ||
        (rc = get_int(o, "category_id", &x->category_id, 1, 0, name, "", i, err, n)) ||
        (rc = get_num(o, "score", &x->score, 1, 0, name, "", i, err, n)))
        return rc;
    if ((im = ps_coco_find_image(gt, x->image_id)) < 0)
        return fail(err, n, PS_ECORRUPT, "%s: [%d].image_id: unknown image %lld", name, i,
                    (long long)x->image_id);
    if (ps_coco_find_cat(gt, x->category_id) < 0)
        return fail(err, n, PS_ECORRUPT, "%s: [%d].category_id: unknown category %lld", name, i,
                    (long long)x->category_id);
    int has_bbox = cJSON_GetObjectItemCaseSensitive(o, "bbox") != NULL;
    if ((has_bbox || !mask) && (rc = get_bbox(o, x->bbox, name, "", i, err, n))) return rc;
    if (!mask) return 0;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "segmentation");
    if (!it) return fail(err, n, PS_ECORRUPT, "%s: [%d]: missing field 'segmentation'", name, i);
    char where[128];
    snprintf(where, sizeof where, "%s: [%d]", name, i);
    ps_coco_segm_t sg;
    const ps_coco_image_t *img = &gt->images[im];
    if ((rc = ps_coco_segm_parse(&sg, it, img->height, img->width, 1, where, err, n))) return rc;
    *mask = sg.rle; /* the RLE moves out of sg */
    if (!has_bbox) ps_rle_to_bbox(mask, x->bbox);
    return 0;
}

int ps_coco_parse_results(ps_coco_det_t **dets, ps_rle_t **masks, int *ndets, const char *text,
                          size_t len, const char *name, const ps_coco_t *gt, int lenient,
                          ps_coco_skips_t *skips, char *err, size_t errlen)
{
    *dets = NULL;
    *ndets = 0;
    if (masks) *masks = NULL;
    cJSON *root = parse_json(text, len, name, err, errlen);
    if (!root) return PS_ECORRUPT;
    int rc = 0, nd = 0, i = 0, nskip = 0;
    ps_coco_det_t *d = NULL;
    ps_rle_t *mk = NULL;
    if (!cJSON_IsArray(root)) {
        rc = fail(err, errlen, PS_ECORRUPT, "%s: top level is not an array of detections", name);
        goto out;
    }
    size_t cap = (size_t)cJSON_GetArraySize(root) + 1;
    d = calloc(cap, sizeof *d);
    mk = masks ? calloc(cap, sizeof *mk) : NULL;
    if (!d || (masks && !mk)) {
        rc = fail(err, errlen, PS_ENOMEM, "%s: out of memory", name);
        goto out;
    }
    const cJSON *o;
    cJSON_ArrayForEach(o, root)
    {
        rc = parse_det(&d[nd], mk ? &mk[nd] : NULL, o, i, name, gt, err, errlen);
        if (rc == 0) {
            nd++;
        } else if (lenient) {
            ps_warn("%s: detection [%d] skipped", name, i);
            nskip++;
            rc = 0;
        } else {
            goto out;
        }
        i++;
    }
out:
    cJSON_Delete(root);
    if (rc) {
        for (int k = 0; mk && k < nd; k++) ps_rle_free(&mk[k]);
        free(d);
        free(mk);
        return rc;
    }
    if (skips) skips->dets = nskip;
    *dets = d;
    if (masks) *masks = mk;
    *ndets = nd;
    return 0;
}

int ps_coco_parse_dets(ps_coco_det_t **dets, int *ndets, const char *text, size_t len,
                       const char *name, const ps_coco_t *gt, int lenient,
                       ps_coco_skips_t *skips, char *err, size_t errlen)
{
    return ps_coco_parse_results(dets, NULL, ndets, text, len, name, gt, lenient, skips, err,
                                 errlen);
}

int ps_coco_load_results(ps_coco_det_t **dets, ps_rle_t **masks, int *ndets, const char *path,
                         const ps_coco_t *gt, int lenient, ps_coco_skips_t *skips, char *err,
                         size_t errlen)
{
    char *text;
    size_t len;
    *dets = NULL;
    *ndets = 0;
    if (masks) *masks = NULL;
    int rc = read_text(path, &text, &len, err, errlen);
    if (rc) return rc;
    rc = ps_coco_parse_results(dets, masks, ndets, text, len, base_name(path), gt, lenient, skips,
                               err, errlen);
    free(text);
    return rc;
}

int ps_coco_load_dets(ps_coco_det_t **dets, int *ndets, const char *path, const ps_coco_t *gt,
                      int lenient, ps_coco_skips_t *skips, char *err, size_t errlen)
{
    return ps_coco_load_results(dets, NULL, ndets, path, gt, lenient, skips, err, errlen);
}

/* ---- writers ------------------------------------------------------------------ */

static cJSON *bbox_json(const double b[4])
{
    return cJSON_CreateDoubleArray(b, 4);
}

/* Prints root (deleted here) to path through a temporary file renamed over
 * it, so a reader never sees a half-written file */
static int write_json(cJSON *root, const char *path, char *err, size_t n)
{
    if (!root) return fail(err, n, PS_ENOMEM, "%s: out of memory building JSON", path);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) return fail(err, n, PS_ENOMEM, "%s: out of memory printing JSON", path);
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        free(s);
        return fail(err, n, PS_EINVAL, "%s: path too long", path);
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(s);
        return fail(err, n, PS_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    size_t len = strlen(s);
    int bad = fwrite(s, 1, len, f) != len || fputc('\n', f) == EOF;
    bad |= fclose(f) != 0;
    free(s);
    if (bad || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return fail(err, n, PS_EIO, "%s: %s: %s", path, bad ? "write error" : "rename failed",
                    strerror(e));
    }
    return 0;
}

int ps_coco_save(const ps_coco_t *c, const char *path, char *err, size_t errlen)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *im = cJSON_AddArrayToObject(root, "images");
    cJSON *an = cJSON_AddArrayToObject(root, "annotations");
    cJSON *ca = cJSON_AddArrayToObject(root, "categories");
    if (!root || !im || !an || !ca) {
        cJSON_Delete(root);
        return fail(err, errlen, PS_ENOMEM, "%s: out of memory building JSON", path);
    }
    int oom = 0;
    for (int i = 0; i < c->nimages && !oom; i++) {
        cJSON *o = cJSON_CreateObject();
        oom |= !o || !cJSON_AddItemToArray(im, o);
        oom |= !cJSON_AddNumberToObject(o, "id", (double)c->images[i].id);
        oom |= !cJSON_AddNumberToObject(o, "width", c->images[i].width);
        oom |= !cJSON_AddNumberToObject(o, "height", c->images[i].height);
        oom |= !cJSON_AddStringToObject(o, "file_name",
                                        c->images[i].file_name ? c->images[i].file_name : "");
    }
    for (int i = 0; i < c->nanns && !oom; i++) {
        const ps_coco_ann_t *a = &c->anns[i];
        cJSON *o = cJSON_CreateObject();
        oom |= !o || !cJSON_AddItemToArray(an, o);
        oom |= !cJSON_AddNumberToObject(o, "id", (double)a->id);
        oom |= !cJSON_AddNumberToObject(o, "image_id", (double)a->image_id);
        oom |= !cJSON_AddNumberToObject(o, "category_id", (double)a->category_id);
        cJSON *bb = bbox_json(a->bbox);
        oom |= !bb || !cJSON_AddItemToObject(o, "bbox", bb);
        oom |= !cJSON_AddNumberToObject(o, "area", a->area);
        oom |= !cJSON_AddNumberToObject(o, "iscrowd", a->iscrowd);
        if (a->segm.kind != PS_COCO_SEGM_NONE) {
            cJSON *sg = ps_coco_segm_json(&a->segm);
            oom |= !sg || !cJSON_AddItemToObject(o, "segmentation", sg);
        }
    }
    for (int i = 0; i < c->ncats && !oom; i++) {
        cJSON *o = cJSON_CreateObject();
        oom |= !o || !cJSON_AddItemToArray(ca, o);
        oom |= !cJSON_AddNumberToObject(o, "id", (double)c->cats[i].id);
        oom |= !cJSON_AddStringToObject(o, "name", c->cats[i].name ? c->cats[i].name : "");
    }
    if (oom) {
        cJSON_Delete(root);
        return fail(err, errlen, PS_ENOMEM, "%s: out of memory building JSON", path);
    }
    return write_json(root, path, err, errlen);
}

int ps_coco_save_results(const ps_coco_det_t *dets, const ps_rle_t *masks, int ndets,
                         const char *path, char *err, size_t errlen)
{
    cJSON *root = cJSON_CreateArray();
    int oom = !root;
    for (int i = 0; i < ndets && !oom; i++) {
        cJSON *o = cJSON_CreateObject();
        oom |= !o || !cJSON_AddItemToArray(root, o);
        oom |= !cJSON_AddNumberToObject(o, "image_id", (double)dets[i].image_id);
        oom |= !cJSON_AddNumberToObject(o, "category_id", (double)dets[i].category_id);
        cJSON *bb = bbox_json(dets[i].bbox);
        oom |= !bb || !cJSON_AddItemToObject(o, "bbox", bb);
        oom |= !cJSON_AddNumberToObject(o, "score", dets[i].score);
        if (masks) {
            cJSON *sg = ps_coco_rle_json(&masks[i]);
            oom |= !sg || !cJSON_AddItemToObject(o, "segmentation", sg);
        }
    }
    if (oom) {
        cJSON_Delete(root);
        return fail(err, errlen, PS_ENOMEM, "%s: out of memory building JSON", path);
    }
    return write_json(root, path, err, errlen);
}

int ps_coco_save_dets(const ps_coco_det_t *dets, int ndets, const char *path, char *err,
                      size_t errlen)
{
    return ps_coco_save_results(dets, NULL, ndets, path, err, errlen);
}
