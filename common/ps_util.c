/* Small helpers shared by the library modules (see ps_util.h). */
#include "ps_util.h"

#include "ps_log.h"

#include <errno.h>
#include <stdio.h>
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
