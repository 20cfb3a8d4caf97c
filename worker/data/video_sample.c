/* Sampling and augmentation: the PRNG, TSN segment indices, TSM's
 * GroupMultiScaleCrop / centre crop, DistributedSampler order, and the
 * assembly of one normalised sample. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_video.h"
#include "worker/data/video_list.h"

#define GOLDEN 0x9E3779B97F4A7C15ull

uint64_t ps_vrng_mix(uint64_t z)
{
    z += GOLDEN;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t ps_vrng_next(ps_vrng_t *r)
{
    uint64_t out = ps_vrng_mix(r->s);
    r->s += GOLDEN;
    return out;
}

uint64_t ps_vrng_below(ps_vrng_t *r, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)ps_vrng_next(r) * n) >> 64);
}

ps_vrng_t ps_vrng_sample(uint64_t seed, uint64_t epoch, uint64_t index)
{
    ps_vrng_t r = { ps_vrng_mix(ps_vrng_mix(ps_vrng_mix(seed) ^ epoch) ^ index) };
    return r;
}

void ps_video_opts_default(ps_video_opts_t *o)
{
    static const double sc[4] = { 1, .875, .75, .66 };
    memset(o, 0, sizeof *o);
    o->n_segment = 8;
    o->sampling = PS_VIDEO_SAMPLING_TSN;
    o->stride = 1;
    o->crop_h = o->crop_w = 224;
    o->train = 1;
    o->flip = 1;
    o->n_scales = 4;
    memcpy(o->scales, sc, sizeof sc);
    o->max_distort = 1;
    o->more_fix_crop = 1;
    o->n_clips = 1;
    o->n_crops = 1;
    o->mean[0] = 0.485f; o->mean[1] = 0.456f; o->mean[2] = 0.406f;
    o->std[0] = 0.229f; o->std[1] = 0.224f; o->std[2] = 0.225f;
    o->world = 1;
    o->batch = 8;
    o->shuffle = -1;
    o->drop_last = -1;
    o->threads = 2;
    o->prefetch = 2;
}

int ps_video_opts_check(const ps_video_opts_t *o, char *err, size_t errlen)
{
#define BAD(...) do { ps_errf(err, errlen, __VA_ARGS__); return PS_EINVAL; } while (0)
    if (o->n_segment < 1 || o->n_segment > 1024) BAD("n_segment %d out of range 1..1024", o->n_segment);
    if (o->sampling != PS_VIDEO_SAMPLING_TSN && o->sampling != PS_VIDEO_SAMPLING_DENSE)
        BAD("sampling %d is neither TSN segments (%d) nor dense (%d)", o->sampling,
            PS_VIDEO_SAMPLING_TSN, PS_VIDEO_SAMPLING_DENSE);
    if (o->stride < 1 || o->stride > 1024) BAD("stride %d out of range 1..1024", o->stride);
    if (o->crop_h < 8 || o->crop_w < 8 || o->crop_h > 4096 || o->crop_w > 4096)
        BAD("crop size %dx%d out of range 8..4096", o->crop_h, o->crop_w);
    int ss = o->scale_size ? o->scale_size : o->crop_h * 256 / 224;
    if (!o->train && (ss < o->crop_h || ss < o->crop_w || ss > 8192))
        BAD("scale size %d must be at least the crop size %dx%d", ss, o->crop_h, o->crop_w);
    if (o->n_scales < 1 || o->n_scales > PS_VIDEO_MAX_SCALES) BAD("%d crop scales, 1..%d allowed",
                                                                   o->n_scales, PS_VIDEO_MAX_SCALES);
    for (int i = 0; i < o->n_scales; i++)
        if (!(o->scales[i] > 0 && o->scales[i] <= 1)) BAD("crop scale %g not in (0, 1]", o->scales[i]);
    if (o->max_distort < 0) BAD("max_distort %d < 0", o->max_distort);
    if (o->n_clips < 1 || o->n_clips > 64) BAD("n_clips %d out of range 1..64", o->n_clips);
    if (o->n_crops != 1 && o->n_crops != 3) BAD("n_crops %d: 1 or 3", o->n_crops);
    for (int c = 0; c < 3; c++)
        if (!(o->std[c] > 0)) BAD("std[%d] must be > 0", c);
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world) BAD("rank %d of world %d", o->rank, o->world);
    if (o->batch < 1 || o->batch > 65536) BAD("batch %d out of range", o->batch);
    if (o->threads < 0 || o->threads > 256) BAD("threads %d out of range 0..256", o->threads);
    if (o->prefetch < 1 || o->prefetch > 1024) BAD("prefetch %d out of range 1..1024", o->prefetch);
#undef BAD
    return 0;
}

int ps_video_clips_per_sample(const ps_video_opts_t *o)
{
    return o->train ? 1 : o->n_clips * o->n_crops;
}

void ps_video_tsn_train_indices(int num_frames, int T, ps_vrng_t *r, int *out)
{
    int avg = num_frames / T;
    if (avg > 0) {
        for (int i = 0; i < T; i++) out[i] = i * avg + (int)ps_vrng_below(r, (uint64_t)avg) + 1;
    } else if (num_frames > T) {
        /* Unreachable with new_length 1 (kept from TSM for fidelity). */
        for (int i = 0; i < T; i++) out[i] = (int)ps_vrng_below(r, (uint64_t)num_frames);
        for (int i = 1; i < T; i++)
            for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
                int t = out[j]; out[j] = out[j - 1]; out[j - 1] = t;
            }
        for (int i = 0; i < T; i++) out[i] += 1;
    } else {
        for (int i = 0; i < T; i++) out[i] = 1;
    }
}

