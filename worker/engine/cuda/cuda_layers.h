/* The CUDA backend's layer entry points, one per slot of ps_backend_t with
 * exactly the slot's signature (the CPU twins are in
 * worker/engine/layers/cpu_layers.h).  Plain C declarations: the .cu files
 * define them (C linkage, from the first declaration here) and
 * backend_cuda_table.c, compiled by the C compiler, fills ps_backend_cuda
 * with them by slot name.  Private to the CUDA backend. */
#ifndef PS_CUDA_LAYERS_H
#define PS_CUDA_LAYERS_H
#include <stddef.h>
#include <stdint.h>

#include "worker/engine/ps_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

void ps_cu_conv2d_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                          const float *b, const ps_conv2d_desc_t *d, int N, int H, int W);
void ps_cu_conv2d_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const ps_conv2d_desc_t *d, int N,
                           int H, int W);

void ps_cu_bn_forward_train(ps_ctx_t *ctx, float *out, float *save_mean, float *save_rstd,
                            float *run_mean, float *run_var, const float *inp,
                            const float *gamma, const float *beta, float eps, float momentum,
                            int N, int C, int HW);
void ps_cu_bn_backward_train(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                             const float *dout, const float *inp, const float *gamma,
                             const float *save_mean, const float *save_rstd, int N, int C,
                             int HW);
void ps_cu_bn_forward_saved(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                            const float *beta, const float *save_mean, const float *save_rstd,
                            int N, int C, int HW);
void ps_cu_bn_forward_eval(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                           const float *beta, const float *run_mean, const float *run_var,
                           float eps, int N, int C, int HW);
void ps_cu_bn_backward_eval(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                            const float *dout, const float *inp, const float *gamma,
                            const float *run_mean, const float *run_var, float eps, int N,
                            int C, int HW);

void ps_cu_maxpool_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                           const ps_pool_desc_t *d, int N, int C, int H, int W);
void ps_cu_maxpool_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                            const int32_t *argmax, const ps_pool_desc_t *d, int N, int C,
                            int H, int W);
void ps_cu_avgpool_forward(ps_ctx_t *ctx, float *out, const float *inp, int N, int C, int HW);
void ps_cu_avgpool_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int N, int C,
                            int HW);

void ps_cu_linear_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                          const float *b, int N, int C, int K);
void ps_cu_linear_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                           const float *dout, const float *inp, const float *w, int N, int C,
                           int K);

void ps_cu_relu_forward(ps_ctx_t *ctx, float *out, const float *inp, size_t n);
void ps_cu_relu_backward(ps_ctx_t *ctx, float *dinp, const float *dout, const float *out,
                         size_t n);
void ps_cu_dropout_forward(ps_ctx_t *ctx, float *out, uint8_t *mask, const float *inp,
                           size_t n, float p, uint64_t seed);
void ps_cu_dropout_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                            const uint8_t *mask, size_t n, float p);
float ps_cu_xent_forward(ps_ctx_t *ctx, float *probs, const float *logits,
                         const int32_t *labels, int N, int K);
void ps_cu_xent_backward(ps_ctx_t *ctx, float *dlogits, const float *probs,
                         const int32_t *labels, float dloss, int N, int K);
void ps_cu_tshift_forward(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int C,
                          int HW, int fold_div);
void ps_cu_tshift_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T, int C,
                           int HW, int fold_div);
void ps_cu_consensus_forward(ps_ctx_t *ctx, float *out, const float *inp, int B, int T,
                             int K);
void ps_cu_consensus_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T,
                              int K);
void ps_cu_add(ps_ctx_t *ctx, float *out, const float *a, const float *b, size_t n);
void ps_cu_accumulate(ps_ctx_t *ctx, float *acc, const float *x, size_t n);
void ps_cu_copy_in(ps_ctx_t *ctx, float *dst, const float *src, size_t n);

// det_layers.cu
void ps_cu_upsample_add_forward(ps_ctx_t *ctx, float *out, const float *lateral,
                                const float *top, int N, int C, int H, int W, int P, int Q);
void ps_cu_upsample_add_backward(ps_ctx_t *ctx, float *dlateral, float *dtop,
                                 const float *dout, int N, int C, int H, int W, int P, int Q);
int ps_cu_count_pos(ps_ctx_t *ctx, const int32_t *labels, int A);
int ps_cu_focal_forward(ps_ctx_t *ctx, float *loss, const float *logits,
                        const int32_t *labels, float alpha, float gamma, float normaliser,
                        int A, int K);
int ps_cu_focal_backward(ps_ctx_t *ctx, float *dlogits, const float *logits,
                         const int32_t *labels, float dloss, float alpha, float gamma,
                         float normaliser, int A, int K);
void ps_cu_smoothl1_forward(ps_ctx_t *ctx, float *loss, const float *pred,
                            const float *target, const int32_t *labels, float beta,
                            float normaliser, int A);
void ps_cu_smoothl1_backward(ps_ctx_t *ctx, float *dpred, const float *pred,
                             const float *target, const int32_t *labels, float dloss,
                             float beta, float normaliser, int A);
void ps_cu_head_permute_forward(ps_ctx_t *ctx, float *out, const float *inp, int nA, int D,
                                int H, int W);
void ps_cu_head_permute_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int nA,
                                 int D, int H, int W);

// conv3d.cu, pool3d.cu: the 3-D video layers
void ps_cu_conv3d_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                          const float *b, const ps_conv3d_desc_t *d, int N, int D, int H, int W);
void ps_cu_conv3d_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const ps_conv3d_desc_t *d, int N,
                           int D, int H, int W);
void ps_cu_maxpool3d_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                             const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W);
void ps_cu_maxpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                              const int32_t *argmax, const ps_pool3d_desc_t *d, int N, int C,
                              int D, int H, int W);
void ps_cu_avgpool3d_forward(ps_ctx_t *ctx, float *out, const float *inp,
                             const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W);
void ps_cu_avgpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W);
// roi_align.cu (two-stage detectors)
void ps_cu_roi_align_forward(ps_ctx_t *ctx, float *out, const float *feat, const float *rois,
                             int R, int N, int C, int H, int W, int PH, int PW,
                             float spatial_scale, int sampling_ratio, int aligned);
void ps_cu_roi_align_backward(ps_ctx_t *ctx, float *dfeat, const float *dout,
                              const float *rois, int R, int N, int C, int H, int W, int PH,
                              int PW, float spatial_scale, int sampling_ratio, int aligned);
// deconv.cu, det_layers.cu (Mask R-CNN)
void ps_cu_deconv_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                          const float *b, int N, int C, int K, int H, int W, int s);
void ps_cu_deconv_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, int N, int C, int K, int H, int W,
                           int s);
int ps_cu_mask_bce_forward(ps_ctx_t *ctx, float *loss, const float *logits,
                           const int32_t *labels, const float *targets, float normaliser, int R,
                           int K, int MM);
int ps_cu_mask_bce_backward(ps_ctx_t *ctx, float *dlogits, const float *logits,
                            const int32_t *labels, const float *targets, float dloss,
                            float normaliser, int R, int K, int MM);
// layers.cu (Cascade R-CNN)
void ps_cu_scale(ps_ctx_t *ctx, float *x, float alpha, size_t n);

#ifdef __cplusplus
}
#endif
#endif
