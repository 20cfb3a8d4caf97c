// The CUDA backend's kernels run on the CPU (no GPU, no toolkit needed):
// tests/cuda_emu/extract.py copies every __global__/__device__ function of
// worker/engine/cuda/*.cu into kernels.inc, and this program runs them with
// each block's threads as OpenMP threads (__syncthreads = a barrier, warp
// shuffles = a barrier-synchronised exchange), then compares with the CPU
// layers.  It checks the kernels' index math and reductions on every
// machine; the launchers, cuDNN and cuBLAS need the GPU
// (tests/test_cuda_layers.c).  Grids here are deliberately small so the
// grid-stride loops wrap.  TAP output.
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <omp.h>
using std::isfinite;
using std::isnan;

struct dim3 {
    unsigned x, y, z;
};
static dim3 blockIdx, blockDim, gridDim;
static dim3 threadIdx;
#pragma omp threadprivate(threadIdx)
#define __global__ static
#define __device__ static
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __syncthreads() _Pragma("omp barrier")
template <class T> static T __shfl_down_sync(unsigned, T v, int o)
{
    static T slot[1024];
    const int t = (int)threadIdx.x;
    slot[t] = v;
#pragma omp barrier
    T r = ((t & 31) + o < 32) ? slot[t + o] : v;
#pragma omp barrier
    return r;
}
// IEEE float operations nvcc may not contract (roi_align.cu): plain C++
// operations here (no FMA contraction without -mfma)
static float __fmul_rn(float a, float b) { return a * b; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fdiv_rn(float a, float b) { return a / b; }
template <class T> static T atomicAdd(T *p, T v)
{
    T old;
#pragma omp atomic capture
    {
        old = *p;
        *p += v;
    }
    return old;
}
extern "C" {
#include "worker/engine/layers/cpu_layers.h"
#include "ps_half.h"
}
// cuda_fp16.h / cuda_bf16.h stand-ins for mixed.cu's casts: 16-bit storage
// and common/ps_half.c's conversions, which round to nearest even and keep
// Inf/NaN as __float2half_rn / __float2bfloat16_rn do (tests/test_cuda_cast
// checks that equivalence bit for bit on the GPU).
struct __half {
    uint16_t x;
};
struct __nv_bfloat16 {
    uint16_t x;
};
static __half __float2half_rn(float f) { return __half{ps_fp32_to_fp16_1(f)}; }
static float __half2float(__half h) { return ps_fp16_to_fp32_1(h.x); }
static __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{ps_fp32_to_bf16_1(f)}; }
static float __bfloat162float(__nv_bfloat16 h) { return ps_bf16_to_fp32_1(h.x); }
#include "kernels.inc"

#define EMU(kernel, G, B, ...)                                                  \
    do {                                                                        \
        gridDim.x = (G);                                                        \
        blockDim.x = (B);                                                       \
        const int nt_ = (B);                                                    \
        for (unsigned b_ = 0; b_ < (unsigned)(G); b_++) {                       \
            blockIdx.x = b_;                                                    \
            _Pragma("omp parallel num_threads(nt_)")                            \
            {                                                                   \
                threadIdx.x = (unsigned)omp_get_thread_num();                   \
                kernel(__VA_ARGS__);                                            \
            }                                                                   \
        }                                                                       \
    } while (0)

static int nt, nfail;
static void tap(int cond, const char *fmt, ...)
{
    va_list ap;
    nt++;
    nfail += !cond;
    printf("%sok %d - ", cond ? "" : "not ", nt);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}
