/* psdata extract and the on-the-fly loader (worker/data/video_extract.c,
 * video_file_list.c, labels.c): videos in three containers are extracted
 * to frame folders and to shards; the samples of the on-the-fly list equal
 * those of the extracted folders within JPEG tolerance (training and
 * multi-clip test sampling), and a different sample does not; the shards
 * give exactly the folders' samples; a second run redoes only unfinished
 * videos and refuses other options; bad videos are counted and left out
 * with nothing half-written; annotation CSVs become the expected lists. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wformat-truncation"

#include "ps_error.h"
#include "ps_log.h"
#include "tests/lib/tap.h"
#include "tests/lib/video_testutil.h"
#include "worker/data/labels.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_video.h"
#include "worker/data/video_extract.h"

static char dir[256];
static ps_video_gen_opts_t g;
#define NV 6
#define NF 20
static const char *const EXT[NV] = { "mp4", "avi", "mkv", "mp4", "avi", "mkv" };

static int exists(const char *fmt, const char *a)
{
    char p[1024];
    struct stat st;
    snprintf(p, sizeof p, fmt, dir, a);
    return stat(p, &st) == 0;
}

static size_t count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    size_t n = 0;
    int c;
    if (!f) return 0;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static int extract(const char *list, const char *out, const char *packed, int short_side,
                   ps_video_extract_stats_t *st, char *err, size_t errlen)
{
    ps_video_extract_opts_t o;
    ps_video_extract_opts_default(&o);
    char l[512], r[512], od[512], pd[512];
    snprintf(l, sizeof l, "%s/%s", dir, list);
    snprintf(r, sizeof r, "%s/videos", dir);
    snprintf(od, sizeof od, "%s/%s", dir, out ? out : "");
    snprintf(pd, sizeof pd, "%s/%s", dir, packed ? packed : "");
    o.list = l;
    o.root = r;
    o.out = out ? od : NULL;
    o.packed = packed ? pd : NULL;
    o.short_side = short_side;
    o.threads = 2;
    o.shard_videos = 4;
    return ps_video_extract(&o, st, err, errlen);
}

/* Largest and mean |a - b| over n floats, in 0..255 pixel levels (the
 * samples are normalised by std ~0.225: one level is 1/(255*0.225)). */
static void sample_diff(const float *a, const float *b, size_t n, double *mx, double *mean)
{
    double s = 0;
    *mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) * 255 * 0.225;
        s += d;
        if (d > *mx) *mx = d;
    }
    *mean = s / (double)n;
}

/* The JPEG round trip's own error on the decoded frames (quality 95):
 * the tolerance of extracted vs on-the-fly samples. */
typedef struct jerr { double sum, n; int max; } jerr_t;

static int jpeg_roundtrip(int k, const uint8_t *rgb, int w, int h, void *user, char *err, size_t errlen)
{
    jerr_t *e = user;
    uint8_t *j, *d;
    size_t n;
    int dw, dh;
    if (ps_jpeg_encode(rgb, w, h, 95, &j, &n, err, errlen) || ps_jpeg_decode(j, n, &d, &dw, &dh, err, errlen))
        return PS_ECORRUPT;
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        int x = abs((int)rgb[i] - d[i]);
        e->sum += x;
        if (x > e->max) e->max = x;
    }
    e->n += (double)w * h * 3;
    free(j);
    free(d);
    return 0;
}

static void jpeg_error(const ps_video_list_t *vf, jerr_t *e)
{
    char path[1024], err[1024];
    int want[NF];
    for (int k = 0; k < NF; k++) want[k] = k + 1;
    for (size_t i = 0; i < ps_video_list_size(vf); i++) {
        ps_vfile_index_t *ix = NULL;
        snprintf(path, sizeof path, "%s/videos/%s", dir, ps_video_list_name(vf, i));
        ps_vfile_opts_t o = { 32, 0, NULL };
        if (ps_vfile_probe(path, &ix, err, sizeof err) || ps_vfile_decode(path, ix, &o, want, NF, jpeg_roundtrip, e,
                                                                         err, sizeof err))
            diag("%s", err);
        ps_vfile_index_free(&ix);
    }
}

