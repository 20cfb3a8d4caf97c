/* Dense clip sampling for the 3-D models (T consecutive frames `stride`
 * apart, mmaction2's SampleFrames rule, ps_video.h), and the choice
 * between it and TSN's segments for a clip of a sample. */
#include "worker/data/ps_video.h"

void ps_video_dense_train_indices(int num_frames, int T, int stride, ps_vrng_t *r, int *out)
{
    const long span = (long)T * stride, room = num_frames - span + 1;
    const long offset = room > 0 ? (long)ps_vrng_below(r, (uint64_t)room) : 0;
    for (int t = 0; t < T; t++) out[t] = (int)((offset + (long)t * stride) % num_frames) + 1;
}

void ps_video_dense_test_indices(int num_frames, int T, int stride, int clip, int n_clips,
                                 int *out)
{
    const long span = (long)T * stride;
    long offset = 0;
    if (num_frames > span - 1) {
        const double a = (double)(num_frames - span + 1) / (double)n_clips;
        offset = (long)(clip * a + a / 2.0);
    }
    for (int t = 0; t < T; t++) out[t] = (int)((offset + (long)t * stride) % num_frames) + 1;
}

/* The rules as rows: TSN's take no stride, the dense ones do. */
typedef struct sampling_rule {
    void (*train)(const ps_video_opts_t *o, int n, ps_vrng_t *r, int *out);
    void (*test)(const ps_video_opts_t *o, int n, int clip, int n_clips, int *out);
} sampling_rule_t;

static void tsn_train(const ps_video_opts_t *o, int n, ps_vrng_t *r, int *out)
{
    ps_video_tsn_train_indices(n, o->n_segment, r, out);
}
static void tsn_test(const ps_video_opts_t *o, int n, int clip, int n_clips, int *out)
{
    ps_video_tsn_test_indices(n, o->n_segment, clip, n_clips, out);
}
static void dense_train(const ps_video_opts_t *o, int n, ps_vrng_t *r, int *out)
{
    ps_video_dense_train_indices(n, o->n_segment, o->stride, r, out);
}
static void dense_test(const ps_video_opts_t *o, int n, int clip, int n_clips, int *out)
{
    ps_video_dense_test_indices(n, o->n_segment, o->stride, clip, n_clips, out);
}

static const sampling_rule_t rules[] = {
    [PS_VIDEO_SAMPLING_TSN] = {tsn_train, tsn_test},
    [PS_VIDEO_SAMPLING_DENSE] = {dense_train, dense_test},
};

void ps_video_clip_indices(const ps_video_opts_t *o, int num_frames, int clip, int n_clips,
                           ps_vrng_t *r, int *out)
{
    const sampling_rule_t *rule = &rules[o->sampling]; /* checked by ps_video_opts_check */
    if (o->train)
        rule->train(o, num_frames, r, out);
    else
        rule->test(o, num_frames, clip, n_clips, out);
}
