/* Video data pipeline: TSM list files (or packed shards) of JPEG frames, or
 * lists of video files decoded on the fly, TSN segment sampling, TSM's augmentation, and a threaded loader with a
 * bounded prefetch queue.
 *
 * Legend: N videos in a list, T = n_segment frames per clip, B samples
 * (videos) per batch, K clips per sample (1 when training; n_clips when
 * testing), H x W network input.  A batch is (B*K*T, 3, H, W) float NCHW,
 * ImageNet-normalised, image (b*K + k)*T + t.
 *
 * Reproducibility contract (what psworker's W-workers-vs-one-worker property
 * rests on): the order of samples in an epoch is ps_video_sampler_indices()
 * (PyTorch DistributedSampler's rule over our own documented permutation),
 * and every random choice for a sample (segment offsets, crop, flip) is drawn
 * from a stream seeded by (seed, epoch, sample index) only -- never from a
 * thread's or a worker's private stream.  So a batch is the same for any
 * number of loader threads, and rank r of W sees exactly the samples (and
 * the pixels) one process would give positions r, r+W, ... of the epoch.
 *
 * The PRNG (documented so another implementation can reproduce it):
 *   mix(z):   z += 0x9E3779B97F4A7C15; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
 *             z = (z ^ z>>27) * 0x94D049BB133111EB; return z ^ z>>31
 *             (SplitMix64's output function; all arithmetic mod 2^64)
 *   stream:   state s; next() = mix(s) then s += 0x9E3779B97F4A7C15
 *             (i.e. SplitMix64: out = mix(s_old) with the increment folded in)
 *   below(n): (next() * n) >> 64 with a 128-bit product (Lemire), in [0,n)
 *   sample stream: s = mix(mix(mix(seed) ^ epoch) ^ sample_index)
 *   epoch permutation: s = mix(mix(seed ^ 0x7065726D) ^ epoch)  ("perm"),
 *             Fisher-Yates: for i = N-1 down to 1: j = below(i+1); swap(i,j)
 *   A sample draws, in this order: T segment offsets (training, TSN rule)
 *   or one clip offset (training, dense rule, when the video is at least
 *   as long as the clip), the crop-size pair, the fixed crop offset, then flip =
 *   (below(2) == 1) only when flipping is enabled.
 */
#ifndef PS_VIDEO_H
#define PS_VIDEO_H
#include <stddef.h>
#include <stdint.h>

/* ---- PRNG ---------------------------------------------------------------- */
typedef struct ps_vrng { uint64_t s; } ps_vrng_t;
uint64_t ps_vrng_mix(uint64_t z);
uint64_t ps_vrng_next(ps_vrng_t *r);
uint64_t ps_vrng_below(ps_vrng_t *r, uint64_t n); /* n >= 1 */
/* The stream every random choice of sample `index` in `epoch` comes from. */
ps_vrng_t ps_vrng_sample(uint64_t seed, uint64_t epoch, uint64_t index);

/* ---- list ---------------------------------------------------------------- */
typedef struct ps_video_list ps_video_list_t;

typedef struct ps_video_list_opts {
    const char *root;      /* prefix of frame_dir ("" or NULL: as written) */
    const char *tmpl;      /* frame file name, printf with one int; "img_%05d.jpg" */
    int skip_bad;          /* 1: drop bad lines/videos (counted, warned); 0: fail */
    int check_frames;      /* 1: the first and the last frame file must exist */
    int verify_jpeg;       /* 1: read every frame's JPEG header at load (slow) */
    int min_frames;        /* videos with fewer frames are bad (TSM: 3); >= 1 */
    /* video-file lists (ps_video_list_load_videos): the frames as psdata
     * extract writes them (video_file.h) */
    int short_side;        /* shorter side of a frame (256; 0 = as decoded) */
    double fps;            /* frame rate (0 = every frame of the video) */
    int probe_threads;     /* videos probed at once (0 = one per core) */
} ps_video_list_opts_t;

void ps_video_list_opts_default(ps_video_list_opts_t *o);

/* Reads a TSM list: one video per line, `frame_dir num_frames label`
 * (frame_dir may contain spaces: the last two fields are the numbers);
 * blank lines and lines starting with '#' are ignored.  Frames are
 * root/frame_dir/tmpl(i), i = 1..num_frames.  Returns 0 and *out, or a
 * negative PS_E* with a message naming the file and line in err. */
