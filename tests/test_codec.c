/* ps_codec: round trips for every dtype x codec on special values and sizes
 * around the vector widths and the LZ4 chunk size; decode must reject every
 * inconsistent payload and leave dst untouched (poisoned and compared). */
#include "ps_codec.h"
#include "ps_error.h"
#include "ps_half.h"
#include "ps_log.h"
#include "tests/lib/tap.h"
#define CODEC_TEST_SEED 0x452821e638d01377ull
#include "tests/lib/codec_testutil.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { PAT_GRAD, PAT_SPECIAL, PAT_ZERO, PAT_NOISE, NPAT };
static const char *pat_name[] = {"gradient", "special", "zeros", "random bits"};

static void fill(float *x, size_t n, int pat)
{
    static const float special[] = {0.f, -0.f, INFINITY, -INFINITY, NAN, FLT_MAX, -FLT_MAX,
                                    65504.f, 65520.f, 0x1p-24f, -0x1p-25f, 0x1p-14f, 0x1p-149f,
                                    -0x1p-126f, 1.f, -1.f, 0x1.0020p0f, 0x1.0100p0f, 3e38f, 1e-40f};
    for (size_t i = 0; i < n; i++) {
        switch (pat) {
        case PAT_GRAD: x[i] = rnd_normal() * 1e-3f; break;
        case PAT_SPECIAL: x[i] = i % 3 ? special[rnd32() % 20] : u2f(rnd32()); break;
        case PAT_ZERO: x[i] = 0.f; break;
        default: x[i] = u2f(rnd32()); break;
        }
    }
}

static void test_names(void)
{
    ps_dtype_t dt;
    ps_codec_t c;
    is_int(ps_dtype_size(PS_DT_FP32) * 10 + ps_dtype_size(PS_DT_FP16) + ps_dtype_size(PS_DT_BF16), 44, "dtype sizes 4/2/2");
    is_int(ps_dtype_size((ps_dtype_t)7), 0, "unknown dtype size 0");
    ok(!ps_dtype_parse("bf16", &dt) && dt == PS_DT_BF16 && !ps_dtype_parse("FP16", &dt) && dt == PS_DT_FP16,
       "dtype parse");
    is_int(ps_dtype_parse("fp64", &dt), PS_EINVAL, "dtype parse rejects fp64");
    ok(!ps_codec_parse("none", &c) && c == PS_CODEC_RAW && !ps_codec_parse("lz4", &c) && c == PS_CODEC_LZ4,
       "codec parse none/lz4");
    is_int(ps_codec_parse("zstd", &c), PS_EINVAL, "codec parse rejects zstd");
    ok(!strcmp(ps_dtype_name(PS_DT_FP32), "fp32") && !strcmp(ps_codec_name(PS_CODEC_LZ4), "lz4"), "names");
}

static void test_shuffle(void)
{
    uint8_t in[4 * 80], out[4 * 80], back[4 * 80], ref[4 * 80];
    int good = 1;
    for (size_t i = 0; i < sizeof in; i++) in[i] = (uint8_t)rnd32();
    for (int simd = 0; simd < 2; simd++) {
        ps_half_use_simd(simd);
        for (size_t es = 2; es <= 4; es += 2)
            for (size_t n = 0; n <= 80; n++) {
                for (size_t i = 0; i < n; i++)
                    for (size_t b = 0; b < es; b++) ref[b * n + i] = in[i * es + b];
                ps_codec_shuffle(out, in, n, es);
                ps_codec_unshuffle(back, out, n, es);
                good &= !memcmp(out, ref, n * es) && !memcmp(back, in, n * es);
            }
    }
    ps_half_use_simd(1);
    ok(good, "shuffle == definition and unshuffle inverts it (n 0..80, es 2/4, simd on/off)");
}

