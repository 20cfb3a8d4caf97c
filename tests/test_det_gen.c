/* The generated detection dataset (worker/det/gen_det.c): the JSON loads
 * with the strict COCO loader, boxes lie inside the images, the JPEGs decode
 * at the declared size, objects are visible where the boxes say, and the
 * output is a pure function of the seed. */
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE and size_t */
#include <jpeglib.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"
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

static void check_split(const char *dir, const char *split, int nimg, int size, int *cls_seen)
{
    char p[4200], err[512];
    ps_coco_t c;
    snprintf(p, sizeof p, "%s/annotations/instances_%s.json", dir, split);
    is_int(ps_coco_load(&c, p, 0, NULL, err, sizeof err), 0, "%s JSON loads strictly (%s)", split,
           err);
    is_int(c.nimages, nimg, "%s: image count", split);
    is_int(c.ncats, PS_DET_GEN_NCLASSES, "%s: categories", split);
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

static int rm_rf(const char *dir)
{
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

int main(void)
{
    char d1[] = "/tmp/test_det_gen_XXXXXX", d2[] = "/tmp/test_det_gen_XXXXXX";
    char err[512];
    if (!mkdtemp(d1) || !mkdtemp(d2)) {
        printf("Bail out! mkdtemp\n");
        return 1;
    }
    ps_det_gen_opts_t o;
    ps_det_gen_defaults(&o, 12);
    o.n_val = 4;
    is_int(ps_det_gen(d1, 12, 128, 42, &o, err, sizeof err), 0, "generate 12+4 images (%s)", err);
    int seen[PS_DET_GEN_NCLASSES] = {0};
    check_split(d1, "train", 12, 128, seen);
    check_split(d1, "val", 4, 128, seen);
    int all = 1;
    for (int k = 0; k < PS_DET_GEN_NCLASSES; k++) all &= seen[k] > 0;
    ok(all, "all %d classes occur (%d %d %d %d %d)", PS_DET_GEN_NCLASSES, seen[0], seen[1],
       seen[2], seen[3], seen[4]);

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
    rm_rf(d1);
    rm_rf(d2);
    return tap_done();
}
