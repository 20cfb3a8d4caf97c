/* Fuzz target: every wire dtype x codec x decode mode.
 * Input: u8 dtype | u8 codec | u8 mode | u16 numel (LE, <= 4096) | u8 ratio |
 * payload.  Two checks per input:
 *  1. the payload is decoded as hostile bytes: the result is 0 or
 *     PS_EMISMATCH / PS_ECORRUPT, an error leaves dst bit-identical, and
 *     nothing past numel is ever written;
 *  2. the payload is read as floats and encoded with the same codec (top-k
 *     ratio from the ratio byte), the output must fit the bounds and decode
 *     back to what the codec promises. */
#include "tests/fuzz/fuzz.h"

#include "ps_codec.h"
#include "ps_error.h"
#include "ps_half.h"
#include "ps_log.h"

#include <math.h>
#include <string.h>

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size);

static float codec_fz_through(float x, ps_dtype_t dt)
{
    if (dt == PS_DT_FP16) return ps_fp16_to_fp32_1(ps_fp32_to_fp16_1(x));
    if (dt == PS_DT_BF16) return ps_bf16_to_fp32_1(ps_fp32_to_bf16_1(x));
    return x;
}

static int codec_fz_same(float a, float b)
{
    return !memcmp(&a, &b, 4) || (isnan(a) && isnan(b));
}

static void codec_fz_decode(const uint8_t *p, size_t plen, size_t numel, ps_dtype_t dt,
                            ps_codec_t c, ps_decode_mode_t mode)
{
    const size_t guard = 16;
    float *dst = malloc((numel + guard) * 4), *keep = malloc((numel + guard) * 4);
    uint8_t *copy = malloc(plen ? plen : 1); /* exact size: ASan sees any over-read */
    if (!dst || !keep || !copy) abort();
    memcpy(copy, p, plen);
    for (size_t i = 0; i < numel + guard; i++) keep[i] = dst[i] = (float)i * 0.25f - 3.f;
    int rc = ps_codec_decode_ex(dst, numel, copy, plen, dt, c, mode, NULL);
    FUZZ_CHECK(rc == 0 || rc == PS_EMISMATCH || rc == PS_ECORRUPT, "decode %s/%s returned %d",
               ps_dtype_name(dt), ps_codec_name(c), rc);
    if (rc) FUZZ_CHECK(!memcmp(dst, keep, (numel + guard) * 4), "failed decode changed dst");
    else FUZZ_CHECK(!memcmp(dst + numel, keep + numel, guard * 4), "decode wrote past numel");
    free(dst), free(keep), free(copy);
}

static void codec_fz_roundtrip(const uint8_t *p, size_t plen, ps_dtype_t dt, ps_codec_t c, float ratio)
{
    size_t n = plen / 4;
    if (n > 4096) n = 4096;
    float *x = malloc(n * 4 + 4), *y = malloc(n * 4 + 4);
    if (!x || !y) abort();
    memcpy(x, p, n * 4);
    ps_codec_params_t prm = {.topk_ratio = ratio};
    size_t cap = ps_codec_bound_ex(dt, c, n, &prm), len = 0;
    FUZZ_CHECK(cap <= ps_codec_bound(dt, c, n), "bound_ex %zu > bound", cap);
    uint8_t *enc = malloc(cap + 1);
    if (!enc) abort();
    int rc = ps_codec_encode_ex(enc, cap, &len, x, n, dt, c, &prm, NULL);
    if (c == PS_CODEC_SIGN && rc == PS_ENONFINITE) goto out; /* NaN/Inf in x: documented */
    FUZZ_CHECK(rc == 0 && len <= cap, "encode %s/%s n=%zu: rc %d len %zu cap %zu", ps_dtype_name(dt),
               ps_codec_name(c), n, rc, len, cap);
    rc = ps_codec_decode_ex(y, n, enc, len, dt, c, PS_DECODE_SET, NULL);
    FUZZ_CHECK(rc == 0, "own %s/%s payload does not decode: %d", ps_dtype_name(dt), ps_codec_name(c), rc);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        float want = codec_fz_through(x[i], dt);
        if (c == PS_CODEC_RAW || c == PS_CODEC_LZ4) {
            FUZZ_CHECK(codec_fz_same(y[i], want), "element %zu does not round-trip", i);
        } else if (c == PS_CODEC_TOPK) {
            int sent = codec_fz_same(y[i], want) && !(y[i] == 0.f && want != 0.f);
            FUZZ_CHECK(sent || (y[i] == 0.f && !signbit(y[i])), "topk element %zu neither sent nor +0", i);
            kept += sent && want != 0.f; /* an unsent element and a sent +0 look alike */
        } else {
            FUZZ_CHECK(fabsf(y[i]) == fabsf(y[0]) && !signbit(y[i]) == !signbit(x[i]),
                       "sign element %zu is not +-scale with x's sign", i);
        }
    }
    if (c == PS_CODEC_TOPK)
        FUZZ_CHECK(kept <= ps_codec_topk_k(n, ratio), "topk kept %zu > k", kept);
out:
    free(x), free(y), free(enc);
}

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    ps_log_level = -1; /* every rejected payload would log */
    if (size < 6) return 0;
    ps_dtype_t dt = (ps_dtype_t)(data[0] % 3);
    ps_codec_t c = (ps_codec_t)(data[1] % 4);
    ps_decode_mode_t mode = (ps_decode_mode_t)(data[2] % 3);
    size_t numel = (size_t)(data[3] | data[4] << 8) % 4097;
    float ratio = data[5] / 255.f; /* 0 = the default ratio */
    codec_fz_decode(data + 6, size - 6, numel, dt, c, mode);
    codec_fz_roundtrip(data + 6, size - 6, dt, c, ratio);
    return 0;
}
