/* Direction-of-motion videos whose label needs temporal order.
 *
 * Each video is a static cluttered background (textured rectangles and
 * discs) with a foreground layer of shapes from the same family, textured
 * the same way, moving rigidly in one of the class directions.  The
 * foreground layer is toroidal (drawn with wrap-around and shifted modulo
 * the frame size), so in any single frame the moving shapes sit at uniformly
 * random places and look like the clutter: one frame carries no information
 * about the direction, and a per-frame model averaged over segments (TSN)
 * stays at chance, while one that compares frames (TSM's shift) can read the
 * displacement.  The speed (a few pixels per frame) keeps the displacement
 * between TSN's segments far below the frame size, so the wrap-around never
 * aliases a direction into its opposite. */
#include "worker/data/video_gen.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ps_error.h"
#include "ps_util.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_video.h"
#include "worker/data/video_file.h"
#include "worker/data/video_list.h"

void ps_video_gen_opts_default(ps_video_gen_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->out = "data/direction";
    o->videos = 400;
    o->frames = 16;
    o->size = 64;
    o->seed = 1;
    o->classes = 4;
    o->val_fraction = 0.2;
    o->quality = 90;
    /* Measured (TSM-R18 width 16, 48 px, 640 videos, 300 steps of 8): this
     * density reaches val top-1 0.93 where clutter 1 / movers 1 had not
     * left chance yet; a single frame still says nothing. */
    o->clutter = 0.5;
    o->movers = 3;
}

/* up, down, left, right, then the diagonals; the names are the class
 * names of the video-file datasets (spaces as in Kinetics' labels) */
static const int DIRS[8][2] = { { 0, -1 }, { 0, 1 }, { -1, 0 }, { 1, 0 },
                                { -1, -1 }, { 1, -1 }, { -1, 1 }, { 1, 1 } };
static const char *const DIR_NAMES[8] = { "moving up", "moving down", "moving left", "moving right",
                                          "moving up left", "moving up right", "moving down left",
                                          "moving down right" };

typedef struct shape {
    int kind;              /* 0 rectangle, 1 disc */
    int x, y, w, h;        /* bounding box (x, y may wrap) */
    uint8_t c0[3], c1[3];  /* texture colours */
    int period, orient;    /* stripe period; 0 vertical 1 horizontal 2 diagonal 3 checker */
} shape_t;

static void rand_shape(ps_vrng_t *r, int S, shape_t *s)
{
    s->kind = (int)ps_vrng_below(r, 2);
    int lo = S / 10 > 3 ? S / 10 : 3, hi = S / 4 > lo ? S / 4 : lo + 1;
    s->w = lo + (int)ps_vrng_below(r, (uint64_t)(hi - lo + 1));
    s->h = s->kind ? s->w : lo + (int)ps_vrng_below(r, (uint64_t)(hi - lo + 1));
    s->x = (int)ps_vrng_below(r, (uint64_t)S);
    s->y = (int)ps_vrng_below(r, (uint64_t)S);
    for (int c = 0; c < 3; c++) {
        s->c0[c] = (uint8_t)ps_vrng_below(r, 256);
        s->c1[c] = (uint8_t)ps_vrng_below(r, 256);
    }
    s->period = 2 + (int)ps_vrng_below(r, 4);
    s->orient = (int)ps_vrng_below(r, 4);
}

/* Draws s into rgb (and mask when given) with wrap-around. */
static void draw(const shape_t *s, int S, uint8_t *rgb, uint8_t *mask)
{
    for (int dy = 0; dy < s->h; dy++)
        for (int dx = 0; dx < s->w; dx++) {
            if (s->kind == 1) {
                double rx = dx + 0.5 - s->w / 2.0, ry = dy + 0.5 - s->h / 2.0;
                if (rx * rx + ry * ry > (s->w / 2.0) * (s->w / 2.0)) continue;
            }
            int p = s->period, on;
            switch (s->orient) {
            case 0: on = (dx / p) & 1; break;
            case 1: on = (dy / p) & 1; break;
            case 2: on = ((dx + dy) / p) & 1; break;
            default: on = ((dx / p) + (dy / p)) & 1; break;
            }
            int x = (s->x + dx) % S, y = (s->y + dy) % S;
            uint8_t *px = rgb + ((size_t)y * S + x) * 3;
            memcpy(px, on ? s->c1 : s->c0, 3);
            if (mask) mask[(size_t)y * S + x] = 1;
        }
}