int ps_video_list_load(const char *list_path, const ps_video_list_opts_t *o,
                       ps_video_list_t **out, char *err, size_t errlen);
/* Reads a dataset written by ps_video_pack() (psdata pack) from its
 * directory; same videos, same order, same labels as the list it came from. */
int ps_video_list_load_packed(const char *dir, const ps_video_list_opts_t *o,
                              ps_video_list_t **out, char *err, size_t errlen);
/* Reads a list of video files, `path label` per line (path relative to
 * root; any container FFmpeg reads), for decoding on the fly.  Every video
 * is probed here (its packets demuxed, not decoded: frame count, times,
 * keyframes), so num_frames is the count psdata extract would write with
 * the same short_side and fps, and a sample decodes the same frames as
 * from the extracted folder.  A missing, unreadable or video-less file is
 * an error naming the list line and the file (skip_bad: a counted skip). */
int ps_video_list_load_videos(const char *list_path, const ps_video_list_opts_t *o,
                              ps_video_list_t **out, char *err, size_t errlen);
void ps_video_list_free(ps_video_list_t **l);

size_t ps_video_list_size(const ps_video_list_t *l);
int ps_video_list_frames(const ps_video_list_t *l, size_t i);
int ps_video_list_label(const ps_video_list_t *l, size_t i);
const char *ps_video_list_name(const ps_video_list_t *l, size_t i); /* frame_dir */
int ps_video_list_num_classes(const ps_video_list_t *l);  /* max label + 1 */
size_t ps_video_list_skipped(const ps_video_list_t *l);   /* bad entries dropped */
int ps_video_list_is_packed(const ps_video_list_t *l);
/* The first video whose label is min_label or more: its index, or -1 if
 * none.  where (may be NULL) gets its place for messages: "list:line" for a
 * list file, "pack_dir (list line N)" for a packed one.  How a caller checks
 * the labels against a class count (every label below it) or for gaps. */
long ps_video_list_find_label(const ps_video_list_t *l, int min_label, char *where, size_t n);

/* The encoded bytes of frame `frame` (1-based) of video i: a malloc'd copy in
 * *buf (caller frees).  Errors name the list file and line. */
int ps_video_read_frame_bytes(const ps_video_list_t *l, size_t i, int frame,
                              uint8_t **buf, size_t *len, char *err, size_t errlen);
/* Decoded RGB8 (h*w*3, caller frees) of frames idx[0..n) (1-based, any
 * order) of video i: px[k] is w[k] x h[k].  On failure none is left. */
int ps_video_read_frames(const ps_video_list_t *l, size_t i, const int *idx, int n, uint8_t **px,
                         int *w, int *h, char *err, size_t errlen);
/* Decoded RGB8 (h*w*3, caller frees) of frame `frame` of video i. */
int ps_video_read_frame(const ps_video_list_t *l, size_t i, int frame,
                        uint8_t **rgb, int *w, int *h, char *err, size_t errlen);

/* What loading cost, summed over the samples it counts: the encoded
 * bytes read, the seconds reading them and the seconds turning them into
 * the network's input (JPEG decode, crop / resize, normalisation). */
typedef struct ps_video_io {
    uint64_t samples, frames, bytes;
    double read_s, decode_s;
} ps_video_io_t;
void ps_video_io_add(ps_video_io_t *acc, const ps_video_io_t *x);
/* ps_video_read_frame, its cost added to *io (may be NULL). */
int ps_video_read_frame_io(const ps_video_list_t *l, size_t i, int frame, uint8_t **rgb,
                           int *w, int *h, ps_video_io_t *io, char *err, size_t errlen);
/* ps_video_read_frames, its cost added to *io (may be NULL): frames, and
 * for frame files the bytes and the seconds reading them (a video file
 * demuxes and decodes in one pass: all of its time is decoding). */
int ps_video_read_frames_io(const ps_video_list_t *l, size_t i, const int *idx, int n, uint8_t **px,
                            int *w, int *h, ps_video_io_t *io, char *err, size_t errlen);

/* ---- sampling and augmentation ------------------------------------------ */
#define PS_VIDEO_MAX_SCALES 8

