/* Lists of video files decoded on the fly (psworker --video-list): the
 * list reader with every video probed up front, and the source row that
 * decodes a sample's frames with keyframe seeks (video_file.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/video_file.h"
#include "worker/data/video_list.h"

int ps_video_file_path(const char *root, const char *name, char *buf, size_t n)
{
    int k = root && root[0] && name[0] != '/' ? snprintf(buf, n, "%s/%s", root, name)
                                              : snprintf(buf, n, "%s", name);
    return k < 0 || (size_t)k >= n ? PS_ERANGE : 0;
}

#define PROGRESS_S 10.0 /* progress line period while probing */


typedef struct want { int frame, slot; } want_t;

static int cmp_want(const void *a, const void *b)
{
    const want_t *x = a, *y = b;
    return x->frame != y->frame ? (x->frame > y->frame) - (x->frame < y->frame) : x->slot - y->slot;
}

typedef struct sink {
    const want_t *w;
    uint8_t **px;
    int *pw, *ph;
} sink_t;

static int keep_frame(int k, const uint8_t *rgb, int w, int h, void *user, char *err, size_t errlen)
{
    sink_t *s = user;
    int slot = s->w[k].slot;
    size_t n = (size_t)w * h * 3;
    if (!(s->px[slot] = malloc(n))) {
        ps_errf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    memcpy(s->px[slot], rgb, n);
    s->pw[slot] = w;
    s->ph[slot] = h;
    return 0;
}

/* The source row: one pass over the file for all of a sample's frames. */
static int file_frames(const ps_video_list_t *l, size_t i, const int *idx, int n, uint8_t **px, int *w,
                       int *h, ps_video_io_t *io, char *err, size_t errlen)
{
    /* demuxing and decoding are one pass here: the whole time counts as
     * decoding, no bytes are counted as read */
    if (io) io->frames += (uint64_t)n;
    const ps_video_entry_t *e = &l->v[i];
    char path[4096], m[1024];
    want_t *wt = malloc(sizeof *wt * (size_t)n);
    int *sorted = malloc(sizeof(int) * (size_t)n);
    int rc = 0;
    if (!wt || !sorted) {
        free(wt);
        free(sorted);
        ps_errf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    for (int k = 0; k < n; k++) wt[k] = (want_t){ idx[k], k };
    qsort(wt, (size_t)n, sizeof *wt, cmp_want);
    for (int k = 0; k < n; k++) sorted[k] = wt[k].frame;
    sink_t s = { wt, px, w, h };
    ps_vfile_opts_t vo = { l->short_side, l->fps, NULL };
    if (ps_video_file_path(l->root, e->name, path, sizeof path) < 0) {
        ps_errf(m, sizeof m, "path too long");
        rc = PS_ERANGE;
    } else {
        rc = ps_vfile_decode(path, e->vix, &vo, sorted, n, keep_frame, &s, m, sizeof m);
    }
    if (rc < 0) {
        for (int k = 0; k < n; k++) { free(px[k]); px[k] = NULL; }
        ps_errf(err, errlen, "%s:%d: video '%s': %s", l->source, e->line, e->name, m);
    }
    free(wt);
    free(sorted);
    return rc;
}

static void file_free_entry(ps_video_entry_t *e) { ps_vfile_index_free(&e->vix); }

const ps_video_source_t ps_video_source_file = { "video file", file_frames, file_free_entry };

int ps_video_list_load_videos(const char *list_path, const ps_video_list_opts_t *oin,
                              ps_video_list_t **out, char *err, size_t errlen)
{
    ps_video_list_opts_t o;
    if (oin) o = *oin; else ps_video_list_opts_default(&o);
    if (o.min_frames < 1) o.min_frames = 1;
    *out = NULL;
    if (o.short_side < 0 || o.short_side > 8192 || !(o.fps >= 0 && o.fps <= 1000)) {
        ps_errf(err, errlen, "video frames: short side %d (0..8192) or fps %g (0..1000) out of range",
                o.short_side, o.fps);
        return PS_EINVAL;
    }
    ps_video_list_t *l = ps_video_list_alloc(list_path, o.root, NULL);
    if (!l) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    l->src = &ps_video_source_file;
    l->short_side = o.short_side;
    l->fps = o.fps;
    int rc = ps_video_list_read(list_path, 0, o.skip_bad, l, NULL, NULL, err, errlen);
    char **why = rc == 0 ? calloc(l->n ? l->n : 1, sizeof *why) : NULL;
    int *code = rc == 0 ? calloc(l->n ? l->n : 1, sizeof *code) : NULL;
    if (rc == 0 && (!why || !code)) { ps_errf(err, errlen, "out of memory"); rc = PS_ENOMEM; }
    if (rc == 0) {
        long n = (long)l->n, cores = sysconf(_SC_NPROCESSORS_ONLN), done = 0;
        int nt = o.probe_threads > 0 ? o.probe_threads : cores > 0 ? (int)cores : 1;
        double t_log = ps_now_s();
        /* probes are independent file reads: in parallel, reported in list order below */
#pragma omp parallel for schedule(dynamic) num_threads(nt)
        for (long i = 0; i < n; i++) {
            ps_video_entry_t *e = &l->v[i];
            char path[4096], m[1024];
            int r = ps_video_file_path(l->root, e->name, path, sizeof path);
            if (r < 0) ps_errf(m, sizeof m, "path too long");
            else r = ps_vfile_probe(path, &e->vix, m, sizeof m);
            if (r == 0) {
                e->frames = ps_vfile_frames(e->vix, l->fps);
                if (e->frames < o.min_frames) {
                    ps_errf(m, sizeof m, "%s: too short: %d frames, at least %d needed", path, e->frames,
                             o.min_frames);
                    r = PS_ERANGE;
                }
            }
            if (r < 0) {
                code[i] = r;
                why[i] = strdup(m);
            }
#pragma omp critical(probe_progress)
            {
                /* a long list takes a while: say how far it is */
                if (++done < n && ps_now_s() - t_log >= PROGRESS_S) {
                    t_log = ps_now_s();
                    ps_info("%s: %ld of %ld videos probed", list_path, done, n);
                }
            }
        }
        size_t k = 0;
        for (size_t i = 0; i < l->n; i++) {
            ps_video_entry_t *e = &l->v[i];
            if (!code[i]) { l->v[k++] = *e; continue; }
            const char *msg = why[i] ? why[i] : "out of memory";
            if (rc == 0 && !o.skip_bad) {
                ps_errf(err, errlen, "%s:%d: video '%s': %s", list_path, e->line, e->name, msg);
                rc = code[i];
            } else if (o.skip_bad) {
                ps_warn("%s:%d: skipped: video '%s': %s", list_path, e->line, e->name, msg);
                l->skipped++;
            }
            free(e->name);
            ps_vfile_index_free(&e->vix);
            free(why[i]);
        }
        l->n = k;
    }
    free(why);
    free(code);
    if (rc == 0) rc = ps_video_list_finish(l, err, errlen);
    if (rc < 0) {
        ps_video_list_free(&l);
        return rc;
    }
    *out = l;
    return 0;
}
