// The mean's division for ps_nccl.c, kept in fp32 on the GPU so that
// ps_nccl_allreduce_mean divides exactly as psd and ps_ring do
// (g /= (float)W; a multiplication by 1/W would differ by an ulp for W = 3).
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" {
#include "ps_error.h"
#include "ps_log.h"
}

__global__ void k_div_f32(float *d, size_t n, float w)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] /= w;
}

// d[0..n) /= w on `stream` (a cudaStream_t); returns 0 or PS_ECUDA (logged).
extern "C" int ps_nccl_div_f32(float *d, size_t n, float w, void *stream)
{
    if (n == 0) return 0;
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096; // grid-stride loop covers the rest
    k_div_f32<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(d, n, w);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        ps_error("k_div_f32<<<%zu, 256>>>: %s", blocks, cudaGetErrorString(e));
        return PS_ECUDA;
    }
    return 0;
}
