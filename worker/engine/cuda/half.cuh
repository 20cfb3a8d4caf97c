// Half storage of activations (docs/cuda.md "Half storage"):
// the element conversions every half kernel uses, and the launcher that
// instantiates a kernel template for the state's precision.
//
// A half kernel is `template <class T> __global__ void k_h_x(void *out,
// const void *inp, ...)` with T = __half or __nv_bfloat16: tensors travel
// as void * (they live in the model's float-sized slots) and are cast to
// T * inside, math in fp32 between one ld() and one st() per element.
// tests/cuda_emu/extract.py copies the __device__ helpers below into the
// CPU emulator together with the kernels.
#ifndef PS_CUDA_HALF_CUH
#define PS_CUDA_HALF_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float ld(__half v) { return __half2float(v); }
__device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void st(__half *d, float v) { *d = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16 *d, float v) { *d = __float2bfloat16_rn(v); }

// Launch `kern<T>` over a grid-stride loop of n elements on the state's
// stream, T from s->prec; needs `s` (ps_cu_state *) in scope.
#define HLAUNCH(kern, n, ...)                                                             \
    do {                                                                                  \
        if (s->prec == PS_PRECISION_BF16)                                                      \
            kern<__nv_bfloat16><<<cu_grid((n), CU_BLOCK), CU_BLOCK, 0, s->stream>>>(      \
                __VA_ARGS__);                                                             \
        else                                                                              \
            kern<__half><<<cu_grid((n), CU_BLOCK), CU_BLOCK, 0, s->stream>>>(__VA_ARGS__); \
        CU_LAUNCHED();                                                                    \
    } while (0)
// The same with an explicit grid and block (reductions: one block per
// channel).
#define HLAUNCH_GB(kern, grid, block, ...)                                                \
    do {                                                                                  \
        if (s->prec == PS_PRECISION_BF16)                                                      \
            kern<__nv_bfloat16><<<(grid), (block), 0, s->stream>>>(__VA_ARGS__);          \
        else                                                                              \
            kern<__half><<<(grid), (block), 0, s->stream>>>(__VA_ARGS__);                 \
        CU_LAUNCHED();                                                                    \
    } while (0)
#endif