static void test_extract_vs_onthefly(void)
{
    char path[512], err[2048], list[4096] = "";
    snprintf(path, sizeof path, "%s/videos", dir);
    mkdir(path, 0755);
    for (int v = 0; v < NV; v++) {
        snprintf(path, sizeof path, "%s/videos/clip %d.%s", dir, v, EXT[v]); /* a space in the name */
        vt_write(path, &g, v, 48, 40, NF, 25, 6);
        snprintf(list + strlen(list), sizeof list - strlen(list), "clip %d.%s %d\n", v, EXT[v], v % 4);
    }
    snprintf(path, sizeof path, "%s/videos.txt", dir);
    vt_writef(path, list);
    ps_video_extract_stats_t st;
    int rc = extract("videos.txt", "frames", NULL, 32, &st, err, sizeof err);
    ok(rc == 0 && st.extracted == NV && st.bad == 0 && st.frames == NV * NF,
       "6 videos (mp4, avi, mkv) extracted to folders: %zu, %zu frames, %zu bad (%s)", st.extracted, st.frames,
       st.bad, rc ? err : "ok");
    ok(exists("%s/frames/%s/img_00020.jpg", "clip 3") && !exists("%s/frames/%s/img_00021.jpg", "clip 3") &&
       count_lines(strcat(strcpy(path, dir), "/frames/videos.txt")) == NV, "frames/clip 3/img_00001..20.jpg "
       "and the list frames/videos.txt of 6 lines");
    rc = extract("videos.txt", NULL, "pack", 32, &st, err, sizeof err);
    ok(rc == 0 && st.extracted == NV && exists("%s/pack/%s.idx", "shard-00001") &&
       !exists("%s/pack/%s.idx", "shard-00002"), "the same into shards of 4 videos: 2 shards (%s)",
       rc ? err : "ok");

    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    ps_video_list_t *fr = NULL, *vf = NULL, *pk = NULL;
    char root[512];
    snprintf(root, sizeof root, "%s/frames", dir);
    lo.root = root;
    snprintf(path, sizeof path, "%s/frames/videos.txt", dir);
    int r1 = ps_video_list_load(path, &lo, &fr, err, sizeof err);
    snprintf(root, sizeof root, "%s/videos", dir);
    lo.short_side = 32;
    snprintf(path, sizeof path, "%s/videos.txt", dir);
    int r2 = ps_video_list_load_videos(path, &lo, &vf, err, sizeof err);
    snprintf(path, sizeof path, "%s/pack", dir);
    int r3 = ps_video_list_load_packed(path, &lo, &pk, err, sizeof err);
    ok(r1 == 0 && r2 == 0 && r3 == 0, "the folder list, the video list and the pack load (%s)",
       r1 || r2 || r3 ? err : "ok");
    if (r1 || r2 || r3) return;
    int same_frames = 1;
    for (size_t i = 0; i < NV; i++)
        same_frames &= ps_video_list_frames(vf, i) == NF && ps_video_list_frames(fr, i) == NF &&
                       ps_video_list_label(vf, i) == ps_video_list_label(fr, i);
    ok(same_frames, "20 frames and the same labels in the three");

    jerr_t je = { 0, 0, 0 };
    jpeg_error(vf, &je);
    double jmean = je.sum / (je.n ? je.n : 1);
    ok(je.n > 0, "the JPEG round trip of the decoded frames: mean |d| %.2f, max %d levels", jmean, je.max);
    ps_video_opts_t o;
    ps_video_opts_default(&o);
    o.n_segment = 4;
    o.crop_h = o.crop_w = 24;
    o.seed = 5;
    for (int mode = 0; mode < 2; mode++) {
        o.train = !mode;
        o.n_clips = mode ? 3 : 1;
        size_t n = (size_t)ps_video_clips_per_sample(&o) * o.n_segment * 3 * 24 * 24;
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n), *c = malloc(sizeof(float) * n);
        double worst = 0, worst_mean = 0, other = 1e9, mx, mean;
        int bad = 0, packed_same = 1;
        for (uint64_t epoch = 0; epoch < 2; epoch++)
            for (size_t i = 0; i < NV; i++) {
                bad |= ps_video_load_sample(fr, &o, epoch, i, a, err, sizeof err);
                bad |= ps_video_load_sample(vf, &o, epoch, i, b, err, sizeof err);
                bad |= ps_video_load_sample(pk, &o, epoch, i, c, err, sizeof err);
                packed_same &= !memcmp(a, c, sizeof(float) * n);
                sample_diff(a, b, n, &mx, &mean);
                if (mx > worst) worst = mx;
                if (mean > worst_mean) worst_mean = mean;
                /* the negative control: another video's sample */
                bad |= ps_video_load_sample(vf, &o, epoch, (i + 1) % NV, b, err, sizeof err);
                sample_diff(a, b, n, &mx, &mean);
                if (mean < other) other = mean;
            }
        const char *what = mode ? "3-clip test sampling" : "training sampling (crops, flips)";
        ok(!bad, "%s: every sample loads (%s)", what, bad ? err : "ok");
        /* the same pictures but for the JPEG round trip: the resize and
         * crop average its errors (a level more for their own rounding),
         * a crop may hold more edges than the average frame */
        ok(worst_mean <= 1.5 * jmean && worst <= je.max + 2, "%s: on the fly == extracted within JPEG "
           "tolerance (mean |d| %.2f <= 1.5 x %.2f, max %.1f <= %d + 2 levels)", what, worst_mean, jmean, worst,
           je.max);
        ok(other > 10 * worst_mean, "%s: another video's sample is far off (mean |d| %.1f levels)", what, other);
        ok(packed_same, "%s: the shards give the folders' samples exactly", what);
        free(a), free(b), free(c);
    }
    ps_video_list_free(&fr);
    ps_video_list_free(&vf);
    ps_video_list_free(&pk);
}

