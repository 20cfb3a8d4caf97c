/* COCO segmentation in the JSON reader and writers (worker/det/coco_json.h,
 * coco_segm.c): the three forms read and written back, areas from masks,
 * malformed segmentations as errors naming the file and annotation (or
 * counted skips), results with masks (save, load, evaluate), and the segm
 * evaluation's closed-form cases (perfect masks, a crowd-only image,
 * images without objects) and refusals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include "tests/lib/tap.h"
#include "worker/det/coco_eval.h"
#include "worker/det/coco_json.h"

/* image 1: 10 x 8 (w x h); image 2: 6 x 6; categories 1, 2 */
#define HEAD "{\"images\":[{\"id\":1,\"width\":10,\"height\":8},{\"id\":2,\"width\":6,\"height\":6}]," \
             "\"categories\":[{\"id\":1,\"name\":\"a\"},{\"id\":2,\"name\":\"b\"}],"

/* ann(id, image, bbox, extra fields) */
static char *gt_with(const char *anns)
{
    static char buf[16384];
    snprintf(buf, sizeof buf, HEAD "\"annotations\":[%s]}", anns);
    return buf;
}

/* annotations 1-4 have a segmentation each, 5 none */
#define GOOD4                                                                          \
    /* a 4x3 rectangle at (2,1) as a polygon; no area: the mask's 12 pixels */         \
    "{\"id\":1,\"image_id\":1,\"category_id\":1,\"bbox\":[2,1,4,3],"                   \
    "\"segmentation\":[[2,1,6,1,6,4,2,4]]},"                                            \
    /* two parts: 2x2 at (0,0) and 1x1 at (8,6) */                                      \
    "{\"id\":2,\"image_id\":1,\"category_id\":2,\"bbox\":[0,0,9,7],\"area\":5,"         \
    "\"segmentation\":[[0,0,2,0,2,2,0,2],[8,6,9,6,9,7,8,7]]},"                          \
    /* crowd, uncompressed: 6x6 image, column-major runs 7 4 2 4 19 -> 8 px */         \
    "{\"id\":3,\"image_id\":2,\"category_id\":1,\"bbox\":[1,1,2,4],\"iscrowd\":1,"      \
    "\"segmentation\":{\"size\":[6,6],\"counts\":[7,4,2,4,19]}},"                       \
    /* compressed: the same mask (7 4 2, then 4-4 = 0 and 19-2 = 17 -> "a0") */        \
    "{\"id\":4,\"image_id\":2,\"category_id\":2,\"bbox\":[1,1,2,4],"                   \
    "\"segmentation\":{\"size\":[6,6],\"counts\":\"7420a0\"}}"
#define GOOD GOOD4 ",{\"id\":5,\"image_id\":2,\"category_id\":2,\"bbox\":[0,0,1,1]}"

