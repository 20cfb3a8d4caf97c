/* The worker's neural-network engine: layers, the backend tables that
 * implement them, the devices that hand out a table, and the per-model arena.
 *
 * A layer is a pair of plain functions over float pointers, outputs first,
 * dimensions last (llm.c's habit).  Every layer has a CPU implementation
 * (the readable reference, worker/engine/layers/<name>.c) and a CUDA one
 * (worker/engine/cuda/<name>.cu, built when configure finds the toolkit)
 * with the SAME signature; a model calls layers only through the backend
 * table (ps_backend_t) that opening its device returned, so no layer and no
 * caller has an "if (gpu)".
 *
 * Legend:
 *   N   images in the batch (for video: clips * T frames, frame-major within a clip)
 *   T   frames (segments) per clip;  B = N / T clips
 *   C   input channels, K output channels (or classes)
 *   H,W input height/width;  P,Q output height/width
 *   R,S kernel height/width
 * Layout: NCHW, fp32 on the CPU backend.  The 3-D video layers (their own
 * block of the table, legend there) take clips as NCDHW. 
 *
 * Gradient contract:
 *   - parameter gradients (dw, db, dgamma, dbeta) are ACCUMULATED (+=): the
 *     model zeroes them once per step, so a parameter used several times
 *     (RetinaNet's shared heads) is handled for free;
 *   - input gradients (dinp) are OVERWRITTEN; a NULL dinp means "not needed"
 *     (first layer) and must be accepted.
 * Threads: the CPU backend uses one OpenMP team for its loops, its GEMM
 * slices (oneDNN's sgemm or OpenBLAS, single-threaded inside each) and
 * oneDNN's convolutions (Debian's oneDNN runs on OpenMP too);
 * ps_engine_init() sets it so nothing oversubscribes.  Which convolution
 * kernel runs is chosen per layer shape (ps_engine_set_conv_kernels below,
 * worker/engine/layers/conv_provider.h).
 */
#ifndef PS_ENGINE_H
#define PS_ENGINE_H
#include <stddef.h>
#include <stdint.h>

/* ---- arena ------------------------------------------------------------- */

/* One allocation per model for parameters, gradients and activations:
 * reserve sizes first (pass 1), then allocate once, then hand out pointers
 * (pass 2) in the same order.  64-byte aligned slices. */
typedef struct ps_arena {
    uint8_t *base;
    size_t size, used;
    int sizing;        /* 1 while only counting */
    size_t act_bytes;  /* bytes of one activation element (ps_arena_take_act);
                          0 = sizeof(float).  Set before sizing, from the
                          backend's act_elsize; kept by begin_sizing */
    void (*release)(void *p); /* frees base; NULL = free() (set by commit) */
} ps_arena_t;
void ps_arena_begin_sizing(ps_arena_t *a);
int ps_arena_commit(ps_arena_t *a);            /* allocate after sizing; PS_ENOMEM */
float *ps_arena_take(ps_arena_t *a, size_t numel); /* NULL while sizing */
/* A slot for numel activations or activation gradients: numel *
 * a->act_bytes bytes (a half-storage backend writes 2-byte elements into
 * it through the same float * type; the host never reads such a slot).
 * Parameters, gradients, statistics, the model input and whatever the host
 * reads (logits, losses) take ps_arena_take. */
float *ps_arena_take_act(ps_arena_t *a, size_t numel);
/* A view of numel_bytes at base (already taken from an arena) that hands
 * out slots as an arena does (same alignment, same act_bytes), so one
 * region can be laid out several times over: model parts that are never
 * live together share it.  base NULL: sizing only (used counts). */
void ps_arena_view(ps_arena_t *view, const ps_arena_t *parent, void *base, size_t bytes);
void ps_arena_free(ps_arena_t *a);
/* Bytes of every arena committed and not yet freed in this process (any
 * thread; psworker's /metrics reports it). */
size_t ps_arena_bytes(void);
/* Where ps_arena_commit() takes its one allocation from.  Default (NULL):
 * host posix_memalign, zeroed.  Opening a CUDA device (ps_device_cuda,
 * worker/engine/cuda/ps_cuda_backend.h) installs managed memory so a
 * model's arena is reachable from its kernels.  alloc must return zeroed,
 * 64-byte aligned memory or NULL.  Process-wide: set it before creating
 * models; each arena remembers the free function it was allocated with. */
