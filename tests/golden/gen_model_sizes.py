#!/usr/bin/python3
"""Tensor layouts (name, numel) of the scaling-study models, from torchvision,
for tests/test_model_sizes (worker/models/model_sizes.c computes them from the
architecture).  Run with Debian's /usr/bin/python3:
    /usr/bin/python3 tests/golden/gen_model_sizes.py > tests/golden/model_sizes.txt
i3d-r50-311 / -333 are the I3D-ResNet-50 psworker trains, as
tests/golden/gen_video3d.py defines it for the engine's goldens.  Each is
followed by a line
    flops NAME T S MACS
MACS: the multiply-adds of its Conv3d and Linear layers in one forward of a
T x S x S clip, counted by gen_video3d.conv_flops()'s forward hooks (the
reference for the per-layer MACs model_sizes.c attributes to the tensors)."""
import os
import re
import sys

import torch
import torch.nn as nn
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_video3d as V  # noqa: E402


def dump(name, model, skip=None):
    rows = []
    for n, p in model.named_parameters():
        if skip and skip(n):
            continue
        rows.append((n, p.numel()))
    print("model %s %d %d" % (name, len(rows), sum(r[1] for r in rows)))
    for n, v in rows:
        print("%s %d" % (n, v))


def shape_only(net):
    """net on the meta device (shapes, no arithmetic: a 32 x 224^2 clip costs
    nothing), its max pools replaced by average pools of the same geometry
    (same output shapes; max_pool3d has no meta kernel in this torch)."""
    for n, m in list(net.named_children()):
        if isinstance(m, nn.MaxPool3d):
            setattr(net, n, nn.AvgPool3d(m.kernel_size, m.stride, m.padding))
    return net.to("meta").eval()


def i3d_macs(kernel, T, S, width=64, meta=True):
    net = V.I3DResNet50(kernel, 400, width)
    dev = "cpu"
    if meta:
        net, dev = shape_only(net), "meta"
    else:
        net.eval()
    return V.conv_flops(net, torch.zeros(1, 3, T, S, S, device=dev)) // 2


def dump_i3d(kernel, T=32, S=224):
    # the shape-only count is the real forward's (checked on a small clip)
    assert i3d_macs(kernel, 8, 48, 8) == i3d_macs(kernel, 8, 48, 8, meta=False)
    name = "i3d-r50-%d" % kernel
    dump(name, V.I3DResNet50(kernel, 400, width=64))
    print("flops %s %d %d %d" % (name, T, S, i3d_macs(kernel, T, S)))


dump("tsm-r50", torchvision.models.resnet50(num_classes=400))
dump("tsm-r18", torchvision.models.resnet18(num_classes=400))
dump_i3d(311)
dump_i3d(333)
# Trained from an ImageNet backbone, torchvision freezes the backbone's BN
# (FrozenBatchNorm2d: buffers, not parameters: 34,014,999 parameters as in
# torchvision's model table); built without weights here (no download), so
# its BatchNorm2d parameters are left out by name instead.
def frozen_bn(n):
    return n.startswith("backbone.body.") and re.search(r"\.(bn\d|downsample\.1)\.", n)


dump("retinanet-r50",
     torchvision.models.detection.retinanet_resnet50_fpn(weights=None, weights_backbone=None,
                                                         num_classes=91), skip=frozen_bn)
