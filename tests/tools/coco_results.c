/* coco_results GT.json OUT.json: writes a COCO results file with masks
 * (ps_coco_save_results) of detections made from GT's own masks (shifted
 * by up to a pixel, some given another category, plus one false positive
 * per image), then prints the C evaluator's 12 stats of them, boxes and
 * masks:
 *   bbox <12 numbers>
 *   segm <12 numbers>
 * (%.17g), for tests/check_coco_pycocotools.sh to compare with
 * pycocotools' COCOeval on the same file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/det/coco_eval.h"
#include "worker/det/coco_json.h"

/* mask shifted by (dx, dy) pixels, re-encoded into *out */
static int shifted(const ps_rle_t *m, int dx, int dy, ps_rle_t *out)
{
    int h = m->h, w = m->w;
    uint8_t *a = malloc((size_t)h * w), *b = calloc((size_t)h * w, 1);
    if (!a || !b) return free(a), free(b), -1;
    ps_rle_decode(m, a, w);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int sx = x - dx, sy = y - dy;
            if (sx >= 0 && sx < w && sy >= 0 && sy < h) b[y * w + x] = a[sy * w + sx];
        }
    int rc = ps_rle_encode(out, b, w, h, w);
    free(a), free(b);
    return rc;
}

static void print_stats(const char *kind, const ps_coco_eval_result_t *r)
{
    printf("%s", kind);
    for (int s = 0; s < PS_COCO_NSTATS; s++) printf(" %.17g", r->stats[s]);
    printf("\n");
}

int main(int argc, char **argv)
{
    char err[1024];
    ps_coco_t gt;
    if (argc != 3) {
        fprintf(stderr, "usage: coco_results GT.json OUT.json\n");
        return 2;
    }
    if (ps_coco_load(&gt, argv[1], 0, NULL, err, sizeof err)) {
        fprintf(stderr, "coco_results: %s\n", err);
        return 1;
    }
    int cap = gt.nanns + gt.nimages + 1, n = 0, rc = 0;
    ps_coco_det_t *d = calloc((size_t)cap, sizeof *d);
    ps_rle_t *m = calloc((size_t)cap, sizeof *m);
    for (int i = 0; i < gt.nanns && !rc; i++) {
        const ps_coco_ann_t *a = &gt.anns[i];
        int im = ps_coco_find_image(&gt, a->image_id);
        ps_rle_t g;
        if (ps_coco_segm_rle(&a->segm, gt.images[im].height, gt.images[im].width, &g)) continue;
        rc = shifted(&g, (int)(a->id % 3) - 1, (int)(a->id / 3 % 3) - 1, &m[n]);
        ps_rle_free(&g);
        d[n].image_id = a->image_id;
        d[n].category_id = a->id % 4 ? a->category_id : gt.cats[a->id / 4 % gt.ncats].id;
        d[n].score = a->id % 5 ? fmod(0.6180339887 * (double)a->id, 1.0) : 0.5; /* some ties */
        ps_rle_to_bbox(&m[n], d[n].bbox);
        n++;
    }
    for (int i = 0; i < gt.nimages && !rc; i++) { /* a false positive: a block in the middle */
        const ps_coco_image_t *im = &gt.images[i];
        uint8_t *b = calloc((size_t)im->width * im->height, 1);
        for (int y = im->height / 3; y < im->height / 2; y++)
            for (int x = im->width / 3; x < im->width / 2; x++) b[y * im->width + x] = 1;
        rc = ps_rle_encode(&m[n], b, im->width, im->height, im->width);
        free(b);
        d[n].image_id = im->id;
        d[n].category_id = gt.cats[0].id;
        d[n].score = 0.3;
        ps_rle_to_bbox(&m[n], d[n].bbox);
        n++;
    }
    ps_coco_eval_result_t rb, rs;
    if (rc || ps_coco_save_results(d, m, n, argv[2], err, sizeof err) ||
        ps_coco_evaluate(&rb, &gt, d, n) || ps_coco_evaluate_segm(&rs, &gt, d, m, n)) {
        fprintf(stderr, "coco_results: failed (%s)\n", err);
        return 1;
    }
    print_stats("bbox", &rb);
    print_stats("segm", &rs);
    ps_coco_eval_free(&rb);
    ps_coco_eval_free(&rs);
    for (int i = 0; i < n; i++) ps_rle_free(&m[i]);
    free(d), free(m);
    ps_coco_free(&gt);
    return 0;
}
