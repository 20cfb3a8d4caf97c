/* Small helpers shared by the library modules. */
#ifndef PS_UTIL_H
#define PS_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>

/* The "fail with a message" idiom of the parsers and validators: format
 * the message (prefix, may be NULL, then fmt) into the caller's buffer
 * err[errlen] (err may be NULL) and log it at error level with the
 * caller's file:line, so the cause is recorded where it happens even when
 * the caller drops err.  Returns code (a negative PS_E*).  Messages are
 * cut at 511 characters. */
int ps_fail_at(const char *file, int line, int code, char *err, size_t errlen,
               const char *prefix, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
#define ps_fail(code, err, errlen, ...) \
    ps_fail_at(__FILE__, __LINE__, (code), (err), (errlen), NULL, __VA_ARGS__)

/* Write all n bytes of buf to fd, retrying short writes and EINTR (and
 * cutting writes into 1 GiB pieces: Linux caps one write near 2 GiB).
 * Returns 0, or -1 with errno set by the failing write (a write of 0
 * bytes counts as failure: errno EIO). */
int ps_write_all(int fd, const void *buf, size_t n);

/* torch's nearest-neighbour source index (UpSample.h nearest_idx, output
 * size given): dst * ((float)in / out) rounded down in float, at most
 * in - 1 (the FPN's upsampling, torchvision's resize of target masks). */
static inline int ps_nearest_src(int dst, int in, int out)
{
    if (out == in) return dst;
    if (out == 2 * in) return dst >> 1;
    float scale = (float)in / (float)out;
    int s = (int)floorf((float)dst * scale);
    return s < in - 1 ? s : in - 1;
}

/* Write the n pieces bufs[i][0..lens[i]) one after the other as the whole
 * file at path, atomically: path.tmp.PID (a stale one is removed first),
 * fsync, rename over path, fsync the directory.  A failure before the
 * rename leaves path untouched and no tmp behind.  Returns 0 or PS_EIO /
 * PS_EINVAL (path too long) with "<what>: <step> <file>: <errno text>" in
 * err and the log (ps_fail). */
int ps_write_file_atomic(const char *path, const void *const *bufs, const size_t *lens,
                         size_t n, const char *what, char *err, size_t errlen);
/* The same for one buffer p[0..n). */
static inline int ps_write_file_atomic1(const char *path, const void *p, size_t n, const char *what,
                                        char *err, size_t errlen)
{
    const void *b[1] = {p};
    size_t l[1] = {n};
    return ps_write_file_atomic(path, b, l, 1, what, err, errlen);
}

/* mkdir -p; 0 or -1 with errno set. */
int ps_mkdir_p(const char *path);

#endif
