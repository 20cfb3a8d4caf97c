/* An ONNX graph builder: the models' export to ONNX (onnx_resnet.c,
 * onnx_retinanet.c) is a sequence of calls here, one per layer, each adding
 * the standard operators of that layer.  Written with protobuf-c from the
 * subset of the ONNX IR in proto/onnx.proto; opset PS_ONNX_OPSET of the
 * default domain, IR version PS_ONNX_IR_VERSION.
 *
 * Values are named by strings.  A layer function takes its input value(s)
 * and a node name, adds its node(s) and returns the name of its output
 * value (owned by the graph, valid until destroy): the output of a layer
 * named "layer1.0.conv1" is the value "layer1.0.conv1"; helper constants
 * and intermediate values get the node name plus a suffix.  Weights are
 * initializers under the names given (the models use their torchvision
 * names).  Names must be unique in the graph (checked).
 *
 * Errors are sticky: the first failure (bad argument, out of memory, a
 * duplicate name) is logged with the node's name, every later call returns
 * NULL, and ps_onnx_save refuses.  So a model's export is written straight
 * through and checked once at the end.
 *
 * How a model adds its graph: build the input, one call per layer in
 * forward order, mark the outputs, ps_onnx_save.  A layer kind the builder
 * lacks is a new function here composed of standard operators (see
 * ps_onnx_tshift), with a case in tests/test_onnx.c. */
#ifndef PS_ONNX_GRAPH_H
#define PS_ONNX_GRAPH_H
#include <stddef.h>
#include <stdint.h>

#include "worker/engine/ps_engine.h"

#define PS_ONNX_OPSET 17
#define PS_ONNX_IR_VERSION 8

typedef struct ps_onnx ps_onnx_t;

/* A new empty graph.  Returns 0, PS_ENOMEM or PS_EINVAL. */
int ps_onnx_new(ps_onnx_t **out, const char *graph_name);
void ps_onnx_destroy(ps_onnx_t **g);
/* 0, or the first error (sticky). */
int ps_onnx_error(const ps_onnx_t *g);

/* A float32 graph input or output of rank ndim: dims[d] > 0 fixed, 0
 * symbolic with the name dim_names[d] ("batch").  An output names a value
 * a layer returned.  Return the name, NULL on error. */
const char *ps_onnx_input(ps_onnx_t *g, const char *name, int ndim, const int64_t *dims,
                          const char *const *dim_names);
const char *ps_onnx_output(ps_onnx_t *g, const char *value, int ndim, const int64_t *dims,
                           const char *const *dim_names);
/* A metadata_props entry of the model (key / value copied). */
int ps_onnx_meta(ps_onnx_t *g, const char *key, const char *value);

/* Initializers (data copied): a float32 tensor, a 1-D int64 tensor. */
const char *ps_onnx_weight(ps_onnx_t *g, const char *name, int ndim, const int *shape,
                           const float *data);
const char *ps_onnx_ints(ps_onnx_t *g, const char *name, int n, const int64_t *v);

/* ---- layers: name = the node (and output value), x = the input value ---- */

/* Conv (NCHW), weight w (K, C/groups, R, S), bias b or NULL. */
const char *ps_onnx_conv(ps_onnx_t *g, const char *name, const char *x, const char *w,
                         const char *b, const ps_conv2d_desc_t *d);
/* BatchNormalization in inference mode (running statistics). */
const char *ps_onnx_batchnorm(ps_onnx_t *g, const char *name, const char *x, const char *scale,
                              const char *bias, const char *mean, const char *var, float eps);
const char *ps_onnx_relu(ps_onnx_t *g, const char *name, const char *x);
/* MaxPool with floor rounding (PyTorch's ceil_mode=False). */
const char *ps_onnx_maxpool(ps_onnx_t *g, const char *name, const char *x,
                            const ps_pool_desc_t *d);
const char *ps_onnx_add(ps_onnx_t *g, const char *name, const char *a, const char *b);
/* GlobalAveragePool then Flatten: (N, C, H, W) -> (N, C). */
const char *ps_onnx_avgpool_flat(ps_onnx_t *g, const char *name, const char *x);
/* Gemm: (N, F) x w^T (w is (K, F)) + b. */
const char *ps_onnx_linear(ps_onnx_t *g, const char *name, const char *x, const char *w,
                           const char *b);
/* Reshape to shape[0..ndim) (-1: inferred, as ONNX). */
const char *ps_onnx_reshape(ps_onnx_t *g, const char *name, const char *x, int ndim,
                            const int64_t *shape);
const char *ps_onnx_transpose(ps_onnx_t *g, const char *name, const char *x, int ndim,
                              const int64_t *perm);
const char *ps_onnx_concat(ps_onnx_t *g, const char *name, int n, const char *const *xs,
                           int axis);
/* ReduceMean over one axis. */
const char *ps_onnx_mean(ps_onnx_t *g, const char *name, const char *x, int axis, int keepdims);
/* TSM's temporal shift of x (B*T, C, H, W), B dynamic: viewed as
 * (B, T, C, H, W), channels [0, C/fold_div) take frame t+1, the next C/
 * fold_div frame t-1, zeros past the clip's ends, the rest unchanged
 * (ps_engine.h tshift_forward) -- as Slice, Pad and Concat, so the shift is
 * part of the graph rather than a traced in-place copy. */
const char *ps_onnx_tshift(ps_onnx_t *g, const char *name, const char *x, int T, int C, int H,
                           int W, int fold_div);
/* x + nearest upsample of top to lateral's H x W (PyTorch's "nearest":
 * source index floor(dst * in / out)): the FPN's top-down merge (the
 * upsample_add slot).  Resize's sizes come from the values' shapes. */
const char *ps_onnx_upsample_add(ps_onnx_t *g, const char *name, const char *lateral,
                                 const char *top);

/* Serialise (ModelProto: IR PS_ONNX_IR_VERSION, opset PS_ONNX_OPSET,
 * producer "psworker") and write path atomically (a temporary file, then a
 * rename: a failed export leaves no half-written file).  Returns 0, the
 * sticky error, PS_ENOMEM or PS_EIO (logged). */
int ps_onnx_save(ps_onnx_t *g, const char *path);

#endif
