/* Tensor codecs: a wire dtype (fp32/fp16/bf16) and a compressor.
 *
 * RAW payload: numel little-endian elements of the wire dtype, nothing else.
 *
 * LZ4 payload (all integers little-endian):
 *   u32 magic "PSZ1" | u8 dtype | u8 flags (bit0: byte-shuffled) | u16 0 |
 *   u64 numel | chunks...
 * The elements are cut into chunks of CHUNK_ELEMS; each chunk's bytes are
 * byte-shuffled (byte k of every element stored together: gradients share
 * sign/exponent bytes, so the planes compress where interleaved bytes do
 * not) and stored as u32 len | data.  len's top bit set means the chunk is
 * stored shuffled but uncompressed (LZ4 did not shrink it), which keeps the
 * worst case at raw size + 4 bytes per chunk + header.  Chunks also keep each
 * LZ4 call far below LZ4_MAX_INPUT_SIZE whatever the tensor size.
 *
 * Decode validates everything and decompresses into scratch before it
 * writes a single element of dst, so a bad payload never leaves a partial
 * update behind.  TOPK and SIGN live in ps_codec_sparse.c. */
#include "ps_codec.h"
#include "ps_codec_int.h"

#include "ps_error.h"
#include "ps_half.h"
#include "ps_le.h"
#include "ps_log.h"

#include <lz4.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define PS_CODEC_X86 1
#endif

#define LZ4_MAGIC 0x315a5350u /* "PSZ1" */
#define LZ4_HDR 16
#define FLAG_SHUFFLE 1u
#define CHUNK_ELEMS ((size_t)1 << 20)
#define CHUNK_RAW 0x80000000u

static const char *dtype_names[] = {"fp32", "fp16", "bf16"};
static const char *codec_names[] = {"raw", "lz4", "topk", "sign"};

size_t ps_dtype_size(ps_dtype_t dt)
{
    switch (dt) {
    case PS_DT_FP32: return 4;
    case PS_DT_FP16:
    case PS_DT_BF16: return 2;
    }
    return 0;
}

const char *ps_dtype_name(ps_dtype_t dt)
{
    return (unsigned)dt < 3 ? dtype_names[dt] : "unknown";
}

const char *ps_codec_name(ps_codec_t c)
{
    return (unsigned)c < 4 ? codec_names[c] : "unknown";
}

int ps_dtype_parse(const char *s, ps_dtype_t *dt)
{
    for (int i = 0; s && i < 3; i++)
        if (!strcasecmp(s, dtype_names[i])) {
            *dt = (ps_dtype_t)i;
            return 0;
        }
    if (s && (!strcasecmp(s, "float32") || !strcasecmp(s, "float"))) return *dt = PS_DT_FP32, 0;
    if (s && (!strcasecmp(s, "float16") || !strcasecmp(s, "half"))) return *dt = PS_DT_FP16, 0;
    if (s && !strcasecmp(s, "bfloat16")) return *dt = PS_DT_BF16, 0;
    return PS_EINVAL;
}

int ps_codec_parse(const char *s, ps_codec_t *c)
{
    for (int i = 0; s && i < 4; i++)
        if (!strcasecmp(s, codec_names[i])) {
            *c = (ps_codec_t)i;
            return 0;
        }
    if (s && !strcasecmp(s, "none")) return *c = PS_CODEC_RAW, 0;
    return PS_EINVAL;
}

static size_t nchunks(size_t numel)
{
    return (numel + CHUNK_ELEMS - 1) / CHUNK_ELEMS;
}

size_t ps_codec_bound(ps_dtype_t dt, ps_codec_t c, size_t numel)
{
    size_t es = ps_dtype_size(dt);
    if (!es || numel > (SIZE_MAX - 4096) / 8) return 0;
    switch (c) {
    case PS_CODEC_RAW: return numel * es;
    case PS_CODEC_LZ4: return LZ4_HDR + 4 * nchunks(numel) + numel * es;
    case PS_CODEC_TOPK: return PS_TOPK_HDR + numel * (4 + es);
    case PS_CODEC_SIGN: /* the largest: PSG2 with as many blocks as allowed */
        return (ps_codec_sign_max_blocks(numel) ? 4 + 8 * ps_codec_sign_max_blocks(numel) : 0) +
               PS_SIGN_HDR + (numel + 7) / 8;
    }
    return 0;
}

