/* COCO JSON loading and COCO-style evaluation (worker/det) against
 * pycocotools: boxes (tests/golden/gen_coco_eval.py -> coco_gt.json,
 * coco_dt.json, coco_stats.txt) and masks (gen_coco_segm.py ->
 * coco_segm_gt.json, coco_segm_dt.json, coco_segm_stats.txt); hand-made
 * cases and bad inputs. */
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

static char gold_dir[4096];

/* The 12 stats and the per-category APs of a golden stats file: 0 or -1 */
static int read_stats(const char *p, double *want, int *nw, long long *cat_id, double *cat_want,
                      int *nc)
{
    FILE *f = fopen(p, "r");
    char line[256];
    *nw = *nc = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (!strncmp(line, "cat ", 4)) {
            if (*nc < 16 && sscanf(line + 4, "%lld %lf", &cat_id[*nc], &cat_want[*nc]) == 2) (*nc)++;
        } else if (*nw < PS_COCO_NSTATS && sscanf(line, "%lf", &want[*nw]) == 1) {
            (*nw)++;
        }
    }
    if (f) fclose(f);
    return f ? 0 : -1;
}

/* C evaluation of golden GT and detections (segm: masks from the results'
 * segmentation) against pycocotools' stats; returns the bbox AP wanted */
static double golden_eval(const char *gt_name, const char *dt_name, const char *stats_name,
                          int segm, ps_coco_t *gt, ps_coco_det_t **dets, int *nd)
{
    char p[4200], err[512] = "";
    ps_rle_t *masks = NULL;
    snprintf(p, sizeof p, "%s/%s", gold_dir, gt_name);
    is_int(ps_coco_load(gt, p, 0, NULL, err, sizeof err), 0, "load golden GT %s (%s)", gt_name, err);
    snprintf(p, sizeof p, "%s/%s", gold_dir, dt_name);
    is_int(ps_coco_load_results(dets, segm ? &masks : NULL, nd, p, gt, 0, NULL, err, sizeof err), 0,
           "load golden detections %s (%s)", dt_name, err);
    ok(gt->nimages >= 16 && gt->nanns > 50 && *nd > 200, "golden sizes: %d images %d anns %d dets",
       gt->nimages, gt->nanns, *nd);
    double want[PS_COCO_NSTATS], cat_want[16];
    long long cat_id[16];
    int nw, nc;
    snprintf(p, sizeof p, "%s/%s", gold_dir, stats_name);
    read_stats(p, want, &nw, cat_id, cat_want, &nc);
    is_int(nw, PS_COCO_NSTATS, "12 stats in %s", p);
    ps_coco_eval_result_t res;
    const char *kind = segm ? "segm" : "bbox";
    is_int(segm ? ps_coco_evaluate_segm(&res, gt, *dets, masks, *nd)
                : ps_coco_evaluate(&res, gt, *dets, *nd), 0, "evaluate (%s)", kind);
    static const char *names[] = {"AP", "AP50", "AP75", "APs", "APm", "APl",
                                  "AR1", "AR10", "AR100", "ARs", "ARm", "ARl"};
    double worst = 0;
    for (int s = 0; s < nw; s++) {
        is_close(res.stats[s], want[s], 1e-6, 0, "%s %s vs pycocotools", kind, names[s]);
        worst = fmax(worst, fabs(res.stats[s] - want[s]));
    }
    diag("%s: largest |C - pycocotools| over the 12 stats: %.3g", kind, worst);
    is_int(res.ncats, nc, "categories");
    for (int k = 0; k < nc && k < res.ncats; k++) {
        ok(res.cat_ids[k] == cat_id[k], "category %lld order", cat_id[k]);
        is_close(res.cat_ap[k], cat_want[k], 1e-6, 0, "%s per-category AP, category %lld", kind,
                 cat_id[k]);
    }
    char keys[128];
    ps_coco_eval_keys(&res, segm ? "segm_" : "", keys, sizeof keys);
    char expect[128];
    snprintf(expect, sizeof expect, "%smap=%.4f %sap50=%.4f %sap75=%.4f", segm ? "segm_" : "",
             want[0], segm ? "segm_" : "", want[1], segm ? "segm_" : "", want[2]);
    ok(!strcmp(keys, expect), "final-line keys '%s'", keys);
    ps_coco_eval_free(&res);
    for (int i = 0; masks && i < *nd; i++) ps_rle_free(&masks[i]);
    free(masks);
    return want[0];
}

