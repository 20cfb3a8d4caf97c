/* Helpers of the video-file tests: generated videos written with the
 * product's writer (MPEG-4 part 2), the nearest generated frame of a
 * decoded picture (an independent check of which frame a decoder gave),
 * a temporary directory, small files. */
#ifndef PS_VIDEO_TESTUTIL_H
#define PS_VIDEO_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/data/video_file.h"
#include "worker/data/video_gen.h"

/* The generator's frames of video v, cropped to w x h (top left). */
typedef struct vt_src { const ps_video_gen_opts_t *g; int v, w, h; } vt_src_t;

static inline int vt_frame(int t, uint8_t *rgb, void *user)
{
    const vt_src_t *s = user;
    int S = s->g->size;
    uint8_t *full = malloc((size_t)S * S * 3);
    if (!full) return -1;
    int rc = ps_video_gen_frame(s->g, s->v, t, full, NULL);
    for (int y = 0; y < s->h; y++) memcpy(rgb + (size_t)y * s->w * 3, full + (size_t)y * S * 3, (size_t)s->w * 3);
    free(full);
    return rc;
}

/* Writes generated video v (w x h <= the generator's size) to path. */
static inline int vt_write_b(const char *path, const ps_video_gen_opts_t *g, int v, int w, int h, int n,
                             int fps, int gop, int bframes)
{
    vt_src_t s = { g, v, w, h };
    ps_vfile_enc_t enc = { fps, gop, 3, bframes };
    char err[1024];
    int rc = ps_vfile_write(path, w, h, n, &enc, vt_frame, &s, err, sizeof err);
    if (rc < 0) printf("# %s\n", err);
    return rc;
}

static inline int vt_write(const char *path, const ps_video_gen_opts_t *g, int v, int w, int h, int n,
                           int fps, int gop)
{
    return vt_write_b(path, g, v, w, h, n, fps, gop, 0);
}

/* Mean |difference| of the luma (0..255) of a w x h picture and generated
 * frame t: luma, because 4:2:0 video keeps colour at half resolution and
 * the generator's stripes are finer than that. */
static inline double vt_diff(const ps_video_gen_opts_t *g, int v, int t, const uint8_t *rgb, int w, int h)
{
    vt_src_t s = { g, v, w, h };
    uint8_t *ref = malloc((size_t)w * h * 3);
    double d = 0;
    vt_frame(t, ref, &s);
    for (size_t i = 0; i < (size_t)w * h; i++) {
        const uint8_t *a = rgb + 3 * i, *b = ref + 3 * i;
        d += fabs(0.299 * (a[0] - b[0]) + 0.587 * (a[1] - b[1]) + 0.114 * (a[2] - b[2]));
    }
    free(ref);
    return d / ((double)w * h);
}

/* The generated frame (0..n-1) nearest the picture; *best its distance,
 * *second the next nearest one's. */
static inline int vt_nearest(const ps_video_gen_opts_t *g, int v, int n, const uint8_t *rgb, int w, int h,
                             double *best, double *second)
{
    int arg = -1;
    *best = *second = 1e9;
    for (int t = 0; t < n; t++) {
        double d = vt_diff(g, v, t, rgb, w, h);
        if (d < *best) { *second = *best; *best = d; arg = t; }
        else if (d < *second) *second = d;
    }
    return arg;
}

static inline void vt_writef(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(1); }
    fputs(text, f);
    fclose(f);
}

/* Copies the first `keep` bytes of src to dst (a truncated file). */
static inline int vt_truncate_copy(const char *src, const char *dst, double keep)
{
    FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
    if (!a || !b) { if (a) fclose(a); if (b) fclose(b); return -1; }
    fseek(a, 0, SEEK_END);
    long n = (long)(ftell(a) * keep);
    fseek(a, 0, SEEK_SET);
    for (long i = 0; i < n; i++) fputc(fgetc(a), b);
    fclose(a);
    fclose(b);
    return 0;
}

#endif
