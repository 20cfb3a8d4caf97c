/* gpu_bench's PS_GPU_PROFILE=1 mode: where a step's time goes, by layer
 * kind (bench/gpu_prof.h).  A backend table that wraps every CUDA entry:
 * the stream is drained before and after the call and the host clock read
 * (bench_now), so each call's GPU time plus its launch overhead (~10 us)
 * is summed per kind.  This serialises the step (no overlap of launches
 * with kernels), so the sum is a little above the unprofiled step; it is
 * for the split, not the total.  "outside the layers": the model's host
 * work (the input and label memcpy into managed memory, the loss read). */
#include "bench/gpu_prof.h"
#include "bench/bench_util.h"
#include "worker/engine/cuda/ps_cuda_backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum {
    PK_CONV_F, PK_CONV_B, PK_BN_F, PK_BN_B, PK_RELU_F, PK_RELU_B, PK_POOL_F, PK_POOL_B,
    PK_LIN_F, PK_LIN_B, PK_DROP, PK_XENT, PK_SHIFT, PK_CONS, PK_ADD, PK_ACC, PK_STEM_F,
    PK_STEM_B, PK_N
};
static const char *const pk_name[PK_N] = {
    "conv2d fwd", "conv2d bwd", "batchnorm fwd", "batchnorm bwd", "relu fwd", "relu bwd",
    "pool fwd", "pool bwd", "linear fwd", "linear bwd", "dropout", "softmax-xent",
    "temporal shift", "consensus", "add", "accumulate",
    /* half storage: a conv whose input is fp32 is the stem's (the host-
     * written model input: its cast and page migration are in here) */
    "conv1 fwd fp32-in", "conv1 bwd fp32-in"};
static double pk_t[PK_N];
static long pk_n[PK_N];
static ps_backend_t prof_be;

#define PROF(kind, call)                                                                    \
    do {                                                                                    \
        ps_cuda_backend_sync(ctx);                                                          \
        const double t0_ = bench_now();                                                     \
        call;                                                                               \
        ps_cuda_backend_sync(ctx);                                                          \
        pk_t[kind] += bench_now() - t0_;                                                    \
        pk_n[kind]++;                                                                       \
    } while (0)

