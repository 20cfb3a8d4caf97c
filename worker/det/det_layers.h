/* Detection layers (issue 6), CPU reference: FPN upsample-add, sigmoid focal
 * loss, smooth-L1 on box deltas, and the head-output permute.  Plain
 * functions in the engine's style (worker/engine/ps_engine.h): outputs
 * first, dimensions last; parameter gradients accumulate, input gradients are
 * OVERWRITTEN and a NULL input gradient means "not needed".  RetinaNet calls
 * them (or their CUDA versions below) through its own table,
 * ps_retina_det_t (worker/models/ps_retinanet.h).  Box geometry (anchors,
 * coding, matching, NMS, inference post-processing) lives in det_boxes.h.
 *
 * Legend:
 *   N  images;  C channels
 *   H,W  size of the coarser (top-down) map;  P,Q  size of the lateral map
 *   A  anchors (all locations and shapes of one image, or of a batch, flat)
 *   K  foreground classes (no background column: sigmoid, one per class)
 *
 * Classification labels, one int32 per anchor (Detectron's convention):
 *   -1 ignore (IoU between the thresholds: no loss, no gradient)
 *    0 background (every class target 0)
 *    c in 1..K  foreground of class c (target 1 in column c-1, 0 elsewhere)
 * ps_det_make_targets() (det_boxes.h) produces them from an assignment.
 */
#ifndef PS_DET_LAYERS_H
#define PS_DET_LAYERS_H
#include <stdint.h>

/* FPN top-down merge: out (N,C,P,Q) = lateral (N,C,P,Q) + nearest-upsample
 * of top (N,C,H,W) to P x Q.  Nearest as torch.nn.functional.interpolate
 * (mode="nearest", size=(P,Q)): source row = P == 2H ? p/2 :
 * min(floor(p * (float)H/P), H-1), so torchvision's FPN (which interpolates
 * to the lateral's size, odd sizes included) is matched exactly.  out may
 * alias lateral. */
void ps_det_upsample_add_forward(float *out, const float *lateral, const float *top, int N,
                                 int C, int H, int W, int P, int Q);
/* dlateral (N,C,P,Q) = dout (may be NULL or alias dout); dtop (N,C,H,W) =
 * sum of dout over the pixels each top pixel was copied to (overwritten;
 * may be NULL). */
void ps_det_upsample_add_backward(float *dlateral, float *dtop, const float *dout, int N,
                                  int C, int H, int W, int P, int Q);

/* Number of anchors with label >= 1 (the focal/smooth-L1 normaliser is
 * max(1, that), summed over the batch by the caller). */
int ps_det_count_pos(const int32_t *labels, int A);

/* Sigmoid focal loss (Lin et al. 2017; torchvision.ops.sigmoid_focal_loss,
 * reduction "sum"), divided by `normaliser`:
 *   loss = sum_{a: label!=-1} sum_k FL(logits[a,k], t[a,k]) / normaliser
 *   FL(x,t) = alpha_t (1-p_t)^gamma BCEwithlogits(x,t),  p = sigmoid(x)
 * with log-sigmoid computed stably (softplus), so |x| up to 1e4 is finite.
 * logits (A,K).  Labels outside -1..K are rejected: returns PS_EINVAL and
 * *loss = NaN.  Returns 0. */
int ps_det_focal_forward(float *loss, const float *logits, const int32_t *labels, float alpha,
                         float gamma, float normaliser, int A, int K);
/* dlogits (A,K) = dloss * d(loss)/d(logits) (overwritten; 0 on ignored
 * anchors).  Same label check as forward (returns PS_EINVAL). */
int ps_det_focal_backward(float *dlogits, const float *logits, const int32_t *labels,
                          float dloss, float alpha, float gamma, float normaliser, int A,
                          int K);

/* Smooth-L1 on box deltas of the positive anchors (label >= 1) only:
 *   loss = sum_{a pos} sum_{j<4} s(pred[a,j] - target[a,j]) / normaliser
 *   s(d) = |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta     (beta = 1/9)
 * as torch.nn.functional.smooth_l1_loss(reduction="sum", beta).
 * pred, target (A,4). */
void ps_det_smoothl1_forward(float *loss, const float *pred, const float *target,
                             const int32_t *labels, float beta, float normaliser, int A);
/* dpred (A,4) overwritten, 0 on non-positive anchors. */
void ps_det_smoothl1_backward(float *dpred, const float *pred, const float *target,
                              const int32_t *labels, float dloss, float beta, float normaliser,
                              int A);

/* Head output layout change, per image: in (nA*D, H, W) (conv output, channel
 * = a*D + d) -> out (H, W, nA, D), i.e. the anchor-major (H*W*nA, D) rows
 * that anchors, labels and the losses use (torchvision's
 * view(N,-1,D,H,W).permute(0,3,4,1,2)).  D = K for classification, 4 for
 * boxes.  backward is the inverse permute (overwrites). */
void ps_det_head_permute_forward(float *out, const float *inp, int nA, int D, int H, int W);
void ps_det_head_permute_backward(float *dinp, const float *dout, int nA, int D, int H, int W);

/* ---- CUDA versions (worker/engine/cuda/det_layers.cu; HAVE_CUDA builds,
 * link libps_cuda.a).  The same arguments with the CUDA backend's context
 * first (ps_cuda_backend_init); tensors and labels are device (or managed)
 * pointers, queued on the backend's stream.  `loss` and the returned
 * counts are host values: count_pos and the two loss forwards wait for the
 * stream, as does focal backward (it checks the labels before writing, as
 * the CPU does).  Parity with the CPU: bit for bit for upsample-add and the
 * permute, float rounding for the losses (docs/cuda.md). */
struct ps_ctx;
void ps_det_cu_upsample_add_forward(struct ps_ctx *ctx, float *out, const float *lateral,
                                    const float *top, int N, int C, int H, int W, int P, int Q);
void ps_det_cu_upsample_add_backward(struct ps_ctx *ctx, float *dlateral, float *dtop,
                                     const float *dout, int N, int C, int H, int W, int P,
                                     int Q);
int ps_det_cu_count_pos(struct ps_ctx *ctx, const int32_t *labels, int A);
int ps_det_cu_focal_forward(struct ps_ctx *ctx, float *loss, const float *logits,
                            const int32_t *labels, float alpha, float gamma, float normaliser,
                            int A, int K);
int ps_det_cu_focal_backward(struct ps_ctx *ctx, float *dlogits, const float *logits,
                             const int32_t *labels, float dloss, float alpha, float gamma,
                             float normaliser, int A, int K);
void ps_det_cu_smoothl1_forward(struct ps_ctx *ctx, float *loss, const float *pred,
                                const float *target, const int32_t *labels, float beta,
                                float normaliser, int A);
void ps_det_cu_smoothl1_backward(struct ps_ctx *ctx, float *dpred, const float *pred,
                                 const float *target, const int32_t *labels, float dloss,
                                 float beta, float normaliser, int A);
void ps_det_cu_head_permute_forward(struct ps_ctx *ctx, float *out, const float *inp, int nA,
                                    int D, int H, int W);
void ps_det_cu_head_permute_backward(struct ps_ctx *ctx, float *dinp, const float *dout,
                                     int nA, int D, int H, int W);

#endif
