/* Timing prelude of the training-step benchmarks (engine_bench,
 * retina_bench, gpu_bench): a monotonic clock and the median of the
 * per-step times.  Header-only: each benchmark is one program. */
#ifndef PS_BENCH_UTIL_H
#define PS_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

/* seconds on CLOCK_MONOTONIC */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* median of v[0..n) (sorts v in place; n >= 1) */
static inline double bench_median(double *v, int n)
{
    qsort(v, n, sizeof *v, bench_cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
