/* LD_PRELOAD shim for tests (tests/test_psctl_check.sh): the wall clock
 * (clock_gettime CLOCK_REALTIME) of the process runs PS_CLOCK_SHIFT_S
 * seconds ahead, as on a host whose clock is off.  Only the calls the
 * program makes itself go through it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    const char *shift = getenv("PS_CLOCK_SHIFT_S");
    if (!rc && id == CLOCK_REALTIME && shift) ts->tv_sec += atol(shift);
    return rc;
}
