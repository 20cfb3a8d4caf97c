/* ps_half: fp32 <-> fp16 / bf16.
 * References: closed-form decode (ldexp), a double-precision "round to the
 * nearest representable value" encoder written independently of the library,
 * PyTorch's conversions (tests/golden/half_cases.bin), and the scalar path vs
 * the F16C/AVX2 path bit for bit. */
#include "ps_half.h"
#include "tests/lib/tap.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* fp16 value from the IEEE formula, independent of the library */
static double half_ref_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}

/* Reference fp32 -> fp16 for non-NaN input: round |f| to a multiple of the
 * ulp of its binade in double (exact), ties to even by nearbyint, then find
 * the half with that value by the formula above. */
static uint16_t half_ref_encode(float f)
{
    double q = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isinf(f) || q >= 65520.0) return sign | 0x7c00;
    int ex;
    frexp(q, &ex); /* q in [2^(ex-1), 2^ex) */
    double ulp = q < 0x1p-14 ? 0x1p-24 : ldexp(1.0, ex - 1 - 10);
    double r = nearbyint(q / ulp) * ulp;
    /* binary search the positive halves 0..0x7bff (monotonic) */
    int lo = 0, hi = 0x7c00;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (half_ref_value((uint16_t)mid) < r) lo = mid + 1;
        else hi = mid;
    }
    return sign | (uint16_t)lo;
}

/* Reference fp32 -> bf16 for non-NaN input. */
static uint16_t bf16_ref_encode(float f)
{
    double q = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isinf(f)) return sign | 0x7f80;
    int ex;
    frexp(q, &ex);
    double ulp = q < 0x1p-126 ? 0x1p-133 : ldexp(1.0, ex - 1 - 7);
    double r = nearbyint(q / ulp) * ulp;
    if (r >= 0x1p128) return sign | 0x7f80;
    uint32_t u = f2u((float)r);
    if (u & 0xffff) return 0xdead; /* reference broken: not representable */
    return sign | (uint16_t)(u >> 16);
}

static void test_decode_exhaustive(void)
{
    static uint16_t hs[65536];
    static float a[65536], b[65536];
    long bad_ref = 0, bad_nan = 0, bad_bf = 0;
    for (int i = 0; i < 65536; i++) hs[i] = (uint16_t)i;
    for (int i = 0; i < 65536; i++) {
        float f = ps_fp16_to_fp32_1(hs[i]);
        int e = (i >> 10) & 0x1f, m = i & 0x3ff;
        if (e == 0x1f && m) {
            /* NaN: stays NaN (quiet), sign and payload kept */
            if (!isnan(f) || (f2u(f) >> 31) != (uint32_t)(i >> 15) || ((f2u(f) >> 13) & 0x3ff) != (uint32_t)(m | 0x200)) bad_nan++;
        } else if (e == 0x1f) {
            if (!isinf(f) || !!signbit(f) != !!(i & 0x8000)) bad_ref++;
        } else if ((double)f != half_ref_value(hs[i]) || !!signbit(f) != !!(i & 0x8000)) {
            bad_ref++;
        }
        if (f2u(ps_bf16_to_fp32_1(hs[i])) != (uint32_t)i << 16) bad_bf++;
    }
    is_int(bad_ref, 0, "fp16 decode: all 63488 non-NaN halves equal the IEEE formula");
    is_int(bad_nan, 0, "fp16 decode: all 2046 NaNs stay NaN with sign and payload");
    is_int(bad_bf, 0, "bf16 decode: all 65536 values are the top half of the fp32");

    for (int simd = 0; simd < 2; simd++) {
        ps_half_use_simd(simd);
        long diff = 0;
        ps_fp16_to_fp32(a, hs, 65536);
        for (int i = 0; i < 65536; i++) diff += f2u(a[i]) != f2u(ps_fp16_to_fp32_1(hs[i]));
        is_int(diff, 0, "fp16 array decode (simd=%d) == scalar for all 65536", ps_half_simd());
        diff = 0;
        ps_bf16_to_fp32(a, hs, 65536);
        for (int i = 0; i < 65536; i++) diff += f2u(a[i]) != f2u(ps_bf16_to_fp32_1(hs[i]));
        is_int(diff, 0, "bf16 array decode (simd=%d) == scalar for all 65536", ps_half_simd());
        /* add variants: finite halves only so the sum compares exactly */
        long nadd = 0, dadd = 0, badd = 0;
        for (int i = 0; i < 65536; i++) b[i] = a[i] = (float)((int)(rnd32() % 2001) - 1000) * 0.25f;
        ps_fp16_add_fp32(a, hs, 65536);
        for (int i = 0; i < 65536; i++, nadd++) {
            float want = b[i] + ps_fp16_to_fp32_1(hs[i]);
            dadd += !(f2u(a[i]) == f2u(want) || (isnan(a[i]) && isnan(want)));
        }
        for (int i = 0; i < 65536; i++) a[i] = b[i];
        ps_bf16_add_fp32(a, hs, 65536);
        for (int i = 0; i < 65536; i++) {
            float want = b[i] + ps_bf16_to_fp32_1(hs[i]);
            badd += !(f2u(a[i]) == f2u(want) || (isnan(a[i]) && isnan(want)));
        }
        is_int(dadd, 0, "fp16_add_fp32 (simd=%d): %ld sums", ps_half_simd(), nadd);
        is_int(badd, 0, "bf16_add_fp32 (simd=%d)", ps_half_simd());
        /* fp32 + fp32 (psd's and the ring's sums): arbitrary bit patterns
         * (NaN, Inf, subnormals), an odd length from an unaligned start so
         * the vector loop's tails run too; IEEE adds element by element */
        static float src32[65536];
        long fadd = 0;
        for (int i = 0; i < 65536; i++) {
            uint32_t u = rnd32(), v = rnd32();
            memcpy(&src32[i], &u, 4);
            memcpy(&b[i], &v, 4);
            a[i] = b[i];
        }
        ps_fp32_add(a + 3, src32 + 3, 65536 - 8);
        for (int i = 0; i < 65536; i++) {
            float want = i >= 3 && i < 65536 - 5 ? b[i] + src32[i] : b[i];
            fadd += !(f2u(a[i]) == f2u(want) || (isnan(a[i]) && isnan(want)));
        }
        is_int(fadd, 0, "fp32_add (simd=%d): 65528 sums of random bit patterns == a + b, edges untouched",
               ps_half_simd());
    }
    ps_half_use_simd(1);
}