static void test_resume(void)
{
    char path[1024], err[2048];
    ps_video_extract_stats_t st;
    /* a finished folder with a sentinel; an unfinished one as a stopped run leaves it */
    snprintf(path, sizeof path, "%s/frames/clip 0/sentinel", dir);
    vt_writef(path, "x");
    snprintf(path, sizeof path, "rm -rf '%s/frames/clip 4' && mkdir '%s/frames/clip 4.extracting' && "
             "echo junk > '%s/frames/clip 4.extracting/img_00001.jpg' && rm '%s/frames/videos.txt'", dir, dir, dir, dir);
    ok(system(path) == 0, "state of a stopped run: clip 4 half-written, no list yet");
    int rc = extract("videos.txt", "frames", NULL, 32, &st, err, sizeof err);
    ok(rc == 0 && st.extracted == 1 && st.done_before == NV - 1 && st.bad == 0,
       "second run: 1 extracted, %zu done before (%s)", st.done_before, rc ? err : "ok");
    ok(exists("%s/frames/%s/sentinel", "clip 0") && !exists("%s/frames/%s.extracting", "clip 4") &&
       exists("%s/frames/%s/img_00020.jpg", "clip 4"), "finished folders untouched, clip 4 redone whole");
    snprintf(path, sizeof path, "%s/frames/videos.txt", dir);
    ok(count_lines(path) == NV, "the list is written again with all 6");
    rc = extract("videos.txt", "frames", NULL, 40, &st, err, sizeof err);
    ok(rc == PS_EMISMATCH && strstr(err, "short_side=32"), "other options on the same output refused: %s", err);
    /* packed: a shard whose index is gone is redone, the other kept */
    snprintf(path, sizeof path, "%s/pack/shard-00001.idx", dir);
    unlink(path);
    rc = extract("videos.txt", NULL, "pack", 32, &st, err, sizeof err);
    ok(rc == 0 && st.extracted == 2 && st.done_before == 4, "packed: the shard without an index redone (%zu "
       "extracted, %zu before)", st.extracted, st.done_before);
    snprintf(path, sizeof path, "%s/videos2.txt", dir);
    vt_writef(path, "clip 0.mp4 0\n");
    rc = extract("videos2.txt", NULL, "pack", 32, &st, err, sizeof err);
    ok(rc == PS_EMISMATCH, "packed: another list on the same shards refused: %s", err);
}

