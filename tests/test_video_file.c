/* Video files through FFmpeg (worker/data/video_file.c): videos written
 * from the dataset generator in mp4, avi, mkv and mov; each decoded frame
 * is checked against the generator itself (the nearest generated frame
 * must be the one asked for, by a wide margin), with and without keyframe
 * seeks, with B-frames (presentation order != decoding order), at a resampled --fps (closed-form frame numbers), at a resized
 * short side; the decoder's picture count shows the seeks skip frames; bad
 * files (truncated, text, audio only, missing) are errors naming them, in
 * the probe, the on-the-fly list and its loader. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>

#pragma GCC diagnostic ignored "-Wformat-truncation"

#include "ps_error.h"
#include "ps_log.h"
#include "tests/lib/tap.h"
#include "tests/lib/video_testutil.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_video.h"

static char dir[256];
static ps_video_gen_opts_t g;

#define N_FRAMES 24  /* 25 fps: the last frame at 0.92 s */
#define GOP 8        /* keyframes at positions 0, 8, 16 */

typedef struct got {
    int n;
    uint8_t *px[64];
    int w[64], h[64];
} got_t;

static int keep(int k, const uint8_t *rgb, int w, int h, void *user, char *err, size_t errlen)
{
    got_t *g2 = user;
    g2->px[k] = malloc((size_t)w * h * 3);
    memcpy(g2->px[k], rgb, (size_t)w * h * 3);
    g2->w[k] = w;
    g2->h[k] = h;
    g2->n = k + 1;
    return 0;
}

static void got_free(got_t *g2)
{
    for (int k = 0; k < g2->n; k++) free(g2->px[k]);
    g2->n = 0;
}

/* Every picture of got is generated frame src[k] of video v, clearly. */
static int all_match(int v, const got_t *gt, const int *src, int n, double *worst, double *margin)
{
    int good = gt->n == n;
    *worst = 0;
    *margin = 1e9;
    for (int k = 0; k < gt->n && k < n; k++) {
        double best, second;
        int t = vt_nearest(&g, v, N_FRAMES, gt->px[k], gt->w[k], gt->h[k], &best, &second);
        /* the video's motion repeats after size/speed frames: frames that
         * equal the wanted one are as good a match */
        int hit = t == src[k] || vt_diff(&g, v, src[k], gt->px[k], gt->w[k], gt->h[k]) <= best + 1e-9;
        if (!hit) diag("picture %d is generated frame %d, not %d", k, t, src[k]);
        good &= hit;
        if (best > *worst) *worst = best;
        if (second / (best > 1 ? best : 1) < *margin) *margin = second / (best > 1 ? best : 1);
    }
    return good;
}

static void test_containers(void)
{
    static const char *const ext[] = { "mp4", "avi", "mkv", "mov" };
    static const int want[] = { 1, 2, 2, 9, 17, 24 };
    int src[6];
    for (int k = 0; k < 6; k++) src[k] = want[k] - 1;
    for (int c = 0; c < 4; c++) {
        char path[512], err[1024];
        snprintf(path, sizeof path, "%s/v.%s", dir, ext[c]);
        is_int(vt_write(path, &g, 1, 48, 48, N_FRAMES, 25, GOP), 0, "%s: 24 generated frames written", ext[c]);
        ps_vfile_index_t *ix = NULL;
        int rc = ps_vfile_probe(path, &ix, err, sizeof err);
        ok(rc == 0, "%s: probed (%s)", ext[c], rc ? err : "ok");
        if (rc) continue;
        ok(ps_vfile_frames(ix, 0) == N_FRAMES && ps_vfile_keyframes(ix) == 3,
           "%s: %d frames, %d keyframes (want 24, 3)", ext[c], ps_vfile_frames(ix, 0), ps_vfile_keyframes(ix));
        got_t gt = { 0 };
        long decoded = 0;
        ps_vfile_opts_t o = { 0, 0, &decoded };
        rc = ps_vfile_decode(path, ix, &o, want, 6, keep, &gt, err, sizeof err);
        double worst = 0, margin = 0;
        int match = rc == 0 && all_match(1, &gt, src, 6, &worst, &margin);
        ok(match && gt.w[0] == 48,
           "%s: frames 1 2 2 9 17 24 are the generator's (mean |d| <= %.1f, next nearest %.1fx farther)",
           ext[c], worst, margin);
        /* MPEG-4 at q3 keeps a frame far closer to its source than to any
         * other frame of the moving pattern */
        ok(match && margin > 2, "%s: decoded frames are unambiguous (margin %.2f)", ext[c], margin);
        /* 1, 2 from the start; 9 after a seek to 9; 17 after a seek to 17,
         * then on to 24: 11 pictures instead of 24 */
        ok(decoded == 11, "%s: %ld pictures decoded for frames 1 2 2 9 17 24 (11 with seeks)", ext[c],
           decoded);
        got_free(&gt);
        ps_vfile_index_free(&ix);
    }
}