static void p_conv_f(ps_ctx_t *ctx, float *out, const float *inp, const float *w, const float *b,
                     const ps_conv2d_desc_t *d, int N, int H, int W)
{
    const int k = ps_cuda_backend_half_storage(ctx) && !ps_cuda_is_half(ctx, inp) ? PK_STEM_F
                                                                                  : PK_CONV_F;
    PROF(k, ps_backend_cuda.conv2d_forward(ctx, out, inp, w, b, d, N, H, W));
}
static void p_conv_b(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                     const float *inp, const float *w, const ps_conv2d_desc_t *d, int N, int H,
                     int W)
{
    const int k = ps_cuda_backend_half_storage(ctx) && !ps_cuda_is_half(ctx, inp) ? PK_STEM_B
                                                                                  : PK_CONV_B;
    PROF(k, ps_backend_cuda.conv2d_backward(ctx, dinp, dw, db, dout, inp, w, d, N, H, W));
}
static void p_bn_ft(ps_ctx_t *ctx, float *out, float *sm, float *sr, float *rm, float *rv,
                    const float *inp, const float *g, const float *b, float eps, float mom,
                    int N, int C, int HW)
{
    PROF(PK_BN_F, ps_backend_cuda.bn_forward_train(ctx, out, sm, sr, rm, rv, inp, g, b, eps, mom,
                                                   N, C, HW));
}
static void p_bn_bt(ps_ctx_t *ctx, float *dinp, float *dg, float *db, const float *dout,
                    const float *inp, const float *g, const float *sm, const float *sr, int N,
                    int C, int HW)
{
    PROF(PK_BN_B, ps_backend_cuda.bn_backward_train(ctx, dinp, dg, db, dout, inp, g, sm, sr, N, C,
                                                    HW));
}
static void p_bn_fe(ps_ctx_t *ctx, float *out, const float *inp, const float *g, const float *b,
                    const float *rm, const float *rv, float eps, int N, int C, int HW)
{
    PROF(PK_BN_F, ps_backend_cuda.bn_forward_eval(ctx, out, inp, g, b, rm, rv, eps, N, C, HW));
}
static void p_bn_be(ps_ctx_t *ctx, float *dinp, float *dg, float *db, const float *dout,
                    const float *inp, const float *g, const float *rm, const float *rv,
                    float eps, int N, int C, int HW)
{
    PROF(PK_BN_B, ps_backend_cuda.bn_backward_eval(ctx, dinp, dg, db, dout, inp, g, rm, rv, eps,
                                                   N, C, HW));
}
static void p_relu_f(ps_ctx_t *ctx, float *out, const float *inp, size_t n)
{
    PROF(PK_RELU_F, ps_backend_cuda.relu_forward(ctx, out, inp, n));
}
static void p_relu_b(ps_ctx_t *ctx, float *dinp, const float *dout, const float *out, size_t n)
{
    PROF(PK_RELU_B, ps_backend_cuda.relu_backward(ctx, dinp, dout, out, n));
}
static void p_mp_f(ps_ctx_t *ctx, float *out, int32_t *am, const float *inp,
                   const ps_pool_desc_t *d, int N, int C, int H, int W)
{
    PROF(PK_POOL_F, ps_backend_cuda.maxpool_forward(ctx, out, am, inp, d, N, C, H, W));
}
static void p_mp_b(ps_ctx_t *ctx, float *dinp, const float *dout, const int32_t *am,
                   const ps_pool_desc_t *d, int N, int C, int H, int W)
{
    PROF(PK_POOL_B, ps_backend_cuda.maxpool_backward(ctx, dinp, dout, am, d, N, C, H, W));
}
static void p_ap_f(ps_ctx_t *ctx, float *out, const float *inp, int N, int C, int HW)
{
    PROF(PK_POOL_F, ps_backend_cuda.avgpool_forward(ctx, out, inp, N, C, HW));
}
static void p_ap_b(ps_ctx_t *ctx, float *dinp, const float *dout, int N, int C, int HW)
{
    PROF(PK_POOL_B, ps_backend_cuda.avgpool_backward(ctx, dinp, dout, N, C, HW));
}
static void p_lin_f(ps_ctx_t *ctx, float *out, const float *inp, const float *w, const float *b,
                    int N, int C, int K)
{
    PROF(PK_LIN_F, ps_backend_cuda.linear_forward(ctx, out, inp, w, b, N, C, K));
}
static void p_lin_b(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                    const float *inp, const float *w, int N, int C, int K)
{
    PROF(PK_LIN_B, ps_backend_cuda.linear_backward(ctx, dinp, dw, db, dout, inp, w, N, C, K));
}
static void p_drop_f(ps_ctx_t *ctx, float *out, uint8_t *mask, const float *inp, size_t n,
                     float p, uint64_t seed)
{
    PROF(PK_DROP, ps_backend_cuda.dropout_forward(ctx, out, mask, inp, n, p, seed));
}
static void p_drop_b(ps_ctx_t *ctx, float *dinp, const float *dout, const uint8_t *mask,
                     size_t n, float p)
{
    PROF(PK_DROP, ps_backend_cuda.dropout_backward(ctx, dinp, dout, mask, n, p));
}
static float p_xent_f(ps_ctx_t *ctx, float *probs, const float *logits, const int32_t *labels,
                      int N, int K)
{
    float r = NAN;
    PROF(PK_XENT, r = ps_backend_cuda.xent_forward(ctx, probs, logits, labels, N, K));
    return r;
}
static void p_xent_b(ps_ctx_t *ctx, float *dl, const float *probs, const int32_t *labels,
                     float dloss, int N, int K)
{
    PROF(PK_XENT, ps_backend_cuda.xent_backward(ctx, dl, probs, labels, dloss, N, K));
}
static void p_sh_f(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int C, int HW,
                   int fd)
{
    PROF(PK_SHIFT, ps_backend_cuda.tshift_forward(ctx, out, inp, B, T, C, HW, fd));
}
static void p_sh_b(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T, int C, int HW,
                   int fd)
{
    PROF(PK_SHIFT, ps_backend_cuda.tshift_backward(ctx, dinp, dout, B, T, C, HW, fd));
}
static void p_cons_f(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int K)
{
    PROF(PK_CONS, ps_backend_cuda.consensus_forward(ctx, out, inp, B, T, K));
}
static void p_cons_b(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T, int K)
{
    PROF(PK_CONS, ps_backend_cuda.consensus_backward(ctx, dinp, dout, B, T, K));
}
static void p_add(ps_ctx_t *ctx, float *out, const float *a, const float *b, size_t n)
{
    PROF(PK_ADD, ps_backend_cuda.add(ctx, out, a, b, n));
}
static void p_acc(ps_ctx_t *ctx, float *acc, const float *x, size_t n)
{
    PROF(PK_ACC, ps_backend_cuda.accumulate(ctx, acc, x, n));
}

