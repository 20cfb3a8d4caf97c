/* Packed shards for sequential I/O: the frames of `shard_videos` videos as
 * one file of concatenated JPEGs plus an index.
 *
 * dir/shard-NNNNN.bin  JPEG bytes, frame after frame, video after video
 * dir/shard-NNNNN.idx  little-endian:
 *     "PSVPACK1"                      8 bytes
 *     u32 n_videos
 *     n_videos x { u32 name_len, name bytes, u32 list_line, u32 num_frames,
 *                  i32 label, num_frames x { u64 offset, u32 length,
 *                  u32 crc32c of the frame } }
 *     u32 crc32c of everything above
 * Shards are numbered from 0 without gaps; the reader stops at the first
 * missing number.  The list order is kept, so the packed and the folder
 * readers give sample i the same video and the same pixels. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_util.h"
#include "worker/data/ps_image.h"
#include "worker/data/video_list.h"

#define MAGIC "PSVPACK1"

typedef struct wbuf { uint8_t *p; size_t n, cap; int oom; } wbuf_t;

static void put(wbuf_t *b, const void *d, size_t n)
{
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->n + n) nc *= 2;
        uint8_t *np = realloc(b->p, nc);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put32(wbuf_t *b, uint32_t v)
{
    uint8_t x[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
    put(b, x, 4);
}
static void put64(wbuf_t *b, uint64_t v) { put32(b, (uint32_t)v); put32(b, (uint32_t)(v >> 32)); }
static uint32_t get32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

/* ---- the shard builder (psdata pack, psdata extract --packed) ---------------- */

struct ps_pack_builder {
    wbuf_t data, idx;
    uint32_t videos;
    size_t mark_data, mark_idx;  /* where the open video began */
    size_t frames_at;            /* idx offset of the open video's num_frames */
    uint32_t frames;             /* frames added to the open video */
};

ps_pack_builder_t *ps_pack_builder_new(void)
{
    ps_pack_builder_t *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    put(&b->idx, MAGIC, 8);
    put32(&b->idx, 0); /* n_videos, set by ps_pack_builder_write */
    return b;
}

void ps_pack_builder_free(ps_pack_builder_t **bp)
{
    ps_pack_builder_t *b = *bp;
    if (!b) return;
    free(b->data.p);
    free(b->idx.p);
    free(b);
    *bp = NULL;
}

void ps_pack_video_begin(ps_pack_builder_t *b, const char *name, int line, int label)
{
    b->mark_data = b->data.n;
    b->mark_idx = b->idx.n;
    put32(&b->idx, (uint32_t)strlen(name));
    put(&b->idx, name, strlen(name));
    put32(&b->idx, (uint32_t)line);
    b->frames_at = b->idx.n;
    put32(&b->idx, 0); /* num_frames, set by ps_pack_video_end */
    put32(&b->idx, (uint32_t)label);
    b->frames = 0;
}

int ps_pack_frame(ps_pack_builder_t *b, const uint8_t *jpeg, size_t len)
{
    if (len < 4 || jpeg[0] != 0xFF || jpeg[1] != 0xD8 || len > UINT32_MAX) return PS_ECORRUPT;
    put64(&b->idx, b->data.n);
    put32(&b->idx, (uint32_t)len);
    put32(&b->idx, ps_crc32c(0, jpeg, len));
    put(&b->data, jpeg, len);
    b->frames++;
    return b->data.oom || b->idx.oom ? PS_ENOMEM : 0;
}

void ps_pack_video_end(ps_pack_builder_t *b, int ok)
{
    if (!ok || b->idx.oom) {
        b->data.n = b->mark_data;
        b->idx.n = b->mark_idx;
        return;
    }
    uint8_t *p = b->idx.p + b->frames_at;
    p[0] = (uint8_t)b->frames, p[1] = (uint8_t)(b->frames >> 8);
    p[2] = (uint8_t)(b->frames >> 16), p[3] = (uint8_t)(b->frames >> 24);
    b->videos++;
}

uint32_t ps_pack_builder_videos(const ps_pack_builder_t *b) { return b->videos; }