static void test_bad_videos(void)
{
    char path[1024], err[2048];
    snprintf(path, sizeof path, "%s/videos/text.mp4", dir);
    vt_writef(path, "not a video\n");
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/videos/clip 0.mp4", dir);
    snprintf(b, sizeof b, "%s/videos/cut.mp4", dir);
    vt_truncate_copy(a, b, 0.5);
    snprintf(path, sizeof path, "%s/bad.txt", dir);
    vt_writef(path, "clip 1.avi 1\ntext.mp4 0\ncut.mp4 2\nnone.mp4 3\n");
    ps_video_extract_stats_t st;
    int rc = extract("bad.txt", "badout", NULL, 32, &st, err, sizeof err);
    ok(rc == 0 && st.extracted == 1 && st.bad == 3, "3 bad videos counted, 1 extracted (rc %d)", rc);
    snprintf(path, sizeof path, "%s/badout/bad.txt", dir);
    ok(count_lines(path) == 1, "the list holds the good video only");
    ok(!exists("%s/badout/%s", "text") && !exists("%s/badout/%s.extracting", "text") &&
       !exists("%s/badout/%s", "cut") && !exists("%s/badout/%s.extracting", "cut"),
       "no folder, whole or half, of a bad video");
    rc = extract("bad.txt", NULL, "badpack", 32, &st, err, sizeof err);
    ps_video_list_t *l = NULL;
    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    snprintf(path, sizeof path, "%s/badpack", dir);
    int lr = ps_video_list_load_packed(path, &lo, &l, err, sizeof err);
    ok(rc == 0 && st.bad == 3 && lr == 0 && ps_video_list_size(l) == 1, "packed: the shard holds the good "
       "video only");
    ps_video_list_free(&l);
    snprintf(path, sizeof path, "%s/dup.txt", dir);
    vt_writef(path, "clip 1.avi 1\nclip 1.mkv 1\n");
    rc = extract("dup.txt", "dupout", NULL, 32, &st, err, sizeof err);
    ok(rc == PS_EINVAL && strstr(err, "dup.txt:1 and line 2"), "two videos for one folder refused: %s", err);
    snprintf(path, sizeof path, "%s/esc.txt", dir);
    vt_writef(path, "../x.mp4 1\n");
    rc = extract("esc.txt", "escout", NULL, 32, &st, err, sizeof err);
    ok(rc == PS_EINVAL && strstr(err, "esc.txt:1"), "a path leaving the output refused: %s", err);
}

