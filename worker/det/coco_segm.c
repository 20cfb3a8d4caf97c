/* COCO segmentation fields: polygons and RLEs in JSON (coco_segm.h). */
#include "worker/det/coco_segm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_util.h"

/* ps_fail (ps_util.h) with this file's argument order */
#define fail(err, n, code, ...) ps_fail((code), (err), (n), __VA_ARGS__)

void ps_coco_segm_free(ps_coco_segm_t *s)
{
    if (!s) return;
    free(s->poly_len);
    free(s->xy);
    ps_rle_free(&s->rle);
    memset(s, 0, sizeof *s);
}

int ps_coco_segm_rle(const ps_coco_segm_t *s, int h, int w, ps_rle_t *out)
{
    memset(out, 0, sizeof *out);
    if (s->kind == PS_COCO_SEGM_RLE || s->kind == PS_COCO_SEGM_RLE_STR)
        return ps_rle_set(out, s->rle.h, s->rle.w, s->rle.cnts, s->rle.m);
    if (s->kind != PS_COCO_SEGM_POLY || s->npoly < 1) return PS_EINVAL;
    ps_rle_t *parts = calloc((size_t)s->npoly, sizeof *parts);
    if (!parts) return PS_ENOMEM;
    int rc = 0;
    const double *xy = s->xy;
    for (int i = 0; i < s->npoly && !rc; i++) {
        rc = ps_rle_from_polygon(&parts[i], xy, s->poly_len[i], h, w);
        xy += 2 * (size_t)s->poly_len[i];
    }
    if (!rc) rc = ps_rle_merge(out, parts, s->npoly, 0);
    for (int i = 0; i < s->npoly; i++) ps_rle_free(&parts[i]);
    free(parts);
    return rc;
}

/* Polygons: [[x,y,x,y,...], ...], every point within the image but for
 * PS_COCO_BOX_SLACK */
static int parse_polygons(ps_coco_segm_t *s, const cJSON *it, int h, int w, const char *where,
                          char *err, size_t n)
{
    int np = cJSON_GetArraySize(it), total = 0, i = 0;
    if (np == 0)
        return fail(err, n, PS_ECORRUPT, "%s.segmentation: an empty list of polygons", where);
    const cJSON *p;
    cJSON_ArrayForEach(p, it)
    {
        if (!cJSON_IsArray(p))
            return fail(err, n, PS_ECORRUPT, "%s.segmentation[%d]: not an array of coordinates",
                        where, i);
        int k = cJSON_GetArraySize(p);
        if (k % 2)
            return fail(err, n, PS_ECORRUPT, "%s.segmentation[%d]: odd number of coordinates "
                        "(%d)", where, i, k);
        if (k < 6)
            return fail(err, n, PS_ECORRUPT, "%s.segmentation[%d]: %d points, a polygon needs "
                        "at least 3", where, i, k / 2);
        if (total > 100000000 - k)
            return fail(err, n, PS_ECORRUPT, "%s.segmentation: too many coordinates", where);
        total += k;
        i++;
    }
    s->poly_len = malloc(sizeof(int) * (size_t)np);
    s->xy = malloc(sizeof(double) * (size_t)total);
    if (!s->poly_len || !s->xy) return fail(err, n, PS_ENOMEM, "%s: out of memory", where);
    const double sl = PS_COCO_BOX_SLACK;
    double *xy = s->xy;
    i = 0;
    cJSON_ArrayForEach(p, it)
    {
        int j = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, p)
        {
            if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
                return fail(err, n, PS_ECORRUPT, "%s.segmentation[%d][%d]: not a finite number",
                            where, i, j);
            double v = e->valuedouble, lim = j % 2 ? h : w;
            if (v < -sl || v > lim + sl)
                return fail(err, n, PS_ECORRUPT, "%s.segmentation[%d][%d]: %c = %g of point %d "
                            "outside the image (%dx%d)", where, i, j, j % 2 ? 'y' : 'x', v, j / 2,
                            w, h);
            *xy++ = v;
            j++;
        }
        s->poly_len[i++] = j / 2;
    }
    s->npoly = np;
    s->kind = PS_COCO_SEGM_POLY;
    return 0;
}

