/* Error feedback with DGC momentum correction and top-k warm-up (ps_ef.h),
 * against a reference written here from the paper's algorithm (Lin et al.
 * 2018, Algorithm 1 with momentum-factor masking), in double, with its own
 * top-k (sort by |x|, lower index first on ties) and scaled sign:
 *   u = m*u + g;  v += (nesterov ? g + m*u : u);  send top-k(v);
 *   v[sent] = 0;  u[sent] = 0          (sign: v -= scale*sign(v), u kept)
 * Every step the decoded payload, the residual and the velocity must match
 * the reference; plus closed-form checks (density 1 is plain SGD on the
 * gradient; sign's sent + residual == sum of velocities), the warm-up
 * schedule's stages, the bound with per-tensor blocks, and the error paths (bad momentum, NaN gradient, a
 * corrupt payload for the mask). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_codec.h"
#include "ps_ef.h"
#include "ps_error.h"
#include "ps_log.h"
#include "tests/lib/tap.h"

#define N 300
#define STEPS 30

static double urand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffffff) / (double)0x1000000;
}

/* gradient of step t: non-zero, distinct magnitudes, a few large ones */
static void make_grad(float *g, int t, unsigned *seed)
{
    for (size_t i = 0; i < N; i++) {
        double x = (urand(seed) - 0.5) * 0.02;
        if (i % 37 == (size_t)t % 37) x *= 20;
        g[i] = (float)(x + (x >= 0 ? 1e-6 : -1e-6));
    }
}

static const double *sort_key;
static int by_mag_desc(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    double x = fabs(sort_key[i]), y = fabs(sort_key[j]);
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}

/* One reference step; sent[] gets what the server receives. */
static void ref_step(double *u, double *v, double *sent, const float *g, double m, int nesterov,
                     ps_codec_t codec, size_t k)
{
    for (size_t i = 0; i < N; i++) {
        u[i] = m * u[i] + g[i];
        v[i] += nesterov ? g[i] + m * u[i] : u[i];
        sent[i] = 0;
    }
    if (codec == PS_CODEC_TOPK) {
        size_t idx[N];
        for (size_t i = 0; i < N; i++) idx[i] = i;
        sort_key = v;
        qsort(idx, N, sizeof idx[0], by_mag_desc);
        for (size_t j = 0; j < k; j++) {
            size_t i = idx[j];
            sent[i] = v[i];
            v[i] = 0;
            u[i] = 0;
        }
    } else {
        double l1 = 0;
        for (size_t i = 0; i < N; i++) l1 += fabs(v[i]);
        double scale = l1 / N;
        for (size_t i = 0; i < N; i++) {
            sent[i] = v[i] < 0 ? -scale : scale;
            v[i] -= sent[i];
        }
    }
}

static double max_diff(const float *a, const double *b, double *maxb)
{
    double d = 0;
    *maxb = 0;
    for (size_t i = 0; i < N; i++) {
        d = fmax(d, fabs(a[i] - b[i]));
        *maxb = fmax(*maxb, fabs(b[i]));
    }
    return d;
}

