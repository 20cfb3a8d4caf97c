/* The CPU backend table: the readable reference implementation of every
 * layer (layers/<name>.c), chosen once at start like the CUDA one. */
#include "ps_engine.h"
#include "layers/cpu_layers.h"

const ps_backend_t ps_backend_cpu = {
    .name = "cpu",
    .conv2d_forward = ps_cpu_conv2d_forward,
    .conv2d_backward = ps_cpu_conv2d_backward,
    .bn_forward_train = ps_cpu_bn_forward_train,
    .bn_backward_train = ps_cpu_bn_backward_train,
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
    .bn_relu_forward_eval = ps_cpu_bn_relu_forward_eval,
    .bn_relu_backward_eval = ps_cpu_bn_relu_backward_eval,
    .copy_in = NULL, /* the host memcpy is the copy */
};
