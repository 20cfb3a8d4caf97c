/* Loader throughput by data source: the same videos as extracted JPEG
 * frame folders, as packed shards, and as video files decoded on the fly
 * (keyframe seek + decode forward), through ps_video_loader with the same
 * sampling.  Reports clips/s and the process CPU seconds per clip (every
 * loader thread's user + system time), and the video / frames ratios: the
 * data-loading cost TSM's paper names as a bottleneck.
 *
 * The dataset is generated (MPEG-4 part 2 files from psdata gen-video's
 * generator) unless --list / --root name real videos; the frames and
 * shards are extracted from them first (psdata extract's code, timed too).
 * Every source is read from the page cache after a warm-up pass, so the
 * figures are decode and assembly cost, not disk reads.
 *
 *   bench/loader_bench [--dir DIR] [--videos N] [--frames F] [--size S] [--gop G] [--bframes B]
 *                      [--list L --root R] [--short-side N] [--segments T] [--crop C]
 *                      [--batch B] [--batches K] [--threads N] [--mode train|test] [--clips K] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_util.h"
#include "worker/data/ps_video.h"
#include "worker/data/video_extract.h"
#include "worker/data/video_file.h"
#include "worker/data/video_gen.h"
#include "worker/data/video_list.h"

typedef struct args {
    const char *dir, *list, *root, *mode;
    int videos, frames, size, gop, short_side, segments, crop, batch, batches, threads, clips, bframes;
} args_t;

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

typedef struct src { const ps_video_gen_opts_t *g; int v; } src_t;

static int gen_frame(int t, uint8_t *rgb, void *user)
{
    const src_t *s = user;
    return ps_video_gen_frame(s->g, s->v, t, rgb, NULL);
}

/* N generated mp4 files and their list DIR/videos.txt. */
static int make_videos(const args_t *a, char *list, size_t n)
{
    ps_video_gen_opts_t g;
    ps_video_gen_opts_default(&g);
    g.size = a->size;
    g.frames = a->frames;
    char path[4096], err[1024];
    ps_vfile_enc_t enc = { 25, a->gop, 3, a->bframes };
    snprintf(path, sizeof path, "%s/videos", a->dir);
    if (ps_mkdir_p(path) < 0) { perror(path); return -1; }
    snprintf(list, n, "%s/videos.txt", a->dir);
    FILE *f = fopen(list, "w");
    if (!f) { perror(list); return -1; }
    for (int v = 0; v < a->videos; v++) {
        snprintf(path, sizeof path, "%s/videos/vid_%05d.mp4", a->dir, v);
        src_t s = { &g, v };
        if (access(path, F_OK) != 0 &&
            ps_vfile_write(path, a->size, a->size, a->frames, &enc, gen_frame, &s, err, sizeof err) < 0) {
            fprintf(stderr, "loader_bench: %s\n", err);
            fclose(f);
            return -1;
        }
        fprintf(f, "vid_%05d.mp4 %d\n", v, v % g.classes);
    }
    return fclose(f);
}

static int extract(const args_t *a, const char *list, const char *root, int packed)
{
    ps_video_extract_opts_t o;
    ps_video_extract_stats_t st;
    char out[4096], err[2048];
    ps_video_extract_opts_default(&o);
    snprintf(out, sizeof out, "%s/%s", a->dir, packed ? "pack" : "frames");
    o.list = list;
    o.root = root;
    o.out = packed ? NULL : out;
    o.packed = packed ? out : NULL;
    o.short_side = a->short_side;
    o.threads = a->threads;
    double t0 = bench_now(), c0 = cpu_s();
    int rc = ps_video_extract(&o, &st, err, sizeof err);
    if (rc < 0) { fprintf(stderr, "loader_bench: extract: %s\n", err); return rc; }
    double dt = bench_now() - t0, dc = cpu_s() - c0;
    if (st.extracted)
        printf("extract %-7s %zu videos, %zu frames: %.1f videos/s, %.3f CPU s per video\n", packed ? "packed" : "frames",
               st.extracted, st.frames, st.extracted / dt, dc / st.extracted);
    else
        printf("extract %-7s %zu videos already there\n", packed ? "packed" : "frames", st.done_before);
    return 0;
}