typedef struct ps_arena_allocator {
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
} ps_arena_allocator_t;
void ps_arena_set_allocator(const ps_arena_allocator_t *al);

/* ---- execution context -------------------------------------------------- */

struct ps_bn_group;

typedef struct ps_ctx {
    int nthreads;          /* threads for OpenMP loops and BLAS */
    float *workspace;      /* host scratch of the CPU layers (im2col columns) */
    size_t workspace_numel;
    void *backend_state;   /* what opening the device put here (CUDA: handles,
                              stream, caches); freed by the backend's release */
    void *cpu_state;       /* the CPU layers' own (precision, oneDNN primitives
                              and buffers), made on first use; ps_ctx_free frees it */
    /* Cross-worker BN (--bn sync): when set, every training-mode BN
     * (bn_forward_train / bn_backward_train, either backend) combines its
     * per-channel statistics and backward sums over this group; NULL =
     * each process's own batch.  Owned by the caller (ps_bn_group_t below). */
    struct ps_bn_group *bn_group;
} ps_ctx_t;

/* ---- cross-worker batch norm: the group -------------------------------- */

/* The processes whose batches normalise as one (W workers x B samples as
 * one batch of W*B).  The engine needs one collective from it: gather,
 * which hands every rank the vectors of all ranks; the BN layers reduce
 * them themselves, in rank order and in double precision, so every rank
 * gets the same bits whatever the transport (TCP ring, NCCL) and the sums
 * are as exact as the local ones.  That is also PyTorch's SyncBatchNorm:
 * an all_gather of each rank's (mean, invstd, count), combined per channel
 * (batch_norm_gather_stats_with_counts).  Per BN layer a training forward
 * makes one gather (count, mean, M2 per channel) and its backward one
 * (count, sum dy, sum dy*xhat per channel). */
typedef struct ps_bn_group {
    int rank, size;        /* this process's place in the group, W */
    /* all[r*n .. r*n+n) := rank r's mine[0..n), every rank r, bit for bit;
     * host memory; every rank calls it with the same n, in the same order.
     * 0 or PS_E* (logged by the transport). */
    int (*gather)(void *arg, const float *mine, float *all, size_t n);
    void *arg;
    /* The first failure (sticky: the BN layers return nothing).  Once set,
     * no BN communicates again and each uses its own batch, so a broken
     * group never hangs a step; whoever ran the step checks it
     * (ps_bn_group_failed) and fails the step with it. */
    int err;
    uint64_t gathers;      /* collectives made so far */
    float *buf;            /* scratch of the packing below */
    size_t cap;
} ps_bn_group_t;

/* Forward: this rank's element count M (N*HW) and per-channel mean and M2
 * (sum of squared deviations from that mean) in; the group's in place
 * (count, mean and M2 of the union, Chan et al.'s pairwise combination in
 * rank order).  Backward: this rank's per-channel sums a, b (sum dy,
 * sum dy*xhat) in, the group's in place, and *M := the group's count.
 * Values travel as pairs of floats (hi, lo), so what arrives is the double
 * to about 2^-48.  0, or the group's error (logged; the arguments keep
 * this rank's values). */
int ps_bn_group_moments(ps_bn_group_t *g, int C, double *M, double *mean, double *m2);
int ps_bn_group_sums(ps_bn_group_t *g, int C, double *M, double *a, double *b);
/* The group's first error (0 none; a NULL group never fails). */
int ps_bn_group_failed(const ps_bn_group_t *g);
void ps_bn_group_free_buf(ps_bn_group_t *g);

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

/* 3-D (video) layers: clips of D frames, NCDHW (legend of the 3-D slots
 * below).  Output size per axis: ps_conv_out(). */
typedef struct ps_conv3d_desc {
    int C, K;          /* input / output channels */
    int KT, R, S;      /* kernel: frames, height, width */
    int stride_t, stride_h, stride_w, pad_t, pad_h, pad_w, dil_t, dil_h, dil_w;
    int groups;
} ps_conv3d_desc_t;
/* Floats of ctx->workspace conv3d forward/backward need for this shape on
 * the CPU backend (0 for an invalid one). */