static void test_against_reference(ps_codec_t codec, float ratio, float m, int nesterov)
{
    const char *what = codec == PS_CODEC_TOPK ? "topk" : "sign";
    size_t numel = N;
    ps_ef_t *ef = NULL;
    if (!ok(ps_ef_new(&ef, 1, &numel) == 0 && ps_ef_set_momentum(ef, m, nesterov) == 0,
            "%s m=%g nesterov=%d: ef created", what, (double)m, nesterov))
        return;
    ps_codec_params_t prm = {.topk_ratio = ratio};
    size_t cap = ps_codec_bound_ex(PS_DT_FP32, codec, N, &prm), k = ps_codec_topk_k(N, ratio);
    void *buf = malloc(cap);
    double u[N] = {0}, v[N] = {0}, sent[N];
    float g[N], got[N];
    unsigned seed = 12345u + (unsigned)nesterov;
    double worst_sent = 0, worst_res = 0, worst_vel = 0;
    int fails = 0;
    for (int t = 0; t < STEPS; t++) {
        make_grad(g, t, &seed);
        size_t len = 0;
        if (ps_ef_compress(ef, 0, g, N, PS_DT_FP32, codec, &prm, buf, cap, &len)) {
            fails++;
            break;
        }
        ref_step(u, v, sent, g, m, nesterov, codec, k);
        double mb;
        if (ps_codec_decode_ex(got, N, buf, len, PS_DT_FP32, codec, PS_DECODE_SET, NULL)) fails++;
        worst_sent = fmax(worst_sent, max_diff(got, sent, &mb) / (mb + 1e-30));
        worst_res = fmax(worst_res, max_diff(ps_ef_residual(ef, 0), v, &mb) / (mb + 1e-30));
        worst_vel = fmax(worst_vel, max_diff(ps_ef_velocity(ef, 0), u, &mb) / (mb + 1e-30));
    }
    is_int(fails, 0, "%s m=%g nesterov=%d: %d steps compress and decode", what, (double)m,
           nesterov, STEPS);
    /* float against double over 30 steps: relative to the largest value */
    ok(worst_sent < 1e-5, "%s: sent values match the reference (worst %.2g)", what, worst_sent);
    ok(worst_res < 1e-5, "%s: residual matches (worst %.2g)", what, worst_res);
    ok(worst_vel < 1e-5, "%s: velocity matches, masked where sent (worst %.2g)", what, worst_vel);
    free(buf);
    ps_ef_destroy(&ef);
}

/* Density 1 with masking: the velocity is cleared every step, so what is
 * sent is exactly the gradient (DGC at full density is plain SGD); sign's
 * EF identity: everything sent + residual == sum of the velocities. */
static void test_closed_forms(void)
{
    size_t numel = N;
    ps_ef_t *ef = NULL;
    ps_ef_new(&ef, 1, &numel);
    ps_ef_set_momentum(ef, 0.9f, 0);
    ps_codec_params_t all = {.topk_ratio = 1.f};
    size_t cap = ps_codec_bound_ex(PS_DT_FP32, PS_CODEC_TOPK, N, &all);
    void *buf = malloc(cap);
    float g[N], got[N];
    unsigned seed = 7;
    int same = 1;
    for (int t = 0; t < 5; t++) {
        make_grad(g, t, &seed);
        size_t len;
        ps_ef_compress(ef, 0, g, N, PS_DT_FP32, PS_CODEC_TOPK, &all, buf, cap, &len);
        ps_codec_decode_ex(got, N, buf, len, PS_DT_FP32, PS_CODEC_TOPK, PS_DECODE_SET, NULL);
        same &= !memcmp(got, g, sizeof g);
    }
    ok(same, "topk density 1 + masking: sent == gradient bit for bit, every step");
    const float *vel = ps_ef_velocity(ef, 0);
    int zero = 1;
    for (size_t i = 0; i < N; i++) zero &= vel[i] == 0.f;
    ok(zero, "topk density 1: velocity all zero after the step");
    ps_ef_destroy(&ef);

    ps_ef_new(&ef, 1, &numel);
    ps_ef_set_momentum(ef, 0.5f, 0);
    cap = ps_codec_bound_ex(PS_DT_FP32, PS_CODEC_SIGN, N, NULL);
    buf = realloc(buf, cap);
    double total[N] = {0}, usum[N] = {0}, u[N] = {0};
    for (int t = 0; t < 20; t++) {
        make_grad(g, t, &seed);
        size_t len;
        ps_ef_compress(ef, 0, g, N, PS_DT_FP32, PS_CODEC_SIGN, NULL, buf, cap, &len);
        ps_codec_decode_ex(got, N, buf, len, PS_DT_FP32, PS_CODEC_SIGN, PS_DECODE_SET, NULL);
        for (size_t i = 0; i < N; i++) {
            total[i] += got[i];
            u[i] = 0.5 * u[i] + g[i];
            usum[i] += u[i];
        }
    }
    const float *res = ps_ef_residual(ef, 0);
    double worst = 0;
    for (size_t i = 0; i < N; i++) worst = fmax(worst, fabs(total[i] + res[i] - usum[i]));
    ok(worst < 1e-5, "sign + momentum: sent + residual == sum of velocities (worst %.2g)", worst);
    free(buf);
    ps_ef_destroy(&ef);
}