/* A float set that hits every exponent with boundary mantissas, ties and
 * near-ties at both the fp16 (bit 13) and bf16 (bit 16) rounding points. */
static size_t edge_floats(float *out)
{
    static const uint32_t mant[] = {0, 1, 2, 0x7fffff, 0x7ffffe, 0x400000, 0x000fff, 0x001000,
                                    0x001001, 0x002000, 0x003000, 0x003001, 0x002fff, 0x7ff000,
                                    0x7fefff, 0x7fe000, 0x007fff, 0x008000, 0x008001, 0x018000,
                                    0x010000, 0x7f8000, 0x7fffff - 0x8000, 0x555555, 0x2aaaaa};
    size_t n = 0;
    for (uint32_t e = 0; e < 256; e++)
        for (size_t k = 0; k < sizeof mant / sizeof mant[0]; k++)
            for (uint32_t s = 0; s < 2; s++) out[n++] = u2f(s << 31 | e << 23 | mant[k]);
    static const float extra[] = {65504.f, 65519.f, 65519.996f, 65520.f, 65520.004f, 65535.f,
                                  65536.f, FLT_MAX, -FLT_MAX, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f,
                                  0x1.8p-24f, 0x1.4p-24f, 0x1.cp-24f, 0x1p-14f, 0x1.ff8p-15f,
                                  0x1.ffcp-15f, 0x1.ffep-15f, 0.f, -0.f, 1.f, -1.f,
                                  0x1.fffffep127f, 0x1.ff0000p127f, 0x1.ff8000p127f, 0x1.fe8000p127f};
    for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) out[n++] = extra[k];
    return n;
}