// |a-b| <= atol + rtol|b|, NaN never equal (exact when both 0)
static void cmp(const float *a, const float *b, size_t n, double atol, double rtol,
                const char *what)
{
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) d = INFINITY;
        if (d > worst) worst = d;
        if (!(d <= atol + rtol * fabs((double)b[i]))) bad++;
    }
    tap(bad == 0, "%s: %zu elements (worst %.3g)", what, n, worst);
}
static unsigned rs = 12345;
static float fr()
{
    rs = rs * 1103515245u + 12345u;
    return (float)((rs >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}
static float *rnd(size_t n, float s = 1, float o = 0)
{
    float *p = (float *)malloc((n ? n : 1) * 4);
    for (size_t i = 0; i < n; i++) p[i] = fr() * s + o;
    return p;
}
static float *nans(size_t n)
{
    float *p = (float *)malloc((n ? n : 1) * 4);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static float *cp(const float *s, size_t n)
{
    float *p = (float *)malloc((n ? n : 1) * 4);
    memcpy(p, s, n * 4);
    return p;
}

static ps_ctx_t ctx;

static void elementwise()
{
    const size_t n = 1000;
    float *x = rnd(n), *y = nans(n), *y2 = nans(n), *dy = rnd(n), *dx = nans(n), *dx2 = nans(n);
    ps_cpu_relu_forward(&ctx, y, x, n);
    EMU(k_relu_fwd, 2, 32, y2, x, n);
    cmp(y2, y, n, 0, 0, "relu forward");
    ps_cpu_relu_backward(&ctx, dx, dy, y, n);
    EMU(k_relu_bwd, 2, 32, dx2, dy, y2, n);
    cmp(dx2, dx, n, 0, 0, "relu backward");
    float *a = cp(x, n), *a2 = cp(x, n);
    ps_cpu_add(&ctx, a, a, dy, n);
    EMU(k_add, 3, 32, a2, a2, dy, n);
    cmp(a2, a, n, 0, 0, "add (aliased)");
    ps_cpu_accumulate(&ctx, a, dy, n);
    EMU(k_acc, 3, 32, a2, dy, n);
    cmp(a2, a, n, 0, 0, "accumulate");
    /* dropout: device copy of ps_rng_uniform must give the CPU's mask */
    const size_t m = 10007;
    const float p = 0.3f, sc = 1.0f / (1.0f - p);
    float *u = rnd(m), *o = nans(m), *o2 = nans(m), *g = rnd(m), *gi = nans(m), *gi2 = nans(m);
    uint8_t *k = (uint8_t *)malloc(m), *k2 = (uint8_t *)malloc(m);
    ps_cpu_dropout_forward(&ctx, o, k, u, m, p, 77);
    EMU(k_dropout_fwd, 4, 64, o2, k2, u, m, p, sc, (uint64_t)77);
    cmp(o2, o, m, 0, 0, "dropout forward");
    tap(!memcmp(k, k2, m), "dropout mask identical (d_rng_uniform == ps_rng_uniform)");
    ps_cpu_dropout_backward(&ctx, gi, g, k, m, p);
    EMU(k_dropout_bwd, 4, 64, gi2, g, k2, m, sc);
    cmp(gi2, gi, m, 0, 0, "dropout backward");
    /* overflow check and unscale */
    int flag = 0;
    EMU(k_overflow, 3, 32, &flag, x, n);
    tap(flag == 0, "overflow check: clean buffer");
    x[n - 1] = INFINITY;
    EMU(k_overflow, 3, 32, &flag, x, n);
    tap(flag == 1, "overflow check: Inf at the end found");
    x[n - 1] = 0.5f;
    float *s = cp(dy, n);
    EMU(k_scale, 2, 32, s, n, 0.25f);
    int exact = 1;
    for (size_t i = 0; i < n; i++) exact &= s[i] == dy[i] * 0.25f;
    tap(exact, "unscale by 1/4 exact");
}

/* the 3-D pools (pool3d.cu): max (forward, argmax, gathered backward) and
 * average (with and without the padding in the divisor), exactly the CPU's */
static void pooling3d()
{
    /* N C D H W  KT R S  st sh sw  pt ph pw  count_include_pad */
    const int cfgs[][15] = {{2, 3, 4, 9, 8, 1, 3, 3, 1, 2, 2, 0, 1, 1, 1},
                            {1, 2, 6, 5, 4, 2, 1, 1, 2, 1, 1, 0, 0, 0, 1},
                            {1, 2, 5, 7, 6, 3, 3, 3, 2, 2, 2, 1, 1, 1, 0}};
    for (const auto &c : cfgs) {
        const int N = c[0], C = c[1], D = c[2], H = c[3], W = c[4];
        ps_pool3d_desc_t d = {c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13], c[14]};
        const int O = ps_conv_out(D, d.KT, d.stride_t, d.pad_t, 1);
        const int P = ps_conv_out(H, d.R, d.stride_h, d.pad_h, 1);
        const int Q = ps_conv_out(W, d.S, d.stride_w, d.pad_w, 1);
        const pool3 p = {D, H, W, O, P, Q, d.KT, d.R, d.S, d.stride_t, d.stride_h, d.stride_w,
                         d.pad_t, d.pad_h, d.pad_w, d.count_include_pad};
        const size_t ni = (size_t)N * C * D * H * W, no = (size_t)N * C * O * P * Q;
        float *x = rnd(ni), *dy = rnd(no), *y = nans(no), *y2 = nans(no), *dx = nans(ni),
              *dx2 = nans(ni);
        for (size_t i = 0; i + 1 < ni; i += 7) x[i + 1] = x[i]; /* ties */
        int32_t *am = (int32_t *)malloc(no * 4), *am2 = (int32_t *)malloc(no * 4);
        ps_cpu_maxpool3d_forward(&ctx, y, am, x, &d, N, C, D, H, W);
        EMU(k_pool3d_fwd<true>, 3, 32, y2, am2, x, no, p);
        cmp(y2, y, no, 0, 0, "maxpool3d forward");
        tap(!memcmp(am, am2, no * 4), "maxpool3d argmax identical");
        ps_cpu_maxpool3d_backward(&ctx, dx, dy, am, &d, N, C, D, H, W);
        EMU(k_pool3d_bwd<true>, 3, 32, dx2, dy, am2, ni, p);
        cmp(dx2, dx, ni, 0, 0, "maxpool3d backward (gather)");
        ps_cpu_avgpool3d_forward(&ctx, y, x, &d, N, C, D, H, W);
        EMU(k_pool3d_fwd<false>, 3, 32, y2, (int32_t *)NULL, x, no, p);
        cmp(y2, y, no, 0, 0, "avgpool3d forward");
        ps_cpu_avgpool3d_backward(&ctx, dx, dy, &d, N, C, D, H, W);
        EMU(k_pool3d_bwd<false>, 3, 32, dx2, dy, (const int32_t *)NULL, ni, p);
        cmp(dx2, dx, ni, 0, 0, "avgpool3d backward (gather, the CPU's order)");
        free(x), free(dy), free(y), free(y2), free(dx), free(dx2), free(am), free(am2);
    }
}

static void pooling()
{
    const int cfgs[][7] = {{2, 4, 11, 11, 3, 2, 1}, {2, 3, 8, 8, 2, 2, 0}, {1, 2, 7, 9, 3, 1, 1},
                           {1, 1, 5, 5, 3, 3, 1}};
    for (const auto &c : cfgs) {
        const int N = c[0], C = c[1], H = c[2], W = c[3], R = c[4], st = c[5], pad = c[6];
        ps_pool_desc_t d = {R, R, st, st, pad, pad};
        const int P = ps_conv_out(H, R, st, pad, 1), Q = ps_conv_out(W, R, st, pad, 1);
        const size_t ni = (size_t)N * C * H * W, no = (size_t)N * C * P * Q;
        float *x = rnd(ni), *dy = rnd(no), *y = nans(no), *y2 = nans(no), *dx = nans(ni),
              *dx2 = nans(ni);
        for (size_t i = 0; i + 1 < ni; i += 7) x[i + 1] = x[i]; /* ties */
        int32_t *am = (int32_t *)malloc(no * 4), *am2 = (int32_t *)malloc(no * 4);
        ps_cpu_maxpool_forward(&ctx, y, am, x, &d, N, C, H, W);
        EMU(k_maxpool_fwd, 3, 32, y2, am2, x, no, H, W, P, Q, R, R, st, st, pad, pad);
        cmp(y2, y, no, 0, 0, "maxpool forward");
        tap(!memcmp(am, am2, no * 4), "maxpool argmax identical");
        ps_cpu_maxpool_backward(&ctx, dx, dy, am, &d, N, C, H, W);
        EMU(k_maxpool_bwd, 3, 32, dx2, dy, am2, ni, H, W, P, Q, R, R, st, st, pad, pad);
        cmp(dx2, dx, ni, 0, 0, "maxpool backward (gather)");
    }
    const int N = 2, C = 4, HW = 3137;
    const size_t n = (size_t)N * C * HW;
    float *x = rnd(n), *y = nans(N * C), *y2 = nans(N * C), *dx = nans(n), *dx2 = nans(n);
    ps_cpu_avgpool_forward(&ctx, y, x, N, C, HW);
    EMU(k_avgpool_fwd, 1, 256, y2, x, (size_t)N * C, HW, 1.0f / HW);
    cmp(y2, y, N * C, 1e-6, 1e-5, "avgpool forward (warp sums)");
    ps_cpu_avgpool_backward(&ctx, dx, y, N, C, HW);
    EMU(k_avgpool_bwd, 2, 64, dx2, y, n, HW, 1.0f / HW);
    cmp(dx2, dx, n, 0, 0, "avgpool backward");
}

static void shift_consensus_xent()
{
    const int ts[][5] = {{2, 4, 16, 5, 8}, {2, 8, 8, 3, 4}, {1, 3, 7, 2, 8}, {3, 8, 64, 49, 8},
                         {2, 1, 8, 3, 4}};
    for (const auto &c : ts) {
        const int B = c[0], T = c[1], C = c[2], HW = c[3], fd = c[4];
        const size_t n = (size_t)B * T * C * HW, cols = (size_t)B * C * HW;
        float *x = rnd(n), *y = nans(n), *y2 = nans(n), *dx = nans(n), *dx2 = nans(n);
        ps_cpu_tshift_forward(&ctx, y, x, B, T, C, HW, fd);
        EMU(k_tshift, 2, 64, y2, x, cols, T, C, HW, C / fd, +1);
        cmp(y2, y, n, 0, 0, "tshift forward");
        ps_cpu_tshift_backward(&ctx, dx, x, B, T, C, HW, fd);
        EMU(k_tshift, 2, 64, dx2, x, cols, T, C, HW, C / fd, -1);
        cmp(dx2, dx, n, 0, 0, "tshift backward");
        float *xi = cp(x, n);
        EMU(k_tshift, 2, 64, xi, xi, cols, T, C, HW, C / fd, +1);
        cmp(xi, y, n, 0, 0, "tshift forward in place");
    }
    const int B = 3, T = 8, K = 10;
    const size_t ni = (size_t)B * T * K, no = (size_t)B * K;
    float *x = rnd(ni), *dy = rnd(no), *y = nans(no), *y2 = nans(no), *dx = nans(ni),
          *dx2 = nans(ni);
    ps_cpu_consensus_forward(&ctx, y, x, B, T, K);
    EMU(k_consensus_fwd, 2, 8, y2, x, B, T, K, 1.0f / T);
    cmp(y2, y, no, 0, 0, "consensus forward");
    ps_cpu_consensus_backward(&ctx, dx, dy, B, T, K);
    EMU(k_consensus_bwd, 2, 8, dx2, dy, T, K, ni, 1.0f / T);
    cmp(dx2, dx, ni, 0, 0, "consensus backward");

    const int xc[][2] = {{6, 10}, {4, 400}, {3, 1}};
    for (const auto &c : xc) {
        const int N = c[0], Kc = c[1];
        const size_t n = (size_t)N * Kc;
        float *z = rnd(n, 5), *pr = nans(n), *pr2 = nans(n), *g = nans(n), *g2 = nans(n);
        int32_t *lab = (int32_t *)malloc(N * 4);
        for (int i = 0; i < N; i++) lab[i] = (i * 7) % Kc;
        double *rl = (double *)malloc(N * 8);
        const float lc = ps_cpu_xent_forward(&ctx, pr, z, lab, N, Kc);
        EMU(k_xent_fwd, N, 128, pr2, rl, z, lab, Kc);
        double s = 0;
        for (int i = 0; i < N; i++) s += rl[i];
        const float lg = (float)(s / N);
        tap(fabs(lg - lc) <= 1e-6 * fabs(lc) + 1e-7, "xent N%d K%d loss %.7g vs cpu %.7g", N, Kc,
            lg, lc);
        cmp(pr2, pr, n, 1e-7, 1e-5, "xent probs");
        lab[N - 1] = Kc; /* a bad label: no one-hot on the CPU, none here */
        ps_cpu_xent_backward(&ctx, g, pr, lab, 1.3f, N, Kc);
        EMU(k_xent_bwd, 2, 16, g2, pr, lab, n, Kc, 1.3f / N);
        cmp(g2, g, n, 0, 0, "xent backward (last label out of range)");
    }
}

static void batchnorm()
{
    const int cfg[][3] = {{4, 8, 25}, {3, 5, 1}, {2, 3, 700}};
    for (const auto &c : cfg) {
        const int N = c[0], C = c[1], HW = c[2];
        const size_t n = (size_t)N * C * HW;
        char tag[64];
        snprintf(tag, sizeof tag, "bn N%d C%d HW%d", N, C, HW);
        float *x = rnd(n, 1, 2.0f), *g = rnd(C, 0.5f, 1), *be = rnd(C), *rm = rnd(C),
              *rv = rnd(C, 0.3f, 1);
        float *rm2 = cp(rm, C), *rv2 = cp(rv, C), *sm = nans(C), *sr = nans(C), *sm2 = nans(C),
              *sr2 = nans(C), *y = nans(n), *y2 = nans(n), *ss = nans(2 * C);
        float *rm4 = cp(rm, C), *rv4 = cp(rv, C);
        ps_cpu_bn_forward_train(&ctx, y, sm, sr, rm, rv, x, g, be, 1e-5f, 0.1f, N, C, HW);
        EMU(k_bn_stats, C, 256, ss, sm2, sr2, rm2, rv2, x, g, be, 1e-5f, 0.1f, N, C, HW);
        EMU(k_bn_apply, 2, 64, y2, x, ss, n, C, HW);
        { /* cross-worker BN's kernels with this rank alone in the exchange,
           * and recomputation's coefficients: the one-rank kernels' values
           * bit for bit */
            double *mom = (double *)malloc(2 * C * sizeof(double));
            float *sm4 = nans(C), *sr4 = nans(C), *ss4 = nans(2 * C), *ss5 = nans(2 * C);
            EMU(k_bn_moments, C, 256, mom, x, N, C, HW);
            EMU(k_bn_fin_moments, 1, 64, ss4, sm4, sr4, rm4, rv4, (const double *)mom,
                (double)N * HW, g, be, 1e-5f, 0.1f, C);
            cmp(ss4, ss, 2 * C, 0, 0, "bn group kernels, one rank: scale/shift == k_bn_stats'");
            cmp(sm4, sm2, C, 0, 0, "  ... save_mean");
            cmp(sr4, sr2, C, 0, 0, "  ... save_rstd");
            cmp(rm4, rm2, C, 0, 0, "  ... running_mean");
            cmp(rv4, rv2, C, 0, 0, "  ... running_var");
            EMU(k_bn_saved_coef, 1, 64, ss5, g, be, sm2, sr2, C);
            cmp(ss5, ss, 2 * C, 0, 0, "bn_forward_saved: the training forward's scale/shift");
            free(mom), free(sm4), free(sr4), free(ss4), free(ss5);
        }
        free(rm4), free(rv4);
        printf("# %s\n", tag);
        cmp(sm2, sm, C, 1e-6, 1e-6, "bn save_mean");
        cmp(sr2, sr, C, 0, 1e-5, "bn save_rstd");
        cmp(rm2, rm, C, 1e-6, 1e-6, "bn running_mean");
        cmp(rv2, rv, C, 0, 1e-5, "bn running_var (unbiased)");
        cmp(y2, y, n, 1e-5, 1e-5, "bn train forward");
        float *dy = rnd(n), *dg = rnd(C, 0.1f), *db = rnd(C, 0.1f), *dg2 = cp(dg, C),
              *db2 = cp(db, C), *dx = nans(n), *dx2 = nans(n), *coef = nans(5 * C);
        float *dg4 = cp(dg, C), *db4 = cp(db, C), *coef4 = nans(5 * C);
        ps_cpu_bn_backward_train(&ctx, dx, dg, db, dy, x, g, sm, sr, N, C, HW);
        EMU(k_bn_bwd_sums, C, 256, coef, dg2, db2, dy, x, g, sm, sr, (const float *)NULL,
            (const float *)NULL, 0.0f, N, C, HW);
        { /* the group's backward kernels, one rank: k_bn_bwd_sums' values */
            double *ab = (double *)malloc(2 * C * sizeof(double));
            EMU(k_bn_bwd_local, C, 256, ab, dg4, db4, dy, x, sm, sr, N, C, HW);
            EMU(k_bn_bwd_coef, 1, 64, coef4, (const double *)ab, (double)N * HW, g, sm, sr, C);
            cmp(coef4, coef, 5 * C, 0, 0, "bn group backward kernels, one rank: dx coefficients");
            cmp(dg4, dg2, C, 0, 0, "  ... dgamma (this rank's, accumulated)");
            cmp(db4, db2, C, 0, 0, "  ... dbeta");
            free(ab);
        }
        free(dg4), free(db4), free(coef4);
        EMU(k_bn_bwd_apply, 2, 64, dx2, dy, x, coef, n, C, HW, 1);
        cmp(dg2, dg, C, 2e-5, 1e-5, "bn train dgamma (accumulated)");
        cmp(db2, db, C, 2e-5, 1e-5, "bn train dbeta (accumulated)");
        cmp(dx2, dx, n, 1e-5, 1e-5, "bn train dinp");
        /* eval forward + backward, then frozen (NULL dgamma/dbeta) */
        float *ye = nans(n), *ye2 = nans(n);
        ps_cpu_bn_forward_eval(&ctx, ye, x, g, be, rm, rv, 1e-5f, N, C, HW);
        EMU(k_bn_eval_coef, 1, 32, ss, g, be, rm, rv, 1e-5f, C);
        EMU(k_bn_apply, 2, 64, ye2, x, ss, n, C, HW);
        cmp(ye2, ye, n, 0, 0, "bn eval forward");
        ps_cpu_bn_backward_eval(&ctx, dx, dg, db, dy, x, g, rm, rv, 1e-5f, N, C, HW);
        EMU(k_bn_bwd_sums, C, 256, coef, dg2, db2, dy, x, g, (const float *)NULL,
            (const float *)NULL, rm, rv, 1e-5f, N, C, HW);
        EMU(k_bn_bwd_apply, 2, 64, dx2, dy, x, coef, n, C, HW, 0);
        cmp(dg2, dg, C, 4e-5, 1e-5, "bn eval dgamma (accumulated twice)");
        cmp(db2, db, C, 4e-5, 1e-5, "bn eval dbeta (accumulated twice)");
        cmp(dx2, dx, n, 0, 0, "bn eval dinp");
        ps_cpu_bn_backward_eval(&ctx, dx, NULL, NULL, dy, x, g, rm, rv, 1e-5f, N, C, HW);
        EMU(k_bn_bwd_sums, C, 256, coef, (float *)NULL, (float *)NULL, dy, x, g,
            (const float *)NULL, (const float *)NULL, rm, rv, 1e-5f, N, C, HW);
        EMU(k_bn_bwd_apply, 2, 64, dx2, dy, x, coef, n, C, HW, 0);
        cmp(dx2, dx, n, 0, 0, "bn frozen dinp");
        /* per-channel sums (conv bias gradient) */
        float *acc = rnd(C), *acc2 = cp(acc, C);
        for (int cc = 0; cc < C; cc++) {
            double s = 0;
            for (int i = 0; i < N; i++)
                for (int h = 0; h < HW; h++) s += dy[((size_t)i * C + cc) * HW + h];
            acc[cc] += (float)s;
        }
        EMU(k_chan_sum_acc, C, 256, acc2, dy, N, C, HW);
        cmp(acc2, acc, C, 1e-5, 1e-6, "channel sums accumulated (conv bias grad)");
    }
}

static void biases()
{
    const int N = 5, K = 7, PQ = 6;
    float *b = rnd(K), *o = (float *)calloc(N * K, 4), *dy = rnd(N * K), *db = rnd(K);
    float *db2 = cp(db, K);
    EMU(k_bias_rows, 2, 8, o, b, (size_t)N * K, K);
    int okb = 1;
    for (int i = 0; i < N * K; i++) okb &= o[i] == b[i % K];
    tap(okb, "linear bias broadcast");
    for (int k = 0; k < K; k++) {
        float s = 0;
        for (int i = 0; i < N; i++) s += dy[i * K + k];
        db[k] += s;
    }
    EMU(k_bias_grad, 1, 8, db2, dy, N, K);
    cmp(db2, db, K, 0, 0, "linear bias gradient (accumulated)");
    float *oc = (float *)calloc((size_t)N * K * PQ, 4);
    EMU(k_bias_add, 3, 16, oc, b, (size_t)N * K * PQ, K, PQ);
    okb = 1;
    for (size_t i = 0; i < (size_t)N * K * PQ; i++) okb &= oc[i] == b[(i / PQ) % K];
    tap(okb, "conv bias add (N,K,PQ)");
}

// mixed.cu: NCHW fp32 -> NHWC half and back (with accumulation), against
// an explicit transpose with the CPU conversions.
static void layouts()
{
    const int N = 3, C = 5, HW = 7;
    const size_t n = (size_t)N * C * HW;
    float *x = rnd(n, 3), *back = nans(n), *acc = rnd(n), *want = nans(n), *wacc = cp(acc, n);
    uint16_t *ref16 = (uint16_t *)malloc(n * 2), *refbf = (uint16_t *)malloc(n * 2);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < HW; p++) {
                const float v = x[((size_t)i * C + c) * HW + p];
                ref16[((size_t)i * HW + p) * C + c] = ps_fp32_to_fp16_1(v);
                refbf[((size_t)i * HW + p) * C + c] = ps_fp32_to_bf16_1(v);
            }
    __half *h = (__half *)malloc(n * sizeof(__half));
    __nv_bfloat16 *b = (__nv_bfloat16 *)malloc(n * sizeof(__nv_bfloat16));
    memset(h, 0xff, n * sizeof *h);
    memset(b, 0xff, n * sizeof *b);
    EMU(k_nchw_to_nhwc_f16, 2, 16, h, x, n, C, HW);
    EMU(k_nchw_to_nhwc_bf16, 3, 8, b, x, n, C, HW);
    int ok16 = 1, okbf = 1;
    for (size_t i = 0; i < n; i++) ok16 &= h[i].x == ref16[i], okbf &= b[i].x == refbf[i];
    tap(ok16, "NCHW fp32 -> NHWC fp16 (N%d C%d HW%d), bit for bit", N, C, HW);
    tap(okbf, "NCHW fp32 -> NHWC bf16, bit for bit");
    for (size_t i = 0; i < n; i++) want[i] = ps_fp16_to_fp32_1(ps_fp32_to_fp16_1(x[i]));
    EMU(k_nhwc_f16_to_nchw, 2, 16, back, h, n, C, HW, 0);
    cmp(back, want, n, 0, 0, "NHWC fp16 -> NCHW fp32 round trip = x rounded to fp16");
    for (size_t i = 0; i < n; i++) wacc[i] += ps_bf16_to_fp32_1(ps_fp32_to_bf16_1(x[i]));
    EMU(k_nhwc_bf16_to_nchw, 3, 8, acc, b, n, C, HW, 1);
    cmp(acc, wacc, n, 0, 0, "NHWC bf16 -> NCHW fp32, accumulated");
    /* NCHW half (PS_CUDA_NCHW=1): the same kernel with C = 1, HW = C*HW */
    for (size_t i = 0; i < n; i++) h[i].x = ps_fp32_to_fp16_1(x[i]);
    float *flat = nans(n);
    EMU(k_nhwc_f16_to_nchw, 2, 16, flat, h, n, 1, C * HW, 0);
    cmp(flat, want, n, 0, 0, "NCHW fp16 -> NCHW fp32 (C = 1 form)");
    free(x), free(back), free(acc), free(want), free(wacc), free(ref16), free(refbf);
    free(h), free(b), free(flat);
}

// det_layers.cu: FPN upsample-add, focal loss, smooth-L1, the label scan
// and the head permute against the CPU layers (worker/engine/layers/).  The launchers'
// host steps are repeated here: loss partials (one double per block) added
// in block order, the label scan's per-block (first bad, positives) pairs
// reduced with min / sum.  The reduction kernels run with DET_THREADS
// threads per block (their shared arrays assume it), on grids both smaller
// than the data (grid-stride wraps) and larger (idle blocks must report
// neutral values).
static double det_sum(const double *part, unsigned G)
{
    double s = 0;
    for (unsigned b = 0; b < G; b++) s += part[b];
    return s;
}

static void det_labels(const int32_t *lab, int A, int K, unsigned G, int *bad, int *pos)
{
    int *part = (int *)malloc(2 * G * sizeof(int));
    for (unsigned b = 0; b < 2 * G; b++) part[b] = -12345; /* every block must write */
    EMU(k_det_labels, G, DET_THREADS, part, lab, A, K);
    *bad = 0x7fffffff;
    *pos = 0;
    for (unsigned b = 0; b < G; b++) {
        if (part[2 * b] < *bad) *bad = part[2 * b];
        *pos += part[2 * b + 1];
    }
    if (*bad == 0x7fffffff) *bad = -1;
    free(part);
}

static void det_upsample()
{
    /* N C H W P Q: 2x, torchvision FPN odd laterals, scale 7/3, same size,
     * shrink, a 1x1 top, a 400 px image's C5 -> C4 */
    const int cfg[][6] = {{2, 3, 4, 5, 8, 10}, {2, 3, 5, 7, 9, 13}, {1, 2, 3, 3, 7, 7},
                          {1, 4, 7, 6, 7, 6},  {2, 2, 6, 5, 3, 4},  {1, 1, 1, 1, 5, 3},
                          {1, 3, 13, 17, 25, 33}, {1, 8, 25, 25, 50, 50}};
    for (const auto &c : cfg) {
        const int N = c[0], C = c[1], H = c[2], W = c[3], P = c[4], Q = c[5];
        const size_t ntop = (size_t)N * C * H * W, nl = (size_t)N * C * P * Q;
        char tag[96];
        snprintf(tag, sizeof tag, "upsample-add N%d C%d %dx%d -> %dx%d", N, C, H, W, P, Q);
        float *top = rnd(ntop), *lat = rnd(nl), *dout = rnd(nl), *y = nans(nl), *y2 = nans(nl),
              *dt = nans(ntop), *dt2 = nans(ntop), *l2 = cp(lat, nl);
        ps_cpu_upsample_add_forward(&ctx, y, lat, top, N, C, H, W, P, Q);
        EMU(k_det_upadd_fwd, 3, 32, y2, lat, top, nl, H, W, P, Q);
        cmp(y2, y, nl, 0, 0, tag);
        EMU(k_det_upadd_fwd, 2, 16, l2, l2, top, nl, H, W, P, Q);
        cmp(l2, y, nl, 0, 0, "  ... in place (out aliases lateral)");
        ps_cpu_upsample_add_backward(&ctx, NULL, dt, dout, N, C, H, W, P, Q);
        EMU(k_det_upadd_bwd, 2, 32, dt2, dout, ntop, H, W, P, Q);
        cmp(dt2, dt, ntop, 0, 0, "  ... backward dtop (gather in the CPU's order: exact)");
        /* independent of the CPU code: every output pixel has exactly one
         * source, so the gradient's total is conserved */
        double sg = 0, so = 0;
        for (size_t i = 0; i < ntop; i++) sg += dt2[i];
        for (size_t i = 0; i < nl; i++) so += dout[i];
        tap(fabs(sg - so) <= 1e-5 * (1 + fabs(so)), "  ... sum(dtop) %.6g = sum(dout) %.6g", sg,
            so);
        free(top), free(lat), free(dout), free(y), free(y2), free(dt), free(dt2), free(l2);
    }
}

/* mode 0: labels -1..K mixed; 1: no positives (0 / -1); 2: all ignored */
static void det_losses(int A, int K, float scale, int mode, unsigned G, const char *tag)
{
    const float alpha = 0.25f, gamma = 2.0f, beta = 1.0f / 9.0f;
    const size_t nk = (size_t)A * K, n4 = (size_t)A * 4;
    float *x = rnd(nk, scale), *pred = rnd(n4, 0.3f), *tgt = rnd(n4, 0.3f);
    int32_t *lab = (int32_t *)malloc(A * sizeof(int32_t));
    for (int a = 0; a < A; a++) {
        const int r = (int)((fr() + 1.0f) * 1000.0f);
        lab[a] = mode == 2 ? -1 : mode == 1 ? (r % 3 == 0 ? -1 : 0) : r % (K + 2) - 1;
    }
    if (scale > 100 && A > 3) x[0] = 1e4f, x[1] = -1e4f, x[nk - 1] = 1e4f, x[nk - 2] = -1e4f;
    const int npos = ps_cpu_count_pos(&ctx, lab, A);
    const float norm = npos > 1 ? (float)npos : 1.0f;
    int bad, pos;
    det_labels(lab, A, K, G, &bad, &pos);
    tap(bad == -1 && pos == npos, "%s (A %d K %d, %u blocks): label scan: none bad, %d positives "
        "(cpu %d)", tag, A, K, G, pos, npos);

    double *part = (double *)malloc(G * sizeof(double));
    for (unsigned b = 0; b < G; b++) part[b] = NAN; /* every block must write */
    float lc = NAN;
    tap(ps_cpu_focal_forward(&ctx, &lc, x, lab, alpha, gamma, norm, A, K) == 0, "  cpu accepts");
    EMU(k_det_focal_fwd, G, DET_THREADS, part, x, lab, nk, K, alpha, gamma);
    const float lg = (float)(det_sum(part, G) / norm);
    tap(fabs((double)lg - lc) <= 1e-6 * fabs(lc) && isfinite(lg),
        "  focal loss %.9g vs cpu %.9g (normaliser %g)", lg, lc, norm);
    float *dx = nans(nk), *dx2 = nans(nk);
    ps_cpu_focal_backward(&ctx, dx, x, lab, 1.3f, alpha, gamma, norm, A, K);
    EMU(k_det_focal_bwd, 3, 64, dx2, x, lab, nk, K, alpha, gamma, (double)1.3f / norm);
    double m = 0;
    for (size_t i = 0; i < nk; i++) m = fabs(dx[i]) > m ? fabs(dx[i]) : m;
    cmp(dx2, dx, nk, 1e-7 * m, 1e-6, "  focal backward");
    if (mode == 2) {
        int zero = lg == 0.0f;
        for (size_t i = 0; i < nk; i++) zero &= dx2[i] == 0.0f;
        tap(zero, "  all ignored: loss 0 and every gradient exactly 0");
    }

    for (unsigned b = 0; b < G; b++) part[b] = NAN;
    ps_cpu_smoothl1_forward(&ctx, &lc, pred, tgt, lab, beta, norm, A);
    EMU(k_det_sl1_fwd, G, DET_THREADS, part, pred, tgt, lab, n4, beta);
    const float sg = (float)(det_sum(part, G) / norm);
    tap(fabs((double)sg - lc) <= 1e-6 * fabs(lc), "  smooth-L1 loss %.9g vs cpu %.9g", sg, lc);
    float *dp = nans(n4), *dp2 = nans(n4);
    ps_cpu_smoothl1_backward(&ctx, dp, pred, tgt, lab, 0.7f, beta, norm, A);
    EMU(k_det_sl1_bwd, 2, 32, dp2, pred, tgt, lab, n4, beta, (double)0.7f / norm);
    cmp(dp2, dp, n4, 0, 0, "  smooth-L1 backward (exact)");
    free(x), free(pred), free(tgt), free(lab), free(part), free(dx), free(dx2), free(dp);
    free(dp2);
}

static void det_bad_labels()
{
    const int A = 1003, K = 5;
    int32_t *lab = (int32_t *)malloc(A * sizeof(int32_t));
    for (int a = 0; a < A; a++) lab[a] = a % (K + 2) - 1;
    /* 3 blocks of 256: anchors 100 and 868 fall to the same thread, which
     * must keep the first */
    lab[868] = -3;
    lab[100] = K + 1;
    int bad, pos;
    det_labels(lab, A, K, 3, &bad, &pos);
    tap(bad == 100, "label scan (3 blocks, wrapping): first bad anchor %d (want 100)", bad);
    det_labels(lab, A, K, 7, &bad, &pos);
    tap(bad == 100 && pos == ps_cpu_count_pos(&ctx, lab, A),
        "label scan (7 blocks, 3 idle): first bad %d, positives %d", bad, pos);
    lab[100] = 0;
    lab[868] = 0;
    lab[0] = -2;
    det_labels(lab, A, K, 2, &bad, &pos);
    tap(bad == 0, "label scan: bad label at anchor 0 found (%d)", bad);
    free(lab);
}

static void det_permute()
{
    const int cfg[][4] = {{9, 5, 3, 7}, {9, 4, 1, 1}, {9, 80, 4, 4}, {3, 1, 5, 2}};
    for (const auto &c : cfg) {
        const int nA = c[0], D = c[1], H = c[2], W = c[3];
        const size_t n = (size_t)nA * D * H * W, HW = (size_t)H * W;
        float *x = rnd(n), *y = nans(n), *y2 = nans(n), *dx = nans(n), *dx2 = nans(n);
        ps_cpu_head_permute_forward(&ctx, y, x, nA, D, H, W);
        EMU(k_det_permute_fwd, 3, 32, y2, x, n, nA, D, HW);
        char tag[80];
        snprintf(tag, sizeof tag, "head permute nA%d D%d %dx%d", nA, D, H, W);
        cmp(y2, y, n, 0, 0, tag);
        ps_cpu_head_permute_backward(&ctx, dx, y, nA, D, H, W);
        EMU(k_det_permute_bwd, 2, 32, dx2, y2, n, nA, D, HW);
        cmp(dx2, dx, n, 0, 0, "  ... backward");
        cmp(dx2, x, n, 0, 0, "  ... backward(forward(x)) == x");
        free(x), free(y), free(y2), free(dx), free(dx2);
    }
}

static void detection()
{
    det_upsample();
    det_losses(1000, 7, 5.0f, 0, 3, "focal/smooth-L1 mixed labels");
    det_losses(4097, 3, 3.0f, 0, 5, "odd A");
    det_losses(777, 5, 2.0f, 1, 4, "no positives (normaliser 1)");
    det_losses(300, 4, 2.0f, 2, 2, "all ignored");
    det_losses(513, 1, 4.0f, 0, 3, "K = 1");
    det_losses(200, 6, 1e4f, 0, 2, "|logit| up to 1e4");
    det_losses(50, 3, 2.0f, 0, 9, "more blocks than elements");
    det_losses(2 * 9 * (16 * 16 + 8 * 8 + 4 * 4 + 2 * 2 + 1), 80, 6.0f, 0, 6,
               "RetinaNet 128 px, 2 images, 80 classes");
    det_bad_labels();
    det_permute();
}

// roi_align.cu against worker/engine/layers/roi_align.c: forward to the bit
// (the kernel spells out the CPU's float operations), backward (atomic
// scatter-adds in another order) to float rounding.  Boxes of every kind:
// inside, off the map, tiny, huge; fixed and adaptive sampling; aligned.
static void roi_align()
{
    const int N = 2, C = 3, H = 9, W = 11, PH = 4, PW = 3;
    const float rois[][5] = {{0, 3, 4, 20, 30},    {1, -10, -6, 12, 9},   {0, 30, 25, 70, 60},
                             {1, 5, 5, 5.3f, 5.2f}, {0, -200, -100, 300, 250}, {1, 40, 2, 43, 35},
                             {0, -50, -40, -45, -30}, {1, 12, 20, 8, 18}};
    const int R = (int)(sizeof rois / sizeof rois[0]);
    const size_t nf = (size_t)N * C * H * W, no = (size_t)R * C * PH * PW;
    float *f = rnd(nf), *dy = rnd(no);
    for (int sr = 0; sr <= 2; sr++)
        for (int al = 0; al <= 1; al++) {
            float *y = nans(no), *y2 = nans(no), *dx = (float *)calloc(nf, 4),
                  *dx2 = (float *)calloc(nf, 4);
            char what[64];
            ps_cpu_roi_align_forward(&ctx, y, f, &rois[0][0], R, N, C, H, W, PH, PW, 0.25f, sr,
                                     al);
            EMU(k_roi_align_fwd, 3, 32, y2, f, &rois[0][0], no, N, C, H, W, PH, PW, 0.25f, sr, al);
            snprintf(what, sizeof what, "roi_align forward (sampling %d, aligned %d)", sr, al);
            cmp(y2, y, no, 0, 0, what);
            ps_cpu_roi_align_backward(&ctx, dx, dy, &rois[0][0], R, N, C, H, W, PH, PW, 0.25f,
                                      sr, al);
            EMU(k_roi_align_bwd, 3, 32, dx2, dy, &rois[0][0], no, N, C, H, W, PH, PW, 0.25f, sr,
                al);
            snprintf(what, sizeof what, "roi_align backward (sampling %d, aligned %d)", sr, al);
            cmp(dx2, dx, nf, 1e-6, 1e-5, what);
            free(y), free(y2), free(dx), free(dx2);
        }
    free(f), free(dy);
}

// Mask R-CNN: deconv.cu and the mask loss of det_layers.cu against
// worker/engine/layers/deconv.c, mask_bce.c (the GEMM's sum order differs:
// float rounding; the loss's per-block double sums: 1e-6 relative)
static void mask_layers()
{
    ps_ctx_reserve(&ctx, 1 << 16);
    for (int s = 1; s <= 3; s++) {
        const int N = 2, C = 5, K = 3, H = 4, W = 3;
        const size_t ni = (size_t)N * C * H * W, no = (size_t)N * K * H * W * s * s;
        const size_t nw = (size_t)C * K * s * s;
        float *x = rnd(ni), *w = rnd(nw), *b = rnd(K), *dy = rnd(no);
        float *y = nans(no), *y2 = nans(no), *dx = nans(ni), *dx2 = nans(ni);
        float *dw = rnd(nw), *dw2 = cp(dw, nw), *db = rnd(K), *db2 = cp(db, K);
        char what[64];
        ps_cpu_deconv_forward(&ctx, y, x, w, b, N, C, K, H, W, s);
        EMU(k_deconv_fwd, 3, 32, y2, x, w, b, no, C, K, H, W, s);
        snprintf(what, sizeof what, "deconv forward (stride %d)", s);
        cmp(y2, y, no, 1e-6, 1e-5, what);
        ps_cpu_deconv_backward(&ctx, dx, dw, db, dy, x, w, N, C, K, H, W, s);
        EMU(k_deconv_bwd_data, 2, 32, dx2, dy, w, ni, C, K, H, W, s);
        EMU(k_deconv_bwd_w, 2, 16, dw2, dy, x, nw, N, C, K, H, W, s);
        EMU(k_deconv_bwd_b, 1, 2, db2, dy, (size_t)K, N, H * W * s * s);
        snprintf(what, sizeof what, "deconv input gradient (stride %d)", s);
        cmp(dx2, dx, ni, 1e-5, 1e-5, what);
        snprintf(what, sizeof what, "deconv weight gradient, accumulated (stride %d)", s);
        cmp(dw2, dw, nw, 1e-5, 1e-5, what);
        snprintf(what, sizeof what, "deconv bias gradient, accumulated (stride %d)", s);
        cmp(db2, db, K, 1e-5, 1e-5, what);
        free(x), free(w), free(b), free(dy), free(y), free(y2), free(dx), free(dx2), free(dw);
        free(dw2), free(db), free(db2);
    }
    const int R = 7, K = 4, MM = 49;
    const size_t n = (size_t)R * K * MM;
    float *x = rnd(n, 6.0f), *t = rnd((size_t)R * MM, 0.5f, 0.5f);
    x[3] = 90.0f, x[n - 1] = -90.0f;
    int32_t lab[R] = {0, 3, 1, 2, 3, 0, 1};
    const unsigned G = 3;
    double part[G];
    float lc = NAN;
    ps_cpu_mask_bce_forward(&ctx, &lc, x, lab, t, (float)(R * MM), R, K, MM);
    EMU(k_det_mask_bce_fwd, G, DET_THREADS, part, x, lab, t, (size_t)R * MM, K, MM);
    const float lg = (float)(det_sum(part, G) / (R * MM));
    tap(fabs((double)lg - lc) <= 1e-6 * fabs(lc) && isfinite(lg), "mask loss %.9g vs cpu %.9g",
        lg, lc);
    float *dx = nans(n), *dx2 = nans(n);
    ps_cpu_mask_bce_backward(&ctx, dx, x, lab, t, 0.8f, (float)(R * MM), R, K, MM);
    EMU(k_det_mask_bce_bwd, 3, 64, dx2, x, lab, t, n, K, MM, (double)0.8f / (R * MM));
    cmp(dx2, dx, n, 0, 0, "mask loss backward (exact)");
    float *y = cp(x, n);
    ps_cpu_scale(&ctx, x, 1.0f / 3.0f, n);
    EMU(k_scale, 2, 32, y, 1.0f / 3.0f, n);
    cmp(y, x, n, 0, 0, "scale by 1/3 (exact)");
    free(x), free(t), free(dx), free(dx2), free(y);
}

// ---- half storage (--precision fp16|bf16): the k_h_* kernels on half NHWC
// tensors against the CPU fp32 layers on the unrounded inputs.  Inputs are
// stored with an explicit host transpose (NCHW -> NHWC) and rounding;
// outputs are read back the same way, so a kernel that indexes NCHW (or
// mixes up C and HW) fails.  Tolerance tol * max|ref| + tol * |ref|, tol
// 1e-2 fp16 / 3e-2 bf16 (the GPU test's, derived there); max pool gets
// rounded inputs on both sides and must be exact, argmax included.
template <class T> static T *h_store(const float *x, int N, int C, int HW)
{
    const size_t n = (size_t)N * C * HW;
    T *h = (T *)malloc((n ? n : 1) * sizeof(T));
    memset(h, 0xff, n * sizeof(T)); // NaN in both formats
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < HW; p++)
                st(&h[((size_t)i * HW + p) * C + c], x[((size_t)i * C + c) * HW + p]);
    return h;
}
template <class T> static T *h_poison(size_t n)
{
    T *h = (T *)malloc((n ? n : 1) * sizeof(T));
    memset(h, 0xff, n * sizeof(T));
    return h;
}
template <class T> static float *h_load(const T *h, int N, int C, int HW)
{
    const size_t n = (size_t)N * C * HW;
    float *x = nans(n);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < HW; p++)
                x[((size_t)i * C + c) * HW + p] = ld(h[((size_t)i * HW + p) * C + c]);
    return x;
}
static double h_tol;
static double amax(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}
template <class T>
static void hcmp(const T *got, const float *want, int N, int C, int HW, const char *what,
                 double tol = -1)
{
    const size_t n = (size_t)N * C * HW;
    if (tol < 0) tol = h_tol;
    float *g = h_load(got, N, C, HW);
    cmp(g, want, n, tol * amax(want, n), tol, what);
    free(g);
}
static float h_round(float x, const __half *) { return __half2float(__float2half_rn(x)); }
static float h_round(float x, const __nv_bfloat16 *)
{
    return __bfloat162float(__float2bfloat16_rn(x));
}

