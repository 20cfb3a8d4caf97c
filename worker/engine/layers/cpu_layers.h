/* CPU implementations of the slots of ps_engine.h's backend table.  Each
 * has exactly the signature of its slot, as its CUDA twin in
 * worker/engine/cuda/ has; backend_cpu.c collects them into ps_backend_cpu.
 * Private to the engine (backend_half_round.c builds on them) and its
 * tests. */
#ifndef PS_CPU_LAYERS_H
#define PS_CPU_LAYERS_H
#include "worker/engine/ps_engine.h"

/* backend_cpu.c: the device-control slots of a synchronous host backend
 * (sync and events: nothing to wait for; precision fp32 only; the caller
 * scales the loss; no device memory; nothing to release) */
int ps_cpu_sync(ps_ctx_t *ctx);
int ps_cpu_set_precision(ps_ctx_t *ctx, ps_precision_t precision);
int ps_cpu_set_loss_scale(ps_ctx_t *ctx, float scale);
int ps_cpu_events(ps_ctx_t *ctx, int n);
int ps_cpu_event_record(ps_ctx_t *ctx, int slot);
int ps_cpu_event_query(ps_ctx_t *ctx, int slot);
int ps_cpu_event_wait(ps_ctx_t *ctx, int slot);
int ps_cpu_mem_stats(ps_ctx_t *ctx, ps_backend_mem_t *m, int reset_peak);
void ps_cpu_release(ps_ctx_t *ctx);
size_t ps_cpu_act_elsize(ps_ctx_t *ctx);

/* conv_select.c: the conv2d slots, through the row of conv_provider.h
 * chosen for the shape (conv2d.c holds the im2col + GEMM row,
 * conv_onednn.c the oneDNN one) */
void ps_cpu_conv2d_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, const ps_conv2d_desc_t *d, int N, int H, int W);
void ps_cpu_conv2d_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w,
                            const ps_conv2d_desc_t *d, int N, int H, int W);
/* 1 when the descriptor and shape make a convolution, else 0 (logged). */
int ps_conv2d_valid(const ps_conv2d_desc_t *d, int N, int H, int W);
/* conv2d.c, the im2col + GEMM row: columns targeted per GEMM: convolutions whose output plane (P*Q) is
 * smaller than this process several images in one GEMM.  Changing it
 * changes ps_conv2d_workspace(); 0 restores the default.  Process-wide,
 * meant for tests and benchmarks (set it before sizing a model). */
void ps_conv2d_set_gemm_cols(size_t cols);
size_t ps_conv2d_get_gemm_cols(void);
/* Images per GEMM for this shape (1 = one image at a time).  Depends on
 * the OpenMP thread count as well (chunks are balanced over the team), as
 * does ps_conv2d_workspace(): size workspaces after ps_engine_init(). */
int ps_conv2d_images_per_gemm(const ps_conv2d_desc_t *d, int N, int H, int W);

/* im2col / col2im for nc images of one group (conv2d_col.c).  col is
 * (Cg*R*S) x (nc*P*Q); x / dx hold the group's first channel of the first
 * image, consecutive images img_stride floats apart.  col2im ADDS into dx. */
void ps_cpu_im2col(float *col, const float *x, size_t img_stride, int nc, int Cg, int H,
                   int W, const ps_conv2d_desc_t *d, int P, int Q);
void ps_cpu_col2im(float *dx, const float *col, size_t img_stride, int nc, int Cg, int H,
                   int W, const ps_conv2d_desc_t *d, int P, int Q);

/* One row's P x Q block of a column matrix from one input plane xp (H x W):
 * dst[p][q] = xp[p*sh + h0][q*sw + w0], 0 outside the plane (conv2d_col.c,
 * shared by im2col and vol2col); the _add form is the transpose, adding src
 * into xp.  col_qrange: the q range whose column q*sw + w0 lies in [0, W). */
void ps_cpu_col_qrange(int w0, int sw, int W, int Q, int *qlo, int *qhi);
void ps_cpu_col_plane(float *dst, const float *xp, int H, int W, int P, int Q, int h0, int sh,
                      int w0, int sw);
void ps_cpu_col_plane_add(float *xp, const float *src, int H, int W, int P, int Q, int h0, int sh,
                          int w0, int sw);

/* conv_common.c, shared by conv2d.c and conv3d.c: the bias gradient (the
 * sum of dout (N, K, PQ) over images and positions, ADDED to db), and
 * inside an OpenMP team the sum of the other threads' partial weight
 * gradients red[(t-1)*nw ..] into dw (an orphaned worksharing loop: every
 * thread of the team calls it). */