static void test_encode_reference(void)
{
    static float f[16384];
    size_t n = edge_floats(f);
    long bad16 = 0, badbf = 0, checked = 0;
    for (size_t i = 0; i < n + 400000; i++) {
        float x = i < n ? f[i] : u2f(rnd32());
        if (i >= n && (i & 1)) x = (float)((int32_t)rnd32()) * 0x1p-31f * 70000.f; /* fp16 range */
        if (isnan(x)) continue;
        checked++;
        uint16_t h = ps_fp32_to_fp16_1(x), hr = half_ref_encode(x);
        uint16_t b = ps_fp32_to_bf16_1(x), br = bf16_ref_encode(x);
        if (h != hr && bad16++ < 5) diag("fp16(%a = 0x%08x): got 0x%04x want 0x%04x", x, f2u(x), h, hr);
        if (b != br && badbf++ < 5) diag("bf16(%a = 0x%08x): got 0x%04x want 0x%04x", x, f2u(x), b, br);
    }
    is_int(bad16, 0, "fp16 encode == independent reference on %ld edge + random floats", checked);
    is_int(badbf, 0, "bf16 encode == independent reference on %ld edge + random floats", checked);

    /* spot values whose answers are known by hand */
    is_int(ps_fp32_to_fp16_1(65504.f), 0x7bff, "65504 -> max half");
    is_int(ps_fp32_to_fp16_1(65519.f), 0x7bff, "65519 rounds down to max half");
    is_int(ps_fp32_to_fp16_1(65520.f), 0x7c00, "65520 rounds to Inf");
    is_int(ps_fp32_to_fp16_1(-FLT_MAX), 0xfc00, "-FLT_MAX -> -Inf");
    is_int(ps_fp32_to_fp16_1(0x1p-24f), 0x0001, "2^-24 -> smallest subnormal");
    is_int(ps_fp32_to_fp16_1(0x1p-25f), 0x0000, "2^-25 ties to even zero");
    is_int(ps_fp32_to_fp16_1(0x1.8p-24f), 0x0002, "1.5 * 2^-24 ties to even 2");
    is_int(ps_fp32_to_fp16_1(-0.f), 0x8000, "-0 keeps its sign");
    is_int(ps_fp32_to_fp16_1(1.f + 0x1p-11f), 0x3c00, "1 + 2^-11 ties down to 1");
    is_int(ps_fp32_to_fp16_1(1.f + 0x3p-11f), 0x3c02, "1 + 3*2^-11 ties up to even");
    is_int(ps_fp32_to_bf16_1(1.f + 0x1p-8f), 0x3f80, "bf16: 1 + 2^-8 ties down to 1");
    is_int(ps_fp32_to_bf16_1(1.f + 0x3p-8f), 0x3f82, "bf16: 1 + 3*2^-8 ties up to even");
    is_int(ps_fp32_to_bf16_1(FLT_MAX), 0x7f80, "bf16: FLT_MAX rounds to Inf");
    is_int(ps_fp32_to_bf16_1(0x1.fe0000p127f), 0x7f7f, "bf16: max bf16 kept");
    /* NaN stays NaN; bf16 must not truncate a low-payload NaN to Inf */
    uint32_t nans[] = {0x7f800001, 0xff800001, 0x7fc00000, 0x7f80ffff, 0x7fffffff, 0xffa00000, 0x7f802000};
    int nan_ok = 1;
    for (size_t k = 0; k < sizeof nans / sizeof nans[0]; k++) {
        float x = u2f(nans[k]);
        nan_ok &= isnan(ps_fp16_to_fp32_1(ps_fp32_to_fp16_1(x)));
        nan_ok &= isnan(ps_bf16_to_fp32_1(ps_fp32_to_bf16_1(x)));
        nan_ok &= !!(ps_fp32_to_fp16_1(x) & 0x8000) == !!(nans[k] >> 31);
        nan_ok &= !!(ps_fp32_to_bf16_1(x) & 0x8000) == !!(nans[k] >> 31);
    }
    ok(nan_ok, "NaNs (incl. signalling, low-payload) stay NaN with sign in fp16 and bf16");
    is_int(ps_fp32_to_bf16_1(u2f(0x7f800001)), 0x7fc0, "bf16: low-payload sNaN becomes quiet NaN");
}

