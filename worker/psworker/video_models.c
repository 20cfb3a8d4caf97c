/* The video task's model rows (video_models.h). */
#include "worker/psworker/video_models.h"

#include "ps_error.h"
#include "worker/data/ps_video.h"
#include "worker/psworker/psworker.h"

#include <stdio.h>
#include <string.h>

static void config_2d(ps_model_config_t *cfg, const ps_video_model_row_t *r)
{
    cfg->arch[0] = 0;
    cfg->depth = r->depth;
    cfg->shift = r->shift;
}

/* 3-D rows are named as their architecture (worker/models/ps_video3d.h) */
static void config_3d(ps_model_config_t *cfg, const ps_video_model_row_t *r)
{
    snprintf(cfg->arch, sizeof cfg->arch, "%s", r->name);
    cfg->shift = 0;
}

#define FRAMES "frames (B*T, 3, H, W): 2-D ResNet on every frame, mean over T"
#define CLIPS "clips (B, 3, T, H, W): 3-D convolutions, pooled over T x H x W"
#define ROW2D(n, d, s) {n, config_2d, d, s, FRAMES, PS_VIDEO_SAMPLING_TSN, 1}
#define ROW3D(n) {n, config_3d, 0, 0, CLIPS, PS_VIDEO_SAMPLING_DENSE, 2}

static const ps_video_model_row_t rows[] = {
    ROW2D("tsm-r18", 18, 1), ROW2D("tsm-r34", 34, 1), ROW2D("tsm-r50", 50, 1),
    ROW2D("tsn-r18", 18, 0), ROW2D("tsn-r34", 34, 0), ROW2D("tsn-r50", 50, 0),
    ROW3D("i3d-r50-333"),    ROW3D("i3d-r50-311"),    ROW3D("r3d-18"),
    ROW3D("mc3-18"),         ROW3D("r2plus1d-18"),
};

const ps_video_model_row_t *ps_video_model_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof rows / sizeof rows[0]; i++)
        if (!strcmp(rows[i].name, name)) return &rows[i];
    return NULL;
}

const char *ps_video_model_names(void)
{
    static char buf[256];
    size_t n = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0] && n < sizeof buf; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", i ? "|" : "", rows[i].name);
    return buf;
}

int ps_video_model_sampling(const ps_video_model_row_t *row, const char *sampling, int *stride,
                            int *kind)
{
    static const char *const names[] = {[PS_VIDEO_SAMPLING_TSN] = "tsn",
                                        [PS_VIDEO_SAMPLING_DENSE] = "dense"};
    *kind = *sampling ? -1 : row->sampling;
    for (int i = 0; i < 2 && *sampling; i++)
        if (!strcmp(sampling, names[i])) *kind = i;
    if (*kind < 0)
        return ps_worker_opt_error("--sampling: expected tsn|dense, got \"%s\"", sampling);
    if (*stride < 0 || *stride > 64)
        return ps_worker_opt_error("--stride %d out of range 1..64 (0 = the model's)", *stride);
    if (!*stride) *stride = *kind == PS_VIDEO_SAMPLING_DENSE ? row->stride : 1;
    if (*stride != 1 && *kind != PS_VIDEO_SAMPLING_DENSE)
        return ps_worker_opt_error("--stride %d goes with --sampling dense (TSN segments are "
                                   "spread over the whole video)", *stride);
    return 0;
}

ps_video_clip_cost_t ps_video_clip_cost(const struct ps_video_loader *ld)
{
    ps_video_io_t t = {0, 0, 0, 0, 0};
    if (ld) ps_video_loader_io(ld, NULL, &t);
    const double n = t.samples ? (double)t.samples : 1.0;
    return (ps_video_clip_cost_t){t.frames / n, t.bytes / n, t.read_s * 1e3 / n,
                                  t.decode_s * 1e3 / n};
}
