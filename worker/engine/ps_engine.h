/* The worker's neural-network engine (DESIGN.md section 7).
 *
 * A layer is a pair of plain functions over float pointers, outputs first,
 * dimensions last (llm.c's habit).  Every layer has a CPU implementation
 * (the readable reference, layers/<name>.c) and, later, a CUDA one
 * (layers/<name>.cu) with the SAME signature; a model calls layers only
 * through the backend table (ps_backend_t) chosen once at start, so no layer
 * has an "if (gpu)".
 *
 * Legend:
 *   N   images in the batch (for video: clips * T frames, frame-major within a clip)
 *   T   frames (segments) per clip;  B = N / T clips
 *   C   input channels, K output channels (or classes)
 *   H,W input height/width;  P,Q output height/width
 *   R,S kernel height/width
 * Layout: NCHW, fp32 on the CPU backend.
 *
 * Gradient contract:
 *   - parameter gradients (dw, db, dgamma, dbeta) are ACCUMULATED (+=): the
 *     model zeroes them once per step, so a parameter used several times
 *     (RetinaNet's shared heads) is handled for free;
 *   - input gradients (dinp) are OVERWRITTEN; a NULL dinp means "not needed"
 *     (first layer) and must be accepted.
 * Threads: the CPU backend uses OpenMP for non-GEMM loops and OpenBLAS for
 * GEMM; ps_engine_init() sets both so they never oversubscribe.
 */
#ifndef PS_ENGINE_H
#define PS_ENGINE_H
#include <stddef.h>
#include <stdint.h>

/* ---- tensors and arena --------------------------------------------------- */

typedef enum { PS_LAYOUT_NCHW = 0, PS_LAYOUT_NHWC = 1 } ps_layout_t;
typedef enum { PS_TDT_F32 = 0, PS_TDT_F16 = 1, PS_TDT_BF16 = 2 } ps_tdtype_t;

#define PS_TENSOR_MAX_DIMS 5
typedef struct ps_tensor {
    float *data;               /* into the arena (device memory for CUDA) */
    int ndim;
    int shape[PS_TENSOR_MAX_DIMS];
    ps_tdtype_t dtype;
    ps_layout_t layout;
} ps_tensor_t;

size_t ps_tensor_numel(const ps_tensor_t *t);

/* One allocation per model for parameters, gradients and activations:
 * reserve sizes first (pass 1), then allocate once, then hand out pointers
 * (pass 2) in the same order.  64-byte aligned slices. */
typedef struct ps_arena {
    uint8_t *base;
    size_t size, used;
    int sizing;        /* 1 while only counting */
    void (*release)(void *p); /* frees base; NULL = free() (set by commit) */
} ps_arena_t;
void ps_arena_begin_sizing(ps_arena_t *a);
int ps_arena_commit(ps_arena_t *a);            /* allocate after sizing; PS_ENOMEM */
float *ps_arena_take(ps_arena_t *a, size_t numel); /* NULL while sizing */
void ps_arena_free(ps_arena_t *a);
/* Where ps_arena_commit() takes its one allocation from.  Default (NULL):
 * host posix_memalign, zeroed.  The CUDA backend installs managed memory
 * (ps_cuda_use_managed_arena(), worker/engine/cuda/ps_cuda_backend.h) so a
 * model's arena is reachable from its kernels.  alloc must return zeroed,
 * 64-byte aligned memory or NULL.  Process-wide: set it before creating
 * models; each arena remembers the free function it was allocated with. */
typedef struct ps_arena_allocator {
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
} ps_arena_allocator_t;
void ps_arena_set_allocator(const ps_arena_allocator_t *al);

/* ---- execution context -------------------------------------------------- */

typedef struct ps_ctx {
    int nthreads;          /* threads for OpenMP loops and BLAS */
    float *workspace;      /* scratch for im2col etc. (backend memory) */
    size_t workspace_numel;
    void *backend_state;   /* cuDNN/cuBLAS handles for CUDA */
} ps_ctx_t;

