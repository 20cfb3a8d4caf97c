#!/usr/bin/python3
"""Golden tensors for tests/test_det_layers.c, made by PyTorch + torchvision.

Run once with Debian's interpreter (python3-torch, python3-torchvision), from
the source root:
    /usr/bin/python3 tests/golden/gen_det.py
and commit tests/golden/det_golden.bin.  The test never needs torch.

References are torchvision's own code wherever it exists (0.14):
ops.sigmoid_focal_loss, F.smooth_l1_loss, F.interpolate(mode="nearest"),
AnchorGenerator, BoxCoder(weights=(1,1,1,1)), ops.box_iou,
detection._utils.Matcher(0.5, 0.4, allow_low_quality_matches=True),
ops.nms, ops.boxes._batched_nms_vanilla and RetinaNet.postprocess_detections
(called unbound on a namespace holding its parameters).  Losses run in
float64 so the float32 golden is exact to rounding; gradients by autograd.

Format (little-endian, as gen_layers.py): magic b"PSGOLD1\\n", then records:
    u32 name_len, name, u32 dtype (0 = f32, 1 = i32), u32 ndim, u32 dims[ndim],
    data.
"""
import math
import os
import struct
import types

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.retinanet import RetinaNet
from torchvision.ops import boxes as box_ops

torch.manual_seed(20261129)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "det_golden.bin")
records = []


def put(name, t):
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    if a.dtype in (np.int64, np.int32, np.bool_):
        a, code = a.astype("<i4"), 1
    else:
        a, code = a.astype("<f4"), 0
    if a.ndim == 0:
        a = a.reshape(1)
    records.append((name, code, a))


def f32(t):
    """round through float32 so C (which only sees float32) gets the same inputs"""
    return t.float().double()


def rand_boxes(n, lo=0.0, hi=100.0, minwh=2.0, maxwh=40.0):
    xy = torch.rand(n, 2) * (hi - lo) + lo
    wh = torch.rand(n, 2) * (maxwh - minwh) + minwh
    return torch.cat([xy, xy + wh], 1).float()


# ---- upsample + add (FPN top-down), exact 2x and an odd size ----
for name, (N, C, H, W, P, Q) in {"up2x": (2, 3, 4, 5, 8, 10), "upodd": (1, 2, 3, 4, 7, 9)}.items():
    top = f32(torch.randn(N, C, H, W)).requires_grad_(True)
    lat = f32(torch.randn(N, C, P, Q)).requires_grad_(True)
    out = lat + F.interpolate(top, size=(P, Q), mode="nearest")
    dout = f32(torch.randn_like(out))
    out.backward(dout)
    put(name + ".cfg", torch.tensor([N, C, H, W, P, Q]))
    for k, v in (("top", top), ("lat", lat), ("out", out), ("dout", dout),
                 ("dtop", top.grad), ("dlat", lat.grad)):
        put(name + "." + k, v)

# ---- sigmoid focal loss (alpha 0.25, gamma 2), normalised by #positives ----
A, K = 64, 5
logits = f32(torch.randn(A, K) * 3)
logits[0, 0], logits[1, 1], logits[2, 2] = 40.0, -40.0, 12.0  # saturated sigmoid
labels = torch.randint(-1, K + 1, (A,))
labels[0], labels[1], labels[2] = 1, 2, 0
logits.requires_grad_(True)
valid = labels >= 0
target = torch.zeros(A, K, dtype=torch.float64)
pos = labels >= 1
target[pos, labels[pos] - 1] = 1.0
norm = max(1, int(pos.sum()))
loss = torchvision.ops.sigmoid_focal_loss(logits[valid], target[valid], alpha=0.25, gamma=2,
                                          reduction="sum") / norm
dloss = 0.7
loss.backward(torch.tensor(dloss, dtype=torch.float64))
put("focal.cfg", torch.tensor([A, K, norm]))
put("focal.logits", logits)
put("focal.labels", labels)
put("focal.loss", loss)
put("focal.dloss", torch.tensor(dloss))
put("focal.dlogits", logits.grad)

# ---- smooth-L1, beta 1/9, positives only, same normaliser ----
A = 48
pred = f32(torch.randn(A, 4) * 0.3).requires_grad_(True)
tgt = f32(torch.randn(A, 4) * 0.3)
labels = torch.randint(-1, 4, (A,))
pos = labels >= 1
norm = max(1, int(pos.sum()))
loss = F.smooth_l1_loss(pred[pos], tgt[pos], reduction="sum", beta=1.0 / 9) / norm
loss.backward(torch.tensor(1.3, dtype=torch.float64))
put("sl1.cfg", torch.tensor([A, norm]))
put("sl1.pred", pred)
put("sl1.target", tgt)
put("sl1.labels", labels)
put("sl1.loss", loss)
put("sl1.dloss", torch.tensor(1.3))
put("sl1.dpred", pred.grad)

# ---- anchors: 4*stride*2^(i/3) (float), ratios 0.5/1/2, torchvision grid ----
strides = [8, 16, 32]
grids = [[6, 7], [3, 4], [2, 2]]
sizes = tuple(tuple(float(np.float32(4 * s * 2 ** (i / 3))) for i in range(3)) for s in strides)
ag = AnchorGenerator(sizes=sizes, aspect_ratios=((0.5, 1.0, 2.0),) * len(strides))
levels = ag.grid_anchors(grids, [[torch.tensor(s), torch.tensor(s)] for s in strides])
for i, (s, g, a) in enumerate(zip(strides, grids, levels)):
    put("anchors%d.cfg" % i, torch.tensor([s, g[0], g[1]]))
    put("anchors%d.sizes" % i, torch.tensor(sizes[i]))
    put("anchors%d.out" % i, a)

