/* COCO RLE masks (worker/det/coco_rle.h) against pycocotools' mask API
 * (tests/golden/gen_coco_masks.py -> coco_masks.txt: polygon
 * rasterisation and merge, encode, uncompressed RLE, merge, IoU with crowd
 * flags, areas, boxes, compressed strings), hand cases with closed-form
 * answers, and malformed compressed strings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "tests/lib/tap.h"
#include "worker/det/coco_rle.h"

/* whitespace tokens of one line */
typedef struct {
    char *tok[20000];
    int n, i;
} toks_t;

static void split(toks_t *t, char *line)
{
    t->n = t->i = 0;
    for (char *s = strtok(line, " \t\n"); s && t->n < 20000; s = strtok(NULL, " \t\n"))
        t->tok[t->n++] = s;
}
static const char *next(toks_t *t) { return t->i < t->n ? t->tok[t->i++] : ""; }
static long nexti(toks_t *t) { return strtol(next(t), NULL, 10); }
static double nextd(toks_t *t) { return strtod(next(t), NULL); }

static int from_str(ps_rle_t *r, const char *s, int h, int w)
{
    char err[256];
    return ps_rle_from_string(r, s, strlen(s), h, w, err, sizeof err);
}

/* r's string, area and box equal the golden's next 6 tokens */
static int same_rle(const ps_rle_t *r, toks_t *t, int with_area_box)
{
    char *s = ps_rle_to_string(r);
    int same = s && !strcmp(s, next(t));
    free(s);
    if (!with_area_box) return same;
    same &= (long)ps_rle_area(r) == nexti(t);
    double bb[4];
    ps_rle_to_bbox(r, bb);
    for (int k = 0; k < 4; k++) same &= bb[k] == nextd(t);
    return same;
}

typedef struct {
    int n, bad;
    char first[160];
} tally_t;

static void tally(tally_t *c, int good, const char *what, int line)
{
    c->n++;
    if (!good && !c->bad++) snprintf(c->first, sizeof c->first, "%s at golden line %d", what, line);
}