void ps_video_tsn_test_indices(int num_frames, int T, int clip, int n_clips, int *out)
{
    if (num_frames > T) {
        double tick = (double)num_frames / (double)T;
        double in = tick * (clip + 0.5) / n_clips; /* tick / 2.0 when n_clips == 1 */
        for (int x = 0; x < T; x++) out[x] = (int)(in + tick * x) + 1;
    } else {
        for (int x = 0; x < T; x++) out[x] = 1;
    }
}

void ps_video_test_crop(int img_w, int img_h, int crop_w, int crop_h, int n_crops, int crop,
                        int *x, int *y)
{
    if (n_crops != 3) { /* CenterCrop: round() is Python's, half to even */
        *x = (int)nearbyint((img_w - crop_w) / 2.0);
        *y = (int)nearbyint((img_h - crop_h) / 2.0);
        return;
    }
    static const int along[3] = { 0, 4, 2 }; /* left, right, centre */
    int ws = (img_w - crop_w) / 4, hs = (img_h - crop_h) / 4; /* crops fit: >= 0 */
    if (img_w >= img_h) {
        *x = along[crop] * ws;
        *y = 2 * hs;
    } else {
        *x = 2 * ws;
        *y = along[crop] * hs;
    }
}

/* floor division as Python's // (w_step may be negative only if the crop is
 * larger than the image, which we prevent; kept exact anyway). */
static int floordiv(int a, int b) { int q = a / b; return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q; }

