/* JPEG decode/encode (libjpeg-turbo) and PIL-exact bilinear resize. */
#include "worker/data/ps_image.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jpeglib.h>

#include "ps_error.h"
#include "ps_log.h"

/* ---- libjpeg error handling: longjmp out instead of exit() ---------------- */
typedef struct jerr {
    struct jpeg_error_mgr mgr;
    jmp_buf jb;
    int warnings;
    char msg[JMSG_LENGTH_MAX];
} jerr_t;

static void jerr_exit(j_common_ptr c)
{
    jerr_t *e = (jerr_t *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jb, 1);
}

/* libjpeg only warns about a truncated or damaged stream and fills the rest
 * with grey; a data pipeline must not train on that silently, so the first
 * warning is kept and the decode reported as failed. */
static void jerr_emit(j_common_ptr c, int level)
{
    jerr_t *e = (jerr_t *)c->err;
    if (level < 0) {
        if (!e->warnings) (*c->err->format_message)(c, e->msg);
        e->warnings++;
    }
}

static void jerr_init(jerr_t *e, j_common_ptr c)
{
    c->err = jpeg_std_error(&e->mgr);
    e->mgr.error_exit = jerr_exit;
    e->mgr.emit_message = jerr_emit;
    e->warnings = 0;
    e->msg[0] = 0;
}

static int open_header(struct jpeg_decompress_struct *d, const uint8_t *buf, size_t len)
{
    if (len < 4 || buf[0] != 0xFF || buf[1] != 0xD8) return PS_ECORRUPT;
    jpeg_mem_src(d, buf, (unsigned long)len);
    if (jpeg_read_header(d, TRUE) != JPEG_HEADER_OK) return PS_ECORRUPT;
    return 0;
}

int ps_jpeg_probe(const uint8_t *buf, size_t len, int *w, int *h, char *err, size_t errlen)
{
    struct jpeg_decompress_struct d;
    jerr_t e;
    jerr_init(&e, (j_common_ptr)&d);
    jpeg_create_decompress(&d);
    if (setjmp(e.jb)) {
        ps_errf(err, errlen, "not a valid JPEG: %s", e.msg);
        jpeg_destroy_decompress(&d);
        return PS_ECORRUPT;
    }
    if (open_header(&d, buf, len) < 0) {
        ps_errf(err, errlen, "not a JPEG (no SOI marker)");
        jpeg_destroy_decompress(&d);
        return PS_ECORRUPT;
    }
    *w = (int)d.image_width;
    *h = (int)d.image_height;
    jpeg_destroy_decompress(&d);
    return 0;
}

int ps_jpeg_decode(const uint8_t *buf, size_t len, uint8_t **rgb, int *w, int *h,
                   char *err, size_t errlen)
{
    struct jpeg_decompress_struct d;
    jerr_t e;
    uint8_t *volatile px = NULL;
    *rgb = NULL;
    jerr_init(&e, (j_common_ptr)&d);
    jpeg_create_decompress(&d);
    if (setjmp(e.jb)) {
        ps_errf(err, errlen, "JPEG decode failed: %s", e.msg);
        jpeg_destroy_decompress(&d);
        free(px);
        return PS_ECORRUPT;
    }
    if (open_header(&d, buf, len) < 0) {
        ps_errf(err, errlen, "not a JPEG (no SOI marker)");
        jpeg_destroy_decompress(&d);
        return PS_ECORRUPT;
    }
    if (d.jpeg_color_space == JCS_CMYK || d.jpeg_color_space == JCS_YCCK) {
        ps_errf(err, errlen, "CMYK JPEG not supported");
        jpeg_destroy_decompress(&d);
        return PS_EUNSUPPORTED;
    }
    /* PIL's settings: islow DCT, fancy upsampling (libjpeg defaults). */
    d.out_color_space = JCS_RGB;
    d.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&d);
    if (d.output_components != 3 || d.output_width == 0 || d.output_height == 0 ||
        d.output_width > 16384 || d.output_height > 16384) {
        ps_errf(err, errlen, "unsupported JPEG geometry %ux%u x%d", d.output_width,
                 d.output_height, d.output_components);
        jpeg_destroy_decompress(&d);
        return PS_EUNSUPPORTED;
    }
    size_t stride = (size_t)d.output_width * 3;
    px = malloc(stride * d.output_height);
    if (!px) {
        ps_errf(err, errlen, "out of memory for a %ux%u frame", d.output_width, d.output_height);
        jpeg_destroy_decompress(&d);
        return PS_ENOMEM;
    }
    while (d.output_scanline < d.output_height) {
        JSAMPROW row = px + stride * d.output_scanline;
        jpeg_read_scanlines(&d, &row, 1);
    }
    jpeg_finish_decompress(&d);
    if (e.warnings) {
        ps_errf(err, errlen, "corrupt JPEG data: %s", e.msg);
        jpeg_destroy_decompress(&d);
        free(px);
        return PS_ECORRUPT;
    }
    *w = (int)d.output_width;
    *h = (int)d.output_height;
    jpeg_destroy_decompress(&d);
    *rgb = px;
    return 0;
}