static void test_round_trips(void)
{
    static const size_t sizes[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4097,
                                   (1u << 20) + 12345};
    size_t maxn = (1u << 20) + 12345;
    float *x = malloc(maxn * 4), *y = malloc(maxn * 4), *z = malloc(maxn * 4);
    uint8_t *enc = malloc(ps_codec_bound(PS_DT_FP32, PS_CODEC_LZ4, maxn));
    void *scratch = malloc(ps_codec_scratch_size(PS_DT_FP32, PS_CODEC_LZ4, maxn));
    long cases = 0, bad = 0, badadd = 0, badlen = 0;
    size_t lz_grad[3] = {0}, lz_zero[3] = {0};
    for (int pat = 0; pat < NPAT; pat++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            size_t n = sizes[si];
            if (n > 5000 && pat == PAT_SPECIAL) continue;
            fill(x, n, pat);
            for (int dt = 0; dt < 3; dt++)
                for (int c = 0; c < 2; c++) {
                    size_t len = 0, bound = ps_codec_bound(dt, c, n);
                    int rc = ps_codec_encode(enc, bound, &len, x, n, dt, c, si & 1 ? scratch : NULL);
                    cases++;
                    if (rc || len > bound) {
                        badlen++;
                        diag("encode %s/%s n=%zu: rc %d len %zu bound %zu", ps_dtype_name(dt), ps_codec_name(c), n, rc, len, bound);
                        continue;
                    }
                    if (c == PS_CODEC_RAW && len != n * ps_dtype_size(dt)) badlen++;
                    if (c == PS_CODEC_LZ4 && n == (1u << 20) + 12345 && pat == PAT_GRAD) lz_grad[dt] = len;
                    if (c == PS_CODEC_LZ4 && n == (1u << 20) + 12345 && pat == PAT_ZERO) lz_zero[dt] = len;
                    for (size_t i = 0; i < n; i++) y[i] = -7.f;
                    rc = ps_codec_decode(y, n, enc, len, dt, c, 0, si & 2 ? scratch : NULL);
                    size_t nb = 0;
                    for (size_t i = 0; i < n; i++) nb += !same(y[i], through(x[i], dt));
                    if (rc || nb) {
                        bad++;
                        diag("%s %s/%s n=%zu: rc %d, %zu wrong", pat_name[pat], ps_dtype_name(dt), ps_codec_name(c), n, rc, nb);
                    }
                    /* add = 1 accumulates onto what dst held */
                    for (size_t i = 0; i < n; i++) z[i] = y[i] = (float)(i % 7) - 3.f;
                    rc = ps_codec_decode(y, n, enc, len, dt, c, 1, scratch);
                    nb = 0;
                    for (size_t i = 0; i < n; i++) nb += !same(y[i], z[i] + through(x[i], dt));
                    if (rc || nb) {
                        badadd++;
                        diag("add: %s %s/%s n=%zu: rc %d, %zu wrong", pat_name[pat], ps_dtype_name(dt), ps_codec_name(c), n, rc, nb);
                    }
                    /* SUB (error feedback) subtracts */
                    for (size_t i = 0; i < n; i++) y[i] = z[i];
                    rc = ps_codec_decode_ex(y, n, enc, len, dt, c, PS_DECODE_SUB, scratch);
                    nb = 0;
                    for (size_t i = 0; i < n; i++) nb += !same(y[i], z[i] - through(x[i], dt));
                    if (rc || nb) {
                        badadd++;
                        diag("sub: %s %s/%s n=%zu: rc %d, %zu wrong", pat_name[pat], ps_dtype_name(dt), ps_codec_name(c), n, rc, nb);
                    }
                }
        }
    is_int(badlen, 0, "encode succeeds within ps_codec_bound, raw length exact (%ld cases)", cases);
    is_int(bad, 0, "decode(encode(x)) == x through the wire dtype, bit for bit (%ld cases)", cases);
    is_int(badadd, 0, "decode ADD (add=1) gives dst + value, SUB gives dst - value");
    for (int dt = 0; dt < 3; dt++) {
        size_t raw = ((1u << 20) + 12345) * ps_dtype_size(dt);
        diag("lz4 %s: gradient %.3f, zeros %.5f of raw", ps_dtype_name(dt), (double)lz_grad[dt] / raw, (double)lz_zero[dt] / raw);
        /* fp16's high byte (sign, 5 exponent bits, 2 mantissa bits) of N(0,1e-3)
         * noise has no 4-byte repeats for LZ4 to find: only ask that the
         * stored fallback keeps it at raw size plus framing. */
        if (dt == PS_DT_FP16)
            ok(lz_grad[dt] <= ps_codec_bound(dt, PS_CODEC_LZ4, (1u << 20) + 12345), "lz4 fp16 gradient within bound");
        else
            ok(lz_grad[dt] < raw, "lz4+shuffle shrinks a gradient-like %s tensor", ps_dtype_name(dt));
        ok(lz_zero[dt] * 100 < raw, "lz4 shrinks zeros of %s > 100x", ps_dtype_name(dt));
    }

    /* raw wire layout is the plain little-endian element array */
    fill(x, 33, PAT_SPECIAL);
    size_t len;
    int layout = 1;
    ps_codec_encode(enc, 66, &len, x, 33, PS_DT_FP16, PS_CODEC_RAW, NULL);
    for (int i = 0; i < 33; i++) layout &= (enc[2 * i] | enc[2 * i + 1] << 8) == ps_fp32_to_fp16_1(x[i]);
    ps_codec_encode(enc, 66, &len, x, 33, PS_DT_BF16, PS_CODEC_RAW, NULL);
    for (int i = 0; i < 33; i++) layout &= (enc[2 * i] | enc[2 * i + 1] << 8) == ps_fp32_to_bf16_1(x[i]);
    ok(layout, "raw fp16/bf16 payload is the little-endian converted array");

    /* payload at an odd address (decode must not assume alignment) */
    fill(x, 1001, PAT_GRAD);
    int mis = 1;
    for (int dt = 0; dt < 3; dt++)
        for (int c = 0; c < 2; c++) {
            ps_codec_encode(enc + 1, ps_codec_bound(dt, c, 1001), &len, x, 1001, dt, c, NULL);
            mis &= ps_codec_decode(y, 1001, enc + 1, len, dt, c, 0, NULL) == 0;
            for (int i = 0; i < 1001; i++) mis &= same(y[i], through(x[i], dt));
        }
    ok(mis, "encode/decode at an odd address");

    /* scalar and SIMD paths interoperate: encode one way, decode the other */
    fill(x, 4097, PAT_SPECIAL);
    int cross = 1;
    for (int dt = 0; dt < 3; dt++) {
        size_t l1, l2;
        uint8_t *e2 = malloc(ps_codec_bound(dt, PS_CODEC_LZ4, 4097));
        ps_half_use_simd(1);
        ps_codec_encode(enc, ps_codec_bound(dt, PS_CODEC_LZ4, 4097), &l1, x, 4097, dt, PS_CODEC_LZ4, NULL);
        ps_half_use_simd(0);
        ps_codec_encode(e2, ps_codec_bound(dt, PS_CODEC_LZ4, 4097), &l2, x, 4097, dt, PS_CODEC_LZ4, NULL);
        cross &= l1 == l2 && !memcmp(enc, e2, l1);
        cross &= ps_codec_decode(y, 4097, enc, l1, dt, PS_CODEC_LZ4, 0, NULL) == 0;
        for (int i = 0; i < 4097; i++) cross &= same(y[i], through(x[i], dt));
        ps_half_use_simd(1);
        free(e2);
    }
    ok(cross, "scalar and SIMD encodings are byte-identical and decode either way");
    free(x); free(y); free(z); free(enc); free(scratch);
}