template <class T> static void half_storage(const char *name, double tol)
{
    h_tol = tol;
    printf("# ---- %s storage (NHWC), tolerance %g\n", name, tol);
    char what[128];
#define W_(s) (snprintf(what, sizeof what, "%s %s", name, s), what)
    { // elementwise + dropout
        const int N = 3, C = 10, HW = 37;
        const size_t n = (size_t)N * C * HW;
        float *x = rnd(n), *b = rnd(n), *dy = rnd(n), *y = nans(n), *dx = nans(n), *s = nans(n);
        T *hx = h_store<T>(x, N, C, HW), *hb = h_store<T>(b, N, C, HW),
          *hdy = h_store<T>(dy, N, C, HW), *hy = h_poison<T>(n), *hs = h_poison<T>(n);
        ps_cpu_relu_forward(&ctx, y, x, n);
        EMU(k_h_relu_fwd<T>, 2, 32, hy, hx, n);
        hcmp(hy, y, N, C, HW, W_("relu forward"));
        ps_cpu_relu_backward(&ctx, dx, dy, y, n);
        EMU(k_h_relu_bwd<T>, 3, 32, hdy, hdy, hy, n);
        hcmp(hdy, dx, N, C, HW, W_("relu backward in place"));
        ps_cpu_add(&ctx, s, x, b, n);
        EMU(k_h_add<T>, 2, 16, hs, hx, hb, n);
        hcmp(hs, s, N, C, HW, W_("add"));
        ps_cpu_accumulate(&ctx, s, x, n);
        EMU(k_h_acc<T>, 2, 16, hs, hx, n);
        hcmp(hs, s, N, C, HW, W_("accumulate"));
        /* dropout on (N, F) features: the CPU's mask bit for bit */
        const int F = 333;
        const size_t m = (size_t)N * F;
        float *u = rnd(m), *o = nans(m), *g = rnd(m), *gi = nans(m);
        uint8_t *k = (uint8_t *)malloc(m), *k2 = (uint8_t *)malloc(m);
        T *hu = h_store<T>(u, N, F, 1), *ho = h_poison<T>(m), *hg = h_store<T>(g, N, F, 1),
          *hgi = h_poison<T>(m);
        ps_cpu_dropout_forward(&ctx, o, k, u, m, 0.3f, 77);
        EMU(k_h_dropout_fwd<T>, 4, 64, ho, k2, hu, m, 0.3f, 1.0f / 0.7f, (uint64_t)77);
        tap(!memcmp(k, k2, m), "%s dropout mask identical to the CPU's", name);
        hcmp(ho, o, N, F, 1, W_("dropout forward"));
        ps_cpu_dropout_backward(&ctx, gi, g, k, m, 0.3f);
        EMU(k_h_dropout_bwd<T>, 4, 64, hgi, hg, k2, m, 1.0f / 0.7f);
        hcmp(hgi, gi, N, F, 1, W_("dropout backward"));
        free(x), free(b), free(dy), free(y), free(dx), free(s), free(hx), free(hb), free(hdy);
        free(hy), free(hs), free(u), free(o), free(g), free(gi), free(k), free(k2), free(hu);
        free(ho), free(hg), free(hgi);
    }
    { // temporal shift on NHWC frames, consensus
        const int ts[][5] = {{2, 4, 16, 5, 8}, {1, 3, 7, 2, 8}, {3, 8, 64, 9, 8}};
        for (const auto &c : ts) {
            const int B = c[0], Tn = c[1], C = c[2], HW = c[3], fd = c[4];
            const size_t n = (size_t)B * Tn * C * HW, cols = (size_t)B * C * HW;
            float *x = rnd(n), *y = nans(n), *dx = nans(n);
            T *hx = h_store<T>(x, B * Tn, C, HW), *hy = h_poison<T>(n), *hdx = h_poison<T>(n);
            ps_cpu_tshift_forward(&ctx, y, x, B, Tn, C, HW, fd);
            EMU(k_h_tshift<T>, 2, 64, hy, hx, cols, Tn, C, HW, C / fd, +1);
            snprintf(what, sizeof what, "%s tshift B%d T%d C%d HW%d forward", name, B, Tn, C, HW);
            hcmp(hy, y, B * Tn, C, HW, what);
            ps_cpu_tshift_backward(&ctx, dx, x, B, Tn, C, HW, fd);
            EMU(k_h_tshift<T>, 2, 64, hdx, hx, cols, Tn, C, HW, C / fd, -1);
            hcmp(hdx, dx, B * Tn, C, HW, W_("  ... backward"));
            EMU(k_h_tshift<T>, 3, 32, hx, hx, cols, Tn, C, HW, C / fd, +1);
            hcmp(hx, y, B * Tn, C, HW, W_("  ... forward in place"));
            free(x), free(y), free(dx), free(hx), free(hy), free(hdx);
        }
        const int B = 3, Tn = 8, K = 10;
        const size_t ni = (size_t)B * Tn * K, no = (size_t)B * K;
        float *x = rnd(ni), *dy = rnd(no), *y = nans(no), *dx = nans(ni);
        T *hx = h_store<T>(x, B * Tn, K, 1), *hdy = h_store<T>(dy, B, K, 1), *hy = h_poison<T>(no),
          *hdx = h_poison<T>(ni);
        ps_cpu_consensus_forward(&ctx, y, x, B, Tn, K);
        EMU(k_h_consensus_fwd<T>, 2, 8, hy, hx, B, Tn, K, 1.0f / Tn);
        hcmp(hy, y, B, K, 1, W_("consensus forward"));
        ps_cpu_consensus_backward(&ctx, dx, dy, B, Tn, K);
        EMU(k_h_consensus_bwd<T>, 2, 8, hdx, hdy, Tn, K, ni, 1.0f / Tn);
        hcmp(hdx, dx, B * Tn, K, 1, W_("consensus backward"));
        free(x), free(dy), free(y), free(dx), free(hx), free(hdy), free(hy), free(hdx);
    }
    { // pooling
        const int cfgs[][7] = {{2, 4, 11, 11, 3, 2, 1}, {2, 3, 8, 8, 2, 2, 0}, {1, 2, 7, 9, 3, 1, 1}};
        for (const auto &c : cfgs) {
            const int N = c[0], C = c[1], H = c[2], W = c[3], R = c[4], st_ = c[5], pad = c[6];
            ps_pool_desc_t d = {R, R, st_, st_, pad, pad};
            const int P = ps_conv_out(H, R, st_, pad, 1), Q = ps_conv_out(W, R, st_, pad, 1);
            const size_t ni = (size_t)N * C * H * W, no = (size_t)N * C * P * Q;
            float *x = rnd(ni), *dy = rnd(no), *y = nans(no), *dx = nans(ni);
            for (size_t i = 0; i < ni; i++) x[i] = h_round(x[i], (const T *)NULL);
            for (size_t i = 0; i + 1 < ni; i += 7) x[i + 1] = x[i]; /* ties */
            for (size_t i = 0; i < no; i++) dy[i] = h_round(dy[i], (const T *)NULL);
            int32_t *am = (int32_t *)malloc(no * 4), *am2 = (int32_t *)malloc(no * 4);
            T *hx = h_store<T>(x, N, C, H * W), *hdy = h_store<T>(dy, N, C, P * Q),
              *hy = h_poison<T>(no), *hdx = h_poison<T>(ni);
            ps_cpu_maxpool_forward(&ctx, y, am, x, &d, N, C, H, W);
            EMU(k_h_maxpool_fwd<T>, 3, 32, hy, am2, hx, no, C, H, W, P, Q, R, R, st_, st_, pad, pad);
            snprintf(what, sizeof what, "%s maxpool N%d C%d %dx%d %d/%d forward (exact)", name, N,
                     C, H, W, R, st_);
            hcmp(hy, y, N, C, P * Q, what, 0);
            int same = 1;
            for (int i = 0; i < N; i++)
                for (int cc = 0; cc < C; cc++)
                    for (int p = 0; p < P * Q; p++)
                        same &= am2[((size_t)i * P * Q + p) * C + cc] ==
                                am[((size_t)i * C + cc) * P * Q + p];
            tap(same, "%s   ... argmax identical (NHWC order, ties included)", name);
            ps_cpu_maxpool_backward(&ctx, dx, dy, am, &d, N, C, H, W);
            EMU(k_h_maxpool_bwd<T>, 3, 32, hdx, hdy, am2, ni, C, H, W, P, Q, R, R, st_, st_, pad,
                pad);
            hcmp(hdx, dx, N, C, H * W, W_("  ... backward (gather)"));
            free(x), free(dy), free(y), free(dx), free(am), free(am2), free(hx), free(hdy);
            free(hy), free(hdx);
        }
        const int N = 2, C = 5, HW = 3137;
        const size_t n = (size_t)N * C * HW;
        float *x = rnd(n, 1, 0.5f), *dy = rnd(N * C), *y = nans(N * C), *dx = nans(n);
        T *hx = h_store<T>(x, N, C, HW), *hdy = h_store<T>(dy, N, C, 1), *hy = h_poison<T>(N * C),
          *hdx = h_poison<T>(n);
        ps_cpu_avgpool_forward(&ctx, y, x, N, C, HW);
        EMU(k_h_avgpool_fwd<T>, 1, 4, hy, hx, (size_t)N * C, C, HW, 1.0f / HW);
        hcmp(hy, y, N, C, 1, W_("avgpool forward"));
        ps_cpu_avgpool_backward(&ctx, dx, dy, N, C, HW);
        EMU(k_h_avgpool_bwd<T>, 2, 64, hdx, hdy, n, C, HW, 1.0f / HW);
        hcmp(hdx, dx, N, C, HW, W_("avgpool backward"));
        free(x), free(dy), free(y), free(dx), free(hx), free(hdy), free(hy), free(hdx);
    }
    { // batchnorm: half x / y / dy / dx, fp32 statistics and parameters
        // (C 40: two channel tiles of the coalesced reductions)
        const int cfg[][3] = {{4, 8, 25}, {3, 5, 1}, {2, 3, 700}, {2, 40, 9}};
        for (const auto &c : cfg) {
            const int N = c[0], C = c[1], HW = c[2];
            const size_t n = (size_t)N * C * HW, M = (size_t)N * HW;
            printf("# %s bn N%d C%d HW%d\n", name, N, C, HW);
            float *x = rnd(n, 1, 0.5f), *g = rnd(C, 0.5f, 1), *be = rnd(C), *rm = rnd(C),
                  *rv = rnd(C, 0.3f, 1);
            float *rm2 = cp(rm, C), *rv2 = cp(rv, C), *sm = nans(C), *sr = nans(C),
                  *sm2 = nans(C), *sr2 = nans(C), *y = nans(n), *ss = nans(2 * C);
            T *hx = h_store<T>(x, N, C, HW), *hy = h_poison<T>(n);
            ps_cpu_bn_forward_train(&ctx, y, sm, sr, rm, rv, x, g, be, 1e-5f, 0.1f, N, C, HW);
            EMU(k_h_bn_stats<T>, C, 256, ss, sm2, sr2, rm2, rv2, hx, g, be, 1e-5f, 0.1f, M, C);
            EMU(k_h_bn_apply<T>, 2, 64, hy, hx, ss, n, C);
            cmp(sm2, sm, C, tol * amax(sm, C), tol, W_("bn save_mean (fp32)"));
            cmp(sr2, sr, C, 0, tol, W_("bn save_rstd (fp32)"));
            cmp(rm2, rm, C, tol * amax(rm, C), tol, W_("bn running_mean (fp32)"));
            cmp(rv2, rv, C, 0, tol, W_("bn running_var (fp32, unbiased)"));
            hcmp(hy, y, N, C, HW, W_("bn train forward"));
            float *dy = rnd(n), *dg = rnd(C, 0.1f), *db = rnd(C, 0.1f), *dg2 = cp(dg, C),
                  *db2 = cp(db, C), *dx = nans(n), *coef = nans(5 * C);
            T *hdy = h_store<T>(dy, N, C, HW), *hdx = h_poison<T>(n);
            ps_cpu_bn_backward_train(&ctx, dx, dg, db, dy, x, g, sm, sr, N, C, HW);
            EMU(k_h_bn_bwd_sums<T>, C, 256, coef, dg2, db2, hdy, hx, g, sm2, sr2,
                (const float *)NULL, (const float *)NULL, 0.0f, M, C);
            EMU(k_h_bn_bwd_apply<T>, 2, 64, hdx, hdy, hx, coef, n, C, 1);
            cmp(dg2, dg, C, tol * amax(dg, C), tol, W_("bn train dgamma (fp32, accumulated)"));
            cmp(db2, db, C, tol * amax(db, C), tol, W_("bn train dbeta (fp32, accumulated)"));
            hcmp(hdx, dx, N, C, HW, W_("bn train dinp"));
            ps_cpu_bn_forward_eval(&ctx, y, x, g, be, rm, rv, 1e-5f, N, C, HW);
            EMU(k_bn_eval_coef, 2, 32, ss, g, be, rm2, rv2, 1e-5f, C); // 64 >= C
            EMU(k_h_bn_apply<T>, 2, 64, hy, hx, ss, n, C);
            hcmp(hy, y, N, C, HW, W_("bn eval forward"));
            ps_cpu_bn_backward_eval(&ctx, dx, NULL, NULL, dy, x, g, rm, rv, 1e-5f, N, C, HW);
            EMU(k_h_bn_bwd_sums<T>, C, 256, coef, (float *)NULL, (float *)NULL, hdy, hx, g,
                (const float *)NULL, (const float *)NULL, rm2, rv2, 1e-5f, M, C);
            EMU(k_h_bn_bwd_apply<T>, 2, 64, hdx, hdy, hx, coef, n, C, 0);
            hcmp(hdx, dx, N, C, HW, W_("bn frozen dinp"));
            { /* the coalesced reductions the launchers use (k_h_bn_part +
               * finish), a few pixel chunks so the partial sums matter: the
               * same statistics and coefficients as the one-block kernels */
                const int ct = (C + BNC_CH - 1) / BNC_CH;
                const size_t ch = M / 3 + 1;
                const int nch = (int)((M + ch - 1) / ch);
                double *part = (double *)malloc((size_t)nch * C * 2 * sizeof(double));
                float *rm3 = cp(rm, C), *rv3 = cp(rv, C), *sm3 = nans(C), *sr3 = nans(C),
                      *ss3 = nans(2 * C), *coef3 = nans(5 * C), *dg3 = cp(dg, C),
                      *db3 = cp(db, C);
                memcpy(rm3, rm2, C * 4), memcpy(rv3, rv2, C * 4);
                float *rm6 = cp(rm2, C), *rv6 = cp(rv2, C), *sm6 = nans(C), *sr6 = nans(C),
                      *ss6 = nans(2 * C);
                EMU(k_h_bn_stats<T>, C, 256, ss, sm2, sr2, rm2, rv2, hx, g, be, 1e-5f, 0.1f, M, C);
                EMU(k_h_bn_part<T>, ct * nch, 256, part, hx, hx, (const float *)NULL, M, C, ch, ct);
                EMU(k_bn_stats_fin, 1, 64, ss3, sm3, sr3, rm3, rv3, part, nch, g, be, 1e-5f,
                    0.1f, M, C);
                { /* the group's half path, one rank: from the same partials */
                    double *mom = (double *)malloc(2 * C * sizeof(double));
                    EMU(k_bn_part_moments, 1, 64, mom, (const double *)part, nch, M, C);
                    EMU(k_bn_fin_moments, 1, 64, ss6, sm6, sr6, rm6, rv6, (const double *)mom,
                        (double)M, g, be, 1e-5f, 0.1f, C);
                    cmp(sm6, sm3, C, 0, 0, W_("bn group kernels (half), one rank: save_mean"));
                    cmp(sr6, sr3, C, 0, 1e-6, W_("  ... save_rstd"));
                    cmp(rv6, rv3, C, 0, 1e-6, W_("  ... running_var"));
                    cmp(ss6, ss3, 2 * C, 1e-6 * amax(ss3, 2 * C), 1e-6, W_("  ... scale/shift"));
                    free(mom);
                }
                free(rm6), free(rv6), free(sm6), free(sr6), free(ss6);
                cmp(sm3, sm2, C, 1e-6 * amax(sm2, C), 1e-6, W_("coalesced bn: save_mean"));
                cmp(sr3, sr2, C, 0, 1e-5, W_("coalesced bn: save_rstd"));
                cmp(rv3, rv2, C, 0, 1e-5, W_("coalesced bn: running_var"));
                cmp(ss3, ss, 2 * C, 1e-5 * amax(ss, 2 * C), 1e-5, W_("coalesced bn: scale/shift"));
                for (int tr = 1; tr >= 0; tr--) { /* train, then frozen eval */
                    memcpy(dg2, dg, C * 4), memcpy(db2, db, C * 4);
                    memcpy(dg3, dg, C * 4), memcpy(db3, db, C * 4);
                    const float *smp = tr ? sm2 : NULL, *srp = tr ? sr2 : NULL;
                    const float *mean = tr ? sm2 : rm2;
                    EMU(k_h_bn_bwd_sums<T>, C, 256, coef, dg2, db2, hdy, hx, g, smp, srp, rm2, rv2,
                        1e-5f, M, C);
                    EMU(k_h_bn_part<T>, ct * nch, 256, part, hdy, hx, mean, M, C, ch, ct);
                    float *dg6 = cp(dg, C), *db6 = cp(db, C), *coef6 = nans(5 * C);
                    EMU(k_bn_bwd_fin, 1, 64, coef3, dg3, db3, part, nch, g, smp, srp, rm2, rv2,
                        1e-5f, M, C);
                    if (tr) { /* the group's half backward, one rank: bit for bit */
                        double *ab = (double *)malloc(2 * C * sizeof(double));
                        EMU(k_bn_part_sums, 1, 64, ab, dg6, db6, (const double *)part, nch, srp, C);
                        EMU(k_bn_bwd_coef, 1, 64, coef6, (const double *)ab, (double)M, g, smp, srp,
                            C);
                        cmp(coef6, coef3, 5 * C, 0, 0, W_("bn group backward (half), one rank: coefficients"));
                        cmp(dg6, dg3, C, 0, 0, W_("  ... dgamma"));
                        free(ab);
                    }
                    free(dg6), free(db6), free(coef6);
                    cmp(dg3, dg2, C, 1e-5 * amax(dg2, C), 1e-5,
                        tr ? W_("coalesced bn backward (train): dgamma")
                           : W_("coalesced bn backward (eval): dgamma"));
                    cmp(db3, db2, C, 1e-5 * amax(db2, C), 1e-5, W_("  ... dbeta"));
                    cmp(coef3, coef, 5 * C, 1e-5 * amax(coef, 5 * C), 1e-5, W_("  ... dx coefficients"));
                }
                free(part), free(rm3), free(rv3), free(sm3), free(sr3), free(ss3), free(coef3);
                free(dg3), free(db3);
            }
            /* conv bias pieces on half NHWC: gradient sums and the bias add */
            float *acc = rnd(C), *acc2 = cp(acc, C);
            for (int cc = 0; cc < C; cc++) {
                double sum = 0;
                for (int i = 0; i < N; i++)
                    for (int h = 0; h < HW; h++) sum += dy[((size_t)i * C + cc) * HW + h];
                acc[cc] += (float)sum;
            }
            EMU(k_h_chan_sum_acc<T>, C, 256, acc2, hdy, M, C);
            cmp(acc2, acc, C, tol * amax(acc, C), tol, W_("channel sums of half dout (conv db)"));
            float *yb = cp(x, n);
            for (size_t i = 0; i < n; i++) yb[i] += be[(i / HW) % C];
            EMU(k_h_bias_add<T>, 3, 32, hx, be, n, C);
            hcmp(hx, yb, N, C, HW, W_("conv bias add on half NHWC"));
            free(x), free(g), free(be), free(rm), free(rv), free(rm2), free(rv2), free(sm);
            free(sr), free(sm2), free(sr2), free(y), free(ss), free(hx), free(hy), free(dy);
            free(dg), free(db), free(dg2), free(db2), free(dx), free(coef), free(hdy), free(hdx);
            free(acc), free(acc2), free(yb);
        }
    }
#undef W_
}

int main()
{
    omp_set_dynamic(0);
    elementwise();
    pooling();
    pooling3d();
    shift_consensus_xent();
    batchnorm();
    biases();
    layouts();
    half_storage<__half>("fp16", 1e-2);
    half_storage<__nv_bfloat16>("bf16", 3e-2);
    detection();
    roi_align();
    mask_layers();
    printf("1..%d\n", nt);
    return nfail ? 1 : 0;
}