int ps_jpeg_encode(const uint8_t *rgb, int w, int h, int quality, uint8_t **buf,
                   size_t *len, char *err, size_t errlen)
{
    struct jpeg_compress_struct c;
    jerr_t e;
    unsigned char *volatile out = NULL;
    unsigned long outlen = 0;
    *buf = NULL;
    if (w <= 0 || h <= 0 || quality < 1 || quality > 100) {
        ps_errf(err, errlen, "bad JPEG encode arguments %dx%d q%d", w, h, quality);
        return PS_EINVAL;
    }
    jerr_init(&e, (j_common_ptr)&c);
    jpeg_create_compress(&c);
    if (setjmp(e.jb)) {
        ps_errf(err, errlen, "JPEG encode failed: %s", e.msg);
        jpeg_destroy_compress(&c);
        free(out);
        return PS_EIO;
    }
    unsigned char *o = NULL;
    jpeg_mem_dest(&c, &o, &outlen);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    if (quality >= 90) /* no chroma subsampling: high quality means it */
        for (int i = 0; i < c.num_components; i++)
            c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)c.next_scanline * w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    out = o;
    jpeg_destroy_compress(&c);
    /* jpeg_mem_dest's buffer is malloc'd by libjpeg; hand it over as is. */
    *buf = out;
    *len = outlen;
    return 0;
}

/* ---- Pillow's resample, 8 bits per channel -------------------------------- */
#define PREC_BITS (32 - 8 - 2)