int ps_video_gen_frame(const ps_video_gen_opts_t *o, int v, int t, uint8_t *rgb, int *label)
{
    int S = o->size;
    size_t np = (size_t)S * S;
    uint8_t *bg = malloc(np * 3), *fg = malloc(np * 3), *mask = calloc(np, 1);
    if (!bg || !fg || !mask) { free(bg); free(fg); free(mask); return PS_ENOMEM; }
    ps_vrng_t r = ps_vrng_sample(o->seed, 0x67656E76ull /* "genv" */, (uint64_t)v);
    int lab = v % o->classes;
    /* default S/16 px per frame: at the ResNet stem's stride 4 a shape moves
     * about one layer1 cell per frame, what a 3x3 conv after the shift sees */
    double speed = o->speed > 0 ? o->speed : (S / 16.0 < 1 ? 1 : S / 16.0);
    /* +-25% per video so speed alone is no cue and the model sees a range. */
    speed *= 0.75 + 0.5 * (double)(ps_vrng_next(&r) >> 11) * 0x1.0p-53;
    uint8_t base[3];
    for (int c = 0; c < 3; c++) base[c] = (uint8_t)ps_vrng_below(&r, 256);
    for (size_t i = 0; i < np; i++) memcpy(bg + i * 3, base, 3);
    int n_bg = (int)lround(o->clutter * (6 + S * S / 256)), n_fg = (int)lround(o->movers * (4 + S * S / 512));
    if (n_fg < 1) n_fg = 1;
    shape_t sh;
    for (int i = 0; i < n_bg; i++) { rand_shape(&r, S, &sh); draw(&sh, S, bg, NULL); }
    for (int i = 0; i < n_fg; i++) { rand_shape(&r, S, &sh); draw(&sh, S, fg, mask); }
    int ox = (int)ps_vrng_below(&r, (uint64_t)S), oy = (int)ps_vrng_below(&r, (uint64_t)S);
    long d = lround(speed * t);
    long sx = ox + DIRS[lab][0] * d, sy = oy + DIRS[lab][1] * d;
    for (int y = 0; y < S; y++)
        for (int x = 0; x < S; x++) {
            /* the layer moves by (sx, sy): pixel (x, y) shows layer point (x - sx, y - sy) */
            int lx = (int)(((x - sx) % S + S) % S), ly = (int)(((y - sy) % S + S) % S);
            size_t li = (size_t)ly * S + lx, pi = (size_t)y * S + x;
            memcpy(rgb + pi * 3, mask[li] ? fg + li * 3 : bg + pi * 3, 3);
        }
    free(bg);
    free(fg);
    free(mask);
    if (label) *label = lab;
    return 0;
}

static int check_opts(const ps_video_gen_opts_t *o, char *err, size_t errlen)
{
    if (o->videos < 1 || o->frames < 1 || o->size < 8 || o->size > 4096 ||
        (o->classes != 2 && o->classes != 4 && o->classes != 8) || o->quality < 1 || o->quality > 100 ||
        !(o->val_fraction >= 0 && o->val_fraction < 1) || o->frames > 100000 ||
        !(o->clutter >= 0 && o->clutter <= 100) || !(o->movers > 0 && o->movers <= 100)) {
        ps_errf(err, errlen, "bad options: need videos >= 1, frames 1..100000, size 8..4096, "
                 "classes 2|4|8, quality 1..100, 0 <= val fraction < 1, clutter 0..100, movers (0, 100]");
        return PS_EINVAL;
    }
    if (ps_mkdir_p(o->out) < 0) {
        ps_errf(err, errlen, "%s: %s", o->out, strerror(errno));
        return PS_EIO;
    }
    return 0;
}

typedef struct gen_src { const ps_video_gen_opts_t *o; int v; } gen_src_t;

static int gen_src(int t, uint8_t *rgb, void *user)
{
    const gen_src_t *g = user;
    return ps_video_gen_frame(g->o, g->v, t, rgb, NULL);
}