int ps_pack_builder_write(ps_pack_builder_t *b, const char *dir, size_t shard, char *err, size_t errlen)
{
    if (b->data.oom || b->idx.oom) {
        ps_errf(err, errlen, "out of memory building shard %zu (use a smaller --shard-videos)", shard);
        return PS_ENOMEM;
    }
    uint8_t *p = b->idx.p + 8;
    p[0] = (uint8_t)b->videos, p[1] = (uint8_t)(b->videos >> 8);
    p[2] = (uint8_t)(b->videos >> 16), p[3] = (uint8_t)(b->videos >> 24);
    size_t n = b->idx.n;
    put32(&b->idx, ps_crc32c(0, b->idx.p, n));
    if (b->idx.oom) {
        ps_errf(err, errlen, "out of memory building shard %zu", shard);
        return PS_ENOMEM;
    }
    /* the data first: an index under its final name means a whole shard */
    char path[4096];
    snprintf(path, sizeof path, "%s/shard-%05zu.bin", dir, shard);
    int rc = ps_write_file_atomic1(path, b->data.p, b->data.n, "pack", err, errlen);
    snprintf(path, sizeof path, "%s/shard-%05zu.idx", dir, shard);
    if (rc == 0) rc = ps_write_file_atomic1(path, b->idx.p, b->idx.n, "pack", err, errlen);
    b->idx.n = n; /* the checksum comes off again: the builder stays usable */
    return rc;
}

int ps_video_pack(const ps_video_list_t *l, const char *dir, int shard_videos, char *err, size_t errlen)
{
    if (shard_videos < 1) {
        ps_errf(err, errlen, "shard size %d videos must be >= 1", shard_videos);
        return PS_EINVAL;
    }
    if (ps_mkdir_p(dir) < 0) {
        ps_errf(err, errlen, "%s: %s", dir, strerror(errno));
        return PS_EIO;
    }
    int rc = 0;
    size_t n = ps_video_list_size(l);
    for (size_t s0 = 0, shard = 0; s0 < n && rc == 0; s0 += (size_t)shard_videos, shard++) {
        size_t s1 = s0 + (size_t)shard_videos < n ? s0 + (size_t)shard_videos : n;
        ps_pack_builder_t *b = ps_pack_builder_new();
        if (!b) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
        for (size_t i = s0; i < s1 && rc == 0; i++) {
            const ps_video_entry_t *e = &l->v[i];
            ps_pack_video_begin(b, e->name, e->line, e->label);
            for (int f = 1; f <= e->frames; f++) {
                uint8_t *jpg;
                size_t len;
                rc = ps_video_read_frame_bytes(l, i, f, &jpg, &len, err, errlen);
                if (rc < 0) break;
                rc = ps_pack_frame(b, jpg, len);
                free(jpg);
                if (rc == PS_ECORRUPT)
                    ps_errf(err, errlen, "%s:%d: video '%s' frame %d is not a JPEG", l->source, e->line,
                             e->name, f);
                if (rc < 0) break;
            }
            ps_pack_video_end(b, rc == 0);
        }
        if (rc == 0) rc = ps_pack_builder_write(b, dir, shard, err, errlen);
        ps_pack_builder_free(&b);
    }
    return rc;
}

/* Parses one index file, appending its videos and frames to l. */
static int read_index(ps_video_list_t *l, int shard, const char *path, const uint8_t *p, size_t n,
                      uint64_t bin_size, char *err, size_t errlen)
{
#define NEED(k) do { if ((size_t)(k) > n - pos) goto trunc; } while (0)
    size_t pos = 0;
    if (n < 16 || memcmp(p, MAGIC, 8) != 0) {
        ps_errf(err, errlen, "%s: not a pack index (bad magic)", path);
        return PS_ECORRUPT;
    }
    if (ps_crc32c(0, p, n - 4) != get32(p + n - 4)) {
        ps_errf(err, errlen, "%s: index checksum mismatch", path);
        return PS_ECORRUPT;
    }
    n -= 4;
    pos = 8;
    uint32_t nv = get32(p + pos);
    pos += 4;
    for (uint32_t v = 0; v < nv; v++) {
        NEED(4);
        uint32_t nl = get32(p + pos);
        pos += 4;
        if (nl == 0 || nl > 4000) goto bad;
        NEED(nl + 12);
        char name[4001];
        memcpy(name, p + pos, nl);
        name[nl] = 0;
        if (strlen(name) != nl) goto bad;
        pos += nl;
        uint32_t line = get32(p + pos), frames = get32(p + pos + 4);
        int32_t label = (int32_t)get32(p + pos + 8);
        pos += 12;
        if (frames < 1 || frames > 10000000 || label < 0 || label > 1000000) goto bad;
        NEED((size_t)frames * 16);
        size_t nfr = l->n_fr + frames;
        ps_pack_frame_t *fr = realloc(l->fr, nfr * sizeof *fr);
        if (!fr) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
        l->fr = fr;
        for (uint32_t f = 0; f < frames; f++, pos += 16) {
            ps_pack_frame_t *x = &fr[l->n_fr + f];
            x->off = get64(p + pos);
            x->len = get32(p + pos + 8);
            x->crc = get32(p + pos + 12);
            if (x->off > bin_size || x->len > bin_size - x->off) {
                ps_errf(err, errlen, "%s: video '%s' frame %u lies outside the shard data", path, name, f + 1);
                return PS_ECORRUPT;
            }
        }
        if (ps_video_list_add(l, name, (int)frames, label, (int)line) < 0) {
            ps_errf(err, errlen, "out of memory");
            return PS_ENOMEM;
        }
        l->v[l->n - 1].shard = shard;
        l->v[l->n - 1].first = l->n_fr;
        l->n_fr = nfr;
    }
    if (pos != n) goto bad;
    return 0;
trunc:
    ps_errf(err, errlen, "%s: index truncated", path);
    return PS_ECORRUPT;
bad:
    ps_errf(err, errlen, "%s: index entry inconsistent at byte %zu", path, pos);
    return PS_ECORRUPT;
#undef NEED
}