/* Set thread counts (0 = all cores) and make sure OpenBLAS uses a fast
 * kernel on this CPU (see ps_blas.h).  Call once at start. */
int ps_engine_init(ps_ctx_t *ctx, int nthreads);
/* Make sure ctx->workspace holds at least numel floats; PS_ENOMEM. */
int ps_ctx_reserve(ps_ctx_t *ctx, size_t numel);
void ps_ctx_free(ps_ctx_t *ctx);

/* ---- layer descriptors -------------------------------------------------- */

typedef struct ps_conv2d_desc {
    int C, K, R, S;
    int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
    int groups;
} ps_conv2d_desc_t;
/* Output size of a convolution / pooling window along one axis. */
static inline int ps_conv_out(int in, int k, int stride, int pad, int dil)
{
    return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}
/* Floats of ctx->workspace conv2d forward/backward need for this shape. */
size_t ps_conv2d_workspace(const ps_conv2d_desc_t *d, int N, int H, int W);

typedef struct ps_pool_desc {
    int R, S, stride_h, stride_w, pad_h, pad_w;
} ps_pool_desc_t;

/* ---- the backend table: every layer, forward and backward ---------------- */

typedef struct ps_backend {
    const char *name; /* "cpu", "cuda" */

    /* conv2d: inp (N,C,H,W), w (K, C/groups, R, S), b (K) or NULL -> out (N,K,P,Q) */
    void (*conv2d_forward)(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, const ps_conv2d_desc_t *d, int N, int H, int W);
    void (*conv2d_backward)(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w,
                            const ps_conv2d_desc_t *d, int N, int H, int W);

    /* batchnorm2d, training mode: batch statistics (biased var for
     * normalising, unbiased for the running update, PyTorch semantics);
     * saves mean and rstd (C) for backward; updates running stats with
     * momentum (run = (1-m)*run + m*batch). */
    void (*bn_forward_train)(ps_ctx_t *ctx, float *out, float *save_mean, float *save_rstd,
                             float *run_mean, float *run_var, const float *inp,
                             const float *gamma, const float *beta, float eps, float momentum,
                             int N, int C, int HW);
    void (*bn_backward_train)(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                              const float *dout, const float *inp, const float *gamma,
                              const float *save_mean, const float *save_rstd, int N, int C,
                              int HW);
    /* eval / frozen mode: y = gamma*(x-run_mean)/sqrt(run_var+eps) + beta.
     * Backward: dgamma/dbeta may be NULL (frozen affine, TSM partial BN). */
    void (*bn_forward_eval)(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                            const float *beta, const float *run_mean, const float *run_var,
                            float eps, int N, int C, int HW);
    void (*bn_backward_eval)(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                             const float *dout, const float *inp, const float *gamma,
                             const float *run_mean, const float *run_var, float eps, int N,
                             int C, int HW);

    /* relu: out may alias inp; backward uses the output (out > 0), dinp may alias dout */
    void (*relu_forward)(ps_ctx_t *ctx, float *out, const float *inp, size_t n);
    void (*relu_backward)(ps_ctx_t *ctx, float *dinp, const float *dout, const float *out,
                          size_t n);

    /* max pool (N,C,H,W) -> (N,C,P,Q); argmax (int32, index within H*W) saved */
    void (*maxpool_forward)(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                            const ps_pool_desc_t *d, int N, int C, int H, int W);
    void (*maxpool_backward)(ps_ctx_t *ctx, float *dinp, const float *dout,
                             const int32_t *argmax, const ps_pool_desc_t *d, int N, int C,
                             int H, int W);

    /* global average pool (N,C,HW) -> (N,C) */
    void (*avgpool_forward)(ps_ctx_t *ctx, float *out, const float *inp, int N, int C, int HW);
    void (*avgpool_backward)(ps_ctx_t *ctx, float *dinp, const float *dout, int N, int C,
                             int HW);

    /* linear: inp (N,C), w (K,C), b (K) or NULL -> out (N,K)  (PyTorch layout) */
    void (*linear_forward)(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, int N, int C, int K);
    void (*linear_backward)(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w, int N, int C,
                            int K);

    /* dropout (inverted: kept values scaled by 1/(1-p)); mask bytes saved.
     * The mask is a pure function of (seed, element index) via
     * ps_rng_uniform(), so CPU and CUDA draw the same mask. */
    void (*dropout_forward)(ps_ctx_t *ctx, float *out, uint8_t *mask, const float *inp,
                            size_t n, float p, uint64_t seed);
    void (*dropout_backward)(ps_ctx_t *ctx, float *dinp, const float *dout,
                             const uint8_t *mask, size_t n, float p);

    /* softmax cross-entropy over logits (N,K) with int labels: writes probs
     * (N,K) and returns the mean loss over N.  Backward:
     * dlogits = (probs - onehot) * dloss / N. */
    float (*xent_forward)(ps_ctx_t *ctx, float *probs, const float *logits,
                          const int32_t *labels, int N, int K);
    void (*xent_backward)(ps_ctx_t *ctx, float *dlogits, const float *probs,
                          const int32_t *labels, float dloss, int N, int K);

    /* temporal shift (TSM): view (B*T, C, HW) as (B, T, C, HW); with
     * fold = C / fold_div: channels [0,fold) take frame t+1, [fold,2*fold)
     * take frame t-1, zero past the clip ends, the rest unchanged.  Backward
     * is the opposite shift.  out must not alias inp. */
    void (*tshift_forward)(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int C,
                           int HW, int fold_div);
    void (*tshift_backward)(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T,
                            int C, int HW, int fold_div);

    /* segment consensus: mean over T of per-frame logits (B*T,K) -> (B,K) */
    void (*consensus_forward)(ps_ctx_t *ctx, float *out, const float *inp, int B, int T,
                              int K);
    void (*consensus_backward)(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T,
                               int K);

    /* elementwise: out = a + b (residual); may alias either */
    void (*add)(ps_ctx_t *ctx, float *out, const float *a, const float *b, size_t n);
    /* acc += x (gradient of a value used twice) */
    void (*accumulate)(ps_ctx_t *ctx, float *acc, const float *x, size_t n);

    /* ---- optional fused entries: NULL in a backend that lacks them, so a
     * caller checks and falls back to the two separate layers ----------- */
    /* batchnorm (eval / frozen) then relu, one pass over memory instead of
     * two: out = max(0, gamma*(x-run_mean)/sqrt(run_var+eps) + beta); out
     * may alias inp.  Backward takes the gradient w.r.t. the relu output
     * and the relu output itself (as relu_backward) and produces what
     * relu_backward followed by bn_backward_eval would; dinp may alias
     * dout; dgamma/dbeta may be NULL (frozen affine, TSM partial BN). */
    void (*bn_relu_forward_eval)(ps_ctx_t *ctx, float *out, const float *inp,
                                 const float *gamma, const float *beta, const float *run_mean,
                                 const float *run_var, float eps, int N, int C, int HW);
    void (*bn_relu_backward_eval)(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                                  const float *dout, const float *out, const float *inp,
                                  const float *gamma, const float *run_mean,
                                  const float *run_var, float eps, int N, int C, int HW);
    /* dst[0..n) (backend memory: the model's input buffer) = src[0..n)
     * (host memory, any; the caller may reuse src as soon as this returns).
     * NULL: the caller memcpy()s on the host.  Why CUDA has it: the host
     * writing a 38 MB TSM-R50 batch into the managed arena every step costs
     * a host memcpy plus a page migration to the GPU; a copy engine DMA on
     * the stream does both in one pass and leaves the pages on the device. */
    void (*copy_in)(ps_ctx_t *ctx, float *dst, const float *src, size_t n);
} ps_backend_t;

extern const ps_backend_t ps_backend_cpu;

/* Counter-based uniform in [0,1) from (seed, index): the same on every
 * device and thread layout (splitmix64 of seed ^ index*golden). */
static inline float ps_rng_uniform(uint64_t seed, uint64_t index)
{
    uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

#endif
