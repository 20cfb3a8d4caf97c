// The device's measured matrix peak for bench/gpu_bench.c's roofline line:
// a large square cuBLAS GEMM, timed with events after a warm-up.
//   fp32: cublasSgemm in the default math mode (no TF32) - the ceiling of
//         the fp32 backend as it is configured;
//   fp16: cublasGemmEx fp16 in, fp32 accumulate (tensor cores) - the
//         ceiling mixed precision aims at.
#include "bench/gemm_peak.h"
#include "worker/engine/cuda/cuda_int.h"

#include <cuda_fp16.h>

__global__ void k_fill(float *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
}
__global__ void k_fill_h(__half *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2half((float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f);
}

extern "C" int ps_cuda_gemm_peak(int half, int iters, double *tflops)
{
    if (!tflops || iters <= 0) return PS_EINVAL;
    *tflops = 0;
    const int n = 8192;
    const size_t el = (size_t)n * n, esz = half ? 2 : 4;
    void *a = NULL, *b = NULL, *c = NULL;
    cublasHandle_t h = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = PS_ECUDA;
    const float one = 1.0f, zero = 0.0f;
    float ms = 0;
    if (cudaMalloc(&a, el * esz) != cudaSuccess || cudaMalloc(&b, el * esz) != cudaSuccess ||
        cudaMalloc(&c, el * 4) != cudaSuccess) {
        ps_error("gemm peak: cannot allocate 3 x %dx%d matrices", n, n);
        goto out;
    }
    if (half) {
        k_fill_h<<<1024, 256>>>((__half *)a, el);
        k_fill_h<<<1024, 256>>>((__half *)b, el);
    } else {
        k_fill<<<1024, 256>>>((float *)a, el);
        k_fill<<<1024, 256>>>((float *)b, el);
    }
    if (cudaGetLastError() != cudaSuccess) goto out;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        ps_error("gemm peak: cublasCreate failed");
        goto out;
    }
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) goto out;
    for (int it = -1; it < iters; it++) { // it = -1: warm-up, not timed
        if (it == 0 && cudaEventRecord(e0) != cudaSuccess) goto out;
        cublasStatus_t st =
            half ? cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16F, n, b,
                                CUDA_R_16F, n, &zero, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT)
                 : cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (float *)a, n,
                               (float *)b, n, &zero, (float *)c, n);
        if (st != CUBLAS_STATUS_SUCCESS) {
            ps_error("gemm peak: %s", cublasGetStatusString(st));
            goto out;
        }
    }
    if (cudaEventRecord(e1) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess || ms <= 0)
        goto out;
    *tflops = 2.0 * n * (double)n * n * iters / (ms * 1e-3) / 1e12;
    rc = 0;
out:
    if (rc) ps_error("gemm peak: CUDA error: %s", cudaGetErrorString(cudaGetLastError()));
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (h) cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return rc;
}
