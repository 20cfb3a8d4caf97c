// batchnorm2d on the GPU with own kernels (why not cuDNN's: top of
// backend_cuda.cu).  Cross-worker BN (ctx->bn_group, --bn sync): the
// per-channel moments / backward sums go to the host after their kernel,
// through the group (worker/engine/bn_group.c, the same code as the CPU's)
// and back before the kernels that use them; a stream sync per BN layer and
// direction, the price of a host-side collective.  Same semantics as layers/batchnorm.c: biased variance
// to normalise, unbiased for the running update, NULL gamma/beta = affine
// off, parameter gradients accumulated, dinp overwritten (NULL allowed).
//
// One block per channel reduces the channel's N*HW values (double
// accumulators, like the CPU's double across planes); a second grid-wide
// kernel applies the per-channel affine map.  Simple rather than fastest:
// a channel-split reduction (or cuDNN graph BN) is the later speed-up for
// the deep layers, where C is large and N*HW small this is already fine.
#include "cuda_int.h"
#include "half.cuh"

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

// The end of a training forward's statistics for channel c, from the
// batch's count M, mean and M2 (sum of squared deviations): the saved
// statistics, the running update (unbiased variance) and the coefficients
// y = x*scale + shift.  bn_saved_coef recomputes the coefficients from the
// saved values with the same expressions, bit for bit.
__device__ void bn_epilogue(float *scale_shift, float *save_mean, float *save_rstd,
                            float *run_mean, float *run_var, const float *gamma,
                            const float *beta, float eps, float momentum, int C, int c,
                            double M, double mean, double m2)
{
    const double var = m2 / M;
    const float rstd = (float)(1.0 / sqrt(var + eps));
    if (save_mean) save_mean[c] = (float)mean;
    if (save_rstd) save_rstd[c] = rstd;
    if (run_mean) run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * (float)mean;
    if (run_var) {
        const double uvar = M > 1 ? m2 / (M - 1) : var;
        run_var[c] = (1.0f - momentum) * run_var[c] + momentum * (float)uvar;
    }
    const float sc = (gamma ? gamma[c] : 1.0f) * rstd;
    scale_shift[c] = sc;
    scale_shift[C + c] = (beta ? beta[c] : 0.0f) - (float)mean * sc;
}

// element j of channel c over (n, i): address (n*C + c)*HW + i
__device__ __forceinline__ size_t chan_at(size_t j, int c, int C, int HW)
{
    return ((j / HW) * C + c) * (size_t)HW + j % HW;
}

// Channel blockIdx.x's mean and M2 (squared deviations from the mean
// rounded to float), by the whole block in two passes; every thread gets
// them.
__device__ void chan_moments(const float *x, int N, int C, int HW, double *mean, double *m2)
{
    const int c = blockIdx.x;
    const size_t M = (size_t)N * HW;
    double s = 0;
    for (size_t j = threadIdx.x; j < M; j += BN_THREADS) s += x[chan_at(j, c, C, HW)];
    *mean = block_sum(s) / (double)M;
    const float meanf = (float)*mean;
    double v = 0;
    for (size_t j = threadIdx.x; j < M; j += BN_THREADS) {
        const float d = x[chan_at(j, c, C, HW)] - meanf;
        v += (double)(d * d);
    }
    *m2 = block_sum(v);
}

// Channel blockIdx.x's backward sums over its first M elements (M = 0:
// none): *a = sum dy, *b = rstd * sum dy*(x-mean), every thread gets them;
// thread 0 adds them to dbeta / dgamma (each may be NULL).
__device__ void chan_dy_sums(const float *dy, const float *x, float mean, float rstd, int C,
                             int HW, size_t M, float *dgamma, float *dbeta, double *a, double *b)
{
    const int c = blockIdx.x;
    double sa = 0, sb = 0;
    for (size_t j = threadIdx.x; j < M; j += BN_THREADS) {
        const size_t at = chan_at(j, c, C, HW);
        const float g = dy[at];
        sa += g;
        sb += (double)(g * (x[at] - mean));
    }
    *a = block_sum(sa);
    *b = block_sum(sb) * rstd;
    if (threadIdx.x == 0) {
        if (dbeta) dbeta[c] += (float)*a;
        if (dgamma) dgamma[c] += (float)*b;
    }
}

