// batchnorm2d on the GPU with own kernels (why not cuDNN's: top of
// backend_cuda.cu).  Same semantics as layers/batchnorm.c: biased variance
// to normalise, unbiased for the running update, NULL gamma/beta = affine
// off, parameter gradients accumulated, dinp overwritten (NULL allowed).
//
// One block per channel reduces the channel's N*HW values (double
// accumulators, like the CPU's double across planes); a second grid-wide
// kernel applies the per-channel affine map.  Simple rather than fastest:
// a channel-split reduction (or cuDNN graph BN) is the later speed-up for
// the deep layers, where C is large and N*HW small this is already fine.
#include "cuda_int.h"

#define BN_THREADS 256

// Sum over the block of a double (all threads get the result).
__device__ double block_sum(double v)
{
    __shared__ double part[BN_THREADS / 32];
    __syncthreads(); // part[] may still be read by a previous call
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < BN_THREADS / 32; i++) t += part[i];
    return t;
}

// element j of channel c over (n, i): address (n*C + c)*HW + i
__device__ __forceinline__ size_t chan_at(size_t j, int c, int C, int HW)
{
    return ((j / HW) * C + c) * (size_t)HW + j % HW;
}

__global__ void __launch_bounds__(BN_THREADS)
k_bn_stats(float *scale_shift, float *save_mean, float *save_rstd, float *run_mean,
           float *run_var, const float *x, const float *gamma, const float *beta, float eps,
           float momentum, int N, int C, int HW)
{
    const int c = blockIdx.x;
    const size_t M = (size_t)N * HW;
    double s = 0;
    for (size_t j = threadIdx.x; j < M; j += BN_THREADS) s += x[chan_at(j, c, C, HW)];
    const double mean = block_sum(s) / (double)M;
    const float meanf = (float)mean;
    double v = 0;
    for (size_t j = threadIdx.x; j < M; j += BN_THREADS) {
        const float d = x[chan_at(j, c, C, HW)] - meanf;
        v += (double)(d * d);
    }
    v = block_sum(v);
    if (threadIdx.x == 0) {
        const double var = v / (double)M;
        const float rstd = (float)(1.0 / sqrt(var + eps));
        if (save_mean) save_mean[c] = (float)mean;
        if (save_rstd) save_rstd[c] = rstd;
        if (run_mean) run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * (float)mean;
        if (run_var) {
            const double uvar = M > 1 ? v / (double)(M - 1) : var;
            run_var[c] = (1.0f - momentum) * run_var[c] + momentum * (float)uvar;
        }
        const float sc = (gamma ? gamma[c] : 1.0f) * rstd;
        scale_shift[c] = sc;
        scale_shift[C + c] = (beta ? beta[c] : 0.0f) - (float)mean * sc;
    }
}

// Eval: scale/shift from the running statistics.
__global__ void k_bn_eval_coef(float *scale_shift, const float *gamma, const float *beta,
                               const float *run_mean, const float *run_var, float eps, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float rstd = 1.0f / sqrtf(run_var[c] + eps);
    const float sc = (gamma ? gamma[c] : 1.0f) * rstd;
    scale_shift[c] = sc;
    scale_shift[C + c] = (beta ? beta[c] : 0.0f) - run_mean[c] * sc;
}

__global__ void k_bn_apply(float *y, const float *x, const float *scale_shift, size_t n, int C,
                           int HW)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)((i / HW) % C);
        y[i] = x[i] * scale_shift[c] + scale_shift[C + c];
    }
}

// Backward sums per channel: sdy = sum(dy), sdyx = rstd * sum(dy*(x-mean)).
// mean/rstd from save_* (train) or from the running stats (eval: save_mean
// NULL).  Writes the coefficients of dx = k*(dy - mdy - (x-mean)*rstd*mdyx)
// as coef[5c..5c+4] = {k, mdy, mdyx, mean, rstd}; mdy = mdyx = 0 in eval.
__global__ void __launch_bounds__(BN_THREADS)
k_bn_bwd_sums(float *coef, float *dgamma, float *dbeta, const float *dy, const float *x,
              const float *gamma, const float *save_mean, const float *save_rstd,
              const float *run_mean, const float *run_var, float eps, int N, int C, int HW)
{
    const int c = blockIdx.x;
    const int train = save_mean != NULL;
    const float mean = train ? save_mean[c] : run_mean[c];
    const float rstd = train ? save_rstd[c] : 1.0f / sqrtf(run_var[c] + eps);
    const size_t M = (size_t)N * HW;
    double a = 0, b = 0;
    if (train || dgamma || dbeta)
        for (size_t j = threadIdx.x; j < M; j += BN_THREADS) {
            const size_t at = chan_at(j, c, C, HW);
            const float g = dy[at];
            a += g;
            b += (double)(g * (x[at] - mean));
        }
    a = block_sum(a);
    b = block_sum(b) * rstd;
    if (threadIdx.x == 0) {
        if (dbeta) dbeta[c] += (float)a;
        if (dgamma) dgamma[c] += (float)b;
        float *k = coef + 5 * (size_t)c;
        k[0] = (gamma ? gamma[c] : 1.0f) * rstd;
        k[1] = train ? (float)(a / (double)M) : 0.0f;
        k[2] = train ? (float)(b / (double)M) : 0.0f;
        k[3] = mean;
        k[4] = rstd;
    }
}

