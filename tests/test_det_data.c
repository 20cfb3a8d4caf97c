/* Detection data pipeline (worker/det/det_data.h): geometry of resize / pad
 * / flip against closed-form expectations, training targets against an
 * independent assignment of the hand-transformed boxes, images without
 * boxes left out, bad input as clear errors or counted skips, and the
 * loader (any thread count gives the same batches; ranks split the data as
 * DistributedSampler). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include "tests/lib/det_testutil.h"
#include "tests/lib/tap.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_video.h"
#include "worker/det/det_boxes.h"
#include "worker/det/det_data.h"
#include "worker/det/gen_det.h"

static char dir[] = "/tmp/test_det_data_XXXXXX";

static int write_jpeg(const char *name, int w, int h, uint8_t r, uint8_t g, uint8_t b)
{
    return det_write_jpeg(dir, name, w, h, r, g, b);
}

static void write_text(const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static const char *path_of(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* anchors of a 64 x 64 RetinaNet input (levels P3..P7), as the model makes them */
static float *make_anchors(int S, int *A)
{
    int strides[5] = {8, 16, 32, 64, 128}, total = 0;
    for (int l = 0; l < 5; l++) {
        int n = (S + strides[l] - 1) / strides[l];
        total += n * n * 9;
    }
    float *a = malloc(sizeof(float) * 4 * (size_t)total), *p = a;
    for (int l = 0; l < 5; l++) {
        float sizes[3], cell[36];
        int n = (S + strides[l] - 1) / strides[l];
        ps_det_retina_sizes(sizes, strides[l]);
        ps_det_cell_anchors(cell, sizes, 3, ps_det_retina_ratios, 3);
        ps_det_grid_anchors(p, cell, 9, n, n, strides[l]);
        p += (size_t)n * n * 9 * 4;
    }
    *A = total;
    return a;
}

static const char *GT_JSON =
    "{\"images\":[{\"id\":1,\"file_name\":\"wide.jpg\",\"width\":64,\"height\":32},"
    "{\"id\":2,\"file_name\":\"empty.jpg\",\"width\":32,\"height\":32},"
    "{\"id\":3,\"file_name\":\"big.jpg\",\"width\":128,\"height\":96}],"
    "\"annotations\":[{\"id\":10,\"image_id\":1,\"category_id\":7,\"bbox\":[4,6,30,20]},"
    "{\"id\":11,\"image_id\":3,\"category_id\":3,\"bbox\":[40,20,60,50]},"
    "{\"id\":12,\"image_id\":3,\"category_id\":7,\"bbox\":[0,0,30,30],\"iscrowd\":1}],"
    "\"categories\":[{\"id\":7,\"name\":\"b\"},{\"id\":3,\"name\":\"a\"}]}";

