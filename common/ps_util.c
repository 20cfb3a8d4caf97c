/* Small helpers shared by the library modules (see ps_util.h). */
#include "ps_util.h"

#include "ps_log.h"

#include <stdio.h>

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
