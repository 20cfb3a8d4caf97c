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
    /* (ntensors) forward multiply-adds per frame at 224x224 attributed to
     * each tensor: a conv / fc weight carries its layer's MACs (out x in x
     * kt x k x k x output pixels), a BN weight and bias one op per output
     * element each, a conv bias 0.  Output frames are not counted (no
     * temporal stride: the same factor for every layer).  What psbench's
     * emulated compute schedule splits the step by (compute ~ FLOPs, not
     * parameters: ResNet's stem and layer1 hold 0.9% of the weights and
     * ~20% of the MACs, layer4 60% of the weights and ~20% of the MACs). */
    double *flops;
    double total_flops;
} psbench_model_t;

/* "tsm-r50", "tsm-r18" (TSM adds no parameters: torchvision ResNet with a
 * 400-class Kinetics fc), "i3d-r50" (ResNet-50 with conv1 inflated to
 * 5x7x7 and every bottleneck 3x3 to 3x3x3, 400 classes), "retinanet-r50"
 * (torchvision retinanet_resnet50_fpn, 91 classes, 9 anchors; the backbone's
 * frozen BN are buffers, not parameters).  Returns 0, PS_EINVAL for an
 * unknown name, PS_ENOMEM. */
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
