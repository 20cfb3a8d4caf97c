/* TSM list files: parsing, validation, frame access (folder reader). */
#include "worker/data/video_list.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"

void ps_video_list_opts_default(ps_video_list_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->root = "";
    o->tmpl = "img_%05d.jpg";
    o->check_frames = 1;
    o->min_frames = 1;
    o->short_side = 256;
}

int ps_video_tmpl_ok(const char *t)
{
    int convs = 0;
    for (const char *p = t; *p; p++) {
        if (*p != '%') continue;
        p++;
        if (*p == '%') continue;
        if (*p == '0') p++;
        while (isdigit((unsigned char)*p)) p++;
        if (*p != 'd' && *p != 'i' && *p != 'u') return 0;
        convs++;
    }
    return convs == 1 && strlen(t) < 200;
}

ps_video_list_t *ps_video_list_alloc(const char *source, const char *root, const char *tmpl)
{
    ps_video_list_t *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->source = strdup(source);
    l->root = strdup(root ? root : "");
    l->tmpl = strdup(tmpl ? tmpl : "img_%05d.jpg");
    l->src = &ps_video_source_jpeg;
    if (!l->source || !l->root || !l->tmpl) {
        ps_video_list_free(&l);
        return NULL;
    }
    return l;
}

int ps_video_list_add(ps_video_list_t *l, const char *name, int frames, int label, int line)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 256;
        ps_video_entry_t *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return PS_ENOMEM;
        l->v = nv;
        l->cap = nc;
    }
    ps_video_entry_t *e = &l->v[l->n];
    e->name = strdup(name);
    if (!e->name) return PS_ENOMEM;
    e->frames = frames;
    e->label = label;
    e->line = line;
    e->shard = -1;
    e->first = 0;
    e->vix = NULL;
    l->n++;
    if (label + 1 > l->num_classes) l->num_classes = label + 1;
    return 0;
}

void ps_video_list_free(ps_video_list_t **lp)
{
    ps_video_list_t *l = *lp;
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].name);
        if (l->src->free_entry) l->src->free_entry(&l->v[i]);
    }
    free(l->v);
    for (int s = 0; s < l->n_shards; s++) {
        if (l->shard_fd && l->shard_fd[s] >= 0) close(l->shard_fd[s]);
        if (l->shard_path) free(l->shard_path[s]);
    }
    free(l->shard_fd);
    free(l->shard_path);
    free(l->fr);
    free(l->source);
    free(l->root);
    free(l->tmpl);
    free(l);
    *lp = NULL;
}

int ps_video_frame_path(const ps_video_list_t *l, size_t i, int frame, char *buf, size_t n)
{
    char fname[256];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    int k = snprintf(fname, sizeof fname, l->tmpl, frame);
#pragma GCC diagnostic pop
    if (k < 0 || (size_t)k >= sizeof fname) return PS_ERANGE;
    const char *name = l->v[i].name;
    if (l->root[0] && name[0] != '/')
        k = snprintf(buf, n, "%s/%s/%s", l->root, name, fname);
    else
        k = snprintf(buf, n, "%s/%s", name, fname);
    return k < 0 || (size_t)k >= n ? PS_ERANGE : 0;
}

