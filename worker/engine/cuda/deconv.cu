// Transposed convolution whose kernel equals its stride (the deconv slots
// of ps_engine.h; Mask R-CNN's 2 x 2, stride 2) on the GPU, beside its CPU
// reference worker/engine/layers/deconv.c, same signatures; every tensor a
// device (or managed) pointer.  The windows do not overlap, so each output
// pixel is one dot product over the input channels: one thread per output
// element (forward), per input element (input gradient) and per weight
// element (weight gradient, a fixed-order loop over the images and
// pixels: deterministic, no atomics).  Sums run in float in another order
// than the CPU's GEMM: parity to float rounding.
// Legend: N images, C input channels, K output channels, H x W input, s
// the kernel side and stride; w (C,K,s,s) as torch's ConvTranspose2d.
#include "cuda_int.h"

#define DECONV_THREADS 256
#define DECONV_STRIDE(i, n)                                                  \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

// out (N,K,sH,sW); n = N*K*sH*sW
__global__ void k_deconv_fwd(float *out, const float *inp, const float *w, const float *b,
                             size_t n, int C, int K, int H, int W, int s)
{
    DECONV_STRIDE(o, n)
    {
        const int OW = W * s, OH = H * s;
        const int ox = (int)(o % OW), oy = (int)((o / OW) % OH);
        const size_t nk = o / ((size_t)OW * OH);
        const int k = (int)(nk % K);
        const size_t img = nk / K;
        const int y = oy / s, x = ox / s, ij = (oy % s) * s + ox % s;
        const float *in = inp + img * C * H * W + (size_t)y * W + x;
        float acc = 0.0f;
        for (int c = 0; c < C; c++)
            acc += in[(size_t)c * H * W] * w[((size_t)c * K + k) * s * s + ij];
        out[o] = acc + (b ? b[k] : 0.0f);
    }
}

// dinp (N,C,H,W) = sum over k, i, j of dout * w; n = N*C*H*W
__global__ void k_deconv_bwd_data(float *dinp, const float *dout, const float *w, size_t n,
                                  int C, int K, int H, int W, int s)
{
    DECONV_STRIDE(e, n)
    {
        const int x = (int)(e % W), y = (int)((e / W) % H);
        const size_t nc = e / ((size_t)W * H);
        const int c = (int)(nc % C);
        const size_t img = nc / C;
        const int OW = W * s;
        const float *d = dout + img * K * H * W * s * s;
        float acc = 0.0f;
        for (int k = 0; k < K; k++)
            for (int i = 0; i < s; i++)
                for (int j = 0; j < s; j++)
                    acc += d[((size_t)k * H * s + (size_t)s * y + i) * OW + s * x + j] *
                           w[(((size_t)c * K + k) * s + i) * s + j];
        dinp[e] = acc;
    }
}

// dw (C,K,s,s) += sum over images and pixels of inp * dout; n = C*K*s*s
__global__ void k_deconv_bwd_w(float *dw, const float *dout, const float *inp, size_t n, int N,
                               int C, int K, int H, int W, int s)
{
    DECONV_STRIDE(e, n)
    {
        const int j = (int)(e % s), i = (int)((e / s) % s);
        const size_t ck = e / ((size_t)s * s);
        const int k = (int)(ck % K), c = (int)(ck / K);
        const int OW = W * s;
        float acc = 0.0f;
        for (int img = 0; img < N; img++) {
            const float *in = inp + ((size_t)img * C + c) * H * W;
            const float *d = dout + ((size_t)img * K + k) * H * W * s * s;
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    acc += in[(size_t)y * W + x] * d[(size_t)(s * y + i) * OW + s * x + j];
        }
        dw[e] += acc;
    }
}

// db (K) += the sum of dout over the images and output pixels; n = K
__global__ void k_deconv_bwd_b(float *db, const float *dout, size_t n, int N, int HWo)
{
    DECONV_STRIDE(k, n)
    {
        float acc = 0.0f;
        for (int img = 0; img < N; img++) {
            const float *d = dout + ((size_t)img * n + k) * HWo;
            for (int p = 0; p < HWo; p++) acc += d[p];
        }
        db[k] += acc;
    }
}

// ---- launchers -----------------------------------------------------------------------

#define DECONV_LAUNCH(kernel, n, ...)                                                       \
    do {                                                                                    \
        kernel<<<cu_grid((n), DECONV_THREADS), DECONV_THREADS, 0, s->stream>>>(__VA_ARGS__);\
        CU_LAUNCHED();                                                                      \
    } while (0)

static int deconv_ok(const char *who, int N, int C, int K, int H, int W, int sd)
{
    if (N > 0 && C > 0 && K > 0 && H > 0 && W > 0 && sd > 0) return 1;
    ps_error("%s (cuda): invalid shape N=%d C=%d K=%d %dx%d stride %d", who, N, C, K, H, W, sd);
    return 0;
}

extern "C" {

void ps_cu_deconv_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                          const float *b, int N, int C, int K, int H, int W, int sd)
{
    ps_cu_state *s = cu_state(ctx);
    if (!deconv_ok("deconv", N, C, K, H, W, sd)) return;
    if (ps_cu_is_half(s, inp)) {
        ps_cu_half_mismatch("deconv (fp32 only)");
        return;
    }
    const size_t n = (size_t)N * K * H * W * sd * sd;
    DECONV_LAUNCH(k_deconv_fwd, n, out, inp, w, b, n, C, K, H, W, sd);
}

void ps_cu_deconv_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, int N, int C, int K, int H, int W,
                           int sd)
{
    ps_cu_state *s = cu_state(ctx);
    if (!deconv_ok("deconv backward", N, C, K, H, W, sd)) return;
    if (dinp) {
        const size_t n = (size_t)N * C * H * W;
        DECONV_LAUNCH(k_deconv_bwd_data, n, dinp, dout, w, n, C, K, H, W, sd);
    }
    if (dw) {
        const size_t n = (size_t)C * K * sd * sd;
        DECONV_LAUNCH(k_deconv_bwd_w, n, dw, dout, inp, n, N, C, K, H, W, sd);
    }
    if (db) DECONV_LAUNCH(k_deconv_bwd_b, (size_t)K, db, dout, (size_t)K, N, H * W * sd * sd);
}

} // extern "C"
