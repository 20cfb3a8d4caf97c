/* Device buffers of the CUDA-vs-CPU layer tests (tests/test_cuda_layers.c,
 * tests/test_cuda_layers3d.c): upload a host buffer, upload NaNs, download
 * after the backend's stream has finished.  Any failure is a "Bail out!"
 * (a device that cannot copy makes every comparison meaningless).
 * Header-only, after tests/lib/cuda_testutil.h. */
#ifndef PS_CUDA_DEVBUF_H
#define PS_CUDA_DEVBUF_H

#include "tests/lib/cuda_testutil.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>

static inline void *dup_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    if (ps_cuda_malloc(&d, bytes ? bytes : 4) || ps_cuda_memcpy_h2d(d, h, bytes)) {
        printf("Bail out! device allocation/copy failed\n");
        exit(1);
    }
    return d;
}
static inline float *dev(const float *h, size_t n) { return dup_dev(h, n * sizeof(float)); }
static inline float *dev_nan(size_t n)
{
    float *h = hnan(n);
    float *d = dev(h, n);
    free(h);
    return d;
}
/* bytes of d, after waiting for ctx's backend stream */
static inline void *down_ctx(ps_ctx_t *ctx, const void *d, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 4);
    if (ps_cuda_backend_sync(ctx) || ps_cuda_memcpy_d2h(h, d, bytes)) {
        printf("Bail out! device sync/copy failed (a kernel fault?)\n");
        exit(1);
    }
    return h;
}

#endif
