/* psdata extract (video_extract.h): threads take the list's videos in
 * order; each video is probed, decoded frame by frame (video_file.c) and
 * JPEG-encoded, then either renamed into place as a finished folder or
 * kept in memory until every video of its shard is done, when the thread
 * that finished the shard's last video writes it. */
#include "worker/data/video_extract.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_util.h"
#include "worker/data/ps_image.h"
#include "worker/data/video_file.h"
#include "worker/data/video_list.h"

#define MARKER ".frames"          /* in a finished folder: its frame count */
#define PARTIAL ".extracting"     /* suffix of a folder being written */
#define PROGRESS_S 10.0           /* progress line period */

void ps_video_extract_opts_default(ps_video_extract_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->root = "";
    o->short_side = 256;
    o->quality = 95;
    o->shard_videos = 256;
}

/* One video's JPEG frames held for its shard. */
typedef struct held {
    uint8_t *data;
    size_t len, cap;
    uint32_t *flen;
    int frames, ok;
} held_t;

typedef struct job {
    const ps_video_extract_opts_t *o;
    ps_video_list_t *l;        /* the list: names, labels, lines; frames filled in */
    char **dir;                /* folder layout: frame folder per video */
    int *ok;                   /* per video: 1 extracted or found complete */
    held_t *held;              /* packed: per video */
    int *shard_left;           /* packed: videos of the shard not finished */
    int *shard_done;           /* packed: complete before this run */
    pthread_mutex_t mu;
    size_t next;               /* next video to take */
    int failed;                /* a fatal error: err holds it */
    char *err;
    size_t errlen;
    ps_video_extract_stats_t st;
    double t_last;
} job_t;


/* ---- files and folders ---------------------------------------------------------- */

/* Removes a folder of plain files (a partial extraction); ENOENT is fine. */
static int rm_files_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *de;
    char p[4200];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        unlink(p);
    }
    closedir(d);
    return rmdir(path);
}

static int write_whole(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    int rc = ps_write_all(fd, p, n);
    if (close(fd) < 0) rc = -1;
    return rc;
}

/* The frame folder of a video path: the path without its extension, under
 * OUT.  NULL (and msg) for a path that would leave OUT. */
static char *frame_dir(const char *name, char *msg, size_t msglen)
{
    while (*name == '/') name++;
    while (!strncmp(name, "./", 2)) name += 2;
    char *d = strdup(name);
    if (!d) { ps_errf(msg, msglen, "out of memory"); return NULL; }
    char *slash = strrchr(d, '/'), *dot = strrchr(d, '.');
    if (dot && (!slash || dot > slash + 1)) *dot = 0;
    int bad = !*d || d[strlen(d) - 1] == '/';
    for (char *c = d; !bad && (c = strstr(c, "..")); c += 2)
        bad = (c == d || c[-1] == '/') && (c[2] == 0 || c[2] == '/');
    if (bad) {
        ps_errf(msg, msglen, "path '%s' makes no frame folder inside the output (empty or '..')", name);
        free(d);
        return NULL;
    }
    return d;
}

static int cmp_dir(const void *a, const void *b, void *arg)
{
    char **dir = arg;
    return strcmp(dir[*(const size_t *)a], dir[*(const size_t *)b]);
}

/* key=value lines as "key=value key=value". */
static void one_line(char *buf, size_t n, const char *text, size_t len)
{
    snprintf(buf, n, "%.*s", (int)(len < n - 1 ? len : n - 1), text);
    size_t k = strlen(buf);
    while (k && buf[k - 1] == '\n') buf[--k] = 0;
    for (char *c = buf; *c; c++)
        if (*c == '\n') *c = ' ';
}

/* The options a directory was made with: refused when they differ. */
static int check_conf(const char *dir, const char *conf, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/extract.conf", dir);
    uint8_t *old;
    size_t n;
    char m[512];
    if (ps_read_file(path, &old, &n, m, sizeof m) == 0) {
        int same = n == strlen(conf) && !memcmp(old, conf, n);
        if (!same) {
            char o[512], c2[512];
            one_line(o, sizeof o, (const char *)old, n);
            one_line(c2, sizeof c2, conf, strlen(conf));
            ps_errf(err, errlen, "%s was extracted with other options (%s), this run has (%s): give "
                    "those options, or another output directory", dir, o, c2);
        }
        free(old);
        return same ? 0 : PS_EMISMATCH;
    }
    return ps_write_file_atomic1(path, conf, strlen(conf), "extraction", err, errlen);
}