int ps_video_gen_files(const ps_video_gen_opts_t *o, const char *container, const ps_vfile_enc_t *enc,
                       char *err, size_t errlen)
{
    int rc = check_opts(o, err, errlen);
    if (rc < 0) return rc;
    if (o->size & 1 || !container || !*container || strchr(container, '/')) {
        ps_errf(err, errlen, "video files need an even --size (got %d) and a container name (mp4, avi, mkv, mov)",
                o->size);
        return PS_EINVAL;
    }
    int secs = (o->frames + enc->fps - 1) / enc->fps, n_val = (int)lround(o->videos * o->val_fraction);
    char first_err[1024] = "";
#pragma omp parallel for schedule(dynamic)
    for (int v = 0; v < o->videos; v++) {
        char path[4200], m[1024];
        snprintf(path, sizeof path, "%s/vid_%06d_000000_%06d.%s", o->out, v, secs, container);
        gen_src_t g = { o, v };
        int vrc = ps_vfile_write(path, o->size, o->size, o->frames, enc, gen_src, &g, m, sizeof m);
        if (vrc < 0) {
#pragma omp critical
            {
                if (rc == 0) { rc = vrc; ps_errf(first_err, sizeof first_err, "%s", m); }
            }
        }
    }
    if (rc < 0) {
        ps_errf(err, errlen, "%s", first_err);
        return rc;
    }
    size_t cap = (size_t)o->videos * 80 + 256, k = 0;
    char *csv = malloc(cap), *names = malloc(512), path[4200];
    if (!csv || !names) { free(csv), free(names); ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    k += (size_t)snprintf(csv, cap, "label,youtube_id,time_start,time_end,split\n");
    for (int v = 0; v < o->videos; v++)
        k += (size_t)snprintf(csv + k, cap - k, "%s,vid_%06d,0,%d,%s\n", DIR_NAMES[v % o->classes], v, secs,
                              v >= o->videos - n_val ? "val" : "train");
    size_t kn = 0;
    for (int c = 0; c < o->classes; c++) kn += (size_t)snprintf(names + kn, 512 - kn, "%s\n", DIR_NAMES[c]);
    snprintf(path, sizeof path, "%s/labels.csv", o->out);
    rc = ps_write_file_atomic1(path, csv, k, "gen-video", err, errlen);
    snprintf(path, sizeof path, "%s/classes.txt", o->out);
    if (rc == 0) rc = ps_write_file_atomic1(path, names, kn, "gen-video", err, errlen);
    free(csv);
    free(names);
    return rc;
}

static int write_bytes(const char *path, const uint8_t *b, size_t n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
        ps_errf(err, errlen, "%s: %s", path, strerror(errno));
        if (f) fclose(f);
        return PS_EIO;
    }
    return 0;
}

int ps_video_gen(const ps_video_gen_opts_t *o, char *err, size_t errlen)
{
    int rc = check_opts(o, err, errlen);
    if (rc < 0) return rc;
    char first_err[1024] = "";
#pragma omp parallel for schedule(dynamic)
    for (int v = 0; v < o->videos; v++) {
        int vrc = 0;
        char m[1024] = "", dir[4096];
        snprintf(dir, sizeof dir, "%s/vid_%06d", o->out, v);
        uint8_t *rgb = malloc((size_t)o->size * o->size * 3);
        if (!rgb) vrc = PS_ENOMEM;
        if (vrc == 0 && mkdir(dir, 0755) < 0 && errno != EEXIST) {
            ps_errf(m, sizeof m, "%s: %s", dir, strerror(errno));
            vrc = PS_EIO;
        }
        for (int t = 0; t < o->frames && vrc == 0; t++) {
            uint8_t *jpg;
            size_t n;
            char path[4200];
            vrc = ps_video_gen_frame(o, v, t, rgb, NULL);
            if (vrc == 0) vrc = ps_jpeg_encode(rgb, o->size, o->size, o->quality, &jpg, &n, m, sizeof m);
            if (vrc < 0) break;
            snprintf(path, sizeof path, "%s/img_%05d.jpg", dir, t + 1);
            vrc = write_bytes(path, jpg, n, m, sizeof m);
            free(jpg);
        }
        free(rgb);
        if (vrc < 0) {
#pragma omp critical
            {
                if (rc == 0) { rc = vrc; ps_errf(first_err, sizeof first_err, "%s", m[0] ? m : ps_strerror(vrc)); }
            }
        }
    }
    if (rc < 0) {
        ps_errf(err, errlen, "%s", first_err);
        return rc;
    }
    int n_val = (int)lround(o->videos * o->val_fraction);
    int n_train = o->videos - n_val;
    for (int which = 0; which < 2; which++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", o->out, which ? "val.txt" : "train.txt");
        FILE *f = fopen(path, "w");
        if (!f) { ps_errf(err, errlen, "%s: %s", path, strerror(errno)); return PS_EIO; }
        for (int v = which ? n_train : 0; v < (which ? o->videos : n_train); v++)
            fprintf(f, "vid_%06d %d %d\n", v, o->frames, v % o->classes);
        if (fclose(f) != 0) { ps_errf(err, errlen, "%s: %s", path, strerror(errno)); return PS_EIO; }
    }
    return 0;
}