void ps_cpu_conv_bias_grad(float *db, const float *dout, int N, int K, size_t PQ);
/* Threads a call may use: the OpenMP team's size, 1 for a call made inside
 * a parallel region (it runs on its own thread). */
int ps_cpu_team_threads(void);
void ps_cpu_sum_partials(float *dw, const float *red, size_t nw, int nth);

/* batchnorm.c */
void ps_cpu_bn_forward_train(ps_ctx_t *ctx, float *out, float *save_mean, float *save_rstd,
                             float *run_mean, float *run_var, const float *inp,
                             const float *gamma, const float *beta, float eps, float momentum,
                             int N, int C, int HW);
void ps_cpu_bn_backward_train(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                              const float *dout, const float *inp, const float *gamma,
                              const float *save_mean, const float *save_rstd, int N, int C,
                              int HW);
void ps_cpu_bn_forward_saved(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                             const float *beta, const float *save_mean, const float *save_rstd,
                             int N, int C, int HW);
void ps_cpu_bn_forward_eval(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                            const float *beta, const float *run_mean, const float *run_var,
                            float eps, int N, int C, int HW);
void ps_cpu_bn_backward_eval(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                             const float *dout, const float *inp, const float *gamma,
                             const float *run_mean, const float *run_var, float eps, int N,
                             int C, int HW);

/* batchnorm.c: fused eval batchnorm + relu (optional table entries) */
void ps_cpu_bn_relu_forward_eval(ps_ctx_t *ctx, float *out, const float *inp,
                                 const float *gamma, const float *beta, const float *run_mean,
                                 const float *run_var, float eps, int N, int C, int HW);
void ps_cpu_bn_relu_backward_eval(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                                  const float *dout, const float *out, const float *inp,
                                  const float *gamma, const float *run_mean,
                                  const float *run_var, float eps, int N, int C, int HW);

/* relu.c */
void ps_cpu_relu_forward(ps_ctx_t *ctx, float *out, const float *inp, size_t n);
void ps_cpu_relu_backward(ps_ctx_t *ctx, float *dinp, const float *dout, const float *out,
                          size_t n);

/* pool.c */
void ps_cpu_maxpool_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                            const ps_pool_desc_t *d, int N, int C, int H, int W);
void ps_cpu_maxpool_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                             const int32_t *argmax, const ps_pool_desc_t *d, int N, int C,
                             int H, int W);
void ps_cpu_avgpool_forward(ps_ctx_t *ctx, float *out, const float *inp, int N, int C, int HW);
void ps_cpu_avgpool_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int N, int C,
                             int HW);

/* linear.c */
void ps_cpu_linear_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, int N, int C, int K);
void ps_cpu_linear_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w, int N, int C,
                            int K);

/* dropout.c */
void ps_cpu_dropout_forward(ps_ctx_t *ctx, float *out, uint8_t *mask, const float *inp,
                            size_t n, float p, uint64_t seed);
void ps_cpu_dropout_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                             const uint8_t *mask, size_t n, float p);

/* xent.c */
float ps_cpu_xent_forward(ps_ctx_t *ctx, float *probs, const float *logits,
                          const int32_t *labels, int N, int K);
void ps_cpu_xent_backward(ps_ctx_t *ctx, float *dlogits, const float *probs,
                          const int32_t *labels, float dloss, int N, int K);

/* tshift.c */
void ps_cpu_tshift_forward(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int C,
                           int HW, int fold_div);
void ps_cpu_tshift_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T,
                            int C, int HW, int fold_div);

/* consensus.c */
void ps_cpu_consensus_forward(ps_ctx_t *ctx, float *out, const float *inp, int B, int T,
                              int K);
void ps_cpu_consensus_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T,
                               int K);

/* elementwise.c */
void ps_cpu_add(ps_ctx_t *ctx, float *out, const float *a, const float *b, size_t n);
void ps_cpu_accumulate(ps_ctx_t *ctx, float *acc, const float *x, size_t n);

/* upsample_add.c */
void ps_cpu_upsample_add_forward(ps_ctx_t *ctx, float *out, const float *lateral,
                                 const float *top, int N, int C, int H, int W, int P, int Q);
void ps_cpu_upsample_add_backward(ps_ctx_t *ctx, float *dlateral, float *dtop,
                                  const float *dout, int N, int C, int H, int W, int P, int Q);

