// Device side of dynamic loss scaling (worker/engine/ps_loss_scale.h holds
// the policy): the overflow check of a gradient buffer and the unscale.
#include "cuda_int.h"

// Any Inf/NaN sets *flag.  Each thread ORs its own elements first, so the
// flag is written at most once per thread that saw a bad value.
__global__ void k_overflow(int *flag, const float *g, size_t n)
{
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(g[i]);
    if (bad) *flag = 1; // benign race: every writer writes 1
}

__global__ void k_scale(float *g, size_t n, float s)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        g[i] *= s;
}

extern "C" int ps_cuda_check_overflow(const float *grad, size_t n, int *found, void *stream)
{
    if (!found) return PS_EINVAL;
    *found = 0;
    if (n == 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    int *d_flag = NULL, h = 0;
    CU_RET(cudaMallocAsync((void **)&d_flag, sizeof(int), st));
    CU_RET(cudaMemsetAsync(d_flag, 0, sizeof(int), st));
    // a bounded grid: the check is memory-bound, more blocks than the device
    // can hold only add scheduling
    unsigned grid = cu_grid(n, CU_BLOCK);
    if (grid > 4096) grid = 4096;
    k_overflow<<<grid, CU_BLOCK, 0, st>>>(d_flag, grad, n);
    CU_RET(cudaGetLastError());
    CU_RET(cudaMemcpyAsync(&h, d_flag, sizeof(int), cudaMemcpyDeviceToHost, st));
    CU_RET(cudaFreeAsync(d_flag, st));
    CU_RET(cudaStreamSynchronize(st));
    *found = h != 0;
    return 0;
}

extern "C" int ps_cuda_scale(float *grad, size_t n, float s, void *stream)
{
    if (n == 0) return 0;
    k_scale<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, (cudaStream_t)stream>>>(grad, n, s);
    CU_RET(cudaGetLastError());
    return 0;
}
