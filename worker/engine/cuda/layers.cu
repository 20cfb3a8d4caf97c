// The small layers on the GPU with own kernels: relu, dropout, softmax
// cross-entropy, temporal shift, segment consensus, add / accumulate.
// Each matches its CPU twin in layers/<name>.c (same formula, same
// summation order where there is a sum), so the parity tests can be tight.
#include "cuda_int.h"

#include <math.h>
#include <string.h>

#define GRID_STRIDE(i, n)                                                    \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)
#define LAUNCH(kernel, n, ...)                                                              \
    do {                                                                                    \
        kernel<<<cu_grid((n), CU_BLOCK), CU_BLOCK, 0, s->stream>>>(__VA_ARGS__);            \
        CU_LAUNCHED();                                                                      \
    } while (0)

// ---- relu / add / accumulate ----------------------------------------------

__global__ void k_relu_fwd(float *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n) out[i] = inp[i] < 0.0f ? 0.0f : inp[i]; // NaN stays NaN
}
__global__ void k_relu_bwd(float *dinp, const float *dout, const float *out, size_t n)
{
    GRID_STRIDE(i, n) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}
__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void k_acc(float *acc, const float *x, size_t n)
{
    GRID_STRIDE(i, n) acc[i] += x[i];
}

void ps_cu_relu_forward(ps_ctx_t *ctx, float *out, const float *inp, size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (n) LAUNCH(k_relu_fwd, n, out, inp, n);
}
void ps_cu_relu_backward(ps_ctx_t *ctx, float *dinp, const float *dout, const float *out,
                         size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (dinp && n) LAUNCH(k_relu_bwd, n, dinp, dout, out, n);
}
void ps_cu_add(ps_ctx_t *ctx, float *out, const float *a, const float *b, size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (n) LAUNCH(k_add, n, out, a, b, n);
}
void ps_cu_accumulate(ps_ctx_t *ctx, float *acc, const float *x, size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (n) LAUNCH(k_acc, n, acc, x, n);
}

// ---- dropout ----------------------------------------------------------------

// Device copy of ps_rng_uniform() (ps_engine.h): the same bits, so the CPU
// and the GPU draw the same mask (tests/test_cuda_layers.c compares them).
__device__ __forceinline__ float d_rng_uniform(uint64_t seed, uint64_t index)
{
    uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

__global__ void k_dropout_fwd(float *out, uint8_t *mask, const float *inp, size_t n, float p,
                              float scale, uint64_t seed)
{
    GRID_STRIDE(i, n)
    {
        const uint8_t keep = d_rng_uniform(seed, i) >= p;
        mask[i] = keep;
        out[i] = keep ? inp[i] * scale : 0.0f;
    }
}
__global__ void k_dropout_bwd(float *dinp, const float *dout, const uint8_t *mask, size_t n,
                              float scale)
{
    GRID_STRIDE(i, n) dinp[i] = mask[i] ? dout[i] * scale : 0.0f;
}

static int p_valid(float p)
{
    if (!(p >= 0.0f && p <= 1.0f)) {
        ps_error("dropout (cuda): probability %g outside [0, 1]", (double)p);
        return 0;
    }
    return 1;
}

void ps_cu_dropout_forward(ps_ctx_t *ctx, float *out, uint8_t *mask, const float *inp,
                           size_t n, float p, uint64_t seed)
{
    ps_cu_state *s = cu_state(ctx);
    if (!p_valid(p) || !n) return;
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    LAUNCH(k_dropout_fwd, n, out, mask, inp, n, p, scale, seed);
}
void ps_cu_dropout_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                            const uint8_t *mask, size_t n, float p)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || !p_valid(p) || !n) return;
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    LAUNCH(k_dropout_bwd, n, dinp, dout, mask, n, scale);
}

// ---- softmax cross-entropy ------------------------------------------------

#define XENT_THREADS 128