size_t ps_codec_topk_k(size_t numel, float ratio)
{
    if (!(ratio >= 0.f && ratio <= 1.f)) return 0;
    if (ratio == 0.f) ratio = PS_CODEC_TOPK_DEFAULT_RATIO;
    /* ratio * numel rounded up, but not by the float error of the ratio:
     * 0.001f is 0.0010000000475, and 1000 elements at "0.1%" mean k = 1.
     * The slack is capped below one element: uncapped, x * 1e-6 exceeds 1
     * from a million elements on and ratio 1 gave numel - 1. */
    double x = (double)ratio * (double)numel, k = ceil(x - fmin(x * 1e-6, 0.25));
    if (k < 1) k = 1;
    return k >= (double)numel ? numel : (size_t)k;
}

size_t ps_codec_sign_max_blocks(size_t numel)
{
    return numel / 2 < PS_SIGN_MAX_BLOCKS ? numel / 2 : PS_SIGN_MAX_BLOCKS;
}

size_t ps_codec_topk_k_ex(size_t numel, const ps_codec_params_t *params)
{
    float ratio = params ? params->topk_ratio : 0.f;
    if (!params || params->nblocks <= 1) return ps_codec_topk_k(numel, ratio);
    size_t k = 0, sum = 0;
    for (size_t b = 0; b < params->nblocks; b++) {
        if (!params->block_len[b]) return 0;
        k += ps_codec_topk_k(params->block_len[b], ratio);
        sum += params->block_len[b];
    }
    return sum == numel ? k : 0;
}

size_t ps_codec_bound_ex(ps_dtype_t dt, ps_codec_t c, size_t numel, const ps_codec_params_t *params)
{
    size_t b = ps_codec_bound(dt, c, numel);
    if (!b) return b;
    if (c == PS_CODEC_SIGN && params && params->nblocks > 1)
        return PS_SIGN_HDR + 4 + 8 * params->nblocks + (numel + 7) / 8;
    if (c == PS_CODEC_SIGN) return PS_SIGN_HDR + (numel + 7) / 8;
    if (c != PS_CODEC_TOPK) return b;
    size_t k = ps_codec_topk_k_ex(numel, params);
    return PS_TOPK_HDR + k * (4 + ps_dtype_size(dt));
}

size_t ps_codec_scratch_size(ps_dtype_t dt, ps_codec_t c, size_t numel)
{
    size_t es = ps_dtype_size(dt);
    /* TOPK selects by radix select in place and SIGN streams: neither needs any */
    if (c != PS_CODEC_LZ4 || !es || numel > (SIZE_MAX - 4096) / 8) return 0;
    /* encode: converted chunk + shuffled chunk; decode: the whole tensor in
     * the wire dtype + one decompressed chunk.  The decode need is larger. */
    size_t chunk = numel < CHUNK_ELEMS ? numel : CHUNK_ELEMS;
    return (numel + chunk) * es;
}

/* ---- byte shuffle ------------------------------------------------------- */

static void shuffle_scalar(uint8_t *out, const uint8_t *in, size_t n, size_t es, size_t from)
{
    for (size_t i = from; i < n; i++)
        for (size_t b = 0; b < es; b++) out[b * n + i] = in[i * es + b];
}

static void unshuffle_scalar(uint8_t *out, const uint8_t *in, size_t n, size_t es, size_t from)
{
    for (size_t i = from; i < n; i++)
        for (size_t b = 0; b < es; b++) out[i * es + b] = in[b * n + i];
}

#ifdef PS_CODEC_X86
#define PS_AVX2 __attribute__((target("avx2")))
/* 4x4 byte transpose inside each 128-bit lane (its own inverse) */
#define T4 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15
/* halves: gather low bytes then high bytes, and its inverse */
#define S2 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15
#define U2 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15

