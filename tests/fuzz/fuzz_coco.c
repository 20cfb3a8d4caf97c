/* Fuzz target: the COCO readers and what runs on what they accept
 * (worker/det: coco_json, coco_segm, coco_rle, coco_eval).  Byte 0 chooses:
 * bit 0 lenient, bit 1 the rest is a results file (with masks) read
 * against a fixed ground truth, else the rest is ground truth.
 * Checks: each reader returns 0 or a negative PS_E* with a message; on
 * success every annotation names a known image and category, every
 * segmentation turns into a mask whose runs sum to its image's pixels and
 * whose box lies in the image, the mask's compressed string decodes back to
 * the same runs, and the bbox and segm evaluations of detections made from
 * the annotations (and of the results file) give stats in [0, 1] or -1.
 * Errors are logged to stderr: run with -close_fd_mask=2 to quieten. */
#include "tests/fuzz/fuzz.h"

#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/det/coco_eval.h"
#include "worker/det/coco_json.h"

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size);

static void coco_fz_check_stats(const ps_coco_eval_result_t *r)
{
    for (int s = 0; s < PS_COCO_NSTATS; s++)
        FUZZ_CHECK(r->stats[s] == -1 || (r->stats[s] >= 0 && r->stats[s] <= 1 + 1e-12),
                   "stat %d = %g", s, r->stats[s]);
}

/* one mask per annotation (NULL where it has none); 1 when all have one */
static int coco_fz_masks(const ps_coco_t *c, ps_rle_t *m)
{
    int all = 1;
    for (int a = 0; a < c->nanns; a++) {
        const ps_coco_ann_t *an = &c->anns[a];
        int im = ps_coco_find_image(c, an->image_id);
        FUZZ_CHECK(im >= 0 && ps_coco_find_cat(c, an->category_id) >= 0,
                   "annotation %d: unknown image or category", a);
        memset(&m[a], 0, sizeof m[a]);
        if (an->segm.kind == PS_COCO_SEGM_NONE) {
            all = 0;
            continue;
        }
        int h = c->images[im].height, w = c->images[im].width;
        int rc = ps_coco_segm_rle(&an->segm, h, w, &m[a]);
        if (rc == PS_ENOMEM || rc == PS_EINVAL) { /* too long to rasterise here */
            all = 0;
            continue;
        }
        FUZZ_CHECK(rc == 0 && !ps_rle_check(&m[a], NULL, 0), "annotation %d: bad mask", a);
        double bb[4];
        ps_rle_to_bbox(&m[a], bb);
        FUZZ_CHECK(bb[0] >= 0 && bb[1] >= 0 && bb[0] + bb[2] <= w && bb[1] + bb[3] <= h,
                   "annotation %d: mask box outside the image", a);
        char *s = ps_rle_to_string(&m[a]);
        ps_rle_t back;
        FUZZ_CHECK(s && !ps_rle_from_string(&back, s, strlen(s), h, w, NULL, 0) &&
                   back.m == m[a].m &&
                   (!back.m || !memcmp(back.cnts, m[a].cnts, sizeof(uint32_t) * back.m)),
                   "annotation %d: string round trip", a);
        free(s);
        ps_rle_free(&back);
    }
    return all;
}

static const char coco_fz_gt[] =
    "{\"images\":[{\"id\":1,\"width\":12,\"height\":9},{\"id\":2,\"width\":5,\"height\":7}],"
    "\"annotations\":[{\"id\":1,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,4,4],"
    "\"segmentation\":[[1,1,5,1,5,5,1,5]]},{\"id\":2,\"image_id\":2,\"category_id\":2,"
    "\"bbox\":[0,0,5,7],\"iscrowd\":1,\"segmentation\":{\"size\":[7,5],\"counts\":[0,35]}}],"
    "\"categories\":[{\"id\":1},{\"id\":2}]}";

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 32768) return 0;
    ps_log_level = -1;
    int lenient = data[0] & 1, results = data[0] & 2;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char err[512];
    ps_coco_t c;
    ps_coco_skips_t sk;
    if (results) {
        int rc = ps_coco_parse(&c, coco_fz_gt, strlen(coco_fz_gt), "gt", 0, NULL, err, sizeof err);
        FUZZ_CHECK(rc == 0, "fixed GT: %s", err);
        ps_coco_det_t *d;
        ps_rle_t *m;
        int nd;
        rc = ps_coco_parse_results(&d, &m, &nd, text, len, "res", &c, lenient, &sk, err, sizeof err);
        FUZZ_CHECK(rc == 0 || ((rc == PS_ECORRUPT || rc == PS_ENOMEM) && err[0]), "results: %d", rc);
        if (rc == 0) {
            ps_coco_eval_result_t r;
            for (int i = 0; i < nd; i++) FUZZ_CHECK(!ps_rle_check(&m[i], NULL, 0), "result mask %d", i);
            if (!ps_coco_evaluate_segm(&r, &c, d, m, nd)) coco_fz_check_stats(&r), ps_coco_eval_free(&r);
            if (!ps_coco_evaluate(&r, &c, d, nd)) coco_fz_check_stats(&r), ps_coco_eval_free(&r);
            for (int i = 0; i < nd; i++) ps_rle_free(&m[i]);
            free(d), free(m);
        }
        ps_coco_free(&c);
        return 0;
    }
    int rc = ps_coco_parse(&c, text, len, "gt", lenient, &sk, err, sizeof err);
    FUZZ_CHECK(rc == 0 || ((rc == PS_ECORRUPT || rc == PS_ENOMEM) && err[0]), "gt: %d", rc);
    if (rc) return 0;
    ps_rle_t *m = calloc((size_t)c.nanns + 1, sizeof *m);
    ps_coco_det_t *d = calloc((size_t)c.nanns + 1, sizeof *d);
    if (!m || !d) abort();
    /* masks of images up to 4 Mpixels (a polygon across a million-pixel
     * image is valid but takes seconds to rasterise) */
    int small = 1;
    for (int i = 0; i < c.nimages; i++)
        small &= (int64_t)c.images[i].width * c.images[i].height <= (1 << 22);
    int all = small && coco_fz_masks(&c, m);
    for (int a = 0; a < c.nanns; a++) {
        d[a] = (ps_coco_det_t){c.anns[a].image_id, c.anns[a].category_id, {0, 0, 0, 0},
                               (double)((a * 37) % 11) / 10};
        memcpy(d[a].bbox, c.anns[a].bbox, sizeof d[a].bbox);
    }
    ps_coco_eval_result_t r;
    if (!ps_coco_evaluate(&r, &c, d, c.nanns)) coco_fz_check_stats(&r), ps_coco_eval_free(&r);
    if (all && !ps_coco_evaluate_segm(&r, &c, d, m, c.nanns))
        coco_fz_check_stats(&r), ps_coco_eval_free(&r);
    for (int a = 0; a < c.nanns; a++) ps_rle_free(&m[a]);
    free(m), free(d);
    ps_coco_free(&c);
    return 0;
}