static void read_forms(void)
{
    char err[512] = "";
    ps_coco_t c;
    const char *j = gt_with(GOOD);
    is_int(ps_coco_parse(&c, j, strlen(j), "t.json", 0, NULL, err, sizeof err), 0,
           "the three forms parse (%s)", err);
    if (c.nanns != 5) {
        ok(0, "5 annotations (%d)", c.nanns);
        return;
    }
    const ps_coco_ann_t *a = c.anns;
    ok(a[0].segm.kind == PS_COCO_SEGM_POLY && a[0].segm.npoly == 1 && a[0].segm.poly_len[0] == 4,
       "polygon: 1 part of 4 points");
    is_close(a[0].area, 12, 0, 0, "no 'area': the mask's pixel count");
    ok(a[1].segm.npoly == 2 && a[1].area == 5, "two polygons; 'area' given is kept");
    ok(a[2].segm.kind == PS_COCO_SEGM_RLE && a[2].segm.rle.m == 5 && a[2].iscrowd,
       "uncompressed RLE on a crowd region");
    ok(a[3].segm.kind == PS_COCO_SEGM_RLE_STR, "compressed RLE");
    ok(a[4].segm.kind == PS_COCO_SEGM_NONE, "no segmentation");
    ps_rle_t m0, m1, m2, m3;
    ps_coco_segm_rle(&a[0].segm, 8, 10, &m0);
    ps_coco_segm_rle(&a[1].segm, 8, 10, &m1);
    ps_coco_segm_rle(&a[2].segm, 6, 6, &m2);
    ps_coco_segm_rle(&a[3].segm, 6, 6, &m3);
    double bb[4];
    ps_rle_to_bbox(&m0, bb);
    ok(ps_rle_area(&m0) == 12 && bb[0] == 2 && bb[1] == 1 && bb[2] == 4 && bb[3] == 3,
       "polygon mask: 12 px, box [2,1,4,3] = the annotation's box");
    ok(ps_rle_area(&m1) == 5, "two parts merged: 4 + 1 px");
    ok(m2.m == m3.m && !memcmp(m2.cnts, m3.cnts, sizeof(uint32_t) * (size_t)m2.m) &&
       ps_rle_area(&m2) == 8, "the compressed string is the uncompressed counts (8 px)");
    ps_coco_segm_t none = {0};
    ps_rle_t mn;
    is_int(ps_coco_segm_rle(&none, 4, 4, &mn), PS_EINVAL, "no segmentation: no mask");
    ps_rle_free(&m0), ps_rle_free(&m1), ps_rle_free(&m2), ps_rle_free(&m3);

    /* written back in the same forms, read again to the same records */
    char dir[] = "/tmp/test_coco_segm_XXXXXX", p[600];
    ok(mkdtemp(dir) != NULL, "temp dir");
    snprintf(p, sizeof p, "%s/gt.json", dir);
    is_int(ps_coco_save(&c, p, err, sizeof err), 0, "save");
    ps_coco_t d;
    is_int(ps_coco_load(&d, p, 0, NULL, err, sizeof err), 0, "reload (%s)", err);
    int same = d.nanns == c.nanns;
    for (int i = 0; same && i < c.nanns; i++) {
        const ps_coco_segm_t *x = &c.anns[i].segm, *y = &d.anns[i].segm;
        same &= x->kind == y->kind && x->npoly == y->npoly && c.anns[i].area == d.anns[i].area;
        for (int k = 0, n = 0; same && k < x->npoly; n += x->poly_len[k], k++)
            same &= x->poly_len[k] == y->poly_len[k] &&
                    !memcmp(x->xy + 2 * n, y->xy + 2 * n, sizeof(double) * 2 * x->poly_len[k]);
        same &= x->rle.m == y->rle.m &&
                (!x->rle.m || !memcmp(x->rle.cnts, y->rle.cnts, sizeof(uint32_t) * x->rle.m));
    }
    ok(same, "save + load: the same segmentations, forms and areas");
    char txt[8192];
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(txt, 1, sizeof txt - 1, f) : 0;
    txt[n] = 0;
    if (f) fclose(f);
    ok(strstr(txt, "\"counts\":\"7420a0\"") && strstr(txt, "\"counts\":[7,4,2,4,19]"),
       "the file keeps the compressed string and the counts list");
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    ok(access(tmp, F_OK) != 0, "no temporary file left");
    ps_log_level = -1;
    snprintf(tmp, sizeof tmp, "%s/no/such/dir/gt.json", dir);
    ok(ps_coco_save(&c, tmp, err, sizeof err) == PS_EIO && strstr(err, "no/such/dir"),
       "unwritable path: PS_EIO naming it (%s)", err);
    ps_log_level = PS_LOG_INFO;
    unlink(p);
    rmdir(dir);
    ps_coco_free(&d);
    ps_coco_free(&c);
}

static void expect_bad(const char *ann, const char *needle, const char *what)
{
    char err[512] = "", buf[4096];
    snprintf(buf, sizeof buf, "{\"id\":9,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,2,2],%s}", ann);
    const char *j = gt_with(buf);
    ps_coco_t c;
    int rc = ps_coco_parse(&c, j, strlen(j), "t.json", 0, NULL, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "t.json: annotations[0] (id 9).segmentation") &&
       strstr(err, needle), "%s: error naming file, record and id (%s)", what, err);
    if (!rc) ps_coco_free(&c);
    /* lenient: skipped and counted, the rest kept */
    char two[8192];
    snprintf(two, sizeof two, "%s,{\"id\":10,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,2,2]}",
             buf);
    j = gt_with(two);
    ps_coco_skips_t sk;
    rc = ps_coco_parse(&c, j, strlen(j), "t.json", 1, &sk, err, sizeof err);
    ok(rc == 0 && sk.anns == 1 && c.nanns == 1 && c.anns[0].id == 10,
       "%s: lenient skips and counts it", what);
    if (!rc) ps_coco_free(&c);
}