typedef struct result { double cps, cpu_ms; } result_t;

/* K batches through the loader (after one epoch's first batch as warm-up). */
static int measure(const args_t *a, const ps_video_list_t *l, result_t *r)
{
    ps_video_opts_t o;
    ps_video_opts_default(&o);
    o.n_segment = a->segments;
    o.crop_h = o.crop_w = a->crop;
    o.train = !strcmp(a->mode, "train");
    o.n_clips = a->clips;
    o.batch = a->batch;
    o.threads = a->threads;
    o.prefetch = 2;
    o.drop_last = 1;
    size_t n = (size_t)a->batch * ps_video_clips_per_sample(&o) * a->segments * 3 * a->crop * a->crop;
    float *clips = malloc(sizeof(float) * n);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)a->batch);
    ps_video_loader_t *ld = NULL;
    char err[1024];
    if (!clips || !lab || ps_video_loader_new(l, &o, &ld, err, sizeof err) < 0) {
        fprintf(stderr, "loader_bench: loader: %s\n", err);
        free(clips), free(lab);
        return -1;
    }
    if (ps_video_loader_batches(ld) == 0) {
        fprintf(stderr, "loader_bench: fewer videos than one batch of %d\n", a->batch);
        ps_video_loader_destroy(&ld);
        free(clips), free(lab);
        return -1;
    }
    int rc = ps_video_loader_next(ld, clips, lab, NULL, NULL); /* warm-up */
    double t0 = bench_now(), c0 = cpu_s();
    long samples = 0;
    uint64_t epoch = 0;
    for (int b = 0; b < a->batches && rc >= 0; b++) {
        rc = ps_video_loader_next(ld, clips, lab, NULL, NULL);
        if (rc == 0) {
            ps_video_loader_set_epoch(ld, ++epoch);
            b--;
            continue;
        }
        if (rc > 0) samples += rc;
    }
    double dt = bench_now() - t0, dc = cpu_s() - c0;
    if (rc < 0) fprintf(stderr, "loader_bench: %s\n", ps_video_loader_error(ld));
    ps_video_loader_destroy(&ld);
    free(clips), free(lab);
    if (rc < 0) return rc;
    long clips_n = samples * ps_video_clips_per_sample(&o);
    r->cps = clips_n / dt;
    r->cpu_ms = 1e3 * dc / clips_n;
    return 0;
}

static void usage(void)
{
    fputs("usage: loader_bench [--dir DIR] [--videos N] [--frames F] [--size S] [--gop G] [--bframes B]\n"
          "                    [--list L --root R] [--short-side N] [--segments T] [--crop C]\n"
          "                    [--batch B] [--batches K] [--threads N] [--mode train|test] [--clips K]\n", stderr);
}

