// Cross-worker BN on the CUDA backend, the host side (--bn sync,
// ps_engine.h "the group"): the kernels of batchnorm.cu leave this rank's
// per-channel moments or backward sums in device memory; these copy them
// to the host, run the group's exchange (worker/engine/bn_group.c, the
// CPU's code) and copy the group's values back before the next kernel
// reads them.  A stream sync each way: the collective runs on the host.
#include "cuda_int.h"

#include <stdlib.h>

// This rank's moments mom (device: mean[C] then M2[C]) -> the group's, in
// place; returns the group's count (this rank's M if the exchange failed:
// mom then keeps this rank's own, and the group remembers the error).
double ps_cu_bn_group_moments(ps_cu_state *s, ps_bn_group_t *g, double *mom, int C, double M)
{
    const size_t bytes = 2 * (size_t)C * sizeof(double);
    double *h = (double *)malloc(bytes);
    if (!h) {
        ps_error("bn_forward_train (cuda): no host memory for %d channels' moments", C);
        g->err = PS_ENOMEM;
        return M;
    }
    CU_CHECK(cudaMemcpyAsync(h, mom, bytes, cudaMemcpyDeviceToHost, s->stream));
    CU_CHECK(cudaStreamSynchronize(s->stream));
    if (!ps_bn_group_moments(g, C, &M, h, h + C)) {
        CU_CHECK(cudaMemcpyAsync(mom, h, bytes, cudaMemcpyHostToDevice, s->stream));
        CU_CHECK(cudaStreamSynchronize(s->stream)); // h is freed below
    }
    free(h);
    return M;
}

// This rank's backward sums ab (device: {sum dy, sum dy*xhat} per channel)
// -> the group's, in place; returns the group's count (as group_moments).
double ps_cu_bn_group_sums(ps_cu_state *s, ps_bn_group_t *g, double *ab, int C, double M)
{
    const size_t bytes = 2 * (size_t)C * sizeof(double);
    double *h = (double *)malloc(2 * bytes);
    if (!h) {
        ps_error("bn_backward_train (cuda): no host memory for %d channels' sums", C);
        g->err = PS_ENOMEM;
        return M;
    }
    double *a = h + 2 * (size_t)C, *b = a + C;
    CU_CHECK(cudaMemcpyAsync(h, ab, bytes, cudaMemcpyDeviceToHost, s->stream));
    CU_CHECK(cudaStreamSynchronize(s->stream));
    for (int c = 0; c < C; c++) {
        a[c] = h[2 * (size_t)c];
        b[c] = h[2 * (size_t)c + 1];
    }
    if (!ps_bn_group_sums(g, C, &M, a, b)) {
        for (int c = 0; c < C; c++) {
            h[2 * (size_t)c] = a[c];
            h[2 * (size_t)c + 1] = b[c];
        }
        CU_CHECK(cudaMemcpyAsync(ab, h, bytes, cudaMemcpyHostToDevice, s->stream));
        CU_CHECK(cudaStreamSynchronize(s->stream));
    }
    free(h);
    return M;
}

