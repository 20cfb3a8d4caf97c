/* The generated detection dataset (worker/det/gen_det.c): the JSON loads
 * with the strict COCO loader, boxes lie inside the images, the JPEGs decode
 * at the declared size, objects are visible where the boxes say, and the
 * output is a pure function of the seed.  With masks: every annotation's
 * segmentation (a polygon, or an RLE for the ring's hole) gives back its
 * box as the tight extent and its area as the pixel count, the mask's
 * pixels carry one colour in the JPEG and the pixels around it another,
 * and the images are those of the same seed without masks. */
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE and size_t */
#include <jpeglib.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
#include <math.h>
#include "tests/lib/tap.h"
#include "worker/det/coco_json.h"
#include "worker/det/gen_det.h"

struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
};
static void jerr_exit(j_common_ptr c) { longjmp(((struct jerr *)c->err)->jb, 1); }
static void jerr_silent(j_common_ptr c, int lvl) { (void)c, (void)lvl; }

/* Independent decoder (plain libjpeg), so a corrupt file cannot pass. */
static uint8_t *decode(const char *path, int *w, int *h)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct jpeg_decompress_struct ci;
    struct jerr je;
    uint8_t *volatile rgb = NULL;
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jerr_exit;
    je.pub.emit_message = jerr_silent;
    if (setjmp(je.jb)) {
        jpeg_destroy_decompress(&ci);
        fclose(f);
        free(rgb);
        return NULL;
    }
    jpeg_create_decompress(&ci);
    jpeg_stdio_src(&ci, f);
    jpeg_read_header(&ci, TRUE);
    ci.out_color_space = JCS_RGB;
    jpeg_start_decompress(&ci);
    *w = (int)ci.output_width, *h = (int)ci.output_height;
    rgb = malloc((size_t)*w * *h * 3);
    while (ci.output_scanline < ci.output_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)ci.output_scanline * *w * 3);
        jpeg_read_scanlines(&ci, &row, 1);
    }
    int warned = je.pub.num_warnings;
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    fclose(f);
    if (warned) {
        free(rgb);
        return NULL;
    }
    return rgb;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void check_split(const char *dir, const char *split, int nimg, int size, int ncats,
                        int *cls_seen)
{
    char p[4200], err[512] = "";
    ps_coco_t c;
    snprintf(p, sizeof p, "%s/annotations/instances_%s.json", dir, split);
    is_int(ps_coco_load(&c, p, 0, NULL, err, sizeof err), 0, "%s JSON loads strictly (%s)", split,
           err);
    is_int(c.nimages, nimg, "%s: image count", split);
    is_int(c.ncats, ncats, "%s: categories", split);
    int inside = 1, per_img_ok = 1, area_ok = 1, decoded = 0, contrast = 0, nobj = 0;
    for (int i = 0; i < c.nimages; i++) {
        const ps_coco_image_t *im = &c.images[i];
        int n = 0;
        for (int a = 0; a < c.nanns; a++) {
            const ps_coco_ann_t *x = &c.anns[a];
            if (x->image_id != im->id) continue;
            n++;
            const double *b = x->bbox;
            if (b[0] < 0 || b[1] < 0 || b[0] + b[2] > im->width || b[1] + b[3] > im->height ||
                b[2] < 4 || b[3] < 4)
                inside = 0;
            if (!(x->area > 0.25 * b[2] * b[3] && x->area <= b[2] * b[3])) area_ok = 0;
            cls_seen[x->category_id - 1]++;
        }
        if (n < 2 || n > 6) per_img_ok = 0;
        snprintf(p, sizeof p, "%s/%s/%s", dir, split, im->file_name);
        int w = 0, h = 0;
        uint8_t *rgb = decode(p, &w, &h);
        if (rgb && w == im->width && h == im->height && w == size) decoded++;
        /* every object's centre row differs from the pixels just outside its box */
        for (int a = 0; rgb && a < c.nanns; a++) {
            const ps_coco_ann_t *x = &c.anns[a];
            if (x->image_id != im->id) continue;
            int cy = (int)(x->bbox[1] + x->bbox[3] / 2), cx = (int)(x->bbox[0] + x->bbox[2] / 2);
            int ox = (int)x->bbox[0] - 2 >= 0 ? (int)x->bbox[0] - 2 : (int)(x->bbox[0] + x->bbox[2]) + 1;
            if (ox >= w) continue;
            const uint8_t *pin = rgb + ((size_t)cy * w + cx) * 3, *pout = rgb + ((size_t)cy * w + ox) * 3;
            int d = abs(pin[0] - pout[0]) + abs(pin[1] - pout[1]) + abs(pin[2] - pout[2]);
            nobj++;
            contrast += d > 60;
        }
        free(rgb);
    }
    ok(inside, "%s: every box inside its image, >= 4 px", split);
    ok(per_img_ok, "%s: 2..6 objects per image", split);
    ok(area_ok, "%s: area is the shape's pixel count (0.25..1 of the box)", split);
    is_int(decoded, nimg, "%s: every JPEG decodes at the declared size", split);
    ok(nobj > 0 && contrast >= nobj * 8 / 10, "%s: objects stand out from the background "
       "(%d of %d)", split, contrast, nobj);
    ps_coco_free(&c);
}