/* focal.c: the positive count and the sigmoid focal loss */
int ps_cpu_count_pos(ps_ctx_t *ctx, const int32_t *labels, int A);
int ps_cpu_focal_forward(ps_ctx_t *ctx, float *loss, const float *logits,
                         const int32_t *labels, float alpha, float gamma, float normaliser,
                         int A, int K);
int ps_cpu_focal_backward(ps_ctx_t *ctx, float *dlogits, const float *logits,
                          const int32_t *labels, float dloss, float alpha, float gamma,
                          float normaliser, int A, int K);

/* smoothl1.c */
void ps_cpu_smoothl1_forward(ps_ctx_t *ctx, float *loss, const float *pred,
                             const float *target, const int32_t *labels, float beta,
                             float normaliser, int A);
void ps_cpu_smoothl1_backward(ps_ctx_t *ctx, float *dpred, const float *pred,
                              const float *target, const int32_t *labels, float dloss,
                              float beta, float normaliser, int A);

/* head_permute.c */
void ps_cpu_head_permute_forward(ps_ctx_t *ctx, float *out, const float *inp, int nA, int D,
                                 int H, int W);
void ps_cpu_head_permute_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int nA,
                                  int D, int H, int W);

/* ---- 3-D video layers ---------------------------------------------------- */

/* conv_select.c: the conv3d slots through the chosen row (conv3d.c,
 * conv3d_col.c: vol2col + GEMM; conv_onednn.c) */
void ps_cpu_conv3d_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, const ps_conv3d_desc_t *d, int N, int D, int H,
                           int W);
void ps_cpu_conv3d_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w,
                            const ps_conv3d_desc_t *d, int N, int D, int H, int W);
/* Floats of one thread's vol2col buffer at most (unless one output frame
 * needs more): longer clips are cut into output-frame ranges.  0 restores
 * the default (16 MiB).  Process-wide, for tests (set before sizing). */
void ps_conv3d_set_col_cap(size_t floats);
/* vol2col / col2vol for one clip and group, output frames [o0, o1) (conv3d_col.c).
 * col is (Cg*KT*R*S) x ((o1-o0)*P*Q); x / dx hold the group's first channel
 * (Cg blocks of D*H*W).  col2vol ADDS into dx. */
void ps_cpu_vol2col(float *col, const float *x, int Cg, int D, int H, int W,
                    const ps_conv3d_desc_t *d, int P, int Q, int o0, int o1);
void ps_cpu_col2vol(float *dx, const float *col, int Cg, int D, int H, int W,
                    const ps_conv3d_desc_t *d, int P, int Q, int o0, int o1);

/* pool3d.c */
void ps_cpu_maxpool3d_forward(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W);
void ps_cpu_maxpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                               const int32_t *argmax, const ps_pool3d_desc_t *d, int N, int C,
                               int D, int H, int W);
void ps_cpu_avgpool3d_forward(ps_ctx_t *ctx, float *out, const float *inp,
                              const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W);
void ps_cpu_avgpool3d_backward(ps_ctx_t *ctx, float *dinp, const float *dout,
                               const ps_pool3d_desc_t *d, int N, int C, int D, int H, int W);
/* roi_align.c (two-stage detectors) */
void ps_cpu_roi_align_forward(ps_ctx_t *ctx, float *out, const float *feat, const float *rois,
                              int R, int N, int C, int H, int W, int PH, int PW,
                              float spatial_scale, int sampling_ratio, int aligned);
void ps_cpu_roi_align_backward(ps_ctx_t *ctx, float *dfeat, const float *dout,
                               const float *rois, int R, int N, int C, int H, int W, int PH,
                               int PW, float spatial_scale, int sampling_ratio, int aligned);
/* deconv.c, mask_bce.c (Mask R-CNN) */
void ps_cpu_deconv_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, int N, int C, int K, int H, int W, int s);
void ps_cpu_deconv_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w, int N, int C,
                            int K, int H, int W, int s);
int ps_cpu_mask_bce_forward(ps_ctx_t *ctx, float *loss, const float *logits,
                            const int32_t *labels, const float *targets, float normaliser, int R,
                            int K, int MM);
int ps_cpu_mask_bce_backward(ps_ctx_t *ctx, float *dlogits, const float *logits,
                             const int32_t *labels, const float *targets, float dloss,
                             float normaliser, int R, int K, int MM);
/* elementwise.c (Cascade R-CNN) */
void ps_cpu_scale(ps_ctx_t *ctx, float *x, float alpha, size_t n);

#endif
