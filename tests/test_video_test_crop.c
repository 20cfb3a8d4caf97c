/* TSM's test-time crops (worker/data/ps_video.h ps_video_test_crop) in
 * closed form: GroupFullResSample's offsets 0, 4 and 2 steps of
 * (side - crop) // 4 along the longer side (left / top, right / bottom,
 * centre) and 2 steps across; CenterCrop's Python rounding (half to even);
 * the view count of a test sample and the option check.  The pixels of
 * whole videos against a numpy / PIL reference: tests/check_test_protocol.sh. */
#include "tests/lib/tap.h"
#include "worker/data/ps_video.h"

#include <string.h>

static void crops(int w, int h, int c, int n, const int *want_xy, const char *what)
{
    int good = 1;
    char got[128] = "";
    for (int k = 0; k < n; k++) {
        int x, y;
        ps_video_test_crop(w, h, c, c, n, k, &x, &y);
        good &= x == want_xy[2 * k] && y == want_xy[2 * k + 1];
        snprintf(got + strlen(got), sizeof got - strlen(got), " (%d,%d)", x, y);
    }
    ok(good, "%s: %dx%d, crop %d:%s", what, w, h, c, got);
}

int main(void)
{
    /* 58 - 32 = 26: step 6, so the right crop starts at 24, not 26 (TSM's // 4) */
    crops(58, 32, 32, 3, (const int[]){0, 0, 24, 0, 12, 0}, "landscape: left, right, centre");
    crops(32, 58, 32, 3, (const int[]){0, 0, 0, 24, 0, 12}, "portrait: top, bottom, centre");
    crops(70, 40, 32, 3, (const int[]){0, 4, 36, 4, 18, 4}, "landscape, taller than the crop: 2 steps down");
    crops(32, 32, 32, 3, (const int[]){0, 0, 0, 0, 0, 0}, "square at the crop size: one place");
    crops(37, 39, 32, 1, (const int[]){2, 4}, "centre: round(2.5) = 2, round(3.5) = 4 (half to even)");

    ps_video_opts_t o;
    ps_video_opts_default(&o);
    o.train = 0;
    o.n_clips = 2;
    o.n_crops = 3;
    char err[256];
    ok(!ps_video_opts_check(&o, err, sizeof err) && ps_video_clips_per_sample(&o) == 6,
       "2 clips x 3 crops: 6 views per test sample");
    o.train = 1;
    is_int(ps_video_clips_per_sample(&o), 1, "training: one clip whatever n_crops");
    o.n_crops = 2;
    ok(ps_video_opts_check(&o, err, sizeof err) && strstr(err, "n_crops"), "n_crops 2 refused: %s", err);
    return tap_done();
}
