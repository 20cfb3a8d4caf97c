/* The static half of the TSM paper's study: what each video model costs in
 * the three bottlenecks the paper names, from the models' shapes (no
 * timing, nothing run):
 *   communication  trainable parameters and the bytes a worker pushes per
 *                  step (fp32 / fp16 on the wire), plus the BN statistics
 *                  --bn-sync averages;
 *   computation    FLOPs of one clip's forward and training step
 *                  (forward + backward; 2 per multiply-add of convs and fc);
 *   data loading   frames per clip, and with --data DIR the encoded bytes
 *                  a clip reads from that dataset (the mean over --samples
 *                  training clips of DIR/train.txt, loaded as psworker
 *                  loads them: TSN segments or dense clips).
 *
 *   bench/video_cost [--data DIR] [--samples N] [--size S]
 *
 * Two tables: the settings of the papers (TSM / TSN ResNet-50 8 x 224^2,
 * I3D-ResNet-50 32 frames every 2nd x 224^2, torchvision's video ResNets
 * 16 frames x 112^2; docs/video.md says where they come from), and the
 * small settings ./deploy/local-cluster.sh trains at (--size, default 48).
 * Bytes per clip depend on the dataset's frame size and JPEG quality, not
 * on the model's input size: they are reported for DIR as it is. */
#include "worker/data/ps_video.h"
#include "worker/models/ps_model.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct row {
    const char *model;   /* --model name */
    const char *arch;    /* "" for the 2-D ResNets */
    int depth, shift, width, frames, stride, size;
    int dense;
} row_t;

#define R2D(n, d, s, w, t, sz) {n, "", d, s, w, t, 1, sz, 0}
#define R3D(n, w, t, st, sz) {n, n, 0, 0, w, t, st, sz, 1}

static const row_t paper[] = {
    R2D("tsm-r50", 50, 1, 64, 8, 224),        R2D("tsn-r50", 50, 0, 64, 8, 224),
    R3D("i3d-r50-333", 64, 32, 2, 224),       R3D("i3d-r50-311", 64, 32, 2, 224),
    R3D("r3d-18", 64, 16, 2, 112),            R3D("mc3-18", 64, 16, 2, 112),
    R3D("r2plus1d-18", 64, 16, 2, 112),       R2D("tsm-r18", 18, 1, 64, 8, 224),
};

/* ./deploy/local-cluster.sh's defaults (size from --size) */
static const row_t local[] = {
    R2D("tsm-r18", 18, 1, 32, 8, 48),  R2D("tsn-r18", 18, 0, 32, 8, 48),
    R3D("i3d-r50-333", 16, 8, 2, 48),  R3D("i3d-r50-311", 16, 8, 2, 48),
    R3D("r3d-18", 16, 8, 2, 48),       R3D("mc3-18", 16, 8, 2, 48),
    R3D("r2plus1d-18", 16, 8, 2, 48),
};

/* Mean encoded bytes of one training clip of DIR under the row's sampling. */
static double clip_bytes(const ps_video_list_t *l, const row_t *r, int samples)
{
    ps_video_opts_t o;
    ps_video_opts_default(&o);
    o.n_segment = r->frames;
    o.sampling = r->dense ? PS_VIDEO_SAMPLING_DENSE : PS_VIDEO_SAMPLING_TSN;
    o.stride = r->stride;
    o.crop_h = o.crop_w = 32; /* the crop does not change what is read */
    o.flip = 0;
    float *buf = malloc(sizeof(float) * (size_t)r->frames * 3 * 32 * 32);
    ps_video_io_t io = {0, 0, 0, 0, 0};
    char err[1024];
    size_t n = ps_video_list_size(l);
    for (int i = 0; buf && i < samples && n; i++)
        if (ps_video_load_sample_io(l, &o, 0, (size_t)i * 7919 % n, buf, &io, err, sizeof err)) {
            fprintf(stderr, "video_cost: %s\n", err);
            break;
        }
    free(buf);
    return io.samples ? (double)io.bytes / (double)io.samples : -1;
}

static int table(const char *title, const row_t *rows, size_t n, int size,
                 const ps_video_list_t *l, int samples)
{
    printf("\n%s\n", title);
    printf("| model | clip | input | params (M) | push fp32 / fp16 (MB) | BN stats (k) | "
           "fwd GFLOP/clip | train GFLOP/clip | frames/clip | bytes/clip%s |\n",
           l ? " (data)" : "");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        ps_model_config_t c;
        ps_model_config_default(&c);
        snprintf(c.arch, sizeof c.arch, "%s", r->arch);
        c.depth = r->depth, c.shift = r->shift, c.width = r->width, c.n_segment = r->frames;
        c.num_classes = 400, c.partial_bn = 0;
        const int S = size > 0 ? size : r->size;
        ps_model_count_t k;
        int rc = ps_model_count(&c, S, S, &k);
        if (rc) {
            fprintf(stderr, "video_cost: %s: %s\n", r->model, ps_strerror(rc));
            return 1;
        }
        char clip[64], bytes[32] = "-";
        if (r->dense)
            snprintf(clip, sizeof clip, "%d frames, every %d.", r->frames, r->stride);
        else
            snprintf(clip, sizeof clip, "%d segments", r->frames);
        if (l) snprintf(bytes, sizeof bytes, "%.0f", clip_bytes(l, r, samples));
        /* fwd + bwd per clip, and the forward of a 2-D model counts T frames */
        printf("| %s (w%d) | %s | %dx%d | %.2f | %.1f / %.1f | %.1f | %.2f | %.2f | %d | %s |\n",
               r->model, r->width, clip, S, S, k.trainable / 1e6, k.trainable * 4 / 1e6,
               k.trainable * 2 / 1e6, k.bn_stats / 1e3, k.fwd_flops / 1e9,
               (k.fwd_flops + k.bwd_flops) / 1e9, r->frames, bytes);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *data = NULL;
    int samples = 32, size = 48;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc) data = argv[++i];
        else if (!strcmp(argv[i], "--samples") && i + 1 < argc) samples = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc) size = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: video_cost [--data DIR] [--samples N] [--size S]\n");
            return 2;
        }
    }
    if (samples < 1 || size < 16) {
        fprintf(stderr, "video_cost: --samples >= 1, --size >= 16\n");
        return 2;
    }
    ps_video_list_t *l = NULL;
    if (data) {
        char path[4096], err[2048];
        ps_video_list_opts_t lo;
        ps_video_list_opts_default(&lo);
        lo.root = data;
        snprintf(path, sizeof path, "%s/train.txt", data);
        if (ps_video_list_load(path, &lo, &l, err, sizeof err)) {
            fprintf(stderr, "video_cost: %s\n", err);
            return 1;
        }
    }
    int rc = table("Settings of the papers (400 classes)", paper, sizeof paper / sizeof paper[0],
                   0, l, samples);
    if (!rc) {
        char t[128];
        snprintf(t, sizeof t, "./deploy/local-cluster.sh defaults at %dx%d (400 classes)", size,
                 size);
        rc = table(t, local, sizeof local / sizeof local[0], size, l, samples);
    }
    ps_video_list_free(&l);
    return rc;
}
