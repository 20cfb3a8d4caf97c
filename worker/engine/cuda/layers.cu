// The small layers on the GPU with own kernels: relu, dropout, softmax
// cross-entropy, temporal shift, segment consensus, add / accumulate / scale.
// Each matches its CPU twin in layers/<name>.c (same formula, same
// summation order where there is a sum), so the parity tests can be tight.
#include "cuda_int.h"
#include "half.cuh"

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
__global__ void k_scale(float *x, float alpha, size_t n)
{
    GRID_STRIDE(i, n) x[i] *= alpha;
}

// Half storage twins (half.cuh): the same formulas in fp32 between one
// load and one rounding store per element.  Layout-free (elementwise), so
// they serve NHWC activations as they are.
template <class T>
__global__ void k_h_relu_fwd(void *out_, const void *inp_, size_t n)
{
    T *out = (T *)out_;
    const T *inp = (const T *)inp_;
    GRID_STRIDE(i, n)
    {
        const float v = ld(inp[i]);
        st(&out[i], v < 0.0f ? 0.0f : v);
    }
}
template <class T>
__global__ void k_h_relu_bwd(void *dinp_, const void *dout_, const void *out_, size_t n)
{
    T *dinp = (T *)dinp_;
    const T *dout = (const T *)dout_, *out = (const T *)out_;
    GRID_STRIDE(i, n) st(&dinp[i], ld(out[i]) > 0.0f ? ld(dout[i]) : 0.0f);
}
template <class T>
__global__ void k_h_add(void *out_, const void *a_, const void *b_, size_t n)
{
    T *out = (T *)out_;
    const T *a = (const T *)a_, *b = (const T *)b_;
    GRID_STRIDE(i, n) st(&out[i], ld(a[i]) + ld(b[i]));
}
template <class T>
__global__ void k_h_acc(void *acc_, const void *x_, size_t n)
{
    T *acc = (T *)acc_;
    const T *x = (const T *)x_;
    GRID_STRIDE(i, n) st(&acc[i], ld(acc[i]) + ld(x[i]));
}

// Half-storage bookkeeping of a layer with inputs a (and b): with half
// storage on, the inputs must have the same storage and the output is
// tagged with it (the caller then picks the kernel from the output's tag).
// Returns 1 when the inputs disagree (logged; the caller does nothing).
static int h_same(ps_cu_state *s, const char *what, void *out, const void *a, const void *b)
{
    if (!s->hstore) return 0;
    const int ha = ps_cu_is_half(s, a), hb = b ? ps_cu_is_half(s, b) : ha;
    if (ha != hb) {
        ps_cu_half_mismatch(what);
        return 1;
    }
    ps_cu_mark(s, out, ha);
    return 0;
}

void ps_cu_relu_forward(ps_ctx_t *ctx, float *out, const float *inp, size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (!n || h_same(s, "relu_forward", out, inp, NULL)) return;
    if (ps_cu_is_half(s, out))
        HLAUNCH(k_h_relu_fwd, n, out, inp, n);
    else
        LAUNCH(k_relu_fwd, n, out, inp, n);
}
void ps_cu_relu_backward(ps_ctx_t *ctx, float *dinp, const float *dout, const float *out,
                         size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || !n || h_same(s, "relu_backward", dinp, dout, out)) return;
    if (ps_cu_is_half(s, dinp))
        HLAUNCH(k_h_relu_bwd, n, dinp, dout, out, n);
    else
        LAUNCH(k_relu_bwd, n, dinp, dout, out, n);
}
void ps_cu_add(ps_ctx_t *ctx, float *out, const float *a, const float *b, size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (!n || h_same(s, "add", out, a, b)) return;
    if (ps_cu_is_half(s, out))
        HLAUNCH(k_h_add, n, out, a, b, n);
    else
        LAUNCH(k_add, n, out, a, b, n);
}
void ps_cu_accumulate(ps_ctx_t *ctx, float *acc, const float *x, size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (!n || h_same(s, "accumulate", acc, acc, x)) return;
    if (ps_cu_is_half(s, acc))
        HLAUNCH(k_h_acc, n, acc, x, n);
    else
        LAUNCH(k_acc, n, acc, x, n);
}
void ps_cu_scale(ps_ctx_t *ctx, float *x, float alpha, size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (!n) return;
    if (ps_cu_is_half(s, x)) {
        ps_cu_half_mismatch("scale (fp32 only)");
        return;
    }
    LAUNCH(k_scale, n, x, alpha, n);
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
// Half twins: the mask is drawn per storage index i, as above, so it is
// the CPU's mask bit for bit where the layouts agree - the model's dropout
// is on (N, F) features, the same in NCHW and NHWC.
template <class T>
__global__ void k_h_dropout_fwd(void *out_, uint8_t *mask, const void *inp_, size_t n, float p,
                                float scale, uint64_t seed)
{
    T *out = (T *)out_;
    const T *inp = (const T *)inp_;
    GRID_STRIDE(i, n)
    {
        const uint8_t keep = d_rng_uniform(seed, i) >= p;
        mask[i] = keep;
        st(&out[i], keep ? ld(inp[i]) * scale : 0.0f);
    }
}
template <class T>
__global__ void k_h_dropout_bwd(void *dinp_, const void *dout_, const uint8_t *mask, size_t n,
                                float scale)
{
    T *dinp = (T *)dinp_;
    const T *dout = (const T *)dout_;
    GRID_STRIDE(i, n) st(&dinp[i], mask[i] ? ld(dout[i]) * scale : 0.0f);
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
    if (h_same(s, "dropout_forward", out, inp, NULL)) return;
    if (ps_cu_is_half(s, out))
        HLAUNCH(k_h_dropout_fwd, n, out, mask, inp, n, p, scale, seed);
    else
        LAUNCH(k_dropout_fwd, n, out, mask, inp, n, p, scale, seed);
}
void ps_cu_dropout_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                            const uint8_t *mask, size_t n, float p)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || !p_valid(p) || !n) return;
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    if (h_same(s, "dropout_backward", dinp, dout, NULL)) return;
    if (ps_cu_is_half(s, dinp))
        HLAUNCH(k_h_dropout_bwd, n, dinp, dout, mask, n, scale);
    else
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
    if (ps_cu_is_half(s, logits)) { // the loss and softmax are fp32 by design
        ps_error("xent (cuda): logits must be fp32 (linear's output), got a half tensor");
        return NAN;
    }
    ps_cu_mark(s, probs, 0);
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
    ps_cu_mark(s, dlogits, 0);
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

