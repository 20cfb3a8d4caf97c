/* Host-side helpers shared by the CUDA-vs-CPU layer tests
 * (tests/test_cuda_layers.c, tests/test_cuda_half.c): one xorshift stream
 * of test values (same seed in every test, so a failing case reproduces),
 * NaN-poisoned and copied host buffers, the largest magnitude of a
 * reference (the scale of a tolerance) and the compare-and-report step.  Buffers are malloc'd (at least
 * one element); the tests free them. */
#ifndef PS_CUDA_TESTUTIL_H
#define PS_CUDA_TESTUTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/tap.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"

static uint64_t rs = 0x243F6A8885A308D3ull;
static inline float frand(void) /* [-1, 1) */
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static inline float *hrand(size_t n, float scale, float offset)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale + offset;
    return p;
}
static inline float *hnan(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static inline float *hcopy(const float *s, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    memcpy(p, s, n * sizeof *p);
    return p;
}
static inline double maxabs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}
/* allclose(got, want) on host buffers, plus a diag line with the worst
 * absolute error (a NaN counts as infinite); returns that error relative
 * to max |want|, for the tests that report it. */
static inline double cmp_report(const float *got, const float *want, size_t n, double atol,
                                double rtol, const char *what)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
    }
    allclose(got, want, (long)n, atol, rtol, what);
    diag("  %s: max |err| %.3g (max |ref| %.3g)", what, worst, maxabs(want, n));
    return worst / (maxabs(want, n) + 1e-30);
}
/* A device copy of bytes of host memory, uploaded and waited for; a
 * failure bails out of the test. */
static inline void *cu_upload(const void *h, size_t bytes)
{
    void *d = NULL;
    if (ps_cuda_malloc(&d, bytes ? bytes : 4) || ps_cuda_memcpy_h2d(d, h, bytes) ||
        ps_cuda_device_sync()) {
        printf("Bail out! device allocation/copy failed\n");
        exit(1);
    }
    return d;
}
/* n floats of device memory into a malloc'd host copy, after the backend
 * of ctx has finished its queue; a failure (a kernel fault) bails out. */
static inline float *cu_download(ps_ctx_t *ctx, const void *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (ps_cuda_backend_sync(ctx) || ps_cuda_memcpy_d2h(h, d, n * sizeof *h)) {
        printf("Bail out! device sync/copy failed (a kernel fault?)\n");
        exit(1);
    }
    return h;
}
#endif