void ps_video_train_crop(const ps_video_opts_t *o, int img_w, int img_h, ps_vrng_t *r,
                         ps_video_crop_t *c)
{
    int base = img_w < img_h ? img_w : img_h;
    int ch[PS_VIDEO_MAX_SCALES], cw[PS_VIDEO_MAX_SCALES];
    for (int i = 0; i < o->n_scales; i++) {
        int s = (int)(base * o->scales[i]);
        ch[i] = abs(s - o->crop_h) < 3 ? o->crop_h : s;
        cw[i] = abs(s - o->crop_w) < 3 ? o->crop_w : s;
    }
    int pw[PS_VIDEO_MAX_SCALES * PS_VIDEO_MAX_SCALES], ph[PS_VIDEO_MAX_SCALES * PS_VIDEO_MAX_SCALES];
    int np = 0;
    for (int i = 0; i < o->n_scales; i++)
        for (int j = 0; j < o->n_scales; j++)
            if (abs(i - j) <= o->max_distort) { pw[np] = cw[j]; ph[np] = ch[i]; np++; }
    int k = (int)ps_vrng_below(r, (uint64_t)np);
    /* TSM would crop outside a tiny image (PIL pads with black); clamp. */
    c->w = pw[k] < 1 ? 1 : pw[k] > img_w ? img_w : pw[k];
    c->h = ph[k] < 1 ? 1 : ph[k] > img_h ? img_h : ph[k];
    int ws = floordiv(img_w - c->w, 4), hs = floordiv(img_h - c->h, 4);
    static const int fix[13][2] = { { 0, 0 }, { 4, 0 }, { 0, 4 }, { 4, 4 }, { 2, 2 }, { 0, 2 }, { 4, 2 },
                                    { 2, 4 }, { 2, 0 }, { 1, 1 }, { 3, 1 }, { 1, 3 }, { 3, 3 } };
    int nf = o->more_fix_crop ? 13 : 5;
    int f = (int)ps_vrng_below(r, (uint64_t)nf);
    c->x = fix[f][0] * ws;
    c->y = fix[f][1] * hs;
    c->flip = o->flip ? ps_vrng_below(r, 2) == 1 : 0;
}

size_t ps_video_sampler_indices(size_t n, uint64_t seed, uint64_t epoch, int rank, int world,
                                int shuffle, int drop_last, int64_t *out)
{
    size_t W = (size_t)world, per = drop_last ? n / W : (n + W - 1) / W;
    if (!out || per == 0) return per;
    int64_t *perm = malloc(sizeof(int64_t) * n);
    if (!perm) return 0;
    for (size_t i = 0; i < n; i++) perm[i] = (int64_t)i;
    if (shuffle) {
        ps_vrng_t r = { ps_vrng_mix(ps_vrng_mix(seed ^ 0x7065726Dull) ^ epoch) };
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = (size_t)ps_vrng_below(&r, i + 1);
            int64_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
    }
    /* total = per*W positions; past N they wrap to the start (padding). */
    for (size_t k = 0; k < per; k++) out[k] = perm[(rank + k * W) % n];
    free(perm);
    return per;
}

/* Pixels of one frame into out (3 planes of H*W), normalised, flipped. */
static void normalise(const ps_video_opts_t *o, const uint8_t *px, int flip, float *out)
{
    int H = o->crop_h, W = o->crop_w;
    size_t plane = (size_t)H * W;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            const uint8_t *p = px + ((size_t)y * W + (flip ? W - 1 - x : x)) * 3;
            for (int c = 0; c < 3; c++) {
                float v = (float)p[c] / 255.0f;
                out[c * plane + (size_t)y * W + x] = (v - o->mean[c]) / o->std[c];
            }
        }
}

