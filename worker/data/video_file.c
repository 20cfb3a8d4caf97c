/* Video files through FFmpeg's libraries: the probe (every packet of the
 * video stream, demuxed but not decoded) and the decoder that seeks to
 * keyframes and decodes forward to the wanted frames.  Frame numbering,
 * the --fps rule and the pixels are documented in video_file.h. */
#include "worker/data/video_file.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/video_file_int.h"

/* Slack on frame times: a frame shown at exactly k/F counts for frame k. */
#define TIME_EPS 1e-4

struct ps_vfile_index {
    int n;               /* source frames, presentation order */
    int has_ts;          /* timestamps usable: positions from pts, seeking allowed */
    int64_t pts0;        /* first frame's pts (stream time base) */
    double dur;          /* constant-rate stream: frame duration in ticks (0: table) */
    int64_t *off;        /* variable rate: pts - pts0 per position */
    double tb;           /* seconds per tick */
    int nkey;
    int32_t *key;        /* keyframe positions, ascending */
    int width, height;
};

/* ---- FFmpeg's log into ours ---------------------------------------------------- */

static void av_log_cb(void *avcl, int level, const char *fmt, va_list ap)
{
    (void)avcl;
    if (level > AV_LOG_WARNING || ps_log_level < PS_LOG_DEBUG) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    if (n) ps_debug("ffmpeg: %s", line);
}

static void log_init_once(void) { av_log_set_callback(av_log_cb); }

/* FFmpeg's messages go to our log at debug level: our own errors name the
 * file and what failed, FFmpeg's detail is there when asked for. */
void ps_vfile_log_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, log_init_once);
}

void ps_vfile_averr(int rc, char *buf, size_t n)
{
    if (av_strerror(rc, buf, n) < 0) snprintf(buf, n, "FFmpeg error %d", rc);
}

/* ---- opening a file ---------------------------------------------------------- */

