/* Shapes-on-clutter detection dataset (contract in gen_det.h). */
#include "worker/det/gen_det.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE and size_t */
#include <jpeglib.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_util.h"
#include "worker/det/coco_json.h"

/* Shapes in the unit box: is pixel centre (u, v) in [0,1]^2 inside? */
static int in_circle(double du, double dv, double v) { (void)v; return du * du + dv * dv <= 0.25; }
static int in_square(double du, double dv, double v) { (void)du, (void)dv, (void)v; return 1; }
static int in_triangle(double du, double dv, double v) { (void)dv; return du <= v * 0.5; } /* apex up */
static int in_diamond(double du, double dv, double v) { (void)v; return du + dv <= 0.5; }
static int in_cross(double du, double dv, double v)
{
    (void)v;
    return du <= 1.0 / 6 || dv <= 1.0 / 6;
}
static int in_ring(double du, double dv, double v)
{
    (void)v;
    double r2 = du * du + dv * dv;
    return r2 <= 0.25 && r2 >= 0.0625;
}

/* The classes, in category order; du, dv are |u - 0.5|, |v - 0.5|. */
static const struct shape {
    const char *name;
    int (*inside)(double du, double dv, double v);
} SHAPES[PS_DET_GEN_NCLASSES] = {
    {"circle", in_circle}, {"square", in_square}, {"triangle", in_triangle},
    {"diamond", in_diamond}, {"cross", in_cross}, {"ring", in_ring},
};

/* ps_fail (ps_util.h) with this file's argument order */
#define fail(err, n, code, ...) ps_fail((code), (err), (n), __VA_ARGS__)

/* splitmix64: tiny, seedable, identical on every platform */
static uint64_t rnd_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rnd_u(uint64_t *s) { return (rnd_next(s) >> 11) * (1.0 / 9007199254740992.0); }
static int rnd_int(uint64_t *s, int lo, int hi) { return lo + (int)(rnd_u(s) * (hi - lo + 1)); }

void ps_det_gen_defaults(ps_det_gen_opts_t *o, int n_images)
{
    o->n_val = n_images / 5 > 1 ? n_images / 5 : 1;
    o->min_objects = 2;
    o->max_objects = 6;
    o->min_size = 0.12f;
    o->max_size = 0.40f;
    o->quality = 90;
    o->classes = PS_DET_GEN_DEFAULT_CLASSES;
    o->masks = 0;
}

typedef struct {
    int x, y, w, h;  /* placement box */
} place_t;

static void put_px(uint8_t *img, int size, int x, int y, const int c[3])
{
    if (x < 0 || y < 0 || x >= size || y >= size) return;
    uint8_t *p = img + ((size_t)y * size + x) * 3;
    for (int k = 0; k < 3; k++) p[k] = (uint8_t)c[k];
}