/* ---- one video ------------------------------------------------------------------ */

typedef struct sink {
    job_t *j;
    const char *dir;   /* folder layout: where the frames go */
    held_t *held;      /* packed */
    int out_failed;    /* writing the output failed: the run stops */
} sink_t;

static int put_frame(int k, const uint8_t *rgb, int w, int h, void *user, char *err, size_t errlen)
{
    sink_t *s = user;
    uint8_t *jpg;
    size_t len;
    int rc = ps_jpeg_encode(rgb, w, h, s->j->o->quality, &jpg, &len, err, errlen);
    if (rc < 0) return rc;
    if (s->dir) {
        char path[4200];
        snprintf(path, sizeof path, "%s/img_%05d.jpg", s->dir, k + 1);
        if (write_whole(path, jpg, len) < 0) {
            ps_errf(err, errlen, "%s: %s", path, strerror(errno));
            s->out_failed = 1;
            rc = PS_EIO;
        }
    } else {
        held_t *h = s->held;
        if (h->len + len > h->cap) {
            size_t nc = h->cap ? h->cap * 2 : 1 << 16;
            while (nc < h->len + len) nc *= 2;
            uint8_t *nd = realloc(h->data, nc);
            if (!nd) rc = PS_ENOMEM;
            else h->data = nd, h->cap = nc;
        }
        if (rc == 0) {
            memcpy(h->data + h->len, jpg, len);
            h->len += len;
            h->flen[k] = (uint32_t)len;
        } else {
            ps_errf(err, errlen, "out of memory holding the frames");
        }
    }
    free(jpg);
    return rc;
}

/* Probes and decodes video i through the sink: its frame count, or PS_E*. */
static int decode_video(job_t *j, size_t i, sink_t *s, int *frames, char *m, size_t mlen)
{
    const ps_video_entry_t *e = &j->l->v[i];
    char path[4096];
    ps_vfile_index_t *ix = NULL;
    int rc = ps_video_file_path(j->o->root, e->name, path, sizeof path);
    if (rc < 0) { ps_errf(m, mlen, "path too long"); return rc; }
    if ((rc = ps_vfile_probe(path, &ix, m, mlen)) < 0) return rc;
    int n = ps_vfile_frames(ix, j->o->fps);
    int *want = malloc(sizeof(int) * (size_t)n);
    if (s->held && !(s->held->flen = malloc(sizeof(uint32_t) * (size_t)n))) rc = PS_ENOMEM;
    if (!want || rc < 0) {
        ps_errf(m, mlen, "out of memory");
        rc = PS_ENOMEM;
    } else {
        for (int k = 0; k < n; k++) want[k] = k + 1;
        ps_vfile_opts_t vo = { j->o->short_side, j->o->fps, NULL };
        rc = ps_vfile_decode(path, ix, &vo, want, n, put_frame, s, m, mlen);
    }
    free(want);
    ps_vfile_index_free(&ix);
    *frames = n;
    return rc;
}

/* Folder layout: OUT/dir complete, or made now.  *fatal: the output
 * could not be written (the run stops), not a bad video. */
static int folder_video(job_t *j, size_t i, int *frames, int *before, int *fatal, char *m, size_t mlen)
{
    char dir[4200], part[4300], marker[4400];
    snprintf(dir, sizeof dir, "%s/%s", j->o->out, j->dir[i]);
    snprintf(marker, sizeof marker, "%s/" MARKER, dir);
    uint8_t *b;
    size_t n;
    char dummy[128];
    *before = 0;
    if (ps_read_file(marker, &b, &n, dummy, sizeof dummy) == 0) {
        int f = -1;
        char t[32];
        snprintf(t, sizeof t, "%.*s", (int)(n < 31 ? n : 31), (const char *)b);
        free(b);
        if (sscanf(t, "%d", &f) == 1 && f > 0) {
            *frames = f;
            *before = 1;
            return 0;
        }
    }
    snprintf(part, sizeof part, "%s" PARTIAL, dir);
    rm_files_dir(part);
    if (ps_mkdir_p(part) < 0) {
        ps_errf(m, mlen, "%s: %s", part, strerror(errno));
        *fatal = 1;
        return PS_EIO;
    }
    sink_t s = { j, part, NULL, 0 };
    int rc = decode_video(j, i, &s, frames, m, mlen);
    *fatal = s.out_failed;
    if (rc == 0) {
        char text[32];
        snprintf(text, sizeof text, "%d\n", *frames);
        snprintf(marker, sizeof marker, "%s/" MARKER, part);
        /* a folder in the way (no marker: not ours, or never finished) is replaced */
        if (write_whole(marker, text, strlen(text)) < 0 ||
            ((rm_files_dir(dir) < 0 && errno != ENOENT) || rename(part, dir) < 0)) {
            ps_errf(m, mlen, "%s: %s", dir, strerror(errno));
            *fatal = 1;
            rc = PS_EIO;
        }
    }
    if (rc < 0) rm_files_dir(part);
    return rc;
}