/* Which frames a clip takes (ps_video_opts_t.sampling). */
enum {
    PS_VIDEO_SAMPLING_TSN = 0,   /* T segments of the video, a frame from each (TSN / TSM) */
    PS_VIDEO_SAMPLING_DENSE = 1  /* T frames `stride` apart from one offset (3-D models) */
};

typedef struct ps_video_opts {
    int n_segment;        /* T (TSM: 8) */
    int sampling;         /* PS_VIDEO_SAMPLING_* (default TSN) */
    int stride;           /* dense: every stride-th frame (>= 1) */
    int crop_h, crop_w;   /* network input H, W (TSM: 224) */
    int scale_size;       /* test: shorter side resized to this, then centre
                             crop; 0 = crop_h * 256 / 224 (TSM's scale_size) */
    int train;            /* 1: random offsets, multi-scale crop, flip */
    int flip;             /* training horizontal flip (off for direction data) */
    int n_scales;         /* multi-scale crop scales (TSM: 1 .875 .75 .66) */
    double scales[PS_VIDEO_MAX_SCALES];
    int max_distort;      /* |i - j| of the (h, w) scale pair (TSM: 1) */
    int more_fix_crop;    /* 13 fixed offsets instead of 5 (TSM: 1) */
    int n_clips;          /* testing: clips per video (evenly spaced) */
    int n_crops;          /* testing: 1 = centre crop; 3 = three crops along the
                             longer side (TSM's GroupFullResSample, below) */
    float mean[3], std[3];/* ImageNet normalisation */
    uint64_t seed;
    int rank, world;      /* DistributedSampler position (0, 1 = all) */
    int batch;            /* B samples per batch per rank */
    int shuffle;          /* -1: = train */
    int drop_last;        /* -1: = train.  1: floor(N/W) samples per rank and
                             only full batches; 0: pad the rank lists to
                             ceil(N/W) by wrapping (DistributedSampler) and
                             keep the last short batch */
    int threads;          /* loader threads; 0 = decode in the caller */
    int prefetch;         /* batches decoded ahead (bounded queue), >= 1 */
    int skip_bad;         /* a frame that fails to decode: 1 = substitute the
                             next good video (counted), 0 = error */
} ps_video_opts_t;

void ps_video_opts_default(ps_video_opts_t *o);
int ps_video_opts_check(const ps_video_opts_t *o, char *err, size_t errlen);
/* Clips per sample: train ? 1 : n_clips * n_crops.  A test sample's clip
 * k = clip * n_crops + crop. */
int ps_video_clips_per_sample(const ps_video_opts_t *o);

/* TSN training indices (TSM's _sample_indices, new_length 1): 1-based. */
void ps_video_tsn_train_indices(int num_frames, int T, ps_vrng_t *r, int *out);
/* TSN test indices (TSM's _get_val_indices for n_clips 1; clip c of n
 * shifts the point inside each span to tick*(c+0.5)/n): 1-based. */
void ps_video_tsn_test_indices(int num_frames, int T, int clip, int n_clips, int *out);

/* Test crop `crop` of n_crops (1 or 3) for a frame already scaled to
 * img_w x img_h: 1 = the centre (offsets round((img - crop) / 2), Python's
 * round); 3 = TSM's GroupFullResSample without flips, step = (img - crop)
 * // 4 along the longer side and offsets 0, 4*step, 2*step there (left,
 * right, centre), 2*step of the other side's step across.  (TSM steps along
 * the width whatever the shape, so a portrait video gets three identical
 * centre crops there; here the three go along the longer side.) */
void ps_video_test_crop(int img_w, int img_h, int crop_w, int crop_h, int n_crops, int crop,
                        int *x, int *y);
/* Dense sampling (video_dense.c; mmaction2's SampleFrames with clip_len T,
 * frame_interval stride, out-of-bound frames looped): a clip spans
 * L = T*stride frames.  Training: offset = below(N - L + 1) when the video
 * has L frames or more (one draw), else 0; test clip c of n: offset =
 * floor(c*a + a/2) with a = (N - L + 1) / n when N > L - 1, else 0.  Frame
 * t is ((offset + t*stride) mod N) + 1, 1-based. */
void ps_video_dense_train_indices(int num_frames, int T, int stride, ps_vrng_t *r, int *out);
void ps_video_dense_test_indices(int num_frames, int T, int stride, int clip, int n_clips,
                                 int *out);