static double bilinear_filter(double x)
{
    if (x < 0.0) x = -x;
    if (x < 1.0) return 1.0 - x;
    return 0.0;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for in [0, insize). */
static int coeffs(int insize, int outsize, int **boundsp, int32_t **kkp)
{
    double scale = (double)insize / outsize;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *k = malloc(sizeof(double) * ksize);
    int32_t *kk = malloc(sizeof(int32_t) * (size_t)outsize * ksize);
    int *bounds = malloc(sizeof(int) * 2 * (size_t)outsize);
    if (!k || !kk || !bounds) {
        free(k); free(kk); free(bounds);
        return PS_ENOMEM;
    }
    for (int xx = 0; xx < outsize; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > insize) xmax = insize;
        xmax -= xmin;
        int x;
        for (x = 0; x < xmax; x++) {
            double wgt = bilinear_filter((x + xmin - center + 0.5) * ss);
            k[x] = wgt;
            ww += wgt;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        for (x = 0; x < ksize; x++)
            kk[(size_t)xx * ksize + x] = k[x] < 0 ? (int32_t)(-0.5 + k[x] * (1 << PREC_BITS))
                                                  : (int32_t)(0.5 + k[x] * (1 << PREC_BITS));
        bounds[xx * 2] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    free(k);
    *boundsp = bounds;
    *kkp = kk;
    return ksize;
}

static inline uint8_t clip8(int32_t v)
{
    v >>= PREC_BITS;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

int ps_image_resize(const uint8_t *src, int src_stride, int sw, int sh, uint8_t *dst,
                    int dw, int dh)
{
    if (sw <= 0 || sh <= 0 || dw <= 0 || dh <= 0) return PS_EINVAL;
    int need_h = dw != sw, need_v = dh != sh;
    int *bh = NULL, *bv = NULL;
    int32_t *kh = NULL, *kv = NULL;
    int ksh = coeffs(sw, dw, &bh, &kh), ksv = coeffs(sh, dh, &bv, &kv);
    uint8_t *tmp = NULL;
    int rc = 0;
    if (ksh < 0 || ksv < 0) { rc = PS_ENOMEM; goto out; }
    const uint8_t *in = src;
    int in_stride = src_stride;
    int ybox_first = bv[0], ybox_last = bv[dh * 2 - 2] + bv[dh * 2 - 1];
    if (need_h) {
        /* Only the rows the vertical pass reads, as Pillow does. */
        int rows = need_v ? ybox_last - ybox_first : sh;
        int y0 = need_v ? ybox_first : 0;
        uint8_t *o = need_v ? (tmp = malloc((size_t)dw * 3 * rows)) : dst;
        if (!o) { rc = PS_ENOMEM; goto out; }
        for (int y = 0; y < rows; y++) {
            const uint8_t *row = src + (size_t)(y + y0) * src_stride;
            uint8_t *orow = o + (size_t)y * dw * 3;
            for (int xx = 0; xx < dw; xx++) {
                int xmin = bh[xx * 2], xmax = bh[xx * 2 + 1];
                const int32_t *k = kh + (size_t)xx * ksh;
                int32_t s0 = 1 << (PREC_BITS - 1), s1 = s0, s2 = s0;
                for (int x = 0; x < xmax; x++) {
                    const uint8_t *p = row + (size_t)(x + xmin) * 3;
                    s0 += p[0] * k[x];
                    s1 += p[1] * k[x];
                    s2 += p[2] * k[x];
                }
                orow[xx * 3] = clip8(s0);
                orow[xx * 3 + 1] = clip8(s1);
                orow[xx * 3 + 2] = clip8(s2);
            }
        }
        if (!need_v) goto out;
        in = tmp;
        in_stride = dw * 3;
        for (int i = 0; i < dh; i++) bv[i * 2] -= ybox_first;
    }
    int w = need_h ? dw : sw;
    if (need_v) {
        for (int yy = 0; yy < dh; yy++) {
            int ymin = bv[yy * 2], ymax = bv[yy * 2 + 1];
            const int32_t *k = kv + (size_t)yy * ksv;
            uint8_t *orow = dst + (size_t)yy * w * 3;
            for (int xx = 0; xx < w * 3; xx++) {
                int32_t s = 1 << (PREC_BITS - 1);
                for (int y = 0; y < ymax; y++) s += in[(size_t)(y + ymin) * in_stride + xx] * k[y];
                orow[xx] = clip8(s);
            }
        }
    } else if (!need_h) {
        for (int y = 0; y < sh; y++) memcpy(dst + (size_t)y * sw * 3, src + (size_t)y * src_stride, (size_t)sw * 3);
    }
out:
    free(bh); free(bv); free(kh); free(kv); free(tmp);
    return rc;
}

int ps_read_file(const char *path, uint8_t **buf, size_t *len, char *err, size_t errlen)
{
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        ps_errf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = malloc(cap);
    while (b) {
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
        if (n == cap) {
            uint8_t *nb = cap > ((size_t)1 << 30) ? NULL : realloc(b, cap * 2);
            if (!nb) { free(b); b = NULL; break; }
            b = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        ps_errf(err, errlen, "%s: %s", path, bad ? "read error" : "out of memory or file too large");
        return bad ? PS_EIO : PS_ENOMEM;
    }
    *buf = b;
    *len = n;
    return 0;
}

void ps_errf(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    if (!buf || !n) return;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

double ps_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