__global__ void k_bn_bwd_apply(float *dx, const float *dy, const float *x, const float *coef,
                               size_t n, int C, int HW, int train)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float *k = coef + 5 * ((i / HW) % C);
        dx[i] = train ? k[0] * (dy[i] - k[1] - (x[i] - k[3]) * k[4] * k[2]) : k[0] * dy[i];
    }
}

__global__ void __launch_bounds__(BN_THREADS)
k_chan_sum_acc(float *acc, const float *x, int N, int C, int HW)
{
    const int c = blockIdx.x;
    const size_t M = (size_t)N * HW;
    double s = 0;
    for (size_t j = threadIdx.x; j < M; j += BN_THREADS) s += x[chan_at(j, c, C, HW)];
    s = block_sum(s);
    if (threadIdx.x == 0) acc[c] += (float)s;
}

static int bn_valid(const char *what, int N, int C, int HW)
{
    if (N <= 0 || C <= 0 || HW <= 0) {
        ps_error("%s (cuda): invalid shape N=%d C=%d HW=%d", what, N, C, HW);
        return 0;
    }
    return 1;
}

void ps_cu_channel_sum_acc(ps_cu_state *s, float *acc, const float *x, int N, int C, int HW)
{
    k_chan_sum_acc<<<C, BN_THREADS, 0, s->stream>>>(acc, x, N, C, HW);
    CU_LAUNCHED();
}

void ps_cu_bn_forward_train(ps_ctx_t *ctx, float *out, float *save_mean, float *save_rstd,
                            float *run_mean, float *run_var, const float *inp,
                            const float *gamma, const float *beta, float eps, float momentum,
                            int N, int C, int HW)
{
    ps_cu_state *s = cu_state(ctx);
    if (!bn_valid("bn_forward_train", N, C, HW)) return;
    float *ss = (float *)ps_cu_scratch(s, 2 * (size_t)C * sizeof(float));
    k_bn_stats<<<C, BN_THREADS, 0, s->stream>>>(ss, save_mean, save_rstd, run_mean, run_var,
                                                 inp, gamma, beta, eps, momentum, N, C, HW);
    CU_LAUNCHED();
    const size_t n = (size_t)N * C * HW;
    k_bn_apply<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, inp, ss, n, C, HW);
    CU_LAUNCHED();
}

void ps_cu_bn_forward_eval(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                           const float *beta, const float *run_mean, const float *run_var,
                           float eps, int N, int C, int HW)
{
    ps_cu_state *s = cu_state(ctx);
    if (!bn_valid("bn_forward_eval", N, C, HW)) return;
    float *ss = (float *)ps_cu_scratch(s, 2 * (size_t)C * sizeof(float));
    k_bn_eval_coef<<<(C + 255) / 256, 256, 0, s->stream>>>(ss, gamma, beta, run_mean, run_var,
                                                           eps, C);
    CU_LAUNCHED();
    const size_t n = (size_t)N * C * HW;
    k_bn_apply<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, inp, ss, n, C, HW);
    CU_LAUNCHED();
}

static void bn_backward(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                        const float *dout, const float *inp, const float *gamma,
                        const float *save_mean, const float *save_rstd, const float *run_mean,
                        const float *run_var, float eps, int N, int C, int HW)
{
    ps_cu_state *s = cu_state(ctx);
    const int train = save_mean != NULL;
    if (!train && !dgamma && !dbeta && !dinp) return;
    float *coef = (float *)ps_cu_scratch(s, 5 * (size_t)C * sizeof(float));
    k_bn_bwd_sums<<<C, BN_THREADS, 0, s->stream>>>(coef, dgamma, dbeta, dout, inp, gamma,
                                                    save_mean, save_rstd, run_mean, run_var,
                                                    eps, N, C, HW);
    CU_LAUNCHED();
    if (!dinp) return;
    const size_t n = (size_t)N * C * HW;
    k_bn_bwd_apply<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(dinp, dout, inp, coef, n,
                                                                     C, HW, train);
    CU_LAUNCHED();
}

void ps_cu_bn_backward_train(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                             const float *dout, const float *inp, const float *gamma,
                             const float *save_mean, const float *save_rstd, int N, int C,
                             int HW)
{
    if (!bn_valid("bn_backward_train", N, C, HW)) return;
    if (!save_mean || !save_rstd) {
        ps_error("bn_backward_train (cuda): save_mean/save_rstd are required");
        return;
    }
    bn_backward(ctx, dinp, dgamma, dbeta, dout, inp, gamma, save_mean, save_rstd, NULL, NULL,
                0.0f, N, C, HW);
}

void ps_cu_bn_backward_eval(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                            const float *dout, const float *inp, const float *gamma,
                            const float *run_mean, const float *run_var, float eps, int N,
                            int C, int HW)
{
    if (!bn_valid("bn_backward_eval", N, C, HW)) return;
    bn_backward(ctx, dinp, dgamma, dbeta, dout, inp, gamma, NULL, NULL, run_mean, run_var, eps,
                N, C, HW);
}
