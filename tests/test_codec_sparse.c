/* ps_codec TOPK / SIGN and ps_ef (error feedback).
 *
 * References are independent of the implementation: top-k is checked
 * against a full qsort by (|x| descending, index ascending) on doubles, the
 * payload is parsed here from the layout in ps_codec.h, the sign scale is a
 * mean computed in long double, and error feedback is checked by its
 * invariant (everything sent + the final residual == every gradient) and by
 * convergence of compressed SGD on a quadratic against plain SGD. */
#include "ps_codec.h"
#include "ps_ef.h"
#include "ps_error.h"
#include "ps_half.h"
#include "ps_log.h"
#include "tests/lib/tap.h"
#define CODEC_TEST_SEED 0x2545f4914f6cdd1dull
#include "tests/lib/codec_testutil.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rd32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

enum { PAT_NORMAL, PAT_TIES, PAT_ZERO, PAT_SPECIAL, PAT_SUBNORMAL, NPAT };
static const char *pat_name[] = {"normal", "ties", "zeros", "special", "subnormal"};
static void fill(float *x, size_t n, int pat)
{
    static const float special[] = {INFINITY, -INFINITY, NAN, FLT_MAX, -FLT_MAX, 65520.f, -0.f, 0.f, 1e-40f, 1.f};
    for (size_t i = 0; i < n; i++) {
        switch (pat) {
        case PAT_NORMAL: x[i] = rnd_normal() * 1e-3f; break;
        case PAT_TIES: x[i] = (float)((int)(rnd32() % 5) - 2); break; /* many equal magnitudes */
        case PAT_ZERO: x[i] = rnd32() & 1 ? 0.f : -0.f; break;
        case PAT_SPECIAL: x[i] = rnd32() % 4 ? rnd_normal() : special[rnd32() % 10]; break;
        default: x[i] = u2f((rnd32() & 0x807fffffu) | (rnd32() % 3 ? 0 : 0x00800000u)); break;
        }
    }
}

/* reference order: |x| descending (NaN above everything), then index */
static const float *ref_x;
static double mag(float f) { return isnan(f) ? INFINITY * 2 : fabs((double)f); }
static int cmp_ref(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    double mi = mag(ref_x[i]), mj = mag(ref_x[j]);
    if (isnan(ref_x[i]) != isnan(ref_x[j])) return isnan(ref_x[i]) ? -1 : 1;
    if (mi != mj) return mi > mj ? -1 : 1;
    return i < j ? -1 : i > j;
}
static int cmp_size(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return i < j ? -1 : i > j;
}