void ps_video_io_add(ps_video_io_t *acc, const ps_video_io_t *x)
{
    acc->samples += x->samples;
    acc->frames += x->frames;
    acc->bytes += x->bytes;
    acc->read_s += x->read_s;
    acc->decode_s += x->decode_s;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ps_video_load_sample(const ps_video_list_t *l, const ps_video_opts_t *o, uint64_t epoch,
                         size_t index, float *out, char *err, size_t errlen)
{
    return ps_video_load_sample_io(l, o, epoch, index, out, NULL, err, errlen);
}

int ps_video_load_sample_io(const ps_video_list_t *l, const ps_video_opts_t *o, uint64_t epoch,
                            size_t index, float *out, ps_video_io_t *io, char *err,
                            size_t errlen)
{
    ps_video_io_t cost = {1, 0, 0, 0, 0};
    const double t_start = now_s();
    if (index >= l->n) {
        ps_errf(err, errlen, "sample %zu out of range (%zu videos)", index, l->n);
        return PS_ERANGE;
    }
    /* training: one clip; testing: n_clips clips, each cut n_crops ways
     * (output clip k * n_crops + c); KT frames are read */
    int T = o->n_segment, nk = o->train ? 1 : o->n_clips, nc = o->train ? 1 : o->n_crops, KT = nk * T;
    int H = o->crop_h, W = o->crop_w;
    ps_vrng_t r = ps_vrng_sample(o->seed, epoch, index);
    size_t img_floats = (size_t)3 * H * W;
    int *idx = malloc(sizeof(int) * 3 * (size_t)KT), *fw = idx + KT, *fh = fw + KT;
    uint8_t **px = calloc((size_t)KT, sizeof *px);
    uint8_t *rs = malloc((size_t)H * W * 3);
    uint8_t *scaled = NULL;
    int rc = 0;
    ps_video_crop_t crop = { 0, 0, 0, 0, 0 };
    if (!idx || !px || !rs) {
        free(idx), free(px), free(rs);
        ps_errf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    /* every index first (the random draws keep their documented order:
     * the offsets, then the crop), then all frames in one read, so a video
     * file is opened and decoded forward once per sample */
    for (int k = 0; k < nk; k++) ps_video_clip_indices(o, l->v[index].frames, k, nk, &r, idx + k * T);
    rc = ps_video_read_frames_io(l, index, idx, KT, px, fw, fh, &cost, err, errlen);
    for (int j = 0; j < KT && rc == 0; j++) {
        int k = j / T, t = j % T;
        if (j == 0) {
            if (o->train) ps_video_train_crop(o, fw[0], fh[0], &r, &crop);
        } else if (fw[j] != fw[0] || fh[j] != fh[0]) {
            ps_errf(err, errlen, "%s:%d: video '%s': frame %d is %dx%d, frame %d of the clip %dx%d",
                     l->source, l->v[index].line, l->v[index].name, idx[j], fw[j], fh[j], idx[0], fw[0], fh[0]);
            rc = PS_EMISMATCH;
            break;
        }
        if (o->train) {
            rc = ps_image_resize(px[j] + ((size_t)crop.y * fw[j] + crop.x) * 3, fw[j] * 3, crop.w, crop.h,
                                 rs, W, H);
            if (rc < 0) { ps_errf(err, errlen, "resize failed: %s", ps_strerror(rc)); break; }
            normalise(o, rs, crop.flip, out + (size_t)j * img_floats);
            continue;
        }
        /* torchvision Resize(int): shorter side to scale_size. */
        int ss = o->scale_size ? o->scale_size : H * 256 / 224, w = fw[j], h = fh[j];
        int ow, oh;
        if ((w <= h && w == ss) || (h <= w && h == ss)) { ow = w; oh = h; }
        else if (w < h) { ow = ss; oh = (int)((long long)ss * h / w); }
        else { oh = ss; ow = (int)((long long)ss * w / h); }
        if (!scaled) scaled = malloc((size_t)ow * oh * 3);
        if (!scaled) { rc = PS_ENOMEM; break; }
        rc = ps_image_resize(px[j], w * 3, w, h, scaled, ow, oh);
        if (rc < 0) { ps_errf(err, errlen, "resize failed: %s", ps_strerror(rc)); break; }
        for (int c = 0; c < nc; c++) {
            int left, top;
            ps_video_test_crop(ow, oh, W, H, nc, c, &left, &top);
            for (int y = 0; y < H; y++)
                memcpy(rs + (size_t)y * W * 3, scaled + ((size_t)(y + top) * ow + left) * 3,
                       (size_t)W * 3);
            normalise(o, rs, 0, out + (((size_t)k * nc + c) * T + t) * img_floats);
        }
    }
    for (int j = 0; j < KT; j++) free(px[j]);
    free(px);
    free(idx);
    free(rs);
    free(scaled);
    /* decoding: everything but reading the bytes (JPEG decode, crop,
     * resize, normalisation) */
    cost.decode_s = now_s() - t_start - cost.read_s;
    if (io && rc >= 0) ps_video_io_add(io, &cost);
    return rc;
}