PS_AVX2 static void shuffle_avx2(uint8_t *out, const uint8_t *in, size_t n, size_t es)
{
    size_t i = 0;
    if (es == 4) {
        const __m256i t4 = _mm256_setr_epi8(T4, T4);
        const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (; i + 8 <= n; i += 8) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(in + 4 * i));
            v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, t4), perm);
            __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
            _mm_storel_epi64((__m128i *)(out + i), lo);
            _mm_storel_epi64((__m128i *)(out + n + i), _mm_unpackhi_epi64(lo, lo));
            _mm_storel_epi64((__m128i *)(out + 2 * n + i), hi);
            _mm_storel_epi64((__m128i *)(out + 3 * n + i), _mm_unpackhi_epi64(hi, hi));
        }
    } else if (es == 2) {
        const __m256i s2 = _mm256_setr_epi8(S2, S2);
        for (; i + 16 <= n; i += 16) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(in + 2 * i));
            v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, s2), 0xd8);
            _mm_storeu_si128((__m128i *)(out + i), _mm256_castsi256_si128(v));
            _mm_storeu_si128((__m128i *)(out + n + i), _mm256_extracti128_si256(v, 1));
        }
    }
    shuffle_scalar(out, in, n, es, i);
}

PS_AVX2 static void unshuffle_avx2(uint8_t *out, const uint8_t *in, size_t n, size_t es)
{
    size_t i = 0;
    if (es == 4) {
        const __m256i t4 = _mm256_setr_epi8(T4, T4);
        const __m256i inv = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        for (; i + 8 <= n; i += 8) {
            __m128i lo = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(in + i)),
                                            _mm_loadl_epi64((const __m128i *)(in + n + i)));
            __m128i hi = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(in + 2 * n + i)),
                                            _mm_loadl_epi64((const __m128i *)(in + 3 * n + i)));
            __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
            v = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(v, inv), t4);
            _mm256_storeu_si256((__m256i *)(out + 4 * i), v);
        }
    } else if (es == 2) {
        const __m256i u2 = _mm256_setr_epi8(U2, U2);
        for (; i + 16 <= n; i += 16) {
            __m128i lo = _mm_loadu_si128((const __m128i *)(in + i));
            __m128i hi = _mm_loadu_si128((const __m128i *)(in + n + i));
            __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
            v = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(v, 0xd8), u2);
            _mm256_storeu_si256((__m256i *)(out + 2 * i), v);
        }
    }
    unshuffle_scalar(out, in, n, es, i);
}
#endif

/* The vector shuffle follows the half-conversion switch (both need AVX2), so
 * ps_half_use_simd(0) gives tests and benchmarks the all-scalar codec. */
void ps_codec_shuffle(void *out, const void *in, size_t n, size_t es)
{
#ifdef PS_CODEC_X86
    if (ps_half_simd()) {
        shuffle_avx2(out, in, n, es);
        return;
    }
#endif
    shuffle_scalar(out, in, n, es, 0);
}

void ps_codec_unshuffle(void *out, const void *in, size_t n, size_t es)
{
#ifdef PS_CODEC_X86
    if (ps_half_simd()) {
        unshuffle_avx2(out, in, n, es);
        return;
    }
#endif
    unshuffle_scalar(out, in, n, es, 0);
}

/* fp32 -> wire dtype, n elements; a misaligned dst goes through a bounce
 * buffer (the converters write typed uint16_t arrays) */
static void to_wire(void *dst, const float *src, size_t n, ps_dtype_t dt)
{
    if (dt == PS_DT_FP32) {
        memcpy(dst, src, n * 4);
        return;
    }
    void (*conv)(uint16_t *, const float *, size_t) = dt == PS_DT_FP16 ? ps_fp32_to_fp16 : ps_fp32_to_bf16;
    if (((uintptr_t)dst & 1) == 0) {
        conv(dst, src, n);
        return;
    }
    uint16_t bounce[2048];
    for (size_t i = 0; i < n; i += 2048) {
        size_t k = n - i < 2048 ? n - i : 2048;
        conv(bounce, src + i, k);
        memcpy((uint8_t *)dst + 2 * i, bounce, 2 * k);
    }
}