int main(void)
{
    char err[2048] = "";
    if (!mkdtemp(dir)) {
        printf("Bail out! mkdtemp\n");
        return 1;
    }
    ps_log_level = PS_LOG_ERROR;
    ok(!write_jpeg("wide.jpg", 64, 32, 200, 100, 50) && !write_jpeg("empty.jpg", 32, 32, 0, 0, 0) &&
       !write_jpeg("big.jpg", 128, 96, 10, 250, 128), "test images written");
    write_text("gt.json", GT_JSON);

    ps_det_dataset_t *ds = NULL, *dv = NULL;
    is_int(ps_det_dataset_load(&ds, path_of("gt.json"), dir, 1, 0, err, sizeof err), 0,
           "training set loads (%s)", err);
    is_int((int)ps_det_dataset_size(ds), 2, "training index: 2 images with boxes");
    is_int((int)ps_det_dataset_skipped_empty(ds), 1, "the image without boxes is left out (counted)");
    is_int(ps_det_dataset_num_classes(ds), 2, "2 classes");
    ok(ps_det_dataset_class_cat(ds, 0) == 3 && ps_det_dataset_class_cat(ds, 1) == 7,
       "classes follow ascending category ids (3 -> 0, 7 -> 1)");
    is_int(ps_det_dataset_load(&dv, path_of("gt.json"), dir, 0, 0, err, sizeof err), 0,
           "validation set loads");
    is_int((int)ps_det_dataset_size(dv), 3, "validation keeps every image");

    int S = 64, A;
    float *anchors = make_anchors(S, &A);
    float *img = malloc(sizeof(float) * 3 * S * S), *bt = malloc(sizeof(float) * 4 * A);
    float *bt_ref = malloc(sizeof(float) * 4 * A);
    int32_t *lab = malloc(sizeof(int32_t) * A), *lab_ref = malloc(sizeof(int32_t) * A);
    int32_t *matched = malloc(sizeof(int32_t) * A);
    ps_det_data_opts_t o;
    ps_det_data_opts_default(&o);
    o.size = S;
    o.train = 1;
    o.flip = 0;
    ps_det_geom_t g;
    int npos = -1;

    /* wide.jpg 64x32: scale min(64/32, 64/64) = 1 -> 64x32, rows 32.. padded */
    is_int(ps_det_load_sample(ds, &o, anchors, A, 0, 0, img, lab, bt, &g, &npos, err, sizeof err),
           0, "sample 0 (%s)", err);
    ok(g.w == 64 && g.h == 32 && g.flip == 0 && fabsf(g.scale - 1) < 1e-6,
       "64x32 image: longer side capped at 64, no resize (%dx%d scale %g)", g.w, g.h, g.scale);
    {
        float want = (200 / 255.0f - 0.485f) / 0.229f;
        ok(fabsf(img[10 * S + 10] - want) < 0.05f && img[40 * S + 10] == 0 &&
           img[2 * S * S + 63 * S + 63] == 0,
           "normalised red %.3f (want %.3f +- JPEG), padding rows are 0", img[10 * S + 10], want);
    }
    float gt1[4] = {4, 6, 34, 26};
    int32_t cls1[1] = {1};
    int np_ref = ps_det_assign(matched, anchors, A, gt1, 1, 0.5f, 0.4f, NULL);
    ps_det_make_targets(lab_ref, bt_ref, matched, anchors, A, gt1, cls1, 1, 2);
    ok(npos == np_ref && np_ref > 0 && !memcmp(lab, lab_ref, sizeof(int32_t) * A) &&
       !memcmp(bt, bt_ref, sizeof(float) * 4 * A),
       "targets equal an independent assignment of box [4,6,34,26] class 1 (%d positives)", npos);

    /* big.jpg 128x96 -> scale min(64/96, 64/128) = 0.5 -> 64x48; crowd box not a target */
    is_int(ps_det_load_sample(ds, &o, anchors, A, 0, 1, img, lab, bt, &g, &npos, err, sizeof err),
           0, "sample 1");
    ok(g.w == 64 && g.h == 48 && fabsf(g.scale - 0.5f) < 1e-6, "128x96 -> 64x48 (%dx%d)", g.w, g.h);
    float gt2[4] = {20, 10, 50, 35};
    int32_t cls2[1] = {0};
    np_ref = ps_det_assign(matched, anchors, A, gt2, 1, 0.5f, 0.4f, NULL);
    ps_det_make_targets(lab_ref, bt_ref, matched, anchors, A, gt2, cls2, 1, 2);
    ok(npos == np_ref && !memcmp(lab, lab_ref, sizeof(int32_t) * A),
       "scaled box [20,10,50,35] class 0 is the only target (crowd left out; %d positives)", npos);

    /* flip: find an epoch whose stream says flip for sample 0, as documented */
    o.flip = 1;
    uint64_t ep = 0;
    for (;; ep++) {
        ps_vrng_t r = ps_vrng_sample(o.seed, ep, 0);
        if (ps_vrng_below(&r, 2) == 1) break;
    }
    float *img2 = malloc(sizeof(float) * 3 * S * S);
    ps_det_load_sample(ds, &o, anchors, A, ep, 0, img2, lab, bt, &g, &npos, err, sizeof err);
    ok(g.flip == 1, "epoch %llu flips sample 0 (stream below(2) == 1)", (unsigned long long)ep);
    float gt1f[4] = {64 - 34, 6, 64 - 4, 26};
    np_ref = ps_det_assign(matched, anchors, A, gt1f, 1, 0.5f, 0.4f, NULL);
    ps_det_make_targets(lab_ref, bt_ref, matched, anchors, A, gt1f, cls1, 1, 2);
    ok(npos == np_ref && !memcmp(lab, lab_ref, sizeof(int32_t) * A) &&
       !memcmp(bt, bt_ref, sizeof(float) * 4 * A), "flipped box [30,6,60,26]: targets equal");

    /* bad input */
    write_text("bad_box.json",
               "{\"images\":[{\"id\":1,\"file_name\":\"wide.jpg\",\"width\":64,\"height\":32}],"
               "\"annotations\":[{\"id\":1,\"image_id\":1,\"category_id\":1,\"bbox\":[50,0,30,10]},"
               "{\"id\":2,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,10,10]}],"
               "\"categories\":[{\"id\":1,\"name\":\"x\"}]}");
    ps_det_dataset_t *bad = NULL;
    ok(ps_det_dataset_load(&bad, path_of("bad_box.json"), dir, 1, 0, err, sizeof err) < 0 &&
       strstr(err, "bad_box.json") && strstr(err, "outside"),
       "box outside the image: error naming file and record (%s)", err);
    is_int(ps_det_dataset_load(&bad, path_of("bad_box.json"), dir, 1, 1, err, sizeof err), 0,
           "skip_bad: loads");
    ok(bad && ps_det_dataset_skipped_records(bad) == 1 && ps_det_dataset_size(bad) == 1,
       "skip_bad: the bad box is skipped and counted");
    ps_det_dataset_free(&bad);
    write_text("bad_cat.json",
               "{\"images\":[{\"id\":1,\"file_name\":\"wide.jpg\",\"width\":64,\"height\":32}],"
               "\"annotations\":[{\"id\":1,\"image_id\":1,\"category_id\":9,\"bbox\":[1,1,10,10]}],"
               "\"categories\":[{\"id\":1,\"name\":\"x\"}]}");
    ok(ps_det_dataset_load(&bad, path_of("bad_cat.json"), dir, 1, 0, err, sizeof err) < 0 &&
       strstr(err, "category"), "unknown category id: clear error (%s)", err);
    write_text("bad_img.json",
               "{\"images\":[{\"id\":1,\"file_name\":\"junk.jpg\",\"width\":64,\"height\":32},"
               "{\"id\":2,\"file_name\":\"wide.jpg\",\"width\":64,\"height\":32},"
               "{\"id\":3,\"file_name\":\"big.jpg\",\"width\":100,\"height\":96}],"
               "\"annotations\":[{\"id\":1,\"image_id\":1,\"category_id\":1,\"bbox\":[1,1,10,10]},"
               "{\"id\":2,\"image_id\":2,\"category_id\":1,\"bbox\":[1,1,10,10]},"
               "{\"id\":3,\"image_id\":3,\"category_id\":1,\"bbox\":[1,1,10,10]}],"
               "\"categories\":[{\"id\":1,\"name\":\"x\"}]}");
    write_text("junk.jpg", "not a jpeg");
    is_int(ps_det_dataset_load(&bad, path_of("bad_img.json"), dir, 1, 0, err, sizeof err), 0,
           "annotations of unreadable images load (images are read per sample)");
    o.flip = 0;
    ok(ps_det_load_sample(bad, &o, anchors, A, 0, 0, img, lab, bt, &g, NULL, err, sizeof err) < 0 &&
       strstr(err, "junk.jpg"), "corrupt JPEG: error naming the file (%s)", err);
    ok(ps_det_load_sample(bad, &o, anchors, A, 0, 2, img, lab, bt, &g, NULL, err, sizeof err) < 0 &&
       strstr(err, "128x96") && strstr(err, "100x96"), "size disagreeing with the JSON: error (%s)", err);
    {
        ps_det_loader_t *ld = NULL;
        ps_det_batch_t b;
        o.batch = 3;
        o.threads = 1;
        o.shuffle = 0;
        o.skip_bad = 0;
        ps_det_loader_new(bad, &o, anchors, A, &ld, err, sizeof err);
        ps_det_batch_alloc(ld, &b);
        int n = ps_det_loader_next(ld, &b, NULL);
        ok(n < 0 && strstr(ps_det_loader_error(ld), "junk.jpg"), "loader: bad image fails the batch");
        ps_det_loader_destroy(&ld);
        o.skip_bad = 1;
        ps_det_loader_new(bad, &o, anchors, A, &ld, err, sizeof err);
        n = ps_det_loader_next(ld, &b, NULL);
        /* 0 (junk) -> 1; 1; 2 (wrong size) -> 0 (junk) -> 1: three skips */
        ok(n == 3 && ps_det_loader_skipped(ld) == 3 && b.idx[0] == 1 && b.idx[1] == 1 &&
           b.idx[2] == 1, "skip_bad: the next good image stands in, 3 skips counted (n %d, skipped %zu)", n,
           ps_det_loader_skipped(ld));
        ps_det_batch_free(&b);
        ps_det_loader_destroy(&ld);
    }
    ps_det_dataset_free(&bad);

    /* loader on a generated set: thread counts agree; ranks split the data */
    {
        char gd[600];
        snprintf(gd, sizeof gd, "%s/gen", dir);
        ps_det_gen_opts_t go;
        ps_det_gen_defaults(&go, 10);
        go.n_val = 1;
        ok(!ps_det_gen(gd, 10, 64, 3, &go, err, sizeof err), "generated 10 images");
        snprintf(gd, sizeof gd, "%s/gen/annotations/instances_train.json", dir);
        ps_det_dataset_t *gs = NULL;
        char root[600];
        snprintf(root, sizeof root, "%s/gen/train", dir);
        is_int(ps_det_dataset_load(&gs, gd, root, 1, 0, err, sizeof err), 0, "generated set loads");
        ps_det_data_opts_t lo = o;
        lo.skip_bad = 0;
        lo.flip = 1;
        lo.shuffle = -1;
        lo.batch = 2;
        ps_det_batch_t b0, b2;
        ps_det_loader_t *l0 = NULL, *l2 = NULL;
        lo.threads = 0;
        ps_det_loader_new(gs, &lo, anchors, A, &l0, err, sizeof err);
        lo.threads = 2;
        lo.prefetch = 3;
        ps_det_loader_new(gs, &lo, anchors, A, &l2, err, sizeof err);
        ps_det_batch_alloc(l0, &b0);
        ps_det_batch_alloc(l2, &b2);
        int same = 1, batches = 0;
        for (int e = 0; e < 2; e++) {
            ps_det_loader_seek(l0, (uint64_t)e, 0);
            ps_det_loader_seek(l2, (uint64_t)e, 0);
            int n0, n2;
            while ((n0 = ps_det_loader_next(l0, &b0, NULL)) > 0) {
                n2 = ps_det_loader_next(l2, &b2, NULL);
                same &= n0 == n2 && !memcmp(b0.img, b2.img, sizeof(float) * 3 * S * S * n0) &&
                        !memcmp(b0.labels, b2.labels, sizeof(int32_t) * A * n0) &&
                        !memcmp(b0.idx, b2.idx, sizeof(int64_t) * n0) && b0.npos == b2.npos;
                batches++;
            }
        }
        ok(same && batches == 10, "0 and 2 loader threads give identical batches (%d)", batches);
        ps_det_batch_free(&b0);
        ps_det_batch_free(&b2);
        ps_det_loader_destroy(&l0);
        ps_det_loader_destroy(&l2);
        /* ranks 0 and 1 of 2: DistributedSampler's indices */
        int64_t want[2][8];
        size_t nw[2];
        int covered[10] = {0}, okr = 1;
        for (int r = 0; r < 2; r++) {
            nw[r] = ps_video_sampler_indices(10, lo.seed, 1, r, 2, 1, 1, want[r]);
            lo.rank = r;
            lo.world = 2;
            lo.threads = 1;
            lo.batch = 1;
            ps_det_loader_t *l = NULL;
            ps_det_loader_new(gs, &lo, anchors, A, &l, err, sizeof err);
            ps_det_batch_t b;
            ps_det_batch_alloc(l, &b);
            ps_det_loader_seek(l, 1, 0);
            size_t k = 0;
            while (ps_det_loader_next(l, &b, NULL) > 0) {
                okr &= k < nw[r] && b.idx[0] == want[r][k];
                covered[b.idx[0]]++;
                k++;
            }
            okr &= k == nw[r];
            ps_det_batch_free(&b);
            ps_det_loader_destroy(&l);
        }
        int all = 1;
        for (int i = 0; i < 10; i++) all &= covered[i] == 1;
        ok(okr && all, "2 ranks read DistributedSampler's shares, together every image once");
        ps_det_dataset_free(&gs);
    }

    free(img), free(img2), free(bt), free(bt_ref), free(lab), free(lab_ref), free(matched);
    free(anchors);
    ps_det_dataset_free(&ds);
    ps_det_dataset_free(&dv);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) diag("could not remove %s", dir);
    return tap_done();
}
