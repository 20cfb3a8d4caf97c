/* Trainable-tensor layouts (names and sizes, in model order) of the models
 * the scaling study pushes through the parameter servers, computed from the
 * architectures, so that psbench moves the real partition layout without
 * linking the engine.  tests/golden/model_sizes.txt (from torchvision, see
 * tests/golden/gen_model_sizes.py) checks every tensor. */
#ifndef PSBENCH_MODEL_SIZES_H
#define PSBENCH_MODEL_SIZES_H
#include <stddef.h>

#include "ps_partition.h"

typedef struct psbench_model {
    ps_tensor_spec_t *tensors; /* names owned by the model */
    unsigned ntensors;
    size_t total_numel;
    /* (ntensors) forward multiply-adds per input frame at 224x224
     * attributed to each tensor: a conv / fc weight carries its layer's
     * MACs (out x in x kt x k x k x output pixels), a BN weight and bias
     * one op per output element each, a conv bias 0.  A temporal kernel of
     * 3 (padded: the layer keeps its frames) triples a conv's MACs; layers
     * behind a temporal pool run at fewer frames, so their output pixels
     * per input frame shrink with it (I3D's 2x1x1 pool after layer1:
     * layer2..4 count half).  The fc counts once (its MACs per clip), so a
     * clip of T frames costs T x total_flops less (T - 1) x the fc's
     * (0.02% of I3D's 32 frames).  What psbench's
     * emulated compute schedule splits the step by (compute ~ FLOPs, not
     * parameters: ResNet's stem and layer1 hold 0.9% of the weights and
     * ~20% of the MACs, layer4 60% of the weights and ~20% of the MACs). */
    double *flops;
    double total_flops;
} psbench_model_t;

/* "tsm-r50", "tsm-r18" (TSM adds no parameters: torchvision ResNet with a
 * 400-class Kinetics fc), "i3d-r50-311" and "i3d-r50-333" (the I3D-ResNet-50
 * psworker trains, torchvision ResNet-50 names, 400 classes, trainable BN:
 * conv1 5x7x7, a 2x1x1 temporal max pool after layer1, and a temporal kernel
 * of 3 in the blocks layer1.0-2, layer2.0/2, layer3.0/2/4 and layer4.1, on
 * the first 1x1 conv (3x1x1: 28.04 M parameters) or on the 3x3 conv (3x3x3:
 * 33.43 M)), "retinanet-r50" (torchvision retinanet_resnet50_fpn, 91
 * classes, 9 anchors; the backbone's frozen BN are buffers, not
 * parameters).  Returns 0, PS_EINVAL for an unknown name, PS_ENOMEM. */
int psbench_model_build(psbench_model_t *m, const char *name);
void psbench_model_free(psbench_model_t *m);
/* Forward MACs of each partition of t (a table built from m's tensors):
 * out[p] = sum over the pieces of tensors in partition p of the tensor's
 * flops x (piece numel / tensor numel), so a tensor cut over several
 * partitions splits its layer's cost by elements and sum(out) ==
 * m->total_flops.  Returns 0, PS_EINVAL (t is not m's layout), PS_ENOMEM. */
int psbench_model_part_flops(const psbench_model_t *m, const ps_partition_table_t *t,
                             double *out);
/* The emulated compute schedule of psbench (and its ring mode): fwd[p] =
 * seconds of partition p's forward, for the t->nparts partitions of model
 * `name`'s layout (NULL: any table, split by size).  The forward is a third
 * of compute_s and the backward two thirds (backward ~ 2x forward:
 * gradients for the input and for the weights), both split over the
 * partitions in proportion to the forward MACs of the layers each holds
 * (psbench_model_part_flops), or, with by_params or without a model, to
 * their sizes.  So sum(fwd) = compute_s / 3 and partition p's backward
 * takes 2 fwd[p].  Returns 0 or a PS_E* (logged). */
int psbench_model_schedule(const char *name, int by_params, double compute_s,
                           const ps_partition_table_t *t, double *fwd);
/* The names accepted, comma separated. */
const char *psbench_model_names(void);
#endif