/* wire dtype -> fp32 (=, += or -=) for n elements at an aligned src */
static void from_wire_aligned(float *dst, const void *src, size_t n, ps_dtype_t dt, int mode)
{
    if (mode == PS_DECODE_SUB) { /* rare (error feedback): convert aside, then subtract */
        float tmp[1024];
        for (size_t i = 0; i < n; i += 1024) {
            size_t k = n - i < 1024 ? n - i : 1024;
            from_wire_aligned(tmp, (const uint8_t *)src + i * ps_dtype_size(dt), k, dt, PS_DECODE_SET);
            for (size_t j = 0; j < k; j++) dst[i + j] -= tmp[j];
        }
        return;
    }
    int add = mode == PS_DECODE_ADD;
    if (dt == PS_DT_FP32) {
        const float *s = src;
        if (add)
            ps_fp32_add(dst, s, n);
        else
            memcpy(dst, s, n * 4);
    } else if (dt == PS_DT_FP16) {
        if (add) ps_fp16_add_fp32(dst, src, n);
        else ps_fp16_to_fp32(dst, src, n);
    } else {
        if (add) ps_bf16_add_fp32(dst, src, n);
        else ps_bf16_to_fp32(dst, src, n);
    }
}

/* Payloads arrive at whatever address the transport gives; bounce misaligned
 * ones through a small stack buffer rather than read them as typed arrays. */
static void from_wire(float *dst, const void *src, size_t n, ps_dtype_t dt, int mode)
{
    size_t es = ps_dtype_size(dt);
    if (!n) return;
    if (((uintptr_t)src & (es - 1)) == 0) {
        from_wire_aligned(dst, src, n, dt, mode);
        return;
    }
    float bounce[1024];
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i += 1024) {
        size_t k = n - i < 1024 ? n - i : 1024;
        memcpy(bounce, p + i * es, k * es);
        from_wire_aligned(dst + i, bounce, k, dt, mode);
    }
}

/* ---- LZ4 ------------------------------------------------------------------ */

static int lz4_encode(uint8_t *dst, size_t cap, size_t *out_len, const float *src, size_t numel,
                      ps_dtype_t dt, uint8_t *scratch)
{
    size_t es = ps_dtype_size(dt), pos = LZ4_HDR;
    size_t chunk = numel < CHUNK_ELEMS ? numel : CHUNK_ELEMS;
    uint8_t *conv = scratch, *shuf = scratch ? scratch + chunk * es : NULL; /* NULL: numel 0 */

    if (cap < LZ4_HDR) return PS_ERANGE;
    ps_le_put32(dst, LZ4_MAGIC);
    dst[4] = (uint8_t)dt;
    dst[5] = FLAG_SHUFFLE;
    dst[6] = dst[7] = 0;
    ps_le_put64(dst + 8, numel);
    for (size_t i = 0; i < numel; i += CHUNK_ELEMS) {
        size_t n = numel - i < CHUNK_ELEMS ? numel - i : CHUNK_ELEMS, raw = n * es;
        const void *elems = src + i;
        if (dt != PS_DT_FP32) {
            to_wire(conv, src + i, n, dt);
            elems = conv;
        }
        ps_codec_shuffle(shuf, elems, n, es);
        if (cap - pos < 4) return PS_ERANGE;
        size_t room = cap - pos - 4, want = raw - 1; /* only keep LZ4 output that shrinks */
        int clen = LZ4_compress_default((const char *)shuf, (char *)dst + pos + 4, (int)raw,
                                        (int)(room < want ? room : want));
        if (clen > 0) {
            ps_le_put32(dst + pos, (uint32_t)clen);
            pos += 4 + (size_t)clen;
        } else {
            if (room < raw) return PS_ERANGE;
            ps_le_put32(dst + pos, CHUNK_RAW | (uint32_t)raw);
            memcpy(dst + pos + 4, shuf, raw);
            pos += 4 + raw;
        }
    }
    *out_len = pos;
    return 0;
}

