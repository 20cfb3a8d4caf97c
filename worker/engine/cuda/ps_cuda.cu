// CUDA runtime helpers and cast kernels (see ps_cuda.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "ps_cuda.h"
#include "ps_error.h"
#include "ps_log.h"
}

// Check macro carrying the call site (llm.c's cudaCheck).
#define PS_CUDA_TRY(call)                                                      \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess) {                                               \
            ps_error("%s: %s", #call, cudaGetErrorString(e_));                 \
            return PS_ECUDA;                                                   \
        }                                                                      \
    } while (0)

extern "C" int ps_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

extern "C" int ps_cuda_open(int dev, char *info, size_t infolen)
{
    cudaDeviceProp p;
    PS_CUDA_TRY(cudaSetDevice(dev));
    PS_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    if (info)
        snprintf(info, infolen, "cuda:%d %s sm_%d%d %.1f GiB", dev, p.name, p.major, p.minor,
                 p.totalGlobalMem / 1073741824.0);
    return 0;
}

// __float2half_rn / __float2bfloat16_rn round to nearest even and keep
// Inf/NaN, matching the CPU conversion bit for bit.
__global__ void k_f32_to_f16(__half *d, const float *s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = __float2half_rn(s[i]);
}
__global__ void k_f16_to_f32(float *d, const __half *s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = __half2float(s[i]);
}
__global__ void k_f32_to_bf16(__nv_bfloat16 *d, const float *s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = __float2bfloat16_rn(s[i]);
}
__global__ void k_bf16_to_f32(float *d, const __nv_bfloat16 *s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = __bfloat162float(s[i]);
}

static unsigned grid_for(size_t n)
{
    size_t g = (n + 255) / 256;
    return (unsigned)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

#define PS_LAUNCH_CAST(kernel, dtype_d, dtype_s)                               \
    do {                                                                       \
        if (n == 0) return 0;                                                  \
        kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>((dtype_d)dst,    \
                                                              (dtype_s)src, n); \
        PS_CUDA_TRY(cudaGetLastError());                                       \
        return 0;                                                              \
    } while (0)

extern "C" int ps_cuda_f32_to_f16(uint16_t *dst, const float *src, size_t n, void *stream)
{
    PS_LAUNCH_CAST(k_f32_to_f16, __half *, const float *);
}
extern "C" int ps_cuda_f16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream)
{
    PS_LAUNCH_CAST(k_f16_to_f32, float *, const __half *);
}
extern "C" int ps_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n, void *stream)
{
    PS_LAUNCH_CAST(k_f32_to_bf16, __nv_bfloat16 *, const float *);
}
extern "C" int ps_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream)
{
    PS_LAUNCH_CAST(k_bf16_to_f32, float *, const __nv_bfloat16 *);
}

extern "C" int ps_cuda_malloc(void **p, size_t bytes)
{
    PS_CUDA_TRY(cudaMalloc(p, bytes));
    return 0;
}
extern "C" void ps_cuda_free(void *p) { cudaFree(p); }
extern "C" int ps_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes)
{
    PS_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}
extern "C" int ps_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes)
{
    PS_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    PS_CUDA_TRY(cudaDeviceSynchronize());
    return 0;
}