static void background(uint8_t *img, int size, uint64_t *rs, int min_obj)
{
    int c0[3], c1[3];
    for (int k = 0; k < 3; k++) c0[k] = rnd_int(rs, 40, 215), c1[k] = rnd_int(rs, 40, 215);
    double gx = rnd_u(rs) - 0.5, gy = rnd_u(rs) - 0.5;
    for (int y = 0; y < size; y++)
        for (int x = 0; x < size; x++) {
            double t = 0.5 + gx * (2.0 * x / size - 1) + gy * (2.0 * y / size - 1);
            t = t < 0 ? 0 : t > 1 ? 1 : t;
            uint8_t *p = img + ((size_t)y * size + x) * 3;
            for (int k = 0; k < 3; k++) p[k] = (uint8_t)(c0[k] + t * (c1[k] - c0[k]));
        }
    /* clutter: thin lines and small dots, all smaller than any object */
    int nlines = rnd_int(rs, 8, 20), ndots = rnd_int(rs, 20, 60);
    for (int i = 0; i < nlines; i++) {
        int c[3] = {rnd_int(rs, 0, 255), rnd_int(rs, 0, 255), rnd_int(rs, 0, 255)};
        double x = rnd_u(rs) * size, y = rnd_u(rs) * size, a = rnd_u(rs) * 6.283185307179586;
        int len = rnd_int(rs, min_obj / 2, size / 2 > min_obj ? size / 2 : min_obj);
        for (int s = 0; s < len; s++) put_px(img, size, (int)(x + s * cos(a)), (int)(y + s * sin(a)), c);
    }
    for (int i = 0; i < ndots; i++) {
        int c[3] = {rnd_int(rs, 0, 255), rnd_int(rs, 0, 255), rnd_int(rs, 0, 255)};
        int cx = rnd_int(rs, 0, size - 1), cy = rnd_int(rs, 0, size - 1);
        int r = rnd_int(rs, 1, min_obj / 6 > 1 ? min_obj / 6 : 1);
        for (int dy = -r; dy <= r; dy++)
            for (int dx = -r; dx <= r; dx++)
                if (dx * dx + dy * dy <= r * r) put_px(img, size, cx + dx, cy + dy, c);
    }
    for (size_t i = 0; i < (size_t)size * size * 3; i++) {
        int v = img[i] + rnd_int(rs, -10, 10);
        img[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
}

/* Draws one object; fills the annotation's bbox (tight pixel extent) and
 * area, and sets its pixels to 1 in mask (size x size, 0 around it). */
static void draw(uint8_t *img, uint8_t *mask, int size, const place_t *pl, int cls, uint64_t *rs,
                 ps_coco_ann_t *a)
{
    /* colour far from the local background mean, so the object is visible */
    double mean[3] = {0, 0, 0};
    long n = 0;
    for (int y = pl->y; y < pl->y + pl->h; y++)
        for (int x = pl->x; x < pl->x + pl->w; x++, n++)
            for (int k = 0; k < 3; k++) mean[k] += img[((size_t)y * size + x) * 3 + k];
    int c[3];
    for (int tries = 0; tries < 64; tries++) {
        for (int k = 0; k < 3; k++) c[k] = rnd_int(rs, 0, 255);
        double d = 0;
        for (int k = 0; k < 3; k++) d += fabs(c[k] - mean[k] / n);
        if (d >= 180) break;
    }
    int x0 = size, y0 = size, x1 = -1, y1 = -1;
    long area = 0;
    for (int y = pl->y; y < pl->y + pl->h; y++)
        for (int x = pl->x; x < pl->x + pl->w; x++) {
            double u = (x - pl->x + 0.5) / pl->w, v = (y - pl->y + 0.5) / pl->h;
            if (!SHAPES[cls].inside(fabs(u - 0.5), fabs(v - 0.5), v)) continue;
            put_px(img, size, x, y, c);
            mask[(size_t)y * size + x] = 1;
            area++;
            if (x < x0) x0 = x;
            if (x > x1) x1 = x;
            if (y < y0) y0 = y;
            if (y > y1) y1 = y;
        }
    a->bbox[0] = x0;
    a->bbox[1] = y0;
    a->bbox[2] = x1 - x0 + 1;
    a->bbox[3] = y1 - y0 + 1;
    a->area = (double)area;
    a->iscrowd = 0;
    a->category_id = cls + 1;
}

/* The row of mask (size wide) within [x, x + w): its one run of 1s as
 * [*l, *r), 0 when the row is empty, -1 when it has more than one run */
static int row_run(const uint8_t *row, int x, int w, int *l, int *r)
{
    int runs = 0;
    for (int i = x; i < x + w; i++)
        if (row[i] && (i == x || !row[i - 1])) {
            if (runs++) return -1;
            *l = i;
        } else if (!row[i] && i > x && row[i - 1]) {
            *r = i;
        }
    if (runs && row[x + w - 1]) *r = x + w;
    return runs;
}

/* Appends vertex (x, y), dropping a repeat and the middle of three on one line */
static void vertex(double *xy, int *k, double x, double y)
{
    if (*k >= 1 && xy[2 * *k - 2] == x && xy[2 * *k - 1] == y) return;
    if (*k >= 2) {
        const double *p = xy + 2 * *k - 4; /* the two before */
        if ((p[0] == p[2] && p[2] == x) || (p[1] == p[3] && p[3] == y)) --*k;
    }
    xy[2 * *k] = x, xy[2 * *k + 1] = y;
    ++*k;
}

/* The instance's segmentation: the outline along pixel edges when every
 * row of the placement box holds one run of the shape's pixels and those
 * rows are contiguous (down the right ends, up the left ends; COCO's
 * crossing rule then gives back exactly those pixels), otherwise the
 * compressed RLE of the mask */
static int instance_segm(const uint8_t *mask, int size, const place_t *pl, ps_coco_segm_t *s)
{
    int first = -1, last = -1, simple = 1;
    int *L = malloc(sizeof(int) * (size_t)pl->h), *R = malloc(sizeof(int) * (size_t)pl->h);
    if (!L || !R) {
        free(L), free(R);
        return PS_ENOMEM;
    }
    for (int j = 0; j < pl->h && simple; j++) {
        int runs = row_run(mask + (size_t)(pl->y + j) * size, pl->x, pl->w, &L[j], &R[j]);
        if (runs < 0 || (runs == 0 && first >= 0 && last < 0)) last = j - 1;
        if (runs < 0 || (runs > 0 && last >= 0)) simple = 0; /* two runs, or a gap of rows */
        if (runs > 0 && first < 0) first = j;
    }
    if (last < 0) last = pl->h - 1;
    memset(s, 0, sizeof *s);
    int rc = 0;
    if (simple && first >= 0) {
        int n = 0;
        s->xy = malloc(sizeof(double) * 8 * (size_t)(last - first + 1));
        s->poly_len = malloc(sizeof(int));
        if (!s->xy || !s->poly_len) rc = PS_ENOMEM;
        for (int j = first; !rc && j <= last; j++) {
            vertex(s->xy, &n, R[j], pl->y + j);
            vertex(s->xy, &n, R[j], pl->y + j + 1);
        }
        for (int j = last; !rc && j >= first; j--) {
            vertex(s->xy, &n, L[j], pl->y + j + 1);
            vertex(s->xy, &n, L[j], pl->y + j);
        }
        if (!rc) s->kind = PS_COCO_SEGM_POLY, s->npoly = 1, s->poly_len[0] = n;
    } else {
        rc = ps_rle_encode(&s->rle, mask, size, size, size);
        if (!rc) s->kind = PS_COCO_SEGM_RLE_STR;
    }
    free(L), free(R);
    if (rc) ps_coco_segm_free(s);
    return rc;
}

struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
};
static void jerr_exit(j_common_ptr cinfo)
{
    struct jerr *e = (struct jerr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->msg);
    longjmp(e->jb, 1);
}

static int write_jpeg(const char *path, const uint8_t *rgb, int size, int quality, char *err,
                      size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return fail(err, n, PS_EIO, "%s: cannot create: %s", path, strerror(errno));
    struct jpeg_compress_struct ci;
    struct jerr je;
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jerr_exit;
    if (setjmp(je.jb)) {
        jpeg_destroy_compress(&ci);
        fclose(f);
        return fail(err, n, PS_EIO, "%s: libjpeg: %s", path, je.msg);
    }
    jpeg_create_compress(&ci);
    jpeg_stdio_dest(&ci, f);
    ci.image_width = (JDIMENSION)size;
    ci.image_height = (JDIMENSION)size;
    ci.input_components = 3;
    ci.in_color_space = JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, quality, TRUE);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)ci.next_scanline * size * 3);
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    if (fclose(f) != 0) return fail(err, n, PS_EIO, "%s: write error: %s", path, strerror(errno));
    return 0;
}

