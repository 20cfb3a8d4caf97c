/* Minimal TAP producer for the test programs (automake's tap-driver.sh reads
 * it).  Every check prints "ok N" or "not ok N" with both values on failure,
 * and tap_done() returns a non-zero exit status if anything failed, so a
 * failing check always fails the process. */
#ifndef PS_TAP_H
#define PS_TAP_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_n_, tap_failed_;

static inline int tap_ok_(int cond, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    tap_n_++;
    if (!cond) tap_failed_++;
    printf("%sok %d - ", cond ? "" : "not ", tap_n_);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!cond) printf("#   failed at %s:%d\n", file, line);
    fflush(stdout);
    return cond;
}
#define ok(cond, ...) tap_ok_(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define is_int(got, want, ...)                                              \
    do {                                                                    \
        long long g_ = (long long)(got), w_ = (long long)(want);            \
        if (!ok(g_ == w_, __VA_ARGS__))                                     \
            printf("#   got %lld, want %lld\n", g_, w_);                    \
    } while (0)
/* |got - want| <= atol + rtol*|want| */
#define is_close(got, want, atol, rtol, ...)                                \
    do {                                                                    \
        double g_ = (double)(got), w_ = (double)(want);                     \
        if (!ok(fabs(g_ - w_) <= (atol) + (rtol) * fabs(w_), __VA_ARGS__))  \
            printf("#   got %.9g, want %.9g (diff %.3g)\n", g_, w_, g_ - w_); \
    } while (0)
#define diag(...) (printf("# "), printf(__VA_ARGS__), printf("\n"))
#define tap_skip_all(...) do { printf("1..0 # SKIP "); printf(__VA_ARGS__); printf("\n"); exit(77); } while (0)
static inline int tap_done(void)
{
    printf("1..%d\n", tap_n_);
    if (tap_failed_) printf("# %d of %d checks failed\n", tap_failed_, tap_n_);
    return tap_failed_ ? 1 : 0;
}

/* Element-wise tensor compare: |a-b| <= atol + rtol*|b|; reports the worst. */
static inline int tap_allclose_(const float *got, const float *want, long n, double atol,
                                double rtol, const char *what, const char *file, int line)
{
    long worst = -1, bad = 0;
    double worst_excess = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]), lim = atol + rtol * fabs((double)want[i]);
        if (!(d <= lim)) {
            bad++;
            if (worst < 0 || d - lim > worst_excess || isnan(d)) { worst = i; worst_excess = d - lim; }
        }
    }
    int r = tap_ok_(bad == 0, file, line, "%s: %ld elements within atol=%g rtol=%g", what, n, atol, rtol);
    if (!r)
        printf("#   %ld mismatches; worst at %ld: got %.9g want %.9g\n", bad, worst,
               (double)got[worst], (double)want[worst]);
    return r;
}
#define allclose(got, want, n, atol, rtol, what) \
    tap_allclose_((got), (want), (n), (atol), (rtol), (what), __FILE__, __LINE__)

#endif