/* ---- shards ------------------------------------------------------------------- */

static int shard_path(const ps_video_extract_opts_t *o, size_t s, const char *ext, char *buf, size_t n)
{
    return snprintf(buf, n, "%s/shard-%05zu.%s", o->packed, s, ext);
}

/* Videos in an existing shard's index, -1 if it has none. */
static long shard_videos_done(const ps_video_extract_opts_t *o, size_t s)
{
    char path[4200], m[256];
    uint8_t *b;
    size_t n;
    shard_path(o, s, "idx", path, sizeof path);
    if (ps_read_file(path, &b, &n, m, sizeof m) < 0) return -1;
    long v = n >= 16 && !memcmp(b, "PSVPACK1", 8) && ps_crc32c(0, b, n - 4) ==
             (uint32_t)(b[n - 4] | b[n - 3] << 8 | b[n - 2] << 16 | (uint32_t)b[n - 1] << 24)
                 ? (long)(b[8] | b[9] << 8 | b[10] << 16 | (uint32_t)b[11] << 24) : -1;
    free(b);
    return v;
}

/* Writes shard s from its videos' held frames, then frees them. */
static int write_shard(job_t *j, size_t s, char *m, size_t mlen)
{
    size_t S = (size_t)j->o->shard_videos, i0 = s * S, i1 = i0 + S < j->l->n ? i0 + S : j->l->n;
    ps_pack_builder_t *b = ps_pack_builder_new();
    int rc = b ? 0 : PS_ENOMEM;
    for (size_t i = i0; i < i1 && rc == 0; i++) {
        held_t *h = &j->held[i];
        if (!h->ok) continue;
        const ps_video_entry_t *e = &j->l->v[i];
        ps_pack_video_begin(b, e->name, e->line, e->label);
        size_t off = 0;
        for (int f = 0; f < h->frames && rc == 0; off += h->flen[f], f++)
            rc = ps_pack_frame(b, h->data + off, h->flen[f]);
        ps_pack_video_end(b, rc == 0);
    }
    if (rc == 0) rc = ps_pack_builder_write(b, j->o->packed, s, m, mlen);
    else ps_errf(m, mlen, "shard %zu: %s", s, ps_strerror(rc));
    ps_pack_builder_free(&b);
    for (size_t i = i0; i < i1; i++) {
        free(j->held[i].data);
        free(j->held[i].flen);
        j->held[i].data = NULL;
        j->held[i].flen = NULL;
    }
    return rc;
}

/* ---- the threads ------------------------------------------------------------------ */

static void progress(job_t *j)
{
    double t = ps_now_s();
    if (t - j->t_last < PROGRESS_S) return;
    j->t_last = t;
    ps_info("extract: %zu of %zu videos done (%zu before this run), %zu bad", j->st.extracted +
            j->st.done_before + j->st.bad, j->st.videos, j->st.done_before, j->st.bad);
}

