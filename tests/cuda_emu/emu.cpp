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
        ps_cpu_bn_forward_train(&ctx, y, sm, sr, rm, rv, x, g, be, 1e-5f, 0.1f, N, C, HW);
        EMU(k_bn_stats, C, 256, ss, sm2, sr2, rm2, rv2, x, g, be, 1e-5f, 0.1f, N, C, HW);
        EMU(k_bn_apply, 2, 64, y2, x, ss, n, C, HW);
        printf("# %s\n", tag);
        cmp(sm2, sm, C, 1e-6, 1e-6, "bn save_mean");
        cmp(sr2, sr, C, 0, 1e-5, "bn save_rstd");
        cmp(rm2, rm, C, 1e-6, 1e-6, "bn running_mean");
        cmp(rv2, rv, C, 0, 1e-5, "bn running_var (unbiased)");
        cmp(y2, y, n, 1e-5, 1e-5, "bn train forward");
        float *dy = rnd(n), *dg = rnd(C, 0.1f), *db = rnd(C, 0.1f), *dg2 = cp(dg, C),
              *db2 = cp(db, C), *dx = nans(n), *dx2 = nans(n), *coef = nans(5 * C);
        ps_cpu_bn_backward_train(&ctx, dx, dg, db, dy, x, g, sm, sr, N, C, HW);
        EMU(k_bn_bwd_sums, C, 256, coef, dg2, db2, dy, x, g, sm, sr, (const float *)NULL,
            (const float *)NULL, 0.0f, N, C, HW);
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

int main()
{
    omp_set_dynamic(0);
    elementwise();
    pooling();
    shift_consensus_xent();
    batchnorm();
    biases();
    layouts();
    printf("1..%d\n", nt);
    return nfail ? 1 : 0;
}
