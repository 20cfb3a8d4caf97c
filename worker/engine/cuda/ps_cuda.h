/* CUDA runtime helpers shared by the CUDA backend (compiled only when
 * configure found the toolkit; see configure.ac).  Functions here are plain
 * C entry points implemented in .cu files, so C code links them without nvcc. */
#ifndef PS_CUDA_H
#define PS_CUDA_H
#include <stddef.h>
#include <stdint.h>

/* Number of usable GPUs (0 when there is no driver or device: never fails). */
int ps_cuda_device_count(void);
/* Select device `dev` and print its name/memory into info (may be NULL).
 * Returns 0 or PS_ECUDA (logged with cudaGetErrorString). */
int ps_cuda_open(int dev, char *info, size_t infolen);

/* Device-memory casts with the same rounding as common/ps_half.c (RNE,
 * Inf/NaN kept), used to put gradients on the wire as fp16/bf16 and to turn
 * pulled fp32 weights into the fp16/bf16 compute copy.  All pointers are
 * device pointers; `stream` is a cudaStream_t (NULL = default stream). */
int ps_cuda_f32_to_f16(uint16_t *dst, const float *src, size_t n, void *stream);
int ps_cuda_f16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream);
int ps_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n, void *stream);
int ps_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream);

/* Copy helpers for tests and the worker's staging buffers. */
int ps_cuda_malloc(void **p, size_t bytes);
void ps_cuda_free(void *p);
int ps_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
int ps_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
#endif