/* The profiling table: ps_backend_cuda with every entry wrapped (the fused
 * entries stay as CUDA has them). */
const ps_backend_t *gpu_prof_backend(void)
{
    prof_be = ps_backend_cuda;
    prof_be.name = "cuda-profiled";
    prof_be.conv2d_forward = p_conv_f;
    prof_be.conv2d_backward = p_conv_b;
    prof_be.bn_forward_train = p_bn_ft;
    prof_be.bn_backward_train = p_bn_bt;
    prof_be.bn_forward_eval = p_bn_fe;
    prof_be.bn_backward_eval = p_bn_be;
    prof_be.relu_forward = p_relu_f;
    prof_be.relu_backward = p_relu_b;
    prof_be.maxpool_forward = p_mp_f;
    prof_be.maxpool_backward = p_mp_b;
    prof_be.avgpool_forward = p_ap_f;
    prof_be.avgpool_backward = p_ap_b;
    prof_be.linear_forward = p_lin_f;
    prof_be.linear_backward = p_lin_b;
    prof_be.dropout_forward = p_drop_f;
    prof_be.dropout_backward = p_drop_b;
    prof_be.xent_forward = p_xent_f;
    prof_be.xent_backward = p_xent_b;
    prof_be.tshift_forward = p_sh_f;
    prof_be.tshift_backward = p_sh_b;
    prof_be.consensus_forward = p_cons_f;
    prof_be.consensus_backward = p_cons_b;
    prof_be.add = p_add;
    prof_be.accumulate = p_acc;
    gpu_prof_reset();
    return &prof_be;
}

void gpu_prof_reset(void)
{
    memset(pk_t, 0, sizeof pk_t);
    memset(pk_n, 0, sizeof pk_n);
}

/* The table of the profiled steps, per step; step_s: the profiled steps'
 * median (for the "rest": the model's own host work, page migration). */
void gpu_prof_print(int steps, double step_s)
{
    double tot = 0;
    for (int k = 0; k < PK_N; k++) tot += pk_t[k];
    printf("PROFILE per step (%d steps; each call drained and host-timed: GPU time + launch):\n",
           steps);
    printf("  %-18s %7s %10s %7s\n", "layer kind", "calls", "ms", "%");
    for (int k = 0; k < PK_N; k++)
        if (pk_n[k])
            printf("  %-18s %7.0f %10.2f %6.1f%%\n", pk_name[k], (double)pk_n[k] / steps,
                   pk_t[k] / steps * 1e3, 100.0 * pk_t[k] / (step_s * steps));
    printf("  %-18s %7s %10.2f %6.1f%%\n", "layers total", "", tot / steps * 1e3,
           100.0 * tot / (step_s * steps));
    printf("  %-18s %7s %10.2f %6.1f%%\n", "outside the layers", "",
           (step_s - tot / steps) * 1e3, 100.0 - 100.0 * tot / (step_s * steps));
    printf("  %-18s %7s %10.2f\n", "profiled step", "", step_s * 1e3);
}