/* mkdir -p: a fresh clone has no data/ yet for --out data/det */
static int make_dir(const char *p, char *err, size_t n)
{
    if (ps_mkdir_p(p) == 0) return 0;
    return fail(err, n, PS_EIO, "%s: cannot create directory: %s", p, strerror(errno));
}

static int overlaps(const place_t *a, const place_t *b)
{
    const int g = 2;
    return a->x < b->x + b->w + g && b->x < a->x + a->w + g && a->y < b->y + b->h + g &&
           b->y < a->y + a->h + g;
}

/* One split: n images into dir/split/, JSON into dir/annotations/. */
static int gen_split(const char *dir, const char *split, int n, int size, uint64_t *rs,
                     const ps_det_gen_opts_t *o, char *err, size_t errlen)
{
    char path[4096];
    ps_coco_t c;
    memset(&c, 0, sizeof c);
    int rc = PS_ENOMEM, maxo = o->max_objects;
    uint8_t *img = malloc((size_t)size * size * 3), *mask = calloc((size_t)size * size, 1);
    c.images = calloc((size_t)n + 1, sizeof *c.images);
    c.anns = calloc((size_t)n * maxo + 1, sizeof *c.anns);
    c.cats = calloc(PS_DET_GEN_NCLASSES, sizeof *c.cats);
    place_t *pl = malloc((size_t)maxo * sizeof *pl);
    if (!img || !mask || !c.images || !c.anns || !c.cats || !pl) {
        rc = fail(err, errlen, PS_ENOMEM, "gen-det: out of memory");
        goto out;
    }
    for (int k = 0; k < o->classes; k++) {
        c.cats[k].id = k + 1;
        c.cats[k].name = strdup(SHAPES[k].name);
        c.ncats++;
        if (!c.cats[k].name) {
            rc = fail(err, errlen, PS_ENOMEM, "gen-det: out of memory");
            goto out;
        }
    }
    snprintf(path, sizeof path, "%s/%s", dir, split);
    if ((rc = make_dir(path, err, errlen))) goto out;
    int smin = (int)(o->min_size * size), smax = (int)(o->max_size * size);
    if (smin < 6) smin = 6;
    if (smax < smin) smax = smin;
    for (int i = 0; i < n; i++) {
        background(img, size, rs, smin);
        int want = rnd_int(rs, o->min_objects, o->max_objects), np = 0;
        for (int tries = 0; np < want && tries < 200; tries++) {
            int cls = rnd_int(rs, 0, o->classes - 1);
            int w = rnd_int(rs, smin, smax), h = w;
            if (cls >= 2) h = (int)(w * (0.75 + 0.58 * rnd_u(rs))); /* aspect 0.75..1.33 */
            if (h < smin) h = smin;
            if (h > size - 1) h = size - 1;
            place_t p = {rnd_int(rs, 0, size - w), rnd_int(rs, 0, size - h), w, h};
            int clash = 0;
            for (int j = 0; j < np && !clash; j++) clash = overlaps(&p, &pl[j]);
            if (clash) continue;
            pl[np++] = p;
            ps_coco_ann_t *a = &c.anns[c.nanns];
            draw(img, mask, size, &p, cls, rs, a);
            a->id = c.nanns + 1;
            a->image_id = i + 1;
            c.nanns++;
            if (o->masks && (rc = instance_segm(mask, size, &p, &a->segm))) {
                fail(err, errlen, rc, "gen-det: out of memory");
                goto out;
            }
            for (int y = p.y; y < p.y + p.h; y++) memset(mask + (size_t)y * size + p.x, 0, (size_t)p.w);
        }
        ps_coco_image_t *im = &c.images[c.nimages++];
        im->id = i + 1;
        im->width = im->height = size;
        char name[32];
        snprintf(name, sizeof name, "%06d.jpg", i + 1);
        if (!(im->file_name = strdup(name))) {
            rc = fail(err, errlen, PS_ENOMEM, "gen-det: out of memory");
            goto out;
        }
        snprintf(path, sizeof path, "%s/%s/%s", dir, split, name);
        if ((rc = write_jpeg(path, img, size, o->quality, err, errlen))) goto out;
    }
    snprintf(path, sizeof path, "%s/annotations/instances_%s.json", dir, split);
    rc = ps_coco_save(&c, path, err, errlen);
out:
    free(img);
    free(mask);
    free(pl);
    ps_coco_free(&c);
    return rc;
}

