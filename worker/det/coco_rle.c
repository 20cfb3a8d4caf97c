/* COCO RLE masks (contracts and conventions in coco_rle.h). */
#include "worker/det/coco_rle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_util.h"

/* ps_fail (ps_util.h) with this file's argument order */
#define fail(err, n, code, ...) ps_fail((code), (err), (n), __VA_ARGS__)

void ps_rle_free(ps_rle_t *r)
{
    if (!r) return;
    free(r->cnts);
    memset(r, 0, sizeof *r);
}

static int pixels_ok(int h, int w)
{
    return h >= 0 && w >= 0 && (uint64_t)h * (uint64_t)w <= PS_RLE_MAX_PIXELS;
}

int ps_rle_set(ps_rle_t *r, int h, int w, const uint32_t *cnts, int m)
{
    memset(r, 0, sizeof *r);
    if (!pixels_ok(h, w) || m < 0) return PS_EINVAL;
    if (m) {
        r->cnts = malloc(sizeof(uint32_t) * (size_t)m);
        if (!r->cnts) return PS_ENOMEM;
        memcpy(r->cnts, cnts, sizeof(uint32_t) * (size_t)m);
    }
    r->h = h, r->w = w, r->m = m;
    return 0;
}

int ps_rle_check(const ps_rle_t *r, char *err, size_t errlen)
{
    uint64_t sum = 0;
    for (int j = 0; j < r->m; j++) sum += r->cnts[j];
    if (sum != (uint64_t)r->h * (uint64_t)r->w)
        return fail(err, errlen, PS_ECORRUPT, "RLE counts sum to %llu, not %d*%d = %llu",
                    (unsigned long long)sum, r->h, r->w,
                    (unsigned long long)r->h * (unsigned long long)r->w);
    return 0;
}

/* Runs being built: appended one value at a time, a run of the same value
 * extended (so the result is canonical). */
typedef struct {
    uint32_t *c;
    int m, v;          /* runs so far; value of the open run */
} runs_t;

static void runs_add(runs_t *o, int v, uint32_t n)
{
    if (!n) return;
    if (o->m == 0) {
        if (v) o->c[o->m++] = 0; /* the first run is of 0s */
        o->c[o->m++] = n;
        o->v = v;
    } else if (v == o->v) {
        o->c[o->m - 1] += n;
    } else {
        o->c[o->m++] = n;
        o->v = v;
    }
}

/* runs_t over h*w pixels needs at most h*w + 1 entries (and one for an empty image) */
static int runs_new(runs_t *o, uint64_t pixels)
{
    o->m = o->v = 0;
    o->c = malloc(sizeof(uint32_t) * (size_t)(pixels + 2));
    return o->c ? 0 : PS_ENOMEM;
}

/* Moves o's runs into r (an empty image keeps one run of 0 pixels, as encode gives). */
static int runs_finish(runs_t *o, ps_rle_t *r, int h, int w)
{
    if (o->m == 0) o->c[o->m++] = 0;
    uint32_t *c = realloc(o->c, sizeof(uint32_t) * (size_t)o->m);
    r->cnts = c ? c : o->c;
    r->h = h, r->w = w, r->m = o->m;
    return 0;
}

int ps_rle_encode(ps_rle_t *r, const uint8_t *mask, int stride, int h, int w)
{
    memset(r, 0, sizeof *r);
    if (!pixels_ok(h, w) || stride < w) return PS_EINVAL;
    runs_t o;
    if (runs_new(&o, (uint64_t)h * w)) return PS_ENOMEM;
    for (int x = 0; x < w; x++)
        for (int y = 0; y < h; y++) runs_add(&o, mask[(size_t)y * stride + x] != 0, 1);
    return runs_finish(&o, r, h, w);
}

void ps_rle_decode(const ps_rle_t *r, uint8_t *mask, int stride)
{
    uint64_t left = (uint64_t)r->h * r->w;
    int x = 0, y = 0;
    for (int j = 0; j < r->m; j++) {
        uint8_t v = (uint8_t)(j & 1);
        for (uint32_t k = 0; k < r->cnts[j] && left; k++, left--) {
            mask[(size_t)y * stride + x] = v;
            if (++y == r->h) y = 0, x++;
        }
    }
}

