/* psdata extract: a list of video files to the TSM layout (frame folders
 * and a list) or straight into packed shards, in parallel, resumable.
 *
 * Folder layout (out): video `dir/name.mp4` becomes OUT/dir/name/
 * img_00001.jpg ... (the path without its extension), the list
 * OUT/<list name>.txt gets `dir/name num_frames label`.  A video is
 * decoded into OUT/dir/name.extracting/, closed with a `.frames` file
 * holding its frame count, and renamed into place: a folder under its
 * final name is complete, a run that is stopped and started again skips
 * those and redoes the rest.  The list is written (through a temporary
 * file) when every video has been tried; a video that failed is not in it.
 *
 * Packed (packed = DIR): videos i*S .. i*S+S-1 of the list (S =
 * shard_videos) become DIR/shard-000ii.{bin,idx} (video_pack.c's format),
 * a shard written whole or not at all; a video that failed is left out of
 * its shard.  A stopped run redoes the shards without an index.
 *
 * Both keep the options in OUT/extract.conf (DIR/extract.conf) and refuse
 * to continue a directory made with other ones (the frames would not
 * match); the packed one also holds the list's checksum. */
#ifndef PS_VIDEO_EXTRACT_H
#define PS_VIDEO_EXTRACT_H
#include <stddef.h>

typedef struct ps_video_extract_opts {
    const char *list;      /* `path label` lines */
    const char *root;      /* directory the paths are relative to ("" = as written) */
    const char *out;       /* folder layout: output directory */
    const char *packed;    /* or: the pack directory */
    int short_side;        /* shorter side of the frames (256; 0 = as decoded) */
    double fps;            /* frames per second (0 = every frame) */
    int threads;           /* videos (folders) or shards (packed) at once; 0 = cores */
    int quality;           /* JPEG quality */
    int shard_videos;      /* packed: videos per shard */
} ps_video_extract_opts_t;

typedef struct ps_video_extract_stats {
    size_t videos;         /* in the list */
    size_t extracted;      /* by this run */
    size_t done_before;    /* already complete (an earlier run) */
    size_t bad;            /* failed: unreadable, no video stream, damaged, missing */
    size_t frames;         /* frames written by this run */
} ps_video_extract_stats_t;

void ps_video_extract_opts_default(ps_video_extract_opts_t *o);
/* Extracts the list.  Each failed video is logged as it happens, naming
 * the list line and the file, and counted in st->bad (in packed mode a
 * video left out of a shard by an earlier run counts as bad again).
 * Returns 0 when the run finished (bad videos or not), or a negative PS_E*
 * for what stops it: a bad list line, the output not writable, a directory
 * extracted with other options. */
int ps_video_extract(const ps_video_extract_opts_t *o, ps_video_extract_stats_t *st, char *err,
                     size_t errlen);

#endif