static int lz4_decode(float *dst, size_t numel, const uint8_t *src, size_t len, ps_dtype_t dt,
                      int mode, uint8_t *scratch)
{
    size_t es = ps_dtype_size(dt), pos = LZ4_HDR;
    uint8_t *whole = scratch, *chunkbuf = scratch ? scratch + numel * es : NULL; /* NULL: numel 0 */

    if (len < LZ4_HDR) {
        ps_error("lz4 payload of %zu bytes is shorter than its %d-byte header", len, LZ4_HDR);
        return PS_EMISMATCH;
    }
    if (ps_le_get32(src) != LZ4_MAGIC || (src[5] & ~FLAG_SHUFFLE) || src[6] || src[7]) {
        ps_error("lz4 payload: bad magic 0x%08x or flags 0x%02x", ps_le_get32(src), src[5]);
        return PS_ECORRUPT;
    }
    if (src[4] != (uint8_t)dt || ps_le_get64(src + 8) != (uint64_t)numel) {
        ps_error("lz4 payload holds %llu x %s, expected %zu x %s",
                 (unsigned long long)ps_le_get64(src + 8), ps_dtype_name((ps_dtype_t)src[4]), numel,
                 ps_dtype_name(dt));
        return PS_EMISMATCH;
    }
    int shuffled = src[5] & FLAG_SHUFFLE;
    for (size_t i = 0; i < numel; i += CHUNK_ELEMS) {
        size_t n = numel - i < CHUNK_ELEMS ? numel - i : CHUNK_ELEMS, raw = n * es;
        if (len - pos < 4) {
            ps_error("lz4 payload truncated at byte %zu of %zu (chunk at element %zu)", pos, len, i);
            return PS_EMISMATCH;
        }
        uint32_t word = ps_le_get32(src + pos), clen = word & ~CHUNK_RAW;
        pos += 4;
        if (clen > len - pos) {
            ps_error("lz4 chunk at element %zu claims %u bytes, %zu left", i, clen, len - pos);
            return PS_EMISMATCH;
        }
        const uint8_t *plane = src + pos;
        if (word & CHUNK_RAW) {
            if (clen != raw) {
                ps_error("stored chunk at element %zu has %u bytes, expected %zu", i, clen, raw);
                return PS_ECORRUPT;
            }
        } else {
            int got = LZ4_decompress_safe((const char *)plane, (char *)chunkbuf, (int)clen, (int)raw);
            if (got != (int)raw) {
                ps_error("lz4 chunk at element %zu does not decompress to %zu bytes (lz4: %d)", i,
                         raw, got);
                return PS_ECORRUPT;
            }
            plane = chunkbuf;
        }
        if (shuffled) ps_codec_unshuffle(whole + i * es, plane, n, es);
        else memcpy(whole + i * es, plane, raw);
        pos += clen;
    }
    if (pos != len) {
        ps_error("lz4 payload has %zu trailing bytes after %zu elements", len - pos, numel);
        return PS_EMISMATCH;
    }
    from_wire(dst, whole, numel, dt, mode);
    return 0;
}

/* ---- entry points -------------------------------------------------------- */

static int check_args(ps_dtype_t dt, ps_codec_t c, size_t numel, int mode)
{
    if (!ps_dtype_size(dt) || (unsigned)c > PS_CODEC_SIGN) {
        ps_error("unknown dtype %d or codec %d", (int)dt, (int)c);
        return PS_EINVAL;
    }
    if (numel > (SIZE_MAX - 4096) / 8) {
        ps_error("tensor of %zu elements is too large to encode", numel);
        return PS_EINVAL;
    }
    if (c == PS_CODEC_TOPK && numel > UINT32_MAX) {
        ps_error("topk: %zu elements do not fit 32-bit indices", numel);
        return PS_EINVAL;
    }
    if (mode < PS_DECODE_SET || mode > PS_DECODE_SUB) {
        ps_error("unknown decode mode %d", mode);
        return PS_EINVAL;
    }
    return 0;
}