int ps_video_list_load_packed(const char *dir, const ps_video_list_opts_t *oin, ps_video_list_t **out,
                              char *err, size_t errlen)
{
    *out = NULL;
    int min_frames = oin && oin->min_frames > 1 ? oin->min_frames : 1;
    int skip_bad = oin ? oin->skip_bad : 0;
    ps_video_list_t *l = ps_video_list_alloc(dir, "", "img_%05d.jpg");
    if (!l) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    l->packed = 1;
    int rc = 0;
    for (int s = 0;; s++) {
        char ipath[4096], bpath[4096];
        snprintf(ipath, sizeof ipath, "%s/shard-%05d.idx", dir, s);
        snprintf(bpath, sizeof bpath, "%s/shard-%05d.bin", dir, s);
        struct stat st;
        if (stat(ipath, &st) != 0) {
            if (s == 0) {
                ps_errf(err, errlen, "%s: no pack index %s: %s", dir, ipath, strerror(errno));
                rc = PS_ENOTFOUND;
            }
            break;
        }
        int *fds = realloc(l->shard_fd, sizeof(int) * (size_t)(s + 1));
        if (fds) l->shard_fd = fds;
        char **paths = fds ? realloc(l->shard_path, sizeof(char *) * (size_t)(s + 1)) : NULL;
        if (paths) l->shard_path = paths;
        if (!fds || !paths) { ps_errf(err, errlen, "out of memory"); rc = PS_ENOMEM; break; }
        l->shard_fd[s] = open(bpath, O_RDONLY | O_CLOEXEC);
        l->shard_path[s] = strdup(bpath);
        l->n_shards = s + 1;
        struct stat bst;
        if (l->shard_fd[s] < 0 || fstat(l->shard_fd[s], &bst) != 0) {
            ps_errf(err, errlen, "%s: %s", bpath, strerror(errno));
            rc = PS_EIO;
            break;
        }
        uint8_t *b;
        size_t n;
        rc = ps_read_file(ipath, &b, &n, err, errlen);
        if (rc < 0) break;
        rc = read_index(l, s, ipath, b, n, (uint64_t)bst.st_size, err, errlen);
        free(b);
        if (rc < 0) break;
    }
    /* Short videos: same rule as the list reader (an error, or counted
     * drops in skip mode). */
    for (size_t i = 0; rc == 0 && !skip_bad && i < l->n; i++)
        if (l->v[i].frames < min_frames) {
            ps_errf(err, errlen, "%s: video '%s' (list line %d) is too short: %d frames, at least %d needed",
                     dir, l->v[i].name, l->v[i].line, l->v[i].frames, min_frames);
            rc = PS_ERANGE;
        }
    if (rc == 0 && skip_bad) {
        size_t k = 0;
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].frames < min_frames) {
                ps_warn("%s: skipped short video '%s'", dir, l->v[i].name);
                free(l->v[i].name);
                l->skipped++;
                continue;
            }
            l->v[k++] = l->v[i];
        }
        l->n = k;
    }
    if (rc == 0 && l->n == 0) {
        ps_errf(err, errlen, "%s: no videos in the pack", dir);
        rc = PS_EINVAL;
    }
    if (rc < 0) {
        ps_video_list_free(&l);
        return rc;
    }
    l->num_classes = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].label + 1 > l->num_classes) l->num_classes = l->v[i].label + 1;
    *out = l;
    return 0;
}