static void test_warmup(void)
{
    /* 1% target over 300 steps: 3 stages of 100 (25%, 6.25%, 1.5625%) */
    is_close(ps_ef_topk_warmup_ratio(0.01f, 300, 0), 0.25, 0, 1e-7, "1%%/300: step 0 sends 25%%");
    is_close(ps_ef_topk_warmup_ratio(0.01f, 300, 99), 0.25, 0, 1e-7, "step 99: 25%%");
    is_close(ps_ef_topk_warmup_ratio(0.01f, 300, 100), 0.0625, 0, 1e-7, "step 100: 6.25%%");
    is_close(ps_ef_topk_warmup_ratio(0.01f, 300, 299), 0.015625, 0, 1e-7, "step 299: 1.5625%%");
    is_close(ps_ef_topk_warmup_ratio(0.01f, 300, 300), 0.01, 0, 1e-7, "step 300: the target");
    /* 0.1%: DGC's four stages 25, 6.25, 1.5625, 0.390625 % */
    is_close(ps_ef_topk_warmup_ratio(0.001f, 400, 350), 0.00390625, 0, 1e-7,
             "0.1%%/400: last stage 0.39%%");
    is_close(ps_ef_topk_warmup_ratio(0.001f, 400, 250), 0.015625, 0, 1e-7, "0.1%%/400: step 250 1.56%%");
    is_close(ps_ef_topk_warmup_ratio(0.001f, 0, 0), 0.001, 0, 1e-7, "no warm-up: the target");
    is_close(ps_ef_topk_warmup_ratio(0.5f, 100, 0), 0.5, 0, 1e-7, "target above 25%%: no warm-up");
    is_close(ps_ef_topk_warmup_ratio(0.f, 0, 0), PS_CODEC_TOPK_DEFAULT_RATIO, 0, 1e-7,
             "target 0: the default ratio");
}

static void test_errors(void)
{
    size_t numel = N;
    ps_ef_t *ef = NULL;
    ps_ef_new(&ef, 1, &numel);
    is_int(ps_ef_set_momentum(ef, 1.f, 0), PS_EINVAL, "momentum 1 refused");
    is_int(ps_ef_set_momentum(ef, -0.1f, 0), PS_EINVAL, "negative momentum refused");
    ok(ps_ef_velocity(ef, 0) == NULL, "momentum off: no velocity");
    ps_ef_set_momentum(ef, 0.9f, 0);
    ps_codec_params_t prm = {.topk_ratio = 0.1f};
    size_t cap = ps_codec_bound_ex(PS_DT_FP32, PS_CODEC_TOPK, N, &prm), len;
    void *buf = malloc(cap);
    float g[N], before_v[N], before_r[N];
    unsigned seed = 3;
    make_grad(g, 0, &seed);
    ps_ef_compress(ef, 0, g, N, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, cap, &len);
    memcpy(before_v, ps_ef_velocity(ef, 0), sizeof before_v);
    memcpy(before_r, ps_ef_residual(ef, 0), sizeof before_r);
    g[17] = NAN;
    is_int(ps_ef_compress(ef, 0, g, N, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, cap, &len),
           PS_ENONFINITE, "NaN gradient refused");
    ok(!memcmp(before_v, ps_ef_velocity(ef, 0), sizeof before_v) &&
           !memcmp(before_r, ps_ef_residual(ef, 0), sizeof before_r),
       "... velocity and residual untouched");
    g[17] = 0.01f;
    is_int(ps_ef_compress(ef, 0, g, N, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, 10, &len), PS_ERANGE,
           "too small a buffer refused");
    ok(!memcmp(before_v, ps_ef_velocity(ef, 0), sizeof before_v), "... velocity untouched");
    ps_ef_reset(ef);
    int zero = 1;
    for (size_t i = 0; i < N; i++) zero &= ps_ef_velocity(ef, 0)[i] == 0.f;
    ok(zero, "reset zeroes the velocity");

    /* the mask's own payload validation */
    ps_ef_compress(ef, 0, g, N, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, cap, &len);
    float x[N];
    for (size_t i = 0; i < N; i++) x[i] = 1.f;
    unsigned char *idx = (unsigned char *)buf + 24;
    idx[0] = idx[1] = idx[2] = idx[3] = 0xff; /* index 2^32-1 */
    is_int(ps_codec_topk_zero_sent(x, N, buf, len, PS_DT_FP32), PS_ECORRUPT, "mask: bad index refused");
    is_int(ps_codec_topk_zero_sent(x, N, buf, len - 1, PS_DT_FP32), PS_ECORRUPT, "mask: short payload refused");
    is_int(ps_codec_topk_zero_sent(x, N + 1, buf, len, PS_DT_FP32), PS_EMISMATCH, "mask: wrong numel refused");
    int ones = 1;
    for (size_t i = 0; i < N; i++) ones &= x[i] == 1.f;
    ok(ones, "mask: x untouched after the errors");
    free(buf);
    ps_ef_destroy(&ef);
}

