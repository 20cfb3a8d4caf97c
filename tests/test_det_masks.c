/* Instance masks in the detection pipeline: the nearest resize and the
 * Mask R-CNN targets (worker/det/det_masks.h) against torchvision
 * (tests/golden/gen_det_masks.py -> det_masks.bin: F.interpolate and
 * roi_heads.project_masks_on_boxes); the loader's instances and masks
 * against closed-form expectations (an image doubled in size, mirrored,
 * padded), any thread count giving the same batches, a generated dataset's
 * masks against its boxes, and bad input (an instance without
 * segmentation, more instances than the bound, a crowd-only image,
 * degenerate boxes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include "tests/lib/det_testutil.h"
#include "tests/lib/golden_io.h"
#include "tests/lib/tap.h"
#include "worker/data/ps_image.h"
#include "worker/det/det_data.h"
#include "worker/det/det_masks.h"
#include "worker/det/gen_det.h"

static char dir[] = "/tmp/test_det_masks_XXXXXX";

static const golden_rec_t *need(const char *fmt, int i)
{
    char name[64];
    snprintf(name, sizeof name, fmt, i);
    return golden_find(name);
}

static void golden(void)
{
    golden_load_or_bail("tests/golden/det_masks.bin", 64);
    int nrs = 0, rs_ok = 0;
    for (int i = 0;; i++) {
        const golden_rec_t *in = need("rs%d_in", i), *out = need("rs%d_out", i);
        if (!in || !out) break;
        int ih = in->dims[0], iw = in->dims[1], oh = out->dims[0], ow = out->dims[1];
        uint8_t *src = malloc((size_t)ih * iw), *dst = malloc((size_t)oh * (ow + 3));
        for (int k = 0; k < ih * iw; k++) src[k] = (uint8_t)((int32_t *)in->data)[k];
        memset(dst, 9, (size_t)oh * (ow + 3));
        ps_det_mask_resize(dst, ow + 3, oh, ow, src, iw, ih, iw, 0);
        int same = 1;
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++)
                same &= dst[y * (ow + 3) + x] == ((int32_t *)out->data)[y * ow + x];
        /* mirrored: the same rows read right to left */
        ps_det_mask_resize(dst, ow + 3, oh, ow, src, iw, ih, iw, 1);
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++)
                same &= dst[y * (ow + 3) + ow - 1 - x] == ((int32_t *)out->data)[y * ow + x];
        if (!same) diag("resize %d: %dx%d -> %dx%d differs", i, ih, iw, oh, ow);
        rs_ok += same;
        nrs++;
        free(src), free(dst);
    }
    ok(nrs >= 8 && rs_ok == nrs, "%d of %d nearest resizes equal F.interpolate (and mirror)", rs_ok,
       nrs);
    int nmt = 0;
    for (int i = 0;; i++) {
        const golden_rec_t *mk = need("mt%d_masks", i), *bx = need("mt%d_boxes", i),
                           *ix = need("mt%d_idx", i), *mm = need("mt%d_M", i),
                           *want = need("mt%d_out", i);
        if (!mk || !bx || !ix || !mm || !want) break;
        int K = mk->dims[0], H = mk->dims[1], W = mk->dims[2], N = bx->dims[0];
        int M = ((int32_t *)mm->data)[0];
        uint8_t *m = malloc((size_t)K * H * (W + 5));
        for (int k = 0; k < K; k++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W + 5; x++)
                    m[((size_t)k * H + y) * (W + 5) + x] =
                        x < W ? (uint8_t)((int32_t *)mk->data)[((size_t)k * H + y) * W + x] : 1;
        float *got = malloc(sizeof(float) * (size_t)N * M * M);
        for (int n = 0; n < N; n++) {
            int k = ((int32_t *)ix->data)[n];
            /* stride W + 5 with 1s beyond W: only h x w may be read */
            ps_det_mask_target(got + (size_t)n * M * M, M, m + (size_t)k * H * (W + 5), W + 5, H, W,
                               (float *)bx->data + 4 * n);
        }
        char what[96];
        snprintf(what, sizeof what, "project_masks_on_boxes %dx%d, %d boxes, M %d", H, W, N, M);
        allclose(got, (float *)want->data, (long)N * M * M, 0, 0, what);
        nmt++;
        free(m), free(got);
    }
    ok(nmt >= 5, "%d mask-target cases", nmt);
    int nps = 0;
    for (int i = 0;; i++) {
        const golden_rec_t *pr = need("ps%d_prob", i), *bx = need("ps%d_boxes", i),
                           *hw = need("ps%d_hw", i), *want = need("ps%d_out", i);
        if (!pr || !bx || !hw || !want) break;
        int N = pr->dims[0], M = pr->dims[1], h = ((int32_t *)hw->data)[0];
        int w = ((int32_t *)hw->data)[1];
        float *got = malloc(sizeof(float) * (size_t)N * h * w);
        for (int n = 0; n < N; n++)
            ps_det_mask_paste(got + (size_t)n * h * w, h, w, (float *)pr->data + (size_t)n * M * M,
                              M, (float *)bx->data + 4 * n);
        char what[96];
        snprintf(what, sizeof what, "paste_masks_in_image %dx%d, %d boxes, M %d", h, w, N, M);
        allclose(got, (float *)want->data, (long)N * h * w, 1e-6, 1e-6, what);
        nps++;
        free(got);
    }
    ok(nps >= 3, "%d mask-paste cases", nps);
    /* wholly outside the image (beyond each side): an empty mask */
    float prob[28 * 28], img[20 * 30];
    for (int k = 0; k < 28 * 28; k++) prob[k] = 0.9f;
    static const float off[4][4] = {{33, 2, 40, 9}, {-12, -9, -2.5f, -1}, {2, 25, 9, 31},
                                    {5, -15, 9, -3}};
    int empty = 1;
    for (int b = 0; b < 4; b++) {
        ps_det_mask_paste(img, 20, 30, prob, 28, off[b]);
        for (int k = 0; k < 20 * 30; k++) empty &= img[k] == 0.0f;
    }
    ok(empty, "mask paste: boxes beyond each side of the image paste nothing");
    golden_free();
}