static void bad_segmentations(void)
{
    static const char *const cases[][3] = { /* segmentation, message, what */
        {"[[1,1,3,1,3]]", "odd number of coordinates (5)", "odd count"},
        {"[[1,1,3,1]]", "2 points, a polygon needs at least 3", "two points"},
        {"[]", "empty list of polygons", "no polygons"},
        {"[[1,1,3,1,3,\"x\"]]", "[0][5]: not a finite number", "a string coordinate"},
        {"[1,2,3,4,5,6]", "[0]: not an array", "a flat list"},
        {"[[1,1,30,1,3,3]]", "x = 30 of point 1 outside the image (10x8)", "a point outside the image"},
        {"[[1,1,3,1,3,-4]]", "y = -4 of point 2 outside", "negative y"},
        {"{\"size\":[8,10],\"counts\":[5,3,70]}", "sum to 78, not 8*10", "counts not summing to h*w"},
        {"{\"size\":[8,10],\"counts\":[5,-3,78]}", "counts[1]: not a count", "a negative count"},
        {"{\"size\":[8,10],\"counts\":\"1 2\"}", "bad character 0x20", "a bad character"},
        {"{\"size\":[8,10],\"counts\":\"P\"}", "cut off", "a truncated string"},
        {"{\"size\":[10,8],\"counts\":[80]}", "[10, 8] is not the image's [8, 10]", "RLE size swapped"},
        {"{\"size\":[8,10]}", "needs 'size' and 'counts'", "no counts"},
        {"{\"size\":[8],\"counts\":[80]}", "size: not [height, width]", "size of one number"},
        {"{\"size\":[8,10],\"counts\":{}}", "neither a list nor a string", "counts an object"},
        {"7", "neither polygons", "a number"},
    };
    ps_log_level = -1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char field[256];
        snprintf(field, sizeof field, "\"segmentation\":%s", cases[i][0]);
        expect_bad(field, cases[i][1], cases[i][2]);
    }
    ps_log_level = PS_LOG_INFO;
}

/* results with masks: written, read back by the results reader, evaluated */
static void results_and_eval(void)
{
    char err[512] = "", dir[] = "/tmp/test_coco_segm_XXXXXX", p[600];
    ok(mkdtemp(dir) != NULL, "temp dir");
    ps_coco_t c;
    const char *j = gt_with(GOOD4);
    ps_coco_parse(&c, j, strlen(j), "t.json", 0, NULL, err, sizeof err);
    /* one detection per annotation with a mask: its GT mask, exactly */
    ps_coco_det_t dets[4];
    ps_rle_t masks[4];
    for (int i = 0; i < 4; i++) {
        const ps_coco_ann_t *a = &c.anns[i];
        int im = ps_coco_find_image(&c, a->image_id);
        ps_coco_segm_rle(&a->segm, c.images[im].height, c.images[im].width, &masks[i]);
        dets[i] = (ps_coco_det_t){a->image_id, a->category_id, {0, 0, 0, 0}, 0.9 - 0.1 * i};
        ps_rle_to_bbox(&masks[i], dets[i].bbox);
    }
    snprintf(p, sizeof p, "%s/res.json", dir);
    is_int(ps_coco_save_results(dets, masks, 4, p, err, sizeof err), 0, "results with masks saved");
    ps_coco_det_t *d2;
    ps_rle_t *m2;
    int n2;
    is_int(ps_coco_load_results(&d2, &m2, &n2, p, &c, 0, NULL, err, sizeof err), 0,
           "results read back (%s)", err);
    int same = n2 == 4;
    for (int i = 0; same && i < 4; i++)
        same &= !memcmp(&d2[i], &dets[i], sizeof dets[i]) && m2[i].m == masks[i].m &&
                !memcmp(m2[i].cnts, masks[i].cnts, sizeof(uint32_t) * masks[i].m);
    ok(same, "the same detections, boxes and masks");
    /* perfect masks: AP 1 (the crowd GT is ignored, its detection matched to it ignored) */
    ps_coco_eval_result_t r;
    is_int(ps_coco_evaluate_segm(&r, &c, d2, m2, n2), 0, "segm evaluation");
    is_close(r.stats[PS_COCO_AP], 1.0, 1e-12, 0, "perfect masks: segm AP 1");
    ps_coco_eval_free(&r);
    /* annotation 5 has no segmentation: a segm evaluation refuses, a bbox one runs */
    ps_coco_t c5;
    char five[4096];
    snprintf(five, sizeof five, "%s", gt_with(GOOD));
    ps_coco_parse(&c5, five, strlen(five), "t.json", 0, NULL, err, sizeof err);
    ps_log_level = -1;
    is_int(ps_coco_evaluate_segm(&r, &c5, d2, m2, n2), PS_EINVAL,
           "a GT without segmentation: segm evaluation refused");
    ps_log_level = PS_LOG_INFO;
    is_int(ps_coco_evaluate(&r, &c5, d2, n2), 0, "bbox evaluation of the same runs");
    ps_coco_eval_free(&r);
    ps_coco_free(&c5);
    /* a mask of the wrong size */
    ps_rle_t wrong[4];
    memcpy(wrong, m2, sizeof wrong);
    wrong[0].h = 7;
    ps_log_level = -1;
    is_int(ps_coco_evaluate_segm(&r, &c, d2, wrong, n2), PS_EINVAL, "mask size != image: refused");
    is_int(ps_coco_evaluate_segm(&r, &c, d2, NULL, n2), PS_EINVAL, "no masks: refused");
    ps_log_level = PS_LOG_INFO;
    /* results without bbox: the mask's box, as loadRes */
    const char *nob = "[{\"image_id\":1,\"category_id\":1,\"score\":0.5,"
                      "\"segmentation\":{\"size\":[8,10],\"counts\":[17,3,5,3,5,3,5,3,36]}}]";
    ps_coco_det_t *d3;
    ps_rle_t *m3;
    int n3;
    int rc = ps_coco_parse_results(&d3, &m3, &n3, nob, strlen(nob), "r.json", &c, 0, NULL, err,
                                   sizeof err);
    ok(rc == 0 && n3 == 1 && d3[0].bbox[0] == 2 && d3[0].bbox[2] == 4 && d3[0].bbox[3] == 3,
       "no bbox: the mask's box [%g,%g,%g,%g] (%s)", rc ? 0 : d3[0].bbox[0],
       rc ? 0 : d3[0].bbox[1], rc ? 0 : d3[0].bbox[2], rc ? 0 : d3[0].bbox[3], err);
    if (!rc) ps_rle_free(&m3[0]), free(m3), free(d3);
    /* results: polygons, a size that is not the image's, a missing segmentation */
    static const char *bad[][2] = {
        {"[{\"image_id\":1,\"category_id\":1,\"score\":0.5,\"segmentation\":[[1,1,3,1,3,3]]}]",
         "results carry RLEs"},
        {"[{\"image_id\":2,\"category_id\":1,\"score\":0.5,\"segmentation\":{\"size\":[8,10],"
         "\"counts\":[80]}}]", "is not the image's [6, 6]"},
        {"[{\"image_id\":2,\"category_id\":1,\"score\":0.5,\"bbox\":[1,1,1,1]}]",
         "missing field 'segmentation'"}};
    ps_log_level = -1;
    for (int i = 0; i < 3; i++) {
        rc = ps_coco_parse_results(&d3, &m3, &n3, bad[i][0], strlen(bad[i][0]), "r.json", &c, 0,
                                   NULL, err, sizeof err);
        ok(rc == PS_ECORRUPT && strstr(err, "r.json: [0]") && strstr(err, bad[i][1]),
           "bad result %d: %s", i, err);
    }
    ps_coco_skips_t sk;
    rc = ps_coco_parse_results(&d3, &m3, &n3, bad[1][0], strlen(bad[1][0]), "r.json", &c, 1, &sk,
                               err, sizeof err);
    ok(rc == 0 && n3 == 0 && sk.dets == 1, "lenient: the bad result skipped and counted");
    free(d3), free(m3);
    ps_log_level = PS_LOG_INFO;
    for (int i = 0; i < 4; i++) ps_rle_free(&masks[i]), ps_rle_free(&m2[i]);
    free(d2), free(m2);
    unlink(p);
    rmdir(dir);
    ps_coco_free(&c);
}