# round-half-even of the cell corners: odd integer sizes give exact .5 halves
agt = AnchorGenerator(sizes=((33.0, 45.0, 27.0),), aspect_ratios=((1.0, 0.25, 4.0),))
put("anchors_tie.sizes", torch.tensor([33.0, 45.0, 27.0]))
put("anchors_tie.ratios", torch.tensor([1.0, 0.25, 4.0]))
put("anchors_tie.out", agt.grid_anchors([[2, 3]], [[torch.tensor(4), torch.tensor(4)]])[0])

# ---- box coding ----
coder = det_utils.BoxCoder(weights=(1.0, 1.0, 1.0, 1.0))
n = 40
anc = rand_boxes(n)
gtb = rand_boxes(n)
put("code.anchors", anc)
put("code.gt", gtb)
put("code.enc", coder.encode_single(gtb, anc))
deltas = torch.randn(n, 4) * 0.5
deltas[0, 2], deltas[1, 3], deltas[2, 2] = 6.0, 9.0, -5.0  # clamp at log(1000/16)
put("code.deltas", deltas)
put("code.dec", coder.decode_single(deltas, anc))
clipin = rand_boxes(n, lo=-30, hi=90)
put("code.clipin", clipin)
put("code.clip", box_ops.clip_boxes_to_image(clipin, (70, 80)))  # (height, width)

# ---- IoU matrix ----
a = rand_boxes(7, hi=60)
b = rand_boxes(11, hi=60)
b[3] = torch.tensor([500.0, 500.0, 520.0, 530.0])  # no overlap with anything
put("iou.a", a)
put("iou.b", b)
put("iou.out", box_ops.box_iou(a, b))

# ---- assignment: anchors of one level vs random GTs ----
ag1 = AnchorGenerator(sizes=(sizes[0],), aspect_ratios=((0.5, 1.0, 2.0),))
anc = ag1.grid_anchors([[8, 8]], [[torch.tensor(8), torch.tensor(8)]])[0]
gt = rand_boxes(6, lo=0, hi=40, minwh=16, maxwh=60)
gt_cls = torch.randint(0, 4, (6,))
matcher = det_utils.Matcher(0.5, 0.4, allow_low_quality_matches=True)
matched = matcher(box_ops.box_iou(gt, anc))
put("assign.anchors", anc)
put("assign.gt", gt)
put("assign.gt_cls", gt_cls)
put("assign.matched", matched)
# targets as torchvision RetinaNet's losses use them
lab = torch.zeros(len(anc), dtype=torch.int64)
lab[matched >= 0] = gt_cls[matched[matched >= 0]] + 1
lab[matched == -2] = -1
bt = torch.zeros(len(anc), 4)
fg = matched >= 0
bt[fg] = coder.encode_single(gt[matched[fg]], anc[fg])
put("assign.labels", lab)
put("assign.box_targets", bt)

# ---- NMS: clustered boxes so suppression happens ----
centres = torch.rand(6, 2) * 80
idx = torch.randint(0, 6, (80,))
c = centres[idx] + torch.randn(80, 2) * 4
wh = torch.rand(80, 2) * 20 + 10
boxes = torch.cat([c - wh / 2, c + wh / 2], 1).float()
scores = torch.rand(80).float()
cls = torch.randint(0, 3, (80,))
put("nms.boxes", boxes)
put("nms.scores", scores)
put("nms.labels", cls)
put("nms.keep", torchvision.ops.nms(boxes, scores, 0.5))
put("nms.bkeep", box_ops._batched_nms_vanilla(boxes, scores, cls, 0.5))

# ---- post-processing (RetinaNet.postprocess_detections, one image) ----
Himg, Wimg, K = 64, 80, 3
pstrides, pgrids = [8, 16], [[8, 10], [4, 5]]
psizes = tuple(tuple(float(np.float32(4 * s * 2 ** (i / 3))) for i in range(3)) for s in pstrides)
agp = AnchorGenerator(sizes=psizes, aspect_ratios=((0.5, 1.0, 2.0),) * 2)
panc = agp.grid_anchors(pgrids, [[torch.tensor(s), torch.tensor(s)] for s in pstrides])
# "low": few scores above 0.05, many in 0.05..0.1, fewer than 100 detections
for topk, shift, name in ((1000, -2.0, "post1000."), (60, -2.0, "post60."), (1000, -4.5, "postlow.")):
    cls_l, reg_l = [], []
    for i, an in enumerate(panc):
        cls_l.append((torch.randn(1, len(an), K) * 1.0 + shift).float())
        reg_l.append((torch.randn(1, len(an), 4) * 0.3).float())
    ns = types.SimpleNamespace(score_thresh=0.05, topk_candidates=topk, nms_thresh=0.5,
                               detections_per_img=100, box_coder=coder)
    det = RetinaNet.postprocess_detections(ns, {"cls_logits": cls_l, "bbox_regression": reg_l},
                                           [list(panc)], [(Himg, Wimg)])[0]
    pre = name
    put(pre + "cfg", torch.tensor([Himg, Wimg, K, topk, len(panc)]))
    for i in range(len(panc)):
        put(pre + "anchors%d" % i, panc[i])
        put(pre + "logits%d" % i, cls_l[i][0])
        put(pre + "deltas%d" % i, reg_l[i][0])
    put(pre + "boxes", det["boxes"])
    put(pre + "scores", det["scores"])
    put(pre + "labels", det["labels"])

with open(OUT, "wb") as f:
    f.write(b"PSGOLD1\n")
    for name, code, a in records:
        nb = name.encode()
        f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<II", code, a.ndim))
        f.write(struct.pack("<%dI" % a.ndim, *a.shape))
        f.write(a.tobytes())
print("wrote", OUT, len(records), "records", os.path.getsize(OUT), "bytes")
