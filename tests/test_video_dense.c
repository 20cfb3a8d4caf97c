/* Dense clip sampling for the 3-D models and the loader's cost figures:
 *   - train and test frame indices against mmaction2's SampleFrames rule
 *     computed independently in numpy (tests/golden/gen_video_dense.py),
 *     short videos looping, several test clips per video;
 *   - a dense sample of the golden 6-frame clip is the TSN sample of the
 *     same frames (the pixels follow the indices, nothing else changes);
 *   - bytes read per sample and per loader batch equal the sizes of the
 *     frame files the indices name (stat()), frames = clips * T, and the
 *     times are non-negative and finite;
 *   - bad sampling options are refused with a message. */
#include "tests/lib/tap.h"
#include "worker/data/ps_video.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *srcdir(void)
{
    const char *s = getenv("top_srcdir");
    return s && *s ? s : ".";
}

static void test_golden_indices(void)
{
    char path[1024], line[1024];
    snprintf(path, sizeof path, "%s/tests/golden/video_dense.txt", srcdir());
    FILE *f = fopen(path, "r");
    if (!ok(f != NULL, "open %s", path)) return;
    int ntest = 0, ntrain = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        int N, T, stride, a, b, c = 0, off = 0, got[64];
        const char *p;
        if (sscanf(line, "test %d %d %d %d %d%n", &N, &T, &stride, &a, &b, &off) == 5) {
            ps_video_dense_test_indices(N, T, stride, a, b, got);
            ntest++;
        } else if (sscanf(line, "train %d %d %d %d %d %d%n", &N, &T, &stride, &a, &b, &c,
                          &off) == 6) {
            ps_vrng_t r = ps_vrng_sample((uint64_t)a, (uint64_t)b, (uint64_t)c);
            ps_video_dense_train_indices(N, T, stride, &r, got);
            ntrain++;
        } else {
            continue;
        }
        p = line + off;
        for (int t = 0; t < T; t++) {
            int want, used;
            if (sscanf(p, "%d%n", &want, &used) != 1 || got[t] != want) {
                bad++;
                diag("%.*s: frame %d is %d", (int)strcspn(line, "\n"), line, t, got[t]);
                break;
            }
            p += used;
        }
    }
    fclose(f);
    ok(ntest >= 10 && ntrain >= 5 && bad == 0,
       "dense indices = mmaction2's SampleFrames rule (%d test clips, %d train clips, %d differ)",
       ntest, ntrain, bad);
}

static long file_size(const char *root, const char *dir, int frame)
{
    char p[2048];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s/img_%05d.jpg", root, dir, frame);
    return stat(p, &st) ? -1 : (long)st.st_size;
}

static void test_samples_and_io(void)
{
    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    char root[1024], path[1200], err[1024];
    snprintf(root, sizeof root, "%s/tests/golden/video", srcdir());
    snprintf(path, sizeof path, "%s/list.txt", root);
    lo.root = root;
    ps_video_list_t *l = NULL;
    int rc = ps_video_list_load(path, &lo, &l, err, sizeof err);
    if (!ok(rc == 0, "golden clip list loads %s", rc ? err : "")) return;
    const int T = 4, S = 24;
    ps_video_opts_t d, t;
    ps_video_opts_default(&d);
    d.train = 0, d.n_segment = T, d.crop_h = d.crop_w = S, d.scale_size = 28;
    d.sampling = PS_VIDEO_SAMPLING_DENSE, d.stride = 2;
    t = d;
    t.sampling = PS_VIDEO_SAMPLING_TSN;
    const size_t nf = (size_t)3 * S * S;
    float *a = malloc(T * nf * sizeof *a), *b = malloc(nf * sizeof *b);
    ps_video_io_t io = {0, 0, 0, 0, 0};
    rc = ps_video_load_sample_io(l, &d, 0, 0, a, &io, err, sizeof err);
    is_int(rc, 0, "dense test sample of the 6-frame clip %s", rc ? err : "");
    int idx[8];
    ps_video_clip_indices(&d, 6, 0, 1, NULL, idx); /* 6 < 4*2: offset 0, looping */
    ok(idx[0] == 1 && idx[1] == 3 && idx[2] == 5 && idx[3] == 1,
       "short video loops: frames %d %d %d %d", idx[0], idx[1], idx[2], idx[3]);
    /* each dense frame equals the TSN sample's frame with the same index
     * (T = 1 TSN sample of a 1-frame "video" is its frame 1, so compare
     * through a TSN sample of 4 segments instead: frames 1, 2, 4, 5) */
    float *tsn = malloc(T * nf * sizeof *tsn);
    rc = ps_video_load_sample(l, &t, 0, 0, tsn, err, sizeof err);
    int tidx[8];
    ps_video_clip_indices(&t, 6, 0, 1, NULL, tidx);
    int same = 0, cmp = 0;
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++)
            if (idx[i] == tidx[j]) {
                cmp++;
                same += !memcmp(a + i * nf, tsn + j * nf, nf * sizeof *a);
            }
    ok(rc == 0 && cmp >= 2 && same == cmp,
       "a dense frame is the pixels of the same frame in a TSN sample (%d of %d)", same, cmp);
    long bytes = 0;
    for (int i = 0; i < T; i++) bytes += file_size(root, "vid_a", idx[i]);
    ok(io.samples == 1 && io.frames == (uint64_t)T && io.bytes == (uint64_t)bytes,
       "sample cost: 1 sample, %llu frames, %llu bytes = the files' %ld",
       (unsigned long long)io.frames, (unsigned long long)io.bytes, bytes);
    ok(io.read_s >= 0 && io.decode_s >= 0 && isfinite(io.read_s + io.decode_s),
       "read %.3g s, decode %.3g s", io.read_s, io.decode_s);

    /* the loader adds the batches' costs up: 3 test clips per video */
    ps_video_opts_t lo3 = d;
    lo3.n_clips = 3, lo3.batch = 1, lo3.threads = 1, lo3.prefetch = 2;
    ps_video_loader_t *ld = NULL;
    rc = ps_video_loader_new(l, &lo3, &ld, err, sizeof err);
    if (ok(rc == 0, "loader %s", rc ? err : "")) {
        float *clips = malloc(3 * T * nf * sizeof *clips);
        int32_t lab;
        int n = ps_video_loader_next(ld, clips, &lab, NULL, NULL);
        ps_video_io_t last, total;
        ps_video_loader_io(ld, &last, &total);
        long want = 0;
        for (int c = 0; c < 3; c++) {
            ps_video_clip_indices(&lo3, 6, c, 3, NULL, idx);
            for (int i = 0; i < T; i++) want += file_size(root, "vid_a", idx[i]);
        }
        ok(n == 1 && last.frames == 3u * T && last.bytes == (uint64_t)want &&
               total.bytes == last.bytes && total.samples == 1,
           "loader batch cost: %llu frames, %llu bytes (files: %ld), total = last",
           (unsigned long long)last.frames, (unsigned long long)last.bytes, want);
        free(clips);
        ps_video_loader_destroy(&ld);
    }

    ps_video_opts_t bad = d;
    bad.stride = 0;
    ok(ps_video_opts_check(&bad, err, sizeof err) < 0 && strstr(err, "stride"),
       "stride 0 refused: %s", err);
    bad = d;
    bad.sampling = 7;
    ok(ps_video_opts_check(&bad, err, sizeof err) < 0 && strstr(err, "sampling"),
       "sampling 7 refused: %s", err);
    free(a), free(b), free(tsn);
    ps_video_list_free(&l);
}

int main(void)
{
    test_golden_indices();
    test_samples_and_io();
    return tap_done();
}
