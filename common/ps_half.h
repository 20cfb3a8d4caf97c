/* fp32 <-> fp16 / bf16 conversion for the wire and for mixed precision.
 * Round to nearest even; Inf and NaN kept (NaN stays NaN, quiet); fp16
 * subnormals produced and read exactly.  Vectorised with F16C/AVX2 where the
 * CPU has them (chosen once at run time), scalar otherwise; both paths give
 * bit-identical results. */
#ifndef PS_HALF_H
#define PS_HALF_H
#include <stddef.h>
#include <stdint.h>

uint16_t ps_fp32_to_fp16_1(float f);
float ps_fp16_to_fp32_1(uint16_t h);
uint16_t ps_fp32_to_bf16_1(float f);
float ps_bf16_to_fp32_1(uint16_t h);

void ps_fp32_to_fp16(uint16_t *dst, const float *src, size_t n);
void ps_fp16_to_fp32(float *dst, const uint16_t *src, size_t n);
void ps_fp32_to_bf16(uint16_t *dst, const float *src, size_t n);
void ps_bf16_to_fp32(float *dst, const uint16_t *src, size_t n);
/* dst[i] += src[i] (fp32; AVX2 where the CPU has it, same bits as the
 * scalar loop; dst and src must not overlap partially). */
void ps_fp32_add(float *dst, const float *src, size_t n);
/* dst[i] += decoded src[i] (server summation without a temporary) */
void ps_fp16_add_fp32(float *dst, const uint16_t *src, size_t n);
void ps_bf16_add_fp32(float *dst, const uint16_t *src, size_t n);

/* 1 if the vectorised path is in use (for benchmarks to report). */
int ps_half_simd(void);
/* Allow (on=1, the default where the CPU has F16C+AVX2) or forbid (0) the
 * vectorised path; returns the previous state.  For tests and benchmarks that
 * compare the two paths; not meant to be flipped while other threads convert. */
int ps_half_use_simd(int on);
#endif