static void golden(const char *path)
{
    FILE *f = fopen(path, "r");
    ok(f != NULL, "golden %s", path);
    if (!f) return;
    static char line[1 << 20];
    static toks_t t;
    tally_t poly = {0}, enc = {0}, dec = {0}, ucr = {0}, mrg = {0}, iou = {0}, str = {0};
    int ln = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        if (line[0] == '#') continue;
        split(&t, line);
        const char *kind = next(&t);
        if (!strcmp(kind, "poly")) {
            int h = (int)nexti(&t), w = (int)nexti(&t), n = (int)nexti(&t), good = 1;
            ps_rle_t rs[8], m;
            for (int i = 0; i < n; i++) {
                int k = (int)nexti(&t);
                double xy[64];
                for (int j = 0; j < 2 * k; j++) xy[j] = nextd(&t);
                good &= ps_rle_from_polygon(&rs[i], xy, k, h, w) == 0;
            }
            good &= ps_rle_merge(&m, rs, n, 0) == 0;
            tally(&poly, good && same_rle(&m, &t, 1), "polygon", ln);
            for (int i = 0; i < n; i++) ps_rle_free(&rs[i]);
            ps_rle_free(&m);
        } else if (!strcmp(kind, "encode") || !strcmp(kind, "encode_box")) {
            int h = (int)nexti(&t), w = (int)nexti(&t);
            uint8_t *mask = malloc((size_t)h * w), *back = malloc((size_t)h * w);
            if (!strcmp(kind, "encode")) {
                const char *bits = next(&t);
                for (int i = 0; i < h * w; i++) mask[i] = bits[i] == '1';
            } else {
                int y0 = (int)nexti(&t), y1 = (int)nexti(&t), x0 = (int)nexti(&t), x1 = (int)nexti(&t);
                memset(mask, 0, (size_t)h * w);
                for (int y = y0; y < y1; y++) memset(mask + (size_t)y * w + x0, 1, (size_t)(x1 - x0));
                mask[w - 1] = 1;
            }
            ps_rle_t r, r2;
            int good = ps_rle_encode(&r, mask, w, h, w) == 0;
            const char *want = t.tok[t.i];
            tally(&enc, good && same_rle(&r, &t, 1), "encode", ln);
            /* the golden string decodes to the same runs and back to the mask */
            good = from_str(&r2, want, h, w) == 0 && r2.m == r.m &&
                   !memcmp(r2.cnts, r.cnts, sizeof(uint32_t) * (size_t)r.m);
            memset(back, 7, (size_t)h * w);
            if (good) ps_rle_decode(&r2, back, w);
            tally(&dec, good && !memcmp(back, mask, (size_t)h * w), "decode", ln);
            ps_rle_free(&r), ps_rle_free(&r2);
            free(mask), free(back);
        } else if (!strcmp(kind, "ucrle")) {
            int h = (int)nexti(&t), w = (int)nexti(&t), m = (int)nexti(&t);
            uint32_t c[1024];
            for (int j = 0; j < m; j++) c[j] = (uint32_t)nexti(&t);
            ps_rle_t r;
            char err[256];
            int good = ps_rle_set(&r, h, w, c, m) == 0 && ps_rle_check(&r, err, sizeof err) == 0;
            tally(&ucr, good && same_rle(&r, &t, 0), "uncompressed RLE", ln);
            ps_rle_free(&r);
        } else if (!strcmp(kind, "merge")) {
            int h = (int)nexti(&t), w = (int)nexti(&t), inter = (int)nexti(&t), n = (int)nexti(&t);
            ps_rle_t rs[8], m;
            int good = 1;
            for (int i = 0; i < n; i++) good &= from_str(&rs[i], next(&t), h, w) == 0;
            good &= ps_rle_merge(&m, rs, n, inter) == 0;
            tally(&mrg, good && same_rle(&m, &t, 0), inter ? "intersection" : "union", ln);
            for (int i = 0; i < n; i++) ps_rle_free(&rs[i]);
            ps_rle_free(&m);
        } else if (!strcmp(kind, "iou")) {
            int h = (int)nexti(&t), w = (int)nexti(&t), nd = (int)nexti(&t), ng = (int)nexti(&t);
            ps_rle_t d[8], g[8];
            int crowd[8], good = 1;
            for (int i = 0; i < nd; i++) good &= from_str(&d[i], next(&t), h, w) == 0;
            for (int i = 0; i < ng; i++) good &= from_str(&g[i], next(&t), h, w) == 0;
            for (int i = 0; i < ng; i++) crowd[i] = (int)nexti(&t);
            for (int i = 0; i < nd; i++)
                for (int j = 0; j < ng; j++) good &= ps_rle_iou(&d[i], &g[j], crowd[j]) == nextd(&t);
            tally(&iou, good, "iou", ln);
            for (int i = 0; i < nd; i++) ps_rle_free(&d[i]);
            for (int i = 0; i < ng; i++) ps_rle_free(&g[i]);
        } else {
            tally(&str, 0, "unknown case kind", ln);
        }
    }
    fclose(f);
    ok(poly.n > 200 && !poly.bad, "%d polygon sets: merged RLE string, area, box equal pycocotools "
       "(%d differ; %s)", poly.n, poly.bad, poly.first);
    ok(enc.n > 50 && !enc.bad, "%d masks: encode, area, box equal pycocotools (%d differ; %s)",
       enc.n, enc.bad, enc.first);
    ok(dec.n == enc.n && !dec.bad, "%d golden strings decode to the same runs and mask (%s)", dec.n,
       dec.first);
    ok(ucr.n >= 30 && !ucr.bad, "%d uncompressed RLEs: strings equal pycocotools (%s)", ucr.n,
       ucr.first);
    ok(mrg.n >= 60 && !mrg.bad, "%d unions / intersections equal pycocotools (%s)", mrg.n, mrg.first);
    ok(iou.n >= 50 && !iou.bad, "%d IoU matrices (crowd and not) equal pycocotools exactly (%s)",
       iou.n, iou.first);
    ok(!str.bad, "no unknown lines (%s)", str.first);
}