/* Strict integer parse of a whole token. */
static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* Validates one parsed entry against the file system.  0 or PS_E*. */
static int check_entry(ps_video_list_t *l, size_t i, const void *arg, char *msg, size_t msglen)
{
    const ps_video_list_opts_t *o = arg;
    char path[4096];
    struct stat st;
    const ps_video_entry_t *e = &l->v[i];
    if (e->frames < o->min_frames) {
        ps_errf(msg, msglen, "video '%s' is too short: %d frames, at least %d needed", e->name,
                 e->frames, o->min_frames);
        return PS_ERANGE;
    }
    if (!o->check_frames && !o->verify_jpeg) return 0;
    /* The directory first, for the clearer message. */
    if (l->root[0] && e->name[0] != '/') snprintf(path, sizeof path, "%s/%s", l->root, e->name);
    else snprintf(path, sizeof path, "%s", e->name);
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        ps_errf(msg, msglen, "frame directory %s: %s", path,
                 stat(path, &st) != 0 ? strerror(errno) : "not a directory");
        return PS_ENOTFOUND;
    }
    int last = e->frames;
    for (int f = 1; f <= last; f++) {
        if (!o->verify_jpeg && f != 1 && f != last) continue;
        if (ps_video_frame_path(l, i, f, path, sizeof path) < 0) {
            ps_errf(msg, msglen, "frame path too long for video '%s'", e->name);
            return PS_ERANGE;
        }
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            ps_errf(msg, msglen, "video '%s' has %d frames in the list but %s is missing%s", e->name,
                     e->frames, path, f == last && f != 1 ? " (short video)" : "");
            return PS_ENOTFOUND;
        }
        if (o->verify_jpeg) {
            uint8_t *b;
            size_t n;
            int w, h;
            char jm[256];
            int rc = ps_read_file(path, &b, &n, jm, sizeof jm);
            if (rc == 0) {
                rc = ps_jpeg_probe(b, n, &w, &h, jm, sizeof jm);
                free(b);
            }
            if (rc < 0) {
                ps_errf(msg, msglen, "%s: %s", path, jm);
                return rc;
            }
        }
    }
    return 0;
}

/* Splits the last whitespace-separated field off s (cut in place): the
 * field, or NULL when s has a single field. */
static char *last_field(char *s)
{
    char *t = strrchr(s, ' '), *tab = strrchr(s, '\t');
    if (tab > t) t = tab;
    if (!t) return NULL;
    char *f = t + 1;
    while (t > s && isspace((unsigned char)t[-1])) t--;
    *t = 0;
    return *s ? f : NULL;
}

/* One list line, comments and blanks removed, into (name, frames, label):
 * 0, 1 to ignore the line, or a PS_E* with the reason in msg. */
static int parse_line(char *line, ssize_t len, int with_frames, char **name, int *frames,
                      int *label, char *msg, size_t msglen)
{
    if ((size_t)len != strlen(line)) {
        ps_errf(msg, msglen, "NUL byte in line");
        return PS_ECORRUPT;
    }
    while (len > 0 && isspace((unsigned char)line[len - 1])) line[--len] = 0;
    char *s = line;
    while (isspace((unsigned char)*s)) s++;
    if (!*s || *s == '#') return 1;
    /* fields from the right, so a name may hold spaces */
    char *lab = last_field(s), *nf = with_frames && lab ? last_field(s) : NULL;
    *frames = 0;
    if (!lab || (with_frames && !nf)) {
        ps_errf(msg, msglen, "expected '%s'", with_frames ? "frame_dir num_frames label" : "path label");
        return PS_EINVAL;
    }
    if (nf && parse_int(nf, 0, 10000000, frames) < 0) {
        ps_errf(msg, msglen, "num_frames '%s' is not a non-negative integer", nf);
        return PS_ERANGE;
    }
    if (parse_int(lab, 0, 1000000, label) < 0) {
        ps_errf(msg, msglen, "label '%s' is not a non-negative integer", lab);
        return PS_ERANGE;
    }
    *name = s;
    return 0;
}

int ps_video_list_read(const char *list_path, int with_frames, int skip_bad, ps_video_list_t *l,
                       ps_video_entry_check_fn check, const void *arg, char *err, size_t errlen)
{
    FILE *f = fopen(list_path, "r");
    if (!f) {
        ps_errf(err, errlen, "%s: %s", list_path, strerror(errno));
        return errno == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0;
    char msg[1024];
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        char *name;
        int frames, label;
        rc = parse_line(line, len, with_frames, &name, &frames, &label, msg, sizeof msg);
        if (rc == 1) { rc = 0; continue; }
        if (rc == 0) {
            rc = ps_video_list_add(l, name, frames, label, lineno);
            if (rc < 0) { ps_errf(err, errlen, "out of memory"); break; }
            if (check && (rc = check(l, l->n - 1, arg, msg, sizeof msg)) < 0) free(l->v[--l->n].name);
        }
        if (rc < 0) {
            if (!skip_bad) {
                ps_errf(err, errlen, "%s:%d: %s", list_path, lineno, msg);
                break;
            }
            ps_warn("%s:%d: skipped: %s", list_path, lineno, msg);
            l->skipped++;
            rc = 0;
        }
    }
    if (rc == 0 && ferror(f)) {
        ps_errf(err, errlen, "%s: read error", list_path);
        rc = PS_EIO;
    }
    free(line);
    fclose(f);
    return rc;
}

