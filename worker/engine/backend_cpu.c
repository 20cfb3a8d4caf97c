/* The CPU backend table: the readable reference implementation of every
 * layer (layers/<name>.c), and the device-control slots of a backend whose
 * layers have finished when they return (nothing to wait for, no device
 * memory; bf16 only where the CPU has it natively). */
#include "ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"
#include "layers/conv_provider.h"
#include "layers/cpu_layers.h"

#include <stdio.h>
#include <string.h>

int ps_cpu_sync(ps_ctx_t *ctx) { return 0; }

/* fp32, or bf16 where the CPU multiplies bf16 natively (AVX-512 BF16,
 * AMX) and oneDNN is there to do it: conv2d through oneDNN's bf16
 * primitives, linear on bf16-rounded operands, both accumulating in fp32;
 * BN, the loss and every parameter stay fp32 (the master weights are the
 * caller's fp32 ones).  fp16 has no fast CPU path: refused. */
int ps_engine_cpu_precision_ok(ps_precision_t precision, char *why, size_t len)
{
    switch (precision) {
    case PS_PRECISION_FP32: return 1;
    case PS_PRECISION_BF16: return ps_conv_onednn_bf16(why, len);
    case PS_PRECISION_FP16:
        snprintf(why, len, "the CPU has no fast fp16 path (bf16 has one on CPUs with AVX-512 "
                 "BF16 or AMX; fp16 needs --device cuda)");
        return 0;
    }
    snprintf(why, len, "unknown precision %d", (int)precision);
    return 0;
}

int ps_cpu_set_precision(ps_ctx_t *ctx, ps_precision_t precision)
{
    char why[192];
    if (!ps_engine_cpu_precision_ok(precision, why, sizeof why)) {
        ps_error("cpu: precision %s refused: %s", ps_precision_name(precision), why);
        return precision == PS_PRECISION_FP16 || precision == PS_PRECISION_BF16
                   ? PS_EUNSUPPORTED
                   : PS_EINVAL;
    }
    ps_cpu_state_t *st = ps_cpu_state(ctx);
    if (!st) return PS_ENOMEM;
    st->precision = precision;
    if (precision == PS_PRECISION_BF16)
        ps_info("cpu: bf16 convolutions (oneDNN) and linear layers, fp32 accumulation, BN, "
                "loss and weights");
    return 0;
}

/* the caller scales: on fp32, scaling the gradients after backward is the
 * scaled backward bit for bit (a power of two commutes with every op) */
int ps_cpu_set_loss_scale(ps_ctx_t *ctx, float scale) { return PS_EUNSUPPORTED; }

int ps_cpu_events(ps_ctx_t *ctx, int n) { return n < 0 ? PS_EINVAL : 0; }
int ps_cpu_event_record(ps_ctx_t *ctx, int slot) { return 0; }
int ps_cpu_event_query(ps_ctx_t *ctx, int slot) { return 1; }
int ps_cpu_event_wait(ps_ctx_t *ctx, int slot) { return 0; }

int ps_cpu_mem_stats(ps_ctx_t *ctx, ps_backend_mem_t *m, int reset_peak)
{
    if (m) memset(m, 0, sizeof *m);
    return PS_EUNSUPPORTED;
}

void ps_cpu_release(ps_ctx_t *ctx) {}

size_t ps_cpu_act_elsize(ps_ctx_t *ctx) { return sizeof(float); }

const ps_backend_t ps_backend_cpu = {
    .name = "cpu",
    .async = 0,
    .sync = ps_cpu_sync,
    .set_precision = ps_cpu_set_precision,
    .set_loss_scale = ps_cpu_set_loss_scale,
    .events = ps_cpu_events,
    .event_record = ps_cpu_event_record,
    .event_query = ps_cpu_event_query,
    .event_wait = ps_cpu_event_wait,
    .mem_stats = ps_cpu_mem_stats,
    .release = ps_cpu_release,
    .act_elsize = ps_cpu_act_elsize,
    .conv2d_forward = ps_cpu_conv2d_forward,
    .conv2d_backward = ps_cpu_conv2d_backward,
    .bn_forward_train = ps_cpu_bn_forward_train,
    .bn_backward_train = ps_cpu_bn_backward_train,
    .bn_forward_saved = ps_cpu_bn_forward_saved,
    .bn_forward_eval = ps_cpu_bn_forward_eval,
    .bn_backward_eval = ps_cpu_bn_backward_eval,
    .relu_forward = ps_cpu_relu_forward,
    .relu_backward = ps_cpu_relu_backward,
    .maxpool_forward = ps_cpu_maxpool_forward,
    .maxpool_backward = ps_cpu_maxpool_backward,
    .avgpool_forward = ps_cpu_avgpool_forward,
    .avgpool_backward = ps_cpu_avgpool_backward,
    .linear_forward = ps_cpu_linear_forward,
    .linear_backward = ps_cpu_linear_backward,
    .dropout_forward = ps_cpu_dropout_forward,
    .dropout_backward = ps_cpu_dropout_backward,
    .xent_forward = ps_cpu_xent_forward,
    .xent_backward = ps_cpu_xent_backward,
    .tshift_forward = ps_cpu_tshift_forward,
    .tshift_backward = ps_cpu_tshift_backward,
    .consensus_forward = ps_cpu_consensus_forward,
    .consensus_backward = ps_cpu_consensus_backward,
    .add = ps_cpu_add,
    .accumulate = ps_cpu_accumulate,
    .upsample_add_forward = ps_cpu_upsample_add_forward,
    .upsample_add_backward = ps_cpu_upsample_add_backward,
    .count_pos = ps_cpu_count_pos,
    .focal_forward = ps_cpu_focal_forward,
    .focal_backward = ps_cpu_focal_backward,
    .smoothl1_forward = ps_cpu_smoothl1_forward,
    .smoothl1_backward = ps_cpu_smoothl1_backward,
    .head_permute_forward = ps_cpu_head_permute_forward,
    .head_permute_backward = ps_cpu_head_permute_backward,
    .conv3d_forward = ps_cpu_conv3d_forward,
    .conv3d_backward = ps_cpu_conv3d_backward,
    .maxpool3d_forward = ps_cpu_maxpool3d_forward,
    .maxpool3d_backward = ps_cpu_maxpool3d_backward,
    .avgpool3d_forward = ps_cpu_avgpool3d_forward,
    .avgpool3d_backward = ps_cpu_avgpool3d_backward,
    .roi_align_forward = ps_cpu_roi_align_forward,
    .roi_align_backward = ps_cpu_roi_align_backward,
    .deconv_forward = ps_cpu_deconv_forward,
    .deconv_backward = ps_cpu_deconv_backward,
    .mask_bce_forward = ps_cpu_mask_bce_forward,
    .mask_bce_backward = ps_cpu_mask_bce_backward,
    .scale = ps_cpu_scale,
    .bn_relu_forward_eval = ps_cpu_bn_relu_forward_eval,
    .bn_relu_backward_eval = ps_cpu_bn_relu_backward_eval,
    .copy_in = NULL, /* the host memcpy is the copy */
};
