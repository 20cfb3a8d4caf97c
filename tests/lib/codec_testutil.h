/* Helpers of the codec tests (test_codec, test_codec_sparse): a seeded
 * xorshift generator, bit-exact float comparison and what a wire dtype
 * makes of a value.  Header-only.  Define CODEC_TEST_SEED before including
 * to choose the sequence (each test keeps its own). */
#ifndef PS_CODEC_TESTUTIL_H
#define PS_CODEC_TESTUTIL_H

#include "ps_codec.h"
#include "ps_half.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef CODEC_TEST_SEED
#error "define CODEC_TEST_SEED before including tests/lib/codec_testutil.h"
#endif

static uint64_t rng_state = CODEC_TEST_SEED;
static inline uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
/* Box-Muller from two rnd32() draws */
static inline float rnd_normal(void)
{
    double u = (rnd32() + 1.0) / 4294967297.0, v = rnd32() / 4294967296.0;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}
static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
/* bit-identical, or both NaN */
static inline int same(float a, float b) { return f2u(a) == f2u(b) || (isnan(a) && isnan(b)); }
/* value the wire dtype should carry for x */
static inline float through(float x, ps_dtype_t dt)
{
    if (dt == PS_DT_FP16) return ps_fp16_to_fp32_1(ps_fp32_to_fp16_1(x));
    if (dt == PS_DT_BF16) return ps_bf16_to_fp32_1(ps_fp32_to_bf16_1(x));
    return x;
}

#endif