int ps_vfile_open(const char *path, AVFormatContext **fmt, int *stream, char *err, size_t errlen)
{
    char m[256];
    struct stat st;
    ps_vfile_log_init();
    *fmt = NULL;
    if (stat(path, &st) != 0) {
        ps_errf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    /* local files only: "file:" so a name with a colon is not taken for a
     * protocol, and no protocol but file for what a container may refer
     * to (an HLS or concat "video" naming URLs) */
    char url[4200];
    AVDictionary *opts = NULL;
    snprintf(url, sizeof url, "file:%s", path);
    av_dict_set(&opts, "protocol_whitelist", "file", 0);
    int rc = avformat_open_input(fmt, url, NULL, &opts);
    av_dict_free(&opts);
    if (rc < 0) {
        ps_vfile_averr(rc, m, sizeof m);
        ps_errf(err, errlen, "%s: not a video file FFmpeg can read: %s", path, m);
        return PS_ECORRUPT;
    }
    AVFormatContext *f = *fmt;
    int si = av_find_best_stream(f, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    /* Headers without the picture size (rare) need the decoder's look. */
    if (si >= 0 && f->streams[si]->codecpar->width <= 0 && (rc = avformat_find_stream_info(f, NULL)) < 0) {
        ps_vfile_averr(rc, m, sizeof m);
        ps_errf(err, errlen, "%s: cannot read the stream parameters: %s", path, m);
        avformat_close_input(fmt);
        return PS_ECORRUPT;
    }
    if (si < 0 || (f->streams[si]->disposition & AV_DISPOSITION_ATTACHED_PIC)) {
        ps_errf(err, errlen, "%s: no video stream (%s with %u stream(s)%s)", path, f->iformat->name,
                f->nb_streams, si >= 0 ? ", only a cover picture" : "");
        avformat_close_input(fmt);
        return PS_ECORRUPT;
    }
    for (unsigned i = 0; i < f->nb_streams; i++)
        if ((int)i != si) f->streams[i]->discard = AVDISCARD_ALL;
    *stream = si;
    return 0;
}

/* ---- the probe ---------------------------------------------------------------- */

typedef struct pkt_rec { int64_t ts; int key; } pkt_rec_t;

static int cmp_rec(const void *a, const void *b)
{
    int64_t x = ((const pkt_rec_t *)a)->ts, y = ((const pkt_rec_t *)b)->ts;
    return x < y ? -1 : x > y;
}

/* Packets of the stream, the ones a decoder turns into pictures. */
static int read_packets(AVFormatContext *f, int si, const char *path, pkt_rec_t **out, int *n,
                        int *all_ts, int *skipped, char *err, size_t errlen)
{
    AVPacket *pkt = av_packet_alloc();
    pkt_rec_t *r = NULL;
    int cap = 0, rc = 0;
    char m[256];
    *n = 0;
    *all_ts = 1;
    *skipped = 0;
    if (!pkt) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    for (;;) {
        int e = av_read_frame(f, pkt);
        if (e == AVERROR_EOF) break;
        if (e < 0) {
            ps_vfile_averr(e, m, sizeof m);
            ps_errf(err, errlen, "%s: damaged container after %d video packets: %s", path, *n, m);
            rc = PS_ECORRUPT;
            break;
        }
        /* Empty packets (AVI's dropped frames) and the pre-roll an edit list
         * discards never become pictures. */
        if (pkt->stream_index == si && (pkt->size == 0 || (pkt->flags & AV_PKT_FLAG_DISCARD))) (*skipped)++;
        else if (pkt->stream_index == si) {
            if (pkt->flags & AV_PKT_FLAG_CORRUPT) {
                ps_errf(err, errlen, "%s: video packet %d is marked corrupt by the demuxer", path, *n);
                rc = PS_ECORRUPT;
                av_packet_unref(pkt);
                break;
            }
            if (*n == cap) {
                int nc = cap ? cap * 2 : 256;
                pkt_rec_t *nr = realloc(r, sizeof *r * (size_t)nc);
                if (!nr) { rc = PS_ENOMEM; ps_errf(err, errlen, "out of memory"); av_packet_unref(pkt); break; }
                r = nr;
                cap = nc;
            }
            /* presentation times only: a decode time stands for none (AVI
             * gives B-frames no pts; mixing the two misplaces frames) */
            if (pkt->pts == AV_NOPTS_VALUE) *all_ts = 0;
            r[*n].ts = pkt->pts;
            r[*n].key = (pkt->flags & AV_PKT_FLAG_KEY) != 0;
            (*n)++;
        }
        av_packet_unref(pkt);
    }
    av_packet_free(&pkt);
    if (rc < 0) { free(r); return rc; }
    *out = r;
    return 0;
}

/* Positions, times and keyframes from the packets' records. */
static int build_index(ps_vfile_index_t *ix, pkt_rec_t *r, int n, int all_ts, const AVStream *st)
{
    ix->n = n;
    ix->has_ts = all_ts;
    if (all_ts) {
        qsort(r, (size_t)n, sizeof *r, cmp_rec);
        for (int i = 1; i < n; i++)
            if (r[i].ts == r[i - 1].ts) ix->has_ts = 0; /* duplicate times: no position from pts */
    }
    if (ix->has_ts) {
        ix->tb = av_q2d(st->time_base);
        ix->pts0 = r[0].ts;
        ix->dur = n > 1 ? (double)(r[n - 1].ts - r[0].ts) / (n - 1) : 1;
        /* constant rate within a quarter frame (a millisecond time base
         * rounds 30 fps to 33/34 ms): no table */
        for (int i = 0; i < n && ix->dur > 0; i++)
            if (fabs((double)(r[i].ts - ix->pts0) - i * ix->dur) > ix->dur / 4) ix->dur = 0;
        if (ix->dur <= 0) {
            ix->dur = 0;
            if (!(ix->off = malloc(sizeof(int64_t) * (size_t)n))) return PS_ENOMEM;
            for (int i = 0; i < n; i++) ix->off[i] = r[i].ts - ix->pts0;
        }
    } else {
        /* decode order, times from the nominal rate */
        AVRational fr = st->avg_frame_rate.num > 0 ? st->avg_frame_rate : st->r_frame_rate;
        ix->tb = fr.num > 0 && fr.den > 0 ? av_q2d(av_inv_q(fr)) : 1.0 / 25;
        ix->pts0 = 0;
        ix->dur = 1;
    }
    int nk = 0;
    for (int i = 0; i < n; i++) nk += r[i].key;
    ix->key = malloc(sizeof(int32_t) * (size_t)(nk ? nk : 1));
    if (!ix->key) return PS_ENOMEM;
    /* with timestamps r is sorted by time, so i is the keyframe's position;
     * without, keyframes are unused (no seeking) */
    for (int i = 0; i < n; i++)
        if (r[i].key) ix->key[ix->nkey++] = i;
    return 0;
}

/* Seconds from the first frame to position j. */
static double frame_time(const ps_vfile_index_t *ix, int j)
{
    return (ix->off ? (double)ix->off[j] : j * ix->dur) * ix->tb;
}

/* The video's length as its container declares it (seconds), and how far
 * the frames may fall short of it; -1 when nothing is declared.  A cut
 * file keeps the header of the whole one, which is how truncation shows
 * where the demuxer reads on to the end without a complaint (Matroska). */
static double declared_length(const AVFormatContext *f, const AVStream *st, double *slack)
{
    *slack = 0.05;
    if (st->duration != AV_NOPTS_VALUE && st->duration > 0) return (double)st->duration * av_q2d(st->time_base);
    const AVDictionaryEntry *t = av_dict_get(st->metadata, "DURATION", NULL, 0);
    int hh, mm;
    double ss;
    if (t && sscanf(t->value, "%d:%d:%lf", &hh, &mm, &ss) == 3) return hh * 3600.0 + mm * 60.0 + ss;
    if (f->duration == AV_NOPTS_VALUE || f->duration <= 0) return -1;
    /* the whole file's length: other streams may run longer */
    double d = (double)f->duration / AV_TIME_BASE;
    *slack = d / 10 > 1 ? d / 10 : 1;
    return d;
}

/* A file that holds less than its header promises: PS_ECORRUPT. */
static int check_complete(const ps_vfile_index_t *ix, int skipped, const AVFormatContext *f,
                          const AVStream *st, const char *path, char *err, size_t errlen)
{
    /* the header counts the packets a reader skips too */
    if (st->nb_frames > 0 && ix->n + skipped < st->nb_frames) {
        ps_errf(err, errlen, "%s: holds %d of the %lld video frames its header declares (truncated?)", path,
                ix->n + skipped, (long long)st->nb_frames);
        return PS_ECORRUPT;
    }
    if (st->nb_frames > 0 || !ix->has_ts) return 0;
    double slack, want = declared_length(f, st, &slack);
    double frame = ix->n > 1 ? frame_time(ix, ix->n - 1) / (ix->n - 1) : 0;
    double have = frame_time(ix, ix->n - 1) + frame;
    if (want > 0 && have + 2 * frame + slack < want) {
        ps_errf(err, errlen, "%s: its frames end at %.2f s of the %.2f s its header declares (truncated?)",
                path, have, want);
        return PS_ECORRUPT;
    }
    return 0;
}

int ps_vfile_probe(const char *path, ps_vfile_index_t **out, char *err, size_t errlen)
{
    AVFormatContext *f;
    int si, n = 0, all_ts, skipped, rc;
    pkt_rec_t *r = NULL;
    *out = NULL;
    if ((rc = ps_vfile_open(path, &f, &si, err, errlen)) < 0) return rc;
    rc = read_packets(f, si, path, &r, &n, &all_ts, &skipped, err, errlen);
    if (rc == 0 && n == 0) {
        ps_errf(err, errlen, "%s: the video stream holds no frames", path);
        rc = PS_ECORRUPT;
    }
    if (rc == 0 && !avcodec_find_decoder(f->streams[si]->codecpar->codec_id)) {
        ps_errf(err, errlen, "%s: no decoder for codec '%s' in this FFmpeg", path,
                avcodec_get_name(f->streams[si]->codecpar->codec_id));
        rc = PS_EUNSUPPORTED;
    }
    ps_vfile_index_t *ix = NULL;
    if (rc == 0 && !(ix = calloc(1, sizeof *ix))) rc = PS_ENOMEM;
    if (rc == 0) {
        ix->width = f->streams[si]->codecpar->width;
        ix->height = f->streams[si]->codecpar->height;
        rc = build_index(ix, r, n, all_ts, f->streams[si]);
        if (rc == PS_ENOMEM) ps_errf(err, errlen, "out of memory");
        if (rc == 0) rc = check_complete(ix, skipped, f, f->streams[si], path, err, errlen);
    }
    free(r);
    avformat_close_input(&f);
    if (rc < 0) { ps_vfile_index_free(&ix); return rc; }
    *out = ix;
    return 0;
}

void ps_vfile_index_free(ps_vfile_index_t **ixp)
{
    ps_vfile_index_t *ix = *ixp;
    if (!ix) return;
    free(ix->off);
    free(ix->key);
    free(ix);
    *ixp = NULL;
}

int ps_vfile_source_frames(const ps_vfile_index_t *ix) { return ix->n; }
int ps_vfile_keyframes(const ps_vfile_index_t *ix) { return ix->nkey; }
void ps_vfile_size(const ps_vfile_index_t *ix, int *w, int *h) { *w = ix->width; *h = ix->height; }

int ps_vfile_frames(const ps_vfile_index_t *ix, double fps)
{
    if (fps <= 0) return ix->n;
    double n = floor((frame_time(ix, ix->n - 1) + TIME_EPS) * fps) + 1;
    return n > 1e7 ? 10000000 : (int)n;
}

int ps_vfile_source_frame(const ps_vfile_index_t *ix, double fps, int k)
{
    if (fps <= 0) return k - 1;
    double t = (k - 1) / fps + TIME_EPS;
    int lo = 0, hi = ix->n - 1;   /* the last j with frame_time(j) <= t */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (frame_time(ix, mid) <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Position of a decoded picture's timestamp, -1 if it is not a frame the
 * probe saw. */
static int position_of(const ps_vfile_index_t *ix, int64_t ts)
{
    int64_t d = ts - ix->pts0;
    if (!ix->off) {
        long j = lround((double)d / ix->dur);
        return j >= 0 && j < ix->n && fabs((double)d - j * ix->dur) <= ix->dur / 4 ? (int)j : -1;
    }
    int lo = 0, hi = ix->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (ix->off[mid] == d) return mid;
        if (ix->off[mid] < d) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* The last keyframe at or before position j (0 if none). */
static int keyframe_before(const ps_vfile_index_t *ix, int j)
{
    int k = 0;
    for (int lo = 0, hi = ix->nkey - 1; lo <= hi;) {
        int mid = lo + (hi - lo) / 2;
        if (ix->key[mid] <= j) { k = ix->key[mid]; lo = mid + 1; }
        else hi = mid - 1;
    }
    return k;
}

/* ---- decoding ----------------------------------------------------------------- */

typedef struct dec {
    const char *path;
    const ps_vfile_index_t *ix;
    AVFormatContext *f;
    AVCodecContext *cc;
    AVPacket *pkt;
    AVFrame *fr;
    struct SwsContext *sws;
    int si;
    int draining;        /* the end of the file was sent to the decoder */
    long decoded;        /* pictures out of the decoder */
    uint8_t *rgb, *out;  /* decoded size, output size */
    size_t rgb_cap, out_cap;
} dec_t;

static void dec_close(dec_t *d)
{
    avcodec_free_context(&d->cc);
    avformat_close_input(&d->f);
    d->draining = 0;
}

static int dec_open(dec_t *d, char *err, size_t errlen)
{
    int rc = ps_vfile_open(d->path, &d->f, &d->si, err, errlen);
    if (rc < 0) return rc;
    const AVCodecParameters *par = d->f->streams[d->si]->codecpar;
    const AVCodec *codec = avcodec_find_decoder(par->codec_id);
    char m[256];
    int e = AVERROR_DECODER_NOT_FOUND;
    if (!codec || !(d->cc = avcodec_alloc_context3(codec)) ||
        (e = avcodec_parameters_to_context(d->cc, par)) < 0 ||
        /* one thread per decoder: the loader and the extractor run many */
        (d->cc->thread_count = 1, d->cc->pkt_timebase = d->f->streams[d->si]->time_base,
         (e = avcodec_open2(d->cc, codec, NULL)) < 0)) {
        ps_vfile_averr(e, m, sizeof m);
        ps_errf(err, errlen, "%s: cannot open the %s decoder: %s", d->path, avcodec_get_name(par->codec_id), m);
        dec_close(d);
        return PS_EUNSUPPORTED;
    }
    return 0;
}

/* The next picture into d->fr: 1, 0 at the end, or a negative PS_E*. */
static int dec_next(dec_t *d, char *err, size_t errlen)
{
    char m[256];
    for (;;) {
        int e = avcodec_receive_frame(d->cc, d->fr);
        if (e == 0) return 1;
        if (e == AVERROR_EOF) return 0;
        if (e != AVERROR(EAGAIN)) goto decode_error;
        if (d->draining) return 0;
        e = av_read_frame(d->f, d->pkt);
        if (e == AVERROR_EOF) {
            d->draining = 1;
            avcodec_send_packet(d->cc, NULL);
            continue;
        }
        if (e < 0) {
            ps_vfile_averr(e, m, sizeof m);
            ps_errf(err, errlen, "%s: read error: %s", d->path, m);
            return PS_ECORRUPT;
        }
        /* a packet to discard (an edit list's pre-roll) is still decoded:
         * later frames may refer to it; its picture comes out flagged */
        if (d->pkt->stream_index != d->si || d->pkt->size == 0) {
            av_packet_unref(d->pkt);
            continue;
        }
        e = avcodec_send_packet(d->cc, d->pkt);
        av_packet_unref(d->pkt);
        if (e < 0 && e != AVERROR(EAGAIN)) goto decode_error;
        continue;
    decode_error:
        ps_vfile_averr(e, m, sizeof m);
        ps_errf(err, errlen, "%s: decoding failed: %s", d->path, m);
        return PS_ECORRUPT;
    }
}

static int dec_seek(dec_t *d, int pos)
{
    const ps_vfile_index_t *ix = d->ix;
    int64_t ts = ix->pts0 + (ix->off ? ix->off[pos] : llround(pos * ix->dur));
    int e = av_seek_frame(d->f, d->si, ts, AVSEEK_FLAG_BACKWARD);
    if (e < 0) return -1;
    avcodec_flush_buffers(d->cc);
    d->draining = 0;
    return 0;
}

/* The full-range pixel format a deprecated "J" format stands for. */
static enum AVPixelFormat unj(enum AVPixelFormat f, int *full)
{
    static const enum AVPixelFormat map[][2] = {
        { AV_PIX_FMT_YUVJ420P, AV_PIX_FMT_YUV420P }, { AV_PIX_FMT_YUVJ422P, AV_PIX_FMT_YUV422P },
        { AV_PIX_FMT_YUVJ444P, AV_PIX_FMT_YUV444P }, { AV_PIX_FMT_YUVJ440P, AV_PIX_FMT_YUV440P },
        { AV_PIX_FMT_YUVJ411P, AV_PIX_FMT_YUV411P },
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i][0] == f) { *full = 1; return map[i][1]; }
    return f;
}

/* d->fr as RGB8 at the output size in d->out (*w x *h). */
static int dec_convert(dec_t *d, const ps_vfile_opts_t *o, int *w, int *h, char *err, size_t errlen)
{
    AVFrame *fr = d->fr;
    int fw = fr->width, fh = fr->height, full = fr->color_range == AVCOL_RANGE_JPEG;
    enum AVPixelFormat pf = unj((enum AVPixelFormat)fr->format, &full);
    d->sws = sws_getCachedContext(d->sws, fw, fh, pf, fw, fh, AV_PIX_FMT_RGB24,
                                  SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, NULL, NULL, NULL);
    size_t need = (size_t)fw * fh * 3;
    if (!d->sws) {
        ps_errf(err, errlen, "%s: no conversion from %s to RGB", d->path, av_get_pix_fmt_name(pf));
        return PS_EUNSUPPORTED;
    }
    if (need > d->rgb_cap) {
        free(d->rgb);
        if (!(d->rgb = malloc(need))) { d->rgb_cap = 0; ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
        d->rgb_cap = need;
    }
    const int *coef = sws_getCoefficients(fr->colorspace);
    sws_setColorspaceDetails(d->sws, coef, full, sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
    uint8_t *dst[4] = { d->rgb, NULL, NULL, NULL };
    int stride[4] = { fw * 3, 0, 0, 0 };
    sws_scale(d->sws, (const uint8_t *const *)fr->data, fr->linesize, 0, fh, dst, stride);
    int S = o->short_side, ow = fw, oh = fh;
    if (S > 0 && (fw < fh ? fw : fh) != S) {
        if (fw <= fh) { ow = S; oh = (int)((long long)fh * S / fw); }
        else { oh = S; ow = (int)((long long)fw * S / fh); }
    }
    *w = ow;
    *h = oh;
    if (ow == fw && oh == fh) {
        uint8_t *t = d->out; size_t c = d->out_cap;
        d->out = d->rgb; d->out_cap = d->rgb_cap;
        d->rgb = t; d->rgb_cap = c;
        return 0;
    }
    need = (size_t)ow * oh * 3;
    if (need > d->out_cap) {
        free(d->out);
        if (!(d->out = malloc(need))) { d->out_cap = 0; ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
        d->out_cap = need;
    }
    int rc = ps_image_resize(d->rgb, fw * 3, fw, fh, d->out, ow, oh);
    if (rc < 0) ps_errf(err, errlen, "%s: resize %dx%d -> %dx%d failed", d->path, fw, fh, ow, oh);
    return rc;
}

/* Decodes forward to source position s; 1 when d->fr holds it, 0 when the
 * decoder went past it or the file ended, <0 on an error.  *cur follows
 * the decoded positions. */
static int dec_reach(dec_t *d, int s, int *cur, char *err, size_t errlen)
{
    for (;;) {
        int rc = dec_next(d, err, errlen);
        if (rc <= 0) return rc;
        d->decoded++;
        if (d->fr->flags & AV_FRAME_FLAG_DISCARD) continue; /* not a frame of the video (probe) */
        int pos;
        if (d->ix->has_ts) {
            int64_t ts = d->fr->best_effort_timestamp;
            pos = ts == AV_NOPTS_VALUE ? -1 : position_of(d->ix, ts);
            if (pos < 0) {
                ps_errf(err, errlen, "%s: the decoder gave a picture at time %lld the probe did not see",
                        d->path, (long long)ts);
                return PS_ECORRUPT;
            }
        } else {
            pos = *cur + 1;
        }
        *cur = pos;
        if (pos == s) return 1;
        if (pos > s) return 0;
    }
}

int ps_vfile_decode(const char *path, const ps_vfile_index_t *ix, const ps_vfile_opts_t *o,
                    const int *want, int n, ps_vfile_frame_fn fn, void *user, char *err, size_t errlen)
{
    dec_t d = { .path = path, .ix = ix };
    int rc = 0, cur = -1, have = -1, retried = 0, w = 0, h = 0;
    int nout = ps_vfile_frames(ix, o->fps);
    for (int k = 0; k < n; k++)
        if (want[k] < 1 || want[k] > nout || (k && want[k] < want[k - 1])) {
            ps_errf(err, errlen, "%s: frame %d requested of %d (requests must ascend)", path, want[k], nout);
            return PS_ERANGE;
        }
    if (!(d.pkt = av_packet_alloc()) || !(d.fr = av_frame_alloc())) {
        ps_errf(err, errlen, "out of memory");
        rc = PS_ENOMEM;
    }
    if (rc == 0) rc = dec_open(&d, err, errlen);
    for (int k = 0; k < n && rc == 0; k++) {
        int s = ps_vfile_source_frame(ix, o->fps, want[k]);
        if (s != have) {
            /* a keyframe ahead of the decoder and at or before s: jump to it */
            int kf = keyframe_before(ix, s);
            if (ix->has_ts && !retried && kf > cur + 1 && s > cur && dec_seek(&d, kf) == 0) cur = kf - 1;
            rc = dec_reach(&d, s, &cur, err, errlen);
            if (rc == 0 && !retried) {
                /* a seek that landed past s, or a file that ends early: once
                 * more from the start, decoding every frame */
                ps_debug("%s: frame at position %d missed (decoder at %d); decoding from the start", path, s, cur);
                retried = 1;
                dec_close(&d);
                cur = -1;
                rc = dec_open(&d, err, errlen);
                if (rc == 0) rc = dec_reach(&d, s, &cur, err, errlen);
            }
            if (rc == 0) {
                ps_errf(err, errlen, "%s: frame %d (position %d of %d) was not decoded: the file ends "
                        "early or is damaged", path, want[k], s + 1, ix->n);
                rc = PS_ECORRUPT;
            }
            if (rc < 0) break;
            rc = dec_convert(&d, o, &w, &h, err, errlen);
            if (rc < 0) break;
            have = s;
        }
        rc = fn(k, d.out, w, h, user, err, errlen);
    }
    if (o->decoded) *o->decoded += d.decoded;
    dec_close(&d);
    sws_freeContext(d.sws);
    av_packet_free(&d.pkt);
    av_frame_free(&d.fr);
    free(d.rgb);
    free(d.out);
    return rc;
}