/* grow (n > 0) or shrink (n < 0) a size x size mask by |n| 4-neighbour steps */
static void morph(uint8_t *m, int size, int n)
{
    uint8_t *t = malloc((size_t)size * size);
    for (int it = 0; it < abs(n); it++) {
        memcpy(t, m, (size_t)size * size);
        for (int y = 0; y < size; y++)
            for (int x = 0; x < size; x++) {
                int nb[4] = {x > 0 ? t[y * size + x - 1] : 0, x < size - 1 ? t[y * size + x + 1] : 0,
                             y > 0 ? t[(y - 1) * size + x] : 0, y < size - 1 ? t[(y + 1) * size + x] : 0};
                int any = nb[0] | nb[1] | nb[2] | nb[3], all = nb[0] & nb[1] & nb[2] & nb[3];
                m[y * size + x] = n > 0 ? t[y * size + x] | any : t[y * size + x] & all;
            }
    }
    free(t);
}

/* The masks of a --masks dataset against its boxes, areas and pixels */
static void check_masks(const char *dir, const char *split, int size, int *ring_rle)
{
    char p[4200], err[512] = "";
    ps_coco_t c;
    snprintf(p, sizeof p, "%s/annotations/instances_%s.json", dir, split);
    is_int(ps_coco_load(&c, p, 0, NULL, err, sizeof err), 0, "%s with masks loads strictly (%s)",
           split, err);
    int kinds_ok = 1, exact = 1, uniform = 0, contrast = 0, nobj = 0;
    uint8_t *m = malloc((size_t)size * size), *in = malloc((size_t)size * size),
            *out = malloc((size_t)size * size);
    for (int a = 0; a < c.nanns; a++) {
        const ps_coco_ann_t *x = &c.anns[a];
        int ring = x->category_id == 6;
        kinds_ok &= x->segm.kind == (ring ? PS_COCO_SEGM_RLE_STR : PS_COCO_SEGM_POLY);
        *ring_rle += ring && x->segm.kind == PS_COCO_SEGM_RLE_STR;
        ps_rle_t r;
        double bb[4];
        if (ps_coco_segm_rle(&x->segm, size, size, &r)) {
            exact = 0;
            continue;
        }
        ps_rle_to_bbox(&r, bb);
        exact &= (double)ps_rle_area(&r) == x->area && !memcmp(bb, x->bbox, sizeof bb);
        ps_rle_decode(&r, m, size);
        ps_rle_free(&r);
        /* colour: the mask's interior (2 px in) against a band 2 px outside it */
        int im = ps_coco_find_image(&c, x->image_id), w, h;
        snprintf(p, sizeof p, "%s/%s/%s", dir, split, c.images[im].file_name);
        uint8_t *rgb = decode(p, &w, &h);
        if (!rgb) continue;
        memcpy(in, m, (size_t)size * size);
        morph(in, size, -2);
        memcpy(out, m, (size_t)size * size);
        morph(out, size, 2);
        morph(m, size, 1);
        double mean[3] = {0, 0, 0};
        int nin = 0, near = 0, nout = 0, far = 0;
        for (int i = 0; i < size * size; i++)
            if (in[i]) {
                for (int k = 0; k < 3; k++) mean[k] += rgb[3 * i + k];
                nin++;
            }
        for (int k = 0; k < 3; k++) mean[k] /= nin ? nin : 1;
        for (int i = 0; i < size * size; i++) {
            double d = fabs(rgb[3 * i] - mean[0]) + fabs(rgb[3 * i + 1] - mean[1]) +
                       fabs(rgb[3 * i + 2] - mean[2]);
            if (in[i]) near += d < 60, (void)0;
            if (out[i] && !m[i]) nout++, far += d > 60;
        }
        free(rgb);
        nobj++;
        uniform += nin > 0 && near >= nin * 9 / 10;
        contrast += nout > 0 && far >= nout * 7 / 10;
    }
    free(m), free(in), free(out);
    ok(kinds_ok, "%s: polygons for the shapes, a compressed RLE for the ring", split);
    ok(exact && c.nanns > 0, "%s: every mask gives back its annotation's box and area exactly", split);
    ok(nobj == c.nanns && uniform >= nobj * 9 / 10, "%s: one colour inside the masks (%d of %d)",
       split, uniform, nobj);
    ok(contrast >= nobj * 8 / 10, "%s: another colour around them (%d of %d)", split, contrast,
       nobj);
    ps_coco_free(&c);
}