__global__ void __launch_bounds__(BN_THREADS)
k_bn_stats(float *scale_shift, float *save_mean, float *save_rstd, float *run_mean,
           float *run_var, const float *x, const float *gamma, const float *beta, float eps,
           float momentum, int N, int C, int HW)
{
    double mean, v;
    chan_moments(x, N, C, HW, &mean, &v);
    if (threadIdx.x == 0)
        bn_epilogue(scale_shift, save_mean, save_rstd, run_mean, run_var, gamma, beta, eps,
                    momentum, C, blockIdx.x, (double)N * HW, mean, v);
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
    double a, b;
    chan_dy_sums(dy, x, mean, rstd, C, HW, train || dgamma || dbeta ? M : 0, dgamma, dbeta, &a,
                 &b);
    if (threadIdx.x == 0) {
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

// ---- half storage twins (half.cuh): x, y, dy, dx half NHWC, element j of
// channel c at j*C + c (j over the N*HW pixels: M = N*HW); statistics,
// scale/shift, gamma/beta and their gradients fp32 with the same double
// accumulators as above.

template <class T>
__global__ void __launch_bounds__(BN_THREADS)
k_h_bn_stats(float *scale_shift, float *save_mean, float *save_rstd, float *run_mean,
             float *run_var, const void *x_, const float *gamma, const float *beta, float eps,
             float momentum, size_t M, int C)
{
    const T *x = (const T *)x_;
    const int c = blockIdx.x;
    double s = 0;
    for (size_t j = threadIdx.x; j < M; j += BN_THREADS) s += ld(x[j * C + c]);
    const double mean = block_sum(s) / (double)M;
    const float meanf = (float)mean;
    double v = 0;
    for (size_t j = threadIdx.x; j < M; j += BN_THREADS) {
        const float d = ld(x[j * C + c]) - meanf;
        v += (double)(d * d);
    }
    v = block_sum(v);
    if (threadIdx.x == 0)
        bn_epilogue(scale_shift, save_mean, save_rstd, run_mean, run_var, gamma, beta, eps,
                    momentum, C, c, (double)M, mean, v);
}

template <class T>
__global__ void k_h_bn_apply(void *y_, const void *x_, const float *scale_shift, size_t n,
                             int C)
{
    T *y = (T *)y_;
    const T *x = (const T *)x_;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        st(&y[i], ld(x[i]) * scale_shift[c] + scale_shift[C + c]);
    }
}

template <class T>
__global__ void __launch_bounds__(BN_THREADS)
k_h_bn_bwd_sums(float *coef, float *dgamma, float *dbeta, const void *dy_, const void *x_,
                const float *gamma, const float *save_mean, const float *save_rstd,
                const float *run_mean, const float *run_var, float eps, size_t M, int C)
{
    const T *dy = (const T *)dy_, *x = (const T *)x_;
    const int c = blockIdx.x;
    const int train = save_mean != NULL;
    const float mean = train ? save_mean[c] : run_mean[c];
    const float rstd = train ? save_rstd[c] : 1.0f / sqrtf(run_var[c] + eps);
    double a = 0, b = 0;
    if (train || dgamma || dbeta)
        for (size_t j = threadIdx.x; j < M; j += BN_THREADS) {
            const size_t at = j * C + c;
            const float g = ld(dy[at]);
            a += g;
            b += (double)(g * (ld(x[at]) - mean));
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

template <class T>
__global__ void k_h_bn_bwd_apply(void *dx_, const void *dy_, const void *x_, const float *coef,
                                 size_t n, int C, int train)
{
    T *dx = (T *)dx_;
    const T *dy = (const T *)dy_, *x = (const T *)x_;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float *k = coef + 5 * (i % C);
        const float g = ld(dy[i]);
        st(&dx[i], train ? k[0] * (g - k[1] - (ld(x[i]) - k[3]) * k[4] * k[2]) : k[0] * g);
    }
}

// ---- coalesced NHWC channel reductions (the half path's statistics) ----
// One block per channel (above) reads its channel with a stride of C
// elements -- uncoalesced in NHWC -- and has only C blocks (64 at ResNet's
// first stage, fewer than the SMs).  Here a block is BNC_CH channels x
// (BN_THREADS / BNC_CH) pixel rows: a warp reads BNC_CH consecutive
// channels of one pixel (one contiguous run), and the grid is ctiles x
// nch blocks, flattened (block b: channel tile b % ctiles, pixel chunk
// b / ctiles).  Each block writes per-channel double partials part[(k*C +
// c)*2 + {0,1}]; a one-thread-per-channel kernel sums the nch partials in
// a fixed order (deterministic) and finishes.
//   forward (mean NULL): a = sum x, b = sum x^2 (double: var = b/M - mean^2
//     loses nothing for half inputs, whose squares are exact in double);
//   backward: a = sum dy, b = sum dy*(x - mean) (as the one-block kernels).
#define BNC_CH 32
template <class T>
__global__ void __launch_bounds__(BN_THREADS)
k_h_bn_part(double *part, const void *u_, const void *x_, const float *mean, size_t M, int C,
            size_t chunk, int ctiles)
{
    const T *u = (const T *)u_, *x = (const T *)x_;
    const int lane = threadIdx.x % BNC_CH, row = threadIdx.x / BNC_CH;
    const int c = (blockIdx.x % ctiles) * BNC_CH + lane;
    const size_t k = blockIdx.x / ctiles, j0 = k * chunk;
    const size_t j1 = j0 + chunk < M ? j0 + chunk : M;
    double a = 0, b = 0;
    if (c < C) {
        const float m = mean ? mean[c] : 0.0f;
        for (size_t j = j0 + row; j < j1; j += BN_THREADS / BNC_CH) {
            const float g = ld(u[j * C + c]);
            a += g;
            if (mean)
                b += (double)(g * (ld(x[j * C + c]) - m));
            else
                b += (double)g * g;
        }
    }
    __shared__ double sa[BN_THREADS], sb[BN_THREADS];
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    if (row == 0 && c < C) {
        for (int r = 1; r < BN_THREADS / BNC_CH; r++) {
            a += sa[r * BNC_CH + lane];
            b += sb[r * BNC_CH + lane];
        }
        part[(k * C + c) * 2] = a;
        part[(k * C + c) * 2 + 1] = b;
    }
}

// Channel c's mean and biased variance (clamped at 0) from k_h_bn_part's
// nch partials (sum, sum of squares) of M elements
__device__ void part_mean_var(const double *part, int nch, size_t M, int C, int c,
                              double *mean, double *var)
{
    double s = 0, q = 0;
    for (int k = 0; k < nch; k++) {
        s += part[((size_t)k * C + c) * 2];
        q += part[((size_t)k * C + c) * 2 + 1];
    }
    *mean = s / (double)M;
    const double v = q / (double)M - *mean * *mean;
    *var = v > 0 ? v : 0;
}

// Forward finish: the statistics of k_h_bn_stats from the partials.
__global__ void k_bn_stats_fin(float *scale_shift, float *save_mean, float *save_rstd,
                               float *run_mean, float *run_var, const double *part, int nch,
                               const float *gamma, const float *beta, float eps, float momentum,
                               size_t M, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double mean, var;
    part_mean_var(part, nch, M, C, c, &mean, &var);
    const float rstd = (float)(1.0 / sqrt(var + eps));
    if (save_mean) save_mean[c] = (float)mean;
    if (save_rstd) save_rstd[c] = rstd;
    if (run_mean) run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * (float)mean;
    if (run_var) {
        const double uvar = M > 1 ? var * (double)M / (double)(M - 1) : var;
        run_var[c] = (1.0f - momentum) * run_var[c] + momentum * (float)uvar;
    }
    const float sc = (gamma ? gamma[c] : 1.0f) * rstd;
    scale_shift[c] = sc;
    scale_shift[C + c] = (beta ? beta[c] : 0.0f) - (float)mean * sc;
}

// ---- cross-worker BN (ctx->bn_group): this rank's moments out, the
// group's back in (bn_group.c combines them on the host), then the same
// epilogue.  mom: mean[0..C) then M2[0..C), double.

// fp32: one block per channel, the two passes of k_bn_stats
__global__ void __launch_bounds__(BN_THREADS)
k_bn_moments(double *mom, const float *x, int N, int C, int HW)
{
    double mean, v;
    chan_moments(x, N, C, HW, &mean, &v);
    if (threadIdx.x == 0) {
        mom[blockIdx.x] = mean;
        mom[C + blockIdx.x] = v;
    }
}

// half: from k_h_bn_part's partials (sum, sum of squares), as k_bn_stats_fin
__global__ void k_bn_part_moments(double *mom, const double *part, int nch, size_t M, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double mean, var;
    part_mean_var(part, nch, M, C, c, &mean, &var);
    mom[c] = mean;
    mom[C + c] = var * (double)M;
}

__global__ void k_bn_fin_moments(float *scale_shift, float *save_mean, float *save_rstd,
                                 float *run_mean, float *run_var, const double *mom, double M,
                                 const float *gamma, const float *beta, float eps,
                                 float momentum, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    bn_epilogue(scale_shift, save_mean, save_rstd, run_mean, run_var, gamma, beta, eps,
                momentum, C, c, M, mom[c], mom[C + c]);
}

// Recomputation (bn_forward_saved): bn_epilogue's coefficients from the
// values it saved
__global__ void k_bn_saved_coef(float *scale_shift, const float *gamma, const float *beta,
                                const float *save_mean, const float *save_rstd, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float sc = (gamma ? gamma[c] : 1.0f) * save_rstd[c];
    scale_shift[c] = sc;
    scale_shift[C + c] = (beta ? beta[c] : 0.0f) - save_mean[c] * sc;
}

// Backward: this rank's sums ab[2c] = sum dy, ab[2c+1] = sum dy*xhat (its
// own dgamma / dbeta added), fp32 one block per channel ...
__global__ void __launch_bounds__(BN_THREADS)
k_bn_bwd_local(double *ab, float *dgamma, float *dbeta, const float *dy, const float *x,
               const float *save_mean, const float *save_rstd, int N, int C, int HW)
{
    const int c = blockIdx.x;
    const float mean = save_mean[c], rstd = save_rstd[c];
    double a, b;
    chan_dy_sums(dy, x, mean, rstd, C, HW, (size_t)N * HW, dgamma, dbeta, &a, &b);
    if (threadIdx.x == 0) {
        ab[2 * (size_t)c] = a;
        ab[2 * (size_t)c + 1] = b;
    }
}

// ... or from k_h_bn_part's partials (half)
__global__ void k_bn_part_sums(double *ab, float *dgamma, float *dbeta, const double *part,
                               int nch, const float *save_rstd, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double a = 0, b = 0;
    for (int k = 0; k < nch; k++) {
        a += part[((size_t)k * C + c) * 2];
        b += part[((size_t)k * C + c) * 2 + 1];
    }
    b *= save_rstd[c];
    if (dbeta) dbeta[c] += (float)a;
    if (dgamma) dgamma[c] += (float)b;
    ab[2 * (size_t)c] = a;
    ab[2 * (size_t)c + 1] = b;
}

// dx's coefficients (k_bn_bwd_sums's layout) from the group's sums
__global__ void k_bn_bwd_coef(float *coef, const double *ab, double M, const float *gamma,
                              const float *save_mean, const float *save_rstd, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float *k = coef + 5 * (size_t)c;
    k[0] = (gamma ? gamma[c] : 1.0f) * save_rstd[c];
    k[1] = (float)(ab[2 * (size_t)c] / M);
    k[2] = (float)(ab[2 * (size_t)c + 1] / M);
    k[3] = save_mean[c];
    k[4] = save_rstd[c];
}

// Backward finish: k_h_bn_bwd_sums's epilogue from the partials (nch 0:
// no sums needed, frozen BN without parameter gradients).
__global__ void k_bn_bwd_fin(float *coef, float *dgamma, float *dbeta, const double *part,
                             int nch, const float *gamma, const float *save_mean,
                             const float *save_rstd, const float *run_mean, const float *run_var,
                             float eps, size_t M, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int train = save_mean != NULL;
    const float mean = train ? save_mean[c] : run_mean[c];
    const float rstd = train ? save_rstd[c] : 1.0f / sqrtf(run_var[c] + eps);
    double a = 0, b = 0;
    for (int k = 0; k < nch; k++) {
        a += part[((size_t)k * C + c) * 2];
        b += part[((size_t)k * C + c) * 2 + 1];
    }
    b *= rstd;
    if (dbeta) dbeta[c] += (float)a;
    if (dgamma) dgamma[c] += (float)b;
    float *k = coef + 5 * (size_t)c;
    k[0] = (gamma ? gamma[c] : 1.0f) * rstd;
    k[1] = train ? (float)(a / (double)M) : 0.0f;
    k[2] = train ? (float)(b / (double)M) : 0.0f;
    k[3] = mean;
    k[4] = rstd;
}

// conv bias gradient from a half NHWC dout: acc[c] += sum over M pixels
template <class T>
__global__ void __launch_bounds__(BN_THREADS)
k_h_chan_sum_acc(float *acc, const void *x_, size_t M, int C)
{
    const T *x = (const T *)x_;
    const int c = blockIdx.x;
    double s = 0;
    for (size_t j = threadIdx.x; j < M; j += BN_THREADS) s += ld(x[j * C + c]);
    s = block_sum(s);
    if (threadIdx.x == 0) acc[c] += (float)s;
}

// With half storage on: 1 when the BN call runs on half tensors (all of
// inp / dout / out must agree; a mismatch is logged and the call must do
// nothing: *bad = 1), 0 for the fp32 kernels.  Marks the output.
static int bn_half(ps_cu_state *s, const char *what, void *out, const void *inp,
                   const void *dout, int *bad)
{
    *bad = 0;
    if (!s->hstore) return 0;
    const int h = ps_cu_is_half(s, inp);
    if (dout && ps_cu_is_half(s, dout) != h) {
        ps_cu_half_mismatch(what);
        *bad = 1;
        return 0;
    }
    ps_cu_mark(s, out, h);
    return h;
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
    if (ps_cu_is_half(s, x)) {
        HLAUNCH_GB(k_h_chan_sum_acc, C, BN_THREADS, acc, x, (size_t)N * HW, C);
        return;
    }
    k_chan_sum_acc<<<C, BN_THREADS, 0, s->stream>>>(acc, x, N, C, HW);
    CU_LAUNCHED();
}

// The grid of the coalesced reductions: channel tiles x pixel chunks, about
// 2048 blocks (a few waves on any current GPU) but at least 256 pixels per
// chunk (32 per thread row); scratch: the fp32 coefficients (ncoef floats
// per channel) then the double partials.
typedef struct {
    int ctiles, nch;
    size_t chunk;
    float *coef;
    double *part;
} bn_red_t;
static bn_red_t bn_red(ps_cu_state *s, size_t M, int C, int ncoef)
{
    bn_red_t r;
    r.ctiles = (C + BNC_CH - 1) / BNC_CH;
    size_t n = 2048 / (size_t)r.ctiles, most = (M + 255) / 256;
    n = n < most ? n : most;
    n = n < 1 ? 1 : n;
    r.chunk = (M + n - 1) / n;
    r.nch = (int)((M + r.chunk - 1) / r.chunk);
    const size_t cbytes = ((size_t)ncoef * C * sizeof(float) + 15) & ~(size_t)15;
    char *p = (char *)ps_cu_scratch(s, cbytes + (size_t)r.nch * C * 2 * sizeof(double));
    r.coef = (float *)p;
    r.part = (double *)(p + cbytes);
    return r;
}

// Doubles after `fbytes` bytes of floats in a scratch block (16-aligned).
static double *after_floats(void *p, size_t fbytes)
{
    return (double *)((char *)p + ((fbytes + 15) & ~(size_t)15));
}

static void bn_forward_group(ps_ctx_t *ctx, ps_cu_state *s, int half, float *out,
                             float *save_mean, float *save_rstd, float *run_mean,
                             float *run_var, const float *inp, const float *gamma,
                             const float *beta, float eps, float momentum, int N, int C, int HW)
{
    const size_t n = (size_t)N * C * HW, M = (size_t)N * HW;
    float *ss;
    double *mom;
    if (half) {
        // coefficients (2C floats) then the moments (2C doubles) in the coef block
        const bn_red_t r = bn_red(s, M, C, 6);
        ss = r.coef;
        mom = (double *)(r.coef + 2 * (size_t)C);
        HLAUNCH_GB(k_h_bn_part, r.ctiles * r.nch, BN_THREADS, r.part, inp, inp,
                   (const float *)NULL, M, C, r.chunk, r.ctiles);
        k_bn_part_moments<<<(C + 255) / 256, 256, 0, s->stream>>>(mom, r.part, r.nch, M, C);
    } else {
        const size_t fb = 2 * (size_t)C * sizeof(float);
        ss = (float *)ps_cu_scratch(s, fb + 16 + 2 * (size_t)C * sizeof(double));
        mom = after_floats(ss, fb);
        k_bn_moments<<<C, BN_THREADS, 0, s->stream>>>(mom, inp, N, C, HW);
    }
    CU_LAUNCHED();
    const double Mg = ps_cu_bn_group_moments(s, ctx->bn_group, mom, C, (double)M);
    k_bn_fin_moments<<<(C + 255) / 256, 256, 0, s->stream>>>(ss, save_mean, save_rstd, run_mean,
                                                             run_var, mom, Mg, gamma, beta, eps,
                                                             momentum, C);
    CU_LAUNCHED();
    if (half) {
        HLAUNCH(k_h_bn_apply, n, out, inp, ss, n, C);
        return;
    }
    k_bn_apply<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, inp, ss, n, C, HW);
    CU_LAUNCHED();
}

static void bn_backward_group(ps_ctx_t *ctx, ps_cu_state *s, int half, float *dinp,
                              float *dgamma, float *dbeta, const float *dout, const float *inp,
                              const float *gamma, const float *save_mean,
                              const float *save_rstd, int N, int C, int HW)
{
    const size_t n = (size_t)N * C * HW, M = (size_t)N * HW;
    float *coef;
    double *ab;
    if (half) {
        // coefficients (5C floats, padded to 8 bytes) then the sums (2C doubles)
        const bn_red_t r = bn_red(s, M, C, 10);
        coef = r.coef;
        ab = (double *)(r.coef + 5 * (size_t)C + (C & 1));
        HLAUNCH_GB(k_h_bn_part, r.ctiles * r.nch, BN_THREADS, r.part, dout, inp, save_mean, M,
                   C, r.chunk, r.ctiles);
        k_bn_part_sums<<<(C + 255) / 256, 256, 0, s->stream>>>(ab, dgamma, dbeta, r.part, r.nch,
                                                               save_rstd, C);
    } else {
        const size_t fb = 5 * (size_t)C * sizeof(float);
        coef = (float *)ps_cu_scratch(s, fb + 16 + 2 * (size_t)C * sizeof(double));
        ab = after_floats(coef, fb);
        k_bn_bwd_local<<<C, BN_THREADS, 0, s->stream>>>(ab, dgamma, dbeta, dout, inp, save_mean,
                                                        save_rstd, N, C, HW);
    }
    CU_LAUNCHED();
    const double Mg = ps_cu_bn_group_sums(s, ctx->bn_group, ab, C, (double)M);
    k_bn_bwd_coef<<<(C + 255) / 256, 256, 0, s->stream>>>(coef, ab, Mg, gamma, save_mean,
                                                          save_rstd, C);
    CU_LAUNCHED();
    if (!dinp) return;
    if (half) {
        HLAUNCH(k_h_bn_bwd_apply, n, dinp, dout, inp, coef, n, C, 1);
        return;
    }
    k_bn_bwd_apply<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(dinp, dout, inp, coef, n,
                                                                     C, HW, 1);
    CU_LAUNCHED();
}

void ps_cu_bn_forward_train(ps_ctx_t *ctx, float *out, float *save_mean, float *save_rstd,
                            float *run_mean, float *run_var, const float *inp,
                            const float *gamma, const float *beta, float eps, float momentum,
                            int N, int C, int HW)
{
    ps_cu_state *s = cu_state(ctx);
    if (!bn_valid("bn_forward_train", N, C, HW)) return;
    int bad;
    const int half = bn_half(s, "bn_forward_train", out, inp, NULL, &bad);
    if (ctx->bn_group) {
        bn_forward_group(ctx, s, half, out, save_mean, save_rstd, run_mean, run_var, inp, gamma,
                         beta, eps, momentum, N, C, HW);
        return;
    }
    float *ss = (float *)ps_cu_scratch(s, 2 * (size_t)C * sizeof(float));
    if (half) {
        const size_t n = (size_t)N * C * HW, M = (size_t)N * HW;
        const bn_red_t r = bn_red(s, M, C, 2);
        HLAUNCH_GB(k_h_bn_part, r.ctiles * r.nch, BN_THREADS, r.part, inp, inp,
                   (const float *)NULL, M, C, r.chunk, r.ctiles);
        k_bn_stats_fin<<<(C + 255) / 256, 256, 0, s->stream>>>(r.coef, save_mean, save_rstd,
                                                               run_mean, run_var, r.part, r.nch,
                                                               gamma, beta, eps, momentum, M, C);
        CU_LAUNCHED();
        HLAUNCH(k_h_bn_apply, n, out, inp, r.coef, n, C);
        return;
    }
    k_bn_stats<<<C, BN_THREADS, 0, s->stream>>>(ss, save_mean, save_rstd, run_mean, run_var,
                                                 inp, gamma, beta, eps, momentum, N, C, HW);
    CU_LAUNCHED();
    const size_t n = (size_t)N * C * HW;
    k_bn_apply<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, inp, ss, n, C, HW);
    CU_LAUNCHED();
}