size_t ps_conv3d_workspace(const ps_conv3d_desc_t *d, int N, int D, int H, int W);

typedef struct ps_pool3d_desc {
    int KT, R, S;      /* window: frames, height, width */
    int stride_t, stride_h, stride_w, pad_t, pad_h, pad_w;
    int count_include_pad; /* average pool: divide by the whole window, padding
                              included (1, PyTorch's default) or by the part
                              inside the input (0) */
} ps_pool3d_desc_t;
/* 1 when d and the shape make a valid 3-D convolution / pooling window
 * (pooling: padding at most half the window, PyTorch's rule); else 0 with
 * one error line naming `who` (the layer and backend).  Both backends
 * check their arguments with these. */
int ps_conv3d_check(const char *who, const ps_conv3d_desc_t *d, int N, int D, int H, int W);
int ps_pool3d_check(const char *who, const ps_pool3d_desc_t *d, int N, int C, int D, int H,
                    int W);

/* ---- precisions and device memory figures ------------------------------- */

/* Compute precision of conv2d and linear (set_precision below). */
typedef enum {
    PS_PRECISION_FP32 = 0,
    PS_PRECISION_FP16 = 1,
    PS_PRECISION_BF16 = 2
} ps_precision_t;
static inline const char *ps_precision_name(ps_precision_t p)
{
    return p == PS_PRECISION_FP32   ? "fp32"
           : p == PS_PRECISION_FP16 ? "fp16"
           : p == PS_PRECISION_BF16 ? "bf16"
                                    : "(unknown precision)";
}

/* Device memory figures, bytes.  alloc_*: what the backend allocated
 * itself (model arenas, workspaces, scratch), with a high-water mark kept
 * on every allocation, so it is exact whenever the peak happens.  dev_*:
 * the device's total - free, which adds the runtime's context, library
 * internals and other processes; its peak is over the mem_stats calls
 * (sample where usage is highest, e.g. after a step's backward). */
typedef struct ps_backend_mem {
    size_t alloc_now, alloc_peak;
    size_t dev_used, dev_used_peak, dev_total;
} ps_backend_mem_t;

/* ---- the backend table: device control and every layer ------------------ */

/* Every backend fills every slot (the CPU's device-control slots are cheap
 * no-ops), so callers never test a slot for NULL nor a backend's name; the
 * exceptions are the "optional" entries at the end.  A table comes from
 * ps_engine_open_device() (below), which checks that it is complete. */