static void *worker(void *arg)
{
    job_t *j = arg;
    char m[1536];
    for (;;) {
        pthread_mutex_lock(&j->mu);
        size_t S = (size_t)j->o->shard_videos;
        while (j->o->packed && j->next < j->l->n && j->shard_done[j->next / S]) j->next++;
        size_t i = j->next++;
        int stop = j->failed || i >= j->l->n;
        pthread_mutex_unlock(&j->mu);
        if (stop) return NULL;
        const ps_video_entry_t *e = &j->l->v[i];
        int frames = 0, before = 0, fatal = 0, rc;
        m[0] = 0;
        if (j->o->packed) {
            sink_t s = { j, NULL, &j->held[i], 0 };
            rc = decode_video(j, i, &s, &frames, m, sizeof m);
            j->held[i].frames = frames;
            j->held[i].ok = rc == 0;
        } else {
            rc = folder_video(j, i, &frames, &before, &fatal, m, sizeof m);
        }
        if (fatal) {
            pthread_mutex_lock(&j->mu);
            if (!j->failed) ps_errf(j->err, j->errlen, "%s", m);
            j->failed = 1;
            pthread_mutex_unlock(&j->mu);
            return NULL;
        }
        if (rc < 0) ps_error("%s:%d: video '%s': %s", j->o->list, e->line, e->name, m);
        pthread_mutex_lock(&j->mu);
        j->l->v[i].frames = frames;
        j->ok[i] = rc == 0;
        if (rc < 0) j->st.bad++;
        else if (before) j->st.done_before++;
        else j->st.extracted++, j->st.frames += (size_t)frames;
        int last = j->o->packed && --j->shard_left[i / S] == 0;
        progress(j);
        pthread_mutex_unlock(&j->mu);
        if (last && (rc = write_shard(j, i / S, m, sizeof m)) < 0) {
            pthread_mutex_lock(&j->mu);
            if (!j->failed) ps_errf(j->err, j->errlen, "%s", m);
            j->failed = 1;
            pthread_mutex_unlock(&j->mu);
        }
    }
}

/* ---- the run ---------------------------------------------------------------------- */

/* OUT/<list name>.txt: the finished videos in list order. */
static int write_list(job_t *j, char *err, size_t errlen)
{
    const char *base = strrchr(j->o->list, '/');
    base = base ? base + 1 : j->o->list;
    char name[1024], path[4200];
    snprintf(name, sizeof name, "%s", base);
    char *dot = strrchr(name, '.');
    if (dot && dot != name) *dot = 0;
    snprintf(path, sizeof path, "%s/%s.txt", j->o->out, name);
    struct stat a, b;
    if (stat(path, &a) == 0 && stat(j->o->list, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
        ps_errf(err, errlen, "the output list %s would overwrite the input list: use another --out", path);
        return PS_EINVAL;
    }
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap);
    for (size_t i = 0; text && i < j->l->n; i++) {
        if (!j->ok[i]) continue;
        size_t need = strlen(j->dir[i]) + 40;
        if (n + need > cap) {
            while (n + need > cap) cap *= 2;
            char *nt = realloc(text, cap);
            if (!nt) { free(text); text = NULL; break; }
            text = nt;
        }
        n += (size_t)snprintf(text + n, cap - n, "%s %d %d\n", j->dir[i], j->l->v[i].frames, j->l->v[i].label);
    }
    if (!text) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    text[n] = 0;
    int rc = ps_write_file_atomic1(path, text, n, "extraction", err, errlen);
    free(text);
    if (rc == 0) ps_info("wrote %s", path);
    return rc;
}

