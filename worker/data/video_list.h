/* Internal: the list's representation, shared by the folder, packed and
 * video-file readers (video_list.c, video_pack.c, video_file_list.c). */
#ifndef PS_VIDEO_LIST_H
#define PS_VIDEO_LIST_H
#include <stddef.h>
#include <stdint.h>

#include "worker/data/ps_video.h"

typedef struct ps_video_entry {
    char *name;        /* frame_dir as written in the list */
    int frames;        /* num_frames */
    int label;
    int line;          /* 1-based line in the source list file */
    int shard;         /* packed: shard number; -1 for folders */
    size_t first;      /* packed: index of frame 1 in the frame table */
    struct ps_vfile_index *vix; /* video files: the probe (frames, times, keyframes) */
} ps_video_entry_t;

typedef struct ps_pack_frame {
    uint64_t off;
    uint32_t len;
    uint32_t crc;      /* CRC32C of the JPEG bytes */
} ps_pack_frame_t;

/* How a kind of list delivers pictures: JPEG frames (folders, packs) or
 * video files decoded on the fly.  A row per kind; the list holds its row. */
typedef struct ps_video_source {
    const char *kind;  /* for messages */
    /* Frames idx[0..n) (1-based, any order) of video i as malloc'd RGB8
     * px[k] of w[k] x h[k]; on failure nothing is left allocated and err
     * names the list line and the file.  io (may be NULL): the frames, and
     * the encoded bytes and the seconds reading them where the kind can
     * tell them from decoding. */
    int (*read_frames)(const ps_video_list_t *l, size_t i, const int *idx, int n, uint8_t **px,
                       int *w, int *h, ps_video_io_t *io, char *err, size_t errlen);
    /* frees what the kind keeps per entry (NULL: nothing) */
    void (*free_entry)(ps_video_entry_t *e);
} ps_video_source_t;

extern const ps_video_source_t ps_video_source_jpeg;  /* video_list.c */
extern const ps_video_source_t ps_video_source_file;  /* video_file_list.c */

struct ps_video_list {
    const ps_video_source_t *src;
    char *source;      /* list file (or pack directory) for messages */
    char *root;        /* folder reader: prefix, "" for none */
    char *tmpl;        /* folder reader: frame name template */
    ps_video_entry_t *v;
    size_t n, cap;
    size_t skipped;
    int num_classes;
    /* packed reader */
    int packed;
    int n_shards;
    int *shard_fd;
    char **shard_path;
    ps_pack_frame_t *fr;
    size_t n_fr;
    /* video-file reader: the frames' size and rate (video_file.h) */
    int short_side;
    double fps;
};

/* Checks a frame template: exactly one integer conversion (%d, %05d, %i, %u)
 * and otherwise only %% escapes. */
int ps_video_tmpl_ok(const char *tmpl);
/* root/name/tmpl(frame) into buf; PS_ERANGE if it does not fit. */
int ps_video_frame_path(const ps_video_list_t *l, size_t i, int frame, char *buf, size_t n);
int ps_video_list_add(ps_video_list_t *l, const char *name, int frames, int label, int line);
ps_video_list_t *ps_video_list_alloc(const char *source, const char *root, const char *tmpl);

/* Validates entry i as it is read: 0, or a PS_E* with the reason in msg
 * (the entry is then dropped). */
typedef int (*ps_video_entry_check_fn)(ps_video_list_t *l, size_t i, const void *arg, char *msg,
                                       size_t msglen);
/* Reads a list file into l: `frame_dir num_frames label` lines
 * (with_frames) or `path label` lines; names may hold spaces, blank lines
 * and '#' lines are ignored.  A bad line is an error naming list:line, or
 * with skip_bad a counted warning.  check may be NULL. */
int ps_video_list_read(const char *list_path, int with_frames, int skip_bad, ps_video_list_t *l,
                       ps_video_entry_check_fn check, const void *arg, char *err, size_t errlen);
/* After reading: at least one video, the class count, the skip warning. */
int ps_video_list_finish(ps_video_list_t *l, char *err, size_t errlen);
/* root/name of a video-file entry (the name alone when absolute or no root). */
int ps_video_file_path(const char *root, const char *name, char *buf, size_t n);

/* Builds one packed shard in memory (format in video_pack.c): videos are
 * begun, given their JPEG frames, and ended (ok = 0 drops the video and
 * its frames); write puts the shard's .bin then its .idx under dir, each
 * through a temporary file and a rename. */
typedef struct ps_pack_builder ps_pack_builder_t;
ps_pack_builder_t *ps_pack_builder_new(void);
void ps_pack_builder_free(ps_pack_builder_t **b);
void ps_pack_video_begin(ps_pack_builder_t *b, const char *name, int line, int label);
/* PS_ECORRUPT: not a JPEG (no SOI marker); PS_ENOMEM */
int ps_pack_frame(ps_pack_builder_t *b, const uint8_t *jpeg, size_t len);
void ps_pack_video_end(ps_pack_builder_t *b, int ok);
uint32_t ps_pack_builder_videos(const ps_pack_builder_t *b);
int ps_pack_builder_write(ps_pack_builder_t *b, const char *dir, size_t shard, char *err, size_t errlen);

#endif