static int rm_rf(const char *dir)
{
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

int main(void)
{
    char d1[] = "/tmp/test_det_gen_XXXXXX", d2[] = "/tmp/test_det_gen_XXXXXX";
    char err[512] = "";
    if (!mkdtemp(d1) || !mkdtemp(d2)) {
        printf("Bail out! mkdtemp\n");
        return 1;
    }
    ps_det_gen_opts_t o;
    ps_det_gen_defaults(&o, 12);
    o.n_val = 4;
    is_int(ps_det_gen(d1, 12, 128, 42, &o, err, sizeof err), 0, "generate 12+4 images (%s)", err);
    int seen[PS_DET_GEN_NCLASSES] = {0};
    check_split(d1, "train", 12, 128, PS_DET_GEN_DEFAULT_CLASSES, seen);
    check_split(d1, "val", 4, 128, PS_DET_GEN_DEFAULT_CLASSES, seen);
    int all = 1;
    for (int k = 0; k < PS_DET_GEN_DEFAULT_CLASSES; k++) all &= seen[k] > 0;
    ok(all && !seen[5], "the %d default classes occur, no ring (%d %d %d %d %d; %d)",
       PS_DET_GEN_DEFAULT_CLASSES, seen[0], seen[1], seen[2], seen[3], seen[4], seen[5]);

    /* determinism: same seed, same bytes; another seed, other bytes */
    is_int(ps_det_gen(d2, 12, 128, 42, &o, err, sizeof err), 0, "generate again");
    const char *files[] = {"annotations/instances_train.json", "annotations/instances_val.json",
                           "train/000007.jpg", "val/000002.jpg"};
    int same = 1;
    for (int i = 0; i < 4; i++) {
        char p1[4300], p2[4300];
        size_t l1, l2;
        snprintf(p1, sizeof p1, "%s/%s", d1, files[i]);
        snprintf(p2, sizeof p2, "%s/%s", d2, files[i]);
        char *a = slurp(p1, &l1), *b = slurp(p2, &l2);
        same &= a && b && l1 == l2 && !memcmp(a, b, l1);
        free(a), free(b);
    }
    ok(same, "same seed: identical JSON and JPEG bytes");
    is_int(ps_det_gen(d2, 12, 128, 43, &o, err, sizeof err), 0, "generate with another seed");
    {
        char p1[4300], p2[4300];
        size_t l1, l2;
        snprintf(p1, sizeof p1, "%s/%s", d1, files[0]);
        snprintf(p2, sizeof p2, "%s/%s", d2, files[0]);
        char *a = slurp(p1, &l1), *b = slurp(p2, &l2);
        ok(a && b && (l1 != l2 || memcmp(a, b, l1)), "another seed: other annotations");
        free(a), free(b);
    }

    /* bad arguments */
    ps_log_level = -1;
    is_int(ps_det_gen(d2, 0, 128, 1, NULL, err, sizeof err), PS_EINVAL, "0 images rejected");
    is_int(ps_det_gen(d2, 4, 16, 1, NULL, err, sizeof err), PS_EINVAL, "size 16 rejected");
    ok(strstr(err, "size 16") != NULL, "error names the size (%s)", err);
    ps_det_gen_opts_t bad = o;
    bad.max_objects = 1;
    is_int(ps_det_gen(d2, 4, 64, 1, &bad, err, sizeof err), PS_EINVAL, "max_objects < min rejected");
    is_int(ps_det_gen("/proc/no/such/dir", 2, 64, 1, NULL, err, sizeof err), PS_EIO,
           "unwritable directory: PS_EIO");
    ok(strstr(err, "/proc/no/such/dir") != NULL, "error names the path (%s)", err);
    ps_log_level = PS_LOG_INFO;
    /* masks: 6 classes (ring included); the same images as without masks */
    o.classes = 6;
    o.masks = 1;
    err[0] = 0;
    is_int(ps_det_gen(d1, 12, 96, 7, &o, err, sizeof err), 0, "generate with masks %s", err);
    o.masks = 0;
    is_int(ps_det_gen(d2, 12, 96, 7, &o, err, sizeof err), 0, "the same without masks");
    int rings = 0;
    check_masks(d1, "train", 96, &rings);
    check_masks(d1, "val", 96, &rings);
    ok(rings > 0, "rings occur (%d), as compressed RLEs", rings);
    same = 1;
    for (int i = 1; i <= 12; i++) {
        char p1[4300], p2[4300];
        size_t l1, l2;
        snprintf(p1, sizeof p1, "%s/train/%06d.jpg", d1, i);
        snprintf(p2, sizeof p2, "%s/train/%06d.jpg", d2, i);
        char *a = slurp(p1, &l1), *b = slurp(p2, &l2);
        same &= a && b && l1 == l2 && !memcmp(a, b, l1);
        free(a), free(b);
    }
    ok(same, "--masks leaves the images as they are");
    rm_rf(d1);
    rm_rf(d2);
    return tap_done();
}