/* An RLE: {"size": [h, w], "counts": [n, ...] or "string"} of the image's size */
static int parse_rle(ps_coco_segm_t *s, const cJSON *it, int h, int w, const char *where,
                     char *err, size_t n)
{
    const cJSON *sz = cJSON_GetObjectItemCaseSensitive(it, "size");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(it, "counts");
    if (!sz || !cn)
        return fail(err, n, PS_ECORRUPT, "%s.segmentation: an RLE needs 'size' and 'counts'",
                    where);
    const cJSON *sh = cJSON_GetArrayItem(sz, 0), *sw = cJSON_GetArrayItem(sz, 1);
    if (!cJSON_IsArray(sz) || cJSON_GetArraySize(sz) != 2 || !cJSON_IsNumber(sh) ||
        !cJSON_IsNumber(sw))
        return fail(err, n, PS_ECORRUPT, "%s.segmentation.size: not [height, width]", where);
    if (sh->valuedouble != h || sw->valuedouble != w)
        return fail(err, n, PS_ECORRUPT, "%s.segmentation.size: [%g, %g] is not the image's "
                    "[%d, %d] (height, width)", where, sh->valuedouble, sw->valuedouble, h, w);
    char e2[256];
    int rc;
    if (cJSON_IsString(cn)) {
        rc = ps_rle_from_string(&s->rle, cn->valuestring, strlen(cn->valuestring), h, w, e2,
                                sizeof e2);
        if (rc) return fail(err, n, rc, "%s.segmentation.counts: %s", where, e2);
        s->kind = PS_COCO_SEGM_RLE_STR;
        return 0;
    }
    if (!cJSON_IsArray(cn))
        return fail(err, n, PS_ECORRUPT, "%s.segmentation.counts: neither a list nor a string",
                    where);
    int m = cJSON_GetArraySize(cn), j = 0;
    uint32_t *c = malloc(sizeof(uint32_t) * (size_t)(m + 1));
    if (!c) return fail(err, n, PS_ENOMEM, "%s: out of memory", where);
    const cJSON *e;
    cJSON_ArrayForEach(e, cn)
    {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(v >= 0 && v <= 4294967295.0 && v == floor(v))) {
            free(c);
            return fail(err, n, PS_ECORRUPT, "%s.segmentation.counts[%d]: not a count (an "
                        "integer >= 0)", where, j);
        }
        c[j++] = (uint32_t)v;
    }
    s->rle = (ps_rle_t){h, w, m, c};
    if (m == 0) free(c), s->rle.cnts = NULL;
    if ((rc = ps_rle_check(&s->rle, e2, sizeof e2))) {
        ps_rle_free(&s->rle);
        return fail(err, n, rc, "%s.segmentation.counts: %s", where, e2);
    }
    s->kind = PS_COCO_SEGM_RLE;
    return 0;
}

int ps_coco_segm_parse(ps_coco_segm_t *s, const cJSON *it, int h, int w, int results,
                       const char *where, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    int rc;
    if ((uint64_t)h * (uint64_t)w > PS_RLE_MAX_PIXELS)
        return fail(err, errlen, PS_ECORRUPT, "%s.segmentation: the image (%dx%d) is too large "
                    "for a COCO mask (32-bit counts)", where, w, h);
    if (cJSON_IsArray(it) && !results)
        rc = parse_polygons(s, it, h, w, where, err, errlen);
    else if (cJSON_IsObject(it))
        rc = parse_rle(s, it, h, w, where, err, errlen);
    else
        rc = fail(err, errlen, PS_ECORRUPT, "%s.segmentation: %s", where,
                  results ? "not an RLE {\"size\": [h, w], \"counts\": ...} (results carry RLEs, "
                            "not polygons)"
                          : "neither polygons [[x,y,...],...] nor an RLE {\"size\", \"counts\"}");
    if (rc) ps_coco_segm_free(s);
    return rc;
}

/* Adds item to object o under key; on failure deletes item and o: NULL */
static cJSON *add(cJSON *o, const char *key, cJSON *item)
{
    if (o && item && cJSON_AddItemToObject(o, key, item)) return o;
    cJSON_Delete(item);
    cJSON_Delete(o);
    return NULL;
}

cJSON *ps_coco_rle_json(const ps_rle_t *r)
{
    int size[2] = {r->h, r->w};
    char *s = ps_rle_to_string(r);
    cJSON *o = add(cJSON_CreateObject(), "size", cJSON_CreateIntArray(size, 2));
    o = add(o, "counts", s ? cJSON_CreateString(s) : NULL);
    free(s);
    return o;
}

cJSON *ps_coco_segm_json(const ps_coco_segm_t *s)
{
    if (s->kind == PS_COCO_SEGM_RLE_STR) return ps_coco_rle_json(&s->rle);
    if (s->kind == PS_COCO_SEGM_RLE) {
        int size[2] = {s->rle.h, s->rle.w};
        double *c = malloc(sizeof(double) * (size_t)(s->rle.m + 1));
        for (int j = 0; c && j < s->rle.m; j++) c[j] = s->rle.cnts[j];
        cJSON *o = add(cJSON_CreateObject(), "size", cJSON_CreateIntArray(size, 2));
        o = add(o, "counts", c ? cJSON_CreateDoubleArray(c, s->rle.m) : NULL);
        free(c);
        return o;
    }
    cJSON *a = cJSON_CreateArray();
    const double *xy = s->xy;
    for (int i = 0; a && i < s->npoly; i++) {
        cJSON *p = cJSON_CreateDoubleArray(xy, 2 * s->poly_len[i]);
        if (!p || !cJSON_AddItemToArray(a, p)) {
            cJSON_Delete(p);
            cJSON_Delete(a);
            return NULL;
        }
        xy += 2 * (size_t)s->poly_len[i];
    }
    return a;
}