// One block per row: max, sum of exp (double), probs, and the row's loss
// log-sum-exp - x[label] into rowloss[n] (NaN for a bad label, which the
// host reports).
__global__ void __launch_bounds__(XENT_THREADS)
k_xent_fwd(float *probs, double *rowloss, const float *logits, const int32_t *labels, int K)
{
    __shared__ float smax[XENT_THREADS];
    __shared__ double ssum[XENT_THREADS];
    const int n = blockIdx.x;
    const float *x = logits + (size_t)n * K;
    float *pr = probs + (size_t)n * K;
    float m = -INFINITY;
    for (int k = threadIdx.x; k < K; k += XENT_THREADS) m = fmaxf(m, x[k]);
    smax[threadIdx.x] = m;
    __syncthreads();
    for (int o = XENT_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) smax[threadIdx.x] = fmaxf(smax[threadIdx.x], smax[threadIdx.x + o]);
        __syncthreads();
    }
    m = smax[0];
    double sum = 0;
    for (int k = threadIdx.x; k < K; k += XENT_THREADS) {
        const float e = expf(x[k] - m);
        pr[k] = e;
        sum += e;
    }
    ssum[threadIdx.x] = sum;
    __syncthreads();
    for (int o = XENT_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) ssum[threadIdx.x] += ssum[threadIdx.x + o];
        __syncthreads();
    }
    const double s = ssum[0];
    const float inv = (float)(1.0 / s);
    for (int k = threadIdx.x; k < K; k += XENT_THREADS) pr[k] *= inv;
    if (threadIdx.x == 0) {
        const int32_t l = labels[n];
        rowloss[n] = (l < 0 || l >= K) ? (double)NAN : (double)m + log(s) - (double)x[l];
    }
}

__global__ void k_xent_bwd(float *dlogits, const float *probs, const int32_t *labels,
                           size_t total, int K, float g)
{
    GRID_STRIDE(i, total)
    {
        const int k = (int)(i % K);
        const int32_t l = labels[i / K];
        dlogits[i] = probs[i] * g - (k == l ? g : 0.0f);
    }
}

float ps_cu_xent_forward(ps_ctx_t *ctx, float *probs, const float *logits,
                         const int32_t *labels, int N, int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (N <= 0 || K <= 0) {
        ps_error("xent (cuda): invalid shape N=%d K=%d", N, K);
        return NAN;
    }
    double *rowloss = (double *)ps_cu_scratch(s, (size_t)N * sizeof(double));
    k_xent_fwd<<<N, XENT_THREADS, 0, s->stream>>>(probs, rowloss, logits, labels, K);
    CU_LAUNCHED();
    double stackbuf[256];
    double *host = N <= 256 ? stackbuf : (double *)malloc((size_t)N * sizeof(double));
    if (!host) {
        ps_error("xent (cuda): out of host memory for %d losses", N);
        return NAN;
    }
    CU_CHECK(cudaMemcpyAsync(host, rowloss, (size_t)N * sizeof(double),
                             cudaMemcpyDeviceToHost, s->stream));
    CU_CHECK(cudaStreamSynchronize(s->stream)); // the loss is returned: must wait
    double loss = 0;
    int bad = -1;
    for (int n = 0; n < N; n++) {
        if (isnan(host[n]) && bad < 0) bad = n;
        loss += host[n];
    }
    if (host != stackbuf) free(host);
    if (bad >= 0) {
        // a NaN row is either a bad label or NaN logits; both make the loss NaN
        ps_error("xent (cuda): sample %d has a label outside [0, %d) or non-finite logits",
                 bad, K);
        return NAN;
    }
    return (float)(loss / N);
}