static const char *write_json(const char *name, const char *text)
{
    static char path[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
    FILE *f = fopen(path[k], "w");
    fputs(text, f);
    fclose(f);
    return path[k];
}

/* image 1 (32 wide, 16 high): a 5x3 rectangle at (2,4) (polygon) and an L
 * (uncompressed RLE) at x 20..22, y 2..6; a crowd region and a zero-width
 * box, which are no instances.  Image 2: crowd only.  Image 3: nothing. */
static const char *GT =
    "{\"images\":[{\"id\":1,\"file_name\":\"a.jpg\",\"width\":32,\"height\":16},"
    "{\"id\":2,\"file_name\":\"a.jpg\",\"width\":32,\"height\":16},"
    "{\"id\":3,\"file_name\":\"a.jpg\",\"width\":32,\"height\":16}],"
    "\"annotations\":["
    "{\"id\":11,\"image_id\":1,\"category_id\":5,\"bbox\":[2,4,5,3],\"segmentation\":[[2,4,7,4,7,7,2,7]]},"
    "{\"id\":12,\"image_id\":1,\"category_id\":8,\"bbox\":[20,2,3,5],"
    /* column 20: y 2..6 (5 px); columns 21, 22: y 6 only */
    "\"segmentation\":{\"size\":[16,32],\"counts\":[322,5,15,1,15,1,153]}},"
    "{\"id\":13,\"image_id\":1,\"category_id\":5,\"bbox\":[10,10,4,4],\"iscrowd\":1,"
    "\"segmentation\":[[10,10,14,10,14,14,10,14]]},"
    "{\"id\":14,\"image_id\":1,\"category_id\":5,\"bbox\":[12,1,0,4],\"segmentation\":[[12,1,12,5,12,3]]},"
    "{\"id\":15,\"image_id\":2,\"category_id\":8,\"bbox\":[1,1,30,14],\"iscrowd\":1,"
    "\"segmentation\":{\"size\":[16,32],\"counts\":[0,512]}}],"
    "\"categories\":[{\"id\":5,\"name\":\"a\"},{\"id\":8,\"name\":\"b\"}]}";

/* the expected mask at the input: the pixel (x, y) of the original image at
 * (x / 2, y / 2), mirrored in the 64 wide image when flip */
static int rect_px(int x, int y) { return x >= 2 && x < 7 && y >= 4 && y < 7; }
static int ell_px(int x, int y) { return (x == 20 && y >= 2 && y <= 6) || (x >= 21 && x <= 22 && y == 6); }

static void pipeline(void)
{
    char err[2048] = "";
    ok(!det_write_jpeg(dir, "a.jpg", 32, 16, 128, 128, 128), "32x16 JPEG written");
    const char *gt = write_json("gt.json", GT);
    ps_det_dataset_t *ds = NULL;
    is_int(ps_det_dataset_load(&ds, gt, dir, 1, 0, err, sizeof err), 0, "loads (%s)", err);
    is_int((int)ps_det_dataset_size(ds), 1, "crowd-only and empty images are left out of training");
    is_int(ps_det_dataset_max_instances(ds), 2, "2 instances (crowd and zero-width box are none)");
    ok(ps_det_dataset_unmasked(ds) == NULL, "every instance has a segmentation");
    ps_det_data_opts_t o;
    ps_det_data_opts_default(&o);
    o.size = 64; /* longer side 32 -> 64: every pixel doubled */
    o.train = 1;
    o.masks = 1;
    o.batch = 1;
    o.threads = 0;
    o.shuffle = 0;
    int S = 64;
    for (int flip = 0; flip < 2; flip++) {
        o.flip = flip;
        /* an epoch whose stream flips sample 0 (or not) */
        uint64_t ep = 0;
        ps_det_loader_t *ld = NULL;
        ps_det_batch_t b;
        ps_det_geom_t g;
        float img[3 * 64 * 64];
        for (;; ep++) {
            ps_det_load_sample(ds, &o, NULL, 0, ep, 0, img, NULL, NULL, &g, NULL, err, sizeof err);
            if (g.flip == flip) break;
        }
        is_int(ps_det_loader_new(ds, &o, NULL, 0, &ld, err, sizeof err), 0,
               "loader without anchors, with masks (%s)", err);
        if (!ld) continue;
        is_int(ps_det_batch_alloc(ld, &b), 0, "batch");
        ok(b.labels == NULL && b.max_inst == 2 && b.gt_masks, "no anchor targets; 2 instances held");
        ps_det_loader_seek(ld, ep, 0);
        is_int(ps_det_loader_next(ld, &b, NULL), 1, "one sample (flip %d)", flip);
        is_int(b.gt_count[0], 2, "2 instances");
        float r[4] = {4, 8, 14, 14}, l[4] = {40, 4, 46, 14};
        if (flip) r[0] = 64 - 14, r[2] = 64 - 4, l[0] = 64 - 46, l[2] = 64 - 40;
        ok(!memcmp(b.gt_boxes, r, sizeof r) && !memcmp(b.gt_boxes + 4, l, sizeof l) &&
           b.gt_classes[0] == 0 && b.gt_classes[1] == 1,
           "boxes doubled%s, classes 0 and 1", flip ? " and mirrored" : "");
        int exact = 1, pad = 1;
        for (int y = 0; y < S; y++)
            for (int x = 0; x < S; x++) {
                int sx = (flip ? 63 - x : x) / 2, sy = y / 2;
                int in = y < 32;
                exact &= b.gt_masks[y * S + x] == (in && rect_px(sx, sy));
                exact &= b.gt_masks[S * S + y * S + x] == (in && ell_px(sx, sy));
                if (!in) pad &= !b.gt_masks[y * S + x] && !b.gt_masks[S * S + y * S + x];
            }
        ok(exact, "masks: each pixel doubled%s (polygon and RLE)", flip ? ", mirrored" : "");
        ok(pad, "padding rows are 0");
        /* the rectangle's own target: 1 in the middle, within [0, 1] */
        float t[28 * 28], mn = 1, mx = 0;
        ps_det_mask_target(t, 28, b.gt_masks, S, b.geom[0].h, b.geom[0].w, b.gt_boxes);
        for (int k = 0; k < 28 * 28; k++) mn = fminf(mn, t[k]), mx = fmaxf(mx, t[k]);
        ok(t[14 * 28 + 14] == 1 && mn >= 0 && mx <= 1,
           "mask target of the box's own mask: 1 in the middle, in [%.3f, %.3f]", mn, mx);
        ps_det_batch_free(&b);
        ps_det_loader_destroy(&ld);
    }
    /* bounds and missing segmentations are errors at the loader's creation */
    ps_det_loader_t *ld = NULL;
    ps_log_level = -1;
    o.max_instances = 1;
    ok(ps_det_loader_new(ds, &o, NULL, 0, &ld, err, sizeof err) == PS_ERANGE &&
       strstr(err, "image 1: 2 instances, more than max_instances 1"),
       "more instances than max_instances: error naming the image (%s)", err);
    o.max_instances = 0;
    ps_det_dataset_free(&ds);
    const char *nos = write_json("nosegm.json",
        "{\"images\":[{\"id\":1,\"file_name\":\"a.jpg\",\"width\":32,\"height\":16}],"
        "\"annotations\":[{\"id\":7,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,4,4]}],"
        "\"categories\":[{\"id\":1}]}");
    is_int(ps_det_dataset_load(&ds, nos, dir, 1, 0, err, sizeof err), 0, "boxes-only set loads");
    ok(ps_det_loader_new(ds, &o, NULL, 0, &ld, err, sizeof err) == PS_EINVAL &&
       strstr(err, "annotation 7 (image 1) has no segmentation"),
       "masks asked of a boxes-only set: error naming the annotation (%s)", err);
    o.masks = 0;
    o.instances = 1;
    is_int(ps_det_loader_new(ds, &o, NULL, 0, &ld, err, sizeof err), 0,
           "instances without masks from the same set");
    ps_det_loader_destroy(&ld);
    ps_log_level = PS_LOG_INFO;
    ps_det_dataset_free(&ds);
    const char *co = write_json("crowd.json",
        "{\"images\":[{\"id\":1,\"file_name\":\"a.jpg\",\"width\":32,\"height\":16}],"
        "\"annotations\":[{\"id\":7,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,4,4],\"iscrowd\":1},"
        "{\"id\":8,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,0,4]}],\"categories\":[{\"id\":1}]}");
    ps_log_level = -1;
    ok(ps_det_dataset_load(&ds, co, dir, 1, 0, err, sizeof err) == PS_EINVAL &&
       strstr(err, "no usable images"), "only crowd and degenerate boxes: no training set (%s)", err);
    ps_log_level = PS_LOG_INFO;
}

/* a generated set with masks: any thread count gives the same batches;
 * each instance's mask fills its box */
static void generated(void)
{
    char gd[600], err[2048] = "", js[700], root[700];
    snprintf(gd, sizeof gd, "%s/gen", dir);
    ps_det_gen_opts_t go;
    ps_det_gen_defaults(&go, 8);
    go.n_val = 1;
    go.classes = 6;
    go.masks = 1;
    ok(!ps_det_gen(gd, 8, 64, 5, &go, err, sizeof err), "generated 8 images with masks");
    snprintf(js, sizeof js, "%s/annotations/instances_train.json", gd);
    snprintf(root, sizeof root, "%s/train", gd);
    ps_det_dataset_t *ds = NULL;
    is_int(ps_det_dataset_load(&ds, js, root, 1, 0, err, sizeof err), 0, "loads");
    ps_det_data_opts_t o;
    ps_det_data_opts_default(&o);
    o.size = 80; /* 64 -> 80: masks upsampled by 1.25 */
    o.train = 1;
    o.masks = 1;
    o.batch = 3;
    ps_det_loader_t *l0 = NULL, *l2 = NULL;
    ps_det_batch_t b0, b2;
    o.threads = 0;
    ps_det_loader_new(ds, &o, NULL, 0, &l0, err, sizeof err);
    o.threads = 2;
    o.prefetch = 3;
    ps_det_loader_new(ds, &o, NULL, 0, &l2, err, sizeof err);
    if (!l0 || !l2) {
        ok(0, "loaders (%s)", err);
        return;
    }
    ps_det_batch_alloc(l0, &b0);
    ps_det_batch_alloc(l2, &b2);
    int same = 1, fits = 1, inst = 0, batches = 0, K = b0.max_inst, S = 80;
    for (int e = 0; e < 2; e++) {
        ps_det_loader_seek(l0, (uint64_t)e, 0);
        ps_det_loader_seek(l2, (uint64_t)e, 0);
        int n;
        while ((n = ps_det_loader_next(l0, &b0, NULL)) > 0) {
            same &= ps_det_loader_next(l2, &b2, NULL) == n &&
                    !memcmp(b0.gt_masks, b2.gt_masks, (size_t)n * K * S * S) &&
                    !memcmp(b0.gt_boxes, b2.gt_boxes, sizeof(float) * 4 * K * n) &&
                    !memcmp(b0.gt_count, b2.gt_count, sizeof(int32_t) * n);
            for (int j = 0; j < n; j++)
                for (int k = 0; k < b0.gt_count[j]; k++, inst++) {
                    const uint8_t *m = b0.gt_masks + ((size_t)j * K + k) * S * S;
                    const float *bx = b0.gt_boxes + ((size_t)j * K + k) * 4;
                    int x0 = S, y0 = S, x1 = -1, y1 = -1;
                    for (int y = 0; y < S; y++)
                        for (int x = 0; x < S; x++)
                            if (m[y * S + x]) {
                                x0 = x < x0 ? x : x0, x1 = x > x1 ? x : x1;
                                y0 = y < y0 ? y : y0, y1 = y > y1 ? y : y1;
                            }
                    /* nearest resampling moves an edge by at most a pixel */
                    fits &= fabsf(x0 - bx[0]) <= 1 && fabsf(x1 + 1 - bx[2]) <= 1 &&
                            fabsf(y0 - bx[1]) <= 1 && fabsf(y1 + 1 - bx[3]) <= 1;
                }
            batches++;
        }
    }
    ok(same && batches > 0, "0 and 2 loader threads: the same instances and masks (%d batches)",
       batches);
    ok(fits && inst > 0, "every instance's mask fills its box to a pixel (%d instances)", inst);
    ps_det_batch_free(&b0), ps_det_batch_free(&b2);
    ps_det_loader_destroy(&l0), ps_det_loader_destroy(&l2);
    ps_det_dataset_free(&ds);
}

int main(void)
{
    if (!mkdtemp(dir)) {
        printf("Bail out! mkdtemp\n");
        return 1;
    }
    ps_log_level = PS_LOG_WARN;
    golden();
    pipeline();
    generated();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) diag("could not remove %s", dir);
    return tap_done();
}