int ps_codec_encode(void *dst, size_t dst_cap, size_t *out_len, const float *src, size_t numel,
                    ps_dtype_t dt, ps_codec_t c, void *scratch)
{
    return ps_codec_encode_ex(dst, dst_cap, out_len, src, numel, dt, c, NULL, scratch);
}

int ps_codec_encode_ex(void *dst, size_t dst_cap, size_t *out_len, const float *src, size_t numel,
                       ps_dtype_t dt, ps_codec_t c, const ps_codec_params_t *params, void *scratch)
{
    int rc = check_args(dt, c, numel, PS_DECODE_SET);
    if (rc) return rc;
    if (c == PS_CODEC_TOPK) {
        float ratio = params ? params->topk_ratio : 0.f;
        if (!(ratio >= 0.f && ratio <= 1.f)) {
            ps_error("topk: ratio %g is not in (0, 1]", (double)ratio);
            return PS_EINVAL;
        }
        if (params && params->nblocks > 1 && !ps_codec_topk_k_ex(numel, params)) {
            ps_error("topk: %zu blocks do not add up to %zu elements (or one is empty)",
                     params->nblocks, numel);
            return PS_EINVAL;
        }
        return ps_codec_topk_encode_(dst, dst_cap, out_len, src, numel, dt, ratio, params);
    }
    if (c == PS_CODEC_SIGN) return ps_codec_sign_encode_(dst, dst_cap, out_len, src, numel, dt, params);
    size_t es = ps_dtype_size(dt);
    if (c == PS_CODEC_RAW) {
        if (dst_cap < numel * es) {
            ps_error("encode: %zu bytes needed, buffer holds %zu", numel * es, dst_cap);
            return PS_ERANGE;
        }
        to_wire(dst, src, numel, dt);
        *out_len = numel * es;
        return 0;
    }
    void *own = NULL;
    if (!scratch && numel) {
        own = scratch = malloc(ps_codec_scratch_size(dt, c, numel));
        if (!own) {
            ps_error("encode: cannot allocate %zu bytes of scratch", ps_codec_scratch_size(dt, c, numel));
            return PS_ENOMEM;
        }
    }
    rc = lz4_encode(dst, dst_cap, out_len, src, numel, dt, scratch);
    if (rc == PS_ERANGE) ps_error("encode: lz4 output does not fit in %zu bytes", dst_cap);
    free(own);
    return rc;
}

int ps_codec_decode(float *dst, size_t numel, const void *src, size_t len, ps_dtype_t dt,
                    ps_codec_t c, int add, void *scratch)
{
    return ps_codec_decode_ex(dst, numel, src, len, dt, c, add ? PS_DECODE_ADD : PS_DECODE_SET, scratch);
}

int ps_codec_decode_ex(float *dst, size_t numel, const void *src, size_t len, ps_dtype_t dt,
                       ps_codec_t c, ps_decode_mode_t mode, void *scratch)
{
    int rc = check_args(dt, c, numel, (int)mode);
    if (rc) return rc;
    if (c == PS_CODEC_TOPK) return ps_codec_topk_decode_(dst, numel, src, len, dt, mode);
    if (c == PS_CODEC_SIGN) return ps_codec_sign_decode_(dst, numel, src, len, dt, mode);
    size_t es = ps_dtype_size(dt);
    if (c == PS_CODEC_RAW) {
        if (len != numel * es) {
            ps_error("raw %s payload of %zu bytes, expected %zu elements = %zu bytes",
                     ps_dtype_name(dt), len, numel, numel * es);
            return PS_EMISMATCH;
        }
        from_wire(dst, src, numel, dt, mode);
        return 0;
    }
    void *own = NULL;
    if (!scratch && numel) {
        own = scratch = malloc(ps_codec_scratch_size(dt, c, numel));
        if (!own) {
            ps_error("decode: cannot allocate %zu bytes of scratch", ps_codec_scratch_size(dt, c, numel));
            return PS_ENOMEM;
        }
    }
    rc = lz4_decode(dst, numel, src, len, dt, mode, scratch);
    free(own);
    return rc;
}
