/* fp32 <-> fp16 / bf16.  The scalar functions are the reference; the F16C /
 * AVX2 functions must agree with them bit for bit (tests/test_half.c checks
 * all 65536 half inputs and a large float set), so NaN handling below mirrors
 * what vcvtps2ph / vcvtph2ps do: a NaN keeps its sign and top mantissa bits
 * and is made quiet. */
#include "ps_half.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define PS_HALF_X86 1
#endif

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- scalar reference --------------------------------------------------- */

uint16_t ps_fp32_to_fp16_1(float f)
{
    uint32_t x = f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) /* Inf, or NaN: quiet, keep the top 10 payload bits */
        return sign | 0x7c00 | (x > 0x7f800000u ? 0x200 | ((x >> 13) & 0x3ff) : 0);
    if (x >= 0x477ff000u) /* >= 65520 rounds past 65504: Inf, as IEEE says */
        return sign | 0x7c00;
    if (x >= 0x38800000u) { /* normal half: rebias, round to nearest even on bit 13 */
        uint32_t t = x - 0x38000000u;
        t += 0xfffu + ((t >> 13) & 1);
        return sign | (uint16_t)(t >> 13);
    }
    if (x <= 0x33000000u) /* <= 2^-25: rounds to zero (2^-25 is a tie to even 0) */
        return sign;
    /* Subnormal half: value = m * 2^(e-150), unit 2^-24, so h = m >> (126 - e),
     * shift in 14..24; round to nearest even on the bits shifted out. */
    uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u, sh = 126 - e;
    uint32_t h = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return sign | (uint16_t)h;
}

float ps_fp16_to_fp32_1(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = h & 0x7c00, m = h & 0x3ff;
    if (e == 0x7c00) /* Inf / NaN (made quiet, payload kept) */
        return u2f(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0));
    if (e == 0) { /* zero or subnormal: m * 2^-24 is exact in fp32 */
        float v = (float)m * 0x1p-24f;
        return u2f(f2u(v) | sign);
    }
    return u2f(sign | (((uint32_t)(h & 0x7fff) << 13) + 0x38000000u));
}

uint16_t ps_fp32_to_bf16_1(float f)
{
    uint32_t x = f2u(f);
    /* Truncating a NaN whose payload sits only in the low 16 bits would give
     * Inf; set the quiet bit instead. */
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040);
    x += 0x7fffu + ((x >> 16) & 1); /* RNE; a carry into the exponent overflows to Inf */
    return (uint16_t)(x >> 16);
}

float ps_bf16_to_fp32_1(uint16_t h)
{
    return u2f((uint32_t)h << 16);
}

/* Element loads and stores through memcpy: a payload inside a received
 * message need not be aligned to its element size (ZeroMQ packs small
 * frames), and a misaligned dereference is undefined; compilers turn these
 * into plain moves. */
static inline float ld_f32(const float *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline uint16_t ld_u16(const uint16_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void st_f32(float *p, float v) { memcpy(p, &v, sizeof v); }
static inline void st_u16(uint16_t *p, uint16_t v) { memcpy(p, &v, sizeof v); }

static void fp32_to_fp16_scalar(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) st_u16(dst + i, ps_fp32_to_fp16_1(ld_f32(src + i)));
}
static void fp16_to_fp32_scalar(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) st_f32(dst + i, ps_fp16_to_fp32_1(ld_u16(src + i)));
}
static void fp32_to_bf16_scalar(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) st_u16(dst + i, ps_fp32_to_bf16_1(ld_f32(src + i)));
}
static void bf16_to_fp32_scalar(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) st_f32(dst + i, ps_bf16_to_fp32_1(ld_u16(src + i)));
}
static void fp32_add_scalar(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) st_f32(dst + i, ld_f32(dst + i) + ld_f32(src + i));
}
static void fp16_add_fp32_scalar(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) st_f32(dst + i, ld_f32(dst + i) + ps_fp16_to_fp32_1(ld_u16(src + i)));
}
static void bf16_add_fp32_scalar(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) st_f32(dst + i, ld_f32(dst + i) + ps_bf16_to_fp32_1(ld_u16(src + i)));
}

/* ---- F16C / AVX2 -------------------------------------------------------- */
#ifdef PS_HALF_X86
#define PS_TGT __attribute__((target("f16c,avx2")))

PS_TGT static void fp32_to_fp16_avx(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    fp32_to_fp16_scalar(dst + i, src + i, n - i);
}

PS_TGT static void fp16_to_fp32_avx(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    fp16_to_fp32_scalar(dst + i, src + i, n - i);
}