// out = inp * scale + shift per channel (ss: the C scales, then the C
// shifts), in the activations' storage (half or float)
static void bn_apply(ps_cu_state *s, const char *what, float *out, const float *inp,
                     const float *ss, int N, int C, int HW)
{
    const size_t n = (size_t)N * C * HW;
    int bad;
    if (bn_half(s, what, out, inp, NULL, &bad)) {
        HLAUNCH(k_h_bn_apply, n, out, inp, ss, n, C);
        return;
    }
    k_bn_apply<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, inp, ss, n, C, HW);
    CU_LAUNCHED();
}

void ps_cu_bn_forward_saved(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                            const float *beta, const float *save_mean, const float *save_rstd,
                            int N, int C, int HW)
{
    ps_cu_state *s = cu_state(ctx);
    if (!bn_valid("bn_forward_saved", N, C, HW)) return;
    float *ss = (float *)ps_cu_scratch(s, 2 * (size_t)C * sizeof(float));
    k_bn_saved_coef<<<(C + 255) / 256, 256, 0, s->stream>>>(ss, gamma, beta, save_mean,
                                                            save_rstd, C);
    CU_LAUNCHED();
    bn_apply(s, "bn_forward_saved", out, inp, ss, N, C, HW);
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
    bn_apply(s, "bn_forward_eval", out, inp, ss, N, C, HW);
}

