/* Finite-difference gradient checks shared by the layer tests
 * (tests/test_gradcheck.c for the 2-D layers, tests/test_layers3d.c for
 * the 3-D ones): a fixed pseudo-random input generator, central
 * differences of a float64-summed loss against an analytic gradient, and
 * the accumulate / overwrite contract of ps_engine.h.
 *
 * Tolerance: |numeric - analytic| <= 2e-3 + 1e-2*|analytic| (why that wide:
 * see the top of tests/test_gradcheck.c).  Header-only like tests/lib/tap.h
 * (one copy per test program). */
#ifndef PS_TEST_GRADCHECK_H
#define PS_TEST_GRADCHECK_H

#include "tests/lib/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define GRADCHECK_ATOL 2e-3
#define GRADCHECK_RTOL 1e-2

static uint64_t rng_state = 0x1234567;

static inline float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}
static inline float *rbuf(size_t n, float scale)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}
static inline float *zbuf(size_t n)
{
    return calloc(n ? n : 1, sizeof(float));
}
static inline double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Central differences of loss() over every element of v, against g. */
typedef double (*loss_fn)(void *arg);
static inline void gradcheck(const char *what, float *v, const float *g, size_t n,
                             loss_fn loss, void *arg, float eps)
{
    size_t bad = 0, worst = 0;
    double worst_ex = -1, wn = 0, wa = 0;
    for (size_t i = 0; i < n; i++) {
        const float v0 = v[i];
        v[i] = v0 + eps;
        double lp = loss(arg);
        v[i] = v0 - eps;
        double lm = loss(arg);
        v[i] = v0;
        /* the step actually taken, after float rounding of v0 +- eps */
        double num = (lp - lm) / ((double)(v0 + eps) - (double)(v0 - eps));
        double ex = fabs(num - g[i]) - (GRADCHECK_ATOL + GRADCHECK_RTOL * fabs(g[i]));
        if (ex > 0 || isnan(num) || isnan(g[i])) bad++;
        if (ex > worst_ex || isnan(ex)) worst_ex = ex, worst = i, wn = num, wa = g[i];
    }
    if (!ok(bad == 0, "%s: %zu elements match central differences", what, n))
        printf("#   %zu bad; worst at %zu: numeric %.6g analytic %.6g\n", bad, worst, wn, wa);
}

/* Backward run twice: parameter gradients double, input gradients repeat. */
static inline void check_accumulates(const char *what, const float *once, const float *twice,
                                     size_t n)
{
    float *ref = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) ref[i] = 2 * once[i];
    char m[192];
    snprintf(m, sizeof m, "%s accumulates (backward twice = 2x)", what);
    allclose(twice, ref, (long)n, 1e-6, 1e-5, m);
    free(ref);
}
static inline void check_overwrites(const char *what, const float *once, const float *twice,
                                    size_t n)
{
    char m[192];
    snprintf(m, sizeof m, "%s is overwritten (backward twice = same)", what);
    allclose(twice, once, (long)n, 0, 0, m);
}

#endif
