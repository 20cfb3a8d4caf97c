/* The four-direction moving-texture dataset (psdata gen-video). */
#ifndef PS_VIDEO_GEN_H
#define PS_VIDEO_GEN_H
#include <stddef.h>
#include <stdint.h>

typedef struct ps_video_gen_opts {
    const char *out;       /* directory: vid_NNNNNN/img_%05d.jpg, train.txt, val.txt */
    int videos;            /* total; the last round(videos*val_fraction) go to val.txt */
    int frames;            /* frames per video */
    int size;              /* frames are size x size */
    uint64_t seed;
    int classes;           /* 2 (up/down), 4 (up/down/left/right) or 8 (+diagonals) */
    double val_fraction;
    int quality;           /* JPEG quality */
    double speed;          /* pixels per frame; 0 = size/16 (at least 1) */
    double clutter;        /* static shapes: clutter * (6 + size^2/256); default 0.5 */
    double movers;         /* moving shapes: movers * (4 + size^2/512); default 3 */
} ps_video_gen_opts_t;

void ps_video_gen_opts_default(ps_video_gen_opts_t *o);
/* Renders one frame (RGB8, size*size*3) of video v: a pure function of
 * (opts, v, t).  *label gets the video's class. */
int ps_video_gen_frame(const ps_video_gen_opts_t *o, int v, int t, uint8_t *rgb, int *label);
int ps_video_gen(const ps_video_gen_opts_t *o, char *err, size_t errlen);
/* The same videos as files (video_file.h's writer, MPEG-4 part 2 encoded
 * as enc says) in the container `container` (mp4, avi, mkv, mov):
 * out/vid_NNNNNN_000000_EEEEEE.C
 * (Kinetics' names: id, start and end second), a Kinetics-style
 * out/labels.csv (label,youtube_id,time_start,time_end,split; labels are
 * class names such as "moving up"; the last round(videos * val_fraction)
 * are split "val") and out/classes.txt (the names in label order). */
struct ps_vfile_enc;
int ps_video_gen_files(const ps_video_gen_opts_t *o, const char *container, const struct ps_vfile_enc *enc,
                       char *err, size_t errlen);

#endif