static void golden(void)
{
    char err[512] = "";
    ps_coco_t gt;
    ps_coco_det_t *dets;
    int nd;
    ps_coco_t sgt;
    ps_coco_det_t *sdets;
    int snd;
    golden_eval("coco_segm_gt.json", "coco_segm_dt.json", "coco_segm_stats.txt", 1, &sgt, &sdets,
                &snd);
    ps_coco_free(&sgt);
    free(sdets);
    double want0 = golden_eval("coco_gt.json", "coco_dt.json", "coco_stats.txt", 0, &gt, &dets, &nd);
    ps_coco_eval_result_t res;
    is_int(ps_coco_evaluate(&res, &gt, dets, nd), 0, "evaluate");
    char txt[2048];
    ps_coco_eval_format(&res, txt, sizeof txt);
    ok(strstr(txt, "maxDets=100 ] = 0.") != NULL, "summary text formatted");
    ps_coco_eval_free(&res);

    /* save + load round trip gives the same evaluation */
    char tmpl[] = "/tmp/test_coco_XXXXXX";
    ok(mkdtemp(tmpl) != NULL, "temp dir");
    char g2[4200], d2[4200];
    snprintf(g2, sizeof g2, "%s/gt.json", tmpl);
    snprintf(d2, sizeof d2, "%s/dt.json", tmpl);
    is_int(ps_coco_save(&gt, g2, err, sizeof err), 0, "save GT");
    is_int(ps_coco_save_dets(dets, nd, d2, err, sizeof err), 0, "save detections");
    ps_coco_t gt2;
    ps_coco_det_t *dets2;
    int nd2;
    is_int(ps_coco_load(&gt2, g2, 0, NULL, err, sizeof err), 0, "reload GT");
    is_int(ps_coco_load_dets(&dets2, &nd2, d2, &gt2, 0, NULL, err, sizeof err), 0, "reload dets");
    is_int(ps_coco_evaluate(&res, &gt2, dets2, nd2), 0, "evaluate reloaded");
    is_close(res.stats[0], want0, 1e-6, 0, "AP after round trip");
    ok(nd2 == nd && !memcmp(dets2, dets, (size_t)nd * sizeof *dets), "detections bit-identical");
    ps_coco_eval_free(&res);
    unlink(g2), unlink(d2), rmdir(tmpl);
    ps_coco_free(&gt2);
    free(dets2);
    ps_coco_free(&gt);
    free(dets);
}

static const char *GT_OK =
    "{\"images\":[{\"id\":1,\"width\":100,\"height\":80,\"file_name\":\"a.jpg\"},"
    "{\"id\":2,\"width\":50,\"height\":50}],"
    "\"annotations\":[{\"id\":1,\"image_id\":1,\"category_id\":3,\"bbox\":[10,10,20,20],\"area\":400},"
    "{\"id\":2,\"image_id\":2,\"category_id\":3,\"bbox\":[0,0,50,50],\"iscrowd\":0},"
    "{\"id\":3,\"image_id\":1,\"category_id\":4,\"bbox\":[50,40,40,30],\"iscrowd\":true}],"
    "\"categories\":[{\"id\":3,\"name\":\"x\"},{\"id\":4,\"name\":\"y\"}]}";

static double eval_text(const char *gtj, const char *dtj, int stat)
{
    char err[512] = "";
    ps_coco_t gt;
    ps_coco_det_t *d;
    int nd;
    ps_coco_eval_result_t res;
    if (ps_coco_parse(&gt, gtj, strlen(gtj), "gt", 0, NULL, err, sizeof err)) return -99;
    if (ps_coco_parse_dets(&d, &nd, dtj, strlen(dtj), "dt", &gt, 0, NULL, err, sizeof err)) {
        ps_coco_free(&gt);
        return -98;
    }
    double v = -97;
    if (!ps_coco_evaluate(&res, &gt, d, nd)) v = res.stats[stat];
    ps_coco_eval_free(&res);
    ps_coco_free(&gt);
    free(d);
    return v;
}