int ps_video_list_finish(ps_video_list_t *l, char *err, size_t errlen)
{
    if (l->n == 0) {
        ps_errf(err, errlen, "%s: no usable videos (%zu skipped)", l->source, l->skipped);
        return PS_EINVAL;
    }
    /* num_classes recomputed: a skipped entry may have raised it. */
    l->num_classes = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].label + 1 > l->num_classes) l->num_classes = l->v[i].label + 1;
    if (l->skipped) ps_warn("%s: %zu bad entries skipped, %zu videos kept", l->source, l->skipped, l->n);
    return 0;
}

int ps_video_list_load(const char *list_path, const ps_video_list_opts_t *oin,
                       ps_video_list_t **out, char *err, size_t errlen)
{
    ps_video_list_opts_t o;
    if (oin) o = *oin; else ps_video_list_opts_default(&o);
    if (!o.tmpl) o.tmpl = "img_%05d.jpg";
    if (o.min_frames < 1) o.min_frames = 1;
    *out = NULL;
    if (!ps_video_tmpl_ok(o.tmpl)) {
        ps_errf(err, errlen, "frame template '%s' must hold exactly one integer conversion "
                 "such as %%05d", o.tmpl);
        return PS_EINVAL;
    }
    ps_video_list_t *l = ps_video_list_alloc(list_path, o.root, o.tmpl);
    if (!l) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    int rc = ps_video_list_read(list_path, 1, o.skip_bad, l, check_entry, &o, err, errlen);
    if (rc == 0) rc = ps_video_list_finish(l, err, errlen);
    if (rc < 0) {
        ps_video_list_free(&l);
        return rc;
    }
    *out = l;
    return 0;
}

size_t ps_video_list_size(const ps_video_list_t *l) { return l->n; }
int ps_video_list_frames(const ps_video_list_t *l, size_t i) { return l->v[i].frames; }
int ps_video_list_label(const ps_video_list_t *l, size_t i) { return l->v[i].label; }
const char *ps_video_list_name(const ps_video_list_t *l, size_t i) { return l->v[i].name; }
int ps_video_list_num_classes(const ps_video_list_t *l) { return l->num_classes; }
size_t ps_video_list_skipped(const ps_video_list_t *l) { return l->skipped; }
int ps_video_list_is_packed(const ps_video_list_t *l) { return l->packed; }

long ps_video_list_find_label(const ps_video_list_t *l, int min_label, char *where, size_t n)
{
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].label < min_label) continue;
        if (where && n) {
            if (l->packed) snprintf(where, n, "%s (list line %d)", l->source, l->v[i].line);
            else snprintf(where, n, "%s:%d", l->source, l->v[i].line);
        }
        return (long)i;
    }
    if (where && n) where[0] = 0;
    return -1;
}