/* Frame folders for the folder layout; two videos may not share one. */
static int plan_folders(job_t *j, char *err, size_t errlen)
{
    size_t n = j->l->n;
    size_t *ord = malloc(sizeof *ord * n);
    if (!(j->dir = calloc(n, sizeof *j->dir)) || !ord) { free(ord); ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    char m[1024];
    for (size_t i = 0; i < n; i++) {
        ord[i] = i;
        if (!(j->dir[i] = frame_dir(j->l->v[i].name, m, sizeof m))) {
            ps_errf(err, errlen, "%s:%d: %s", j->o->list, j->l->v[i].line, m);
            free(ord);
            return PS_EINVAL;
        }
    }
    qsort_r(ord, n, sizeof *ord, cmp_dir, j->dir);
    int rc = 0;
    for (size_t k = 1; k < n && rc == 0; k++)
        if (!strcmp(j->dir[ord[k]], j->dir[ord[k - 1]])) {
            size_t a = ord[k - 1] < ord[k] ? ord[k - 1] : ord[k], b = ord[k - 1] ^ ord[k] ^ a;
            ps_errf(err, errlen, "%s:%d and line %d: '%s' and '%s' would share the frame folder '%s'",
                    j->o->list, j->l->v[a].line, j->l->v[b].line, j->l->v[a].name, j->l->v[b].name, j->dir[a]);
            rc = PS_EINVAL;
        }
    free(ord);
    return rc;
}

/* Packed: which shards are complete, how many videos each still needs. */
static int plan_shards(job_t *j, char *err, size_t errlen)
{
    size_t S = (size_t)j->o->shard_videos, ns = (j->l->n + S - 1) / S;
    j->held = calloc(j->l->n, sizeof *j->held);
    j->shard_left = calloc(ns, sizeof *j->shard_left);
    j->shard_done = calloc(ns, sizeof *j->shard_done);
    if (!j->held || !j->shard_left || !j->shard_done) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    for (size_t s = 0; s < ns; s++) {
        size_t i0 = s * S, i1 = i0 + S < j->l->n ? i0 + S : j->l->n;
        long v = shard_videos_done(j->o, s);
        j->shard_left[s] = (int)(i1 - i0);
        if (v < 0) continue;
        j->shard_done[s] = 1;
        j->st.done_before += (size_t)v;
        j->st.bad += i1 - i0 - (size_t)v;
        if (i1 - i0 > (size_t)v)
            ps_warn("%s: %zu of its %zu videos failed in an earlier run (not retried: remove the shard "
                    "to try them again)", j->o->packed, i1 - i0 - (size_t)v, i1 - i0);
    }
    return 0;
}

int ps_video_extract(const ps_video_extract_opts_t *o, ps_video_extract_stats_t *st, char *err, size_t errlen)
{
    job_t j = { .o = o, .err = err, .errlen = errlen };
    memset(st, 0, sizeof *st);
    const char *outdir = o->packed ? o->packed : o->out;
    if (!o->list || !outdir || (o->out && o->packed)) {
        ps_errf(err, errlen, "extract needs --list and one of --out DIR (frame folders) or --packed DIR (shards)");
        return PS_EINVAL;
    }
    if (o->short_side < 0 || o->short_side > 8192 || !(o->fps >= 0 && o->fps <= 1000) || o->threads < 0 ||
        o->threads > 1024 || o->quality < 1 || o->quality > 100 || o->shard_videos < 1) {
        ps_errf(err, errlen, "extract options out of range: --short-side 0..8192, --fps 0..1000, --threads "
                "0..1024, --quality 1..100, --shard-videos >= 1");
        return PS_EINVAL;
    }
    if (!(j.l = ps_video_list_alloc(o->list, o->root, NULL))) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    int rc = ps_video_list_read(o->list, 0, 0, j.l, NULL, NULL, err, errlen);
    if (rc == 0 && j.l->n == 0) { ps_errf(err, errlen, "%s: no videos in the list", o->list); rc = PS_EINVAL; }
    j.st.videos = j.l->n;
    if (rc == 0 && !(j.ok = calloc(j.l->n, sizeof *j.ok))) { ps_errf(err, errlen, "out of memory"); rc = PS_ENOMEM; }
    if (rc == 0) rc = o->packed ? 0 : plan_folders(&j, err, errlen);
    if (rc == 0 && ps_mkdir_p(outdir) < 0) {
        ps_errf(err, errlen, "%s: %s", outdir, strerror(errno));
        rc = PS_EIO;
    }
    if (rc == 0) {
        char conf[512];
        int k = snprintf(conf, sizeof conf, "short_side=%d\nfps=%g\nquality=%d\n", o->short_side, o->fps,
                         o->quality);
        if (o->packed) {
            uint8_t *b;
            size_t n;
            rc = ps_read_file(o->list, &b, &n, err, errlen);
            if (rc == 0) {
                snprintf(conf + k, sizeof conf - (size_t)k, "shard_videos=%d\nlist_crc32c=%08x\n", o->shard_videos,
                         ps_crc32c(0, b, n));
                free(b);
            }
        }
        if (rc == 0) rc = check_conf(outdir, conf, err, errlen);
    }
    if (rc == 0 && o->packed) rc = plan_shards(&j, err, errlen);
    if (rc == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int nt = o->threads > 0 ? o->threads : cores > 0 ? (int)cores : 1;
        pthread_t *th = calloc((size_t)nt, sizeof *th);
        int started = 0;
        pthread_mutex_init(&j.mu, NULL);
        j.t_last = ps_now_s();
        for (; th && started < nt; started++)
            if (pthread_create(&th[started], NULL, worker, &j) != 0) break;
        if (started == 0) worker(&j);
        for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
        free(th);
        pthread_mutex_destroy(&j.mu);
        if (j.failed) rc = PS_EIO;
    }
    if (rc == 0 && !o->packed) rc = write_list(&j, err, errlen);
    *st = j.st;
    if (j.dir)
        for (size_t i = 0; i < j.l->n; i++) free(j.dir[i]);
    if (j.held)
        for (size_t i = 0; i < j.l->n; i++) free(j.held[i].data), free(j.held[i].flen);
    free(j.dir), free(j.held), free(j.ok), free(j.shard_left), free(j.shard_done);
    ps_video_list_free(&j.l);
    return rc;
}