int ps_det_gen(const char *out_dir, int n_images, int size, uint64_t seed,
               const ps_det_gen_opts_t *opts, char *err, size_t errlen)
{
    ps_det_gen_opts_t o;
    if (opts) o = *opts;
    else ps_det_gen_defaults(&o, n_images);
    if (!out_dir || !*out_dir)
        return fail(err, errlen, PS_EINVAL, "gen-det: empty output directory");
    if (n_images < 1 || o.n_val < 0 || n_images > 10000000 || o.n_val > 10000000)
        return fail(err, errlen, PS_EINVAL, "gen-det: image counts %d train / %d val out of range",
                    n_images, o.n_val);
    if (size < 32 || size > 4096)
        return fail(err, errlen, PS_EINVAL, "gen-det: size %d outside 32..4096", size);
    if (o.min_objects < 1 || o.max_objects < o.min_objects || o.max_objects > 100)
        return fail(err, errlen, PS_EINVAL, "gen-det: objects per image %d..%d invalid",
                    o.min_objects, o.max_objects);
    if (!(o.min_size > 0 && o.max_size >= o.min_size && o.max_size <= 0.9f))
        return fail(err, errlen, PS_EINVAL, "gen-det: object size %g..%g invalid (0 < min <= max <= 0.9)",
                    o.min_size, o.max_size);
    if (o.classes < 1 || o.classes > PS_DET_GEN_NCLASSES)
        return fail(err, errlen, PS_EINVAL, "gen-det: classes %d outside 1..%d", o.classes,
                    PS_DET_GEN_NCLASSES);
    if (o.quality < 1 || o.quality > 100)
        return fail(err, errlen, PS_EINVAL, "gen-det: JPEG quality %d outside 1..100", o.quality);
    char path[4096];
    int rc;
    if ((rc = make_dir(out_dir, err, errlen))) return rc;
    snprintf(path, sizeof path, "%s/annotations", out_dir);
    if ((rc = make_dir(path, err, errlen))) return rc;
    /* one stream per split, so the val set does not change with n_images */
    uint64_t rs_train = seed ^ 0x7472616E69ull, rs_val = seed ^ 0x76616Cull;
    if ((rc = gen_split(out_dir, "train", n_images, size, &rs_train, &o, err, errlen))) return rc;
    if (o.n_val > 0 && (rc = gen_split(out_dir, "val", o.n_val, size, &rs_val, &o, err, errlen)))
        return rc;
    ps_info("gen-det: %d train + %d val images of %dx%d in %s", n_images, o.n_val, size, size,
            out_dir);
    return 0;
}