// Half twin on NHWC frames (B, T, HW, C): one thread per (clip, pixel,
// channel) column, consecutive threads on consecutive channels (coalesced);
// the same walk order, so it too works in place.
template <class T_>
__global__ void k_h_tshift(void *dst_, const void *src_, size_t n, int T, int C, int HW,
                           int fold, int dir)
{
    T_ *dst = (T_ *)dst_;
    const T_ *src = (const T_ *)src_;
    GRID_STRIDE(i, n)
    {
        const int c = (int)(i % C);
        const size_t b = i / ((size_t)HW * C);
        const size_t stride = (size_t)C * HW; // one frame
        const size_t base = b * T * stride + i % stride;
        T_ *o = dst + base;
        const T_ *x = src + base;
        const int s = c < fold ? dir : c < 2 * fold ? -dir : 0; // frame offset read
        if (s > 0) {
            for (int t = 0; t < T - 1; t++) o[t * stride] = x[(t + 1) * stride];
            st(&o[(T - 1) * stride], 0.0f);
        } else if (s < 0) {
            for (int t = T - 1; t > 0; t--) o[t * stride] = x[(t - 1) * stride];
            st(&o[0], 0.0f);
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
    if (h_same(s, "tshift", dst, src, NULL)) return;
    if (ps_cu_is_half(s, dst))
        HLAUNCH(k_h_tshift, n, dst, src, n, T, C, HW, C / fold_div, dir);
    else
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

template <class T_>
__global__ void k_h_consensus_fwd(void *out_, const void *inp_, int B, int T, int K, float inv)
{
    T_ *out = (T_ *)out_;
    const T_ *inp = (const T_ *)inp_;
    GRID_STRIDE(i, (size_t)B * K)
    {
        const size_t b = i / K, k = i % K;
        float s = 0.0f;
        for (int t = 0; t < T; t++) s += ld(inp[(b * T + t) * K + k]);
        st(&out[i], s * inv);
    }
}
template <class T_>
__global__ void k_h_consensus_bwd(void *dinp_, const void *dout_, int T, int K, size_t n,
                                  float inv)
{
    T_ *dinp = (T_ *)dinp_;
    const T_ *dout = (const T_ *)dout_;
    GRID_STRIDE(i, n) st(&dinp[i], ld(dout[(i / ((size_t)T * K)) * K + i % K]) * inv);
}

void ps_cu_consensus_forward(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (B <= 0 || T <= 0 || K <= 0 || h_same(s, "consensus_forward", out, inp, NULL)) return;
    if (ps_cu_is_half(s, out))
        HLAUNCH(k_h_consensus_fwd, (size_t)B * K, out, inp, B, T, K, 1.0f / (float)T);
    else
        LAUNCH(k_consensus_fwd, (size_t)B * K, out, inp, B, T, K, 1.0f / (float)T);
}
void ps_cu_consensus_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T,
                              int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (!dinp || B <= 0 || T <= 0 || K <= 0) return;
    const size_t n = (size_t)B * T * K;
    if (h_same(s, "consensus_backward", dinp, dout, NULL)) return;
    if (ps_cu_is_half(s, dinp))
        HLAUNCH(k_h_consensus_bwd, n, dinp, dout, T, K, n, 1.0f / (float)T);
    else
        LAUNCH(k_consensus_bwd, n, dinp, dout, T, K, n, 1.0f / (float)T);
}

// ---- the model input --------------------------------------------------------
// Host batch -> the model's input buffer in one DMA on the stream (the
// backend table's copy_in: ps_engine.h says why).  From pageable memory
// cudaMemcpyAsync returns once src is staged, so the caller may reuse it;
// the copy is ordered before conv1 on the same stream.  The buffer holds
// fp32 (the stem's cast reads it), whatever it held before.
void ps_cu_copy_in(ps_ctx_t *ctx, float *dst, const float *src, size_t n)
{
    ps_cu_state *s = cu_state(ctx);
    if (!n) return;
    ps_cu_mark(s, dst, 0);
    CU_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDefault, s->stream));
}