/* Closed-form cases, independent of the golden file */
static void hand_cases(void)
{
    /* the first pixel: polygon on its edges */
    double px[8] = {0, 0, 1, 0, 1, 1, 0, 1};
    ps_rle_t r, a, b, m;
    is_int(ps_rle_from_polygon(&r, px, 4, 3, 4), 0, "unit square polygon");
    ok(r.m == 3 && r.cnts[0] == 0 && r.cnts[1] == 1 && r.cnts[2] == 11 && ps_rle_area(&r) == 1,
       "covers exactly pixel (0,0) of 3x4: runs [0 1 11]");
    ps_rle_free(&r);
    /* a 2x3 block at x 1..2, y 1..3 of a 5x4 (h x w) image, column-major runs */
    double blk[8] = {1, 1, 3, 1, 3, 4, 1, 4};
    is_int(ps_rle_from_polygon(&r, blk, 4, 5, 4), 0, "block polygon");
    uint32_t want[] = {6, 3, 2, 3, 6};
    ok(r.m == 5 && !memcmp(r.cnts, want, sizeof want), "block: runs 6 3 2 3 6");
    double bb[4];
    ps_rle_to_bbox(&r, bb);
    ok(bb[0] == 1 && bb[1] == 1 && bb[2] == 2 && bb[3] == 3, "block: box [1,1,2,3]");
    /* decode is row-major with a stride */
    uint8_t mk[5 * 6];
    memset(mk, 9, sizeof mk);
    ps_rle_decode(&r, mk, 6);
    int rows_ok = 1;
    for (int y = 0; y < 5; y++)
        for (int x = 0; x < 4; x++) rows_ok &= mk[y * 6 + x] == (x >= 1 && x <= 2 && y >= 1 && y <= 3);
    ok(rows_ok && mk[5] == 9, "decode: row-major at stride 6, padding untouched");
    ps_rle_t e;
    ps_rle_encode(&e, mk, 6, 5, 4);
    ok(e.m == r.m && !memcmp(e.cnts, r.cnts, sizeof want), "encode(decode(r)) == r");
    ps_rle_free(&e);
    /* IoU: the block (6 px) against its left column (3 px): 3/6; crowd: |a&b|/|dt| */
    double col[8] = {1, 1, 2, 1, 2, 4, 1, 4};
    ps_rle_from_polygon(&a, col, 4, 5, 4);
    is_close(ps_rle_iou(&r, &a, 0), 0.5, 0, 0, "IoU block vs column = 3/6");
    is_close(ps_rle_iou(&a, &r, 1), 1.0, 0, 0, "crowd GT containing the detection: IoU 1");
    is_close(ps_rle_iou(&r, &a, 1), 0.5, 0, 0, "crowd GT, detection twice its size: 1/2");
    ps_rle_merge(&m, (ps_rle_t[]){r, a}, 2, 1);
    ok(ps_rle_area(&m) == 3, "intersection: the column");
    ps_rle_free(&m);
    double far[8] = {3, 0, 4, 0, 4, 1, 3, 1};
    ps_rle_from_polygon(&b, far, 4, 5, 4);
    is_close(ps_rle_iou(&b, &a, 0), 0, 0, 0, "disjoint masks: IoU 0");
    ps_rle_t other;
    ps_rle_from_polygon(&other, far, 4, 6, 4);
    is_close(ps_rle_iou(&b, &other, 0), -1, 0, 0, "different sizes: -1 (pycocotools)");
    ps_rle_merge(&m, (ps_rle_t[]){b, a, r}, 3, 0);
    ok(ps_rle_area(&m) == 7, "union of three: 6 + 1 = 7 px");
    ps_rle_free(&m);
    is_int(ps_rle_merge(&m, (ps_rle_t[]){b, other}, 2, 0), PS_EINVAL, "merge of sizes that differ");
    ps_rle_free(&other), ps_rle_free(&a), ps_rle_free(&b), ps_rle_free(&r);
    /* a polygon wholly outside the image is empty */
    double out[6] = {-10, -10, -5, -10, -5, -3};
    ps_rle_from_polygon(&r, out, 3, 8, 8);
    ok(r.m == 1 && r.cnts[0] == 64 && ps_rle_area(&r) == 0, "polygon outside the image: empty");
    ps_rle_to_bbox(&r, bb);
    ok(bb[0] == 0 && bb[2] == 0, "empty mask: box zeros");
    ps_rle_free(&r);
    double nan_xy[6] = {0, 0, NAN, 1, 1, 1};
    is_int(ps_rle_from_polygon(&r, nan_xy, 3, 4, 4), PS_EINVAL, "non-finite vertex rejected");
}

static void bad_strings(void)
{
    ps_rle_t r;
    char err[256];
    ps_log_level = -1;
    /* 4x4: counts 3 13 -> "3=" ('3' = 3; 13 = 0b01101 -> '=') */
    is_int(ps_rle_from_string(&r, "3=", 2, 4, 4, err, sizeof err), 0, "\"3=\" = [3 13] (%s)", err);
    ok(r.m == 2 && r.cnts[0] == 3 && r.cnts[1] == 13, "decoded runs 3, 13");
    ps_rle_free(&r);
    int rc = ps_rle_from_string(&r, "3>", 2, 4, 4, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "sum to 17"), "counts summing to 17, not 16 (%s)", err);
    rc = ps_rle_from_string(&r, "3 =", 3, 4, 4, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "bad character 0x20 at offset 1"), "a space (%s)", err);
    rc = ps_rle_from_string(&r, "3=z", 3, 4, 4, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "bad character 0x7a"), "'z' above 'o' (%s)", err);
    rc = ps_rle_from_string(&r, "3P", 2, 4, 4, err, sizeof err); /* 'P' = 32: more follows */
    ok(rc == PS_ECORRUPT && strstr(err, "cut off"), "a count cut off at the end (%s)", err);
    rc = ps_rle_from_string(&r, "3PPPPPPP0", 9, 4, 4, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "longer than 7"), "an overlong count (%s)", err);
    rc = ps_rle_from_string(&r, "@", 1, 4, 4, err, sizeof err); /* 16: sign bit, -16 */
    ok(rc == PS_ECORRUPT && strstr(err, "is -"), "a negative count (%s)", err);
    rc = ps_rle_from_string(&r, "", 0, 4, 4, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "sum to 0"), "an empty string for 16 pixels (%s)", err);
    ps_log_level = PS_LOG_INFO;
}

int main(void)
{
    const char *top = getenv("top_srcdir");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/coco_masks.txt", top ? top : ".");
    golden(path);
    hand_cases();
    bad_strings();
    return tap_done();
}
