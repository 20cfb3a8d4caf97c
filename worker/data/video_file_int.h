/* Internal: what the FFmpeg reader and writer share (video_file.c,
 * video_encode.c). */
#ifndef PS_VIDEO_FILE_INT_H
#define PS_VIDEO_FILE_INT_H
#include <stddef.h>

struct AVFormatContext;

/* FFmpeg's own messages into our log at debug level (once per process). */
void ps_vfile_log_init(void);
/* FFmpeg's text for an AVERROR code. */
void ps_vfile_averr(int rc, char *buf, size_t n);
/* Opens path and picks its best video stream (a cover picture is not a
 * video); every other stream is discarded.  Errors name the file:
 * PS_ENOTFOUND (missing), PS_ECORRUPT (unreadable, no video stream). */
int ps_vfile_open(const char *path, struct AVFormatContext **fmt, int *stream, char *err,
                  size_t errlen);

#endif