static void bn_backward(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                        const float *dout, const float *inp, const float *gamma,
                        const float *save_mean, const float *save_rstd, const float *run_mean,
                        const float *run_var, float eps, int N, int C, int HW)
{
    ps_cu_state *s = cu_state(ctx);
    const int train = save_mean != NULL;
    if (!train && !dgamma && !dbeta && !dinp) return;
    int bad;
    const int half = bn_half(s, "bn_backward", dinp, inp, dout, &bad);
    if (bad) return;
    if (train && ctx->bn_group) {
        bn_backward_group(ctx, s, half, dinp, dgamma, dbeta, dout, inp, gamma, save_mean,
                          save_rstd, N, C, HW);
        return;
    }
    float *coef = (float *)ps_cu_scratch(s, 5 * (size_t)C * sizeof(float));
    if (half) {
        const size_t M = (size_t)N * HW;
        const bn_red_t r = bn_red(s, M, C, 5);
        // the sums only where something uses them (frozen BN: dinp alone)
        const int nch = train || dgamma || dbeta ? r.nch : 0;
        if (nch)
            HLAUNCH_GB(k_h_bn_part, r.ctiles * r.nch, BN_THREADS, r.part, dout, inp,
                       train ? save_mean : run_mean, M, C, r.chunk, r.ctiles);
        k_bn_bwd_fin<<<(C + 255) / 256, 256, 0, s->stream>>>(r.coef, dgamma, dbeta, r.part, nch,
                                                             gamma, save_mean, save_rstd,
                                                             run_mean, run_var, eps, M, C);
        CU_LAUNCHED();
        if (!dinp) return;
        const size_t n = (size_t)N * C * HW;
        HLAUNCH(k_h_bn_bwd_apply, n, dinp, dout, inp, r.coef, n, C, train);
        return;
    }
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