static void test_seek_saves(void)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/v.mp4", dir);
    ps_vfile_index_t *ix = NULL;
    if (ps_vfile_probe(path, &ix, err, sizeof err)) { ok(0, "probe: %s", err); return; }
    int want[] = { 21 };
    got_t gt = { 0 };
    long decoded = 0;
    ps_vfile_opts_t o = { 0, 0, &decoded };
    int rc = ps_vfile_decode(path, ix, &o, want, 1, keep, &gt, err, sizeof err);
    int src[] = { 20 };
    double worst = 0, margin;
    int match = rc == 0 && all_match(1, &gt, src, 1, &worst, &margin);
    ok(match, "frame 21 alone decodes right (|d| %.1f)", worst);
    ok(decoded == 5, "frame 21: %ld pictures decoded (keyframe 17 .. 21 = 5, not 21)", decoded);
    got_free(&gt);
    ps_vfile_index_free(&ix);
}

/* B-frames: decoding order differs from presentation order (mp4 and mkv
 * carry presentation times; AVI gives B-frames none, so its frames are
 * counted in decoding output order and never seeked).  Random ascending
 * requests must give the generator's frames either way. */
static void test_bframes(void)
{
    static const char *const ext[] = { "mp4", "mkv", "avi" };
    long dec[3] = { 0, 0, 0 };
    for (int c = 0; c < 3; c++) {
        char path[512], err[1024];
        snprintf(path, sizeof path, "%s/b.%s", dir, ext[c]);
        is_int(vt_write_b(path, &g, 3, 48, 48, N_FRAMES, 25, GOP, 2), 0, "%s with 2 B-frames written", ext[c]);
        ps_vfile_index_t *ix = NULL;
        if (ps_vfile_probe(path, &ix, err, sizeof err)) { ok(0, "probe: %s", err); continue; }
        uint32_t r = 12345;
        int good = ps_vfile_frames(ix, 0) == N_FRAMES, rc = 0;
        for (int trial = 0; trial < 12 && rc == 0; trial++) {
            int want[8], src[8], n = 1 + trial % 8, f = 1;
            for (int k = 0; k < n; k++) {
                r = r * 1103515245u + 12345u;
                f += (int)(r >> 16) % 7;
                want[k] = f > N_FRAMES ? N_FRAMES : f;
                src[k] = want[k] - 1;
            }
            got_t gt = { 0 };
            ps_vfile_opts_t o = { 0, 0, &dec[c] };
            rc = ps_vfile_decode(path, ix, &o, want, n, keep, &gt, err, sizeof err);
            double worst, margin;
            good &= rc == 0 && all_match(3, &gt, src, n, &worst, &margin);
            got_free(&gt);
        }
        ok(good, "%s, B-frames: 12 random requests give the generator's frames (%s)", ext[c], rc ? err : "ok");
        ps_vfile_index_free(&ix);
    }
    ok(dec[0] == dec[1] && dec[0] < dec[2], "mp4 and mkv seek (%ld pictures decoded each), AVI decodes from "
       "the start (%ld)", dec[0], dec[2]);
}

static void test_fps(void)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/v.mkv", dir);
    ps_vfile_index_t *ix = NULL;
    if (ps_vfile_probe(path, &ix, err, sizeof err)) { ok(0, "probe: %s", err); return; }
    static const double F[] = { 10, 50, 7 };
    for (int f = 0; f < 3; f++) {
        /* closed form at 25 fps: floor(0.92 F) + 1 frames, frame k shows
         * source floor((k - 1) * 25 / F) */
        int n = (int)(0.92 * F[f] + 1e-9) + 1, bad = 0;
        for (int k = 1; k <= n; k++) bad += ps_vfile_source_frame(ix, F[f], k) != (int)((k - 1) * 25 / F[f] + 1e-9);
        ok(ps_vfile_frames(ix, F[f]) == n && !bad, "--fps %g: %d frames (want %d), %d mapped wrong", F[f],
           ps_vfile_frames(ix, F[f]), n, bad);
        int want[64], src[64];
        for (int k = 0; k < n; k++) want[k] = k + 1, src[k] = (int)(k * 25 / F[f] + 1e-9);
        got_t gt = { 0 };
        ps_vfile_opts_t o = { 0, F[f], NULL };
        int rc = ps_vfile_decode(path, ix, &o, want, n, keep, &gt, err, sizeof err);
        double worst = 0, margin = 0;
        int match = rc == 0 && all_match(1, &gt, src, n, &worst, &margin);
        ok(match, "--fps %g: every output frame is its source frame (rc %d, %d pictures, |d| <= %.1f)", F[f],
           rc, gt.n, worst);
        got_free(&gt);
    }
    int over[] = { N_FRAMES + 1 };
    got_t gt = { 0 };
    ps_vfile_opts_t o = { 0, 0, NULL };
    int rc = ps_vfile_decode(path, ix, &o, over, 1, keep, &gt, err, sizeof err);
    ok(rc == PS_ERANGE && strstr(err, "v.mkv"), "frame 25 of 24 refused: %s", err);
    ps_vfile_index_free(&ix);
}

