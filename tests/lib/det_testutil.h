/* Helpers of the detection data tests (test_det_data, test_det_masks).
 * Header-only, like tap.h. */
#ifndef PS_DET_TESTUTIL_H
#define PS_DET_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "worker/data/ps_image.h"

/* dir/name: a w x h JPEG of one colour (quality 100, so decoded pixels are
 * within +-2).  0 or PS_E*. */
static inline int det_write_jpeg(const char *dir, const char *name, int w, int h, uint8_t r,
                                 uint8_t g, uint8_t b)
{
    uint8_t *px = malloc((size_t)w * h * 3), *buf = NULL;
    size_t len;
    char err[256], path[4200];
    if (!px) return PS_ENOMEM;
    for (int i = 0; i < w * h; i++) px[3 * i] = r, px[3 * i + 1] = g, px[3 * i + 2] = b;
    int rc = ps_jpeg_encode(px, w, h, 100, &buf, &len, err, sizeof err);
    free(px);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int bad = !f || fwrite(buf, 1, len, f) != len;
    if (f) bad |= fclose(f) != 0;
    free(buf);
    return bad ? PS_EIO : 0;
}

#endif