int main(int argc, char **argv)
{
    args_t a = { "loader-bench", NULL, NULL, "train", 32, 64, 128, 12, 128, 8, 112, 4, 10, 2, 1, 0 };
    static const struct option opts[] = {
        { "dir", 1, 0, 'd' }, { "videos", 1, 0, 'n' }, { "frames", 1, 0, 'f' }, { "size", 1, 0, 's' },
        { "gop", 1, 0, 'g' }, { "list", 1, 0, 'l' }, { "root", 1, 0, 'r' }, { "short-side", 1, 0, 'S' },
        { "segments", 1, 0, 'T' }, { "crop", 1, 0, 'c' }, { "batch", 1, 0, 'b' }, { "batches", 1, 0, 'k' },
        { "threads", 1, 0, 't' }, { "mode", 1, 0, 'm' }, { "clips", 1, 0, 'K' }, { "bframes", 1, 0, 'B' },
        { 0, 0, 0, 0 }
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd': a.dir = optarg; break;
        case 'n': a.videos = atoi(optarg); break;
        case 'f': a.frames = atoi(optarg); break;
        case 's': a.size = atoi(optarg); break;
        case 'g': a.gop = atoi(optarg); break;
        case 'l': a.list = optarg; break;
        case 'r': a.root = optarg; break;
        case 'S': a.short_side = atoi(optarg); break;
        case 'T': a.segments = atoi(optarg); break;
        case 'c': a.crop = atoi(optarg); break;
        case 'b': a.batch = atoi(optarg); break;
        case 'k': a.batches = atoi(optarg); break;
        case 't': a.threads = atoi(optarg); break;
        case 'm': a.mode = optarg; break;
        case 'K': a.clips = atoi(optarg); break;
        case 'B': a.bframes = atoi(optarg); break;
        default: usage(); return 2;
        }
    }
    if (optind < argc || a.videos < 1 || a.batches < 1 || a.batch < 1 || (a.list && !a.root) ||
        (strcmp(a.mode, "train") && strcmp(a.mode, "test"))) {
        usage();
        return 2;
    }
    ps_log_set_prog("loader_bench");
    ps_log_level = PS_LOG_WARN;
    if (ps_mkdir_p(a.dir) < 0) { perror(a.dir); return 1; }
    char list[4096], root[4096];
    if (a.list) {
        snprintf(list, sizeof list, "%s", a.list);
        snprintf(root, sizeof root, "%s", a.root);
    } else {
        if (make_videos(&a, list, sizeof list) < 0) return 1;
        snprintf(root, sizeof root, "%s/videos", a.dir);
    }
    if (extract(&a, list, root, 0) < 0 || extract(&a, list, root, 1) < 0) return 1;

    const char *base = strrchr(list, '/');
    char flist[8300], froot[4200], pack[4200], err[2048];
    snprintf(froot, sizeof froot, "%s/frames", a.dir);
    snprintf(flist, sizeof flist, "%s/%s", froot, base ? base + 1 : list);
    char *dot = strrchr(flist, '.');
    if (dot && dot > strrchr(flist, '/')) strcpy(dot, ".txt");
    snprintf(pack, sizeof pack, "%s/pack", a.dir);
    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    ps_video_list_t *l[3] = { NULL, NULL, NULL };
    lo.root = froot;
    int rc = ps_video_list_load(flist, &lo, &l[0], err, sizeof err);
    if (rc == 0) rc = ps_video_list_load_packed(pack, &lo, &l[1], err, sizeof err);
    lo.root = root;
    lo.short_side = a.short_side;
    lo.probe_threads = a.threads;
    double t0 = bench_now();
    if (rc == 0) rc = ps_video_list_load_videos(list, &lo, &l[2], err, sizeof err);
    double probe_s = bench_now() - t0;
    if (rc < 0) { fprintf(stderr, "loader_bench: %s\n", err); return 1; }
    printf("probe   video   %zu videos listed in %.3f s (%.2f ms per video)\n", ps_video_list_size(l[2]), probe_s,
           1e3 * probe_s / (double)ps_video_list_size(l[2]));
    printf("loader: %s, %d segments, crop %d, %d clip(s) per sample, batch %d x %d batches, %d threads, "
           "short side %d, GOP %d, %d B-frames\n", a.mode, a.segments, a.crop, strcmp(a.mode, "train") ? a.clips : 1, a.batch,
           a.batches, a.threads, a.short_side, a.gop, a.bframes);
    static const char *const name[3] = { "frames", "packed", "video" };
    result_t r[3];
    printf("%-8s %10s %14s\n", "source", "clips/s", "CPU ms/clip");
    for (int s = 0; s < 3; s++) {
        if (measure(&a, l[s], &r[s]) < 0) return 1;
        printf("%-8s %10.1f %14.2f\n", name[s], r[s].cps, r[s].cpu_ms);
    }
    printf("ratio video/frames: clips/s %.2f, CPU per clip %.2f; packed/frames: clips/s %.2f, CPU per clip %.2f\n",
           r[2].cps / r[0].cps, r[2].cpu_ms / r[0].cpu_ms, r[1].cps / r[0].cps, r[1].cpu_ms / r[0].cpu_ms);
    for (int s = 0; s < 3; s++) ps_video_list_free(&l[s]);
    return 0;
}
