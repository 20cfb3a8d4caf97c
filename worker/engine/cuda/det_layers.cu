// The detection layers of the backend table (ps_engine.h) on the GPU: FPN
// upsample-add, sigmoid focal loss, smooth-L1, the head permute and the
// positive count, side by side with their CPU references
// (worker/engine/layers/upsample_add.c, focal.c, smoothl1.c,
// head_permute.c), same signatures; every tensor a device (or managed)
// pointer, the losses and counts returned into host memory.  Each kernel
// computes the CPU's formula in the CPU's precision (double for the losses
// and their gradients, float where the CPU uses float), so parity is to
// float rounding:
//   * upsample-add backward gathers, for each top pixel, the output pixels
//     copied from it in the CPU's scatter order (rows, then columns, float
//     adds from 0): bit for bit, and deterministic without atomics;
//   * loss sums: per-block double partial sums in a fixed grid, added on the
//     host in block order (deterministic run to run; differs from the CPU's
//     sequential double sum only in the last double bits).
// Legend as in ps_engine.h's detection slots (N images, C channels, H,W top
// map, P,Q lateral map, A anchors, K classes).
#include "cuda_int.h"

#include <math.h>

#define DET_THREADS 256
// partial-sum blocks of a reduction: enough to fill an H200 (132 SMs) a few
// times over, few enough that the host adds them in microseconds
#define DET_RED_BLOCKS 512
#define DET_STRIDE(i, n)                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

// ---- FPN upsample-add --------------------------------------------------------

// torch's nearest source index, as the CPU's ps_nearest_src (ps_util.h; the float
// scale and floorf are the CPU's: IEEE division and multiply, no contraction
// possible without an add)
__device__ __forceinline__ int d_nearest_src(int dst, int in, int out)
{
    if (out == in) return dst;
    if (out == 2 * in) return dst >> 1;
    const float scale = (float)in / (float)out;
    const int s = (int)floorf((float)dst * scale);
    return s < in - 1 ? s : in - 1;
}

