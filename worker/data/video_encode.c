/* Writing video files (psdata gen-video --container, the tests' videos):
 * RGB8 pictures converted to YUV 4:2:0 by libswscale and encoded with
 * FFmpeg's own MPEG-4 part 2 encoder (in every FFmpeg build, unlike the
 * H.264 encoders), muxed by libavformat into the container the file name's
 * extension names. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libswscale/swscale.h>

#include "ps_error.h"
#include "worker/data/ps_image.h"
#include "worker/data/video_file.h"
#include "worker/data/video_file_int.h"

typedef struct enc {
    AVFormatContext *oc;
    AVCodecContext *cc;
    AVStream *st;
    AVPacket *pkt;
} enc_t;

/* Sends one picture (NULL: the end) and writes the packets that come out. */
static int put_frame(enc_t *e, AVFrame *fr)
{
    int rc = avcodec_send_frame(e->cc, fr);
    while (rc >= 0) {
        rc = avcodec_receive_packet(e->cc, e->pkt);
        if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return 0;
        if (rc < 0) break;
        /* without a duration mp4's edit list ends at the last frame's
         * start and a reader drops that frame */
        if (e->pkt->duration <= 0) e->pkt->duration = 1;
        av_packet_rescale_ts(e->pkt, e->cc->time_base, e->st->time_base);
        e->pkt->stream_index = e->st->index;
        rc = av_interleaved_write_frame(e->oc, e->pkt);
    }
    return rc;
}

int ps_vfile_write(const char *path, int w, int h, int n, const ps_vfile_enc_t *enc,
                   ps_vfile_source_fn frame, void *user, char *err, size_t errlen)
{
    int fps = enc->fps, gop = enc->gop, q = enc->q;
    char tmp[4200], m[256];
    enc_t e = { 0 };
    AVFrame *fr = NULL;
    struct SwsContext *sws = NULL;
    uint8_t *rgb = NULL;
    int rc = 0, av = 0;
    const char *what = "";
    ps_vfile_log_init();
    if (w < 16 || h < 16 || (w | h) & 1 || n < 1 || fps < 1 || gop < 1 || q < 2 || q > 31 ||
        enc->bframes < 0 || enc->bframes > 8) {
        ps_errf(err, errlen, "%s: bad video parameters %dx%d (even, >= 16), %d frames, %d fps, gop %d, q %d "
                "(2..31), %d B-frames (0..8)", path, w, h, n, fps, gop, q, enc->bframes);
        return PS_EINVAL;
    }
    const AVOutputFormat *of = av_guess_format(NULL, path, NULL);
    const AVCodec *codec = avcodec_find_encoder(AV_CODEC_ID_MPEG4);
    if (!of || !codec) {
        ps_errf(err, errlen, "%s: %s", path, !of ? "no FFmpeg container for this file name's extension"
                                              : "this FFmpeg has no MPEG-4 part 2 encoder");
        return PS_EUNSUPPORTED;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
#define TRY(call, name) do { what = name; if ((av = (call)) < 0) goto fail; } while (0)
    TRY(avformat_alloc_output_context2(&e.oc, of, NULL, tmp), "container");
    if (!(e.st = avformat_new_stream(e.oc, NULL)) || !(e.cc = avcodec_alloc_context3(codec)) ||
        !(e.pkt = av_packet_alloc()) || !(fr = av_frame_alloc()) || !(rgb = malloc((size_t)w * h * 3))) {
        rc = PS_ENOMEM;
        ps_errf(err, errlen, "out of memory");
        goto done;
    }
    e.cc->width = w;
    e.cc->height = h;
    e.cc->pix_fmt = AV_PIX_FMT_YUV420P;
    e.cc->time_base = (AVRational){ 1, fps };
    e.cc->framerate = (AVRational){ fps, 1 };
    e.cc->gop_size = gop;
    e.cc->max_b_frames = enc->bframes;
    e.cc->flags |= AV_CODEC_FLAG_QSCALE;
    e.cc->global_quality = FF_QP2LAMBDA * q;
    if (e.oc->oformat->flags & AVFMT_GLOBALHEADER) e.cc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    e.st->time_base = e.cc->time_base;
    TRY(avcodec_open2(e.cc, codec, NULL), "encoder");
    TRY(avcodec_parameters_from_context(e.st->codecpar, e.cc), "stream parameters");
    TRY(avio_open(&e.oc->pb, tmp, AVIO_FLAG_WRITE), "open");
    TRY(avformat_write_header(e.oc, NULL), "header");
    fr->format = AV_PIX_FMT_YUV420P;
    fr->width = w;
    fr->height = h;
    TRY(av_frame_get_buffer(fr, 0), "frame buffer");
    sws = sws_getContext(w, h, AV_PIX_FMT_RGB24, w, h, AV_PIX_FMT_YUV420P, SWS_BILINEAR | SWS_ACCURATE_RND,
                         NULL, NULL, NULL);
    if (!sws) { rc = PS_ENOMEM; ps_errf(err, errlen, "out of memory"); goto done; }
    for (int t = 0; t < n; t++) {
        if ((rc = frame(t, rgb, user)) < 0) {
            ps_errf(err, errlen, "%s: frame %d could not be made: %s", path, t, ps_strerror(rc));
            goto done;
        }
        TRY(av_frame_make_writable(fr), "frame buffer");
        const uint8_t *src[1] = { rgb };
        int stride[1] = { w * 3 };
        sws_scale(sws, src, stride, 0, h, fr->data, fr->linesize);
        fr->pts = t;
        fr->quality = e.cc->global_quality;
        TRY(put_frame(&e, fr), "encode");
    }
    TRY(put_frame(&e, NULL), "encode");
    TRY(av_write_trailer(e.oc), "trailer");
    TRY(avio_closep(&e.oc->pb), "close");
    if (rename(tmp, path) < 0) {
        ps_errf(err, errlen, "%s: %s", path, strerror(errno));
        rc = PS_EIO;
    }
    goto done;
fail:
    ps_vfile_averr(av, m, sizeof m);
    ps_errf(err, errlen, "%s: writing the video failed (%s): %s", path, what, m);
    rc = PS_EIO;
#undef TRY
done:
    if (e.oc && e.oc->pb) avio_closep(&e.oc->pb);
    if (rc < 0) unlink(tmp);
    sws_freeContext(sws);
    av_frame_free(&fr);
    av_packet_free(&e.pkt);
    avcodec_free_context(&e.cc);
    avformat_free_context(e.oc);
    free(rgb);
    return rc;
}
