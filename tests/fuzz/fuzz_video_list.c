/* Fuzz target: the TSM dataset list reader (worker/data: ps_video_list_load,
 * `frame_dir num_frames label` per line).  Byte 0 chooses the options:
 * bit 0 skip_bad, bit 1 check_frames (stat of the first/last frame under a
 * root that does not exist: exercises the frame path built from the
 * template), bits 2-3 min_frames - 1, bit 4: the first line of the rest is
 * the frame name template (a printf format taken from the user: it must be
 * refused unless it holds exactly one integer conversion).  The rest is
 * written to a temporary list file.
 * Checks: the result is 0 or a negative PS_E* with a message; on success
 * every entry has a name, frames >= min_frames, 0 <= label < num_classes,
 * and its frame paths are built without overflow; the entries never
 * outnumber the input's lines.  Errors are logged to stderr: run with
 * -close_fd_mask=2 to quieten. */
#include "tests/fuzz/fuzz.h"

#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "worker/data/ps_video.h"
#include "worker/data/video_list.h"

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size);

static char vlist_fz_path[64];

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 16384) return 0;
    ps_video_list_opts_t o;
    ps_video_list_opts_default(&o);
    o.root = "/nonexistent-ps-fuzz";
    o.skip_bad = data[0] & 1;
    o.check_frames = (data[0] >> 1) & 1;
    o.min_frames = 1 + ((data[0] >> 2) & 3);
    const uint8_t *body = data + 1;
    size_t blen = size - 1;
    char tmpl[256];
    if (data[0] & 16) {
        const uint8_t *nl = memchr(body, '\n', blen);
        size_t tl = nl ? (size_t)(nl - body) : blen;
        if (tl >= sizeof tmpl || memchr(body, 0, tl)) return 0;
        memcpy(tmpl, body, tl);
        tmpl[tl] = 0;
        o.tmpl = tmpl;
        body += nl ? tl + 1 : tl;
        blen -= nl ? tl + 1 : tl;
    }
    if (!vlist_fz_path[0])
        snprintf(vlist_fz_path, sizeof vlist_fz_path, "/tmp/ps_fuzz_vlist_%d.txt", (int)getpid());
    FILE *fp = fopen(vlist_fz_path, "wb");
    if (!fp) abort();
    if (blen) fwrite(body, 1, blen, fp);
    fclose(fp);
    size_t lines = 1;
    for (size_t i = 0; i < blen; i++) lines += body[i] == '\n';

    ps_video_list_t *l = NULL;
    char err[512] = "";
    int rc = ps_video_list_load(vlist_fz_path, &o, &l, err, sizeof err);
    unlink(vlist_fz_path);
    if (rc) {
        FUZZ_CHECK(rc < 0 && rc >= -19, "load returned %d", rc);
        FUZZ_CHECK(l == NULL, "failed load left a list");
        FUZZ_CHECK(err[0] != 0, "failed load (%d) without a message", rc);
        return 0;
    }
    FUZZ_CHECK(l != NULL, "load returned 0 without a list");
    size_t n = ps_video_list_size(l);
    FUZZ_CHECK(n >= 1 && n <= lines, "%zu entries from %zu lines", n, lines);
    int nc = ps_video_list_num_classes(l);
    for (size_t i = 0; i < n; i++) {
        const char *nm = ps_video_list_name(l, i);
        int fr = ps_video_list_frames(l, i), lab = ps_video_list_label(l, i);
        FUZZ_CHECK(nm && nm[0], "entry %zu has no name", i);
        FUZZ_CHECK(fr >= o.min_frames, "entry %zu: %d frames < min %d", i, fr, o.min_frames);
        FUZZ_CHECK(lab >= 0 && lab < nc, "entry %zu: label %d, num_classes %d", i, lab, nc);
        char path[4096];
        int prc = ps_video_frame_path(l, i, fr, path, sizeof path);
        FUZZ_CHECK(prc <= 0, "frame path returned %d", prc);
        if (prc == 0) FUZZ_CHECK(strlen(path) < sizeof path, "frame path overflow");
    }
    ps_video_list_free(&l);
    FUZZ_CHECK(l == NULL, "free did not NULL the pointer");
    return 0;
}