static void test_topk_select(void)
{
    static const size_t sizes[] = {1, 2, 7, 100, 1000, 4099, 100003};
    static const double ratios[] = {0.001, 0.01, 0.1, 0.5, 1, 0}; /* decimal references for k */
    size_t maxn = 100003;
    float *x = malloc(maxn * 4), *y = malloc(maxn * 4), *z = malloc(maxn * 4);
    size_t *ord = malloc(maxn * sizeof *ord);
    uint8_t *enc = malloc(ps_codec_bound(PS_DT_FP32, PS_CODEC_TOPK, maxn));
    long cases = 0, badsel = 0, badval = 0, baddec = 0, badlen = 0;
    for (int pat = 0; pat < NPAT; pat++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (size_t ri = 0; ri < sizeof ratios / sizeof *ratios; ri++) {
                size_t n = sizes[si];
                fill(x, n, pat);
                ref_x = x;
                for (size_t i = 0; i < n; i++) ord[i] = i;
                qsort(ord, n, sizeof *ord, cmp_ref);
                double want_k = ceil((ratios[ri] ? ratios[ri] : 0.01) * n);
                size_t k = want_k < 1 ? 1 : want_k > n ? n : (size_t)want_k;
                qsort(ord, k, sizeof *ord, cmp_size); /* the reference top k, by index */
                ps_codec_params_t prm = {.topk_ratio = (float)ratios[ri]};
                for (int dt = 0; dt < 3; dt++) {
                    size_t len = 0, es = ps_dtype_size(dt), b = ps_codec_bound_ex(dt, PS_CODEC_TOPK, n, &prm);
                    int rc = ps_codec_encode_ex(enc, b, &len, x, n, dt, PS_CODEC_TOPK, &prm, NULL);
                    cases++;
                    if (rc || len != 24 + k * (4 + es) || len != b || rd64(enc + 16) != k || rd64(enc + 8) != n) {
                        badlen++;
                        diag("%s n=%zu ratio %g %s: rc %d len %zu k %llu (want %zu)", pat_name[pat], n,
                             (double)ratios[ri], ps_dtype_name(dt), rc, len, (unsigned long long)rd64(enc + 16), k);
                        continue;
                    }
                    int sel_ok = 1, val_ok = 1;
                    for (size_t j = 0; j < k; j++) {
                        size_t i = rd32(enc + 24 + 4 * j);
                        sel_ok &= i == ord[j];
                        float v;
                        if (es == 4) memcpy(&v, enc + 24 + 4 * k + 4 * j, 4);
                        else {
                            const uint8_t *p = enc + 24 + 4 * k + 2 * j;
                            uint16_t h = (uint16_t)(p[0] | p[1] << 8);
                            v = dt == PS_DT_FP16 ? ps_fp16_to_fp32_1(h) : ps_bf16_to_fp32_1(h);
                        }
                        val_ok &= i < n && same(v, through(x[i], dt));
                    }
                    if (!sel_ok) {
                        badsel++;
                        diag("%s n=%zu k=%zu %s: selection differs from the sorted reference", pat_name[pat], n, k, ps_dtype_name(dt));
                    }
                    badval += !val_ok;
                    /* decode: SET gives zeros + the selected values; ADD / SUB touch only them */
                    for (int mode = 0; mode < 3; mode++) {
                        for (size_t i = 0; i < n; i++) z[i] = y[i] = (float)(i % 5) - 2.f;
                        rc = ps_codec_decode_ex(y, n, enc, len, dt, PS_CODEC_TOPK, mode, NULL);
                        size_t nb = 0, j = 0;
                        for (size_t i = 0; i < n; i++) {
                            float s = 0.f;
                            int hit = j < k && ord[j] == i;
                            if (hit) s = through(x[i], dt), j++;
                            float want = mode == PS_DECODE_SET ? (hit ? s : 0.f)
                                       : mode == PS_DECODE_ADD ? (hit ? z[i] + s : z[i])
                                       : (hit ? z[i] - s : z[i]);
                            nb += !same(y[i], want);
                        }
                        if (rc || nb) {
                            baddec++;
                            diag("decode mode %d %s n=%zu %s: rc %d, %zu wrong", mode, pat_name[pat], n, ps_dtype_name(dt), rc, nb);
                        }
                    }
                }
            }
    is_int(badlen, 0, "topk: %ld encodes have k = ceil(ratio*n) clamped to [1,n] and the exact length", cases);
    is_int(badsel, 0, "topk: selection == first k of a full sort by |x| desc, index asc (ties -> lower index; NaN largest)");
    is_int(badval, 0, "topk: values are x rounded to the wire dtype");
    is_int(baddec, 0, "topk: decode SET = zero-filled scatter, ADD/SUB touch only the k indices");

    /* numel 0: a header, nothing else */
    size_t len = 1;
    float one = 5.f;
    is_int(ps_codec_encode_ex(enc, 100, &len, x, 0, PS_DT_FP32, PS_CODEC_TOPK, NULL, NULL), 0, "topk n=0 encodes");
    ok(len == 24 && !ps_codec_decode(&one, 0, enc, len, PS_DT_FP32, PS_CODEC_TOPK, 0, NULL) && one == 5.f,
       "topk n=0: 24-byte payload decodes to nothing");
    free(x); free(y); free(z); free(ord); free(enc);
}

static void test_topk_params(void)
{
    float x[100];
    uint8_t enc[2000];
    size_t len;
    fill(x, 100, PAT_NORMAL);
    is_int(ps_codec_topk_k(1000, 0.001f), 1, "k(1000, 0.1%%) = 1");
    is_int(ps_codec_topk_k(1000, 0.0f), 10, "k(1000, default) = 10 (1%%)");
    is_int(ps_codec_topk_k(1001, 0.01f), 11, "k(1001, 1%%) = ceil(10.01) = 11");
    is_int(ps_codec_topk_k(5, 1e-6f), 1, "k is at least 1");
    /* large tensors: the float slack must stay below one element */
    is_int(ps_codec_topk_k(3000000, 1.0f), 3000000, "k(3M, 100%%) = 3M");
    is_int(ps_codec_topk_k(16777217, 0.5f), 8388609, "k(2^24+1, 50%%) = ceil(8388608.5)");
    is_int(ps_codec_topk_k(10000000, 0.001f), 10000, "k(10M, 0.1%%) = 10000");
    is_int(ps_codec_topk_k(0, 0.5f), 0, "k(0) = 0");
    is_int(ps_codec_topk_k(10, 1.5f), 0, "ratio > 1 -> 0");
    ps_codec_params_t bad[] = {{.topk_ratio = -0.1f}, {.topk_ratio = 1.01f}, {.topk_ratio = NAN}, {.topk_ratio = INFINITY}};
    for (int i = 0; i < 4; i++)
        is_int(ps_codec_encode_ex(enc, sizeof enc, &len, x, 100, PS_DT_FP32, PS_CODEC_TOPK, &bad[i], NULL),
               PS_EINVAL, "topk ratio %g rejected", (double)bad[i].topk_ratio);
    ps_codec_params_t p = {.topk_ratio = 0.05f};
    size_t b = ps_codec_bound_ex(PS_DT_FP16, PS_CODEC_TOPK, 100, &p);
    is_int(b, 24 + 5 * 6, "bound_ex fp16 5%% of 100 = 24 + 5*(4+2)");
    ok(b <= ps_codec_bound(PS_DT_FP16, PS_CODEC_TOPK, 100), "bound_ex <= bound (bound is the k = n worst case)");
    is_int(ps_codec_encode_ex(enc, b - 1, &len, x, 100, PS_DT_FP16, PS_CODEC_TOPK, &p, NULL), PS_ERANGE, "topk into bound-1 -> PS_ERANGE");
    is_int(ps_codec_encode(enc, 24 + 6 - 1, &len, x, 100, PS_DT_FP16, PS_CODEC_TOPK, NULL), PS_ERANGE,
           "plain encode uses the default ratio (k=1 needs 30 bytes)");
    is_int(ps_codec_bound(PS_DT_FP32, PS_CODEC_SIGN, 17), 24 + 8 * 8 + 3, "sign bound 17 elements = PSG2 with 17/2 blocks: 24 + 8*8 + 3");
    is_int(ps_codec_bound(PS_DT_FP32, PS_CODEC_SIGN, 1), 20 + 1, "sign bound 1 element: PSG1 only, 20 + 1");
    ok(ps_codec_bound(PS_DT_FP32, PS_CODEC_SIGN, 5000) < ps_codec_bound(PS_DT_FP32, PS_CODEC_TOPK, 5000),
       "sign bound (1024 blocks) below the top-k bound at 5000 elements");
    is_int(ps_codec_bound_ex(PS_DT_FP32, PS_CODEC_SIGN, 17, NULL), 20 + 3, "sign bound_ex, one block: 20 + 3");
    is_int(ps_codec_scratch_size(PS_DT_FP32, PS_CODEC_TOPK, 1000) + ps_codec_scratch_size(PS_DT_FP32, PS_CODEC_SIGN, 1000), 0,
           "topk/sign need no scratch");
    ps_codec_t c;
    ok(!ps_codec_parse("topk", &c) && c == PS_CODEC_TOPK && !ps_codec_parse("sign", &c) && c == PS_CODEC_SIGN, "parse topk/sign");
}

static void test_sign(void)
{
    static const size_t sizes[] = {0, 1, 7, 8, 9, 63, 64, 65, 1000, 100001};
    size_t maxn = 100001;
    float *x = malloc(maxn * 4), *y = malloc(maxn * 4), *z = malloc(maxn * 4);
    uint8_t *enc = malloc(ps_codec_bound(PS_DT_FP32, PS_CODEC_SIGN, maxn));
    long bad = 0, badscale = 0, cases = 0;
    for (int pat = 0; pat < NPAT; pat++) {
        if (pat == PAT_SPECIAL) continue; /* NaN/Inf: see below */
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (int dt = 0; dt < 3; dt++) {
                size_t n = sizes[si], len = 0;
                fill(x, n, pat);
                long double l1 = 0;
                for (size_t i = 0; i < n; i++) l1 += fabsl((long double)x[i]);
                float want = n ? (float)(l1 / n) : 0.f;
                int rc = ps_codec_encode(enc, ps_codec_bound(dt, PS_CODEC_SIGN, n), &len, x, n, dt, PS_CODEC_SIGN, NULL);
                cases++;
                if (rc || len != 20 + (n + 7) / 8) {
                    bad++;
                    continue;
                }
                float scale = u2f(rd32(enc + 16));
                if (!(fabs(scale - want) <= 1e-6 * want)) {
                    badscale++;
                    diag("sign scale %.9g, mean |x| %.9g (n=%zu)", scale, want, n);
                }
                for (int mode = 0; mode < 3; mode++) {
                    for (size_t i = 0; i < n; i++) z[i] = y[i] = (float)(i % 3);
                    rc = ps_codec_decode_ex(y, n, enc, len, dt, PS_CODEC_SIGN, mode, NULL);
                    size_t nb = 0;
                    for (size_t i = 0; i < n; i++) {
                        float s = signbit(x[i]) ? -scale : scale;
                        float w = mode == PS_DECODE_SET ? s : mode == PS_DECODE_ADD ? z[i] + s : z[i] - s;
                        nb += !same(y[i], w);
                    }
                    if (rc || nb) {
                        bad++;
                        diag("sign %s n=%zu %s mode %d: rc %d, %zu wrong", pat_name[pat], n, ps_dtype_name(dt), mode, rc, nb);
                    }
                }
            }
    }
    is_int(bad, 0, "sign: %ld round trips decode to +-scale by x's sign bit (SET/ADD/SUB)", cases);
    is_int(badscale, 0, "sign: scale == mean |x| (long double reference, 1e-6 rel)");
    float v[3] = {1.f, NAN, 2.f};
    size_t len;
    is_int(ps_codec_encode(enc, 100, &len, v, 3, PS_DT_FP32, PS_CODEC_SIGN, NULL), PS_ENONFINITE, "sign of a NaN tensor -> PS_ENONFINITE");
    v[1] = -INFINITY;
    is_int(ps_codec_encode(enc, 100, &len, v, 3, PS_DT_FP32, PS_CODEC_SIGN, NULL), PS_ENONFINITE, "sign of an Inf tensor -> PS_ENONFINITE");
    is_int(ps_codec_encode(enc, 20, &len, v, 3, PS_DT_FP32, PS_CODEC_SIGN, NULL), PS_ERANGE, "sign into 20 bytes for 3 elements -> PS_ERANGE");
    free(x); free(y); free(z); free(enc);
}

/* ---- bad payloads ------------------------------------------------------- */

typedef struct {
    const char *what;
    uint8_t buf[512];
    size_t len;
    size_t numel;
    ps_dtype_t dt;
    ps_codec_t c;
} badcase_t;

static int reject_untouched(const badcase_t *b)
{
    int good = 1;
    for (int mode = 0; mode < 3; mode++) {
        float dst[64], keep[64];
        for (int i = 0; i < 64; i++) keep[i] = dst[i] = (float)i + 0.5f;
        int rc = ps_codec_decode_ex(dst, b->numel, b->buf, b->len, b->dt, b->c, mode, NULL);
        good &= (rc == PS_EMISMATCH || rc == PS_ECORRUPT) && !memcmp(dst, keep, sizeof dst);
    }
    return good;
}

static void swap_first_indices(badcase_t *b)
{
    uint32_t a = rd32(b->buf + 24), c = rd32(b->buf + 28);
    wr32(b->buf + 24, c);
    wr32(b->buf + 28, a);
}

static void test_rejects(void)
{
    float x[40];
    fill(x, 40, PAT_NORMAL);
    ps_codec_params_t p = {.topk_ratio = 0.25f}; /* k = 10 */
    badcase_t t0 = {.numel = 40, .dt = PS_DT_FP16, .c = PS_CODEC_TOPK}, s0 = {.numel = 37, .dt = PS_DT_BF16, .c = PS_CODEC_SIGN};
    ok(!ps_codec_encode_ex(t0.buf, sizeof t0.buf, &t0.len, x, 40, t0.dt, t0.c, &p, NULL) && t0.len == 24 + 10 * 6, "topk k=10 fp16 payload");
    ok(!ps_codec_encode(s0.buf, sizeof s0.buf, &s0.len, x, 37, s0.dt, s0.c, NULL) && s0.len == 20 + 5, "sign 37 bf16 payload");
    float d[64];
    ok(!ps_codec_decode(d, 40, t0.buf, t0.len, t0.dt, t0.c, 0, NULL) && !ps_codec_decode(d, 37, s0.buf, s0.len, s0.dt, s0.c, 1, NULL),
       "the unmodified payloads decode");

    badcase_t b;
#define BAD(base, desc, edit)                       \
    do {                                            \
        b = base;                                   \
        edit;                                       \
        b.what = desc;                              \
        ok(reject_untouched(&b), "reject %s, dst untouched", b.what); \
    } while (0)
    BAD(t0, "topk truncated by 1", b.len--);
    BAD(t0, "topk extended by 1", b.len++);
    BAD(t0, "topk header only", b.len = 24);
    BAD(t0, "topk shorter than header", b.len = 23);
    BAD(t0, "topk empty", b.len = 0);
    BAD(t0, "topk k+1 for the same length", b.buf[16]++);
    BAD(t0, "topk k-1 for the same length", b.buf[16]--);
    BAD(t0, "topk k > numel (len consistent)", (b.buf[16] = 41, b.len = 24 + 41 * 6));
    BAD(t0, "topk k huge", b.buf[23] = 0x80);
    BAD(t0, "topk unsorted indices", swap_first_indices(&b));
    BAD(t0, "topk duplicate index", wr32(b.buf + 28, rd32(b.buf + 24)));
    BAD(t0, "topk index == numel", wr32(b.buf + 24 + 36, 40));
    BAD(t0, "topk index 0xffffffff", wr32(b.buf + 24 + 36, 0xffffffffu));
    BAD(t0, "topk bad magic", b.buf[0] ^= 1);
    BAD(t0, "topk reserved byte", b.buf[6] = 1);
    BAD(t0, "topk wrong dtype", b.dt = PS_DT_BF16);
    BAD(t0, "topk wrong numel", b.numel = 39);
    BAD(t0, "topk numel field", b.buf[8]++);
    BAD(t0, "a sign payload as topk", (b = s0, b.c = PS_CODEC_TOPK));
    BAD(s0, "sign truncated by 1", b.len--);
    BAD(s0, "sign extended by 1", b.len++);
    BAD(s0, "sign header only", b.len = 20);
    BAD(s0, "sign bit array missing a byte (numel 41)", b.numel = 41);
    BAD(s0, "sign NaN scale", wr32(b.buf + 16, 0x7fc00000u));
    BAD(s0, "sign +Inf scale", wr32(b.buf + 16, 0x7f800000u));
    BAD(s0, "sign negative scale", wr32(b.buf + 16, 0xbf800000u));
    BAD(s0, "sign -0 scale", wr32(b.buf + 16, 0x80000000u));
    BAD(s0, "sign unused bit set", b.buf[24] |= 0x80);
    BAD(s0, "sign bad magic", b.buf[3] ^= 0x40);
    BAD(s0, "sign wrong dtype", b.dt = PS_DT_FP32);
    BAD(s0, "sign wrong numel (same byte count)", b.numel = 38);
    BAD(s0, "a topk payload as sign", (b = t0, b.c = PS_CODEC_SIGN));
#undef BAD

    /* random mutations of valid payloads: never a crash; any error leaves dst untouched */
    long n = 0, wrong = 0;
    for (int it = 0; it < 20000; it++) {
        b = it & 1 ? s0 : t0;
        int edits = 1 + rnd32() % 4;
        for (int e = 0; e < edits; e++) {
            switch (b.len ? rnd32() % 4 : 3) {
            case 0: b.buf[rnd32() % b.len] ^= (uint8_t)(1u << (rnd32() % 8)); break;
            case 1: b.buf[rnd32() % b.len] = (uint8_t)rnd32(); break;
            case 2: b.len = rnd32() % (b.len + 8); break;
            default: b.buf[rnd32() % 24] = (uint8_t)rnd32(); break;
            }
        }
        float dst[64], keep[64];
        for (int i = 0; i < 64; i++) keep[i] = dst[i] = -(float)i;
        int rc = ps_codec_decode_ex(dst, b.numel, b.buf, b.len, b.dt, b.c, (int)(rnd32() % 3), NULL);
        n++;
        if (rc && (memcmp(dst, keep, sizeof dst) || (rc != PS_EMISMATCH && rc != PS_ECORRUPT))) wrong++;
        for (int i = (int)b.numel; i < 64; i++) wrong += f2u(dst[i]) != f2u(keep[i]); /* never past numel */
    }
    is_int(wrong, 0, "%ld mutated topk/sign payloads: no crash, errors leave dst untouched, nothing past numel", n);
}

/* ---- error feedback ------------------------------------------------------- */

static void test_ef_invariant(void)
{
    struct { ps_codec_t c; ps_dtype_t dt; float ratio; } cfg[] = {
        {PS_CODEC_TOPK, PS_DT_FP32, 0.01f}, {PS_CODEC_TOPK, PS_DT_FP16, 0.1f}, {PS_CODEC_TOPK, PS_DT_BF16, 0.001f},
        {PS_CODEC_SIGN, PS_DT_FP32, 0}, {PS_CODEC_RAW, PS_DT_FP16, 0}, {PS_CODEC_LZ4, PS_DT_BF16, 0}};
    size_t numel[2] = {3000, 777};
    float *g = malloc(3000 * 4), *sent = malloc(3000 * 4);
    double *sum_g = malloc(3000 * sizeof(double)), *sum_s = malloc(3000 * sizeof(double));
    uint8_t *buf = malloc(ps_codec_bound(PS_DT_FP32, PS_CODEC_TOPK, 3000));
    for (size_t ci = 0; ci < sizeof cfg / sizeof *cfg; ci++) {
        ps_ef_t *ef = NULL;
        if (ps_ef_new(&ef, 2, numel)) {
            ok(0, "ps_ef_new");
            continue;
        }
        ps_codec_params_t prm = {.topk_ratio = cfg[ci].ratio};
        int fails = 0;
        double worst = 0, scale = 0;
        for (size_t part = 0; part < 2; part++) {
            size_t n = numel[part];
            memset(sum_g, 0, n * sizeof(double));
            memset(sum_s, 0, n * sizeof(double));
            for (int step = 0; step < 60; step++) {
                for (size_t i = 0; i < n; i++) {
                    g[i] = rnd_normal() * 1e-2f * (1 + (float)(i % 13));
                    sum_g[i] += g[i];
                    if (fabs(sum_g[i]) > scale) scale = fabs(sum_g[i]);
                }
                size_t len = 0;
                fails += ps_ef_compress(ef, part, g, n, cfg[ci].dt, cfg[ci].c, &prm, buf,
                                        ps_codec_bound_ex(cfg[ci].dt, cfg[ci].c, n, &prm), &len) != 0;
                fails += ps_codec_decode(sent, n, buf, len, cfg[ci].dt, cfg[ci].c, 0, NULL) != 0;
                for (size_t i = 0; i < n; i++) sum_s[i] += sent[i];
            }
            const float *r = ps_ef_residual(ef, part);
            for (size_t i = 0; i < n; i++) {
                double d = fabs(sum_s[i] + r[i] - sum_g[i]);
                if (d > worst) worst = d;
            }
        }
        /* each step's residual update rounds once in fp32: <= 60 * ulp of the accumulator */
        ok(!fails && worst <= 60 * 1.2e-7 * scale * 4,
           "EF %s/%s ratio %g: sum(sent) + residual == sum(grad) over 60 steps (worst %.3g, scale %.3g)",
           ps_codec_name(cfg[ci].c), ps_dtype_name(cfg[ci].dt), (double)cfg[ci].ratio, worst, scale);
        ps_ef_destroy(&ef);
        ok(ef == NULL, "ps_ef_destroy NULLs the pointer");
    }

    /* one TOPK fp32 step: the residual is exactly 0 where sent and grad elsewhere */
    ps_ef_t *ef = NULL;
    size_t n1 = 1000;
    ok(!ps_ef_new(&ef, 1, &n1), "ps_ef_new 1 x 1000");
    for (size_t i = 0; i < 1000; i++) g[i] = rnd_normal();
    ps_codec_params_t prm = {.topk_ratio = 0.01f};
    size_t len = 0, cap = ps_codec_bound_ex(PS_DT_FP32, PS_CODEC_TOPK, 1000, &prm);
    ok(!ps_ef_compress(ef, 0, g, 1000, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, cap, &len) && len == cap, "compress step 1");
    ps_codec_decode(sent, 1000, buf, len, PS_DT_FP32, PS_CODEC_TOPK, 0, NULL);
    const float *r = ps_ef_residual(ef, 0);
    int exact = 1, nsent = 0;
    for (size_t i = 0; i < 1000; i++) {
        if (sent[i] != 0.f) nsent++, exact &= r[i] == 0.f && sent[i] == g[i];
        else exact &= r[i] == g[i];
    }
    ok(exact && nsent == 10, "topk fp32: residual 0 at the 10 sent elements, = grad elsewhere");

    /* errors leave the residual as it was */
    float *before = malloc(1000 * 4);
    memcpy(before, r, 1000 * 4);
    is_int(ps_ef_compress(ef, 0, g, 1000, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, cap - 1, &len), PS_ERANGE, "compress into cap-1 -> PS_ERANGE");
    g[5] = NAN;
    is_int(ps_ef_compress(ef, 0, g, 1000, PS_DT_FP32, PS_CODEC_SIGN, NULL, buf, 200, &len), PS_ENONFINITE, "sign of NaN grad -> PS_ENONFINITE");
    is_int(ps_ef_compress(ef, 0, g, 1000, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, cap, &len), PS_ENONFINITE, "topk of NaN grad -> PS_ENONFINITE");
    g[5] = -INFINITY;
    is_int(ps_ef_compress(ef, 0, g, 1000, PS_DT_FP16, PS_CODEC_RAW, NULL, buf, 2000, &len), PS_ENONFINITE, "raw fp16 of -Inf grad -> PS_ENONFINITE");
    is_int(ps_ef_compress(ef, 0, g, 999, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, cap, &len), PS_EMISMATCH, "wrong numel -> PS_EMISMATCH");
    is_int(ps_ef_compress(ef, 1, g, 1000, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, cap, &len), PS_EINVAL, "bad partition -> PS_EINVAL");
    ok(!memcmp(before, r, 1000 * 4), "residual unchanged by the failed calls");
    ok(ps_ef_residual(ef, 1) == NULL, "residual of a bad partition is NULL");
    ps_ef_reset(ef);
    int zero = 1;
    for (size_t i = 0; i < 1000; i++) zero &= r[i] == 0.f;
    ok(zero, "ps_ef_reset zeroes the residual");
    ps_ef_destroy(&ef);
    ps_ef_destroy(&ef); /* NULL-safe */
    free(before); free(g); free(sent); free(sum_g); free(sum_s); free(buf);
}

/* SGD on f(w) = 1/2 sum a_i (w_i - c_i)^2 (a_i in [0.2, 1]): plain fp32,
 * then top-k 1% and sign, each with and without error feedback.  Returns
 * f(w) after `steps`; the start is f(0). */
static double quad_run(size_t n, int steps, ps_codec_t c, float ratio, int use_ef, double *f0)
{
    float *w = calloc(n, 4), *a = malloc(n * 4), *cc = malloc(n * 4), *g = malloc(n * 4), *upd = malloc(n * 4);
    uint8_t *buf = malloc(ps_codec_bound(PS_DT_FP32, PS_CODEC_TOPK, n));
    uint64_t save = rng_state;
    rng_state = 0x1234567887654321ull; /* same problem for every run */
    for (size_t i = 0; i < n; i++) a[i] = 0.2f + 0.8f * (rnd32() % 1000) / 1000.f, cc[i] = rnd_normal();
    rng_state = save;
    ps_codec_params_t prm = {.topk_ratio = ratio};
    ps_ef_t *ef = NULL;
    ps_ef_new(&ef, 1, &n);
    const float lr = 0.02f; /* EF delays a coordinate ~1/ratio steps: lr * a * delay must stay ~<= 2 */
    double f = 0;
    for (size_t i = 0; i < n; i++) f += 0.5 * a[i] * cc[i] * cc[i];
    *f0 = f;
    for (int s = 0; s < steps; s++) {
        for (size_t i = 0; i < n; i++) g[i] = a[i] * (w[i] - cc[i]);
        size_t len = 0;
        int rc;
        if (c == PS_CODEC_RAW) memcpy(upd, g, n * 4), rc = 0;
        else if (use_ef) rc = ps_ef_compress(ef, 0, g, n, PS_DT_FP32, c, &prm, buf, ps_codec_bound(PS_DT_FP32, c, n), &len);
        else rc = ps_codec_encode_ex(buf, ps_codec_bound(PS_DT_FP32, c, n), &len, g, n, PS_DT_FP32, c, &prm, NULL);
        if (!rc && c != PS_CODEC_RAW) rc = ps_codec_decode(upd, n, buf, len, PS_DT_FP32, c, 0, NULL);
        if (rc) { f = INFINITY; break; }
        for (size_t i = 0; i < n; i++) w[i] -= lr * upd[i];
    }
    if (isfinite(f)) {
        f = 0;
        for (size_t i = 0; i < n; i++) f += 0.5 * a[i] * (w[i] - cc[i]) * (w[i] - cc[i]);
    }
    ps_ef_destroy(&ef);
    free(w); free(a); free(cc); free(g); free(upd); free(buf);
    return f;
}

static void test_convergence(void)
{
    size_t n = 2000;
    int steps = 3000;
    double f0, plain = quad_run(n, steps, PS_CODEC_RAW, 0, 0, &f0);
    double topk_ef = quad_run(n, steps, PS_CODEC_TOPK, 0.01f, 1, &f0), topk_no = quad_run(n, steps, PS_CODEC_TOPK, 0.01f, 0, &f0);
    double sign_ef = quad_run(n, steps, PS_CODEC_SIGN, 0, 1, &f0), sign_no = quad_run(n, steps, PS_CODEC_SIGN, 0, 0, &f0);
    diag("quadratic n=%zu, %d steps, lr 0.02: f0 %.4g  plain %.3g  topk1%%+EF %.3g (no EF %.3g)  sign+EF %.3g (no EF %.3g)",
         n, steps, f0, plain, topk_ef, topk_no, sign_ef, sign_no);
    ok(plain < 1e-9 * f0, "uncompressed SGD converges (f/f0 = %.3g)", plain / f0);
    ok(topk_ef < 1e-9 * f0 && topk_ef < 10 * plain, "top-k 1%% + error feedback converges like plain SGD (f/f0 = %.3g)", topk_ef / f0);
    ok(sign_ef < 1e-6 * f0, "sign + error feedback converges (f/f0 = %.3g)", sign_ef / f0);
    ok(topk_no > 1e3 * topk_ef && sign_no > 1e2 * sign_ef,
       "without error feedback both stall far above (top-k %.3g, sign %.3g)", topk_no / f0, sign_no / f0);
}

/* Blocks (one per model tensor): top-k takes ceil(ratio*len) of every block
 * (reference: a qsort per block), sign sends a "PSG2" payload with one
 * mean |x| per block, parsed here from the layout in ps_codec.h; bad block
 * tables are refused by encode and decode, dst untouched. */
static void test_blocks(void)
{
    enum { N = 100 };
    float x[N], y[N];
    size_t bl[3] = {3, 50, 47};
    for (size_t i = 0; i < N; i++) /* block 1 is 1000x smaller than the others */
        x[i] = (float)(sin(1.7 * (double)i + 0.3) * (i >= 3 && i < 53 ? 1e-3 : 1.0));
    ps_codec_params_t prm = {.topk_ratio = 0.1f, .block_len = bl, .nblocks = 3};
    is_int(ps_codec_topk_k_ex(N, &prm), 1 + 5 + 5, "topk k with blocks 3/50/47 at 10%%: 1+5+5");
    size_t cap = ps_codec_bound_ex(PS_DT_FP32, PS_CODEC_TOPK, N, &prm), len = 0;
    uint8_t *enc = malloc(ps_codec_bound(PS_DT_FP32, PS_CODEC_SIGN, 4000) + cap);
    is_int(cap, 24 + 11 * 8, "topk bound_ex with blocks");
    int rc = ps_codec_encode_ex(enc, cap, &len, x, N, PS_DT_FP32, PS_CODEC_TOPK, &prm, NULL);
    is_int(rc, 0, "topk encode with blocks");
    int same = len == cap && rd64(enc + 16) == 11;
    size_t j = 0, off = 0;
    for (int b = 0; b < 3 && same; b++) {
        size_t idx[50], kb = ps_codec_topk_k(bl[b], 0.1f);
        for (size_t i = 0; i < bl[b]; i++) idx[i] = off + i;
        ref_x = x;
        qsort(idx, bl[b], sizeof idx[0], cmp_ref);
        qsort(idx, kb, sizeof idx[0], cmp_size);
        for (size_t i = 0; i < kb; i++, j++) same &= rd32(enc + 24 + 4 * j) == idx[i];
        off += bl[b];
    }
    ok(same, "topk with blocks: every block's own top ceil(10%% of len), indices increasing");
    is_int(ps_codec_decode_ex(y, N, enc, len, PS_DT_FP32, PS_CODEC_TOPK, PS_DECODE_SET, NULL), 0,
           "... and it decodes as a plain topk payload");
    size_t bad1[2] = {50, 49}, bad2[3] = {50, 0, 50};
    ps_codec_params_t pb1 = {.topk_ratio = 0.1f, .block_len = bad1, .nblocks = 2};
    ps_codec_params_t pb2 = {.topk_ratio = 0.1f, .block_len = bad2, .nblocks = 3};
    is_int(ps_codec_encode_ex(enc, 4096, &len, x, N, PS_DT_FP32, PS_CODEC_TOPK, &pb1, NULL), PS_EINVAL,
           "topk: blocks adding up to 99 of 100 refused");
    is_int(ps_codec_encode_ex(enc, 4096, &len, x, N, PS_DT_FP32, PS_CODEC_TOPK, &pb2, NULL), PS_EINVAL,
           "topk: an empty block refused");
    is_int(ps_codec_encode_ex(enc, 4096, &len, x, N, PS_DT_FP32, PS_CODEC_SIGN, &pb1, NULL), PS_EINVAL,
           "sign: blocks adding up to 99 of 100 refused");

    /* sign, PSG2 */
    cap = ps_codec_bound_ex(PS_DT_FP32, PS_CODEC_SIGN, N, &prm);
    is_int(cap, 24 + 8 * 3 + 13, "sign bound_ex with 3 blocks = 24 + 8*3 + 13");
    rc = ps_codec_encode_ex(enc, cap, &len, x, N, PS_DT_FP32, PS_CODEC_SIGN, &prm, NULL);
    ok(rc == 0 && len == cap && rd32(enc) == 0x32475350u && rd32(enc + 20) == 3,
       "sign with blocks: PSG2, 3 blocks, %zu bytes", len);
    int scales_ok = 1, dec_ok = 1;
    off = 0;
    ps_codec_decode_ex(y, N, enc, len, PS_DT_FP32, PS_CODEC_SIGN, PS_DECODE_SET, NULL);
    for (int b = 0; b < 3; b++) {
        long double l1 = 0;
        for (size_t i = off; i < off + bl[b]; i++) l1 += fabsl((long double)x[i]);
        float want = (float)(l1 / bl[b]), got;
        uint32_t sb = rd32(enc + 28 + 8 * b);
        memcpy(&got, &sb, 4);
        scales_ok &= rd32(enc + 24 + 8 * b) == bl[b] && fabs(got - want) <= 1e-6 * want;
        for (size_t i = off; i < off + bl[b]; i++) dec_ok &= y[i] == (signbit(x[i]) ? -got : got);
        off += bl[b];
    }
    ok(scales_ok, "sign: each block's length and mean |x| (long double reference)");
    ok(dec_ok, "sign: block b decodes to +-scale[b] by x's sign");
    /* corrupt block tables: decode refuses, dst untouched */
    struct { size_t at; uint32_t v; const char *what; } bad[] = {
        {24, 4, "blocks adding up to 101"}, {24, 0, "an empty block"}, {20, 0, "0 blocks"},
        {20, 51, "more blocks than elements / 2"}, {28, 0x7fc00000u, "a NaN scale"},
        {36, 0xbf800000u, "a negative scale"}};
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        uint8_t tmp[256];
        memcpy(tmp, enc, len);
        wr32(tmp + bad[c].at, bad[c].v);
        for (size_t i = 0; i < N; i++) y[i] = 7.f;
        rc = ps_codec_decode_ex(y, N, tmp, len, PS_DT_FP32, PS_CODEC_SIGN, PS_DECODE_ADD, NULL);
        int untouched = 1;
        for (size_t i = 0; i < N; i++) untouched &= y[i] == 7.f;
        ok((rc == PS_ECORRUPT || rc == PS_EMISMATCH) && untouched, "sign PSG2 with %s refused (%d), dst untouched",
           bad[c].what, rc);
    }

    /* ps_ef: 2000 one-element tensors are merged into runs of 2 (<= 1024 blocks) */
    size_t n2 = 2000, ones[2000];
    float g[2000];
    for (size_t i = 0; i < n2; i++) ones[i] = 1, g[i] = (float)(i % 3) - 1.f + 0.5f;
    ps_ef_t *ef = NULL;
    ps_ef_new(&ef, 1, &n2);
    is_int(ps_ef_set_blocks(ef, 0, ones, 1999), PS_EINVAL, "ef blocks not adding up refused");
    is_int(ps_ef_set_blocks(ef, 0, ones, 2000), 0, "ef 2000 blocks accepted");
    rc = ps_ef_compress(ef, 0, g, n2, PS_DT_FP32, PS_CODEC_SIGN, NULL, enc,
                        ps_codec_bound(PS_DT_FP32, PS_CODEC_SIGN, n2), &len);
    ok(rc == 0 && rd32(enc + 20) == 1000 && len == 24 + 8 * 1000 + 250,
       "ef: 2000 tensors travel as 1000 sign blocks (%u, %zu bytes)", rd32(enc + 20), len);
    ps_ef_destroy(&ef);
    free(enc);
}

int main(void)
{
    ps_log_level = -1; /* every rejected payload logs an error */
    test_topk_params();
    test_topk_select();
    test_sign();
    test_blocks();
    test_rejects();
    test_ef_invariant();
    test_convergence();
    return tap_done();
}