/* The reduction of fp32 payloads (psd's sums, the ring's reduce-scatter):
 * gcc -O2 leaves the plain loop scalar (unknown n and possible aliasing).
 * Element-wise IEEE adds, so the bits equal the scalar loop's. */
PS_TGT static void fp32_add_avx(float *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 a0 = _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i));
        __m256 a1 = _mm256_add_ps(_mm256_loadu_ps(dst + i + 8), _mm256_loadu_ps(src + i + 8));
        __m256 a2 = _mm256_add_ps(_mm256_loadu_ps(dst + i + 16), _mm256_loadu_ps(src + i + 16));
        __m256 a3 = _mm256_add_ps(_mm256_loadu_ps(dst + i + 24), _mm256_loadu_ps(src + i + 24));
        _mm256_storeu_ps(dst + i, a0);
        _mm256_storeu_ps(dst + i + 8, a1);
        _mm256_storeu_ps(dst + i + 16, a2);
        _mm256_storeu_ps(dst + i + 24, a3);
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
    fp32_add_scalar(dst + i, src + i, n - i);
}

PS_TGT static void fp16_add_fp32_avx(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), v));
    }
    fp16_add_fp32_scalar(dst + i, src + i, n - i);
}

/* 8 floats -> 8 bf16 in the low 16 bits of each 32-bit lane (same integer
 * math as the scalar path). */
PS_TGT static inline __m256i bf16_round8(__m256i x)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(x, absmask), inf);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i q = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
    return _mm256_srli_epi32(_mm256_blendv_epi8(r, q, isnan), 16);
}

PS_TGT static void fp32_to_bf16_avx(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = bf16_round8(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m256i b = bf16_round8(_mm256_loadu_si256((const __m256i *)(src + i + 8)));
        /* packus works per 128-bit lane: fix the order with a 64-bit permute */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), p);
    }
    fp32_to_bf16_scalar(dst + i, src + i, n - i);
}

PS_TGT static inline __m256 bf16_load8(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

PS_TGT static void bf16_to_fp32_avx(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, bf16_load8(src + i));
    bf16_to_fp32_scalar(dst + i, src + i, n - i);
}

PS_TGT static void bf16_add_fp32_avx(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), bf16_load8(src + i)));
    bf16_add_fp32_scalar(dst + i, src + i, n - i);
}
#endif

/* ---- dispatch (decided once) ------------------------------------------- */

static pthread_once_t half_once = PTHREAD_ONCE_INIT;
static int half_have_simd, half_use_simd;

static void half_detect(void)
{
#ifdef PS_HALF_X86
    /* clang (used for the fuzz build) does not know "f16c" in
     * __builtin_cpu_supports: read F16C from CPUID leaf 1 (ECX bit 29)
     * directly; "avx2" covers the OS saving the AVX state. */
    unsigned a, b, c, d;
    __builtin_cpu_init();
    half_have_simd = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) && __builtin_cpu_supports("avx2");
#endif
    half_use_simd = half_have_simd;
}

static inline int simd_on(void)
{
    pthread_once(&half_once, half_detect);
    return half_use_simd;
}

int ps_half_simd(void)
{
    return simd_on();
}

int ps_half_use_simd(int on)
{
    int prev = simd_on();
    half_use_simd = on && half_have_simd;
    return prev;
}

#ifdef PS_HALF_X86
#define DISPATCH(name, ...)                                                 \
    do {                                                                    \
        if (simd_on()) name##_avx(__VA_ARGS__);                             \
        else name##_scalar(__VA_ARGS__);                                    \
    } while (0)
#else
#define DISPATCH(name, ...) name##_scalar(__VA_ARGS__)
#endif

void ps_fp32_to_fp16(uint16_t *dst, const float *src, size_t n) { DISPATCH(fp32_to_fp16, dst, src, n); }
void ps_fp16_to_fp32(float *dst, const uint16_t *src, size_t n) { DISPATCH(fp16_to_fp32, dst, src, n); }
void ps_fp32_to_bf16(uint16_t *dst, const float *src, size_t n) { DISPATCH(fp32_to_bf16, dst, src, n); }
void ps_bf16_to_fp32(float *dst, const uint16_t *src, size_t n) { DISPATCH(bf16_to_fp32, dst, src, n); }
void ps_fp32_add(float *dst, const float *src, size_t n) { DISPATCH(fp32_add, dst, src, n); }
void ps_fp16_add_fp32(float *dst, const uint16_t *src, size_t n) { DISPATCH(fp16_add_fp32, dst, src, n); }
void ps_bf16_add_fp32(float *dst, const uint16_t *src, size_t n) { DISPATCH(bf16_add_fp32, dst, src, n); }