static void test_short_side(void)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/wide.avi", dir);
    is_int(vt_write(path, &g, 2, 48, 36, 10, 25, 4), 0, "a 48x36 video written");
    ps_vfile_index_t *ix = NULL;
    if (ps_vfile_probe(path, &ix, err, sizeof err)) { ok(0, "probe: %s", err); return; }
    int want[] = { 5 };
    got_t a = { 0 }, b = { 0 };
    ps_vfile_opts_t o0 = { 0, 0, NULL }, o24 = { 24, 0, NULL };
    int rc = ps_vfile_decode(path, ix, &o0, want, 1, keep, &a, err, sizeof err);
    rc |= ps_vfile_decode(path, ix, &o24, want, 1, keep, &b, err, sizeof err);
    ok(rc == 0 && a.w[0] == 48 && a.h[0] == 36 && b.w[0] == 32 && b.h[0] == 24,
       "short side 0 keeps 48x36, 24 gives 32x24 (got %dx%d, %dx%d)", a.w[0], a.h[0], b.w[0], b.h[0]);
    if (rc == 0 && b.w[0] == 32) {
        uint8_t *r = malloc(32 * 24 * 3);
        ps_image_resize(a.px[0], 48 * 3, 48, 36, r, 32, 24);
        ok(!memcmp(r, b.px[0], 32 * 24 * 3), "the short side is PIL's bilinear resize of the decoded frame");
        free(r);
    }
    got_free(&a);
    got_free(&b);
    ps_vfile_index_free(&ix);
}

/* An mp4 with one AAC stream and no video. */
static int write_audio_only(const char *path)
{
    const AVCodec *codec = avcodec_find_encoder(AV_CODEC_ID_AAC);
    AVFormatContext *oc = NULL;
    if (!codec || avformat_alloc_output_context2(&oc, NULL, NULL, path) < 0) return -1;
    AVStream *st = avformat_new_stream(oc, NULL);
    AVCodecContext *cc = avcodec_alloc_context3(codec);
    cc->sample_rate = 16000;
    cc->sample_fmt = AV_SAMPLE_FMT_FLTP;
    av_channel_layout_default(&cc->ch_layout, 1);
    cc->time_base = (AVRational){ 1, 16000 };
    if (oc->oformat->flags & AVFMT_GLOBALHEADER) cc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    int rc = avcodec_open2(cc, codec, NULL);
    if (rc == 0) rc = avcodec_parameters_from_context(st->codecpar, cc);
    st->time_base = cc->time_base;
    if (rc >= 0) rc = avio_open(&oc->pb, path, AVIO_FLAG_WRITE);
    if (rc >= 0) rc = avformat_write_header(oc, NULL);
    AVFrame *fr = av_frame_alloc();
    AVPacket *pkt = av_packet_alloc();
    fr->nb_samples = cc->frame_size;
    fr->format = cc->sample_fmt;
    av_channel_layout_copy(&fr->ch_layout, &cc->ch_layout);
    if (rc >= 0) rc = av_frame_get_buffer(fr, 0);
    for (int i = 0; rc >= 0 && i <= 10; i++) {
        AVFrame *in = i < 10 ? fr : NULL;
        if (in) {
            av_frame_make_writable(fr);
            for (int s = 0; s < fr->nb_samples; s++) ((float *)fr->data[0])[s] = 0.1f * (float)((s * 7 + i) % 50) / 50;
            fr->pts = (int64_t)i * cc->frame_size;
        }
        rc = avcodec_send_frame(cc, in);
        while (rc >= 0 && avcodec_receive_packet(cc, pkt) == 0) {
            av_packet_rescale_ts(pkt, cc->time_base, st->time_base);
            pkt->stream_index = 0;
            rc = av_interleaved_write_frame(oc, pkt);
        }
    }
    if (rc >= 0) rc = av_write_trailer(oc);
    avio_closep(&oc->pb);
    av_frame_free(&fr);
    av_packet_free(&pkt);
    avcodec_free_context(&cc);
    avformat_free_context(oc);
    return rc < 0 ? -1 : 0;
}

