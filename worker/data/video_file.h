/* Video files through FFmpeg's libraries (libavformat, libavcodec,
 * libswscale): probing, decoding selected frames, and writing test videos.
 *
 * A video's frames are its best video stream's frames in presentation
 * order (position 0 .. n-1).  Extraction (psdata extract) and on-the-fly
 * decoding (psworker --video-list) both go through this file, so frame k
 * of an extracted folder and frame k decoded on the fly are the same
 * picture, resized the same way, and differ only by the JPEG encoding.
 *
 * Output frames: with fps 0, output frame k (1-based) is source position
 * k - 1.  With fps F > 0, output frame k shows the source frame on screen
 * at time (k - 1) / F: the last position j with t_j <= (k - 1) / F (+ 0.1
 * ms), t_j the frame's time after the first frame; there are
 * floor(t_last * F) + 1 output frames, so a frame is repeated when F is
 * above the video's rate and skipped when below.
 *
 * Pixels: the decoder's picture converted to RGB8 by libswscale (the
 * stream's colour matrix and range), then the shorter side resized to
 * short_side with ps_image_resize (PIL's bilinear, as the loader's own
 * resize), the longer side to floor(long * short_side / short);
 * short_side 0 keeps the decoded size. */
#ifndef PS_VIDEO_FILE_H
#define PS_VIDEO_FILE_H
#include <stddef.h>
#include <stdint.h>

/* What a probe learnt about a video: frame count, times, keyframes. */
typedef struct ps_vfile_index ps_vfile_index_t;

/* Reads every packet of the best video stream of `path` (demuxing only,
 * no decoding).  Errors (PS_ENOTFOUND: missing file; PS_ECORRUPT: not a
 * readable video, no video stream, damaged container) name the file. */
int ps_vfile_probe(const char *path, ps_vfile_index_t **out, char *err, size_t errlen);
void ps_vfile_index_free(ps_vfile_index_t **ix);
/* Output frames at fps (0 = every source frame). */
int ps_vfile_frames(const ps_vfile_index_t *ix, double fps);
/* The source position output frame k (1-based) shows. */
int ps_vfile_source_frame(const ps_vfile_index_t *ix, double fps, int k);
/* Source frames and keyframes of the stream, its coded size. */
int ps_vfile_source_frames(const ps_vfile_index_t *ix);
int ps_vfile_keyframes(const ps_vfile_index_t *ix);
void ps_vfile_size(const ps_vfile_index_t *ix, int *w, int *h);

typedef struct ps_vfile_opts {
    int short_side;      /* shorter side of the output frames (0 = as decoded) */
    double fps;          /* output frame rate (0 = the video's frames) */
    long *decoded;       /* optional: pictures the decoder produced are added
                            here (what seeking saves; tests, benchmarks) */
} ps_vfile_opts_t;

/* Called once per requested frame, in request order: the k-th request's
 * RGB8 picture (w x h, valid during the call).  Returns 0 or a negative
 * PS_E* that stops the decoding (message in err). */
typedef int (*ps_vfile_frame_fn)(int k, const uint8_t *rgb, int w, int h, void *user, char *err,
                                 size_t errlen);

/* Decodes output frames want[0..n) (1-based, nondecreasing) of the probed
 * video: a keyframe seek when the next wanted frame lies past a keyframe
 * ahead of the decoder, decoding forward otherwise.  A decoding error, a
 * frame the file does not deliver, or a seek that misses are errors naming
 * the file (a missed seek is first retried from the start). */
int ps_vfile_decode(const char *path, const ps_vfile_index_t *ix, const ps_vfile_opts_t *o,
                    const int *want, int n, ps_vfile_frame_fn fn, void *user, char *err,
                    size_t errlen);

/* How ps_vfile_write encodes. */
typedef struct ps_vfile_enc {
    int fps;             /* frames per second */
    int gop;             /* a keyframe every gop frames */
    int q;               /* quantiser, 2 (best) .. 31 */
    int bframes;         /* B-frames between reference frames (0: none; with
                            them presentation and decoding order differ) */
} ps_vfile_enc_t;

/* Writes a video file (container from the name's extension: .mp4, .avi,
 * .mkv, .mov) of n frames of w x h (even) RGB8 pictures from frame(t, rgb,
 * user), encoded with MPEG-4 part 2 (FFmpeg's own encoder).  Written to
 * path.tmp and renamed when complete. */
typedef int (*ps_vfile_source_fn)(int t, uint8_t *rgb, void *user);
int ps_vfile_write(const char *path, int w, int h, int n, const ps_vfile_enc_t *enc,
                   ps_vfile_source_fn frame, void *user, char *err, size_t errlen);

#endif
