/* Line-oriented logging on stderr (journald-friendly): one line per event,
 * "TIME PROG LEVEL file:line: message".  Below the configured level a log
 * call costs one integer compare. */
#ifndef PS_LOG_H
#define PS_LOG_H
#include <stddef.h>

enum { PS_LOG_ERROR = 0, PS_LOG_WARN = 1, PS_LOG_INFO = 2, PS_LOG_DEBUG = 3 };

extern int ps_log_level; /* messages above this level are dropped */

/* Program tag printed on every line, e.g. "psd[1]".  Copied. */
void ps_log_set_prog(const char *prog);
/* Parse "error|warn|info|debug" (or 0-3); returns 0 or PS_EINVAL. */
int ps_log_set_level_str(const char *s);
void ps_log_write(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The first ERROR message logged by this process ("" if none), copied to
 * buf: what a failing program gives as its cause. */
const char *ps_log_first_error(char *buf, size_t len);

#define PS_LOG_(lvl, ...)                                                   \
    do {                                                                    \
        if ((lvl) <= ps_log_level)                                          \
            ps_log_write((lvl), __FILE__, __LINE__, __VA_ARGS__);           \
    } while (0)
#define ps_error(...) PS_LOG_(PS_LOG_ERROR, __VA_ARGS__)
#define ps_warn(...)  PS_LOG_(PS_LOG_WARN, __VA_ARGS__)
#define ps_info(...)  PS_LOG_(PS_LOG_INFO, __VA_ARGS__)
#define ps_debug(...) PS_LOG_(PS_LOG_DEBUG, __VA_ARGS__)

#endif