/* SIMD vs scalar bit-exactness over a large float set incl. all NaN shapes */
static void test_encode_simd_vs_scalar(void)
{
    enum { CH = 1 << 16 };
    static float f[CH];
    static uint16_t a[CH], s[CH];
    long diff16 = 0, diffbf = 0, total = 0;
    size_t n = edge_floats(f);
    /* pass 0: the edge set; then a stride over all 2^32 patterns (every
     * 509th, ~8.4M values, covering every exponent and NaN) */
    uint64_t pat = 0;
    for (int pass = 0; pat < (1ull << 32); pass++) {
        if (pass > 0) {
            for (n = 0; n < CH && pat < (1ull << 32); n++, pat += 509) f[n] = u2f((uint32_t)pat);
        }
        ps_half_use_simd(1);
        ps_fp32_to_fp16(a, f, n);
        ps_half_use_simd(0);
        ps_fp32_to_fp16(s, f, n);
        for (size_t i = 0; i < n; i++) diff16 += a[i] != s[i] || a[i] != ps_fp32_to_fp16_1(f[i]);
        ps_half_use_simd(1);
        ps_fp32_to_bf16(a, f, n);
        ps_half_use_simd(0);
        ps_fp32_to_bf16(s, f, n);
        for (size_t i = 0; i < n; i++) diffbf += a[i] != s[i];
        total += n;
    }
    ps_half_use_simd(1);
    diag("simd path available: %d", ps_half_simd());
    is_int(diff16, 0, "fp16 encode: SIMD == scalar on %ld floats (edges + 2^32/509 stride)", total);
    is_int(diffbf, 0, "bf16 encode: SIMD == scalar on %ld floats", total);

    /* every length 0..40 and misaligned starts: vector body + scalar tail */
    static float g[64], back[64], back1[64];
    static uint16_t h[64];
    int tails = 1;
    for (int i = 0; i < 64; i++) g[i] = (float)((int32_t)rnd32()) * 0x1p-20f;
    for (int len = 0; len <= 40; len++)
        for (int off = 0; off < 3; off++) {
            memset(h, 0xab, sizeof h);
            ps_fp32_to_fp16(h + off, g + off, len);
            for (int i = 0; i < 64; i++)
                tails &= i >= off && i < off + len ? h[i] == ps_fp32_to_fp16_1(g[i]) : h[i] == 0xabab;
            ps_fp16_to_fp32(back + off, h + off, len);
            for (int i = off; i < off + len; i++) tails &= back[i] == ps_fp16_to_fp32_1(h[i]);
            memset(h, 0xab, sizeof h);
            ps_fp32_to_bf16(h + off, g + off, len);
            for (int i = 0; i < 64; i++)
                tails &= i >= off && i < off + len ? h[i] == ps_fp32_to_bf16_1(g[i]) : h[i] == 0xabab;
            for (int i = 0; i < 64; i++) back[i] = back1[i] = 1.5f;
            ps_bf16_add_fp32(back + off, h + off, len);
            for (int i = 0; i < 64; i++)
                tails &= i >= off && i < off + len ? back[i] == back1[i] + ps_bf16_to_fp32_1(h[i]) : back[i] == 1.5f;
        }
    ok(tails, "lengths 0..40 at offsets 0..2: exact, nothing written outside [0,n)");
}

static void test_torch_golden(void)
{
    const char *top = getenv("top_srcdir");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/half_cases.bin", top ? top : ".");
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        ok(0, "open %s", path);
        return;
    }
    uint32_t n = 0;
    int rd = fread(&n, 4, 1, fp) == 1 && n > 0 && n < 100000;
    float *x = malloc(n * 4ul);
    uint16_t *h = malloc(n * 2ul), *b = malloc(n * 2ul), *got = malloc(n * 2ul);
    rd = rd && fread(x, 4, n, fp) == n && fread(h, 2, n, fp) == n && fread(b, 2, n, fp) == n;
    fclose(fp);
    ok(rd, "read %u golden cases from %s", n, path);
    if (rd) {
        for (int simd = 1; simd >= 0; simd--) {
            ps_half_use_simd(simd);
            long bh = 0, bb = 0;
            ps_fp32_to_fp16(got, x, n);
            for (uint32_t i = 0; i < n; i++)
                if (got[i] != h[i] && bh++ < 3) diag("fp16(%a): 0x%04x torch 0x%04x", x[i], got[i], h[i]);
            ps_fp32_to_bf16(got, x, n);
            for (uint32_t i = 0; i < n; i++)
                if (got[i] != b[i] && bb++ < 3) diag("bf16(%a): 0x%04x torch 0x%04x", x[i], got[i], b[i]);
            is_int(bh, 0, "fp16 == torch .half() on %u values (simd=%d)", n, simd);
            is_int(bb, 0, "bf16 == torch .bfloat16() on %u values (simd=%d)", n, simd);
        }
        ps_half_use_simd(1);
    }
    free(x); free(h); free(b); free(got);
}

int main(void)
{
    test_decode_exhaustive();
    test_encode_reference();
    test_encode_simd_vs_scalar();
    test_torch_golden();
    return tap_done();
}
