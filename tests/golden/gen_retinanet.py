#!/usr/bin/python3
"""Golden files for tests/test_retinanet.c.

Run once with Debian's interpreter (python3-torch, python3-torchvision 0.14):
    /usr/bin/python3 tests/golden/gen_retinanet.py tests/golden

The model is torchvision's own RetinaNet pieces -- BackboneWithFPN (the
ResNet body through IntermediateLayerGetter, FeaturePyramidNetwork,
LastLevelP6P7) and RetinaNetHead -- around gen_resnet.py's ResNet replica
(torchvision's module tree with a width knob), so the state-dict names are
torchvision's.  Weights, input and per-anchor targets come from the counter
hash both sides compute (gen_resnet.py / ps_retina_init()), so only small
results are committed: both losses, a sample of the outputs, and for every
parameter gradient its L2 norm plus a deterministic sample (same line format
as resnet_*.txt).  The backbone runs with frozen BN (eval-mode BN, affine
not trained), as ps_retina_t always does.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_resnet as G  # noqa: E402

from torchvision.models.detection.backbone_utils import BackboneWithFPN  # noqa: E402
from torchvision.models.detection.retinanet import RetinaNetHead  # noqa: E402
from torchvision.ops import sigmoid_focal_loss  # noqa: E402
from torchvision.ops.feature_pyramid_network import LastLevelP6P7  # noqa: E402

SEED = 1234
NA = 9
F32 = lambda v: float(np.float32(v))  # noqa: E731  (C's float constants)
ALPHA, GAMMA, BETA, PRIOR = 0.25, 2.0, F32(1.0 / 9.0), F32(0.01)

VARIANTS = [
    # name, depth, width, fpn, K, images, H, freeze_at, p6_from_p5, samples
    ("r18", 18, 8, 16, 3, 2, 64, 0, 0, 32),
    ("r50", 50, 8, 16, 2, 1, 64, 2, 1, 32),
]


class Retina(nn.Module):
    def __init__(self, depth, K, width, fpn, p6_from_p5):
        super().__init__()
        body = G.ResNetReplica(depth, 1, width)
        c5 = (width << 3) * (4 if depth == 50 else 1)
        # LastLevelP6P7 takes P5 exactly when in_channels == out_channels, so
        # P6 on C5 needs C5's width to differ from the FPN's
        assert p6_from_p5 or c5 != fpn, "P6 on C5 needs C5 channels != fpn channels"
        extra = LastLevelP6P7(fpn if p6_from_p5 else c5, fpn)
        self.backbone = BackboneWithFPN(body, {"layer2": "0", "layer3": "1", "layer4": "2"},
                                        [c5 // 4, c5 // 2, c5], fpn, extra_blocks=extra)
        self.head = RetinaNetHead(fpn, NA, K)

    def forward(self, x):
        feats = list(self.backbone(x).values())
        out = self.head(feats)
        return out["cls_logits"], out["bbox_regression"], [f.shape[-2:] for f in feats]


def hash_init(net, seed, random):
    """ps_retina_init(m, seed, random)."""
    sd = net.state_dict()
    pre = "backbone.body."
    prior_bias = np.float32(-math.log((1.0 - PRIOR) / PRIOR))
    with torch.no_grad():
        for k, t in sd.items():
            n = t.numel()
            if k.startswith(pre):
                name = k[len(pre):]
                if name.endswith("num_batches_tracked"):
                    t.zero_()
                    continue
                if t.dim() == 4:
                    fan_out = t.shape[0] * t.shape[2] * t.shape[3]
                    v = G.hash_fill(n, name, seed, math.sqrt(6.0 / fan_out))
                elif name.endswith(".weight") or name.endswith("running_var"):
                    v = G.fill_offset(n, name, seed, 0.5, 1.0) if random else np.ones(n, np.float32)
                else:
                    v = G.hash_fill(n, name, seed, 0.25) if random else np.zeros(n, np.float32)
            elif t.dim() == 4:
                fan_in = t.shape[1] * t.shape[2] * t.shape[3]
                if k.startswith("backbone.fpn.") or random:
                    v = G.hash_fill(n, k, seed, math.sqrt(3.0 / fan_in))
                else:
                    v = G.hash_fill(n, k, seed, 0.01 * math.sqrt(3.0))
            else:  # conv bias
                v = G.hash_fill(n, k, seed, 0.1) if random else np.zeros(n, np.float32)
                if k == "head.classification_head.cls_logits.bias":
                    v = v + prior_bias
            t.copy_(torch.from_numpy(np.asarray(v, np.float32)).view(t.shape))


def freeze(net, freeze_at):
    """FrozenBatchNorm2d semantics (eval BN, no affine gradient) and
    torchvision's trainable_layers: freeze_at 1 = stem, k = stem + layer1..k-1."""
    body = net.backbone.body
    for m in body.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
            m.weight.requires_grad_(False)
            m.bias.requires_grad_(False)
    frozen = (["conv1", "bn1"] if freeze_at >= 1 else []) + \
        ["layer%d" % s for s in range(1, freeze_at)]
    for name, p in body.named_parameters():
        if name.split(".")[0] in frozen:
            p.requires_grad_(False)