void ps_cu_xent_backward(ps_ctx_t *ctx, float *dlogits, const float *probs,
                         const int32_t *labels, float dloss, int N, int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dlogits || N <= 0 || K <= 0) return;
    const size_t total = (size_t)N * K;
    // dx = p*g, minus g at the label (the CPU's two steps: p*g, then -= g)
    // loss scaling (mixed.cu): the backward of loss_scale * loss
    LAUNCH(k_xent_bwd, total, dlogits, probs, labels, total, K, dloss * s->loss_scale / (float)N);
}

// ---- temporal shift -------------------------------------------------------

// One thread per (clip, channel, pixel) column walks the T frames: a
// channel that takes frame t+1 walks t upwards, one that takes t-1 walks
// downwards, so every source value is read before it is overwritten - the
// kernel is correct in place (dst == src) and reads/writes each element
// once.  Consecutive threads touch consecutive pixels (coalesced).
__global__ void k_tshift(float *dst, const float *src, size_t n, int T, int C, int HW,
                         int fold, int dir)
{
    GRID_STRIDE(i, n)
    {
        const int c = (int)((i / HW) % C);
        const size_t b = i / ((size_t)HW * C);
        const size_t stride = (size_t)C * HW; // one frame
        const size_t base = (b * T * C + c) * (size_t)HW + i % HW;
        float *o = dst + base;
        const float *x = src + base;
        const int s = c < fold ? dir : c < 2 * fold ? -dir : 0; // frame offset read
        if (s > 0) {
            for (int t = 0; t < T - 1; t++) o[t * stride] = x[(t + 1) * stride];
            o[(T - 1) * stride] = 0.0f;
        } else if (s < 0) {
            for (int t = T - 1; t > 0; t--) o[t * stride] = x[(t - 1) * stride];
            o[0] = 0.0f;
        } else if (o != x) {
            for (int t = 0; t < T; t++) o[t * stride] = x[t * stride];
        }
    }
}

static void tshift(ps_cu_state *s, float *dst, const float *src, int B, int T, int C, int HW,
                   int fold_div, int dir)
{
    if (B <= 0 || T <= 0 || C <= 0 || HW <= 0 || fold_div <= 0) {
        ps_error("tshift (cuda): invalid shape B=%d T=%d C=%d HW=%d fold_div=%d", B, T, C, HW,
                 fold_div);
        return;
    }
    const size_t n = (size_t)B * C * HW; // columns
    LAUNCH(k_tshift, n, dst, src, n, T, C, HW, C / fold_div, dir);
}

void ps_cu_tshift_forward(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int C,
                          int HW, int fold_div)
{
    tshift(cu_state(ctx), out, inp, B, T, C, HW, fold_div, +1);
}
void ps_cu_tshift_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T, int C,
                           int HW, int fold_div)
{
    ps_cu_state *s = cu_state(ctx);
    if (dinp) tshift(s, dinp, dout, B, T, C, HW, fold_div, -1);
}

// ---- segment consensus ----------------------------------------------------

__global__ void k_consensus_fwd(float *out, const float *inp, int B, int T, int K, float inv)
{
    GRID_STRIDE(i, (size_t)B * K)
    {
        const size_t b = i / K, k = i % K;
        float s = 0.0f;
        for (int t = 0; t < T; t++) s += inp[(b * T + t) * K + k];
        out[i] = s * inv;
    }
}
__global__ void k_consensus_bwd(float *dinp, const float *dout, int T, int K, size_t n,
                                float inv)
{
    GRID_STRIDE(i, n) dinp[i] = dout[(i / ((size_t)T * K)) * K + i % K] * inv;
}

void ps_cu_consensus_forward(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (B <= 0 || T <= 0 || K <= 0) return;
    LAUNCH(k_consensus_fwd, (size_t)B * K, out, inp, B, T, K, 1.0f / (float)T);
}
void ps_cu_consensus_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T,
                              int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || B <= 0 || T <= 0 || K <= 0) return;
    const size_t n = (size_t)B * T * K;
    LAUNCH(k_consensus_bwd, n, dinp, dout, T, K, n, 1.0f / (float)T);
}