static void test_csv_lists(void)
{
    char path[1024], err[2048], root[512], out[512], csv[1024], cls[512];
    snprintf(root, sizeof root, "%s/kin", dir);
    snprintf(path, sizeof path, "mkdir -p '%s/kin/train/playing guitar' '%s/kin/val' && "
             "touch '%s/kin/train/playing guitar/abc_000010_000020.mp4' '%s/kin/xyz.webm' "
             "'%s/kin/val/q_r_000001_000011.mkv' '%s/kin/train/playing guitar/ghi_000000_000010.avi'",
             dir, dir, dir, dir, dir, dir);
    ok(system(path) == 0, "a Kinetics-like tree of (empty) video files");
    /* columns in another order; a quoted label with a comma; a missing
     * video; an unlabelled test row */
    snprintf(csv, sizeof csv, "%s/ann.csv", dir);
    vt_writef(csv, "youtube_id,label,time_start,time_end,split,is_cc\n"
                   "abc,playing guitar,10,20,train,0\n"
                   "xyz,\"cooking, eggs\",0,10,train,0\n"
                   "gone,playing guitar,5,15,train,0\n"
                   "q_r,\"cooking, eggs\",1.0,11.0,val,0\n"
                   "ghi,playing guitar,0,10,train,0\n"
                   "tst,,0,10,test,0\n");
    snprintf(cls, sizeof cls, "%s/classes.txt", dir);
    vt_writef(cls, "abseiling\nplaying guitar\ncooking, eggs\n");
    snprintf(out, sizeof out, "%s/lists", dir);
    ps_csv_lists_opts_t o = { csv, cls, root, out, NULL, NULL };
    ps_csv_lists_stats_t st;
    int rc = ps_csv_to_lists(&o, &st, err, sizeof err);
    ok(rc == 0 && st.rows == 6 && st.listed == 4 && st.missing == 1 && st.unlabelled == 1 && st.classes == 3,
       "6 rows: 4 listed, 1 missing, 1 unlabelled, 3 classes (%s)", rc ? err : "ok");
    uint8_t *b;
    size_t n;
    snprintf(path, sizeof path, "%s/lists/train.txt", dir);
    rc = ps_read_file(path, &b, &n, err, sizeof err);
    const char *want = "train/playing guitar/abc_000010_000020.mp4 1\nxyz.webm 2\n"
                       "train/playing guitar/ghi_000000_000010.avi 1\n";
    ok(rc == 0 && n == strlen(want) && !memcmp(b, want, n), "train.txt found each video by its usual name");
    if (rc == 0) free(b);
    snprintf(path, sizeof path, "%s/lists/val.txt", dir);
    rc = ps_read_file(path, &b, &n, err, sizeof err);
    want = "val/q_r_000001_000011.mkv 2\n";
    ok(rc == 0 && n == strlen(want) && !memcmp(b, want, n), "val.txt: a split folder, times as whole seconds");
    if (rc == 0) free(b);
    /* without a class file: the labels sorted, written beside the lists */
    o.classes = NULL;
    rc = ps_csv_to_lists(&o, &st, err, sizeof err);
    ps_class_names_t *c = NULL;
    snprintf(path, sizeof path, "%s/lists/classes.txt", dir);
    int cr = rc == 0 ? ps_class_names_load(path, &c, err, sizeof err) : rc;
    ok(cr == 0 && c->n == 2 && !strcmp(c->name[0], "cooking, eggs") && !strcmp(c->name[1], "playing guitar"),
       "no class file: 2 classes sorted into lists/classes.txt");
    ps_class_names_free(&c);
    vt_writef(cls, "abseiling\nplaying guitar\n");
    o.classes = cls;
    rc = ps_csv_to_lists(&o, &st, err, sizeof err);
    ok(rc == PS_EINVAL && strstr(err, "ann.csv:3: label 'cooking, eggs'"), "a label the class file lacks: %s",
       err);
    vt_writef(cls, "a\nb\na\n");
    rc = ps_class_names_load(cls, &c, err, sizeof err);
    ok(rc == PS_EINVAL && strstr(err, "classes.txt:3"), "a class named twice: %s", err);
    vt_writef(csv, "label,time_start\nx,1\n");
    rc = ps_csv_to_lists(&o, &st, err, sizeof err);
    ok(rc == PS_EINVAL && strstr(err, "no youtube_id column"), "a CSV without youtube_id: %s", err);
}

int main(void)
{
    ps_log_set_prog("test_video_extract");
    ps_log_level = PS_LOG_ERROR - 1; /* the bad videos' errors are expected here */
    snprintf(dir, sizeof dir, "%s/test_video_extract.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    ps_video_gen_opts_default(&g);
    g.size = 48;
    g.seed = 9;
    test_extract_vs_onthefly();
    test_resume();
    test_bad_videos();
    test_csv_lists();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (tap_failed_ == 0 && system(cmd) != 0) diag("could not remove %s", dir);
    return tap_done();
}