/* ---- polygons ----------------------------------------------------------------
 * The vertices go onto a grid 5 times finer than the pixels; each edge is
 * walked one grid step at a time along its longer axis (the other
 * coordinate rounded half up), from the end with the smaller coordinate on
 * that axis.  Wherever the walk steps across the vertical line through a
 * pixel column's centre, the pixel rows from the crossing down toggle
 * inside/outside: those toggles, as positions x*h + y, sorted, are the
 * runs. */
enum { POLY_SCALE = 5 };

/* Appends the grid points of the edge (xs, ys) -> (xe, ye) to u, v. */
static void walk_edge(int xs, int ys, int xe, int ye, int *u, int *v, size_t *m)
{
    int dx = abs(xe - xs), dy = abs(ye - ys);
    int along_x = dx >= dy;
    int rev = along_x ? xs > xe : ys > ye;
    if (rev) { /* walk from the other end, emitting points in the edge's own order */
        int t = xs; xs = xe; xe = t;
        t = ys; ys = ye; ye = t;
    }
    int len = along_x ? dx : dy;
    double slope = along_x ? (len ? (double)(ye - ys) / dx : 0) : (double)(xe - xs) / dy;
    for (int d = 0; d <= len; d++) {
        int t = rev ? len - d : d;
        if (along_x) {
            u[*m] = xs + t;
            v[*m] = (int)(ys + slope * t + .5);
        } else {
            v[*m] = ys + t;
            u[*m] = (int)(xs + slope * t + .5);
        }
        (*m)++;
    }
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

int ps_rle_from_polygon(ps_rle_t *r, const double *xy, int k, int h, int w)
{
    memset(r, 0, sizeof *r);
    if (k < 1 || !pixels_ok(h, w)) return PS_EINVAL;
    for (int j = 0; j < 2 * k; j++)
        if (!isfinite(xy[j]) || fabs(xy[j]) > 1e6) return PS_EINVAL;
    int *gx = malloc(sizeof(int) * ((size_t)k + 1)), *gy = malloc(sizeof(int) * ((size_t)k + 1));
    if (!gx || !gy) {
        free(gx), free(gy);
        return PS_ENOMEM;
    }
    for (int j = 0; j < k; j++) {
        gx[j] = (int)(POLY_SCALE * xy[2 * j] + .5); /* truncation toward 0, as pycocotools */
        gy[j] = (int)(POLY_SCALE * xy[2 * j + 1] + .5);
    }
    gx[k] = gx[0], gy[k] = gy[0];
    size_t npts = 0;
    for (int j = 0; j < k; j++) {
        int dx = abs(gx[j] - gx[j + 1]), dy = abs(gy[j] - gy[j + 1]);
        npts += (size_t)(dx > dy ? dx : dy) + 1;
    }
    if (npts > PS_RLE_MAX_POLY_POINTS) { /* a boundary no image has: refuse, not 100 GB */
        free(gx), free(gy);
        return PS_EINVAL;
    }
    int *u = malloc(sizeof(int) * npts), *v = malloc(sizeof(int) * npts);
    uint32_t *pos = malloc(sizeof(uint32_t) * (npts + 1));
    int rc = PS_ENOMEM;
    if (!u || !v || !pos) goto out;
    size_t m = 0;
    for (int j = 0; j < k; j++) walk_edge(gx[j], gy[j], gx[j + 1], gy[j + 1], u, v, &m);
    /* toggles where the walk crosses a column centre (x + .5 on the pixel grid) */
    size_t nt = 0;
    for (size_t j = 1; j < m; j++) {
        if (u[j] == u[j - 1]) continue;
        double xd = (double)(u[j] < u[j - 1] ? u[j] : u[j] - 1);
        xd = (xd + .5) / POLY_SCALE - .5;
        if (floor(xd) != xd || xd < 0 || xd > w - 1) continue;
        double yd = (double)(v[j] < v[j - 1] ? v[j] : v[j - 1]);
        yd = (yd + .5) / POLY_SCALE - .5;
        yd = yd < 0 ? 0 : yd > h ? h : yd;
        yd = ceil(yd);
        pos[nt++] = (uint32_t)((uint64_t)xd * (uint64_t)h + (uint64_t)yd);
    }
    pos[nt++] = (uint32_t)((uint64_t)h * w);
    qsort(pos, nt, sizeof *pos, cmp_u32);
    /* runs between toggles; two toggles at one place cancel */
    runs_t o;
    if (runs_new(&o, nt)) goto out;
    uint32_t prev = 0;
    int val = 0;
    for (size_t j = 0; j < nt; j++) {
        runs_add(&o, val, pos[j] - prev);
        prev = pos[j];
        val = !val;
    }
    rc = runs_finish(&o, r, h, w);
out:
    free(gx), free(gy), free(u), free(v), free(pos);
    return rc;
}

/* ---- merge, area, box, IoU ------------------------------------------------- */

/* A cursor over an RLE's runs: the value and what is left of the current run. */
typedef struct {
    const ps_rle_t *r;
    int j;             /* current run */
    uint32_t left;     /* pixels left in it */
} cursor_t;

/* Moves to the next non-empty run; 0 at the end */
static int cur_fill(cursor_t *c)
{
    while (c->left == 0) {
        if (++c->j >= c->r->m) return 0;
        c->left = c->r->cnts[c->j];
    }
    return 1;
}

static void cur_init(cursor_t *c, const ps_rle_t *r)
{
    c->r = r;
    c->j = -1;
    c->left = 0;
    cur_fill(c);
}

/* Walks a and b together: calls step(value_a, value_b, n, ctx) for each
 * stretch of n pixels where neither changes. */
static void co_walk(const ps_rle_t *a, const ps_rle_t *b,
                    void (*step)(int va, int vb, uint32_t n, void *ctx), void *ctx)
{
    cursor_t ca, cb;
    cur_init(&ca, a);
    cur_init(&cb, b);
    while (ca.left && cb.left) {
        uint32_t n = ca.left < cb.left ? ca.left : cb.left;
        step(ca.j & 1, cb.j & 1, n, ctx);
        ca.left -= n, cb.left -= n;
        cur_fill(&ca), cur_fill(&cb);
    }
}

typedef struct {
    runs_t o;
    int intersect;
} merge_ctx_t;

static void merge_step(int va, int vb, uint32_t n, void *p)
{
    merge_ctx_t *c = p;
    runs_add(&c->o, c->intersect ? va && vb : va || vb, n);
}

int ps_rle_merge(ps_rle_t *out, const ps_rle_t *rs, int n, int intersect)
{
    memset(out, 0, sizeof *out);
    if (n < 1) return PS_EINVAL;
    int h = rs[0].h, w = rs[0].w;
    for (int i = 1; i < n; i++)
        if (rs[i].h != h || rs[i].w != w) return PS_EINVAL;
    if (n == 1) return ps_rle_set(out, h, w, rs[0].cnts, rs[0].m);
    ps_rle_t acc = rs[0];  /* borrowed until the first merge */
    for (int i = 1; i < n; i++) {
        merge_ctx_t c = {.intersect = intersect};
        if (runs_new(&c.o, (uint64_t)acc.m + rs[i].m)) {
            if (i > 1) ps_rle_free(&acc);
            return PS_ENOMEM;
        }
        co_walk(&acc, &rs[i], merge_step, &c);
        if (i > 1) ps_rle_free(&acc);
        runs_finish(&c.o, &acc, h, w);
    }
    *out = acc;
    return 0;
}

uint64_t ps_rle_area(const ps_rle_t *r)
{
    uint64_t a = 0;
    for (int j = 1; j < r->m; j += 2) a += r->cnts[j];
    return a;
}

void ps_rle_to_bbox(const ps_rle_t *r, double bb[4])
{
    int m = r->m / 2 * 2; /* a trailing run of 0s says nothing */
    uint64_t h = (uint64_t)r->h, xs = (uint64_t)r->w, ys = h, xe = 0, ye = 0, cc = 0, xp = 0;
    if (m == 0 || h == 0) {
        bb[0] = bb[1] = bb[2] = bb[3] = 0;
        return;
    }
    for (int j = 0; j < m; j++) {
        cc += r->cnts[j];
        uint64_t t = cc - (uint64_t)(j % 2); /* first pixel of a run of 1s, last of it */
        uint64_t y = t % h, x = t / h;
        if (j % 2 == 0) xp = x;
        else if (xp < x) ys = 0, ye = h - 1; /* the run crosses a column: full height */
        if (x < xs) xs = x;
        if (x > xe) xe = x;
        if (y < ys) ys = y;
        if (y > ye) ye = y;
    }
    bb[0] = (double)xs;
    bb[1] = (double)ys;
    bb[2] = (double)(xe - xs + 1);
    bb[3] = (double)(ye - ys + 1);
}

typedef struct {
    uint64_t inter, uni;
} iou_ctx_t;

static void iou_step(int va, int vb, uint32_t n, void *p)
{
    iou_ctx_t *c = p;
    if (va || vb) c->uni += n;
    if (va && vb) c->inter += n;
}

double ps_rle_iou(const ps_rle_t *dt, const ps_rle_t *gt, int crowd)
{
    if (dt->h != gt->h || dt->w != gt->w) return -1;
    iou_ctx_t c = {0, 0};
    co_walk(dt, gt, iou_step, &c);
    if (c.inter == 0) return 0;
    uint64_t u = crowd ? ps_rle_area(dt) : c.uni;
    return (double)c.inter / (double)u;
}

/* ---- compressed strings ---------------------------------------------------- */

char *ps_rle_to_string(const ps_rle_t *r)
{
    char *s = malloc((size_t)r->m * 7 + 1), *p = s;
    if (!s) return NULL;
    for (int i = 0; i < r->m; i++) {
        int64_t x = (int64_t)r->cnts[i] - (i > 2 ? (int64_t)r->cnts[i - 2] : 0);
        for (int more = 1; more;) {
            int c = (int)(x & 0x1f);
            x >>= 5; /* arithmetic: the sign is carried */
            more = (c & 0x10) ? x != -1 : x != 0;
            *p++ = (char)((more ? c | 0x20 : c) + 48);
        }
    }
    *p = 0;
    return s;
}

int ps_rle_from_string(ps_rle_t *r, const char *s, size_t len, int h, int w, char *err,
                       size_t errlen)
{
    memset(r, 0, sizeof *r);
    if (!pixels_ok(h, w))
        return fail(err, errlen, PS_ECORRUPT, "RLE size %d x %d too large", h, w);
    uint32_t *cnts = malloc(sizeof(uint32_t) * (len + 1));
    if (!cnts) return fail(err, errlen, PS_ENOMEM, "RLE: out of memory (%zu characters)", len);
    int m = 0;
    size_t p = 0;
    while (p < len) {
        size_t start = p;
        int64_t x = 0;
        int k = 0, more = 1;
        while (more) {
            if (p >= len) {
                free(cnts);
                return fail(err, errlen, PS_ECORRUPT, "RLE string: count %d cut off at the end "
                            "(offset %zu)", m, start);
            }
            int ch = (unsigned char)s[p];
            if (ch < 48 || ch > 111) {
                free(cnts);
                return fail(err, errlen, PS_ECORRUPT, "RLE string: bad character 0x%02x at "
                            "offset %zu (allowed: '0'..'o')", ch, p);
            }
            if (k == 7) {
                free(cnts);
                return fail(err, errlen, PS_ECORRUPT, "RLE string: count %d longer than 7 "
                            "characters (offset %zu)", m, start);
            }
            int c = ch - 48;
            x |= (int64_t)(c & 0x1f) << (5 * k);
            more = c & 0x20;
            p++, k++;
            if (!more && (c & 0x10)) x |= (int64_t)(~(uint64_t)0 << (5 * k)); /* sign */
        }
        if (m > 2) x += cnts[m - 2];
        if (x < 0 || x > (int64_t)UINT32_MAX) {
            free(cnts);
            return fail(err, errlen, PS_ECORRUPT, "RLE string: count %d is %lld (offset %zu)", m,
                        (long long)x, start);
        }
        cnts[m++] = (uint32_t)x;
    }
    r->h = h, r->w = w, r->m = m;
    r->cnts = cnts;
    if (m == 0) {
        free(cnts);
        r->cnts = NULL;
    }
    int rc = ps_rle_check(r, err, errlen);
    if (rc) ps_rle_free(r);
    return rc;
}
