#!/usr/bin/python3
"""A C-written RetinaNet checkpoint in torchvision (run by
tests/check_retinanet_torch.sh; TAP).

tests/tools/retina_export writes RetinaNet-ResNet-50-FPN (torchvision widths, P6
on P5) and the outputs the C engine computes for the hash input; here the
checkpoint goes into torchvision.models.detection.retinanet_resnet50_fpn
(weights=None, num_classes=K) with load_state_dict(strict=True), and the
backbone + head outputs in eval mode (no GeneralizedRCNNTransform: the C
model takes the tensor as is) must match: rtol 1e-3, atol 1e-4 * max|ref|
(float32 through ~60 layers, another summation order).
"""
import os
import sys

import numpy as np
import torch

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "golden"))  # the golden generators
sys.path.insert(0, os.path.join(_here, "..", "lib"))     # taplib
import gen_resnet as G  # noqa: E402
from taplib import ok, plan, strict_load  # noqa: E402

def build_retinanet(depth, fpn, p6_from_p5, K):
    """torchvision's RetinaNet on another ResNet and FPN width: what
    retinanet_resnet50_fpn builds (BackboneWithFPN on layer2..4, 1x1
    laterals, LastLevelP6P7, RetinaNetHead), with resnet{depth}
    (FrozenBatchNorm2d) and FPN width fpn."""
    import torchvision
    from torchvision.models.detection.retinanet import RetinaNet, RetinaNetHead
    from torchvision.models.detection.backbone_utils import BackboneWithFPN
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7
    from torchvision.ops import misc
    body = getattr(torchvision.models, "resnet%d" % depth)(weights=None,
                                                           norm_layer=misc.FrozenBatchNorm2d)
    c3 = body.inplanes // 4  # 128 (BasicBlock) or 512 (Bottleneck)
    extra = LastLevelP6P7(fpn if p6_from_p5 else 4 * c3, fpn)
    backbone = BackboneWithFPN(body, {"layer2": "0", "layer3": "1", "layer4": "2"},
                               [c3, 2 * c3, 4 * c3], fpn, extra_blocks=extra)
    return RetinaNet(backbone, K, head=RetinaNetHead(fpn, 9, K))


def main():
    d = sys.argv[1]
    torch.set_num_threads(2)
    from torchvision.models.detection import retinanet_resnet50_fpn
    cfg = [int(v) for v in open(os.path.join(d, "config.txt")).read().split()]
    K, H, seed, A = cfg[:4]
    depth, fpn, p6_from_p5 = cfg[4:7] if len(cfg) >= 7 else (50, 256, 1)
    if (depth, fpn, p6_from_p5) == (50, 256, 1):
        net = retinanet_resnet50_fpn(weights=None, weights_backbone=None, num_classes=K)
    else:
        net = build_retinanet(depth, fpn, p6_from_p5, K)
    sd, meta = G.read_safetensors(os.path.join(d, "model.safetensors"))
    if not strict_load(net, sd, meta, "retinanet-resnet%d-fpn" % depth):
        return plan()
    net.eval()
    x = torch.from_numpy(G.hash_fill(3 * H * H, "input", seed, 1.0)).view(1, 3, H, H)
    with torch.no_grad():
        out = net.head(list(net.backbone(x).values()))
    for key, fname, D in (("cls_logits", "cls.bin", K), ("bbox_regression", "box.bin", 4)):
        ref = out[key].reshape(-1, D).numpy()
        got = np.fromfile(os.path.join(d, fname), dtype=np.float32).reshape(-1, D)
        if got.shape != ref.shape:
            ok(False, "%s: shape %s, torchvision %s" % (key, got.shape, ref.shape))
            continue
        tol = 1e-4 * np.abs(ref).max() + 1e-3 * np.abs(ref)
        err = np.abs(got - ref)
        ok(bool((err <= tol).all()), "%s: %d values match torchvision (worst %.3g of max|ref| "
           "%.3g)" % (key, ref.size, err.max(), np.abs(ref).max()))
    return plan()


if __name__ == "__main__":
    sys.exit(main())