def targets(n_rows, K, seed):
    """Per-anchor labels and box targets from the hash (test_retinanet.c):
    u < 0.1 ignore (-1), u < 0.8 background (0), else class 1 + (k*K >> 24)."""
    key = (seed ^ G.fnv1a64("labels")) & G.M64
    u = G.rng_uniform(key, n_rows)
    k = G.rng_u24((seed ^ G.fnv1a64("classes")) & G.M64, n_rows).astype(np.int64)
    lab = np.where(u < F32(0.1), -1, np.where(u < F32(0.8), 0, 1 + ((k * K) >> 24)))
    box = G.hash_fill(n_rows * 4, "box_targets", seed, 1.0).reshape(n_rows, 4)
    return torch.from_numpy(lab.astype(np.int64)), torch.from_numpy(box)


def run(v, dtype):
    name, depth, width, fpn, K, n, H, freeze_at, p6p5, _ = v
    torch.manual_seed(0)
    net = Retina(depth, K, width, fpn, p6p5)
    hash_init(net, SEED, True)
    net.to(dtype)
    net.train()
    freeze(net, freeze_at)
    x = torch.from_numpy(G.hash_fill(n * 3 * H * H, "input", SEED, 1.0)).view(n, 3, H, H)
    cls, box, shapes = net(x.to(dtype))
    A = cls.shape[1]
    lab, tgt = targets(n * A, K, SEED)
    lab = lab.view(n, A)
    tgt = tgt.view(n, A, 4).to(dtype)
    norm = max(1, int((lab > 0).sum()))
    valid, pos = lab >= 0, lab > 0
    onehot = torch.zeros(n, A, K, dtype=dtype)
    onehot[pos, lab[pos] - 1] = 1
    lc = sigmoid_focal_loss(cls[valid], onehot[valid], ALPHA, GAMMA, reduction="sum") / norm
    lb = F.smooth_l1_loss(box[pos], tgt[pos], beta=BETA, reduction="sum") / norm
    (lc + lb).backward()
    grads = {k: (p.grad.flatten().double() if p.grad is not None
                 else torch.zeros(p.numel(), dtype=torch.float64))
             for k, p in net.named_parameters()}
    return lc.item(), lb.item(), cls.detach().double(), box.detach().double(), grads, shapes


def gen(outdir, v):
    name, nsamp = v[0], v[-1]
    lc, lb, cls, box, grads, shapes = run(v, torch.float64)
    _, _, _, _, g32, _ = run(v, torch.float32)
    lines = ["# %s: RetinaNet ResNet-%d width %d fpn %d K %d images %d %dx%d freeze_at %d "
             "p6_from_p5 %d seed %d; levels %s" % (name, v[1], v[2], v[3], v[4], v[5], v[6],
                                                    v[6], v[7], v[8], SEED,
                                                    " ".join("%dx%d" % tuple(s) for s in shapes)),
             "# reference: PyTorch float64; grad NAME NUMEL NORM NOISE_MAX NOISE_P90 "
             "NOISE_NORM IDX:VAL...",
             "anchors %d" % cls.shape[1],
             "cls_loss %.12g" % lc,
             "box_loss %.12g" % lb]
    for what, t in (("cls_out", cls.flatten()), ("box_out", box.flatten())):
        idx = G.sample_indices(what, t.numel(), 64)
        lines.append("%s %d %s" % (what, t.numel(),
                                   " ".join("%d:%.9g" % (i, t[i].item()) for i in idx)))
    for k, g in grads.items():
        nrm = g.norm().item()
        rms = nrm / math.sqrt(g.numel())
        e32 = (g32[k] - g).abs() / rms if rms > 0 else torch.zeros(1, dtype=torch.float64)
        idx = G.sample_indices(k, g.numel(), nsamp)
        lines.append("grad %s %d %.12g %.3g %.3g %.3g %s" % (
            k, g.numel(), nrm, e32.max().item(), torch.quantile(e32.float(), 0.9).item(),
            abs(g32[k].norm().item() - nrm) / nrm if nrm > 0 else 0.0,
            " ".join("%d:%.9g" % (i, g[i].item()) for i in idx)))
    with open(os.path.join(outdir, "retinanet_%s.txt" % name), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("%s: cls %.6f box %.6f, %d anchors" % (name, lc, lb, cls.shape[1]))


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    torch.set_num_threads(2)
    for v in VARIANTS:
        gen(outdir, v)


if __name__ == "__main__":
    main()