typedef struct ps_backend {
    const char *name; /* "cpu", "cuda": for logs only */

    /* ---- device control ------------------------------------------------ */
    /* 1 when layer calls are queued (on a stream) and return at once: the
     * host must call sync before it reads or writes anything a layer
     * touched.  0: every layer has finished when it returns. */
    int async;
    /* Wait for every queued layer.  0 or PS_E* (logged). */
    int (*sync)(ps_ctx_t *ctx);
    /* Compute precision of conv2d and linear (fp16 / bf16: half operands,
     * fp32 accumulation; BN statistics, parameters and the loss stay fp32).
     * 0; PS_EUNSUPPORTED (logged) when the backend cannot; PS_EINVAL. */
    int (*set_precision)(ps_ctx_t *ctx, ps_precision_t precision);
    /* Loss scaling: 0 when the backend multiplies xent_backward's dloss by
     * `scale` itself (every gradient then comes out scaled, which fp16
     * backward needs); PS_EUNSUPPORTED (not logged: not an error) when the
     * caller must scale the gradients after backward; PS_EINVAL (logged)
     * for a scale that is not finite and > 0. */
    int (*set_loss_scale)(ps_ctx_t *ctx, float scale);
    /* Completion events for the per-layer gradient hand-off: n reusable
     * slots (n = 0 frees them).  record: slot fires when every layer queued
     * so far has finished; query: 1 done, 0 pending, < 0 PS_E*; wait:
     * block until it fired.  Re-recording a slot is fine once its wait
     * returned.  0 or PS_E*; events returns PS_EUNSUPPORTED (logged at
     * info) when the device cannot hand gradients over while it computes.
     * A synchronous backend's slots are always complete. */
    int (*events)(ps_ctx_t *ctx, int n);
    int (*event_record)(ps_ctx_t *ctx, int slot);
    int (*event_query)(ps_ctx_t *ctx, int slot);
    int (*event_wait)(ps_ctx_t *ctx, int slot);
    /* Device memory figures into *m; reset_peak != 0 then starts a new peak
     * window (alloc_peak = alloc_now, dev_used_peak = 0).  0, or
     * PS_EUNSUPPORTED (not logged, *m zeroed) without device memory. */
    int (*mem_stats)(ps_ctx_t *ctx, ps_backend_mem_t *m, int reset_peak);
    /* Bytes per element the backend stores an activation or activation
     * gradient in at its current precision (set_precision): 4, or 2 with
     * the CUDA backend's half storage.  Models size those arena slots with
     * it (ps_arena_take_act), so half storage takes half the bytes. */
    size_t (*act_elsize)(ps_ctx_t *ctx);
    /* Free what opening the device put into ctx->backend_state (NULLs it);
     * the caller syncs first.  ps_ctx_free() frees the rest of ctx. */
    void (*release)(ps_ctx_t *ctx);

    /* ---- video / classification layers --------------------------------- */
    /* conv2d: inp (N,C,H,W), w (K, C/groups, R, S), b (K) or NULL -> out (N,K,P,Q) */
    void (*conv2d_forward)(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, const ps_conv2d_desc_t *d, int N, int H, int W);
    void (*conv2d_backward)(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w,
                            const ps_conv2d_desc_t *d, int N, int H, int W);

    /* batchnorm2d, training mode: batch statistics (biased var for
     * normalising, unbiased for the running update, PyTorch semantics);
     * saves mean and rstd (C) for backward; updates running stats with
     * momentum (run = (1-m)*run + m*batch).  With ctx->bn_group the batch
     * is the group's (statistics over every rank's N*HW values, unbiased
     * variance with the group's count; the backward's mean(dy) and
     * mean(dy*xhat) likewise), as PyTorch's SyncBatchNorm; dgamma / dbeta
     * stay this rank's own sums (the gradient average over the workers
     * makes them the whole batch's). */
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
    /* Recomputation (--recompute): the output a training forward wrote,
     * from its saved statistics: out = (inp - save_mean) * save_rstd *
     * gamma + beta with bn_forward_train's own rounding, so the result is
     * that forward's output bit for bit; nothing else changes (no running
     * statistics, no group). */
    void (*bn_forward_saved)(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                             const float *beta, const float *save_mean, const float *save_rstd,
                             int N, int C, int HW);
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
     * dlogits = (probs - onehot) * dloss / N, dloss times the loss scale on
     * a backend whose set_loss_scale returned 0. */
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

    /* ---- detection layers (RetinaNet-FPN) ------------------------------ *
     * Legend: H,W the coarser (top-down) map, P,Q the lateral map; A
     * anchors (all locations and shapes of an image or a batch, flat); K
     * foreground classes (sigmoid, no background column).  Labels, one
     * int32 per anchor (Detectron's convention; ps_det_make_targets,
     * worker/det/det_boxes.h, makes them): -1 ignore (no loss, no
     * gradient), 0 background (every class target 0), c in 1..K foreground
     * of class c.  Losses and counts are host values, so the slots that
     * return them wait for the device on an asynchronous backend. */
    /* FPN top-down merge: out (N,C,P,Q) = lateral (N,C,P,Q) + nearest
     * upsample of top (N,C,H,W) to P x Q, torch's "nearest" (source row =
     * P == 2H ? p/2 : min(floor(p * (float)H/P), H-1)), so torchvision's FPN
     * (odd lateral sizes included) is matched exactly.  out may alias
     * lateral.  Backward: dlateral = dout (may be NULL or alias dout); dtop
     * = the sum of dout over the pixels each top pixel was copied to
     * (overwritten; may be NULL). */
    void (*upsample_add_forward)(ps_ctx_t *ctx, float *out, const float *lateral,
                                 const float *top, int N, int C, int H, int W, int P, int Q);
    void (*upsample_add_backward)(ps_ctx_t *ctx, float *dlateral, float *dtop,
                                  const float *dout, int N, int C, int H, int W, int P, int Q);
    /* Anchors with label >= 1 (the losses' normaliser is max(1, that),
     * summed over the batch by the caller). */
    int (*count_pos)(ps_ctx_t *ctx, const int32_t *labels, int A);
    /* Sigmoid focal loss (Lin et al. 2017; torchvision.ops.sigmoid_focal_loss,
     * reduction "sum") over logits (A,K), divided by normaliser:
     *   loss = sum_{a: label != -1} sum_k FL(logits[a,k], t[a,k]) / normaliser
     *   FL(x,t) = alpha_t (1-p_t)^gamma BCEwithlogits(x,t),  p = sigmoid(x)
     * log-sigmoid computed stably (|x| up to 1e4 stays finite).  A label
     * outside -1..K: PS_EINVAL (logged), *loss = NaN, nothing written.
     * Backward: dlogits (A,K) = dloss * d(loss)/d(logits), overwritten, 0
     * on ignored anchors; the same label check. */
    int (*focal_forward)(ps_ctx_t *ctx, float *loss, const float *logits,
                         const int32_t *labels, float alpha, float gamma, float normaliser,
                         int A, int K);
    int (*focal_backward)(ps_ctx_t *ctx, float *dlogits, const float *logits,
                          const int32_t *labels, float dloss, float alpha, float gamma,
                          float normaliser, int A, int K);
    /* Smooth-L1 on the box deltas pred, target (A,4) of the positive
     * anchors (label >= 1) only, torch.nn.functional.smooth_l1_loss
     * (reduction "sum", beta) divided by normaliser:
     *   s(d) = |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta
     * Backward: dpred (A,4) overwritten, 0 on non-positive anchors. */
    void (*smoothl1_forward)(ps_ctx_t *ctx, float *loss, const float *pred,
                             const float *target, const int32_t *labels, float beta,
                             float normaliser, int A);
    void (*smoothl1_backward)(ps_ctx_t *ctx, float *dpred, const float *pred,
                              const float *target, const int32_t *labels, float dloss,
                              float beta, float normaliser, int A);
    /* Head output layout, per image: inp (nA*D, H, W) (a conv output,
     * channel a*D + d) -> out (H, W, nA, D), the anchor-major (H*W*nA, D)
     * rows anchors, labels and the losses use (torchvision's
     * view(N,-1,D,H,W).permute(0,3,4,1,2)); D = K for classification, 4 for
     * boxes.  Backward is the inverse permute (overwrites). */
    void (*head_permute_forward)(ps_ctx_t *ctx, float *out, const float *inp, int nA, int D,
                                 int H, int W);
    void (*head_permute_backward)(ps_ctx_t *ctx, float *dinp, const float *dout, int nA,
                                  int D, int H, int W);

    /* ---- 3-D video layers (I3D, R3D, MC3, R(2+1)D) -------------------- *
     * Legend: N clips, C / K channels, D x H x W input (frames, height,
     * width), O x P x Q output; KT x R x S kernel or window.  Layout
     * NCDHW fp32: a channel of a clip is one contiguous D*H*W block, so BN
     * over (N, T, H, W) is the batch-norm slots above with HW = D*H*W and
     * the global average pool over T x H x W is avgpool_forward with HW =
     * D*H*W (no slots of their own).  Same gradient contract as above. */
    /* conv3d: inp (N,C,D,H,W), w (K, C/groups, KT, R, S), b (K) or NULL ->
     * out (N,K,O,P,Q); cross-correlation as torch.nn.functional.conv3d */
    void (*conv3d_forward)(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, const ps_conv3d_desc_t *d, int N, int D, int H,
                           int W);
    void (*conv3d_backward)(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w,
                            const ps_conv3d_desc_t *d, int N, int D, int H, int W);
    /* max pool (N,C,D,H,W) -> (N,C,O,P,Q): padding never wins, a NaN does
     * (PyTorch); argmax (int32, index within D*H*W) saved for backward,
     * where overlapping windows add.  pad <= half the window per axis. */
    void (*maxpool3d_forward)(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W);
    void (*maxpool3d_backward)(ps_ctx_t *ctx, float *dinp, const float *dout,
                               const int32_t *argmax, const ps_pool3d_desc_t *d, int N, int C,
                               int D, int H, int W);
    /* windowed average pool (N,C,D,H,W) -> (N,C,O,P,Q), divisor per
     * d->count_include_pad (torch.nn.functional.avg_pool3d) */
    void (*avgpool3d_forward)(ps_ctx_t *ctx, float *out, const float *inp,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W);
    void (*avgpool3d_backward)(ps_ctx_t *ctx, float *dinp, const float *dout,
                               const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W);
    /* ---- two-stage detection layers (Faster R-CNN; Mask / Cascade R-CNN
     * reuse them) ------------------------------------------------------- *
     * RoIAlign as torchvision.ops.roi_align (0.14) on one feature map:
     * feat (N,C,H,W); rois (R,5), rows (batch index, x1, y1, x2, y2) in
     * input-image pixels as floats (torchvision's RoI format); out
     * (R,C,PH,PW).  A box maps onto the map by spatial_scale (1 / stride).
     * aligned 0 (torchvision's default): no half-pixel shift, RoIs smaller
     * than one map pixel grow to 1 x 1; aligned 1: a -0.5 shift, no minimum.
     * sampling_ratio > 0: that many points per bin and axis; 0: ceil(RoI
     * size / bins) per axis (adaptive).  Each point is bilinear in the map;
     * a point more than one pixel off the map counts 0, one nearer is
     * clamped to the edge; the bin is the mean of its points.  A batch index
     * outside 0..N-1 gives zero rows and no gradient.  Backward is the
     * transpose and ACCUMULATES into dfeat (+=, torchvision's scatter-add):
     * unlike the other layers' input gradients, so the RoIs of several calls
     * (one per FPN level) and the map's other consumers add up; the caller
     * zeroes or pre-fills dfeat. */
    void (*roi_align_forward)(ps_ctx_t *ctx, float *out, const float *feat, const float *rois,
                              int R, int N, int C, int H, int W, int PH, int PW,
                              float spatial_scale, int sampling_ratio, int aligned);
    void (*roi_align_backward)(ps_ctx_t *ctx, float *dfeat, const float *dout,
                               const float *rois, int R, int N, int C, int H, int W, int PH,
                               int PW, float spatial_scale, int sampling_ratio, int aligned);
    /* Mask R-CNN's mask predictor: a transposed convolution whose kernel
     * equals its stride s (no padding, so the windows do not overlap:
     * torch ConvTranspose2d(C, K, s, stride=s), 2 x 2 in Mask R-CNN).
     * inp (N,C,H,W), w (C,K,s,s) (torch's layout), b (K) or NULL -> out
     * (N,K,sH,sW): out[n,k,s*y+i,s*x+j] = b[k] + sum_c inp[n,c,y,x] w[c,k,i,j].
     * Backward: the usual gradient contract. */
    void (*deconv_forward)(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, int N, int C, int K, int H, int W, int s);
    void (*deconv_backward)(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w, int N, int C,
                            int K, int H, int W, int s);
    /* Mask R-CNN's mask loss (torchvision maskrcnn_loss): binary
     * cross-entropy with logits on each row's target channel only, logits
     * (R,K,MM), labels (R) in 0..K-1 (the channel of row r), targets
     * (R,MM) in [0,1]:
     *   loss = sum_r sum_p BCEwithlogits(logits[r,labels[r],p], targets[r,p]) / normaliser
     * (torchvision's mean: normaliser R*MM; R = 0 gives 0).  Stable for any
     * finite logit.  A label outside 0..K-1: PS_EINVAL (logged), *loss =
     * NaN.  Backward: dlogits (R,K,MM) = dloss * d(loss)/d(logits),
     * overwritten, 0 on every channel but the target's; the same check. */
    int (*mask_bce_forward)(ps_ctx_t *ctx, float *loss, const float *logits,
                            const int32_t *labels, const float *targets, float normaliser,
                            int R, int K, int MM);
    int (*mask_bce_backward)(ps_ctx_t *ctx, float *dlogits, const float *logits,
                             const int32_t *labels, const float *targets, float dloss,
                             float normaliser, int R, int K, int MM);
    /* x *= alpha in place, n floats (Cascade R-CNN scales the gradient of
     * each stage's pooled features by 1 / stages, Detectron2's
     * _ScaleGradient) */
    void (*scale)(ps_ctx_t *ctx, float *x, float alpha, size_t n);

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
     * Optional: NULL (the CPU's) means the caller memcpy()s on the host.  Why CUDA has it: the host
     * writing a 38 MB TSM-R50 batch into the managed arena every step costs
     * a host memcpy plus a page migration to the GPU; a copy engine DMA on
     * the stream does both in one pass and leaves the pages on the device. */
    void (*copy_in)(ps_ctx_t *ctx, float *dst, const float *src, size_t n);
} ps_backend_t;

extern const ps_backend_t ps_backend_cpu;

/* 0 when every slot but the optional ones is filled; else PS_EINVAL with
 * one line per empty slot logged.  ps_engine_open_device() runs it on the
 * table a device hands out; tests run it on theirs. */
int ps_engine_check_backend(const ps_backend_t *be);

/* ---- the CPU backend's convolution kernels -------------------------------- */

/* How the CPU backend picks a convolution kernel per layer shape and
 * direction (worker/engine/layers/conv_provider.h): "auto" or NULL (the
 * default: each candidate -- im2col + GEMM, oneDNN -- is timed on the first
 * call of each shape and the fastest kept for the process), or a row name,
 * "gemm" or "onednn", for that row wherever it can (runs that must match
 * bit for bit across processes; the measured choice may differ between
 * two processes on a busy machine).  PS_CONV_KERNELS in the environment is
 * the same setting.  0, or PS_EINVAL for an unknown name (logged). */
int ps_engine_set_conv_kernels(const char *mode);
/* The CPU convolution kernels that ran in this process, in calls per
 * direction ("fwd gemm:im2col+sgemm(oneDNN) 120, onednn:jit:avx2 40;
 * bwd-data ..."), into buf; "no convolution yet" when none ran. */
const char *ps_engine_conv_kernels(char *buf, size_t len);

/* 1 when the CPU backend can compute at `precision` on this machine (fp32
 * always; bf16 with oneDNN on a CPU with AVX-512 BF16 or AMX; fp16 never),
 * else 0 with the reason in why: what set_precision would refuse, asked
 * before any model exists (option checks). */
int ps_engine_cpu_precision_ok(ps_precision_t precision, char *why, size_t len);

/* ---- devices: the rows --device strings name ----------------------------- */

/* A kind of device.  open: make device `index` of this kind usable through
 * ctx (after ps_engine_init; it may set ctx->backend_state and process-wide
 * state such as the arena allocator) and set *be to its table; on failure
 * log the cause, leave ctx as it was and return PS_E*. */
typedef struct ps_device {
    const char *name; /* the kind, as in "--device NAME[:N]" */
    const char *what; /* what opening it gives, for the log line */
    int (*open)(ps_ctx_t *ctx, int index, const ps_backend_t **be);
} ps_device_t;

/* Add a row (the CPU's, "cpu", is always there); the program that parses
 * --device adds the ones it links (ps_device_cuda in CUDA builds).  At
 * start, before any thread uses the table.  0 (also when d is already
 * there), PS_EINVAL (a bad row or another row of that name, logged),
 * PS_ENOMEM (table full, logged). */
int ps_engine_add_device(const ps_device_t *d);
/* Parse spec ("KIND" = "KIND:0", or "KIND:N", N in 0..1023) and find its
 * row, without opening anything: *d and *index (either may be NULL).  0,
 * or PS_EINVAL with one line logged naming the spec and the known kinds
 * ("this build has no CUDA backend" for "cuda" without its row). */
int ps_engine_find_device(const char *spec, const ps_device_t **d, int *index);
/* Find spec's row and open it: on success *be is the device's table
 * (checked complete) and one line says what was opened ("device cuda:0:
 * CUDA backend, ...").  On failure *be is untouched, ctx as it was, one
 * line names the device; returns PS_EINVAL (bad or unknown spec, or an
 * incomplete table) or the open's error. */
int ps_engine_open_device(const char *spec, ps_ctx_t *ctx, const ps_backend_t **be);

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
