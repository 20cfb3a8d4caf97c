#!/usr/bin/python3
"""Golden tensors for tests/test_roi_align.c: torchvision.ops.roi_align
(0.14, its CPU kernel, float32) forward and backward on the edge cases the
two-stage detectors meet.

    /usr/bin/python3 tests/golden/gen_roi_align.py [OUT [SEED]]

writes OUT (default tests/golden/roi_align_golden.bin, seed 20270107);
tests/check_roi_align_torch.sh runs it with another seed into a temporary
file and test_roi_align on that, so the check also runs live.  Per case
NAME: NAME.cfg = (N, C, H, W, PH, PW, sampling_ratio, aligned, R), NAME.scale,
NAME.feat (N,C,H,W), NAME.rois (R,5), NAME.out (R,C,PH,PW), NAME.dout (the
upstream gradient, random), NAME.dfeat (autograd of sum(out * dout)).
"""
import os
import sys

import torch
from torchvision.ops import roi_align

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from psgold import Golden  # noqa: E402


def boxes(n, img_h, img_w, lo, hi, gen):
    """n boxes of side lo..hi pixels, centres anywhere in the image"""
    c = torch.rand(n, 2, generator=gen) * torch.tensor([img_w, img_h])
    wh = torch.rand(n, 2, generator=gen) * (hi - lo) + lo
    return torch.cat([c - wh / 2, c + wh / 2], 1)


def case(g, name, N, C, H, W, PH, PW, sr, aligned, scale, b, batch, gen):
    feat = torch.randn(N, C, H, W, generator=gen).requires_grad_(True)
    rois = torch.cat([batch.float().view(-1, 1), b.float()], 1)
    out = roi_align(feat, rois, (PH, PW), spatial_scale=scale, sampling_ratio=sr,
                    aligned=bool(aligned))
    dout = torch.randn(out.shape, generator=gen)
    out.backward(dout)
    g.put(name + ".cfg", torch.tensor([N, C, H, W, PH, PW, sr, aligned, rois.shape[0]]))
    g.put(name + ".scale", torch.tensor([scale]))
    for k, v in (("feat", feat), ("rois", rois), ("out", out), ("dout", dout),
                 ("dfeat", feat.grad)):
        g.put(name + "." + k, v)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "roi_align_golden.bin")
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 20270107
    gen = torch.Generator().manual_seed(seed)
    g = Golden()
    # a stride-4 map of a 48 x 40 image; boxes of ordinary size, both images
    b = boxes(12, 40, 48, 4, 30, gen)
    bi = torch.randint(0, 2, (12,), generator=gen)
    for sr in (2, 1, 3, 0):
        case(g, "sr%d" % sr, 2, 3, 10, 12, 7, 7, sr, 0, 0.25, b, bi, gen)
    case(g, "rect", 2, 2, 10, 12, 3, 5, 2, 0, 0.25, b, bi, gen)
    case(g, "aligned", 2, 3, 10, 12, 7, 7, 2, 1, 0.25, b, bi, gen)
    case(g, "aligned0", 2, 3, 10, 12, 7, 7, 0, 1, 0.25, b, bi, gen)
    # off the image: partly and wholly outside, negative corners
    off = torch.tensor([[-20.0, -10.0, 8.0, 6.0], [30.0, 25.0, 80.0, 70.0],
                        [-60.0, -50.0, -45.0, -30.0], [50.0, 42.0, 90.0, 99.0],
                        [-3.0, 10.0, 51.0, 20.0], [10.0, -8.0, 20.0, 44.0]])
    case(g, "off", 1, 2, 10, 12, 7, 7, 2, 0, 0.25, off, torch.zeros(6, dtype=torch.long), gen)
    case(g, "off0", 1, 2, 10, 12, 7, 7, 0, 0, 0.25, off, torch.zeros(6, dtype=torch.long), gen)
    # tiny (below one map pixel), degenerate (x2 < x1) and point boxes
    tiny = torch.cat([boxes(6, 40, 48, 0.01, 3.0, gen),
                      torch.tensor([[20.0, 20.0, 20.0, 20.0], [30.0, 12.0, 25.0, 10.0],
                                    [47.9, 39.9, 48.0, 40.0]])])
    for sr, al in ((2, 0), (0, 0), (2, 1), (0, 1)):
        case(g, "tiny%d%d" % (sr, al), 1, 2, 10, 12, 7, 7, sr, al, 0.25, tiny,
             torch.zeros(9, dtype=torch.long), gen)
    # huge: many times the image (adaptive sampling: dozens of points per bin)
    huge = torch.tensor([[-200.0, -150.0, 300.0, 250.0], [0.0, 0.0, 48.0, 40.0],
                         [-1000.0, 5.0, 1000.0, 35.0]])
    for sr in (2, 0):
        case(g, "huge%d" % sr, 1, 2, 10, 12, 7, 7, sr, 0, 0.25, huge,
             torch.zeros(3, dtype=torch.long), gen)
    # the detector's shape: stride 8, 7 x 7, sampling 2, several images
    b = boxes(40, 64, 64, 2, 64, gen)
    case(g, "det", 3, 4, 8, 8, 7, 7, 2, 0, 0.125, b, torch.randint(0, 3, (40,), generator=gen),
         gen)
    n = g.write(out)
    print("wrote %s: %d records" % (out, n))


if __name__ == "__main__":
    main()