// First destination index whose source is >= src (nearest_src is
// non-decreasing in dst): the destinations copied from source h are
// [d_first_dst(h), d_first_dst(h+1)).
__device__ int d_first_dst(int src, int in, int out)
{
    int lo = 0, hi = out;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (d_nearest_src(mid, in, out) < src)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

// out (N,C,P,Q) = lateral + top (N,C,H,W) at the nearest source; n = N*C*P*Q
__global__ void k_det_upadd_fwd(float *out, const float *lateral, const float *top, size_t n,
                                int H, int W, int P, int Q)
{
    DET_STRIDE(i, n)
    {
        const int q = (int)(i % Q);
        const size_t r = i / Q;
        const int p = (int)(r % P);
        const size_t nc = r / P;
        out[i] = lateral[i] + top[(nc * H + d_nearest_src(p, H, P)) * W + d_nearest_src(q, W, Q)];
    }
}

// dtop (N,C,H,W): sum of dout over the pixels each top pixel was copied to;
// n = N*C*H*W.  Rows then columns ascending, float adds: the CPU's order.
__global__ void k_det_upadd_bwd(float *dtop, const float *dout, size_t n, int H, int W, int P,
                                int Q)
{
    DET_STRIDE(i, n)
    {
        const int w = (int)(i % W);
        const size_t r = i / W;
        const int h = (int)(r % H);
        const size_t nc = r / H;
        const int p0 = d_first_dst(h, H, P), p1 = d_first_dst(h + 1, H, P);
        const int q0 = d_first_dst(w, W, Q), q1 = d_first_dst(w + 1, W, Q);
        const float *g = dout + nc * P * Q;
        float s = 0.0f;
        for (int p = p0; p < p1; p++)
            for (int q = q0; q < q1; q++) s += g[(size_t)p * Q + q];
        dtop[i] = s;
    }
}

// ---- labels: first bad label and the positive count -------------------------

// Per block: out[2*b] = the smallest anchor index with a label outside
// -1..K (0x7fffffff if none), out[2*b+1] = anchors with label >= 1.
__global__ void __launch_bounds__(DET_THREADS)
k_det_labels(int *out, const int32_t *labels, int A, int K)
{
    __shared__ int sbad[DET_THREADS];
    __shared__ int spos[DET_THREADS];
    int bad = 0x7fffffff, pos = 0;
    DET_STRIDE(i, (size_t)A)
    {
        const int32_t l = labels[i];
        if ((l < -1 || l > K) && (int)i < bad) bad = (int)i;
        pos += l >= 1;
    }
    sbad[threadIdx.x] = bad;
    spos[threadIdx.x] = pos;
    __syncthreads();
    for (int o = DET_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) {
            const int b2 = sbad[threadIdx.x + o];
            if (b2 < sbad[threadIdx.x]) sbad[threadIdx.x] = b2;
            spos[threadIdx.x] += spos[threadIdx.x + o];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = sbad[0];
        out[2 * blockIdx.x + 1] = spos[0];
    }
}

// ---- sigmoid focal loss ----------------------------------------------------------

// partial[blockIdx.x] = the sum of every thread's acc over the block, in a
// fixed tree order (deterministic); every thread of the block calls it
__device__ void d_block_sum(double *partial, double acc)
{
    __shared__ double ssum[DET_THREADS];
    ssum[threadIdx.x] = acc;
    __syncthreads();
    for (int o = DET_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) ssum[threadIdx.x] += ssum[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = ssum[0];
}

// log(1 + e^x), stable for any x (focal.c's softplus)
__device__ __forceinline__ double d_softplus(double x)
{
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

// Per block: partial[b] = sum over its (anchor, class) elements of the focal
// term (double), ignored anchors (label -1) skipped; n = A*K.
__global__ void __launch_bounds__(DET_THREADS)
k_det_focal_fwd(double *partial, const float *logits, const int32_t *labels, size_t n, int K,
                float alpha, float gamma)
{
    double acc = 0;
    DET_STRIDE(i, n)
    {
        const int32_t l = labels[i / K];
        if (l < 0) continue;
        const double v = logits[i];
        const double p = 1.0 / (1.0 + exp(-v));
        if (l == (int)(i % K) + 1)
            acc += alpha * pow(1.0 - p, (double)gamma) * d_softplus(-v);
        else
            acc += (1.0 - alpha) * pow(p, (double)gamma) * d_softplus(v);
    }
    d_block_sum(partial, acc);
}

// dlogits (A,K) = scale * d(focal)/d(logit), 0 on ignored anchors; n = A*K
__global__ void k_det_focal_bwd(float *dlogits, const float *logits, const int32_t *labels,
                                size_t n, int K, float alpha, float gamma, double scale)
{
    DET_STRIDE(i, n)
    {
        const int32_t l = labels[i / K];
        if (l < 0) {
            dlogits[i] = 0.0f;
            continue;
        }
        const double v = logits[i], p = 1.0 / (1.0 + exp(-v)), q = 1.0 / (1.0 + exp(v));
        double g;
        if (l == (int)(i % K) + 1)
            g = alpha * pow(q, (double)gamma) * (gamma * p * -d_softplus(-v) - q);
        else
            g = (1.0 - alpha) * pow(p, (double)gamma) * (p + gamma * q * d_softplus(v));
        dlogits[i] = (float)(g * scale);
    }
}

// ---- smooth-L1 on the positive anchors ------------------------------------------

// Per block: partial[b] = sum of smooth-L1 over its elements of positive
// anchors; n = A*4.
__global__ void __launch_bounds__(DET_THREADS)
k_det_sl1_fwd(double *partial, const float *pred, const float *target, const int32_t *labels,
              size_t n, float beta)
{
    double acc = 0;
    DET_STRIDE(i, n)
    {
        if (labels[i / 4] < 1) continue;
        const double d = fabs((double)pred[i] - target[i]);
        acc += d < beta ? 0.5 * d * d / beta : d - 0.5 * beta;
    }
    d_block_sum(partial, acc);
}

__global__ void k_det_sl1_bwd(float *dpred, const float *pred, const float *target,
                              const int32_t *labels, size_t n, float beta, double scale)
{
    DET_STRIDE(i, n)
    {
        if (labels[i / 4] < 1) {
            dpred[i] = 0.0f;
            continue;
        }
        const double d = (double)pred[i] - target[i];
        const double g = fabs(d) < beta ? d / beta : (d > 0 ? 1.0 : -1.0);
        dpred[i] = (float)(g * scale);
    }
}

// ---- head permute ------------------------------------------------------------------

// out (HW, nA, D) <- inp (nA*D, HW); one thread per output element (the
// writes coalesce; the reads stride by HW, as in torchvision's permute)
__global__ void k_det_permute_fwd(float *out, const float *inp, size_t n, int nA, int D,
                                  size_t HW)
{
    DET_STRIDE(i, n)
    {
        const int d = (int)(i % D);
        const size_t r = i / D;
        const int a = (int)(r % nA);
        const size_t s = r / nA;
        out[i] = inp[((size_t)a * D + d) * HW + s];
    }
}
// dinp (nA*D, HW) <- dout (HW, nA, D); one thread per input element
__global__ void k_det_permute_bwd(float *dinp, const float *dout, size_t n, int nA, int D,
                                  size_t HW)
{
    DET_STRIDE(i, n)
    {
        const size_t s = i % HW, ad = i / HW;
        dinp[i] = dout[(s * nA + ad / D) * D + ad % D];
    }
}

// ---- Mask R-CNN's mask loss -------------------------------------------------------

// Per block: partial[b] = the BCE-with-logits sum over its elements of the
// rows' target channels; n = R*MM, element i is row i / MM, pixel i % MM
__global__ void __launch_bounds__(DET_THREADS)
k_det_mask_bce_fwd(double *partial, const float *logits, const int32_t *labels,
                   const float *targets, size_t n, int K, int MM)
{
    double acc = 0;
    DET_STRIDE(i, n)
    {
        const size_t r = i / MM;
        const double x = logits[(r * K + labels[r]) * MM + i % MM], t = targets[i];
        acc += (x > 0 ? x : 0) - x * t + log1p(exp(-fabs(x)));
    }
    d_block_sum(partial, acc);
}

// dlogits (R,K,MM) = scale * (sigmoid - target) on the target channels, 0
// elsewhere; n = R*K*MM
__global__ void k_det_mask_bce_bwd(float *dlogits, const float *logits, const int32_t *labels,
                                   const float *targets, size_t n, int K, int MM, double scale)
{
    DET_STRIDE(i, n)
    {
        const size_t rk = i / MM, r = rk / K;
        if ((int)(rk % K) != labels[r]) {
            dlogits[i] = 0.0f;
            continue;
        }
        const double x = logits[i];
        const double sig = x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
        dlogits[i] = (float)((sig - targets[r * MM + i % MM]) * scale);
    }
}

// ---- launchers -----------------------------------------------------------------------

#define DET_LAUNCH(kernel, n, ...)                                                          \
    do {                                                                                    \
        kernel<<<cu_grid((n), DET_THREADS), DET_THREADS, 0, s->stream>>>(__VA_ARGS__);      \
        CU_LAUNCHED();                                                                      \
    } while (0)

static unsigned red_blocks(size_t n)
{
    const unsigned g = cu_grid(n, DET_THREADS);
    return g < DET_RED_BLOCKS ? g : DET_RED_BLOCKS;
}

// Reduce per-block double partials (written by a kernel already queued) on
// the host in block order.  Waits for the stream: the loss is returned.
static double host_sum(ps_cu_state *s, const double *dpartial, unsigned blocks)
{
    double h[DET_RED_BLOCKS];
    CU_CHECK(cudaMemcpyAsync(h, dpartial, blocks * sizeof(double), cudaMemcpyDeviceToHost,
                             s->stream));
    CU_CHECK(cudaStreamSynchronize(s->stream));
    double sum = 0;
    for (unsigned b = 0; b < blocks; b++) sum += h[b];
    return sum;
}

// Label scan: *first_bad = smallest bad anchor index or -1, returns the
// positive count.  Waits for the stream.
static int scan_labels(ps_cu_state *s, const int32_t *labels, int A, int K, int *first_bad)
{
    const unsigned g = red_blocks((size_t)A);
    int *d = (int *)ps_cu_scratch(s, 2 * DET_RED_BLOCKS * sizeof(int));
    k_det_labels<<<g, DET_THREADS, 0, s->stream>>>(d, labels, A, K);
    CU_LAUNCHED();
    int h[2 * DET_RED_BLOCKS];
    CU_CHECK(cudaMemcpyAsync(h, d, 2 * g * sizeof(int), cudaMemcpyDeviceToHost, s->stream));
    CU_CHECK(cudaStreamSynchronize(s->stream));
    int bad = 0x7fffffff, pos = 0;
    for (unsigned b = 0; b < g; b++) {
        if (h[2 * b] < bad) bad = h[2 * b];
        pos += h[2 * b + 1];
    }
    *first_bad = bad == 0x7fffffff ? -1 : bad;
    return pos;
}

static int bad_labels(ps_cu_state *s, const int32_t *labels, int A, int K, const char *who)
{
    int bad;
    scan_labels(s, labels, A, K, &bad);
    if (bad < 0) return 0;
    int32_t l = 0;
    CU_CHECK(cudaMemcpyAsync(&l, labels + bad, sizeof l, cudaMemcpyDeviceToHost, s->stream));
    CU_CHECK(cudaStreamSynchronize(s->stream));
    ps_error("%s (cuda): label %d of anchor %d outside -1..%d", who, l, bad, K);
    return PS_EINVAL;
}

// The mask loss's channels: every label in 0..K-1 (the rows are few: read
// on the host).  Waits for the stream.
static int bad_mask_labels(ps_cu_state *s, const int32_t *labels, int R, int K, const char *who)
{
    int32_t *h = (int32_t *)malloc(sizeof(int32_t) * (size_t)(R > 0 ? R : 1));
    if (!h) {
        ps_error("%s (cuda): out of host memory for %d labels", who, R);
        return PS_ENOMEM;
    }
    CU_CHECK(cudaMemcpyAsync(h, labels, sizeof(int32_t) * (size_t)R, cudaMemcpyDeviceToHost,
                             s->stream));
    CU_CHECK(cudaStreamSynchronize(s->stream));
    int rc = 0;
    for (int r = 0; r < R && !rc; r++)
        if (h[r] < 0 || h[r] >= K) {
            ps_error("%s (cuda): label %d of row %d outside 0..%d", who, h[r], r, K - 1);
            rc = PS_EINVAL;
        }
    free(h);
    return rc;
}

extern "C" {

void ps_cu_upsample_add_forward(ps_ctx_t *ctx, float *out, const float *lateral,
                                    const float *top, int N, int C, int H, int W, int P, int Q)
{
    ps_cu_state *s = cu_state(ctx);
    if (N <= 0 || C <= 0 || H <= 0 || W <= 0 || P <= 0 || Q <= 0) {
        ps_error("upsample-add (cuda): invalid shape N=%d C=%d %dx%d -> %dx%d", N, C, H, W, P,
                 Q);
        return;
    }
    const size_t n = (size_t)N * C * P * Q;
    DET_LAUNCH(k_det_upadd_fwd, n, out, lateral, top, n, H, W, P, Q);
}

void ps_cu_upsample_add_backward(ps_ctx_t *ctx, float *dlateral, float *dtop,
                                     const float *dout, int N, int C, int H, int W, int P, int Q)
{
    ps_cu_state *s = cu_state(ctx);
    if (N <= 0 || C <= 0 || H <= 0 || W <= 0 || P <= 0 || Q <= 0) {
        ps_error("upsample-add backward (cuda): invalid shape N=%d C=%d %dx%d -> %dx%d", N, C,
                 H, W, P, Q);
        return;
    }
    if (dlateral && dlateral != dout)
        CU_CHECK(cudaMemcpyAsync(dlateral, dout, (size_t)N * C * P * Q * sizeof(float),
                                 cudaMemcpyDeviceToDevice, s->stream));
    if (!dtop) return;
    const size_t n = (size_t)N * C * H * W;
    DET_LAUNCH(k_det_upadd_bwd, n, dtop, dout, n, H, W, P, Q);
}

int ps_cu_count_pos(ps_ctx_t *ctx, const int32_t *labels, int A)
{
    ps_cu_state *s = cu_state(ctx);
    if (A <= 0) return 0;
    int bad;
    // K = INT_MAX - 1: no label counts as bad here (the CPU does not check)
    return scan_labels(s, labels, A, 0x7ffffffe, &bad);
}

int ps_cu_focal_forward(ps_ctx_t *ctx, float *loss, const float *logits,
                            const int32_t *labels, float alpha, float gamma, float normaliser,
                            int A, int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (A < 0 || K <= 0) {
        ps_error("focal loss (cuda): invalid shape A=%d K=%d", A, K);
        *loss = NAN;
        return PS_EINVAL;
    }
    if (A == 0) {
        *loss = 0.0f;
        return 0;
    }
    if (bad_labels(s, labels, A, K, "focal loss")) {
        *loss = NAN;
        return PS_EINVAL;
    }
    const size_t n = (size_t)A * K;
    const unsigned g = red_blocks(n);
    double *part = (double *)ps_cu_scratch(s, DET_RED_BLOCKS * sizeof(double));
    k_det_focal_fwd<<<g, DET_THREADS, 0, s->stream>>>(part, logits, labels, n, K, alpha, gamma);
    CU_LAUNCHED();
    *loss = (float)(host_sum(s, part, g) / normaliser);
    return 0;
}

int ps_cu_focal_backward(ps_ctx_t *ctx, float *dlogits, const float *logits,
                             const int32_t *labels, float dloss, float alpha, float gamma,
                             float normaliser, int A, int K)
{
    ps_cu_state *s = cu_state(ctx);
    if (A < 0 || K <= 0) {
        ps_error("focal loss backward (cuda): invalid shape A=%d K=%d", A, K);
        return PS_EINVAL;
    }
    if (A == 0) return 0;
    // the contract writes nothing on a bad label: check first (one wait,
    // after the forward already waited for its loss)
    if (bad_labels(s, labels, A, K, "focal loss backward")) return PS_EINVAL;
    const size_t n = (size_t)A * K;
    const double scale = (double)dloss / normaliser;
    DET_LAUNCH(k_det_focal_bwd, n, dlogits, logits, labels, n, K, alpha, gamma, scale);
    return 0;
}

void ps_cu_smoothl1_forward(ps_ctx_t *ctx, float *loss, const float *pred,
                                const float *target, const int32_t *labels, float beta,
                                float normaliser, int A)
{
    ps_cu_state *s = cu_state(ctx);
    if (A <= 0) {
        *loss = 0.0f;
        return;
    }
    const size_t n = (size_t)A * 4;
    const unsigned g = red_blocks(n);
    double *part = (double *)ps_cu_scratch(s, DET_RED_BLOCKS * sizeof(double));
    k_det_sl1_fwd<<<g, DET_THREADS, 0, s->stream>>>(part, pred, target, labels, n, beta);
    CU_LAUNCHED();
    *loss = (float)(host_sum(s, part, g) / normaliser);
}

void ps_cu_smoothl1_backward(ps_ctx_t *ctx, float *dpred, const float *pred,
                                 const float *target, const int32_t *labels, float dloss,
                                 float beta, float normaliser, int A)
{
    ps_cu_state *s = cu_state(ctx);
    if (A <= 0) return;
    const size_t n = (size_t)A * 4;
    const double scale = (double)dloss / normaliser;
    DET_LAUNCH(k_det_sl1_bwd, n, dpred, pred, target, labels, n, beta, scale);
}

void ps_cu_head_permute_forward(ps_ctx_t *ctx, float *out, const float *inp, int nA, int D,
                                    int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (nA <= 0 || D <= 0 || H <= 0 || W <= 0) return;
    const size_t HW = (size_t)H * W, n = HW * nA * D;
    DET_LAUNCH(k_det_permute_fwd, n, out, inp, n, nA, D, HW);
}

void ps_cu_head_permute_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int nA,
                                     int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (nA <= 0 || D <= 0 || H <= 0 || W <= 0) return;
    const size_t HW = (size_t)H * W, n = HW * nA * D;
    DET_LAUNCH(k_det_permute_bwd, n, dinp, dout, n, nA, D, HW);
}

int ps_cu_mask_bce_forward(ps_ctx_t *ctx, float *loss, const float *logits,
                           const int32_t *labels, const float *targets, float normaliser, int R,
                           int K, int MM)
{
    ps_cu_state *s = cu_state(ctx);
    if (R < 0 || K < 1 || MM < 1 || bad_mask_labels(s, labels, R, K, "mask loss")) {
        if (R < 0 || K < 1 || MM < 1)
            ps_error("mask loss (cuda): invalid shape R=%d K=%d MM=%d", R, K, MM);
        *loss = NAN;
        return PS_EINVAL;
    }
    if (R == 0) {
        *loss = 0.0f;
        return 0;
    }
    const size_t n = (size_t)R * MM;
    const unsigned g = red_blocks(n);
    double *part = (double *)ps_cu_scratch(s, DET_RED_BLOCKS * sizeof(double));
    k_det_mask_bce_fwd<<<g, DET_THREADS, 0, s->stream>>>(part, logits, labels, targets, n, K, MM);
    CU_LAUNCHED();
    *loss = (float)(host_sum(s, part, g) / normaliser);
    return 0;
}

int ps_cu_mask_bce_backward(ps_ctx_t *ctx, float *dlogits, const float *logits,
                            const int32_t *labels, const float *targets, float dloss,
                            float normaliser, int R, int K, int MM)
{
    ps_cu_state *s = cu_state(ctx);
    if (R < 0 || K < 1 || MM < 1 || bad_mask_labels(s, labels, R, K, "mask loss backward")) {
        if (R < 0 || K < 1 || MM < 1)
            ps_error("mask loss backward (cuda): invalid shape R=%d K=%d MM=%d", R, K, MM);
        return PS_EINVAL;
    }
    if (R == 0) return 0;
    const size_t n = (size_t)R * K * MM;
    const double scale = (double)dloss / normaliser;
    DET_LAUNCH(k_det_mask_bce_bwd, n, dlogits, logits, labels, targets, n, K, MM, scale);
    return 0;
}

} // extern "C"