/* crowd-only image, images without objects: nothing to find there, no
 * false positive inside the crowd region */
static void crowd_and_empty(void)
{
    char err[512] = "";
    const char *j = gt_with(
        "{\"id\":1,\"image_id\":1,\"category_id\":1,\"bbox\":[2,1,4,3],"
        "\"segmentation\":[[2,1,6,1,6,4,2,4]]},"
        "{\"id\":3,\"image_id\":2,\"category_id\":1,\"bbox\":[1,1,2,4],\"iscrowd\":1,"
        "\"segmentation\":{\"size\":[6,6],\"counts\":[7,4,2,4,19]}}");
    ps_coco_t c;
    is_int(ps_coco_parse(&c, j, strlen(j), "t.json", 0, NULL, err, sizeof err), 0, "crowd-only image 2");
    ps_rle_t m[2];
    ps_coco_segm_rle(&c.anns[0].segm, 8, 10, &m[0]);
    ps_coco_segm_rle(&c.anns[1].segm, 6, 6, &m[1]);
    ps_coco_det_t d[2] = {{1, 1, {2, 1, 4, 3}, 0.6}, {2, 1, {1, 1, 2, 4}, 0.9}};
    ps_coco_eval_result_t r;
    is_int(ps_coco_evaluate_segm(&r, &c, d, m, 2), 0, "evaluate");
    is_close(r.stats[PS_COCO_AP], 1.0, 1e-12, 0,
             "a higher-scored detection on the crowd region is ignored: AP 1");
    ps_coco_eval_free(&r);
    is_int(ps_coco_evaluate_segm(&r, &c, d, m, 0), 0, "no detections");
    is_close(r.stats[PS_COCO_AP], 0, 0, 0, "no detections: AP 0");
    ps_coco_eval_free(&r);
    ps_rle_free(&m[0]), ps_rle_free(&m[1]);
    ps_coco_free(&c);
}

int main(void)
{
    read_forms();
    bad_segmentations();
    results_and_eval();
    crowd_and_empty();
    return tap_done();
}