/* The 1-based frames of clip `clip` of `n_clips` of a video under o's
 * sampling (training draws from r). */
void ps_video_clip_indices(const ps_video_opts_t *o, int num_frames, int clip, int n_clips,
                           ps_vrng_t *r, int *out);

/* GroupMultiScaleCrop's choice for an image of w x h (fix_crop on). */
typedef struct ps_video_crop { int x, y, w, h; int flip; } ps_video_crop_t;
void ps_video_train_crop(const ps_video_opts_t *o, int img_w, int img_h,
                         ps_vrng_t *r, ps_video_crop_t *c);

/* DistributedSampler: the n_out sample indices rank `rank` of `world` takes
 * in `epoch` (shuffle: the documented permutation; else 0..N-1).  Returns the
 * count; out may be NULL to ask for it. */
size_t ps_video_sampler_indices(size_t n, uint64_t seed, uint64_t epoch, int rank,
                                int world, int shuffle, int drop_last, int64_t *out);

/* One sample, a pure function of (list, opts, epoch, index): K*T images
 * into out (K*T*3*H*W floats).  Returns 0 or a negative PS_E* (err says
 * which file failed).  skip_bad is not applied here. */
int ps_video_load_sample(const ps_video_list_t *l, const ps_video_opts_t *o,
                         uint64_t epoch, size_t index, float *out,
                         char *err, size_t errlen);
/* The same with its cost added to *io (may be NULL): one sample, its frames,
 * bytes and seconds. */
int ps_video_load_sample_io(const ps_video_list_t *l, const ps_video_opts_t *o,
                            uint64_t epoch, size_t index, float *out, ps_video_io_t *io,
                            char *err, size_t errlen);

/* ---- loader -------------------------------------------------------------- */
typedef struct ps_video_loader ps_video_loader_t;

/* The list is borrowed and must outlive the loader.  Starts at epoch 0. */
int ps_video_loader_new(const ps_video_list_t *l, const ps_video_opts_t *o,
                        ps_video_loader_t **out, char *err, size_t errlen);
/* Starts (and begins prefetching) epoch `epoch`; drops any batches already
 * decoded for the previous one. */
int ps_video_loader_set_epoch(ps_video_loader_t *ld, uint64_t epoch);
/* Starts epoch `epoch` at batch `batch` (resuming a run mid-epoch). */
int ps_video_loader_seek(ps_video_loader_t *ld, uint64_t epoch, size_t batch);
/* The epoch and the batch number next() returns next. */
uint64_t ps_video_loader_epoch(const ps_video_loader_t *ld);
size_t ps_video_loader_position(const ps_video_loader_t *ld);
/* Next batch of the current epoch: clips (B*K*T*3*H*W floats), labels (B),
 * indices (B dataset indices, may be NULL); *wait_s (may be NULL) is how long
 * this call blocked for data.  Returns the number of samples (<= B), 0 at the
 * end of the epoch, or a negative PS_E* (message in ps_video_loader_error). */
int ps_video_loader_next(ps_video_loader_t *ld, float *clips, int32_t *labels,
                         int64_t *indices, double *wait_s);
size_t ps_video_loader_batches(const ps_video_loader_t *ld); /* per epoch */
size_t ps_video_loader_samples(const ps_video_loader_t *ld); /* per epoch */
size_t ps_video_loader_skipped(const ps_video_loader_t *ld); /* bad samples replaced */
/* The cost of the batches next() has handed out: the last one's (last, may
 * be NULL) and the total since the loader was made (total, may be NULL). */
void ps_video_loader_io(const ps_video_loader_t *ld, ps_video_io_t *last, ps_video_io_t *total);
const char *ps_video_loader_error(const ps_video_loader_t *ld);
void ps_video_loader_destroy(ps_video_loader_t **ld);

/* ---- packed shards ------------------------------------------------------- */
/* Writes the list's videos as shards of `shard_videos` videos each:
 * dir/shard-NNNNN.bin (the frames' JPEG bytes, concatenated) and
 * dir/shard-NNNNN.idx (format in video_pack.c).  Frames are copied as is
 * (checked to start with a JPEG SOI marker). */
int ps_video_pack(const ps_video_list_t *l, const char *dir, int shard_videos,
                  char *err, size_t errlen);

#endif
