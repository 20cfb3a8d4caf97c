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
} psbench_model_t;

/* "tsm-r50", "tsm-r18" (TSM adds no parameters: torchvision ResNet with a
 * 400-class Kinetics fc), "i3d-r50" (ResNet-50 with conv1 inflated to
 * 5x7x7 and every bottleneck 3x3 to 3x3x3, 400 classes), "retinanet-r50"
 * (torchvision retinanet_resnet50_fpn, 91 classes, 9 anchors; the backbone's
 * frozen BN are buffers, not parameters).  Returns 0, PS_EINVAL for an
 * unknown name, PS_ENOMEM. */
int psbench_model_build(psbench_model_t *m, const char *name);
void psbench_model_free(psbench_model_t *m);
/* The names accepted, comma separated. */
const char *psbench_model_names(void);
#endif
