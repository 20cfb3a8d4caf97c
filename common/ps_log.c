#include "ps_log.h"
#include "ps_error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

int ps_log_level = PS_LOG_INFO;
static char log_prog[64] = "ps";
/* The first ERROR line of the process: the cause a failing program reports
 * (later errors usually follow from it). */
static pthread_mutex_t first_mu = PTHREAD_MUTEX_INITIALIZER;
static char first_error[1024];

const char *ps_log_first_error(char *buf, size_t len)
{
    pthread_mutex_lock(&first_mu);
    snprintf(buf, len, "%s", first_error);
    pthread_mutex_unlock(&first_mu);
    return buf;
}

void ps_log_set_prog(const char *prog)
{
    snprintf(log_prog, sizeof log_prog, "%s", prog ? prog : "ps");
}

int ps_log_set_level_str(const char *s)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (!strcasecmp(s, names[i]) || (s[0] == '0' + i && !s[1])) {
            ps_log_level = i;
            return 0;
        }
    return PS_EINVAL;
}

void ps_log_write(int level, const char *file, int line, const char *fmt, ...)
{
    static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char msg[1024], stamp[32];
    struct timeval tv;
    struct tm tm;
    va_list ap;
    const char *base = strrchr(file, '/');

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (level == PS_LOG_ERROR) {
        pthread_mutex_lock(&first_mu);
        if (!first_error[0]) snprintf(first_error, sizeof first_error, "%s", msg);
        pthread_mutex_unlock(&first_mu);
    }
    /* One fprintf per line so concurrent threads do not interleave mid-line. */
    fprintf(stderr, "%s.%03ld %s %s %s:%d: %s\n", stamp, (long)(tv.tv_usec / 1000),
            log_prog, tags[level < 0 ? 0 : level > 3 ? 3 : level],
            base ? base + 1 : file, line, msg);
}