static void test_bad_files(void)
{
    char good[512], trunc[512], mkvcut[512], text[512], audio[512], missing[512], err[1024];
    snprintf(good, sizeof good, "%s/v.mp4", dir);
    snprintf(trunc, sizeof trunc, "%s/trunc.mp4", dir);
    snprintf(mkvcut, sizeof mkvcut, "%s/cut.mkv", dir);
    snprintf(text, sizeof text, "%s/text.mp4", dir);
    snprintf(audio, sizeof audio, "%s/audio.mp4", dir);
    snprintf(missing, sizeof missing, "%s/missing.mp4", dir);
    char mkv[512];
    snprintf(mkv, sizeof mkv, "%s/v.mkv", dir);
    vt_truncate_copy(good, trunc, 0.5);
    vt_truncate_copy(mkv, mkvcut, 0.6);
    vt_writef(text, "this is not a video\n");
    ok(write_audio_only(audio) == 0, "an audio-only mp4 written");
    const struct { const char *path, *what; int rc; } cases[] = {
        { trunc, "truncated mp4", PS_ECORRUPT },
        { mkvcut, "truncated mkv (header of the whole file)", PS_ECORRUPT },
        { text, "a text file named .mp4", PS_ECORRUPT },
        { audio, "audio only", PS_ECORRUPT },
        { missing, "a missing file", PS_ENOTFOUND },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_vfile_index_t *ix = NULL;
        int rc = ps_vfile_probe(cases[i].path, &ix, err, sizeof err);
        ok(rc == cases[i].rc && strstr(err, cases[i].path), "%s: %s", cases[i].what, err);
        ps_vfile_index_free(&ix);
    }
    ok(strstr(err, "No such file") != NULL, "the missing file's cause is given");

    /* the on-the-fly list: an error naming the list line and the file, or
     * a counted skip */
    char list[512];
    snprintf(list, sizeof list, "%s/videos.txt", dir);
    char w[512];
    snprintf(w, sizeof w, "%s/w.mp4", dir);
    vt_truncate_copy(good, w, 1.0);
    vt_writef(list, "w.mp4 0\nv.avi 1\ntext.mp4 1\nv.mkv 2\naudio.mp4 3\nmissing.mp4 0\n");
    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    lo.root = dir;
    lo.short_side = 32;
    ps_video_list_t *l = NULL;
    int rc = ps_video_list_load_videos(list, &lo, &l, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "videos.txt:3: video 'text.mp4'"), "video list: %s", err);
    lo.skip_bad = 1;
    rc = ps_video_list_load_videos(list, &lo, &l, err, sizeof err);
    ok(rc == 0 && ps_video_list_size(l) == 3 && ps_video_list_skipped(l) == 3 &&
       ps_video_list_frames(l, 0) == N_FRAMES, "--skip-bad keeps 3 videos of 24 frames, 3 skipped");
    if (rc) return;
    /* a file damaged after the list was read: the loader names it */
    vt_truncate_copy(good, w, 0.5);
    ps_video_opts_t o;
    ps_video_opts_default(&o);
    o.n_segment = 4;
    o.crop_h = o.crop_w = 24;
    o.batch = 3;
    o.threads = 0;
    o.train = 0;
    o.scale_size = 32;
    float *buf = malloc(sizeof(float) * 3 * 4 * 3 * 24 * 24);
    int32_t lab[3];
    ps_video_loader_t *ld = NULL;
    ps_video_loader_new(l, &o, &ld, err, sizeof err);
    rc = ld ? ps_video_loader_next(ld, buf, lab, NULL, NULL) : -1;
    ok(rc == PS_ECORRUPT && strstr(ps_video_loader_error(ld), "videos.txt:1: video 'w.mp4'"),
       "a video damaged after loading: the loader's error names it: %s", ld ? ps_video_loader_error(ld) : err);
    ps_video_loader_destroy(&ld);
    free(buf);
    ps_video_list_free(&l);
}

int main(void)
{
    ps_log_set_prog("test_video_file");
    ps_log_level = PS_LOG_ERROR;
    snprintf(dir, sizeof dir, "%s/test_video_file.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    ps_video_gen_opts_default(&g);
    g.size = 48;
    g.seed = 7;
    g.speed = 1.5;
    test_containers();
    test_seek_saves();
    test_bframes();
    test_fps();
    test_short_side();
    test_bad_files();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (tap_failed_ == 0 && system(cmd) != 0) diag("could not remove %s", dir);
    return tap_done();
}
