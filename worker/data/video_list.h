/* Internal: the list's representation, shared by the folder and the packed
 * readers (video_list.c, video_pack.c). */
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
} ps_video_entry_t;

typedef struct ps_pack_frame {
    uint64_t off;
    uint32_t len;
    uint32_t crc;      /* CRC32C of the JPEG bytes */
} ps_pack_frame_t;

struct ps_video_list {
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
};

/* Checks a frame template: exactly one integer conversion (%d, %05d, %i, %u)
 * and otherwise only %% escapes. */
int ps_video_tmpl_ok(const char *tmpl);
/* root/name/tmpl(frame) into buf; PS_ERANGE if it does not fit. */
int ps_video_frame_path(const ps_video_list_t *l, size_t i, int frame, char *buf, size_t n);
int ps_video_list_add(ps_video_list_t *l, const char *name, int frames, int label, int line);
/* mkdir -p; 0 or -1 with errno set. */
int ps_mkdir_p(const char *path);
ps_video_list_t *ps_video_list_alloc(const char *source, const char *root, const char *tmpl);

#endif