static void hand_cases(void)
{
    /* perfect detections: AP 1 (the crowd GT of category 4 is ignored -> -1, left out) */
    const char *perfect = "[{\"image_id\":1,\"category_id\":3,\"bbox\":[10,10,20,20],\"score\":0.9},"
                          "{\"image_id\":2,\"category_id\":3,\"bbox\":[0,0,50,50],\"score\":0.8}]";
    is_close(eval_text(GT_OK, perfect, PS_COCO_AP), 1.0, 1e-12, 0, "perfect detections: AP 1");
    is_close(eval_text(GT_OK, "[]", PS_COCO_AP), 0.0, 1e-12, 0, "no detections: AP 0");
    /* a detection on the crowd region is ignored, not a false positive */
    const char *crowd = "[{\"image_id\":1,\"category_id\":3,\"bbox\":[10,10,20,20],\"score\":0.9},"
                        "{\"image_id\":2,\"category_id\":3,\"bbox\":[0,0,50,50],\"score\":0.8},"
                        "{\"image_id\":1,\"category_id\":4,\"bbox\":[55,45,10,10],\"score\":0.99}]";
    is_close(eval_text(GT_OK, crowd, PS_COCO_AP), 1.0, 1e-12, 0, "detection inside crowd ignored");
    /* one of two found, ranked first: precision 1 up to recall .5, AP50 = 51/101 */
    const char *half = "[{\"image_id\":1,\"category_id\":3,\"bbox\":[10,10,20,20],\"score\":0.9}]";
    is_close(eval_text(GT_OK, half, PS_COCO_AP50), 51.0 / 101, 1e-12, 0, "half recall: AP50 51/101");
    /* IoU 0.6 (shifted box) counts at .5 .55 .6 only: AP = 3/10 of the perfect case */
    const char *shift = "[{\"image_id\":1,\"category_id\":3,\"bbox\":[15,10,20,20],\"score\":0.9},"
                        "{\"image_id\":2,\"category_id\":3,\"bbox\":[0,0,50,50],\"score\":0.8}]";
    /* IoU = 15*20 / (400+400-300) = 0.6 -> tp at .5,.55,.6 for image 1; image 2 always */
    double ap = eval_text(GT_OK, shift, PS_COCO_AP);
    /* t<=.6: AP 1; t>.6: one tp at rank 2 after one fp: recall .5 at precision .5 */
    is_close(ap, (3 * 1.0 + 7 * (51 * 0.5) / 101) / 10, 1e-9, 0, "IoU 0.6 case: AP %g", ap);
}

static void expect_err(const char *json, int lenient, const char *needle, const char *what)
{
    char err[512] = "";
    ps_coco_t gt;
    int rc = ps_coco_parse(&gt, json, strlen(json), "t.json", lenient, NULL, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, needle), "%s: rejected naming '%s' (%s)", what, needle, err);
    if (!rc) ps_coco_free(&gt);
}

