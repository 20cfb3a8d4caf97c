/* RGB8 images for the data pipeline: JPEG through libjpeg(-turbo) and the
 * bilinear resize PIL does (Pillow's Resample.c: a triangle filter widened
 * by the reduction factor, so downscaling antialiases; 8-bit fixed point
 * with 22 fraction bits; horizontal pass then vertical), so frames come out
 * as TSM's PIL transforms would make them.  Pixels are interleaved RGB,
 * row-major, no padding unless a stride says so. */
#ifndef PS_IMAGE_H
#define PS_IMAGE_H
#include <stddef.h>
#include <stdint.h>

/* Decodes a JPEG (gray or colour) into malloc'd RGB8.  A corrupt stream,
 * including one libjpeg only warns about (truncation), is an error: returns
 * PS_ECORRUPT with libjpeg's message in err. */
int ps_jpeg_decode(const uint8_t *buf, size_t len, uint8_t **rgb, int *w, int *h,
                   char *err, size_t errlen);
/* Reads only the header: image size.  PS_ECORRUPT if not a JPEG. */
int ps_jpeg_probe(const uint8_t *buf, size_t len, int *w, int *h, char *err, size_t errlen);
/* Encodes RGB8 at `quality` (1..100, 4:2:0 below 90 as libjpeg's default,
 * 4:4:4 from 90 up) into a malloc'd buffer. */
int ps_jpeg_encode(const uint8_t *rgb, int w, int h, int quality, uint8_t **buf,
                   size_t *len, char *err, size_t errlen);

/* Resizes the sw x sh region at src (row stride src_stride bytes) to
 * dw x dh into dst (packed), bilinear as PIL's Image.resize(BILINEAR). */
int ps_image_resize(const uint8_t *src, int src_stride, int sw, int sh, uint8_t *dst,
                    int dw, int dh);

/* snprintf into an error buffer (truncation of a long message is fine). */
void ps_errf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Seconds on CLOCK_MONOTONIC (waits, progress lines). */
double ps_now_s(void);

/* Reads a whole file into a malloc'd buffer. */
int ps_read_file(const char *path, uint8_t **buf, size_t *len, char *err, size_t errlen);

#endif
