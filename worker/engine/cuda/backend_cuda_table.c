/* The CUDA backend's two rows: its backend table (ps_backend_cuda) and its
 * device (ps_device_cuda, "--device cuda[:N]").  Plain C, so the table is
 * filled by slot name: several slots share a type, and a designated
 * initializer cannot put an entry into the wrong one unnoticed (a wrong
 * type is a compiler diagnostic, an empty slot fails
 * ps_engine_check_backend() when the device is opened and in
 * tests/test_device). */
#include "worker/engine/cuda/cuda_layers.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"

#include "ps_error.h"
#include "ps_log.h"

const ps_backend_t ps_backend_cuda = {
    .name = "cuda",
    .async = 1,
    .sync = ps_cuda_backend_sync,
    .set_precision = ps_cuda_backend_set_precision,
    .set_loss_scale = ps_cuda_backend_set_loss_scale,
    .events = ps_cuda_backend_events,
    .event_record = ps_cuda_backend_event_record,
    .event_query = ps_cuda_backend_event_query,
    .event_wait = ps_cuda_backend_event_wait,
    .mem_stats = ps_cuda_backend_mem_stats,
    .act_elsize = ps_cuda_backend_act_elsize,
    .release = ps_cuda_backend_free,
    .conv2d_forward = ps_cu_conv2d_forward,
    .conv2d_backward = ps_cu_conv2d_backward,
    .bn_forward_train = ps_cu_bn_forward_train,
    .bn_backward_train = ps_cu_bn_backward_train,
    .bn_forward_saved = ps_cu_bn_forward_saved,
    .bn_forward_eval = ps_cu_bn_forward_eval,
    .bn_backward_eval = ps_cu_bn_backward_eval,
    .relu_forward = ps_cu_relu_forward,
    .relu_backward = ps_cu_relu_backward,
    .maxpool_forward = ps_cu_maxpool_forward,
    .maxpool_backward = ps_cu_maxpool_backward,
    .avgpool_forward = ps_cu_avgpool_forward,
    .avgpool_backward = ps_cu_avgpool_backward,
    .linear_forward = ps_cu_linear_forward,
    .linear_backward = ps_cu_linear_backward,
    .dropout_forward = ps_cu_dropout_forward,
    .dropout_backward = ps_cu_dropout_backward,
    .xent_forward = ps_cu_xent_forward,
    .xent_backward = ps_cu_xent_backward,
    .tshift_forward = ps_cu_tshift_forward,
    .tshift_backward = ps_cu_tshift_backward,
    .consensus_forward = ps_cu_consensus_forward,
    .consensus_backward = ps_cu_consensus_backward,
    .add = ps_cu_add,
    .accumulate = ps_cu_accumulate,
    .upsample_add_forward = ps_cu_upsample_add_forward,
    .upsample_add_backward = ps_cu_upsample_add_backward,
    .count_pos = ps_cu_count_pos,
    .focal_forward = ps_cu_focal_forward,
    .focal_backward = ps_cu_focal_backward,
    .smoothl1_forward = ps_cu_smoothl1_forward,
    .smoothl1_backward = ps_cu_smoothl1_backward,
    .head_permute_forward = ps_cu_head_permute_forward,
    .head_permute_backward = ps_cu_head_permute_backward,
    .conv3d_forward = ps_cu_conv3d_forward,
    .conv3d_backward = ps_cu_conv3d_backward,
    .maxpool3d_forward = ps_cu_maxpool3d_forward,
    .maxpool3d_backward = ps_cu_maxpool3d_backward,
    .avgpool3d_forward = ps_cu_avgpool3d_forward,
    .avgpool3d_backward = ps_cu_avgpool3d_backward,
    .roi_align_forward = ps_cu_roi_align_forward,
    .roi_align_backward = ps_cu_roi_align_backward,
    .deconv_forward = ps_cu_deconv_forward,
    .deconv_backward = ps_cu_deconv_backward,
    .mask_bce_forward = ps_cu_mask_bce_forward,
    .mask_bce_backward = ps_cu_mask_bce_backward,
    .scale = ps_cu_scale,
    /* optional fused entries, not on CUDA yet: callers take the unfused path */
    .bn_relu_forward_eval = NULL,
    .bn_relu_backward_eval = NULL,
    .copy_in = ps_cu_copy_in,
};

/* Device `index`: the backend's handles and stream in ctx, and every model
 * arena from managed memory from then on (the models are written for host
 * pointers: their memcpy / memset of inputs and gradients then work
 * unchanged, docs/cuda.md). */
static int cuda_open(ps_ctx_t *ctx, int index, const ps_backend_t **be)
{
    const int n = ps_cuda_device_count();
    if (index >= n) {
        ps_error("cuda:%d: only %d CUDA device(s) present", index, n);
        return PS_EINVAL;
    }
    int rc = ps_cuda_backend_init(ctx, index);
    if (rc) return rc;
    if ((rc = ps_cuda_use_managed_arena())) {
        ps_cuda_backend_free(ctx);
        return rc;
    }
    *be = &ps_backend_cuda;
    return 0;
}

const ps_device_t ps_device_cuda = {
    .name = "cuda",
    .what = "CUDA backend, model arenas in managed memory",
    .open = cuda_open,
};