static void bad_inputs(void)
{
    ps_log_level = -1; /* errors expected below: keep the TAP output readable */
    expect_err("{\"images\": [ {\"id\": 1,, } ]}", 0, "t.json:1:", "malformed JSON");
    expect_err("{\"images\":[],\"annotations\":[]}", 0, "'categories' missing", "no categories");
    expect_err("[1,2]", 0, "top level", "array at top level");
    expect_err("{\"images\":[{\"id\":1,\"width\":10}],\"annotations\":[],\"categories\":[]}", 0,
               "images[0]: missing field 'height'", "missing height");
    expect_err("{\"images\":[{\"id\":1,\"width\":10,\"height\":10},{\"id\":1,\"width\":5,\"height\":5}],"
               "\"annotations\":[],\"categories\":[]}", 0, "duplicate id 1", "duplicate image id");
    expect_err("{\"images\":[],\"annotations\":[],\"categories\":[{\"id\":2},{\"id\":2}]}", 0,
               "categories[1].id: duplicate", "duplicate category id");
    const char *img = "{\"images\":[{\"id\":1,\"width\":100,\"height\":80}],\"categories\":[{\"id\":1}],";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s\"annotations\":[{\"id\":5,\"image_id\":1,\"category_id\":1,"
             "\"bbox\":[1,1,2,2]},{\"id\":5,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,2,2]}]}", img);
    expect_err(buf, 0, "annotations: duplicate id 5", "duplicate annotation id");
    snprintf(buf, sizeof buf, "%s\"annotations\":[{\"id\":5,\"image_id\":1,\"category_id\":9,"
             "\"bbox\":[1,1,2,2]}]}", img);
    expect_err(buf, 0, "annotations[0].category_id: unknown category 9", "unknown category");
    snprintf(buf, sizeof buf, "%s\"annotations\":[{\"id\":5,\"image_id\":7,\"category_id\":1,"
             "\"bbox\":[1,1,2,2]}]}", img);
    expect_err(buf, 0, "annotations[0].image_id: unknown image 7", "unknown image");
    snprintf(buf, sizeof buf, "%s\"annotations\":[{\"id\":5,\"image_id\":1,\"category_id\":1,"
             "\"bbox\":[90,10,20,20]}]}", img);
    expect_err(buf, 0, "annotations[0].bbox: [90,10,20,20] outside image 1", "box outside image");
    snprintf(buf, sizeof buf, "%s\"annotations\":[{\"id\":5,\"image_id\":1,\"category_id\":1,"
             "\"bbox\":[1,1,2]}]}", img);
    expect_err(buf, 0, "annotations[0].bbox: not an array of 4", "bbox of 3");
    snprintf(buf, sizeof buf, "%s\"annotations\":[{\"id\":5,\"image_id\":1,\"category_id\":1,"
             "\"bbox\":[1,1,-2,2]}]}", img);
    expect_err(buf, 0, "negative width", "negative width");
    snprintf(buf, sizeof buf, "%s\"annotations\":[{\"id\":5.5,\"image_id\":1,\"category_id\":1,"
             "\"bbox\":[1,1,2,2]}]}", img);
    expect_err(buf, 0, "annotations[0].id: not an integer", "fractional id");

    /* lenient: the bad annotations are counted and skipped */
    snprintf(buf, sizeof buf, "%s\"annotations\":[{\"id\":5,\"image_id\":1,\"category_id\":9,"
             "\"bbox\":[1,1,2,2]},{\"id\":6,\"image_id\":1,\"category_id\":1,\"bbox\":[90,10,20,20]},"
             "{\"id\":7,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,2,2]}]}", img);
    ps_coco_t gt;
    ps_coco_skips_t sk;
    char err[512] = "";
    is_int(ps_coco_parse(&gt, buf, strlen(buf), "t.json", 1, &sk, err, sizeof err), 0, "lenient load");
    ok(gt.nanns == 1 && sk.anns == 2 && gt.anns[0].id == 7, "lenient: 2 skipped, 1 kept");

    /* detections */
    ps_coco_det_t *d;
    int nd;
    const char *dj = "[{\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,2,2],\"score\":0.5},"
                     "{\"image_id\":3,\"category_id\":1,\"bbox\":[1,1,2,2],\"score\":0.5},"
                     "{\"image_id\":1,\"category_id\":8,\"bbox\":[1,1,2,2],\"score\":0.5},"
                     "{\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,2,2]}]";
    int rc = ps_coco_parse_dets(&d, &nd, dj, strlen(dj), "dt.json", &gt, 0, NULL, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "dt.json: [1].image_id: unknown image 3"),
       "detection of unknown image rejected (%s)", err);
    rc = ps_coco_parse_dets(&d, &nd, dj, strlen(dj), "dt.json", &gt, 1, &sk, err, sizeof err);
    ok(rc == 0 && nd == 1 && sk.dets == 3, "lenient detections: 3 skipped (unknown image, "
       "unknown category, missing score), %d kept", nd);
    free(d);
    rc = ps_coco_parse_dets(&d, &nd, "{\"a\":1}", 7, "dt.json", &gt, 0, NULL, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "not an array"), "detections must be an array");
    rc = ps_coco_parse_dets(&d, &nd, "[{\"image_id\":1", 14, "dt.json", &gt, 0, NULL, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "malformed"), "truncated detections JSON (%s)", err);
    ps_coco_free(&gt);
    rc = ps_coco_load(&gt, "/nonexistent/x.json", 0, NULL, err, sizeof err);
    ok(rc == PS_EIO && strstr(err, "/nonexistent/x.json"), "missing file: PS_EIO naming it");
    ps_log_level = PS_LOG_INFO;
}

int main(void)
{
    const char *top = getenv("top_srcdir");
    snprintf(gold_dir, sizeof gold_dir, "%s/tests/golden", top ? top : ".");
    golden();
    hand_cases();
    bad_inputs();
    return tap_done();
}