/* ps_ef_bound covers the partition's blocks (a caller sizing its buffer by
 * the block-less bound gets PS_ERANGE once blocks round k up) */
static void test_bound_blocks(void)
{
    size_t numel = N, bl[4] = {1, 99, 100, 100};
    ps_ef_t *ef = NULL;
    ps_ef_new(&ef, 1, &numel);
    ps_ef_set_blocks(ef, 0, bl, 4);
    ps_codec_params_t prm = {.topk_ratio = 0.01f};
    size_t b = ps_ef_bound(ef, 0, PS_DT_FP32, PS_CODEC_TOPK, &prm), len = 0;
    is_int(b, 24 + (1 + 1 + 1 + 1) * 8, "bound with blocks: k = 1 per block at 1%%");
    ok(b > ps_codec_bound_ex(PS_DT_FP32, PS_CODEC_TOPK, N, &prm), "... above the one-block bound");
    void *buf = malloc(b + 64);
    float g[N];
    unsigned seed = 11;
    make_grad(g, 0, &seed);
    ok(ps_ef_compress(ef, 0, g, N, PS_DT_FP32, PS_CODEC_TOPK, &prm, buf, b, &len) == 0 && len == b,
       "topk with blocks fits its bound exactly");
    b = ps_ef_bound(ef, 0, PS_DT_FP32, PS_CODEC_SIGN, NULL);
    ok(ps_ef_compress(ef, 0, g, N, PS_DT_FP32, PS_CODEC_SIGN, NULL, buf, b, &len) == 0 && len == b &&
           len == 24 + 8 * 4 + (N + 7) / 8,
       "sign with 4 blocks fits its bound exactly (%zu bytes)", len);
    is_int(ps_ef_bound(ef, 1, PS_DT_FP32, PS_CODEC_SIGN, NULL), 0, "bound of a bad partition: 0");
    free(buf);
    ps_ef_destroy(&ef);
}

int main(void)
{
    ps_log_level = -1; /* the error paths log by design */
    test_against_reference(PS_CODEC_TOPK, 0.05f, 0.9f, 0);
    test_against_reference(PS_CODEC_TOPK, 0.05f, 0.9f, 1);
    test_against_reference(PS_CODEC_SIGN, 0.f, 0.9f, 0);
    test_closed_forms();
    test_warmup();
    test_errors();
    test_bound_blocks();
    return tap_done();
}