int ps_video_read_frame_bytes(const ps_video_list_t *l, size_t i, int frame,
                              uint8_t **buf, size_t *len, char *err, size_t errlen)
{
    *buf = NULL;
    if (i >= l->n || frame < 1 || frame > l->v[i].frames) {
        ps_errf(err, errlen, "%s: frame %d of video %zu out of range", l->source, frame, i);
        return PS_ERANGE;
    }
    const ps_video_entry_t *e = &l->v[i];
    char m[512];
    if (l->src != &ps_video_source_jpeg) {
        ps_errf(err, errlen, "%s:%d: '%s' is a video file, not JPEG frames", l->source, e->line, e->name);
        return PS_EUNSUPPORTED;
    }
    if (!l->packed) {
        char path[4096];
        if (ps_video_frame_path(l, i, frame, path, sizeof path) < 0) {
            ps_errf(err, errlen, "%s:%d: frame path too long", l->source, e->line);
            return PS_ERANGE;
        }
        int rc = ps_read_file(path, buf, len, m, sizeof m);
        if (rc < 0) ps_errf(err, errlen, "%s:%d: video '%s': %s", l->source, e->line, e->name, m);
        return rc;
    }
    const ps_pack_frame_t *fr = &l->fr[e->first + (size_t)frame - 1];
    uint8_t *b = malloc(fr->len ? fr->len : 1);
    if (!b) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    size_t got = 0;
    while (got < fr->len) {
        ssize_t r = pread(l->shard_fd[e->shard], b + got, fr->len - got, (off_t)(fr->off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            ps_errf(err, errlen, "%s: video '%s' (list line %d) frame %d: %s", l->shard_path[e->shard],
                     e->name, e->line, frame, r < 0 ? strerror(errno) : "shard file truncated");
            free(b);
            return PS_EIO;
        }
        got += (size_t)r;
    }
    if (ps_crc32c(0, b, fr->len) != fr->crc) {
        ps_errf(err, errlen, "%s: video '%s' (list line %d) frame %d: checksum mismatch",
                 l->shard_path[e->shard], e->name, e->line, frame);
        free(b);
        return PS_ECORRUPT;
    }
    *buf = b;
    *len = fr->len;
    return 0;
}

int ps_video_read_frame_io(const ps_video_list_t *l, size_t i, int frame, uint8_t **rgb,
                           int *w, int *h, ps_video_io_t *io, char *err, size_t errlen)
{
    uint8_t *b;
    size_t n;
    *rgb = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = ps_video_read_frame_bytes(l, i, frame, &b, &n, err, errlen);
    if (rc < 0) return rc;
    if (io) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        io->frames++;
        io->bytes += n;
        io->read_s += (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    }
    char m[300];
    rc = ps_jpeg_decode(b, n, rgb, w, h, m, sizeof m);
    free(b);
    if (rc < 0) {
        char path[4096];
        if (l->packed || ps_video_frame_path(l, i, frame, path, sizeof path) < 0)
            snprintf(path, sizeof path, "frame %d", frame);
        ps_errf(err, errlen, "%s:%d: video '%s': %s: %s", l->source, l->v[i].line, l->v[i].name,
                 path, m);
    }
    return rc;
}

static int jpeg_frames(const ps_video_list_t *l, size_t i, const int *idx, int n, uint8_t **px,
                       int *w, int *h, ps_video_io_t *io, char *err, size_t errlen)
{
    for (int k = 0; k < n; k++) {
        int rc = ps_video_read_frame_io(l, i, idx[k], &px[k], &w[k], &h[k], io, err, errlen);
        if (rc < 0) {
            while (k > 0) {
                free(px[--k]);
                px[k] = NULL;
            }
            return rc;
        }
    }
    return 0;
}

const ps_video_source_t ps_video_source_jpeg = { "JPEG frames", jpeg_frames, NULL };

int ps_video_read_frames_io(const ps_video_list_t *l, size_t i, const int *idx, int n, uint8_t **px,
                            int *w, int *h, ps_video_io_t *io, char *err, size_t errlen)
{
    for (int k = 0; k < n; k++) px[k] = NULL;
    if (i >= l->n) {
        ps_errf(err, errlen, "%s: video %zu out of range (%zu videos)", l->source, i, l->n);
        return PS_ERANGE;
    }
    return l->src->read_frames(l, i, idx, n, px, w, h, io, err, errlen);
}

int ps_video_read_frames(const ps_video_list_t *l, size_t i, const int *idx, int n, uint8_t **px,
                         int *w, int *h, char *err, size_t errlen)
{
    return ps_video_read_frames_io(l, i, idx, n, px, w, h, NULL, err, errlen);
}

int ps_video_read_frame(const ps_video_list_t *l, size_t i, int frame,
                        uint8_t **rgb, int *w, int *h, char *err, size_t errlen)
{
    return ps_video_read_frames(l, i, &frame, 1, rgb, w, h, err, errlen);
}