#define POISON 0x5a

/* decode must fail with one of the allowed codes and not touch dst */
static int rejects(const void *src, size_t len, size_t numel, ps_dtype_t dt, ps_codec_t c, int want1, int want2)
{
    static float dst[8192];
    static uint8_t poison[sizeof dst];
    memset(poison, POISON, sizeof poison);
    memset(dst, POISON, sizeof dst);
    int rc = ps_codec_decode(dst, numel, src, len, dt, c, rnd32() & 1, NULL);
    int r = (rc == want1 || rc == want2) && !memcmp(dst, poison, sizeof dst);
    if (!r) diag("len %zu numel %zu %s/%s: rc %d (%s)", len, numel, ps_dtype_name(dt), ps_codec_name(c), rc, ps_errname(rc));
    return r;
}

static void test_rejects(void)
{
    float x[4000];
    static uint8_t enc[40000], bad[40000];
    size_t len;
    int good;
    fill(x, 4000, PAT_GRAD);

    /* raw: any length other than numel * size */
    good = 1;
    for (int dt = 0; dt < 3; dt++) {
        size_t es = ps_dtype_size(dt);
        ps_codec_encode(enc, sizeof enc, &len, x, 1000, dt, PS_CODEC_RAW, NULL);
        size_t lens[] = {0, 1, len - 1, len + 1, len - es, len + es, 2 * len};
        for (size_t k = 0; k < 7; k++) good &= rejects(enc, lens[k], 1000, dt, PS_CODEC_RAW, PS_EMISMATCH, PS_EMISMATCH);
        good &= rejects(enc, len, 999, dt, PS_CODEC_RAW, PS_EMISMATCH, PS_EMISMATCH);
        good &= rejects(enc, len, 1001, dt, PS_CODEC_RAW, PS_EMISMATCH, PS_EMISMATCH);
    }
    ok(good, "raw: wrong lengths and element counts rejected, dst untouched");

    /* lz4: every truncation, extensions, numel and dtype mismatch */
    for (int pat = 0; pat < 2; pat++) {
        long fails = 0, tried = 0;
        fill(x, 4000, pat == 0 ? PAT_GRAD : PAT_NOISE);
        for (int dt = 0; dt < 3; dt++) {
            ps_codec_encode(enc, sizeof enc, &len, x, 4000, dt, PS_CODEC_LZ4, NULL);
            for (size_t l = 0; l < len; l += (l < 64 || len - l < 64) ? 1 : 37, tried++)
                fails += !rejects(enc, l, 4000, dt, PS_CODEC_LZ4, PS_EMISMATCH, PS_ECORRUPT);
            memcpy(bad, enc, len);
            bad[len] = 0;
            bad[len + 1] = 0x42;
            fails += !rejects(bad, len + 1, 4000, dt, PS_CODEC_LZ4, PS_EMISMATCH, PS_EMISMATCH);
            fails += !rejects(bad, len + 2, 4000, dt, PS_CODEC_LZ4, PS_EMISMATCH, PS_EMISMATCH);
            fails += !rejects(enc, len, 3999, dt, PS_CODEC_LZ4, PS_EMISMATCH, PS_EMISMATCH);
            fails += !rejects(enc, len, 4001, dt, PS_CODEC_LZ4, PS_EMISMATCH, PS_EMISMATCH);
            fails += !rejects(enc, len, 4000, (dt + 1) % 3, PS_CODEC_LZ4, PS_EMISMATCH, PS_EMISMATCH);
            fails += !rejects(enc, len, 4000, dt, PS_CODEC_RAW, PS_EMISMATCH, PS_EMISMATCH);
            /* header fields corrupted */
            for (int b = 0; b < 8; b++) {
                memcpy(bad, enc, len);
                bad[b] ^= 0x21;
                fails += !rejects(bad, len, 4000, dt, PS_CODEC_LZ4, PS_EMISMATCH, PS_ECORRUPT);
            }
            /* chunk length word pointing past the end or shrunk */
            memcpy(bad, enc, len);
            bad[16] += 1;
            fails += !rejects(bad, len, 4000, dt, PS_CODEC_LZ4, PS_EMISMATCH, PS_ECORRUPT);
            memcpy(bad, enc, len);
            bad[19] ^= 0x80; /* flip compressed <-> stored */
            fails += !rejects(bad, len, 4000, dt, PS_CODEC_LZ4, PS_EMISMATCH, PS_ECORRUPT);
            tried += 17;
        }
        is_int(fails, 0, "lz4 (%s): %ld truncated / extended / mismatched payloads rejected, dst untouched",
               pat ? "stored chunks" : "compressed chunks", tried);
    }

    /* garbage: random bytes behind a valid header, random flips in the body.
     * A flip inside literal data may still decode (the wire CRC catches
     * that); what must hold is: no crash, and on error dst untouched. */
    static float dst[4000], keep[4000];
    long crashes_avoided = 0, untouched_bad = 0;
    ps_codec_encode(enc, sizeof enc, &len, x, 4000, PS_DT_FP16, PS_CODEC_LZ4, NULL);
    for (int t = 0; t < 3000; t++) {
        size_t l = t < 1000 ? len : 16 + rnd32() % (len + 64);
        memcpy(bad, enc, len);
        if (t < 1000) {
            for (int k = 0; k < 1 + t % 4; k++) bad[16 + rnd32() % (len - 16)] ^= (uint8_t)(1 + rnd32() % 255);
        } else {
            for (size_t k = 16; k < l; k++) bad[k] = (uint8_t)rnd32();
        }
        for (int i = 0; i < 4000; i++) keep[i] = dst[i] = (float)i;
        int rc = ps_codec_decode(dst, 4000, bad, l, PS_DT_FP16, PS_CODEC_LZ4, 0, NULL);
        crashes_avoided++;
        if (rc && memcmp(dst, keep, sizeof dst)) untouched_bad++;
        if (rc && rc != PS_EMISMATCH && rc != PS_ECORRUPT) untouched_bad++;
    }
    is_int(untouched_bad, 0, "%ld garbage / bit-flipped payloads: no crash, errors leave dst untouched", crashes_avoided);

    /* encode errors */
    size_t out = 12345;
    float one = 1.f;
    is_int(ps_codec_encode(enc, 3, &out, &one, 1, PS_DT_FP32, PS_CODEC_RAW, NULL), PS_ERANGE, "raw encode: dst too small");
    is_int(ps_codec_encode(enc, 10, &out, &one, 1, PS_DT_FP32, PS_CODEC_LZ4, NULL), PS_ERANGE, "lz4 encode: dst too small for header");
    fill(x, 4000, PAT_NOISE);
    size_t b = ps_codec_bound(PS_DT_FP32, PS_CODEC_LZ4, 4000);
    is_int(ps_codec_encode(enc, b - 1, &out, x, 4000, PS_DT_FP32, PS_CODEC_LZ4, NULL), PS_ERANGE,
           "lz4 encode: incompressible data into bound-1 bytes");
    is_int(ps_codec_encode(enc, b, &out, x, 4000, PS_DT_FP32, PS_CODEC_LZ4, NULL), 0, "... and into bound bytes");
    /* topk / sign have their own test (test_codec_sparse); here: raw bytes are not a valid sign payload */
    is_int(ps_codec_decode(dst, 10, enc, 40, PS_DT_FP32, PS_CODEC_SIGN, 0, NULL), PS_ECORRUPT, "40 raw bytes as sign -> PS_ECORRUPT (bad magic)");
    is_int(ps_codec_decode_ex(dst, 10, enc, 40, PS_DT_FP32, PS_CODEC_RAW, (ps_decode_mode_t)3, NULL), PS_EINVAL, "unknown decode mode");
    is_int(ps_codec_encode(enc, sizeof enc, &out, x, 10, (ps_dtype_t)9, PS_CODEC_RAW, NULL), PS_EINVAL, "unknown dtype");
    is_int(ps_codec_decode(dst, 10, enc, 40, PS_DT_FP32, (ps_codec_t)9, 0, NULL), PS_EINVAL, "unknown codec");
}

int main(void)
{
    ps_log_level = -1; /* the reject tests log an error per bad payload */
    test_names();
    test_shuffle();
    test_round_trips();
    test_rejects();
    return tap_done();
}
