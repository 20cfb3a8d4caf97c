#!/usr/bin/python3
"""Golden tensors for tests/test_mask_layers.c: Mask R-CNN's two new
layers against PyTorch (1.13, CPU):
  * the transposed convolution whose kernel equals its stride
    (torch.nn.functional.conv_transpose2d, stride = kernel, no padding):
    NAME.cfg = (N, C, K, H, W, s, has_bias), NAME.inp, NAME.w (C,K,s,s),
    NAME.b, NAME.out, NAME.dout (random upstream gradient), NAME.dinp,
    NAME.dw, NAME.db (autograd of sum(out * dout), float64 then rounded);
  * the mask loss (torchvision's maskrcnn_loss core:
    binary_cross_entropy_with_logits(logits[arange(R), labels], targets),
    mean): NAME.cfg = (R, K, MM), NAME.logits, NAME.labels, NAME.targets,
    NAME.loss, NAME.dlogits (gradient of the mean loss), in float64.

    /usr/bin/python3 tests/golden/gen_mask_layers.py [OUT [SEED]]
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from psgold import Golden  # noqa: E402


def deconv(g, name, N, C, K, H, W, s, bias, gen):
    inp = torch.randn(N, C, H, W, generator=gen, dtype=torch.float64)
    w = torch.randn(C, K, s, s, generator=gen, dtype=torch.float64)
    b = torch.randn(K, generator=gen, dtype=torch.float64)
    # round to float32 first: the C side sees exactly these values
    inp, w, b = (t.float().double().requires_grad_(True) for t in (inp, w, b))
    out = F.conv_transpose2d(inp, w, b if bias else None, stride=s)
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float64).float().double()
    out.backward(dout)
    g.put(name + ".cfg", torch.tensor([N, C, K, H, W, s, int(bias)]))
    for k, v in (("inp", inp), ("w", w), ("b", b), ("out", out), ("dout", dout),
                 ("dinp", inp.grad), ("dw", w.grad), ("db", b.grad if bias else torch.zeros(K))):
        g.put(name + "." + k, v.float())


def mask_bce(g, name, R, K, M, gen, extreme):
    logits = torch.randn(R, K, M, M, generator=gen, dtype=torch.float64) * 3
    if extreme:  # saturated logits: the stable form must stay finite
        logits.view(-1)[::7] = 80.0
        logits.view(-1)[3::11] = -80.0
        logits.view(-1)[5::13] = 1e-3
    logits = logits.float().double().requires_grad_(True)
    labels = torch.randint(0, K, (R,), generator=gen)
    targets = torch.rand(R, M, M, generator=gen, dtype=torch.float64)
    targets[0] = (targets[0] > 0.5).double()  # hard 0/1 rows beside soft ones
    targets = targets.float().double()
    loss = F.binary_cross_entropy_with_logits(logits[torch.arange(R), labels], targets)
    loss.backward()
    g.put(name + ".cfg", torch.tensor([R, K, M * M]))
    for k, v in (("logits", logits), ("targets", targets), ("loss", loss.view(1)),
                 ("dlogits", logits.grad)):
        g.put(name + "." + k, v.float())
    g.put(name + ".labels", labels.int())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "mask_layers_golden.bin")
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 20270301
    gen = torch.Generator().manual_seed(seed)
    g = Golden()
    deconv(g, "dc2", 2, 3, 4, 5, 6, 2, True, gen)
    deconv(g, "dc3", 1, 5, 2, 3, 4, 3, False, gen)
    deconv(g, "dc_head", 2, 8, 4, 14, 14, 2, True, gen)  # the mask predictor's shape
    deconv(g, "dc1", 2, 4, 3, 4, 4, 1, True, gen)  # s = 1: a 1x1 convolution
    mask_bce(g, "bce", 4, 3, 28, gen, False)
    mask_bce(g, "bce_sat", 3, 3, 6, gen, True)
    mask_bce(g, "bce_one", 1, 1, 28, gen, False)
    n = g.write(out)
    print("wrote %s: %d records" % (out, n))


if __name__ == "__main__":
    main()
