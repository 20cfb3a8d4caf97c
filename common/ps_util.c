/* Small helpers shared by the library modules (see ps_util.h). */
#include "ps_util.h"

#include "ps_log.h"

#include "ps_error.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ps_fail_at(const char *file, int line, int code, char *err, size_t errlen,
               const char *prefix, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!prefix) prefix = "";
    if (err && errlen) snprintf(err, errlen, "%s%s", prefix, msg);
    if (PS_LOG_ERROR <= ps_log_level) ps_log_write(PS_LOG_ERROR, file, line, "%s%s", prefix, msg);
    return code;
}

int ps_write_all(int fd, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = EIO;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return -1;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int ps_write_file_atomic(const char *path, const void *const *bufs, const size_t *lens,
                         size_t n, const char *what, char *err, size_t errlen)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return ps_fail(PS_EINVAL, err, errlen, "%s: path too long: %s", what, path);
    /* A stale tmp from a crashed process with a recycled PID may exist and
     * may even be read-only: remove it and create afresh. */
    if (unlink(tmp) < 0 && errno != ENOENT)
        return ps_fail(PS_EIO, err, errlen, "%s: cannot remove stale %s: %s", what, tmp,
                       strerror(errno));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return ps_fail(PS_EIO, err, errlen, "%s: create %s: %s", what, tmp, strerror(errno));
    const char *step = "write";
    int ok = 1;
    for (size_t i = 0; ok && i < n; i++) ok = ps_write_all(fd, bufs[i], lens[i]) == 0;
    if (ok && fsync(fd) < 0) ok = 0, step = "fsync";
    int e = errno;
    if (close(fd) < 0 && ok) ok = 0, step = "close", e = errno;
    if (ok && rename(tmp, path) < 0) ok = 0, step = "rename", e = errno;
    if (!ok) {
        unlink(tmp);
        return ps_fail(PS_EIO, err, errlen, "%s: %s %s: %s", what, step, tmp, strerror(e));
    }
    /* The rename is durable only once the directory entry is on disk. */
    if (fsync_dir_of(path) < 0)
        return ps_fail(PS_EIO, err, errlen, "%s: fsync directory of %s: %s", what, path,
                       strerror(errno));
    return 0;
}

int ps_mkdir_p(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (char *q = buf + 1;; q++) {
        if (*q && *q != '/') continue;
        char c = *q;
        *q = 0;
        if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -1;
        if (!c) break;
        *q = c;
    }
    return 0;
}
