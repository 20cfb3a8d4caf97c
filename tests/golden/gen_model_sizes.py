#!/usr/bin/python3
"""Tensor layouts (name, numel) of the scaling-study models, from torchvision,
for tests/test_model_sizes (worker/models/model_sizes.c computes them from the
architecture).  Run with Debian's /usr/bin/python3:
    /usr/bin/python3 tests/golden/gen_model_sizes.py > tests/golden/model_sizes.txt
i3d-r50 is torchvision's resnet50 with conv1 inflated to 5x7x7 and every
bottleneck conv2 (3x3) to 3x3x3: the 2-D weight numel times the temporal size."""
import re

import torchvision


def dump(name, model, inflate=None, skip=None):
    rows = []
    for n, p in model.named_parameters():
        if skip and skip(n):
            continue
        k = inflate(n, p) if inflate else 1
        rows.append((n, p.numel() * k))
    print("model %s %d %d" % (name, len(rows), sum(r[1] for r in rows)))
    for n, v in rows:
        print("%s %d" % (n, v))


def i3d(n, p):
    if n == "conv1.weight":
        return 5
    if n.endswith("conv2.weight") and p.shape[-1] == 3:
        return 3
    return 1


dump("tsm-r50", torchvision.models.resnet50(num_classes=400))
dump("tsm-r18", torchvision.models.resnet18(num_classes=400))
dump("i3d-r50", torchvision.models.resnet50(num_classes=400), i3d)
# Trained from an ImageNet backbone, torchvision freezes the backbone's BN
# (FrozenBatchNorm2d: buffers, not parameters: 34,014,999 parameters as in
# torchvision's model table); built without weights here (no download), so
# its BatchNorm2d parameters are left out by name instead.
def frozen_bn(n):
    return n.startswith("backbone.body.") and re.search(r"\.(bn\d|downsample\.1)\.", n)


dump("retinanet-r50",
     torchvision.models.detection.retinanet_resnet50_fpn(weights=None, weights_backbone=None,
                                                         num_classes=91), skip=frozen_bn)
